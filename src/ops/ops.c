// ops.c — dispatch of each op in ops_list.h to its CPU or CUDA implementation, by the device of its tensors.
#include "ops/ops.h"

#include "ops/cpu/cpu_ops.h"

#ifdef PITH_CUDA
#include "ops/cuda/cuda_ops.h"
// cuda_<name> args on a GPU, else cpu_<name> args: an expression of their type (void included).
#define DISPATCH_CALL(dev, name, args) ((dev) == DEV_CUDA ? cuda_##name args : cpu_##name args)
#define CUDA_OR(cuda, none) (cuda) // the value with the CUDA backend, and without it
#else
#define DISPATCH_CALL(dev, name, args) ((dev) == DEV_CUDA ? no_cuda() : (void)0, cpu_##name args)
#define CUDA_OR(cuda, none) (none)
static void no_cuda(void) { die("a GPU tensor reached the op layer, but this build has no CUDA backend"); }
static void no_graph(void) { die("cuda_graph: this build has no CUDA backend"); }
#endif
bool ops_cuda_available(void) { return CUDA_OR(cuda_device_count() > 0, false); }
size_t ops_cuda_pool_bytes(void) { return CUDA_OR(cuda_pool_bytes(), 0); }
size_t ops_cuda_peak_bytes(void) { return CUDA_OR(cuda_mem_peak_bytes(), 0); }
void ops_sync(void) {
    if (ops_cuda_available()) CUDA_OR(cuda_sync(), (void)0);
}
void ops_copies_wait(void) { CUDA_OR(cuda_copies_wait(), (void)0); }
void ops_uploads_wait(void) { CUDA_OR(cuda_uploads_wait(), (void)0); }
int64_t ops_host_syncs(void) { return CUDA_OR(cuda_host_syncs(), 0); }
void ops_graph_begin(void) { CUDA_OR(cuda_graph_begin(), no_graph()); }
OpsGraph *ops_graph_end(void) { return CUDA_OR((OpsGraph *)cuda_graph_end(), (no_graph(), NULL)); }
bool ops_graph_run(OpsGraph *g) { return CUDA_OR(cuda_graph_run(g), ((void)g, no_graph(), false)); }
void ops_graph_free(OpsGraph *g) { CUDA_OR(cuda_graph_free(g), (void)g); }

// The ops of ops_list.h: each runs cuda_<name> or cpu_<name> by its device expression (OP_RETURN_<ret>: `return`
// where the op returns a value); the OP_OWN ones are written out below.
#define OP(ret, name, dev, params, args)                                                                               \
    ret op_##name params { OP_RETURN_##ret DISPATCH_CALL(dev, name, args); }
#define OP_OWN(ret, name, dev, params, args)
#define OP_RETURN_void
#define OP_RETURN_double return
#include "ops/ops_list.h"

void op_copy_col_blocks(Tensor dst, int64_t a, int64_t da, Tensor src, int64_t b, int64_t db, int64_t n, int64_t reps,
                        bool accumulate) {
    int64_t R = t_rows(dst), Cd = t_cols(dst), Cs = t_cols(src);
    if (t_rows(src) != R || n < 0 || reps < 1 || a < 0 || b < 0 || da < 0 || db < 0 || (da && da < n) ||
        a + (reps - 1) * da + n > Cd || b + (reps - 1) * db + n > Cs)
        die("copy_col_blocks: %lld blocks of %lld columns, dst (%lld, %lld) from %lld by %lld, src (%lld, %lld) from "
            "%lld by %lld: they do not fit",
            (long long)reps, (long long)n, (long long)R, (long long)Cd, (long long)a, (long long)da,
            (long long)t_rows(src), (long long)Cs, (long long)b, (long long)db);
    if (R * n == 0) return;
    DISPATCH_CALL(dst.dev, copy_col_blocks, (dst, a, da, src, b, db, n, reps, accumulate));
}
int64_t op_embedding_bad_id(Device dev) { return DISPATCH_CALL(dev, embedding_bad_id, ()); }
bool op_adamw_nonfinite(Device dev) { return DISPATCH_CALL(dev, adamw_nonfinite, ()); }
int64_t op_moe_sort_bad_expert(Device dev) { return DISPATCH_CALL(dev, moe_sort_bad_expert, ()); }
void op_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
              float wd, int t) {
    if (w.p && (w.dev != p.dev || tensor_numel(w) != tensor_numel(p)))
        die("adamw: the compute copy must match the master's device and size");
    if (m.dt != v.dt || (m.dt != DT_F32 && m.dt != DT_BF16))
        die("adamw: the moments are %s and %s (both fp32 or both bf16)", dtype_name(m.dt), dtype_name(v.dt));
    if (g.dt != DT_F32 && g.dt != DT_BF16) die("adamw: the gradient is %s (fp32 or bf16)", dtype_name(g.dt));
    DISPATCH_CALL(p.dev, adamw, (p, g, m, v, w, gscale, lr, b1, b2, eps, wd, t));
}

