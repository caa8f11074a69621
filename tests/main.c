// main.c — the test runner. `build/test_pith [substring...]` runs every test whose name contains one of the
// substrings (all tests when none is given).
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <jansson.h>

#include "base/half.h"
#include "base/npy.h"
#include "base/safetensors.h"
#include "test.h"

typedef struct {
    const char *name;
    TestFn fn;
} TestCase;
static TestCase tests[1024];
static int ntests;
static jmp_buf fail_jump;
static char fail_msg[2048];
static bool skipped;

void test_register(const char *name, TestFn fn) {
    CHECK(ntests < 1024);
    tests[ntests++] = (TestCase){name, fn};
}

void test_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fail_msg, sizeof fail_msg, fmt, ap);
    va_end(ap);
    skipped = true;
    longjmp(fail_jump, 1);
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    int n = snprintf(fail_msg, sizeof fail_msg, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fail_msg + n, sizeof fail_msg - n, fmt, ap);
    va_end(ap);
    longjmp(fail_jump, 1);
}

double rel_err_f32(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    double r = sqrt(num) / (sqrt(den) + 1e-30);
    return isnan(r) ? INFINITY : r;
}

double rel_err_f64(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    double r = sqrt(num) / (sqrt(den) + 1e-300);
    return isnan(r) ? INFINITY : r;
}

static uint64_t fill_stream = 1;
void fill_normal(float *x, int64_t n, float scale) {
    uint64_t s = fill_stream++;
    for (int64_t i = 0; i < n; i++) x[i] = scale * (float)rng_normal(20261129, s, (uint64_t)i);
}

int32_t *shuffled_slots(int64_t n, uint64_t seed) {
    int32_t *slot = xmalloc((size_t)n * sizeof(int32_t) + 1);
    for (int64_t i = 0; i < n; i++) slot[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) { // Fisher–Yates
        int64_t j = (int64_t)(rng_u64(seed, (uint64_t)n, (uint64_t)i) % (uint64_t)(i + 1));
        int32_t t = slot[i];
        slot[i] = slot[j], slot[j] = t;
    }
    return slot;
}

