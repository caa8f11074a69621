// ring.h — context parallelism: zigzag ring attention over the cp group (docs/architecture.md, "Context
// parallelism"). Each sequence of S tokens is cut into 2·cp chunks of blk = S/(2·cp); cp rank r holds chunk r
// (its front half) and chunk 2·cp − 1 − r (its back half), so every rank has the same causal work. The local
// rows of a sequence are [front | back] (2·blk rows); q, k, v, o are (B·2·blk, heads, d) as the families keep
// them, lse (B, nh, 2·blk) fp32, exactly the rows of one-rank attention over the whole sequence that this rank
// holds. K and V travel one hop per step to rank r + 1; the backward sends them round again and a second ring
// carries each rank's dK/dV accumulator home. Multi-head latent attention sends its latent instead and makes K
// and V from it at every hop (ring_mla_*).
#pragma once
#include "ops/ops.h"
#include "parallel/comm.h"

// A model's attention as the ring moves it: query and kv heads, q·k and v head dims; for multi-head latent
// attention the latent's columns dc and the dn of dqk made from it (else 0). A model that leaves nh 0 does not run
// under context parallelism. Gated DeltaNet layers (the contiguous layout, below): conv channels cc of kernel ck and
// the recurrent state's fp32 elements per sequence (ck 0: none).
typedef struct {
    int nh, nkv, dqk, dv, dc, dn, cc, ck;
    int64_t state;
} RingDims;

// Multi-head latent attention (DeepSeek-V2) sends its latent round the ring instead of k and v: c: (T, dc) and k_pe
// in columns [pe_col, pe_col + dr) of pe: (T, ·); nh heads of dn (k_nope), dr (k_pe) and dv. The caller's hooks make
// a hop's kv: (R, nh, dn + dv), k: (R, nh, dn + dr), v: (R, nh, dv) from latent rows, and take dk, dv back to dc and
// the k_pe columns of dpe (dkv: scratch; the caller accumulates its weight's gradient). The caller's struct may
// begin with a RingLatent and hold what the hooks need after it.
typedef struct RingLatent RingLatent;
struct RingLatent {
    Tensor c, pe;
    int pe_col, nh, dn, dr, dv;
    void (*decompress)(const RingLatent *l, Tensor c, Tensor pe, int pe_col, Tensor kv, Tensor k, Tensor v);
    void (*decompress_backward)(const RingLatent *l, Tensor c, Tensor dc, Tensor dpe, int dpe_col, Tensor dkv,
                                Tensor dk, Tensor dv);
};

typedef struct Ring {
    const Comm *cp; // the cp group (size ≥ 2)
    Arena mem;      // one call's scratch, reset at its start (ring_bytes of the largest layer)
} Ring;

// The global position of local row i (0 ≤ i < 2·blk) of a sequence on cp rank r of cp.
static inline int ring_position(int r, int cp, int blk, int i) {
    return i < blk ? r * blk + i : (2 * cp - 1 - r) * blk + (i - blk);
}

// Bytes of one call's scratch for B sequences of 2·blk local rows: nh query heads, nkv kv heads of q·k dim dqk
// and v dim dv in dtype dt (forward or backward, whichever is larger); with dc > 0 the latent form (dc latent
// columns, dn of the dqk per head made from it).
size_t ring_bytes(Device dev, DType dt, int B, int blk, int nh, int nkv, int dqk, int dv, int dc, int dn);
void ring_init(Ring *r, const Comm *cp, Device dev, size_t bytes);
void ring_free(Ring *r);

// Causal self-attention of the zigzag layout (a->causal, no window, no sinks, offsets 0; a->docpos, this rank's rows,
// for document masking): o and lse as one rank would compute them over the whole sequences, for this rank's rows.
void ring_attention_forward(Ring *r, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a);
// dq, dk, dv written (this rank's rows of the gradients), from the forward's o and lse.
void ring_attention_backward(Ring *r, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a);
// The same for multi-head latent attention (ml's hooks make k, v of each hop's latent): the latent (ml->c and the
// k_pe columns of ml->pe) travels. Backward: dq, dc: (T, dc) and the k_pe columns of dpe written; the hooks'
// weight gradient accumulates over every hop (this rank's queries against every key).
void ring_mla_forward(Ring *r, Tensor o, Tensor lse, Tensor q, const RingLatent *ml, const AttnArgs *a);
void ring_mla_backward(Ring *r, Tensor dq, Tensor dc, Tensor dpe, Tensor dout, Tensor q, Tensor o, Tensor lse,
                       const RingLatent *ml, const AttnArgs *a);

// Gated DeltaNet layers (Qwen3.5) run on the contiguous layout: cp rank r holds chunks 2r and 2r + 1 of each sequence,
// rows [b, slot, i] like the zigzag ones. x: (B·2·blk, cols) in the compute dtype, any cols.
void ring_to_contiguous(Ring *r, Tensor dst, Tensor src, int B);
void ring_to_zigzag(Ring *r, Tensor dst, Tensor src, int B);
// The causal conv's halo, on the contiguous layout: halo: (B·(K−1), C) ← the last K − 1 rows of each sequence of
// rank r − 1's x: (B·S, C) (rank 0: zeros). Backward: dhalo (this rank's ∂/∂halo) goes back to rank r − 1, and what
// rank r + 1 sends is added to the last K − 1 rows of each sequence of dx (its receive buffer: the ring's scratch
// after what the caller took, dhalo there too).
void ring_halo_forward(Ring *r, Tensor halo, Tensor x, int B);
void ring_halo_backward(Ring *r, Tensor dx, Tensor dhalo, Tensor in, int B);
// The scratch of one of those calls: two buffers shaped like `like` at the bottom of a (reset first) — the layout's
// send and receive rows; the halo's rows, or its gradient's two; the state pass's one or two states. The ring's
// own arena holds them in a run; ring_linear_bytes runs the same carves on a counting one.
void ring_pair(Arena *a, Tensor like, Tensor two[2]);
// The delta rule's state pass, sequential over the ranks: the forward receives s from rank r − 1 and sends to
// r + 1; the backward (forward false) receives from r + 1 and sends to r − 1. recv returns false (nothing
// received) at the end of the chain; send to no one does nothing.
bool ring_state_recv(Ring *r, Tensor s, bool forward);
void ring_state_send(Ring *r, Tensor s, bool forward);
// Bytes of the scratch those calls take for B sequences of S local rows (ring_pair's carves): the layout of H
// columns, the halo of (K − 1) × cc, the states of `state` fp32 elements per sequence.
size_t ring_linear_bytes(Device dev, DType dt, int B, int S, int H, int cc, int ck, int64_t state);
// The ring's scratch for a model of hidden size H and ring dims rd, and micro-batches of B sequences of S local
// rows: the larger of ring_bytes and, with Gated DeltaNet layers, ring_linear_bytes.
size_t ring_plan_bytes(const RingDims *rd, int H, Device dev, DType dt, int B, int S);
// Why model_type cannot run sequences of S tokens at cp (its message, written into buf), or NULL when it can: it
// has no ring dims (GPT-OSS), or the conv halo needs more rows than a rank holds. S % (2·cp) is the caller's.
const char *ring_check(const RingDims *rd, const char *model_type, int S, int cp, char *buf, size_t n);
