// cpu_gemm.c — dense and grouped (per-expert, optional per-expert bias) GEMMs on the CPU through OpenBLAS cblas_sgemm.
// A linear weight is (N, K) = (out, in); y: (M, N) = x: (M, K) · wᵀ.
#include <cblas.h>

#include "ops/cpu/cpu_ops.h"

// C: (M, N) = alpha · op(A) · op(B) + beta · C, all row-major and dense.
static void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B,
                  float beta, float *C) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t i = 0; i < M * N; i++) C[i] = beta == 0 ? 0 : beta * C[i];
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, ta ? (int)M : (int)K, B, tb ? (int)K : (int)N, beta, C, (int)N);
}

void cpu_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b) {
    CPU_F32(y);
    CPU_F32(x);
    CPU_F32(w);
    int64_t M = t_rows(x), K = t_cols(x), N = t_rows(w);
    CHECK(t_cols(w) == K && t_rows(y) == M && t_cols(y) == N);
    sgemm(false, true, M, N, K, 1, F(x), F(w), 0, F(y));
    if (b.p) cpu_linear_bias_forward(y, b, NULL);
}

// Rows [r0, r1) of expert e (offs NULL: every row, e 0).
static void rows_of(const int64_t *offs, int64_t e, int64_t M, int64_t *r0, int64_t *r1) {
    *r0 = offs ? offs[e] : 0, *r1 = offs ? offs[e + 1] : M;
}

void cpu_linear_bias_forward(Tensor y, Tensor b, const int64_t *offs) {
    int64_t M = t_rows(y), N = t_cols(y), E = offs ? tensor_numel(b) / N : 1, r0, r1;
    CHECK(tensor_numel(b) == E * N);
    for (int64_t e = 0; e < E; e++) {
        rows_of(offs, e, M, &r0, &r1);
#pragma omp parallel for
        for (int64_t i = r0; i < r1; i++)
            for (int64_t j = 0; j < N; j++) F(y)[i * N + j] += F(b)[e * N + j];
    }
}

void cpu_linear_bias_backward(Tensor db, Tensor dy, const int64_t *offs, bool accumulate) {
    int64_t M = t_rows(dy), N = t_cols(dy), E = offs ? tensor_numel(db) / N : 1, r0, r1;
    CHECK(tensor_numel(db) == E * N);
    for (int64_t e = 0; e < E; e++) {
        rows_of(offs, e, M, &r0, &r1);
#pragma omp parallel for
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t i = r0; i < r1; i++) s += F(dy)[i * N + j];
            F(db)[e * N + j] = (accumulate ? F(db)[e * N + j] : 0) + (float)s;
        }
    }
}

void cpu_linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate) {
    int64_t M = t_rows(dy), N = t_cols(dy), K = t_cols(w);
    CHECK(t_rows(w) == N && t_rows(dx) == M && t_cols(dx) == K);
    sgemm(false, false, M, K, N, 1, F(dy), F(w), accumulate ? 1 : 0, F(dx));
}

void cpu_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x) {
    int64_t M = t_rows(dy), N = t_cols(dy), K = t_cols(x);
    CHECK(t_rows(x) == M && t_rows(dw) == N && t_cols(dw) == K);
    sgemm(true, false, N, K, M, 1, F(dy), F(x), 1, F(dw));
    if (db.p) cpu_linear_bias_backward(db, dy, NULL, true);
}

void cpu_grouped_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b, const int64_t *offs) {
    int64_t E = w.n[0], N = w.n[1], K = w.n[2];
    CHECK(t_cols(x) == K && t_cols(y) == N && offs[E] <= t_rows(x));
    CHECK(!b.p || tensor_numel(b) == E * N);
    for (int64_t e = 0; e < E; e++)
        sgemm(false, true, offs[e + 1] - offs[e], N, K, 1, F(x) + offs[e] * K, F(w) + e * N * K, 0, F(y) + offs[e] * N);
    if (b.p) cpu_linear_bias_forward(y, b, offs);
}

void cpu_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, const int64_t *offs) {
    int64_t E = w.n[0], N = w.n[1], K = w.n[2];
    CHECK(t_cols(dx) == K && t_cols(dy) == N);
    for (int64_t e = 0; e < E; e++)
        sgemm(false, false, offs[e + 1] - offs[e], K, N, 1, F(dy) + offs[e] * N, F(w) + e * N * K, 0,
              F(dx) + offs[e] * K);
}

void cpu_grouped_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, const int64_t *offs,
                                        bool accumulate) {
    int64_t E = dw.n[0], N = dw.n[1], K = dw.n[2];
    CHECK(t_cols(x) == K && t_cols(dy) == N);
    CHECK(!db.p || tensor_numel(db) == E * N);
    if (!accumulate) memset(dw.p, 0, (size_t)E * N * K * sizeof(float)); // written: the sums below start from zero
    for (int64_t e = 0; e < E; e++)
        sgemm(true, false, N, K, offs[e + 1] - offs[e], 1, F(dy) + offs[e] * N, F(x) + offs[e] * K, 1,
              F(dw) + e * N * K);
    if (db.p) cpu_linear_bias_backward(db, dy, offs, accumulate);
}
