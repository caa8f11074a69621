// test_gpu_docmask.c — document masking (AttnArgs.docpos) on the GPU's attention kernels against the CPU reference
// (src/ops/cpu/cpu_attention.c): forward o and lse, backward dq, dk, dv (and dsinks), in fp32 (tolerance 1e-5) and
// bf16 (1e-2; the CPU runs on the same bf16-rounded inputs), for every form pith's kernels take: the tensor-core
// kernels (bf16 causal self-attention, head dim 128, 64, Qwen3.5's 256 and MLA's 192/128, GPT-OSS's window and sinks:
// path "flash"), and the generic kernels (fp32, blocks at offsets: path "generic"). cuDNN never runs with
// documents. The tensor-core kernels' window and sinks without documents are here too (PITH_ATTENTION=own). The
// documents have several lengths: 1-token documents, documents that cross a 64-row tile edge, a sequence whose first
// document began before it (docpos[0] > 0), query blocks whose documents start after every key of the block
// (lse −∞). Shapes: q (B·Sq, nh, dqk), k (B·Sk, nkv, dqk), v (B·Sk, nkv, dv), docpos (B·Sq).
#include "gpu_test.h"
#include "ops/cuda/cuda_ops.h"

#define MODES for (int mode_ = 0; mode_ < 2; mode_++)
#define MODE_DT (mode_ ? DT_BF16 : DT_F32)
#define TOL (mode_ ? 1e-2 : 1e-5)

// Document starts of one sequence, as positions (kpos/qpos); a start at or before the sequence's first position
// makes its first document one that began earlier.
typedef struct {
    int n;
    int64_t at[24];
} Starts;

// docpos of Sq queries at q_off, q_off + 1, …: each query's distance from the latest start at or before it.
static void fill_docpos(int32_t *dp, int Sq, int64_t q_off, const Starts *s) {
    for (int i = 0; i < Sq; i++) {
        int64_t qp = q_off + i, st = INT64_MIN;
        for (int d = 0; d < s->n; d++)
            if (s->at[d] <= qp && s->at[d] > st) st = s->at[d];
        ASSERT_MSG(st != INT64_MIN, "no document start at or before position %lld", (long long)qp);
        dp[i] = (int32_t)(qp - st);
    }
}

// Starts every len[0], len[1], … tokens (cycled) from position 0 up to S.
static Starts starts_every(const int *len, int nlen, int S) {
    Starts s = {0};
    for (int64_t p = 0, d = 0; p < S && s.n < 24; p += len[d++ % nlen]) s.at[s.n++] = p; // past 24: one document
    return s;
}

