// model.c — what all model families share: the parameter table, initialisation, HF config loading and
// the family lookup (the one table from HF model_type to family).
#include "model/model.h"

#include <math.h>

static const ModelFamily *const families[] = {&qwen3_moe_family, &deepseek_v2_family, &gpt_oss_family,
                                              &qwen3_5_moe_family};

const ModelFamily *model_family_find(const char *model_type) {
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        if (!strcmp(families[i]->model_type, model_type)) return families[i];
    return NULL;
}

const ModelFamily *model_config_load(ModelConfig *c, const char *path) {
    char file[4096];
    path_in_folder(file, sizeof file, path, "config.json");
    json_t *root = json_load_or_die(file);
    JObj o = jobj_root(root, file);
    memset(c, 0, sizeof *c);
    c->ep_size = 1, c->pp_size = 1, c->cp_size = 1, c->pad[GROUP_DENSE] = c->pad[GROUP_EXPERT] = 1;
    // A multimodal config.json (Qwen3.5's) holds the text model's config in text_config: pith trains that.
    JObj text = jobj_child(o, "text_config");
    if (text.obj) o = text;
    const char *mt = jstr(o, "model_type", true, NULL);
    const ModelFamily *fam = model_family_find(mt);
    if (!fam)
        jdie(o, "model_type",
             "unsupported model type '%s' (supported: qwen3_moe, deepseek_v2, gpt_oss, qwen3_5_moe_text)", mt);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    fam->config_parse(c, o);
    // Every family's MLPs are SwiGLU: another activation must not silently train as SiLU.
    const char *act = jstr(o, "hidden_act", false, "silu");
    if (strcmp(act, "silu")) jdie(o, "hidden_act", "'%s' is not supported (pith's MLPs are SwiGLU: silu)", act);
    // DeepSeek-V3's name for the router's score function; every family reads it through model_router_forward.
    const char *score = jstr(o, "scoring_func", false, "softmax");
    if (strcmp(score, "softmax") && strcmp(score, "sigmoid"))
        jdie(o, "scoring_func", "must be softmax or sigmoid (got '%s')", score);
    c->router_sigmoid = !strcmp(score, "sigmoid");
    json_decref(root);
    return fam;
}

void params_add(ParamTable *t, const char *name, int group, int init, int nd, int64_t n0, int64_t n1, int64_t n2) {
    if (t->n == t->cap) t->p = xrealloc(t->p, (t->cap = t->cap ? 2 * t->cap : 256) * sizeof *t->p);
    ParamInfo *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    CHECK(strlen(name) < sizeof p->name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->group = group, p->init = init, p->nd = nd;
    p->shape[0] = n0, p->shape[1] = n1, p->shape[2] = n2, p->shape[3] = 1;
    for (int i = nd; i < 4; i++) p->shape[i] = 1;
    p->off = t->numel[group];
    t->numel[group] += params_numel(p);
}

int64_t params_numel(const ParamInfo *p) {
    int64_t n = 1;
    for (int i = 0; i < p->nd; i++) n *= p->shape[i];
    return n;
}

// Lookups mostly come in table order (binding a layer's views, once at setup and, under parallel.gradient_reduce
// "layer", per unit every micro-batch): the scan starts after the last hit and wraps around.
const ParamInfo *params_find(const ParamTable *t, const char *name) {
    static _Thread_local int last;
    for (int k = 0, i = last < t->n ? last : 0; k < t->n; k++, i = i + 1 < t->n ? i + 1 : 0)
        if (!strcmp(t->p[i].name, name)) return last = i, &t->p[i];
    return NULL;
}

void params_init(const ParamTable *t, int group, float *flat, uint64_t seed, double init_std, int layers) {
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *p = &t->p[i];
        if (p->group != group) continue;
        float *x = flat + p->off;
        int64_t n = params_numel(p);
        uint64_t stream = rng_hash_str(p->name);
        double std = p->init == INIT_NORMAL_OUT ? init_std / sqrt(2.0 * layers) : init_std;
#pragma omp parallel for
        for (int64_t j = 0; j < n; j++)
            x[j] = p->init == INIT_ONES    ? 1.0f
                   : p->init == INIT_ZEROS ? 0.0f
                   : p->init == INIT_LOG_UNIFORM
                       ? (float)log(0.01 + 15.99 * (double)(rng_u64(seed, stream, (uint64_t)j) >> 11) * 0x1p-53)
                       : (float)(std * rng_normal(seed, stream, (uint64_t)j));
    }
}

