// test_fp8.c — FP8 E4M3 block quantisation (ops/cpu/cpu_fp8.c) and the FP8 linear layers (ops/fp8.c) against
// references written here, and the model trained with fp8 = true against the compute dtype, one process and ep2.
#include <sys/wait.h>
#include <unistd.h>

#include "ops/cpu/cpu_ops.h"
#include "base/safetensors.h"
#include "pipe/chunk.h"
#include "test.h"

// The E4M3 value nearest to v by brute force over the 254 finite codes, ties to the even code (mantissa bit 0
// clear), saturating at ±448: what fp8_e4m3_encode must give.
static uint8_t nearest_code(float v) {
    if (v >= 448) return 0x7e;
    if (v <= -448) return 0xfe;
    int best = -1;
    double bd = INFINITY;
    for (int q = 0; q < 256; q++) {
        float f = fp8_e4m3_decode((uint8_t)q);
        if (isnan(f) || (q == 0x80)) continue; // −0 is the same value as +0
        double d = fabs((double)f - v);
        if (d < bd || (d == bd && !(q & 1))) bd = d, best = q;
    }
    if (best == 0 && signbit(v)) best = 0x80;
    return (uint8_t)best;
}

TEST(fp8_e4m3_codes_round_nearest_even_and_saturate) {
    for (int q = 0; q < 256; q++) { // every code decodes and encodes back (the NaN codes stay NaN)
        float f = fp8_e4m3_decode((uint8_t)q);
        if ((q & 0x7f) == 0x7f) ASSERT(isnan(f) && fp8_e4m3_encode(f) == q);
        else ASSERT_MSG(fp8_e4m3_encode(f) == q, "code 0x%02x (%g) encodes as 0x%02x", q, f, fp8_e4m3_encode(f));
    }
    ASSERT(fp8_e4m3_decode(0x7e) == 448 && fp8_e4m3_decode(0xfe) == -448 && fp8_e4m3_decode(0x01) == 0x1p-9f);
    ASSERT(fp8_e4m3_decode(0x08) == 0x1p-6f && fp8_e4m3_decode(0x07) == 7 * 0x1p-9f);
    // saturation, infinities, ties between codes, subnormal ties (2^-10 → 0, 3·2^-10 → 2·2^-9)
    ASSERT(fp8_e4m3_encode(449) == 0x7e && fp8_e4m3_encode(1e30f) == 0x7e && fp8_e4m3_encode(-INFINITY) == 0xfe);
    ASSERT(fp8_e4m3_encode(0x1p-10f) == 0x00 && fp8_e4m3_encode(3 * 0x1p-10f) == 0x02);
    ASSERT(fp8_e4m3_encode(17) == fp8_e4m3_encode(16) && fp8_e4m3_encode(19) == fp8_e4m3_encode(20));
    float v[4000];
    fill_normal(v, 4000, 60);
    for (int i = 0; i < 4000; i++) {
        float x = i % 4 ? v[i] : v[i] * 1e-4f; // a quarter near the subnormal range
        ASSERT_MSG(fp8_e4m3_encode(x) == nearest_code(x), "%.9g: 0x%02x, nearest 0x%02x", x, fp8_e4m3_encode(x),
                   nearest_code(x));
    }
}

TEST(fp8_block_scale_power_of_two) {
    ASSERT(fp8_block_scale(448) == 1 && fp8_block_scale(449) == 2 && fp8_block_scale(224) == 0.5f);
    ASSERT(fp8_block_scale(0) == fp8_block_scale(1e-4f)); // amax is clamped at 1e-4
    float v[200];
    fill_normal(v, 200, 10);
    for (int i = 0; i < 200; i++) {
        float a = fabsf(v[i]) + 1e-3f, s = fp8_block_scale(a);
        int e;
        ASSERT(frexpf(s, &e) == 0.5f);           // a power of two
        ASSERT(s >= a / 448 && s < 2 * a / 448); // the smallest one ≥ amax/448
    }
}

