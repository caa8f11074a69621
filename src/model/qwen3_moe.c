// qwen3_moe.c — the Qwen3-MoE family (Qwen/Qwen3-30B-A3B, -235B-A22B) in the 5-stage protocol.
// Layer: x → RMSNorm → GQA attention (q/k RMSNorm per head before rotate-half RoPE, causal, scale d^-½)
// → + x = h1 → RMSNorm = n2 → router (softmax over E in fp32, top-k, renormalised if norm_topk_prob)
// → experts down(silu(gate(n2))·up(n2)) → Σ_j w_j·expert_j + h1. Layers listed in mlp_only_layers or
// off the decoder_sparse_step grid use a dense SwiGLU MLP instead. Everything but the HF config, the attention's shape
// and the router's options is the shared layer (moe.c, gqa.c).
#include "model/model.h"

typedef struct {
    int kv_heads, head_dim;
    bool attn_bias;
} Qwen3Config;
MODEL_FAMILY_CONFIG_FITS(Qwen3Config);

// ---- config ----

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
    c->router = (RouterArgs){.renorm = jbool(o, "norm_topk_prob", false, false), .scale = 1};
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
static GqaShape qwen3_gqa(const ModelConfig *c, int l) {
    const Qwen3Config *q = model_family_config(const Qwen3Config, c);
    return (GqaShape){.nh = c->heads, .nkv = q->kv_heads, .d = q->head_dim, .qk_norm = QK_NORM_W, .bias = q->attn_bias};
}
const ModelFamily qwen3_moe_family = {
    .model_type = "qwen3_moe",
    .rec_size = sizeof(LayerRec),
    .router = "mlp.gate",
    .config_parse = qwen3_config_parse,
    .gqa = qwen3_gqa,
};
