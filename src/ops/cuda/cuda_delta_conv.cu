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
// A thread takes V adjacent channels (CONV_V where C and the pointers allow one access of V elements a row and K ≤ 4,
// else 1) and slides down runs of one sequence: the last KT rows of x (backward: also of dpre and pos) sit in
// registers, the rows come in chunks of U whose loads are issued before the chunk ahead of them is computed (so a
// thread always has a chunk in flight), and each x and dy is read once per run plus a halo of KT − 1 rows. A warp's
// access to a row covers 32·V adjacent channels (CONV_V: 256 bytes of bf16).
// The K taps sit right-aligned in KT (4 or CONV_MAX_K, the smallest that holds K; zeros before them), so every
// register index is a constant: u[q] = Σ_j w'[j]·x[q − KT + 1 + j], the zero taps adding exact zeros.
// Backward: dpre[q] = dy[q]·silu'(u[q]), and dx[q − KT + 1] = Σ_j w'[j]·dpre[q − j] is complete once dpre[q] is, so a
// run of outputs p0 .. p0 + L − 1 slides on to p0 + L + KT − 2 (reading x and dy KT − 1 rows past it); dw[c, j] gets
// Σ dpre[q]·x[q − KT + 1 + j] over the run's own q.
// The weight gradient, in a fixed order: a block is 32 threads of channels × TY run lanes (threadIdx.y) and grid.y
// holds G run groups (colsum_groups, from the shape alone); the runs (their length from the shape: about one a lane)
// are dealt to the G·TY lanes in turn, each thread summing its own in order; a block adds its lanes' sums in lane order
// into part[g·C·K + c·K + j] (the small pool), and colsum_finish adds Σ_g part[g·C·K + ·], g = 0, 1, … in order, to dw.
// The halo (context parallelism: the K − 1 rows before each sequence, (B·(K−1), C); NULL: zeros) stands in for the
// positions −(K − 1) .. −1; its gradient is the dx formula at those positions, which a sequence's first run reaches in
// its first KT − 1 steps (dpre before the sequence: 0).
// Document masking (pos, NULL: none): tap j (KT − 1 − j rows back) of output q counts while its distance is at most
// pos[q]; the backward keeps the window's limits, 4 bits a row, beside dpre for dx's terms. The kernels take DOCS as a
// template flag, so without masking the tests fold away.
#define CONV_MAX_K 8
#define CONV_V 4      // channels a thread on the vector path
#define CONV_TY 4     // run lanes a block (threadIdx.y)
#define CONV_GROUPS 8 // the backward's run groups (grid.y) at most
#define CONV_RUN 64   // the forward's run, and the fewest rows a backward lane takes
// The rows a thread has in flight: two chunks of U = CONV_CHUNK / 2 (one computed, the next loading); 8 for Qwen3.5's 4
// taps of 4 bf16 channels, fewer where the window or the rows' bytes take more registers.
#define CONV_CHUNK(KT, V, T) (32 / (KT) < 64 / ((V) * (int)sizeof(T)) ? 32 / (KT) : 64 / ((V) * (int)sizeof(T)))
#define CONV_ALL (1 << 30) // the limit without document masking
// Runs BODY with KT the taps the kernels hold for a kernel of K (Qwen3.5's 4 in 4: half the registers and products).
#define KT_SWITCH(K, ...)                                                                                              \
    BOOL_SWITCH((K) <= 4, KT_IS_4, {                                                                                   \
        constexpr int KT = KT_IS_4 ? 4 : CONV_MAX_K;                                                                   \
        __VA_ARGS__;                                                                                                   \
    })
// Runs BODY with V the channels a thread takes (width: CONV_V or 1).
#define CONV_V_SWITCH(width, ...)                                                                                      \
    BOOL_SWITCH((width) == CONV_V, WIDE, {                                                                             \
        constexpr int V = WIDE ? CONV_V : 1;                                                                           \
        __VA_ARGS__;                                                                                                   \
    })

