// test_model.c — the whole Qwen3-MoE model on the CPU: the gradient of the training objective with
// respect to every parameter tensor against central finite differences, and a tiny model overfitting.
// Objective J = (Σ CE + T·Σ_layers lb) / N (N = target tokens): what the trainer differentiates.
#include "pipe/schedule.h"
#include "test.h"

static const char *write_file(const char *dir, const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(text, f);
    fclose(f);
    return path;
}

typedef struct {
    Model m;
    Engine e;
    int32_t tok[64], lab[64];
    int targets;
} Fixture;

static void fixture_make(Fixture *fx, const char *model_json, double lb_coef, LbForm form, int B, int S) {
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, write_file(test_tmpdir(), "config.json", model_json));
    model_create(&fx->m, fam, &mc, DEV_CPU, DT_F32, S);
    fx->m.lb_coef = lb_coef;
    model_lb_setup(&fx->m, form, NULL, B * S);
    for (int g = 0; g < NGROUPS; g++) params_init(&fx->m.params, g, fx->m.w[g].p, 7, 0.2, mc.layers);
    // Norm weights away from 1 so their gradients are generic.
    for (int i = 0; i < fx->m.params.n; i++) {
        const ParamInfo *p = &fx->m.params.p[i];
        if (p->init == INIT_ONES || p->init == INIT_ZEROS)
            for (int64_t j = 0; j < params_numel(p); j++)
                ((float *)fx->m.w[p->group].p)[p->off + j] += (float)(0.3 * rng_normal(99, rng_hash_str(p->name), (uint64_t)j));
    }
    engine_init(&fx->e, &fx->m, B, S);
    fx->targets = 0;
    for (int t = 0; t < B * S; t++) {
        fx->tok[t] = (int32_t)(rng_u64(5, 1, t) % mc.vocab);
        fx->lab[t] = t % 7 == 3 ? -100 : (int32_t)(rng_u64(5, 2, t) % mc.vocab);
        fx->targets += fx->lab[t] != -100;
    }
    engine_load(&fx->e, fx->tok, fx->lab);
}

// J at the current weights; *route gets a hash of every routing decision.
static double objective(Fixture *fx, uint64_t *route) {
    op_zero(fx->m.loss_sum), op_zero(fx->m.lb_sum);
    engine_forward(&fx->e, false);
    uint64_t h = 0;
    for (int l = 0; l < fx->m.cfg.layers; l++)
        for (int64_t i = 0; fx->m.cfg.is_moe[l] && i < tensor_numel(fx->e.io[l].idx); i++) h = rng_mix(h ^ (uint64_t)((int32_t *)fx->e.io[l].idx.p)[i]);
    *route = h;
    return (op_read_scalar(fx->m.loss_sum) + fx->e.mb.T * op_read_scalar(fx->m.lb_sum)) / fx->targets;
}

// Central difference of J along direction v (over one tensor of n elements at w), shrinking the step
// when a perturbation changes a routing decision (top-k is not differentiable there).
static double fd_along(Fixture *fx, float *w, const float *v, int64_t n, uint64_t route0) {
    for (double eps = 1e-2; eps > 1e-4; eps /= 2) {
        uint64_t rp, rm;
        for (int64_t i = 0; i < n; i++) w[i] += (float)(eps * v[i]);
        double jp = objective(fx, &rp);
        for (int64_t i = 0; i < n; i++) w[i] -= (float)(2 * eps * v[i]);
        double jm = objective(fx, &rm);
        for (int64_t i = 0; i < n; i++) w[i] += (float)(eps * v[i]);
        if (rp == route0 && rm == route0) return (jp - jm) / (2 * eps);
    }
    test_fail(__FILE__, __LINE__, "routing flips under every finite-difference step");
}

static void gradcheck(const char *model_json, double lb_coef, LbForm form) {
    Fixture fx;
    fixture_make(&fx, model_json, lb_coef, form, 2, 8);
    Model *m = &fx.m;
    uint64_t route0;
    double J0 = objective(&fx, &route0);
    ASSERT(isfinite(J0));
    model_zero_grads(m);
    op_zero(m->loss_sum), op_zero(m->lb_sum);
    engine_forward(&fx.e, true);
    engine_backward(&fx.e);
    for (int g = 0; g < NGROUPS; g++) op_scale(m->g[g], 1.0f / fx.targets);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < m->params.n; i++) {
        const ParamInfo *p = &m->params.p[i];
        int64_t n = params_numel(p);
        float *w = (float *)m->w[p->group].p + p->off, *g = (float *)m->g[p->group].p + p->off, *v = xmalloc(n * sizeof(float));
        double norm = 0;
        for (int64_t j = 0; j < n; j++) norm += (double)g[j] * g[j];
        norm = sqrt(norm);
        ASSERT_MSG(norm > 0, "%s: zero gradient", p->name);
        for (int64_t j = 0; j < n; j++) v[j] = (float)(g[j] / norm);
        double fd = fd_along(&fx, w, v, n, route0), err = fabs(fd - norm) / norm;
        if (err > worst) worst = err, worst_name = p->name;
        ASSERT_MSG(err < 5e-3, "%s: |grad| = %.6g but finite differences give %.6g (rel err %.3g)", p->name, norm, fd, err);
        free(v);
    }
    printf("     gradcheck: %d tensors, worst relative error %.2e (%s)\n", m->params.n, worst, worst_name);
    engine_free(&fx.e);
    model_free(m);
}

static const char *config_a =
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 48, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 8, \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0}";
// Biases, a dense first layer, tied embeddings, no renormalisation, rope theta in rope_parameters.
static const char *config_b =
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 40, \"num_experts\": 4, \"num_experts_per_tok\": 3,"
    " \"moe_intermediate_size\": 6, \"intermediate_size\": 12, \"mlp_only_layers\": [0], \"norm_topk_prob\": false,"
    " \"attention_bias\": true, \"tie_word_embeddings\": true, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5e5}}";

TEST(model_gradcheck_qwen3_moe) { gradcheck(config_a, 0.0, LB_MICRO_BATCH); }
TEST(model_gradcheck_qwen3_moe_load_balance) { gradcheck(config_a, 0.05, LB_MICRO_BATCH); }
// The sequence form: each of the micro-batch's 2 sequences balanced on its own (DeepSeek-V2).
TEST(model_gradcheck_qwen3_moe_load_balance_sequence) { gradcheck(config_a, 0.05, LB_SEQUENCE); }
TEST(model_gradcheck_qwen3_moe_bias_dense_tied) { gradcheck(config_b, 0.0, LB_MICRO_BATCH); }

TEST(model_config_layers) {
    ModelConfig mc;
    model_config_load(&mc, write_file(test_tmpdir(), "config.json", config_b));
    ASSERT(!mc.is_moe[0] && mc.is_moe[1] && mc.tie_embed && mc.rope.theta == 5e5 && mc.rope.rd == 8);
    model_config_load(&mc, write_file(test_tmpdir(), "config.json", config_a));
    ASSERT(mc.is_moe[0] && mc.is_moe[1] && mc.rope.theta == 10000.0 && mc.heads == 4);
}
