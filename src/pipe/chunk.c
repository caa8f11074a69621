// chunk.c — a chunk of layers [l0, l1) (every layer at pp = 1): forward prolog → (stage 1, 2, 3, 4, 5) per
// layer → epilog, then backward epilog → (5, 4, 3 input, 3 weight, 2, 1) per layer in reverse → prolog;
// the prolog only on the chunk that starts the model, the epilog on the one that ends it. Each micro-batch
// in flight has its record slot; a deferring backward copies stage 3's output gradients (dye, dgu) of
// every layer into a deferred set so that chunk_weight can run the weight half later. All memory comes
// from arenas sized by chunk_plan (activations, workspace, communication), so the step never allocates.
// Expert capacity (docs/architecture.md, "Expert capacity"): a MoE layer's own stage-3 buffers hold
// ep_rows_capacity rows; a layer that receives more on any rank of its ep group runs stage 3 on the chunk's
// spill set (the worst case of one layer) and recomputes it there when it is needed again. Activation
// recomputation ("Activation recomputation" there): the parts a config names live in staging shared by the
// layers and are remade in backward; full keeps a layer's input, routing and output and reruns its forward into
// one region shared by every layer and record.
#include "pipe/chunk.h"

static void *rec_of(const Chunk *c, const ChunkRecord *k, int l) { return k->recs + (size_t)l * c->m->fam->rec_size; }

// Points layer l's stage-3 rows (expert-ordered inputs, activations, route permutations) at b.
static void use_rows(Chunk *c, ChunkRecord *k, int l, const ExpertRows *b) {
    StageIO *io = &k->io[l];
    LayerRec *r = rec_of(c, k, l); // a family record begins with a LayerRec's fields
    io->xe = b->xe, r->gu = b->gu, r->act = b->act;
    if (io->route) io->route->perm_r = b->perm_r, io->route->xrow = b->xrow;
}

static ExpertRows rows_of(Chunk *c, ChunkRecord *k, int l) {
    StageIO *io = &k->io[l];
    LayerRec *r = rec_of(c, k, l);
    return (ExpertRows){io->xe, r->gu, r->act, io->route ? io->route->perm_r : (Tensor){0},
                        io->route ? io->route->xrow : (Tensor){0}};
}

// The spill set: stage-3 rows for the worst case of one layer, shared by every layer that overflows. It
// borrows the record layout of MoE layer l of record 0.
static void alloc_spill(Chunk *c, int l, Arena *a) {
    Model *m = c->m;
    ChunkRecord *k = &c->rec[0];
    int64_t W = ep_rows_worst(m, (int64_t)c->B * c->S);
    ExpertRows own = rows_of(c, k, l);
    moe_stage3_alloc(m, l, rec_of(c, k, l), a, W, false);
    const LayerRec *r = rec_of(c, k, l);
    c->spill = (ExpertRows){arena_tensor(a, m->cdt, 2, W, m->cfg.hidden, 0, 0), r->gu, r->act,
                            arena_tensor(a, DT_I32, 1, W, 0, 0, 0), arena_tensor(a, DT_I32, 1, W, 0, 0, 0)};
    use_rows(c, k, l, &own);
}

// Layer l's record and stage buffers in record k (p: the bytes by part, may be NULL).
static void alloc_layer(Chunk *c, ChunkRecord *k, int l, Arena *a, ChunkPlan *p) {
    Model *m = c->m;
    int T = c->B * c->S;
    StageIO *io = &k->io[l];
    size_t m0 = arena_mark(a);
    moe_layer_alloc(m, l, rec_of(c, k, l), a, c->B, c->S, io, false);
    size_t m1 = arena_mark(a);
    moe_stage3_alloc(m, l, rec_of(c, k, l), a, io->dense ? T : ep_rows_capacity(m, T), false);
    ep_alloc(m, io, a, T);
    k->own[l] = rows_of(c, k, l);
    if (p) p->act_stage1 += m1 - m0, p->act_experts += arena_mark(a) - m1;
}

// The allocation sequence of one record in the activation arena: the micro-batch, hidden states, routing,
// the epilog and, unless full recompute puts them in the shared region, its layers.
static void alloc_record(Chunk *c, ChunkRecord *k, Arena *a, ChunkPlan *p) {
    Model *m = c->m;
    int T = c->B * c->S;
    bool full = m->recompute == RECOMPUTE_FULL;
    // a pipeline rank's chunks read their input from, and write their output into, the pipeline's buffers
    bool own_in = !c->pipe_io || c->l0 == 0, own_out = !c->pipe_io || c->l1 == m->cfg.layers || full;
    size_t m0 = arena_mark(a);
    k->mb = (MicroBatch){.B = c->B, .S = c->S, .T = T};
    k->mb.tokens = arena_tensor(a, DT_I32, 1, T, 0, 0, 0), k->mb.labels = arena_tensor(a, DT_I32, 1, T, 0, 0, 0);
    k->mb.pos = arena_tensor(a, DT_I32, 1, T, 0, 0, 0);
    if (own_in) k->h[c->l0] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    for (int l = c->l0; l < c->l1; l++) {
        StageIO *io = &k->io[l];
        io->dense = !m->cfg.is_moe[l];
        if (!io->dense) { // the routing stage 1 writes, and the expert offsets the dispatch derives from it
            io->idx = arena_tensor(a, DT_I32, 2, T, m->cfg.topk, 0, 0);
            io->w = arena_tensor(a, DT_F32, 2, T, m->cfg.topk, 0, 0);
            io->offs = arena_tensor(a, DT_I64, 1, model_experts_local(&m->cfg) + 1, 0, 0, 0);
        }
        if (full) k->h[l + 1] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    }
    p->act_hidden += arena_mark(a) - m0;
    for (int l = c->l0; l < c->l1 && !full; l++) {
        alloc_layer(c, k, l, a, p);
        size_t m1 = arena_mark(a);
        if (l + 1 < c->l1 || own_out) k->h[l + 1] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
        p->act_hidden += arena_mark(a) - m1;
    }
    size_t m2 = arena_mark(a);
    if (c->l1 == m->cfg.layers) moe_epilog_alloc(m, &k->epilog, a, T);
    p->act_epilog += arena_mark(a) - m2;
}

