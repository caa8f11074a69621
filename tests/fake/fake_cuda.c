// fake_cuda.c — FAKE_CUDA builds only (tests/fake/fake.mk): the CUDA backend (ops/cuda/cuda_ops.h), the CUDA
// runtime calls and the NCCL API of parallel/nccl_comm.c on a machine without a GPU, so the NCCL transport's
// code runs in CI. "Device" memory is host memory from cuda_alloc_or_die (its ranges are remembered), ops
// are the CPU ops (fp32), streams execute at once, NCCL is blocking MPI on a communicator per NCCL one.
// What a real GPU would punish is checked instead of computed:
//   - every op and every NCCL buffer is device memory where its tensor says DEV_CUDA (host memory where
//     it says DEV_CPU), every device copy stays inside device memory;
//   - stream order: each stream counts its work; an event remembers (stream, count) when recorded and
//     cudaStreamWaitEvent makes a stream depend on it. A collective on the comm stream must depend on all
//     compute work issued before it, and compute work (an op, a read to the host) that touches a buffer
//     of a collective must depend on that collective — what events must guarantee on a GPU, where
//     streams overlap. Compute on other buffers may run beside a collective it has not waited for (the
//     asynchronous requests of comm.h);
//   - NCCL calls run on the comm stream, in-place forms are NCCL's, no other buffer overlap.
// A group of sends and receives (ncclGroupStart/End) is posted to MPI when it is issued and finished when
// something depends on it: a compute-stream wait on an event recorded after it, another NCCL call that is
// not a group (groups queue behind each other, up to 8), or a stream synchronisation; until then the host
// runs on, and the watchdog's cudaEventQuery sees the call incomplete (a peer that never posts times out as
// on a GPU). PITH_FAKE_NCCL_DELAY_MS makes every group last at least that long after its issue or the end
// of the group before it (one call at a time on the stream), and PITH_FAKE_OP_DELAY_US every op at least
// that long, so tests can see transfers overlap compute. Collectives run at once.
// A violation prints "fake CUDA: ..." and aborts every rank.
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>

#include "cuda_runtime_api.h"
#include "nccl.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"

static _Noreturn void fake_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fake CUDA: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

// ---- device memory ----
static struct {
    char *p;
    size_t n;
} ranges[256];
static int nranges;

static bool is_device(const void *p, size_t bytes) {
    for (int i = 0; i < nranges; i++)
        if ((const char *)p >= ranges[i].p && (const char *)p + bytes <= ranges[i].p + ranges[i].n) return true;
    return false;
}

static void check_side(Tensor t, const char *what) {
    if (!t.p || !tensor_numel(t)) return;
    bool dev = is_device(t.p, tensor_bytes(t));
    if (t.dev == DEV_CUDA && !dev)
        fake_fail("%s: a DEV_CUDA tensor (%p, %zu bytes) is not device memory", what, t.p, tensor_bytes(t));
    if (t.dev == DEV_CPU && dev) fake_fail("%s: a DEV_CPU tensor points into device memory", what);
}

// The host's waits for the device, as the CUDA backend counts them (ops_host_syncs): a stream synchronisation, and
// every op that reads a value back or copies to or from host memory.
static int64_t host_syncs;

// ---- streams and events ----
struct fake_stream {
    const char *name;
    long seq;     // work items issued
    long seen[2]; // of each stream (compute, comm): work this stream depends on
};
struct fake_event {
    int stream; // -1: never recorded
    long seq;
};
static struct fake_stream streams[2] = {{"compute", 0, {0, 0}}, {"comm", 0, {0, 0}}};
#define COMPUTE (&streams[0])
#define COMM (&streams[1])
static int sid(cudaStream_t s) { return (int)(s - streams); }

// Buffers of comm-stream work (with its count on that stream) the compute stream may not have waited for.
typedef struct {
    const char *p;
    size_t n;
    long seq;
} Inflight;
static Inflight inflight[1024];
static int ninflight;

// Work on stream s. On the comm stream it must depend on all the compute stream's earlier work.
static void issue(cudaStream_t s, const char *what) {
    int me = sid(s), other = 1 - me;
    if (me < 0 || me > 1) fake_fail("%s: not a stream of the backend", what);
    if (s == COMM && s->seen[other] < streams[other].seq)
        fake_fail("%s on the %s stream does not wait for the %s stream's earlier work (an event is missing)", what,
                  s->name, streams[other].name);
    s->seq++;
    s->seen[me] = s->seq;
}

// The comm stream's latest work uses [p, p + n).
static void inflight_add(const void *p, size_t n) {
    int k = 0;
    for (int i = 0; i < ninflight; i++) // forget what the compute stream has waited for
        if (inflight[i].seq > COMPUTE->seen[1]) inflight[k++] = inflight[i];
    ninflight = k;
    if (n == 0) return;
    if (ninflight == 1024) fake_fail("more than 1024 NCCL buffers in flight");
    inflight[ninflight++] = (Inflight){p, n, COMM->seq};
}

