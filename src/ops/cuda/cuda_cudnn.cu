// cuda_cudnn.cu — causal grouped-query attention, optionally in a sliding window, through cuDNN's fused
// flash-attention engines (cuDNN 9 graph API, backend descriptors), one head dim or MLA's q·k 192 / v 128. pith
// runs its own kernels unless a library kernel is faster for a variant (docs/architecture.md, "GPU kernels"); for
// bf16 with head dims that are multiples of 8 up to 128 on Hopper, cuDNN's is (bench/cuda_ops.md, round 3).
// cuDNN's engines recognise scaled dot-product attention as a graph of matmul, pointwise and reduction
// operations; these are the graphs:
//   forward   S = Q·Kᵀ (fp32), S·scale, causal select (row ≥ col, else the lowest float), with a window W
//             a second select (col + W > row, else the lowest float: the query and the W − 1 keys before it),
//             m = max S, E = exp(S − m), z = Σ E, lse = m + ln z (the stats output), P = E / z (bf16),
//             O = P·V
//   backward  D = Σ_d dO∘O (fp32, in the workspace); S as above; P = exp(S − lse); dV = Σ_group Pᵀ·dO;
//             dP = dO·Vᵀ; dS = P∘(dP − D)·scale; dK = Σ_group dSᵀ·Q; dQ = dS·K (an fp32 accumulator in
//             the workspace, then rounded)
// The group sums run over the nh/nkv query heads that read one kv head (query head h reads kv head
// h / (nh/nkv)), as in our kernels. Tensors are 4-D (batch, head, position, dim) views of pith's (B·S,
// heads, d) rows: strides (S·heads·d, d, heads·d, 1); a transposed operand (Kᵀ, Vᵀ) swaps the last two.
// Sinks (GPT-OSS) are not in the graphs: the caller corrects o and lse after the forward (cuda_attention.cu),
// and the backward graph, given that o and lse, computes the gradients with the sinks as they are.
// A plan is built once per shape and kept (the first call can take a second: cuDNN compiles its kernel).
// A shape cuDNN builds no plan for keeps to our kernels (one line on stderr). cuDNN's backward adds into
// dQ with atomics (not bitwise reproducible run to run); AttnArgs.deterministic (config `deterministic`, checked
// by cuda_attention.cu before it calls here) and the A/B switch PITH_ATTENTION=own select our deterministic kernels.
#include "ops/cuda/cuda_common.cuh"

#ifdef PITH_CUDNN
#include <cudnn.h>

typedef cudnnBackendDescriptor_t Desc;

// ---- graph building: every descriptor is kept while its plan is (the plan references them) ----
typedef struct {
    Desc all[160]; // the windowed backward graph and both heuristic modes' configurations take ~116
    int n_all;
    Desc ops[40]; // the windowed backward graph has 30
    int n_ops;
    int64_t next_uid; // uids of virtual tensors
    Desc scalars[16]; // by-value scalars made so far, by uid (one descriptor per uid)
    cudnnStatus_t st; // the first failure, CUDNN_STATUS_SUCCESS while none
    int line;         // where it happened
} Graph;

static cudnnHandle_t dnn;
static bool dnn_off; // cuDNN could not start: our kernels from now on

#define DN(g, call)                                                                                                    \
    do {                                                                                                               \
        if ((g)->st == CUDNN_STATUS_SUCCESS) {                                                                         \
            cudnnStatus_t s_ = (call);                                                                                 \
            if (s_ != CUDNN_STATUS_SUCCESS) (g)->st = s_, (g)->line = __LINE__;                                        \
        }                                                                                                              \
    } while (0)

static Desc make(Graph *g, cudnnBackendDescriptorType_t type) {
    Desc d = NULL;
    if (g->n_all == (int)(sizeof g->all / sizeof g->all[0])) die("cudnn attention: too many descriptors");
    DN(g, cudnnBackendCreateDescriptor(type, &d));
    g->all[g->n_all++] = d;
    return d;
}
static void set(Graph *g, Desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
                const void *v) {
    DN(g, cudnnBackendSetAttribute(d, name, type, n, v));
}
static void set_desc(Graph *g, Desc d, cudnnBackendAttributeName_t name, Desc v) {
    set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}
