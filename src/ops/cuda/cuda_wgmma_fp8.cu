// cuda_wgmma_fp8.cu — the experts' FP8 GEMMs on Hopper's E4M3 warpgroup MMA (wgmma m64n128k32 .e4m3.e4m3, fp32
// accumulators), one persistent launch over every expert's output tiles, in DeepSeek-V3's block-scaled form
// (docs/architecture.md, "FP8"):
//   y (R, N) = x_e (R_e, K) · w_eᵀ,  x's codes (R, K) with 1 × 128 scales xs (KB, R): xs[kb·R + r],
//                                     w's codes (E, N, K) with 128 × 128 scales ws (E·NB, ldws): ws[(e·NB + nb)·ldws + kb]
// The input gradient dx_e = dy_e · w_e is the same product against the weight's transposed codes (E, K, N) and their
// transposed scales (Fp8Weight's qt and st), dy quantised 1 × 128 along N. The weight gradient dw_e (N, K) += dy_eᵀ·x_e
// (kind WG_WEIGHT_GRAD) contracts over the expert's tokens: A = dyᵀ's codes (N, Tp), B = xᵀ's (K, Tp), both quantised
// 128 × 1 along the tokens with each expert's rows padded to whole 128-token blocks (Tp their sum), so its scales vary
// along both output dimensions. Letters: R rows, E experts, N outputs, K the reduction (both multiples of 128),
// NB = N / 128, KB = K / 128, TB = Tp / 128.
//
// Structure as cuda_wgmma.cu's kernels (cuda_wgmma.cuh: the TMA, mbarrier and descriptor wrappers, the tile list): a
// CTA of three warpgroups, warpgroup 0 the producer loading per reduction block of BK = 128 codes two 64 × 128-byte
// boxes of x rows and two of w_e rows (one box row = 128 codes = one scale block) into a ring of stages; warpgroups 1
// and 2 each own 64 of the tile's 128 rows. Both operands are K-major (FP8 wgmma has no transposed form), so a box's
// rows are the swizzled 128-byte rows the descriptors walk 32 codes (32 bytes) at a time, as for bf16's 16 values.
// Scales per block (DeepGEMM's promotion): the four k32 products of block kb go into a block accumulator b (fp32 in
// the tensor core's narrower internal adds), which the consumer then adds into the tile's accumulator d as
// d += b · xs(row, kb) · ws(nb, kb) (weight gradient: b · sdy(tb, n) · sx(tb, k)) — each product scaled exactly once
// by its own blocks' scales. The wait for the block's products before that add is what the second consumer
// warpgroup's products overlap. The block's scales arrive in its stage with its boxes (TMA copies of the tile's 128
// row scales, from the row below it on a 16-byte boundary where a TMA box must start, and the weight block's; for the
// weight gradient two boxes of 128), so no consumer waits on a global load.
// Epilogue: cuda_wgmma.cuh's, as the bf16 kernels': d into swizzled shared boxes, then out by the copy engine (a TMA
// store, or for the weight gradient an fp32 reduction onto dw_e, or a bf16 dw_e's tile loaded, added to in fp32 and
// stored with one rounding) while the warpgroup starts its next tile; rows past
// the tile's expert (they belong to the next expert) are left out by 16-byte stores of the warpgroup's own.
#include "ops/cuda/cuda_wgmma.cuh"

#define W8_BK 128 // E4M3 codes of one reduction block: a scale block, a 128-byte box row
#define W8_BN 128 // output columns of a tile: one weight scale block

// Shared memory for output type TO: the stages (A and B: 2 boxes each) and, per consumer warpgroup, an epilogue tile
// of 64 rows × 128 outputs in swizzled boxes (cuda_wgmma.cuh's epilogue).
template <typename TO> struct W8Shape {
    static constexpr int SA = 2 * WG_BOX, SB = 2 * WG_BOX, EPI = 64 * W8_BN * (int)sizeof(TO);
};

// d (64 × 128 fp32, this thread's 64) = A·B + (acc ? d : 0) over 32 E4M3 codes of the reduction.
static __device__ __forceinline__ void wgmma_e4m3_128(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_D64 ", %64, %65, p, 1, 1;\n}\n"
                 : WG_D64_OUT(d)
                 : "l"(da), "l"(db), "r"(acc));
}

