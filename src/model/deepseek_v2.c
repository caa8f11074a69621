// deepseek_v2.c — the DeepSeek-V2 family (deepseek-ai/DeepSeek-V2, -V2-Lite) in the 5-stage protocol, as
// transformers 5.17's DeepseekV2ForCausalLM computes it (the parity reference, tests/hf/deepseek_v2*).
// Layer: x → RMSNorm = n1 → multi-head latent attention → + x = h1a → RMSNorm = n2 → router and shared
// experts; h1 = h1a + shared(n2) is the residual stage 5 adds the routed experts to. Layers below
// first_k_dense_replace have a dense SwiGLU MLP instead (no router, no shared experts).
// MLA (per token, nh heads, dn = qk_nope_head_dim, dr = qk_rope_head_dim, dq = dn + dr, dv = v_head_dim):
//   q   = q_proj(n1), or q_b_proj(RMSNorm(q_a_proj(n1)))            (T, nh, dq) = per head [q_nope | q_pe]
//   kva = kv_a_proj_with_mqa(n1)                                     (T, ckv + dr) = [compressed kv | k_pe]
//   kv  = kv_b_proj(RMSNorm(compressed kv))                          (T, nh, dn + dv) = per head [k_nope | v]
//   RoPE on q_pe and k_pe in DeepSeek's pair layout (dims 2i, 2i+1), one k_pe shared by every head;
//   k = [k_nope | k_pe], causal attention with scale dq^-½ (× mscale(factor, mscale_all_dim)² under YaRN,
//   whose attention factor is folded into the rope tables), o_proj: (T, nh·dv) → (T, H).
// Router: fp32 logits → softmax over E → top-k (group-limited: only inside the topk_group groups with the
// best expert), weights = probs × routed_scaling_factor, no renormalisation. Shapes: T = B·S tokens, H
// hidden, E routed experts, k per token, Is = moe_intermediate_size · n_shared_experts.
#include <math.h>

#include "model/model.h"

typedef struct {
    int q_lora, kv_lora, nope, vdim; // q_lora_rank (0: a plain q_proj), kv_lora_rank, qk_nope_head_dim, v_head_dim
    double softmax_scale;
    bool attn_bias; // biases on q_a_proj, kv_a_proj_with_mqa, o_proj
} Dsv2Config;
MODEL_FAMILY_CONFIG_FITS(Dsv2Config);

// The q_a and kv_a norms are built without the config's eps in transformers (DeepseekV2RMSNorm's default).
#define LORA_NORM_EPS 1e-6f

typedef struct {
    Tensor wq, wqa, bqa, qan, wqb, wkva, bkva, kvan, wkvb, wo, bo; // absent ones {0}
} Dsv2Layer;

typedef struct {
    LAYER_FIELDS;          // h1: after attention and the shared experts
    Tensor qa, qan, rqa;   // q LoRA: (T, q_lora) projection, its norm, (T) rstd
    Tensor q;              // (T, nh, dq) queries, q_pe roped
    Tensor kva;            // (T, ckv + dr) [compressed kv | k_pe], k_pe roped in place
    Tensor ckv, ckvn, rkv; // (T, ckv) compressed kv, its norm, (T) rstd
    Tensor kv;             // (T, nh, dn + dv) per head [k_nope | v]
    Tensor k, v;           // (T, nh, dq), (T, nh, dv)
    Tensor att, lse;       // (T, nh, dv), (B, nh, S)
    // backward workspace
    Tensor dqa, dqan, dq, dk, dv, datt, dkv, dckvn, dckv, dkva;
} Dsv2Rec;

// ---- config and parameters ----

