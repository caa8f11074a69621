// cuda_delta.cu — the Qwen3.5 ops on the GPU (docs/reference.md §19), math as in ops/cpu/cpu_delta.c: zero-centred
// and gated RMSNorm, the sigmoid output gate, the causal depthwise conv1d + SiLU, the DeltaNet gates and the gated
// delta rule, each with its backward. fp32 arithmetic on fp32 or bf16 storage; the delta-rule state is fp32.
// The delta rule runs as the recurrence: one block per (sequence, value head) keeps the (dk, dv) state in shared
// memory, thread j owning column j, so a step needs no synchronisation in the forward. The backward sweeps forward
// once to keep the state at the start of every block of 64 steps (global scratch), then per block recomputes its
// states and runs its steps backwards: a column phase (thread j: δ_j, dδ_j, dv_j) and a row phase (thread i: dq_i,
// dk_i, the decay gradient and the carried ∂S), separated by __syncthreads. Gradients w.r.t. the normalised q and k
// of each value head go to fp32 scratch; a last kernel sums the value heads of each key head and applies the
// normalisation's backward. Shapes: R rows of D, T = B·S tokens, C conv channels of kernel K, nk/nv heads of dk/dv.
#include "ops/cuda/cuda_common.cuh"

#define ROWS_PER_BLOCK 8 // warp-per-row kernels: 8 warps of a block take 8 rows
#define DELTA_BLOCK 64   // steps between kept states in the backward

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad(float z) {
    float s = sigm(z);
    return s * (1.0f + z * (1.0f - s));
}
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static dim3 row_grid(int64_t R) { return dim3((unsigned)((R + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK)); }
static const dim3 ROW_BLOCK(32, ROWS_PER_BLOCK);

// ---- zero-centred (GATED false) and gated (GATED true) RMSNorm ----
// 1p: y = x·r·(1 + w); gated: y = x·r·w·silu(z).

template <typename T, typename TW, bool GATED>
__global__ void norm_forward_kernel(T *y, float *rstd, const T *x, const T *z, const TW *w, int64_t R, int64_t D,
                                    float eps) {
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y;
    if (row >= R) return;
    float ss = 0;
    for (int64_t j = threadIdx.x; j < D; j += 32) ss += ld(x, row * D + j) * ld(x, row * D + j);
    float r = rsqrtf(warp_sum(ss) / (float)D + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t j = threadIdx.x; j < D; j += 32) {
        float v = ld(x, row * D + j) * r;
        if (GATED) {
            float zz = ld(z, row * D + j);
            st(y, row * D + j, v * ld(w, j) * zz * sigm(zz));
        } else {
            st(y, row * D + j, v * (1.0f + ld(w, j)));
        }
    }
}

// u_j = 1 + w_j (1p) or w_j·silu(z_j) (gated): ∂x = r·u·dy − x·r³/D·Σ(dy·u·x); gated ∂z = dy·x·r·w·silu'(z).
template <typename T, typename TW, bool GATED>
__global__ void norm_backward_kernel(T *dx, T *dz, const T *dy, const T *x, const T *z, const TW *w, const float *rstd,
                                     int64_t R, int64_t D, bool acc) {
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y;
    if (row >= R) return;
    float dot = 0, r = rstd[row];
    for (int64_t j = threadIdx.x; j < D; j += 32) {
        int64_t i = row * D + j;
        float u = GATED ? ld(w, j) * ld(z, i) * sigm(ld(z, i)) : 1.0f + ld(w, j);
        dot += ld(dy, i) * u * ld(x, i);
    }
    float c = warp_sum(dot) * r * r * r / (float)D;
    for (int64_t j = threadIdx.x; j < D; j += 32) {
        int64_t i = row * D + j;
        float zz = GATED ? ld(z, i) : 0.0f, u = GATED ? ld(w, j) * zz * sigm(zz) : 1.0f + ld(w, j);
        float g = r * u * ld(dy, i) - ld(x, i) * c;
        st(dx, i, acc ? ld(dx, i) + g : g);
        if (GATED) st(dz, i, ld(dy, i) * ld(x, i) * r * ld(w, j) * silu_grad(zz));
    }
}

// dw: (D) fp32 += Σ_rows dy·x·r (·silu(z) when gated). Block: 32 columns × 8 row lanes; grid.y splits the rows.
template <typename T, bool GATED>
__global__ void norm_dw_kernel(float *dw, const T *dy, const T *x, const T *z, const float *rstd, int64_t R,
                               int64_t D) {
    __shared__ float part[8][33];
    int64_t j = blockIdx.x * 32 + threadIdx.x;
    float s = 0;
    if (j < D)
        for (int64_t i = blockIdx.y * 8 + threadIdx.y; i < R; i += (int64_t)gridDim.y * 8) {
            float v = ld(dy, i * D + j) * ld(x, i * D + j) * rstd[i];
            if (GATED) v *= ld(z, i * D + j) * sigm(ld(z, i * D + j));
            s += v;
        }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < D) {
        for (int r = 1; r < 8; r++) s += part[r][threadIdx.x];
        atomicAdd(dw + j, s);
    }
}

