// cpu_attention.c — grouped-query attention on the CPU, the reference for the flash kernels.
// q: (B·Sq, nh, dqk), k: (B·Sk, nkv, dqk), v: (B·Sk, nkv, dv); query head h reads kv head h / (nh/nkv).
// Visibility (ops.h): key j of a sequence is seen by query i when (!causal or kpos ≤ qpos) and (window == 0 or
// kpos > qpos − window) and (no docpos or kpos ≥ qpos − docpos[i]), qpos = q_off + i, kpos = k_off + j.
// Forward: s_ij = scale·q_i·k_j, lse_i = log(exp(sink) + Σ_j exp(s_ij)), o_i = Σ_j exp(s_ij − lse_i)·v_j.
// Backward: p = exp(s − lse), D_i = do_i·o_i, ds = p·(do_i·v_j − D_i); dq = scale·ds·k, dk = scale·dsᵀ·q,
// dv = pᵀ·do; the sink's probability exp(sink − lse_i) has no value, so ∂sink = −Σ_i exp(sink − lse_i)·D_i.
#include "ops/cpu/cpu_ops.h"

static inline float dotf(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// The keys [*j0, *j1) query i of sequence b sees.
static void visible(const AttnArgs *a, int64_t b, int64_t i, int64_t Sq, int64_t Sk, int64_t *j0, int64_t *j1) {
    int64_t qp = a->q_off + i, lo = 0, hi = Sk; // as key indices: kpos = k_off + j
    if (a->causal && qp - a->k_off + 1 < hi) hi = qp - a->k_off + 1;
    if (a->window > 0 && qp - a->window + 1 - a->k_off > lo) lo = qp - a->window + 1 - a->k_off;
    if (a->docpos.p && qp - ((const int32_t *)a->docpos.p)[b * Sq + i] - a->k_off > lo)
        lo = qp - ((const int32_t *)a->docpos.p)[b * Sq + i] - a->k_off;
    *j0 = lo, *j1 = hi > lo ? hi : lo;
}

typedef struct {
    int64_t Sq, Sk, nh, nkv, grp, dqk, dv;
} AttShape;

static AttShape attention_shape(Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    AttShape s = {q.n[0] / a->B, k.n[0] / a->B, q.n[1], k.n[1], 0, q.n[2], v.n[2]};
    CHECK(a->B >= 1 && s.Sq * a->B == q.n[0] && s.Sk * a->B == k.n[0] && v.n[0] == k.n[0] && s.nh % s.nkv == 0 &&
          k.n[2] == s.dqk && v.n[1] == s.nkv && a->window >= 0);
    CHECK(!a->sinks.p || tensor_numel(a->sinks) == s.nh);
    CHECK(!a->docpos.p || (a->docpos.dt == DT_I32 && tensor_numel(a->docpos) == q.n[0]));
    s.grp = s.nh / s.nkv;
    return s;
}

void cpu_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    CPU_F32(q);
    CPU_F32(k);
    CPU_F32(v);
    CPU_F32(o);
    AttShape z = attention_shape(q, k, v, a);
    CHECK(o.n[0] == q.n[0] && o.n[1] == z.nh && o.n[2] == z.dv);
    int64_t B = a->B, Sq = z.Sq, Sk = z.Sk, nh = z.nh, nkv = z.nkv, dqk = z.dqk, dv = z.dv;
#pragma omp parallel
    {
        float *s = xmalloc((Sk + 1) * sizeof(float));
#pragma omp for collapse(2)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < Sq; i++) {
                    const float *qi = F(q) + ((b * Sq + i) * nh + h) * dqk;
                    int64_t j0, j1;
                    visible(a, b, i, Sq, Sk, &j0, &j1);
                    float m = a->sinks.p ? F(a->sinks)[h] : -INFINITY;
                    for (int64_t j = j0; j < j1; j++) {
                        s[j] = a->scale * dotf(qi, F(k) + ((b * Sk + j) * nkv + h / z.grp) * dqk, dqk);
                        m = fmaxf(m, s[j]);
                    }
                    float *oi = F(o) + ((b * Sq + i) * nh + h) * dv;
                    for (int64_t c = 0; c < dv; c++) oi[c] = 0;
                    if (m == -INFINITY) { // nothing visible and no sink
                        F(lse)[(b * nh + h) * Sq + i] = -INFINITY;
                        continue;
                    }
                    double sum = a->sinks.p ? exp((double)F(a->sinks)[h] - m) : 0;
                    for (int64_t j = j0; j < j1; j++) sum += s[j] = expf(s[j] - m);
                    for (int64_t j = j0; j < j1; j++) {
                        const float *vj = F(v) + ((b * Sk + j) * nkv + h / z.grp) * dv;
                        float p = (float)(s[j] / sum);
                        for (int64_t c = 0; c < dv; c++) oi[c] += p * vj[c];
                    }
                    F(lse)[(b * nh + h) * Sq + i] = m + (float)log(sum);
                }
        free(s);
    }
}

