// ep.c — dispatch and combine (see ep.h).
// One rank: a stable sort of the T·k (token, slot) pairs by expert, a gather of the token rows into
// expert order (stage 2), and the inverse scatter of the expert outputs back to slot order (stage 4).
// Several ranks (P = ep size, rank g holds experts [g·E_l, (g+1)·E_l)), docs/reference.md §12, done on the host:
//   sender    slots sorted by global expert = by (destination rank, local expert, token); each token's row
//             is sent once per destination (deduplicated, token order) and each slot carries the index of
//             its token's row among those sent to its destination (`expand`);
//   counts    a small all-to-all of (E_l + 1) counts per peer: slots per local expert, token rows;
//   receiver  rows in "received-slot order" (by source, then local expert, then the sender's order) are
//             regrouped into expert order (by local expert, then source): xe[i] = received row xrow[i].
//   combine   the inverse: expert outputs back to received-slot order, all-to-all back (every slot, not
//             deduplicated), scattered into slot order t·k + j on the token's rank; weighting is stage 5's.
// Backward: combine⁻¹ is a dispatch of the output gradients in slot order; dispatch⁻¹ sums each received
// token row's slot gradients, returns the sums, and adds them into the token rows (a token sent to several
// ranks receives the sum over them). Orders are deterministic (no atomics), so results are reproducible.
#include "model/ep.h"

#include <math.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int64_t ep_rows_worst(const Model *m, int64_t T) {
    int64_t k = m->cfg.topk, P = m->cfg.ep_size;
    return P * T * min64(k, model_experts_local(&m->cfg)); // a token brings ≤ min(k, E_l) slots to a rank, every rank T
}

int64_t ep_rows_capacity(const Model *m, int64_t T) {
    int64_t worst = ep_rows_worst(m, T);
    if (m->cfg.ep_size > 1 && m->ep_capacity > 0)
        return min64(worst, (int64_t)ceil(m->ep_capacity * (double)(T * m->cfg.topk)));
    return worst;
}

bool ep_spills(const Model *m, int64_t T) {
    return m->cfg.ep_size > 1 && !m->ep_drop && ep_rows_capacity(m, T) < ep_rows_worst(m, T);
}

EpRoute *ep_route_create(Model *m, EpBuffers *buf) {
    if (m->cfg.ep_size == 1) return NULL;
    CHECK(m->ep && m->ep->size == m->cfg.ep_size && m->ep->rank == m->cfg.ep_rank);
    EpRoute *r = xcalloc(1, sizeof *r);
    int64_t P = m->cfg.ep_size;
    r->buf = buf;
    r->send_tok = xcalloc(4 * P, sizeof(int64_t));
    r->recv_tok = r->send_tok + P, r->send_slot = r->recv_tok + P, r->recv_slot = r->send_slot + P;
    return r;
}

void ep_route_free(EpRoute *r) {
    if (r) free(r->send_tok), free(r);
}

void ep_buffers_alloc(Model *m, EpBuffers *b, Arena *comm, int64_t T) {
    memset(b, 0, sizeof *b);
    if (m->cfg.ep_size == 1) return;
    int64_t k = m->cfg.topk, P = m->cfg.ep_size, E = m->cfg.experts, El = model_experts_local(&m->cfg),
            worst = ep_rows_worst(m, T);
    // Rows in transit can exceed the capacity (received above it, or returned by a rank that dropped some):
    // the buffers take the worst case of one layer, ≥ T·k (shared by every layer, so small beside the records).
    int64_t rows = max64(T * k, worst);
    b->T = T, b->cap = ep_rows_capacity(m, T), b->drop = m->ep_drop;
    b->sbuf = arena_tensor(comm, m->cdt, 2, rows, m->cfg.hidden, 0, 0);
    b->rbuf = arena_tensor(comm, m->cdt, 2, rows, m->cfg.hidden, 0, 0);
    b->idx = xmalloc(T * k * sizeof(int32_t)), b->perm = xmalloc(T * k * sizeof(int32_t)),
    b->expand = xmalloc(T * k * sizeof(int32_t));
    b->dpos = xmalloc(T * P * sizeof(int32_t)), b->send_idx = xmalloc(T * min64(k, P) * sizeof(int32_t));
    b->expand_r = xmalloc(worst * sizeof(int32_t) + 1), b->perm_r = xmalloc(worst * sizeof(int32_t) + 1),
    b->xrow = xmalloc(worst * sizeof(int32_t) + 1);
    b->goffs = xmalloc((E + 1) * sizeof(int64_t)), b->cur = xmalloc((E + P + 1) * sizeof(int64_t));
    b->meta_s = xmalloc(P * (El + 1) * sizeof(int64_t)), b->meta_r = xmalloc(P * (El + 1) * sizeof(int64_t));
    b->loffs = xmalloc((El + 1) * sizeof(int64_t));
}

