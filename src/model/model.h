// model.h — the model protocol: architecture config, parameter table, and the 5-stage layer protocol
// (docs/architecture.md, "The model protocol"). A model family (qwen3_moe.c, …) fills a ModelFamily
// table; the engine (pipe/, parallel/) calls prolog → per layer stage 1..5 → epilog forward, and the
// mirror image backward.
#pragma once
#include "base/json.h"
#include "base/safetensors.h"
#include "ops/ops.h"
#include "parallel/fsdp.h"
#include "parallel/ring.h"

#define MAX_LAYERS 256

typedef struct {
    char model_type[32];
    int hidden, layers, heads, vocab;
    int experts, topk, moe_inter, dense_inter;
    double eps;
    bool tie_embed;
    bool norm_1p;            // the block and final norms are zero-centred: x·rstd·(1 + w), w starts at 0 (Qwen3.5)
    int shared_inter;        // Is: the MoE layers' shared expert width (0: none; ModelFamily.shared)
    bool is_moe[MAX_LAYERS]; // false: the layer has a dense MLP (mlp_only_layers, first_k_dense_replace, …)
    // GPT-OSS experts when swiglu_limit > 0 (moe.c): biases on gate_up and down, each expert's gate_up rows
    // interleaved (gate even, up odd) and op_swiglu_* with this limit and alpha (the clamped form).
    float swiglu_limit, swiglu_alpha;
    RopeSpec rope; // rotary dims (the rope tables are (S, rope.rd/2)), theta, YaRN
    // The attention's shape as ring attention moves it (parallel/ring.h); a family that leaves it 0 does not run
    // under context parallelism (a config error).
    RingDims ring;
    bool router_sigmoid; // scoring_func "sigmoid" (DeepSeek-V3): routing scores sigmoid(logits), not the softmax
    RouterArgs router;   // the router's options from the HF config (renorm, softmax_topk, scale, groups)
    // Layout, set by the trainer (model_config_load: one rank). This rank holds experts
    // [ep_rank·E/ep_size, (ep_rank+1)·E/ep_size); group g's flat buffers are padded to a multiple of pad[g]
    // elements (the FSDP shard count).
    int ep_rank, ep_size;
    int cp_size; // context parallelism: records hold what the cp hooks of model.c need (1: none)
    // Pipeline rank pp_rank of pp_size holds its two DualPipeV chunks' layers (model_holds_layer) and, on
    // rank 0, the embedding, final norm and LM head; params_build lists everything, model_create keeps those.
    int pp_rank, pp_size;
    int pad[NGROUPS];
    DType grad_dt[NGROUPS]; // group g's gradient accumulators: fp32, or bf16 for the experts (gradient_dtype)
    bool w_f32[NGROUPS];    // group g's compute copy in fp32 whatever the compute dtype (then the optimizer's master)
    bool grad_units; // parallel.gradient_reduce "layer": no whole dense gradient; its views bound per unit (below)
    // The family's own fields (Qwen3Config, Dsv2Config): a struct of at most this size that only the family
    // file reads (through model_family_config). Inline, so a ModelConfig copies by value.
    _Alignas(8) unsigned char family[256];
} ModelConfig;