Tensor model_tensor(Device dev, DType dt, int64_t n, bool alloc) {
    Tensor t = tensor_make(NULL, dt, dev, 1, n, 1, 1, 1);
    if (!alloc) return t;
    Arena a = arena_create("parameters", dev, tensor_bytes(t)); // one block, owned by the model
    t.p = a.base;
    return t;
}

void model_tensor_free(Tensor t) {
    Arena a = {t.p, 0, tensor_bytes(t), 0, t.dev, ""};
    if (a.cap && t.p) arena_destroy(&a);
}

// Keeps the tensors pipeline rank cfg->pp_rank holds (names "layers.<l>.…" by model_holds_layer, the
// others — embedding, final norm, LM head — on rank 0), at new offsets.
static void params_keep_pipeline_rank(ParamTable *t, const ModelConfig *c) {
    ParamTable all = *t;
    memset(t, 0, sizeof *t);
    for (int i = 0; i < all.n; i++) {
        const ParamInfo *p = &all.p[i];
        int l;
        bool held = sscanf(p->name, "layers.%d.", &l) == 1 ? model_holds_layer(c, l) : c->pp_rank == 0;
        if (held) params_add(t, p->name, p->group, p->init, p->nd, p->shape[0], p->shape[1], p->shape[2]);
    }
    free(all.p);
}

// The flat buffers, rope tables and loss accumulators; with alloc false only their shapes (NULL data), with grads
// false no gradient accumulators (shapes only).
static void model_build(Model *m, const ModelFamily *fam, const ModelConfig *cfg, Device dev, DType cdt, int max_seq,
                        bool alloc, bool grads) {
    memset(m, 0, sizeof *m);
    m->fam = fam, m->cfg = *cfg, m->dev = dev, m->cdt = cdt;
    CHECK(cfg->ep_size >= 1 && cfg->experts % cfg->ep_size == 0 && cfg->ep_rank >= 0 && cfg->ep_rank < cfg->ep_size);
    CHECK(cfg->pp_size == 1 ||
          (cfg->layers % (2 * cfg->pp_size) == 0 && cfg->pp_rank >= 0 && cfg->pp_rank < cfg->pp_size));
    model_params_build(fam, &m->params, cfg);
    if (cfg->pp_size > 1) params_keep_pipeline_rank(&m->params, cfg);
    for (int g = 0; g < NGROUPS; g++) {
        int64_t pad = cfg->pad[g] > 1 ? cfg->pad[g] : 1, n = (m->params.numel[g] + pad - 1) / pad * pad;
        m->w[g] = model_tensor(dev, cfg->w_f32[g] ? DT_F32 : cdt, n, alloc);
        bool whole = grads && !(g == GROUP_DENSE && cfg->grad_units); // else per unit, in windows the trainer holds
        m->g[g] = model_tensor(dev, cfg->grad_dt[g], n, alloc && whole);
        if (alloc && n > m->params.numel[g]) { // the padding stays zero
            op_zero(m->w[g]);
            if (whole) op_zero(m->g[g]);
        }
    }
    int half = cfg->rope.rd / 2;
    m->rope_cos = tensor_reshape2(model_tensor(dev, DT_F32, (int64_t)max_seq * half, alloc), max_seq, half);
    m->rope_sin = tensor_reshape2(model_tensor(dev, DT_F32, (int64_t)max_seq * half, alloc), max_seq, half);
    if (alloc) {
        float *c = xmalloc((size_t)max_seq * half * sizeof(float)),
              *s = xmalloc((size_t)max_seq * half * sizeof(float));
        Tensor hc = tf32_2(c, max_seq, half), hs = tf32_2(s, max_seq, half);
        op_rope_tables(hc, hs, &cfg->rope);
        op_copy(m->rope_cos, hc), op_copy(m->rope_sin, hs);
        free(c), free(s);
    }
    moe_bind(m);
}

void model_create(Model *m, const ModelFamily *fam, const ModelConfig *cfg, Device dev, DType cdt, int max_seq) {
    model_build(m, fam, cfg, dev, cdt, max_seq, true, true);
}

