// ring.c — zigzag ring attention (ring.h; docs/architecture.md, "Context parallelism").
// Inside a call every tensor is half-major: rows (half, b, i), half 0 the front chunks of the B sequences and
// half 1 the back chunks, so one half is B sequences of blk rows that the attention op takes whole. At hop s the
// resident K/V came from rank j = (r − s) mod cp; a (query half, key half) pair is visible when the query chunk's
// index is at least the key chunk's: equal is the causal diagonal block, greater the whole block (non-causal),
// less nothing. That gives the three per-hop cases of the zigzag layout: hop 0 (both diagonals and the back
// queries against the front keys: the local causal mask), j < r (every query against j's front chunk), j > r
// (the back queries against both of j's chunks); each costs two blocks of blk × blk.
// Forward: each block's (o_p, lse_p) is merged into fp32 accumulators (op_attention_merge). Backward: each block's
// gradients come from the attention backward with the final o and lse (p = e^(s − lse) is the global softmax),
// dq adds up here, and dK/dV of the resident K/V add up in an accumulator that travels with them: after cp hops
// it is back at its owner.
// Transfers: K/V leave through a copy (the resident buffers are read by this hop's attention while the copy
// travels) and arrive in the other resident buffer; each exchange is posted before the hop's attention and
// waited after it (comm_p2p_start: on the GPU the comm stream, ordered by events, beside the compute stream).
#include "parallel/ring.h"

typedef struct {
    Tensor q, k[3], v[3];    // half-major q; K/V: resident and arriving (0, 1 alternate), leaving (2)
    Tensor acc_o, acc_lse;   // forward: fp32 (2B·blk, nh, dv), (2B, nh, blk)
    Tensor o_p, lse_p;       // forward: one block's (B·blk, nh, dv), (B, nh, blk)
    Tensor o, dout, lse;     // backward: half-major copies of the forward's o, the output gradient and lse
    Tensor dq, dkv[2][2];    // backward: fp32 dq; two dK/dV accumulators ([buffer][0: dk, 1: dv]), fp32
    Tensor hop[2];           // backward: this hop's dK, dV of the resident K/V, fp32
    Tensor dq_p, dk_p, dv_p; // backward: one block's gradients
} RingBufs;

static void ring_alloc(RingBufs *b, Arena *a, DType dt, int B, int blk, int64_t nh, int64_t nkv, int64_t dqk,
                       int64_t dv, bool backward) {
    memset(b, 0, sizeof *b);
    int64_t R = 2 * (int64_t)B * blk, H = (int64_t)B * blk;
    b->q = arena_tensor(a, dt, 3, R, nh, dqk, 0);
    for (int i = 0; i < 3; i++) b->k[i] = arena_tensor(a, dt, 3, R, nkv, dqk, 0);
    for (int i = 0; i < 3; i++) b->v[i] = arena_tensor(a, dt, 3, R, nkv, dv, 0);
    if (!backward) {
        b->acc_o = arena_tensor(a, DT_F32, 3, R, nh, dv, 0);
        b->acc_lse = arena_tensor(a, DT_F32, 3, 2 * (int64_t)B, nh, blk, 0);
        b->o_p = arena_tensor(a, dt, 3, H, nh, dv, 0);
        b->lse_p = arena_tensor(a, DT_F32, 3, B, nh, blk, 0);
        return;
    }
    b->o = arena_tensor(a, dt, 3, R, nh, dv, 0);
    b->dout = arena_tensor(a, dt, 3, R, nh, dv, 0);
    b->lse = arena_tensor(a, DT_F32, 3, 2 * (int64_t)B, nh, blk, 0);
    b->dq = arena_tensor(a, DT_F32, 3, R, nh, dqk, 0);
    for (int i = 0; i < 2; i++) {
        b->dkv[i][0] = arena_tensor(a, DT_F32, 3, R, nkv, dqk, 0);
        b->dkv[i][1] = arena_tensor(a, DT_F32, 3, R, nkv, dv, 0);
    }
    b->hop[0] = arena_tensor(a, DT_F32, 3, R, nkv, dqk, 0);
    b->hop[1] = arena_tensor(a, DT_F32, 3, R, nkv, dv, 0);
    b->dq_p = arena_tensor(a, dt, 3, H, nh, dqk, 0);
    b->dk_p = arena_tensor(a, dt, 3, H, nkv, dqk, 0);
    b->dv_p = arena_tensor(a, dt, 3, H, nkv, dv, 0);
}

