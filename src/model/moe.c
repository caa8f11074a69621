// moe.c — the parts of a decoder-only MoE model that every family shares (docs/architecture.md, "The
// model protocol"): the token embedding (prolog); stage 3, the experts as grouped GEMMs on the rows stage
// 2 delivered (or a dense SwiGLU MLP on every token), with its backward split into input and weight
// gradients; stage 5, the routing-weighted sum of the expert outputs plus the residual; the epilog, final
// RMSNorm → LM head → cross-entropy in row chunks; their parameters and views. A family file adds its HF
// config names, stage 1 and its parameter names. Shapes: T = B·S tokens, H hidden, V vocabulary, E
// experts (E_l on this rank), k per token, I expert (or dense MLP) width, R rows stage 3 can receive.
#include "model/model.h"

// ---- config and parameters ----

void moe_config_check(const ModelConfig *c, JObj o, const char *experts_key) {
    if (c->hidden <= 0 || c->layers <= 0 || c->heads <= 0 || c->vocab <= 0)
        jdie(o, NULL, "hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive");
    if (c->layers > MAX_LAYERS) jdie(o, "num_hidden_layers", "at most %d layers are supported", MAX_LAYERS);
    if (!(c->eps >= 0 && c->eps < 1)) jdie(o, "rms_norm_eps", "must be in [0, 1) (got %g)", c->eps);
    if (c->rope.rd <= 0 || c->rope.rd % 2)
        jdie(o, NULL, "the rotary dimension must be positive and even (got %d)", c->rope.rd);
    if (c->experts < 1 || c->topk < 1 || c->topk > c->experts)
        jdie(o, "num_experts_per_tok", "must be in [1, %s] (got %d of %d)", experts_key, c->topk, c->experts);
    if (c->moe_inter <= 0) jdie(o, "moe_intermediate_size", "must be positive");
    for (int l = 0; l < c->layers; l++)
        if (!c->is_moe[l] && c->dense_inter <= 0)
            jdie(o, "intermediate_size", "must be positive: layer %d has a dense MLP", l);
}

void moe_layer_types(const ModelConfig *c, JObj o, const char *kind, int every, uint64_t bits[MAX_LAYERS / 64]) {
    json_t *lt = json_object_get(o.obj, "layer_types");
    bool given = lt && !json_is_null(lt);
    if (given && (!json_is_array(lt) || (int)json_array_size(lt) != c->layers))
        jdie(o, "layer_types", "expected an array of num_hidden_layers = %d strings", c->layers);
    memset(bits, 0, MAX_LAYERS / 8);
    for (int l = 0; l < c->layers; l++) {
        const char *t = given ? json_string_value(json_array_get(lt, l)) : (l + 1) % every ? kind : "full_attention";
        if (!t || (strcmp(t, kind) && strcmp(t, "full_attention")))
            jdie(o, "layer_types", "entry %d must be \"%s\" or \"full_attention\"", l, kind);
        if (!strcmp(t, kind)) bits[l / 64] |= 1ull << (l % 64);
    }
}

void moe_rope_parse(ModelConfig *c, JObj o, int rd, bool yarn_ok) {
    JObj rp = jobj_child(o, "rope_parameters");
    if (!rp.obj) rp = jobj_child(o, "rope_scaling");
    RopeSpec *r = &c->rope;
    memset(r, 0, sizeof *r);
    r->rd = rd;
    r->theta =
        rp.obj && jhas(rp, "rope_theta") ? jnum(rp, "rope_theta", true, 0) : jnum(o, "rope_theta", false, 10000.0);
    if (!(r->theta > 1)) jdie(rp.obj && jhas(rp, "rope_theta") ? rp : o, "rope_theta", "must be above 1");
    if (!rp.obj) return;
    const char *rt = jhas(rp, "rope_type") ? jstr(rp, "rope_type", true, NULL) : jstr(rp, "type", false, "default");
    if (!strcmp(rt, "default")) return;
    if (strcmp(rt, "yarn") || !yarn_ok)
        jdie(rp, "rope_type", "'%s' is not supported for %s (%s)", rt, c->model_type,
             yarn_ok ? "default or yarn" : "only default RoPE");
    r->yarn = true;
    r->orig_max_pos = jnum(rp, "original_max_position_embeddings", true, 0);
    if (!(r->orig_max_pos > 0)) jdie(rp, "original_max_position_embeddings", "must be positive");
    // transformers: a missing factor is max_position_embeddings / original_max_position_embeddings
    r->factor = jhas(rp, "factor") ? jnum(rp, "factor", true, 0)
                                   : jnum(o, "max_position_embeddings", true, 0) / r->orig_max_pos;
    if (!(r->factor > 0)) jdie(rp, "factor", "must be positive");
    r->beta_fast = jnum(rp, "beta_fast", false, 32), r->beta_slow = jnum(rp, "beta_slow", false, 1);
    r->truncate = jbool(rp, "truncate", false, true);
    r->attention_factor = jnum(rp, "attention_factor", false, 0);
    r->mscale = jnum(rp, "mscale", false, 0), r->mscale_all_dim = jnum(rp, "mscale_all_dim", false, 0);
}