// op_copy_async's copies not yet waited for. A copy runs at the first ops_copies_wait, from any thread (a GPU runs it
// at some time before): until then its dst holds 0xff bytes, so a reader that does not wait reads NaNs. Until the
// issuing thread waits, compute work that touches a copy's source fails (a GPU may still be reading it).
typedef struct {
    void *dst;
    const char *src;
    size_t n;
    bool done;
} FakeCopy;
static FakeCopy copies[4096];
static int ncopies;
static pthread_mutex_t copies_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_t copies_issuer;

// The FP8 weights of op_fp8_weights_ahead not joined yet: [p, p + n) of ticket id (the side stream may still write it).
typedef struct {
    const char *p;
    size_t n;
    int id;
} FakeAhead;
static FakeAhead ahead[4096];
static int nahead;

// Compute work touching [p, p + n) must wait for every collective and every op_copy_async that uses it, and for the
// FP8 weights made ahead in it.
static void check_inflight(const void *p, size_t n, const char *what) {
    for (int i = 0; i < nahead; i++)
        if (n && (const char *)p < ahead[i].p + ahead[i].n && ahead[i].p < (const char *)p + n)
            fake_fail("%s on the compute stream touches FP8 weights made ahead (ticket %d) before "
                      "op_fp8_weights_join",
                      what, ahead[i].id);
    for (int i = 0; i < ncopies; i++)
        if (n && (const char *)p < copies[i].src + copies[i].n && copies[i].src < (const char *)p + n)
            fake_fail("%s on the compute stream touches the source of an op_copy_async not waited for "
                      "(ops_copies_wait is missing)",
                      what);
    for (int i = 0; i < ninflight; i++)
        if (inflight[i].seq > COMPUTE->seen[1] && n && (const char *)p < inflight[i].p + inflight[i].n &&
            inflight[i].p < (const char *)p + n)
            fake_fail(
                "%s on the compute stream touches a buffer of an NCCL call it does not wait for (an event is missing)",
                what);
}

// The comm stream's groups in flight (posted, not finished), oldest first, and how far the stream has
// completed. The stream runs one group at a time: each is done no sooner than its predecessor.
enum { FAKE_GROUPS = 8 };
static struct {
    MPI_Request req[1024];
    int n;
    long first, seq; // the comm stream's count before and after it
    double ready;    // not done before this time (PITH_FAKE_NCCL_DELAY_MS after its issue or its predecessor)
} pending[FAKE_GROUPS];
static int npending;
static long group_first;      // the comm stream's count when the group being built started
static atomic_long comm_done; // comm-stream work complete up to this count (read by the watchdog thread)

static double nccl_delay_s(void) {
    static double d = -1;
    if (d < 0) {
        const char *e = getenv("PITH_FAKE_NCCL_DELAY_MS");
        d = e && *e ? atof(e) / 1000 : 0;
    }
    return d;
}

