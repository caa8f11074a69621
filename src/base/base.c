// base.c — errors, allocation, tensors, arenas, counter-based random numbers, file helpers.
#include "base/base.h"

#include <errno.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

int die_rank = -1;
void (*die_hook)(int status);
void (*die_cleanup)(void);
char die_context[64];
void *(*device_alloc)(size_t bytes, const char *what);
void (*device_free)(void *p);
void (*host_register)(void *p, size_t bytes);
void (*host_unregister)(void *p);

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    char during[80] = "";
    if (die_context[0]) snprintf(during, sizeof during, " (during %s)", die_context);
    if (die_rank >= 0) fprintf(stderr, "pith: error: rank %d: %s%s\n", die_rank, msg, during);
    else fprintf(stderr, "pith: error: %s%s\n", msg, during);
    fflush(stderr);
    void (*cleanup)(void) = die_cleanup;
    die_cleanup = NULL; // a cleanup that dies itself ends here
    if (cleanup) cleanup();
    if (die_hook) die_hook(1);
    exit(1);
}

void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pith: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

bool fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (cap) vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    for (char *c = err; cap && *c; c++)
        if ((unsigned char)*c < 0x20) *c = '?';
    return false;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of host memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) die("out of host memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of host memory reallocating %zu bytes", n);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

void str_printf(Str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (s->n + n + 1 > s->cap) s->cap = 2 * (s->n + n + 1), s->p = xrealloc(s->p, s->cap);
    va_start(ap, fmt);
    vsnprintf(s->p + s->n, n + 1, fmt, ap);
    va_end(ap);
    s->n += n;
}

bool str_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

// Edit distance of a and b counting a swap of two neighbours as one edit (optimal string alignment): d[i][j] over
// the prefixes a[0..i), b[0..j), three rows kept.
static int edit_distance(const char *a, const char *b) {
    int n = (int)strlen(a), m = (int)strlen(b), *d = xmalloc(3 * (m + 1) * sizeof(int));
    int *pp = d, *p = d + m + 1, *c = d + 2 * (m + 1); // rows i − 2, i − 1, i
    for (int j = 0; j <= m; j++) p[j] = j;
    for (int i = 1; i <= n; i++) {
        c[0] = i;
        for (int j = 1; j <= m; j++) {
            int best = p[j - 1] + (a[i - 1] != b[j - 1]);
            if (p[j] + 1 < best) best = p[j] + 1;
            if (c[j - 1] + 1 < best) best = c[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < best)
                best = pp[j - 2] + 1;
            c[j] = best;
        }
        int *t = pp;
        pp = p, p = c, c = t;
    }
    int r = p[m];
    free(d);
    return r;
}

const char *closest_name(const char *word, const char *const *names, int n) {
    int limit = (int)strlen(word) / 3, best = -1, bd = 0;
    if (limit < 1) limit = 1;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(word, names[i]);
        if (d <= limit && (best < 0 || d < bd)) best = i, bd = d;
    }
    return best < 0 ? NULL : names[best];
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

size_t peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;
}

// ---- tensors ----

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 8}, {"I32", 4},
              {"I64", 8}, {"U8", 1},   {"U16", 2}, {"U32", 4}, {"U64", 8}}; // in DType's order

size_t dtype_size(DType dt) { return dtypes[dt].size; }
const char *dtype_name(DType dt) { return dtypes[dt].name; }

int64_t tensor_numel(Tensor t) {
    int64_t n = 1;
    for (int i = 0; i < t.nd; i++) n *= t.n[i];
    return n;
}

size_t tensor_bytes(Tensor t) { return (size_t)tensor_numel(t) * dtype_size(t.dt); }

Tensor tensor_make(void *p, DType dt, Device dev, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    Tensor t = {p, dt, dev, nd, {n0, n1, n2, n3}};
    for (int i = nd; i < 4; i++) t.n[i] = 1;
    return t;
}

