// cuda_delta_conv.cu — the Qwen3.5 ops around the delta rule on the GPU (docs/reference.md §19), math as in
// ops/cpu/cpu_delta.c: the sigmoid output gate, the causal depthwise conv1d + SiLU and the DeltaNet gates, each with
// its backward. fp32 arithmetic on fp32 or bf16 storage.
// Shapes: R rows of D, T = B·S tokens, C conv channels of kernel K, nv value heads.
#include "ops/cuda/cuda_common.cuh"

static __device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// ---- the sigmoid output gate: y = x·σ(gate), gate (R, D) or (R, 1) ----

template <typename T>
__global__ void gate_forward_kernel(T *y, const T *x, const T *gate, int64_t R, int64_t D, int64_t G) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < R * D; i += (int64_t)gridDim.x * blockDim.x)
        st(y, i, ld(x, i) * sigmoid_f(ld(gate, G == 1 ? i / D : i)));
}

// One warp per row: dx (+)= dy·σ; dgate = dy·x·σ(1 − σ) per element, or its row sum for a per-row gate.
template <typename T>
__global__ void gate_backward_kernel(T *dx, T *dgate, const T *dy, const T *x, const T *gate, int64_t R, int64_t D,
                                     int64_t G, bool acc) {
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y;
    if (row >= R) return;
    float s1 = G == 1 ? sigmoid_f(ld(gate, row)) : 0.0f, sum = 0;
    for (int64_t j = threadIdx.x; j < D; j += 32) {
        int64_t i = row * D + j;
        float s = G == 1 ? s1 : sigmoid_f(ld(gate, i)), d = ld(dy, i), g = d * ld(x, i) * s * (1.0f - s);
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
// A thread takes V adjacent channels (2 where C and the pointers allow one 4- or 8-byte access a row, else 1) over
// runs of CONV_RUN / V positions of one sequence (shorter for pairs: two channels' windows share the registers), the
// inputs it slides over in registers: each x and dy is read once per run (plus a halo of KT − 1), where the
// per-element kernels read each K to K² times; a warp's accesses to a row cover 32·V adjacent channels. The K taps sit
// right-aligned in KT (4 or CONV_MAX_K, the smallest that holds K; zeros before them), so every register index is a
// constant: u[p] = Σ_j w'[j]·x[p − KT + 1 + j], the zero taps adding exact zeros in the CPU's order.
// The backward's weight gradient, in a fixed order: a block is CONV_TY run lanes (threadIdx.y) × 32 threads of
// channels and grid.y holds G run groups (colsum_groups, from the shape alone); the runs are dealt to the G·CONV_TY
// lanes in turn, each thread summing its own in order; a block adds its lanes' sums in lane order into
// part[g·C·K + c·K + j] (the small pool), and colsum_finish adds Σ_g part[g·C·K + ·], g = 0, 1, … in order, to dw.
// The halo (context parallelism: the K − 1 rows before each sequence, (B·(K−1), C); NULL: zeros) stands in for the
// positions −(K − 1) .. −1; its gradient is the first run's dx formula at those positions.
// Document masking (pos, NULL: none): tap j (KT − 1 − j rows back) of output p counts while its distance is at
// most pos[p]; each output's limit sits in a register beside its dpre, and every sum term tests it. The kernels take
// DOCS as a template flag, so without masking the limits are constants and the tests fold away.
#define CONV_RUN 24
#define CONV_MAX_K 8
#define CONV_THREADS 128 // the forward's block
#define CONV_TY 8        // the backward's block: CONV_TY run lanes × 32 threads, two blocks an SM (≤ 128 registers)
#define CONV_GROUPS 8    // the backward's run groups (grid.y) at most
// Runs BODY with V the channels a thread takes (pairs: 2, else 1).
#define PAIR_SWITCH(pairs, ...)                                                                                        \
    BOOL_SWITCH(pairs, PAIRS, {                                                                                        \
        constexpr int V = PAIRS ? 2 : 1;                                                                               \
        __VA_ARGS__;                                                                                                   \
    })
// Runs BODY with KT the taps the kernels hold for a kernel of K (Qwen3.5's 4 in 4: half the registers and products).
#define KT_SWITCH(K, ...)                                                                                              \
    BOOL_SWITCH((K) <= 4, KT_IS_4, {                                                                                   \
        constexpr int KT = KT_IS_4 ? 4 : CONV_MAX_K;                                                                   \
        __VA_ARGS__;                                                                                                   \
    })

// A call's shape: B sequences of S, C channels, kernel K.
typedef struct {
    int64_t C, S, B;
    int K;
} ConvShape;

// V adjacent values as fp32, and back (V = 2: one bf16x2 or float2 access, p aligned to it).
template <int V, typename T> __device__ __forceinline__ void conv_ld(const T *p, float (&v)[V]) {
    if constexpr (V == 2 && sizeof(T) == 2) {
        float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)p);
        v[0] = f.x, v[1] = f.y;
    } else if constexpr (V == 2) {
        float2 f = *(const float2 *)p;
        v[0] = f.x, v[1] = f.y;
    } else {
        v[0] = ld(p, 0);
    }
}
template <int V, typename T> __device__ __forceinline__ void conv_st(T *p, const float (&v)[V]) {
    if constexpr (V == 2 && sizeof(T) == 2) *(__nv_bfloat162 *)p = __floats2bfloat162_rn(v[0], v[1]);
    else if constexpr (V == 2) *(float2 *)p = make_float2(v[0], v[1]);
    else st(p, 0, v[0]);
}

