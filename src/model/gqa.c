// gqa.c — grouped-query attention as Qwen3, GPT-OSS and Qwen3.5's full-attention layers run it (model.h, GqaShape):
// the q, k, v projections of the normed input, per-head RMSNorm of q and k, rotate-half RoPE, attention with the
// family's AttnArgs, o_proj; Qwen3.5's gate and GPT-OSS's sinks as options. Its records and parameters are laid
// out in the order the three families had them, so plans, checkpoints and initial values are unchanged.
#include <math.h>

#include "model/model.h"

void gqa_params(ParamTable *t, const GqaShape *s, int l, int64_t H) {
    int64_t nq = s->nh * s->d * (s->gated ? 2 : 1), nk = s->nkv * s->d;
#define P(suffix, init, nd, a, b) params_add_layer(t, l, "self_attn." suffix, init, nd, a, b)
    P("q_proj.weight", INIT_NORMAL, 2, nq, H);
    P("k_proj.weight", INIT_NORMAL, 2, nk, H);
    P("v_proj.weight", INIT_NORMAL, 2, nk, H);
    P("o_proj.weight", INIT_NORMAL_OUT, 2, H, s->nh * s->d);
    if (s->bias) {
        P("q_proj.bias", INIT_ZEROS, 1, nq, 0);
        P("k_proj.bias", INIT_ZEROS, 1, nk, 0);
        P("v_proj.bias", INIT_ZEROS, 1, nk, 0);
        P("o_proj.bias", INIT_ZEROS, 1, H, 0);
    }
    if (s->qk_norm != QK_NORM_NONE) { // 1 + w starts at w = 0
        int init = s->qk_norm == QK_NORM_1P ? INIT_ZEROS : INIT_ONES;
        P("q_norm.weight", init, 1, s->d, 0);
        P("k_norm.weight", init, 1, s->d, 0);
    }
    if (s->sinks) P("sinks", INIT_NORMAL, 1, s->nh, 0);
#undef P
}

void gqa_bind(Model *m, Tensor *flat, const GqaShape *s, int l, GqaWeights *w) {
    int64_t H = m->cfg.hidden, nq = s->nh * s->d * (s->gated ? 2 : 1), nk = s->nkv * s->d;
#define V(suffix, nd, a, b) model_view_layer(m, flat, l, "self_attn." suffix, nd, a, b)
    w->wq = V("q_proj.weight", 2, nq, H), w->bq = V("q_proj.bias", 1, nq, 0);
    w->wk = V("k_proj.weight", 2, nk, H), w->bk = V("k_proj.bias", 1, nk, 0);
    w->wv = V("v_proj.weight", 2, nk, H), w->bv = V("v_proj.bias", 1, nk, 0);
    w->wo = V("o_proj.weight", 2, H, s->nh * s->d), w->bo = V("o_proj.bias", 1, H, 0);
    w->qn = V("q_norm.weight", 1, s->d, 0), w->kn = V("k_norm.weight", 1, s->d, 0);
    w->sinks = V("sinks", 1, s->nh, 0);
#undef V
}

void gqa_alloc(GqaRec *r, const GqaShape *s, Arena *a, DType dt, int B, int S, bool rope, bool staged) {
    int64_t T = (int64_t)B * S, nh = s->nh, nkv = s->nkv, d = s->d;
    bool norm = s->qk_norm != QK_NORM_NONE;
    if (!staged) {
        memset(r, 0, sizeof *r);
        if (s->gated) r->qg = arena_tensor(a, dt, 3, T, nh, 2 * d, 0);
        if (s->gated || norm) r->qp = arena_tensor(a, dt, 3, T, nh, d, 0);
        if (s->gated) r->gate = arena_tensor(a, dt, 3, T, nh, d, 0);
        if (norm) {
            r->kp = arena_tensor(a, dt, 3, T, nkv, d, 0);
            r->rq = arena_tensor(a, DT_F32, 1, T * nh, 0, 0, 0);
            r->rk = arena_tensor(a, DT_F32, 1, T * nkv, 0, 0, 0);
        }
    }
    if ((rope && norm) == staged)
        r->q = arena_tensor(a, dt, 3, T, nh, d, 0), r->k = arena_tensor(a, dt, 3, T, nkv, d, 0);
    if (staged) return;
    r->v = arena_tensor(a, dt, 3, T, nkv, d, 0);
    if (s->sinks) r->sinks = arena_tensor(a, DT_F32, 1, nh, 0, 0, 0);
    r->att = arena_tensor(a, dt, 3, T, nh, d, 0);
    r->lse = arena_tensor(a, DT_F32, 3, B, nh, S, 0);
    if (s->gated) r->gated = arena_tensor(a, dt, 3, T, nh, d, 0);
}

