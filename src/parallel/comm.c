// comm.c — comm.h: host buffers over MPI, device buffers over NCCL (parallel/nccl_comm.c). Each MPI call is
// started non-blocking (MPI-3 MPI_I*) and polled with MPI_Test until it completes or the group's deadline
// passes. Polling sleeps briefly between tests so ranks oversubscribed on few cores (tests, laptops) leave
// the CPU to the ranks doing work. Device calls return once queued; their deadline is the watchdog's.
#include "parallel/comm.h"

#include <limits.h>
#include <time.h>

#include "parallel/nccl_comm.h"
#include "ops/ops.h"

void mpi_check(int rc, const char *call, const char *file, int line) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    die("MPI call failed at %s:%d: %s: %s", file, line, call, msg);
}

Comm comm_self(const char *name) {
    Comm c = {.rank = 0, .size = 1, .dev = DEV_CPU, .mpi = MPI_COMM_NULL, .timeout_s = 0};
    snprintf(c.name, sizeof c.name, "%s", name);
    return c;
}

static MPI_Datatype mpi_type(DType dt) {
    switch (dt) {
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    case DT_U64: return MPI_UINT64_T;
    case DT_U32: return MPI_UINT32_T;
    case DT_BF16:
    case DT_F16:
    case DT_U16: return MPI_UINT16_T; // moved, never reduced
    case DT_U8: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
}

// Where a call's buffers live: false for host buffers (MPI; checks the counts fit MPI's int), true for
// device buffers (NCCL; dies when this build or this group has no NCCL).
static bool on_device(const Comm *c, const char *what, Tensor a, Tensor b) {
    bool da = a.dev == DEV_CUDA, db = b.p && b.dev == DEV_CUDA;
    if (b.p && da != db) die("%s on the %s group: one buffer on the host and one on the GPU", what, c->name);
    if (!da) {
        if (tensor_numel(a) > INT_MAX || (b.p && tensor_numel(b) > INT_MAX))
            die("%s on the %s group: %lld elements is above MPI's int count limit", what, c->name,
                (long long)tensor_numel(a));
        return false;
    }
#ifdef PITH_NCCL
    if (c->size > 1 && !c->nccl)
        die("%s on the %s group: device buffers, but the group has no NCCL communicator (dist_mesh_gpu)", what,
            c->name);
    return true;
#else
    die("%s on the %s group: device buffers need the NCCL transport, which this build does not have (a CUDA build that "
        "finds nccl.h)",
        what, c->name);
#endif
}

// Waits for n requests, dying when the group's deadline passes first.
static void mpi_wait(const Comm *c, int n, MPI_Request *req, const char *what) {
    double t0 = now_seconds();
    for (long spins = 0;; spins++) {
        int done = 0;
        MPI_CHECK(MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE));
        if (done) return;
        if (c->timeout_s > 0 && now_seconds() - t0 > c->timeout_s)
            die("%s on the %s group (%d ranks) did not complete within parallel.timeout_s = %g s: another rank failed "
                "or stopped",
                what, c->name, c->size, c->timeout_s);
        if (spins > 64) nanosleep(&(struct timespec){0, spins > 4096 ? 200000 : 20000}, NULL);
    }
}

// A group of one: in's bytes to the front of out (a device copy on the compute stream for GPU buffers).
static void local_copy(Tensor out, Tensor in) {
    CHECK(tensor_bytes(out) >= tensor_bytes(in));
    if (out.p == in.p || !tensor_bytes(in)) return;
    if (out.dev == DEV_CPU && in.dev == DEV_CPU) memcpy(out.p, in.p, tensor_bytes(in));
    else
        op_copy(tensor_make(out.p, in.dt, out.dev, 1, tensor_numel(in), 1, 1, 1),
                tensor_make(in.p, in.dt, in.dev, 1, tensor_numel(in), 1, 1, 1));
}

#ifdef PITH_NCCL
#define DEVICE_CALL(call)                                                                                              \
    do {                                                                                                               \
        call;                                                                                                          \
        return;                                                                                                        \
    } while (0)
#else
#define DEVICE_CALL(call) CHECK(!"unreachable: on_device dies without NCCL")
#endif

// MPI has no bf16 sum: a bf16 host reduction runs on an fp32 copy of in (each value exact), MPI sums the fp32 values,
// and this rank's part of the sum is rounded once to nearest even into out.
static void bf16_reduce(const Comm *c, Tensor out, Tensor in, bool scatter) {
    Tensor w = tf32_1(xmalloc(tensor_numel(in) * sizeof(float) + 1), tensor_numel(in));
    op_copy(w, in);
    if (scatter) comm_reduce_scatter(c, tensor_rows(w, 0, tensor_numel(out)), w);
    else comm_allreduce(c, w, COMM_SUM);
    op_copy(out, tensor_rows(w, 0, tensor_numel(out)));
    free(w.p);
}

