// cuda_attention.cu — flash attention forward and backward for every form of ops.h (AttnArgs): grouped-query
// attention, q·k head dim DQK and v head dim DV (MLA: 192, 128), causal or block against block at position
// offsets, sliding window, per-head sinks, with an LSE output, never materialising the Sq×Sk score matrix
// (Dao et al., FlashAttention-2, Algorithms 1 and 2).
// q, dq: (B·Sq, nh, DQK); o, dout: (B·Sq, nh, DV); k, dk: (B·Sk, nkv, DQK); v, dv: (B·Sk, nkv, DV);
// lse: (B, nh, Sq) fp32; query head h reads kv head h / (nh/nkv). Storage fp32 or bf16, arithmetic fp32.
//   forward   s_ij = scale·q_i·k_j (j visible from i), online softmax over key tiles, the sink a key of
//             score sinks[h] and no value (m starts at the sink, l at 1):
//             m ← max(m, max_j s_ij), l ← l·e^(m_old−m) + Σ_j e^(s_ij−m), acc ← acc·e^(m_old−m) + Σ_j e^(s_ij−m)·v_j;
//             o_i = acc/l, lse_i = m + log l; a query that sees nothing: o = 0, lse = −∞.
//   backward  p_ij = e^(s_ij − lse_i) (0 where lse = −∞), D_i = dout_i·o_i, ds_ij = p_ij·(dout_i·v_j − D_i);
//             dq_i = scale·Σ_j ds_ij·k_j  (kernel 1: one block per query tile)
//             dk_j = scale·Σ_i ds_ij·q_i, dv_j = Σ_i p_ij·dout_i, summed over the query heads of the group
//             (kernel 2: one block per key tile and kv head: no atomics, deterministic);
//             dsinks_h += −Σ_i e^(sinks_h − lse_i)·D_i (kernel 3: blocks of rows, partial sums added in order).
// Layout of the work: a block holds ATT_ROWS rows (queries, or keys in the dk/dv kernel); each row is
// owned by TPR consecutive threads, thread `sub` holding elements c·TPR + sub (c < D/TPR) in registers,
// so a dot product is a register loop plus a log2(TPR)-step shuffle. The other side (keys, or queries)
// streams through shared memory in tiles of ATT_TILE rows, converted to fp32 on load. Visibility is one
// function (attn_visible) and the tile range of a block two bounds (attn_key_range, attn_query_range).
// Document masking (AttnArgs.docpos): query i also needs kpos ≥ qpos − docpos[i], as the key index
// attn_doc_lo(i), which never decreases along a sequence; the key range of a query block starts at its first row's
// bound, the query range of a key block ends before the first query whose bound lies past the block's last key (a
// binary search), and each row's bound joins attn_visible (the dk/dv kernel keeps a query tile's bounds in shared
// memory). Without docpos none of this loads anything.
// These scalar-FMA kernels serve fp32 (parity runs) and every form the tensor-core kernels of cuda_flash.cu
// and cuDNN (cuda_cudnn.cu: causal, a window or none, sinks through attention_sinks_correct_kernel) do not cover.
#include "ops/cuda/cuda_common.cuh"

#define ATT_ROWS 64
#define ATT_TILE 32

// What a kernel needs of AttnArgs and the shapes.
typedef struct {
    int Sq, Sk, nh, nkv, window;
    bool causal;
    float scale;
    int64_t q_off, k_off;
    const float *sinks;    // (nh) or NULL
    const int32_t *docpos; // (B·Sq) or NULL
} AttnParams;