static void params_mlp(ParamTable *t, const ModelConfig *c, int l) {
    int64_t H = c->hidden, I = c->moe_inter, D = c->dense_inter;
    int e0 = model_expert_first(c), e1 = e0 + model_experts_local(c); // the experts this rank holds
    char n[96];
    if (!c->is_moe[l]) {
        params_add_layer(t, l, "mlp.gate_proj.weight", INIT_NORMAL, 2, D, H);
        params_add_layer(t, l, "mlp.up_proj.weight", INIT_NORMAL, 2, D, H);
        return params_add_layer(t, l, "mlp.down_proj.weight", INIT_NORMAL_OUT, 2, H, D);
    }
    if (c->swiglu_limit > 0) { // GPT-OSS: each expert's gate_up (2I, H) with interleaved rows, and biases
        static const struct {
            const char *name;
            int init, nd;
        } part[4] = {{"gate_up_proj.weight", INIT_NORMAL, 2},
                     {"gate_up_proj.bias", INIT_ZEROS, 1},
                     {"down_proj.weight", INIT_NORMAL_OUT, 2},
                     {"down_proj.bias", INIT_ZEROS, 1}};
        int64_t rows[4] = {2 * I, 2 * I, H, H}, cols[4] = {H, 0, I, 0};
        for (int j = 0; j < 4; j++) // one (E_l, ·) tensor per part
            for (int e = e0; e < e1; e++) {
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.%s", l, e, part[j].name);
                params_add(t, n, GROUP_EXPERT, part[j].init, part[j].nd, rows[j], cols[j], 0);
            }
        return;
    }
    // Expert e's gate_proj and up_proj are adjacent, so the layer's gate_up is one (E_l, 2I, H) tensor
    // (names keep the global expert index).
    for (int e = e0; e < e1; e++) {
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.gate_proj.weight", l, e),
            params_add(t, n, GROUP_EXPERT, INIT_NORMAL, 2, I, H, 0);
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.up_proj.weight", l, e),
            params_add(t, n, GROUP_EXPERT, INIT_NORMAL, 2, I, H, 0);
    }
    for (int e = e0; e < e1; e++) {
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.down_proj.weight", l, e);
        params_add(t, n, GROUP_EXPERT, INIT_NORMAL_OUT, 2, H, I, 0);
    }
}

static GqaShape layer_gqa(const ModelFamily *fam, const ModelConfig *c, int l) {
    return fam->gqa ? fam->gqa(c, l) : (GqaShape){0};
}

// "<prefix><suffix>" in nm: a layer tensor's suffix under a ModelFamily name (router, shared).
#define NAME(prefix, suffix) (snprintf(nm, sizeof nm, "%s%s", prefix, suffix), nm)

void model_params_build(const ModelFamily *fam, ParamTable *t, const ModelConfig *c) {
    int64_t H = c->hidden, Is = c->shared_inter;
    int norm = c->norm_1p ? INIT_ZEROS : INIT_ONES;
    char nm[48];
    params_add(t, "embed_tokens.weight", GROUP_DENSE, INIT_NORMAL, 2, c->vocab, H, 0);
    for (int l = 0; l < c->layers; l++) {
        GqaShape g = layer_gqa(fam, c, l);
        params_add_layer(t, l, "input_layernorm.weight", norm, 1, H, 0);
        if (g.nh) gqa_params(t, &g, l, H);
        else fam->mixer_params(t, c, l);
        params_add_layer(t, l, "post_attention_layernorm.weight", norm, 1, H, 0);
        if (c->is_moe[l]) {
            params_add_layer(t, l, NAME(fam->router, ".weight"), INIT_NORMAL, 2, c->experts, H);
            if (fam->router_bias) params_add_layer(t, l, NAME(fam->router, ".bias"), INIT_NORMAL, 1, c->experts, 0);
        }
        if (c->is_moe[l] && Is) { // gate_proj and up_proj adjacent: one (2Is, H) tensor
            params_add_layer(t, l, NAME(fam->shared, ".gate_proj.weight"), INIT_NORMAL, 2, Is, H);
            params_add_layer(t, l, NAME(fam->shared, ".up_proj.weight"), INIT_NORMAL, 2, Is, H);
            params_add_layer(t, l, NAME(fam->shared, ".down_proj.weight"), INIT_NORMAL_OUT, 2, H, Is);
            if (fam->shared_gate) params_add_layer(t, l, NAME(fam->shared, "_gate.weight"), INIT_NORMAL, 2, 1, H);
        }
        params_mlp(t, c, l);
    }
    params_add(t, "norm.weight", GROUP_DENSE, norm, 1, H, 0, 0);
    if (!c->tie_embed) params_add(t, "lm_head.weight", GROUP_DENSE, INIT_NORMAL, 2, c->vocab, H, 0);
}

Tensor model_view(Model *m, Tensor *flat, const char *name, int nd, int64_t n0, int64_t n1, int64_t n2) {
    const ParamInfo *p = params_find(&m->params, name);
    if (!p) return NONE;
    Tensor f = flat[p->group];
    int64_t at = p->off - (p->group == GROUP_DENSE ? m->view_from : 0);
    Tensor t = tensor_make(f.p ? (char *)f.p + at * dtype_size(f.dt) : NULL, f.dt, f.dev, nd, n0, n1, n2,
                           1); // NULL: a plan, or a dense gradient bound per unit
    CHECK(at >= 0 && at + tensor_numel(t) <= tensor_numel(f));
    return t;
}