// Column-sum grid for R rows of D columns: 32-column blocks, up to 128 row slices.
static dim3 colsum_grid(int64_t R, int64_t D) {
    int64_t gy = (R + 255) / 256;
    return dim3((unsigned)((D + 31) / 32), (unsigned)(gy > 128 ? 128 : gy < 1 ? 1 : gy));
}

template <bool GATED> static void norm_forward(Tensor y, Tensor rstd, Tensor x, Tensor z, Tensor w, float eps) {
    int64_t R = t_rows(x), D = t_cols(x);
    CHECK(tensor_numel(w) == D && tensor_numel(rstd) == R && tensor_numel(y) == R * D);
    same_dt(y, x, "rmsnorm1p/gated forward");
    IS_F32(rstd, "rmsnorm1p/gated forward");
    if (GATED) same_dt(z, x, "rmsnorm_gated_forward");
    if (R == 0) return;
    DT_SWITCH(x.dt, T, "rmsnorm1p/gated forward",
              DT_SWITCH(w.dt, TW, "rmsnorm1p/gated forward",
                        norm_forward_kernel<T, TW, GATED><<<row_grid(R), ROW_BLOCK, 0, cuda_stream()>>>(
                            (T *)y.p, (float *)rstd.p, (const T *)x.p, (const T *)z.p, (const TW *)w.p, R, D, eps)));
    CUDA_LAUNCH_CHECK();
}

template <bool GATED>
static void norm_backward(Tensor dx, Tensor dz, Tensor dw, Tensor dy, Tensor x, Tensor z, Tensor w, Tensor rstd,
                          bool acc) {
    int64_t R = t_rows(x), D = t_cols(x);
    same_dt(dx, x, "rmsnorm1p/gated backward");
    same_dt(dy, x, "rmsnorm1p/gated backward");
    IS_F32(dw, "rmsnorm1p/gated backward");
    if (R == 0) return;
    DT_SWITCH(x.dt, T, "rmsnorm1p/gated backward",
              DT_SWITCH(w.dt, TW, "rmsnorm1p/gated backward",
                        norm_backward_kernel<T, TW, GATED><<<row_grid(R), ROW_BLOCK, 0, cuda_stream()>>>(
                            (T *)dx.p, (T *)dz.p, (const T *)dy.p, (const T *)x.p, (const T *)z.p, (const TW *)w.p,
                            (const float *)rstd.p, R, D, acc));
              norm_dw_kernel<T, GATED><<<colsum_grid(R, D), dim3(32, 8), 0, cuda_stream()>>>(
                  (float *)dw.p, (const T *)dy.p, (const T *)x.p, (const T *)z.p, (const float *)rstd.p, R, D));
    CUDA_LAUNCH_CHECK();
}

void cuda_rmsnorm1p_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps) {
    norm_forward<false>(y, rstd, x, x, w, eps);
}
void cuda_rmsnorm1p_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate) {
    norm_backward<false>(dx, dx, dw, dy, x, x, w, rstd, accumulate);
}
void cuda_rmsnorm_gated_forward(Tensor y, Tensor rstd, Tensor x, Tensor z, Tensor w, float eps) {
    norm_forward<true>(y, rstd, x, z, w, eps);
}
void cuda_rmsnorm_gated_backward(Tensor dx, Tensor dz, Tensor dw, Tensor dy, Tensor x, Tensor z, Tensor w,
                                 Tensor rstd) {
    norm_backward<true>(dx, dz, dw, dy, x, z, w, rstd, false);
}

// ---- the sigmoid output gate: y = x·σ(gate), gate (R, D) or (R, 1) ----