// x: (R, C) with the given groups; checks quantise → dequantise = round, round is idempotent, every value is
// within half a code step of x (2^-4 relative, or 2^-10·s among the subnormal codes).
static void check_round_trip(int64_t R, int64_t C, Fp8Blocks b, const int64_t *offs, int groups) {
    float *x = xmalloc(R * C * 4), *y = xmalloc(R * C * 4), *z = xmalloc(R * C * 4), *w = xmalloc(R * C * 4);
    fill_normal(x, R * C, 3);
    for (int64_t i = 0; i < R * C; i += 7) x[i] *= 1e-4f; // small values in blocks of large ones: subnormal codes
    Tensor tx = tf32_2(x, R, C);
    int64_t sr = cpu_fp8_scale_rows(tx, b, offs, groups), sc = b == FP8_COLS ? C : (C + 127) / 128;
    uint8_t *q = xmalloc(R * C);
    float *s = xmalloc(sr * sc * 4);
    Tensor tq = tensor_make(q, DT_U8, DEV_CPU, 2, R, C, 1, 1), ts = tf32_2(s, sr, sc);
    cpu_fp8_quantize(tq, ts, tx, b, offs, groups);
    cpu_fp8_dequantize(tf32_2(y, R, C), tq, ts, b, offs, groups);
    Tensor to = offs ? ti64_1(offs, groups + 1) : (Tensor){0};
    op_fp8_round(tf32_2(z, R, C), tx, b, to);
    ASSERT(!memcmp(y, z, R * C * 4));
    op_fp8_round(tf32_2(w, R, C), tf32_2(z, R, C), b, to);
    ASSERT(!memcmp(w, z, R * C * 4));
    int subnormal = 0;
    for (int64_t i = 0; i < R * C; i++) {
        float step = fabsf(x[i]) * 0x1p-4f, tiny = 0;
        for (int64_t j = 0; j < sr * sc; j++) tiny = fmaxf(tiny, s[j] * 0x1p-10f);
        subnormal += (q[i] & 0x78) == 0 && (q[i] & 7);
        ASSERT_MSG(fabsf(z[i] - x[i]) <= fmaxf(step, tiny), "%lld: %g → %g", (long long)i, x[i], z[i]);
    }
    ASSERT(subnormal > 0);
    free(x), free(y), free(z), free(w), free(q), free(s);
}

TEST(fp8_round_trips_every_block_kind) {
    int64_t offs[5] = {0, 5, 5, 140, 300}; // an empty group, one of 5 rows, ragged blocks of 128
    for (int b = FP8_ROWS; b <= FP8_TILES; b++) {
        check_round_trip(300, 200, (Fp8Blocks)b, offs, 4); // 200 columns: a block of 128 and one of 72
        check_round_trip(130, 256, (Fp8Blocks)b, NULL, 0);
    }
}

TEST(fp8_round_block_edges) {
    enum { R = 4, C = 256 };
    float x[R * C], y[R * C], p[R * 384], py[R * 384];
    memset(x, 0, sizeof x);
    for (int c = 128; c < C; c++) x[c] = (c % 3 - 1) * 448.0f; // row 0: a zero block, then a block of ±448 and 0
    x[C + 5] = 449, x[C + 6] = -0x1p-130f;                     // row 1: 449 → scale 2; an fp32 subnormal
    x[2 * C + 7] = 1e-30f;                                     // row 2: amax below 1e-4 → scale 2^-22
    op_fp8_round(tf32_2(y, R, C), tf32_2(x, R, C), FP8_ROWS, (Tensor){0});
    for (int c = 0; c < 128; c++) ASSERT(y[c] == 0 && !signbit(y[c]));
    for (int c = 128; c < C; c++) ASSERT(y[c] == x[c]); // ±448 exact (codes 0x7e, 0xfe)
    ASSERT(y[C + 5] == 448 && y[C + 6] == 0 && y[2 * C + 7] == 0);
    // a ragged last block equals the block padded with zeros
    memset(p, 0, sizeof p);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 200; c++) p[r * 384 + c] = x[r * 200 + c] = (float)(r + 1) * (c % 17 - 8) * 0.37f;
    for (int b = FP8_ROWS; b <= FP8_TILES; b++) {
        op_fp8_round(tf32_2(y, R, 200), tf32_2(x, R, 200), (Fp8Blocks)b, (Tensor){0});
        op_fp8_round(tf32_2(py, R, 384), tf32_2(p, R, 384), (Fp8Blocks)b, (Tensor){0});
        for (int r = 0; r < R; r++) ASSERT(!memcmp(y + r * 200, py + r * 384, 200 * 4));
    }
}

static float bad_value;
static void round_bad(void) {
    float x[300];
    fill_normal(x, 300, 1);
    x[133] = bad_value;
    op_fp8_round(tf32_2(x, 3, 100), tf32_2(x, 3, 100), FP8_TILES, (Tensor){0});
}

// Runs round_bad in a child with stderr captured; it must stop with a message containing want.
static void expect_refused(float v, const char *want) {
    char log[300];
    snprintf(log, sizeof log, "%s/die.log", test_tmpdir());
    bad_value = v;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CHECK(freopen(log, "w", stderr));
        round_bad();
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    char *msg = file_read_all(log, NULL);
    ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1, "a non-finite value was quantised");
    ASSERT_MSG(msg && strstr(msg, want), "message '%s', expected '%s'", msg ? msg : "", want);
    free(msg);
}

