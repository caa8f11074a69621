// trainer.h — one training run: mesh, model, sharded optimizer state, data and the step
// (docs/architecture.md, "One training step").
#pragma once
#include "parallel/fsdp.h"
#include "parallel/ring.h"
#include "pipe/chunk.h"
#include "pipe/dualpipev.h"
#include "train/config.h"
#include "train/data.h"
#include "train/muon.h"

// What one rank allocates, in bytes: the same allocation sequence gives `pith estimate` and the run.
typedef struct {
    size_t weights; // compute copy of this rank's parameter groups (model.w), padded to the shard count, + FP8 cache
    size_t fp8;     // of weights, the FP8 weight cache (model.fp8.w: codes and scales; 0 without fp8)
    bool master_experts; // the experts' compute copy is their fp32 master (ModelConfig.w_f32; in weights, not shards)
    size_t grads;        // fp32 gradient accumulators (model.g)
    size_t shards;       // fp32 master shards (when not model.w itself; gradients are reduced in place in model.g)
    size_t optim;        // AdamW moments (shards), or their staging under optimizer.offload
    size_t host;         // optimizer.offload: the moments, in host memory (not in the total)
    size_t snapshot;     // checkpoint.async: a save's host copy of what this rank writes (not in the total)
    size_t other;        // rope tables, loss accumulators, ring attention's scratch (cp > 1)
    ChunkPlan chunks;    // this rank's chunks: activation records, backward workspaces, communication buffers
    size_t pipe;         // pp > 1: the pipeline's activation and gradient buffers between ranks
} MemoryPlan;
size_t memory_plan_total(const MemoryPlan *p);

typedef struct {
    TrainConfig cfg;
    Dist dist;
    Fsdp fsdp;
    Model model;
    Ring ring; // cp > 1: ring attention over the cp group (model.ring points here)
    // pp = 1: chunk[0] is the whole model with one record. pp > 1: this rank's DualPipeV chunks (phase 0:
    // chunk pp_rank, phase 1: chunk 2·pp − 1 − pp_rank), their schedules for a step and for validation
    // (forward only), and the pipeline buffers of both (one region: they never run at once).
    Chunk chunk[2];
    StepSums sums; // the step's (or validation's) losses and expert counts
    PipeSchedule sched[2];
    PipeRun pipe[2];
    Arena pipe_mem;
    Dataset data;
    Dataset val;            // validation data (validation.batches > 0), read in file order
    Arena state;            // the shards below (counted first: MemoryPlan.shards + optim)
    Tensor master[NGROUPS]; // this rank's fp32 master shards (model.w itself with one shard on the CPU)
    Tensor grad[NGROUPS];   // this rank's shards of the step's gradient (the front of model.g, or all of it)
    GradUnits units;        // parallel.gradient_reduce "layer": the dense shard (grad[GROUP_DENSE]) and windows
    Tensor adam_m[NGROUPS], adam_v[NGROUPS]; // AdamW moments; under Muon, adam_m of Muon parameters is the momentum
    Arena offload;                           // optimizer.offload: host memory holding adam_m and adam_v
    Arena snapshot;      // checkpoint.async: the host memory every save copies its snapshot into (train/ckpt.h)
    Tensor stage[2];     // optimizer.offload: device staging for one chunk of m and v (else zero-size)
    float *router_bias;  // (layers·E) host copy of model.router_bias (aux-loss-free balancing; NULL: off)
    double *router_load; // (layers·E) host: the step's expert counts (sums.router_load), read once at its end
    Muon muon;           // optimizer.type "muon": parameter classes, batches, scratch (else muon.on is false)
    int step;            // optimizer steps taken
    // cuda_graph: the recordings of a micro-batch's forward and backward, [0] the step's first and [1] the others
    // (run_microbatches), made after eager_steps reach GRAPH_EAGER_STEPS.
    OpsGraph *graph[2];
    int eager_steps, recorded; // steps run without graphs; recordings made so far
    Arena staging;             // host memory (pinned on the GPU) of the three below
    int32_t *tokens, *labels;  // one micro-batch, uploaded without a wait (chunk_upload)
    int32_t *docpos;           // its document positions (document_masking; else NULL)
    MemoryPlan plan;
    int moe_layers;
    char dump_grads[PATH_MAX_LEN]; // when set, the next step writes its gradient there (pith train --dump-grads)
} Run;

typedef struct {
    double loss;      // mean token cross-entropy of the step's global batch, before the update
    double lb;        // mean load-balancing loss per MoE layer and micro-batch, divided by its coefficient
    double lr;        // learning rate used by this step's update
    double grad_norm; // global norm of the gradient before clipping
    double tokens, seconds;
    double fwdbwd_seconds; // forward + backward of all micro-batches (the rest is the optimizer step)
    double fwdbwd_host;    // of it, the host's time to issue them (the rest: waiting for the GPU); equal: host-bound
    int64_t fwdbwd_waits;  // the host's waits for the GPU while it issued them (ops_host_syncs; 0 on the CPU)
    bool nonfinite;        // loss or grad_norm is NaN/Inf: the update was not applied
    bool update_nonfinite; // the update left a weight or a second moment NaN/Inf (the run must stop)
    double ep_over;        // expert parallelism: (token, expert) rows received above the capacity, all ranks
    double ep_load;        // the most rows one rank received in one layer, in units of T·k (0: ep = 1)
    // Through the DualPipeV engine: the mean over ranks of the seconds in chunk computes, and the bubble,
    // 1 − Σ busy / Σ pipeline time (PipeRun.busy_s, pipe_s); both 0 without the engine.
    double pipe_busy_s, bubble;
    int graphs_recorded; // cuda_graph: the micro-batch recordings this step made (0: it launched those it had)
} StepStats;

// Builds everything from the config: mesh (the launched world), model (random init from the seed), plan,
// arenas, data, optimizer. Every rank of the world calls it.
void run_setup(Run *r, const TrainConfig *cfg, bool open_data);
void run_free(Run *r);
// The memory plan of one rank of a layout: run_setup's allocation sequence on counting arenas (pith estimate).
MemoryPlan run_memory_plan(const TrainConfig *cfg, const Dist *d, Device dev);
// One optimizer step over global_batch_size samples: this rank's micro-batches, then the gradient
// reduce-scatter, the global norm, clipping and AdamW on the shards. A step whose loss or gradient norm
// is not finite counts as taken (r->step advances, with its data) but leaves weights and moments as they
// were; it says so in nonfinite. An update that leaves a weight or second moment not finite is reported in
// update_nonfinite (the weights hold it: the caller must stop without saving).
StepStats run_step(Run *r);
// The mean token cross-entropy over the first validation.batches global batches of the validation data
// (forward only, every rank of the layout; the same value under every layout and as `pith eval`).
double run_validate(Run *r);
// True when the step just taken is followed by validation (every validation.interval steps and the last).
bool run_validation_due(const Run *r);
// True when the step just taken should be checkpointed (every save_interval steps and the last one).
bool run_save_due(const Run *r);
