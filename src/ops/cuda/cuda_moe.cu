// cuda_moe.cu — router (every RouterArgs form), load-balancing loss, the expert sort, row gather/scatter
// and the weighted combine. Math as in ops/cpu/cpu_moe.c, in the same order of operations (the softmax's
// exponentials and sums in fp64, as the CPU's, so both pick the same experts).
// Shapes: logits, probs, dlogits (T, E) fp32; idx (T, k) int32; w, dw (T, k) fp32; lb_grad (E) fp32;
// rows/perm/at int32; x, y (R, H) activations; combine y (T·k, H) in slot order, or in expert order read through at.
// The row movers (gather, scatter, combine) move 16-byte vectors (8 values) per thread when rows allow
// it. scatter_add_rows inverts the row map once (a scratch of T·div int32) and sums each token's rows
// in fp32 in one pass, in slot order — no atomics, one rounding, the same bits in every run; a map that is not
// injective (expert parallelism's per-rank sums, where a token's kept slots share a row) takes the atomic path.
#include "ops/cuda/cuda_common.cuh"

#define MOE_WARPS 8 // tokens per block: one warp per token

// What the router kernels need of RouterArgs.
typedef struct {
    int E, k, n_group, topk_group;
    bool renorm, softmax_topk, force_balance;
    float scale;
    const float *bias; // (E) or NULL
    bool sigmoid;      // probs = sigmoid(logits) (else the softmax)
} RouterParams;
#define ROUTER_KMAX 32

// The best untaken entry of v[0..n) (−∞ marks taken or excluded ones), ties → lower index, in every lane.
// An index below n even when no value is above −∞ or some are NaN (a diverged router), so a caller never indexes past
// its row; on finite values the first of the largest.
__device__ __forceinline__ int warp_argmax(const float *v, int n, int lane) {
    float bv = -INFINITY;
    int best = INT_MAX; // none seen
    for (int e = lane; e < n; e += 32)
        if (best == INT_MAX || v[e] > bv) bv = v[e], best = e;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oe = __shfl_xor_sync(0xffffffffu, best, o);
        if (oe != INT_MAX && (best == INT_MAX || ov > bv || (ov == bv && oe < best))) bv = ov, best = oe;
    }
    return best;
}

// One warp per token. Shared memory per warp: probs (E), selection scores (E), group scores (n_group).
__global__ void router_forward_kernel(float *probs, int32_t *idx, float *w, const float *logits, int64_t T_,
                                      RouterParams a) {
    extern __shared__ float sm_all[];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, E = a.E, k = a.k, G = a.n_group > 1 ? a.n_group : 1;
    int64_t t = blockIdx.x * (int64_t)MOE_WARPS + wid;
    if (t >= T_) return;
    float *pp = sm_all + (size_t)wid * (2 * E + G), *sc = pp + E, *gs = sc + E;
    const float *l = logits + t * E;
    float m = -INFINITY;
    double sum = 0;
    if (!a.sigmoid) {
        for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
        m = warp_max(m);
        for (int e = lane; e < E; e += 32) sum += exp((double)l[e] - m);
        sum = warp_sum(sum);
    }
    for (int e = lane; e < E; e += 32) {
        float p = a.sigmoid ? (float)(1 / (1 + exp(-(double)l[e]))) : (float)(exp((double)l[e] - m) / sum);
        probs[t * E + e] = pp[e] = p;
        sc[e] = a.bias ? p + a.bias[e] : p;
    }
    __syncwarp();
    int ix[ROUTER_KMAX];
    if (a.force_balance) {
        for (int j = 0; j < k; j++) ix[j] = (int)((t + (int64_t)j * (E / k)) % E);
    } else {
        if (G > 1) { // keep the topk_group groups of the best scores, exclude the others' experts
            int per = E / G;
            for (int g = lane; g < G; g += 32) {
                float gm = -INFINITY;
                for (int e = g * per; e < (g + 1) * per; e++) gm = fmaxf(gm, sc[e]);
                gs[g] = gm;
            }
            __syncwarp();
            uint64_t keep = 0;
            for (int r = 0; r < a.topk_group; r++) {
                int g = warp_argmax(gs, G, lane);
                keep |= 1ull << g;
                __syncwarp();
                if (lane == 0) gs[g] = -INFINITY;
                __syncwarp();
            }
            for (int e = lane; e < E; e += 32)
                if (!(keep >> (e / per) & 1)) sc[e] = -INFINITY;
            __syncwarp();
        }
        for (int j = 0; j < k; j++) {
            ix[j] = warp_argmax(sc, E, lane);
            __syncwarp();
            if (lane == 0) sc[ix[j]] = -INFINITY;
            __syncwarp();
        }
    }
    if (lane) return;
    // the weights, in the CPU's order of operations
    if (a.softmax_topk) {
        float mk = -INFINITY;
        for (int j = 0; j < k; j++) mk = fmaxf(mk, l[ix[j]]);
        double sk = 0;
        for (int j = 0; j < k; j++) sk += exp((double)l[ix[j]] - mk);
        for (int j = 0; j < k; j++)
            idx[t * k + j] = ix[j], w[t * k + j] = (float)(exp((double)l[ix[j]] - mk) / sk) * a.scale;
        return;
    }
    double s = 0;
    for (int j = 0; j < k; j++) s += pp[ix[j]];
    for (int j = 0; j < k; j++)
        idx[t * k + j] = ix[j], w[t * k + j] = (a.renorm ? (float)(pp[ix[j]] / s) : pp[ix[j]]) * a.scale;
}

