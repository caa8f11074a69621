// test_train.c — the trainer end to end: overfitting, determinism, epochs, schedules, and every kind of
// bad input (config, data, model config, command line) by message and exit code.
#include <limits.h>

#include "base/npy.h"
#include "test.h"
#include "train/trainer.h"

static const char *tiny_model =
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 16, \"norm_topk_prob\": true, \"rope_theta\": 10000.0}";

// A run folder with model.json, data/a.bin (synthetic tokens) and train.json (10 steps, GBS 4 of 16 tokens).
static const char *make_run(int ntokens) {
    const char *dir = test_tmpdir();
    static char d[256];
    snprintf(d, sizeof d, "%s", dir);
    write_text(d, "model.json", tiny_model);
    char out[4096];
    ASSERT(run_cmd(out, sizeof out, "mkdir -p %s/data && %s synth --output %s/data/a.bin --vocab 64 --tokens %d", d,
                   PITH_BIN, d, ntokens) == 0);
    write_text(d, "train.json",
               "{\"model\": \"model.json\", \"dataset\": \"data\", \"sequence_length\": 16, \"micro_batch_size\": 2,"
               " \"global_batch_size\": 4, \"max_steps\": 10, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01, "
               "\"betas\": [0.9, 0.95]}}");
    return d;
}

// A Run holds pointers into itself (the engine points at its model): set it up in place, never copy it.
static void setup_run(Run *r, const char *dir, char **sets, int nsets) {
    char path[512];
    snprintf(path, sizeof path, "%s/train.json", dir);
    TrainConfig c;
    config_load(&c, path, sets, nsets);
    run_setup(r, &c, true);
}

TEST(train_overfits_tiny_batch) {
    // 65 tokens = 4 samples of 16: every step sees the same global batch of 4.
    const char *d = make_run(65);
    char *sets[] = {"max_steps=100"};
    static Run r;
    setup_run(&r, d, sets, 1);
    double first = 0, last = 0;
    for (int s = 0; s < 100; s++) {
        StepStats st = run_step(&r);
        ASSERT(isfinite(st.loss) && isfinite(st.grad_norm));
        if (s == 0) first = st.loss;
        last = st.loss;
    }
    printf("     overfit: loss %.4f -> %.4f in 100 steps\n", first, last);
    ASSERT_NEAR(first, log(64.0), 0.3); // starts near uniform over the vocabulary
    ASSERT_MSG(last < 0.1 * first, "loss %.4f is not below 10%% of the initial %.4f", last, first);
    run_free(&r);
}

TEST(train_cli_loss_falls_and_is_deterministic) {
    const char *d = make_run(20000);
    char out[65536], a[8192], b[8192],
        args[256] = "--set max_steps=30 --set moe_load_balance_coef=0.01 --set scheduler.type=wsd --set "
                    "scheduler.warmup_ratio=0.1";
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/r1", PITH_BIN, d, args, d) == 0);
    ASSERT(strstr(out, "step 00000030/00000030 | loss"));
    ASSERT(strstr(out, "| lb "));
    ASSERT(!strstr(out, "deterministic:"));
    // deterministic: true selects nothing on the CPU (it says so): the second run is the same either way
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/r2 --set deterministic=true", PITH_BIN,
                   d, args, d) == 0);
    ASSERT_MSG(strstr(out, "\ndeterministic: nothing to select on the CPU"), "%s", out);
    // Same seed, same data: identical losses, learning rates and grad norms (timings aside).
    ASSERT(run_cmd(a, sizeof a, "sed 's/, \"tokens_per_s.*//' %s/r1/metrics.jsonl", d) == 0);
    ASSERT(run_cmd(b, sizeof b, "sed 's/, \"tokens_per_s.*//' %s/r2/metrics.jsonl", d) == 0);
    ASSERT(!strcmp(a, b));
    double l1, l30;
    ASSERT(sscanf(strstr(a, "\"loss\": "), "\"loss\": %lf", &l1) == 1);
    ASSERT(sscanf(strstr(a, "\"step\": 30, \"loss\": ") + 12, "\"loss\": %lf", &l30) == 1);
    ASSERT_MSG(l30 < l1 - 1.0, "loss did not fall: %.4f -> %.4f", l1, l30);
    ASSERT(strstr(a, "\"grad_norm\"") && strstr(a, "\"lr\"") && strstr(b, "\"step\": 1,"));
}

// pith train waits passively in OpenMP unless told otherwise (spinning threads starve a shared machine).
TEST(train_cpu_threading_defaults) {
    const char *d = make_run(1000);
    char out[16384];
    ASSERT(run_cmd(out, sizeof out,
                   "env -u OMP_WAIT_POLICY %s train %s/train.json --set max_steps=1 --set run_dir=%s/r", PITH_BIN, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, "OMP_WAIT_POLICY=PASSIVE"), "%s", out);
    ASSERT(run_cmd(out, sizeof out,
                   "OMP_WAIT_POLICY=active %s train %s/train.json --set max_steps=1 --set run_dir=%s/r2", PITH_BIN, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, "OMP_WAIT_POLICY=active"), "%s", out);
}

// After its restart with passive waiting the process is still called pith (ps, top, pgrep), not "exe".
TEST(train_process_is_named_pith) {
    const char *d = make_run(1000);
    char out[16384];
    run_cmd(out, sizeof out, // (the exit status is kill's)
            "env -u OMP_WAIT_POLICY %s train %s/train.json --set max_steps=100000 --set run_dir=%s/r >/dev/null 2>&1 "
            "& p=$!; for i in $(seq 600); do grep -qz OMP_WAIT_POLICY=PASSIVE /proc/$p/environ 2>/dev/null && break; "
            "sleep 0.05; done; cat /proc/$p/comm; kill $p; wait $p 2>/dev/null",
            PITH_BIN, d, d);
    ASSERT_MSG(!strcmp(out, "pith\n"), "the restarted process is called '%s'", out);
}

TEST(train_continues_into_new_epochs) {
    // 4 samples per epoch, 4 per step, 3 steps: epochs 1 and 2 begin with fresh permutations.
    const char *d = make_run(65);
    char out[16384];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set max_steps=3 --set run_dir=%s/r", PITH_BIN, d, d) ==
           0);
    ASSERT(strstr(out, "data: epoch 1 begins") && strstr(out, "data: epoch 2 begins"));
}

