// schedule.c — one pipeline chunk of layers [l0, l1) (every layer at pp = 1): forward prolog → (stage 1,
// 2, 3, 4, 5) per layer → epilog, then backward epilog → (5, 4, 3 input, 3 weight, 2, 1) per layer in
// reverse → prolog; the prolog only on the chunk that starts the model, the epilog on the one that ends it.
// All memory comes from arenas sized by engine_plan (activations, workspace, communication), so the
// step itself never allocates. Expert capacity (docs/architecture.md, "Expert capacity"): a MoE layer's own
// stage-3 buffers hold ep_rows_capacity rows; a layer that receives more on any rank of its ep group runs
// stage 3 on the engine's spill set (the worst case of one layer) and recomputes it there in backward.
// Activation recomputation ("Activation recomputation" there): selective keeps no SwiGLU outputs (stage 3's
// weight gradient recomputes them), full keeps a layer's input and routing and reruns its forward in backward.
#include "pipe/schedule.h"

static void *rec_of(Engine *e, int l) { return e->recs + (size_t)l * e->m->fam->rec_size; }

// Points layer l's stage-3 rows (expert-ordered inputs, activations, route permutations) at b.
static void use_rows(Engine *e, int l, const ExpertRows *b) {
    StageIO *io = &e->io[l];
    MlpRec *r = rec_of(e, l); // a family record begins with its MlpRec
    io->xe = b->xe, r->gu = b->gu, r->act = b->act;
    if (io->route) io->route->perm_r = b->perm_r, io->route->xrow = b->xrow;
}

static ExpertRows rows_of(Engine *e, int l) {
    StageIO *io = &e->io[l];
    MlpRec *r = rec_of(e, l);
    return (ExpertRows){io->xe, r->gu, r->act, io->route ? io->route->perm_r : (Tensor){0},
                        io->route ? io->route->xrow : (Tensor){0}};
}

// The spill set: stage-3 rows for the worst case of one layer, shared by every layer that overflows (their
// stage 3 is recomputed in backward). A MoE layer's record and route borrow the layout of layer `l`.
static void alloc_spill(Engine *e, int l, Arena *a) {
    Model *m = e->m;
    int64_t W = ep_rows_worst(m, (int64_t)e->B * e->S);
    ExpertRows own = rows_of(e, l);
    m->fam->stage3_alloc(m, l, rec_of(e, l), a, W);
    e->spill = (ExpertRows){arena_tensor(a, m->cdt, 2, W, m->cfg.hidden, 0, 0), ((MlpRec *)rec_of(e, l))->gu,
                            ((MlpRec *)rec_of(e, l))->act, arena_tensor(a, DT_I32, 1, W, 0, 0, 0),
                            arena_tensor(a, DT_I32, 1, W, 0, 0, 0)};
    use_rows(e, l, &own);
}

// A (rows, cols) view of the front of a staging buffer.
static Tensor staging_view(Tensor buf, int64_t rows, int64_t cols) {
    return tensor_make(buf.p, buf.dt, buf.dev, 2, rows, cols, 1, 1);
}

