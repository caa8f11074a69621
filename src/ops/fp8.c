// fp8.c — the FP8 linear layers (docs/architecture.md, "FP8"): each GEMM rounds its operands through E4M3 with the
// blocks DeepSeek-V3's recipe gives its contraction (op_fp8_round: ops/cpu/cpu_fp8.c, ops/cuda/cuda_fp8.cu), then
// runs the ordinary GEMM op on the rounded values with fp32 accumulation. The rounded values are exact in bf16, so
// on the GPU this is the FP8 product up to the order of the fp32 sums.
#include "ops/ops.h"

#include "ops/cpu/cpu_ops.h"
#ifdef PITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

static const Tensor NONE = {0};

void op_fp8_round(Tensor y, Tensor x, Fp8Blocks b, const int64_t *offs, int groups) {
#ifdef PITH_CUDA
    if (x.dev == DEV_CUDA) return cuda_fp8_round(y, x, b, offs, groups);
#endif
    CHECK(x.dev == DEV_CPU);
    cpu_fp8_round(y, x, b, offs, groups);
}

// Two scratch buffers per device for the rounded operands, grown to their largest use (the first step) and kept;
// like the GPU op scratch they are outside the memory plan. Growing a device buffer frees the old one, which
// waits for the queued work that reads it.
static struct {
    void *p;
    size_t bytes;
} scratch[2][2];

static Tensor rounded(int slot, Tensor x, Fp8Blocks b, const int64_t *offs, int groups) {
    int d = x.dev == DEV_CUDA;
    size_t need = tensor_bytes(x);
    if (need > scratch[d][slot].bytes) {
        if (d) {
            if (scratch[d][slot].p) device_free(scratch[d][slot].p);
            scratch[d][slot].p = device_alloc(need, "the FP8 operand scratch");
        } else {
            scratch[d][slot].p = xrealloc(scratch[d][slot].p, need);
        }
        scratch[d][slot].bytes = need;
    }
    Tensor y = x;
    y.p = scratch[d][slot].p;
    op_fp8_round(y, x, b, offs, groups);
    return y;
}

void op_fp8_linear_forward(Tensor y, Tensor x, Tensor wq) {
    op_linear_forward(y, rounded(0, x, FP8_ROWS, NULL, 0), wq, NONE);
}

void op_fp8_linear_backward_input(Tensor dx, Tensor dy, Tensor wq, bool accumulate) {
    op_linear_backward_input(dx, rounded(0, dy, FP8_ROWS, NULL, 0), wq, accumulate);
}

void op_fp8_linear_backward_weight(Tensor dw, Tensor dy, Tensor x) {
    op_linear_backward_weight(dw, NONE, rounded(0, dy, FP8_COLS, NULL, 0), rounded(1, x, FP8_TILES, NULL, 0));
}

void op_fp8_grouped_linear_forward(Tensor y, Tensor x, Tensor wq, const int64_t *offs) {
    op_grouped_linear_forward(y, rounded(0, x, FP8_ROWS, NULL, 0), wq, NONE, offs);
}

void op_fp8_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor wq, const int64_t *offs) {
    op_grouped_linear_backward_input(dx, rounded(0, dy, FP8_ROWS, NULL, 0), wq, offs);
}

void op_fp8_grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, const int64_t *offs) {
    int E = (int)dw.n[0];
    op_grouped_linear_backward_weight(dw, NONE, rounded(0, dy, FP8_COLS, offs, E), rounded(1, x, FP8_COLS, offs, E),
                                      offs, true);
}