Tensor model_view_layer(Model *m, Tensor *flat, int l, const char *suffix, int nd, int64_t n0, int64_t n1) {
    char n[96];
    snprintf(n, sizeof n, "layers.%d.%s", l, suffix);
    return model_view(m, flat, n, nd, n0, n1, 0);
}

void params_add_layer(ParamTable *t, int l, const char *suffix, int init, int nd, int64_t n0, int64_t n1) {
    char n[96];
    snprintf(n, sizeof n, "layers.%d.%s", l, suffix);
    params_add(t, n, GROUP_DENSE, init, nd, n0, n1, 0);
}

// Layer l's views of the shared parts in flat.
static void bind_layer(Model *m, Tensor *flat, SharedWeights *w, int l) {
    const ModelConfig *c = &m->cfg;
    const ModelFamily *fam = m->fam;
    int64_t H = c->hidden, I = c->moe_inter, D = c->dense_inter, El = model_experts_local(c), Is = c->shared_inter;
    char n[96], nm[48];
    GqaShape g = layer_gqa(fam, c, l);
    w->ln1[l] = model_view_layer(m, flat, l, "input_layernorm.weight", 1, H, 0);
    w->ln2[l] = model_view_layer(m, flat, l, "post_attention_layernorm.weight", 1, H, 0);
    if (g.nh) gqa_bind(m, flat, &g, l, &w->att[l]);
    w->router[l] = model_view_layer(m, flat, l, NAME(fam->router, ".weight"), 2, c->experts, H);
    w->router_b[l] = model_view_layer(m, flat, l, NAME(fam->router, ".bias"), 1, c->experts, 0);
    if (fam->shared) {
        w->shared_gu[l] = model_view_layer(m, flat, l, NAME(fam->shared, ".gate_proj.weight"), 2, 2 * Is, H);
        w->shared_down[l] = model_view_layer(m, flat, l, NAME(fam->shared, ".down_proj.weight"), 2, H, Is);
        w->shared_gate[l] = model_view_layer(m, flat, l, NAME(fam->shared, "_gate.weight"), 2, 1, H);
    }
    if (c->is_moe[l]) {
        bool oss = c->swiglu_limit > 0;
        int e0 = model_expert_first(c);
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.%s.weight", l, e0, oss ? "gate_up_proj" : "gate_proj");
        w->gate_up[l] = model_view(m, flat, n, 3, El, 2 * I, H);
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.down_proj.weight", l, e0);
        w->down[l] = model_view(m, flat, n, 3, El, H, I);
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.gate_up_proj.bias", l, e0);
        w->gate_up_b[l] = model_view(m, flat, n, 2, El, 2 * I, 0); // absent ({0}) but for GPT-OSS
        snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.down_proj.bias", l, e0);
        w->down_b[l] = model_view(m, flat, n, 2, El, H, 0);
    } else {
        w->gate_up[l] = model_view_layer(m, flat, l, "mlp.gate_proj.weight", 2, 2 * D, H);
        w->down[l] = model_view_layer(m, flat, l, "mlp.down_proj.weight", 2, H, D);
    }
    if (fam->bind_layer) fam->bind_layer(m, flat, l, model_layer_views(m, l, w == m->sg));
}

// The embedding's (prolog) or the final norm's and LM head's (epilog) views in flat.
static void bind_ends(Model *m, Tensor *flat, SharedWeights *w, bool prolog, bool epilog) {
    const ModelConfig *c = &m->cfg;
    if (prolog) w->embed = model_view(m, flat, "embed_tokens.weight", 2, c->vocab, c->hidden, 0);
    if (epilog) w->norm = model_view(m, flat, "norm.weight", 1, c->hidden, 0, 0);
    if (c->tie_embed) w->lm_head = w->embed;
    else if (epilog) w->lm_head = model_view(m, flat, "lm_head.weight", 2, c->vocab, c->hidden, 0);
}

void moe_bind(Model *m) {
    m->sw = xcalloc(1, sizeof *m->sw), m->sg = xcalloc(1, sizeof *m->sg);
    if (m->fam->bind_layer) m->views = xcalloc(2 * MAX_LAYERS, m->fam->layer_views);
    for (int grad = 0; grad < 2; grad++) {
        Tensor *flat = grad ? m->g : m->w;
        SharedWeights *w = grad ? m->sg : m->sw;
        bind_ends(m, flat, w, true, true);
        for (int l = 0; l < m->cfg.layers; l++) bind_layer(m, flat, w, l);
    }
}

