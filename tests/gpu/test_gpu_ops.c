// test_gpu_ops.c — every CUDA op against the CPU op on fresh random inputs, forward and backward, in
// fp32 mode (tolerance 1e-5; 1e-4 for GEMMs, whose summation order differs) and bf16 mode (1e-2; the CPU
// reference runs on the same bf16-rounded inputs). Outputs are NaN before the op on both sides;
// accumulating outputs start from equal random values; NaN never passes.
#include "base/half.h"
#include "gpu_test.h"
#include "ops/cuda/cuda_ops.h"

#define MODES for (int mode_ = 0; mode_ < 2; mode_++)
#define MODE_DT (mode_ ? DT_BF16 : DT_F32)
#define TOL (mode_ ? 1e-2 : 1e-5)
#define GEMM_TOL (mode_ ? 1e-2 : 1e-4)

// ---- GEMMs ----
static void check_linear(DType dt, double tol, int64_t M, int64_t K, int64_t N) {
    Pair x = pair_rand(dt, 1, 2, M, K, 0, 0), w = pair_rand(dt, 0.5f, 2, N, K, 0, 0),
         b = pair_rand(dt, 1, 1, N, 0, 0, 0);
    Pair y = pair_nan(dt, 2, M, N, 0, 0);
    op_linear_forward(y.c, x.c, w.c, b.c), op_linear_forward(y.d, x.d, w.d, b.d);
    EXPECT_CLOSE(y, tol);
    Pair dy = pair_rand(dt, 1, 2, M, N, 0, 0), dx = pair_nan(dt, 2, M, K, 0, 0);
    op_linear_backward_input(dx.c, dy.c, w.c, false), op_linear_backward_input(dx.d, dy.d, w.d, false);
    EXPECT_CLOSE(dx, tol);
    op_linear_backward_input(dx.c, dy.c, w.c, true), op_linear_backward_input(dx.d, dy.d, w.d, true);
    EXPECT_CLOSE(dx, tol);
    Pair dw = pair_rand(DT_F32, 1, 2, N, K, 0, 0), db = pair_rand(DT_F32, 1, 1, N, 0, 0, 0);
    op_linear_backward_weight(dw.c, db.c, dy.c, x.c, true), op_linear_backward_weight(dw.d, db.d, dy.d, x.d, true);
    EXPECT_CLOSE(dw, tol);
    EXPECT_CLOSE(db, tol);
    // no bias: y = x·wᵀ, dw accumulates again
    op_linear_forward(y.c, x.c, w.c, NONE), op_linear_forward(y.d, x.d, w.d, NONE);
    EXPECT_CLOSE(y, tol);
    op_linear_backward_weight(dw.c, NONE, dy.c, x.c, true), op_linear_backward_weight(dw.d, NONE, dy.d, x.d, true);
    EXPECT_CLOSE(dw, tol);
    Pair dws = pair_nan(DT_F32, 2, N, K, 0, 0); // written, not added: over NaN
    op_linear_backward_weight(dws.c, NONE, dy.c, x.c, false), op_linear_backward_weight(dws.d, NONE, dy.d, x.d, false);
    EXPECT_CLOSE(dws, tol);
    if (dt != DT_BF16) return;
    // mixed: fp32 logits from bf16 operands; fp32 logits gradients against bf16 weights and activations
    Pair y32 = pair_nan(DT_F32, 2, M, N, 0, 0), dy32 = pair_rand(DT_F32, 1, 2, M, N, 0, 0);
    op_linear_forward(y32.c, x.c, w.c, NONE), op_linear_forward(y32.d, x.d, w.d, NONE);
    EXPECT_CLOSE(y32, tol);
    op_linear_backward_input(dx.c, dy32.c, w.c, true), op_linear_backward_input(dx.d, dy32.d, w.d, true);
    EXPECT_CLOSE(dx, tol);
    op_linear_backward_weight(dw.c, NONE, dy32.c, x.c, true), op_linear_backward_weight(dw.d, NONE, dy32.d, x.d, true);
    EXPECT_CLOSE(dw, tol);
}

TEST(gpu_op_linear) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        check_linear(MODE_DT, GEMM_TOL, 37, 70, 53);
        check_linear(MODE_DT, GEMM_TOL, 256, 512, 384);
        check_linear(MODE_DT, GEMM_TOL, 1, 16, 8);
    }
    gpu_report();
}

// cuBLASLt's algorithm for a product is asked for once and cached (cuda_gemm.cu): 48 products of distinct shapes
// (more than a step of a model runs; in one slot per hash, 48 keys collide with probability 0.99), then again — the
// second round asks the heuristic nothing. The cache starts empty: the suite's earlier tests have filled slots with
// their own shapes (the whole suite in one process evicted 4 of the 48 in a table of 256 slots).
TEST(gpu_op_linear_algo_cache) {
    gpu_begin();
    gpu_mode(DT_BF16);
    cuda_gemm_cache_clear();
    size_t mark = gpu_mark();
    Tensor x = gpu_tensor(DT_BF16, 2, 64, 64, 0, 0), w = gpu_tensor(DT_BF16, 2, 48 * 8, 64, 0, 0),
           y = gpu_tensor(DT_BF16, 2, 64, 48 * 8, 0, 0);
    op_zero(x), op_zero(w);
    int64_t asked[2];
    for (int round = 0; round < 2; round++) {
        int64_t q0 = cuda_grouped_calls("heuristic");
        for (int i = 1; i <= 48; i++) // y (64, 8i) = x · w[:8i]ᵀ: the product's m is 8i
            op_linear_forward(tensor_make(y.p, DT_BF16, DEV_CUDA, 2, 64, 8 * i, 1, 1), x,
                              tensor_make(w.p, DT_BF16, DEV_CUDA, 2, 8 * i, 64, 1, 1), NONE);
        asked[round] = cuda_grouped_calls("heuristic") - q0;
    }
    printf("     48 products: the heuristic asked %lld times, then %lld\n", (long long)asked[0], (long long)asked[1]);
    ASSERT_MSG(asked[0] > 0 && asked[1] == 0, "the algorithm cache: %lld, then %lld queries", (long long)asked[0],
               (long long)asked[1]);
    gpu_release(mark);
    gpu_report();
}

// 5 experts, one empty, one with a single row; with bias (GPT-OSS): y_e += b_e after whichever product path
// ran, db_e += Σ_rows dy (fp32).
static void check_grouped(DType dt, double tol, int64_t R, bool bias) {
    const int64_t offs[6] = {0, 7, 7, 20, 21, R};
    Pair po = pair_offs(offs, 6);
    int64_t K = 24, N = 36;
    Pair x = pair_rand(dt, 1, 2, R, K, 0, 0), w = pair_rand(dt, 0.5f, 3, 5, N, K, 0), y = pair_nan(dt, 2, R, N, 0, 0);
    Pair b = bias ? pair_rand(dt, 1, 2, 5, N, 0, 0) : NOPAIR, db = bias ? pair_rand(DT_F32, 1, 2, 5, N, 0, 0) : NOPAIR;
    op_grouped_linear_forward(y.c, x.c, NONE, 0, w.c, b.c, po.c),
        op_grouped_linear_forward(y.d, x.d, NONE, 0, w.d, b.d, po.d);
    EXPECT_CLOSE(y, tol);
    Pair dy = pair_rand(dt, 1, 2, R, N, 0, 0), dx = pair_nan(dt, 2, R, K, 0, 0),
         dw = pair_rand(DT_F32, 1, 3, 5, N, K, 0);
    op_grouped_linear_backward_input(dx.c, dy.c, w.c, po.c), op_grouped_linear_backward_input(dx.d, dy.d, w.d, po.d);
    EXPECT_CLOSE(dx, tol);
    op_grouped_linear_backward_weight(dw.c, db.c, dy.c, x.c, NONE, 0, po.c, true),
        op_grouped_linear_backward_weight(dw.d, db.d, dy.d, x.d, NONE, 0, po.d, true);
    EXPECT_CLOSE(dw, tol);
    if (bias) EXPECT_CLOSE(db, tol);
}

TEST(gpu_op_grouped_linear) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        check_grouped(MODE_DT, GEMM_TOL, 40, false);
    }
    gpu_report();
}

TEST(gpu_op_grouped_linear_bias) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        check_grouped(MODE_DT, GEMM_TOL, 40, true);
        check_grouped(MODE_DT, GEMM_TOL, 300, true);
    }
    gpu_report();
}

// ---- norm, RoPE, SwiGLU ----
static void check_rmsnorm(DType dt, double tol, int64_t R, int64_t D) {
    size_t mark = gpu_mark(); // (the case's device tensors go at its end)
    Pair x = pair_rand(dt, 1.5f, 2, R, D, 0, 0), w = pair_rand(dt, 1, 1, D, 0, 0, 0), y = pair_nan(dt, 2, R, D, 0, 0);
    Pair rstd = pair_nan(DT_F32, 1, R, 0, 0, 0);
    op_rmsnorm_forward(y.c, rstd.c, x.c, w.c, 1e-6f, NULL), op_rmsnorm_forward(y.d, rstd.d, x.d, w.d, 1e-6f, NULL);
    EXPECT_CLOSE(y, tol);
    EXPECT_CLOSE(rstd, tol);
    Pair dy = pair_rand(dt, 1, 2, R, D, 0, 0), dx = pair_nan(dt, 2, R, D, 0, 0),
         dw = pair_rand(DT_F32, 1, 1, D, 0, 0, 0);
    op_rmsnorm_backward(dx.c, dw.c, dy.c, x.c, w.c, rstd.c, false, NULL),
        op_rmsnorm_backward(dx.d, dw.d, dy.d, x.d, w.d, rstd.d, false, NULL);
    EXPECT_CLOSE(dx, tol);
    EXPECT_CLOSE(dw, tol);
    op_rmsnorm_backward(dx.c, dw.c, dy.c, x.c, w.c, rstd.c, true, NULL),
        op_rmsnorm_backward(dx.d, dw.d, dy.d, x.d, w.d, rstd.d, true, NULL);
    EXPECT_CLOSE(dx, tol);
    EXPECT_CLOSE(dw, tol);
    gpu_release(mark);
}

TEST(gpu_op_rmsnorm) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        check_rmsnorm(MODE_DT, TOL, 37, 64);
        check_rmsnorm(MODE_DT, TOL, 600, 16); // the per-head q/k norm shape
        check_rmsnorm(MODE_DT, TOL, 5, 3000); // a wide hidden
        // the backward with ∂w fused over its 128 row groups: one vector a lane (groups of 257 rows, the last of
        // 206); 2 vectors a lane (groups of 40 rows, the last of 3, two empty); single columns, 1 and 8 a lane; a
        // vector past D (D = 24: lanes of 16 columns)
        check_rmsnorm(MODE_DT, TOL, 32845, 128);
        check_rmsnorm(MODE_DT, TOL, 5003, 512);
        check_rmsnorm(MODE_DT, TOL, 33001, 3);
        check_rmsnorm(MODE_DT, TOL, 3001, 250);
        check_rmsnorm(MODE_DT, TOL, 700, 24);
        // the two-kernel path over several groups (bf16 ungated: the one-pass kernel, below): more than 16 columns
        // a lane (6, 8 and 12 vectors), more than 8 single columns a lane
        check_rmsnorm(MODE_DT, TOL, 2000, 1536);
        check_rmsnorm(MODE_DT, TOL, 5003, 2048);
        check_rmsnorm(MODE_DT, TOL, 1030, 2880);
        check_rmsnorm(MODE_DT, TOL, 700, 300);
    }
    // the one-pass kernel at hidden widths (bf16): one warp a row (1536, 2048), two (2880, 3000: one group); it must
    // have run for each of the four shapes' two backwards
    int64_t n0 = cuda_norm_rows_calls();
    gpu_mode(DT_BF16);
    check_rmsnorm(DT_BF16, 1e-2, 2000, 1536);
    check_rmsnorm(DT_BF16, 1e-2, 5003, 2048);
    check_rmsnorm(DT_BF16, 1e-2, 1030, 2880);
    check_rmsnorm(DT_BF16, 1e-2, 5, 3000);
    ASSERT_MSG(cuda_norm_rows_calls() == n0 + 8, "the one-pass kernel ran %lld of 8 times",
               (long long)(cuda_norm_rows_calls() - n0));
    gpu_report();
}