// A call's shape: B sequences of S, C channels, kernel K; y's (and dy's) column blocks (split, ops_list.h; 0: none).
typedef struct {
    int64_t C, S, B, split;
    int K;
} ConvShape;
// Where channel c of y (or dy) lies: its column block's start (y + conv_y_base) and row stride (conv_y_stride); rows
// of C without a split. A thread's V channels never straddle two blocks (conv_width: split % V == 0).
__host__ __device__ __forceinline__ int64_t conv_y_stride(const ConvShape &s, int64_t c) {
    return !s.split ? s.C : c < 2 * s.split ? s.split : s.C - 2 * s.split;
}
__host__ __device__ __forceinline__ int64_t conv_y_base(const ConvShape &s, int64_t c) {
    int64_t c0 = !s.split || c < s.split ? 0 : c < 2 * s.split ? s.split : 2 * s.split;
    return s.B * s.S * c0 + (c - c0);
}

// V adjacent values of T as stored, in 32-bit words (a lone bf16 in the low half): one access of V·sizeof(T) bytes.
template <int V, typename T> struct ConvRaw { uint32_t w[(V * sizeof(T) + 3) / 4]; };
template <int V, typename T> __device__ __forceinline__ ConvRaw<V, T> conv_load(const T *p) {
    constexpr int NB = V * (int)sizeof(T);
    ConvRaw<V, T> r;
    if constexpr (NB == 2) r.w[0] = *(const unsigned short *)p;
    else if constexpr (NB == 4) r.w[0] = *(const uint32_t *)p;
    else if constexpr (NB == 8) {
        uint2 t = *(const uint2 *)p;
        r.w[0] = t.x, r.w[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < NB / 16; i++) {
            uint4 t = ((const uint4 *)p)[i];
            r.w[4 * i] = t.x, r.w[4 * i + 1] = t.y, r.w[4 * i + 2] = t.z, r.w[4 * i + 3] = t.w;
        }
    }
    return r;
}
// Value v of r as fp32.
template <int V, typename T> __device__ __forceinline__ float conv_val(const ConvRaw<V, T> &r, int v) {
    if constexpr (sizeof(T) == 2) return __uint_as_float(v % 2 ? r.w[v / 2] & 0xffff0000u : r.w[v / 2] << 16);
    else return __uint_as_float(r.w[v]);
}
// f stored at p as T (bf16: rounded to nearest even), one access.
template <int V, typename T> __device__ __forceinline__ void conv_store(T *p, const float (&f)[V]) {
    constexpr int NB = V * (int)sizeof(T);
    ConvRaw<V, T> r;
    if constexpr (sizeof(T) == 2 && V == 1) {
        st(p, 0, f[0]);
        return;
    } else if constexpr (sizeof(T) == 2) {
#pragma unroll
        for (int i = 0; i < V / 2; i++) {
            __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
            r.w[i] = __bfloat16_as_ushort(h.x) | (uint32_t)__bfloat16_as_ushort(h.y) << 16;
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; v++) r.w[v] = __float_as_uint(f[v]);
    }
    if constexpr (NB == 4) *(uint32_t *)p = r.w[0];
    else if constexpr (NB == 8) *(uint2 *)p = make_uint2(r.w[0], r.w[1]);
    else
#pragma unroll
        for (int i = 0; i < NB / 16; i++)
            ((uint4 *)p)[i] = make_uint4(r.w[4 * i], r.w[4 * i + 1], r.w[4 * i + 2], r.w[4 * i + 3]);
}

// σ(u) through the fast exponential and division: their few-ulp error sits far below the tests' bounds, and the
// backward's arithmetic is close to its memory time.
__device__ __forceinline__ float conv_sigmoid(float u) { return __fdividef(1.0f, 1.0f + __expf(-u)); }

