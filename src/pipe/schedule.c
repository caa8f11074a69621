// schedule.c — one pipeline chunk of layers [l0, l1) (every layer at pp = 1): forward prolog → (stage 1,
// 2, 3, 4, 5) per layer → epilog, then backward epilog → (5, 4, 3 input, 3 weight, 2, 1) per layer in
// reverse → prolog; the prolog only on the chunk that starts the model, the epilog on the one that ends it.
// All memory comes from arenas sized by engine_plan (activations, workspace, communication), so the
// step itself never allocates.
#include "pipe/schedule.h"

static void *rec_of(Engine *e, int l) { return e->recs + (size_t)l * e->m->fam->rec_size; }

// The allocation sequence of the activation arena; run on a counting arena it is the plan.
static void alloc_activations(Engine *e, Arena *a) {
    Model *m = e->m;
    int T = e->B * e->S;
    e->mb = (MicroBatch){e->B,
                         e->S,
                         T,
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0),
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0),
                         arena_tensor(a, DT_I32, 1, T, 0, 0, 0)};
    e->h[e->l0] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    for (int l = e->l0; l < e->l1; l++) {
        StageIO *io = &e->io[l];
        io->dense = !m->cfg.is_moe[l];
        if (!io->dense) { // the routing stage 1 writes
            io->idx = arena_tensor(a, DT_I32, 2, T, m->cfg.topk, 0, 0);
            io->w = arena_tensor(a, DT_F32, 2, T, m->cfg.topk, 0, 0);
        }
        m->fam->layer_alloc(m, l, rec_of(e, l), a, e->B, e->S, io);
        m->fam->stage3_alloc(m, l, rec_of(e, l), a, io->dense ? T : ep_rows_capacity(m, T));
        ep_alloc(m, io, a, T);
        e->h[l + 1] = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    }
    if (e->l1 == m->cfg.layers) m->fam->epilog_alloc(m, e->epilog, a, T);
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
    alloc_activations(&e, &act);
    alloc_grad_buffers(&e, &ws);
    size_t base = ws.used, most = 0;
    for (int l = l0; l < l1; l++) {
        ws.used = base;
        alloc_layer_grads(&e, l, &ws);
        if (ws.used - base > most) most = ws.used - base;
    }
    EnginePlan p = {act.peak, base + most + ARENA_ALIGN, comm.peak};
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
    alloc_activations(e, &e->act);
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
    free(e->recs), free(e->epilog), free(e->io), free(e->h);
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

void engine_forward(Engine *e, bool grad) {
    engine_forward_layers(e);
    if (e->l1 == e->m->cfg.layers) e->m->fam->epilog_forward(e->m, e->epilog, &e->mb, e->h[e->m->cfg.layers], grad);
}

void engine_forward_layers(Engine *e) {
    Model *m = e->m;
    const ModelFamily *f = m->fam;
    if (e->l0 == 0) f->prolog_forward(m, &e->mb, e->h[0]);
    for (int l = e->l0; l < e->l1; l++) {
        void *r = rec_of(e, l);
        StageIO *io = &e->io[l];
        f->stage1_forward(m, l, r, &e->mb, e->h[l], io);
        ep_dispatch_forward(m, io);
        f->stage3_forward(m, l, r, io);
        ep_combine_forward(m, io);
        f->stage5_forward(m, l, r, io, e->h[l + 1]);
    }
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
