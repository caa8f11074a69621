// bench_gpu_ops.c — times the CUDA ops at Qwen3-30B-A3B layer sizes (hidden 2048, 32 query / 4 kv heads
// of 128, 128 experts top-8 of width 768, vocab 151936) on one micro-batch of T = 4096 tokens, bf16.
// Each op: one warm-up call, then the mean over reps of host time around the launches with one stream
// sync at the end (launch overhead included). Prints time, and TFLOP/s or GB/s against the minimum
// bytes moved, and one machine-readable line per op ("BENCH|name|ms|rate|unit") that
// bench/report.py puts beside the PyTorch peer's numbers (bench/peer_kernels.py, same names).
// `make bench-gpu` (on the GPU machine).
#include <math.h>
#include <stdlib.h>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

static Arena A;
static Tensor dev(DType dt, int nd, int64_t n0, int64_t n1, int64_t n2) {
    return arena_tensor(&A, dt, nd, n0, n1, n2, 0);
}

// Fills a device tensor (fp32/bf16) with N(0, scale²) through a host fp32 buffer.
static void fill(Tensor t, float scale, uint64_t stream) {
    int64_t n = tensor_numel(t);
    float *h = xmalloc(n * sizeof(float));
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) h[i] = scale * (float)rng_normal(42, stream, (uint64_t)i);
    op_copy(t, tensor_make(h, DT_F32, DEV_CPU, t.nd, t.n[0], t.n[1], t.n[2], t.n[3]));
    free(h);
}

static double last_ms; // the time of the latest TIME, for sums

#define TIME(name, reps, work, unit, call)                                                                             \
    do {                                                                                                               \
        call;                                                                                                          \
        cuda_sync();                                                                                                   \
        double t0_ = now_seconds();                                                                                    \
        for (int r_ = 0; r_ < (reps); r_++) call;                                                                      \
        cuda_sync();                                                                                                   \
        double s_ = (now_seconds() - t0_) / (reps), rate_ = (work) / s_ / 1e12 * (unit[0] == 'G' ? 1e3 : 1);           \
        last_ms = s_ * 1e3;                                                                                            \
        printf("%-44s %9.3f ms  %8.1f %s\n", name, s_ * 1e3, rate_, unit);                                             \
        printf("BENCH|%s|%.4f|%.1f|%s\n", name, s_ * 1e3, rate_, unit);                                                \
        fflush(stdout);                                                                                                \
    } while (0)

static void report(const char *name, double ms, double work, const char *unit) {
    double rate = work / (ms / 1e3) / 1e12 * (unit[0] == 'G' ? 1e3 : 1);
    printf("%-44s %9.3f ms  %8.1f %s\n", name, ms, rate, unit);
    printf("BENCH|%s|%.4f|%.1f|%s\n", name, ms, rate, unit);
}

// Expert rows of T·k slots under the router's choice on random N(0, 1) hidden states and N(0, 0.02²)
// router weights (natural routing as initialised), or balanced (R/E each).
static void routing_offs(int64_t *offs, int64_t T, int64_t H, int64_t E, int k, bool balanced) {
    if (balanced) {
        for (int64_t e = 0; e <= E; e++) offs[e] = e * (T * k / E);
        return;
    }
    Arena save = A;
    Tensor x = dev(DT_BF16, 2, T, H, 0), wr = dev(DT_BF16, 2, E, H, 0), lg = dev(DT_F32, 2, T, E, 0),
           pr = dev(DT_F32, 2, T, E, 0);
    Tensor idx = dev(DT_I32, 2, T, k, 0), w = dev(DT_F32, 2, T, k, 0), perm = dev(DT_I32, 1, T * k, 0, 0);
    fill(x, 1, 90), fill(wr, 0.02f, 91);
    op_linear_forward(lg, x, wr, (Tensor){0});
    op_router_forward(pr, idx, w, lg, &(RouterArgs){.k = k, .renorm = true, .scale = 1});
    Tensor d = dev(DT_I64, 1, E + 1, 0, 0);
    op_moe_sort(perm, NONE, d, idx, (int)E);
    op_copy(ti64_1(offs, E + 1), d);
    A.used = save.used; // the routing buffers are scratch
    int64_t mx = 0, mn = T * k;
    for (int64_t e = 0; e < E; e++)
        mx = offs[e + 1] - offs[e] > mx ? offs[e + 1] - offs[e] : mx,
        mn = offs[e + 1] - offs[e] < mn ? offs[e + 1] - offs[e] : mn;
    printf("(natural routing: rows per expert %lld..%lld, mean %lld)\n", (long long)mn, (long long)mx,
           (long long)(T * k / E));
}

// Skewed expert rows that bench/peer_grouped.py builds the same way: expert e holds R·q_e/Σq rows, q_e =
// 10⁶/(e + 8) (integer division), the remainder on expert 0; at R = 65536 over 128 experts the largest holds
// 5.5× the mean, about what the router gives at initialisation.
static void skewed_offs(int64_t *offs, int64_t R, int64_t E) {
    int64_t Q = 0, used = 0;
    for (int64_t e = 0; e < E; e++) Q += 1000000 / (e + 8);
    offs[0] = 0;
    for (int64_t e = 0; e < E; e++) used += R * (1000000 / (e + 8)) / Q;
    for (int64_t e = 0; e < E; e++) offs[e + 1] = offs[e] + R * (1000000 / (e + 8)) / Q + (e == 0 ? R - used : 0);
}