TEST(data_samples_and_permutation) {
    const char *d = make_run(1000);
    char path[512];
    snprintf(path, sizeof path, "%s/data", d);
    Dataset ds;
    dataset_open(&ds, path, 16, 64, 3);
    ASSERT(ds.total == (1000 - 1) / 16);
    int32_t tok[16], lab[16];
    int *seen = xcalloc(ds.total, sizeof(int));
    for (int64_t i = 0; i < ds.total; i++) { // one epoch visits every sample exactly once
        dataset_sample(&ds, i, tok, lab);
        int64_t p = ds.perm[i];
        seen[p]++;
        const uint32_t *raw = ds.files[0].tokens;
        for (int t = 0; t < 16; t++)
            ASSERT(tok[t] == (int32_t)raw[p * 16 + t] && lab[t] == (int32_t)raw[p * 16 + t + 1]);
    }
    for (int64_t i = 0; i < ds.total; i++) ASSERT(seen[i] == 1);
    dataset_sample(&ds, ds.total, tok, lab); // epoch 1: a different permutation
    bool differs = false;
    for (int64_t i = 0; i < ds.total; i++) differs |= ds.perm[i] != i;
    ASSERT(differs && ds.epoch == 1);
    dataset_close(&ds);
}

TEST(schedule_wsd_values) {
    TrainConfig c = {0};
    c.max_steps = 100, c.optimizer.lr = 1.0;
    c.scheduler.type = SCHED_WSD, c.scheduler.decay_shape = DECAY_COSINE;
    c.scheduler.warmup_ratio = 0.1, c.scheduler.decay_ratio = 0.2, c.scheduler.start_lr = 0.0,
    c.scheduler.final_lr = 0.1;
    ASSERT_NEAR(config_lr_factor(&c, 0), 0.0, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 5), 0.5, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 50), 1.0, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 90), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.5)), 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 100), 0.1, 1e-12);
    c.scheduler.decay_shape = DECAY_LINEAR;
    ASSERT_NEAR(config_lr_factor(&c, 90), 1 + (0.1 - 1) * 0.5, 1e-12);
    c.scheduler.type = SCHED_CONSTANT;
    ASSERT_NEAR(config_lr_factor(&c, 3), 1.0, 1e-12);
    // cosine: warmup, then a cosine decay over every remaining step (wsd with decay_ratio = 1 − warmup_ratio)
    c.scheduler.type = SCHED_COSINE, c.scheduler.decay_shape = DECAY_COSINE;
    ASSERT_NEAR(config_lr_factor(&c, 5), 0.5, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 10), 1.0, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 55), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.5)), 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 100), 0.1, 1e-12);
}

// ---- bad input: one line naming the file and key, exit status 1 ----

static void expect_error(const char *dir, const char *args, const char *needle) {
    char out[8192];
    int rc = run_cmd(out, sizeof out, "%s train %s/train.json %s", PITH_BIN, dir, args);
    ASSERT_MSG(rc == 1, "exit status %d for '%s': %s", rc, args, out);
    ASSERT_MSG(strstr(out, needle), "expected '%s' in: %s", needle, out);
    ASSERT_MSG(strstr(out, "pith: error: ") == out, "not a one-line error: %s", out);
    ASSERT_MSG(strchr(out, '\n') == out + strlen(out) - 1, "more than one line: %s", out);
}

TEST(errors_config) {
    const char *d = make_run(1000);
    expect_error(d, "--set sequence_length=\\\"long\\\"", "--set: sequence_length: expected an integer");
    expect_error(d, "--set micro_batch_size=0", "--set: micro_batch_size: must be in [1, 1048576] (got 0)");
    expect_error(d, "--set global_batch_size=5", "--set: global_batch_size: must be a multiple of micro_batch_size");
    expect_error(d, "--set learning_rate=3", "--set: learning_rate: unknown key");
    expect_error(d, "--set optimizer.nesterov=true", "--set: optimizer.nesterov: unknown key");
    expect_error(d, "--set optimizer.momentum=3", "--set: optimizer.momentum: must be in [0, 1) (got 3)");
    expect_error(d, "--set optimizer.type=sgd",
                 "--set: optimizer.type: 'sgd' is not supported (supported: \"adamw\", \"muon\")");
    expect_error(d, "--set optimizer.betas=[0.9]", "--set: optimizer.betas: expected [beta1, beta2]");
    expect_error(d, "--set scheduler.type=step",
                 "--set: scheduler.type: 'step' is not supported (supported: \"constant\"");
    expect_error(d, "--set device=tpu", "--set: device: 'tpu' is not supported");
    expect_error(d, "--set max_steps=null", "--set: max_steps: missing required key");
    expect_error(d, "--set dataset=/nonexistent/x", "/nonexistent/x: dataset not found");
    expect_error(d, "--bogus", "train: unknown option '--bogus' (see");
    // a near miss gets a suggestion
    expect_error(d, "--step 3", "train: unknown option '--step' (did you mean --steps?)");
    expect_error(d, "--set max_step=3", "--set: max_step: unknown key (did you mean max_steps?)");
    expect_error(d, "--set model.num_hidden_layers=1",
                 "'model' is a value, not a section, so it has no keys (model is the path of the model's config.json");
    expect_error(d, "--set optimizer.learning_rate=1",
                 "optimizer.learning_rate: unknown key (did you mean optimizer.lr?)");
    expect_error(d, "--set parallel.expert_parallel_size=2", "parallel");
    expect_error(d, "--steps 4294967297", "train: --steps needs an integer in [1, 1073741824] (got '4294967297')");
    // An error in the file names the file; one from the command line names --set.
    write_text(d, "t2.json",
               "{\"model\": \"model.json\", \"dataset\": \"data\", \"sequence_length\": 16, \"micro_batch_size\": 0,"
               " \"global_batch_size\": 4, \"max_steps\": 10, \"optimizer\": {\"lr\": 0.01}}");
    char out[4096];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/t2.json", PITH_BIN, d) == 1);
    ASSERT_MSG(strstr(out, "t2.json: micro_batch_size: must be in [1, 1048576]"), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "echo '{\"model\": ' > %s/bad.json && %s train %s/bad.json", d, PITH_BIN, d) == 1);
    ASSERT(strstr(out, "bad.json:") && strstr(out, "invalid JSON"));
}

