// cuda_flash.cu — flash attention on the tensor cores: bf16, head dims 64, 128, 256 or MLA's 192/128, causal
// grouped-query self-attention with an LSE output, documents (AttnArgs.docpos), a sliding window and sinks (Dao,
// "FlashAttention-2", 2023: Algorithm 1 forward, Algorithm 2 backward
// with a D_i pre-pass). Shapes as in cuda_attention.cu: q, dq (B·S, nh, DK); k, dk (B·S, nkv, DK); v, dv (B·S, nkv,
// DV); o, dout (B·S, nh, DV); lse (B, nh, S) fp32; query head h reads kv head h / (nh/nkv).
//   forward  per block 64 query rows (4 warps × 16 rows), key tiles of 64 in shared memory:
//            S = Q·Kᵀ, online softmax in registers (base 2: exp2(s·scale·log2e − m)), O += P·V;
//            o = O/l, lse = m·scale + ln l.
//   backward kernel 1, per 64 query rows: D_i = dout_i·o_i (written to a scratch for kernel 2), then
//            over the key tiles P = exp(S·scale − lse), dP = dO·Vᵀ, dS = P∘(dP − D), dQ += dS·K;
//            dq = scale·dQ. kernel 2, per 64 keys of one kv head: over every query tile at or after
//            them and every query head of the group, Pᵀ and dPᵀ = V·dOᵀ with keys as rows, dV += Pᵀ·dO,
//            dK += dSᵀ·Q; dk = scale·dK (when DK + DV > 256 in two launches, one for dv and one for dk, and Q and dO
//            fragments wider than 128 read from shared memory at each use: the registers hold one accumulator, not two).
//            Each output has one writer: no atomics, deterministic.
//   (The two kernels are deterministic and were faster than a fused backward with dq atomics on the H200:
//   bench/cuda_ops.md, round 2.)
// A lower bound per row (LO): documents (AttnArgs.docpos, each query's position in its document) and a sliding
// window W let query i see keys from lo_i = max(i − docpos[i], i − W + 1, 0) on, and lo_i never decreases along a
// sequence. The forward and dq kernels start their key loop at the tile of their first row's lo and mask per
// element only in the tiles before their last row's lo; the dk/dv kernel stops its query loop before the first query
// tile whose first row's lo lies past the key tile (counted once per block) and masks per element only in query
// tiles whose last row's lo lies past its first key. LO is a template argument (bit 0: documents, bit 1: a window, so
// each kernel keeps only what it uses); with LO 0 the kernels are the plain causal ones (no docpos loads). Sinks
// (GPT-OSS) start the forward's running max at the sink's logit and its sum at 1 (the backward reads the lse that
// includes them; the sink's own gradient is cuda_attention.cu's kernel).
// Tensor cores (cuda_mma.cuh has the fragment layouts): a row-major [m][k] tile feeds A directly, a [n][k]
// tile (K for Q·Kᵀ) feeds B directly, and a [k][n] tile (V for P·V) feeds B through ldmatrix .trans. An S
// accumulator (C layout) re-packed to bf16 pairs is the A fragment of the next product (P·V, dS·K), so P
// and dS never touch shared memory.
// Shared memory tiles are 64 rows × D bf16 (D = DK for Q and K, DV for V and dO) with rows padded to D + 8 elements
// (16 bytes). Tiles arrive by
// cp.async (16-byte, zero-filled past the sequence end), double-buffered against the tensor-core work.
#include "ops/cuda/cuda_mma.cuh"

#define FA_ROWS 64 // query rows (or keys in the dk/dv kernel) per block
#define FA_TILE 64 // keys (or queries) per streamed tile
#define FA_THREADS 128
#define FA_LOG2E 1.4426950408889634f

// acc (16 × 8·ND, C layout) += P (16 × 64: eight 16×8 C-layout accumulators, re-packed to bf16 A fragments)
// · tile (64 × 8·ND, row-major [k][n] in shared memory, read through ldmatrix.trans): O += P·V, dQ += dS·K,
// dV += Pᵀ·dO, dK += dSᵀ·Q all have this shape, 16 rows of k at a time.
template <int ND, int LD>
__device__ __forceinline__ void mma_acc_rows_tile(float (&acc)[ND][4], const float (&p)[8][4], const bf16 *tile,
                                                  int lane) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t pa[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                          pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int d = 0; d < ND / 2; d++) {
            uint32_t bb[4];
            ldsm_x4_trans(bb, frag_b_kn<LD>(tile, kk * 16, d * 16, lane));
            mma_bf16(acc[2 * d], pa, bb[0], bb[1]);
            mma_bf16(acc[2 * d + 1], pa, bb[2], bb[3]);
        }
    }
}

