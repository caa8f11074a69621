// nccl_comm.c — the NCCL half of comm.h (see nccl_comm.h): device binding, communicators bootstrapped
// over MPI, collectives on the comm stream ordered by events against the compute stream, and the
// watchdog thread that turns a hang or an asynchronous NCCL error into a message and an exit.
// Counts are elements of the tensor's dtype (size_t: no int limit); zero-size transfers are skipped on
// both sides of a pair (their counts agree), so empty ranks cost no NCCL call.
#include "parallel/nccl_comm.h"

#ifdef PITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

// The one include of a backend's own header above the op layer (docs/architecture.md, "Layers"): NCCL calls
// are ordered against the CUDA backend's compute and comm streams, which only it owns.
#include "ops/cuda/cuda_ops.h"

#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(c, call) nccl_check((call), (c), #call, __FILE__, __LINE__)

static void cuda_check(cudaError_t e, const char *call, const char *file, int line) {
    if (e != cudaSuccess) die("CUDA call failed at %s:%d: %s: %s", file, line, call, cudaGetErrorString(e));
}

static void nccl_check(ncclResult_t r, const Comm *c, const char *call, const char *file, int line) {
    if (r == ncclSuccess) return;
    const char *last = ncclGetLastError(c && c->nccl ? (ncclComm_t)c->nccl : NULL);
    die("NCCL call failed at %s:%d on the %s group: %s: %s%s%s", file, line, c ? c->name : "-", call,
        ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

// ---- the watchdog ----

enum { RING = 1024, MAX_COMMS = 16 };

typedef struct {
    cudaEvent_t ev;   // recorded on the comm stream right after the call
    double issued;    // when the host issued the call
    const char *what; // "all-to-all", …
    char group[16];
    int size;
    double timeout_s;
} Watch;

// The process-wide state of the NCCL transport: the bound device, the watchdog's ring of calls in flight and
// every live communicator.
static struct {
    int device; // the GPU this process is bound to (-1: none yet)
    bool started;
    cudaEvent_t ready;  // compute → comm: a call waits for the compute stream's work so far
    pthread_mutex_t mu; // guards what follows (the host thread issues, the watchdog retires)
    Watch ring[RING];   // issued calls not yet seen complete, oldest at head (one stream: FIFO)
    int head, count;
    double last_done; // when the watchdog last saw a call complete
    Watch call;       // the NCCL host call in progress: it can block while NCCL connects
    bool in_call;
    ncclComm_t comms[MAX_COMMS]; // every live communicator (asynchronous errors, aborts)
    char names[MAX_COMMS][16];
    int ncomms;
    pthread_t thread;
    atomic_bool stop;
} nccl_state = {.device = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

static cudaStream_t compute_stream(void) { return (cudaStream_t)cuda_compute_stream(); }
static cudaStream_t comm_stream(void) { return (cudaStream_t)cuda_comm_stream(); }

static Watch watch_of(const Comm *c, const char *what) {
    Watch w = {.issued = now_seconds(), .what = what, .size = c->size, .timeout_s = c->timeout_s};
    snprintf(w.group, sizeof w.group, "%s", c->name);
    return w;
}

// Called by the watchdog only, outside the lock: says what failed, aborts every communicator (which
// releases kernels and host calls stuck in NCCL), and exits; the launcher then ends the other ranks.
static _Noreturn void watch_fatal(const char *msg, int n, ncclComm_t *comms) {
    fflush(stdout);
    fprintf(stderr, "pith: error: rank %d: %s\n", die_rank >= 0 ? die_rank : 0, msg);
    fflush(stderr);
    alarm(10); // should an abort itself hang, SIGALRM ends the process
    for (int i = 0; i < n; i++) ncclCommAbort(comms[i]);
    _exit(1);
}

static void *watch_main(void *arg) {
    (void)arg;
    char msg[1024];
    ncclComm_t comms[MAX_COMMS];
    char names[MAX_COMMS][16];
    cudaError_t e = cudaSetDevice(nccl_state.device);
    if (e != cudaSuccess) {
        snprintf(msg, sizeof msg, "NCCL watchdog: cudaSetDevice(%d) failed: %s", nccl_state.device,
                 cudaGetErrorString(e));
        watch_fatal(msg, 0, comms);
    }
    while (!atomic_load(&nccl_state.stop)) {
        msg[0] = 0;
        pthread_mutex_lock(&nccl_state.mu);
        double now = now_seconds();
        while (nccl_state.count > 0) {
            Watch *w = &nccl_state.ring[nccl_state.head];
            cudaError_t q = cudaEventQuery(w->ev);
            if (q == cudaSuccess) {
                nccl_state.head = (nccl_state.head + 1) % RING, nccl_state.count--, nccl_state.last_done = now;
                continue;
            }
            // A call queued behind others starts its clock when the one before it completes.
            double start = w->issued > nccl_state.last_done ? w->issued : nccl_state.last_done;
            if (q != cudaErrorNotReady) // a sticky error: any kernel queued before may have caused it
                snprintf(msg, sizeof msg,
                         "the GPU reported an error while %s on the %s group (%d ranks) was pending: %s", w->what,
                         w->group, w->size, cudaGetErrorString(q));
            else if (w->timeout_s > 0 && now - start > w->timeout_s)
                snprintf(msg, sizeof msg,
                         "%s on the %s group (%d ranks) did not complete within parallel.timeout_s = %g s: another "
                         "rank failed or stopped (NCCL)",
                         w->what, w->group, w->size, w->timeout_s);
            break;
        }
        if (!msg[0] && nccl_state.in_call && nccl_state.call.timeout_s > 0 &&
            now - nccl_state.call.issued > nccl_state.call.timeout_s)
            snprintf(msg, sizeof msg,
                     "%s on the %s group (%d ranks) did not return within parallel.timeout_s = %g s: another rank "
                     "failed or stopped (NCCL)",
                     nccl_state.call.what, nccl_state.call.group, nccl_state.call.size, nccl_state.call.timeout_s);
        int n = nccl_state.ncomms, pending = nccl_state.count;
        memcpy(comms, nccl_state.comms, sizeof comms), memcpy(names, nccl_state.names, sizeof names);
        pthread_mutex_unlock(&nccl_state.mu);
        for (int i = 0; i < n && !msg[0]; i++) {
            ncclResult_t r = ncclSuccess, q = ncclCommGetAsyncError(comms[i], &r);
            if (q != ncclSuccess || (r != ncclSuccess && r != ncclInProgress))
                snprintf(msg, sizeof msg, "NCCL reported an error on the %s group: %s", names[i],
                         ncclGetErrorString(q != ncclSuccess ? q : r));
        }
        if (msg[0]) watch_fatal(msg, n, comms);
        nanosleep(&(struct timespec){0, pending ? 1000000 : 20000000}, NULL);
    }
    return NULL;
}

static void watch_start(void) {
    if (nccl_state.started) return;
    CHECK(nccl_state.device >= 0); // nccl_bind_device first
    CUDA_CHECK(cudaEventCreateWithFlags(&nccl_state.ready, cudaEventDisableTiming));
    for (int i = 0; i < RING; i++) CUDA_CHECK(cudaEventCreateWithFlags(&nccl_state.ring[i].ev, cudaEventDisableTiming));
    nccl_state.head = nccl_state.count = 0, nccl_state.last_done = 0, nccl_state.in_call = false;
    atomic_store(&nccl_state.stop, false);
    int rc = pthread_create(&nccl_state.thread, NULL, watch_main, NULL);
    if (rc) die("NCCL watchdog: pthread_create failed at %s:%d: %s", __FILE__, __LINE__, strerror(rc));
    nccl_state.started = true;
}

void nccl_shutdown(void) {
    if (!nccl_state.started) return;
    atomic_store(&nccl_state.stop, true);
    int rc = pthread_join(nccl_state.thread, NULL);
    if (rc) die("NCCL watchdog: pthread_join failed at %s:%d: %s", __FILE__, __LINE__, strerror(rc));
    CUDA_CHECK(cudaStreamSynchronize(comm_stream()));
    CUDA_CHECK(cudaEventDestroy(nccl_state.ready));
    for (int i = 0; i < RING; i++) CUDA_CHECK(cudaEventDestroy(nccl_state.ring[i].ev));
    nccl_state.started = false;
}

// Starts a call: the comm stream waits for the compute stream's work so far, and the host call itself is
// watched (NCCL connects to a peer lazily, inside the first call that needs it, and that can block).
static cudaStream_t call_begin(const Comm *c, const char *what) {
    CHECK(nccl_state.started && c->nccl && c->size > 1);
    cudaStream_t s = comm_stream();
    CUDA_CHECK(cudaEventRecord(nccl_state.ready, compute_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(s, nccl_state.ready, 0));
    pthread_mutex_lock(&nccl_state.mu);
    nccl_state.call = watch_of(c, what), nccl_state.in_call = true;
    pthread_mutex_unlock(&nccl_state.mu);
    return s;
}

// Ends it: an event on the comm stream that the watchdog follows to completion (returned), and that the
// compute stream's later work waits for unless the call is asynchronous (call_end_async).
static cudaEvent_t watch_push(const Comm *c, const char *what, cudaStream_t s) {
    pthread_mutex_lock(&nccl_state.mu);
    nccl_state.in_call = false;
    while (nccl_state.count == RING) { // the GPU is 1024 calls behind: wait for the watchdog to retire one
        pthread_mutex_unlock(&nccl_state.mu);
        nanosleep(&(struct timespec){0, 100000}, NULL);
        pthread_mutex_lock(&nccl_state.mu);
    }
    Watch *w = &nccl_state.ring[(nccl_state.head + nccl_state.count) % RING];
    cudaEvent_t ev = w->ev;
    *w = watch_of(c, what), w->ev = ev;
    cudaError_t e = cudaEventRecord(ev, s);
    if (e == cudaSuccess) nccl_state.count++;
    pthread_mutex_unlock(&nccl_state.mu);
    CUDA_CHECK(e);
    return ev;
}

static void call_end(const Comm *c, const char *what, cudaStream_t s) {
    CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), watch_push(c, what, s), 0));
}

// Completion events of asynchronous calls: a pool (the ring's events are reused once retired, so a
// request cannot hold one), taken at issue and given back by nccl_wait, kept for the process's lifetime.
// Main thread only.
enum { POOL = 256 };
static cudaEvent_t pool[POOL];
static int npool = -1; // free events on the stack pool[0 .. npool); -1: not created yet

static cudaEvent_t call_end_async(const Comm *c, const char *what, cudaStream_t s) {
    watch_push(c, what, s);
    if (npool < 0)
        for (npool = 0; npool < POOL; npool++)
            CUDA_CHECK(cudaEventCreateWithFlags(&pool[npool], cudaEventDisableTiming));
    if (npool == 0) die("NCCL: more than %d asynchronous calls issued and not waited for", POOL);
    cudaEvent_t ev = pool[--npool];
    CUDA_CHECK(cudaEventRecord(ev, s));
    return ev;
}

void nccl_wait(void *event) {
    CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), (cudaEvent_t)event, 0));
    CHECK(npool >= 0 && npool < POOL);
    pool[npool++] = event;
}