static void finish(Graph *g, Desc d) { DN(g, cudnnBackendFinalize(d)); }

// A 4-D tensor; uid 0 makes a virtual one (an intermediate that never reaches memory). by_value: a scalar the
// variant pack passes in host memory instead.
static Desc tensor_of(Graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4],
                      bool by_value) {
    Desc t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool virt = uid == 0;
    if (virt) uid = g->next_uid++;
    int64_t align = 16;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (by_value) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    else set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    finish(g, t);
    return t;
}
static Desc tensor(Graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4]) {
    return tensor_of(g, uid, dt, dim, str, false);
}
// The scalars by value (fp32, one descriptor per uid): the scale, the masked value, 1, the window.
static Desc scalar(Graph *g, int64_t uid) {
    static const int64_t one[4] = {1, 1, 1, 1};
    if (!g->scalars[uid]) g->scalars[uid] = tensor_of(g, uid, CUDNN_DATA_FLOAT, one, one, true);
    return g->scalars[uid];
}

static void add_op(Graph *g, Desc op) {
    finish(g, op);
    if (g->n_ops == (int)(sizeof g->ops / sizeof g->ops[0])) die("cudnn attention: too many operations");
    g->ops[g->n_ops++] = op;
}
// y = mode(x [, b [, t]]) elementwise with broadcasting; axis only for GEN_INDEX.
static void pointwise(Graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, Desc x, Desc b, Desc t, Desc y,
                      int64_t axis) {
    Desc pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finish(g, pw);
    Desc op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    add_op(g, op);
}
static void pw2(Graph *g, cudnnPointwiseMode_t mode, Desc x, Desc b, Desc y) {
    pointwise(g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, 0);
}
// c = a·b over the last two dims (batch dims broadcast: 1 or a divisor of the other's), fp32 accumulate.
static void matmul(Graph *g, Desc a, Desc b, Desc c) {
    Desc mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finish(g, mm);
    Desc op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    add_op(g, op);
}
// y = reduce(x) over the dims where y is smaller (to 1, or to groups of heads).
static void reduce(Graph *g, cudnnReduceTensorOp_t how, Desc x, Desc y) {
    Desc rd = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finish(g, rd);
    Desc op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    add_op(g, op);
}
// y = x seen with other dims/strides (a transpose of the last two dims here).
static void reshape(Graph *g, Desc x, Desc y) {
    Desc op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add_op(g, op);
}

// ---- the two graphs ----
enum { U_Q = 1, U_K, U_V, U_O, U_LSE, U_DO, U_DQ, U_DK, U_DV, U_SCALE, U_LOWEST, U_ONE, U_D, U_DQACC, U_WINDOW };

typedef struct {
    int64_t B, S, nh, nkv, d, dv, window;
} Shape; // d: q·k head dim, dv: v head dim; window 0: none

// A view of pith's rows (B·S, heads, d) as (B, heads, S, d), or transposed (t) as (B, heads, d, S).
static Desc rows(Graph *g, const Shape *s, int64_t uid, cudnnDataType_t dt, int64_t heads, int64_t d, bool t) {
    int64_t dim[4] = {s->B, heads, t ? d : s->S, t ? s->S : d},
            str[4] = {s->S * heads * d, d, t ? 1 : heads * d, t ? heads * d : 1};
    return tensor(g, uid, dt, dim, str);
}
// Packed (B, heads, rows, cols).
static void packed(int64_t B, int64_t heads, int64_t rows, int64_t cols, int64_t dim[4], int64_t str[4]) {
    int64_t d4[4] = {B, heads, rows, cols}, s4[4] = {heads * rows * cols, rows * cols, cols, 1};
    memcpy(dim, d4, sizeof d4), memcpy(str, s4, sizeof s4);
}

