// test_parallel_train.c — training features under several CPU ranks (mpirun through scripts/launch.sh):
// validation losses and the Muon optimizer's steps equal one process's, on CPU ranks and on fake GPUs.
#include "test.h"

// A run folder: model.json (the given model), data.bin, val.bin and train.json (micro-batches of 2 × 16
// tokens, global batch gbs, load balancing on, validation every 2 steps).
static const char *make_run_of(const char *model, int gbs, int steps) {
    static char d[256];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    write_text(d, "model.json", model);
    char out[8192], cfg[1024];
    ASSERT(run_cmd(out, sizeof out,
                   "%s synth --output %s/data.bin --vocab 64 --tokens 20000 && %s synth --output %s/val.bin --vocab 64 "
                   "--tokens 2000 --seed 9",
                   PITH_BIN, d, PITH_BIN, d) == 0);
    snprintf(cfg, sizeof cfg,
             "{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 16, \"micro_batch_size\": 2,"
             " \"global_batch_size\": %d, \"max_steps\": %d, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01},"
             " \"moe_load_balance_coef\": 0.01, \"parallel\": {\"timeout_s\": 60},"
             " \"validation\": {\"dataset\": \"val.bin\", \"interval\": 2, \"batches\": 2}}",
             gbs, steps);
    write_text(d, "train.json", cfg);
    return d;
}

// TINY_MOE_EP (3 layers, the middle one dense), global batch 8, 6 steps.
static const char *make_layout_run(void) { return make_run_of(TINY_MOE_EP, 8, 6); }

// The value of `key` at `step` of run folder dir (which must have it).
static double metric_of(const char *dir, int step, const char *key) {
    double v = run_metric(dir, step, key);
    ASSERT_MSG(!isnan(v), "step %d of %s: no %s", step, dir, key);
    return v;
}

typedef struct {
    const char *name;
    int np;
    const char *sets;
    bool fake_gpu; // build-fake/pith: device tensors in host memory, NCCL over MPI (tests/fake/)
} Layout;

static const Layout data_layouts[] = {
    {"ep2", 2, "--set parallel.expert_parallel_size=2", false},
    {"ep2-dp2", 4, "--set parallel.expert_parallel_size=2", false},
    {"hsdp-dp2", 2, "--set parallel.sharding_strategy=hsdp", false},
    {"cp2", 2, "--set parallel.context_parallel_size=2", false},
    {"gpu-ep2-dp2", 4, "--set parallel.expert_parallel_size=2 --set device=cuda --set compute_dtype=fp32", true},
};

// Runs the config of d (sets: more --set options) under each layout and compares with one process every
// step's loss (≤ 1e-6 relative at step 1, ≤ 1e-5 after) and grad norm (≤ 1e-4), the val_loss of every
// second step (≤ 1e-5) and, with grads, the first step's gradient of every tensor (≤ 1e-5). amp (1 but for bf16
// moments) scales the tolerances of steps after the second.
static void check_layouts(const char *d, const Layout *layouts, size_t n, const char *sets, int steps, bool grads,
                          double amp) {
    char out[1 << 16], one[300], dir[300], dump[340], ref[340];
    snprintf(one, sizeof one, "%s/one", d), snprintf(ref, sizeof ref, "%s/g", one);
    ASSERT_MSG(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s --dump-grads %s", PITH_BIN, d, sets,
                       one, ref) == 0,
               "%s", out);
    for (size_t i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s/%s", d, layouts[i].name), snprintf(dump, sizeof dump, "%s/g", dir);
        int rc = run_cmd(
            out, sizeof out, "PITH=%s scripts/launch.sh -n %d %s/train.json %s %s --set run_dir=%s --dump-grads %s",
            layouts[i].fake_gpu ? "build-fake/pith" : PITH_BIN, layouts[i].np, d, sets, layouts[i].sets, dir, dump);
        ASSERT_MSG(rc == 0, "%s: %s", layouts[i].name, out);
        double worst = 0;
        for (int s = 1; s <= steps; s++) {
            double l = metric_of(dir, s, "loss"), r = metric_of(one, s, "loss"), g = metric_of(dir, s, "grad_norm"),
                   rg = metric_of(one, s, "grad_norm");
            double k = s > 2 ? amp : 1;
            worst = fmax(worst, fabs(l - r) / r);
            ASSERT_MSG(fabs(l - r) <= (s == 1 ? 1e-6 : 1e-5) * k * r, "%s: step %d loss %.9g vs one process %.9g",
                       layouts[i].name, s, l, r);
            ASSERT_MSG(fabs(g - rg) <= 1e-4 * k * rg, "%s: step %d grad norm %.9g vs one process %.9g", layouts[i].name,
                       s, g, rg);
            if (s % 2) continue;
            double v = metric_of(dir, s, "val_loss"), rv = metric_of(one, s, "val_loss");
            worst = fmax(worst, fabs(v - rv) / rv);
            ASSERT_MSG(fabs(v - rv) <= 1e-5 * k * rv, "%s: step %d val_loss %.9g vs one process %.9g", layouts[i].name,
                       s, v, rv);
        }
        printf("     %-14s %s: loss and val_loss (%d steps) within %.1e of one process", layouts[i].name,
               strstr(sets, "muon") ? "muon" : "adamw", steps, worst);
        if (!grads) {
            printf("\n");
            continue;
        }
        const char *wn;
        double gd = grad_diff(dump, ref, &wn);
        printf(", gradient %.1e %s\n", gd, wn);
        ASSERT_MSG(gd <= 1e-5, "%s: gradient of %s differs by %.3g", layouts[i].name, wn, gd);
    }
}