// Finishes the groups in flight that end at or before comm-stream count seq (polling, so the watchdog can end
// a wait whose peer never posts), and marks the comm stream complete so far.
static void comm_finish_upto(long seq) {
    int k = 0;
    for (; k < npending && pending[k].seq <= seq; k++) {
        for (int done = 0;;) {
            if (MPI_Testall(pending[k].n, pending[k].req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
                fake_fail("MPI_Testall failed");
            if (done) break;
            nanosleep(&(struct timespec){0, 50000}, NULL);
        }
        double left = pending[k].ready - now_seconds();
        if (left > 0) nanosleep(&(struct timespec){(time_t)left, (long)((left - (time_t)left) * 1e9)}, NULL);
    }
    memmove(pending, pending + k, (size_t)(npending - k) * sizeof *pending), npending -= k;
    long done = npending ? pending[0].first : COMM->seq;
    if (done > atomic_load(&comm_done)) atomic_store(&comm_done, done);
}
static void comm_finish(void) { comm_finish_upto(COMM->seq); }

static int fake_gpus(void) {
    const char *e = getenv("PITH_FAKE_GPUS");
    return e && *e ? atoi(e) : 8;
}
static int bound = -1;

cudaError_t cudaGetDeviceCount(int *n) { return *n = fake_gpus(), cudaSuccess; }
cudaError_t cudaSetDevice(int dev) {
    return dev >= 0 && dev < fake_gpus() ? (bound = dev, cudaSuccess) : cudaErrorInvalidValue;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
    *ev = calloc(1, sizeof **ev);
    (*ev)->stream = -1;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) { return free(ev), cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
    ev->stream = sid(s), ev->seq = s->seq;
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) { // the watchdog's thread
    return ev->stream == 1 && ev->seq > atomic_load(&comm_done) ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags) {
    if (ev->stream < 0) fake_fail("cudaStreamWaitEvent on an event never recorded");
    if (ev->stream == 1 && s != COMM && ev->seq > atomic_load(&comm_done))
        comm_finish_upto(ev->seq); // compute runs at once: the data must be there
    if (s->seen[ev->stream] < ev->seq) s->seen[ev->stream] = ev->seq;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    host_syncs++;
    if (s == COMM) comm_finish();
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (kind != cudaMemcpyDeviceToDevice || !is_device(dst, bytes) || !is_device(src, bytes))
        fake_fail("cudaMemcpyAsync: not a device-to-device copy inside device memory");
    if (s == COMPUTE) check_inflight(dst, bytes, "cudaMemcpyAsync"), check_inflight(src, bytes, "cudaMemcpyAsync");
    if (s == COMM) comm_finish();
    issue(s, "cudaMemcpyAsync");
    if (s == COMM) inflight_add(dst, bytes), inflight_add(src, bytes);
    memmove(dst, src, bytes);
    if (s == COMM) comm_finish();
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "fake CUDA error"; }

// ---- NCCL over MPI ----
struct fake_nccl_comm {
    MPI_Comm mpi;
    int rank, size;
};
typedef struct {
    bool send;
    void *p;
    int bytes, peer;
    ncclComm_t comm;
} P2p;
static P2p queued[1024];
static int nqueued, depth;

static size_t nccl_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
    }
}
static MPI_Datatype mpi_of(ncclDataType_t t) {
    switch (t) {
    case ncclInt32: return MPI_INT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: fake_fail("reduction over NCCL datatype %d is not faked", (int)t);
    }
}
static void nccl_buf(const void *p, size_t bytes, const char *what, cudaStream_t s) {
    if (bytes && !is_device(p, bytes)) fake_fail("%s: buffer %p (%zu bytes) is not device memory", what, p, bytes);
    if (s != COMM) fake_fail("%s: not on the comm stream", what);
}
// After the call's issue: its buffers are in flight until the compute stream waits for it.
static void nccl_inflight(const void *a, size_t na, const void *b, size_t nb) {
    inflight_add(a, na), inflight_add(b, nb);
}
static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    return na && nb && (const char *)a < (const char *)b + nb && (const char *)b < (const char *)a + na;
}
// A collective's start: its buffers checked (device memory, the comm stream, apart unless in NCCL's in-place form),
// earlier calls finished, then issued on s with its buffers in flight.
static void nccl_begin(const char *what, const void *send, size_t ns, const void *recv, size_t nr, bool in_place,
                       cudaStream_t s) {
    nccl_buf(send, ns, what, s), nccl_buf(recv, nr, what, s);
    if (!in_place && overlap(send, ns, recv, nr))
        fake_fail("%s: overlapping buffers that are not NCCL's in-place form", what);
    comm_finish();
    issue(s, what);
    nccl_inflight(send, ns, recv, nr);
}
#define MPI_OK(call)                                                                                                   \
    do {                                                                                                               \
        if ((call) != MPI_SUCCESS) fake_fail("MPI call failed: %s", #call);                                            \
    } while (0)
// NCCL sums bf16 too; MPI has no bf16 type: the fake sums the values in fp32 and rounds the result once (as
// NCCL's one hop between two ranks does).
static void bf16_sum(const void *send, void *recv, size_t count, int ranks, ncclComm_t comm) {
    size_t n = count * ranks; // all-reduce: ranks 1
    float *w = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) w[i] = bf16_to_f32(((const uint16_t *)send)[i]);
    if (ranks == 1) MPI_OK(MPI_Allreduce(MPI_IN_PLACE, w, (int)count, MPI_FLOAT, MPI_SUM, comm->mpi));
    else MPI_OK(MPI_Reduce_scatter_block(MPI_IN_PLACE, w, (int)count, MPI_FLOAT, MPI_SUM, comm->mpi));
    for (size_t i = 0; i < count; i++) ((uint16_t *)recv)[i] = f32_to_bf16(w[i]);
    free(w);
}

static int id_counter;
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    int r;
    MPI_OK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
    memset(id, 0, sizeof *id);
    int color = r * 1024 + id_counter++; // the creator's world rank and its count: unique in the job
    memcpy(id->internal, &color, sizeof color);
    return ncclSuccess;
}
// Every rank of the world sets up its groups in the same order (dist_mesh_gpu), so a split of the world
// by the id's colour pairs them.
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (bound < 0) fake_fail("ncclCommInitRank before cudaSetDevice");
    int color;
    memcpy(&color, id.internal, sizeof color);
    ncclComm_t c = calloc(1, sizeof *c);
    MPI_OK(MPI_Comm_split(MPI_COMM_WORLD, color, rank, &c->mpi));
    MPI_OK(MPI_Comm_rank(c->mpi, &c->rank));
    MPI_OK(MPI_Comm_size(c->mpi, &c->size));
    if (c->rank != rank || c->size != nranks)
        fake_fail("ncclCommInitRank: rank %d of %d, expected %d of %d", c->rank, c->size, rank, nranks);
    *comm = c;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    comm_finish();
    MPI_OK(MPI_Comm_free(&comm->mpi));
    free(comm);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) { return *err = ncclSuccess, ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "fake NCCL error"; }
