// mesh.h — processes and the 4-D mesh (PP, DP, CP, EP), outer → inner (docs/reference.md §13). One
// process per rank, started by mpirun/srun; a process started without a launcher is the whole world
// (MPI is then never initialised). Global rank = ((pp·DP + dp)·CP + cp)·EP + ep, so EP and then CP
// groups are neighbouring ranks. DP = world / (PP·CP·EP).
#pragma once
#include "parallel/comm.h"

typedef struct {
    int pp, dp, cp, ep; // mesh sizes (pp·dp·cp·ep = world.size)
    bool hsdp;          // sharding_strategy "hsdp": replicate over dp, shard over the rest
    // One Comm per group this rank belongs to; .rank is the rank's coordinate along the group.
    Comm world;
    Comm pp_g, dp_g, cp_g, ep_g; // one axis each
    Comm dp_cp;                  // dp×cp: FSDP group of expert parameters
    Comm dp_cp_ep;               // dp×cp×ep (one pipeline stage): FSDP group of the others, loss and token counts
    Comm cp_ep;                  // cp×ep: hsdp's shard group of non-expert parameters
    Comm dp_ep;                  // dp×ep: the data replicas (global-batch load balancing)
} Dist;

// Initialises MPI when a launcher started this process (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMI_RANK or
// PMIX_RANK in the environment); idempotent. From then on die() aborts every rank when world > 1.
void dist_launch(void);
int dist_world_size(void);
int dist_world_rank(void);
void dist_finalize(void); // MPI_Finalize when launched

// The mesh of the launched world for these parallel sizes: validates them (dies naming the config file
// and key) and creates the group communicators. timeout_s bounds every collective (0: none).
void dist_mesh_init(Dist *d, int pp, int cp, int ep, bool hsdp, double timeout_s, const char *file);
// Sizes and coordinates of `rank` in a world of `world` ranks, without communicators (pith estimate).
void dist_mesh_describe(Dist *d, int world, int rank, int pp, int cp, int ep, bool hsdp, const char *file);
// One GPU per rank (device = local rank, chosen before anything else touches the GPU) and an NCCL
// communicator for every group of several ranks, bootstrapped over MPI; from then on the groups carry
// device buffers too. Nothing with one rank; dies in a build without NCCL. Collective over the world.
void dist_mesh_gpu(Dist *d);
void dist_mesh_free(Dist *d); // destroys the NCCL communicators (after the watchdog) and the MPI ones
int dist_rank_of(const Dist *d, int pp, int dp, int cp, int ep); // global rank of mesh coordinates