// Every value outside its range, read once into its real range: a one-line error naming the key.
TEST(errors_config_values) {
    const char *d = make_run(1000);
    expect_error(d, "--set optimizer.eps=0", "--set: optimizer.eps: must be in (0, 1] (got 0)");
    expect_error(d, "--set optimizer.eps=-1e-8", "optimizer.eps: must be in (0, 1]");
    expect_error(d, "--set optimizer.weight_decay=1.5", "optimizer.weight_decay: must be in [0, 1] (got 1.5)");
    expect_error(d, "--set optimizer.weight_decay=-0.1", "optimizer.weight_decay: must be in [0, 1]");
    expect_error(d, "--set optimizer.lr=-1", "optimizer.lr: must be in ≥ 0 (got -1)");
    expect_error(d, "--set optimizer.betas=[0.9,1.0]", "optimizer.betas: each beta must be in [0, 1)");
    expect_error(d, "--set scheduler.type=wsd --set scheduler.start_lr=-1", "scheduler.start_lr: must be in ≥ 0");
    expect_error(d, "--set scheduler.type=wsd --set scheduler.final_lr=-0.001", "scheduler.final_lr: must be in ≥ 0");
    expect_error(d, "--set scheduler.type=wsd --set scheduler.warmup_ratio=0.6 --set scheduler.decay_ratio=0.5",
                 "warmup_ratio + decay_ratio must be at most 1");
    expect_error(d, "--set scheduler.warmup_ratio=0.1",
                 "scheduler.warmup_ratio: has no effect on a \"constant\" schedule");
    expect_error(d, "--set scheduler.type=cosine --set scheduler.decay_ratio=0.3",
                 "scheduler.decay_ratio: a \"cosine\" schedule decays");
    expect_error(d, "--set init_std=100", "init_std: must be in [0, 1] (got 100)");
    expect_error(d, "--set clip_grad_norm=-1", "clip_grad_norm: must be in ≥ 0");
    expect_error(d, "--set parallel.timeout_s=0", "parallel.timeout_s: must be in (0, 10000000]");
    expect_error(d, "--set seed=-1", "seed: must be a non-negative integer");
    // integers are never truncated: 2^32 + 1 is not 1, 2^32 + 16 is not 16
    expect_error(d, "--set max_steps=4294967297", "max_steps: must be in [1, 1073741824] (got 4294967297)");
    expect_error(d, "--set sequence_length=4294967312", "sequence_length: must be in [1, 16777216] (got 4294967312)");
    expect_error(d, "--set max_steps=1e30", "max_steps: expected an integer");
    expect_error(d, "--set micro_batch_size=1048576 --set global_batch_size=1048576 --set sequence_length=4096",
                 "micro_batch_size × sequence_length = 4294967296 tokens");
    expect_error(d, "--set save_interval=5", "save_interval: needs save_location");
    expect_error(d, "--set nonfinite_skip_limit=3", "--set: nonfinite_skip_limit: has no effect with on_nonfinite");
    expect_error(d, "--set optimizer.momentum=0.5", "--set: optimizer.momentum: has no effect with optimizer.type");
    expect_error(d, "--set benchmark=true --set moe_router_bias_update_rate=0.01",
                 "--set: moe_router_bias_update_rate: has no effect with benchmark = true");
    // cuda_graph records one GPU's layers: not what waits for the host or other ranks there, not on the CPU
    expect_error(d, "--set cuda_graph=true --set parallel.pipeline_schedule=true",
                 "--set: cuda_graph: cannot be used with pipeline_schedule");
    expect_error(d, "--set cuda_graph=true --set moe_load_balance_coef=0.01 --set moe_load_balance_type=global-batch",
                 "cuda_graph: cannot be used with moe_load_balance_type \"global-batch\"");
    expect_error(d, "--set cuda_graph=true --set device=cpu", "cuda_graph: cannot be used with device \"cpu\"");
    if (!ops_cuda_available())
        expect_error(d, "--set cuda_graph=true --set device=auto",
                     "cuda_graph: records one GPU's forward and backward; this run has no GPU");
    expect_error(d, "--set moe_load_balance_coef=0 --set moe_load_balance_type=sequence",
                 "--set: moe_load_balance_type: has no effect with moe_load_balance_coef 0");
    expect_error(d, "--set on_nonfinite=skip --set nonfinite_skip_limit=0",
                 "--set: nonfinite_skip_limit: must be in [1, 1073741824] (got 0)");
    // PithTrain's names say what they are called here, or that they are not supported yet
    expect_error(d, "--set lr=3", "--set: lr: unknown key (renamed: PithTrain's lr is optimizer.lr here)");
    expect_error(d, "--set distributed.expert_parallel_size=2",
                 "distributed: unknown key (renamed: PithTrain's distributed is parallel here)");
    expect_error(d, "--set nsys_start=3", "--set: nsys_start: PithTrain's nsys_start is not supported yet");
}

// docs/usage.md's table of keys is what `pith train --config-table` prints from the key tables.
TEST(config_table_matches_docs) {
    size_t n;
    char *readme = file_read_all("docs/usage.md", &n), out[65536];
    ASSERT(readme);
    ASSERT(run_cmd(out, sizeof out, "%s train --config-table", PITH_BIN) == 0);
    const char *begin = strstr(readme, "<!-- config-table: "), *end = strstr(readme, "<!-- config-table end -->");
    ASSERT(begin && end && strchr(begin, '\n') < end);
    begin = strchr(begin, '\n') + 1;
    ASSERT_MSG((size_t)(end - begin) == strlen(out) && !memcmp(begin, out, end - begin),
               "docs/usage.md's config table differs from `build/pith train --config-table`: regenerate it");
    free(readme);
}

