// ops.c — dispatch of each op in ops_list.h to its CPU or CUDA implementation, by the device of its tensors.
#include "ops/ops.h"

#include "ops/cpu/cpu_ops.h"

#ifdef PITH_CUDA
#include "ops/cuda/cuda_ops.h"
// cuda_<name> args on a GPU, else cpu_<name> args: an expression of their type (void included).
#define DISPATCH_CALL(dev, name, args) ((dev) == DEV_CUDA ? cuda_##name args : cpu_##name args)
bool ops_cuda_available(void) { return cuda_device_count() > 0; }
size_t ops_cuda_pool_bytes(void) { return cuda_pool_bytes(); }
size_t ops_cuda_peak_bytes(void) { return cuda_mem_peak_bytes(); }
void ops_sync(void) {
    if (ops_cuda_available()) cuda_sync();
}
#else
#define DISPATCH_CALL(dev, name, args) ((dev) == DEV_CUDA ? no_cuda() : (void)0, cpu_##name args)
static void no_cuda(void) { die("a GPU tensor reached the op layer, but this build has no CUDA backend"); }
bool ops_cuda_available(void) { return false; }
size_t ops_cuda_pool_bytes(void) { return 0; }
size_t ops_cuda_peak_bytes(void) { return 0; }
void ops_sync(void) {}
#endif

// The ops of ops_list.h: each runs cuda_<name> or cpu_<name> by its device expression (OP_RETURN_<ret>: `return`
// where the op returns a value); the OP_OWN ones are written out below.
#define OP(ret, name, dev, params, args)                                                                               \
    ret op_##name params { OP_RETURN_##ret DISPATCH_CALL(dev, name, args); }
#define OP_OWN(ret, name, dev, params, args)
#define OP_RETURN_void
#define OP_RETURN_double return
#include "ops/ops_list.h"

int64_t op_embedding_bad_id(Device dev) { return DISPATCH_CALL(dev, embedding_bad_id, ()); }
bool op_adamw_nonfinite(Device dev) { return DISPATCH_CALL(dev, adamw_nonfinite, ()); }
void op_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
              float wd, int t) {
    if (w.p && (w.dev != p.dev || tensor_numel(w) != tensor_numel(p)))
        die("adamw: the compute copy must match the master's device and size");
    DISPATCH_CALL(p.dev, adamw, (p, g, m, v, w, gscale, lr, b1, b2, eps, wd, t));
}

// cuda_cudnn.cu's D and dQ accumulator, 256-byte pieces (ops.h).
size_t op_attention_workspace(Tensor q, Tensor k, const AttnArgs *a) {
#ifdef PITH_CUDNN
    if (q.dev != DEV_CUDA || q.dt != DT_BF16 || a->deterministic || !a->causal || a->q_off || a->k_off ||
        k.n[0] != q.n[0])
        return 0;
    size_t rows = (size_t)q.n[0] * q.n[1];
    return (rows + 63) / 64 * 64 + (rows * q.n[2] + 63) / 64 * 64;
#else
    (void)q, (void)k, (void)a;
    return 0;
#endif
}

// cuda_delta.cu carves its scratch in this order: q̂, k̂ (T, nk, dk), their norms (T, nk each, padded to 16 bytes),
// then per (b, h) over NC chunks of L (NL = NC·L rows): c (NL, fp64), U (NL, dv), W (NL, dk), M (NC, L, L); the
// backward adds Tm (NC, L, L), S₀ and dS₁ (NC, dk, dv), V', dV', dBv (NL, dv), dW, dBk (NL, dk) and gq, gk (T, nv, dk).
// The CPU needs none.
size_t op_delta_rule_workspace(Tensor q, Tensor v, const DeltaArgs *a, bool backward) {
    if (q.dev != DEV_CUDA) return 0;
    int64_t T = q.n[0], S = T / a->B, nk = q.n[1], dk = q.n[2], nv = v.n[1], dv = v.n[2];
    int64_t L = a->chunk ? a->chunk : DELTA_MAX_CHUNK, NC = (S + L - 1) / L, NL = NC * L, BH = a->B * nv;
    int64_t fwd = 2 * T * nk * dk + (2 * T * nk + 3) / 4 * 4 + BH * NL * (2 + dv + dk) + BH * NC * L * L;
    if (!backward) return (size_t)fwd;
    return (size_t)(fwd + BH * NC * (L * L + 2 * dk * dv) + BH * NL * (3 * dv + 2 * dk) + 2 * T * nv * dk);
}