template <typename T>
__global__ void gate_forward_kernel(T *y, const T *x, const T *gate, int64_t R, int64_t D, int64_t G) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < R * D; i += (int64_t)gridDim.x * blockDim.x)
        st(y, i, ld(x, i) * sigm(ld(gate, G == 1 ? i / D : i)));
}

// One warp per row: dx (+)= dy·σ; dgate = dy·x·σ(1 − σ) per element, or its row sum for a per-row gate.
template <typename T>
__global__ void gate_backward_kernel(T *dx, T *dgate, const T *dy, const T *x, const T *gate, int64_t R, int64_t D,
                                     int64_t G, bool acc) {
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y;
    if (row >= R) return;
    float s1 = G == 1 ? sigm(ld(gate, row)) : 0.0f, sum = 0;
    for (int64_t j = threadIdx.x; j < D; j += 32) {
        int64_t i = row * D + j;
        float s = G == 1 ? s1 : sigm(ld(gate, i)), d = ld(dy, i), g = d * ld(x, i) * s * (1.0f - s);
        st(dx, i, acc ? ld(dx, i) + d * s : d * s);
        if (G == 1) sum += g;
        else st(dgate, i, g);
    }
    if (G == 1) {
        sum = warp_sum(sum);
        if (threadIdx.x == 0) st(dgate, row, sum);
    }
}

void cuda_sigmoid_gate_forward(Tensor y, Tensor x, Tensor gate) {
    int64_t R = t_rows(x), D = t_cols(x), G = t_cols(gate);
    CHECK(t_rows(gate) == R && (G == D || G == 1) && tensor_numel(y) == R * D);
    same_dt(y, x, "sigmoid_gate_forward");
    same_dt(gate, x, "sigmoid_gate_forward");
    if (R == 0) return;
    DT_SWITCH(x.dt, T, "sigmoid_gate_forward",
              gate_forward_kernel<T>
              <<<grid_for(R * D, 256), 256, 0, cuda_stream()>>>((T *)y.p, (const T *)x.p, (const T *)gate.p, R, D, G));
    CUDA_LAUNCH_CHECK();
}

void cuda_sigmoid_gate_backward(Tensor dx, Tensor dgate, Tensor dy, Tensor x, Tensor gate, bool accumulate) {
    int64_t R = t_rows(x), D = t_cols(x), G = t_cols(gate);
    same_dt(dx, x, "sigmoid_gate_backward");
    same_dt(dgate, gate, "sigmoid_gate_backward");
    if (R == 0) return;
    DT_SWITCH(x.dt, T, "sigmoid_gate_backward",
              gate_backward_kernel<T><<<row_grid(R), ROW_BLOCK, 0, cuda_stream()>>>(
                  (T *)dx.p, (T *)dgate.p, (const T *)dy.p, (const T *)x.p, (const T *)gate.p, R, D, G, accumulate));
    CUDA_LAUNCH_CHECK();
}

// ---- causal depthwise conv1d + SiLU ----

// Pre-activation of row t (position p = t mod S) and channel c.
template <typename T, typename TW>
__device__ __forceinline__ float conv_pre(const T *x, const TW *w, int64_t t, int64_t p, int64_t c, int64_t C, int K) {
    float s = 0;
    for (int j = 0; j < K; j++) {
        int64_t src = p - K + 1 + j;
        if (src >= 0) s += ld(w, c * K + j) * ld(x, (t - p + src) * C + c);
    }
    return s;
}

template <typename T, typename TW>
__global__ void conv_forward_kernel(T *y, const T *x, const TW *w, int64_t T_, int64_t C, int64_t S, int K) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T_ * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / C, c = i % C;
        float u = conv_pre(x, w, t, t % S, c, C, K);
        st(y, i, u * sigm(u));
    }
}

// dx[t, c] = Σ_j w[c, j]·dpre[t + K − 1 − j, c] with dpre = dy·silu'(pre) recomputed per tap.
template <typename T, typename TW>
__global__ void conv_backward_dx_kernel(T *dx, const T *dy, const T *x, const TW *w, int64_t T_, int64_t C, int64_t S,
                                        int K) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T_ * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / C, c = i % C, p = t % S;
        float s = 0;
        for (int j = 0; j < K; j++) {
            int64_t po = p + K - 1 - j; // the output position that reads x[t] through tap j
            if (po >= S) continue;
            int64_t to = t + K - 1 - j;
            s += ld(w, c * K + j) * ld(dy, to * C + c) * silu_grad(conv_pre(x, w, to, po, c, C, K));
        }
        st(dx, i, s);
    }
}