// A block of bytes from a as an arena (the staging of the parts recomputed in backward).
static Arena block(Arena *a, size_t bytes) {
    Tensor b = bytes ? arena_tensor(a, DT_U8, 1, (int64_t)bytes, 0, 0, 0) : (Tensor){0};
    return (Arena){b.p, 0, bytes, 0, a->dev, "staging"};
}

// The parts m->recompute names live in staging shared by every layer and record (moe_layer_alloc and
// moe_stage3_alloc leave them out): stage 3's (gate/up, SwiGLU) of each layer's own rows and of the spill set (moe's
// record 0) in one block, viewed by the records' rows; stage 1's in c->stage1, which each forward points its layer
// at. Sized by a first pass on counting arenas.
static void alloc_staging(Chunk *c, Arena *a, int moe) {
    Model *m = c->m;
    int T = c->B * c->S;
    Arena st = arena_counting("staging", m->dev);
    c->stage1 = st;
    for (int pass = 0; pass < 2 && m->recompute & (RC_FULL - 1); pass++) {
        for (int i = 0; i < c->nrec; i++)
            for (int l = c->l0; l < c->l1; l++) {
                ChunkRecord *k = &c->rec[i];
                st.used = 0, c->stage1.used = 0;
                moe_stage3_alloc(m, l, rec_of(c, k, l), &st, k->io[l].dense ? T : ep_rows_capacity(m, T), true);
                moe_layer_alloc(m, l, rec_of(c, k, l), &c->stage1, c->B, c->S, &k->io[l], true);
                k->own[l] = rows_of(c, k, l);
            }
        if (c->spill.xe.n[0]) {
            ChunkRecord *k = &c->rec[0];
            use_rows(c, k, moe, &c->spill), st.used = 0;
            moe_stage3_alloc(m, moe, rec_of(c, k, moe), &st, c->spill.xe.n[0], true);
            c->spill = rows_of(c, k, moe), use_rows(c, k, moe, &k->own[moe]);
        }
        if (!pass) st = block(a, st.peak), c->stage1 = block(a, c->stage1.peak);
    }
}

// Every record; under full recompute one region for every record's layers (the largest layer); the staging
// shared by the layers, the spill set; then the deferred sets: per layer tensors shaped like stage 3's rows
// (xe) and gu. p gets the bytes by part, from the arena's marks (padding included: they sum to the total).
static void alloc_activations(Chunk *c, Arena *a, ChunkPlan *p) {
    Model *m = c->m;
    int T = c->B * c->S, L = m->cfg.layers, moe = -1;
    for (int i = 0; i < c->nrec; i++) alloc_record(c, &c->rec[i], a, p);
    for (int l = c->l0; l < c->l1; l++)
        if (m->cfg.is_moe[l]) moe = l;
    c->region_owner = c->spill_owner = -1;
    if (m->recompute == RECOMPUTE_FULL) {
        size_t shared = arena_mark(a), top = shared;
        for (int i = 0; i < c->nrec; i++)
            for (int l = c->l0; l < c->l1; l++) {
                arena_reset(a, shared);
                ChunkPlan one = {0};
                alloc_layer(c, &c->rec[i], l, a, &one);
                if (arena_mark(a) > top)
                    top = arena_mark(a), p->act_stage1 = one.act_stage1, p->act_experts = one.act_experts;
            }
        arena_reset(a, top);
    }
    size_t m0 = arena_mark(a);
    // Expert outputs before combine (ye) are staging: one buffer for every MoE layer, as many rows as stage 3 holds;
    // so are their combined (T·k, H) when recomputed (RC_EXPERT_OUT). On one ep rank the combine reads ye where the
    // experts wrote it: ye is the record's y (or the recomputed one's staging).
    bool spills = moe >= 0 && ep_spills(m, T), y_again = m->recompute & RC_EXPERT_OUT;
    int64_t W = spills ? ep_rows_worst(m, T) : 0;
    if (moe >= 0) {
        bool one = !c->rec[0].io[moe].route; // (a plan's counting arena gives tensors no address: ask the route)
        Tensor ye = one ? (Tensor){0}
                        : arena_tensor(a, m->cdt, 2, spills ? W : ep_rows_capacity(m, T), m->cfg.hidden, 0, 0),
               y = y_again ? arena_tensor(a, m->cdt, 2, (int64_t)T * m->cfg.topk, m->cfg.hidden, 0, 0) : (Tensor){0};
        for (int i = 0; i < c->nrec; i++)
            for (int l = c->l0; l < c->l1; l++) {
                StageIO *io = &c->rec[i].io[l];
                if (io->dense) continue;
                if (y_again) io->y = y;
                io->ye = one ? io->y : ye;
            }
    }
    size_t m1 = arena_mark(a);
    if (spills) alloc_spill(c, moe, a);
    size_t m2 = arena_mark(a);
    alloc_staging(c, a, moe);
    p->act_staging += (m1 - m0) + (arena_mark(a) - m2), p->act_spill += m2 - m1;
    size_t m3 = arena_mark(a);
    for (int s = 0; s < c->ndefer; s++)
        for (int l = c->l0; l < c->l1; l++) {
            const LayerRec *r = rec_of(c, &c->rec[0], l);
            c->dye[s * L + l] = arena_tensor(a, c->m->cdt, 2, r->gu.n[0], m->cfg.hidden, 0, 0);
            c->dgu[s * L + l] = arena_tensor(a, c->m->cdt, 2, r->gu.n[0], r->gu.n[1], 0, 0);
        }
    p->act_defer += arena_mark(a) - m3;
}

