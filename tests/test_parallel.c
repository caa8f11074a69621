// test_parallel.c — multi-rank training with CPU ranks under mpirun (oversubscribed on small machines):
// collectives and dispatch/combine (build/test_parallel under mpirun), layout equivalence of the loss and of
// every gradient tensor against one process, resharding checkpoints, failing and hanging ranks, invalid
// layouts, and the memory plan of `pith estimate` against the one training allocates. The NCCL transport
// runs here too, on fake GPUs (build-fake/: host memory, NCCL over MPI, stream order checked; see
// tests/fake/fake_cuda.c): the same collectives, dispatch/combine, timeout and layout equivalence.
#include <jansson.h>

#include "test.h"

// TINY_MOE_EP (tests/test.h), load balancing on.
static const char *model_json = TINY_MOE_EP;

// DeepSeek-V2: a dense first layer, MLA with a q LoRA, YaRN, group-limited routing scaled by 2, a shared
// expert (8 experts top-3 in 4 groups, top 2 groups); DSV2_OF(L): with L layers.
#define DSV2_OF(L)                                                                                                     \
    "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 32, \"num_hidden_layers\": " #L                                \
    ", \"num_attention_heads\": 4,"                                                                                    \
    " \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 6," \
    " \"vocab_size\": 64, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 16,"         \
    " \"n_shared_experts\": 1, \"intermediate_size\": 24, \"first_k_dense_replace\": 1, \"topk_method\": "             \
    "\"group_limited_greedy\","                                                                                        \
    " \"n_group\": 4, \"topk_group\": 2, \"routed_scaling_factor\": 2.0, \"max_position_embeddings\": 64,"             \
    " \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0,"                        \
    " \"original_max_position_embeddings\": 8, \"mscale\": 0.707, \"mscale_all_dim\": 0.707}}"
static const char *model_json_dsv2 = DSV2_OF(3);

// Qwen3.5-MoE: Gated DeltaNet layers (2 value heads per key head) around a gated full-attention layer, 8 experts
// top-3 and a gated shared expert.
static const char *model_json_q35 =
    "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 3,"
    " \"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 12, \"linear_num_key_heads\": 2,"
    " \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 6,"
    " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\"]}";

// GPT-OSS: a sliding (window 5 < sequence 16) and a full layer, sinks, biases everywhere, YaRN with truncate
// false, router top-k → softmax, clamped SwiGLU experts (8 top-2).
static const char *model_json_gpt_oss =
    "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_local_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"intermediate_size\": 16, \"sliding_window\": 5, \"swiglu_limit\": 2.0,"
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 64,"
    " \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 4.0,"
    " \"truncate\": false, \"original_max_position_embeddings\": 8}}";

// A run folder with model.json (the given model), data.bin and train.json (20 steps, load balancing on).
static const char *make_run_of(const char *model) {
    static char d[256];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    char out[4096];
    ASSERT(run_cmd(out, sizeof out,
                   "echo '%s' > %s/model.json && %s synth --output %s/data.bin --vocab 64 --tokens 20000", model, d,
                   PITH_BIN, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   "echo '{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 16, "
                   "\"micro_batch_size\": 2,"
                   " \"global_batch_size\": 8, \"max_steps\": 20, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01},"
                   " \"moe_load_balance_coef\": 0.01, \"parallel\": {\"timeout_s\": 60}}' > %s/train.json",
                   d) == 0);
    return d;
}

static const char *make_run(void) { return make_run_of(model_json); }

// Step `step`'s value of `key` in a metrics.jsonl (which must have it).
static double metric(const char *dir, int step, const char *key) {
    double v = run_metric(dir, step, key);
    ASSERT_MSG(!isnan(v), "%s: no %s at step %d", dir, key, step);
    return v;
}

TEST(dist_comm_collectives) {
    char out[8192];
    for (int np = 1; np <= 4; np++) {
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel comm", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok comm"), "%d ranks: %s", np, out);
    }
}

// Requests issued and waited apart: a ring in one group, both pipeline directions, all-to-all-v beside
// compute; a peer that never posts ends the receive at parallel.timeout_s with the call and group named.
TEST(dist_comm_requests) {
    char out[8192];
    for (int np = 1; np <= 4; np++) {
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel p2p", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok p2p"), "%d ranks: %s", np, out);
    }
    double t0 = now_seconds();
    int rc = run_cmd(out, sizeof out, MPIRUN " 3 build/test_parallel hang-p2p");
    ASSERT_MSG(rc != 0 && now_seconds() - t0 < 20 &&
                   strstr(out, "pith: error: rank 0: recv on the world group (3 ranks) did not complete within "
                               "parallel.timeout_s = 3 s"),
               "%s", out);
}

// The DualPipeV schedule executed over P = 1..4 ranks (one pipeline) on a toy model of 2P linear chunks:
// the loss and every chunk's weight gradient equal an fp64 reference of the whole chain; N = 2P, 2P + 3,
// 4P + 1 micro-batches. On fake GPUs too (device buffers over NCCL, stream order checked). And on the real
// model (CPU ranks, N = 2P, 2P + 3): loss, load-balancing loss and every gradient equal one engine's, and the
// overlapped pairs' equal forward-then-backward's bit for bit.
TEST(dist_pipeline_schedule_run) {
    char out[8192];
    for (int np = 1; np <= 4; np++) {
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel pipe", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok pipe"), "%d ranks: %s", np, out);
        rc = run_cmd(out, sizeof out, MPIRUN " %d build-fake/test_parallel pipe-gpu", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok pipe-gpu"), "%d ranks, fake GPUs: %s", np, out);
        // the real model: a 4P-layer Qwen3-MoE in 2P chunks of two layers, one engine per record slot
        rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel pipe-model", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok pipe-model"), "%d ranks, the model: %s", np, out);
    }
}

// Zigzag ring attention alone over cp = 2, 3, 4 CPU ranks and fake GPUs (tests/parallel/ring.c): forward, lse and
// every input gradient equal one-rank attention; a wrong shard is noticed. Qwen3.5's DeltaNet pieces (layout, conv
// halo, state pass) equal one rank; without the halo or the state they do not.
TEST(dist_ring_attention) {
    char out[8192];
    for (int np = 2; np <= 4; np++) {
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel ring", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok ring"), "%d ranks: %s", np, out);
        rc = run_cmd(out, sizeof out, MPIRUN " %d build-fake/test_parallel ring-gpu", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok ring-gpu"), "%d ranks, fake GPUs: %s", np, out);
    }
}

