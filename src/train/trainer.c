// trainer.c — setup and the training step: gather compute copies → zero grads → this rank's micro-batches
// (forward, backward) → reduce-scatter the gradients into shards → scale by 1/(global target tokens) so
// the gradient is exactly that of the global mean token loss under every layout → global norm → clip →
// AdamW on the fp32 master shards.
#include "train/trainer.h"

#include "train/ckpt.h"
#include "train/router_bias.h"

#include <math.h>

size_t memory_plan_total(const MemoryPlan *p) {
    return p->weights + p->grads + p->shards + p->optim + p->other + p->chunks.act_bytes + p->chunks.ws_bytes +
           p->chunks.comm_bytes + p->pipe;
}

static Device pick_device(const TrainConfig *c) {
    if (c->device == DEVICE_CUDA || (c->device == DEVICE_AUTO && ops_cuda_available())) {
        if (!ops_cuda_available())
            die("%s: device: \"cuda\" asked for, but %s", c->file,
                "this machine has no usable GPU or this build has no CUDA backend");
        return DEV_CUDA;
    }
    return DEV_CPU;
}

// A sequence longer than the model's max_position_embeddings trains positions its RoPE was not made for:
// allowed (RoPE extrapolates), said once.
static void warn_long_sequence(const TrainConfig *c) {
    char file[PATH_MAX_LEN + 16];
    path_in_folder(file, sizeof file, c->model, "config.json");
    json_error_t jerr;
    json_t *root = json_read_file(file, 0, &jerr);
    json_t *mp = root ? json_object_get(root, "max_position_embeddings") : NULL;
    if (mp && json_is_integer(mp) && c->sequence_length > json_integer_value(mp))
        warn("%s: sequence_length %d is above the model's max_position_embeddings %lld (%s)", c->file,
             c->sequence_length, (long long)json_integer_value(mp), file);
    json_decref(root);
}

// Micro-batches of one step on each data replica (and so through each pipeline).
static int microbatches(const TrainConfig *c, const Dist *d) {
    return c->global_batch_size / (c->micro_batch_size * d->dp * d->ep);
}

// The step runs through the DualPipeV engine: with a pipeline, or at pp = 1 when parallel.pipeline_schedule
// asks for it (two chunks on the one rank, for measuring the engine against the plain step).
static bool piped(const TrainConfig *c, const Dist *d) { return d->pp > 1 || c->parallel.pipeline_schedule; }

// The model config with this rank's layout: its layers (pipeline), its experts and the padding FSDP needs.
static const ModelFamily *layout_config(const TrainConfig *c, const Dist *d, ModelConfig *mc) {
    if (c->global_batch_size % (c->micro_batch_size * d->dp * d->ep))
        die("%s: global_batch_size: must be a multiple of micro_batch_size × dp × ep = %d × %d × %d = %d (got %d)",
            c->file, c->micro_batch_size, d->dp, d->ep, c->micro_batch_size * d->dp * d->ep, c->global_batch_size);
    const ModelFamily *fam = model_config_load(mc, c->model);
    if (mc->experts % d->ep)
        die("%s: parallel.expert_parallel_size: %d does not divide the model's %d experts", c->file, d->ep,
            mc->experts);
    char why_cp[256];
    if (ring_check(&mc->ring, mc->model_type, c->sequence_length, d->cp, why_cp, sizeof why_cp))
        die("%s: parallel.context_parallel_size: %s", c->file, why_cp);
    if (piped(c, d)) {
        const char *why = dualpipev_check(d->pp, 2 * d->pp, mc->layers);
        if (why) die("%s: parallel.pipeline_parallel_size: %s", c->file, why);
        if ((why = dualpipev_check(d->pp, microbatches(c, d), mc->layers)))
            die("%s: global_batch_size: %s (global_batch_size / (micro_batch_size × dp × ep) = %d / (%d × %d × %d))",
                c->file, why, c->global_batch_size, c->micro_batch_size, d->dp, d->ep);
    }
    mc->pp_rank = d->pp_g.rank, mc->pp_size = d->pp;
    mc->ep_rank = d->ep_g.rank, mc->ep_size = d->ep;
    mc->cp_size = d->cp;
    for (int g = 0; g < NGROUPS; g++) mc->pad[g] = fsdp_shards(d, g);
    mc->grad_dt[GROUP_EXPERT] = c->gradient_dtype == STATE_BF16 ? DT_BF16 : DT_F32;
    // FP8 reads the experts' weights only through the weight cache, so unsharded they need no compute copy of their
    // own: the cache is made from the fp32 master, which the copy becomes (fsdp_alloc_state).
    mc->w_f32[GROUP_EXPERT] = c->fp8 && mc->pad[GROUP_EXPERT] == 1;
    mc->grad_units = c->parallel.gradient_reduce == GRAD_REDUCE_LAYER;
    if (mc->grad_units && mc->pad[GROUP_DENSE] == 1)
        die("%s: parallel.gradient_reduce: \"layer\" needs the dense parameters sharded over more than one rank (dp × "
            "cp × ep, or cp × ep under hsdp, is 1 here)",
            c->file);
    return fam;
}

