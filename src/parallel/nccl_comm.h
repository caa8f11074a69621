// nccl_comm.h — the NCCL half of comm.h: collectives on device buffers, one GPU per rank. Built when the
// CUDA build finds nccl.h (PITH_NCCL); comm.c calls these for DEV_CUDA tensors, mesh.c binds the GPU and
// creates the communicators (dist_mesh_gpu). Every call is issued on the comm stream after an event that
// makes it wait for the compute stream's work so far, and records an event the compute stream's later work
// waits for: stream order is program order, and the host never waits. A watchdog thread follows those
// events and ncclCommGetAsyncError against the group's parallel.timeout_s; on a timeout or an error it
// names the rank, the group and the call, aborts every NCCL communicator and ends the process (the
// launcher then stops the other ranks).
#pragma once
#include "parallel/comm.h"

// Binds this process to its GPU: device local_rank of the node's `ndev` (device 0 when the launcher shows
// each rank one GPU). Must run before anything else touches the GPU. local_size: ranks on this node.
void nccl_bind_device(int local_rank, int local_size);
// The NCCL communicator of c (c->size > 1, c->mpi set): rank 0 of the group makes the unique id, MPI
// broadcasts it over c->mpi, every rank calls ncclCommInitRank. Collective over the group.
void nccl_comm_create(Comm *c);
// Destroys c's communicator when c owns it (after the comm stream has drained); clears c->nccl.
void nccl_comm_destroy(Comm *c);
// Stops the watchdog (after the last communicator is gone, or before exiting).
void nccl_shutdown(void);

// Same contracts as the comm_* functions of comm.h; c->size > 1 and c->nccl set, tensors on the device.
void nccl_allreduce(const Comm *c, Tensor x, CommOp op);
void nccl_reduce_scatter(const Comm *c, Tensor out, Tensor in);
void nccl_allgather(const Comm *c, Tensor out, Tensor in);
void nccl_alltoall(const Comm *c, Tensor out, Tensor in);
void nccl_broadcast(const Comm *c, Tensor x, int root);
// Issued like the calls above, but the compute stream waits only in nccl_wait: each returns a completion
// event (from a pool) that nccl_wait makes the compute stream wait for and then takes back. The watchdog
// follows the call from its issue.
void *nccl_p2p_start(const Comm *c, const CommP2p *ops, int n, const char *what);
void *nccl_reduce_start(const Comm *c, Tensor x, int root);
void *nccl_alltoallv_start(const Comm *c, Tensor out, const int64_t *out_rows, Tensor in, const int64_t *in_rows);
void nccl_wait(void *event);
