// qwen3_5_moe.c — the Qwen3.5-MoE family (Qwen/Qwen3.5-35B-A3B's text model) in the 5-stage protocol, as
// transformers 5.17's Qwen3_5MoeForCausalLM computes it (the parity reference, tests/hf/qwen3_5_moe). Formulas:
// docs/reference.md §19.
// Layer: x → RMSNorm₁ = n1 → token mixer → + x = h1a → RMSNorm₁ = n2 → router and shared expert;
// h1 = h1a + σ(n2·w_sg) · shared(n2) is the residual stage 5 adds the routed experts to. RMSNorm₁ is the
// zero-centred norm x·rstd·(1 + w) (block, q/k and final norms). layer_types names each layer's mixer:
//   linear_attention (Gated DeltaNet): qkv = conv1d_silu(in_proj_qkv(n1)) (T, Cc) = [q (nk·dk) | k (nk·dk) | v (nv·dv)],
//     z = in_proj_z(n1), g = −exp(A_log)·softplus(in_proj_a(n1) + dt_bias), β = σ(in_proj_b(n1)),
//     o = gated delta rule (q, k L2-normalised, q scaled by dk^-½, key heads repeated to the value heads),
//     out_proj(RMSNorm(o)·w·silu(z)) per value head.
//   full_attention: q_proj gives per head [q | gate] (T, nh, 2·hd); q/k RMSNorm₁ per head, RoPE on the first
//     partial_rotary_factor·hd dims (rotate-half), causal GQA with scale hd^-½, o_proj(attention · σ(gate)).
// Router: softmax over E in fp32 → top-k, always renormalised. Every layer is MoE. Shapes: T = B·S tokens, H hidden,
// nh/nkv heads of hd, nk/nv key/value heads of dk/dv, Cc = 2·nk·dk + nv·dv conv channels of kernel K, E experts, k
// per token, Is the shared expert's width.
#include <math.h>

#include "model/model.h"

typedef struct {
    int kv_heads, head_dim;           // full attention: nkv, hd
    int nk, nv, dk, dv, conv_k;       // Gated DeltaNet: linear_num_{key,value}_heads, linear_{key,value}_head_dim, K
    bool attn_bias;                   // biases on q/k/v/o_proj
    uint64_t linear[MAX_LAYERS / 64]; // bit l: layer l is linear_attention
} Qwen35Config;
MODEL_FAMILY_CONFIG_FITS(Qwen35Config);

typedef struct {
    Tensor wqkv, wz, wb, wa, conv, dt_bias, A_log, gnorm, wout; // Gated DeltaNet; conv: (Cc, K)
} Q35Layer;

typedef struct {
    LAYER_FIELDS; // h1: after the token mixer and the shared expert; gqa: full attention
    // Gated DeltaNet
    Tensor qkv, cv;      // (T, Cc) projection and conv1d_silu of it
    Tensor lq, lk, lv;   // (T, nk, dk), (T, nk, dk), (T, nv, dv): cv's column blocks, where the conv writes them
    Tensor z, pa, pb;    // (T, nv·dv), (T, nv), (T, nv) projections
    Tensor g, beta;      // (T, nv) fp32
    Tensor core, rg, gn; // (T, nv, dv) delta rule output, (T·nv) rstd, gated norm output
    // Gated DeltaNet under context parallelism (model.h): the mixer's input and output on the contiguous layout
    // (n1 and h1a themselves at cp 1; h1c borrows h1, written later), the conv halo and the entering state
    Tensor n1c, h1c, halo, s0; // (T, H), (T, H), (B·(K−1), Cc), (B, nv, dk, dv) fp32
    Tensor posc;               // (T) int32: MicroBatch.pos on the contiguous layout (document masking)
    Tensor dws;                // the delta rule's state kept from forward to backward (DeltaArgs.kept), or none
    // backward workspace
    Tensor dqkv, dcv, dlq, dlk, dlv, dz, dpa, dpb, dg, dbeta, dcore, dgn, dh1c, dn1c;
} Q35Rec;

static bool is_linear(const ModelConfig *c, int l) {
    return model_family_config(const Qwen35Config, c)->linear[l / 64] >> (l % 64) & 1;
}

// ---- config and parameters ----