TEST(dist_validation_layouts) {
    check_layouts(make_layout_run(), data_layouts, sizeof data_layouts / sizeof *data_layouts, "", 6, false, 1);
}

// A weighted mixture (data.bin and val.bin as sources, weights 3 and 1) reads the same samples under data
// parallelism and under the pipeline (whose first rank reads micro-batches again for the loss, out of order) as
// one process: losses, validation and first-step gradients.
TEST(dist_mixture_layouts) {
    static const Layout mix[] = {
        {"dp2", 2, "", false},
        {"pp2", 2, "--set parallel.pipeline_parallel_size=2", false},
    };
    const char *d = make_run_of(TINY_MOE_EP_OF(4), 8, 6);
    char sets[1024];
    snprintf(sets, sizeof sets,
             "--set 'dataset=[{\"path\":\"%s/data.bin\",\"weight\":3},{\"path\":\"%s/val.bin\",\"weight\":1}]'", d, d);
    check_layouts(d, mix, sizeof mix / sizeof *mix, sets, 6, true, 1);
}

// Supervised fine-tuning data (a loss mask on the training and validation files: 5 of every 16 targets masked)
// under data, pipeline and context parallelism: the targets counted over the ranks and divided once give one
// process's losses, validation and first-step gradients; the same for a mixture of a masked file and an unmasked one
// under dp2 and pp2.
TEST(dist_sft_layouts) {
    static const Layout sft[] = {
        {"dp2", 2, "", false},
        {"pp2", 2, "--set parallel.pipeline_parallel_size=2", false},
        {"cp2", 2, "--set parallel.context_parallel_size=2", false},
    };
    const char *d = make_run_of(TINY_MOE_EP_OF(4), 8, 6);
    char path[300];
    snprintf(path, sizeof path, "%s/data.bin", d), token_file_mask(path, 5);
    snprintf(path, sizeof path, "%s/val.bin", d), token_file_mask(path, 5);
    check_layouts(d, sft, sizeof sft / sizeof *sft, "", 6, true, 1);
    // A mixture of a masked file and an unmasked one (a fresh run folder: data.bin masked, val.bin not).
    char sets[1024];
    d = make_run_of(TINY_MOE_EP_OF(4), 8, 6);
    snprintf(path, sizeof path, "%s/data.bin", d), token_file_mask(path, 5);
    snprintf(sets, sizeof sets,
             "--set 'dataset=[{\"path\":\"%s/data.bin\",\"weight\":3},{\"path\":\"%s/val.bin\",\"weight\":1}]'", d, d);
    check_layouts(d, sft, 2, sets, 6, true, 1);
}

// pith eval --per-token under --pp 2 and --cp 2: every target's loss at its place, NaN at the same masked labels,
// within 1e-6 of one process's.
TEST(dist_sft_eval_per_token) {
    const char *d = make_run_of(TINY_MOE_EP_OF(4), 8, 2);
    char out[1 << 14], fmt[512], path[300];
    snprintf(path, sizeof path, "%s/val.bin", d), token_file_mask(path, 5);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d) == 0);
    const char *eval = "eval --model %s/ck/step-00000002 --data %s/val.bin --seq 16 --batch 8 --per-token %s/%s.npy";
    snprintf(fmt, sizeof fmt, "%%s %s", eval);
    ASSERT_MSG(run_cmd(out, sizeof out, fmt, PITH_BIN, d, d, d, "one") == 0, "%s", out);
    snprintf(path, sizeof path, "%s/one.npy", d);
    float *one = npy_read_f32_2d(path, 8, 16);
    static const char *opts[] = {"--pp 2", "--cp 2"};
    for (int i = 0; i < 2; i++) {
        snprintf(fmt, sizeof fmt, MPIRUN " 2 %%s %s %s", eval, opts[i]);
        ASSERT_MSG(run_cmd(out, sizeof out, fmt, PITH_BIN, d, d, d, "layout") == 0, "%s: %s", opts[i], out);
        snprintf(path, sizeof path, "%s/layout.npy", d);
        float *v = npy_read_f32_2d(path, 8, 16);
        for (int j = 0; j < 8 * 16; j++)
            ASSERT_MSG(isnan(one[j]) ? isnan(v[j]) : fabsf(v[j] - one[j]) <= 1e-6f * one[j], "%s: [%d, %d] %g vs %g",
                       opts[i], j / 16, j % 16, v[j], one[j]);
        free(v);
    }
    free(one);
}