#define model_family_config(type, c) ((type *)(c)->family)
#define MODEL_FAMILY_CONFIG_FITS(type)                                                                                 \
    _Static_assert(sizeof(type) <= sizeof(((ModelConfig *)0)->family), #type " is too large")

static inline int model_experts_local(const ModelConfig *c) { return c->experts / c->ep_size; }
static inline int model_expert_first(const ModelConfig *c) { return c->ep_rank * model_experts_local(c); }
// DualPipeV's placement: 2·pp_size chunks of equal length; rank r holds chunks r and 2·pp_size − 1 − r.
static inline int model_chunk_of_layer(const ModelConfig *c, int l) { return l / (c->layers / (2 * c->pp_size)); }
static inline bool model_holds_layer(const ModelConfig *c, int l) {
    if (c->pp_size <= 1) return true;
    int k = model_chunk_of_layer(c, l);
    return k == c->pp_rank || k == 2 * c->pp_size - 1 - c->pp_rank;
}

// ---- parameters: each tensor lives at a fixed offset of one flat buffer per group ----
// INIT_NORMAL_OUT: std/√(2·layers) (o_proj, down_proj); INIT_LOG_UNIFORM: log U(0.01, 16) (Qwen3.5's A_log)
enum { INIT_NORMAL, INIT_NORMAL_OUT, INIT_ONES, INIT_ZEROS, INIT_LOG_UNIFORM };

typedef struct {
    char name[96]; // canonical name: the HF hub name without the "model." prefix, one key per expert
    int group, init, nd;
    int64_t off, shape[4];
} ParamInfo;

typedef struct {
    ParamInfo *p;
    int n, cap;
    int64_t numel[NGROUPS]; // elements of each group (before padding)
} ParamTable;

void params_add(ParamTable *t, const char *name, int group, int init, int nd, int64_t n0, int64_t n1, int64_t n2);
const ParamInfo *params_find(const ParamTable *t, const char *name); // NULL if absent
int64_t params_numel(const ParamInfo *p);
// Fills the group's flat buffer (fp32, host) with the initial values of every parameter in it (docs/reference.md §7):
// counter-based draws keyed by (seed, canonical name), so they do not depend on layout.
void params_init(const ParamTable *t, int group, float *flat, uint64_t seed, double init_std, int layers);

// ---- one micro-batch in flight, and the step it belongs to ----
// What a step adds up while its micro-batches run (step_sums_create; step_sums_begin clears it): the losses the
// trainer reads at the step's end and, with aux-loss-free balancing, the expert counts. Each micro-batch carries a
// pointer to it to the stages.
typedef struct {
    Tensor loss_sum, lb_sum; // (1) fp64 on the model's device: Σ CE and Σ load-balancing loss
    Tensor lb_replay;        // (1) fp64 there: where a replayed forward's load-balancing loss goes (never read)
    Tensor router_load;      // (layers, E) fp64 there: the experts chosen (model_router_forward); p NULL: not counted
    Tensor row_loss;         // (T) fp64 on the model's device: the last micro-batch's CE per row (p NULL: not kept)
    // Global-batch load balancing (NULL in the other forms): the step's earlier rounds' expert counts (layers, E) and
    // tokens (layers), and this round's counts of every replica (layers, D, E).
    double *lb_counts, *lb_tokens, *lb_cnt;
    // Layer l's expert weight gradients are written in this step: its first weight gradient writes them (they hold
    // the last step's values) and later ones add (moe_stage3_backward_weight).
    bool experts_written[MAX_LAYERS];
} StepSums;

typedef struct {
    int B, S, T;           // T = B·S tokens
    Tensor tokens, labels; // (T) int32 on the model's device
    Tensor pos;            // (T) int32 positions (document masking: inside each document, 0 at its first token)
    bool docs;             // document masking: attention, DeltaNet and conv1d see only the token's own document
    StepSums *sums;        // where its losses and counts add up (NULL: nowhere, generation)
    bool replay;           // its forward rerun in backward (full recompute): nothing is added a second time
} MicroBatch;

// What the engine moves between stages 1 → 2 → 3 → 4 → 5 of one layer (forward and backward).
typedef struct {
    bool dense;     // a dense-MLP layer: stages 2 and 4 pass (T, H) through
    Tensor xd, dxd; // (T, H) tokens to dispatch, and their gradient
    Tensor idx, w;  // (T, k) experts (int32) and routing weights (fp32) of each token
    Tensor dw;      // (T, k) gradient of the routing weights
    Tensor perm;    // (T·k) int32 slot ids t·k + j in expert order
    Tensor at;      // one ep rank: (T·k) int32, perm's inverse (stage 5 reads ye where stage 3 wrote it); else p NULL
    Tensor offs;    // (E_local + 1) int64 on the device: rows offs[e]..offs[e+1] of xe belong to local expert e
    int64_t rows;   // offs[E_local], known on the host: the rows stage 3 holds (T·k on one ep rank)
    struct EpRoute *route; // expert parallelism: where this layer's rows went (model/ep.h); NULL on one rank
    Tensor xe, dxe;        // (R, H) expert-ordered rows (dense: = xd; xe not made where moe_stage3_gathers)
    Tensor ye, dye;        // (R, H) expert outputs in the same order
    Tensor y, dy;          // (T·k, H) expert outputs back in slot order (dense: (T, H); one ep rank: = ye, dye)
    Tensor opws;           // fp32 scratch of the layer's ops (ModelFamily.op_ws; one for every layer), or p NULL
} StageIO;

typedef struct Model Model;

// Activation recomputation (docs/architecture.md, "Activation recomputation"): the set of parts backward recomputes
// instead of keeping, in the order of bytes saved per FLOP added (RC_EXPERT_OUT: the down GEMM and the combine again,
// RC_GATE_UP: the gate_up GEMM), or RC_FULL alone (a layer's forward rerun from its input and routing).
enum { RC_NORM = 1, RC_ROPE = 2, RC_SWIGLU = 4, RC_ROUTER = 8, RC_EXPERT_OUT = 16, RC_GATE_UP = 32, RC_PARTS = 6 };
enum { RC_FULL = 64 };
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE = RC_SWIGLU, RECOMPUTE_FULL = RC_FULL } RecomputeMode;

// Load balancing (docs/reference.md §2). "micro-batch": per rank and micro-batch (op_moe_lb_loss). "global-batch":
// f = expert counts of every micro-batch of the step's global batch up to and including this one, in the
// global order of micro-batches (block acc·D + q of replica q, D replicas = dp×ep), so every layout gives
// the same loss; the gradient flows through this micro-batch's probs. (PithTrain counts all D blocks of
// the current round, which makes the value depend on D.)
// "sequence" (DeepSeek-V2): the micro-batch form on each sequence alone, averaged over the sequences.
typedef enum { LB_MICRO_BATCH, LB_GLOBAL_BATCH, LB_SEQUENCE } LbForm;
typedef struct {
    LbForm form;
    bool global;              // form == LB_GLOBAL_BATCH
    const struct Comm *group; // the data replicas, rank = replica index q = dp·EP + ep
    int T, E, k, layers;      // capacity of the host scratch (the step's counts: StepSums.lb_counts)
    float *probs, *grad;      // (T, E), (E) host scratch
    int32_t *idx;             // (T, k)
    double *sums;             // context parallelism: (groups, 2E) counts and probability sums over the cp ranks
} LoadBalance;

// Grouped-query attention's shape, weights and record (gqa.c, below).
typedef enum { QK_NORM_NONE, QK_NORM_W, QK_NORM_1P } QkNorm; // none, x·rstd·w, x·rstd·(1 + w)
typedef struct {
    int64_t nh, nkv, d;
    QkNorm qk_norm;
    bool bias, gated, sinks;
    int window; // sliding window (AttnArgs.window; 0: full causal attention)
} GqaShape;
typedef struct {
    Tensor wq, bq, wk, bk, wv, bv, wo, bo, qn, kn, sinks; // absent ones {0}
} GqaWeights;
typedef struct {
    Tensor qg, qp, gate;    // gated: (T, nh, 2d) q_proj's output and its halves; qp: q before its norm
    Tensor kp, rq, rk;      // qk_norm: (T, nkv, d) k before its norm, (T·nh), (T·nkv) rstd
    Tensor q, k, v;         // after norm and RoPE: (T, nh, d), (T, nkv, d), (T, nkv, d)
    Tensor sinks;           // (nh) fp32 copy of the sinks (the attention op reads fp32)
    Tensor att, lse, gated; // (T, nh, d), (B, nh, S), att · σ(gate)
    Tensor dqg, dqp, dgate, dkp, dq, dk, dv, datt, dgated; // backward workspace
} GqaRec;

