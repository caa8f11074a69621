// qwen3_moe.c — the Qwen3-MoE family (Qwen/Qwen3-30B-A3B, -235B-A22B) in the 5-stage protocol.
// Layer: x → RMSNorm → GQA attention (q/k RMSNorm per head before rotate-half RoPE, causal, scale d^-½)
// → + x = h1 → RMSNorm = n2 → router (softmax over E in fp32, top-k, renormalised if norm_topk_prob)
// → experts down(silu(gate(n2))·up(n2)) → Σ_j w_j·expert_j + h1. Layers listed in mlp_only_layers or
// off the decoder_sparse_step grid use a dense SwiGLU MLP instead. Shapes: T = B·S tokens, H hidden,
// nh/nkv heads of d, E experts, k per token, I expert width.
// The embedding, stage 3 (experts or dense MLP), stage 5 and the epilog are the shared ones (moe.c).
#include <math.h>

#include "model/model.h"

typedef struct {
    int kv_heads, head_dim;
    bool norm_topk, attn_bias;
} Qwen3Config;
MODEL_FAMILY_CONFIG_FITS(Qwen3Config);

typedef struct {
    Tensor ln1, ln2, router;
    GqaWeights att;
} Qwen3Layer;

typedef struct {
    Qwen3Layer w[MAX_LAYERS], g[MAX_LAYERS]; // compute weights and fp32 gradients, views into the flat group buffers
} Qwen3Views;

typedef struct {
    MlpRec mlp;           // stage 3 and 5 (h1: the residual stream after attention)
    Tensor x;             // (T, H) layer input (owned by the previous layer)
    Tensor n1, rstd1;     // (T, H), (T)
    GqaRec att;           // attention (q/k norm, RoPE)
    Tensor n2, rstd2;     // (T, H) post-attention norm (= the tokens to dispatch), (T)
    Tensor logits, probs; // (T, E) router logits and softmax
    Tensor lb_grad;       // (B, E) load-balancing gradient w.r.t. probs (model_lb_loss)
    // backward workspace
    Tensor dh1, dn1, dlogits;
} Qwen3Rec;

static const Tensor NONE = {0};

// ---- config and parameters ----

static void qwen3_config_parse(ModelConfig *c, JObj o) {
    Qwen3Config *q = model_family_config(Qwen3Config, c);
    c->hidden = jint_in(o, "hidden_size", true, 0, 1, 1 << 30); // read into range: a cast would truncate
    c->layers = jint_in(o, "num_hidden_layers", true, 0, 1, 1 << 30);
    c->heads = jint_in(o, "num_attention_heads", true, 0, 1, 1 << 30);
    q->kv_heads = jint_in(o, "num_key_value_heads", false, c->heads, 1, 1 << 30);
    q->head_dim = jint_in(o, "head_dim", false, c->hidden / c->heads, 1, 1 << 30);
    c->vocab = jint_in(o, "vocab_size", true, 0, 1, 1 << 30);
    c->eps = jnum(o, "rms_norm_eps", false, 1e-6);
    // transformers v5 writes num_local_experts; v4 and the hub configs num_experts
    c->experts = jhas(o, "num_experts") ? jint_in(o, "num_experts", true, 0, 1, 1 << 20)
                                        : jint_in(o, "num_local_experts", true, 0, 1, 1 << 20);
    c->topk = jint_in(o, "num_experts_per_tok", true, 0, 0, 1 << 20);
    c->moe_inter = jint_in(o, "moe_intermediate_size", true, 0, 0, 1 << 30);
    c->dense_inter = jint_in(o, "intermediate_size", false, 0, 0, 1 << 30);
    q->norm_topk = jbool(o, "norm_topk_prob", false, false);
    q->attn_bias = jbool(o, "attention_bias", false, false);
    c->tie_embed = jbool(o, "tie_word_embeddings", false, false);
    if (jbool(o, "use_sliding_window", false, false))
        jdie(o, "use_sliding_window", "sliding-window attention is not supported for qwen3_moe");
    if (q->kv_heads <= 0 || q->head_dim <= 0) jdie(o, NULL, "num_key_value_heads and head_dim must be positive");
    if (c->heads > 0 && c->heads % q->kv_heads)
        jdie(o, "num_key_value_heads", "must divide num_attention_heads (%d)", c->heads);
    if (q->head_dim % 2) jdie(o, "head_dim", "must be even for RoPE");
    moe_rope_parse(c, o, q->head_dim, false);
    c->ring.nh = c->heads, c->ring.nkv = q->kv_heads, c->ring.dqk = c->ring.dv = q->head_dim;
    int layers = c->layers < 0 ? 0 : c->layers > MAX_LAYERS ? MAX_LAYERS : c->layers;
    int step = jint_in(o, "decoder_sparse_step", false, 1, 1, 1 << 30);
    if (step < 1) jdie(o, "decoder_sparse_step", "must be at least 1");
    for (int l = 0; l < layers; l++) c->is_moe[l] = (l + 1) % step == 0;
    json_t *mlp_only = json_object_get(o.obj, "mlp_only_layers");
    if (mlp_only && !json_is_null(mlp_only)) {
        if (!json_is_array(mlp_only)) jdie(o, "mlp_only_layers", "expected an array of layer indices");
        size_t i;
        json_t *v;
        json_array_foreach(mlp_only, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= layers)
                jdie(o, "mlp_only_layers", "entry %zu is not a layer index in [0, %d)", i, layers);
            c->is_moe[json_integer_value(v)] = false;
        }
    }
    moe_config_check(c, o, "num_experts");
}