// checkpoint.async under two ranks (each writes its part from its own thread; the folder is completed together): on
// CPU ranks (dp 2: every group sharded, all-gathered into the snapshot) and on fake GPUs at ep 2 (the experts held
// whole, copied from the device by op_copy_async; the rest gathered), with fp32 and bf16 moments: the bytes of
// synchronous saving, and a run stopped after async saves resumes to the same losses.
TEST(dist_async_checkpoint_equals_sync) {
    const char *d = make_run_of(TINY_MOE_EP, 8, 4);
    char out[1 << 16], a[8192], b[8192];
    static const char *const sets[] = {
        "", "--set device=cuda --set compute_dtype=fp32 --set parallel.expert_parallel_size=2",
        "--set device=cuda --set compute_dtype=fp32 --set parallel.expert_parallel_size=2 "
        "--set optimizer.state_dtype=bf16"};
    for (int run = 0; run < 3; run++) {
        const char *pith = run ? "build-fake/pith" : PITH_BIN;
        for (int async = 0; async < 3; async++) // sync; async stopped at step 3; async resumed
            ASSERT_MSG(run_cmd(out, sizeof out,
                               "PITH=%s scripts/launch.sh -n 2 %s/train.json %s --set save_location=%s/%s%d --set "
                               "save_interval=1 --set checkpoint.async=%s %s",
                               pith, d, sets[run], d, async ? "async" : "sync", run, async ? "true" : "false",
                               async == 1 ? "--steps 3" : "") == 0 &&
                           (async < 2 || strstr(out, "resume: step 3 from")),
                       "%s", out);
        for (int s = 1; s <= 4; s++)
            ASSERT_MSG(run_cmd(out, sizeof out,
                               "cd %s && for f in model optimizer; do for r in 1 2; do cmp sync%d/step-%08d/$f-0000$r-"
                               "of-00002.safetensors async%d/step-%08d/$f-0000$r-of-00002.safetensors || exit 1; done; "
                               "done",
                               d, run, s, run, s) == 0,
                       "%s step %d: %s", sets[run], s, out);
        ASSERT(run_cmd(a, sizeof a, "sed 's/, \"tokens_per_s.*//' %s/sync%d/metrics.jsonl", d, run) == 0);
        ASSERT(run_cmd(b, sizeof b, "sed 's/, \"tokens_per_s.*//' %s/async%d/metrics.jsonl", d, run) == 0);
        ASSERT_MSG(!strcmp(a, b), "%s: sync:\n%s\nasync, resumed:\n%s", sets[run], a, b);
    }
}

// DualPipeV (pipeline_parallel_size > 1, and at pp 1 through parallel.pipeline_schedule) on 8 layers (the second
// dense): every layout's 20 steps, validation (forward only through the schedule) and first-step gradients equal
// one process's. One process runs 8
// micro-batches per step: pp2 runs N = 8 > 2P through each pipeline, pp4 N = 2P = 8, and with dp2 or ep2
// beside pp2 each of the two pipelines runs N = 2P = 4; on fake GPUs the pipeline's messages go over NCCL.
TEST(dist_pipeline_layouts) {
    static const Layout pp[] = {
        {"pp1-schedule", 1, "--set parallel.pipeline_schedule=true", false},
        {"pp2", 2, "--set parallel.pipeline_parallel_size=2", false},
        {"pp4", 4, "--set parallel.pipeline_parallel_size=4", false},
        {"pp2-ep2", 4, "--set parallel.pipeline_parallel_size=2 --set parallel.expert_parallel_size=2", false},
        {"pp2-dp2", 4, "--set parallel.pipeline_parallel_size=2", false},
        {"pp2-dp2-hsdp", 4, "--set parallel.pipeline_parallel_size=2 --set parallel.sharding_strategy=hsdp", false},
        {"gpu-pp2", 2, "--set parallel.pipeline_parallel_size=2 --set device=cuda --set compute_dtype=fp32", true},
    };
    // lr 0.005: at 0.01 the 8-layer model overfits chaotically and ep2 alone (no pipeline) drifts 4e-5 from one
    // process by step 18 through fp32 summation order; at 0.005 every layout stays within 1e-7
    check_layouts(make_run_of(TINY_MOE_EP_OF(8), 16, 20), pp, sizeof pp / sizeof *pp, "--set optimizer.lr=0.005", 20,
                  true, 1);
}

// Muon (its all-gathered momentum per stage) at pp2 × ep2, and global-batch load balancing with aux-loss-free
// router biases (counts of each layer summed over the world) at pp2 × dp2, equal one process.
TEST(dist_pipeline_muon_and_balancing) {
    const char *d = make_run_of(TINY_MOE_EP_OF(8), 16, 6);
    static const Layout muon[] = {
        {"pp2-ep2", 4, "--set parallel.pipeline_parallel_size=2 --set parallel.expert_parallel_size=2", false}};
    static const Layout dp[] = {{"pp2-dp2", 4, "--set parallel.pipeline_parallel_size=2", false}};
    check_layouts(d, muon, 1, "--set optimizer.type=muon --set optimizer.lr=0.005", 6, true, 1);
    check_layouts(d, dp, 1,
                  "--set optimizer.lr=0.005 --set moe_load_balance_type=global-batch "
                  "--set moe_router_bias_update_rate=0.01",
                  6, true, 1);
}

// Every family through the pipeline: 4-layer tiny DeepSeek-V2 (a dense first layer, MLA, group-limited
// routing, a shared expert, sequence-form load balancing), GPT-OSS (sliding and full layers with sinks, clamped
// SwiGLU experts with biases) and Qwen3.5-MoE (Gated DeltaNet and gated full-attention layers, a gated shared
// expert) at pp2 (N = 8 > 2P) and pp2 × ep2 (N = 2P = 4): 6 steps of loss and validation and the first step's
// gradient of every tensor equal one process's.
static const struct {
    const char *name, *model, *sets;
} fams[] = {
    // the families besides Qwen3, with a setting each exercises
    {"deepseek_v2",
     "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 32, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
     " \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8,"
     " \"v_head_dim\": 6, \"vocab_size\": 64, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3,"
     " \"moe_intermediate_size\": 16, \"n_shared_experts\": 1, \"intermediate_size\": 24,"
     " \"first_k_dense_replace\": 1, \"topk_method\": \"group_limited_greedy\", \"n_group\": 4, \"topk_group\": 2,"
     " \"routed_scaling_factor\": 2.0, \"max_position_embeddings\": 64, \"rope_parameters\": {\"rope_type\":"
     " \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0, \"original_max_position_embeddings\": 8,"
     " \"mscale\": 0.707, \"mscale_all_dim\": 0.707}}",
     "--set moe_load_balance_type=sequence"},
    {"gpt_oss",
     "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
     " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_local_experts\": 8,"
     " \"num_experts_per_tok\": 2, \"intermediate_size\": 16, \"sliding_window\": 5, \"swiglu_limit\": 2.0,"
     " \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"],"
     " \"max_position_embeddings\": 64, \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0,"
     " \"factor\": 4.0, \"truncate\": false, \"original_max_position_embeddings\": 8}}",
     ""},
    {"qwen3_5_moe", TINY_QWEN3_5_4, ""},
};