// A shuffle of the R = T·k slots on the device: the one-rank dispatch's permutation, row i of the expert-ordered rows
// being token row perm[i] / k.
static Tensor shuffled_slots(int64_t R) {
    Tensor perm = dev(DT_I32, 1, R, 0, 0);
    int32_t *hp = xmalloc(R * sizeof(int32_t));
    for (int64_t i = 0; i < R; i++) hp[i] = (int32_t)i;
    for (int64_t i = R - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_u64(60, 0, (uint64_t)i) % (uint64_t)(i + 1));
        int32_t t = hp[i];
        hp[i] = hp[j], hp[j] = t;
    }
    op_copy(perm, tensor_make(hp, DT_I32, DEV_CPU, 1, R, 1, 1, 1)), free(hp);
    return perm;
}
// The expert GEMMs of one MoE layer at T tokens, top-k of E experts of width I, both projections: gate_up
// (E, 2I, H) and down (E, H, I), under balanced and skewed routing, for each implementation: the wgmma kernels
// (cuda_wgmma.cu, the default) and "loop" (one cuBLASLt product per expert on the side streams, cuda_gemm.cu).
// Row names match bench/peer_grouped.py's. Weight-gradient rows count the fp32 accumulation into dw (the
// peer writes a bf16 dw); their floor is E·N·K·8 bytes read and written once at the copy rate. The "store" rows
// write the fp32 dw instead (a step's first micro-batch): E·N·K·4 bytes; "bf16 store" a bf16 dw (gradient_dtype bf16),
// half that. nimpl: the first 1 (wgmma) or both.
static void bench_grouped(const char *model, int64_t T, int64_t H, int64_t E, int k, int64_t I, int nimpl) {
    Arena save = A;
    int64_t R = T * k, *offs = xmalloc((E + 1) * sizeof(int64_t));
    DType bf = DT_BF16;
    Tensor xe = dev(bf, 2, R, H, 0), wgu = dev(bf, 3, E, 2 * I, H), gu = dev(bf, 2, R, 2 * I, 0),
           act = dev(bf, 2, R, I, 0), doffs = dev(DT_I64, 1, E + 1, 0, 0);
    Tensor wd = dev(bf, 3, E, H, I), ye = dev(bf, 2, R, H, 0), dwgu = dev(DT_F32, 3, E, 2 * I, H),
           dwd = dev(DT_F32, 3, E, H, I), hgu = tensor_make(dwgu.p, bf, DEV_CUDA, 3, E, 2 * I, H, 1),
           hd = tensor_make(dwd.p, bf, DEV_CUDA, 3, E, H, I, 1); // bf16 views of the fp32 buffers' first halves
    fill(xe, 1, 54), fill(wgu, 0.02f, 55), fill(gu, 1, 56), fill(act, 1, 57), fill(wd, 0.02f, 58), fill(ye, 1, 59),
        op_zero(dwgu), op_zero(dwd);
    // the one-rank dispatch's rows: xe = xt[perm[i] / k], perm a shuffle of the T·k slots ("gather_rows": the copy that
    // makes xe before the products)
    Tensor xt = dev(bf, 2, T, H, 0), perm = shuffled_slots(R), bgu = dev(bf, 2, E, 2 * I, 0);
    fill(xt, 1, 61), fill(bgu, 1, 62);
    double fg = 2.0 * R * 2 * I * H, fdn = 2.0 * R * I * H;
    const char *impl[2] = {"wgmma", "loop"};
    for (int bal = 1; bal >= 0; bal--) {
        if (bal) routing_offs(offs, T, H, E, k, true);
        else skewed_offs(offs, R, E);
        op_copy(doffs, ti64_1(offs, E + 1));
        const char *rt = bal ? "balanced" : "skewed";
        for (int i = 0; i < 50; i++) op_grouped_linear_forward(gu, xe, NONE, 0, wgu, NONE, doffs); // clocks up
        cuda_sync();
        for (int v = 0; v < nimpl; v++) {
            setenv("PITH_GROUPED_KERNEL", impl[v], 1);
            char nm[112];
#define GROUPED_ROW(what, work, call)                                                                                  \
    snprintf(nm, sizeof nm, "%s %s (T=%lld, %s, %s)", model, what, (long long)T, rt, impl[v]);                         \
    TIME(nm, 10, work, "TFLOP/s", call)
            GROUPED_ROW("gate_up fwd", fg, op_grouped_linear_forward(gu, xe, NONE, 0, wgu, NONE, doffs));
            GROUPED_ROW("gate_up bwd input", fg, op_grouped_linear_backward_input(xe, gu, wgu, doffs));
            GROUPED_ROW("gate_up bwd weight fp32", fg,
                        op_grouped_linear_backward_weight(dwgu, NONE, gu, xe, NONE, 0, doffs, true));
            GROUPED_ROW("down fwd", fdn, op_grouped_linear_forward(ye, act, NONE, 0, wd, NONE, doffs));
            GROUPED_ROW("down bwd input", fdn, op_grouped_linear_backward_input(act, ye, wd, doffs));
            GROUPED_ROW("down bwd weight fp32", fdn,
                        op_grouped_linear_backward_weight(dwd, NONE, ye, act, NONE, 0, doffs, true));
            // a step's first micro-batch writes dw instead of adding (what the 8-layer benchmark runs)
            GROUPED_ROW("gate_up bwd weight fp32 store", fg,
                        op_grouped_linear_backward_weight(dwgu, NONE, gu, xe, NONE, 0, doffs, false));
            GROUPED_ROW("down bwd weight fp32 store", fdn,
                        op_grouped_linear_backward_weight(dwd, NONE, ye, act, NONE, 0, doffs, false));
            GROUPED_ROW("gate_up bwd weight bf16 store", fg,
                        op_grouped_linear_backward_weight(hgu, NONE, gu, xe, NONE, 0, doffs, false));
            GROUPED_ROW("down bwd weight bf16 store", fdn,
                        op_grouped_linear_backward_weight(hd, NONE, ye, act, NONE, 0, doffs, false));
            if (v == 0) {
                snprintf(nm, sizeof nm, "%s gather_rows (T=%lld, %s)", model, (long long)T, rt);
                TIME(nm, 10, 2.0 * R * H * 2, "GB/s", op_gather_rows(xe, xt, perm, k));
                // the SwiGLU after gate_up; at GPT-OSS's widths its form: interleaved, clamped
                bool oss = 2 * I % 256 != 0;
                float al = oss ? 1.702f : 0, lim = oss ? 7.0f : 0;
                snprintf(nm, sizeof nm, "%s swiglu (T=%lld, %s)", model, (long long)T, rt);
                TIME(nm, 10, 3.0 * R * I * 2, "GB/s", op_swiglu_forward(act, gu, al, lim));
                // a per-expert bias (GPT-OSS's), added in the product's epilogue (against "gate_up fwd")
                GROUPED_ROW("gate_up fwd + bias", fg, op_grouped_linear_forward(gu, xe, NONE, 0, wgu, bgu, doffs));
            }
#undef GROUPED_ROW
        }
    }
    unsetenv("PITH_GROUPED_KERNEL");
    printf("(%s dw floor at 4.0 TB/s: gate_up %.3f ms, down %.3f ms)\n", model, E * 2 * I * H * 8 / 4.0e9,
           E * H * I * 8 / 4.0e9);
    free(offs);
    A.used = save.used;
}