static void dsv2_config_parse(ModelConfig *c, JObj o) {
    Dsv2Config *d = model_family_config(Dsv2Config, c);
    c->hidden = (int)jint(o, "hidden_size", true, 0);
    c->layers = (int)jint(o, "num_hidden_layers", true, 0);
    c->heads = (int)jint(o, "num_attention_heads", true, 0);
    c->vocab = (int)jint(o, "vocab_size", true, 0);
    c->eps = jnum(o, "rms_norm_eps", false, 1e-6);
    c->experts = (int)jint(o, "n_routed_experts", true, 0);
    c->topk = (int)jint(o, "num_experts_per_tok", true, 0);
    c->moe_inter = (int)jint(o, "moe_intermediate_size", true, 0);
    c->dense_inter = (int)jint(o, "intermediate_size", false, 0);
    c->tie_embed = jbool(o, "tie_word_embeddings", false, false);
    d->q_lora = (int)jint(o, "q_lora_rank", false, 0);
    d->kv_lora = (int)jint(o, "kv_lora_rank", true, 0);
    d->nope = (int)jint(o, "qk_nope_head_dim", true, 0);
    d->vdim = (int)jint(o, "v_head_dim", true, 0);
    c->shared_inter = c->moe_inter * (int)jint(o, "n_shared_experts", false, 0);
    double routed_scale = jnum(o, "routed_scaling_factor", false, 1.0);
    d->attn_bias = jbool(o, "attention_bias", false, false);
    int rd = (int)jint(o, "qk_rope_head_dim", true, 0);
    if (d->q_lora < 0 || d->kv_lora <= 0 || d->nope < 0 || d->vdim <= 0 || rd <= 0 || c->shared_inter < 0)
        jdie(o, NULL,
             "q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim and n_shared_experts must be "
             "valid sizes");
    if (jhas(o, "num_key_value_heads") && jint(o, "num_key_value_heads", true, 0) != c->heads)
        jdie(o, "num_key_value_heads", "must equal num_attention_heads for MLA (got %d of %d)",
             (int)jint(o, "num_key_value_heads", true, 0), c->heads);
    if (strcmp(jstr(o, "hidden_act", false, "silu"), "silu")) jdie(o, "hidden_act", "only silu is supported");
    if (jbool(o, "mlp_bias", false, false)) jdie(o, "mlp_bias", "MLP biases are not supported for deepseek_v2");
    if (jint(o, "moe_layer_freq", false, 1) != 1)
        jdie(o, "moe_layer_freq", "only 1 is supported (every layer from first_k_dense_replace on is MoE)");
    if (!(routed_scale > 0)) jdie(o, "routed_scaling_factor", "must be positive");
    c->router = (RouterArgs){.scale = (float)routed_scale};
    const char *method = jstr(o, "topk_method", false, "greedy");
    if (!strcmp(method, "group_limited_greedy")) {
        c->router.n_group = (int)jint(o, "n_group", true, 0),
        c->router.topk_group = (int)jint(o, "topk_group", true, 0);
        if (c->router.n_group < 1 || c->experts % c->router.n_group)
            jdie(o, "n_group", "must divide n_routed_experts (%d)", c->experts);
        if (c->router.topk_group < 1 || c->router.topk_group > c->router.n_group)
            jdie(o, "topk_group", "must be in [1, n_group = %d]", c->router.n_group);
        if (c->topk > c->router.topk_group * (c->experts / c->router.n_group))
            jdie(o, "num_experts_per_tok", "must be at most topk_group × n_routed_experts / n_group = %d",
                 c->router.topk_group * (c->experts / c->router.n_group));
    } else if (strcmp(method, "greedy")) {
        jdie(o, "topk_method", "'%s' is not supported (greedy or group_limited_greedy)", method);
    }
    // RoPE on the dr rope dims: default or YaRN; transformers scales the softmax by mscale(factor,
    // mscale_all_dim)² for any non-default rope type with mscale_all_dim set.
    moe_rope_parse(c, o, rd, true);
    double f = c->rope.factor, mad = c->rope.mscale_all_dim,
           ms = c->rope.yarn && mad != 0 && f > 1 ? 0.1 * mad * log(f) + 1 : 1;
    d->softmax_scale = ms * ms / sqrt((double)(d->nope + rd));
    c->ring.nh = c->ring.nkv = c->heads, c->ring.dqk = d->nope + rd, c->ring.dv = d->vdim, c->ring.dc = d->kv_lora,
    c->ring.dn = d->nope;
    int first_dense = (int)jint(o, "first_k_dense_replace", false, 0);
    if (first_dense < 0) jdie(o, "first_k_dense_replace", "must be non-negative");
    for (int l = 0; l < c->layers && l < MAX_LAYERS; l++) c->is_moe[l] = l >= first_dense;
    moe_config_check(c, o, "n_routed_experts");
}

