// comm.h — collective and point-to-point communication inside one group of ranks (a `Comm`): all-reduce,
// reduce-scatter, all-gather, all-to-all (equal blocks or per-peer row counts), send/recv, broadcast,
// barrier. Buffers are Tensors: host buffers travel over MPI, device buffers (DEV_CUDA) over NCCL once
// dist_mesh_gpu has given the group a communicator (parallel/nccl_comm.c: issued on the comm stream, ordered
// against the compute stream by events, no host sync). Every call is non-blocking underneath and watched
// against the group's deadline (parallel.timeout_s): MPI calls are polled with MPI_Test, NCCL calls by a
// watchdog thread (event completion, ncclCommGetAsyncError), so a rank that died or hangs ends the job
// with a message instead of a silent hang. A group of one rank needs neither: every call is a local copy.
// Point-to-point transfers and all-to-all-v also come as requests, issued now and finished by comm_wait,
// so compute can run while they travel.
#pragma once
#include <mpi.h>

#include "base/base.h"

typedef struct Comm {
    char name[16];    // "ep", "dp×cp", … for messages
    int rank, size;   // this rank's index in the group, ranks in the group
    Device dev;       // DEV_CUDA once the group has an NCCL communicator (device buffers), else DEV_CPU
    MPI_Comm mpi;     // MPI_COMM_NULL when size == 1
    double timeout_s; // a call not complete after this long is fatal
    void *nccl;       // ncclComm_t (dist_mesh_gpu), shared by the groups of one rank set; NULL: host buffers only
    bool nccl_owner;  // this Comm created nccl (and destroys it)
} Comm;

typedef enum { COMM_SUM, COMM_MAX } CommOp;

// A group of one rank (no MPI).
Comm comm_self(const char *name);
// Host tensors go over MPI, device tensors over NCCL (both buffers of a call on the same side).
// x (in place): element-wise reduction over the group. F32, F64, I32, I64 (and BF16 on the GPU).
void comm_allreduce(const Comm *c, Tensor x, CommOp op);
// out: (n) = Σ over ranks of block `rank` of in: (size·n). In place when out.p == in.p: the sum then
// lands in the first n elements of in.
void comm_reduce_scatter(const Comm *c, Tensor out, Tensor in);
// out: (size·n) = the in: (n) of every rank, in rank order. In place when in is this rank's block of out.
void comm_allgather(const Comm *c, Tensor out, Tensor in);
// Block p of in (size equal blocks) goes to rank p; block p of out comes from rank p.
void comm_alltoall(const Comm *c, Tensor out, Tensor in);
// Rows (dim 0) in rank blocks: in_rows[p] rows of in go to rank p, out_rows[p] rows of out come from rank p,
// blocks back to back in rank order. Row = all trailing dims.
void comm_alltoallv(const Comm *c, Tensor out, const int64_t *out_rows, Tensor in, const int64_t *in_rows);
void comm_broadcast(const Comm *c, Tensor x, int root);
void comm_barrier(const Comm *c);

// ---- requests: issued now, finished by comm_wait ----
// Until comm_wait returns the buffers belong to the transfer (host buffers); for device buffers comm_wait
// makes the compute stream wait for the transfer (the host never does), so compute queued before the
// wait runs beside it and compute queued after it sees the data. Every request is waited for exactly once.
enum { COMM_MAX_P2P = 8 };
typedef struct {
    bool send;
    Tensor x;
    int peer;
} CommP2p;
typedef struct {
    const Comm *c;
    const char *what; // "send", "recv", "send/recv", "all-to-all": for messages
    int n;            // MPI requests in flight (0: nothing left to wait for)
    MPI_Request mpi[COMM_MAX_P2P];
    MPI_Datatype row; // all-to-all-v over MPI: the row type, freed by the wait
    int *counts;      // all-to-all-v over MPI: counts and displacements, kept until the wait
    void *event;      // device buffers: the transfer's completion event on the comm stream
} CommReq;

// Posts every send and receive of ops together — one NCCL group; over MPI each is started before any is
// waited for — so an exchange in both directions, or around a ring, cannot deadlock. n ≤ COMM_MAX_P2P;
// empty tensors are skipped (their partner's are empty too).
CommReq comm_p2p_start(const Comm *c, const CommP2p *ops, int n);
// x (in place) on rank root ← Σ over the group of x, issued now: after comm_wait the root's x holds the sum, the
// other ranks' x is as it was; no rank touches x before. F32, F64.
CommReq comm_reduce_start(const Comm *c, Tensor x, int root);
// comm_alltoallv, issued now.
CommReq comm_alltoallv_start(const Comm *c, Tensor out, const int64_t *out_rows, Tensor in, const int64_t *in_rows);
// Finishes r. Host requests are polled against the group's deadline, counted from the start of the wait;
// a device request's deadline is the watchdog's, counted from its issue.
void comm_wait(CommReq *r);
// comm_p2p_start's ops, then their wait (n = 0: nothing).
void comm_exchange(const Comm *c, const CommP2p *ops, int n);

// Every MPI call goes through MPI_CHECK: a failure dies naming the call and file:line.
#define MPI_CHECK(call) mpi_check((call), #call, __FILE__, __LINE__)
void mpi_check(int rc, const char *call, const char *file, int line);