// c (16 × 64, eight 16×8 C-layout accumulators) += a (16 × 16, an A fragment) · tileᵀ's columns kc .. kc + 15 (tile
// 64 × D, row-major [n][k] in shared memory): one 16-wide k step of S = Q·Kᵀ, dP = dO·Vᵀ, Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ.
template <int LD>
__device__ __forceinline__ void mma_x64(float (&c)[8][4], const uint32_t (&a)[4], const bf16 *tile, int kc, int lane) {
#pragma unroll
    for (int np = 0; np < 4; np++) {
        uint32_t bb[4];
        ldsm_x4(bb, frag_b_nk<LD>(tile, np * 16, kc, lane));
        mma_bf16(c[2 * np], a, bb[0], bb[1]);
        mma_bf16(c[2 * np + 1], a, bb[2], bb[3]);
    }
}

// Row r (0: gq, 1: gq + 8) of a C-layout accumulator (16 × 8·ND) times f, as bf16 at out (this thread's column 2·tq).
template <int ND> __device__ __forceinline__ void store_row(bf16 *out, const float (&acc)[ND][4], int r, float f) {
#pragma unroll
    for (int i = 0; i < ND; i++) *(uint32_t *)(out + i * 8) = pack_bf16(acc[i][2 * r] * f, acc[i][2 * r + 1] * f);
}

// Starts the copy of 64 rows × D of one head into a padded tile: g points at the first row, rows are
// ld elements apart, rows from nvalid on are zero-filled.
template <int D> __device__ __forceinline__ void tile_load(bf16 *tile, const bf16 *g, int64_t ld, int nvalid) {
    constexpr int CH = D / 8; // 16-byte chunks per row
    for (int c = threadIdx.x; c < FA_ROWS * CH; c += FA_THREADS) {
        int r = c / CH, cc = c % CH;
        bool ok = r < nvalid;
        cp_async16(smem_addr(tile + r * (D + 8) + cc * 8), g + (ok ? r * ld + cc * 8 : 0), ok);
    }
}

// Starts the copy of key tile j of K and V (kg, vg: row 0 of the sequence's kv head; rows kld, vld apart) into ks, vs.
template <int DK, int DV>
__device__ __forceinline__ void kv_load(bf16 *ks, bf16 *vs, const bf16 *kg, const bf16 *vg, int64_t kld, int64_t vld,
                                        int S, int j) {
    tile_load<DK>(ks, kg + (int64_t)j * FA_TILE * kld, kld, S - j * FA_TILE);
    tile_load<DV>(vs, vg + (int64_t)j * FA_TILE * vld, vld, S - j * FA_TILE);
}

// LO: the first key query `row` sees, given its docpos value dpos (doc: documents on) and the window (0: none).
__device__ __forceinline__ int fa_row_lo(int row, int dpos, bool doc, int window) {
    int l = doc ? row - dpos : 0; // a document that began before the sequence: from key 0
    if (window) l = max(l, row - window + 1);
    return max(l, 0);
}
__device__ __forceinline__ int fa_row_lo(const int32_t *dp, int window, int row) { // dp: the sequence's docpos
    return fa_row_lo(row, dp ? dp[row] : 0, dp != NULL, window);
}

// LO: for the block of query rows [q0, q0 + FA_ROWS) of one sequence (dp: its docpos, S long, or NULL), the first
// key tile any row sees (*kt0), the last valid row's bound (*lmax: key tiles from it on need no mask) and the
// bounds of rows r and r + 8 (lo; rows past S: 0).
__device__ __forceinline__ void lo_rows(const int32_t *dp, int window, int S, int q0, int r, int *kt0, int *lmax,
                                        int lo[2]) {
    *kt0 = fa_row_lo(dp, window, q0) / FA_TILE;
    *lmax = fa_row_lo(dp, window, min(S, q0 + FA_ROWS) - 1);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = q0 + r + h * 8;
        lo[h] = row < S ? fa_row_lo(dp, window, row) : 0;
    }
}

