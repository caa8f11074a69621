// cpu_delta.c — the Qwen3.5 ops on the CPU (docs/reference.md §19): the sigmoid output gate, the causal depthwise
// conv1d + SiLU, the DeltaNet gates and the gated delta rule (the recurrence and the chunked WY / UT-transform form),
// each with its backward. fp32 data; the delta rule runs in fp64 inside.
// Shapes: R rows, D features, T = B·S tokens, C conv channels of kernel K, nk/nv key/value heads of dk/dv.
#include "ops/cpu/cpu_ops.h"

static inline double softplus(double x) { return x > 20 ? x : log1p(exp(x)); } // torch's threshold 20

// ---- the output gate ----

void cpu_sigmoid_gate_forward(Tensor y, Tensor x, Tensor gate) {
    CPU_F32(x);
    CPU_F32(y);
    CPU_F32(gate);
    int64_t R = t_rows(x), D = t_cols(x), G = t_cols(gate); // G = D or 1
    CHECK(t_rows(gate) == R && (G == D || G == 1) && tensor_numel(y) == R * D);
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < D; j++)
            F(y)[i * D + j] = (float)(F(x)[i * D + j] * sigm(F(gate)[i * G + (G == 1 ? 0 : j)]));
}

void cpu_sigmoid_gate_backward(Tensor dx, Tensor dgate, Tensor dy, Tensor x, Tensor gate, bool accumulate) {
    int64_t R = t_rows(x), D = t_cols(x), G = t_cols(gate);
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++) {
        double acc = 0;
        for (int64_t j = 0; j < D; j++) {
            double s = sigm(F(gate)[i * G + (G == 1 ? 0 : j)]), d = F(dy)[i * D + j], gx = d * F(x)[i * D + j];
            F(dx)[i * D + j] = (float)(accumulate ? F(dx)[i * D + j] + d * s : d * s);
            if (G == 1) acc += gx * s * (1 - s);
            else F(dgate)[i * D + j] = (float)(gx * s * (1 - s));
        }
        if (G == 1) F(dgate)[i] = (float)acc;
    }
}

// ---- causal depthwise conv1d + SiLU ----

// The input of sequence b (of S rows) at position src ≥ −(K−1), channel c: x's row, or before the sequence's start the
// halo's row b·(K−1) + K−1 + src (0 without a halo).
static double conv_in(Tensor x, Tensor halo, int64_t b, int64_t src, int64_t c, int64_t S, int64_t K) {
    int64_t C = t_cols(x);
    if (src >= 0) return F(x)[(b * S + src) * C + c];
    return halo.p ? F(halo)[(b * (K - 1) + K - 1 + src) * C + c] : 0;
}

// Whether the tap reading i rows back counts for row t: always without document masking, else while i ≤ pos[t].
static inline bool tap_on(Tensor pos, int64_t t, int64_t i) { return !pos.p || i <= ((const int32_t *)pos.p)[t]; }

// Pre-activation of row t and channel c.
static double conv_pre(Tensor x, Tensor w, Tensor halo, Tensor pos, int64_t t, int64_t c, int64_t S) {
    int64_t K = t_cols(w), p = t % S;
    double s = 0;
    for (int64_t j = 0; j < K; j++)
        if (tap_on(pos, t, K - 1 - j)) s += (double)F(w)[c * K + j] * conv_in(x, halo, t / S, p - K + 1 + j, c, S, K);
    return s;
}

static void conv_check(Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split) {
    CPU_F32(x);
    CPU_F32(w);
    CHECK(t_rows(x) % B == 0 && t_rows(w) == t_cols(x) && split >= 0 && 2 * split <= t_cols(x));
    if (pos.p) CHECK(pos.dev == DEV_CPU && pos.dt == DT_I32 && tensor_numel(pos) == t_rows(x));
    if (!halo.p) return;
    CPU_F32(halo);
    CHECK(t_rows(halo) == B * (t_cols(w) - 1) && t_cols(halo) == t_cols(x));
}

// Where element (t, c) of the conv's y (or dy) of T × C lies: row-major, or in split's three column blocks (ops_list.h).
static int64_t conv_y_at(int64_t T, int64_t C, int64_t split, int64_t t, int64_t c) {
    if (!split) return t * C + c;
    int64_t c0 = c < split ? 0 : c < 2 * split ? split : 2 * split, w = c0 < 2 * split ? split : C - 2 * split;
    return T * c0 + t * w + (c - c0);
}