__global__ void router_backward_kernel(float *dlogits, const float *dw, const float *lb_grad, const float *probs,
                                       const int32_t *idx, const float *w, int64_t T_, RouterParams a) {
    extern __shared__ double dp_all[];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, E = a.E, k = a.k;
    int64_t t = blockIdx.x * (int64_t)MOE_WARPS + wid;
    if (t >= T_) return;
    double *dp = dp_all + wid * E, c = a.scale;
    const float *p = probs + t * E, *g = dw + t * k, *wt = w + t * k;
    const int32_t *ix = idx + t * k;
    for (int e = lane; e < E; e += 32) dp[e] = lb_grad ? lb_grad[e] : 0.0;
    __syncwarp();
    double s = 0, gw = 0;
    for (int j = 0; j < k; j++) s += p[ix[j]], gw += (double)g[j] * wt[j];
    if (lane == 0 && !a.softmax_topk)
        for (int j = 0; j < k; j++) dp[ix[j]] += a.renorm ? (c * g[j] - gw) / s : c * g[j];
    __syncwarp();
    double dot = 0;
    if (!a.sigmoid) {
        for (int e = lane; e < E; e += 32) dot += p[e] * dp[e];
        dot = warp_sum(dot);
    }
    float *dl = dlogits + t * E;
    for (int e = lane; e < E; e += 32) dl[e] = (float)(a.sigmoid ? p[e] * (1.0 - p[e]) * dp[e] : p[e] * (dp[e] - dot));
    __syncwarp();
    if (lane == 0 && a.softmax_topk) // ∂ through the softmax over the selected logits
        for (int j = 0; j < k; j++) dl[ix[j]] += (float)(wt[j] * (g[j] - gw / c));
}

// An expert index outside [0, E) counts and sorts as the nearest valid one (op_moe_sort flags it).
__device__ __forceinline__ int32_t sort_key(int32_t v, int E) { return v < 0 ? 0 : v >= E ? E - 1 : v; }

// Expert counts: cnt[e] += #slots routed to e (fp64 atomic adds of 1: whole numbers, exact in any order).
// Load balancing: the same into the small pool, and pm: (G, E) there, row g = Σ over token group g of probs[t, e] (one
// writer each; the finish adds the G rows in order).
__global__ void moe_count_kernel(double *cnt, const int32_t *idx, int64_t n, int E) {
    GRID_STRIDE(i, n) atomicAdd(cnt + sort_key(idx[i], E), 1.0);
}
__global__ void moe_lb_colsum_kernel(double *pm, const float *probs, int64_t T_, int64_t E) {
    colsum_block(pm, T_, E, [=](int64_t t, int64_t e) { return probs[t * E + e]; });
}
__global__ void moe_lb_finish_kernel(double *loss_sum, float *lb_grad, const double *cnt, const double *pm, int G,
                                     int64_t T_, int E, int k, float coef, float grad_scale) {
    __shared__ double sd[32];
    double loss = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double f = T_ ? cnt[e] / (double)(T_ * k) : 0, p = 0;
        for (int g = 0; g < G; g++) p += pm[(int64_t)g * E + e];
        loss += (double)coef * E * f * (T_ ? p / T_ : 0);
        lb_grad[e] = T_ ? (float)((double)grad_scale * coef * E * f / T_) : 0.0f;
    }
    loss = block_sum(loss, sd);
    if (threadIdx.x == 0) *loss_sum += loss;
}