// Sets to `masked` the scores (C layout) of the keys from j0 that rows row0 and row0 + 8 do not see: past the
// diagonal or the sequence end in the tile that holds them (edge), before a row's bound lo (low: LO's tiles before
// the last row's bound).
__device__ __forceinline__ void fa_mask(float (&s)[8][4], float masked, bool edge, bool low, int j0, int row0, int S,
                                        int tq, const int (&lo)[2]) {
    if (!edge && !low) return; // earlier tiles are all visible
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = j0 + nt * 8 + 2 * tq + (e & 1), row = row0 + (e >> 1) * 8;
            if ((edge && (key > row || key >= S)) || (low && key < lo[e >> 1])) s[nt][e] = masked;
        }
}

// A warp's 16 rows of a shared-memory tile (Q, dO) as A fragments, one per 16 columns: kept in registers at head dims
// up to 128; at 256 they would not fit beside the accumulators, so each use reads them from shared memory.
template <int D> struct RowFrags {
    static constexpr int LD = D + 8, KD = D / 16, KEEP = D <= 128;
    uint32_t f[KEEP ? KD : 1][4];
    const bf16 *tile;
    int row, lane;
    __device__ __forceinline__ RowFrags(const bf16 *t, int r, int ln) : tile(t), row(r), lane(ln) {
        if constexpr (KEEP)
#pragma unroll
            for (int kk = 0; kk < KD; kk++) ldsm_x4(f[kk], frag_a_mk<LD>(tile, row, kk * 16, lane));
    }
    // c += these rows' columns kk·16 .. kk·16 + 15 · tileᵀ's (mma_x64)
    __device__ __forceinline__ void mma(float (&c)[8][4], const bf16 *t, int kk) const {
        if constexpr (KEEP) mma_x64<LD>(c, f[kk], t, kk * 16, lane);
        else {
            uint32_t a[4];
            ldsm_x4(a, frag_a_mk<LD>(tile, row, kk * 16, lane));
            mma_x64<LD>(c, a, t, kk * 16, lane);
        }
    }
};