// The overlapped pair (chunk_pair) across 2 and 4 ep ranks: its loss, output, input gradient and every
// gradient equal forward-then-backward's bit for bit, on CPU ranks and on fake GPUs (stream order checked:
// each all-to-all waits for the compute that made its rows, each consumer for the all-to-all), and on fake
// GPUs the pair issues more of the other micro-batch's ops while an all-to-all is in flight than the serial
// order (the overlap as structure; also with every NCCL group lasting 8 ms and every op 0.5 ms, the fake's
// delays, where times are printed beside it). With an
// expert capacity that overflows (0.75·T·k): spilling (the backward's re-dispatch, a collective, inside the
// pair), dropping, and spilling under full recompute or every recompute part equal their serial order, and
// spilling the worst case.
TEST(dist_pipeline_overlap) {
    char out[8192];
    for (int np = 2; np <= 4; np += 2) {
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel pair", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok pair"), "%d ranks: %s", np, out);
        rc = run_cmd(out, sizeof out, MPIRUN " %d build-fake/test_parallel pair-gpu", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok pair-gpu"), "%d ranks, fake GPUs: %s", np, out);
    }
    int rc =
        run_cmd(out, sizeof out,
                "PITH_FAKE_NCCL_DELAY_MS=8 PITH_FAKE_OP_DELAY_US=500 " MPIRUN " 2 build-fake/test_parallel pair-gpu");
    ASSERT_MSG(rc == 0 && strstr(out, "ok pair-gpu"), "%s", out);
    const char *line = strstr(out, "pair worst case: ");
    ASSERT_MSG(line, "%s", out);
    printf("     %s", line);
}

TEST(dist_ep_dispatch_combine) {
    char out[16384];
    for (int np = 1; np <= 4; np++) { // E = 2·ranks: random, empty rank, all to one expert, top-k = E
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel ep", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok ep"), "%d ranks: %s", np, out);
    }
}

// The layouts every equivalence test runs against one process; the last four are context parallelism's (zigzag
// ring attention: cp2, cp2 × ep2, cp2 × dp2 with experts sharded over dp×cp, hsdp).
typedef struct {
    const char *name;
    int np;
    const char *sets;
} Layout;
static const Layout layouts[] = {
    {"ep2", 2, "--set parallel.expert_parallel_size=2"},
    {"dp2", 2, ""},
    {"ep2-dp2", 4, "--set parallel.expert_parallel_size=2"},
    {"ep4-capacity2.5", 4, "--set parallel.expert_parallel_size=4 --set parallel.ep_capacity_factor=2.5"},
    {"hsdp-dp2-ep2", 4, "--set parallel.expert_parallel_size=2 --set parallel.sharding_strategy=hsdp"},
    {"cp2", 2, "--set parallel.context_parallel_size=2"},
    {"cp2-ep2", 4, "--set parallel.context_parallel_size=2 --set parallel.expert_parallel_size=2"},
    {"cp2-dp2", 4, "--set parallel.context_parallel_size=2"},
    {"hsdp-cp2-dp2", 4, "--set parallel.context_parallel_size=2 --set parallel.sharding_strategy=hsdp"},
};
static const Layout *const cp_layouts = layouts + 5;

// One run per layout (the first n of the table), 20 steps, the first step's gradient dumped: every layout must
// give the one-process losses (≤ 1e-6 relative at step 1, ≤ 1e-5 over 20 steps) and gradients (≤ 1e-5 per
// tensor). sets: more --set options for every run.
static void check_layouts(const char *d, const Layout *layouts, size_t n, const char *sets) {
    char out[1 << 16], ref[300], dir[300];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/one --dump-grads %s/one/g", PITH_BIN, d,
                   sets, d, d) == 0);
    snprintf(ref, sizeof ref, "%s/one", d);
    for (size_t i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s/%s", d, layouts[i].name);
        int rc = run_cmd(out, sizeof out,
                         "PITH=%s scripts/launch.sh -n %d %s/train.json %s %s --set run_dir=%s --dump-grads %s/g 2>&1",
                         PITH_BIN, layouts[i].np, d, layouts[i].sets, sets, dir, dir);
        ASSERT_MSG(rc == 0, "%s: %s", layouts[i].name, out);
        double l1 = metric(dir, 1, "loss"), r1 = metric(ref, 1, "loss"), worst = fabs(l1 - r1) / r1;
        ASSERT_MSG(worst <= 1e-6, "%s: step 1 loss %.9g vs one process %.9g", layouts[i].name, l1, r1);
        for (int s = 2; s <= 20; s++) {
            double l = metric(dir, s, "loss"), r = metric(ref, s, "loss"), g = metric(dir, s, "grad_norm"),
                   rg = metric(ref, s, "grad_norm");
            worst = fmax(worst, fabs(l - r) / r);
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs one process %.9g", layouts[i].name, s, l, r);
            ASSERT_MSG(fabs(g - rg) <= 1e-4 * rg, "%s: step %d grad norm %.9g vs one process %.9g", layouts[i].name, s,
                       g, rg);
        }
        char ga[320], gb[320];
        snprintf(ga, sizeof ga, "%s/g", dir), snprintf(gb, sizeof gb, "%s/g", ref);
        const char *wn;
        double gd = grad_diff(ga, gb, &wn);
        printf("     %-14s loss (20 steps) %.1e, gradient %.1e (%s)\n", layouts[i].name, worst, gd, wn);
        ASSERT_MSG(gd <= 1e-5, "%s: gradient of %s differs by %.3g", layouts[i].name, wn, gd);
    }
}

TEST(dist_equivalence_layouts) { check_layouts(make_run(), layouts, sizeof layouts / sizeof *layouts, ""); }

// DeepSeek-V2 (sequence-form load balancing, its own): ep2, dp2 and ep2 × dp2 against one process.
TEST(dist_equivalence_layouts_deepseek_v2) {
    check_layouts(make_run_of(model_json_dsv2), layouts, 3, "--set moe_load_balance_type=sequence");
}

// Context parallelism: DeepSeek-V2 (MLA through the ring, sequence-form load balancing summed over the cp ranks)
// at cp2, cp2 × ep2 and cp2 × dp2 (experts sharded over dp×cp), and Qwen3-MoE's global-batch load balancing at cp2
// and cp2 × ep2, against one process (Qwen3-MoE's micro-batch form: dist_equivalence_layouts).
TEST(dist_cp_equivalence_deepseek_v2) {
    check_layouts(make_run_of(model_json_dsv2), cp_layouts, 3, "--set moe_load_balance_type=sequence");
}
TEST(dist_cp_equivalence_global_batch_lb) {
    check_layouts(make_run(), cp_layouts, 2, "--set moe_load_balance_type=global-batch");
}

// Qwen3.5-MoE's hybrid under context parallelism: its full-attention layer on the zigzag ring, its Gated DeltaNet
// layers on the contiguous layout (the all-to-all before and after the mixer, the conv halo from the previous rank,
// the delta rule's state passed along the ranks) at cp2, cp2 × ep2 and cp3 (24 tokens per sequence: 8 rows a rank)
// against one process. The pieces alone, and controls without the halo or the state: dist_ring_attention.
TEST(dist_cp_equivalence_qwen3_5_moe) {
    check_layouts(make_run_of(model_json_q35), cp_layouts, 2, "");
    static const Layout cp3[] = {{"cp3", 3, "--set parallel.context_parallel_size=3"}};
    check_layouts(make_run_of(model_json_q35), cp3, 1, "--set sequence_length=24");
}

// The largest relative difference of `key` over steps 1..20 between two runs.
static double curve_diff(const char *a, const char *b, const char *key) {
    double worst = 0;
    for (int s = 1; s <= 20; s++) {
        double x = metric(a, s, key), y = metric(b, s, key);
        worst = fmax(worst, fabs(x - y) / fabs(y));
    }
    return worst;
}

