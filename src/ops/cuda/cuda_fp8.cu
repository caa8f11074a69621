// cuda_fp8.cu — FP8 E4M3 on the GPU: block rounding (op_fp8_round, ops.h) with the same blocks, power-of-two scales
// and round-to-nearest-even codes as the reference (ops/cpu/cpu_fp8.c, docs/reference.md §20), through the hardware
// conversion (cvt.rn.satfinite.e4m3x2.f32), so both give the same bits; and the dense FP8 GEMMs on the tensor cores.
// FP8_ROWS: a warp per 1 × 128 block. FP8_COLS and FP8_TILES: one CTA of 128 threads per block row of 128 columns, a
// thread owning a column and walking the block's rows (up to 128); FP8_TILES takes the amax over the CTA, FP8_COLS
// per thread.
// The tensor-core GEMMs are cuBLASLt's block-scaled E4M3 products (cuBLAS ≥ 12.9 on sm_90, docs/architecture.md,
// "FP8"): D = op_T(A)·op_N(B) column-major with both operands stored along the contraction ("TN", the only FP8 form),
// A with BLK128x128_32F scales and B with VEC128_32F ones, fp32 accumulation, D bf16 or fp32. Their layouts:
// BLK128x128 for an operand of R rows (outer) of contraction length k: s[rb·KB4 + kb], KB4 = 4⌈⌈k/128⌉/4⌉;
// VEC128: s[kb·R + r]. Every dimension a multiple of 16 and every pointer 16-byte aligned; other shapes return false.
#include <cuda_fp8.h>

#include "ops/cuda/cuda_common.cuh"

#define FP8_MAX_GROUPS 1024

// The row blocks of x: group g's rows offs[g]..offs[g+1] are row blocks rb0[g]..rb0[g+1] of height bh. In device
// memory (fp8_groups builds it there from the offsets on the device), so the host never reads the offsets: the kernels
// over row blocks launch a bound of them and the blocks past rb0[n] return.
struct Fp8Groups {
    int n, bh;
    int offs[FP8_MAX_GROUPS + 1], rb0[FP8_MAX_GROUPS + 1];
};

__device__ __forceinline__ float fp8_scale(float amax) {
    float s = fmaxf(amax, 1e-4f) / 448.0f;
    uint32_t b = __float_as_uint(s);
    if (b & 0x7fffff) b = (b & 0xff800000u) + 0x800000u; // round up to a power of two
    return __uint_as_float(b);
}

__device__ __forceinline__ uint8_t fp8_code(float v, float inv) {
    return __nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float fp8_decode(uint8_t q) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
}
__device__ __forceinline__ float fp8_value(float v, float s, float inv) { return fp8_decode(fp8_code(v, inv)) * s; }

// The scale of the block holding rows r0..r1 of column c of x (C columns; in: c < C), a thread per column; whole: the
// block spans the CTA's 128 columns (128 threads), else the column alone. NaN when the block holds a non-finite
// value (the step's non-finite check then reports it).
template <typename T>
__device__ float column_block_scale(const T *x, int64_t C, int64_t c, bool in, int64_t r0, int64_t r1, bool whole) {
    __shared__ float red[4];
    __shared__ int bad_s[4];
    float amax = 0;
    int bad = 0;
    for (int64_t r = r0; in && r < r1; r++) {
        float v = ld(x, r * C + c);
        bad |= !isfinite(v), amax = fmaxf(amax, fabsf(v));
    }
    if (whole) {
        int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        for (int o = 16; o; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o)), bad |= __shfl_xor_sync(0xffffffff, bad, o);
        if (lane == 0) red[w] = amax, bad_s[w] = bad;
        __syncthreads();
        amax = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
        bad = bad_s[0] | bad_s[1] | bad_s[2] | bad_s[3];
    }
    return bad ? NAN : fp8_scale(amax);
}

// The scale of a warp's block from each lane's 4 values v (NaN when one is non-finite).
__device__ __forceinline__ float warp_block_scale(const float v[4]) {
    float amax = 0;
    int bad = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) bad |= !isfinite(v[i]), amax = fmaxf(amax, fabsf(v[i]));
    for (int o = 16; o; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o)), bad |= __shfl_xor_sync(0xffffffff, bad, o);
    return bad ? NAN : fp8_scale(amax);
}