// dw[c, j] += Σ_t dpre[t, c]·x[t − K + 1 + j, c]: thread per channel, grid.y splits the rows, taps in registers.
#define CONV_MAX_K 8
template <typename T, typename TW>
__global__ void conv_backward_dw_kernel(float *dw, const T *dy, const T *x, const TW *w, int64_t T_, int64_t C,
                                        int64_t S, int K) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc[CONV_MAX_K] = {0};
    for (int64_t t = blockIdx.y; t < T_; t += gridDim.y) {
        int64_t p = t % S;
        float d = ld(dy, t * C + c) * silu_grad(conv_pre(x, w, t, p, c, C, K));
        for (int j = 0; j < K; j++)
            if (p - K + 1 + j >= 0) acc[j] += d * ld(x, (t - K + 1 + j) * C + c);
    }
    for (int j = 0; j < K; j++) atomicAdd(dw + c * K + j, acc[j]);
}

void cuda_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, int B) {
    int64_t T_ = t_rows(x), C = t_cols(x), S = T_ / B;
    int K = (int)t_cols(w);
    CHECK(T_ % B == 0 && t_rows(w) == C && tensor_numel(y) == T_ * C);
    same_dt(y, x, "conv1d_silu_forward");
    if (T_ == 0) return;
    DT_SWITCH(x.dt, T, "conv1d_silu_forward",
              DT_SWITCH(w.dt, TW, "conv1d_silu_forward",
                        conv_forward_kernel<T, TW><<<grid_for(T_ * C, 256), 256, 0, cuda_stream()>>>(
                            (T *)y.p, (const T *)x.p, (const TW *)w.p, T_, C, S, K)));
    CUDA_LAUNCH_CHECK();
}

void cuda_conv1d_silu_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, int B) {
    int64_t T_ = t_rows(x), C = t_cols(x), S = T_ / B;
    int K = (int)t_cols(w);
    CHECK(K <= CONV_MAX_K);
    same_dt(dx, x, "conv1d_silu_backward");
    same_dt(dy, x, "conv1d_silu_backward");
    IS_F32(dw, "conv1d_silu_backward");
    if (T_ == 0) return;
    int64_t gy = T_ / 64;
    dim3 gdw((unsigned)((C + 127) / 128), (unsigned)(gy > 256 ? 256 : gy < 1 ? 1 : gy));
    DT_SWITCH(x.dt, T, "conv1d_silu_backward",
              DT_SWITCH(w.dt, TW, "conv1d_silu_backward",
                        conv_backward_dx_kernel<T, TW><<<grid_for(T_ * C, 256), 256, 0, cuda_stream()>>>(
                            (T *)dx.p, (const T *)dy.p, (const T *)x.p, (const TW *)w.p, T_, C, S, K);
                        conv_backward_dw_kernel<T, TW><<<gdw, 128, 0, cuda_stream()>>>(
                            (float *)dw.p, (const T *)dy.p, (const T *)x.p, (const TW *)w.p, T_, C, S, K)));
    CUDA_LAUNCH_CHECK();
}

// ---- the DeltaNet gates ----

template <typename T, typename TW>
__global__ void gates_forward_kernel(float *g, float *beta, const T *a, const T *b, const TW *A_log, const TW *dt_bias,
                                     int64_t n, int64_t nv) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t h = i % nv;
        g[i] = -expf(ld(A_log, h)) * softplus_f(ld(a, i) + ld(dt_bias, h));
        beta[i] = sigm(ld(b, i));
    }
}

// da, db per element; dA_log[h] += Σ_t dg·g, ddt_bias[h] += Σ_t da (thread per head, grid.y splits the rows).
template <typename T, typename TW>
__global__ void gates_backward_kernel(T *da, T *db, float *dA_log, float *ddt_bias, const float *dg, const float *dbeta,
                                      const T *a, const T *b, const TW *A_log, const TW *dt_bias, int64_t Tn,
                                      int64_t nv) {
    int64_t h = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (h >= nv) return;
    float eA = expf(ld(A_log, h)), sA = 0, sdt = 0;
    for (int64_t t = blockIdx.y; t < Tn; t += gridDim.y) {
        int64_t i = t * nv + h;
        float x = ld(a, i) + ld(dt_bias, h), d = dg[i], s = sigm(ld(b, i)), ga = -eA * sigm(x) * d;
        sA += -d * eA * softplus_f(x);
        sdt += ga;
        st(da, i, ga);
        st(db, i, dbeta[i] * s * (1.0f - s));
    }
    atomicAdd(dA_log + h, sA);
    atomicAdd(ddt_bias + h, sdt);
}

