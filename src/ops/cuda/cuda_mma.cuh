// cuda_mma.cuh — the tensor-core primitives of our mma.sync kernels (cuda_flash.cu):
// PTX wrappers for cp.async, ldmatrix and mma.sync m16n8k16 (bf16 in, fp32 accumulate), and the lane
// addressing of fragments inside padded shared-memory tiles.
// Layout (PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix"). Lane l, g = l/4, t = l%4:
//   A (16×16, m × k) regs {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}
//   B (16×8, k × n)  regs {(k 2t.., n g), (k 2t+8.., n g)}
//   C (16×8)         {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}
// ldmatrix.x4 loads four 8×8 b16 matrices, lanes 8i..8i+7 giving the row addresses of matrix i; lane l
// receives (row g, cols 2t, 2t+1) of each, and with .trans (rows 2t, 2t+1, col g). So a shared tile stored
// [m][k] feeds A directly and one stored [k][m] feeds A through .trans; a tile stored [n][k] feeds B
// directly and one stored [k][n] through .trans. A C accumulator re-packed to bf16 pairs (pack_bf16) is
// an A fragment of the next product, so a product's result can feed another without shared memory.
// Tiles have rows padded by 8 elements (16 bytes): the 8 row addresses of one ldmatrix matrix then fall
// in 8 different 16-byte bank groups. LD below is that padded row stride in elements.
#pragma once
#include "ops/cuda/cuda_common.cuh"

// ---- PTX wrappers ----
static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 (or 4) bytes global → shared; with valid false the destination is zero-filled and src is not read.
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// d (16×8 fp32) += a (16×16, A fragment) · b (16×8, two B registers).
static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as a bf16 pair, the first in the low half (the lower column of an mma operand).
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// ---- fragment addresses inside padded shared tiles (row stride LD elements), for ldmatrix.x4 ----
// A fragment of the 16×16 block (m0.., k0..) of a tile stored [m][k].
template <int LD> static __device__ __forceinline__ uint32_t frag_a_mk(const bf16 *t, int m0, int k0, int lane) {
    return smem_addr(t + (m0 + (lane & 15)) * LD + k0 + (lane >> 4) * 8);
}
// A fragment (through .trans) of the 16×16 block (m0.., k0..) of a tile stored [k][m]: matrix i = lane/8
// is rows k0 + 8·(i/2).., columns m0 + 8·(i%2)..
template <int LD> static __device__ __forceinline__ uint32_t frag_a_km(const bf16 *t, int k0, int m0, int lane) {
    return smem_addr(t + (k0 + (lane & 7) + ((lane >> 4) << 3)) * LD + m0 + ((lane >> 3) & 1) * 8);
}
// B fragments of two n-tiles (n0.., n0+8..) × k0..k0+15 of a tile stored [n][k]: regs {b0, b1} of n-tile
// n0, then of n0+8.
template <int LD> static __device__ __forceinline__ uint32_t frag_b_nk(const bf16 *t, int n0, int k0, int lane) {
    return smem_addr(t + (n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 + ((lane >> 3) & 1) * 8);
}
// The same two n-tiles (through .trans) of a tile stored [k][n].
template <int LD> static __device__ __forceinline__ uint32_t frag_b_kn(const bf16 *t, int k0, int n0, int lane) {
    return smem_addr(t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}