// wk[v][·]: channel c + v's taps, right-aligned.
template <int KT, int V, typename TW>
__device__ __forceinline__ void conv_taps(float (&wk)[V][KT], const TW *w, int64_t c, int K) {
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int j = 0; j < KT; j++) wk[v][j] = j >= KT - K ? ld(w, (c + v) * K + j - (KT - K)) : 0.0f;
}

// xw[i] = x[q0 + i] of V adjacent channels (xs: their columns in the sequence; hs: their columns in the sequence's
// K − 1 halo rows, or NULL; elsewhere 0).
template <int N, int V, typename T>
__device__ __forceinline__ void conv_window(float (&xw)[N][V], const T *xs, const T *hs, int K, int64_t q0, int64_t S,
                                            int64_t C) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        int64_t q = q0 + i;
        const T *src = q >= 0 ? (q < S ? xs + q * C : NULL) : hs && q >= 1 - K ? hs + (K - 1 + q) * C : NULL;
        if (src) conv_ld<V>(src, xw[i]);
        else
#pragma unroll
            for (int v = 0; v < V; v++) xw[i][v] = 0.0f;
    }
}
// The pre-activation of channel v at window offset i: Σ_j w'[j]·xw[i + j] over the taps within lim rows back.
template <int KT, int N, int V>
__device__ __forceinline__ float conv_u(const float (&wk)[V][KT], const float (&xw)[N][V], int v, int i, int lim) {
    float u = 0;
#pragma unroll
    for (int j = 0; j < KT; j++)
        if (KT - 1 - j <= lim) u += wk[v][j] * xw[i + j][v];
    return u;
}
#define CONV_ALL (1 << 30) // the limit without document masking
// lp[i] = pos[q0 + i] of one sequence (ps), or CONV_ALL without masking or past the sequence.
template <bool DOCS, int N>
__device__ __forceinline__ void conv_limits(int (&lp)[N], const int *ps, int64_t q0, int64_t S) {
#pragma unroll
    for (int i = 0; i < N; i++) lp[i] = DOCS && q0 + i < S ? ps[q0 + i] : CONV_ALL;
}

// y[p] = silu(u[p]) for the run's positions p0 .. p0 + CONV_RUN/V − 1 (x before the sequence: 0).
template <int KT, int V, typename T, typename TW, bool DOCS>
__global__ void conv_forward_kernel(T *y, const T *x, const TW *w, const T *halo, const int *pos, ConvShape sh) {
    constexpr int RUN = CONV_RUN / V, NX = RUN + KT - 1; // x[p0 − KT + 1 .. p0 + RUN − 1]
    int64_t C = sh.C, S = sh.S, per_seq = (S + RUN - 1) / RUN, runs = sh.B * per_seq;
    int K = sh.K;
    int64_t c = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V;
    if (c >= C) return;
    float wk[V][KT], xw[NX][V];
    int lp[RUN];
    conv_taps(wk, w, c, K);
    for (int64_t r = blockIdx.y; r < runs; r += gridDim.y) {
        int64_t b = r / per_seq, p0 = r % per_seq * RUN, q0 = p0 - KT + 1;
        conv_window(xw, x + b * S * C + c, halo ? halo + b * (K - 1) * C + c : NULL, K, q0, S, C);
        conv_limits<DOCS>(lp, pos + b * S, p0, S);
#pragma unroll
        for (int i = 0; i < RUN; i++) {
            float o[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                float u = conv_u(wk, xw, v, i, lp[i]);
                o[v] = u * sigmoid_f(u);
            }
            if (p0 + i < S) conv_st<V>(y + b * S * C + c + (p0 + i) * C, o);
        }
    }
}