// One layer's backward workspace: the family's temporaries, stage 3's, the stage buffers' gradients.
static void alloc_layer_grads(Chunk *c, ChunkRecord *k, int l, Arena *ws) {
    Model *m = c->m;
    StageIO *io = &k->io[l];
    moe_layer_alloc(m, l, rec_of(c, k, l), ws, c->B, c->S, io, true); // recomputed by b_stage5
    moe_layer_grad_alloc(m, l, rec_of(c, k, l), ws, c->B, c->S, io);
    if (!io->dense) io->dw = arena_tensor(ws, DT_F32, 2, (int64_t)c->B * c->S, m->cfg.topk, 0, 0);
    moe_stage3_grad_alloc(m, l, rec_of(c, k, l), ws);
    ep_grad_alloc(m, io, ws, (int64_t)c->B * c->S);
}

// The records' view of the ops' planned scratch (StageIO.opws).
static void bind_op_ws(Chunk *c, Tensor t) {
    c->opws = t;
    for (int i = 0; i < c->nrec; i++)
        for (int l = c->l0; l < c->l1; l++) c->rec[i].io[l].opws = t;
}

// The bottom of the workspace: the gradient ping-pong and the ops' scratch (ModelFamily.op_ws, the largest of the
// model's layers: the same for both chunks of a pipeline rank, which share it).
static void alloc_grad_buffers(Chunk *c, Arena *ws) {
    Model *m = c->m;
    int T = c->B * c->S;
    for (int i = 0; i < 2; i++) c->dh[i] = arena_tensor(ws, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    size_t n = 0;
    for (int l = 0; l < m->cfg.layers && m->fam->op_ws; l++) {
        size_t k = m->fam->op_ws(m, l, c->B, c->S);
        n = k > n ? k : n;
    }
    bind_op_ws(c, n ? arena_tensor(ws, DT_F32, 1, (int64_t)n, 0, 0, 0) : (Tensor){0});
}

static void chunk_structs(Chunk *c, Model *m, int B, int S, ChunkShape sh, bool pipe_io) {
    CHECK(0 <= sh.l0 && sh.l0 < sh.l1 && sh.l1 <= m->cfg.layers && sh.nrec >= 1 && sh.ndefer >= 0);
    memset(c, 0, sizeof *c);
    int L = m->cfg.layers, nrec = sh.nrec, ndefer = sh.ndefer;
    c->m = m, c->B = B, c->S = S, c->l0 = sh.l0, c->l1 = sh.l1, c->nrec = nrec, c->ndefer = ndefer;
    c->pipe_io = pipe_io;
    c->rec = xcalloc(nrec, sizeof(ChunkRecord));
    for (int i = 0; i < nrec; i++) {
        ChunkRecord *k = &c->rec[i];
        k->recs = xcalloc(L, m->fam->rec_size);
        k->io = xcalloc(L, sizeof(StageIO));
        k->h = xcalloc(L + 1, sizeof(Tensor));
        k->own = xcalloc(L, sizeof(ExpertRows));
        k->defer_set = -1;
        for (int l = 0; l < L; l++) k->io[l].route = ep_route_create(m, &c->epb);
    }
    c->dye = xcalloc((size_t)ndefer * L + 1, sizeof(Tensor)), c->dgu = xcalloc((size_t)ndefer * L + 1, sizeof(Tensor));
}

static ChunkPlan plan_of(Model *m, int B, int S, ChunkShape sh, bool pipe_io) {
    Chunk c;
    chunk_structs(&c, m, B, S, sh, pipe_io);
    Arena act = arena_counting("activations", m->dev), ws = arena_counting("workspace", m->dev),
          comm = arena_counting("communication", m->dev);
    ep_buffers_alloc(m, &c.epb, &comm, (int64_t)B * S);
    ChunkPlan p = {0};
    alloc_activations(&c, &act, &p);
    alloc_grad_buffers(&c, &ws);
    size_t base = ws.used, most = 0;
    ChunkRecord *k = &c.rec[0];
    for (int l = sh.l0; l < sh.l1; l++)
        for (int spilled = 0; spilled < 1 + (c.spill.xe.n[0] && !k->io[l].dense); spilled++) {
            ws.used = base;
            if (spilled) use_rows(&c, k, l, &c.spill); // a spilled layer's backward: the gradients of the spill set
            alloc_layer_grads(&c, k, l, &ws);
            if (ws.used - base > most) most = ws.used - base;
            if (spilled) use_rows(&c, k, l, &k->own[l]);
        }
    p.act_bytes = act.peak, p.ws_bytes = base + most + ARENA_ALIGN, p.comm_bytes = comm.peak;
    chunk_free(&c);
    return p;
}

ChunkPlan chunk_plan(Model *m, int B, int S, int l0, int l1, int nrec, int ndefer) {
    return plan_of(m, B, S, (ChunkShape){l0, l1, nrec, ndefer}, false);
}

ChunkPlan chunk_plan_rank(Model *m, int B, int S, const ChunkShape sh[2]) {
    ChunkPlan sum = {0};
    for (int p = 0; p < 2; p++) {
        ChunkPlan q = plan_of(m, B, S, sh[p], true);
        sum.act_bytes += q.act_bytes, sum.comm_bytes += q.comm_bytes;
        if (q.ws_bytes > sum.ws_bytes) sum.ws_bytes = q.ws_bytes; // one workspace: the larger backward's
        sum.act_hidden += q.act_hidden, sum.act_stage1 += q.act_stage1, sum.act_experts += q.act_experts;
        sum.act_staging += q.act_staging, sum.act_spill += q.act_spill, sum.act_epilog += q.act_epilog;
        sum.act_defer += q.act_defer;
    }
    return sum;
}

// Record slot's positions: docpos (document masking), or with NULL each sequence's from 0 (its zigzag chunks' global
// positions under context parallelism).
static void set_positions(Chunk *c, int slot, const int32_t *docpos) {
    MicroBatch *mb = &c->rec[slot].mb;
    int32_t *pos = docpos ? NULL : xmalloc(mb->T * sizeof(int32_t));
    for (int t = 0; !docpos && t < mb->T; t++) pos[t] = model_position(c->m, c->S, t);
    Tensor h = tensor_make(docpos ? (void *)docpos : pos, DT_I32, DEV_CPU, 1, mb->T, 1, 1, 1);
    if (docpos) op_upload(mb->pos, h); // (the caller's, chunk_upload)
    else op_copy(mb->pos, h);
    mb->docs = docpos != NULL;
    free(pos);
}

// chunk_init's allocation with the plan p; the workspace is a new one of ws_bytes, or share's (whose
// gradient buffers dh then serve both: the same (T, H) at the bottom of the workspace).
static void chunk_build(Chunk *c, Model *m, StepSums *sums, int B, int S, ChunkShape sh, bool pipe_io, size_t ws_bytes,
                        Chunk *share) {
    ChunkPlan p = plan_of(m, B, S, sh, pipe_io);
    chunk_structs(c, m, B, S, sh, pipe_io);
    c->act = arena_create("activations", m->dev, p.act_bytes);
    c->comm = arena_create("communication", m->dev, p.comm_bytes);
    if (share) {
        CHECK(share->ws->cap >= p.ws_bytes);
        c->ws = share->ws, c->dh[0] = share->dh[0], c->dh[1] = share->dh[1];
        bind_op_ws(c, share->opws);
    } else {
        c->own_ws = arena_create("workspace", m->dev, ws_bytes ? ws_bytes : p.ws_bytes), c->ws = &c->own_ws;
        alloc_grad_buffers(c, c->ws);
    }
    ep_buffers_alloc(m, &c->epb, &c->comm, (int64_t)B * S);
    ChunkPlan parts = {0};
    alloc_activations(c, &c->act, &parts);
    // The plan is exact: the real allocation takes the counting one's path and uses every planned byte (a choice made
    // on a tensor's address, which a counting arena leaves NULL, would plan buffers the run never takes)
    if (c->act.peak != p.act_bytes || c->comm.peak != p.comm_bytes)
        die("chunk: activations %zu and communication %zu bytes allocated, %zu and %zu planned (a plan bug)",
            c->act.peak, c->comm.peak, p.act_bytes, p.comm_bytes);
    for (int i = 0; i < sh.nrec; i++) set_positions(c, i, NULL), c->rec[i].mb.sums = sums;
}

void chunk_init(Chunk *c, Model *m, StepSums *sums, int B, int S, int l0, int l1, int nrec, int ndefer) {
    chunk_build(c, m, sums, B, S, (ChunkShape){l0, l1, nrec, ndefer}, false, 0, NULL);
}

void chunk_init_rank(Chunk c[2], Model *m, StepSums *sums, int B, int S, const ChunkShape sh[2]) {
    chunk_build(&c[0], m, sums, B, S, sh[0], true, chunk_plan_rank(m, B, S, sh).ws_bytes, NULL);
    chunk_build(&c[1], m, sums, B, S, sh[1], true, 0, &c[0]);
}

void chunk_init_model(Chunk *c, Model *m, StepSums *sums, int B, int S) {
    chunk_init(c, m, sums, B, S, 0, m->cfg.layers, 1, 0);
}

void chunk_free(Chunk *c) {
    for (int i = 0; i < c->nrec && c->rec; i++) {
        ChunkRecord *k = &c->rec[i];
        for (int l = 0; k->io && l < c->m->cfg.layers; l++) ep_route_free(k->io[l].route);
        free(k->recs), free(k->io), free(k->h), free(k->own);
    }
    ep_buffers_free(&c->epb);
    free(c->rec), free(c->dye), free(c->dgu);
    if (c->act.cap) arena_destroy(&c->act);
    if (c->own_ws.cap) arena_destroy(&c->own_ws);
    if (c->comm.cap) arena_destroy(&c->comm);
    memset(c, 0, sizeof *c);
}

void chunk_load(Chunk *c, int slot, const int32_t *tokens, const int32_t *labels) {
    chunk_load_docs(c, slot, tokens, labels, NULL);
}

void chunk_upload(Chunk *c, int slot, const int32_t *tokens, const int32_t *labels, const int32_t *docpos) {
    MicroBatch *mb = &c->rec[slot].mb;
    op_upload(mb->tokens, tensor_make((void *)tokens, DT_I32, DEV_CPU, 1, mb->T, 1, 1, 1));
    op_upload(mb->labels, tensor_make((void *)labels, DT_I32, DEV_CPU, 1, mb->T, 1, 1, 1));
    if (docpos || mb->docs) set_positions(c, slot, docpos); // off after on: chunk_init's positions back
}

void chunk_load_docs(Chunk *c, int slot, const int32_t *tokens, const int32_t *labels, const int32_t *docpos) {
    chunk_upload(c, slot, tokens, labels, docpos);
    ops_uploads_wait();
}

Tensor chunk_input(const Chunk *c, int slot) { return c->rec[slot].h[c->l0]; }
Tensor chunk_output(const Chunk *c, int slot) { return c->rec[slot].h[c->l1]; }
Tensor chunk_input_grad(const Chunk *c) { return c->dh[(c->l1 - c->l0) % 2]; }

// ---- forward and backward as steps (docs/architecture.md, "The overlapped pair") ----
// A layer's forward and backward are each a sequence of steps over a cursor: computes (each after the wait
// for its input) and the issues of all-to-alls (ep_issue). The serial order runs one cursor's steps back to
// back; chunk_pair interleaves a forward's with a backward's, so both share this one code path.
typedef struct {
    Chunk *c;
    int slot;
    ChunkRecord *k;
    int l;       // the layer whose steps run (forward: ascending, backward: descending)
    bool replay; // forward: a rerun in backward (full recompute)
    int cur;     // backward: dh[cur] is layer l's output gradient
    int set;     // backward: the deferred set taking stage 3's weight-gradient inputs (−1: none)
    size_t mark; // backward: workspace mark of layer l's gradients
    Tensor top;  // backward: the chunk's output gradient (p NULL: dh[0], which the epilog or caller wrote)
    Tensor bot;  // backward: where the chunk's input gradient goes (p NULL: a dh buffer, chunk_input_grad)
} Cursor;

static Cursor cursor(Chunk *c, int slot, int l) {
    return (Cursor){c, slot, &c->rec[slot], l, false, 0, -1, 0, {0}, {0}};
}
static void *cur_rec(const Cursor *u) { return rec_of(u->c, u->k, u->l); }
static StageIO *cur_io(const Cursor *u) { return &u->k->io[u->l]; }

// Forward of layer l. A replay reruns it on the same input and weights, which gives the same bits;
// MicroBatch.replay keeps the load-balancing sums and expert counts from counting twice.
static void f_stage1(Cursor *f) {
    Model *m = f->c->m;
    f->k->mb.replay = f->replay;
    f->c->stage1.used = 0, moe_layer_alloc(m, f->l, cur_rec(f), &f->c->stage1, f->c->B, f->c->S, cur_io(f), true);
    moe_stage1_forward(m, f->l, cur_rec(f), &f->k->mb, f->k->h[f->l], cur_io(f));
}
// The route, the layer's stage-3 rows (its own, or the spill set when the group decided so), the dispatch.
static void f_dispatch(Cursor *f) {
    Chunk *c = f->c;
    StageIO *io = cur_io(f);
    if (!io->dense) use_rows(c, f->k, f->l, &f->k->own[f->l]); // a forward starts on the layer's own rows
    ep_dispatch_route(c->m, io);
    if (io->route) {
        if (io->route->spill) use_rows(c, f->k, f->l, &c->spill), c->spill_owner = f->slot * c->m->cfg.layers + f->l;
        if (!f->replay) c->ep_over += io->route->over;
        if (io->route->rows > c->ep_rows_peak) c->ep_rows_peak = io->route->rows;
    }
    ep_issue(c->m, io, EP_DISPATCH);
}
static void f_stage3(Cursor *f) {
    ep_finish(f->c->m, cur_io(f));
    moe_stage3_forward(f->c->m, f->l, cur_rec(f), cur_io(f), false);
}
static void f_combine(Cursor *f) { ep_issue(f->c->m, cur_io(f), EP_COMBINE); }
static void f_stage5(Cursor *f) {
    Chunk *c = f->c;
    ep_finish(c->m, cur_io(f));
    moe_stage5_forward(c->m, f->l, cur_rec(f), cur_io(f), f->k->h[f->l + 1]);
    if (c->m->recompute == RECOMPUTE_FULL) c->region_owner = f->slot * c->m->cfg.layers + f->l;
}

static void layer_forward(Chunk *c, int slot, int l, bool replay) {
    Cursor f = cursor(c, slot, l);
    f.replay = replay;
    f_stage1(&f), f_dispatch(&f), f_stage3(&f), f_combine(&f), f_stage5(&f);
}

void chunk_forward_layers(Chunk *c, int slot) {
    Model *m = c->m;
    ChunkRecord *k = &c->rec[slot];
    if (c->l0 == 0) moe_prolog_forward(m, &k->mb, k->h[0]);
    for (int l = c->l0; l < c->l1; l++) layer_forward(c, slot, l, false);
}

// ---- gradient units (GradUnits) ----
static int unit_slot(const Model *m, int u) {
    return u == MODEL_UNIT_PROLOG(m) || (u == MODEL_UNIT_EPILOG(m) && !m->cfg.tie_embed) ? 0 : 1 + u % 2;
}

void grad_units_alloc(GradUnits *u, Model *m, const Fsdp *f, Arena *a) {
    int64_t most[2] = {0}, at = 0;
    for (int i = 0; i <= MODEL_UNIT_PROLOG(m); i++) { // in params order: the prolog, the layers, the epilog
        int k = i == 0 ? MODEL_UNIT_PROLOG(m) : i - 1, big = unit_slot(m, k) == 0;
        ModelUnit r = u->unit[k] = model_grad_unit(m, k);
        CHECK(r.off == at); // the units tile the group
        at += r.n, most[!big] = r.n > most[!big] ? r.n : most[!big];
    }
    CHECK(at == tensor_numel(m->g[GROUP_DENSE]));
    u->f = f;
    for (int i = 0; i < 3; i++) u->win[i] = arena_tensor(a, DT_F32, 1, most[i > 0], 0, 0, 0), u->busy[i] = -1;
}

void grad_units_free(GradUnits *u) {
    for (int i = 0; i < 3; i++) free(u->req[i]), u->req[i] = NULL;
}

static Tensor unit_window(const Chunk *c, int u) {
    return tensor_rows(c->units->win[unit_slot(c->m, u)], 0, c->units->unit[u].n);
}

// The reduce in flight from window i waited for and added into the shard.
static void unit_finish(Chunk *c, int i) {
    GradUnits *g = c->units;
    int u = g->busy[i];
    if (u < 0) return;
    fsdp_reduce_unit_finish(g->f, GROUP_DENSE, g->shard, unit_window(c, u), g->unit[u].off, g->req[i], g->nreq[i]);
    g->busy[i] = -1;
}

// Unit u's gradient views on its window, zeroed (the epilog's and, tied, the prolog's before the epilog's forward).
static void unit_begin(Chunk *c, int u) {
    if (!c->units) return;
    unit_finish(c, unit_slot(c->m, u));
    Tensor w = unit_window(c, u);
    model_bind_grad_unit(c->m, u, w, c->units->unit[u].off);
    model_zero_dense(c->m, w);
}

// Unit u's backward has ended: its reduce to the owners, issued.
static void unit_end(Chunk *c, int u) {
    GradUnits *g = c->units;
    if (!g) return;
    int i = unit_slot(c->m, u);
    if (!g->req[i]) g->req[i] = xcalloc(g->f->shard[GROUP_DENSE]->size, sizeof(CommReq));
    g->nreq[i] = fsdp_reduce_unit_start(g->f, GROUP_DENSE, unit_window(c, u), g->unit[u].off, g->req[i]);
    g->busy[i] = u;
}

void chunk_forward(Chunk *c, int slot, bool grad) {
    Model *m = c->m;
    chunk_forward_layers(c, slot);
    ChunkRecord *k = &c->rec[slot];
    if (c->l1 < m->cfg.layers) return;
    if (grad && m->cfg.tie_embed) unit_begin(c, MODEL_UNIT_PROLOG(m)); // the LM head's gradient is the embedding's
    if (grad) unit_begin(c, MODEL_UNIT_EPILOG(m));                     // the LM head's gradient comes with the loss
    moe_epilog_forward(m, &k->epilog, &k->mb, k->h[m->cfg.layers], grad);
}

// Makes record slot's layer l whole again where others have used the shared buffers since its forward: under
// full recompute the region (the forward again), else a spilled layer's spill set (dispatch and stage 3 again:
// collectives, which every rank of the ep group reaches in the same order, since the spill is the group's
// decision and every rank of a pipeline stage runs the same schedule).
static void layer_restore(Chunk *c, int slot, int l) {
    Model *m = c->m;
    ChunkRecord *k = &c->rec[slot];
    StageIO *io = &k->io[l];
    int at = slot * m->cfg.layers + l;
    if (m->recompute == RECOMPUTE_FULL) {
        if (c->region_owner != at) layer_forward(c, slot, l, true);
    } else if (io->route && io->route->spill && c->spill_owner != at) {
        ep_dispatch_forward(m, io);
        moe_stage3_forward(m, l, rec_of(c, k, l), io, false);
        c->spill_owner = at;
    }
}

// A layer's weight gradients can wait for chunk_weight only when their inputs stay in its record: not under full
// recompute (one region), not when it spilled (one spill set), not when the SwiGLU outputs are recomputed from
// gate/up products that are themselves recomputed (into staging, by its input gradient's step).
static bool weight_can_wait(const Model *m, const StageIO *io) {
    return m->recompute != RECOMPUTE_FULL && !(io->route && io->route->spill) &&
           (~m->recompute & (RC_SWIGLU | RC_GATE_UP));
}

// Layer l's output gradient and where its input gradient goes: the dh ping-pong, or at the chunk's ends the
// caller's tensors.
static Tensor b_dy(const Cursor *b) { return b->l == b->c->l1 - 1 && b->top.p ? b->top : b->c->dh[b->cur]; }
static Tensor b_dx(const Cursor *b) { return b->l == b->c->l0 && b->bot.p ? b->bot : b->c->dh[1 - b->cur]; }

// Backward of layer l: its gradients in the workspace from b_stage5 to b_stage1.
static void b_stage5(Cursor *b) {
    Chunk *c = b->c;
    b->mark = arena_mark(c->ws);
    bool full = c->m->recompute == RECOMPUTE_FULL; // a spill's restore dispatches n2, recomputed first
    if (full) layer_restore(c, b->slot, b->l);
    alloc_layer_grads(c, b->k, b->l, c->ws);
    moe_stage1_recompute(c->m, b->l, cur_rec(b), &b->k->mb, cur_io(b));
    if (!full) layer_restore(c, b->slot, b->l);
    if (c->m->recompute & RC_EXPERT_OUT && !cur_io(b)->dense) { // a collective: every ep rank at this step
        moe_stage3_forward(c->m, b->l, cur_rec(b), cur_io(b), true);
        ep_issue(c->m, cur_io(b), EP_COMBINE), ep_finish(c->m, cur_io(b));
    }
    moe_stage5_backward(c->m, b->l, cur_rec(b), cur_io(b), b_dy(b));
}
static void b_combine(Cursor *b) { ep_issue(b->c->m, cur_io(b), EP_COMBINE_BACKWARD); }
static void b_stage3(Cursor *b) {
    ep_finish(b->c->m, cur_io(b));
    moe_stage3_backward_input(b->c->m, b->l, cur_rec(b), cur_io(b));
}
static void b_dispatch(Cursor *b) { ep_issue(b->c->m, cur_io(b), EP_DISPATCH_BACKWARD); }
static void b_weight(Cursor *b) { // now, or the inputs kept in the deferred set (the workspace is reset)
    Model *m = b->c->m;
    StageIO *io = cur_io(b);
    int64_t R = moe_stage3_rows(m, io), at = (int64_t)b->set * m->cfg.layers + b->l;
    if (b->set < 0 || !weight_can_wait(m, io)) return moe_stage3_backward_weight(m, b->l, cur_rec(b), &b->k->mb, io);
    if (R == 0) return;
    op_copy(tensor_rows(b->c->dye[at], 0, R), tensor_rows(io->dye, 0, R));
    op_copy(tensor_rows(b->c->dgu[at], 0, R), tensor_rows(((LayerRec *)cur_rec(b))->dgu, 0, R));
}
static void b_stage1(Cursor *b) {
    Chunk *c = b->c;
    ep_finish(c->m, cur_io(b));
    moe_stage1_backward(c->m, b->l, cur_rec(b), &b->k->mb, cur_io(b), b_dy(b), b_dx(b));
    arena_reset(c->ws, b->mark);
    b->cur = 1 - b->cur;
}

// A backward's cursor at its last layer, after the epilog's backward; with defer, the next deferred set of
// the ring (chunk_weight frees the oldest, so at most ndefer are taken); dy, dx: b_dy, b_dx at the ends.
static Cursor backward_begin(Chunk *c, int slot, bool defer, Tensor dy, Tensor dx) {
    CHECK(!(dy.p && c->l1 == c->m->cfg.layers) && !(dx.p && c->l0 == 0));
    Cursor b = cursor(c, slot, c->l1 - 1);
    b.top = dy, b.bot = dx;
    if (defer) {
        CHECK(c->defer_tail - c->defer_head < c->ndefer && b.k->defer_set < 0);
        b.set = b.k->defer_set = c->defer_tail++ % c->ndefer;
    }
    if (c->l1 == c->m->cfg.layers) moe_epilog_backward(c->m, &b.k->epilog, c->dh[0]);
    return b;
}

static void backward(Chunk *c, int slot, bool defer, Tensor dy, Tensor dx) {
    Model *m = c->m;
    CHECK(!c->units || (c->l0 == 0 && c->l1 == m->cfg.layers && !defer)); // the whole model, weights now
    Cursor b = backward_begin(c, slot, defer, dy, dx);
    unit_end(c, MODEL_UNIT_EPILOG(m));
    for (; b.l >= c->l0; b.l--) {
        unit_begin(c, b.l);
        b_stage5(&b), b_combine(&b), b_stage3(&b), b_dispatch(&b), b_weight(&b), b_stage1(&b);
        unit_end(c, b.l);
    }
    if (!m->cfg.tie_embed) unit_begin(c, MODEL_UNIT_PROLOG(m));
    if (c->l0 == 0) moe_prolog_backward(m, &b.k->mb, c->dh[b.cur]);
    unit_end(c, MODEL_UNIT_PROLOG(m));
    for (int i = 0; c->units && i < 3; i++) unit_finish(c, i); // the shard whole for this micro-batch
}

void chunk_backward(Chunk *c, int slot, bool defer) { backward(c, slot, defer, (Tensor){0}, (Tensor){0}); }

void chunk_weight(Chunk *c, int slot) {
    Model *m = c->m;
    ChunkRecord *k = &c->rec[slot];
    int L = m->cfg.layers, set = k->defer_set;
    CHECK(set >= 0 && set == c->defer_head % c->ndefer); // FIFO: the oldest deferred backward
    for (int l = c->l0; l < c->l1; l++) {
        LayerRec *r = rec_of(c, k, l);
        StageIO *io = &k->io[l];
        if (!weight_can_wait(m, io)) continue; // done in the backward
        io->dye = c->dye[set * L + l], r->dgu = c->dgu[set * L + l];
        if (!io->route) io->dy = io->dye; // (dense, or one ep rank)
        moe_stage3_backward_weight(m, l, r, &k->mb, io);
    }
    k->defer_set = -1, c->defer_head++;
}

// ---- the overlapped pair ----
// chunk_pair issues every all-to-all right after the compute that produces its rows, then runs the other
// micro-batch's compute before the wait: on the comm stream the all-to-alls come in the order of PithTrain's overlapped step
// (whose events, recorded after each compute, give the same overlap), and each runs beside the other side's
// stages: combine⁻¹ ∥ F stage 5/1, dispatch ∥ B stage 3, dispatch⁻¹ ∥ B weight gradients and F stage 3,
// combine ∥ B stage 1/5. The blocking collectives inside (the route's counts, the spill decision, a spilled
// layer's re-dispatch in b_stage5, a full-recompute replay) come in this fixed order on every ep rank.
static void pair(Chunk *fc, int fslot, Chunk *bc, int bslot, Tensor dy, Tensor dx) {
    CHECK(fc != bc && fc->l1 - fc->l0 == bc->l1 - bc->l0); // the transfer buffers are each chunk's own
    Model *m = fc->m;
    Cursor f = cursor(fc, fslot, fc->l0), b = backward_begin(bc, bslot, false, dy, dx);
    b_stage5(&b), b_combine(&b);
    if (fc->l0 == 0) moe_prolog_forward(m, &f.k->mb, f.k->h[0]);
    f_stage1(&f), f_dispatch(&f);
    for (int i = 0; i < fc->l1 - fc->l0; i++) {
        if (i > 0) {
            b_stage1(&b), b.l--, b_stage5(&b), b_combine(&b);
            f_stage5(&f), f.l++, f_stage1(&f), f_dispatch(&f);
        }
        b_stage3(&b), b_dispatch(&b), b_weight(&b), f_stage3(&f), f_combine(&f);
    }
    b_stage1(&b);
    if (bc->l0 == 0) moe_prolog_backward(m, &b.k->mb, bc->dh[b.cur]);
    f_stage5(&f);
    if (fc->l1 == m->cfg.layers) moe_epilog_forward(m, &f.k->epilog, &f.k->mb, f.k->h[fc->l1], true);
}

void chunk_pair(Chunk *fc, int fslot, Chunk *bc, int bslot) { pair(fc, fslot, bc, bslot, (Tensor){0}, (Tensor){0}); }

// Points record slot at the pipeline's x and y (the forward reads and writes them in place); true when the
// output must be copied to y after the forward instead (full recompute: a replay in backward rewrites it).
static bool bind_io(Chunk *c, int slot, Tensor x, Tensor y) {
    ChunkRecord *k = &c->rec[slot];
    if (x.p) k->h[c->l0] = x;
    if (!y.p) return false;
    if (c->m->recompute == RECOMPUTE_FULL) return true;
    k->h[c->l1] = y;
    return false;
}

void chunk_pipe_forward(Chunk *c, int slot, Tensor x, Tensor y, bool grad) {
    bool copy = bind_io(c, slot, x, y);
    chunk_forward(c, slot, grad);
    if (copy) op_copy(y, chunk_output(c, slot));
}

void chunk_pipe_backward(Chunk *c, int slot, Tensor dy, Tensor dx, bool defer) { backward(c, slot, defer, dy, dx); }

void chunk_pipe_pair(Chunk *fc, int fslot, Tensor x, Tensor y, Chunk *bc, int bslot, Tensor dy, Tensor dx) {
    bool copy = bind_io(fc, fslot, x, y);
    pair(fc, fslot, bc, bslot, dy, dx);
    if (copy) op_copy(y, chunk_output(fc, fslot));
}