// Plain RoPE tables (P, rd/2) of theta on both devices.
static void rope_tables(int64_t P, int64_t rd, float theta, Pair *c, Pair *s) {
    float *cs = xmalloc(P * rd / 2 * sizeof(float)), *sn = xmalloc(P * rd / 2 * sizeof(float));
    for (int64_t p = 0; p < P; p++)
        for (int64_t i = 0; i < rd / 2; i++) {
            float a = (float)p * powf(theta, -(float)(2 * i) / (float)rd);
            cs[p * rd / 2 + i] = cosf(a), sn[p * rd / 2 + i] = sinf(a);
        }
    *c = pair_from(DT_F32, cs, 2, P, rd / 2, 0, 0), *s = pair_from(DT_F32, sn, 2, P, rd / 2, 0, 0);
    free(cs), free(sn);
}

TEST(gpu_op_rope) {
    gpu_begin();
    int64_t T = 20, nh = 3, d = 16, P = 32;
    int32_t pos[20];
    for (int t = 0; t < T; t++) pos[t] = (int32_t)((t * 7 + 3) % P);
    MODES {
        gpu_mode(MODE_DT);
        Pair c, s, ps = pair_i32(pos, T);
        rope_tables(P, d, 10000.0f, &c, &s);
        Pair x = pair_rand(MODE_DT, 1, 3, T, nh, d, 0);
        op_rope(x.c, 0, c.c, s.c, ps.c, ROPE_HALF, false), op_rope(x.d, 0, c.d, s.d, ps.d, ROPE_HALF, false);
        EXPECT_CLOSE(x, TOL);
        op_rope(x.c, 0, c.c, s.c, ps.c, ROPE_HALF, true), op_rope(x.d, 0, c.d, s.d, ps.d, ROPE_HALF, true);
        EXPECT_CLOSE(x, TOL);
    }
    gpu_report();
}

// The per-head q/k norm with the RoPE after it in one op each way (RmsArgs.cos): Qwen3's 128-wide heads (32 a token,
// all rotated), Qwen3.5's 256-wide (the first 64 rotated), 1 + w, 3 heads a token, 31 tokens (a block's rows cut
// short). On both devices against the CPU; on the GPU the fused kernels bit for bit against
// the norm and then op_rope (the backward: op_rope's backward, then the norm's), and they must have run for every case
// of both modes.
static void check_norm_rope(DType dt, double tol, int64_t heads, int64_t d, int rd, bool one_p) {
    size_t mark = gpu_mark();
    int64_t T = 31, P = 40, R = T * heads;
    int32_t pos[31];
    for (int t = 0; t < T; t++) pos[t] = (int32_t)((t * 11 + 5) % P);
    Pair c, s;
    rope_tables(P, rd, 1e6f, &c, &s);
    Pair ps = pair_i32(pos, T), x = pair_rand(dt, 1, 2, R, d, 0, 0), w = pair_rand(dt, 0.5f, 1, d, 0, 0, 0);
    Pair y = pair_nan(dt, 2, R, d, 0, 0), rstd = pair_nan(DT_F32, 1, R, 0, 0, 0);
    RmsArgs ac = {.one_plus = one_p, .cos = c.c, .sin = s.c, .pos = ps.c, .heads = (int)heads}, ad = ac;
    ad.cos = c.d, ad.sin = s.d, ad.pos = ps.d;
    op_rmsnorm_forward(y.c, rstd.c, x.c, w.c, 1e-6f, &ac);
    op_rmsnorm_forward(y.d, rstd.d, x.d, w.d, 1e-6f, &ad);
    EXPECT_CLOSE(y, tol);
    EXPECT_CLOSE(rstd, tol);
    Tensor y2 = gpu_tensor(dt, 2, R, d, 0, 0), r2 = gpu_tensor(DT_F32, 1, R, 0, 0, 0);
    op_rmsnorm_forward(y2, r2, x.d, w.d, 1e-6f, &(RmsArgs){.one_plus = one_p});
    op_rope(tensor_make(y2.p, dt, DEV_CUDA, 3, T, heads, d, 1), 0, c.d, s.d, ps.d, ROPE_HALF, false);
    float *a = gpu_down(y.d), *b = gpu_down(y2);
    ASSERT_MSG(!memcmp(a, b, (size_t)R * d * sizeof(float)), "heads of %lld: the fused forward differs", (long long)d);
    free(a), free(b);
    // the backward (dy.c is the CPU op's scratch: turned back in place)
    Pair dy = pair_rand(dt, 1, 2, R, d, 0, 0), dx = pair_nan(dt, 2, R, d, 0, 0),
         dw = pair_rand(DT_F32, 1, 1, d, 0, 0, 0);
    Tensor dw2 = gpu_tensor(DT_F32, 1, d, 0, 0, 0), dx2 = gpu_tensor(dt, 2, R, d, 0, 0),
           dyu = gpu_tensor(dt, 2, R, d, 0, 0);
    op_copy(dw2, dw.d), op_copy(dyu, dy.d);
    op_rmsnorm_backward(dx.c, dw.c, dy.c, x.c, w.c, rstd.c, false, &ac);
    op_rmsnorm_backward(dx.d, dw.d, dy.d, x.d, w.d, rstd.d, false, &ad);
    EXPECT_CLOSE(dx, tol);
    EXPECT_CLOSE(dw, tol);
    op_rope(tensor_make(dyu.p, dt, DEV_CUDA, 3, T, heads, d, 1), 0, c.d, s.d, ps.d, ROPE_HALF, true);
    op_rmsnorm_backward(dx2, dw2, dyu, x.d, w.d, rstd.d, false, &(RmsArgs){.one_plus = one_p});
    float *e = gpu_down(dx.d), *f = gpu_down(dx2), *g = gpu_down(dw.d), *h = gpu_down(dw2);
    ASSERT_MSG(!memcmp(e, f, (size_t)R * d * sizeof(float)) && !memcmp(g, h, (size_t)d * sizeof(float)),
               "heads of %lld: the fused backward differs", (long long)d);
    free(e), free(f), free(g), free(h);
    gpu_release(mark);
}

TEST(gpu_op_rmsnorm_rope) {
    gpu_begin();
    int64_t n0 = cuda_norm_rope_calls();
    MODES {
        gpu_mode(MODE_DT);
        check_norm_rope(MODE_DT, TOL, 32, 128, 128, false);
        check_norm_rope(MODE_DT, TOL, 3, 256, 64, true);
    }
    ASSERT_MSG(cuda_norm_rope_calls() == n0 + 8, "the fused kernels ran %lld of 8 times",
               (long long)(cuda_norm_rope_calls() - n0));
    gpu_report();
}

// Both layouts on part of each head: Qwen3.5 (half, the first 64 of 256), MLA (pairs, the last 64 of 192), a
// whole pair-layout head; YaRN tables (an attention factor folded in: backward is the transpose).
static void check_rope(DType dt, double tol, RopeLayout layout, int64_t d, int off, int rd) {
    int64_t T = 20, nh = 3, P = 32;
    float *cs = xmalloc(P * rd / 2 * sizeof(float)), *sn = xmalloc(P * rd / 2 * sizeof(float));
    RopeSpec r = {.rd = rd, .theta = 10000, .yarn = true, .factor = 8, .orig_max_pos = 16, .truncate = true};
    op_rope_tables(tensor_make(cs, DT_F32, DEV_CPU, 2, P, rd / 2, 1, 1),
                   tensor_make(sn, DT_F32, DEV_CPU, 2, P, rd / 2, 1, 1), &r);
    int32_t pos[20];
    for (int t = 0; t < T; t++) pos[t] = (int32_t)((t * 7 + 3) % P);
    Pair c = pair_from(DT_F32, cs, 2, P, rd / 2, 0, 0), s = pair_from(DT_F32, sn, 2, P, rd / 2, 0, 0),
         ps = pair_i32(pos, T);
    Pair x = pair_rand(dt, 1, 3, T, nh, d, 0);
    op_rope(x.c, off, c.c, s.c, ps.c, layout, false), op_rope(x.d, off, c.d, s.d, ps.d, layout, false);
    EXPECT_CLOSE(x, tol);
    op_rope(x.c, off, c.c, s.c, ps.c, layout, true), op_rope(x.d, off, c.d, s.d, ps.d, layout, true);
    EXPECT_CLOSE(x, tol);
    free(cs), free(sn);
}

TEST(gpu_op_rope_forms) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        check_rope(MODE_DT, TOL, ROPE_HALF, 256, 0, 64);
        check_rope(MODE_DT, TOL, ROPE_PAIRS, 192, 128, 64);
        check_rope(MODE_DT, TOL, ROPE_PAIRS, 64, 0, 64);
        check_rope(MODE_DT, TOL, ROPE_HALF, 20, 4, 12); // unaligned: the scalar path
    }
    gpu_report();
}

TEST(gpu_op_swiglu) {
    gpu_begin();
    int64_t M = 33, I = 40;
    MODES {
        gpu_mode(MODE_DT);
        Pair gu = pair_rand(MODE_DT, 2, 2, M, 2 * I, 0, 0), act = pair_nan(MODE_DT, 2, M, I, 0, 0);
        op_swiglu_forward(act.c, gu.c, 0, 0), op_swiglu_forward(act.d, gu.d, 0, 0);
        EXPECT_CLOSE(act, TOL);
        Pair da = pair_rand(MODE_DT, 1, 2, M, I, 0, 0), dgu = pair_nan(MODE_DT, 2, M, 2 * I, 0, 0);
        op_swiglu_backward(dgu.c, da.c, gu.c, 0, 0), op_swiglu_backward(dgu.d, da.d, gu.d, 0, 0);
        EXPECT_CLOSE(dgu, TOL);
    }
    gpu_report();
}

// ---- attention ----

static const char *attention_fwd_path = "none"; // the path check_attention_args's GPU forward ran

// Every AttnArgs form: q (B·Sq, nh, dqk), k (B·Sk, nkv, dqk), v (B·Sk, nkv, dv); sinks random when asked.
static void check_attention_args(DType dt, double tol, int Sq, int Sk, int nh, int nkv, int dqk, int dv, AttnArgs a,
                                 bool sinks) {
    size_t mark = gpu_mark(); // (the case's device tensors go at its end)
    int B = a.B;
    int64_t Tq = (int64_t)B * Sq, Tk = (int64_t)B * Sk;
    Pair q = pair_rand(dt, 1, 3, Tq, nh, dqk, 0), k = pair_rand(dt, 1, 3, Tk, nkv, dqk, 0),
         v = pair_rand(dt, 1, 3, Tk, nkv, dv, 0);
    Pair sk = pair_rand(DT_F32, 1, 1, nh, 0, 0, 0), o = pair_nan(dt, 3, Tq, nh, dv, 0),
         lse = pair_nan(DT_F32, 3, B, nh, Sq, 0);
    AttnArgs ac = a, ad = a;
    if (sinks) ac.sinks = sk.c, ad.sinks = sk.d;
    op_attention_forward(o.c, lse.c, q.c, k.c, v.c, &ac), op_attention_forward(o.d, lse.d, q.d, k.d, v.d, &ad);
    attention_fwd_path = cuda_attention_last_path();
    EXPECT_CLOSE(o, tol);
    expect_lse(lse, tol);
    // the backward reads o and lse: give both sides the CPU's (rounded to dt), so only the backward differs
    Pair oc = pair_from(dt, o.c.p, 3, Tq, nh, dv, 0), lc = pair_from(DT_F32, lse.c.p, 3, B, nh, Sq, 0);
    Pair dout = pair_rand(dt, 1, 3, Tq, nh, dv, 0), ds = pair_rand(DT_F32, 1, 1, nh, 0, 0, 0);
    Pair dq = pair_nan(dt, 3, Tq, nh, dqk, 0), dk = pair_nan(dt, 3, Tk, nkv, dqk, 0),
         dvv = pair_nan(dt, 3, Tk, nkv, dv, 0);
    op_attention_backward(dq.c, dk.c, dvv.c, sinks ? ds.c : NONE, dout.c, q.c, k.c, v.c, oc.c, lc.c, &ac);
    op_attention_backward(dq.d, dk.d, dvv.d, sinks ? ds.d : NONE, dout.d, q.d, k.d, v.d, oc.d, lc.d, &ad);
    EXPECT_CLOSE(dq, tol);
    EXPECT_CLOSE(dk, tol);
    EXPECT_CLOSE(dvv, tol);
    if (sinks) EXPECT_CLOSE(ds, tol);
    gpu_release(mark);
}