// Key j is visible to query i (indices within their blocks), by causality and the window.
__device__ __forceinline__ bool attn_visible(const AttnParams &p, int i, int j) {
    int64_t qp = p.q_off + i, kp = p.k_off + j;
    return (!p.causal || kp <= qp) && (p.window == 0 || kp > qp - p.window);
}
// With docpos: the first key index query i of sequence b sees by its document, clamped to [0, Sk].
__device__ __forceinline__ int attn_doc_lo(const AttnParams &p, int b, int i) {
    int64_t l = p.q_off + i - p.docpos[(int64_t)b * p.Sq + i] - p.k_off;
    return (int)min(max(l, (int64_t)0), (int64_t)p.Sk);
}
// The keys [*lo, *hi) any of the queries q0..q0+n−1 (q0 < Sq) of sequence b can see.
__device__ __forceinline__ void attn_key_range(const AttnParams &p, int b, int q0, int n, int *lo, int *hi) {
    int64_t l = 0, h = p.Sk;
    if (p.causal) h = min(h, p.q_off + q0 + n - p.k_off);
    if (p.window) l = max(l, p.q_off + q0 - p.window + 1 - p.k_off);
    if (p.docpos) l = max(l, (int64_t)attn_doc_lo(p, b, q0));
    *lo = (int)l, *hi = (int)max(h, l);
}
// The queries [*lo, *hi) of sequence b that can see any of the keys k0..k0+n−1 (k0 < Sk).
__device__ __forceinline__ void attn_query_range(const AttnParams &p, int b, int k0, int n, int *lo, int *hi) {
    int64_t l = 0, h = p.Sq;
    if (p.causal) l = max(l, p.k_off + k0 - p.q_off);
    if (p.window) h = min(h, p.k_off + k0 + n - 1 + p.window - p.q_off);
    if (p.docpos && l < h) { // the first query in [l, h) whose document starts after the last key
        int kmax = min(k0 + n, p.Sk) - 1, a = (int)l, z = (int)h;
        while (a < z) {
            int mid = a + (z - a) / 2;
            if (attn_doc_lo(p, b, mid) > kmax) z = mid;
            else a = mid + 1;
        }
        h = a;
    }
    *lo = (int)l, *hi = (int)max(h, l);
}

// Sum over the TPR consecutive lanes that own one row.
template <int TPR> __device__ __forceinline__ float row_sum(float v) {
    for (int o = TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// The dot product of a row's N·TPR elements: this thread's N in registers (r) with its elements c·TPR + sub of a
// shared-memory row (t), summed over the row's lanes.
template <int N, int TPR> __device__ __forceinline__ float row_dot(const float *r, const float *t, int sub) {
    float v = 0.0f;
#pragma unroll
    for (int c = 0; c < N; c++) v += r[c] * t[c * TPR + sub];
    return row_sum<TPR>(v);
}

// Loads rows r0..r0+ATT_TILE of one head of a (B·S, heads, D) tensor into tile (ATT_TILE × D fp32);
// rows outside 0..S read as 0.
template <typename T, int D>
__device__ __forceinline__ void load_tile(float *tile, const T *x, int b, int S, int heads, int head, int r0) {
    for (int e = threadIdx.x; e < ATT_TILE * D; e += blockDim.x) {
        int rr = e / D, c = e % D, r = r0 + rr;
        tile[e] = r >= 0 && r < S ? ld(x, (((int64_t)b * S + r) * heads + head) * D + c) : 0.0f;
    }
}

template <typename T, int DQK, int DV, int TPR>
__global__ void __launch_bounds__(ATT_ROWS *TPR)
    attention_forward_kernel(T *o, float *lse, const T *q, const T *k, const T *v, AttnParams p) {
    constexpr int QPT = DQK / TPR, VPT = DV / TPR;
    extern __shared__ float smem[];
    float *ks = smem, *vs = smem + ATT_TILE * DQK;
    int bh = blockIdx.y, b = bh / p.nh, h = bh % p.nh, g = h / (p.nh / p.nkv);
    int r = threadIdx.x / TPR, sub = threadIdx.x % TPR, q0 = blockIdx.x * ATT_ROWS, i = q0 + r;
    bool valid = i < p.Sq; // rows past Sq compute along (the shuffles need every lane) but store nothing
    int64_t qrow = ((int64_t)b * p.Sq + (valid ? i : 0)) * p.nh + h;
    float qr[QPT], acc[VPT];
#pragma unroll
    for (int c = 0; c < QPT; c++) qr[c] = valid ? ld(q, qrow * DQK + c * TPR + sub) : 0.0f;
#pragma unroll
    for (int c = 0; c < VPT; c++) acc[c] = 0.0f;
    float m = p.sinks ? p.sinks[h] : -INFINITY, l = p.sinks ? 1.0f : 0.0f;
    int jlo, jhi, dlo = p.docpos && valid ? attn_doc_lo(p, b, i) : 0; // this row's first key by its document
    attn_key_range(p, b, q0, ATT_ROWS, &jlo, &jhi);
    for (int j0 = jlo / ATT_TILE * ATT_TILE; j0 < jhi; j0 += ATT_TILE) {
        __syncthreads(); // the previous tile is consumed
        load_tile<T, DQK>(ks, k, b, p.Sk, p.nkv, g, j0);
        load_tile<T, DV>(vs, v, b, p.Sk, p.nkv, g, j0);
        __syncthreads();
        float s[ATT_TILE], mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float part = row_dot<QPT, TPR>(qr, ks + jj * DQK, sub);
            int j = j0 + jj;
            s[jj] = j < p.Sk && j >= dlo && attn_visible(p, i, j) ? p.scale * part : -INFINITY;
            mt = fmaxf(mt, s[jj]);
        }
        float mn = fmaxf(m, mt);
        if (mn == -INFINITY) continue; // nothing visible yet
        float corr = expf(m - mn);
        l *= corr;
#pragma unroll
        for (int c = 0; c < VPT; c++) acc[c] *= corr;
#pragma unroll
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float pj = expf(s[jj] - mn);
            l += pj;
#pragma unroll
            for (int c = 0; c < VPT; c++) acc[c] += pj * vs[jj * DV + c * TPR + sub];
        }
        m = mn;
    }
    if (!valid) return;
    bool none = m == -INFINITY; // no visible key and no sink
#pragma unroll
    for (int c = 0; c < VPT; c++) st(o, qrow * DV + c * TPR + sub, none ? 0.0f : acc[c] / l);
    if (sub == 0) lse[((int64_t)b * p.nh + h) * p.Sq + i] = none ? -INFINITY : m + logf(l);
}

