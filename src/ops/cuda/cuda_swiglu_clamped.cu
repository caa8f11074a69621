// cuda_swiglu_clamped.cu — GPT-OSS's clamped SwiGLU on interleaved gate/up columns (ops.h): memory-bound,
// fp32 arithmetic on fp32 or bf16 storage. Math as in ops/cpu/cpu_swiglu_clamped.c:
//   gc = min(g, L), uc = clamp(u, −L, L), s = σ(α·gc); act = (uc + 1)·gc·s;
//   ∂g = da·(uc + 1)·s·(1 + α·gc·(1 − s)) where g ≤ L, ∂u = da·gc·s where −L ≤ u ≤ L, else 0.
// Shapes: gu, dgu: (M, 2I) = [g_0, u_0, g_1, u_1, …]; act, dact: (M, I). Where rows split into 16-byte
// vectors a thread takes 8 outputs (16 interleaved inputs) at a time; other widths (the tiny test models)
// take one output per thread.
#include "ops/cuda/cuda_common.cuh"

struct ClampedSwiglu {
    float alpha, limit;
    __device__ __forceinline__ float forward(float g, float u) const {
        float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
        return (uc + 1.0f) * gc / (1.0f + __expf(-alpha * gc));
    }
    __device__ __forceinline__ void backward(float g, float u, float da, float *dg, float *du) const {
        float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit), s = 1.0f / (1.0f + __expf(-alpha * gc));
        *dg = g <= limit ? da * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
        *du = u >= -limit && u <= limit ? da * gc * s : 0.0f;
    }
};

// One thread per 8 outputs; n8 = M·I/8 (rows of I outputs split into whole vectors, so a vector never spans rows).
template <typename T>
__global__ void swiglu_clamped_forward_vec_kernel(T *act, const T *gu, int64_t n8, ClampedSwiglu f) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n8; e += (int64_t)gridDim.x * blockDim.x) {
        float a[8], b[8], y[8];
        ld8(gu + e * 16, a), ld8(gu + e * 16 + 8, b);
#pragma unroll
        for (int q = 0; q < 4; q++)
            y[q] = f.forward(a[2 * q], a[2 * q + 1]), y[4 + q] = f.forward(b[2 * q], b[2 * q + 1]);
        st8(act + e * 8, y);
    }
}

template <typename T>
__global__ void swiglu_clamped_backward_vec_kernel(T *dgu, const T *dact, const T *gu, int64_t n8, ClampedSwiglu f) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n8; e += (int64_t)gridDim.x * blockDim.x) {
        float a[8], b[8], da[8], ga[8], gb[8];
        ld8(gu + e * 16, a), ld8(gu + e * 16 + 8, b), ld8(dact + e * 8, da);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            f.backward(a[2 * q], a[2 * q + 1], da[q], &ga[2 * q], &ga[2 * q + 1]);
            f.backward(b[2 * q], b[2 * q + 1], da[4 + q], &gb[2 * q], &gb[2 * q + 1]);
        }
        st8(dgu + e * 16, ga), st8(dgu + e * 16 + 8, gb);
    }
}

template <typename T> __global__ void swiglu_clamped_forward_kernel(T *act, const T *gu, int64_t n, ClampedSwiglu f) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        st(act, e, f.forward(ld(gu, 2 * e), ld(gu, 2 * e + 1)));
}

template <typename T>
__global__ void swiglu_clamped_backward_kernel(T *dgu, const T *dact, const T *gu, int64_t n, ClampedSwiglu f) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float dg, du;
        f.backward(ld(gu, 2 * e), ld(gu, 2 * e + 1), ld(dact, e), &dg, &du);
        st(dgu, 2 * e, dg), st(dgu, 2 * e + 1, du);
    }
}

extern "C" {

void cuda_swiglu_clamped_forward(Tensor act, Tensor gu, float alpha, float limit) {
    int64_t M = t_rows(gu), I = t_cols(gu) / 2, n = M * I;
    CHECK(t_cols(gu) == 2 * I && t_rows(act) == M && t_cols(act) == I);
    same_dt(act, gu, "swiglu_clamped_forward");
    if (n == 0) return;
    ClampedSwiglu f = {alpha, limit};
    if (vec8_fits(I, act.p, gu.p)) {
        DT_SWITCH(gu.dt, T, "swiglu_clamped_forward",
                  swiglu_clamped_forward_vec_kernel<T>
                  <<<grid_for(n / 8, 256), 256, 0, cuda_stream()>>>((T *)act.p, (const T *)gu.p, n / 8, f));
    } else {
        DT_SWITCH(gu.dt, T, "swiglu_clamped_forward",
                  swiglu_clamped_forward_kernel<T>
                  <<<grid_for(n, 256), 256, 0, cuda_stream()>>>((T *)act.p, (const T *)gu.p, n, f));
    }
    CUDA_LAUNCH_CHECK();
}

void cuda_swiglu_clamped_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit) {
    int64_t M = t_rows(gu), I = t_cols(gu) / 2, n = M * I;
    CHECK(tensor_numel(dgu) == 2 * n && tensor_numel(dact) == n);
    same_dt(dgu, gu, "swiglu_clamped_backward");
    same_dt(dact, gu, "swiglu_clamped_backward");
    if (n == 0) return;
    ClampedSwiglu f = {alpha, limit};
    if (vec8_fits(I, dgu.p, dact.p, gu.p)) {
        DT_SWITCH(gu.dt, T, "swiglu_clamped_backward",
                  swiglu_clamped_backward_vec_kernel<T><<<grid_for(n / 8, 256), 256, 0, cuda_stream()>>>(
                      (T *)dgu.p, (const T *)dact.p, (const T *)gu.p, n / 8, f));
    } else {
        DT_SWITCH(gu.dt, T, "swiglu_clamped_backward",
                  swiglu_clamped_backward_kernel<T>
                  <<<grid_for(n, 256), 256, 0, cuda_stream()>>>((T *)dgu.p, (const T *)dact.p, (const T *)gu.p, n, f));
    }
    CUDA_LAUNCH_CHECK();
}

} // extern "C"