ModelUnit model_grad_unit(const Model *m, int u) {
    const ParamTable *t = &m->params;
    ModelUnit r = {-1, 0};
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *p = &t->p[i];
        int l = -1;
        if (p->group != GROUP_DENSE) continue;
        bool in = u == MODEL_UNIT_PROLOG(m)   ? !strcmp(p->name, "embed_tokens.weight")
                  : u == MODEL_UNIT_EPILOG(m) ? !strcmp(p->name, "norm.weight") || !strcmp(p->name, "lm_head.weight")
                                              : sscanf(p->name, "layers.%d.", &l) == 1 && l == u;
        if (!in) continue;
        if (r.off < 0) r.off = p->off;
        r.n = p->off + params_numel(p) - r.off;
    }
    CHECK(r.off >= 0);
    if (u == MODEL_UNIT_EPILOG(m)) r.n = tensor_numel(m->g[GROUP_DENSE]) - r.off; // the padding
    return r;
}

void model_bind_grad_unit(Model *m, int u, Tensor win, int64_t off) {
    Tensor flat[NGROUPS] = {win, m->g[GROUP_EXPERT]};
    m->view_from = off;
    if (u < m->cfg.layers) bind_layer(m, flat, m->sg, u);
    else bind_ends(m, flat, m->sg, u == MODEL_UNIT_PROLOG(m), u == MODEL_UNIT_EPILOG(m));
    m->view_from = 0;
}

// ---- records ----

static bool has_shared(const Model *m, int l) { return m->cfg.is_moe[l] && m->cfg.shared_inter; }

// Field `f` from arena a when part p (0: none) is recomputed (RC_*) exactly when `staged`, else as it is.
#define PART(p, f, ...) (f = !(m->recompute & (p)) == !staged ? arena_tensor(a, __VA_ARGS__) : f)

bool moe_stage3_gathers(const Model *m, const StageIO *io) {
    return !io->dense && !io->route && (m->dev == DEV_CPU || m->fp8.on);
}

// A dense layer's n2 is its stage 3's input (kept), and so is a layer's that gathers it (moe_stage3_gathers).
void moe_layer_alloc(Model *m, int l, void *rp, Arena *a, int B, int S, StageIO *io, bool staged) {
    const ModelConfig *c = &m->cfg;
    LayerRec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, E = c->experts, Is = c->shared_inter;
    DType dt = m->cdt;
    GqaShape g = layer_gqa(m->fam, c, l);
    if (!staged) memset(r, 0, m->fam->rec_size);
    PART(RC_NORM, r->n1, dt, 2, T, H, 0, 0);
    PART(0, r->rstd1, DT_F32, 1, T, 0, 0, 0);
    if (g.nh) gqa_alloc(&r->gqa, &g, a, dt, B, S, m->recompute & RC_ROPE, staged);
    else if (!staged) m->fam->mixer_alloc(m, l, r, a, B, S);
    PART(0, r->h1a, dt, 2, T, H, 0, 0);
    if (has_shared(m, l)) PART(0, r->h1, dt, 2, T, H, 0, 0);
    else r->h1 = r->h1a;
    PART(io->dense || moe_stage3_gathers(m, io) ? 0 : RC_NORM, r->n2, dt, 2, T, H, 0, 0);
    PART(0, r->rstd2, DT_F32, 1, T, 0, 0, 0);
    io->xd = r->n2;
    if (io->dense) return;
    PART(RC_ROUTER, r->logits, DT_F32, 2, T, E, 0, 0);
    PART(RC_ROUTER, r->probs, DT_F32, 2, T, E, 0, 0);
    PART(0, r->lb_grad, DT_F32, 2, B, E, 0, 0);
    if (!has_shared(m, l) || staged) return;
    r->sgu = arena_tensor(a, dt, 2, T, 2 * Is, 0, 0);
    r->sact = arena_tensor(a, dt, 2, T, Is, 0, 0);
    if (!m->fam->shared_gate) return;
    r->so = arena_tensor(a, dt, 2, T, H, 0, 0);
    r->sg = arena_tensor(a, dt, 2, T, 1, 0, 0);
}

void moe_layer_grad_alloc(Model *m, int l, void *rp, Arena *ws, int B, int S, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    LayerRec *r = rp;
    int64_t T = (int64_t)B * S, H = c->hidden, Is = c->shared_inter;
    DType dt = m->cdt;
    GqaShape g = layer_gqa(m->fam, c, l);
    r->dh1 = arena_tensor(ws, dt, 2, T, H, 0, 0);
    r->dn1 = arena_tensor(ws, dt, 2, T, H, 0, 0);
    if (g.nh) gqa_grad_alloc(&r->gqa, &g, ws, dt, B, S);
    else m->fam->mixer_grad_alloc(m, l, rp, ws, B, S);
    if (io->dense) return;
    r->dlogits = arena_tensor(ws, DT_F32, 2, T, c->experts, 0, 0);
    if (!has_shared(m, l)) return;
    r->dsgu = arena_tensor(ws, dt, 2, T, 2 * Is, 0, 0);
    r->dsact = arena_tensor(ws, dt, 2, T, Is, 0, 0);
    if (!m->fam->shared_gate) return;
    r->dso = arena_tensor(ws, dt, 2, T, H, 0, 0);
    r->dsg = arena_tensor(ws, dt, 2, T, 1, 0, 0);
}

void moe_stage3_alloc(Model *m, int l, void *rp, Arena *a, int64_t R, bool staged) {
    LayerRec *r = rp;
    int64_t I = m->cfg.is_moe[l] ? m->cfg.moe_inter : m->cfg.dense_inter;
    PART(RC_GATE_UP, r->gu, m->cdt, 2, R, 2 * I, 0, 0);
    PART(RC_SWIGLU, r->act, m->cdt, 2, R, I, 0, 0);
}

