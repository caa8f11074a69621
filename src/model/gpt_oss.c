// gpt_oss.c — the GPT-OSS family (openai/gpt-oss-20b, -120b) in the 5-stage protocol, as transformers 5.17's
// GptOssForCausalLM computes it (the parity reference, tests/hf/gpt_oss).
// Layer: x → RMSNorm = n1 → GQA attention (biased q/k/v/o projections, no q/k norm, rotate-half RoPE with
// YaRN as GPT-OSS configures it, scale d^-½, a learned sink per head in the softmax denominator, causal;
// layer_types[l] == "sliding_attention": only the query and the sliding_window − 1 keys before it) → + x = h1
// → RMSNorm = n2 → router logits n2·Wᵀ + b (fp32) → top-k → softmax over the k selected logits → experts
// down(act(gate_up(n2) + b) ) + b with GPT-OSS's clamped SwiGLU on interleaved gate/up rows (moe.c,
// op_swiglu_* with a limit) → Σ_j w_j·expert_j + h1. No shared experts, no dense layers. Load balancing reads the
// softmax over all E. Shapes: T = B·S tokens, H hidden, nh/nkv heads of d, E experts, k per token, I expert width.
// HF layout: each layer's experts are grouped and stored transposed, gate_up_proj (E, H, 2I) and down_proj
// (E, I, H), with gate_up_proj_bias (E, 2I) and down_proj_bias (E, H); the released checkpoints store the two
// weights as MXFP4 instead (mxfp4_dequantize). pith keeps one (2I, H) / (H, I) matrix per expert.
#include <math.h>

#include "model/model.h"

typedef struct {
    int kv_heads, head_dim;
    int window;     // sliding_window: a sliding layer's query sees itself and window − 1 earlier keys
    bool attn_bias; // attention_bias: biases on q, k, v and o
    uint64_t sliding[MAX_LAYERS / 64]; // bit l: layer_types[l] is "sliding_attention"
} GptOssConfig;
MODEL_FAMILY_CONFIG_FITS(GptOssConfig);

static bool is_sliding(const GptOssConfig *g, int l) { return g->sliding[l / 64] >> (l % 64) & 1; }

// ---- config and parameters ----

