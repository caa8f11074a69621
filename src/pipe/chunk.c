// chunk.c — a chunk of layers [l0, l1) (every layer at pp = 1): forward prolog → (stage 1, 2, 3, 4, 5) per
// layer → epilog, then backward epilog → (5, 4, 3 input, 3 weight, 2, 1) per layer in reverse → prolog;
// the prolog only on the chunk that starts the model, the epilog on the one that ends it. Each micro-batch
// in flight has its record slot; a deferring backward copies stage 3's output gradients (dye, dgu) of
// every layer into a deferred set so that chunk_weight can run the weight half later. All memory comes
// from arenas sized by chunk_plan (activations, workspace, communication), so the step never allocates.
#include "pipe/chunk.h"

static void *rec_of(const Chunk *c, const ChunkRecord *k, int l) { return k->recs + (size_t)l * c->m->fam->rec_size; }

// The allocation sequence of one record in the activation arena.
static void alloc_record(Chunk *c, ChunkRecord *k, Arena *a) {
    Model *m = c->m;
    int T = c->B * c->S;
    k->mb = (MicroBatch){c->B,
                         c->S,
                         T,
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0),
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0),
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0)};
    k->h[c->l0] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    for (int l = c->l0; l < c->l1; l++) {
        StageIO *io = &k->io[l];
        io->dense = !m->cfg.is_moe[l];
        if (!io->dense) { // the routing stage 1 writes
            io->idx = arena_tensor(a, DT_I32, 2, T, m->cfg.topk, 0, 0);
            io->w = arena_tensor(a, DT_F32, 2, T, m->cfg.topk, 0, 0);
        }
        m->fam->layer_alloc(m, l, rec_of(c, k, l), a, c->B, c->S, io);
        m->fam->stage3_alloc(m, l, rec_of(c, k, l), a, io->dense ? T : ep_rows_capacity(m, T));
        ep_alloc(m, io, a, T);
        k->h[l + 1] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    }
    if (c->l1 == m->cfg.layers) m->fam->epilog_alloc(m, k->epilog, a, T);
}

// Every record, then the deferred sets: per layer tensors shaped like stage 3's rows (xe) and gu.
static void alloc_activations(Chunk *c, Arena *a) {
    for (int i = 0; i < c->nrec; i++) alloc_record(c, &c->rec[i], a);
    int L = c->m->cfg.layers;
    for (int s = 0; s < c->ndefer; s++)
        for (int l = c->l0; l < c->l1; l++) {
            const StageIO *io = &c->rec[0].io[l];
            const MlpRec *r = rec_of(c, &c->rec[0], l);
            c->dye[s * L + l] = arena_tensor(a, c->m->cdt, 2, io->xe.n[0], io->xe.n[1], 0, 0);
            c->dgu[s * L + l] = arena_tensor(a, c->m->cdt, 2, r->gu.n[0], r->gu.n[1], 0, 0);
        }
}

// One layer's backward workspace: the family's temporaries, stage 3's, the stage buffers' gradients.
static void alloc_layer_grads(Chunk *c, ChunkRecord *k, int l, Arena *ws) {
    Model *m = c->m;
    StageIO *io = &k->io[l];
    m->fam->layer_grad_alloc(m, l, rec_of(c, k, l), ws, c->B, c->S, io);
    if (!io->dense) io->dw = arena_tensor(ws, DT_F32, 2, (int64_t)c->B * c->S, m->cfg.topk, 0, 0);
    m->fam->stage3_grad_alloc(m, l, rec_of(c, k, l), ws);
    ep_grad_alloc(m, io, ws, (int64_t)c->B * c->S);
}

static void alloc_grad_buffers(Chunk *c, Arena *ws) {
    int T = c->B * c->S;
    for (int i = 0; i < 2; i++) c->dh[i] = arena_tensor(ws, c->m->cdt, 2, T, c->m->cfg.hidden, 0, 0);
}

