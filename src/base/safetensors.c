// safetensors.c — strict safetensors reader (mmap, every offset checked), sharded sets, and an atomic writer.
// Format facts follow the HF reference (huggingface/safetensors): u64 LE header length ≤ 100 MB, JSON object header,
// tensors tile the data region exactly, little-endian row-major data, "__metadata__" is a string → string map.
#include "base/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/half.h"
#include "base/json.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

// rank: the order of HF's Dtype enum (increasing alignment). Writers put larger ranks first, as HF does.
static const struct {
    const char *name;
    size_t size;
    int rank;
} st_types[ST_NDTYPE] = {
    [ST_F64] = {"F64", 8, 13},        [ST_F32] = {"F32", 4, 12},        [ST_F16] = {"F16", 2, 8},
    [ST_BF16] = {"BF16", 2, 9},       [ST_I64] = {"I64", 8, 14},        [ST_I32] = {"I32", 4, 10},
    [ST_I16] = {"I16", 2, 6},         [ST_I8] = {"I8", 1, 2},           [ST_U64] = {"U64", 8, 15},
    [ST_U32] = {"U32", 4, 11},        [ST_U16] = {"U16", 2, 7},         [ST_U8] = {"U8", 1, 1},
    [ST_BOOL] = {"BOOL", 1, 0},       [ST_F8_E4M3] = {"F8_E4M3", 1, 4}, [ST_F8_E5M2] = {"F8_E5M2", 1, 3},
    [ST_F8_E8M0] = {"F8_E8M0", 1, 5},
};

const char *st_dtype_name(StDType dt) { return st_types[dt].name; }
size_t st_dtype_size(StDType dt) { return st_types[dt].size; }

static void shape_str(char *buf, size_t cap, int nd, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < nd && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

// ---- reading ----

static bool json_uint(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

// One header entry → t, checked against the data region [data, data + dsize).
static bool st_parse_tensor(StTensor *t, json_t *v, const uint8_t *data, size_t dsize, char *err, size_t cap) {
    const char *fn = t->file, *nm = t->name;
    if (!json_is_object(v))
        return fail(err, cap, "%s: tensor '%s': expected an object {dtype, shape, data_offsets}", fn, nm);
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return fail(err, cap, "%s: tensor '%s': unknown field '%s'", fn, nm, key);
    }
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) return fail(err, cap, "%s: tensor '%s': dtype missing or not a string", fn, nm);
    int k = 0;
    while (k < ST_NDTYPE && strcmp(st_types[k].name, json_string_value(dt))) k++;
    if (k == ST_NDTYPE) return fail(err, cap, "%s: tensor '%s': unknown dtype \"%s\"", fn, nm, json_string_value(dt));
    t->dt = (StDType)k;

    if (!json_is_array(shape)) return fail(err, cap, "%s: tensor '%s': shape missing or not an array", fn, nm);
    if (json_array_size(shape) > ST_MAX_DIMS)
        return fail(err, cap, "%s: tensor '%s': shape has %zu dimensions (at most %d)", fn, nm, json_array_size(shape),
                    ST_MAX_DIMS);
    t->nd = (int)json_array_size(shape);
    uint64_t numel = 1, d;
    bool overflow = false;
    for (int i = 0; i < t->nd; i++) {
        if (!json_uint(json_array_get(shape, (size_t)i), &d))
            return fail(err, cap, "%s: tensor '%s': shape[%d] is not a non-negative integer", fn, nm, i);
        t->shape[i] = (int64_t)d;
        overflow |= __builtin_mul_overflow(numel, d, &numel);
    }
    uint64_t bytes, b, e;
    overflow |= numel > INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)st_types[k].size, &bytes);
    if (overflow) return fail(err, cap, "%s: tensor '%s': shape is too large", fn, nm);
    t->numel = (int64_t)numel;
    t->bytes = (size_t)bytes;

    if (!json_is_array(off) || json_array_size(off) != 2 || !json_uint(json_array_get(off, 0), &b) ||
        !json_uint(json_array_get(off, 1), &e))
        return fail(err, cap, "%s: tensor '%s': data_offsets missing or not [begin, end] of non-negative integers", fn,
                    nm);
    if (e < b || e > dsize)
        return fail(err, cap, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data is %zu bytes)", fn, nm,
                    (unsigned long long)b, (unsigned long long)e, dsize);
    if (e - b != bytes) {
        char s[256];
        shape_str(s, sizeof s, t->nd, t->shape);
        return fail(err, cap,
                    "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu", fn, nm,
                    s, st_types[k].name, (unsigned long long)bytes, (unsigned long long)b, (unsigned long long)e,
                    (unsigned long long)(e - b));
    }
    t->data = data + b;
    return true;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}