// ---- forward ----
template <int DK, int DV, int LO>
__global__ void __launch_bounds__(FA_THREADS, 2)
    flash_forward_kernel(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int S, int nh, int nkv,
                         float scale, const int32_t *docpos_, int window_, const float *sinks) {
    constexpr int LV = DV + 8, KD = DK / 16, ND = DV / 8, TK = FA_ROWS * (DK + 8), TV = FA_ROWS * LV;
    const int32_t *docpos = LO & 1 ? docpos_ : NULL; // what LO leaves out folds away
    const int window = LO & 2 ? window_ : 0;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *qs = (bf16 *)fa_smem, *ks = qs + TK, *vs = ks + 2 * TK; // Q; K and V in two stages each
    int b = blockIdx.x / nh, h = blockIdx.x % nh, grp = h / (nh / nkv);
    int nqt = (S + FA_ROWS - 1) / FA_ROWS, q0 = (nqt - 1 - (int)blockIdx.y) * FA_ROWS; // the longest rows first
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    int64_t qld = (int64_t)nh * DK, kld = (int64_t)nkv * DK, old = (int64_t)nh * DV, vld = (int64_t)nkv * DV;
    const bf16 *kg = k + (int64_t)b * S * kld + grp * DK, *vg = v + (int64_t)b * S * vld + grp * DV;
    int nkt = (min(S, q0 + FA_ROWS) + FA_TILE - 1) / FA_TILE; // key tiles that any row of the block sees
    int kt0 = 0, lmax = 0, lo[2] = {0, 0}; // LO: the first key tile, the last row's bound, this thread's rows'
    if (LO) lo_rows(docpos ? docpos + (int64_t)b * S : NULL, window, S, q0, warp * 16 + gq, &kt0, &lmax, lo);
    tile_load<DK>(qs, q + ((int64_t)b * S + q0) * qld + h * DK, qld, S - q0);
    cp_async_commit();
    kv_load<DK, DV>(ks, vs, kg, vg, kld, vld, S, kt0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const RowFrags<DK> qf(qs, warp * 16, lane);
    const float sl2 = scale * FA_LOG2E;
    float acc[ND][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    if (sinks) { // a key of logit sinks[h] (sinks[h]/scale in the units of m) and no value; l is the quad's sum
        m[0] = m[1] = sinks[h] / scale;
        l[0] = l[1] = tq == 0 ? 1.0f : 0.0f;
    }
    for (int j = kt0; j < nkt; j++) {
        int st = (j - kt0) & 1, j0 = j * FA_TILE;
        if (j + 1 < nkt) kv_load<DK, DV>(ks + (st ^ 1) * TK, vs + (st ^ 1) * TV, kg, vg, kld, vld, S, j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *kt = ks + st * TK, *vt = vs + st * TV;
        float s[8][4] = {};
#pragma unroll
        for (int kk = 0; kk < KD; kk++) qf.mma(s, kt, kk);
        fa_mask(s, -INFINITY, j == nkt - 1, LO && j0 < lmax, j0, q0 + warp * 16 + gq, S, tq, lo);
#pragma unroll
        for (int r = 0; r < 2; r++) { // online softmax of rows gq (r = 0) and gq + 8 (r = 1)
            float mx = m[r];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float base = mx == -INFINITY ? 0.0f : mx * sl2, corr = exp2f(m[r] * sl2 - base), sum = 0.0f;
            m[r] = mx;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                s[nt][2 * r] = exp2f(s[nt][2 * r] * sl2 - base);
                s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] * sl2 - base);
                sum += s[nt][2 * r] + s[nt][2 * r + 1];
            }
            l[r] = l[r] * corr + sum; // this lane's part of the row sum; the quad adds up at the end
#pragma unroll
            for (int i = 0; i < ND; i++) acc[i][2 * r] *= corr, acc[i][2 * r + 1] *= corr;
        }
        mma_acc_rows_tile<ND, LV>(acc, s, vt, lane); // O += P·V, 16 keys at a time
        __syncthreads(); // stage st is read by all warps before the next iteration refills it
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        int row = q0 + warp * 16 + gq + r * 8;
        if (row >= S) continue;
        store_row<ND>(o + ((int64_t)b * S + row) * old + h * DV + 2 * tq, acc, r, 1.0f / l[r]);
        if (tq == 0) lse[((int64_t)b * nh + h) * S + row] = m[r] * scale + logf(l[r]);
    }
}