// A warp's 1 × 128 block of row r from column c0 (lane i holds columns c0 + i, + 32, + 64, + 96: coalesced): its
// values in v (0 past C) and its scale (NaN when non-finite).
template <typename T> __device__ float row_block_scale(const T *x, int64_t C, int64_t r, int64_t c0, float v[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = c0 + 32 * i < C ? ld(x, r * C + c0 + 32 * i) : 0.0f;
    return warp_block_scale(v);
}

// Eight consecutive values as loaded: bf16 keeps its bit patterns (half the registers of floats, so a CTA can hold a
// whole 128 × 128 block with room for more CTAs), fp32 its floats; v[k] is value k as a float.
template <typename T> struct Pack8 {
    float f[8];
    __device__ __forceinline__ float operator[](int k) const { return f[k]; }
};
template <> struct Pack8<bf16> {
    uint32_t w[4];
    __device__ __forceinline__ float operator[](int k) const {
        return __uint_as_float(k & 1 ? w[k >> 1] & 0xffff0000u : w[k >> 1] << 16);
    }
};

// p[0..7], of which the first n exist (the rest 0): one 16-byte load (bf16; two for fp32) when vec (p 16-byte aligned)
// and all eight exist.
__device__ __forceinline__ void ld8(const bf16 *p, int64_t n, bool vec, Pack8<bf16> &v) {
    if (vec && n >= 8) {
        uint4 u = *(const uint4 *)p;
        v.w[0] = u.x, v.w[1] = u.y, v.w[2] = u.z, v.w[3] = u.w;
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = 2 * i < n ? __bfloat16_as_ushort(p[2 * i]) : 0,
                 hi = 2 * i + 1 < n ? __bfloat16_as_ushort(p[2 * i + 1]) : 0;
        v.w[i] = lo | hi << 16;
    }
}
__device__ __forceinline__ void ld8(const float *p, int64_t n, bool vec, Pack8<float> &v) {
    if (vec && n >= 8) return ld8(p, v.f); // (cuda_common.cuh's)
#pragma unroll
    for (int i = 0; i < 8; i++) v.f[i] = i < n ? p[i] : 0.0f;
}

// |v| as ordered bits for an integer max (non-negative floats order as their bits); a non-finite value's bits are at
// least infinity's (0x7f800000), above every finite one, so the max says whether the block holds one.
__device__ __forceinline__ unsigned amax_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }
// The codes of a and b (a in the low byte): one conversion for the pair.
__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float bits_scale(unsigned b) {
    return b >= 0x7f800000u ? NAN : fp8_scale(__uint_as_float(b));
}

// The rows r0..r1 of row block rb (of all groups' blocks, in order); false past the last block.
__device__ __forceinline__ bool group_rows(const Fp8Groups *gr, int64_t rb, int64_t *r0, int64_t *r1) {
    if (rb >= gr->rb0[gr->n]) return false;
    int lo = group_of(gr->rb0, gr->n, rb); // the group holding row block rb
    *r0 = gr->offs[lo] + (rb - gr->rb0[lo]) * gr->bh, *r1 = min((int64_t)gr->offs[lo + 1], *r0 + gr->bh);
    return true;
}

// grid: (row blocks × column chunks of 128); blockDim 128. whole: one scale per CTA (tiles), else per column (cols).
template <typename T>
__global__ void fp8_round_kernel(T *y, const T *x, int64_t C, int64_t nchunks, const Fp8Groups *gr, bool whole) {
    int64_t rb = blockIdx.x / nchunks, c = (blockIdx.x % nchunks) * 128 + threadIdx.x, r0, r1;
    if (!group_rows(gr, rb, &r0, &r1)) return;
    bool in = c < C;
    float s = column_block_scale(x, C, c, in, r0, r1, whole), inv = 1.0f / s;
    for (int64_t r = r0; in && r < r1; r++) st(y, r * C + c, fp8_value(ld(x, r * C + c), s, inv));
}

// Rows: x (R, C) in 1 × 128 blocks → codes q (R, C) and VEC128 scales s[cb·R + r]; with rows, row r of the output is
// x's row rows[r] / div (the experts' input gathered as it is quantised: x's rows are read once from memory, again
// from L2, and only the codes are written per expert row). VEC (C a multiple of 128, x
// 16-byte and q 8-byte aligned): a half-warp per block, lane i holding columns 8i .. 8i + 7 (one 16-byte load of
// bf16, one 8-byte store of codes), a warp taking 4 blocks two at a time (the second pair's loads in flight with the
// first's); else a warp per block, lane i holding columns i, i + 32, i + 64, i + 96 (coalesced). With y (q and s
// NULL, not VEC: FP8_ROWS rounding) the values q·s into y instead.
template <typename T, bool VEC>
__global__ void fp8_quant_rows_kernel(uint8_t *q, float *s, T *y, const T *x, int64_t R, int64_t C, int64_t nchunks,
                                      int64_t ld, const int *rows, int div) {
    int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5, nb = R * nchunks;
    if (VEC) {
        int half = (threadIdx.x >> 4) & 1, hl = threadIdx.x & 15;
        Pack8<T> v[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int64_t b = 4 * warp + 2 * j + half, xr = b < nb ? b / nchunks : 0;
            if (rows) xr = __ldg(rows + xr) / div;
            ld8(x + xr * C + b % nchunks * 128 + 8 * hl, b < nb ? 8 : 0, true, v[j]);
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int64_t b = 4 * warp + 2 * j + half, r = b / nchunks, cb = b % nchunks;
            unsigned m = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) m = max(m, amax_bits(v[j][k]));
            for (int o = 8; o; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffff, m, o)); // within the half-warp
            float sc = bits_scale(m), inv = 1.0f / sc;
            if (b >= nb) continue;
            if (hl == 0) s[cb * ld + r] = sc;
            uint32_t lo = fp8x2(v[j][0] * inv, v[j][1] * inv) | fp8x2(v[j][2] * inv, v[j][3] * inv) << 16,
                     hi = fp8x2(v[j][4] * inv, v[j][5] * inv) | fp8x2(v[j][6] * inv, v[j][7] * inv) << 16;
            *(uint2 *)(q + r * C + cb * 128 + 8 * hl) = make_uint2(lo, hi);
        }
        return;
    }
    if (warp >= nb) return;
    int64_t r = warp / nchunks, cb = warp % nchunks, c0 = cb * 128 + (threadIdx.x & 31);
    float v[4], sc = row_block_scale(x, C, rows ? __ldg(rows + r) / div : r, c0, v), inv = 1.0f / sc;
    if (s && (threadIdx.x & 31) == 0) s[cb * ld + r] = sc;
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (c0 + 32 * i < C) {
            uint8_t code = fp8_code(v[i], inv);
            if (y) st(y, r * C + c0 + 32 * i, fp8_decode(code) * sc);
            else q[r * C + c0 + 32 * i] = code;
        }
}