static void gpt_oss_config_parse(ModelConfig *c, JObj o) {
    GptOssConfig *g = model_family_config(GptOssConfig, c);
    c->hidden = jint_in(o, "hidden_size", true, 0, 1, 1 << 30);
    c->layers = jint_in(o, "num_hidden_layers", true, 0, 1, MAX_LAYERS);
    c->heads = jint_in(o, "num_attention_heads", true, 0, 1, 1 << 20);
    g->kv_heads = jint_in(o, "num_key_value_heads", false, c->heads, 1, 1 << 20);
    g->head_dim = jint_in(o, "head_dim", false, c->hidden / c->heads, 2, 1 << 20);
    c->vocab = jint_in(o, "vocab_size", true, 0, 1, 1 << 30);
    c->eps = jnum(o, "rms_norm_eps", false, 1e-5);
    // transformers writes num_local_experts (num_experts is its alias)
    c->experts = jhas(o, "num_local_experts") ? jint_in(o, "num_local_experts", true, 0, 1, 1 << 20)
                                              : jint_in(o, "num_experts", true, 0, 1, 1 << 20);
    c->topk = jint_in(o, "num_experts_per_tok", true, 0, 1, 1 << 20);
    c->moe_inter = jint_in(o, "intermediate_size", true, 0, 1, 1 << 30);
    c->tie_embed = jbool(o, "tie_word_embeddings", false, false);
    g->attn_bias = jbool(o, "attention_bias", false, true);
    g->window = jint_in(o, "sliding_window", false, 128, 1, 1 << 30);
    // transformers 5.17 computes with limit 7 and alpha 1.702 whatever the config says; the released configs
    // write swiglu_limit 7.0, which pith reads.
    c->swiglu_limit = (float)jnum(o, "swiglu_limit", false, 7.0);
    c->swiglu_alpha = (float)jnum(o, "swiglu_alpha", false, 1.702);
    if (!(c->swiglu_limit > 0)) jdie(o, "swiglu_limit", "must be positive (got %g)", c->swiglu_limit);
    if (!(c->swiglu_alpha > 0)) jdie(o, "swiglu_alpha", "must be positive (got %g)", c->swiglu_alpha);
    if (c->heads % g->kv_heads) jdie(o, "num_key_value_heads", "must divide num_attention_heads (%d)", c->heads);
    if (g->head_dim % 2) jdie(o, "head_dim", "must be even for RoPE");
    if (jhas(o, "quantization_config") &&
        strcmp(jstr(jobj_child(o, "quantization_config"), "quant_method", false, ""), "mxfp4"))
        jdie(jobj_child(o, "quantization_config"), "quant_method",
             "only mxfp4 (the released experts, dequantized by pith convert hf2pith) is supported");
    // layer_types: absent, transformers alternates sliding (even layers) and full (odd layers)
    moe_layer_types(c, o, "sliding_attention", 2, g->sliding);
    // RoPE: what the config says (default or yarn), else GPT-OSS's own default (transformers' GptOssConfig):
    // YaRN, factor 32 over an original context of 4096, beta 32/1, truncate false, theta 150000.
    bool has_rope = jhas(o, "rope_parameters") || jhas(o, "rope_scaling");
    moe_rope_parse(c, o, g->head_dim, true);
    JObj rp = jhas(o, "rope_parameters") ? jobj_child(o, "rope_parameters") : jobj_child(o, "rope_scaling");
    if (!jhas(o, "rope_theta") && !(rp.obj && jhas(rp, "rope_theta"))) c->rope.theta = 150000.0;
    if (!has_rope) {
        c->rope.yarn = true, c->rope.factor = 32, c->rope.orig_max_pos = 4096, c->rope.beta_fast = 32;
        c->rope.beta_slow = 1, c->rope.truncate = false;
    }
    for (int l = 0; l < c->layers; l++) c->is_moe[l] = true;
    c->router = (RouterArgs){.softmax_topk = true, .scale = 1};
    moe_config_check(c, o, "num_local_experts");
}

// Attention: biases when attention_bias, sinks, no q/k norm; sliding or full.
static GqaShape gpt_oss_gqa(const ModelConfig *c, int l) {
    const GptOssConfig *g = model_family_config(const GptOssConfig, c);
    return (GqaShape){.nh = c->heads,
                      .nkv = g->kv_heads,
                      .d = g->head_dim,
                      .bias = g->attn_bias,
                      .sinks = true,
                      .window = is_sliding(g, l) ? g->window : 0};
}

// ---- HF layout (pith convert) ----
// Every tensor but the experts' is the canonical one with "model." in front (lm_head.* without). Layer l's
// experts are four HF tensors: gate_up_proj (E, H, 2I) and down_proj (E, I, H), each expert's matrix
// transposed against pith's (2I, H) and (H, I); gate_up_proj_bias (E, 2I) and down_proj_bias (E, H), one row
// per expert. In the released checkpoints gate_up_proj and down_proj are MXFP4 (gate_up_proj_blocks and
// _scales, …), stored untransposed: (E, 2I, ·) and (E, H, ·) rows of packed codes.