static void check_attention(DType dt, double tol, int B, int S, int nh, int nkv, int d) {
    AttnArgs a = {.B = B, .scale = 1.0f / sqrtf((float)d), .causal = true};
    check_attention_args(dt, tol, S, S, nh, nkv, d, d, a, false);
}

TEST(gpu_op_attention) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        check_attention(MODE_DT, TOL, 2, 77, 4, 2, 8);
        check_attention(MODE_DT, TOL, 2, 40, 4, 4, 16);
        check_attention(MODE_DT, TOL, 1, 150, 4, 1, 32);
        check_attention(MODE_DT, TOL, 2, 77, 4, 2, 64);
        check_attention(MODE_DT, TOL, 1, 200, 2, 1, 128);
    }
    gpu_report();
}

// GPT-OSS's forms run cuDNN's fused kernels in bf16 (where the build has cuDNN: the window as a mask, the sinks
// as a correction; without it our tensor-core kernels at head dims 64 and 128, tc), our generic kernels in fp32;
// both directions of the last check_attention_args.
static void expect_attention_paths(int bf16, bool tc, const char *what) {
    const char *bwd = cuda_attention_last_path(), *want = "generic";
#ifdef PITH_CUDNN
    if (bf16) want = "cudnn";
    (void)tc;
#else
    if (bf16 && tc) want = "flash";
#endif
    printf("     %s %s: forward %s, backward %s\n", what, bf16 ? "bf16" : "fp32", attention_fwd_path, bwd);
    ASSERT_MSG(!strcmp(attention_fwd_path, want) && !strcmp(bwd, want), "%s ran %s/%s, not %s", what,
               attention_fwd_path, bwd, want);
}

// The widened forms on our generic kernels (and whatever faster path takes them): MLA's 192/128 head dims,
// GPT-OSS's window and sinks, ring attention's blocks at offsets (a causal pair where the first queries see
// nothing; a query block against a key block, all visible).
TEST(gpu_op_attention_forms) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        float s192 = 1.0f / sqrtf(192.0f), s64 = 0.125f;
        check_attention_args(MODE_DT, TOL, 90, 90, 4, 4, 192, 128, (AttnArgs){.B = 2, .scale = s192, .causal = true},
                             false);
        printf("     MLA 192/128 %s: the backward ran %s\n", mode_ ? "bf16" : "fp32", cuda_attention_last_path());
        check_attention_args(MODE_DT, TOL, 70, 70, 4, 2, 32, 16, (AttnArgs){.B = 2, .scale = 0.2f, .causal = true},
                             false);
        check_attention_args(MODE_DT, TOL, 200, 200, 8, 2, 64, 64,
                             (AttnArgs){.B = 1, .scale = s64, .causal = true, .window = 37}, true);
        check_attention_args(MODE_DT, TOL, 100, 100, 4, 2, 64, 64, (AttnArgs){.B = 2, .scale = s64, .causal = true},
                             true);
        // gpt-oss-20b's forms: head dim 64, 8 query heads per kv head, sinks; its sliding layers' window 128 over
        // 300 tokens (not a tile multiple), its full layers causal
        check_attention_args(MODE_DT, TOL, 300, 300, 16, 2, 64, 64,
                             (AttnArgs){.B = 2, .scale = s64, .causal = true, .window = 128}, true);
        expect_attention_paths(mode_, true, "window 128 + sinks");
        check_attention_args(MODE_DT, TOL, 300, 300, 16, 2, 64, 64, (AttnArgs){.B = 2, .scale = s64, .causal = true},
                             true);
        expect_attention_paths(mode_, true, "causal + sinks");
        check_attention_args(MODE_DT, TOL, 129, 129, 16, 2, 64, 64,
                             (AttnArgs){.B = 1, .scale = s64, .causal = true, .window = 128}, true);
        expect_attention_paths(mode_, true, "window 128 + sinks, 129 tokens");
        // the sinks' gradient over 64 × 131 rows, more than its first pass has blocks: several rows a block, and a
        // last block that ends within a warp's step
        check_attention_args(MODE_DT, TOL, 131, 131, 32, 4, 64, 64,
                             (AttnArgs){.B = 64, .scale = s64, .causal = true, .window = 8}, true);
        check_attention_args(MODE_DT, TOL, 64, 64, 4, 2, 64, 64,
                             (AttnArgs){.B = 2, .scale = s64, .causal = true, .q_off = 64, .k_off = 100}, false);
        check_attention_args(MODE_DT, TOL, 48, 96, 4, 2, 64, 64, (AttnArgs){.B = 2, .scale = s64, .q_off = 96}, false);
        check_attention_args(MODE_DT, TOL, 50, 80, 4, 4, 192, 128, (AttnArgs){.B = 1, .scale = s192, .k_off = 40},
                             false);
        // Qwen3.5's gated full attention: head dim 256, 8 query heads per kv head, causal (cuDNN takes d ≤ 256 on
        // Hopper forward and backward)
        check_attention_args(MODE_DT, TOL, 150, 150, 16, 2, 256, 256,
                             (AttnArgs){.B = 2, .scale = 0.0625f, .causal = true}, false);
        expect_attention_paths(mode_, false, "head dim 256");
    }
    gpu_report();
}

// Ring attention's log-sum-exp merge: a partial whose rows are partly empty (lse −∞) into an accumulator whose rows
// are partly empty, then an overwriting merge (init), from the same inputs on both sides.
TEST(gpu_op_attention_merge) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        int B = 2, Sq = 37, nh = 4, dv = 24;
        int64_t n = (int64_t)B * nh * Sq;
        float *l1 = xmalloc(n * sizeof(float)), *l2 = xmalloc(n * sizeof(float));
        fill_normal(l1, n, 2), fill_normal(l2, n, 2);
        for (int64_t i = 0; i < n; i += 5) l1[i] = -INFINITY;
        for (int64_t i = 0; i < n; i += 7) l2[i] = -INFINITY;
        Pair o = pair_rand(DT_F32, 1, 3, B * Sq, nh, dv, 0), op = pair_rand(MODE_DT, 1, 3, B * Sq, nh, dv, 0);
        Pair lse = pair_from(DT_F32, l1, 3, B, nh, Sq, 0), lp = pair_from(DT_F32, l2, 3, B, nh, Sq, 0);
        for (int init = 0; init < 2; init++) {
            op_attention_merge(o.c, lse.c, op.c, lp.c, B, init), op_attention_merge(o.d, lse.d, op.d, lp.d, B, init);
            EXPECT_CLOSE(o, TOL);
            expect_lse(lse, TOL);
        }
        free(l1), free(l2);
    }
    gpu_report();
}

// The tensor-core path (bf16, d 64/128) on shapes with several tiles, partial tiles and GQA groups: every
// output's error is printed before any is asserted, with the place of the worst element when one fails.
static void flash_worst(const char *name, Pair p, int64_t S, int64_t heads, int64_t d) {
    float *g = gpu_down(p.d), *c = p.c.p;
    int64_t n = tensor_numel(p.c), at = 0;
    double worst = -1;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - c[i]);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, at = i;
        if (isinf(worst)) break;
    }
    // (token, head, dim) for q/k/v-shaped tensors; (batch·head, row) for lse
    if (d > 0)
        printf("       %s worst |diff| %.3g at token %lld (pos %lld) head %lld dim %lld: gpu %g cpu %g\n", name, worst,
               (long long)(at / (heads * d)), (long long)(at / (heads * d) % S), (long long)(at / d % heads),
               (long long)(at % d), g[at], c[at]);
    else
        printf("       %s worst |diff| %.3g at (b·h %lld, row %lld): gpu %g cpu %g\n", name, worst, (long long)(at / S),
               (long long)(at % S), g[at], c[at]);
    free(g);
}

static bool check_flash(int B, int S, int nh, int nkv, int d) {
    DType dt = DT_BF16;
    int64_t T = (int64_t)B * S;
    float scale = 1.0f / sqrtf((float)d);
    AttnArgs aa = {.B = B, .scale = scale, .causal = true};
    Pair q = pair_rand(dt, 1, 3, T, nh, d, 0), k = pair_rand(dt, 1, 3, T, nkv, d, 0),
         v = pair_rand(dt, 1, 3, T, nkv, d, 0);
    Pair o = pair_nan(dt, 3, T, nh, d, 0), lse = pair_nan(DT_F32, 3, B, nh, S, 0);
    op_attention_forward(o.c, lse.c, q.c, k.c, v.c, &aa), op_attention_forward(o.d, lse.d, q.d, k.d, v.d, &aa);
    Pair oc = pair_from(dt, o.c.p, 3, T, nh, d, 0), lc = pair_from(DT_F32, lse.c.p, 3, B, nh, S, 0);
    Pair dout = pair_rand(dt, 1, 3, T, nh, d, 0);
    Pair dq = pair_nan(dt, 3, T, nh, d, 0), dk = pair_nan(dt, 3, T, nkv, d, 0), dv = pair_nan(dt, 3, T, nkv, d, 0);
    op_attention_backward(dq.c, dk.c, dv.c, NONE, dout.c, q.c, k.c, v.c, oc.c, lc.c, &aa);
    op_attention_backward(dq.d, dk.d, dv.d, NONE, dout.d, q.d, k.d, v.d, oc.d, lc.d, &aa);
    double e[5] = {pair_err(o), pair_err(lse), pair_err(dq), pair_err(dk), pair_err(dv)};
    const char *nm[5] = {"o", "lse", "dq", "dk", "dv"};
    printf("     flash B=%d S=%d nh=%d nkv=%d d=%d: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", B, S, nh, nkv, d, e[0],
           e[1], e[2], e[3], e[4]);
    bool ok = true;
    for (int i = 0; i < 5; i++) {
        record_err(e[i], nm[i]);
        if (!(e[i] <= 1e-2)) {
            ok = false;
            Pair pp[5] = {o, lse, dq, dk, dv};
            flash_worst(nm[i], pp[i], S, i == 1 ? 0 : (i < 3 ? nh : nkv), i == 1 ? 0 : d);
        }
    }
    return ok;
}

