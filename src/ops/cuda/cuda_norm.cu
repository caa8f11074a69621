// cuda_norm.cu — RMSNorm (plain, 1 + w, gated), RoPE and SwiGLU (plain, clamped): memory-bound kernels, fp32
// arithmetic on fp32 or bf16 storage. Math as in ops/cpu/cpu_norm.c and ops_list.h; RMSNorm's forms are the
// kernels' flags ONE_P (u = 1 + w) and GATED (u times silu(z)), SwiGLU's clamped form CLAMP.
// Shapes: x, y, dy, dx, z, dz: (R, D); w: (D); rstd: (R) fp32; RoPE x: (T, heads, d), cos/sin (P, d/2) fp32,
// pos (T) int32; SwiGLU gu: (M, 2I) = [gate | up] (interleaved [g_0, u_0, …] when clamped), act: (M, I).
// Each kernel moves V values at a time (cuda_common.cuh): RMSNorm gives a row lpr lanes of one warp (32, or with
// V = 8 the largest power of two ≤ min(32, D/8); rmsnorm_backward_rows_kernel one or two whole warps), RoPE and
// SwiGLU one thread per V pairs or outputs. RMSNorm's backward sums ∂w's row groups in the same pass as dx where a
// lane has few columns (rows up to 512 wide: rmsnorm_backward_fused_kernel), else in a second kernel
// (rmsnorm_dw_kernel); colsum_finish then adds the groups. At hidden widths with bf16 storage, ungated, the one-pass
// rmsnorm_backward_rows_kernel (rows up to 4096 wide, their loads pipelined through shared memory) runs instead.
#include "ops/cuda/cuda_mma.cuh"

// Lanes per row: 32, or for 8-wide vectors the largest power of two ≤ min(32, D/8).
static int norm_lanes(int64_t D, int width) {
    if (width == 1) return 32;
    int l = 1;
    while (l < 32 && 2 * l <= D / 8) l *= 2;
    return l;
}

