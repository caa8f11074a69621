// test_balance.c — aux-loss-free load balancing (moe_router_bias_update_rate): the update rule on a hand-computed
// example, a skewed router balanced by the bias alone, and the bias through training, checkpoints and resume.
#include <jansson.h>

#include "ops/ops.h"
#include "test.h"
#include "train/router_bias.h"
#include "train/trainer.h"

TEST(router_bias_update_rule) {
    // loads 10, 2, 6, 6, 0, 12 (mean 6): above the mean −rate, below +rate, at the mean unchanged.
    float bias[6] = {0.5f, 0, 0, -0.25f, 0, 0};
    const double load[6] = {10, 2, 6, 6, 0, 12};
    router_bias_update(bias, load, 6, 0.125);
    const float want[6] = {0.375f, 0.125f, 0, -0.25f, 0.125f, -0.125f};
    for (int e = 0; e < 6; e++) ASSERT_MSG(bias[e] == want[e], "expert %d: %g, want %g", e, bias[e], want[e]);
}

// Largest expert load over the mean of a routing idx: (T, k) int32 over E experts.
static double max_over_mean(const int32_t *idx, int64_t n, int E, double *load) {
    memset(load, 0, sizeof(double) * E);
    for (int64_t i = 0; i < n; i++) load[idx[i]] += 1;
    double mx = 0;
    for (int e = 0; e < E; e++) mx = fmax(mx, load[e]);
    return mx / ((double)n / E);
}

// With softmax probabilities and with DeepSeek-V3's sigmoid scores (the bias is added to whichever the router
// selects by).
static void balances_a_skewed_router(bool sigmoid) {
    enum { T = 2048, E = 8, K = 2 };
    // A frozen router that prefers experts 0 and 1 (logit offsets 1.5 and 1) over noise of std 0.5.
    float *logits = xmalloc(sizeof(float) * T * E), *probs = xmalloc(sizeof(float) * T * E),
          *w = xmalloc(sizeof(float) * T * K);
    int32_t *idx = xmalloc(sizeof(int32_t) * T * K);
    fill_normal(logits, T * E, 0.5f);
    for (int t = 0; t < T; t++) logits[t * E] += 1.5f, logits[t * E + 1] += 1.0f;
    float bias[E] = {0};
    double load[E], first = 0, last = 0;
    for (int s = 0; s < 400; s++) {
        RouterArgs ra = {.k = K,
                         .renorm = true,
                         .scale = 1,
                         .bias = tensor_make(bias, DT_F32, DEV_CPU, 1, E, 1, 1, 1),
                         .sigmoid = sigmoid};
        op_router_forward(tf32_2(probs, T, E), tensor_make(idx, DT_I32, DEV_CPU, 2, T, K, 1, 1), tf32_2(w, T, K),
                          tf32_2(logits, T, E), &ra);
        last = max_over_mean(idx, T * K, E, load);
        if (s == 0) first = last;
        router_bias_update(bias, load, E, 1e-3);
    }
    printf("     %s: largest expert load / mean: %.2f at the start, %.3f after 400 updates (bias of expert 0: %.3f)\n",
           sigmoid ? "sigmoid" : "softmax", first, last, bias[0]);
    ASSERT_MSG(first > 2.0, "the router is not skewed: %.2f", first);
    ASSERT_MSG(last < 1.1, "not balanced: %.3f", last);
    ASSERT(bias[0] < 0 && bias[1] < 0);
    free(logits), free(probs), free(w), free(idx);
}
TEST(router_bias_balances_a_skewed_router) { balances_a_skewed_router(false), balances_a_skewed_router(true); }

// The router_bias rows of a checkpoint's run.json, as one flat array (caller frees), and their count.
double *read_router_bias(const char *ckpt, int *n) {
    char path[600];
    snprintf(path, sizeof path, "%s/run.json", ckpt);
    json_t *root = json_load_file(path, 0, NULL), *rb = json_object_get(root, "router_bias");
    ASSERT_MSG(json_is_array(rb), "%s: no router_bias", path);
    double *out = xmalloc(sizeof(double) * 4096);
    *n = 0;
    for (size_t l = 0; l < json_array_size(rb); l++)
        for (size_t e = 0; e < json_array_size(json_array_get(rb, l)); e++)
            out[(*n)++] = json_number_value(json_array_get(json_array_get(rb, l), e));
    json_decref(root);
    return out;
}