void cpu_conv1d_silu_forward(Tensor y, Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split) {
    CPU_F32(y);
    conv_check(x, w, halo, pos, B, split);
    int64_t T = t_rows(x), C = t_cols(x), S = T / B;
    CHECK(tensor_numel(y) == T * C);
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) {
            double u = conv_pre(x, w, halo, pos, t, c, S);
            F(y)[conv_y_at(T, C, split, t, c)] = (float)(u * sigm(u));
        }
}

// dpre = dy·silu'(pre); dx[t', c] = Σ_j w[c, j]·dpre[t' + K − 1 − j, c]; dw[c, j] += Σ_t dpre[t, c]·x[t − K + 1 + j, c]
// (the halo's rows where t − K + 1 + j falls before the sequence); dhalo the same sum as dx for the halo's rows. Each
// term only where its tap counts for the output row (tap_on).
void cpu_conv1d_silu_backward(Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo,
                              Tensor pos, int B, int64_t split) {
    conv_check(x, w, halo, pos, B, split);
    int64_t T = t_rows(x), C = t_cols(x), S = T / B, K = t_cols(w);
    float *dpre = xmalloc(T * C * sizeof(float));
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++)
            dpre[t * C + c] =
                (float)(F(dy)[conv_y_at(T, C, split, t, c)] * silu_grad(conv_pre(x, w, halo, pos, t, c, S)));
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++) {
        int64_t p = t % S;
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t j = 0; j < K; j++)
                if (p + K - 1 - j < S && tap_on(pos, t + K - 1 - j, K - 1 - j))
                    s += (double)F(w)[c * K + j] * dpre[(t + K - 1 - j) * C + c];
            F(dx)[t * C + c] = (float)s;
        }
    }
    if (dhalo.p) { // halo row i of sequence b is at position i − (K − 1): output position i − j reads it through tap j
        CHECK(halo.p && tensor_numel(dhalo) == tensor_numel(halo));
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < K - 1; i++)
                for (int64_t c = 0; c < C; c++) {
                    double s = 0;
                    for (int64_t j = 0; j <= i; j++)
                        if (i - j < S && tap_on(pos, b * S + i - j, K - 1 - j))
                            s += (double)F(w)[c * K + j] * dpre[(b * S + i - j) * C + c];
                    F(dhalo)[(b * (K - 1) + i) * C + c] = (float)s;
                }
    }
#pragma omp parallel for
    for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < K; j++) {
            double s = 0;
            for (int64_t t = 0; t < T; t++)
                if (tap_on(pos, t, K - 1 - j))
                    s += (double)dpre[t * C + c] * conv_in(x, halo, t / S, t % S - K + 1 + j, c, S, K);
            F(dw)[c * K + j] += (float)s;
        }
    free(dpre);
}

// ---- DeltaNet gates ----

void cpu_delta_gates_forward(Tensor g, Tensor beta, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias) {
    CPU_F32(a);
    CPU_F32(b);
    CPU_F32(g);
    CPU_F32(beta);
    int64_t T = t_rows(a), nv = t_cols(a);
    CHECK(tensor_numel(A_log) == nv && tensor_numel(dt_bias) == nv && tensor_numel(g) == T * nv);
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nv; h++) {
            int64_t i = t * nv + h;
            F(g)[i] = (float)(-exp((double)F(A_log)[h]) * softplus((double)F(a)[i] + F(dt_bias)[h]));
            F(beta)[i] = (float)sigm(F(b)[i]);
        }
}