static int cmp_offset(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    const char *xp = x->data, *yp = y->data;
    if (xp != yp) return xp < yp ? -1 : 1;
    return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

static bool st_parse(StFile *f, char *err, size_t cap) {
    const uint8_t *p = f->map;
    const char *fn = f->path;
    if (f->size < 8) return fail(err, cap, "%s: file is %zu bytes, too short for a safetensors header", fn, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > ST_MAX_HEADER)
        return fail(err, cap, "%s: header length %llu exceeds the limit of %d bytes", fn, (unsigned long long)hlen,
                    ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return fail(err, cap, "%s: header length %llu but only %zu bytes follow it (truncated file?)", fn,
                    (unsigned long long)hlen, f->size - 8);
    json_error_t je;
    f->header = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!f->header)
        return fail(err, cap, "%s: header is not valid JSON: %s (header byte %d)", fn, je.text, je.position);
    if (!json_is_object(f->header)) return fail(err, cap, "%s: header is not a JSON object", fn);

    const uint8_t *data = p + 8 + hlen;
    size_t dsize = f->size - 8 - (size_t)hlen;
    f->t = xcalloc(json_object_size(f->header), sizeof(StTensor));
    const char *key;
    json_t *v;
    json_object_foreach(f->header, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) return fail(err, cap, "%s: __metadata__ is not an object", fn);
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) return fail(err, cap, "%s: __metadata__ '%s' is not a string", fn, mk);
            }
            f->metadata = v;
            continue;
        }
        StTensor *t = &f->t[f->n++];
        t->name = key, t->file = fn;
        if (!st_parse_tensor(t, v, data, dsize, err, cap)) return false;
    }
    qsort(f->t, (size_t)f->n, sizeof(StTensor), cmp_name);
    for (int i = 1; i < f->n; i++) // jansson keys stop at an embedded "\u0000"; two may then read alike
        if (!strcmp(f->t[i].name, f->t[i - 1].name))
            return fail(err, cap, "%s: tensor '%s' appears twice", fn, f->t[i].name);

    // The tensors must tile the data region: sorted by offset, each begins where the previous ended.
    const StTensor **byoff = xmalloc((size_t)f->n * sizeof *byoff);
    for (int i = 0; i < f->n; i++) byoff[i] = &f->t[i];
    qsort(byoff, (size_t)f->n, sizeof *byoff, cmp_offset);
    size_t pos = 0;
    bool ok = true;
    for (int i = 0; i < f->n && ok; i++) {
        const StTensor *t = byoff[i];
        size_t b = (size_t)((const uint8_t *)t->data - data);
        if (b < pos)
            ok = fail(err, cap, "%s: tensor '%s': data_offsets [%zu, %zu] overlap tensor '%s' (which ends at %zu)", fn,
                      t->name, b, b + t->bytes, byoff[i - 1]->name, pos);
        else if (b > pos)
            ok = fail(err, cap,
                      "%s: tensor '%s': data_offsets [%zu, %zu] leave bytes [%zu, %zu) of the data region unused", fn,
                      t->name, b, b + t->bytes, pos, b);
        pos = b + t->bytes;
    }
    free(byoff);
    if (ok && pos != dsize)
        ok = fail(err, cap, "%s: data region is %zu bytes but the tensors cover only %zu", fn, dsize, pos);
    return ok;
}

void st_close(StFile *f) {
    if (f->mapped && f->size) munmap((void *)f->map, f->size);
    json_decref(f->header);
    free(f->t);
    free(f->path);
    memset(f, 0, sizeof *f);
}