// Context parallelism inside a DualPipeV pipeline, pp2 × cp2, on a 4-layer model: the first step's loss and every
// gradient tensor equal one process, all 20 steps equal cp2 alone to the last bit the log keeps (the pipeline
// changes no arithmetic: the same ops on the same rows, whatever the thread count), and the 20-step curve stays
// with one process's.
// The curve's tolerance: every layout sums in another fp32 order than one process (cp splits attention's rows,
// and OpenBLAS's kernels round a row differently with the rows beside it on some CPUs), and training amplifies
// that. While every token takes the same experts the drift stays near rounding (≈ 1e-8 here at lr 0.005, with
// sequence-form load balancing, whose objective does not depend on how a step's sequences are cut into
// micro-batches); once rounding tips a near-tie in a router's top-k, the curves part by the effect of one token's
// route — measured on one process at micro_batch_size 1 against 2 (nothing but summation order differs), with
// OpenBLAS's Haswell kernels on an AMD EPYC: DeepSeek-V2 1.4e-4 in loss and 2.0e-4 in gradient norm by step 20.
// So the curves hold to 1e-3 (loss) and 1e-2 (norm), which a tipped route stays within, and the same control runs
// here and must hold to them too. A real error (a missed hop, a wrong chunk) shows at step 1: the wrong-shard
// controls of dist_ring_attention are off by more than 1.
static void check_cp_pipeline(const char *model) {
    const char *d = make_run_of(model);
    char out[1 << 16], dir[4][300];
    const char *lr = "--set optimizer.lr=0.005 --set moe_load_balance_type=sequence";
    const char *runs[4] = {"", "", MPIRUN " 2", MPIRUN " 4"},
               *sets[4] = {"", "--set micro_batch_size=1", "--set parallel.context_parallel_size=2",
                           "--set parallel.context_parallel_size=2 --set parallel.pipeline_parallel_size=2"};
    for (int i = 0; i < 4; i++) {
        snprintf(dir[i], sizeof dir[i], "%s/run%d", d, i);
        ASSERT_MSG(run_cmd(out, sizeof out, "%s %s train %s/train.json %s %s --set run_dir=%s --dump-grads %s/g",
                           runs[i], PITH_BIN, d, lr, sets[i], dir[i], dir[i]) == 0,
                   "%s", out);
    }
    double l1 = metric(dir[3], 1, "loss"), r1 = metric(dir[0], 1, "loss");
    ASSERT_MSG(fabs(l1 - r1) <= 1e-6 * r1, "step 1 loss %.9g vs one process %.9g", l1, r1);
    char ga[320], gb[320];
    snprintf(ga, sizeof ga, "%s/g", dir[3]), snprintf(gb, sizeof gb, "%s/g", dir[0]);
    const char *wn;
    double gd = grad_diff(ga, gb, &wn);
    ASSERT_MSG(gd <= 1e-5, "pp2 × cp2: gradient of %s differs from one process by %.3g", wn, gd);
    for (int s = 1; s <= 20; s++) {
        double l = metric(dir[3], s, "loss"), r = metric(dir[2], s, "loss"), g = metric(dir[3], s, "grad_norm"),
               rg = metric(dir[2], s, "grad_norm");
        ASSERT_MSG(fabs(l - r) <= 1e-12 * r && fabs(g - rg) <= 1e-12 * rg,
                   "step %d: pp2 × cp2 loss %.17g, norm %.17g vs cp2 %.17g, %.17g", s, l, g, r, rg);
    }
    double cl = curve_diff(dir[1], dir[0], "loss"), cg = curve_diff(dir[1], dir[0], "grad_norm"),
           pl = curve_diff(dir[3], dir[0], "loss"), pg = curve_diff(dir[3], dir[0], "grad_norm");
    printf("     pp2-cp2        gradient %.1e (%s); 20 steps: loss %.1e, norm %.1e of one process (micro-batch 1: "
           "%.1e, %.1e); equal cp2's\n",
           gd, wn, pl, pg, cl, cg);
    ASSERT_MSG(cl <= 1e-3 && cg <= 1e-2, "one process, micro-batch 1 vs 2: loss %.3g, norm %.3g", cl, cg);
    ASSERT_MSG(pl <= 1e-3 && pg <= 1e-2, "pp2 × cp2 vs one process over 20 steps: loss %.3g, norm %.3g", pl, pg);
}
TEST(dist_cp_equivalence_pipeline) { check_cp_pipeline(TINY_MOE_EP_OF(4)); }
TEST(dist_cp_equivalence_pipeline_deepseek_v2) { check_cp_pipeline(DSV2_OF(4)); }
TEST(dist_cp_equivalence_pipeline_qwen3_5_moe) { check_cp_pipeline(TINY_QWEN3_5_4); }

// Context parallelism's config errors: a sequence length that 2·cp does not divide, the family whose attention the
// ring does not cover (GPT-OSS: sliding windows and sinks), and Qwen3.5 with fewer rows per rank than the conv halo.
TEST(dist_cp_config_errors) {
    char out[1 << 14];
    const char *d = make_run();
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set parallel.context_parallel_size=3", PITH_BIN, d) != 0);
    ASSERT_MSG(strstr(out, "pith: error: --set: parallel.context_parallel_size: sequence_length 16 is not a multiple "
                           "of 2 × context_parallel_size = 6") == out &&
                   strchr(out, '\n') == out + strlen(out) - 1,
               "%s", out);
    d = make_run_of(model_json_gpt_oss);
    ASSERT(run_cmd(out, sizeof out, MPIRUN " 2 %s train %s/train.json --set parallel.context_parallel_size=2", PITH_BIN,
                   d) != 0);
    const char *want = "train.json: parallel.context_parallel_size: gpt_oss does not run under context parallelism";
    ASSERT_MSG(strstr(out, want), "expected '%s' in: %s", want, out);
    d = make_run_of(model_json_q35);
    ASSERT(run_cmd(
               out, sizeof out,
               "sed -i 's/\"linear_value_head_dim\": 6,/\"linear_value_head_dim\": 6, \"linear_conv_kernel_dim\": 8,/' "
               "%s/model.json && " MPIRUN " 4 %s train %s/train.json --set parallel.context_parallel_size=4",
               d, PITH_BIN, d) != 0);
    want = "train.json: parallel.context_parallel_size: sequence_length / context_parallel_size = 16 / 4 rows per rank "
           "are fewer than the conv halo's linear_conv_kernel_dim − 1 = 7";
    ASSERT_MSG(strstr(out, want), "expected '%s' in: %s", want, out);
}

// A checkpoint of the model written on 2 ranks (`save`: ep2, or cp2) resumes at ep2 × dp2 and on one process with
// the losses of the uninterrupted run.
static void check_reshard_resume(const char *model, const char *save) {
    const char *d = make_run_of(model);
    char out[1 << 16], dir[300], full[300];
    snprintf(full, sizeof full, "%s/full", d);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set max_steps=6 --set run_dir=%s", PITH_BIN, d, full) ==
           0);
    ASSERT(run_cmd(out, sizeof out,
                   MPIRUN " 2 %s train %s/train.json --set max_steps=6 %s --set save_location=%s/ck --steps 3",
                   PITH_BIN, d, save, d) == 0);
    static const char *const launch[] = {MPIRUN " 4 %s train %s/train.json --set parallel.expert_parallel_size=2",
                                         "%s train %s/train.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/r%d", d, i);
        char fmt[512];
        snprintf(fmt, sizeof fmt, "cp -r %%s/ck %%s && %s --set max_steps=6 --set save_location=%%s", launch[i]);
        ASSERT(run_cmd(out, sizeof out, fmt, d, dir, PITH_BIN, d, dir) == 0);
        ASSERT_MSG(strstr(out, "resume: step 3 from"), "%s", out);
        for (int s = 4; s <= 6; s++) {
            double l = metric(dir, s, "loss"), r = metric(full, s, "loss");
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs uninterrupted %.9g", launch[i], s, l, r);
        }
    }
}

