// test_memory.c — the memory levers (docs/architecture.md, "Expert capacity", "Activation recomputation"):
// expert capacity below the routing's needs computes exactly (spill) or drops exactly the counted rows,
// on CPU ranks under mpirun, and the step line and metrics.jsonl count them; recompute none / selective /
// full give the same loss and gradients bit for bit, plans smaller by the bytes they no longer keep, and
// `pith estimate` equal to what training allocates under each mode.
#include <math.h>

#include "parallel/mesh.h"
#include "pipe/chunk.h"
#include "train/trainer.h"
#include "test.h"

// A run folder: TINY_MOE_EP (3 layers, the middle one dense, 8 experts top-3), 20000 tokens, 6 steps of
// 2 × 16-token micro-batches, 8 samples per step, load balancing on.
static const char *memory_run(void) {
    static char d[256];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    char out[4096];
    ASSERT(run_cmd(out, sizeof out,
                   "echo '%s' > %s/model.json && %s synth --output %s/data.bin --vocab 64 --tokens 20000 && echo "
                   "'{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 16, "
                   "\"micro_batch_size\": 2, \"global_batch_size\": 8, \"max_steps\": 6, \"device\": \"cpu\", "
                   "\"optimizer\": {\"lr\": 0.01}, \"moe_load_balance_coef\": 0.01, \"tensorboard\": false, "
                   "\"parallel\": {\"timeout_s\": 60}}' > %s/train.json",
                   TINY_MOE_EP, d, PITH_BIN, d, d) == 0);
    return d;
}

// The last number in parentheses before " bytes)" after `key` in text (a plan line of train or estimate).
static long long plan_bytes(const char *text, const char *key) {
    const char *k = strstr(text, key), *e = k ? strstr(k, " bytes)") : NULL;
    ASSERT_MSG(e, "no '%s ... bytes)' in: %s", key, text);
    while (e[-1] >= '0' && e[-1] <= '9') e--;
    return strtoll(e, NULL, 10);
}

// ---- activation recomputation: the whole model as one chunk in one process ----

typedef struct {
    double loss, lb;
    float *g[NGROUPS];
    size_t gbytes[NGROUPS];
    double *load; // aux-loss-free balancing's expert counts
    size_t act;   // the plan's activation bytes
} RecomputeRun;

// Two micro-batches forward and backward under `mode`, with load balancing of `form` and a selection bias.
static void recompute_run(const char *model_file, LbForm form, RecomputeMode mode, RecomputeRun *o) {
    enum { B = 2, S = 8, T = B * S };
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, model_file);
    Model m;
    model_create(&m, fam, &mc, DEV_CPU, DT_F32, S);
    m.lb_coef = 0.01, m.recompute = mode;
    Dist d; // a world of one: global-batch balancing all-gathers over it
    dist_mesh_init(&d, 1, 1, 1, false, 60, "test_memory");
    model_lb_setup(&m, form, &d.dp_ep, T);
    for (int g = 0; g < NGROUPS; g++) params_init(&m.params, g, m.w[g].p, 7, 0.2, mc.layers);
    int L = mc.layers, E = mc.experts;
    m.router_bias = tensor_make(xcalloc((size_t)L * E, sizeof(float)), DT_F32, DEV_CPU, 2, L, E, 1, 1);
    for (int i = 0; i < L * E; i++) ((float *)m.router_bias.p)[i] = (float)(0.05 * rng_normal(8, 0, i));
    StepSums st;
    step_sums_create(&st, &m, true);
    Chunk e;
    chunk_init_model(&e, &m, &st, B, S);
    o->act = chunk_plan(&m, B, S, 0, mc.layers, 1, 0).act_bytes;
    model_zero_grads(&m), step_sums_begin(&st, &m);
    int32_t tok[T], lab[T];
    for (int mb = 0; mb < 2; mb++) {
        for (int t = 0; t < T; t++)
            tok[t] = (int32_t)(rng_u64(5, mb, t) % mc.vocab), lab[t] = (int32_t)(rng_u64(6, mb, t) % mc.vocab);
        chunk_load(&e, 0, tok, lab);
        chunk_forward(&e, 0, true);
        chunk_backward(&e, 0, false);
    }
    o->loss = op_read_scalar(st.loss_sum), o->lb = op_read_scalar(st.lb_sum);
    for (int g = 0; g < NGROUPS; g++)
        o->gbytes[g] = tensor_bytes(m.g[g]), o->g[g] = xmalloc(o->gbytes[g] + 1),
        memcpy(o->g[g], m.g[g].p, o->gbytes[g]);
    o->load = xmalloc((size_t)L * E * sizeof(double) + 1),
    memcpy(o->load, st.router_load.p, (size_t)L * E * sizeof(double));
    free(m.router_bias.p);
    m.router_bias = (Tensor){0};
    chunk_free(&e), step_sums_free(&st), model_free(&m), dist_mesh_free(&d);
}

