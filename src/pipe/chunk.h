// chunk.h — a chunk of a model's layers on this rank and the micro-batches in flight through it: the
// whole model (pp = 1, one record), or layers [l0, l1) of a pipeline (DualPipeV: two chunks per rank,
// one record per micro-batch the schedule keeps alive at once). Forward and backward run stage by stage in
// the order of the 5-stage protocol; a backward may defer its stage-3 weight gradients to a later
// chunk_weight (zero-bubble), keeping their inputs in one of the chunk's deferred sets.
#pragma once
#include "model/ep.h"
#include "model/model.h"

typedef struct {
    size_t act_bytes;  // activation records (inputs, saved tensors, stage buffers) and deferred sets
    size_t ws_bytes;   // backward workspace (two gradient buffers + the largest layer's temporaries)
    size_t comm_bytes; // rows in transit between ranks (expert parallelism), shared by all layers
    // act_bytes by part (they sum to it): layer inputs/outputs, routing and the micro-batch; the families'
    // stage-1 records (attention, norms, router); stage 3 and its ep buffers (expert rows, gate/up, SwiGLU,
    // outputs, routes); staging shared by the layers (ye, the recomputed parts); the spill set; the
    // epilog; the deferred sets.
    size_t act_hidden, act_stage1, act_experts, act_staging, act_spill, act_epilog, act_defer;
} ChunkPlan;

// The stage-3 rows of a MoE layer: expert-ordered inputs (R, H), activations (R, 2I) and (R, I) (LayerRec),
// and the route's permutations (R) int32; R = the capacity (a layer's own) or the worst case (the spill set).
typedef struct {
    Tensor xe, gu, act, perm_r, xrow;
} ExpertRows;

// One micro-batch in flight: what its forward keeps for its backward (PithTrain's ChunkRecord).
typedef struct {
    MicroBatch mb;
    char *recs;       // L records of m->fam->rec_size bytes (l0..l1 used)
    EpilogRec epilog; // the epilog record
    StageIO *io;      // L
    Tensor *h;        // L + 1 hidden states (T, H): h[l0] = the chunk's input, h[l + 1] = output of layer l
    int defer_set;    // the deferred set holding this record's stage-3 weight-gradient inputs (−1: none)
    ExpertRows *own;  // L: each layer's own stage-3 rows (under full recompute, in the shared region)
} ChunkRecord;

// parallel.gradient_reduce "layer" (docs/architecture.md, "Gradient reduction per layer"): the dense group's gradient
// without a whole buffer. Each unit (model_grad_unit) is backpropagated into a zeroed window; when its backward ends,
// its sum over the shard group is issued to the owners (fsdp_reduce_unit_start) and runs beside the next units'
// backward; before its window is zeroed again, and at the backward's end, it is waited for and added into the shard.
// Windows: win[0] the ends' units, win[1] and win[2] the layers' in turn (layer l: 1 + l % 2; a tied epilog, the final
// norm alone, counts as layer `layers`).
typedef struct {
    const Fsdp *f;
    Tensor shard;  // (len) fp32: this rank's dense gradient shard, summed over the step's micro-batches in their order
    Tensor win[3]; // the embedding's and, untied, the final norm's and LM head's; two of the largest layer's
    int busy[3];   // the unit whose reduce is in flight from win[i] (−1: none)
    int nreq[3];
    CommReq *req[3];                // its requests (the shard group's size each; allocated at first use)
    ModelUnit unit[MAX_LAYERS + 2]; // model_grad_unit of each
} GradUnits;
// The windows from a (counting) arena: each the size of the largest unit it serves (the caller sets the shard).
void grad_units_alloc(GradUnits *u, Model *m, const Fsdp *f, Arena *a);
void grad_units_free(GradUnits *u);

typedef struct {
    Model *m;
    GradUnits *units; // parallel.gradient_reduce "layer" (NULL: the whole gradient buffer m->g)
    int B, S;
    int l0, l1; // the layers this chunk runs: the prolog when l0 = 0, the epilog when l1 = layers
    int nrec, ndefer;
    ChunkRecord *rec; // (nrec) record slots
    // Deferred sets, a FIFO ring of ndefer: set i holds, per layer l, stage 3's output gradient dye: (R, H)
    // and dgu: (R, 2I), the inputs of its weight gradients besides the record's own (xe, act).
    Tensor *dye, *dgu; // (ndefer · L)
    int defer_head, defer_tail;
    Arena act, comm;
    Arena stage1;         // staging of the stage-1 parts a forward recomputes in backward (a block of act)
    Arena own_ws;         // the backward workspace when the chunk owns it (cap 0: it uses the other chunk's)
    Arena *ws;            // the backward workspace: own_ws, or that of the rank's other chunk (chunk_init_rank)
    bool pipe_io;         // records take input and output from the pipeline's buffers (chunk_pipe_*), own no copies
    EpBuffers epb;        // the expert-parallel transfer buffers (comm arena)
    Tensor dh[2];         // ping-pong gradient buffers (T, H) (workspace)
    Tensor opws;          // the ops' planned scratch (workspace; ModelFamily.op_ws), or p NULL
    ExpertRows spill;     // the spill set (xe.n[0] = 0: none)
    int spill_owner;      // slot·L + layer whose stage 3 the spill set holds (−1: none)
    int region_owner;     // full recompute: slot·L + layer whose record the shared region holds (−1: none)
    int64_t ep_over;      // rows received above the capacity, summed over forwards (the caller zeroes it)
    int64_t ep_rows_peak; // most (token, expert) rows one layer received (the caller zeroes it)
} Chunk;