static void q35_config_parse(ModelConfig *c, JObj o) {
    Qwen35Config *q = model_family_config(Qwen35Config, c);
    c->hidden = jint_in(o, "hidden_size", true, 0, 1, 1 << 30);
    c->layers = jint_in(o, "num_hidden_layers", true, 0, 1, MAX_LAYERS);
    c->heads = jint_in(o, "num_attention_heads", true, 0, 1, 1 << 20);
    q->kv_heads = jint_in(o, "num_key_value_heads", false, c->heads, 1, 1 << 20);
    q->head_dim = jint_in(o, "head_dim", false, c->hidden / c->heads, 2, 1 << 20);
    c->vocab = jint_in(o, "vocab_size", true, 0, 1, 1 << 30);
    c->eps = jnum(o, "rms_norm_eps", false, 1e-6);
    c->experts = jint_in(o, "num_experts", true, 0, 1, 1 << 20);
    c->topk = jint_in(o, "num_experts_per_tok", true, 0, 1, 1 << 20);
    c->moe_inter = jint_in(o, "moe_intermediate_size", true, 0, 1, 1 << 30);
    c->shared_inter = jint_in(o, "shared_expert_intermediate_size", true, 0, 1, 1 << 30);
    q->nk = jint_in(o, "linear_num_key_heads", false, 16, 1, 1 << 20);
    q->nv = jint_in(o, "linear_num_value_heads", false, 32, 1, 1 << 20);
    q->dk = jint_in(o, "linear_key_head_dim", false, 128, 1, 1 << 20);
    q->dv = jint_in(o, "linear_value_head_dim", false, 128, 1, 1 << 20);
    q->conv_k = jint_in(o, "linear_conv_kernel_dim", false, 4, 1, 64);
    q->attn_bias = jbool(o, "attention_bias", false, false);
    c->tie_embed = jbool(o, "tie_word_embeddings", false, false);
    c->norm_1p = true;
    if (c->heads % q->kv_heads) jdie(o, "num_key_value_heads", "must divide num_attention_heads (%d)", c->heads);
    if (q->nv % q->nk) jdie(o, "linear_num_key_heads", "must divide linear_num_value_heads (%d)", q->nv);
    // partial_rotary_factor: inside rope_parameters (transformers v5) or at the top; 0.25 when absent.
    JObj rp = jobj_child(o, "rope_parameters");
    double prf = rp.obj && jhas(rp, "partial_rotary_factor") ? jnum(rp, "partial_rotary_factor", true, 0)
                                                             : jnum(o, "partial_rotary_factor", false, 0.25);
    if (!(prf > 0 && prf <= 1)) jdie(o, "partial_rotary_factor", "must be in (0, 1] (got %g)", prf);
    moe_rope_parse(c, o, (int)(q->head_dim * prf), false); // int(): transformers truncates too
    // layer_types: one "linear_attention" or "full_attention" per layer; without it every full_attention_interval-th
    // layer is full attention (transformers' default pattern).
    moe_layer_types(c, o, "linear_attention", jint_in(o, "full_attention_interval", false, 4, 1, 1 << 20), q->linear);
    for (int l = 0; l < c->layers; l++) c->is_moe[l] = true; // transformers gives every layer the sparse block
    c->router = (RouterArgs){.renorm = true, .scale = 1};
    moe_config_check(c, o, "num_experts");
    // context parallelism: the full-attention layers' ring, the DeltaNet layers' conv halo and state
    int64_t cc = 2 * (int64_t)q->nk * q->dk + (int64_t)q->nv * q->dv;
    c->ring.nh = c->heads, c->ring.nkv = q->kv_heads, c->ring.dqk = c->ring.dv = q->head_dim;
    c->ring.cc = (int)cc, c->ring.ck = q->conv_k, c->ring.state = (int64_t)q->nv * q->dk * q->dv;
}

// Full attention (nh 0 in a Gated DeltaNet layer): gated q, q/k norm 1 + w, biases when attention_bias.
static GqaShape q35_gqa(const ModelConfig *c, int l) {
    const Qwen35Config *q = model_family_config(const Qwen35Config, c);
    if (is_linear(c, l)) return (GqaShape){0};
    return (GqaShape){.nh = c->heads,
                      .nkv = q->kv_heads,
                      .d = q->head_dim,
                      .qk_norm = QK_NORM_1P,
                      .bias = q->attn_bias,
                      .gated = true};
}