// The README's layout block names every source file of src/ (a file of ops/cpu or ops/cuda by name or as cpu/*.c,
// cuda/*.cu), and every x.c it names exists: no stale file list.
TEST(readme_layout_matches_tree) {
    size_t n;
    char *readme = file_read_all("README.md", &n), out[1 << 16];
    ASSERT(readme);
    char *block = strstr(readme, "\nsrc/app/"), *end = block ? strstr(block, "```") : NULL;
    ASSERT_MSG(block && end, "README.md has no layout block");
    *end = 0;
    ASSERT(run_cmd(out, sizeof out, "cd src && ls */*.c */*/*.c */*/*.cu") == 0);
    for (char *f = strtok(out, "\n"); f; f = strtok(NULL, "\n")) {
        char folder[64], wild[64];
        const char *slash = strchr(f, '/'), *base = strrchr(f, '/') + 1;
        snprintf(folder, sizeof folder, "src/%.*s", (int)(slash - f + 1), f);
        snprintf(wild, sizeof wild, "%.*s*%s", (int)(base - slash - 1), slash + 1, strrchr(base, '.'));
        ASSERT_MSG(strstr(block, folder), "README.md's layout has no line for %s", folder);
        ASSERT_MSG(strstr(block, base) || (base != slash + 1 && strstr(block, wild)),
                   "README.md's layout does not name src/%s", f);
    }
    for (char *w = strtok(block, " ,\n"); w; w = strtok(NULL, " ,\n")) { // every x.c it names exists
        size_t len = strlen(w);
        if (len < 3 || strcmp(w + len - 2, ".c") || strchr(w, '*')) continue;
        ASSERT_MSG(run_cmd(out, sizeof out, "ls src/*/%s", w) == 0, "README.md's layout names %s, not in src/", w);
    }
    free(readme);
}

// --print-config: every key with its default, as JSON that config_load reads back to the same values (bit for
// bit), under each schedule, from any folder (paths absolute); reals print as the shortest decimal that reads back
// exactly (0.1, not 0.10000000000000001; 900.0, not 9e+02), and a value that needs 17 digits gets them.
TEST(config_print_effective) {
    const char *d = make_run(1000);
    char out[16384], path[512];
    char rd[300];
    snprintf(rd, sizeof rd, "run_dir=%s/r", d); // (the default run_dir is relative to the current folder)
    const char *schedules[] = {"constant", "cosine", "wsd"};
    for (int i = 0; i < 3; i++) {
        char sch[64];
        snprintf(sch, sizeof sch, "scheduler.type=%s", schedules[i]);
        ASSERT(run_cmd(out, sizeof out,
                       "%s train %s/train.json --print-config --set %s --set %s --set optimizer.lr=0.30000000000000004",
                       PITH_BIN, d, sch, rd) == 0);
        ASSERT_MSG(strstr(out, "\"weight_decay\": 0.1,") && strstr(out, "\"eps\": 1e-08,") &&
                       strstr(out, "\"init_std\": 0.02,") && strstr(out, "\"lr\": 0.30000000000000004,") &&
                       strstr(out, "\"clip_grad_norm\": 1.0,") && strstr(out, "\"on_nonfinite\": \"fail\"") &&
                       strstr(out, "\"timeout_s\": 900.0,") && !strstr(out, "e+"),
                   "%s", out);
        ASSERT(i != 1 || strstr(out, "\"decay_ratio\": 1.0"));
        if (i == 0) { // the default run_dir of a config in the current folder is named after that folder, absolute
            char cmd[4096], want[300], bin[PATH_MAX];
            ASSERT(realpath(PITH_BIN, bin));
            ASSERT(run_cmd(cmd, sizeof cmd, "cd %s && %s train train.json --print-config", d, bin) == 0);
            snprintf(want, sizeof want, "\"run_dir\": \"%s/runs/%s-train\"", d, strrchr(d, '/') + 1);
            ASSERT_MSG(strstr(cmd, want), "no %s in %s", want, cmd);
        }
        snprintf(path, sizeof path, "%s/effective.json", d);
        FILE *f = fopen(path, "w");
        CHECK(f);
        fputs(out, f), fclose(f);
        TrainConfig a, b;
        char *sets[] = {sch, rd, "optimizer.lr=0.30000000000000004"};
        snprintf(path, sizeof path, "%s/train.json", d);
        config_load(&a, path, sets, 3);
        json_t *ea = config_effective(&a);
        snprintf(path, sizeof path, "%s/effective.json", d);
        config_load(&b, path, NULL, 0);
        json_t *eb = config_effective(&b);
        char *ta = json_dumps(ea, JSON_SORT_KEYS), *tb = json_dumps(eb, JSON_SORT_KEYS); // 17 digits: exact
        ASSERT_MSG(!strcmp(ta, tb), "%s\nvs\n%s", ta, tb);
        free(ta), free(tb);
        json_decref(ea), json_decref(eb), json_decref(a.json), json_decref(b.json);
    }
}

// json_text writes every double as the shortest decimal that reads back bit for bit, and json_f32 makes an
// fp32 value print in at most 9 significant digits and read back exactly through a (float) cast.
TEST(config_reals_round_trip) {
    static const double fixed[] = {0.1,
                                   0.2,
                                   0.1 + 0.2,
                                   1e-8,
                                   3e-4,
                                   1.0,
                                   -0.0,
                                   1e300,
                                   5e-324,
                                   2.2250738585072014e-308,
                                   1.7976931348623157e308,
                                   123456789012345678.0,
                                   0.02,
                                   -7.5};
    json_t *a = json_array();
    for (int i = 0; i < 14; i++) json_array_append_new(a, json_real(fixed[i]));
    Rng rng = rng_seeded(77, 1);
    double want[1014];
    memcpy(want, fixed, sizeof fixed);
    for (int i = 14; i < 1014; i++) {
        uint64_t bits;
        double v;
        do bits = rng_next(&rng), memcpy(&v, &bits, 8);
        while (!isfinite(v));
        want[i] = v, json_array_append_new(a, json_real(v));
    }
    char *text = json_text(a, 0, false);
    ASSERT(!strncmp(text, "[0.1, 0.2, 0.30000000000000004, 1e-08, 0.0003, 1.0, -0.0, 1e+300, 5e-324, ", 74));
    json_t *back = json_loads(text, 0, NULL);
    ASSERT(back && json_array_size(back) == 1014);
    for (int i = 0; i < 1014; i++) {
        json_t *v = json_array_get(back, i);
        double x = json_real_value(v);
        ASSERT_MSG(json_is_real(v) && !memcmp(&x, &want[i], 8), "value %d: %.17g read back as %.17g", i, want[i], x);
    }
    free(text), json_decref(a), json_decref(back);
    for (int i = 0; i < 1000; i++) {
        float f = i ? (float)(rng_normal(5, 2, i) * pow(10, (int)rng_below(&rng, 60) - 30)) : 0.1f;
        char buf[32];
        json_real_text(buf, json_f32(f));
        int digits = 0; // significant: from the first non-zero digit
        for (const char *p = buf; *p && *p != 'e'; p++) digits += (digits || (*p >= '1' && *p <= '9')) && *p != '.';
        ASSERT_MSG((float)strtod(buf, NULL) == f && digits <= 9, "%.9g printed as %s", f, buf);
        if (!i) ASSERT(!strcmp(buf, "0.1"));
    }
}