// ---- backward, kernel 1: D_i and dq ----
template <int DK, int DV, int LO>
__global__ void __launch_bounds__(FA_THREADS, 2)
    flash_backward_dq_kernel(bf16 *dq, float *Dg, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                             const bf16 *o, const float *lse, int S, int nh, int nkv, float scale,
                             const int32_t *docpos_, int window_) {
    constexpr int LK = DK + 8, KD = DK / 16, KV = DV / 16, ND = DK / 8, TK = FA_ROWS * LK, TV = FA_ROWS * (DV + 8);
    const int32_t *docpos = LO & 1 ? docpos_ : NULL;
    const int window = LO & 2 ? window_ : 0;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *qs = (bf16 *)fa_smem, *dos = qs + TK, *ks = dos + TV, *vs = ks + 2 * TK;
    float *Ds = (float *)(vs + 2 * TV);
    int b = blockIdx.x / nh, h = blockIdx.x % nh, grp = h / (nh / nkv);
    int nqt = (S + FA_ROWS - 1) / FA_ROWS, q0 = (nqt - 1 - (int)blockIdx.y) * FA_ROWS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    int64_t qld = (int64_t)nh * DK, kld = (int64_t)nkv * DK, old = (int64_t)nh * DV, vld = (int64_t)nkv * DV;
    int64_t qoff = ((int64_t)b * S + q0) * qld + h * DK, ooff = ((int64_t)b * S + q0) * old + h * DV;
    const bf16 *kg = k + (int64_t)b * S * kld + grp * DK, *vg = v + (int64_t)b * S * vld + grp * DV;
    int nkt = (min(S, q0 + FA_ROWS) + FA_TILE - 1) / FA_TILE;
    int kt0 = 0, lmax = 0, lo[2] = {0, 0}; // LO: as in the forward
    if (LO) lo_rows(docpos ? docpos + (int64_t)b * S : NULL, window, S, q0, warp * 16 + gq, &kt0, &lmax, lo);
    tile_load<DK>(qs, q + qoff, qld, S - q0);
    tile_load<DV>(dos, dout + ooff, old, S - q0);
    cp_async_commit();
    kv_load<DK, DV>(ks, vs, kg, vg, kld, vld, S, kt0);
    cp_async_commit();
    { // D_i = dout_i·o_i: two threads per row, DV/2 elements each, read straight from global memory
        int r = threadIdx.x >> 1, half = threadIdx.x & 1;
        float part = 0.0f;
        if (q0 + r < S) {
            const uint4 *dp = (const uint4 *)(dout + ooff + r * old + half * (DV / 2)),
                        *op = (const uint4 *)(o + ooff + r * old + half * (DV / 2));
#pragma unroll
            for (int c = 0; c < DV / 16; c++) {
                uint4 a = dp[c], bo = op[c];
                const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)&a, *b2 = (const __nv_bfloat162 *)&bo;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 fa = __bfloat1622float2(a2[e]), fb = __bfloat1622float2(b2[e]);
                    part += fa.x * fb.x + fa.y * fb.y;
                }
            }
        }
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        if (half == 0) {
            Ds[r] = part;
            if (q0 + r < S) Dg[((int64_t)b * nh + h) * S + q0 + r] = part;
        }
    }
    cp_async_wait<1>();
    __syncthreads();
    const RowFrags<DK> qf(qs, warp * 16, lane);
    const RowFrags<DV> df(dos, warp * 16, lane);
    const float sl2 = scale * FA_LOG2E;
    float L2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = q0 + warp * 16 + gq + r * 8;
        L2[r] = row < S ? lse[((int64_t)b * nh + h) * S + row] * FA_LOG2E : INFINITY; // rows past S: P = 0
        Dr[r] = Ds[warp * 16 + gq + r * 8];
    }
    float acc[ND][4] = {};
    for (int j = kt0; j < nkt; j++) {
        int st = (j - kt0) & 1, j0 = j * FA_TILE;
        if (j + 1 < nkt) kv_load<DK, DV>(ks + (st ^ 1) * TK, vs + (st ^ 1) * TV, kg, vg, kld, vld, S, j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *kt = ks + st * TK, *vt = vs + st * TV;
        float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
        for (int kk = 0; kk < KD; kk++) qf.mma(s, kt, kk);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = exp2f(s[nt][e] * sl2 - L2[e >> 1]); // P
        fa_mask(s, 0.0f, j == nkt - 1, LO && j0 < lmax, j0, q0 + warp * 16 + gq, S, tq, lo);
#pragma unroll
        for (int kk = 0; kk < KV; kk++) df.mma(dp, vt, kk); // dP = dO·Vᵀ
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[nt][e] = s[nt][e] * (dp[nt][e] - Dr[e >> 1]); // dS
        mma_acc_rows_tile<ND, LK>(acc, dp, kt, lane);                                    // dQ += dS·K
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = q0 + warp * 16 + gq + r * 8;
        if (row >= S) continue;
        store_row<ND>(dq + ((int64_t)b * S + row) * qld + h * DK + 2 * tq, acc, r, scale);
    }
}

// ---- backward, kernel 2: dk, dv ----
// Starts the loads of iteration it (query head and query tile) into stage st: Q, dO, lse and D rows (and docpos
// rows into ps when there are documents).
template <int DK, int DV, int LO>
__device__ __forceinline__ void
dkdv_prefetch(bf16 *qs, bf16 *dos, float *ls, float *ds, int32_t *ps, const bf16 *q, const bf16 *dout, const float *lse,
              const float *Dg, const int32_t *docpos, int it, int nq, int qt0, int b, int g, int grp, int S, int nh) {
    int h = g * grp + it / nq, qb = (qt0 + it % nq) * FA_TILE;
    int64_t qld = (int64_t)nh * DK, old = (int64_t)nh * DV, roff = ((int64_t)b * nh + h) * S + qb;
    tile_load<DK>(qs, q + ((int64_t)b * S + qb) * qld + h * DK, qld, S - qb);
    tile_load<DV>(dos, dout + ((int64_t)b * S + qb) * old + h * DV, old, S - qb);
    int t = threadIdx.x & 63;
    bool ok = qb + t < S;
    if (threadIdx.x < 64) cp_async4(smem_addr(ls + t), lse + roff + (ok ? t : 0), ok);
    else cp_async4(smem_addr(ds + t), Dg + roff + (ok ? t : 0), ok);
    if ((LO & 1) && threadIdx.x < 64) cp_async4(smem_addr(ps + t), docpos + (int64_t)b * S + qb + (ok ? t : 0), ok);
}