TEST(dist_pipeline_families) {
    static const Layout pp[] = {
        {"pp2", 2, "--set parallel.pipeline_parallel_size=2", false},
        {"pp2-ep2", 4, "--set parallel.pipeline_parallel_size=2 --set parallel.expert_parallel_size=2", false},
    };
    for (size_t i = 0; i < sizeof fams / sizeof *fams; i++) {
        char sets[256];
        snprintf(sets, sizeof sets, "--set optimizer.lr=0.005 %s", fams[i].sets);
        printf("     %s\n", fams[i].name);
        check_layouts(make_run_of(fams[i].model, 16, 6), pp, 2, sets, 6, true, 1);
    }
}

// A checkpoint written at pp2 × ep2 (each tensor whole, by one rank of the stage holding it) resumes on one
// process, at pp4 and at ep2 with the uninterrupted run's losses: the format does not know the layout.
TEST(dist_pipeline_reshard_resume) {
    const char *d = make_run_of(TINY_MOE_EP_OF(8), 16, 6);
    const char *lr = "--set optimizer.lr=0.005";
    char out[1 << 16], dir[300], full[300];
    snprintf(full, sizeof full, "%s/full", d);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s", PITH_BIN, d, lr, full) == 0);
    ASSERT_MSG(
        run_cmd(out, sizeof out,
                "PITH=%s scripts/launch.sh -n 4 %s/train.json %s --set parallel.pipeline_parallel_size=2 "
                "--set parallel.expert_parallel_size=2 --set save_location=%s/ck --steps 3 && ls %s/ck/step-00000003",
                PITH_BIN, d, lr, d, d) == 0 &&
            strstr(out, "model-00004-of-00004.safetensors") && strstr(out, "model.safetensors.index.json"),
        "%s", out);
    static const struct {
        const char *name;
        int np;
        const char *sets;
    } targets[] = {{"one", 1, ""},
                   {"pp4", 4, "--set parallel.pipeline_parallel_size=4"},
                   {"ep2", 2, "--set parallel.expert_parallel_size=2"}};
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        snprintf(dir, sizeof dir, "%s/%s", d, targets[i].name);
        ASSERT_MSG(
            run_cmd(out, sizeof out,
                    "cp -r %s/ck %s && PITH=%s scripts/launch.sh -n %d %s/train.json %s %s --set save_location=%s", d,
                    dir, PITH_BIN, targets[i].np, d, lr, targets[i].sets, dir) == 0 &&
                strstr(out, "resume: step 3 from"),
            "%s: %s", targets[i].name, out);
        for (int s = 4; s <= 6; s++) {
            double l = metric_of(dir, s, "loss"), r = metric_of(full, s, "loss");
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs uninterrupted %.9g", targets[i].name, s, l,
                       r);
        }
    }
}

// pith eval --pp P runs the samples through the forward-only schedule of P ranks holding their chunks' weights
// (read from a checkpoint written at pp2): the loss equals one process's bit for bit.
TEST(dist_pipeline_eval) {
    const char *d = make_run_of(TINY_MOE_EP_OF(8), 16, 2);
    char out[1 << 14], one[4096];
    ASSERT(run_cmd(out, sizeof out,
                   "PITH=%s scripts/launch.sh -n 2 %s/train.json --set parallel.pipeline_parallel_size=2 "
                   "--set save_location=%s/ck",
                   PITH_BIN, d, d) == 0);
    const char *eval = "eval --model %s/ck/step-00000002 --data %s/val.bin --seq 16 --batch 9";
    char fmt[512];
    snprintf(fmt, sizeof fmt, "%%s %s --micro-batch 1", eval); // one sample per forward, as in the pipeline
    ASSERT(run_cmd(one, sizeof one, fmt, PITH_BIN, d, d) == 0 && strstr(one, "loss "));
    for (int pp = 2; pp <= 4; pp += 2) {
        snprintf(fmt, sizeof fmt, MPIRUN " %d %%s %s --pp %d", pp, eval, pp);
        ASSERT_MSG(run_cmd(out, sizeof out, fmt, PITH_BIN, d, d) == 0, "%s", out);
        ASSERT_MSG(strstr(out, strstr(one, "loss ")), "pp%d: %s vs one process: %s", pp, out, one);
    }
    snprintf(fmt, sizeof fmt, MPIRUN " 4 %%s %s --pp 4 --batch 7", eval);
    ASSERT(run_cmd(out, sizeof out, fmt, PITH_BIN, d, d) != 0 &&
           strstr(out, "eval: --pp 4 with --batch 7: DualPipeV needs at least 2 × 4 = 8 micro-batches"));
}