// ---- set-up ----

void nccl_bind_device(int local_rank, int local_size) {
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int dev = n == 1 ? 0 : local_rank; // one visible GPU: the launcher gave each rank its own
    if (n < 1) die("multi-rank GPU training: no GPU is visible to this rank");
    if (dev >= n)
        die("multi-rank GPU training: local rank %d, but this node has %d GPU(s): start one rank per GPU", local_rank,
            n);
    if (n == 1 && local_size > 1 && !(vis && *vis))
        die("multi-rank GPU training: %d ranks on this node share its one GPU: start one rank per GPU", local_size);
    CUDA_CHECK(cudaSetDevice(dev));
    nccl_state.device = dev;
}

void nccl_comm_create(Comm *c) {
    CHECK(c->size > 1 && c->mpi != MPI_COMM_NULL && !c->nccl);
    watch_start();
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) NCCL_CHECK(c, ncclGetUniqueId(&id));
    comm_broadcast(c, tensor_make(&id, DT_U8, DEV_CPU, 1, (int64_t)sizeof id, 1, 1, 1),
                   0);                  // MPI, polled against the deadline
    pthread_mutex_lock(&nccl_state.mu); // set-up is bounded too, but never below 5 minutes (NCCL's topology discovery)
    nccl_state.call = watch_of(c, "NCCL set-up"), nccl_state.in_call = true;
    if (nccl_state.call.timeout_s > 0 && nccl_state.call.timeout_s < 300) nccl_state.call.timeout_s = 300;
    pthread_mutex_unlock(&nccl_state.mu);
    ncclComm_t nc;
    NCCL_CHECK(c, ncclCommInitRank(&nc, c->size, id, c->rank));
    pthread_mutex_lock(&nccl_state.mu);
    nccl_state.in_call = false;
    CHECK(nccl_state.ncomms < MAX_COMMS);
    nccl_state.comms[nccl_state.ncomms] = nc;
    snprintf(nccl_state.names[nccl_state.ncomms++], sizeof nccl_state.names[0], "%s", c->name);
    pthread_mutex_unlock(&nccl_state.mu);
    c->nccl = nc, c->nccl_owner = true, c->dev = DEV_CUDA;
}