int64_t moe_stage3_rows(const Model *m, const StageIO *io) {
    (void)m;
    return io->dense ? io->xe.n[0] : io->rows;
}

void moe_stage3_grad_alloc(Model *m, int l, void *rp, Arena *ws) {
    LayerRec *r = rp;
    r->dact = arena_tensor(ws, m->cdt, 2, r->act.n[0], r->act.n[1], 0, 0);
    r->dgu = arena_tensor(ws, m->cdt, 2, r->gu.n[0], r->gu.n[1], 0, 0);
}

// ---- prolog: token embedding ----

void moe_prolog_forward(Model *m, MicroBatch *mb, Tensor h) { op_embedding_forward(h, m->sw->embed, mb->tokens); }

void moe_prolog_backward(Model *m, MicroBatch *mb, Tensor dh) { op_embedding_backward(m->sg->embed, dh, mb->tokens); }

// ---- stage 1: norm → mixer → residual → norm → router (and the shared expert) ----

static RouterArgs router_args(const Model *m) {
    RouterArgs ra = m->cfg.router;
    ra.k = m->cfg.topk, ra.force_balance = m->force_balance;
    return ra;
}

void moe_stage1_forward(Model *m, int l, void *rp, MicroBatch *mb, Tensor x, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    const SharedWeights *W = m->sw;
    LayerRec *r = rp;
    const RmsArgs na = {.one_plus = c->norm_1p};
    GqaShape g = layer_gqa(m->fam, c, l);
    r->x = x;
    op_rmsnorm_forward(r->n1, r->rstd1, x, W->ln1[l], (float)c->eps, &na);
    if (g.nh) gqa_forward(m, l, &g, &W->att[l], &r->gqa, mb, r->n1, r->h1a, gqa_attn_args(m, &g, mb->B));
    else m->fam->mixer_forward(m, l, rp, mb, io->opws);
    op_add(r->h1a, x);
    op_rmsnorm_forward(r->n2, r->rstd2, r->h1a, W->ln2[l], (float)c->eps, &na);
    if (io->dense) return;
    op_linear_forward(r->logits, r->n2, W->router[l], W->router_b[l]);
    model_router_forward(m, mb, l, r->probs, io->idx, io->w, r->logits, router_args(m));
    // The load-balancing term enters the objective as lb·T per micro-batch (docs/reference.md §1), so its gradient
    // w.r.t. probs is scaled by T here; the engine divides all gradients by the step's token count.
    if (m->lb_coef > 0) model_lb_loss(m, mb, l, r->lb_grad, r->probs, io->idx, (float)mb->T);
    if (!has_shared(m, l)) return;
    // The shared expert on every token (gated per token), added to the residual stage 5 adds the routed experts to.
    bool gated = m->fam->shared_gate;
    model_proj_forward(m, l, FP8_SHARED_GU, r->sgu, r->n2, W->shared_gu[l], NONE);
    op_swiglu_forward(r->sact, r->sgu, 0, 0);
    model_proj_forward(m, l, FP8_SHARED_DOWN, gated ? r->so : r->h1, r->sact, W->shared_down[l], NONE);
    if (gated) {
        op_linear_forward(r->sg, r->n2, W->shared_gate[l], NONE);
        op_sigmoid_gate_forward(r->h1, r->so, r->sg);
    }
    op_add(r->h1, r->h1a);
}

// The same ops on the same kept inputs give the forward's bits (the norms rewrite their rstd, the router its routing).
void moe_stage1_recompute(Model *m, int l, void *rp, const MicroBatch *mb, StageIO *io) {
    const ModelConfig *c = &m->cfg;
    const SharedWeights *W = m->sw;
    LayerRec *r = rp;
    const RmsArgs na = {.one_plus = c->norm_1p};
    GqaShape g = layer_gqa(m->fam, c, l);
    if (m->recompute & RC_NORM) {
        op_rmsnorm_forward(r->n1, r->rstd1, r->x, W->ln1[l], (float)c->eps, &na);
        if (!io->dense) op_rmsnorm_forward(r->n2, r->rstd2, r->h1a, W->ln2[l], (float)c->eps, &na);
    }
    if (m->recompute & RC_ROPE && g.qk_norm != QK_NORM_NONE) gqa_qk_rope(m, &g, &W->att[l], &r->gqa, mb);
    if (io->dense || !(m->recompute & RC_ROUTER)) return;
    MicroBatch again = *mb;
    again.replay = true; // its expert counts were counted in the forward
    op_linear_forward(r->logits, r->n2, W->router[l], W->router_b[l]);
    model_router_forward(m, &again, l, r->probs, io->idx, io->w, r->logits, router_args(m));
}

