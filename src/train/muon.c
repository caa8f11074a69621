// muon.c — the Muon optimizer step (see muon.h). The update of one matrix needs the whole matrix, so the
// momentum-updated shards are all-gathered into the group's whole fp32 buffer (model.g, whose gradient is
// spent once reduce-scattered) and every rank orthogonalises the matrices that overlap its own shard —
// with expert parallelism each ep rank therefore handles only its own experts, and a matrix is computed
// twice only where it straddles two shards. Results are the same on every rank that computes them (same
// input, same ops), so every layout gives the one-process update.
#include "train/muon.h"

#include <math.h>

bool muon_param(const char *name, int nd) {
    if (nd < 2 || str_ends_with(name, ".bias") || str_ends_with(name, "_bias")) return false;
    if (str_ends_with(name, "embed_tokens.weight") || str_ends_with(name, "lm_head.weight")) return false;
    return !strstr(name, ".gate.weight") && !strstr(name, ".router.weight");
}

void muon_setup(Muon *mu, const ParamTable *t, Arena *a) {
    memset(mu, 0, sizeof *mu);
    mu->on = true;
    int64_t ws = 0;
    for (int g = 0; g < NGROUPS; g++) {
        mu->runs[g] = xcalloc(t->n + 1, sizeof(MuonRun)), mu->batches[g] = xcalloc(t->n + 1, sizeof(MuonBatch));
        for (int i = 0; i < t->n; i++) {
            const ParamInfo *p = &t->p[i];
            if (p->group != g) continue;
            bool muon = muon_param(p->name, p->nd);
            int64_t numel = params_numel(p), n = p->shape[p->nd - 2], m = p->shape[p->nd - 1];
            MuonRun *r = mu->nruns[g] ? &mu->runs[g][mu->nruns[g] - 1] : NULL;
            if (r && r->muon == muon && r->hi == p->off) r->hi += numel;
            else mu->runs[g][mu->nruns[g]++] = (MuonRun){p->off, p->off + numel, muon};
            if (!muon) continue;
            MuonBatch *b = mu->nbatches[g] ? &mu->batches[g][mu->nbatches[g] - 1] : NULL;
            if (b && b->n == n && b->m == m && b->off + b->count * n * m == p->off) b->count += numel / (n * m);
            else mu->batches[g][mu->nbatches[g]++] = (MuonBatch){p->off, n, m, numel / (n * m)};
            int64_t need = op_newton_schulz_workspace(n, m);
            if (need > ws) ws = need;
        }
    }
    mu->ws = arena_tensor(a, DT_F32, 1, ws ? ws : 1, 0, 0, 0);
}

void muon_free(Muon *mu) {
    for (int g = 0; g < NGROUPS; g++) free(mu->runs[g]), free(mu->batches[g]);
    memset(mu, 0, sizeof *mu);
}

void muon_step(const Muon *mu, const Fsdp *f, Model *m, const TrainConfig *c, double lr, int t, Tensor master[NGROUPS],
               Tensor grad[NGROUPS], Tensor mom1[NGROUPS], Tensor mom2[NGROUPS]) {
    float beta = (float)c->optimizer.momentum, wd = (float)c->optimizer.weight_decay;
    for (int g = 0; g < NGROUPS; g++) {
        int64_t s0 = f->off[g], s1 = s0 + f->len[g];
        // This rank's shard: AdamW runs step; Muon runs turn their gradient into the update.
        for (int i = 0; i < mu->nruns[g]; i++) {
            const MuonRun *r = &mu->runs[g][i];
            int64_t lo = r->lo > s0 ? r->lo : s0, hi = r->hi < s1 ? r->hi : s1;
            if (lo >= hi) continue;
#define SLICE(x) tensor_rows((x), lo - s0, hi - lo)
            if (r->muon) op_muon_momentum(SLICE(mom1[g]), SLICE(grad[g]), beta);
            else
                op_adamw(SLICE(master[g]), SLICE(grad[g]), SLICE(mom1[g]), SLICE(mom2[g]), (Tensor){0}, 1.0f, (float)lr,
                         (float)c->optimizer.betas[0], (float)c->optimizer.betas[1], (float)c->optimizer.eps, wd, t);
        }
        if (!mu->nbatches[g]) continue;
        // The whole update in model.g: the shard moves to its block, then the blocks are all-gathered in place.
        Tensor full = m->g[g];
        if (f->len[g] != f->numel[g]) { // several shards (the front of model.g holds this rank's)
            Tensor mine = tensor_rows(full, f->off[g], f->len[g]);
            if (f->off[g]) op_copy(mine, grad[g]);
            comm_allgather(f->shard[g], full, mine);
        }
        // Newton–Schulz of the matrices that overlap [s0, s1), scaled by 0.2·√max(n, m) (Moonlight).
        for (int i = 0; i < mu->nbatches[g]; i++) {
            const MuonBatch *b = &mu->batches[g][i];
            int64_t nm = b->n * b->m, first = (s0 - b->off) / nm, last = (s1 - b->off + nm - 1) / nm;
            if (first < 0) first = 0;
            if (last > b->count) last = b->count;
            if (first >= last) continue;
            Tensor x =
                tensor_make((float *)full.p + b->off + first * nm, DT_F32, full.dev, 3, last - first, b->n, b->m, 1);
            op_newton_schulz(x, mu->ws, 5);
            op_scale(x, (float)(0.2 * sqrt((double)(b->n > b->m ? b->n : b->m))));
        }
        // Decoupled weight decay and the update, on this rank's part of each Muon run.
        for (int i = 0; i < mu->nruns[g]; i++) {
            const MuonRun *r = &mu->runs[g][i];
            int64_t lo = r->lo > s0 ? r->lo : s0, hi = r->hi < s1 ? r->hi : s1;
            if (r->muon && lo < hi)
                op_muon_apply(SLICE(master[g]), tensor_rows(full, lo, hi - lo), (float)lr, wd, 1.0f);
        }
#undef SLICE
    }
}
