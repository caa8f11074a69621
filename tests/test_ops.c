// test_ops.c — every CPU op: forward against a plain fp64 reference, backward against central finite
// differences of that reference (h = 1e-6 in fp64, so the reference gradient is exact to ~1e-9).
#include "base/half.h"
#include "ops/ops.h"
#include "test.h"

#include <math.h>

// A reference op: out = f(in[0..nin)). Finite differences give ∂(Σ G·out)/∂in[j].

void fd_grad(RefFn f, double **in, int j, int64_t nin_j, const double *G, int64_t nout, double *grad, const void *ctx) {
    double *out = xmalloc(nout * sizeof(double));
    for (int64_t i = 0; i < nin_j; i++) {
        double x0 = in[j][i], h = 1e-6, lp = 0, lm = 0;
        in[j][i] = x0 + h, f(in, out, ctx);
        for (int64_t o = 0; o < nout; o++) lp += G[o] * out[o];
        in[j][i] = x0 - h, f(in, out, ctx);
        for (int64_t o = 0; o < nout; o++) lm += G[o] * out[o];
        in[j][i] = x0;
        grad[i] = (lp - lm) / (2 * h);
    }
    free(out);
}

static float *rnd(int64_t n, float scale) {
    float *x = xmalloc(n * sizeof(float));
    fill_normal(x, n, scale);
    return x;
}
static double *to_f64(const float *x, int64_t n) {
    double *d = xmalloc(n * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static double rel_err_mixed(const float *a, const double *b, int64_t n) {
    double *ad = to_f64(a, n), r = rel_err_f64(ad, b, n);
    free(ad);
    return r;
}
static float *poisoned(int64_t n) {
    float *x = xmalloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

// ---- linear ----
typedef struct {
    int64_t M, K, N;
} LinCtx;
static void ref_linear(double **in, double *out, const void *c) {
    const LinCtx *p = c;
    for (int64_t i = 0; i < p->M; i++)
        for (int64_t j = 0; j < p->N; j++) {
            double s = in[2][j];
            for (int64_t k = 0; k < p->K; k++) s += in[0][i * p->K + k] * in[1][j * p->K + k];
            out[i * p->N + j] = s;
        }
}

TEST(op_linear) {
    LinCtx c = {7, 5, 6};
    float *x = rnd(c.M * c.K, 1), *w = rnd(c.N * c.K, 1), *b = rnd(c.N, 1), *y = poisoned(c.M * c.N),
          *G = rnd(c.M * c.N, 1);
    double *in[3] = {to_f64(x, c.M * c.K), to_f64(w, c.N * c.K), to_f64(b, c.N)},
           *yr = xmalloc(c.M * c.N * sizeof(double));
    ref_linear(in, yr, &c);
    op_linear_forward(tf32_2(y, c.M, c.N), tf32_2(x, c.M, c.K), tf32_2(w, c.N, c.K), tf32_1(b, c.N));
    ASSERT(rel_err_mixed(y, yr, c.M * c.N) < 1e-6);
    double *Gd = to_f64(G, c.M * c.N), *gx = xmalloc(c.M * c.K * 8), *gw = xmalloc(c.N * c.K * 8),
           *gb = xmalloc(c.N * 8);
    fd_grad(ref_linear, in, 0, c.M * c.K, Gd, c.M * c.N, gx, &c);
    fd_grad(ref_linear, in, 1, c.N * c.K, Gd, c.M * c.N, gw, &c);
    fd_grad(ref_linear, in, 2, c.N, Gd, c.M * c.N, gb, &c);
    float *dx = poisoned(c.M * c.K), *dw = xcalloc(c.N * c.K, 4), *db = xcalloc(c.N, 4);
    op_linear_backward_input(tf32_2(dx, c.M, c.K), tf32_2(G, c.M, c.N), tf32_2(w, c.N, c.K), false);
    op_linear_backward_weight(tf32_2(dw, c.N, c.K), tf32_1(db, c.N), tf32_2(G, c.M, c.N), tf32_2(x, c.M, c.K), true);
    ASSERT(rel_err_mixed(dx, gx, c.M * c.K) < 1e-6);
    ASSERT(rel_err_mixed(dw, gw, c.N * c.K) < 1e-6);
    ASSERT(rel_err_mixed(db, gb, c.N) < 1e-6);
    // accumulate: a second backward adds the same again
    op_linear_backward_input(tf32_2(dx, c.M, c.K), tf32_2(G, c.M, c.N), tf32_2(w, c.N, c.K), true);
    for (int64_t i = 0; i < c.M * c.K; i++) gx[i] *= 2;
    ASSERT(rel_err_mixed(dx, gx, c.M * c.K) < 1e-6);
    // the weight gradient written, not added, over poison
    float *dw2 = poisoned(c.N * c.K);
    op_linear_backward_weight(tf32_2(dw2, c.N, c.K), (Tensor){0}, tf32_2(G, c.M, c.N), tf32_2(x, c.M, c.K), false);
    ASSERT(rel_err_mixed(dw2, gw, c.N * c.K) < 1e-6);
    free(dw2);
}

// ---- grouped linear: 4 experts, one of them empty, with and without a per-expert bias ----
static const int64_t goffs[5] = {0, 3, 3, 7, 9};
static void ref_grouped(double **in, double *out, const void *c) { // in: x, w, b (b NULL: none)
    const LinCtx *p = c;                                           // K in, N out per expert
    for (int e = 0; e < 4; e++)
        for (int64_t i = goffs[e]; i < goffs[e + 1]; i++)
            for (int64_t j = 0; j < p->N; j++) {
                double s = in[2] ? in[2][e * p->N + j] : 0;
                for (int64_t k = 0; k < p->K; k++) s += in[0][i * p->K + k] * in[1][(e * p->N + j) * p->K + k];
                out[i * p->N + j] = s;
            }
}

static void check_grouped(bool bias) {
    LinCtx c = {9, 5, 3};
    int64_t nx = c.M * c.K, nw = 4 * c.N * c.K, ny = c.M * c.N, nb = 4 * c.N;
    float *x = rnd(nx, 1), *w = rnd(nw, 1), *b = rnd(nb, 1), *y = poisoned(ny), *G = rnd(ny, 1);
    double *in[3] = {to_f64(x, nx), to_f64(w, nw), bias ? to_f64(b, nb) : NULL}, *yr = xmalloc(ny * 8),
           *Gd = to_f64(G, ny);
    double *gx = xmalloc(nx * 8), *gw = xmalloc(nw * 8), *gb = xmalloc(nb * 8);
    Tensor W = tensor_make(w, DT_F32, DEV_CPU, 3, 4, c.N, c.K, 1), Bt = bias ? tf32_2(b, 4, c.N) : (Tensor){0};
    ref_grouped(in, yr, &c);
    op_grouped_linear_forward(tf32_2(y, c.M, c.N), tf32_2(x, c.M, c.K), NONE, 0, W, Bt, ti64_1(goffs, 5));
    ASSERT(rel_err_mixed(y, yr, ny) < 1e-6);
    fd_grad(ref_grouped, in, 0, nx, Gd, ny, gx, &c);
    fd_grad(ref_grouped, in, 1, nw, Gd, ny, gw, &c);
    if (bias) fd_grad(ref_grouped, in, 2, nb, Gd, ny, gb, &c);
    // the weight gradient written (accumulate false) over poison, then added to (accumulate true): g, then 2g
    float *dx = poisoned(nx), *dw = poisoned(nw), *db = poisoned(nb);
    op_grouped_linear_backward_input(tf32_2(dx, c.M, c.K), tf32_2(G, c.M, c.N), W, ti64_1(goffs, 5));
    ASSERT(rel_err_mixed(dx, gx, nx) < 1e-6);
    for (int pass = 0; pass < 2; pass++) {
        op_grouped_linear_backward_weight(tensor_make(dw, DT_F32, DEV_CPU, 3, 4, c.N, c.K, 1),
                                          bias ? tf32_2(db, 4, c.N) : (Tensor){0}, tf32_2(G, c.M, c.N),
                                          tf32_2(x, c.M, c.K), NONE, 0, ti64_1(goffs, 5), pass == 1);
        for (int64_t i = 0; i < nw; i++) gw[i] *= pass + 1; // 1g, then 2g
        for (int64_t j = 0; bias && j < nb; j++) gb[j] *= pass + 1;
        ASSERT(rel_err_mixed(dw, gw, nw) < 1e-6);
        for (int64_t i = c.N * c.K; i < 2 * c.N * c.K; i++) ASSERT(dw[i] == 0); // the empty expert
        if (!bias) continue;
        ASSERT(rel_err_mixed(db, gb, nb) < 1e-6);
        for (int64_t j = c.N; j < 2 * c.N; j++) ASSERT(db[j] == 0);
    }
}
TEST(op_grouped_linear) { check_grouped(false); }
TEST(op_grouped_linear_bias) { check_grouped(true); }

// The gathered x (rows: 9 of 5 tokens' 10 slots, div 2): the forward against the fp64 product on the gathered rows, and
// both products bit for bit those on a gathered copy (the same sums on the same values).
TEST(op_grouped_linear_gathered) {
    LinCtx c = {9, 5, 3};
    int32_t rows[9] = {7, 0, 9, 3, 2, 8, 1, 4, 6};
    int64_t T = 5, nx = T * c.K, ng = c.M * c.K, nw = 4 * c.N * c.K, ny = c.M * c.N;
    float *x = rnd(nx, 1), *w = rnd(nw, 1), *G = rnd(ny, 1), *xg = xmalloc(ng * 4), *y = poisoned(ny);
    float *y1 = poisoned(ny), *dw = poisoned(nw), *dw1 = poisoned(nw);
    for (int64_t i = 0; i < c.M; i++) memcpy(xg + i * c.K, x + rows[i] / 2 * c.K, c.K * 4);
    double *in[3] = {to_f64(xg, ng), to_f64(w, nw), NULL}, *yr = xmalloc(ny * 8);
    ref_grouped(in, yr, &c);
    Tensor W = tensor_make(w, DT_F32, DEV_CPU, 3, 4, c.N, c.K, 1),
           R = tensor_make(rows, DT_I32, DEV_CPU, 1, 9, 1, 1, 1), O = ti64_1(goffs, 5);
    op_grouped_linear_forward(tf32_2(y, c.M, c.N), tf32_2(x, T, c.K), R, 2, W, NONE, O);
    op_grouped_linear_forward(tf32_2(y1, c.M, c.N), tf32_2(xg, c.M, c.K), NONE, 0, W, NONE, O);
    ASSERT(rel_err_mixed(y, yr, ny) < 1e-6 && !memcmp(y, y1, ny * 4));
    Tensor DW = tensor_make(dw, DT_F32, DEV_CPU, 3, 4, c.N, c.K, 1),
           DW1 = tensor_make(dw1, DT_F32, DEV_CPU, 3, 4, c.N, c.K, 1);
    op_grouped_linear_backward_weight(DW, NONE, tf32_2(G, c.M, c.N), tf32_2(x, T, c.K), R, 2, O, false);
    op_grouped_linear_backward_weight(DW1, NONE, tf32_2(G, c.M, c.N), tf32_2(xg, c.M, c.K), NONE, 0, O, false);
    ASSERT(!memcmp(dw, dw1, nw * 4));
    free(x), free(w), free(G), free(xg), free(y), free(y1), free(dw), free(dw1), free(in[0]), free(in[1]), free(yr);
}

// ---- rmsnorm ----
typedef struct {
    int64_t R, D;
    double eps;
} NormCtx;
static void ref_rmsnorm(double **in, double *out, const void *c) {
    const NormCtx *p = c;
    for (int64_t i = 0; i < p->R; i++) {
        double ss = 0;
        for (int64_t j = 0; j < p->D; j++) ss += in[0][i * p->D + j] * in[0][i * p->D + j];
        double r = 1 / sqrt(ss / p->D + p->eps);
        for (int64_t j = 0; j < p->D; j++) out[i * p->D + j] = in[0][i * p->D + j] * r * in[1][j];
    }
}

TEST(op_rmsnorm) {
    NormCtx c = {6, 16, 1e-6};
    int64_t n = c.R * c.D;
    float *x = rnd(n, 2), *w = rnd(c.D, 1), *y = poisoned(n), *rstd = poisoned(c.R), *G = rnd(n, 1);
    double *in[2] = {to_f64(x, n), to_f64(w, c.D)}, *yr = xmalloc(n * 8), *Gd = to_f64(G, n), *gx = xmalloc(n * 8),
           *gw = xmalloc(c.D * 8);
    ref_rmsnorm(in, yr, &c);
    op_rmsnorm_forward(tf32_2(y, c.R, c.D), tf32_1(rstd, c.R), tf32_2(x, c.R, c.D), tf32_1(w, c.D), (float)c.eps, NULL);
    ASSERT(rel_err_mixed(y, yr, n) < 1e-6);
    fd_grad(ref_rmsnorm, in, 0, n, Gd, n, gx, &c);
    fd_grad(ref_rmsnorm, in, 1, c.D, Gd, n, gw, &c);
    float *dx = poisoned(n), *dw = xcalloc(c.D, 4);
    op_rmsnorm_backward(tf32_2(dx, c.R, c.D), tf32_1(dw, c.D), tf32_2(G, c.R, c.D), tf32_2(x, c.R, c.D), tf32_1(w, c.D),
                        tf32_1(rstd, c.R), false, NULL);
    ASSERT(rel_err_mixed(dx, gx, n) < 1e-5);
    ASSERT(rel_err_mixed(dw, gw, c.D) < 1e-5);
}

// ---- rope: both layouts, whole and partial, and the tables (default and both YaRN variants) ----
typedef struct {
    int64_t T, nh, d, off, half;
    RopeLayout layout;
    float *cs, *sn;
    int32_t *pos;
} RopeCtx;
static void ref_rope(double **in, double *out, const void *c) {
    const RopeCtx *p = c;
    int64_t n = p->T * p->nh * p->d;
    for (int64_t i = 0; i < n; i++) out[i] = in[0][i];
    for (int64_t t = 0; t < p->T; t++)
        for (int64_t h = 0; h < p->nh; h++)
            for (int64_t i = 0; i < p->half; i++) {
                int64_t base = (t * p->nh + h) * p->d + p->off;
                int64_t ia = base + (p->layout == ROPE_PAIRS ? 2 * i : i),
                        ib = ia + (p->layout == ROPE_PAIRS ? 1 : p->half);
                double cs = p->cs[p->pos[t] * p->half + i], sn = p->sn[p->pos[t] * p->half + i];
                out[ia] = in[0][ia] * cs - in[0][ib] * sn;
                out[ib] = in[0][ib] * cs + in[0][ia] * sn;
            }
}

static void check_rope(RopeLayout layout, int64_t d, int64_t off, int64_t rd) {
    int S = 16;
    RopeCtx c = {5, 3, d, off, rd / 2, layout, xmalloc(S * rd / 2 * 4), xmalloc(S * rd / 2 * 4), NULL};
    RopeSpec yarn = {.rd = (int)rd, .theta = 500.0, .yarn = true, .factor = 4, .orig_max_pos = 8, .truncate = true};
    // YaRN tables carry an attention factor: the backward must be the transpose, not the inverse
    op_rope_tables(tf32_2(c.cs, S, rd / 2), tf32_2(c.sn, S, rd / 2), &yarn);
    int32_t pos[5] = {0, 3, 7, 15, 1};
    c.pos = pos;
    int64_t n = c.T * c.nh * c.d;
    float *x = rnd(n, 1), *G = rnd(n, 1);
    double *in[1] = {to_f64(x, n)}, *yr = xmalloc(n * 8), *Gd = to_f64(G, n), *gx = xmalloc(n * 8);
    ref_rope(in, yr, &c);
    Tensor X = tensor_make(x, DT_F32, DEV_CPU, 3, c.T, c.nh, c.d, 1),
           P = tensor_make(pos, DT_I32, DEV_CPU, 1, 5, 1, 1, 1);
    Tensor Cs = tf32_2(c.cs, S, rd / 2), Sn = tf32_2(c.sn, S, rd / 2);
    op_rope(X, (int)off, Cs, Sn, P, layout, false);
    ASSERT(rel_err_mixed(x, yr, n) < 1e-6);
    fd_grad(ref_rope, in, 0, n, Gd, n, gx, &c);
    op_rope(tensor_make(G, DT_F32, DEV_CPU, 3, c.T, c.nh, c.d, 1), (int)off, Cs, Sn, P, layout, true);
    ASSERT(rel_err_mixed(G, gx, n) < 1e-6);
}
TEST(op_rope) { check_rope(ROPE_HALF, 8, 0, 8); }
TEST(op_rope_pairs) { check_rope(ROPE_PAIRS, 8, 0, 8); }
TEST(op_rope_partial) { check_rope(ROPE_HALF, 16, 0, 4); }       // Qwen3.5: the first quarter
TEST(op_rope_pairs_offset) { check_rope(ROPE_PAIRS, 12, 8, 4); } // MLA: the last dims of each head

// transformers' YaRN in fp64, written from its formulas (rope_tables.c's comment): inv_freq and the factor.
static double ref_yarn(const RopeSpec *r, int i, double *factor) {
    double d = r->rd, bf = r->beta_fast ? r->beta_fast : 32, bs = r->beta_slow ? r->beta_slow : 1;
    double lo = d * log(r->orig_max_pos / (bf * 2 * M_PI)) / (2 * log(r->theta));
    double hi = d * log(r->orig_max_pos / (bs * 2 * M_PI)) / (2 * log(r->theta));
    if (r->truncate) lo = floor(lo), hi = ceil(hi);
    lo = fmax(lo, 0), hi = fmin(hi, d - 1);
    if (lo == hi) hi += 0.001;
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1), extra = 1 - ramp, pf = pow(r->theta, 2 * i / d);
    double ms = r->factor <= 1 ? 1 : 0.1 * r->mscale * log(r->factor) + 1,
           ma = r->factor <= 1 ? 1 : 0.1 * r->mscale_all_dim * log(r->factor) + 1;
    *factor = r->attention_factor              ? r->attention_factor
              : r->mscale && r->mscale_all_dim ? ms / ma
                                               : 0.1 * log(r->factor) + 1;
    return 1 / (r->factor * pf) * (1 - extra) + 1 / pf * extra;
}

static void check_rope_tables(const RopeSpec *r, int P) {
    int half = r->rd / 2;
    float *cs = poisoned(P * half), *sn = poisoned(P * half);
    op_rope_tables(tf32_2(cs, P, half), tf32_2(sn, P, half), r);
    for (int p = 0; p < P; p++)
        for (int i = 0; i < half; i++) {
            double f = 1, inv = r->yarn ? ref_yarn(r, i, &f) : pow(r->theta, -2.0 * i / r->rd);
            ASSERT_NEAR(cs[p * half + i], f * cos(p * inv), 2e-5 * (1 + p * inv));
            ASSERT_NEAR(sn[p * half + i], f * sin(p * inv), 2e-5 * (1 + p * inv));
        }
    free(cs), free(sn);
}

TEST(op_rope_tables) {
    check_rope_tables(&(RopeSpec){.rd = 64, .theta = 10000}, 50);
    check_rope_tables(&(RopeSpec){.rd = 16, .theta = 1e6}, 40);
    // DeepSeek-V2 (V2's shipped rope_scaling): mscale = mscale_all_dim, so the factor is 1
    RopeSpec ds = {.rd = 64,
                   .theta = 10000,
                   .yarn = true,
                   .factor = 40,
                   .beta_fast = 32,
                   .beta_slow = 1,
                   .orig_max_pos = 4096,
                   .truncate = true,
                   .mscale = 0.707,
                   .mscale_all_dim = 0.707};
    check_rope_tables(&ds, 60);
    ds.mscale = 1, ds.mscale_all_dim = 0.5;
    check_rope_tables(&ds, 60);
    // GPT-OSS-120B: factor 32 on 4096 positions, no truncation, factor 0.1·ln 32 + 1
    RopeSpec go = {
        .rd = 64, .theta = 150000, .yarn = true, .factor = 32, .beta_fast = 32, .beta_slow = 1, .orig_max_pos = 4096};
    check_rope_tables(&go, 60);
    float c0, s0;
    op_rope_tables(tf32_2(&c0, 1, 1), tf32_2(&s0, 1, 1),
                   &(RopeSpec){.rd = 2, .theta = 150000, .yarn = true, .factor = 32, .orig_max_pos = 4096});
    ASSERT_NEAR(c0, 0.1 * log(32.0) + 1, 1e-6); // position 0: cos = the attention factor
    ASSERT(s0 == 0);
}

// ---- swiglu ----
typedef struct {
    int64_t M, I;
} SwiCtx;
static void ref_swiglu(double **in, double *out, const void *c) {
    const SwiCtx *p = c;
    for (int64_t r = 0; r < p->M; r++)
        for (int64_t i = 0; i < p->I; i++) {
            double g = in[0][r * 2 * p->I + i], u = in[0][r * 2 * p->I + p->I + i];
            out[r * p->I + i] = g / (1 + exp(-g)) * u;
        }
}

TEST(op_swiglu) {
    SwiCtx c = {5, 7};
    int64_t n = c.M * 2 * c.I, m = c.M * c.I;
    float *gu = rnd(n, 2), *act = poisoned(m), *G = rnd(m, 1), *dgu = poisoned(n);
    double *in[1] = {to_f64(gu, n)}, *yr = xmalloc(m * 8), *Gd = to_f64(G, m), *g = xmalloc(n * 8);
    ref_swiglu(in, yr, &c);
    op_swiglu_forward(tf32_2(act, c.M, c.I), tf32_2(gu, c.M, 2 * c.I), 0, 0);
    ASSERT(rel_err_mixed(act, yr, m) < 1e-6);
    fd_grad(ref_swiglu, in, 0, n, Gd, m, g, &c);
    op_swiglu_backward(tf32_2(dgu, c.M, 2 * c.I), tf32_2(G, c.M, c.I), tf32_2(gu, c.M, 2 * c.I), 0, 0);
    ASSERT(rel_err_mixed(dgu, g, n) < 1e-6);
}

// ---- attention: GQA, causal or a block against a block, windows, sinks, dqk ≠ dv ----
typedef struct {
    int64_t B, Sq, Sk, nh, nkv, dqk, dv;
    AttnArgs a;
} AttCtx;
// in: q, k, v, sinks (NULL: none); out: o (B·Sq, nh, dv) then lse (B, nh, Sq).
static void ref_attention(double **in, double *out, const void *c) {
    const AttCtx *p = c;
    int64_t grp = p->nh / p->nkv;
    double s[64];
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->nh; h++)
            for (int64_t i = 0; i < p->Sq; i++) {
                int64_t qp = p->a.q_off + i;
                double m = in[3] ? in[3][h] : -INFINITY, sum = 0;
                bool see[64];
                for (int64_t j = 0; j < p->Sk; j++) {
                    int64_t kp = p->a.k_off + j;
                    see[j] = (!p->a.causal || kp <= qp) && (!p->a.window || kp > qp - p->a.window);
                    if (!see[j]) continue;
                    double dot = 0;
                    for (int64_t x = 0; x < p->dqk; x++)
                        dot += in[0][((b * p->Sq + i) * p->nh + h) * p->dqk + x] *
                               in[1][((b * p->Sk + j) * p->nkv + h / grp) * p->dqk + x];
                    s[j] = p->a.scale * dot, m = fmax(m, s[j]);
                }
                if (in[3]) sum = exp(in[3][h] - m);
                for (int64_t j = 0; j < p->Sk; j++)
                    if (see[j]) sum += s[j] = exp(s[j] - m);
                for (int64_t x = 0; x < p->dv; x++) {
                    double o = 0;
                    for (int64_t j = 0; j < p->Sk; j++)
                        if (see[j]) o += s[j] / sum * in[2][((b * p->Sk + j) * p->nkv + h / grp) * p->dv + x];
                    out[((b * p->Sq + i) * p->nh + h) * p->dv + x] = o;
                }
                // −∞ (no key, no sink) as −1e300, so that finite differences (G = 0 there) stay finite
                out[p->B * p->Sq * p->nh * p->dv + (b * p->nh + h) * p->Sq + i] =
                    m == -INFINITY ? -1e300 : m + log(sum);
            }
}

static void check_attention(AttCtx c, bool sinks) {
    int64_t Tq = c.B * c.Sq, Tk = c.B * c.Sk, nq = Tq * c.nh * c.dqk, nk = Tk * c.nkv * c.dqk, nv = Tk * c.nkv * c.dv;
    int64_t no = Tq * c.nh * c.dv, nl = c.B * c.nh * c.Sq;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nv, 1), *sk = rnd(c.nh, 1), *o = poisoned(no), *lse = poisoned(nl);
    float *G = xcalloc(no + nl, 4);
    fill_normal(G, no, 1); // ∂/∂lse is not part of the op: G is zero there
    c.a.sinks = sinks ? tf32_1(sk, c.nh) : (Tensor){0};
    double *in[4] = {to_f64(q, nq), to_f64(k, nk), to_f64(v, nv), sinks ? to_f64(sk, c.nh) : NULL};
    double *ref = xmalloc((no + nl) * 8), *Gd = to_f64(G, no + nl);
    double *gq = xmalloc(nq * 8), *gk = xmalloc(nk * 8), *gv = xmalloc(nv * 8), *gs = xmalloc(c.nh * 8);
    ref_attention(in, ref, &c);
    Tensor Q = tensor_make(q, DT_F32, DEV_CPU, 3, Tq, c.nh, c.dqk, 1),
           K = tensor_make(k, DT_F32, DEV_CPU, 3, Tk, c.nkv, c.dqk, 1),
           V = tensor_make(v, DT_F32, DEV_CPU, 3, Tk, c.nkv, c.dv, 1),
           O = tensor_make(o, DT_F32, DEV_CPU, 3, Tq, c.nh, c.dv, 1),
           L = tensor_make(lse, DT_F32, DEV_CPU, 3, c.B, c.nh, c.Sq, 1);
    op_attention_forward(O, L, Q, K, V, &c.a);
    ASSERT(rel_err_mixed(o, ref, no) < 1e-6);
    for (int64_t i = 0; i < nl; i++) // a query that sees nothing has lse −∞ on both sides
        if (ref[no + i] < -1e299) ASSERT(isinf(lse[i]) && lse[i] < 0);
        else ASSERT_NEAR(lse[i], ref[no + i], 1e-5 * (1 + fabs(ref[no + i])));
    fd_grad(ref_attention, in, 0, nq, Gd, no + nl, gq, &c);
    fd_grad(ref_attention, in, 1, nk, Gd, no + nl, gk, &c);
    fd_grad(ref_attention, in, 2, nv, Gd, no + nl, gv, &c);
    if (sinks) fd_grad(ref_attention, in, 3, c.nh, Gd, no + nl, gs, &c);
    float *dq = poisoned(nq), *dk = poisoned(nk), *dv = poisoned(nv), *ds = xcalloc(c.nh, 4);
    op_attention_backward(tensor_make(dq, DT_F32, DEV_CPU, 3, Tq, c.nh, c.dqk, 1),
                          tensor_make(dk, DT_F32, DEV_CPU, 3, Tk, c.nkv, c.dqk, 1),
                          tensor_make(dv, DT_F32, DEV_CPU, 3, Tk, c.nkv, c.dv, 1),
                          sinks ? tf32_1(ds, c.nh) : (Tensor){0}, tensor_make(G, DT_F32, DEV_CPU, 3, Tq, c.nh, c.dv, 1),
                          Q, K, V, O, L, &c.a);
    ASSERT(rel_err_mixed(dq, gq, nq) < 1e-5);
    ASSERT(rel_err_mixed(dk, gk, nk) < 1e-5);
    ASSERT(rel_err_mixed(dv, gv, nv) < 1e-5);
    if (sinks) ASSERT(rel_err_mixed(ds, gs, c.nh) < 1e-5);
}