TEST(fp8_round_refuses_non_finite_input) {
    expect_refused(NAN, "fp8: cannot quantise a non-finite value: x[1, 33] = nan (shape 3 × 100)");
    expect_refused(INFINITY, "x[1, 33] = inf");
    expect_refused(-INFINITY, "x[1, 33] = -inf");
}

// ---- the FP8 linear layers ----

// out = a·bᵀ (ta: a is stored transposed, (K, M)) in fp64 of fp32 inputs: C (M, N).
static void gemm64(double *out, const float *a, const float *b, int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)a[ta ? k * M + i : i * K + k] * b[tb ? k * N + j : j * K + k];
            out[i * N + j] = s;
        }
}

static float *rounded_copy(const float *x, int64_t R, int64_t C, Fp8Blocks b, const int64_t *offs, int groups) {
    float *y = xmalloc(R * C * 4);
    op_fp8_round(tf32_2(y, R, C), tf32_2((float *)x, R, C), b, offs ? ti64_1(offs, groups + 1) : (Tensor){0});
    return y;
}

static double rel_mixed(const float *a, const double *b, int64_t n) {
    double *ad = xmalloc(n * 8);
    for (int64_t i = 0; i < n; i++) ad[i] = a[i];
    double r = rel_err_f64(ad, b, n);
    free(ad);
    return r;
}

// calc_diff = 1 − 2Σab / Σ(a² + b²) (PithTrain's measure).
static double calc_diff(const float *a, const double *b, int64_t n) {
    double ab = 0, aa = 0;
    for (int64_t i = 0; i < n; i++) ab += a[i] * b[i], aa += (double)a[i] * a[i] + b[i] * b[i];
    return 1 - 2 * ab / aa;
}

