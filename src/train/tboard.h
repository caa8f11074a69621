// tboard.h — TensorBoard event files: scalars per step, in the record format TensorBoard and
// `wandb sync --sync-tensorboard` read (docs/architecture.md, "Logs").
#pragma once
#include "base/base.h"

typedef struct {
    FILE *f;
    char path[4200];
} TbWriter;

// Creates <run_dir>/events.out.tfevents.<unix time>.<host>.<pid> and writes its file-version record.
// The name is new for every run, so a resumed run adds a file beside the old one.
void tboard_open(TbWriter *w, const char *run_dir);
// One Event of step `step` holding n scalars tags[i] = values[i] (stored as float32), flushed to the file
// so that a run killed later leaves every step before it readable.
void tboard_scalars(TbWriter *w, int64_t step, int n, const char *const *tags, const double *values);
void tboard_close(TbWriter *w);
// CRC-32C (Castagnoli) of n bytes.
uint32_t tboard_crc32c(const void *data, size_t n);