// Sum over the lpr lanes of a row (lpr a power of two ≤ 32, rows on aligned lane groups).
__device__ __forceinline__ float group_sum(float v, int lpr) {
    for (int o = lpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// u for V columns from w: w or 1 + w, times silu(z) when gated; zz: z there (gated).
template <int V, bool ONE_P, bool GATED, typename T, typename TW>
__device__ __forceinline__ void norm_u(float (&u)[V], float (&zz)[V], const TW *w, const T *z) {
    ldv<V>(w, u);
    if (GATED) ldv<V>(z, zz);
#pragma unroll
    for (int k = 0; k < V; k++) {
        if (ONE_P) u[k] = 1.0f + u[k];
        if (GATED) u[k] = u[k] * zz[k] * sigmoid_f(zz[k]);
    }
}

// 256 threads a block, lpr lanes a row; every lane takes part in the shuffles.
template <typename T, typename TW, bool ONE_P, bool GATED, int V>
__global__ void rmsnorm_forward_kernel(T *y, float *rstd, const T *x, const T *z, const TW *w, int64_t R, int64_t D,
                                       int lpr, float eps) {
    int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / lpr, o = row * D;
    int sub = threadIdx.x % lpr;
    bool ok = row < R;
    float ss = 0, v[V], u[V], zz[V];
    if (ok)
        for (int64_t j = sub * V; j < D; j += lpr * V) {
            ldv<V>(x + o + j, v);
#pragma unroll
            for (int k = 0; k < V; k++) ss += v[k] * v[k];
        }
    ss = group_sum(ss, lpr);
    if (!ok) return;
    float r = rsqrtf(ss / (float)D + eps);
    if (sub == 0) rstd[row] = r;
    for (int64_t j = sub * V; j < D; j += lpr * V) {
        ldv<V>(x + o + j, v);
        norm_u<V, ONE_P, GATED>(u, zz, w + j, z + o + j);
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = v[k] * r * u[k];
        stv<V>(y + o + j, v);
    }
}

// The backward's arithmetic on V columns' fp32 values g = dy, xv = x, u (norm_u) and zz = z (gated): the row's dot
// Σ dy·u·x added to dot; dx (+)= r·u·dy − x·c into a (holding dx's old values when acc), and the columns' ∂w terms
// dy·x·r (·silu(z) when gated) into wv. Every backward kernel computes through these two.
template <int V>
__device__ __forceinline__ void norm_dot_vals(float &dot, const float (&g)[V], const float (&xv)[V],
                                              const float (&u)[V]) {
#pragma unroll
    for (int k = 0; k < V; k++) dot += g[k] * u[k] * xv[k];
}
template <int V, bool GATED>
__device__ __forceinline__ void norm_dx_vals(float (&a)[V], float (&wv)[V], const float (&g)[V], const float (&xv)[V],
                                             const float (&u)[V], const float (&zz)[V], float r, float c, bool acc) {
#pragma unroll
    for (int k = 0; k < V; k++) {
        a[k] = (acc ? a[k] : 0.0f) + r * u[k] * g[k] - xv[k] * c;
        wv[k] = g[k] * xv[k] * r;
        if (GATED) wv[k] *= zz[k] * sigmoid_f(zz[k]);
    }
}

// The row's dot Σ dy·u·x over V columns (pointers at the columns), added to dot.
template <int V, bool ONE_P, bool GATED, typename T, typename TW>
__device__ __forceinline__ void norm_dot(float &dot, const T *dy, const T *x, const T *z, const TW *w) {
    float g[V], xv[V], u[V], zz[V];
    ldv<V>(dy, g), ldv<V>(x, xv);
    norm_u<V, ONE_P, GATED>(u, zz, w, z);
    norm_dot_vals<V>(dot, g, xv, u);
}

// V columns of the backward (pointers at the columns): dx (+)= r·u·dy − x·c, dz = dy·x·r·(w or 1 + w)·silu'(z) when
// gated; wv gets the columns' ∂w terms dy·x·r (·silu(z) when gated).
template <int V, bool ONE_P, bool GATED, typename T, typename TW>
__device__ __forceinline__ void norm_dx(T *dx, T *dz, const T *dy, const T *x, const T *z, const TW *w, float r,
                                        float c, bool acc, float (&wv)[V]) {
    float g[V], xv[V], u[V], zz[V], a[V];
    ldv<V>(dy, g), ldv<V>(x, xv);
    norm_u<V, ONE_P, GATED>(u, zz, w, z);
    if (acc) ldv<V>(dx, a);
    norm_dx_vals<V, GATED>(a, wv, g, xv, u, zz, r, c, acc);
    stv<V>(dx, a);
    if (GATED) {
        norm_u<V, ONE_P, false>(u, zz, w, z);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = g[k] * xv[k] * r * u[k] * silu_grad_f(zz[k]);
        stv<V>(dz, a);
    }
}

// dx and dz alone, 256 threads a block, lpr lanes a row; ∂w then comes from rmsnorm_dw_kernel. The path of the rows
// neither one-pass kernel takes: wider than 512 columns and fp32, gated, unaligned or wider than NORM_ROW_MAX_COLS.
template <typename T, typename TW, bool ONE_P, bool GATED, int V>
__global__ void rmsnorm_backward_kernel(T *dx, T *dz, const T *dy, const T *x, const T *z, const TW *w,
                                        const float *rstd, int64_t R, int64_t D, int lpr, bool acc) {
    int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / lpr, o = row * D;
    int sub = threadIdx.x % lpr;
    bool ok = row < R;
    float dot = 0, wv[V];
    if (ok)
        for (int64_t j = sub * V; j < D; j += lpr * V)
            norm_dot<V, ONE_P, GATED>(dot, dy + o + j, x + o + j, z + o + j, w + j);
    dot = group_sum(dot, lpr);
    if (!ok) return;
    float r = rstd[row], c = dot * r * r * r / (float)D;
    for (int64_t j = sub * V; j < D; j += lpr * V)
        norm_dx<V, ONE_P, GATED>(dx + o + j, dz + o + j, dy + o + j, x + o + j, z + o + j, w + j, r, c, acc, wv);
}

// part: (G, D) fp32, row g = Σ over row group g of dy·x·r (·silu(z) when gated); colsum_finish adds the groups
// to dw in order (colsum_block).
template <typename T, bool GATED>
__global__ void rmsnorm_dw_kernel(float *part, const T *dy, const T *x, const T *z, const float *rstd, int64_t R,
                                  int64_t D) {
    colsum_block(part, R, D, [=](int64_t i, int64_t j) {
        float v = ld(dy, i * D + j) * ld(x, i * D + j) * rstd[i];
        if (GATED) v *= ld(z, i * D + j) * sigmoid_f(ld(z, i * D + j));
        return v;
    });
}

// The backward with ∂w fused, so that dy, x and z are read once: a lane owns NV vectors of V columns (NV = 1 or 2
// with 8-wide vectors: up to 512 columns; 1, 2, 4 or 8 single columns: up to 256) and holds their ∂w sums in
// registers. Each block is one row group, of at least NORM_DW_GROUP_ROWS rows (colsum_groups), so up to 128 blocks
// share all but the shortest inputs, and the loads in flight come from within a block: norm_dw_threads(V, NV) threads
// (more where a lane holds fewer sums) and, ungated (fewer registers), 2 rows a slot at a time.
// A lane sums at most NORM_DW_COLS columns (so 8-wide vectors take rows up to 512 here): at wider rows the G blocks
// of one group each hold too few loads in flight (bench/results/2026-12-04-s27), and rmsnorm_backward_rows_kernel or
// the two kernels take them.
#define NORM_DW_VECS 8
#define NORM_DW_COLS 16
#define NORM_DW_GROUP_ROWS 32
static constexpr int norm_dw_threads(int v, int nv) { return v * nv <= 8 ? 1024 : 512; }
// Runs BODY with NV the smallest of 1, 2, 4 and 8 (NORM_DW_VECS) that is at least nv, and at most NORM_DW_COLS / V
// (the caller's nv is within both: the larger values are no instances of their own).
#define NV_CAP(n) ((n) < NORM_DW_COLS / V ? (n) : NORM_DW_COLS / V)
#define NV_SWITCH(nv, ...)                                                                                             \
    do {                                                                                                               \
        if ((nv) <= 1) {                                                                                               \
            constexpr int NV = 1;                                                                                      \
            __VA_ARGS__;                                                                                               \
        } else if ((nv) <= 2) {                                                                                        \
            constexpr int NV = NV_CAP(2);                                                                              \
            __VA_ARGS__;                                                                                               \
        } else if ((nv) <= 4) {                                                                                        \
            constexpr int NV = NV_CAP(4);                                                                              \
            __VA_ARGS__;                                                                                               \
        } else {                                                                                                       \
            constexpr int NV = NV_CAP(NORM_DW_VECS);                                                                   \
            __VA_ARGS__;                                                                                               \
        }                                                                                                              \
    } while (0)

// The end of the fused backward kernels: the S slots' ∂w sums (sum[c]: the vector at columns (c·lpr + sub)·V) added
// in shared memory in a fixed tree (slot s += slot s + h, h = S/2, …, 1) into part[blockIdx.x·D + j].
template <int V, int NV, int NT>
__device__ __forceinline__ void slot_sums_out(float *part, const float (&sum)[NV][V], float *red, int lpr, int64_t D) {
    int sub = threadIdx.x % lpr, slot = threadIdx.x / lpr, S = NT / lpr;
    float wv[V];
#pragma unroll
    for (int c = 0; c < NV; c++) {
        __syncthreads(); // the previous vector's tree has read red
#pragma unroll
        for (int k = 0; k < V; k++) red[k * NT + threadIdx.x] = sum[c][k];
        for (int h = S / 2; h > 0; h >>= 1) {
            __syncthreads();
            if (slot < h)
#pragma unroll
                for (int k = 0; k < V; k++) red[k * NT + threadIdx.x] += red[k * NT + threadIdx.x + h * lpr];
        }
        int64_t j = (int64_t)(c * lpr + sub) * V;
        if (slot == 0 && j < D) {
#pragma unroll
            for (int k = 0; k < V; k++) wv[k] = red[k * NT + threadIdx.x];
            stv<V>(part + blockIdx.x * D + j, wv);
        }
    }
}

// Grid (G): block g takes rows [g·RG, min(R, (g + 1)·RG)) (none in a trailing group past R: its sums are 0) and has
// S = threads / lpr row slots of lpr lanes; slot s takes the rows s, s + S, … (RU at a time: the loads of all RU rows
// go out before their shuffles), and lane sub of a slot owns the vectors at columns (c·lpr + sub)·V, c < NV, summing
// their ∂w terms over the slot's rows. The slots' sums then add in shared memory in a fixed tree (slot s += slot
// s + h, h = S/2, …, 1) into part[g·D + j], and colsum_finish adds the groups to dw in order. No atomics, and the order
// follows the shape and the vector width only (G from colsum_groups, S and the columns' owners from D and V), so every
// run and every GPU gives the same bits.
template <typename T, typename TW, bool ONE_P, bool GATED, int V, int NV>
__global__ void __launch_bounds__(norm_dw_threads(V, NV))
    rmsnorm_backward_fused_kernel(float *part, T *dx, T *dz, const T *dy, const T *x, const T *z, const TW *w,
                                  const float *rstd, int64_t R, int64_t D, int64_t RG, int lpr, bool acc) {
    constexpr int NT = norm_dw_threads(V, NV), RU = GATED ? 1 : 2; // rows a slot at a time
    __shared__ float red[V * NT];                                  // red[k·NT + t]: element k of thread t's vector
    int sub = threadIdx.x % lpr, slot = threadIdx.x / lpr, S = NT / lpr;
    int64_t r0 = blockIdx.x * RG, r1 = r0 + RG < R ? r0 + RG : R;
    float sum[NV][V], wv[V];
#pragma unroll
    for (int c = 0; c < NV; c++)
#pragma unroll
        for (int k = 0; k < V; k++) sum[c][k] = 0;
    for (int64_t b = r0; b < r1; b += RU * S) { // the same trip count in every slot: all lanes reach the shuffles
        float dot[RU];
#pragma unroll
        for (int q = 0; q < RU; q++) {
            int64_t i = b + q * S + slot, o = i * D;
            dot[q] = 0;
            if (i < r1)
#pragma unroll
                for (int c = 0; c < NV; c++) {
                    int64_t j = (int64_t)(c * lpr + sub) * V;
                    if (j < D) norm_dot<V, ONE_P, GATED>(dot[q], dy + o + j, x + o + j, z + o + j, w + j);
                }
        }
#pragma unroll
        for (int q = 0; q < RU; q++) dot[q] = group_sum(dot[q], lpr);
#pragma unroll
        for (int q = 0; q < RU; q++) {
            int64_t i = b + q * S + slot, o = i * D;
            if (i >= r1) continue;
            float r = rstd[i], cr = dot[q] * r * r * r / (float)D;
#pragma unroll
            for (int c = 0; c < NV; c++) {
                int64_t j = (int64_t)(c * lpr + sub) * V;
                if (j >= D) continue;
                norm_dx<V, ONE_P, GATED>(dx + o + j, dz + o + j, dy + o + j, x + o + j, z + o + j, w + j, r, cr, acc,
                                         wv);
#pragma unroll
                for (int k = 0; k < V; k++) sum[c][k] += wv[k];
            }
        }
    }
    slot_sums_out<V, NV, NT>(part, sum, red, lpr, D);
}

// The backward of bf16 rows of 513 to NORM_ROW_MAX_COLS columns, ungated, with 8-wide vectors, in one pass. A block
// of NORM_ROW_THREADS threads is one row group: G = colsum_groups(R, D, NORM_ROW_MIN_ROWS, NORM_ROW_GROUPS) groups, so
// the G·D fp32 partials fit the small pool. A row belongs to W warps (lpr = 32·W lanes: W = 1 up to 2048 columns,
// else 2) and lane l of a row owns the vectors at columns c·CW + 8l, c < NV (CW = 8·lpr, NV·CW ≥ D), holding their ∂w
// sums in registers. Each lane copies its vectors of a row's dy and x (and dx when accumulating) by cp.async into its
// own entries of a NORM_ROW_STAGES-deep ring in shared memory and reads back only those, so the next row's loads are
// in flight while the lane works on this one, with no barrier between warps; u (w or 1 + w, fp32) is made once a
// block, in shared memory.
#define NORM_ROW_THREADS 256
#define NORM_ROW_GROUPS 128
#define NORM_ROW_MIN_ROWS 32
#define NORM_ROW_STAGES 2
#define NORM_ROW_MAX_COLS 4096

// Eight bf16 (16 bytes) as fp32.
__device__ __forceinline__ void bf16x8_f32(uint4 q, float (&v)[8]) {
    const uint32_t h[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[2 * i] = __uint_as_float(h[i] << 16), v[2 * i + 1] = __uint_as_float(h[i] & 0xffff0000u);
}

// Named barrier id (1 … 15; 0 is __syncthreads') over the n threads (a multiple of 32) that call it.
__device__ __forceinline__ void bar_named(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// Dynamic shared memory of rmsnorm_backward_rows_kernel: u as float4 u4[(c·2 + h)·lpr + l] (columns c·CW + 8l + 4h
// … + 3), then each warp's ring, uint4 [stage][buffer: dy, x, dx when acc][c][lane].
static size_t norm_rows_smem(int W, int NV, bool acc) {
    return (size_t)NV * 2 * 32 * W * 16 + (size_t)(NORM_ROW_THREADS / 32) * NORM_ROW_STAGES * (acc ? 3 : 2) * NV * 512;
}

// Grid (G): block g takes rows [g·RG, min(R, (g + 1)·RG)) (none in a trailing group past R: its sums are 0) in
// S = threads / lpr row slots; slot s takes the rows s, s + S, … in order (n-th: stage n % NORM_ROW_STAGES of its
// warps' rings). A row's dot adds over its lanes by shuffles, then (W = 2) over its warps through wdot in warp order.
// After the rows the slots' ∂w sums go to shared memory (red[s][j], over the rings) and thread t adds column
// j = t, t + threads, … over the slots in order into part[g·D + j]; colsum_finish adds the groups to dw in order. No
// atomics, and the order follows the shape only (G from colsum_groups, W and the columns' owners from D), so every run
// and every GPU gives the same bits.
template <typename TW, bool ONE_P, int W, int NV>
__global__ void __launch_bounds__(NORM_ROW_THREADS, 1)
    rmsnorm_backward_rows_kernel(float *part, bf16 *dx, const bf16 *dy, const bf16 *x, const TW *w, const float *rstd,
                                 int64_t R, int64_t D, int64_t RG, bool acc) {
    constexpr int LPR = 32 * W, S = NORM_ROW_THREADS / LPR, CW = 8 * LPR, NS = NORM_ROW_STAGES;
    extern __shared__ uint4 smem[];
    __shared__ float wdot[2][S][W]; // (W = 2) the warps' dots of a slot's row, by the row's parity
    float4 *u4 = (float4 *)smem;
    int nb = acc ? 3 : 2, l = threadIdx.x % LPR, slot = threadIdx.x / LPR;
    uint4 *ring = smem + NV * 2 * LPR + (threadIdx.x / 32) * NS * nb * NV * 32 + threadIdx.x % 32; // this lane's
    int64_t r0 = blockIdx.x * RG, r1 = r0 + RG < R ? r0 + RG : R, i0 = r0 + slot;
    int64_t cnt = r1 > i0 ? (r1 - i0 + S - 1) / S : 0; // the slot's rows: i0 + n·S, n < cnt
    // Row n of the slot into stage n % NS (none past the slot's rows), committed as one group either way.
    auto issue = [&](int64_t n) {
        if (n < cnt) {
            int64_t o = (i0 + n * S) * D;
            uint4 *st = ring + (n % NS) * nb * NV * 32;
#pragma unroll
            for (int c = 0; c < NV; c++) {
                int64_t j = (int64_t)c * CW + 8 * l;
                if (j >= D) continue;
                cp_async16(smem_addr(st + c * 32), dy + o + j, true);
                cp_async16(smem_addr(st + (NV + c) * 32), x + o + j, true);
                if (acc) cp_async16(smem_addr(st + (2 * NV + c) * 32), dx + o + j, true);
            }
        }
        cp_async_commit();
    };
    auto ld_u = [&](int c, float(&u)[8]) {
        float4 a = u4[c * 2 * LPR + l], b = u4[(c * 2 + 1) * LPR + l];
        u[0] = a.x, u[1] = a.y, u[2] = a.z, u[3] = a.w, u[4] = b.x, u[5] = b.y, u[6] = b.z, u[7] = b.w;
    };
    float sum[NV][8];
#pragma unroll
    for (int c = 0; c < NV; c++)
#pragma unroll
        for (int k = 0; k < 8; k++) sum[c][k] = 0;
    issue(0);                             // (its loads in flight while u is made)
    float rn = cnt > 0 ? rstd[i0] : 0.0f; // the next row's rstd, loaded a row ahead
    for (int e = threadIdx.x; e < NV * 2 * LPR; e += NORM_ROW_THREADS) {
        int64_t j = (int64_t)(e / (2 * LPR)) * CW + 8 * (e % LPR) + 4 * (e / LPR % 2);
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float t = j < D ? ld(w, j + k) : 0.0f;
            v[k] = ONE_P ? 1.0f + t : t;
        }
        u4[e] = make_float4(v[0], v[1], v[2], v[3]);
    }
    __syncthreads(); // u4 written
    for (int64_t n = 0; n < cnt; n++) {
        int64_t o = (i0 + n * S) * D;
        float r = rn;
        issue(n + 1);
        if (n + 1 < cnt) rn = rstd[i0 + (n + 1) * S];
        cp_async_wait<NS - 1>();       // row n's group has landed
        asm volatile("" ::: "memory"); // and the reads below stay after the wait
        const uint4 *st = ring + (n % NS) * nb * NV * 32;
        uint4 gq[NV], xq[NV];
        float dot = 0;
#pragma unroll
        for (int c = 0; c < NV; c++) {
            if ((int64_t)c * CW + 8 * l >= D) continue;
            float g[8], xv[8], u[8];
            gq[c] = st[c * 32], xq[c] = st[(NV + c) * 32];
            bf16x8_f32(gq[c], g), bf16x8_f32(xq[c], xv), ld_u(c, u);
            norm_dot_vals<8>(dot, g, xv, u);
        }
        dot = group_sum(dot, 32);
        if (W > 1) {
            int p = (int)(n & 1); // wdot[p] is free: every warp of the slot read it before the previous barrier
            if (threadIdx.x % 32 == 0) wdot[p][slot][l / 32] = dot;
            bar_named(1 + slot, LPR);
            dot = 0;
#pragma unroll
            for (int q = 0; q < W; q++) dot += wdot[p][slot][q];
        }
        float cr = dot * r * r * r / (float)D;
#pragma unroll
        for (int c = 0; c < NV; c++) {
            int64_t j = (int64_t)c * CW + 8 * l;
            if (j >= D) continue;
            float g[8], xv[8], u[8], zz[8], a[8], wv[8];
            bf16x8_f32(gq[c], g), bf16x8_f32(xq[c], xv), ld_u(c, u);
            if (acc) bf16x8_f32(st[(2 * NV + c) * 32], a);
            norm_dx_vals<8, false>(a, wv, g, xv, u, zz, r, cr, acc);
            st8(dx + o + j, a);
#pragma unroll
            for (int k = 0; k < 8; k++) sum[c][k] += wv[k];
        }
        asm volatile("" ::: "memory"); // this row's reads stay before the next copies into the ring
    }
    cp_async_wait<0>();
    __syncthreads(); // the rings are free: red[s·NV·CW + j] over them
    float *red = (float *)(smem + NV * 2 * LPR);
#pragma unroll
    for (int c = 0; c < NV; c++) {
        float *p = red + (slot * NV + c) * CW + 8 * l;
        *(float4 *)p = make_float4(sum[c][0], sum[c][1], sum[c][2], sum[c][3]);
        *(float4 *)(p + 4) = make_float4(sum[c][4], sum[c][5], sum[c][6], sum[c][7]);
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < D; j += NORM_ROW_THREADS) {
        float s = 0;
        for (int t = 0; t < S; t++) s += red[t * NV * CW + j];
        part[blockIdx.x * D + j] = s;
    }
}

// One pair's turn (sgn −1: the backward's): each product rounded on its own (no fused multiply-add), so that every
// kernel turning pairs gives the same bits.
__device__ __forceinline__ void rope_turn(float a, float b, float c, float s, float sgn, float &oa, float &ob) {
    oa = __fsub_rn(__fmul_rn(a, c), __fmul_rn(__fmul_rn(sgn, b), s));
    ob = __fadd_rn(__fmul_rn(b, c), __fmul_rn(__fmul_rn(sgn, a), s));
}

// RoPE on dims [off, off + 2·half) of each (token, head) row of d elements (ops_list.h): one thread per V pairs
// (V = 8 only for the rotate-half layout), a at v[ia], b at v[ib], v = the row + off.
template <typename T, int V>
__global__ void rope_kernel(T *x, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t T_, int64_t nh,
                            int64_t half, int64_t d, int64_t off, bool pairs, float sgn) {
    int64_t hv = half / V;
    GRID_STRIDE(e, T_ * nh * hv) {
        int64_t i = e % hv * V, th = e / hv, t = th / nh, p = (int64_t)pos[t] * half + i;
        int64_t ia = pairs ? 2 * i : i, ib = pairs ? 2 * i + 1 : i + half;
        T *v = x + th * d + off;
        float a[V], b[V], c[V], s[V], oa[V], ob[V];
        ldv<V>(v + ia, a), ldv<V>(v + ib, b), ldv<V>(cos_t + p, c), ldv<V>(sin_t + p, s);
#pragma unroll
        for (int q = 0; q < V; q++) rope_turn(a[q], b[q], c[q], s[q], sgn, oa[q], ob[q]);
        stv<V>(v + ia, oa), stv<V>(v + ib, ob);
    }
}

// The vector of a head row (columns j0 … + 7 of row `row`) turned by RoPE (rope_turn: sgn 1, or −1 the backward's)
// and rounded to T as op_rope stores it, with the partner lane's (lane ^ half/8; every lane of the warp takes part:
// valid false for a row past the last, whose vector is left as it is). Columns past 2·half do not turn.
template <typename T>
__device__ __forceinline__ void rope_vec(float (&v)[8], bool valid, int64_t row, int j0, const float *cos_t,
                                         const float *sin_t, const int32_t *pos, int64_t heads, int half, float sgn) {
    float pv[8];
#pragma unroll
    for (int k = 0; k < 8; k++) pv[k] = __shfl_xor_sync(0xffffffffu, v[k], half / 8);
    if (!valid || j0 >= 2 * half) return;
    bool first = j0 < half;
    int64_t p = (int64_t)pos[row / heads] * half + (first ? j0 : j0 - half);
    float c[8], s[8];
    ldv<8>(cos_t + p, c), ldv<8>(sin_t + p, s);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float oa, ob;
        rope_turn(first ? v[k] : pv[k], first ? pv[k] : v[k], c[k], s[k], sgn, oa, ob);
        v[k] = (float)(T)(first ? oa : ob);
    }
}

// The per-head q/k norm with RoPE after it (RmsArgs.cos): x (R, D), a row a head of token
// row / heads, D = 8·lpr (lane sub holds columns 8·sub … + 7, one vector), ungated. The normed values, rounded to T as
// the norm stores them, turn in pairs (i, i + half) for i < half as rope_kernel turns them (rotate-half, off 0): lane
// sub's partner is lane sub ^ (half / 8), half a multiple of 8 with half / 8 a power of two.
template <typename T, typename TW, bool ONE_P>
__global__ void rmsnorm_rope_forward_kernel(T *y, float *rstd, const T *x, const TW *w, int64_t R, int64_t D, int lpr,
                                            float eps, const float *cos_t, const float *sin_t, const int32_t *pos,
                                            int64_t heads, int half) {
    int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / lpr, o = row * D;
    int sub = threadIdx.x % lpr, j0 = 8 * sub;
    bool ok = row < R;
    float v[8], u[8], zz[8], ss = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = 0;
    if (ok) ldv<8>(x + o + j0, v);
#pragma unroll
    for (int k = 0; k < 8; k++) ss += v[k] * v[k];
    ss = group_sum(ss, lpr);
    float r = rsqrtf(ss / (float)D + eps);
    norm_u<8, ONE_P, false>(u, zz, w + j0, (const T *)NULL);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        T q = (T)(v[k] * r * u[k]); // the value the norm stores
        v[k] = (float)q;
    }
    rope_vec<T>(v, ok, row, j0, cos_t, sin_t, pos, heads, half, 1.0f);
    if (!ok) return;
    if (sub == 0) rstd[row] = r;
    stv<8>(y + o + j0, v);
}

// The per-head q/k norm's backward with RoPE's before it (RmsArgs.cos): dy is the gradient of
// the turned output, turned back here (rope_vec), then rmsnorm_backward_fused_kernel's arithmetic and order for
// one vector a lane (D = 8·lpr, ungated), so the bits of op_rope's backward and then that kernel.
template <typename T, typename TW, bool ONE_P>
__global__ void __launch_bounds__(norm_dw_threads(8, 1))
    rmsnorm_rope_backward_kernel(float *part, T *dx, const T *dy, const T *x, const TW *w, const float *rstd, int64_t R,
                                 int64_t D, int64_t RG, int lpr, bool acc, const float *cos_t, const float *sin_t,
                                 const int32_t *pos, int64_t heads, int half) {
    constexpr int NT = norm_dw_threads(8, 1), RU = 1; // a row a slot at a time (the slot's rows in the same order)
    __shared__ float red[8 * NT];
    int sub = threadIdx.x % lpr, slot = threadIdx.x / lpr, S = NT / lpr, j0 = 8 * sub;
    int64_t r0 = blockIdx.x * RG, r1 = r0 + RG < R ? r0 + RG : R;
    float sum[1][8], wv[8], u[8], zz[8], g[RU][8], xv[RU][8];
    norm_u<8, ONE_P, false>(u, zz, w + j0, (const T *)NULL);
#pragma unroll
    for (int k = 0; k < 8; k++) sum[0][k] = 0;
    for (int64_t b = r0; b < r1; b += RU * S) { // the same trip count in every slot: all lanes reach the shuffles
        float dot[RU];
#pragma unroll
        for (int q = 0; q < RU; q++) {
            int64_t i = b + q * S + slot;
#pragma unroll
            for (int k = 0; k < 8; k++) g[q][k] = 0, xv[q][k] = 0;
            if (i < r1) ldv<8>(dy + i * D + j0, g[q]), ldv<8>(x + i * D + j0, xv[q]);
            rope_vec<T>(g[q], i < r1, i, j0, cos_t, sin_t, pos, heads, half, -1.0f);
            dot[q] = 0;
            if (i < r1) norm_dot_vals<8>(dot[q], g[q], xv[q], u);
        }
#pragma unroll
        for (int q = 0; q < RU; q++) dot[q] = group_sum(dot[q], lpr);
#pragma unroll
        for (int q = 0; q < RU; q++) {
            int64_t i = b + q * S + slot;
            if (i >= r1) continue;
            float r = rstd[i], cr = dot[q] * r * r * r / (float)D, a[8];
            if (acc) ldv<8>(dx + i * D + j0, a);
            norm_dx_vals<8, false>(a, wv, g[q], xv[q], u, zz, r, cr, acc);
            stv<8>(dx + i * D + j0, a);
#pragma unroll
            for (int k = 0; k < 8; k++) sum[0][k] += wv[k];
        }
    }
    slot_sums_out<8, 1, NT>(part, sum, red, lpr, D);
}

// SwiGLU's arithmetic per output: plain, or with CLAMP GPT-OSS's clamped form.
template <bool CLAMP> struct Swiglu {
    float alpha, limit;
    __device__ __forceinline__ float forward(float g, float u) const {
        if (!CLAMP) return g * sigmoid_f(g) * u;
        float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
        return (uc + 1.0f) * gc / (1.0f + __expf(-alpha * gc));
    }
    __device__ __forceinline__ void backward(float g, float u, float da, float *dg, float *du) const {
        if (!CLAMP) {
            float sg = sigmoid_f(g);
            *dg = da * u * sg * (1.0f + g * (1.0f - sg));
            *du = da * g * sg;
            return;
        }
        float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit), s = 1.0f / (1.0f + __expf(-alpha * gc));
        *dg = g <= limit ? da * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
        *du = u >= -limit && u <= limit ? da * gc * s : 0.0f;
    }
};