static void model_layout(Model *m, const TrainConfig *c, const Dist *d) {
    m->lb_coef = c->moe_load_balance_coef;
    m->force_balance = c->benchmark;
    m->deterministic = c->deterministic;
    m->ep = &d->ep_g;
    m->ep_capacity = c->parallel.ep_capacity_factor;
    m->ep_drop = c->parallel.ep_drop_tokens;
    m->recompute = c->recompute;
    m->logits_bytes = (int64_t)c->logits_chunk_mb << 20;
    m->delta_keep = c->delta_rule_keep;
}

// cp > 1: the scratch of one ring attention call (the zigzag halves of a micro-batch's sequences), or of a Gated
// DeltaNet layer's layout, halo and state passes, whichever is larger.
static size_t ring_plan(const Model *m, const TrainConfig *c, const Dist *d) {
    if (d->cp == 1) return 0;
    return ring_plan_bytes(&m->cfg.ring, m->cfg.hidden, m->dev, m->cdt, c->micro_batch_size,
                           c->sequence_length / d->cp);
}

// Bytes of everything but the engine, from the model's tensors and the counted state arena (which also
// holds Muon's scratch, when Muon runs), and ring attention's scratch.
// With optimizer.offload the moments are host memory (MemoryPlan.host) and the state arena holds their staging.
static MemoryPlan plan_of(const Run *r, size_t state_bytes) {
    const Model *m = &r->model;
    MemoryPlan p = {0};
    bool offload = r->stage[0].nd > 0;
#define ROUNDED(t) ((tensor_bytes(t) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN)
    if (r->muon.on) p.optim += ROUNDED(r->muon.ws);
    // parallel.gradient_reduce "layer": no whole dense gradient; its shard and windows, from the state arena
    size_t units = r->fsdp.units ? ROUNDED(r->grad[GROUP_DENSE]) + ROUNDED(r->units.win[0]) + ROUNDED(r->units.win[1]) +
                                       ROUNDED(r->units.win[2])
                                 : 0;
    p.grads = units;
    for (int g = 0; g < NGROUPS; g++) {
        p.weights += tensor_bytes(m->w[g]);
        p.grads += m->cfg.grad_units && g == GROUP_DENSE ? 0 : tensor_bytes(m->g[g]);
        *(offload ? &p.host : &p.optim) += ROUNDED(r->adam_m[g]) + ROUNDED(r->adam_v[g]);
    }
    p.fp8 = m->fp8.on ? tensor_bytes(m->fp8.w) : 0; // the FP8 weight cache beside the compute copy
    p.master_experts = m->cfg.w_f32[GROUP_EXPERT];  // (unsharded: fsdp_alloc_state makes the master that copy)
    p.weights += p.fp8;
    if (offload) p.optim += ROUNDED(r->stage[0]) + ROUNDED(r->stage[1]);
#undef ROUNDED
    p.shards = state_bytes > p.optim + units ? state_bytes - p.optim - units : 0;
    p.other = tensor_bytes(m->rope_cos) + tensor_bytes(m->rope_sin) + 3 * sizeof(double) // and StepSums' three sums
              + (r->cfg.moe_router_bias_update_rate > 0 ? (size_t)m->cfg.layers * m->cfg.experts * sizeof(double) : 0) +
              ring_plan(m, &r->cfg, &r->dist);
    p.snapshot = r->cfg.checkpoint.async ? ckpt_snapshot_bytes(r) : 0;
    return p;
}

static DType moment_dtype(const TrainConfig *c) { return c->optimizer.state_dtype == STATE_BF16 ? DT_BF16 : DT_F32; }

// optimizer.offload: the step streams the host-resident moments through two (chunk) device buffers in the moments'
// dtype, one chunk of m and of v at a time (chunk: 2^26 elements, or PITH_OFFLOAD_CHUNK for tests, or the largest
// shard if smaller).
// Without offload none (zero-size tensors).
static void offload_stage_alloc(const TrainConfig *c, const Fsdp *f, Arena *a, Tensor stage[2]) {
    stage[0] = stage[1] = (Tensor){0};
    if (!c->optimizer.offload) return;
    int64_t chunk = 1 << 26, most = 1;
    const char *env = getenv("PITH_OFFLOAD_CHUNK");
    if (env && atoll(env) > 0) chunk = atoll(env);
    for (int g = 0; g < NGROUPS; g++) most = f->len[g] > most ? f->len[g] : most;
    chunk = chunk < most ? chunk : most;
    for (int i = 0; i < 2; i++) stage[i] = arena_tensor(a, moment_dtype(c), 1, chunk, 0, 0, 0);
}