// B = 2, S = 5, 4 query heads over 2 kv heads, d = 4
TEST(op_attention) { check_attention((AttCtx){2, 5, 5, 4, 2, 4, 4, {.B = 2, .scale = 0.5f, .causal = true}}, false); }
// MLA: q·k head dim 6, v head dim 4, one kv head per query head
TEST(op_attention_mla) {
    check_attention((AttCtx){2, 6, 6, 2, 2, 6, 4, {.B = 2, .scale = 0.4f, .causal = true}}, false);
}
// GPT-OSS: a window of 3 (itself and 2 earlier keys) and per-head sinks
TEST(op_attention_window_sinks) {
    check_attention((AttCtx){2, 7, 7, 4, 2, 4, 4, {.B = 2, .scale = 0.5f, .causal = true, .window = 3}}, true);
    check_attention((AttCtx){1, 6, 6, 2, 1, 4, 4, {.B = 1, .scale = 0.5f, .causal = true}}, true);
}
// Ring attention's calls: a block of 3 queries against 5 keys, all visible; a causal pair of blocks at
// offsets where the first queries see no key (o = 0, lse = −∞)
TEST(op_attention_blocks) {
    check_attention((AttCtx){2, 3, 5, 4, 2, 4, 3, {.B = 2, .scale = 0.5f, .q_off = 5}}, false);
    check_attention((AttCtx){2, 4, 4, 2, 1, 4, 4, {.B = 2, .scale = 0.5f, .causal = true, .q_off = 3, .k_off = 5}},
                    false);
}

