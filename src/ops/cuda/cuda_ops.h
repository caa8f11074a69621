// cuda_ops.h — the CUDA implementation of every op in ops.h (each of ops_list.h as cuda_<name>) plus the few CUDA
// runtime services the layers above need. Plain C: included by ops.c, base.c and the tests, and (with C linkage) by every .cu file of this folder.
// Dtypes: activations and weights fp32 or bf16 (each tensor's own dt), arithmetic in fp32; gradient
// accumulators, router probabilities/weights, lse and rstd fp32; loss sums fp64; indices int32.
#pragma once
#include "ops/ops.h"

// ---- runtime ----
int cuda_device_count(void); // 0 without a driver or a device
void *cuda_alloc_or_die(size_t bytes, const char *what);
void cuda_free(void *p);
void cuda_sync(void);          // waits for the compute stream
void cuda_copies_wait(void);   // ops_copies_wait (cuda_copy_async's copy stream)
void cuda_uploads_wait(void);  // ops_uploads_wait (cuda_upload's event)
int64_t cuda_host_syncs(void); // ops_host_syncs
void cuda_graph_begin(void);   // ops_graph_begin … ops_graph_free (an OpsGraph is a cuda_graph_end result)
void *cuda_graph_end(void);
bool cuda_graph_run(void *g);
void cuda_graph_free(void *g);
size_t cuda_pool_bytes(void);     // device memory the backend itself holds (workspace, pools)
size_t cuda_mem_peak_bytes(void); // the most device memory in use since its CUDA start (sampled at each alloc and call)
// The streams for overlapping communication with compute (used by the multi-GPU engine).
void *cuda_compute_stream(void); // cudaStream_t
void *cuda_comm_stream(void);    // cudaStream_t

// ---- ops: each of ops_list.h as cuda_<name> (the comments there hold) ----
#define OP(ret, name, dev, params, args) ret cuda_##name params;
#include "ops/ops_list.h"
int64_t cuda_embedding_bad_id(void);
bool cuda_adamw_nonfinite(void);
int64_t cuda_moe_sort_bad_expert(void);
// How often the expert products took a path so far (cuda_gemm.cu): "wgmma", the products the wgmma kernels ran, of
// them "bias" those adding the bias in their epilogue; "heuristic": the cuBLASLt heuristic's answers asked for (a
// product whose algorithm is not cached yet).
int64_t cuda_grouped_calls(const char *path);
// RMSNorm backward calls that ran the one-pass kernel at hidden widths (cuda_norm.cu).
int64_t cuda_norm_rows_calls(void);
// RMSNorm calls that ran the norm with its RoPE in one kernel, forward or backward (cuda_norm.cu).
int64_t cuda_norm_rope_calls(void);
// Forgets every cached cuBLASLt algorithm (the next product of each shape asks the heuristic again): a test that
// counts the queries of its own shapes starts from an empty cache, whatever ran before it in the process.
void cuda_gemm_cache_clear(void);
// The kernel family the last attention call ran: "cudnn", "flash" (ours, tensor cores) or "generic".
// AttnArgs.deterministic (config `deterministic`) and PITH_ATTENTION=own (an A/B switch) keep attention on our kernels.
const char *cuda_attention_last_path(void);
// FP8 (cuda_fp8.cu): a dense or expert weight's codes and scales (op_fp8_weight_make) and their values (y = q·s, for
// the GEMMs the tensor cores do not take); the dense FP8 GEMMs on the tensor cores (cuBLASLt block-scaled E4M3) and the experts' forward (input_grad false: y = x_e·w_eᵀ), input
// gradient (dx = dy_e·w_e) and weight gradient (dw_e += dy_eᵀ·x_e) on the wgmma E4M3 kernel (cuda_wgmma_fp8.cu), false
// (nothing done) where the shapes or alignment do not fit them, and the count of those that ran. rows.p (the experts'
// forward and weight gradient; int32 on the device): x's row rows[i] / div is row i of the product, gathered by the
// quantiser as it reads x (moe_stage3_gathers), so only the codes are made per expert row.
void cuda_fp8_weight(Fp8Weight fw, Tensor w);
void cuda_fp8_weights_ahead(const Fp8Weight *fw, const Tensor *w, int n, int id); // op_fp8_weights_ahead
void cuda_fp8_weights_join(int id);
void cuda_fp8_weight_values(Tensor y, Fp8Weight fw);
bool cuda_fp8_linear_forward(Tensor y, Tensor x, Fp8Weight w8);
bool cuda_fp8_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, bool accumulate);
bool cuda_fp8_linear_backward_weight(Tensor dw, Tensor dy, Tensor x);
bool cuda_fp8_grouped_linear(Tensor y, Tensor x, Tensor rows, int div, Fp8Weight w8, Tensor offs, bool input_grad);
// x (R, C) into E4M3 codes q (R, C) and 1 × 128 scales s (⌈C/128⌉, R) (the tensor-core GEMMs' first step; the bench
// times it alone).
void cuda_fp8_quantize_rows(Tensor q, Tensor s, Tensor x);
// x (R, C), C a multiple of 128, in 128 × 1 blocks within each group's rows offs[g]..offs[g+1] (offs: groups + 1 int64
// on the GPU) into transposed codes qt (C, Tp), each group padded to whole 128-row blocks with zero codes, and scales s
// (TB, C) (the grouped weight gradient's first step): TB = cuda_fp8_cols_t_blocks(R, groups), a bound on the blocks
// from the sizes (Tp = 128 · TB; the columns past the groups' blocks are not written).
int64_t cuda_fp8_cols_t_blocks(int64_t R, int64_t groups);
void cuda_fp8_quantize_cols_t(Tensor qt, Tensor s, Tensor x, Tensor offs);
bool cuda_fp8_grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, Tensor rows, int div, Tensor offs,
                                             bool accumulate);
int64_t cuda_fp8_tensor_core_gemms(void);
bool cuda_fp8_dense_fit(int64_t N, int64_t K); // the shapes the tensor-core paths take (no GPU needed)
bool cuda_fp8_experts_fit(int64_t E, int64_t N, int64_t K);