// The exact bytes chunk_init will allocate, computed by running the same allocation on counting arenas.
ChunkPlan chunk_plan(Model *m, int B, int S, int l0, int l1, int nrec, int ndefer);
// The two chunks of a pipeline rank (DualPipeV phases 0 and 1): layers [l0, l1), record slots, deferred sets.
typedef struct {
    int l0, l1, nrec, ndefer;
} ChunkShape;
// chunk_plan of a rank's two chunks (summed) as chunk_init_rank allocates them: one backward workspace for
// both, sized for the larger backward (a chunk uses its workspace only during a backward, and two backwards
// never run at once: the overlapped pair is one forward, which uses none, beside one backward); and records
// whose input and output between chunks are the pipeline's buffers (chunk_pipe_forward points the record at
// them) rather than copies, except the output under full recompute (the backward's replay rewrites it).
ChunkPlan chunk_plan_rank(Model *m, int B, int S, const ChunkShape sh[2]);
// c[1] uses c[0]'s workspace (c stays where it is while c[1] runs).
void chunk_init_rank(Chunk c[2], Model *m, StepSums *sums, int B, int S, const ChunkShape sh[2]);
// Layers [l0, l1) with nrec record slots and ndefer deferred sets. Without the prolog the caller writes
// the chunk's input chunk_input(c, slot) before chunk_forward; without the epilog its output is
// chunk_output(c, slot), the caller writes the output gradient into dh[0] before chunk_backward, and the
// input gradient is chunk_input_grad afterwards. The micro-batches' losses and counts add up in step.
void chunk_init(Chunk *c, Model *m, StepSums *sums, int B, int S, int l0, int l1, int nrec, int ndefer);
// The whole model with one record (pp = 1, evaluation, tests).
void chunk_init_model(Chunk *c, Model *m, StepSums *sums, int B, int S);
void chunk_free(Chunk *c);
// tokens, labels: (B·S) host int32 (labels −100 = no target), into record slot's micro-batch.
void chunk_load(Chunk *c, int slot, const int32_t *tokens, const int32_t *labels);
// chunk_load with document masking: docpos (B·S) host int32, each token's position inside its document (the
// micro-batch's positions, MicroBatch.docs on); NULL: off, the positions of chunk_init (model_position).
void chunk_load_docs(Chunk *c, int slot, const int32_t *tokens, const int32_t *labels, const int32_t *docpos);
// chunk_load_docs without waiting for the copies (op_upload): the host arrays must stay unchanged until
// ops_uploads_wait, and the host can queue the micro-batch's work while the GPU still runs earlier work.
void chunk_upload(Chunk *c, int slot, const int32_t *tokens, const int32_t *labels, const int32_t *docpos);
Tensor chunk_input(const Chunk *c, int slot);  // (T, H) h[l0]
Tensor chunk_output(const Chunk *c, int slot); // (T, H) h[l1]
Tensor chunk_input_grad(const Chunk *c);       // (T, H) after chunk_backward
// Adds Σ CE (and Σ load-balancing loss) into the loaded step's loss_sum (lb_sum); with grad, keeps what backward needs.
void chunk_forward(Chunk *c, int slot, bool grad);
// The forward without the epilog: the prolog (when l0 = 0) and the layers, leaving the output in h[l1]
// (generation).
void chunk_forward_layers(Chunk *c, int slot);
// Accumulates ∂(Σ CE + T·Σ lb)/∂θ into m->g (with units: the dense part into the shard); with defer, all but
// stage 3's weight gradients, whose inputs go to the next deferred set until chunk_weight(c, slot).
void chunk_backward(Chunk *c, int slot, bool defer);
// The deferred stage-3 weight gradients of slot's backward (the oldest deferred set: FIFO).
void chunk_weight(Chunk *c, int slot);
// A pipeline's computes (the PipeChunks of dualpipev_run): the forward reads its input from x (x empty:
// the model's first chunk, which embeds its tokens) and writes its output into y (y empty: the last, whose
// output is the loss) — the record points at them, so they must live until its backward (or W), as the
// schedule's buffers do; under full recompute the output is the record's own, copied to y. The backward
// reads the output gradient from dy (empty: the last) and writes the input gradient into dx (empty: the
// first).
void chunk_pipe_forward(Chunk *c, int slot, Tensor x, Tensor y, bool grad);
void chunk_pipe_backward(Chunk *c, int slot, Tensor dy, Tensor dx, bool defer);
// The overlapped pair: the forward (with grad) of fc's record fslot interleaved stage by stage with the
// backward (no deferral) of bc's record bslot, so each all-to-all of one runs beside compute of the other;
// results equal chunk_forward then chunk_backward bit for bit. Two chunks of as many layers.
void chunk_pair(Chunk *fc, int fslot, Chunk *bc, int bslot);
// chunk_pair with chunk_pipe_forward's x, y and chunk_pipe_backward's dy, dx.
void chunk_pipe_pair(Chunk *fc, int fslot, Tensor x, Tensor y, Chunk *bc, int bslot, Tensor dy, Tensor dx);