// The fields every layer record begins with: a family's own record is `typedef struct { LAYER_FIELDS; …its own } X;`,
// so the family and moe.c (through LayerRec: stage 1's skeleton, stages 3 and 5) name them alike (r->n1, …).
#define LAYER_FIELDS                                                                                                   \
    Tensor x;                 /* (T, H) layer input (owned by the previous layer) */                                   \
    Tensor n1, rstd1;         /* (T, H), (T) input norm */                                                             \
    GqaRec gqa;               /* grouped-query attention (gqa.c), when the layer's mixer is */                         \
    Tensor h1a;               /* (T, H) residual stream after the mixer (the post-attention norm's input) */           \
    Tensor h1;                /* (T, H) what stage 5 adds to: h1a (+ the shared expert) */                             \
    Tensor n2, rstd2;         /* (T, H) post-attention norm (= the tokens to dispatch), (T) */                         \
    Tensor logits, probs;     /* (T, E) router logits and scores */                                                    \
    Tensor lb_grad;           /* (B, E) load-balancing gradient w.r.t. probs (model_lb_loss) */                        \
    Tensor sgu, sact, so, sg; /* shared expert: (T, 2Is), (T, Is); gated: (T, H) output, (T, 1) gate logit */          \
    Tensor gu, act;           /* (R, 2I), (R, I) stage 3's activations, R = rows stage 3 can receive */                \
    Tensor dh1, dn1, dlogits, dsgu, dsact, dso, dsg, dgu, dact /* backward workspace */
typedef struct {
    LAYER_FIELDS;
} LayerRec;

// The epilog record (final norm → LM head → cross-entropy in row chunks).
typedef struct {
    Tensor h, hn, rstd, dhn; // (T, H) final-norm input and output, (T), ∂/∂hn
    Tensor logits;           // (C, V) logits of C rows at a time, compute dtype
} EpilogRec;

// Weight (or gradient) views of the parts every family shares, into the flat group buffers (absent ones {0}).
typedef struct {
    Tensor embed, norm, lm_head;                     // (V, H), (H), (V, H) (lm_head = embed when tied)
    Tensor ln1[MAX_LAYERS], ln2[MAX_LAYERS];         // (H) input and post-attention norms
    Tensor router[MAX_LAYERS], router_b[MAX_LAYERS]; // (E, H), (E)
    Tensor shared_gu[MAX_LAYERS], shared_down[MAX_LAYERS], shared_gate[MAX_LAYERS]; // (2Is, H), (H, Is), (1, H)
    GqaWeights att[MAX_LAYERS];                                                     // a grouped-query attention layer's
    Tensor gate_up[MAX_LAYERS]; // MoE: (E_l, 2I, H) = per expert [gate_proj; up_proj]; dense: (2I, H)
    Tensor down[MAX_LAYERS];    // MoE: (E_l, H, I); dense: (H, I)
    Tensor gate_up_b[MAX_LAYERS], down_b[MAX_LAYERS]; // GPT-OSS experts: (E_l, 2I), (E_l, H); else p == NULL
} SharedWeights;

// Buffers an HF layout hook allocates (transposed or dequantized tensors) until the writer has written them.
typedef struct {
    void **p;
    int n, cap;
} HfBuffers;
void *hf_buffer(HfBuffers *k, size_t bytes);
void hf_buffers_free(HfBuffers *k);
const StTensor *hf_find(const StSet *hf, const char *name); // HF tensor "model.<name>", else "<name>"; NULL: neither

// A layer's weights on the FP8 path (docs/architecture.md, "FP8"): the projections PithTrain runs as FP8Linear (spec
// §3.5). Never the router, the LM head, the embedding, DeltaNet's in_proj_a/b or the shared expert's gate.
typedef enum {
    FP8_NONE = -1, // a projection that never runs in FP8 (model_proj_backward_weights)
    FP8_GATE_UP,
    FP8_DOWN, // stage 3: the experts' or the dense MLP's (SharedWeights)
    FP8_Q,
    FP8_K,
    FP8_V,
    FP8_O, // attention q/k/v/o
    FP8_Q_A,
    FP8_Q_B,
    FP8_KV_A,
    FP8_KV_B, // MLA's q_a, q_b, kv_a_with_mqa, kv_b
    FP8_QKV,
    FP8_Z,
    FP8_OUT, // Gated DeltaNet's in_proj_qkv, in_proj_z, out_proj
    FP8_SHARED_GU,
    FP8_SHARED_DOWN, // the shared expert
    FP8_SLOTS
} Fp8Slot;

// The FP8 weight cache (cache.c; docs/architecture.md, "FP8"; model_fp8_setup): the layers' FP8 weights (Fp8Slot)
// run through op_fp8_*; quantised through E4M3 they are cached in the bytes of w (slot s of layer l from byte
// off[s][l], −1: the layer has no such weight here; a dense weight's or the experts' codes and scales), each remade at
// its first use after the optimizer's update bumps version, or ahead of it (model_fp8_ahead: ahead[l], layer l's are
// being made beside other work, until its first use joins them). gemms counts the FP8 GEMMs run per slot (tests).
typedef struct {
    bool on;
    Tensor w;
    int64_t version, made[FP8_SLOTS][MAX_LAYERS], off[FP8_SLOTS][MAX_LAYERS], gemms[FP8_SLOTS];
    bool ahead[MAX_LAYERS];
} Fp8Cache;