// pith eval --cp C: each rank keeps its zigzag chunks of every sample (the hybrid Qwen3.5-MoE: ring attention and
// the DeltaNet layers' contiguous layout), alone and inside a pipeline: the loss equals one process's within 1e-6
// (the ring and the ranks' sums add in another order). A sequence that 2C does not divide is refused.
TEST(dist_cp_eval) {
    const char *d = make_run_of(TINY_QWEN3_5_4, 16, 2);
    char out[1 << 14], one[4096], fmt[512];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d) == 0);
    const char *eval = "eval --model %s/ck/step-00000002 --data %s/val.bin --seq 16 --batch 9";
    snprintf(fmt, sizeof fmt, "%%s %s", eval);
    ASSERT(run_cmd(one, sizeof one, fmt, PITH_BIN, d, d) == 0 && strstr(one, "loss "));
    double ref = atof(strstr(one, "loss ") + 5);
    static const struct {
        int np;
        const char *opts;
    } runs[] = {{2, "--cp 2"}, {4, "--cp 2 --pp 2"}};
    for (int i = 0; i < 2; i++) {
        snprintf(fmt, sizeof fmt, MPIRUN " %d %%s %s %s", runs[i].np, eval, runs[i].opts);
        ASSERT_MSG(run_cmd(out, sizeof out, fmt, PITH_BIN, d, d) == 0 && strstr(out, "loss "), "%s", out);
        double l = atof(strstr(out, "loss ") + 5);
        printf("     %-14s loss %.9g, one process %.9g (%.1e)\n", runs[i].opts, l, ref, fabs(l - ref) / ref);
        ASSERT_MSG(fabs(l - ref) <= 1e-6 * ref, "%s: loss %.17g vs one process %.17g", runs[i].opts, l, ref);
    }
    snprintf(fmt, sizeof fmt, MPIRUN " 2 %%s %s --cp 2 --seq 18", eval);
    ASSERT(run_cmd(out, sizeof out, fmt, PITH_BIN, d, d) != 0 &&
           strstr(out, "eval: --cp 2: --seq 18 is not a multiple of 2 × cp = 4"));
}

// The schedule's conditions are config errors naming the key: the layers must cut into 2P chunks, and each
// pipeline needs at least 2P micro-batches per step.
TEST(dist_pipeline_config_errors) {
    const char *d = make_run_of(TINY_MOE_EP_OF(8), 16, 6);
    char out[1 << 14];
    static const struct {
        const char *sets, *needle;
    } cases[] = {
        {"--set parallel.pipeline_parallel_size=2 --set global_batch_size=6",
         "train.json: global_batch_size: DualPipeV needs at least 2 × 2 = 4 micro-batches per step, got 3"},
        {"--set parallel.pipeline_parallel_size=2 --set model=%s/three.json",
         "train.json: parallel.pipeline_parallel_size: DualPipeV cuts the model into 2 × 2 = 4 chunks: 3 layers do not "
         "divide evenly"},
    };
    write_text(d, "three.json", TINY_MOE_EP);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char sets[300];
        snprintf(sets, sizeof sets, cases[i].sets, d);
        int rc = run_cmd(out, sizeof out, "PITH=%s scripts/launch.sh -n 2 %s/train.json %s", PITH_BIN, d, sets);
        ASSERT_MSG(rc != 0 && strstr(out, cases[i].needle), "expected '%s' in: %s", cases[i].needle, out);
    }
}

// A checkpoint of the config of d (sets: more --set options) saved at step 3 by ep2 × dp2 resumes on one process with
// the losses of check_layouts' one-process run (d/one).
static void check_reshard_resume(const char *d, const char *sets) {
    char out[1 << 16], dir[300], one[300];
    ASSERT(run_cmd(out, sizeof out,
                   "PITH=%s scripts/launch.sh -n 4 %s/train.json %s --set parallel.expert_parallel_size=2 "
                   "--set save_location=%s/ck --steps 3 && %s train %s/train.json %s --set save_location=%s/ck",
                   PITH_BIN, d, sets, d, PITH_BIN, d, sets, d) == 0);
    ASSERT_MSG(strstr(out, "resume: step 3"), "%s", out);
    snprintf(dir, sizeof dir, "%s/ck", d), snprintf(one, sizeof one, "%s/one", d);
    for (int s = 4; s <= 6; s++) {
        double l = metric_of(dir, s, "loss"), r = metric_of(one, s, "loss");
        ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "step %d: resumed on one process %.9g vs uninterrupted %.9g", s, l, r);
    }
}

// Muon under every layout equals one process; a Muon checkpoint from ep2×dp2 resumes on one process with
// the uninterrupted run's losses (the momentum buffers reshard like AdamW's moments).
TEST(dist_muon_layouts_and_reshard) {
    const char *d = make_layout_run();
    const char *muon = "--set optimizer.type=muon --set optimizer.lr=0.02";
    check_layouts(d, data_layouts, sizeof data_layouts / sizeof *data_layouts, muon, 6, false, 1);
    check_reshard_resume(d, muon);
}

// bf16 AdamW moments (optimizer.state_dtype) under fsdp, hsdp, pp, ep and ep × dp (CPU ranks and fake GPUs) against
// one process with bf16 moments (4 layers: DualPipeV's 2 × pp chunks); an ep2 × dp2 checkpoint (bf16 shards gathered
// by every rank) resumes on one process with the uninterrupted run's losses. Steps 1 and 2 keep fp32's tolerances
// (step 1's update uses the moments' fp32 values). After them a layout that sums gradients in another order (dp, ep)
// moves further: gradients δ apart (relative; one fp32 ulp: 2^-24) round to moments one bf16 ulp (2^-8) apart on the
// fraction δ/2^-8 of elements whose value sits that near a rounding boundary, so the moments' difference has norm
// √(δ·2^8)·2^-8 = 2^-4·√δ a unit of moment in place of δ: 2^8 times fp32's at one ulp, the tolerances' scale here.
// pp runs the same sums as one process and stays bit-identical.
TEST(dist_state_dtype_bf16_layouts) {
    static const Layout bf16[] = {
        {"fsdp-dp2", 2, "", false},
        {"hsdp-dp2", 2, "--set parallel.sharding_strategy=hsdp", false},
        {"pp2", 2, "--set parallel.pipeline_parallel_size=2", false},
        {"ep2", 2, "--set parallel.expert_parallel_size=2", false},
        {"ep2-dp2", 4, "--set parallel.expert_parallel_size=2", false},
        {"gpu-ep2-dp2", 4, "--set parallel.expert_parallel_size=2 --set device=cuda --set compute_dtype=fp32", true},
    };
    const char *d = make_run_of(TINY_MOE_EP_OF(4), 8, 6), *sets = "--set optimizer.state_dtype=bf16";
    check_layouts(d, bf16, sizeof bf16 / sizeof *bf16, sets, 6, true, 256);
    check_reshard_resume(d, sets);
}

