// cuda_wgmma.cuh — Hopper's asynchronous primitives shared by the warpgroup-MMA kernels (cuda_wgmma.cu's bf16
// grouped GEMMs and any other wgmma kernel): mbarriers, TMA box loads and stores (cp.async.bulk.tensor), the
// 128-byte swizzle, shared-memory matrix descriptors and the wgmma fence / commit / wait, and on the host the
// tensor maps the TMA reads through. The layouts are described at the top of cuda_wgmma.cu.
#pragma once
#include "ops/cuda/cuda_common.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

// ---- PTX wrappers ----
static __device__ __forceinline__ uint32_t sh_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Arms the barrier's current phase for `bytes` of TMA traffic (and counts this thread's arrival).
static __device__ __forceinline__ void mbar_expect(uint32_t bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier counts parity 1 as completed).
static __device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
}
// One box at (column c0, row c1) of the map's tensor into shared memory, completing on bar.
static __device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
                 "[%2];\n" ::"r"(dst),
                 "l"(map), "r"(bar), "r"(c0), "r"(c1)
                 : "memory");
}
// One box from shared memory into the map's tensor at (c0, c1): a plain store, or (ADD) an fp32 add onto what is
// there, done by the copy engine at the L2; both complete asynchronously as one bulk group per commit.
template <bool ADD>
static __device__ __forceinline__ void tma_store_box(const CUtensorMap *map, uint32_t src, int c0, int c1) {
    if (ADD)
        asm volatile(
            "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
            "r"(src), "r"(c0), "r"(c1)
            : "memory");
    else
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
                     "r"(src), "r"(c0), "r"(c1)
                     : "memory");
}
static __device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until this thread's bulk stores have read their shared memory (READ) or completed.
template <bool READ> static __device__ __forceinline__ void bulk_wait() {
    if (READ) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// The byte of element (row, byte col) in a box of 64 rows × 128 bytes in the 128-byte swizzle: the 16-byte chunk
// index is XORed with the row's index mod 8 (the layout the TMA writes and reads).
static __device__ __forceinline__ uint32_t swz(uint32_t box, int row, int byte) {
    return box + row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);
}

// A shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte offsets.
// K-major: rows of 128 bytes, 8-row groups SBO = 1024 apart (LBO unused). MN-major: 64 output indices per
// 128-byte row, the next 64 LBO bytes on, 8-row groups of the reduction SBO apart.
static __device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across a wgmma wait.
template <int N> static __device__ __forceinline__ void fence_regs(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- the persistent tile list (cuda_wgmma.cu's kernels and cuda_wgmma_fp8.cu's) ----
// Experts at most; a tile's output rows (the kinds of product: cuda_common.cuh).
#define WG_MAX_E 256
#define WG_BM 128

// The tile list of one product, in device memory: wg_table_build's kernel writes it from the experts' offsets on the
// device, so the host never reads them. Slot s (expert ord[s]) owns tiles tiles[s]..tiles[s+1]-1, ntiles in all.
typedef struct {
    int ntiles;
    int offs[WG_MAX_E + 1]; // the experts' row offsets
    int tiles[WG_MAX_E + 1];
    int ord[WG_MAX_E]; // the experts by rows, most first (stable)
} WgList;
// What a kernel gets by value: the list's address, the product's sizes and the forward's per-expert bias (E, N) bf16
// that its epilogue adds (NULL: none).
typedef struct {
    const WgList *list;
    int E, N, K, ntn; // ntn: tiles along the output's columns
    const bf16 *bias;
} WgTable;

// One tile of the list.
typedef struct {
    int e, r0, m, nkb; // expert, its first row, its rows, reduction blocks of this tile
    int row, col;      // the tile's first output row (in y/dx: absolute; in dw_e: of N) and column
} Tile;

// Tile t of the list (read from device memory through the read-only cache: a few loads per tile, outside the
// reduction loop); BK: the reduction block (64 bf16 or 128 E4M3 values: 128 bytes either way).
template <int KIND, int BN, int BK = 64> static __device__ __forceinline__ Tile tile_of(const WgTable &gt, int t) {
    const WgList *l = gt.list;
    int lo = 0, hi = gt.E - 1; // the slot s with tiles[s] <= t < tiles[s + 1] (group_of's search)
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (__ldg(&l->tiles[mid]) <= t) lo = mid;
        else hi = mid - 1;
    }
    Tile ti;
    int local = t - __ldg(&l->tiles[lo]);
    ti.e = __ldg(&l->ord[lo]), ti.r0 = __ldg(&l->offs[ti.e]), ti.m = __ldg(&l->offs[ti.e + 1]) - ti.r0;
    ti.col = local % gt.ntn * BN;
    if (KIND == WG_WEIGHT_GRAD) ti.row = local / gt.ntn * WG_BM, ti.nkb = (ti.m + BK - 1) / BK;
    else ti.row = ti.r0 + local / gt.ntn * WG_BM, ti.nkb = (KIND == WG_FORWARD ? gt.K : gt.N) / BK;
    return ti;
}

