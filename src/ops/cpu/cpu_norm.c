// cpu_norm.c — RMSNorm (plain, 1 + w, gated), RoPE (rotate-half and pair layouts, partial) and SwiGLU (plain and
// clamped) on the CPU (fp32 data, fp64 row sums).
// RMSNorm: y = x·r·u with r = (mean(x²) + eps)^(-1/2) and u = w, 1 + w, or either times silu(z) (ops_list.h).
#include "ops/cpu/cpu_ops.h"

// u of element e = i·D + j: w[j], or 1 + w[j] (fp32 as the weight is), times silu(z[e]) in fp64.
static inline double norm_u(Tensor w, const RmsArgs *a, int64_t e, int64_t j) {
    float u = a && a->one_plus ? 1 + F(w)[j] : F(w)[j];
    if (!a || !a->z.p) return u;
    double z = F(a->z)[e];
    return u * z * sigm(z);
}

void cpu_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps, const RmsArgs *a) {
    CPU_F32(x);
    CPU_F32(y);
    CPU_F32(w);
    int64_t R = t_rows(x), D = t_cols(x);
    CHECK(tensor_numel(w) == D && tensor_numel(rstd) == R);
    if (a && a->z.p) CHECK(tensor_numel(a->z) == R * D && a->z.dt == DT_F32);
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++) {
        const float *xi = F(x) + i * D;
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / D + eps));
        F(rstd)[i] = r;
        for (int64_t j = 0; j < D; j++) F(y)[i * D + j] = (float)(xi[j] * r * norm_u(w, a, i * D + j, j));
    }
    if (a && a->cos.p) {
        CHECK(!a->z.p && a->heads > 0 && R % a->heads == 0);
        cpu_rope(tensor_make(y.p, y.dt, y.dev, 3, R / a->heads, a->heads, D, 1), 0, a->cos, a->sin, a->pos, ROPE_HALF,
                 false);
    }
}

// With s = silu(z) (1 without z) and u = w·s (or (1 + w)·s): ∂x = r·u·dy − x·r³/D·Σ(dy·u·x), ∂w = Σ_rows dy·x·r·s,
// ∂z = dy·x·r·w·silu'(z).
void cpu_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                          const RmsArgs *a) {
    int64_t R = t_rows(x), D = t_cols(x);
    if (a && a->cos.p) { // dy of the turned output: turned back in place first (ops.h)
        CHECK(!a->z.p && a->heads > 0 && R % a->heads == 0);
        cpu_rope(tensor_make(dy.p, dy.dt, dy.dev, 3, R / a->heads, a->heads, D, 1), 0, a->cos, a->sin, a->pos,
                 ROPE_HALF, true);
    }
    const float *z = a && a->z.p ? F(a->z) : NULL;
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++) {
        const float *xi = F(x) + i * D, *gi = F(dy) + i * D;
        float r = F(rstd)[i];
        double dot = 0;
        for (int64_t j = 0; j < D; j++) dot += (double)gi[j] * norm_u(w, a, i * D + j, j) * xi[j];
        float c = (float)(dot * r * r * r / D);
        for (int64_t j = 0; j < D; j++) {
            float g = r * (float)norm_u(w, a, i * D + j, j) * gi[j] - xi[j] * c;
            F(dx)[i * D + j] = accumulate ? F(dx)[i * D + j] + g : g;
            if (z) {
                double zz = z[i * D + j], u = a->one_plus ? 1 + F(w)[j] : F(w)[j];
                F(a->dz)[i * D + j] = (float)(gi[j] * xi[j] * r * u * silu_grad(zz));
            }
        }
    }
#pragma omp parallel for
    for (int64_t j = 0; j < D; j++) {
        double s = 0;
        for (int64_t i = 0; i < R; i++) {
            double v = (double)F(dy)[i * D + j] * F(x)[i * D + j] * F(rstd)[i];
            s += z ? v * z[i * D + j] * sigm(z[i * D + j]) : v;
        }
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

// limit 0: g = gu[r, i], u = gu[r, I + i]; act = silu(g)·u, ∂g = da·u·σ(g)·(1 + g·(1 − σ(g))), ∂u = da·silu(g).
// limit L > 0: g = gu[r, 2i], u = gu[r, 2i + 1]; gc = min(g, L), uc = clamp(u, −L, L), s = σ(α·gc):
// act = (uc + 1)·gc·s; ∂g = da·(uc + 1)·s·(1 + α·gc·(1 − s)) where g ≤ L, ∂u = da·gc·s where −L ≤ u ≤ L, else 0.
void cpu_swiglu_forward(Tensor act, Tensor gu, float alpha, float limit) {
    CPU_F32(act);
    CPU_F32(gu);
    int64_t M = t_rows(gu), I = t_cols(gu) / 2, ug = limit > 0 ? 1 : I, st = limit > 0 ? 2 : 1; // u's offset, stride
    CHECK(t_cols(gu) == 2 * I && t_cols(act) == I && t_rows(act) == M);
#pragma omp parallel for
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < I; i++) {
            float g = F(gu)[r * 2 * I + st * i], u = F(gu)[r * 2 * I + st * i + ug];
            if (limit > 0) {
                float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
                F(act)[r * I + i] = (uc + 1.0f) * gc / (1.0f + expf(-alpha * gc));
            } else F(act)[r * I + i] = g * sigmoidf(g) * u;
        }
}

void cpu_swiglu_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit) {
    CPU_F32(dgu);
    CPU_F32(dact);
    CPU_F32(gu);
    int64_t M = t_rows(gu), I = t_cols(gu) / 2, ug = limit > 0 ? 1 : I, st = limit > 0 ? 2 : 1;
    CHECK(tensor_numel(dgu) == M * 2 * I && tensor_numel(dact) == M * I);
#pragma omp parallel for
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < I; i++) {
            int64_t o = r * 2 * I + st * i;
            float g = F(gu)[o], u = F(gu)[o + ug], da = F(dact)[r * I + i];
            if (limit > 0) {
                float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit), s = 1.0f / (1.0f + expf(-alpha * gc));
                F(dgu)[o] = g <= limit ? da * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
                F(dgu)[o + ug] = u >= -limit && u <= limit ? da * gc * s : 0.0f;
            } else {
                float sg = sigmoidf(g);
                F(dgu)[o] = da * u * sg * (1.0f + g * (1.0f - sg));
                F(dgu)[o + ug] = da * g * sg;
            }
        }
}