// grid: min(wg_table_build's bound, SMs) CTAs of 384 threads; WG_SMEM + 1 KB of dynamic shared memory; 64-row ×
// 128-code boxes; mo the output's map (cuda_wgmma.cuh's epilogue). The producer copies each block's scales into its
// stage beside the boxes.
// KIND WG_FORWARD: ma x's codes (R, K), mb w's (E·N, K); msa x's scales (KB, R) in boxes of 132 from the tile's first
// row rounded down to 4 (zeros past R), msb w's (E·NB, ldws) in boxes of 4 (a block's with its neighbours: 16 bytes);
// out y (R, N).
// KIND WG_WEIGHT_GRAD: ma dyᵀ's codes (N, Tp), mb xᵀ's (K, Tp), Tp the padded tokens (expert e's from block tb0[e], in
// device memory: each expert's rows in whole blocks of 128); msa dyᵀ's scales (TB, N), msb xᵀ's (TB, K), one per token
// block and column, in boxes of 128 (a scale per output row and per output column of the tile: 2 × 512 bytes a
// stage); out dw (E, N, K) fp32 or bf16, added to when accumulate, else written.
template <int KIND, typename TO>
__global__ void __launch_bounds__(384, 1)
    wgmma_fp8_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                     const __grid_constant__ CUtensorMap mo, const __grid_constant__ CUtensorMap msa,
                     const __grid_constant__ CUtensorMap msb, TO *out, int accumulate,
                     const __grid_constant__ WgTable gt, const int *tb0) {
    typedef W8Shape<TO> S;
    constexpr bool WGRAD = KIND == WG_WEIGHT_GRAD;
    constexpr int SA = S::SA, SB = S::SB, SC = 1024, ST = SA + SB + SC; // SC: the stage's scales
    constexpr int STAGES = (WG_SMEM - WG_RING_BYTES - 2 * S::EPI) / ST;
    static_assert(16 * STAGES + 16 + WG_TILE_REC * STAGES <= WG_RING_BYTES, "the ring's barriers and records");
    extern __shared__ unsigned char w8_shared[];
    uint32_t base = (sh_addr(w8_shared) + 1023) & ~1023u; // the 128-byte swizzle repeats every 1024 bytes
    uint32_t epi0 = base + STAGES * ST, full = epi0 + 2 * S::EPI, empty = full + 8 * STAGES;
    uint32_t recs = ring_recs(empty, STAGES);
    int wg = threadIdx.x / 128, ntiles = gt.list->ntiles;
    ring_init(full, empty, STAGES);
    if (wg == 0) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x != 0) return;
        int it = 0;
        for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
            Tile ti = tile_of<KIND, W8_BN, W8_BK>(gt, t);
            int tb = WGRAD ? __ldg(tb0 + ti.e) : 0;
            for (int kb = 0; kb < ti.nkb; kb++, it++) {
                int s = it % STAGES;
                mbar_wait(empty + 8 * s, (it / STAGES & 1) ^ 1);
                if (kb == 0) tile_put(recs + WG_TILE_REC * s, ti);
                mbar_expect(full + 8 * s, WGRAD ? ST : SA + SB + 544);
                uint32_t sa = base + s * ST, sb = sa + SA, bar = full + 8 * s;
                for (int i = 0; i < 2; i++) {
                    if (WGRAD) {
                        tma_box(sa + i * WG_BOX, &ma, bar, (tb + kb) * W8_BK, ti.row + 64 * i); // dyᵀ rows n
                        tma_box(sb + i * WG_BOX, &mb, bar, (tb + kb) * W8_BK, ti.col + 64 * i); // xᵀ rows k
                    } else {
                        tma_box(sa + i * WG_BOX, &ma, bar, kb * W8_BK, ti.row + 64 * i);               // x rows
                        tma_box(sb + i * WG_BOX, &mb, bar, kb * W8_BK, ti.e * gt.N + ti.col + 64 * i); // w_e rows n
                    }
                }
                if (!WGRAD) { // x's scales of the tile's 128 rows (0 past R) and w's of the block (its group of 4),
                    // each box starting 16-byte aligned in its row (the TMA takes no other start): from row ti.row & ~3
                    tma_box(sb + SB, &msa, bar, ti.row & ~3, kb);
                    tma_box(sb + SB + 640, &msb, bar, kb & ~3, ti.e * (gt.N / W8_BN) + ti.col / W8_BN);
                }
                if (WGRAD) { // the block's scales of the tile's 128 rows and 128 columns
                    tma_box(sb + SB, &msa, bar, ti.row, tb + kb);
                    tma_box(sb + SB + 512, &msb, bar, ti.col, tb + kb);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    int g = wg - 1, tid = threadIdx.x - 128 * wg, lane = threadIdx.x % 32; // consumer g owns rows 64g..64g+63
    int rl = 64 * g + 16 * (tid / 32) + lane / 4;                          // this thread's rows rl, rl + 8 of the tile
    uint32_t epi = epi0 + g * S::EPI;
    float d[64], b[64]; // the tile's accumulators and one block's
    int it = 0, eph = 0;
    for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
        mbar_wait(full + 8 * (it % STAGES), it / STAGES & 1); // the tile's first block (and its record)
        Tile ti = tile_get(recs + WG_TILE_REC * (it % STAGES));
#pragma unroll
        for (int i = 0; i < 64; i++) d[i] = 0;
        for (int kb = 0; kb < ti.nkb; kb++, it++) {
            int s = it % STAGES;
            uint32_t sa = base + s * ST, sb = sa + SA, sc = sb + SB;
            float s0, s1;
            mbar_wait(full + 8 * s, it / STAGES & 1);
            if (!WGRAD) { // the rows' scales × the weight block's, from the stage (read before it goes back)
                float sw;
                int o = ti.row & 3; // the tile's first row in the copied box
                asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(sw) : "r"(sc + 640 + 4 * (kb & 3)));
                asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(s0) : "r"(sc + 4 * (o + rl)));
                asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(s1) : "r"(sc + 4 * (o + rl + 8)));
                s0 *= sw, s1 *= sw;
            }
            fence_regs<64>(b);
            wgmma_fence();