// FP8 (docs/architecture.md, "FP8") beside bf16 at the same expert shapes, balanced routing: the FP8 GEMMs on the
// wgmma E4M3 kernel, activation quantisation included, each row's FP8/bf16 speed ratio; the gate_up forward and weight
// gradient as one GPU trains them (the bf16 ones on xe gathered by gather_rows, the FP8 ones gathering the token rows
// as they quantise; bf16 expert gradients, the bench configs' gradient_dtype); and the quantisers, rounding and weight
// quantisation alone.
static void bench_grouped_fp8(const char *model, int64_t T, int64_t H, int64_t E, int k, int64_t I) {
    Arena save = A;
    int64_t R = T * k, *offs = xmalloc((E + 1) * sizeof(int64_t));
    DType bf = DT_BF16;
    Tensor xe = dev(bf, 2, R, H, 0), wgu = dev(bf, 3, E, 2 * I, H), gu = dev(bf, 2, R, 2 * I, 0),
           act = dev(bf, 2, R, I, 0), wd = dev(bf, 3, E, H, I), ye = dev(bf, 2, R, H, 0),
           dwgu = dev(DT_F32, 3, E, 2 * I, H), dwd = dev(DT_F32, 3, E, H, I), xq = dev(bf, 2, R, H, 0),
           doffs = dev(DT_I64, 1, E + 1, 0, 0), xt = dev(bf, 2, T, H, 0), perm = shuffled_slots(R),
           hgu = tensor_make(dwgu.p, bf, DEV_CUDA, 3, E, 2 * I, H, 1); // a bf16 view of the fp32 buffer's first half
    Tensor bgu = dev(DT_U8, 1, (int64_t)op_fp8_experts_bytes(E, 2 * I, H), 0, 0),
           bd = dev(DT_U8, 1, (int64_t)op_fp8_experts_bytes(E, H, I), 0, 0);
    Fp8Weight qgu = op_fp8_experts_view(bgu.p, DEV_CUDA, E, 2 * I, H),
              qd = op_fp8_experts_view(bd.p, DEV_CUDA, E, H, I);
    fill(xe, 1, 54), fill(wgu, 0.02f, 55), fill(gu, 1, 56), fill(act, 1, 57), fill(wd, 0.02f, 58), fill(ye, 1, 59),
        fill(xt, 1, 61), op_zero(dwgu), op_zero(dwd), op_fp8_weight_make(qgu, wgu), op_fp8_weight_make(qd, wd);
    int64_t tc0 = cuda_fp8_tensor_core_gemms();
    routing_offs(offs, T, H, E, k, true);
    op_copy(doffs, ti64_1(offs, E + 1));
    double fg = 2.0 * R * 2 * I * H, fdn = 2.0 * R * I * H, by = (double)R * H * 4;
    char nm[112];
    for (int i = 0; i < 50; i++) op_grouped_linear_forward(gu, xe, NONE, 0, wgu, NONE, doffs); // clocks up
#define FP8_ROW(what, work, bf16_call, fp8_call)                                                                       \
    snprintf(nm, sizeof nm, "%s %s (T=%lld, balanced, bf16)", model, what, (long long)T);                              \
    TIME(nm, 10, work, "TFLOP/s", bf16_call);                                                                          \
    ms16 = last_ms;                                                                                                    \
    snprintf(nm, sizeof nm, "%s %s (T=%lld, balanced, fp8)", model, what, (long long)T);                               \
    TIME(nm, 10, work, "TFLOP/s", fp8_call);                                                                           \
    printf("%s %s: FP8/bf16 speed %.2fx\n", model, what, ms16 / last_ms)
    double ms16;
    FP8_ROW("gate_up fwd", fg, op_grouped_linear_forward(gu, xe, NONE, 0, wgu, NONE, doffs),
            op_fp8_grouped_linear_forward(gu, xe, NONE, 0, qgu, doffs));
    FP8_ROW("gate_up bwd input", fg, op_grouped_linear_backward_input(xe, gu, wgu, doffs),
            op_fp8_grouped_linear_backward_input(xe, gu, qgu, doffs));
    FP8_ROW("gate_up bwd weight fp32", fg, op_grouped_linear_backward_weight(dwgu, NONE, gu, xe, NONE, 0, doffs, true),
            op_fp8_grouped_linear_backward_weight(dwgu, gu, xe, NONE, 0, doffs, true));
    FP8_ROW("down fwd", fdn, op_grouped_linear_forward(ye, act, NONE, 0, wd, NONE, doffs),
            op_fp8_grouped_linear_forward(ye, act, NONE, 0, qd, doffs));
    FP8_ROW("down bwd input", fdn, op_grouped_linear_backward_input(act, ye, wd, doffs),
            op_fp8_grouped_linear_backward_input(act, ye, qd, doffs));
    FP8_ROW("down bwd weight fp32", fdn, op_grouped_linear_backward_weight(dwd, NONE, ye, act, NONE, 0, doffs, true),
            op_fp8_grouped_linear_backward_weight(dwd, ye, act, NONE, 0, doffs, true));
    // a step's first micro-batch writes dw instead of adding (what the 8-layer benchmark runs)
    FP8_ROW("gate_up bwd weight fp32 store", fg,
            op_grouped_linear_backward_weight(dwgu, NONE, gu, xe, NONE, 0, doffs, false),
            op_fp8_grouped_linear_backward_weight(dwgu, gu, xe, NONE, 0, doffs, false));
    FP8_ROW("down bwd weight fp32 store", fdn,
            op_grouped_linear_backward_weight(dwd, NONE, ye, act, NONE, 0, doffs, false),
            op_fp8_grouped_linear_backward_weight(dwd, ye, act, NONE, 0, doffs, false));
    FP8_ROW("gate_up fwd gathered", fg,
            (op_gather_rows(xe, xt, perm, k), op_grouped_linear_forward(gu, xe, NONE, 0, wgu, NONE, doffs)),
            op_fp8_grouped_linear_forward(gu, xt, perm, k, qgu, doffs));
    FP8_ROW("gate_up bwd weight gathered bf16 store", fg,
            op_grouped_linear_backward_weight(hgu, NONE, gu, xe, NONE, 0, doffs, false),
            op_fp8_grouped_linear_backward_weight(hgu, gu, xt, perm, k, doffs, false));
    FP8_ROW("gate_up bwd weight gathered bf16 add", fg,
            op_grouped_linear_backward_weight(hgu, NONE, gu, xe, NONE, 0, doffs, true),
            op_fp8_grouped_linear_backward_weight(hgu, gu, xt, perm, k, doffs, true));
#undef FP8_ROW
    printf("(%lld of the FP8 GEMMs above ran on the tensor cores)\n", (long long)(cuda_fp8_tensor_core_gemms() - tc0));
    snprintf(nm, sizeof nm, "%s fp8 expert weight codes+scales (%lld x %lld x %lld bf16)", model, (long long)E,
             (long long)(2 * I), (long long)H);
    TIME(nm, 10, (double)E * 2 * I * H * 4, "GB/s", op_fp8_weight_make(qgu, wgu));
    // each GEMM's operand quantisers alone (the rows above include them; a row less its quantisers is its kernel):
    // 1 × 128 rows (forward, input gradient) and 128 × 1 transposed per expert, each expert padded to whole 128-row
    // blocks (weight gradient), at the operands' three widths (xe and dy of down: H; dgu: 2I; act: I)
    int64_t TB = cuda_fp8_cols_t_blocks(R, E), Cm = H > 2 * I ? H : 2 * I;
    int64_t Rm = R > TB * 128 ? R : TB * 128;
    Tensor codes = dev(DT_U8, 2, Rm, Cm, 0), scales = dev(DT_F32, 2, (Cm + 127) / 128, Rm, 0);
    const Tensor opnd[3] = {xe, gu, act};
    for (int i = 0; i < 3; i++) {
        int64_t C = opnd[i].n[1];
        Tensor qx = tensor_make(codes.p, DT_U8, DEV_CUDA, 2, R, C, 1, 1),
               sx = tensor_make(scales.p, DT_F32, DEV_CUDA, 2, (C + 127) / 128, R, 1, 1);
        snprintf(nm, sizeof nm, "%s fp8 quantize 1x128 codes (%lld x %lld bf16)", model, (long long)R, (long long)C);
        TIME(nm, 10, (double)R * C * 3, "GB/s", cuda_fp8_quantize_rows(qx, sx, opnd[i]));
        qx = tensor_make(codes.p, DT_U8, DEV_CUDA, 2, C, TB * 128, 1, 1);
        sx = tensor_make(scales.p, DT_F32, DEV_CUDA, 2, TB, C, 1, 1);
        snprintf(nm, sizeof nm, "%s fp8 quantize 128x1 codes transposed (%lld x %lld bf16)", model, (long long)R,
                 (long long)C);
        TIME(nm, 10, (double)R * C * 3, "GB/s", cuda_fp8_quantize_cols_t(qx, sx, opnd[i], doffs));
    }
    snprintf(nm, sizeof nm, "%s fp8_round 1x128 (%lld x %lld bf16)", model, (long long)R, (long long)H);
    TIME(nm, 10, by, "GB/s", op_fp8_round(xq, xe, FP8_ROWS, (Tensor){0}));
    snprintf(nm, sizeof nm, "%s fp8_round 128x1 per expert (%lld x %lld bf16)", model, (long long)R, (long long)H);
    TIME(nm, 10, by, "GB/s", op_fp8_round(xq, xe, FP8_COLS, doffs));
    snprintf(nm, sizeof nm, "%s fp8_round 128x128 weights (%lld x %lld x %lld bf16)", model, (long long)E,
             (long long)(2 * I), (long long)H);
    TIME(nm, 10, (double)E * 2 * I * H * 4, "GB/s", op_fp8_round(wgu, wgu, FP8_TILES, (Tensor){0}));
    free(offs);
    A.used = save.used;
}

// The dense MLP's FP8 GEMMs (cuBLASLt's block-scaled E4M3 products, activation quantisation included) beside bf16
// at Qwen3-30B-A3B's dense width (intermediate 6144), and the weight's quantisation (once per optimizer step).
static void bench_dense_fp8(int64_t T, int64_t H, int64_t I) {
    Arena save = A;
    DType bf = DT_BF16;
    Tensor x = dev(bf, 2, T, H, 0), wgu = dev(bf, 2, 2 * I, H, 0), gu = dev(bf, 2, T, 2 * I, 0),
           act = dev(bf, 2, T, I, 0), wd = dev(bf, 2, H, I, 0), y = dev(bf, 2, T, H, 0),
           dwgu = dev(DT_F32, 2, 2 * I, H, 0), dwd = dev(DT_F32, 2, H, I, 0);
    Tensor bgu = dev(DT_U8, 1, (int64_t)op_fp8_weight_bytes(2 * I, H), 0, 0),
           bd = dev(DT_U8, 1, (int64_t)op_fp8_weight_bytes(H, I), 0, 0);
    Fp8Weight qgu = op_fp8_weight_view(bgu.p, DEV_CUDA, 2 * I, H), qd = op_fp8_weight_view(bd.p, DEV_CUDA, H, I);
    fill(x, 1, 70), fill(wgu, 0.02f, 71), fill(gu, 1, 72), fill(act, 1, 73), fill(wd, 0.02f, 74), fill(y, 1, 75);
    op_zero(dwgu), op_zero(dwd), op_fp8_weight_make(qgu, wgu), op_fp8_weight_make(qd, wd);
    double fg = 2.0 * T * 2 * I * H, fdn = 2.0 * T * I * H;
    char nm[112];
    int64_t tc0 = cuda_fp8_tensor_core_gemms();
    for (int i = 0; i < 50; i++) op_linear_forward(gu, x, wgu, NONE); // clocks up
#define FP8_ROW(what, work, bf16_call, fp8_call)                                                                       \
    snprintf(nm, sizeof nm, "dense %s (T=%lld, bf16)", what, (long long)T);                                            \
    TIME(nm, 10, work, "TFLOP/s", bf16_call);                                                                          \
    snprintf(nm, sizeof nm, "dense %s (T=%lld, fp8)", what, (long long)T);                                             \
    TIME(nm, 10, work, "TFLOP/s", fp8_call)
    FP8_ROW("gate_up fwd", fg, op_linear_forward(gu, x, wgu, NONE), op_fp8_linear_forward(gu, x, qgu));
    FP8_ROW("gate_up bwd input", fg, op_linear_backward_input(x, gu, wgu, false),
            op_fp8_linear_backward_input(x, gu, qgu, false));
    FP8_ROW("gate_up bwd weight fp32", fg, op_linear_backward_weight(dwgu, NONE, gu, x, true),
            op_fp8_linear_backward_weight(dwgu, gu, x));
    FP8_ROW("down fwd", fdn, op_linear_forward(y, act, wd, NONE), op_fp8_linear_forward(y, act, qd));
    FP8_ROW("down bwd input", fdn, op_linear_backward_input(act, y, wd, false),
            op_fp8_linear_backward_input(act, y, qd, false));
    FP8_ROW("down bwd weight fp32", fdn, op_linear_backward_weight(dwd, NONE, y, act, true),
            op_fp8_linear_backward_weight(dwd, y, act));
#undef FP8_ROW
    printf("(%lld of the FP8 GEMMs above ran on the tensor cores)\n", (long long)(cuda_fp8_tensor_core_gemms() - tc0));
    snprintf(nm, sizeof nm, "dense fp8 weight codes+scales (%lld x %lld bf16)", (long long)(2 * I), (long long)H);
    TIME(nm, 10, (double)2 * I * H * 4, "GB/s", op_fp8_weight_make(qgu, wgu));
    A.used = save.used;
}