// The ops' scratch, carved by the one function each that the launcher runs too (ops.h).
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

DeltaScratch op_delta_rule_scratch(Arena *a, Arena *kept, Tensor q, Tensor v, const DeltaArgs *da, bool backward) {
    int64_t T = q.n[0], nk = q.n[1], dk = q.n[2], nv = v.n[1], dv = v.n[2], BH = da->B * nv;
    int64_t L = da->chunk ? da->chunk : DELTA_MAX_CHUNK, NC = (T / da->B + L - 1) / L, NL = NC * L;
    Arena *k = da->keep ? kept : a; // the pieces the forward leaves for the backward
    DeltaScratch s = {0};
    s.qh = arena_tensor(k, DT_F32, 3, T, nk, dk, 0), s.kh = arena_tensor(k, DT_F32, 3, T, nk, dk, 0);
    s.rq = arena_tensor(k, DT_F32, 2, T, nk, 0, 0), s.rk = arena_tensor(k, DT_F32, 2, T, nk, 0, 0);
    s.cs = arena_tensor(k, DT_F64, 2, BH, NL, 0, 0);
    s.U = arena_tensor(k, DT_F32, 3, BH, NL, dv, 0), s.W = arena_tensor(k, DT_F32, 3, BH, NL, dk, 0);
    s.M = arena_tensor(k, DT_F32, 4, BH, NC, L, L);
    if (!backward && !da->keep) return s;
    s.Tm = arena_tensor(k, DT_F32, 4, BH, NC, L, L);
    s.S0 = arena_tensor(k, DT_F32, 4, BH, NC, dk, dv), s.dS1 = arena_tensor(k, DT_F32, 4, BH, NC, dk, dv);
    s.Vp = arena_tensor(k, DT_F32, 3, BH, NL, dv, 0), s.dW = arena_tensor(k, DT_F32, 3, BH, NL, dk, 0);
    if (!backward) return s;
    s.dVp = arena_tensor(a, DT_F32, 3, BH, NL, dv, 0), s.dBv = arena_tensor(a, DT_F32, 3, BH, NL, dv, 0);
    s.dBk = arena_tensor(a, DT_F32, 3, BH, NL, dk, 0);
    s.gq = arena_tensor(a, DT_F32, 3, T, nv, dk, 0), s.gk = arena_tensor(a, DT_F32, 3, T, nv, dk, 0);
    return s;
}
// The elements a call carves from ws and from kept (op_delta_rule_scratch's two arenas, counted).
static size_t delta_count(Tensor q, Tensor v, const DeltaArgs *a, bool backward, bool of_kept) {
    if (q.dev != DEV_CUDA) return 0;
    Arena c = arena_counting("delta_rule scratch", q.dev), k = arena_counting("delta_rule kept state", q.dev);
    op_delta_rule_scratch(&c, &k, q, v, a, backward);
    return (of_kept ? k.used : c.used) / sizeof(float);
}
size_t op_delta_rule_workspace(Tensor q, Tensor v, const DeltaArgs *a, bool backward) {
    return delta_count(q, v, a, backward, false);
}
size_t op_delta_rule_kept(Tensor q, Tensor v, const DeltaArgs *a) {
    DeltaArgs k = *a;
    k.keep = true;
    return delta_count(q, v, &k, true, true);
}
