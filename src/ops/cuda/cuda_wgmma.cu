// cuda_wgmma.cu — the expert (grouped) GEMMs on Hopper's own instructions: warpgroup MMA (wgmma) fed by the
// tensor-memory accelerator (TMA, cp.async.bulk.tensor), one persistent launch over every expert's output tiles.
// Rows offs[e]..offs[e+1] of the activations belong to expert e; w: (E, N, K) bf16.
//   forward         y (R, N)  = x_e (R_e, K) · w_eᵀ          kind WG_FORWARD
//   input gradient  dx (R, K) = dy_e (R_e, N) · w_e          kind WG_INPUT_GRAD
//   weight gradient dw_e (N, K) fp32 or bf16 (+)= dy_eᵀ · x_e  kind WG_WEIGHT_GRAD
// Letters: R rows of the activations, E experts, N = w's rows, K = w's columns, both multiples of 64; a tile is
// BM = 128 output rows by BN (128 or 256) output columns; the reduction runs in blocks of BK = 64.
//
// A CTA is three warpgroups (384 threads) on one SM. Warpgroup 0 is the producer: one thread walks the CTA's tiles
// and issues, per reduction block, TMA copies of 64 × 64 bf16 boxes (8 KB, rows of 128 bytes in the 128-byte
// swizzle that wgmma reads) into a ring of WG_STAGES shared-memory stages, each completing on that stage's "full"
// mbarrier. Warpgroups 1 and 2 are the consumers: each owns 64 of the tile's 128 rows, waits for a stage, issues
// one wgmma m64n256k16 per 16 of the reduction (m64n128k16 on 128-wide tiles; bf16 in, fp32 accumulators in
// registers; two m64n128 halves were 5–9% slower, bench/cuda_ops.md round 13) and, once the tensor cores are done with
// it, arrives on the stage's "empty" mbarrier so the producer refills it. After the last block the consumers
// write the tile from registers while the producer already loads the next tile's blocks.
// The weight gradient's output is large against its products (a tile of dw_e reduces over one expert's rows only);
// stores straight from registers were no faster than this path through shared memory and the copy engine
// (bench/cuda_ops.md, round 6, has the figures), and a bf16 tile goes into shared memory by stmatrix (round 14).
// Persistent scheduling: CTA b runs tiles b, b + grid, b + 2·grid, … of one list that holds every expert's tiles, the
// experts ordered by rows, most first, so skewed routing needs no side streams and an empty expert costs nothing. The
// list is built on the device from the device offsets (wg_list_kernel) just before the product, so the host never
// waits for the routing: the grid is a bound from the sizes (at most the SMs) and a CTA stops at the list's count.
// Operand layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory Layout"): wgmma computes
// D (64 × n) += A (64 × 16) · B (16 × n). An operand is "K-major" when its reduction index runs along the
// 128-byte smem rows, "MN-major" (the instruction's transpose bit) when its output index does:
//   forward:        A = x rows (K-major),    B = w_e rows n (K-major)
//   input gradient: A = dy rows (K-major),   B = w_e rows as reduction (MN-major)
//   weight grad:    A = dy_eᵀ (MN-major),    B = x_e (MN-major); the reduction runs over the expert's rows
// Ragged experts: forward and input-gradient tiles start at the expert's first row and may read rows of the next
// expert (or zeros past R: the TMA fills out-of-range boxes with zeros); their outputs are simply not stored.
// Widths that are multiples of 64 but not of the tile (GPT-OSS's 2880 = 11.25 · 256): the last column tile and, in
// the weight gradient, the last row tile of an expert reach past the output. Their outer columns read zeros (past the
// tensor) or the next expert's weight rows, and are not stored: the TMA clips stores past the last column, and a
// weight-gradient warpgroup whose 64 rows start at N (they would be the next expert's) stores nothing. The cost is
// those products: 1/15 of them at 2880 on 256-wide tiles, which still beat 128-wide ones (wgmma_grouped's choice).
// The weight gradient sums over rows, so in an expert's last partial block the consumers zero the rows past the
// expert in shared memory before the products read them.
#include "ops/cuda/cuda_wgmma.cuh"