// One block of FP8_MAX_GROUPS threads: gr for n groups of rows offs[g]..offs[g+1] (offs NULL: N rows each) in blocks
// of bh rows; thread g takes group g, the row-block prefix a block-wide scan.
__global__ void fp8_groups_kernel(Fp8Groups *gr, const int64_t *offs, int n, int64_t N, int bh) {
    __shared__ int warp_s[FP8_MAX_GROUPS / 32];
    int g = threadIdx.x;
    for (int i = g; i <= n; i += blockDim.x) gr->offs[i] = (int)(offs ? offs[i] : i * N);
    int v = block_prefix_sum(g < n ? (int)(((offs ? offs[g + 1] - offs[g] : N) + bh - 1) / bh) : 0, warp_s);
    if (g == 0) gr->n = n, gr->bh = bh, gr->rb0[0] = 0;
    if (g < n) gr->rb0[g + 1] = v;
}

// A bound on the 128-row blocks of R rows in `groups` groups from the sizes alone: an empty group has none, the others
// at most one part-filled.
extern "C" int64_t cuda_fp8_cols_t_blocks(int64_t R, int64_t groups) {
    return (R + 127) / 128 + (groups < R ? groups : R);
}

// The row blocks of 128 rows in each of n groups of R rows in all, rows offs[g]..offs[g+1] (offs on the device; NULL:
// N rows each), built on the device in the small pool (after the wgmma tile list, which a product reads beside it);
// *tb: their count without offs, else a bound on it (cuda_fp8_cols_t_blocks).
#define FP8_GROUPS_AT ((size_t)64 << 10)
static const Fp8Groups *fp8_groups(const int64_t *offs, int n, int64_t N, int64_t R, int64_t *tb) {
    CHECK(n <= FP8_MAX_GROUPS && FP8_GROUPS_AT + sizeof(Fp8Groups) <= CUDA_SMALL_BYTES);
    Fp8Groups *gr = (Fp8Groups *)((char *)cuda_ctx()->small + FP8_GROUPS_AT);
    fp8_groups_kernel<<<1, FP8_MAX_GROUPS, 0, cuda_stream()>>>(gr, offs, n, N, 128);
    CUDA_LAUNCH_CHECK();
    *tb = offs ? cuda_fp8_cols_t_blocks(R, n) : n * ((N + 127) / 128);
    return gr;
}

extern "C" void cuda_fp8_round(Tensor y, Tensor x, Fp8Blocks b, Tensor offs_t) {
    ON_GPU(x, "fp8_round");
    ON_GPU(y, "fp8_round");
    same_dt(x, y, "fp8_round");
    CHECK(tensor_numel(x) == tensor_numel(y));
    int64_t R = t_rows(x), C = t_cols(x), N = R;
    int groups = 1;
    const int64_t *offs = NULL;
    if (x.nd == 3) R = x.n[0] * x.n[1], C = x.n[2], N = x.n[1], groups = (int)x.n[0];
    else if (offs_t.p) groups = (int)tensor_numel(offs_t) - 1, offs = offsets_device(offs_t, groups, "fp8_round");
    if (groups > FP8_MAX_GROUPS) die("fp8_round: at most %d groups (got %d)", FP8_MAX_GROUPS, groups);
    if (R > 0x7fffffff) die("fp8_round: at most 2^31 rows (got %lld)", (long long)R);
    int64_t nchunks = (C + 127) / 128, tb;
    if (R * nchunks == 0) return;
    if (b == FP8_ROWS) { // rows do not depend on the groups
        DT_SWITCH(x.dt, T, "fp8_round",
                  fp8_quant_rows_kernel<T, false><<<(R * nchunks + 7) / 8, 256, 0, cuda_stream()>>>(
                      NULL, NULL, (T *)y.p, (const T *)x.p, R, C, nchunks, 0, NULL, 0));
        CUDA_LAUNCH_CHECK();
        return;
    }
    const Fp8Groups *gr = fp8_groups(offs, groups, N, R, &tb);
    DT_SWITCH(x.dt, T, "fp8_round",
              fp8_round_kernel<T>
              <<<tb * nchunks, 128, 0, cuda_stream()>>>((T *)y.p, (const T *)x.p, C, nchunks, gr, b == FP8_TILES));
    CUDA_LAUNCH_CHECK();
}

// ---- codes and scales for the tensor-core GEMMs ----

