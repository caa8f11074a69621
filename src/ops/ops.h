// ops.h — the operator layer: every op the models and the trainer use, declared once, device-agnostic.
// Each op of ops_list.h (its signature and meaning, one entry per op, included at the end) dispatches on its tensors'
// device to cpu_<op> (fp32 reference, ops/cpu/) or cuda_<op> (ops/cuda/); this file holds the types they take and
// the ops written out in ops.c, muon.c, fp8.c and rope_tables.c.
// Conventions: row-major tensors; a linear weight is (out, in) like torch.nn.Linear; T = tokens of a
// micro-batch (B·S), H = hidden, E = experts, k = experts per token. "accumulate" means dst += result.
// Weight and bias gradients always accumulate (gradient accumulation over micro-batches) in fp32.
#pragma once
#include "base/base.h"

// True when this build has the CUDA backend and a GPU is present.
bool ops_cuda_available(void);
// GPU memory (0 without CUDA): bytes the CUDA backend holds itself (cuBLASLt workspace and its fixed pools,
// allocated once), and the largest device memory this process has had in use (cudaMemGetInfo, sampled
// at every allocation and every call of this function).
size_t ops_cuda_pool_bytes(void);
size_t ops_cuda_peak_bytes(void);
void ops_sync(void);        // waits for queued GPU work (for timing); nothing on the CPU
void ops_copies_wait(void); // waits for every op_copy_async issued (from any thread); nothing on the CPU
// Waits until the GPU has made every op_upload issued so far (not the work queued after them), so their sources may
// be written again; nothing on the CPU. Not a host sync of ops_host_syncs: the stream is not drained.
void ops_uploads_wait(void);
// How often the host has waited for the GPU so far (a stream synchronisation: every read-back of a value ends in one);
// 0 on the CPU. A step's layers wait for nothing on one GPU: tests count these around them.
int64_t ops_host_syncs(void);
// A CUDA graph: the GPU work of a sequence of ops, recorded once and run again as one launch (config cuda_graph;
// docs/architecture.md, "CUDA graphs"). ops_graph_begin starts recording on the compute stream: the ops issued until
// ops_graph_end are recorded, not run, and none may wait for the GPU or allocate. ops_graph_run queues the recording
// in stream order like the ops themselves, with the pointers and arguments they had when recorded, and returns false
// (queueing nothing) when it is stale: the op scratch or the cuDNN plans it uses were replaced since; the caller
// records again. GPU builds only.
typedef struct OpsGraph OpsGraph;
void ops_graph_begin(void);
OpsGraph *ops_graph_end(void);
bool ops_graph_run(OpsGraph *g);
void ops_graph_free(OpsGraph *g); // NULL: nothing

// ---- normalisation, position embedding ----
// The RMSNorm's form (op_rmsnorm_*; NULL: plain, u = w): u = 1 + w with one_plus (a zero-centred weight that starts
// at 0, Qwen3.5), times silu(z) when z is given (Qwen3.5's gated norm of the DeltaNet output). A per-head q/k norm may
// carry the RoPE after it (cos.p): the rows are `heads` heads a token; the forward turns y as op_rope(y, 0, cos, sin,
// pos, ROPE_HALF, false) would, the backward takes dy of the turned output and turns it back first — in the norm's
// kernel on the GPU where it fits, else in place, so dy is the caller's scratch.
typedef struct {
    bool one_plus;
    Tensor z;             // (R, D) like x; p == NULL: not gated
    Tensor dz;            // the backward's ∂/∂z (written) when z is given
    Tensor cos, sin, pos; // the RoPE (cos.p NULL: none; ungated)
    int heads;
} RmsArgs;
// RoPE's pairs (op_rope): ROPE_HALF pairs dims (i, i + rd/2) (rotate_half), ROPE_PAIRS pairs (2i, 2i + 1)
// (DeepSeek's complex form).
typedef enum { ROPE_HALF, ROPE_PAIRS } RopeLayout;
// The tables for positions 0..P−1 (cos, sin: (P, rd/2) fp32 on the CPU): cos = f·cos(p·inv_freq_i), sin likewise.
// Default: inv_freq_i = theta^(−2i/rd), f = 1. YaRN (rope_tables.c, transformers' formulas): inv_freq blends
// theta^(−2i/rd) and theta^(−2i/rd)/factor over the correction range of beta_fast..beta_slow rotations within
// orig_max_pos positions (floored/ceiled when truncate); f = attention_factor, or when 0 mscale(factor, mscale) /
// mscale(factor, mscale_all_dim) if both are set, else mscale(factor, 1), mscale(s, m) = 0.1·m·ln(s) + 1 (1 for s ≤ 1).
typedef struct {
    int rd;                                            // rotary dims
    double theta;                                      // rope_theta
    bool yarn;                                         // rope_type "yarn"; the fields below are read only then
    double factor, beta_fast, beta_slow, orig_max_pos; // beta_fast, beta_slow: 32, 1 when 0
    bool truncate;                                     // transformers' default is true; GPT-OSS ships false
    double attention_factor, mscale, mscale_all_dim;
} RopeSpec;
void op_rope_tables(Tensor cos, Tensor sin, const RopeSpec *r);