// Gated DeltaNet's parameters, after input_layernorm.
static void q35_mixer_params(ParamTable *t, const ModelConfig *c, int l) {
    const Qwen35Config *q = model_family_config(const Qwen35Config, c);
    int64_t H = c->hidden, kd = (int64_t)q->nk * q->dk, vd = (int64_t)q->nv * q->dv;
#define P(suffix, init, nd, a, b) params_add_layer(t, l, "linear_attn." suffix, init, nd, a, b)
    P("in_proj_qkv.weight", INIT_NORMAL, 2, 2 * kd + vd, H);
    P("in_proj_z.weight", INIT_NORMAL, 2, vd, H);
    P("in_proj_b.weight", INIT_NORMAL, 2, q->nv, H);
    P("in_proj_a.weight", INIT_NORMAL, 2, q->nv, H);
    char n[96]; // HF's depthwise Conv1d weight: (Cc, 1, K)
    snprintf(n, sizeof n, "layers.%d.linear_attn.conv1d.weight", l);
    params_add(t, n, GROUP_DENSE, INIT_NORMAL, 3, 2 * kd + vd, 1, q->conv_k);
    P("dt_bias", INIT_ONES, 1, q->nv, 0);
    P("A_log", INIT_LOG_UNIFORM, 1, q->nv, 0);
    P("norm.weight", INIT_ONES, 1, q->dv, 0);
    P("out_proj.weight", INIT_NORMAL, 2, H, vd);
#undef P
}

// Gated DeltaNet's weight (or gradient) views of layer l.
static void q35_bind_layer(Model *m, Tensor *flat, int l, void *views) {
    const ModelConfig *c = &m->cfg;
    const Qwen35Config *q = model_family_config(const Qwen35Config, c);
    int64_t H = c->hidden, kd = (int64_t)q->nk * q->dk, vd = (int64_t)q->nv * q->dv;
    Q35Layer *L = views;
#define V(suffix, nd, a, b) model_view_layer(m, flat, l, "linear_attn." suffix, nd, a, b)
    L->wqkv = V("in_proj_qkv.weight", 2, 2 * kd + vd, H);
    L->wz = V("in_proj_z.weight", 2, vd, H);
    L->wb = V("in_proj_b.weight", 2, q->nv, H);
    L->wa = V("in_proj_a.weight", 2, q->nv, H);
    L->conv = V("conv1d.weight", 2, 2 * kd + vd, q->conv_k);
    L->dt_bias = V("dt_bias", 1, q->nv, 0);
    L->A_log = V("A_log", 1, q->nv, 0);
    L->gnorm = V("norm.weight", 1, q->dv, 0);
    L->wout = V("out_proj.weight", 2, H, vd);
#undef V
}

// Gated DeltaNet's FP8 projections (Fp8Slot): in_proj_qkv, in_proj_z and out_proj (never in_proj_a/b).
static Tensor q35_fp8_weight(const Model *m, int l, Fp8Slot s) {
    const Q35Layer *W = model_layer_views(m, l, false);
    Tensor w[FP8_SLOTS] = {[FP8_QKV] = W->wqkv, [FP8_Z] = W->wz, [FP8_OUT] = W->wout};
    return w[s];
}

// keep: the training step's linear layers hold the delta rule's state from forward to backward (delta_rule_keep).
static DeltaArgs q35_delta_args(const Model *m, int B) {
    return (DeltaArgs){.B = B,
                       .scale = (float)(1.0 / sqrt((double)model_family_config(const Qwen35Config, &m->cfg)->dk)),
                       .qk_l2norm = true,
                       .chunk = 64,
                       .keep = m->delta_keep && !m->kv};
}
// The delta rule's q and v of B·S tokens as a plan sees them (shapes and dtype, no data).
static void q35_delta_plan(const Model *m, int64_t T, Tensor *qt, Tensor *vt) {
    const Qwen35Config *q = model_family_config(const Qwen35Config, &m->cfg);
    *qt = tensor_make(NULL, m->cdt, m->dev, 3, T, q->nk, q->dk, 0);
    *vt = tensor_make(NULL, m->cdt, m->dev, 3, T, q->nv, q->dv, 0);
}