// The transposed codes of block row rb: x (R, C) rows r0..r1 (≤ 128) and column chunk cb (the CTA's 128 columns),
// 128 × 1 blocks (whole false: a scale per column, VEC128 s[rb·C + c]) or one 128 × 128 block (whole: BLK128x128
// s[cb·RB4 + rb]) → qt (C, ldq): qt[c·ldq + p0 + r − r0]; qt's columns p0 + r1 − r0 .. min(p0 + 128, ldq) are written 0
// (the padding of the contraction). For a weight also its codes q (R, C) and the scales of q's layout s2[rb·CB4 + cb]
// (q, s2 NULL: not written). rows: x's row r is rows[r] / div (the experts' input gathered as it is quantised).
// x is read once: 256 threads, each holding two pieces of 4 rows × 8 columns (a row's 8 columns one vector load); a
// warp's pieces are 4 column groups × 8 row groups, so that its 4-byte stores of 4 rows' codes of a column into the
// transposed tile (33 words a row) fall in 32 different banks; the tile then leaves row by row, a warp storing one qt
// row's 128 bytes.
template <typename T>
__device__ void quant_t_block(uint8_t *qt, float *s, uint8_t *q, float *s2, const T *x, int64_t C, int64_t ldq,
                              bool whole, int64_t RB4, int64_t CB4, int64_t rb, int64_t cb, int64_t r0, int64_t r1,
                              int64_t p0, const int *rows = NULL, int div = 1) {
    __shared__ uint32_t tile[128][33]; // tile[c][w]: the codes of rows 4w .. 4w + 3 of the chunk's column c
    __shared__ unsigned cmax[128];     // per column (whole: cmax[0] for the block) the amax bits
    int tid = threadIdx.x, lane = tid & 31;
    int cg = (tid & 3) + 4 * ((tid >> 5) & 3), rg0 = ((tid >> 2) & 7) + 8 * (tid >> 7); // pieces rg0 and rg0 + 16
    int64_t c0 = cb * 128, c = c0 + 8 * cg, nc = C - c;
    bool vec = C % 8 == 0 && (uintptr_t)x % 16 == 0;
    if (tid < 128) cmax[tid] = 0;
    Pack8<T> v[2][4];
    unsigned m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int64_t r = r0 + 4 * (rg0 + 16 * j) + i;
            int64_t xr = r < r1 ? (rows ? __ldg(rows + r) / div : r) : 0;
            ld8(x + xr * C + c, r < r1 ? nc : 0, vec, v[j][i]);
#pragma unroll
            for (int k = 0; k < 8; k++) m[k] = max(m[k], amax_bits(v[j][i][k]));
        }
    if (whole) {
#pragma unroll
        for (int k = 1; k < 8; k++) m[0] = max(m[0], m[k]);
        for (int o = 16; o; o >>= 1) m[0] = max(m[0], __shfl_xor_sync(0xffffffff, m[0], o));
    } else // the warp's 8 row groups of a column: lanes apart by 4, 8, 16
        for (int o = 4; o < 32; o <<= 1)
#pragma unroll
            for (int k = 0; k < 8; k++) m[k] = max(m[k], __shfl_xor_sync(0xffffffff, m[k], o));
    __syncthreads(); // cmax zeroed
    if (whole && lane == 0) atomicMax(&cmax[0], m[0]);
    if (!whole && lane < 4)
#pragma unroll
        for (int k = 0; k < 8; k++) atomicMax(&cmax[8 * cg + k], m[k]);
    __syncthreads();
    float inv[8];
#pragma unroll
    for (int k = 0; k < 8; k++) inv[k] = 1.0f / bits_scale(cmax[whole ? 0 : 8 * cg + k]);
    if (whole && tid == 0) {
        s[cb * RB4 + rb] = bits_scale(cmax[0]);
        if (s2) s2[rb * CB4 + cb] = bits_scale(cmax[0]);
    }
    if (!whole && tid < 128 && c0 + tid < C) s[rb * C + c0 + tid] = bits_scale(cmax[tid]);
    bool vq8 = vec && (uintptr_t)q % 8 == 0;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int rg = rg0 + 16 * j;
        int64_t r = r0 + 4 * rg; // the piece's first row
        // rows past r1 (the padding) get code 0 whatever the scale: a byte mask over the piece's 4 rows
        uint32_t keep = r1 - r >= 4 ? 0xffffffffu : r1 - r <= 0 ? 0u : 0xffffffffu >> 8 * (4 - (r1 - r));
        uint32_t col[8]; // column k's codes of the piece's rows 0..3, one a byte: the word the tile takes
#pragma unroll
        for (int k = 0; k < 8; k++)
            col[k] = (fp8x2(v[j][0][k] * inv[k], v[j][1][k] * inv[k]) | fp8x2(v[j][2][k] * inv[k], v[j][3][k] * inv[k])
                                                                            << 16) &
                     keep;
        if (q)
#pragma unroll
            for (int i = 0; i < 4; i++) { // row i's 8 codes: byte i of each column's word
                if (r + i >= r1) break;
                uint32_t sel = i | (4 + i) << 4,
                         lo = __byte_perm(__byte_perm(col[0], col[1], sel), __byte_perm(col[2], col[3], sel), 0x5410),
                         hi = __byte_perm(__byte_perm(col[4], col[5], sel), __byte_perm(col[6], col[7], sel), 0x5410);
                if (vq8 && nc >= 8) *(uint2 *)(q + (r + i) * C + c) = make_uint2(lo, hi);
                else
                    for (int k = 0; k < 8 && k < nc; k++)
                        q[(r + i) * C + c + k] = (uint8_t)((k < 4 ? lo : hi) >> 8 * (k & 3));
            }