// ---- attention: GQA, q/k head dim dqk, v head dim dv (MLA: 192, 128), causal or a block against a block ----
// q: (B·Sq, nh, dqk), k: (B·Sk, nkv, dqk), v: (B·Sk, nkv, dv), o: (B·Sq, nh, dv), lse: (B, nh, Sq) fp32;
// query head h reads kv head h / (nh/nkv). Query i of a sequence sits at position q_off + i, key j at k_off + j;
// key j is visible to query i when (!causal or kpos ≤ qpos) and (window == 0 or kpos > qpos − window) and, with
// document masking, kpos ≥ qpos − docpos[i] (the keys of the query's own document).
// s_ij = scale·q_i·k_j; a sink (GPT-OSS) is a per-head logit in the softmax denominator with no value:
// lse_i = log(exp(sinks[h]) + Σ_visible exp(s_ij)), o_i = Σ_visible exp(s_ij − lse_i)·v_j. A query that sees no key
// and has no sink gets o = 0, lse = −∞ (what the log-sum-exp merge of ring attention expects).
typedef struct {
    int B;       // sequences (q rows B·Sq, k and v rows B·Sk)
    float scale; // softmax scale
    bool causal;
    int window;           // sliding window: a query sees itself and window − 1 earlier keys; 0 = none
    int64_t q_off, k_off; // positions of row 0 of each sequence's q and k block
    Tensor sinks;         // (nh) fp32; p == NULL: none
    Tensor ws;            // the backward's fp32 scratch, op_attention_workspace elements (planned by the caller)
    bool deterministic;   // GPU: pith's own kernels only (cuDNN's backward adds into dQ with atomics)
    // Document masking: (B·Sq) int32 on q's device, each query's position inside its document (0 at a document's
    // first token); p == NULL: none. Documents are contiguous, so qpos − docpos[i] never decreases along a
    // sequence: a block of queries [i0, i1) needs no key before qpos(i0) − docpos[i0].
    Tensor docpos;
} AttnArgs;
// op_attention_workspace: the fp32 elements of the backward's scratch that a caller can plan (a->ws; without it the
// GPU takes the op scratch): cuDNN's fused backward (bf16 on the GPU, whole causal sequences) keeps AttnScratch,
// op_attention_scratch's carve counted; cuDNN's own workspace stays in the op scratch (its size is the plan cuDNN
// picks). 0 on the CPU, with a->deterministic and in builds without cuDNN.
typedef struct {
    Tensor D;  // (B·Sq, nh) fp32: Σ_d dO∘O per query row and head
    Tensor dq; // (B·Sq, nh, dqk) fp32: the dQ accumulator
} AttnScratch;
AttnScratch op_attention_scratch(Arena *a, Tensor q);
size_t op_attention_workspace(Tensor q, Tensor k, const AttnArgs *a);