Tensor tf32_1(float *p, int64_t n0) { return tensor_make(p, DT_F32, DEV_CPU, 1, n0, 1, 1, 1); }
Tensor tf32_2(float *p, int64_t n0, int64_t n1) { return tensor_make(p, DT_F32, DEV_CPU, 2, n0, n1, 1, 1); }
Tensor ti64_1(const int64_t *p, int64_t n0) { return tensor_make((void *)p, DT_I64, DEV_CPU, 1, n0, 1, 1, 1); }

Tensor tensor_rows(Tensor t, int64_t r0, int64_t nr) {
    CHECK(r0 >= 0 && r0 + nr <= t.n[0]);
    size_t row = tensor_bytes(t) / (size_t)(t.n[0] ? t.n[0] : 1);
    Tensor v = t;
    v.p = t.p ? (char *)t.p + r0 * row : NULL;
    v.n[0] = nr;
    return v;
}

Tensor tensor_reshape2(Tensor t, int64_t n0, int64_t n1) {
    CHECK(n0 * n1 == tensor_numel(t));
    return tensor_make(t.p, t.dt, t.dev, 2, n0, n1, 1, 1);
}

// ---- arenas ----

Arena arena_counting(const char *name, Device dev) { return (Arena){NULL, 0, 0, 0, dev, name}; }

Arena arena_create(const char *name, Device dev, size_t cap) {
    Arena a = {NULL, 0, cap, 0, dev, name};
    if (dev == DEV_CPU) {
        if (cap && posix_memalign((void **)&a.base, ARENA_ALIGN, cap))
            die("out of host memory: arena %s needs %zu bytes", name, cap);
    } else {
        if (!device_alloc) die("arena %s: this build of pith has no CUDA backend", name);
        a.base = cap ? device_alloc(cap, name) : NULL;
    }
    if (!a.base) a.base = (char *)(uintptr_t)ARENA_ALIGN; // cap 0: a valid, never-dereferenced base
    return a;
}

void arena_destroy(Arena *a) {
    if (a->cap) {
        if (a->dev == DEV_CPU) free(a->base);
        else device_free(a->base);
    }
    *a = (Arena){0};
}

static void *arena_alloc(Arena *a, size_t bytes) {
    size_t off = (a->used + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    a->used = off + bytes;
    if (a->used > a->peak) a->peak = a->used;
    if (!a->base) return NULL; // counting arena
    if (a->used > a->cap)
        die("arena %s overflow: %zu bytes needed, %zu planned (a plan bug or a capacity bound exceeded)", a->name,
            a->used, a->cap);
    return a->base + off;
}

Tensor arena_tensor(Arena *a, DType dt, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    Tensor t = tensor_make(NULL, dt, a->dev, nd, n0, n1, n2, n3);
    t.p = arena_alloc(a, tensor_bytes(t));
    return t;
}

// ---- random numbers ----

static inline uint64_t rotl64(uint64_t x, int r) { return x << r | x >> (64 - r); }

uint64_t rng_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t rng_hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t i) { return rng_mix(rng_mix(rng_mix(seed) ^ stream) ^ i); }

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t i) { return (rng_u64(seed, stream, i) >> 11) * 0x1.0p-53; }

double rng_normal(uint64_t seed, uint64_t stream, uint64_t i) {
    // Box–Muller on two independent uniforms derived from (i, 0) and (i, 1).
    double u1 = ((rng_u64(seed, stream, 2 * i) >> 11) + 1) * 0x1.0p-53; // (0, 1]
    double u2 = rng_uniform(seed, stream, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

Rng rng_seeded(uint64_t seed, uint64_t stream) {
    Rng r;
    for (int i = 0; i < 4; i++) r.s[i] = rng_u64(seed, stream, (uint64_t)i);
    return r;
}

uint64_t rng_next(Rng *r) {
    uint64_t *s = r->s, out = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl64(s[3], 45);
    return out;
}

uint64_t rng_below(Rng *r, uint64_t n) {
    // Lemire's multiply-shift with rejection: unbiased.
    for (;;) {
        __uint128_t m = (__uint128_t)rng_next(r) * n;
        uint64_t lo = (uint64_t)m;
        if (lo >= n || lo >= (uint64_t)(-n) % n) return (uint64_t)(m >> 64);
    }
}

// ---- files ----

int file_open_read(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // a FIFO opens at once instead of waiting for a writer
    struct stat st;
    if (fd < 0) return -1;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd), errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode))
        die("%s: not a regular file (%s)", path,
            S_ISDIR(st.st_mode)    ? "a folder"
            : S_ISFIFO(st.st_mode) ? "a FIFO"
                                   : "a device or socket");
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

