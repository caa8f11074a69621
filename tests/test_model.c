// test_model.c — the whole Qwen3-MoE model on the CPU: the gradient of the training objective with
// respect to every parameter tensor against central finite differences, and a tiny model overfitting.
// Objective J = (Σ CE + T·Σ_layers lb) / N (N = target tokens): what the trainer differentiates.
#include "pipe/chunk.h"
#include "test.h"

typedef struct {
    Model m;
    Chunk e;
    StepSums st;
    int32_t tok[256], lab[256]; // B·S ≤ 256
    int targets;
} Fixture;

// With gradcheck_logits_rows, the epilog's logits hold that many rows (the LM head in several chunks).
static int gradcheck_logits_rows;

static void fixture_make(Fixture *fx, const char *model_json, double lb_coef, LbForm form, int B, int S) {
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, write_text(test_tmpdir(), "config.json", model_json));
    model_create(&fx->m, fam, &mc, DEV_CPU, DT_F32, S);
    fx->m.lb_coef = lb_coef;
    model_lb_setup(&fx->m, form, NULL, B * S);
    for (int g = 0; g < NGROUPS; g++) params_init(&fx->m.params, g, fx->m.w[g].p, 7, 0.2, mc.layers);
    // Norm weights away from 1 so their gradients are generic.
    for (int i = 0; i < fx->m.params.n; i++) {
        const ParamInfo *p = &fx->m.params.p[i];
        if (p->init == INIT_ONES || p->init == INIT_ZEROS)
            for (int64_t j = 0; j < params_numel(p); j++)
                ((float *)fx->m.w[p->group].p)[p->off + j] +=
                    (float)(0.3 * rng_normal(99, rng_hash_str(p->name), (uint64_t)j));
    }
    if (gradcheck_logits_rows) fx->m.logits_bytes = gradcheck_logits_rows * mc.vocab * (int64_t)sizeof(float);
    step_sums_create(&fx->st, &fx->m, true);
    chunk_init_model(&fx->e, &fx->m, &fx->st, B, S);
    ASSERT(fx->e.rec[0].epilog.logits.n[0] == (gradcheck_logits_rows ? gradcheck_logits_rows : B * S));
    fx->targets = 0;
    for (int t = 0; t < B * S; t++) {
        fx->tok[t] = (int32_t)(rng_u64(5, 1, t) % mc.vocab);
        fx->lab[t] = t % 7 == 3 ? -100 : (int32_t)(rng_u64(5, 2, t) % mc.vocab);
        fx->targets += fx->lab[t] != -100;
    }
    chunk_load(&fx->e, 0, fx->tok, fx->lab);
}

// J at the current weights; *route gets a hash of every routing decision.
static double objective(Fixture *fx, uint64_t *route) {
    step_sums_begin(&fx->st, &fx->m);
    chunk_forward(&fx->e, 0, false);
    uint64_t h = 0;
    for (int l = 0; l < fx->m.cfg.layers; l++)
        for (int64_t i = 0; fx->m.cfg.is_moe[l] && i < tensor_numel(fx->e.rec[0].io[l].idx); i++)
            h = rng_mix(h ^ (uint64_t)((int32_t *)fx->e.rec[0].io[l].idx.p)[i]);
    *route = h;
    return (op_read_scalar(fx->st.loss_sum) + fx->e.rec[0].mb.T * op_read_scalar(fx->st.lb_sum)) / fx->targets;
}

// With gradcheck_settle (a family whose objective curves strongly), the step halves until two successive central
// differences agree to 3e-3 (or to SETTLE_FLOOR, the fp32 noise of a difference quotient at the largest step) and
// the smaller one is taken; otherwise the first step without a routing flip is.
bool gradcheck_settle;
#define SETTLE_FLOOR 1e-6