// ---- mixture of experts ----
// Router on logits: (T, E) fp32. probs: (T, E) fp32 = softmax(logits) over all E, or with sigmoid (DeepSeek-V3)
// each expert's own sigmoid(logit) (what load balancing reads; not softmax_topk).
// Selection: the top-k of score = probs + bias (ties → lower index), best first; with n_group > 1 (group-limited
// greedy) only inside the topk_group groups of E/n_group experts whose best score is highest. force_balance
// replaces the choice by idx[t, j] = (t + j·(E/k)) mod E (benchmark routing). Weights w: (T, k) fp32:
// softmax_topk (GPT-OSS): softmax over the k selected logits; else probs of the selected experts, divided by
// their sum when renorm; then × scale (routed_scaling_factor). bias (E) fp32 only selects (aux-loss-free balancing).
// given (the CPU's only): these (T·k) host int32 experts instead of the selection (tests/gpu/test_gpu_model.c: the
// CPU reference takes the GPU's routing, so that a near-tie decided otherwise in bf16 cannot move every gradient).
typedef struct {
    int k;
    bool renorm, softmax_topk;
    float scale;             // must be set (> 0); 1 for no scaling
    int n_group, topk_group; // n_group ≤ 1: every expert competes
    Tensor bias;             // (E) fp32; p == NULL: none
    bool force_balance;
    bool sigmoid;         // scores = sigmoid(logits) instead of the softmax
    const int32_t *given; // (T·k) host or NULL: the experts to take
} RouterArgs;

// An expert index outside [0, E) that an op_moe_sort on dev met since the last call (-1: none), read back and cleared
// (the step reads it at its end, where it waits anyway); the CPU op dies at once.
int64_t op_moe_sort_bad_expert(Device dev);

// ---- embedding and optimizer ----
// A token id outside the table that an embedding on dev met since the last call (-1: none). On the GPU the forward
// writes NaN for it (the step's loss read-back sees it); the CPU ops die naming it at once.
int64_t op_embedding_bad_id(Device dev);
// Whether an op_adamw on dev wrote a weight or second moment that is not finite since the last call (which clears
// it): a flag the update's own pass sets, so checking costs no extra read (on the GPU: one word read back).
bool op_adamw_nonfinite(Device dev);
// x: (B, n, m) fp32, in place: each x[e] ← Newton–Schulz(x[e]): X = x[e] / (‖x[e]‖_F + 1e-7), then `steps`
// times A = X Xᵀ, X ← a·X + (b·A + c·A²)·X with (a, b, c) = (3.4445, −4.7750, 2.0315), on Xᵀ when n > m.
// ws: fp32 scratch of at least op_newton_schulz_workspace(n, m) elements on x's device.
void op_newton_schulz(Tensor x, Tensor ws, int steps);
int64_t op_newton_schulz_workspace(int64_t n, int64_t m);