// on_nonfinite = skip with lr = 1e6: the run diverges and stays diverged (skipped updates leave the huge weights as
// they are), so it stops after nonfinite_skip_limit skips in a row instead of skipping its way to "done".
TEST(nonfinite_skip_limit_stops_a_diverged_run) {
    const char *d = make_run(20000);
    char out[1 << 16];
    int rc = run_cmd(out, sizeof out,
                     "%s train %s/train.json --set optimizer.lr=1e6 --set max_steps=200 --set on_nonfinite=skip "
                     "--set nonfinite_skip_limit=3 --set run_dir=%s/r 2>&1",
                     PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && !strstr(out, "done:"), "exit %d: %s", rc, out);
    const char *e = strstr(out, "pith: error: step ");
    int at = 0, from = 0, to = 0;
    ASSERT_MSG(e && sscanf(e, "pith: error: step %d:", &at) == 1, "%s", out);
    const char *in = strstr(e, "steps ");
    ASSERT_MSG(in && sscanf(in, "steps %d to %d in a row", &from, &to) == 2 && to == at && from == at - 3 &&
                   strstr(e, "more than nonfinite_skip_limit = 3"),
               "%s", e);
    // the three steps before it were skipped, each with its warning, and the step before those was finite (or 0)
    for (int s = from; s < at; s++) {
        char w[96];
        snprintf(w, sizeof w, "pith: warning: step %d: the ", s);
        ASSERT_MSG(strstr(out, w), "no skip warning for step %d: %s", s, out);
    }
    char w[96];
    snprintf(w, sizeof w, "pith: warning: step %d: the ", from - 1);
    ASSERT(!strstr(out, w));
    printf("     lr 1e6, skip: stopped at step %d after steps %d..%d\n", at, from, to);
}

// SIGTERM under mpirun with 2 CPU ranks: the signal reaches one rank only (srun and SLURM deliver it to every
// rank; one is the hard case), the flags are summed, so both ranks checkpoint the same step and stop with exit
// status 0; SIGUSR1, which mpirun forwards to every rank, checkpoints and goes on.
TEST(signals_checkpoint_under_mpirun) {
    const char *d = make_run(20000);
    char out[1 << 16];
    int rc =
        run_cmd(out, sizeof out,
                "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "
                "mpirun --oversubscribe --bind-to none -np 2 %s train %s/train.json --set max_steps=1000000 "
                "--set save_location=%s/ck > %s/a.log 2>&1 & p=$!; "
                "until grep -qs '^step ' %s/a.log || ! kill -0 $p 2>/dev/null; do sleep 0.05; done; kill -USR1 $p; "
                "until grep -qs '^signal: SIGUSR1' %s/a.log || ! kill -0 $p 2>/dev/null; do sleep 0.05; done; "
                "kill -TERM $(pgrep -P $p | tail -1); wait $p; rc=$?; cat %s/a.log; exit $rc",
                PITH_BIN, d, d, d, d, d, d);
    ASSERT_MSG(rc == 0 && strstr(out, "mesh: 2 ranks") && strstr(out, "stopped by SIGTERM"), "exit %d: %s", rc, out);
    int s1 = 0, s2 = 0;
    ASSERT(sscanf(strstr(out, "signal: SIGUSR1 after step "), "signal: SIGUSR1 after step %d", &s1) == 1);
    ASSERT(sscanf(strstr(out, "signal: SIGTERM after step "), "signal: SIGTERM after step %d", &s2) == 1 && s2 > s1);
    ASSERT(!strstr(out, "pith: error"));
    for (int i = 0; i < 2; i++) { // each a whole checkpoint: run.json and both ranks' model files
        char ck[700];
        snprintf(ck, sizeof ck,
                 "test -e %s/ck/step-%08d/run.json && ls %s/ck/step-%08d | grep -c '^model-0000[12]-of-00002'", d,
                 i ? s2 : s1, d, i ? s2 : s1);
        ASSERT(run_cmd(out, sizeof out, "%s", ck) == 0 && atoi(out) == 2);
    }
}

static double eval_loss(const char *out) {
    const char *p = strstr(out, "\nloss ");
    ASSERT_MSG(p, "no loss line in: %s", out);
    return strtod(p + 6, NULL);
}