int run_cmd(char *out, size_t cap, const char *fmt, ...) {
    char body[8192], cmd[8300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "{ %s\n} 2>&1", body); // the shell's own messages ("Killed") are captured too
    FILE *p = popen(cmd, "r");
    CHECK(p);
    size_t n = 0;
    int c;
    while ((c = fgetc(p)) != EOF)
        if (n + 1 < cap) out[n++] = (char)c;
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

double run_metric(const char *dir, int step, const char *key) {
    char out[1 << 16], pat[64];
    ASSERT_MSG(run_cmd(out, sizeof out, "grep '^{\"step\": %d,' %s/metrics.jsonl", step, dir) == 0, "%s: no step %d",
               dir, step);
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *p = strstr(out, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

const char *pith_bin(void) {
    const char *b = getenv("PITH_BIN");
    return b && b[0] ? b : "build/pith";
}

double hf_expected(const char *fixture, const char *key, int step) {
    char path[512];
    snprintf(path, sizeof path, "%s/expected.json", fixture);
    json_t *root = json_load_file(path, 0, NULL);
    CHECK(root);
    json_t *v =
        step < 0 ? json_object_get(root, key)
                 : json_object_get(json_array_get(json_object_get(json_object_get(root, "train"), "steps"), step), key);
    CHECK(json_is_number(v));
    double x = json_number_value(v);
    json_decref(root);
    return x;
}

// Every folder a test made; removed when it passes, kept (and named) when it fails.
static char tmpdirs[64][64];
static int ntmpdirs;
const char *write_bytes(const char *dir, const char *name, const void *data, size_t n) {
    static char path[1024];
    char d[1024];
    if (dir) snprintf(path, sizeof path, "%s/%s", dir, name);
    else snprintf(path, sizeof path, "%s", name);
    path_dirname(d, sizeof d, path);
    mkdir_p(d);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, n, f) == n && fclose(f) == 0);
    return path;
}
const char *write_text(const char *dir, const char *name, const char *text) {
    return write_bytes(dir, name, text, strlen(text));
}

void token_file_mask(const char *path, int masked) {
    size_t n;
    uint8_t *b = (uint8_t *)file_read_all(path, &n);
    NpyRecord tok, ends, mask;
    char err[300];
    CHECK(b && npy_token_file_parse(b, n, &tok, &ends, &mask, err, sizeof err) && !mask.data);
    FILE *f = fopen(path, "ab");
    CHECK(f && npy_write_header(f, DT_U8, tok.n));
    for (int64_t j = 0; j < tok.n; j++) CHECK(fputc(j % 16 >= masked, f) != EOF);
    CHECK(!fclose(f));
    free(b);
}

void token_file_short_documents(const char *path, int64_t n, int vocab) {
    uint64_t *ends = xmalloc(n * sizeof *ends);
    int64_t nends = 0;
    for (uint64_t at = 0; at < (uint64_t)n; nends++) {
        at += 1 + rng_u64(11, 1, (uint64_t)nends) % 12;
        if (at > (uint64_t)n) at = (uint64_t)n;
        ends[nends] = at;
    }
    FILE *f = fopen(path, "wb");
    CHECK(f && npy_write_header(f, DT_U16, n));
    for (int64_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(rng_u64(11, 2, (uint64_t)i) % (uint64_t)vocab);
        CHECK(fwrite(&t, 2, 1, f) == 1);
    }
    CHECK(npy_write_header(f, DT_U64, nends) && fwrite(ends, 8, nends, f) == (size_t)nends && !fclose(f));
    free(ends);
}

float *npy_read_f32_2d(const char *path, int64_t rows, int64_t cols) {
    size_t n;
    char *b = file_read_all(path, &n), want[128];
    ASSERT_MSG(b && n >= 10 && !memcmp(b, "\x93NUMPY\x01\x00", 8), "%s: not a .npy file", path);
    size_t hlen = (uint8_t)b[8] | (size_t)(uint8_t)b[9] << 8;
    snprintf(want, sizeof want, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }", (long long)rows,
             (long long)cols);
    ASSERT_MSG(10 + hlen <= n && !strncmp(b + 10, want, strlen(want)), "%s: header is not %s", path, want);
    ASSERT_MSG(n == 10 + hlen + (size_t)(rows * cols) * 4, "%s: %zu bytes", path, n);
    float *v = xmalloc(rows * cols * 4 + 1);
    memcpy(v, b + 10 + hlen, rows * cols * 4);
    free(b);
    return v;
}

const char *test_tmpdir(void) {
    CHECK(ntmpdirs < 64);
    char *d = tmpdirs[ntmpdirs++];
    snprintf(d, sizeof tmpdirs[0], "/tmp/pith-test-%d-XXXXXX", (int)getpid()); // the pid: make clean-tests
    CHECK(mkdtemp(d));
    return d;
}

// A failed test's folders stay for a look; `make clean-tests` removes those of test processes that have ended.
const char *tiny_run(const char *extra) {
    static char d[256];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    char out[4096];
    ASSERT(run_cmd(out, sizeof out,
                   "echo '{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 2, "
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, "
                   "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, \"norm_topk_prob\": "
                   "true}' > %s/model.json && %s synth --output %s/data.bin --vocab 64 --tokens 3000",
                   d, PITH_BIN, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   "echo '{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 16, "
                   "\"micro_batch_size\": 2, \"global_batch_size\": 4, \"max_steps\": 6, \"device\": \"cpu\", "
                   "\"optimizer\": {\"lr\": 0.01}%s}' > %s/train.json",
                   extra, d) == 0);
    return d;
}

static int tmpdirs_done(bool keep) {
    for (int i = 0; i < ntmpdirs; i++) {
        if (!keep) remove_tree(tmpdirs[i]);
        else printf("     kept %s\n", tmpdirs[i]);
    }
    int n = keep ? ntmpdirs : 0;
    ntmpdirs = 0;
    return n;
}

