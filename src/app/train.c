// train.c — `pith train CONFIG.json [--set key=value ...]`: the training loop with its log.
// One line per step on stdout, one JSON object per step in <run_dir>/metrics.jsonl.
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include "app/app.h"
#include "train/ckpt.h"
#include "train/tboard.h"
#include "train/trainer.h"

static void train_usage(FILE *f) {
    fprintf(f, "usage: pith train CONFIG.json [--set key=value ...] [--steps N] [--dump-grads DIR]\n"
               "  Trains the model described by CONFIG.json (keys: see docs/usage.md, \"Training config\").\n"
               "  With save_location set, it resumes from the newest complete checkpoint there.\n"
               "  Several ranks: start it with mpirun/srun (scripts/launch.sh picks the line); rank 0 logs.\n"
               "  --steps N         take at most N steps in this invocation, then checkpoint and exit\n"
               "  --print-config    print the effective config (every key, defaults filled in) and exit\n"
               "  --config-table    print docs/usage.md's tables of config keys (generated from config.c) and exit\n"
               "  --allow-config-change  resume even when a data-order or schedule key differs from the checkpoint's\n"
               "  --dump-grads DIR  write the first step's gradient (reduced, before clipping) to DIR as\n"
               "                    whole tensors under canonical names (layout-equivalence checks)\n"
               "  --set key=value   override a config key; nested keys with dots (optimizer.lr=3e-4);\n"
               "                    the value is JSON if it parses as JSON, else a string\n");
}

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }
// Ctrl-C stops like SIGTERM, with a checkpoint after the step under way; a second Ctrl-C stops at once.
static void on_interrupt(int sig) {
    static const char msg[] =
        "\npith: interrupted: stopping after this step with a checkpoint (Ctrl-C again: at once)\n";
    if (got_signal == SIGINT) signal(SIGINT, SIG_DFL), raise(SIGINT);
    got_signal = SIGINT;
    (void)!write(2, msg, sizeof msg - 1);
}

// One line of metrics.jsonl, written whole or not at all: a failed write is cut back to the last full
// line and ends the run naming the file. NaN and Inf are not JSON: a value that is not finite is null.
static void write_metrics(FILE *f, const char *path, int step, int n, const char *const *keys, const double *vals) {
    char line[1024], num[32];
    int len = snprintf(line, sizeof line, "{\"step\": %d", step);
    for (int k = 0; k < n; k++)
        len += snprintf(line + len, sizeof line - len, ", \"%s\": %s", keys[k], json_real_text(num, vals[k]));
    len += snprintf(line + len, sizeof line - len, "}\n");
    CHECK(len < (int)sizeof line);
    long at = ftell(f);
    if (fwrite(line, 1, len, f) != (size_t)len || fflush(f)) {
        int e = errno;
        if (at >= 0 && ftruncate(fileno(f), at) == 0) fsync(fileno(f));
        die("%s: write failed: %s", path, strerror(e));
    }
}

static void fmt_thousands(char *out, size_t cap, double v) {
    char raw[64];
    snprintf(raw, sizeof raw, "%.0f", v);
    int n = (int)strlen(raw), o = 0;
    for (int i = 0; i < n && o + 2 < (int)cap; i++) {
        out[o++] = raw[i];
        if (raw[i] != '-' && (n - i - 1) % 3 == 0 && i < n - 1) out[o++] = ',';
    }
    out[o] = 0;
}