// The optimizer state, in one order from `state` (the moments from `host` under optimizer.offload):
// parallel.gradient_reduce "layer"'s windows, master and gradient shards, moments, offload's staging, Muon's scratch
// (its momentum lives in adam_m) and aux-loss-free balancing's selection bias, (layers, E) fp32 (none when its rate
// is 0).
static void state_alloc(Run *r, Arena *state, Arena *host) {
    const TrainConfig *c = &r->cfg;
    Model *m = &r->model;
    if (r->fsdp.units) grad_units_alloc(&r->units, m, &r->fsdp, state);
    fsdp_alloc_state(&r->fsdp, m->w, m->g, state, c->optimizer.offload ? host : state, moment_dtype(c), r->master,
                     r->grad, r->adam_m, r->adam_v);
    r->units.shard = r->grad[GROUP_DENSE];
    offload_stage_alloc(c, &r->fsdp, state, r->stage);
    if (c->optimizer.type == OPTIMIZER_MUON) muon_setup(&r->muon, &m->params, state);
    m->router_bias = c->moe_router_bias_update_rate > 0
                         ? arena_tensor(state, DT_F32, 2, m->cfg.layers, m->cfg.experts, 0, 0)
                         : (Tensor){0};
}

// ---- this rank's chunks and the pipeline ----
// pp = 1: the whole model with one record. Piped: this pipeline rank's DualPipeV schedules (a step's, and
// validation's: forward only); phase p's chunk, with record slots enough for either schedule and the step's
// deferred sets (the two share a workspace and read and write the pipeline's buffers in place: chunk_init_rank);
// both schedules' pipeline buffers in one region, r->pipe_mem (a step and a validation never run at once).
// With plan only their plans (r->plan.chunks: the sum over the rank's chunks; r->plan.pipe).
static void engine_setup(Run *r, bool plan) {
    const TrainConfig *c = &r->cfg;
    const Dist *d = &r->dist;
    Model *m = &r->model;
    PipeSchedule *s = r->sched;
    int B = c->micro_batch_size, S = c->sequence_length / d->cp, L = m->cfg.layers;
    if (!piped(c, d)) {
        if (!plan) chunk_init_model(&r->chunk[0], m, &r->sums, B, S);
        r->chunk[0].units = m->cfg.grad_units ? &r->units : NULL;
        r->plan.chunks = chunk_plan(m, B, S, 0, L, 1, 0);
        return;
    }
    for (int i = 0; i < 2; i++) dualpipev_build(&s[i], d->pp, microbatches(c, d), d->pp_g.rank, i == 1);
    ChunkShape sh[2];
    for (int p = 0; p < 2; p++) {
        int k = dualpipev_chunk(d->pp, d->pp_g.rank, p), n = L / (2 * d->pp);
        int nrec =
            s[0].slots[PIPE_REC][p] > s[1].slots[PIPE_REC][p] ? s[0].slots[PIPE_REC][p] : s[1].slots[PIPE_REC][p];
        sh[p] = (ChunkShape){k * n, (k + 1) * n, nrec, s[0].max_deferred_of[p]};
    }
    if (!plan) chunk_init_rank(r->chunk, m, &r->sums, B, S, sh);
    r->plan.chunks = chunk_plan_rank(m, B, S, sh);
    Arena count = arena_counting("pipeline buffers", m->dev), *a = &count;
    for (int pass = 0; pass < (plan ? 1 : 2); pass++) {
        if (pass == 1) r->pipe_mem = arena_create(count.name, m->dev, count.peak), a = &r->pipe_mem;
        for (int i = 0; i < 2; i++) {
            arena_reset(a, 0);
            dualpipev_run_init(&r->pipe[i], &s[i], &d->pp_g, a, m->cdt, (int64_t)B * S, m->cfg.hidden);
            if (pass == 0) dualpipev_run_free(&r->pipe[i]);
        }
    }
    r->plan.pipe = count.peak;
}

// Host memory of a run on dev, page-locked on the GPU so that copies to and from it run at the link's speed.
static Arena host_arena(const char *name, Device dev, size_t cap) {
    Arena a = arena_create(name, DEV_CPU, cap);
    if (dev == DEV_CUDA && host_register && cap) host_register(a.base, cap);
    return a;
}

static void host_arena_free(Arena *a, Device dev) {
    if (dev == DEV_CUDA && host_unregister && a->cap) host_unregister(a->base);
    arena_destroy(a);
}

