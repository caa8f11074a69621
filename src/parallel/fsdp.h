// fsdp.h — fully sharded data parallelism over the flat parameter groups (docs/reference.md §14). The
// expert group is sharded over dp×cp, the other group over dp×cp×ep; with hsdp both are replicated over
// dp and sharded over the rest (cp, cp×ep). A group's flat buffer of n elements (padded to a multiple of
// the shard count: ModelConfig.pad) is cut into equal contiguous shards; shard i belongs to the rank of
// index i in the shard group. fp32 masters, AdamW moments and reduced gradients exist only as shards;
// the compute copy (model.w) and the fp32 gradient accumulators (model.g) are whole, for one step (but the dense
// group's under parallel.gradient_reduce "layer": reduced per unit into its shard, fsdp_reduce_unit_start).
#pragma once
#include "parallel/mesh.h"

enum { GROUP_DENSE, GROUP_EXPERT, NGROUPS }; // parameter groups: non-expert parameters; expert parameters

typedef struct {
    int64_t numel[NGROUPS];             // padded elements of each group's flat buffer on this rank
    int64_t len[NGROUPS], off[NGROUPS]; // this rank's shard: elements [off, off + len)
    const Comm *shard[NGROUPS];         // the group's shard group
    const Comm *replica[NGROUPS];       // hsdp: the dp group holding identical shards (else size 1)
    const Comm *world;                  // for the global grad norm
    bool counts_in_norm;                // this rank's shards enter the norm (hsdp: dp rank 0 only)
    bool units;                         // parallel.gradient_reduce "layer": the dense gradient reduced per unit
} Fsdp;

// Shards of group g under the layout (the padding multiple for ModelConfig.pad).
int fsdp_shards(const Dist *d, int g);
// The shards of the groups whose whole flat compute copies are w; units: the dense gradient reduced per unit.
void fsdp_setup(Fsdp *f, const Dist *d, const Tensor w[NGROUPS], bool units);
// Allocates this rank's fp32 masters and AdamW moments from a (counting) arena and points the reduced
// gradient shard at the front of the whole fp32 gradient g (the reduce-scatter runs in place); with f->units the
// dense gradient shard is its own allocation from `a` (there is no whole dense g). With one shard the
// master is the compute copy w itself where that is fp32 on a's device.
// The moments, in dtype mdt (fp32 or bf16), come from `moments` (the state arena, or a host arena when
// optimizer.offload holds them off the GPU).
void fsdp_alloc_state(const Fsdp *f, const Tensor w[NGROUPS], const Tensor g[NGROUPS], Arena *a, Arena *moments,
                      DType mdt, Tensor master[NGROUPS], Tensor grad[NGROUPS], Tensor mom1[NGROUPS],
                      Tensor mom2[NGROUPS]);
// full: (numel) compute copy ← all-gather of the master shards: (len) (converted to full's dtype).
void fsdp_gather(const Fsdp *f, int g, Tensor full, Tensor shard);
// The rows of the compute copy `full` that this rank's shard fills (p == NULL when the copy is the shard itself
// or on another device): the optimizer writes them in its pass (op_adamw's w), then fsdp_gather_rest all-gathers
// the other ranks' rows into full.
Tensor fsdp_own_rows(const Fsdp *f, int g, Tensor full, Tensor shard);
void fsdp_gather_rest(const Fsdp *f, int g, Tensor full, Tensor own);
// shard: (len) ← Σ over every rank of its full: (numel) fp32 gradient accumulators, this rank's range;
// in place: shard is the front of full (whose contents are then spent until the next zeroing). full without data
// (the group reduced per unit, fsdp_reduce_unit): only hsdp's sum over the replicas.
void fsdp_reduce_scatter(const Fsdp *f, int g, Tensor shard, Tensor full);
// A unit's gradient win: elements [off, off + n) of group g's flat buffer. Its sum over the shard group goes to each
// rank whose shard meets the range (a reduce of that sub-range to it, issued now: one request per such rank in req,
// which holds the shard group's size; returns their count); fsdp_reduce_unit_finish waits for them and adds this
// rank's part into shard: (len) fp32. win's contents are spent; nothing may touch it in between.
int fsdp_reduce_unit_start(const Fsdp *f, int g, Tensor win, int64_t off, CommReq *req);
void fsdp_reduce_unit_finish(const Fsdp *f, int g, Tensor shard, Tensor win, int64_t off, CommReq *req, int n);
// shard ← this rank's range of a whole host fp32 buffer (numel) (initial values, checkpoints).
void fsdp_take_shard(const Fsdp *f, int g, Tensor shard, const float *full);
// full: host fp32 (numel) ← every shard of the group (checkpoints).
void fsdp_gather_host(const Fsdp *f, int g, float *full, Tensor shard);
// Σ x² over every element of the whole (unsharded) groups, each counted once: shards: (len) fp32.
double fsdp_sum_squares(const Fsdp *f, const Tensor shard[NGROUPS]);