bool st_parse_buffer(StFile *f, const void *buf, size_t len, const char *name, char *err, size_t errcap) {
    *f = (StFile){.path = xstrdup(name), .map = buf, .size = len};
    if (st_parse(f, err, errcap)) return true;
    f->map = NULL, f->size = 0;
    st_close(f);
    return false;
}

bool st_open(StFile *f, const char *path, char *err, size_t errcap) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // a FIFO opens at once (and is refused below)
    if (fd < 0) return fail(err, errcap, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, errcap, "%s: not a regular file", path);
    }
    void *map = NULL;
    if (st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fail(err, errcap, "%s: cannot map %lld bytes: %s", path, (long long)st.st_size, strerror(e));
        }
    }
    close(fd); // the mapping stays valid
    *f = (StFile){.path = xstrdup(path), .mapped = true, .map = map, .size = (size_t)st.st_size};
    if (st_parse(f, err, errcap)) return true;
    st_close(f);
    return false;
}

void st_open_or_die(StFile *f, const char *path) {
    char err[1024];
    if (!st_open(f, path, err, sizeof err)) die("%s", err);
}

const StTensor *st_find(const StFile *f, const char *name) {
    StTensor key = {.name = name};
    return f->n ? bsearch(&key, f->t, (size_t)f->n, sizeof(StTensor), cmp_name) : NULL;
}

const char *st_meta(const StFile *f, const char *key) { return json_string_value(json_object_get(f->metadata, key)); }

void st_read_f32(const StTensor *t, float *dst) {
    const uint8_t *s = t->data;
    int64_t n = t->numel;
    if (t->dt == ST_F32) {
        if (n) memcpy(dst, s, t->bytes);
    } else if (t->dt == ST_BF16 || t->dt == ST_F16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = t->dt == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    } else if (t->dt == ST_F64) {
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, s + 8 * i, 8);
            dst[i] = (float)d;
        }
    } else {
        die("%s: tensor '%s': dtype %s cannot be read as floating point", t->file, t->name, st_types[t->dt].name);
    }
}

void st_check_shape(const StTensor *t, int nd, const int64_t *shape) {
    bool ok = t->nd == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == shape[i];
    if (ok) return;
    char a[256], b[256];
    shape_str(a, sizeof a, t->nd, t->shape);
    shape_str(b, sizeof b, nd, shape);
    die("%s: tensor '%s': shape %s, expected %s", t->file, t->name, a, b);
}

// ---- sharded sets ----

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(const StTensor *const *)a)->name, (*(const StTensor *const *)b)->name);
}

static void st_set_build_table(StSet *s) {
    for (int i = 0; i < s->nfiles; i++) s->n += s->files[i].n;
    s->t = xmalloc((size_t)s->n * sizeof *s->t);
    int k = 0;
    for (int i = 0; i < s->nfiles; i++)
        for (int j = 0; j < s->files[i].n; j++) s->t[k++] = &s->files[i].t[j];
    qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_tensor_ptr);
}

// The shards of an index's weight_map wm (files of the index's folder dir) into s->files; shard[k] names file k.
// Every tensor must be in the shard the map names, and every shard tensor in the map.
static bool open_shards(StSet *s, const char *index, const char *dir, json_t *wm, const char **shard, char *err,
                        size_t cap) {
    char file[4096];
    const char *name;
    json_t *v;
    int total = 0;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v))
            return fail(err, cap, "%s: weight_map: tensor '%s': shard is not a string", index, name);
        // A shard is a file of the index's own folder: a plain name, never a path out of it.
        const char *sv = json_string_value(v);
        if (!sv[0] || strchr(sv, '/') || !strcmp(sv, ".") || !strcmp(sv, ".."))
            return fail(err, cap, "%s: weight_map: tensor '%s': shard '%s' is not a file name of this folder", index,
                        name, sv);
        int k = 0;
        while (k < s->nfiles && strcmp(shard[k], sv)) k++;
        if (k < s->nfiles) continue;
        shard[k] = sv;
        path_join(file, sizeof file, dir, sv);
        if (!path_exists(file))
            return fail(err, cap, "%s: shard '%s' (holding tensor '%s') does not exist", index, sv, name);
        if (!st_open(&s->files[s->nfiles++], file, err, cap)) return false;
    }
    json_object_foreach(wm, name, v) {
        int k = 0;
        while (strcmp(shard[k], json_string_value(v))) k++;
        if (!st_find(&s->files[k], name))
            return fail(err, cap, "%s: weight_map puts tensor '%s' in shard '%s', which has no such tensor", index,
                        name, shard[k]);
    }
    for (int k = 0; k < s->nfiles; k++) total += s->files[k].n;
    for (int k = 0; k < s->nfiles && total != (int)json_object_size(wm); k++)
        for (int i = 0; i < s->files[k].n; i++) {
            const char *nm = s->files[k].t[i].name, *w = json_string_value(json_object_get(wm, nm));
            if (!w || strcmp(w, shard[k]))
                return fail(err, cap, "%s: tensor '%s' in shard '%s' is %s", index, nm, shard[k],
                            w ? "mapped to another shard" : "missing from weight_map");
        }
    return true;
}