// The ops' planned scratch (io->opws): the GPU delta rule's (op_delta_rule_workspace; the backward's holds the
// forward's, or with delta_rule_keep only the backward's own) in a linear layer, the attention backward's
// (op_attention_workspace: cuDNN's D and dQ accumulator; the ring attention of context parallelism has its own) in a
// full-attention layer. None on the CPU.
static size_t q35_op_ws(const Model *m, int l, int B, int S) {
    const Qwen35Config *q = model_family_config(const Qwen35Config, &m->cfg);
    int64_t T = (int64_t)B * S;
    if (is_linear(&m->cfg, l)) {
        DeltaArgs da = q35_delta_args(m, B);
        Tensor qt, vt;
        q35_delta_plan(m, T, &qt, &vt);
        return op_delta_rule_workspace(qt, vt, &da, true);
    }
    GqaShape g = q35_gqa(&m->cfg, l);
    AttnArgs aa = gqa_attn_args(m, &g, B);
    return m->cfg.cp_size > 1
               ? 0
               : op_attention_workspace(tensor_make(NULL, m->cdt, m->dev, 3, T, m->cfg.heads, q->head_dim, 0),
                                        tensor_make(NULL, m->cdt, m->dev, 3, T, q->kv_heads, q->head_dim, 0), &aa);
}

// ---- records ----

// q, k, v of T tokens as the column blocks of cv (T·(2·nk·dk + nv·dv) elements; op_conv1d_silu_forward's split nk·dk).
static void q35_blocks(Tensor cv, const Qwen35Config *q, int64_t T, Tensor *lq, Tensor *lk, Tensor *lv) {
    int64_t kn = T * q->nk * q->dk;
    char *p = cv.p; // NULL in a plan
    size_t e = dtype_size(cv.dt);
    *lq = tensor_make(p, cv.dt, cv.dev, 3, T, q->nk, q->dk, 1);
    *lk = tensor_make(p ? p + kn * e : NULL, cv.dt, cv.dev, 3, T, q->nk, q->dk, 1);
    *lv = tensor_make(p ? p + 2 * kn * e : NULL, cv.dt, cv.dev, 3, T, q->nv, q->dv, 1);
}

static void q35_mixer_alloc(Model *m, int l, void *rp, Arena *a, int B, int S) {
    const ModelConfig *c = &m->cfg;
    const Qwen35Config *q = model_family_config(const Qwen35Config, c);
    Q35Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, kd = (int64_t)q->nk * q->dk, vd = (int64_t)q->nv * q->dv;
    DType dt = m->cdt;
    r->qkv = arena_tensor(a, dt, 2, T, 2 * kd + vd, 0, 0);
    r->cv = arena_tensor(a, dt, 2, T, 2 * kd + vd, 0, 0);
    q35_blocks(r->cv, q, T, &r->lq, &r->lk, &r->lv);
    r->z = arena_tensor(a, dt, 2, T, vd, 0, 0);
    r->pa = arena_tensor(a, dt, 2, T, q->nv, 0, 0);
    r->pb = arena_tensor(a, dt, 2, T, q->nv, 0, 0);
    r->g = arena_tensor(a, DT_F32, 2, T, q->nv, 0, 0);
    r->beta = arena_tensor(a, DT_F32, 2, T, q->nv, 0, 0);
    r->core = arena_tensor(a, dt, 3, T, q->nv, q->dv, 0);
    r->rg = arena_tensor(a, DT_F32, 1, T * q->nv, 0, 0, 0);
    r->gn = arena_tensor(a, dt, 2, T, vd, 0, 0);
    if (c->cp_size > 1) {
        r->n1c = arena_tensor(a, dt, 2, T, H, 0, 0);
        r->halo = arena_tensor(a, dt, 2, (int64_t)B * (q->conv_k - 1), 2 * kd + vd, 0, 0);
        r->s0 = arena_tensor(a, DT_F32, 4, B, q->nv, q->dk, q->dv);
        r->posc = arena_tensor(a, DT_I32, 1, T, 0, 0, 0);
    }
    DeltaArgs da = q35_delta_args(m, B);
    Tensor qt, vt;
    q35_delta_plan(m, T, &qt, &vt);
    size_t keep = da.keep && is_linear(c, l) ? op_delta_rule_kept(qt, vt, &da) : 0;
    r->dws = keep ? arena_tensor(a, DT_F32, 1, (int64_t)keep, 0, 0, 0) : (Tensor){0};
}

// The delta rule's scratch: the planned workspace (io->opws; none in generation: the op scratch), and the record's
// state kept from forward to backward (delta_rule_keep), or none.
static void q35_delta_ws(DeltaArgs *da, const Q35Rec *r, Tensor opws) {
    da->ws = opws, da->kept = r->dws, da->keep = r->dws.p != NULL;
}

