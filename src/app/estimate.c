// estimate.c — `pith estimate CONFIG --gpus N [--gpu-memory GB] [--detail] [--sweep]`: the per-rank memory plan
// of a training config on N GPUs (or CPU ranks), without allocating it. The numbers come from the allocation
// sequence the trainer runs (run_memory_plan: counting arenas), so they are what `pith train` allocates on such
// a rank. --detail breaks the activation records down, names the largest term and prices each lever (capacity
// factor, recompute, ep, micro-batch) by planning the changed config; --sweep plans every layout of N GPUs and
// prints the ones that fit, best first (docs/architecture.md, "pith estimate").
#include <getopt.h>
#include <math.h>
#include <unistd.h>

#include "app/app.h"
#include "train/trainer.h"

// Memory a GPU process uses outside the plan: the CUDA context, NCCL's communicators, cuBLASLt workspaces and
// the op scratch (docs/architecture.md, "What the memory plan counts"); measured 1–3 GB on the H200.
#define RUNTIME_GB 3.0

static void estimate_usage(FILE *f) {
    fprintf(f, "usage: pith estimate CONFIG.json --gpus N [--gpu-memory GB] [--device cuda|cpu] [--detail] [--sweep]\n"
               "                     [--set key=value ...]\n"
               "  Prints the memory plan of one rank of CONFIG's layout on N ranks (dp = N / (pp·cp·ep)) and whether\n"
               "  it fits in GB (default 80) per GPU. Nothing is allocated. --device cpu plans CPU ranks (fp32).\n"
               "  --detail: the activation records by part, the largest term, and what each lever would give.\n"
               "  --sweep: every layout of N ranks (ep, sharding, capacity factor, recompute, micro-batch), the\n"
               "  ones that fit first: OK (5%% or more free), TIGHT (fits, less free), OOM.\n");
}

static void row(const char *what, size_t bytes, const char *note) {
    if (bytes >= 1000000000) printf("  %-26s %10.2f GB  %s\n", what, bytes / 1e9, note);
    else printf("  %-26s %10.2f MB  %s\n", what, bytes / 1e6, note);
}

typedef enum { FIT_OK, FIT_TIGHT, FIT_OOM } Fit;
static const char *const fit_names[] = {"OK", "TIGHT", "OOM"};

// OK: the plan and the runtime outside it leave at least 5% of the GPU free; TIGHT: they fit; OOM: they do not.
static Fit fit_of(size_t total, double mem_gb, bool gpu) {
    double need = total / 1e9 + (gpu ? RUNTIME_GB : 0);
    return need <= 0.95 * mem_gb ? FIT_OK : need <= mem_gb ? FIT_TIGHT : FIT_OOM;
}

// The plan of world rank `rank` of c's layout on `gpus` ranks; its mesh in *d.
static MemoryPlan plan_rank(const TrainConfig *c, long gpus, int rank, Device dev, Dist *d) {
    dist_mesh_describe(d, (int)gpus, rank, c->parallel.pp, c->parallel.cp, c->parallel.ep,
                       c->parallel.sharding == SHARD_HSDP, c->file);
    return run_memory_plan(c, d, dev);
}

// The plan of c on `gpus` ranks, or false (nothing planned) when the layout does not divide: ranks by
// pp·cp·ep, experts by ep, the global batch by micro-batch × dp × ep (into 2·pp or more micro-batches with a
// pipeline).
static bool plan_layout(const TrainConfig *c, const ModelConfig *mc, long gpus, Device dev, MemoryPlan *p) {
    int pp = c->parallel.pp, cp = c->parallel.cp, ep = c->parallel.ep;
    if (gpus % ((long)pp * cp * ep) || mc->experts % ep) return false;
    long dp = gpus / ((long)pp * cp * ep);
    if (c->global_batch_size % (c->micro_batch_size * dp * ep)) return false;
    if (pp > 1 && c->global_batch_size / (c->micro_batch_size * dp * ep) < 2 * pp) return false; // DualPipeV: N ≥ 2P
    Dist d;
    *p = plan_rank(c, gpus, 0, dev, &d);
    return true;
}