// The FP8 layers equal the recipe computed here in fp64 on rounded operands (≤ 1e-6: fp32 sums), and their outputs
// and gradients are the exact layer's (fp64 on the unrounded operands) within the FP8 error.
// offs NULL: the dense layer; else E experts (the weight (E, N, K)), x gathered from token rows (3 slots a token,
// shuffled), and the forward and weight gradient that gather it in the op give the bits of those on x.
static void check_fp8_linear(int64_t M, int64_t N, int64_t K, const int64_t *offs, int E) {
    int64_t En = offs ? E : 1, k = 3, T = M / k + 1;
    float *x = xmalloc(M * K * 4), *w = xmalloc(En * N * K * 4), *dy = xmalloc(M * N * 4), *xt = xmalloc(T * K * 4);
    int32_t *slot = shuffled_slots(T * k, 7); // the first M are x's rows
    fill_normal(x, M * K, 1), fill_normal(w, En * N * K, 0.5f), fill_normal(dy, M * N, 1), fill_normal(xt, T * K, 1);
    if (offs)
        for (int64_t i = 0; i < M; i++) memcpy(x + i * K, xt + slot[i] / k * K, K * 4);
    Tensor tw = offs ? tensor_make(w, DT_F32, DEV_CPU, 3, E, N, K, 1) : tf32_2(w, N, K);
    float *wq = xmalloc(En * N * K * 4);
    Tensor twq = tw;
    twq.p = wq;
    op_fp8_round(twq, tw, FP8_TILES, (Tensor){0});
    void *w8b = xmalloc(offs ? op_fp8_experts_bytes(E, N, K) : op_fp8_weight_bytes(N, K));
    Fp8Weight w8 = offs ? op_fp8_experts_view(w8b, DEV_CPU, E, N, K) : op_fp8_weight_view(w8b, DEV_CPU, N, K);
    op_fp8_weight_make(w8, tw);
    // the experts' transposed codes and scales (the GPU's input gradient reads them) are each expert's own
    const uint8_t *q8 = w8.q.p, *qt8 = w8.qt.p;
    const float *s8 = w8.s.p, *st8 = w8.st.p;
    int64_t NB = (N + 127) / 128, KB = (K + 127) / 128, KB4 = w8.s.n[1], NB4 = w8.st.n[1];
    for (int64_t e = 0; e < En; e++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                ASSERT(qt8[(e * K + k) * N + n] == q8[(e * N + n) * K + k]);
                ASSERT(st8[(e * KB + k / 128) * NB4 + n / 128] == s8[(e * NB + n / 128) * KB4 + k / 128]);
            }
    float *y = xmalloc(M * N * 4), *dx = xmalloc(M * K * 4), *dw = xcalloc(En * N * K, 4);
    if (offs) {
        Tensor to = ti64_1(offs, E + 1), rows = tensor_make(slot, DT_I32, DEV_CPU, 1, M, 1, 1, 1);
        op_fp8_grouped_linear_forward(tf32_2(y, M, N), tf32_2(x, M, K), NONE, 0, w8, to);
        op_fp8_grouped_linear_backward_input(tf32_2(dx, M, K), tf32_2(dy, M, N), w8, to);
        op_fp8_grouped_linear_backward_weight(tensor_make(dw, DT_F32, DEV_CPU, 3, E, N, K, 1), tf32_2(dy, M, N),
                                              tf32_2(x, M, K), NONE, 0, to, true);
        float *yg = xmalloc(M * N * 4), *dwg = xcalloc(En * N * K, 4);
        op_fp8_grouped_linear_forward(tf32_2(yg, M, N), tf32_2(xt, T, K), rows, (int)k, w8, to);
        op_fp8_grouped_linear_backward_weight(tensor_make(dwg, DT_F32, DEV_CPU, 3, E, N, K, 1), tf32_2(dy, M, N),
                                              tf32_2(xt, T, K), rows, (int)k, to, true);
        ASSERT_MSG(!memcmp(y, yg, M * N * 4), "the forward gathering x differs from the forward on x");
        ASSERT_MSG(!memcmp(dw, dwg, En * N * K * 4), "the weight gradient gathering x differs from the one on x");
        free(yg), free(dwg);
    } else {
        op_fp8_linear_forward(tf32_2(y, M, N), tf32_2(x, M, K), w8);
        op_fp8_linear_backward_input(tf32_2(dx, M, K), tf32_2(dy, M, N), w8, false);
        op_fp8_linear_backward_weight(tf32_2(dw, N, K), tf32_2(dy, M, N), tf32_2(x, M, K));
    }
    // the recipe: x and dy 1 × 128 for forward and input gradient; weight gradient dy 128 × 1 with x 128 × 128
    // (dense) or both 128 × 1 within each expert (grouped)
    float *xr = rounded_copy(x, M, K, FP8_ROWS, NULL, 0), *dyr = rounded_copy(dy, M, N, FP8_ROWS, NULL, 0),
          *dyc = rounded_copy(dy, M, N, FP8_COLS, offs, E),
          *xw = rounded_copy(x, M, K, offs ? FP8_COLS : FP8_TILES, offs, E);
    double *ry = xmalloc(M * N * 8), *rdx = xmalloc(M * K * 8), *rdw = xmalloc(En * N * K * 8);
    double *ty = xmalloc(M * N * 8), *tdx = xmalloc(M * K * 8), *tdw = xmalloc(En * N * K * 8);
    for (int64_t e = 0; e < En; e++) {
        int64_t r0 = offs ? offs[e] : 0, m = offs ? offs[e + 1] - r0 : M;
        const float *we = wq + e * N * K, *wt = w + e * N * K;
        gemm64(ry + r0 * N, xr + r0 * K, we, m, N, K, false, false);
        gemm64(rdx + r0 * K, dyr + r0 * N, we, m, K, N, false, true);
        gemm64(rdw + e * N * K, dyc + r0 * N, xw + r0 * K, N, K, m, true, true);
        // the exact layer: y = x·wᵀ, dx = dy·w, dw = dyᵀ·x on the unrounded operands, in fp64
        float *wtt = xmalloc(N * K * 4);
        for (int64_t j = 0; j < N; j++)
            for (int64_t k = 0; k < K; k++) wtt[k * N + j] = wt[j * K + k];
        gemm64(ty + r0 * N, x + r0 * K, wt, m, N, K, false, false);
        gemm64(tdx + r0 * K, dy + r0 * N, wtt, m, K, N, false, false);
        gemm64(tdw + e * N * K, dy + r0 * N, x + r0 * K, N, K, m, true, true);
        free(wtt);
    }
    ASSERT(rel_mixed(y, ry, M * N) < 1e-6 && rel_mixed(dx, rdx, M * K) < 1e-6 && rel_mixed(dw, rdw, En * N * K) < 1e-6);
    double cy = calc_diff(y, ty, M * N), cx = calc_diff(dx, tdx, M * K), cw = calc_diff(dw, tdw, En * N * K);
    printf("     fp8 %s M %lld N %lld K %lld: calc_diff against the exact layer y %.1e dx %.1e dw %.1e\n",
           offs ? "grouped" : "dense", (long long)M, (long long)N, (long long)K, cy, cx, cw);
    ASSERT(cy < 2e-3 && cx < 2e-3 && cw < 2e-3); // E4M3: ≤ 2^-4 relative per operand
    free(x), free(w), free(dy), free(wq), free(w8b), free(y), free(dx), free(dw), free(xr), free(dyr), free(dyc);
    free(xw), free(xt), free(slot);
    free(ry), free(rdx), free(rdw), free(ty), free(tdx), free(tdw);
}