// ---- router: every form (weights, selection, group limits, bias, scaling), the load-balancing gradient ----
typedef struct {
    int64_t T, E, k;
    const int32_t *idx;
    RouterArgs a;
} RouterCtx;
// out = [w (T·k) | probs (T·E)] so one G covers both the weights path and the lb path (G on probs = lb_grad).
static void ref_router(double **in, double *out, const void *c) {
    const RouterCtx *p = c;
    for (int64_t t = 0; t < p->T; t++) {
        const double *l = in[0] + t * p->E;
        const int32_t *ix = p->idx + t * p->k;
        double m = -INFINITY, sum = 0, pr[16], s = 0, mk = -INFINITY, sk = 0;
        for (int64_t e = 0; e < p->E; e++) m = fmax(m, l[e]);
        for (int64_t e = 0; e < p->E; e++) sum += pr[e] = p->a.sigmoid ? 1 / (1 + exp(-l[e])) : exp(l[e] - m);
        for (int64_t e = 0; e < p->E; e++) pr[e] /= p->a.sigmoid ? 1 : sum, out[p->T * p->k + t * p->E + e] = pr[e];
        for (int64_t j = 0; j < p->k; j++) s += pr[ix[j]], mk = fmax(mk, l[ix[j]]);
        for (int64_t j = 0; j < p->k; j++) sk += exp(l[ix[j]] - mk);
        for (int64_t j = 0; j < p->k; j++)
            out[t * p->k + j] =
                p->a.scale * (p->a.softmax_topk ? exp(l[ix[j]] - mk) / sk : pr[ix[j]] / (p->a.renorm ? s : 1));
    }
}

