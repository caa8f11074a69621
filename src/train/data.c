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

// The folders and token files a dataset walk has met, by (device, inode): a link back to a parent folder, or a
// second path to one file, would read the same tokens more than once.
typedef struct {
    dev_t dev;
    ino_t ino;
    char *path;
} Seen;
typedef struct {
    Seen *v;
    int n, cap;
} SeenSet;

// Dies when path (a folder or a token file) is one met already under another path; else records it.
static void seen_add(SeenSet *s, const char *path) {
    struct stat st;
    if (stat(path, &st)) die("%s: cannot open: %s", path, strerror(errno));
    for (int i = 0; i < s->n; i++)
        if (s->v[i].dev == st.st_dev && s->v[i].ino == st.st_ino)
            die("%s: the same %s as %s (a link): the dataset would read it more than once", path,
                S_ISDIR(st.st_mode) ? "folder" : "file", s->v[i].path);
    if (s->n == s->cap) s->v = xrealloc(s->v, (s->cap = s->cap ? 2 * s->cap : 64) * sizeof *s->v);
    s->v[s->n++] = (Seen){st.st_dev, st.st_ino, xstrdup(path)};
}

// Appends every *.bin file under dir (recursively) to *list.
static void find_bins(const char *dir, char ***list, int *n, int *cap, SeenSet *seen) {
    seen_add(seen, dir);
    DIR *dp = opendir(dir);
    if (!dp) die("%s: cannot open dataset folder: %s", dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        path_join(path, sizeof path, dir, de->d_name);
        if (path_is_dir(path)) find_bins(path, list, n, cap, seen);
        else if (strlen(de->d_name) > 4 && !strcmp(de->d_name + strlen(de->d_name) - 4, ".bin")) {
            seen_add(seen, path);
            if (*n == *cap) *list = xrealloc(*list, (*cap = *cap ? 2 * *cap : 64) * sizeof **list);
            (*list)[(*n)++] = xstrdup(path);
        }
    }
    closedir(dp);
}

static uint64_t token_at_raw(const TokenFile *f, int64_t i) {
    switch (f->dt) {
    case DT_U8: return ((const uint8_t *)f->tokens)[i];
    case DT_U16: return ((const uint16_t *)f->tokens)[i];
    case DT_U32: return ((const uint32_t *)f->tokens)[i];
    default: return ((const uint64_t *)f->tokens)[i];
    }
}

// The largest token id of f: a max over the whole mapped record (vectorised), remembered in a cache file
// named by the file's path, inode, size, mtime and ctime so a second run over unchanged data skips the scan.
// ctime is the kernel's: every write to the file (and every utimes that puts its mtime back) moves it, and no
// call sets it, so a file rewritten in place with its size and mtime kept is scanned again. (A key on the
// content itself would read every byte, which is the scan.) The embedding ops check each id as they read it.
static uint64_t token_max_scan(const TokenFile *f) {
    uint64_t m = 0;
    int64_t n = f->ntok;
#define MAX_OF(type)                                                                                                   \
    do {                                                                                                               \
        const type *t = f->tokens;                                                                                     \
        _Pragma("omp parallel for reduction(max : m)") for (int64_t i = 0; i < n; i++) m = t[i] > m ? t[i] : m;        \
    } while (0)
    switch (f->dt) {
    case DT_U8: MAX_OF(uint8_t); break;
    case DT_U16: MAX_OF(uint16_t); break;
    case DT_U32: MAX_OF(uint32_t); break;
    default: MAX_OF(uint64_t);
    }
#undef MAX_OF
    return m;
}