// Central difference of J along direction v (over one tensor of n elements at w), shrinking the step
// when a perturbation changes a routing decision (top-k is not differentiable there).
static double fd_along(Fixture *fx, float *w, const float *v, int64_t n, uint64_t route0) {
    double prev = NAN;
    for (double eps = 1e-2; eps > 1e-5; eps /= 2) {
        uint64_t rp, rm;
        for (int64_t i = 0; i < n; i++) w[i] += (float)(eps * v[i]);
        double jp = objective(fx, &rp);
        for (int64_t i = 0; i < n; i++) w[i] -= (float)(2 * eps * v[i]);
        double jm = objective(fx, &rm);
        for (int64_t i = 0; i < n; i++) w[i] += (float)(eps * v[i]);
        if (rp != route0 || rm != route0) continue;
        double fd = (jp - jm) / (2 * eps);
        if (!gradcheck_settle || fabs(fd - prev) <= 3e-3 * fabs(fd) + SETTLE_FLOOR) return fd;
        prev = fd;
    }
    test_fail(__FILE__, __LINE__, "routing flips under every finite-difference step, or the differences never settle");
}

// S: tokens per sequence of the 2 sequences (more when the routing needs more tokens to reach every expert).
void gradcheck_seq(const char *model_json, double lb_coef, LbForm form, int S) {
    Fixture fx;
    fixture_make(&fx, model_json, lb_coef, form, 2, S);
    Model *m = &fx.m;
    uint64_t route0;
    double J0 = objective(&fx, &route0);
    ASSERT(isfinite(J0));
    model_zero_grads(m);
    step_sums_begin(&fx.st, m);
    chunk_forward(&fx.e, 0, true);
    chunk_backward(&fx.e, 0, false);
    for (int g = 0; g < NGROUPS; g++) op_scale(m->g[g], 1.0f / fx.targets);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < m->params.n; i++) {
        const ParamInfo *p = &m->params.p[i];
        int64_t n = params_numel(p);
        float *w = (float *)m->w[p->group].p + p->off, *g = (float *)m->g[p->group].p + p->off,
              *v = xmalloc(n * sizeof(float));
        double norm = 0;
        for (int64_t j = 0; j < n; j++) norm += (double)g[j] * g[j];
        norm = sqrt(norm);
        if (norm == 0) { // an expert no token reached: the objective must not change along a random direction either
            double vn = 0;
            for (int64_t j = 0; j < n; j++)
                v[j] = (float)rng_normal(17, rng_hash_str(p->name), (uint64_t)j), vn += (double)v[j] * v[j];
            for (int64_t j = 0; j < n; j++) v[j] = (float)(v[j] / sqrt(vn));
            double fd = fd_along(&fx, w, v, n, route0);
            ASSERT_MSG(fabs(fd) < 1e-4, "%s: zero gradient but finite differences give %.3g", p->name, fd);
            free(v);
            continue;
        }
        for (int64_t j = 0; j < n; j++) v[j] = (float)(g[j] / norm);
        double fd = fd_along(&fx, w, v, n, route0), err = fabs(fd - norm) / norm;
        if (err > worst) worst = err, worst_name = p->name;
        ASSERT_MSG(fabs(fd - norm) < 5e-3 * norm + (gradcheck_settle ? SETTLE_FLOOR : 0),
                   "%s: |grad| = %.6g but finite differences give %.6g (rel err %.3g)", p->name, norm, fd, err);
        free(v);
    }
    printf("     gradcheck: %d tensors, worst relative error %.2e (%s)\n", m->params.n, worst, worst_name);
    chunk_free(&fx.e), step_sums_free(&fx.st);
    model_free(m);
}

static void gradcheck(const char *model_json, double lb_coef, LbForm form) {
    gradcheck_seq(model_json, lb_coef, form, 8);
}

static const char *config_a = TINY_MOE_A;
static const char *config_b = TINY_MOE_B;