// A tile handed from the producer to the consumers through shared memory, so that only the producer searches the list
// (tile_of's dependent loads, at every tile's start on the consumers' path otherwise): the producer writes the tile
// into the record of the stage that holds the tile's first block before it arrives on that stage's full barrier
// (release), and a consumer reads it after its wait there (acquire), before the stage goes back. 32 bytes a stage.
// The FP8 kernel's; the bf16 kernel's consumers still search (its form of the record, which gave a stage back a block
// later, drew racecheck reports the FP8 form does not, and no step time: bench/results/2026-12-05-s43).
#define WG_TILE_REC 32
static __device__ __forceinline__ void tile_put(uint32_t rec, const Tile &ti) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(rec), "r"(ti.e), "r"(ti.r0), "r"(ti.m), "r"(ti.nkb)
                 : "memory");
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(rec + 16), "r"(ti.row), "r"(ti.col) : "memory");
}
static __device__ __forceinline__ Tile tile_get(uint32_t rec) {
    Tile ti;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(ti.e), "=r"(ti.r0), "=r"(ti.m), "=r"(ti.nkb)
                 : "r"(rec)
                 : "memory");
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(ti.row), "=r"(ti.col) : "r"(rec + 16) : "memory");
    return ti;
}

// The tile list of one product (kind WG_*; bn: the tile's output columns; C: the output's columns, N in the forward,
// K otherwise) from offs (E + 1 int64 on the device), built on the device into the small pool (cuda_wgmma.cu): the
// experts ordered by rows, most first, and each one's tiles — forward and input gradient ⌈rows/128⌉ row tiles of its
// rows, weight gradient ⌈N/128⌉ row tiles of dw_e when it has rows — times ⌈C/bn⌉ column tiles. R: the rows of the
// activations (offs[E] ≤ R). Returns a bound on the tile count from the sizes alone (the grid of the persistent
// kernels: their CTAs stop at the list's count), or −1 when that bound passes int.
int64_t wg_table_build(WgTable *gt, int kind, int64_t E, int64_t N, int64_t K, int bn, const int64_t *offs, int64_t R);

// The stage ring of a producer/consumer CTA: stage s's "full" barrier at full + 8·s (the producer's one arrival and
// its TMA bytes) and "empty" barrier at empty + 8·s (one arrival per consumer warp: 8), then consumer warpgroup g's
// epilogue barrier at empty + 8·(stages + g) (its loads of a tile's output: epilogue), then the stages' tile records
// (ring_recs); the whole CTA waits until they are initialised. The barriers and records take at most WG_RING_BYTES.
#define WG_RING_BYTES 512
static __device__ __forceinline__ uint32_t ring_recs(uint32_t empty, int stages) { return empty + 8 * (stages + 2); }
static __device__ __forceinline__ void ring_init(uint32_t full, uint32_t empty, int stages) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 8);
        for (int g = 0; g < 2; g++) mbar_init(empty + 8 * (stages + g), 1); // the consumers' epilogue loads
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

// The 64 fp32 accumulators of a wgmma m64n128 (this thread's share of a 64 × 128 tile) as inline-asm operands:
// WG_D64 is the register list "{%0, …, %63}" (an instruction's further operands are %64 on), WG_D64_OUT(d) the
// outputs d[0..63] it binds.
#define WG_D64                                                                                                         \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
    "%46, "                                                                                                            \
    "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_D64_OUT(d)                                                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),        \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),        \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),        \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),        \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),        \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// The same for wgmma m64n256 (this thread's 128 of a 64 × 256 tile): "{%0, …, %127}", bound by WG_D64_OUT twice.
#define WG_D128                                                                                                        \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "            \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "             \
    "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "             \
    "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "             \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, "                 \
    "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "                 \
    "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

#define WG_BOX 8192 // bytes of one TMA box: 64 rows of 128 bytes (64 bf16, 32 fp32 or 128 E4M3 values)

// The bias pairs of a forward tile's columns (gt.bias), this thread's: bb[j·16 + q] the two of columns
// j·128 + 8q + 2(lane % 4) and + 1 of the tile, 0 past N; read at the tile's start, under its products.
template <int BN>
static __device__ __forceinline__ void bias_pairs(uint32_t *bb, const WgTable &gt, const Tile &ti, int lane) {
#pragma unroll
    for (int i = 0; i < BN / 8; i++) {
        int c = i * 8 + 2 * (lane % 4), col = ti.col + c;
        bb[i] = col < gt.N ? __ldg((const unsigned *)(gt.bias + (int64_t)ti.e * gt.N + col)) : 0u;
    }
}