// ---- Gated DeltaNet linear attention (docs/reference.md §19) ----
// The gated delta rule over each of B sequences, per value head h with key head h / (nv/nk) (key heads repeated):
// q, k: (B·S, nk, dk), v: (B·S, nv, dv), g, beta: (B·S, nv) fp32, o: (B·S, nv, dv). With qk_l2norm, q and k are
// first divided by sqrt(Σ x² + 1e-6) per head; then q ← scale·q. From S_0 (dk × dv per sequence and value head, fp32
// or better; s0, or zeros without it):
// S_t = e^{g_t} S_{t−1} + β_t k_t (v_t − e^{g_t} S_{t−1}ᵀ k_t)ᵀ, o_t = S_tᵀ q_t; sT (when given) gets S_S.
// chunk 0 runs that recurrence; chunk C > 0 the chunked (WY / UT-transform) form over chunks of C positions, which
// gives the same result in exact arithmetic (the GPU always runs the chunked form, chunk 0 as DELTA_MAX_CHUNK).
// Backward: dq, dk, dv, dg, dbeta written (dg, dbeta fp32), with dsT (the gradient arriving at sT; zero without it)
// added to the outputs' and ds0 (when given) written with ∂/∂s0. ws: fp32 scratch of op_delta_rule_workspace elements
// (DeltaScratch, op_delta_rule_scratch's carve counted) on the GPU, planned by the caller; without it the GPU takes
// the op scratch. The states pass a sequence's recurrence across ranks (context parallelism) and across calls
// (generation).
// Document masking (pos, p NULL: none): the state is zeroed before every token with pos 0 (a document's first), so a
// token sees only its own document's keys and the entering state s0 reaches only the tokens before the sequence's
// first document start; the backward's gradient does not cross a reset (ds0 gets the first document's share). pos
// counts up by one inside a document, so that the chunked form reads the resets off pos alone: within a chunk, row
// i's document starts at row i − pos_i (docs/architecture.md, "Gated DeltaNet").
#define DELTA_MAX_CHUNK 64
typedef struct {
    int B;
    float scale; // usually dk^-½
    bool qk_l2norm;
    int chunk; // 0: the recurrence
    Tensor ws;
    Tensor s0, sT;   // (B, nv, dk, dv) fp32 on q's device: the state entering / leaving each sequence (p NULL: none)
    Tensor dsT, ds0; // the backward's: ∂/∂sT in (p NULL: zero), ∂/∂s0 out (p NULL: not wanted)
    Tensor pos;      // (B·S) int32 on q's device: each token's position inside its document (p NULL: no masking)
    // keep: the forward leaves the chunk preparation and per-chunk states in `kept` (op_delta_rule_kept elements, fp32,
    // held by the caller from the forward to the backward) beside o, and the backward reads them instead of computing
    // them again; ws then holds only the backward's own pieces. The CPU has no such state (nothing changes there).
    bool keep;
    Tensor kept;
} DeltaArgs;
// The GPU's scratch (fp32; the tensor-core kernels keep bf16 data in those places), carved from arenas (counting ones
// plan them): the pieces a forward leaves for its backward (qh … Tm, S0, dS1, Vp, dW; the tensor cores keep S₀ in bf16
// in dS1's second half and U's bf16 copy in dW) from `kept` when da->keep, else from a; the backward's own (dVp on) from
// a; Tm on only for the backward or a forward that keeps them. Rows bh = b·nv + h and positions p < NL = NC·L, the
// sequence padded to NC whole chunks of L (chunk, or DELTA_MAX_CHUNK). The CPU needs none.
typedef struct {
    Tensor qh, kh;       // (T, nk, dk): q, k normalised (q scaled)
    Tensor rq, rk;       // (T, nk): their norms' reciprocals
    Tensor cs;           // (B·nv, NL) fp64: the cumulative log decays c per chunk
    Tensor U, W;         // (B·nv, NL, dv | dk)
    Tensor M, Tm;        // (B·nv, NC, L, L): M, and the backward's (I + A)⁻¹
    Tensor S0, dS1;      // (B·nv, NC, dk, dv): the state entering each chunk, ∂ of the state leaving it
    Tensor Vp, dVp, dBv; // (B·nv, NL, dv): V', ∂V', ∂(β v)
    Tensor dW, dBk;      // (B·nv, NL, dk): ∂W, ∂(β e^c k)
    Tensor gq, gk;       // (T, nv, dk): ∂ of the normalised q, k per value head
} DeltaScratch;
DeltaScratch op_delta_rule_scratch(Arena *a, Arena *kept, Tensor q, Tensor v, const DeltaArgs *da, bool backward);
// Elements of ws (without the kept pieces when a->keep), and of kept (for a->keep; 0 on the CPU).
size_t op_delta_rule_workspace(Tensor q, Tensor v, const DeltaArgs *a, bool backward);
size_t op_delta_rule_kept(Tensor q, Tensor v, const DeltaArgs *a);