#define EP2 "--set parallel.expert_parallel_size=2"
TEST(dist_reshard_resume_deepseek_v2) { check_reshard_resume(model_json_dsv2, EP2); }
TEST(dist_reshard_resume_gpt_oss) { check_reshard_resume(model_json_gpt_oss, EP2); }
// Context parallelism leaves nothing of its layout in a checkpoint: saved at cp2 (DeepSeek-V2, the latent ring),
// resumed on one process and at ep2 × dp2.
TEST(dist_cp_reshard_resume) { check_reshard_resume(model_json_dsv2, "--set parallel.context_parallel_size=2"); }

// GPT-OSS: ep2, dp2 and ep2 × dp2 against one process.
TEST(dist_equivalence_layouts_gpt_oss) { check_layouts(make_run_of(model_json_gpt_oss), layouts, 3, ""); }

// Qwen3.5-MoE: ep2, dp2 and ep2 × dp2 against one process; its checkpoints reshard.
TEST(dist_equivalence_layouts_qwen3_5_moe) { check_layouts(make_run_of(model_json_q35), layouts, 3, ""); }
TEST(dist_reshard_resume_qwen3_5_moe) { check_reshard_resume(model_json_q35, EP2); }

// Global-batch load balancing counts experts over the micro-batches of the global batch in their global
// order, so it too is layout-independent; with one micro-batch it is the micro-batch form.
TEST(dist_equivalence_global_batch_lb) {
    const char *d = make_run();
    char out[1 << 16], a[300], b[300];
    const char *gb = "--set moe_load_balance_type=global-batch --set max_steps=10";
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/one --dump-grads %s/one/g", PITH_BIN, d,
                   gb, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   MPIRUN " 4 %s train %s/train.json %s --set parallel.expert_parallel_size=2 --set run_dir=%s/ep2dp2 "
                          "--dump-grads %s/ep2dp2/g",
                   PITH_BIN, d, gb, d, d) == 0);
    snprintf(a, sizeof a, "%s/ep2dp2", d), snprintf(b, sizeof b, "%s/one", d);
    for (int s = 1; s <= 10; s++) {
        double l = metric(a, s, "loss"), r = metric(b, s, "loss"), lb = metric(a, s, "lb_loss"),
               rlb = metric(b, s, "lb_loss");
        ASSERT_MSG(fabs(l - r) <= 1e-5 * r && fabs(lb - rlb) <= 1e-5 * rlb,
                   "step %d: loss %.9g lb %.9g vs one process %.9g %.9g", s, l, lb, r, rlb);
    }
    char ga[320], gb2[320];
    snprintf(ga, sizeof ga, "%s/g", a), snprintf(gb2, sizeof gb2, "%s/g", b);
    const char *wn;
    double gd = grad_diff(ga, gb2, &wn);
    ASSERT_MSG(gd <= 1e-5, "gradient of %s differs by %.3g", wn, gd);
    // one micro-batch per step: the same run as the micro-batch form
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set global_batch_size=2 --set max_steps=5 --set run_dir=%s/m1 && "
                   "%s train %s/train.json --set global_batch_size=2 --set max_steps=5 --set run_dir=%s/g1 %s && "
                   "cd %s && sed 's/, .tokens_per_s.*//' m1/metrics.jsonl > m1.txt && sed 's/, .tokens_per_s.*//' "
                   "g1/metrics.jsonl > g1.txt && cmp m1.txt g1.txt",
                   PITH_BIN, d, d, PITH_BIN, d, d, "--set moe_load_balance_type=global-batch", d) == 0);
}

// The HF parity run (tests/hf/qwen3_moe, weights from transformers via init_from) on 4 ranks with ep 4
// gives transformers' losses and grad norms like one process does.
TEST(dist_hf_parity_ep4) {
    const char *d = test_tmpdir();
    char out[1 << 15];
    ASSERT(run_cmd(out, sizeof out,
                   MPIRUN " 4 %s train tests/hf/qwen3_moe/train.json --set micro_batch_size=1 --set "
                          "parallel.expert_parallel_size=4 --set run_dir=%s",
                   PITH_BIN, d) == 0);
    json_t *root = json_load_file("tests/hf/qwen3_moe/expected.json", 0, NULL),
           *steps = json_object_get(json_object_get(root, "train"), "steps");
    ASSERT(root && json_array_size(steps) == 5);
    for (int s = 0; s < 5; s++) {
        double el = json_number_value(json_object_get(json_array_get(steps, s), "loss")),
               eg = json_number_value(json_object_get(json_array_get(steps, s), "grad_norm"));
        double l = metric(d, s + 1, "loss"), g = metric(d, s + 1, "grad_norm");
        ASSERT_MSG(fabs(l - el) <= 1e-4 * el && fabs(g - eg) <= 1e-4 * eg,
                   "step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g", s + 1, l, el, g, eg);
    }
    json_decref(root);
}

// A checkpoint written at ep2×dp2 resumes at ep4, at dp2 (ep1, hsdp) and on one process with the losses
// of the uninterrupted run.
TEST(dist_reshard_resume) {
    const char *d = make_run();
    char out[1 << 16], full[300], dir[300];
    snprintf(full, sizeof full, "%s/full", d);
    ASSERT(run_cmd(out, sizeof out,
                   MPIRUN
                   " 4 %s train %s/train.json --set max_steps=6 --set parallel.expert_parallel_size=2 --set run_dir=%s",
                   PITH_BIN, d, full) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   MPIRUN " 4 %s train %s/train.json --set max_steps=6 --set parallel.expert_parallel_size=2 --set "
                          "save_location=%s/ck --steps 3",
                   PITH_BIN, d, d) == 0);
    ASSERT_MSG(run_cmd(out, sizeof out, "ls %s/ck/step-00000003", d) == 0 &&
                   strstr(out, "model.safetensors.index.json") && strstr(out, "model-00004-of-00004.safetensors") &&
                   strstr(out, "optimizer.safetensors.index.json"),
               "%s", out);
    static const struct {
        const char *name, *launch;
    } targets[] = {{"ep4", MPIRUN " 4 %s train %s/train.json --set parallel.expert_parallel_size=4"},
                   {"dp2-hsdp", MPIRUN " 2 %s train %s/train.json --set parallel.sharding_strategy=hsdp"},
                   {"one", "%s train %s/train.json"}};
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        snprintf(dir, sizeof dir, "%s/%s", d, targets[i].name);
        char fmt[512];
        snprintf(fmt, sizeof fmt, "cp -r %%s/ck %%s && %s --set max_steps=6 --set save_location=%%s",
                 targets[i].launch);
        ASSERT(run_cmd(out, sizeof out, fmt, d, dir, PITH_BIN, d, dir) == 0);
        ASSERT_MSG(strstr(out, "resume: step 3 from"), "%s: %s", targets[i].name, out);
        for (int s = 4; s <= 6; s++) {
            double l = metric(dir, s, "loss"), r = metric(full, s, "loss");
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs uninterrupted %.9g", targets[i].name, s, l,
                       r);
        }
    }
    // the one-process checkpoint (step 6, written by rank 0 alone) is a single file again
    ASSERT(run_cmd(out, sizeof out, "ls %s/one/step-00000006", d) == 0 && strstr(out, "model.safetensors\n") &&
           !strstr(out, "index"));
}

