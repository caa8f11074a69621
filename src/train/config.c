// config.c — reading and validating the training config (see config.h). Paths inside the file are
// relative to the file's folder; paths given with --set are relative to the current directory.
//
// Every key is one row of its section's table below: the field it fills, its type, default, range and
// meaning. Parsing, the unknown-key check, the effective config (--print-config, run.json), the resume
// comparison and docs/usage.md's table all walk these rows, so a key is written once.
#include "train/config.h"

#include <limits.h>
#include <math.h>
#include <errno.h>
#include <stddef.h>
#include <unistd.h>

// K_DATA: DataSource list; K_PARTS: config_recompute_parse's value
typedef enum { K_PATH, K_DATA, K_INT, K_SEED, K_NUM, K_BOOL, K_CHOICE, K_PAIR, K_PARTS } KeyKind;
enum { KEY_DATA_ORDER = 1, KEY_SCHEDULE = 2 }; // a change on resume is refused (KEY_SCHEDULE: unless constant)

typedef struct {
    const char *name;
    KeyKind kind;
    size_t off; // offsetof(TrainConfig, field)
    bool required;
    double def, lo, hi;         // default and range of numbers (K_INT, K_NUM, K_PAIR); hi = INFINITY: none
    bool lo_open, hi_open;      // the range excludes lo, hi
    const char *const *choices; // K_CHOICE: the names in enum order, the default first
    int flags;
    const char *def_text; // docs/usage.md's default, where it is not the value of def
    const char *doc;
} ConfigKey;

typedef struct {
    const char *name; // "" for the top level
    const ConfigKey *keys;
    int n;
} ConfigSection;

#define OFF(field) offsetof(TrainConfig, field)
#define LEN(a) ((int)(sizeof a / sizeof *a))

static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const dtype_names[] = {"bf16", "fp32", NULL};
static const char *const lb_names[] = {"micro-batch", "global-batch", "sequence", NULL}; // LbForm order
static const char *const nonfinite_names[] = {"fail", "skip", NULL};
static const char *const optimizer_names[] = {"adamw", "muon", NULL};
static const char *const state_dtype_names[] = {"fp32", "bf16", NULL}; // StateDtype order
static const char *const scheduler_names[] = {"constant", "wsd", "cosine", NULL};
static const char *const decay_names[] = {"cosine", "linear", NULL};
static const char *const sharding_names[] = {"fsdp", "hsdp", NULL};
static const char *const grad_reduce_names[] = {"step", "layer", NULL}; // GradReduce order
static const char *const recompute_parts[] = {"norm", "rope", "swiglu", "router", "expert_out", "gate_up"}; // RC_*