// A dense weight's codes and scales (ops.h, Fp8Weight): q the codes of its 128 × 128 blocks, qt their transpose, s
// and st the block scales in the padded BLK128x128 layouts (zeros in the padding), q·s the rounded weight.
TEST(fp8_weight_codes_transpose_and_scale_layouts) {
    const int64_t N = 300, K = 136, NB = 3, KB = 2; // ragged blocks; KB4 = 4, NB4 = 4
    float *w = xmalloc(N * K * 4), *s = xmalloc(NB * KB * 4), *y = xmalloc(N * K * 4), *r = xmalloc(N * K * 4);
    fill_normal(w, N * K, 0.5f);
    for (int64_t i = 0; i < 40; i++) w[(i * 37 % 300) * K + i * 3] *= 40; // blocks with differing scales
    uint8_t *q = xmalloc(N * K);
    cpu_fp8_quantize(tensor_make(q, DT_U8, DEV_CPU, 2, N, K, 1, 1), tf32_2(s, NB, KB), tf32_2(w, N, K), FP8_TILES, NULL,
                     0);
    ASSERT(op_fp8_weight_bytes(N, K) == 2 * 40960 + 256 + 256); // N·K = 40800 bytes of codes, each part aligned
    void *b = xmalloc(op_fp8_weight_bytes(N, K));
    memset(b, 0xff, op_fp8_weight_bytes(N, K));
    Fp8Weight fw = op_fp8_weight_view(b, DEV_CPU, N, K);
    ASSERT(fw.s.n[0] == NB && fw.s.n[1] == 4 && fw.st.n[0] == KB && fw.st.n[1] == 4);
    op_fp8_weight_make(fw, tf32_2(w, N, K));
    const uint8_t *fq = fw.q.p, *fqt = fw.qt.p;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) ASSERT(fq[n * K + k] == q[n * K + k] && fqt[k * N + n] == q[n * K + k]);
    for (int64_t nb = 0; nb < NB; nb++)
        for (int64_t kb = 0; kb < 4; kb++) ASSERT(F(fw.s)[nb * 4 + kb] == (kb < KB ? s[nb * KB + kb] : 0));
    for (int64_t kb = 0; kb < KB; kb++)
        for (int64_t nb = 0; nb < 4; nb++) ASSERT(F(fw.st)[kb * 4 + nb] == (nb < NB ? s[nb * KB + kb] : 0));
    cpu_fp8_weight_values(tf32_2(y, N, K), fw);
    op_fp8_round(tf32_2(r, N, K), tf32_2(w, N, K), FP8_TILES, (Tensor){0});
    ASSERT(!memcmp(y, r, N * K * 4));
    free(w), free(s), free(y), free(r), free(q), free(b);
}

TEST(fp8_linear_recipe_and_gradients) {
    check_fp8_linear(150, 136, 200, NULL, 0); // ragged blocks in every dimension
    int64_t offs[5] = {0, 40, 40, 190, 200};  // an empty expert, one of 150 rows (two token blocks)
    check_fp8_linear(200, 72, 136, offs, 4);
}

// ---- the model in FP8 ----

// One forward and backward (2 × 12 tokens, force-balanced routing) of a tiny model of config `json` on the CPU from
// fixed weights; *loss gets Σ CE; returns the gradient (both groups, concatenated; the caller frees it). With ref
// (the fp32 run's gradient) it runs in FP8: its GEMM counts go to gemms, the worst tensor's calc_diff against ref to
// *worst (its name to wname).
static float *fp8_family_step(const char *json, const float *ref, double *loss, int64_t gemms[FP8_SLOTS], double *worst,
                              char wname[96]) {
    enum { B = 2, S = 12 };
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, write_text(test_tmpdir(), "config.json", json));
    Model m;
    model_create(&m, fam, &mc, DEV_CPU, DT_F32, S);
    m.force_balance = true;
    for (int g = 0; g < NGROUPS; g++) params_init(&m.params, g, m.w[g].p, 7, 0.05, mc.layers);
    for (int i = 0; i < m.params.n; i++) { // norm weights away from their init, so every path carries signal
        const ParamInfo *p = &m.params.p[i];
        if (p->init == INIT_ONES || p->init == INIT_ZEROS)
            for (int64_t j = 0; j < params_numel(p); j++)
                ((float *)m.w[p->group].p)[p->off + j] += (float)(0.3 * rng_normal(99, rng_hash_str(p->name), j));
    }
    if (ref) model_fp8_setup(&m);
    Chunk e;
    StepSums st;
    step_sums_create(&st, &m, true);
    chunk_init_model(&e, &m, &st, B, S);
    int32_t tok[B * S], lab[B * S];
    for (int t = 0; t < B * S; t++)
        tok[t] = (int32_t)(rng_u64(5, 1, t) % mc.vocab), lab[t] = (int32_t)(rng_u64(5, 2, t) % mc.vocab);
    chunk_load(&e, 0, tok, lab);
    model_zero_grads(&m);
    step_sums_begin(&st, &m);
    chunk_forward(&e, 0, true);
    chunk_backward(&e, 0, false);
    *loss = op_read_scalar(st.loss_sum);
    int64_t n0 = tensor_numel(m.g[0]), n1 = tensor_numel(m.g[1]);
    float *g = xmalloc((n0 + n1) * sizeof(float));
    memcpy(g, m.g[0].p, n0 * sizeof(float)), memcpy(g + n0, m.g[1].p, n1 * sizeof(float));
    if (ref) {
        *worst = 0;
        for (int i = 0; i < m.params.n; i++) {
            const ParamInfo *p = &m.params.p[i];
            int64_t o = (p->group ? n0 : 0) + p->off;
            double ab = 0, aa = 0;
            for (int64_t j = o; j < o + params_numel(p); j++)
                ab += (double)g[j] * ref[j], aa += (double)g[j] * g[j] + (double)ref[j] * ref[j];
            double cd = aa > 0 ? 1 - 2 * ab / aa : 0;
            if (cd > *worst) *worst = cd, snprintf(wname, 96, "%s", p->name);
        }
        // every cached slot ran its three GEMMs (forward, input gradient, weight gradient) in each layer that has it
        for (int s = 0; s < FP8_SLOTS; s++) {
            int64_t held = 0;
            for (int l = 0; l < mc.layers; l++) held += m.fp8.off[s][l] >= 0;
            ASSERT_MSG(m.fp8.gemms[s] == 3 * held, "%s: slot %d ran %lld FP8 GEMMs, %lld layers hold it", json, s,
                       (long long)m.fp8.gemms[s], (long long)held);
            gemms[s] = m.fp8.gemms[s];
        }
    }
    chunk_free(&e), step_sums_free(&st);
    model_free(&m);
    return g;
}