// $PITH_CACHE_DIR, else $XDG_CACHE_HOME/pith, else ~/.cache/pith (empty: no cache).
static void cache_dir(char *out, size_t cap) {
    const char *p = getenv("PITH_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (p && p[0]) snprintf(out, cap, "%s", p);
    else if (x && x[0]) snprintf(out, cap, "%s/pith", x);
    else if (h && h[0]) snprintf(out, cap, "%s/.cache/pith", h);
    else out[0] = 0;
}

static uint64_t token_max(const TokenFile *f, const struct stat *st, bool *cached) {
    char dir[3000], path[3200], real[PATH_MAX], text[64];
    cache_dir(dir, sizeof dir);
    *cached = false;
    if (!dir[0] || !realpath(f->path, real)) return token_max_scan(f);
    snprintf(path, sizeof path, "%s/token-max-%016llx-%llu-%lld-%lld.%09ld-%lld.%09ld", dir,
             (unsigned long long)rng_hash_str(real), (unsigned long long)st->st_ino, (long long)st->st_size,
             (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec, (long long)st->st_ctim.tv_sec,
             (long)st->st_ctim.tv_nsec);
    unsigned long long m;
    char *text_in = path_exists(path) ? file_read_all(path, NULL) : NULL;
    bool hit = text_in && sscanf(text_in, "%llu", &m) == 1;
    free(text_in);
    if (hit) return *cached = true, m;
    m = token_max_scan(f);
    // Best effort, written whole under a name of this process and renamed: ranks may race, never half-write.
    char tmp[3300];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    int len = snprintf(text, sizeof text, "%llu\n", m);
    for (char *q = dir + 1; *q; q++) // mkdir -p, quietly: without a cache the scan simply runs again
        if (*q == '/') *q = 0, mkdir(dir, 0755), *q = '/';
    if (mkdir(dir, 0755) && errno != EEXIST) return m;
    FILE *w = fopen(tmp, "w");
    if (!w) return m;
    bool ok = fwrite(text, 1, len, w) == (size_t)len;
    if (fclose(w) || !ok || rename(tmp, path)) unlink(tmp);
    return m;
}

static void token_file_open(TokenFile *f, const char *path, int S, int vocab) {
    memset(f, 0, sizeof *f);
    f->path = xstrdup(path);
    struct stat st;
    // A FIFO or device named *.bin would block open() or read forever: only regular files are data.
    if (stat(path, &st)) die("%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) die("%s: not a regular file (a token file is two or three .npy records)", path);
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) die("%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st)) die("%s: cannot stat: %s", path, strerror(errno));
    f->size = st.st_size;
    f->map = f->size ? mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->size && f->map == MAP_FAILED) die("%s: cannot mmap: %s", path, strerror(errno));
    NpyRecord tok, ends, mask;
    char err[300];
    if (!npy_token_file_parse(f->map, f->size, &tok, &ends, &mask, err, sizeof err)) die("%s: %s", path, err);
    f->tokens = tok.data, f->dt = tok.dt, f->ntok = tok.n, f->mask = mask.data;
    f->ends = ends.data, f->nends = ends.n;
    f->nsamples = tok.n > 0 ? (tok.n - 1) / S : 0;
    uint64_t m = tok.n ? token_max(f, &st, &f->max_cached) : 0;
    if (m >= (uint64_t)vocab && f->max_cached) m = token_max_scan(f), f->max_cached = false; // an error: make sure
    if (m >= (uint64_t)vocab) {
        int64_t at = 0;
        while (token_at_raw(f, at) != m) at++;
        die("%s: token %llu at position %lld is outside the model's vocabulary of %d", path, (unsigned long long)m,
            (long long)at, vocab);
    }
}

void dataset_open(Dataset *d, const char *path, int S, int vocab, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->S = S, d->vocab = vocab, d->seed = seed, d->epoch = -1;
    if (!path[0]) die("config: dataset: missing (a folder of .bin token files)");
    d->path = xstrdup(path);
    char **list = NULL;
    int n = 0, cap = 0;
    SeenSet seen = {0};
    if (path_is_dir(path)) find_bins(path, &list, &n, &cap, &seen);
    else if (path_exists(path)) list = xmalloc(sizeof *list), list[n++] = xstrdup(path);
    else die("%s: dataset not found", path);
    if (!n) die("%s: no .bin token files found", path);
    for (int i = 0; i < seen.n; i++) free(seen.v[i].path);
    free(seen.v);
    qsort(list, n, sizeof *list, cmp_str);
    d->files = xcalloc(n, sizeof *d->files);
    d->first = xcalloc(n + 1, sizeof *d->first);
    d->nfiles = n;
    for (int i = 0; i < n; i++) {
        token_file_open(&d->files[i], list[i], S, vocab);
        d->first[i + 1] = d->first[i] + d->files[i].nsamples;
        free(list[i]);
    }
    free(list);
    d->total = d->first[n];
    if (!d->total) die("%s: the token files hold no sample of sequence_length %d + 1 tokens", path, S);
    d->perm = xmalloc(d->total * sizeof *d->perm);
}

enum { MIX_BLOCK = 4096 };
#define MIX_STREAM 0x6d6978ULL // "mix": the source draws; MIX_STREAM + 1: the sources' seeds

void dataset_open_config(Dataset *d, const TrainConfig *c, int vocab) {
    if (!c->mixture) {
        dataset_open(d, c->ndataset ? c->dataset[0].path : "", c->sequence_length, vocab, c->seed);
        return;
    }
    memset(d, 0, sizeof *d);
    d->S = c->sequence_length, d->vocab = vocab, d->seed = c->seed, d->epoch = -1, d->nsrc = c->ndataset;
    d->src = xcalloc(d->nsrc, sizeof *d->src);
    d->weight = xmalloc(d->nsrc * sizeof *d->weight), d->cum = xmalloc(d->nsrc * sizeof *d->cum);
    double sum = 0;
    for (int k = 0; k < d->nsrc; k++) sum += c->dataset[k].weight;
    for (int k = 0; k < d->nsrc; k++) {
        const char *path = c->dataset[k].path;
        if (!path_exists(path)) die("%s: dataset[%d].path: %s: not found", c->file, k, path);
        dataset_open(&d->src[k], path, d->S, vocab, rng_u64(c->seed, MIX_STREAM + 1, (uint64_t)k));
        d->src[k].source = true;
        d->weight[k] = c->dataset[k].weight;
        d->cum[k] = (k ? d->cum[k - 1] : 0) + c->dataset[k].weight / sum;
        d->nfiles += d->src[k].nfiles, d->total += d->src[k].total;
    }
    d->cum[d->nsrc - 1] = 1;
    d->files = xmalloc(d->nfiles * sizeof *d->files);
    for (int k = 0, i = 0; k < d->nsrc; i += d->src[k++].nfiles)
        memcpy(d->files + i, d->src[k].files, d->src[k].nfiles * sizeof *d->files);
    d->nblocks = 1, d->drawn = xcalloc(d->nsrc, sizeof *d->drawn), d->now = xcalloc(d->nsrc, sizeof *d->now);
}

void dataset_close(Dataset *d) {
    for (int k = 0; k < d->nsrc; k++) dataset_close(&d->src[k]);
    for (int i = 0; !d->nsrc && i < d->nfiles; i++) {
        if (d->files[i].map) munmap(d->files[i].map, d->files[i].size);
        free(d->files[i].path);
    }
    free(d->path), free(d->files), free(d->first), free(d->perm);
    free(d->src), free(d->weight), free(d->cum), free(d->drawn), free(d->now);
    memset(d, 0, sizeof *d);
}

// The source of mixture sample i: the first k whose cumulative share exceeds a uniform draw of (seed, i).
static int mix_source(const Dataset *d, int64_t i) {
    double u = rng_uniform(d->seed, MIX_STREAM, (uint64_t)i);
    int k = 0;
    while (k < d->nsrc - 1 && u >= d->cum[k]) k++;
    return k;
}

// The draws of source k among mixture samples [0, index): from the cursor when index is at or after it in its
// block, else from the counts kept at index's block start (filled forward from the last one kept).
static int64_t mix_position(Dataset *d, int64_t index, int k) {
    int64_t b = index / MIX_BLOCK, n = d->nsrc;
    if (d->nblocks <= b) {
        d->drawn = xrealloc(d->drawn, (b + 1) * n * sizeof *d->drawn);
        for (; d->nblocks <= b; d->nblocks++) {
            int64_t *row = d->drawn + d->nblocks * n;
            memcpy(row, row - n, n * sizeof *row);
            for (int64_t i = (d->nblocks - 1) * MIX_BLOCK; i < d->nblocks * MIX_BLOCK; i++) row[mix_source(d, i)]++;
        }
    }
    if (d->at > index || d->at < b * MIX_BLOCK)
        d->at = b * MIX_BLOCK, memcpy(d->now, d->drawn + b * n, n * sizeof *d->now);
    for (; d->at < index; d->at++) d->now[mix_source(d, d->at)]++;
    return d->now[k];
}

// Fisher–Yates with a generator seeded by (seed, epoch).
static void dataset_permute(Dataset *d, int64_t epoch) {
    Rng r = rng_seeded(d->seed, 0xda7a0000ULL + (uint64_t)epoch);
    for (int64_t i = 0; i < d->total; i++) d->perm[i] = i;
    for (int64_t i = d->total - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1), t = d->perm[i];
        d->perm[i] = d->perm[j], d->perm[j] = t;
    }
    if (epoch > 0 && d->source)
        printf("data: %s: epoch %lld begins (%lld samples, fresh permutation)\n", d->path, (long long)epoch,
               (long long)d->total);
    else if (epoch > 0)
        printf("data: epoch %lld begins (%lld samples, fresh permutation)\n", (long long)epoch, (long long)d->total);
    d->epoch = epoch;
}

static uint64_t end_at(const TokenFile *f, int64_t i) {
    uint64_t e;
    memcpy(&e, (const uint8_t *)f->ends + 8 * i, sizeof e);
    return e;
}

// docpos[i] of tokens [start, start + S) of f: the distance to the later of the sample's start and the start of the
// token's document (the last end at or before it).
static void doc_positions(const TokenFile *f, int64_t start, int S, int32_t *docpos) {
    int64_t lo = 0, hi = f->nends; // the first end above start: ends[lo] > start (lo = nends: none)
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (end_at(f, mid) > (uint64_t)start) hi = mid;
        else lo = mid + 1;
    }
    int64_t begin = start, next = lo < f->nends ? (int64_t)end_at(f, lo) : INT64_MAX;
    for (int i = 0; i < S; i++) {
        int64_t t = start + i;
        if (t == next) begin = t, lo++, next = lo < f->nends ? (int64_t)end_at(f, lo) : INT64_MAX;
        docpos[i] = (int32_t)(t - begin);
    }
}