// The stored values of an output pair (a, b) as floats: rounded to bf16, and with add the bias pair bp added and
// rounded again — what the product followed by the bias op (cuda_gemm.cu, bias_forward_kernel) stores.
static __device__ __forceinline__ float2 stored_pair(float a, float b, bool add, uint32_t bp) {
    float2 v = __bfloat1622float2(__floats2bfloat162_rn(a, b));
    if (!add) return v;
    float2 c = __bfloat1622float2(*(const __nv_bfloat162 *)&bp);
    return __bfloat1622float2(__floats2bfloat162_rn(v.x + c.x, v.y + c.y));
}

// The warpgroup's finished epi tile (NB boxes of 64 rows × 128 bytes, ES-byte outputs) out, at the tile's columns of
// its rows from row0: by the copy engine through the output's map mo (an fp32 add onto dw_e for the weight gradient
// with accumulate, else a store) when every row is the tile's, else — a forward or input-gradient tile whose rows pass
// the expert's end (they belong to the next expert) — by the threads into out (C columns), the expert's rows only, 16
// bytes a thread at a time.
template <int KIND, int NB, int ES>
static __device__ __forceinline__ void epi_out(const CUtensorMap *mo, void *out, int C, const WgTable &gt,
                                               const Tile &ti, int row0, int end, int tid, uint32_t epi,
                                               bool accumulate) {
    constexpr int COLS = 128 / ES; // outputs per box row
    if (KIND == WG_WEIGHT_GRAD || row0 + 64 <= end) {
        if (tid == 0) {
            int orow = KIND == WG_WEIGHT_GRAD ? ti.e * gt.N + row0 : row0; // dw's rows: expert e's from e·N
#pragma unroll
            for (int b = 0; b < NB; b++) {
                int col = ti.col + b * COLS;
                if (KIND == WG_WEIGHT_GRAD && accumulate && ES == 4)
                    tma_store_box<true>(mo, epi + b * WG_BOX, col, orow);
                else tma_store_box<false>(mo, epi + b * WG_BOX, col, orow);
            }
            bulk_commit();
        }
        return;
    }
    constexpr int CH = NB * 8; // 16-byte chunks of a row
    for (int c = tid; c < 64 * CH; c += 128) {
        int r = c / CH, cc = c % CH;
        int col = ti.col + cc / 8 * COLS + cc % 8 * (16 / ES);
        if (row0 + r >= end) break; // (rows are in order: every later chunk of this thread is past the end too)
        if (col >= C) continue;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(swz(epi + cc / 8 * WG_BOX, r, cc % 8 * 16)));
        *(uint4 *)((char *)out + ((int64_t)(row0 + r) * C + col) * ES) = v;
    }
}

// The consumer warpgroup g's epilogue of tile ti, BN outputs of type TO (bf16 or fp32) a row: its 64 rows of
// accumulators d into its shared tile epi (BN·sizeof(TO)/128 swizzled boxes of 64 rows × 128 bytes), then out by the
// copy engine through the output's map mo — an fp32 add onto dw_e (weight gradient with accumulate), else a store —
// while the warpgroup goes on to its next tile. A bf16 weight gradient with accumulate first loads its tile of dw_e
// into epi (the warpgroup's barrier ebar, phase *eph) and adds each stored value to the fp32 sum before its one
// rounding. A forward or input-gradient tile whose rows pass the expert's end is written by the warpgroup itself into
// out, those rows left out (they belong to the next expert). tid: the thread's index in the warpgroup. The kernel ends
// with bulk_wait<false>() in each warpgroup's thread 0.
// With bias, bb holds the tile's bias pairs (bias_pairs), added to the forward's outputs as stored_pair does (indexed
// by constants only, so that they stay in registers).
template <int KIND, int BN, typename TO>
static __device__ __forceinline__ void epilogue(const float *d, const CUtensorMap *mo, TO *out, const WgTable &gt,
                                                const Tile &ti, int g, int tid, uint32_t epi, bool accumulate,
                                                uint32_t ebar, int *eph, bool bias = false, const uint32_t *bb = NULL) {
    constexpr int ES = (int)sizeof(TO), COLS = 128 / ES;                              // outputs per box row
    int warp = tid / 32, lane = tid % 32, row0 = ti.row + 64 * g, end = ti.r0 + ti.m; // first row; the expert's end
    if (KIND == WG_WEIGHT_GRAD && row0 >= gt.N) return; // the rows past dw_e's last (N a multiple of 64, not 128)
    bool add16 = KIND == WG_WEIGHT_GRAD && ES == 2 && accumulate;
    if (tid == 0) bulk_wait<true>(); // the previous tile's stores have read epi
    if (add16 && tid == 0) {
        mbar_expect(ebar, BN / COLS * WG_BOX);
#pragma unroll
        for (int b = 0; b < BN / COLS; b++) tma_box(epi + b * WG_BOX, mo, ebar, ti.col + b * COLS, ti.e * gt.N + row0);
    }
    if (add16) mbar_wait(ebar, *eph), *eph ^= 1;
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + g) : "memory");
    // thread (warp w, lane l) holds rows r, r + 8 (r = 16w + l/4) at columns 8q + 2(l%4), +1 of each 128
    if (ES == 2 && !add16) { // bf16 by stmatrix: four 8 × 8 blocks a call, 4× fewer shared stores than by pairs
        // blocks (q, rows +0), (q, +8), (q + 1, +0), (q + 1, +8); lane l gives the address of row l % 8 of block
        // l / 8: 16 contiguous bytes, one swizzled chunk
        int b = lane / 8, r = 16 * warp + 8 * (b & 1) + lane % 8;
#pragma unroll
        for (int j = 0; j < BN / 128; j++)
#pragma unroll
            for (int q = 0; q < 16; q += 2) {
                int c = j * 128 + (q + b / 2) * 8;
                uint32_t a = swz(epi + c / COLS * WG_BOX, r, c % COLS * ES), p[4];
#pragma unroll
                for (int m = 0; m < 4; m++) { // block m's columns are those of bias pair j·16 + q + m/2
                    float2 f = stored_pair(d[64 * j + 4 * q + 2 * m], d[64 * j + 4 * q + 2 * m + 1], bias,
                                           bias ? bb[16 * j + q + m / 2] : 0u);
                    __nv_bfloat162 v = __floats2bfloat162_rn(f.x, f.y);
                    p[m] = *(uint32_t *)&v;
                }
                asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(p[0]),
                             "r"(p[1]), "r"(p[2]), "r"(p[3])
                             : "memory");
            }
    } else