// The allocation sequence of the activation arena; run on a counting arena it is the plan. p (may be NULL)
// gets the bytes by part, from the arena's marks (padding included, so the parts sum to the total).
static void alloc_activations(Engine *e, Arena *a, EnginePlan *p) {
    Model *m = e->m;
    int T = e->B * e->S;
    bool full = m->recompute == RECOMPUTE_FULL;
    EnginePlan parts = {0};
    e->mb = (MicroBatch){e->B,
                         e->S,
                         T,
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0),
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0),
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0)};
    e->h[e->l0] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    int moe = -1; // a MoE layer of the chunk
    for (int l = e->l0; l < e->l1; l++) {
        StageIO *io = &e->io[l];
        io->dense = !m->cfg.is_moe[l];
        if (!io->dense) { // the routing stage 1 writes
            io->idx = arena_tensor(a, DT_I32, 2, T, m->cfg.topk, 0, 0);
            io->w = arena_tensor(a, DT_F32, 2, T, m->cfg.topk, 0, 0);
            moe = l;
        }
        if (full) e->h[l + 1] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    }
    parts.act_hidden = arena_mark(a);
    // Each layer's record and stage buffers; under full recompute all layers share one region (a layer keeps
    // its input, output and routing above; backward reruns its forward into the region).
    size_t shared = arena_mark(a), top = shared;
    for (int l = e->l0; l < e->l1; l++) {
        StageIO *io = &e->io[l];
        if (full) arena_reset(a, shared);
        size_t m0 = arena_mark(a);
        m->fam->layer_alloc(m, l, rec_of(e, l), a, e->B, e->S, io);
        size_t m1 = arena_mark(a);
        m->fam->stage3_alloc(m, l, rec_of(e, l), a, io->dense ? T : ep_rows_capacity(m, T));
        ep_alloc(m, io, a, T);
        e->own[l] = rows_of(e, l);
        size_t m2 = arena_mark(a);
        if (!full) e->h[l + 1] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
        parts.act_hidden += arena_mark(a) - m2;
        if (!full) parts.act_stage1 += m1 - m0, parts.act_experts += m2 - m1;
        else if (m2 - shared > top - shared) parts.act_stage1 = m1 - m0, parts.act_experts = m2 - m1;
        if (arena_mark(a) > top) top = arena_mark(a);
    }
    arena_reset(a, top);
    size_t m3 = arena_mark(a);
    // Expert outputs before combine (ye) are staging: one buffer for every MoE layer, as many rows as stage 3 holds.
    bool spills = moe >= 0 && ep_spills(m, T);
    int64_t W = spills ? ep_rows_worst(m, T) : 0;
    if (moe >= 0) {
        Tensor ye = arena_tensor(a, m->cdt, 2, spills ? W : ep_rows_capacity(m, T), m->cfg.hidden, 0, 0);
        for (int l = e->l0; l < e->l1; l++)
            if (!e->io[l].dense) e->io[l].ye = ye;
    }
    size_t m4 = arena_mark(a);
    if (spills) alloc_spill(e, moe, a);
    size_t m5 = arena_mark(a);
    if (m->recompute == RECOMPUTE_SELECTIVE) { // SwiGLU outputs: staging, recomputed from gu in backward
        int64_t most = W * m->cfg.moe_inter;
        for (int l = e->l0; l < e->l1; l++)
            if (tensor_numel(e->own[l].gu) / 2 > most) most = tensor_numel(e->own[l].gu) / 2;
        Tensor act = arena_tensor(a, m->cdt, 1, most, 0, 0, 0);
        for (int l = e->l0; l < e->l1; l++) {
            e->own[l].act = staging_view(act, e->own[l].gu.n[0], e->own[l].gu.n[1] / 2);
            use_rows(e, l, &e->own[l]);
        }
        if (spills) e->spill.act = staging_view(act, W, m->cfg.moe_inter);
    }
    size_t m6 = arena_mark(a);
    if (e->l1 == m->cfg.layers) m->fam->epilog_alloc(m, e->epilog, a, T);
    parts.act_staging = (m4 - m3) + (m6 - m5), parts.act_spill = m5 - m4, parts.act_epilog = arena_mark(a) - m6;
    if (p)
        p->act_hidden = parts.act_hidden, p->act_stage1 = parts.act_stage1, p->act_experts = parts.act_experts,
        p->act_staging = parts.act_staging, p->act_spill = parts.act_spill, p->act_epilog = parts.act_epilog;
}

// One layer's backward workspace: the family's temporaries, stage 3's, the stage buffers' gradients.
static void alloc_layer_grads(Engine *e, int l, Arena *ws) {
    Model *m = e->m;
    StageIO *io = &e->io[l];
    m->fam->layer_grad_alloc(m, l, rec_of(e, l), ws, e->B, e->S, io);
    if (!io->dense) io->dw = arena_tensor(ws, DT_F32, 2, (int64_t)e->B * e->S, m->cfg.topk, 0, 0);
    m->fam->stage3_grad_alloc(m, l, rec_of(e, l), ws);
    ep_grad_alloc(m, io, ws, (int64_t)e->B * e->S);
}

