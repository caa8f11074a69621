// ckpt.c — writing, finding, loading and pruning checkpoints (see ckpt.h).
#include "train/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <unistd.h>

#include "base/safetensors.h"

// Canonical name of a tensor in a pith or HF file: HF prefixes all but lm_head with "model.".
static const char *canonical(const char *name) { return strncmp(name, "model.", 6) ? name : name + 6; }

void ckpt_load_model(const ParamTable *t, float *flat[NGROUPS], const char *dir) {
    StSet s;
    st_set_open_or_die(&s, dir);
    for (int i = 0; i < s.n; i++) { // every tensor in the files must be one of the model's
        const char *name = canonical(s.t[i]->name);
        if (!params_find(t, name)) die("%s: tensor '%s' is not a parameter of this model", s.t[i]->file, s.t[i]->name);
    }
    char hfname[160];
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *p = &t->p[i];
        const StTensor *x = st_set_find(&s, p->name);
        if (!x) {
            snprintf(hfname, sizeof hfname, "model.%s", p->name);
            x = st_set_find(&s, hfname);
        }
        if (!x) die("%s: tensor '%s' is missing", dir, p->name);
        st_check_shape(x, p->nd, p->shape);
        st_read_f32(x, flat[p->group] + p->off);
    }
    st_set_close(&s);
}

static bool parse_step_dir(const char *name, int *step) {
    int n = 0;
    return sscanf(name, "step-%8d%n", step, &n) == 1 && n == 13 && name[n] == 0;
}

bool ckpt_find_latest(const char *loc, char *out, size_t cap) {
    DIR *d = opendir(loc);
    if (!d) return false;
    int best = -1, step;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d))) {
        if (!strncmp(de->d_name, ".tmp-step-", 10)) { // a save that did not finish
            path_join(path, sizeof path, loc, de->d_name);
            remove_tree(path);
        } else if (parse_step_dir(de->d_name, &step) && step > best) best = step;
    }
    closedir(d);
    if (best < 0) return false;
    snprintf(out, cap, "%s/step-%08d", loc, best);
    return true;
}

// Host fp32 copies of the masters (the masters themselves on the CPU).
static void host_copies(Run *r, Tensor *src, float *out[NGROUPS], bool *owned) {
    for (int g = 0; g < NGROUPS; g++) {
        owned[g] = src[g].dev != DEV_CPU;
        out[g] = owned[g] ? xmalloc(tensor_bytes(src[g]) + 1) : src[g].p;
        if (owned[g]) op_copy(tensor_make(out[g], DT_F32, DEV_CPU, 1, tensor_numel(src[g]), 1, 1, 1), src[g]);
    }
}

static void add_tensors(StWriter *w, const ParamTable *t, float *flat[NGROUPS], const char *prefix) {
    char name[200];
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *p = &t->p[i];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        st_writer_add_f32(w, name, ST_F32, p->nd, p->shape, flat[p->group] + p->off);
    }
}

static void prune(const char *loc, int keep_last) {
    DIR *d = opendir(loc);
    if (!d) return;
    int steps[4096], n = 0, step;
    struct dirent *de;
    while ((de = readdir(d)) && n < 4096)
        if (parse_step_dir(de->d_name, &step)) steps[n++] = step;
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
        if (newer >= keep_last) {
            char path[4200];
            snprintf(path, sizeof path, "%s/step-%08d", loc, steps[i]);
            remove_tree(path);
        }
    }
}