// Every recompute set against none: the loss, load-balancing loss, every gradient element and the expert counts bit
// for bit, under each load-balancing form (global-batch's replay takes this micro-batch's counts back out of its
// sums), on every family: Qwen3 with a dense layer and biases, DeepSeek-V2 with MLA and shared experts, GPT-OSS
// (sinks, clamped SwiGLU, biases), Qwen3.5 (DeltaNet, gated attention, a gated shared expert). A part whose
// recompute went wrong reads what another layer left in the staging or the workspace, so its gradients differ.
TEST(memory_recompute_bit_identical) {
    static const char *const models[] = {
        TINY_MOE_B, TINY_MOE_EP,
        "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 16, \"num_hidden_layers\": "
        "3, \"num_attention_heads\": 2, \"q_lora_rank\": 10, \"kv_lora_rank\": 8, "
        "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6, "
        "\"vocab_size\": 40, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3, "
        "\"moe_intermediate_size\": 6, \"n_shared_experts\": 2, "
        "\"intermediate_size\": 12, \"first_k_dense_replace\": 1}",
        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 40, \"num_local_experts\": 4,"
        " \"num_experts_per_tok\": 2, \"intermediate_size\": 8, \"sliding_window\": 5, \"swiglu_limit\": 2.0}",
        TINY_QWEN3_5_4};
    static const LbForm forms[] = {LB_MICRO_BATCH, LB_GLOBAL_BATCH, LB_SEQUENCE};
    // none, selective, each part alone, every part, full
    static const int modes[] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE,  RC_NORM,       RC_ROPE,
                                RC_ROUTER,      RC_EXPERT_OUT,        RC_GATE_UP,    RC_EXPERT_OUT | RC_GATE_UP,
                                RC_FULL - 1,    RC_GATE_UP | RC_NORM, RECOMPUTE_FULL};
    enum { N = sizeof modes / sizeof *modes };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        for (int f = 0; f < 3; f++) {
            RecomputeRun r[N];
            char file[512];
            snprintf(file, sizeof file, "%s", write_text(test_tmpdir(), "config.json", models[i]));
            for (int k = 0; k < N; k++) recompute_run(file, forms[f], (RecomputeMode)modes[k], &r[k]);
            for (int k = 1; k < N; k++) {
                ASSERT_MSG(r[k].loss == r[0].loss && r[k].lb == r[0].lb,
                           "model %zu, lb form %d, recompute %d: loss %.17g lb %.17g vs %.17g %.17g", i, f, modes[k],
                           r[k].loss, r[k].lb, r[0].loss, r[0].lb);
                bool fewer = modes[k] == RECOMPUTE_SELECTIVE || modes[k] == RC_FULL - 1 || modes[k] == RECOMPUTE_FULL;
                ASSERT_MSG(fewer ? r[k].act < r[0].act : r[k].act <= r[0].act,
                           "model %zu recompute %d: %zu activation bytes vs %zu", i, modes[k], r[k].act, r[0].act);
                ModelConfig mc;
                model_config_load(&mc, file);
                ASSERT(!memcmp(r[k].load, r[0].load, (size_t)mc.layers * mc.experts * sizeof(double)));
                for (int g = 0; g < NGROUPS; g++)
                    ASSERT_MSG(!memcmp(r[k].g[g], r[0].g[g], r[0].gbytes[g]),
                               "model %zu, lb form %d, recompute %d: gradients of group %d differ", i, f, modes[k], g);
            }
            for (int k = 0; k < N; k++) {
                for (int g = 0; g < NGROUPS; g++) free(r[k].g[g]);
                free(r[k].load);
            }
        }
}

static size_t aligned(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

// The plan under each mode, on a model of L identical MoE layers (TINY_MOE_A: T = 16 tokens, k = 2, I = 8,
// H = 16, fp32): selective keeps L − 1 fewer (T·k, I) SwiGLU outputs (one staging buffer stays); full keeps
// per layer exactly its routing (T, k) int32 + fp32 and expert offsets (E + 1) int64, and its output (T, H), and one
// layer's record r — r is what a layer adds under none beyond those.
TEST(memory_recompute_plan_bytes) {
    enum { B = 2, S = 8, T = B * S };
    size_t act[2][3]; // [L = 2, 3][mode]
    for (int n = 0; n < 2; n++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": %d, "
                 "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 48, "
                 "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8}",
                 2 + n);
        ModelConfig mc;
        const ModelFamily *fam = model_config_load(&mc, write_text(test_tmpdir(), "config.json", json));
        for (int mode = 0; mode < 3; mode++) {
            Model m;
            model_describe(&m, fam, &mc, DEV_CPU, DT_F32, S);
            m.recompute = (RecomputeMode[]){RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL}[mode];
            act[n][mode] = chunk_plan(&m, B, S, 0, mc.layers, 1, 0).act_bytes;
            model_free(&m);
        }
    }
    size_t swiglu = aligned((size_t)T * 2 * 8 * 4),
           kept = 2 * aligned((size_t)T * 2 * 4) + aligned(5 * 8) + aligned((size_t)T * 16 * 4);
    for (int n = 0; n < 2; n++) {
        int L = 2 + n;
        ASSERT_MSG(act[n][1] == act[n][0] - (L - 1) * swiglu, "L=%d: selective %zu bytes, none %zu", L, act[n][1],
                   act[n][0]);
    }
    size_t r = (act[1][0] - act[0][0]) - kept; // one layer's record beyond what full keeps
    ASSERT_MSG(act[1][2] - act[0][2] == kept, "full: a layer adds %zu bytes, expected %zu", act[1][2] - act[0][2],
               kept);
    for (int n = 0; n < 2; n++)
        ASSERT_MSG(act[n][2] == act[n][0] - (1 + n) * r, "L=%d: full %zu bytes, none %zu, record %zu", 2 + n, act[n][2],
                   act[n][0], r);
}

