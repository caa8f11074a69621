// test_gpu_gpt_oss.c — GPT-OSS on the GPU against the CPU: the clamped SwiGLU op (fp32 and bf16, the vector and
// the scalar kernel, values on and beyond the clamp's bounds); the whole model (sinks, a sliding and a full
// layer, biased attention and biased grouped expert GEMMs, clamped experts): loss and every gradient; the HF
// fixtures (tests/hf/gpt_oss, tests/hf/gpt_oss_mxfp4) converted by hf2pith, evaluated and trained on the GPU.
// Attention with window and sinks at gpt-oss-20b's shape is in gpu_op_attention_forms (test_gpu_ops.c).
#include "gpu_test.h"

// tests/gpu/test_gpu_model.c
void model_compare(const char *config, bool is_path, DType cdt, int B, int S, double lb_coef, double init_std);
void model_compare_grad_bf16(const char *config, bool is_path, DType cdt, int B, int S, double lb_coef,
                             double init_std);

#define MODES for (int mode_ = 0; mode_ < 2; mode_++)
#define MODE_DT (mode_ ? DT_BF16 : DT_F32)
#define TOL (mode_ ? 1e-2 : 1e-5)

TEST(gpu_op_swiglu_clamped) {
    gpu_begin();
    const float alpha = 1.702f, L = 1.5f;
    MODES {
        gpu_mode(MODE_DT);
        for (int64_t I = 40; I > 0; I -= 34) { // I = 40: 8-wide vectors; I = 6: one output per thread
            int64_t M = 33;
            float *h = xmalloc(M * 2 * I * sizeof(float));
            fill_normal(h, M * 2 * I, 2.0f);
            h[0] = L, h[1] = -L, h[2] = L + 1, h[3] = -L - 1; // on the bounds (exact in bf16) and beyond
            Pair gu = pair_from(MODE_DT, h, 2, M, 2 * I, 0, 0), act = pair_nan(MODE_DT, 2, M, I, 0, 0);
            op_swiglu_forward(act.c, gu.c, alpha, L), op_swiglu_forward(act.d, gu.d, alpha, L);
            EXPECT_CLOSE(act, TOL);
            Pair da = pair_rand(MODE_DT, 1, 2, M, I, 0, 0), dgu = pair_nan(MODE_DT, 2, M, 2 * I, 0, 0);
            op_swiglu_backward(dgu.c, da.c, gu.c, alpha, L);
            op_swiglu_backward(dgu.d, da.d, gu.d, alpha, L);
            EXPECT_CLOSE(dgu, TOL);
            float *g = gpu_down(dgu.d);
            ASSERT(g[0] != 0 && g[1] != 0 && g[2] == 0 && g[3] == 0); // the bounds pass the gradient, beyond: none
            free(g), free(h);
        }
    }
    gpu_report();
}

// Two layers (sliding with window 5 < 32 tokens, full), GQA 4/2 of head dim 16, sinks, biases, YaRN, 8 experts
// top-2 of width 16 (the vector SwiGLU kernel), swiglu_limit 2 (part of the pairs clamped).
static const char *config_gpt_oss =
    "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 64, \"num_local_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"intermediate_size\": 16, \"sliding_window\": 5, \"swiglu_limit\": 2.0,"
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 64,"
    " \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 4.0,"
    " \"truncate\": false, \"original_max_position_embeddings\": 8}}";

TEST(gpu_model_gpt_oss) {
    gpu_begin();
    model_compare(config_gpt_oss, false, DT_F32, 2, 32, 0.05, 0.2);
    model_compare(config_gpt_oss, false, DT_BF16, 2, 32, 0.05, 0.2);
    gpu_report();
}

// bf16 expert gradients with the experts' biases (the grouped bias kernel's bf16 db), fp32 and bf16 compute.
TEST(gpu_model_gpt_oss_grad_bf16) {
    gpu_begin();
    model_compare_grad_bf16(config_gpt_oss, false, DT_F32, 2, 32, 0.05, 0.2);
    model_compare_grad_bf16(config_gpt_oss, false, DT_BF16, 2, 32, 0.05, 0.2);
    gpu_report();
}

static double eval_loss(const char *ck, const char *fix, const char *dtype) {
    char out[4096];
    int rc =
        run_cmd(out, sizeof out, "%s eval --model %s --data %s/tokens.bin --seq 16 --batch 4 --device cuda --dtype %s",
                PITH_BIN, ck, fix, dtype);
    ASSERT_MSG(rc == 0 && strstr(out, "loss "), "%s", out);
    return strtod(strstr(out, "loss ") + 5, NULL);
}

// The fixtures as hf2pith converts them: eval ≤ 1e-5 (fp32) and ≤ 1e-2 (bf16) relative to transformers' fp64
// loss; 5 AdamW steps on the GPU in fp32 ≤ 1e-4 (loss and grad norm); the MXFP4 folder's eval likewise.
TEST(gpu_hf_parity_gpt_oss) {
    static const char *const fix[2] = {"tests/hf/gpt_oss", "tests/hf/gpt_oss_mxfp4"},
                             *expect[2] = {"tests/hf/gpt_oss", "tests/hf/gpt_oss_mxfp4_ref"};
    for (int f = 0; f < 2; f++) {
        const char *d = test_tmpdir();
        char out[16384], ck[512];
        snprintf(ck, sizeof ck, "%s/ck", d);
        ASSERT_MSG(run_cmd(out, sizeof out, "%s convert hf2pith %s %s", PITH_BIN, fix[f], ck) == 0, "%s", out);
        double want = hf_expected(expect[f], "loss", -1), f32 = eval_loss(ck, fix[f], "fp32"),
               b16 = eval_loss(ck, fix[f], "bf16");
        printf("     %s eval loss: fp32 rel %.2e, bf16 rel %.2e\n", fix[f], fabs(f32 - want) / want,
               fabs(b16 - want) / want);
        ASSERT(fabs(f32 - want) / want < 1e-5);
        ASSERT(fabs(b16 - want) / want < 1e-2);
        if (f) continue;
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "cp %s/tokens.bin %s/train.json %s/ && %s train %s/train.json --set device=cuda --set "
                           "compute_dtype=fp32 --set run_dir=%s/run",
                           fix[f], fix[f], ck, PITH_BIN, ck, d) == 0,
                   "%s", out);
        double worst = 0;
        for (int s = 0; s < 5; s++) {
            char line[4096];
            ASSERT(run_cmd(line, sizeof line, "grep '^{\"step\": %d,' %s/run/metrics.jsonl", s + 1, d) == 0);
            double l = strtod(strstr(line, "\"loss\": ") + 8, NULL),
                   g = strtod(strstr(line, "\"grad_norm\": ") + 13, NULL);
            double wl = hf_expected(fix[f], "loss", s), wg = hf_expected(fix[f], "grad_norm", s);
            double e = fmax(fabs(l - wl) / wl, fabs(g - wg) / wg);
            worst = fmax(worst, e);
            ASSERT_MSG(e < 1e-4, "step %d: loss %.9g grad norm %.9g (rel %.2e)", s + 1, l, g, e);
        }
        printf("     %s: 5 AdamW steps on the GPU (fp32): worst relative difference %.2e\n", fix[f], worst);
    }
}