// P: the outputs it makes (1 dv, 2 dk, 3 both). When DK + DV > 256 (Qwen3.5's 256, MLA's 192/128) both accumulators
// would not fit in registers beside Sᵀ and dPᵀ, so two launches make one each (the dk pass recomputes Sᵀ: 5 tile
// products a step instead of 4).
template <int DK, int DV, int LO, int P>
__global__ void __launch_bounds__(FA_THREADS, 2)
    flash_backward_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                               const float *lse, const float *Dg, int S, int nh, int nkv, float scale,
                               const int32_t *docpos_, int window_) {
    constexpr int LK = DK + 8, LV = DV + 8, KD = DK / 16, KV = DV / 16, TK = FA_ROWS * LK, TV = FA_ROWS * LV;
    const int32_t *docpos = LO & 1 ? docpos_ : NULL;
    const int window = LO & 2 ? window_ : 0;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *ks = (bf16 *)fa_smem, *vs = ks + TK, *qs = vs + TV, *dos = qs + 2 * TK; // K, V; Q and dO in two stages
    float *ls = (float *)(dos + 2 * TV), *ds = ls + 2 * FA_TILE;                  // lse and D rows, two stages
    int32_t *ps = (int32_t *)(ds + 2 * FA_TILE);                                  // docpos rows, two stages
    int b = blockIdx.x / nkv, g = blockIdx.x % nkv, grp = nh / nkv;
    int k0 = blockIdx.y * FA_ROWS; // key tile 0 (the most query tiles) first
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    int64_t kld = (int64_t)nkv * DK, vld = (int64_t)nkv * DV;
    int64_t koff = ((int64_t)b * S + k0) * kld + g * DK, voff = ((int64_t)b * S + k0) * vld + g * DV;
    int nqt = (S + FA_TILE - 1) / FA_TILE, qt0 = k0 / FA_TILE, nq = nqt - qt0;
    if (LO) { // the query tiles whose first row's bound is at or before the tile's last key: a prefix
        const int32_t *dp = docpos ? docpos + (int64_t)b * S : NULL;
        int kmax = min(S, k0 + FA_ROWS) - 1;
        nq = 0;
        for (int t0 = qt0; t0 < nqt; t0 += FA_THREADS) {
            int t = t0 + threadIdx.x, c = __syncthreads_count(t < nqt && fa_row_lo(dp, window, t * FA_TILE) <= kmax);
            nq += c;
            if (c < FA_THREADS) break; // c is the block's: every thread leaves together
        }
    }
    int total = grp * nq;
    tile_load<DK>(ks, k + koff, kld, S - k0);
    tile_load<DV>(vs, v + voff, vld, S - k0);
    dkdv_prefetch<DK, DV, LO>(qs, dos, ls, ds, ps, q, dout, lse, Dg, docpos, 0, nq, qt0, b, g, grp, S, nh);
    cp_async_commit();
    const float sl2 = scale * FA_LOG2E;
    float dka[P & 2 ? DK / 8 : 1][4] = {}, dva[P & 1 ? DV / 8 : 1][4] = {};
    for (int it = 0; it < total; it++) {
        int st = it & 1;
        if (it + 1 < total)
            dkdv_prefetch<DK, DV, LO>(qs + (st ^ 1) * TK, dos + (st ^ 1) * TV, ls + (st ^ 1) * FA_TILE,
                                      ds + (st ^ 1) * FA_TILE, ps + (st ^ 1) * FA_TILE, q, dout, lse, Dg, docpos,
                                      it + 1, nq, qt0, b, g, grp, S, nh);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *qt = qs + st * TK, *dot = dos + st * TV;
        const float *lt = ls + st * FA_TILE, *dt = ds + st * FA_TILE;
        int qb = (qt0 + it % nq) * FA_TILE;
        float s[8][4] = {}, dp[8][4] = {}; // Sᵀ and dPᵀ: rows = this warp's 16 keys, columns = the tile's 64 queries
#pragma unroll
        for (int kk = 0; kk < KD; kk++) { // Sᵀ = K·Qᵀ
            uint32_t ka[4];
            ldsm_x4(ka, frag_a_mk<LK>(ks, warp * 16, kk * 16, lane));
            mma_x64<LK>(s, ka, qt, kk * 16, lane);
        }
        bool edge = qb == k0 || qb + FA_TILE > S; // the diagonal tile, or the one with the sequence end
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qi = nt * 8 + 2 * tq + (e & 1), key = k0 + warp * 16 + gq + (e >> 1) * 8;
                float p = exp2f(s[nt][e] * sl2 - lt[qi] * FA_LOG2E);
                s[nt][e] = edge && (key > qb + qi || qb + qi >= S) ? 0.0f : p;
            }
        if (LO) { // queries whose bound lies past a key of this tile: only where the tile's last one's does
            const int32_t *pt = ps + st * FA_TILE;
            constexpr bool doc = LO & 1;
            int last = min(FA_TILE, S - qb) - 1;
            if (fa_row_lo(qb + last, doc ? pt[last] : 0, doc, window) > k0)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) { // query column qi against this thread's keys key and key + 8
                        int qi = nt * 8 + 2 * tq + c, key = k0 + warp * 16 + gq;
                        int bound = fa_row_lo(qb + qi, doc ? pt[qi] : 0, doc, window);
                        if (key < bound) s[nt][c] = 0.0f;
                        if (key + 8 < bound) s[nt][2 + c] = 0.0f;
                    }
        }
        if constexpr (P & 1) mma_acc_rows_tile<DV / 8, LV>(dva, s, dot, lane); // dV += Pᵀ·dO, 16 queries at a time
        if constexpr (P & 2) {
#pragma unroll
            for (int kk = 0; kk < KV; kk++) { // dPᵀ = V·dOᵀ
                uint32_t va[4];
                ldsm_x4(va, frag_a_mk<LV>(vs, warp * 16, kk * 16, lane));
                mma_x64<LV>(dp, va, dot, kk * 16, lane);
            }
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) dp[nt][e] = s[nt][e] * (dp[nt][e] - dt[nt * 8 + 2 * tq + (e & 1)]); // dSᵀ
            mma_acc_rows_tile<DK / 8, LK>(dka, dp, qt, lane); // dK += dSᵀ·Q
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = k0 + warp * 16 + gq + r * 8;
        if (key >= S) continue;
        if constexpr (P & 2) store_row<DK / 8>(dk + ((int64_t)b * S + key) * kld + g * DK + 2 * tq, dka, r, scale);
        if constexpr (P & 1) store_row<DV / 8>(dv + ((int64_t)b * S + key) * vld + g * DV + 2 * tq, dva, r, 1.0f);
    }
}