void gqa_grad_alloc(GqaRec *r, const GqaShape *s, Arena *ws, DType dt, int B, int S) {
    int64_t T = (int64_t)B * S, nh = s->nh, nkv = s->nkv, d = s->d;
    bool norm = s->qk_norm != QK_NORM_NONE;
    if (s->gated) r->dqg = arena_tensor(ws, dt, 3, T, nh, 2 * d, 0);
    if (s->gated || norm) r->dqp = arena_tensor(ws, dt, 3, T, nh, d, 0);
    if (s->gated) r->dgate = arena_tensor(ws, dt, 3, T, nh, d, 0);
    if (norm) r->dkp = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->dq = arena_tensor(ws, dt, 3, T, nh, d, 0);
    r->dk = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->dv = arena_tensor(ws, dt, 3, T, nkv, d, 0);
    r->datt = arena_tensor(ws, dt, 3, T, nh, d, 0);
    if (s->gated) r->dgated = arena_tensor(ws, dt, 3, T, nh, d, 0);
}

// The per-head q/k norm (rows of d) of the shape's kind with the RoPE after it, one op each way (RmsArgs.cos): the
// forward turns y; the backward takes dy of the turned output (and may turn it back in place: the caller's scratch).
static RmsArgs qk_norm_args(const Model *m, const GqaShape *s, const MicroBatch *mb, int64_t R) {
    return (RmsArgs){.one_plus = s->qk_norm == QK_NORM_1P,
                     .cos = m->rope_cos,
                     .sin = m->rope_sin,
                     .pos = mb->pos,
                     .heads = (int)(R / mb->T)};
}
static void qk_norm_rope(const Model *m, const GqaShape *s, const MicroBatch *mb, Tensor y, Tensor rstd, Tensor x,
                         Tensor w) {
    int64_t R = tensor_numel(x) / s->d;
    RmsArgs a = qk_norm_args(m, s, mb, R);
    op_rmsnorm_forward(tensor_reshape2(y, R, s->d), rstd, tensor_reshape2(x, R, s->d), w, (float)m->cfg.eps, &a);
}
static void qk_norm_rope_backward(const Model *m, const GqaShape *s, const MicroBatch *mb, Tensor dx, Tensor dw,
                                  Tensor dy, Tensor x, Tensor w, Tensor rstd) {
    int64_t R = tensor_numel(x) / s->d;
    RmsArgs a = qk_norm_args(m, s, mb, R);
    op_rmsnorm_backward(tensor_reshape2(dx, R, s->d), dw, tensor_reshape2(dy, R, s->d), tensor_reshape2(x, R, s->d), w,
                        rstd, false, &a);
}

void gqa_qk_rope(Model *m, const GqaShape *s, const GqaWeights *W, GqaRec *r, const MicroBatch *mb) {
    if (s->qk_norm != QK_NORM_NONE) {
        qk_norm_rope(m, s, mb, r->q, r->rq, r->qp, W->qn), qk_norm_rope(m, s, mb, r->k, r->rk, r->kp, W->kn);
        return;
    }
    op_rope(r->q, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, false);
    op_rope(r->k, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, false);
}

void gqa_forward(Model *m, int l, const GqaShape *s, const GqaWeights *W, GqaRec *r, const MicroBatch *mb, Tensor n1,
                 Tensor out, AttnArgs aa) {
    int64_t T = mb->T, nh = s->nh, nkv = s->nkv, d = s->d;
    bool norm = s->qk_norm != QK_NORM_NONE;
    Tensor qp = norm || s->gated ? r->qp : r->q, kp = norm ? r->kp : r->k;
    if (s->gated) { // q_proj gives per head [q | gate]
        Tensor qg2 = tensor_reshape2(r->qg, T * nh, 2 * d);
        model_proj_forward(m, l, FP8_Q, tensor_reshape2(r->qg, T, nh * 2 * d), n1, W->wq, W->bq);
        op_copy_cols(tensor_reshape2(qp, T * nh, d), 0, qg2, 0, d, false);
        op_copy_cols(tensor_reshape2(r->gate, T * nh, d), 0, qg2, d, d, false);
    } else model_proj_forward(m, l, FP8_Q, tensor_reshape2(qp, T, nh * d), n1, W->wq, W->bq);
    model_proj_forward(m, l, FP8_K, tensor_reshape2(kp, T, nkv * d), n1, W->wk, W->bk);
    model_proj_forward(m, l, FP8_V, tensor_reshape2(r->v, T, nkv * d), n1, W->wv, W->bv);
    gqa_qk_rope(m, s, W, r, mb);
    if (s->sinks) op_copy(r->sinks, W->sinks), aa.sinks = r->sinks;       // the op reads fp32 sinks
    if (mb->docs) aa.docpos = mb->pos;                                    // document masking
    model_attention_forward(m, l, r->att, r->lse, r->q, r->k, r->v, &aa); // the op, a KV cache or the ring
    Tensor o = r->att;
    if (s->gated)
        op_sigmoid_gate_forward(tensor_reshape2(r->gated, T * nh, d), tensor_reshape2(r->att, T * nh, d),
                                tensor_reshape2(r->gate, T * nh, d)),
            o = r->gated;
    model_proj_forward(m, l, FP8_O, out, tensor_reshape2(o, T, nh * d), W->wo, W->bo);
}