// The recompute sets the sweep and the levers try: none, the prefixes of the parts in RC_* order (bytes saved per
// FLOP added, the most first: the norms, RoPE, SwiGLU elementwise; the router's, the down and the gate_up GEMMs), full.
static const int recompute_sets[] = {0, 1, 3, 7, 15, 31, 63, RECOMPUTE_FULL};
#define NSETS 8
static const double capacity_factors[] = {0, 2, 1.5, 1.25, 1}; // the ones the levers and the sweep try (0: worst case)

// The GEMM FLOPs a recompute set adds to one micro-batch of T tokens on a rank (balanced routing: T·k rows): the
// router's (T × H → E), the down GEMM's (T·k × I → H, and the combine again) and the gate_up GEMM's (T·k × H → 2I, or
// T × H → 2I on a dense layer); full reruns the whole forward (counted as all of those: a lower bound), the
// elementwise parts add no GEMM.
static double recompute_gflops(const ModelConfig *mc, int rc, double T) {
    double f = 0, H = mc->hidden;
    rc |= rc & RC_FULL ? RC_FULL - 1 : 0;
    for (int l = 0; l < mc->layers; l++) {
        double rows = mc->is_moe[l] ? T * mc->topk : T, I = mc->is_moe[l] ? mc->moe_inter : mc->dense_inter;
        if (rc & RC_ROUTER && mc->is_moe[l]) f += 2 * T * H * mc->experts;
        if (rc & RC_GATE_UP) f += 2 * rows * H * 2 * I;
        if (rc & RC_EXPERT_OUT && mc->is_moe[l]) f += 2 * rows * H * I;
    }
    return f / 1e9;
}

#define RC_NAME(rc) config_recompute_name(rc, (char[64]){0}, 64) // a name for this statement

// The --set options that give layout c from the config as written.
static void layout_sets(char *buf, size_t cap, const TrainConfig *c) {
    snprintf(buf, cap,
             "--set parallel.expert_parallel_size=%d --set parallel.sharding_strategy=%s --set "
             "parallel.ep_capacity_factor=%g --set recompute=%s --set micro_batch_size=%d%s%s%s%s",
             c->parallel.ep, c->parallel.sharding == SHARD_HSDP ? "hsdp" : "fsdp", c->parallel.ep_capacity_factor,
             RC_NAME(c->recompute), c->micro_batch_size, c->optimizer.offload ? " --set optimizer.offload=true" : "",
             c->optimizer.state_dtype == STATE_BF16 ? " --set optimizer.state_dtype=bf16" : "",
             c->gradient_dtype == STATE_BF16 ? " --set gradient_dtype=bf16" : "",
             c->parallel.gradient_reduce == GRAD_REDUCE_LAYER ? " --set parallel.gradient_reduce=layer" : "");
}

// parallel.gradient_reduce "layer" applies: pp = 1 without the engine, AdamW, the dense group in more than one shard.
static bool layer_reduce_fits(const TrainConfig *c, long gpus) {
    long shards = c->parallel.sharding == SHARD_HSDP ? (long)c->parallel.cp * c->parallel.ep : gpus / c->parallel.pp;
    return c->parallel.pp == 1 && !c->parallel.pipeline_schedule && c->optimizer.type == OPTIMIZER_ADAMW && shards > 1;
}