// Context parallelism (cp 2 and cp 2 × ep 2; Qwen3 and Qwen3.5's hybrid, whose DeltaNet layers read n1 through the
// contiguous layout) and FP8 at ep 2 (the gate_up GEMM remade through the FP8 weight cache): every part remade gives
// recompute none's step-1 gradient byte for byte in the same layout.
TEST(memory_recompute_layouts) {
    const char *d = memory_run();
    char out[1 << 15];
    write_text(d, "q35.json", TINY_QWEN3_5_4);
    static const char *const runs[] = {"-n 2 %s/train.json --set parallel.context_parallel_size=2",
                                       "-n 4 %s/train.json --set parallel.context_parallel_size=2 --set "
                                       "parallel.expert_parallel_size=2 --set model=%s/q35.json",
                                       "-n 2 %s/train.json --set parallel.expert_parallel_size=2 --set fp8=true"};
    for (int i = 0; i < 3; i++)
        for (int rc = 0; rc < 2; rc++) {
            char launch[300];
            snprintf(launch, sizeof launch, runs[i], d, d);
            ASSERT_MSG(
                run_cmd(out, sizeof out,
                        "PITH=%s scripts/launch.sh %s --set max_steps=1 --set recompute=%s --set run_dir=%s/c%d%d "
                        "--dump-grads %s/c%d%d/g 2>&1",
                        PITH_BIN, launch, rc ? "norm,rope,swiglu,router,expert_out,gate_up" : "none", d, i, rc, d, i,
                        rc) == 0,
                "%s", out);
        }
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(run_cmd(out, sizeof out, "diff -r %s/c%d0/g %s/c%d1/g", d, i, d, i) == 0, "run %d: %s", i, out);
}

// pith estimate's total equals the plan pith train allocates (its "plan" line), under each mode, on one
// process and at ep 2 with a spilling capacity; an unknown part is an error naming the key.
TEST(memory_recompute_estimate_equals_plan) {
    const char *d = memory_run();
    char out[1 << 15], est[1 << 15];
    static const char *const modes[] = {"none", "selective", "full", "norm,rope,swiglu,router,expert_out,gate_up"};
    for (int np = 1; np <= 2; np++)
        for (int i = 0; i < 4; i++) {
            char sets[256];
            snprintf(sets, sizeof sets, "--set recompute=%s%s", modes[i],
                     np == 2 ? " --set parallel.expert_parallel_size=2 --set parallel.ep_capacity_factor=0.5" : "");
            ASSERT(run_cmd(est, sizeof est, "%s estimate %s/train.json --gpus %d --device cpu %s", PITH_BIN, d, np,
                           sets) == 0);
            ASSERT(run_cmd(out, sizeof out,
                           "PITH=%s scripts/launch.sh -n %d %s/train.json --set max_steps=1 --set run_dir=%s/e%d%d %s "
                           "2>&1",
                           PITH_BIN, np, d, d, np, i, sets) == 0);
            long long e = plan_bytes(est, "  total"), t = plan_bytes(out, "plan (");
            ASSERT_MSG(e == t, "%d ranks, %s: estimate %lld vs train %lld", np, modes[i], e, t);
        }
    ASSERT(run_cmd(est, sizeof est, "%s estimate %s/train.json --gpus 1 --set 'recompute=[\"norm\", \"ropes\"]' 2>&1",
                   PITH_BIN, d) != 0);
    ASSERT_MSG(strstr(est, "recompute") && strstr(est, "'norm,ropes' is not supported"), "%s", est);
}

// The model on 2–4 CPU ranks with routing pushed towards rank 0 (tests/parallel/worker.c, "capacity"):
// spilling gives the worst-case plan's loss, load-balancing loss and gradients bit for bit and counts the
// rows above the capacity; dropping zeroes exactly the counted (token, expert) outputs.
TEST(memory_ep_capacity_spill_and_drop) {
    char out[16384];
    for (int np = 2; np <= 4; np++) {
        int rc = run_cmd(out, sizeof out, MPIRUN " %d build/test_parallel capacity", np);
        ASSERT_MSG(rc == 0 && strstr(out, "ok capacity"), "%d ranks: %s", np, out);
    }
}

// pith train at ep 2 with a capacity factor the routing exceeds: the losses and the step-1 gradient of the
// worst-case plan exactly (the same layout, so the same sums), a smaller plan, the rows above the capacity in
// the step line and metrics.jsonl; with ep_drop_tokens the dropped rows are counted and the loss changes.
TEST(memory_ep_capacity_training) {
    const char *d = memory_run();
    char out[1 << 15], plan[3][64];
    static const char *const sets[] = {"--set parallel.ep_capacity_factor=0", "--set parallel.ep_capacity_factor=0.5",
                                       "--set parallel.ep_capacity_factor=0.5 --set parallel.ep_drop_tokens=true"};
    for (int i = 0; i < 3; i++) {
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "PITH=%s scripts/launch.sh -n 2 %s/train.json --set parallel.expert_parallel_size=2 %s "
                           "--set run_dir=%s/r%d --dump-grads %s/r%d/g 2>&1",
                           PITH_BIN, d, sets[i], d, i, d, i) == 0,
                   "%s", out);
        const char *p = strstr(out, "bytes)");
        ASSERT_MSG(p, "%s", out);
        while (p[-1] != '(') p--;
        snprintf(plan[i], sizeof plan[i], "%.*s", (int)strcspn(p, " "), p);
        ASSERT_MSG(strstr(out, i == 2 ? "| ep-dropped " : "| ep-over "), "%s", out);
    }
    char a[300], b[300];
    for (int s = 1; s <= 6; s++) {
        snprintf(a, sizeof a, "%s/r0", d), snprintf(b, sizeof b, "%s/r1", d);
        ASSERT_MSG(run_metric(a, s, "loss") == run_metric(b, s, "loss") &&
                       run_metric(a, s, "grad_norm") == run_metric(b, s, "grad_norm"),
                   "step %d: spilled loss %.17g vs worst case %.17g", s, run_metric(b, s, "loss"),
                   run_metric(a, s, "loss"));
        ASSERT_MSG(run_metric(a, s, "ep_over_rows") == 0 && run_metric(b, s, "ep_over_rows") > 0 &&
                       run_metric(b, s, "ep_load") > 0.5,
                   "step %d: %g rows over, load %g", s, run_metric(b, s, "ep_over_rows"), run_metric(b, s, "ep_load"));
    }
    snprintf(b, sizeof b, "%s/r2", d);
    ASSERT(run_metric(b, 1, "ep_dropped_rows") > 0 && run_metric(b, 1, "loss") != run_metric(a, 1, "loss"));
    ASSERT_MSG(run_cmd(out, sizeof out, "diff -r %s/r0/g %s/r1/g", d, d) == 0, "%s", out);
    ASSERT_MSG(atoll(plan[1]) < atoll(plan[0]) && atoll(plan[2]) < atoll(plan[1]), "plans %s %s %s", plan[0], plan[1],
               plan[2]);
}

