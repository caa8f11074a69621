// cuda_attention.cu — flash attention forward and backward: causal grouped-query attention with an LSE
// output, never materialising the S×S score matrix (Dao et al., FlashAttention-2, Algorithms 1 and 2).
// q, o, dq, dout: (B·S, nh, D); k, v, dk, dv: (B·S, nkv, D); lse: (B, nh, S) fp32; query head h reads
// kv head h / (nh/nkv). Storage fp32 or bf16, arithmetic fp32.
//   forward   s_ij = scale·q_i·k_j (j visible from i), online softmax over key tiles:
//             m ← max(m, max_j s_ij), l ← l·e^(m_old−m) + Σ_j e^(s_ij−m), acc ← acc·e^(m_old−m) + Σ_j e^(s_ij−m)·v_j;
//             o_i = acc/l, lse_i = m + log l.
//   backward  p_ij = e^(s_ij − lse_i), D_i = dout_i·o_i, ds_ij = p_ij·(dout_i·v_j − D_i);
//             dq_i = scale·Σ_j ds_ij·k_j  (kernel 1: one block per query tile)
//             dk_j = scale·Σ_i ds_ij·q_i, dv_j = Σ_i p_ij·dout_i, summed over the query heads of the group
//             (kernel 2: one block per key tile and kv head: no atomics, deterministic).
// Layout of the work: a block holds ATT_ROWS rows (queries, or keys in the dk/dv kernel); each row is
// owned by TPR consecutive threads, thread `sub` holding elements c·TPR + sub (c < D/TPR) in registers,
// so a dot product is a register loop plus a log2(TPR)-step shuffle. The other side (keys, or queries)
// streams through shared memory in tiles of ATT_TILE rows, converted to fp32 on load.
// Visibility is one function (attn_visible) and the tile range one loop bound, which is where sliding
// windows, sinks and varlen/document masks slot in. Different q·k and v head dims (192/128) need a
// second D parameter. These scalar-FMA kernels serve fp32 (parity runs) and the head dims the tensor-core
// kernels of cuda_flash.cu (bf16, d 64 and 128) do not cover.
#include "ops/cuda/cuda_common.cuh"

#define ATT_ROWS 64
#define ATT_TILE 32

__device__ __forceinline__ bool attn_visible(int i, int j) { return j <= i; } // causal

// Sum over the TPR consecutive lanes that own one row.
template <int TPR> __device__ __forceinline__ float row_sum(float v) {
    for (int o = TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Loads rows r0..r0+ATT_TILE of one head of a (B·S, heads, D) tensor into tile (ATT_TILE × D fp32);
// rows at or past S read as 0.
template <typename T, int D>
__device__ __forceinline__ void load_tile(float *tile, const T *x, int b, int S, int heads, int head, int r0) {
    for (int e = threadIdx.x; e < ATT_TILE * D; e += blockDim.x) {
        int rr = e / D, c = e % D, r = r0 + rr;
        tile[e] = r < S ? ld(x, (((int64_t)b * S + r) * heads + head) * D + c) : 0.0f;
    }
}

template <typename T, int D, int TPR>
__global__ void __launch_bounds__(ATT_ROWS *TPR) attention_forward_kernel(T *o, float *lse, const T *q, const T *k, const T *v, int S, int nh,
                                                                          int nkv, float scale) {
    constexpr int DPT = D / TPR;
    extern __shared__ float smem[];
    float *ks = smem, *vs = smem + ATT_TILE * D;
    int bh = blockIdx.y, b = bh / nh, h = bh % nh, g = h / (nh / nkv);
    int r = threadIdx.x / TPR, sub = threadIdx.x % TPR, q0 = blockIdx.x * ATT_ROWS, i = q0 + r;
    bool valid = i < S; // rows past S compute along (the shuffles need every lane) but store nothing
    int64_t qoff = (((int64_t)b * S + (valid ? i : 0)) * nh + h) * D;
    float qr[DPT], acc[DPT];
#pragma unroll
    for (int c = 0; c < DPT; c++) qr[c] = valid ? ld(q, qoff + c * TPR + sub) : 0.0f, acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int kend = min(S, q0 + ATT_ROWS); // keys past the block's last query are invisible to all its rows
    for (int j0 = 0; j0 < kend; j0 += ATT_TILE) {
        __syncthreads(); // the previous tile is consumed
        load_tile<T, D>(ks, k, b, S, nkv, g, j0);
        load_tile<T, D>(vs, v, b, S, nkv, g, j0);
        __syncthreads();
        float s[ATT_TILE], mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float part = 0.0f;
#pragma unroll
            for (int c = 0; c < DPT; c++) part += qr[c] * ks[jj * D + c * TPR + sub];
            part = row_sum<TPR>(part);
            int j = j0 + jj;
            s[jj] = j < S && attn_visible(i, j) ? scale * part : -INFINITY;
            mt = fmaxf(mt, s[jj]);
        }
        float mn = fmaxf(m, mt);
        if (mn == -INFINITY) continue; // nothing visible yet (only rows past S)
        float corr = expf(m - mn);
        l *= corr;
#pragma unroll
        for (int c = 0; c < DPT; c++) acc[c] *= corr;
#pragma unroll
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float p = expf(s[jj] - mn);
            l += p;
#pragma unroll
            for (int c = 0; c < DPT; c++) acc[c] += p * vs[jj * D + c * TPR + sub];
        }
        m = mn;
    }
    if (!valid) return;
#pragma unroll
    for (int c = 0; c < DPT; c++) st(o, qoff + c * TPR + sub, acc[c] / l);
    if (sub == 0) lse[((int64_t)b * nh + h) * S + i] = m + logf(l);
}