void ep_buffers_free(EpBuffers *b) {
    free(b->idx), free(b->perm), free(b->expand), free(b->dpos), free(b->send_idx), free(b->expand_r), free(b->perm_r),
        free(b->xrow);
    free(b->goffs), free(b->cur), free(b->meta_s), free(b->meta_r), free(b->loffs);
    memset(b, 0, sizeof *b);
}

void ep_alloc(Model *m, StageIO *io, Arena *a, int64_t T) {
    int64_t H = m->cfg.hidden, k = m->cfg.topk, P = m->cfg.ep_size;
    if (io->dense) {
        io->xe = io->xd;
        io->ye = arena_tensor(a, m->cdt, 2, T, H, 0, 0);
        io->y = io->ye;
        return;
    }
    int64_t R = ep_rows_capacity(m, T);
    io->perm = arena_tensor(a, DT_I32, 1, T * k, 0, 0, 0);
    if (!io->route) io->at = arena_tensor(a, DT_I32, 1, T * k, 0, 0, 0);
    if (!moe_stage3_gathers(m, io)) io->xe = arena_tensor(a, m->cdt, 2, R, H, 0, 0);         // else the GEMMs read xd
    if (!(m->recompute & RC_EXPERT_OUT)) io->y = arena_tensor(a, m->cdt, 2, T * k, H, 0, 0); // else staging
    if (io->route) {
        io->route->send_idx = arena_tensor(a, DT_I32, 1, T * min64(k, P), 0, 0, 0);
        io->route->perm_r = arena_tensor(a, DT_I32, 1, R, 0, 0, 0);
        io->route->xrow = arena_tensor(a, DT_I32, 1, R, 0, 0, 0);
    }
}

void ep_grad_alloc(Model *m, StageIO *io, Arena *ws, int64_t T) {
    int64_t H = m->cfg.hidden, k = m->cfg.topk;
    if (io->dense) {
        io->dy = arena_tensor(ws, m->cdt, 2, T, H, 0, 0);
        io->dye = io->dy;
        io->dxe = arena_tensor(ws, m->cdt, 2, T, H, 0, 0);
        io->dxd = io->dxe;
        return;
    }
    // the rows stage 3 holds: the layer's own, or the spill set's
    int64_t R = moe_stage3_gathers(m, io) ? T * k : io->xe.n[0];
    io->dye = arena_tensor(ws, m->cdt, 2, R, H, 0, 0);
    io->dy = io->route ? arena_tensor(ws, m->cdt, 2, T * k, H, 0, 0) : io->dye; // one rank: written in expert order
    io->dxe = arena_tensor(ws, m->cdt, 2, R, H, 0, 0);
    io->dxd = arena_tensor(ws, m->cdt, 2, T, H, 0, 0);
}