// The per-family function table. Every family's layer is one skeleton (moe.c): x → RMSNorm = n1 → mixer → + x = h1a
// → RMSNorm = n2 → router (and the shared expert: h1 = h1a + shared(n2)); stage 3 the experts (or the dense MLP),
// stage 5 h1 + Σ_j w_j·expert_j. A family names its parts and supplies the mixer: grouped-query attention (gqa.c) or
// its own. *_alloc functions take all memory from an arena, so running them on a counting arena gives the exact
// activation plan; the engine allocates the stage buffers (StageIO, expert rows).
typedef struct {
    const char *model_type;
    size_t rec_size; // bytes of one layer record: a LayerRec, or the family's struct beginning with LAYER_FIELDS
    // HF names after "layers.<l>.": the router "<router>.weight" (and ".bias" when router_bias); the shared expert
    // (ModelConfig.shared_inter > 0) "<shared>.{gate,up,down}_proj.weight", and "<shared>_gate.weight" when
    // shared_gate (its output times σ(n2·w)).
    const char *router, *shared;
    bool router_bias, shared_gate;
    void (*config_parse)(ModelConfig *c, JObj hf);
    // Layer l's mixer is grouped-query attention of shape gqa(c, l) when its nh > 0 (gqa NULL: never), else the
    // family's own (mixer_*).
    GqaShape (*gqa)(const ModelConfig *c, int layer);
    // The family's own mixer: its parameters (after input_layernorm), weight and gradient views (bind_layer fills a
    // struct of layer_views bytes from the flat buffers; model_layer_views), record fields and backward workspace;
    // forward reads r->n1 and writes r->h1a (the residual is the skeleton's), backward reads r->dh1 (∂/∂h1a) and
    // writes r->dn1. opws: the layer's op scratch (StageIO.opws).
    void (*mixer_params)(ParamTable *t, const ModelConfig *c, int layer);
    size_t layer_views;
    void (*bind_layer)(Model *m, Tensor *flat, int layer, void *views);
    Tensor (*fp8_weight)(const Model *m, int layer, Fp8Slot s); // its FP8 slots' weights ({0}: none; NULL: none)
    void (*mixer_alloc)(Model *m, int layer, void *rec, Arena *a, int B, int S);
    void (*mixer_grad_alloc)(Model *m, int layer, void *rec, Arena *ws, int B, int S);
    void (*mixer_forward)(Model *m, int layer, void *rec, MicroBatch *mb, Tensor opws);
    void (*mixer_backward)(Model *m, int layer, void *rec, MicroBatch *mb, Tensor opws);
    // fp32 elements of scratch that a layer's ops take from io->opws while each runs (the GPU delta rule's forward
    // and backward, say): one buffer of the largest layer's at the bottom of the backward workspace, shared by every
    // layer, record and op — ops run one at a time on the compute stream and keep nothing there. NULL: none.
    size_t (*op_ws)(const Model *m, int layer, int B, int S);
    // HF layout (pith convert): NULL when an HF folder holds one tensor per canonical parameter under its
    // canonical name with "model." in front (lm_head.* without), so import and export rename. Otherwise
    // hf_import writes every canonical tensor of t, made from the HF tensors of hf, into w (in hf's
    // dtypes), and hf_export writes the HF tensors made from the canonical ones of pith (dtype "bf16" or
    // "fp32" converts; NULL keeps the stored dtypes). Tensors they compute rather than slice live in
    // buffers from hf_buffer(keep, …), freed by the caller after the write. hf_import returns how many
    // MXFP4 weights it dequantized (GPT-OSS's released experts), into `dtype` ("bf16" or "fp32"; NULL: bf16).
    int (*hf_import)(const ModelConfig *c, const ParamTable *t, const StSet *hf, StWriter *w, const char *dtype,
                     HfBuffers *keep);
    void (*hf_export)(const ModelConfig *c, const ParamTable *t, const StSet *pith, StWriter *w, const char *dtype,
                      HfBuffers *keep);
} ModelFamily;

struct Model {
    const ModelFamily *fam;
    ModelConfig cfg;
    ParamTable params;
    Device dev;
    DType cdt;                 // compute dtype of weights and activations (fp32 on the CPU)
    Tensor w[NGROUPS];         // flat compute copies of the parameters (padded: cfg.pad)
    Tensor g[NGROUPS];         // flat fp32 gradient accumulators (padded: cfg.pad)
    Tensor rope_cos, rope_sin; // (S, rope.rd/2) fp32 (op_rope_tables)
    double lb_coef;            // load-balancing loss coefficient (0: off)
    LoadBalance lb;            // its form (model_lb_setup; zeroed: micro-batch)
    bool force_balance;        // benchmark routing (docs/reference.md §2)
    bool deterministic;        // config deterministic: the families' AttnArgs ask for pith's own attention kernels
    // Aux-loss-free balancing (set up by the trainer; router_bias.p == NULL: off): the selection bias (the
    // step adds up the expert counts in StepSums.router_load).
    Tensor router_bias;      // (layers, E) fp32 on the model's device
    const struct Comm *ep;   // expert-parallel group (parallel/comm.h); NULL: every expert is on this rank
    double ep_capacity;      // parallel.ep_capacity_factor: a layer's own stage-3 rows = factor·T·k (0: worst case)
    bool ep_drop;            // parallel.ep_drop_tokens: rows above the capacity are dropped (else they spill)
    RecomputeMode recompute; // what backward recomputes instead of keeping
    int64_t logits_bytes;    // the epilog's logits chunk budget (0: the device's default, moe_epilog_alloc)
    bool delta_keep;         // Qwen3.5: each linear layer's record keeps the GPU delta rule's state (DeltaArgs.keep)
    SharedWeights *sw, *sg;  // views of the shared parts: compute weights and fp32 gradients
    int64_t view_from;       // model_view's dense flat buffer begins at this element of the group (a unit's window)
    void *views;             // the family mixer's views: (2, MAX_LAYERS) of fam->layer_views bytes (model_layer_views)
    struct KvCache *kv;      // generation: attention and DeltaNet read and extend it (NULL: training, evaluation)
    struct Ring *ring;       // context parallelism (parallel/ring.h): attention is zigzag ring attention (NULL: cp 1)
    // model_zero_grads zeroes both groups only the first time, so their padding is zero; later it zeroes the dense
    // group but the untied LM head's gradient (model_zero_dense), and the expert group not at all. The step's first
    // weight gradient writes those instead of adding (StepSums.experts_written, head_unwritten): each step saves a
    // pass over the largest gradient buffer and one over V·H fp32 values with the first LM-head chunk's read of zeros.
    bool grads_zeroed, head_unwritten;
    Fp8Cache fp8; // FP8 (cache.c): the layers' quantised projection weights
    // Tests (CPU only, one micro-batch): layer l's router takes route_given[l] (T·k) instead of its own top-k
    // (RouterArgs.given); NULL: its own.
    const int32_t *route_given[MAX_LAYERS];
};