// The experts a token should get, by brute force: groups ranked by their best score, then the k best experts
// of the kept groups (score = probs + bias), best first.
static void ref_select(int32_t *want, const float *probs, const float *bias, int64_t E, const RouterArgs *a) {
    double sc[16];
    for (int64_t e = 0; e < E; e++) sc[e] = probs[e] + (bias ? bias[e] : 0);
    int G = a->n_group > 1 ? a->n_group : 1, per = (int)(E / G), ng = G > 1 ? a->topk_group : 1;
    bool keep[16] = {0};
    for (int g = 0; g < G; g++) { // group g is kept when fewer than ng groups beat it
        double best = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) best = fmax(best, sc[e]);
        int beaten = 0;
        for (int h = 0; h < G; h++) {
            double bh = -INFINITY;
            for (int e = h * per; e < (h + 1) * per; e++) bh = fmax(bh, sc[e]);
            beaten += bh > best;
        }
        keep[g] = G == 1 || beaten < ng;
    }
    for (int j = 0; j < a->k; j++) {
        int b = -1;
        for (int e = 0; e < E; e++) {
            bool used = !keep[e / per];
            for (int l = 0; l < j; l++) used |= want[l] == e;
            if (!used && (b < 0 || sc[e] > sc[b])) b = e;
        }
        want[j] = b;
    }
}

