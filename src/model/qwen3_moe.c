// qwen3_moe.c — the Qwen3-MoE family (Qwen/Qwen3-30B-A3B, -235B-A22B) in the 5-stage protocol.
// Layer: x → RMSNorm → GQA attention (q/k RMSNorm per head before rotate-half RoPE, causal, scale d^-½)
// → + x = h1 → RMSNorm = n2 → router (softmax over E in fp32, top-k, renormalised if norm_topk_prob)
// → experts down(silu(gate(n2))·up(n2)) → Σ_j w_j·expert_j + h1. Layers listed in mlp_only_layers or
// off the decoder_sparse_step grid use a dense SwiGLU MLP instead. Shapes: T = B·S tokens, H hidden,
// nh/nkv heads of d, E experts, k per token, I expert width.
#include <math.h>

#include "parallel/ep.h"
#include "model/model.h"

typedef struct {
    Tensor ln1, wq, bq, wk, bk, wv, bv, wo, bo, qn, kn, ln2, router;
    Tensor gate_up; // MoE: (E, 2I, H) = per expert [gate_proj; up_proj]; dense: (2I, H)
    Tensor down;    // MoE: (E, H, I); dense: (H, I)
} Qwen3Layer;

typedef struct {
    Tensor embed, norm, lm_head;
    Qwen3Layer layer[MAX_LAYERS];
} Qwen3Weights;

typedef struct {
    Qwen3Weights w, g; // compute weights and fp32 gradients, views into the flat group buffers
} Qwen3Views;

typedef struct {
    Tensor x;             // (T, H) layer input (owned by the previous layer)
    Tensor n1, rstd1;     // (T, H), (T)
    Tensor qp, kp;        // (T, nh, d), (T, nkv, d) projections before the q/k norm
    Tensor rq, rk;        // (T·nh), (T·nkv) rstd of the q/k norm
    Tensor q, k, v;       // after norm and RoPE; v: (T, nkv, d)
    Tensor att, lse;      // (T, nh, d), (B, nh, S)
    Tensor h1;            // (T, H) residual stream after attention
    Tensor n2, rstd2;     // (T, H) post-attention norm (= the tokens to dispatch), (T)
    Tensor logits, probs; // (T, E) router logits and softmax
    Tensor lb_grad;       // (B, E) load-balancing gradient w.r.t. probs (model_lb_loss)
    Tensor gu, act;       // (R, 2I), (R, I) expert (or dense MLP) activations
    // backward workspace
    Tensor dh1, dn2, dn1, dqp, dkp, dq, dk, dv, datt, dlogits, dact, dgu;
} Qwen3Rec;

typedef struct {
    Tensor h, hn, rstd, dhn; // (T, H) final-norm input and output, (T), ∂/∂hn
    Tensor logits;           // (C, V) logits of C rows at a time, compute dtype
} Qwen3Epilog;

static const Tensor NONE = {0};

// ---- config and parameters ----