// Qwen3.5's gated delta rule at the benchmark's shapes: 2 sequences of 4096, 16 key heads for 32 value heads of 128.
static void bench_delta(void) {
    DType bf = DT_BF16;
    // The chunked form's work per token and value head (chunk C = 64, dk = dv = 128), counted in FLOPs (2 per
    // multiply-add): forward 2·(4·dk·dv + C·(3·dk + 2·dv)) = 0.213 M, backward about twice that; for 8192 tokens
    // × 32 heads fwd+bwd 0.168 TFLOP, 0.21 ms at 790 TFLOP/s. Bytes: q, k, v, o, do in, dq, dk, dv out, bf16, with
    // fp32 g, β: 0.34 GB, 0.07 ms at 4.8 TB/s. So the limit is the 0.21 ms of compute.
    int64_t B = 2, S = 4096, Td = B * S, nk = 16, nvh = 32, dh = 128;
    Tensor ql = dev(bf, 3, Td, nk, dh), kl = dev(bf, 3, Td, nk, dh), vl = dev(bf, 3, Td, nvh, dh),
           ol = dev(bf, 3, Td, nvh, dh), gl = dev(DT_F32, 2, Td, nvh, 0), bl = dev(DT_F32, 2, Td, nvh, 0);
    Tensor dql = dev(bf, 3, Td, nk, dh), dkl = dev(bf, 3, Td, nk, dh), dvl = dev(bf, 3, Td, nvh, dh),
           dgl = dev(DT_F32, 2, Td, nvh, 0), dbl = dev(DT_F32, 2, Td, nvh, 0);
    Tensor pa = dev(bf, 2, Td, nvh, 0), pb = dev(bf, 2, Td, nvh, 0), al = dev(bf, 1, nvh, 0, 0),
           dtb = dev(bf, 1, nvh, 0, 0);
    fill(ql, 1, 60), fill(kl, 1, 61), fill(vl, 1, 62), fill(pa, 1, 63), fill(pb, 1, 64), fill(al, 1, 65);
    fill(dtb, 1, 66);
    op_delta_gates_forward(gl, bl, pa, pb, al, dtb); // the decays and β the model's gates give
    DeltaArgs da = {.B = (int)B, .scale = 1.0f / sqrtf(128.0f), .qk_l2norm = true, .chunk = 64};
    double fd = 2.0 * (4.0 * dh * dh + 64.0 * 5 * dh) * Td * nvh;
    TIME("delta rule fwd (2 x 4096, 32 heads of 128)", 3, fd, "TFLOP/s",
         op_delta_rule_forward(ol, ql, kl, vl, gl, bl, &da));
    double fwd_ms = last_ms;
    TIME("delta rule bwd", 2, 2 * fd, "TFLOP/s",
         op_delta_rule_backward(dql, dkl, dvl, dgl, dbl, ol, ql, kl, vl, gl, bl, &da));
    double lim_ms = 3 * fd / 790e12 * 1e3;
    printf("(delta rule fwd+bwd limit: %.2f ms of FLOPs at 790 TFLOP/s, 0.07 ms of bytes at 4.8 TB/s; measured "
           "%.2f ms = %.1fx the limit, target 4x)\n",
           lim_ms, fwd_ms + last_ms, (fwd_ms + last_ms) / lim_ms);
    // As trained (delta_rule_keep, the bench configs'): the forward keeps its pieces and the backward does not rebuild
    // them.
    DeltaArgs dk = da;
    dk.keep = true, dk.kept = dev(DT_F32, 1, (int64_t)op_delta_rule_kept(ql, vl, &dk), 0, 0);
    TIME("delta rule fwd keeping its state", 3, fd, "TFLOP/s", op_delta_rule_forward(ol, ql, kl, vl, gl, bl, &dk));
    fwd_ms = last_ms;
    TIME("delta rule bwd from the kept state", 2, 2 * fd, "TFLOP/s",
         op_delta_rule_backward(dql, dkl, dvl, dgl, dbl, ol, ql, kl, vl, gl, bl, &dk));
    printf("(delta rule as trained: %.2f ms = %.1fx the limit)\n", fwd_ms + last_ms, (fwd_ms + last_ms) / lim_ms);
}