// The family mixer's views of layer l: its compute weights, or (grad) its fp32 gradients.
static inline void *model_layer_views(const Model *m, int l, bool grad) {
    return (char *)m->views + ((size_t)grad * MAX_LAYERS + l) * m->fam->layer_views;
}

const ModelFamily *model_family_find(const char *model_type); // NULL if unsupported
// Reads an HF config.json (or a folder holding one) into c; dies naming the file and field.
const ModelFamily *model_config_load(ModelConfig *c, const char *path);

extern const ModelFamily qwen3_moe_family, deepseek_v2_family, gpt_oss_family, qwen3_5_moe_family;

// ---- the parts every family shares (moe.c) ----
// The rope spec of an HF config with rd rotary dims: rope_theta at the top (transformers v4) or inside
// rope_parameters / rope_scaling (v5), rope_type (or type) default, or yarn when yarn_ok, with its fields.
void moe_rope_parse(ModelConfig *c, JObj hf, int rd, bool yarn_ok);
// Checks of the generic fields after a family's config_parse (dies naming the field); experts_key: the
// family's HF name of the expert count.
void moe_config_check(const ModelConfig *c, JObj hf, const char *experts_key);
// layer_types (one `kind` or "full_attention" per layer; absent: every every-th layer is full attention) into bits:
// bit l set when layer l is `kind`. Dies naming the field.
void moe_layer_types(const ModelConfig *c, JObj hf, const char *kind, int every, uint64_t bits[MAX_LAYERS / 64]);
// A view of nd dims starting at parameter `name` inside the flat buffers ({0} if the model lacks it).
Tensor model_view(Model *m, Tensor *flat, const char *name, int nd, int64_t n0, int64_t n1, int64_t n2);
// Layer l's tensor "layers.<l>.<suffix>" of the dense group: its parameter, and its view (the families' names).
void params_add_layer(ParamTable *t, int l, const char *suffix, int init, int nd, int64_t n0, int64_t n1);
Tensor model_view_layer(Model *m, Tensor *flat, int l, const char *suffix, int nd, int64_t n0, int64_t n1);
// The parameter table of fam's layers on c: the token embedding; per layer input_layernorm, the mixer's,
// post_attention_layernorm, the router, the shared expert, and the experts (this rank's, gate_proj and up_proj of an
// expert adjacent) or the dense MLP under the HF names layers.l.mlp.[experts.e.]{gate,up,down}_proj.weight (GPT-OSS
// experts, swiglu_limit > 0: layers.l.mlp.experts.e.{gate_up,down}_proj.{weight,bias}); the final norm and LM head.
void model_params_build(const ModelFamily *fam, ParamTable *t, const ModelConfig *c);
void moe_bind(Model *m); // m->sw, m->sg for the parameters above, and the family mixer's views (m->views)
// The dense group's gradient units under parallel.gradient_reduce "layer" (docs/architecture.md, "Gradient reduction
// per layer"): contiguous ranges of its flat buffer in params order. Unit l < layers: layer l's dense parameters;
// MODEL_UNIT_EPILOG (= layers): the final norm and, untied, the LM head, to the group's end (its padding included);
// MODEL_UNIT_PROLOG (= layers + 1): the embedding (with tied embeddings also the LM head's gradient).
#define MODEL_UNIT_EPILOG(m) ((m)->cfg.layers)
#define MODEL_UNIT_PROLOG(m) ((m)->cfg.layers + 1)
typedef struct {
    int64_t off, n; // elements [off, off + n) of the dense group
} ModelUnit;
ModelUnit model_grad_unit(const Model *m, int u);
// Points unit u's gradient views (m->sg, the family mixer's) at win: (n) fp32, its range [off, off + n) of the group.
void model_bind_grad_unit(Model *m, int u, Tensor win, int64_t off);
// Stage 1's record (io->dense and, for MoE layers, io->idx and io->w are set by the engine); sets io->xd. staged:
// only the parts m->recompute names (norms, RoPE'd q/k, router), which the record leaves out: from a staging arena
// before each forward, from the workspace for the backward, which moe_stage1_recompute fills again.
void moe_layer_alloc(Model *m, int l, void *rec, Arena *a, int B, int S, StageIO *io, bool staged);
void moe_stage1_recompute(Model *m, int l, void *rec, const MicroBatch *mb, StageIO *io);
void moe_layer_grad_alloc(Model *m, int l, void *rec, Arena *ws, int B, int S, StageIO *io);
// gate/up products and SwiGLU outputs of R rows: those kept, or (staged) those m->recompute names.
void moe_stage3_alloc(Model *m, int l, void *rec, Arena *a, int64_t R, bool staged);
int64_t moe_stage3_rows(const Model *m, const StageIO *io); // the rows holding data: received (MoE), every token
// A MoE layer on one ep rank on the CPU, or in FP8 on the GPU: stage 3's grouped GEMMs read their rows xd[perm[i] / k]
// in place (the dispatch's gather made part of the product; the GPU's FP8 quantisers gather as they read), so xe is
// never made and xd (n2) is kept for the weight gradient. The GPU's bf16 GEMMs take their rows gathered: it gathers
// xe first (op_gather_rows).
bool moe_stage3_gathers(const Model *m, const StageIO *io);
void moe_stage3_grad_alloc(Model *m, int l, void *rec, Arena *ws);
void moe_prolog_forward(Model *m, MicroBatch *mb, Tensor h);
void moe_prolog_backward(Model *m, MicroBatch *mb, Tensor dh);
void moe_stage1_forward(Model *m, int l, void *rec, MicroBatch *mb, Tensor x, StageIO *io);
// again: in backward, for the expert outputs (RC_EXPERT_OUT): gate/up and SwiGLU only where they are not kept.
void moe_stage3_forward(Model *m, int l, void *rec, StageIO *io, bool again);
void moe_stage3_backward_input(Model *m, int l, void *rec, StageIO *io);
void moe_stage3_backward_weight(Model *m, int l, void *rec, const MicroBatch *mb, StageIO *io);
void moe_stage5_forward(Model *m, int l, void *rec, StageIO *io, Tensor out);
void moe_stage5_backward(Model *m, int l, void *rec, StageIO *io, Tensor dout);
// dout: ∂/∂(layer output) (its residual path reaches h1 directly); dx: ∂/∂(layer input), written.
void moe_stage1_backward(Model *m, int l, void *rec, MicroBatch *mb, StageIO *io, Tensor dout, Tensor dx);
void moe_epilog_alloc(Model *m, EpilogRec *r, Arena *a, int T);
// Adds Σ CE over the micro-batch into mb->sums->loss_sum; with grad, also ∂/∂(final hidden) into dh.
void moe_epilog_forward(Model *m, EpilogRec *r, MicroBatch *mb, Tensor h, bool grad);
void moe_epilog_backward(Model *m, EpilogRec *r, Tensor dh);
// Final norm → LM head of rows h: (R, H) into logits: (R, V) (any dtype and device; converted), forward only,
// temporaries from ws (generation).
void moe_logits(Model *m, Tensor logits, Tensor h, Arena *ws);