void comm_allreduce(const Comm *c, Tensor x, CommOp op) {
    if (c->size == 1) return;
    if (on_device(c, "all-reduce", x, (Tensor){0})) DEVICE_CALL(nccl_allreduce(c, x, op));
    if (x.dt == DT_BF16 && op == COMM_SUM) return bf16_reduce(c, x, x, false);
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, x.p, (int)tensor_numel(x), mpi_type(x.dt),
                             op == COMM_SUM ? MPI_SUM : MPI_MAX, c->mpi, &req));
    mpi_wait(c, 1, &req, "all-reduce");
}

void comm_reduce_scatter(const Comm *c, Tensor out, Tensor in) {
    CHECK(tensor_numel(in) == c->size * tensor_numel(out) && in.dt == out.dt);
    if (c->size == 1) return local_copy(out, in);
    if (on_device(c, "reduce-scatter", in, out)) DEVICE_CALL(nccl_reduce_scatter(c, out, in));
    if (in.dt == DT_BF16) return bf16_reduce(c, out, in, true);
    MPI_Request req;
    MPI_CHECK(MPI_Ireduce_scatter_block(in.p == out.p ? MPI_IN_PLACE : in.p, out.p, (int)tensor_numel(out),
                                        mpi_type(in.dt), MPI_SUM, c->mpi, &req));
    mpi_wait(c, 1, &req, "reduce-scatter");
}

void comm_allgather(const Comm *c, Tensor out, Tensor in) {
    CHECK(tensor_numel(out) == c->size * tensor_numel(in) && in.dt == out.dt);
    if (c->size == 1) return local_copy(out, in);
    if (on_device(c, "all-gather", out, in)) DEVICE_CALL(nccl_allgather(c, out, in));
    MPI_Request req;
    bool in_place = (char *)in.p == (char *)out.p + (size_t)c->rank * tensor_bytes(in);
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.p, (int)tensor_numel(in), mpi_type(in.dt), out.p,
                             (int)tensor_numel(in), mpi_type(in.dt), c->mpi, &req));
    mpi_wait(c, 1, &req, "all-gather");
}

void comm_alltoall(const Comm *c, Tensor out, Tensor in) {
    CHECK(tensor_numel(out) == tensor_numel(in) && tensor_numel(in) % c->size == 0 && in.dt == out.dt);
    if (c->size == 1) return local_copy(out, in);
    if (on_device(c, "all-to-all", out, in)) DEVICE_CALL(nccl_alltoall(c, out, in));
    int n = (int)(tensor_numel(in) / c->size);
    MPI_Request req;
    MPI_CHECK(MPI_Ialltoall(in.p, n, mpi_type(in.dt), out.p, n, mpi_type(in.dt), c->mpi, &req));
    mpi_wait(c, 1, &req, "all-to-all");
}

void comm_alltoallv(const Comm *c, Tensor out, const int64_t *out_rows, Tensor in, const int64_t *in_rows) {
    CommReq r = comm_alltoallv_start(c, out, out_rows, in, in_rows);
    comm_wait(&r);
}

void comm_broadcast(const Comm *c, Tensor x, int root) {
    CHECK(root >= 0 && root < c->size);
    if (c->size == 1) return;
    if (on_device(c, "broadcast", x, (Tensor){0})) DEVICE_CALL(nccl_broadcast(c, x, root));
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(x.p, (int)tensor_numel(x), mpi_type(x.dt), root, c->mpi, &req));
    mpi_wait(c, 1, &req, "broadcast");
}

void comm_barrier(const Comm *c) {
    if (c->size == 1) return;
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(c->mpi, &req));
    mpi_wait(c, 1, &req, "barrier");
}

// ---- requests ----