void moe_stage1_backward(Model *m, int l, void *rp, MicroBatch *mb, StageIO *io, Tensor dout, Tensor dx) {
    const ModelConfig *c = &m->cfg;
    const SharedWeights *W = m->sw, *G = m->sg;
    LayerRec *r = rp;
    const RmsArgs na = {.one_plus = c->norm_1p};
    GqaShape g = layer_gqa(m->fam, c, l);
    Tensor dn2 = io->dxd; // gradient of the dispatched tokens, from stage 2's backward
    if (!io->dense) {
        RouterArgs ra = router_args(m);
        model_router_backward(m, r->dlogits, io->dw, m->lb_coef > 0 ? r->lb_grad : NONE, r->probs, io->idx, io->w, &ra,
                              mb->B);
        op_linear_backward_input(dn2, r->dlogits, W->router[l], true);
        op_linear_backward_weight(G->router[l], G->router_b[l], r->dlogits, r->n2, true);
    }
    if (has_shared(m, l)) {
        bool gated = m->fam->shared_gate;
        if (gated) {
            op_sigmoid_gate_backward(r->dso, r->dsg, dout, r->so, r->sg, false);
            op_linear_backward_input(dn2, r->dsg, W->shared_gate[l], true);
            op_linear_backward_weight(G->shared_gate[l], NONE, r->dsg, r->n2, true);
        }
        Tensor dso = gated ? r->dso : dout;
        model_proj_backward_input(m, l, FP8_SHARED_DOWN, r->dsact, dso, W->shared_down[l], false);
        model_proj_backward_weight(m, l, FP8_SHARED_DOWN, G->shared_down[l], NONE, dso, r->sact);
        op_swiglu_backward(r->dsgu, r->dsact, r->sgu, 0, 0);
        model_proj_backward_input(m, l, FP8_SHARED_GU, dn2, r->dsgu, W->shared_gu[l], true);
        model_proj_backward_weight(m, l, FP8_SHARED_GU, G->shared_gu[l], NONE, r->dsgu, r->n2);
    }
    op_copy(r->dh1, dout);
    op_rmsnorm_backward(r->dh1, G->ln2[l], dn2, r->h1a, W->ln2[l], r->rstd2, true, &na);
    if (g.nh) {
        AttnArgs aa = gqa_attn_args(m, &g, mb->B);
        aa.ws = io->opws;
        gqa_backward(m, l, &g, &W->att[l], &G->att[l], &r->gqa, mb, r->n1, r->dh1, r->dn1, aa);
    } else {
        m->fam->mixer_backward(m, l, rp, mb, io->opws);
    }
    op_copy(dx, r->dh1);
    op_rmsnorm_backward(dx, G->ln1[l], r->dn1, r->x, W->ln1[l], r->rstd1, true, &na);
}

// ---- stage 3: experts (grouped GEMMs) or the dense MLP on the received rows ----

// The activation: SwiGLU on [gate | up], or GPT-OSS's clamped SwiGLU on interleaved columns (swiglu_limit > 0).
static void act_forward(const ModelConfig *c, Tensor act, Tensor gu) {
    op_swiglu_forward(act, gu, c->swiglu_alpha, c->swiglu_limit);
}
static void act_backward(const ModelConfig *c, Tensor dgu, Tensor dact, Tensor gu) {
    op_swiglu_backward(dgu, dact, gu, c->swiglu_alpha, c->swiglu_limit);
}

// Stage 3's GEMMs (offs.p NULL: the dense MLP, a projection of slot s): the experts' through FP8 on the layer's cached
// quantised weights when m->fp8.on (the weight-gradient ones round their own operands; GPT-OSS's biases added after the
// product, their gradients from the unrounded dy), else in the compute dtype.
// rows.p: x is gathered, row i of the product x[rows[i] / k] (moe_stage3_gathers).
static void mlp_forward(Model *m, int l, Fp8Slot s, Tensor y, Tensor x, Tensor rows, Tensor w, Tensor b, Tensor offs) {
    CHECK(!rows.p || offs.p);
    if (!offs.p) return model_proj_forward(m, l, s, y, x, w, b);
    if (!m->fp8.on) return op_grouped_linear_forward(y, x, rows, m->cfg.topk, w, b, offs);
    m->fp8.gemms[s]++, op_fp8_grouped_linear_forward(y, x, rows, m->cfg.topk, model_fp8_weight(m, l, s), offs);
    if (b.p) op_linear_bias_forward(y, b, offs);
}
static void mlp_backward_input(Model *m, int l, Fp8Slot s, Tensor dx, Tensor dy, Tensor w, Tensor offs) {
    if (!offs.p) model_proj_backward_input(m, l, s, dx, dy, w, false);
    else if (m->fp8.on)
        m->fp8.gemms[s]++, op_fp8_grouped_linear_backward_input(dx, dy, model_fp8_weight(m, l, s), offs);
    else op_grouped_linear_backward_input(dx, dy, w, offs);
}
// acc false (grouped): dw and db are written, not added to (the dense path always adds).
static void mlp_backward_weight(Model *m, int l, Fp8Slot s, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor rows,
                                Tensor offs, bool acc) {
    CHECK(!rows.p || offs.p);
    if (!offs.p) return model_proj_backward_weight(m, l, s, dw, db, dy, x);
    if (!m->fp8.on) return op_grouped_linear_backward_weight(dw, db, dy, x, rows, m->cfg.topk, offs, acc);
    m->fp8.gemms[s]++, op_fp8_grouped_linear_backward_weight(dw, dy, x, rows, m->cfg.topk, offs, acc);
    if (db.p) op_linear_bias_backward(db, dy, offs, acc);
}