#pragma unroll
        for (int k = 0; k < 8; k++) tile[8 * cg + k][rg] = col[k];
    }
    __syncthreads();
    int64_t pend = min(ldq, p0 + 128);
    bool vq = ldq % 4 == 0 && p0 % 4 == 0 && (uintptr_t)qt % 4 == 0;
    for (int i = tid; i < 128 * 32; i += 256) { // qt row c0 + i / 32, columns p0 + 4·(i % 32) ..
        int64_t cc = c0 + i / 32, p = p0 + 4 * (i % 32);
        uint32_t w = tile[i / 32][i % 32];
        if (cc >= C) continue;
        if (vq && p + 4 <= pend) *(uint32_t *)(qt + cc * ldq + p) = w;
        else
            for (int b = 0; b < 4 && p + b < pend; b++) qt[cc * ldq + p + b] = (uint8_t)(w >> 8 * b);
    }
}

// One matrix x (R, C) in blocks of 128 rows, a CTA per (block row, column chunk); grid.y: E matrices of R rows one
// after another (a weight's experts), each with its own codes and scale tables.
template <typename T>
__global__ void __launch_bounds__(256, 3)
    fp8_quant_t_kernel(uint8_t *qt, float *s, uint8_t *q, float *s2, const T *x, int64_t R, int64_t C, int64_t ldq,
                       bool whole, int64_t RB4, int64_t CB4) {
    int64_t nchunks = (C + 127) / 128, rb = blockIdx.x / nchunks, cb = blockIdx.x % nchunks, e = blockIdx.y;
    x += e * R * C, qt += e * C * ldq, s += whole ? e * nchunks * RB4 : 0;
    if (q) q += e * R * C, s2 += e * ((R + 127) / 128) * CB4;
    quant_t_block(qt, s, q, s2, x, C, ldq, whole, RB4, CB4, rb, cb, rb * 128, min(R, rb * 128 + 128), rb * 128);
}

// The groups' rows (an expert's tokens) in 128 × 1 blocks from each group's first row: block row rb at qt's columns
// rb·128 .. (each group padded to whole blocks with zero codes), scales s[rb·C + c].
template <typename T>
__global__ void __launch_bounds__(256, 4)
    fp8_quant_t_groups_kernel(uint8_t *qt, float *s, const T *x, int64_t C, int64_t ldq, const Fp8Groups *gr,
                              const int *rows, int div) {
    int64_t nchunks = (C + 127) / 128, rb = blockIdx.x / nchunks, cb = blockIdx.x % nchunks, r0, r1;
    if (!group_rows(gr, rb, &r0, &r1)) return;
    quant_t_block(qt, s, (uint8_t *)NULL, (float *)NULL, x, C, ldq, false, 0, 0, rb, cb, r0, r1, rb * 128, rows, div);
}

// y (E, N, K) = q·s from a weight's codes and BLK scales (the GEMMs off the tensor cores); E = 1: a dense weight.
template <typename T>
__global__ void fp8_weight_values_kernel(T *y, const uint8_t *q, const float *s, int64_t E, int64_t N, int64_t K,
                                         int64_t KB4) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, r = i / K; // r: a row of all E·N
    if (i < E * N * K) st(y, i, fp8_decode(q[i]) * s[(r / N * ((N + 127) / 128) + r % N / 128) * KB4 + i % K / 128]);
}

static int64_t up4(int64_t n) { return (n + 3) / 4 * 4; }

static void fp8_weight_on(cudaStream_t st0, Fp8Weight fw, Tensor w) {
    ON_GPU(w, "fp8_weight");
    int64_t E = w.nd == 3 ? w.n[0] : 1, N = w.nd == 3 ? w.n[1] : t_rows(w), K = w.nd == 3 ? w.n[2] : t_cols(w);
    int64_t NB = (N + 127) / 128, KB = (K + 127) / 128;
    CHECK(tensor_numel(fw.q) == E * N * K && fw.q.n[fw.q.nd - 1] == K && fw.s.n[0] == E * NB && fw.s.n[1] == up4(KB) &&
          fw.st.n[1] == up4(NB));
    if (E == 0 || N == 0 || K == 0) return;
    CUDA_CHECK(cudaMemsetAsync(fw.s.p, 0, tensor_bytes(fw.s), st0));
    CUDA_CHECK(cudaMemsetAsync(fw.st.p, 0, tensor_bytes(fw.st), st0));
    // the CTA of block (nb, kb) of expert e writes its codes into q and qt and its scale into s and st
    DT_SWITCH(w.dt, T, "fp8_weight",
              fp8_quant_t_kernel<T><<<dim3((unsigned)(NB * KB), (unsigned)E), 256, 0, st0>>>(
                  (uint8_t *)fw.qt.p, (float *)fw.st.p, (uint8_t *)fw.q.p, (float *)fw.s.p, (const T *)w.p, N, K, N,
                  true, up4(NB), up4(KB)));
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_fp8_weight(Fp8Weight fw, Tensor w) { fp8_weight_on(cuda_stream(), fw, w); }

// op_fp8_weights_ahead's side stream (made at the first call, on the device of that call) and events: `issued` on the
// compute stream where the side stream starts, ready[id] after ticket id's weights.
static cudaStream_t side;
static cudaEvent_t issued, ready[FP8_AHEAD_IDS];

extern "C" void cuda_fp8_weights_ahead(const Fp8Weight *fw, const Tensor *w, int n, int id) {
    CHECK(id >= 0 && id < FP8_AHEAD_IDS);
    if (cuda_capturing()) die("cuda_graph: FP8 weights made ahead on a side stream inside the recording");
    if (!side) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
    }
    if (!ready[id]) CUDA_CHECK(cudaEventCreateWithFlags(&ready[id], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(issued, cuda_stream())); // after the work that wrote w and last read fw
    CUDA_CHECK(cudaStreamWaitEvent(side, issued, 0));
    for (int i = 0; i < n; i++) fp8_weight_on(side, fw[i], w[i]);
    CUDA_CHECK(cudaEventRecord(ready[id], side));
}

extern "C" void cuda_fp8_weights_join(int id) {
    CHECK(id >= 0 && id < FP8_AHEAD_IDS && ready[id]);
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), ready[id], 0));
}