// clang-format off
static const ConfigKey top_keys[] = {
    {.name = "model", .kind = K_PATH, .off = OFF(model), .required = true,
     .doc = "HF `config.json` (or a folder holding one); `model_type` picks the family"},
    {.name = "dataset", .kind = K_DATA, .off = OFF(dataset), .flags = KEY_DATA_ORDER, .def_text = "required by `train`",
     .doc = "folder of `.bin` token files (searched recursively) or one file; or a weighted mixture, a list of "
            "`{\"path\": ..., \"weight\": ...}` (weight > 0): sample *i* draws its source from a hash of (seed, *i*) "
            "against the cumulative shares and takes that source's next sample in its own seeded order, so the order "
            "is a function of the seed alone (docs/usage.md, \"Data mixtures\")"},
    {.name = "sequence_length", .kind = K_INT, .off = OFF(sequence_length), .required = true, .lo = 1, .hi = 1 << 24,
     .flags = KEY_DATA_ORDER, .doc = "tokens per sample"},
    {.name = "micro_batch_size", .kind = K_INT, .off = OFF(micro_batch_size), .required = true, .lo = 1, .hi = 1 << 20,
     .doc = "samples per micro-batch of one rank; `micro_batch_size × sequence_length` ≤ 2^31 − 1"},
    {.name = "global_batch_size", .kind = K_INT, .off = OFF(global_batch_size), .required = true, .lo = 1,
     .hi = 1 << 30, .flags = KEY_DATA_ORDER,
     .doc = "samples per step, a multiple of `micro_batch_size × dp × ep`; the rest is gradient accumulation"},
    {.name = "max_steps", .kind = K_INT, .off = OFF(max_steps), .required = true, .lo = 1, .hi = 1 << 30,
     .flags = KEY_SCHEDULE, .doc = "optimizer steps of the whole run (the schedule's length)"},
    {.name = "seed", .kind = K_SEED, .off = OFF(seed), .def = 1234, .flags = KEY_DATA_ORDER,
     .doc = "initial values and data order"},
    {.name = "init_std", .kind = K_NUM, .off = OFF(init_std), .def = 0.02, .lo = 0, .hi = 1,
     .doc = "initialisation N(0, init_std), o_proj/down_proj N(0, init_std/√(2·layers))"},
    {.name = "clip_grad_norm", .kind = K_NUM, .off = OFF(clip_grad_norm), .def = 1.0, .lo = 0, .hi = INFINITY,
     .doc = "global grad-norm clipping (0 disables)"},
    {.name = "moe_load_balance_coef", .kind = K_NUM, .off = OFF(moe_load_balance_coef), .lo = 0, .hi = INFINITY,
     .doc = "coefficient of the Switch-style load-balancing loss (0: none)"},
    {.name = "moe_router_bias_update_rate", .kind = K_NUM, .off = OFF(moe_router_bias_update_rate), .lo = 0, .hi = 1,
     .doc = "aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores that select the top-k (not "
            "to the weights), moved after every step by `rate · sign(mean load − load_e)` from the expert counts of "
            "the whole global batch (the same under every layout); kept in checkpoints (`run.json`, `router_bias`); "
            "0: off"},
    {.name = "moe_load_balance_type", .kind = K_CHOICE, .off = OFF(moe_load_balance_type), .choices = lb_names,
     .doc = "per micro-batch; `global-batch`: expert counts of the global batch's micro-batches so far (all ranks, "
            "in global order); `sequence` (DeepSeek-V2): per sequence, averaged over sequences"},
    {.name = "benchmark", .kind = K_BOOL, .off = OFF(benchmark),
     .doc = "force-balanced routing (`idx[t,j] = (t + j·E/k) mod E`)"},
    {.name = "device", .kind = K_CHOICE, .off = OFF(device), .choices = device_names,
     .doc = "`auto`: the GPU when there is one"},
    {.name = "compute_dtype", .kind = K_CHOICE, .off = OFF(compute_dtype), .choices = dtype_names,
     .doc = "GPU compute dtype (the CPU computes in fp32)"},
    {.name = "gradient_dtype", .kind = K_CHOICE, .off = OFF(gradient_dtype), .choices = state_dtype_names,
     .doc = "the expert gradient accumulators stored in `bf16`: each weight gradient's sum in fp32, added to the "
            "stored value in fp32 and rounded once to nearest even (PithTrain's experts round each micro-batch's "
            "weight gradient to bf16 too); 2 bytes per expert parameter of this rank less (the dense group stays fp32; "
            "adamw), and on one H200 the 8-layer benchmarks 3–4% faster (bench/results/2026-12-04-s29)"},
    {.name = "fp8", .kind = K_BOOL, .off = OFF(fp8),
     .doc = "FP8 training (PithTrain's key): the expert GEMMs and the projections (attention, MLA, DeltaNet in/out, "
            "shared experts, dense MLPs) multiply operands rounded through E4M3 with block scales (1×128 activations "
            "and gradients, 128×128 weights, DeepSeek-V3's recipe) and accumulate in fp32; the attention core, "
            "norms, router, embedding and LM head stay in the compute dtype, masters, gradients and moments fp32; on "
            "the GPU a weight the FP8 tensor cores do not take (experts not whole 128-blocks, dense not multiples of "
            "16) gets a warning at the start; the FP8 weight cache (the codes and their transposes, 2 bytes a "
            "weight) is held beside the compute copy, remade after each update on a side stream beside the next step's "
            "first layers; unsharded, the experts' compute copy is their fp32 master (no bf16 copy of them): `pith "
            "estimate` names both (docs/architecture.md, \"FP8\")"},
    {.name = "deterministic", .kind = K_BOOL, .off = OFF(deterministic),
     .doc = "bit-reproducible GPU training run to run: attention on pith's own kernels instead of cuDNN's (whose "
            "backward adds into dQ with atomics; the cost is in bench/results/2026-12-02-det); the other GPU "
            "reductions run in a fixed order always, except Qwen3.5's delta rule and expert parallelism's per-rank "
            "sums; the CPU is deterministic already (docs/architecture.md, \"Determinism\")"},
    {.name = "cuda_graph", .kind = K_BOOL, .off = OFF(cuda_graph),
     .doc = "one GPU: from the third step on, each micro-batch's forward and backward is one launch of a CUDA graph "
            "recorded once (two: a step's first micro-batch and the others), not thousands of kernel launches; the "
            "same bits as without; not with pipeline, expert or context parallelism, more than one rank, "
            "`pipeline_schedule` or `global-batch` load balancing (docs/architecture.md, \"CUDA graphs\")"},
    {.name = "document_masking", .kind = K_BOOL, .off = OFF(document_masking),
     .doc = "packed samples keep their documents apart: a token attends only to earlier tokens of its own document "
            "(the token files' document ends; a document begun before the sample starts at the sample's first "
            "token), RoPE positions and Qwen3.5's DeltaNet state and conv window restart at each document's first "
            "token; the targets are unchanged (a document's last token predicts the next one's first)"},
    {.name = "recompute", .kind = K_PARTS, .off = OFF(recompute), .def_text = "`none`",
     .doc = "activation recomputation: the parts backward recomputes instead of keeping, a list (or names joined "
            "by commas) of `norm` (RMSNorm outputs), `rope` (q, k after their norm and RoPE), `swiglu` (SwiGLU "
            "outputs), `router` (logits and scores), `expert_out` (the experts' outputs in token order: the down "
            "GEMM and the combine again), `gate_up` (stage 3's gate/up products: the gate_up GEMM again); "
            "`selective` = `swiglu`; `full` keeps only each layer's input and routing and reruns its forward; the "
            "gradients are the same bit for bit (docs/architecture.md, \"Activation recomputation\")"},
    {.name = "delta_rule_keep", .kind = K_BOOL, .off = OFF(delta_rule_keep),
     .doc = "Qwen3.5 on the GPU: each Gated DeltaNet layer keeps its delta rule's chunk preparation and per-chunk "
            "states from the forward for the backward instead of computing them again (≈ 1.35 GB a layer at "
            "2 × 4096 tokens of Qwen3.5-35B-A3B's shapes, `pith estimate`); the same bits"},
    {.name = "logits_chunk_mb", .kind = K_INT, .off = OFF(logits_chunk_mb), .lo = 0, .hi = 1 << 20,
     .def_text = "512 on the GPU, 64 on the CPU",
     .doc = "the LM head and cross-entropy run over row chunks whose logits (compute dtype) take at most this many "
            "MB; every chunk reads and writes the LM head's fp32 gradient once (8·vocab·hidden bytes), so fewer, "
            "larger chunks are faster and hold more memory (`pith estimate`: the epilog); 2048 on one H200 makes "
            "gpt-oss-20b and Qwen3.5 5–8% faster (bench/results/2026-12-03-s25)"},
    {.name = "run_dir", .kind = K_PATH, .off = OFF(run_dir), .def_text = "`save_location`, else `runs/<folder>-<name>`",
     .doc = "where `metrics.jsonl` goes"},
    {.name = "tensorboard", .kind = K_BOOL, .off = OFF(tensorboard), .def = 1,
     .doc = "rank 0 also writes the step scalars as a TensorBoard event file into `run_dir` (`tensorboard --logdir`, "
            "`wandb sync --sync-tensorboard`)"},
    {.name = "save_location", .kind = K_PATH, .off = OFF(save_location), .def_text = "none",
     .doc = "checkpoints (layout-independent: they resume under any ranks and layout); one run at a time (a lock)"},
    {.name = "save_interval", .kind = K_INT, .off = OFF(save_interval), .lo = 0, .hi = 1 << 30,
     .doc = "checkpoint every N steps (0: at the end only); needs `save_location`"},
    {.name = "keep_last", .kind = K_INT, .off = OFF(keep_last), .lo = 0, .hi = 1 << 30,
     .doc = "keep the newest N checkpoints (0: all)"},
    {.name = "init_from", .kind = K_PATH, .off = OFF(init_from), .def_text = "none",
     .doc = "start a fresh run from the weights of an HF or pith folder"},
    {.name = "on_nonfinite", .kind = K_CHOICE, .off = OFF(on_nonfinite), .choices = nonfinite_names,
     .doc = "a step whose loss or gradient norm is NaN/Inf: `fail` stops naming the step (nothing is saved after "
            "it); `skip` leaves the weights and moments as they were and goes on. An update that makes a weight or "
            "second moment NaN/Inf stops the run under either (nothing is saved after the step before)"},
    {.name = "nonfinite_skip_limit", .kind = K_INT, .off = OFF(nonfinite_skip_limit), .def = 10, .lo = 1, .hi = 1 << 30,
     .doc = "with `on_nonfinite: skip`: the most steps in a row that may be skipped; the next non-finite one stops "
            "the run naming the steps (a run that stays diverged never ends as a success)"},
};
// clang-format on