static void alloc_grad_buffers(Engine *e, Arena *ws) {
    int T = e->B * e->S;
    for (int i = 0; i < 2; i++) e->dh[i] = arena_tensor(ws, e->m->cdt, 2, T, e->m->cfg.hidden, 0, 0);
}

static void engine_structs(Engine *e, Model *m, int B, int S, int l0, int l1) {
    CHECK(0 <= l0 && l0 < l1 && l1 <= m->cfg.layers);
    memset(e, 0, sizeof *e);
    e->m = m, e->B = B, e->S = S, e->l0 = l0, e->l1 = l1;
    e->recs = xcalloc(m->cfg.layers, m->fam->rec_size);
    e->epilog = xcalloc(1, m->fam->epilog_size);
    e->io = xcalloc(m->cfg.layers, sizeof(StageIO));
    e->own = xcalloc(m->cfg.layers, sizeof(ExpertRows));
    e->h = xcalloc(m->cfg.layers + 1, sizeof(Tensor));
    for (int l = 0; l < m->cfg.layers; l++) {
        e->io[l].offs = xcalloc(m->cfg.experts + 1, sizeof(int64_t));
        e->io[l].route = ep_route_create(m, &e->epb);
    }
}

EnginePlan engine_plan(Model *m, int B, int S) { return engine_plan_chunk(m, B, S, 0, m->cfg.layers); }
void engine_init(Engine *e, Model *m, int B, int S) { engine_init_chunk(e, m, B, S, 0, m->cfg.layers); }

EnginePlan engine_plan_chunk(Model *m, int B, int S, int l0, int l1) {
    Engine e;
    engine_structs(&e, m, B, S, l0, l1);
    Arena act = arena_counting("activations", m->dev), ws = arena_counting("workspace", m->dev),
          comm = arena_counting("communication", m->dev);
    ep_buffers_alloc(m, &e.epb, &comm, (int64_t)B * S);
    EnginePlan parts = {0};
    alloc_activations(&e, &act, &parts);
    alloc_grad_buffers(&e, &ws);
    size_t base = ws.used, most = 0;
    for (int l = l0; l < l1; l++)
        for (int spilled = 0; spilled < 1 + (e.spill.xe.n[0] && !e.io[l].dense); spilled++) {
            ws.used = base;
            if (spilled) use_rows(&e, l, &e.spill); // a spilled layer's backward: the gradients of the spill set
            alloc_layer_grads(&e, l, &ws);
            if (ws.used - base > most) most = ws.used - base;
            if (spilled) use_rows(&e, l, &e.own[l]);
        }
    EnginePlan p = parts;
    p.act_bytes = act.peak, p.ws_bytes = base + most + ARENA_ALIGN, p.comm_bytes = comm.peak;
    engine_free(&e);
    return p;
}