// Every projection PithTrain runs in FP8 runs in FP8 on each family (counted per slot: a call left on op_linear_* or a slot
// the family does not name fails), and the FP8 model's loss and gradient are the fp32 model's within the FP8 error
// (whose own gradient test_model.c checks against finite differences; the emulation's rounding is piecewise
// constant, so finite differences of it measure the rounding steps, not a gradient). want: the slots each family has.
TEST(fp8_family_projections_run_in_fp8) {
    static const char *const dsv2_lora =
        "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
        " \"q_lora_rank\": 10, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": "
        "6,"
        " \"vocab_size\": 40, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 6,"
        " \"n_shared_experts\": 2, \"intermediate_size\": 12, \"first_k_dense_replace\": 1, \"attention_bias\": true}";
    static const char *const dsv2_q =
        "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
        " \"q_lora_rank\": null, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 4, "
        "\"v_head_dim\": 8,"
        " \"vocab_size\": 40, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 6,"
        " \"n_shared_experts\": 1, \"intermediate_size\": 12, \"first_k_dense_replace\": 1}";
    static const char *const gpt_oss = // attention and expert biases, sinks, a sliding layer, the clamped SwiGLU
        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 40, \"num_local_experts\": 4,"
        " \"num_experts_per_tok\": 2, \"intermediate_size\": 6, \"sliding_window\": 3, \"swiglu_limit\": 2.0,"
        " \"layer_types\": [\"sliding_attention\", \"full_attention\"]}";
    enum { GU = 1 << FP8_GATE_UP, DN = 1 << FP8_DOWN, QKVO = 1 << FP8_Q | 1 << FP8_K | 1 << FP8_V | 1 << FP8_O };
    enum { SH = 1 << FP8_SHARED_GU | 1 << FP8_SHARED_DOWN, MLA = 1 << FP8_KV_A | 1 << FP8_KV_B | 1 << FP8_O };
    static const struct {
        const char *json;
        int want;
    } fams[] = {{TINY_MOE_B, GU | DN | QKVO}, // attention biases, a dense layer
                {dsv2_lora, GU | DN | MLA | 1 << FP8_Q_A | 1 << FP8_Q_B | SH},
                {dsv2_q, GU | DN | MLA | 1 << FP8_Q | SH},
                {TINY_Q35_GPU, GU | DN | QKVO | 1 << FP8_QKV | 1 << FP8_Z | 1 << FP8_OUT | SH},
                {gpt_oss, GU | DN | QKVO}};
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        double l32, l8, worst;
        int64_t gemms[FP8_SLOTS];
        char wname[96] = "";
        float *g32 = fp8_family_step(fams[f].json, NULL, &l32, NULL, NULL, NULL),
              *g8 = fp8_family_step(fams[f].json, g32, &l8, gemms, &worst, wname);
        int have = 0;
        for (int s = 0; s < FP8_SLOTS; s++) have |= (gemms[s] > 0) << s;
        ASSERT_MSG(have == fams[f].want, "%s: FP8 slots 0x%x, expected 0x%x", fams[f].json, have, fams[f].want);
        printf("     %.40s…: loss %.6f vs fp32 %.6f (%.1e), worst tensor's gradient calc_diff %.1e (%s)\n",
               fams[f].json, l8, l32, fabs(l8 - l32) / l32, worst, wname);
        ASSERT(fabs(l8 - l32) <= 0.01 * l32 && l8 != l32 && worst <= 5e-2 && worst > 0);
        free(g32), free(g8);
    }
}

