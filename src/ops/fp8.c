// fp8.c — the FP8 linear layers (docs/architecture.md, "FP8"): each GEMM quantises its operands through E4M3 with
// the blocks DeepSeek-V3's recipe gives its contraction (ops/cpu/cpu_fp8.c, ops/cuda/cuda_fp8.cu). On the GPU the dense
// GEMMs run on the FP8 tensor cores (cuBLASLt's block-scaled E4M3 products, cuda_fp8.cu) where the shapes fit, the
// experts' forward, input and weight gradient on our wgmma E4M3 kernel (cuda_wgmma_fp8.cu); the others, and every CPU
// one, run the ordinary GEMM op on the rounded values (op_fp8_round) with fp32 accumulation. The rounded values are exact in bf16, so both are the FP8 product up to the order of the fp32 sums.
#include "ops/ops.h"

#include "ops/cpu/cpu_ops.h"
#ifdef PITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

// Whether call (a cuda_* op that returns whether it ran) ran: only for tensors on the GPU of a CUDA build.
#ifdef PITH_CUDA
#define RAN_ON_CUDA(dev, call) ((dev) == DEV_CUDA && (call))
#else
#define RAN_ON_CUDA(dev, call) false
#endif

// Two scratch buffers per device for the rounded operands, grown to their largest use (the first step) and kept;
// like the GPU op scratch they are outside the memory plan. Growing a device buffer frees the old one, which
// waits for the queued work that reads it.
static struct Scratch {
    void *p;
    size_t bytes;
} scratch[2][2];

// A tensor of x's shape and dtype in scratch slot `slot` of x's device.
static Tensor scratch_like(int slot, Tensor x) {
    int d = x.dev == DEV_CUDA;
    struct Scratch *sc = &scratch[d][slot];
    size_t need = tensor_bytes(x);
    if (need > sc->bytes) {
        if (d && sc->p) device_free(sc->p);
        sc->p = d ? device_alloc(need, "the FP8 operand scratch") : xrealloc(sc->p, need);
        sc->bytes = need;
    }
    Tensor y = x;
    y.p = sc->p;
    return y;
}

static Tensor rounded(int slot, Tensor x, Fp8Blocks b, Tensor offs) {
    Tensor y = scratch_like(slot, x);
    op_fp8_round(y, x, b, offs);
    return y;
}

// ---- the dense weight's codes and scales ----
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }
static int64_t up4(int64_t n) { return (n + 3) / 4 * 4; }

// E experts' (N, K) weight on the FP8 path: codes, transposed codes, row-block and column-block scales, carved in
// this order from a (each part 256-byte aligned). The one layout: op_fp8_experts_bytes runs it on a counting arena.
static Fp8Weight fp8_carve(Arena *a, int64_t E, int64_t N, int64_t K) {
    int64_t NB = (N + 127) / 128, KB = (K + 127) / 128;
    return (Fp8Weight){arena_tensor(a, DT_U8, 3, E, N, K, 1), arena_tensor(a, DT_U8, 3, E, K, N, 1),
                       arena_tensor(a, DT_F32, 2, E * NB, up4(KB), 1, 1),
                       arena_tensor(a, DT_F32, 2, E * KB, up4(NB), 1, 1)};
}
size_t op_fp8_experts_bytes(int64_t E, int64_t N, int64_t K) {
    Arena c = arena_counting("fp8 weight", DEV_CPU);
    fp8_carve(&c, E, N, K);
    return align256(c.used); // whole 256-byte units, so weights placed one after another stay aligned
}
size_t op_fp8_weight_bytes(int64_t N, int64_t K) { return op_fp8_experts_bytes(1, N, K); }

Fp8Weight op_fp8_experts_view(void *p, Device dev, int64_t E, int64_t N, int64_t K) {
    Arena a = {p, 0, SIZE_MAX, 0, dev, "fp8 weight"}; // the caller holds op_fp8_experts_bytes; p NULL: shapes only
    return fp8_carve(&a, E, N, K);
}

// The dense weight: one expert's parts, the codes 2-D.
Fp8Weight op_fp8_weight_view(void *p, Device dev, int64_t N, int64_t K) {
    Fp8Weight fw = op_fp8_experts_view(p, dev, 1, N, K);
    fw.q = tensor_make(fw.q.p, DT_U8, dev, 2, N, K, 1, 1), fw.qt = tensor_make(fw.qt.p, DT_U8, dev, 2, K, N, 1, 1);
    return fw;
}

void op_fp8_weight_make(Fp8Weight fw, Tensor w) {
    CHECK(w.dev == fw.q.dev && tensor_numel(w) == tensor_numel(fw.q));
#ifdef PITH_CUDA
    if (w.dev == DEV_CUDA) return cuda_fp8_weight(fw, w);
#endif
    cpu_fp8_weight(fw, w);
}