// wk[v][·]: channel c + v's taps, right-aligned.
template <int KT, int V, typename TW>
__device__ __forceinline__ void conv_taps(float (&wk)[V][KT], const TW *w, int64_t c, int K) {
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int j = 0; j < KT; j++) wk[v][j] = j >= KT - K ? ld(w, (c + v) * K + j - (KT - K)) : 0.0f;
}
// xw[1 .. KT − 1] = x[p0 − KT + 1 .. p0 − 1] of V adjacent channels (xs: their columns in the sequence; hs: their
// columns in the sequence's K − 1 halo rows, or NULL; elsewhere 0); xw[0] = 0 (the first step shifts it out).
template <int KT, int V, typename T>
__device__ __forceinline__ void conv_history(float (&xw)[KT][V], const T *xs, const T *hs, int K, int64_t p0,
                                             int64_t C) {
#pragma unroll
    for (int i = 0; i < KT; i++) {
        int64_t q = p0 - KT + i;
        ConvRaw<V, T> r = {};
        if (i > 0 && q >= 0) r = conv_load<V>(xs + q * C);
        else if (i > 0 && hs && q >= 1 - K) r = conv_load<V>(hs + (K - 1 + q) * C);
#pragma unroll
        for (int v = 0; v < V; v++) xw[i][v] = conv_val(r, v);
    }
}
// Slides a window of KT rows one row on: a[KT − 1] the newest.
template <int KT, int V> __device__ __forceinline__ void conv_shift(float (&a)[KT][V]) {
#pragma unroll
    for (int i = 0; i + 1 < KT; i++)
#pragma unroll
        for (int v = 0; v < V; v++) a[i][v] = a[i + 1][v];
}
// The pre-activation of channel v at the window's newest row: Σ_j w'[j]·xw[j] over the taps within lim rows back.
template <int KT, int V>
__device__ __forceinline__ float conv_u(const float (&wk)[V][KT], const float (&xw)[KT][V], int v, int lim) {
    float u = 0;
#pragma unroll
    for (int j = 0; j < KT; j++)
        if (KT - 1 - j <= lim) u += wk[v][j] * xw[j][v];
    return u;
}

// N rows of V channels from q0 on (rows at lim or past it: 0): x (row stride C), and with DY dy (row stride Cd: its
// column block's, conv_y_stride); pos with DOCS (else CONV_ALL).
template <int N, int V, typename T> struct ConvRows {
    ConvRaw<V, T> x[N], d[N];
    int l[N];
};
template <int N, int V, bool DY, bool DOCS, typename T>
__device__ __forceinline__ ConvRows<N, V, T> conv_rows(const T *xs, const T *ds, const int *ps, int64_t q0, int64_t lim,
                                                       int64_t C, int64_t Cd) {
    ConvRows<N, V, T> r;
#pragma unroll
    for (int i = 0; i < N; i++) {
        r.x[i] = {}, r.d[i] = {}, r.l[i] = CONV_ALL;
        if (q0 + i < lim) {
            r.x[i] = conv_load<V>(xs + (q0 + i) * C);
            if (DY) r.d[i] = conv_load<V>(ds + (q0 + i) * Cd);
            if (DOCS) r.l[i] = ps[q0 + i];
        }
    }
    return r;
}

// y[q] = silu(u[q]) over runs of CONV_RUN positions (x before the sequence: the halo or 0); a chunk's rows are
// loaded while the one before it is computed.
template <int KT, int V, typename T, typename TW, bool DOCS>
__global__ void __launch_bounds__(32 * CONV_TY)
    conv_forward_kernel(T *y, const T *x, const TW *w, const T *halo, const int *pos, ConvShape sh) {
    constexpr int U = CONV_CHUNK(KT, V, T) / 2;
    int64_t C = sh.C, S = sh.S, per_seq = (S + CONV_RUN - 1) / CONV_RUN, runs = sh.B * per_seq;
    int K = sh.K;
    int64_t c = (blockIdx.x * (int64_t)32 + threadIdx.x) * V;
    if (c >= C) return;
    float wk[V][KT], xw[KT][V];
    conv_taps(wk, w, c, K);
    for (int64_t r = blockIdx.y * (int64_t)blockDim.y + threadIdx.y; r < runs; r += (int64_t)gridDim.y * blockDim.y) {
        int64_t b = r / per_seq, p0 = r % per_seq * CONV_RUN, end = p0 + CONV_RUN < S ? p0 + CONV_RUN : S;
        const T *xs = x + b * S * C + c;
        const int *ps = pos + b * S;
        int64_t yC = conv_y_stride(sh, c);
        T *ys = y + conv_y_base(sh, c) + b * S * yC;
        conv_history(xw, xs, halo ? halo + b * (K - 1) * C + c : NULL, K, p0, C);
        ConvRows<U, V, T> a = conv_rows<U, V, false, DOCS>(xs, xs, ps, p0, end, C, C);
#pragma unroll 1
        for (int64_t q0 = p0; q0 < end; q0 += U) {
            ConvRows<U, V, T> next = conv_rows<U, V, false, DOCS>(xs, xs, ps, q0 + U, end, C, C);
#pragma unroll
            for (int i = 0; i < U; i++) {
                conv_shift(xw);
#pragma unroll
                for (int v = 0; v < V; v++) xw[KT - 1][v] = conv_val(a.x[i], v);
                float o[V];
#pragma unroll
                for (int v = 0; v < V; v++) {
                    float u = conv_u(wk, xw, v, a.l[i]);
                    o[v] = u * conv_sigmoid(u);
                }
                if (q0 + i < end) conv_store<V>(ys + (q0 + i) * yC, o);
            }
            a = next;
        }
    }
}