void model_create_forward(Model *m, const ModelFamily *fam, const ModelConfig *cfg, Device dev, DType cdt,
                          int max_seq) {
    model_build(m, fam, cfg, dev, cdt, max_seq, true, false);
}

void model_describe(Model *m, const ModelFamily *fam, const ModelConfig *cfg, Device dev, DType cdt, int max_seq) {
    model_build(m, fam, cfg, dev, cdt, max_seq, false, true);
}

void model_params_all(const Model *m, ParamTable *t) {
    ModelConfig c = m->cfg;
    c.ep_rank = 0, c.ep_size = 1, c.pp_rank = 0, c.pp_size = 1;
    memset(t, 0, sizeof *t);
    model_params_build(m->fam, t, &c);
}

void model_lb_setup(Model *m, LbForm form, const Comm *replicas, int T) {
    LoadBalance *b = &m->lb;
    int E = m->cfg.experts, k = m->cfg.topk, L = m->cfg.layers;
    b->form = form, b->global = form == LB_GLOBAL_BATCH, b->group = replicas, b->T = T, b->E = E, b->k = k,
    b->layers = L;
    if (!b->global && !m->ring) return;
    // The host copies of probs and idx; under context parallelism the per-group sums (up to T sequences) too.
    int64_t groups = m->ring ? T : 1;
    b->probs = xmalloc(((size_t)T * E + (size_t)groups * E) * sizeof(float)), b->grad = b->probs + (size_t)T * E;
    b->idx = xmalloc((size_t)T * k * sizeof(int32_t));
    if (m->ring) b->sums = xmalloc((size_t)groups * 2 * E * sizeof(double));
}

// mb's step's Σ load-balancing loss += loss (computed on the host).
static void lb_add(const MicroBatch *mb, double loss) {
    double sum = op_read_scalar(mb->sums->lb_sum) + loss;
    op_copy(mb->sums->lb_sum, tensor_make(&sum, DT_F64, DEV_CPU, 1, 1, 1, 1, 1));
}

// Row b of a (B, E) load-balancing gradient.
static Tensor lb_row(Tensor lb_grad, int b) { return tensor_reshape2(tensor_rows(lb_grad, b, 1), 1, lb_grad.n[1]); }

void model_router_forward(Model *m, const MicroBatch *mb, int l, Tensor probs, Tensor idx, Tensor w, Tensor logits,
                          RouterArgs ra) {
    int E = m->cfg.experts;
    if (m->router_bias.p)
        ra.bias = tensor_make((float *)m->router_bias.p + (size_t)l * E, DT_F32, m->router_bias.dev, 1, E, 1, 1, 1);
    if (m->cfg.router_sigmoid && ra.softmax_topk)
        die("scoring_func sigmoid: %s's router takes a softmax over the selected logits", m->cfg.model_type);
    ra.sigmoid = m->cfg.router_sigmoid;
    ra.given = m->route_given[l];
    op_router_forward(probs, idx, w, logits, &ra);
    if (!mb->sums || !mb->sums->router_load.p || mb->replay) return; // a replayed forward was counted the first time
    op_moe_count(tensor_rows(mb->sums->router_load, l, 1), idx);
}

void model_router_backward(Model *m, Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w,
                           const RouterArgs *family_ra, int B) {
    RouterArgs args = *family_ra, *ra = &args;
    args.sigmoid = m->cfg.router_sigmoid;
    if (!lb_grad.p || m->lb.form != LB_SEQUENCE) {
        op_router_backward(dlogits, dw, lb_grad.p ? lb_row(lb_grad, 0) : lb_grad, probs, idx, w, ra);
        return;
    }
    int64_t S = probs.n[0] / B; // the router backward is row-wise: each sequence with its own gradient
    for (int b = 0; b < B; b++)
        op_router_backward(tensor_rows(dlogits, b * S, S), tensor_rows(dw, b * S, S), lb_row(lb_grad, b),
                           tensor_rows(probs, b * S, S), tensor_rows(idx, b * S, S), tensor_rows(w, b * S, S), ra);
}