// dpre[p] = dy[p]·silu'(u[p]) over p0 .. p0 + RUN + KT − 2 (past the sequence: 0);
// dx[p] = Σ_j w'[j]·dpre[p + KT − 1 − j]; dw[c, j] gets Σ_p dpre[p]·x[p − K + 1 + j] over the run's own p (through
// part, above); each term only where tap j counts for its output (lp).
template <int KT, int V, typename T, typename TW, bool DOCS>
__global__ void __launch_bounds__(32 * CONV_TY, 2)
    conv_backward_kernel(T *dx, T *dhalo, float *part, const T *dy, const T *x, const TW *w, const T *halo,
                         const int *pos, ConvShape sh) {
    constexpr int RUN = CONV_RUN / V, ND = RUN + KT - 1, NX = ND + KT - 1; // x from p0 − KT + 1
    __shared__ float lanes[CONV_TY][32][V * KT];                           // each run lane's weight-gradient sums
    int64_t C = sh.C, S = sh.S, per_seq = (S + RUN - 1) / RUN, runs = sh.B * per_seq;
    int K = sh.K;
    int64_t c = (blockIdx.x * (int64_t)32 + threadIdx.x) * V;
    bool on = c < C; // threads past C join the block's sum but take no runs
    float wk[V][KT], dwk[V][KT], xw[NX][V], dp[ND][V];
    int lp[ND];
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int j = 0; j < KT; j++) wk[v][j] = dwk[v][j] = 0.0f;
    if (on) conv_taps(wk, w, c, K);
    int64_t lane = blockIdx.y * CONV_TY + threadIdx.y, nlanes = (int64_t)gridDim.y * CONV_TY;
    for (int64_t r = on ? lane : runs; r < runs; r += nlanes) {
        int64_t b = r / per_seq, p0 = r % per_seq * RUN, q0 = p0 - KT + 1;
        const T *dys = dy + b * S * C + c;
        conv_window(xw, x + b * S * C + c, halo ? halo + b * (K - 1) * C + c : NULL, K, q0, S, C);
        conv_limits<DOCS>(lp, pos + b * S, p0, S);
#pragma unroll
        for (int i = 0; i < ND; i++) {
            float d[V] = {};
            if (p0 + i < S) conv_ld<V>(dys + (p0 + i) * C, d);
#pragma unroll
            for (int v = 0; v < V; v++) dp[i][v] = p0 + i < S ? d[v] * silu_grad_f(conv_u(wk, xw, v, i, lp[i])) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < RUN; i++) {
            if (p0 + i >= S) break;
            float s[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                s[v] = 0;
#pragma unroll
                for (int j = 0; j < KT; j++)
                    if (KT - 1 - j <= lp[i + KT - 1 - j]) s[v] += wk[v][j] * dp[i + KT - 1 - j][v];
#pragma unroll
                for (int j = 0; j < KT; j++)
                    if (KT - 1 - j <= lp[i]) dwk[v][j] += dp[i][v] * xw[i + j][v];
            }
            conv_st<V>(dx + b * S * C + c + (p0 + i) * C, s);
        }
        if (dhalo && p0 == 0) { // halo row K − 1 − h is position −h: Σ_j w'[j]·dpre[KT − 1 − h − j]
#pragma unroll
            for (int h = 1; h < KT; h++) {
                float s[V];
#pragma unroll
                for (int v = 0; v < V; v++) {
                    s[v] = 0;
#pragma unroll
                    for (int j = 0; j < KT; j++)
                        if (KT - 1 - h - j >= 0 && KT - 1 - j <= lp[KT - 1 - h - j])
                            s[v] += wk[v][j] * dp[KT - 1 - h - j][v];
                }
                if (h <= K - 1) conv_st<V>(dhalo + b * (K - 1) * C + c + (K - 1 - h) * C, s);
            }
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int j = 0; j < KT; j++) lanes[threadIdx.y][threadIdx.x][v * KT + j] = dwk[v][j];
    __syncthreads();
    if (threadIdx.y == 0 && on)
#pragma unroll
        for (int v = 0; v < V; v++)
#pragma unroll
            for (int j = 0; j < KT; j++)
                if (j >= KT - K) {
                    float s = 0;
                    for (int l = 0; l < CONV_TY; l++) s += lanes[l][threadIdx.x][v * KT + j];
                    part[blockIdx.y * C * K + (c + v) * K + j - (KT - K)] = s;
                }
}