extern "C" void cuda_fp8_weight_values(Tensor y, Fp8Weight fw) {
    ON_GPU(y, "fp8_weight_values");
    int64_t E = fw.q.nd == 3 ? fw.q.n[0] : 1, N = fw.q.n[fw.q.nd - 2], K = fw.q.n[fw.q.nd - 1], n = E * N * K;
    CHECK(tensor_numel(y) == n);
    if (n == 0) return;
    DT_SWITCH(y.dt, T, "fp8_weight_values",
              fp8_weight_values_kernel<T><<<(n + 255) / 256, 256, 0, cuda_stream()>>>(
                  (T *)y.p, (const uint8_t *)fw.q.p, (const float *)fw.s.p, E, N, K, fw.s.n[1]));
    CUDA_LAUNCH_CHECK();
}

static int64_t tc_gemms; // tensor-core GEMMs run (cuda_fp8_tensor_core_gemms)
extern "C" int64_t cuda_fp8_tensor_core_gemms(void) { return tc_gemms; }
static bool counted(bool ran) { return tc_gemms += ran, ran; }

// A dense weight's shapes cuBLASLt's FP8 products take (also asked without a GPU: op_fp8_tensor_cores).
extern "C" bool cuda_fp8_dense_fit(int64_t N, int64_t K) { return N % 16 == 0 && K % 16 == 0; }

// Whether the tensor cores take a GEMM of these sizes, output and operand (fp32 or bf16, 16-byte aligned).
static bool tc_fits(int64_t T, int64_t N, int64_t K, Tensor out, Tensor in) {
    return T > 0 && T % 16 == 0 && cuda_fp8_dense_fit(N, K) && (out.dt == DT_F32 || out.dt == DT_BF16) &&
           (in.dt == DT_F32 || in.dt == DT_BF16) && aligned16(out.p, in.p);
}

// 256-byte aligned pieces of the op scratch (cuda_scratch), n bytes each.
static size_t a256(size_t n) { return (n + 255) & ~(size_t)255; }

// x (R, C) quantised in 1 × 128 blocks: codes q (R, C) and scales s[cb·ld + r] (ld = R: cuBLASLt's VEC128 layout;
// the grouped kernel takes ld a multiple of 4, so that each block's row of scales starts 16-byte aligned for its TMA
// copies); q, s NULL: into the op scratch, where *qp and *sp then point. rows (R int32 on the device; NULL: x's own):
// row r is x's row rows[r] / div, x then (R / div, C) or more rows.
static void quant_rows(Tensor x, uint8_t *q, float *s, int64_t ld, uint8_t **qp, float **sp, Tensor rows = Tensor(),
                       int div = 1) {
    int64_t R = rows.p ? tensor_numel(rows) : t_rows(x), C = t_cols(x), nchunks = (C + 127) / 128;
    if (!q) {
        char *p = (char *)cuda_scratch(a256(R * C) + a256(sizeof(float) * ld * nchunks));
        q = (uint8_t *)p, s = (float *)(p + a256(R * C));
    }
    if (qp) *qp = q, *sp = s;
    if (R * nchunks == 0) return;
    // VEC: 32 blocks a CTA of 8 warps, else 8
    BOOL_SWITCH(C % 128 == 0 && aligned16(x.p) && (uintptr_t)q % 8 == 0, VEC,
                DT_SWITCH(x.dt, T, "fp8_quant_rows",
                          fp8_quant_rows_kernel<T, VEC>
                          <<<(unsigned)((R * nchunks + (VEC ? 31 : 7)) / (VEC ? 32 : 8)), 256, 0, cuda_stream()>>>(
                              q, s, (T *)NULL, (const T *)x.p, R, C, nchunks, ld, (const int *)rows.p, div)));
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_fp8_quantize_rows(Tensor q, Tensor s, Tensor x) {
    ON_GPU(x, "fp8_quantize_rows");
    CHECK(q.dt == DT_U8 && tensor_numel(q) == tensor_numel(x) && s.dt == DT_F32 &&
          tensor_numel(s) == t_rows(x) * ((t_cols(x) + 127) / 128));
    quant_rows(x, (uint8_t *)q.p, (float *)s.p, t_rows(x), NULL, NULL);
}

// out (T, m) (+)= in (T, k) · Aᵀ on the tensor cores: in quantised in 1 × 128 blocks (codes and VEC128 scales in the
// op scratch) against a weight's codes A (m rows of k) with their BLK128x128 scales sa.
static bool rows_gemm(Tensor out, Tensor in, int64_t m, const void *A, const float *sa, float beta) {
    int64_t T = t_rows(in), k = t_cols(in);
    if (!tc_fits(T, m, k, out, in)) return false;
    uint8_t *q;
    float *s;
    quant_rows(in, NULL, NULL, T, &q, &s);
    return counted(lt_matmul_fp8(m, T, k, A, sa, q, s, out.p, out.dt, beta));
}

extern "C" bool cuda_fp8_linear_forward(Tensor y, Tensor x, Fp8Weight w8) {
    return rows_gemm(y, x, w8.q.n[0], w8.q.p, (const float *)w8.s.p, 0.0f);
}

extern "C" bool cuda_fp8_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, bool accumulate) {
    return rows_gemm(dx, dy, w8.q.n[1], w8.qt.p, (const float *)w8.st.p, accumulate ? 1.0f : 0.0f);
}

