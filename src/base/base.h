// base.h — the bottom layer: errors, allocation, tensors, arenas, random numbers, time.
// Everything above includes this file. No other pith header is included here.
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- errors ---------------------------------------------------------------------------------------
// die(): a user error (bad config, data, file, command line). One line on stderr, exit status 1.
// CHECK(): an internal invariant; a failure is a bug in pith and names file:line.
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Set by the distributed layer (parallel/mesh.c) when there are several ranks: die() then says which rank it is
// ("pith: error: rank 3: ...") and calls die_hook (MPI_Abort) instead of exit, so every rank stops.
extern int die_rank;                 // -1: one process
extern void (*die_hook)(int status); // NULL: exit(status)
// Called once by die() after its message, before the process ends: a writer's cleanup (ckpt.c removes the
// temporary folder of a save that failed). NULL: none.
extern void (*die_cleanup)(void);
// What is running when it is not "" (the trainer sets "step 12" for the step's span): die() ends its line with
// " (during step 12)", so an error deep in an op (FP8's quantiser, an embedding id) names the step.
extern char die_context[64];
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// One line into err[0..cap) (control characters, as from names in a hostile file, become '?'); returns false, for
// `return fail(err, cap, ...)` in readers that report rather than die.
bool fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// For "did you mean": the name of names[0..n) closest to word in edit distance, when it is near enough to be a slip
// (at most a third of the word's length, at least 1); else NULL.
const char *closest_name(const char *word, const char *const *names, int n);
#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "pith: internal error at %s:%d: %s\n", __FILE__, __LINE__, #cond);                         \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

// A growing string: p[0..n), NUL-terminated once anything is put. realloc and CHECK rather than xrealloc: json.c
// links alone into a fuzz target (the cast: CUDA sources include this as C++).
typedef struct {
    char *p;
    size_t n, cap;
} Str;
static inline void str_put(Str *s, const char *p, size_t n) {
    if (s->n + n + 1 > s->cap) {
        s->cap = 2 * (s->n + n + 1), s->p = (char *)realloc(s->p, s->cap);
        CHECK(s->p);
    }
    memcpy(s->p + s->n, p, n), s->n += n, s->p[s->n] = 0;
}
void str_printf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
bool str_ends_with(const char *s, const char *suffix);
double now_seconds(void); // monotonic clock
size_t peak_rss_bytes(void);

// ---- tensors --------------------------------------------------------------------------------------
// Row-major, contiguous, no strides, no ownership: a Tensor is a typed view of memory someone else owns.
typedef enum { DT_F32, DT_BF16, DT_F16, DT_F64, DT_I32, DT_I64, DT_U8, DT_U16, DT_U32, DT_U64 } DType;
typedef enum { DEV_CPU, DEV_CUDA } Device;
typedef struct {
    void *p;
    DType dt;
    Device dev;
    int nd;
    int64_t n[4];
} Tensor;
#define NONE ((Tensor){0}) // no tensor (p NULL): an optional argument left out

