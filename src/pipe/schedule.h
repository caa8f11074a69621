// schedule.h — running micro-batches through a model's layers: the forward and backward passes of one
// pipeline stage holding all layers (pp = 1), stage by stage in the order of the 5-stage protocol.
#pragma once
#include "parallel/ep.h"
#include "model/model.h"

typedef struct {
    size_t act_bytes; // activation records of one micro-batch (inputs, saved tensors, stage buffers)
    size_t ws_bytes;  // backward workspace (two gradient buffers + the largest layer's temporaries)
    size_t comm_bytes; // rows in transit between ranks (expert parallelism), shared by all layers
} EnginePlan;

typedef struct {
    Model *m;
    int B, S;
    Arena act, ws, comm;
    EpBuffers epb;   // the expert-parallel transfer buffers (comm arena)
    char *recs;      // L records of m->fam->rec_size bytes
    void *epilog;    // the epilog record
    StageIO *io;     // L
    Tensor *h;       // L + 1 hidden states (T, H): h[0] = embeddings, h[l + 1] = output of layer l
    Tensor dh[2];    // ping-pong gradient buffers (T, H)
    MicroBatch mb;
} Engine;

// The exact bytes engine_init will allocate, computed by running the same allocation on counting arenas.
EnginePlan engine_plan(Model *m, int B, int S);
void engine_init(Engine *e, Model *m, int B, int S);
void engine_free(Engine *e);
// tokens, labels: (B·S) host int32 (labels −100 = no target).
void engine_load(Engine *e, const int32_t *tokens, const int32_t *labels);
// Adds Σ CE (and Σ load-balancing loss) into m->loss_sum (m->lb_sum); with grad, keeps what backward needs.
void engine_forward(Engine *e, bool grad);
// Accumulates ∂(Σ CE + T·Σ lb)/∂θ into m->g.
void engine_backward(Engine *e);