// clang-format off
static const ConfigKey optimizer_keys[] = {
    {.name = "type", .kind = K_CHOICE, .off = OFF(optimizer.type), .choices = optimizer_names,
     .doc = "`adamw`: torch.optim.AdamW's update, on all parameters. `muon`: PithTrain's Muon for every weight of 2 "
            "or more dimensions except the embedding, LM head and routers (Nesterov-style momentum, 5 Newton–Schulz "
            "iterations per matrix — each expert on its own — scaled by 0.2·√max(n, m), decoupled weight decay), "
            "AdamW with `betas`/`eps` and the same lr and `weight_decay` for the rest"},
    {.name = "lr", .kind = K_NUM, .off = OFF(optimizer.lr), .required = true, .lo = 0, .hi = INFINITY,
     .doc = "peak learning rate"},
    {.name = "betas", .kind = K_PAIR, .off = OFF(optimizer.betas), .lo = 0, .hi = 1, .def_text = "[0.9, 0.999]",
     .doc = "[beta1, beta2], each in [0, 1)"},
    {.name = "eps", .kind = K_NUM, .off = OFF(optimizer.eps), .def = 1e-8, .lo = 0, .lo_open = true, .hi = 1,
     .doc = "added to √v̂"},
    {.name = "weight_decay", .kind = K_NUM, .off = OFF(optimizer.weight_decay), .def = 0.1, .lo = 0, .hi = 1,
     .doc = "decoupled weight decay (`p -= lr·wd·p`)"},
    {.name = "momentum", .kind = K_NUM, .off = OFF(optimizer.momentum), .def = 0.95, .lo = 0, .hi = 1, .hi_open = true,
     .doc = "Muon's momentum β (muon)"},
    {.name = "offload", .kind = K_BOOL, .off = OFF(optimizer.offload),
     .doc = "AdamW's moments in host memory (pinned), streamed through the device in chunks by the step: the same "
            "update bit for bit, 8 bytes per parameter of this rank's shards off the GPU, 16 bytes per such "
            "parameter of host↔device traffic per step (adamw)"},
    {.name = "state_dtype", .kind = K_CHOICE, .off = OFF(optimizer.state_dtype), .choices = state_dtype_names,
     .doc = "AdamW's moments stored in `bf16`: masters stay fp32, the update computes in fp32 and rounds the new m "
            "and v to nearest even; 4 of the 8 bytes per parameter of this rank's shards saved; a resume converts "
            "the checkpoint's moments to this dtype (adamw; with `offload` too)"},
};
// clang-format on

// clang-format off
static const ConfigKey scheduler_keys[] = {
    {.name = "type", .kind = K_CHOICE, .off = OFF(scheduler.type), .choices = scheduler_names, .flags = KEY_SCHEDULE,
     .doc = "`wsd`: warmup, stable, decay; `cosine`: warmup, then decay over all the remaining steps (`wsd` with "
            "`decay_ratio = 1 − warmup_ratio`)"},
    {.name = "warmup_ratio", .kind = K_NUM, .off = OFF(scheduler.warmup_ratio), .lo = 0, .hi = 1, .flags = KEY_SCHEDULE,
     .doc = "linear warmup from `start_lr` over round(ratio·max_steps) steps (wsd, cosine)"},
    {.name = "decay_ratio", .kind = K_NUM, .off = OFF(scheduler.decay_ratio), .def = 0.1, .lo = 0, .hi = 1,
     .flags = KEY_SCHEDULE, .doc = "decay to `final_lr` over the last round(ratio·max_steps) steps (wsd)"},
    {.name = "start_lr", .kind = K_NUM, .off = OFF(scheduler.start_lr), .lo = 0, .hi = INFINITY, .flags = KEY_SCHEDULE,
     .doc = "learning rate at step 0 of the warmup (wsd, cosine)"},
    {.name = "final_lr", .kind = K_NUM, .off = OFF(scheduler.final_lr), .lo = 0, .hi = INFINITY, .flags = KEY_SCHEDULE,
     .doc = "learning rate at the end of the decay (wsd, cosine)"},
    {.name = "decay_shape", .kind = K_CHOICE, .off = OFF(scheduler.decay_shape), .choices = decay_names,
     .flags = KEY_SCHEDULE, .doc = "shape of the decay (wsd)"},
};
// clang-format on

// clang-format off
static const ConfigKey parallel_keys[] = {
    {.name = "expert_parallel_size", .kind = K_INT, .off = OFF(parallel.ep), .def = 1, .lo = 1, .hi = 1 << 20,
     .doc = "EP: rank *r* of an ep group holds experts `[r·E/ep, (r+1)·E/ep)`; divides `num_experts` and the ranks"},
    {.name = "sharding_strategy", .kind = K_CHOICE, .off = OFF(parallel.sharding), .choices = sharding_names,
     .doc = "`fsdp`: experts sharded over dp×cp, the rest over dp×cp×ep; `hsdp`: replicated over dp, sharded over cp "
            "(experts) and cp×ep (the rest)"},
    {.name = "gradient_reduce", .kind = K_CHOICE, .off = OFF(parallel.gradient_reduce), .choices = grad_reduce_names,
     .doc = "`step`: the dense parameters' fp32 gradient is one whole buffer, reduce-scattered once per step; "
            "`layer`: no whole buffer: the embedding's, each layer's and the final norm and LM head's gradients go to "
            "a window and, as that part's backward ends (every micro-batch), are reduced to the ranks whose shards "
            "hold them (docs/architecture.md, \"Gradient reduction per layer\"); needs sharding over more than one "
            "rank, pp = 1 without `pipeline_schedule`, adamw"},
    {.name = "ep_capacity_factor", .kind = K_NUM, .off = OFF(parallel.ep_capacity_factor), .def = 1.5, .lo = 0,
     .hi = 1e6,
     .doc = "rows a layer's stage-3 buffers hold on an ep rank = factor·T·k (T tokens of a micro-batch); 0 = the "
            "worst case T·k·ep. A layer that receives more runs stage 3 on one worst-case spill set and recomputes "
            "it in backward (exact; the step line's `ep-over`, `ep-load`). 1.5: balanced routing measured ≤ 1.48 "
            "(docs/architecture.md)"},
    {.name = "ep_drop_tokens", .kind = K_BOOL, .off = OFF(parallel.ep_drop_tokens),
     .doc = "drop the (token, expert) rows above the capacity instead (Switch/GShard; the largest experts lose rows "
            "first; their outputs are zero), counted per step (`ep-dropped`)"},
    {.name = "timeout_s", .kind = K_NUM, .off = OFF(parallel.timeout_s), .def = 900, .lo = 0, .lo_open = true,
     .hi = 1e7, .doc = "a collective not complete after this many seconds ends every rank with a message"},
    {.name = "pipeline_parallel_size", .kind = K_INT, .off = OFF(parallel.pp), .def = 1, .lo = 1, .hi = 1 << 20,
     .doc = "PP (DualPipeV): rank *r* holds chunks *r* and 2P−1−*r* of the layers cut into 2P; divides the ranks, 2P "
            "divides the layers, each pipeline runs ≥ 2P micro-batches per step"},
    {.name = "pipeline_schedule", .kind = K_BOOL, .off = OFF(parallel.pipeline_schedule),
     .doc = "at pp = 1 too, run the DualPipeV engine (the layers in two chunks on the one rank, ≥ 2 micro-batches "
            "per step) instead of the plain sequential step: the same losses and gradients, for measuring the "
            "engine's cost (bench/run_gpu.sh --schedule)"},
    {.name = "context_parallel_size", .kind = K_INT, .off = OFF(parallel.cp), .def = 1, .lo = 1, .hi = 1 << 20,
     .doc = "CP (zigzag ring attention): each sequence in 2·CP chunks, rank *r* holding chunks *r* and 2CP−1−*r*; "
            "divides the ranks, 2·CP divides `sequence_length`; not GPT-OSS; Qwen3.5-MoE's DeltaNet layers need "
            "`sequence_length` / CP ≥ `linear_conv_kernel_dim` − 1"},
};
// clang-format on

