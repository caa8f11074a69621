// kernel_events.c — an LD_PRELOAD library that times every GPU call of a process with CUDA events: each kernel
// launch (pith's own kernels: __cudaLaunchKernel, and cudaLaunchKernel of older toolkits), each cuBLASLt matmul,
// each cuBLAS grouped GEMM and each cuDNN graph execution is bracketed by two events recorded on its stream.
// Finished pairs are read back by a thread of its own (cudaEventQuery, no sync on the way) and summed per name; at
// exit the table (name, calls, total ms) goes to $PITH_KERNEL_EVENTS (a file), "calls<TAB>ms<TAB>name" lines.
// Two more lines: "#gpu-busy" (pairs, ms) is the union of every pair's interval on any stream — the time some
// timed call was in progress — and "#host-waits" (calls, ms of host time) counts cudaStreamSynchronize,
// cudaEventSynchronize and cudaDeviceSynchronize. cudaMemcpyAsync, cudaMemsetAsync and cudaMemset2DAsync are timed
// calls too, so a copy is busy time, not idle. With $PITH_KERNEL_EVENTS_STEP (a kernel's name, the first of each
// step: embedding_forward_kernel) each launch of it starts a window, and $PITH_KERNEL_EVENTS.windows gets one line
// per complete window, "index<TAB>length ms<TAB>busy ms": the GPU's idle time in each step of one run; and
// $PITH_KERNEL_EVENTS.gaps where that idle time sits: the gaps of windows 3–5 by the calls before and after them.
// An event pair measures from the moment its stream reaches the call to the moment the call's work is done, so
// calls on concurrent streams overlap in the sums. .agents/skills/validate-performance/pack.sh builds it:
//   gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o kernel_events.so kernel_events.c -ldl
// (no CUDA library is linked: every CUDA entry point is looked up in the process at run time).
#define _GNU_SOURCE
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_NAMES 4096
#define MAX_PENDING 16384

typedef struct {
    char name[160];
    const void *key;
    long calls;
    double ms;
} Entry;
typedef struct {
    cudaEvent_t a, b;
    int entry, ended; // ended: b is recorded (until then b may still hold a recycled event's earlier time)
} Pending;

static Entry entries[MAX_NAMES];
static int nentries;
static Pending ring[MAX_PENDING];
static int head, count; // ring[head .. head+count) are recorded, not yet read
static cudaEvent_t spare[2 * MAX_PENDING];
static int nspare;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int registered;
static cudaEvent_t ref; // recorded before the first timed call: each pair's interval is measured from it
typedef struct {
    float t[2]; // start, end (ms after ref); first, so that by_start sorts these and marks alike
    int entry;
} Span;
static Span *spans;
static long nspans, capspans;
static long host_waits;
static double host_wait_ms;
static int marker = -1; // the entry of $PITH_KERNEL_EVENTS_STEP's kernel, once launched
static float *marks;    // its launches' start times (ms after ref)
static long nmarks, capmarks;

static int device, done; // the launching thread's device; done: the table is written (the reader stops)
static __thread int depth; // > 0 inside a library call we time: its own launches are not counted again

// The next definition of a function we wrap (REAL), or the process's definition of one we call (RT), looked up once.
#define LOOKUP(where, name)                                                                                            \
    ({                                                                                                                 \
        static __typeof__(&name) p_;                                                                                   \
        if (!p_) p_ = (__typeof__(&name))dlsym(where, #name);                                                          \
        p_;                                                                                                            \
    })
#define REAL(name) LOOKUP(RTLD_NEXT, name)
#define RT(name) LOOKUP(RTLD_DEFAULT, name)
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s);

// The entry of a name (key: a kernel handle or a fixed string), made on first use.
static int entry_of(const void *key, const char *name) {
    for (int i = 0; i < nentries; i++)
        if (entries[i].key == key && (key || !strcmp(entries[i].name, name))) return i;
    if (nentries == MAX_NAMES) return MAX_NAMES - 1;
    Entry *e = &entries[nentries];
    e->key = key;
    snprintf(e->name, sizeof e->name, "%s", name);
    return nentries++;
}