// A duration as h:mm:ss.
static void fmt_duration(char *out, size_t cap, double s) {
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

// <run_dir>/metrics.jsonl for appending. A resumed run keeps the metrics of the steps it does not redo
// and drops those it will redo.
static FILE *open_metrics(const char *run_dir, const char *mpath, int step) {
    mkdir_p(run_dir);
    size_t len = 0;
    char *old = step > 0 ? file_read_all(mpath, &len) : NULL, *keep_end = old;
    for (char *line = old; line && *line;) {
        char *nl = strchr(line, '\n');
        int s = 0;
        if (!nl || sscanf(line, "{\"step\": %d", &s) != 1 || s > step) break;
        keep_end = line = nl + 1;
    }
    file_write_atomic(mpath, old ? old : "", old ? (size_t)(keep_end - old) : 0);
    free(old);
    FILE *metrics = fopen(mpath, "a");
    if (!metrics) die("%s: cannot write: %s", mpath, strerror(errno));
    return metrics;
}

// The command line of pith train.
typedef struct {
    const char *file, *dump;
    char **sets;
    int nsets, max_now;
    bool print_config, allow_change;
} TrainArgs;

// Parses the command line into a. Returns -1 to go on, else the exit status (--help, --config-table, no config).
static int train_args(TrainArgs *a, int argc, char **argv) {
    *a = (TrainArgs){.sets = xmalloc(argc * sizeof *a->sets), .max_now = -1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return train_usage(stdout), 0;
        if (!strcmp(argv[i], "--config-table")) {
            char *t = config_markdown();
            fputs(t, stdout);
            free(t);
            return 0;
        }
        if (!strcmp(argv[i], "--print-config")) a->print_config = true;
        else if (!strcmp(argv[i], "--allow-config-change")) a->allow_change = true;
        else if (!strcmp(argv[i], "--set")) {
            if (i + 1 >= argc) die("train: --set needs key=value");
            a->sets[a->nsets++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) a->sets[a->nsets++] = argv[i] + 6;
        else if (!strcmp(argv[i], "--steps"))
            a->max_now = (int)arg_int("train", "--steps", i + 1 < argc ? argv[++i] : NULL, 1, 1 << 30);
        else if (!strcmp(argv[i], "--dump-grads")) {
            if (i + 1 >= argc) die("train: --dump-grads needs a folder");
            a->dump = argv[++i];
        } else if (argv[i][0] == '-') {
            static const char *const known[] = {"--help", "--config-table", "--print-config", "--allow-config-change",
                                                "--set",  "--steps",        "--dump-grads"};
            const char *near = closest_name(argv[i], known, sizeof known / sizeof *known);
            die("train: unknown option '%s'%s%s%s (see pith train --help)", argv[i], near ? " (did you mean " : "",
                near ? near : "", near ? "?)" : "");
        } else if (a->file) die("train: more than one config file given ('%s' and '%s')", a->file, argv[i]);
        else a->file = argv[i];
    }
    if (a->file) return -1;
    train_usage(stderr);
    return 2;
}

// What the run is: the model, the CPU threads or determinism, the data, the mesh; and its memory plan. Returns
// the plan's bytes, with the GPU backend's pools.
static double print_run(const Run *r) {
    const Dist *d = &r->dist;
    const ModelConfig *mc = &r->model.cfg;
    bool gpu = r->model.dev == DEV_CUDA;
    ParamTable all;
    model_params_all(&r->model, &all);
    int64_t nparam = all.numel[GROUP_DENSE] + all.numel[GROUP_EXPERT];
    free(all.p);
    printf("model: %s, %d layers (%d MoE), hidden %d, %d experts top-%d, vocab %d: %.3f M parameters\n", mc->model_type,
           mc->layers, r->moe_layers, mc->hidden, mc->experts, mc->topk, mc->vocab, nparam / 1e6);
    if (!gpu)
        printf("cpu: %d OpenMP threads per rank, OMP_WAIT_POLICY=%s\n", omp_get_max_threads(),
               getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(runtime default)");
    if (r->cfg.deterministic)
        printf("deterministic: %s\n", gpu ? "attention on pith's own kernels, not cuDNN's (whose backward adds into dQ "
                                            "with atomics); every other GPU reduction runs in a fixed order in any run"
                                          : "nothing to select on the CPU, whose runs are bit-reproducible already");
    printf("data: %d token files, %lld samples of %d tokens per epoch\n", r->data.nfiles, (long long)r->data.total,
           r->cfg.sequence_length);
    if (d->world.size > 1)
        printf("mesh: %d ranks = pp %d × dp %d × cp %d × ep %d (%s), %d experts per ep rank\n", d->world.size, d->pp,
               d->dp, d->cp, d->ep, d->hsdp ? "hsdp" : "fsdp", mc->experts / d->ep);
    const MemoryPlan *p = &r->plan;
    char pipe[48] = "";
    if (p->pipe) snprintf(pipe, sizeof pipe, "pipeline buffers %.1f MB, ", p->pipe / 1e6);
    printf("plan (%s, %s): weights %.1f MB, gradients %.1f MB, shards %.1f MB, optimizer %.1f MB, activations "
           "%.1f MB, workspace %.1f MB, communication %.1f MB, %sother %.1f MB: total %.1f MB (%zu bytes)\n",
           gpu ? "cuda" : "cpu", d->pp > 1 ? "pipeline rank 0" : "per rank", p->weights / 1e6, p->grads / 1e6,
           p->shards / 1e6, p->optim / 1e6, p->chunks.act_bytes / 1e6, p->chunks.ws_bytes / 1e6,
           p->chunks.comm_bytes / 1e6, pipe, p->other / 1e6, memory_plan_total(p) / 1e6, memory_plan_total(p));
    if (d->pp > 1) { // the pipeline ranks hold different layers: each one's total, as pith estimate prints them
        int64_t *total = xcalloc(d->pp, sizeof(int64_t));
        total[d->pp_g.rank] = (int64_t)memory_plan_total(p);
        comm_allreduce(&d->pp_g, tensor_make(total, DT_I64, DEV_CPU, 1, d->pp, 1, 1, 1), COMM_SUM);
        printf("plan per pipeline rank:");
        for (int k = 0; k < d->pp; k++) printf(" %lld", (long long)total[k]);
        printf(" bytes\n");
        free(total);
    }
    if (gpu)
        printf("plan (cuda): plus %.1f MB of cuBLASLt workspace and conversion pools\n", ops_cuda_pool_bytes() / 1e6);
    if (p->host)
        printf("plan (host): %.1f MB of AdamW moments (optimizer.offload; %zu bytes)\n", p->host / 1e6, p->host);
    if (p->snapshot)
        printf("plan (host): %.1f MB of checkpoint snapshot (checkpoint.async; %zu bytes)\n", p->snapshot / 1e6,
               p->snapshot);
    return memory_plan_total(p) + (gpu ? ops_cuda_pool_bytes() : 0);
}

// The loop's log and state: rank 0 writes metrics.jsonl (and TensorBoard's file); elapsed counts from this
// process's first step, the ETA is its mean step time so far times the steps left to max_steps.
typedef struct {
    char mpath[PATH_MAX_LEN + 32];
    FILE *metrics; // rank 0's (NULL elsewhere)
    TbWriter tb;
    double plan_total, t_loop;
    int first_step, stop;
    int skipped, in_a_row;  // steps whose update was skipped; of them, the latest consecutive ones
    const char *stopped_by; // the signal that stopped the run
} TrainLog;

// One step's line on stdout and its scalars in metrics.jsonl and the TensorBoard file (val: its validation loss,
// on validation steps).
static void log_step(TrainLog *lg, const Run *r, const StepStats *st, bool val, double val_loss) {
    const TrainConfig *cfg = &r->cfg;
    bool gpu = r->model.dev == DEV_CUDA, ep = r->dist.ep > 1;
    char tps[32], elapsed[32], eta[32];
    fmt_thousands(tps, sizeof tps, st->tokens / st->seconds);
    double el = now_seconds() - lg->t_loop, eta_s = el / (r->step - lg->first_step) * (cfg->max_steps - r->step);
    fmt_duration(elapsed, sizeof elapsed, el), fmt_duration(eta, sizeof eta, eta_s);
    double peak = peak_rss_bytes() / 1e9, gpu_peak = gpu ? ops_cuda_peak_bytes() / 1e9 : 0.0; // (one device query)
    printf("step %08d/%08d | loss %.4f", r->step, cfg->max_steps, st->loss);
    if (val) printf(" | val-loss %.4f", val_loss);
    if (cfg->moe_load_balance_coef > 0) printf(" | lb %.6f", st->lb);
    printf(" | lr %.6e | grad-norm %.4f | tokens/s %s | step-time %.3f s | elapsed %s | eta %s | peak-mem %.2f GB",
           st->lr, st->grad_norm, tps, st->seconds, elapsed, eta, peak);
    if (gpu) printf(" | gpu-peak-mem %.3f GB (plan %.3f GB)", gpu_peak, lg->plan_total / 1e9);
    if (ep)
        printf(" | ep-load %.3f | %s %.0f rows", st->ep_load, cfg->parallel.ep_drop_tokens ? "ep-dropped" : "ep-over",
               st->ep_over);
    if (st->pipe_busy_s > 0) printf(" | bubble %.3f (busy %.3f s)", st->bubble, st->pipe_busy_s);
    printf("%s\n", st->nonfinite ? " | not finite: no update" : "");
    if (st->graphs_recorded) // (step-time includes the recording; the next steps launch it)
        printf("cuda_graph: step %d recorded its micro-batches' forward and backward as %d CUDA graph%s\n", r->step,
               st->graphs_recorded, st->graphs_recorded > 1 ? "s" : "");
    // One list of scalars feeds metrics.jsonl and the TensorBoard file; val_loss (on validation steps)
    // comes right after loss, before the timings.
    const char *keys[20] = {"loss"};
    double vals[20] = {st->loss};
    int n = 1;
    if (val) keys[n] = "val_loss", vals[n++] = val_loss;
    const char *rest[] = {"lb_loss",   "lr",    "grad_norm", "tokens_per_s", "step_time_s",
                          "elapsed_s", "eta_s", "fwdbwd_s",  "peak_mem_gb",  "gpu_peak_gb"};
    double restv[] = {st->lb,      st->lr,  st->grad_norm, st->tokens / st->seconds,
                      st->seconds, el,      eta_s,         st->fwdbwd_seconds,
                      peak,        gpu_peak};
    for (int k = 0; k < 10; k++) keys[n] = rest[k], vals[n++] = restv[k];
    if (gpu) { // host-bound where fwdbwd_host_s comes to fwdbwd_s; each host wait leaves the GPU without queued work
        keys[n] = "fwdbwd_host_s", vals[n++] = st->fwdbwd_host;
        keys[n] = "fwdbwd_host_waits", vals[n++] = (double)st->fwdbwd_waits;
    }
    if (ep) { // expert capacity (docs/architecture.md, "Expert capacity")
        keys[n] = "ep_load", vals[n++] = st->ep_load;
        keys[n] = cfg->parallel.ep_drop_tokens ? "ep_dropped_rows" : "ep_over_rows", vals[n++] = st->ep_over;
    }
    if (st->pipe_busy_s > 0) { // the pipeline's idle share (docs/architecture.md, "Pipeline parallelism")
        keys[n] = "pipe_busy_s", vals[n++] = st->pipe_busy_s;
        keys[n] = "bubble", vals[n++] = st->bubble;
    }
    double ckpt_s = ckpt_loop_seconds(); // the loop's time in the saves after the previous step
    if (ckpt_s > 0) keys[n] = "ckpt_s", vals[n++] = ckpt_s;
    if (lg->metrics) write_metrics(lg->metrics, lg->mpath, r->step, n, keys, vals);
    if (lg->tb.f) tboard_scalars(&lg->tb, r->step, n, keys, vals);
}

// A step whose loss or gradient norm is not finite: the run stops (on_nonfinite = fail, or more than
// nonfinite_skip_limit in a row), else its update is skipped with a warning.
static void check_nonfinite(TrainLog *lg, const Run *r, const StepStats *st) {
    const TrainConfig *cfg = &r->cfg;
    if (!st->nonfinite) {
        lg->in_a_row = 0;
        return;
    }
    const char *what = isfinite(st->loss) ? "gradient norm" : "loss";
    double v = isfinite(st->loss) ? st->grad_norm : st->loss;
    if (cfg->on_nonfinite == NONFINITE_FAIL)
        die("step %d: the %s is %s: stopping; nothing is saved after step %d (on_nonfinite = \"skip\" would go on "
            "without this step's update)",
            r->step, what, isnan(v) ? "NaN" : "infinite", r->step - 1);
    // A run that stays diverged must not skip its way to "done": a limit on skips in a row.
    if (++lg->in_a_row > cfg->nonfinite_skip_limit)
        die("step %d: the %s is %s, and steps %d to %d in a row were not finite: more than "
            "nonfinite_skip_limit = %d skipped steps; stopping, nothing is saved after step %d",
            r->step, what, isnan(v) ? "NaN" : "infinite", r->step - lg->in_a_row + 1, r->step,
            cfg->nonfinite_skip_limit, r->step - 1);
    warn("step %d: the %s is %s: this step's update is skipped (weights and moments unchanged)", r->step, what,
         isnan(v) ? "NaN" : "infinite");
    lg->skipped++;
}

// SIGTERM (SLURM's warning before the time limit), SIGINT (Ctrl-C) or SIGUSR1: checkpoint now; SIGTERM and
// SIGINT then stop. Every rank takes the same decision: the flags are summed over the world. Saves when due;
// returns true when the run stops here.
static bool save_or_stop(TrainLog *lg, Run *r) {
    const TrainConfig *cfg = &r->cfg;
    double sig[2] = {got_signal == SIGTERM || got_signal == SIGINT, got_signal == SIGUSR1};
    if (got_signal != SIGINT) got_signal = 0; // (an interrupt stays seen: a second one stops at once)
    comm_allreduce(&r->dist.world, tensor_make(sig, DT_F64, DEV_CPU, 1, 2, 1, 1, 1), COMM_SUM);
    // Named by the summed flags: a signal seen on another rank only is the one this rank reports too.
    const char *name = sig[0] > 0 ? (got_signal == SIGINT ? "SIGINT" : "SIGTERM") : "SIGUSR1";
    bool signalled = sig[0] > 0 || sig[1] > 0, save_now = signalled && cfg->save_location[0];
    if (signalled)
        printf("signal: %s after step %d%s\n", name, r->step,
               save_now ? ": checkpointing" : " (no save_location: nothing to save)");
    if (run_save_due(r) || (r->step == lg->stop && cfg->save_location[0]) || save_now) ckpt_save(r);
    if (sig[0] > 0) lg->stopped_by = name;
    return sig[0] > 0;
}

// Steps until max_steps, the --steps limit or a stopping signal.
static void train_loop(TrainLog *lg, Run *r) {
    const TrainConfig *cfg = &r->cfg;
    lg->t_loop = now_seconds(), lg->first_step = r->step;
    while (r->step < lg->stop) {
        StepStats st = run_step(r);
        // An update whose result is not finite cannot be taken back (the moments moved with it): the run stops
        // under either on_nonfinite before anything is logged, saved or pruned.
        if (st.update_nonfinite)
            die("%s: optimizer.lr: step %d's update (lr %.6e, loss %.4f, grad-norm %.4f, all finite) made weights or "
                "second moments not finite: stopping; nothing is saved after step %d",
                cfg->file, r->step, st.lr, st.loss, st.grad_norm, r->step - 1);
        bool val = run_validation_due(r);
        double val_loss = val ? run_validate(r) : 0;
        log_step(lg, r, &st, val, val_loss);
        check_nonfinite(lg, r, &st);
        if (save_or_stop(lg, r)) break;
    }
}

int cmd_train(int argc, char **argv) {
    dist_launch(); // MPI_Init when mpirun/srun started this process
    if (dist_world_rank() != 0 && !freopen("/dev/null", "w", stdout))
        die("cannot silence stdout of rank %d", dist_world_rank());
    TrainArgs a;
    int rc = train_args(&a, argc, argv);
    if (rc >= 0) return rc;
    TrainConfig cfg;
    config_load(&cfg, a.file, a.sets, a.nsets);
    free(a.sets);
    cfg.allow_config_change = a.allow_change;
    if (a.print_config) {
        json_t *eff = config_printable(&cfg);
        char *text = json_text(eff, 2, false);
        puts(text);
        free(text), json_decref(eff), json_decref(cfg.json);
        return 0;
    }
    Run r;
    run_setup(&r, &cfg, true);
    if (a.dump) snprintf(r.dump_grads, sizeof r.dump_grads, "%s", a.dump);
    TrainLog lg = {.plan_total = print_run(&r)};
    bool rank0 = r.dist.world.rank == 0;
    snprintf(lg.mpath, sizeof lg.mpath, "%s/metrics.jsonl", cfg.run_dir);
    if (rank0) ckpt_lock(cfg.run_dir, "run_dir"); // one run's metrics.jsonl (kept if it is save_location)
    lg.metrics = rank0 ? open_metrics(cfg.run_dir, lg.mpath, r.step) : NULL; // rank 0 logs
    if (lg.metrics && cfg.tensorboard) tboard_open(&lg.tb, cfg.run_dir);
    if (!cfg.save_location[0]) warn("%s: no save_location: this run writes no checkpoints", cfg.file);
    signal(SIGTERM, on_signal), signal(SIGUSR1, on_signal);
    if (signal(SIGINT, SIG_IGN) != SIG_IGN) signal(SIGINT, on_interrupt); // (a shell's background job ignores it)
    lg.stop = a.max_now > 0 && r.step + a.max_now < cfg.max_steps ? r.step + a.max_now : cfg.max_steps;
    train_loop(&lg, &r);
    ckpt_wait(&r); // checkpoint.async: the last save's files
    if (lg.metrics && fclose(lg.metrics)) die("%s: write failed: %s", lg.mpath, strerror(errno));
    tboard_close(&lg.tb);
    printf("%s%s%s: %d of %d steps, metrics in %s\n", r.step == cfg.max_steps ? "done" : "stopped",
           lg.stopped_by ? " by " : "", lg.stopped_by ? lg.stopped_by : "", r.step, cfg.max_steps, lg.mpath);
    if (lg.skipped) printf("skipped: the updates of %d steps whose loss or gradient norm was not finite\n", lg.skipped);
    run_free(&r);
    json_decref(cfg.json);
    dist_finalize();
    return 0;
}