// ---- pith estimate: --detail and --sweep ----

// The first number before " GB" after `key` in text.
static double gb_after(const char *text, const char *key) {
    const char *p = strstr(text, key);
    ASSERT_MSG(p, "no '%s' in:\n%s", key, text);
    return strtod(p + strlen(key), NULL);
}

// --detail: the activation parts add up to the activation records (to the MB printed), and a lever's plan is
// the plan of the config with that --set.
TEST(memory_estimate_detail) {
    char out[1 << 15], one[1 << 15];
    const char *cfg = "examples/qwen3-30b-a3b/train.json --gpus 8";
    ASSERT(run_cmd(out, sizeof out, "%s estimate %s --detail", PITH_BIN, cfg) == 0);
    double parts = gb_after(out, "hidden states, routing") / 1e3 + gb_after(out, "stage 1 records") +
                   gb_after(out, "stage 3 records") + gb_after(out, "staging") + gb_after(out, "spill set") +
                   gb_after(out, "epilog") / 1e3;
    ASSERT_MSG(fabs(parts - gb_after(out, "activation records")) < 0.02, "parts %.3f GB:\n%s", parts, out);
    ASSERT_MSG(strstr(out, "largest term: stage 3 records"), "%s", out);
    ASSERT(run_cmd(one, sizeof one, "%s estimate %s --set recompute=full", PITH_BIN, cfg) == 0);
    ASSERT_MSG(fabs(gb_after(out, "--set recompute=full") - gb_after(one, "  total")) < 0.006, "%s\n%s", out, one);
    ASSERT_MSG(strstr(out, "--set parallel.expert_parallel_size=16           (the layout does not divide)"), "%s", out);
    const char *all = "--set recompute=norm,rope,swiglu,router,expert_out,gate_up";
    ASSERT(run_cmd(one, sizeof one, "%s estimate %s %s", PITH_BIN, cfg, all) == 0);
    ASSERT_MSG(fabs(gb_after(out, all) - gb_after(one, "  total")) < 0.006, "%s\n%s", out, one);
}

// With fp8, the estimate names the FP8 weight cache inside the weights' row (codes, transposed codes and scales of every
// FP8 slot, held beside the compute copy). The experts' compute copy is their fp32 master (the cache is made from it and
// nothing else reads them), so the plan grows by the cache less the experts' bf16 copy (2 bytes of each of the 8
// layers' 128 × 3 × 768 × 2048 expert weights) and less the expert-ordered rows xe, which FP8's quantisers gather
// from the token rows instead (moe_stage3_gathers: 8 layers' T·k = 8192 · 8 rows of 2048 bf16).
TEST(memory_estimate_fp8_cache) {
    char bf[1 << 14], f8[1 << 14];
    const char *cfg = "bench/qwen3_30b_a3b_8l/train.json --gpus 1";
    ASSERT(run_cmd(bf, sizeof bf, "%s estimate %s", PITH_BIN, cfg) == 0);
    ASSERT(run_cmd(f8, sizeof f8, "%s estimate %s --set fp8=true", PITH_BIN, cfg) == 0);
    const char *at = strstr(f8, "GB of it the FP8 weight cache");
    ASSERT_MSG(at && !strstr(bf, "FP8 weight cache"), "%s\n%s", bf, f8);
    while (at > f8 && at[-1] != ';') at--;
    double cache = strtod(at + 1, NULL), grow = gb_after(f8, "  total") - gb_after(bf, "  total");
    double experts = 2.0 * 8 * 128 * 3 * 768 * 2048 / 1e9, xe = 2.0 * 8 * 8192 * 8 * 2048 / 1e9;
    printf("     qwen3_30b_a3b_8l: the FP8 weight cache %.2f GB, the experts' bf16 copy %.2f GB, xe %.2f GB: the plan "
           "%+.2f GB\n",
           cache, experts, xe, grow);
    ASSERT_MSG(
        cache > 5 && fabs(grow - (cache - experts - xe)) < 0.015 &&
            fabs(gb_after(f8, "weights (compute copy)") - gb_after(bf, "weights (compute copy)") - (cache + experts)) <
                0.015 &&
            fabs(gb_after(bf, "master weight shards") - gb_after(f8, "master weight shards") - 2 * experts) < 0.015 &&
            strstr(f8, "(the experts' is their compute copy)"),
        "cache %.3f GB, plan +%.3f GB:\n%s\n%s", cache, grow, bf, f8);
}

