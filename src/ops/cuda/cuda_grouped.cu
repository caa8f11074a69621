// cuda_grouped.cu — our own grouped (per-expert) GEMMs on the tensor cores: one launch runs every expert.
// Rows offs[e]..offs[e+1] of the activations belong to expert e (offs: host int64, E + 1 entries); the
// offsets travel to the kernel by value in a parameter struct (GroupTable), so there is no upload and
// no sync, and an expert without rows costs one CTA that returns at once.
//   weight gradient  dw_e (N, K) fp32 += dy_eᵀ (N × m_e) · x_e (m_e × K)      grouped_wgrad_kernel
//   forward          y_e (m_e, N) bf16 = x_e (m_e × K) · w_eᵀ (K × N)          grouped_rows_kernel<false>
//   backward input   dx_e (m_e, K) bf16 = dy_e (m_e × N) · w_e (N × K)         grouped_rows_kernel<true>
// dy: (R, N), x: (R, K) bf16 row-major; w: (E, N, K) bf16; dw: (E, N, K) fp32.
// Why the weight gradient is its own kernel: cuBLAS's grouped GEMM refuses bf16 operands with an fp32
// output, and one cuBLASLt call per expert leaves the GPU idle between the small products. The floor is
// the fp32 read-modify-write of dw (E·N·K·8 bytes); two CTAs share an SM, so one's epilogue (dw in and
// out) overlaps the other's products. (Measured on the H200 and dropped: a cp.async.bulk.prefetch.L2 of
// the dw tile when the CTA starts, 8–14% slower; 8 warps of 64 × 32 outputs instead of 4 of 64 × 64,
// 2–30% slower in all three kernels.)
// Tensor-core layout (PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix"; cuda_flash.cu has the
// same idioms): mma.sync m16n8k16 bf16 → fp32. Lane l, g = l/4, t = l%4: A (16×16, m × k) regs
// {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}; B (16×8, k × n) regs {(k 2t.., n g), (k 2t+8.., n g)};
// C (16×8) {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}. ldmatrix.x4 loads four 8×8 b16 matrices, lanes
// 8i..8i+7 giving the row addresses of matrix i; lane l receives (row g, cols 2t, 2t+1) of each, and with
// .trans (rows 2t, 2t+1, col g). So a shared tile stored [m][k] feeds A directly and one stored [k][m]
// feeds A through .trans; a tile stored [n][k] feeds B directly and one stored [k][n] through .trans.
// In the weight gradient both operands are stored with the reduction (expert rows) as rows: dy_e is
// [k][m] and x_e is [k][n], so both go through .trans.
// Shared tiles have rows padded by 8 elements (16 bytes): the 8 row addresses of one ldmatrix matrix then
// fall in 8 different 16-byte bank groups. Tiles arrive by cp.async (16 bytes, zero-filled past the
// expert's last row) in a GG_STAGES-deep pipeline.
#include "ops/cuda/cuda_common.cuh"

#define GG_MAX_EXPERTS 256
// A CTA has 2 × WN warps, 2 along the tile's rows and WN along its columns, each owning 64 × (128/WN)
// outputs. WN = 2: 4 warps of 64 × 64, which need half the shared-memory reads per mma of WN = 4 (8 warps
// of 64 × 32; also correct, and measured slower).
#define GG_WN 2
#define GG_TILE 128    // output tile: 128 × 128
#define GG_STEP 32     // reduction elements per pipeline stage
#define GG_STAGES 4
#define GG_LDW (GG_TILE + 8) // padded row (bf16) of a [32][128] tile
#define GG_LDR (GG_STEP + 8) // padded row (bf16) of a [128][32] tile
#define GG_LDC (GG_TILE + 8) // padded row of the output staging tile (fp32 or bf16): conflict-free fragment stores

// The expert offsets as ints, and for the row-tiled kernels the first row tile of each expert.
typedef struct {
    int offs[GG_MAX_EXPERTS + 1];
    int tile0[GG_MAX_EXPERTS + 1]; // tile0[e] = Σ_{e' < e} ceil(m_e' / 128); tile0[E] = all row tiles
} GroupTable;