// pith eval: micro-batches of any size give the same loss (a short last one is filled with ignored rows), a
// save_location means its newest checkpoint (read only: a save in progress is left alone), --device auto picks
// the GPU when there is one, and bad arguments are one-line errors.
TEST(eval_micro_batches_save_location_device_auto) {
    const char *d = make_run(2000);
    char out[1 << 16], path[600];
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set max_steps=4 --set save_location=%s/ck --set "
                   "save_interval=2",
                   PITH_BIN, d, d) == 0);
    snprintf(path, sizeof path, "%s/ck/.tmp-step-00000006", d);
    mkdir_p(path); // as if a run were saving step 6 right now
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s/ck --data %s/data --seq 16 --batch 7", PITH_BIN, d, d) == 0);
    ASSERT_MSG(strstr(out, "is a save_location; its newest checkpoint is ") && strstr(out, "/ck/step-00000004\n"), "%s",
               out);
    ASSERT_MSG(strstr(out, "eval: 7 samples of 16 tokens (112 targets) in 1 micro-batch of 7 on ") &&
                   strstr(out, ops_cuda_available() ? " on cuda (fp32)" : " on cpu (fp32)"),
               "%s", out);
    ASSERT(path_exists(path));
    double whole = eval_loss(out);
    for (int m = 1; m <= 4; m++) {
        ASSERT(run_cmd(out, sizeof out,
                       "%s eval --model %s/ck/step-00000004 --data %s/data --seq 16 --batch 7 "
                       "--micro-batch %d --device cpu",
                       PITH_BIN, d, d, m) == 0);
        ASSERT_MSG(fabs(eval_loss(out) - whole) <= 1e-6 * whole, "micro-batch %d: %.9g vs %.9g", m, eval_loss(out),
                   whole);
    }
    ASSERT(strstr(out, "in 2 micro-batches of 4 on cpu"));
    // the loss of the step-2 weights differs: the save_location did resolve to step 4
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s/ck/step-00000002 --data %s/data --seq 16 --batch 7", PITH_BIN,
                   d, d) == 0 &&
           eval_loss(out) != whole);
    static const struct {
        const char *args, *msg;
    } bad[] = {
        {"--model CK/step-00000004 --seq 4294967312 --batch 1",
         "eval: --seq needs an integer in [1, 16777216] (got '4294967312')"},
        {"--model CK/step-00000004 --seq 16 --batch 2x", "eval: --batch needs an integer"},
        {"--model CK/step-00000004 --seq 16 --batch 1000",
         "asks for more samples than the data holds (124 samples of 16 tokens)"},
        {"--model CK --seq 16 --batch 1 --device tpu", "eval: --device must be auto, cpu or cuda (got 'tpu')"},
        {"--model CK --seq 16 --batch 1 --device cpu --dtype bf16", "eval: --dtype bf16 needs the GPU"},
        {"--model CK/.. --seq 16 --batch 1", "no config.json and no checkpoints (step-N folders)"},
        {"--model CK --batch 1", "eval: --seq and --batch are required"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[512], *ck = strstr(bad[i].args, "CK");
        snprintf(args, sizeof args, "%.*s%s/ck%s", (int)(ck - bad[i].args), bad[i].args, d, ck + 2);
        int rc = run_cmd(out, sizeof out, "%s eval %s --data %s/data", PITH_BIN, args, d);
        ASSERT_MSG(rc == 1 && strstr(out, bad[i].msg) && strchr(out, '\n') == out + strlen(out) - 1,
                   "eval %s: exit %d: %s", args, rc, out);
    }
}

TEST(errors_model_config) {
    const char *d = make_run(1000);
    char out[4096];
    write_text(d, "m2.json", "{\"model_type\": \"llama\", \"hidden_size\": 8}");
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set model=%s/m2.json", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "m2.json: model_type: unsupported model type 'llama'"), "%s", out);
    write_text(d, "m3.json", "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8}");
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set model=%s/m3.json", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "m3.json: num_hidden_layers: missing required key"), "%s", out);
    write_text(
        d, "m4.json",
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
        " \"vocab_size\": 64, \"num_experts\": 4, \"num_experts_per_tok\": 5, \"moe_intermediate_size\": 4}");
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set model=%s/m4.json", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "m4.json: num_experts_per_tok: must be in [1, num_experts]"), "%s", out);
    write_text(
        d, "m5.json",
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
        " \"vocab_size\": 64, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 4,"
        " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}");
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set model=%s/m5.json", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "m5.json: rope_scaling.rope_type: 'yarn' is not supported"), "%s", out);
    // values read into their real range: never truncated, never silently nonsense
    static const struct {
        const char *key, *value, *msg;
    } bad[] = {
        {"hidden_size", "4294967328", "m6.json: hidden_size: must be in [1, 1073741824] (got 4294967328)"},
        {"vocab_size", "-64", "m6.json: vocab_size: must be in [1, 1073741824] (got -64)"},
        {"rms_norm_eps", "-1e-6", "m6.json: rms_norm_eps: must be in [0, 1)"},
        {"rope_theta", "0", "m6.json: rope_theta: must be above 1"},
        {"hidden_act", "\"gelu\"", "m6.json: hidden_act: 'gelu' is not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *m = json_loads(tiny_model, 0, NULL);
        json_object_set_new(m, bad[i].key, json_loads(bad[i].value, JSON_DECODE_ANY, NULL));
        char *text = json_dumps(m, 0);
        write_text(d, "m6.json", text);
        free(text), json_decref(m);
        ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set model=%s/m6.json", PITH_BIN, d, d) == 1);
        ASSERT_MSG(strstr(out, bad[i].msg), "%s: %s", bad[i].key, out);
    }
    // a sequence longer than max_position_embeddings trains, with a warning
    char text[1024];
    snprintf(text, sizeof text, "%.*s, \"max_position_embeddings\": 8}", (int)strlen(tiny_model) - 1, tiny_model);
    write_text(d, "m7.json", text);
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set model=%s/m7.json --set max_steps=1 --set run_dir=%s/r7", PITH_BIN, d,
                   d, d) == 0);
    ASSERT_MSG(strstr(out, "pith: warning: ") &&
                   strstr(out, "sequence_length 16 is above the model's max_position_embeddings 8"),
               "%s", out);
}

TEST(errors_token_files) {
    const char *d = make_run(1000);
    char out[4096];
    // truncated: cut the file in the middle of the token data
    ASSERT(run_cmd(out, sizeof out, "truncate -s 2000 %s/data/a.bin", d) == 0);
    expect_error(d, "", "a.bin: token record: truncated .npy data");
    // mis-typed: a well-formed .npy record of float32 "tokens"
    char path[512];
    snprintf(path, sizeof path, "%s/data/a.bin", d);
    FILE *f = fopen(path, "wb");
    CHECK(f);
    npy_write_header(f, DT_F32, 4);
    float x[4] = {1, 2, 3, 4};
    fwrite(x, sizeof x, 1, f);
    fclose(f);
    expect_error(d, "", "a.bin: token record: dtype F32, expected an unsigned integer type");
    // not a .npy file at all
    write_text(d, "data/a.bin", "hello world, this is not numpy");
    expect_error(d, "", "a.bin: token record: not a .npy record (bad magic)");
    // tokens beyond the model's vocabulary: found when the dataset is opened, before step 1
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/data/a.bin --vocab 1000 --tokens 1000", PITH_BIN, d) == 0);
    expect_error(d, "", "is outside the model's vocabulary of 64");
    // too short for one sample
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/data/a.bin --vocab 64 --tokens 10", PITH_BIN, d) == 0);
    expect_error(d, "", "hold no sample of sequence_length 16");
}