static void qwen3_config_parse(ModelConfig *c, JObj o) {
    // sizes are read into [1, 2^30] (an int read through a cast would truncate: 2^32 + 64 is not 64)
    c->hidden = jint_in(o, "hidden_size", true, 0, 1, 1 << 30);
    c->layers = jint_in(o, "num_hidden_layers", true, 0, 1, 1 << 30);
    c->heads = jint_in(o, "num_attention_heads", true, 0, 1, 1 << 30);
    c->kv_heads = jint_in(o, "num_key_value_heads", false, c->heads, 1, 1 << 30);
    c->head_dim = jint_in(o, "head_dim", false, c->hidden / c->heads, 1, 1 << 30);
    c->vocab = jint_in(o, "vocab_size", true, 0, 1, 1 << 30);
    c->eps = jnum(o, "rms_norm_eps", false, 1e-6);
    if (!(c->eps >= 0 && c->eps < 1)) jdie(o, "rms_norm_eps", "must be in [0, 1) (got %g)", c->eps);
    // transformers v5 writes num_local_experts; v4 and the hub configs num_experts
    c->experts = jhas(o, "num_experts") ? jint_in(o, "num_experts", true, 0, 1, 1 << 20)
                                        : jint_in(o, "num_local_experts", true, 0, 1, 1 << 20);
    c->topk = jint_in(o, "num_experts_per_tok", true, 0, 0, 1 << 20);
    c->moe_inter = jint_in(o, "moe_intermediate_size", true, 0, 0, 1 << 30);
    c->dense_inter = jint_in(o, "intermediate_size", false, 0, 0, 1 << 30);
    c->norm_topk = jbool(o, "norm_topk_prob", false, false);
    c->attn_bias = jbool(o, "attention_bias", false, false);
    c->tie_embed = jbool(o, "tie_word_embeddings", false, false);
    // rope theta: top-level (transformers v4) or inside rope_parameters / rope_scaling (v5)
    JObj rp = jobj_child(o, "rope_parameters");
    if (!rp.obj) rp = jobj_child(o, "rope_scaling");
    c->rope_theta = rp.obj && jhas(rp, "rope_theta") ? jnum(rp, "rope_theta", true, 0) : jnum(o, "rope_theta", false, 10000.0);
    if (!(c->rope_theta > 0 && isfinite(c->rope_theta))) jdie(o, "rope_theta", "must be positive (got %g)", c->rope_theta);
    if (rp.obj) {
        const char *rt = jhas(rp, "rope_type") ? jstr(rp, "rope_type", true, NULL) : jstr(rp, "type", false, "default");
        if (strcmp(rt, "default")) jdie(rp, "rope_type", "'%s' is not supported for qwen3_moe (only default RoPE)", rt);
    }
    if (jbool(o, "use_sliding_window", false, false)) jdie(o, "use_sliding_window", "sliding-window attention is not supported for qwen3_moe");
    if (c->hidden <= 0 || c->layers <= 0 || c->heads <= 0 || c->kv_heads <= 0 || c->head_dim <= 0 || c->vocab <= 0)
        jdie(o, NULL, "hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim and vocab_size must be positive");
    if (c->layers > MAX_LAYERS) jdie(o, "num_hidden_layers", "at most %d layers are supported", MAX_LAYERS);
    if (c->heads % c->kv_heads) jdie(o, "num_key_value_heads", "must divide num_attention_heads (%d)", c->heads);
    if (c->head_dim % 2) jdie(o, "head_dim", "must be even for RoPE");
    if (c->experts < 1 || c->topk < 1 || c->topk > c->experts)
        jdie(o, "num_experts_per_tok", "must be in [1, num_experts] (got %d of %d)", c->topk, c->experts);
    if (c->moe_inter <= 0) jdie(o, "moe_intermediate_size", "must be positive");
    int step = jint_in(o, "decoder_sparse_step", false, 1, 1, 1 << 30);
    if (step < 1) jdie(o, "decoder_sparse_step", "must be at least 1");
    for (int l = 0; l < c->layers; l++) c->is_moe[l] = (l + 1) % step == 0;
    json_t *mlp_only = json_object_get(o.obj, "mlp_only_layers");
    if (mlp_only && !json_is_null(mlp_only)) {
        if (!json_is_array(mlp_only)) jdie(o, "mlp_only_layers", "expected an array of layer indices");
        size_t i;
        json_t *v;
        json_array_foreach(mlp_only, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->layers)
                jdie(o, "mlp_only_layers", "entry %zu is not a layer index in [0, %d)", i, c->layers);
            c->is_moe[json_integer_value(v)] = false;
        }
    }
    for (int l = 0; l < c->layers; l++)
        if (!c->is_moe[l] && c->dense_inter <= 0) jdie(o, "intermediate_size", "must be positive: layer %d has a dense MLP", l);
}

