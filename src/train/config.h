// config.h — the training config: a JSON file whose keys mirror PithTrain's TrainingCfg/DistributedCfg,
// with `--set a.b=value` overrides. One table per section (config.c) says each key's type, default,
// range and meaning; it drives parsing, the known keys, `pith train --print-config` and docs/usage.md's
// table (a test compares them). Choices are parsed into enums once. Unknown keys, wrong types, values
// out of range and impossible combinations stop with a one-line error naming the file (or --set) and key.
#pragma once
#include "base/json.h"
#include "model/model.h"

#define PATH_MAX_LEN 4096
#define DATA_MAX_SOURCES 16

// One source of the training data: a folder (or file) of .bin token files and its share of the samples.
typedef struct {
    char path[PATH_MAX_LEN];
    double weight; // > 0; source k's share is weight_k / Σ weights (a plain path: 1)
} DataSource;

// Choices, in the order of their names in config.c (the first is the default).
typedef enum { DEVICE_AUTO, DEVICE_CPU, DEVICE_CUDA } DeviceChoice;
typedef enum { COMPUTE_BF16, COMPUTE_FP32 } ComputeDtype;
// The dtype a model computes in on a device: bf16 only on the GPU (the CPU backend is the fp32 reference).
static inline DType compute_dt(Device dev, ComputeDtype c) {
    return dev == DEV_CUDA && c == COMPUTE_BF16 ? DT_BF16 : DT_F32;
}
typedef enum { OPTIMIZER_ADAMW, OPTIMIZER_MUON } OptimizerType;
typedef enum { STATE_FP32, STATE_BF16 } StateDtype; // AdamW's moments, the expert gradients in storage
typedef enum { SCHED_CONSTANT, SCHED_WSD, SCHED_COSINE } SchedulerType;
typedef enum { DECAY_COSINE, DECAY_LINEAR } DecayShape;
typedef enum { SHARD_FSDP, SHARD_HSDP } Sharding;
typedef enum { GRAD_REDUCE_STEP, GRAD_REDUCE_LAYER } GradReduce;
typedef enum { NONFINITE_FAIL, NONFINITE_SKIP } NonfinitePolicy;

typedef struct {
    char file[PATH_MAX_LEN];              // the config file itself
    char model[PATH_MAX_LEN];             // HF config.json or a folder holding one
    DataSource dataset[DATA_MAX_SOURCES]; // `dataset`: one path, or the sources of a weighted mixture
    int ndataset;                         // 0: none given
    bool mixture;                         // dataset given as a list of {path, weight} (data.h: how it samples)
    char run_dir[PATH_MAX_LEN];           // metrics.jsonl goes here (default: save_location, else runs/<config name>)
    char save_location[PATH_MAX_LEN];     // checkpoints (empty: none)
    char init_from[PATH_MAX_LEN];         // start from these weights (empty: random init)
    int sequence_length, micro_batch_size, global_batch_size, max_steps;
    uint64_t seed;
    double init_std;
    struct {
        OptimizerType type; // Muon for 2-D+ weights with AdamW (betas, eps) for the rest, or AdamW for all
        double lr, betas[2], eps, weight_decay;
        double momentum;        // Muon's β (default 0.95)
        bool offload;           // AdamW's moments in host memory, streamed through the device by the step
        StateDtype state_dtype; // AdamW's moments stored in fp32 or bf16 (the update computes in fp32)
    } optimizer;
    struct {
        SchedulerType type;
        DecayShape decay_shape;
        double warmup_ratio, decay_ratio, start_lr, final_lr;
    } scheduler;
    double clip_grad_norm; // max global grad norm (0: no clipping)
    double moe_load_balance_coef;
    double moe_router_bias_update_rate; // aux-loss-free balancing: per-step bias step (0: off)
    LbForm moe_load_balance_type;
    int save_interval, keep_last;
    NonfinitePolicy on_nonfinite; // a step whose loss or gradient norm is NaN/Inf: stop (fail) or skip it
    int nonfinite_skip_limit;     // skip: the most consecutive skipped steps; one more stops the run
    struct {
        int pp, cp, ep; // pipeline, context, expert parallel sizes; dp = ranks / (pp·cp·ep)
        Sharding sharding;
        GradReduce gradient_reduce; // the dense gradient reduced once per step, or per layer as its backward ends
        double timeout_s;           // a collective not complete after this long ends the job (default 900)
        double ep_capacity_factor;  // a layer's own stage-3 rows = factor·T·k (0: the worst case); more spill
        bool ep_drop_tokens;        // rows above the capacity are dropped instead of spilled
        bool pipeline_schedule;     // pp = 1 runs through the DualPipeV engine too (two chunks on one rank)
    } parallel;
    struct {
        char dataset[PATH_MAX_LEN]; // token files of the validation data
        int interval, batches;      // every `interval` steps (0: only at the end), the first `batches` global batches
    } validation;                   // batches == 0: no validation (the section is absent)
    struct {
        bool async; // a save snapshots the state and writes it from a background thread while training goes on
    } checkpoint;
    DeviceChoice device;
    ComputeDtype compute_dtype; // GPU only; the CPU computes in fp32
    StateDtype gradient_dtype;  // the expert gradient accumulators in fp32 or bf16 (sums in fp32, one rounding)
    bool fp8;                   // the MLP GEMMs on E4M3-rounded operands (docs/architecture.md, "FP8")
    RecomputeMode recompute;    // activation recomputation (docs/architecture.md, "Activation recomputation")
    bool benchmark;             // force-balanced routing
    bool deterministic;         // GPU: pith's own attention kernels (bit-reproducible runs)
    bool cuda_graph;            // GPU: each micro-batch's forward and backward as one CUDA graph launch
    int logits_chunk_mb;        // the epilog's logits chunk budget (0: the device's default, moe_epilog_alloc)
    bool document_masking;      // attention and positions bounded by the token files' document ends
    bool delta_rule_keep;     // Qwen3.5: the delta rule's chunk state kept from forward to backward (Model.delta_keep)
    bool tensorboard;         // rank 0 writes TensorBoard event files into run_dir (default true)
    json_t *json;             // the config as read (after overrides)
    bool allow_config_change; // pith train --allow-config-change: resume even when data-order keys changed
} TrainConfig;

// Loads `file`, applies the `--set key=value` overrides (sets[0..nsets)), validates and fills c.
void config_load(TrainConfig *c, const char *file, char **sets, int nsets);
// The effective config: every key of the tables with its value (defaults filled in). Caller decrefs.
json_t *config_effective(const TrainConfig *c);
// config_effective with every relative path made absolute: what --print-config prints, a config that reads back to
// the same values from any folder.
json_t *config_printable(const TrainConfig *c);
// Compares a checkpoint's effective config (run.json "train_config", from `where`) with c: prints each
// difference on stdout and dies if one of them changes the data order or the learning-rate schedule,
// unless allow is set.
void config_check_resume(const TrainConfig *c, const json_t *saved, const char *where, bool allow);
// docs/usage.md's tables, generated from the key tables: training keys, then PithTrain's names. Caller frees.
char *config_markdown(void);
const char *config_optimizer_name(OptimizerType t); // "adamw", "muon"
// `recompute`'s value: none, selective, full, or part names joined by commas → RC_* bits (−1: not one); and back
// (the preset's name where the bits are one, else the parts, in buf).
int config_recompute_parse(const char *s);
const char *config_recompute_name(int mask, char *buf, size_t cap);
// λ(s): the learning-rate multiplier of 0-based step s; lr of that step = optimizer.lr · λ(s).
double config_lr_factor(const TrainConfig *c, int s);