// A .bin of `n_tok` uint32 tokens (values i % 60) with the given document ends, then `extra` trailing bytes;
// with claim >= 0 the token header claims that many tokens instead.
static void write_bin(const char *path, int64_t n_tok, int64_t claim, const uint64_t *ends, int nends, int extra) {
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(npy_write_header(f, DT_U32, claim >= 0 ? claim : n_tok));
    for (int64_t i = 0; i < n_tok; i++) {
        uint32_t t = (uint32_t)(i % 60);
        fwrite(&t, 4, 1, f);
    }
    CHECK(npy_write_header(f, DT_U64, nends));
    fwrite(ends, 8, nends, f);
    for (int i = 0; i < extra; i++) fputc(0, f);
    CHECK(!fclose(f));
}

TEST(errors_token_files_structure) {
    const char *d = make_run(1000);
    char path[512], out[4096];
    snprintf(path, sizeof path, "%s/data/a.bin", d);
    // a 296-byte file whose header claims 2^62 tokens: the size check cannot overflow
    write_bin(path, 8, (int64_t)1 << 62, (uint64_t[]){8}, 1, 0);
    expect_error(d, "", "a.bin: token record: truncated .npy data");
    write_bin(path, 40, -1, (uint64_t[]){20, 10, 40}, 3, 0);
    expect_error(d, "", "a.bin: document-end record: end 1 is 10, not above the one before (20)");
    write_bin(path, 40, -1, (uint64_t[]){0, 40}, 2, 0);
    expect_error(d, "", "a.bin: document-end record: end 0 is 0");
    write_bin(path, 40, -1, (uint64_t[]){20, 40}, 2, 5);
    expect_error(d, "", "a.bin: 5 bytes after the document-end record");
    // a FIFO named *.bin would block open(): refused by its type
    ASSERT(run_cmd(out, sizeof out, "rm %s && mkfifo %s", path, path) == 0);
    expect_error(d, "", "a.bin: not a regular file");
}

// The token-id scan at open is cached per file by inode, size, mtime and ctime: a second open of unchanged data reads
// the cache; touching the file makes a new key and a fresh scan; a cached maximum that would be an error
// is checked by a scan (a forged or stale entry cannot stop a run).
TEST(dataset_token_scan_cache) {
    const char *d = make_run(1000);
    char out[8192], data[512], cache[512];
    snprintf(data, sizeof data, "%s/data", d), snprintf(cache, sizeof cache, "%s/cache", d);
    setenv("PITH_CACHE_DIR", cache, 1);
    Dataset ds;
    bool cached[3];
    for (int i = 0; i < 3; i++) {
        if (i == 2) ASSERT(run_cmd(out, sizeof out, "touch -d '2001-01-01' %s/a.bin", data) == 0);
        dataset_open(&ds, data, 16, 64, 1);
        cached[i] = ds.files[0].max_cached;
        dataset_close(&ds);
    }
    ASSERT(!cached[0] && cached[1] && !cached[2]);
    ASSERT(run_cmd(out, sizeof out, "ls %s | wc -l", cache) == 0 && atoi(out) == 2);
    ASSERT(run_cmd(out, sizeof out, "for f in %s/token-max-*; do echo 99 > $f; done", cache) == 0);
    dataset_open(&ds, data, 16, 64, 1);
    ASSERT(!ds.files[0].max_cached);
    dataset_close(&ds);
    unsetenv("PITH_CACHE_DIR");
}

TEST(cli_help_and_usage) {
    char out[8192];
    ASSERT(run_cmd(out, sizeof out, "%s --help", PITH_BIN) == 0 && strstr(out, "train") && strstr(out, "synth"));
    ASSERT(run_cmd(out, sizeof out, "%s train --help", PITH_BIN) == 0 && strstr(out, "--set key=value"));
    ASSERT(run_cmd(out, sizeof out, "%s frobnicate", PITH_BIN) == 2 && strstr(out, "unknown command 'frobnicate'\n"));
    ASSERT(run_cmd(out, sizeof out, "%s trian", PITH_BIN) == 2 &&
           strstr(out, "unknown command 'trian' (did you mean train?)"));
    ASSERT(run_cmd(out, sizeof out, "%s eval --modle x", PITH_BIN) == 2 && strstr(out, "did you mean --model?\n"));
    ASSERT(run_cmd(out, sizeof out, "%s --version", PITH_BIN) == 0 && !strncmp(out, "pith ", 5));
    ASSERT(run_cmd(out, sizeof out, "%s synth --output /proc/x/y.bin", PITH_BIN) == 1 &&
           strstr(out, "/proc/x: cannot create directory"));
    // synth creates the output's folders (the README's first command on a fresh clone)
    const char *d = test_tmpdir();
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/a/b/c.bin --tokens 100", PITH_BIN, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/x.bin --tokens 4294967297000", PITH_BIN, d) == 1 &&
           strstr(out, "synth: --tokens needs an integer in [2, 1099511627776] (got '4294967297000')"));
}

TEST(path_normalize_cases) {
    const char *cases[][2] = {{"a/./b/../c", "a/c"},
                              {"examples/demo/../../runs/demo", "runs/demo"},
                              {"../../x", "../../x"},
                              {"/a/../../b", "/b"},
                              {"./", "."},
                              {"a//b/", "a/b"},
                              {"a/..", "."}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s", cases[i][0]);
        path_normalize(p);
        ASSERT_MSG(!strcmp(p, cases[i][1]), "%s -> %s, expected %s", cases[i][0], p, cases[i][1]);
    }
}

// ---- optimizer.state_dtype: bf16 AdamW moments (tests/test_ops.c: the op; test_ckpt.c: resume; test_memory.c: the plan) ----

