// test_gpt_oss.c — the GPT-OSS family on the CPU: its clamped SwiGLU op against an fp64 reference and finite
// differences (the clamp's bounds included), config parsing and its errors, the gradient of every parameter
// tensor (sinks and biases included), the sliding window's edge, HF parity with transformers 5.17
// (tests/hf/gpt_oss), the convert round trip, and MXFP4 import against transformers' own dequantization
// (tests/hf/gpt_oss_mxfp4, tests/hf/gpt_oss_mxfp4_ref; both made by tests/hf/make_fixtures.py).
#include "base/safetensors.h"
#include "pipe/chunk.h"
#include "test.h"

// tests/test_model.c
void gradcheck_seq(const char *model_json, double lb_coef, LbForm form, int S);
void hf_parity(const char *fix);
// tests/test_generate.c
void cache_equals_full_forwards(const char *dir);

// ---- op: clamped SwiGLU on interleaved columns ----

static double ref_act(double g, double u, double alpha, double L) {
    double gc = fmin(g, L), uc = fmax(fmin(u, L), -L);
    return (uc + 1) * gc / (1 + exp(-alpha * gc));
}

// Forward against fp64; backward against central differences of the fp64 reference for inputs away from
// the bounds, and on the bounds (g = L, u = ±L) against the one-sided rule: the gradient passes there.
TEST(op_swiglu_clamped) {
    const int64_t M = 6, I = 9; // I not a multiple of 8, like the tiny models
    const float alpha = 1.702f, L = 1.5f;
    int64_t n = M * 2 * I, m = M * I;
    float *gu = xmalloc(n * 4), *act = xmalloc(m * 4), *da = xmalloc(m * 4), *dgu = xmalloc(n * 4);
    fill_normal(gu, n, 2.0f), fill_normal(da, m, 1.0f);
    for (int64_t i = 0; i < n; i++) // keep finite differences off the kinks
        if (fabsf(fabsf(gu[i]) - L) < 0.05f) gu[i] += 0.2f;
    gu[0] = L, gu[1] = L, gu[3] = -L, gu[4] = L + 1, gu[5] = -L - 1; // on and beyond the bounds
    Tensor tgu = tensor_make(gu, DT_F32, DEV_CPU, 2, M, 2 * I, 1, 1),
           tact = tensor_make(act, DT_F32, DEV_CPU, 2, M, I, 1, 1),
           tda = tensor_make(da, DT_F32, DEV_CPU, 2, M, I, 1, 1),
           tdgu = tensor_make(dgu, DT_F32, DEV_CPU, 2, M, 2 * I, 1, 1);
    op_swiglu_forward(tact, tgu, alpha, L);
    op_swiglu_backward(tdgu, tda, tgu, alpha, L);
    double worst_f = 0, worst_b = 0;
    for (int64_t e = 0; e < m; e++) {
        double g = gu[2 * e], u = gu[2 * e + 1], y = ref_act(g, u, alpha, L), h = 1e-6;
        worst_f = fmax(worst_f, fabs(act[e] - y) / (fabs(y) + 1e-3));
        double dg, du;
        if (e < 3) { // the bound cases: ∂ at the bound is the inside one-sided derivative
            double gc = fmin(g, L), s = 1 / (1 + exp(-alpha * gc)), uc = fmax(fmin(u, L), -L);
            dg = g <= L ? da[e] * (uc + 1) * s * (1 + alpha * gc * (1 - s)) : 0;
            du = fabs(u) <= L ? da[e] * gc * s : 0;
        } else {
            dg = da[e] * (ref_act(g + h, u, alpha, L) - ref_act(g - h, u, alpha, L)) / (2 * h);
            du = da[e] * (ref_act(g, u + h, alpha, L) - ref_act(g, u - h, alpha, L)) / (2 * h);
        }
        worst_b = fmax(worst_b, fmax(fabs(dgu[2 * e] - dg), fabs(dgu[2 * e + 1] - du)) / (fabs(da[e]) + 1e-3));
    }
    printf("     forward %.2e, backward %.2e\n", worst_f, worst_b);
    ASSERT(worst_f < 1e-6 && worst_b < 1e-5);
    // element 0: g = L and u = L, both on a bound: both gradients flow; element 2: g = L + 1, u = −L − 1: none
    ASSERT(dgu[0] != 0 && dgu[1] != 0 && dgu[4] == 0 && dgu[5] == 0);
    ASSERT_NEAR(act[2], ref_act(L + 1, -L - 1, alpha, L), 1e-6); // = (1 − L)·L·σ(αL)
    free(gu), free(act), free(da), free(dgu);
}