// dq for one query tile; D_i from dout and o.
template <typename T, int DQK, int DV, int TPR>
__global__ void __launch_bounds__(ATT_ROWS *TPR)
    attention_backward_dq_kernel(T *dq, const T *dout, const T *q, const T *k, const T *v, const T *o, const float *lse,
                                 AttnParams p) {
    constexpr int QPT = DQK / TPR, VPT = DV / TPR;
    extern __shared__ float smem[];
    float *ks = smem, *vs = smem + ATT_TILE * DQK;
    int bh = blockIdx.y, b = bh / p.nh, h = bh % p.nh, g = h / (p.nh / p.nkv);
    int r = threadIdx.x / TPR, sub = threadIdx.x % TPR, q0 = blockIdx.x * ATT_ROWS, i = q0 + r;
    bool valid = i < p.Sq;
    int64_t qrow = ((int64_t)b * p.Sq + (valid ? i : 0)) * p.nh + h;
    float qr[QPT], dor[VPT], dqa[QPT], Di = 0.0f;
#pragma unroll
    for (int c = 0; c < QPT; c++) qr[c] = valid ? ld(q, qrow * DQK + c * TPR + sub) : 0.0f, dqa[c] = 0.0f;
#pragma unroll
    for (int c = 0; c < VPT; c++) {
        dor[c] = valid ? ld(dout, qrow * DV + c * TPR + sub) : 0.0f;
        Di += dor[c] * (valid ? ld(o, qrow * DV + c * TPR + sub) : 0.0f);
    }
    Di = row_sum<TPR>(Di);
    float L = valid ? lse[((int64_t)b * p.nh + h) * p.Sq + i] : -INFINITY;
    bool live = L != -INFINITY; // a query that saw nothing has no gradient
    int jlo, jhi, dlo = p.docpos && valid ? attn_doc_lo(p, b, i) : 0;
    attn_key_range(p, b, q0, ATT_ROWS, &jlo, &jhi);
    for (int j0 = jlo / ATT_TILE * ATT_TILE; j0 < jhi; j0 += ATT_TILE) {
        __syncthreads();
        load_tile<T, DQK>(ks, k, b, p.Sk, p.nkv, g, j0);
        load_tile<T, DV>(vs, v, b, p.Sk, p.nkv, g, j0);
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float sp = row_dot<QPT, TPR>(qr, ks + jj * DQK, sub), dp = row_dot<VPT, TPR>(dor, vs + jj * DV, sub);
            int j = j0 + jj;
            float pj = live && j < p.Sk && j >= dlo && attn_visible(p, i, j) ? expf(p.scale * sp - L) : 0.0f;
            float ds = p.scale * pj * (dp - Di);
#pragma unroll
            for (int c = 0; c < QPT; c++) dqa[c] += ds * ks[jj * DQK + c * TPR + sub];
        }
    }
    if (!valid) return;