// Both bf16 paths: cuDNN's fused kernels (the default where the build has cuDNN) and ours
// (PITH_ATTENTION=own); each call must have run the path asked for.
TEST(gpu_op_attention_flash) {
    gpu_begin();
    gpu_mode(DT_BF16);
    const char *paths[2] = {"cudnn", "own"};
    for (int pi = 0; pi < 2; pi++) {
#ifndef PITH_CUDNN
        if (pi == 0) continue;
#endif
        if (pi == 1) setenv("PITH_ATTENTION", "own", 1);
        const char *want = pi == 0 ? "cudnn" : "flash";
        printf("     path %s\n", paths[pi]);
        bool ok = true;
        ok &= check_flash(1, 64, 1, 1, 64); // one tile
        ASSERT_MSG(!strcmp(cuda_attention_last_path(), want), "attention ran %s, not %s", cuda_attention_last_path(),
                   want);
        ok &= check_flash(1, 200, 2, 1, 128);      // a partial last tile
        ok &= check_flash(2, 77, 4, 2, 64);        // two sequences, partial tiles
        ok &= check_flash(1, 513, 2, 2, 64);       // one row past a tile boundary
        if (!getenv("PITH_TEST_SANITIZE")) {       // (under compute-sanitizer the small shapes suffice)
            ok &= check_flash(2, 300, 8, 2, 128);  // GQA groups of 4, several tiles
            ok &= check_flash(1, 1024, 4, 1, 128); // 16 tiles, a group of 4
        }
        ASSERT_MSG(!strcmp(cuda_attention_last_path(), want), "attention ran %s, not %s", cuda_attention_last_path(),
                   want);
        unsetenv("PITH_ATTENTION");
        ASSERT_MSG(ok, "%s attention differs from the CPU (errors above)", paths[pi]);
    }
    gpu_report();
}

// Three AdamW steps on n fp32 parameters (fresh moments, v ≥ 0) with moments in mdt (fp32 or bf16), the gradient
// scaled by 0.37, GPU against CPU; the compute copy: none, fp32, then bf16 (on the CPU the new p is rounded the same
// way). The GPU fuses multiply-adds the CPU rounds apart, so its fp32 moments differ in their last bits; bf16 moments
// then differ by one bf16 ulp (at most 2^-7 relative) where that crosses a rounding tie, and the next steps' p by at
// most lr·2^-7·|m̂/√v̂| an element: the bf16 bounds 1e-2 (moments) and 1e-3 (p, ~1 an element).
// gdt: the gradient's dtype (bf16: gradient_dtype's expert gradients), the CPU reading the same bf16 values.
static void check_adamw(int64_t n, DType mdt, DType gdt) {
    Pair p = pair_rand(DT_F32, 1, 1, n, 0, 0, 0), m = pair_rand(mdt, 0.1f, 1, n, 0, 0, 0),
         v = pair_rand(mdt, 0.1f, 1, n, 0, 0, 0);
    for (int64_t i = 0; i < n; i++) ((float *)v.c.p)[i] = fabsf(((float *)v.c.p)[i]);
    op_copy(v.d, v.c);
    Tensor mc = m.c, vc = v.c; // the CPU's moments in mdt (a Pair's CPU side is fp32)
    if (mdt == DT_BF16) {
        mc = tensor_make(xmalloc(n * 2), DT_BF16, DEV_CPU, 1, n, 1, 1, 1), op_copy(mc, m.c);
        vc = tensor_make(xmalloc(n * 2), DT_BF16, DEV_CPU, 1, n, 1, 1, 1), op_copy(vc, v.c);
    }
    for (int t = 1; t <= 3; t++) {
        Pair gr = pair_rand(gdt, 1, 1, n, 0, 0, 0), w = pair_nan(t == 3 ? DT_BF16 : DT_F32, 1, n, 0, 0, 0);
        Tensor wc = t == 1 ? NONE : w.c, wd = t == 1 ? NONE : w.d, gc = gr.c;
        if (gdt == DT_BF16) gc = tensor_make(xmalloc(n * 2), DT_BF16, DEV_CPU, 1, n, 1, 1, 1), op_copy(gc, gr.c);
        op_adamw(p.c, gc, mc, vc, wc, 0.37f, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t),
            op_adamw(p.d, gr.d, m.d, v.d, wd, 0.37f, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        if (gdt == DT_BF16) free(gc.p);
        if (t > 1) EXPECT_CLOSE(w, t == 3 ? 1e-2 : mdt == DT_F32 ? 1e-5 : 1e-3);
    }
    if (mdt == DT_BF16) op_copy(m.c, mc), op_copy(v.c, vc), free(mc.p), free(vc.p);
    EXPECT_CLOSE(p, mdt == DT_F32 ? 1e-5 : 1e-3);
    EXPECT_CLOSE(m, mdt == DT_F32 ? 1e-5 : 1e-2);
    EXPECT_CLOSE(v, mdt == DT_F32 ? 1e-5 : 1e-2);
    // the pass flags a weight it makes infinite (lr 3e38: the step overflows), once: reading clears it
    ASSERT(!op_adamw_nonfinite(DEV_CUDA));
    Pair gr = pair_rand(DT_F32, 1, 1, n, 0, 0, 0);
    op_adamw(p.d, gr.d, m.d, v.d, NONE, 1, 3e38f, 0.9f, 0.95f, 1e-30f, 0, 4);
    ASSERT(op_adamw_nonfinite(DEV_CUDA) && !op_adamw_nonfinite(DEV_CUDA));
}

// The vector (16-byte) paths of the memory-bound ops at the model's sizes.
TEST(gpu_op_vector_paths) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        check_rmsnorm(MODE_DT, TOL, 300, 2048); // hidden: 32 lanes a row
        check_rmsnorm(MODE_DT, TOL, 1000, 128); // q/k norm: 16 lanes a row
        int64_t n = 40000;
        Pair y = pair_rand(MODE_DT, 1, 1, n, 0, 0, 0), x = pair_rand(MODE_DT, 1, 1, n, 0, 0, 0),
             g = pair_rand(DT_F32, 1, 1, n, 0, 0, 0);
        op_add(y.c, x.c), op_add(y.d, x.d);
        EXPECT_CLOSE(y, TOL);
        op_scale(y.c, 0.7f), op_scale(y.d, 0.7f);
        EXPECT_CLOSE(y, TOL);
        op_add(y.c, g.c), op_add(y.d, g.d);
        EXPECT_CLOSE(y, TOL);
        // MoE movers with a real permutation: T tokens × k slots, H = 256
        int64_t T = 300, k = 4, E = 16, H = 256;
        int32_t *idx = xmalloc(T * k * sizeof(int32_t));
        for (int64_t i = 0; i < T * k; i++) idx[i] = (int32_t)(rng_u64(21, 5, i) % E);
        Pair ix = pair_i32(idx, T * k);
        ix.c = tensor_reshape2(ix.c, T, k), ix.d = tensor_reshape2(ix.d, T, k);
        Pair perm = pair_i32(idx, T * k), at = pair_i32(idx, T * k);
        int64_t oc[17] = {0};
        Pair po = pair_offs(oc, 17);
        op_moe_sort(perm.c, at.c, po.c, ix.c, (int)E), op_moe_sort(perm.d, at.d, po.d, ix.d, (int)E);
        Pair xt = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), xe = pair_nan(MODE_DT, 2, T * k, H, 0, 0),
             ys = pair_nan(MODE_DT, 2, T * k, H, 0, 0);
        op_gather_rows(xe.c, xt.c, perm.c, (int)k), op_gather_rows(xe.d, xt.d, perm.d, (int)k);
        EXPECT_CLOSE(xe, 0);
        op_scatter_rows(ys.c, xe.c, perm.c), op_scatter_rows(ys.d, xe.d, perm.d);
        EXPECT_CLOSE(ys, 0);
        Pair dx = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), dxe = pair_rand(MODE_DT, 1, 2, T * k, H, 0, 0);
        op_scatter_add_rows(dx.c, dxe.c, perm.c, (int)k), op_scatter_add_rows(dx.d, dxe.d, perm.d, (int)k);
        EXPECT_CLOSE(dx, TOL);
        // a row map with repeats takes the atomic path
        int32_t rep[8] = {0, 3, 3, 5, 1, 0, 7, 2};
        Pair rr = pair_i32(rep, 8), d8 = pair_rand(MODE_DT, 1, 2, 8, H, 0, 0),
             dx8 = pair_rand(MODE_DT, 1, 2, 4, H, 0, 0);
        op_scatter_add_rows(dx8.c, d8.c, rr.c, 2), op_scatter_add_rows(dx8.d, d8.d, rr.d, 2);
        EXPECT_CLOSE(dx8, TOL);
        Pair r = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), w = pair_rand(DT_F32, 1, 2, T, k, 0, 0),
             out = pair_nan(MODE_DT, 2, T, H, 0, 0);
        op_moe_combine_forward(out.c, r.c, ys.c, w.c, NONE), op_moe_combine_forward(out.d, r.d, ys.d, w.d, NONE);
        EXPECT_CLOSE(out, TOL);
        Pair dout = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), dy = pair_nan(MODE_DT, 2, T * k, H, 0, 0),
             dw = pair_nan(DT_F32, 2, T, k, 0, 0);
        op_moe_combine_backward(dy.c, dw.c, dout.c, ys.c, w.c, NONE);
        op_moe_combine_backward(dy.d, dw.d, dout.d, ys.d, w.d, NONE);
        EXPECT_CLOSE(dy, TOL);
        EXPECT_CLOSE(dw, TOL);
        // the same combine reading the expert-ordered rows through the sort's inverse: the same values bit for bit
        // (the same sums in the same order), dy written in expert order
        Pair outa = pair_nan(MODE_DT, 2, T, H, 0, 0), dya = pair_nan(MODE_DT, 2, T * k, H, 0, 0),
             dwa = pair_nan(DT_F32, 2, T, k, 0, 0), dyb = pair_nan(MODE_DT, 2, T * k, H, 0, 0);
        op_moe_combine_forward(outa.c, r.c, xe.c, w.c, at.c), op_moe_combine_forward(outa.d, r.d, xe.d, w.d, at.d);
        EXPECT_CLOSE(outa, TOL);
        op_moe_combine_backward(dya.c, dwa.c, dout.c, xe.c, w.c, at.c);
        op_moe_combine_backward(dya.d, dwa.d, dout.d, xe.d, w.d, at.d);
        EXPECT_CLOSE(dya, TOL);
        op_gather_rows(dyb.d, dy.d, perm.d, 1);
        float *h[6] = {gpu_down(out.d), gpu_down(outa.d), gpu_down(dw.d),
                       gpu_down(dwa.d), gpu_down(dyb.d),  gpu_down(dya.d)};
        ASSERT(memcmp(h[0], h[1], T * H * 4) == 0 && memcmp(h[2], h[3], T * k * 4) == 0 &&
               memcmp(h[4], h[5], T * k * H * 4) == 0);
        for (int i = 0; i < 6; i++) free(h[i]);
        Pair gu = pair_rand(MODE_DT, 2, 2, 50, 2 * 768, 0, 0), act = pair_nan(MODE_DT, 2, 50, 768, 0, 0);
        op_swiglu_forward(act.c, gu.c, 0, 0), op_swiglu_forward(act.d, gu.d, 0, 0);
        EXPECT_CLOSE(act, TOL);
        Pair da = pair_rand(MODE_DT, 1, 2, 50, 768, 0, 0), dgu = pair_nan(MODE_DT, 2, 50, 2 * 768, 0, 0);
        op_swiglu_backward(dgu.c, da.c, gu.c, 0, 0), op_swiglu_backward(dgu.d, da.d, gu.d, 0, 0);
        EXPECT_CLOSE(dgu, TOL);
        free(idx);
    }
    // AdamW on a multiple of 4 (the float4 path), fp32 and bf16 moments
    gpu_mode(DT_F32);
    check_adamw(10000, DT_F32, DT_F32);
    check_adamw(10000, DT_BF16, DT_F32);
    check_adamw(10000, DT_F32, DT_BF16);
    // cross-entropy over several slices of a row (float4 path) and the scalar path
    int64_t R = 7, V = 20000;
    int32_t lab[7] = {5, -100, 19999, 8191, 8192, 0, 12345};
    Pair l = pair_rand(DT_F32, 3, 2, R, V, 0, 0), lb = pair_i32(lab, R);
    double s0 = 0.5;
    Tensor sc = tensor_make(&s0, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), sd = gpu_tensor(DT_F64, 1, 1, 0, 0, 0);
    op_copy(sd, sc);
    op_cross_entropy(l.c, lb.c, sc, (Tensor){0}, 0.25f), op_cross_entropy(l.d, lb.d, sd, (Tensor){0}, 0.25f);
    EXPECT_CLOSE(l, 1e-5);
    double sg = op_read_scalar(sd), err = fabs(sg - s0) / fabs(s0);
    record_err(err, "loss_sum");
    ASSERT_MSG(err <= 1e-6, "loss_sum: gpu %.12g cpu %.12g", sg, s0);
    gpu_report();
}