#pragma unroll
            for (int k32 = 0; k32 < W8_BK / 32; k32++)
                wgmma_e4m3_128(b, smem_desc(sa + g * WG_BOX + k32 * 32, 16, 1024), smem_desc(sb + k32 * 32, 16, 1024),
                               k32 > 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs<64>(b);
            if (WGRAD) {
                // d += b · sdy(row) · sx(column), the column scales read from the stage before it goes back
                asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(s0) : "r"(sc + 4 * rl));
                asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(s1) : "r"(sc + 4 * (rl + 8)));
#pragma unroll
                for (int q = 0; q < 16; q++) {
                    float c0, c1;
                    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                                 : "=f"(c0), "=f"(c1)
                                 : "r"(sc + 512 + 4 * (8 * q + 2 * (lane % 4))));
                    d[4 * q] += b[4 * q] * s0 * c0, d[4 * q + 1] += b[4 * q + 1] * s0 * c1;
                    d[4 * q + 2] += b[4 * q + 2] * s1 * c0, d[4 * q + 3] += b[4 * q + 3] * s1 * c1;
                }
                __syncwarp(); // every lane's reads of the stage's scales before lane 0 gives it back
                if (lane == 0) mbar_arrive(empty + 8 * s);
            } else {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + 8 * s); // the stage goes back to the producer
#pragma unroll
                for (int i = 0; i < 64; i++) d[i] += b[i] * (i & 2 ? s1 : s0); // elements 2, 3 of each 4: row r + 8
            }
        }
        epilogue<KIND, W8_BN, TO>(d, &mo, out, gt, ti, g, tid, epi, WGRAD && accumulate, empty + 8 * (STAGES + g),
                                  &eph);
    }
    if (tid == 0) bulk_wait<false>(); // the last stores are done before the CTA's shared memory goes away
}

// ---- host side ----

// The experts' shapes this kernel takes (its tiles' multiples; also asked without a GPU: op_fp8_tensor_cores).
extern "C" bool cuda_fp8_experts_fit(int64_t E, int64_t N, int64_t K) {
    return E >= 1 && E <= WG_MAX_E && N % W8_BN == 0 && K % W8_BK == 0 && E * N <= 0x7fffffff && K <= 0x7fffffff;
}

// Whether the kernel takes y (R, N) from R rows against E experts' codes (E, N, K): a Hopper GPU, y bf16 or fp32 and
// 16-byte aligned, N and K multiples of 128, at most 256 experts, sizes within int.
bool wgmma_fp8_takes(Tensor y, int64_t R, int64_t E, int64_t N, int64_t K) {
    return (y.dt == DT_BF16 || y.dt == DT_F32) && aligned16(y.p) && cuda_fp8_experts_fit(E, N, K) &&
           R + 256 <= 0x7fffffff && wgmma_available();
}