// ---- config ----

// Two layers (sliding, full), window 3, biases, sinks, YaRN with truncate false; swiglu_limit 2, which clamps
// about 5% of the (gate, up) pairs of the random gradcheck model (a limit of 0.5 or 1 clamps so many that
// finite-difference steps cross the kinks).
#define GPT_OSS_TINY                                                                                                   \
    "{\"model_type\": \"gpt_oss\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"         \
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 48, \"num_local_experts\": 4,"                      \
    " \"num_experts_per_tok\": 2, \"intermediate_size\": 6, \"sliding_window\": 3, \"swiglu_limit\": 2.0,"             \
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 64,"                  \
    " \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 4.0, \"beta_fast\": 32.0,"  \
    " \"beta_slow\": 1.0, \"truncate\": false, \"original_max_position_embeddings\": 4}}"

TEST(model_config_gpt_oss) {
    ModelConfig mc;
    ASSERT(model_config_load(&mc, "tests/hf/gpt_oss") == &gpt_oss_family);
    ASSERT(mc.experts == 8 && mc.topk == 2 && mc.moe_inter == 16 && mc.rope.rd == 16 && mc.is_moe[0] && mc.is_moe[2]);
    ASSERT(mc.rope.yarn && !mc.rope.truncate && mc.rope.factor == 4 && mc.rope.theta == 150000);
    ASSERT(mc.swiglu_limit == 7.0f && mc.swiglu_alpha == 1.702f && mc.eps == 1e-5);
    // absent layer_types and rope parameters: transformers' defaults (even layers sliding; YaRN factor 32)
    model_config_load(&mc, write_text(test_tmpdir(), "config.json",
                                      "{\"model_type\": \"gpt_oss\", \"hidden_size\": 16, \"num_hidden_layers\": 3,"
                                      " \"num_attention_heads\": 2, \"vocab_size\": 8, \"num_local_experts\": 2,"
                                      " \"num_experts_per_tok\": 1, \"intermediate_size\": 4}"));
    ASSERT(mc.rope.yarn && mc.rope.factor == 32 && mc.rope.orig_max_pos == 4096 && mc.rope.theta == 150000 &&
           !mc.rope.truncate);
    static const struct {
        const char *edit, *msg;
    } bad[] = {
        {"{\"layer_types\": [\"sliding_attention\"]}",
         "config.json: layer_types: expected an array of num_hidden_layers = 2"},
        {"{\"layer_types\": [\"sliding_attention\", \"chunked\"]}",
         "config.json: layer_types: entry 1 must be \"sliding_attention\" or \"full_attention\""},
        {"{\"swiglu_limit\": 0}", "config.json: swiglu_limit: must be positive"},
        {"{\"num_key_value_heads\": 3}", "config.json: num_key_value_heads: must divide num_attention_heads (4)"},
        {"{\"sliding_window\": 0}", "config.json: sliding_window:"},
        {"{\"quantization_config\": {\"quant_method\": \"fp8\"}}",
         "config.json: quantization_config.quant_method: only mxfp4"},
        {"{\"rope_parameters\": {\"rope_type\": \"longrope\"}}", "rope_type: 'longrope' is not supported for gpt_oss"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *cfg = json_loads(GPT_OSS_TINY, 0, NULL), *edit = json_loads(bad[i].edit, 0, NULL);
        ASSERT(cfg && edit);
        json_object_update(cfg, edit);
        const char *d = test_tmpdir();
        char *text = json_dumps(cfg, 0), out[4096];
        write_text(d, "config.json", text);
        int rc = run_cmd(out, sizeof out, "%s convert hf2pith %s %s/out", PITH_BIN, d, d); // reads the config first
        ASSERT_MSG(rc == 1 && strstr(out, bad[i].msg) && strchr(out, '\n') == out + strlen(out) - 1, "%s: %s",
                   bad[i].edit, out);
        free(text), json_decref(cfg), json_decref(edit);
    }
}

// ---- gradients ----

TEST(model_gradcheck_gpt_oss) { gradcheck_seq(GPT_OSS_TINY, 0.0, LB_MICRO_BATCH, 8); }
TEST(model_gradcheck_gpt_oss_load_balance) { gradcheck_seq(GPT_OSS_TINY, 0.05, LB_MICRO_BATCH, 8); }

// The sliding window's edge, through the whole model: one sliding layer of window W, the loss of position t
// alone. Changing the token at t − W reaches t through no attention path; it can still move t's loss by rounding,
// because it may route token t − W to another expert, which changes the row counts of the experts' GEMMs and with
// them the order in which OpenBLAS's kernels (on some CPUs) sum t's products. That rounding is bounded: every GEMM
// here sums ≤ 16 fp32 products, so each of t's activations moves by ≤ 16·2⁻²⁴ of the sum of its products'
// magnitudes, and the loss (a smooth function of a few such layers) by far less than 1e-5 relative. Changing the
// token at t − W + 1 (the window's oldest key) moves the loss by ≈ 0.1 relative; so does t − W under full attention.
static double loss_at(const char *layer_type, int t, int changed, int32_t token) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"model_type\": \"gpt_oss\", \"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": "
             "2, \"head_dim\": 8, \"vocab_size\": 32, \"num_local_experts\": 2, \"num_experts_per_tok\": 1,"
             " \"intermediate_size\": 8, \"sliding_window\": 3, \"layer_types\": [\"%s\"]}",
             layer_type);
    ModelConfig mc;
    Model m;
    Chunk e;
    StepSums st;
    const int S = 12;
    const ModelFamily *fam = model_config_load(&mc, write_text(test_tmpdir(), "config.json", json));
    model_create(&m, fam, &mc, DEV_CPU, DT_F32, S);
    for (int g = 0; g < NGROUPS; g++) params_init(&m.params, g, m.w[g].p, 3, 0.3, mc.layers);
    step_sums_create(&st, &m, true);
    chunk_init_model(&e, &m, &st, 1, S);
    int32_t tok[12], lab[12];
    for (int i = 0; i < S; i++) tok[i] = (int32_t)(rng_u64(9, 1, i) % 32), lab[i] = i == t ? 5 : -100;
    if (changed >= 0) tok[changed] = token;
    chunk_load(&e, 0, tok, lab);
    chunk_forward(&e, 0, false);
    double loss = op_read_scalar(st.loss_sum);
    chunk_free(&e), step_sums_free(&st), model_free(&m);
    return loss;
}