#pragma unroll
    for (int c = 0; c < QPT; c++) st(dq, qrow * DQK + c * TPR + sub, dqa[c]);
}

// dk, dv for one key tile of one kv head, summed over the group's query heads and every query tile that
// can see it.
template <typename T, int DQK, int DV, int TPR>
__global__ void __launch_bounds__(ATT_ROWS *TPR)
    attention_backward_dkdv_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const T *o,
                                   const float *lse, AttnParams p) {
    constexpr int QPT = DQK / TPR, VPT = DV / TPR;
    extern __shared__ float smem[];
    float *qs = smem, *dos = smem + ATT_TILE * DQK, *Ls = dos + ATT_TILE * DV, *Ds = Ls + ATT_TILE;
    int *Ps = (int *)(Ds + ATT_TILE); // the tile's queries' first keys by their documents (0 without docpos)
    int bg = blockIdx.y, b = bg / p.nkv, g = bg % p.nkv, grp = p.nh / p.nkv;
    int r = threadIdx.x / TPR, sub = threadIdx.x % TPR, k0 = blockIdx.x * ATT_ROWS, j = k0 + r;
    bool valid = j < p.Sk;
    int64_t krow = ((int64_t)b * p.Sk + (valid ? j : 0)) * p.nkv + g;
    float kr[QPT], vr[VPT], dka[QPT], dva[VPT];
#pragma unroll
    for (int c = 0; c < QPT; c++) kr[c] = valid ? ld(k, krow * DQK + c * TPR + sub) : 0.0f, dka[c] = 0.0f;
#pragma unroll
    for (int c = 0; c < VPT; c++) vr[c] = valid ? ld(v, krow * DV + c * TPR + sub) : 0.0f, dva[c] = 0.0f;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int ilo, ihi;
    attn_query_range(p, b, k0, ATT_ROWS, &ilo, &ihi);
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        for (int i0 = ilo / ATT_TILE * ATT_TILE; i0 < ihi; i0 += ATT_TILE) {
            __syncthreads();
            load_tile<T, DQK>(qs, q, b, p.Sq, p.nh, h, i0);
            load_tile<T, DV>(dos, dout, b, p.Sq, p.nh, h, i0);
            for (int ii = threadIdx.x; ii < ATT_TILE; ii += blockDim.x) {
                Ls[ii] = i0 + ii < p.Sq ? lse[((int64_t)b * p.nh + h) * p.Sq + i0 + ii] : -INFINITY;
                Ps[ii] = p.docpos && i0 + ii < p.Sq ? attn_doc_lo(p, b, i0 + ii) : 0;
            }
            __syncthreads();
            for (int ii = warp; ii < ATT_TILE; ii += nwarps) { // D_i = dout_i·o_i, one warp per query row
                float part = 0.0f;
                if (i0 + ii < p.Sq)
                    for (int c = lane; c < DV; c += 32)
                        part += dos[ii * DV + c] * ld(o, (((int64_t)b * p.Sq + i0 + ii) * p.nh + h) * DV + c);
                part = warp_sum(part);
                if (lane == 0) Ds[ii] = part;
            }
            __syncthreads();
#pragma unroll 4
            for (int ii = 0; ii < ATT_TILE; ii++) {
                float sp = row_dot<QPT, TPR>(kr, qs + ii * DQK, sub), dp = row_dot<VPT, TPR>(vr, dos + ii * DV, sub);
                int i = i0 + ii;
                bool vis = valid && i < p.Sq && Ls[ii] != -INFINITY && j >= Ps[ii] && attn_visible(p, i, j);
                float pj = vis ? expf(p.scale * sp - Ls[ii]) : 0.0f;
                float ds = p.scale * pj * (dp - Ds[ii]);
#pragma unroll
                for (int c = 0; c < VPT; c++) dva[c] += pj * dos[ii * DV + c * TPR + sub];
#pragma unroll
                for (int c = 0; c < QPT; c++) dka[c] += ds * qs[ii * DQK + c * TPR + sub];
            }
        }
    }
    if (!valid) return;
#pragma unroll
    for (int c = 0; c < QPT; c++) st(dk, krow * DQK + c * TPR + sub, dka[c]);
#pragma unroll
    for (int c = 0; c < VPT; c++) st(dv, krow * DV + c * TPR + sub, dva[c]);
}