// MLA's parameters, after input_layernorm.
static void dsv2_mixer_params(ParamTable *t, const ModelConfig *c, int l) {
    const Dsv2Config *d = model_family_config(const Dsv2Config, c);
    int64_t H = c->hidden, nh = c->heads, dq = d->nope + c->rope.rd, rd = c->rope.rd;
#define P(suffix, init, nd, a, b) params_add_layer(t, l, "self_attn." suffix, init, nd, a, b)
    if (!d->q_lora) {
        P("q_proj.weight", INIT_NORMAL, 2, nh * dq, H);
    } else {
        P("q_a_proj.weight", INIT_NORMAL, 2, d->q_lora, H);
        if (d->attn_bias) P("q_a_proj.bias", INIT_ZEROS, 1, d->q_lora, 0);
        P("q_a_layernorm.weight", INIT_ONES, 1, d->q_lora, 0);
        P("q_b_proj.weight", INIT_NORMAL, 2, nh * dq, d->q_lora);
    }
    P("kv_a_proj_with_mqa.weight", INIT_NORMAL, 2, d->kv_lora + rd, H);
    if (d->attn_bias) P("kv_a_proj_with_mqa.bias", INIT_ZEROS, 1, d->kv_lora + rd, 0);
    P("kv_a_layernorm.weight", INIT_ONES, 1, d->kv_lora, 0);
    P("kv_b_proj.weight", INIT_NORMAL, 2, nh * (d->nope + d->vdim), d->kv_lora);
    P("o_proj.weight", INIT_NORMAL_OUT, 2, H, nh * d->vdim);
    if (d->attn_bias) P("o_proj.bias", INIT_ZEROS, 1, H, 0);
#undef P
}

// MLA's weight (or gradient) views of layer l.
static void dsv2_bind_layer(Model *m, Tensor *flat, int l, void *views) {
    const ModelConfig *c = &m->cfg;
    const Dsv2Config *d = model_family_config(const Dsv2Config, c);
    int64_t H = c->hidden, nh = c->heads, dq = d->nope + c->rope.rd, rd = c->rope.rd;
    Dsv2Layer *L = views;
#define V(suffix, nd, a, b) model_view_layer(m, flat, l, "self_attn." suffix, nd, a, b)
    L->wq = V("q_proj.weight", 2, nh * dq, H);
    L->wqa = V("q_a_proj.weight", 2, d->q_lora, H);
    L->bqa = V("q_a_proj.bias", 1, d->q_lora, 0);
    L->qan = V("q_a_layernorm.weight", 1, d->q_lora, 0);
    L->wqb = V("q_b_proj.weight", 2, nh * dq, d->q_lora);
    L->wkva = V("kv_a_proj_with_mqa.weight", 2, d->kv_lora + rd, H);
    L->bkva = V("kv_a_proj_with_mqa.bias", 1, d->kv_lora + rd, 0);
    L->kvan = V("kv_a_layernorm.weight", 1, d->kv_lora, 0);
    L->wkvb = V("kv_b_proj.weight", 2, nh * (d->nope + d->vdim), d->kv_lora);
    L->wo = V("o_proj.weight", 2, H, nh * d->vdim);
    L->bo = V("o_proj.bias", 1, H, 0);
#undef V
}