static bool run_one(int i) {
    skipped = false;
    if (setjmp(fail_jump)) return false;
    tests[i].fn();
    return true;
}

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

// A crash names itself: the signal and the stack (binary+offset frames; addr2line -e <binary> turns an
// offset into a line), then the default action (core, exit status 128 + signal).
static void on_crash(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    fprintf(stderr, "test runner: signal %d, stack:\n", sig);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

// An OpenBLAS kernel family other than the one it picked for this CPU, which this CPU runs: `make test` runs the
// bit-identity tests again with OPENBLAS_CORETYPE set to it, so that they cannot rely on one family's rounding.
const char *openblas_get_corename(void);
static const char *other_blas_core(void) {
    const char *own = openblas_get_corename(), *avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
    for (int i = 0; i < 3; i++)
        if (!strcasecmp(own, avx512[i])) return "Haswell";
    if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
    return strcasecmp(own, "sandybridge") ? "Sandybridge" : "Nehalem";
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--other-blas-core")) {
        printf("%s\n", other_blas_core());
        return 0;
    }
    int passed = 0, failed = 0, nskipped = 0, kept = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!SANITIZED) { // (the sanitizers report crashes themselves)
        int sigs[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGABRT};
        for (int i = 0; i < 4; i++) signal(sigs[i], on_crash);
    }
    // Open MPI's session folder (/tmp/ompi.<host>.<uid>) is made by every mpirun; two suites starting jobs at once on
    // one machine can collide there ("mkdir ... File exists", orte_init fails). Each suite gets its own.
    char ompi[64];
    snprintf(ompi, sizeof ompi, "/tmp/pith-ompi-%d", (int)getpid());
    if (!mkdir(ompi, 0700) || errno == EEXIST) setenv("OMPI_MCA_orte_tmpdir_base", ompi, 0);
    for (int i = 0; i < ntests; i++) {
        bool chosen = argc == 1;
        for (int a = 1; a < argc && !chosen; a++) chosen = strstr(tests[i].name, argv[a]) != NULL;
        if (!chosen) continue;
        double t0 = now_seconds();
        bool ok = run_one(i);
        if (ok) {
            printf("PASS %-48s %7.2fs\n", tests[i].name, now_seconds() - t0);
            passed++;
        } else if (skipped) {
            printf("SKIP %-48s %s\n", tests[i].name, fail_msg);
            nskipped++;
        } else {
            printf("FAIL %-48s %s\n", tests[i].name, fail_msg);
            failed++;
        }
        kept += tmpdirs_done(!ok && !skipped);
    }
    run_cmd(fail_msg, sizeof fail_msg, "rm -rf %s", ompi);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, nskipped);
    if (kept) printf("the failed tests' folders are kept (above); `make clean-tests` removes them\n");
    return failed ? 1 : 0;
}

double grad_diff(const char *a, const char *b, const char **worst_name) {
    StSet x, y;
    st_set_open_or_die(&x, a);
    st_set_open_or_die(&y, b);
    ASSERT_MSG(x.n == y.n, "%s holds %d tensors, %s %d", a, x.n, b, y.n);
    double worst = 0;
    static char name[200];
    name[0] = 0;
    for (int i = 0; i < x.n; i++) {
        const StTensor *t = st_set_find(&y, x.t[i]->name);
        ASSERT_MSG(t && t->numel == x.t[i]->numel, "%s missing or reshaped in %s", x.t[i]->name, b);
        float *u = xmalloc(t->numel * sizeof(float) + 1), *v = xmalloc(t->numel * sizeof(float) + 1);
        st_read_f32(x.t[i], u), st_read_f32(t, v);
        double e = rel_err_f32(u, v, t->numel);
        if (e > worst) worst = e, snprintf(name, sizeof name, "%s", t->name);
        free(u), free(v);
    }
    st_set_close(&x), st_set_close(&y);
    *worst_name = name;
    return worst;
}

