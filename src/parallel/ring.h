// ring.h — context parallelism: zigzag ring attention over the cp group (docs/architecture.md, "Context
// parallelism"). Each sequence of S tokens is cut into 2·cp chunks of blk = S/(2·cp); cp rank r holds chunk r
// (its front half) and chunk 2·cp − 1 − r (its back half), so every rank has the same causal work. The local
// rows of a sequence are [front | back] (2·blk rows); q, k, v, o are (B·2·blk, heads, d) as the families keep
// them, lse (B, nh, 2·blk) fp32, exactly the rows of one-rank attention over the whole sequence that this rank
// holds. K and V travel one hop per step to rank r + 1; the backward sends them round again and a second ring
// carries each rank's dK/dV accumulator home. Multi-head latent attention sends its latent instead and makes K
// and V from it at every hop (ring_mla_*).
#pragma once
#include "model/model.h"
#include "parallel/comm.h"

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

// Causal self-attention of the zigzag layout (a->causal, no window, no sinks, offsets 0): o and lse as one rank
// would compute them over the whole sequences, for this rank's rows.
void ring_attention_forward(Ring *r, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a);
// dq, dk, dv written (this rank's rows of the gradients), from the forward's o and lse.
void ring_attention_backward(Ring *r, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a);
// The same for multi-head latent attention (model_mla_decompress makes k, v of each hop's latent): the latent
// (ml->c and the k_pe columns of ml->pe) travels. Backward: dq, dc: (T, dc) and the k_pe columns of dpe written;
// ml->dwkvb += kv_b_proj's gradient over every hop (this rank's queries against every key).
void ring_mla_forward(Ring *r, Tensor o, Tensor lse, Tensor q, const MlaLatent *ml, const AttnArgs *a);
void ring_mla_backward(Ring *r, Tensor dq, Tensor dc, Tensor dpe, Tensor dout, Tensor q, Tensor o, Tensor lse,
                       const MlaLatent *ml, const AttnArgs *a);

// Gated DeltaNet layers (Qwen3.5) run on the contiguous layout: cp rank r holds chunks 2r and 2r + 1 of each sequence,
// rows [b, slot, i] like the zigzag ones. x: (B·2·blk, cols) in the compute dtype, any cols.
void ring_to_contiguous(Ring *r, Tensor dst, Tensor src, int B);
void ring_to_zigzag(Ring *r, Tensor dst, Tensor src, int B);
// The causal conv's halo, on the contiguous layout: halo: (B·(K−1), C) ← the last K − 1 rows of each sequence of
// rank r − 1's x: (B·S, C) (rank 0: zeros). Backward: dhalo (this rank's ∂/∂halo) goes back to rank r − 1, and what
// rank r + 1 sends is added to the last K − 1 rows of each sequence of dx (its receive buffer: the ring's scratch
// after what the caller took, dhalo there too).
void ring_halo_forward(Ring *r, Tensor halo, Tensor x, int B);
void ring_halo_backward(Ring *r, Tensor dx, Tensor dhalo, int B);
// The delta rule's state pass, sequential over the ranks: the forward receives s from rank r − 1 and sends to
// r + 1; the backward (forward false) receives from r + 1 and sends to r − 1. recv returns false (nothing
// received) at the end of the chain; send to no one does nothing.
bool ring_state_recv(Ring *r, Tensor s, bool forward);
void ring_state_send(Ring *r, Tensor s, bool forward);
// Bytes of the scratch those calls take for B sequences of S local rows: the layout of H columns, the halo of
// (K − 1) × cc, two states of `state` fp32 elements per sequence.
size_t ring_linear_bytes(Device dev, DType dt, int B, int S, int H, int cc, int ck, int64_t state);
// The ring's scratch for a model (mc->ring's shapes) and micro-batches of B sequences of S local rows: the larger of
// ring_bytes and, with Gated DeltaNet layers, ring_linear_bytes.
size_t ring_plan_bytes(const ModelConfig *mc, Device dev, DType dt, int B, int S);
// Why the model cannot run sequences of S tokens at cp (its message, written into buf), or NULL when it can: the
// family has no ring shape (GPT-OSS), or the conv halo needs more rows than a rank holds. S % (2·cp) is the caller's.
const char *ring_check(const ModelConfig *mc, int S, int cp, char *buf, size_t n);
