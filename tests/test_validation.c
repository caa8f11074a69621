// test_validation.c — validation during training (`validation` in the config): when it runs, that it is
// `pith eval` over the same samples, that a resumed run gives the same values, and its config errors.
#include "test.h"

// A tiny Qwen3-MoE with training data (data/a.bin) and separate validation data (val/v.bin) in dir.
static void make_val_run(const char *dir) {
    char out[8192], pith[4096];
    ASSERT(realpath(PITH_BIN, pith)); // the commands below run inside dir
    ASSERT(
        run_cmd(
            out, sizeof out,
            "cd %s && echo '{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 64, "
            "\"num_experts\": 4, "
            "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8}' > model.json && mkdir -p data val && "
            "%s synth --output data/a.bin --vocab 64 --tokens 4000 && %s synth --output val/v.bin --vocab 64 --tokens "
            "500 --seed 7 && "
            "echo '{\"model\": \"model.json\", \"dataset\": \"data\", \"sequence_length\": 8, \"micro_batch_size\": 2,"
            " \"global_batch_size\": 4, \"max_steps\": 6, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01},"
            " \"moe_load_balance_coef\": 0.01, \"validation\": {\"dataset\": \"val\", \"interval\": 2, \"batches\": "
            "3}}' > train.json",
            dir, pith, pith) == 0);
}

TEST(validation_every_n_steps_equals_eval_and_survives_resume) {
    const char *d = test_tmpdir();
    make_val_run(d);
    char out[1 << 16], m[512];
    ASSERT_MSG(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/a", PITH_BIN, d, d) == 0, "%s",
               out);
    ASSERT(strstr(out, "step 00000002/00000006 | loss") && strstr(out, "| val-loss "));
    snprintf(m, sizeof m, "%s/a", d);
    for (int s = 1; s <= 6; s++) {
        double v = run_metric(m, s, "val_loss");
        ASSERT_MSG(s % 2 == 0 ? isfinite(v) && v > 0 : isnan(v), "step %d: val_loss %g", s, v);
    }
    // pith eval over the same 3 global batches of 4 samples, with the weights after step 6.
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s/a/step-00000006 --data %s/val --seq 8 --batch 12", PITH_BIN, d,
                   d) == 0);
    double ev = strtod(strstr(out, "loss ") + 5, NULL), v6 = run_metric(m, 6, "val_loss");
    printf("     val_loss %.9g, pith eval %.9g (rel %.1e)\n", v6, ev, fabs(v6 - ev) / ev);
    ASSERT_MSG(fabs(v6 - ev) <= 1e-5 * ev, "val_loss %.9g vs pith eval %.9g", v6, ev);
    // Stopped after 3 steps and resumed: the same metrics (timings aside), val_loss included.
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set save_location=%s/b --steps 3 && %s train %s/train.json --set "
                   "save_location=%s/b",
                   PITH_BIN, d, d, PITH_BIN, d, d) == 0);
    ASSERT(strstr(out, "resume: step 3"));
    ASSERT(run_cmd(out, sizeof out,
                   "cd %s && sed 's/, .tokens_per_s.*//' a/metrics.jsonl > a.txt && sed 's/, .tokens_per_s.*//' "
                   "b/metrics.jsonl > b.txt && "
                   "cmp a.txt b.txt && grep -c val_loss b.txt",
                   d) == 0);
    ASSERT_MSG(atoi(out) == 3, "%s", out);
    // Without an interval: only after the last step.
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set validation.interval=null --set max_steps=3 --set run_dir=%s/c "
                   ">/dev/null 2>&1 && grep -c val_loss %s/c/metrics.jsonl",
                   PITH_BIN, d, d, d) == 0);
    snprintf(m, sizeof m, "%s/c", d);
    ASSERT_MSG(atoi(out) == 1 && isfinite(run_metric(m, 3, "val_loss")), "%s", out);
}

TEST(validation_config_errors) {
    const char *d = test_tmpdir();
    make_val_run(d);
    static const struct {
        const char *set, *msg;
    } cases[] = {
        {"validation.batches=50", "validation.batches: 50 global batches of 4 samples need 200 samples;"},
        {"validation.batches=0", "validation.batches: must be in [1, 1073741824] (got 0)"},
        {"validation.interval=-2", "validation.interval: must be in [0, 1073741824] (got -2)"},
        {"validation.dataset=null", "validation.dataset: missing required key"},
        {"validation.dataset=nowhere", "nowhere"},
        {"validation.every=3", "validation.every"},
    };
    char out[8192];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/r --set '%s'", PITH_BIN, d, d,
                         cases[i].set);
        ASSERT_MSG(rc == 1 && strstr(out, cases[i].msg) && strstr(out, "pith: error:"), "--set %s: rc %d: %s",
                   cases[i].set, rc, out);
    }
}