// The shape of x: (B·S, C) with w: (C, K), checked with the halo's and pos's.
static ConvShape conv_shape(Tensor x, Tensor w, Tensor halo, Tensor pos, int64_t B, const char *what) {
    ConvShape s;
    int64_t T_ = t_rows(x);
    s.C = t_cols(x), s.S = T_ / B, s.B = B, s.K = (int)t_cols(w);
    CHECK(T_ % B == 0 && t_rows(w) == s.C);
    if (s.K > CONV_MAX_K) die("%s: kernel %d is past the GPU kernels' %d", what, s.K, CONV_MAX_K);
    if (halo.p) {
        CHECK(t_rows(halo) == B * (s.K - 1) && t_cols(halo) == s.C);
        same_dt(halo, x, what);
    }
    if (pos.p) CHECK(pos.dev == DEV_CUDA && pos.dt == DT_I32 && tensor_numel(pos) == T_);
    return s;
}
// Two channels a thread: C even and every pointer aligned to two elements of dtype dt.
static bool conv_pairs(ConvShape s, DType dt, const void *a, const void *b, const void *c, const void *d,
                       const void *e) {
    uintptr_t m = 2 * dtype_size(dt) - 1;
    return s.C % 2 == 0 && !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e) & m);
}
// The runs of V channels a thread: B·⌈S / (CONV_RUN / V)⌉.
static int64_t conv_runs(ConvShape s, int V) { return s.B * ((s.S + CONV_RUN / V - 1) / (CONV_RUN / V)); }

void cuda_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, Tensor halo, Tensor pos, int B) {
    ConvShape s = conv_shape(x, w, halo, pos, B, "conv1d_silu_forward");
    CHECK(tensor_numel(y) == tensor_numel(x));
    same_dt(y, x, "conv1d_silu_forward");
    if (t_rows(x) == 0) return;
    PAIR_SWITCH(conv_pairs(s, x.dt, y.p, x.p, halo.p, NULL, NULL), {
        int64_t threads = (s.C + V - 1) / V, runs = conv_runs(s, V);
        dim3 grid((unsigned)((threads + CONV_THREADS - 1) / CONV_THREADS), (unsigned)(runs < 64 ? runs : 64));
        DT_SWITCH(x.dt, T, "conv1d_silu_forward",
                  DT_SWITCH(w.dt, TW, "conv1d_silu_forward",
                            BOOL_SWITCH(pos.p, DOCS,
                                        KT_SWITCH(s.K, conv_forward_kernel<KT, V, T, TW, DOCS>
                                                  <<<grid, CONV_THREADS, 0, cuda_stream()>>>(
                                                      (T *)y.p, (const T *)x.p, (const TW *)w.p, (const T *)halo.p,
                                                      (const int *)pos.p, s)))));
    });
    CUDA_LAUNCH_CHECK();
}