// --detail: the activation records by part, the largest term of the plan, and each lever's plan.
static void detail(const TrainConfig *cfg, const ModelConfig *mc, const MemoryPlan *p, long gpus, Device dev,
                   double mem_gb) {
    const ChunkPlan *e = &p->chunks;
    int moe = 0;
    for (int l = 0; l < mc->layers; l++) moe += mc->is_moe[l];
    char note[160];
    printf("activation records by part:\n");
    row("hidden states, routing", e->act_hidden, "layer inputs/outputs (T, H), routing (T, k), the micro-batch");
    snprintf(note, sizeof note, "attention, norms, router%s",
             cfg->recompute == RECOMPUTE_FULL ? " (one layer: full recompute)" : ", every layer");
    row("stage 1 records", e->act_stage1, note);
    int rc = cfg->recompute;
    snprintf(note, sizeof note, "expert rows%s%s%s, routes; %d MoE layers",
             rc & (RC_GATE_UP | RC_FULL) ? "" : ", gate/up", rc & RC_SWIGLU ? "" : ", SwiGLU",
             rc & (RC_EXPERT_OUT | RC_FULL) ? "" : ", outputs (T·k, H)", moe);
    row("stage 3 records", e->act_experts, note);
    row("staging", e->act_staging, "expert outputs before combine and the recomputed parts, one layer");
    row("spill set", e->act_spill,
        e->act_spill ? "stage 3 of one layer at the worst case ep·T·min(k, E_l)"
                     : "(none: worst-case capacity, dropping, or ep = 1)");
    row("epilog", e->act_epilog, "final norm, LM-head logits in row chunks");
    if (e->act_defer) row("deferred sets", e->act_defer, "stage 3's output gradients kept for deferred weight halves");
    struct {
        const char *name;
        size_t bytes;
    } terms[] = {{"weights (compute copy)", p->weights},    {"gradient accumulators", p->grads},
                 {"master weight shards", p->shards},       {"optimizer state", p->optim},
                 {"stage 1 records", e->act_stage1},        {"stage 3 records", e->act_experts},
                 {"hidden states, routing", e->act_hidden}, {"spill set", e->act_spill},
                 {"backward workspace", e->ws_bytes},       {"communication buffers", e->comm_bytes}};
    int big = 0;
    for (int i = 1; i < (int)(sizeof terms / sizeof *terms); i++)
        if (terms[i].bytes > terms[big].bytes) big = i;
    size_t total = memory_plan_total(p);
    printf("largest term: %s, %.2f GB (%.0f%% of %.2f GB)\n", terms[big].name, terms[big].bytes / 1e9,
           100.0 * terms[big].bytes / total, total / 1e9);
    printf("levers (each alone, from this config):\n");
    for (int i = 0; i < 13 + NSETS; i++) {
        TrainConfig c = *cfg;
        char what[96], flops[48] = "";
        int j = i - 5 - NSETS; // after the recompute sets: ep ×2, ÷2, micro-batch ×2, ÷2, the four memory options
        if (j >= 4) { // the moments to host memory, or in bf16; the expert gradients in bf16; the dense ones per layer
            static const char *const set[] = {"optimizer.offload=true", "optimizer.state_dtype=bf16",
                                              "gradient_dtype=bf16", "parallel.gradient_reduce=layer"};
            bool on[] = {cfg->optimizer.offload, cfg->optimizer.state_dtype, cfg->gradient_dtype,
                         cfg->parallel.gradient_reduce || !layer_reduce_fits(cfg, gpus)};
            if (cfg->optimizer.type != OPTIMIZER_ADAMW || on[j - 4]) continue;
            if (j == 4) c.optimizer.offload = true;
            else if (j == 5) c.optimizer.state_dtype = STATE_BF16;
            else if (j == 6) c.gradient_dtype = STATE_BF16;
            else c.parallel.gradient_reduce = GRAD_REDUCE_LAYER;
            snprintf(what, sizeof what, "%s", set[j - 4]);
        } else if (i < 5) { // capacity factors (with expert parallelism)
            double f = capacity_factors[i];
            if (cfg->parallel.ep == 1 || f == cfg->parallel.ep_capacity_factor) continue;
            c.parallel.ep_capacity_factor = f;
            snprintf(what, sizeof what, "parallel.ep_capacity_factor=%g%s", f, f ? "" : " (worst case)");
        } else if (j < 0) { // the recompute sets, with the GEMM FLOPs each adds
            if ((c.recompute = recompute_sets[i - 5]) == cfg->recompute) continue;
            double T = (double)cfg->micro_batch_size * cfg->sequence_length / cfg->parallel.cp;
            snprintf(what, sizeof what, "recompute=%s", RC_NAME(c.recompute));
            snprintf(flops, sizeof flops, "  %+.0f GEMM GFLOP a micro-batch",
                     recompute_gflops(mc, c.recompute, T) - recompute_gflops(mc, cfg->recompute, T));
        } else if (j < 2) {
            c.parallel.ep = j == 0 ? cfg->parallel.ep * 2 : cfg->parallel.ep / 2;
            if (c.parallel.ep < 1 || (j == 1 && cfg->parallel.ep % 2)) continue;
            snprintf(what, sizeof what, "parallel.expert_parallel_size=%d", c.parallel.ep);
        } else {
            c.micro_batch_size = j == 2 ? cfg->micro_batch_size * 2 : cfg->micro_batch_size / 2;
            if (c.micro_batch_size < 1 || (j == 3 && cfg->micro_batch_size % 2)) continue;
            snprintf(what, sizeof what, "micro_batch_size=%d", c.micro_batch_size);
        }
        MemoryPlan q;
        if (!plan_layout(&c, mc, gpus, dev, &q)) {
            printf("  --set %-42s (the layout does not divide)\n", what);
            continue;
        }
        size_t t = memory_plan_total(&q);
        printf("  --set %-42s %8.2f GB (%+.2f GB)  %-5s%s\n", what, t / 1e9, ((double)t - (double)total) / 1e9,
               fit_names[fit_of(t, mem_gb, dev == DEV_CUDA)], flops);
    }
}

