// cuda_elem.cu — embedding, cross-entropy, elementwise helpers, copies across devices and dtypes, the
// squared-norm reduction and AdamW. Math as in ops/cpu/cpu_elem.c (and ops_list.h).
// Shapes: embedding table (V, H), tokens (T) int32, h (T, H); CE logits (R, V) fp32 in place, labels (R)
// int32, loss_sum (1) fp64; AdamW p flat fp32, g, m, v flat fp32 or bf16.
// Cross-entropy takes a row with a cluster of blocks that hold its logits in shared memory between the statistics and
// the gradient (each logit read once, written once); rows too long for that, or not in 8-logit vectors, split into
// slices of CE_SLICE logits: pass 1 gives each slice's (max, Σ exp) in one read (online per thread), pass 2
// combines a row's slices into its lse and overwrites the slice with the gradient (logits read twice). A last pass
// adds the rows' losses to loss_sum in a fixed order. Elementwise kernels move 16-byte vectors where sizes and alignment allow.
#include "ops/cuda/cuda_wgmma.cuh" // mbarriers, for the cross-entropy's bulk copy
#include <cooperative_groups.h>

extern "C" {
#include "ops/cpu/cpu_ops.h" // cpu_copy: the host side of a copy that crosses devices and dtypes
}

#define ELEM_THREADS 256

// The first token id outside [0, V) an embedding kernel met, as (1 << 32 | id); 0: none. The forward writes NaN
// in that row, so the step's own read-back of the loss finds it non-finite; only then does the host read this
// (cuda_embedding_bad_id) to name the id: no read-back of its own.
__device__ unsigned long long embedding_bad;
__device__ __forceinline__ bool embedding_id_bad(int32_t id, int64_t V) {
    if (id >= 0 && id < V) return false;
    atomicCAS(&embedding_bad, 0ULL, 1ULL << 32 | (uint32_t)id);
    return true;
}

// One thread per V values of h.
template <typename TH, typename TT, int V>
__global__ void embedding_forward_kernel(TH *h, const TT *table, const int32_t *tokens, int64_t T_, int64_t H,
                                         int64_t vocab) {
    GRID_STRIDE(e, T_ * H / V) {
        int64_t t = e * V / H, c = e * V % H;
        float v[V];
        if (embedding_id_bad(tokens[t], vocab))
            for (int k = 0; k < V; k++) v[k] = __int_as_float(0x7fc00000);
        else ldv<V>(table + (int64_t)tokens[t] * H + c, v);
        stv<V>(h + e * V, v);
    }
}

// dtable[v] += Σ_(t: tokens[t] = v) dh[t], t in order: one block per position t, which returns unless t is its
// token's first position, and else adds the rows of every position of that token, in order, to the table row —
// one writer per row, no atomics (tokens repeat), the same bits in every run. Each block scans the token list
// (T int32, cached) in chunks of EMB_THREADS: which earlier positions hold its token, then which later ones do
// (compacted in order into hit[]); a thread keeps EMB_COLS columns of the row in registers.
#define EMB_THREADS 256
#define EMB_COLS 8
template <typename T>
__global__ void embedding_backward_kernel(float *dtable, const T *dh, const int32_t *tokens, int64_t T_, int64_t H,
                                          int64_t V) {
    __shared__ int32_t hit[EMB_THREADS];
    __shared__ int warp_n[EMB_THREADS / 32];
    int64_t t = blockIdx.x;
    int32_t v = tokens[t];
    if (embedding_id_bad(v, V)) return; // (the flag names it; its row of the forward was NaN)
    for (int64_t u0 = 0; u0 < t; u0 += EMB_THREADS) {
        int64_t u = u0 + threadIdx.x;
        if (__syncthreads_or(u < t && tokens[u] == v)) return; // an earlier position's block adds this row
    }
    float *out = dtable + (int64_t)v * H;
    for (int64_t c0 = 0; c0 < H; c0 += EMB_THREADS * EMB_COLS) {
        float acc[EMB_COLS];
#pragma unroll
        for (int k = 0; k < EMB_COLS; k++) {
            int64_t c = c0 + k * EMB_THREADS + threadIdx.x;
            acc[k] = c < H ? out[c] : 0.0f;
        }
        for (int64_t u0 = t; u0 < T_; u0 += EMB_THREADS) {
            int64_t u = u0 + threadIdx.x;
            bool m = u < T_ && tokens[u] == v;
            int n, at = block_rank<EMB_THREADS>(m, warp_n, &n);
            if (m) hit[at] = (int32_t)(u - t);
            __syncthreads();
            for (int i = 0; i < n; i++) {
                const T *row = dh + (t + hit[i]) * H;
#pragma unroll
                for (int k = 0; k < EMB_COLS; k++) {
                    int64_t c = c0 + k * EMB_THREADS + threadIdx.x;
                    if (c < H) acc[k] += ld(row, c);
                }
            }
            __syncthreads(); // hit and warp_n are rewritten by the next chunk
        }
#pragma unroll
        for (int k = 0; k < EMB_COLS; k++) {
            int64_t c = c0 + k * EMB_THREADS + threadIdx.x;
            if (c < H) out[c] = acc[k];
        }
    }
}