bool st_set_open(StSet *s, const char *path, char *err, size_t cap) {
    memset(s, 0, sizeof *s);
    char index[4096] = "", dir[4096] = "", file[4096] = "";
    if (path_is_dir(path)) {
        path_join(index, sizeof index, path, "model.safetensors.index.json");
        snprintf(dir, sizeof dir, "%s", path);
        if (!path_exists(index)) index[0] = 0, path_join(file, sizeof file, path, "model.safetensors");
    } else if (str_ends_with(path, ".json")) {
        snprintf(index, sizeof index, "%s", path);
        path_dirname(dir, sizeof dir, path);
        if (!path_exists(index)) return fail(err, cap, "%s: no such file", index);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    bool ok;
    if (!index[0]) {
        s->files = xcalloc(1, sizeof(StFile));
        ok = st_open(&s->files[0], file, err, cap);
        s->nfiles = ok;
    } else {
        json_error_t je;
        json_t *root = json_read_file(index, JSON_REJECT_DUPLICATES, &je), *wm = json_object_get(root, "weight_map");
        const char **shard = xmalloc(json_object_size(wm) * sizeof *shard + 1); // distinct shards, by first use
        s->files = xcalloc(json_object_size(wm) + 1, sizeof(StFile));
        if (!root) ok = fail(err, cap, "%s:%d:%d: invalid JSON: %s", index, je.line, je.column, je.text);
        else if (!json_is_object(wm)) ok = fail(err, cap, "%s: weight_map missing or not an object", index);
        else ok = open_shards(s, index, dir, wm, shard, err, cap);
        free(shard), json_decref(root);
    }
    if (ok) st_set_build_table(s);
    else st_set_close(s);
    return ok;
}

void st_set_open_or_die(StSet *s, const char *path) {
    char err[1024];
    if (!st_set_open(s, path, err, sizeof err)) die("%s", err);
}

const StTensor *st_set_find(const StSet *s, const char *name) {
    StTensor key = {.name = name};
    const StTensor *kp = &key, **r = s->n ? bsearch(&kp, s->t, (size_t)s->n, sizeof *s->t, cmp_tensor_ptr) : NULL;
    return r ? *r : NULL;
}

void st_set_from_writer(StSet *s, const StWriter *w, const char *name) {
    *s = (StSet){.nfiles = 1, .files = xcalloc(1, sizeof(StFile))};
    StFile *f = &s->files[0];
    f->path = xstrdup(name), f->n = w->n, f->t = xcalloc(w->n ? w->n : 1, sizeof(StTensor));
    for (int i = 0; i < w->n; i++) {
        const StEntry *e = &w->e[i];
        StTensor *t = &f->t[i];
        *t = (StTensor){.name = e->name,
                        .file = f->path,
                        .dt = e->from_f32 ? ST_F32 : e->dt,
                        .nd = e->nd,
                        .numel = 1,
                        .data = e->src};
        for (int d = 0; d < e->nd; d++) t->shape[d] = e->shape[d], t->numel *= e->shape[d];
        t->bytes = (size_t)t->numel * st_dtype_size(t->dt);
    }
    st_set_build_table(s);
}

void st_set_close(StSet *s) {
    for (int i = 0; i < s->nfiles; i++) st_close(&s->files[i]);
    free(s->files);
    free(s->t);
    memset(s, 0, sizeof *s);
}

// ---- writing ----

void st_writer_init(StWriter *w) { *w = (StWriter){0}; }

void st_writer_free(StWriter *w) {
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    json_decref(w->metadata);
    *w = (StWriter){0};
}

void st_writer_meta(StWriter *w, const char *key, const char *value) {
    if (!w->metadata) w->metadata = json_object();
    CHECK(json_object_set_new(w->metadata, key, json_string(value)) == 0);
}

static void st_writer_add(StWriter *w, const char *name, StDType dt, int nd, const int64_t *shape, const void *src,
                          bool from_f32) {
    CHECK(nd >= 0 && nd <= ST_MAX_DIMS && (int)dt >= 0 && dt < ST_NDTYPE);
    if (w->n == w->cap) w->e = xrealloc(w->e, (size_t)(w->cap = w->cap ? 2 * w->cap : 64) * sizeof(StEntry));
    StEntry *e = &w->e[w->n++];
    *e = (StEntry){.name = xstrdup(name), .dt = dt, .nd = nd, .src = src, .from_f32 = from_f32};
    for (int i = 0; i < nd; i++) {
        CHECK(shape[i] >= 0);
        e->shape[i] = shape[i];
    }
}

void st_writer_add_f32(StWriter *w, const char *name, StDType dt, int nd, const int64_t *shape, const float *src) {
    CHECK(dt == ST_F32 || dt == ST_F16 || dt == ST_BF16);
    st_writer_add(w, name, dt, nd, shape, src, true);
}

void st_writer_add_raw(StWriter *w, const char *name, StDType dt, int nd, const int64_t *shape, const void *src) {
    st_writer_add(w, name, dt, nd, shape, src, false);
}

static int64_t entry_numel(const StEntry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->nd; i++) n *= e->shape[i];
    return n;
}