static Tensor host_i32(int32_t *p, int64_t n) { return tensor_make(p, DT_I32, DEV_CPU, 1, n, 1, 1, 1); }
static Tensor host_i64(int64_t *p, int64_t n) { return tensor_make(p, DT_I64, DEV_CPU, 1, n, 1, 1, 1); }
static int64_t sum(const int64_t *x, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

// Row moves that may be empty on a rank (the ops want at least one row).
static void gather(Tensor y, Tensor x, Tensor rows) {
    if (y.n[0]) op_gather_rows(y, x, rows, 1);
}
static void scatter(Tensor y, Tensor x, Tensor rows) {
    if (x.n[0]) op_scatter_rows(y, x, rows);
}
static void scatter_add(Tensor dx, Tensor dy, Tensor rows) {
    if (dy.n[0]) op_scatter_add_rows(dx, dy, rows, 1);
}

// Keeps `cap` of the R expert-ordered rows (offs: E_l + 1 bounds), dropping the same share of every expert's
// largest excess: each expert keeps min(n_e, q) rows, q the largest quota that fits, and the first experts
// still above it one row more until cap rows are kept; an expert keeps its first rows (source, then order).
// perm_r and xrow are compacted to the kept rows, offs to their bounds.
static void drop_rows(EpBuffers *b, int64_t *offs, int64_t El, int64_t cap) {
    int64_t q = 0, kept = 0, *cnt = b->cur;          // cnt: (E_l) rows each expert keeps
    for (int64_t lo = 0, hi = offs[El]; lo <= hi;) { // the largest q with Σ min(n_e, q) ≤ cap
        int64_t mid = (lo + hi) / 2, s = 0;
        for (int64_t e = 0; e < El; e++) s += min64(offs[e + 1] - offs[e], mid);
        if (s <= cap) q = mid, kept = s, lo = mid + 1;
        else hi = mid - 1;
    }
    for (int64_t e = 0; e < El; e++) {
        cnt[e] = min64(offs[e + 1] - offs[e], q);
        if (kept < cap && offs[e + 1] - offs[e] > q) cnt[e]++, kept++;
    }
    int64_t o = 0;
    for (int64_t e = 0; e < El; e++) {
        for (int64_t i = offs[e]; i < offs[e] + cnt[e]; i++, o++) b->perm_r[o] = b->perm_r[i], b->xrow[o] = b->xrow[i];
        offs[e] = o - cnt[e];
    }
    offs[El] = o;
}

// Builds the route from idx on the host (the one host sync of the layer): the slot sort, deduplication,
// the counts all-to-all and the expert order; and, with a capacity below the worst case, whether any rank
// of the group received more rows than it (r->spill, one small all-reduce) or which rows to drop. The local
// experts' offsets go to the device (io->offs), their last to io->rows.
static void route_ranks(Model *m, StageIO *io) {
    EpRoute *r = io->route;
    EpBuffers *b = r->buf;
    const Comm *c = m->ep;
    int P = c->size;
    int64_t T = io->idx.n[0], k = m->cfg.topk, E = m->cfg.experts, El = model_experts_local(&m->cfg), n = T * k;
    CHECK(T == b->T);
    op_copy(host_i32(b->idx, n), io->idx);
    // Stable counting sort of the slots by global expert: perm lists slot ids, goffs bounds each expert.
    for (int64_t e = 0; e <= E; e++) b->goffs[e] = 0;
    for (int64_t s = 0; s < n; s++) b->goffs[b->idx[s] + 1]++;
    for (int64_t e = 0; e < E; e++) b->goffs[e + 1] += b->goffs[e];
    for (int64_t e = 0; e < E; e++) b->cur[e] = b->goffs[e];
    for (int64_t s = 0; s < n; s++) b->perm[b->cur[b->idx[s]]++] = (int32_t)s;
    // Deduplication: token t goes to rank g once when any of its experts lives there (first visit counts).
    for (int g = 0; g < P; g++) r->send_tok[g] = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) // rows for rank g start at cur[P + g]; cur[g] is the next free one
            for (int g = 0, o = 0; g < P; o += (int)r->send_tok[g], g++) b->cur[g] = b->cur[P + g] = o;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) {
                int g = b->idx[t * k + j] / (int)El;
                bool first = true;
                for (int64_t i = 0; i < j; i++) first &= b->idx[t * k + i] / (int)El != g;
                if (!first) continue;
                if (pass == 0) r->send_tok[g]++;
                else b->dpos[t * P + g] = (int32_t)(b->cur[g] - b->cur[P + g]), b->send_idx[b->cur[g]++] = (int32_t)t;
            }
    }
    // Each slot (in sorted order) carries its token's row index among the rows sent to its rank.
    for (int64_t p = 0; p < n; p++) {
        int32_t s = b->perm[p];
        b->expand[p] = b->dpos[(s / k) * P + b->idx[s] / El];
    }
    for (int g = 0; g < P; g++) {
        for (int64_t e = 0; e < El; e++) b->meta_s[g * (El + 1) + e] = b->goffs[g * El + e + 1] - b->goffs[g * El + e];
        b->meta_s[g * (El + 1) + El] = r->send_tok[g];
        r->send_slot[g] = b->goffs[(g + 1) * El] - b->goffs[g * El];
    }
    comm_alltoall(c, host_i64(b->meta_r, P * (El + 1)), host_i64(b->meta_s, P * (El + 1)));
    for (int s = 0; s < P; s++)
        r->recv_slot[s] = sum(b->meta_r + s * (El + 1), (int)El), r->recv_tok[s] = b->meta_r[s * (El + 1) + El];
    int64_t R = sum(r->recv_slot, P);
    comm_alltoallv(c, host_i32(b->expand_r, R), r->recv_slot, host_i32(b->expand, n), r->send_slot);
    // Expert order: by local expert, then source rank, then the source's order.
    int64_t *qcur = b->cur, *tbase = b->cur + P; // per source: next received-slot position; first token row
    for (int s = 0, q = 0, t0 = 0; s < P; q += (int)r->recv_slot[s], t0 += (int)r->recv_tok[s], s++)
        qcur[s] = q, tbase[s] = t0;
    int64_t i = 0, *offs = b->loffs;
    offs[0] = 0;
    for (int64_t e = 0; e < El; e++) {
        for (int s = 0; s < P; s++)
            for (int64_t cnt = b->meta_r[s * (El + 1) + e]; cnt > 0; cnt--, i++) {
                int64_t q = qcur[s]++;
                b->perm_r[i] = (int32_t)q;
                b->xrow[i] = (int32_t)(tbase[s] + b->expand_r[q]);
            }
        offs[e + 1] = i;
    }
    CHECK(i == R);
    // Rows above the capacity: dropped here (parallel.ep_drop_tokens), or the whole group runs this layer's
    // stage 3 on the spill set when any rank has them (the spill is recomputed in backward, which is collective).
    r->rows = R, r->over = R > b->cap ? R - b->cap : 0, r->spill = false;
    if (b->drop && r->over) drop_rows(b, offs, El, b->cap);
    io->rows = offs[El];
    op_copy(io->offs, host_i64(offs, El + 1));
    if (!b->drop && b->cap < ep_rows_worst(m, T)) {
        double over = (double)r->over;
        comm_allreduce(c, tensor_make(&over, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_SUM);
        r->spill = over > 0;
    }
}