// The warning for cached weights the FP8 tensor cores do not take (model_fp8_warn_rounded; by shape, so no GPU is
// needed to plan it): on the benchmarks' models for the GPU, GPT-OSS-20B's experts (2880 wide, not a multiple of 128)
// in both slots and nothing else; nothing on the CPU, which emulates every GEMM.
TEST(fp8_warns_of_weights_off_the_tensor_cores) {
    static const struct {
        const char *model;
        int gpu;
    } runs[] = {{"bench/gpt_oss_20b_4l/model.json", 2},
                {"bench/qwen3_30b_a3b_8l/model.json", 0},
                {"bench/deepseek_v2_lite_8l/model.json", 0},
                {"bench/qwen3_5_8l/model.json", 0}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        for (int g = 0; g < 2; g++) {
            ModelConfig mc;
            const ModelFamily *fam = model_config_load(&mc, runs[i].model);
            Model m;
            model_describe(&m, fam, &mc, g ? DEV_CUDA : DEV_CPU, DT_BF16, 4096);
            model_fp8_setup(&m);
            int n = model_fp8_warn_rounded(&m, runs[i].model);
            int want = g ? runs[i].gpu : 0;
#ifndef PITH_CUDA
            if (g) want = n; // a build without CUDA cannot tell its tensor cores: the GPU rows say nothing there
#endif
            ASSERT_MSG(n == want, "%s on the %s: %d slots warned of, expected %d", runs[i].model, g ? "GPU" : "CPU", n,
                       want);
            model_free(&m);
        }
}

// A run folder with FP8_TEST_MODEL: one step, micro-batches of 2 × 32 tokens, global batch 4.
static const char *make_fp8_run(void) {
    static char d[256];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    write_text(d, "model.json", FP8_TEST_MODEL);
    char out[8192];
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/data.bin --vocab 64 --tokens 20000", PITH_BIN, d) == 0);
    write_text(d, "train.json",
               "{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 32, "
               "\"micro_batch_size\": 2, \"global_batch_size\": 4, \"max_steps\": 1, \"device\": \"cpu\", "
               "\"init_std\": 0.05, \"optimizer\": {\"lr\": 0.01}, \"parallel\": {\"timeout_s\": 60}}");
    return d;
}

// Trains run `name` of folder d; returns the plan's total bytes (the "plan (...)" line of rank 0).
static double train_one(const char *d, const char *name, const char *launch, const char *sets) {
    static char out[1 << 16];
    int rc = run_cmd(out, sizeof out, "%s %s/train.json %s --set run_dir=%s/%s --dump-grads %s/%s/g", launch, d, sets,
                     d, name, d, name);
    ASSERT_MSG(rc == 0, "%s: %s", name, out);
    const char *p = strstr(out, "plan ("), *q = p ? strstr(p, " MB (") : NULL;
    ASSERT_MSG(q, "%s: no plan line: %s", name, out);
    return atof(q + 5);
}

// Step 1 in FP8 against fp32 on the CPU: the loss within 1%, the gradient within calc_diff 5e-2 (the GPU suite
// checks the same against bf16) — every tensor's under force-balanced routing; with learned routing the whole
// gradient's, since a token whose top-k flips between near-equal experts moves a nearly idle expert's gradient
// far. Two ep ranks in FP8 equal one FP8 process: the forward's blocks are the same under every layout (the loss
// agrees to fp32 sums); the weight gradients' 128-token blocks hold the rows an expert receives from both ranks'
// micro-batches at once, so they agree within FP8 rounding, not bit for bit.
TEST(fp8_model_step_against_fp32_and_ep2) {
    const char *d = make_fp8_run(), *wn, *one;
    char cmd[400], a[300], b[300];
    snprintf(cmd, sizeof cmd, "%s train", PITH_BIN), one = cmd;
    double plan32 = train_one(d, "f32", one, ""), plan8 = train_one(d, "fp8", one, "--set fp8=true");
    // the plan counts the weight cache: the codes and scales of the experts', 2 MoE layers of 8 (gate_up 256 × 256,
    // down 256 × 128), of the dense layer's (512 × 256, 256 × 256) and of each layer's q, k, v (128 × 256, 64 × 256
    // twice) and o (256 × 128), and nothing else: FP8's experts gather their input like fp32's (moe_stage3_gathers),
    // so neither makes xe
    double attn = op_fp8_weight_bytes(128, 256) + 2.0 * op_fp8_weight_bytes(64, 256) + op_fp8_weight_bytes(256, 128);
    ASSERT_MSG(plan8 - plan32 == 2.0 * (op_fp8_experts_bytes(8, 256, 256) + op_fp8_experts_bytes(8, 256, 128)) +
                                     op_fp8_weight_bytes(512, 256) + op_fp8_weight_bytes(256, 256) + 3 * attn,
               "%.0f vs %.0f", plan8, plan32);
    train_one(d, "f32-bal", one, "--set benchmark=true");
    train_one(d, "fp8-bal", one, "--set benchmark=true --set fp8=true");
    char launch[400];
    snprintf(launch, sizeof launch, "PITH=%s scripts/launch.sh -n 2", PITH_BIN);
    train_one(d, "fp8-ep2", launch, "--set fp8=true --set parallel.expert_parallel_size=2");
    static const char *const runs[][2] = {{"fp8", "f32"}, {"fp8-bal", "f32-bal"}, {"fp8-ep2", "fp8"}};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", d, runs[i][0]), snprintf(b, sizeof b, "%s/%s", d, runs[i][1]);
        double la = run_metric(a, 1, "loss"), lb = run_metric(b, 1, "loss"), all;
        snprintf(a, sizeof a, "%s/%s/g", d, runs[i][0]), snprintf(b, sizeof b, "%s/%s/g", d, runs[i][1]);
        double worst = grad_calc_diff(a, b, &wn, &all);
        printf("     %-7s vs %-7s step 1 loss %.7f vs %.7f (%.1e); gradient calc_diff %.1e, worst tensor %.1e (%s)\n",
               runs[i][0], runs[i][1], la, lb, fabs(la - lb) / lb, all, worst, wn);
        if (i < 2) { // FP8 against fp32
            ASSERT(fabs(la - lb) <= 0.01 * lb && la != lb);
            ASSERT(all <= 5e-2 && all > 0 && (i == 0 || worst <= 5e-2));
        } else { // ep2 against one process, both FP8
            ASSERT(fabs(la - lb) <= 1e-6 * lb);
            ASSERT(all <= 1e-3);
        }
    }
}