// ---- launchers ----
static size_t fa_tile_bytes(int D) { return (size_t)FA_ROWS * (D + 8) * sizeof(bf16); }

template <int DK, int DV, int LO>
static void flash_forward_launch(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int S, float scale,
                                 const int32_t *docpos, int window, const float *sinks) {
    int nh = (int)q.n[1], nkv = (int)k.n[1];
    launch(flash_forward_kernel<DK, DV, LO>, dim3((unsigned)(B * nh), (unsigned)((S + FA_ROWS - 1) / FA_ROWS)),
           FA_THREADS, 3 * fa_tile_bytes(DK) + 2 * fa_tile_bytes(DV), (bf16 *)o.p, (float *)lse.p, (const bf16 *)q.p,
           (const bf16 *)k.p, (const bf16 *)v.p, S, nh, nkv, scale, docpos, window, sinks);
}

template <int DK, int DV, int LO>
static void flash_backward_launch(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o,
                                  Tensor lse, int B, int S, float scale, const int32_t *docpos, int window) {
    int nh = (int)q.n[1], nkv = (int)k.n[1];
    float *Dg = (float *)cuda_scratch((size_t)B * nh * S * sizeof(float)); // D_i, from kernel 1 to kernel 2
    size_t tiles6 = 3 * fa_tile_bytes(DK) + 3 * fa_tile_bytes(DV), smem1 = tiles6 + FA_ROWS * sizeof(float),
           smem2 = tiles6 + 4 * FA_TILE * sizeof(float) + (LO & 1 ? 2 * FA_TILE * sizeof(int32_t) : 0);
    unsigned tiles = (unsigned)((S + FA_ROWS - 1) / FA_ROWS);
    launch(flash_backward_dq_kernel<DK, DV, LO>, dim3((unsigned)(B * nh), tiles), FA_THREADS, smem1, (bf16 *)dq.p, Dg,
           (const bf16 *)dout.p, (const bf16 *)q.p, (const bf16 *)k.p, (const bf16 *)v.p, (const bf16 *)o.p,
           (const float *)lse.p, S, nh, nkv, scale, docpos, window);
    auto dkdv = [&](auto kernel) {
        launch(kernel, dim3((unsigned)(B * nkv), tiles), FA_THREADS, smem2, (bf16 *)dk.p, (bf16 *)dv.p,
               (const bf16 *)dout.p, (const bf16 *)q.p, (const bf16 *)k.p, (const bf16 *)v.p, (const float *)lse.p, Dg,
               S, nh, nkv, scale, docpos, window);
    };
    if constexpr (DK + DV > 256)
        dkdv(flash_backward_dkdv_kernel<DK, DV, LO, 1>), dkdv(flash_backward_dkdv_kernel<DK, DV, LO, 2>);
    else dkdv(flash_backward_dkdv_kernel<DK, DV, LO, 3>);
}