void ckpt_save(Run *r) {
    const TrainConfig *c = &r->cfg;
    double t0 = now_seconds();
    char tmp[4200], final[4200], path[4400];
    mkdir_p(c->save_location);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08d", c->save_location, r->step);
    snprintf(final, sizeof final, "%s/step-%08d", c->save_location, r->step);
    remove_tree(tmp);
    mkdir_p(tmp);
    float *w[NGROUPS], *m[NGROUPS], *v[NGROUPS];
    bool ow[NGROUPS], om[NGROUPS], ov[NGROUPS];
    host_copies(r, r->master, w, ow), host_copies(r, r->adam_m, m, om), host_copies(r, r->adam_v, v, ov);
    StWriter sw;
    st_writer_init(&sw);
    st_writer_meta(&sw, "format", "pith");
    add_tensors(&sw, &r->model.params, w, "");
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    st_writer_write(&sw, path);
    st_writer_free(&sw);
    st_writer_init(&sw);
    add_tensors(&sw, &r->model.params, m, "exp_avg.");
    add_tensors(&sw, &r->model.params, v, "exp_avg_sq.");
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    st_writer_write(&sw, path);
    st_writer_free(&sw);
    for (int g = 0; g < NGROUPS; g++) {
        if (ow[g]) free(w[g]);
        if (om[g]) free(m[g]);
        if (ov[g]) free(v[g]);
    }
    // config.json: the model's own file, copied byte for byte
    char mcfg[4200];
    if (path_is_dir(c->model)) snprintf(mcfg, sizeof mcfg, "%s/config.json", c->model);
    else snprintf(mcfg, sizeof mcfg, "%s", c->model);
    size_t n;
    char *text = file_read_all(mcfg, &n);
    if (!text) die("%s: cannot read: %s", mcfg, strerror(errno));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    file_write_atomic(path, text, n);
    free(text);
    json_t *run = json_pack("{s:s, s:s, s:i, s:I, s:I, s:O}", "format", "pith-checkpoint-1", "pith_version", PITH_VERSION, "step",
                            r->step, "samples_consumed", (json_int_t)r->step * c->global_batch_size, "seed", (json_int_t)c->seed,
                            "train_config", c->json);
    text = json_dumps(run, JSON_INDENT(1) | JSON_SORT_KEYS);
    snprintf(path, sizeof path, "%s/run.json", tmp);
    file_write_atomic(path, text, strlen(text));
    free(text), json_decref(run);
    fsync_dir(tmp);
    if (path_exists(final)) remove_tree(final); // a re-run that saves the same step again
    if (rename(tmp, final)) die("%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    fsync_dir(c->save_location);
    if (c->keep_last) prune(c->save_location, c->keep_last);
    printf("checkpoint: step %d saved to %s (%.2f s)\n", r->step, final, now_seconds() - t0);
}

// Host staging for loading into the run's masters: fp32 buffers per group, then copied to the device.
static void load_into(Run *r, Tensor *dst, const char *dir) {
    float *buf[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) buf[g] = xmalloc(tensor_bytes(dst[g]) + 1);
    ckpt_load_model(&r->model.params, buf, dir);
    for (int g = 0; g < NGROUPS; g++) {
        op_copy(dst[g], tensor_make(buf[g], DT_F32, DEV_CPU, 1, tensor_numel(dst[g]), 1, 1, 1));
        free(buf[g]);
    }
}

static void refresh_compute_copy(Run *r) {
    for (int g = 0; g < NGROUPS; g++)
        if (r->master[g].p != r->model.w[g].p) op_copy(r->model.w[g], r->master[g]);
}

void ckpt_init_from(Run *r, const char *dir) {
    if (!path_is_dir(dir)) die("%s: init_from: not a folder", dir);
    load_into(r, r->master, dir);
    refresh_compute_copy(r);
    printf("init: weights loaded from %s\n", dir);
}

void ckpt_resume(Run *r, const char *dir) {
    load_into(r, r->master, dir);
    refresh_compute_copy(r);
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    if (!path_exists(path)) { // model-only (e.g. from `pith convert hf2pith`): fresh optimizer at step 0
        printf("resume: weights from %s (model only, optimizer starts fresh)\n", dir);
        return;
    }
    json_t *root = json_load_or_die(path);
    JObj o = jobj_root(root, path);
    r->step = (int)jint(o, "step", true, 0);
    if (r->step < 0 || r->step > r->cfg.max_steps) jdie(o, "step", "%d is outside [0, max_steps = %d]", r->step, r->cfg.max_steps);
    json_decref(root);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    StFile f;
    st_open_or_die(&f, path);
    for (int k = 0; k < 2; k++) {
        Tensor *dst = k ? r->adam_v : r->adam_m;
        const char *prefix = k ? "exp_avg_sq." : "exp_avg.";
        float *buf[NGROUPS];
        for (int g = 0; g < NGROUPS; g++) buf[g] = xmalloc(tensor_bytes(dst[g]) + 1);
        char name[200];
        for (int i = 0; i < r->model.params.n; i++) {
            const ParamInfo *p = &r->model.params.p[i];
            snprintf(name, sizeof name, "%s%s", prefix, p->name);
            const StTensor *x = st_find(&f, name);
            if (!x) die("%s: tensor '%s' is missing", path, name);
            st_check_shape(x, p->nd, p->shape);
            st_read_f32(x, buf[p->group] + p->off);
        }
        for (int g = 0; g < NGROUPS; g++) {
            op_copy(dst[g], tensor_make(buf[g], DT_F32, DEV_CPU, 1, tensor_numel(dst[g]), 1, 1, 1));
            free(buf[g]);
        }
    }
    if (f.n != 2 * r->model.params.n) die("%s: holds %d tensors, expected %d", path, f.n, 2 * r->model.params.n);
    st_close(&f);
    printf("resume: step %d from %s\n", r->step, dir);
}