double grad_bf16_check(const char *b, const char *ref, const char *f, const char *f1, double k, double dense_tol,
                       int64_t *moved) {
    StSet x, y, z, w;
    st_set_open_or_die(&x, b), st_set_open_or_die(&y, ref), st_set_open_or_die(&z, f);
    if (f1) st_set_open_or_die(&w, f1);
    double worst = 0;
    *moved = 0;
    for (int i = 0; i < x.n; i++) {
        const StTensor *t = x.t[i], *u = st_set_find(&y, t->name), *v = st_set_find(&z, t->name),
                       *q = f1 ? st_set_find(&w, t->name) : NULL;
        ASSERT_MSG(u && v && u->numel == t->numel && (!f1 || q), "%s: missing in a dump", t->name);
        int64_t n = t->numel;
        float *gb = xmalloc(4 * n * sizeof(float) + 1), *gr = gb + n, *gf = gr + n, *g1 = gf + n;
        st_read_f32(t, gb), st_read_f32(u, gr), st_read_f32(v, gf);
        if (q) st_read_f32(q, g1);
        if (!strstr(t->name, ".experts.")) { // dense: fp32 gradients in both
            double e = rel_err_f32(gb, gr, n);
            ASSERT_MSG(dense_tol ? e <= dense_tol : !memcmp(gb, gr, n * sizeof(float)),
                       "%s: the dense gradient differs by %.3g", t->name, e);
        } else
            for (int64_t j = 0; j < n; j++) {
                *moved += gb[j] != gr[j];
                if (!f1) {
                    float r = bf16_to_f32(f32_to_bf16(gr[j]));
                    ASSERT_MSG(gb[j] == r, "%s[%lld]: %.9g, fp32 %.9g rounds to %.9g", t->name, (long long)j, gb[j],
                               gr[j], r);
                    continue;
                }
                double bound = k * ldexp(1 + ldexp(1, -7), -8) * (fabs(gf[j]) + fabs(g1[j]) / 2),
                       err = fabs(gb[j] - gr[j]);
                ASSERT_MSG(err <= bound,
                           "%s[%lld]: %.9g, reference %.9g (fp32 %.9g, first micro-batch %.9g): %.3g "
                           "above the bound %.3g",
                           t->name, (long long)j, gb[j], gr[j], gf[j], g1[j], err, bound);
                if (bound > 0) worst = fmax(worst, err / bound);
            }
        free(gb);
    }
    st_set_close(&x), st_set_close(&y), st_set_close(&z);
    if (f1) st_set_close(&w);
    return worst;
}

double grad_calc_diff(const char *a, const char *b, const char **worst_name, double *all) {
    StSet x, y;
    st_set_open_or_die(&x, a);
    st_set_open_or_die(&y, b);
    ASSERT_MSG(x.n == y.n, "%s holds %d tensors, %s %d", a, x.n, b, y.n);
    static char name[200];
    double worst = 0, ab = 0, aa = 0;
    for (int i = 0; i < x.n; i++) {
        const StTensor *t = st_set_find(&y, x.t[i]->name);
        ASSERT_MSG(t && t->numel == x.t[i]->numel, "%s missing or reshaped in %s", x.t[i]->name, b);
        float *u = xmalloc(t->numel * sizeof(float) + 1), *v = xmalloc(t->numel * sizeof(float) + 1);
        st_read_f32(x.t[i], u), st_read_f32(t, v);
        double tab = 0, taa = 0;
        for (int64_t j = 0; j < t->numel; j++)
            tab += (double)u[j] * v[j], taa += (double)u[j] * u[j] + (double)v[j] * v[j];
        double c = 1 - 2 * tab / taa;
        if (!(c <= worst)) worst = c, snprintf(name, sizeof name, "%s", t->name); // NaN is the worst
        ab += tab, aa += taa;
        free(u), free(v);
    }
    st_set_close(&x), st_set_close(&y);
    *worst_name = name, *all = 1 - 2 * ab / aa;
    return worst;
}
