// test_parallel_train.c — training features under several CPU ranks (mpirun through scripts/launch.sh):
// validation losses and the Muon optimizer's steps equal one process's, on CPU ranks and on fake GPUs.
#include "test.h"

// 3 layers (the middle one dense), 8 experts top-3, load balancing on; validation every 2 steps.
static const char *make_layout_run(void) {
    static char d[256];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    char out[8192];
    ASSERT(
        run_cmd(
            out, sizeof out,
            "echo '{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 3, "
            "\"num_attention_heads\": 4,"
            " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 8, "
            "\"num_experts_per_tok\": 3,"
            " \"moe_intermediate_size\": 16, \"intermediate_size\": 24, \"mlp_only_layers\": [1]}' > %s/model.json && "
            "%s synth --output %s/data.bin --vocab 64 --tokens 20000 && %s synth --output %s/val.bin --vocab 64 "
            "--tokens 2000 --seed 9 && "
            "echo '{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 16, "
            "\"micro_batch_size\": 2,"
            " \"global_batch_size\": 8, \"max_steps\": 6, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01},"
            " \"moe_load_balance_coef\": 0.01, \"parallel\": {\"timeout_s\": 60},"
            " \"validation\": {\"dataset\": \"val.bin\", \"interval\": 2, \"batches\": 2}}' > %s/train.json",
            d, PITH_BIN, d, PITH_BIN, d, d) == 0);
    return d;
}

// The value of `key` at `step` of run folder dir (which must have it).
static double metric_of(const char *dir, int step, const char *key) {
    double v = run_metric(dir, step, key);
    ASSERT_MSG(!isnan(v), "step %d of %s: no %s", step, dir, key);
    return v;
}

// Runs the config under each layout and compares loss and val_loss of every step with one process.
static void check_layouts(const char *d, const char *sets) {
    static const struct {
        const char *name;
        int np;
        const char *sets;
        bool fake_gpu; // build-fake/pith: device tensors in host memory, NCCL over MPI (tests/fake/)
    } layouts[] = {
        {"ep2", 2, "--set parallel.expert_parallel_size=2", false},
        {"ep2-dp2", 4, "--set parallel.expert_parallel_size=2", false},
        {"hsdp-dp2", 2, "--set parallel.sharding_strategy=hsdp", false},
        {"gpu-ep2-dp2", 4, "--set parallel.expert_parallel_size=2 --set device=cuda --set compute_dtype=fp32", true},
    };
    char out[1 << 16], one[300], dir[300];
    snprintf(one, sizeof one, "%s/one", d);
    ASSERT_MSG(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s", PITH_BIN, d, sets, one) == 0,
               "%s", out);
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        snprintf(dir, sizeof dir, "%s/%s", d, layouts[i].name);
        int rc =
            run_cmd(out, sizeof out, "PITH=%s scripts/launch.sh -n %d %s/train.json %s %s --set run_dir=%s",
                    layouts[i].fake_gpu ? "build-fake/pith" : PITH_BIN, layouts[i].np, d, sets, layouts[i].sets, dir);
        ASSERT_MSG(rc == 0, "%s: %s", layouts[i].name, out);
        double worst = 0;
        for (int s = 1; s <= 6; s++) {
            double l = metric_of(dir, s, "loss"), r = metric_of(one, s, "loss");
            worst = fmax(worst, fabs(l - r) / r);
            ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "%s: step %d loss %.9g vs one process %.9g", layouts[i].name, s, l, r);
            if (s % 2) continue;
            double v = metric_of(dir, s, "val_loss"), rv = metric_of(one, s, "val_loss");
            worst = fmax(worst, fabs(v - rv) / rv);
            ASSERT_MSG(fabs(v - rv) <= 1e-5 * rv, "%s: step %d val_loss %.9g vs one process %.9g", layouts[i].name, s,
                       v, rv);
        }
        printf("     %-11s %s: loss and val_loss within %.1e of one process\n", layouts[i].name,
               strstr(sets, "muon") ? "muon" : "adamw", worst);
    }
}

TEST(dist_validation_layouts) { check_layouts(make_layout_run(), ""); }

// Muon under every layout equals one process; a Muon checkpoint from ep2×dp2 resumes on one process with
// the uninterrupted run's losses (the momentum buffers reshard like AdamW's moments).
TEST(dist_muon_layouts_and_reshard) {
    const char *d = make_layout_run();
    const char *muon = "--set optimizer.type=muon --set optimizer.lr=0.02";
    check_layouts(d, muon);
    char out[1 << 16], dir[300], one[300];
    ASSERT(run_cmd(out, sizeof out,
                   "PITH=%s scripts/launch.sh -n 4 %s/train.json %s --set parallel.expert_parallel_size=2 "
                   "--set save_location=%s/ck --steps 3 && %s train %s/train.json %s --set save_location=%s/ck",
                   PITH_BIN, d, muon, d, PITH_BIN, d, muon, d) == 0);
    ASSERT_MSG(strstr(out, "resume: step 3"), "%s", out);
    snprintf(dir, sizeof dir, "%s/ck", d), snprintf(one, sizeof one, "%s/one", d);
    for (int s = 4; s <= 6; s++) {
        double l = metric_of(dir, s, "loss"), r = metric_of(one, s, "loss");
        ASSERT_MSG(fabs(l - r) <= 1e-5 * r, "step %d: resumed on one process %.9g vs uninterrupted %.9g", s, l, r);
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