static size_t entry_bytes(const StEntry *e) { return (size_t)entry_numel(e) * st_types[e->dt].size; }

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp((*(const StEntry *const *)a)->name, (*(const StEntry *const *)b)->name);
}

// HF's order: dtype (largest alignment first, so every tensor is naturally aligned), then name.
static int cmp_entry_ptr(const void *a, const void *b) {
    const StEntry *x = *(const StEntry *const *)a, *y = *(const StEntry *const *)b;
    if (x->dt != y->dt) return st_types[y->dt].rank - st_types[x->dt].rank;
    return strcmp(x->name, y->name);
}

static void xfwrite(const void *p, size_t n, FILE *out, const char *what) {
    if (n && fwrite(p, 1, n, out) != n) die("%s: write failed: %s", what, strerror(errno));
}

// Writes the n entries es[] (reordered as HF does) as one safetensors image; returns the bytes written.
static size_t st_write_entries(const StWriter *w, const StEntry **es, int n, FILE *out, const char *what) {
    qsort(es, (size_t)n, sizeof *es, cmp_name_ptr);
    for (int i = 1; i < n; i++)
        if (!strcmp(es[i]->name, es[i - 1]->name)) die("%s: tensor '%s' added twice", what, es[i]->name);
    qsort(es, (size_t)n, sizeof *es, cmp_entry_ptr);
    json_t *h = json_object();
    if (w->metadata && json_object_size(w->metadata)) json_object_set(h, "__metadata__", w->metadata);
    json_int_t off = 0;
    for (int i = 0; i < n; i++) {
        const StEntry *e = es[i];
        json_t *shape = json_array();
        for (int d = 0; d < e->nd; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        json_int_t end = off + (json_int_t)entry_bytes(e);
        json_t *te =
            json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_types[e->dt].name, "shape", shape, "data_offsets", off, end);
        if (json_object_set_new(h, e->name, te)) die("%s: tensor name '%s' is not valid UTF-8", what, e->name);
        off = end;
    }
    char *js = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    size_t hl = strlen(js), padded = (hl + 7) & ~(size_t)7;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(padded >> (8 * i));
    xfwrite(len8, 8, out, what);
    xfwrite(js, hl, out, what);
    xfwrite("        ", padded - hl, out, what);
    free(js);

    enum { CHUNK = 1 << 15 };
    uint16_t *buf = xmalloc(CHUNK * sizeof(uint16_t));
    for (int i = 0; i < n; i++) {
        const StEntry *e = es[i];
        int64_t numel = entry_numel(e);
        if (!e->from_f32 || e->dt == ST_F32) {
            xfwrite(e->src, entry_bytes(e), out, what);
            continue;
        }
        const float *src = e->src;
        for (int64_t i0 = 0; i0 < numel; i0 += CHUNK) {
            int64_t m = numel - i0 < CHUNK ? numel - i0 : CHUNK;
            for (int64_t j = 0; j < m; j++)
                buf[j] = e->dt == ST_BF16 ? f32_to_bf16(src[i0 + j]) : f32_to_f16(src[i0 + j]);
            xfwrite(buf, (size_t)m * 2, out, what);
        }
    }
    free(buf);
    return 8 + padded + (size_t)off;
}