void dataset_sample(Dataset *d, int64_t index, int32_t *tokens, int32_t *labels) {
    dataset_sample_docs(d, index, tokens, labels, NULL);
}

void dataset_sample_docs(Dataset *d, int64_t index, int32_t *tokens, int32_t *labels, int32_t *docpos) {
    if (d->nsrc) {
        int k = mix_source(d, index);
        dataset_sample_docs(&d->src[k], mix_position(d, index, k), tokens, labels, docpos);
        return;
    }
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
        uint64_t t = token_at_raw(f, start + i); // below vocab: checked when the file was opened
        if (i < d->S) tokens[i] = (int32_t)t;
        if (i > 0) labels[i - 1] = f->mask && !f->mask[start + i] ? -100 : (int32_t)t;
    }
    if (docpos) doc_positions(f, start, d->S, docpos);
}

void dataset_zigzag(int32_t *x, int B, int S, int cp, int r) {
    if (cp == 1) return;
    int blk = S / (2 * cp);
    CHECK(blk * 2 * cp == S && r >= 0 && r < cp);
    // Moving forward only (sequence b lands at b·2·blk ≤ b·S), so nothing is read after it was overwritten.
    for (int b = 0; b < B; b++) {
        memmove(x + (size_t)b * 2 * blk, x + (size_t)b * S + (size_t)r * blk, blk * sizeof *x);
        memmove(x + (size_t)b * 2 * blk + blk, x + (size_t)b * S + (size_t)(2 * cp - 1 - r) * blk, blk * sizeof *x);
    }
}

