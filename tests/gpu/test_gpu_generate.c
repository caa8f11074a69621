// test_gpu_generate.c — generation on the GPU: the KV-cache path (prompt through cuDNN/flash or the generic kernels,
// then one query against the cache through the generic kernels) gives the CPU's logits, token after token, for
// every family's HF fixture (Qwen3.5: its DeltaNet state and conv halo cached too): fp32 within 1e-4, bf16 by
// calc_diff within 1e-2.
#include "app/generate.h"
#include "gpu_test.h"
#include "train/ckpt.h"

static void load_fixture_on(Model *m, const char *dir, Device dev, DType dt, int cap) {
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, dir);
    model_create_forward(m, fam, &mc, dev, dt, cap);
    float *w[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) w[g] = xmalloc(m->params.numel[g] * sizeof(float) + 1);
    ckpt_load_model(&m->params, w, dir);
    for (int g = 0; g < NGROUPS; g++) {
        op_copy(m->w[g], tensor_make(w[g], DT_F32, DEV_CPU, 1, m->params.numel[g], 1, 1, 1));
        free(w[g]);
    }
}

TEST(gpu_generate_cache_matches_cpu) {
    gpu_begin();
    static const char *fixtures[] = {"tests/hf/qwen3_moe", "tests/hf/deepseek_v2", "tests/hf/deepseek_v2_lite",
                                     "tests/hf/qwen3_5_moe"};
    enum { P = 7, N = 9 };
    for (int f = 0; f < 4; f++)
        for (int mode = 0; mode < 2; mode++) {
            DType dt = mode ? DT_BF16 : DT_F32;
            gpu_mode(dt);
            Model c, d;
            load_fixture_on(&c, fixtures[f], DEV_CPU, DT_F32, P + N);
            load_fixture_on(&d, fixtures[f], DEV_CUDA, dt, P + N);
            int V = c.cfg.vocab;
            int32_t seq[P + N];
            for (int i = 0; i < P; i++) seq[i] = (i * 37 + 11) % V;
            Generator gc, gd;
            gen_init(&gc, &c, P, P + N), gen_init(&gd, &d, P, P + N);
            gen_feed(&gc, seq, P), gen_feed(&gd, seq, P);
            double worst = 0;
            for (int i = P; i < P + N; i++) {
                double err = 0;
                if (mode) err = calc_diff(gd.logits, gc.logits, V);
                else
                    for (int j = 0; j < V; j++) err = fmax(err, fabs(gd.logits[j] - gc.logits[j]));
                worst = fmax(worst, err);
                ASSERT_MSG(err <= (mode ? 1e-2 : 1e-4), "%s %s position %d: GPU logits differ from the CPU's by %.3g",
                           fixtures[f], mode ? "bf16" : "fp32", i, err);
                seq[i] = gen_sample(gc.logits, V, 0, 1, NULL); // both continue with the CPU's choice
                if (i + 1 < P + N) gen_feed(&gc, &seq[i], 1), gen_feed(&gd, &seq[i], 1);
            }
            record_err(worst, mode ? "calc_diff" : "max |Δ logit|");
            gen_free(&gc), gen_free(&gd), model_free(&c), model_free(&d);
        }
    gpu_report();
}
