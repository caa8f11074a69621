// gpu_util.c — the helpers declared in gpu_test.h.
#include "gpu_test.h"

static Arena dev_arena;
static double worst[2];
static char worst_name[2][64];
static int cur_mode;

void gpu_mode(DType dt) { cur_mode = dt == DT_BF16; }

void gpu_begin(void) {
    if (getenv("PITH_TEST_GPU") == NULL)
        test_fail(__FILE__, __LINE__, "run the GPU suite through `make test-gpu` (PITH_TEST_GPU=1)");
    if (!ops_cuda_available()) test_fail(__FILE__, __LINE__, "no usable GPU (or a build without CUDA)");
    if (!dev_arena.cap) dev_arena = arena_create("gpu test", DEV_CUDA, (size_t)512 << 20);
    arena_reset(&dev_arena, 0);
    worst[0] = worst[1] = 0;
    worst_name[0][0] = worst_name[1][0] = 0;
    cur_mode = 0;
}

void record_err(double err, const char *name) {
    int m = cur_mode;
    if (err >= worst[m]) worst[m] = err, snprintf(worst_name[m], sizeof worst_name[m], "%s", name);
}

void gpu_report(void) {
    printf("     worst rel err: fp32 %.2e (%s) | bf16 %.2e (%s)\n", worst[0], worst_name[0][0] ? worst_name[0] : "-",
           worst[1], worst_name[1][0] ? worst_name[1] : "-");
}

Tensor gpu_tensor(DType dt, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    return arena_tensor(&dev_arena, dt, nd, n0, n1, n2, n3);
}
size_t gpu_mark(void) { return arena_mark(&dev_arena); }
void gpu_release(size_t mark) { arena_reset(&dev_arena, mark); }

void round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) continue;
        u += 0x7fffu + ((u >> 16) & 1);
        u &= 0xffff0000u;
        memcpy(&x[i], &u, 4);
    }
}

Pair pair_from(DType dt, const float *h, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    Pair p;
    p.c = tensor_make(NULL, DT_F32, DEV_CPU, nd, n0, n1, n2, n3);
    int64_t n = tensor_numel(p.c);
    p.c.p = xmalloc((n ? n : 1) * sizeof(float));
    memcpy(p.c.p, h, n * sizeof(float));
    if (dt == DT_BF16) round_bf16(p.c.p, n);
    p.d = gpu_tensor(dt, nd, n0, n1, n2, n3);
    op_copy(p.d, p.c);
    return p;
}

Pair pair_rand(DType dt, float scale, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    int64_t n = tensor_numel(tensor_make(NULL, DT_F32, DEV_CPU, nd, n0, n1, n2, n3));
    float *h = xmalloc((n ? n : 1) * sizeof(float));
    fill_normal(h, n, scale);
    Pair p = pair_from(dt, h, nd, n0, n1, n2, n3);
    free(h);
    return p;
}

Pair pair_nan(DType dt, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    int64_t n = tensor_numel(tensor_make(NULL, DT_F32, DEV_CPU, nd, n0, n1, n2, n3));
    float *h = xmalloc((n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    Pair p = pair_from(dt, h, nd, n0, n1, n2, n3);
    free(h);
    return p;
}

Pair pair_i32(const int32_t *h, int64_t n) {
    Pair p;
    p.c = tensor_make(xmalloc((n ? n : 1) * sizeof(int32_t)), DT_I32, DEV_CPU, 1, n, 1, 1, 1);
    memcpy(p.c.p, h, n * sizeof(int32_t));
    p.d = gpu_tensor(DT_I32, 1, n, 0, 0, 0);
    op_copy(p.d, p.c);
    return p;
}

Pair pair_offs(const int64_t *h, int64_t n) {
    if (!h) return NOPAIR;
    Pair p = {ti64_1(h, n), gpu_tensor(DT_I64, 1, n, 0, 0, 0)};
    op_copy(p.d, p.c);
    return p;
}

float *gpu_down(Tensor d) {
    Tensor h = tensor_make(NULL, DT_F32, DEV_CPU, d.nd, d.n[0], d.n[1], d.n[2], d.n[3]);
    h.p = xmalloc((tensor_numel(h) ? tensor_numel(h) : 1) * sizeof(float));
    op_copy(h, d);
    return h.p;
}

int32_t *gpu_down_i32(Tensor d) {
    Tensor h = tensor_make(NULL, DT_I32, DEV_CPU, d.nd, d.n[0], d.n[1], d.n[2], d.n[3]);
    h.p = xmalloc((tensor_numel(h) ? tensor_numel(h) : 1) * sizeof(int32_t));
    op_copy(h, d);
    return h.p;
}

double pair_err(Pair p) {
    float *g = gpu_down(p.d);
    double e = rel_err_f32(g, p.c.p, tensor_numel(p.c));
    free(g);
    return e;
}

double calc_diff(const float *a, const float *b, int64_t n) {
    double ab = 0, s = 0;
    for (int64_t i = 0; i < n; i++) ab += (double)a[i] * b[i], s += (double)a[i] * a[i] + (double)b[i] * b[i];
    double r = s > 0 ? 1 - 2 * ab / s : 0;
    return isnan(r) ? INFINITY : r;
}

void expect_close(Pair p, double tol, const char *name, const char *file, int line) {
    double e = pair_err(p);
    record_err(e, name);
    if (!(e <= tol)) test_fail(file, line, "%s (%s): relative error %.3g > %.3g", name, dtype_name(p.d.dt), e, tol);
}

void expect_lse(Pair lse, double tol) {
    float *g = gpu_down(lse.d), *c = lse.c.p;
    int64_t n = tensor_numel(lse.c);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        bool ci = isinf(c[i]) && c[i] < 0, gi = isinf(g[i]) && g[i] < 0;
        ASSERT_MSG(ci == gi, "lse[%lld]: gpu %g cpu %g", (long long)i, g[i], c[i]);
        if (!ci) num += ((double)g[i] - c[i]) * ((double)g[i] - c[i]), den += (double)c[i] * c[i];
    }
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    if (isnan(err)) err = INFINITY;
    free(g);
    record_err(err, "lse");
    ASSERT_MSG(err <= tol, "lse: relative error %.3g > %.3g", err, tol);
}