TEST(model_gpt_oss_sliding_window_edge) {
    const int t = 9, W = 3;
    double base = loss_at("sliding_attention", t, -1, 0), out = loss_at("sliding_attention", t, t - W, 31),
           in = loss_at("sliding_attention", t, t - W + 1, 31), full = loss_at("full_attention", t, -1, 0),
           full_out = loss_at("full_attention", t, t - W, 31);
    printf("     loss at t: %.9f; token t−W changed: %.9f; token t−W+1 changed: %.9f; full attention, t−W changed: "
           "%.9f → %.9f\n",
           base, out, in, full, full_out);
    ASSERT(fabs(out - base) <= 1e-5 * fabs(base));
    ASSERT(fabs(in - base) > 1e-3 * fabs(base));
    ASSERT(fabs(full_out - full) > 1e-3 * fabs(full));
}

// ---- HF: parity, conversion, MXFP4 ----

// hf2pith of an HF fixture into dir/ck, with the fixture's data, expected values and training config beside it.
static const char *convert_fixture(const char *fix, const char *dir) {
    static char ck[512];
    char out[8192];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith %s %s && cp %s/tokens.bin %s/expected.json %s/train.json %s/",
                   PITH_BIN, fix, ck, fix, fix, fix, ck) == 0);
    return ck;
}

// transformers 5.17 GptOssForCausalLM in fp64 (tests/hf/gpt_oss): eval ≤ 1e-5, 5 AdamW steps ≤ 1e-4 relative.
TEST(hf_parity_gpt_oss) { hf_parity(convert_fixture("tests/hf/gpt_oss", test_tmpdir())); }

// pith generate's KV-cache path: 16 positions through the sliding layers' window of 5 (queries at offsets against
// the cache), sinks and full layers, against full forwards.
TEST(generate_cache_equals_full_forwards_gpt_oss) {
    cache_equals_full_forwards(convert_fixture("tests/hf/gpt_oss", test_tmpdir()));
}