// dq for one query tile; D_i from dout and o.
template <typename T, int D, int TPR>
__global__ void __launch_bounds__(ATT_ROWS *TPR) attention_backward_dq_kernel(T *dq, const T *dout, const T *q, const T *k, const T *v, const T *o,
                                                                              const float *lse, int S, int nh, int nkv, float scale) {
    constexpr int DPT = D / TPR;
    extern __shared__ float smem[];
    float *ks = smem, *vs = smem + ATT_TILE * D;
    int bh = blockIdx.y, b = bh / nh, h = bh % nh, g = h / (nh / nkv);
    int r = threadIdx.x / TPR, sub = threadIdx.x % TPR, q0 = blockIdx.x * ATT_ROWS, i = q0 + r;
    bool valid = i < S;
    int64_t qoff = (((int64_t)b * S + (valid ? i : 0)) * nh + h) * D;
    float qr[DPT], dor[DPT], dqa[DPT], Di = 0.0f;
#pragma unroll
    for (int c = 0; c < DPT; c++) {
        qr[c] = valid ? ld(q, qoff + c * TPR + sub) : 0.0f;
        dor[c] = valid ? ld(dout, qoff + c * TPR + sub) : 0.0f;
        Di += dor[c] * (valid ? ld(o, qoff + c * TPR + sub) : 0.0f);
        dqa[c] = 0.0f;
    }
    Di = row_sum<TPR>(Di);
    float L = valid ? lse[((int64_t)b * nh + h) * S + i] : 0.0f;
    int kend = min(S, q0 + ATT_ROWS);
    for (int j0 = 0; j0 < kend; j0 += ATT_TILE) {
        __syncthreads();
        load_tile<T, D>(ks, k, b, S, nkv, g, j0);
        load_tile<T, D>(vs, v, b, S, nkv, g, j0);
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float sp = 0.0f, dp = 0.0f;
#pragma unroll
            for (int c = 0; c < DPT; c++) sp += qr[c] * ks[jj * D + c * TPR + sub], dp += dor[c] * vs[jj * D + c * TPR + sub];
            sp = row_sum<TPR>(sp);
            dp = row_sum<TPR>(dp);
            int j = j0 + jj;
            float p = valid && j < S && attn_visible(i, j) ? expf(scale * sp - L) : 0.0f;
            float ds = scale * p * (dp - Di);
#pragma unroll
            for (int c = 0; c < DPT; c++) dqa[c] += ds * ks[jj * D + c * TPR + sub];
        }
    }
    if (!valid) return;
#pragma unroll
    for (int c = 0; c < DPT; c++) st(dq, qoff + c * TPR + sub, dqa[c]);
}