// Stable counting sort of the n (token, slot) entries by expert, over tiles of MOE_SORT_TILE entries in three
// launches: each tile's count of every expert (shared integer atomics: exact in any order); one block's offsets, offs[e]
// = the entries of the experts before e, and each (tile, expert)'s first place, base[t·E + e] = offs[e] + expert e's
// entries in the tiles before t; then one warp a tile walks its entries in order and puts each at its expert's next
// place (a warp's equal experts ranked by lane, __match_any_sync), and that place into the inverse when asked. An
// index outside [0, E) sorts as the nearest valid one (so that perm stays a permutation and every later op stays in
// bounds) and sets moe_sort_bad = 1 << 32 | index (one of them), which cuda_moe_sort_bad_expert reads.
#define MOE_SORT_TILE 1024
__device__ unsigned long long moe_sort_bad;
__global__ void moe_sort_count_kernel(int *cnt, const int32_t *idx, int64_t n, int E) {
    extern __shared__ int sc[]; // E
    for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = 0;
    __syncthreads();
    int64_t t0 = (int64_t)blockIdx.x * MOE_SORT_TILE, t1 = t0 + MOE_SORT_TILE < n ? t0 + MOE_SORT_TILE : n;
    for (int64_t i = t0 + threadIdx.x; i < t1; i += blockDim.x) {
        int32_t v = idx[i];
        if (v < 0 || v >= E) atomicCAS(&moe_sort_bad, 0ull, 1ull << 32 | (uint32_t)v);
        atomicAdd(sc + sort_key(v, E), 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[(int64_t)blockIdx.x * E + e] = sc[e];
}
__global__ void moe_sort_scan_kernel(int *base, int64_t *offs, const int *cnt, int nt, int E) {
    extern __shared__ int64_t at[]; // E + 1: each expert's entries, then its offset
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int64_t s = 0;
        for (int t = 0; t < nt; t++) s += cnt[(int64_t)t * E + e];
        at[e] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0, s = 0; e <= E; e++) {
            int c = e < E ? (int)at[e] : 0;
            at[e] = s, s += c;
        }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) offs[e] = at[e];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int t = 0, r = (int)at[e]; t < nt; t++) base[(int64_t)t * E + e] = r, r += cnt[(int64_t)t * E + e];
}
__global__ void moe_sort_place_kernel(int32_t *perm, int32_t *inv, const int *base, const int32_t *idx, int64_t n,
                                      int E) {
    extern __shared__ int next[]; // E: this tile's next place of each expert
    for (int e = threadIdx.x; e < E; e += 32) next[e] = base[(int64_t)blockIdx.x * E + e];
    __syncwarp();
    int lane = threadIdx.x;
    int64_t t0 = (int64_t)blockIdx.x * MOE_SORT_TILE, t1 = t0 + MOE_SORT_TILE < n ? t0 + MOE_SORT_TILE : n;
    for (int64_t i0 = t0; i0 < t1; i0 += 32) {
        int64_t i = i0 + lane;
        int key = i < t1 ? sort_key(idx[i], E) : -1 - lane; // lanes past the tile: keys of their own
        unsigned peers = __match_any_sync(0xffffffffu, key);
        int rank = __popc(peers & ((1u << lane) - 1)), at = i < t1 ? next[key] + rank : 0;
        __syncwarp(); // every lane has read next before the groups' last lanes move it on
        if (i < t1) {
            perm[at] = (int32_t)i;
            if (inv) inv[i] = at;
            if (rank == __popc(peers) - 1) next[key] = at + 1;
        }
        __syncwarp();
    }
}

__device__ __forceinline__ void atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(bf16 *p, float v) { atomicAdd(p, __float2bfloat16(v)); }