// bf16 moments against fp32 on tiny_run (6 steps, betas 0.9, 0.999). Step 1's update uses the fp32 values of the
// fresh moments, so step 2's loss is the same bits; later ones move. The moments are those of fp32 to ≤ 2^-8 relative
// an element (op_adamw_bf16_moments), v's error halved by its root, so each update is fp32's to ≤ 2^-7 of itself, and
// to first order the loss moves by that fraction of what the updates moved it: |ΔL_t| ≤ 2^-7·|L_t − L_1|.
TEST(train_state_dtype_bf16_loss) {
    const char *d = tiny_run("");
    char out[16384];
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/%s --set optimizer.state_dtype=%s",
                           PITH_BIN, d, d, i ? "bf16" : "fp32", i ? "bf16" : "fp32") == 0,
                   "%s", out);
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/fp32", d), snprintf(b, sizeof b, "%s/bf16", d);
    double l1 = run_metric(a, 1, "loss"), worst = 0;
    bool moved = false;
    for (int s = 1; s <= 6; s++) {
        double la = run_metric(a, s, "loss"), lb = run_metric(b, s, "loss");
        if (s <= 2) ASSERT_MSG(la == lb, "step %d: %.17g vs %.17g", s, lb, la);
        ASSERT_MSG(fabs(lb - la) <= ldexp(fabs(la - l1), -7), "step %d: loss %.9g with bf16 moments, %.9g with fp32", s,
                   lb, la);
        worst = fmax(worst, fabs(lb - la)), moved |= la != lb;
    }
    ASSERT_MSG(moved, "bf16 moments gave fp32's losses bit for bit: the option did nothing");
    printf("     6 steps: loss within %.2e of fp32 moments (loss moved %.3f)\n", worst,
           fabs(run_metric(a, 6, "loss") - l1));
}

// ---- gradient_dtype: bf16 expert gradient accumulators (test_memory.c: the plan; test_parallel_train.c: layouts) ----

// tiny_run with fp32 and bf16 expert gradients. Step 1's gradient (micro-batches of 2 × 16 tokens: N = 32 targets, a
// power of two, so the dump's 1/N scaling is exact):
// - one micro-batch a step: each expert element is written once, its fp32 sum rounded to nearest even, so the bf16
//   dump equals the fp32 dump rounded, bit for bit;
// - two: after the first the element holds rd(s1), after the second rd(rd(s1) + s2); each rounding is within 2^-8 of
//   what it rounds, so |rd(rd(s1) + s2) − (s1 + s2)| ≤ 2^-8·|s1 + s2| + 2^-8·(1 + 2^-8)·|s1|; s1 / N is half the
//   one-micro-batch run's dump f1 (N doubles), and fp32's own rounding of s1 + s2 (2^-24) fits in the 2^-7 slack.
// The losses over 6 steps at one micro-batch: step 1's is the same bits; each gradient element is fp32's to 2^-8
// relative, so (as for bf16 moments, train_state_dtype_bf16_loss) AdamW's update is fp32's to 2^-7 of itself (m to
// 2^-8, √v to 2^-8) and, to first order, |ΔL_t| ≤ 2^-7·|L_t − L_1|.
TEST(train_gradient_dtype_bf16) {
    const char *d = tiny_run("");
    char out[16384], a[300], b[300], c[300];
    static const char *const runs[][3] = {
        {"f1", "fp32", "2"}, {"b1", "bf16", "2"}, {"f2", "fp32", "4"}, {"b2", "bf16", "4"}};
    for (int i = 0; i < 4; i++)
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "%s train %s/train.json --set run_dir=%s/%s --set gradient_dtype=%s "
                           "--set global_batch_size=%s --dump-grads %s/%s/g",
                           PITH_BIN, d, d, runs[i][0], runs[i][1], runs[i][2], d, runs[i][0]) == 0,
                   "%s", out);
    int64_t moved1, moved2;
    snprintf(a, sizeof a, "%s/b1/g", d), snprintf(b, sizeof b, "%s/f1/g", d);
    grad_bf16_check(a, b, b, NULL, 1, 0, &moved1);
    snprintf(a, sizeof a, "%s/b2/g", d), snprintf(b, sizeof b, "%s/f2/g", d), snprintf(c, sizeof c, "%s/f1/g", d);
    double worst = grad_bf16_check(a, b, b, c, 1, 0, &moved2);
    ASSERT_MSG(moved1 > 0 && moved2 > 0, "bf16 gradients equal fp32's bit for bit: the option did nothing");
    // GPT-OSS: its expert biases' sums (grouped_linear_backward_weight's db) round once too
    write_text(
        d, "oss.json",
        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_local_experts\": 4, "
        "\"num_experts_per_tok\": 2, \"intermediate_size\": 16, \"sliding_window\": 5, \"swiglu_limit\": 2.0, "
        "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 64}");
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(
            run_cmd(out, sizeof out,
                    "%s train %s/train.json --set model=%s/oss.json --set run_dir=%s/o%d --set gradient_dtype=%s "
                    "--set global_batch_size=2 --dump-grads %s/o%d/g",
                    PITH_BIN, d, d, d, i, i ? "bf16" : "fp32", d, i) == 0,
            "%s", out);
    snprintf(a, sizeof a, "%s/o1/g", d), snprintf(b, sizeof b, "%s/o0/g", d);
    grad_bf16_check(a, b, b, NULL, 1, 0, &moved1);
    ASSERT(moved1 > 0);
    snprintf(a, sizeof a, "%s/f1", d), snprintf(b, sizeof b, "%s/b1", d);
    double l1 = run_metric(a, 1, "loss"), lworst = 0;
    for (int s = 1; s <= 6; s++) {
        double la = run_metric(a, s, "loss"), lb = run_metric(b, s, "loss");
        if (s == 1) ASSERT_MSG(la == lb, "step 1: %.17g vs %.17g", lb, la);
        ASSERT_MSG(fabs(lb - la) <= ldexp(fabs(la - l1), -7), "step %d: loss %.9g with bf16 gradients, %.9g with fp32",
                   s, lb, la);
        lworst = fmax(lworst, fabs(lb - la));
    }
    printf("     step 1: one micro-batch %lld expert elements rounded (each fp32's rounding); two: worst %.2f of the "
           "bound; 6 steps: loss within %.2e of fp32\n",
           (long long)moved1, worst, lworst);
}

// gradient_dtype takes fp32 or bf16, and bf16 is AdamW's: other values and Muon are refused naming the field.
TEST(config_gradient_dtype_errors) {
    const char *d = tiny_run("");
    char out[8192];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set gradient_dtype=fp16", PITH_BIN, d) != 0);
    ASSERT_MSG(strstr(out, "gradient_dtype") && strstr(out, "bf16"), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set gradient_dtype=bf16 --set optimizer.type=muon",
                   PITH_BIN, d) != 0);
    ASSERT_MSG(strstr(out, "gradient_dtype: is AdamW's"), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set gradient_dtype=bf16 --print-config", PITH_BIN, d) ==
           0);
    ASSERT_MSG(strstr(out, "\"gradient_dtype\": \"bf16\""), "%s", out);
}