uint64_t hash64(const void *data, size_t n) {
    const uint64_t K1 = 0x9e3779b97f4a7c15ULL, K2 = 0xc2b2ae3d27d4eb4fULL;
    const unsigned char *p = data;
    uint64_t lane[4] = {K1, K2, ~K1, ~K2}, w, h;
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            memcpy(&w, p + i + 8 * k, 8);
            lane[k] = rotl64(lane[k] + w * K2, 31) * K1;
        }
    h = n * K1;
    for (int k = 0; k < 4; k++) h = rotl64(h ^ lane[k], 27) * K2 + K1;
    for (; i + 8 <= n; i += 8) memcpy(&w, p + i, 8), h = rotl64(h ^ w * K2, 29) * K1;
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdULL, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ULL, h ^= h >> 33;
    return h;
}

bool file_hash64(const char *path, uint64_t *h) {
    int fd = file_open_read(path);
    struct stat st;
    if (fd < 0) return false;
    if (fstat(fd, &st)) return close(fd), false;
    void *map = st.st_size ? mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED) return false;
    *h = hash64(map, st.st_size);
    if (map) munmap(map, st.st_size);
    return true;
}

char *file_read_all(const char *path, size_t *len) {
    int fd = file_open_read(path);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (!got) break;
        n += got;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

bool path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void path_join(char *out, size_t cap, const char *dir, const char *name) {
    if (name[0] == '/' || !dir[0]) snprintf(out, cap, "%s", name);
    else snprintf(out, cap, "%s/%s", dir, name);
}

void path_in_folder(char *out, size_t cap, const char *path, const char *name) {
    if (path_is_dir(path)) path_join(out, cap, path, name);
    else snprintf(out, cap, "%s", path);
}

void path_dirname(char *out, size_t cap, const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

void path_normalize(char *path) {
    bool abs = path[0] == '/';
    char *parts[512], *save, buf[4096];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *t = strtok_r(buf, "/", &save); t && n < 512; t = strtok_r(NULL, "/", &save)) {
        if (!strcmp(t, ".")) continue;
        if (!strcmp(t, "..") && n > 0 && strcmp(parts[n - 1], "..")) n--;
        else if (!(strcmp(t, "..") == 0 && abs && n == 0)) parts[n++] = t;
    }
    char out[4096];
    size_t o = 0;
    if (abs) out[o++] = '/';
    for (int i = 0; i < n && o < sizeof out - 1; i++)
        o += snprintf(out + o, sizeof out - o, "%s%s", i ? "/" : "", parts[i]);
    if (o == 0) out[o++] = '.';
    out[o < sizeof out ? o : sizeof out - 1] = 0;
    strcpy(path, out);
}

void mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) die("%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST) die("%s: cannot create directory: %s", buf, strerror(errno));
}

void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) fsync(fd), close(fd);
}

void file_write_atomic(const char *path, const void *data, size_t n) {
    char tmp[4200], dir[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) die("%s: cannot write: %s", tmp, strerror(errno));
    if (fwrite(data, 1, n, f) != n || fflush(f) || fsync(fileno(f)) || fclose(f))
        die("%s: write failed: %s", tmp, strerror(errno));
    if (rename(tmp, path)) die("%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    path_dirname(dir, sizeof dir, path);
    fsync_dir(dir);
}

void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st)) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) die("%s: cannot open directory: %s", path, strerror(errno));
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char child[4096];
            path_join(child, sizeof child, path, de->d_name);
            remove_tree(child);
        }
        closedir(d);
        if (rmdir(path)) die("%s: cannot remove: %s", path, strerror(errno));
    } else if (unlink(path)) die("%s: cannot remove: %s", path, strerror(errno));
}