// S·scale with the causal mask (and the window's) applied: the score tensors of both graphs.
static Desc masked_scores(Graph *g, const Shape *s, Desc q, Desc kt) {
    int64_t sd[4], ss[4];
    packed(s->B, s->nh, s->S, s->S, sd, ss);
    Desc sc = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss);
    matmul(g, q, kt, sc);
    Desc scaled = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss);
    pw2(g, CUDNN_POINTWISE_MUL, sc, scalar(g, U_SCALE), scaled);
    Desc row = tensor(g, 0, CUDNN_DATA_INT32, sd, ss), col = tensor(g, 0, CUDNN_DATA_INT32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scaled, NULL, NULL, row, 2);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scaled, NULL, NULL, col, 3);
    Desc keep = tensor(g, 0, CUDNN_DATA_BOOLEAN, sd, ss);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, 0);
    Desc masked = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scaled, scalar(g, U_LOWEST), keep, masked, 0);
    if (!s->window) return masked;
    // the window: keep col + W > row, with int32 indices of the masked scores and W a float (the left-bound form
    // cuDNN's fused engines recognise; the sum is exact below 2^24)
    Desc wrow = tensor(g, 0, CUDNN_DATA_INT32, sd, ss), wcol = tensor(g, 0, CUDNN_DATA_INT32, sd, ss),
         colw = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss), inwin = tensor(g, 0, CUDNN_DATA_BOOLEAN, sd, ss),
         windowed = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, masked, NULL, NULL, wrow, 2);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, masked, NULL, NULL, wcol, 3);
    pw2(g, CUDNN_POINTWISE_ADD, wcol, scalar(g, U_WINDOW), colw);
    pointwise(g, CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN, colw, wrow, NULL, inwin, 0);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, masked, scalar(g, U_LOWEST), inwin, windowed, 0);
    return windowed;
}

static void build_forward(Graph *g, const Shape *s) {
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16;
    int64_t sd[4], ss[4], rd[4], rs[4];
    Desc q = rows(g, s, U_Q, bf, s->nh, s->d, false), o = rows(g, s, U_O, bf, s->nh, s->dv, false);
    Desc kt = rows(g, s, U_K, bf, s->nkv, s->d, true), v = rows(g, s, U_V, bf, s->nkv, s->dv, false);
    Desc sc = masked_scores(g, s, q, kt);
    packed(s->B, s->nh, s->S, s->S, sd, ss);
    packed(s->B, s->nh, s->S, 1, rd, rs);
    Desc m = tensor(g, 0, CUDNN_DATA_FLOAT, rd, rs), z = tensor(g, 0, CUDNN_DATA_FLOAT, rd, rs),
         lz = tensor(g, 0, CUDNN_DATA_FLOAT, rd, rs);
    Desc lse = tensor(g, U_LSE, CUDNN_DATA_FLOAT, rd, rs);
    Desc sub = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss), e = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss),
         p = tensor(g, 0, CUDNN_DATA_BFLOAT16, sd, ss);
    reduce(g, CUDNN_REDUCE_TENSOR_MAX, sc, m);
    pw2(g, CUDNN_POINTWISE_SUB, sc, m, sub);
    pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, e, 0);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    pointwise(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, z, NULL, NULL, lz, 0);
    pw2(g, CUDNN_POINTWISE_ADD, m, lz, lse);
    pw2(g, CUDNN_POINTWISE_DIV, e, z, p);
    matmul(g, p, v, o);
}

