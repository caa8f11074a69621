// cuda_grouped.cu — our own grouped (per-expert) weight-gradient GEMM on the tensor cores: one launch runs
// every expert. Rows offs[e]..offs[e+1] of the activations belong to expert e (offs: host int64, E + 1
// entries); the offsets travel to the kernel by value in a parameter struct (GroupTable), so there is no
// upload and no sync, and an expert without rows costs one CTA that returns at once.
//   dw_e (N, K) fp32 += dy_eᵀ (N × m_e) · x_e (m_e × K)      grouped_wgrad_kernel
// dy: (R, N), x: (R, K) bf16 row-major; dw: (E, N, K) fp32.
// Why this is its own kernel: cuBLAS's grouped GEMM refuses bf16 operands with an fp32 output, and one
// cuBLASLt call per expert leaves the GPU idle between the small products. The floor is the fp32
// read-modify-write of dw (E·N·K·8 bytes); two CTAs share an SM, so one's epilogue (dw in and out)
// overlaps the other's products. (Variants measured and dropped: bench/cuda_ops.md.)
// Tensor cores (cuda_mma.cuh has the fragment layouts): both operands are stored with the reduction
// (expert rows) as rows — dy_e is [k][m] and x_e is [k][n] — so both go through ldmatrix .trans. Tiles
// arrive by cp.async (16 bytes, zero-filled past the expert's last row) in a GG_STAGES-deep pipeline.
#include "ops/cuda/cuda_mma.cuh"

#define GG_MAX_EXPERTS 256
// A CTA has 2 × WN warps, 2 along the tile's rows and WN along its columns, each owning 64 × (128/WN)
// outputs. WN = 2: 4 warps of 64 × 64, which need half the shared-memory reads per mma of WN = 4.
#define GG_WN 2
#define GG_TILE 128 // output tile: 128 × 128
#define GG_STEP 32  // reduction elements per pipeline stage
#define GG_STAGES 4
#define GG_LDW (GG_TILE + 8) // padded row (bf16) of a [32][128] tile
#define GG_LDC (GG_TILE + 8) // padded row of the fp32 output staging tile: conflict-free fragment stores

// The expert offsets as ints.
typedef struct {
    int offs[GG_MAX_EXPERTS + 1];
} GroupTable;

// ---- weight gradient ----
// Starts the loads of one stage: rows row0..row0+31 of the expert, columns n0..n0+127 of dy and
// k0..k0+127 of x (dyg, xg point at the expert's first row at those columns); rows from m on are zeros.
template <int THREADS>
static __device__ __forceinline__ void wgrad_load(bf16 *ys, bf16 *xs, const bf16 *dyg, const bf16 *xg, int64_t N,
                                                  int64_t K, int row0, int m) {
    for (int c = threadIdx.x; c < GG_STEP * 16; c += THREADS) { // 32 rows × 16 chunks of 8 elements
        int r = c >> 4, cc = (c & 15) * 8;
        bool ok = row0 + r < m;
        int64_t rr = ok ? row0 + r : 0;
        cp_async16(smem_addr(ys + r * GG_LDW + cc), dyg + rr * N + cc, ok);
        cp_async16(smem_addr(xs + r * GG_LDW + cc), xg + rr * K + cc, ok);
    }
}

