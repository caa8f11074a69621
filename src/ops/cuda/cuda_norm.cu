// cuda_norm.cu — RMSNorm (plain, 1 + w, gated), RoPE and SwiGLU (plain, clamped): memory-bound kernels, fp32
// arithmetic on fp32 or bf16 storage. Math as in ops/cpu/cpu_norm.c and ops_list.h; RMSNorm's forms are the
// kernels' flags ONE_P (u = 1 + w) and GATED (u times silu(z)), SwiGLU's clamped form CLAMP.
// Shapes: x, y, dy, dx, z, dz: (R, D); w: (D); rstd: (R) fp32; RoPE x: (T, heads, d), cos/sin (P, d/2) fp32,
// pos (T) int32; SwiGLU gu: (M, 2I) = [gate | up] (interleaved [g_0, u_0, …] when clamped), act: (M, I).
// Each kernel moves V values at a time (cuda_common.cuh): RMSNorm gives a row lpr lanes of one warp (32, or with
// V = 8 the largest power of two ≤ min(32, D/8)), RoPE and SwiGLU one thread per V pairs or outputs. RMSNorm's
// backward sums ∂w's row groups in the same pass as dx where a lane has few columns (rows up to 512 wide:
// rmsnorm_backward_fused_kernel), else in a second kernel (rmsnorm_dw_kernel); colsum_finish then adds the groups.
#include "ops/cuda/cuda_common.cuh"

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

// The row's dot Σ dy·u·x over V columns (pointers at the columns), added to dot.
template <int V, bool ONE_P, bool GATED, typename T, typename TW>
__device__ __forceinline__ void norm_dot(float &dot, const T *dy, const T *x, const T *z, const TW *w) {
    float g[V], xv[V], u[V], zz[V];
    ldv<V>(dy, g), ldv<V>(x, xv);
    norm_u<V, ONE_P, GATED>(u, zz, w, z);
#pragma unroll
    for (int k = 0; k < V; k++) dot += g[k] * u[k] * xv[k];
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
#pragma unroll
    for (int k = 0; k < V; k++) {
        a[k] = (acc ? a[k] : 0.0f) + r * u[k] * g[k] - xv[k] * c;
        wv[k] = g[k] * xv[k] * r;
        if (GATED) wv[k] *= zz[k] * sigmoid_f(zz[k]);
    }
    stv<V>(dx, a);
    if (GATED) {
        norm_u<V, ONE_P, false>(u, zz, w, z);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = g[k] * xv[k] * r * u[k] * silu_grad_f(zz[k]);
        stv<V>(dz, a);
    }
}

// dx and dz alone, 256 threads a block, lpr lanes a row; ∂w then comes from rmsnorm_dw_kernel. The path of the
// widths rmsnorm_backward_fused_kernel does not take.
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
// of one group each hold too few loads in flight, and the two kernels are faster (bench/results/2026-12-04-s27).
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
        for (int q = 0; q < V; q++) oa[q] = a[q] * c[q] - sgn * b[q] * s[q], ob[q] = b[q] * c[q] + sgn * a[q] * s[q];
        stv<V>(v + ia, oa), stv<V>(v + ib, ob);
    }
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

extern "C" {

void cuda_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps, const RmsArgs *a) {
    int64_t R = t_rows(x), D = t_cols(x);
    Tensor z = a ? a->z : Tensor{};
    CHECK(tensor_numel(w) == D && tensor_numel(rstd) == R && tensor_numel(y) == R * D);
    CHECK(!z.p || tensor_numel(z) == R * D);
    same_dt(y, x, "rmsnorm_forward");
    IS_F32(rstd, "rmsnorm_forward");
    if (z.p) same_dt(z, x, "rmsnorm_forward");
    if (R == 0) return;
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
    bool v8 = vec8_fits(D, dx.p, dy.p, x.p, w.p) && aligned16(z.p, dz.p);
    int width = v8 ? 8 : 1, lpr = norm_lanes(D, width);
    int64_t nv = (D + (int64_t)lpr * width - 1) / ((int64_t)lpr * width); // the vectors of a lane
    bool fused = nv <= NORM_DW_VECS && width * nv <= NORM_DW_COLS;
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