// Context parallelism, micro-batch and sequence forms: a micro-batch's sequences are spread over the cp ranks, so
// each group's (the micro-batch's, or each sequence's) expert counts and probability sums are sums over the cp
// group (one all-reduce of 2E per group). Every cp rank then writes the same gradient for its own tokens — the
// micro-batch's weight T is cp × this rank's rows (grad_scale) — and cp rank 0 alone adds the loss.
static void lb_loss_cp(Model *m, const MicroBatch *mb, Tensor lb_grad, Tensor probs, Tensor idx, float coef,
                       float grad_scale) {
    int B = mb->B;
    LoadBalance *b = &m->lb;
    const Comm *cp = m->ring->cp;
    int64_t T = probs.n[0], E = probs.n[1], k = idx.n[1], G = b->form == LB_SEQUENCE ? B : 1, S = T / G;
    CHECK(T <= b->T && E == b->E && k == b->k);
    op_copy(tf32_2(b->probs, T, E), probs);
    op_copy(tensor_make(b->idx, DT_I32, DEV_CPU, 2, T, k, 1, 1), idx);
    double *sum = b->sums, loss = 0, c = coef / (double)G, Tg = (double)S * cp->size; // Tg: a group's tokens
    memset(sum, 0, (size_t)G * 2 * E * sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        double *s = sum + t / S * 2 * E;
        for (int64_t j = 0; j < k; j++) s[b->idx[t * k + j]] += 1;
        for (int64_t e = 0; e < E; e++) s[E + e] += b->probs[t * E + e];
    }
    comm_allreduce(cp, tensor_make(sum, DT_F64, DEV_CPU, 1, G * 2 * E, 1, 1, 1), COMM_SUM);
    for (int64_t g = 0; g < G; g++)
        for (int64_t e = 0; e < E; e++) {
            double f = sum[g * 2 * E + e] / (Tg * k), P = sum[g * 2 * E + E + e] / Tg;
            loss += c * E * f * P;
            b->grad[g * E + e] = (float)((double)grad_scale * cp->size * c * E * f / Tg);
        }
    op_copy(tensor_rows(lb_grad, 0, G), tf32_2(b->grad, G, E));
    if (mb->replay || cp->rank) return; // a replayed forward (full recompute) was counted the first time
    lb_add(mb, loss);
}