#define CE_SLICE 8192 // logits per block in the cross-entropy passes
#define CE_THREADS 256

// Pass 1: part[r·ns + s] = (max, Σ exp(l − max)) over slice s of row r (an online max per thread).
// Logits are fp32 or bf16 (T); the statistics are fp32, the row's lse fp64.
template <typename T, bool VEC>
__global__ void cross_entropy_partial_kernel(float2 *part, const T *logits, const int32_t *labels, int64_t V, int ns) {
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    int64_t r = blockIdx.x, c0 = (int64_t)blockIdx.y * CE_SLICE, c1 = min(c0 + CE_SLICE, V);
    const T *l = logits + r * V;
    float m = -INFINITY, sum = 0.0f;
    if (labels[r] != -100) {
        if (VEC) {
            for (int64_t c = c0 + threadIdx.x * 8; c < c1; c += CE_THREADS * 8) {
                float v[8], mx = -INFINITY;
                ld8(l + c, v);
#pragma unroll
                for (int i = 0; i < 8; i++) mx = fmaxf(mx, v[i]);
                if (mx > m) sum *= expf(m - mx), m = mx;
#pragma unroll
                for (int i = 0; i < 8; i++) sum += expf(v[i] - m);
            }
        } else {
            for (int64_t c = c0 + threadIdx.x; c < c1; c += CE_THREADS) {
                float v = ld(l, c);
                if (v > m) sum *= expf(m - v), m = v;
                sum += expf(v - m);
            }
        }
    }
    float bm = warp_max(m); // combine the warp, then the block
    sum = warp_sum(m == -INFINITY ? 0.0f : sum * expf(m - bm));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sm[warp] = bm, ss[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = -INFINITY, Ssum = 0.0f;
        for (int w = 0; w < CE_THREADS / 32; w++) M = fmaxf(M, sm[w]);
        for (int w = 0; w < CE_THREADS / 32; w++)
            if (sm[w] != -INFINITY) Ssum += ss[w] * expf(sm[w] - M);
        part[r * ns + blockIdx.y] = make_float2(M, Ssum);
    }
}

// Pass 2: lse of row r from its ns partials (fp64), then slice s ← grad_scale·(softmax − onehot) in the
// logits' own dtype; the block holding the label writes row_loss[r] = lse − l[label] (0 for an ignored row).
template <typename T, bool VEC>
__global__ void cross_entropy_grad_kernel(T *logits, const float2 *part, const int32_t *labels, double *row_loss,
                                          int64_t V, int ns, float grad_scale) {
    __shared__ double lse_s;
    int64_t r = blockIdx.x, c0 = (int64_t)blockIdx.y * CE_SLICE, c1 = min(c0 + CE_SLICE, V);
    T *l = logits + r * V;
    int32_t y = labels[r];
    if (y == -100) {
        if (blockIdx.y == 0 && threadIdx.x == 0) row_loss[r] = 0;
        for (int64_t c = c0 + threadIdx.x; c < c1; c += CE_THREADS) st(l, c, 0.0f);
        return;
    }
    if (threadIdx.x == 0) {
        float M = -INFINITY;
        for (int i = 0; i < ns; i++) M = fmaxf(M, part[r * ns + i].x);
        double sum = 0;
        for (int i = 0; i < ns; i++) sum += (double)part[r * ns + i].y * exp((double)part[r * ns + i].x - M);
        lse_s = M + log(sum);
        if (y >= c0 && y < c1) row_loss[r] = lse_s - ld(l, y); // read before this block overwrites it
    }
    __syncthreads();
    float lse = (float)lse_s;
    if (VEC) {
        for (int64_t c = c0 + threadIdx.x * 8; c < c1; c += CE_THREADS * 8) {
            float v[8];
            ld8(l + c, v);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = grad_scale * expf(v[i] - lse);
            if (y >= c && y < c + 8) v[y - c] -= grad_scale;
            st8(l + c, v);
        }
    } else {
        for (int64_t c = c0 + threadIdx.x; c < c1; c += CE_THREADS) {
            float p = grad_scale * expf(ld(l, c) - lse);
            st(l, c, c == y ? p - grad_scale : p);
        }
    }
}