// Qwen3.5's causal depthwise conv1d + SiLU at the training call: B = 2 sequences of S = 4096, C = 8192 channels (q, k
// of 16 heads and v of 32 heads of 128), kernel 4, bf16 data, fp32 w, without and with document masking (documents of
// about 1,000 tokens). Rates count the bytes each direction must move: forward x in, y out; backward x, dy in, dx out
// (dw's C·K aside). `bench_gpu_ops --conv`.
static void bench_conv(void) {
    const int64_t B = 2, S = 4096, T = B * S, C = 8192, K = 4;
    DType bf = DT_BF16;
    Tensor x = dev(bf, 2, T, C, 0), y = dev(bf, 2, T, C, 0), dy = dev(bf, 2, T, C, 0), dx = dev(bf, 2, T, C, 0);
    Tensor w = dev(DT_F32, 2, C, K, 0), dw = dev(DT_F32, 2, C, K, 0), dp = dev(DT_I32, 1, T, 0, 0);
    fill(x, 1, 80), fill(dy, 1, 81), fill(w, 0.5f, 82), fill(dw, 0, 83);
    const int len[6] = {1000, 937, 1063, 1000, 1011, 989};
    int32_t *hp = xmalloc(T * sizeof(int32_t));
    for (int64_t b = 0, di = 0; b < B; b++)
        for (int64_t i = 0; i < S;) {
            int64_t n = len[di++ % 6];
            if (n > S - i) n = S - i;
            for (int64_t j = 0; j < n; j++) hp[b * S + i + j] = (int32_t)j;
            i += n;
        }
    op_copy(dp, tensor_make(hp, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
    free(hp);
    double bytes = (double)T * C * 2; // one (T, C) bf16 tensor
    for (int docs = 0; docs < 2; docs++) {
        Tensor pos = docs ? dp : NONE;
        TIME(docs ? "conv1d+silu fwd 2x4096x8192 K4 (docs)" : "conv1d+silu fwd 2x4096x8192 K4", 20, 2 * bytes, "GB/s",
             op_conv1d_silu_forward(y, x, w, NONE, pos, (int)B, 0));
        TIME(docs ? "conv1d+silu bwd 2x4096x8192 K4 (docs)" : "conv1d+silu bwd 2x4096x8192 K4", 20, 3 * bytes, "GB/s",
             op_conv1d_silu_backward(dx, NONE, dw, dy, x, w, NONE, pos, (int)B, 0));
    }
}

// The cross-entropy of the LM-head epilog alone: a chunk of 4096 rows of bf16 logits (the bench configs' chunk) for
// Qwen3's, GPT-OSS's and Qwen3.5's vocabularies, in place. The rate counts one read and one write of the logits, the
// least the op can move. `bench_gpu_ops --ce`.
static void bench_ce(void) {
    const int64_t R = 4096, vocab[3] = {151936, 201088, 248320};
    int32_t *hl = xmalloc(R * sizeof(int32_t));
    for (int v = 0; v < 3; v++) {
        Arena save = A;
        int64_t V = vocab[v];
        Tensor lg = dev(DT_BF16, 2, R, V, 0), lab = dev(DT_I32, 1, R, 0, 0), ls = dev(DT_F64, 1, 1, 0, 0);
        fill(lg, 1, 90 + v), op_zero(ls);
        for (int64_t i = 0; i < R; i++) hl[i] = (int32_t)(i * 7919 % V);
        op_copy(lab, tensor_make(hl, DT_I32, DEV_CPU, 1, R, 1, 1, 1));
        char nm[96];
        snprintf(nm, sizeof nm, "cross-entropy %lld x %lld bf16 (in place)", (long long)R, (long long)V);
        TIME(nm, 10, 2.0 * R * V * 2, "GB/s", op_cross_entropy(lg, lab, ls, NONE, 1.0f));
        A.used = save.used;
    }
    free(hl);
}

// Document masking (AttnArgs.docpos) at the training call: attention fwd+bwd, B = 2 sequences of S = 4096 tokens,
// Qwen3's 32 query / 4 kv heads of 128, bf16: no documents on the default path (cuDNN where built with it) and on
// pith's kernels (PITH_ATTENTION=own), then documents of about 1,000 tokens (positions restart at each sequence
// start) on pith's kernels, which skip the key tiles before a query tile's document. Rates count the whole causal
// work (4·S²·d·nh/2 a sequence forward, 2.5× that backward), so a packed run at the unpacked run's time reads as the
// same rate; the work inside the documents alone is printed beside. `bench_gpu_ops --docs` (session.sh mode docs).
static void bench_docs(void) {
    const int64_t B = 2, S = 4096, T = B * S, nh = 32, nkv = 4, d = 128;
    DType bf = DT_BF16;
    Tensor q = dev(bf, 3, T, nh, d), kk = dev(bf, 3, T, nkv, d), v = dev(bf, 3, T, nkv, d), o = dev(bf, 3, T, nh, d);
    Tensor lse = dev(DT_F32, 3, B, nh, S), dq = dev(bf, 3, T, nh, d), dk = dev(bf, 3, T, nkv, d),
           dv = dev(bf, 3, T, nkv, d), dp = dev(DT_I32, 1, T, 0, 0);
    fill(q, 1, 60), fill(kk, 1, 61), fill(v, 1, 62), fill(o, 1, 63);
    // document lengths cycled along the packed stream: mean 1,000, not tile multiples
    const int len[6] = {1000, 937, 1063, 1000, 1011, 989};
    int32_t *hp = xmalloc(T * sizeof(int32_t));
    double useful = 0; // causal FLOPs inside the documents, forward
    for (int64_t b = 0, di = 0; b < B; b++)
        for (int64_t i = 0; i < S;) {
            int64_t n = len[di++ % 6];
            if (n > S - i) n = S - i;
            for (int64_t j = 0; j < n; j++) hp[b * S + i + j] = (int32_t)j;
            useful += 4.0 * n * n * d * nh / 2, i += n;
        }
    op_copy(dp, tensor_make(hp, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
    free(hp);
    double fa = B * 4.0 * S * S * d * nh / 2;
    float sc = 1.0f / sqrtf((float)d);
    const char *name[3] = {"no documents, default", "no documents, own", "documents ~1000, own"};
    double total[3];
    for (int c = 0; c < 3; c++) {
        if (c > 0) setenv("PITH_ATTENTION", "own", 1);
        AttnArgs a = {.B = (int)B, .scale = sc, .causal = true, .docpos = c == 2 ? dp : NONE};
        char nm[128];
        snprintf(nm, sizeof nm, "attention fwd B=2 S=4096 (%s)", name[c]);
        TIME(nm, 10, fa, "TFLOP/s", op_attention_forward(o, lse, q, kk, v, &a));
        const char *path = cuda_attention_last_path();
        double tf = last_ms;
        snprintf(nm, sizeof nm, "attention bwd B=2 S=4096 (%s)", name[c]);
        TIME(nm, 10, 2.5 * fa, "TFLOP/s", op_attention_backward(dq, dk, dv, NONE, o, q, kk, v, o, lse, &a));
        snprintf(nm, sizeof nm, "attention fwd+bwd B=2 S=4096 (%s)", name[c]);
        report(nm, tf + last_ms, 3.5 * fa, "TFLOP/s");
        total[c] = tf + last_ms;
        printf("  (ran: %s; work inside the documents: %.1f%% of the causal work, %.1f TFLOP/s of it)\n", path,
               c == 2 ? 100 * useful / fa : 100.0, (c == 2 ? useful : fa) * 3.5 / ((tf + last_ms) / 1e3) / 1e12);
    }
    unsetenv("PITH_ATTENTION");
    printf("packed / unpacked attention fwd+bwd: %.2fx the default path's, %.2fx pith's kernels' (issue 38: <= 1)\n",
           total[2] / total[0], total[2] / total[1]);
    // the other families' forms, no documents (default path) and the same documents (pith's kernels): MLA 192/128
    // with 16 heads (DeepSeek-V2-Lite), GPT-OSS's sliding layers (64/8 heads of 64, window 128, sinks), Qwen3.5's full
    // attention (16/2 heads of 256)
    struct {
        int nh, nkv, dqk, dv, window;
        bool sinks;
        const char *what;
    } f[3] = {{16, 16, 192, 128, 0, false, "MLA 192/128"},
              {64, 8, 64, 64, 128, true, "GPT-OSS window 128 + sinks"},
              {16, 2, 256, 256, 0, false, "Qwen3.5 256"}};
    for (int c = 0; c < 3; c++) {
        Arena save = A;
        Tensor qf = dev(bf, 3, T, f[c].nh, f[c].dqk), kf = dev(bf, 3, T, f[c].nkv, f[c].dqk),
               vf = dev(bf, 3, T, f[c].nkv, f[c].dv), of = dev(bf, 3, T, f[c].nh, f[c].dv);
        Tensor lf = dev(DT_F32, 3, B, f[c].nh, S), dqf = dev(bf, 3, T, f[c].nh, f[c].dqk),
               dkf = dev(bf, 3, T, f[c].nkv, f[c].dqk), dvf = dev(bf, 3, T, f[c].nkv, f[c].dv),
               sk = dev(DT_F32, 1, f[c].nh, 0, 0), dsk = dev(DT_F32, 1, f[c].nh, 0, 0);
        fill(qf, 1, 70), fill(kf, 1, 71), fill(vf, 1, 72), fill(of, 1, 73), fill(sk, 1, 74), fill(dsk, 1, 75);
        // causal work, or the window's band
        double ff = B * 2.0 * S * (f[c].window ? f[c].window : S / 2.0) * (f[c].dqk + f[c].dv) * f[c].nh;
        for (int docs = 0; docs < 2; docs++) {
            AttnArgs a = {.B = (int)B, .scale = 1.0f / sqrtf((float)f[c].dqk), .causal = true, .window = f[c].window};
            if (f[c].sinks) a.sinks = sk;
            if (docs) a.docpos = dp;
            char nm[128];
            snprintf(nm, sizeof nm, "attention fwd B=2 S=4096 %s (%s)", f[c].what, docs ? "documents" : "default");
            TIME(nm, 5, ff, "TFLOP/s", op_attention_forward(of, lf, qf, kf, vf, &a));
            const char *path = cuda_attention_last_path();
            double tf = last_ms;
            snprintf(nm, sizeof nm, "attention bwd B=2 S=4096 %s (%s)", f[c].what, docs ? "documents" : "default");
            TIME(nm, 3, 2.5 * ff, "TFLOP/s",
                 op_attention_backward(dqf, dkf, dvf, f[c].sinks ? dsk : NONE, of, qf, kf, vf, of, lf, &a));
            snprintf(nm, sizeof nm, "attention fwd+bwd B=2 S=4096 %s (%s)", f[c].what, docs ? "documents" : "default");
            report(nm, tf + last_ms, 3.5 * ff, "TFLOP/s");
            printf("  (ran: %s)\n", path);
        }
        A = save;
    }
}

int main(int argc, char **argv) {
    if (!ops_cuda_available()) die("bench_gpu_ops: no GPU");
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    A = arena_create("bench", DEV_CUDA, (size_t)40 << 30);
    if (argc > 1 && !strcmp(argv[1], "--fp8")) { // the expert and dense GEMMs in FP8 beside bf16
        bench_grouped_fp8("qwen3", 8192, 2048, 128, 8, 768);
        bench_dense_fp8(8192, 2048, 6144);
        arena_destroy(&A);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--docs")) { // attention with and without document masking
        bench_docs();
        arena_destroy(&A);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--ce")) { // the LM head's cross-entropy alone
        bench_ce();
        arena_destroy(&A);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--conv")) { // Qwen3.5's conv1d + SiLU alone
        bench_conv();
        arena_destroy(&A);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--delta")) { // the delta rule alone
        bench_delta();
        arena_destroy(&A);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--grouped")) { // the expert GEMMs alone, at the training micro-batch
        // --grouped wgmma: the wgmma rows only; a further argument names the one model to run
        int n = argc > 2 && !strcmp(argv[2], "wgmma") ? 1 : 2;
        const char *only = argc > 3 ? argv[3] : NULL;
        if (!only || !strcmp(only, "qwen3")) bench_grouped("qwen3", 8192, 2048, 128, 8, 768, n);
        if (!only || !strcmp(only, "dsv2")) bench_grouped("dsv2", 8192, 2048, 64, 6, 1408, n);
        if (!only || !strcmp(only, "gpt_oss")) bench_grouped("gpt_oss", 8192, 2880, 32, 4, 2880, n);
        arena_destroy(&A);
        return 0;
    }
    const int64_t T = 4096, H = 2048, nh = 32, nkv = 4, d = 128, E = 128, k = 8, I = 768, V = 151936;
    const int64_t R = T * k, C = (64 << 20) / (V * 4);
    DType bf = DT_BF16;
    Tensor x = dev(bf, 2, T, H, 0), wq = dev(bf, 2, nh * d, H, 0), q2 = dev(bf, 2, T, nh * d, 0),
           dw = dev(DT_F32, 2, nh * d, H, 0);
    fill(x, 1, 1), fill(wq, 0.02f, 2), fill(q2, 1, 3);
    printf("%-44s %9s     %8s\n", "op (T=4096 tokens, bf16)", "time", "rate");
    double f = 2.0 * T * nh * d * H;
    TIME("gemm q_proj fwd 4096x2048->4096", 20, f, "TFLOP/s", op_linear_forward(q2, x, wq, (Tensor){0}));
    TIME("gemm q_proj bwd input", 20, f, "TFLOP/s", op_linear_backward_input(x, q2, wq, false));
    TIME("gemm q_proj bwd weight (fp32 acc)", 20, f, "TFLOP/s",
         op_linear_backward_weight(dw, (Tensor){0}, q2, x, true));
    // the router (E logits: few output tiles over a long reduction) at T and at the bench step's 2T, for 128 and 64
    // experts (Qwen3's, DeepSeek's), and RMSNorm's backward, hidden and per head
    {
        Arena save = A;
        for (int64_t t = T; t <= 2 * T; t += T)
            for (int64_t e = E; e >= E / 2; e /= 2) {
                Tensor xr = dev(bf, 2, t, H, 0), dxr = dev(bf, 2, t, H, 0), wr = dev(bf, 2, e, H, 0),
                       lg = dev(DT_F32, 2, t, e, 0), dwr = dev(DT_F32, 2, e, H, 0);
                fill(xr, 1, 8), fill(wr, 0.02f, 9), fill(lg, 1, 10), fill(dxr, 1, 13), op_zero(dwr);
                double fr = 2.0 * t * e * H;
                char nm[96];
                snprintf(nm, sizeof nm, "gemm router fwd %lldx%lld->%lld (fp32 logits)", (long long)t, (long long)H,
                         (long long)e);
                TIME(nm, 20, fr, "TFLOP/s", op_linear_forward(lg, xr, wr, (Tensor){0}));
                snprintf(nm, sizeof nm, "gemm router %lld bwd input (fp32 dy, dx added)", (long long)e);
                TIME(nm, 20, fr, "TFLOP/s", op_linear_backward_input(dxr, lg, wr, true));
                snprintf(nm, sizeof nm, "gemm router %lld bwd weight (fp32 dy, fp32 acc)", (long long)e);
                TIME(nm, 20, fr, "TFLOP/s", op_linear_backward_weight(dwr, (Tensor){0}, lg, xr, true));
            }
        for (int hd = 0; hd < 2; hd++) { // (T, H), then q's (T·heads, d)
            int64_t r = hd ? T * nh : T, c = hd ? d : H;
            Tensor xn = hd ? tensor_reshape2(q2, r, c) : x, y = dev(bf, 2, r, c, 0), dy = dev(bf, 2, r, c, 0),
                   wn = dev(bf, 1, c, 0, 0), rs = dev(DT_F32, 1, r, 0, 0), dwn = dev(DT_F32, 1, c, 0, 0);
            fill(wn, 1, 11), fill(dy, 1, 12), op_zero(dwn);
            op_rmsnorm_forward(y, rs, xn, wn, 1e-6f, NULL);
            char nm[96];
            snprintf(nm, sizeof nm, "rmsnorm bwd %lldx%lld (dx, dw; dy, x read)", (long long)r, (long long)c);
            TIME(nm, 20, 3.0 * r * c * 2, "GB/s", op_rmsnorm_backward(y, dwn, dy, xn, wn, rs, false, NULL));
            if (hd) continue;
            snprintf(nm, sizeof nm, "rmsnorm bwd %lldx%lld, dx added", (long long)r, (long long)c);
            TIME(nm, 20, 4.0 * r * c * 2, "GB/s", op_rmsnorm_backward(y, dwn, dy, xn, wn, rs, true, NULL));
        }
        A.used = save.used;
    }
    // LM head and loss on a chunk of Cr rows: logits fp32, CE in place, dx and dW (fp32 accumulate)
    {
        Arena save = A;
        Tensor wl = dev(bf, 2, V, H, 0), dwl = dev(DT_F32, 2, V, H, 0), hn = dev(bf, 2, 2048, H, 0),
               dh = dev(bf, 2, 2048, H, 0);
        Tensor lg = dev(DT_F32, 2, 1766, V, 0), lab = dev(DT_I32, 1, 2048, 0, 0), ls = dev(DT_F64, 1, 1, 0, 0);
        fill(wl, 0.02f, 20), fill(hn, 1, 21), op_zero(dwl), op_zero(ls);
        int32_t *hl = xmalloc(2048 * sizeof(int32_t));
        for (int64_t i = 0; i < 2048; i++) hl[i] = (int32_t)(i * 7919 % V);
        op_copy(lab, tensor_make(hl, DT_I32, DEV_CPU, 1, 2048, 1, 1, 1));
        free(hl);
        int64_t chunks[2] = {C, 1766};
        for (int c = 0; c < 2; c++) {
            int64_t n = chunks[c];
            Tensor l = tensor_rows(lg, 0, n), h = tensor_rows(hn, 0, n), dhc = tensor_rows(dh, 0, n),
                   lb = tensor_rows(lab, 0, n);
            double fl = 2.0 * n * V * H, tot = 0;
            char nm[96];
            snprintf(nm, sizeof nm, "lm_head fwd chunk %lld rows (fp32 logits)", (long long)n);
            TIME(nm, 10, fl, "TFLOP/s", op_linear_forward(l, h, wl, (Tensor){0}));
            tot += last_ms;
            snprintf(nm, sizeof nm, "cross-entropy chunk %lld rows", (long long)n);
            TIME(nm, 10, 3.0 * n * V * 4, "GB/s", op_cross_entropy(l, lb, ls, NONE, 1.0f));
            tot += last_ms;
            snprintf(nm, sizeof nm, "lm_head bwd input chunk %lld", (long long)n);
            TIME(nm, 10, fl, "TFLOP/s", op_linear_backward_input(dhc, l, wl, false));
            tot += last_ms;
            snprintf(nm, sizeof nm, "lm_head bwd weight chunk %lld (fp32 dW)", (long long)n);
            TIME(nm, 5, fl, "TFLOP/s", op_linear_backward_weight(dwl, (Tensor){0}, l, h, true));
            tot += last_ms;
            snprintf(nm, sizeof nm, "lm_head+CE per 8192 tokens, chunk %lld", (long long)n);
            report(nm, tot * 8192.0 / n, 3.0 * 2 * 8192 * V * H, "TFLOP/s");
        }
        A.used = save.used;
    }
    // grouped experts: balanced, then natural routing; one grouped call, then the per-expert loop
    int64_t *offs = xmalloc((E + 1) * sizeof(int64_t));
    Tensor xe = dev(bf, 2, R, H, 0), wgu = dev(bf, 3, E, 2 * I, H), gu = dev(bf, 2, R, 2 * I, 0),
           act = dev(bf, 2, R, I, 0), doffs = dev(DT_I64, 1, E + 1, 0, 0);
    Tensor wd = dev(bf, 3, E, H, I), ye = dev(bf, 2, R, H, 0);
    Tensor dwgu = dev(DT_F32, 3, E, 2 * I, H), dwd = dev(DT_F32, 3, E, H, I);
    fill(xe, 1, 4), fill(wgu, 0.02f, 5), fill(gu, 1, 6), fill(act, 1, 7), fill(wd, 0.02f, 8), op_zero(dwgu),
        op_zero(dwd), op_zero(dw);
    double fg = 2.0 * R * 2 * I * H, fdn = 2.0 * R * I * H;
    for (int pass = 0; pass < (quick ? 2 : 3); pass++) {
        bool bal = pass == 0, loop = pass == 2;
        routing_offs(offs, T, H, E, (int)k, bal);
        op_copy(doffs, ti64_1(offs, E + 1));
        if (loop) setenv("PITH_GROUPED_KERNEL", "loop", 1);
        const char *tag = bal ? "balanced" : loop ? "natural, loop" : "natural";
        char nm[96];
        snprintf(nm, sizeof nm, "grouped gate_up fwd (%s)", tag);
        TIME(nm, 10, fg, "TFLOP/s", op_grouped_linear_forward(gu, xe, NONE, 0, wgu, NONE, doffs));
        snprintf(nm, sizeof nm, "grouped gate_up bwd input (%s)", tag);
        TIME(nm, 10, fg, "TFLOP/s", op_grouped_linear_backward_input(xe, gu, wgu, doffs));
        snprintf(nm, sizeof nm, "grouped gate_up bwd weight fp32 (%s)", tag);
        TIME(nm, 10, fg, "TFLOP/s", op_grouped_linear_backward_weight(dwgu, NONE, gu, xe, NONE, 0, doffs, true));
        snprintf(nm, sizeof nm, "grouped down fwd (%s)", tag);
        TIME(nm, 10, fdn, "TFLOP/s", op_grouped_linear_forward(ye, act, NONE, 0, wd, NONE, doffs));
        snprintf(nm, sizeof nm, "grouped down bwd weight fp32 (%s)", tag);
        TIME(nm, 10, fdn, "TFLOP/s", op_grouped_linear_backward_weight(dwd, NONE, ye, act, NONE, 0, doffs, true));
        if (pass == 1) { // cuBLASLt's per-expert weight gradients on 1, 2 and 8 streams (its default is 4)
            setenv("PITH_GROUPED_KERNEL", "loop", 1);
            const char *ns[3] = {"1", "2", "8"};
            for (int i = 0; i < 3; i++) {
                setenv("PITH_WGRAD_STREAMS", ns[i], 1);
                snprintf(nm, sizeof nm, "grouped gate_up bwd weight fp32 (natural, %s streams)", ns[i]);
                TIME(nm, 10, fg, "TFLOP/s",
                     op_grouped_linear_backward_weight(dwgu, NONE, gu, xe, NONE, 0, doffs, true));
                snprintf(nm, sizeof nm, "grouped down bwd weight fp32 (natural, %s streams)", ns[i]);
                TIME(nm, 10, fdn, "TFLOP/s",
                     op_grouped_linear_backward_weight(dwd, NONE, ye, act, NONE, 0, doffs, true));
            }
            unsetenv("PITH_WGRAD_STREAMS");
            unsetenv("PITH_GROUPED_KERNEL");
        }
        unsetenv("PITH_GROUPED_KERNEL");
    }
    bench_grouped("qwen3", 2 * T, H, E, (int)k, I, 2); // every implementation at the training micro-batch (8192)
    TIME("swiglu fwd (32768 x 768)", 20, (double)R * 3 * I * 2, "GB/s", op_swiglu_forward(act, gu, 0, 0));
    TIME("swiglu bwd", 20, (double)R * 5 * I * 2, "GB/s", op_swiglu_backward(gu, act, gu, 0, 0));
    // attention, causal: 4·S²·d·nh/2 flops forward, 2.5× that backward
    Tensor q = dev(bf, 3, T, nh, d), kk = dev(bf, 3, T, nkv, d), v = dev(bf, 3, T, nkv, d), o = dev(bf, 3, T, nh, d);
    Tensor lse = dev(DT_F32, 3, 1, nh, T), dq = dev(bf, 3, T, nh, d), dk = dev(bf, 3, T, nkv, d),
           dv = dev(bf, 3, T, nkv, d);
    fill(q, 1, 7), fill(kk, 1, 8), fill(v, 1, 9), fill(o, 1, 10);
    double fa = 4.0 * T * T * d * nh / 2;
    float sc = 1.0f / sqrtf((float)d);
    AttnArgs aa1 = {.B = 1, .scale = sc, .causal = true}, aa2 = {.B = 2, .scale = sc, .causal = true};
    // each path: cuDNN's fused kernels (the default where built with cuDNN), then ours (PITH_ATTENTION=own)
    for (int own = 0; own < 2; own++) {
        if (own) setenv("PITH_ATTENTION", "own", 1);
        char nm[128];
        snprintf(nm, sizeof nm, "attention fwd S=4096 d=128 GQA 32/4 (%s)", own ? "own" : "default");
        TIME(nm, 20, fa, "TFLOP/s", op_attention_forward(o, lse, q, kk, v, &aa1));
        printf("  (ran: %s)\n", cuda_attention_last_path());
        double ta = last_ms;
        TIME("attention bwd", 10, 2.5 * fa, "TFLOP/s",
             op_attention_backward(dq, dk, dv, NONE, o, q, kk, v, o, lse, &aa1));
        report("attention fwd+bwd", ta + last_ms, 3.5 * fa, "TFLOP/s");
        Tensor q2b = dev(bf, 3, 2 * T, nh, d), k2b = dev(bf, 3, 2 * T, nkv, d), v2b = dev(bf, 3, 2 * T, nkv, d),
               o2b = dev(bf, 3, 2 * T, nh, d);
        Tensor l2b = dev(DT_F32, 3, 2, nh, T), dq2b = dev(bf, 3, 2 * T, nh, d), dk2b = dev(bf, 3, 2 * T, nkv, d),
               dv2b = dev(bf, 3, 2 * T, nkv, d);
        fill(q2b, 1, 40), fill(k2b, 1, 41), fill(v2b, 1, 42), fill(o2b, 1, 43);
        TIME("attention fwd B=2 S=4096 (the training call)", 10, 2 * fa, "TFLOP/s",
             op_attention_forward(o2b, l2b, q2b, k2b, v2b, &aa2));
        ta = last_ms;
        TIME("attention bwd B=2 S=4096", 10, 2 * 2.5 * fa, "TFLOP/s",
             op_attention_backward(dq2b, dk2b, dv2b, NONE, o2b, q2b, k2b, v2b, o2b, l2b, &aa2));
        report("attention fwd+bwd B=2", ta + last_ms, 2 * 3.5 * fa, "TFLOP/s");
    }
    unsetenv("PITH_ATTENTION");
    { // the widened forms at the other families' shapes, B = 1, S = 4096: MLA (DeepSeek-V2-Lite, 16 heads, q·k 192,
        // v 128: cuDNN where it plans it), GPT-OSS sliding layers (64/8 heads of 64, window 128, sinks: generic)
        Tensor qm = dev(bf, 3, T, 16, 192), km = dev(bf, 3, T, 16, 192), vm = dev(bf, 3, T, 16, 128),
               om = dev(bf, 3, T, 16, 128);
        Tensor lm = dev(DT_F32, 3, 1, 16, T), dqm = dev(bf, 3, T, 16, 192), dkm = dev(bf, 3, T, 16, 192),
               dvm = dev(bf, 3, T, 16, 128);
        fill(qm, 1, 50), fill(km, 1, 51), fill(vm, 1, 52), fill(om, 1, 53);
        AttnArgs am = {.B = 1, .scale = 1.0f / sqrtf(192.0f), .causal = true};
        double fm = 2.0 * T * T * (192 + 128) * 16 / 2;
        TIME("attention fwd MLA 192/128 S=4096 16 heads", 10, fm, "TFLOP/s",
             op_attention_forward(om, lm, qm, km, vm, &am));
        printf("  (ran: %s)\n", cuda_attention_last_path());
        TIME("attention bwd MLA", 5, 2.5 * fm, "TFLOP/s",
             op_attention_backward(dqm, dkm, dvm, NONE, om, qm, km, vm, om, lm, &am));
        Tensor qg = dev(bf, 3, T, 64, 64), kg = dev(bf, 3, T, 8, 64), vg = dev(bf, 3, T, 8, 64),
               og = dev(bf, 3, T, 64, 64);
        Tensor lg = dev(DT_F32, 3, 1, 64, T), dqg = dev(bf, 3, T, 64, 64), dkg = dev(bf, 3, T, 8, 64),
               dvg = dev(bf, 3, T, 8, 64);
        Tensor sk = dev(DT_F32, 1, 64, 0, 0), dsk = dev(DT_F32, 1, 64, 0, 0);
        fill(qg, 1, 54), fill(kg, 1, 55), fill(vg, 1, 56), fill(og, 1, 57), fill(sk, 1, 58), fill(dsk, 1, 59);
        AttnArgs ag = {.B = 1, .scale = 0.125f, .causal = true, .window = 128, .sinks = sk};
        double fg2 = 4.0 * T * 128 * 64 * 64; // the visible band only
        TIME("attention fwd GPT-OSS window 128 + sinks", 10, fg2, "TFLOP/s",
             op_attention_forward(og, lg, qg, kg, vg, &ag));
        printf("  (ran: %s)\n", cuda_attention_last_path());
        TIME("attention bwd GPT-OSS window", 5, 2.5 * fg2, "TFLOP/s",
             op_attention_backward(dqg, dkg, dvg, dsk, og, qg, kg, vg, og, lg, &ag));
    }
    bench_delta();
    // memory-bound
    Tensor y = dev(bf, 2, T, H, 0), w = dev(bf, 1, H, 0, 0), rstd = dev(DT_F32, 1, T, 0, 0),
           dwn = dev(DT_F32, 1, H, 0, 0);
    fill(w, 1, 11);
    TIME("rmsnorm fwd (4096, 2048)", 50, 2.0 * T * H * 2, "GB/s", op_rmsnorm_forward(y, rstd, x, w, 1e-6f, NULL));
    TIME("rmsnorm bwd", 50, 4.0 * T * H * 2, "GB/s", op_rmsnorm_backward(y, dwn, x, x, w, rstd, false, NULL));
    Tensor qn = tensor_reshape2(q, T * nh, d), qo = tensor_reshape2(dq, T * nh, d), rq = dev(DT_F32, 1, T * nh, 0, 0),
           wn = dev(bf, 1, d, 0, 0);
    fill(wn, 1, 12);
    TIME("rmsnorm fwd q-norm (131072, 128)", 50, 2.0 * T * nh * d * 2, "GB/s",
         op_rmsnorm_forward(qo, rq, qn, wn, 1e-6f, NULL));
    {
        int64_t half = d / 2;
        Tensor cs = dev(DT_F32, 2, T, half, 0), sn = dev(DT_F32, 2, T, half, 0), pos = dev(DT_I32, 1, T, 0, 0);
        fill(cs, 1, 30), fill(sn, 1, 31);
        int32_t *hp = xmalloc(T * sizeof(int32_t));
        for (int64_t i = 0; i < T; i++) hp[i] = (int32_t)i;
        op_copy(pos, tensor_make(hp, DT_I32, DEV_CPU, 1, T, 1, 1, 1));
        free(hp);
        TIME("rope q (4096, 32, 128)", 50, 2.0 * T * nh * d * 2, "GB/s", op_rope(q, 0, cs, sn, pos, ROPE_HALF, false));
        // the q norm with its RoPE in one kernel each way (against the rows of the norm and of RoPE alone)
        RmsArgs nr = {.cos = cs, .sin = sn, .pos = pos, .heads = (int)nh};
        TIME("q-norm + rope (131072, 128), one kernel", 50, 2.0 * T * nh * d * 2, "GB/s",
             op_rmsnorm_forward(qo, rq, qn, wn, 1e-6f, &nr));
        Tensor qdx = dev(bf, 2, T * nh, d, 0), dwq = dev(DT_F32, 1, d, 0, 0);
        TIME("q-norm bwd + rope (131072, 128), one kernel", 50, 3.0 * T * nh * d * 2, "GB/s",
             op_rmsnorm_backward(qdx, dwq, qo, qn, wn, rq, false, &nr));
    }
    Tensor idx = dev(DT_I32, 2, T, k, 0), perm = dev(DT_I32, 1, R, 0, 0);
    int32_t *hi = xmalloc(R * sizeof(int32_t));
    for (int64_t i = 0; i < R; i++) hi[i] = (int32_t)(rng_u64(1, 2, i) % E);
    op_copy(idx, tensor_make(hi, DT_I32, DEV_CPU, 2, T, k, 1, 1));
    TIME("moe_sort (32768 slots)", 20, (double)R * 8, "GB/s", op_moe_sort(perm, NONE, doffs, idx, (int)E));
    TIME("gather_rows dispatch (32768, 2048)", 20, 2.0 * R * H * 2, "GB/s", op_gather_rows(xe, x, perm, (int)k));
    TIME("scatter_rows combine (32768, 2048)", 20, 2.0 * R * H * 2, "GB/s", op_scatter_rows(ye, xe, perm));
    TIME("scatter_add_rows (inverse map)", 20, (double)(R + 2 * T) * H * 2, "GB/s",
         op_scatter_add_rows(x, xe, perm, (int)k));
    Tensor wts = dev(DT_F32, 2, T, k, 0);
    fill(wts, 0.1f, 14);
    TIME("moe_combine fwd", 20, (double)(R + 2 * T) * H * 2, "GB/s", op_moe_combine_forward(y, x, ye, wts, NONE));
    TIME("moe_combine bwd", 20, (double)(2 * R + T) * H * 2, "GB/s",
         op_moe_combine_backward(xe, wts, y, ye, wts, NONE));
    Tensor at = dev(DT_I32, 1, R, 0, 0); // the rows read where the experts wrote them (one ep rank)
    op_moe_sort(perm, at, doffs, idx, (int)E);
    TIME("moe_combine fwd, expert order", 20, (double)(R + 2 * T) * H * 2, "GB/s",
         op_moe_combine_forward(y, x, ye, wts, at));
    TIME("moe_combine bwd, expert order", 20, (double)(2 * R + T) * H * 2, "GB/s",
         op_moe_combine_backward(xe, wts, y, ye, wts, at));
    int64_t np = 30000000;
    Tensor p = dev(DT_F32, 1, np, 0, 0), g = dev(DT_F32, 1, np, 0, 0), m = dev(DT_F32, 1, np, 0, 0),
           vv = dev(DT_F32, 1, np, 0, 0);
    op_zero(m), op_zero(vv), fill(p, 1, 15), fill(g, 1, 16);
    TIME("adamw 30M params", 20, (double)np * 7 * 4, "GB/s",
         op_adamw(p, g, m, vv, NONE, 1.0f, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    double ss = 0;
    TIME("sum_squares 30M (host result)", 20, (double)np * 4, "GB/s", ss += op_sum_squares(g));
    Tensor pb = dev(bf, 1, np, 0, 0);
    TIME("copy fp32 -> bf16 30M", 20, (double)np * 6, "GB/s", op_copy(pb, p));
    Tensor big0 = dev(DT_F32, 1, 256 << 20, 0, 0), big1 = dev(DT_F32, 1, 256 << 20, 0, 0);
    op_zero(big0);
    TIME("copy d2d 1 GiB (bandwidth ceiling)", 10, 2.0 * (1 << 30), "GB/s", op_copy(big1, big0));
    // the optimizer step's one pass at the scale of the 8-layer benchmark's largest group: 1 G parameters,
    // gradient scale folded in, bf16 compute copy written (30 bytes a parameter); beside it the copy ceiling
    {
        Arena save = A;
        int64_t nb = 1 << 30;
        Tensor P = dev(DT_F32, 1, nb, 0, 0), G = dev(DT_F32, 1, nb, 0, 0), M = dev(DT_F32, 1, nb, 0, 0),
               V = dev(DT_F32, 1, nb, 0, 0), W = dev(bf, 1, nb, 0, 0);
        op_zero(M), op_zero(V), fill(P, 1, 17), fill(G, 1, 18);
        TIME("adamw 1G params + bf16 copy (one pass)", 5, (double)nb * 30, "GB/s",
             op_adamw(P, G, M, V, W, 0.5f, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
        TIME("sum_squares 1G (host result)", 5, (double)nb * 4, "GB/s", ss += op_sum_squares(G));
        A.used = save.used;
    }
    printf("(sum_squares check %.3g)\n", ss);
    arena_destroy(&A);
    return 0;
}
