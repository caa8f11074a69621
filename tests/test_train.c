// test_train.c — the trainer end to end: overfitting, determinism, epochs, schedules, and every kind of
// bad input (config, data, model config, command line) by message and exit code.
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
    ASSERT(run_cmd(out, sizeof out, "mkdir -p %s/data && %s synth --output %s/data/a.bin --vocab 64 --tokens %d", d, PITH_BIN, d, ntokens) == 0);
    write_text(d, "train.json",
               "{\"model\": \"model.json\", \"dataset\": \"data\", \"sequence_length\": 16, \"micro_batch_size\": 2,"
               " \"global_batch_size\": 4, \"max_steps\": 10, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01, \"betas\": [0.9, 0.95]}}");
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
    char out[65536], a[8192], b[8192], args[256] = "--set max_steps=30 --set moe_load_balance_coef=0.01 --set scheduler.type=wsd --set scheduler.warmup_ratio=0.1";
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/r1", PITH_BIN, d, args, d) == 0);
    ASSERT(strstr(out, "step 00000030/00000030 | loss"));
    ASSERT(strstr(out, "| lb "));
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/r2", PITH_BIN, d, args, d) == 0);
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

TEST(train_continues_into_new_epochs) {
    // 4 samples per epoch, 4 per step, 3 steps: epochs 1 and 2 begin with fresh permutations.
    const char *d = make_run(65);
    char out[16384];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set max_steps=3 --set run_dir=%s/r", PITH_BIN, d, d) == 0);
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
        for (int t = 0; t < 16; t++) ASSERT(tok[t] == (int32_t)raw[p * 16 + t] && lab[t] == (int32_t)raw[p * 16 + t + 1]);
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
    snprintf(c.scheduler.type, 16, "wsd"), snprintf(c.scheduler.decay_shape, 16, "cosine");
    c.scheduler.warmup_ratio = 0.1, c.scheduler.decay_ratio = 0.2, c.scheduler.start_lr = 0.0, c.scheduler.final_lr = 0.1;
    ASSERT_NEAR(config_lr_factor(&c, 0), 0.0, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 5), 0.5, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 50), 1.0, 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 90), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.5)), 1e-12);
    ASSERT_NEAR(config_lr_factor(&c, 100), 0.1, 1e-12);
    snprintf(c.scheduler.decay_shape, 16, "linear");
    ASSERT_NEAR(config_lr_factor(&c, 90), 1 + (0.1 - 1) * 0.5, 1e-12);
    snprintf(c.scheduler.type, 16, "constant");
    ASSERT_NEAR(config_lr_factor(&c, 3), 1.0, 1e-12);
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
    expect_error(d, "--set sequence_length=\\\"long\\\"", "train.json: sequence_length: expected an integer");
    expect_error(d, "--set micro_batch_size=0", "train.json: micro_batch_size: must be a positive integer");
    expect_error(d, "--set global_batch_size=5", "train.json: global_batch_size: must be a multiple of micro_batch_size");
    expect_error(d, "--set learning_rate=3", "train.json: learning_rate: unknown key");
    expect_error(d, "--set optimizer.nesterov=true", "train.json: optimizer.nesterov: unknown key");
    expect_error(d, "--set optimizer.momentum=3", "train.json: optimizer.momentum: must be in [0, 1)");
    expect_error(d, "--set optimizer.type=sgd", "train.json: optimizer.type: 'sgd' is not supported");
    expect_error(d, "--set optimizer.betas=[0.9]", "train.json: optimizer.betas: expected [beta1, beta2]");
    expect_error(d, "--set scheduler.type=step", "train.json: scheduler.type: must be \"constant\" or \"wsd\"");
    expect_error(d, "--set device=tpu", "train.json: device: must be");
    expect_error(d, "--set max_steps=null", "train.json: max_steps: missing required key");
    expect_error(d, "--set dataset=/nonexistent/x", "/nonexistent/x: dataset not found");
    expect_error(d, "--bogus", "train: unknown option '--bogus'");
    expect_error(d, "--set parallel.expert_parallel_size=2", "parallel");
    char out[4096];
    ASSERT(run_cmd(out, sizeof out, "echo '{\"model\": ' > %s/bad.json && %s train %s/bad.json", d, PITH_BIN, d) == 1);
    ASSERT(strstr(out, "bad.json:") && strstr(out, "invalid JSON"));
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
    write_text(d, "m4.json", "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
                             " \"vocab_size\": 64, \"num_experts\": 4, \"num_experts_per_tok\": 5, \"moe_intermediate_size\": 4}");
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set model=%s/m4.json", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "m4.json: num_experts_per_tok: must be in [1, num_experts]"), "%s", out);
    write_text(d, "m5.json", "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
                             " \"vocab_size\": 64, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 4,"
                             " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}");
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set model=%s/m5.json", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "m5.json: rope_scaling.rope_type: 'yarn' is not supported"), "%s", out);
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
    // tokens beyond the model's vocabulary
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/data/a.bin --vocab 1000 --tokens 1000", PITH_BIN, d) == 0);
    // (found when the sample is read, after setup has printed its summary: the error is the last line)
    ASSERT(run_cmd(out, sizeof out, "{ %s train %s/train.json 2>&1 >/dev/null; }", PITH_BIN, d) == 1);
    ASSERT_MSG(strstr(out, "pith: error: ") == out && strstr(out, "is outside the model's vocabulary of 64"), "%s", out);
    // too short for one sample
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/data/a.bin --vocab 64 --tokens 10", PITH_BIN, d) == 0);
    expect_error(d, "", "hold no sample of sequence_length 16");
}

TEST(cli_help_and_usage) {
    char out[8192];
    ASSERT(run_cmd(out, sizeof out, "%s --help", PITH_BIN) == 0 && strstr(out, "train") && strstr(out, "synth"));
    ASSERT(run_cmd(out, sizeof out, "%s train --help", PITH_BIN) == 0 && strstr(out, "--set key=value"));
    ASSERT(run_cmd(out, sizeof out, "%s frobnicate", PITH_BIN) == 2 && strstr(out, "unknown command 'frobnicate'"));
    ASSERT(run_cmd(out, sizeof out, "%s synth --output /nonexistent-dir/x.bin", PITH_BIN) == 1 && strstr(out, "/nonexistent-dir/x.bin.tmp: cannot write"));
}

TEST(path_normalize_cases) {
    const char *cases[][2] = {{"a/./b/../c", "a/c"}, {"examples/demo/../../runs/demo", "runs/demo"}, {"../../x", "../../x"},
                              {"/a/../../b", "/b"}, {"./", "."}, {"a//b/", "a/b"}, {"a/..", "."}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s", cases[i][0]);
        path_normalize(p);
        ASSERT_MSG(!strcmp(p, cases[i][1]), "%s -> %s, expected %s", cases[i][0], p, cases[i][1]);
    }
}
