// cuda_fp8.cu — FP8 E4M3 block rounding on the GPU (op_fp8_round, ops.h): the same blocks, power-of-two scales and
// round-to-nearest-even codes as the reference (ops/cpu/cpu_fp8.c, docs/reference.md §20), through the hardware
// conversion (cvt.rn.satfinite.e4m3x2.f32), so both give the same bits. FP8_ROWS: a warp per 1 × 128 block.
// FP8_COLS and FP8_TILES: one CTA of 128 threads per block row of 128 columns, a thread owning a column and walking
// the block's rows (up to 128); FP8_TILES takes the amax over the CTA, FP8_COLS per thread.
#include <cuda_fp8.h>

#include "ops/cuda/cuda_common.cuh"

#define FP8_MAX_GROUPS 1024

// The row blocks of x: group g's rows offs[g]..offs[g+1] are row blocks rb0[g]..rb0[g+1] of height bh.
struct Fp8Groups {
    int n, bh;
    int offs[FP8_MAX_GROUPS + 1], rb0[FP8_MAX_GROUPS + 1];
};

__device__ __forceinline__ float fp8_scale(float amax) {
    float s = fmaxf(amax, 1e-4f) / 448.0f;
    uint32_t b = __float_as_uint(s);
    if (b & 0x7fffff) b = (b & 0xff800000u) + 0x800000u; // round up to a power of two
    return __uint_as_float(b);
}

__device__ __forceinline__ float fp8_value(float v, float s, float inv) {
    __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3);
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3))) * s;
}

// grid: (row blocks × column chunks of 128); blockDim 128. whole: one scale per CTA (tiles), else per column (cols).
template <typename T>
__global__ void fp8_round_kernel(T *y, const T *x, int64_t C, int64_t nchunks, Fp8Groups gr, bool whole) {
    __shared__ float red[4];
    __shared__ int bad_s[4];
    int64_t rb = blockIdx.x / nchunks, c = (blockIdx.x % nchunks) * 128 + threadIdx.x;
    int lo = 0, hi = gr.n - 1; // the group holding row block rb
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (gr.rb0[mid] <= rb) lo = mid;
        else hi = mid - 1;
    }
    int64_t r0 = gr.offs[lo] + (rb - gr.rb0[lo]) * gr.bh, r1 = min((int64_t)gr.offs[lo + 1], r0 + gr.bh);
    bool in = c < C;
    float amax = 0;
    int bad = 0;
    for (int64_t r = r0; in && r < r1; r++) {
        float v = ld(x, r * C + c);
        bad |= !isfinite(v), amax = fmaxf(amax, fabsf(v));
    }
    if (whole) {
        int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        for (int o = 16; o; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o)), bad |= __shfl_xor_sync(0xffffffff, bad, o);
        if (lane == 0) red[w] = amax, bad_s[w] = bad;
        __syncthreads();
        amax = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
        bad = bad_s[0] | bad_s[1] | bad_s[2] | bad_s[3];
    }
    float s = bad ? NAN : fp8_scale(amax), inv = 1.0f / s; // a non-finite input makes its block NaN
    for (int64_t r = r0; in && r < r1; r++) st(y, r * C + c, fp8_value(ld(x, r * C + c), s, inv));
}

// FP8_ROWS: a warp per 1 × 128 block (lane i holds columns i, i + 32, i + 64, i + 96: coalesced), 8 warps a CTA.
template <typename T>
__global__ void fp8_round_rows_kernel(T *y, const T *x, int64_t C, int64_t nchunks, int64_t nblocks) {
    int64_t blk = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (blk >= nblocks) return; // a whole warp: blk is the warp's
    int64_t r = blk / nchunks, c0 = (blk % nchunks) * 128 + (threadIdx.x & 31);
    float v[4], amax = 0;
    int bad = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = c0 + 32 * i < C ? ld(x, r * C + c0 + 32 * i) : 0.0f;
        bad |= !isfinite(v[i]), amax = fmaxf(amax, fabsf(v[i]));
    }
    for (int o = 16; o; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o)), bad |= __shfl_xor_sync(0xffffffff, bad, o);
    float s = bad ? NAN : fp8_scale(amax), inv = 1.0f / s;
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (c0 + 32 * i < C) st(y, r * C + c0 + 32 * i, fp8_value(v[i], s, inv));
}

extern "C" void cuda_fp8_round(Tensor y, Tensor x, Fp8Blocks b, const int64_t *offs, int groups) {
    ON_GPU(x, "fp8_round");
    ON_GPU(y, "fp8_round");
    same_dt(x, y, "fp8_round");
    CHECK(tensor_numel(x) == tensor_numel(y));
    int64_t R = t_rows(x), C = t_cols(x), N = 0;
    if (x.nd == 3) R = x.n[0] * x.n[1], C = x.n[2], N = x.n[1], groups = (int)x.n[0], offs = NULL;
    else if (!offs) groups = 1, N = R;
    if (groups > FP8_MAX_GROUPS) die("fp8_round: at most %d groups (got %d)", FP8_MAX_GROUPS, groups);
    if (R > 0x7fffffff) die("fp8_round: at most 2^31 rows (got %lld)", (long long)R);
    static Fp8Groups gr; // static: 8 KB of launch parameters
    gr.n = groups, gr.bh = b == FP8_ROWS ? 1 : 128, gr.rb0[0] = 0;
    for (int g = 0; g <= groups; g++) gr.offs[g] = (int)(offs ? offs[g] : g * N);
    CHECK(gr.offs[0] == 0 && gr.offs[groups] == R);
    for (int g = 0; g < groups; g++) gr.rb0[g + 1] = gr.rb0[g] + (gr.offs[g + 1] - gr.offs[g] + gr.bh - 1) / gr.bh;
    int64_t nchunks = (C + 127) / 128, blocks = gr.rb0[groups] * nchunks;
    if (blocks == 0) return;
    if (b == FP8_ROWS) { // rows do not depend on the groups
        DT_SWITCH(x.dt, T, "fp8_round",
                  fp8_round_rows_kernel<T>
                  <<<(blocks + 7) / 8, 256, 0, cuda_stream()>>>((T *)y.p, (const T *)x.p, C, nchunks, blocks));
        CUDA_LAUNCH_CHECK();
        return;
    }
    DT_SWITCH(x.dt, T, "fp8_round",
              fp8_round_kernel<T>
              <<<blocks, 128, 0, cuda_stream()>>>((T *)y.p, (const T *)x.p, C, nchunks, gr, b == FP8_TILES));
    CUDA_LAUNCH_CHECK();
}