// An optional section: absent, there is no validation (batches = 0).
// clang-format off
static const ConfigKey validation_keys[] = {
    {.name = "dataset", .kind = K_PATH, .off = OFF(validation.dataset), .required = true,
     .doc = "validation token files; after every `interval`-th step and after the last, the mean token loss over the "
            "first `batches` global batches in file order — `val-loss` in the step line, `val_loss` in "
            "`metrics.jsonl`; the same under every layout and as `pith eval --batch batches·global_batch_size`"},
    {.name = "interval", .kind = K_INT, .off = OFF(validation.interval), .lo = 0, .hi = 1 << 30,
     .doc = "validate every N steps (0: after the last step only)"},
    {.name = "batches", .kind = K_INT, .off = OFF(validation.batches), .def = 1, .lo = 1, .hi = 1 << 30,
     .doc = "global batches of validation data"},
};
// clang-format on

// clang-format off
static const ConfigKey checkpoint_keys[] = {
    {.name = "async", .kind = K_BOOL, .off = OFF(checkpoint.async),
     .doc = "a save copies what this rank writes to host memory and writes it from a background thread while "
            "training goes on; the next save and the end of the run (`--steps`, a signal) wait for it; the same "
            "files, temporary name and rename; the loop's time in saves is `ckpt_s` in `metrics.jsonl`"},
};
// clang-format on

static const ConfigSection sections[] = {
    {"", top_keys, LEN(top_keys)},
    {"optimizer", optimizer_keys, LEN(optimizer_keys)},
    {"scheduler", scheduler_keys, LEN(scheduler_keys)},
    {"parallel", parallel_keys, LEN(parallel_keys)},
    {"validation", validation_keys, LEN(validation_keys)},
    {"checkpoint", checkpoint_keys, LEN(checkpoint_keys)},
};
enum { SECTION_VALIDATION = 4, SECTION_CHECKPOINT = 5 };

// PithTrain's names that pith spells differently (pith: the key here) or does not have yet (pith: NULL).
static const struct {
    const char *name, *pith;
} pithtrain_names[] = {
    {"lr", "optimizer.lr"},
    {"distributed", "parallel"},
    {"training", "the top level"},
    {"timeout", "parallel.timeout_s"},
    {"weight_decay", "optimizer.weight_decay"},
    {"warmup_ratio", "scheduler.warmup_ratio"},
    {"decay_ratio", "scheduler.decay_ratio"},
    {"pipeline_parallel_size", "parallel.pipeline_parallel_size"},
    {"context_parallel_size", "parallel.context_parallel_size"},
    {"expert_parallel_size", "parallel.expert_parallel_size"},
    {"sharding_strategy", "parallel.sharding_strategy"},
    {"nsys_start", NULL},
    {"nsys_stop", NULL},
    {"memory_profile_start", NULL},
    {"memory_profile_stop", NULL},
    {"memory_profile_output", NULL},
    {"logging", NULL},
    {"wandb", NULL},
};

// ---- reading ----

typedef struct {
    char **sets; // the --set overrides, for naming the command line in errors
    int nsets;
} Origin;

// Applies one "a.b.c=value" override; value is JSON when it parses as JSON, else a string.
static void apply_set(json_t *root, const char *set) {
    const char *eq = strchr(set, '=');
    if (!eq || eq == set) die("--set %s: expected key=value", set);
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - set), set);
    json_t *val = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!val) val = json_string(eq + 1);
    json_t *obj = root;
    if (key[0] == '.' || key[strlen(key) - 1] == '.' || strstr(key, ".."))
        die("--set %s: the key '%s' has an empty part (keys are names joined by single dots: optimizer.lr)", set, key);
    char *save, *part = strtok_r(key, ".", &save), *next;
    if (!part) die("--set %s: expected key=value", set);
    while ((next = strtok_r(NULL, ".", &save))) {
        json_t *child = json_object_get(obj, part);
        if (!child || json_is_null(child)) json_object_set_new(obj, part, child = json_object());
        if (!json_is_object(child))
            die("--set %s: '%s' is a value, not a section, so it has no keys%s", set, part,
                !strcmp(part, "model") ? " (model is the path of the model's config.json: change the key in that file, "
                                         "or in a copy that model names)"
                                       : "");
        obj = child, part = next;
    }
    json_object_set_new(obj, part, val);
}

// o itself, or o naming the command line when key (inside o's section) came from --set.
static JObj origin_of(JObj o, const Origin *org, const char *key) {
    char dotted[256];
    snprintf(dotted, sizeof dotted, "%s%s%s", o.path, o.path[0] ? "." : "", key);
    size_t n = strlen(dotted);
    for (int i = 0; i < org->nsets; i++)
        if (!strncmp(org->sets[i], dotted, n) && (org->sets[i][n] == '=' || org->sets[i][n] == '.')) o.file = "--set";
    return o;
}

static void range_text(char *out, size_t cap, const ConfigKey *k) {
    if (k->kind == K_PAIR || k->hi_open) snprintf(out, cap, "[%g, %g)", k->lo, k->hi);
    else if (isinf(k->hi)) snprintf(out, cap, "%s %g", k->lo_open ? ">" : "≥", k->lo);
    else snprintf(out, cap, "%s%.10g, %.10g]", k->lo_open ? "(" : "[", k->lo, k->hi);
}

static bool in_range(const ConfigKey *k, double v) {
    if (!isfinite(v) || v < k->lo || (k->lo_open && v == k->lo)) return false;
    return k->kind == K_PAIR || k->hi_open ? v < k->hi : v <= k->hi;
}

static void check_range(JObj o, const ConfigKey *k, double v) {
    char r[64];
    range_text(r, sizeof r, k);
    if (!in_range(k, v)) jdie(o, k->name, "must be in %s (got %.10g)", r, v);
}