// dsinks[h] += −Σ_(b, i) e^(sinks_h − lse_i)·(dout_i·o_i) in two passes, deterministic. Pass 1: G blocks (G from the
// row count alone: colsum_groups, up to SINK_BLOCKS, each warp a step of SINK_RB rows at least), block g taking the
// rows g·rpb .. (g + 1)·rpb − 1; its SINK_WARPS warps take SINK_RB consecutive rows at a time (their loads in flight
// together) and read them whole, V elements a lane (16-byte loads with V = 8). A head's DV/V vectors belong to an
// aligned group of L lanes (L a power of two ≤ 32, so a group's sum is a log2(L)-step shuffle; 32/L heads a pass over
// the row); the group's first lane adds e^(sinks_h − lse)·dot to its warp's sum for head h in shared memory, in row
// order. The warps' sums are added in warp order into part[g·nh + h]. Pass 2 (colsum_finish) adds
// Σ_g part[g·nh + h], g = 0, 1, … in order, to dsinks[h].
#define SINK_BLOCKS 256 // pass-1 blocks at most
#define SINK_WARPS 8
#define SINK_RB 4 // rows a warp takes at a time
template <typename T, int V>
__global__ void __launch_bounds__(SINK_WARPS * 32)
    attention_backward_sinks_kernel(float *part, const T *dout, const T *o, const float *lse, int64_t R, int64_t rpb,
                                    int Sq, int nh, int DV, const float *sinks) {
    extern __shared__ float wsum[];                                     // (SINK_WARPS, nh): each warp's sums
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, vph = DV / V; // vectors a head
    int L = vph >= 32 ? 32 : 1 << (31 - __clz(vph)), sub = lane & (L - 1), hp = 32 / L;
    float *ws = wsum + warp * nh;
    for (int h = lane; h < nh; h += 32) ws[h] = 0.0f;
    __syncwarp();
    int64_t lo = blockIdx.x * rpb, hi = min(R, lo + rpb);
    for (int64_t r0 = lo + warp * SINK_RB; r0 < hi; r0 += SINK_WARPS * SINK_RB) {
        for (int hb = 0; hb < nh; hb += hp) {
            int h = hb + lane / L; // h ≥ nh: the lane loads nothing but joins the shuffles
            bool on = h < nh;
            float d[SINK_RB], Ls[SINK_RB];
#pragma unroll
            for (int k = 0; k < SINK_RB; k++) {
                int64_t row = r0 + k, b = row / Sq, i = row % Sq;
                d[k] = 0.0f;
                Ls[k] = on && row < hi ? lse[(b * nh + h) * Sq + i] : -INFINITY;
            }
            for (int c = sub; on && c < vph; c += L)
#pragma unroll
                for (int k = 0; k < SINK_RB; k++)
                    if (r0 + k < hi) {
                        int64_t off = ((r0 + k) * nh + h) * DV + c * V;
                        float a[V], e[V];
                        ldv<V>(dout + off, a), ldv<V>(o + off, e);
#pragma unroll
                        for (int j = 0; j < V; j++) d[k] += a[j] * e[j];
                    }
#pragma unroll
            for (int k = 0; k < SINK_RB; k++)
                for (int s = L / 2; s > 0; s >>= 1) d[k] += __shfl_xor_sync(0xffffffffu, d[k], s);
            if (on && sub == 0) {
                float acc = ws[h], sh = sinks[h];
#pragma unroll
                for (int k = 0; k < SINK_RB; k++)
                    if (Ls[k] != -INFINITY) acc -= expf(sh - Ls[k]) * d[k];
                ws[h] = acc;
            }
        }
    }
    __syncthreads();
    for (int h = threadIdx.x; h < nh; h += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < SINK_WARPS; w++) s += wsum[w * nh + h];
        part[blockIdx.x * (int64_t)nh + h] = s;
    }
}