// MLA's FP8 projections (Fp8Slot): q (or q_a, q_b), kv_a_with_mqa, kv_b, o.
static Tensor dsv2_fp8_weight(const Model *m, int l, Fp8Slot s) {
    const Dsv2Layer *W = model_layer_views(m, l, false);
    Tensor w[FP8_SLOTS] = {[FP8_Q] = W->wq,      [FP8_Q_A] = W->wqa,   [FP8_Q_B] = W->wqb,
                           [FP8_KV_A] = W->wkva, [FP8_KV_B] = W->wkvb, [FP8_O] = W->wo};
    return w[s];
}

// ---- records ----

static void dsv2_mixer_alloc(Model *m, int l, void *rp, Arena *a, int B, int S) {
    const ModelConfig *c = &m->cfg;
    const Dsv2Config *d = model_family_config(const Dsv2Config, c);
    Dsv2Rec *r = rp;
    int64_t T = (int64_t)B * S, nh = c->heads, rd = c->rope.rd, dq = d->nope + rd;
    DType dt = m->cdt;
    if (d->q_lora) {
        r->qa = arena_tensor(a, dt, 2, T, d->q_lora, 0, 0);
        r->qan = arena_tensor(a, dt, 2, T, d->q_lora, 0, 0);
        r->rqa = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    }
    r->q = arena_tensor(a, dt, 3, T, nh, dq, 0);
    r->kva = arena_tensor(a, dt, 2, T, d->kv_lora + rd, 0, 0);
    r->ckv = arena_tensor(a, dt, 2, T, d->kv_lora, 0, 0);
    r->ckvn = arena_tensor(a, dt, 2, T, d->kv_lora, 0, 0);
    r->rkv = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    if (c->cp_size == 1) { // under context parallelism the latent travels and each hop decompresses its own
        r->kv = arena_tensor(a, dt, 3, T, nh, d->nope + d->vdim, 0);
        r->k = arena_tensor(a, dt, 3, T, nh, dq, 0);
        r->v = arena_tensor(a, dt, 3, T, nh, d->vdim, 0);
    }
    r->att = arena_tensor(a, dt, 3, T, nh, d->vdim, 0);
    r->lse = arena_tensor(a, DT_F32, 3, B, nh, S, 0);
}

static void dsv2_mixer_grad_alloc(Model *m, int l, void *rp, Arena *ws, int B, int S) {
    const ModelConfig *c = &m->cfg;
    const Dsv2Config *d = model_family_config(const Dsv2Config, c);
    Dsv2Rec *r = rp;
    int64_t T = (int64_t)B * S, nh = c->heads, rd = c->rope.rd, dq = d->nope + rd;
    DType dt = m->cdt;
    if (d->q_lora) {
        r->dqan = arena_tensor(ws, dt, 2, T, d->q_lora, 0, 0);
        r->dqa = arena_tensor(ws, dt, 2, T, d->q_lora, 0, 0);
    }
    r->dq = arena_tensor(ws, dt, 3, T, nh, dq, 0);
    if (c->cp_size == 1) { // the one-rank path's scratch (the ring has its own)
        r->dk = arena_tensor(ws, dt, 3, T, nh, dq, 0);
        r->dv = arena_tensor(ws, dt, 3, T, nh, d->vdim, 0);
        r->dkv = arena_tensor(ws, dt, 3, T, nh, d->nope + d->vdim, 0);
    }
    r->datt = arena_tensor(ws, dt, 3, T, nh, d->vdim, 0);
    r->dckvn = arena_tensor(ws, dt, 2, T, d->kv_lora, 0, 0);
    r->dckv = arena_tensor(ws, dt, 2, T, d->kv_lora, 0, 0);
    r->dkva = arena_tensor(ws, dt, 2, T, d->kv_lora + rd, 0, 0);
}

// ---- the mixer: multi-head latent attention ----

static AttnArgs dsv2_attn_args(const Model *m, const MicroBatch *mb) {
    return (AttnArgs){.B = mb->B,
                      .scale = (float)model_family_config(const Dsv2Config, &m->cfg)->softmax_scale,
                      .causal = true,
                      .deterministic = m->deterministic,
                      .docpos = mb->docs ? mb->pos : (Tensor){0}};
}