static void q35_mixer_grad_alloc(Model *m, int l, void *rp, Arena *ws, int B, int S) {
    const ModelConfig *c = &m->cfg;
    const Qwen35Config *q = model_family_config(const Qwen35Config, c);
    Q35Rec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, kd = (int64_t)q->nk * q->dk, vd = (int64_t)q->nv * q->dv;
    DType dt = m->cdt;
    r->dqkv = arena_tensor(ws, dt, 2, T, 2 * kd + vd, 0, 0);
    r->dcv = arena_tensor(ws, dt, 2, T, 2 * kd + vd, 0, 0);
    q35_blocks(r->dcv, q, T, &r->dlq, &r->dlk, &r->dlv);
    r->dz = arena_tensor(ws, dt, 2, T, vd, 0, 0);
    r->dpa = arena_tensor(ws, dt, 2, T, q->nv, 0, 0);
    r->dpb = arena_tensor(ws, dt, 2, T, q->nv, 0, 0);
    r->dg = arena_tensor(ws, DT_F32, 2, T, q->nv, 0, 0);
    r->dbeta = arena_tensor(ws, DT_F32, 2, T, q->nv, 0, 0);
    r->dcore = arena_tensor(ws, dt, 3, T, q->nv, q->dv, 0);
    r->dgn = arena_tensor(ws, dt, 2, T, vd, 0, 0);
    r->dh1c = c->cp_size > 1 ? arena_tensor(ws, dt, 2, T, H, 0, 0) : r->dh1;
    r->dn1c = c->cp_size > 1 ? arena_tensor(ws, dt, 2, T, H, 0, 0) : r->dn1;
}

// ---- the mixer: Gated DeltaNet (the full-attention layers' is gqa.c's) ----

// The document positions the conv1d and the delta rule take (document masking; p NULL without it): mb->pos, or under
// context parallelism its contiguous layout in the record, made by the forward (fwd) and read by the backward. The
// relayout moves the int32 words as fp32 ones: copies and transfers keep their bits.
static Tensor delta_pos(Model *m, Q35Rec *r, const MicroBatch *mb, bool fwd) {
    if (!mb->docs) return NONE;
    if (m->cfg.cp_size == 1) return mb->pos;
    if (fwd) {
        Tensor src = mb->pos, dst = r->posc;
        src.dt = dst.dt = DT_F32;
        model_cp_contiguous(m, tensor_reshape2(dst, mb->T, 1), tensor_reshape2(src, mb->T, 1), mb->B);
    }
    return r->posc;
}

// Gated DeltaNet: n1 → h1a (without the residual).
// Generation (m->kv): the cache's halo and state enter, and the call's last conv inputs and final state stay.
static void q35_mixer_forward(Model *m, int l, void *rp, MicroBatch *mb, Tensor opws) {
    const Qwen35Config *q = model_family_config(const Qwen35Config, &m->cfg);
    const Q35Layer *W = model_layer_views(m, l, false);
    Q35Rec *r = rp;
    int64_t T = mb->T, kd = (int64_t)q->nk * q->dk;
    DeltaArgs da = q35_delta_args(m, mb->B);
    q35_delta_ws(&da, r, opws);
    da.pos = delta_pos(m, r, mb, true);
    if (m->cfg.cp_size == 1) r->n1c = r->n1; // n1 moves when recomputed (its staging)
    r->h1c = m->cfg.cp_size > 1 ? r->h1 : r->h1a;
    model_cp_contiguous(m, r->n1c, r->n1, mb->B);
    model_proj_forward(m, l, FP8_QKV, r->qkv, r->n1c, W->wqkv, NONE);
    if (m->kv) r->halo = kv_cache_delta(m->kv, l, r->qkv, q->conv_k, q->nv, q->dk, q->dv, &da);
    model_proj_forward(m, l, FP8_Z, r->z, r->n1c, W->wz, NONE);
    op_linear_forward(r->pb, r->n1c, W->wb, NONE);
    op_linear_forward(r->pa, r->n1c, W->wa, NONE);
    model_conv1d_silu_forward(m, r->cv, r->qkv, W->conv, r->halo, da.pos, mb->B, kd); // into lq, lk, lv
    op_delta_gates_forward(r->g, r->beta, r->pa, r->pb, W->A_log, W->dt_bias);
    if (m->kv) op_delta_rule_forward(r->core, r->lq, r->lk, r->lv, r->g, r->beta, &da);
    else model_delta_rule_forward(m, r->core, r->lq, r->lk, r->lv, r->g, r->beta, da, r->s0);
    if (m->kv) kv_cache_delta_advance(m->kv, l, r->qkv);
    op_rmsnorm_forward(tensor_reshape2(r->gn, T * q->nv, q->dv), r->rg, tensor_reshape2(r->core, T * q->nv, q->dv),
                       W->gnorm, (float)m->cfg.eps, &(RmsArgs){.z = tensor_reshape2(r->z, T * q->nv, q->dv)});
    model_proj_forward(m, l, FP8_OUT, r->h1c, r->gn, W->wout, NONE);
    model_cp_zigzag(m, r->h1a, r->h1c, mb->B);
}

