// data.c — memory-mapped token files and the epoch permutation (see data.h).
#include "train/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/npy.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Appends every regular *.bin file under dir (recursively) to *list.
static void find_bins(const char *dir, char ***list, int *n, int *cap) {
    DIR *dp = opendir(dir);
    if (!dp) die("%s: cannot open dataset folder: %s", dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        path_join(path, sizeof path, dir, de->d_name);
        if (path_is_dir(path)) find_bins(path, list, n, cap);
        else if (strlen(de->d_name) > 4 && !strcmp(de->d_name + strlen(de->d_name) - 4, ".bin")) {
            if (*n == *cap) *list = xrealloc(*list, (*cap = *cap ? 2 * *cap : 64) * sizeof **list);
            (*list)[(*n)++] = xstrdup(path);
        }
    }
    closedir(dp);
}

static void token_file_open(TokenFile *f, const char *path, int S) {
    memset(f, 0, sizeof *f);
    f->path = xstrdup(path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    fstat(fd, &st);
    f->size = st.st_size;
    f->map = f->size ? mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->size && f->map == MAP_FAILED) die("%s: cannot mmap: %s", path, strerror(errno));
    NpyRecord tok, ends;
    char err[256];
    if (!npy_parse(f->map, f->size, &tok, err, sizeof err)) die("%s: token record: %s", path, err);
    if (tok.dt != DT_U8 && tok.dt != DT_U16 && tok.dt != DT_U32 && tok.dt != DT_U64)
        die("%s: token record: dtype %s, expected an unsigned integer type", path, dtype_name(tok.dt));
    if (!npy_parse((const uint8_t *)f->map + tok.record_len, f->size - tok.record_len, &ends, err, sizeof err))
        die("%s: document-end record: %s", path, err);
    if (ends.dt != DT_U64) die("%s: document-end record: dtype %s, expected uint64", path, dtype_name(ends.dt));
    uint64_t last = 0; // the record follows the tokens, so it need not be 8-byte aligned
    if (ends.n) memcpy(&last, (const uint64_t *)ends.data + ends.n - 1, sizeof last);
    if (ends.n && last != (uint64_t)tok.n)
        die("%s: document-end record: last end is %llu but the file has %lld tokens", path, (unsigned long long)last, (long long)tok.n);
    f->tokens = tok.data, f->dt = tok.dt, f->ntok = tok.n;
    f->nsamples = tok.n > 0 ? (tok.n - 1) / S : 0;
}

void dataset_open(Dataset *d, const char *path, int S, int vocab, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->S = S, d->vocab = vocab, d->seed = seed, d->epoch = -1;
    if (!path[0]) die("config: dataset: missing (a folder of .bin token files)");
    char **list = NULL;
    int n = 0, cap = 0;
    if (path_is_dir(path)) find_bins(path, &list, &n, &cap);
    else if (path_exists(path)) list = xmalloc(sizeof *list), list[n++] = xstrdup(path);
    else die("%s: dataset not found", path);
    if (!n) die("%s: no .bin token files found", path);
    qsort(list, n, sizeof *list, cmp_str);
    d->files = xcalloc(n, sizeof *d->files);
    d->first = xcalloc(n + 1, sizeof *d->first);
    d->nfiles = n;
    for (int i = 0; i < n; i++) {
        token_file_open(&d->files[i], list[i], S);
        d->first[i + 1] = d->first[i] + d->files[i].nsamples;
        free(list[i]);
    }
    free(list);
    d->total = d->first[n];
    if (!d->total) die("%s: the token files hold no sample of sequence_length %d + 1 tokens", path, S);
    d->perm = xmalloc(d->total * sizeof *d->perm);
}

void dataset_close(Dataset *d) {
    for (int i = 0; i < d->nfiles; i++) {
        if (d->files[i].map) munmap(d->files[i].map, d->files[i].size);
        free(d->files[i].path);
    }
    free(d->files), free(d->first), free(d->perm);
    memset(d, 0, sizeof *d);
}

// Fisher–Yates with a generator seeded by (seed, epoch).
static void dataset_permute(Dataset *d, int64_t epoch) {
    Rng r = rng_seeded(d->seed, 0xda7a0000ULL + (uint64_t)epoch);
    for (int64_t i = 0; i < d->total; i++) d->perm[i] = i;
    for (int64_t i = d->total - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1), t = d->perm[i];
        d->perm[i] = d->perm[j], d->perm[j] = t;
    }
    if (epoch > 0) printf("data: epoch %lld begins (%lld samples, fresh permutation)\n", (long long)epoch, (long long)d->total);
    d->epoch = epoch;
}

static uint64_t token_at(const TokenFile *f, int64_t i) {
    switch (f->dt) {
    case DT_U8: return ((const uint8_t *)f->tokens)[i];
    case DT_U16: return ((const uint16_t *)f->tokens)[i];
    case DT_U32: return ((const uint32_t *)f->tokens)[i];
    default: return ((const uint64_t *)f->tokens)[i];
    }
}

void dataset_sample(Dataset *d, int64_t index, int32_t *tokens, int32_t *labels) {
    int64_t epoch = index / d->total, p;
    if (!d->ordered && epoch != d->epoch) dataset_permute(d, epoch);
    p = d->ordered ? index % d->total : d->perm[index % d->total];
    int lo = 0, hi = d->nfiles - 1; // the file holding sample p: first[lo] <= p < first[lo + 1]
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first[mid] <= p) lo = mid;
        else hi = mid - 1;
    }
    const TokenFile *f = &d->files[lo];
    int64_t start = (p - d->first[lo]) * d->S;
    for (int i = 0; i <= d->S; i++) {
        uint64_t t = token_at(f, start + i);
        if (t >= (uint64_t)d->vocab)
            die("%s: token %llu at position %lld is outside the model's vocabulary of %d", f->path, (unsigned long long)t,
                (long long)(start + i), d->vocab);
        if (i < d->S) tokens[i] = (int32_t)t;
        if (i > 0) labels[i - 1] = (int32_t)t;
    }
}
