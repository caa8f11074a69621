// cuda_ops.h — the CUDA implementation of every op in ops.h (same signatures, cuda_ prefix; the comments
// in ops.h hold) plus the few CUDA runtime services the layers above need. Plain C: included by ops.c,
// base.c and the tests, and (with C linkage) by every .cu file of this folder.
// Dtypes: activations and weights fp32 or bf16 (each tensor's own dt), arithmetic in fp32; gradient
// accumulators, router probabilities/weights, lse and rstd fp32; loss sums fp64; indices int32.
#pragma once
#include "ops/ops.h"

// ---- runtime ----
int cuda_device_count(void); // 0 without a driver or a device
void *cuda_alloc_or_die(size_t bytes, const char *what);
void cuda_free(void *p);
void cuda_sync(void);             // waits for the compute stream
size_t cuda_pool_bytes(void);     // device memory the backend itself holds (workspace, pools)
size_t cuda_mem_used_bytes(void); // device memory in use by this process since its CUDA start
size_t cuda_mem_peak_bytes(void); // the largest cuda_mem_used_bytes seen (sampled at each alloc and call)
// Streams and events for overlapping communication with compute (used by the multi-GPU engine).
void *cuda_compute_stream(void); // cudaStream_t
void *cuda_comm_stream(void);    // cudaStream_t
void *cuda_event_create(void);   // cudaEvent_t (timing disabled)
void cuda_event_destroy(void *ev);
void cuda_event_record(void *ev, void *stream);
void cuda_stream_wait_event(void *stream, void *ev);

// ---- ops (see ops.h) ----
void cuda_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b);
void cuda_linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate);
void cuda_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x);
// y: (M, N) += b: (N) per row, or with offs (grouped) b: (E, N), expert e's on its rows offs[e]..offs[e+1]; db: fp32
// (N) or (E, N) (+)= Σ_rows dy: (M, N) likewise (accumulate false: written).
void cuda_linear_bias_forward(Tensor y, Tensor b, const int64_t *offs);
void cuda_linear_bias_backward(Tensor db, Tensor dy, const int64_t *offs, bool accumulate);
void cuda_grouped_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b, const int64_t *offs);
void cuda_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, const int64_t *offs);
void cuda_grouped_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, const int64_t *offs,
                                         bool accumulate);
// How often the expert products took a path so far (cuda_gemm.cu): "batched" counts products run as one
// padded strided batch, "big" experts run as dense products beside a grouped call.
int64_t cuda_grouped_calls(const char *path);
void cuda_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps);
void cuda_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate);
void cuda_rope(Tensor x, int off, Tensor cos, Tensor sin, Tensor pos, RopeLayout layout, bool backward);
void cuda_swiglu_forward(Tensor act, Tensor gu);
void cuda_swiglu_backward(Tensor dgu, Tensor dact, Tensor gu);
void cuda_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a);
// The kernel family the last attention call ran: "cudnn", "flash" (ours, tensor cores) or "generic".
// AttnArgs.deterministic (config `deterministic`) and PITH_ATTENTION=own (an A/B switch) keep attention on our kernels.
const char *cuda_attention_last_path(void);
void cuda_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a);
void cuda_attention_merge(Tensor o, Tensor lse, Tensor o_p, Tensor lse_p, int B, bool init);
void cuda_router_forward(Tensor probs, Tensor idx, Tensor w, Tensor logits, const RouterArgs *a);
void cuda_router_backward(Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                          const RouterArgs *a);
void cuda_moe_lb_loss(Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float grad_scale);
void cuda_moe_sort(Tensor perm, int64_t *offs, Tensor idx, int E);
void cuda_gather_rows(Tensor y, Tensor x, Tensor rows, int div);
void cuda_scatter_add_rows(Tensor dx, Tensor dy, Tensor rows, int div);
void cuda_scatter_rows(Tensor y, Tensor x, Tensor rows);
void cuda_moe_combine_forward(Tensor out, Tensor resid, Tensor y, Tensor w);
void cuda_moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w);
void cuda_embedding_forward(Tensor h, Tensor table, Tensor tokens);
void cuda_embedding_backward(Tensor dtable, Tensor dh, Tensor tokens);
int64_t cuda_embedding_bad_id(void);
void cuda_cross_entropy(Tensor logits, Tensor labels, Tensor loss_sum, float grad_scale);
void cuda_zero(Tensor x);
void cuda_add(Tensor y, Tensor x);
void cuda_scale(Tensor x, float s);
void cuda_copy(Tensor dst, Tensor src);
void cuda_copy_cols(Tensor dst, int64_t a, Tensor src, int64_t b, int64_t n, bool accumulate);
double cuda_sum_squares(Tensor x);
bool cuda_adamw_nonfinite(void);
void cuda_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
                float wd, int t);