// Attention: q/k norm, biases when attention_bias.
static GqaShape qwen3_gqa(const ModelConfig *c) {
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    return (GqaShape){.nh = c->heads, .nkv = q->kv_heads, .d = q->head_dim, .qk_norm = QK_NORM_W, .bias = q->attn_bias};
}

static void qwen3_params_build(ParamTable *t, const ModelConfig *c) {
    int64_t H = c->hidden;
    GqaShape shape = qwen3_gqa(c);
    moe_params_embed(t, c);
    for (int l = 0; l < c->layers; l++) {
        params_add_layer(t, l, "input_layernorm.weight", INIT_ONES, 1, H, 0);
        gqa_params(t, &shape, l, H);
        params_add_layer(t, l, "post_attention_layernorm.weight", INIT_ONES, 1, H, 0);
        if (c->is_moe[l]) params_add_layer(t, l, "mlp.gate.weight", INIT_NORMAL, 2, c->experts, H);
        moe_params_mlp(t, c, l);
    }
    moe_params_head(t, c);
}

static void bind_layers(Model *m, Tensor *flat, Qwen3Layer *w) {
    const ModelConfig *c = &m->cfg;
    GqaShape shape = qwen3_gqa(c);
    for (int l = 0; l < c->layers; l++) {
        w[l].ln1 = model_view_layer(m, flat, l, "input_layernorm.weight", 1, c->hidden, 0);
        gqa_bind(m, flat, &shape, l, &w[l].att);
        w[l].ln2 = model_view_layer(m, flat, l, "post_attention_layernorm.weight", 1, c->hidden, 0);
        w[l].router = model_view_layer(m, flat, l, "mlp.gate.weight", 2, c->experts, c->hidden);
    }
}

static void qwen3_bind(Model *m) {
    Qwen3Views *v = m->views = m->views ? m->views : xcalloc(1, sizeof(Qwen3Views));
    moe_bind(m);
    bind_layers(m, m->w, v->w);
    bind_layers(m, m->g, v->g);
}

// The FP8 projections (Fp8Slot): attention's q, k, v, o.
static Tensor qwen3_fp8_weight(const Model *m, int l, Fp8Slot s) {
    return gqa_fp8_weight(&((const Qwen3Views *)m->views)->w[l].att, s);
}

// ---- records ----

static void qwen3_layer_alloc(Model *m, int l, void *rp, Arena *a, int B, int S, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    Qwen3Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, E = c->experts;
    DType dt = m->cdt;
    GqaShape shape = qwen3_gqa(c);
    memset(r, 0, sizeof *r);
    r->n1 = arena_tensor(a, dt, 2, T, H, 0, 0);
    r->rstd1 = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    gqa_alloc(&r->att, &shape, a, dt, B, S);
    r->mlp.h1 = arena_tensor(a, dt, 2, T, H, 0, 0);
    r->n2 = arena_tensor(a, dt, 2, T, H, 0, 0);
    r->rstd2 = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    io->xd = r->n2;
    if (io->dense) return;
    r->logits = arena_tensor(a, DT_F32, 2, T, E, 0, 0);
    r->probs = arena_tensor(a, DT_F32, 2, T, E, 0, 0);
    r->lb_grad = arena_tensor(a, DT_F32, 2, B, E, 0, 0);
}

static void qwen3_layer_grad_alloc(Model *m, int l, void *rp, Arena *ws, int B, int S, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    Qwen3Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden;
    GqaShape shape = qwen3_gqa(c);
    r->dh1 = arena_tensor(ws, m->cdt, 2, T, H, 0, 0);
    r->dn1 = arena_tensor(ws, m->cdt, 2, T, H, 0, 0);
    gqa_grad_alloc(&r->att, &shape, ws, m->cdt, B, S);
    if (!io->dense) r->dlogits = arena_tensor(ws, DT_F32, 2, T, c->experts, 0, 0);
}

// ---- stage 1: norm → attention → residual → norm → router ----