void cuda_delta_gates_forward(Tensor g, Tensor beta, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias) {
    int64_t n = tensor_numel(a), nv = t_cols(a);
    IS_F32(g, "delta_gates_forward");
    IS_F32(beta, "delta_gates_forward");
    same_dt(a, b, "delta_gates_forward");
    CHECK(tensor_numel(A_log) == nv && tensor_numel(dt_bias) == nv && tensor_numel(g) == n);
    if (n == 0) return;
    DT_SWITCH(a.dt, T, "delta_gates_forward",
              DT_SWITCH(A_log.dt, TW, "delta_gates_forward",
                        gates_forward_kernel<T, TW><<<grid_for(n, 256), 256, 0, cuda_stream()>>>(
                            (float *)g.p, (float *)beta.p, (const T *)a.p, (const T *)b.p, (const TW *)A_log.p,
                            (const TW *)dt_bias.p, n, nv)));
    CUDA_LAUNCH_CHECK();
}

void cuda_delta_gates_backward(Tensor da, Tensor db, Tensor dA_log, Tensor ddt_bias, Tensor dg, Tensor dbeta, Tensor a,
                               Tensor b, Tensor A_log, Tensor dt_bias) {
    int64_t Tn = t_rows(a), nv = t_cols(a);
    IS_F32(dA_log, "delta_gates_backward");
    IS_F32(ddt_bias, "delta_gates_backward");
    same_dt(da, a, "delta_gates_backward");
    same_dt(db, a, "delta_gates_backward");
    if (Tn == 0) return;
    int64_t gy = Tn / 32;
    dim3 grid((unsigned)((nv + 31) / 32), (unsigned)(gy > 512 ? 512 : gy < 1 ? 1 : gy));
    DT_SWITCH(a.dt, T, "delta_gates_backward",
              DT_SWITCH(A_log.dt, TW, "delta_gates_backward",
                        gates_backward_kernel<T, TW><<<grid, 32, 0, cuda_stream()>>>(
                            (T *)da.p, (T *)db.p, (float *)dA_log.p, (float *)ddt_bias.p, (const float *)dg.p,
                            (const float *)dbeta.p, (const T *)a.p, (const T *)b.p, (const TW *)A_log.p,
                            (const TW *)dt_bias.p, Tn, nv)));
    CUDA_LAUNCH_CHECK();
}

// ---- the gated delta rule ----

// One warp per (token, key head): qh = scale·q·rq, kh = k·rk (fp32), rq, rk = (Σ x² + 1e-6)^-½ (1 without l2).
template <typename T>
__global__ void delta_prep_kernel(float *qh, float *kh, float *rq, float *rk, const T *q, const T *k, int64_t rows,
                                  int dk, float scale, bool l2) {
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y;
    if (row >= rows) return;
    float sq = 0, sk = 0;
    for (int i = threadIdx.x; i < dk; i += 32) {
        float a = ld(q, row * dk + i), b = ld(k, row * dk + i);
        sq += a * a, sk += b * b;
    }
    sq = warp_sum(sq), sk = warp_sum(sk);
    float r1 = l2 ? rsqrtf(sq + 1e-6f) : 1.0f, r2 = l2 ? rsqrtf(sk + 1e-6f) : 1.0f;
    if (threadIdx.x == 0) rq[row] = r1, rk[row] = r2;
    for (int i = threadIdx.x; i < dk; i += 32)
        qh[row * dk + i] = ld(q, row * dk + i) * r1 * scale, kh[row * dk + i] = ld(k, row * dk + i) * r2;
}