// A finished pair's times (ms: its length; t: start and end after ref); false where the events give none.
static int pair_times(const Pending *p, float *ms, float t[2]) {
    *ms = -1;
    if (RT(cudaEventElapsedTime)(ms, p->a, p->b) != cudaSuccess) *ms = -1;
    return RT(cudaEventElapsedTime)(&t[0], ref, p->a) == cudaSuccess &&
           RT(cudaEventElapsedTime)(&t[1], ref, p->b) == cudaSuccess;
}

// The head pair, finished, into the sums, spans and marks (under mu); its events go back to the spares.
static void pair_record(float ms, const float t[2], int has_t) {
    Pending *p = &ring[head];
    if (ms >= 0) entries[p->entry].ms += ms, entries[p->entry].calls++;
    if (has_t) {
        if (nspans == capspans) {
            capspans = capspans ? 2 * capspans : 65536;
            spans = realloc(spans, capspans * sizeof *spans);
        }
        spans[nspans] = (Span){{t[0], t[1]}, p->entry}, nspans++;
        if (p->entry == marker) {
            if (nmarks == capmarks)
                capmarks = capmarks ? 2 * capmarks : 1024, marks = realloc(marks, capmarks * sizeof *marks);
            marks[nmarks++] = t[0];
        }
    }
    spare[nspare++] = p->a, spare[nspare++] = p->b;
    head = (head + 1) % MAX_PENDING, count--;
}

// Reads back every pair, waiting for each (under mu: at exit, and when the ring is full).
static void harvest_all(void) {
    while (count && ring[head].ended) {
        float ms, t[2];
        REAL(cudaEventSynchronize)(ring[head].b);
        int has_t = pair_times(&ring[head], &ms, t);
        pair_record(ms, t, has_t);
    }
}

static int by_start(const void *a, const void *b) {
    float x = ((const float *)a)[0], y = ((const float *)b)[0];
    return (x > y) - (x < y);
}

// spans (sorted by start) merged into their union: disjoint intervals in order, nspans of them; returns the union's
// length.
static double merge_spans(void) {
    long n = 0;
    for (long i = 0; i < nspans; i++)
        if (n && spans[i].t[0] <= spans[n - 1].t[1]) spans[n - 1].t[1] = fmaxf(spans[n - 1].t[1], spans[i].t[1]);
        else spans[n] = spans[i], n++;
    nspans = n;
    double busy = 0;
    for (long i = 0; i < n; i++) busy += spans[i].t[1] - spans[i].t[0];
    return busy;
}

// Before merge_spans (spans and marks sorted): the idle gaps of windows 3–5 (marks[2] .. marks[5]) by the pair of
// calls around each — the call whose end the gap follows and the call that ends it — per step, largest first, into
// path.gaps as "ms per step<TAB>gaps per step<TAB>before -> after" (the first 25 pairs).
static void write_gaps(const char *path) {
    enum { MAXP = 4096 };
    static struct {
        int a, b;
        double ms;
        long n;
    } pair[MAXP];
    int np = 0;
    if (nmarks < 6 || !nspans) return;
    double lo = marks[2], hi = marks[5];
    float end = spans[0].t[1];
    int last = spans[0].entry;
    for (long i = 1; i < nspans; i++) {
        if (spans[i].t[0] > end && end >= lo && spans[i].t[0] <= hi) {
            int k = 0;
            while (k < np && !(pair[k].a == last && pair[k].b == spans[i].entry)) k++;
            if (k == np && np < MAXP) pair[np].a = last, pair[np].b = spans[i].entry, pair[np].ms = 0, pair[np++].n = 0;
            if (k < np) pair[k].ms += spans[i].t[0] - end, pair[k].n++;
        }
        if (spans[i].t[1] > end) end = spans[i].t[1], last = spans[i].entry;
    }
    char name[512];
    snprintf(name, sizeof name, "%s.gaps", path);
    FILE *f = fopen(name, "w");
    if (!f) return;
    for (int r = 0; r < 25 && r < np; r++) {
        int best = r;
        for (int k = r + 1; k < np; k++)
            if (pair[k].ms > pair[best].ms) best = k;
        __typeof__(pair[0]) t = pair[r];
        pair[r] = pair[best], pair[best] = t;
        fprintf(f, "%.6f\t%.2f\t%s -> %s\n", pair[r].ms / 3, pair[r].n / 3.0, entries[pair[r].a].name,
                entries[pair[r].b].name);
    }
    fclose(f);
}