// Group sum over the query heads of each kv head: full (B, nh, ...) product reduced into out (B, nkv, ...);
// with nh == nkv the product is written straight to out.
// d: the head dim of the product (dv for dV, the q·k dim for dK).
static void product_into(Graph *g, const Shape *s, Desc a, Desc b, Desc out, int64_t d) {
    if (s->nh == s->nkv) {
        matmul(g, a, b, out);
        return;
    }
    int64_t dim[4], str[4];
    packed(s->B, s->nh, s->S, d, dim, str);
    Desc full = tensor(g, 0, CUDNN_DATA_BFLOAT16, dim, str);
    matmul(g, a, b, full);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

static void build_backward(Graph *g, const Shape *s) {
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16;
    int64_t sd[4], ss[4], rd[4], rs[4], td[4], ts[4];
    Desc q = rows(g, s, U_Q, bf, s->nh, s->d, false), dq = rows(g, s, U_DQ, bf, s->nh, s->d, false);
    Desc o = rows(g, s, U_O, bf, s->nh, s->dv, false), dout = rows(g, s, U_DO, bf, s->nh, s->dv, false);
    Desc dodo = rows(g, s, 0, CUDNN_DATA_FLOAT, s->nh, s->dv, false);
    packed(s->B, s->nh, s->S, s->d, td, ts);
    Desc dqacc = tensor(g, U_DQACC, CUDNN_DATA_FLOAT, td, ts);
    Desc kt = rows(g, s, U_K, bf, s->nkv, s->d, true), vt = rows(g, s, U_V, bf, s->nkv, s->dv, true);
    Desc k = rows(g, s, 0, bf, s->nkv, s->d, false), dk = rows(g, s, U_DK, bf, s->nkv, s->d, false);
    Desc dv = rows(g, s, U_DV, bf, s->nkv, s->dv, false);
    packed(s->B, s->nh, s->S, 1, rd, rs);
    Desc lse = tensor(g, U_LSE, CUDNN_DATA_FLOAT, rd, rs), D = tensor(g, U_D, CUDNN_DATA_FLOAT, rd, rs);
    Desc dsum = tensor(g, 0, CUDNN_DATA_FLOAT, rd, rs);
    packed(s->B, s->nh, s->S, s->S, sd, ss);
    // (Bᵀ view of an (S, S) score tensor: keys as rows)
    int64_t tdim[4] = {s->B, s->nh, s->S, s->S}, tstr[4] = {s->nh * s->S * s->S, s->S * s->S, 1, s->S};
    // D = Σ_d dO∘O
    pw2(g, CUDNN_POINTWISE_MUL, dout, o, dodo);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, dodo, dsum);
    pw2(g, CUDNN_POINTWISE_MUL, dsum, scalar(g, U_ONE), D);
    // P = exp(S·scale (masked) − lse); dV = Σ_group Pᵀ·dO
    Desc sc = masked_scores(g, s, q, kt);
    Desc sub = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss), p = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss);
    pw2(g, CUDNN_POINTWISE_SUB, sc, lse, sub);
    pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, p, 0);
    Desc pt = tensor(g, 0, CUDNN_DATA_BFLOAT16, tdim, tstr);
    reshape(g, p, pt);
    product_into(g, s, pt, dout, dv, s->dv);
    // dS = P∘(dO·Vᵀ − D)·scale
    Desc dp = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss), dp1 = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss),
         dp2 = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss);
    Desc ds = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss), dss = tensor(g, 0, CUDNN_DATA_FLOAT, sd, ss);
    matmul(g, dout, vt, dp);
    pw2(g, CUDNN_POINTWISE_MUL, dp, scalar(g, U_ONE), dp1);
    pw2(g, CUDNN_POINTWISE_SUB, dp1, D, dp2);
    pw2(g, CUDNN_POINTWISE_MUL, dp2, p, ds);
    pw2(g, CUDNN_POINTWISE_MUL, ds, scalar(g, U_SCALE), dss);
    // dK = Σ_group dSᵀ·Q; dQ = dS·K through the fp32 accumulator
    Desc dst = tensor(g, 0, CUDNN_DATA_BFLOAT16, tdim, tstr);
    reshape(g, dss, dst);
    product_into(g, s, dst, q, dk, s->d);
    reshape(g, kt, k);
    matmul(g, dss, k, dqacc);
    pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dqacc, NULL, NULL, dq, 0);
}

// The operation graph, the engine configurations cuDNN's heuristics propose, and the first that builds.
static Desc build_plan(Graph *g, int64_t *ws) {
    Desc og = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
    set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn);
    finish(g, og);
    cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && g->st == CUDNN_STATUS_SUCCESS; mi++) {
        Desc heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        set_desc(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og);
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi]);
        finish(g, heur);
        enum { MAXCFG = 8 };
        Desc cfg[MAXCFG];
        for (int i = 0; i < MAXCFG; i++) cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        int64_t n = 0;
        DN(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, MAXCFG, &n,
                                       cfg));
        for (int64_t i = 0; i < n && g->st == CUDNN_STATUS_SUCCESS; i++) {
            Graph t = {}; // a configuration that fails is skipped, not the graph's failure
            Desc plan = NULL;
            int64_t cnt = 0;
            DN(&t, cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
            set(&t, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn);
            set_desc(&t, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg[i]);
            finish(&t, plan);
            DN(&t,
               cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, ws));
            if (t.st == CUDNN_STATUS_SUCCESS) {
                if (g->n_all < (int)(sizeof g->all / sizeof g->all[0])) g->all[g->n_all++] = plan;
                return plan;
            }
            if (plan) cudnnBackendDestroyDescriptor(plan);
        }
    }
    if (g->st == CUDNN_STATUS_SUCCESS) g->st = CUDNN_STATUS_NOT_SUPPORTED, g->line = __LINE__;
    return NULL;
}

