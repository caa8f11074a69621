// cpu_norm.c — RMSNorm, RoPE (rotate-half and pair layouts, partial) and SwiGLU on the CPU (fp32 data, fp64 row sums).
// RMSNorm: y = x·r·w with r = (mean(x²) + eps)^(-1/2); ∂x = r·w·dy − x·r³/D·Σ(dy·w·x); ∂w = Σ_rows dy·x·r.
#include <math.h>

#include "ops/cpu/cpu_ops.h"

void cpu_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps) {
    CPU_F32(x);
    CPU_F32(y);
    CPU_F32(w);
    int64_t R = t_rows(x), D = t_cols(x);
    CHECK(tensor_numel(w) == D && tensor_numel(rstd) == R);
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++) {
        const float *xi = F(x) + i * D;
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / D + eps));
        F(rstd)[i] = r;
        for (int64_t j = 0; j < D; j++) F(y)[i * D + j] = xi[j] * r * F(w)[j];
    }
}

void cpu_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate) {
    int64_t R = t_rows(x), D = t_cols(x);
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++) {
        const float *xi = F(x) + i * D, *gi = F(dy) + i * D;
        float r = F(rstd)[i];
        double dot = 0;
        for (int64_t j = 0; j < D; j++) dot += (double)gi[j] * F(w)[j] * xi[j];
        float c = (float)(dot * r * r * r / D);
        for (int64_t j = 0; j < D; j++) {
            float g = r * F(w)[j] * gi[j] - xi[j] * c;
            F(dx)[i * D + j] = accumulate ? F(dx)[i * D + j] + g : g;
        }
    }
#pragma omp parallel for
    for (int64_t j = 0; j < D; j++) {
        double s = 0;
        for (int64_t i = 0; i < R; i++) s += (double)F(dy)[i * D + j] * F(x)[i * D + j] * F(rstd)[i];
        F(dw)[j] += (float)s;
    }
}

// x: (T, heads, d). Pair i of the rotated dims [off, off + rd) is (x[off + i], x[off + i + rd/2]) (ROPE_HALF) or
// (x[off + 2i], x[off + 2i + 1]) (ROPE_PAIRS); it turns by the table's angle i of position pos[t]:
// forward (a·c − b·s, b·c + a·s); backward is the transpose (a·c + b·s, b·c − a·s).
void cpu_rope(Tensor x, int off, Tensor cos_t, Tensor sin_t, Tensor pos, RopeLayout layout, bool backward) {
    CPU_F32(x);
    int64_t T = x.n[0], nh = x.n[1], d = x.n[2], half = cos_t.n[1];
    CHECK(off >= 0 && off + 2 * half <= d && sin_t.n[1] == half && tensor_numel(pos) == T);
    int64_t stride = layout == ROPE_PAIRS ? 2 : 1, partner = layout == ROPE_PAIRS ? 1 : half; // a at off + i·stride
    float sgn = backward ? -1.0f : 1.0f;
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++) {
        const float *c = F(cos_t) + (int64_t)I32(pos)[t] * half, *s = F(sin_t) + (int64_t)I32(pos)[t] * half;
        for (int64_t h = 0; h < nh; h++) {
            float *v = F(x) + (t * nh + h) * d + off;
            for (int64_t i = 0; i < half; i++) {
                float *pa = v + i * stride, *pb = pa + partner, a = *pa, b = *pb;
                *pa = a * c[i] - sgn * b * s[i];
                *pb = b * c[i] + sgn * a * s[i];
            }
        }
    }
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void cpu_swiglu_forward(Tensor act, Tensor gu) {
    int64_t M = t_rows(gu), I = t_cols(gu) / 2;
    CHECK(t_cols(act) == I && t_rows(act) == M);
#pragma omp parallel for
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < I; i++) {
            float g = F(gu)[r * 2 * I + i], u = F(gu)[r * 2 * I + I + i];
            F(act)[r * I + i] = g * sigmoidf(g) * u;
        }
}

void cpu_swiglu_backward(Tensor dgu, Tensor dact, Tensor gu) {
    int64_t M = t_rows(gu), I = t_cols(gu) / 2;
#pragma omp parallel for
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < I; i++) {
            float g = F(gu)[r * 2 * I + i], u = F(gu)[r * 2 * I + I + i], da = F(dact)[r * I + i], sg = sigmoidf(g);
            F(dgu)[r * 2 * I + i] = da * u * sg * (1.0f + g * (1.0f - sg));
            F(dgu)[r * 2 * I + I + i] = da * g * sg;
        }
}
