// cuda_common.cuh — what every CUDA source of the op layer shares: error checks with file:line, the
// process-wide CUDA context (compute and comm streams, cuBLASLt handle and workspace, fixed scratch
// pools), bf16/fp32 load-store helpers and the dtype switch that instantiates a kernel per dtype.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// base.h is C11: from C++ its functions have C linkage and its _Noreturn is spelled [[noreturn]].
#define _Noreturn [[noreturn]]
extern "C" {
#include "base/base.h"
#include "ops/cuda/cuda_ops.h"
}
#undef _Noreturn

// CUDA_CHECK(call): a failed CUDA runtime or cuBLAS(Lt) call ends the run through die(), naming file:line
// (and, with several ranks, the rank: die() then ends every rank).
bool cuda_capturing(void); // inside a CUDA graph's recording (cuda_graph_begin … cuda_graph_end)
static inline void cuda_check(cudaError_t e, const char *call, const char *file, int line) {
    if (e != cudaSuccess)
        die("CUDA error at %s:%d: %s (%s)%s", file, line, cudaGetErrorString(e), call,
            cuda_capturing() ? " while the forward and backward were being recorded as a CUDA graph (cuda_graph)" : "");
}
static inline void cuda_check(cublasStatus_t st, const char *call, const char *file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS)
        die("cuBLAS error at %s:%d: %s (%s)", file, line, cublasLtGetStatusString(st), call);
}
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)

// After every kernel launch: a bad configuration shows here, an asynchronous fault at the next sync.
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

// ---- the process-wide context ----
typedef struct {
    cudaStream_t compute, comm; // all ops run on compute; comm is for collectives overlapped with it
    cublasLtHandle_t lt;
    void *lt_ws;      // cuBLASLt workspace, CUDA_LT_WS_BYTES
    void *convert;    // CUDA_CONVERT_BYTES: bf16 copies of fp32 GEMM operands (chunked)
    void *small;      // CUDA_SMALL_BYTES: reduction partials and results
    void *host_small; // CUDA_SMALL_BYTES pinned host memory for read-backs
    int sm_count;
} CudaCtx;

#define CUDA_LT_WS_BYTES ((size_t)32 << 20)
#define CUDA_CONVERT_BYTES ((size_t)32 << 20)
// The small pool holds colsum_part's 128 row groups of up to 4096 columns (RMSNorm's one-pass backward at hidden
// widths, cuda_norm.cu).
#define CUDA_SMALL_BYTES ((size_t)2 << 20)

CudaCtx *cuda_ctx(void); // creates everything on first use
static inline cudaStream_t cuda_stream(void) { return cuda_ctx()->compute; }
// Device scratch for op temporaries whose size follows the problem (attention's D_i rows, the inverse
// permutation of scatter_add_rows): one buffer, grown (after a device sync) when a call needs more
// than any call before, so it settles at the first training step. Contents do not survive the next op.
void *cuda_scratch(size_t bytes);
// Makes every CUDA graph recorded so far stale (what: the memory it points into that was replaced); inside a
// recording it ends the run.
void cuda_graph_stale(const char *what);
// The arena an op carves its scratch from (ops.h: op_attention_scratch, op_delta_rule_scratch), as a counting arena
// planned it: over ws, the caller's planned fp32 scratch, when it gives one, else over the bytes at p.
static inline Arena scratch_arena(Tensor ws, void *p, size_t bytes, const char *name) {
    if (ws.p) CHECK(ws.dev == DEV_CUDA && ws.dt == DT_F32);
    Arena a = {(char *)(ws.p ? ws.p : p), 0, ws.p ? tensor_bytes(ws) : bytes, 0, DEV_CUDA, name};
    return a;
}
extern size_t gemm_side_bytes; // cuBLASLt workspaces of the expert weight-gradient side streams (cuda_gemm.cu)