// dh1 (∂/∂h1a) → dn1.
static void q35_mixer_backward(Model *m, int l, void *rp, MicroBatch *mb, Tensor opws) {
    const Qwen35Config *q = model_family_config(const Qwen35Config, &m->cfg);
    const Q35Layer *W = model_layer_views(m, l, false), *G = model_layer_views(m, l, true);
    Q35Rec *r = rp;
    int64_t T = mb->T, kd = (int64_t)q->nk * q->dk, Rv = T * q->nv;
    if (m->cfg.cp_size == 1) r->n1c = r->n1;
    model_cp_contiguous(m, r->dh1c, r->dh1, mb->B);
    model_proj_backward_input(m, l, FP8_OUT, r->dgn, r->dh1c, W->wout, false);
    model_proj_backward_weight(m, l, FP8_OUT, G->wout, NONE, r->dh1c, r->gn);
    op_rmsnorm_backward(tensor_reshape2(r->dcore, Rv, q->dv), G->gnorm, tensor_reshape2(r->dgn, Rv, q->dv),
                        tensor_reshape2(r->core, Rv, q->dv), W->gnorm, r->rg, false,
                        &(RmsArgs){.z = tensor_reshape2(r->z, Rv, q->dv), .dz = tensor_reshape2(r->dz, Rv, q->dv)});
    DeltaArgs da = q35_delta_args(m, mb->B);
    q35_delta_ws(&da, r, opws);
    da.pos = delta_pos(m, r, mb, false);
    model_delta_rule_backward(m, r->dlq, r->dlk, r->dlv, r->dg, r->dbeta, r->dcore, r->lq, r->lk, r->lv, r->g, r->beta,
                              da, r->s0);
    op_delta_gates_backward(r->dpa, r->dpb, G->A_log, G->dt_bias, r->dg, r->dbeta, r->pa, r->pb, W->A_log, W->dt_bias);
    model_conv1d_silu_backward(m, r->dqkv, G->conv, r->dcv, r->qkv, W->conv, r->halo, da.pos, mb->B, kd);
    model_proj_backward_input(m, l, FP8_QKV, r->dn1c, r->dqkv, W->wqkv, false);
    model_proj_backward_input(m, l, FP8_Z, r->dn1c, r->dz, W->wz, true);
    op_linear_backward_input(r->dn1c, r->dpb, W->wb, true);
    op_linear_backward_input(r->dn1c, r->dpa, W->wa, true);
    model_proj_backward_weights(m, l, 4, (Fp8Slot[]){FP8_QKV, FP8_Z, FP8_NONE, FP8_NONE},
                                (Tensor[]){G->wqkv, G->wz, G->wb, G->wa}, (Tensor[]){NONE, NONE, NONE, NONE},
                                (Tensor[]){r->dqkv, r->dz, r->dpb, r->dpa}, r->n1c);
    model_cp_zigzag(m, r->dn1, r->dn1c, mb->B);
}

const ModelFamily qwen3_5_moe_family = {
    .model_type = "qwen3_5_moe_text",
    .rec_size = sizeof(Q35Rec),
    .router = "mlp.gate",
    .shared = "mlp.shared_expert",
    .shared_gate = true,
    .config_parse = q35_config_parse,
    .gqa = q35_gqa,
    .mixer_params = q35_mixer_params,
    .layer_views = sizeof(Q35Layer),
    .bind_layer = q35_bind_layer,
    .fp8_weight = q35_fp8_weight,
    .mixer_alloc = q35_mixer_alloc,
    .mixer_grad_alloc = q35_mixer_grad_alloc,
    .mixer_forward = q35_mixer_forward,
    .mixer_backward = q35_mixer_backward,
    .op_ws = q35_op_ws,
};