static void chunk_structs(Chunk *c, Model *m, int B, int S, int l0, int l1, int nrec, int ndefer) {
    CHECK(0 <= l0 && l0 < l1 && l1 <= m->cfg.layers && nrec >= 1 && ndefer >= 0);
    memset(c, 0, sizeof *c);
    int L = m->cfg.layers;
    c->m = m, c->B = B, c->S = S, c->l0 = l0, c->l1 = l1, c->nrec = nrec, c->ndefer = ndefer;
    c->rec = xcalloc(nrec, sizeof(ChunkRecord));
    for (int i = 0; i < nrec; i++) {
        ChunkRecord *k = &c->rec[i];
        k->recs = xcalloc(L, m->fam->rec_size);
        k->epilog = xcalloc(1, m->fam->epilog_size);
        k->io = xcalloc(L, sizeof(StageIO));
        k->h = xcalloc(L + 1, sizeof(Tensor));
        k->defer_set = -1;
        for (int l = 0; l < L; l++) {
            k->io[l].offs = xcalloc(m->cfg.experts + 1, sizeof(int64_t));
            k->io[l].route = ep_route_create(m, &c->epb);
        }
    }
    c->dye = xcalloc((size_t)ndefer * L + 1, sizeof(Tensor)), c->dgu = xcalloc((size_t)ndefer * L + 1, sizeof(Tensor));
}

ChunkPlan chunk_plan(Model *m, int B, int S, int l0, int l1, int nrec, int ndefer) {
    Chunk c;
    chunk_structs(&c, m, B, S, l0, l1, nrec, ndefer);
    Arena act = arena_counting("activations", m->dev), ws = arena_counting("workspace", m->dev),
          comm = arena_counting("communication", m->dev);
    ep_buffers_alloc(m, &c.epb, &comm, (int64_t)B * S);
    alloc_activations(&c, &act);
    alloc_grad_buffers(&c, &ws);
    size_t base = ws.used, most = 0;
    for (int l = l0; l < l1; l++) {
        ws.used = base;
        alloc_layer_grads(&c, &c.rec[0], l, &ws);
        if (ws.used - base > most) most = ws.used - base;
    }
    ChunkPlan p = {act.peak, base + most + ARENA_ALIGN, comm.peak};
    chunk_free(&c);
    return p;
}