// The sequence the run and its memory plan share, so `pith estimate` cannot drift from `pith train`: the model
// of this rank's layout, the optimizer state counted and then allocated, the chunks and the pipeline buffers.
// With plan nothing is allocated (the model is described: shapes only; every arena counts); r->plan is the plan.
static void setup_rank(Run *r, Device dev, bool plan) {
    const TrainConfig *c = &r->cfg;
    Dist *d = &r->dist;
    Model *m = &r->model;
    ModelConfig mc;
    const ModelFamily *fam = layout_config(c, d, &mc);
    if (!plan && d->world.rank == 0) warn_long_sequence(c);
    (plan ? model_describe : model_create)(m, fam, &mc, dev, compute_dt(dev, c->compute_dtype), c->sequence_length);
    model_layout(m, c, d);
    if (c->fp8) model_fp8_setup(m);
    // The run's alone: FP8's rounding warning, ring attention (before anything reads the layout: the load
    // balancing's sums, the chunks' positions) and the load balancing's form.
    if (!plan) {
        if (c->fp8 && d->world.rank == 0) model_fp8_warn_rounded(m, c->file);
        if (d->cp > 1) ring_init(&r->ring, &d->cp_g, dev, ring_plan(m, c, d)), m->ring = &r->ring;
        model_lb_setup(m, c->moe_load_balance_type, &d->dp_ep, c->micro_batch_size * c->sequence_length / d->cp);
    }
    for (int l = 0; l < mc.layers; l++) r->moe_layers += mc.is_moe[l];
    fsdp_setup(&r->fsdp, d, m->w, mc.grad_units);
    Arena count = arena_counting("parameter shards and optimizer state", dev),
          host = arena_counting("offloaded optimizer state", DEV_CPU);
    state_alloc(r, &count, &host);
    if (!plan) { // arenas of the counted sizes; the moments pinned, so the step's copies run at the link's speed
        muon_free(&r->muon);
        r->state = arena_create(count.name, dev, count.peak);
        if (c->optimizer.offload) r->offload = host_arena(host.name, dev, host.peak);
        state_alloc(r, &r->state, &r->offload);
    }
    r->plan = plan_of(r, count.peak);
    if (!plan && c->checkpoint.async) r->snapshot = host_arena("checkpoint snapshot", dev, r->plan.snapshot);
    engine_setup(r, plan);
}

MemoryPlan run_memory_plan(const TrainConfig *c, const Dist *d, Device dev) {
    Run *r = xcalloc(1, sizeof *r);
    r->cfg = *c, r->dist = *d;
    setup_rank(r, dev, true);
    MemoryPlan p = r->plan;
    muon_free(&r->muon);
    if (piped(c, d)) dualpipev_free(&r->sched[0]), dualpipev_free(&r->sched[1]);
    model_free(&r->model);
    free(r);
    return p;
}

void run_setup(Run *r, const TrainConfig *cfg, bool open_data) {
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    const TrainConfig *c = &r->cfg;
    Dist *d = &r->dist;
    dist_mesh_init(d, c->parallel.pp, c->parallel.cp, c->parallel.ep, c->parallel.sharding == SHARD_HSDP,
                   c->parallel.timeout_s, c->file);
    Device dev = pick_device(c);
    if (c->cuda_graph && (dev != DEV_CUDA || d->world.size > 1))
        die("%s: cuda_graph: records one GPU's forward and backward; this run has %s", c->file,
            dev != DEV_CUDA ? "no GPU (device: the CPU)" : "more than one rank");
    if (dev == DEV_CUDA) dist_mesh_gpu(d); // one GPU per rank and NCCL communicators, before anything touches the GPU
    setup_rank(r, dev, false);
    Model *m = &r->model;
    const ModelConfig *mc = &m->cfg;
    if (m->router_bias.p) {
        op_zero(m->router_bias);
        r->router_bias = xcalloc((size_t)mc->layers * mc->experts, sizeof(float));
        r->router_load = xcalloc((size_t)mc->layers * mc->experts, sizeof(double));
    }
    step_sums_create(&r->sums, m, true);
    for (int g = 0; g < NGROUPS; g++) {
        // Initial values are drawn on the host for the whole group (they do not depend on the layout);
        // this rank keeps its shard.
        float *init = xcalloc(r->fsdp.numel[g] + 1, sizeof(float));
        params_init(&m->params, g, init, c->seed, c->init_std, mc->layers);
        fsdp_take_shard(&r->fsdp, g, r->master[g], init);
        free(init);
        op_zero(r->adam_m[g]), op_zero(r->adam_v[g]);
        fsdp_gather(&r->fsdp, g, m->w[g], r->master[g]);
    }
    int T = c->micro_batch_size * c->sequence_length;
    r->staging = host_arena("micro-batch staging", m->dev, 3 * (T * sizeof(int32_t) + ARENA_ALIGN));
    r->tokens = arena_tensor(&r->staging, DT_I32, 1, T, 0, 0, 0).p,
    r->labels = arena_tensor(&r->staging, DT_I32, 1, T, 0, 0, 0).p;
    r->docpos = c->document_masking ? arena_tensor(&r->staging, DT_I32, 1, T, 0, 0, 0).p : NULL;
    if (open_data) dataset_open_config(&r->data, c, mc->vocab);
    if (open_data && c->validation.batches) {
        // Validation reads the first `batches` global batches of its data in file order, the same every time.
        dataset_open(&r->val, c->validation.dataset, c->sequence_length, mc->vocab, c->seed);
        r->val.ordered = true;
        int64_t need = (int64_t)c->validation.batches * c->global_batch_size;
        if (need > r->val.total)
            die("%s: validation.batches: %d global batches of %d samples need %lld samples; %s holds %lld", c->file,
                c->validation.batches, c->global_batch_size, (long long)need, c->validation.dataset,
                (long long)r->val.total);
    }
    // Automatic resume from the newest complete checkpoint; else the initial weights of init_from. Rank 0
    // looks first: it removes the temporary folder of a save that did not finish.
    char latest[4200];
    bool found = false;
    if (d->world.rank == 0 && c->save_location[0]) ckpt_lock(c->save_location, "save_location");
    if (c->save_location[0]) {
        if (d->world.rank == 0) found = ckpt_find_latest(c->save_location, latest, sizeof latest, true);
        comm_barrier(&d->world);
        if (d->world.rank != 0) found = ckpt_find_latest(c->save_location, latest, sizeof latest, false);
    }
    if (found) ckpt_resume(r, latest);
    else if (c->init_from[0]) ckpt_init_from(r, c->init_from);
}