// The tensor-core path takes bf16, head dims (q·k, v) 64 or 128 (with or without a window), 256 (Qwen3.5's full
// attention) or 192/128 (MLA; both without a window) and 16-byte aligned tensors; anything else goes to the generic
// kernels of cuda_attention.cu. Each (head dims, LO) has its kernels; LO (the per-row lower bound): bit 0 documents,
// bit 1 a window.
// (clang-format does not settle on one layout for this list.)
// clang-format off
#define FA_FORMS(X) X(64, 64, 0) X(64, 64, 1) X(64, 64, 2) X(64, 64, 3) X(128, 128, 0) X(128, 128, 1) X(128, 128, 2) \
    X(128, 128, 3) X(256, 256, 0) X(256, 256, 1) X(192, 128, 0) X(192, 128, 1)
// clang-format on
static bool flash_form(int DK, int DV, int window) {
    return (DK == DV && (DK == 64 || DK == 128)) || (!window && ((DK == 256 && DV == 256) || (DK == 192 && DV == 128)));
}

bool flash_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int S, float scale, int window,
                             const float *sinks, const int32_t *docpos) {
    int DK = (int)q.n[2], DV = (int)v.n[2], lo = (docpos ? 1 : 0) | (window ? 2 : 0);
    if (q.dt != DT_BF16 || !flash_form(DK, DV, window) || !(scale > 0) || window < 0) return false;
    if (!aligned16(o.p, q.p, k.p, v.p)) return false;
#define FWD(dk, dv, l)                                                                                                 \
    if (DK == dk && DV == dv && lo == l)                                                                               \
        flash_forward_launch<dk, dv, l>(o, lse, q, k, v, B, S, scale, docpos, window, sinks);
    FA_FORMS(FWD)
#undef FWD
    return true;
}

bool flash_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o,
                              Tensor lse, int B, int S, float scale, int window, const int32_t *docpos) {
    int DK = (int)q.n[2], DV = (int)v.n[2], lo = (docpos ? 1 : 0) | (window ? 2 : 0);
    if (q.dt != DT_BF16 || !flash_form(DK, DV, window) || !(scale > 0) || window < 0) return false;
    if (!aligned16(dq.p, dk.p, dv.p, dout.p) || !aligned16(q.p, k.p, v.p, o.p)) return false;
#define BWD(dk_, dv_, l)                                                                                               \
    if (DK == dk_ && DV == dv_ && lo == l)                                                                             \
        flash_backward_launch<dk_, dv_, l>(dq, dk, dv, dout, q, k, v, o, lse, B, S, scale, docpos, window);
    FA_FORMS(BWD)
#undef BWD
    return true;
}