TEST(dist_failing_and_hanging_ranks) {
    const char *d = make_run();
    char out[1 << 16];
    // rank 1 killed mid-run: the job ends at once and mpirun names the rank
    double t0 = now_seconds();
    int rc = run_cmd(out, sizeof out,
                     MPIRUN " 2 %s train %s/train.json --set max_steps=1000000 --set parallel.expert_parallel_size=2 "
                            "--set run_dir=%s/k >/dev/null 2>%s/k.err &"
                            " p=$!; sleep 2; kill -9 $(pgrep -P $p | tail -1); wait $p; echo status $?; cat %s/k.err",
                     PITH_BIN, d, d, d, d);
    double took = now_seconds() - t0;
    ASSERT_MSG(rc == 0 && !strstr(out, "status 0") && strstr(out, "rank 1") && took < 30, "%.1f s: %s", took, out);
    // a rank that stops taking part: the others give up at parallel.timeout_s with a message naming the group
    t0 = now_seconds();
    rc = run_cmd(out, sizeof out, MPIRUN " 3 build/test_parallel hang");
    took = now_seconds() - t0;
    ASSERT_MSG(rc != 0 && took < 20 &&
                   strstr(out, "pith: error: rank 0: barrier on the world group (3 ranks) did not complete within "
                               "parallel.timeout_s = 3 s"),
               "%.1f s: %s", took, out);
    // a rank that dies with an error stops every rank, and the message names it
    rc = run_cmd(
        out, sizeof out,
        MPIRUN
        " 2 %s train %s/train.json --set parallel.expert_parallel_size=2 --set run_dir=%s/e --set dataset=/nonexistent",
        PITH_BIN, d, d);
    ASSERT_MSG(rc != 0 && strstr(out, "pith: error: rank ") && strstr(out, "/nonexistent: dataset not found"), "%s",
               out);
}