// bf16 expert gradients (gradient_dtype) under dp2 (fsdp, hsdp), ep2, and on fake GPUs ep2 and dp2 (NCCL's bf16
// reduce-scatter) against one process
// with bf16 gradients, step 1 of a global batch of 2 micro-batches (each rank one): one process rounds rd(rd(s1) + s2)
// (within 2^-8·|s| + 2^-8·(1 + 2^-8)·|s1|, s = s1 + s2, train_gradient_dtype_bf16); ep2's expert GEMMs take both
// micro-batches' rows at once, rd(s1 + s2) (within 2^-8·|s|); dp2 rounds each rank's sum, then MPI's fp32 sum once,
// within 2^-8·(|s1| + |s2| + |s|(1 + 2^-7)) ≤ 2^-8·(1 + 2^-7)·(2|s| + 2|s1|) as |s2| ≤ |s| + |s1|. So a layout and one
// process differ by at most 3·2^-8·(1 + 2^-7)·(|s| + |s1|) an element (fp32's reordering, 2^-22 of these, fits the
// slack); s and s1 from one process's fp32 dumps of the batch and of its first micro-batch. The dense gradients are
// fp32: within 1e-5 as in check_layouts. Step 1's loss within 1e-6. pp2 (4 layers, 8 micro-batches) adds each
// micro-batch's gradient in one process's order: bit-identical losses and gradients over 4 steps.
TEST(dist_gradient_dtype_bf16_layouts) {
    static const Layout runs[] = {
        {"fsdp-dp2", 2, "", false},
        {"hsdp-dp2", 2, "--set parallel.sharding_strategy=hsdp", false},
        {"ep2", 2, "--set parallel.expert_parallel_size=2", false},
        {"gpu-ep2", 2, "--set parallel.expert_parallel_size=2 --set device=cuda --set compute_dtype=fp32", true},
        {"gpu-dp2", 2, "--set device=cuda --set compute_dtype=fp32", true},
        {"one", 1, "", false},
        {"f32", 1, "--set gradient_dtype=fp32", false},
        {"f32-mb1", 1, "--set gradient_dtype=fp32 --set global_batch_size=2", false},
    };
    const char *d = make_run_of(TINY_MOE_EP, 4, 1);
    char out[1 << 16], b[300], one[300], f[300], f1[300], dir[300];
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++)
        ASSERT_MSG(
            run_cmd(out, sizeof out,
                    "PITH=%s scripts/launch.sh -n %d %s/train.json --set gradient_dtype=bf16 %s --set run_dir=%s/%s "
                    "--dump-grads %s/%s/g",
                    runs[i].fake_gpu ? "build-fake/pith" : PITH_BIN, runs[i].np, d, runs[i].sets, d, runs[i].name, d,
                    runs[i].name) == 0,
            "%s: %s", runs[i].name, out);
    snprintf(one, sizeof one, "%s/one/g", d), snprintf(f, sizeof f, "%s/f32/g", d);
    snprintf(f1, sizeof f1, "%s/f32-mb1/g", d);
    for (int i = 0; i < 5; i++) {
        snprintf(b, sizeof b, "%s/%s/g", d, runs[i].name);
        int64_t moved;
        double worst = grad_bf16_check(b, one, f, f1, 3, 1e-5, &moved);
        snprintf(dir, sizeof dir, "%s/%s", d, runs[i].name);
        double l = metric_of(dir, 1, "loss");
        snprintf(dir, sizeof dir, "%s/one", d);
        double r = metric_of(dir, 1, "loss");
        ASSERT_MSG(fabs(l - r) <= 1e-6 * r, "%s: step 1 loss %.9g vs one process %.9g", runs[i].name, l, r);
        printf("     %-9s step 1: %lld expert elements differ from one process's, the worst at %.2f of the bound\n",
               runs[i].name, (long long)moved, worst);
    }
    d = make_run_of(TINY_MOE_EP_OF(4), 8, 4);
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(
            run_cmd(out, sizeof out,
                    "PITH=%s scripts/launch.sh -n %d %s/train.json --set gradient_dtype=bf16 %s --set run_dir=%s/%s "
                    "--dump-grads %s/%s/g",
                    PITH_BIN, i + 1, d, i ? "--set parallel.pipeline_parallel_size=2" : "", d, i ? "pp2" : "one", d,
                    i ? "pp2" : "one") == 0,
            "%s", out);
    const char *wn;
    snprintf(b, sizeof b, "%s/pp2/g", d), snprintf(one, sizeof one, "%s/one/g", d);
    double gd = grad_diff(b, one, &wn);
    ASSERT_MSG(gd == 0, "pp2: the gradient of %s differs from one process's by %.3g", wn, gd);
    for (int s = 1; s <= 4; s++) {
        snprintf(b, sizeof b, "%s/pp2", d), snprintf(one, sizeof one, "%s/one", d);
        ASSERT_MSG(metric_of(b, s, "loss") == metric_of(one, s, "loss"), "pp2: step %d loss differs", s);
    }
}