// ---- PTX wrappers ----
static __device__ __forceinline__ uint32_t gg_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16 bytes global → shared; with valid false the destination is zero-filled and src is not read.
static __device__ __forceinline__ void gg_cp16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void gg_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void gg_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
static __device__ __forceinline__ void gg_ldsm(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void gg_ldsm_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// d (16×8 fp32) += a (16×16) · b (16×8, two registers)
static __device__ __forceinline__ void gg_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- fragment addresses inside padded shared tiles (row stride LD elements) ----
// A fragment of the 16×16 block (m0.., k0..) of a tile stored [m][k].
template <int LD> static __device__ __forceinline__ uint32_t frag_a_mk(const bf16 *t, int m0, int k0, int lane) {
    return gg_smem(t + (m0 + (lane & 15)) * LD + k0 + (lane >> 4) * 8);
}
// A fragment (through .trans) of the 16×16 block (m0.., k0..) of a tile stored [k][m]: matrix i = lane/8
// is rows k0 + 8·(i/2).., columns m0 + 8·(i%2)..
template <int LD> static __device__ __forceinline__ uint32_t frag_a_km(const bf16 *t, int k0, int m0, int lane) {
    return gg_smem(t + (k0 + (lane & 7) + ((lane >> 4) << 3)) * LD + m0 + ((lane >> 3) & 1) * 8);
}
// B fragments of two n-tiles (n0.., n0+8..) × k0..k0+15 of a tile stored [n][k]: regs {b0, b1} of n-tile
// n0, then of n0+8.
template <int LD> static __device__ __forceinline__ uint32_t frag_b_nk(const bf16 *t, int n0, int k0, int lane) {
    return gg_smem(t + (n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 + ((lane >> 3) & 1) * 8);
}
// The same two n-tiles (through .trans) of a tile stored [k][n].
template <int LD> static __device__ __forceinline__ uint32_t frag_b_kn(const bf16 *t, int k0, int n0, int lane) {
    return gg_smem(t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}

// ---- weight gradient ----
// Starts the loads of one stage: rows row0..row0+31 of the expert, columns n0..n0+127 of dy and
// k0..k0+127 of x (dyg, xg point at the expert's first row at those columns); rows from m on are zeros.
template <int THREADS>
static __device__ __forceinline__ void wgrad_load(bf16 *ys, bf16 *xs, const bf16 *dyg, const bf16 *xg, int64_t N, int64_t K, int row0, int m) {
    for (int c = threadIdx.x; c < GG_STEP * 16; c += THREADS) { // 32 rows × 16 chunks of 8 elements
        int r = c >> 4, cc = (c & 15) * 8;
        bool ok = row0 + r < m;
        int64_t rr = ok ? row0 + r : 0;
        gg_cp16(gg_smem(ys + r * GG_LDW + cc), dyg + rr * N + cc, ok);
        gg_cp16(gg_smem(xs + r * GG_LDW + cc), xg + rr * K + cc, ok);
    }
}

// grid (N/128 · K/128, E), 64·WN threads; CTA (tile, e) owns dw_e[n0..n0+127][k0..k0+127].
// Shared: GG_STAGES × {dy [32][GG_LDW], x [32][GG_LDW]} bf16, reused at the end as the fp32 output
// staging tile [128][GG_LDC] (both 69632 bytes).
template <int WN>
__global__ void __launch_bounds__(64 * WN, 2) grouped_wgrad_kernel(float *dw, const bf16 *dy, const bf16 *x, int N, int K, GroupTable gt) {
    const int THREADS = 64 * WN, WC = GG_TILE / WN, NT = WC / 8; // threads; a warp's columns and n-tiles of 8
    int e = blockIdx.y, r0 = gt.offs[e], m = gt.offs[e + 1] - r0;
    if (m <= 0) return; // nothing to add
    int tk = K / GG_TILE, n0 = blockIdx.x / tk * GG_TILE, k0 = blockIdx.x % tk * GG_TILE;
    float *dwt = dw + ((int64_t)e * N + n0) * K + k0; // the tile's first element; rows K apart
    extern __shared__ __align__(16) unsigned char gg_shared[];
    bf16 *ys = (bf16 *)gg_shared, *xs = ys + GG_STAGES * GG_STEP * GG_LDW;
    const int TS = GG_STEP * GG_LDW; // one stage of one operand
    const bf16 *dyg = dy + (int64_t)r0 * N + n0, *xg = x + (int64_t)r0 * K + k0;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp / WN, wn = warp % WN;
    int nsteps = (m + GG_STEP - 1) / GG_STEP;
    float acc[4][NT][4]; // [m-tile of 16 rows][n-tile of 8 columns][C regs]
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < GG_STAGES - 1; s++) {
        if (s < nsteps) wgrad_load<THREADS>(ys + s * TS, xs + s * TS, dyg, xg, N, K, s * GG_STEP, m);
        gg_commit();
    }
    for (int s = 0; s < nsteps; s++) {
        gg_wait<GG_STAGES - 2>(); // stage s has landed (for this thread's copies) ...
        __syncthreads();          // ... for every thread's, and stage s − 1 is read by every warp
        int nx = s + GG_STAGES - 1;
        if (nx < nsteps) wgrad_load<THREADS>(ys + nx % GG_STAGES * TS, xs + nx % GG_STAGES * TS, dyg, xg, N, K, nx * GG_STEP, m);
        gg_commit(); // (an empty group past the end keeps the wait count right)
        const bf16 *yt = ys + s % GG_STAGES * TS, *xt = xs + s % GG_STAGES * TS;
#pragma unroll
        for (int kk = 0; kk < GG_STEP; kk += 16) {
            uint32_t a[4][4], b[NT / 2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) gg_ldsm_t(a[i], frag_a_km<GG_LDW>(yt, kk, wm * 64 + i * 16, lane));
#pragma unroll
            for (int jj = 0; jj < NT / 2; jj++) gg_ldsm_t(b[jj], frag_b_kn<GG_LDW>(xt, kk, wn * WC + jj * 16, lane));
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < NT; j++) gg_mma(acc[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
        }
    }
    // epilogue: the accumulators through shared memory, then dw += them in whole 512-byte rows
    gg_wait<0>();
    __syncthreads(); // every warp is done with the pipeline buffers
    float *cs = (float *)gg_shared;
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *(float2 *)(cs + (wm * 64 + i * 16 + g + h * 8) * GG_LDC + wn * WC + j * 8 + 2 * t) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
    __syncthreads();
    const int PER = GG_TILE * GG_TILE / 4 / THREADS, BATCH = 16; // float4s per thread (32 or 16), loads in flight at a time
#pragma unroll
    for (int q0 = 0; q0 < PER; q0 += BATCH) {
        float4 v[BATCH];
#pragma unroll
        for (int q = 0; q < BATCH; q++) {
            int idx = threadIdx.x + (q0 + q) * THREADS, row = idx >> 5, col = (idx & 31) * 4;
            v[q] = *(const float4 *)(dwt + (int64_t)row * K + col);
        }
#pragma unroll
        for (int q = 0; q < BATCH; q++) {
            int idx = threadIdx.x + (q0 + q) * THREADS, row = idx >> 5, col = (idx & 31) * 4;
            float4 a = *(const float4 *)(cs + row * GG_LDC + col);
            v[q].x += a.x, v[q].y += a.y, v[q].z += a.z, v[q].w += a.w;
            *(float4 *)(dwt + (int64_t)row * K + col) = v[q];
        }
    }
}

// ---- forward and backward input: tiles of 128 expert rows × 128 output columns ----
// c_e (m_e, Nc) = a_e (m_e, Kr) · B_e with B_e = w_eᵀ (forward: w_e stored (Nc, Kr) = [n][k]) or w_e
// (backward input: w_e stored (Kr, Nc) = [k][n], read through .trans). a, c row-major with Kr and Nc columns.
// grid (Nc/128, total row tiles); the CTA's row tile t belongs to the expert e with tile0[e] ≤ t < tile0[e+1].
// Shared: GG_STAGES × {a [128][GG_LDR], b [128][GG_LDR] or [32][GG_LDW]}, reused as the bf16 output
// staging tile [128][GG_LDC].
template <int THREADS, bool B_KN>
static __device__ __forceinline__ void rows_load(bf16 *as, bf16 *bs, const bf16 *ag, const bf16 *bg, int64_t Kr, int64_t Nc, int kr0, int mrows) {
    for (int c = threadIdx.x; c < GG_TILE * 4; c += THREADS) { // a: 128 rows × 4 chunks
        int r = c >> 2, cc = (c & 3) * 8;
        bool ok = r < mrows;
        gg_cp16(gg_smem(as + r * GG_LDR + cc), ag + (ok ? r : 0) * Kr + kr0 + cc, ok);
        if (B_KN) { // b: 32 rows of the reduction × 16 chunks of the output columns
            int br = c >> 4, bc = (c & 15) * 8;
            gg_cp16(gg_smem(bs + br * GG_LDW + bc), bg + (kr0 + br) * Nc + bc, true);
        } else { // b: 128 output columns × 4 chunks of the reduction
            gg_cp16(gg_smem(bs + r * GG_LDR + cc), bg + r * Kr + kr0 + cc, true);
        }
    }
}

template <int WN, bool B_KN>
__global__ void __launch_bounds__(64 * WN, 2) grouped_rows_kernel(bf16 *c, const bf16 *a, const bf16 *w, int Nc, int Kr, int E, GroupTable gt) {
    const int THREADS = 64 * WN, WC = GG_TILE / WN, NT = WC / 8;
    int t = blockIdx.y, lo = 0, hi = E; // binary search: the last e with tile0[e] ≤ t (tile0 rises, empty experts repeat it)
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (gt.tile0[mid] <= t) lo = mid;
        else hi = mid;
    }
    int e = lo, mt = t - gt.tile0[e];
    int r0 = gt.offs[e] + mt * GG_TILE, mrows = min(GG_TILE, gt.offs[e + 1] - r0), n0 = blockIdx.x * GG_TILE;
    extern __shared__ __align__(16) unsigned char gg_shared[];
    const int TA = GG_TILE * GG_LDR, TB = B_KN ? GG_STEP * GG_LDW : GG_TILE * GG_LDR;
    bf16 *as = (bf16 *)gg_shared, *bs = as + GG_STAGES * TA;
    const bf16 *ag = a + (int64_t)r0 * Kr;
    const bf16 *bg = w + (int64_t)e * Nc * Kr + (B_KN ? n0 : (int64_t)n0 * Kr); // the tile's first column / row
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp / WN, wn = warp % WN;
    int nsteps = Kr / GG_STEP;
    float acc[4][NT][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < GG_STAGES - 1; s++) {
        if (s < nsteps) rows_load<THREADS, B_KN>(as + s * TA, bs + s * TB, ag, bg, Kr, Nc, s * GG_STEP, mrows);
        gg_commit();
    }
    for (int s = 0; s < nsteps; s++) {
        gg_wait<GG_STAGES - 2>();
        __syncthreads();
        int nx = s + GG_STAGES - 1;
        if (nx < nsteps) rows_load<THREADS, B_KN>(as + nx % GG_STAGES * TA, bs + nx % GG_STAGES * TB, ag, bg, Kr, Nc, nx * GG_STEP, mrows);
        gg_commit();
        const bf16 *at = as + s % GG_STAGES * TA, *bt = bs + s % GG_STAGES * TB;
#pragma unroll
        for (int kk = 0; kk < GG_STEP; kk += 16) {
            uint32_t af[4][4], bf[NT / 2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) gg_ldsm(af[i], frag_a_mk<GG_LDR>(at, wm * 64 + i * 16, kk, lane));
#pragma unroll
            for (int jj = 0; jj < NT / 2; jj++) {
                if (B_KN) gg_ldsm_t(bf[jj], frag_b_kn<GG_LDW>(bt, kk, wn * WC + jj * 16, lane));
                else gg_ldsm(bf[jj], frag_b_nk<GG_LDR>(bt, wn * WC + jj * 16, kk, lane));
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < NT; j++) gg_mma(acc[i][j], af[i], bf[j >> 1][(j & 1) * 2], bf[j >> 1][(j & 1) * 2 + 1]);
        }
    }
    // epilogue: bf16 pairs into shared memory, then the valid rows out in 16-byte chunks
    gg_wait<0>();
    __syncthreads();
    bf16 *cs = (bf16 *)gg_shared;
    int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *(__nv_bfloat162 *)(cs + (wm * 64 + i * 16 + g + h * 8) * GG_LDC + wn * WC + j * 8 + 2 * tq) =
                    __floats2bfloat162_rn(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
    __syncthreads();
    bf16 *cg = c + (int64_t)r0 * Nc + n0;
#pragma unroll
    for (int q = 0; q < GG_TILE * 16 / THREADS; q++) { // 128 rows × 16 chunks of 8
        int idx = threadIdx.x + q * THREADS, row = idx >> 4, col = (idx & 15) * 8;
        if (row < mrows) *(uint4 *)(cg + (int64_t)row * Nc + col) = *(const uint4 *)(cs + row * GG_LDC + col);
    }
}

// ---- host side ----
// Fills gt from offs (false when E is too large or a count does not fit an int).
static bool group_table(GroupTable *gt, const int64_t *offs, int64_t E) {
    if (E < 1 || E > GG_MAX_EXPERTS || offs[0] < 0 || offs[E] > 0x7fffffff) return false;
    int tiles = 0;
    for (int64_t e = 0; e <= E; e++) {
        if (e > 0 && offs[e] < offs[e - 1]) return false;
        gt->offs[e] = (int)offs[e];
        gt->tile0[e] = tiles;
        if (e < E) tiles += (int)((offs[e + 1] - offs[e] + GG_TILE - 1) / GG_TILE);
    }
    return true;
}

static bool aligned16(const void *p) { return !((uintptr_t)p & 15); }

static const size_t WGRAD_SMEM = (size_t)GG_STAGES * 2 * GG_STEP * GG_LDW * sizeof(bf16); // 69632
static size_t rows_smem(bool b_kn) {
    size_t a = (size_t)GG_TILE * GG_LDR, b = b_kn ? (size_t)GG_STEP * GG_LDW : (size_t)GG_TILE * GG_LDR;
    return GG_STAGES * (a + b) * sizeof(bf16);
}

// dw_e += dy_eᵀ · x_e for every expert in one launch. False when the inputs do not fit the kernel (dtype,
// N or K not a multiple of 128, more than 256 experts, unaligned pointers), and the caller uses cuBLAS.
bool grouped_wgrad_kernel_run(Tensor dw, Tensor dy, Tensor x, const int64_t *offs) {
    int64_t E = dw.n[0], N = dw.n[1], K = dw.n[2];
    if (dy.dt != DT_BF16 || x.dt != DT_BF16 || dw.dt != DT_F32) return false;
    if (N % GG_TILE || K % GG_TILE || N > 0x7fffffff || K > 0x7fffffff || (N / GG_TILE) * (K / GG_TILE) > 0x7fffffff) return false;
    if (!aligned16(dw.p) || !aligned16(dy.p) || !aligned16(x.p)) return false;
    GroupTable gt;
    if (!group_table(&gt, offs, E)) return false;
    if (offs[E] == offs[0] || N == 0 || K == 0) return true; // nothing to add
    static bool attr;
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(grouped_wgrad_kernel<GG_WN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WGRAD_SMEM));
        attr = true;
    }
    dim3 grid((unsigned)((N / GG_TILE) * (K / GG_TILE)), (unsigned)E);
    grouped_wgrad_kernel<GG_WN><<<grid, 64 * GG_WN, WGRAD_SMEM, cuda_stream()>>>((float *)dw.p, (const bf16 *)dy.p, (const bf16 *)x.p, (int)N, (int)K, gt);
    CUDA_LAUNCH_CHECK();
    return true;
}

// c_e = a_e · w_eᵀ (b_kn false: the forward, c (R, N), a (R, K)) or c_e = a_e · w_e (b_kn true: the backward
// input, c (R, K), a (R, N)) for every expert in one launch; w: (E, N, K). False when it does not fit.
static bool grouped_rows_run(Tensor c, Tensor a, Tensor w, const int64_t *offs, bool b_kn) {
    int64_t E = w.n[0], N = w.n[1], K = w.n[2], Nc = b_kn ? K : N, Kr = b_kn ? N : K;
    if (c.dt != DT_BF16 || a.dt != DT_BF16 || w.dt != DT_BF16) return false;
    if (N % GG_TILE || K % GG_TILE || N > 0x7fffffff || K > 0x7fffffff || Nc / GG_TILE > 65535 * 32) return false;
    if (!aligned16(c.p) || !aligned16(a.p) || !aligned16(w.p)) return false;
    GroupTable gt;
    if (!group_table(&gt, offs, E)) return false;
    int tiles = gt.tile0[E];
    if (tiles > 65535) return false;
    if (tiles == 0 || Nc == 0) return true;
    size_t smem = rows_smem(b_kn);
    void (*kernel)(bf16 *, const bf16 *, const bf16 *, int, int, int, GroupTable) = b_kn ? grouped_rows_kernel<GG_WN, true> : grouped_rows_kernel<GG_WN, false>;
    static bool attr[2];
    if (!attr[b_kn]) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr[b_kn] = true;
    }
    dim3 grid((unsigned)(Nc / GG_TILE), (unsigned)tiles);
    kernel<<<grid, 64 * GG_WN, smem, cuda_stream()>>>((bf16 *)c.p, (const bf16 *)a.p, (const bf16 *)w.p, (int)Nc, (int)Kr, (int)E, gt);
    CUDA_LAUNCH_CHECK();
    return true;
}

bool grouped_forward_kernel_run(Tensor y, Tensor x, Tensor w, const int64_t *offs) { return grouped_rows_run(y, x, w, offs, false); }
bool grouped_backward_input_kernel_run(Tensor dx, Tensor dy, Tensor w, const int64_t *offs) { return grouped_rows_run(dx, dy, w, offs, true); }