TEST(dist_config_errors) {
    const char *d = make_run();
    char out[1 << 14];
    struct {
        int np;
        const char *sets, *needle;
    } cases[] = {
        {1, "--set parallel.expert_parallel_size=2",
         "train.json: parallel.expert_parallel_size: 1 ranks are not divisible by"},
        {3, "--set parallel.expert_parallel_size=2",
         "train.json: parallel.expert_parallel_size: 3 ranks are not divisible by"},
        {3, "--set parallel.expert_parallel_size=3 --set global_batch_size=12",
         "train.json: parallel.expert_parallel_size: 3 does not divide the model's 8 experts"},
        {2, "--set parallel.expert_parallel_size=2 --set global_batch_size=2",
         "train.json: global_batch_size: must be a multiple of micro_batch_size × dp × ep = 2 × 1 × 2 = 4"},
        {2, "--set parallel.pipeline_parallel_size=2",
         "train.json: parallel.pipeline_parallel_size: DualPipeV cuts the model into 2 × 2 = 4 chunks: 3 layers do not "
         "divide evenly"},
        {1, "--set parallel.context_parallel_size=2",
         "train.json: parallel.context_parallel_size: 1 ranks are not divisible by pipeline_parallel_size × "
         "context_parallel_size × expert_parallel_size = 1 × 2 × 1 = 2"},
        {1, "--set parallel.sharding_strategy=zero3",
         "--set: parallel.sharding_strategy: 'zero3' is not supported (supported: \"fsdp\", \"hsdp\")"},
        {1, "--set parallel.timeout_s=0", "--set: parallel.timeout_s: must be in (0, 10000000] (got 0)"},
        {1, "--set parallel.ep_capacity_factor=-1",
         "--set: parallel.ep_capacity_factor: must be in [0, 1000000] (got -1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = cases[i].np == 1 ? run_cmd(out, sizeof out, "%s train %s/train.json %s", PITH_BIN, d, cases[i].sets)
                                  : run_cmd(out, sizeof out, MPIRUN " %d %s train %s/train.json %s", cases[i].np,
                                            PITH_BIN, d, cases[i].sets);
        ASSERT_MSG(rc != 0 && strstr(out, cases[i].needle), "expected '%s' in: %s", cases[i].needle, out);
        if (cases[i].np == 1)
            ASSERT_MSG(strstr(out, "pith: error: ") == out && strchr(out, '\n') == out + strlen(out) - 1,
                       "not one line: %s", out);
    }
}

// The plan `pith estimate` prints without allocating is the one `pith train` allocates on each rank.
// The total `pith estimate` prints for run folder d (np ranks, sets) against the one `pith train` allocates.
static void check_estimate(const char *d, int np, const char *sets, int run) {
    char out[1 << 15], est[4096];
    ASSERT(run_cmd(est, sizeof est, "%s estimate %s/train.json --gpus %d --device cpu %s", PITH_BIN, d, np, sets) == 0);
    ASSERT(run_cmd(out, sizeof out, MPIRUN " %d %s train %s/train.json --set max_steps=1 --set run_dir=%s/r%d %s", np,
                   PITH_BIN, d, d, run, sets) == 0);
    char *e = strstr(est, "(") ? strstr(est, " bytes)") : NULL, *t = strstr(out, " bytes)\n");
    ASSERT_MSG(e && t, "%s\n%s", est, out);
    while (e[-1] != '(') e--;
    while (t[-1] != '(') t--;
    ASSERT_MSG(strtoll(e, NULL, 10) == strtoll(t, NULL, 10), "estimate %lld vs train %lld bytes:\n%s\n%s",
               strtoll(e, NULL, 10), strtoll(t, NULL, 10), est, out);
    // pipelines: every pipeline rank's total (the ranks hold different layers)
    char *pe = strstr(est, "plan per pipeline rank:"), *pt = strstr(out, "plan per pipeline rank:");
    ASSERT_MSG(!pe == !pt && (!pe || !strncmp(pe, pt, strcspn(pe, "\n") + 1)), "%s\n%s", est, out);
}

// Context parallelism in the plan: DeepSeek-V2's latent ring and Qwen3.5's hybrid (the DeltaNet layers' contiguous
// copies, halo and entering state in the records, the layout's scratch in the ring's) at cp2 and cp2 × ep2,
// estimate = allocation.
TEST(dist_cp_estimate_deepseek_v2) {
    const char *d = make_run_of(model_json_dsv2);
    check_estimate(d, 2, "--set parallel.context_parallel_size=2", 0);
    check_estimate(d, 4, "--set parallel.context_parallel_size=2 --set parallel.expert_parallel_size=2", 1);
}
TEST(dist_cp_estimate_qwen3_5_moe) {
    const char *d = make_run_of(model_json_q35);
    check_estimate(d, 2, "--set parallel.context_parallel_size=2", 0);
    check_estimate(d, 4, "--set parallel.context_parallel_size=2 --set parallel.expert_parallel_size=2", 1);
}

TEST(dist_estimate_matches_training) {
    const char *d = make_run();
    char out[1 << 15];
    static const struct {
        int np;
        const char *sets;
    } layouts[] = {{1, ""},
                   {4, "--set parallel.expert_parallel_size=2"},
                   {4, "--set parallel.expert_parallel_size=2 --set parallel.sharding_strategy=hsdp"},
                   {4, "--set parallel.context_parallel_size=2 --set parallel.expert_parallel_size=2"}};
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++)
        check_estimate(d, layouts[i].np, layouts[i].sets, (int)i);
    check_estimate(d, 4, "--set parallel.expert_parallel_size=2 --set gradient_dtype=bf16", 6); // 2-byte expert grads
    // Qwen3-30B-A3B: not on 8 GPUs of 80 GB; on 64 with ep 16 and a capacity factor
    ASSERT(run_cmd(out, sizeof out, "%s estimate examples/qwen3-30b-a3b/train.json --gpus 8", PITH_BIN) == 0);
    ASSERT_MSG(strstr(out, "pp 1 × dp 1 × cp 1 × ep 8") && strstr(out, "\nverdict: OOM on 80 GB GPUs"), "%s", out);
    ASSERT(run_cmd(out, sizeof out,
                   "%s estimate examples/qwen3-30b-a3b/train.json --gpus 64 --set parallel.expert_parallel_size=16 "
                   "--set parallel.ep_capacity_factor=1.25",
                   PITH_BIN) == 0);
    ASSERT_MSG(strstr(out, "8 of 128 experts") && strstr(out, "\nverdict: TIGHT on 80 GB GPUs"), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s estimate examples/qwen3-30b-a3b/train.json --gpus 12", PITH_BIN) == 1);
    ASSERT_MSG(strstr(out, "parallel.expert_parallel_size: 12 ranks are not divisible"), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s estimate examples/qwen3-30b-a3b/train.json", PITH_BIN) == 1 &&
           strstr(out, "pith: error: estimate: --gpus N is required"));
    ASSERT(run_cmd(out, sizeof out, "%s estimate --gpus 8", PITH_BIN) == 2 &&
           strstr(out, "pith: error: estimate: no training config given\nusage: pith estimate"));
    // DualPipeV on 8 layers: records for the schedule's micro-batches in flight, deferred sets, pipeline buffers
    d = make_run_of(TINY_MOE_EP_OF(8));
    check_estimate(d, 2, "--set parallel.pipeline_parallel_size=2", 3);
    ASSERT(run_cmd(out, sizeof out,
                   "%s estimate %s/train.json --gpus 2 --device cpu --set "
                   "parallel.pipeline_parallel_size=2",
                   PITH_BIN, d) == 0);
    ASSERT_MSG(strstr(out, "(fsdp); per rank (these rows: pipeline rank 0 of 2): "), "%s", out);
    check_estimate(d, 1, "--set parallel.pipeline_schedule=true", 5); // pp 1 through the engine
    check_estimate(d, 4,
                   "--set parallel.pipeline_parallel_size=2 --set parallel.expert_parallel_size=2 "
                   "--set global_batch_size=16",
                   4);
}

// DeepSeek-V2: the plan of a run is what training allocates; DeepSeek-V2-Lite (examples/deepseek-v2-lite, 15.7B
// parameters) at ep 8, 4096 tokens per micro-batch: its plan fits 80 GB, not with the runtime beside it (OOM).
TEST(dist_estimate_deepseek_v2) {
    check_estimate(make_run_of(model_json_dsv2), 2, "--set parallel.expert_parallel_size=2", 0);
    char out[1 << 15];
    ASSERT(run_cmd(out, sizeof out, "%s estimate examples/deepseek-v2-lite/train.json --gpus 8", PITH_BIN) == 0);
    ASSERT_MSG(strstr(out, "deepseek_v2 on 8 GPUs = pp 1 × dp 1 × cp 1 × ep 8") && strstr(out, "8 of 64 experts") &&
                   strstr(out, "\nverdict: OOM on 80 GB GPUs"),
               "%s", out);
}

// Qwen3.5-MoE: the plan of a run is what training allocates; the 35B-A3B example on 8 GPUs at ep 8 is planned.
TEST(dist_estimate_qwen3_5_moe) {
    check_estimate(make_run_of(model_json_q35), 2, "--set parallel.expert_parallel_size=2", 0);
    char out[1 << 15];
    ASSERT(run_cmd(out, sizeof out, "%s estimate examples/qwen3.5-35b-a3b/train.json --gpus 8 --gpu-memory 141",
                   PITH_BIN) == 0);
    ASSERT_MSG(strstr(out, "qwen3_5_moe_text on 8 GPUs = pp 1 × dp 1 × cp 1 × ep 8") &&
                   strstr(out, "32 of 256 experts"),
               "%s", out);
}

// GPT-OSS: the plan of a run is what training allocates; gpt-oss-20b (examples/gpt-oss-20b: 24 layers, 32 experts
// top-4, hidden 2880, vocabulary 201088) at ep 8, 4096 tokens per micro-batch: OOM on 8 GPUs of 80 GB, tight on 16
// (dp 2 halves the fp32 shards) — and the example's README quotes what the tool prints.
TEST(dist_estimate_gpt_oss) {
    check_estimate(make_run_of(model_json_gpt_oss), 2, "--set parallel.expert_parallel_size=2", 0);
    char out[1 << 15], want[128];
    size_t n;
    char *readme = file_read_all("examples/gpt-oss-20b/README.md", &n);
    ASSERT(readme);
    for (char *p = readme; (p = strchr(p, '\n')); p++) *p = ' '; // (the figures may wrap)
    const int gpus[2] = {8, 16};
    for (int i = 0; i < 2; i++) {
        ASSERT(run_cmd(out, sizeof out, "%s estimate examples/gpt-oss-20b/train.json --gpus %d", PITH_BIN, gpus[i]) ==
               0);
        ASSERT_MSG(strstr(out, "gpt_oss on ") && strstr(out, "4 of 32 experts"), "%s", out);
        double gb = 0;
        char verdict[16] = "";
        ASSERT(sscanf(strstr(out, "\n  total ") + 9, "%lf GB", &gb) == 1);
        ASSERT(sscanf(strstr(out, "\nverdict: ") + 10, "%15s", verdict) == 1);
        ASSERT_MSG(!strcmp(verdict, i ? "TIGHT" : "OOM"), "%d GPUs: %s", gpus[i], out);
        snprintf(want, sizeof want, "on %d GPUs %.2f GB per rank, %s on 80 GB", gpus[i], gb, verdict);
        ASSERT_MSG(strstr(readme, want), "examples/gpt-oss-20b/README.md does not say what the tool prints: %s", want);
    }
    free(readme);
}

// The NCCL half on fake GPUs (`make fake-build`): every device path of comm/fsdp/ep/trainer with fp32
// "device" tensors, NCCL calls with NCCL's contracts checked, stream order checked.
TEST(dist_nccl_transport_fake) {
    char out[1 << 16];
    ASSERT_MSG(run_cmd(out, sizeof out, "test -x build-fake/pith && test -x build-fake/test_parallel") == 0,
               "build-fake/ is missing: make fake-build");
    for (int np = 1; np <= 4; np++) {
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build-fake/test_parallel comm-gpu", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok comm-gpu"), "%d ranks: %s", np, out);
        rc = run_cmd(out, sizeof out, MPIRUN " %d build-fake/test_parallel ep-gpu", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok ep-gpu"), "%d ranks: %s", np, out);
        rc = run_cmd(out, sizeof out, MPIRUN " %d build-fake/test_parallel p2p-gpu", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok p2p-gpu"), "%d ranks: %s", np, out);
    }
    // an op that reads a receive's buffer before comm_wait made the compute stream wait: refused
    int hz = run_cmd(out, sizeof out, MPIRUN " 2 build-fake/test_parallel hazard-gpu");
    ASSERT_MSG(
        hz != 0 &&
            strstr(out, "fake CUDA: scale on the compute stream touches a buffer of an NCCL call it does not wait for"),
        "%s", out);
    // a peer that never posts: the watchdog ends the receive at the timeout
    double t1 = now_seconds();
    hz = run_cmd(out, sizeof out, MPIRUN " 3 build-fake/test_parallel hang-p2p-gpu");
    ASSERT_MSG(hz != 0 && now_seconds() - t1 < 20 &&
                   strstr(out, "pith: error: rank 0: recv on the world group (3 ranks) did not complete within "
                               "parallel.timeout_s = 3 s"),
               "%s", out);
    // a transfer issued before compute runs beside it: with every group lasting 0.4 s, exchange + 0.4 s of
    // compute takes ≥ 0.8 s waited first and well under that overlapped (generous margins: no timing claim)
    hz = run_cmd(out, sizeof out, "PITH_FAKE_NCCL_DELAY_MS=400 " MPIRUN " 2 build-fake/test_parallel overlap-gpu");
    ASSERT_MSG(hz == 0 && strstr(out, "ok overlap-gpu"), "%s", out);
    double t0 = now_seconds();
    int rc = run_cmd(out, sizeof out, MPIRUN " 3 build-fake/test_parallel hang-gpu");
    ASSERT_MSG(rc != 0 && now_seconds() - t0 < 20 &&
                   strstr(out, "pith: error: rank 0: all-reduce on the world group (3 ranks) did not return within "
                               "parallel.timeout_s = 3 s"),
               "%s", out);
}

// One GPU's step without host waits inside the layers (issue 37): a micro-batch's forward and backward on a fake GPU,
// which counts every stream synchronisation and read-back as the CUDA backend does (ops_host_syncs), waits for
// nothing from the first layer's forward to the last layer's backward (tests/parallel/worker.c, suite_nosync; the
// GPU suite's gpu_step_no_host_sync asserts the same on a GPU).
TEST(dist_no_host_sync_fake) {
    char out[1 << 16];
    ASSERT_MSG(run_cmd(out, sizeof out, "test -x build-fake/test_parallel") == 0,
               "build-fake/ is missing: make fake-build");
    int rc = run_cmd(out, sizeof out, MPIRUN " 1 build-fake/test_parallel nosync-gpu");
    ASSERT_MSG(rc == 0 && strstr(out, "ok nosync-gpu"), "%s", out);
}

// A micro-batch's tokens, labels and document positions go to the device in stream order without the host waiting
// (op_upload from pinned staging; the host waits only before it rewrites the staging, ops_uploads_wait). On a fake GPU,
// which fails when an upload's source changes before that wait and counts a copy from host memory as a host wait,
// one process with 4 micro-batches a step waits for nothing in its forwards and backwards (metrics fwdbwd_host_waits)
// with masking off and on, and, with pp2's chunks reloading positions, gives one process's losses (1e-5: the fake's
// ops add in the CPU's order, the pipeline's loss sum in another).
TEST(dist_step_uploads_fake) {
    const char *d = make_run_of(TINY_MOE_EP_OF(4));
    char out[1 << 14], path[300];
    snprintf(path, sizeof path, "%s/data.bin", d), token_file_short_documents(path, 20000, 64);
    const struct {
        const char *name, *run, *sets;
    } runs[] = {{"cpu", PITH_BIN, ""},
                {"gpu", "build-fake/pith", "--set device=cuda"},
                {"cpu-docs", PITH_BIN, "--set document_masking=true"},
                {"gpu-docs", "build-fake/pith", "--set device=cuda --set document_masking=true"},
                {"gpu-docs-pp2", MPIRUN " 2 build-fake/pith",
                 "--set device=cuda --set document_masking=true --set parallel.pipeline_parallel_size=2"}};
    for (int i = 0; i < 5; i++) {
        int rc = run_cmd(out, sizeof out,
                         "%s train %s/train.json --set compute_dtype=fp32 --set max_steps=3 %s --set run_dir=%s/%s",
                         runs[i].run, d, runs[i].sets, d, runs[i].name);
        ASSERT_MSG(rc == 0, "%s: %s", runs[i].name, out);
    }
    for (int s = 1; s <= 3; s++)
        for (int i = 1; i < 5; i++) {
            char dir[300], ref[300];
            snprintf(dir, sizeof dir, "%s/%s", d, runs[i].name),
                snprintf(ref, sizeof ref, "%s/%s", d, runs[i < 2 ? 0 : 2].name);
            double l = metric(dir, s, "loss"), r = metric(ref, s, "loss");
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs one CPU process %.9g", runs[i].name, s, l, r);
            if (i == 1 || i == 3) // (pp2 waits for its pipeline peers)
                ASSERT_MSG(metric(dir, s, "fwdbwd_host_waits") == 0, "%s: step %d: the host waited %g times",
                           runs[i].name, s, metric(dir, s, "fwdbwd_host_waits"));
        }
}

// FP8's weight cache made ahead after each update (model_fp8_ahead: a side stream on the GPU, a layer's first use
// joining it). The fake GPU fails compute that touches the cache before the join; one process and pp2 train 3 steps
// with fp8 on it and give the CPU's FP8 losses (1e-5: the pipeline's loss sum adds in another order).
TEST(dist_fp8_ahead_fake) {
    const char *d = make_run_of(TINY_MOE_EP_OF(4));
    char out[1 << 14], dir[300], ref[300];
    const char *runs[3][3] = {
        {"cpu", PITH_BIN, ""},
        {"gpu", "build-fake/pith", "--set device=cuda"},
        {"gpu-pp2", MPIRUN " 2 build-fake/pith", "--set device=cuda --set parallel.pipeline_parallel_size=2"}};
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "%s train %s/train.json --set compute_dtype=fp32 --set fp8=true --set max_steps=3 %s "
                           "--set run_dir=%s/%s",
                           runs[i][1], d, runs[i][2], d, runs[i][0]) == 0,
                   "%s: %s", runs[i][0], out);
    snprintf(ref, sizeof ref, "%s/cpu", d);
    for (int i = 1; i < 3; i++)
        for (int s = 1; s <= 3; s++) {
            snprintf(dir, sizeof dir, "%s/%s", d, runs[i][0]);
            double l = metric(dir, s, "loss"), r = metric(ref, s, "loss");
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs the CPU's %.9g", runs[i][0], s, l, r);
        }
}