static void check_router(RouterArgs a, int64_t E, bool bias_on) { // bias_on: a random selection bias
    int64_t T = 6, k = a.k;
    float *logits = rnd(T * E, 1), *probs = poisoned(T * E), *w = poisoned(T * k), *dw = rnd(T * k, 1),
          *lbg = rnd(E, 1), *bias = rnd(E, 0.2f);
    int32_t idx[6 * 16], want[16];
    if (bias_on) a.bias = tf32_1(bias, E);
    Tensor I = tensor_make(idx, DT_I32, DEV_CPU, 2, T, k, 1, 1);
    op_router_forward(tf32_2(probs, T, E), I, tf32_2(w, T, k), tf32_2(logits, T, E), &a);
    for (int64_t t = 0; t < T; t++) {
        ref_select(want, probs + t * E, a.bias.p ? bias : NULL, E, &a);
        for (int64_t j = 0; j < k; j++) ASSERT(idx[t * k + j] == want[j]);
    }
    RouterCtx c = {T, E, k, idx, a};
    int64_t nout = T * k + T * E;
    double *in[1] = {to_f64(logits, T * E)}, *out = xmalloc(nout * 8), *G = xmalloc(nout * 8), *g = xmalloc(T * E * 8);
    ref_router(in, out, &c);
    ASSERT(rel_err_mixed(w, out, T * k) < 1e-6);
    ASSERT(rel_err_mixed(probs, out + T * k, T * E) < 1e-6);
    for (int64_t i = 0; i < T * k; i++) G[i] = dw[i];
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) G[T * k + t * E + e] = lbg[e];
    fd_grad(ref_router, in, 0, T * E, G, nout, g, &c);
    float *dl = poisoned(T * E);
    op_router_backward(tf32_2(dl, T, E), tf32_2(dw, T, k), tf32_1(lbg, E), tf32_2(probs, T, E), I, tf32_2(w, T, k), &a);
    ASSERT(rel_err_mixed(dl, g, T * E) < 1e-5);
}
TEST(op_router_renorm) { check_router((RouterArgs){.k = 2, .renorm = true, .scale = 1}, 5, false); }
TEST(op_router_plain) { check_router((RouterArgs){.k = 2, .scale = 1}, 5, false); }
TEST(op_router_scaled) { check_router((RouterArgs){.k = 3, .scale = 2.5f}, 6, false); } // routed_scaling_factor
TEST(op_router_softmax_topk) {
    check_router((RouterArgs){.k = 3, .softmax_topk = true, .scale = 1}, 8, false);
} // GPT-OSS
TEST(op_router_grouped) { // DeepSeek-V2's group-limited greedy: 4 groups of 3, the best 2 kept, 3 experts
    check_router((RouterArgs){.k = 3, .scale = 1.5f, .n_group = 4, .topk_group = 2}, 12, false);
    check_router((RouterArgs){.k = 2, .renorm = true, .scale = 1, .n_group = 2, .topk_group = 1}, 8, false);
}
TEST(op_router_bias) { // aux-loss-free balancing: the bias selects but does not weight
    check_router((RouterArgs){.k = 2, .renorm = true, .scale = 1}, 8, true);
    check_router((RouterArgs){.k = 2, .scale = 1, .n_group = 4, .topk_group = 2}, 8, true);
    check_router((RouterArgs){.k = 2, .softmax_topk = true, .scale = 1}, 8, true);
}

// DeepSeek-V3's scoring: sigmoid scores, the bias for selection only, weights renormalised over the k chosen (or
// not), scaled, group-limited.
TEST(op_router_sigmoid) {
    check_router((RouterArgs){.k = 2, .renorm = true, .scale = 1, .sigmoid = true}, 8, true);
    check_router((RouterArgs){.k = 3, .renorm = true, .scale = 2.5f, .sigmoid = true}, 6, false);
    check_router((RouterArgs){.k = 2, .scale = 1, .sigmoid = true}, 5, false);
    check_router((RouterArgs){.k = 3, .renorm = true, .scale = 1.5f, .n_group = 4, .topk_group = 2, .sigmoid = true},
                 12, true);
}

