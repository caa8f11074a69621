// cpu_muon.c — the elementwise halves of a Muon step (docs/architecture.md, "Muon"), fp32.
#include "ops/cpu/cpu_ops.h"

void cpu_muon_momentum(Tensor buf, Tensor g, float beta) {
    int64_t n = tensor_numel(buf);
    float *b = buf.p, *x = g.p;
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) {
        b[i] = beta * b[i] + (1.0f - beta) * x[i];
        x[i] = (1.0f - beta) * x[i] + beta * b[i];
    }
}

void cpu_muon_apply(Tensor p, Tensor o, float lr, float wd, float scale) {
    int64_t n = tensor_numel(p);
    float *w = p.p, decay = 1.0f - lr * wd, step = lr * scale;
    const float *u = o.p;
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) w[i] = w[i] * decay - step * u[i];
}