bool run_save_due(const Run *r) {
    const TrainConfig *c = &r->cfg;
    return c->save_location[0] && ((c->save_interval && r->step % c->save_interval == 0) || r->step == c->max_steps);
}

void run_free(Run *r) {
    ckpt_unlock();
    ops_graph_free(r->graph[0]), ops_graph_free(r->graph[1]);
    for (int p = 0; p < 2; p++)
        if (r->chunk[p].m) chunk_free(&r->chunk[p]);
    if (piped(&r->cfg, &r->dist)) {
        for (int i = 0; i < 2; i++) dualpipev_run_free(&r->pipe[i]), dualpipev_free(&r->sched[i]);
        arena_destroy(&r->pipe_mem);
    }
    muon_free(&r->muon), grad_units_free(&r->units);
    if (r->ring.cp) ring_free(&r->ring);
    free(r->router_bias), free(r->router_load), step_sums_free(&r->sums);
    host_arena_free(&r->offload, r->state.dev), host_arena_free(&r->snapshot, r->state.dev);
    host_arena_free(&r->staging, r->model.dev);
    if (r->state.cap) arena_destroy(&r->state);
    model_free(&r->model);
    if (r->data.files) dataset_close(&r->data);
    if (r->val.files) dataset_close(&r->val);
    dist_mesh_free(&r->dist);
}

// Loads micro-batch `acc` of this rank for global batch `batch` of ds into record slot `slot` of chunk c;
// returns its target count. Data replicas are the (dp, ep) pairs (docs/reference.md §18): replica q reads
// rows batch·GBS + q·mbs + acc·mbs·D + off of the global batch, D = dp·ep replicas, acc < GBS/(mbs·D).
// The cp ranks of a replica read the same samples and keep their zigzag chunks of each.
static int64_t load_microbatch(Run *r, Dataset *ds, int64_t batch, int acc, Chunk *c, int slot) {
    const TrainConfig *cf = &r->cfg;
    const Dist *d = &r->dist;
    int mbs = cf->micro_batch_size, S = cf->sequence_length, D = d->dp * d->ep, q = d->dp_g.rank * d->ep + d->ep_g.rank;
    int64_t targets = 0;
    ops_uploads_wait(); // the previous micro-batch's copies made: its host arrays are free
    for (int b = 0; b < mbs; b++) {
        int64_t index = batch * cf->global_batch_size + (int64_t)q * mbs + (int64_t)acc * mbs * D + b;
        dataset_sample_docs(ds, index, r->tokens + b * S, r->labels + b * S, r->docpos ? r->docpos + b * S : NULL);
    }
    dataset_zigzag(r->tokens, mbs, S, d->cp, d->cp_g.rank), dataset_zigzag(r->labels, mbs, S, d->cp, d->cp_g.rank);
    if (r->docpos) dataset_zigzag(r->docpos, mbs, S, d->cp, d->cp_g.rank);
    for (int t = 0; t < mbs * (S / d->cp); t++) targets += r->labels[t] != -100;
    chunk_upload(c, slot, r->tokens, r->labels, r->docpos);
    return targets;
}

// ---- the pipeline's chunk computes (dualpipev_run, pp > 1) ----
// One pass of the pipeline over a global batch: the context dualpipev_run hands the chunk computes. The model's
// first chunk (the embedding) and its last (the loss) read micro-batch mb of the global batch; the last counts
// its targets; under document masking every chunk reads its micro-batch (its attention needs the documents).
typedef struct {
    Run *r;
    Dataset *ds;     // the data
    int64_t batch;   // the global batch of ds
    int64_t targets; // the target tokens the model's last chunk loaded
    bool grad;       // keep activations for a backward
} PipePass;

static Chunk *pipe_load(PipePass *pass, int p, int mb, int slot) {
    Chunk *c = &pass->r->chunk[p];
    bool last = c->l1 == pass->r->model.cfg.layers;
    if (c->l0 == 0 || last || pass->r->docpos) {
        int64_t targets = load_microbatch(pass->r, pass->ds, pass->batch, mb, c, slot);
        if (last) pass->targets += targets;
    }
    return c;
}