// Gate and up of V consecutive outputs from output o (row r, column i): [gate | up] halves, or interleaved pairs.
template <int V, bool CLAMP, typename T>
__device__ __forceinline__ void swiglu_ld(const T *gu, int64_t o, int64_t r, int64_t i, int64_t I, float (&g)[V],
                                          float (&u)[V]) {
    if (!CLAMP) {
        ldv<V>(gu + r * 2 * I + i, g), ldv<V>(gu + r * 2 * I + I + i, u);
        return;
    }
    float p[2][V];
    ldv<V>(gu + 2 * o, p[0]), ldv<V>(gu + 2 * o + V, p[1]); // with V = 1 p[1] holds u
    if constexpr (V == 1) g[0] = p[0][0], u[0] = p[1][0];
    else
#pragma unroll
        for (int q = 0; q < V; q++) g[q] = p[2 * q / V][2 * q % V], u[q] = p[2 * q / V][2 * q % V + 1];
}
template <int V, bool CLAMP, typename T>
__device__ __forceinline__ void swiglu_st(T *gu, int64_t o, int64_t r, int64_t i, int64_t I, const float (&g)[V],
                                          const float (&u)[V]) {
    if (!CLAMP) {
        stv<V>(gu + r * 2 * I + i, g), stv<V>(gu + r * 2 * I + I + i, u);
        return;
    }
    float p[2][V];
    if constexpr (V == 1) p[0][0] = g[0], p[1][0] = u[0];
    else
#pragma unroll
        for (int q = 0; q < V; q++) p[2 * q / V][2 * q % V] = g[q], p[2 * q / V][2 * q % V + 1] = u[q];
    stv<V>(gu + 2 * o, p[0]), stv<V>(gu + 2 * o + V, p[1]);
}