void gqa_backward(Model *m, int l, const GqaShape *s, const GqaWeights *W, const GqaWeights *G, GqaRec *r,
                  const MicroBatch *mb, Tensor n1, Tensor dout, Tensor dn1, AttnArgs aa) {
    int64_t T = mb->T, nh = s->nh, nkv = s->nkv, d = s->d;
    bool norm = s->qk_norm != QK_NORM_NONE;
    Tensor o = s->gated ? r->gated : r->att, d_o = s->gated ? r->dgated : r->datt;
    model_proj_backward_input(m, l, FP8_O, tensor_reshape2(d_o, T, nh * d), dout, W->wo, false);
    model_proj_backward_weight(m, l, FP8_O, G->wo, G->bo, dout, tensor_reshape2(o, T, nh * d));
    if (s->gated)
        op_sigmoid_gate_backward(tensor_reshape2(r->datt, T * nh, d), tensor_reshape2(r->dgate, T * nh, d),
                                 tensor_reshape2(r->dgated, T * nh, d), tensor_reshape2(r->att, T * nh, d),
                                 tensor_reshape2(r->gate, T * nh, d), false);
    if (s->sinks) aa.sinks = r->sinks;
    if (mb->docs) aa.docpos = mb->pos;
    model_attention_backward(m, r->dq, r->dk, r->dv, s->sinks ? G->sinks : NONE, r->datt, r->q, r->k, r->v, r->att,
                             r->lse, &aa);
    Tensor dqp = r->dq, dkp = r->dk;
    if (norm) { // RoPE's backward inside the norms' (dq, dk their scratch)
        qk_norm_rope_backward(m, s, mb, r->dqp, G->qn, r->dq, r->qp, W->qn, r->rq), dqp = r->dqp;
        qk_norm_rope_backward(m, s, mb, r->dkp, G->kn, r->dk, r->kp, W->kn, r->rk), dkp = r->dkp;
    } else {
        op_rope(r->dq, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, true);
        op_rope(r->dk, 0, m->rope_cos, m->rope_sin, mb->pos, ROPE_HALF, true);
    }
    Tensor dq = tensor_reshape2(dqp, T, nh * d);
    if (s->gated) { // back into q_proj's per-head [q | gate] layout
        Tensor dqg2 = tensor_reshape2(r->dqg, T * nh, 2 * d);
        op_copy_cols(dqg2, 0, tensor_reshape2(r->dqp, T * nh, d), 0, d, false);
        op_copy_cols(dqg2, d, tensor_reshape2(r->dgate, T * nh, d), 0, d, false);
        dq = tensor_reshape2(r->dqg, T, nh * 2 * d);
    }
    Tensor dk = tensor_reshape2(dkp, T, nkv * d), dv = tensor_reshape2(r->dv, T, nkv * d);
    model_proj_backward_input(m, l, FP8_Q, dn1, dq, W->wq, false);
    model_proj_backward_input(m, l, FP8_K, dn1, dk, W->wk, true);
    model_proj_backward_input(m, l, FP8_V, dn1, dv, W->wv, true);
    model_proj_backward_weights(m, l, 3, (Fp8Slot[]){FP8_Q, FP8_K, FP8_V}, (Tensor[]){G->wq, G->wk, G->wv},
                                (Tensor[]){G->bq, G->bk, G->bv}, (Tensor[]){dq, dk, dv}, n1);
}

AttnArgs gqa_attn_args(const Model *m, const GqaShape *s, int B) {
    return (AttnArgs){.B = B,
                      .scale = (float)(1.0 / sqrt((double)s->d)),
                      .causal = true,
                      .window = s->window,
                      .deterministic = m->deterministic};
}