// One form with documents: docpos (B·Sq) host values (NULL: none), GPU against CPU forward and backward; the path
// both GPU directions ran must be `want`.
static void check_docs(DType dt, double tol, int Sq, int Sk, int nh, int nkv, int dqk, int dv, AttnArgs a, bool sinks,
                       const int32_t *docpos, const char *want, const char *what) {
    int B = a.B;
    int64_t Tq = (int64_t)B * Sq, Tk = (int64_t)B * Sk;
    Pair q = pair_rand(dt, 1, 3, Tq, nh, dqk, 0), k = pair_rand(dt, 1, 3, Tk, nkv, dqk, 0),
         v = pair_rand(dt, 1, 3, Tk, nkv, dv, 0);
    Pair sk = pair_rand(DT_F32, 1, 1, nh, 0, 0, 0), o = pair_nan(dt, 3, Tq, nh, dv, 0),
         lse = pair_nan(DT_F32, 3, B, nh, Sq, 0), dp = docpos ? pair_i32(docpos, Tq) : NOPAIR;
    AttnArgs ac = a, ad = a;
    ac.docpos = dp.c, ad.docpos = dp.d;
    if (sinks) ac.sinks = sk.c, ad.sinks = sk.d;
    op_attention_forward(o.c, lse.c, q.c, k.c, v.c, &ac), op_attention_forward(o.d, lse.d, q.d, k.d, v.d, &ad);
    const char *fwd = cuda_attention_last_path();
    EXPECT_CLOSE(o, tol);
    expect_lse(lse, tol);
    // the backward reads o and lse: both sides get the CPU's (rounded to dt), so only the backward differs
    Pair oc = pair_from(dt, o.c.p, 3, Tq, nh, dv, 0), lc = pair_from(DT_F32, lse.c.p, 3, B, nh, Sq, 0);
    Pair dout = pair_rand(dt, 1, 3, Tq, nh, dv, 0), ds = pair_rand(DT_F32, 1, 1, nh, 0, 0, 0);
    Pair dq = pair_nan(dt, 3, Tq, nh, dqk, 0), dk = pair_nan(dt, 3, Tk, nkv, dqk, 0),
         dvv = pair_nan(dt, 3, Tk, nkv, dv, 0);
    op_attention_backward(dq.c, dk.c, dvv.c, sinks ? ds.c : NONE, dout.c, q.c, k.c, v.c, oc.c, lc.c, &ac);
    op_attention_backward(dq.d, dk.d, dvv.d, sinks ? ds.d : NONE, dout.d, q.d, k.d, v.d, oc.d, lc.d, &ad);
    const char *bwd = cuda_attention_last_path();
    printf("     %s %s: forward %s, backward %s; o %.2e dq %.2e dk %.2e dv %.2e\n", what,
           dt == DT_BF16 ? "bf16" : "fp32", fwd, bwd, pair_err(o), pair_err(dq), pair_err(dk), pair_err(dvv));
    EXPECT_CLOSE(dq, tol);
    EXPECT_CLOSE(dk, tol);
    EXPECT_CLOSE(dvv, tol);
    if (sinks) EXPECT_CLOSE(ds, tol);
    ASSERT_MSG(!strcmp(fwd, want) && !strcmp(bwd, want), "%s ran %s/%s, not %s", what, fwd, bwd, want);
}

// Self-attention of B sequences of S tokens with the documents of starts[b] in sequence b.
static void check_self_docs(DType dt, double tol, int S, int nh, int nkv, int dqk, int dv, AttnArgs a, bool sinks,
                            const Starts *starts, const char *want, const char *what) {
    int32_t *dp = xmalloc((size_t)a.B * S * sizeof(int32_t));
    for (int b = 0; b < a.B; b++) fill_docpos(dp + (int64_t)b * S, S, 0, &starts[b]);
    check_docs(dt, tol, S, S, nh, nkv, dqk, dv, a, sinks, dp, want, what);
    free(dp);
}

// Two sequences of 300: 1-token documents at the start, in the middle and at the end, documents across the 64-row
// tile edges (60..130, 130..200), and a second sequence that begins inside a document (start −37) and has a
// 1-token document at a tile edge (position 64).
static const Starts docs300[2] = {{9, {0, 1, 2, 3, 60, 130, 131, 200, 299}}, {5, {-37, 63, 64, 65, 191}}};