// One pass over a row (the common case): a cluster of CE_CLUSTER blocks takes row r, each block a slice of
// `slice` logits (a multiple of 8) that one bulk copy brings into its shared memory; the blocks trade their
// (max, Σ exp) through distributed shared memory, so each logit is read from memory once and written once. Every
// block adds the cluster's partials in one fixed order (fp64): all hold the same lse, whatever the launch.
#define CE_CLUSTER 8
#define CE_FUSED_THREADS 512
#define CE_FUSED_BYTES (64 << 10) // a slice's shared memory: rows up to 262,144 bf16 or 131,072 fp32 logits
// The largest of 8 consecutive logits (16-byte aligned): on bf16 pairs for bf16.
__device__ __forceinline__ float max8(const bf16 *p) {
    uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
    __nv_bfloat162 a = __hmax2(__hmax2(h[0], h[1]), __hmax2(h[2], h[3]));
    return fmaxf(__low2float(a), __high2float(a));
}
__device__ __forceinline__ float max8(const float *p) {
    float v[8];
    ld8(p, v);
    return fmaxf(fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3])), fmaxf(fmaxf(v[4], v[5]), fmaxf(v[6], v[7])));
}
static inline int64_t ce_fused_slice(int64_t V) { return ((V + CE_CLUSTER - 1) / CE_CLUSTER + 7) / 8 * 8; }

template <typename T>
__global__ void __cluster_dims__(CE_CLUSTER, 1, 1) __launch_bounds__(CE_FUSED_THREADS)
    cross_entropy_fused_kernel(T *logits, const int32_t *labels, double *row_loss, int64_t V, int64_t slice,
                               float grad_scale) {
    extern __shared__ __align__(128) unsigned char ce_smem[]; // this block's slice, as loaded
    __shared__ __align__(8) uint64_t full;                    // completes when the slice has landed
    __shared__ float2 part; // this block's (max, Σ exp(l − max)): the cluster reads it
    __shared__ float sm[CE_FUSED_THREADS / 32], ss[CE_FUSED_THREADS / 32], y_logit;
    __shared__ double lse_s;
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    int64_t r = blockIdx.y, c0 = (int64_t)cluster.block_rank() * slice;
    T *l = logits + r * V + c0; // this block's n logits
    const T *x = (const T *)ce_smem;
    int n = (int)max(min(c0 + slice, V) - c0, (int64_t)0), y = labels[r];
    if (y == -100) { // the whole cluster sees the same label: no cluster barrier to keep
        if (c0 == 0 && threadIdx.x == 0) row_loss[r] = 0;
        float z[8] = {};
        for (int c = threadIdx.x * 8; c < n; c += CE_FUSED_THREADS * 8) st8(l + c, z);
        return;
    }
    y -= (int)c0; // the label's offset in this slice (outside [0, n): another block's)
    uint32_t bar = sh_addr(&full);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        mbar_expect(bar, n * (int)sizeof(T));
        if (n)
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                    sh_addr(ce_smem)),
                "l"(l), "r"(n * (int)sizeof(T)), "r"(bar)
                : "memory");
    }
    __syncthreads(); // the barrier is initialised
    mbar_wait(bar, 0);
    // exp(l − m) as 2^(l·log2 e − m·log2 e): one fused multiply-add and the hardware's 2^x a logit. This thread's
    // max first (on bf16 pairs where the logits are bf16), so the sum needs no rescaling.
    const float L2E = 1.4426950408889634f;
    float m = -INFINITY, sum = 0.0f;
    for (int c = threadIdx.x * 8; c < n; c += CE_FUSED_THREADS * 8) m = fmaxf(m, max8(x + c));
    float ml = m * L2E;
    for (int c = threadIdx.x * 8; c < n; c += CE_FUSED_THREADS * 8) {
        float v[8];
        ld8(x + c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) sum += exp2f(fmaf(v[j], L2E, -ml));
        if ((unsigned)(y - c) < 8u) y_logit = ld(x, y);
    }
    float bm = warp_max(m); // combine the warp, then the block's warps and the cluster's blocks on one warp each
    sum = warp_sum(m == -INFINITY ? 0.0f : sum * expf(m - bm));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sm[warp] = bm, ss[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        bool w = lane < CE_FUSED_THREADS / 32;
        float wm = w ? sm[lane] : -INFINITY, wsum = w ? ss[lane] : 0.0f, M = warp_max(wm);
        float S = warp_sum(wm == -INFINITY ? 0.0f : wsum * expf(wm - M));
        if (lane == 0) part = make_float2(M, S);
    }
    cluster.sync();  // every block's part is written
    if (warp == 0) { // lane b reads block b's part; the sums' fixed order gives every block the same lse
        float2 p = lane < CE_CLUSTER ? *cluster.map_shared_rank(&part, lane) : make_float2(-INFINITY, 0.0f);
        float M = warp_max(p.x);
        double s = warp_sum(p.x == -INFINITY ? 0.0 : (double)p.y * exp((double)p.x - M));
        if (lane == 0) {
            lse_s = M + log(s);
            if (y >= 0 && y < n) row_loss[r] = lse_s - y_logit;
        }
    }
    // No block leaves while another may still read its part: arrive now, wait before the end.
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    __syncthreads();
    float lse2 = (float)(lse_s * (double)L2E);
    for (int c = threadIdx.x * 8; c < n; c += CE_FUSED_THREADS * 8) {
        float v[8];
        ld8(x + c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = grad_scale * exp2f(fmaf(v[j], L2E, -lse2));
        if ((unsigned)(y - c) < 8u) // the label's vector
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] -= c + j == y ? grad_scale : 0.0f;
        st8(l + c, v);
    }
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Pass 3: loss_sum += Σ_r row_loss[r] in one block's fixed order (no atomics: the same bits in every run).
__global__ void cross_entropy_sum_kernel(double *loss_sum, const double *row_loss, int64_t R) {
    __shared__ double sd[32];
    double s = 0;
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) s += row_loss[r];
    s = block_sum(s, sd);
    if (threadIdx.x == 0) *loss_sum += s;
}

