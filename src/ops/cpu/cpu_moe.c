// cpu_moe.c — router, load-balancing loss, token permutation and combine on the CPU.
// Router (ops.h): probs = softmax(logits) over E in fp32 (or sigmoid(logits) elementwise); the top-k of score = probs + bias (ties → lower
// expert), group-limited when asked; w = c·probs of the chosen experts (c = scale, divided by their sum Σp when
// renorm) or c·softmax of the chosen logits (softmax_topk).
// Backward through w_j = c·p_j/Σp: ∂p_j = (c·∂w_j − Σ_l ∂w_l·w_l) / Σp (without renorm: c·∂w_j); then through the
// softmax: ∂logit_e = p_e·(∂p_e − Σ_f p_f·∂p_f) (sigmoid: p_e·(1 − p_e)·∂p_e), ∂p_e also carrying lb_grad[e]. softmax_topk: w_j = c·u_j,
// u = softmax(logits[idx]), so ∂logit_{idx_j} = w_j·(∂w_j − Σ_l w_l·∂w_l / c), added to the lb path's softmax term.
#include "ops/cpu/cpu_ops.h"

// The top-k experts of one token by score (best first, ties → lower index); with groups, only experts of the
// topk_group groups whose best score is highest compete. score: (E); ix: (k).
static void router_select(int32_t *ix, const float *score, int64_t E, const RouterArgs *a) {
    int G = a->n_group > 1 ? a->n_group : 1, per = (int)(E / G);
    bool keep[1024]; // groups kept
    CHECK(G <= 1024);
    for (int g = 0; g < G; g++) keep[g] = G == 1;
    for (int r = 0; r < (G > 1 ? a->topk_group : 0); r++) { // greedy over groups by their best score
        int best = -1;
        float bs = 0;
        for (int g = 0; g < G; g++) {
            if (keep[g]) continue;
            float m = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) m = fmaxf(m, score[e]);
            if (best < 0 || m > bs) best = g, bs = m;
        }
        keep[best] = true;
    }
    for (int j = 0; j < a->k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            bool taken = !keep[e / per];
            for (int l = 0; l < j; l++) taken |= ix[l] == e;
            if (!taken && (best < 0 || score[e] > score[best])) best = e;
        }
        ix[j] = best;
    }
}

static void router_check(Tensor logits, Tensor idx, const RouterArgs *a) {
    int64_t E = t_cols(logits);
    CHECK(a->k >= 1 && a->k <= E && t_cols(idx) == a->k && a->scale > 0);
    CHECK(!a->bias.p || (a->bias.dt == DT_F32 && tensor_numel(a->bias) == E));
    CHECK(!(a->sigmoid && a->softmax_topk));
    if (a->n_group > 1)
        CHECK(E % a->n_group == 0 && a->topk_group >= 1 && a->topk_group <= a->n_group &&
              a->k <= a->topk_group * (E / a->n_group));
}

void cpu_router_forward(Tensor probs, Tensor idx, Tensor w, Tensor logits, const RouterArgs *a) {
    CPU_F32(logits);
    int64_t T = t_rows(logits), E = t_cols(logits);
    int k = a->k;
    router_check(logits, idx, a);
#pragma omp parallel
    {
        float *score = xmalloc(E * sizeof(float));
#pragma omp for
        for (int64_t t = 0; t < T; t++) {
            const float *l = F(logits) + t * E;
            float *p = F(probs) + t * E, m = -INFINITY;
            if (a->sigmoid) {
                for (int64_t e = 0; e < E; e++) p[e] = (float)(1 / (1 + exp(-(double)l[e])));
            } else {
                for (int64_t e = 0; e < E; e++) m = fmaxf(m, l[e]);
                double sum = 0;
                for (int64_t e = 0; e < E; e++) sum += exp((double)l[e] - m);
                for (int64_t e = 0; e < E; e++) p[e] = (float)(exp((double)l[e] - m) / sum);
            }
            int32_t *ix = I32(idx) + t * k;
            if (a->given) {
                for (int j = 0; j < k; j++) ix[j] = a->given[t * k + j];
            } else if (a->force_balance) {
                for (int j = 0; j < k; j++) ix[j] = (int32_t)((t + j * (E / k)) % E);
            } else {
                for (int64_t e = 0; e < E; e++) score[e] = a->bias.p ? p[e] + F(a->bias)[e] : p[e];
                router_select(ix, a->bias.p ? score : p, E, a);
            }
            float *wt = F(w) + t * k;
            if (a->softmax_topk) { // over the selected logits; ix[0] is the largest unless forced
                float mk = -INFINITY;
                for (int j = 0; j < k; j++) mk = fmaxf(mk, l[ix[j]]);
                double sk = 0;
                for (int j = 0; j < k; j++) sk += exp((double)l[ix[j]] - mk);
                for (int j = 0; j < k; j++) wt[j] = (float)(exp((double)l[ix[j]] - mk) / sk) * a->scale;
                continue;
            }
            double s = 0;
            for (int j = 0; j < k; j++) s += p[ix[j]];
            for (int j = 0; j < k; j++) wt[j] = (a->renorm ? (float)(p[ix[j]] / s) : p[ix[j]]) * a->scale;
        }
        free(score);
    }
}