// ---- plan cache: the last PLANS_MAX shapes, the oldest replaced first ----
typedef struct {
    Shape s;
    bool backward;
    Graph *g; // its descriptors (the plan is the last)
    Desc plan;
    int64_t ws; // the plan's own workspace bytes
} Plan;
#define PLANS_MAX 32
static Plan plans[PLANS_MAX];
static int n_plans, next_victim;

static void graph_free(Graph *g) {
    for (int i = g->n_all - 1; i >= 0; i--)
        if (g->all[i]) cudnnBackendDestroyDescriptor(g->all[i]);
    free(g);
}

// A new cache entry: the next free one, or the oldest (its last use may still be queued on the stream).
static Plan *plan_slot(void) {
    if (n_plans < PLANS_MAX) return &plans[n_plans++];
    Plan *p = &plans[next_victim];
    next_victim = (next_victim + 1) % PLANS_MAX;
    cuda_graph_stale("a cuDNN attention plan was evicted");
    cuda_host_wait(cuda_stream());
    if (p->g) graph_free(p->g);
    return p;
}

// The plan for this shape and direction, built on first use; NULL when cuDNN builds none for it (remembered,
// so that shape keeps to our kernels; the LSE of either path serves the other's backward).
static Plan *get_plan(const Shape *s, bool backward) {
    for (int i = 0; i < n_plans; i++)
        if (!memcmp(&plans[i].s, s, sizeof *s) && plans[i].backward == backward)
            return plans[i].plan ? &plans[i] : NULL;
    if (!dnn) {
        cudnnStatus_t st = cudnnCreate(&dnn);
        if (st != CUDNN_STATUS_SUCCESS) {
            fprintf(stderr, "pith: note: cuDNN unavailable (%s); attention uses pith's kernels\n",
                    cudnnGetErrorString(st));
            dnn_off = true;
            return NULL;
        }
    }
    Graph *g = (Graph *)calloc(1, sizeof(Graph));
    if (!g) die("out of memory");
    g->next_uid = 1000;
    if (backward) build_backward(g, s);
    else build_forward(g, s);
    int64_t ws = 0;
    Desc plan = g->st == CUDNN_STATUS_SUCCESS ? build_plan(g, &ws) : NULL;
    if (!plan) {
        fprintf(stderr,
                "pith: note: cuDNN %zu builds no %s attention plan for B %lld S %lld heads %lld/%lld d %lld/%lld "
                "window %lld (%s at %s:%d); this shape uses pith's kernels\n",
                cudnnGetVersion(), backward ? "backward" : "forward", (long long)s->B, (long long)s->S,
                (long long)s->nh, (long long)s->nkv, (long long)s->d, (long long)s->dv, (long long)s->window,
                cudnnGetErrorString(g->st), __FILE__, g->line);
        graph_free(g);
        g = NULL;
    } else {
        static bool said;
        if (!said)
            fprintf(stderr,
                    "pith: note: attention runs cuDNN %zu's fused kernels (PITH_ATTENTION=own selects pith's)\n",
                    cudnnGetVersion());
        said = true;
    }
    Plan *p = plan_slot();
    p->s = *s, p->backward = backward, p->g = g, p->plan = plan, p->ws = ws;
    return plan ? p : NULL;
}

