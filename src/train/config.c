// config.c — reading and validating the training config (see config.h). Paths inside the file are
// relative to the file's folder; paths given with --set are relative to the current directory.
#include "train/config.h"

#include <math.h>

static const char *const top_keys[] = {"model", "dataset", "run_dir", "save_location", "init_from", "sequence_length",
                                       "micro_batch_size", "global_batch_size", "max_steps", "seed", "init_std", "optimizer",
                                       "scheduler", "clip_grad_norm", "moe_load_balance_coef", "moe_load_balance_type", "moe_router_bias_update_rate",
                                       "save_interval", "keep_last", "parallel", "device", "compute_dtype", "benchmark", "tensorboard", "validation", NULL};
static const char *const optimizer_keys[] = {"type", "lr", "betas", "eps", "weight_decay", "momentum", NULL};
static const char *const scheduler_keys[] = {"type", "warmup_ratio", "decay_ratio", "start_lr", "final_lr", "decay_shape", NULL};
static const char *const parallel_keys[] = {"pipeline_parallel_size", "context_parallel_size", "expert_parallel_size",
                                            "sharding_strategy", "timeout_s", "ep_capacity_factor", NULL};
static const char *const validation_keys[] = {"dataset", "interval", "batches", NULL};
static const char *const path_keys[] = {"model", "dataset", "run_dir", "save_location", "init_from", NULL};

// Applies one "a.b.c=value" override; value is JSON when it parses as JSON, else a string.
static void apply_set(json_t *root, const char *file, const char *set) {
    const char *eq = strchr(set, '=');
    if (!eq || eq == set) die("--set %s: expected key=value", set);
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - set), set);
    json_t *val = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!val) val = json_string(eq + 1);
    json_t *obj = root;
    char *save, *part = strtok_r(key, ".", &save), *next;
    while ((next = strtok_r(NULL, ".", &save))) {
        json_t *child = json_object_get(obj, part);
        if (!child || json_is_null(child)) json_object_set_new(obj, part, child = json_object());
        if (!json_is_object(child)) die("--set %s: %s: '%s' is not an object", set, file, part);
        obj = child, part = next;
    }
    json_object_set_new(obj, part, val);
}

static void copy_str(char *dst, size_t cap, JObj o, const char *key, const char *def) {
    const char *s = jstr(o, key, false, def);
    if (strlen(s) >= cap) jdie(o, key, "too long");
    snprintf(dst, cap, "%s", s);
}

static int positive(JObj o, const char *key, bool required, int64_t def) {
    int64_t v = jint(o, key, required, def);
    if (v <= 0 || v > 1 << 30) jdie(o, key, "must be a positive integer (got %lld)", (long long)v);
    return (int)v;
}

