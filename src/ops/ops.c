// ops.c — dispatch of each op in ops.h to its CPU or CUDA implementation, by the device of its tensors.
#include "ops/ops.h"

#include "ops/cpu/cpu_ops.h"

#ifdef PITH_CUDA
#include "ops/cuda/cuda_ops.h"
#define DISPATCH(dev, call)                                                                                            \
    do {                                                                                                               \
        if ((dev) == DEV_CUDA) cuda_##call;                                                                            \
        else cpu_##call;                                                                                               \
    } while (0)
#define DISPATCH_RETURN(dev, call) return (dev) == DEV_CUDA ? cuda_##call : cpu_##call
bool ops_cuda_available(void) { return cuda_device_count() > 0; }
size_t ops_cuda_pool_bytes(void) { return cuda_pool_bytes(); }
size_t ops_cuda_peak_bytes(void) { return cuda_mem_peak_bytes(); }
void ops_sync(void) {
    if (ops_cuda_available()) cuda_sync();
}
#else
#define DISPATCH(dev, call)                                                                                            \
    do {                                                                                                               \
        if ((dev) == DEV_CUDA) die("a GPU tensor reached the op layer, but this build has no CUDA backend");           \
        cpu_##call;                                                                                                    \
    } while (0)
#define DISPATCH_RETURN(dev, call)                                                                                     \
    do {                                                                                                               \
        if ((dev) == DEV_CUDA) die("a GPU tensor reached the op layer, but this build has no CUDA backend");           \
        return cpu_##call;                                                                                             \
    } while (0)
bool ops_cuda_available(void) { return false; }
size_t ops_cuda_pool_bytes(void) { return 0; }
size_t ops_cuda_peak_bytes(void) { return 0; }
void ops_sync(void) {}
#endif