typedef struct {
    TrainConfig c;
    size_t total;
    double trade_s; // trade_seconds
    Fit fit;
    int layout; // the candidates of one layout in other state dtypes share it
} Layout;

// The rates that price the sweep's memory trades, measured on one H200: the recompute parts' GEMMs added 12.3 ms for
// 4.98 TFLOP to the 8-layer Qwen3 step (≈ 400 TFLOP/s; bench/results/2026-12-02-s21), the moments on the host
// crossed the link at ≈ 53 GB/s each way, one after the other (bench/results/2026-12-01-h200-lead).
#define TRADE_FLOPS 400e12
#define TRADE_HOST_BYTES 53e9

// Seconds a step of layout c (plan p) spends on its memory trades, over the same layout without them: the recompute
// set's GEMMs for each of a rank's micro-batches (recompute_gflops: for full recompute a lower bound, attention is
// not counted) and, with the moments on the host, their trip to the device and back in the optimizer's pass. The
// per-layer reduce and bf16 state are not priced: layout_cmp orders them after.
static double trade_seconds(const TrainConfig *c, const ModelConfig *mc, long gpus, const MemoryPlan *p) {
    long data = gpus / ((long)c->parallel.pp * c->parallel.cp); // ranks with sequences of their own (dp × ep)
    double micro = (double)c->global_batch_size / ((double)c->micro_batch_size * data); // a rank's, a step
    double T = (double)c->micro_batch_size * c->sequence_length / c->parallel.cp;
    double s = recompute_gflops(mc, c->recompute, T) * 1e9 / c->parallel.pp * micro / TRADE_FLOPS;
    return s + (c->optimizer.offload ? 2.0 * (double)p->host / TRADE_HOST_BYTES : 0);
}

// The storage precision a layout gives up: 0 none, 1 bf16 moments, 2 bf16 expert gradients, 3 both.
static int rounded_state(const TrainConfig *c) {
    return (c->optimizer.state_dtype == STATE_BF16) + 2 * (c->gradient_dtype == STATE_BF16);
}

// A layout's memory variant (the sweep plans a layout's variants together): its rounded state, and the dense
// gradient reduced per layer (4).
static int variant(const TrainConfig *c) {
    return rounded_state(c) + 4 * (c->parallel.gradient_reduce == GRAD_REDUCE_LAYER);
}

// Best first: fits before tight before out of memory (those by size); then the cheaper step: less time on memory
// trades (trade_seconds, to the millisecond), less recomputation, moments on the device, the dense gradient reduced
// once per step (parallel.gradient_reduce "layer" adds a reduce a layer, which waits behind or delays the ep
// all-to-alls); then fp32 storage before bf16 (rounded_state); then a larger micro-batch, fewer ep ranks, a capacity
// that spills less (0 = the worst case: never); then less memory.
static int layout_cmp(const void *pa, const void *pb) {
    const Layout *a = pa, *b = pb;
    double fa = a->c.parallel.ep_capacity_factor, fb = b->c.parallel.ep_capacity_factor;
    fa = fa > 0 ? fa : 1e9, fb = fb > 0 ? fb : 1e9;
    long ta = lround(a->trade_s * 1e3), tb = lround(b->trade_s * 1e3);
    if (a->fit != b->fit) return a->fit < b->fit ? -1 : 1;
    if (a->fit == FIT_OOM) return a->total < b->total ? -1 : a->total > b->total; // the nearest to fitting first
    if (ta != tb) return ta < tb ? -1 : 1;
    if (a->c.recompute != b->c.recompute) return a->c.recompute < b->c.recompute ? -1 : 1; // RC_* bits: by cost
    if (a->c.optimizer.offload != b->c.optimizer.offload) return a->c.optimizer.offload ? 1 : -1;
    if (variant(&a->c) != variant(&b->c)) return variant(&a->c) < variant(&b->c) ? -1 : 1;
    if (a->c.micro_batch_size != b->c.micro_batch_size) return a->c.micro_batch_size > b->c.micro_batch_size ? -1 : 1;
    if (a->c.parallel.ep != b->c.parallel.ep) return a->c.parallel.ep < b->c.parallel.ep ? -1 : 1;
    if (fa != fb) return fa > fb ? -1 : 1;
    return a->total < b->total ? -1 : a->total > b->total;
}