static void check_force_balance(bool softmax_topk) {
    int64_t T = 8, E = 8, k = 2;
    float *logits = rnd(T * E, 1), probs[64], w[16];
    int32_t idx[16];
    RouterArgs a = {.k = 2, .renorm = true, .softmax_topk = softmax_topk, .scale = 1, .force_balance = true};
    op_router_forward(tf32_2(probs, T, E), tensor_make(idx, DT_I32, DEV_CPU, 2, T, k, 1, 1), tf32_2(w, T, k),
                      tf32_2(logits, T, E), &a);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            ASSERT(idx[t * k + j] == (t + j * (E / k)) % E);
            double s =
                probs[t * E + idx[t * k]] + probs[t * E + idx[t * k + 1]]; // softmax over the pair = renormalised
            ASSERT_NEAR(w[t * k + j], probs[t * E + idx[t * k + j]] / s, 1e-6);
        }
}
TEST(op_router_force_balance) { check_force_balance(false), check_force_balance(true); }

TEST(op_moe_lb_loss) {
    int64_t T = 4, E = 4, k = 2;
    float probs[16], lbg[4];
    int32_t idx[8] = {0, 1, 0, 2, 0, 1, 3, 0};
    for (int i = 0; i < 16; i++) probs[i] = 0.05f * (i % 5 + 1);
    double loss = 0;
    op_moe_lb_loss(tensor_make(&loss, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), tf32_1(lbg, E), tf32_2(probs, T, E),
                   tensor_make(idx, DT_I32, DEV_CPU, 2, T, k, 1, 1), 0.5f, 3.0f);
    double cnt[4] = {4, 2, 1, 1}, want = 0;
    for (int e = 0; e < E; e++) {
        double pm = 0;
        for (int t = 0; t < T; t++) pm += probs[t * E + e];
        want += 0.5 * E * cnt[e] / (T * k) * pm / T;
        ASSERT_NEAR(lbg[e], 3.0 * 0.5 * E * cnt[e] / (T * k) / T, 1e-6);
    }
    ASSERT_NEAR(loss, want, 1e-7);
    double got[4] = {10, 20, 30, 40}; // op_moe_count adds the same counts to what it holds
    op_moe_count(tensor_make(got, DT_F64, DEV_CPU, 1, E, 1, 1, 1), tensor_make(idx, DT_I32, DEV_CPU, 2, T, k, 1, 1));
    for (int e = 0; e < E; e++) ASSERT(got[e] == 10 * (e + 1) + cnt[e]);
}

TEST(op_moe_sort_gather_scatter) {
    int64_t T = 5, k = 2, E = 4, H = 3;
    int32_t idx[10] = {3, 1, 1, 0, 3, 2, 1, 3, 0, 1}, perm[10], at[10];
    int64_t offs[5];
    op_moe_sort(tensor_make(perm, DT_I32, DEV_CPU, 1, T * k, 1, 1, 1),
                tensor_make(at, DT_I32, DEV_CPU, 1, T * k, 1, 1, 1), ti64_1(offs, 5),
                tensor_make(idx, DT_I32, DEV_CPU, 2, T, k, 1, 1), (int)E);
    int64_t want_offs[5] = {0, 2, 6, 7, 10};
    int32_t want_perm[10] = {3, 8, 1, 2, 6, 9, 5, 0, 4, 7}; // stable: slots in increasing order within an expert
    for (int i = 0; i < 5; i++) ASSERT(offs[i] == want_offs[i]);
    for (int i = 0; i < 10; i++) ASSERT(perm[i] == want_perm[i] && at[want_perm[i]] == i);
    float *x = rnd(T * H, 1), xe[30], y[30], back[30], dx[15] = {0};
    Tensor P = tensor_make(perm, DT_I32, DEV_CPU, 1, T * k, 1, 1, 1);
    op_gather_rows(tf32_2(xe, T * k, H), tf32_2(x, T, H), P, (int)k);
    for (int i = 0; i < 10; i++)
        for (int c = 0; c < H; c++) ASSERT(xe[i * H + c] == x[perm[i] / k * H + c]);
    op_scatter_rows(tf32_2(y, T * k, H), tf32_2(xe, T * k, H), P); // slot order: row t·k+j = token t
    for (int i = 0; i < 10; i++)
        for (int c = 0; c < H; c++) ASSERT(y[i * H + c] == x[i / k * H + c]);
    op_gather_rows(tf32_2(back, T * k, H), tf32_2(y, T * k, H), P, 1);
    for (int i = 0; i < 30; i++) ASSERT(back[i] == xe[i]);
    op_scatter_add_rows(tf32_2(dx, T, H), tf32_2(xe, T * k, H), P, (int)k); // each token receives k copies
    for (int i = 0; i < 15; i++) ASSERT_NEAR(dx[i], 2 * x[i], 1e-6);
}

typedef struct {
    int64_t T, k, H;
} CombCtx;
static void ref_combine(double **in, double *out, const void *c) { // in: resid, y, w
    const CombCtx *p = c;
    for (int64_t t = 0; t < p->T; t++)
        for (int64_t h = 0; h < p->H; h++) {
            double s = in[0][t * p->H + h];
            for (int64_t j = 0; j < p->k; j++) s += in[2][t * p->k + j] * in[1][(t * p->k + j) * p->H + h];
            out[t * p->H + h] = s;
        }
}

TEST(op_moe_combine) {
    CombCtx c = {4, 3, 5};
    int64_t nr = c.T * c.H, ny = c.T * c.k * c.H, nw = c.T * c.k;
    float *r = rnd(nr, 1), *y = rnd(ny, 1), *w = rnd(nw, 1), *out = poisoned(nr), *G = rnd(nr, 1);
    double *in[3] = {to_f64(r, nr), to_f64(y, ny), to_f64(w, nw)}, *yr = xmalloc(nr * 8), *Gd = to_f64(G, nr),
           *gy = xmalloc(ny * 8), *gw = xmalloc(nw * 8);
    ref_combine(in, yr, &c);
    op_moe_combine_forward(tf32_2(out, c.T, c.H), tf32_2(r, c.T, c.H), tf32_2(y, c.T * c.k, c.H), tf32_2(w, c.T, c.k),
                           NONE);
    ASSERT(rel_err_mixed(out, yr, nr) < 1e-6);
    fd_grad(ref_combine, in, 1, ny, Gd, nr, gy, &c);
    fd_grad(ref_combine, in, 2, nw, Gd, nr, gw, &c);
    float *dy = poisoned(ny), *dw = poisoned(nw);
    op_moe_combine_backward(tf32_2(dy, c.T * c.k, c.H), tf32_2(dw, c.T, c.k), tf32_2(G, c.T, c.H),
                            tf32_2(y, c.T * c.k, c.H), tf32_2(w, c.T, c.k), NONE);
    ASSERT(rel_err_mixed(dy, gy, ny) < 1e-6);
    ASSERT(rel_err_mixed(dw, gw, nw) < 1e-6);
    // y's rows in another order, slot s at row at[s] (a reversal with a swap): the same values, bit for bit (the
    // same products and sums in the same order), and dy in y's order
    int32_t at[12];
    for (int s = 0; s < nw; s++) at[s] = (int32_t)(nw - 1 - s);
    at[0] = 5, at[6] = 11;
    float *ya = xmalloc(ny * 4), *outa = poisoned(nr), *dya = poisoned(ny), *dwa = poisoned(nw);
    for (int s = 0; s < nw; s++) memcpy(ya + at[s] * c.H, y + s * c.H, c.H * 4);
    Tensor A = tensor_make(at, DT_I32, DEV_CPU, 1, nw, 1, 1, 1);
    op_moe_combine_forward(tf32_2(outa, c.T, c.H), tf32_2(r, c.T, c.H), tf32_2(ya, c.T * c.k, c.H), tf32_2(w, c.T, c.k),
                           A);
    op_moe_combine_backward(tf32_2(dya, c.T * c.k, c.H), tf32_2(dwa, c.T, c.k), tf32_2(G, c.T, c.H),
                            tf32_2(ya, c.T * c.k, c.H), tf32_2(w, c.T, c.k), A);
    ASSERT(memcmp(outa, out, nr * 4) == 0 && memcmp(dwa, dw, nw * 4) == 0);
    for (int s = 0; s < nw; s++) ASSERT(memcmp(dya + at[s] * c.H, dy + s * c.H, c.H * 4) == 0);
}