// ∂g/∂A_log = g; ∂g/∂a = ∂g/∂dt_bias = −exp(A_log)·σ(a + dt_bias); ∂beta/∂b = beta·(1 − beta).
void cpu_delta_gates_backward(Tensor da, Tensor db, Tensor dA_log, Tensor ddt_bias, Tensor dg, Tensor dbeta, Tensor a,
                              Tensor b, Tensor A_log, Tensor dt_bias) {
    int64_t T = t_rows(a), nv = t_cols(a);
#pragma omp parallel for
    for (int64_t h = 0; h < nv; h++) {
        double sA = 0, sdt = 0, eA = exp((double)F(A_log)[h]);
        for (int64_t t = 0; t < T; t++) {
            int64_t i = t * nv + h;
            double x = (double)F(a)[i] + F(dt_bias)[h], d = F(dg)[i], s = sigm(F(b)[i]);
            double ga = -eA * sigm(x) * d;
            sA += d * (-eA * softplus(x));
            sdt += ga;
            F(da)[i] = (float)ga;
            F(db)[i] = (float)(F(dbeta)[i] * s * (1 - s));
        }
        F(dA_log)[h] += (float)sA;
        F(ddt_bias)[h] += (float)sdt;
    }
}

// ---- the gated delta rule ----
// Per (sequence, value head) in fp64: qh, kh: (S, dk) the normalised, scaled queries and keys, v: (S, dv), g, beta:
// (S). The state St: (dk, dv) row-major.

typedef struct {
    int64_t S, dk, dv, nk, nv, G; // G = nv/nk value heads per key head
} DeltaDims;

static DeltaDims delta_dims(Tensor q, Tensor v, int B) {
    DeltaDims d = {.S = q.n[0] / B, .dk = q.n[2], .dv = v.n[2], .nk = q.n[1], .nv = v.n[1]};
    CHECK(q.n[0] % B == 0 && v.n[0] == q.n[0] && d.nv % d.nk == 0);
    d.G = d.nv / d.nk;
    return d;
}

// Row t of head h of x: (T, heads, d) into dst (d), divided by sqrt(Σ x² + 1e-6) when l2, times scale; *r gets the
// divisor's inverse (1 without l2).
static void load_head(double *dst, double *r, Tensor x, int64_t t, int64_t h, double scale, bool l2) {
    int64_t heads = x.n[1], d = x.n[2];
    const float *p = F(x) + (t * heads + h) * d;
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += (double)p[i] * p[i];
    *r = l2 ? 1.0 / sqrt(ss + 1e-6) : 1.0;
    for (int64_t i = 0; i < d; i++) dst[i] = p[i] * *r * scale;
}

// One step of the recurrence: St ← e^g St + k (β (v − e^g Stᵀ k))ᵀ; o = Stᵀ q; at a document's first token (reset)
// St is zeroed first. delta: (dv) scratch.
static void delta_step(double *St, double *o, const double *q, const double *k, const double *v, double g, double beta,
                       bool reset, double *delta, int64_t dk, int64_t dv) {
    if (reset) memset(St, 0, (size_t)(dk * dv) * sizeof(double));
    double e = exp(g);
    for (int64_t j = 0; j < dv; j++) {
        double m = 0;
        for (int64_t i = 0; i < dk; i++) m += St[i * dv + j] * k[i];
        delta[j] = beta * (v[j] - e * m);
    }
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) St[i * dv + j] = e * St[i * dv + j] + k[i] * delta[j];
    for (int64_t j = 0; j < dv; j++) {
        double s = 0;
        for (int64_t i = 0; i < dk; i++) s += St[i * dv + j] * q[i];
        o[j] = s;
    }
}