static void qwen3_params_build(ParamTable *t, const ModelConfig *c) {
    int64_t H = c->hidden, d = c->head_dim, nh = c->heads, nkv = c->kv_heads, E = c->experts, I = c->moe_inter;
    int e0 = model_expert_first(c), e1 = e0 + model_experts_local(c); // the experts this rank holds
    char n[96];
    params_add(t, "embed_tokens.weight", GROUP_DENSE, INIT_NORMAL, 2, c->vocab, H, 0);
    for (int l = 0; l < c->layers; l++) {
#define P(suffix, init, nd, a, b) (snprintf(n, sizeof n, "layers.%d.%s", l, suffix), params_add(t, n, GROUP_DENSE, init, nd, a, b, 0))
        P("input_layernorm.weight", INIT_ONES, 1, H, 0);
        P("self_attn.q_proj.weight", INIT_NORMAL, 2, nh * d, H);
        P("self_attn.k_proj.weight", INIT_NORMAL, 2, nkv * d, H);
        P("self_attn.v_proj.weight", INIT_NORMAL, 2, nkv * d, H);
        P("self_attn.o_proj.weight", INIT_NORMAL_OUT, 2, H, nh * d);
        if (c->attn_bias) {
            P("self_attn.q_proj.bias", INIT_ZEROS, 1, nh * d, 0);
            P("self_attn.k_proj.bias", INIT_ZEROS, 1, nkv * d, 0);
            P("self_attn.v_proj.bias", INIT_ZEROS, 1, nkv * d, 0);
            P("self_attn.o_proj.bias", INIT_ZEROS, 1, H, 0);
        }
        P("self_attn.q_norm.weight", INIT_ONES, 1, d, 0);
        P("self_attn.k_norm.weight", INIT_ONES, 1, d, 0);
        P("post_attention_layernorm.weight", INIT_ONES, 1, H, 0);
        if (c->is_moe[l]) {
            P("mlp.gate.weight", INIT_NORMAL, 2, E, H);
            // Expert e's gate_proj and up_proj are adjacent, so the layer's gate_up is one (E, 2I, H) tensor
            // (E_local under expert parallelism; names keep the global expert index).
            for (int e = e0; e < e1; e++) {
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                params_add(t, n, GROUP_EXPERT, INIT_NORMAL, 2, I, H, 0);
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                params_add(t, n, GROUP_EXPERT, INIT_NORMAL, 2, I, H, 0);
            }
            for (int e = e0; e < e1; e++) {
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.down_proj.weight", l, e);
                params_add(t, n, GROUP_EXPERT, INIT_NORMAL_OUT, 2, H, I, 0);
            }
        } else {
            P("mlp.gate_proj.weight", INIT_NORMAL, 2, c->dense_inter, H);
            P("mlp.up_proj.weight", INIT_NORMAL, 2, c->dense_inter, H);
            P("mlp.down_proj.weight", INIT_NORMAL_OUT, 2, H, c->dense_inter);
        }
#undef P
    }
    params_add(t, "norm.weight", GROUP_DENSE, INIT_ONES, 1, H, 0, 0);
    if (!c->tie_embed) params_add(t, "lm_head.weight", GROUP_DENSE, INIT_NORMAL, 2, c->vocab, H, 0);
}

// A view of nd dims starting at parameter `name` inside the flat buffers (NONE if the model lacks it).
static Tensor view(Model *m, Tensor *flat, const char *name, int nd, int64_t n0, int64_t n1, int64_t n2) {
    const ParamInfo *p = params_find(&m->params, name);
    if (!p) return NONE;
    Tensor f = flat[p->group];
    Tensor t = tensor_make(f.p ? (char *)f.p + p->off * dtype_size(f.dt) : NULL, f.dt, f.dev, nd, n0, n1, n2, 1); // NULL: a plan
    CHECK(p->off + tensor_numel(t) <= tensor_numel(f));
    return t;
}

static void bind_weights(Model *m, Tensor *flat, Qwen3Weights *w) {
    const ModelConfig *c = &m->cfg;
    int64_t H = c->hidden, d = c->head_dim, nh = c->heads, nkv = c->kv_heads, E = c->experts, I = c->moe_inter;
    int64_t El = model_experts_local(c);
    char n[96], first[64];
    w->embed = view(m, flat, "embed_tokens.weight", 2, c->vocab, H, 0);
    w->norm = view(m, flat, "norm.weight", 1, H, 0, 0);
    w->lm_head = c->tie_embed ? w->embed : view(m, flat, "lm_head.weight", 2, c->vocab, H, 0);
    for (int l = 0; l < c->layers; l++) {
        Qwen3Layer *L = &w->layer[l];
#define V(suffix, nd, a, b, cc) (snprintf(n, sizeof n, "layers.%d.%s", l, suffix), view(m, flat, n, nd, a, b, cc))
        L->ln1 = V("input_layernorm.weight", 1, H, 0, 0);
        L->wq = V("self_attn.q_proj.weight", 2, nh * d, H, 0);
        L->wk = V("self_attn.k_proj.weight", 2, nkv * d, H, 0);
        L->wv = V("self_attn.v_proj.weight", 2, nkv * d, H, 0);
        L->wo = V("self_attn.o_proj.weight", 2, H, nh * d, 0);
        L->bq = V("self_attn.q_proj.bias", 1, nh * d, 0, 0);
        L->bk = V("self_attn.k_proj.bias", 1, nkv * d, 0, 0);
        L->bv = V("self_attn.v_proj.bias", 1, nkv * d, 0, 0);
        L->bo = V("self_attn.o_proj.bias", 1, H, 0, 0);
        L->qn = V("self_attn.q_norm.weight", 1, d, 0, 0);
        L->kn = V("self_attn.k_norm.weight", 1, d, 0, 0);
        L->ln2 = V("post_attention_layernorm.weight", 1, H, 0, 0);
        if (c->is_moe[l]) {
            L->router = V("mlp.gate.weight", 2, E, H, 0);
            snprintf(first, sizeof first, "mlp.experts.%d.gate_proj.weight", model_expert_first(c));
            L->gate_up = V(first, 3, El, 2 * I, H);
            snprintf(first, sizeof first, "mlp.experts.%d.down_proj.weight", model_expert_first(c));
            L->down = V(first, 3, El, H, I);
        } else {
            L->gate_up = V("mlp.gate_proj.weight", 2, 2 * (int64_t)c->dense_inter, H, 0);
            L->down = V("mlp.down_proj.weight", 2, H, c->dense_inter, 0);
        }
#undef V
    }
}