TEST(dist_nccl_equivalence_fake) {
    const char *d = make_run();
    char out[1 << 16], ref[300], dir[300];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/one --dump-grads %s/one/g", PITH_BIN, d, d,
                   d) == 0);
    snprintf(ref, sizeof ref, "%s/one", d);
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        snprintf(dir, sizeof dir, "%s/%s", d, layouts[i].name);
        int rc = run_cmd(out, sizeof out,
                         MPIRUN " %d build-fake/pith train %s/train.json --set device=cuda --set compute_dtype=fp32 "
                                "--set max_steps=10 %s --set run_dir=%s --dump-grads %s/g",
                         layouts[i].np, d, layouts[i].sets, dir, dir);
        ASSERT_MSG(rc == 0 && strstr(out, "plan (cuda"), "%s: %s", layouts[i].name, out);
        double worst = 0;
        for (int s = 1; s <= 10; s++) {
            double l = metric(dir, s, "loss"), r = metric(ref, s, "loss");
            worst = fmax(worst, fabs(l - r) / r);
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs one process %.9g", layouts[i].name, s, l, r);
        }
        char ga[320], gb[320];
        snprintf(ga, sizeof ga, "%s/g", dir), snprintf(gb, sizeof gb, "%s/g", ref);
        const char *wn;
        double gd = grad_diff(ga, gb, &wn);
        printf("     %-14s loss (10 steps) %.1e, gradient %.1e (%s)\n", layouts[i].name, worst, gd, wn);
        ASSERT_MSG(gd <= 1e-5, "%s: gradient of %s differs by %.3g", layouts[i].name, wn, gd);
    }
    // a checkpoint of device shards (ep2 × dp2) resumes on CPU ranks (ep4) with the uninterrupted losses
    ASSERT(
        run_cmd(out, sizeof out,
                MPIRUN
                " 4 build-fake/pith train %s/train.json --set device=cuda --set compute_dtype=fp32 --set max_steps=6 "
                "--set parallel.expert_parallel_size=2 --set save_location=%s/ck --steps 3",
                d, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   MPIRUN " 4 %s train %s/train.json --set max_steps=6 --set parallel.expert_parallel_size=4 --set "
                          "save_location=%s/ck --set run_dir=%s/ck4",
                   PITH_BIN, d, d, d) == 0 &&
           strstr(out, "resume: step 3 from"));
    snprintf(dir, sizeof dir, "%s/ck4", d);
    for (int s = 4; s <= 6; s++) {
        double l = metric(dir, s, "loss"), r = metric(ref, s, "loss");
        ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "resumed: step %d loss %.9g vs one process %.9g", s, l, r);
    }
}

