// test_muon.c — the Muon optimizer: its ops against a float64 reference written here from the update's
// definition (docs/architecture.md, "Muon"; PyTorch is not available on the CPU machine, so the reference
// is this file's fp64 code, not a fixture).
#include "ops/ops.h"
#include "test.h"

// Newton–Schulz in fp64 exactly as defined: X = G (Gᵀ when n > m), X /= ‖X‖_F + 1e-7, `steps` times
// A = X Xᵀ, B = b·A + c·A·A, X = a·X + B·X; transposed back. g: (n, m) in, out: (n, m).
static void newton_schulz_ref(const float *g, double *out, int n, int m, int steps) {
    bool tall = n > m;
    int r = tall ? m : n, c = tall ? n : m;
    double *X = xcalloc((size_t)r * c, 8), *A = xcalloc((size_t)r * r, 8), *B = xcalloc((size_t)r * r, 8),
           *Y = xcalloc((size_t)r * c, 8);
    double ss = 0;
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++)
            X[i * c + j] = tall ? g[j * m + i] : g[i * m + j], ss += X[i * c + j] * X[i * c + j];
    for (int i = 0; i < r * c; i++) X[i] /= sqrt(ss) + 1e-7;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                double acc = 0;
                for (int k = 0; k < c; k++) acc += X[i * c + k] * X[j * c + k];
                A[i * r + j] = acc;
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += A[i * r + k] * A[k * r + j];
                B[i * r + j] = -4.7750 * A[i * r + j] + 2.0315 * acc;
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += B[i * r + k] * X[k * c + j];
                Y[i * c + j] = 3.4445 * X[i * c + j] + acc;
            }
        memcpy(X, Y, sizeof(double) * r * c);
    }
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) out[tall ? j * m + i : i * m + j] = X[i * c + j];
    free(X), free(A), free(B), free(Y);
}

TEST(op_newton_schulz_against_fp64) {
    static const int shapes[][3] = {{1, 16, 16}, {1, 8, 24}, {1, 24, 8}, {3, 12, 20},
                                    {2, 20, 12}, {4, 1, 4},  {1, 64, 48}};
    double worst = 0;
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        int B = shapes[t][0], n = shapes[t][1], m = shapes[t][2];
        float *x = xmalloc(sizeof(float) * B * n * m), *orig = xmalloc(sizeof(float) * B * n * m);
        fill_normal(orig, (int64_t)B * n * m, 0.3f);
        memcpy(x, orig, sizeof(float) * B * n * m);
        int64_t wsn = op_newton_schulz_workspace(n, m);
        float *ws = xmalloc(sizeof(float) * wsn);
        for (int64_t i = 0; i < wsn; i++) ws[i] = NAN; // the op must not read scratch it did not write
        op_newton_schulz(tensor_make(x, DT_F32, DEV_CPU, 3, B, n, m, 1),
                         tensor_make(ws, DT_F32, DEV_CPU, 1, wsn, 1, 1, 1), 5);
        double *ref = xmalloc(sizeof(double) * n * m), *got = xmalloc(sizeof(double) * n * m);
        for (int e = 0; e < B; e++) { // batched: each matrix on its own, as PithTrain's per-expert norm
            newton_schulz_ref(orig + (size_t)e * n * m, ref, n, m, 5);
            for (int i = 0; i < n * m; i++) got[i] = x[(size_t)e * n * m + i];
            double err = rel_err_f64(got, ref, n * m);
            worst = fmax(worst, err);
            ASSERT_MSG(err < 1e-5, "(%d, %d, %d) matrix %d: relative error %.3g", B, n, m, e, err);
        }
        // Newton–Schulz moves the singular values into about (0.5, 1.5): ‖X‖_F² = Σσ² is in (0.25, 2.25)·min(n, m).
        double ss = 0;
        for (int i = 0; i < n * m; i++) ss += ref[i] * ref[i];
        ASSERT_MSG(ss > 0.25 * (n < m ? n : m) && ss < 2.25 * (n < m ? n : m), "(%d, %d): ‖X‖² = %g", n, m, ss);
        free(x), free(orig), free(ws), free(ref), free(got);
    }
    printf("     7 shapes (square, wide, tall, batched, 1×4): worst relative error %.2e vs fp64\n", worst);
}

TEST(op_muon_momentum_and_apply) {
    enum { N = 1000 };
    float buf[N], g[N], p[N], o[N], b0[N], g0[N], p0[N];
    fill_normal(buf, N, 1), fill_normal(g, N, 1), fill_normal(p, N, 1), fill_normal(o, N, 1);
    memcpy(b0, buf, sizeof buf), memcpy(g0, g, sizeof g), memcpy(p0, p, sizeof p);
    const double beta = 0.95, lr = 0.02, wd = 0.1, scale = 0.2 * sqrt(48.0);
    op_muon_momentum(tf32_1(buf, N), tf32_1(g, N), (float)beta);
    op_muon_apply(tf32_1(p, N), tf32_1(o, N), (float)lr, (float)wd, (float)scale);
    for (int i = 0; i < N; i++) {
        double nb = beta * b0[i] + (1 - beta) * g0[i], u = (1 - beta) * g0[i] + beta * nb;
        double np = p0[i] * (1 - lr * wd) - lr * scale * o[i];
        ASSERT_NEAR(buf[i], nb, 1e-6 * (1 + fabs(nb)));
        ASSERT_NEAR(g[i], u, 1e-6 * (1 + fabs(u)));
        ASSERT_NEAR(p[i], np, 1e-6 * (1 + fabs(np)));
    }
}