double *read_router_bias(const char *ckpt, int *n); // tests/test_balance.c

// Aux-loss-free balancing counts the experts of the whole global batch: the biases after 6 steps are the same
// numbers under ep2 and dp2 as on one process.
TEST(dist_router_bias_layouts) {
    const char *d = make_layout_run();
    static const struct {
        const char *name;
        int np;
        const char *sets;
    } runs[] = {{"one", 1, ""}, {"ep2", 2, "--set parallel.expert_parallel_size=2"}, {"dp2", 2, ""}};
    char out[1 << 16], ck[320];
    double *ref = NULL;
    int nref = 0;
    for (int i = 0; i < 3; i++) {
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "PITH=%s scripts/launch.sh -n %d %s/train.json --set moe_router_bias_update_rate=0.01 %s "
                           "--set save_location=%s/%s",
                           PITH_BIN, runs[i].np, d, runs[i].sets, d, runs[i].name) == 0,
                   "%s: %s", runs[i].name, out);
        snprintf(ck, sizeof ck, "%s/%s/step-00000006", d, runs[i].name);
        int n;
        double *b = read_router_bias(ck, &n);
        if (!ref) ref = b, nref = n;
        else {
            ASSERT(n == nref);
            for (int j = 0; j < n; j++)
                ASSERT_MSG(b[j] == ref[j], "%s: bias %d = %g, one process %g", runs[i].name, j, b[j], ref[j]);
            free(b);
        }
    }
    int moved = 0;
    for (int j = 0; j < nref; j++) moved += ref[j] != 0;
    printf("     %d of %d biases moved; ep2 and dp2 hold the same values\n", moved, nref);
    ASSERT(moved > 0);
    free(ref);
}

// Document masking through the CUDA host code (fake GPUs: the chunk's positions copied to the device, the attention
// ops' docpos) at ep2 × dp2, and on CPU ranks at dp2 with validation, against one process: losses, validation and
// the first step's gradients (packed short documents in the training and validation files).
TEST(dist_docmask_fake_gpu) {
    static const Layout docs[] = {
        {"dp2", 2, "", false},
        {"gpu-ep2-dp2", 4, "--set parallel.expert_parallel_size=2 --set device=cuda --set compute_dtype=fp32", true},
    };
    const char *d = make_run_of(TINY_MOE_EP, 8, 6);
    char path[300];
    snprintf(path, sizeof path, "%s/data.bin", d), token_file_short_documents(path, 20000, 64);
    snprintf(path, sizeof path, "%s/val.bin", d), token_file_short_documents(path, 2000, 64);
    check_layouts(d, docs, 2, "--set document_masking=true", 6, true, 1);
}

// parallel.gradient_reduce "layer" (docs/architecture.md, "Gradient reduction per layer") under dp2 (2 micro-batches
// a rank), ep2, ep2 × dp2, hsdp (ep2 × dp2: shards over ep, the replicas' sum after), cp2 and on fake GPUs (NCCL's
// reduce) against one process with the step path. The option changes only the order in which each dense gradient
// element's terms are added: one process sums its M micro-batches; a layout of n ranks sums the n ranks' terms of
// each micro-batch, then the micro-batches (the step path: each rank's micro-batches, then the ranks). Two orders of a
// sum of K = n·M ≤ 4 fp32 terms are each within (K − 1)·2^-24·Σ|terms| of the exact sum, so they differ by at most
// 6·2^-24 ≈ 3.6e-7 of Σ|terms| an element: check_layouts' 1e-5 (relative to the gradient's norm) and its loss
// tolerances, which already hold the step path's reordering, hold this one too.
TEST(dist_gradient_reduce_layer_layouts) {
    static const Layout layer[] = {
        {"dp2", 2, "--set parallel.gradient_reduce=layer", false},
        {"ep2", 2, "--set parallel.gradient_reduce=layer --set parallel.expert_parallel_size=2", false},
        {"ep2-dp2", 4, "--set parallel.gradient_reduce=layer --set parallel.expert_parallel_size=2", false},
        {"hsdp-ep2-dp2", 4,
         "--set parallel.gradient_reduce=layer --set parallel.expert_parallel_size=2 --set "
         "parallel.sharding_strategy=hsdp",
         false},
        {"cp2", 2, "--set parallel.gradient_reduce=layer --set parallel.context_parallel_size=2", false},
        {"gpu-ep2-dp2", 4,
         "--set parallel.gradient_reduce=layer --set parallel.expert_parallel_size=2 --set device=cuda --set "
         "compute_dtype=fp32",
         true},
    };
    check_layouts(make_layout_run(), layer, sizeof layer / sizeof *layer, "", 6, true, 1);
}