// hf2pith then pith2hf gives the fixture's tensors bit for bit (grouped, transposed experts); with --dtype bf16,
// the same names and shapes in bf16.
TEST(convert_gpt_oss_round_trip) {
    const char *fix = "tests/hf/gpt_oss", *d = test_tmpdir();
    char out[8192], a[512];
    ASSERT(run_cmd(out, sizeof out,
                   "%s convert hf2pith %s %s/ck && %s convert pith2hf %s/ck %s/hf && %s convert "
                   "pith2hf %s/ck %s/bf --dtype bf16",
                   PITH_BIN, fix, d, PITH_BIN, d, d, PITH_BIN, d, d) == 0);
    StSet x, y, z;
    snprintf(a, sizeof a, "%s/hf", d);
    st_set_open_or_die(&x, fix), st_set_open_or_die(&y, a);
    snprintf(a, sizeof a, "%s/bf", d);
    st_set_open_or_die(&z, a);
    ASSERT(x.n == y.n && x.n == z.n);
    for (int i = 0; i < x.n; i++) {
        const StTensor *t = st_set_find(&y, x.t[i]->name), *b = st_set_find(&z, x.t[i]->name);
        ASSERT_MSG(t && t->dt == x.t[i]->dt && t->bytes == x.t[i]->bytes && !memcmp(t->data, x.t[i]->data, t->bytes),
                   "%s", x.t[i]->name);
        ASSERT_MSG(b && b->dt == ST_BF16 && b->numel == x.t[i]->numel && b->nd == x.t[i]->nd, "%s", x.t[i]->name);
    }
    st_set_close(&x), st_set_close(&y), st_set_close(&z);
}

// MXFP4 (tests/hf/gpt_oss_mxfp4: *_blocks and *_scales written by make_fixtures.py from the format's definition):
// hf2pith dequantizes to exactly what transformers' dequantization gave (tests/hf/gpt_oss_mxfp4_ref), in bf16
// and fp32, says so, drops quantization_config, and the model's loss is the fp64 reference's.
TEST(convert_gpt_oss_mxfp4) {
    const char *fix = "tests/hf/gpt_oss_mxfp4", *d = test_tmpdir();
    char out[8192], a[512];
    ModelConfig mc;
    model_config_load(&mc, fix);
    int64_t E = mc.experts, H = mc.hidden, I = mc.moe_inter;
    StSet ref;
    st_set_open_or_die(&ref, "tests/hf/gpt_oss_mxfp4_ref/dequantized.safetensors");
    for (int fp32 = 0; fp32 < 2; fp32++) {
        ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith %s %s/ck%d %s", PITH_BIN, fix, d, fp32,
                       fp32 ? "--dtype fp32" : "") == 0);
        ASSERT_MSG(strstr(out, fp32 ? "4 MXFP4 weights dequantized to fp32" : "4 MXFP4 weights dequantized to bf16"),
                   "%s", out);
        snprintf(a, sizeof a, "%s/ck%d", d, fp32);
        StSet ck;
        st_set_open_or_die(&ck, a);
        int64_t checked = 0;
        for (int l = 0; l < mc.layers; l++)
            for (int down = 0; down < 2; down++) {
                char n[160];
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s", l, down ? "down_proj" : "gate_up_proj");
                const StTensor *r = st_set_find(&ref, n); // transformers' layout: (E, K, N)
                int64_t N = down ? H : 2 * I, K = down ? I : H;
                ASSERT(r && r->dt == ST_F32 && r->numel == E * N * K);
                const float *rv = r->data;
                float *v = xmalloc(N * K * sizeof(float));
                for (int64_t e = 0; e < E; e++) {
                    snprintf(n, sizeof n, "layers.%d.mlp.experts.%lld.%s.weight", l, (long long)e,
                             down ? "down_proj" : "gate_up_proj");
                    const StTensor *t = st_set_find(&ck, n);
                    ASSERT_MSG(t && t->dt == (fp32 ? ST_F32 : ST_BF16), "%s", n);
                    st_read_f32(t, v);
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t k = 0; k < K; k++, checked++)
                            ASSERT_MSG(v[i * K + k] == rv[(e * K + k) * N + i], "%s[%lld, %lld]", n, (long long)i,
                                       (long long)k);
                }
                free(v);
            }
        st_set_close(&ck);
        ASSERT(checked == mc.layers * E * (2 * I * H + H * I));
        snprintf(a, sizeof a, "%s/ck%d/config.json", d, fp32);
        char *cfg = file_read_all(a, NULL);
        ASSERT(cfg && !strstr(cfg, "quantization_config"));
        free(cfg);
        ASSERT(run_cmd(out, sizeof out, "%s eval --model %s/ck%d --data %s/tokens.bin --seq 16 --batch 4", PITH_BIN, d,
                       fp32, fix) == 0);
        const char *p = strstr(out, "loss ");
        ASSERT_MSG(p, "%s", out);
        double got = strtod(p + 5, NULL), want = hf_expected("tests/hf/gpt_oss_mxfp4_ref", "loss", -1);
        printf("     %s: eval loss %.10f vs transformers fp64 %.10f (rel %.2e)\n", fp32 ? "fp32" : "bf16", got, want,
               fabs(got - want) / want);
        ASSERT(fabs(got - want) <= 1e-5 * want);
    }
    st_set_close(&ref);
    // --dtype on a folder without MXFP4 weights, and a NaN scale: errors, no output
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith tests/hf/gpt_oss %s/x --dtype fp32", PITH_BIN, d) == 1);
    ASSERT_MSG(strstr(out, "--dtype applies to pith2hf, and to hf2pith of MXFP4 weights (tests/hf/gpt_oss has none)"),
               "%s", out);
    StSet s;
    st_set_open_or_die(&s, fix);
    StWriter w;
    st_writer_init(&w);
    uint8_t *sc = NULL;
    for (int i = 0; i < s.n; i++) {
        const StTensor *t = s.t[i];
        const void *src = t->data;
        if (!strcmp(t->name, "model.layers.1.mlp.experts.down_proj_scales"))
            sc = memcpy(xmalloc(t->bytes), t->data, t->bytes), sc[5] = 255, src = sc;
        st_writer_add_raw(&w, t->name, t->dt, t->nd, t->shape, src);
    }
    snprintf(a, sizeof a, "%s/bad", d);
    mkdir_p(a);
    snprintf(a, sizeof a, "%s/bad/model.safetensors", d);
    st_writer_write(&w, a);
    st_writer_free(&w), st_set_close(&s), free(sc);
    ASSERT(run_cmd(out, sizeof out, "cp %s/config.json %s/bad/ && %s convert hf2pith %s/bad %s/y", fix, d, PITH_BIN, d,
                   d) == 1);
    ASSERT_MSG(strstr(out, "tensor 'model.layers.1.mlp.experts.down_proj_scales': scale 255 (NaN in E8M0) in block 5"),
               "%s", out);
    snprintf(a, sizeof a, "%s/y", d);
    ASSERT(!path_exists(a));
}