void op_fp8_weights_ahead(const Fp8Weight *fw, const Tensor *w, int n, int id) {
    CHECK(n > 0 && id >= 0 && id < FP8_AHEAD_IDS);
    for (int i = 0; i < n; i++)
        CHECK(w[i].dev == w[0].dev && w[i].dev == fw[i].q.dev && tensor_numel(w[i]) == tensor_numel(fw[i].q));
#ifdef PITH_CUDA
    if (w[0].dev == DEV_CUDA) return cuda_fp8_weights_ahead(fw, w, n, id);
#endif
    for (int i = 0; i < n; i++) cpu_fp8_weight(fw[i], w[i]);
}

void op_fp8_weights_join(Device dev, int id) {
#ifdef PITH_CUDA
    if (dev == DEV_CUDA) return cuda_fp8_weights_join(id);
#endif
    (void)dev, (void)id;
}

// The weight's values q·s ((N, K) or (E, N, K)) in dtype dt, in scratch slot 1: the operand of the GEMMs off the
// tensor cores.
static Tensor weight_values(Fp8Weight fw, DType dt) {
    Tensor shape = fw.q;
    shape.dt = dt;
    Tensor y = scratch_like(1, shape);
#ifdef PITH_CUDA
    if (y.dev == DEV_CUDA) return cuda_fp8_weight_values(y, fw), y;
#endif
    cpu_fp8_weight_values(y, fw);
    return y;
}

bool op_fp8_tensor_cores(Device dev, int64_t E, int64_t N, int64_t K) {
#ifdef PITH_CUDA
    if (dev == DEV_CUDA) return E ? cuda_fp8_experts_fit(E, N, K) : cuda_fp8_dense_fit(N, K);
#endif
    return false;
}

void op_fp8_linear_forward(Tensor y, Tensor x, Fp8Weight w8) {
    if (RAN_ON_CUDA(x.dev, cuda_fp8_linear_forward(y, x, w8))) return;
    op_linear_forward(y, rounded(0, x, FP8_ROWS, NONE), weight_values(w8, x.dt), NONE);
}

void op_fp8_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, bool accumulate) {
    if (RAN_ON_CUDA(dy.dev, cuda_fp8_linear_backward_input(dx, dy, w8, accumulate))) return;
    op_linear_backward_input(dx, rounded(0, dy, FP8_ROWS, NONE), weight_values(w8, dy.dt), accumulate);
}

void op_fp8_linear_backward_weight(Tensor dw, Tensor dy, Tensor x) {
    if (RAN_ON_CUDA(x.dev, cuda_fp8_linear_backward_weight(dw, dy, x))) return;
    op_linear_backward_weight(dw, NONE, rounded(0, dy, FP8_COLS, NONE), rounded(1, x, FP8_TILES, NONE), true);
}

// x's rows gathered (row i of n is x's row rows[i] / div) into scratch slot 1: the GPU's GEMMs off the tensor cores
// take their rows gathered.
static Tensor gathered(Tensor x, Tensor rows, int div, int64_t n) {
    Tensor xg = scratch_like(1, tensor_make(NULL, x.dt, x.dev, 2, n, t_cols(x), 1, 1));
    op_gather_rows(xg, x, tensor_rows(rows, 0, n), div);
    return xg;
}

// rows.p: x's rows are rounded as they lie and gathered by the GEMM (a 1 × 128 block is one row's, so the bits are the
// rounding of the gathered rows); the GPU's FP8 kernel gathers them as its quantiser reads x.
void op_fp8_grouped_linear_forward(Tensor y, Tensor x, Tensor rows, int div, Fp8Weight w8, Tensor offs) {
    if (RAN_ON_CUDA(x.dev, cuda_fp8_grouped_linear(y, x, rows, div, w8, offs, false))) return;
    if (rows.p && x.dev == DEV_CUDA) x = gathered(x, rows, div, tensor_numel(rows)), rows = NONE;
    Tensor xr = rounded(0, x, FP8_ROWS, NONE); // before weight_values takes slot 1
    op_grouped_linear_forward(y, xr, rows, div, weight_values(w8, x.dt), NONE, offs);
}

void op_fp8_grouped_linear_backward_input(Tensor dx, Tensor dy, Fp8Weight w8, Tensor offs) {
    if (RAN_ON_CUDA(dy.dev, cuda_fp8_grouped_linear(dx, dy, NONE, 0, w8, offs, true))) return;
    op_grouped_linear_backward_input(dx, rounded(0, dy, FP8_ROWS, NONE), weight_values(w8, dy.dt), offs);
}

// rows.p: the rows are gathered into scratch slot 1 and rounded there (the 128 × 1 blocks run along the gathered
// rows); the GPU's FP8 kernel gathers them as its quantiser reads x.
void op_fp8_grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, Tensor rows, int div, Tensor offs,
                                           bool accumulate) {
    if (RAN_ON_CUDA(x.dev, cuda_fp8_grouped_linear_backward_weight(dw, dy, x, rows, div, offs, accumulate))) return;
    if (rows.p) x = gathered(x, rows, div, t_rows(dy));
    op_grouped_linear_backward_weight(dw, NONE, rounded(0, dy, FP8_COLS, offs), rounded(1, x, FP8_COLS, offs), NONE, 0,
                                      offs, accumulate);
}
