// test.h — pith's test runner: TEST(name) { ... } registers a test; an ASSERT that fails ends the test.
// The runner (tests/main.c) prints one line per test and closes with "N passed, N failed, N skipped".
#pragma once
#include <math.h>
#include <setjmp.h>

#include "base/base.h"

typedef void (*TestFn)(void);
void test_register(const char *name, TestFn fn);
_Noreturn void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Ends the test as skipped (what it needs is not here, e.g. a second GPU): counted apart, never as passed.
_Noreturn void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define TEST(name)                                                                                                     \
    static void test_##name(void);                                                                                     \
    __attribute__((constructor)) static void register_##name(void) { test_register(#name, test_##name); }              \
    static void test_##name(void)

#define ASSERT(cond)                                                                                                   \
    do {                                                                                                               \
        if (!(cond)) test_fail(__FILE__, __LINE__, "%s", #cond);                                                       \
    } while (0)
#define ASSERT_MSG(cond, ...)                                                                                          \
    do {                                                                                                               \
        if (!(cond)) test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                       \
    } while (0)
// |a-b| <= tol, and never NaN.
#define ASSERT_NEAR(a, b, tol)                                                                                         \
    do {                                                                                                               \
        double a_ = (a), b_ = (b);                                                                                     \
        if (!(fabs(a_ - b_) <= (tol)))                                                                                 \
            test_fail(__FILE__, __LINE__, "%s = %.9g vs %s = %.9g (tol %g)", #a, a_, #b, b_, (double)(tol));           \
    } while (0)

// ‖a−b‖/‖b‖ over n floats (NaN gives +inf).
double rel_err_f32(const float *a, const float *b, int64_t n);
double rel_err_f64(const double *a, const double *b, int64_t n);
// Fills x with N(0, scale²) values from a fresh stream (tests use a new stream per call).
void fill_normal(float *x, int64_t n, float scale);
// 0..n−1 shuffled by stream `seed` (free it): the slots of a one-rank dispatch, whose first rows gather tokens
// slot / k.
int32_t *shuffled_slots(int64_t n, uint64_t seed);
// Runs a shell command, captures stdout+stderr into out (NUL-terminated), returns its exit status.
int run_cmd(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// A number from an HF fixture's expected.json (tests/hf/<family>/): key at the top level (step < 0) or
// of train.steps[step].
double hf_expected(const char *fixture, const char *key, int step);
// The value of key in the metrics.jsonl line of step in run folder dir (the step must be there); NAN when the
// line has no such key.
double run_metric(const char *dir, int step, const char *key);
// Worst per-tensor ‖a−b‖/‖b‖ over two gradient dumps (pith train --dump-grads folders; every tensor present
// in both, else the test fails); *worst_name is that tensor's name (a static buffer).
// An fp64 reference: out = f(in[0..]); fd_grad gives ∂(Σ G·out)/∂in[j] by central differences (tests/test_ops.c).
typedef void (*RefFn)(double **in, double *out, const void *ctx);
void fd_grad(RefFn f, double **in, int j, int64_t nin_j, const double *G, int64_t nout, double *grad, const void *ctx);
double grad_diff(const char *a, const char *b, const char **worst_name);
// calc_diff = 1 − 2Σab/Σ(a² + b²) over two gradient dumps: the worst tensor's (*worst_name) and, in *all, that of
// every tensor at once.
double grad_calc_diff(const char *a, const char *b, const char **worst_name, double *all);
// Gradient dump b (bf16 expert gradients, gradient_dtype) against dump ref, both of one step-1 batch: each expert
// element within k·2^-8·(1 + 2^-7)·(|f| + |f1|/2), f and f1 the fp32 dumps of the batch and of its first micro-batch
// alone (f1 NULL: b must be ref rounded to bf16 exactly); the dense tensors bit for bit (dense_tol 0) or within
// dense_tol in ‖b − ref‖/‖ref‖. Returns the worst expert element's error over its bound; *moved counts the expert
// elements that differ from ref.
double grad_bf16_check(const char *b, const char *ref, const char *f, const char *f1, double k, double dense_tol,
                       int64_t *moved);
// A fresh empty directory under /tmp for this test.
const char *test_tmpdir(void);
// A tiny CPU run in a fresh folder: model.json (Qwen3-MoE, 2 layers of 4 experts, vocabulary 64), data.bin (3000
// synthetic tokens) and train.json (6 steps of 4 × 16 tokens, lr 0.01) with `extra` (", \"key\": value" pairs, or "")
// added to its keys. Returns the folder (a static buffer).
const char *tiny_run(const char *extra);

// Appends a loss mask (token file format 2) to the token file at path: token j is a target unless j % 16 < masked
// (a masked "prompt" at the start of every 16 tokens).
void token_file_mask(const char *path, int masked);
// Writes a token file of n uint16 tokens below vocab (seeded) in documents of 1 to 12 tokens, so that every sample
// of 16 packs several and cuts some (document masking).
void token_file_short_documents(const char *path, int64_t n, int vocab);
// The float32 (rows, cols) array of the .npy file at path (`pith eval --per-token`), checked header and size; xmalloc'd.
float *npy_read_f32_2d(const char *path, int64_t rows, int64_t cols);

// Writes n bytes (write_text: a string) to dir/name, making its folders, and returns the path (a static buffer,
// valid until the next call); with dir NULL, name is the path.
const char *write_bytes(const char *dir, const char *name, const void *data, size_t n);
const char *write_text(const char *dir, const char *name, const char *text);

// Tiny Qwen3-MoE configs shared by the CPU and GPU suites (HF config.json text).
// TINY_MOE_A: 2 MoE layers, 4 experts top-2, renormalised weights.
#define TINY_MOE_A                                                                                                     \
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"       \
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 48, \"num_experts\": 4, \"num_experts_per_tok\": "  \
    "2,"                                                                                                               \
    " \"moe_intermediate_size\": 8, \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0}"
// TINY_Q35_GPU: Qwen3.5-MoE's GPU-against-CPU model (tests/gpu/test_gpu_qwen3_5.c) and its conditioning check
// (tests/test_qwen3_5.c): both layer types, 2 value heads per key head, partial RoPE, a gated shared expert.
#define TINY_Q35_GPU                                                                                                   \
    "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": "  \
    "4,"                                                                                                               \
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 64, \"num_experts\": 8, \"num_experts_per_tok\": " \
    "2, \"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 24, \"linear_num_key_heads\": 2,"          \
    " \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 8,"                       \
    " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\"]}"
// TINY_MOE_B: biases, a dense first layer, tied embeddings, no renormalisation, rope theta in rope_parameters.
#define TINY_MOE_B                                                                                                     \
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"       \
    " \"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 40, \"num_experts\": 4, \"num_experts_per_tok\": "  \
    "3,"                                                                                                               \
    " \"moe_intermediate_size\": 6, \"intermediate_size\": 12, \"mlp_only_layers\": [0], \"norm_topk_prob\": false,"   \
    " \"attention_bias\": true, \"tie_word_embeddings\": true,"                                                        \
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5e5}}"
// TINY_MOE_EP: 3 layers (the middle one dense), 8 experts top-3: every expert-parallel path is exercised;
// TINY_MOE_EP_OF(L): the same with L layers (pipelines cut the layers into 2P chunks).
#define TINY_MOE_EP TINY_MOE_EP_OF(3)
#define TINY_MOE_EP_OF(L)                                                                                              \
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": " #L ", \"num_attention_heads\": 4,"  \
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 8, \"num_experts_per_tok\": "  \
    "3,"                                                                                                               \
    " \"moe_intermediate_size\": 16, \"intermediate_size\": 24, \"mlp_only_layers\": [1], \"norm_topk_prob\": true}"

// TINY_QWEN3_5_4: Qwen3.5-MoE, 4 layers: Gated DeltaNet and gated full attention in turn, a gated shared expert.
#define TINY_QWEN3_5_4                                                                                                 \
    "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 32, \"num_hidden_layers\": 4,"                            \
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64,"                    \
    " \"num_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 16,"                                  \
    " \"shared_expert_intermediate_size\": 12, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4,"            \
    " \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 6, \"layer_types\": [\"linear_attention\","               \
    " \"full_attention\", \"linear_attention\", \"full_attention\"]}"

// FP8_TEST_MODEL: TINY_MOE_EP widened to whole 128-column blocks (hidden 256, expert width 128, dense width 256).
#define FP8_TEST_MODEL                                                                                                 \
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 256, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"      \
    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"vocab_size\": 64, \"num_experts\": 8, \"num_experts_per_tok\": " \
    "3,"                                                                                                               \
    " \"moe_intermediate_size\": 128, \"intermediate_size\": 256, \"mlp_only_layers\": [1], \"norm_topk_prob\": true}"

// mpirun for N CPU ranks (append the count): oversubscribed, one thread each, root allowed (CI runs as root).
#define MPIRUN                                                                                                         \
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "              \
    "mpirun --oversubscribe --bind-to none -np"

// The pith binary the tests run: build/pith, or $PITH_BIN (the sanitizer build sets it).
const char *pith_bin(void);
#define PITH_BIN pith_bin()