// The latent of layer l's record: kv_a_layernorm's output and k_pe (columns [ckv, ckv + dr) of kva), kv_b_proj.
static MlaLatent dsv2_latent(Model *m, int l, Dsv2Rec *r) {
    const Dsv2Config *d = model_family_config(const Dsv2Config, &m->cfg);
    MlaLatent ml = {.r = {.c = r->ckvn,
                          .pe = r->kva,
                          .pe_col = d->kv_lora,
                          .nh = m->cfg.heads,
                          .dn = d->nope,
                          .dr = m->cfg.rope.rd,
                          .dv = d->vdim},
                    .m = m,
                    .layer = l,
                    .wkvb = ((const Dsv2Layer *)model_layer_views(m, l, false))->wkvb,
                    .dwkvb = ((const Dsv2Layer *)model_layer_views(m, l, true))->wkvb};
    return model_mla_hooked(&ml);
}

// n1 → h1a (without the residual).
static void dsv2_mixer_forward(Model *m, int l, void *rp, MicroBatch *mb, Tensor opws) {
    const ModelConfig *c = &m->cfg;
    const Dsv2Config *d = model_family_config(const Dsv2Config, c);
    const Dsv2Layer *W = model_layer_views(m, l, false);
    Dsv2Rec *r = rp;
    int64_t T = mb->T, nh = c->heads, rd = c->rope.rd, dn = d->nope, dq = dn + rd, dv = d->vdim, ckv = d->kv_lora;
    Tensor q2 = tensor_reshape2(r->q, T, nh * dq);
    if (!d->q_lora) {
        model_proj_forward(m, l, FP8_Q, q2, r->n1, W->wq, NONE);
    } else {
        model_proj_forward(m, l, FP8_Q_A, r->qa, r->n1, W->wqa, W->bqa);
        op_rmsnorm_forward(r->qan, r->rqa, r->qa, W->qan, LORA_NORM_EPS, NULL);
        model_proj_forward(m, l, FP8_Q_B, q2, r->qan, W->wqb, NONE);
    }
    model_proj_forward(m, l, FP8_KV_A, r->kva, r->n1, W->wkva, W->bkva);
    op_copy_cols(r->ckv, 0, r->kva, 0, ckv, false);
    op_rmsnorm_forward(r->ckvn, r->rkv, r->ckv, W->kvan, LORA_NORM_EPS, NULL);
    // RoPE: dims [dn, dq) of every query head, and the one k_pe (columns [ckv, ckv + dr) of kva as a
    // (T, 1, ckv + dr) tensor).
    op_rope(r->q, (int)dn, m->rope_cos, m->rope_sin, mb->pos, ROPE_PAIRS, false);
    op_rope(tensor_make(r->kva.p, r->kva.dt, r->kva.dev, 3, T, 1, ckv + rd, 1), (int)ckv, m->rope_cos, m->rope_sin,
            mb->pos, ROPE_PAIRS, false);
    // kv_b_proj decompresses the latent into k = [k_nope | k_pe] and v per head, then attention (under context
    // parallelism the latent travels the ring and each hop decompresses its own).
    MlaLatent ml = dsv2_latent(m, l, r);
    AttnArgs aa = dsv2_attn_args(m, mb);
    model_mla_attention_forward(m, l, r->att, r->lse, r->q, &ml, r->kv, r->k, r->v, &aa);
    model_proj_forward(m, l, FP8_O, r->h1a, tensor_reshape2(r->att, T, nh * dv), W->wo, W->bo);
}

