// muon.h — the Muon optimizer on the sharded flat parameter groups (docs/architecture.md, "Muon"):
// 2-D and larger weights get momentum → Newton–Schulz → 0.2·√max(n, m) scaling; the rest get AdamW.
#pragma once
#include "parallel/fsdp.h"
#include "train/config.h"

typedef struct {
    int64_t lo, hi; // [lo, hi) of a group's flat buffer
    bool muon;      // Muon parameters (else AdamW)
} MuonRun;

typedef struct {
    int64_t off;         // first element of the first matrix in the group's flat buffer
    int64_t n, m, count; // `count` adjacent (n, m) matrices (a 3-D stack or neighbouring expert tensors)
} MuonBatch;

typedef struct {
    bool on;
    int nruns[NGROUPS], nbatches[NGROUPS];
    MuonRun *runs[NGROUPS];      // the group's parameters as runs of one class, in offset order
    MuonBatch *batches[NGROUPS]; // its Muon matrices, adjacent ones of one shape batched
    Tensor ws;                   // Newton–Schulz scratch for the largest matrix (state arena)
} Muon;

// PithTrain's is_muon_param: not 1-D, not a bias, not the embedding or LM head, not a router.
bool muon_param(const char *name, int nd);
// Builds the runs and batches of the model's parameter table and takes the scratch from a (counting) arena.
void muon_setup(Muon *mu, const ParamTable *t, Arena *a);
void muon_free(Muon *mu);
// One optimizer step on this rank's shards (grad: clipped gradient shards, spent): AdamW on the AdamW runs;
// on the Muon runs momentum (mom1 holds the momentum buffer), the whole update all-gathered into model.g
// (spent after the reduce-scatter), Newton–Schulz of each matrix that overlaps this rank's shard, then
// p = p·(1 − lr·wd) − lr·0.2·√max(n, m)·orth. t: the 1-based step (AdamW's bias correction).
void muon_step(const Muon *mu, const Fsdp *f, Model *m, const TrainConfig *c, double lr, int t, Tensor master[NGROUPS],
               Tensor grad[NGROUPS], Tensor mom1[NGROUPS], Tensor mom2[NGROUPS]);
