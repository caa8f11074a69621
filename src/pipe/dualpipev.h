// dualpipev.h — the DualPipeV pipeline schedule as data (docs/architecture.md, "Pipeline parallelism").
// The model is cut into 2P chunks; pipeline rank r holds chunk r (phase 0) and chunk 2P−1−r (phase 1), so
// rank 0 holds the embedding and the LM head. Activations of phase 0 flow r → r+1, of phase 1 r → r−1;
// the last rank hands its phase-0 output to its own phase 1, and gradients flow back the same way.
// For P ranks and N ≥ 2P micro-batches dualpipev_build lists one rank's steps in order — forward (F),
// backward (B), the overlapped forward/backward pair (FB), the deferred expert weight gradients of one
// earlier backward (W) — and the messages each step posts together and waits for before its compute.
// It also sizes and assigns the buffers the steps need: activation records, output and input gradients,
// per (phase, micro-batch), alive over intervals of the rank's timeline, packed into the fewest slots.
// dualpipev_run executes a rank's schedule: it posts each step's messages over the pipeline group, waits,
// and calls the caller's chunk computes (the model engine; the tests' toy model) on the pipeline buffers.
#pragma once
#include "parallel/comm.h"

typedef enum { PIPE_F, PIPE_B, PIPE_FB, PIPE_W, PIPE_SYNC } PipeKind; // SYNC: a commit with no compute

// One point-to-point message of a step's group. Activations are the input (received) or output (sent) of
// chunk `phase`'s forward of micro-batch `mb`; gradients the output gradient (received) or input gradient
// (sent) of its backward. Between two ranks messages match in posting order (NCCL's rule, MPI's too).
typedef struct {
    bool send, grad;
    int phase, mb;
    int peer; // the pipeline rank at the other end
} PipeMsg;

typedef struct {
    PipeKind kind;
    int fphase, fmb; // F, FB: the forward chunk and micro-batch
    int bphase, bmb; // B, FB: the backward chunk and micro-batch; W: the one whose weight gradients it applies
    bool zb;         // B: expert weight gradients are deferred to a later W (zero-bubble)
    int msg0, nmsg;  // msgs[msg0 .. msg0 + nmsg): posted together, then waited for, before the compute
} PipeStep;

// Buffer kinds. A record holds a chunk's input activation, what its backward needs and its output; it is
// alive from the input's arrival (its receive is posted, the data is loaded, or the last rank's hand-off)
// to the end of the backward, or of the W that applies its deferred weight gradients (to the completion
// of its output's send under forward_only). An output gradient lives from its receive (or hand-off) to
// the backward that consumes it; an input gradient from the backward that makes it to its send's wait.
enum { PIPE_REC, PIPE_GOUT, PIPE_GIN, PIPE_NBUF };

typedef struct {
    int P, N, rank;
    bool forward_only; // evaluation: no backward steps, no gradients, every FB a plain F
    PipeStep *steps;
    int nsteps;
    PipeMsg *msgs;
    int nmsgs;
    // Timeline: step i waits for its messages at time 2i and computes at 2i + 1. Buffer (kind, phase, mb) is
    // alive over [claim, release] (claim −1: never used) and lives in slot `slot` of `slots[kind][phase]`.
    int *claim[PIPE_NBUF][2], *release[PIPE_NBUF][2], *slot[PIPE_NBUF][2]; // each (N)
    int slots[PIPE_NBUF][2];
    int max_deferred;       // most backward chunks waiting for their W at once
    int max_deferred_of[2]; // the same counting only phase p's (each phase's deferred sets)
} PipeSchedule;

// NULL when P ranks, N micro-batches and a model of `layers` layers (cut into 2P equal chunks) admit the
// schedule, else why not (a sentence for a config error).
const char *dualpipev_check(int P, int N, int layers);
// The model chunk rank r runs as phase p: r for phase 0, 2P − 1 − r for phase 1.
static inline int dualpipev_chunk(int P, int r, int p) { return p == 0 ? r : 2 * P - 1 - r; }
void dualpipev_build(PipeSchedule *s, int P, int N, int rank, bool forward_only);
void dualpipev_free(PipeSchedule *s);
// The steps in the notation of docs/architecture.md ("F0 F0 B1(zb) W [F0|B1] ..."); the caller frees it.
char *dualpipev_format(const PipeSchedule *s);

// ---- running a schedule ----
// The compute of this rank's two chunks. Tensors are (T, H) pipeline buffers: x, the chunk's input, is
// empty on the model's first chunk (its input is the micro-batch's tokens); y, its output, is empty on the
// last (whose output is the loss); likewise dy (output gradient) on the last and dx (input gradient) on
// the first. slot is the micro-batch's record slot in its phase (PipeSchedule.slot[PIPE_REC]): x and y
// stay valid from the forward to the backward, or to the W of a backward that defers. An overlapped pair
// runs pair() (the forward's arguments, then the backward's: the engine interleaves their stages), or
// without one its forward, then its backward.
typedef struct {
    void *ctx; // what this call's computes read (the trainer's: its chunks, the data and batch of this pass)
    void (*forward)(void *ctx, int phase, int mb, int slot, Tensor x, Tensor y);
    // defer: keep the expert weight gradients for a later weight() of the same (phase, mb)
    void (*backward)(void *ctx, int phase, int mb, int slot, Tensor dy, Tensor dx, bool defer);
    void (*weight)(void *ctx, int phase, int mb, int slot);
    void (*pair)(void *ctx, int fphase, int fmb, int fslot, Tensor x, Tensor y, int bphase, int bmb, int bslot,
                 Tensor dy, Tensor dx); // NULL: forward, then backward
} PipeChunks;

// The pipeline buffers of one rank: activations in and out per record slot, output and input gradients
// per gradient slot, each (T, H) of one dtype; those a rank never uses (rank 0's embedding input, the
// last rank's hand-offs, which write straight into the other phase's buffer) are not allocated.
enum { PIPE_ACT_IN, PIPE_ACT_OUT, PIPE_GRAD_OUT, PIPE_GRAD_IN, PIPE_NTENSOR };
typedef struct {
    const PipeSchedule *s;
    const Comm *pp;             // the pipeline group: rank = pipeline rank
    Tensor *t[PIPE_NTENSOR][2]; // [kind][phase][slot]
    // The last dualpipev_run's seconds: in the chunk computes (busy), and in all (the rank's pipeline time).
    // Both wait for the compute stream (ops_sync) at each compute's ends, so on the GPU a receive's wait
    // counts as idle; 1 − busy_s / pipe_s is the rank's bubble. PITH_TEST_PIPE_DELAY=R:US (tests) adds US
    // microseconds of sleep to every compute of pipeline rank R (R = -1: every rank), counted as busy.
    double busy_s, pipe_s;
    int delay_us; // this rank's planted delay (0: none)
} PipeRun;

// Allocates the buffers from a (so a counting arena gives their exact size).
void dualpipev_run_init(PipeRun *run, const PipeSchedule *s, const Comm *pp, Arena *a, DType dt, int64_t T, int64_t H);
void dualpipev_run_free(PipeRun *run);
// The buffer of kind for (phase, mb): empty where the rank has none.
Tensor dualpipev_buffer(const PipeRun *run, int kind, int phase, int mb);
void dualpipev_run(PipeRun *run, const PipeChunks *c);