void chunk_init(Chunk *c, Model *m, int B, int S, int l0, int l1, int nrec, int ndefer) {
    ChunkPlan p = chunk_plan(m, B, S, l0, l1, nrec, ndefer);
    chunk_structs(c, m, B, S, l0, l1, nrec, ndefer);
    c->act = arena_create("activations", m->dev, p.act_bytes);
    c->ws = arena_create("workspace", m->dev, p.ws_bytes);
    c->comm = arena_create("communication", m->dev, p.comm_bytes);
    ep_buffers_alloc(m, &c->epb, &c->comm, (int64_t)B * S);
    alloc_activations(c, &c->act);
    alloc_grad_buffers(c, &c->ws);
    // Positions restart in every sequence of the micro-batch.
    int T = B * S;
    int32_t *pos = xmalloc(T * sizeof(int32_t));
    for (int t = 0; t < T; t++) pos[t] = t % S;
    for (int i = 0; i < nrec; i++) op_copy(c->rec[i].mb.pos, tensor_make(pos, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
    free(pos);
}

void chunk_init_model(Chunk *c, Model *m, int B, int S) { chunk_init(c, m, B, S, 0, m->cfg.layers, 1, 0); }

void chunk_free(Chunk *c) {
    for (int i = 0; i < c->nrec && c->rec; i++) {
        ChunkRecord *k = &c->rec[i];
        for (int l = 0; k->io && l < c->m->cfg.layers; l++) free(k->io[l].offs), ep_route_free(k->io[l].route);
        free(k->recs), free(k->epilog), free(k->io), free(k->h);
    }
    ep_buffers_free(&c->epb);
    free(c->rec), free(c->dye), free(c->dgu);
    if (c->act.cap) arena_destroy(&c->act);
    if (c->ws.cap) arena_destroy(&c->ws);
    if (c->comm.cap) arena_destroy(&c->comm);
    memset(c, 0, sizeof *c);
}

void chunk_load(Chunk *c, int slot, const int32_t *tokens, const int32_t *labels) {
    MicroBatch *mb = &c->rec[slot].mb;
    op_copy(mb->tokens, tensor_make((void *)tokens, DT_I32, DEV_CPU, 1, mb->T, 1, 1, 1));
    op_copy(mb->labels, tensor_make((void *)labels, DT_I32, DEV_CPU, 1, mb->T, 1, 1, 1));
}

Tensor chunk_input(const Chunk *c, int slot) { return c->rec[slot].h[c->l0]; }
Tensor chunk_output(const Chunk *c, int slot) { return c->rec[slot].h[c->l1]; }
Tensor chunk_input_grad(const Chunk *c) { return c->dh[(c->l1 - c->l0) % 2]; }

void chunk_forward(Chunk *c, int slot, bool grad) {
    chunk_forward_layers(c, slot);
    ChunkRecord *k = &c->rec[slot];
    if (c->l1 == c->m->cfg.layers) c->m->fam->epilog_forward(c->m, k->epilog, &k->mb, k->h[c->m->cfg.layers], grad);
}

void chunk_forward_layers(Chunk *c, int slot) {
    Model *m = c->m;
    const ModelFamily *f = m->fam;
    ChunkRecord *k = &c->rec[slot];
    if (c->l0 == 0) f->prolog_forward(m, &k->mb, k->h[0]);
    for (int l = c->l0; l < c->l1; l++) {
        void *r = rec_of(c, k, l);
        StageIO *io = &k->io[l];
        f->stage1_forward(m, l, r, &k->mb, k->h[l], io);
        ep_dispatch_forward(m, io);
        f->stage3_forward(m, l, r, io);
        ep_combine_forward(m, io);
        f->stage5_forward(m, l, r, io, k->h[l + 1]);
    }
}

// Rows of stage 3's output gradient that hold data: the received rows (MoE) or every token (dense).
static int64_t stage3_rows(const Model *m, const StageIO *io) {
    return io->dense ? io->dye.n[0] : io->offs[model_experts_local(&m->cfg)];
}

void chunk_backward(Chunk *c, int slot, bool defer) {
    Model *m = c->m;
    const ModelFamily *f = m->fam;
    ChunkRecord *k = &c->rec[slot];
    int cur = 0, L = m->cfg.layers, set = -1;
    if (defer) { // the next set of the ring; chunk_weight frees the oldest, so at most ndefer are taken
        CHECK(c->defer_tail - c->defer_head < c->ndefer && k->defer_set < 0);
        set = k->defer_set = c->defer_tail++ % c->ndefer;
    }
    if (c->l1 == L) f->epilog_backward(m, k->epilog, c->dh[cur]);
    for (int l = c->l1 - 1; l >= c->l0; l--) {
        void *r = rec_of(c, k, l);
        StageIO *io = &k->io[l];
        size_t mark = arena_mark(&c->ws);
        alloc_layer_grads(c, k, l, &c->ws);
        f->stage5_backward(m, l, r, io, c->dh[cur]);
        ep_combine_backward(m, io);
        f->stage3_backward_input(m, l, r, io);
        if (!defer) f->stage3_backward_weight(m, l, r, io);
        else if (stage3_rows(m, io) > 0) { // the workspace is reset below: keep what the weight half reads
            int64_t R = stage3_rows(m, io);
            op_copy(tensor_rows(c->dye[set * L + l], 0, R), tensor_rows(io->dye, 0, R));
            op_copy(tensor_rows(c->dgu[set * L + l], 0, R), tensor_rows(((MlpRec *)r)->dgu, 0, R));
        }
        ep_dispatch_backward(m, io);
        f->stage1_backward(m, l, r, &k->mb, io, c->dh[cur], c->dh[1 - cur]);
        arena_reset(&c->ws, mark);
        cur = 1 - cur;
    }
    if (c->l0 == 0) f->prolog_backward(m, &k->mb, c->dh[cur]);
}

void chunk_weight(Chunk *c, int slot) {
    Model *m = c->m;
    ChunkRecord *k = &c->rec[slot];
    int L = m->cfg.layers, set = k->defer_set;
    CHECK(set >= 0 && set == c->defer_head % c->ndefer); // FIFO: the oldest deferred backward
    for (int l = c->l0; l < c->l1; l++) {
        MlpRec *r = rec_of(c, k, l);
        StageIO *io = &k->io[l];
        io->dye = c->dye[set * L + l], r->dgu = c->dgu[set * L + l];
        if (io->dense) io->dy = io->dye;
        m->fam->stage3_backward_weight(m, l, r, io);
    }
    k->defer_set = -1, c->defer_head++;
}

// ---- the overlapped pair (docs/architecture.md, "The overlapped pair") ----
// A forward and a backward as cursors over their stages, each step a compute (after the wait for its input)
// or an all-to-all's issue. chunk_pair issues every all-to-all right after the compute that produces its
// rows, then runs the other micro-batch's compute before the wait: on the comm stream the all-to-alls come
// in the order of spec §4.4 (whose events, recorded after each compute, give the same overlap), and each
// runs beside the other side's stages: combine⁻¹ ∥ F stage 5/1, dispatch ∥ B stage 3, dispatch⁻¹ ∥ B
// weight gradients and F stage 3, combine ∥ B stage 1/5.
typedef struct {
    Chunk *c;
    ChunkRecord *k;
    int l;       // the layer whose stages run next (forward: ascending, backward: descending)
    int cur;     // backward: dh[cur] is layer l's output gradient
    size_t mark; // backward: workspace mark of layer l's gradients
} Cursor;

static void f_stage1(Cursor *f) { // (prolog,) stage 1 of layer l
    Model *m = f->c->m;
    if (f->l == f->c->l0 && f->c->l0 == 0) m->fam->prolog_forward(m, &f->k->mb, f->k->h[0]);
    m->fam->stage1_forward(m, f->l, rec_of(f->c, f->k, f->l), &f->k->mb, f->k->h[f->l], &f->k->io[f->l]);
}
static void f_dispatch(Cursor *f) {
    ep_dispatch_route(f->c->m, &f->k->io[f->l]), ep_issue(f->c->m, &f->k->io[f->l], EP_DISPATCH);
}
static void f_stage3(Cursor *f) {
    ep_finish(f->c->m, &f->k->io[f->l]);
    f->c->m->fam->stage3_forward(f->c->m, f->l, rec_of(f->c, f->k, f->l), &f->k->io[f->l]);
}
static void f_combine(Cursor *f) { ep_issue(f->c->m, &f->k->io[f->l], EP_COMBINE); }
static void f_stage5(Cursor *f) { // stage 5 of layer l, and stage 1 of the next (or the epilog)
    Model *m = f->c->m;
    ep_finish(m, &f->k->io[f->l]);
    m->fam->stage5_forward(m, f->l, rec_of(f->c, f->k, f->l), &f->k->io[f->l], f->k->h[f->l + 1]);
    if (++f->l < f->c->l1) return f_stage1(f);
    if (f->c->l1 == m->cfg.layers) m->fam->epilog_forward(m, f->k->epilog, &f->k->mb, f->k->h[f->l], true);
}

static void b_stage5(Cursor *b) { // (epilog,) stage 5 of layer l
    Chunk *c = b->c;
    Model *m = c->m;
    if (b->l == c->l1 - 1 && c->l1 == m->cfg.layers) m->fam->epilog_backward(m, b->k->epilog, c->dh[b->cur]);
    b->mark = arena_mark(&c->ws);
    alloc_layer_grads(c, b->k, b->l, &c->ws);
    m->fam->stage5_backward(m, b->l, rec_of(c, b->k, b->l), &b->k->io[b->l], c->dh[b->cur]);
}
static void b_combine(Cursor *b) { ep_issue(b->c->m, &b->k->io[b->l], EP_COMBINE_BACKWARD); }
static void b_stage3(Cursor *b) {
    ep_finish(b->c->m, &b->k->io[b->l]);
    b->c->m->fam->stage3_backward_input(b->c->m, b->l, rec_of(b->c, b->k, b->l), &b->k->io[b->l]);
}
static void b_dispatch(Cursor *b) { ep_issue(b->c->m, &b->k->io[b->l], EP_DISPATCH_BACKWARD); }
static void b_weight(Cursor *b) {
    b->c->m->fam->stage3_backward_weight(b->c->m, b->l, rec_of(b->c, b->k, b->l), &b->k->io[b->l]);
}
static void b_stage1(Cursor *b) { // stage 1 of layer l, and stage 5 of the next (or the prolog)
    Chunk *c = b->c;
    Model *m = c->m;
    ep_finish(m, &b->k->io[b->l]);
    m->fam->stage1_backward(m, b->l, rec_of(c, b->k, b->l), &b->k->mb, &b->k->io[b->l], c->dh[b->cur],
                            c->dh[1 - b->cur]);
    arena_reset(&c->ws, b->mark);
    b->cur = 1 - b->cur;
    if (--b->l >= c->l0) return b_stage5(b);
    if (c->l0 == 0) m->fam->prolog_backward(m, &b->k->mb, c->dh[b->cur]);
}

void chunk_pair(Chunk *fc, int fslot, Chunk *bc, int bslot) {
    CHECK(fc != bc && fc->l1 - fc->l0 == bc->l1 - bc->l0); // the transfer buffers are each chunk's own
    Cursor f = {fc, &fc->rec[fslot], fc->l0, 0, 0}, b = {bc, &bc->rec[bslot], bc->l1 - 1, 0, 0};
    b_stage5(&b), b_combine(&b), f_stage1(&f), f_dispatch(&f);
    for (int i = 0; i < fc->l1 - fc->l0; i++) {
        if (i > 0) b_stage1(&b), b_combine(&b), f_stage5(&f), f_dispatch(&f);
        b_stage3(&b), b_dispatch(&b), b_weight(&b), f_stage3(&f), f_combine(&f);
    }
    b_stage1(&b), f_stage5(&f);
}

void chunk_pipe_pair(Chunk *fc, int fslot, Tensor x, Tensor y, Chunk *bc, int bslot, Tensor dy, Tensor dx) {
    if (x.p) op_copy(chunk_input(fc, fslot), x);
    if (dy.p) op_copy(bc->dh[0], dy);
    chunk_pair(fc, fslot, bc, bslot);
    if (y.p) op_copy(y, chunk_output(fc, fslot));
    if (dx.p) op_copy(dx, chunk_input_grad(bc));
}

void chunk_pipe_forward(Chunk *c, int slot, Tensor x, Tensor y, bool grad) {
    if (x.p) op_copy(chunk_input(c, slot), x);
    chunk_forward(c, slot, grad);
    if (y.p) op_copy(y, chunk_output(c, slot));
}

void chunk_pipe_backward(Chunk *c, int slot, Tensor dy, Tensor dx, bool defer) {
    if (dy.p) op_copy(c->dh[0], dy);
    chunk_backward(c, slot, defer);
    if (dx.p) op_copy(dx, chunk_input_grad(c));
}
