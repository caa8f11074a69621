// data.h — the training data: every *.bin token file under the dataset folder (PithTrain's format,
// docs/reference.md §18), memory-mapped. Sample i of the concatenation is tokens[i·S : i·S+S] of its file
// with labels shifted by one (−100 where the file's loss mask says the token is not a target); samples never
// cross files. Each epoch visits all samples in a fresh seeded
// permutation, so a run longer than one epoch continues instead of failing.
// A weighted mixture of sources (each a dataset as above, with a seed of its own): sample i draws its source k
// from u = rng_uniform(seed, stream, i) against the cumulative shares, and is the n-th sample of source k's own
// endless stream, n being the draws of k among samples 0..i−1. Nothing but (seed, i) decides it, so a resume at
// any step reads what an uninterrupted run reads, under any layout.
#pragma once
#include "base/base.h"
#include "train/config.h"

typedef struct {
    char *path;
    void *map;
    size_t size;
    const void *tokens;  // inside map
    DType dt;            // DT_U8, DT_U16, DT_U32 or DT_U64
    const uint8_t *mask; // (ntok) inside map: 1 the token is a loss target, 0 not (format 2; NULL: every one is)
    const void *ends;    // (nends) uint64 inside map, maybe unaligned: the cumulative document ends, the last = ntok
    int64_t nends;       // 0: the file is one document
    int64_t ntok, nsamples;
    bool max_cached; // the largest token id came from the cache (size and mtime unchanged), not a scan
} TokenFile;

typedef struct Dataset {
    char *path;       // the folder or file (a mixture: NULL)
    TokenFile *files; // a mixture: every source's files, one after another (mapped and closed by the sources)
    int nfiles;
    int64_t *first; // (nfiles + 1) index of each file's first sample in the concatenation
    int64_t total;  // samples in one epoch
    int S, vocab;
    uint64_t seed;
    bool ordered;  // no permutation: sample i is the i-th of the concatenation (evaluation)
    bool source;   // a mixture's source: its epoch messages name its path
    int64_t epoch; // epoch of the current permutation
    int64_t *perm; // (total) permutation of this epoch
    // A mixture (nsrc > 0); the draw counts of the sources at every MIX_BLOCK-th sample are kept as the run
    // reads on, so sample i counts at most MIX_BLOCK draws (fewer going on from the previous sample).
    struct Dataset *src; // (nsrc) the sources
    int nsrc;
    double *weight, *cum; // (nsrc) the weights as given; the cumulative shares, the last 1
    int64_t *drawn;       // (nblocks·nsrc) draws of each source among samples [0, b·MIX_BLOCK)
    int64_t nblocks, at;  // rows of drawn; the cursor: now[k] = draws of source k among samples [0, at)
    int64_t *now;         // (nsrc)
} Dataset;

// Opens every .bin under path (a folder, searched recursively in sorted order, or one file).
void dataset_open(Dataset *d, const char *path, int S, int vocab, uint64_t seed);
// The training data of c: dataset_open of its one path, or the mixture of its sources (errors name c's file
// and the source: dataset[k].path).
void dataset_open_config(Dataset *d, const TrainConfig *c, int vocab);
void dataset_close(Dataset *d);
// The data recipe, as run.json records it: {"sources": [{"path", "weight", "files": [{"path", "bytes",
// "fingerprint"}]}], "fingerprint"}. A file's fingerprint hashes its size and 16 blocks of 4 KiB spread over it
// (cheap at every start; a full hash would read every byte); the recipe's hashes the shares and the files' sizes
// and fingerprints (not the paths: moved data is the same data).
json_t *dataset_recipe(const Dataset *d);
// Compares a checkpoint's recipe (run.json "data", from `where`; NULL: not recorded) with d's: prints each field
// that differs and dies naming the first unless allow (--allow-config-change).
void dataset_check_recipe(const Dataset *d, const json_t *saved, const char *where, bool allow);
// Sample `index` of the endless stream epoch 0, epoch 1, … (index = epoch·total + position):
// tokens and labels, each S int32. Says so on stdout when a new epoch begins.
void dataset_sample(Dataset *d, int64_t index, int32_t *tokens, int32_t *labels);
// The same and, unless docpos is NULL, each token's position inside its document (S int32, document masking): 0 at
// a document's first token and at the sample's first (a document begun before the sample counts from there). The
// labels are dataset_sample's: a document's last token has the next document's first as its target.
void dataset_sample_docs(Dataset *d, int64_t index, int32_t *tokens, int32_t *labels, int32_t *docpos);
// Context parallelism's zigzag layout, in place: x holds B sequences of S values; afterwards its front holds, per
// sequence, chunks r and 2·cp − 1 − r of the 2·cp chunks of S/(2·cp) (B·S/cp values). cp = 1 changes nothing.
// Document positions take it like the tokens: each value stays the position inside its document.
void dataset_zigzag(int32_t *x, int B, int S, int cp, int r);