// The tensor-core kernels (bf16 causal self-attention, head dims 128, 64, 256 and MLA's 192/128) with documents.
TEST(gpu_op_attention_docs_flash) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        const char *want = mode_ ? "flash" : "generic";
        check_self_docs(MODE_DT, TOL, 300, 8, 2, 128, 128, (AttnArgs){.B = 2, .scale = 0.0884f, .causal = true}, false,
                        docs300, want, "d 128, GQA 4");
        check_self_docs(MODE_DT, TOL, 300, 4, 4, 64, 64, (AttnArgs){.B = 2, .scale = 0.125f, .causal = true}, false,
                        docs300, want, "d 64");
        check_self_docs(MODE_DT, TOL, 300, 8, 2, 256, 256, (AttnArgs){.B = 2, .scale = 0.0625f, .causal = true}, false,
                        docs300, want, "d 256 (Qwen3.5)");
        check_self_docs(MODE_DT, TOL, 300, 4, 4, 192, 128,
                        (AttnArgs){.B = 2, .scale = 1.0f / sqrtf(192.0f), .causal = true}, false, docs300, want,
                        "MLA 192/128");
        // GPT-OSS's forms: head dim 64, 8 query heads per kv head, sinks, its sliding layers' window 128 (more than a
        // tile) and a window of 37 (less than one), its full layers causal; a window at head dim 128
        float s64 = 0.125f;
        check_self_docs(MODE_DT, TOL, 300, 16, 2, 64, 64,
                        (AttnArgs){.B = 2, .scale = s64, .causal = true, .window = 128}, true, docs300, want,
                        "GPT-OSS window 128 + sinks");
        check_self_docs(MODE_DT, TOL, 300, 16, 2, 64, 64,
                        (AttnArgs){.B = 2, .scale = s64, .causal = true, .window = 37}, true, docs300, want,
                        "window 37 + sinks");
        check_self_docs(MODE_DT, TOL, 300, 16, 2, 64, 64, (AttnArgs){.B = 2, .scale = s64, .causal = true}, true,
                        docs300, want, "GPT-OSS causal + sinks");
        check_self_docs(MODE_DT, TOL, 300, 8, 2, 128, 128,
                        (AttnArgs){.B = 2, .scale = 0.0884f, .causal = true, .window = 100}, false, docs300, want,
                        "d 128 window 100");
        // every token its own document: each query sees itself only. With sinks, so that dq and dk are not 0: without
        // one p = 1 and ds = dO·v − dO·o is exactly 0 on the CPU, while the GPU's two dot products of the same terms in
        // another order leave an ulp, which no relative error can measure against 0.
        int32_t dp[70] = {0};
        check_docs(MODE_DT, TOL, 70, 70, 4, 2, 128, 128, (AttnArgs){.B = 1, .scale = 0.0884f, .causal = true}, true, dp,
                   want, "1-token documents only, sinks");
        if (!getenv("PITH_TEST_SANITIZE")) {
            // documents of about 1,000 tokens over 4 sequences of 1,100 (18 tiles), a group of 8 query heads
            int lens[3] = {1000, 937, 63};
            Starts st[4];
            for (int b = 0; b < 4; b++) st[b] = starts_every(lens + (b % 3), 3 - b % 3, 1100);
            check_self_docs(MODE_DT, TOL, 1100, 8, 1, 128, 128, (AttnArgs){.B = 4, .scale = 0.0884f, .causal = true},
                            false, st, want, "documents of ~1000 over 1100");
        }
    }
    gpu_report();
}

// The tensor-core kernels' window and sinks without documents (PITH_ATTENTION=own: cuDNN takes these forms by
// default), bf16: GPT-OSS's shapes (window 128 over 300 and 129 tokens, causal with sinks), a window of 37 and one of
// 100 at head dim 128; plain causal at head dims 256 and MLA's 192/128 (dk and dv from two launches).
TEST(gpu_op_attention_flash_window) {
    gpu_begin();
    gpu_mode(DT_BF16);
    setenv("PITH_ATTENTION", "own", 1);
    double tol = 1e-2;
    float s64 = 0.125f;
    check_docs(DT_BF16, tol, 300, 300, 16, 2, 64, 64, (AttnArgs){.B = 2, .scale = s64, .causal = true, .window = 128},
               true, NULL, "flash", "window 128 + sinks");
    check_docs(DT_BF16, tol, 129, 129, 16, 2, 64, 64, (AttnArgs){.B = 1, .scale = s64, .causal = true, .window = 128},
               true, NULL, "flash", "window 128 + sinks, 129 tokens");
    check_docs(DT_BF16, tol, 300, 300, 16, 2, 64, 64, (AttnArgs){.B = 2, .scale = s64, .causal = true}, true, NULL,
               "flash", "causal + sinks");
    check_docs(DT_BF16, tol, 200, 200, 8, 2, 64, 64, (AttnArgs){.B = 1, .scale = s64, .causal = true, .window = 37},
               false, NULL, "flash", "window 37");
    check_docs(DT_BF16, tol, 300, 300, 8, 2, 128, 128,
               (AttnArgs){.B = 2, .scale = 0.0884f, .causal = true, .window = 100}, true, NULL, "flash",
               "d 128 window 100 + sinks");
    check_docs(DT_BF16, tol, 300, 300, 8, 2, 256, 256, (AttnArgs){.B = 2, .scale = 0.0625f, .causal = true}, false,
               NULL, "flash", "d 256 causal");
    check_docs(DT_BF16, tol, 300, 300, 4, 4, 192, 128,
               (AttnArgs){.B = 2, .scale = 1.0f / sqrtf(192.0f), .causal = true}, false, NULL, "flash", "MLA causal");
    unsetenv("PITH_ATTENTION");
    gpu_report();
}