// After merge_spans: each window between consecutive marks, its length and the busy time inside it.
static void write_windows(const char *path) {
    char name[512];
    snprintf(name, sizeof name, "%s.windows", path);
    FILE *f = fopen(name, "w");
    if (!f) return;
    for (long w = 0, j = 0; w + 1 < nmarks; w++) {
        double a = marks[w], b = marks[w + 1], busy = 0;
        while (j < nspans && spans[j].t[1] <= a) j++;
        for (long i = j; i < nspans && spans[i].t[0] < b; i++)
            busy += fmin(b, spans[i].t[1]) - fmax(a, spans[i].t[0]);
        fprintf(f, "%ld\t%.6f\t%.6f\n", w + 1, b - a, busy);
    }
    fclose(f);
}

static void write_table(void) {
    pthread_mutex_lock(&mu);
    harvest_all(), done = 1;
    const char *path = getenv("PITH_KERNEL_EVENTS");
    FILE *f = path ? fopen(path, "w") : stderr;
    if (f) {
        for (int i = 0; i < nentries; i++)
            fprintf(f, "%ld\t%.6f\t%s\n", entries[i].calls, entries[i].ms, entries[i].name);
        long pairs = nspans;
        qsort(spans, nspans, sizeof *spans, by_start);
        qsort(marks, nmarks, sizeof *marks, by_start); // (a float's first member is itself)
        if (path && marker >= 0) write_gaps(path);
        fprintf(f, "%ld\t%.6f\t#gpu-busy\n%ld\t%.6f\t#host-waits\n", pairs, merge_spans(), host_waits, host_wait_ms);
        if (f != stderr) fclose(f);
        if (path && marker >= 0) write_windows(path);
    }
    pthread_mutex_unlock(&mu);
}

static cudaEvent_t event(void) {
    if (nspare) return spare[--nspare];
    cudaEvent_t e = NULL;
    RT(cudaEventCreateWithFlags)(&e, cudaEventDefault);
    return e;
}