const char *ncclGetLastError(ncclComm_t comm) { return ""; }

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s) {
    size_t b = count * nccl_size(dt);
    nccl_begin("ncclAllReduce", send, b, recv, b, send == recv, s);
    if (dt == ncclBfloat16 && op == ncclSum) return bf16_sum(send, recv, count, 1, comm), comm_finish(), ncclSuccess;
    MPI_OK(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_of(dt),
                         op == ncclSum ? MPI_SUM : MPI_MAX, comm->mpi));
    return comm_finish(), ncclSuccess;
}
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t s) {
    size_t b = count * nccl_size(dt);
    nccl_begin("ncclReduce", send, b, recv, b, send == recv, s);
    bool in_place = comm->rank == root && send == recv;
    MPI_OK(MPI_Reduce(in_place ? MPI_IN_PLACE : send, recv, (int)count, mpi_of(dt), op == ncclSum ? MPI_SUM : MPI_MAX,
                      root, comm->mpi));
    return comm_finish(), ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s) {
    size_t b = recvcount * nccl_size(dt);
    nccl_begin("ncclReduceScatter", send, b * comm->size, recv, b,
               (const char *)recv == (const char *)send + comm->rank * b, s);
    if (dt == ncclBfloat16 && op == ncclSum)
        return bf16_sum(send, recv, recvcount, comm->size, comm), comm_finish(), ncclSuccess;
    void *tmp = malloc(b * comm->size + 1);
    memcpy(tmp, send, b * comm->size);
    MPI_OK(
        MPI_Reduce_scatter_block(tmp, recv, (int)recvcount, mpi_of(dt), op == ncclSum ? MPI_SUM : MPI_MAX, comm->mpi));
    free(tmp);
    return comm_finish(), ncclSuccess;
}
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t s) {
    size_t b = sendcount * nccl_size(dt);
    bool in_place = (const char *)send == (const char *)recv + comm->rank * b;
    nccl_begin("ncclAllGather", send, b, recv, b * comm->size, in_place, s);
    MPI_OK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)b, MPI_BYTE, recv, (int)b, MPI_BYTE, comm->mpi));
    return comm_finish(), ncclSuccess;
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t s) {
    size_t b = count * nccl_size(dt);
    nccl_begin("ncclBroadcast", send, b, recv, b, true, s); // (the root's copy is a memmove)
    if (comm->rank == root && send != recv) memmove(recv, send, b);
    MPI_OK(MPI_Bcast(recv, (int)b, MPI_BYTE, root, comm->mpi));
    return comm_finish(), ncclSuccess;
}
static void p2p(bool send, void *p, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t s) {
    size_t b = count * nccl_size(dt);
    nccl_buf(p, b, send ? "ncclSend" : "ncclRecv", s);
    if (peer < 0 || peer >= comm->size || peer == comm->rank)
        fake_fail("ncclSend/Recv: peer %d of %d (self: a local copy instead)", peer, comm->size);
    if (!count) fake_fail("ncclSend/Recv of 0 elements (skipped by pith on both sides)");
    if (depth == 0) comm_finish();
    issue(s, send ? "ncclSend" : "ncclRecv");
    inflight_add(p, b);
    P2p q = {send, p, (int)b, peer, comm};
    if (depth == 0) {
        if (send) MPI_OK(MPI_Send(p, q.bytes, MPI_BYTE, peer, 7, comm->mpi));
        else MPI_OK(MPI_Recv(p, q.bytes, MPI_BYTE, peer, 7, comm->mpi, MPI_STATUS_IGNORE));
        comm_finish();
        return;
    }
    if (nqueued == 1024) fake_fail("more than 1024 sends and receives in one group");
    queued[nqueued++] = q;
}
ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t s) {
    p2p(true, (void *)send, count, dt, peer, comm, s);
    return ncclSuccess;
}
ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t s) {
    p2p(false, recv, count, dt, peer, comm, s);
    return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) {
    if (depth == 0 && npending == FAKE_GROUPS) comm_finish_upto(pending[0].seq); // room for the group
    if (depth++ == 0) group_first = COMM->seq;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (depth == 0) fake_fail("ncclGroupEnd without ncclGroupStart");
    if (--depth) return ncclSuccess;
    for (int i = 0; i < nqueued; i++) {
        P2p *q = &queued[i];
        for (int j = 0; j < i; j++)
            if (overlap(q->p, q->bytes, queued[j].p, queued[j].bytes) && (!q->send || !queued[j].send))
                fake_fail("a group's buffers overlap");
        MPI_Request *r = &pending[npending].req[i];
        if (q->send) MPI_OK(MPI_Isend(q->p, q->bytes, MPI_BYTE, q->peer, 7, q->comm->mpi, r));
        else MPI_OK(MPI_Irecv(q->p, q->bytes, MPI_BYTE, q->peer, 7, q->comm->mpi, r));
    }
    double start =
        npending && pending[npending - 1].ready > now_seconds() ? pending[npending - 1].ready : now_seconds();
    pending[npending].n = nqueued, pending[npending].first = group_first;
    pending[npending].seq = COMM->seq, pending[npending].ready = start + nccl_delay_s();
    npending++;
    nqueued = 0;
    return ncclSuccess;
}