// ---- the data recipe ----

static void hex16(char out[17], uint64_t h) { snprintf(out, 17, "%016llx", (unsigned long long)h); }

static uint64_t token_file_fingerprint(const TokenFile *f) {
    enum { BLOCKS = 16, BLOCK = 4096 };
    uint64_t h = rng_mix(f->size);
    for (int i = 0; f->size && i < BLOCKS; i++) {
        size_t len = f->size < BLOCK ? f->size : BLOCK, at = (f->size - len) / (BLOCKS - 1) * i;
        h = rng_mix(h ^ hash64((const char *)f->map + at, len));
    }
    return h;
}

json_t *dataset_recipe(const Dataset *d) {
    json_t *sources = json_array();
    uint64_t h = rng_mix(d->nsrc ? d->nsrc : 1);
    char hex[17];
    for (int k = 0; k < (d->nsrc ? d->nsrc : 1); k++) {
        const Dataset *s = d->nsrc ? &d->src[k] : d;
        double share = d->nsrc ? d->cum[k] - (k ? d->cum[k - 1] : 0) : 1;
        uint64_t bits;
        memcpy(&bits, &share, sizeof bits);
        h = rng_mix(h ^ bits);
        json_t *files = json_array();
        for (int i = 0; i < s->nfiles; i++) {
            uint64_t fp = token_file_fingerprint(&s->files[i]);
            h = rng_mix(rng_mix(h ^ s->files[i].size) ^ fp);
            hex16(hex, fp);
            json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", s->files[i].path, "bytes",
                                                   (json_int_t)s->files[i].size, "fingerprint", hex));
        }
        json_array_append_new(sources, json_pack("{s:s, s:f, s:o}", "path", s->path, "weight",
                                                 d->nsrc ? d->weight[k] : 1.0, "files", files));
    }
    hex16(hex, h);
    return json_pack("{s:o, s:s}", "sources", sources, "fingerprint", hex);
}