// Block per (sequence b, value head h), thread j < dv owns column j of the state St (dk × dv, fp32, shared).
// One step: St ← e^g St; δ = β (v − Stᵀ k); St += k δᵀ; o = Stᵀ q.
template <typename T>
__global__ void delta_forward_kernel(T *o, const float *qh, const float *kh, const T *v, const float *g,
                                     const float *beta, int64_t S, int nk, int nv, int dk, int dv) {
    extern __shared__ float St[]; // (dk, dv)
    int64_t b = blockIdx.x / nv;
    int h = blockIdx.x % nv, hk = h / (nv / nk), j = threadIdx.x;
    if (j >= dv) return;
    for (int i = 0; i < dk; i++) St[i * dv + j] = 0;
    for (int64_t p = 0; p < S; p++) {
        int64_t t = b * S + p;
        const float *q = qh + (t * nk + hk) * dk, *k = kh + (t * nk + hk) * dk;
        float e = expf(g[t * nv + h]), bt = beta[t * nv + h], m = 0, s = 0;
        for (int i = 0; i < dk; i++) m += St[i * dv + j] * k[i];
        float d = bt * (ld(v, (t * nv + h) * dv + j) - e * m);
        for (int i = 0; i < dk; i++) {
            float x = e * St[i * dv + j] + k[i] * d;
            St[i * dv + j] = x;
            s += x * q[i];
        }
        st(o, (t * nv + h) * dv + j, s);
    }
}

// Backward per (b, h). ckpt: (S/64 + 1, dk, dv) states at block starts; Sb: (64, dk, dv) the states before each
// step of the current block; gq, gk: (T, nv, dk) fp32 ∂/∂ of the normalised q and k per value head.
// Shared: dS (dk, dv + 1) (padded: the row phase walks rows), δ and e = −β dδ (dv each), 32 for block sums.
template <typename T>
__global__ void delta_backward_kernel(T *dv_, float *dg, float *dbeta, float *gq, float *gk, float *ckpt, float *Sb,
                                      const T *dout, const float *qh, const float *kh, const T *v, const float *g,
                                      const float *beta, int64_t S, int nk, int nv, int dk, int dv) {
    extern __shared__ float sm[];
    int ld_ = dv + 1;
    float *dS = sm, *dl = dS + dk * ld_, *ev = dl + dv, *red = ev + dv;
    int64_t b = blockIdx.x / nv, nblk = (S + DELTA_BLOCK - 1) / DELTA_BLOCK, dkv = (int64_t)dk * dv;
    int h = blockIdx.x % nv, hk = h / (nv / nk), tid = threadIdx.x;
    ckpt += blockIdx.x * (nblk + 1) * dkv, Sb += blockIdx.x * DELTA_BLOCK * dkv;
    // Forward sweep: the state at the start of every block (column ownership: no synchronisation).
    if (tid < dv) {
        for (int i = 0; i < dk; i++) ckpt[i * dv + tid] = 0;
        for (int64_t blk = 0; blk + 1 < nblk; blk++) {
            float *cur = ckpt + blk * dkv, *nxt = cur + dkv;
            for (int i = 0; i < dk; i++) nxt[i * dv + tid] = cur[i * dv + tid];
            for (int64_t p = blk * DELTA_BLOCK; p < (blk + 1) * DELTA_BLOCK; p++) {
                int64_t t = b * S + p;
                const float *k = kh + (t * nk + hk) * dk;
                float e = expf(g[t * nv + h]), m = 0;
                for (int i = 0; i < dk; i++) m += nxt[i * dv + tid] * k[i];
                float d = beta[t * nv + h] * (ld(v, (t * nv + h) * dv + tid) - e * m);
                for (int i = 0; i < dk; i++) nxt[i * dv + tid] = e * nxt[i * dv + tid] + k[i] * d;
            }
        }
    }
    for (int64_t x = tid; x < dk * ld_; x += blockDim.x) dS[x] = 0;
    __syncthreads();
    for (int64_t blk = nblk - 1; blk >= 0; blk--) {
        int64_t p0 = blk * DELTA_BLOCK, L = S - p0 < DELTA_BLOCK ? S - p0 : DELTA_BLOCK;
        if (tid < dv) { // Sb[i] = the state before step p0 + i
            for (int i = 0; i < dk; i++) Sb[i * dv + tid] = ckpt[blk * dkv + i * dv + tid];
            for (int64_t s = 0; s + 1 < L; s++) {
                int64_t t = b * S + p0 + s;
                const float *k = kh + (t * nk + hk) * dk, *cur = Sb + s * dkv;
                float *nxt = Sb + (s + 1) * dkv, e = expf(g[t * nv + h]), m = 0;
                for (int i = 0; i < dk; i++) m += cur[i * dv + tid] * k[i];
                float d = beta[t * nv + h] * (ld(v, (t * nv + h) * dv + tid) - e * m);
                for (int i = 0; i < dk; i++) nxt[i * dv + tid] = e * cur[i * dv + tid] + k[i] * d;
            }
        }
        __syncthreads();
        for (int64_t s = L - 1; s >= 0; s--) {
            int64_t t = b * S + p0 + s;
            const float *k = kh + (t * nk + hk) * dk, *q = qh + (t * nk + hk) * dk, *Sp = Sb + s * dkv;
            float e = expf(g[t * nv + h]), bt = beta[t * nv + h], dbs = 0;
            // column phase: δ_j, dSt += q doᵀ, dδ_j = dStᵀk, dv_j, dβ, e_j
            if (tid < dv) {
                int j = tid;
                float m = 0, vj = ld(v, (t * nv + h) * dv + j), doj = ld(dout, (t * nv + h) * dv + j), dd = 0;
                for (int i = 0; i < dk; i++) m += e * Sp[i * dv + j] * k[i];
                for (int i = 0; i < dk; i++) {
                    float x = dS[i * ld_ + j] + q[i] * doj;
                    dS[i * ld_ + j] = x;
                    dd += x * k[i];
                }
                dl[j] = bt * (vj - m);
                st(dv_, (t * nv + h) * dv + j, bt * dd);
                dbs = dd * (vj - m);
                ev[j] = -bt * dd;
            }
            dbs = block_sum(dbs, red);
            if (tid == 0) dbeta[t * nv + h] = dbs;
            // row phase: dq_i = (S_t do)_i, dk_i = (dSt δ + P e)_i, dg = ⟨P, dP⟩, dS ← e^g dP
            float dgs = 0;
            if (tid < dk) {
                int i = tid;
                float sq = 0, sk = 0, ki = k[i];
                for (int j = 0; j < dv; j++) {
                    float P = e * Sp[i * dv + j], Sn = P + ki * dl[j], dsij = dS[i * ld_ + j];
                    sq += Sn * ld(dout, (t * nv + h) * dv + j);
                    sk += dsij * dl[j] + P * ev[j];
                    float dP = dsij + ki * ev[j];
                    dgs += P * dP;
                    dS[i * ld_ + j] = e * dP;
                }
                gq[(t * nv + h) * dk + i] = sq;
                gk[(t * nv + h) * dk + i] = sk;
            }
            dgs = block_sum(dgs, red);
            if (tid == 0) dg[t * nv + h] = dgs;
            __syncthreads();
        }
    }
}

