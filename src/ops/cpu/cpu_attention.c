// cpu_attention.c — causal grouped-query attention on the CPU, the reference for the flash kernels.
// q: (B·S, nh, d), k, v: (B·S, nkv, d); query head h reads kv head h / (nh/nkv).
// Forward: s_ij = scale·q_i·k_j (j ≤ i), lse_i = log Σ_j exp(s_ij), o_i = Σ_j exp(s_ij − lse_i)·v_j.
// Backward: p = exp(s − lse), D_i = do_i·o_i, ds = p·(do_i·v_j − D_i); dq = scale·ds·k, dk = scale·dsᵀ·q, dv = pᵀ·do.
#include <math.h>

#include "ops/cpu/cpu_ops.h"

static inline float dotf(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void cpu_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, float scale) {
    CPU_F32(q); CPU_F32(k); CPU_F32(v); CPU_F32(o);
    int64_t S = q.n[0] / B, nh = q.n[1], d = q.n[2], nkv = k.n[1], grp = nh / nkv;
    CHECK(S * B == q.n[0] && nh % nkv == 0 && k.n[2] == d);
#pragma omp parallel
    {
        float *s = xmalloc(S * sizeof(float));
#pragma omp for collapse(2)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < S; i++) {
                    const float *qi = F(q) + ((b * S + i) * nh + h) * d;
                    float m = -INFINITY;
                    for (int64_t j = 0; j <= i; j++) {
                        s[j] = scale * dotf(qi, F(k) + ((b * S + j) * nkv + h / grp) * d, d);
                        m = fmaxf(m, s[j]);
                    }
                    double sum = 0;
                    for (int64_t j = 0; j <= i; j++) sum += s[j] = expf(s[j] - m);
                    float *oi = F(o) + ((b * S + i) * nh + h) * d;
                    for (int64_t c = 0; c < d; c++) oi[c] = 0;
                    for (int64_t j = 0; j <= i; j++) {
                        const float *vj = F(v) + ((b * S + j) * nkv + h / grp) * d;
                        float p = (float)(s[j] / sum);
                        for (int64_t c = 0; c < d; c++) oi[c] += p * vj[c];
                    }
                    F(lse)[(b * nh + h) * S + i] = m + (float)log(sum);
                }
        free(s);
    }
}

void cpu_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o,
                            Tensor lse, int B, float scale) {
    int64_t S = q.n[0] / B, nh = q.n[1], d = q.n[2], nkv = k.n[1], grp = nh / nkv;
    cpu_zero(dk), cpu_zero(dv);
    // Parallel over (batch, kv head): the query heads of one group write the same dk, dv rows.
#pragma omp parallel for collapse(2)
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < nkv; g++)
            for (int64_t h = g * grp; h < (g + 1) * grp; h++)
                for (int64_t i = 0; i < S; i++) {
                    const float *qi = F(q) + ((b * S + i) * nh + h) * d, *doi = F(dout) + ((b * S + i) * nh + h) * d;
                    float *dqi = F(dq) + ((b * S + i) * nh + h) * d;
                    float Di = dotf(doi, F(o) + ((b * S + i) * nh + h) * d, d), L = F(lse)[(b * nh + h) * S + i];
                    for (int64_t c = 0; c < d; c++) dqi[c] = 0;
                    for (int64_t j = 0; j <= i; j++) {
                        int64_t kv = ((b * S + j) * nkv + g) * d;
                        float p = expf(scale * dotf(qi, F(k) + kv, d) - L);
                        float ds = p * (dotf(doi, F(v) + kv, d) - Di);
                        for (int64_t c = 0; c < d; c++) {
                            dqi[c] += scale * ds * F(k)[kv + c];
                            F(dk)[kv + c] += scale * ds * qi[c];
                            F(dv)[kv + c] += p * doi[c];
                        }
                    }
                }
}