void nccl_comm_destroy(Comm *c) {
    if (c->nccl && c->nccl_owner) {
        CHECK(!nccl_state.started); // nccl_shutdown first: the watchdog reads every communicator
        CUDA_CHECK(cudaStreamSynchronize(comm_stream()));
        ncclComm_t nc = c->nccl;
        for (int i = 0; i < nccl_state.ncomms; i++)
            if (nccl_state.comms[i] == nc) {
                nccl_state.comms[i] = nccl_state.comms[--nccl_state.ncomms];
                memcpy(nccl_state.names[i], nccl_state.names[nccl_state.ncomms], sizeof nccl_state.names[0]);
                break;
            }
        NCCL_CHECK(c, ncclCommDestroy(nc));
    }
    c->nccl = NULL, c->nccl_owner = false, c->dev = DEV_CPU;
}

// ---- collectives ----

static ncclComm_t nc_of(const Comm *c) { return (ncclComm_t)c->nccl; }

static ncclDataType_t nccl_dtype(DType dt) {
    switch (dt) {
    case DT_F32: return ncclFloat32;
    case DT_BF16: return ncclBfloat16;
    case DT_F16: return ncclFloat16;
    case DT_F64: return ncclFloat64;
    case DT_I32: return ncclInt32;
    case DT_I64: return ncclInt64;
    case DT_U8: return ncclUint8;
    case DT_U16: return ncclFloat16; // moved, never reduced
    case DT_U32: return ncclUint32;
    case DT_U64: return ncclUint64;
    }
    die("NCCL: no datatype for dtype %d", (int)dt);
}