// One warp per (token, key head): sums the value heads' gradients w.r.t. the normalised vector and applies the
// normalisation's backward: ∂x = c·(r·γ − x·r³·(x·γ)) (c·γ without l2).
template <typename T>
__global__ void delta_finish_kernel(T *dx, const float *gx, const T *x, const float *rx, int64_t rows, int nk, int G,
                                    int dk, float c, bool l2) {
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y; // t·nk + hk
    if (row >= rows) return;
    int64_t t = row / nk;
    int hk = (int)(row % nk);
    float dot = 0, r = rx[row];
    for (int i = threadIdx.x; i < dk; i += 32) {
        float s = 0;
        for (int u = 0; u < G; u++) s += gx[(t * nk * G + hk * G + u) * dk + i];
        dot += s * ld(x, row * dk + i);
    }
    dot = warp_sum(dot);
    for (int i = threadIdx.x; i < dk; i += 32) {
        float s = 0;
        for (int u = 0; u < G; u++) s += gx[(t * nk * G + hk * G + u) * dk + i];
        st(dx, row * dk + i, l2 ? c * (r * s - ld(x, row * dk + i) * r * r * r * dot) : c * s);
    }
}

typedef struct {
    int64_t B, S, T, nk, nv, dk, dv;
} DeltaShape;

static DeltaShape delta_shape(Tensor q, Tensor v, const DeltaArgs *a) {
    DeltaShape d = {a->B, q.n[0] / a->B, q.n[0], q.n[1], v.n[1], q.n[2], v.n[2]};
    CHECK(q.n[0] % a->B == 0 && v.n[0] == q.n[0] && d.nv % d.nk == 0 && d.dv <= 1024 && d.dk <= 1024);
    return d;
}

// The normalised q and k (fp32) and their norms' inverses at the front of the scratch.
static void delta_prep(float *qh, float *kh, float *rq, float *rk, Tensor q, Tensor k, const DeltaShape *d,
                       const DeltaArgs *a) {
    int64_t rows = d->T * d->nk;
    DT_SWITCH(q.dt, T, "delta_rule",
              delta_prep_kernel<T><<<row_grid(rows), ROW_BLOCK, 0, cuda_stream()>>>(
                  qh, kh, rq, rk, (const T *)q.p, (const T *)k.p, rows, (int)d->dk, a->scale, a->qk_l2norm));
    CUDA_LAUNCH_CHECK();
}