static void pipe_forward(void *ctx, int p, int mb, int slot, Tensor x, Tensor y) {
    chunk_pipe_forward(pipe_load(ctx, p, mb, slot), slot, x, y, ((PipePass *)ctx)->grad);
}

static void pipe_backward(void *ctx, int p, int mb, int slot, Tensor dy, Tensor dx, bool defer) {
    chunk_pipe_backward(&((PipePass *)ctx)->r->chunk[p], slot, dy, dx, defer);
}

static void pipe_pair(void *ctx, int fp, int fmb, int fslot, Tensor x, Tensor y, int bp, int bmb, int bslot, Tensor dy,
                      Tensor dx) {
    chunk_pipe_pair(pipe_load(ctx, fp, fmb, fslot), fslot, x, y, &((PipePass *)ctx)->r->chunk[bp], bslot, dy, dx);
}

static void pipe_weight(void *ctx, int p, int mb, int slot) { chunk_weight(&((PipePass *)ctx)->r->chunk[p], slot); }

// cuda_graph (docs/architecture.md, "CUDA graphs"): micro-batch acc's forward and backward as one launch of a recording
// of them. A step's first micro-batch writes the expert and LM-head gradients and the others add to them, so they are
// two recordings, [1] made in the same step as [0] (the host's flags of what is written are right only there; both go
// stale at once). They are made once GRAPH_EAGER_STEPS steps have sized every buffer the backend grows on first use,
// and again when the backend replaced memory they point into. Recording [0] marks the FP8 weight cache stale first, so
// that every launch of it remakes the cache from the step's weights.
#define GRAPH_EAGER_STEPS 2
static void microbatch_graph(Run *r, int acc, bool *recorded) {
    OpsGraph **g = &r->graph[acc > 0];
    if (*g && ops_graph_run(*g)) return;
    CHECK(acc == 0 || *recorded);
    ops_graph_free(*g);
    if (acc == 0) r->model.fp8.version++, *recorded = true;
    r->recorded++;
    ops_graph_begin();
    chunk_forward(&r->chunk[0], 0, true), chunk_backward(&r->chunk[0], 0, false);
    *g = ops_graph_end();
    CHECK(ops_graph_run(*g));
}

// Every micro-batch of this rank for global batch `batch` of ds: forward (and with grad, backward) one
// after another at pp = 1, through the DualPipeV schedule (a step's, or forward-only) at pp > 1. Returns
// the target tokens this rank's loss covers (none on pipeline ranks other than 0).
static int64_t run_microbatches(Run *r, Dataset *ds, int64_t batch, bool grad) {
    int64_t targets = 0;
    if (!piped(&r->cfg, &r->dist)) {
        bool graph = grad && r->cfg.cuda_graph && r->eager_steps >= GRAPH_EAGER_STEPS, recorded = false;
        for (int acc = 0; acc < microbatches(&r->cfg, &r->dist); acc++) {
            targets += load_microbatch(r, ds, batch, acc, &r->chunk[0], 0);
            if (graph) {
                microbatch_graph(r, acc, &recorded);
                continue;
            }
            chunk_forward(&r->chunk[0], 0, grad);
            if (grad) chunk_backward(&r->chunk[0], 0, false); // ∂(Σ CE + T·Σ lb)/∂θ added to the gradient buffers
        }
        r->eager_steps += grad && !graph;
        return targets;
    }
    PipePass pass = {r, ds, batch, 0, grad};
    dualpipev_run(&r->pipe[grad ? 0 : 1], &(PipeChunks){&pass, pipe_forward, pipe_backward, pipe_weight, pipe_pair});
    return pass.targets;
}

// Sums over the global batch, all-reduced over the world as one array of doubles: every rank of the stage holds
// different tokens, every pipeline rank different layers (the cross-entropy and the target count only pipeline
// rank 0).
typedef struct {
    double loss, lb, targets; // Σ token cross-entropy, Σ load-balancing loss, the target tokens of the loss
    double ep_over;           // the rows above the expert capacity, of this rank's layers
    double busy_s, pipe_s;    // this rank's seconds in chunk computes and in the pipeline (the engine's; else 0)
} Sums;
_Static_assert(sizeof(Sums) == 6 * sizeof(double), "Sums is all-reduced as an array of doubles");

static void sums_allreduce(const Dist *d, Sums *s) {
    comm_allreduce(&d->world, tensor_make(s, DT_F64, DEV_CPU, 1, sizeof *s / sizeof(double), 1, 1, 1), COMM_SUM);
}

// The target tokens of the global batch, at least 1 (the divisor of the mean loss and the gradient).
static double sums_targets(const Sums *s) { return s->targets < 1 ? 1 : s->targets; }

double run_validate(Run *r) {
    const TrainConfig *c = &r->cfg;
    Model *m = &r->model;
    step_sums_begin(&r->sums, m);
    Sums s = {0};
    for (int b = 0; b < c->validation.batches; b++) {
        step_sums_lb_begin(&r->sums, m); // global-batch load balancing counts per global batch, as in a step
        s.targets += (double)run_microbatches(r, &r->val, b, false);
    }
    s.loss = op_read_scalar(r->sums.loss_sum);
    sums_allreduce(&r->dist, &s);
    return s.loss / sums_targets(&s);
}