void nccl_allreduce(const Comm *c, Tensor x, CommOp op) {
    size_t n = (size_t)tensor_numel(x);
    CHECK(x.dt != DT_U16 && x.dt != DT_U8);
    if (!n) return;
    cudaStream_t s = call_begin(c, "all-reduce");
    NCCL_CHECK(c, ncclAllReduce(x.p, x.p, n, nccl_dtype(x.dt), op == COMM_SUM ? ncclSum : ncclMax, nc_of(c), s));
    call_end(c, "all-reduce", s);
}

// NCCL's in-place reduce-scatter leaves the sum at block `rank` of the input; comm.h promises it at the
// front (MPI_IN_PLACE's place), so one copy of the shard moves it there.
void nccl_reduce_scatter(const Comm *c, Tensor out, Tensor in) {
    size_t n = (size_t)tensor_numel(out), es = dtype_size(in.dt);
    CHECK(in.dt != DT_U16 && in.dt != DT_U8);
    if (!n) return;
    bool in_place = out.p == in.p;
    char *mine = (char *)in.p + (size_t)c->rank * n * es;
    cudaStream_t s = call_begin(c, "reduce-scatter");
    NCCL_CHECK(c, ncclReduceScatter(in.p, in_place ? mine : out.p, n, nccl_dtype(in.dt), ncclSum, nc_of(c), s));
    if (in_place && c->rank) CUDA_CHECK(cudaMemcpyAsync(in.p, mine, n * es, cudaMemcpyDeviceToDevice, s));
    call_end(c, "reduce-scatter", s);
}

// In place when in is block `rank` of out (NCCL's in-place form too).
void nccl_allgather(const Comm *c, Tensor out, Tensor in) {
    size_t n = (size_t)tensor_numel(in);
    if (!n) return;
    cudaStream_t s = call_begin(c, "all-gather");
    NCCL_CHECK(c, ncclAllGather(in.p, out.p, n, nccl_dtype(in.dt), nc_of(c), s));
    call_end(c, "all-gather", s);
}