// --sweep: ep over the divisors of the ranks that divide the experts, fsdp or hsdp (with dp > 1), capacity
// factors (with ep > 1), the recompute modes, the config's micro-batch and 1, AdamW's moments on the device or
// offloaded to the host, AdamW's moments and the expert gradients in bf16, the dense gradient reduced per step or per
// layer; pp and cp as configured. A layout's variants (state dtypes, gradient reduction: `variant`) are planned
// smallest first (all of them on): when that is out of memory, so are the others, and they are left out;
// else in the order from fp32 up to the first that fits OK (the rest would come after it).
// The candidates are listed first, then planned one by one with progress on stderr (a sweep of a large model takes a
// minute).
static void sweep(const TrainConfig *cfg, const ModelConfig *mc, long gpus, Device dev, double mem_gb) {
    int n = 0, cap = 64, nc = 0, count[3] = {0};
    Layout *all = xmalloc(cap * sizeof *all);
    for (int ep = 1; ep <= gpus && ep <= mc->experts; ep++)
        for (int sh = 0; sh < 2; sh++)
            for (int f = 0; f < 5; f++)
                for (int rc = 0; rc < NSETS; rc++)
                    for (int v = 0; v < 32; v++) { // the variants innermost: a layout's in a row, in variant() order
                        int mb = v >> 3 | (v & 7) << 2; // & 1: micro-batch 1; & 2: offload; & 4, & 8: bf16 state;
                                                        // & 16: the dense gradient reduced per layer
                        TrainConfig c = *cfg;
                        c.parallel.ep = ep, c.parallel.sharding = sh ? SHARD_HSDP : SHARD_FSDP;
                        c.parallel.ep_capacity_factor = capacity_factors[f], c.recompute = recompute_sets[rc];
                        c.micro_batch_size = mb & 1 ? 1 : cfg->micro_batch_size;
                        c.optimizer.offload = mb & 2 ? true : cfg->optimizer.offload;
                        long dp = gpus / ((long)c.parallel.pp * c.parallel.cp * ep);
                        if ((ep == 1 && f) || (mb & 1 && cfg->micro_batch_size == 1) || (sh && dp <= 1)) continue;
                        if (mb & 14 && cfg->optimizer.type != OPTIMIZER_ADAMW) continue;
                        if ((mb & 2 && cfg->optimizer.offload) || (mb & 4 && cfg->optimizer.state_dtype) ||
                            (mb & 8 && cfg->gradient_dtype))
                            continue;
                        if (mb & 16 && (cfg->parallel.gradient_reduce || !layer_reduce_fits(&c, gpus))) continue;
                        c.optimizer.state_dtype |= mb & 4 ? STATE_BF16 : 0, c.gradient_dtype |= mb & 8 ? STATE_BF16 : 0;
                        c.parallel.gradient_reduce |= mb & 16 ? GRAD_REDUCE_LAYER : 0;
                        if (nc == cap) all = xrealloc(all, (cap *= 2) * sizeof *all);
                        all[nc++] = (Layout){.c = c, .layout = ((ep * 2 + sh) * 5 + f) * NSETS * 4 + rc * 4 + (v >> 3)};
                    }
    bool tty = isatty(2);
    double t0 = now_seconds(), shown_at = t0;
    for (int i = 0, j; i < nc; i = j) {
        Layout g[8]; // the layout's variants, the smallest last
        for (j = i + 1; j < nc && all[j].layout == all[i].layout; j++) {}
        memcpy(g, all + i, (j - i) * sizeof *g);
        if (now_seconds() - shown_at > (tty ? 0.2 : 10) || i == 0) { // on a terminal in place, else every 10 s
            fprintf(stderr, "%ssweep: planning layout %d of %d (%.0f s)%s", tty ? "\r" : "", i + 1, nc,
                    now_seconds() - t0, tty ? "" : "\n");
            shown_at = now_seconds();
        }
        int last = j - i - 1;
        MemoryPlan p;
        if (!plan_layout(&g[last].c, mc, gpus, dev, &p)) continue;
        g[last].total = memory_plan_total(&p), g[last].fit = fit_of(g[last].total, mem_gb, dev == DEV_CUDA);
        g[last].trade_s = trade_seconds(&g[last].c, mc, gpus, &p);
        bool alone = last == 0 || g[last].fit == FIT_OOM, ok = false; // the only one, or the others are larger
        for (int k = 0; k < last && !alone && !ok && plan_layout(&g[k].c, mc, gpus, dev, &p); k++) {
            g[k].total = memory_plan_total(&p), g[k].fit = fit_of(g[k].total, mem_gb, dev == DEV_CUDA);
            g[k].trade_s = trade_seconds(&g[k].c, mc, gpus, &p);
            all[n++] = g[k], ok = g[k].fit == FIT_OK;
        }
        if (!ok) all[n++] = g[last];
    }
    if (tty) fprintf(stderr, "\r%60s\r", "");
    qsort(all, n, sizeof *all, layout_cmp);
    for (int i = 0; i < n; i++) count[all[i].fit]++;
    printf("sweep: %d layouts of %ld %s of %g GB: %d OK, %d TIGHT, %d OOM", n, gpus,
           dev == DEV_CUDA ? "GPUs" : "CPU ranks", mem_gb, count[FIT_OK], count[FIT_TIGHT], count[FIT_OOM]);
    if (dev == DEV_CUDA) printf(" (with %g GB of runtime outside the plan)", RUNTIME_GB);
    printf(
        "\nbest first: OK, TIGHT, then OOM; within each, the faster step (the least time a step spends on trades — the "
        "recompute set's GEMMs at %.0f TFLOP/s, the host moments' round trip at %.0f GB/s —, then less recomputation, "
        "moments on the device, the dense gradient reduced per step), fp32 state before bf16, the larger micro-batch, "
        "fewer ep ranks, more capacity, then less memory\n",
        TRADE_FLOPS / 1e12, TRADE_HOST_BYTES / 1e9);
    int shown = 0;
    int show = count[FIT_OK] + count[FIT_TIGHT] ? 12 : 3;
    for (int i = 0; i < n && shown < show && (all[i].fit != FIT_OOM || !(count[FIT_OK] + count[FIT_TIGHT]));
         i++, shown++) {
        const TrainConfig *c = &all[i].c;
        long dp = gpus / ((long)c->parallel.pp * c->parallel.cp * c->parallel.ep);
        char sets[400], fac[32];
        layout_sets(sets, sizeof sets, c);
        snprintf(fac, sizeof fac, c->parallel.ep_capacity_factor > 0 ? "%g" : "worst", c->parallel.ep_capacity_factor);
        printf("  %-5s %8.2f GB  ep %d dp %ld %s, capacity %s, recompute %s, micro-batch %d%s%s%s%s; trades ≈ %.3f s "
               "a step\n        %s\n",
               fit_names[all[i].fit], all[i].total / 1e9, c->parallel.ep, dp,
               c->parallel.sharding == SHARD_HSDP ? "hsdp" : "fsdp", fac, RC_NAME(c->recompute), c->micro_batch_size,
               c->optimizer.state_dtype == STATE_BF16 ? ", bf16 moments" : "",
               c->gradient_dtype == STATE_BF16 ? ", bf16 expert gradients" : "",
               c->optimizer.offload ? ", moments on the host" : "",
               c->parallel.gradient_reduce == GRAD_REDUCE_LAYER ? ", dense gradient reduced per layer" : "",
               all[i].trade_s, sets);
    }
    if (!count[FIT_OK] && !count[FIT_TIGHT]) printf("sweep: nothing fits; the smallest plans are above\n");
    else if (shown < count[FIT_OK] + count[FIT_TIGHT])
        printf("  (%d more that fit)\n", count[FIT_OK] + count[FIT_TIGHT] - shown);
    free(all);
}