// Grouped GEMMs at a size where one grouped call matters: 16 experts of uneven rows, two empty.
TEST(gpu_op_grouped_linear_many) {
    gpu_begin();
    int64_t E = 16, K = 256, N = 384, offs[17];
    offs[0] = 0;
    for (int64_t e = 0; e < E; e++)
        offs[e + 1] = offs[e] + (e == 3 || e == 9 ? 0 : 1 + (int64_t)(rng_u64(4, 4, e) % 90));
    int64_t R = offs[E];
    Pair po = pair_offs(offs, E + 1);
    MODES {
        gpu_mode(MODE_DT);
        DType dt = MODE_DT;
        Pair x = pair_rand(dt, 1, 2, R, K, 0, 0), w = pair_rand(dt, 0.5f, 3, E, N, K, 0),
             y = pair_nan(dt, 2, R, N, 0, 0);
        op_grouped_linear_forward(y.c, x.c, NONE, 0, w.c, NONE, po.c),
            op_grouped_linear_forward(y.d, x.d, NONE, 0, w.d, NONE, po.d);
        EXPECT_CLOSE(y, GEMM_TOL);
        Pair dy = pair_rand(dt, 1, 2, R, N, 0, 0), dx = pair_nan(dt, 2, R, K, 0, 0),
             dw = pair_rand(DT_F32, 1, 3, E, N, K, 0);
        op_grouped_linear_backward_input(dx.c, dy.c, w.c, po.c),
            op_grouped_linear_backward_input(dx.d, dy.d, w.d, po.d);
        EXPECT_CLOSE(dx, GEMM_TOL);
        op_grouped_linear_backward_weight(dw.c, NONE, dy.c, x.c, NONE, 0, po.c, true),
            op_grouped_linear_backward_weight(dw.d, NONE, dy.d, x.d, NONE, 0, po.d, true);
        EXPECT_CLOSE(dw, GEMM_TOL);
        // the per-expert cuBLASLt weight gradients on side streams (default 4) equal the serial loop bit for bit
        Pair dw1 = pair_from(DT_F32, dw.c.p, 3, E, N, K, 0), dw4 = pair_from(DT_F32, dw.c.p, 3, E, N, K, 0);
        setenv("PITH_GROUPED_KERNEL", "loop", 1); // (bf16 here would otherwise take the wgmma kernels)
        setenv("PITH_WGRAD_STREAMS", "1", 1);
        op_grouped_linear_backward_weight(dw1.d, NONE, dy.d, x.d, NONE, 0, po.d, true);
        setenv("PITH_WGRAD_STREAMS", "4", 1);
        op_grouped_linear_backward_weight(dw4.d, NONE, dy.d, x.d, NONE, 0, po.d, true);
        unsetenv("PITH_WGRAD_STREAMS");
        unsetenv("PITH_GROUPED_KERNEL");
        float *h1 = gpu_down(dw1.d), *h4 = gpu_down(dw4.d);
        ASSERT_MSG(!memcmp(h1, h4, (size_t)E * N * K * sizeof(float)), "weight gradients: 4 streams differ from 1");
        free(h1), free(h4);
        // bf16 weight gradients (gradient_dtype) on both paths — the default (the wgmma kernels decline them) and the
        // per-expert loop — written, and added to bf16 values: the CPU's fp32 sums rounded once against cuBLASLt's
        // bf16 D with beta; the sums' order differs, so a few elements round one bf16 ulp apart (2^-8), far inside
        // 1e-2, while a dropped or doubled accumulation is off by the whole stored value
        static const char *const paths[] = {"wgmma", "loop"};
        for (int i = 0; i < 4; i++) {
            bool acc = i & 1;
            Pair g = pair_rand(DT_BF16, 1, 3, E, N, K, 0);
            Tensor gc = tensor_make(xmalloc(E * N * K * 2), DT_BF16, DEV_CPU, 3, E, N, K, 1);
            op_copy(gc, g.c);
            op_grouped_linear_backward_weight(gc, NONE, dy.c, x.c, NONE, 0, po.c, acc);
            op_copy(g.c, gc), free(gc.p);
            setenv("PITH_GROUPED_KERNEL", paths[i / 2], 1);
            op_grouped_linear_backward_weight(g.d, NONE, dy.d, x.d, NONE, 0, po.d, acc);
            unsetenv("PITH_GROUPED_KERNEL");
            EXPECT_CLOSE(g, 1e-2);
        }
    }
    gpu_report();
}

// The worst over 128 × 128 blocks (per matrix) of ‖gpu − ref‖/‖ref‖, so one wrong output tile fails even among
// hundreds of right ones.
static double block_err(const float *g, const float *ref, int64_t mats, int64_t rows, int64_t cols) {
    double worst = 0;
    for (int64_t e = 0; e < mats; e++)
        for (int64_t r0 = 0; r0 < rows; r0 += 128)
            for (int64_t c0 = 0; c0 < cols; c0 += 128) {
                double num = 0, den = 0;
                for (int64_t r = r0; r < rows && r < r0 + 128; r++)
                    for (int64_t c = c0; c < cols && c < c0 + 128; c++) {
                        int64_t i = (e * rows + r) * cols + c;
                        num += ((double)g[i] - ref[i]) * ((double)g[i] - ref[i]), den += (double)ref[i] * ref[i];
                    }
                double err = sqrt(num) / (sqrt(den) + 1e-30);
                if (isnan(err)) return INFINITY;
                if (err > worst) worst = err;
            }
    return worst;
}

// The wgmma kernels (cuda_wgmma.cu) against the CPU: all three expert products, bf16 operands, for balanced,
// skewed and ragged experts (empty first, middle and last; counts around the 64-row reduction block and the
// 128-row tile), shapes whose output columns take both tile widths (256 where they divide, else 128), and the
// Qwen3 expert shapes. The error is the worst 128 × 128 block's (block_err); forward and input gradient round
// to bf16 (1e-2), the weight gradient accumulates onto random fp32 values (1e-5), and is stored over NaN when not
// accumulating (1e-5). PITH_GROUPED_KERNEL=wgmma and the call counter make sure these kernels ran; a second
// weight gradient must match the first bit for bit.
static bool check_grouped_wgmma(const char *tag, int64_t E, const int64_t *counts, int64_t N, int64_t K) {
    int64_t offs[257];
    CHECK(E <= 256);
    offs[0] = 0;
    for (int64_t e = 0; e < E; e++) offs[e + 1] = offs[e] + counts[e];
    int64_t R = offs[E];
    Pair po = pair_offs(offs, E + 1);
    printf("     %s: E=%lld N=%lld K=%lld rows=%lld\n", tag, (long long)E, (long long)N, (long long)K, (long long)R);
    size_t mark = gpu_mark(); // (each case's device tensors go at its end)
    DType dt = DT_BF16;
    Pair x = pair_rand(dt, 1, 2, R, K, 0, 0), w = pair_rand(dt, 0.5f, 3, E, N, K, 0),
         dy = pair_rand(dt, 1, 2, R, N, 0, 0);
    Pair y = pair_nan(dt, 2, R, N, 0, 0), dx = pair_nan(dt, 2, R, K, 0, 0), dw = pair_rand(DT_F32, 1, 3, E, N, K, 0);
    Tensor dw2 = gpu_tensor(DT_F32, 3, E, N, K, 0); // the start, for a second run
    op_copy(dw2, dw.d);
    op_grouped_linear_forward(y.c, x.c, NONE, 0, w.c, NONE, po.c);
    op_grouped_linear_backward_input(dx.c, dy.c, w.c, po.c);
    op_grouped_linear_backward_weight(dw.c, NONE, dy.c, x.c, NONE, 0, po.c, true);
    setenv("PITH_GROUPED_KERNEL", "wgmma", 1);
    int64_t calls0 = cuda_grouped_calls("wgmma");
    op_grouped_linear_forward(y.d, x.d, NONE, 0, w.d, NONE, po.d);
    op_grouped_linear_backward_input(dx.d, dy.d, w.d, po.d);
    op_grouped_linear_backward_weight(dw.d, NONE, dy.d, x.d, NONE, 0, po.d, true);
    bool ran = cuda_grouped_calls("wgmma") == calls0 + 3;
    Pair ys[3] = {y, dx, dw};
    const char *what[3] = {"y (forward)", "dx (input gradient)", "dw (fp32 accumulate)"};
    int64_t rows[3] = {R, R, N}, cols[3] = {N, K, K}, mats[3] = {1, 1, E};
    double tol[3] = {1e-2, 1e-2, 1e-5};
    bool ok = ran;
    if (!ran) printf("       the wgmma kernels did not run\n");
    for (int i = 0; i < 3; i++) {
        float *g = gpu_down(ys[i].d);
        double err = block_err(g, ys[i].c.p, mats[i], rows[i], cols[i]);
        printf("       %-28s vs cpu %.2e\n", what[i], err);
        record_err(err, what[i]);
        ok &= err <= tol[i];
        free(g);
    }
    // the weight gradient again from the same start: bit for bit (one writer per output)
    op_grouped_linear_backward_weight(dw2, NONE, dy.d, x.d, NONE, 0, po.d, true);
    int64_t n = E * N * K;
    float *h1 = gpu_down(dw2), *h2 = gpu_down(dw.d);
    bool same = !memcmp(h1, h2, (size_t)n * sizeof(float));
    if (!same) printf("       dw: two runs differ\n");
    // a per-expert bias (GPT-OSS's) added in the forward's epilogue: the bits of the product (y), then the bias op
    {
        Pair bias = pair_rand(dt, 1, 2, E, N, 0, 0), yf = pair_nan(dt, 2, R, N, 0, 0);
        Tensor yb = gpu_tensor(dt, 2, R, N, 0, 0);
        op_copy(yb, y.d), op_linear_bias_forward(yb, bias.d, po.d);
        int64_t b0 = cuda_grouped_calls("bias");
        op_grouped_linear_forward(yf.d, x.d, NONE, 0, w.d, bias.d, po.d);
        float *fb = gpu_down(yb), *ff = gpu_down(yf.d);
        if (memcmp(fb, ff, (size_t)R * N * sizeof(float)))
            printf("       y + b: the bias in the epilogue differs from the bias op's\n"), same = false;
        if (cuda_grouped_calls("bias") != b0 + 1) printf("       the bias epilogue did not run\n"), same = false;
        free(fb), free(ff);
    }
    // written, not added (the first micro-batch): over NaN (dw2 again on the GPU), every expert's dw_e is stored,
    // the empty ones zeroed
    for (int64_t i = 0; i < n; i++) h1[i] = NAN;
    Tensor hc = tensor_make(h1, DT_F32, DEV_CPU, 3, E, N, K, 1);
    op_copy(dw2, hc);
    int64_t calls1 = cuda_grouped_calls("wgmma");
    op_grouped_linear_backward_weight(hc, NONE, dy.c, x.c, NONE, 0, po.c, false);
    op_grouped_linear_backward_weight(dw2, NONE, dy.d, x.d, NONE, 0, po.d, false);
    // and in bf16 (gradient_dtype bf16), over NaN: the fp32 store's sums rounded once, bit for bit
    uint16_t *nan16 = xmalloc((size_t)n * 2);
    memset(nan16, 0xff, (size_t)n * 2);
    Tensor d16 = gpu_tensor(DT_BF16, 3, E, N, K, 0);
    op_copy(d16, tensor_make(nan16, DT_BF16, DEV_CPU, 3, E, N, K, 1));
    op_grouped_linear_backward_weight(d16, NONE, dy.d, x.d, NONE, 0, po.d, false);
    float *g16 = gpu_down(d16);
    // then added to (a later micro-batch): each stored value joins the fp32 sum, one rounding
    op_grouped_linear_backward_weight(d16, NONE, dy.d, x.d, NONE, 0, po.d, true);
    unsetenv("PITH_GROUPED_KERNEL");
    float *go = gpu_down(dw2), *a16 = gpu_down(d16);
    double erro = block_err(go, h1, E, N, K);
    printf("       %-28s vs cpu %.2e\n", "dw (fp32 store)", erro);
    record_err(erro, "dw (fp32 store)");
    int64_t off16 = 0, offa = 0;
    for (int64_t i = 0; i < n; i++) {
        float r = bf16_to_f32(f32_to_bf16(go[i]));
        off16 += f32_bits(g16[i]) != f32_bits(r);
        offa += f32_bits(a16[i]) != f32_bits(bf16_to_f32(f32_to_bf16(go[i] + r)));
    }
    if (off16) printf("       dw (bf16 store): %lld elements are not the fp32 store's rounded\n", (long long)off16);
    if (offa) printf("       dw (bf16 add): %lld elements are not the fp32 sum's rounded\n", (long long)offa);
    bool ran1 = cuda_grouped_calls("wgmma") == calls1 + 3; // the fp32 store, the bf16 store, the bf16 add
    if (!ran1) printf("       the weight-gradient stores did not all run on the wgmma kernels\n");
    ok &= erro <= 1e-5 && !off16 && !offa && ran1;
    free(go), free(g16), free(a16), free(h1), free(h2), free(nan16);
    gpu_release(mark);
    return ok && same;
}