// The flat elementwise ops over n elements, dst ← src (EL_COPY, converting dtype), dst + src (EL_ADD) or dst·s
// (EL_SCALE, src unread): 8-element vectors when the launcher found every pointer 16-byte aligned (vec), then the last
// n % 8 one by one; unaligned views (a tensor at an odd offset of a flat parameter buffer) run element by element.
enum { EL_COPY, EL_ADD, EL_SCALE };
template <int OP> __device__ __forceinline__ float el_op(float d, float x, float s) {
    return OP == EL_COPY ? x : OP == EL_ADD ? d + x : d * s;
}
template <int OP, typename TD, typename TS>
__global__ void elementwise_kernel(TD *dst, const TS *src, float s, int64_t n, bool vec) {
    int64_t n8 = vec ? n / 8 : 0;
    GRID_STRIDE(i, n8) {
        float a[8] = {0}, b[8] = {0};
        if (OP != EL_COPY) ld8(dst + i * 8, a);
        if (OP != EL_SCALE) ld8(src + i * 8, b);
#pragma unroll
        for (int q = 0; q < 8; q++) a[q] = el_op<OP>(a[q], b[q], s);
        st8(dst + i * 8, a);
    }
    GRID_STRIDE(i, n - n8 * 8) {
        int64_t j = n8 * 8 + i;
        st(dst, j, el_op<OP>(OP == EL_COPY ? 0.0f : ld(dst, j), OP == EL_SCALE ? 0.0f : ld(src, j), s));
    }
}
// The column blocks of op_copy_col_blocks (pointers at the first blocks' first columns): a thread takes V columns of
// one row and one destination block (units: rows × destination blocks × n / V), and for da = 0 sums the reps source
// blocks in order in fp32, rounding once. I: the index type, 32-bit where the units fit.
typedef struct {
    int64_t Cd, da, Cs, db, R, n, reps;
} ColBlocks;
template <typename TD, typename TS, int V, typename I>
__global__ void copy_col_blocks_kernel(TD *dst, const TS *src, ColBlocks s, bool acc) {
    I nv = (I)(s.n / V), blocks = s.da ? (I)s.reps : 1, units = (I)s.R * blocks * nv;
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < units; i += (I)gridDim.x * blockDim.x) {
        I r = i / (blocks * nv), h = i / nv % blocks, c = i % nv * V;
        TD *d = dst + r * s.Cd + h * s.da + c;
        const TS *x = src + r * s.Cs + h * s.db + c;
        float v[V], t[V];
        ldv<V>(x, v);
        if (acc) {
            ldv<V>((const TD *)d, t);
#pragma unroll
            for (int q = 0; q < V; q++) v[q] = t[q] + v[q];
        }
        for (int64_t k = 1; !s.da && k < s.reps; k++) {
            ldv<V>(x + k * s.db, t);
#pragma unroll
            for (int q = 0; q < V; q++) v[q] += t[q];
        }
        stv<V>(d, v);
    }
}
// AdamW of one parameter (the update of ops/cpu/cpu_elem.c).
__device__ __forceinline__ void adamw_one(float &p, float g, float &m, float &v, float b1, float b2, float eps,
                                          float step, float bc2, float decay) {
    float mi = m + (1.0f - b1) * (g - m), vi = b2 * v + (1.0f - b2) * g * g;
    m = mi, v = vi;
    p = p * decay - step * mi / (sqrtf(vi) / bc2 + eps);
}
// The compute copy of four new parameters (w: fp32 or bf16; 16-byte aligned when vec).
__device__ __forceinline__ void st4(float *w, float4 p) { *(float4 *)w = p; }
__device__ __forceinline__ void st4(bf16 *w, float4 p) {
    __nv_bfloat162 a = __floats2bfloat162_rn(p.x, p.y), b = __floats2bfloat162_rn(p.z, p.w);
    *(uint2 *)w = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
}
// Four moments or gradients as fp32 (fp32 or bf16, 16-byte aligned when vec), and the value a moment keeps once stored.
__device__ __forceinline__ float4 ld4(const float *m) { return *(const float4 *)m; }
__device__ __forceinline__ float4 ld4(const bf16 *m) {
    uint2 u = *(const uint2 *)m;
    float2 a = __bfloat1622float2(*(__nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(__nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float kept(const float *, float x) { return x; }
__device__ __forceinline__ float kept(const bf16 *, float x) { return __bfloat162float(__float2bfloat16(x)); }
// Set by adamw_kernel when it writes a p or v that is not finite (every writer writes 1: no race that matters);
// cuda_adamw_nonfinite reads and clears it.
__device__ int adamw_bad;

// One pass over the flat buffers: 4 parameters per thread (float4 loads of p, g; 4 moments of m, v) when vec, then
// the last n % 4 one by one; the gradient (TG: fp32 or bf16) is read as gscale·g; m, v (TM: fp32 or bf16) are stored
// in their dtype; w (NULL: none) gets the new parameters in its dtype.
// Bytes: 16 read and 12 written per parameter with fp32 moments (12 and 8 with bf16), + 2 or 4 for the compute copy
// (the floor of the step).
template <typename TG, typename TM, typename TW>
__global__ void adamw_kernel(float *p, const TG *g, TM *m, TM *v, TW *w, int64_t n, bool vec, float gscale, float b1,
                             float b2, float eps, float step, float bc2, float decay) {
    int64_t n4 = vec ? n / 4 : 0;
    bool bad = false;
    GRID_STRIDE(i, n4) {
        float4 P = ((float4 *)p)[i], G = ld4(g + 4 * i), M = ld4(m + 4 * i), Vv = ld4(v + 4 * i);
        float *pp = &P.x, *gg = &G.x, *mm = &M.x, *vv = &Vv.x;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            adamw_one(pp[q], gscale * gg[q], mm[q], vv[q], b1, b2, eps, step, bc2, decay);
            bad |= !isfinite(pp[q]) || !isfinite(kept(v, vv[q]));
        }
        ((float4 *)p)[i] = P;
        st4(m + 4 * i, M), st4(v + 4 * i, Vv);
        if (w) st4(w + 4 * i, P);
    }
    GRID_STRIDE(i, n - n4 * 4) {
        int64_t j = n4 * 4 + i;
        float mj = ld(m, j), vj = ld(v, j);
        adamw_one(p[j], gscale * ld(g, j), mj, vj, b1, b2, eps, step, bc2, decay);
        st(m, j, mj), st(v, j, vj);
        bad |= !isfinite(p[j]) || !isfinite(kept(v, vj));
        if (w) st(w, j, p[j]);
    }
    if (bad) adamw_bad = 1;
}

// Σ x² in fp64, one partial per block into out[block] (the host adds them in block order: the same bits in every
// run); four values a load when vec (16-byte aligned: float4 of fp32, 8 bytes of bf16), four
// of them issued before the first is used (64 bytes in flight per thread: one load at a time read the optimizer
// step's 22 GB of gradients at 3.4 TB/s, short of the copy rate).
__device__ __forceinline__ double sq4(float4 v) {
    return (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
}
template <typename T> __global__ void sum_squares_kernel(double *out, const T *x, int64_t n, bool vec) {
    __shared__ double sd[32];
    double s = 0;
    int64_t n4 = vec ? n / 4 : 0, stride = (int64_t)gridDim.x * blockDim.x,
            i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        float4 a = ld4(x + 4 * i), b = ld4(x + 4 * (i + stride)), c = ld4(x + 4 * (i + 2 * stride)),
               d = ld4(x + 4 * (i + 3 * stride));
        s += sq4(a) + sq4(b) + sq4(c) + sq4(d);
    }
    for (; i < n4; i += stride) s += sq4(ld4(x + 4 * i));
    GRID_STRIDE(i, n - n4 * 4) {
        double v = ld(x, n4 * 4 + i);
        s += v * v;
    }
    s = block_sum(s, sd);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// A device flag's value, read back (a sync), and the flag cleared.
template <typename T> static T take_flag(T &flag) {
    T v = 0, zero = 0;
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&v, flag, sizeof v, 0, cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaMemcpyToSymbolAsync(flag, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, cuda_stream()));
    cuda_host_wait(cuda_stream());
    return v;
}

template <int OP> static void elementwise(Tensor dst, Tensor src, float s, const char *what) {
    int64_t n = tensor_numel(dst);
    CHECK(tensor_numel(src) == n);
    if (!n) return;
    bool vec = aligned16(dst.p, src.p);
    DT_SWITCH(dst.dt, TD, what,
              DT_SWITCH(src.dt, TS, what,
                        elementwise_kernel<OP, TD, TS>
                        <<<grid_for(vec ? n / 8 : n, ELEM_THREADS), ELEM_THREADS, 0, cuda_stream()>>>(
                            (TD *)dst.p, (const TS *)src.p, s, n, vec)));
    CUDA_LAUNCH_CHECK();
}

extern "C" {

void cuda_embedding_forward(Tensor h, Tensor table, Tensor tokens) {
    int64_t T_ = t_rows(h), H = t_cols(h), vocab = t_rows(table);
    CHECK(t_cols(table) == H && tensor_numel(tokens) == T_);
    if (T_ * H == 0) return;
    // V = 1 serves tables that are unaligned views (an unpadded offset of the flat parameter buffer) or odd widths.
    V_SWITCH(vec8_fits(H, h.p, table.p),
             DT_SWITCH(h.dt, TH, "embedding_forward",
                       DT_SWITCH(table.dt, TT, "embedding_forward",
                                 embedding_forward_kernel<TH, TT, V>
                                 <<<grid_for(T_ * H / V, ELEM_THREADS), ELEM_THREADS, 0, cuda_stream()>>>(
                                     (TH *)h.p, (const TT *)table.p, (const int32_t *)tokens.p, T_, H, vocab))));
    CUDA_LAUNCH_CHECK();
}

void cuda_embedding_backward(Tensor dtable, Tensor dh, Tensor tokens) {
    int64_t T_ = t_rows(dh), H = t_cols(dh);
    IS_F32(dtable, "embedding_backward");
    if (T_ * H == 0) return;
    if (T_ > 0x7fffffff) die("embedding_backward: %lld positions exceed int32", (long long)T_);
    DT_SWITCH(dh.dt, T, "embedding_backward",
              embedding_backward_kernel<T><<<(unsigned)T_, EMB_THREADS, 0, cuda_stream()>>>(
                  (float *)dtable.p, (const T *)dh.p, (const int32_t *)tokens.p, T_, H, t_rows(dtable)));
    CUDA_LAUNCH_CHECK();
}

int64_t cuda_embedding_bad_id(void) {
    unsigned long long bad = take_flag(embedding_bad);
    return bad ? (int64_t)(int32_t)(uint32_t)bad : -1;
}

void cuda_cross_entropy(Tensor logits, Tensor labels, Tensor loss_sum, Tensor row_loss, float grad_scale) {
    int64_t R = t_rows(logits), V = t_cols(logits);
    CHECK(loss_sum.dt == DT_F64 && tensor_numel(labels) == R);
    CHECK(!row_loss.p || (row_loss.dt == DT_F64 && row_loss.dev == DEV_CUDA && tensor_numel(row_loss) == R));
    if (R == 0 || V == 0) return;
    int ns = (int)((V + CE_SLICE - 1) / CE_SLICE);
    if (R > 65535 || ns > 65535)
        die("cross_entropy: a chunk of %lld rows of %lld logits is too large (at most 65535 rows)", (long long)R,
            (long long)V);
    // The rows' losses go to row_loss when it is wanted, else to scratch before the partials.
    double *rows = (double *)cuda_scratch((size_t)R * sizeof(double) + (size_t)R * ns * sizeof(float2));
    float2 *part = (float2 *)(rows + R);
    if (row_loss.p) rows = (double *)row_loss.p;
    dim3 grid((unsigned)R, (unsigned)ns);
    const int32_t *lab = (const int32_t *)labels.p;
    DT_SWITCH(logits.dt, T, "cross_entropy", {
        T *l = (T *)logits.p;
        if (vec8_fits(V, l) && ce_fused_slice(V) * (int64_t)sizeof(T) <= CE_FUSED_BYTES) { // one read, one write
            launch(cross_entropy_fused_kernel<T>, dim3(CE_CLUSTER, (unsigned)R), dim3(CE_FUSED_THREADS),
                   (size_t)(ce_fused_slice(V) * sizeof(T)), l, lab, rows, V, ce_fused_slice(V), grad_scale);
        } else { // two passes; the scalar instance serves ragged vocabularies (50257, 3001)
            BOOL_SWITCH(vec8_fits(V, l), VEC, {
                cross_entropy_partial_kernel<T, VEC><<<grid, CE_THREADS, 0, cuda_stream()>>>(part, l, lab, V, ns);
                CUDA_LAUNCH_CHECK();
                cross_entropy_grad_kernel<T, VEC>
                    <<<grid, CE_THREADS, 0, cuda_stream()>>>(l, part, lab, rows, V, ns, grad_scale);
            });
        }
    });
    CUDA_LAUNCH_CHECK();
    cross_entropy_sum_kernel<<<1, 1024, 0, cuda_stream()>>>((double *)loss_sum.p, rows, R);
    CUDA_LAUNCH_CHECK();
}

void cuda_zero(Tensor x) {
    if (tensor_bytes(x)) CUDA_CHECK(cudaMemsetAsync(x.p, 0, tensor_bytes(x), cuda_stream()));
}

void cuda_add(Tensor y, Tensor x) { elementwise<EL_ADD>(y, x, 0.0f, "add"); }
void cuda_scale(Tensor x, float s) { elementwise<EL_SCALE>(x, x, s, "scale"); }

// Same shape; any direction between host and device. Dtype conversion fp32 ↔ bf16 on the device for
// device → device copies, on the host otherwise. Copies that touch host memory wait for the stream, so the
// host buffer may be reused or freed when this returns.
void cuda_copy(Tensor dst, Tensor src) {
    int64_t n = tensor_numel(src);
    CHECK(tensor_numel(dst) == n);
    if (!n) return;
    cudaStream_t s = cuda_stream();
    bool dd = dst.dev == DEV_CUDA && src.dev == DEV_CUDA;
    if (dst.dt == src.dt) {
        cudaMemcpyKind kind = dd                    ? cudaMemcpyDeviceToDevice
                              : dst.dev == DEV_CUDA ? cudaMemcpyHostToDevice
                                                    : cudaMemcpyDeviceToHost;
        CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, tensor_bytes(src), kind, s));
        if (!dd) cuda_host_wait(s);
        return;
    }
    if (dd) return elementwise<EL_COPY>(dst, src, 0.0f, "copy");
    Tensor h = dst.dev == DEV_CUDA ? dst : src; // the device side's contents on the host, converted there
    h.dev = DEV_CPU, h.p = xmalloc(tensor_bytes(h));
    if (dst.dev == DEV_CUDA) cpu_copy(h, src);
    CUDA_CHECK(dst.dev == DEV_CUDA ? cudaMemcpyAsync(dst.p, h.p, tensor_bytes(h), cudaMemcpyHostToDevice, s)
                                   : cudaMemcpyAsync(h.p, src.p, tensor_bytes(h), cudaMemcpyDeviceToHost, s));
    cuda_host_wait(s);
    if (src.dev == DEV_CUDA) cpu_copy(dst, h);
    free(h.p);
}

double cuda_sum_squares(Tensor x) {
    int64_t n = tensor_numel(x);
    if (!n) return 0;
    CudaCtx *c = cuda_ctx();
    unsigned grid = (unsigned)(c->sm_count * 4);
    if ((int64_t)grid * ELEM_THREADS > n) grid = grid_for(n, ELEM_THREADS);
    CHECK(grid * sizeof(double) <= CUDA_SMALL_BYTES);
    DT_SWITCH(x.dt, T, "sum_squares",
              sum_squares_kernel<T>
              <<<grid, ELEM_THREADS, 0, c->compute>>>((double *)c->small, (const T *)x.p, n, aligned16(x.p)));
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(c->host_small, c->small, grid * sizeof(double), cudaMemcpyDeviceToHost, c->compute));
    cuda_host_wait(c->compute);
    double s = 0;
    for (unsigned b = 0; b < grid; b++) s += ((const double *)c->host_small)[b];
    return s;
}

void cuda_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
                float wd, int t) {
    int64_t n = tensor_numel(p);
    IS_F32(p, "adamw");
    CHECK(tensor_numel(g) == n && tensor_numel(m) == n && tensor_numel(v) == n);
    if (!n) return;
    float step = (float)(lr / (1.0 - pow(b1, t))), bc2 = (float)sqrt(1.0 - pow(b2, t)), decay = 1.0f - lr * wd;
    bool vec = aligned16(p.p, g.p, m.p, v.p) && aligned16(w.p);
    DT_SWITCH(g.dt, TG, "adamw",
              DT_SWITCH(m.dt, TM, "adamw",
                        DT_SWITCH(w.p ? w.dt : DT_F32, TW, "adamw", // (no compute copy: w NULL, typed fp32)
                                  adamw_kernel<TG, TM, TW>
                                  <<<grid_for(vec ? n / 4 : n, ELEM_THREADS), ELEM_THREADS, 0, cuda_stream()>>>(
                                      (float *)p.p, (const TG *)g.p, (TM *)m.p, (TM *)v.p, (TW *)w.p, n, vec, gscale,
                                      b1, b2, eps, step, bc2, decay))));
    CUDA_LAUNCH_CHECK();
}