// The plan of rank 0 of layout d as a table, each pipeline rank's total, and the verdict on mem_gb GPUs.
static void print_plan(const TrainConfig *c, const ModelConfig *mc, const Dist *d, const MemoryPlan *p, long gpus,
                       Device dev, double mem_gb) {
    bool bf16 = dev == DEV_CUDA && c->compute_dtype == COMPUTE_BF16;
    char cap[96], act[96];
    if (c->parallel.ep_capacity_factor > 0)
        snprintf(cap, sizeof cap, "(capacity %g·T·k rows; transfers: the worst case of one layer)",
                 c->parallel.ep_capacity_factor);
    else snprintf(cap, sizeof cap, "(worst-case capacity: T·k·ep rows)");
    bool piped = d->pp > 1 || c->parallel.pipeline_schedule;
    snprintf(act, sizeof act, "%s, recompute %s",
             piped ? "two chunks: the schedule's micro-batches in flight, deferred sets" : "one micro-batch in flight",
             RC_NAME(c->recompute));
    char whose[64] = "per rank";
    if (d->pp > 1) snprintf(whose, sizeof whose, "per rank (these rows: pipeline rank 0 of %d)", d->pp);
    printf("estimate: %s on %ld %s = pp %d × dp %d × cp %d × ep %d (%s); %s: %d of %d experts, micro-batch %d × "
           "%d tokens, %s\n",
           mc->model_type, gpus, dev == DEV_CUDA ? "GPUs" : "CPU ranks", d->pp, d->dp, d->cp, d->ep,
           d->hsdp ? "hsdp" : "fsdp", whose, mc->experts / d->ep, mc->experts, c->micro_batch_size,
           c->sequence_length / d->cp, bf16 ? "bf16 compute" : "fp32 compute");
    char wnote[200];
    bool master_experts = bf16 && p->master_experts; // FP8: the experts' compute copy is their fp32 master
    snprintf(wnote, sizeof wnote, "%s%s, this rank's experts%s", bf16 ? "bf16" : "fp32",
             master_experts ? " (the experts fp32: their master)" : "", bf16 ? ", whole for the step" : "");
    if (p->fp8) // the cache is made from the compute copy and held beside it
        snprintf(wnote + strlen(wnote), sizeof wnote - strlen(wnote), "; %.2f GB of it the FP8 weight cache",
                 p->fp8 / 1e9);
    row("weights (compute copy)", p->weights, wnote);
    char grads[160];
    snprintf(grads, sizeof grads, "%s%s",
             c->gradient_dtype == STATE_BF16 ? "dense fp32, experts bf16 (gradient_dtype)" : "fp32",
             c->parallel.gradient_reduce == GRAD_REDUCE_LAYER
                 ? "; dense: its shard and 3 windows (embedding or LM head, 2 layers'), reduced per layer"
                 : ", reduce-scattered in place once per step");
    row("gradient accumulators", p->grads, grads);
    row("master weight shards", p->shards,
        !p->shards       ? "(the compute copy itself: one shard, fp32)"
        : master_experts ? "fp32, the dense parameters' (the experts' is their compute copy)"
                         : "fp32");
    row("optimizer state", p->optim,
        c->optimizer.offload                     ? "staging: one chunk of m and v (the moments are on the host)"
        : c->optimizer.type == OPTIMIZER_MUON    ? "Muon momentum and AdamW moments, fp32 shards"
        : c->optimizer.state_dtype == STATE_BF16 ? "AdamW moments, bf16 shards (optimizer.state_dtype)"
                                                 : "AdamW moments, fp32 shards");
    row("activation records", p->chunks.act_bytes, act);
    row("backward workspace", p->chunks.ws_bytes,
        piped ? "one for both chunks: the larger backward's largest layer (a spilled layer's included)"
              : "the largest layer's temporaries (a spilled layer's included)");
    row("communication buffers", p->chunks.comm_bytes, d->ep > 1 ? cap : "(none: ep = 1)");
    if (piped) row("pipeline buffers", p->pipe, "activations and gradients between the chunks (records point at them)");
    row("other", p->other,
        d->cp > 1 ? "rope tables, loss accumulators, ring attention's scratch" : "rope tables, loss accumulators");
    size_t total = memory_plan_total(p);
    char exact[96];
    snprintf(exact, sizeof exact, "(%zu bytes)", total);
    row("total", total, exact);
    if (p->host) {
        snprintf(exact, sizeof exact, "AdamW moments, %s pinned (optimizer.offload; %zu bytes)",
                 c->optimizer.state_dtype == STATE_BF16 ? "bf16," : "fp32,", p->host);
        row("host memory (not above)", p->host, exact);
    }
    if (p->snapshot) {
        snprintf(exact, sizeof exact, "checkpoint snapshot (checkpoint.async; %zu bytes)", p->snapshot);
        row("host memory (not above)", p->snapshot, exact);
    }
    if (d->pp > 1) { // the pipeline ranks hold different layers and records: each one's total (the rows: rank 0)
        printf("plan per pipeline rank:");
        for (int k = 0; k < d->pp; k++) {
            Dist dk;
            MemoryPlan pk = plan_rank(c, gpus, k * ((int)gpus / d->pp), dev, &dk);
            printf(" %zu", memory_plan_total(&pk));
        }
        printf(" bytes\n");
    }
    if (dev == DEV_CUDA) // one verdict: the plan and the runtime outside it against the GPU's memory
        printf("verdict: %s on %g GB GPUs: the plan's %.2f GB + %g GB of runtime outside it (the CUDA context, NCCL "
               "and cuBLASLt workspaces) = %.2f%% of the memory (OK: 5%% or more left free; TIGHT: less; OOM: over)\n",
               fit_names[fit_of(total, mem_gb, true)], mem_gb, total / 1e9, RUNTIME_GB,
               100.0 * (total / 1e9 + RUNTIME_GB) / mem_gb);
}