#define WG_BK 64

// Shared memory of one configuration: STAGES pipeline stages (A: 2 boxes, B: BN/64 boxes) and, per consumer
// warpgroup, an epilogue tile of 64 rows × BN outputs of type TO (bf16; fp32 or bf16 for the weight gradient).
template <int KIND, int BN, typename TO> struct WgShape {
    static constexpr int SA = 2 * WG_BOX, SB = BN / 64 * WG_BOX;
    static constexpr int EPI = 64 * BN * (int)sizeof(TO);
    static constexpr int STAGES = (WG_SMEM - 256 - 2 * EPI) / (SA + SB);
};

// d (64 × 256 fp32, this thread's 128) = A·B + (acc ? d : 0); TA, TB: the operands are MN-major.
template <int TA, int TB>
static __device__ __forceinline__ void wgmma_256(float *d, uint64_t da, uint64_t db, int acc) {
    float *e = d + 64;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_D128
                 ", %128, %129, p, 1, 1, %131, %132;\n}\n"
                 : WG_D64_OUT(d), WG_D64_OUT(e)
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}

// d (64 × 128 fp32, this thread's 64) = A·B + (acc ? d : 0); TA, TB: the operands are MN-major.
template <int TA, int TB>
static __device__ __forceinline__ void wgmma_128(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : WG_D64_OUT(d)
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}

// The producer's TMA loads of reduction block kb of tile ti into stage (sa: 2 A boxes, sb: BN/64 B boxes).
template <int KIND, int BN>
static __device__ __forceinline__ void load_block(const CUtensorMap *ma, const CUtensorMap *mb, const WgTable &gt,
                                                  const Tile &ti, int kb, uint32_t sa, uint32_t sb, uint32_t bar) {
    int k = kb * WG_BK;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (KIND == WG_WEIGHT_GRAD) tma_box(sa + i * WG_BOX, ma, bar, ti.row + 64 * i, ti.r0 + k); // dy cols, rows
        else tma_box(sa + i * WG_BOX, ma, bar, k, ti.row + 64 * i);                                // x or dy rows
    }
#pragma unroll
    for (int c = 0; c < BN / 64; c++) {
        if (KIND == WG_FORWARD) tma_box(sb + c * WG_BOX, mb, bar, k, ti.e * gt.N + ti.col + 64 * c); // w_e rows n
        else if (KIND == WG_INPUT_GRAD) tma_box(sb + c * WG_BOX, mb, bar, ti.col + 64 * c, ti.e * gt.N + k);
        else tma_box(sb + c * WG_BOX, mb, bar, ti.col + 64 * c, ti.r0 + k); // x rows of the expert
    }
}