// ---- the CUDA backend: runtime services and ops (CPU ops on device memory, after the order checks) ----
int cuda_device_count(void) { return fake_gpus(); }
void *cuda_alloc_or_die(size_t bytes, const char *what) {
    if (nranges == 256) fake_fail("more than 256 device allocations");
    char *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (!p) die("fake CUDA: out of host memory for %s", what);
    memset(p, 0xff, bytes); // poison, like uninitialised device memory
    ranges[nranges].p = p, ranges[nranges++].n = bytes;
    return p;
}
void cuda_free(void *p) {
    for (int i = 0; i < nranges; i++)
        if (ranges[i].p == p) {
            ranges[i] = ranges[--nranges];
            free(p);
            return;
        }
    fake_fail("cuda_free of memory cuda_alloc_or_die did not give");
}
// The base layer's device-memory hooks (base.h), as the real backend installs them.
__attribute__((constructor)) static void fake_install_device_memory(void) {
    device_alloc = cuda_alloc_or_die;
    device_free = cuda_free;
}
static void uploads_check(const char *where);
static void uploads_done(void);
void cuda_sync(void) { host_syncs++, uploads_check("ops_sync"), uploads_done(); }
int64_t cuda_host_syncs(void) { return host_syncs; }
// Its streams run each op at once: nothing can be recorded for later (cuda_graph runs on a real GPU only).
void cuda_graph_begin(void) { die("cuda_graph: the fake GPU backend runs every op at once and records nothing"); }
void *cuda_graph_end(void) { return NULL; }
bool cuda_graph_run(void *g) { return false; }
void cuda_graph_free(void *g) {}
size_t cuda_pool_bytes(void) { return 0; }
size_t cuda_mem_peak_bytes(void) { return 0; }
void *cuda_compute_stream(void) { return COMPUTE; }
void *cuda_comm_stream(void) { return COMM; }

static void op_delay(void) {
    static double d = -1;
    if (d < 0) {
        const char *e = getenv("PITH_FAKE_OP_DELAY_US");
        d = e && *e ? atof(e) / 1e6 : 0;
    }
    if (d > 0) nanosleep(&(struct timespec){(time_t)d, (long)((d - (time_t)d) * 1e9)}, NULL);
}

// Ops issued on the compute stream while a group of sends and receives of this rank is posted and unfinished:
// work that runs beside a transfer on a GPU (the overlap tests read it: structure, not time).
static long fake_ops_beside;
long fake_ops_beside_transfers(void) { return fake_ops_beside; }

