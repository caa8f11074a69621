// dualpipev.h — the DualPipeV pipeline schedule as data (docs/architecture.md, "Pipeline parallelism").
// The model is cut into 2P chunks; pipeline rank r holds chunk r (phase 0) and chunk 2P−1−r (phase 1), so
// rank 0 holds the embedding and the LM head. Activations of phase 0 flow r → r+1, of phase 1 r → r−1;
// the last rank hands its phase-0 output to its own phase 1, and gradients flow back the same way.
// For P ranks and N ≥ 2P micro-batches dualpipev_build lists one rank's steps in order — forward (F),
// backward (B), the overlapped forward/backward pair (FB), the deferred expert weight gradients of one
// earlier backward (W) — and the messages each step posts together and waits for before its compute.
// It also sizes and assigns the buffers the steps need: activation records, output and input gradients,
// per (phase, micro-batch), alive over intervals of the rank's timeline, packed into the fewest slots.
#pragma once
#include <stdbool.h>

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
    bool zb; // B: expert weight gradients are deferred to a later W (zero-bubble)
    int msg0, nmsg; // msgs[msg0 .. msg0 + nmsg): posted together, then waited for, before the compute
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
    int max_deferred; // most backward chunks waiting for their W at once
} PipeSchedule;

// NULL when P ranks and N micro-batches admit the schedule, else why not (a sentence for a config error).
const char *dualpipev_check(int P, int N);
// The model chunk rank r runs as phase p: r for phase 0, 2P − 1 − r for phase 1.
static inline int dualpipev_chunk(int P, int r, int p) { return p == 0 ? r : 2 * P - 1 - r; }
void dualpipev_build(PipeSchedule *s, int P, int N, int rank, bool forward_only);
void dualpipev_free(PipeSchedule *s);
// The steps in the notation of docs/architecture.md ("F0 F0 B1(zb) W [F0|B1] ..."); the caller frees it.
char *dualpipev_format(const PipeSchedule *s);