TEST(model_gradcheck_qwen3_moe) { gradcheck(config_a, 0.0, LB_MICRO_BATCH); }
TEST(model_gradcheck_qwen3_moe_load_balance) { gradcheck(config_a, 0.05, LB_MICRO_BATCH); }
// The sequence form: each of the micro-batch's 2 sequences balanced on its own (DeepSeek-V2).
TEST(model_gradcheck_qwen3_moe_load_balance_sequence) { gradcheck(config_a, 0.05, LB_SEQUENCE); }
TEST(model_gradcheck_qwen3_moe_bias_dense_tied) { gradcheck(config_b, 0.0, LB_MICRO_BATCH); }
// The epilog over 3 row chunks (6, 6, 4 of the 16 tokens: rows for 6 at a time), the LM head's gradient written by the
// first and added by the others.
TEST(model_gradcheck_qwen3_moe_logits_chunks) {
    gradcheck_logits_rows = 6;
    gradcheck(config_a, 0.0, LB_MICRO_BATCH);
    gradcheck_logits_rows = 0;
}

// model_zero_grads zeroes the expert group only once: each later step's first weight gradient writes every
// expert's gradient, an expert no row reached included; and it leaves the LM head's gradient to the epilog's first
// product. A backward over poisoned (NaN) gradients must give the bits of one over zeros; one token top-2 of 4 leaves
// experts empty in each layer.
TEST(model_grads_written_over_stale) {
    Fixture fx;
    fixture_make(&fx, config_a, 0.0, LB_MICRO_BATCH, 1, 1);
    Model *m = &fx.m;
    ASSERT(!m->cfg.tie_embed);
    int64_t n = tensor_numel(m->g[GROUP_EXPERT]), nd = tensor_numel(m->g[GROUP_DENSE]);
    float *g = m->g[GROUP_EXPERT].p, *ref = xmalloc(n * sizeof(float));
    float *gd = m->g[GROUP_DENSE].p, *refd = xmalloc(nd * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            for (int64_t j = 0; j < n + nd; j++) (j < n ? g : gd)[j < n ? j : j - n] = NAN; // last step's, poisoned
        model_zero_grads(m);
        ASSERT(m->head_unwritten == (pass > 0)); // the first call zeroes everything
        step_sums_begin(&fx.st, m);
        chunk_forward(&fx.e, 0, true);
        chunk_backward(&fx.e, 0, false);
        if (!pass) memcpy(ref, g, n * sizeof(float)), memcpy(refd, gd, nd * sizeof(float));
    }
    ASSERT(memcmp(ref, g, n * sizeof(float)) == 0 && memcmp(refd, gd, nd * sizeof(float)) == 0);
    free(refd);
    int empty = 0;
    for (int i = 0; i < m->params.n; i++) {
        const ParamInfo *p = &m->params.p[i];
        bool zero = p->group == GROUP_EXPERT;
        for (int64_t j = 0; zero && j < params_numel(p); j++) zero = g[p->off + j] == 0;
        empty += zero;
    }
    ASSERT_MSG(empty > 0, "no expert was left without rows: the test does not reach the empty-expert case");
    free(ref);
    chunk_free(&fx.e), step_sums_free(&fx.st);
    model_free(m);
}

TEST(model_config_layers) {
    ModelConfig mc;
    model_config_load(&mc, write_text(test_tmpdir(), "config.json", config_b));
    ASSERT(!mc.is_moe[0] && mc.is_moe[1] && mc.tie_embed && mc.rope.theta == 5e5 && mc.rope.rd == 8);
    model_config_load(&mc, write_text(test_tmpdir(), "config.json", config_a));
    ASSERT(mc.is_moe[0] && mc.is_moe[1] && mc.rope.theta == 10000.0 && mc.heads == 4);
}

// ---- DeepSeek-V2 ----

// MLA with a q LoRA, attention biases, YaRN (attention factor ≠ 1, so the softmax mscale too), group-limited
// routing with routed_scaling_factor, 2 shared experts, a dense first layer; q head 12 ≠ v head 6.
static const char *config_dsv2 =
    "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 2,"
    " \"q_lora_rank\": 10, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6,"
    " \"vocab_size\": 40, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 6,"
    " \"n_shared_experts\": 2, \"intermediate_size\": 12, \"first_k_dense_replace\": 1, \"topk_method\": "
    "\"group_limited_greedy\","
    " \"n_group\": 4, \"topk_group\": 2, \"routed_scaling_factor\": 1.5, \"max_position_embeddings\": 64,"
    " \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0, "
    "\"original_max_position_embeddings\": 4,"
    " \"mscale\": 1.0, \"mscale_all_dim\": 0.5}}";