// dh1 (∂/∂h1a) → dn1.
static void dsv2_mixer_backward(Model *m, int l, void *rp, MicroBatch *mb, Tensor opws) {
    const ModelConfig *c = &m->cfg;
    const Dsv2Config *d = model_family_config(const Dsv2Config, c);
    const Dsv2Layer *W = model_layer_views(m, l, false), *G = model_layer_views(m, l, true);
    Dsv2Rec *r = rp;
    int64_t T = mb->T, nh = c->heads, rd = c->rope.rd, dn = d->nope, dq = dn + rd, dv = d->vdim, ckv = d->kv_lora;
    model_proj_backward_input(m, l, FP8_O, tensor_reshape2(r->datt, T, nh * dv), r->dh1, W->wo, false);
    model_proj_backward_weight(m, l, FP8_O, G->wo, G->bo, r->dh1, tensor_reshape2(r->att, T, nh * dv));
    AttnArgs aa = dsv2_attn_args(m, mb);
    // attention and kv_b_proj: dq, the latent's gradient (dckvn and k_pe's, the sum over the heads that share it, in
    // dkva's columns) and kv_b_proj's weight gradient
    MlaLatent ml = dsv2_latent(m, l, r);
    model_mla_attention_backward(m, r->dq, r->dckvn, r->dkva, r->datt, r->q, r->k, r->v, r->att, r->lse, r->dk, r->dv,
                                 r->dkv, &ml, &aa);
    op_rope(tensor_make(r->dkva.p, r->dkva.dt, r->dkva.dev, 3, T, 1, ckv + rd, 1), (int)ckv, m->rope_cos, m->rope_sin,
            mb->pos, ROPE_PAIRS, true);
    op_rope(r->dq, (int)dn, m->rope_cos, m->rope_sin, mb->pos, ROPE_PAIRS, true);
    // kv_a_layernorm, kv_a_proj_with_mqa
    op_rmsnorm_backward(r->dckv, G->kvan, r->dckvn, r->ckv, W->kvan, r->rkv, false, NULL);
    op_copy_cols(r->dkva, 0, r->dckv, 0, ckv, false);
    model_proj_backward_input(m, l, FP8_KV_A, r->dn1, r->dkva, W->wkva, false);
    // the query projection(s), then the weight gradients of those of n1 (q or q_a, and kv_a) side by side
    Tensor dq2 = tensor_reshape2(r->dq, T, nh * dq);
    if (!d->q_lora) {
        model_proj_backward_input(m, l, FP8_Q, r->dn1, dq2, W->wq, true);
        model_proj_backward_weights(m, l, 2, (Fp8Slot[]){FP8_Q, FP8_KV_A}, (Tensor[]){G->wq, G->wkva},
                                    (Tensor[]){NONE, G->bkva}, (Tensor[]){dq2, r->dkva}, r->n1);
        return;
    }
    model_proj_backward_input(m, l, FP8_Q_B, r->dqan, dq2, W->wqb, false);
    model_proj_backward_weight(m, l, FP8_Q_B, G->wqb, NONE, dq2, r->qan);
    op_rmsnorm_backward(r->dqa, G->qan, r->dqan, r->qa, W->qan, r->rqa, false, NULL);
    model_proj_backward_input(m, l, FP8_Q_A, r->dn1, r->dqa, W->wqa, true);
    model_proj_backward_weights(m, l, 2, (Fp8Slot[]){FP8_Q_A, FP8_KV_A}, (Tensor[]){G->wqa, G->wkva},
                                (Tensor[]){G->bqa, G->bkva}, (Tensor[]){r->dqa, r->dkva}, r->n1);
}

// ---- HF import: per-expert keys (what transformers 5.17 writes) or each layer's experts grouped ----
// Grouped, as transformers holds them in memory: layers.L.mlp.experts.gate_up_proj (E, 2I, H) with expert
// e's [gate_proj; up_proj] rows, and layers.L.mlp.experts.down_proj (E, H, I). A canonical expert tensor
// is a contiguous slice of those, so import slices without copying. Export writes per expert (the rename).