void model_lb_loss(Model *m, const MicroBatch *mb, int l, Tensor lb_grad, Tensor probs, Tensor idx, float grad_scale) {
    float coef = (float)m->lb_coef;
    int B = mb->B;
    Tensor lb_sum = mb->sums->lb_sum;
    if (m->ring && m->lb.form != LB_GLOBAL_BATCH) {
        lb_loss_cp(m, mb, lb_grad, probs, idx, coef, grad_scale);
        return;
    }
    if (m->lb.form != LB_GLOBAL_BATCH) {
        // A replayed forward (full recompute) needs the gradient again, not the loss: its loss goes where nothing
        // reads it (on the device, so the replay waits for nothing).
        if (mb->replay) lb_sum = mb->sums->lb_replay;
        if (m->lb.form == LB_MICRO_BATCH) op_moe_lb_loss(lb_sum, lb_row(lb_grad, 0), probs, idx, coef, grad_scale);
        else { // sequence: the mean over the sequences of each one's micro-batch form
            int64_t S = probs.n[0] / B;
            for (int b = 0; b < B; b++)
                op_moe_lb_loss(lb_sum, lb_row(lb_grad, b), tensor_rows(probs, b * S, S), tensor_rows(idx, b * S, S),
                               coef / B, grad_scale);
        }
        return;
    }
    lb_grad = lb_row(lb_grad, 0);
    LoadBalance *b = &m->lb;
    int64_t T = probs.n[0], E = probs.n[1], k = idx.n[1];
    CHECK(T <= b->T && E == b->E && k == b->k && l < b->layers);
    op_copy(tf32_2(b->probs, T, E), probs);
    op_copy(tensor_make(b->idx, DT_I32, DEV_CPU, 2, T, k, 1, 1), idx);
    // This micro-batch's counts, then every replica's (this round: blocks acc·D .. acc·D + D − 1).
    // Under context parallelism this micro-batch is cp × T tokens: its counts and probability sums add over the
    // cp group, the gradient of each rank's own tokens is the same, and cp rank 0 alone adds the loss.
    const Comm *cp = m->ring ? m->ring->cp : NULL;
    int ncp = cp ? cp->size : 1;
    double *psum = cp ? b->sums + E : NULL; // (E) the micro-batch's probability sums
    int D = b->group->size, q = b->group->rank;
    // cnt: this round's counts of every replica for layer l (kept per layer, so a replayed forward — full
    // recompute — finds them: it takes the round back out of acc and tokens, exact since counts are integers).
    StepSums *st = mb->sums;
    double *cnt = st->lb_cnt + (size_t)l * D * E, *mine = cnt + (size_t)q * E, *acc = st->lb_counts + l * E, loss = 0;
    if (cp) { // this micro-batch's probability sums over the cp ranks
        for (int64_t e = 0; e < E; e++) psum[e] = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t e = 0; e < E; e++) psum[e] += b->probs[t * E + e];
        comm_allreduce(cp, tensor_make(psum, DT_F64, DEV_CPU, 1, E, 1, 1, 1), COMM_SUM);
    }
    if (!mb->replay) {
        for (int64_t e = 0; e < E; e++) mine[e] = 0;
        for (int64_t i = 0; i < T * k; i++) mine[b->idx[i]] += 1;
        if (cp) comm_allreduce(cp, tensor_make(mine, DT_F64, DEV_CPU, 1, E, 1, 1, 1), COMM_SUM);
        Tensor all = tensor_make(cnt, DT_F64, DEV_CPU, 1, (int64_t)D * E, 1, 1, 1);
        comm_allgather(b->group, all, tensor_make(mine, DT_F64, DEV_CPU, 1, E, 1, 1, 1));
    }
    int64_t Tm = T * ncp; // the micro-batch's tokens
    double round = (double)(Tm * k) * D, before = st->lb_tokens[l] - (mb->replay ? round : 0);
    double tokens = before + (double)(Tm * k) * (q + 1); // blocks before this one, and this one
    for (int64_t e = 0; e < E; e++) {
        double seen = acc[e], pm = 0;
        for (int r = 0; r < D && mb->replay; r++) seen -= cnt[(size_t)r * E + e];
        for (int r = 0; r <= q; r++) seen += cnt[(size_t)r * E + e];
        for (int r = 0; r < D && !mb->replay; r++) acc[e] += cnt[(size_t)r * E + e];
        double f = seen / tokens;
        if (cp) pm = psum[e];
        else
            for (int64_t t = 0; t < T; t++) pm += b->probs[t * E + e];
        loss += coef * E * f * (Tm ? pm / Tm : 0);
        b->grad[e] = T ? (float)(grad_scale * coef * E * f / T) : 0; // (grad_scale·cp)/(T·cp)
    }
    op_copy(lb_grad, tf32_1(b->grad, E));
    if (mb->replay) return;
    st->lb_tokens[l] += round;              // the running counts on every cp rank,
    if (!cp || !cp->rank) lb_add(mb, loss); // the loss once per micro-batch
}

void model_free(Model *m) {
    free(m->lb.probs), free(m->lb.idx), free(m->lb.sums);
    for (int g = 0; g < NGROUPS; g++) model_tensor_free(m->w[g]), model_tensor_free(m->g[g]);
    model_tensor_free(m->rope_cos), model_tensor_free(m->rope_sin);
    if (m->fp8.on) model_tensor_free(m->fp8.w);
    free(m->params.p), free(m->views), free(m->sw), free(m->sg);
    memset(m, 0, sizeof *m);
}

void step_sums_create(StepSums *s, const Model *m, bool alloc) {
    memset(s, 0, sizeof *s);
    s->loss_sum = model_tensor(m->dev, DT_F64, 1, alloc), s->lb_sum = model_tensor(m->dev, DT_F64, 1, alloc);
    s->lb_replay = model_tensor(m->dev, DT_F64, 1, alloc);
    if (m->router_bias.p && alloc)
        s->router_load = tensor_reshape2(model_tensor(m->dev, DT_F64, (int64_t)m->cfg.layers * m->cfg.experts, true),
                                         m->cfg.layers, m->cfg.experts);
    const LoadBalance *b = &m->lb;
    if (b->global && alloc) { // lb_cnt: per layer, so a replayed forward (full recompute) finds its round
        s->lb_counts =
            xcalloc((size_t)b->layers * b->E + b->layers + (size_t)b->layers * b->group->size * b->E, sizeof(double));
        s->lb_tokens = s->lb_counts + (size_t)b->layers * b->E, s->lb_cnt = s->lb_tokens + b->layers;
    }
    if (alloc) step_sums_begin(s, m);
}

