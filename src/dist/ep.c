// ep.c — dispatch and combine on one expert-parallel rank: a stable sort of the T·k (token, slot) pairs
// by expert, a gather of the token rows into expert order (stage 2), and the inverse scatter of the
// expert outputs back to slot order (stage 4). Backward: combine⁻¹ is a gather, dispatch⁻¹ a scatter-add
// (a token sent to k experts receives the sum of its k row gradients).
#include "dist/ep.h"

int64_t ep_rows_capacity(const Model *m, int64_t T) { return T * m->cfg.topk; }

void ep_alloc(Model *m, StageIO *io, Arena *a, int64_t T) {
    int64_t H = m->cfg.hidden, k = m->cfg.topk;
    if (io->dense) {
        io->xe = io->xd;
        io->ye = arena_tensor(a, m->cdt, 2, T, H, 0, 0);
        io->y = io->ye;
        return;
    }
    int64_t R = ep_rows_capacity(m, T);
    io->perm = arena_tensor(a, DT_I32, 1, T * k, 0, 0, 0);
    io->xe = arena_tensor(a, m->cdt, 2, R, H, 0, 0);
    io->ye = arena_tensor(a, m->cdt, 2, R, H, 0, 0);
    io->y = arena_tensor(a, m->cdt, 2, T * k, H, 0, 0);
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
    int64_t R = ep_rows_capacity(m, T);
    io->dy = arena_tensor(ws, m->cdt, 2, T * k, H, 0, 0);
    io->dye = arena_tensor(ws, m->cdt, 2, R, H, 0, 0);
    io->dxe = arena_tensor(ws, m->cdt, 2, R, H, 0, 0);
    io->dxd = arena_tensor(ws, m->cdt, 2, T, H, 0, 0);
}

void ep_dispatch_forward(Model *m, StageIO *io) {
    if (io->dense) return;
    op_moe_sort(io->perm, io->offs, io->idx, m->cfg.experts);
    op_gather_rows(io->xe, io->xd, io->perm, m->cfg.topk);
}

void ep_combine_forward(Model *m, StageIO *io) {
    if (!io->dense) op_scatter_rows(io->y, io->ye, io->perm);
}

void ep_combine_backward(Model *m, StageIO *io) {
    if (!io->dense) op_gather_rows(io->dye, io->dy, io->perm, 1);
}

void ep_dispatch_backward(Model *m, StageIO *io) {
    if (io->dense) return;
    op_zero(io->dxd);
    op_gather_rows_backward(io->dxd, io->dxe, io->perm, m->cfg.topk);
}