// Causal attention scaled by 1/√d; softmax → top-k routing, renormalised when norm_topk_prob.
static AttnArgs qwen3_attn_args(const Model *m, const MicroBatch *mb) {
    return (AttnArgs){.B = mb->B,
                      .scale = (float)(1.0 / sqrt((double)model_family_config(const Qwen3Config, &m->cfg)->head_dim)),
                      .causal = true,
                      .deterministic = m->deterministic};
}
static RouterArgs qwen3_router_args(const Model *m) {
    return (RouterArgs){.k = m->cfg.topk,
                        .renorm = model_family_config(const Qwen3Config, &m->cfg)->norm_topk,
                        .scale = 1,
                        .force_balance = m->force_balance};
}

static void qwen3_stage1_forward(Model *m, int l, void *rp, MicroBatch *mb, Tensor x, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w[l];
    Qwen3Rec *r = rp;
    int64_t T = mb->T;
    Tensor h1 = r->mlp.h1;
    GqaShape shape = qwen3_gqa(c);
    r->x = x;
    op_rmsnorm_forward(r->n1, r->rstd1, x, W->ln1, (float)c->eps, NULL);
    gqa_forward(m, l, &shape, &W->att, &r->att, mb, r->n1, h1, qwen3_attn_args(m, mb));
    op_add(h1, x);
    op_rmsnorm_forward(r->n2, r->rstd2, h1, W->ln2, (float)c->eps, NULL);
    if (io->dense) return;
    op_linear_forward(r->logits, r->n2, W->router, NONE);
    model_router_forward(m, mb, l, r->probs, io->idx, io->w, r->logits, qwen3_router_args(m));
    // The load-balancing term enters the objective as lb·T per micro-batch (docs/reference.md §1), so its gradient
    // w.r.t. probs is scaled by T here; the engine divides all gradients by the step's token count.
    if (m->lb_coef > 0) model_lb_loss(m, mb, l, r->lb_grad, r->probs, io->idx, (float)T);
}

// ---- stage 1 backward: router → post-attention norm → residual → attention → input norm ----
// dout: ∂/∂(layer output) (its residual path reaches h1 directly); dx: ∂/∂(layer input), written.
static void qwen3_stage1_backward(Model *m, int l, void *rp, MicroBatch *mb, StageIO *io, Tensor dout, Tensor dx) {
    const ModelConfig *c = &m->cfg;
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w[l], *G = &((Qwen3Views *)m->views)->g[l];
    Qwen3Rec *r = rp;
    Tensor dn2 = io->dxd; // gradient of the dispatched tokens, from stage 2's backward
    if (!io->dense) {
        RouterArgs ra = qwen3_router_args(m);
        model_router_backward(m, r->dlogits, io->dw, m->lb_coef > 0 ? r->lb_grad : NONE, r->probs, io->idx, io->w, &ra,
                              mb->B);
        op_linear_backward_input(dn2, r->dlogits, W->router, true);
        op_linear_backward_weight(G->router, NONE, r->dlogits, r->n2);
    }
    op_copy(r->dh1, dout);
    op_rmsnorm_backward(r->dh1, G->ln2, dn2, r->mlp.h1, W->ln2, r->rstd2, true, NULL);
    GqaShape shape = qwen3_gqa(c);
    gqa_backward(m, l, &shape, &W->att, &G->att, &r->att, mb, r->n1, r->dh1, r->dn1, qwen3_attn_args(m, mb));
    op_copy(dx, r->dh1);
    op_rmsnorm_backward(dx, G->ln1, r->dn1, r->x, W->ln1, r->rstd1, true, NULL);
}

const ModelFamily qwen3_moe_family = {
    .model_type = "qwen3_moe",
    .rec_size = sizeof(Qwen3Rec),
    .epilog_size = sizeof(EpilogRec),
    .config_parse = qwen3_config_parse,
    .params_build = qwen3_params_build,
    .bind = qwen3_bind,
    .fp8_weight = qwen3_fp8_weight,
    .layer_alloc = qwen3_layer_alloc,
    .layer_grad_alloc = qwen3_layer_grad_alloc,
    .stage3_alloc = moe_stage3_alloc,
    .stage3_grad_alloc = moe_stage3_grad_alloc,
    .prolog_forward = moe_prolog_forward,
    .prolog_backward = moe_prolog_backward,
    .stage1_forward = qwen3_stage1_forward,
    .stage3_forward = moe_stage3_forward,
    .stage5_forward = moe_stage5_forward,
    .stage5_backward = moe_stage5_backward,
    .stage3_backward_input = moe_stage3_backward_input,
    .stage3_backward_weight = moe_stage3_backward_weight,
    .stage1_backward = qwen3_stage1_backward,
    .epilog_alloc = moe_epilog_alloc,
    .epilog_forward = moe_epilog_forward,
    .epilog_backward = moe_epilog_backward,
    .logits = moe_logits,
};