void op_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b) { DISPATCH(x.dev, linear_forward(y, x, w, b)); }
void op_linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool acc) {
    DISPATCH(dy.dev, linear_backward_input(dx, dy, w, acc));
}
void op_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x) {
    DISPATCH(dy.dev, linear_backward_weight(dw, db, dy, x));
}
void op_grouped_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b, const int64_t *offs) {
    DISPATCH(x.dev, grouped_linear_forward(y, x, w, b, offs));
}
void op_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, const int64_t *offs) {
    DISPATCH(dy.dev, grouped_linear_backward_input(dx, dy, w, offs));
}
void op_grouped_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, const int64_t *offs,
                                       bool accumulate) {
    DISPATCH(dy.dev, grouped_linear_backward_weight(dw, db, dy, x, offs, accumulate));
}
void op_rmsnorm_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps) {
    DISPATCH(x.dev, rmsnorm_forward(y, rstd, x, w, eps));
}
void op_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool acc) {
    DISPATCH(x.dev, rmsnorm_backward(dx, dw, dy, x, w, rstd, acc));
}
void op_rope(Tensor x, int off, Tensor cos, Tensor sin, Tensor pos, RopeLayout layout, bool backward) {
    DISPATCH(x.dev, rope(x, off, cos, sin, pos, layout, backward));
}
void op_swiglu_forward(Tensor act, Tensor gu) { DISPATCH(gu.dev, swiglu_forward(act, gu)); }
void op_swiglu_backward(Tensor dgu, Tensor dact, Tensor gu) { DISPATCH(gu.dev, swiglu_backward(dgu, dact, gu)); }
void op_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    DISPATCH(q.dev, attention_forward(o, lse, q, k, v, a));
}
void op_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                           Tensor o, Tensor lse, const AttnArgs *a) {
    DISPATCH(q.dev, attention_backward(dq, dk, dv, dsinks, dout, q, k, v, o, lse, a));
}
void op_attention_merge(Tensor o, Tensor lse, Tensor o_p, Tensor lse_p, int B, bool init) {
    DISPATCH(o.dev, attention_merge(o, lse, o_p, lse_p, B, init));
}
void op_router_forward(Tensor probs, Tensor idx, Tensor w, Tensor logits, const RouterArgs *a) {
    DISPATCH(logits.dev, router_forward(probs, idx, w, logits, a));
}
void op_router_backward(Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                        const RouterArgs *a) {
    DISPATCH(probs.dev, router_backward(dlogits, dw, lb_grad, probs, idx, w, a));
}
void op_moe_lb_loss(Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float grad_scale) {
    DISPATCH(probs.dev, moe_lb_loss(loss_sum, lb_grad, probs, idx, coef, grad_scale));
}
void op_moe_sort(Tensor perm, int64_t *offs, Tensor idx, int E) { DISPATCH(idx.dev, moe_sort(perm, offs, idx, E)); }
void op_gather_rows(Tensor y, Tensor x, Tensor rows, int div) { DISPATCH(x.dev, gather_rows(y, x, rows, div)); }
void op_scatter_add_rows(Tensor dx, Tensor dy, Tensor rows, int div) {
    DISPATCH(dy.dev, scatter_add_rows(dx, dy, rows, div));
}
void op_scatter_rows(Tensor y, Tensor x, Tensor rows) { DISPATCH(x.dev, scatter_rows(y, x, rows)); }
void op_moe_combine_forward(Tensor out, Tensor resid, Tensor y, Tensor w) {
    DISPATCH(y.dev, moe_combine_forward(out, resid, y, w));
}
void op_moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w) {
    DISPATCH(y.dev, moe_combine_backward(dy, dw, dout, y, w));
}
void op_embedding_forward(Tensor h, Tensor table, Tensor tokens) {
    DISPATCH(h.dev, embedding_forward(h, table, tokens));
}
void op_embedding_backward(Tensor dtable, Tensor dh, Tensor tokens) {
    DISPATCH(dh.dev, embedding_backward(dtable, dh, tokens));
}
int64_t op_embedding_bad_id(Device dev) { DISPATCH_RETURN(dev, embedding_bad_id()); }
void op_cross_entropy(Tensor logits, Tensor labels, Tensor loss_sum, float grad_scale) {
    DISPATCH(logits.dev, cross_entropy(logits, labels, loss_sum, grad_scale));
}
void op_zero(Tensor x) { DISPATCH(x.dev, zero(x)); }
void op_add(Tensor y, Tensor x) { DISPATCH(y.dev, add(y, x)); }
void op_scale(Tensor x, float s) { DISPATCH(x.dev, scale(x, s)); }
void op_copy(Tensor dst, Tensor src) { DISPATCH(dst.dev == DEV_CUDA ? DEV_CUDA : src.dev, copy(dst, src)); }
void op_copy_cols(Tensor dst, int64_t a, Tensor src, int64_t b, int64_t n, bool accumulate) {
    DISPATCH(dst.dev, copy_cols(dst, a, src, b, n, accumulate));
}
double op_sum_squares(Tensor x) { DISPATCH_RETURN(x.dev, sum_squares(x)); }
void op_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
              float wd, int t) {
    if (w.p && (w.dev != p.dev || tensor_numel(w) != tensor_numel(p)))
        die("adamw: the compute copy must match the master's device and size");
    DISPATCH(p.dev, adamw(p, g, m, v, w, gscale, lr, b1, b2, eps, wd, t));
}
bool op_adamw_nonfinite(Device dev) { DISPATCH_RETURN(dev, adamw_nonfinite()); }
double op_read_scalar(Tensor x) { DISPATCH_RETURN(x.dev, read_scalar(x)); }

// ---- Qwen3.5 ----
void op_rmsnorm1p_forward(Tensor y, Tensor rstd, Tensor x, Tensor w, float eps) {
    DISPATCH(x.dev, rmsnorm1p_forward(y, rstd, x, w, eps));
}
void op_rmsnorm1p_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool acc) {
    DISPATCH(x.dev, rmsnorm1p_backward(dx, dw, dy, x, w, rstd, acc));
}
void op_rmsnorm_gated_forward(Tensor y, Tensor rstd, Tensor x, Tensor z, Tensor w, float eps) {
    DISPATCH(x.dev, rmsnorm_gated_forward(y, rstd, x, z, w, eps));
}
void op_rmsnorm_gated_backward(Tensor dx, Tensor dz, Tensor dw, Tensor dy, Tensor x, Tensor z, Tensor w, Tensor rstd) {
    DISPATCH(x.dev, rmsnorm_gated_backward(dx, dz, dw, dy, x, z, w, rstd));
}
void op_sigmoid_gate_forward(Tensor y, Tensor x, Tensor gate) { DISPATCH(x.dev, sigmoid_gate_forward(y, x, gate)); }
void op_sigmoid_gate_backward(Tensor dx, Tensor dgate, Tensor dy, Tensor x, Tensor gate, bool acc) {
    DISPATCH(x.dev, sigmoid_gate_backward(dx, dgate, dy, x, gate, acc));
}
void op_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, Tensor halo, int B) {
    DISPATCH(x.dev, conv1d_silu_forward(y, x, w, halo, B));
}
void op_conv1d_silu_backward(Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo, int B) {
    DISPATCH(x.dev, conv1d_silu_backward(dx, dhalo, dw, dy, x, w, halo, B));
}
void op_delta_gates_forward(Tensor g, Tensor beta, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias) {
    DISPATCH(a.dev, delta_gates_forward(g, beta, a, b, A_log, dt_bias));
}
void op_delta_gates_backward(Tensor da, Tensor db, Tensor dA_log, Tensor ddt_bias, Tensor dg, Tensor dbeta, Tensor a,
                             Tensor b, Tensor A_log, Tensor dt_bias) {
    DISPATCH(a.dev, delta_gates_backward(da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias));
}
AttnScratch op_attention_scratch(Arena *a, Tensor q) {
    return (AttnScratch){.D = arena_tensor(a, DT_F32, 2, q.n[0], q.n[1], 0, 0),
                         .dq = arena_tensor(a, DT_F32, 3, q.n[0], q.n[1], q.n[2], 0)};
}
size_t op_attention_workspace(Tensor q, Tensor k, const AttnArgs *a) {
#ifdef PITH_CUDNN
    if (q.dev != DEV_CUDA || q.dt != DT_BF16 || a->deterministic || !a->causal || a->q_off || a->k_off ||
        k.n[0] != q.n[0])
        return 0;
    Arena c = arena_counting("attention scratch", q.dev);
    op_attention_scratch(&c, q);
    return c.used / sizeof(float);
#else
    (void)q, (void)k, (void)a;
    return 0;
#endif
}