typedef struct {
    int64_t R, V;
    const int32_t *lab;
} CeCtx;
static void ref_ce(double **in, double *out, const void *c) {
    const CeCtx *p = c;
    out[0] = 0;
    for (int64_t r = 0; r < p->R; r++) {
        if (p->lab[r] == -100) continue;
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < p->V; v++) m = fmax(m, in[0][r * p->V + v]);
        for (int64_t v = 0; v < p->V; v++) s += exp(in[0][r * p->V + v] - m);
        out[0] += m + log(s) - in[0][r * p->V + p->lab[r]];
    }
}

TEST(op_cross_entropy) {
    int32_t lab[4] = {3, -100, 0, 6};
    CeCtx c = {4, 7, lab};
    int64_t n = c.R * c.V;
    float *l = rnd(n, 3);
    double *in[1] = {to_f64(l, n)}, want, G = 0.25, *g = xmalloc(n * 8), loss = 1.5;
    ref_ce(in, &want, &c);
    fd_grad(ref_ce, in, 0, n, &G, 1, g, &c);
    float *l2 = xmalloc(n * sizeof *l2);
    memcpy(l2, l, n * sizeof *l2);
    Tensor lb = tensor_make(lab, DT_I32, DEV_CPU, 1, 4, 1, 1, 1);
    op_cross_entropy(tf32_2(l, c.R, c.V), lb, tensor_make(&loss, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), (Tensor){0}, 0.25f);
    ASSERT_NEAR(loss, 1.5 + want, 1e-5);
    ASSERT(rel_err_mixed(l, g, n) < 1e-5);
    for (int v = 0; v < 7; v++) ASSERT(l[7 + v] == 0); // ignored row
    // The per-row output: each row's CE (0 for the ignored row), the sum and the gradients unchanged bit for bit.
    double rows[4] = {9, 9, 9, 9}, loss2 = 1.5, sum = 1.5;
    op_cross_entropy(tf32_2(l2, c.R, c.V), lb, tensor_make(&loss2, DT_F64, DEV_CPU, 1, 1, 1, 1, 1),
                     tensor_make(rows, DT_F64, DEV_CPU, 1, 4, 1, 1, 1), 0.25f);
    ASSERT(loss2 == loss && !memcmp(l, l2, n * sizeof *l));
    for (int r = 0; r < 4; r++) {
        CeCtx one = {1, 7, lab + r};
        double *in1[1] = {in[0] + r * 7}, w1 = 0;
        if (lab[r] != -100) ref_ce(in1, &w1, &one);
        ASSERT_NEAR(rows[r], w1, 1e-5);
        sum += rows[r];
    }
    ASSERT(rows[1] == 0 && sum == loss);
    free(l2);
}

TEST(op_embedding) {
    int64_t V = 6, H = 4, T = 5;
    float *tab = rnd(V * H, 1), h[20], dt[24] = {0};
    int32_t tok[5] = {2, 0, 2, 5, 1};
    Tensor Tk = tensor_make(tok, DT_I32, DEV_CPU, 1, T, 1, 1, 1);
    op_embedding_forward(tf32_2(h, T, H), tf32_2(tab, V, H), Tk);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++) ASSERT(h[t * H + c] == tab[tok[t] * H + c]);
    op_embedding_backward(tf32_2(dt, V, H), tf32_2(h, T, H), Tk);
    for (int c = 0; c < H; c++) {
        ASSERT_NEAR(dt[2 * H + c], 2 * tab[2 * H + c], 1e-6);
        ASSERT(dt[3 * H + c] == 0);
    }
}

// AdamW against torch.optim.AdamW's formulas in fp64, over three steps, the gradient read as gscale·g; the
// compute copy it writes is p exactly (fp32) or p rounded to bf16.
TEST(op_adamw) {
    int64_t n = 50;
    float *p = rnd(n, 1), *m = xcalloc(n, 4), *v = xcalloc(n, 4), *w32 = xmalloc(n * 4);
    uint16_t *w16 = xmalloc(n * 2);
    double *pd = to_f64(p, n), *md = xcalloc(n, 8), *vd = xcalloc(n, 8);
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.37;
    for (int t = 1; t <= 3; t++) {
        float *g = rnd(n, 1);
        Tensor w = t == 2 ? tensor_make(w16, DT_BF16, DEV_CPU, 1, n, 1, 1, 1) : tf32_1(w32, n);
        op_adamw(tf32_1(p, n), tf32_1(g, n), tf32_1(m, n), tf32_1(v, n), w, (float)gs, (float)lr, (float)b1, (float)b2,
                 (float)eps, (float)wd, t);
        for (int64_t i = 0; i < n; i++) {
            double gi = gs * g[i];
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            pd[i] -= lr / (1 - pow(b1, t)) * md[i] / (sqrt(vd[i]) / sqrt(1 - pow(b2, t)) + eps);
            if (t == 2) ASSERT(w16[i] == f32_to_bf16(p[i]));
            else ASSERT(w32[i] == p[i]);
        }
        free(g);
    }
    ASSERT(rel_err_mixed(p, pd, n) < 1e-6);
    ASSERT(rel_err_mixed(m, md, n) < 1e-6);
    ASSERT(rel_err_mixed(v, vd, n) < 1e-6);
    // the pass flags a weight it makes infinite (lr 3e38: the step overflows), once: reading clears it
    ASSERT(!op_adamw_nonfinite(DEV_CPU));
    float *g = rnd(n, 1);
    op_adamw(tf32_1(p, n), tf32_1(g, n), tf32_1(m, n), tf32_1(v, n), (Tensor){0}, 1, 3e38f, 0.9f, 0.95f, 1e-30f, 0, 4);
    ASSERT(op_adamw_nonfinite(DEV_CPU) && !op_adamw_nonfinite(DEV_CPU));
    free(g), free(p), free(m), free(v), free(w32), free(w16), free(pd), free(md), free(vd);
}