// grid: min(wg_table_build's bound, SMs) CTAs of 384 threads; WG_SMEM + 1 KB bytes of dynamic shared memory.
// ma, mb: the operands' maps (64 × 64 bf16 boxes); mo: the output's (bf16 64 × 64, or fp32 32 × 64 boxes).
template <int KIND, int BN, typename TO>
__global__ void __launch_bounds__(384, 1)
    wgmma_grouped_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                         const __grid_constant__ CUtensorMap mo, void *out, const __grid_constant__ WgTable gt,
                         int accumulate) {
    typedef WgShape<KIND, BN, TO> S;
    constexpr int SA = S::SA, SB = S::SB, STAGES = S::STAGES;
    constexpr int TA = KIND == WG_WEIGHT_GRAD, TB = KIND != WG_FORWARD; // MN-major operands
    extern __shared__ unsigned char wg_shared[];
    uint32_t base = (sh_addr(wg_shared) + 1023) & ~1023u; // the 128-byte swizzle repeats every 1024 bytes
    uint32_t epi0 = base + STAGES * (SA + SB), full = epi0 + 2 * S::EPI, empty = full + 8 * STAGES;
    int wg = threadIdx.x / 128, ntiles = gt.list->ntiles;
    ring_init(full, empty, STAGES);
    if (wg == 0) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x != 0) return;
        int it = 0;
        for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
            Tile ti = tile_of<KIND, BN>(gt, t);
            for (int kb = 0; kb < ti.nkb; kb++, it++) {
                int s = it % STAGES;
                mbar_wait(empty + 8 * s, (it / STAGES & 1) ^ 1);
                mbar_expect(full + 8 * s, SA + SB);
                uint32_t sa = base + s * (SA + SB);
                load_block<KIND, BN>(&ma, &mb, gt, ti, kb, sa, sa + SA, full + 8 * s);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    int g = wg - 1, tid = threadIdx.x - 128 * wg, lane = threadIdx.x % 32; // consumer g owns rows 64g..64g+63
    uint32_t epi = epi0 + g * S::EPI;
    float d[BN / 2];                              // BN/128 blocks of 64: the m64n128 accumulators
    uint32_t bb[KIND == WG_FORWARD ? BN / 8 : 1]; // the forward's bias pairs (bias_pairs)
    bool bias = KIND == WG_FORWARD && gt.bias;
    int it = 0, eph = 0;
    for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
        Tile ti = tile_of<KIND, BN>(gt, t);
        if (bias) bias_pairs<BN>(bb, gt, ti, lane);
        for (int kb = 0; kb < ti.nkb; kb++, it++) {
            int s = it % STAGES;
            uint32_t sa = base + s * (SA + SB), sb = sa + SA;
            mbar_wait(full + 8 * s, it / STAGES & 1);
            int valid = ti.m - kb * WG_BK; // weight gradient: rows of the expert in this block
            if (KIND == WG_WEIGHT_GRAD && valid < WG_BK) {
                // zero rows valid..63 of A box g and of B boxes g, g + 2, …; then make the writes visible to
                // the tensor cores (async proxy) and to the other consumer warpgroup
                int chunks = (WG_BK - valid) * 8; // 16-byte chunks per box
                for (int c = tid; c < chunks * (1 + BN / 128); c += 128) {
                    int box = c / chunks, off = (valid * 8 + c % chunks) * 16;
                    uint32_t a = box == 0 ? sa + g * WG_BOX : sb + (2 * (box - 1) + g) * WG_BOX;
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a + off), "r"(0) : "memory");
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                asm volatile("bar.sync 1, 256;\n" ::: "memory");
            }
            fence_regs<BN / 2>(d);
            wgmma_fence();
#pragma unroll
            for (int k16 = 0; k16 < WG_BK / 16; k16++) {
                uint64_t da = TA ? smem_desc(sa + g * WG_BOX + k16 * 2048, 8192, 1024)
                                 : smem_desc(sa + g * WG_BOX + k16 * 32, 16, 1024);
                uint64_t db = TB ? smem_desc(sb + k16 * 2048, 8192, 1024) : smem_desc(sb + k16 * 32, 16, 1024);
                if (BN == 256) wgmma_256<TA, TB>(d, da, db, kb > 0 || k16 > 0); // the 4 B boxes' rows (or columns)
                else wgmma_128<TA, TB>(d, da, db, kb > 0 || k16 > 0);           // follow on in one descriptor
            }
            wgmma_commit();
            fence_regs<BN / 2>(d);
            if (kb > 0) { // the previous block's products are done: its stage goes back to the producer
                wgmma_wait<1>();
                fence_regs<BN / 2>(d);
                if (lane == 0) mbar_arrive(empty + 8 * ((it - 1) % STAGES));
            }
        }
        wgmma_wait<0>();
        fence_regs<BN / 2>(d);
        if (lane == 0) mbar_arrive(empty + 8 * ((it - 1) % STAGES));
        epilogue<KIND, BN, TO>(d, &mo, (TO *)out, gt, ti, g, tid, epi, accumulate, empty + 8 * (STAGES + g), &eph, bias,
                               bb);
    }
    if (tid == 0) bulk_wait<false>(); // the last stores are done before the CTA's shared memory goes away
}

// ---- host side ----
static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled;