static const char *const EXPERT_PART[4] = {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"};

// Layer l's HF expert tensor "<part><suffix>" (suffix "", "_blocks" or "_scales"), or NULL.
static const StTensor *hf_expert(const StSet *hf, int l, const char *part, const char *suffix) {
    char n[128];
    snprintf(n, sizeof n, "layers.%d.mlp.experts.%s%s", l, part, suffix);
    return hf_find(hf, n);
}

// The HF expert tensors' names after "experts.": the four parts and the weights' MXFP4 forms.
static bool expert_part_known(const char *part) {
    static const char *const known[] = {"gate_up_proj",     "gate_up_proj_bias",   "down_proj",
                                        "down_proj_bias",   "gate_up_proj_blocks", "gate_up_proj_scales",
                                        "down_proj_blocks", "down_proj_scales"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(part, known[i])) return true;
    return false;
}

// x: (E, R, C) elements of `es` bytes → y: (E, C, R), each expert's matrix transposed.
static void transpose_experts(void *y, const void *x, int64_t E, int64_t R, int64_t C, size_t es) {
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                memcpy((char *)y + ((e * C + c) * R + r) * es, (const char *)x + ((e * R + r) * C + c) * es, es);
}

// MXFP4 (the OCP Microscaling format with FP4 elements, as the released openai/gpt-oss checkpoints store their
// expert weights). A weight W: (E, N, K), K a multiple of 32, is stored as two tensors:
//   W_blocks: (E, N, K/32, 16) uint8  — block b of row n holds W[e, n, 32b .. 32b + 31], two FP4 codes a byte:
//                                       byte j's low nibble is element 32b + 2j, its high nibble 32b + 2j + 1;
//   W_scales: (E, N, K/32) uint8      — the block's E8M0 scale s: every element of the block is × 2^(s − 127).
// An FP4 E2M1 code is sign (bit 3), two exponent bits and one mantissa bit: codes 0..7 are 0, 0.5, 1, 1.5, 2, 3,
// 4, 6 and codes 8..15 their negatives. So W[e, n, 32b + i] = fp4(code i of block b) · 2^(s − 127), exact in
// bf16 and fp32. Scale 255 is NaN in E8M0 and a result beyond fp32 is no weight: both stop with the tensor's name.
// out: (E, N, K) fp32.
static void mxfp4_dequantize(float *out, const StTensor *blocks, const StTensor *scales, int64_t E, int64_t N,
                             int64_t K) {
    static const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    int64_t G = K / 32;
    st_check_shape(blocks, 4, (int64_t[]){E, N, G, 16});
    st_check_shape(scales, 3, (int64_t[]){E, N, G});
    if (blocks->dt != ST_U8 || scales->dt != ST_U8)
        die("%s: tensors '%s' and '%s' must be U8 (MXFP4 codes and E8M0 scales)", blocks->file, blocks->name,
            scales->name);
    const uint8_t *q = blocks->data, *s = scales->data;
    for (int64_t b = 0; b < E * N * G; b++) { // block b = (e·N + n)·G + group
        if (s[b] == 255)
            die("%s: tensor '%s': scale 255 (NaN in E8M0) in block %lld", scales->file, scales->name, (long long)b);
        double scale = ldexp(1.0, (int)s[b] - 127);
        for (int j = 0; j < 16; j++) {
            float lo = (float)(fp4[q[b * 16 + j] & 15] * scale), hi = (float)(fp4[q[b * 16 + j] >> 4] * scale);
            if (!isfinite(lo) || !isfinite(hi))
                die("%s: tensor '%s': block %lld dequantizes beyond fp32", blocks->file, blocks->name, (long long)b);
            out[b * 32 + 2 * j] = lo, out[b * 32 + 2 * j + 1] = hi;
        }
    }
}

// Writes layer l's canonical expert tensors of one weight ("gate_up_proj": (2I, H) per expert, or "down_proj":
// (H, I)) from the HF folder: MXFP4 blocks and scales (dequantized to `mx_dt`), or the transposed grouped
// tensor (its bytes kept). Returns 1 when it dequantized, else 0.
static int import_expert_weight(const ModelConfig *c, const StSet *hf, StWriter *w, HfBuffers *keep, int l, int part,
                                StDType mx_dt) {
    int64_t E = c->experts, H = c->hidden, I = c->moe_inter, N = part == 0 ? 2 * I : H, K = part == 0 ? H : I;
    const StTensor *x = hf_expert(hf, l, EXPERT_PART[part], ""), *qb = hf_expert(hf, l, EXPERT_PART[part], "_blocks"),
                   *qs = hf_expert(hf, l, EXPERT_PART[part], "_scales");
    const char *file = hf->n ? hf->t[0]->file : "HF folder";
    void *buf;
    StDType dt;
    if (qb || qs) {
        if (x)
            die("%s: layer %d: model.layers.%d.mlp.experts.%s comes both as a weight and in MXFP4", file, l, l,
                EXPERT_PART[part]);
        if (!qb || !qs)
            die("%s: layer %d: model.layers.%d.mlp.experts.%s needs both _blocks and _scales", file, l, l,
                EXPERT_PART[part]);
        if (K % 32)
            die("%s: layer %d: MXFP4 %s needs a multiple of 32 inputs (got %lld)", file, l, EXPERT_PART[part],
                (long long)K);
        buf = hf_buffer(keep, (size_t)(E * N * K) * sizeof(float));
        mxfp4_dequantize(buf, qb, qs, E, N, K);
        dt = mx_dt;
    } else {
        if (!x) die("%s: tensor 'model.layers.%d.mlp.experts.%s' is missing", file, l, EXPERT_PART[part]);
        st_check_shape(x, 3, (int64_t[]){E, K, N});
        dt = x->dt;
        buf = hf_buffer(keep, (size_t)(E * N * K) * st_dtype_size(dt));
        transpose_experts(buf, x->data, E, K, N, st_dtype_size(dt));
    }
    for (int64_t e = 0; e < E; e++) {
        char n[128];
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%lld.%s.weight", l, (long long)e, EXPERT_PART[part]);
        if (qb) st_writer_add_f32(w, n, dt, 2, (int64_t[]){N, K}, (const float *)buf + e * N * K);
        else st_writer_add_raw(w, n, dt, 2, (int64_t[]){N, K}, (const char *)buf + e * N * K * st_dtype_size(dt));
    }
    return qb != NULL;
}

static int gpt_oss_hf_import(const ModelConfig *c, const ParamTable *t, const StSet *hf, StWriter *w, const char *dtype,
                             HfBuffers *keep) {
    int64_t E = c->experts, H = c->hidden, I = c->moe_inter;
    const char *file = hf->n ? hf->t[0]->file : "HF folder";
    StDType mx_dt = dtype && !strcmp(dtype, "fp32") ? ST_F32 : ST_BF16;
    int used = 0, dequantized = 0; // HF tensors accounted for; MXFP4 weights dequantized
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *p = &t->p[i];
        if (strstr(p->name, ".mlp.experts.")) continue;
        const StTensor *x = hf_find(hf, p->name);
        if (!x) die("%s: tensor 'model.%s' is missing", file, p->name);
        st_check_shape(x, p->nd, p->shape);
        st_writer_add_raw(w, p->name, x->dt, x->nd, x->shape, x->data);
        used++;
    }
    for (int l = 0; l < c->layers; l++) {
        for (int part = 0; part < 4; part += 2) {
            int q = import_expert_weight(c, hf, w, keep, l, part, mx_dt);
            dequantized += q, used += q ? 2 : 1;
        }
        for (int part = 1; part < 4; part += 2) { // the biases: one row per expert
            int64_t N = part == 1 ? 2 * I : H;
            const StTensor *b = hf_expert(hf, l, EXPERT_PART[part], "");
            if (!b) die("%s: tensor 'model.layers.%d.mlp.experts.%s' is missing", file, l, EXPERT_PART[part]);
            st_check_shape(b, 2, (int64_t[]){E, N});
            used++;
            for (int64_t e = 0; e < E; e++) {
                char n[128];
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%lld.%s.bias", l, (long long)e, EXPERT_PART[part - 1]);
                st_writer_add_raw(w, n, b->dt, 1, (int64_t[]){N}, (const char *)b->data + e * N * st_dtype_size(b->dt));
            }
        }
    }
    if (used != hf->n) // a tensor that is neither a parameter nor an HF expert tensor
        for (int i = 0; i < hf->n; i++) {
            const char *name = strncmp(hf->t[i]->name, "model.", 6) ? hf->t[i]->name : hf->t[i]->name + 6;
            int l, n = 0;
            char part[32];
            bool expert = sscanf(name, "layers.%d.mlp.experts.%31[a-z_]%n", &l, part, &n) == 2 && !name[n] && l >= 0 &&
                          l < c->layers && expert_part_known(part);
            if (!expert && !params_find(t, name))
                die("%s: tensor '%s' is not a parameter of this gpt_oss model", hf->t[i]->file, hf->t[i]->name);
        }
    return dequantized;
}