// An HF folder of GPT-OSS (grouped, transposed experts; or MXFP4 blocks) reads directly in eval and as init_from:
// the same loss, to the last digit printed, as the checkpoint `pith convert hf2pith` writes of it (its hf_import runs
// in memory; the MXFP4 values are exact in bf16 and fp32 alike).
TEST(gpt_oss_hf_folder_reads_directly) {
    char out[8192], ref[8192];
    const char *d = test_tmpdir(), *fix[2] = {"tests/hf/gpt_oss", "tests/hf/gpt_oss_mxfp4"};
    for (int i = 0; i < 2; i++) {
        const char *eval = "%s eval --model %s --data %s/tokens.bin --seq 16 --batch 2 --device cpu";
        ASSERT_MSG(run_cmd(out, sizeof out, "%s convert hf2pith %s %s/ck%d", PITH_BIN, fix[i], d, i) == 0, "%s", out);
        char ck[600];
        snprintf(ck, sizeof ck, "%s/ck%d", d, i);
        ASSERT_MSG(run_cmd(ref, sizeof ref, eval, PITH_BIN, ck, fix[i]) == 0, "%s", ref);
        ASSERT_MSG(run_cmd(out, sizeof out, eval, PITH_BIN, fix[i], fix[i]) == 0, "%s", out);
        const char *a = strstr(out, "\nloss "), *b = strstr(ref, "\nloss ");
        ASSERT_MSG(a && b && !strcmp(a, b), "%s: from the HF folder %s, from its conversion %s", fix[i], out, ref);
        for (int k = 0; k < 2; k++)
            ASSERT_MSG(run_cmd(k ? out : ref, sizeof out,
                               "%s train tests/hf/gpt_oss/train.json --set model=%s --set init_from=%s --set "
                               "max_steps=1 --set run_dir=%s/run%d%d --set dataset=%s/tokens.bin",
                               PITH_BIN, fix[i], k ? fix[i] : ck, d, i, k, fix[i]) == 0,
                       "%s", k ? out : ref);
        char ra[600], rb[600];
        snprintf(ra, sizeof ra, "%s/run%d0", d, i), snprintf(rb, sizeof rb, "%s/run%d1", d, i);
        ASSERT_MSG(run_metric(ra, 1, "loss") == run_metric(rb, 1, "loss"), "%s: init_from the HF folder: %s", fix[i],
                   out);
    }
}
