// cuda_muon.cu — the elementwise halves of a Muon step (docs/architecture.md, "Muon"), fp32; the
// Newton–Schulz iteration itself is GEMMs (src/ops/muon.c).
#include "ops/cuda/cuda_common.cuh"

#define MUON_THREADS 256

__global__ void muon_momentum_kernel(float *buf, float *g, int64_t n, float beta) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float b = beta * buf[i] + (1.0f - beta) * g[i];
        buf[i] = b;
        g[i] = (1.0f - beta) * g[i] + beta * b;
    }
}

__global__ void muon_apply_kernel(float *p, const float *o, int64_t n, float decay, float step) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = p[i] * decay - step * o[i];
}

void cuda_muon_momentum(Tensor buf, Tensor g, float beta) {
    int64_t n = tensor_numel(buf);
    IS_F32(buf, "muon_momentum");
    IS_F32(g, "muon_momentum");
    CHECK(tensor_numel(g) == n);
    if (!n) return;
    muon_momentum_kernel<<<grid_for(n, MUON_THREADS), MUON_THREADS, 0, cuda_stream()>>>((float *)buf.p, (float *)g.p, n,
                                                                                        beta);
    CUDA_LAUNCH_CHECK();
}

void cuda_muon_apply(Tensor p, Tensor o, float lr, float wd, float scale) {
    int64_t n = tensor_numel(p);
    IS_F32(p, "muon_apply");
    IS_F32(o, "muon_apply");
    CHECK(tensor_numel(o) == n);
    if (!n) return;
    muon_apply_kernel<<<grid_for(n, MUON_THREADS), MUON_THREADS, 0, cuda_stream()>>>((float *)p.p, (const float *)o.p,
                                                                                     n, 1.0f - lr * wd, lr * scale);
    CUDA_LAUNCH_CHECK();
}