// An op on the compute stream over these tensors (which the CPU op then sees as host tensors).
#define OP(name, ...)                                                                                                  \
    do {                                                                                                               \
        Tensor *ts_[] = {__VA_ARGS__};                                                                                 \
        for (size_t i_ = 0; i_ < sizeof ts_ / sizeof *ts_; i_++)                                                       \
            check_side(*ts_[i_], #name), check_inflight(ts_[i_]->p, tensor_bytes(*ts_[i_]), #name),                    \
                ts_[i_]->dev = DEV_CPU;                                                                                \
        issue(COMPUTE, #name), op_delay(), fake_ops_beside += npending > 0;                                            \
    } while (0)

void cuda_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b) {
    OP(linear_forward, &y, &x, &w, &b);
    cpu_linear_forward(y, x, w, b);
}
void cuda_linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool acc) {
    OP(linear_backward_input, &dx, &dy, &w);
    cpu_linear_backward_input(dx, dy, w, acc);
}
void cuda_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, bool acc) {
    OP(linear_backward_weight, &dw, &db, &dy, &x);
    cpu_linear_backward_weight(dw, db, dy, x, acc);
}
void cuda_linear_bias_forward(Tensor y, Tensor b, Tensor offs) {
    OP(linear_bias_forward, &y, &b, &offs);
    cpu_linear_bias_forward(y, b, offs);
}
void cuda_linear_bias_backward(Tensor db, Tensor dy, Tensor offs, bool accumulate) {
    OP(linear_bias_backward, &db, &dy, &offs);
    cpu_linear_bias_backward(db, dy, offs, accumulate);
}
// The GPU's bf16 grouped products take x's rows already gathered (cuda_check_no_rows; the FP8 ones gather in their
// quantisers); so do these.
static void no_rows(Tensor rows, const char *what) {
    if (rows.p) die("%s: the GPU takes x's rows already gathered (op_gather_rows first), not rows to gather", what);
}
void cuda_grouped_linear_forward(Tensor y, Tensor x, Tensor rows, int div, Tensor w, Tensor b, Tensor offs) {
    no_rows(rows, "grouped_linear_forward");
    OP(grouped_linear_forward, &y, &x, &rows, &w, &b, &offs);
    cpu_grouped_linear_forward(y, x, rows, div, w, b, offs);
}
void cuda_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, Tensor offs) {
    OP(grouped_linear_backward_input, &dx, &dy, &w, &offs);
    cpu_grouped_linear_backward_input(dx, dy, w, offs);
}
void cuda_grouped_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor rows, int div, Tensor offs,
                                         bool accumulate) {
    no_rows(rows, "grouped_linear_backward_weight");
    OP(grouped_linear_backward_weight, &dw, &db, &dy, &x, &rows, &offs);
    cpu_grouped_linear_backward_weight(dw, db, dy, x, rows, div, offs, accumulate);
}
// RmsArgs carries z and dz, which the CPU op reads as host memory too.
void cuda_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps, const RmsArgs *a) {
    RmsArgs c = a ? *a : (RmsArgs){0};
    OP(rmsnorm_forward, &y, &rstd, &x, &w, &c.z);
    cpu_rmsnorm_forward(y, rstd, x, w, eps, &c);
}
void cuda_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool acc,
                           const RmsArgs *a) {
    RmsArgs c = a ? *a : (RmsArgs){0};
    OP(rmsnorm_backward, &dx, &dw, &dy, &x, &w, &rstd, &c.z, &c.dz);
    cpu_rmsnorm_backward(dx, dw, dy, x, w, rstd, acc, &c);
}
void cuda_rope(Tensor x, int off, Tensor cos, Tensor sin, Tensor pos, RopeLayout layout, bool backward) {
    OP(rope, &x, &cos, &sin, &pos);
    cpu_rope(x, off, cos, sin, pos, layout, backward);
}
void cuda_swiglu_forward(Tensor act, Tensor gu, float alpha, float limit) {
    OP(swiglu_forward, &act, &gu);
    cpu_swiglu_forward(act, gu, alpha, limit);
}
void cuda_swiglu_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit) {
    OP(swiglu_backward, &dgu, &dact, &gu);
    cpu_swiglu_backward(dgu, dact, gu, alpha, limit);
}
void cuda_fp8_round(Tensor y, Tensor x, Fp8Blocks b, Tensor offs) {
    OP(fp8_round, &y, &x, &offs);
    cpu_fp8_round(y, x, b, offs);
}
void cuda_fp8_weight(Fp8Weight fw, Tensor w) {
    OP(fp8_weight, &fw.q, &fw.qt, &fw.s, &fw.st, &w);
    cpu_fp8_weight(fw, w);
}
// Made at once; until the ticket's join, compute work that touches the codes or scales fails (check_inflight). A
// ticket made again before its join drops the first (the side stream runs both in order).
static void ahead_drop(int id) {
    int k = 0;
    for (int i = 0; i < nahead; i++)
        if (ahead[i].id != id) ahead[k++] = ahead[i];
    nahead = k;
}
void cuda_fp8_weights_ahead(const Fp8Weight *fw, const Tensor *w, int n, int id) {
    if (id < 0 || id >= FP8_AHEAD_IDS) fake_fail("fp8_weights_ahead: ticket %d", id);
    ahead_drop(id);
    for (int i = 0; i < n; i++) {
        cuda_fp8_weight(fw[i], w[i]);
        const Tensor parts[4] = {fw[i].q, fw[i].qt, fw[i].s, fw[i].st};
        for (int j = 0; j < 4; j++) {
            if (nahead == 4096) fake_fail("more than 4096 FP8 weight parts made ahead");
            ahead[nahead++] = (FakeAhead){parts[j].p, tensor_bytes(parts[j]), id};
        }
    }
}
void cuda_fp8_weights_join(int id) {
    if (id < 0 || id >= FP8_AHEAD_IDS) fake_fail("fp8_weights_join: ticket %d", id);
    ahead_drop(id);
}
void cuda_fp8_weight_values(Tensor y, Fp8Weight fw) {
    OP(fp8_weight_values, &y, &fw.q, &fw.s);
    cpu_fp8_weight_values(y, fw);
}
// No FP8 tensor cores here: the dense and expert FP8 GEMMs take the rounded-operand path.
bool cuda_fp8_linear_forward(Tensor y, Tensor x, Fp8Weight w8) { return false; }
bool cuda_fp8_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, bool accumulate) { return false; }
bool cuda_fp8_linear_backward_weight(Tensor dw, Tensor dy, Tensor x) { return false; }
bool cuda_fp8_grouped_linear(Tensor y, Tensor x, Tensor rows, int div, Fp8Weight w8, Tensor offs, bool input_grad) {
    return false;
}
bool cuda_fp8_grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, Tensor rows, int div, Tensor offs,
                                             bool accumulate) {
    return false;
}
int64_t cuda_fp8_tensor_core_gemms(void) { return 0; }
bool cuda_fp8_dense_fit(int64_t N, int64_t K) { return false; }
bool cuda_fp8_experts_fit(int64_t E, int64_t N, int64_t K) { return false; }
// The args structs carry tensors (sinks, docpos, bias) that the CPU op reads as host memory too.
void cuda_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    AttnArgs c = *a;
    OP(attention_forward, &o, &lse, &q, &k, &v, &c.sinks, &c.docpos);
    cpu_attention_forward(o, lse, q, k, v, &c);
}
void cuda_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                             Tensor o, Tensor lse, const AttnArgs *a) {
    AttnArgs c = *a;
    OP(attention_backward, &dq, &dk, &dv, &dsinks, &dout, &q, &k, &v, &o, &lse, &c.sinks, &c.docpos);
    cpu_attention_backward(dq, dk, dv, dsinks, dout, q, k, v, o, lse, &c);
}
void cuda_attention_merge(Tensor o, Tensor lse, Tensor o_p, Tensor lse_p, int B, bool init) {
    OP(attention_merge, &o, &lse, &o_p, &lse_p);
    cpu_attention_merge(o, lse, o_p, lse_p, B, init);
}
void cuda_router_forward(Tensor probs, Tensor idx, Tensor w, Tensor logits, const RouterArgs *a) {
    RouterArgs c = *a;
    OP(router_forward, &probs, &idx, &w, &logits, &c.bias);
    cpu_router_forward(probs, idx, w, logits, &c);
}
void cuda_router_backward(Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                          const RouterArgs *a) {
    RouterArgs c = *a;
    OP(router_backward, &dlogits, &dw, &lb_grad, &probs, &idx, &w, &c.bias);
    cpu_router_backward(dlogits, dw, lb_grad, probs, idx, w, &c);
}
void cuda_moe_lb_loss(Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float gs) {
    OP(moe_lb_loss, &loss_sum, &lb_grad, &probs, &idx);
    cpu_moe_lb_loss(loss_sum, lb_grad, probs, idx, coef, gs);
}
void cuda_moe_count(Tensor cnt, Tensor idx) {
    OP(moe_count, &cnt, &idx);
    cpu_moe_count(cnt, idx);
}
void cuda_moe_sort(Tensor perm, Tensor at, Tensor offs, Tensor idx, int E) {
    OP(moe_sort, &perm, &at, &offs, &idx);
    cpu_moe_sort(perm, at, offs, idx, E);
}
void cuda_gather_rows(Tensor y, Tensor x, Tensor rows, int div) {
    OP(gather_rows, &y, &x, &rows);
    cpu_gather_rows(y, x, rows, div);
}
void cuda_scatter_add_rows(Tensor dx, Tensor dy, Tensor rows, int div) {
    OP(scatter_add_rows, &dx, &dy, &rows);
    cpu_scatter_add_rows(dx, dy, rows, div);
}
void cuda_scatter_rows(Tensor y, Tensor x, Tensor rows) {
    OP(scatter_rows, &y, &x, &rows);
    cpu_scatter_rows(y, x, rows);
}
void cuda_moe_combine_forward(Tensor out, Tensor resid, Tensor y, Tensor w, Tensor at) {
    OP(moe_combine_forward, &out, &resid, &y, &w, &at);
    cpu_moe_combine_forward(out, resid, y, w, at);
}
void cuda_moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w, Tensor at) {
    OP(moe_combine_backward, &dy, &dw, &dout, &y, &w, &at);
    cpu_moe_combine_backward(dy, dw, dout, y, w, at);
}
void cuda_embedding_forward(Tensor h, Tensor table, Tensor tokens) {
    OP(embedding_forward, &h, &table, &tokens);
    cpu_embedding_forward(h, table, tokens);
}
void cuda_embedding_backward(Tensor dtable, Tensor dh, Tensor tokens) {
    OP(embedding_backward, &dtable, &dh, &tokens);
    cpu_embedding_backward(dtable, dh, tokens);
}
int64_t cuda_embedding_bad_id(void) { return host_syncs++, -1; }    // (the CPU op it runs dies at a bad id)
int64_t cuda_moe_sort_bad_expert(void) { return host_syncs++, -1; } // (likewise at a bad expert index)
void cuda_cross_entropy(Tensor logits, Tensor labels, Tensor loss_sum, Tensor row_loss, float gs) {
    OP(cross_entropy, &logits, &labels, &loss_sum);
    cpu_cross_entropy(logits, labels, loss_sum, row_loss, gs);
}
void cuda_zero(Tensor x) {
    OP(zero, &x);
    cpu_zero(x);
}
void cuda_add(Tensor y, Tensor x) {
    OP(add, &y, &x);
    cpu_add(y, x);
}
void cuda_scale(Tensor x, float s) {
    OP(scale, &x);
    cpu_scale(x, s);
}
void cuda_copy(Tensor dst, Tensor src) {
    host_syncs += dst.dev != DEV_CUDA || src.dev != DEV_CUDA; // a copy that touches host memory waits
    OP(copy, &dst, &src);
    cpu_copy(dst, src); // fp32 ↔ bf16 as the CPU converts (the GPU's rounding is the same: nearest even)
}
void cuda_copy_async(Tensor dst, Tensor src) {
    check_side(dst, "copy_async"), check_side(src, "copy_async");
    if (dst.dev != DEV_CPU || src.dev != DEV_CUDA || dst.dt != src.dt || tensor_numel(dst) != tensor_numel(src))
        fake_fail("copy_async: not a device tensor into a host tensor of its dtype and size");
    if (ncopies == 4096) fake_fail("more than 4096 copies not waited for");
    pthread_mutex_lock(&copies_mu);
    copies_issuer = pthread_self();
    copies[ncopies++] = (FakeCopy){dst.p, src.p, tensor_bytes(src), false};
    memset(dst.p, 0xff, tensor_bytes(dst));
    pthread_mutex_unlock(&copies_mu);
}
void cuda_copies_wait(void) {
    pthread_mutex_lock(&copies_mu);
    for (int i = 0; i < ncopies; i++)
        if (!copies[i].done) memcpy(copies[i].dst, copies[i].src, copies[i].n), copies[i].done = true;
    if (ncopies && pthread_equal(pthread_self(), copies_issuer)) ncopies = 0;
    pthread_mutex_unlock(&copies_mu);
}
// op_upload's copies not yet waited for, each with its source's bytes when issued. The copy is made at once (the
// compute stream's order, since compute runs at once here); a source written before ops_uploads_wait or ops_sync
// fails at the next upload or wait (a GPU may not have read it yet). A wait with no compute queued after the latest
// upload counts as a host wait: the stream drains to it, and the GPU idles until the host queues more.
typedef struct {
    const void *src;
    void *was;
    size_t n;
} FakeUpload;
static FakeUpload uploads[64];
static int nuploads;
static int64_t upload_seq; // the compute stream's seq at the latest upload
static void uploads_check(const char *where) {
    for (int i = 0; i < nuploads; i++)
        if (memcmp(uploads[i].src, uploads[i].was, uploads[i].n))
            fake_fail("%s: the host wrote an op_upload's source before ops_uploads_wait", where);
}
static void uploads_done(void) {
    for (int i = 0; i < nuploads; i++) free(uploads[i].was);
    nuploads = 0;
}
void cuda_upload(Tensor dst, Tensor src) {
    check_side(dst, "upload"), check_side(src, "upload");
    if (dst.dev != DEV_CUDA || src.dev != DEV_CPU || dst.dt != src.dt || tensor_numel(dst) != tensor_numel(src))
        fake_fail("upload: not a host tensor into a device tensor of its dtype and size");
    uploads_check("upload");
    if (nuploads == 64) fake_fail("more than 64 uploads not waited for");
    size_t n = tensor_bytes(src);
    uploads[nuploads++] = (FakeUpload){src.p, memcpy(xmalloc(n + 1), src.p, n), n};
    OP(upload, &dst, &src);
    cpu_copy(dst, src), upload_seq = COMPUTE->seq;
}
void cuda_uploads_wait(void) {
    host_syncs += nuploads > 0 && COMPUTE->seq == upload_seq;
    uploads_check("ops_uploads_wait"), uploads_done();
}
void cuda_copy_col_blocks(Tensor dst, int64_t a, int64_t da, Tensor src, int64_t b, int64_t db, int64_t n, int64_t reps,
                          bool acc) {
    OP(copy_col_blocks, &dst, &src);
    if (dst.dt != src.dt) fake_fail("copy_col_blocks: dtype conversion is not faked (fp32 compute only)");
    cpu_copy_col_blocks(dst, a, da, src, b, db, n, reps, acc);
}
// Qwen3.5's ops (cpu_delta.c)
void cuda_sigmoid_gate_forward(Tensor y, Tensor x, Tensor gate) {
    OP(sigmoid_gate_forward, &y, &x, &gate);
    cpu_sigmoid_gate_forward(y, x, gate);
}
void cuda_sigmoid_gate_backward(Tensor dx, Tensor dgate, Tensor dy, Tensor x, Tensor gate, bool acc) {
    OP(sigmoid_gate_backward, &dx, &dgate, &dy, &x, &gate);
    cpu_sigmoid_gate_backward(dx, dgate, dy, x, gate, acc);
}
void cuda_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split) {
    OP(conv1d_silu_forward, &y, &x, &w, &halo, &pos);
    cpu_conv1d_silu_forward(y, x, w, halo, pos, B, split);
}
void cuda_conv1d_silu_backward(Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo,
                               Tensor pos, int B, int64_t split) {
    OP(conv1d_silu_backward, &dx, &dhalo, &dw, &dy, &x, &w, &halo, &pos);
    cpu_conv1d_silu_backward(dx, dhalo, dw, dy, x, w, halo, pos, B, split);
}
void cuda_delta_gates_forward(Tensor g, Tensor beta, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias) {
    OP(delta_gates_forward, &g, &beta, &a, &b, &A_log, &dt_bias);
    cpu_delta_gates_forward(g, beta, a, b, A_log, dt_bias);
}
void cuda_delta_gates_backward(Tensor da, Tensor db, Tensor dA_log, Tensor ddt_bias, Tensor dg, Tensor dbeta, Tensor a,
                               Tensor b, Tensor A_log, Tensor dt_bias) {
    OP(delta_gates_backward, &da, &db, &dA_log, &ddt_bias, &dg, &dbeta, &a, &b, &A_log, &dt_bias);
    cpu_delta_gates_backward(da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias);
}
// The states in DeltaArgs are device tensors too: a copy of the arguments carries them as host tensors.
void cuda_delta_rule_forward(Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DeltaArgs h = *a;
    OP(delta_rule_forward, &o, &q, &k, &v, &g, &beta, &h.s0, &h.sT, &h.pos);
    cpu_delta_rule_forward(o, q, k, v, g, beta, &h);
}
void cuda_delta_rule_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k,
                              Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DeltaArgs h = *a;
    OP(delta_rule_backward, &dq, &dk, &dv, &dg, &dbeta, &dout, &q, &k, &v, &g, &beta, &h.s0, &h.dsT, &h.ds0, &h.pos);
    cpu_delta_rule_backward(dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, &h);
}
double cuda_sum_squares(Tensor x) {
    host_syncs++;
    OP(sum_squares, &x);
    return cpu_sum_squares(x);
}
void cuda_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
                float wd, int t) {
    OP(adamw, &p, &g, &m, &v);
    if (w.p) OP(adamw, &w);
    cpu_adamw(p, g, m, v, w, gscale, lr, b1, b2, eps, wd, t);
}
bool cuda_adamw_nonfinite(void) { return host_syncs++, cpu_adamw_nonfinite(); }
void cuda_muon_momentum(Tensor buf, Tensor g, float beta) {
    OP(muon_momentum, &buf, &g);
    cpu_muon_momentum(buf, g, beta);
}
void cuda_muon_apply(Tensor p, Tensor o, float lr, float wd, float scale) {
    OP(muon_apply, &p, &o);
    cpu_muon_apply(p, o, lr, wd, scale);
}
double cuda_read_scalar(Tensor x) {
    host_syncs++;
    OP(read_scalar, &x);
    return cpu_read_scalar(x);
}