void cuda_muon_momentum(Tensor buf, Tensor g, float beta);
void cuda_muon_apply(Tensor p, Tensor o, float lr, float wd, float scale);
double cuda_read_scalar(Tensor x);

// GPT-OSS (cuda_swiglu_clamped.cu)
void cuda_swiglu_clamped_forward(Tensor act, Tensor gu, float alpha, float limit);
void cuda_swiglu_clamped_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit);
// Qwen3.5 (cpu_delta.c / cuda_delta.cu)
void cuda_rmsnorm1p_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps);
void cuda_rmsnorm1p_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate);
void cuda_rmsnorm_gated_forward(Tensor y, Tensor rstd, Tensor x, Tensor z, Tensor w, float eps);
void cuda_rmsnorm_gated_backward(Tensor dx, Tensor dz, Tensor dw, Tensor dy, Tensor x, Tensor z, Tensor w, Tensor rstd);
void cuda_sigmoid_gate_forward(Tensor y, Tensor x, Tensor gate);
void cuda_sigmoid_gate_backward(Tensor dx, Tensor dgate, Tensor dy, Tensor x, Tensor gate, bool accumulate);
void cuda_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, Tensor halo, int B);
void cuda_conv1d_silu_backward(Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo, int B);
void cuda_delta_gates_forward(Tensor g, Tensor beta, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias);
void cuda_delta_gates_backward(Tensor da, Tensor db, Tensor dA_log, Tensor ddt_bias, Tensor dg, Tensor dbeta, Tensor a,
                               Tensor b, Tensor A_log, Tensor dt_bias);
void cuda_delta_rule_forward(Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a);
void cuda_delta_rule_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k,
                              Tensor v, Tensor g, Tensor beta, const DeltaArgs *a);
// FP8 (cuda_fp8.cu): op_fp8_round on fp32 or bf16 tensors; a dense or expert weight's codes and scales
// (op_fp8_weight_make) and their values (y = q·s, for the GEMMs the tensor cores do not take); the dense FP8 GEMMs on
// the tensor cores (cuBLASLt block-scaled E4M3) and the experts' forward (input_grad false: y = x_e·w_eᵀ), input
// gradient (dx = dy_e·w_e) and weight gradient (dw_e += dy_eᵀ·x_e) on the wgmma E4M3 kernel (cuda_wgmma_fp8.cu), false
// (nothing done) where the shapes or alignment do not fit them, and the count of those that ran.
void cuda_fp8_round(Tensor y, Tensor x, Fp8Blocks b, const int64_t *offs, int groups);
void cuda_fp8_weight(Fp8Weight fw, Tensor w);
void cuda_fp8_weight_values(Tensor y, Fp8Weight fw);
bool cuda_fp8_linear_forward(Tensor y, Tensor x, Fp8Weight w8);
bool cuda_fp8_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, bool accumulate);
bool cuda_fp8_linear_backward_weight(Tensor dw, Tensor dy, Tensor x);
bool cuda_fp8_grouped_linear(Tensor y, Tensor x, Fp8Weight w8, const int64_t *offs, bool input_grad);
// x (R, C) into E4M3 codes q (R, C) and 1 × 128 scales s (⌈C/128⌉, R) (the tensor-core GEMMs' first step; the bench
// times it alone).
void cuda_fp8_quantize_rows(Tensor q, Tensor s, Tensor x);
// x (R, C), C a multiple of 128, in 128 × 1 blocks within each group's rows offs[g]..offs[g+1] into transposed codes
// qt (C, Tp), each group padded to whole 128-row blocks with zero codes (Tp = 128 · their count TB), and scales s
// (TB, C) (the grouped weight gradient's first step).
void cuda_fp8_quantize_cols_t(Tensor qt, Tensor s, Tensor x, const int64_t *offs, int groups);
bool cuda_fp8_grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, const int64_t *offs, bool accumulate);
int64_t cuda_fp8_tensor_core_gemms(void);
bool cuda_fp8_dense_fit(int64_t N, int64_t K); // the shapes the tensor-core paths take (no GPU needed)
bool cuda_fp8_experts_fit(int64_t E, int64_t N, int64_t K);