// Prints every value of recipe a that differs in b, at its place under `data.` (paths aside: moved data is the
// same data); the first such place is kept in first.
static void recipe_diff(char *first, size_t cap, const char *at, const json_t *a, const json_t *b, const char *where) {
    char sub[160];
    const char *key;
    json_t *v;
    if (json_is_object(a) && json_is_object(b)) {
        json_object_foreach((json_t *)a, key, v) {
            if (!strcmp(key, "path") || (!*at && !strcmp(key, "fingerprint"))) continue; // the whole's: see below
            snprintf(sub, sizeof sub, "%s%s%s", at, *at ? "." : "", key);
            recipe_diff(first, cap, sub, v, json_object_get(b, key), where);
        }
    } else if (json_is_array(a) && json_is_array(b)) {
        for (size_t i = 0; i < json_array_size(a) || i < json_array_size(b); i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", at, i);
            recipe_diff(first, cap, sub, json_array_get(a, i), json_array_get(b, i), where);
        }
    } else if (!json_equal((json_t *)a, (json_t *)b)) {
        char *ta = a ? json_text(a, 0, false) : xstrdup("none"), *tb = b ? json_text(b, 0, false) : xstrdup("none");
        printf("resume: data.%s changed: %s -> %s (%s)\n", at, ta, tb, where);
        free(ta), free(tb);
        if (!first[0]) snprintf(first, cap, "data.%s", at);
    }
}

void dataset_check_recipe(const Dataset *d, const json_t *saved, const char *where, bool allow) {
    if (!json_is_object(saved)) return; // written before checkpoints recorded it
    json_t *now = dataset_recipe(d);
    char first[160] = "";
    const json_t *fa = json_object_get(saved, "fingerprint"), *fb = json_object_get(now, "fingerprint");
    if (!json_equal((json_t *)fa, (json_t *)fb)) {
        recipe_diff(first, sizeof first, "", saved, now, where);
        if (!first[0]) recipe_diff(first, sizeof first, "fingerprint", fa, fb, where);
    }
    json_decref(now);
    if (first[0] && !allow)
        die("%s: resuming with %s changed would change the data of the run; pass --allow-config-change to accept it",
            where, first);
}
