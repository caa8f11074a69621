// cuda_norm.cu — RMSNorm (plain, 1 + w, gated), RoPE and SwiGLU (plain, clamped): memory-bound kernels, fp32
// arithmetic on fp32 or bf16 storage. Math as in ops/cpu/cpu_norm.c and ops_list.h; RMSNorm's forms are the
// kernels' flags ONE_P (u = 1 + w) and GATED (u times silu(z)), SwiGLU's clamped form CLAMP.
// Shapes: x, y, dy, dx, z, dz: (R, D); w: (D); rstd: (R) fp32; RoPE x: (T, heads, d), cos/sin (P, d/2) fp32,
// pos (T) int32; SwiGLU gu: (M, 2I) = [gate | up] (interleaved [g_0, u_0, …] when clamped), act: (M, I).
// Each kernel moves V values at a time (cuda_common.cuh): RMSNorm gives a row lpr lanes of one warp (32, or with
// V = 8 the largest power of two ≤ min(32, D/8)), RoPE and SwiGLU one thread per V pairs or outputs.
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

template <typename T, typename TW, bool ONE_P, bool GATED, int V>
__global__ void rmsnorm_backward_kernel(T *dx, T *dz, const T *dy, const T *x, const T *z, const TW *w,
                                        const float *rstd, int64_t R, int64_t D, int lpr, bool acc) {
    int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / lpr, o = row * D;
    int sub = threadIdx.x % lpr;
    bool ok = row < R;
    float dot = 0, g[V], xv[V], u[V], zz[V], a[V];
    if (ok)
        for (int64_t j = sub * V; j < D; j += lpr * V) {
            ldv<V>(dy + o + j, g), ldv<V>(x + o + j, xv);
            norm_u<V, ONE_P, GATED>(u, zz, w + j, z + o + j);
#pragma unroll
            for (int k = 0; k < V; k++) dot += g[k] * u[k] * xv[k];
        }
    dot = group_sum(dot, lpr);
    if (!ok) return;
    float r = rstd[row], c = dot * r * r * r / (float)D;
    for (int64_t j = sub * V; j < D; j += lpr * V) {
        ldv<V>(dy + o + j, g), ldv<V>(x + o + j, xv);
        norm_u<V, ONE_P, GATED>(u, zz, w + j, z + o + j);
        if (acc) ldv<V>(dx + o + j, a);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = (acc ? a[k] : 0.0f) + r * u[k] * g[k] - xv[k] * c;
        stv<V>(dx + o + j, a);
        if (GATED) {
            norm_u<V, ONE_P, false>(u, zz, w + j, z);
#pragma unroll
            for (int k = 0; k < V; k++) a[k] = g[k] * xv[k] * r * u[k] * silu_grad_f(zz[k]);
            stv<V>(dz + o + j, a);
        }
    }
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
    int G = colsum_groups(R, D);
    float *part = colsum_part(D, G, "rmsnorm_backward");
    bool v8 = vec8_fits(D, dx.p, dy.p, x.p, w.p) && aligned16(z.p, dz.p);
    int lpr = norm_lanes(D, v8 ? 8 : 1);
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