// The sinks after a forward that had none (cuDNN's): with L0 = lse_i of the visible keys alone, the sink adds
// e^(sink_h) to the denominator, so lse_i = log(e^L0 + e^sink_h) and o_i ← o_i·e^(L0 − lse_i). One warp per
// (row, head); the backward then reads this o and lse like the generic kernels' (no other sink term).
template <typename T>
__global__ void attention_sinks_correct_kernel(T *o, float *lse, int B, int Sq, int nh, int DV, const float *sinks) {
    int64_t n = (int64_t)B * Sq * nh, warps = (int64_t)gridDim.x * blockDim.x / 32;
    int lane = threadIdx.x & 31;
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < n; w += warps) {
        int64_t row = w / nh, h = w % nh, b = row / Sq, i = row % Sq;
        float *lp = lse + (b * nh + h) * Sq + i, L0 = *lp, s = sinks[h];
        float m = fmaxf(L0, s), L = m + logf(expf(L0 - m) + expf(s - m)), f = expf(L0 - L); // L0 = −∞: f = 0
        T *op = o + (row * nh + h) * DV;
        for (int c = lane; c < DV; c += 32) st(op, c, ld(op, c) * f);
        __syncwarp();
        if (lane == 0) *lp = L;
    }
}

template <typename T, int DQK, int DV, int TPR>
static void attention_forward_launch(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, AttnParams p) {
    launch(attention_forward_kernel<T, DQK, DV, TPR>, dim3((p.Sq + ATT_ROWS - 1) / ATT_ROWS, B * p.nh), ATT_ROWS * TPR,
           ATT_TILE * (DQK + DV) * sizeof(float), (T *)o.p, (float *)lse.p, (const T *)q.p, (const T *)k.p,
           (const T *)v.p, p);
}

template <typename T, int DQK, int DV, int TPR>
static void attention_backward_launch(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                                      Tensor o, Tensor lse, int B, AttnParams p) {
    size_t smem_dq = ATT_TILE * (DQK + DV) * sizeof(float),
           smem_kv = (ATT_TILE * (DQK + DV) + 3 * ATT_TILE) * sizeof(float);
    if (p.Sq > 0)
        launch(attention_backward_dq_kernel<T, DQK, DV, TPR>, dim3((p.Sq + ATT_ROWS - 1) / ATT_ROWS, B * p.nh),
               ATT_ROWS * TPR, smem_dq, (T *)dq.p, (const T *)dout.p, (const T *)q.p, (const T *)k.p, (const T *)v.p,
               (const T *)o.p, (const float *)lse.p, p);
    if (p.Sk > 0)
        launch(attention_backward_dkdv_kernel<T, DQK, DV, TPR>, dim3((p.Sk + ATT_ROWS - 1) / ATT_ROWS, B * p.nkv),
               ATT_ROWS * TPR, smem_kv, (T *)dk.p, (T *)dv.p, (const T *)dout.p, (const T *)q.p, (const T *)k.p,
               (const T *)v.p, (const T *)o.p, (const float *)lse.p, p);
}

// The (q·k, v) head dims with a compiled kernel, and the threads that own one row for each (24/16 and 32/24:
// the tiny DeepSeek-V2 models of the GPU tests and HF fixtures, whose q·k dim is nope + rope).
// (clang-format does not settle on one layout for this list.)
// clang-format off
#define ATT_HEAD_DIMS(X)                                                                                   \
    X(8, 8, 1) X(16, 16, 1) X(32, 32, 2) X(64, 64, 4) X(96, 96, 4) X(128, 128, 8) X(192, 192, 8) X(256, 256, 8) \
    X(192, 128, 8) X(32, 16, 2) X(24, 16, 2) X(32, 24, 2)
// clang-format on

static AttnParams attention_params(Tensor q, Tensor k, Tensor v, const AttnArgs *a, const char *what) {
    int B = a->B;
    if (B < 1 || q.n[0] % B || k.n[0] % B || v.n[0] != k.n[0] || q.n[1] % k.n[1] || k.n[2] != q.n[2] ||
        v.n[1] != k.n[1])
        die("%s: shapes q (%lld, %lld, %lld), k (%lld, %lld, %lld), v (%lld, %lld, %lld), B %d do not fit GQA", what,
            (long long)q.n[0], (long long)q.n[1], (long long)q.n[2], (long long)k.n[0], (long long)k.n[1],
            (long long)k.n[2], (long long)v.n[0], (long long)v.n[1], (long long)v.n[2], B);
    if (q.dt != k.dt || q.dt != v.dt) die("%s: q, k, v must share a dtype", what);
    if (a->sinks.p && (a->sinks.dt != DT_F32 || tensor_numel(a->sinks) != q.n[1]))
        die("%s: sinks must be (nh) fp32", what);
    if (a->docpos.p && (a->docpos.dt != DT_I32 || tensor_numel(a->docpos) != q.n[0] || a->docpos.dev != DEV_CUDA))
        die("%s: docpos must be (B·Sq) = (%lld) int32 on the GPU", what, (long long)q.n[0]);
    AttnParams p = {(int)(q.n[0] / B),
                    (int)(k.n[0] / B),
                    (int)q.n[1],
                    (int)k.n[1],
                    a->window,
                    a->causal,
                    a->scale,
                    a->q_off,
                    a->k_off,
                    a->sinks.p ? (const float *)a->sinks.p : NULL,
                    a->docpos.p ? (const int32_t *)a->docpos.p : NULL};
    return p;
}