// Gather y[i] = x[rows[i] / div] or scatter y[rows[i] / div] = x[i], i < R: one thread per V values of a row.
template <typename TY, typename TX, int V>
__global__ void move_rows_kernel(TY *y, const TX *x, const int32_t *rows, int div, bool scatter, int64_t R, int64_t H) {
    GRID_STRIDE(e, R * H / V) {
        int64_t i = e * V / H, c = e * V % H, r = (int64_t)(rows[i] / div) * H + c;
        float v[V];
        ldv<V>(x + (scatter ? e * V : r), v);
        stv<V>(y + (scatter ? r : e * V), v);
    }
}
// dx[rows[i] / div] += dy[i] by atomic adds (several rows may land on one token); with flag, only when it is set (a
// row map that is not a partial permutation).
template <typename TX, typename TY>
__global__ void scatter_add_rows_kernel(TX *dx, const TY *dy, const int32_t *rows, const int32_t *flag, int div,
                                        int64_t R, int64_t H) {
    if (flag && !*flag) return;
    GRID_STRIDE(e, R * H) {
        int64_t i = e / H, c = e % H;
        atomic_add(dx + (int64_t)(rows[i] / div) * H + c, ld(dy, e));
    }
}
// inv[rows[i]] = i over the n = T·div slots; flag ← 1 if a row repeats or leaves [0, n).
__global__ void rows_invert_kernel(int32_t *inv, int32_t *flag, const int32_t *rows, int64_t R, int64_t n) {
    GRID_STRIDE(i, R) {
        int32_t r = rows[i];
        if (r < 0 || r >= n) *flag = 1;
        else if (atomicExch(inv + r, (int32_t)i) != -1) *flag = 1;
    }
}
// dx[t] += Σ_j dy[inv[t·div + j]] (slots nobody maps to add nothing); skipped when flag is set.
template <typename TX, typename TY, int V>
__global__ void scatter_add_rows_sum_kernel(TX *dx, const TY *dy, const int32_t *inv, const int32_t *flag, int div,
                                            int64_t T_, int64_t H) {
    if (*flag) return;
    GRID_STRIDE(e, T_ * H / V) {
        int64_t t = e * V / H, c = e * V % H;
        float a[V], v[V];
        ldv<V>(dx + e * V, a);
        for (int j = 0; j < div; j++) {
            int32_t s = inv[t * div + j];
            if (s < 0) continue;
            ldv<V>(dy + (int64_t)s * H + c, v);
#pragma unroll
            for (int q = 0; q < V; q++) a[q] += v[q];
        }
        stv<V>(dx + e * V, a);
    }
}
// The row of y holding slot s: at[s], or s when y is in slot order (ops_list.h).
__device__ __forceinline__ int64_t slot_row(const int32_t *at, int64_t s) { return at ? at[s] : s; }
template <typename T, int V>
__global__ void moe_combine_forward_kernel(T *out, const T *resid, const T *y, const float *w, const int32_t *at,
                                           int64_t T_, int64_t H, int k) {
    GRID_STRIDE(e, T_ * H / V) {
        int64_t t = e * V / H, c = e * V % H;
        float s[V], v[V];
        ldv<V>(resid + e * V, s);
        for (int j = 0; j < k; j++) {
            float wj = w[t * k + j];
            ldv<V>(y + slot_row(at, t * k + j) * H + c, v);
#pragma unroll
            for (int q = 0; q < V; q++) s[q] += wj * v[q];
        }
        stv<V>(out + e * V, s);
    }
}
// One warp per slot (t, j): dy row = w·dout[t], dw = ⟨dout[t], y row⟩.
template <typename T, int V>
__global__ void moe_combine_backward_kernel(T *dy, float *dw, const T *dout, const T *y, const float *w,
                                            const int32_t *at, int64_t T_, int64_t H, int k) {
    int64_t slot = blockIdx.x * (int64_t)MOE_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (slot >= T_ * k) return;
    int64_t t = slot / k, r = slot_row(at, slot);
    float wj = w[slot], s = 0;
    for (int64_t c = lane * V; c < H; c += 32 * V) {
        float g[V], v[V], d[V];
        ldv<V>(dout + t * H + c, g);
        ldv<V>(y + r * H + c, v);
#pragma unroll
        for (int q = 0; q < V; q++) d[q] = wj * g[q], s += g[q] * v[q];
        stv<V>(dy + r * H + c, d);
    }
    s = warp_sum(s);
    if (lane == 0) dw[slot] = s;
}

