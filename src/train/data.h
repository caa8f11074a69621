// data.h — the training data: every *.bin token file under the dataset folder (PithTrain's format,
// docs/reference.md §18), memory-mapped. Sample i of the concatenation is tokens[i·S : i·S+S] of its file
// with labels shifted by one; samples never cross files. Each epoch visits all samples in a fresh seeded
// permutation, so a run longer than one epoch continues instead of failing.
#pragma once
#include "base/base.h"

typedef struct {
    char *path;
    void *map;
    size_t size;
    const void *tokens; // inside map
    DType dt;           // DT_U8, DT_U16, DT_U32 or DT_U64
    int64_t ntok, nsamples;
    bool max_cached; // the largest token id came from the cache (size and mtime unchanged), not a scan
} TokenFile;

typedef struct {
    TokenFile *files;
    int nfiles;
    int64_t *first; // (nfiles + 1) index of each file's first sample in the concatenation
    int64_t total;  // samples in one epoch
    int S, vocab;
    uint64_t seed;
    bool ordered;  // no permutation: sample i is the i-th of the concatenation (evaluation)
    int64_t epoch; // epoch of the current permutation
    int64_t *perm; // (total) permutation of this epoch
} Dataset;

// Opens every .bin under path (a folder, searched recursively in sorted order, or one file).
void dataset_open(Dataset *d, const char *path, int S, int vocab, uint64_t seed);
void dataset_close(Dataset *d);
// Sample `index` of the endless stream epoch 0, epoch 1, … (index = epoch·total + position):
// tokens and labels, each S int32. Says so on stdout when a new epoch begins.
void dataset_sample(Dataset *d, int64_t index, int32_t *tokens, int32_t *labels);
// Context parallelism's zigzag layout, in place: x holds B sequences of S values; afterwards its front holds, per
// sequence, chunks r and 2·cp − 1 − r of the 2·cp chunks of S/(2·cp) (B·S/cp values). cp = 1 changes nothing.
void dataset_zigzag(int32_t *x, int B, int S, int cp, int r);