// Builds the parameter table and allocates fp32-or-compute-dtype weights, fp32 gradients, rope tables
// for positions < max_seq, and the loss accumulators on dev. Weights are left uninitialised.
void model_create(Model *m, const ModelFamily *fam, const ModelConfig *cfg, Device dev, DType cdt, int max_seq);
// model_create without the gradient accumulators (their views have NULL data): forward only (pith generate).
void model_create_forward(Model *m, const ModelFamily *fam, const ModelConfig *cfg, Device dev, DType cdt, int max_seq);
// Everything model_create does but allocate: tensors have their shapes and NULL data (memory plans).
void model_describe(Model *m, const ModelFamily *fam, const ModelConfig *cfg, Device dev, DType cdt, int max_seq);
// The parameter table of the whole model (every expert), whatever this rank holds.
void model_params_all(const Model *m, ParamTable *t);
void model_free(Model *m);
// A flat tensor of n elements in a block of its own, owned by the model (model_tensor_free); alloc false: its shape
// only (NULL data), for memory plans.
Tensor model_tensor(Device dev, DType dt, int64_t n, bool alloc);
void model_tensor_free(Tensor t);
// ---- caches (cache.c) ----
// FP8 on (docs/architecture.md, "FP8"): the weight cache for this rank's layers (allocated when the model is, a
// shape only when it is a plan).
void model_fp8_setup(Model *m);
// Layer l's weight of slot s quantised with FP8_TILES, from the cache (remade when stale): the codes and scales of a
// dense weight (N, K) or of the experts' (E, N, K).
Fp8Weight model_fp8_weight(Model *m, int l, Fp8Slot s);
// The optimizer updated the weights: the cache is stale, and every layer's is remade now, beside the work issued next
// (op_fp8_weights_ahead, ticket l for layer l), its first use waiting for it. Not while a CUDA graph that remakes the
// cache is in use (the trainer bumps fp8.version instead).
void model_fp8_ahead(Model *m);
// One warning (naming `file`'s fp8 key) for each slot whose cached weights the FP8 tensor cores do not take on m's GPU
// (op_fp8_tensor_cores): their GEMMs multiply operands rounded through E4M3 in the compute dtype, FP8's numbers at
// below bf16's speed. Returns how many slots (0 on the CPU, which emulates every one).
int model_fp8_warn_rounded(const Model *m, const char *file);
// Layer l's projection with the weight w of slot s: y = x·wᵀ + b, dx (+)= dy·w, dw += dyᵀ·x and db += Σ_rows dy
// (op_linear_*) — through FP8 on the slot's cached weight when m->fp8 holds one (the bias added after the FP8
// product, its gradient from the unrounded dy), else in the compute dtype. b, db: {0} for none.
void model_proj_forward(Model *m, int l, Fp8Slot s, Tensor y, Tensor x, Tensor w, Tensor b);
void model_proj_backward_input(Model *m, int l, Fp8Slot s, Tensor dx, Tensor dy, Tensor w, bool accumulate);
void model_proj_backward_weight(Model *m, int l, Fp8Slot s, Tensor dw, Tensor db, Tensor dy, Tensor x);
// The weight gradients of n projections of one input x (slots s[i], FP8_NONE: never FP8), one by one as above.
void model_proj_backward_weights(Model *m, int l, int n, const Fp8Slot *s, const Tensor *dw, const Tensor *db,
                                 const Tensor *dy, Tensor x);