size_t ring_bytes(Device dev, DType dt, int B, int blk, int nh, int nkv, int dqk, int dv) {
    size_t most = 0;
    for (int backward = 0; backward < 2; backward++) {
        Arena count = arena_counting("ring attention", dev);
        RingBufs b;
        ring_alloc(&b, &count, dt, B, blk, nh, nkv, dqk, dv, backward);
        if (count.peak > most) most = count.peak;
    }
    return most + ARENA_ALIGN;
}

void ring_init(Ring *r, const Comm *cp, Device dev, size_t bytes) {
    CHECK(cp->size >= 2);
    r->cp = cp;
    r->mem = arena_create("ring attention", dev, bytes);
}

void ring_free(Ring *r) {
    if (r->mem.cap) arena_destroy(&r->mem);
    memset(r, 0, sizeof *r);
}

// Half h of a half-major tensor: B·blk rows (B rows of a half-major lse (2B, nh, blk)).
static Tensor half(Tensor x, int h) { return tensor_rows(x, h * (x.n[0] / 2), x.n[0] / 2); }

// The record layout (b, half, i) of rows of any width ↔ half-major (half, b, i).
static void reorder_rows(Tensor rec, Tensor hm, int B, int blk, bool to_rec) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            Tensor x = tensor_rows(rec, (2 * (int64_t)b + h) * blk, blk),
                   y = tensor_rows(hm, ((int64_t)h * B + b) * blk, blk);
            if (to_rec) op_copy(x, y);
            else op_copy(y, x);
        }
}

// lse: (B, nh, 2·blk) ↔ half-major (2B, nh, blk).
static void reorder_lse(Tensor rec, Tensor hm, int B, int blk, bool to_rec) {
    int64_t nh = hm.n[1];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            Tensor x = tensor_reshape2(tensor_rows(rec, b, 1), nh, 2 * (int64_t)blk),
                   y = tensor_reshape2(tensor_rows(hm, (int64_t)h * B + b, 1), nh, blk);
            if (to_rec) op_copy_cols(x, (int64_t)h * blk, y, 0, blk, false);
            else op_copy_cols(y, 0, x, (int64_t)h * blk, blk, false);
        }
}

// acc (fp32) += x (the compute dtype), same shape.
static void add_into(Tensor acc, Tensor x) {
    op_copy_cols(tensor_reshape2(acc, acc.n[0], t_cols(acc)), 0, tensor_reshape2(x, x.n[0], t_cols(x)), 0, t_cols(x),
                 true);
}

// The chunk index of half h on cp rank r.
static int chunk_of(int r, int cp, int h) { return h == 0 ? r : 2 * cp - 1 - r; }

// Posts a and b to rank + 1 and their successors' data into a_in, b_in from rank − 1: one exchange.
static CommReq ring_post(const Comm *c, Tensor a, Tensor b, Tensor a_in, Tensor b_in) {
    int to = (c->rank + 1) % c->size, from = (c->rank + c->size - 1) % c->size;
    return comm_p2p_start(c, (CommP2p[]){{true, a, to}, {true, b, to}, {false, a_in, from}, {false, b_in, from}}, 4);
}

// The visible blocks of hop s: for each, the attention arguments and the query and key halves.
typedef struct {
    int n, hq[3], hk[3];
    AttnArgs args[3];
} HopBlocks;

static HopBlocks hop_blocks(const Comm *c, int s, const AttnArgs *a) {
    HopBlocks hb = {0};
    int cp = c->size, r = c->rank, j = ((r - s) % cp + cp) % cp;
    for (int hq = 0; hq < 2; hq++)
        for (int hk = 0; hk < 2; hk++) {
            int cq = chunk_of(r, cp, hq), ck = chunk_of(j, cp, hk);
            if (cq < ck) continue;
            CHECK(hb.n < 3);
            hb.hq[hb.n] = hq, hb.hk[hb.n] = hk;
            hb.args[hb.n++] = (AttnArgs){.B = a->B, .scale = a->scale, .causal = cq == ck};
        }
    return hb;
}

static int ring_blk(const Tensor q, const AttnArgs *a) {
    CHECK(a->causal && !a->window && !a->sinks.p && !a->q_off && !a->k_off && a->B >= 1);
    CHECK(q.n[0] % (2 * a->B) == 0);
    return (int)(q.n[0] / (2 * a->B));
}