CommReq comm_p2p_start(const Comm *c, const CommP2p *ops, int n) {
    CHECK(n >= 1 && n <= COMM_MAX_P2P);
    bool sends = false, recvs = false;
    for (int i = 0; i < n; i++) {
        CHECK(ops[i].peer >= 0 && ops[i].peer < c->size && ops[i].peer != c->rank);
        sends |= ops[i].send, recvs |= !ops[i].send;
    }
    CommReq r = {.c = c, .what = sends && recvs ? "send/recv" : sends ? "send" : "recv", .row = MPI_DATATYPE_NULL};
    bool dev = false;
    for (int i = 0; i < n; i++) dev = on_device(c, r.what, ops[0].x, ops[i].x);
#ifdef PITH_NCCL
    if (dev) return r.event = nccl_p2p_start(c, ops, n, r.what), r;
#endif
    CHECK(!dev);
    for (int i = 0; i < n; i++) {
        Tensor x = ops[i].x;
        if (!tensor_numel(x)) continue;
        if (ops[i].send)
            MPI_CHECK(MPI_Isend(x.p, (int)tensor_numel(x), mpi_type(x.dt), ops[i].peer, 0, c->mpi, &r.mpi[r.n++]));
        else MPI_CHECK(MPI_Irecv(x.p, (int)tensor_numel(x), mpi_type(x.dt), ops[i].peer, 0, c->mpi, &r.mpi[r.n++]));
    }
    return r;
}

void comm_exchange(const Comm *c, const CommP2p *ops, int n) {
    if (!n) return;
    CommReq r = comm_p2p_start(c, ops, n);
    comm_wait(&r);
}

CommReq comm_reduce_start(const Comm *c, Tensor x, int root) {
    CommReq r = {.c = c, .what = "reduce", .row = MPI_DATATYPE_NULL};
    CHECK(root >= 0 && root < c->size && (x.dt == DT_F32 || x.dt == DT_F64));
    if (c->size == 1) return r;
#ifdef PITH_NCCL
    if (on_device(c, r.what, x, (Tensor){0})) return r.event = nccl_reduce_start(c, x, root), r;
#else
    on_device(c, r.what, x, (Tensor){0});
#endif
    MPI_CHECK(MPI_Ireduce(c->rank == root ? MPI_IN_PLACE : x.p, x.p, (int)tensor_numel(x), mpi_type(x.dt), MPI_SUM,
                          root, c->mpi, &r.mpi[r.n++]));
    return r;
}

CommReq comm_alltoallv_start(const Comm *c, Tensor out, const int64_t *out_rows, Tensor in, const int64_t *in_rows) {
    CommReq r = {.c = c, .what = "all-to-all", .row = MPI_DATATYPE_NULL};
    CHECK(in.dt == out.dt);
    int64_t row = 1, nin = 0, nout = 0;
    for (int i = 1; i < in.nd; i++) row *= in.n[i];
    CHECK(out.nd == in.nd);
    for (int i = 1; i < in.nd; i++) CHECK(out.n[i] == in.n[i]);
    for (int p = 0; p < c->size; p++) nin += in_rows[p], nout += out_rows[p];
    CHECK(nin <= in.n[0] && nout <= out.n[0]);
    if (c->size == 1) return local_copy(tensor_rows(out, 0, nout), tensor_rows(in, 0, nin)), r;
#ifdef PITH_NCCL
    if (on_device(c, r.what, out, in)) return r.event = nccl_alltoallv_start(c, out, out_rows, in, in_rows), r;
#else
    on_device(c, r.what, out, in);
#endif
    // Counts and displacements in rows (one row is one element of a contiguous datatype); MPI reads
    // them until the exchange completes, so the request keeps them.
    int *cnt = r.counts = xmalloc((size_t)4 * c->size * sizeof(int)), *sd = cnt + c->size, *rc = sd + c->size,
        *rd = rc + c->size;
    int64_t so = 0, ro = 0;
    for (int p = 0; p < c->size; p++) {
        CHECK(so + in_rows[p] <= INT_MAX && ro + out_rows[p] <= INT_MAX);
        cnt[p] = (int)in_rows[p], sd[p] = (int)so, rc[p] = (int)out_rows[p], rd[p] = (int)ro;
        so += in_rows[p], ro += out_rows[p];
    }
    MPI_CHECK(MPI_Type_contiguous((int)row, mpi_type(in.dt), &r.row));
    MPI_CHECK(MPI_Type_commit(&r.row));
    MPI_CHECK(MPI_Ialltoallv(in.p, cnt, sd, r.row, out.p, rc, rd, r.row, c->mpi, &r.mpi[r.n++]));
    return r;
}

void comm_wait(CommReq *r) {
#ifdef PITH_NCCL
    if (r->event) nccl_wait(r->event);
#endif
    if (r->n) mpi_wait(r->c, r->n, r->mpi, r->what);
    if (r->row != MPI_DATATYPE_NULL) MPI_CHECK(MPI_Type_free(&r->row));
    free(r->counts);
    r->n = 0, r->event = NULL, r->counts = NULL, r->row = MPI_DATATYPE_NULL;
}