// The plan run on pith's stream with the variant pack of these uids and pointers (each call its own descriptor).
static void execute(Plan *p, int n, const int64_t *uids, void *const *ptrs, void *ws) {
    Graph g = {}; // only for its failure record
    Desc vp = NULL;
    DN(&g, cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    set(&g, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    set(&g, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    set(&g, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    finish(&g, vp);
    DN(&g, cudnnSetStream(dnn, cuda_stream()));
    DN(&g, cudnnBackendExecute(dnn, p->plan, vp));
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (g.st != CUDNN_STATUS_SUCCESS) die("cudnn attention: execution failed: %s", cudnnGetErrorString(g.st));
}

// The variant this path takes: bf16, one head dim that is a multiple of 8 up to 128 or 256 (Qwen3.5's gated
// attention; cuDNN's Hopper engines take d ≤ 256 forward and backward), or MLA's q·k 192 / v 128, 16-byte aligned
// rows (aligned: the caller's check); its plan for this shape and direction, or NULL.
static Plan *usable_plan(Tensor q, Tensor k, Tensor v, int B, int S, float scale, int window, bool aligned,
                         bool backward) {
    int64_t D = q.n[2], DV = v.n[2];
    bool dims = (D == DV && D % 8 == 0 && (D <= 128 || D == 256)) || (D == 192 && DV == 128);
    if (dnn_off || q.dt != DT_BF16 || !dims || !(scale > 0) || !aligned) return NULL;
    const char *e = getenv("PITH_ATTENTION");
    if (e && !strcmp(e, "own")) return NULL;
    Shape s = {B, S, q.n[1], k.n[1], D, DV, window};
    return get_plan(&s, backward);
}
static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

bool cudnn_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int S, float scale,
                             int window) {
    Plan *p = usable_plan(q, k, v, B, S, scale, window, aligned16(o.p, q.p, k.p, v.p), false);
    if (!p) return false;
    float lowest = -3.4028234663852886e38f, w = (float)window;
    int64_t uids[8] = {U_Q, U_K, U_V, U_O, U_LSE, U_SCALE, U_LOWEST, U_WINDOW};
    void *ptrs[8] = {q.p, k.p, v.p, o.p, lse.p, &scale, &lowest, &w};
    execute(p, window ? 8 : 7, uids, ptrs, p->ws ? cuda_scratch((size_t)p->ws) : NULL);
    return true;
}

bool cudnn_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o,
                              Tensor lse, int B, int S, float scale, int window, Tensor planned) {
    bool aligned = aligned16(dq.p, dk.p, dv.p, dout.p) && aligned16(q.p, k.p, v.p, o.p);
    Plan *p = usable_plan(q, k, v, B, S, scale, window, aligned, true);
    if (!p) return false;
    // workspace: the plan's own, then D and the dQ accumulator (op_attention_scratch) — those two in the caller's
    // planned scratch when it gives one
    Arena count = arena_counting("attention scratch", DEV_CUDA);
    op_attention_scratch(&count, q);
    size_t own = up256((size_t)p->ws);
    char *ws = (char *)cuda_scratch(own + (planned.p ? 0 : count.used));
    Arena arena = scratch_arena(planned, ws + own, count.used, "attention scratch");
    AttnScratch sc = op_attention_scratch(&arena, q);
    float *Dp = (float *)sc.D.p, *acc = (float *)sc.dq.p;
    if (cudnnGetVersion() < 90600)
        CUDA_CHECK(cudaMemsetAsync(acc, 0, tensor_bytes(sc.dq), cuda_stream())); // later versions zero it themselves
    float lowest = -3.4028234663852886e38f, one = 1.0f, w = (float)window;
    int64_t uids[15] = {U_Q,  U_K,     U_V,      U_O,   U_LSE, U_DO,    U_DQ,    U_DK,
                        U_DV, U_SCALE, U_LOWEST, U_ONE, U_D,   U_DQACC, U_WINDOW};
    void *ptrs[15] = {q.p, k.p, v.p, o.p, lse.p, dout.p, dq.p, dk.p, dv.p, &scale, &lowest, &one, Dp, acc, &w};
    execute(p, window ? 15 : 14, uids, ptrs, ws);
    return true;
}

#else // no cuDNN in this build: our kernels always

bool cudnn_attention_forward(Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int S, float scale,
                             int window) {
    return false;
}
bool cudnn_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o,
                              Tensor lse, int B, int S, float scale, int window, Tensor ws) {
    return false;
}

#endif
