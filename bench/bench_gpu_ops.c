// bench_gpu_ops.c — times the CUDA ops at Qwen3-30B-A3B layer sizes (hidden 2048, 32 query / 4 kv heads
// of 128, 128 experts top-8 of width 768, vocab 151936) on one micro-batch of T = 4096 tokens, bf16.
// Each op: warm-up, then the mean over reps of host time around the launches with one stream sync at
// the end (launch overhead included). Prints time, and TFLOP/s or GB/s against the minimum bytes moved.
// `make bench-gpu` (on the GPU machine).
#include <math.h>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

static Arena A;
static Tensor dev(DType dt, int nd, int64_t n0, int64_t n1, int64_t n2) { return arena_tensor(&A, dt, nd, n0, n1, n2, 0); }

// Fills a device tensor (fp32/bf16) with N(0, scale²) through a host fp32 buffer.
static void fill(Tensor t, float scale, uint64_t stream) {
    int64_t n = tensor_numel(t);
    float *h = xmalloc(n * sizeof(float));
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) h[i] = scale * (float)rng_normal(42, stream, (uint64_t)i);
    op_copy(t, tensor_make(h, DT_F32, DEV_CPU, t.nd, t.n[0], t.n[1], t.n[2], t.n[3]));
    free(h);
}

#define TIME(name, reps, work, unit, call)                                                            \
    do {                                                                                              \
        call;                                                                                         \
        cuda_sync();                                                                                  \
        double t0_ = now_seconds();                                                                   \
        for (int r_ = 0; r_ < (reps); r_++) call;                                                     \
        cuda_sync();                                                                                  \
        double s_ = (now_seconds() - t0_) / (reps);                                                   \
        printf("%-34s %9.3f ms  %8.1f %s\n", name, s_ * 1e3, (work) / s_ / 1e12 * (unit[0] == 'G' ? 1e3 : 1), unit); \
    } while (0)