// FP8 under the pipeline (pp2: DualPipeV's 4 chunks, so FP8_TEST_MODEL with a fourth layer) and under FSDP (dp2)
// equals one FP8 process: every GEMM sees the micro-batches' own rows as in one process, so the FP8 blocks and their
// scales are the same; what may differ is the order in which the micro-batches' gradients are summed (dp2's
// reduce-scatter across the ranks), fp32 rounding. Measured: pp2 bit for bit, dp2 calc_diff 5e-15 (bound 1e-12).
TEST(fp8_model_pp2_and_dp2_equal_one_process) {
    const char *d = make_fp8_run(), *wn;
    char model[sizeof FP8_TEST_MODEL + 8], *p, cmd[400], launch[400], a[300], b[300];
    snprintf(model, sizeof model, "%s", FP8_TEST_MODEL);
    ASSERT((p = strstr(model, "\"num_hidden_layers\": 3")));
    p[strlen("\"num_hidden_layers\": ")] = '4';
    write_text(d, "model4.json", model);
    char sets[400], pp[500];
    snprintf(sets, sizeof sets, "--set fp8=true --set model=%s/model4.json --set global_batch_size=8", d);
    snprintf(pp, sizeof pp, "%s --set parallel.pipeline_parallel_size=2", sets);
    snprintf(cmd, sizeof cmd, "%s train", PITH_BIN);
    snprintf(launch, sizeof launch, "PITH=%s scripts/launch.sh -n 2", PITH_BIN);
    train_one(d, "one", cmd, sets), train_one(d, "pp2", launch, pp), train_one(d, "dp2", launch, sets);
    static const char *const runs[] = {"pp2", "dp2"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s", d, runs[i]), snprintf(b, sizeof b, "%s/one", d);
        double la = run_metric(a, 1, "loss"), lb = run_metric(b, 1, "loss"), all;
        snprintf(a, sizeof a, "%s/%s/g", d, runs[i]), snprintf(b, sizeof b, "%s/one/g", d);
        double worst = grad_calc_diff(a, b, &wn, &all);
        printf(
            "     fp8-%s vs one process: step 1 loss %.7f vs %.7f (%.1e); gradient calc_diff %.1e, worst tensor %.1e "
            "(%s)\n",
            runs[i], la, lb, fabs(la - lb) / lb, all, worst, wn);
        ASSERT(fabs(la - lb) <= 1e-6 * lb && worst <= 1e-12);
    }
}