static void qwen3_bind(Model *m) {
    Qwen3Views *v = m->views = m->views ? m->views : xcalloc(1, sizeof(Qwen3Views));
    bind_weights(m, m->w, &v->w);
    bind_weights(m, m->g, &v->g);
}

// ---- records ----

static void qwen3_layer_alloc(Model *m, int l, void *rp, Arena *a, int B, int S, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    Qwen3Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, d = c->head_dim, nh = c->heads, nkv = c->kv_heads, E = c->experts, k = c->topk;
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
    r->h1 = arena_tensor(a, dt, 2, T, H, 0, 0);
    r->n2 = arena_tensor(a, dt, 2, T, H, 0, 0);
    r->rstd2 = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    io->dense = !c->is_moe[l];
    io->xd = r->n2;
    int64_t R = T, I = c->dense_inter;
    if (c->is_moe[l]) {
        r->logits = arena_tensor(a, DT_F32, 2, T, E, 0, 0);
        r->probs = arena_tensor(a, DT_F32, 2, T, E, 0, 0);
        r->lb_grad = arena_tensor(a, DT_F32, 2, B, E, 0, 0);
        io->idx = arena_tensor(a, DT_I32, 2, T, k, 0, 0);
        io->w = arena_tensor(a, DT_F32, 2, T, k, 0, 0);
        R = ep_rows_capacity(m, T), I = c->moe_inter;
    }
    r->gu = arena_tensor(a, dt, 2, R, 2 * I, 0, 0);
    r->act = arena_tensor(a, dt, 2, R, I, 0, 0);
    ep_alloc(m, io, a, T);
}

static void qwen3_layer_grad_alloc(Model *m, int l, void *rp, Arena *ws, int B, int S, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    Qwen3Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, d = c->head_dim, nh = c->heads, nkv = c->kv_heads;
    DType dt = m->cdt;
    r->dh1 = arena_tensor(ws, dt, 2, T, H, 0, 0);
    r->dn1 = arena_tensor(ws, dt, 2, T, H, 0, 0);
    r->dqp = arena_tensor(ws, dt, 3, T, nh, d, 0);
    r->dkp = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->dq = arena_tensor(ws, dt, 3, T, nh, d, 0);
    r->dk = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->dv = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->datt = arena_tensor(ws, dt, 3, T, nh, d, 0);
    if (c->is_moe[l]) {
        r->dlogits = arena_tensor(ws, DT_F32, 2, T, c->experts, 0, 0);
        io->dw = arena_tensor(ws, DT_F32, 2, T, c->topk, 0, 0);
    }
    r->dact = arena_tensor(ws, dt, 2, r->act.n[0], r->act.n[1], 0, 0);
    r->dgu = arena_tensor(ws, dt, 2, r->gu.n[0], r->gu.n[1], 0, 0);
    ep_grad_alloc(m, io, ws, T);
}

// ---- prolog: token embedding ----

static void qwen3_prolog_forward(Model *m, MicroBatch *mb, Tensor h) {
    op_embedding_forward(h, ((Qwen3Views *)m->views)->w.embed, mb->tokens);
}

static void qwen3_prolog_backward(Model *m, MicroBatch *mb, Tensor dh) {
    op_embedding_backward(((Qwen3Views *)m->views)->g.embed, dh, mb->tokens);
}