// Chooses the form; global-batch (micro-batches of at most T tokens) all-gathers counts over `replicas`.
void model_lb_setup(Model *m, LbForm form, const struct Comm *replicas, int T);
// Stage 1's load-balancing term of layer l for micro-batch mb of B sequences: adds coef·E·Σ f_e·P_e into
// mb->sums->lb_sum (not when mb->replay) and writes lb_grad: (B, E), the gradient w.r.t. each token's probs — row 0 for every token
// (micro- and global-batch forms) or row b for the tokens of sequence b (sequence form). probs: (T, E),
// idx: (T, k).
void model_lb_loss(Model *m, const MicroBatch *mb, int l, Tensor lb_grad, Tensor probs, Tensor idx, float grad_scale);
// op_router_forward with layer l's selection bias (aux-loss-free balancing, when on) and the model's score function
// (cfg.router_sigmoid), counting the chosen experts into mb->sums->router_load (when set, and not in a replay).
void model_router_forward(Model *m, const MicroBatch *mb, int l, Tensor probs, Tensor idx, Tensor w, Tensor logits,
                          RouterArgs ra);
// op_router_backward with the load-balancing gradient of model_lb_loss (lb_grad.p == NULL: none) and the model's
// score function.
void model_router_backward(Model *m, Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                           const RouterArgs *ra, int B);
void model_zero_grads(Model *m);
// Zeroes the dense gradient buffer g (the group, or a gradient unit's window) but the LM head's gradient where it lies
// in g untied: that is written by the epilog's next product (Model.head_unwritten).
void model_zero_dense(Model *m, Tensor g);
// A step's sums on m's device (alloc false: shapes only, for plans); router_load when m->router_bias is set.
void step_sums_create(StepSums *s, const Model *m, bool alloc);
void step_sums_begin(StepSums *s, const Model *m);    // a new step: zeroes the sums and counts, experts_written
void step_sums_lb_begin(StepSums *s, const Model *m); // a new global batch: the load-balancing counts from zero
void step_sums_free(StepSums *s);

// ---- generation: a forward-only incremental path through the layers (docs/architecture.md, "Generation"; the KV
// cache in cache.c, attention through it in model.c) ----
// A KV cache holds each layer's keys and values after RoPE for the positions [0, len) of one sequence. A family's
// stage 1 calls model_attention_forward where it would call op_attention_forward: without m->kv that is the op;
// with it the call's keys and values (one sequence, B = 1, at positions len, len + 1, …) are appended to layer l's
// cache and the queries attend to the whole cache (q_off = len). Multi-head latent attention caches its
// decompressed per-head k and v, not the latent. The caller sets the positions (MicroBatch.pos) and advances len
// once every layer has run.
typedef struct KvCache {
    int cap, len;                        // positions it can hold, positions filled
    Arena mem[MAX_LAYERS];               // one block per layer, made at the layer's first call
    Tensor k[MAX_LAYERS], v[MAX_LAYERS]; // (cap, nkv, dqk), (cap, nkv, dv) in the compute dtype
    // A Gated DeltaNet layer caches its recurrent state and its conv's last K−1 input rows instead, each followed
    // by a second buffer of the same size that the call writes and kv_cache_delta_advance copies back.
    Tensor state[MAX_LAYERS], halo[MAX_LAYERS]; // (2, nv, dk, dv) fp32, (2(K−1), C) in the compute dtype
} KvCache;
void kv_cache_free(KvCache *kv);
// Layer l's DeltaNet cache for a call whose conv input is x: (S, C), made at the layer's first call (zeros: nothing
// came before): a->s0 the entering state (1, nv, dk, dv), a->sT the buffer the delta rule writes the leaving one
// into; returns the halo: (K−1, C), the conv input at positions len − (K−1) .. len − 1 (zeros before position 0).
Tensor kv_cache_delta(KvCache *kv, int l, Tensor x, int K, int64_t nv, int64_t dk, int64_t dv, DeltaArgs *a);
// After the call: sT becomes the state and the last K−1 rows of [halo; x] the halo (x may have fewer than K−1 rows).
void kv_cache_delta_advance(KvCache *kv, int l, Tensor x);
void model_attention_forward(Model *m, int l, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a);
// The position of row t of a micro-batch of sequences of S rows: t mod S, or under context parallelism (m->ring)
// the global position of local row t mod S of this rank's zigzag chunks.
int model_position(const Model *m, int S, int t);
// op_attention_backward, or with m->ring the ring's backward (context parallelism): families call this one.
void model_attention_backward(Model *m, Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k,
                              Tensor v, Tensor o, Tensor lse, const AttnArgs *a);

// ---- grouped-query attention (gqa.c): the mixer of Qwen3, GPT-OSS and Qwen3.5's full-attention layers ----
// out = o_proj(attention(RoPE(norm(q_proj(n1))), RoPE(norm(k_proj(n1))), v_proj(n1))) over nh query heads and nkv
// key/value heads of d: projection biases when bias; the per-head q/k RMSNorm of qk_norm; rotate-half RoPE on the
// model's tables; the family's AttnArgs (scale, window; sinks: GPT-OSS's learned per-head logit); gated (Qwen3.5):
// q_proj gives per head [q | gate] and o_proj reads attention · σ(gate). HF names self_attn.{q,k,v,o}_proj.*,
// self_attn.{q,k}_norm.weight, self_attn.sinks.
void gqa_params(ParamTable *t, const GqaShape *s, int l, int64_t H); // layer l's, in this order
void gqa_bind(Model *m, Tensor *flat, const GqaShape *s, int l, GqaWeights *w);
// The record's kept tensors, or (staged) the RoPE'd q, k when rope (recomputed by gqa_qk_rope: with a q/k norm).
void gqa_alloc(GqaRec *r, const GqaShape *s, Arena *a, DType dt, int B, int S, bool rope, bool staged);
// q, k = RoPE(norm(qp, kp)) (after RoPE(q, k) in place without a norm): the forward's, and the recompute's.
void gqa_qk_rope(Model *m, const GqaShape *s, const GqaWeights *W, GqaRec *r, const MicroBatch *mb);
void gqa_grad_alloc(GqaRec *r, const GqaShape *s, Arena *ws, DType dt, int B, int S);
// n1: (T, H) the normed input; out: (T, H) written. FP8 slots FP8_Q, FP8_K, FP8_V, FP8_O of layer l.
void gqa_forward(Model *m, int l, const GqaShape *s, const GqaWeights *W, GqaRec *r, const MicroBatch *mb, Tensor n1,
                 Tensor out, AttnArgs aa);