// The generic kernels' forms with documents: the tiny models'
// 32/16, a block of queries against a block of keys at offsets (ring attention's hops: queries whose document starts
// after every key see nothing).
TEST(gpu_op_attention_docs_forms) {
    gpu_begin();
    MODES {
        gpu_mode(MODE_DT);
        float s192 = 1.0f / sqrtf(192.0f), s64 = 0.125f;
        check_self_docs(MODE_DT, TOL, 300, 4, 2, 32, 16, (AttnArgs){.B = 2, .scale = 0.2f, .causal = true}, false,
                        docs300, "generic", "32/16");
        // 48 queries at 96..143 against 96 keys at 0..95 (no causal mask: a ring hop's earlier block); documents
        // start at 0, 50, 100 and 130: queries from 100 on see nothing
        Starts hop = {4, {0, 50, 100, 130}};
        int32_t dp[2 * 48];
        fill_docpos(dp, 48, 96, &hop), fill_docpos(dp + 48, 48, 96, &hop);
        check_docs(MODE_DT, TOL, 48, 96, 4, 2, 64, 64, (AttnArgs){.B = 2, .scale = s64, .q_off = 96}, false, dp,
                   "generic", "a block at offset 96");
        // a causal pair at offsets (queries 64..127 against keys 100..163), documents from 0, 90, 120
        Starts pair = {3, {0, 90, 120}};
        int32_t dp2[64];
        fill_docpos(dp2, 64, 64, &pair);
        check_docs(MODE_DT, TOL, 64, 64, 4, 2, 192, 128,
                   (AttnArgs){.B = 1, .scale = s192, .causal = true, .q_off = 64, .k_off = 100}, true, dp2, "generic",
                   "a causal pair at offsets 64/100");
    }
    gpu_report();
}

// The GPU's forward and backward of one form on given inputs: host copies of o, lse, dq, dk, dv, dsinks.
typedef struct {
    float *t[6];
    int64_t n[6];
} Outs;
static Outs gpu_fwd_bwd(Pair q, Pair k, Pair v, Pair dout, Pair sk, Tensor docpos, AttnArgs a, bool sinks) {
    DType dt = q.d.dt;
    int64_t Tq = q.d.n[0], Tk = k.d.n[0], nh = q.d.n[1], nkv = k.d.n[1], dqk = q.d.n[2], dv = v.d.n[2];
    Tensor o = gpu_tensor(dt, 3, Tq, nh, dv, 0), lse = gpu_tensor(DT_F32, 3, a.B, nh, Tq / a.B, 0);
    Tensor dq = gpu_tensor(dt, 3, Tq, nh, dqk, 0), dk = gpu_tensor(dt, 3, Tk, nkv, dqk, 0),
           dvv = gpu_tensor(dt, 3, Tk, nkv, dv, 0), ds = gpu_tensor(DT_F32, 1, nh, 0, 0, 0);
    a.docpos = docpos;
    if (sinks) a.sinks = sk.d;
    op_zero(ds);
    op_attention_forward(o, lse, q.d, k.d, v.d, &a);
    op_attention_backward(dq, dk, dvv, sinks ? ds : NONE, dout.d, q.d, k.d, v.d, o, lse, &a);
    Outs r;
    Tensor t[6] = {o, lse, dq, dk, dvv, ds};
    for (int i = 0; i < 6; i++) r.t[i] = gpu_down(t[i]), r.n[i] = tensor_numel(t[i]);
    return r;
}

// Two results equal bit for bit (NaN included: the bits are compared).
static void expect_same_bits(Outs x, Outs y, const char *what) {
    const char *nm[6] = {"o", "lse", "dq", "dk", "dv", "dsinks"};
    for (int i = 0; i < 6; i++) {
        int64_t bad = -1;
        for (int64_t e = 0; e < x.n[i] && bad < 0; e++)
            if (memcmp(&x.t[i][e], &y.t[i][e], sizeof(float))) bad = e;
        ASSERT_MSG(bad < 0, "%s: %s[%lld] differs: %.9g vs %.9g", what, nm[i], (long long)bad, x.t[i][bad],
                   y.t[i][bad]);
        free(x.t[i]), free(y.t[i]);
    }
}