// y (R, N) = x_e · w_eᵀ per expert on the E4M3 tensor cores (the layouts at the top): xq (R, K) codes and xs (KB, lds)
// scales of x (lds ≥ R a multiple of 4: xs[kb·lds + r]), wq (E·N, K) codes and ws (E·N/128, ldws) scales of w (ldws a
// multiple of 4), offs (E + 1) on the device with offs[E] ≤ R. The caller checked wgmma_fp8_takes; false when a
// pointer is not 16-byte aligned.
bool wgmma_fp8_grouped(Tensor y, const void *xq, const float *xs, int64_t lds, int64_t R, const void *wq,
                       const float *ws, int64_t ldws, int64_t E, int64_t N, int64_t K, const int64_t *offs) {
    if (!aligned16(xq, wq, xs, ws) || lds % 4 || ldws % 4 || lds < R) return false;
    WgTable gt;
    int64_t bound = wg_table_build(&gt, WG_FORWARD, E, N, K, W8_BN, offs, R);
    if (bound < 0) return false;
    if (bound == 0) return true;
    CUtensorMap ma, mb, mo, msa, msb;
    wgmma_tensor_map(&ma, xq, DT_U8, R, K);
    wgmma_tensor_map(&mb, wq, DT_U8, E * N, K);
    wgmma_tensor_map(&mo, y.p, y.dt, t_rows(y), N);
    wgmma_scale_map(&msa, xs, K / W8_BK, R, lds, 132); // 128 rows from a 16-byte boundary: 132
    wgmma_scale_map(&msb, ws, E * N / W8_BN, ldws, ldws, 4);
    static bool attr[2]; // wg_launch's flag per kernel
    DT_SWITCH(y.dt, TO, "fp8_grouped_linear",
              wg_launch(wgmma_fp8_kernel<WG_FORWARD, TO>, &attr[y.dt == DT_F32], bound, ma, mb, mo, msa, msb, (TO *)y.p,
                        0, gt, (const int *)NULL));
    return true;
}

// dw (E, N, K) fp32 or bf16 (+)= dy_eᵀ · x_e per expert (accumulate false: written; the caller zeroes empty experts) on
// the E4M3 tensor cores: dq (N, Tp) and xq (K, Tp) the transposed codes of dy and x, each expert's rows padded to whole
// 128-token blocks (expert e's from block Σ_{j<e} ⌈m_j/128⌉, zero codes in the padding: expert e's from block tb0[e],
// on the device), ds (TB, N) and xs (TB, K) their 128 × 1 scales per token block; offs (E + 1) on the device. The
// caller checked wgmma_fp8_takes (on dw, with N and K).
bool wgmma_fp8_grouped_wgrad(Tensor dw, const void *dq, const float *ds, const void *xq, const float *xs, int64_t Tp,
                             int64_t E, int64_t N, int64_t K, const int64_t *offs, const int *tb0, bool accumulate) {
    if ((dw.dt != DT_F32 && dw.dt != DT_BF16) || !aligned16(dq, xq, ds, xs)) return false;
    WgTable gt;
    int64_t bound = wg_table_build(&gt, WG_WEIGHT_GRAD, E, N, K, W8_BN, offs, Tp);
    if (bound < 0) return false;
    if (bound == 0) return true;
    CUtensorMap ma, mb, mo, msa, msb;
    wgmma_tensor_map(&ma, dq, DT_U8, N, Tp);
    wgmma_tensor_map(&mb, xq, DT_U8, K, Tp);
    wgmma_tensor_map(&mo, dw.p, dw.dt, E * N, K);
    wgmma_scale_map(&msa, ds, Tp / W8_BK, N, N, 128);
    wgmma_scale_map(&msb, xs, Tp / W8_BK, K, K, 128);
    static bool attr[2]; // wg_launch's flag per kernel
    DT_SWITCH(dw.dt, TO, "fp8_grouped_linear_backward_weight",
              wg_launch(wgmma_fp8_kernel<WG_WEIGHT_GRAD, TO>, &attr[dw.dt == DT_F32], bound, ma, mb, mo, msa, msb,
                        (TO *)dw.p, (int)accumulate, gt, tb0));
    return true;
}