// The backward's slide over one run: the window of x, dpre and pos at q − KT + 1 .. q, the taps and the thread's
// weight-gradient sums, and the run's columns.
template <int KT, int V, typename T, bool DOCS> struct ConvSlide {
    float wk[V][KT], dwk[V][KT], xw[KT][V], dp[KT][V];
    uint32_t lw; // pos at the window's row k as min(pos + 1, 15) in bits 4k .. 4k + 3 (15: every tap; one register)
    const T *xs, *ds; // x and dy: the sequence's columns
    T *dxs, *dhs;     // dx: the sequence's columns; dhalo: the halo's, where this run starts the sequence, else NULL
    int64_t C, Cd, S, p0; // Cd: dy's row stride
    int K;

    // Steps q0 .. q0 + N − 1 over their rows a; OWN: the run's own positions, whose dpre·x go into dwk.
    template <int N, bool OWN> __device__ __forceinline__ void steps(int64_t q0, const ConvRows<N, V, T> &a) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            conv_shift(xw), conv_shift(dp);
            if (DOCS) lw = lw >> 4 | (uint32_t)(a.l[i] < 0 ? 0 : a.l[i] < 14 ? a.l[i] + 1 : 15) << 4 * (KT - 1);
#pragma unroll
            for (int v = 0; v < V; v++) {
                xw[KT - 1][v] = conv_val(a.x[i], v);
                float u = conv_u(wk, xw, v, a.l[i]), s = conv_sigmoid(u);
                dp[KT - 1][v] = conv_val(a.d[i], v) * (s * (1.0f + u * (1.0f - s)));
            }
            if (OWN)
#pragma unroll
                for (int v = 0; v < V; v++)
#pragma unroll
                    for (int j = 0; j < KT; j++)
                        if (KT - 1 - j <= a.l[i]) dwk[v][j] += dp[KT - 1][v] * xw[j][v];
            // dx at qo = q − KT + 1: tap j of output q − j, where that output's limit lets it reach qo
            float o[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                o[v] = 0;
#pragma unroll
                for (int j = 0; j < KT; j++)
                    if (!DOCS || KT - 1 - j < (int)(lw >> 4 * (KT - 1 - j) & 15)) o[v] += wk[v][j] * dp[KT - 1 - j][v];
            }
            int64_t qo = q0 + i - (KT - 1);
            if (qo >= p0 && qo < S) conv_store<V>(dxs + qo * C, o);
            else if (dhs && qo < 0 && qo >= 1 - K) conv_store<V>(dhs + (K - 1 + qo) * C, o);
        }
    }
};