// A 2D map over (rows, cols) elements of `es` bytes, a row ld_bytes apart, in boxes of bw × bh; what (for the error).
static void encode_map(CUtensorMap *map, const void *p, CUtensorMapDataType type, int64_t rows, int64_t cols,
                       int64_t ld_bytes, int bw, int bh, bool swizzle, const char *what) {
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld_bytes};
    cuuint32_t box[2] = {(cuuint32_t)bw, (cuuint32_t)bh}, estr[2] = {1, 1};
    CUresult r = encode_tiled(map, type, 2, (void *)p, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                              swizzle ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        die("wgmma: cuTensorMapEncodeTiled failed (%d) for %s(%lld, %lld)", (int)r, what, (long long)rows,
            (long long)cols);
}
void wgmma_tensor_map(CUtensorMap *map, const void *p, DType dt, int64_t rows, int64_t cols) {
    CUtensorMapDataType type = dt == DT_F32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                               : dt == DT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                               : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    int64_t es = (int64_t)dtype_size(dt);
    encode_map(map, p, type, rows, cols, cols * es, (int)(128 / es), 64, true, "");
}
void wgmma_scale_map(CUtensorMap *map, const float *p, int64_t rows, int64_t cols, int64_t ld, int box) {
    encode_map(map, p, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rows, cols, ld * 4, box, 1, false, "scales ");
}

bool wgmma_available(void) {
    static int state; // 0 unknown, 1 yes, 2 no
    if (!state) {
        int dev, major = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        if (major == 9 &&
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess && fn)
            encode_tiled = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        state = encode_tiled ? 1 : 2;
    }
    return state == 1;
}

// One block of WG_MAX_E threads: the tile list l of one product (wg_table_build) from offs (E + 1 int64); thread e
// takes expert e, then slot e of the order.
__global__ void wg_list_kernel(WgList *l, const int64_t *offs, int E, int wgrad, int ntm_w, int ntn) {
    __shared__ int m_s[WG_MAX_E], cnt_s[WG_MAX_E], warp_s[WG_MAX_E / 32];
    int e = threadIdx.x;
    for (int i = e; i <= E; i += WG_MAX_E) l->offs[i] = (int)offs[i]; // (E + 1 of them)
    int m = e < E ? (int)(offs[e + 1] - offs[e]) : 0;
    m_s[e] = m, cnt_s[e] = 0;
    __syncthreads();
    if (e < E) { // its slot: the experts with more rows, and those before it with as many (a stable order)
        int s = 0;
        for (int j = 0; j < E; j++) s += m_s[j] > m || (m_s[j] == m && j < e);
        l->ord[s] = e;
        cnt_s[s] = (wgrad ? (m > 0 ? ntm_w : 0) : (m + WG_BM - 1) / WG_BM) * ntn;
    }
    __syncthreads();
    int v = block_prefix_sum(cnt_s[e], warp_s); // the tiles of slots 0..e
    if (e == 0) l->tiles[0] = 0;
    if (e < E) l->tiles[e + 1] = v;
    if (e == WG_MAX_E - 1) l->ntiles = v;
}

int64_t wg_table_build(WgTable *gt, int kind, int64_t E, int64_t N, int64_t K, int bn, const int64_t *offs, int64_t R) {
    int64_t C = kind == WG_FORWARD ? N : K, ntn = (C + bn - 1) / bn, ntm_w = (N + WG_BM - 1) / WG_BM;
    int64_t busy = E < R ? E : R; // experts that can have rows
    int64_t bound = (kind == WG_WEIGHT_GRAD ? busy * ntm_w : (R + WG_BM - 1) / WG_BM + busy) * ntn;
    if (bound > 0x7fffffff || E > WG_MAX_E) return -1;
    CHECK(sizeof(WgList) <= CUDA_SMALL_BYTES);
    WgList *l = (WgList *)cuda_ctx()->small;
    *gt = (WgTable){l, (int)E, (int)N, (int)K, (int)ntn};
    wg_list_kernel<<<1, WG_MAX_E, 0, cuda_stream()>>>(l, offs, (int)E, kind == WG_WEIGHT_GRAD, (int)ntm_w, (int)ntn);
    CUDA_LAUNCH_CHECK();
    return bound;
}

static int64_t wgmma_calls, wgmma_biases; // products run here, and those adding a bias in their epilogue