// The form cuDNN's graphs take: causal self-attention, a sliding window or none (cuda_cudnn.cu checks the head
// dims and the dtype), sinks by a correction after the forward, no document masking (its graphs have no per-query
// bound: pith's kernels skip the masked tiles); our tensor-core kernels: causal self-attention with one head dim,
// a window, sinks and documents or none of them.
static bool attention_self(Tensor q, Tensor k, const AttnArgs *a) {
    return a->causal && !a->q_off && !a->k_off && k.n[0] == q.n[0];
}
static bool attention_cudnn_form(Tensor q, Tensor k, const AttnArgs *a) {
    return !a->deterministic && !a->docpos.p && attention_self(q, k, a); // cuDNN's backward adds into dQ atomically
}

static const char *last_path = "none";

// The log-sum-exp merge of ops.h: one thread per (sequence, head, query row), its dv outputs in a loop.
template <typename T>
__global__ void attention_merge_kernel(float *o, float *lse, const T *o_p, const float *lse_p, int64_t Sq, int64_t nh,
                                       int64_t dv, int64_t rows, bool init) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = r % Sq, h = r / Sq % nh, b = r / (Sq * nh), off = ((b * Sq + i) * nh + h) * dv;
        float L = lse[r], Lp = lse_p[r];
        if (init || (L == -INFINITY && Lp != -INFINITY)) {
            for (int64_t c = 0; c < dv; c++) o[off + c] = ld(o_p, off + c);
            lse[r] = Lp;
            continue;
        }
        if (Lp == -INFINITY) continue;
        float m = fmaxf(L, Lp), a = expf(L - m), p = expf(Lp - m), s = a + p;
        for (int64_t c = 0; c < dv; c++) o[off + c] = (a * o[off + c] + p * ld(o_p, off + c)) / s;
        lse[r] = m + logf(s);
    }
}

extern "C" {

const char *cuda_attention_last_path(void) { return last_path; }

void cuda_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    AttnParams p = attention_params(q, k, v, a, "attention_forward");
    IS_F32(lse, "attention_forward");
    if (o.dt != q.dt) die("attention_forward: o must have q's dtype");
    int B = a->B, DQK = (int)q.n[2], DV = (int)v.n[2];
    if (p.Sq == 0) return;
    if (attention_cudnn_form(q, k, a)) {
        last_path = "cudnn"; // cuDNN's fused kernel (bf16, d ≤ 128, 256 or 192/128), window and sinks included
        if (cudnn_attention_forward(o, lse, q, k, v, B, p.Sq, p.scale, p.window)) {
            if (!p.sinks) return;
            int64_t threads = (int64_t)B * p.Sq * p.nh * 32;
            DT_SWITCH(q.dt, T, "attention_forward",
                      (attention_sinks_correct_kernel<T><<<grid_for(threads, 256), 256, 0, cuda_stream()>>>(
                          (T *)o.p, (float *)lse.p, B, p.Sq, p.nh, DV, p.sinks)));
            CUDA_LAUNCH_CHECK();
            return;
        }
    }
    if (attention_self(q, k, a)) {
        last_path = "flash"; // our tensor-core kernel (bf16, d 64/128/256, 192/128)
        if (flash_attention_forward(o, lse, q, k, v, B, p.Sq, p.scale, p.window, p.sinks, p.docpos)) return;
    }
    last_path = "generic";
#define FWD(dqk, dv, tpr)                                                                                              \
    if (DQK == dqk && DV == dv) {                                                                                      \
        DT_SWITCH(q.dt, T, "attention_forward", (attention_forward_launch<T, dqk, dv, tpr>(o, lse, q, k, v, B, p)));   \
        return;                                                                                                        \
    }
    ATT_HEAD_DIMS(FWD)
#undef FWD
    die("attention_forward: head dims (%d, %d) have no kernel (8, 16, 32, 64, 96, 128, 192, 256; 192/128, 32/16, "
        "24/16, 32/24)",
        DQK, DV);
}