// A sweep's listing prices each layout's memory trades ("trades ≈ S s a step"): the listed layouts of a verdict come
// in order of it, and a layout with fp32 moments on the host and no recomputed GEMM costs their round trip over the
// host link, 2 × moments / 53 GB/s (estimate.c's TRADE_HOST_BYTES).
static void check_trades(const char *out, double moments) {
    double last = -1;
    int host = 0;
    for (const char *p = strstr(out, "\n  OK "); p; p = strstr(p + 1, "\n  OK ")) {
        const char *end = strchr(p + 1, '\n'), *t = strstr(p, "; trades ≈ ");
        ASSERT_MSG(t && t < end, "%.*s", (int)(end - p), p);
        double s = strtod(t + strlen("; trades ≈ "), NULL);
        ASSERT_MSG(s >= last, "trades %.3f s after %.3f s:\n%s", s, last, out);
        last = s;
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(end - p), p);
        if (strstr(line, "moments on the host") && !strstr(line, "bf16 moments") &&
            (strstr(line, "recompute none, ") || strstr(line, "recompute norm, ") ||
             strstr(line, "recompute norm,rope, ") || strstr(line, "recompute norm,rope,swiglu, "))) {
            ASSERT_MSG(fabs(s - 2 * moments / 53e9) < 0.002, "%s: want %.3f s", line, 2 * moments / 53e9);
            host++;
        }
    }
    ASSERT_MSG(host > 0, "no OK layout with fp32 moments on the host listed:\n%s", out);
}

// --sweep on the real Qwen3-30B-A3B config finds layouts that fit 8 × 141 GB (H200), best first; the first one
// trains a step on 8 CPU ranks at a scaled-down size (TINY_MOE_EP) with the plan `pith estimate` gives it. On
// 8 × 80 GB with a global batch of 8 (one micro-batch a rank) recomputing every part on the device costs less than the
// moments' round trip to the host, so an on-device layout comes first; at 256 (32 micro-batches a rank) the
// recomputation costs 32 times as much and the host moments come first.
TEST(memory_estimate_sweep_layout_trains) {
    char out[1 << 16], est[1 << 15];
    static const int gb[] = {141, 80}; // 8 × 80 GB needs full recompute and bf16 moments (or moments on the host)
    ASSERT(run_cmd(out, sizeof out,
                   "%s estimate examples/qwen3-30b-a3b/train.json --gpus 8 --gpu-memory 80 --sweep --set "
                   "global_batch_size=8 2>/dev/null",
                   PITH_BIN) == 0);
    const char *ok1 = strstr(out, "\n  OK ");
    ASSERT_MSG(ok1, "%s", out);
    char first[512];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(ok1 + 1, "\n"), ok1 + 1);
    ASSERT_MSG(strstr(first, "recompute norm,rope,swiglu,router,expert_out,gate_up") && !strstr(first, "host"), "%s",
               out);
    for (int i = 0; i < 2; i++) {
        ASSERT(run_cmd(out, sizeof out,
                       "%s estimate examples/qwen3-30b-a3b/train.json --gpus 8 --gpu-memory %d --sweep", PITH_BIN,
                       gb[i]) == 0);
        const char *ok = strstr(out, "\n  OK ");
        ASSERT_MSG(ok && !strstr(out, " 0 OK,"), "%d GB: %s", gb[i], out);
        const char *sets = strstr(ok, "--set parallel.");
        ASSERT(sets);
        char layout[512];
        snprintf(layout, sizeof layout, "%.*s", (int)strcspn(sets, "\n"), sets);
        ASSERT_MSG(strstr(layout, "expert_parallel_size=8"), "%s", layout);
        // 8 × 80 GB: an OK layout without offload or full recompute (examples/qwen3-30b-a3b/train-80gb.json)
        const char *fits = strstr(out, "recompute=norm,rope,swiglu,router,expert_out,gate_up --set micro_batch_size=1 "
                                       "--set optimizer.state_dtype=bf16 --set gradient_dtype=bf16 --set "
                                       "parallel.gradient_reduce=layer\n");
        ASSERT_MSG(i == 0 || (fits && strstr(out, "  OK       72.12 GB  ep 8 dp 1 fsdp, capacity 1, recompute "
                                                  "norm,rope,swiglu,router,expert_out,gate_up, micro-batch 1, bf16 "
                                                  "moments, bf16 expert gradients, dense gradient reduced per layer")),
                   "%s", out);
        printf("     8 × %d GB: first OK layout %.*s\n", gb[i], (int)strcspn(ok + 3, "\n"), ok + 3);
        if (i == 1) check_trades(out, 30.53e9);
        const char *d = memory_run();
        ASSERT(run_cmd(est, sizeof est, "%s estimate %s/train.json --gpus 8 --device cpu %s", PITH_BIN, d, layout) ==
               0);
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "PITH=%s scripts/launch.sh -n 8 %s/train.json --set max_steps=1 --set run_dir=%s/s %s 2>&1",
                           PITH_BIN, d, d, layout) == 0,
                   "%s", out);
        long long e = plan_bytes(est, "  total"), t = plan_bytes(out, "plan (");
        ASSERT_MSG(e == t, "%s: estimate %lld vs train %lld", layout, e, t);
        char dir[300];
        snprintf(dir, sizeof dir, "%s/s", d);
        ASSERT(isfinite(run_metric(dir, 1, "loss")));
    }
}