TEST(gpu_op_grouped_wgmma) {
    gpu_begin();
    gpu_mode(DT_BF16);
    bool ok = true;
    const int64_t small[11] = {0, 33, 1, 0, 63, 64, 65, 129, 128, 300, 0};
    ok &= check_grouped_wgmma("ragged", 11, small, 256, 128); // column tiles 256 (forward), 128 (the others)
    ok &= check_grouped_wgmma("ragged, 128-wide tiles", 11, small, 128, 384);
    ok &= check_grouped_wgmma("ragged, 256-wide gradients", 11, small, 384, 512);
    int64_t bal[16], skew[16] = {1100, 30, 0, 1270, 10, 64, 65, 0, 7, 190, 0, 0, 513, 2, 1, 40};
    for (int i = 0; i < 16; i++) bal[i] = 256;
    ok &= check_grouped_wgmma("balanced", 16, bal, 512, 256);
    ok &= check_grouped_wgmma("skewed", 16, skew, 256, 512);
    const int64_t qwen[6] = {0, 37, 300, 129, 1, 64};
    ok &= check_grouped_wgmma("Qwen3 gate_up", 6, qwen, 1536, 2048);
    ok &= check_grouped_wgmma("Qwen3 down", 6, qwen, 2048, 768);
    // several tiles for every CTA of the persistent grid in all three products (skewed, one expert empty)
    const int64_t busy[8] = {700, 0, 1290, 513, 64, 1, 900, 320};
    ok &= check_grouped_wgmma("several tiles a CTA", 8, busy, 768, 1024);
    // the most experts a tile list holds (WG_MAX_E): 256, rows 0..5 each (every sixth empty), built on the device
    int64_t many[256];
    for (int i = 0; i < 256; i++) many[i] = (i * 7) % 6;
    ok &= check_grouped_wgmma("256 experts", 256, many, 128, 128);
    // widths that are multiples of 64, not of 128: a 64-wide last column tile (and weight-gradient row tile)
    ok &= check_grouped_wgmma("ragged, 64-multiples", 11, small, 192, 320);
    // gpt-oss-20b's expert shapes (few experts: the weights and three fp32 gradients fit the test arena)
    const int64_t oss_bal[4] = {160, 160, 160, 160}, oss_skew[5] = {0, 413, 2, 0, 97};
    ok &= check_grouped_wgmma("GPT-OSS down skewed, empty", 5, oss_skew, 2880, 2880);
    if (!getenv("PITH_TEST_SANITIZE")) { // (under compute-sanitizer the shapes above suffice)
        ok &= check_grouped_wgmma("GPT-OSS gate_up balanced", 2, oss_bal, 5760, 2880);
        ok &= check_grouped_wgmma("GPT-OSS down balanced", 4, oss_bal, 2880, 2880);
    }
    ASSERT_MSG(ok, "cuda_wgmma.cu differs from the CPU (errors above)");
    gpu_report();
}

// ---- mixture of experts ----
static void check_router_args(RouterArgs a, int64_t E, bool bias) {
    int64_t T = 50;
    int k = a.k;
    Pair logits = pair_rand(DT_F32, 2, 2, T, E, 0, 0), probs = pair_nan(DT_F32, 2, T, E, 0, 0),
         w = pair_nan(DT_F32, 2, T, k, 0, 0);
    Pair bs = pair_rand(DT_F32, 0.1f, 1, E, 0, 0, 0);
    int32_t *junk = xmalloc(T * k * sizeof(int32_t));
    for (int i = 0; i < T * k; i++) junk[i] = -7;
    Pair idx = pair_i32(junk, T * k);
    free(junk);
    idx.c = tensor_reshape2(idx.c, T, k), idx.d = tensor_reshape2(idx.d, T, k);
    RouterArgs ac = a, ad = a;
    if (bias) ac.bias = bs.c, ad.bias = bs.d;
    op_router_forward(probs.c, idx.c, w.c, logits.c, &ac), op_router_forward(probs.d, idx.d, w.d, logits.d, &ad);
    EXPECT_CLOSE(probs, 1e-5);
    EXPECT_CLOSE(w, 1e-5);
    int32_t *gi = gpu_down_i32(idx.d);
    for (int64_t i = 0; i < T * k; i++)
        ASSERT_MSG(gi[i] == ((int32_t *)idx.c.p)[i], "idx[%lld]: gpu %d cpu %d", (long long)i, gi[i],
                   ((int32_t *)idx.c.p)[i]);
    free(gi);
    Pair dw = pair_rand(DT_F32, 1, 2, T, k, 0, 0), lbg = pair_rand(DT_F32, 0.1f, 1, E, 0, 0, 0),
         dl = pair_nan(DT_F32, 2, T, E, 0, 0);
    op_router_backward(dl.c, dw.c, lbg.c, probs.c, idx.c, w.c, &ac),
        op_router_backward(dl.d, dw.d, lbg.d, probs.d, idx.d, w.d, &ad);
    EXPECT_CLOSE(dl, 1e-5);
    op_router_backward(dl.c, dw.c, NONE, probs.c, idx.c, w.c, &ac),
        op_router_backward(dl.d, dw.d, NONE, probs.d, idx.d, w.d, &ad);
    EXPECT_CLOSE(dl, 1e-5);
}

static void check_router(bool renorm, bool force) {
    check_router_args((RouterArgs){.k = 3, .renorm = renorm, .scale = 1, .force_balance = force}, 8, false);
}

TEST(gpu_op_router) {
    gpu_begin();
    check_router(true, false);
    check_router(false, false);
    check_router(true, true);
    gpu_report();
}

// Every other form: routed scaling, top-k softmax (GPT-OSS), group-limited greedy (DeepSeek-V2: 64 experts in 8
// groups, 3 kept, top-6), a selection bias, with forced routing too, and sigmoid scores.
TEST(gpu_op_router_forms) {
    gpu_begin();
    check_router_args((RouterArgs){.k = 6, .scale = 2.5f}, 64, false);
    check_router_args((RouterArgs){.k = 4, .softmax_topk = true, .scale = 1}, 32, false);
    check_router_args((RouterArgs){.k = 4, .softmax_topk = true, .scale = 1, .force_balance = true}, 32, false);
    check_router_args((RouterArgs){.k = 6, .scale = 16, .n_group = 8, .topk_group = 3}, 64, false);
    check_router_args((RouterArgs){.k = 8, .renorm = true, .scale = 2.5f, .n_group = 8, .topk_group = 4}, 256, true);
    check_router_args((RouterArgs){.k = 8, .renorm = true, .scale = 1}, 128, true);
    // DeepSeek-V3's sigmoid scores (256 experts, 8 groups, 4 kept, top-8, renormalised, scaled, biased)
    check_router_args(
        (RouterArgs){.k = 8, .renorm = true, .scale = 2.5f, .n_group = 8, .topk_group = 4, .sigmoid = true}, 256, true);
    check_router_args((RouterArgs){.k = 3, .scale = 1, .sigmoid = true}, 8, false);
    gpu_report();
}

TEST(gpu_op_moe_lb_loss) {
    gpu_begin();
    int64_t T = 64, E = 8, k = 2;
    Pair logits = pair_rand(DT_F32, 2, 2, T, E, 0, 0), probs = pair_nan(DT_F32, 2, T, E, 0, 0),
         w = pair_nan(DT_F32, 2, T, k, 0, 0);
    int32_t z[128] = {0};
    Pair idx = pair_i32(z, T * k);
    idx.c = tensor_reshape2(idx.c, T, k), idx.d = tensor_reshape2(idx.d, T, k);
    RouterArgs ra = {.k = (int)k, .renorm = true, .scale = 1};
    op_router_forward(probs.c, idx.c, w.c, logits.c, &ra), op_router_forward(probs.d, idx.d, w.d, logits.d, &ra);
    double l0 = 0.25;
    Tensor lc = tensor_make(&l0, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), ld = gpu_tensor(DT_F64, 1, 1, 0, 0, 0);
    op_copy(ld, lc);
    Pair lbg = pair_nan(DT_F32, 1, E, 0, 0, 0);
    op_moe_lb_loss(lc, lbg.c, probs.c, idx.c, 0.01f, 64.0f), op_moe_lb_loss(ld, lbg.d, probs.d, idx.d, 0.01f, 64.0f);
    EXPECT_CLOSE(lbg, 1e-5);
    double lg = op_read_scalar(ld), err = fabs(lg - l0) / fabs(l0);
    record_err(err, "loss_sum");
    ASSERT_MSG(err <= 1e-9, "loss_sum: gpu %.12g cpu %.12g", lg, l0);
    // op_moe_count (aux-loss-free balancing's counts): the GPU's routing counted on both, added to what cnt holds
    int32_t hi[128];
    double cc[8], cg[8];
    op_copy(tensor_make(hi, DT_I32, DEV_CPU, 2, T, k, 1, 1), idx.d);
    for (int e = 0; e < E; e++) cc[e] = e;
    Tensor cd = gpu_tensor(DT_F64, 1, E, 0, 0, 0);
    op_copy(cd, tensor_make(cc, DT_F64, DEV_CPU, 1, E, 1, 1, 1));
    op_moe_count(tensor_make(cc, DT_F64, DEV_CPU, 1, E, 1, 1, 1), tensor_make(hi, DT_I32, DEV_CPU, 2, T, k, 1, 1));
    op_moe_count(cd, idx.d);
    op_copy(tensor_make(cg, DT_F64, DEV_CPU, 1, E, 1, 1, 1), cd);
    double n = 0;
    for (int e = 0; e < E; e++) n += cc[e] - e;
    ASSERT_MSG(n == T * k, "moe_count: the CPU counted %g of %lld slots", n, (long long)(T * k));
    for (int e = 0; e < E; e++) ASSERT_MSG(cg[e] == cc[e], "moe_count: expert %d gpu %g cpu %g", e, cg[e], cc[e]);
    gpu_report();
}