void cpu_router_backward(Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                         const RouterArgs *a) {
    int64_t T = t_rows(probs), E = t_cols(probs), k = t_cols(idx);
    double c = a->scale;
#pragma omp parallel
    {
        double *dp = xmalloc(E * sizeof(double));
#pragma omp for
        for (int64_t t = 0; t < T; t++) {
            const float *p = F(probs) + t * E, *wt = F(w) + t * k, *g = F(dw) + t * k;
            const int32_t *ix = I32(idx) + t * k;
            for (int64_t e = 0; e < E; e++) dp[e] = lb_grad.p ? F(lb_grad)[e] : 0.0;
            double s = 0, gw = 0;
            for (int j = 0; j < k; j++) s += p[ix[j]], gw += (double)g[j] * wt[j];
            if (!a->softmax_topk)
                for (int j = 0; j < k; j++) dp[ix[j]] += a->renorm ? (c * g[j] - gw) / s : c * g[j];
            double dot = 0;
            for (int64_t e = 0; e < E && !a->sigmoid; e++) dot += p[e] * dp[e];
            float *dl = F(dlogits) + t * E;
            for (int64_t e = 0; e < E; e++)
                dl[e] = (float)(a->sigmoid ? p[e] * (1.0 - p[e]) * dp[e] : p[e] * (dp[e] - dot));
            if (a->softmax_topk)
                for (int j = 0; j < k; j++) dl[ix[j]] += (float)(wt[j] * (g[j] - gw / c));
        }
        free(dp);
    }
}

void cpu_moe_count(Tensor cnt, Tensor idx) {
    int64_t n = tensor_numel(idx), E = tensor_numel(cnt);
    for (int64_t i = 0; i < n; i++) {
        int32_t e = I32(idx)[i];
        if (e < 0 || e >= E) die("moe_count: expert index %d out of range [0, %lld) (a router bug)", e, (long long)E);
        ((double *)cnt.p)[e] += 1;
    }
}

void cpu_moe_lb_loss(Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float grad_scale) {
    int64_t T = t_rows(probs), E = t_cols(probs), k = t_cols(idx);
    double *cnt = xcalloc(E, sizeof(double)), *pm = xcalloc(E, sizeof(double));
    cpu_moe_count(tensor_make(cnt, DT_F64, DEV_CPU, 1, E, 1, 1, 1), idx);
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) pm[e] += F(probs)[t * E + e];
    double loss = 0;
    for (int64_t e = 0; e < E; e++) {
        double f = T ? cnt[e] / (double)(T * k) : 0;
        loss += coef * E * f * (T ? pm[e] / T : 0);
        F(lb_grad)[e] = T ? (float)(grad_scale * coef * E * f / T) : 0;
    }
    ((double *)loss_sum.p)[0] += loss;
    free(cnt), free(pm);
}

void cpu_moe_sort(Tensor perm, Tensor at, Tensor offs_t, Tensor idx, int E) {
    int64_t n = tensor_numel(idx), *offs = (int64_t *)cpu_offs(offs_t, E);
    for (int e = 0; e <= E; e++) offs[e] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (I32(idx)[i] < 0 || I32(idx)[i] >= E)
            die("moe_sort: expert index %d out of range [0, %d) (a router bug)", I32(idx)[i], E);
        offs[I32(idx)[i] + 1]++;
    }
    for (int e = 0; e < E; e++) offs[e + 1] += offs[e];
    int64_t *fill = xmalloc((E + 1) * sizeof(int64_t));
    memcpy(fill, offs, (E + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        int64_t p = fill[I32(idx)[i]]++;
        I32(perm)[p] = (int32_t)i;
        if (at.p) I32(at)[i] = (int32_t)p;
    }
    free(fill);
}

void cpu_gather_rows(Tensor y, Tensor x, Tensor rows, int div) {
    int64_t R = t_rows(y), H = t_cols(y);
    CHECK(t_cols(x) == H && tensor_numel(rows) == R);
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++) memcpy(F(y) + i * H, F(x) + (int64_t)(I32(rows)[i] / div) * H, H * sizeof(float));
}

void cpu_scatter_add_rows(Tensor dx, Tensor dy, Tensor rows, int div) {
    int64_t R = t_rows(dy), H = t_cols(dy);
    for (int64_t i = 0; i < R; i++) { // serial: several rows may land on one token
        float *d = F(dx) + (int64_t)(I32(rows)[i] / div) * H;
        for (int64_t c = 0; c < H; c++) d[c] += F(dy)[i * H + c];
    }
}

void cpu_scatter_rows(Tensor y, Tensor x, Tensor rows) {
    int64_t R = t_rows(x), H = t_cols(x);
#pragma omp parallel for
    for (int64_t i = 0; i < R; i++) memcpy(F(y) + (int64_t)I32(rows)[i] * H, F(x) + i * H, H * sizeof(float));
}

// Row of y holding slot s (ops_list.h, moe_combine_*).
static int64_t slot_row(Tensor at, int64_t s) { return at.p ? I32(at)[s] : s; }

void cpu_moe_combine_forward(Tensor out, Tensor resid, Tensor y, Tensor w, Tensor at) {
    int64_t T = t_rows(out), H = t_cols(out), k = t_cols(w);
    CHECK(t_rows(y) == T * k && (!at.p || tensor_numel(at) == T * k));
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < H; c++) {
            float s = F(resid)[t * H + c];
            for (int64_t j = 0; j < k; j++) s += F(w)[t * k + j] * F(y)[slot_row(at, t * k + j) * H + c];
            F(out)[t * H + c] = s;
        }
}

void cpu_moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w, Tensor at) {
    int64_t T = t_rows(dout), H = t_cols(dout), k = t_cols(w);
    CHECK(!at.p || tensor_numel(at) == T * k);
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t r = slot_row(at, t * k + j);
            const float *g = F(dout) + t * H, *yj = F(y) + r * H;
            float *dyj = F(dy) + r * H, wj = F(w)[t * k + j];
            double s = 0;
            for (int64_t c = 0; c < H; c++) dyj[c] = wj * g[c], s += (double)g[c] * yj[c];
            F(dw)[t * k + j] = (float)s;
        }
}