// ---- FP8: E4M3 with block scales (docs/architecture.md, "FP8"; docs/reference.md §20) ----
// Each block of x gets the scale s = 2^⌈log2(max(amax, 1e-4) / 448)⌉ (fp32, a power of two) and each element the
// E4M3 code q = rne(x / s) (±448 saturates, values under 2^-6 are subnormal codes); its value is q·s. The blocks:
// FP8_ROWS 1 × 128 (along a row), FP8_COLS 128 × 1 (along a column), FP8_TILES 128 × 128. Blocks start at each group's
// first row and column 0; the last block of a row or group holds what is left (the same as zero padding).
typedef enum { FP8_ROWS, FP8_COLS, FP8_TILES } Fp8Blocks;
// A dense weight w (N, K) quantised with FP8_TILES for the FP8 GEMMs: its E4M3 codes q (N, K) and their transpose
// qt (K, N) (the tensor cores read both operands along the contraction, so the input gradient needs wᵀ's codes), with
// the fp32 128 × 128 block scales s (NB, KB4) of q and st (KB, NB4) of qt, row-major, a row per block row, padded
// with zeros to KB4 = 4⌈KB/4⌉ (NB4) columns (NB = ⌈N/128⌉, KB = ⌈K/128⌉): cuBLASLt's BLK128x128_32F layout.
// The experts' w (E, N, K), blocks within each expert: q (E, N, K), qt (E, K, N), s (E·NB, KB4), st (E·KB, NB4).
typedef struct {
    Tensor q, qt, s, st;
} Fp8Weight;
// Bytes of an Fp8Weight of w (N, K) or (E, N, K) (its four parts, each 256-byte aligned), its views over bytes at p
// (NULL: the shapes alone, for the memory plan), and w quantised into it (w fp32 or bf16 on fw's device).
size_t op_fp8_weight_bytes(int64_t N, int64_t K);
size_t op_fp8_experts_bytes(int64_t E, int64_t N, int64_t K);
Fp8Weight op_fp8_weight_view(void *p, Device dev, int64_t N, int64_t K);
Fp8Weight op_fp8_experts_view(void *p, Device dev, int64_t E, int64_t N, int64_t K);
void op_fp8_weight_make(Fp8Weight fw, Tensor w);
// op_fp8_weight_make of n weights ahead of their use: on the GPU issued on a side stream that starts after the work
// issued so far, so that it runs beside the work issued next; ticket id (< FP8_AHEAD_IDS) is theirs, and
// op_fp8_weights_join(id) makes the work issued after it wait for them (once for each ahead call). fw must not be read
// or written before the join. The CPU makes them at once.
#define FP8_AHEAD_IDS 256
void op_fp8_weights_ahead(const Fp8Weight *fw, const Tensor *w, int n, int id);
void op_fp8_weights_join(Device dev, int id);
// The FP8 linear layers (DeepSeek-V3's recipe): every GEMM multiplies operands quantised through E4M3, each with the
// blocks of its own contraction, and accumulates in fp32. The weight comes quantised with FP8_TILES (the model caches
// it per step as an Fp8Weight); x and dy are quantised here. Forward: x 1 × 128. Input gradient: dy 1 × 128 against
// the weight. Weight gradient (dw fp32 +=; grouped with accumulate false: written, an empty expert's zeroed): dense dy
// 128 × 1 and x 128 × 128; grouped dy and x 128 × 1 within each expert. Shapes and offs as op_linear_* and
// op_grouped_linear_* (no biases); rows.p (the grouped forward and weight gradient, on the CPU) gathers x as they do,
// row i of the product x[rows[i] / div] — the forward quantises x's rows as they lie (a 1 × 128 block is one row's,
// whoever reads it), the weight gradient the gathered rows. On the GPU the dense GEMMs run on the FP8 tensor cores (cuBLASLt) where T, N and K
// are multiples of 16, the experts' three (our wgmma E4M3 kernel) where N and K are multiples of 128; the others are
// the compute dtype's GEMMs on the rounded values.
// Whether a cached weight of these dims takes the FP8 tensor cores on dev — E ≥ 1: the experts' (E, N, K) on our wgmma
// kernel; E = 0: a dense (N, K) on cuBLASLt (its tokens a multiple of 16) — by shape alone, so a machine without a GPU
// can ask; false on the CPU.
bool op_fp8_tensor_cores(Device dev, int64_t E, int64_t N, int64_t K);
void op_fp8_linear_forward(Tensor y, Tensor x, Fp8Weight w8);
void op_fp8_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, bool accumulate);
void op_fp8_linear_backward_weight(Tensor dw, Tensor dy, Tensor x);
void op_fp8_grouped_linear_forward(Tensor y, Tensor x, Tensor rows, int div, Fp8Weight w8, Tensor offs);
void op_fp8_grouped_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, Tensor offs);
void op_fp8_grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, Tensor rows, int div, Tensor offs,
                                           bool accumulate);

// ---- the ops of ops_list.h ----
#define OP(ret, name, dev, params, args) ret op_##name params;
#include "ops/ops_list.h"

// dst[:, a:a+n] (+)= src[:, b:b+n]: op_copy_col_blocks of one block.
static inline void op_copy_cols(Tensor dst, int64_t a, Tensor src, int64_t b, int64_t n, bool accumulate) {
    op_copy_col_blocks(dst, a, 0, src, b, 0, n, 1, accumulate);
}
