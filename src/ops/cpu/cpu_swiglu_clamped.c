// cpu_swiglu_clamped.c — GPT-OSS's clamped SwiGLU on interleaved gate/up columns (ops.h), fp32.
// gc = min(g, L), uc = clamp(u, −L, L), s = σ(α·gc): act = (uc + 1)·gc·s;
// ∂g = dact·(uc + 1)·s·(1 + α·gc·(1 − s)) where g ≤ L, ∂u = dact·gc·s where −L ≤ u ≤ L, else 0.
#include <math.h>

#include "ops/cpu/cpu_ops.h"

void cpu_swiglu_clamped_forward(Tensor act, Tensor gu, float alpha, float limit) {
    CPU_F32(act);
    CPU_F32(gu);
    int64_t M = t_rows(gu), I = t_cols(gu) / 2;
    CHECK(t_cols(gu) == 2 * I && t_rows(act) == M && t_cols(act) == I);
#pragma omp parallel for
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < I; i++) {
            float g = F(gu)[r * 2 * I + 2 * i], u = F(gu)[r * 2 * I + 2 * i + 1];
            float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
            F(act)[r * I + i] = (uc + 1.0f) * gc / (1.0f + expf(-alpha * gc));
        }
}

void cpu_swiglu_clamped_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit) {
    CPU_F32(dgu);
    CPU_F32(dact);
    CPU_F32(gu);
    int64_t M = t_rows(gu), I = t_cols(gu) / 2;
    CHECK(tensor_numel(dgu) == M * 2 * I && tensor_numel(dact) == M * I);
#pragma omp parallel for
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < I; i++) {
            float g = F(gu)[r * 2 * I + 2 * i], u = F(gu)[r * 2 * I + 2 * i + 1], da = F(dact)[r * I + i];
            float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit), s = 1.0f / (1.0f + expf(-alpha * gc));
            F(dgu)[r * 2 * I + 2 * i] = g <= limit ? da * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
            F(dgu)[r * 2 * I + 2 * i + 1] = u >= -limit && u <= limit ? da * gc * s : 0.0f;
        }
}
