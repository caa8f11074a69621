// cpu_ops.h — the CPU (fp32, OpenMP + OpenBLAS) implementation of every op in ops.h: the reference backend.
// Each op of ops_list.h as cpu_<name> (the comments there hold), and the CPU's own helpers (with <math.h>).
#pragma once
#include <math.h>

#include "base/half.h"
#include "ops/ops.h"

#define OP(ret, name, dev, params, args) ret cpu_##name params;
#include "ops/ops_list.h"
static inline int64_t cpu_embedding_bad_id(void) { return -1; }    // the CPU ops die at a bad id
static inline int64_t cpu_moe_sort_bad_expert(void) { return -1; } // and at a bad expert index
bool cpu_adamw_nonfinite(void);

// Raw pointers of CPU tensors (t_rows/t_cols: base.h).
static inline float *F(Tensor t) { return (float *)t.p; }
static inline int32_t *I32(Tensor t) { return (int32_t *)t.p; }
#define CPU_F32(t) CHECK((t).dev == DEV_CPU && (t).dt == DT_F32)
// The n + 1 int64 row offsets of a grouped op (ops_list.h) as a host array; NULL when offs.p is.
static inline const int64_t *cpu_offs(Tensor offs, int64_t n) {
    CHECK(!offs.p || (offs.dev == DEV_CPU && offs.dt == DT_I64 && tensor_numel(offs) == n + 1));
    return (const int64_t *)offs.p;
}
// σ(x) and d silu(z)/dz in fp64.
static inline double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline double silu_grad(double z) {
    double s = sigm(z);
    return s * (1 + z * (1 - s));
}
// Element i of an fp32 or bf16 tensor as fp32; stores v into it (bf16: rounded to nearest even).
static inline float ld_fb(Tensor t, int64_t i) { return t.dt == DT_BF16 ? bf16_to_f32(((uint16_t *)t.p)[i]) : F(t)[i]; }
static inline void st_fb(Tensor t, int64_t i, float v) {
    if (t.dt == DT_BF16) ((uint16_t *)t.p)[i] = f32_to_bf16(v);
    else F(t)[i] = v;
}

// FP8 E4M3 (cpu_fp8.c, docs/reference.md §20): one value's code and back, the scale of a block with this amax, and
// quantise / dequantise over blocks; q: x's shape uint8 codes, s: (cpu_fp8_scale_rows(...), column blocks) fp32
// (a row of blocks per row for FP8_ROWS, per 128 rows of a group otherwise; a column per 128 columns, or per column
// for FP8_COLS).
uint8_t fp8_e4m3_encode(float v);
float fp8_e4m3_decode(uint8_t q);
float fp8_block_scale(float amax);
int64_t cpu_fp8_scale_rows(Tensor x, Fp8Blocks b, const int64_t *offs, int groups);
void cpu_fp8_quantize(Tensor q, Tensor s, Tensor x, Fp8Blocks b, const int64_t *offs, int groups);
void cpu_fp8_dequantize(Tensor y, Tensor q, Tensor s, Fp8Blocks b, const int64_t *offs, int groups);
// The dense weight's codes and scales (op_fp8_weight_make) and their values y (N, K) = q·s.
void cpu_fp8_weight(Fp8Weight fw, Tensor w);
void cpu_fp8_weight_values(Tensor y, Fp8Weight fw);