void ep_dispatch_route(Model *m, StageIO *io) {
    if (io->dense) return;
    if (io->route) return route_ranks(m, io);
    op_moe_sort(io->perm, io->at, io->offs, io->idx, m->cfg.experts);
    io->rows = tensor_numel(io->idx);
}

// One rank: the combine and its backward read and write the expert-ordered rows through io->at, so they move nothing.
static void local_move(Model *m, StageIO *io, EpMove mv) {
    switch (mv) {
    case EP_DISPATCH:
        if (!moe_stage3_gathers(m, io)) op_gather_rows(io->xe, io->xd, io->perm, m->cfg.topk); // else in stage 3
        return;
    case EP_COMBINE:
    case EP_COMBINE_BACKWARD: return;
    case EP_DISPATCH_BACKWARD: return op_scatter_add_rows(io->dxd, io->dxe, io->perm, m->cfg.topk);
    }
}

// Each move packs the send buffer and posts its all-to-all (issue), then waits and unpacks (finish); with
// one ep rank issue is the whole local move. Row counts per peer: the route's; stage 3 holds the kept rows
// (io->rows: all R received unless some were dropped, whose outputs return as zeros).
void ep_issue(Model *m, StageIO *io, EpMove mv) {
    if (io->dense) return;
    EpRoute *r = io->route;
    if (mv == EP_DISPATCH_BACKWARD) op_zero(io->dxd);
    if (!r) return local_move(m, io, mv);
    EpBuffers *b = r->buf;
    int P = m->ep->size;
    int64_t R = sum(r->recv_slot, P), ntok = sum(r->recv_tok, P), nsend = sum(r->send_tok, P), n = io->perm.n[0],
            kept = io->rows;
    CHECK(!r->pending && kept <= io->xe.n[0]);
    const int64_t *out_rows = r->recv_tok, *in_rows = r->send_tok;
    switch (mv) {
    case EP_DISPATCH: // every token row once per destination, regrouped into expert order on arrival
        op_copy(io->perm, host_i32(b->perm, n));
        op_copy(tensor_rows(r->send_idx, 0, nsend), host_i32(b->send_idx, nsend));
        op_copy(tensor_rows(r->perm_r, 0, kept), host_i32(b->perm_r, kept));
        op_copy(tensor_rows(r->xrow, 0, kept), host_i32(b->xrow, kept));
        gather(tensor_rows(b->sbuf, 0, nsend), io->xd, tensor_rows(r->send_idx, 0, nsend));
        break;
    case EP_COMBINE:
        if (kept < R) op_zero(tensor_rows(b->sbuf, 0, R)); // dropped rows return zeros
        scatter(tensor_rows(b->sbuf, 0, R), tensor_rows(io->ye, 0, kept), tensor_rows(r->perm_r, 0, kept));
        out_rows = r->send_slot, in_rows = r->recv_slot;
        break;
    case EP_COMBINE_BACKWARD:
        gather(tensor_rows(b->sbuf, 0, n), io->dy, io->perm);
        out_rows = r->recv_slot, in_rows = r->send_slot;
        break;
    case EP_DISPATCH_BACKWARD: { // per received token row: Σ of its kept slots' gradients
        Tensor sums = tensor_rows(b->sbuf, 0, ntok);
        op_zero(sums);
        scatter_add(sums, tensor_rows(io->dxe, 0, kept), tensor_rows(r->xrow, 0, kept));
        out_rows = r->send_tok, in_rows = r->recv_tok;
        break;
    }
    }
    r->req = comm_alltoallv_start(m->ep, b->rbuf, out_rows, b->sbuf, in_rows);
    r->pending = mv + 1;
}