// One thread per V outputs (a row of I splits into whole vectors, so a vector never spans rows).
template <typename T, bool CLAMP, int V>
__global__ void swiglu_forward_kernel(T *act, const T *gu, int64_t M, int64_t I, Swiglu<CLAMP> f) {
    GRID_STRIDE(e, M * I / V) {
        int64_t o = e * V, r = o / I, i = o % I;
        float g[V], u[V], a[V];
        swiglu_ld<V, CLAMP>(gu, o, r, i, I, g, u);
#pragma unroll
        for (int q = 0; q < V; q++) a[q] = f.forward(g[q], u[q]);
        stv<V>(act + o, a);
    }
}
template <typename T, bool CLAMP, int V>
__global__ void swiglu_backward_kernel(T *dgu, const T *dact, const T *gu, int64_t M, int64_t I, Swiglu<CLAMP> f) {
    GRID_STRIDE(e, M * I / V) {
        int64_t o = e * V, r = o / I, i = o % I;
        float g[V], u[V], da[V], dg[V], du[V];
        swiglu_ld<V, CLAMP>(gu, o, r, i, I, g, u);
        ldv<V>(dact + o, da);
#pragma unroll
        for (int q = 0; q < V; q++) f.backward(g[q], u[q], da[q], &dg[q], &du[q]);
        swiglu_st<V, CLAMP>(dgu, o, r, i, I, dg, du);
    }
}