// ---- stage 1: norm → attention → residual → norm → router ----

// Causal attention scaled by 1/√d; softmax → top-k routing, renormalised when norm_topk_prob.
static AttnArgs qwen3_attn_args(const Model *m, const MicroBatch *mb) {
    return (AttnArgs){.B = mb->B, .scale = (float)(1.0 / sqrt((double)m->cfg.head_dim)), .causal = true};
}
static RouterArgs qwen3_router_args(const Model *m) {
    return (RouterArgs){.k = m->cfg.topk, .renorm = m->cfg.norm_topk, .scale = 1, .force_balance = m->force_balance};
}

static void qwen3_stage1_forward(Model *m, int l, void *rp, MicroBatch *mb, Tensor x, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w.layer[l];
    Qwen3Rec *r = rp;
    int64_t T = mb->T, d = c->head_dim, nh = c->heads, nkv = c->kv_heads;
    r->x = x;
    op_rmsnorm_forward(r->n1, r->rstd1, x, W->ln1, (float)c->eps);
    op_linear_forward(tensor_reshape2(r->qp, T, nh * d), r->n1, W->wq, W->bq);
    op_linear_forward(tensor_reshape2(r->kp, T, nkv * d), r->n1, W->wk, W->bk);
    op_linear_forward(tensor_reshape2(r->v, T, nkv * d), r->n1, W->wv, W->bv);
    op_rmsnorm_forward(tensor_reshape2(r->q, T * nh, d), r->rq, tensor_reshape2(r->qp, T * nh, d), W->qn, (float)c->eps);
    op_rmsnorm_forward(tensor_reshape2(r->k, T * nkv, d), r->rk, tensor_reshape2(r->kp, T * nkv, d), W->kn, (float)c->eps);
    op_rope(r->q, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, false);
    op_rope(r->k, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, false);
    AttnArgs aa = qwen3_attn_args(m, mb);
    op_attention_forward(r->att, r->lse, r->q, r->k, r->v, &aa);
    op_linear_forward(r->h1, tensor_reshape2(r->att, T, nh * d), W->wo, W->bo);
    op_add(r->h1, x);
    op_rmsnorm_forward(r->n2, r->rstd2, r->h1, W->ln2, (float)c->eps);
    if (io->dense) return;
    op_linear_forward(r->logits, r->n2, W->router, NONE);
    RouterArgs ra = qwen3_router_args(m);
    op_router_forward(r->probs, io->idx, io->w, r->logits, &ra);
    // The load-balancing term enters the objective as lb·T per micro-batch (spec §2.0), so its gradient
    // w.r.t. probs is scaled by T here; the engine divides all gradients by the step's token count.
    if (m->lb_coef > 0) model_lb_loss(m, l, r->lb_grad, r->probs, io->idx, (float)T, mb->B);
}

// ---- stage 3: experts (grouped GEMMs) or the dense MLP on the received rows ----

static void qwen3_stage3_forward(Model *m, int l, void *rp, StageIO *io) {
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w.layer[l];
    Qwen3Rec *r = rp;
    if (io->dense) {
        op_linear_forward(r->gu, io->xe, W->gate_up, NONE);
        op_swiglu_forward(r->act, r->gu);
        op_linear_forward(io->ye, r->act, W->down, NONE);
        return;
    }
    int64_t R = io->offs[model_experts_local(&m->cfg)]; // rows received
    Tensor gu = tensor_rows(r->gu, 0, R), act = tensor_rows(r->act, 0, R);
    op_grouped_linear_forward(gu, tensor_rows(io->xe, 0, R), W->gate_up, NONE, io->offs);
    op_swiglu_forward(act, gu);
    op_grouped_linear_forward(tensor_rows(io->ye, 0, R), act, W->down, NONE, io->offs);
}

static void qwen3_stage3_backward_input(Model *m, int l, void *rp, StageIO *io) {
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w.layer[l];
    Qwen3Rec *r = rp;
    if (io->dense) {
        op_linear_backward_input(r->dact, io->dye, W->down, false);
        op_swiglu_backward(r->dgu, r->dact, r->gu);
        op_linear_backward_input(io->dxe, r->dgu, W->gate_up, false);
        return;
    }
    int64_t R = io->offs[model_experts_local(&m->cfg)];
    Tensor dact = tensor_rows(r->dact, 0, R), dgu = tensor_rows(r->dgu, 0, R);
    op_grouped_linear_backward_input(dact, tensor_rows(io->dye, 0, R), W->down, io->offs);
    op_swiglu_backward(dgu, dact, tensor_rows(r->gu, 0, R));
    op_grouped_linear_backward_input(tensor_rows(io->dxe, 0, R), dgu, W->gate_up, io->offs);
}