// dw (N, K) += dyᵀ·x over the T tokens: dyᵀ's codes (N, Tp) in 128 × 1 blocks (VEC128 along the tokens) and xᵀ's
// (K, Tp) in 128 × 128 blocks (BLK128x128), Tp = T rounded up to 16 with zero codes.
extern "C" bool cuda_fp8_linear_backward_weight(Tensor dw, Tensor dy, Tensor x) {
    int64_t T = t_rows(x), K = t_cols(x), N = t_cols(dy), Tp = (T + 15) / 16 * 16, TB = (T + 127) / 128;
    if (dw.dt != DT_F32 || !tc_fits(Tp, N, K, dw, x) || !aligned16(dy.p)) return false;
    size_t bd = a256(N * Tp), bx = a256(K * Tp), bsd = a256(sizeof(float) * TB * N);
    char *p = (char *)cuda_scratch(bd + bx + bsd + a256(sizeof(float) * ((K + 127) / 128) * up4(TB)));
    uint8_t *dq = (uint8_t *)p, *xq = (uint8_t *)(p + bd);
    float *ds = (float *)(p + bd + bx), *xs = (float *)(p + bd + bx + bsd);
    cudaStream_t st0 = cuda_stream();
    CUDA_CHECK(cudaMemsetAsync(xs, 0, sizeof(float) * ((K + 127) / 128) * up4(TB), st0)); // the padding of RB4
    DT_SWITCH(dy.dt, T_, "fp8_quant_t",
              fp8_quant_t_kernel<T_>
              <<<TB *((N + 127) / 128), 256, 0, st0>>>(dq, ds, NULL, NULL, (const T_ *)dy.p, T, N, Tp, false, 0, 0));
    CUDA_LAUNCH_CHECK();
    DT_SWITCH(x.dt, T_, "fp8_quant_t",
              fp8_quant_t_kernel<T_><<<TB *((K + 127) / 128), 256, 0, st0>>>(xq, xs, NULL, NULL, (const T_ *)x.p, T, K,
                                                                             Tp, true, up4(TB), 0));
    CUDA_LAUNCH_CHECK();
    return counted(lt_matmul_fp8(K, N, Tp, xq, xs, dq, ds, dw.p, DT_F32, 1.0f));
}

// The experts' forward (y = x_e·w_eᵀ: the codes q and scales s) or input gradient (dx = dy_e·w_e: qt and st) on the
// wgmma E4M3 kernel: x quantised 1 × 128 along its rows (codes and VEC128 scales in the op scratch), then one
// grouped product. y (R, C); x (R, Kx), Kx the reduction.
bool wgmma_fp8_takes(Tensor y, int64_t R, int64_t E, int64_t N, int64_t K);
// offs: the experts' offsets on the device (the tile list is built there); tb0: the weight gradient's first token
// block of each expert, on the device (Fp8Groups.rb0).
bool wgmma_fp8_grouped(Tensor y, const void *xq, const float *xs, int64_t lds, int64_t R, const void *wq,
                       const float *ws, int64_t ldws, int64_t E, int64_t N, int64_t K, const int64_t *offs);
bool wgmma_fp8_grouped_wgrad(Tensor dw, const void *dq, const float *ds, const void *xq, const float *xs, int64_t Tp,
                             int64_t E, int64_t N, int64_t K, const int64_t *offs, const int *tb0, bool accumulate);