// With one micro-batch a rank on 2 ranks the two paths add the same two terms (a + b = b + a in fp32), so "layer"
// is the step path bit for bit: losses, gradient norms, the gradients of step 1, and the checkpoint's tensor files
// (run.json differs only by the option); a "layer" run's checkpoint resumes with the uninterrupted run's bits, and
// under the step path too. The refused combinations are one-line config errors.
TEST(dist_gradient_reduce_layer_exact_resume_errors) {
    const char *d = make_run_of(TINY_MOE_EP, 4, 4);
    char out[1 << 16], a[300], b[300];
    static const char *const mode[] = {"step", "layer", "layer", "step"}; // the last two resume the second's step 2
    for (int i = 0; i < 4; i++) {
        if (i >= 2)
            ASSERT(run_cmd(out, sizeof out, "rm -rf %s/r%d && mkdir -p %s/r%d && cp -r %s/r1/step-00000002 %s/r%d/", d,
                           i, d, i, d, d, i) == 0);
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "PITH=%s scripts/launch.sh -n 2 %s/train.json --set parallel.gradient_reduce=%s "
                           "--set save_location=%s/r%d --set save_interval=2 --dump-grads %s/r%d/g",
                           PITH_BIN, d, mode[i], d, i, d, i) == 0,
                   "%s: %s", mode[i], out);
        ASSERT_MSG(i < 2 || strstr(out, "resume: step 2"), "%s", out);
    }
    snprintf(a, sizeof a, "%s/r0", d);
    for (int i = 1; i < 4; i++) {
        snprintf(b, sizeof b, "%s/r%d", d, i);
        for (int s = i < 2 ? 1 : 3; s <= 4; s++)
            ASSERT_MSG(metric_of(a, s, "loss") == metric_of(b, s, "loss") &&
                           metric_of(a, s, "grad_norm") == metric_of(b, s, "grad_norm"),
                       "run %d (%s): step %d differs from the step path", i, mode[i], s);
    }
    const char *wn;
    char g0[340], g1[340];
    snprintf(g0, sizeof g0, "%s/r0/g", d), snprintf(g1, sizeof g1, "%s/r1/g", d);
    double gd = grad_diff(g1, g0, &wn);
    ASSERT_MSG(gd == 0, "the gradient of %s differs from the step path's by %.3g", wn, gd);
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "cd %s && for f in $(ls r0/step-00000002 | grep -v run.json); do cmp r0/step-00000002/$f "
                       "r1/step-00000002/$f || exit 3; done && "
                       "diff r0/step-00000002/run.json r1/step-00000002/run.json "
                       "| grep '^[<>]' | grep -v 'run_dir\\|save_location\\|gradient_reduce'",
                       d) == 1,
               "the checkpoints differ: %s", out);
    static const struct {
        int np;
        const char *sets, *needle;
    } bad[] = {
        {2, "--set parallel.pipeline_parallel_size=2",
         "parallel.gradient_reduce: \"layer\" needs pipeline_parallel_size 1"},
        {1, "--set parallel.pipeline_schedule=true",
         "parallel.gradient_reduce: \"layer\" needs pipeline_schedule false"},
        {2, "--set optimizer.type=muon", "parallel.gradient_reduce: \"layer\" needs optimizer.type"},
        {1, "", "parallel.gradient_reduce: \"layer\" needs the dense parameters sharded over more than one"},
        {2, "--set parallel.sharding_strategy=hsdp",
         "parallel.gradient_reduce: \"layer\" needs the dense parameters sharded over more than one"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run_cmd(out, sizeof out,
                         "PITH=%s scripts/launch.sh -n %d %s/train.json --set parallel.gradient_reduce=layer %s "
                         "--set run_dir=%s/bad",
                         PITH_BIN, bad[i].np, d, bad[i].sets, d);
        ASSERT_MSG(rc != 0 && strstr(out, bad[i].needle), "expected '%s' in: %s", bad[i].needle, out);
    }
}

// Every family's gradient views bound per unit (their mixers' own views: MLA, DeltaNet, sinks, shared experts, expert
// biases) and tied embeddings (the LM head's gradient kept in the embedding's window from the epilog's forward to the
// prolog's backward): with one micro-batch a rank on dp2, "layer" gives the step path's losses and step-1 gradients
// bit for bit (dist_gradient_reduce_layer_exact_resume_errors says why). A view left on another unit's window, or a
// unit's gradient reduced before all of it is written, changes them.
TEST(dist_gradient_reduce_layer_families) {
    char tied[1024];
    snprintf(tied, sizeof tied, "%.*s, \"tie_word_embeddings\": true}", (int)strlen(TINY_MOE_EP) - 1, TINY_MOE_EP);
    const char *models[][2] = {{fams[0].name, fams[0].model},
                               {fams[1].name, fams[1].model},
                               {fams[2].name, fams[2].model},
                               {"qwen3 tied", tied}};
    char out[1 << 16], a[340], b[340];
    for (int i = 0; i < 4; i++) {
        const char *d = make_run_of(models[i][1], 4, 2);
        for (int k = 0; k < 2; k++)
            ASSERT_MSG(run_cmd(out, sizeof out,
                               "PITH=%s scripts/launch.sh -n 2 %s/train.json --set parallel.gradient_reduce=%s "
                               "--set run_dir=%s/%d --dump-grads %s/%d/g",
                               PITH_BIN, d, k ? "layer" : "step", d, k, d, k) == 0,
                       "%s: %s", models[i][0], out);
        snprintf(a, sizeof a, "%s/0", d), snprintf(b, sizeof b, "%s/1", d);
        for (int s = 1; s <= 2; s++)
            ASSERT_MSG(metric_of(a, s, "loss") == metric_of(b, s, "loss"), "%s: step %d loss differs", models[i][0], s);
        snprintf(a, sizeof a, "%s/0/g", d), snprintf(b, sizeof b, "%s/1/g", d);
        const char *wn;
        double gd = grad_diff(b, a, &wn);
        ASSERT_MSG(gd == 0, "%s: the gradient of %s differs from the step path's by %.3g", models[i][0], wn, gd);
        printf("     %-12s \"layer\" = \"step\" bit for bit\n", models[i][0]);
    }
}