// Under the pipeline (pp 2 × ep 2 on 4 CPU ranks, 8 layers: chunks of two, DualPipeV with deferred weight gradients
// and the overlapped pair): the spill set and the recompute sets give the worst-case plan's step-1 gradient byte for
// byte (a spilled layer, every layer under full recompute and under swiglu with gate_up, computes its weight
// gradient in backward instead of deferring it; gate_up with expert_out defers it; stage 1's parts are remade
// beside the pair's forward).
TEST(memory_pipeline_spill_and_recompute) {
    const char *d = memory_run();
    char out[1 << 15];
    ASSERT(run_cmd(out, sizeof out,
                   "sed 's/\"num_hidden_layers\": 3/\"num_hidden_layers\": 8/' %s/model.json > %s/m8.json", d, d) == 0);
    static const char *const sets[] = {
        "--set parallel.ep_capacity_factor=0",
        "--set parallel.ep_capacity_factor=0.5",
        "--set parallel.ep_capacity_factor=0.5 --set recompute=selective",
        "--set parallel.ep_capacity_factor=0.5 --set recompute=full",
        "--set parallel.ep_capacity_factor=0.5 --set recompute=norm,rope,swiglu,router,expert_out,gate_up",
        "--set parallel.ep_capacity_factor=0.5 --set recompute=gate_up,norm",
        "--set parallel.ep_capacity_factor=0 --set recompute=gate_up,swiglu",
        "--set parallel.ep_capacity_factor=0 --set recompute=gate_up,expert_out",
        "--set recompute='[\"rope\", \"router\", \"swiglu\"]'"};
    for (int i = 0; i < 9; i++) {
        ASSERT_MSG(
            run_cmd(out, sizeof out,
                    "PITH=%s scripts/launch.sh -n 4 %s/train.json --set model=%s/m8.json --set max_steps=2 --set "
                    "parallel.pipeline_parallel_size=2 --set parallel.expert_parallel_size=2 --set "
                    "micro_batch_size=1 %s --set run_dir=%s/p%d --dump-grads %s/p%d/g 2>&1",
                    PITH_BIN, d, d, sets[i], d, i, d, i) == 0,
            "%s: %s", sets[i], out);
        if (i == 1) ASSERT_MSG(strstr(out, "| ep-over ") && !strstr(out, "| ep-over 0 rows"), "%s", out);
        if (i) ASSERT_MSG(run_cmd(out, sizeof out, "diff -r %s/p0/g %s/p%d/g", d, d, i) == 0, "%s: %s", sets[i], out);
    }
}

// ---- optimizer.offload: AdamW's moments in host memory ----

// The moments streamed through staging chunks (PITH_OFFLOAD_CHUNK=100 elements: many chunks and a ragged last one)
// give the same run bit for bit — every step's loss and norm, the checkpoint's model and optimizer files — on one
// CPU process and on two fake-GPU ranks (ep 2: device shards, host moments); the device plan is smaller by the
// moments less the staging, the host line holds the moments, and `pith estimate` says both as training does.
TEST(memory_offload_bit_identical) {
    const char *d = memory_run();
    char out[1 << 15], est[1 << 15];
    static const struct {
        const char *name, *launch, *sets;
    } runs[] = {{"cpu", "", ""},
                {"gpu2", MPIRUN " 2 build-fake/pith",
                 "--set device=cuda --set compute_dtype=fp32 --set parallel.expert_parallel_size=2"}};
    for (int i = 0; i < 2; i++) {
        long long total[2], host = 0;
        for (int off = 0; off < 2; off++) {
            char launch[300];
            snprintf(launch, sizeof launch, "%s", i ? runs[i].launch : PITH_BIN);
            ASSERT_MSG(run_cmd(out, sizeof out,
                               "PITH_OFFLOAD_CHUNK=100 %s train %s/train.json %s --set save_location=%s/%s%d "
                               "--set optimizer.offload=%s 2>&1",
                               launch, d, runs[i].sets, d, runs[i].name, off, off ? "true" : "false") == 0,
                       "%s", out);
            total[off] = plan_bytes(out, "plan (");
            if (off) host = plan_bytes(out, "plan (host)");
            ASSERT_MSG(!off == !strstr(out, "plan (host)"), "%s", out);
            if (!i) { // the estimate of the same layout: the same device total and host bytes
                ASSERT(run_cmd(est, sizeof est,
                               "PITH_OFFLOAD_CHUNK=100 %s estimate %s/train.json --gpus 1 --device cpu "
                               "--set optimizer.offload=%s",
                               PITH_BIN, d, off ? "true" : "false") == 0);
                ASSERT_MSG(plan_bytes(est, "  total") == total[off], "%s\n%s", est, out);
                if (off) ASSERT_MSG(plan_bytes(est, "host memory") == host, "%s", est);
            }
        }
        // smaller by the moments less the staging, up to the alignment padding of the allocations between them
        long long staging = 2 * aligned(100 * sizeof(float)), gap = total[0] - (total[1] + host - staging);
        ASSERT_MSG(llabs(gap) <= 2 * NGROUPS * ARENA_ALIGN, "%s: %lld vs %lld + %lld − %lld", runs[i].name, total[0],
                   total[1], host, staging);
        char a[300], b[300];
        snprintf(a, sizeof a, "%s/%s0", d, runs[i].name), snprintf(b, sizeof b, "%s/%s1", d, runs[i].name);
        for (int s = 1; s <= 6; s++)
            ASSERT_MSG(run_metric(a, s, "loss") == run_metric(b, s, "loss") &&
                           run_metric(a, s, "grad_norm") == run_metric(b, s, "grad_norm"),
                       "%s: step %d differs with the moments on the host", runs[i].name, s);
        ASSERT_MSG(
            run_cmd(out, sizeof out,
                    "cd %s/step-00000006 && for f in *.safetensors; do cmp $f %s/step-00000006/$f || exit 1; done", a,
                    b) == 0,
            "%s: %s", runs[i].name, out);
    }
    // Muon keeps its momentum on the device: offload is AdamW's
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set optimizer.type=muon --set optimizer.offload=true",
                   PITH_BIN, d) == 1 &&
           strstr(out, "optimizer.offload: is AdamW's"));
}