// The chunked form on one chunk of L positions (flash-linear-attention's WY / UT transform, as transformers'
// torch_chunk_gated_delta_rule writes it): with c_i = Σ_{j≤i} g_j inside the chunk,
//   A_ij = β_i (k_i·k_j) e^{c_i − c_j} (j < i), U = (I + A)⁻¹ (β v), W = (I + A)⁻¹ (β e^{c} k),
//   v' = U − W St, o_i = e^{c_i} q_iᵀ St + Σ_{j≤i} (q_i·k_j) e^{c_i − c_j} v'_j,
//   St ← e^{c_L} St + Σ_j e^{c_L − c_j} k_j v'_jᵀ.
// Document masking (ps, the rows' positions in their documents, or NULL): row i's document starts at row
// sg_i = max(i − ps_i, −1) of the chunk (−1: before it). A pair (i, j) counts only for j ≥ sg_i (no reset between
// them), the entering state only for rows with sg_i = −1 (e^{c_i} → 0 in W and o) and in St's update only without a
// reset in the chunk (e^{c_L} → 0), and St's sum runs over j ≥ sg_{L−1}: each factor is the decay or 0, so the
// same formulas hold, with no −∞ in c (docs/architecture.md, "Gated DeltaNet").
// q, k: (L, dk), v: (L, dv), o: (L, dv); ws: L² + L·(dv + dk + 2) doubles.
static void delta_chunk(double *St, double *o, const double *q, const double *k, const double *v, const double *g,
                        const double *beta, const int32_t *ps, int64_t L, int64_t dk, int64_t dv, double *ws) {
    double *A = ws, *U = A + L * L, *W = U + L * dv, *c = W + L * dk, *sg = c + L;
    for (int64_t i = 0; i < L; i++) c[i] = g[i] + (i ? c[i - 1] : 0);
    for (int64_t i = 0; i < L; i++) sg[i] = ps && i - ps[i] > -1 ? (double)(i - ps[i]) : -1.0;
#define PAIR(i, j) ((double)(j) >= sg[i] ? exp(c[i] - c[j]) : 0.0) // e^{c_i − c_j} within a document, else 0
#define ENTER(i) (sg[i] < 0 ? exp(c[i]) : 0.0)                     // e^{c_i} while the entering state reaches row i
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < i; j++) {
            double s = 0;
            for (int64_t x = 0; x < dk; x++) s += k[i * dk + x] * k[j * dk + x];
            A[i * L + j] = beta[i] * s * PAIR(i, j);
        }
    // Forward substitution: row i of U (W) = its right-hand side − Σ_{j<i} A_ij · row j.
    for (int64_t i = 0; i < L; i++) {
        for (int64_t y = 0; y < dv; y++) U[i * dv + y] = beta[i] * v[i * dv + y];
        for (int64_t x = 0; x < dk; x++) W[i * dk + x] = beta[i] * ENTER(i) * k[i * dk + x];
        for (int64_t j = 0; j < i; j++) {
            for (int64_t y = 0; y < dv; y++) U[i * dv + y] -= A[i * L + j] * U[j * dv + y];
            for (int64_t x = 0; x < dk; x++) W[i * dk + x] -= A[i * L + j] * W[j * dk + x];
        }
    }
    for (int64_t i = 0; i < L; i++) // v' = U − W·St (in U), o = e^c q·St
        for (int64_t y = 0; y < dv; y++) {
            double s = 0, u = 0;
            for (int64_t x = 0; x < dk; x++) s += W[i * dk + x] * St[x * dv + y], u += q[i * dk + x] * St[x * dv + y];
            U[i * dv + y] -= s, o[i * dv + y] = ENTER(i) * u;
        }
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j <= i; j++) {
            double s = 0;
            for (int64_t x = 0; x < dk; x++) s += q[i * dk + x] * k[j * dk + x];
            s *= PAIR(i, j);
            for (int64_t y = 0; y < dv; y++) o[i * dv + y] += s * U[j * dv + y];
        }
    for (int64_t x = 0; x < dk; x++)
        for (int64_t y = 0; y < dv; y++) {
            double s = ENTER(L - 1) * St[x * dv + y];
            for (int64_t j = 0; j < L; j++) s += PAIR(L - 1, j) * k[j * dk + x] * U[j * dv + y];
            St[x * dv + y] = s;
        }
#undef PAIR
#undef ENTER
}

// Inputs of one (sequence b, value head h) as fp64 arrays: q, k (S, dk) normalised and scaled, v (S, dv), g, beta (S),
// and the norms' inverses rq, rk (S).
typedef struct {
    double *q, *k, *v, *g, *beta, *rq, *rk;
} DeltaSeq;

static void delta_seq_load(DeltaSeq *s, const DeltaDims *d, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta,
                           int64_t b, int64_t h, const DeltaArgs *a) {
    for (int64_t p = 0; p < d->S; p++) {
        int64_t t = b * d->S + p;
        load_head(s->q + p * d->dk, s->rq + p, q, t, h / d->G, a->scale, a->qk_l2norm);
        load_head(s->k + p * d->dk, s->rk + p, k, t, h / d->G, 1.0, a->qk_l2norm);
        for (int64_t y = 0; y < d->dv; y++) s->v[p * d->dv + y] = F(v)[(t * d->nv + h) * d->dv + y];
        s->g[p] = F(g)[t * d->nv + h], s->beta[p] = F(beta)[t * d->nv + h];
    }
}