void cuda_conv1d_silu_backward(Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo,
                               Tensor pos, int B) {
    ConvShape s = conv_shape(x, w, halo, pos, B, "conv1d_silu_backward");
    CHECK(!dhalo.p || (halo.p && tensor_numel(dhalo) == tensor_numel(halo)));
    same_dt(dx, x, "conv1d_silu_backward");
    same_dt(dy, x, "conv1d_silu_backward");
    IS_F32(dw, "conv1d_silu_backward");
    if (dhalo.p) same_dt(dhalo, x, "conv1d_silu_backward");
    if (t_rows(x) == 0) return;
    PAIR_SWITCH(conv_pairs(s, x.dt, dx.p, dhalo.p, dy.p, x.p, halo.p), {
        int G = colsum_groups(conv_runs(s, V), s.C * s.K, CONV_TY, CONV_GROUPS); // run groups: grid.y
        float *part = colsum_part(s.C * s.K, G, "conv1d_silu_backward");
        dim3 grid((unsigned)(((s.C + V - 1) / V + 31) / 32), (unsigned)G), block(32, CONV_TY);
        DT_SWITCH(x.dt, T, "conv1d_silu_backward",
                  DT_SWITCH(w.dt, TW, "conv1d_silu_backward",
                            BOOL_SWITCH(pos.p, DOCS,
                                        KT_SWITCH(s.K, conv_backward_kernel<KT, V, T, TW, DOCS>
                                                  <<<grid, block, 0, cuda_stream()>>>(
                                                      (T *)dx.p, (T *)dhalo.p, part, (const T *)dy.p, (const T *)x.p,
                                                      (const TW *)w.p, (const T *)halo.p, (const int *)pos.p, s)))));
        CUDA_LAUNCH_CHECK();
        colsum_finish((float *)dw.p, part, G, s.C * s.K);
    });
}
// ---- the DeltaNet gates ----

// The gates' inputs as the kernels see them: a, b (Tn, nv) of type T, A_log, dt_bias (nv) of type TW.
template <typename T, typename TW> struct GateIn {
    const T *a, *b;
    const TW *A_log, *dt_bias;
    int64_t Tn, nv;
};
template <typename T, typename TW> static GateIn<T, TW> gate_in(Tensor a, Tensor b, Tensor A_log, Tensor dt_bias) {
    GateIn<T, TW> in = {(const T *)a.p,        (const T *)b.p, (const TW *)A_log.p,
                        (const TW *)dt_bias.p, t_rows(a),      t_cols(a)};
    return in;
}

template <typename T, typename TW> __global__ void gates_forward_kernel(float *g, float *beta, GateIn<T, TW> in) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < in.Tn * in.nv;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t h = i % in.nv;
        g[i] = -expf(ld(in.A_log, h)) * softplus_f(ld(in.a, i) + ld(in.dt_bias, h));
        beta[i] = sigmoid_f(ld(in.b, i));
    }
}

// da, db per element; dA_log[h] += Σ_t dg·g, ddt_bias[h] += Σ_t da in a fixed order: a thread per head, grid.y = G
// row groups (colsum_groups) taking rows t ≡ g (mod G) in order; group g's sums go to part[g·nv + h] and
// part[(G + g)·nv + h], which colsum_finish adds in group order.
template <typename T, typename TW>
__global__ void gates_backward_kernel(T *da, T *db, float *part, const float *dg, const float *dbeta,
                                      GateIn<T, TW> in) {
    int64_t h = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (h >= in.nv) return;
    float eA = expf(ld(in.A_log, h)), sA = 0, sdt = 0;
    for (int64_t t = blockIdx.y; t < in.Tn; t += gridDim.y) {
        int64_t i = t * in.nv + h;
        float x = ld(in.a, i) + ld(in.dt_bias, h), d = dg[i], s = sigmoid_f(ld(in.b, i)), ga = -eA * sigmoid_f(x) * d;
        sA += -d * eA * softplus_f(x);
        sdt += ga;
        st(da, i, ga);
        st(db, i, dbeta[i] * s * (1.0f - s));
    }
    part[blockIdx.y * in.nv + h] = sA, part[(gridDim.y + blockIdx.y) * in.nv + h] = sdt;
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
                            (float *)g.p, (float *)beta.p, gate_in<T, TW>(a, b, A_log, dt_bias))));
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
    int G = colsum_groups(Tn, 2 * nv, 32);
    float *part = colsum_part(2 * nv, G, "delta_gates_backward");
    dim3 grid((unsigned)((nv + 31) / 32), (unsigned)G);
    DT_SWITCH(a.dt, T, "delta_gates_backward",
              DT_SWITCH(A_log.dt, TW, "delta_gates_backward",
                        gates_backward_kernel<T, TW><<<grid, 32, 0, cuda_stream()>>>(
                            (T *)da.p, (T *)db.p, part, (const float *)dg.p, (const float *)dbeta.p,
                            gate_in<T, TW>(a, b, A_log, dt_bias))));
    CUDA_LAUNCH_CHECK();
    colsum_finish((float *)dA_log.p, part, G, nv);
    colsum_finish((float *)ddt_bias.p, part + (int64_t)G * nv, G, nv);
}