extern "C" {

static RouterParams router_params(Tensor logits, Tensor idx, const RouterArgs *a, const char *what) {
    int64_t E = t_cols(logits);
    int G = a->n_group > 1 ? a->n_group : 1;
    if (a->k < 1 || a->k > E || a->k > ROUTER_KMAX || t_cols(idx) != a->k || idx.dt != DT_I32 || !(a->scale > 0))
        die("%s: k = %d of %lld experts (at most %d), idx (T, k) int32, scale > 0", what, a->k, (long long)E,
            ROUTER_KMAX);
    if (G > 1 && (E % G || G > 64 || a->topk_group < 1 || a->topk_group > G || a->k > a->topk_group * (E / G)))
        die("%s: %d groups (at most 64) of %lld experts, topk_group %d, k %d do not fit", what, G, (long long)E,
            a->topk_group, a->k);
    if (a->bias.p && (a->bias.dt != DT_F32 || tensor_numel(a->bias) != E)) die("%s: bias must be (E) fp32", what);
    if (a->sigmoid && a->softmax_topk) die("%s: sigmoid scores and softmax_topk do not combine", what);
    const float *bias = a->bias.p ? (const float *)a->bias.p : NULL;
    return {(int)E, a->k, G, a->topk_group, a->renorm, a->softmax_topk, a->force_balance, a->scale, bias, a->sigmoid};
}

void cuda_router_forward(Tensor probs, Tensor idx, Tensor w, Tensor logits, const RouterArgs *a) {
    RouterParams rp = router_params(logits, idx, a, "router_forward");
    int64_t T_ = t_rows(logits), E = rp.E;
    IS_F32(logits, "router_forward");
    IS_F32(probs, "router_forward");
    IS_F32(w, "router_forward");
    if (a->given) die("router_forward: given routing is the CPU reference's only");
    if (!T_) return;
    size_t smem = (size_t)MOE_WARPS * (2 * E + rp.n_group) * sizeof(float);
    if (smem > 48 * 1024) die("router_forward: %lld experts exceed this kernel's shared memory", (long long)E);
    router_forward_kernel<<<(unsigned)((T_ + MOE_WARPS - 1) / MOE_WARPS), 32 * MOE_WARPS, smem, cuda_stream()>>>(
        (float *)probs.p, (int32_t *)idx.p, (float *)w.p, (const float *)logits.p, T_, rp);
    CUDA_LAUNCH_CHECK();
}

void cuda_router_backward(Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                          const RouterArgs *a) {
    RouterParams rp = router_params(probs, idx, a, "router_backward");
    int64_t T_ = t_rows(probs), E = rp.E;
    IS_F32(dlogits, "router_backward");
    IS_F32(dw, "router_backward");
    IS_F32(probs, "router_backward");
    if (!T_) return;
    size_t smem = (size_t)MOE_WARPS * E * sizeof(double);
    if (smem > 48 * 1024) die("router_backward: %lld experts exceed this kernel's shared memory", (long long)E);
    router_backward_kernel<<<(unsigned)((T_ + MOE_WARPS - 1) / MOE_WARPS), 32 * MOE_WARPS, smem, cuda_stream()>>>(
        (float *)dlogits.p, (const float *)dw.p, lb_grad.p ? (const float *)lb_grad.p : NULL, (const float *)probs.p,
        (const int32_t *)idx.p, (const float *)w.p, T_, rp);
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_lb_loss(Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float grad_scale) {
    int64_t T_ = t_rows(probs), E = t_cols(probs), k = t_cols(idx);
    IS_F32(lb_grad, "moe_lb_loss");
    CHECK(loss_sum.dt == DT_F64);
    CudaCtx *c = cuda_ctx();
    // token groups of the column sums: up to 64 of at least 256 tokens, as many as fit the small pool
    int64_t G = (T_ + 255) / 256, fit = (int64_t)(CUDA_SMALL_BYTES / sizeof(double)) / (E > 0 ? E : 1) - 1;
    G = G > 64 ? 64 : G;
    G = G > fit ? fit : G;
    if (T_ > 0 && G < 1) die("moe_lb_loss: %lld experts exceed the small pool", (long long)E);
    double *cnt = (double *)c->small, *pm = cnt + E;
    CUDA_CHECK(cudaMemsetAsync(cnt, 0, E * sizeof(double), c->compute));
    if (T_ > 0) {
        moe_count_kernel<<<grid_for(T_ * k, 256), 256, 0, c->compute>>>(cnt, (const int32_t *)idx.p, T_ * k, (int)E);
        CUDA_LAUNCH_CHECK();
        moe_lb_colsum_kernel<<<dim3((unsigned)((E + 31) / 32), (unsigned)G), dim3(32, 8), 0, c->compute>>>(
            pm, (const float *)probs.p, T_, E);
        CUDA_LAUNCH_CHECK();
    }
    moe_lb_finish_kernel<<<1, 256, 0, c->compute>>>((double *)loss_sum.p, (float *)lb_grad.p, cnt, pm, (int)G, T_,
                                                    (int)E, (int)k, coef, grad_scale);
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_count(Tensor cnt, Tensor idx) {
    CHECK(cnt.dt == DT_F64 && idx.dt == DT_I32);
    int64_t n = tensor_numel(idx);
    if (n == 0) return;
    moe_count_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx()->compute>>>((double *)cnt.p, (const int32_t *)idx.p, n,
                                                                        (int)tensor_numel(cnt));
    CUDA_LAUNCH_CHECK();
}

// The stable counting sort on the device (the moe_sort_* kernels), offs written where the grouped GEMMs read them:
// nothing comes back to the host.
void cuda_moe_sort(Tensor perm, Tensor at, Tensor offs, Tensor idx, int E) {
    int64_t n = tensor_numel(idx);
    CHECK(idx.dt == DT_I32 && perm.dt == DT_I32 && tensor_numel(perm) >= n && n < 0x7fffffff && E >= 1);
    CHECK(!at.p || (at.dt == DT_I32 && tensor_numel(at) >= n));
    int64_t *d_offs = (int64_t *)offsets_device(offs, E, "moe_sort");
    if (n) {
        int64_t nt = (n + MOE_SORT_TILE - 1) / MOE_SORT_TILE;
        CHECK(nt < 0x7fffffff && (size_t)(E + 1) * 8 <= 48 << 10); // (the scan's shared memory)
        int *cnt = (int *)cuda_scratch(2 * (size_t)nt * E * sizeof(int)), *base = cnt + nt * E;
        cudaStream_t st = cuda_stream();
        moe_sort_count_kernel<<<(unsigned)nt, 256, E * sizeof(int), st>>>(cnt, (const int32_t *)idx.p, n, E);
        CUDA_LAUNCH_CHECK();
        moe_sort_scan_kernel<<<1, 256, (E + 1) * sizeof(int64_t), st>>>(base, d_offs, cnt, (int)nt, E);
        CUDA_LAUNCH_CHECK();
        moe_sort_place_kernel<<<(unsigned)nt, 32, E * sizeof(int), st>>>((int32_t *)perm.p, (int32_t *)at.p, base,
                                                                         (const int32_t *)idx.p, n, E);
        CUDA_LAUNCH_CHECK();
    } else {
        CUDA_CHECK(cudaMemsetAsync(d_offs, 0, (E + 1) * sizeof(int64_t), cuda_stream()));
    }
}

int64_t cuda_moe_sort_bad_expert(void) {
    unsigned long long bad = 0, zero = 0;
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&bad, moe_sort_bad, sizeof bad, 0, cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaMemcpyToSymbolAsync(moe_sort_bad, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, cuda_stream()));
    cuda_host_wait(cuda_stream());
    return bad ? (int64_t)(int32_t)(uint32_t)bad : -1;
}

// Rows of a multiple of 8 aligned values take V = 8; V = 1 serves other widths (the row ops accept any H, as the CPU
// ops do: row ops in tests and tiny models use odd widths). R rows of x (scatter) or y (gather) move.
static void move_rows(Tensor y, Tensor x, Tensor rows, int div, bool scatter, int64_t R, int64_t H, const char *what) {
    if (R * H == 0) return;
    V_SWITCH(vec8_fits(H, y.p, x.p),
             DT_SWITCH(y.dt, TY, what,
                       DT_SWITCH(x.dt, TX, what,
                                 move_rows_kernel<TY, TX, V><<<grid_for(R * H / V, 256), 256, 0, cuda_stream()>>>(
                                     (TY *)y.p, (const TX *)x.p, (const int32_t *)rows.p, div, scatter, R, H))));
    CUDA_LAUNCH_CHECK();
}

void cuda_gather_rows(Tensor y, Tensor x, Tensor rows, int div) {
    CHECK(t_cols(x) == t_cols(y) && tensor_numel(rows) == t_rows(y));
    move_rows(y, x, rows, div, false, t_rows(y), t_cols(y), "gather_rows");
}

void cuda_scatter_rows(Tensor y, Tensor x, Tensor rows) {
    move_rows(y, x, rows, 1, true, t_rows(x), t_cols(x), "scatter_rows");
}

void cuda_scatter_add_rows(Tensor dx, Tensor dy, Tensor rows, int div) {
    int64_t R = t_rows(dy), H = t_cols(dy), T_ = t_rows(dx), n = T_ * div;
    if (R * H == 0) return;
    CudaCtx *c = cuda_ctx();
    int32_t *flag = NULL; // the atomic scatter-add runs when flag is NULL, or set by the inversion
    // The inverse path needs int32 inverse indices; other shapes take the atomic scatter-add alone.
    if (n < 0x7fffffff && div >= 1) {
        int32_t *inv = (int32_t *)cuda_scratch((size_t)(n + 1) * sizeof(int32_t));
        flag = inv + n;
        CUDA_CHECK(cudaMemsetAsync(inv, 0xff, n * sizeof(int32_t), c->compute));
        CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int32_t), c->compute));
        rows_invert_kernel<<<grid_for(R, 256), 256, 0, c->compute>>>(inv, flag, (const int32_t *)rows.p, R, n);
        CUDA_LAUNCH_CHECK();
        V_SWITCH(vec8_fits(H, dx.p, dy.p),
                 DT_SWITCH(dx.dt, TX, "scatter_add_rows",
                           DT_SWITCH(dy.dt, TY, "scatter_add_rows",
                                     scatter_add_rows_sum_kernel<TX, TY, V>
                                     <<<grid_for(T_ * H / V, 256), 256, 0, c->compute>>>((TX *)dx.p, (const TY *)dy.p,
                                                                                         inv, flag, div, T_, H))));
        CUDA_LAUNCH_CHECK();
    }
    unsigned grid = flag ? (unsigned)c->sm_count * 4 : grid_for(R * H, 256);
    DT_SWITCH(dx.dt, TX, "scatter_add_rows",
              DT_SWITCH(dy.dt, TY, "scatter_add_rows",
                        scatter_add_rows_kernel<TX, TY><<<grid, 256, 0, c->compute>>>(
                            (TX *)dx.p, (const TY *)dy.p, (const int32_t *)rows.p, flag, div, R, H)));
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_combine_forward(Tensor out, Tensor resid, Tensor y, Tensor w, Tensor at) {
    int64_t T_ = t_rows(out), H = t_cols(out), k = t_cols(w);
    CHECK(t_rows(y) == T_ * k && (!at.p || (at.dt == DT_I32 && tensor_numel(at) == T_ * k)));
    same_dt(out, y, "moe_combine_forward"), same_dt(resid, y, "moe_combine_forward");
    IS_F32(w, "moe_combine_forward");
    if (T_ * H == 0) return;
    // (V as in move_rows)
    V_SWITCH(vec8_fits(H, out.p, resid.p, y.p),
             DT_SWITCH(y.dt, T, "moe_combine_forward",
                       moe_combine_forward_kernel<T, V><<<grid_for(T_ * H / V, 256), 256, 0, cuda_stream()>>>(
                           (T *)out.p, (const T *)resid.p, (const T *)y.p, (const float *)w.p, (const int32_t *)at.p,
                           T_, H, (int)k)));
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w, Tensor at) {
    int64_t T_ = t_rows(dout), H = t_cols(dout), k = t_cols(w);
    CHECK(!at.p || (at.dt == DT_I32 && tensor_numel(at) == T_ * k));
    same_dt(dy, y, "moe_combine_backward"), same_dt(dout, y, "moe_combine_backward");
    IS_F32(dw, "moe_combine_backward");
    if (T_ * k == 0) return;
    // (V as in move_rows)
    V_SWITCH(vec8_fits(H, dy.p, dout.p, y.p),
             DT_SWITCH(y.dt, T, "moe_combine_backward",
                       moe_combine_backward_kernel<T, V>
                       <<<(unsigned)((T_ * k + MOE_WARPS - 1) / MOE_WARPS), 32 * MOE_WARPS, 0, cuda_stream()>>>(
                           (T *)dy.p, (float *)dw.p, (const T *)dout.p, (const T *)y.p, (const float *)w.p,
                           (const int32_t *)at.p, T_, H, (int)k)));
    CUDA_LAUNCH_CHECK();
}

} // extern "C"