void cpu_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                            Tensor o, Tensor lse, const AttnArgs *a) {
    AttShape z = attention_shape(q, k, v, a);
    int64_t B = a->B, Sq = z.Sq, Sk = z.Sk, nh = z.nh, nkv = z.nkv, dqk = z.dqk, dvd = z.dv;
    cpu_zero(dk), cpu_zero(dv);
    double *ds_sink = xcalloc((size_t)(B * nh), sizeof(double)); // per (batch, head): serial sum below
    // Parallel over (batch, kv head): the query heads of one group write the same dk, dv rows.
#pragma omp parallel for collapse(2)
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < nkv; g++)
            for (int64_t h = g * z.grp; h < (g + 1) * z.grp; h++)
                for (int64_t i = 0; i < Sq; i++) {
                    int64_t qrow = (b * Sq + i) * nh + h;
                    const float *qi = F(q) + qrow * dqk, *doi = F(dout) + qrow * dvd;
                    float *dqi = F(dq) + qrow * dqk;
                    float Di = dotf(doi, F(o) + qrow * dvd, dvd), L = F(lse)[(b * nh + h) * Sq + i];
                    for (int64_t c = 0; c < dqk; c++) dqi[c] = 0;
                    if (L == -INFINITY) continue; // the query saw nothing: o = 0 does not depend on anything
                    if (a->sinks.p) ds_sink[b * nh + h] -= exp((double)F(a->sinks)[h] - L) * Di;
                    int64_t j0, j1;
                    visible(a, b, i, Sq, Sk, &j0, &j1);
                    for (int64_t j = j0; j < j1; j++) {
                        int64_t kr = (b * Sk + j) * nkv + g;
                        const float *kj = F(k) + kr * dqk;
                        float p = expf(a->scale * dotf(qi, kj, dqk) - L);
                        float ds = p * (dotf(doi, F(v) + kr * dvd, dvd) - Di);
                        for (int64_t c = 0; c < dqk; c++) {
                            dqi[c] += a->scale * ds * kj[c];
                            F(dk)[kr * dqk + c] += a->scale * ds * qi[c];
                        }
                        for (int64_t c = 0; c < dvd; c++) F(dv)[kr * dvd + c] += p * doi[c];
                    }
                }
    if (dsinks.p) {
        CHECK(a->sinks.p && tensor_numel(dsinks) == nh);
        for (int64_t h = 0; h < nh; h++) {
            double s = 0;
            for (int64_t b = 0; b < B; b++) s += ds_sink[b * nh + h];
            F(dsinks)[h] += (float)s;
        }
    }
    free(ds_sink);
}

// The log-sum-exp merge (ops.h): the weights e^(lse − lse') and e^(lse_p − lse') in fp64 from m = max(lse, lse_p).
void cpu_attention_merge(Tensor o, Tensor lse, Tensor o_p, Tensor lse_p, int B, bool init) {
    CPU_F32(o);
    CPU_F32(lse);
    CPU_F32(o_p);
    CPU_F32(lse_p);
    int64_t nh = o.n[1], dv = o.n[2], Sq = o.n[0] / B;
    CHECK(B >= 1 && Sq * B == o.n[0] && tensor_numel(o_p) == tensor_numel(o) && o_p.n[0] == o.n[0] &&
          tensor_numel(lse) == B * nh * Sq && tensor_numel(lse_p) == tensor_numel(lse));
#pragma omp parallel for collapse(2)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < Sq; i++) {
                float *L = F(lse) + (b * nh + h) * Sq + i, Lp = F(lse_p)[(b * nh + h) * Sq + i];
                float *oi = F(o) + ((b * Sq + i) * nh + h) * dv;
                const float *pi = F(o_p) + ((b * Sq + i) * nh + h) * dv;
                if (init || (*L == -INFINITY && Lp != -INFINITY)) {
                    for (int64_t c = 0; c < dv; c++) oi[c] = pi[c];
                    *L = Lp;
                    continue;
                }
                if (Lp == -INFINITY) continue;
                double m = *L > Lp ? *L : Lp, a = exp(*L - m), p = exp(Lp - m), s = a + p;
                for (int64_t c = 0; c < dv; c++) oi[c] = (float)((a * oi[c] + p * pi[c]) / s);
                *L = (float)(m + log(s));
            }
}