static unsigned round32(int64_t n) { return (unsigned)((n + 31) / 32 * 32); }

void cuda_delta_rule_forward(Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DeltaShape d = delta_shape(q, v, a);
    same_dt(k, q, "delta_rule_forward"), same_dt(v, q, "delta_rule_forward"), same_dt(o, q, "delta_rule_forward");
    IS_F32(g, "delta_rule_forward");
    IS_F32(beta, "delta_rule_forward");
    if (d.T == 0) return;
    int64_t nq = d.T * d.nk * d.dk;
    float *qh = (float *)cuda_scratch((2 * nq + 2 * d.T * d.nk) * sizeof(float)), *kh = qh + nq, *rq = kh + nq,
          *rk = rq + d.T * d.nk;
    delta_prep(qh, kh, rq, rk, q, k, &d, a);
    size_t smem = (size_t)d.dk * d.dv * sizeof(float);
    DT_SWITCH(q.dt, T, "delta_rule_forward", {
        CUDA_CHECK(
            cudaFuncSetAttribute(delta_forward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        delta_forward_kernel<T><<<(unsigned)(d.B * d.nv), round32(d.dv), smem, cuda_stream()>>>(
            (T *)o.p, qh, kh, (const T *)v.p, (const float *)g.p, (const float *)beta.p, d.S, (int)d.nk, (int)d.nv,
            (int)d.dk, (int)d.dv);
    });
    CUDA_LAUNCH_CHECK();
}

void cuda_delta_rule_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k,
                              Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DeltaShape d = delta_shape(q, v, a);
    same_dt(dq, q, "delta_rule_backward"), same_dt(dk, q, "delta_rule_backward");
    same_dt(dv, v, "delta_rule_backward"), same_dt(dout, v, "delta_rule_backward");
    IS_F32(dg, "delta_rule_backward");
    IS_F32(dbeta, "delta_rule_backward");
    if (d.T == 0) return;
    int64_t nq = d.T * d.nk * d.dk, ng = d.T * d.nv * d.dk, nb = d.B * d.nv, dkv = d.dk * d.dv,
            nblk = (d.S + DELTA_BLOCK - 1) / DELTA_BLOCK;
    size_t floats = 2 * nq + 2 * d.T * d.nk + 2 * ng + nb * (nblk + 1) * dkv + nb * DELTA_BLOCK * dkv;
    float *qh = (float *)cuda_scratch(floats * sizeof(float)), *kh = qh + nq, *rq = kh + nq, *rk = rq + d.T * d.nk,
          *gq = rk + d.T * d.nk, *gk = gq + ng, *ckpt = gk + ng, *Sb = ckpt + nb * (nblk + 1) * dkv;
    delta_prep(qh, kh, rq, rk, q, k, &d, a);
    size_t smem = ((size_t)d.dk * (d.dv + 1) + 2 * d.dv + 32) * sizeof(float);
    unsigned threads = round32(d.dk > d.dv ? d.dk : d.dv);
    int64_t rows = d.T * d.nk;
    DT_SWITCH(q.dt, T, "delta_rule_backward", {
        CUDA_CHECK(
            cudaFuncSetAttribute(delta_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        delta_backward_kernel<T><<<(unsigned)nb, threads, smem, cuda_stream()>>>(
            (T *)dv.p, (float *)dg.p, (float *)dbeta.p, gq, gk, ckpt, Sb, (const T *)dout.p, qh, kh, (const T *)v.p,
            (const float *)g.p, (const float *)beta.p, d.S, (int)d.nk, (int)d.nv, (int)d.dk, (int)d.dv);
        CUDA_LAUNCH_CHECK();
        delta_finish_kernel<T><<<row_grid(rows), ROW_BLOCK, 0, cuda_stream()>>>(
            (T *)dq.p, gq, (const T *)q.p, rq, rows, (int)d.nk, (int)(d.nv / d.nk), (int)d.dk, a->scale, a->qk_l2norm);
        delta_finish_kernel<T><<<row_grid(rows), ROW_BLOCK, 0, cuda_stream()>>>(
            (T *)dk.p, gk, (const T *)k.p, rk, rows, (int)d.nk, (int)(d.nv / d.nk), (int)d.dk, 1.0f, a->qk_l2norm);
    });
    CUDA_LAUNCH_CHECK();
}