// T·k = 2674 entries: three of the sort's tiles of 1024 (the last one partial).
TEST(gpu_op_moe_sort_gather_scatter) {
    gpu_begin();
    int64_t T = 1337, E = 6, k = 2, H = 24;
    int32_t idx[2674];
    for (int64_t i = 0; i < T * k; i++) idx[i] = (int32_t)(rng_u64(11, 3, i) % (E - 1)); // expert E-1 stays empty
    MODES {
        gpu_mode(MODE_DT);
        Pair ix = pair_i32(idx, T * k);
        ix.c = tensor_reshape2(ix.c, T, k), ix.d = tensor_reshape2(ix.d, T, k);
        int32_t junk[2674];
        for (int i = 0; i < 2674; i++) junk[i] = -1;
        Pair perm = pair_i32(junk, T * k), at = pair_i32(junk, T * k);
        int64_t oc[7] = {-1, -1, -1, -1, -1, -1, -1}, og[7];
        Pair po = pair_offs(oc, 7); // written by the sorts
        op_moe_sort(perm.c, at.c, po.c, ix.c, (int)E), op_moe_sort(perm.d, at.d, po.d, ix.d, (int)E);
        op_copy(ti64_1(og, 7), po.d);
        for (int e = 0; e <= E; e++)
            ASSERT_MSG(oc[e] == og[e], "offs[%d]: gpu %lld cpu %lld", e, (long long)og[e], (long long)oc[e]);
        int32_t *gp = gpu_down_i32(perm.d), *ga = gpu_down_i32(at.d);
        for (int64_t i = 0; i < T * k; i++)
            ASSERT_MSG(gp[i] == ((int32_t *)perm.c.p)[i] && ga[gp[i]] == i, "perm[%lld] or at differs", (long long)i);
        free(gp), free(ga);
        Pair x = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), xe = pair_nan(MODE_DT, 2, T * k, H, 0, 0),
             y = pair_nan(MODE_DT, 2, T * k, H, 0, 0);
        op_gather_rows(xe.c, x.c, perm.c, (int)k), op_gather_rows(xe.d, x.d, perm.d, (int)k);
        EXPECT_CLOSE(xe, 0);
        op_scatter_rows(y.c, xe.c, perm.c), op_scatter_rows(y.d, xe.d, perm.d);
        EXPECT_CLOSE(y, 0);
        Pair back = pair_nan(MODE_DT, 2, T * k, H, 0, 0);
        op_gather_rows(back.c, y.c, perm.c, 1), op_gather_rows(back.d, y.d, perm.d, 1);
        EXPECT_CLOSE(back, 0);
        Pair dx = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), dxe = pair_rand(MODE_DT, 1, 2, T * k, H, 0, 0);
        op_scatter_add_rows(dx.c, dxe.c, perm.c, (int)k), op_scatter_add_rows(dx.d, dxe.d, perm.d, (int)k);
        EXPECT_CLOSE(dx, TOL);
    }
    // an expert index out of range: kept for op_moe_sort_bad_expert (read once, then cleared), sorted as the nearest
    // valid expert so that perm stays a permutation and the offsets end at T·k
    ASSERT(op_moe_sort_bad_expert(DEV_CUDA) == -1);
    idx[5] = (int32_t)E + 3, idx[9] = -2;
    Pair ix = pair_i32(idx, T * k), perm = pair_i32(idx, T * k), po = pair_offs((int64_t[7]){0}, 7);
    op_moe_sort(perm.d, NONE, po.d, ix.d, (int)E);
    int64_t bad = op_moe_sort_bad_expert(DEV_CUDA);
    ASSERT_MSG(bad == E + 3 || bad == -2, "bad expert %lld", (long long)bad);
    ASSERT(op_moe_sort_bad_expert(DEV_CUDA) == -1);
    int64_t og[7];
    op_copy(ti64_1(og, 7), po.d);
    int32_t *gp = gpu_down_i32(perm.d);
    bool seen[2674] = {0};
    for (int64_t i = 0; i < T * k; i++) {
        ASSERT(gp[i] >= 0 && gp[i] < T * k && !seen[gp[i]]);
        seen[gp[i]] = true;
    }
    ASSERT(og[0] == 0 && og[E] == T * k);
    free(gp);
    gpu_report();
}

TEST(gpu_op_moe_combine) {
    gpu_begin();
    int64_t T = 29, k = 3, H = 40;
    MODES {
        gpu_mode(MODE_DT);
        Pair r = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), y = pair_rand(MODE_DT, 1, 2, T * k, H, 0, 0),
             w = pair_rand(DT_F32, 1, 2, T, k, 0, 0);
        Pair out = pair_nan(MODE_DT, 2, T, H, 0, 0);
        op_moe_combine_forward(out.c, r.c, y.c, w.c, NONE), op_moe_combine_forward(out.d, r.d, y.d, w.d, NONE);
        EXPECT_CLOSE(out, TOL);
        Pair dout = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), dy = pair_nan(MODE_DT, 2, T * k, H, 0, 0),
             dw = pair_nan(DT_F32, 2, T, k, 0, 0);
        op_moe_combine_backward(dy.c, dw.c, dout.c, y.c, w.c, NONE);
        op_moe_combine_backward(dy.d, dw.d, dout.d, y.d, w.d, NONE);
        EXPECT_CLOSE(dy, TOL);
        EXPECT_CLOSE(dw, TOL);
    }
    gpu_report();
}

// ---- embedding, loss ----
TEST(gpu_op_embedding) {
    gpu_begin();
    int64_t V = 50, H = 24, T = 70;
    int32_t tok[70];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(rng_u64(3, 4, t) % V); // repeats: rows collide in the backward
    MODES {
        gpu_mode(MODE_DT);
        Pair tab = pair_rand(MODE_DT, 1, 2, V, H, 0, 0), h = pair_nan(MODE_DT, 2, T, H, 0, 0), tk = pair_i32(tok, T);
        op_embedding_forward(h.c, tab.c, tk.c), op_embedding_forward(h.d, tab.d, tk.d);
        EXPECT_CLOSE(h, 0);
        Pair dh = pair_rand(MODE_DT, 1, 2, T, H, 0, 0), dt = pair_rand(DT_F32, 1, 2, V, H, 0, 0);
        op_embedding_backward(dt.c, dh.c, tk.c), op_embedding_backward(dt.d, dh.d, tk.d);
        EXPECT_CLOSE(dt, 1e-5);
    }
    gpu_report();
}