// Launches rmsnorm_backward_rows_kernel on G blocks with W and NV from D (a multiple of 8, 513 … NORM_ROW_MAX_COLS):
// W = 1 with NV = 4 (up to 1024 columns) or 8, else W = 2 with NV = 8.
template <typename TW, bool ONE_P>
static void norm_rows_launch(float *part, int G, bf16 *dx, const bf16 *dy, const bf16 *x, const TW *w,
                             const float *rstd, int64_t R, int64_t D, int64_t RG, bool acc) {
    auto run = [&](auto kernel, int W, int NV) {
        launch(kernel, dim3((unsigned)G), dim3(NORM_ROW_THREADS), norm_rows_smem(W, NV, acc), part, dx, dy, x, w, rstd,
               R, D, RG, acc);
    };
    if (D <= 1024) run(rmsnorm_backward_rows_kernel<TW, ONE_P, 1, 4>, 1, 4);
    else if (D <= 2048) run(rmsnorm_backward_rows_kernel<TW, ONE_P, 1, 8>, 1, 8);
    else run(rmsnorm_backward_rows_kernel<TW, ONE_P, 2, 8>, 2, 8);
}

static int64_t norm_rows_calls; // backward calls on rmsnorm_backward_rows_kernel (cuda_norm_rows_calls)
static int64_t norm_rope_calls; // calls on the norm-and-RoPE kernels, forward and backward (cuda_norm_rope_calls)