void engine_init_chunk(Engine *e, Model *m, int B, int S, int l0, int l1) {
    EnginePlan p = engine_plan_chunk(m, B, S, l0, l1);
    engine_structs(e, m, B, S, l0, l1);
    e->act = arena_create("activations", m->dev, p.act_bytes);
    e->ws = arena_create("workspace", m->dev, p.ws_bytes);
    e->comm = arena_create("communication", m->dev, p.comm_bytes);
    ep_buffers_alloc(m, &e->epb, &e->comm, (int64_t)B * S);
    alloc_activations(e, &e->act, NULL);
    alloc_grad_buffers(e, &e->ws);
    // Positions restart in every sequence of the micro-batch.
    int T = B * S;
    int32_t *pos = xmalloc(T * sizeof(int32_t));
    for (int t = 0; t < T; t++) pos[t] = t % S;
    op_copy(e->mb.pos, tensor_make(pos, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
    free(pos);
}

void engine_free(Engine *e) {
    for (int l = 0; e->io && l < e->m->cfg.layers; l++) free(e->io[l].offs), ep_route_free(e->io[l].route);
    ep_buffers_free(&e->epb);
    free(e->recs), free(e->epilog), free(e->io), free(e->own), free(e->h);
    if (e->act.cap) arena_destroy(&e->act);
    if (e->ws.cap) arena_destroy(&e->ws);
    if (e->comm.cap) arena_destroy(&e->comm);
    memset(e, 0, sizeof *e);
}

void engine_load(Engine *e, const int32_t *tokens, const int32_t *labels) {
    int T = e->mb.T;
    op_copy(e->mb.tokens, tensor_make((void *)tokens, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
    op_copy(e->mb.labels, tensor_make((void *)labels, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
}

// Layer l's stages 1–5. A replay (full recompute, in backward) reruns them on the same input and weights,
// which gives the same bits; m->replay keeps the load-balancing sums and expert counts from counting twice.
static void layer_forward(Engine *e, int l, bool replay) {
    Model *m = e->m;
    const ModelFamily *f = m->fam;
    void *r = rec_of(e, l);
    StageIO *io = &e->io[l];
    m->replay = replay;
    f->stage1_forward(m, l, r, &e->mb, e->h[l], io);
    if (!io->dense) use_rows(e, l, &e->own[l]); // a forward starts on the layer's own rows
    ep_dispatch_route(m, io);
    if (io->route) {
        if (io->route->spill) use_rows(e, l, &e->spill);
        if (!replay) e->ep_over += io->route->over;
        if (io->route->rows > e->ep_rows_peak) e->ep_rows_peak = io->route->rows;
    }
    ep_dispatch_rows(m, io);
    f->stage3_forward(m, l, r, io);
    ep_combine_forward(m, io);
    f->stage5_forward(m, l, r, io, e->h[l + 1]);
    m->replay = false;
}

void engine_forward(Engine *e, bool grad) {
    engine_forward_layers(e);
    if (e->l1 == e->m->cfg.layers) e->m->fam->epilog_forward(e->m, e->epilog, &e->mb, e->h[e->m->cfg.layers], grad);
}

void engine_forward_layers(Engine *e) {
    Model *m = e->m;
    const ModelFamily *f = m->fam;
    if (e->l0 == 0) f->prolog_forward(m, &e->mb, e->h[0]);
    for (int l = e->l0; l < e->l1; l++) layer_forward(e, l, false);
}

void engine_backward(Engine *e) {
    Model *m = e->m;
    const ModelFamily *f = m->fam;
    int cur = 0;
    if (e->l1 == m->cfg.layers) f->epilog_backward(m, e->epilog, e->dh[cur]);
    for (int l = e->l1 - 1; l >= e->l0; l--) {
        void *r = rec_of(e, l);
        StageIO *io = &e->io[l];
        size_t mark = arena_mark(&e->ws);
        // What later layers overwrote since the forward (nothing ran after the chunk's last layer): under full
        // recompute the whole record; a spilled layer's spill set (dispatch and stage 3 again).
        bool intact = l == e->l1 - 1;
        if (!intact && m->recompute == RECOMPUTE_FULL) layer_forward(e, l, true);
        else if (!intact && io->route && io->route->spill) {
            ep_dispatch_route(m, io);
            ep_dispatch_rows(m, io);
            f->stage3_forward(m, l, r, io);
        }
        alloc_layer_grads(e, l, &e->ws);
        f->stage5_backward(m, l, r, io, e->dh[cur]);
        ep_combine_backward(m, io);
        f->stage3_backward_input(m, l, r, io);
        f->stage3_backward_weight(m, l, r, io);
        ep_dispatch_backward(m, io);
        f->stage1_backward(m, l, r, &e->mb, io, e->dh[cur], e->dh[1 - cur]);
        arena_reset(&e->ws, mark);
        cur = 1 - cur;
    }
    if (e->l0 == 0) f->prolog_backward(m, &e->mb, e->dh[cur]);
}

Tensor engine_input_grad(const Engine *e) { return e->dh[(e->l1 - e->l0) % 2]; }