// AdamW with bf16 moments (optimizer.state_dtype), five steps. Each step against fp64 from the same state: p within
// 1e-6 (the update uses the moments' fp32 values before rounding); m and v are the fp64 values rounded to nearest
// into bf16: within half an ulp, 2^-8 relative (at a tie fp32's last bits may pick the other neighbour, as far), plus
// the fp32 update's own rounding, relative to its two terms (m's can cancel; the data depend on the tests before).
// Over the run against fp64 AdamW with exact moments: rounding adds at most u = 2^-9 relative a step and the older
// errors decay by b, so ‖m − m_exact‖ ≤ u·Σ_j b1^j·‖m_exact(T−j)‖ (v likewise with b2), with 1% slack for the
// second-order terms; p within 1e-3: T·lr = 0.05 of movement, each step's off by about the moments' 2^-8.
TEST(op_adamw_bf16_moments) {
    enum { N = 1000, T = 5 };
    double lr = 1e-2, b[2] = {0.9, 0.95}, eps = 1e-8, wd = 0.1, gs = 0.37, u = ldexp(1, -9);
    float *p = rnd(N, 1);
    uint16_t *mv[2] = {xcalloc(N, 2), xcalloc(N, 2)};
    double *pe = to_f64(p, N), *ex[2] = {xcalloc(N, 8), xcalloc(N, 8)}, norms[2][T], *st = xmalloc(N * 8);
    Tensor m = tensor_make(mv[0], DT_BF16, DEV_CPU, 1, N, 1, 1, 1),
           v = tensor_make(mv[1], DT_BF16, DEV_CPU, 1, N, 1, 1, 1);
    for (int t = 1; t <= T; t++) {
        float *g = rnd(N, 1);
        double *pd = to_f64(p, N), md[N], vd[N];
        uint16_t prev[2][N]; // the moments before this step
        memcpy(prev[0], mv[0], sizeof prev[0]), memcpy(prev[1], mv[1], sizeof prev[1]);
        for (int64_t i = 0; i < N; i++) md[i] = bf16_to_f32(mv[0][i]), vd[i] = bf16_to_f32(mv[1][i]);
        op_adamw(tf32_1(p, N), tf32_1(g, N), m, v, (Tensor){0}, (float)gs, (float)lr, (float)b[0], (float)b[1],
                 (float)eps, (float)wd, t);
        for (int64_t i = 0; i < N; i++) {
            double gi = gs * g[i];
            md[i] = b[0] * md[i] + (1 - b[0]) * gi, vd[i] = b[1] * vd[i] + (1 - b[1]) * gi * gi;
            pd[i] = pd[i] * (1 - lr * wd) - lr / (1 - pow(b[0], t)) * md[i] / (sqrt(vd[i] / (1 - pow(b[1], t))) + eps);
            for (int k = 0; k < 2; k++) {
                // plus the op's fp32 arithmetic: a few ulps of the two terms, which can cancel (m near 0)
                double want = k ? vd[i] : md[i], got = bf16_to_f32(mv[k][i]), term = (1 - b[k]) * (k ? gi * gi : gi);
                double terms = b[k] * fabs(bf16_to_f32(prev[k][i])) + fabs(term);
                ASSERT_MSG(fabs(got - want) <= ldexp(fabs(want), -8) + ldexp(terms, -21),
                           "step %d, %s[%lld]: %.9g, fp64 %.9g", t, k ? "v" : "m", (long long)i, got, want);
                ex[k][i] = b[k] * ex[k][i] + (1 - b[k]) * (k ? gi * gi : gi);
            }
            pe[i] = pe[i] * (1 - lr * wd) -
                    lr / (1 - pow(b[0], t)) * ex[0][i] / (sqrt(ex[1][i] / (1 - pow(b[1], t))) + eps);
        }
        ASSERT(rel_err_mixed(p, pd, N) < 1e-6);
        for (int k = 0; k < 2; k++) {
            norms[k][t - 1] = 0;
            for (int64_t i = 0; i < N; i++) norms[k][t - 1] += ex[k][i] * ex[k][i];
            norms[k][t - 1] = sqrt(norms[k][t - 1]);
        }
        free(g), free(pd);
    }
    for (int k = 0; k < 2; k++) {
        double bound = 0;
        for (int j = 0; j < T; j++) bound += pow(b[k], j) * norms[k][T - 1 - j];
        for (int64_t i = 0; i < N; i++) st[i] = bf16_to_f32(mv[k][i]) - ex[k][i];
        double err = 0;
        for (int64_t i = 0; i < N; i++) err += st[i] * st[i];
        ASSERT_MSG(sqrt(err) <= 1.01 * u * bound, "%s: ‖error‖ %.3g over the bound %.3g", k ? "v" : "m", sqrt(err),
                   u * bound);
        printf("     %s after %d steps: ‖bf16 − exact‖/‖exact‖ %.2e (bound %.2e)\n", k ? "v" : "m", T,
               sqrt(err) / norms[k][T - 1], u * bound / norms[k][T - 1]);
    }
    printf("     p against exact-moment AdamW: %.2e\n", rel_err_mixed(p, pe, N));
    ASSERT(rel_err_mixed(p, pe, N) < 1e-3);
    free(p), free(mv[0]), free(mv[1]), free(pe), free(ex[0]), free(ex[1]), free(st);
}

// Column slices: dst[:, a:a+n] (+)= src[:, b:b+n]; the other columns stay as they were.
TEST(op_copy_cols) {
    int64_t R = 4, Cd = 7, Cs = 5, a = 2, b = 1, n = 3;
    float *src = rnd(R * Cs, 1), *dst = rnd(R * Cd, 1), *d0 = xmalloc(R * Cd * 4);
    memcpy(d0, dst, R * Cd * 4);
    op_copy_cols(tf32_2(dst, R, Cd), a, tf32_2(src, R, Cs), b, n, false);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < Cd; c++)
            ASSERT(dst[r * Cd + c] == (c >= a && c < a + n ? src[r * Cs + c - a + b] : d0[r * Cd + c]));
    op_copy_cols(tf32_2(dst, R, Cd), a, tf32_2(src, R, Cs), b, n, true);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < Cd; c++)
            ASSERT(dst[r * Cd + c] == (c >= a && c < a + n ? 2 * src[r * Cs + c - a + b] : d0[r * Cd + c]));
    // a 3-D view is rows × the rest: (R, 1, Cd) behaves as (R, Cd)
    op_copy_cols(tensor_make(dst, DT_F32, DEV_CPU, 3, R, 1, Cd, 1), 0, tf32_2(src, R, Cs), 0, Cs, false);
    for (int64_t r = 0; r < R; r++) ASSERT(dst[r * Cd + 4] == src[r * Cs + 4] && dst[r * Cd + 6] == d0[r * Cd + 6]);
    // blocks: src[:, 1:3] into dst[:, 1 + 3h : +2] for h < 2 (a broadcast), then those blocks summed in order into
    // src[:, 3:5] (accumulating: ((src + block 0) + block 1))
    memcpy(d0, dst, R * Cd * 4);
    op_copy_col_blocks(tf32_2(dst, R, Cd), 1, 3, tf32_2(src, R, Cs), 1, 0, 2, 2, false);
    float *s0 = xmalloc(R * Cs * 4);
    memcpy(s0, src, R * Cs * 4);
    op_copy_col_blocks(tf32_2(src, R, Cs), 3, 0, tf32_2(dst, R, Cd), 1, 3, 2, 2, true);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t c = 0; c < Cd; c++) {
            int64_t h = (c - 1) / 3, j = (c - 1) % 3;
            ASSERT(dst[r * Cd + c] == (c >= 1 && h < 2 && j < 2 ? s0[r * Cs + 1 + j] : d0[r * Cd + c]));
        }
        for (int64_t c = 0; c < Cs; c++)
            ASSERT(src[r * Cs + c] ==
                   (c >= 3 ? s0[r * Cs + c] + s0[r * Cs + c - 2] + s0[r * Cs + c - 2] : s0[r * Cs + c]));
    }
    free(src), free(dst), free(d0), free(s0);
}

TEST(op_sum_squares_scale_add) {
    float x[5] = {1, -2, 3, 0.5f, 0}, y[5] = {1, 1, 1, 1, 1};
    ASSERT_NEAR(op_sum_squares(tf32_1(x, 5)), 14.25, 1e-9);
    op_scale(tf32_1(x, 5), 2);
    op_add(tf32_1(y, 5), tf32_1(x, 5));
    ASSERT(y[1] == -3 && y[3] == 2);
}