// Like V2-Lite: q_proj, greedy, default RoPE (transformers v4 spelling: top-level rope_theta), tied embeddings.
static const char *config_dsv2_lite =
    "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"q_lora_rank\": null, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"
    " \"vocab_size\": 40, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 6,"
    " \"n_shared_experts\": 1, \"intermediate_size\": 12, \"first_k_dense_replace\": 1, \"topk_method\": \"greedy\","
    " \"tie_word_embeddings\": true, \"attention_bias\": true, \"rope_theta\": 5e5, \"rope_scaling\": null}";

TEST(model_gradcheck_deepseek_v2) { gradcheck_seq(config_dsv2, 0.0, LB_MICRO_BATCH, 16); }
TEST(model_gradcheck_deepseek_v2_load_balance_sequence) { gradcheck_seq(config_dsv2, 0.05, LB_SEQUENCE, 16); }
TEST(model_gradcheck_deepseek_v2_lite) { gradcheck_seq(config_dsv2_lite, 0.05, LB_MICRO_BATCH, 12); }

// DeepSeek-V3's router scores (scoring_func sigmoid) in both families, with load balancing on the sigmoid scores.
static const char *with_sigmoid(const char *json) {
    static char b[4096];
    snprintf(b, sizeof b, "{\"scoring_func\": \"sigmoid\", %s", json + 1);
    return b;
}
TEST(model_gradcheck_qwen3_moe_sigmoid_router) { gradcheck(with_sigmoid(config_a), 0.05, LB_MICRO_BATCH); }
TEST(model_gradcheck_deepseek_v2_sigmoid_router) { gradcheck_seq(with_sigmoid(config_dsv2), 0.05, LB_SEQUENCE, 8); }

