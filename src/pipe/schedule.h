// schedule.h — running micro-batches through a model's layers: the forward and backward passes of one
// pipeline chunk — all layers (pp = 1), or layers [l0, l1) of a pipeline — stage by stage in the order of
// the 5-stage protocol.
#pragma once
#include "parallel/ep.h"
#include "model/model.h"

typedef struct {
    size_t act_bytes;  // activation records of one micro-batch (inputs, saved tensors, stage buffers)
    size_t ws_bytes;   // backward workspace (two gradient buffers + the largest layer's temporaries)
    size_t comm_bytes; // rows in transit between ranks (expert parallelism), shared by all layers
} EnginePlan;

typedef struct {
    Model *m;
    int B, S;
    int l0, l1; // the layers this engine runs: the prolog when l0 = 0, the epilog when l1 = layers
    Arena act, ws, comm;
    EpBuffers epb; // the expert-parallel transfer buffers (comm arena)
    char *recs;    // L records of m->fam->rec_size bytes
    void *epilog;  // the epilog record
    StageIO *io;   // L
    Tensor *h;     // L + 1 hidden states (T, H): h[0] = embeddings, h[l + 1] = output of layer l (l0..l1 used)
    Tensor dh[2];  // ping-pong gradient buffers (T, H)
    MicroBatch mb;
} Engine;

// The exact bytes engine_init will allocate, computed by running the same allocation on counting arenas.
EnginePlan engine_plan(Model *m, int B, int S);
void engine_init(Engine *e, Model *m, int B, int S);
// A chunk of layers [l0, l1). Without the prolog the caller writes the chunk's input h[l0] before
// engine_forward; without the epilog its output is h[l1], the caller writes the output gradient into
// dh[0] before engine_backward, and the input gradient is engine_input_grad afterwards.
EnginePlan engine_plan_chunk(Model *m, int B, int S, int l0, int l1);
void engine_init_chunk(Engine *e, Model *m, int B, int S, int l0, int l1);
Tensor engine_input_grad(const Engine *e);
void engine_free(Engine *e);
// tokens, labels: (B·S) host int32 (labels −100 = no target).
void engine_load(Engine *e, const int32_t *tokens, const int32_t *labels);
// Adds Σ CE (and Σ load-balancing loss) into m->loss_sum (m->lb_sum); with grad, keeps what backward needs.
void engine_forward(Engine *e, bool grad);
// The forward without the epilog: the prolog (when l0 = 0) and the layers, leaving the output in h[l1] (generation).
void engine_forward_layers(Engine *e);
// Accumulates ∂(Σ CE + T·Σ lb)/∂θ into m->g.
void engine_backward(Engine *e);