void cuda_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a) {
    AttnParams p = attention_params(q, k, v, a, "attention_backward");
    if (dq.dt != q.dt || dk.dt != q.dt || dv.dt != q.dt || dout.dt != q.dt || o.dt != q.dt)
        die("attention_backward: dq, dk, dv, dout, o must have q's dtype");
    if (dsinks.p && (!a->sinks.p || dsinks.dt != DT_F32 || tensor_numel(dsinks) != p.nh))
        die("attention_backward: dsinks must be (nh) fp32, with sinks");
    int B = a->B, DQK = (int)q.n[2], DV = (int)v.n[2];
    if (p.Sq == 0 || p.Sk == 0) {
        if (p.Sq) cuda_zero(dq);
        if (p.Sk) cuda_zero(dk), cuda_zero(dv);
        return;
    }
    if (dsinks.p && DV > 0) { // pass 1's partials in the small pool, read by pass 2 at once
        int64_t R = (int64_t)B * p.Sq, g = colsum_groups(R, p.nh, SINK_WARPS * SINK_RB, SINK_BLOCKS),
                rpb = (R + g - 1) / g;
        int G = (int)((R + rpb - 1) / rpb);
        float *part = colsum_part(p.nh, G, "attention_backward (sinks)");
        size_t smem = (size_t)SINK_WARPS * p.nh * sizeof(float);
        DT_SWITCH(
            q.dt, T, "attention_backward",
            V_SWITCH(vec8_fits(DV, dout.p, o.p),
                     launch(attention_backward_sinks_kernel<T, V>, dim3(G), dim3(SINK_WARPS * 32), smem, part,
                            (const T *)dout.p, (const T *)o.p, (const float *)lse.p, R, rpb, p.Sq, p.nh, DV, p.sinks)));
        colsum_finish((float *)dsinks.p, part, G, p.nh);
    }
    if (attention_cudnn_form(q, k, a)) {
        last_path = "cudnn";
        if (cudnn_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, p.Sq, p.scale, p.window, a->ws)) return;
    }
    if (attention_self(q, k, a)) {
        last_path = "flash";
        if (flash_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, p.Sq, p.scale, p.window, p.docpos)) return;
    }
    last_path = "generic";
#define BWD(dqk, dv_, tpr)                                                                                             \
    if (DQK == dqk && DV == dv_) {                                                                                     \
        DT_SWITCH(q.dt, T, "attention_backward",                                                                       \
                  (attention_backward_launch<T, dqk, dv_, tpr>(dq, dk, dv, dout, q, k, v, o, lse, B, p)));             \
        return;                                                                                                        \
    }
    ATT_HEAD_DIMS(BWD)
#undef BWD
    die("attention_backward: head dims (%d, %d) have no kernel (8, 16, 32, 64, 96, 128, 192, 256; 192/128, 32/16, "
        "24/16, 32/24)",
        DQK, DV);
}

void cuda_attention_merge(Tensor o, Tensor lse, Tensor o_p, Tensor lse_p, int B, bool init) {
    ON_GPU(o, "attention_merge");
    ON_GPU(o_p, "attention_merge");
    IS_F32(o, "attention_merge");
    IS_F32(lse, "attention_merge");
    IS_F32(lse_p, "attention_merge");
    int64_t nh = o.n[1], dv = o.n[2], Sq = o.n[0] / B;
    if (B < 1 || Sq * B != o.n[0] || tensor_numel(o_p) != tensor_numel(o) || tensor_numel(lse) != B * nh * Sq ||
        tensor_numel(lse_p) != tensor_numel(lse))
        die("attention_merge: shapes do not match");
    int64_t rows = B * nh * Sq;
    if (!rows) return;
    DT_SWITCH(o_p.dt, T, "attention_merge",
              (attention_merge_kernel<T><<<grid_for(rows, 256), 256, 0, cuda_stream()>>>(
                  (float *)o.p, (float *)lse.p, (const T *)o_p.p, (const float *)lse_p.p, Sq, nh, dv, rows, init)));
    CUDA_LAUNCH_CHECK();
}

} // extern "C"