// dk, dv for one key tile of one kv head, summed over the group's query heads and every query tile at
// or after the key tile (causal).
template <typename T, int D, int TPR>
__global__ void __launch_bounds__(ATT_ROWS *TPR) attention_backward_dkdv_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                                                                                const T *o, const float *lse, int S, int nh, int nkv, float scale) {
    constexpr int DPT = D / TPR;
    extern __shared__ float smem[];
    float *qs = smem, *dos = smem + ATT_TILE * D, *Ls = dos + ATT_TILE * D, *Ds = Ls + ATT_TILE;
    int bg = blockIdx.y, b = bg / nkv, g = bg % nkv, grp = nh / nkv;
    int r = threadIdx.x / TPR, sub = threadIdx.x % TPR, k0 = blockIdx.x * ATT_ROWS, j = k0 + r;
    bool valid = j < S;
    int64_t koff = (((int64_t)b * S + (valid ? j : 0)) * nkv + g) * D;
    float kr[DPT], vr[DPT], dka[DPT], dva[DPT];
#pragma unroll
    for (int c = 0; c < DPT; c++) {
        kr[c] = valid ? ld(k, koff + c * TPR + sub) : 0.0f;
        vr[c] = valid ? ld(v, koff + c * TPR + sub) : 0.0f;
        dka[c] = dva[c] = 0.0f;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        for (int i0 = k0 / ATT_TILE * ATT_TILE; i0 < S; i0 += ATT_TILE) {
            __syncthreads();
            load_tile<T, D>(qs, q, b, S, nh, h, i0);
            load_tile<T, D>(dos, dout, b, S, nh, h, i0);
            for (int ii = threadIdx.x; ii < ATT_TILE; ii += blockDim.x) Ls[ii] = i0 + ii < S ? lse[((int64_t)b * nh + h) * S + i0 + ii] : 0.0f;
            __syncthreads();
            for (int ii = warp; ii < ATT_TILE; ii += nwarps) { // D_i = dout_i·o_i, one warp per query row
                float part = 0.0f;
                if (i0 + ii < S)
                    for (int c = lane; c < D; c += 32) part += dos[ii * D + c] * ld(o, (((int64_t)b * S + i0 + ii) * nh + h) * D + c);
                part = warp_sum(part);
                if (lane == 0) Ds[ii] = part;
            }
            __syncthreads();
#pragma unroll 4
            for (int ii = 0; ii < ATT_TILE; ii++) {
                float sp = 0.0f, dp = 0.0f;
#pragma unroll
                for (int c = 0; c < DPT; c++) sp += kr[c] * qs[ii * D + c * TPR + sub], dp += vr[c] * dos[ii * D + c * TPR + sub];
                sp = row_sum<TPR>(sp);
                dp = row_sum<TPR>(dp);
                int i = i0 + ii;
                float p = valid && i < S && attn_visible(i, j) ? expf(scale * sp - Ls[ii]) : 0.0f;
                float ds = scale * p * (dp - Ds[ii]);
#pragma unroll
                for (int c = 0; c < DPT; c++) {
                    dva[c] += p * dos[ii * D + c * TPR + sub];
                    dka[c] += ds * qs[ii * D + c * TPR + sub];
                }
            }
        }
    }
    if (!valid) return;
#pragma unroll
    for (int c = 0; c < DPT; c++) st(dk, koff + c * TPR + sub, dka[c]), st(dv, koff + c * TPR + sub, dva[c]);
}