// The deterministic path (AttnArgs.deterministic: pith's kernels, no atomics) with documents gives the same bits
// twice: the tensor-core kernels (d 128) and the generic ones (MLA 192/128; GPT-OSS 64 with a window and sinks,
// whose dsinks kernel sums in a fixed order), bf16.
TEST(gpu_op_attention_docs_det) {
    gpu_begin();
    struct {
        int nh, nkv, dqk, dv, window;
        bool sinks;
        const char *what;
    } f[3] = {{8, 2, 128, 128, 0, false, "d 128"},
              {4, 4, 192, 128, 0, false, "MLA 192/128"},
              {16, 2, 64, 64, 128, true, "GPT-OSS window 128 + sinks"}};
    for (int c = 0; c < 3; c++) {
        int S = 300, B = 2;
        int64_t T = (int64_t)B * S;
        DType dt = DT_BF16;
        Pair q = pair_rand(dt, 1, 3, T, f[c].nh, f[c].dqk, 0), k = pair_rand(dt, 1, 3, T, f[c].nkv, f[c].dqk, 0),
             v = pair_rand(dt, 1, 3, T, f[c].nkv, f[c].dv, 0), dout = pair_rand(dt, 1, 3, T, f[c].nh, f[c].dv, 0),
             sk = pair_rand(DT_F32, 1, 1, f[c].nh, 0, 0, 0);
        int32_t dp[2 * 300];
        for (int b = 0; b < B; b++) fill_docpos(dp + b * S, S, 0, &docs300[b]);
        Pair dpp = pair_i32(dp, T);
        AttnArgs a = {.B = B,
                      .scale = 1.0f / sqrtf((float)f[c].dqk),
                      .causal = true,
                      .window = f[c].window,
                      .deterministic = true};
        Outs x = gpu_fwd_bwd(q, k, v, dout, sk, dpp.d, a, f[c].sinks);
        const char *path = cuda_attention_last_path();
        Outs y = gpu_fwd_bwd(q, k, v, dout, sk, dpp.d, a, f[c].sinks);
        printf("     %s: %s twice, equal bits\n", f[c].what, path);
        expect_same_bits(x, y, f[c].what);
        ASSERT_MSG(strcmp(path, "cudnn"), "%s: the deterministic path ran cuDNN", f[c].what);
    }
}

// One document per sequence (docpos[i] = i) is the plain form bit for bit on pith's kernels (PITH_ATTENTION=own in
// bf16): the document bounds then never mask or skip anything, and the arithmetic is the same in the same order.
TEST(gpu_op_attention_docs_whole) {
    gpu_begin();
    setenv("PITH_ATTENTION", "own", 1);
    MODES {
        DType dt = MODE_DT;
        int S = 200, B = 2, nh = 8, nkv = 2, d = mode_ ? 128 : 64;
        int64_t T = (int64_t)B * S;
        Pair q = pair_rand(dt, 1, 3, T, nh, d, 0), k = pair_rand(dt, 1, 3, T, nkv, d, 0),
             v = pair_rand(dt, 1, 3, T, nkv, d, 0), dout = pair_rand(dt, 1, 3, T, nh, d, 0),
             sk = pair_rand(DT_F32, 1, 1, nh, 0, 0, 0);
        int32_t dp[2 * 200];
        for (int i = 0; i < T; i++) dp[i] = i % S;
        Pair dpp = pair_i32(dp, T);
        AttnArgs a = {.B = B, .scale = 1.0f / sqrtf((float)d), .causal = true};
        Outs x = gpu_fwd_bwd(q, k, v, dout, sk, NONE, a, false);
        const char *p0 = cuda_attention_last_path();
        Outs y = gpu_fwd_bwd(q, k, v, dout, sk, dpp.d, a, false);
        const char *p1 = cuda_attention_last_path();
        printf("     %s: no docpos (%s) and one document (%s), equal bits\n", dt == DT_BF16 ? "bf16" : "fp32", p0, p1);
        ASSERT_MSG(!strcmp(p0, p1) && !strcmp(p1, mode_ ? "flash" : "generic"), "paths %s and %s", p0, p1);
        expect_same_bits(x, y, "one document");
    }
    unsetenv("PITH_ATTENTION");
}
