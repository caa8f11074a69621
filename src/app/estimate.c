// estimate.c — `pith estimate CONFIG --gpus N [--gpu-memory GB]`: the per-rank memory plan of a training
// config on N GPUs (or CPU ranks), without allocating it. The numbers come from the allocation sequence the
// trainer runs (run_memory_plan: counting arenas), so they are what `pith train` allocates on such a rank.
#include <getopt.h>

#include "app/app.h"
#include "train/trainer.h"

static void estimate_usage(FILE *f) {
    fprintf(f, "usage: pith estimate CONFIG.json --gpus N [--gpu-memory GB] [--device cuda|cpu] [--set key=value ...]\n"
               "  Prints the memory plan of one rank of CONFIG's layout on N ranks (dp = N / (pp·cp·ep)) and whether\n"
               "  it fits in GB (default 80) per GPU. Nothing is allocated. --device cpu plans CPU ranks (fp32).\n");
}

static void row(const char *what, size_t bytes, const char *note) {
    if (bytes >= 1000000000) printf("  %-26s %10.2f GB  %s\n", what, bytes / 1e9, note);
    else printf("  %-26s %10.2f MB  %s\n", what, bytes / 1e6, note);
}

int cmd_estimate(int argc, char **argv) {
    static struct option opts[] = {{"gpus", 1, 0, 'n'}, {"gpu-memory", 1, 0, 'm'}, {"device", 1, 0, 'd'},
                                   {"set", 1, 0, 's'},  {"help", 0, 0, 'h'},       {0}};
    char **sets = xmalloc(argc * sizeof *sets);
    int nsets = 0, c;
    long gpus = 0;
    double mem_gb = 80;
    const char *device = "cuda";
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'n':
            gpus = strtol(optarg, &end, 10);
            if (*end || gpus < 1 || gpus > 1 << 20) die("estimate: --gpus needs a positive integer (got '%s')", optarg);
            break;
        case 'm':
            mem_gb = strtod(optarg, &end);
            if (*end || !(mem_gb > 0)) die("estimate: --gpu-memory needs a positive number of GB (got '%s')", optarg);
            break;
        case 'd':
            if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu"))
                die("estimate: --device must be cuda or cpu (got '%s')", optarg);
            device = optarg;
            break;
        case 's': sets[nsets++] = optarg; break;
        case 'h': estimate_usage(stdout); return 0;
        default: estimate_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || !gpus) {
        estimate_usage(stderr);
        return 2;
    }
    TrainConfig cfg;
    config_load(&cfg, argv[optind], sets, nsets);
    free(sets);
    Device dev = strcmp(device, "cpu") ? DEV_CUDA : DEV_CPU;
    Dist d;
    dist_mesh_describe(&d, (int)gpus, 0, cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.ep,
                       cfg.parallel.sharding == SHARD_HSDP, cfg.file);
    MemoryPlan p = run_memory_plan(&cfg, &d, dev);
    ModelConfig mc;
    model_config_load(&mc, cfg.model);
    bool bf16 = dev == DEV_CUDA && cfg.compute_dtype == COMPUTE_BF16;
    char cap[96];
    if (cfg.parallel.ep_capacity_factor > 0)
        snprintf(cap, sizeof cap, "(capacity %g·T·k rows)", cfg.parallel.ep_capacity_factor);
    else snprintf(cap, sizeof cap, "(worst-case capacity: T·k·ep rows)");
    printf("estimate: %s on %ld %s = pp %d × dp %d × cp %d × ep %d (%s); per rank: %d of %d experts, micro-batch %d × "
           "%d tokens, %s\n",
           mc.model_type, gpus, dev == DEV_CUDA ? "GPUs" : "CPU ranks", d.pp, d.dp, d.cp, d.ep,
           d.hsdp ? "hsdp" : "fsdp", mc.experts / d.ep, mc.experts, cfg.micro_batch_size, cfg.sequence_length,
           bf16 ? "bf16 compute" : "fp32 compute");
    row("weights (compute copy)", p.weights,
        bf16 ? "bf16, this rank's experts, whole for the step" : "fp32, this rank's experts");
    row("gradient accumulators", p.grads, "fp32, reduce-scattered in place once per step");
    row("master weight shards", p.shards, p.shards ? "fp32" : "(the compute copy itself: one shard, fp32)");
    row("optimizer state", p.optim, "AdamW moments, fp32 shards");
    row("activation records", p.chunks.act_bytes,
        d.pp > 1 ? "two chunks: the schedule's micro-batches in flight, deferred sets" : "one micro-batch in flight");
    row("backward workspace", p.chunks.ws_bytes,
        d.pp > 1 ? "each chunk's largest layer" : "the largest layer's temporaries");
    row("communication buffers", p.chunks.comm_bytes, d.ep > 1 ? cap : "(none: ep = 1)");
    if (d.pp > 1) row("pipeline buffers", p.pipe, "activations and gradients between pipeline ranks");
    row("other", p.other, "rope tables, loss accumulators");
    size_t total = memory_plan_total(&p);
    char exact[48];
    snprintf(exact, sizeof exact, "(%zu bytes)", total);
    row("total", total, exact);
    if (d.pp > 1) { // the pipeline ranks hold different layers and records: each one's total (the rows: rank 0)
        printf("plan per pipeline rank:");
        for (int k = 0; k < d.pp; k++) {
            Dist dk;
            dist_mesh_describe(&dk, (int)gpus, k * ((int)gpus / d.pp), cfg.parallel.pp, cfg.parallel.cp,
                               cfg.parallel.ep, cfg.parallel.sharding == SHARD_HSDP, cfg.file);
            MemoryPlan pk = run_memory_plan(&cfg, &dk, dev);
            printf(" %zu", memory_plan_total(&pk));
        }
        printf(" bytes\n");
    }
    if (dev == DEV_CUDA)
        printf("%s in %g GB per GPU (%.1f%% used); not counted: the CUDA context, NCCL and cuBLASLt workspaces (~1-3 "
               "GB)\n",
               total <= mem_gb * 1e9 ? "fits" : "does not fit", mem_gb, 100.0 * total / (mem_gb * 1e9));
    json_decref(cfg.json);
    return 0;
}
