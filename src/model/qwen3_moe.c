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
    Tensor ln1, wq, bq, wk, bk, wv, bv, wo, bo, qn, kn, ln2, router;
} Qwen3Layer;

typedef struct {
    Qwen3Layer w[MAX_LAYERS], g[MAX_LAYERS]; // compute weights and fp32 gradients, views into the flat group buffers
} Qwen3Views;

typedef struct {
    MlpRec mlp;           // stage 3 and 5 (h1: the residual stream after attention)
    Tensor x;             // (T, H) layer input (owned by the previous layer)
    Tensor n1, rstd1;     // (T, H), (T)
    Tensor qp, kp;        // (T, nh, d), (T, nkv, d) projections before the q/k norm
    Tensor rq, rk;        // (T·nh), (T·nkv) rstd of the q/k norm
    Tensor q, k, v;       // after norm and RoPE; v: (T, nkv, d)
    Tensor att, lse;      // (T, nh, d), (B, nh, S)
    Tensor n2, rstd2;     // (T, H) post-attention norm (= the tokens to dispatch), (T)
    Tensor logits, probs; // (T, E) router logits and softmax
    Tensor lb_grad;       // (B, E) load-balancing gradient w.r.t. probs (model_lb_loss)
    // backward workspace
    Tensor dh1, dn1, dqp, dkp, dq, dk, dv, datt, dlogits;
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

static void qwen3_params_build(ParamTable *t, const ModelConfig *c) {
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    int64_t H = c->hidden, d = q->head_dim, nh = c->heads, nkv = q->kv_heads;
    moe_params_embed(t, c);
    for (int l = 0; l < c->layers; l++) {
#define P(suffix, init, nd, a, b) params_add_layer(t, l, suffix, init, nd, a, b)
        P("input_layernorm.weight", INIT_ONES, 1, H, 0);
        P("self_attn.q_proj.weight", INIT_NORMAL, 2, nh * d, H);
        P("self_attn.k_proj.weight", INIT_NORMAL, 2, nkv * d, H);
        P("self_attn.v_proj.weight", INIT_NORMAL, 2, nkv * d, H);
        P("self_attn.o_proj.weight", INIT_NORMAL_OUT, 2, H, nh * d);
        if (q->attn_bias) {
            P("self_attn.q_proj.bias", INIT_ZEROS, 1, nh * d, 0);
            P("self_attn.k_proj.bias", INIT_ZEROS, 1, nkv * d, 0);
            P("self_attn.v_proj.bias", INIT_ZEROS, 1, nkv * d, 0);
            P("self_attn.o_proj.bias", INIT_ZEROS, 1, H, 0);
        }
        P("self_attn.q_norm.weight", INIT_ONES, 1, d, 0);
        P("self_attn.k_norm.weight", INIT_ONES, 1, d, 0);
        P("post_attention_layernorm.weight", INIT_ONES, 1, H, 0);
        if (c->is_moe[l]) P("mlp.gate.weight", INIT_NORMAL, 2, c->experts, H);
#undef P
        moe_params_mlp(t, c, l);
    }
    moe_params_head(t, c);
}

static void bind_layers(Model *m, Tensor *flat, Qwen3Layer *w) {
    const ModelConfig *c = &m->cfg;
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    int64_t H = c->hidden, d = q->head_dim, nh = c->heads, nkv = q->kv_heads;
    for (int l = 0; l < c->layers; l++) {
        Qwen3Layer *L = &w[l];
#define V(suffix, nd, a, b) model_view_layer(m, flat, l, suffix, nd, a, b)
        L->ln1 = V("input_layernorm.weight", 1, H, 0);
        L->wq = V("self_attn.q_proj.weight", 2, nh * d, H);
        L->wk = V("self_attn.k_proj.weight", 2, nkv * d, H);
        L->wv = V("self_attn.v_proj.weight", 2, nkv * d, H);
        L->wo = V("self_attn.o_proj.weight", 2, H, nh * d);
        L->bq = V("self_attn.q_proj.bias", 1, nh * d, 0);
        L->bk = V("self_attn.k_proj.bias", 1, nkv * d, 0);
        L->bv = V("self_attn.v_proj.bias", 1, nkv * d, 0);
        L->bo = V("self_attn.o_proj.bias", 1, H, 0);
        L->qn = V("self_attn.q_norm.weight", 1, d, 0);
        L->kn = V("self_attn.k_norm.weight", 1, d, 0);
        L->ln2 = V("post_attention_layernorm.weight", 1, H, 0);
        L->router = V("mlp.gate.weight", 2, c->experts, H);
#undef V
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
    const Qwen3Layer *W = &((const Qwen3Views *)m->views)->w[l];
    Tensor w[FP8_SLOTS] = {[FP8_Q] = W->wq, [FP8_K] = W->wk, [FP8_V] = W->wv, [FP8_O] = W->wo};
    return w[s];
}

// ---- records ----

static void qwen3_layer_alloc(Model *m, int l, void *rp, Arena *a, int B, int S, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    Qwen3Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, d = q->head_dim, nh = c->heads, nkv = q->kv_heads, E = c->experts;
    DType dt = m->cdt;
    memset(r, 0, sizeof *r);
    r->n1 = arena_tensor(a, dt, 2, T, H, 0, 0);
    r->rstd1 = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    r->qp = arena_tensor(a, dt, 3, T, nh, d, 0);
    r->kp = arena_tensor(a, dt, 3, T, nkv, d, 0);
    r->rq = arena_tensor(a, DT_F32, 1, T * nh, 0, 0, 0);
    r->rk = arena_tensor(a, DT_F32, 1, T * nkv, 0, 0, 0);
    r->q = arena_tensor(a, dt, 3, T, nh, d, 0);
    r->k = arena_tensor(a, dt, 3, T, nkv, d, 0);
    r->v = arena_tensor(a, dt, 3, T, nkv, d, 0);
    r->att = arena_tensor(a, dt, 3, T, nh, d, 0);
    r->lse = arena_tensor(a, DT_F32, 3, B, nh, S, 0);
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
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    Qwen3Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, d = q->head_dim, nh = c->heads, nkv = q->kv_heads;
    DType dt = m->cdt;
    r->dh1 = arena_tensor(ws, dt, 2, T, H, 0, 0);
    r->dn1 = arena_tensor(ws, dt, 2, T, H, 0, 0);
    r->dqp = arena_tensor(ws, dt, 3, T, nh, d, 0);
    r->dkp = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->dq = arena_tensor(ws, dt, 3, T, nh, d, 0);
    r->dk = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->dv = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->datt = arena_tensor(ws, dt, 3, T, nh, d, 0);
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
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w[l];
    Qwen3Rec *r = rp;
    int64_t T = mb->T, d = q->head_dim, nh = c->heads, nkv = q->kv_heads;
    Tensor h1 = r->mlp.h1;
    r->x = x;
    op_rmsnorm_forward(r->n1, r->rstd1, x, W->ln1, (float)c->eps, NULL);
    model_proj_forward(m, l, FP8_Q, tensor_reshape2(r->qp, T, nh * d), r->n1, W->wq, W->bq);
    model_proj_forward(m, l, FP8_K, tensor_reshape2(r->kp, T, nkv * d), r->n1, W->wk, W->bk);
    model_proj_forward(m, l, FP8_V, tensor_reshape2(r->v, T, nkv * d), r->n1, W->wv, W->bv);
    op_rmsnorm_forward(tensor_reshape2(r->q, T * nh, d), r->rq, tensor_reshape2(r->qp, T * nh, d), W->qn, (float)c->eps,
                       NULL);
    op_rmsnorm_forward(tensor_reshape2(r->k, T * nkv, d), r->rk, tensor_reshape2(r->kp, T * nkv, d), W->kn,
                       (float)c->eps, NULL);
    op_rope(r->q, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, false);
    op_rope(r->k, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, false);
    AttnArgs aa = qwen3_attn_args(m, mb);
    model_attention_forward(m, l, r->att, r->lse, r->q, r->k, r->v, &aa);
    model_proj_forward(m, l, FP8_O, h1, tensor_reshape2(r->att, T, nh * d), W->wo, W->bo);
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
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w[l], *G = &((Qwen3Views *)m->views)->g[l];
    Qwen3Rec *r = rp;
    int64_t T = mb->T, d = q->head_dim, nh = c->heads, nkv = q->kv_heads;
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
    Tensor att2 = tensor_reshape2(r->att, T, nh * d), datt2 = tensor_reshape2(r->datt, T, nh * d);
    model_proj_backward_input(m, l, FP8_O, datt2, r->dh1, W->wo, false);
    model_proj_backward_weight(m, l, FP8_O, G->wo, G->bo, r->dh1, att2);
    AttnArgs aa = qwen3_attn_args(m, mb);
    model_attention_backward(m, r->dq, r->dk, r->dv, NONE, r->datt, r->q, r->k, r->v, r->att, r->lse, &aa);
    op_rope(r->dq, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, true);
    op_rope(r->dk, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, true);
    op_rmsnorm_backward(tensor_reshape2(r->dqp, T * nh, d), G->qn, tensor_reshape2(r->dq, T * nh, d),
                        tensor_reshape2(r->qp, T * nh, d), W->qn, r->rq, false, NULL);
    op_rmsnorm_backward(tensor_reshape2(r->dkp, T * nkv, d), G->kn, tensor_reshape2(r->dk, T * nkv, d),
                        tensor_reshape2(r->kp, T * nkv, d), W->kn, r->rk, false, NULL);
    Tensor dqp = tensor_reshape2(r->dqp, T, nh * d), dkp = tensor_reshape2(r->dkp, T, nkv * d),
           dv = tensor_reshape2(r->dv, T, nkv * d);
    model_proj_backward_input(m, l, FP8_Q, r->dn1, dqp, W->wq, false);
    model_proj_backward_input(m, l, FP8_K, r->dn1, dkp, W->wk, true);
    model_proj_backward_input(m, l, FP8_V, r->dn1, dv, W->wv, true);
    model_proj_backward_weight(m, l, FP8_Q, G->wq, G->bq, dqp, r->n1);
    model_proj_backward_weight(m, l, FP8_K, G->wk, G->bk, dkp, r->n1);
    model_proj_backward_weight(m, l, FP8_V, G->wv, G->bv, dv, r->n1);
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