size_t st_writer_write_stream(const StWriter *w, FILE *out, const char *what) {
    const StEntry **es = xmalloc((size_t)w->n * sizeof *es);
    for (int i = 0; i < w->n; i++) es[i] = &w->e[i];
    size_t n = st_write_entries(w, es, w->n, out, what);
    free(es);
    return n;
}

// Atomic replacement: write "<path>.tmp", fsync, rename over path, fsync the directory.
static FILE *tmp_open(const char *path, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) die("%s: cannot create: %s", tmp, strerror(errno));
    return f;
}

static void tmp_commit(FILE *f, const char *tmp, const char *path) {
    if (fflush(f) || fsync(fileno(f)) || fclose(f)) die("%s: write failed: %s", tmp, strerror(errno));
    if (rename(tmp, path)) die("%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    char dir[4096];
    path_dirname(dir, sizeof dir, path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) fsync(dfd), close(dfd);
}

void st_writer_write(const StWriter *w, const char *path) {
    char tmp[4096 + 8];
    FILE *f = tmp_open(path, tmp, sizeof tmp);
    st_writer_write_stream(w, f, tmp);
    tmp_commit(f, tmp, path);
}

int st_writer_write_sharded(const StWriter *w, const char *dir, size_t max_shard_bytes) {
    mkdir_p(dir);
    int *shard_of = xmalloc((size_t)w->n * sizeof(int) + 1), nshards = 0;
    size_t cur = 0, total = 0;
    for (int i = 0; i < w->n; i++) {
        size_t b = entry_bytes(&w->e[i]);
        if (!nshards || (cur && cur + b > max_shard_bytes)) nshards++, cur = 0;
        shard_of[i] = nshards - 1, cur += b, total += b;
    }
    char path[4096], tmp[4096 + 8], name[64];
    if (nshards <= 1) {
        path_join(path, sizeof path, dir, "model.safetensors");
        st_writer_write(w, path);
        free(shard_of);
        return 1;
    }
    const StEntry **es = xmalloc((size_t)w->n * sizeof *es);
    json_t *wm = json_object();
    for (int k = 0; k < nshards; k++) {
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        int m = 0;
        for (int i = 0; i < w->n; i++)
            if (shard_of[i] == k) es[m++] = &w->e[i], json_object_set_new(wm, w->e[i].name, json_string(name));
        path_join(path, sizeof path, dir, name);
        FILE *f = tmp_open(path, tmp, sizeof tmp);
        st_write_entries(w, es, m, f, tmp);
        tmp_commit(f, tmp, path);
    }
    json_t *index = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    FILE *f = tmp_open(path, tmp, sizeof tmp);
    if (json_dumpf(index, f, JSON_INDENT(2) | JSON_SORT_KEYS) || fputc('\n', f) == EOF)
        die("%s: write failed: %s", tmp, strerror(errno));
    tmp_commit(f, tmp, path);
    json_decref(index);
    free(es);
    free(shard_of);
    return nshards;
}