// dout: ∂/∂out; dn1: ∂/∂n1 written; G: the fp32 gradients (accumulated).
void gqa_backward(Model *m, int l, const GqaShape *s, const GqaWeights *W, const GqaWeights *G, GqaRec *r,
                  const MicroBatch *mb, Tensor n1, Tensor dout, Tensor dn1, AttnArgs aa);
// The attention's AttnArgs for B sequences: causal, scaled by 1/√d, s's window.
AttnArgs gqa_attn_args(const Model *m, const GqaShape *s, int B);

// ---- multi-head latent attention, on one rank or around the ring (model.c; DeepSeek-V2's decompression and hooks
// in deepseek_v2.c) ----
// Multi-head latent attention's latent (docs/reference.md §11): c: (T, dc) kv_a_layernorm's output,
// k_pe (after RoPE) in columns [pe_col, pe_col + dr) of pe: (T, ·); kv_b_proj's weight wkvb: (nh·(dn + dv), dc)
// and its fp32 gradient dwkvb; nh heads, dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim. m, layer:
// kv_b_proj is FP8 slot FP8_KV_B of that layer (model_proj_*; m NULL: op_linear_*).
typedef struct {
    RingLatent r; // c, pe, pe_col, nh, dn, dr, dv, and the hooks (model_mla_hooked)
    Model *m;
    int layer;
    Tensor wkvb, dwkvb;
} MlaLatent;
// K and V of the latent rows c, pe: kv: (R, nh, dn + dv) = c·wkvbᵀ per head [k_nope | v]; k: (R, nh, dn + dr) =
// [k_nope | k_pe] (a token's one k_pe in every head); v: (R, nh, dv).
void model_mla_decompress(const MlaLatent *ml, Tensor c, Tensor pe, int pe_col, Tensor kv, Tensor k, Tensor v);
// Its backward from dk, dv (any float dtype): dkv = [dk_nope | dv] (scratch, compute dtype), the k_pe columns of
// dpe = Σ over heads, dc = dkv·wkvb written, ml->dwkvb += dkvᵀ·c.
void model_mla_decompress_backward(const MlaLatent *ml, Tensor c, Tensor dc, Tensor dpe, int dpe_col, Tensor dkv,
                                   Tensor dk, Tensor dv);
// ml with its hooks set to model_mla_decompress and its backward (what model_mla_attention_* and ring_mla_* call).
MlaLatent model_mla_hooked(const MlaLatent *ml);
// Attention from the latent of a hooked ml: its decompress into kv, k, v, then model_attention_forward; under context
// parallelism the latent travels the ring instead (kv, k, v are not written).
void model_mla_attention_forward(Model *m, int l, Tensor o, Tensor lse, Tensor q, const MlaLatent *ml, Tensor kv,
                                 Tensor k, Tensor v, const AttnArgs *a);
// Its backward: dq, dc: (T, dc) and the k_pe columns of dpe (ml->pe's layout) written, ml->dwkvb accumulated;
// dk, dv, dkv: scratch shaped like k, v, kv.
void model_mla_attention_backward(Model *m, Tensor dq, Tensor dc, Tensor dpe, Tensor dout, Tensor q, Tensor k, Tensor v,
                                  Tensor o, Tensor lse, Tensor dk, Tensor dv, Tensor dkv, const MlaLatent *ml,
                                  const AttnArgs *a);

// ---- Gated DeltaNet under context parallelism (docs/architecture.md, "Context parallelism") ----
// The mixer runs on the contiguous layout (cp rank r holds chunks 2r and 2r + 1 of each sequence; parallel/ring.h):
// model_cp_contiguous converts its input rows from the zigzag layout and model_cp_zigzag its output back; without
// m->ring both are nothing (dst must be src). B sequences of (B·S, ·) rows.
void model_cp_contiguous(Model *m, Tensor dst, Tensor src, int B);
void model_cp_zigzag(Model *m, Tensor dst, Tensor src, int B);
// op_conv1d_silu_* whose halo (B·(K−1), C), kept in the record, holds the previous rank's last K − 1 rows of x
// (m->ring; rank 0: zeros; without m->ring halo.p is NULL); the backward sends the halo's gradient back to that rank
// and adds the next rank's to dx's last K − 1 rows of each sequence. pos: the op's document positions (p NULL: none),
// in the contiguous layout. split: y's column blocks (op_conv1d_silu_forward).
void model_conv1d_silu_forward(Model *m, Tensor y, Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split);
void model_conv1d_silu_backward(Model *m, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo, Tensor pos,
                                int B, int64_t split);
// op_delta_rule_* with the state passed along the cp ranks (m->ring): the forward receives the previous rank's final
// state into s0: (B, nv, dk, dv) fp32 (kept in the record; rank 0 starts from zeros) and sends its own on; the
// backward receives the next rank's ∂/∂s0 as its dsT and sends its ∂/∂s0 back. Sequential: rank r waits for r − 1
// (forward) and r + 1 (backward). a's s0, sT, dsT, ds0 are the wrapper's.
void model_delta_rule_forward(Model *m, Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, DeltaArgs a,
                              Tensor s0);
void model_delta_rule_backward(Model *m, Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout,
                               Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, DeltaArgs a, Tensor s0);