void ep_finish(Model *m, StageIO *io) {
    EpRoute *r = io->route;
    if (io->dense || !r) return;
    CHECK(r->pending);
    EpMove mv = r->pending - 1;
    EpBuffers *b = r->buf;
    int64_t nsend = sum(r->send_tok, m->ep->size), n = io->perm.n[0], kept = io->rows;
    comm_wait(&r->req);
    r->pending = 0;
    switch (mv) {
    case EP_DISPATCH: return gather(tensor_rows(io->xe, 0, kept), b->rbuf, tensor_rows(r->xrow, 0, kept));
    case EP_COMBINE: return scatter(io->y, tensor_rows(b->rbuf, 0, n), io->perm);
    case EP_COMBINE_BACKWARD: return gather(tensor_rows(io->dye, 0, kept), b->rbuf, tensor_rows(r->perm_r, 0, kept));
    case EP_DISPATCH_BACKWARD:
        return scatter_add(io->dxd, tensor_rows(b->rbuf, 0, nsend), tensor_rows(r->send_idx, 0, nsend));
    }
}

static void move(Model *m, StageIO *io, EpMove mv) { ep_issue(m, io, mv), ep_finish(m, io); }
void ep_dispatch_forward(Model *m, StageIO *io) { ep_dispatch_route(m, io), move(m, io, EP_DISPATCH); }
void ep_combine_forward(Model *m, StageIO *io) { move(m, io, EP_COMBINE); }
void ep_combine_backward(Model *m, StageIO *io) { move(m, io, EP_COMBINE_BACKWARD); }
void ep_dispatch_backward(Model *m, StageIO *io) { move(m, io, EP_DISPATCH_BACKWARD); }