// The expert weight gradients, separable from the input gradients so a pipeline can defer them.
static void qwen3_stage3_backward_weight(Model *m, int l, void *rp, StageIO *io) {
    const Qwen3Layer *G = &((Qwen3Views *)m->views)->g.layer[l];
    Qwen3Rec *r = rp;
    if (io->dense) {
        op_linear_backward_weight(G->down, NONE, io->dye, r->act);
        op_linear_backward_weight(G->gate_up, NONE, r->dgu, io->xe);
        return;
    }
    int64_t R = io->offs[model_experts_local(&m->cfg)];
    op_grouped_linear_backward_weight(G->down, NONE, tensor_rows(io->dye, 0, R), tensor_rows(r->act, 0, R), io->offs);
    op_grouped_linear_backward_weight(G->gate_up, NONE, tensor_rows(r->dgu, 0, R), tensor_rows(io->xe, 0, R), io->offs);
}

// ---- stage 5: weighted sum of the expert outputs + residual ----

static void qwen3_stage5_forward(Model *m, int l, void *rp, StageIO *io, Tensor out) {
    Qwen3Rec *r = rp;
    if (io->dense) {
        op_copy(out, r->h1);
        op_add(out, io->y);
    } else {
        op_moe_combine_forward(out, r->h1, io->y, io->w);
    }
}

static void qwen3_stage5_backward(Model *m, int l, void *rp, StageIO *io, Tensor dout) {
    if (io->dense) op_copy(io->dy, dout);
    else op_moe_combine_backward(io->dy, io->dw, dout, io->y, io->w);
}

// ---- stage 1 backward: router → post-attention norm → residual → attention → input norm ----
// dout: ∂/∂(layer output) (its residual path reaches h1 directly); dx: ∂/∂(layer input), written.
static void qwen3_stage1_backward(Model *m, int l, void *rp, MicroBatch *mb, StageIO *io, Tensor dout, Tensor dx) {
    const ModelConfig *c = &m->cfg;
    const Qwen3Layer *W = &((Qwen3Views *)m->views)->w.layer[l], *G = &((Qwen3Views *)m->views)->g.layer[l];
    Qwen3Rec *r = rp;
    int64_t T = mb->T, d = c->head_dim, nh = c->heads, nkv = c->kv_heads;
    Tensor dn2 = io->dxd; // gradient of the dispatched tokens, from stage 2's backward
    if (!io->dense) {
        RouterArgs ra = qwen3_router_args(m);
        model_router_backward(m, r->dlogits, io->dw, m->lb_coef > 0 ? r->lb_grad : NONE, r->probs, io->idx, io->w, &ra,
                              mb->B);
        op_linear_backward_input(dn2, r->dlogits, W->router, true);
        op_linear_backward_weight(G->router, NONE, r->dlogits, r->n2);
    }
    op_copy(r->dh1, dout);
    op_rmsnorm_backward(r->dh1, G->ln2, dn2, r->h1, W->ln2, r->rstd2, true);
    Tensor att2 = tensor_reshape2(r->att, T, nh * d), datt2 = tensor_reshape2(r->datt, T, nh * d);
    op_linear_backward_input(datt2, r->dh1, W->wo, false);
    op_linear_backward_weight(G->wo, G->bo, r->dh1, att2);
    AttnArgs aa = qwen3_attn_args(m, mb);
    op_attention_backward(r->dq, r->dk, r->dv, NONE, r->datt, r->q, r->k, r->v, r->att, r->lse, &aa);
    op_rope(r->dq, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, true);
    op_rope(r->dk, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, true);
    op_rmsnorm_backward(tensor_reshape2(r->dqp, T * nh, d), G->qn, tensor_reshape2(r->dq, T * nh, d), tensor_reshape2(r->qp, T * nh, d), W->qn, r->rq, false);
    op_rmsnorm_backward(tensor_reshape2(r->dkp, T * nkv, d), G->kn, tensor_reshape2(r->dk, T * nkv, d), tensor_reshape2(r->kp, T * nkv, d), W->kn, r->rk, false);
    Tensor dqp = tensor_reshape2(r->dqp, T, nh * d), dkp = tensor_reshape2(r->dkp, T, nkv * d), dv = tensor_reshape2(r->dv, T, nkv * d);
    op_linear_backward_input(r->dn1, dqp, W->wq, false);
    op_linear_backward_input(r->dn1, dkp, W->wk, true);
    op_linear_backward_input(r->dn1, dv, W->wv, true);
    op_linear_backward_weight(G->wq, G->bq, dqp, r->n1);
    op_linear_backward_weight(G->wk, G->bk, dkp, r->n1);
    op_linear_backward_weight(G->wv, G->bv, dv, r->n1);
    op_copy(dx, r->dh1);
    op_rmsnorm_backward(dx, G->ln1, r->dn1, r->x, W->ln1, r->rstd1, true);
}