void ring_attention_forward(Ring *R, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    const Comm *c = R->cp;
    int B = a->B, blk = ring_blk(q, a), cur = 0;
    arena_reset(&R->mem, 0);
    RingBufs b;
    ring_alloc(&b, &R->mem, q.dt, B, blk, q.n[1], k.n[1], q.n[2], v.n[2], false);
    reorder_rows(q, b.q, B, blk, false), reorder_rows(k, b.k[0], B, blk, false), reorder_rows(v, b.v[0], B, blk, false);
    bool seen[2] = {false, false};
    for (int s = 0; s < c->size; s++) {
        bool more = s < c->size - 1;
        CommReq req = {0};
        if (more) {
            op_copy(b.k[2], b.k[cur]), op_copy(b.v[2], b.v[cur]);
            req = ring_post(c, b.k[2], b.v[2], b.k[1 - cur], b.v[1 - cur]);
        }
        HopBlocks hb = hop_blocks(c, s, a);
        for (int i = 0; i < hb.n; i++) {
            int hq = hb.hq[i], hk = hb.hk[i];
            op_attention_forward(b.o_p, b.lse_p, half(b.q, hq), half(b.k[cur], hk), half(b.v[cur], hk), &hb.args[i]);
            op_attention_merge(half(b.acc_o, hq), half(b.acc_lse, hq), b.o_p, b.lse_p, B, !seen[hq]);
            seen[hq] = true;
        }
        if (more) comm_wait(&req), cur = 1 - cur;
    }
    reorder_rows(o, b.acc_o, B, blk, true), reorder_lse(lse, b.acc_lse, B, blk, true);
}

void ring_attention_backward(Ring *R, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a) {
    const Comm *c = R->cp;
    int B = a->B, blk = ring_blk(q, a), cur = 0, acc = 0;
    arena_reset(&R->mem, 0);
    RingBufs b;
    ring_alloc(&b, &R->mem, q.dt, B, blk, q.n[1], k.n[1], q.n[2], v.n[2], true);
    reorder_rows(q, b.q, B, blk, false), reorder_rows(k, b.k[0], B, blk, false), reorder_rows(v, b.v[0], B, blk, false);
    reorder_rows(o, b.o, B, blk, false), reorder_rows(dout, b.dout, B, blk, false);
    reorder_lse(lse, b.lse, B, blk, false);
    op_zero(b.dq);
    CommReq home = {0}; // the dK/dV accumulator on its way round
    for (int s = 0; s < c->size; s++) {
        bool more = s < c->size - 1;
        CommReq req = {0};
        if (more) {
            op_copy(b.k[2], b.k[cur]), op_copy(b.v[2], b.v[cur]);
            req = ring_post(c, b.k[2], b.v[2], b.k[1 - cur], b.v[1 - cur]);
        }
        // Hop 0 adds straight into the accumulator that will leave; later hops into hop[] while the
        // accumulator of the resident K/V is still arriving.
        Tensor *g = s == 0 ? b.dkv[acc] : b.hop;
        op_zero(g[0]), op_zero(g[1]);
        HopBlocks hb = hop_blocks(c, s, a);
        for (int i = 0; i < hb.n; i++) {
            int hq = hb.hq[i], hk = hb.hk[i];
            op_attention_backward(b.dq_p, b.dk_p, b.dv_p, (Tensor){0}, half(b.dout, hq), half(b.q, hq),
                                  half(b.k[cur], hk), half(b.v[cur], hk), half(b.o, hq), half(b.lse, hq), &hb.args[i]);
            add_into(half(b.dq, hq), b.dq_p);
            add_into(half(g[0], hk), b.dk_p), add_into(half(g[1], hk), b.dv_p);
        }
        if (s > 0) { // the resident K/V's accumulator has arrived in dkv[acc]
            comm_wait(&home);
            op_add(b.dkv[acc][0], b.hop[0]), op_add(b.dkv[acc][1], b.hop[1]);
        }
        home = ring_post(c, b.dkv[acc][0], b.dkv[acc][1], b.dkv[1 - acc][0], b.dkv[1 - acc][1]);
        acc = 1 - acc;
        if (more) comm_wait(&req), cur = 1 - cur;
    }
    comm_wait(&home); // after cp hops this rank's own accumulator is back, in dkv[acc]
    reorder_rows(dq, b.dq, B, blk, true);
    reorder_rows(dk, b.dkv[acc][0], B, blk, true), reorder_rows(dv, b.dkv[acc][1], B, blk, true);
}