bool cuda_adamw_nonfinite(void) { return take_flag(adamw_bad) != 0; }

double cuda_read_scalar(Tensor x) {
    CudaCtx *c = cuda_ctx();
    CHECK(x.dt == DT_F64 || x.dt == DT_F32);
    CUDA_CHECK(cudaMemcpyAsync(c->host_small, x.p, dtype_size(x.dt), cudaMemcpyDeviceToHost, c->compute));
    cuda_host_wait(c->compute);
    return x.dt == DT_F64 ? *(double *)c->host_small : *(float *)c->host_small;
}

// Shapes checked by op_copy_col_blocks.
void cuda_copy_col_blocks(Tensor dst, int64_t a, int64_t da, Tensor src, int64_t b, int64_t db, int64_t n, int64_t reps,
                          bool accumulate) {
    ColBlocks s = {t_cols(dst), da, t_cols(src), db, t_rows(dst), n, reps};
    bool vec = n % 8 == 0 && (a | da | s.Cd | b | db | s.Cs) % 8 == 0 && aligned16(dst.p, src.p);
    int64_t units = s.R * (da ? reps : 1) * (vec ? n / 8 : n);
    DT_SWITCH(dst.dt, TD, "copy_col_blocks",
              DT_SWITCH(src.dt, TS, "copy_col_blocks",
                        V_SWITCH(vec, BOOL_SWITCH(units < INT32_MAX, NARROW, {
                                     typedef typename std::conditional<NARROW, uint32_t, int64_t>::type I;
                                     copy_col_blocks_kernel<TD, TS, V, I>
                                         <<<grid_for(units, 256), 256, 0, cuda_stream()>>>(
                                             (TD *)dst.p + a, (const TS *)src.p + b, s, accumulate);
                                 }))));
    CUDA_LAUNCH_CHECK();
}

} // extern "C"