// Whether the norm-and-RoPE kernels take heads of D (lpr lanes of 8 each) whose first 2·half values turn: a head a
// lane group, the turned pairs half/8 lanes apart.
static bool norm_rope_fits(int64_t D, int lpr, int64_t half, const RmsArgs *a) {
    return !a->z.p && D == 8 * lpr && half % 8 == 0 && !(half / 8 & (half / 8 - 1)) && 2 * half <= D &&
           aligned16(a->cos.p, a->sin.p);
}

// The norm and the RoPE after it (RmsArgs.cos) in one kernel where it fits; false otherwise.
static bool norm_rope_fused(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps, const RmsArgs *a) {
    int64_t R = t_rows(x), D = t_cols(x), half = a->cos.n[1];
    int lpr = norm_lanes(D, 8);
    if (!norm_rope_fits(D, lpr, half, a) || !vec8_fits(D, y.p, x.p, w.p)) return false;
    BOOL_SWITCH(a->one_plus, ONE_P,
                DT_SWITCH(x.dt, T, "rmsnorm_forward",
                          DT_SWITCH(w.dt, TW, "rmsnorm_forward",
                                    rmsnorm_rope_forward_kernel<T, TW, ONE_P>
                                    <<<(unsigned)((R * lpr + 255) / 256), 256, 0, cuda_stream()>>>(
                                        (T *)y.p, (float *)rstd.p, (const T *)x.p, (const TW *)w.p, R, D, lpr, eps,
                                        (const float *)a->cos.p, (const float *)a->sin.p, (const int32_t *)a->pos.p,
                                        (int64_t)a->heads, (int)half))));
    CUDA_LAUNCH_CHECK();
    norm_rope_calls++;
    return true;
}