// Aux-loss-free balancing, once per step: the global batch's expert counts (StepSums.router_load, counted on the
// model's device and read here once, summed over the stage) move each MoE layer's bias by rate · sign(mean − load_e)
// (train/router_bias.h).
static void run_router_bias_update(Run *r) {
    Model *m = &r->model;
    int L = m->cfg.layers, E = m->cfg.experts;
    Tensor load = tensor_make(r->router_load, DT_F64, DEV_CPU, 2, L, E, 1, 1);
    op_copy(load, r->sums.router_load);
    // Every rank of the stage routed different tokens of the global batch, every pipeline rank its own
    // layers (the others' counts are zero there): the sum over the world is the global count of each layer.
    comm_allreduce(&r->dist.world, load, COMM_SUM);
    for (int l = 0; l < L; l++)
        if (m->cfg.is_moe[l])
            router_bias_update(r->router_bias + (size_t)l * E, r->router_load + (size_t)l * E, E,
                               r->cfg.moe_router_bias_update_rate);
    op_copy(m->router_bias, tf32_2(r->router_bias, L, E));
}

bool run_validation_due(const Run *r) {
    const TrainConfig *c = &r->cfg;
    return c->validation.batches &&
           ((c->validation.interval && r->step % c->validation.interval == 0) || r->step == c->max_steps);
}

// AdamW on group g's shard. With optimizer.offload the moments live on the host: each chunk of them goes to the
// staging buffers, through the same fused update, and back (elementwise, so the bits are those of one pass).
static void adamw_group(Run *r, int g, Tensor own, float gscale, float lr) {
    const TrainConfig *c = &r->cfg;
    float b1 = (float)c->optimizer.betas[0], b2 = (float)c->optimizer.betas[1], eps = (float)c->optimizer.eps,
          wd = (float)c->optimizer.weight_decay;
    if (!c->optimizer.offload) {
        op_adamw(r->master[g], r->grad[g], r->adam_m[g], r->adam_v[g], own, gscale, lr, b1, b2, eps, wd, r->step);
        return;
    }
    int64_t n = tensor_numel(r->master[g]), chunk = tensor_numel(r->stage[0]);
    for (int64_t o = 0; o < n; o += chunk) {
        int64_t k = n - o < chunk ? n - o : chunk;
        Tensor m = tensor_rows(r->stage[0], 0, k), v = tensor_rows(r->stage[1], 0, k);
        Tensor hm = tensor_rows(r->adam_m[g], o, k), hv = tensor_rows(r->adam_v[g], o, k);
        op_copy(m, hm), op_copy(v, hv);
        op_adamw(tensor_rows(r->master[g], o, k), tensor_rows(r->grad[g], o, k), m, v,
                 own.p ? tensor_rows(own, o, k) : own, gscale, lr, b1, b2, eps, wd, r->step);
        op_copy(hm, m), op_copy(hv, v);
    }
}