// dpre, dx (and dhalo) and this block's part of dw over runs of L positions (above), loading as the forward does.
template <int KT, int V, typename T, typename TW, bool DOCS>
__global__ void __launch_bounds__(32 * CONV_TY, V > CONV_V ? 2 : 4)
    conv_backward_kernel(T *dx, T *dhalo, float *part, const T *dy, const T *x, const TW *w, const T *halo,
                         const int *pos, ConvShape sh, int64_t L) {
    constexpr int U = CONV_CHUNK(KT, V, T) / 2;
    static_assert(8 % U == 0, "a run (conv_run_length) is a whole number of chunks");
    __shared__ float red[CONV_TY][32]; // the lanes' sums of one tap
    int64_t C = sh.C, S = sh.S, per_seq = (S + L - 1) / L, runs = sh.B * per_seq;
    int K = sh.K;
    int64_t c = (blockIdx.x * (int64_t)32 + threadIdx.x) * V;
    bool on = c < C; // threads past C join the block's sum but take no runs
    ConvSlide<KT, V, T, DOCS> sl;
    sl.C = C, sl.Cd = conv_y_stride(sh, c), sl.S = S, sl.K = K;
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int j = 0; j < KT; j++) sl.wk[v][j] = sl.dwk[v][j] = 0.0f;
    if (on) conv_taps(sl.wk, w, c, K);
    int64_t lane = blockIdx.y * (int64_t)blockDim.y + threadIdx.y, nlanes = (int64_t)gridDim.y * blockDim.y;
    for (int64_t r = on ? lane : runs; r < runs; r += nlanes) {
        int64_t b = r / per_seq, p0 = r % per_seq * L, end = p0 + L < S ? p0 + L : S;
        const int *ps = pos + b * S;
        sl.p0 = p0;
        sl.xs = x + b * S * C + c, sl.ds = dy + conv_y_base(sh, c) + b * S * sl.Cd, sl.dxs = dx + b * S * C + c;
        sl.dhs = dhalo && p0 == 0 ? dhalo + b * (K - 1) * C + c : NULL;
        conv_history(sl.xw, sl.xs, halo ? halo + b * (K - 1) * C + c : NULL, K, p0, C);
        sl.lw = ~0u >> (32 - 4 * KT);
#pragma unroll
        for (int i = 0; i < KT; i++)
#pragma unroll
            for (int v = 0; v < V; v++) sl.dp[i][v] = 0.0f;
        ConvRows<U, V, T> a = conv_rows<U, V, true, DOCS>(sl.xs, sl.ds, ps, p0, end, C, sl.Cd);
        int64_t q0 = p0;
#pragma unroll 1
        for (; q0 < end; q0 += U) {
            ConvRows<U, V, T> next = conv_rows<U, V, true, DOCS>(sl.xs, sl.ds, ps, q0 + U, end, C, sl.Cd);
            sl.template steps<U, true>(q0, a);
            a = next;
        }
        // the outputs' last KT − 1 rows of dpre (past the sequence: 0)
        sl.template steps<KT - 1, false>(q0, conv_rows<KT - 1, V, true, DOCS>(sl.xs, sl.ds, ps, q0, S, C, sl.Cd));
    }
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
        for (int j = 0; j < KT; j++)
            if (j >= KT - K) { // (K: the same in the whole block)
                red[threadIdx.y][threadIdx.x] = sl.dwk[v][j];
                __syncthreads();
                if (threadIdx.y == 0 && on) {
                    float s = 0;
                    for (int l = 0; l < CONV_TY; l++) s += red[l][threadIdx.x];
                    part[blockIdx.y * C * K + (c + v) * K + j - (KT - K)] = s;
                }
                __syncthreads();
            }
}

// The shape of x: (B·S, C) with w: (C, K), checked with the halo's and pos's.
static ConvShape conv_shape(Tensor x, Tensor w, Tensor halo, Tensor pos, int64_t B, int64_t split, const char *what) {
    ConvShape s;
    int64_t T_ = t_rows(x);
    s.C = t_cols(x), s.S = T_ / B, s.B = B, s.K = (int)t_cols(w), s.split = split;
    CHECK(T_ % B == 0 && t_rows(w) == s.C && split >= 0 && 2 * split <= s.C);
    if (s.K > CONV_MAX_K) die("%s: kernel %d is past the GPU kernels' %d", what, s.K, CONV_MAX_K);
    if (halo.p) {
        CHECK(t_rows(halo) == B * (s.K - 1) && t_cols(halo) == s.C);
        same_dt(halo, x, what);
    }
    if (pos.p) CHECK(pos.dev == DEV_CUDA && pos.dt == DT_I32 && tensor_numel(pos) == T_);
    return s;
}
// The channels a thread takes: CONV_V where C, split and every pointer allow one access of that many elements
// of dtype dt and the kernel has at most 4 taps (8 taps' windows of several channels spill), else 1.
static int conv_width(ConvShape s, DType dt, const void *a, const void *b, const void *c, const void *d,
                      const void *e) {
    uintptr_t m = (uintptr_t)CONV_V * dtype_size(dt) - 1;
    bool fits = s.C % CONV_V == 0 && s.split % CONV_V == 0 &&
                !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e) & m);
    return fits && s.K <= 4 ? CONV_V : 1;
}
// The backward's run length for its lanes: a sequence split over about lanes / B of them, a multiple of 8 (of every
// chunk, so the runs, and with them the weight gradient's order, follow the shape alone, not the channel width).
static int64_t conv_run_length(ConvShape s, int64_t lanes) {
    int64_t per = (lanes + s.B - 1) / s.B, L = (s.S + per - 1) / per;
    return (L + 7) / 8 * 8;
}
// Runs BODY with KT and VK (V, or 1 past 4 taps: conv_width's).
#define CONV_KERNEL_SWITCH(K, ...)                                                                                     \
    KT_SWITCH(K, {                                                                                                     \
        constexpr int VK = KT == 4 ? V : 1;                                                                            \
        __VA_ARGS__;                                                                                                   \
    })

