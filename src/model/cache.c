// cache.c — what a model keeps between calls besides its weights: the FP8 weight cache (the layers' projection
// weights quantised through E4M3, remade after each optimizer update) and generation's KV cache (each layer's keys
// and values, or a Gated DeltaNet layer's recurrent state and conv halo). docs/architecture.md, "FP8" and "Generation".
#include "model/model.h"

// Layer l's compute weight of slot s: the shared layer's from SharedWeights, the family mixer's from the family ({0}:
// none here).
static Tensor fp8_source(const Model *m, int l, Fp8Slot s) {
    const SharedWeights *w = m->sw;
    const GqaWeights *a = &w->att[l];
    Tensor shared[FP8_SLOTS] = {[FP8_GATE_UP] = w->gate_up[l],
                                [FP8_DOWN] = w->down[l],
                                [FP8_Q] = a->wq,
                                [FP8_K] = a->wk,
                                [FP8_V] = a->wv,
                                [FP8_O] = a->wo,
                                [FP8_SHARED_GU] = w->shared_gu[l],
                                [FP8_SHARED_DOWN] = w->shared_down[l]};
    if (shared[s].nd || !m->fam->fp8_weight) return shared[s];
    return m->fam->fp8_weight(m, l, s);
}

// The cache holds, per layer and slot, the FP8 codes and scales of a dense weight (op_fp8_weight_bytes) or of the
// experts' (op_fp8_experts_bytes, blocks within each expert).
void model_fp8_setup(Model *m) {
    size_t n = 0;
    for (int l = 0; l < m->cfg.layers; l++)
        for (int s = 0; s < FP8_SLOTS; s++) {
            Tensor w = fp8_source(m, l, (Fp8Slot)s);
            m->fp8.off[s][l] = w.nd ? (int64_t)n : -1; // nd 0: not held here, or not in this layer
            if (w.nd == 2) n += op_fp8_weight_bytes(w.n[0], w.n[1]);
            else if (w.nd == 3) n += op_fp8_experts_bytes(w.n[0], w.n[1], w.n[2]);
        }
    m->fp8.on = true, m->fp8.version = 1;
    memset(m->fp8.made, 0, sizeof m->fp8.made), memset(m->fp8.gemms, 0, sizeof m->fp8.gemms);
    m->fp8.w = model_tensor(m->dev, DT_U8, n ? (int64_t)n : 1, m->w[0].p != NULL);
}

static Fp8Weight fp8_view(const Model *m, int l, Fp8Slot s, Tensor w) {
    char *p = (char *)m->fp8.w.p + m->fp8.off[s][l];
    return w.nd == 3 ? op_fp8_experts_view(p, w.dev, w.n[0], w.n[1], w.n[2])
                     : op_fp8_weight_view(p, w.dev, w.n[0], w.n[1]);
}

Fp8Weight model_fp8_weight(Model *m, int l, Fp8Slot s) {
    Tensor w = fp8_source(m, l, s);
    CHECK(m->fp8.on && m->fp8.off[s][l] >= 0);
    Fp8Weight fw = fp8_view(m, l, s, w);
    if (m->fp8.ahead[l]) m->fp8.ahead[l] = false, op_fp8_weights_join(w.dev, l); // (before anything writes them again)
    if (m->fp8.made[s][l] != m->fp8.version) // stale: the first use after the optimizer's update bumped the version
        m->fp8.made[s][l] = m->fp8.version, op_fp8_weight_make(fw, w);
    return fw;
}

_Static_assert(MAX_LAYERS <= FP8_AHEAD_IDS, "a ticket of op_fp8_weights_ahead per layer");
void model_fp8_ahead(Model *m) {
    m->fp8.version++;
    for (int l = 0; m->fp8.on && l < m->cfg.layers; l++) {
        Fp8Weight fw[FP8_SLOTS];
        Tensor w[FP8_SLOTS];
        int n = 0;
        for (int s = 0; s < FP8_SLOTS; s++)
            if (m->fp8.off[s][l] >= 0) {
                w[n] = fp8_source(m, l, (Fp8Slot)s), fw[n] = fp8_view(m, l, (Fp8Slot)s, w[n]), n++;
                m->fp8.made[s][l] = m->fp8.version;
            }
        if (n) op_fp8_weights_ahead(fw, w, n, l), m->fp8.ahead[l] = true; // (after any earlier one of l, in order)
    }
}

int model_fp8_warn_rounded(const Model *m, const char *file) {
    static const char *const name[FP8_SLOTS] = {[FP8_GATE_UP] = "gate_up",
                                                [FP8_DOWN] = "down",
                                                [FP8_Q] = "q_proj",
                                                [FP8_K] = "k_proj",
                                                [FP8_V] = "v_proj",
                                                [FP8_O] = "o_proj",
                                                [FP8_Q_A] = "q_a_proj",
                                                [FP8_Q_B] = "q_b_proj",
                                                [FP8_KV_A] = "kv_a_proj_with_mqa",
                                                [FP8_KV_B] = "kv_b_proj",
                                                [FP8_QKV] = "in_proj_qkv",
                                                [FP8_Z] = "in_proj_z",
                                                [FP8_OUT] = "out_proj",
                                                [FP8_SHARED_GU] = "the shared expert's gate_up",
                                                [FP8_SHARED_DOWN] = "the shared expert's down"};
    int slots = 0;
    if (!m->fp8.on || m->dev != DEV_CUDA) return 0;
    for (int s = 0; s < FP8_SLOTS; s++) {
        int n = 0;
        Tensor w = {0};
        for (int l = 0; l < m->cfg.layers; l++) {
            Tensor x = m->fp8.off[s][l] >= 0 ? fp8_source(m, l, (Fp8Slot)s) : (Tensor){0};
            if (x.nd && !op_fp8_tensor_cores(m->dev, x.nd == 3 ? x.n[0] : 0, x.n[x.nd - 2], x.n[x.nd - 1])) n++, w = x;
        }
        if (!n) continue;
        slots++;
        warn("%s: fp8: %s (%lld × %lld%s) in %d layer(s) is not whole FP8 tensor-core tiles (multiples of %d): its "
             "GEMMs multiply operands rounded through E4M3 in the compute dtype, FP8's numbers without its speed",
             file, name[s], (long long)w.n[w.nd - 2], (long long)w.n[w.nd - 1], w.nd == 3 ? ", each expert" : "", n,
             w.nd == 3 ? 128 : 16);
    }
    return slots;
}