// The backward with RoPE's before it (RmsArgs.cos) in one kernel where it fits; false otherwise.
static bool norm_rope_backward_fused(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool acc,
                                     const RmsArgs *a) {
    int64_t R = t_rows(x), D = t_cols(x), half = a->cos.n[1];
    int lpr = norm_lanes(D, 8);
    if (!norm_rope_fits(D, lpr, half, a) || !vec8_fits(D, dx.p, dy.p, x.p, w.p)) return false;
    int G = colsum_groups(R, D, NORM_DW_GROUP_ROWS); // the groups of the fused kernel's path: the same sums
    float *part = colsum_part(D, G, "rmsnorm_backward");
    int64_t RG = (R + G - 1) / G;
    BOOL_SWITCH(
        a->one_plus, ONE_P,
        DT_SWITCH(x.dt, T, "rmsnorm_backward",
                  DT_SWITCH(w.dt, TW, "rmsnorm_backward",
                            rmsnorm_rope_backward_kernel<T, TW, ONE_P>
                            <<<(unsigned)G, norm_dw_threads(8, 1), 0, cuda_stream()>>>(
                                part, (T *)dx.p, (const T *)dy.p, (const T *)x.p, (const TW *)w.p,
                                (const float *)rstd.p, R, D, RG, lpr, acc, (const float *)a->cos.p,
                                (const float *)a->sin.p, (const int32_t *)a->pos.p, (int64_t)a->heads, (int)half))));
    CUDA_LAUNCH_CHECK();
    colsum_finish((float *)dw.p, part, G, D);
    norm_rope_calls++;
    return true;
}

extern "C" {

int64_t cuda_norm_rows_calls(void) { return norm_rows_calls; }
int64_t cuda_norm_rope_calls(void) { return norm_rope_calls; }

void cuda_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps, const RmsArgs *a) {
    int64_t R = t_rows(x), D = t_cols(x);
    Tensor z = a ? a->z : Tensor{};
    CHECK(tensor_numel(w) == D && tensor_numel(rstd) == R && tensor_numel(y) == R * D);
    CHECK(!z.p || tensor_numel(z) == R * D);
    same_dt(y, x, "rmsnorm_forward");
    IS_F32(rstd, "rmsnorm_forward");
    if (z.p) same_dt(z, x, "rmsnorm_forward");
    if (R == 0) return;
    bool rope = a && a->cos.p;
    if (rope) CHECK(!z.p && a->heads > 0 && R % a->heads == 0);
    if (rope && norm_rope_fused(y, rstd, x, w, eps, a)) return;
    // 8-wide vectors need D % 8 == 0 and aligned rows; V = 1 serves the rest, which real models reach: w is a view
    // at an unpadded offset of the flat parameter buffer, so it can be unaligned.
    bool v8 = vec8_fits(D, y.p, x.p, z.p, w.p);
    int lpr = norm_lanes(D, v8 ? 8 : 1);
    V_SWITCH(v8,
             BOOL_SWITCH(a && a->one_plus, ONE_P,
                         BOOL_SWITCH(z.p, GATED,
                                     DT_SWITCH(x.dt, T, "rmsnorm_forward",
                                               DT_SWITCH(w.dt, TW, "rmsnorm_forward",
                                                         rmsnorm_forward_kernel<T, TW, ONE_P, GATED, V>
                                                         <<<(unsigned)((R * lpr + 255) / 256), 256, 0, cuda_stream()>>>(
                                                             (T *)y.p, (float *)rstd.p, (const T *)x.p, (const T *)z.p,
                                                             (const TW *)w.p, R, D, lpr, eps))))));
    CUDA_LAUNCH_CHECK();
    if (rope)
        cuda_rope(tensor_make(y.p, y.dt, DEV_CUDA, 3, R / a->heads, a->heads, D, 1), 0, a->cos, a->sin, a->pos,
                  ROPE_HALF, false);
}