void step_sums_begin(StepSums *s, const Model *m) {
    op_zero(s->loss_sum), op_zero(s->lb_sum), op_zero(s->lb_replay);
    if (s->router_load.p) op_zero(s->router_load);
    step_sums_lb_begin(s, m);
    memset(s->experts_written, 0, sizeof s->experts_written);
}

void step_sums_lb_begin(StepSums *s, const Model *m) {
    if (s->lb_counts) memset(s->lb_counts, 0, ((size_t)m->lb.layers * m->lb.E + m->lb.layers) * sizeof(double));
}

void step_sums_free(StepSums *s) {
    model_tensor_free(s->loss_sum), model_tensor_free(s->lb_sum), model_tensor_free(s->lb_replay);
    model_tensor_free(s->row_loss), model_tensor_free(s->router_load), free(s->lb_counts);
    memset(s, 0, sizeof *s);
}

void model_zero_dense(Model *m, Tensor g) {
    Tensor h = m->sg ? m->sg->lm_head : NONE;
    uintptr_t p = (uintptr_t)g.p, hp = (uintptr_t)h.p;
    int64_t n = tensor_numel(g), off = (int64_t)(hp - p) / (int64_t)sizeof(float), hn = tensor_numel(h);
    if (m->cfg.tie_embed || !hp || hp < p || off + hn > n || g.dt != DT_F32) {
        op_zero(g);
        return;
    }
    op_zero(tensor_rows(g, 0, off)), op_zero(tensor_rows(g, off + hn, n - off - hn));
    m->head_unwritten = true;
}

void model_zero_grads(Model *m) {
    if (!m->grads_zeroed) { // once whole: what no op of this rank writes (padding, views of other stages) stays zero
        for (int g = 0; g < NGROUPS; g++)
            if (m->g[g].p) op_zero(m->g[g]);
        m->grads_zeroed = true;
    } else if (m->g[GROUP_DENSE].p) model_zero_dense(m, m->g[GROUP_DENSE]);
}

void model_attention_forward(Model *m, int l, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a) {
    KvCache *kv = m->kv;
    if (m->ring) { // context parallelism: this rank's zigzag rows against the whole sequences
        CHECK(!kv && !a->sinks.p);
        ring_attention_forward(m->ring, o, lse, q, k, v, a);
        return;
    }
    if (!kv) {
        op_attention_forward(o, lse, q, k, v, a);
        return;
    }
    CHECK(a->B == 1 && a->q_off == 0 && a->k_off == 0 && k.n[0] == q.n[0]);
    int64_t S = k.n[0], n = kv->len + S;
    CHECK(n <= kv->cap);
    if (!kv->k[l].p) { // k: (cap, nkv, dqk), v: (cap, nkv, dv), as this layer's attention shapes them
        size_t bytes = (size_t)kv->cap * (t_cols(k) + t_cols(v)) * dtype_size(k.dt) + 2 * ARENA_ALIGN;
        kv->mem[l] = arena_create("kv cache", k.dev, bytes);
        kv->k[l] = arena_tensor(&kv->mem[l], k.dt, 3, kv->cap, k.n[1], k.n[2], 0);
        kv->v[l] = arena_tensor(&kv->mem[l], v.dt, 3, kv->cap, v.n[1], v.n[2], 0);
    }
    op_copy(tensor_rows(kv->k[l], kv->len, S), k);
    op_copy(tensor_rows(kv->v[l], kv->len, S), v);
    AttnArgs c = *a;
    c.q_off = kv->len; // query i sits at position len + i and sees keys 0 .. len + i
    op_attention_forward(o, lse, q, tensor_rows(kv->k[l], 0, n), tensor_rows(kv->v[l], 0, n), &c);
}

void model_attention_backward(Model *m, Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k,
                              Tensor v, Tensor o, Tensor lse, const AttnArgs *a) {
    if (m->ring) {
        CHECK(!dsinks.p);
        ring_attention_backward(m->ring, dq, dk, dv, dout, q, k, v, o, lse, a);
    } else op_attention_backward(dq, dk, dv, dsinks, dout, q, k, v, o, lse, a);
}