// `dataset`: a path (one source of weight 1), or a list of {"path": ..., "weight": ...} (a mixture).
static void read_sources(TrainConfig *c, JObj o, const char *key) {
    json_t *v = o.obj ? json_object_get(o.obj, key) : NULL, *x;
    char at[64];
    const char *name;
    c->ndataset = 0, c->mixture = false;
    if (!v || json_is_null(v) || (json_is_string(v) && !json_string_value(v)[0])) return;
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) >= PATH_MAX_LEN) jdie(o, key, "too long");
        snprintf(c->dataset[0].path, PATH_MAX_LEN, "%s", json_string_value(v));
        c->dataset[0].weight = 1, c->ndataset = 1;
        return;
    }
    if (!json_is_array(v)) jdie(o, key, "expected a path or a list of {\"path\": ..., \"weight\": ...}");
    int n = (int)json_array_size(v);
    if (!n) jdie(o, key, "an empty list (a mixture names at least one {\"path\": ..., \"weight\": ...})");
    if (n > DATA_MAX_SOURCES) jdie(o, key, "%d sources, at most %d", n, DATA_MAX_SOURCES);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i), *p = json_object_get(e, "path"), *w = json_object_get(e, "weight");
        snprintf(at, sizeof at, "%s[%d]", key, i);
        if (!json_is_object(e)) jdie(o, at, "expected {\"path\": ..., \"weight\": ...}");
        json_object_foreach(e, name, x) if (strcmp(name, "path") && strcmp(name, "weight"))
            jdie(o, at, "%s: unknown key (a source has a path and a weight)", name);
        snprintf(at, sizeof at, "%s[%d].path", key, i);
        if (!json_is_string(p) || !json_string_value(p)[0])
            jdie(o, at, "missing (a folder or file of .bin token files)");
        if (strlen(json_string_value(p)) >= PATH_MAX_LEN) jdie(o, at, "too long");
        snprintf(at, sizeof at, "%s[%d].weight", key, i);
        if (!json_is_number(w)) jdie(o, at, "%s (a number > 0)", w ? "not a number" : "missing");
        if (!(json_number_value(w) > 0) || !isfinite(json_number_value(w)))
            jdie(o, at, "must be > 0 (got %g)", json_number_value(w));
        snprintf(c->dataset[i].path, PATH_MAX_LEN, "%s", json_string_value(p));
        c->dataset[i].weight = json_number_value(w);
    }
    c->ndataset = n, c->mixture = true;
}

// Reads one key of section sec (a required key of an optional section is required when the section is there).
static void read_key(TrainConfig *c, JObj sec, bool optional, const Origin *org, const ConfigKey *k) {
    JObj o = origin_of(sec, org, k->name);
    char *field = (char *)c + k->off;
    if (k->required && (sec.obj || !optional) && !jhas(o, k->name)) jdie(o, k->name, "missing required key");
    switch (k->kind) {
    case K_PATH: {
        const char *s = jstr(o, k->name, false, "");
        if (strlen(s) >= PATH_MAX_LEN) jdie(o, k->name, "too long");
        snprintf(field, PATH_MAX_LEN, "%s", s);
        break;
    }
    case K_DATA: read_sources(c, o, k->name); break;
    case K_INT: { // read as int64 (an integer or an integral real), range-checked before it becomes an int
        int64_t v = jint(o, k->name, false, (int64_t)k->def);
        check_range(o, k, (double)v);
        *(int *)field = (int)v;
        break;
    }
    case K_SEED: {
        int64_t v = jint(o, k->name, false, (int64_t)k->def);
        if (v < 0) jdie(o, k->name, "must be a non-negative integer (got %lld)", (long long)v);
        *(uint64_t *)field = (uint64_t)v;
        break;
    }
    case K_NUM: {
        double v = jnum(o, k->name, false, k->def);
        check_range(o, k, v);
        *(double *)field = v;
        break;
    }
    case K_BOOL: *(bool *)field = jbool(o, k->name, false, k->def != 0); break;
    case K_CHOICE: {
        const char *s = jstr(o, k->name, false, k->choices[0]);
        int i = 0;
        while (k->choices[i] && strcmp(k->choices[i], s)) i++;
        if (!k->choices[i]) {
            char list[256] = "";
            for (int j = 0; k->choices[j]; j++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", j ? ", " : "", k->choices[j]);
            jdie(o, k->name, "'%s' is not supported (supported: %s)", s, list);
        }
        *(int *)field = i;
        break;
    }
    case K_PARTS: { // a list of part names, joined here by commas
        json_t *v = o.obj ? json_object_get(o.obj, k->name) : NULL, *e;
        Str b = {0};
        size_t i;
        if (json_is_array(v)) json_array_foreach(v, i, e) str_printf(&b, "%s%s", i ? "," : "", json_string_value(e));
        const char *s = b.p ? b.p : jstr(o, k->name, false, "none");
        if ((*(int *)field = config_recompute_parse(s)) < 0)
            jdie(o, k->name,
                 "'%s' is not supported (none, selective, full, or parts of norm, rope, swiglu, router, "
                 "expert_out, gate_up)",
                 s);
        free(b.p);
        break;
    }
    case K_PAIR: {
        double *p = (double *)field;
        p[0] = 0.9, p[1] = 0.999; // torch's AdamW betas, the one pair-valued key
        json_t *v = o.obj ? json_object_get(o.obj, k->name) : NULL;
        if (!v || json_is_null(v)) break;
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(json_array_get(v, 0)) ||
            !json_is_number(json_array_get(v, 1)))
            jdie(o, k->name, "expected [beta1, beta2]");
        for (int i = 0; i < 2; i++) p[i] = json_number_value(json_array_get(v, i));
        if (!in_range(k, p[0]) || !in_range(k, p[1])) jdie(o, k->name, "each beta must be in [0, 1)");
        break;
    }
    }
}

// Dies naming the first key of the section that is not in its table (with PithTrain's name as a hint).
static void check_known(JObj o, const Origin *org, const ConfigSection *s, bool top) {
    if (!o.obj) return;
    const char *key;
    json_t *v;
    json_object_foreach(o.obj, key, v) {
        bool ok = false;
        for (int i = 0; i < s->n && !ok; i++) ok = !strcmp(s->keys[i].name, key);
        for (int i = 1; top && i < LEN(sections) && !ok; i++) ok = !strcmp(sections[i].name, key);
        if (ok) continue;
        for (int i = 0; i < LEN(pithtrain_names); i++)
            if (!strcmp(pithtrain_names[i].name, key)) {
                if (!pithtrain_names[i].pith)
                    jdie(origin_of(o, org, key), key, "PithTrain's %s is not supported yet", key);
                jdie(origin_of(o, org, key), key, "unknown key (renamed: PithTrain's %s is %s here)", key,
                     pithtrain_names[i].pith);
            }
        const char *names[128], *near;
        int n = 0;
        for (int i = 0; i < s->n && n < 128; i++) names[n++] = s->keys[i].name;
        for (int i = 1; top && i < LEN(sections) && n < 128; i++) names[n++] = sections[i].name;
        near = !strcmp(s->name, "optimizer") && !strcmp(key, "learning_rate")
                   ? "lr"
                   : closest_name(key, names, n); // (a common name, not a slip)
        if (near)
            jdie(origin_of(o, org, key), key, "unknown key (did you mean %s%s%s?)", s->name, top ? "" : ".", near);
        jdie(origin_of(o, org, key), key, "unknown key");
    }
}