DeltaScratch op_delta_rule_scratch(Arena *a, Tensor q, Tensor v, const DeltaArgs *da, bool backward) {
    int64_t T = q.n[0], nk = q.n[1], dk = q.n[2], nv = v.n[1], dv = v.n[2], BH = da->B * nv;
    int64_t L = da->chunk ? da->chunk : DELTA_MAX_CHUNK, NC = (T / da->B + L - 1) / L, NL = NC * L;
    DeltaScratch s = {0};
    s.qh = arena_tensor(a, DT_F32, 3, T, nk, dk, 0), s.kh = arena_tensor(a, DT_F32, 3, T, nk, dk, 0);
    s.rq = arena_tensor(a, DT_F32, 2, T, nk, 0, 0), s.rk = arena_tensor(a, DT_F32, 2, T, nk, 0, 0);
    s.cs = arena_tensor(a, DT_F64, 2, BH, NL, 0, 0);
    s.U = arena_tensor(a, DT_F32, 3, BH, NL, dv, 0), s.W = arena_tensor(a, DT_F32, 3, BH, NL, dk, 0);
    s.M = arena_tensor(a, DT_F32, 4, BH, NC, L, L);
    if (!backward) return s;
    s.Tm = arena_tensor(a, DT_F32, 4, BH, NC, L, L);
    s.S0 = arena_tensor(a, DT_F32, 4, BH, NC, dk, dv), s.dS1 = arena_tensor(a, DT_F32, 4, BH, NC, dk, dv);
    s.Vp = arena_tensor(a, DT_F32, 3, BH, NL, dv, 0), s.dVp = arena_tensor(a, DT_F32, 3, BH, NL, dv, 0);
    s.dBv = arena_tensor(a, DT_F32, 3, BH, NL, dv, 0);
    s.dW = arena_tensor(a, DT_F32, 3, BH, NL, dk, 0), s.dBk = arena_tensor(a, DT_F32, 3, BH, NL, dk, 0);
    s.gq = arena_tensor(a, DT_F32, 3, T, nv, dk, 0), s.gk = arena_tensor(a, DT_F32, 3, T, nv, dk, 0);
    return s;
}
size_t op_delta_rule_workspace(Tensor q, Tensor v, const DeltaArgs *a, bool backward) {
    if (q.dev != DEV_CUDA) return 0;
    Arena c = arena_counting("delta_rule scratch", q.dev);
    op_delta_rule_scratch(&c, q, v, a, backward);
    return c.used / sizeof(float);
}
void op_delta_rule_forward(Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DISPATCH(q.dev, delta_rule_forward(o, q, k, v, g, beta, a));
}
void op_delta_rule_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k,
                            Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DISPATCH(q.dev, delta_rule_backward(dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, a));
}

// ---- GPT-OSS ----
void op_swiglu_clamped_forward(Tensor act, Tensor gu, float alpha, float limit) {
    DISPATCH(gu.dev, swiglu_clamped_forward(act, gu, alpha, limit));
}
void op_swiglu_clamped_backward(Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit) {
    DISPATCH(gu.dev, swiglu_clamped_backward(dgu, dact, gu, alpha, limit));
}