// The optimizer's update of this rank's shards (AdamW reads the gradient as gscale·g) and the compute copies for
// the next step. False when it left a weight or a second moment not finite: the weights hold it, and the copies
// are not made.
static bool update(Run *r, double gscale, double lr) {
    const TrainConfig *c = &r->cfg;
    Model *m = &r->model;
    Tensor own[NGROUPS] = {{0}}; // rows of the compute copies AdamW writes in its pass (fsdp_own_rows)
    if (r->muon.on) muon_step(&r->muon, &r->fsdp, m, c, lr, r->step, r->master, r->grad, r->adam_m, r->adam_v);
    else
        for (int g = 0; g < NGROUPS; g++) {
            own[g] = fsdp_own_rows(&r->fsdp, g, m->w[g], r->master[g]);
            adamw_group(r, g, own[g], (float)gscale, (float)lr);
        }
    // The update's result, before anything can save it. AdamW's own pass flags a weight or second moment that is not
    // finite (no extra read); Muon's orthogonalised update is checked by Σ x² in fp64 of the masters, finite exactly
    // when every element is. A first moment that is not finite makes its weight so. Agreed over the world.
    double upd = c->optimizer.type == OPTIMIZER_MUON ? !isfinite(fsdp_sum_squares(&r->fsdp, r->master)) : 0;
    upd += op_adamw_nonfinite(m->dev); // (Muon updates the vectors with AdamW too)
    comm_allreduce(&r->dist.world, tensor_make(&upd, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_SUM);
    if (upd > 0) return false;
    if (m->router_bias.p) run_router_bias_update(r);
    // The compute copies for the next step (bf16 on the GPU; all-gathered from the shards when sharded).
    for (int g = 0; g < NGROUPS; g++)
        if (own[g].p) fsdp_gather_rest(&r->fsdp, g, m->w[g], own[g]);
        else fsdp_gather(&r->fsdp, g, m->w[g], r->master[g]);
    if (c->cuda_graph) m->fp8.version++; // the FP8 weight cache is stale: each layer's is remade at its next use
    else model_fp8_ahead(m);             // … or now, on a side stream beside the next step's first layers
    ops_sync();
    return true;
}

StepStats run_step(Run *r) {
    const TrainConfig *c = &r->cfg;
    const Dist *d = &r->dist;
    Model *m = &r->model;
    double t0 = now_seconds();
    snprintf(die_context, sizeof die_context, "step %d", r->step + 1);
    int nmb = microbatches(c, d), S = c->sequence_length, D = d->dp * d->ep;
    model_zero_grads(m);
    if (r->fsdp.units) op_zero(r->grad[GROUP_DENSE]); // the per-unit sums add into it
    step_sums_begin(&r->sums, m);
    for (int p = 0; p < 2; p++) r->chunk[p].ep_over = 0, r->chunk[p].ep_rows_peak = 0;
    int recorded = r->recorded;
    int64_t waits = ops_host_syncs();
    Sums sums = {.targets = (double)run_microbatches(r, &r->data, r->step, true)};
    double issued = now_seconds() - t0;
    waits = ops_host_syncs() - waits;
    ops_sync();
    StepStats st = {.fwdbwd_seconds = now_seconds() - t0,
                    .fwdbwd_host = issued,
                    .fwdbwd_waits = waits,
                    .graphs_recorded = r->recorded - recorded};
    bool pipe = piped(c, d);
    sums.loss = op_read_scalar(r->sums.loss_sum), sums.lb = op_read_scalar(r->sums.lb_sum);
    sums.ep_over = (double)(r->chunk[0].ep_over + r->chunk[1].ep_over);
    if (pipe) sums.busy_s = r->pipe[0].busy_s, sums.pipe_s = r->pipe[0].pipe_s;
    sums_allreduce(d, &sums);
    double N = sums_targets(&sums);
    if (pipe) st.pipe_busy_s = sums.busy_s / d->world.size, st.bubble = 1 - sums.busy_s / sums.pipe_s;
    if (d->ep > 1) { // expert capacity: the rows above it, and the most one layer received in units of T·k
        double peak = (double)(r->chunk[0].ep_rows_peak > r->chunk[1].ep_rows_peak ? r->chunk[0].ep_rows_peak
                                                                                   : r->chunk[1].ep_rows_peak);
        comm_allreduce(&d->world, tensor_make(&peak, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_MAX);
        st.ep_over = sums.ep_over, st.ep_load = peak / ((double)c->micro_batch_size * S * m->cfg.topk);
    }
    // AdamW reads the gradient as gscale·g, the 1/N mean and the clip factor folded into its one pass over the
    // flat buffers (fold); Muon and a gradient dump take the scaled gradient itself.
    bool fold = !r->muon.on && !r->dump_grads[0];
    for (int g = 0; g < NGROUPS; g++) {
        fsdp_reduce_scatter(&r->fsdp, g, r->grad[g], m->g[g]);
        if (!fold) op_scale(r->grad[g], (float)(1.0 / N));
    }
    if (r->dump_grads[0]) {
        ckpt_write_grads(r, r->dump_grads);
        r->dump_grads[0] = 0;
    }
    st.grad_norm = sqrt(fsdp_sum_squares(&r->fsdp, r->grad)) / (fold ? N : 1);
    double gscale = fold ? 1.0 / N : 1.0;
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    if (c->clip_grad_norm > 0) {
        double coef = c->clip_grad_norm / (st.grad_norm + 1e-6);
        if (coef < 1 && fold) gscale *= coef;
        else if (coef < 1)
            for (int g = 0; g < NGROUPS; g++) op_scale(r->grad[g], (float)coef);
    }
    st.lr = c->optimizer.lr * config_lr_factor(c, r->step);
    st.loss = sums.loss / N;
    st.lb = r->moe_layers && m->lb_coef > 0 ? sums.lb / (m->lb_coef * r->moe_layers * nmb * D) : 0;
    st.tokens = (double)c->global_batch_size * S;
    r->step++;
    // A non-finite loss or norm (the same on every rank: both are global sums) never reaches the weights:
    // the update is left out, the caller stops (on_nonfinite = fail) or goes on (skip).
    st.nonfinite = !isfinite(st.loss) || !isfinite(st.grad_norm);
    int64_t bad = op_moe_sort_bad_expert(m->dev); // a word read back here, where the step has waited anyway
    if (bad >= 0)
        die("moe_sort: expert index %lld out of range [0, %d) (a router bug)", (long long)bad, m->cfg.experts);
    bad = st.nonfinite ? op_embedding_bad_id(m->dev) : -1; // read only when the loss already says so
    if (bad >= 0) die("embedding: token id %lld is outside the vocabulary of %d", (long long)bad, m->cfg.vocab);
    if (!st.nonfinite) st.update_nonfinite = !update(r, gscale, st.lr);
    st.seconds = now_seconds() - t0, die_context[0] = 0;
    return st;
}