TEST(model_config_deepseek_v2) {
    ModelConfig mc;
    model_config_load(&mc, write_text(test_tmpdir(), "config.json", config_dsv2));
    ASSERT(!mc.is_moe[0] && mc.is_moe[1] && mc.is_moe[2] && mc.experts == 8 && mc.rope.rd == 4 && mc.rope.yarn &&
           mc.rope.factor == 4);
    model_config_load(&mc, write_text(test_tmpdir(), "config.json", config_dsv2_lite));
    ASSERT(!mc.is_moe[0] && mc.is_moe[1] && !mc.rope.yarn && mc.rope.theta == 5e5 && mc.tie_embed);
    // A bad field stops `pith convert` (which reads the config first) with one line naming file and key.
    static const struct {
        const char *edit, *needle;
    } bad[] = {
        {"\"topk_method\": \"noaux_tc\"", "config.json: topk_method: 'noaux_tc' is not supported"},
        {"\"n_group\": 3", "config.json: n_group: must divide n_routed_experts (8)"},
        {"\"topk_group\": 5", "config.json: topk_group: must be in [1, n_group = 4]"},
        {"\"num_experts_per_tok\": 5", "config.json: num_experts_per_tok: must be at most topk_group"},
        {"\"num_key_value_heads\": 1", "config.json: num_key_value_heads: must equal num_attention_heads"},
        {"\"scoring_func\": \"tanh\"", "config.json: scoring_func: must be softmax or sigmoid (got 'tanh')"},
        {"\"kv_lora_rank\": 0", "must be valid sizes"},
        {"\"rope_parameters\": {\"rope_type\": \"longrope\"}",
         "config.json: rope_parameters.rope_type: 'longrope' is not supported for deepseek_v2"},
        {"\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}",
         "rope_parameters.original_max_position_embeddings: missing required key"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *d = test_tmpdir();
        char text[256], out[1024];
        snprintf(text, sizeof text, "{%s}", bad[i].edit);
        json_t *cfg = json_loads(config_dsv2, 0, NULL), *edit = json_loads(text, 0, NULL);
        ASSERT(cfg && edit && !json_object_update(cfg, edit));
        char *js = json_dumps(cfg, 0);
        write_text(d, "config.json", js);
        free(js), json_decref(cfg), json_decref(edit);
        int rc = run_cmd(out, sizeof out, "%s convert hf2pith %s %s/out", PITH_BIN, d, d);
        ASSERT_MSG(rc == 1 && strstr(out, bad[i].needle) && strchr(out, '\n') == out + strlen(out) - 1, "%s: %s",
                   bad[i].edit, out);
    }
}

// HF parity (tests/hf/<fixture>, transformers 5.17 DeepseekV2ForCausalLM in fp64, tests/hf/make_fixtures.py):
// the eval loss within 1e-5 relative, and 5 AdamW steps of loss and pre-clip grad norm within 1e-4.
void hf_parity(const char *fix) {
    char out[16384], path[512];
    int S = (int)hf_expected(fix, "sequence_length", -1), B = (int)hf_expected(fix, "batch", -1);
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s --data %s/tokens.bin --seq %d --batch %d", PITH_BIN, fix, fix,
                   S, B) == 0);
    const char *p = strstr(out, "loss ");
    ASSERT_MSG(p, "%s", out);
    double got = strtod(p + 5, NULL), want = hf_expected(fix, "loss", -1), worst = 0;
    printf("     eval loss %.10f vs transformers %.10f (rel %.2e)\n", got, want, fabs(got - want) / want);
    ASSERT(fabs(got - want) <= 1e-5 * want);
    const char *d = test_tmpdir();
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s", PITH_BIN, fix, d) == 0);
    snprintf(path, sizeof path, "%s/metrics.jsonl", d);
    FILE *f = fopen(path, "r");
    ASSERT(f);
    char line[4096];
    for (int s = 0; s < 5; s++) {
        ASSERT(fgets(line, sizeof line, f));
        const char *l = strstr(line, "\"loss\": "), *g = strstr(line, "\"grad_norm\": ");
        ASSERT_MSG(l && g, "%s", line);
        double lv = strtod(l + 8, NULL), gv = strtod(g + 13, NULL), el = hf_expected(fix, "loss", s),
               eg = hf_expected(fix, "grad_norm", s);
        double e = fmax(fabs(lv - el) / el, fabs(gv - eg) / eg);
        worst = fmax(worst, e);
        ASSERT_MSG(e <= 1e-4, "step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g", s + 1, lv, el, gv, eg);
    }
    fclose(f);
    printf("     5 AdamW steps: worst relative difference %.2e\n", worst);
}

TEST(hf_parity_deepseek_v2) { hf_parity("tests/hf/deepseek_v2"); }
TEST(hf_parity_deepseek_v2_lite) { hf_parity("tests/hf/deepseek_v2_lite"); }