// A tiny Qwen3-MoE run (2 MoE layers, 8 experts top-2) with aux-loss-free balancing: model.json, data.bin and
// train.json in a fresh folder, whose path is returned.
static const char *make_bias_run(void) {
    const char *d = test_tmpdir();
    char out[4096], pith[4096];
    ASSERT(realpath(PITH_BIN, pith));
    ASSERT(run_cmd(out, sizeof out,
                   "cd %s && echo '{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 2, "
                   "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 64, "
                   "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8}' > model.json && "
                   "%s synth --output data.bin --vocab 64 --tokens 3000 >/dev/null && echo '{\"model\": "
                   "\"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 8, \"micro_batch_size\": 2, "
                   "\"global_batch_size\": 4, \"max_steps\": 6, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01}, "
                   "\"moe_router_bias_update_rate\": 0.01}' > train.json",
                   d, pith) == 0);
    return d;
}

TEST(router_bias_training_checkpoint_and_resume) {
    const char *d = make_bias_run();
    char out[1 << 16], pith[4096];
    ASSERT(realpath(PITH_BIN, pith));
    ASSERT(run_cmd(out, sizeof out,
                   "cd %s && %s train train.json --set save_location=a >/dev/null && %s train train.json --set "
                   "save_location=b --steps 3 >/dev/null && %s train train.json --set save_location=b && "
                   "sed 's/, .tokens_per_s.*//' a/metrics.jsonl > a.txt && sed 's/, .tokens_per_s.*//' b/metrics.jsonl "
                   "> b.txt && cmp a.txt b.txt",
                   d, pith, pith, pith) == 0);
    ASSERT_MSG(strstr(out, "resume: step 3"), "%s", out);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/a/step-00000006", d), snprintf(b, sizeof b, "%s/b/step-00000006", d);
    int na, nb, moved = 0;
    double *x = read_router_bias(a, &na), *y = read_router_bias(b, &nb);
    ASSERT(na == 16 && nb == 16);
    for (int i = 0; i < na; i++) {
        ASSERT_MSG(x[i] == y[i], "bias %d: %g uninterrupted, %g resumed", i, x[i], y[i]);
        moved += x[i] != 0;
        // 6 steps of ±0.01 or 0: a multiple of 0.01 within ±0.06
        ASSERT(fabs(x[i]) <= 0.06 + 1e-9 && fabs(x[i] * 100 - nearbyint(x[i] * 100)) < 1e-4);
    }
    ASSERT_MSG(moved >= 3, "only %d of 16 biases moved", moved); // ups and downs cancel for some
    free(x), free(y);
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set save_location=%s/c --set moe_router_bias_update_rate=-1", PITH_BIN, d,
                   d) == 1 &&
           strstr(out, "moe_router_bias_update_rate: must be"));
}

// on_nonfinite = skip: a step whose loss or norm is not finite moves no bias either (its expert counts come from
// a forward that went wrong), while finite steps do move them. lr 1e6 diverges within a few steps.
TEST(router_bias_unchanged_on_a_skipped_step) {
    const char *d = make_bias_run();
    char path[512];
    snprintf(path, sizeof path, "%s/train.json", d);
    char *sets[] = {"optimizer.lr=1e6", "max_steps=40", "on_nonfinite=skip"};
    TrainConfig c;
    config_load(&c, path, sets, 3);
    static Run r;
    run_setup(&r, &c, true);
    int n = r.model.cfg.layers * r.model.cfg.experts, skipped = 0, moved = 0;
    float *before = xmalloc(sizeof(float) * n), *dev = xmalloc(sizeof(float) * n);
    for (int s = 0; s < 40 && skipped < 2; s++) {
        memcpy(before, r.router_bias, sizeof(float) * n);
        StepStats st = run_step(&r);
        op_copy(tensor_make(dev, DT_F32, DEV_CPU, 2, r.model.cfg.layers, r.model.cfg.experts, 1, 1),
                r.model.router_bias);
        ASSERT(!memcmp(dev, r.router_bias, sizeof(float) * n)); // the model routes with the run's biases
        bool same = !memcmp(before, r.router_bias, sizeof(float) * n);
        if (st.nonfinite) ASSERT_MSG(same, "step %d was skipped but moved the router biases", r.step);
        skipped += st.nonfinite, moved += !st.nonfinite && !same;
    }
    ASSERT_MSG(skipped == 2, "lr 1e6 gave %d non-finite steps in 40", skipped);
    ASSERT_MSG(moved >= 1, "no finite step moved the biases");
    printf("     %d skipped steps left the biases alone; %d finite steps moved them\n", skipped, moved);
    free(before), free(dev);
    run_free(&r);
    json_decref(c.json);
}
