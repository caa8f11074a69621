// cpu_gemm.c — dense and grouped (per-expert, optional per-expert bias) GEMMs on the CPU through OpenBLAS cblas_sgemm.
// A linear weight is (N, K) = (out, in); y: (M, N) = x: (M, K) · wᵀ.
//
// Results do not depend on the thread count: OpenBLAS runs single-threaded (its threaded driver blocks K otherwise
// than its serial one, so 1 and 2 threads round differently) and the parallelism is ours, over tiles of TILE output
// columns whose boundaries follow from the shape alone. Each tile is one serial OpenBLAS call made the same way
// whatever the number of threads; no tile splits the reduction dimension.
#include <cblas.h>
#include <pthread.h>

#include "ops/cpu/cpu_ops.h"

void openblas_set_num_threads(int n); // OpenBLAS's own, not in every cblas.h

enum { TILE = 128 };

// One C: (M, N) = alpha · op(A) · op(B) + beta · C, row-major with leading dimensions lda, ldb, ldc.
typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
} Gemm;

static void serial_blas(void) { openblas_set_num_threads(1); }

// Runs g[0..n) as column tiles (tile j of g covers C's columns [j·TILE, (j+1)·TILE)), spread over the threads.
static void gemm_run(const Gemm *g, int64_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, serial_blas);
    int64_t *first = xmalloc((n + 1) * sizeof(int64_t)), flops = 0; // first[i]: g[i]'s first tile in the joint list
    first[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        bool empty = g[i].M == 0 || g[i].N == 0;
        first[i + 1] = first[i] + (empty ? 0 : (g[i].N + TILE - 1) / TILE);
        flops += g[i].M * g[i].N * g[i].K;
    }
#pragma omp parallel for schedule(dynamic) if (flops > (1 << 20))
    for (int64_t j = 0; j < first[n]; j++) {
        int64_t i = 0;
        while (first[i + 1] <= j) i++;
        const Gemm *q = &g[i];
        int64_t c0 = (j - first[i]) * TILE, nc = q->N - c0 < TILE ? q->N - c0 : TILE;
        const float *B = q->B + (q->tb ? c0 * q->ldb : c0); // op(B)'s columns c0.. are B's rows (tb) or columns
        float *C = q->C + c0;
        if (q->K == 0) {
            for (int64_t r = 0; r < q->M; r++)
                for (int64_t c = 0; c < nc; c++) C[r * q->ldc + c] = q->beta == 0 ? 0 : q->beta * C[r * q->ldc + c];
            continue;
        }
        cblas_sgemm(CblasRowMajor, q->ta ? CblasTrans : CblasNoTrans, q->tb ? CblasTrans : CblasNoTrans, (int)q->M,
                    (int)nc, (int)q->K, q->alpha, q->A, (int)q->lda, B, (int)q->ldb, q->beta, C, (int)q->ldc);
    }
    free(first);
}

// C: (M, N) = alpha · op(A) · op(B) + beta · C, all dense.
static Gemm dense(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B,
                  float beta, float *C) {
    return (Gemm){ta, tb, M, N, K, ta ? M : K, tb ? K : N, N, alpha, beta, A, B, C};
}

void cpu_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b) {
    CPU_F32(y);
    CPU_F32(x);
    CPU_F32(w);
    int64_t M = t_rows(x), K = t_cols(x), N = t_rows(w);
    CHECK(t_cols(w) == K && t_rows(y) == M && t_cols(y) == N);
    gemm_run((Gemm[]){dense(false, true, M, N, K, 1, F(x), F(w), 0, F(y))}, 1);
    if (b.p) cpu_linear_bias_forward(y, b, (Tensor){0});
}

void cpu_linear_bias_forward(Tensor y, Tensor b, Tensor offs_t) {
    int64_t N = t_cols(y), E = offs_t.p ? tensor_numel(b) / N : 1, all[2] = {0, t_rows(y)}; // dense: one group
    CHECK(tensor_numel(b) == E * N);
    const int64_t *offs = offs_t.p ? cpu_offs(offs_t, E) : all;
    for (int64_t e = 0; e < E; e++)
#pragma omp parallel for
        for (int64_t i = offs[e]; i < offs[e + 1]; i++)
            for (int64_t j = 0; j < N; j++) F(y)[i * N + j] += F(b)[e * N + j];
}

void cpu_linear_bias_backward(Tensor db, Tensor dy, Tensor offs_t, bool accumulate) {
    int64_t N = t_cols(dy), E = offs_t.p ? tensor_numel(db) / N : 1, all[2] = {0, t_rows(dy)};
    CHECK(tensor_numel(db) == E * N);
    const int64_t *offs = offs_t.p ? cpu_offs(offs_t, E) : all;
    for (int64_t e = 0; e < E; e++)
#pragma omp parallel for
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t i = offs[e]; i < offs[e + 1]; i++) s += F(dy)[i * N + j];
            st_fb(db, e * N + j, (accumulate ? ld_fb(db, e * N + j) : 0) + (float)s);
        }
}