// The reader thread: finished pairs are read back off the launching thread, and the lock is held only to look at
// the ring and to record a pair, not across the CUDA calls that read its times; so neither a launch nor the first
// call after a host wait pays for the pairs that finished meanwhile (read back on the launching thread, a step's
// backlog showed as an idle gap after each sync). harvest_all may take the head meanwhile: a pair is recorded once.
static void *reader(void *arg) {
    (void)arg;
    RT(cudaSetDevice)(device);
    for (;;) {
        pthread_mutex_lock(&mu);
        if (done) break;
        Pending p = count && ring[head].ended ? ring[head] : (Pending){0};
        pthread_mutex_unlock(&mu);
        float ms, t[2];
        if (!p.ended || RT(cudaEventQuery)(p.b) != cudaSuccess) {
            nanosleep(&(struct timespec){0, 50000}, NULL);
            continue;
        }
        int has_t = pair_times(&p, &ms, t);
        pthread_mutex_lock(&mu);
        if (!done && count && ring[head].a == p.a && ring[head].b == p.b) pair_record(ms, t, has_t); // (else taken)
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

// Records the first event of a call on stream s; returns its ring slot (or -1).
static int begin(cudaStream_t s, int entry) {
    pthread_mutex_lock(&mu);
    if (!registered) { // atexit after the CUDA runtime's: runs before it
        registered = 1, atexit(write_table);
        RT(cudaEventCreateWithFlags)(&ref, cudaEventDefault);
        RT(cudaEventRecord)(ref, s);
        pthread_t t;
        RT(cudaGetDevice)(&device);
        if (!pthread_create(&t, NULL, reader, NULL)) pthread_detach(t);
    }
    if (count == MAX_PENDING) harvest_all();
    int slot = (head + count) % MAX_PENDING;
    ring[slot] = (Pending){event(), event(), entry, 0};
    RT(cudaEventRecord)(ring[slot].a, s);
    count++;
    pthread_mutex_unlock(&mu);
    return slot;
}
static void end(int slot, cudaStream_t s) {
    pthread_mutex_lock(&mu);
    RT(cudaEventRecord)(ring[slot].b, s);
    ring[slot].ended = 1;
    pthread_mutex_unlock(&mu);
}

static int kernel_entry(const void *k) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nentries; i++)
        if (entries[i].key == k) {
            pthread_mutex_unlock(&mu);
            return i;
        }
    const char *name = NULL;
    char buf[160];
    if (RT(cudaFuncGetName)(&name, k) != cudaSuccess || !name) name = "(unnamed kernel)";
    // _Z<len><identifier>...: the identifier and its integer and bool template arguments (I Li3E Lb1E … E, shown as
    // <3,1,…>: the instances of one template apart), parameter types dropped
    if (name[0] == '_' && name[1] == 'Z') {
        char *e, *q;
        long n = strtol(name + 2, &e, 10);
        if (n > 0 && n < 100) {
            int len = snprintf(buf, sizeof buf, "%.*s", (int)n, e);
            const char *t = e + n;
            int k = 0;
            if (*t == 'I')
                for (t++; t[0] == 'L' && (t[1] == 'i' || t[1] == 'b') && len < 140; t = q + 1, k++) {
                    long v = strtol(t + 2, &q, 10);
                    if (*q != 'E') break;
                    len += snprintf(buf + len, sizeof buf - len, "%c%ld", k ? ',' : '<', v);
                }
            if (k) snprintf(buf + len, sizeof buf - len, ">");
            name = buf;
        }
    }
    int i = entry_of(k, name);
    const char *step = getenv("PITH_KERNEL_EVENTS_STEP");
    if (step && !strcmp(entries[i].name, step)) marker = i;
    pthread_mutex_unlock(&mu);
    return i;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s) {
    if (depth) return REAL(__cudaLaunchKernel)(k, g, b, args, shm, s);
    int slot = begin(s, kernel_entry(k));
    cudaError_t r = REAL(__cudaLaunchKernel)(k, g, b, args, shm, s);
    end(slot, s);
    return r;
}

cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s) {
    if (depth) return REAL(cudaLaunchKernel)(f, g, b, args, shm, s);
    int slot = begin(s, kernel_entry(f));
    cudaError_t r = REAL(cudaLaunchKernel)(f, g, b, args, shm, s);
    end(slot, s);
    return r;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsb, cudaStream_t s) {
    uint64_t rows = 0, cols = 0, ka = 0, kb = 0;
    size_t got;
    RT(cublasLtMatrixLayoutGetAttribute)(ld, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, &got);
    RT(cublasLtMatrixLayoutGetAttribute)(ld, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols, &got);
    RT(cublasLtMatrixLayoutGetAttribute)(la, CUBLASLT_MATRIX_LAYOUT_ROWS, &ka, sizeof ka, &got);
    RT(cublasLtMatrixLayoutGetAttribute)(la, CUBLASLT_MATRIX_LAYOUT_COLS, &kb, sizeof kb, &got);
    char name[160];
    snprintf(name, sizeof name, "cublasLtMatmul D %llux%llu, A %llux%llu", (unsigned long long)rows,
             (unsigned long long)cols, (unsigned long long)ka, (unsigned long long)kb);
    pthread_mutex_lock(&mu);
    int e = entry_of(NULL, name);
    pthread_mutex_unlock(&mu);
    int slot = begin(s, e);
    depth++;
    cublasStatus_t r = REAL(cublasLtMatmul)(h, d, alpha, A, la, B, lb, beta, C, lc, D, ld, algo, ws, wsb, s);
    depth--;
    end(slot, s);
    return r;
}

cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[],
                                          const int m[], const int n[], const int k[], const void *alpha,
                                          const void *const A[], cudaDataType_t at, const int lda[],
                                          const void *const B[], cudaDataType_t bt, const int ldb[], const void *beta,
                                          void *const C[], cudaDataType_t ct, const int ldc[], int groups,
                                          const int gsize[], cublasComputeType_t comp) {
    cudaStream_t s = NULL;
    RT(cublasGetStream_v2)(h, &s);
    pthread_mutex_lock(&mu);
    int e = entry_of(NULL, "cublasGemmGroupedBatchedEx");
    pthread_mutex_unlock(&mu);
    int slot = begin(s, e);
    depth++;
    cublasStatus_t r = REAL(cublasGemmGroupedBatchedEx)(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct,
                                                        ldc, groups, gsize, comp);
    depth--;
    end(slot, s);
    return r;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
    cudaStream_t s = NULL;
    RT(cudnnGetStream)(h, &s);
    pthread_mutex_lock(&mu);
    int e = entry_of(NULL, "cudnnBackendExecute (fused attention)");
    pthread_mutex_unlock(&mu);
    int slot = begin(s, e);
    depth++;
    cudnnStatus_t r = REAL(cudnnBackendExecute)(h, plan, pack);
    depth--;
    end(slot, s);
    return r;
}

// Copies and fills: timed like kernels.
#define TIMED(name, s, call)                                                                                           \
    do {                                                                                                               \
        if (depth) return call;                                                                                        \
        pthread_mutex_lock(&mu);                                                                                       \
        int e_ = entry_of(NULL, name);                                                                                 \
        pthread_mutex_unlock(&mu);                                                                                     \
        int slot_ = begin(s, e_);                                                                                      \
        cudaError_t r_ = call;                                                                                         \
        end(slot_, s);                                                                                                 \
        return r_;                                                                                                     \
    } while (0)

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    if (kind != cudaMemcpyDeviceToDevice) return REAL(cudaMemcpyAsync)(dst, src, n, kind, s);
    TIMED("cudaMemcpyAsync", s, REAL(cudaMemcpyAsync)(dst, src, n, kind, s));
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    TIMED("cudaMemsetAsync", s, REAL(cudaMemsetAsync)(p, v, n, s));
}
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int v, size_t w, size_t h, cudaStream_t s) {
    TIMED("cudaMemset2DAsync", s, REAL(cudaMemset2DAsync)(p, pitch, v, w, h, s));
}

// Host waits: counted, with the host time they take.
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
#define WAIT(call)                                                                                                     \
    do {                                                                                                               \
        double t_ = now_ms();                                                                                          \
        cudaError_t r_ = call;                                                                                         \
        pthread_mutex_lock(&mu);                                                                                       \
        host_waits++, host_wait_ms += now_ms() - t_;                                                                   \
        pthread_mutex_unlock(&mu);                                                                                     \
        return r_;                                                                                                     \
    } while (0)

cudaError_t cudaStreamSynchronize(cudaStream_t s) { WAIT(REAL(cudaStreamSynchronize)(s)); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { WAIT(REAL(cudaEventSynchronize)(e)); }
cudaError_t cudaDeviceSynchronize(void) { WAIT(REAL(cudaDeviceSynchronize)()); }