#pragma unroll
        for (int j = 0; j < BN / 128; j++)
#pragma unroll
            for (int q = 0; q < 16; q++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int r = 16 * warp + lane / 4 + 8 * h, c = j * 128 + q * 8 + 2 * (lane % 4);
                    float v0 = d[64 * j + 4 * q + 2 * h], v1 = d[64 * j + 4 * q + 2 * h + 1];
                    uint32_t a = swz(epi + c / COLS * WG_BOX, r, c % COLS * ES);
                    if (add16) { // the stored pair, read into fp32
                        uint32_t o;
                        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(o) : "r"(a) : "memory");
                        float2 f = __bfloat1622float2(*(__nv_bfloat162 *)&o);
                        v0 += f.x, v1 += f.y;
                    }
                    if (ES == 4)
                        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(v0), "f"(v1) : "memory");
                    else {
                        __nv_bfloat162 p = __floats2bfloat162_rn(v0, v1);
                        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(*(uint32_t *)&p) : "memory");
                    }
                }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // the copy engine reads what the threads wrote
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + g) : "memory");
    int C = KIND == WG_FORWARD ? gt.N : gt.K;
    epi_out<KIND, BN / COLS, ES>(mo, out, C, gt, ti, row0, end, tid, epi, accumulate);
}

// ---- host side (cuda_wgmma.cu) ----
#define WG_SMEM 231168 // dynamic shared memory asked for: the 227 KB a block may have, less 1 KB of alignment slack
// Launches a persistent wgmma kernel: min(bound, SMs) CTAs of 384 threads (bound: wg_table_build's) with WG_SMEM + 1 KB
// of dynamic shared memory (the 1 KB: alignment slack), allowed once per kernel (attr: the caller's flag for it).
template <typename... P, typename... A>
static void wg_launch(void (*kernel)(P...), bool *attr, int64_t bound, A... args) {
    size_t smem = WG_SMEM + 1024;
    if (!*attr) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    *attr = true;
    int grid = bound < cuda_ctx()->sm_count ? (int)bound : cuda_ctx()->sm_count;
    kernel<<<grid, 384, smem, cuda_stream()>>>(args...);
    CUDA_LAUNCH_CHECK();
}
// True once on a Hopper GPU whose driver gives cuTensorMapEncodeTiled.
bool wgmma_available(void);
// A 2D map over a row-major (rows, cols) tensor of dtype dt (fp32, bf16, or DT_U8: E4M3 codes), boxes of 64 rows × 128
// bytes in the 128-byte swizzle; boxes past the last row read zeros (and are not written).
void wgmma_tensor_map(CUtensorMap *map, const void *p, DType dt, int64_t rows, int64_t cols);
// A 2D map over fp32 scales (rows, cols) a row ld floats apart (ld a multiple of 4; p 16-byte aligned), boxes of one
// row × `box` values, not swizzled; values past cols read 0.
void wgmma_scale_map(CUtensorMap *map, const float *p, int64_t rows, int64_t cols, int64_t ld, int box);
