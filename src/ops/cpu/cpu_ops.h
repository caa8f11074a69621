// cpu_ops.h — the CPU (fp32, OpenMP + OpenBLAS) implementation of every op in ops.h: the reference backend.
// Signatures equal ops.h with the cpu_ prefix; the comments there hold.
#pragma once
#include "ops/ops.h"

void cpu_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b);
void cpu_linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate);
void cpu_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x);
// y: (M, N) += b: (N) per row, or with offs (grouped) b: (E, N), expert e's on its rows offs[e]..offs[e+1]; db:
// (N) or (E, N) (+)= Σ_rows dy: (M, N) likewise (accumulate false: written).
void cpu_linear_bias_forward(Tensor y, Tensor b, const int64_t *offs);
void cpu_linear_bias_backward(Tensor db, Tensor dy, const int64_t *offs, bool accumulate);
void cpu_grouped_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b, const int64_t *offs);
void cpu_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, const int64_t *offs);
void cpu_grouped_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, const int64_t *offs,
                                        bool accumulate);
void cpu_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps);
void cpu_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate);
void cpu_rope(Tensor x, int off, Tensor cos, Tensor sin, Tensor pos, RopeLayout layout, bool backward);
void cpu_swiglu_forward(Tensor act, Tensor gu);
void cpu_swiglu_backward(Tensor dgu, Tensor dact, Tensor gu);
void cpu_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a);
void cpu_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                            Tensor o, Tensor lse, const AttnArgs *a);
void cpu_attention_merge(Tensor o, Tensor lse, Tensor o_p, Tensor lse_p, int B, bool init);
void cpu_router_forward(Tensor probs, Tensor idx, Tensor w, Tensor logits, const RouterArgs *a);
void cpu_router_backward(Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                         const RouterArgs *a);
void cpu_moe_lb_loss(Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float grad_scale);
void cpu_moe_sort(Tensor perm, int64_t *offs, Tensor idx, int E);
void cpu_gather_rows(Tensor y, Tensor x, Tensor rows, int div);
void cpu_scatter_add_rows(Tensor dx, Tensor dy, Tensor rows, int div);
void cpu_scatter_rows(Tensor y, Tensor x, Tensor rows);
void cpu_moe_combine_forward(Tensor out, Tensor resid, Tensor y, Tensor w);
void cpu_moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w);
void cpu_embedding_forward(Tensor h, Tensor table, Tensor tokens);
void cpu_embedding_backward(Tensor dtable, Tensor dh, Tensor tokens);
static inline int64_t cpu_embedding_bad_id(void) { return -1; } // the CPU ops die at a bad id
void cpu_cross_entropy(Tensor logits, Tensor labels, Tensor loss_sum, float grad_scale);
void cpu_zero(Tensor x);
void cpu_add(Tensor y, Tensor x);
void cpu_scale(Tensor x, float s);
void cpu_copy(Tensor dst, Tensor src);
void cpu_copy_cols(Tensor dst, int64_t a, Tensor src, int64_t b, int64_t n, bool accumulate);
double cpu_sum_squares(Tensor x);
bool cpu_adamw_nonfinite(void);
void cpu_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
               float wd, int t);
void cpu_muon_momentum(Tensor buf, Tensor g, float beta);
void cpu_muon_apply(Tensor p, Tensor o, float lr, float wd, float scale);
double cpu_read_scalar(Tensor x);

// Qwen3.5 (cpu_delta.c / cuda_delta.cu)
void cpu_rmsnorm1p_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps);
void cpu_rmsnorm1p_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate);
void cpu_rmsnorm_gated_forward(Tensor y, Tensor rstd, Tensor x, Tensor z, Tensor w, float eps);
void cpu_rmsnorm_gated_backward(Tensor dx, Tensor dz, Tensor dw, Tensor dy, Tensor x, Tensor z, Tensor w, Tensor rstd);
void cpu_sigmoid_gate_forward(Tensor y, Tensor x, Tensor gate);
void cpu_sigmoid_gate_backward(Tensor dx, Tensor dgate, Tensor dy, Tensor x, Tensor gate, bool accumulate);
void cpu_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, Tensor halo, int B);
void cpu_conv1d_silu_backward(Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo, int B);
void cpu_delta_gates_forward(Tensor g, Tensor beta, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias);
void cpu_delta_gates_backward(Tensor da, Tensor db, Tensor dA_log, Tensor ddt_bias, Tensor dg, Tensor dbeta, Tensor a,
                              Tensor b, Tensor A_log, Tensor dt_bias);
void cpu_delta_rule_forward(Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a);
void cpu_delta_rule_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor g, Tensor beta, const DeltaArgs *a);

// Raw pointers of CPU tensors (t_rows/t_cols: base.h).
static inline float *F(Tensor t) { return (float *)t.p; }
static inline int32_t *I32(Tensor t) { return (int32_t *)t.p; }
#define CPU_F32(t) CHECK((t).dev == DEV_CPU && (t).dt == DT_F32)

// GPT-OSS (cpu_swiglu_clamped.c)
void cpu_swiglu_clamped_forward(Tensor act, Tensor gu, float alpha, float limit);
void cpu_swiglu_clamped_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit);
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
void cpu_fp8_round(Tensor y, Tensor x, Fp8Blocks b, const int64_t *offs, int groups);
// The dense weight's codes and scales (op_fp8_weight_make) and their values y (N, K) = q·s.
void cpu_fp8_weight(Fp8Weight fw, Tensor w);
void cpu_fp8_weight_values(Tensor y, Fp8Weight fw);