int model_position(const Model *m, int S, int t) {
    if (!m->ring) return t % S;
    return ring_position(m->ring->cp->rank, m->ring->cp->size, S / 2, t % S);
}

// ---- multi-head latent attention (the family's MlaLatent hooks decompress the latent) ----

void model_mla_attention_forward(Model *m, int l, Tensor o, Tensor lse, Tensor q, const MlaLatent *ml, Tensor kv,
                                 Tensor k, Tensor v, const AttnArgs *a) {
    CHECK(ml->r.decompress && ml->r.decompress_backward);
    if (m->ring) {
        CHECK(!m->kv);
        ring_mla_forward(m->ring, o, lse, q, &ml->r, a);
        return;
    }
    ml->r.decompress(&ml->r, ml->r.c, ml->r.pe, ml->r.pe_col, kv, k, v);
    model_attention_forward(m, l, o, lse, q, k, v, a);
}

void model_mla_attention_backward(Model *m, Tensor dq, Tensor dc, Tensor dpe, Tensor dout, Tensor q, Tensor k, Tensor v,
                                  Tensor o, Tensor lse, Tensor dk, Tensor dv, Tensor dkv, const MlaLatent *ml,
                                  const AttnArgs *a) {
    if (m->ring) {
        ring_mla_backward(m->ring, dq, dc, dpe, dout, q, o, lse, &ml->r, a);
        return;
    }
    op_attention_backward(dq, dk, dv, (Tensor){0}, dout, q, k, v, o, lse, a);
    ml->r.decompress_backward(&ml->r, ml->r.c, dc, dpe, ml->r.pe_col, dkv, dk, dv);
}

// ---- Gated DeltaNet under context parallelism ----

void model_cp_contiguous(Model *m, Tensor dst, Tensor src, int B) {
    if (m->ring) ring_to_contiguous(m->ring, dst, src, B);
    else CHECK(dst.p == src.p);
}

void model_cp_zigzag(Model *m, Tensor dst, Tensor src, int B) {
    if (m->ring) ring_to_zigzag(m->ring, dst, src, B);
    else CHECK(dst.p == src.p);
}

void model_conv1d_silu_forward(Model *m, Tensor y, Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split) {
    if (m->ring) ring_halo_forward(m->ring, halo, x, B);
    op_conv1d_silu_forward(y, x, w, halo, pos, B, split);
}

void model_conv1d_silu_backward(Model *m, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo, Tensor pos,
                                int B, int64_t split) {
    if (!m->ring) {
        op_conv1d_silu_backward(dx, (Tensor){0}, dw, dy, x, w, halo, pos, B, split);
        return;
    }
    Tensor buf[2]; // this rank's ∂/∂halo, for rank r − 1, and rank r + 1's, in the ring's scratch
    ring_pair(&m->ring->mem, halo, buf);
    op_conv1d_silu_backward(dx, buf[0], dw, dy, x, w, halo, pos, B, split);
    ring_halo_backward(m->ring, dx, buf[0], buf[1], B);
}

void model_delta_rule_forward(Model *m, Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, DeltaArgs a,
                              Tensor s0) {
    Ring *R = m->ring;
    a.s0 = a.sT = (Tensor){0};
    if (R) {
        Tensor buf[2];
        ring_pair(&R->mem, s0, buf);
        if (ring_state_recv(R, s0, true)) a.s0 = s0; // rank 0 starts from zeros
        if (R->cp->rank < R->cp->size - 1) a.sT = buf[0];
    }
    op_delta_rule_forward(o, q, k, v, g, beta, &a);
    if (a.sT.p) ring_state_send(R, a.sT, true);
}

void model_delta_rule_backward(Model *m, Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout,
                               Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, DeltaArgs a, Tensor s0) {
    Ring *R = m->ring;
    a.s0 = a.sT = a.dsT = a.ds0 = (Tensor){0};
    if (R) {
        Tensor buf[2]; // ∂/∂sT from rank r + 1, ∂/∂s0 for rank r − 1
        ring_pair(&R->mem, s0, buf);
        if (ring_state_recv(R, buf[0], false)) a.dsT = buf[0]; // the last rank's final state reaches nothing
        if (R->cp->rank > 0) a.s0 = s0, a.ds0 = buf[1];
    }
    op_delta_rule_backward(dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, &a);
    if (a.ds0.p) ring_state_send(R, a.ds0, false);
}
