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
    int B, blk;
    Tensor docpos;           // half-major AttnArgs.docpos (R) int32 (document masking; else p NULL)
    Tensor q, a[3], b[3];    // half-major q; what travels (k and v, or MLA's latent c and k_pe): resident and arriving
                             // (0, 1 alternate), leaving (2)
    Tensor k, v;             // the resident keys and values (MLA: made from the latent each hop; else a, b)
    Tensor kv;               // MLA: (R, nh, dn + dv) kv_b_proj's output
    Tensor acc_o, acc_lse;   // forward: fp32 (2B·blk, nh, dv), (2B, nh, blk)
    Tensor o_p, lse_p;       // forward: one block's (B·blk, nh, dv), (B, nh, blk)
    Tensor o, dout, lse;     // backward: half-major copies of the forward's o, the output gradient and lse
    Tensor dq;               // backward: fp32
    Tensor gk, gv;           // backward: this hop's dK, dV of the resident keys and values, fp32
    Tensor dkv, dc;          // backward, MLA: [dk_nope | dv] (compute dtype), the latent's gradient dkv·wkvb
    Tensor ga, gb;           // backward: this hop's gradient of what travels, fp32 (gk, gv without MLA)
    Tensor home[2][2];       // backward: two accumulators of that gradient, fp32, travelling one hop behind
    Tensor dq_p, dk_p, dv_p; // backward: one block's gradients
} RingBufs;

// The shapes of one call: B sequences of 2·blk local rows, nh query and nkv kv heads of dims dqk and dv; with dc > 0
// multi-head latent attention (nkv = nh) whose latent has dc columns and k_pe dqk − dn.
typedef struct {
    DType dt;
    int B, blk;
    int64_t nh, nkv, dqk, dv, dc, dn;
} RingShape;

static void ring_alloc(RingBufs *b, Arena *a, const RingShape *z, bool backward) {
    memset(b, 0, sizeof *b);
    DType dt = z->dt;
    int64_t R = 2 * (int64_t)z->B * z->blk, H = (int64_t)z->B * z->blk, nh = z->nh, nkv = z->nkv, dqk = z->dqk,
            dv = z->dv, dr = dqk - z->dn;
    b->B = z->B, b->blk = z->blk;
    b->docpos = arena_tensor(a, DT_I32, 1, R, 0, 0, 0);
    b->q = arena_tensor(a, dt, 3, R, nh, dqk, 0);
    for (int i = 0; i < 3; i++) {
        b->a[i] = z->dc ? arena_tensor(a, dt, 2, R, z->dc, 0, 0) : arena_tensor(a, dt, 3, R, nkv, dqk, 0);
        b->b[i] = z->dc ? arena_tensor(a, dt, 2, R, dr, 0, 0) : arena_tensor(a, dt, 3, R, nkv, dv, 0);
    }
    if (z->dc) {
        b->k = arena_tensor(a, dt, 3, R, nh, dqk, 0), b->v = arena_tensor(a, dt, 3, R, nh, dv, 0);
        b->kv = arena_tensor(a, dt, 3, R, nh, z->dn + dv, 0);
    }
    if (!backward) {
        b->acc_o = arena_tensor(a, DT_F32, 3, R, nh, dv, 0);
        b->acc_lse = arena_tensor(a, DT_F32, 3, 2 * (int64_t)z->B, nh, z->blk, 0);
        b->o_p = arena_tensor(a, dt, 3, H, nh, dv, 0);
        b->lse_p = arena_tensor(a, DT_F32, 3, z->B, nh, z->blk, 0);
        return;
    }
    b->o = arena_tensor(a, dt, 3, R, nh, dv, 0);
    b->dout = arena_tensor(a, dt, 3, R, nh, dv, 0);
    b->lse = arena_tensor(a, DT_F32, 3, 2 * (int64_t)z->B, nh, z->blk, 0);
    b->dq = arena_tensor(a, DT_F32, 3, R, nh, dqk, 0);
    b->gk = arena_tensor(a, DT_F32, 3, R, nkv, dqk, 0), b->gv = arena_tensor(a, DT_F32, 3, R, nkv, dv, 0);
    b->ga = b->gk, b->gb = b->gv;
    if (z->dc) {
        b->dkv = arena_tensor(a, dt, 3, R, nh, z->dn + dv, 0), b->dc = arena_tensor(a, dt, 2, R, z->dc, 0, 0);
        b->ga = arena_tensor(a, DT_F32, 2, R, z->dc, 0, 0), b->gb = arena_tensor(a, DT_F32, 2, R, dr, 0, 0);
    }
    for (int i = 0; i < 2; i++) {
        b->home[i][0] = arena_tensor(a, DT_F32, b->ga.nd, R, b->ga.n[1], b->ga.n[2], 0);
        b->home[i][1] = arena_tensor(a, DT_F32, b->gb.nd, R, b->gb.n[1], b->gb.n[2], 0);
    }
    b->dq_p = arena_tensor(a, dt, 3, H, nh, dqk, 0);
    b->dk_p = arena_tensor(a, dt, 3, H, nkv, dqk, 0);
    b->dv_p = arena_tensor(a, dt, 3, H, nkv, dv, 0);
}