int main(void) {
    if (!ops_cuda_available()) die("bench_gpu_ops: no GPU");
    A = arena_create("bench", DEV_CUDA, (size_t)6 << 30);
    const int64_t T = 4096, H = 2048, nh = 32, nkv = 4, d = 128, E = 128, k = 8, I = 768, V = 151936;
    const int64_t R = T * k, C = (64 << 20) / (V * 4);
    DType bf = DT_BF16;
    Tensor x = dev(bf, 2, T, H, 0), wq = dev(bf, 2, nh * d, H, 0), q2 = dev(bf, 2, T, nh * d, 0), dw = dev(DT_F32, 2, nh * d, H, 0);
    fill(x, 1, 1), fill(wq, 0.02f, 2), fill(q2, 1, 3);
    printf("%-34s %9s     %8s\n", "op (T=4096, bf16)", "time", "rate");
    double f = 2.0 * T * nh * d * H;
    TIME("linear fwd q_proj 4096x2048->4096", 20, f, "TFLOP/s", op_linear_forward(q2, x, wq, (Tensor){0}));
    TIME("linear bwd input", 20, f, "TFLOP/s", op_linear_backward_input(x, q2, wq, false));
    TIME("linear bwd weight (fp32 acc)", 20, f, "TFLOP/s", op_linear_backward_weight(dw, (Tensor){0}, q2, x));
    // grouped experts, balanced: R/E rows each
    int64_t *offs = xmalloc((E + 1) * sizeof(int64_t));
    for (int64_t e = 0; e <= E; e++) offs[e] = e * (R / E);
    Tensor xe = dev(bf, 2, R, H, 0), wgu = dev(bf, 3, E, 2 * I, H), gu = dev(bf, 2, R, 2 * I, 0), act = dev(bf, 2, R, I, 0);
    Tensor dwgu = dev(DT_F32, 3, E, 2 * I, H);
    fill(xe, 1, 4), fill(wgu, 0.02f, 5), fill(gu, 1, 6), op_zero(dwgu), op_zero(dw);
    double fg = 2.0 * R * 2 * I * H;
    TIME("grouped fwd gate_up 128 experts", 10, fg, "TFLOP/s", op_grouped_linear_forward(gu, xe, wgu, offs));
    TIME("grouped bwd input", 10, fg, "TFLOP/s", op_grouped_linear_backward_input(xe, gu, wgu, offs));
    TIME("grouped bwd weight", 10, fg, "TFLOP/s", op_grouped_linear_backward_weight(dwgu, gu, xe, offs));
    TIME("swiglu fwd (R=32768, I=768)", 20, (double)R * 3 * I * 2, "GB/s", op_swiglu_forward(act, gu));
    TIME("swiglu bwd", 20, (double)R * 5 * I * 2, "GB/s", op_swiglu_backward(gu, act, gu));
    // attention, causal: 4·S²·d·nh/2 flops forward, 2.5× that backward
    Tensor q = dev(bf, 3, T, nh, d), kk = dev(bf, 3, T, nkv, d), v = dev(bf, 3, T, nkv, d), o = dev(bf, 3, T, nh, d);
    Tensor lse = dev(DT_F32, 3, 1, nh, T), dq = dev(bf, 3, T, nh, d), dk = dev(bf, 3, T, nkv, d), dv = dev(bf, 3, T, nkv, d);
    fill(q, 1, 7), fill(kk, 1, 8), fill(v, 1, 9), fill(o, 1, 10);
    double fa = 4.0 * T * T * d * nh / 2;
    float sc = 1.0f / sqrtf((float)d);
    TIME("attention fwd S=4096 d=128 GQA 32/4", 3, fa, "TFLOP/s", op_attention_forward(o, lse, q, kk, v, 1, sc));
    TIME("attention bwd", 2, 2.5 * fa, "TFLOP/s", op_attention_backward(dq, dk, dv, o, q, kk, v, o, lse, 1, sc));
    // memory-bound
    Tensor y = dev(bf, 2, T, H, 0), w = dev(bf, 1, H, 0, 0), rstd = dev(DT_F32, 1, T, 0, 0), dwn = dev(DT_F32, 1, H, 0, 0);
    fill(w, 1, 11);
    TIME("rmsnorm fwd (4096, 2048)", 50, 2.0 * T * H * 2, "GB/s", op_rmsnorm_forward(y, rstd, x, w, 1e-6f));
    TIME("rmsnorm bwd", 50, 4.0 * T * H * 2, "GB/s", op_rmsnorm_backward(y, dwn, x, x, w, rstd, false));
    Tensor qn = tensor_reshape2(q, T * nh, d), qo = tensor_reshape2(dq, T * nh, d), rq = dev(DT_F32, 1, T * nh, 0, 0), wn = dev(bf, 1, d, 0, 0);
    fill(wn, 1, 12);
    TIME("rmsnorm fwd q-norm (131072, 128)", 50, 2.0 * T * nh * d * 2, "GB/s", op_rmsnorm_forward(qo, rq, qn, wn, 1e-6f));
    Tensor lg = dev(DT_F32, 2, C, V, 0), lab = dev(DT_I32, 1, C, 0, 0), ls = dev(DT_F64, 1, 1, 0, 0);
    int32_t *hl = xmalloc(C * sizeof(int32_t));
    for (int64_t i = 0; i < C; i++) hl[i] = (int32_t)(i * 7919 % V);
    op_copy(lab, tensor_make(hl, DT_I32, DEV_CPU, 1, C, 1, 1, 1));
    fill(lg, 2, 13);
    TIME("cross-entropy chunk (110, 151936)", 20, 2.0 * C * V * 4, "GB/s", op_cross_entropy(lg, lab, ls, 1.0f));
    Tensor idx = dev(DT_I32, 2, T, k, 0), perm = dev(DT_I32, 1, R, 0, 0);
    int32_t *hi = xmalloc(R * sizeof(int32_t));
    for (int64_t i = 0; i < R; i++) hi[i] = (int32_t)(rng_u64(1, 2, i) % E);
    op_copy(idx, tensor_make(hi, DT_I32, DEV_CPU, 2, T, k, 1, 1));
    TIME("moe_sort (32768 slots, host sync)", 20, (double)R * 8, "GB/s", op_moe_sort(perm, offs, idx, (int)E));
    TIME("gather_rows dispatch (32768, 2048)", 20, 2.0 * R * H * 2, "GB/s", op_gather_rows(xe, x, perm, (int)k));
    TIME("gather_rows_backward (atomics)", 20, 2.0 * R * H * 2, "GB/s", op_gather_rows_backward(x, xe, perm, (int)k));
    Tensor yslot = dev(bf, 2, R, H, 0), wts = dev(DT_F32, 2, T, k, 0);
    fill(wts, 0.1f, 14);
    TIME("moe_combine fwd", 20, (double)(R + 2 * T) * H * 2, "GB/s", op_moe_combine_forward(y, x, yslot, wts));
    int64_t np = 30000000;
    Tensor p = dev(DT_F32, 1, np, 0, 0), g = dev(DT_F32, 1, np, 0, 0), m = dev(DT_F32, 1, np, 0, 0), vv = dev(DT_F32, 1, np, 0, 0);
    op_zero(m), op_zero(vv), fill(p, 1, 15), fill(g, 1, 16);
    TIME("adamw 30M params", 20, (double)np * 7 * 4, "GB/s", op_adamw(p, g, m, vv, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    double ss = 0;
    TIME("sum_squares 30M (host result)", 20, (double)np * 4, "GB/s", ss += op_sum_squares(g));
    Tensor pb = dev(bf, 1, np, 0, 0);
    TIME("copy fp32 -> bf16 30M", 20, (double)np * 6, "GB/s", op_copy(pb, p));
    printf("(sum_squares check %.3g)\n", ss);
    arena_destroy(&A);
    return 0;
}