// Key `name` of section o (rows keys[0..n)) is given with a value other than its default. A key whose effect
// depends on another is an error only then, so the effective config (--print-config) reads back.
static bool set_apart(JObj o, const TrainConfig *c, const char *name, const ConfigKey *keys, int n) {
    int i = 0;
    while (i < n && strcmp(keys[i].name, name)) i++;
    CHECK(i < n);
    const char *field = (const char *)c + keys[i].off;
    if (!jhas(o, name)) return false;
    if (keys[i].kind == K_CHOICE || keys[i].kind == K_PARTS) return *(const int *)field != 0;
    if (keys[i].kind == K_INT) return *(const int *)field != (int)keys[i].def;
    if (keys[i].kind == K_NUM) return *(const double *)field != keys[i].def;
    return true;
}

// The relative paths of key k of obj (a path, or each source's path of a dataset list) joined to dir and normalised;
// with all, the absolute ones normalised too.
static void resolve_paths(json_t *obj, const ConfigKey *k, const char *dir, bool all) {
    char buf[2 * PATH_MAX_LEN + 2];
    json_t *v = json_object_get(obj, k->name), *e;
    size_t i;
    if (k->kind == K_DATA && json_is_array(v))
        json_array_foreach(v, i, e) if (json_is_object(e))
            resolve_paths(e, &(ConfigKey){.name = "path", .kind = K_PATH}, dir, all);
    if (k->kind != K_PATH && k->kind != K_DATA) return;
    if (!json_is_string(v) || !json_string_value(v)[0] || (!all && json_string_value(v)[0] == '/')) return;
    path_join(buf, sizeof buf, dir, json_string_value(v));
    path_normalize(buf);
    json_object_set_new(obj, k->name, json_string(buf));
}

void config_load(TrainConfig *c, const char *file, char **sets, int nsets) {
    memset(c, 0, sizeof *c);
    snprintf(c->file, sizeof c->file, "%s", file);
    json_t *root = json_load_or_die(file);
    JObj o = jobj_root(root, file);
    // Paths written in the file are relative to the file's folder: resolve them before any override.
    char dir[PATH_MAX_LEN];
    path_dirname(dir, sizeof dir, file);
    for (int s = 0; s < LEN(sections); s++) {
        json_t *obj = s ? json_object_get(root, sections[s].name) : root;
        for (int i = 0; json_is_object(obj) && i < sections[s].n; i++)
            resolve_paths(obj, &sections[s].keys[i], dir, true);
    }
    for (int i = 0; i < nsets; i++) apply_set(root, sets[i]);
    Origin org = {sets, nsets};
    JObj sec[LEN(sections)];
    for (int s = 0; s < LEN(sections); s++) {
        sec[s] = s ? jobj_child(o, sections[s].name) : o;
        check_known(sec[s], &org, &sections[s], s == 0);
        // the keys given first (a bad value is named before a missing key of its section), then the rest
        for (int given = 1; given >= 0; given--)
            for (int i = 0; i < sections[s].n; i++)
                if (jhas(sec[s], sections[s].keys[i].name) == given)
                    read_key(c, sec[s], s == SECTION_VALIDATION, &org, &sections[s].keys[i]);
    }
    JObj top = sec[0], sch = sec[2];
    if (!sec[SECTION_VALIDATION].obj) c->validation.batches = 0;

    // Combinations.
    if ((int64_t)c->micro_batch_size * c->sequence_length > INT_MAX)
        jdie(origin_of(top, &org, "micro_batch_size"), "micro_batch_size",
             "micro_batch_size × sequence_length = %lld tokens is more than one micro-batch can hold (2^31 − 1)",
             (long long)c->micro_batch_size * c->sequence_length);
    if (c->sequence_length % (2 * c->parallel.cp)) // the zigzag layout: 2·cp chunks of equal length
        jdie(origin_of(sec[3], &org, "context_parallel_size"), "context_parallel_size",
             "sequence_length %d is not a multiple of 2 × context_parallel_size = %d (the zigzag layout cuts each "
             "sequence into 2·cp chunks)",
             c->sequence_length, 2 * c->parallel.cp);
    if (c->global_batch_size % c->micro_batch_size)
        jdie(origin_of(top, &org, "global_batch_size"), "global_batch_size",
             "must be a multiple of micro_batch_size (got %d and %d)", c->global_batch_size, c->micro_batch_size);
    if (c->on_nonfinite == NONFINITE_FAIL && set_apart(top, c, "nonfinite_skip_limit", top_keys, LEN(top_keys)))
        jdie(origin_of(top, &org, "nonfinite_skip_limit"), "nonfinite_skip_limit",
             "has no effect with on_nonfinite \"fail\" (set on_nonfinite to \"skip\")");
    if (c->optimizer.type == OPTIMIZER_ADAMW && set_apart(sec[1], c, "momentum", optimizer_keys, LEN(optimizer_keys)))
        jdie(origin_of(sec[1], &org, "momentum"), "momentum",
             "has no effect with optimizer.type \"adamw\" (it is Muon's; AdamW's are betas)");
    const char *adamw_only[] = {"offload", "state_dtype", "gradient_dtype"}; // Muon refuses them
    bool set[] = {c->optimizer.offload, c->optimizer.state_dtype, c->gradient_dtype};
    for (int i = 0; i < 3 && c->optimizer.type == OPTIMIZER_MUON; i++)
        if (set[i])
            jdie(origin_of(i < 2 ? sec[1] : top, &org, adamw_only[i]), adamw_only[i],
                 "is AdamW's (Muon orthogonalises whole fp32 matrices of its momentum, on the device)");
    if (c->parallel.gradient_reduce == GRAD_REDUCE_LAYER) { // DualPipeV defers weight gradients; Muon needs matrices
        const char *why = c->parallel.pp > 1                    ? "pipeline_parallel_size 1 (DualPipeV defers weights)"
                          : c->parallel.pipeline_schedule       ? "pipeline_schedule false (DualPipeV defers weights)"
                          : c->optimizer.type == OPTIMIZER_MUON ? "optimizer.type \"adamw\" (Muon needs whole matrices)"
                                                                : NULL;
        if (why) jdie(origin_of(sec[3], &org, "gradient_reduce"), "gradient_reduce", "\"layer\" needs %s", why);
    }
    if (c->cuda_graph) { // what waits for the host, or for other ranks, inside the layers cannot be recorded
        const char *why = c->parallel.pp > 1              ? "pipeline_parallel_size > 1"
                          : c->parallel.ep > 1            ? "expert_parallel_size > 1"
                          : c->parallel.cp > 1            ? "context_parallel_size > 1"
                          : c->parallel.pipeline_schedule ? "pipeline_schedule"
                          : c->moe_load_balance_coef > 0 && c->moe_load_balance_type == LB_GLOBAL_BATCH
                              ? "moe_load_balance_type \"global-batch\" (its counts go through the host)"
                              : NULL; // the CPU (device "cpu", or "auto" without a GPU): run_setup says so
        if (why) jdie(origin_of(top, &org, "cuda_graph"), "cuda_graph", "cannot be used with %s", why);
    }
    if (c->benchmark && c->moe_router_bias_update_rate > 0)
        jdie(origin_of(top, &org, "moe_router_bias_update_rate"), "moe_router_bias_update_rate",
             "has no effect with benchmark = true (the routing is forced, the bias would select nothing)");
    if (c->moe_load_balance_coef == 0 && set_apart(top, c, "moe_load_balance_type", top_keys, LEN(top_keys)))
        jdie(origin_of(top, &org, "moe_load_balance_type"), "moe_load_balance_type",
             "has no effect with moe_load_balance_coef 0 (set the coefficient, or leave the type out)");
    if (c->save_interval && !c->save_location[0])
        jdie(origin_of(top, &org, "save_interval"), "save_interval", "needs save_location");
    if (c->checkpoint.async && !c->save_location[0])
        jdie(origin_of(sec[SECTION_CHECKPOINT], &org, "async"), "async", "needs save_location");
    if (c->scheduler.type == SCHED_CONSTANT) { // a schedule key on a constant schedule would be silently ignored
        for (int i = 1; i < LEN(scheduler_keys); i++)
            if (set_apart(sch, c, scheduler_keys[i].name, scheduler_keys, LEN(scheduler_keys)))
                jdie(origin_of(sch, &org, scheduler_keys[i].name), scheduler_keys[i].name,
                     "has no effect on a \"constant\" schedule (set scheduler.type to \"wsd\" or \"cosine\")");
    } else if (c->scheduler.type == SCHED_COSINE) { // decay_ratio and decay_shape follow; the values they take pass
        bool ratio = jhas(sch, "decay_ratio") && c->scheduler.decay_ratio != 1 - c->scheduler.warmup_ratio;
        if (ratio || (jhas(sch, "decay_shape") && c->scheduler.decay_shape != DECAY_COSINE))
            jdie(origin_of(sch, &org, ratio ? "decay_ratio" : "decay_shape"), ratio ? "decay_ratio" : "decay_shape",
                 "a \"cosine\" schedule decays (cosine) over every step after the warmup; use \"wsd\" to choose");
        c->scheduler.decay_ratio = 1 - c->scheduler.warmup_ratio, c->scheduler.decay_shape = DECAY_COSINE;
    } else if (c->scheduler.warmup_ratio + c->scheduler.decay_ratio > 1)
        jdie(origin_of(sch, &org, "warmup_ratio"), "warmup_ratio",
             "warmup_ratio + decay_ratio must be at most 1 (got %g + %g)", c->scheduler.warmup_ratio,
             c->scheduler.decay_ratio);

    if (c->scheduler.type != SCHED_CONSTANT)
        for (int i = 0; i < 2; i++) { // a warmup rises to lr and a decay falls from it
            const char *name = i ? "final_lr" : "start_lr";
            double v = i ? c->scheduler.final_lr : c->scheduler.start_lr;
            if (v > c->optimizer.lr)
                jdie(origin_of(sch, &org, name), name, "%g is above optimizer.lr = %g (the schedule's peak)", v,
                     c->optimizer.lr);
        }

    if (!jhas(top, "run_dir")) {
        if (c->save_location[0]) snprintf(c->run_dir, sizeof c->run_dir, "%s", c->save_location);
        else { // runs/<config folder>-<config name>, e.g. runs/tiny-train for examples/tiny/train.json
            const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
            char real[PATH_MAX]; // the folder's own name also for "." and ".." (not runs/.-train, a hidden name)
            const char *folder = realpath(dir, real) ? real : dir;
            const char *parent = strrchr(folder, '/') && strrchr(folder, '/')[1] ? strrchr(folder, '/') + 1 : folder;
            snprintf(c->run_dir, sizeof c->run_dir, "runs/%.200s-%.*s", parent, (int)(strcspn(base, ".") % 200), base);
        }
    }
    c->json = root;
}

