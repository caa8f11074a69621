// trainer.c — setup and the training step: zero grads → micro-batches (forward, backward) → scale by
// 1/(target tokens) so the gradient is exactly that of the mean token loss → global norm → clip →
// AdamW on the fp32 masters → refresh the compute copy.
#include "train/trainer.h"

#include "train/ckpt.h"

#include <math.h>

static Tensor host_f32(int64_t n) { return tensor_make(xcalloc(n ? n : 1, sizeof(float)), DT_F32, DEV_CPU, 1, n, 1, 1, 1); }

static Tensor device_f32(int64_t n) {
    Arena a = arena_create("optimizer state", DEV_CUDA, (size_t)n * sizeof(float)); // owned by the run
    return tensor_make(a.base, DT_F32, DEV_CUDA, 1, n, 1, 1, 1);
}

static void tensor_free(Tensor t) {
    Arena a = {t.p, 0, tensor_bytes(t), 0, t.dev, ""};
    if (t.dev == DEV_CPU) free(t.p);
    else if (a.cap) arena_destroy(&a);
}

void run_setup(Run *r, const TrainConfig *cfg, bool open_data) {
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    const TrainConfig *c = &r->cfg;
    if (c->parallel.pp * c->parallel.cp * c->parallel.ep != 1)
        die("%s: parallel: pipeline/context/expert parallel sizes above 1 need multi-rank training, which this build does not have yet",
            c->file);
    Device dev = DEV_CPU;
    if (!strcmp(c->device, "cuda") || (!strcmp(c->device, "auto") && ops_cuda_available())) {
        if (!ops_cuda_available()) die("%s: device: \"cuda\" asked for, but %s", c->file, "this machine has no usable GPU or this build has no CUDA backend");
        dev = DEV_CUDA;
    }
    DType cdt = dev == DEV_CUDA && !strcmp(c->compute_dtype, "bf16") ? DT_BF16 : DT_F32;
    if (c->save_interval && !c->save_location[0]) die("%s: save_interval: needs save_location", c->file);
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, c->model);
    Model *m = &r->model;
    model_create(m, fam, &mc, dev, cdt, c->sequence_length);
    m->lb_coef = c->moe_load_balance_coef;
    m->force_balance = c->benchmark;
    for (int l = 0; l < mc.layers; l++) r->moe_layers += mc.is_moe[l];
    for (int g = 0; g < NGROUPS; g++) {
        int64_t n = m->params.numel[g];
        // Initial values are drawn on the host; on the GPU they go to the fp32 master and its compute copy.
        Tensor init = host_f32(n);
        params_init(&m->params, g, init.p, c->seed, c->init_std, mc.layers);
        if (dev == DEV_CPU) {
            r->master[g] = m->w[g]; // the CPU computes in fp32: the compute copy is the master
            op_copy(r->master[g], init);
            r->adam_m[g] = host_f32(n), r->adam_v[g] = host_f32(n);
        } else {
            r->master[g] = device_f32(n), r->adam_m[g] = device_f32(n), r->adam_v[g] = device_f32(n);
            op_copy(r->master[g], init);
            op_copy(m->w[g], r->master[g]);
            op_zero(r->adam_m[g]), op_zero(r->adam_v[g]);
            r->param_bytes += (size_t)n * (4 + dtype_size(cdt)); // separate master + compute copy
        }
        free(init.p);
        r->param_bytes += 3 * (size_t)n * 4; // gradients and two moments
    }
    r->plan = engine_plan(m, c->micro_batch_size, c->sequence_length);
    engine_init(&r->eng, m, c->micro_batch_size, c->sequence_length);
    int T = c->micro_batch_size * c->sequence_length;
    r->tokens = xmalloc(T * sizeof(int32_t)), r->labels = xmalloc(T * sizeof(int32_t));
    if (open_data) dataset_open(&r->data, c->dataset, c->sequence_length, mc.vocab, c->seed);
    // Automatic resume from the newest complete checkpoint; else the initial weights of init_from.
    char latest[4200];
    if (c->save_location[0] && ckpt_find_latest(c->save_location, latest, sizeof latest)) ckpt_resume(r, latest);
    else if (c->init_from[0]) ckpt_init_from(r, c->init_from);
}

bool run_save_due(const Run *r) {
    const TrainConfig *c = &r->cfg;
    return c->save_location[0] && ((c->save_interval && r->step % c->save_interval == 0) || r->step == c->max_steps);
}

void run_free(Run *r) {
    engine_free(&r->eng);
    for (int g = 0; g < NGROUPS; g++) {
        tensor_free(r->adam_m[g]), tensor_free(r->adam_v[g]);
        if (r->master[g].p != r->model.w[g].p) tensor_free(r->master[g]);
    }
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
    ops_sync();
    st.fwdbwd_seconds = now_seconds() - t0;
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
    for (int g = 0; g < NGROUPS; g++)
        if (r->master[g].p != m->w[g].p) op_copy(m->w[g], r->master[g]); // refresh the compute copy (bf16 on the GPU)
    ops_sync();
    st.loss = op_read_scalar(m->loss_sum) / targets;
    st.lb = r->moe_layers && m->lb_coef > 0 ? op_read_scalar(m->lb_sum) / (m->lb_coef * r->moe_layers * nmb) : 0;
    st.tokens = (double)c->global_batch_size * S;
    st.seconds = now_seconds() - t0;
    return st;
}
