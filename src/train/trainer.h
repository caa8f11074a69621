// trainer.h — one training run: model, optimizer state, data and the step (DESIGN §7).
#pragma once
#include "pipe/schedule.h"
#include "train/config.h"
#include "train/data.h"

typedef struct {
    TrainConfig cfg;
    Model model;
    Engine eng;
    Dataset data;
    Tensor master[NGROUPS]; // fp32 master weights (alias model.w when the compute copy is fp32 too)
    Tensor adam_m[NGROUPS], adam_v[NGROUPS];
    int step;               // optimizer steps taken
    int32_t *tokens, *labels; // host staging for one micro-batch
    EnginePlan plan;
    size_t param_bytes;     // master + compute copy + gradients + optimizer state
    int moe_layers;
} Run;

typedef struct {
    double loss;      // mean token cross-entropy of the step's global batch, before the update
    double lb;        // mean load-balancing loss per MoE layer and micro-batch, divided by its coefficient
    double lr;        // learning rate used by this step's update
    double grad_norm; // global norm of the gradient before clipping
    double tokens, seconds;
    double fwdbwd_seconds;  // forward + backward of all micro-batches (the rest is the optimizer step)
} StepStats;

// Builds everything from the config: model (random init from the seed), plan, arenas, data, optimizer.
void run_setup(Run *r, const TrainConfig *cfg, bool open_data);
void run_free(Run *r);
// One optimizer step over global_batch_size samples (gradient accumulation over micro-batches).
StepStats run_step(Run *r);
// Forward and backward of one micro-batch already loaded into r->eng, leaving ∂(Σ CE + T·Σ lb)/∂θ in the
// gradient buffers (accumulated) and the sums in model.loss_sum / model.lb_sum. Used by run_step and tests.
void run_microbatch(Run *r);
// True when the step just taken should be checkpointed (every save_interval steps and the last one).
bool run_save_due(const Run *r);