// ---- the effective config ----

static json_t *key_value(const TrainConfig *c, const ConfigKey *k) {
    const char *field = (const char *)c + k->off;
    switch (k->kind) {
    case K_PATH: return field[0] ? json_string(field) : json_null();
    case K_DATA: {
        if (!c->mixture) return c->ndataset ? json_string(c->dataset[0].path) : json_null();
        json_t *list = json_array();
        for (int i = 0; i < c->ndataset; i++)
            json_array_append_new(list,
                                  json_pack("{s:s, s:f}", "path", c->dataset[i].path, "weight", c->dataset[i].weight));
        return list;
    }
    case K_INT: return json_integer(*(const int *)field);
    case K_SEED: return json_integer((json_int_t) * (const uint64_t *)field);
    case K_NUM: return json_real(*(const double *)field);
    case K_BOOL: return json_boolean(*(const bool *)field);
    case K_CHOICE: return json_string(k->choices[*(const int *)field]);
    case K_PAIR: return json_pack("[f, f]", ((const double *)field)[0], ((const double *)field)[1]);
    case K_PARTS: return json_string(config_recompute_name(*(const int *)field, (char[64]){0}, 64));
    }
    return json_null();
}

json_t *config_effective(const TrainConfig *c) {
    json_t *root = json_object();
    for (int s = 0; s < LEN(sections); s++) {
        if (s == SECTION_VALIDATION && !c->validation.batches) continue; // absent: no validation
        json_t *obj = s ? json_object() : root;
        for (int i = 0; i < sections[s].n; i++)
            json_object_set_new(obj, sections[s].keys[i].name, key_value(c, &sections[s].keys[i]));
        if (s) json_object_set_new(root, sections[s].name, obj);
    }
    return root;
}

json_t *config_printable(const TrainConfig *c) {
    json_t *root = config_effective(c);
    char cwd[PATH_MAX_LEN];
    if (!getcwd(cwd, sizeof cwd)) die("--print-config: cannot read the current folder: %s", strerror(errno));
    for (int s = 0; s < LEN(sections); s++) {
        json_t *obj = s ? json_object_get(root, sections[s].name) : root;
        for (int i = 0; obj && i < sections[s].n; i++) resolve_paths(obj, &sections[s].keys[i], cwd, false);
    }
    return root;
}

