// trainer.c — setup and the training step: zero grads → micro-batches (forward, backward) → scale by
// 1/(target tokens) so the gradient is exactly that of the mean token loss → global norm → clip →
// AdamW on the fp32 masters → refresh the compute copy.
#include "train/trainer.h"

#include <math.h>

static Tensor host_f32(int64_t n) { return tensor_make(xcalloc(n ? n : 1, sizeof(float)), DT_F32, DEV_CPU, 1, n, 1, 1, 1); }

void run_setup(Run *r, const TrainConfig *cfg, bool open_data) {
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    const TrainConfig *c = &r->cfg;
    if (c->parallel.pp * c->parallel.cp * c->parallel.ep != 1)
        die("%s: parallel: pipeline/context/expert parallel sizes above 1 need multi-rank training, which this build does not have yet",
            c->file);
    if (!strcmp(c->device, "cuda")) die("%s: device: \"cuda\" training is not available in this build yet", c->file);
    if (c->save_location[0] || c->save_interval) die("%s: save_location/save_interval: checkpoints are not available in this build yet", c->file);
    if (c->init_from[0]) die("%s: init_from: loading weights is not available in this build yet", c->file);
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, c->model);
    Model *m = &r->model;
    model_create(m, fam, &mc, DEV_CPU, DT_F32, c->sequence_length);
    m->lb_coef = c->moe_load_balance_coef;
    m->force_balance = c->benchmark;
    for (int l = 0; l < mc.layers; l++) r->moe_layers += mc.is_moe[l];
    for (int g = 0; g < NGROUPS; g++) {
        int64_t n = m->params.numel[g];
        r->master[g] = m->w[g]; // the CPU computes in fp32: the compute copy is the master
        params_init(&m->params, g, r->master[g].p, c->seed, c->init_std, mc.layers);
        r->adam_m[g] = host_f32(n), r->adam_v[g] = host_f32(n);
        r->param_bytes += 4 * (size_t)n * 4; // weights, gradients, two moments
    }
    r->plan = engine_plan(m, c->micro_batch_size, c->sequence_length);
    engine_init(&r->eng, m, c->micro_batch_size, c->sequence_length);
    int T = c->micro_batch_size * c->sequence_length;
    r->tokens = xmalloc(T * sizeof(int32_t)), r->labels = xmalloc(T * sizeof(int32_t));
    if (open_data) dataset_open(&r->data, c->dataset, c->sequence_length, mc.vocab, c->seed);
}

void run_free(Run *r) {
    engine_free(&r->eng);
    for (int g = 0; g < NGROUPS; g++) free(r->adam_m[g].p), free(r->adam_v[g].p);
    model_free(&r->model);
    if (r->data.files) dataset_close(&r->data);
    free(r->tokens), free(r->labels);
}

void run_microbatch(Run *r) {
    engine_forward(&r->eng, true);
    engine_backward(&r->eng);
}

StepStats run_step(Run *r) {
    const TrainConfig *c = &r->cfg;
    Model *m = &r->model;
    double t0 = now_seconds();
    int mbs = c->micro_batch_size, S = c->sequence_length, nmb = c->global_batch_size / mbs;
    model_zero_grads(m);
    op_zero(m->loss_sum), op_zero(m->lb_sum);
    int64_t targets = 0;
    for (int k = 0; k < nmb; k++) {
        for (int b = 0; b < mbs; b++) {
            int64_t index = (int64_t)r->step * c->global_batch_size + (int64_t)k * mbs + b; // spec §6.11 with one replica
            dataset_sample(&r->data, index, r->tokens + b * S, r->labels + b * S);
        }
        for (int t = 0; t < mbs * S; t++) targets += r->labels[t] != -100;
        engine_load(&r->eng, r->tokens, r->labels);
        run_microbatch(r);
    }
    if (targets < 1) targets = 1;
    StepStats st = {0};
    double ss = 0;
    for (int g = 0; g < NGROUPS; g++) {
        op_scale(m->g[g], (float)(1.0 / targets));
        ss += op_sum_squares(m->g[g]);
    }
    st.grad_norm = sqrt(ss);
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    if (c->clip_grad_norm > 0) {
        double coef = c->clip_grad_norm / (st.grad_norm + 1e-6);
        if (coef < 1)
            for (int g = 0; g < NGROUPS; g++) op_scale(m->g[g], (float)coef);
    }
    st.lr = c->optimizer.lr * config_lr_factor(c, r->step);
    r->step++;
    for (int g = 0; g < NGROUPS; g++)
        op_adamw(r->master[g], m->g[g], r->adam_m[g], r->adam_v[g], (float)st.lr, (float)c->optimizer.beta1,
                 (float)c->optimizer.beta2, (float)c->optimizer.eps, (float)c->optimizer.weight_decay, r->step);
    st.loss = op_read_scalar(m->loss_sum) / targets;
    st.lb = r->moe_layers && m->lb_coef > 0 ? op_read_scalar(m->lb_sum) / (m->lb_coef * r->moe_layers * nmb) : 0;
    st.tokens = (double)c->global_batch_size * S;
    st.seconds = now_seconds() - t0;
    return st;
}
