// fsdp.c — sharding the flat parameter groups (see fsdp.h). Gradient semantics: every rank's model.g
// holds ∂(its micro-batches' summed objective)/∂θ for the parameters it computes with; the reduce-scatter
// sums them over the shard group and hsdp's all-reduce over the replicas, so each shard ends up with the
// gradient of the sum over the whole global batch (the trainer then divides by the global token count).
// Non-expert parameters: summed over dp×cp×ep (every rank of the stage). Expert parameters: summed over
// dp×cp — the ep ranks hold different experts, and each expert's gradient already covers the tokens every
// ep rank dispatched to it. Nothing is averaged, so no layout scales any gradient (PithTrain's experts are
// ep× too large there).
#include "parallel/fsdp.h"

#include "base/half.h"
#include "ops/ops.h"

int fsdp_shards(const Dist *d, int g) {
    if (g == GROUP_EXPERT) return d->hsdp ? d->cp : d->dp * d->cp;
    return d->hsdp ? d->cp * d->ep : d->dp * d->cp * d->ep;
}

void fsdp_setup(Fsdp *f, const Dist *d, const Tensor w[NGROUPS], bool units) {
    memset(f, 0, sizeof *f);
    f->units = units;
    for (int g = 0; g < NGROUPS; g++) {
        f->shard[g] = g == GROUP_EXPERT ? (d->hsdp ? &d->cp_g : &d->dp_cp) : (d->hsdp ? &d->cp_ep : &d->dp_cp_ep);
        f->replica[g] = d->hsdp ? &d->dp_g : NULL;
        int n = f->shard[g]->size;
        CHECK(n == fsdp_shards(d, g));
        f->numel[g] = tensor_numel(w[g]);
        CHECK(f->numel[g] % n == 0); // the model pads its groups to the shard count
        f->len[g] = f->numel[g] / n;
        f->off[g] = f->shard[g]->rank * f->len[g];
    }
    f->world = &d->world;
    f->counts_in_norm = !d->hsdp || d->dp_g.rank == 0;
}

static bool one_shard(const Fsdp *f, int g) { return f->shard[g]->size == 1; }

void fsdp_alloc_state(const Fsdp *f, const Tensor w[NGROUPS], const Tensor gr[NGROUPS], Arena *a, Arena *moments,
                      DType mdt, Tensor master[NGROUPS], Tensor grad[NGROUPS], Tensor mom1[NGROUPS],
                      Tensor mom2[NGROUPS]) {
    for (int g = 0; g < NGROUPS; g++) {
        bool whole = one_shard(f, g);
        master[g] =
            whole && w[g].dev == a->dev && w[g].dt == DT_F32 ? w[g] : arena_tensor(a, DT_F32, 1, f->len[g], 0, 0, 0);
        grad[g] = g == GROUP_DENSE && f->units ? arena_tensor(a, DT_F32, 1, f->len[g], 0, 0, 0)
                  : whole                      ? gr[g]
                                               : tensor_rows(gr[g], 0, f->len[g]); // in place: the sum lands in front
        mom1[g] = arena_tensor(moments, mdt, 1, f->len[g], 0, 0, 0);
        mom2[g] = arena_tensor(moments, mdt, 1, f->len[g], 0, 0, 0);
    }
}

// The shard is converted into this rank's block of the compute copy (fp32 → bf16 on the GPU), then the
// compute copy is all-gathered in place. Converting before gathering moves half the bytes of gathering
// fp32 and needs no whole-size fp32 staging buffer; rounding is per element, so the bits are the same.
void fsdp_gather(const Fsdp *f, int g, Tensor full, Tensor shard) {
    if (full.p == shard.p) return;
    Tensor mine = tensor_rows(full, f->off[g], f->len[g]);
    op_copy(mine, shard); // converts to the compute dtype, crosses to the device
    if (!one_shard(f, g)) comm_allgather(f->shard[g], full, mine);
}

Tensor fsdp_own_rows(const Fsdp *f, int g, Tensor full, Tensor shard) {
    if (full.p == shard.p || full.dev != shard.dev) return (Tensor){0};
    return tensor_rows(full, f->off[g], f->len[g]);
}

void fsdp_gather_rest(const Fsdp *f, int g, Tensor full, Tensor own) {
    if (!one_shard(f, g)) comm_allgather(f->shard[g], full, own);
}

void fsdp_reduce_scatter(const Fsdp *f, int g, Tensor shard, Tensor full) {
    CHECK(shard.p == full.p || !full.p); // in place (fsdp_alloc_state): no separate buffer for the reduced shard
    if (full.p) comm_reduce_scatter(f->shard[g], shard, full);
    if (f->replica[g]) comm_allreduce(f->replica[g], shard, COMM_SUM);
}

// The part of win (its range from off) in rank q's shard, or an empty tensor.
static Tensor owned_part(const Fsdp *f, int g, Tensor win, int64_t off, int q, int64_t *at) {
    int64_t len = f->len[g], end = off + tensor_numel(win);
    int64_t a = off > q * len ? off : q * len, b = end < (q + 1) * len ? end : (q + 1) * len;
    *at = a - q * len;
    return a < b ? tensor_rows(win, a - off, b - a) : (Tensor){0};
}

int fsdp_reduce_unit_start(const Fsdp *f, int g, Tensor win, int64_t off, CommReq *req) {
    int n = 0;
    int64_t at;
    for (int q = 0; q < f->shard[g]->size; q++) {
        Tensor part = owned_part(f, g, win, off, q, &at);
        if (part.p) req[n++] = comm_reduce_start(f->shard[g], part, q);
    }
    return n;
}

void fsdp_reduce_unit_finish(const Fsdp *f, int g, Tensor shard, Tensor win, int64_t off, CommReq *req, int n) {
    for (int i = 0; i < n; i++) comm_wait(&req[i]);
    int64_t at;
    Tensor mine = owned_part(f, g, win, off, f->shard[g]->rank, &at);
    if (mine.p) op_add(tensor_rows(shard, at, tensor_numel(mine)), mine);
}

void fsdp_take_shard(const Fsdp *f, int g, Tensor shard, const float *full) {
    op_copy(shard, tf32_1((void *)(full + f->off[g]), f->len[g]));
}

void fsdp_gather_host(const Fsdp *f, int g, float *full, Tensor shard) {
    Tensor host = tf32_1(full, f->numel[g]);
    if (one_shard(f, g)) op_copy(host, shard);
    else if (shard.dev == DEV_CPU && shard.dt == DT_F32) comm_allgather(f->shard[g], host, shard);
    else { // a device or bf16 shard goes through an fp32 host copy
        Tensor mine = tf32_1(xmalloc(f->len[g] * sizeof(float) + 1), f->len[g]);
        op_copy(mine, shard);
        comm_allgather(f->shard[g], host, mine);
        free(mine.p);
    }
}

double fsdp_sum_squares(const Fsdp *f, const Tensor shard[NGROUPS]) {
    double ss = 0;
    if (f->counts_in_norm)
        for (int g = 0; g < NGROUPS; g++) ss += op_sum_squares(shard[g]);
    Tensor t = tensor_make(&ss, DT_F64, DEV_CPU, 1, 1, 1, 1, 1);
    comm_allreduce(f->world, t, COMM_SUM);
    return ss;
}