// grid (N/128 · K/128, E), 64·WN threads; CTA (tile, e) owns dw_e[n0..n0+127][k0..k0+127].
// Shared: GG_STAGES × {dy [32][GG_LDW], x [32][GG_LDW]} bf16, reused at the end as the fp32 output
// staging tile [128][GG_LDC] (both 69632 bytes).
template <int WN>
__global__ void __launch_bounds__(64 * WN, 2)
    grouped_wgrad_kernel(float *dw, const bf16 *dy, const bf16 *x, int N, int K, GroupTable gt) {
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
        cp_async_commit();
    }
    for (int s = 0; s < nsteps; s++) {
        cp_async_wait<GG_STAGES - 2>(); // stage s has landed (for this thread's copies) ...
        __syncthreads();                // ... for every thread's, and stage s − 1 is read by every warp
        int nx = s + GG_STAGES - 1;
        if (nx < nsteps)
            wgrad_load<THREADS>(ys + nx % GG_STAGES * TS, xs + nx % GG_STAGES * TS, dyg, xg, N, K, nx * GG_STEP, m);
        cp_async_commit(); // (an empty group past the end keeps the wait count right)
        const bf16 *yt = ys + s % GG_STAGES * TS, *xt = xs + s % GG_STAGES * TS;
#pragma unroll
        for (int kk = 0; kk < GG_STEP; kk += 16) {
            uint32_t a[4][4], b[NT / 2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) ldsm_x4_trans(a[i], frag_a_km<GG_LDW>(yt, kk, wm * 64 + i * 16, lane));
#pragma unroll
            for (int jj = 0; jj < NT / 2; jj++)
                ldsm_x4_trans(b[jj], frag_b_kn<GG_LDW>(xt, kk, wn * WC + jj * 16, lane));
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < NT; j++)
                    mma_bf16(acc[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
        }
    }
    // epilogue: the accumulators through shared memory, then dw += them in whole 512-byte rows
    cp_async_wait<0>();
    __syncthreads(); // every warp is done with the pipeline buffers
    float *cs = (float *)gg_shared;
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *(float2 *)(cs + (wm * 64 + i * 16 + g + h * 8) * GG_LDC + wn * WC + j * 8 + 2 * t) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
    __syncthreads();
    const int PER = GG_TILE * GG_TILE / 4 / THREADS,
              BATCH = 16; // float4s per thread (32 or 16), loads in flight at a time
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

// ---- host side ----
// Fills gt from offs (false when E is too large or a count does not fit an int).
static bool group_table(GroupTable *gt, const int64_t *offs, int64_t E) {
    if (E < 1 || E > GG_MAX_EXPERTS || offs[0] < 0 || offs[E] > 0x7fffffff) return false;
    for (int64_t e = 0; e <= E; e++) {
        if (e > 0 && offs[e] < offs[e - 1]) return false;
        gt->offs[e] = (int)offs[e];
    }
    return true;
}

static const size_t WGRAD_SMEM = (size_t)GG_STAGES * 2 * GG_STEP * GG_LDW * sizeof(bf16); // 69632
// dw_e += dy_eᵀ · x_e for every expert in one launch. False when the inputs do not fit the kernel (dtype,
// N or K not a multiple of 128, more than 256 experts, unaligned pointers), and the caller uses cuBLAS.
bool grouped_wgrad_kernel_run(Tensor dw, Tensor dy, Tensor x, const int64_t *offs) {
    int64_t E = dw.n[0], N = dw.n[1], K = dw.n[2];
    if (dy.dt != DT_BF16 || x.dt != DT_BF16 || dw.dt != DT_F32) return false;
    if (N % GG_TILE || K % GG_TILE || N > 0x7fffffff || K > 0x7fffffff || (N / GG_TILE) * (K / GG_TILE) > 0x7fffffff)
        return false;
    if (!aligned16(dw.p, dy.p, x.p)) return false;
    GroupTable gt;
    if (!group_table(&gt, offs, E)) return false;
    if (offs[E] == offs[0] || N == 0 || K == 0) return true; // nothing to add
    static bool attr;
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(grouped_wgrad_kernel<GG_WN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)WGRAD_SMEM));
        attr = true;
    }
    dim3 grid((unsigned)((N / GG_TILE) * (K / GG_TILE)), (unsigned)E);
    grouped_wgrad_kernel<GG_WN><<<grid, 64 * GG_WN, WGRAD_SMEM, cuda_stream()>>>((float *)dw.p, (const bf16 *)dy.p,
                                                                                 (const bf16 *)x.p, (int)N, (int)K, gt);
    CUDA_LAUNCH_CHECK();
    return true;
}