// ---- epilog: final norm → LM head → cross-entropy, in row chunks so (T, V) logits never exist ----

static void qwen3_epilog_alloc(Model *m, void *rp, Arena *a, int T) {
    Qwen3Epilog *r = rp;
    // Logits in the compute dtype (bf16 on the GPU, like HF's LM head), C rows at a time: ≤ 64 MB on the
    // CPU (cache-friendly), ≤ 512 MB on the GPU (large enough that the LM-head GEMMs run at full rate).
    int64_t budget = m->dev == DEV_CUDA ? 512 << 20 : 64 << 20, C = budget / ((int64_t)m->cfg.vocab * dtype_size(m->cdt));
    C = C < 1 ? 1 : C > T ? T : C;
    r->hn = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    r->rstd = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    r->dhn = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    r->logits = arena_tensor(a, m->cdt, 2, C, m->cfg.vocab, 0, 0);
}

static void qwen3_epilog_forward(Model *m, void *rp, MicroBatch *mb, Tensor h, bool grad) {
    const Qwen3Weights *W = &((Qwen3Views *)m->views)->w, *G = &((Qwen3Views *)m->views)->g;
    Qwen3Epilog *r = rp;
    r->h = h;
    op_rmsnorm_forward(r->hn, r->rstd, h, W->norm, (float)m->cfg.eps);
    int64_t C = r->logits.n[0];
    for (int64_t r0 = 0; r0 < mb->T; r0 += C) {
        int64_t n = mb->T - r0 < C ? mb->T - r0 : C;
        Tensor lg = tensor_rows(r->logits, 0, n), hn = tensor_rows(r->hn, r0, n);
        op_linear_forward(lg, hn, W->lm_head, NONE);
        op_cross_entropy(lg, tensor_rows(mb->labels, r0, n), m->loss_sum, 1.0f); // lg ← ∂(Σ CE)/∂logits
        if (!grad) continue;
        op_linear_backward_input(tensor_rows(r->dhn, r0, n), lg, W->lm_head, false);
        op_linear_backward_weight(G->lm_head, NONE, lg, hn);
    }
}

static void qwen3_epilog_backward(Model *m, void *rp, Tensor dh) {
    const Qwen3Weights *W = &((Qwen3Views *)m->views)->w, *G = &((Qwen3Views *)m->views)->g;
    Qwen3Epilog *r = rp;
    op_rmsnorm_backward(dh, G->norm, r->dhn, r->h, W->norm, r->rstd, false);
}

const ModelFamily qwen3_moe_family = {
    .model_type = "qwen3_moe",
    .rec_size = sizeof(Qwen3Rec),
    .epilog_size = sizeof(Qwen3Epilog),
    .config_parse = qwen3_config_parse,
    .params_build = qwen3_params_build,
    .bind = qwen3_bind,
    .layer_alloc = qwen3_layer_alloc,
    .layer_grad_alloc = qwen3_layer_grad_alloc,
    .prolog_forward = qwen3_prolog_forward,
    .prolog_backward = qwen3_prolog_backward,
    .stage1_forward = qwen3_stage1_forward,
    .stage3_forward = qwen3_stage3_forward,
    .stage5_forward = qwen3_stage5_forward,
    .stage5_backward = qwen3_stage5_backward,
    .stage3_backward_input = qwen3_stage3_backward_input,
    .stage3_backward_weight = qwen3_stage3_backward_weight,
    .stage1_backward = qwen3_stage1_backward,
    .epilog_alloc = qwen3_epilog_alloc,
    .epilog_forward = qwen3_epilog_forward,
    .epilog_backward = qwen3_epilog_backward,
};