// ---- document masking ----

// Document masking under expert, context and pipeline parallelism (4-layer models: each pipeline rank's chunks
// load the micro-batch's document positions; the ring's hops take their query rows' positions) against one
// process, 20 steps of packed documents: losses and the first step's every gradient tensor (check_layouts). That a
// packed micro-batch equals its documents apart, and masking off differs: tests/test_docmask.c.
static const Layout doc_layouts[] = {
    {"ep2", 2, EP2},
    {"pp2", 2, "--set parallel.pipeline_parallel_size=2"},
    {"cp2", 2, "--set parallel.context_parallel_size=2"},
};
static void check_docmask(const char *model, int n, const char *sets) {
    const char *d = make_run_of(model);
    char path[300];
    snprintf(path, sizeof path, "%s/data.bin", d);
    token_file_short_documents(path, 20000, 64);
    char all[512];
    snprintf(all, sizeof all, "--set document_masking=true --set optimizer.lr=0.002 %s", sets);
    check_layouts(d, doc_layouts, n, all);
}
TEST(dist_docmask_layouts) { check_docmask(TINY_MOE_EP_OF(4), 3, ""); }
TEST(dist_docmask_layouts_deepseek_v2) { check_docmask(DSV2_OF(4), 3, "--set moe_load_balance_type=sequence"); }
// Qwen3.5-MoE: its gated full-attention layers on the ring, its DeltaNet layers on the contiguous layout, with the
// documents' positions.
TEST(dist_docmask_layouts_qwen3_5_moe) { check_docmask(TINY_QWEN3_5_4, 3, ""); }
// GPT-OSS (no context parallelism): its sliding window and sinks with the documents' mask at ep2 and pp2.
TEST(dist_docmask_layouts_gpt_oss) {
    check_docmask(
        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"num_hidden_layers\": 4, \"num_attention_heads\": "
        "4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_local_experts\": 8,"
        " \"num_experts_per_tok\": 2, \"intermediate_size\": 16, \"sliding_window\": 5, \"swiglu_limit\": 2.0,"
        " \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
        "\"full_attention\"], \"max_position_embeddings\": 64}",
        2, "");
}

// pith eval --document-masking over packed short documents (a checkpoint trained with masking for 2 steps): one
// process, --cp 2, --pp 2 and both give one loss within 1e-6 (the ring and the ranks' sums add in another order),
// and masking off gives another.
TEST(dist_docmask_eval) {
    const char *d = make_run_of(TINY_MOE_EP_OF(4));
    char out[1 << 14], fmt[512];
    snprintf(fmt, sizeof fmt, "%s/data.bin", d);
    token_file_short_documents(fmt, 20000, 64);
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "%s train %s/train.json --set document_masking=true --set max_steps=2 --set save_location=%s/ck",
                       PITH_BIN, d, d) == 0,
               "%s", out);
    const char *eval = "eval --model %s/ck/step-00000002 --data %s/data.bin --seq 16 --batch 8";
    static const struct {
        int np;
        const char *opts;
    } runs[] = {{1, "--document-masking"},
                {1, ""},
                {2, "--document-masking --cp 2"},
                {2, "--document-masking --pp 2"},
                {4, "--document-masking --cp 2 --pp 2"}};
    double loss[5];
    for (int i = 0; i < 5; i++) {
        if (runs[i].np == 1) snprintf(fmt, sizeof fmt, "%%s %s %s", eval, runs[i].opts);
        else snprintf(fmt, sizeof fmt, MPIRUN " %d %%s %s %s", runs[i].np, eval, runs[i].opts);
        ASSERT_MSG(run_cmd(out, sizeof out, fmt, PITH_BIN, d, d) == 0 && strstr(out, "loss "), "%s", out);
        ASSERT(!runs[i].opts[0] || strstr(out, "with document masking"));
        loss[i] = atof(strstr(out, "loss ") + 5);
        printf("     %-34s loss %.9g\n", runs[i].opts[0] ? runs[i].opts : "(masking off)", loss[i]);
    }
    ASSERT_MSG(fabs(loss[1] - loss[0]) > 1e-4 * loss[0], "masking on %.9g, off %.9g", loss[0], loss[1]);
    for (int i = 2; i < 5; i++)
        ASSERT_MSG(fabs(loss[i] - loss[0]) <= 1e-6 * loss[0], "%s: loss %.17g vs one process %.17g", runs[i].opts,
                   loss[i], loss[0]);
}