// A token id outside the table: the forward writes NaN in its row (the rest as the table), the backward leaves the
// table alone for it, op_embedding_bad_id names it once and then reports none.
TEST(gpu_op_embedding_bad_id) {
    gpu_begin();
    enum { V = 50, H = 16, T = 6 };
    int32_t tok[T] = {1, 2, 57, 4, 5, 6};
    float tab[V * H], h[T * H], dt[V * H], ones[T * H];
    for (int i = 0; i < V * H; i++) tab[i] = (float)i;
    for (int i = 0; i < T * H; i++) ones[i] = 1;
    Tensor td = gpu_tensor(DT_F32, 2, V, H, 0, 0), hd = gpu_tensor(DT_F32, 2, T, H, 0, 0),
           kd = gpu_tensor(DT_I32, 1, T, 0, 0, 0), dd = gpu_tensor(DT_F32, 2, T, H, 0, 0);
    op_copy(td, tensor_make(tab, DT_F32, DEV_CPU, 2, V, H, 1, 1));
    op_copy(kd, tensor_make(tok, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
    op_copy(dd, tensor_make(ones, DT_F32, DEV_CPU, 2, T, H, 1, 1));
    ASSERT(op_embedding_bad_id(DEV_CUDA) == -1);
    op_embedding_forward(hd, td, kd);
    op_copy(tensor_make(h, DT_F32, DEV_CPU, 2, T, H, 1, 1), hd);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++)
            ASSERT_MSG(t == 2 ? isnan(h[t * H + c]) : h[t * H + c] == tab[tok[t] * H + c], "h[%d, %d] = %g", t, c,
                       h[t * H + c]);
    ASSERT(op_embedding_bad_id(DEV_CUDA) == 57);
    ASSERT(op_embedding_bad_id(DEV_CUDA) == -1);
    op_zero(td);
    op_embedding_backward(td, dd, kd);
    op_copy(tensor_make(dt, DT_F32, DEV_CPU, 2, V, H, 1, 1), td);
    double sum = 0;
    for (int i = 0; i < V * H; i++) sum += dt[i];
    ASSERT_MSG(sum == (T - 1) * H, "the table's gradient sums to %g, expected %d", sum, (T - 1) * H);
    ASSERT(op_embedding_bad_id(DEV_CUDA) == 57);
    gpu_report();
}

// Cross-entropy on R × V logits of dtype dt in place (−100 rows ignored): gradients within tol, the loss
// sum within loss_tol. bf16 logits are the LM head's output on the GPU (fp32 statistics).
static void check_cross_entropy(DType dt, int64_t V, double tol, double loss_tol) {
    int64_t R = 13;
    int32_t lab[13];
    for (int r = 0; r < R; r++) lab[r] = r % 5 == 2 ? -100 : (int32_t)(rng_u64(8, (uint64_t)V, r) % V);
    Pair l = pair_rand(dt, 3, 2, R, V, 0, 0), lb = pair_i32(lab, R), l2 = pair_from(dt, l.c.p, 2, R, V, 0, 0);
    double s0 = 1.25;
    Tensor sc = tensor_make(&s0, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), sd = gpu_tensor(DT_F64, 1, 1, 0, 0, 0);
    op_copy(sd, sc);
    op_cross_entropy(l.c, lb.c, sc, (Tensor){0}, 0.37f), op_cross_entropy(l.d, lb.d, sd, (Tensor){0}, 0.37f);
    EXPECT_CLOSE(l, tol);
    double sg = op_read_scalar(sd), err = fabs(sg - s0) / fabs(s0);
    record_err(err, "loss_sum");
    ASSERT_MSG(err <= loss_tol, "V %lld loss_sum: gpu %.12g cpu %.12g", (long long)V, sg, s0);
    // Again with the per-row output (the same logits): each row's CE near the CPU's (0 where ignored), and the sum
    // and the gradients the same bits as without it.
    double c0 = 0, rc[13], rg[13], s2 = 1.25;
    Tensor rd = gpu_tensor(DT_F64, 1, R, 0, 0, 0), sd2 = gpu_tensor(DT_F64, 1, 1, 0, 0, 0);
    op_copy(sd2, tensor_make(&s2, DT_F64, DEV_CPU, 1, 1, 1, 1, 1));
    op_cross_entropy(l2.c, lb.c, tensor_make(&c0, DT_F64, DEV_CPU, 1, 1, 1, 1, 1),
                     tensor_make(rc, DT_F64, DEV_CPU, 1, R, 1, 1, 1), 0.37f);
    op_cross_entropy(l2.d, lb.d, sd2, rd, 0.37f);
    op_copy(tensor_make(rg, DT_F64, DEV_CPU, 1, R, 1, 1, 1), rd);
    ASSERT_MSG(op_read_scalar(sd2) == sg, "V %lld loss_sum with rows: %.17g, without: %.17g", (long long)V,
               op_read_scalar(sd2), sg);
    float *g1 = gpu_down(l.d), *g2 = gpu_down(l2.d);
    ASSERT(!memcmp(g1, g2, R * V * sizeof *g1));
    free(g1), free(g2);
    for (int r = 0; r < R; r++) {
        double e = fabs(rg[r] - rc[r]) / fmax(fabs(rc[r]), 1);
        record_err(e, "row_loss");
        ASSERT_MSG(lab[r] == -100 ? rg[r] == 0 : e <= loss_tol * 10, "V %lld row %d: gpu %.12g cpu %.12g", (long long)V,
                   r, rg[r], rc[r]);
    }
}

TEST(gpu_op_cross_entropy) {
    gpu_begin();
    gpu_mode(DT_F32);
    check_cross_entropy(DT_F32, 3001, 1e-5, 1e-6);
    check_cross_entropy(DT_F32, 131072, 1e-5, 1e-6); // the one-pass kernel's largest fp32 row
    gpu_mode(DT_BF16); // vector-width vocabularies (V % 8 == 0): one pass (up to 262,144), two passes beyond; ragged
    check_cross_entropy(DT_BF16, 4096, 1e-2, 1e-5);
    check_cross_entropy(DT_BF16, 248320, 1e-2, 1e-5);
    check_cross_entropy(DT_BF16, 262152, 1e-2, 1e-5);
    check_cross_entropy(DT_BF16, 3001, 1e-2, 1e-5);
    gpu_report();
}

// ---- elementwise, copies, optimizer ----
TEST(gpu_op_elementwise) {
    gpu_begin();
    int64_t n = 10007;
    MODES {
        gpu_mode(MODE_DT);
        Pair y = pair_rand(MODE_DT, 1, 1, n, 0, 0, 0), x = pair_rand(MODE_DT, 1, 1, n, 0, 0, 0);
        op_add(y.c, x.c), op_add(y.d, x.d);
        EXPECT_CLOSE(y, TOL);
        op_scale(y.c, 0.3f), op_scale(y.d, 0.3f);
        EXPECT_CLOSE(y, TOL);
        Pair g = pair_rand(DT_F32, 1, 1, n, 0, 0, 0);
        op_add(y.c, g.c), op_add(y.d, g.d); // fp32 into the mode's dtype
        EXPECT_CLOSE(y, TOL);
        // views one element in (not 16-byte aligned): the element-by-element path of the same kernels
        Pair yv = y, xv = x;
        yv.c.p = (float *)y.c.p + 1, yv.d.p = (char *)y.d.p + dtype_size(y.d.dt), yv.c.n[0] = yv.d.n[0] = n - 1;
        xv.c.p = (float *)x.c.p + 1, xv.d.p = (char *)x.d.p + dtype_size(x.d.dt), xv.c.n[0] = xv.d.n[0] = n - 1;
        op_add(yv.c, xv.c), op_add(yv.d, xv.d);
        op_scale(yv.c, 1.7f), op_scale(yv.d, 1.7f);
        EXPECT_CLOSE(y, TOL);
        double sc = op_sum_squares(x.c), sg = op_sum_squares(x.d);
        record_err(fabs(sg - sc) / sc, "sum_squares");
        ASSERT_MSG(fabs(sg - sc) / sc <= 1e-12, "sum_squares: gpu %.15g cpu %.15g", sg, sc);
        op_zero(y.c), op_zero(y.d);
        float *yz = gpu_down(y.d);
        for (int64_t i = 0; i < n; i++) ASSERT(yz[i] == 0);
        free(yz);
    }
    // copies: device fp32 → device bf16 → device fp32, and host ↔ device both ways
    Pair a = pair_rand(DT_F32, 1, 1, n, 0, 0, 0);
    Tensor b16 = gpu_tensor(DT_BF16, 1, n, 0, 0, 0), b32 = gpu_tensor(DT_F32, 1, n, 0, 0, 0);
    op_copy(b16, a.d);
    op_copy(b32, b16);
    float *back = gpu_down(b32), *ref = xmalloc(n * sizeof(float));
    memcpy(ref, a.c.p, n * sizeof(float));
    round_bf16(ref, n);
    for (int64_t i = 0; i < n; i++)
        ASSERT_MSG(back[i] == ref[i], "bf16 round trip at %lld: %g vs %g", (long long)i, back[i], ref[i]);
    op_copy(b32, a.d);
    float *same = gpu_down(b32);
    ASSERT(!memcmp(same, a.c.p, n * sizeof(float)));
    free(back), free(ref), free(same);
    // AdamW, three steps, fp32 and bf16 moments, fp32 and bf16 gradients
    gpu_mode(DT_F32);
    check_adamw(n, DT_F32, DT_F32);
    check_adamw(n, DT_BF16, DT_F32);
    check_adamw(n, DT_BF16, DT_BF16);
    // Σ x² over more values than one pass of the grid's threads: the loop of four loads a thread, its tail, n % 4;
    // fp32 and bf16 (the CPU's side holds the bf16 values)
    for (int i = 0; i < 2; i++) {
        Pair big = pair_rand(i ? DT_BF16 : DT_F32, 1, 1, (3 << 20) + 5, 0, 0, 0);
        double bc = op_sum_squares(big.c), bg = op_sum_squares(big.d);
        record_err(fabs(bg - bc) / bc, "sum_squares");
        ASSERT_MSG(fabs(bg - bc) / bc <= 1e-12, "sum_squares of %d: gpu %.15g cpu %.15g", (3 << 20) + 5, bg, bc);
    }
    float f = 3.5f;
    Tensor fd = gpu_tensor(DT_F32, 1, 1, 0, 0, 0);
    op_copy(fd, tensor_make(&f, DT_F32, DEV_CPU, 1, 1, 1, 1, 1));
    ASSERT(op_read_scalar(fd) == 3.5);
    gpu_report();
}

// The per-expert cuBLASLt path of the expert products (cuda_gemm.cu), forced with PITH_GROUPED_KERNEL=loop: uneven
// experts, an empty one, and an accumulating weight gradient; then skewed experts. bf16 against the CPU on the same
// rounded inputs.
TEST(gpu_op_grouped_paths) {
    gpu_begin();
    gpu_mode(DT_BF16);
    setenv("PITH_GROUPED_KERNEL", "loop", 1);
    int64_t calls0 = cuda_grouped_calls("wgmma");
    const int64_t offs[7] = {0, 37, 37, 100, 101, 180, 250};
    Pair po = pair_offs(offs, 7);
    int64_t E = 6, R = 250, K = 64, N = 96;
    DType dt = DT_BF16;
    Pair x = pair_rand(dt, 1, 2, R, K, 0, 0), w = pair_rand(dt, 0.5f, 3, E, N, K, 0), y = pair_nan(dt, 2, R, N, 0, 0);
    op_grouped_linear_forward(y.c, x.c, NONE, 0, w.c, NONE, po.c),
        op_grouped_linear_forward(y.d, x.d, NONE, 0, w.d, NONE, po.d);
    EXPECT_CLOSE(y, 1e-2);
    Pair dy = pair_rand(dt, 1, 2, R, N, 0, 0), dx = pair_nan(dt, 2, R, K, 0, 0),
         dw = pair_rand(DT_F32, 1, 3, E, N, K, 0);
    op_grouped_linear_backward_input(dx.c, dy.c, w.c, po.c), op_grouped_linear_backward_input(dx.d, dy.d, w.d, po.d);
    EXPECT_CLOSE(dx, 1e-2);
    op_grouped_linear_backward_weight(dw.c, NONE, dy.c, x.c, NONE, 0, po.c, true),
        op_grouped_linear_backward_weight(dw.d, NONE, dy.d, x.d, NONE, 0, po.d, true);
    EXPECT_CLOSE(dw, 1e-4);
    // skewed routing: two experts of over a thousand rows beside small ones
    const int64_t so[6] = {0, 1100, 1130, 1130, 2400, 2410};
    Pair pso = pair_offs(so, 6);
    int64_t E2 = 5, R2 = 2410;
    Pair x2 = pair_rand(dt, 1, 2, R2, K, 0, 0), w2 = pair_rand(dt, 0.5f, 3, E2, N, K, 0),
         y2 = pair_nan(dt, 2, R2, N, 0, 0);
    op_grouped_linear_forward(y2.c, x2.c, NONE, 0, w2.c, NONE, pso.c),
        op_grouped_linear_forward(y2.d, x2.d, NONE, 0, w2.d, NONE, pso.d);
    EXPECT_CLOSE(y2, 1e-2);
    Pair dy2 = pair_rand(dt, 1, 2, R2, N, 0, 0), dx2 = pair_nan(dt, 2, R2, K, 0, 0);
    op_grouped_linear_backward_input(dx2.c, dy2.c, w2.c, pso.c),
        op_grouped_linear_backward_input(dx2.d, dy2.d, w2.d, pso.d);
    EXPECT_CLOSE(dx2, 1e-2);
    unsetenv("PITH_GROUPED_KERNEL");
    ASSERT_MSG(cuda_grouped_calls("wgmma") == calls0,
               "the wgmma kernels ran %lld products under PITH_GROUPED_KERNEL=loop",
               (long long)(cuda_grouped_calls("wgmma") - calls0));
    gpu_report();
}

// Column slices between every dtype pair the models use (the CPU side is fp32 throughout).
static void check_copy_cols(DType dd, DType sd, bool acc) {
    int64_t R = 37, Cd = 200, Cs = 90, a = 64, b = 8, n = 72;
    Pair src = pair_rand(sd, 1, 2, R, Cs, 0, 0), dst = pair_rand(dd, 1, 2, R, Cd, 0, 0);
    op_copy_cols(dst.c, a, src.c, b, n, acc), op_copy_cols(dst.d, a, src.d, b, n, acc);
    EXPECT_CLOSE(dst, dd == DT_BF16 ? 1e-2 : 0); // into fp32 the copy (and sum) is exact
}

// Column blocks as MLA uses them: a shared block of n columns into each of 16 heads of 128 + n, and the heads' blocks
// summed back in order (fp32 on the GPU, rounded once: into fp32 it is the CPU's sum bit for bit). n = 64 takes the
// 16-byte path, n = 5 the scalar one.
static void check_col_blocks(DType dd, DType sd, bool acc, int64_t n) {
    int64_t R = 37, nh = 16, dq = 128 + n, Cp = 512 + n;
    Pair pe = pair_rand(sd, 1, 2, R, Cp, 0, 0), k = pair_rand(dd, 1, 2, R, nh * dq, 0, 0);
    op_copy_col_blocks(k.c, 128, dq, pe.c, 512, 0, n, nh, acc),
        op_copy_col_blocks(k.d, 128, dq, pe.d, 512, 0, n, nh, acc);
    EXPECT_CLOSE(k, dd == DT_BF16 ? 1e-2 : 0);
    Pair dpe = pair_rand(sd, 1, 2, R, Cp, 0, 0);
    op_copy_col_blocks(dpe.c, 512, 0, k.c, 128, dq, n, nh, acc),
        op_copy_col_blocks(dpe.d, 512, 0, k.d, 128, dq, n, nh, acc);
    EXPECT_CLOSE(dpe, sd == DT_BF16 || dd == DT_BF16 ? 1e-2 : 0); // k.d holds the broadcast rounded to dd
}

TEST(gpu_op_copy_cols) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        for (int acc = 0; acc < 2; acc++) {
            check_copy_cols(MODE_DT, MODE_DT, acc);
            check_copy_cols(DT_F32, MODE_DT, acc);
            check_copy_cols(MODE_DT, DT_F32, acc);
            for (int64_t n = 5; n <= 64; n += 59) {
                check_col_blocks(MODE_DT, MODE_DT, acc, n);
                check_col_blocks(DT_F32, MODE_DT, acc, n);
                check_col_blocks(MODE_DT, DT_F32, acc, n);
            }
        }
    }
    gpu_report();
}