// Two values of a key are the same: equal JSON, or paths naming the same existing file (in a dataset list, each
// source's path so, and its weight equal).
static bool same_value(const ConfigKey *k, const json_t *a, const json_t *b) {
    if (json_equal((json_t *)a, (json_t *)b)) return true;
    if (k->kind == K_NUM && json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    if (k->kind == K_DATA && json_is_array(a) && json_is_array(b) && json_array_size(a) == json_array_size(b)) {
        static const ConfigKey path = {.name = "path", .kind = K_PATH}, weight = {.name = "weight", .kind = K_NUM};
        bool same = true;
        for (size_t i = 0; same && i < json_array_size(a); i++) {
            const json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
            same = same_value(&path, json_object_get(x, "path"), json_object_get(y, "path")) &&
                   same_value(&weight, json_object_get(x, "weight"), json_object_get(y, "weight"));
        }
        return same;
    }
    if ((k->kind != K_PATH && k->kind != K_DATA) || !json_is_string(a) || !json_is_string(b)) return false;
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(json_string_value(a), ra) && realpath(json_string_value(b), rb) && !strcmp(ra, rb);
}

void config_check_resume(const TrainConfig *c, const json_t *saved, const char *where, bool allow) {
    if (!json_is_object(saved)) return;
    json_t *now = config_effective(c);
    const json_t *old_sch = json_object_get(saved, "scheduler");
    const json_t *old_type = old_sch ? json_object_get(old_sch, "type") : NULL;
    bool constant = c->scheduler.type == SCHED_CONSTANT && old_type && json_is_string(old_type) &&
                    !strcmp(json_string_value(old_type), "constant");
    const ConfigKey *refused = NULL;
    for (int s = 0; s < LEN(sections); s++) {
        const json_t *so = s ? json_object_get(saved, sections[s].name) : saved;
        const json_t *no = s ? json_object_get(now, sections[s].name) : now;
        for (int i = 0; so && i < sections[s].n; i++) {
            const ConfigKey *k = &sections[s].keys[i];
            const json_t *a = json_object_get(so, k->name), *b = json_object_get(no, k->name);
            if (!a || same_value(k, a, b)) continue; // a key the checkpoint does not record is not compared
            char *ta = json_text(a, 0, false), *tb = json_text(b, 0, false); // reals short, as run.json has them
            printf("resume: %s%s%s changed: %s -> %s (%s)\n", sections[s].name, s ? "." : "", k->name, ta, tb, where);
            free(ta), free(tb);
            if (!refused && ((k->flags & KEY_DATA_ORDER) || ((k->flags & KEY_SCHEDULE) && !constant))) refused = k;
        }
    }
    json_decref(now);
    if (refused && !allow)
        die("%s: resuming with %s changed would change the %s of the run; pass --allow-config-change to accept it",
            where, refused->name, refused->flags & KEY_DATA_ORDER ? "data order" : "learning-rate schedule");
}

// ---- docs/usage.md's tables ----

char *config_markdown(void) {
    Str b = {0};
    char r[64];
    str_printf(&b, "| key | default | values | meaning |\n|---|---|---|---|\n");
    for (int s = 0; s < LEN(sections); s++)
        for (int i = 0; i < sections[s].n; i++) {
            const ConfigKey *k = &sections[s].keys[i];
            str_printf(&b, "| `%s%s%s` | ", sections[s].name, s ? "." : "", k->name);
            if (k->required) str_printf(&b, "required");
            else if (k->def_text) str_printf(&b, "%s", k->def_text);
            else if (k->kind == K_CHOICE) str_printf(&b, "`%s`", k->choices[0]);
            else if (k->kind == K_BOOL) str_printf(&b, "%s", k->def ? "true" : "false");
            else str_printf(&b, "%g", k->def);
            str_printf(&b, " | ");
            if (k->kind == K_PATH) str_printf(&b, "path");
            else if (k->kind == K_DATA) str_printf(&b, "path, or a list of `{\"path\", \"weight\"}`");
            else if (k->kind == K_BOOL) str_printf(&b, "true, false");
            else if (k->kind == K_SEED) str_printf(&b, "≥ 0");
            else if (k->kind == K_PARTS) str_printf(&b, "`none`, `selective`, `full`, parts");
            else if (k->kind == K_CHOICE)
                for (int j = 0; k->choices[j]; j++) str_printf(&b, "%s`%s`", j ? ", " : "", k->choices[j]);
            else range_text(r, sizeof r, k), str_printf(&b, "%s%s", k->kind == K_INT ? "integer " : "", r);
            str_printf(&b, " | %s |\n", k->doc);
        }
    str_printf(&b, "\n| PithTrain | pith |\n|---|---|\n");
    for (int i = 0; i < LEN(pithtrain_names); i++) {
        const char *p = pithtrain_names[i].pith;
        if (!p) str_printf(&b, "| `%s` | not supported yet |\n", pithtrain_names[i].name);
        else if (strchr(p, ' ')) str_printf(&b, "| `%s` | %s |\n", pithtrain_names[i].name, p);
        else str_printf(&b, "| `%s` | `%s` |\n", pithtrain_names[i].name, p);
    }
    return b.p;
}

const char *config_optimizer_name(OptimizerType t) { return optimizer_names[t]; }

int config_recompute_parse(const char *s) {
    static const char *const preset[] = {"none", "selective", "full"};
    static const int bits[] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, preset[i])) return bits[i];
    for (int mask = 0;; s++) {
        int i = 0, n = (int)strcspn(s, ",");
        while (i < RC_PARTS && (strncmp(s, recompute_parts[i], n) || recompute_parts[i][n])) i++;
        if (i == RC_PARTS || mask & 1 << i) return -1;
        mask |= 1 << i, s += n;
        if (!*s) return mask;
    }
}

const char *config_recompute_name(int mask, char *buf, size_t cap) {
    if (mask == RECOMPUTE_NONE || mask == RECOMPUTE_SELECTIVE || mask == RECOMPUTE_FULL)
        return mask == RECOMPUTE_NONE ? "none" : mask == RECOMPUTE_FULL ? "full" : "selective";
    buf[0] = 0;
    for (int i = 0; i < RC_PARTS; i++)
        if (mask & 1 << i)
            snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", buf[0] ? "," : "", recompute_parts[i]);
    return buf;
}

// ---- the learning-rate schedule ----

double config_lr_factor(const TrainConfig *c, int s) {
    if (c->scheduler.type == SCHED_CONSTANT) return 1.0;
    double lr = c->optimizer.lr, sf = lr > 0 ? c->scheduler.start_lr / lr : 0,
           ff = lr > 0 ? c->scheduler.final_lr / lr : 0;
    int W = (int)nearbyint(c->scheduler.warmup_ratio * c->max_steps);
    int D =
        c->scheduler.type == SCHED_COSINE ? c->max_steps - W : (int)nearbyint(c->scheduler.decay_ratio * c->max_steps);
    int stable = c->max_steps - W - D;
    if (s < W) return sf + (1 - sf) * s / W;
    if (s < W + stable || D == 0) return 1.0;
    double t = (double)(s - W - stable) / D;
    if (t > 1) t = 1;
    if (c->scheduler.decay_shape == DECAY_COSINE) return ff + (1 - ff) * 0.5 * (1 + cos(M_PI * t));
    return 1 + (ff - 1) * t;
}