// The GPU's scratch in the plan, at bench/qwen3_5_8l's shapes (2 × 4096 tokens, 32 value heads of 128, 16 heads of
// 256): one buffer at the bottom of the backward workspace (StageIO.opws) that the delta rule's forward and backward
// (op_delta_rule_workspace) and the attention backward's D and dQ accumulator (op_attention_workspace: cuDNN's, in
// builds with it) each hold while they run, the largest layer's: the delta rule backward's; none on the CPU. The plans
// compared: the same model described on the GPU and on the CPU (both bf16), as it is and with every layer full
// attention (the buffer is then the attention's).
TEST(memory_plan_qwen3_5_gpu_scratch) {
    enum { B = 2, S = 4096, T = B * S };
    size_t len;
    char *json = file_read_all("bench/qwen3_5_8l/model.json", &len), *at;
    ChunkPlan p[2][2]; // [as it is, full attention][CPU, GPU]
    for (int full = 0; full < 2; full++) {
        while (full && (at = strstr(json, "\"linear_attention\""))) memcpy(at, "\"full_attention\"  ", 18);
        ModelConfig mc;
        const ModelFamily *fam = model_config_load(&mc, write_text(test_tmpdir(), "config.json", json));
        for (int g = 0; g < 2; g++) {
            Model m;
            model_describe(&m, fam, &mc, g ? DEV_CUDA : DEV_CPU, DT_BF16, S);
            p[full][g] = chunk_plan(&m, B, S, 0, mc.layers, 1, 0);
            model_free(&m);
        }
    }
    free(json);
    Tensor q = tensor_make(NULL, DT_BF16, DEV_CUDA, 3, T, 16, 128, 0),
           v = tensor_make(NULL, DT_BF16, DEV_CUDA, 3, T, 32, 128, 0),
           aq = tensor_make(NULL, DT_BF16, DEV_CUDA, 3, T, 16, 256, 0),
           ak = tensor_make(NULL, DT_BF16, DEV_CUDA, 3, T, 2, 256, 0);
    DeltaArgs da = {.B = B, .chunk = 64};
    AttnArgs aa = {.B = B, .causal = true};
    size_t fwd = op_delta_rule_workspace(q, v, &da, false) * 4, bwd = op_delta_rule_workspace(q, v, &da, true) * 4,
           att = op_attention_workspace(aq, ak, &aa) * 4;
    printf("     the ops' scratch: delta rule forward %.3f GB, backward %.3f GB, attention backward %.3f GB: %.3f GB "
           "planned (%.3f GB with full attention only)\n",
           fwd / 1e9, bwd / 1e9, att / 1e9, (p[0][1].ws_bytes - p[0][0].ws_bytes) / 1e9,
           (p[1][1].ws_bytes - p[1][0].ws_bytes) / 1e9);
    ASSERT_MSG(fwd > 0.4e9 && bwd > fwd && bwd > att, "%zu %zu %zu", fwd, bwd, att);
    // delta_rule_keep: the kept state and the backward's own pieces split the backward's scratch (one allocation
    // boundary apart at most a piece); the forward then needs nothing of its own
    DeltaArgs dk = da;
    dk.keep = true;
    size_t kept = op_delta_rule_kept(q, v, &dk) * 4, own = op_delta_rule_workspace(q, v, &dk, true) * 4;
    printf("     delta_rule_keep: %.3f GB kept a layer, %.3f GB the backward's own\n", kept / 1e9, own / 1e9);
    ASSERT_MSG(kept > fwd && own > 0 && kept + own >= bwd && kept + own <= bwd + 18 * ARENA_ALIGN &&
                   op_delta_rule_workspace(q, v, &dk, false) == 0,
               "kept %zu + own %zu against %zu", kept, own, bwd);
    for (int full = 0; full < 2; full++)
        ASSERT_MSG(p[full][1].ws_bytes == p[full][0].ws_bytes + aligned(full ? att : bwd),
                   "%s: workspace %zu on the GPU, %zu on the CPU", full ? "full attention" : "as it is",
                   p[full][1].ws_bytes, p[full][0].ws_bytes);
}

// ---- optimizer.state_dtype: bf16 AdamW moments ----

// The plan counts 2 bytes a moment element: with the moments on the host (optimizer.offload) the host line is the
// moments alone, half of fp32's up to the arena's alignment; the device plan without offload is smaller by as much
// as the host line. offload with bf16 moments trains as bf16 moments on the device, bit for bit. Muon refuses it.
TEST(memory_state_dtype_bf16) {
    const char *d = tiny_run("");
    char out[16384];
    long long host[2], total[2];
    for (int i = 0; i < 2; i++) {
        const char *dt = i ? "bf16" : "fp32";
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "PITH_OFFLOAD_CHUNK=100 %s train %s/train.json --set optimizer.state_dtype=%s "
                           "--set optimizer.offload=true --set run_dir=%s/off%d",
                           PITH_BIN, d, dt, d, i) == 0,
                   "%s", out);
        host[i] = plan_bytes(out, "plan (host)");
        ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set optimizer.state_dtype=%s --set run_dir=%s/on%d",
                       PITH_BIN, d, dt, d, i) == 0);
        total[i] = plan_bytes(out, "plan (");
    }
    ASSERT_MSG(llabs(host[0] - 2 * host[1]) <= 4 * NGROUPS * ARENA_ALIGN, "host moments %lld (fp32) vs %lld (bf16)",
               host[0], host[1]);
    ASSERT_MSG(llabs(total[0] - total[1] - (host[0] - host[1])) <= 4 * NGROUPS * ARENA_ALIGN,
               "device plan %lld (fp32) vs %lld (bf16), moments %lld vs %lld", total[0], total[1], host[0], host[1]);
    char on[300], off[300];
    snprintf(on, sizeof on, "%s/on1", d), snprintf(off, sizeof off, "%s/off1", d);
    for (int s = 1; s <= 6; s++)
        ASSERT_MSG(run_metric(on, s, "loss") == run_metric(off, s, "loss") &&
                       run_metric(on, s, "grad_norm") == run_metric(off, s, "grad_norm"),
                   "step %d differs with the bf16 moments on the host", s);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set optimizer.type=muon --set optimizer.state_dtype=bf16",
                   PITH_BIN, d) == 1 &&
           strstr(out, "optimizer.state_dtype: is AdamW's"));
}