// ---- column sums in a fixed order: no float atomics, the same bits in every run ----
// A column-sum kernel (a norm's weight gradient, a bias gradient) splits the R rows into G groups (grid.y) and
// writes group g's sums of columns j to part[g·N + j]; colsum_finish then adds Σ_g part[g·N + j], g = 0, 1, … in
// order, to out[j]. G (colsum_groups) follows the shape only — up to max_groups (128) groups of at least min_rows
// rows (256; a kernel whose blocks are its groups asks for fewer, to have more blocks), as many as fit the small
// pool — and part is the small pool (colsum_part), so nothing is allocated.
int colsum_groups(int64_t R, int64_t N, int64_t min_rows = 256, int64_t max_groups = 128);
float *colsum_part(int64_t N, int G, const char *what);
void colsum_finish(float *out, const float *part, int G, int64_t N);
// The body of a column-sum kernel: a block of 32 columns × 8 row lanes, column j = blockIdx.x·32 + threadIdx.x summing
// f(i, j) (TA: fp32 or fp64) over the rows i = i0 + threadIdx.y, + step, … < i1 (lane-strided), lane 0 then adding the
// 8 lanes' sums in order; the sum is returned in lane 0 (threadIdx.y 0) where j < N.
template <typename TA, typename Fn>
__device__ __forceinline__ TA colsum_rows(int64_t i0, int64_t i1, int64_t step, int64_t N, Fn f) {
    __shared__ TA sm[8][33];
    int64_t j = blockIdx.x * 32 + threadIdx.x;
    TA s = 0;
    if (j < N)
        for (int64_t i = i0 + threadIdx.y; i < i1; i += step) s += f(i, j);
    sm[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < N)
        for (int r = 1; r < 8; r++) s += sm[r][threadIdx.x];
    return s;
}
// Grid (⌈N/32⌉, G): part[g·N + j] = Σ of f(i, j) over the rows i of group g (lane-strided).
template <typename TA, typename Fn> __device__ __forceinline__ void colsum_block(TA *part, int64_t R, int64_t N, Fn f) {
    int64_t j = blockIdx.x * 32 + threadIdx.x;
    TA s = colsum_rows<TA>(blockIdx.y * 8, R, (int64_t)gridDim.y * 8, N, f);
    if (threadIdx.y == 0 && j < N) part[blockIdx.y * N + j] = s;
}

// The group (an expert) of row i: the last g < n with o[g] ≤ i (o ascending, o[0] ≤ i), passing over empty groups.
__device__ __forceinline__ int group_of(const int *o, int n, int64_t i) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (o[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// ---- functions shared between the .cu files ----
// Waits on the host until stream s has done its work: every host wait of this backend (a read-back's end among them)
// goes through here and is counted (cuda_host_syncs).
void cuda_host_wait(cudaStream_t s);
// The E + 1 int64 row offsets of a grouped op (ops_list.h; offs on the GPU) read back to the host — a wait, for the
// one path that needs host values: cuBLASLt's per-expert products (cuda_gemm.cu). The array lives in the pinned
// read-back buffer until the next read-back.
const int64_t *cuda_offsets_host(Tensor offs, int64_t E);
// Dies when rows.p: the expert GEMMs on the GPU take x's rows already gathered (op_gather_rows), where the CPU's take
// the rows to gather (ops_list.h).
void cuda_check_no_rows(Tensor rows, const char *what);
// The device pointer of a grouped op's offsets, checked: (E + 1) int64 on the GPU.
static inline const int64_t *offsets_device(Tensor offs, int64_t E, const char *what) {
    if (offs.dev != DEV_CUDA || offs.dt != DT_I64 || tensor_numel(offs) != E + 1)
        die("%s: the expert offsets must be (%lld) int64 on the GPU", what, (long long)(E + 1));
    return (const int64_t *)offs.p;
}
// A weight gradient written, not added to (dw (E, N, K), bytes = N·K·its element size): the experts without rows
// (offs: E + 1 on the device) get zeros.
void zero_empty_experts(void *dw, const int64_t *offs, int64_t E, int64_t bytes);
// The expert products (kinds): forward y = x_e·w_eᵀ, input gradient dx = dy_e·w_e, weight gradient dw_e (+)= dy_eᵀ·x_e.
enum { WG_FORWARD, WG_INPUT_GRAD, WG_WEIGHT_GRAD };
// One on the wgmma kernels (cuda_wgmma.cu): out y or dx (R, ·), a x or dy (R, ·), b w (E, N, K); or for the weight
// gradient out dw (E, N, K) fp32, a dy, b x (accumulate false: written, the empty experts' zeroed). bias.p (the
// forward; NULL: none): a per-expert bias (E, N) bf16 its epilogue adds, y_e += b_e as the product then
// op_linear_bias_forward store it. False when they do not fit, and the caller runs another path; wgmma_grouped_calls
// counts those that ran (bias false) or those that added a bias (true).
bool wgmma_grouped(int kind, Tensor out, Tensor a, Tensor b, const int64_t *offs, bool accumulate, Tensor bias);
int64_t wgmma_grouped_calls(bool bias);
// cuBLASLt's block-scaled E4M3 product (cuda_gemm.cu), column-major D (m × n, ldd m) = op_T(A)·op_N(B) + beta·D: A codes
// (k × m, lda k) with BLK128x128 scales sa, B codes (k × n, ldb k) with VEC128 scales sb (cuda_fp8.cu has the layouts),
// D of dtype ddt (fp32 or bf16). False when cuBLASLt has no algorithm.
bool lt_matmul_fp8(int64_t m, int64_t n, int64_t k, const void *A, const float *sa, const void *B, const float *sb,
                   void *D, DType ddt, float beta);
// cuDNN's fused attention (cuda_cudnn.cu), causal, in a sliding window of `window` keys when > 0; false when
// not built with cuDNN, not this variant, or no plan.
bool cudnn_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int S, float scale, int window);
// ws: fp32 scratch for D and the dQ accumulator (op_attention_workspace elements) or p NULL (the op scratch).
bool cudnn_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o,
                              Tensor lse, int B, int S, float scale, int window, Tensor ws);