// Stage 3's input: its R rows of xe, or (moe_stage3_gathers) the tokens xd, which the grouped GEMMs read through perm.
static Tensor stage3_x(const Model *m, StageIO *io, int64_t R) {
    return moe_stage3_gathers(m, io) ? io->xd : tensor_rows(io->xe, 0, R);
}
static Tensor stage3_rows(const Model *m, StageIO *io) { return moe_stage3_gathers(m, io) ? io->perm : NONE; }

// Stage 3 on its rows (every token of a dense layer, no offs; the received rows of a MoE layer).
void moe_stage3_forward(Model *m, int l, void *rp, StageIO *io, bool again) {
    const SharedWeights *W = m->sw;
    LayerRec *r = rp;
    Tensor offs = io->dense ? NONE : io->offs;
    int64_t R = moe_stage3_rows(m, io); // none when routing skips this rank
    if (!R) return;
    Tensor gu = tensor_rows(r->gu, 0, R), act = tensor_rows(r->act, 0, R);
    bool need_act = !again || m->recompute & RC_SWIGLU, need_gu = need_act && (!again || m->recompute & RC_GATE_UP);
    if (need_gu)
        mlp_forward(m, l, FP8_GATE_UP, gu, stage3_x(m, io, R), stage3_rows(m, io), W->gate_up[l], W->gate_up_b[l],
                    offs);
    if (need_act) act_forward(&m->cfg, act, gu);
    mlp_forward(m, l, FP8_DOWN, tensor_rows(io->ye, 0, R), act, NONE, W->down[l], W->down_b[l], offs);
}

void moe_stage3_backward_input(Model *m, int l, void *rp, StageIO *io) {
    const SharedWeights *W = m->sw;
    LayerRec *r = rp;
    Tensor offs = io->dense ? NONE : io->offs;
    int64_t R = moe_stage3_rows(m, io);
    if (!R) return;
    Tensor dact = tensor_rows(r->dact, 0, R), dgu = tensor_rows(r->dgu, 0, R), gu = tensor_rows(r->gu, 0, R);
    // not kept: the gate_up GEMM again, unless the expert outputs' remake made gu (in staging, just before)
    bool made = !io->dense && m->recompute & RC_EXPERT_OUT && m->recompute & RC_SWIGLU;
    if (m->recompute & RC_GATE_UP && !made)
        mlp_forward(m, l, FP8_GATE_UP, gu, stage3_x(m, io, R), stage3_rows(m, io), W->gate_up[l], W->gate_up_b[l],
                    offs);
    mlp_backward_input(m, l, FP8_DOWN, dact, tensor_rows(io->dye, 0, R), W->down[l], offs);
    act_backward(&m->cfg, dgu, dact, gu);
    mlp_backward_input(m, l, FP8_GATE_UP, tensor_rows(io->dxe, 0, R), dgu, W->gate_up[l], offs);
}

// The expert weight gradients, separable from the input gradients so a pipeline can defer them.
void moe_stage3_backward_weight(Model *m, int l, void *rp, const MicroBatch *mb, StageIO *io) {
    const SharedWeights *G = m->sg;
    LayerRec *r = rp;
    // act not kept: SwiGLU again on gu (kept, or the gate_up GEMM's again of moe_stage3_backward_input just before)
    bool again = m->recompute & RC_SWIGLU;
    if (io->dense) {
        if (again) act_forward(&m->cfg, r->act, r->gu);
        mlp_backward_weight(m, l, FP8_DOWN, G->down[l], NONE, io->dye, r->act, NONE, NONE, true);
        mlp_backward_weight(m, l, FP8_GATE_UP, G->gate_up[l], NONE, r->dgu, io->xe, NONE, NONE, true);
        return;
    }
    // The step's first weight gradient writes the layer's expert gradients (they hold the last step's:
    // StepSums.experts_written); with no rows they are zeroed.
    int64_t R = io->rows;
    bool acc = mb->sums->experts_written[l];
    mb->sums->experts_written[l] = true;
    if (!acc && !R) {
        op_zero(G->gate_up[l]), op_zero(G->down[l]);
        if (G->gate_up_b[l].p) op_zero(G->gate_up_b[l]), op_zero(G->down_b[l]);
    }
    if (!R) return;
    if (again) act_forward(&m->cfg, tensor_rows(r->act, 0, R), tensor_rows(r->gu, 0, R));
    mlp_backward_weight(m, l, FP8_DOWN, G->down[l], G->down_b[l], tensor_rows(io->dye, 0, R), tensor_rows(r->act, 0, R),
                        NONE, io->offs, acc);
    mlp_backward_weight(m, l, FP8_GATE_UP, G->gate_up[l], G->gate_up_b[l], tensor_rows(r->dgu, 0, R),
                        stage3_x(m, io, R), stage3_rows(m, io), io->offs, acc);
}

// ---- stage 5: weighted sum of the expert outputs + residual ----

void moe_stage5_forward(Model *m, int l, void *rp, StageIO *io, Tensor out) {
    LayerRec *r = rp;
    if (io->dense) {
        op_copy(out, r->h1);
        op_add(out, io->y);
    } else {
        op_moe_combine_forward(out, r->h1, io->y, io->w, io->at);
    }
}