// Slot s of layer l runs in FP8: the cache holds it (FP8_NONE never); fp8_proj also counts the GEMM in fp8_gemms.
static bool fp8_held(const Model *m, int l, Fp8Slot s) { return m->fp8.on && s != FP8_NONE && m->fp8.off[s][l] >= 0; }
static bool fp8_proj(Model *m, int l, Fp8Slot s) {
    if (!fp8_held(m, l, s)) return false;
    m->fp8.gemms[s]++;
    return true;
}

// w must be the slot's weight: a family passing another slot would multiply by the wrong codes.
void model_proj_forward(Model *m, int l, Fp8Slot s, Tensor y, Tensor x, Tensor w, Tensor b) {
    if (!fp8_proj(m, l, s)) return op_linear_forward(y, x, w, b);
    CHECK(fp8_source(m, l, s).p == w.p);
    op_fp8_linear_forward(y, x, model_fp8_weight(m, l, s));
    if (b.p) op_linear_bias_forward(y, b, (Tensor){0});
}

void model_proj_backward_input(Model *m, int l, Fp8Slot s, Tensor dx, Tensor dy, Tensor w, bool accumulate) {
    if (!fp8_proj(m, l, s)) return op_linear_backward_input(dx, dy, w, accumulate);
    CHECK(fp8_source(m, l, s).p == w.p);
    op_fp8_linear_backward_input(dx, dy, model_fp8_weight(m, l, s), accumulate);
}

void model_proj_backward_weight(Model *m, int l, Fp8Slot s, Tensor dw, Tensor db, Tensor dy, Tensor x) {
    if (!fp8_proj(m, l, s)) return op_linear_backward_weight(dw, db, dy, x, true);
    CHECK(tensor_numel(fp8_source(m, l, s)) == tensor_numel(dw));
    op_fp8_linear_backward_weight(dw, dy, x);
    if (db.p) op_linear_bias_backward(db, dy, (Tensor){0}, true);
}

void model_proj_backward_weights(Model *m, int l, int n, const Fp8Slot *s, const Tensor *dw, const Tensor *db,
                                 const Tensor *dy, Tensor x) {
    for (int i = 0; i < n; i++) model_proj_backward_weight(m, l, s[i], dw[i], db[i], dy[i], x);
}

// ---- generation's KV cache ----

void kv_cache_free(KvCache *kv) {
    for (int l = 0; l < MAX_LAYERS; l++)
        if (kv->mem[l].cap) arena_destroy(&kv->mem[l]);
    memset(kv, 0, sizeof *kv);
}

Tensor kv_cache_delta(KvCache *kv, int l, Tensor x, int K, int64_t nv, int64_t dk, int64_t dv, DeltaArgs *a) {
    CHECK(!kv->k[l].p && a->B == 1 && K >= 2);
    int64_t C = t_cols(x), K1 = K - 1;
    if (!kv->state[l].p) {
        size_t bytes = (size_t)(2 * nv * dk * dv) * sizeof(float) + (size_t)(2 * K1 * C) * dtype_size(x.dt);
        kv->mem[l] = arena_create("kv cache", x.dev, bytes + 2 * ARENA_ALIGN);
        kv->state[l] = arena_tensor(&kv->mem[l], DT_F32, 4, 2, nv, dk, dv);
        kv->halo[l] = arena_tensor(&kv->mem[l], x.dt, 2, 2 * K1, C, 0, 0);
        op_zero(kv->state[l]), op_zero(kv->halo[l]);
    }
    CHECK(kv->halo[l].n[0] == 2 * K1 && t_cols(kv->halo[l]) == C && kv->halo[l].dt == x.dt);
    a->s0 = tensor_rows(kv->state[l], 0, 1), a->sT = tensor_rows(kv->state[l], 1, 1);
    return tensor_rows(kv->halo[l], 0, K1);
}

void kv_cache_delta_advance(KvCache *kv, int l, Tensor x) {
    int64_t K1 = kv->halo[l].n[0] / 2, S = t_rows(x), keep = S < K1 ? K1 - S : 0; // halo rows that stay
    Tensor cur = tensor_rows(kv->halo[l], 0, K1), next = tensor_rows(kv->halo[l], K1, K1);
    if (keep) op_copy(tensor_rows(next, 0, keep), tensor_rows(cur, K1 - keep, keep));
    op_copy(tensor_rows(next, keep, K1 - keep), tensor_rows(x, S - (K1 - keep), K1 - keep));
    op_copy(cur, next);
    op_copy(tensor_rows(kv->state[l], 0, 1), tensor_rows(kv->state[l], 1, 1));
}