size_t ring_bytes(Device dev, DType dt, int B, int blk, int nh, int nkv, int dqk, int dv, int dc, int dn) {
    RingShape z = {dt, B, blk, nh, nkv, dqk, dv, dc, dn};
    size_t most = 0;
    for (int backward = 0; backward < 2; backward++) {
        Arena count = arena_counting("ring attention", dev);
        RingBufs b;
        ring_alloc(&b, &count, &z, backward);
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

// The record layout (b, half, i) ↔ half-major (half, b, i): columns [col, col + n) of rec's rows (n = −1: all of
// them) ↔ hm's rows.
static void reorder(Tensor rec, int col, int64_t n, Tensor hm, int B, int blk, bool to_rec) {
    Tensor r2 = tensor_reshape2(rec, rec.n[0], t_cols(rec)), h2 = tensor_reshape2(hm, hm.n[0], t_cols(hm));
    if (n < 0) n = t_cols(hm);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            Tensor x = tensor_rows(r2, (2 * (int64_t)b + h) * blk, blk),
                   y = tensor_rows(h2, ((int64_t)h * B + b) * blk, blk);
            if (to_rec) op_copy_cols(x, col, y, 0, n, false);
            else op_copy_cols(y, 0, x, col, n, false);
        }
}
static void reorder_rows(Tensor rec, Tensor hm, int B, int blk, bool to_rec) {
    reorder(rec, 0, -1, hm, B, blk, to_rec);
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

// Under document masking (docpos: half-major, p NULL: off) a block takes its query half's document positions and
// its chunks' global offsets, which the mask compares.
static HopBlocks hop_blocks(const Comm *c, int s, const AttnArgs *a, Tensor docpos) {
    HopBlocks hb = {0};
    int cp = c->size, r = c->rank, j = ((r - s) % cp + cp) % cp;
    for (int hq = 0; hq < 2; hq++)
        for (int hk = 0; hk < 2; hk++) {
            int cq = chunk_of(r, cp, hq), ck = chunk_of(j, cp, hk);
            if (cq < ck) continue;
            CHECK(hb.n < 3);
            hb.hq[hb.n] = hq, hb.hk[hb.n] = hk;
            AttnArgs *b = &hb.args[hb.n++];
            *b = (AttnArgs){.B = a->B, .scale = a->scale, .causal = cq == ck};
            if (docpos.p) {
                int blk = (int)(docpos.n[0] / (2 * a->B));
                b->docpos = half(docpos, hq), b->q_off = cq * blk, b->k_off = ck * blk;
            }
        }
    return hb;
}

// The half-major copy of a->docpos (its record rows (b, half, i)), or p NULL without document masking.
static Tensor docpos_in(RingBufs *b, const AttnArgs *a) {
    if (!a->docpos.p) return (Tensor){0};
    for (int s = 0; s < b->B; s++)
        for (int h = 0; h < 2; h++)
            op_copy(tensor_rows(b->docpos, ((int64_t)h * b->B + s) * b->blk, b->blk),
                    tensor_rows(a->docpos, (2 * (int64_t)s + h) * b->blk, b->blk));
    return b->docpos;
}

static int ring_blk(const Tensor q, const AttnArgs *a) {
    CHECK(a->causal && !a->window && !a->sinks.p && !a->q_off && !a->k_off && a->B >= 1);
    CHECK(q.n[0] % (2 * a->B) == 0 && (!a->docpos.p || a->docpos.n[0] == q.n[0]));
    return (int)(q.n[0] / (2 * a->B));
}

// The resident keys and values of the pair in slot cur: the pair itself, or (MLA) made from the latent.
static void resident(RingBufs *b, int cur, const RingLatent *ml) {
    if (!ml) b->k = b->a[cur], b->v = b->b[cur];
    else ml->decompress(ml, b->a[cur], b->b[cur], 0, b->kv, b->k, b->v);
}

// Posts the resident pair (through the leaving copy) to rank + 1 and the next one into the arriving slot.
static CommReq pass_on(const Comm *c, RingBufs *b, int cur) {
    op_copy(b->a[2], b->a[cur]), op_copy(b->b[2], b->b[cur]);
    return ring_post(c, b->a[2], b->b[2], b->a[1 - cur], b->b[1 - cur]);
}

static void forward(Ring *R, Tensor o, Tensor lse, Tensor q, const RingShape *z, const RingLatent *ml,
                    const AttnArgs *a, RingBufs *b) {
    const Comm *c = R->cp;
    int B = z->B, blk = z->blk, cur = 0;
    bool seen[2] = {false, false};
    Tensor docpos = docpos_in(b, a);
    for (int s = 0; s < c->size; s++) {
        bool more = s < c->size - 1;
        CommReq req = more ? pass_on(c, b, cur) : (CommReq){0};
        resident(b, cur, ml);
        HopBlocks hb = hop_blocks(c, s, a, docpos);
        for (int i = 0; i < hb.n; i++) {
            int hq = hb.hq[i], hk = hb.hk[i];
            op_attention_forward(b->o_p, b->lse_p, half(b->q, hq), half(b->k, hk), half(b->v, hk), &hb.args[i]);
            op_attention_merge(half(b->acc_o, hq), half(b->acc_lse, hq), b->o_p, b->lse_p, B, !seen[hq]);
            seen[hq] = true;
        }
        if (more) comm_wait(&req), cur = 1 - cur;
    }
    reorder_rows(o, b->acc_o, B, blk, true), reorder_lse(lse, b->acc_lse, B, blk, true);
}

// The backward's hops; afterwards b->home[returned index] holds this rank's gradient of what travelled.
static int backward(Ring *R, Tensor dq, Tensor dout, Tensor o, Tensor lse, const RingShape *z, const RingLatent *ml,
                    const AttnArgs *a, RingBufs *b) {
    const Comm *c = R->cp;
    int B = z->B, blk = z->blk, cur = 0, acc = 0;
    reorder_rows(o, b->o, B, blk, false), reorder_rows(dout, b->dout, B, blk, false);
    reorder_lse(lse, b->lse, B, blk, false);
    op_zero(b->dq);
    Tensor docpos = docpos_in(b, a);
    CommReq home = {0}; // the gradient accumulator on its way round
    for (int s = 0; s < c->size; s++) {
        bool more = s < c->size - 1;
        CommReq req = more ? pass_on(c, b, cur) : (CommReq){0};
        resident(b, cur, ml); // MLA recomputes this hop's keys and values
        op_zero(b->gk), op_zero(b->gv);
        HopBlocks hb = hop_blocks(c, s, a, docpos);
        for (int i = 0; i < hb.n; i++) {
            int hq = hb.hq[i], hk = hb.hk[i];
            op_attention_backward(b->dq_p, b->dk_p, b->dv_p, (Tensor){0}, half(b->dout, hq), half(b->q, hq),
                                  half(b->k, hk), half(b->v, hk), half(b->o, hq), half(b->lse, hq), &hb.args[i]);
            add_into(half(b->dq, hq), b->dq_p);
            add_into(half(b->gk, hk), b->dk_p), add_into(half(b->gv, hk), b->dv_p);
        }
        if (ml) { // back through the decompression: the latent's gradient, kv_b_proj's weight gradient
            ml->decompress_backward(ml, b->a[cur], b->dc, b->gb, 0, b->dkv, b->gk, b->gv);
            op_copy(b->ga, b->dc);
        }
        if (s == 0) op_copy(b->home[acc][0], b->ga), op_copy(b->home[acc][1], b->gb);
        else { // the resident pair's accumulator has arrived in home[acc]
            comm_wait(&home);
            op_add(b->home[acc][0], b->ga), op_add(b->home[acc][1], b->gb);
        }
        home = ring_post(c, b->home[acc][0], b->home[acc][1], b->home[1 - acc][0], b->home[1 - acc][1]);
        acc = 1 - acc;
        if (more) comm_wait(&req), cur = 1 - cur;
    }
    comm_wait(&home); // after cp hops this rank's own accumulator is back
    reorder_rows(dq, b->dq, B, blk, true);
    return acc;
}

// The shape, this call's buffers, and q with the first travelling pair: k and v, or the latent (c, and k_pe from its
// columns of ml->pe).
static RingShape ring_begin(Ring *R, RingBufs *b, Tensor q, Tensor k, Tensor v, const RingLatent *ml, const AttnArgs *a,
                            bool grad) {
    RingShape z = {q.dt, a->B, ring_blk(q, a), q.n[1], 0, q.n[2], 0, 0, 0};
    if (ml) z.nkv = ml->nh, z.dv = ml->dv, z.dc = ml->c.n[1], z.dn = ml->dn;
    else z.nkv = k.n[1], z.dv = v.n[2];
    arena_reset(&R->mem, 0);
    ring_alloc(b, &R->mem, &z, grad);
    reorder_rows(q, b->q, z.B, z.blk, false);
    reorder_rows(ml ? ml->c : k, b->a[0], z.B, z.blk, false);
    if (ml) reorder(ml->pe, ml->pe_col, ml->dr, b->b[0], z.B, z.blk, false);
    else reorder_rows(v, b->b[0], z.B, z.blk, false);
    return z;
}

void ring_attention_forward(Ring *R, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    RingBufs b;
    RingShape z = ring_begin(R, &b, q, k, v, NULL, a, false);
    forward(R, o, lse, q, &z, NULL, a, &b);
}

void ring_attention_backward(Ring *R, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a) {
    RingBufs b;
    RingShape z = ring_begin(R, &b, q, k, v, NULL, a, true);
    int h = backward(R, dq, dout, o, lse, &z, NULL, a, &b);
    reorder_rows(dk, b.home[h][0], z.B, z.blk, true), reorder_rows(dv, b.home[h][1], z.B, z.blk, true);
}

void ring_mla_forward(Ring *R, Tensor o, Tensor lse, Tensor q, const RingLatent *ml, const AttnArgs *a) {
    RingBufs b;
    RingShape z = ring_begin(R, &b, q, (Tensor){0}, (Tensor){0}, ml, a, false);
    forward(R, o, lse, q, &z, ml, a, &b);
}

void ring_mla_backward(Ring *R, Tensor dq, Tensor dc, Tensor dpe, Tensor dout, Tensor q, Tensor o, Tensor lse,
                       const RingLatent *ml, const AttnArgs *a) {
    RingBufs b;
    RingShape z = ring_begin(R, &b, q, (Tensor){0}, (Tensor){0}, ml, a, true);
    int h = backward(R, dq, dout, o, lse, &z, ml, a, &b);
    reorder_rows(dc, b.home[h][0], z.B, z.blk, true);
    reorder(dpe, ml->pe_col, ml->dr, b.home[h][1], z.B, z.blk, true);
}

// ---- Gated DeltaNet layers: the contiguous layout, the conv halo, the state pass ----

// Chunk c's zigzag holder and the half it sits in there.
static int holder_of(int c, int cp) { return c < cp ? c : 2 * cp - 1 - c; }
static int half_in_holder(int c, int cp) { return c < cp ? 0 : 1; }

// Posts the n transfers of ops (none: nothing) and waits for them.
// dst ← src in the other layout. Both sides go half-major (half, b, i) so a half is one message: zigzag half h holds
// chunk chunk_of(r, cp, h), contiguous slot h chunk 2r + h. Every rank sends its two halves and receives two, in
// increasing chunk order on both ends (two messages between one pair of ranks pair up in that order).
static void relayout(Ring *R, Tensor dst, Tensor src, int B, bool to_contiguous) {
    const Comm *c = R->cp;
    int cp = c->size, r = c->rank, blk = (int)(src.n[0] / (2 * B)), n = 0;
    CHECK(src.n[0] == 2 * (int64_t)B * blk && tensor_numel(dst) == tensor_numel(src));
    Tensor buf[2];
    ring_pair(&R->mem, tensor_reshape2(src, src.n[0], t_cols(src)), buf);
    Tensor out = buf[0], in = buf[1];
    reorder_rows(src, out, B, blk, false);
    CommP2p ops[4];
    for (int h = 0; h < 2; h++) { // my half h: where it goes, where its replacement comes from
        int mine = to_contiguous ? chunk_of(r, cp, h) : 2 * r + h,
            want = to_contiguous ? 2 * r + h : chunk_of(r, cp, h);
        int to = to_contiguous ? mine / 2 : holder_of(mine, cp), from = to_contiguous ? holder_of(want, cp) : want / 2;
        int slot = to_contiguous ? mine % 2 : half_in_holder(mine, cp);
        if (to == r) op_copy(half(in, slot), half(out, h));
        else ops[n++] = (CommP2p){true, half(out, h), to};
        if (from != r) ops[n++] = (CommP2p){false, half(in, h), from};
    }
    comm_exchange(c, ops, n);
    reorder_rows(dst, in, B, blk, true);
}

void ring_to_contiguous(Ring *R, Tensor dst, Tensor src, int B) { relayout(R, dst, src, B, true); }
void ring_to_zigzag(Ring *R, Tensor dst, Tensor src, int B) { relayout(R, dst, src, B, false); }

void ring_halo_forward(Ring *R, Tensor halo, Tensor x, int B) {
    const Comm *c = R->cp;
    int64_t K1 = halo.n[0] / B, S = x.n[0] / B;
    CHECK(halo.n[0] == B * K1 && S >= K1 && t_cols(halo) == t_cols(x));
    Tensor buf[2];
    ring_pair(&R->mem, halo, buf);
    Tensor out = buf[0];
    for (int b = 0; b < B; b++) op_copy(tensor_rows(out, b * K1, K1), tensor_rows(x, b * S + S - K1, K1));
    CommP2p ops[2];
    int n = 0;
    if (c->rank < c->size - 1) ops[n++] = (CommP2p){true, out, c->rank + 1};
    if (c->rank > 0) ops[n++] = (CommP2p){false, halo, c->rank - 1};
    else op_zero(halo); // the sequences' first rows: nothing before them
    comm_exchange(c, ops, n);
}

void ring_halo_backward(Ring *R, Tensor dx, Tensor dhalo, Tensor in, int B) {
    const Comm *c = R->cp;
    int64_t K1 = dhalo.n[0] / B, S = dx.n[0] / B;
    CommP2p ops[2];
    int n = 0;
    if (c->rank > 0) ops[n++] = (CommP2p){true, dhalo, c->rank - 1};
    if (c->rank < c->size - 1) ops[n++] = (CommP2p){false, in, c->rank + 1};
    comm_exchange(c, ops, n);
    if (c->rank < c->size - 1)
        for (int b = 0; b < B; b++) op_add(tensor_rows(dx, b * S + S - K1, K1), tensor_rows(in, b * K1, K1));
}

bool ring_state_recv(Ring *R, Tensor s, bool forward) {
    const Comm *c = R->cp;
    int from = forward ? c->rank - 1 : c->rank + 1;
    if (from < 0 || from >= c->size) return false;
    comm_exchange(c, &(CommP2p){false, s, from}, 1);
    return true;
}

void ring_state_send(Ring *R, Tensor s, bool forward) {
    const Comm *c = R->cp;
    int to = forward ? c->rank + 1 : c->rank - 1;
    if (to >= 0 && to < c->size) comm_exchange(c, &(CommP2p){true, s, to}, 1);
}

void ring_pair(Arena *a, Tensor like, Tensor two[2]) {
    arena_reset(a, 0);
    for (int i = 0; i < 2; i++) two[i] = arena_tensor(a, like.dt, like.nd, like.n[0], like.n[1], like.n[2], like.n[3]);
}

size_t ring_linear_bytes(Device dev, DType dt, int B, int S, int H, int cc, int ck, int64_t state) {
    Arena a = arena_counting("ring attention", dev);
    Tensor two[2];
    ring_pair(&a, tensor_make(NULL, dt, dev, 2, (int64_t)B * S, H, 0, 0), two);         // the layout
    ring_pair(&a, tensor_make(NULL, dt, dev, 2, (int64_t)B * (ck - 1), cc, 0, 0), two); // the halo
    ring_pair(&a, tensor_make(NULL, DT_F32, dev, 2, B, state, 0, 0), two);              // the states
    return a.peak + ARENA_ALIGN;
}

size_t ring_plan_bytes(const RingDims *rd, int H, Device dev, DType dt, int B, int S) {
    size_t att = ring_bytes(dev, dt, B, S / 2, rd->nh, rd->nkv, rd->dqk, rd->dv, rd->dc, rd->dn),
           lin = rd->ck ? ring_linear_bytes(dev, dt, B, S, H, rd->cc, rd->ck, rd->state) : 0;
    return att > lin ? att : lin;
}

const char *ring_check(const RingDims *rd, const char *model_type, int S, int cp, char *buf, size_t n) {
    if (cp == 1) return NULL;
    if (!rd->nh) // GPT-OSS (sliding windows, sinks)
        snprintf(buf, n,
                 "%s does not run under context parallelism (ring attention covers causal softmax attention without "
                 "sliding windows or sinks: qwen3_moe, deepseek_v2, qwen3_5_moe_text)",
                 model_type);
    else if (rd->ck && S / cp < rd->ck - 1) // the conv halo comes from one rank
        snprintf(buf, n,
                 "sequence_length / context_parallel_size = %d / %d rows per rank are fewer than the conv halo's "
                 "linear_conv_kernel_dim − 1 = %d",
                 S, cp, rd->ck - 1);
    else return NULL;
    return buf;
}
