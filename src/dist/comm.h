// comm.h — collective and point-to-point communication inside one group of ranks (a `Comm`): all-reduce,
// reduce-scatter, all-gather, all-to-all (equal blocks or per-peer row counts), send/recv, broadcast,
// barrier. Buffers are Tensors; a Comm carries host buffers over MPI (DEV_CPU) — device buffers over NCCL
// (DEV_CUDA) are the GPU half's step and stop with an error here. Every call is non-blocking underneath and
// polled against the group's deadline (parallel.timeout_s), so a rank that died or hangs ends the job
// with a message instead of a silent hang. A group of one rank needs no MPI: every call is a local copy.
#pragma once
#include <mpi.h>

#include "base/base.h"

typedef struct Comm {
    char name[16];    // "ep", "dp×cp", … for messages
    int rank, size;   // this rank's index in the group, ranks in the group
    Device dev;       // where the buffers live: DEV_CPU → MPI (DEV_CUDA → NCCL, later)
    MPI_Comm mpi;     // MPI_COMM_NULL when size == 1
    double timeout_s; // a call not complete after this long is fatal
} Comm;

typedef enum { COMM_SUM, COMM_MAX } CommOp;

// A group of one rank (no MPI).
Comm comm_self(const char *name);
// x (in place): element-wise reduction over the group. F32, F64, I32, I64.
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
void comm_send(const Comm *c, Tensor x, int peer);
void comm_recv(const Comm *c, Tensor x, int peer);
void comm_broadcast(const Comm *c, Tensor x, int root);
void comm_barrier(const Comm *c);

// Every MPI call goes through MPI_CHECK: a failure dies naming the call and file:line.
#define MPI_CHECK(call) mpi_check((call), #call, __FILE__, __LINE__)
void mpi_check(int rc, const char *call, const char *file, int line);
