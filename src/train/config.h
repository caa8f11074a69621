// config.h — the training config: a JSON file whose keys mirror PithTrain's TrainingCfg/DistributedCfg
// (spec §6.1), with `--set a.b=value` overrides. Unknown keys, wrong types and impossible combinations
// stop with a one-line error naming the file and key.
#pragma once
#include "base/json.h"

#define PATH_MAX_LEN 4096

typedef struct {
    char file[PATH_MAX_LEN];          // the config file itself
    char model[PATH_MAX_LEN];         // HF config.json or a folder holding one
    char dataset[PATH_MAX_LEN];       // folder (or file) of .bin token files
    char run_dir[PATH_MAX_LEN];       // metrics.jsonl goes here (default: save_location, else runs/<config name>)
    char save_location[PATH_MAX_LEN]; // checkpoints (empty: none)
    char init_from[PATH_MAX_LEN];     // start from these weights (empty: random init)
    int sequence_length, micro_batch_size, global_batch_size, max_steps;
    uint64_t seed;
    double init_std;
    struct {
        char type[16]; // "adamw" | "muon" (Muon for 2-D+ weights, AdamW with betas/eps for the rest)
        double lr, beta1, beta2, eps, weight_decay;
        double momentum; // Muon's β (default 0.95)
    } optimizer;
    struct {
        char type[16];        // "constant" | "wsd"
        char decay_shape[16]; // "cosine" | "linear"
        double warmup_ratio, decay_ratio, start_lr, final_lr;
    } scheduler;
    double clip_grad_norm; // max global grad norm (0: no clipping)
    double moe_load_balance_coef;
    double moe_router_bias_update_rate; // aux-loss-free balancing: per-step bias step (0: off)
    char moe_load_balance_type[16]; // "micro-batch" | "global-batch" (spec §5.4)
    int save_interval, keep_last;
    struct {
        int pp, cp, ep;            // pipeline, context, expert parallel sizes; dp = ranks / (pp·cp·ep)
        char sharding[8];          // "fsdp" | "hsdp"
        double timeout_s;          // a collective not complete after this long ends the job (default 900)
        double ep_capacity_factor; // rows an ep rank's experts can receive = factor·T·k (0: the worst case)
    } parallel;
    struct {
        char dataset[PATH_MAX_LEN]; // token files of the validation data
        int interval, batches;      // every `interval` steps (0: only at the end), the first `batches` global batches
    } validation;                   // batches == 0: no validation
    char device[8];        // "auto" | "cpu" | "cuda"
    char compute_dtype[8]; // "bf16" | "fp32" (GPU only; the CPU computes in fp32)
    bool benchmark;        // force-balanced routing (spec §5.4)
    bool tensorboard;      // rank 0 writes TensorBoard event files into run_dir (default true)
    json_t *json;          // the effective config (after overrides), kept for the run record
} TrainConfig;

// Loads `file`, applies the `--set key=value` overrides (sets[0..nsets)), validates and fills c.
void config_load(TrainConfig *c, const char *file, char **sets, int nsets);
// λ(s): the learning-rate multiplier of 0-based step s (spec §6.4); lr of that step = optimizer.lr · λ(s).
double config_lr_factor(const TrainConfig *c, int s);