// The grouped tensor of layer l ("gate_up_proj" or "down_proj") with its shape checked, or NULL.
static const StTensor *hf_grouped(const ModelConfig *c, const StSet *hf, int l, const char *which) {
    char n[96];
    snprintf(n, sizeof n, "layers.%d.mlp.experts.%s", l, which);
    const StTensor *x = hf_find(hf, n);
    bool gu = !strcmp(which, "gate_up_proj");
    int64_t shape[3] = {c->experts, gu ? 2 * (int64_t)c->moe_inter : c->hidden, gu ? c->hidden : c->moe_inter};
    if (x) st_check_shape(x, 3, shape);
    return x;
}

static int dsv2_hf_import(const ModelConfig *c, const ParamTable *t, const StSet *hf, StWriter *w, const char *dtype,
                          HfBuffers *keep) {
    int64_t H = c->hidden, I = c->moe_inter;
    int used = 0; // HF tensors accounted for
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *p = &t->p[i];
        const StTensor *x = hf_find(hf, p->name);
        int l, e, n = 0;
        char part[16];
        if (x) {
            st_check_shape(x, p->nd, p->shape);
            st_writer_add_raw(w, p->name, x->dt, x->nd, x->shape, x->data);
            used++;
            continue;
        }
        if (sscanf(p->name, "layers.%d.mlp.experts.%d.%15[a-z]_proj.weight%n", &l, &e, part, &n) != 3 || p->name[n])
            die("%s: tensor 'model.%s' is missing", hf->n ? hf->t[0]->file : "HF folder", p->name);
        bool down = !strcmp(part, "down");
        const StTensor *g = hf_grouped(c, hf, l, down ? "down_proj" : "gate_up_proj");
        if (!g)
            die("%s: tensor 'model.%s' is missing (nor are layer %d's experts grouped in "
                "model.layers.%d.mlp.experts.%s)",
                hf->n ? hf->t[0]->file : "HF folder", p->name, l, l, down ? "down_proj" : "gate_up_proj");
        int64_t off = down ? (int64_t)e * H * I : (int64_t)e * 2 * I * H + (strcmp(part, "up") ? 0 : I * H); // elements
        st_writer_add_raw(w, p->name, g->dt, p->nd, p->shape,
                          (const char *)g->data + off * (int64_t)st_dtype_size(g->dt));
    }
    for (int l = 0; l < c->layers; l++)
        used += c->is_moe[l]
                    ? (hf_grouped(c, hf, l, "gate_up_proj") != NULL) + (hf_grouped(c, hf, l, "down_proj") != NULL)
                    : 0;
    if (used != hf->n) // a tensor that is neither a parameter nor a grouped expert tensor
        for (int i = 0; i < hf->n; i++) {
            const char *name = strncmp(hf->t[i]->name, "model.", 6) ? hf->t[i]->name : hf->t[i]->name + 6;
            int l, n = 0;
            char which[16];
            bool grouped = sscanf(name, "layers.%d.mlp.experts.%15[a-z_]%n", &l, which, &n) == 2 && !name[n] &&
                           l >= 0 && l < c->layers && c->is_moe[l] &&
                           (!strcmp(which, "gate_up_proj") || !strcmp(which, "down_proj"));
            if (!grouped && !params_find(t, name))
                die("%s: tensor '%s' is not a parameter of this %s model", hf->t[i]->file, hf->t[i]->name,
                    c->model_type);
        }
    (void)keep, (void)dtype;
    return 0; // no MXFP4
}

const ModelFamily deepseek_v2_family = {
    .model_type = "deepseek_v2",
    .rec_size = sizeof(Dsv2Rec),
    .router = "mlp.gate",
    .shared = "mlp.shared_experts",
    .config_parse = dsv2_config_parse,
    .mixer_params = dsv2_mixer_params,
    .layer_views = sizeof(Dsv2Layer),
    .bind_layer = dsv2_bind_layer,
    .fp8_weight = dsv2_fp8_weight,
    .mixer_alloc = dsv2_mixer_alloc,
    .mixer_grad_alloc = dsv2_mixer_grad_alloc,
    .mixer_forward = dsv2_mixer_forward,
    .mixer_backward = dsv2_mixer_backward,
    .hf_import = dsv2_hf_import,
};