static double *delta_seq_alloc(DeltaSeq *s, const DeltaDims *d) {
    int64_t S = d->S;
    double *m = xmalloc((size_t)(S * (2 * d->dk + d->dv + 4)) * sizeof(double));
    s->q = m, s->k = s->q + S * d->dk, s->v = s->k + S * d->dk, s->g = s->v + S * d->dv;
    s->beta = s->g + S, s->rq = s->beta + S, s->rk = s->rq + S;
    return m;
}

// The state of (sequence b, value head h) between fp32 x: (B, nv, dk, dv) and fp64 St: (dk, dv); a missing x reads as 0
// and takes no write.
static void state_load(double *St, Tensor x, int64_t bh, int64_t dkv) {
    for (int64_t i = 0; i < dkv; i++) St[i] = x.p ? F(x)[bh * dkv + i] : 0.0;
}
static void state_store(Tensor x, const double *St, int64_t bh, int64_t dkv) {
    if (x.p)
        for (int64_t i = 0; i < dkv; i++) F(x)[bh * dkv + i] = (float)St[i];
}

// s0, sT, dsT, ds0 each absent or (B, nv, dk, dv) fp32 on the CPU.
// pos, when given: (B·S) int32 on the CPU that counts up by one inside a document (or restarts at 0), what the
// chunked form relies on.
static void check_states(const DeltaArgs *a, const DeltaDims *d) {
    const Tensor *st[4] = {&a->s0, &a->sT, &a->dsT, &a->ds0};
    for (int i = 0; i < 4; i++)
        if (st[i]->p) {
            CPU_F32(*st[i]);
            CHECK(tensor_numel(*st[i]) == a->B * d->nv * d->dk * d->dv);
        }
    if (!a->pos.p) return;
    CHECK(a->pos.dev == DEV_CPU && a->pos.dt == DT_I32 && tensor_numel(a->pos) == a->B * d->S);
    const int32_t *ps = a->pos.p;
    for (int64_t t = 0; t < a->B * d->S; t++)
        if (ps[t] < 0 || (t % d->S && ps[t] && ps[t] != ps[t - 1] + 1))
            die("delta_rule: pos[%lld] = %d does not follow pos[%lld] = %d inside a document", (long long)t, ps[t],
                (long long)t - 1, t ? ps[t - 1] : 0);
}

// The positions of sequence b in its documents (NULL without document masking), and whether row p starts one.
static const int32_t *seq_pos(const DeltaArgs *a, int64_t b, int64_t S) {
    return a->pos.p ? (const int32_t *)a->pos.p + b * S : NULL;
}
static inline bool doc_start(const int32_t *ps, int64_t p) { return ps && ps[p] == 0; }

void cpu_delta_rule_forward(Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    CPU_F32(q);
    CPU_F32(k);
    CPU_F32(v);
    CPU_F32(o);
    CPU_F32(g);
    CPU_F32(beta);
    DeltaDims d = delta_dims(q, v, a->B);
    CHECK(tensor_numel(k) == tensor_numel(q) && tensor_numel(o) == tensor_numel(v) && a->chunk >= 0);
    check_states(a, &d);
    int64_t C = a->chunk ? a->chunk : 1;
#pragma omp parallel for
    for (int64_t bh = 0; bh < a->B * d.nv; bh++) {
        int64_t b = bh / d.nv, h = bh % d.nv;
        DeltaSeq s;
        double *mem = delta_seq_alloc(&s, &d);
        delta_seq_load(&s, &d, q, k, v, g, beta, b, h, a);
        double *St = xcalloc((size_t)(d.dk * d.dv + d.S * d.dv + C * C + C * (d.dv + d.dk + 2)), sizeof(double));
        const int32_t *ps = seq_pos(a, b, d.S);
        double *out = St + d.dk * d.dv, *ws = out + d.S * d.dv;
        state_load(St, a->s0, bh, d.dk * d.dv);
        for (int64_t p0 = 0; p0 < d.S; p0 += C) {
            int64_t L = d.S - p0 < C ? d.S - p0 : C;
            if (a->chunk)
                delta_chunk(St, out + p0 * d.dv, s.q + p0 * d.dk, s.k + p0 * d.dk, s.v + p0 * d.dv, s.g + p0,
                            s.beta + p0, ps ? ps + p0 : NULL, L, d.dk, d.dv, ws);
            else
                delta_step(St, out + p0 * d.dv, s.q + p0 * d.dk, s.k + p0 * d.dk, s.v + p0 * d.dv, s.g[p0], s.beta[p0],
                           doc_start(ps, p0), ws, d.dk, d.dv);
        }
        for (int64_t p = 0; p < d.S; p++)
            for (int64_t y = 0; y < d.dv; y++) F(o)[((b * d.S + p) * d.nv + h) * d.dv + y] = (float)out[p * d.dv + y];
        state_store(a->sT, St, bh, d.dk * d.dv);
        free(St), free(mem);
    }
}