void config_load(TrainConfig *c, const char *file, char **sets, int nsets) {
    memset(c, 0, sizeof *c);
    snprintf(c->file, sizeof c->file, "%s", file);
    json_t *root = json_load_or_die(file);
    JObj o = jobj_root(root, file);
    // Paths written in the file are relative to the file's folder: resolve them before any override.
    char dir[PATH_MAX_LEN], buf[PATH_MAX_LEN];
    path_dirname(dir, sizeof dir, file);
    for (const char *const *k = path_keys; *k; k++) {
        json_t *v = json_object_get(root, *k);
        if (v && json_is_string(v) && json_string_value(v)[0]) {
            path_join(buf, sizeof buf, dir, json_string_value(v));
            path_normalize(buf);
            json_object_set_new(root, *k, json_string(buf));
        }
    }
    json_t *vd = json_object_get(json_object_get(root, "validation"), "dataset");
    if (vd && json_is_string(vd) && json_string_value(vd)[0]) {
        path_join(buf, sizeof buf, dir, json_string_value(vd));
        path_normalize(buf);
        json_object_set_new(json_object_get(root, "validation"), "dataset", json_string(buf));
    }
    for (int i = 0; i < nsets; i++) apply_set(root, file, sets[i]);
    jcheck_known(o, top_keys);

    copy_str(c->model, sizeof c->model, o, "model", NULL);
    if (!jhas(o, "model")) jdie(o, "model", "missing required key");
    copy_str(c->dataset, sizeof c->dataset, o, "dataset", "");
    copy_str(c->save_location, sizeof c->save_location, o, "save_location", "");
    copy_str(c->init_from, sizeof c->init_from, o, "init_from", "");
    c->sequence_length = positive(o, "sequence_length", true, 0);
    c->micro_batch_size = positive(o, "micro_batch_size", true, 0);
    c->global_batch_size = positive(o, "global_batch_size", true, 0);
    c->max_steps = positive(o, "max_steps", true, 0);
    int64_t seed = jint(o, "seed", false, 1234);
    if (seed < 0) jdie(o, "seed", "must be non-negative");
    c->seed = (uint64_t)seed;
    c->init_std = jnum(o, "init_std", false, 0.02);
    if (!(c->init_std >= 0)) jdie(o, "init_std", "must be non-negative");
    c->clip_grad_norm = jnum(o, "clip_grad_norm", false, 1.0);
    if (!(c->clip_grad_norm >= 0)) jdie(o, "clip_grad_norm", "must be non-negative (0 disables clipping)");
    c->moe_load_balance_coef = jnum(o, "moe_load_balance_coef", false, 0.0);
    if (!(c->moe_load_balance_coef >= 0)) jdie(o, "moe_load_balance_coef", "must be non-negative");
    c->moe_router_bias_update_rate = jnum(o, "moe_router_bias_update_rate", false, 0.0);
    if (!(c->moe_router_bias_update_rate >= 0)) jdie(o, "moe_router_bias_update_rate", "must be non-negative (0: off)");
    copy_str(c->moe_load_balance_type, sizeof c->moe_load_balance_type, o, "moe_load_balance_type", "micro-batch");
    if (strcmp(c->moe_load_balance_type, "micro-batch") && strcmp(c->moe_load_balance_type, "global-batch") &&
        strcmp(c->moe_load_balance_type, "sequence"))
        jdie(o, "moe_load_balance_type", "'%s' is not supported (supported: micro-batch, global-batch, sequence)", c->moe_load_balance_type);
    c->save_interval = jhas(o, "save_interval") ? positive(o, "save_interval", true, 0) : 0;
    c->keep_last = jhas(o, "keep_last") ? positive(o, "keep_last", true, 0) : 0;
    copy_str(c->device, sizeof c->device, o, "device", "auto");
    if (strcmp(c->device, "auto") && strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        jdie(o, "device", "must be \"auto\", \"cpu\" or \"cuda\" (got \"%s\")", c->device);
    copy_str(c->compute_dtype, sizeof c->compute_dtype, o, "compute_dtype", "bf16");
    if (strcmp(c->compute_dtype, "bf16") && strcmp(c->compute_dtype, "fp32"))
        jdie(o, "compute_dtype", "must be \"bf16\" or \"fp32\" (got \"%s\")", c->compute_dtype);
    c->benchmark = jbool(o, "benchmark", false, false);
    c->tensorboard = jbool(o, "tensorboard", false, true);

    JObj opt = jobj_child(o, "optimizer");
    jcheck_known(opt, optimizer_keys);
    copy_str(c->optimizer.type, sizeof c->optimizer.type, opt, "type", "adamw");
    if (strcmp(c->optimizer.type, "adamw") && strcmp(c->optimizer.type, "muon"))
        jdie(opt, "type", "'%s' is not supported (supported: adamw, muon)", c->optimizer.type);
    c->optimizer.lr = jnum(opt, "lr", true, 0);
    if (!(c->optimizer.lr >= 0)) jdie(opt, "lr", "must be non-negative");
    c->optimizer.beta1 = 0.9, c->optimizer.beta2 = 0.999;
    json_t *betas = opt.obj ? json_object_get(opt.obj, "betas") : NULL;
    if (betas) {
        if (!json_is_array(betas) || json_array_size(betas) != 2 || !json_is_number(json_array_get(betas, 0)) ||
            !json_is_number(json_array_get(betas, 1)))
            jdie(opt, "betas", "expected [beta1, beta2]");
        c->optimizer.beta1 = json_number_value(json_array_get(betas, 0));
        c->optimizer.beta2 = json_number_value(json_array_get(betas, 1));
        if (!(c->optimizer.beta1 >= 0 && c->optimizer.beta1 < 1 && c->optimizer.beta2 >= 0 && c->optimizer.beta2 < 1))
            jdie(opt, "betas", "each beta must be in [0, 1)");
    }
    c->optimizer.eps = jnum(opt, "eps", false, 1e-8);
    c->optimizer.weight_decay = jnum(opt, "weight_decay", false, 0.1);
    c->optimizer.momentum = jnum(opt, "momentum", false, 0.95);
    if (!(c->optimizer.momentum >= 0 && c->optimizer.momentum < 1)) jdie(opt, "momentum", "must be in [0, 1)");

    JObj sch = jobj_child(o, "scheduler");
    jcheck_known(sch, scheduler_keys);
    copy_str(c->scheduler.type, sizeof c->scheduler.type, sch, "type", "constant");
    if (strcmp(c->scheduler.type, "constant") && strcmp(c->scheduler.type, "wsd"))
        jdie(sch, "type", "must be \"constant\" or \"wsd\" (got \"%s\")", c->scheduler.type);
    c->scheduler.warmup_ratio = jnum(sch, "warmup_ratio", false, 0.0);
    c->scheduler.decay_ratio = jnum(sch, "decay_ratio", false, 0.1);
    c->scheduler.start_lr = jnum(sch, "start_lr", false, 0.0);
    c->scheduler.final_lr = jnum(sch, "final_lr", false, 0.0);
    copy_str(c->scheduler.decay_shape, sizeof c->scheduler.decay_shape, sch, "decay_shape", "cosine");
    if (strcmp(c->scheduler.decay_shape, "cosine") && strcmp(c->scheduler.decay_shape, "linear"))
        jdie(sch, "decay_shape", "must be \"cosine\" or \"linear\"");
    if (!(c->scheduler.warmup_ratio >= 0 && c->scheduler.decay_ratio >= 0 && c->scheduler.warmup_ratio + c->scheduler.decay_ratio <= 1))
        jdie(sch, "warmup_ratio", "warmup_ratio and decay_ratio must be non-negative and sum to at most 1");

    JObj par = jobj_child(o, "parallel");
    jcheck_known(par, parallel_keys);
    c->parallel.pp = positive(par, "pipeline_parallel_size", false, 1);
    c->parallel.cp = positive(par, "context_parallel_size", false, 1);
    c->parallel.ep = positive(par, "expert_parallel_size", false, 1);
    copy_str(c->parallel.sharding, sizeof c->parallel.sharding, par, "sharding_strategy", "fsdp");
    if (strcmp(c->parallel.sharding, "fsdp") && strcmp(c->parallel.sharding, "hsdp"))
        jdie(par, "sharding_strategy", "must be \"fsdp\" or \"hsdp\"");
    c->parallel.timeout_s = jnum(par, "timeout_s", false, 900.0);
    if (!(c->parallel.timeout_s > 0)) jdie(par, "timeout_s", "must be positive (seconds)");
    c->parallel.ep_capacity_factor = jnum(par, "ep_capacity_factor", false, 0.0);
    if (!(c->parallel.ep_capacity_factor >= 0)) jdie(par, "ep_capacity_factor", "must be non-negative (0: the worst-case bound)");

    JObj val = jobj_child(o, "validation");
    jcheck_known(val, validation_keys);
    if (val.obj) {
        if (!jhas(val, "dataset")) jdie(val, "dataset", "missing required key");
        copy_str(c->validation.dataset, sizeof c->validation.dataset, val, "dataset", NULL);
        c->validation.batches = positive(val, "batches", false, 1);
        c->validation.interval = jhas(val, "interval") ? positive(val, "interval", true, 0) : 0;
    }

    if (c->global_batch_size % c->micro_batch_size)
        jdie(o, "global_batch_size", "must be a multiple of micro_batch_size (got %d and %d)", c->global_batch_size, c->micro_batch_size);

    const char *rd = jstr(o, "run_dir", false, NULL);
    if (rd) snprintf(c->run_dir, sizeof c->run_dir, "%s", rd);
    else if (c->save_location[0]) snprintf(c->run_dir, sizeof c->run_dir, "%s", c->save_location);
    else {
        // runs/<config folder>-<config name>, e.g. runs/tiny-train for examples/tiny/train.json
        const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file, *parent = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
        snprintf(c->run_dir, sizeof c->run_dir, "runs/%.200s-%.*s", parent, (int)(strcspn(base, ".") % 200), base);
    }
    c->json = root;
}

double config_lr_factor(const TrainConfig *c, int s) {
    if (!strcmp(c->scheduler.type, "constant")) return 1.0;
    double lr = c->optimizer.lr, sf = lr > 0 ? c->scheduler.start_lr / lr : 0, ff = lr > 0 ? c->scheduler.final_lr / lr : 0;
    int W = (int)nearbyint(c->scheduler.warmup_ratio * c->max_steps), D = (int)nearbyint(c->scheduler.decay_ratio * c->max_steps);
    int stable = c->max_steps - W - D;
    if (s < W) return sf + (1 - sf) * s / W;
    if (s < W + stable || D == 0) return 1.0;
    double t = (double)(s - W - stable) / D;
    if (t > 1) t = 1;
    if (!strcmp(c->scheduler.decay_shape, "cosine")) return ff + (1 - ff) * 0.5 * (1 + cos(M_PI * t));
    return 1 + (ff - 1) * t;
}