void moe_stage5_backward(Model *m, int l, void *rp, StageIO *io, Tensor dout) {
    if (io->dense) op_copy(io->dy, dout);
    else op_moe_combine_backward(io->dy, io->dw, dout, io->y, io->w, io->at);
}

// ---- epilog: final norm → LM head → cross-entropy, in row chunks so (T, V) logits never exist ----

void moe_epilog_alloc(Model *m, EpilogRec *r, Arena *a, int T) {
    // Logits in the compute dtype (bf16 on the GPU, like HF's LM head), C rows at a time: by default ≤ 64 MB on
    // the CPU (cache-friendly), ≤ 512 MB on the GPU (large enough that the LM-head GEMMs run at full rate; the
    // logits_chunk_mb key sets it).
    int64_t budget = m->logits_bytes      ? m->logits_bytes
                     : m->dev == DEV_CUDA ? 512 << 20
                                          : 64 << 20,
            C = budget / ((int64_t)m->cfg.vocab * dtype_size(m->cdt));
    C = C < 1 ? 1 : C > T ? T : C;
    r->hn = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    r->rstd = arena_tensor(a, DT_F32, 1, T, 0, 0, 0);
    r->dhn = arena_tensor(a, m->cdt, 2, T, m->cfg.hidden, 0, 0);
    r->logits = arena_tensor(a, m->cdt, 2, C, m->cfg.vocab, 0, 0);
}

void moe_epilog_forward(Model *m, EpilogRec *r, MicroBatch *mb, Tensor h, bool grad) {
    const SharedWeights *W = m->sw, *G = m->sg;
    r->h = h;
    op_rmsnorm_forward(r->hn, r->rstd, h, W->norm, (float)m->cfg.eps, &(RmsArgs){.one_plus = m->cfg.norm_1p});
    // Chunks of equal size (a multiple of 64 rows where that fits), not C rows and a remainder: the input gradient's
    // product (C × H outputs over a reduction of V) fills the GPU's waves only with enough rows.
    int64_t C = r->logits.n[0], k = (mb->T + C - 1) / C, even = k ? (mb->T + k - 1) / k : 0;
    C = (even + 63) / 64 * 64 <= C ? (even + 63) / 64 * 64 : even;
    for (int64_t r0 = 0; r0 < mb->T; r0 += C) {
        int64_t n = mb->T - r0 < C ? mb->T - r0 : C;
        Tensor lg = tensor_rows(r->logits, 0, n), hn = tensor_rows(r->hn, r0, n);
        op_linear_forward(lg, hn, W->lm_head, NONE);
        Tensor rows = mb->sums->row_loss.p ? tensor_rows(mb->sums->row_loss, r0, n) : (Tensor){0};
        op_cross_entropy(lg, tensor_rows(mb->labels, r0, n), mb->sums->loss_sum, rows, 1.0f); // lg ← ∂(Σ CE)/∂logits
        if (!grad) continue;
        op_linear_backward_input(tensor_rows(r->dhn, r0, n), lg, W->lm_head, false);
        op_linear_backward_weight(G->lm_head, NONE, lg, hn, !m->head_unwritten);
        m->head_unwritten = false;
    }
}

void moe_logits(Model *m, Tensor logits, Tensor h, Arena *ws) {
    int64_t R = t_rows(h);
    size_t mark = arena_mark(ws);
    Tensor hn = arena_tensor(ws, m->cdt, 2, R, m->cfg.hidden, 0, 0), rstd = arena_tensor(ws, DT_F32, 1, R, 0, 0, 0),
           lg = arena_tensor(ws, m->cdt, 2, R, m->cfg.vocab, 0, 0);
    op_rmsnorm_forward(hn, rstd, h, m->sw->norm, (float)m->cfg.eps, &(RmsArgs){.one_plus = m->cfg.norm_1p});
    op_linear_forward(lg, hn, m->sw->lm_head, NONE);
    op_copy(logits, lg);
    arena_reset(ws, mark);
}

void moe_epilog_backward(Model *m, EpilogRec *r, Tensor dh) {
    op_rmsnorm_backward(dh, m->sg->norm, r->dhn, r->h, m->sw->norm, r->rstd, false,
                        &(RmsArgs){.one_plus = m->cfg.norm_1p});
}

// ---- HF layout hooks' helpers ----

const StTensor *hf_find(const StSet *hf, const char *name) {
    char n[160];
    snprintf(n, sizeof n, "model.%s", name);
    const StTensor *x = st_set_find(hf, n);
    return x ? x : st_set_find(hf, name);
}

void *hf_buffer(HfBuffers *k, size_t bytes) {
    if (k->n == k->cap) k->p = xrealloc(k->p, (k->cap = k->cap ? 2 * k->cap : 64) * sizeof *k->p);
    return k->p[k->n++] = xmalloc(bytes ? bytes : 1);
}

void hf_buffers_free(HfBuffers *k) {
    for (int i = 0; i < k->n; i++) free(k->p[i]);
    free(k->p);
    memset(k, 0, sizeof *k);
}