void cuda_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split) {
    ConvShape s = conv_shape(x, w, halo, pos, B, split, "conv1d_silu_forward");
    CHECK(tensor_numel(y) == tensor_numel(x));
    same_dt(y, x, "conv1d_silu_forward");
    if (t_rows(x) == 0) return;
    CONV_V_SWITCH(conv_width(s, x.dt, y.p, x.p, halo.p, NULL, NULL), {
        int64_t threads = (s.C + V - 1) / V, runs = s.B * ((s.S + CONV_RUN - 1) / CONV_RUN),
                gy = (runs + CONV_TY - 1) / CONV_TY;
        dim3 grid((unsigned)((threads + 31) / 32), (unsigned)(gy < 65535 ? gy : 65535)), block(32, CONV_TY);
        DT_SWITCH(x.dt, T, "conv1d_silu_forward",
                  DT_SWITCH(w.dt, TW, "conv1d_silu_forward",
                            BOOL_SWITCH(pos.p, DOCS,
                                        CONV_KERNEL_SWITCH(s.K, conv_forward_kernel<KT, VK, T, TW, DOCS>
                                                           <<<grid, block, 0, cuda_stream()>>>(
                                                               (T *)y.p, (const T *)x.p, (const TW *)w.p,
                                                               (const T *)halo.p, (const int *)pos.p, s)))));
    });
    CUDA_LAUNCH_CHECK();
}

void cuda_conv1d_silu_backward(Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo,
                               Tensor pos, int B, int64_t split) {
    ConvShape s = conv_shape(x, w, halo, pos, B, split, "conv1d_silu_backward");
    CHECK(!dhalo.p || (halo.p && tensor_numel(dhalo) == tensor_numel(halo)));
    same_dt(dx, x, "conv1d_silu_backward");
    same_dt(dy, x, "conv1d_silu_backward");
    IS_F32(dw, "conv1d_silu_backward");
    if (dhalo.p) same_dt(dhalo, x, "conv1d_silu_backward");
    if (t_rows(x) == 0) return;
    int G = colsum_groups(s.B * s.S, s.C * s.K, CONV_TY * CONV_RUN, CONV_GROUPS); // run groups: grid.y
    float *part = colsum_part(s.C * s.K, G, "conv1d_silu_backward");
    int64_t L = conv_run_length(s, (int64_t)G * CONV_TY);
    CONV_V_SWITCH(conv_width(s, x.dt, dx.p, dhalo.p, dy.p, x.p, halo.p), {
        dim3 grid((unsigned)(((s.C + V - 1) / V + 31) / 32), (unsigned)G), block(32, CONV_TY);
        DT_SWITCH(
            x.dt, T, "conv1d_silu_backward",
            DT_SWITCH(w.dt, TW, "conv1d_silu_backward",
                      BOOL_SWITCH(pos.p, DOCS,
                                  CONV_KERNEL_SWITCH(
                                      s.K, conv_backward_kernel<KT, VK, T, TW, DOCS><<<grid, block, 0, cuda_stream()>>>(
                                               (T *)dx.p, (T *)dhalo.p, part, (const T *)dy.p, (const T *)x.p,
                                               (const TW *)w.p, (const T *)halo.p, (const int *)pos.p, s, L)))));
    });
    CUDA_LAUNCH_CHECK();
    colsum_finish((float *)dw.p, part, G, s.C * s.K);
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