extern "C" bool cuda_fp8_grouped_linear(Tensor y, Tensor x, Tensor rows, int div, Fp8Weight w8, Tensor offs_t,
                                        bool input_grad) {
    if (w8.q.nd != 3) return false;
    int64_t E = w8.q.n[0], C = w8.q.n[input_grad ? 2 : 1], Kx = w8.q.n[input_grad ? 1 : 2];
    int64_t R = rows.p ? tensor_numel(rows) : t_rows(x);
    CHECK(t_cols(x) == Kx && t_cols(y) == C && t_rows(y) >= R && (!rows.p || (rows.dt == DT_I32 && !input_grad)));
    const int64_t *offs = offsets_device(offs_t, E, "fp8_grouped_linear");
    if ((x.dt != DT_F32 && x.dt != DT_BF16) || !wgmma_fp8_takes(y, R, E, C, Kx)) return false;
    if (R == 0) return true;
    uint8_t *q;
    float *s;
    int64_t lds = up4(R);
    quant_rows(x, NULL, NULL, lds, &q, &s, rows, div);
    Tensor wq = input_grad ? w8.qt : w8.q, ws = input_grad ? w8.st : w8.s;
    return counted(wgmma_fp8_grouped(y, q, s, lds, R, wq.p, (const float *)ws.p, ws.n[1], E, C, Kx, offs));
}

// x (R, C) (C a multiple of 128) in 128 × 1 blocks within each group of rows of gr (fp8_groups with bh 128, tb row
// blocks at most) → codes qt (C, Tp), each group's rows padded to whole 128-row blocks (Tp = 128·tb: the blocks past
// the groups' are not written), and scales s (tb, C). rows (NULL: x's own): row r is x's row rows[r] / div.
static void quant_t_groups(uint8_t *qt, float *s, Tensor x, const Fp8Groups *gr, int64_t tb, Tensor rows = Tensor(),
                           int div = 1) {
    CHECK(t_cols(x) % 128 == 0);
    int64_t C = t_cols(x);
    if (tb == 0) return;
    DT_SWITCH(x.dt, T, "fp8_quant_t_groups",
              fp8_quant_t_groups_kernel<T><<<tb *(C / 128), 256, 0, cuda_stream()>>>(qt, s, (const T *)x.p, C, tb * 128,
                                                                                     gr, (const int *)rows.p, div));
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_fp8_quantize_cols_t(Tensor qt, Tensor s, Tensor x, Tensor offs) {
    ON_GPU(x, "fp8_quantize_cols_t");
    int groups = (int)tensor_numel(offs) - 1;
    int64_t tb;
    const Fp8Groups *gr = fp8_groups(offsets_device(offs, groups, "fp8_quantize_cols_t"), groups, 0, t_rows(x), &tb);
    CHECK(qt.dt == DT_U8 && tensor_numel(qt) == t_cols(x) * tb * 128 && s.dt == DT_F32 &&
          tensor_numel(s) == tb * t_cols(x));
    quant_t_groups((uint8_t *)qt.p, (float *)s.p, x, gr, tb);
}

// The experts' weight gradient dw (E, N, K) fp32 or bf16 (+)= dy_eᵀ·x_e on the wgmma E4M3 kernel (accumulate false:
// written, an empty expert's zeroed): dy and x (rows: gathered, row r x's rows[r] / div) quantised 128 × 1 along each
// expert's tokens, their codes transposed while quantising (dyᵀ (N, Tp), xᵀ (K, Tp), each expert's rows padded to whole
// 128-token blocks from block rb0[e] of the device Fp8Groups, Tp = 128 × a bound on their count from the sizes) with a
// scale per token block and column, in the op scratch. The offsets stay on the device.
extern "C" bool cuda_fp8_grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, Tensor rows, int div,
                                                        Tensor offs_t, bool accumulate) {
    if (dw.nd != 3 || (dw.dt != DT_F32 && dw.dt != DT_BF16)) return false;
    int64_t E = dw.n[0], N = dw.n[1], K = dw.n[2], R = t_rows(dy), TB;
    CHECK(t_cols(dy) == N && t_cols(x) == K &&
          (rows.p ? rows.dt == DT_I32 && tensor_numel(rows) >= R : t_rows(x) == R));
    if ((x.dt != DT_F32 && x.dt != DT_BF16) || dy.dt != x.dt || !aligned16(x.p, dy.p) || E > FP8_MAX_GROUPS ||
        !wgmma_fp8_takes(dw, R, E, N, K))
        return false;
    const int64_t *offs = offsets_device(offs_t, E, "fp8_grouped_linear_backward_weight");
    if (!accumulate) zero_empty_experts(dw.p, offs, E, N * K * dtype_size(dw.dt)); // they have no tiles
    if (R == 0) return true;                                                       // no rows: nothing (more) to write
    const Fp8Groups *gr = fp8_groups(offs, (int)E, 0, R, &TB);
    int64_t Tp = TB * 128;
    size_t bd = a256(N * Tp), bx = a256(K * Tp), bsd = a256(sizeof(float) * TB * N);
    char *p = (char *)cuda_scratch(bd + bx + bsd + a256(sizeof(float) * TB * K));
    uint8_t *dq = (uint8_t *)p, *xq = (uint8_t *)(p + bd);
    float *ds = (float *)(p + bd + bx), *xs = (float *)(p + bd + bx + bsd);
    quant_t_groups(dq, ds, dy, gr, TB), quant_t_groups(xq, xs, x, gr, TB, rows, div);
    return counted(wgmma_fp8_grouped_wgrad(dw, dq, ds, xq, xs, Tp, E, N, K, offs, gr->rb0, accumulate));
}