// ---- gradient_dtype: bf16 expert gradient accumulators ----

// The plan counts 2 bytes an expert gradient element: tiny_run's 2 layers of 4 experts (gate_up 32 × 32, down 32 × 16
// each: 12288 elements) plan 24576 bytes less than with fp32, the rest the same; the estimate equals what training
// allocates, and --detail prices the lever.
TEST(memory_gradient_dtype_bf16) {
    const char *d = tiny_run("");
    char out[16384];
    long long total[2], est = 0;
    for (int i = 0; i < 2; i++) {
        const char *dt = i ? "bf16" : "fp32";
        ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set gradient_dtype=%s --set run_dir=%s/r%d --steps 1",
                       PITH_BIN, d, dt, d, i) == 0);
        total[i] = plan_bytes(out, "plan (");
    }
    ASSERT_MSG(total[0] - total[1] == 2 * 12288, "plan %lld (fp32) vs %lld (bf16)", total[0], total[1]);
    ASSERT(run_cmd(out, sizeof out, "%s estimate %s/train.json --gpus 1 --device cpu --set gradient_dtype=bf16",
                   PITH_BIN, d) == 0);
    est = plan_bytes(out, "total");
    ASSERT_MSG(est == total[1] && strstr(out, "experts bf16 (gradient_dtype)"), "estimate %lld vs train %lld: %s", est,
               total[1], out);
    ASSERT(run_cmd(out, sizeof out, "%s estimate %s/train.json --gpus 1 --device cpu --detail", PITH_BIN, d) == 0);
    ASSERT_MSG(strstr(out, "gradient_dtype=bf16"), "%s", out);
}

// ---- parallel.gradient_reduce "layer": no whole dense gradient ----

// On 2 ranks (dp2) the plan's gradient row is the step path's less the whole dense gradient (n fp32 elements) plus
// what "layer" allocates instead: this rank's shard (n/2) and three windows, one of the largest of the ends' units
// (embedding; final norm and LM head) and two of the largest layer's, each rounded to the arena's alignment; every
// other row is the same; and 2 CPU ranks of `pith train` allocate the plan `pith estimate` gives.
TEST(memory_gradient_reduce_layer) {
    const char *d = memory_run();
    char path[300], model[300], out[1 << 15], est[1 << 15];
    snprintf(path, sizeof path, "%s/train.json", d), snprintf(model, sizeof model, "%s/model.json", d);
    MemoryPlan p[2];
    for (int i = 0; i < 2; i++) {
        char *sets[] = {i ? "parallel.gradient_reduce=layer" : "parallel.gradient_reduce=step"};
        TrainConfig c;
        config_load(&c, path, sets, 1);
        Dist dd;
        dist_mesh_describe(&dd, 2, 0, 1, 1, 1, false, path);
        p[i] = run_memory_plan(&c, &dd, DEV_CPU);
        json_decref(c.json);
    }
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, model);
    mc.pad[GROUP_DENSE] = mc.pad[GROUP_EXPERT] = 2;
    Model m;
    model_describe(&m, fam, &mc, DEV_CPU, DT_F32, 16);
    int64_t n = tensor_numel(m.g[GROUP_DENSE]), ends = 0, layer = 0;
    for (int u = 0; u <= MODEL_UNIT_PROLOG(&m); u++) {
        int64_t k = model_grad_unit(&m, u).n, *most = u < MODEL_UNIT_EPILOG(&m) ? &layer : &ends;
        *most = k > *most ? k : *most;
    }
    model_free(&m);
#define R(elems) (((size_t)(elems)*4 + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN)
    size_t expect = p[0].grads - (size_t)n * 4 + R(n / 2) + R(ends) + 2 * R(layer);
#undef R
    ASSERT_MSG(p[1].grads == expect,
               "gradients %zu with \"layer\", %zu expected (step: %zu; dense %lld, windows %lld, %lld)", p[1].grads,
               expect, p[0].grads, (long long)n, (long long)ends, (long long)layer);
    ASSERT_MSG(p[1].weights == p[0].weights && p[1].shards == p[0].shards && p[1].optim == p[0].optim &&
                   p[1].chunks.act_bytes == p[0].chunks.act_bytes && p[1].chunks.ws_bytes == p[0].chunks.ws_bytes,
               "weights %zu %zu, shards %zu %zu, optimizer %zu %zu, activations %zu %zu, workspace %zu %zu",
               p[0].weights, p[1].weights, p[0].shards, p[1].shards, p[0].optim, p[1].optim, p[0].chunks.act_bytes,
               p[1].chunks.act_bytes, p[0].chunks.ws_bytes, p[1].chunks.ws_bytes);
    printf("     dp2: gradients %zu bytes with \"layer\", %zu with \"step\" (dense group %lld elements)\n", p[1].grads,
           p[0].grads, (long long)n);
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "PITH=%s scripts/launch.sh -n 2 %s --set parallel.gradient_reduce=layer --set run_dir=%s/l "
                       "--steps 1 2>&1",
                       PITH_BIN, path, d) == 0,
               "%s", out);
    ASSERT(run_cmd(est, sizeof est, "%s estimate %s --gpus 2 --device cpu --set parallel.gradient_reduce=layer",
                   PITH_BIN, path) == 0);
    long long e = plan_bytes(est, "  total"), t = plan_bytes(out, "plan (");
    ASSERT_MSG(e == t && e == (long long)memory_plan_total(&p[1]), "estimate %lld, train %lld, plan %zu", e, t,
               memory_plan_total(&p[1]));
}