void cpu_linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate) {
    int64_t M = t_rows(dy), N = t_cols(dy), K = t_cols(w);
    CHECK(t_rows(w) == N && t_rows(dx) == M && t_cols(dx) == K);
    gemm_run((Gemm[]){dense(false, false, M, K, N, 1, F(dy), F(w), accumulate ? 1 : 0, F(dx))}, 1);
}

void cpu_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, bool accumulate) {
    int64_t M = t_rows(dy), N = t_cols(dy), K = t_cols(x);
    CHECK(t_rows(x) == M && t_rows(dw) == N && t_cols(dw) == K && (accumulate || !db.p));
    gemm_run((Gemm[]){dense(true, false, N, K, M, 1, F(dy), F(x), accumulate ? 1 : 0, F(dw))}, 1);
    if (db.p) cpu_linear_bias_backward(db, dy, (Tensor){0}, true);
}

// One product per expert e (its rows offs[e]..offs[e+1] of the activations), run together: kind 0 the forward
// out y_e = a x_e · b w_eᵀ, 1 the input gradient dx_e = dy_e · w_e, 2 the weight gradient dw_e += dy_eᵀ · x_e (b x).
static void experts_run(int kind, Tensor out, Tensor a, Tensor b, Tensor offs_t, int64_t E, int64_t N, int64_t K) {
    const int64_t *offs = cpu_offs(offs_t, E);
    CHECK(offs);
    Gemm *g = xmalloc(E * sizeof(Gemm));
    for (int64_t e = 0; e < E; e++) {
        int64_t M = offs[e + 1] - offs[e];
        const float *A = F(a) + offs[e] * (kind == 0 ? K : N), *W = F(b) + e * N * K;
        g[e] = kind == 0   ? dense(false, true, M, N, K, 1, A, W, 0, F(out) + offs[e] * N)
               : kind == 1 ? dense(false, false, M, K, N, 1, A, W, 0, F(out) + offs[e] * K)
                           : dense(true, false, N, K, M, 1, A, F(b) + offs[e] * K, 1, F(out) + e * N * K);
    }
    gemm_run(g, E);
    free(g);
}

// x's R rows gathered into a copy (rows.p; free it), or x.
static Tensor gathered(Tensor x, Tensor rows, int div, int64_t R) {
    if (!rows.p) return x;
    CHECK(tensor_numel(rows) >= R && div >= 1);
    Tensor g = tensor_make(xmalloc(R * t_cols(x) * sizeof(float) + 1), DT_F32, DEV_CPU, 2, R, t_cols(x), 1, 1);
    cpu_gather_rows(g, x, tensor_rows(rows, 0, R), div);
    return g;
}

void cpu_grouped_linear_forward(Tensor y, Tensor x, Tensor rows, int div, Tensor w, Tensor b, Tensor offs) {
    int64_t E = w.n[0], N = w.n[1], K = w.n[2];
    Tensor xg = gathered(x, rows, div, t_rows(y));
    CHECK(t_cols(x) == K && t_cols(y) == N && cpu_offs(offs, E)[E] <= t_rows(xg));
    CHECK(!b.p || tensor_numel(b) == E * N);
    experts_run(0, y, xg, w, offs, E, N, K);
    if (b.p) cpu_linear_bias_forward(y, b, offs);
    if (rows.p) free(xg.p);
}

void cpu_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, Tensor offs) {
    int64_t E = w.n[0], N = w.n[1], K = w.n[2];
    CHECK(t_cols(dx) == K && t_cols(dy) == N);
    experts_run(1, dx, dy, w, offs, E, N, K);
}

void cpu_grouped_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor xs, Tensor rows, int div, Tensor offs,
                                        bool accumulate) {
    int64_t E = dw.n[0], N = dw.n[1], K = dw.n[2];
    Tensor x = gathered(xs, rows, div, t_rows(dy));
    CHECK(t_cols(x) == K && t_cols(dy) == N);
    CHECK(!db.p || tensor_numel(db) == E * N);
    // bf16 dw: the products into an fp32 buffer, then each element old + sum in fp32, rounded once
    int64_t n = E * N * K;
    bool half = dw.dt == DT_BF16;
    Tensor sum = half ? tf32_1(xmalloc(n * sizeof(float) + 1), n) : dw;
    if (!accumulate || half) memset(sum.p, 0, n * sizeof(float)); // written: the sums below start from zero
    experts_run(2, sum, dy, x, offs, E, N, K);
    if (half) {
#pragma omp parallel for
        for (int64_t i = 0; i < n; i++) st_fb(dw, i, (accumulate ? ld_fb(dw, i) : 0) + F(sum)[i]);
        free(sum.p);
    }
    if (db.p) cpu_linear_bias_backward(db, dy, offs, accumulate);
    if (rows.p) free(x.p);
}
