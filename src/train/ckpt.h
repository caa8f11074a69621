// ckpt.h — checkpoints (docs/reference.md §16–17): `<save_location>/step-%08d/` holding
//   model.safetensors      fp32 master weights under canonical names (HF names without "model.")
//   optimizer.safetensors  AdamW moments "exp_avg.<name>", "exp_avg_sq.<name>" (absent: model-only), in
//                          optimizer.state_dtype (fp32 or bf16); a resume converts them to this run's dtype
//                          (bf16 ← fp32 rounds to nearest even, fp32 ← bf16 is exact)
//   config.json            the HF model config
//   run.json               step, samples consumed, seed, the training config used, pith version
// written under a temporary name, fsynced, then renamed: a folder named step-N is always complete.
// With several ranks each tensor is written whole by one owner rank (round-robin over the ranks holding
// it) into model-<rank+1>-of-<ranks>.safetensors (optimizer-…), with HF's model.safetensors.index.json
// (optimizer.safetensors.index.json) naming each tensor's file. Everything is layout-independent, so a
// checkpoint loads under any parallel layout (pp/dp/ep/fsdp/hsdp, any rank count) and device.
#pragma once
#include "train/trainer.h"

// Reads model weights from a pith checkpoint folder or an HF folder (model.safetensors, or shards with
// model.safetensors.index.json) into host fp32 buffers laid out by t, a part of the whole model's table `all` (a
// pipeline rank's tensors, or all itself): the folder's tensors are checked against all (a tensor the model does not
// have is an error), every one of t must be present with its shape.
void ckpt_load_model_part(const ParamTable *all, const ParamTable *t, float *flat[NGROUPS], const char *dir);
// Takes the lock of a folder a run writes, `what` being "save_location" or "run_dir" (an flock on <dir>/.lock,
// released when the process ends) or dies naming the holder; creates the folder and so finds an unwritable one
// before step 1. A folder this process holds already (run_dir = save_location) is not locked twice. Rank 0 only.
void ckpt_lock(const char *dir, const char *what);
void ckpt_unlock(void); // run_free: the locks of this process, if any
// The newest checkpoint under save_location (false if none): a step-N folder with run.json, or a
// model-only step-00000000. With tidy (the run holding the lock) it removes the leftovers of saves and
// removals that did not finish; without (pith eval, beside a run that may be saving) it only reads.
bool ckpt_find_latest(const char *save_location, char *out, size_t cap, bool tidy);
// Writes the run's checkpoint for its current step; prunes to keep_last when set. It snapshots what this rank
// writes into host memory first; with checkpoint.async into the run's snapshot arena (Run.snapshot), and a background
// thread writes the files; ckpt_wait completes the folder (checksums, run.json, the rename). Else ckpt_save does all.
// It waits for the save before.
void ckpt_save(Run *r);
// Completes the save in progress, if any (collective: every rank calls it at the same point): the next save and
// the end of the run call it.
void ckpt_wait(Run *r);
// The host memory of a save's snapshot on this rank: the tensors it writes, the masters in fp32 and both moments in
// optimizer.state_dtype (checkpoint.async holds it in Run.snapshot, made once).
size_t ckpt_snapshot_bytes(const Run *r);
// The loop's time in saves (taking snapshots, waiting for their copies and for writes) since the last call, in
// seconds.
double ckpt_loop_seconds(void);
// Loads weights, optimizer state (when present) and step from a checkpoint folder into a set-up run.
void ckpt_resume(Run *r, const char *dir);
// Reads the aux-loss-free balancing biases (L layers × E experts) of a checkpoint's run.json into bias; false
// when the folder has no run.json or it has none (dies naming the file when they are malformed).
bool ckpt_load_router_bias(const char *dir, float *bias, int L, int E);
// Loads only weights (init_from: a checkpoint or HF folder); the optimizer starts fresh at step 0.
void ckpt_init_from(Run *r, const char *dir);
// Writes this step's reduced gradient (the run's gradient shards, before clipping) as whole tensors
// under canonical names into dir, laid out like a checkpoint's model tensors (pith train --dump-grads).
void ckpt_write_grads(Run *r, const char *dir);