// Tensor-core flash attention (cuda_flash.cu); false when the inputs do not fit it (dtype, head dim,
// alignment), and the caller runs the generic kernels instead. Causal self-attention; window: AttnArgs.window;
// sinks: (nh) fp32 on the device or NULL (the backward takes the lse that includes them); docpos: (B·S) int32 on the
// device, each query's position in its document (AttnArgs.docpos), or NULL.
bool flash_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int S, float scale, int window,
                             const float *sinks, const int32_t *docpos);
bool flash_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o,
                              Tensor lse, int B, int S, float scale, int window, const int32_t *docpos);

// ---- element access: every kernel computes in fp32 whatever the storage dtype ----
typedef __nv_bfloat16 bf16;
__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16 *p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// Eight consecutive values as fp32 from 16 bytes of bf16 (or 32 of fp32), and back: the vector width of
// the memory-bound kernels (p must be 16-byte aligned).
__device__ __forceinline__ void ld8(const bf16 *p, float (&v)[8]) {
    uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void ld8(const float *p, float (&v)[8]) {
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void st8(bf16 *p, const float (&v)[8]) {
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *(uint4 *)p = u;
}
__device__ __forceinline__ void st8(float *p, const float (&v)[8]) {
    ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
// The one vector style of the memory-bound kernels: each is templated on its width V, the values a thread moves at
// a time, and launched (V_SWITCH) with V = 8 (ld8/st8: 16-byte accesses) where vec8_fits, else V = 1.
template <int V, typename T> __device__ __forceinline__ void ldv(const T *p, float (&v)[V]) {
    if constexpr (V == 8) ld8(p, v);
    else v[0] = ld(p, 0);
}
template <int V, typename T> __device__ __forceinline__ void stv(T *p, const float (&v)[V]) {
    if constexpr (V == 8) st8(p, v);
    else st(p, 0, v[0]);
}
#define V_SWITCH(vec8, ...)                                                                                            \
    do {                                                                                                               \
        if (vec8) {                                                                                                    \
            constexpr int V = 8;                                                                                       \
            __VA_ARGS__;                                                                                               \
        } else {                                                                                                       \
            constexpr int V = 1;                                                                                       \
            __VA_ARGS__;                                                                                               \
        }                                                                                                              \
    } while (0)
// Runs BODY with NAME a constexpr bool of cond's value: a kernel's compile-time flag from a runtime test.
#define BOOL_SWITCH(cond, NAME, ...)                                                                                   \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            constexpr bool NAME = true;                                                                                \
            __VA_ARGS__;                                                                                               \
        } else {                                                                                                       \
            constexpr bool NAME = false;                                                                               \
            __VA_ARGS__;                                                                                               \
        }                                                                                                              \
    } while (0)
// Warp-per-row kernels: ROWS_PER_BLOCK warps of a block take as many rows (launch row_grid(R) blocks of ROW_BLOCK).
#define ROWS_PER_BLOCK 8
static inline dim3 row_grid(int64_t R) { return dim3((unsigned)((R + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK)); }
static const dim3 ROW_BLOCK(32, ROWS_PER_BLOCK);
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad_f(float z) { // d/dz of z·σ(z)
    float s = sigmoid_f(z);
    return s * (1.0f + z * (1.0f - s));
}
// for (i …) over 0..n − 1, a grid-stride loop.
#define GRID_STRIDE(i, n)                                                                                              \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
// True when every pointer is 16-byte aligned (NULL counts as aligned).
static inline bool aligned16(const void *a, const void *b = NULL, const void *c = NULL, const void *d = NULL) {
    return !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15);
}
// True when every pointer is 16-byte aligned and rows of `cols` elements split into 8-element vectors.
static inline bool vec8_fits(int64_t cols, const void *a, const void *b = NULL, const void *c = NULL,
                             const void *d = NULL) {
    return cols % 8 == 0 && aligned16(a, b, c, d);
}

// Runs BODY with T the C type of dtype dt (fp32 or bf16); any other dtype is a caller bug.
#define DT_SWITCH(dt, T, what, ...)                                                                                    \
    do {                                                                                                               \
        if ((dt) == DT_F32) {                                                                                          \
            typedef float T;                                                                                           \
            __VA_ARGS__;                                                                                               \
        } else if ((dt) == DT_BF16) {                                                                                  \
            typedef bf16 T;                                                                                            \
            __VA_ARGS__;                                                                                               \
        } else {                                                                                                       \
            die("%s: dtype %s is not supported on the GPU (fp32 or bf16)", what, dtype_name(dt));                      \
        }                                                                                                              \
    } while (0)

#define ON_GPU(t, what)                                                                                                \
    do {                                                                                                               \
        if ((t).dev != DEV_CUDA) die("%s: tensor " #t " is not on the GPU", what);                                     \
    } while (0)
static inline void same_dt(Tensor a, Tensor b, const char *what) {
    if (a.dt != b.dt) die("%s: tensors of dtypes %s and %s must share one", what, dtype_name(a.dt), dtype_name(b.dt));
}
#define IS_F32(t, what)                                                                                                \
    do {                                                                                                               \
        if ((t).dt != DT_F32) die("%s: " #t " must be fp32 (got %s)", what, dtype_name((t).dt));                       \
    } while (0)

static inline unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 32 ? 65535 * 32 : b);
}

// Sum over the 32 lanes of a warp (every lane gets the sum).
template <typename V> __device__ __forceinline__ V warp_sum(V v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Stream compaction over a block of NT threads: this thread's rank among those with hit (in thread order), and in
// *count how many have it. warp_n: NT/32 shared ints, rewritten by the next call (a __syncthreads between).
template <int NT> __device__ __forceinline__ int block_rank(bool hit, int *warp_n, int *count) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, before = 0;
    unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_n[warp] = __popc(mask);
    __syncthreads();
    *count = 0;
    for (int w = 0; w < NT / 32; w++) before += w < warp ? warp_n[w] : 0, *count += warp_n[w];
    return before + __popc(mask & ((1u << lane) - 1));
}
// Sum over a block of blockDim.x (a multiple of 32, ≤ 1024) threads; the result is valid in every thread.
template <typename V> __device__ V block_sum(V v, V *shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); // shared32 may still be read from a previous call
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    V s = lane < nw ? shared32[lane] : (V)0;
    return warp_sum(s);
}

// The inclusive prefix sum of v over a block's threads in thread order (blockDim.x a multiple of 32, ≤ 1024; every
// thread calls it): within each warp by shuffles, then the warps before through shared32.
static __device__ __forceinline__ int block_prefix_sum(int v, int *shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    if (lane == 31) shared32[warp] = v;
    __syncthreads();
    for (int w = 0; w < warp; w++) v += shared32[w];
    return v;
}

// Launches kernel on the op stream with smem bytes of dynamic shared memory (the opt-in above the 48 KB default set
// first, per call: it costs nothing next to a launch).
template <typename K, typename... A> static void launch(K kernel, dim3 grid, dim3 block, size_t smem, A... args) {
    CHECK(smem <= 227 * 1024);
    if (smem) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, block, smem, cuda_stream()>>>(args...);
    CUDA_LAUNCH_CHECK();
}