// `pith convert` of DeepSeek-V2 folders: hf2pith then pith2hf gives the fixture's tensors bit for bit, and a
// folder holding each layer's experts grouped (mlp.experts.gate_up_proj (E, 2I, H), down_proj (E, H, I), as
// transformers keeps them in memory) imports to the same checkpoint as the per-expert one transformers writes.
TEST(convert_deepseek_v2_round_trip_and_grouped_experts) {
    const char *fix = "tests/hf/deepseek_v2", *d = test_tmpdir();
    char out[8192], a[512], b[640];
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith %s %s/ck && %s convert pith2hf %s/ck %s/hf", PITH_BIN, fix, d,
                   PITH_BIN, d, d) == 0);
    StSet x, y;
    snprintf(a, sizeof a, "%s/hf", d);
    st_set_open_or_die(&x, fix), st_set_open_or_die(&y, a);
    ASSERT(x.n == y.n);
    for (int i = 0; i < x.n; i++) {
        const StTensor *t = st_set_find(&y, x.t[i]->name);
        ASSERT_MSG(t && t->dt == x.t[i]->dt && t->bytes == x.t[i]->bytes && !memcmp(t->data, x.t[i]->data, t->bytes),
                   "%s", x.t[i]->name);
    }
    st_set_close(&y);
    // the grouped folder, made from the fixture's per-expert tensors
    ModelConfig mc;
    model_config_load(&mc, fix);
    int64_t E = mc.experts, H = mc.hidden, I = mc.moe_inter;
    snprintf(a, sizeof a, "%s/grouped", d);
    mkdir_p(a);
    StWriter w;
    st_writer_init(&w);
    float *bufs[2 * MAX_LAYERS] = {0};
    for (int i = 0; i < x.n; i++)
        if (!strstr(x.t[i]->name, ".mlp.experts."))
            st_writer_add_raw(&w, x.t[i]->name, x.t[i]->dt, x.t[i]->nd, x.t[i]->shape, x.t[i]->data);
    for (int l = 0; l < mc.layers; l++) {
        if (!mc.is_moe[l]) continue;
        float *gu = bufs[2 * l] = xmalloc(E * 2 * I * H * sizeof(float)),
              *dn = bufs[2 * l + 1] = xmalloc(E * H * I * sizeof(float));
        for (int64_t e = 0; e < E; e++) {
            static const char *const part[] = {"gate", "up", "down"};
            for (int j = 0; j < 3; j++) {
                char n[160];
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.%s_proj.weight", l, (long long)e, part[j]);
                const StTensor *t = st_set_find(&x, n);
                ASSERT_MSG(t && t->dt == ST_F32, "%s", n);
                memcpy(j < 2 ? gu + (e * 2 + j) * I * H : dn + e * H * I, t->data, t->bytes);
            }
        }
        char n[160];
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
        st_writer_add_raw(&w, n, ST_F32, 3, (int64_t[]){E, 2 * I, H}, gu);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
        st_writer_add_raw(&w, n, ST_F32, 3, (int64_t[]){E, H, I}, dn);
    }
    snprintf(b, sizeof b, "%s/model.safetensors", a);
    st_writer_write(&w, b);
    st_writer_free(&w), st_set_close(&x);
    for (int l = 0; l < 2 * MAX_LAYERS; l++) free(bufs[l]);
    ASSERT(run_cmd(out, sizeof out,
                   "cp %s/config.json %s/ && %s convert hf2pith %s %s/ck2 && cmp %s/ck/model.safetensors "
                   "%s/ck2/model.safetensors",
                   fix, a, PITH_BIN, a, d, d, d) == 0);
    // grouped experts for the dense layer 0 are no parameters: an error naming the tensor, no output
    StSet g;
    st_set_open_or_die(&g, a);
    st_writer_init(&w);
    for (int i = 0; i < g.n; i++)
        st_writer_add_raw(&w, g.t[i]->name, g.t[i]->dt, g.t[i]->nd, g.t[i]->shape, g.t[i]->data);
    const StTensor *t = st_set_find(&g, "model.layers.1.mlp.experts.down_proj");
    st_writer_add_raw(&w, "model.layers.0.mlp.experts.down_proj", t->dt, t->nd, t->shape, t->data);
    snprintf(b, sizeof b, "%s/bad", d);
    mkdir_p(b);
    snprintf(a, sizeof a, "%s/bad/model.safetensors", d);
    st_writer_write(&w, a);
    st_writer_free(&w), st_set_close(&g);
    ASSERT(run_cmd(out, sizeof out, "cp %s/config.json %s/ && %s convert hf2pith %s %s/ck3", fix, b, PITH_BIN, b, d) ==
           1);
    ASSERT_MSG(
        strstr(out, "tensor 'model.layers.0.mlp.experts.down_proj' is not a parameter of this deepseek_v2 model"), "%s",
        out);
    snprintf(a, sizeof a, "%s/ck3", d);
    ASSERT(!path_exists(a));
}