// Reverse-mode through the recurrence, from dS_S = dsT (or 0) down to ds0 = dS_0. The states at the start of every
// block of 64 steps are kept from a forward sweep; each block's states are recomputed, then its steps run backwards
// with dSt = ∂/∂S_t:
//   P = e^g S_{t−1}, δ = β (v − Pᵀk), S_t = P + k δᵀ, o = S_tᵀ q
//   dSt += q doᵀ, dq = S_t do; dδ = dStᵀ k, dk = dSt δ; dv = β dδ, dβ = dδ·(v − Pᵀk); e = −β dδ: dk += P e,
//   dP = dSt + k eᵀ; dg = ⟨P, dP⟩; dS_{t−1} = e^g dP.
// At a document's first token S_{t−1} reads as 0 (P = 0, so dg = 0) and dS_{t−1} = 0: nothing flows across it.
// Key heads collect the gradients of the G value heads they serve, so one task takes a (sequence, key head).
void cpu_delta_rule_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DeltaDims d = delta_dims(q, v, a->B);
    check_states(a, &d);
    const int64_t BL = 64, dkv = d.dk * d.dv;
#pragma omp parallel for
    for (int64_t bk = 0; bk < a->B * d.nk; bk++) {
        int64_t b = bk / d.nk, hk = bk % d.nk, S = d.S;
        const int32_t *ps = seq_pos(a, b, S);
        DeltaSeq s;
        double *mem = delta_seq_alloc(&s, &d);
        int64_t nblk = (S + BL - 1) / BL;
        double *ckpt = xmalloc((size_t)(nblk * dkv) * sizeof(double)), *Sb = xmalloc((size_t)((BL + 1) * dkv) * 8),
               *dSt = xmalloc((size_t)dkv * 8), *P = xmalloc((size_t)dkv * 8), *tmp = xmalloc((size_t)(2 * d.dv) * 8);
        double *gq = xcalloc((size_t)(S * d.dk), 8), *gk = xcalloc((size_t)(S * d.dk), 8); // ∂/∂ normalised q, k
        double *dlt = tmp, *e = tmp + d.dv;
        for (int64_t h = hk * d.G; h < (hk + 1) * d.G; h++) {
            delta_seq_load(&s, &d, q, k, v, g, beta, b, h, a);
            state_load(ckpt, a->s0, b * d.nv + h, dkv); // S_0
            for (int64_t blk = 0; blk + 1 < nblk; blk++) {
                memcpy(ckpt + (blk + 1) * dkv, ckpt + blk * dkv, (size_t)dkv * 8);
                for (int64_t p = blk * BL; p < (blk + 1) * BL; p++)
                    delta_step(ckpt + (blk + 1) * dkv, e, s.q + p * d.dk, s.k + p * d.dk, s.v + p * d.dv, s.g[p],
                               s.beta[p], doc_start(ps, p), dlt, d.dk, d.dv);
            }
            state_load(dSt, a->dsT, b * d.nv + h, dkv); // ∂/∂S_S
            for (int64_t blk = nblk - 1; blk >= 0; blk--) {
                int64_t p0 = blk * BL, L = S - p0 < BL ? S - p0 : BL;
                memcpy(Sb, ckpt + blk * dkv, (size_t)dkv * 8); // Sb[i] = S at position p0 + i − 1
                for (int64_t i = 0; i < L; i++) {
                    memcpy(Sb + (i + 1) * dkv, Sb + i * dkv, (size_t)dkv * 8);
                    int64_t p = p0 + i;
                    delta_step(Sb + (i + 1) * dkv, e, s.q + p * d.dk, s.k + p * d.dk, s.v + p * d.dv, s.g[p], s.beta[p],
                               doc_start(ps, p), dlt, d.dk, d.dv);
                }
                for (int64_t i = L - 1; i >= 0; i--) {
                    int64_t p = p0 + i, t = b * S + p;
                    const double *kp = s.k + p * d.dk, *qp = s.q + p * d.dk, *vp = s.v + p * d.dv,
                                 *Sn = Sb + (i + 1) * dkv;
                    const float *dop = F(dout) + (t * d.nv + h) * d.dv;
                    double eg = doc_start(ps, p) ? 0.0 : exp(s.g[p]), bt = s.beta[p], dgs = 0, dbs = 0;
                    for (int64_t x = 0; x < dkv; x++) P[x] = eg * Sb[i * dkv + x];
                    for (int64_t y = 0; y < d.dv; y++) { // δ and the predicted value Pᵀk (in e for now)
                        double m = 0;
                        for (int64_t x = 0; x < d.dk; x++) m += P[x * d.dv + y] * kp[x];
                        e[y] = m, dlt[y] = bt * (vp[y] - m);
                    }
                    for (int64_t x = 0; x < d.dk; x++) { // dq = S_t do; dSt += q doᵀ
                        double sq = 0;
                        for (int64_t y = 0; y < d.dv; y++) sq += Sn[x * d.dv + y] * dop[y];
                        gq[p * d.dk + x] += sq;
                        for (int64_t y = 0; y < d.dv; y++) dSt[x * d.dv + y] += qp[x] * dop[y];
                    }
                    for (int64_t y = 0; y < d.dv; y++) {
                        double s2 = 0;
                        for (int64_t x = 0; x < d.dk; x++) s2 += dSt[x * d.dv + y] * kp[x];
                        F(dv)[(t * d.nv + h) * d.dv + y] = (float)(bt * s2);
                        dbs += s2 * (vp[y] - e[y]);
                        e[y] = -bt * s2;
                    }
                    for (int64_t x = 0; x < d.dk; x++) {
                        double s3 = 0;
                        for (int64_t y = 0; y < d.dv; y++) s3 += dSt[x * d.dv + y] * dlt[y] + P[x * d.dv + y] * e[y];
                        gk[p * d.dk + x] += s3;
                        for (int64_t y = 0; y < d.dv; y++) {
                            double dp = dSt[x * d.dv + y] + kp[x] * e[y];
                            dgs += P[x * d.dv + y] * dp;
                            dSt[x * d.dv + y] = eg * dp;
                        }
                    }
                    F(dg)[t * d.nv + h] = (float)dgs;
                    F(dbeta)[t * d.nv + h] = (float)dbs;
                }
            }
            state_store(a->ds0, dSt, b * d.nv + h, dkv);
        }
        // Through the normalisation and scale: x̂ = c·r·x, r = (Σx² + ε)^-½: ∂x = c·(r·∂x̂ − x·r³·(x·∂x̂)).
        for (int64_t p = 0; p < S; p++) {
            int64_t t = b * S + p;
            for (int w = 0; w < 2; w++) {
                Tensor src = w ? k : q, dst = w ? dk : dq;
                const double *gx = (w ? gk : gq) + p * d.dk;
                double c = w ? 1.0 : a->scale;
                const float *xp = F(src) + (t * d.nk + hk) * d.dk;
                float *out = F(dst) + (t * d.nk + hk) * d.dk;
                double ss = 0, dot = 0;
                for (int64_t x = 0; x < d.dk; x++) ss += (double)xp[x] * xp[x], dot += xp[x] * gx[x];
                double r = a->qk_l2norm ? 1.0 / sqrt(ss + 1e-6) : 1.0;
                for (int64_t x = 0; x < d.dk; x++)
                    out[x] = (float)(c * (a->qk_l2norm ? r * gx[x] - xp[x] * r * r * r * dot : gx[x]));
            }
        }
        free(ckpt), free(Sb), free(dSt), free(P), free(tmp), free(gq), free(gk), free(mem);
    }
}