int cmd_estimate(int argc, char **argv) {
    static struct option opts[] = {
        {"gpus", 1, 0, 'n'},   {"gpu-memory", 1, 0, 'm'}, {"device", 1, 0, 'd'}, {"set", 1, 0, 's'},
        {"detail", 0, 0, 'D'}, {"sweep", 0, 0, 'S'},      {"help", 0, 0, 'h'},   {0}};
    char **sets = xmalloc(argc * sizeof *sets);
    int nsets = 0, c;
    long gpus = 0;
    double mem_gb = 80;
    bool want_detail = false, want_sweep = false;
    const char *device = "cuda";
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'n': gpus = arg_int("estimate", "--gpus", optarg, 1, 1 << 20); break;
        case 'm':
            if (!((mem_gb = arg_num("estimate", "--gpu-memory", optarg, 0, INFINITY)) > 0))
                die("estimate: --gpu-memory needs a positive number of GB (got '%s')", optarg);
            break;
        case 'd':
            if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu"))
                die("estimate: --device must be cuda or cpu (got '%s')", optarg);
            device = optarg;
            break;
        case 's': sets[nsets++] = optarg; break;
        case 'D': want_detail = true; break;
        case 'S': want_sweep = true; break;
        case 'h': estimate_usage(stdout); return 0;
        default: arg_suggest_option(opts, argv), estimate_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "pith: error: estimate: %s\n", optind == argc ? "no training config given" : "one config only");
        estimate_usage(stderr);
        return 2;
    }
    if (!gpus) die("estimate: --gpus N is required: the number of GPUs (or CPU ranks, --device cpu) to plan for");
    TrainConfig cfg;
    config_load(&cfg, argv[optind], sets, nsets);
    free(sets);
    Device dev = strcmp(device, "cpu") ? DEV_CUDA : DEV_CPU;
    Dist d;
    MemoryPlan p = plan_rank(&cfg, gpus, 0, dev, &d);
    ModelConfig mc;
    model_config_load(&mc, cfg.model);
    print_plan(&cfg, &mc, &d, &p, gpus, dev, mem_gb);
    if (want_detail) detail(&cfg, &mc, &p, gpus, dev, mem_gb);
    if (want_sweep) sweep(&cfg, &mc, gpus, dev, mem_gb);
    json_decref(cfg.json);
    return 0;
}