// Rows in rank blocks (comm_alltoallv's contract) as one group of sends and receives; the block a rank
// keeps is a device copy on the same stream.
static cudaEvent_t exchange(const Comm *c, const char *what, Tensor out, const int64_t *out_rows, Tensor in,
                            const int64_t *in_rows, int64_t row) {
    size_t rb = (size_t)row * dtype_size(in.dt); // bytes per row
    ncclDataType_t t = nccl_dtype(in.dt);
    char *o = out.p;
    const char *i = in.p;
    CHECK(in_rows[c->rank] == out_rows[c->rank]);
    CHECK(!tensor_bytes(in) || !tensor_bytes(out) || o + tensor_bytes(out) <= i ||
          i + tensor_bytes(in) <= o); // no aliasing
    cudaStream_t s = call_begin(c, what);
    int64_t so = 0, ro = 0;
    for (int p = 0; p < c->rank; p++) so += in_rows[p], ro += out_rows[p];
    if (in_rows[c->rank])
        CUDA_CHECK(cudaMemcpyAsync(o + ro * rb, i + so * rb, in_rows[c->rank] * rb, cudaMemcpyDeviceToDevice, s));
    NCCL_CHECK(c, ncclGroupStart());
    so = ro = 0;
    for (int p = 0; p < c->size; so += in_rows[p], ro += out_rows[p], p++) {
        if (p == c->rank) continue;
        if (in_rows[p]) NCCL_CHECK(c, ncclSend(i + so * rb, (size_t)(in_rows[p] * row), t, p, nc_of(c), s));
        if (out_rows[p]) NCCL_CHECK(c, ncclRecv(o + ro * rb, (size_t)(out_rows[p] * row), t, p, nc_of(c), s));
    }
    NCCL_CHECK(c, ncclGroupEnd());
    return call_end_async(c, what, s);
}

void nccl_alltoall(const Comm *c, Tensor out, Tensor in) {
    int64_t n = tensor_numel(in) / c->size;
    int64_t *rows = xmalloc((size_t)c->size * sizeof(int64_t));
    for (int p = 0; p < c->size; p++) rows[p] = 1;
    nccl_wait(exchange(c, "all-to-all", out, rows, in, rows, n));
    free(rows);
}

void *nccl_reduce_start(const Comm *c, Tensor x, int root) {
    cudaStream_t s = call_begin(c, "reduce");
    NCCL_CHECK(c, ncclReduce(x.p, x.p, (size_t)tensor_numel(x), nccl_dtype(x.dt), ncclSum, root, nc_of(c), s));
    return call_end_async(c, "reduce", s);
}

void *nccl_alltoallv_start(const Comm *c, Tensor out, const int64_t *out_rows, Tensor in, const int64_t *in_rows) {
    int64_t row = 1;
    for (int d = 1; d < in.nd; d++) row *= in.n[d];
    return exchange(c, "all-to-all", out, out_rows, in, in_rows, row);
}

// Every send and receive of ops in one group, so pairs in both directions cannot deadlock.
void *nccl_p2p_start(const Comm *c, const CommP2p *ops, int n, const char *what) {
    cudaStream_t s = call_begin(c, what);
    NCCL_CHECK(c, ncclGroupStart());
    for (int i = 0; i < n; i++) {
        Tensor x = ops[i].x;
        size_t count = (size_t)tensor_numel(x);
        if (!count) continue;
        if (ops[i].send) NCCL_CHECK(c, ncclSend(x.p, count, nccl_dtype(x.dt), ops[i].peer, nc_of(c), s));
        else NCCL_CHECK(c, ncclRecv(x.p, count, nccl_dtype(x.dt), ops[i].peer, nc_of(c), s));
    }
    NCCL_CHECK(c, ncclGroupEnd());
    return call_end_async(c, what, s);
}

void nccl_broadcast(const Comm *c, Tensor x, int root) {
    size_t n = (size_t)tensor_numel(x);
    if (!n) return;
    cudaStream_t s = call_begin(c, "broadcast");
    NCCL_CHECK(c, ncclBroadcast(x.p, x.p, n, nccl_dtype(x.dt), root, nc_of(c), s));
    call_end(c, "broadcast", s);
}

#endif // PITH_NCCL