// Shared memory above the 48 KB default needs an opt-in per kernel, once.
template <typename K> static void smem_opt_in(K kernel, size_t bytes) {
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <typename T, int D, int TPR> static void attention_forward_launch(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int S, float scale) {
    int nh = (int)q.n[1], nkv = (int)k.n[1];
    size_t smem = 2 * ATT_TILE * D * sizeof(float);
    smem_opt_in(attention_forward_kernel<T, D, TPR>, smem);
    dim3 grid((S + ATT_ROWS - 1) / ATT_ROWS, B * nh);
    attention_forward_kernel<T, D, TPR><<<grid, ATT_ROWS * TPR, smem, cuda_stream()>>>((T *)o.p, (float *)lse.p, (const T *)q.p, (const T *)k.p,
                                                                                       (const T *)v.p, S, nh, nkv, scale);
    CUDA_LAUNCH_CHECK();
}

template <typename T, int D, int TPR>
static void attention_backward_launch(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, int B, int S,
                                      float scale) {
    int nh = (int)q.n[1], nkv = (int)k.n[1];
    size_t smem_dq = 2 * ATT_TILE * D * sizeof(float), smem_kv = (2 * ATT_TILE * D + 2 * ATT_TILE) * sizeof(float);
    smem_opt_in(attention_backward_dq_kernel<T, D, TPR>, smem_dq);
    smem_opt_in(attention_backward_dkdv_kernel<T, D, TPR>, smem_kv);
    unsigned tiles = (S + ATT_ROWS - 1) / ATT_ROWS;
    attention_backward_dq_kernel<T, D, TPR><<<dim3(tiles, B * nh), ATT_ROWS * TPR, smem_dq, cuda_stream()>>>(
        (T *)dq.p, (const T *)dout.p, (const T *)q.p, (const T *)k.p, (const T *)v.p, (const T *)o.p, (const float *)lse.p, S, nh, nkv, scale);
    CUDA_LAUNCH_CHECK();
    attention_backward_dkdv_kernel<T, D, TPR><<<dim3(tiles, B * nkv), ATT_ROWS * TPR, smem_kv, cuda_stream()>>>(
        (T *)dk.p, (T *)dv.p, (const T *)dout.p, (const T *)q.p, (const T *)k.p, (const T *)v.p, (const T *)o.p, (const float *)lse.p, S, nh, nkv,
        scale);
    CUDA_LAUNCH_CHECK();
}

// The head dims with a compiled kernel, and the threads that own one row for each.
#define ATT_HEAD_DIMS(X) X(8, 1) X(16, 1) X(32, 2) X(64, 4) X(96, 4) X(128, 8) X(192, 8) X(256, 8)

static void attention_check(Tensor q, Tensor k, Tensor v, int B, const char *what) {
    int64_t S = q.n[0] / B;
    if (S * B != q.n[0] || q.n[1] % k.n[1] || k.n[2] != q.n[2] || v.n[2] != q.n[2] || k.n[0] != q.n[0] || v.n[1] != k.n[1])
        die("%s: shapes q (%lld, %lld, %lld), k (%lld, %lld, %lld), B %d do not fit causal GQA", what, (long long)q.n[0], (long long)q.n[1],
            (long long)q.n[2], (long long)k.n[0], (long long)k.n[1], (long long)k.n[2], B);
    if (q.dt != k.dt || q.dt != v.dt) die("%s: q, k, v must share a dtype", what);
}

static const char *last_path = "none";

extern "C" {

const char *cuda_attention_last_path(void) { return last_path; }

// The forms with a kernel so far: causal self-attention of one head dim, no window, sinks or offsets.
static void attention_gpu_check(Tensor q, Tensor k, Tensor v, const AttnArgs *a, const char *what) {
    if (!a->causal || a->window || a->sinks.p || a->q_off || a->k_off || k.n[0] != q.n[0] || v.n[2] != q.n[2])
        die("%s: windows, sinks, offsets, blocks and q/k head dim != v head dim are not supported on the GPU yet",
            what);
}

void cuda_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    attention_gpu_check(q, k, v, a, "attention_forward");
    int B = a->B;
    float scale = a->scale;
    attention_check(q, k, v, B, "attention_forward");
    IS_F32(lse, "attention_forward");
    if (o.dt != q.dt) die("attention_forward: o must have q's dtype");
    int S = (int)(q.n[0] / B), D = (int)q.n[2];
    if (S == 0) return;
    last_path = "cudnn";
    if (cudnn_attention_forward(o, lse, q, k, v, B, S, scale)) return; // cuDNN's fused kernel (bf16, d ≤ 128)
    last_path = "flash";
    if (flash_attention_forward(o, lse, q, k, v, B, S, scale)) return; // our tensor-core kernel (bf16, d 64/128)
    last_path = "generic";
#define FWD(d, tpr)                                                                                   \
    if (D == d) {                                                                                     \
        DT_SWITCH(q.dt, T, "attention_forward", attention_forward_launch<T, d, tpr>(o, lse, q, k, v, B, S, scale)); \
        return;                                                                                       \
    }
    ATT_HEAD_DIMS(FWD)
#undef FWD
    die("attention_forward: head dim %d has no kernel (8, 16, 32, 64, 96, 128, 192, 256)", D);
}

void cuda_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a) {
    attention_gpu_check(q, k, v, a, "attention_backward");
    int B = a->B;
    float scale = a->scale;
    attention_check(q, k, v, B, "attention_backward");
    if (dq.dt != q.dt || dk.dt != q.dt || dv.dt != q.dt || dout.dt != q.dt || o.dt != q.dt)
        die("attention_backward: dq, dk, dv, dout, o must have q's dtype");
    int S = (int)(q.n[0] / B), D = (int)q.n[2];
    if (S == 0) return;
    last_path = "cudnn";
    if (cudnn_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, S, scale)) return;
    last_path = "flash";
    if (flash_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, S, scale)) return;
    last_path = "generic";
#define BWD(d, tpr)                                                                                   \
    if (D == d) {                                                                                     \
        DT_SWITCH(q.dt, T, "attention_backward", attention_backward_launch<T, d, tpr>(dq, dk, dv, dout, q, k, v, o, lse, B, S, scale)); \
        return;                                                                                       \
    }
    ATT_HEAD_DIMS(BWD)
#undef BWD
    die("attention_backward: head dim %d has no kernel (8, 16, 32, 64, 96, 128, 192, 256)", D);
}

} // extern "C"