void cuda_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                           const RmsArgs *a) {
    int64_t R = t_rows(x), D = t_cols(x);
    Tensor z = a ? a->z : Tensor{}, dz = a ? a->dz : Tensor{};
    same_dt(dx, x, "rmsnorm_backward");
    same_dt(dy, x, "rmsnorm_backward");
    IS_F32(dw, "rmsnorm_backward");
    if (z.p) same_dt(z, x, "rmsnorm_backward"), same_dt(dz, x, "rmsnorm_backward");
    if (R == 0) return;
    if (a && a->cos.p) { // dy is turned back first: in the kernel, else in place (ops.h)
        CHECK(!z.p && a->heads > 0 && R % a->heads == 0);
        if (norm_rope_backward_fused(dx, dw, dy, x, w, rstd, accumulate, a)) return;
        cuda_rope(tensor_make(dy.p, dy.dt, DEV_CUDA, 3, R / a->heads, a->heads, D, 1), 0, a->cos, a->sin, a->pos,
                  ROPE_HALF, true);
    }
    bool v8 = vec8_fits(D, dx.p, dy.p, x.p, w.p) && aligned16(z.p, dz.p);
    int width = v8 ? 8 : 1, lpr = norm_lanes(D, width);
    int64_t nv = (D + (int64_t)lpr * width - 1) / ((int64_t)lpr * width); // the vectors of a lane
    bool fused = nv <= NORM_DW_VECS && width * nv <= NORM_DW_COLS;
    if (!fused && v8 && !z.p && x.dt == DT_BF16 && D <= NORM_ROW_MAX_COLS) { // one pass at hidden widths
        norm_rows_calls++;
        int G = colsum_groups(R, D, NORM_ROW_MIN_ROWS, NORM_ROW_GROUPS);
        float *part = colsum_part(D, G, "rmsnorm_backward");
        int64_t RG = (R + G - 1) / G;
        BOOL_SWITCH(
            a && a->one_plus, ONE_P,
            DT_SWITCH(w.dt, TW, "rmsnorm_backward",
                      norm_rows_launch<TW, ONE_P>(part, G, (bf16 *)dx.p, (const bf16 *)dy.p, (const bf16 *)x.p,
                                                  (const TW *)w.p, (const float *)rstd.p, R, D, RG, accumulate)));
        colsum_finish((float *)dw.p, part, G, D);
        return;
    }
    int G = colsum_groups(R, D, fused ? NORM_DW_GROUP_ROWS : 256);
    float *part = colsum_part(D, G, "rmsnorm_backward");
    if (fused) { // one kernel (dx, dz, ∂w's group sums), then the groups added in order
        int64_t RG = (R + G - 1) / G;
        V_SWITCH(v8, BOOL_SWITCH(
                         a && a->one_plus, ONE_P,
                         BOOL_SWITCH(
                             z.p, GATED,
                             DT_SWITCH(x.dt, T, "rmsnorm_backward",
                                       DT_SWITCH(w.dt, TW, "rmsnorm_backward",
                                                 NV_SWITCH(nv, rmsnorm_backward_fused_kernel<T, TW, ONE_P, GATED, V, NV>
                                                           <<<(unsigned)G, norm_dw_threads(V, NV), 0, cuda_stream()>>>(
                                                               part, (T *)dx.p, (T *)dz.p, (const T *)dy.p,
                                                               (const T *)x.p, (const T *)z.p, (const TW *)w.p,
                                                               (const float *)rstd.p, R, D, RG, lpr, accumulate)))))));
        CUDA_LAUNCH_CHECK();
        colsum_finish((float *)dw.p, part, G, D);
        return;
    }
    V_SWITCH(v8,
             BOOL_SWITCH(a && a->one_plus, ONE_P,
                         BOOL_SWITCH(z.p, GATED,
                                     DT_SWITCH(x.dt, T, "rmsnorm_backward",
                                               DT_SWITCH(w.dt, TW, "rmsnorm_backward",
                                                         rmsnorm_backward_kernel<T, TW, ONE_P, GATED, V>
                                                         <<<(unsigned)((R * lpr + 255) / 256), 256, 0, cuda_stream()>>>(
                                                             (T *)dx.p, (T *)dz.p, (const T *)dy.p, (const T *)x.p,
                                                             (const T *)z.p, (const TW *)w.p, (const float *)rstd.p, R,
                                                             D, lpr, accumulate))))));
    CUDA_LAUNCH_CHECK();
    BOOL_SWITCH(z.p, GATED,
                DT_SWITCH(x.dt, T, "rmsnorm_backward",
                          rmsnorm_dw_kernel<T, GATED>
                          <<<dim3((unsigned)((D + 31) / 32), (unsigned)G), dim3(32, 8), 0, cuda_stream()>>>(
                              part, (const T *)dy.p, (const T *)x.p, (const T *)z.p, (const float *)rstd.p, R, D)));
    CUDA_LAUNCH_CHECK();
    colsum_finish((float *)dw.p, part, G, D);
}

void cuda_rope(Tensor x, int off, Tensor cos_t, Tensor sin_t, Tensor pos, RopeLayout layout, bool backward) {
    int64_t T_ = x.n[0], nh = x.n[1], d = x.n[2], half = cos_t.n[1];
    if (off < 0 || off + 2 * half > d || sin_t.n[1] != half || tensor_numel(pos) != T_)
        die("rope: x (%lld, %lld, %lld), rotated dims [%d, %lld) and tables (%lld, %lld) do not fit", (long long)T_,
            (long long)nh, (long long)d, off, (long long)(off + 2 * half), (long long)cos_t.n[0], (long long)half);
    IS_F32(cos_t, "rope");
    IS_F32(sin_t, "rope");
    int64_t n = T_ * nh * half;
    if (n == 0) return;
    // V = 1 serves the pair layout and half-widths, rows or offsets that are not a multiple of 8 (head_dim 8 in the
    // tiny test models); every full-size rotate-half head takes V = 8.
    bool vec8 = layout == ROPE_HALF && d % 8 == 0 && off % 8 == 0 && vec8_fits(half, x.p, cos_t.p, sin_t.p);
    V_SWITCH(vec8, DT_SWITCH(x.dt, T, "rope",
                             rope_kernel<T, V><<<grid_for(n / V, 256), 256, 0, cuda_stream()>>>(
                                 (T *)x.p, (const float *)cos_t.p, (const float *)sin_t.p, (const int32_t *)pos.p, T_,
                                 nh, half, d, off, layout == ROPE_PAIRS, backward ? -1.0f : 1.0f)));
    CUDA_LAUNCH_CHECK();
}

// V = 1 serves widths that are not a multiple of 8 (moe_intermediate_size 6 in the tiny test models); real
// intermediate sizes take V = 8.
void cuda_swiglu_forward(Tensor act, Tensor gu, float alpha, float limit) {
    int64_t M = t_rows(gu), I = t_cols(gu) / 2, n = M * I;
    CHECK(t_cols(gu) == 2 * I && t_cols(act) == I && t_rows(act) == M);
    same_dt(act, gu, "swiglu_forward");
    if (n == 0) return;
    V_SWITCH(vec8_fits(I, act.p, gu.p),
             BOOL_SWITCH(limit > 0, CLAMP,
                         DT_SWITCH(gu.dt, T, "swiglu_forward",
                                   swiglu_forward_kernel<T, CLAMP, V><<<grid_for(n / V, 256), 256, 0, cuda_stream()>>>(
                                       (T *)act.p, (const T *)gu.p, M, I, Swiglu<CLAMP>{alpha, limit}))));
    CUDA_LAUNCH_CHECK();
}

void cuda_swiglu_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit) {
    int64_t M = t_rows(gu), I = t_cols(gu) / 2, n = M * I;
    CHECK(tensor_numel(dgu) == 2 * n && tensor_numel(dact) == n);
    same_dt(dgu, gu, "swiglu_backward");
    same_dt(dact, gu, "swiglu_backward");
    if (n == 0) return;
    V_SWITCH(
        vec8_fits(I, dgu.p, dact.p, gu.p),
        BOOL_SWITCH(limit > 0, CLAMP,
                    DT_SWITCH(gu.dt, T, "swiglu_backward",
                              swiglu_backward_kernel<T, CLAMP, V><<<grid_for(n / V, 256), 256, 0, cuda_stream()>>>(
                                  (T *)dgu.p, (const T *)dact.p, (const T *)gu.p, M, I, Swiglu<CLAMP>{alpha, limit}))));
    CUDA_LAUNCH_CHECK();
}

} // extern "C"