// One expert product (cuda_common.cuh). Not fitting: not a Hopper GPU, dtypes, N or K not multiples of 64, more than
// 256 experts, unaligned pointers, sizes past int; a bias where it does not fit the product.
bool wgmma_grouped(int kind, Tensor out, Tensor a, Tensor b, const int64_t *offs, bool accumulate, Tensor bias) {
    bool wgrad = kind == WG_WEIGHT_GRAD;
    Tensor w = wgrad ? out : b; // (E, N, K)
    int64_t E = w.n[0], N = w.n[1], K = w.n[2];
    bool w16 = wgrad && out.dt == DT_BF16; // (added in the epilogue: the stored value into the fp32 sum, one rounding)
    if (a.dt != DT_BF16 || b.dt != DT_BF16 || (out.dt != (wgrad ? DT_F32 : DT_BF16) && !w16)) return false;
    if (E < 1 || E > WG_MAX_E || N % WG_BK || K % WG_BK || E * N > 0x7fffffff || K > 0x7fffffff) return false;
    if (!aligned16(out.p, a.p, b.p)) return false;
    if (t_rows(a) + 256 > 0x7fffffff || (wgrad && t_rows(b) + 256 > 0x7fffffff)) return false;
    if (bias.p && (kind != WG_FORWARD || bias.dt != DT_BF16 || tensor_numel(bias) != E * N || (uintptr_t)bias.p % 4))
        return false;
    if (!wgmma_available()) return false;
    int64_t C = kind == WG_FORWARD ? N : K; // the output's columns
    // 256-wide tiles where they waste at most 1/12 of the products on columns past C (GPT-OSS's 2880: 1/15), 1/10 in
    // the weight gradient, whose short reduction makes a tile's fixed costs weigh more (DeepSeek's 1408: 1/11); the
    // fp32 epilogue tiles of 256 would not fit.
    int bn = (!wgrad || w16) && (C + 255) / 256 * 256 - C <= C / (wgrad ? 10 : 12) ? 256 : 128;
    WgTable gt;
    int64_t bound = wg_table_build(&gt, kind, E, N, K, bn, offs, t_rows(a));
    if (bound < 0) return false;
    gt.bias = (const bf16 *)bias.p;
    wgmma_calls++, wgmma_biases += bias.p != NULL;
    if (wgrad && !accumulate) zero_empty_experts(out.p, offs, E, N * K * dtype_size(out.dt)); // (no tiles)
    if (bound == 0) return true; // no rows: nothing (more) to write or add
    CUtensorMap ma, mb, mo;      // a's (x or dy), b's (w, or x for the weight gradient), out's
    wgmma_tensor_map(&ma, a.p, DT_BF16, t_rows(a), kind == WG_FORWARD ? K : N);
    wgmma_tensor_map(&mb, b.p, DT_BF16, wgrad ? t_rows(b) : E * N, K);
    wgmma_tensor_map(&mo, out.p, out.dt, wgrad ? E * N : t_rows(out), C);
    static bool attr[4][2]; // wg_launch's flag per kernel (kind, or 3: the bf16 weight gradient; bn)
    auto run = [&](auto kernel) {
        wg_launch(kernel, &attr[w16 ? 3 : kind][bn == 256], bound, ma, mb, mo, out.p, gt, (int)accumulate);
    };
    if (w16 && bn == 256) run(wgmma_grouped_kernel<WG_WEIGHT_GRAD, 256, bf16>);
    else if (w16) run(wgmma_grouped_kernel<WG_WEIGHT_GRAD, 128, bf16>);
    else if (wgrad) run(wgmma_grouped_kernel<WG_WEIGHT_GRAD, 128, float>);
    else if (kind == WG_FORWARD && bn == 256) run(wgmma_grouped_kernel<WG_FORWARD, 256, bf16>);
    else if (kind == WG_FORWARD) run(wgmma_grouped_kernel<WG_FORWARD, 128, bf16>);
    else if (bn == 256) run(wgmma_grouped_kernel<WG_INPUT_GRAD, 256, bf16>);
    else run(wgmma_grouped_kernel<WG_INPUT_GRAD, 128, bf16>);
    return true;
}

int64_t wgmma_grouped_calls(bool bias) { return bias ? wgmma_biases : wgmma_calls; }