size_t dtype_size(DType dt);
const char *dtype_name(DType dt);
int64_t tensor_numel(Tensor t);
size_t tensor_bytes(Tensor t);
// tensor_make(p, dt, dev, nd, n0, n1, n2, n3): unused trailing dims are ignored.
Tensor tensor_make(void *p, DType dt, Device dev, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
// Shorthands for CPU fp32 views, the common case in the reference backend and in tests.
Tensor tf32_1(float *p, int64_t n0);
Tensor tf32_2(float *p, int64_t n0, int64_t n1);
Tensor ti64_1(const int64_t *p, int64_t n0); // int64 (row offsets of the grouped ops on the CPU)
// A tensor as a matrix: rows = its first dimension, columns = everything after it.
static inline int64_t t_rows(Tensor t) { return t.n[0]; }
static inline int64_t t_cols(Tensor t) { return t.n[0] ? tensor_numel(t) / t.n[0] : 0; }
// A view of rows [r0, r0+nr) of a tensor whose first dimension is rows.
Tensor tensor_rows(Tensor t, int64_t r0, int64_t nr);
// The same memory seen with another shape of equal element count.
Tensor tensor_reshape2(Tensor t, int64_t n0, int64_t n1);

// ---- arenas ---------------------------------------------------------------------------------------
// A bump allocator over one block allocated once. With base == NULL the arena only counts: the same
// allocation sequence run on a counting arena gives the exact size the real one needs (the memory plan).
typedef struct {
    char *base;
    size_t used, cap, peak;
    Device dev;
    const char *name;
} Arena;

#define ARENA_ALIGN 256
// Device memory for DEV_CUDA arenas. The base layer cannot call the CUDA backend (it sits above base), so
// the backend installs these when the program loads (ops/cuda/cuda_common.cu; tests/fake/fake_cuda.c in the
// fake-GPU build); NULL in a build without one, and a device arena then stops with an error.
extern void *(*device_alloc)(size_t bytes, const char *what); // dies naming `what` when memory runs out
extern void (*device_free)(void *p);
// Page-locks host memory for fast copies to and from the device (cudaHostRegister); NULL without a backend.
extern void (*host_register)(void *p, size_t bytes);
extern void (*host_unregister)(void *p);
Arena arena_counting(const char *name, Device dev);
Arena arena_create(const char *name, Device dev, size_t cap); // allocates (host or device memory)
void arena_destroy(Arena *a);
Tensor arena_tensor(Arena *a, DType dt, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
static inline size_t arena_mark(const Arena *a) { return a->used; }
static inline void arena_reset(Arena *a, size_t mark) { a->used = mark; }

// ---- random numbers -------------------------------------------------------------------------------
// Counter-based: value i of stream s under seed k is a pure function of (k, s, i), so a tensor's
// initial values do not depend on how it is sharded or in which order tensors are visited.
uint64_t rng_mix(uint64_t x);                                   // splitmix64 finaliser
uint64_t rng_hash_str(const char *s);                           // FNV-1a, for per-tensor streams
uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t i);   // uniform 64 bits
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t i); // in [0, 1)
double rng_normal(uint64_t seed, uint64_t stream, uint64_t i);  // N(0, 1), Box–Muller
// A sequential generator (xoshiro256**) for permutations and synthetic data.
typedef struct {
    uint64_t s[4];
} Rng;
Rng rng_seeded(uint64_t seed, uint64_t stream);
uint64_t rng_next(Rng *r);
uint64_t rng_below(Rng *r, uint64_t n); // uniform in [0, n)

// ---- small file helpers ---------------------------------------------------------------------------
char *file_read_all(const char *path, size_t *len); // NULL if it cannot be read (errno set)
// open(path, O_RDONLY) of a regular file: -1 (errno set) if it cannot be opened; dies naming the path when it is
// a FIFO, a device or a folder (a FIFO would block the open or the read forever). Every file pith reads goes here.
int file_open_read(const char *path);
// A 64-bit checksum of n bytes (four lanes of 8-byte words, multiply and rotate, then a final avalanche): any
// change of one byte, of the length or of the order of words changes it but for chance 2⁻⁶⁴. It catches
// accidental corruption (a flipped bit, a torn or truncated copy); it is not a cryptographic hash.
uint64_t hash64(const void *data, size_t n);
// hash64 of a whole file (mapped): false (errno set) if it cannot be read.
bool file_hash64(const char *path, uint64_t *h);
bool path_is_dir(const char *path);
bool path_exists(const char *path);
void path_join(char *out, size_t cap, const char *dir, const char *name);
void path_in_folder(char *out, size_t cap, const char *path, const char *name); // path/name for a folder, else path
void path_dirname(char *out, size_t cap, const char *path);
void path_normalize(char *path); // lexically, in place: "a/./b/../c" → "a/c" (leading ".." kept)
void mkdir_p(const char *path);  // dies naming the path on failure
// Writes data to "<path>.tmp", fsyncs it and renames it over path: readers see the old file or the new
// one, never half of one. Dies naming the path on failure.
void file_write_atomic(const char *path, const void *data, size_t n);
void fsync_dir(const char *dir);    // makes a rename inside dir durable (best effort)
void remove_tree(const char *path); // rm -r; dies naming the path on failure

#define PITH_VERSION "0.1.0"