// ---- multi-head latent attention: the latent decompressed (the hooks model_mla_attention_* and the ring call) ----

void model_mla_decompress(const MlaLatent *ml, Tensor c, Tensor pe, int pe_col, Tensor kv, Tensor k, Tensor v) {
    int64_t R = c.n[0], nh = ml->r.nh, dn = ml->r.dn, dv = ml->r.dv, dq = dn + ml->r.dr;
    Tensor kv2 = tensor_reshape2(kv, R, nh * (dn + dv));
    if (ml->m) model_proj_forward(ml->m, ml->layer, FP8_KV_B, kv2, c, ml->wkvb, (Tensor){0}); // FP8 slot of the layer
    else op_linear_forward(kv2, c, ml->wkvb, (Tensor){0});
    Tensor kvh = tensor_reshape2(kv, R * nh, dn + dv), kh = tensor_reshape2(k, R * nh, dq),
           k2 = tensor_reshape2(k, R, nh * dq), pe2 = tensor_reshape2(pe, R, t_cols(pe));
    if (dn) op_copy_cols(kh, 0, kvh, 0, dn, false);
    op_copy_cols(tensor_reshape2(v, R * nh, dv), 0, kvh, dn, dv, false);
    op_copy_col_blocks(k2, dn, dq, pe2, pe_col, 0, ml->r.dr, nh, false); // the shared k_pe into every head
}

void model_mla_decompress_backward(const MlaLatent *ml, Tensor c, Tensor dc, Tensor dpe, int dpe_col, Tensor dkv,
                                   Tensor dk, Tensor dv) {
    int64_t R = c.n[0], nh = ml->r.nh, dn = ml->r.dn, dvd = ml->r.dv, dq = dn + ml->r.dr;
    Tensor dkvh = tensor_reshape2(dkv, R * nh, dn + dvd), dkh = tensor_reshape2(dk, R * nh, dq),
           dk2 = tensor_reshape2(dk, R, nh * dq), dpe2 = tensor_reshape2(dpe, R, t_cols(dpe));
    if (dn) op_copy_cols(dkvh, 0, dkh, 0, dn, false);
    op_copy_cols(dkvh, dn, tensor_reshape2(dv, R * nh, dvd), 0, dvd, false);
    op_copy_col_blocks(dpe2, dpe_col, 0, dk2, dn, dq, ml->r.dr, nh, false); // summed over the heads, in order
    Tensor dkv2 = tensor_reshape2(dkv, R, nh * (dn + dvd));
    if (!ml->m) {
        op_linear_backward_input(dc, dkv2, ml->wkvb, false);
        op_linear_backward_weight(ml->dwkvb, (Tensor){0}, dkv2, c, true);
        return;
    }
    model_proj_backward_input(ml->m, ml->layer, FP8_KV_B, dc, dkv2, ml->wkvb, false);
    model_proj_backward_weight(ml->m, ml->layer, FP8_KV_B, ml->dwkvb, (Tensor){0}, dkv2, c);
}

// The ring's hooks (ml begins with its RingLatent).
static void mla_hook(const RingLatent *l, Tensor c, Tensor pe, int pe_col, Tensor kv, Tensor k, Tensor v) {
    model_mla_decompress((const MlaLatent *)l, c, pe, pe_col, kv, k, v);
}
static void mla_hook_backward(const RingLatent *l, Tensor c, Tensor dc, Tensor dpe, int dpe_col, Tensor dkv, Tensor dk,
                              Tensor dv) {
    model_mla_decompress_backward((const MlaLatent *)l, c, dc, dpe, dpe_col, dkv, dk, dv);
}

MlaLatent model_mla_hooked(const MlaLatent *ml) {
    MlaLatent h = *ml;
    h.r.decompress = mla_hook, h.r.decompress_backward = mla_hook_backward;
    return h;
}