// pith → HF: the canonical expert tensors of layer l gathered into the HF grouped ones (weights transposed).
static void gpt_oss_hf_export(const ModelConfig *c, const ParamTable *t, const StSet *pith, StWriter *w,
                              const char *dtype, HfBuffers *keep) {
    int64_t E = c->experts, H = c->hidden, I = c->moe_inter;
    StDType out = dtype ? (!strcmp(dtype, "bf16") ? ST_BF16 : ST_F32) : ST_F32;
    for (int i = 0; i < t->n; i++) { // every tensor but the experts': renamed, converted with --dtype
        const ParamInfo *p = &t->p[i];
        if (strstr(p->name, ".mlp.experts.")) continue;
        const StTensor *x = hf_find(pith, p->name);
        char n[160];
        snprintf(n, sizeof n, "%s%s", strncmp(p->name, "lm_head.", 8) ? "model." : "", p->name);
        if (!dtype) {
            st_writer_add_raw(w, n, x->dt, x->nd, x->shape, x->data);
            continue;
        }
        float *f = hf_buffer(keep, (size_t)x->numel * sizeof(float));
        st_read_f32(x, f);
        st_writer_add_f32(w, n, out, x->nd, x->shape, f);
    }
    for (int l = 0; l < c->layers; l++)
        for (int part = 0; part < 4; part++) {
            bool bias = part % 2;
            int64_t N = part < 2 ? 2 * I : H, K = part < 2 ? H : I, per = bias ? N : N * K;
            const char *w_name = EXPERT_PART[part & 2];
            // the experts' tensors, each expert's (N, K) weight or (N) bias, in one dtype
            const StTensor *x0 = NULL;
            char n[160];
            for (int64_t e = 0; e < E; e++) {
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%lld.%s.%s", l, (long long)e, w_name,
                         bias ? "bias" : "weight");
                const StTensor *x = st_set_find(pith, n);
                CHECK(x); // open_model checked that every parameter is there
                if (!x0) x0 = x;
                if (x->dt != x0->dt) die("%s: tensor '%s': dtype differs from expert 0's", x->file, n);
            }
            size_t es = dtype ? sizeof(float) : st_dtype_size(x0->dt);
            char *src = hf_buffer(keep, (size_t)(E * per) * es),
                 *dst = bias ? src : hf_buffer(keep, (size_t)(E * per) * es);
            for (int64_t e = 0; e < E; e++) {
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%lld.%s.%s", l, (long long)e, w_name,
                         bias ? "bias" : "weight");
                const StTensor *x = st_set_find(pith, n);
                if (dtype) st_read_f32(x, (float *)(src + e * per * es));
                else memcpy(src + e * per * es, x->data, x->bytes);
            }
            if (!bias) transpose_experts(dst, src, E, N, K, es);
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s", l, EXPERT_PART[part]);
            int64_t shape[3] = {E, bias ? N : K, N};
            if (dtype) st_writer_add_f32(w, n, out, bias ? 2 : 3, shape, (const float *)dst);
            else st_writer_add_raw(w, n, x0->dt, bias ? 2 : 3, shape, dst);
        }
}

const ModelFamily gpt_oss_family = {
    .model_type = "gpt_oss",
    .rec_size = sizeof(LayerRec),
    .router = "mlp.router",
    .router_bias = true,
    .config_parse = gpt_oss_config_parse,
    .gqa = gpt_oss_gqa,
    .hf_import = gpt_oss_hf_import,
    .hf_export = gpt_oss_hf_export,
};
