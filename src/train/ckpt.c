// ckpt.c — writing, finding, loading and pruning checkpoints (see ckpt.h).
#include "train/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

// Canonical name of a tensor in a pith or HF file: HF prefixes all but lm_head with "model.".
static const char *canonical(const char *name) { return strncmp(name, "model.", 6) ? name : name + 6; }

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// The first tensor of s that is not <a prefix><a parameter of the whole model `all`> (with hf, HF's "model." may
// stand in front of that); NULL when there is none.
static const StTensor *first_unknown(const StSet *s, const ParamTable *all, int nprefix, const char *const *prefix,
                                     bool hf) {
    const char **names = xmalloc(all->n * sizeof *names + 1);
    const StTensor *bad = NULL;
    for (int i = 0; i < all->n; i++) names[i] = all->p[i].name;
    qsort(names, all->n, sizeof *names, cmp_name);
    for (int i = 0; i < s->n && !bad; i++) {
        bool known = false;
        for (int k = 0; k < nprefix && !known; k++) {
            size_t n = strlen(prefix[k]);
            const char *rest = s->t[i]->name + n;
            if (strncmp(s->t[i]->name, prefix[k], n)) continue;
            if (hf) rest = canonical(rest);
            known = bsearch(&rest, names, all->n, sizeof *names, cmp_name) != NULL;
        }
        if (!known) bad = s->t[i];
    }
    free(names);
    return bad;
}

// Dies unless every tensor of s is a parameter of `all` (as first_unknown).
static void check_known(const StSet *s, const ParamTable *all, int nprefix, const char *const *prefix, bool hf) {
    const StTensor *bad = first_unknown(s, all, nprefix, prefix, hf);
    if (bad) die("%s: tensor '%s' is not a parameter of this model", bad->file, bad->name);
}

// The weights of model folder dir: a pith checkpoint or an HF folder read as they are, or — an HF folder in a
// family's own layout (GPT-OSS's grouped, transposed experts, MXFP4 blocks) — the canonical tensors its hf_import
// makes in memory, as `pith convert hf2pith` would write them (MXFP4 dequantized exactly, in fp32).
typedef struct {
    StSet file, made; // the folder; the tensors made in memory (made.n == 0: none)
    StWriter w;
    HfBuffers keep;
} ModelTensors;

static const StSet *model_tensors_open(ModelTensors *mt, const char *dir, const ParamTable *all) {
    *mt = (ModelTensors){0};
    st_set_open_or_die(&mt->file, dir);
    const StTensor *bad = first_unknown(&mt->file, all, 1, (const char *[]){""}, true);
    if (!bad) return &mt->file;
    char cfg[4300];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    ModelConfig mc;
    const ModelFamily *fam = !strncmp(bad->name, "model.", 6) && path_exists(cfg) ? model_config_load(&mc, cfg) : NULL;
    if (!fam || !fam->hf_import) die("%s: tensor '%s' is not a parameter of this model", bad->file, bad->name);
    st_writer_init(&mt->w);
    fam->hf_import(&mc, all, &mt->file, &mt->w, "fp32", &mt->keep);
    st_set_from_writer(&mt->made, &mt->w, dir);
    check_known(&mt->made, all, 1, (const char *[]){""}, false);
    return &mt->made;
}

static void model_tensors_close(ModelTensors *mt) {
    st_set_close(&mt->made), st_writer_free(&mt->w), hf_buffers_free(&mt->keep), st_set_close(&mt->file);
}

// Reads <prefix><name> (with hf also "model.<name>") of every parameter of t from s into flat: host fp32
// buffers of the groups, each tensor at its offset.
static void read_params(const StSet *s, const char *where, const ParamTable *t, const char *prefix, bool hf,
                        float *flat[NGROUPS]) {
    char name[200];
    for (int i = 0; i < t->n; i++) {
        const ParamInfo *p = &t->p[i];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        const StTensor *x = st_set_find(s, name);
        if (!x && hf) {
            snprintf(name, sizeof name, "model.%s", p->name);
            x = st_set_find(s, name);
        }
        if (!x) die("%s: tensor '%s%s' is missing", where, prefix, p->name);
        st_check_shape(x, p->nd, p->shape);
        float *v = flat[p->group] + p->off;
        st_read_f32(x, v);
        // Weights and moments train only when finite; a second moment is a mean of squares, never negative.
        bool second = !strncmp(prefix, "exp_avg_sq.", 11);
        for (int64_t k = 0, n = params_numel(p); k < n; k++)
            if (!isfinite(v[k]) || (second && v[k] < 0))
                die("%s: tensor '%s': element %lld is %g (%s)", x->file, x->name, (long long)k, v[k],
                    second ? "a second moment must be finite and not negative" : "weights must be finite");
    }
}

// run.json's format: pith-checkpoint-2 carries "checksums"; pith-checkpoint-1, the format without them, loads unverified.
#define CKPT_FORMAT "pith-checkpoint-2"

// Dies unless dir/run.json (when there is one) names a format pith reads and every file of its "checksums"
// hashes to the recorded value; this rank checks the files i ≡ rank (mod ranks) of the list.
static void verify_folder(const char *dir, int rank, int ranks) {
    char path[4200], file[4400];
    snprintf(path, sizeof path, "%s/run.json", dir);
    if (!path_exists(path)) return; // model only (`pith convert hf2pith`, an HF folder)
    json_t *root = json_load_or_die(path);
    JObj o = jobj_root(root, path);
    const char *format = jstr(o, "format", true, "");
    bool v1 = !strcmp(format, "pith-checkpoint-1");
    if (!v1 && strcmp(format, CKPT_FORMAT))
        jdie(o, "format", "'%s' is not a checkpoint format this pith reads (%s, or pith-checkpoint-1)", format,
             CKPT_FORMAT);
    json_t *sums = json_object_get(root, "checksums"), *v;
    if (!v1 && !json_is_object(sums)) jdie(o, "checksums", "missing (every file's checksum, in %s)", CKPT_FORMAT);
    const char *name;
    int i = 0;
    json_object_foreach(v1 ? NULL : sums, name, v) {
        if (i++ % ranks != rank) continue;
        unsigned long long want;
        int used = 0;
        if (!json_is_string(v) || sscanf(json_string_value(v), "%16llx%n", &want, &used) != 1 || used != 16 ||
            strchr(name, '/') || !strcmp(name, ".."))
            jdie(o, "checksums", "'%s': expected a file of the folder and 16 hex digits", name);
        uint64_t got;
        snprintf(file, sizeof file, "%s/%s", dir, name);
        if (!file_hash64(file, &got)) die("%s: cannot read: %s (listed in %s)", file, strerror(errno), path);
        if (got != want)
            die("%s: checksum %016llx, %s records %016llx: the file changed after it was saved (corrupt)", file,
                (unsigned long long)got, path, want);
    }
    json_decref(root);
}

void ckpt_load_model_part(const ParamTable *all, const ParamTable *t, float *flat[NGROUPS], const char *dir) {
    if (path_is_dir(dir)) verify_folder(dir, 0, 1);
    ModelTensors mt;
    read_params(model_tensors_open(&mt, dir, all), dir, t, "", true, flat);
    model_tensors_close(&mt);
}

// This rank's shards (one per group) of the tensors <prefix><name> of its parameters in s.
static void load_shards(Run *r, const StSet *s, const char *where, const char *prefix, bool hf, const Tensor *shard) {
    float *full[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) full[g] = xcalloc(r->fsdp.numel[g] + 1, sizeof(float));
    read_params(s, where, &r->model.params, prefix, hf, full);
    for (int g = 0; g < NGROUPS; g++) {
        fsdp_take_shard(&r->fsdp, g, shard[g], full[g]);
        free(full[g]);
    }
}

// ---- writing whole tensors from shards ----

typedef struct {
    const char *prefix;  // "" for weights, "exp_avg." …
    const Tensor *shard; // (NGROUPS) this rank's shards
} Part;

// The rank writing tensor i of the parameter table of pipeline rank p and ep rank e: round-robin over the
// ranks holding it — the ranks of pipeline stage p (its dp×cp×ep ranks are consecutive) for non-expert
// tensors; those of them with ep coordinate e for e's experts.
static int owner_of(const Dist *d, int group, int i, int p, int e) {
    int stage = d->world.size / d->pp, first = p * stage;
    if (group == GROUP_DENSE) return first + i % stage;
    return first + i % (stage / d->ep) * d->ep + e;
}

static void file_of(char *out, size_t cap, const char *base, int rank, int world) {
    if (world == 1) snprintf(out, cap, "%s.safetensors", base);
    else snprintf(out, cap, "%s-%05d-of-%05d.safetensors", base, rank + 1, world);
}

// run.json's "checksums": file name → hash64 of its bytes, 16 hex digits.
static void checksum_add(json_t *sums, const char *name, uint64_t h) {
    char hex[24];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_object_set_new(sums, name, json_string(hex));
}

// <base>.safetensors.index.json in HF's form: every tensor of the whole model → the file of its owner.
static void write_index(const Run *r, const char *dir, const char *base, int nparts, const Part *parts, json_t *sums) {
    const Dist *d = &r->dist;
    json_t *map = json_object();
    int64_t total = 0;
    char name[200], file[80], path[4400];
    for (int p = 0; p < d->pp; p++)
        for (int e = 0; e < d->ep; e++) { // (p, e)'s table: p's non-expert tensors and e's experts of p's layers
            ModelConfig c = r->model.cfg;
            c.pp_rank = p, c.ep_rank = e;
            Model shape;
            model_describe(&shape, r->model.fam, &c, DEV_CPU, DT_F32, 1);
            const ParamTable *t = &shape.params;
            for (int k = 0; k < nparts; k++)
                for (int i = 0; i < t->n; i++) {
                    if (e > 0 && t->p[i].group == GROUP_DENSE) continue;
                    snprintf(name, sizeof name, "%s%s", parts[k].prefix, t->p[i].name);
                    file_of(file, sizeof file, base, owner_of(d, t->p[i].group, i, p, e), d->world.size);
                    json_object_set_new(map, name, json_string(file));
                    total += params_numel(&t->p[i]) * 4;
                }
            model_free(&shape);
        }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", dir, base);
    file_write_atomic(path, text, strlen(text));
    if (sums) checksum_add(sums, path + strlen(dir) + 1, hash64(text, strlen(text)));
    free(text), json_decref(root);
}

// One file of a save on this rank: the tensors it owns, listed from the save's snapshot, then written and hashed.
typedef struct {
    StWriter w;
    char path[4400];
    char *own;     // the snapshot's memory when it is not the run's arena (write_file frees it)
    uint64_t hash; // of the file written (0: this rank writes none)
} SaveFile;

static bool owns(const ParamTable *t, int i, const Dist *d) {
    return owner_of(d, t->p[i].group, i, d->pp_g.rank, d->ep_g.rank) == d->world.rank;
}

// The snapshot bytes of a file of these parts on this rank: the tensors it writes, each part in its own dtype.
static size_t parts_bytes(const ParamTable *t, const Dist *d, int nparts, const Part *parts) {
    size_t n = 0;
    for (int k = 0; k < nparts; k++)
        for (int i = 0; i < t->n; i++)
            if (owns(t, i, d)) n += params_numel(&t->p[i]) * dtype_size(parts[k].shard[t->p[i].group].dt);
    return n;
}

// The pending device rows run into the snapshot bytes that end at end.
static void copy_run(Tensor *run, char *end) {
    op_copy_async(tensor_make(end - tensor_bytes(*run), run->dt, DEV_CPU, 1, tensor_numel(*run), 1, 1, 1), *run);
    *run = (Tensor){0};
}

// Copies the tensors of the parts this rank writes into mem (parts_bytes of them; NULL: memory of f's own), each part
// in its own dtype (bf16 moments stay bf16, as the file keeps them), and lists them in f, bound for
// dir/<base>[-<rank+1>-of-<ranks>].safetensors; returns the bytes used. A group held whole (one shard) is copied by
// op_copy_async (on the copy stream after the compute stream's work so far, complete at ops_copies_wait); a sharded
// group is first
// all-gathered into fp32 host memory (collective over the world, in the loop).
static size_t snapshot_parts(Run *r, SaveFile *f, char *mem, const char *dir, const char *base, int nparts,
                             const Part *parts, const char *format) {
    const Dist *d = &r->dist;
    const ParamTable *t = &r->model.params;
    *f = (SaveFile){.own = mem ? NULL : xmalloc(parts_bytes(t, d, nparts, parts) + 1)};
    char name[200], file[80], *at = mem = mem ? mem : f->own;
    st_writer_init(&f->w);
    if (format) st_writer_meta(&f->w, "format", format);
    for (int k = 0; k < nparts; k++) {
        float *full[NGROUPS] = {0};
        for (int g = 0; g < NGROUPS; g++)
            if (r->fsdp.shard[g]->size > 1) {
                full[g] = xmalloc(r->fsdp.numel[g] * sizeof(float) + 1);
                fsdp_gather_host(&r->fsdp, g, full[g], parts[k].shard[g]);
            }
        // Tensors adjacent in the shard are one copy (run: the pending one, ending at `at`): a save issues a few
        // large device-to-host copies, not one per tensor (a queue of thousands blocks the loop until it drains).
        Tensor run = {0};
        for (int i = 0; i < t->n; i++) {
            const ParamInfo *p = &t->p[i];
            if (!owns(t, i, d)) continue;
            Tensor src = parts[k].shard[p->group], dst = tensor_make(at, src.dt, DEV_CPU, 1, params_numel(p), 1, 1, 1);
            Tensor rows = full[p->group] ? (Tensor){0} : tensor_rows(src, p->off, params_numel(p)); // (a shard's rows)
            CHECK(src.dt == DT_F32 || src.dt == DT_BF16);
            if (run.p && (full[p->group] || rows.p != (char *)run.p + tensor_bytes(run) || rows.dt != run.dt))
                copy_run(&run, at);
            if (full[p->group]) op_copy(dst, tf32_1(full[p->group] + p->off, params_numel(p)));
            else if (run.p) run.n[0] += rows.n[0];
            else run = rows;
            snprintf(name, sizeof name, "%s%s", parts[k].prefix, p->name);
            st_writer_add_raw(&f->w, name, src.dt == DT_BF16 ? ST_BF16 : ST_F32, p->nd, p->shape, at);
            at += tensor_bytes(dst);
        }
        if (run.p) copy_run(&run, at);
        for (int g = 0; g < NGROUPS; g++) free(full[g]);
    }
    file_of(file, sizeof file, base, d->world.rank, d->world.size);
    snprintf(f->path, sizeof f->path, "%s/%s", dir, file);
    return (size_t)(at - mem);
}

// Writes f's file (none when this rank owns no tensor) once the snapshot's copies are done and hashes it (from the
// page cache). No communication: it may run on a thread of its own.
static void write_file(SaveFile *f) {
    ops_copies_wait();
    if (f->w.n) st_writer_write(&f->w, f->path);
    if (f->w.n && !file_hash64(f->path, &f->hash)) die("%s: cannot read back: %s", f->path, strerror(errno));
    st_writer_free(&f->w), free(f->own);
}

// After every rank's write_file: rank 0 writes the index; with sums, rank 0 adds every file's checksum.
// Collective over the world.
static void finish_parts(Run *r, SaveFile *f, const char *dir, const char *base, int nparts, const Part *parts,
                         json_t *sums) {
    const Dist *d = &r->dist;
    char file[80];
    if (d->world.size > 1 && d->world.rank == 0) write_index(r, dir, base, nparts, parts, sums);
    if (sums || d->world.size > 1) { // every rank's hash in its slot (0: it wrote no file), summed over the world
        int64_t *h = xcalloc(d->world.size, sizeof(int64_t));
        h[d->world.rank] = (int64_t)f->hash;
        comm_allreduce(&d->world, tensor_make(h, DT_I64, DEV_CPU, 1, d->world.size, 1, 1, 1), COMM_SUM);
        for (int k = 0; sums && k < d->world.size; k++)
            if (h[k]) file_of(file, sizeof file, base, k, d->world.size), checksum_add(sums, file, (uint64_t)h[k]);
        free(h);
    } else comm_barrier(&d->world);
}

void ckpt_write_grads(Run *r, const char *dir) {
    if (r->dist.world.rank == 0) mkdir_p(dir);
    comm_barrier(&r->dist.world);
    SaveFile f;
    const Part part = {"", r->grad};
    snapshot_parts(r, &f, NULL, dir, "model", 1, &part, "pith-gradient");
    write_file(&f);
    finish_parts(r, &f, dir, "model", 1, &part, NULL);
}

static bool parse_step_dir(const char *name, int *step) {
    int n = 0;
    return sscanf(name, "step-%8d%n", step, &n) == 1 && n == 13 && name[n] == 0;
}

// Removes a checkpoint folder so that no kill can leave a partly deleted step-N behind: it is renamed to
// .trash-step-N first (ckpt_find_latest removes leftovers), then deleted.
static void remove_step(const char *loc, const char *name) {
    char path[4200], trash[4200];
    snprintf(path, sizeof path, "%s/%s", loc, name);
    snprintf(trash, sizeof trash, "%s/.trash-%s", loc, name);
    remove_tree(trash);
    if (rename(path, trash)) die("%s: cannot rename to %s: %s", path, trash, strerror(errno));
    fsync_dir(loc);
    remove_tree(trash);
}

bool ckpt_find_latest(const char *loc, char *out, size_t cap, bool tidy) {
    DIR *d = opendir(loc);
    if (!d) return false;
    int best = -1, step;
    struct dirent *de;
    char path[4400];
    while ((de = readdir(d))) {
        path_join(path, sizeof path, loc, de->d_name);
        if (!strncmp(de->d_name, ".tmp-step-", 10) || !strncmp(de->d_name, ".trash-step-", 12)) {
            if (tidy) remove_tree(path); // a save or a removal that did not finish
            continue;
        }
        if (!parse_step_dir(de->d_name, &step) || step <= best) continue;
        // A resume point has run.json; only step-00000000 may be model-only (`pith convert hf2pith`'s output).
        char run[4500];
        snprintf(run, sizeof run, "%s/run.json", path);
        if (step > 0 && !path_exists(run)) {
            warn("%s: no run.json: not a checkpoint pith wrote; ignored as a resume point", path);
            continue;
        }
        best = step;
    }
    closedir(d);
    if (best < 0) return false;
    snprintf(out, cap, "%s/step-%08d", loc, best);
    return true;
}

// The locks of the folders a run writes: an exclusive flock on <dir>/.lock held for the life of the process (the
// kernel releases it when the process ends, however it ends). Taking it also shows that dir is writable. A .lock
// removed or replaced under the holder lets another run take a new one: ckpt_save checks its own is still there.
static struct {
    int fd;
    char path[4200], real[4200];
    const char *what;
} locks[2];
static int nlocks;

void ckpt_lock(const char *dir, const char *what) {
    mkdir_p(dir);
    char path[4200], real[4200], host[256] = "?", holder[512] = "";
    if (!realpath(dir, real)) die("%s: %s: cannot resolve: %s", dir, what, strerror(errno));
    for (int i = 0; i < nlocks; i++)
        if (!strcmp(locks[i].real, real)) return;
    CHECK(nlocks < 2);
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0) die("%s: %s is not writable: %s", dir, what, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK) die("%s: cannot lock: %s", path, strerror(errno));
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        die("%s: %s is in use by another pith train (%s); one run per %s", dir, what,
            holder[0] ? holder : "holder unknown", what);
    }
    gethostname(host, sizeof host - 1);
    int len = snprintf(holder, sizeof holder, "pid %d on %s\n", (int)getpid(), host);
    if (ftruncate(fd, 0) || pwrite(fd, holder, len, 0) != len || fsync(fd))
        die("%s: %s is not writable: %s", path, what, strerror(errno));
    locks[nlocks].fd = fd, locks[nlocks].what = what;
    snprintf(locks[nlocks].path, sizeof locks[nlocks].path, "%s", path);
    snprintf(locks[nlocks].real, sizeof locks[nlocks].real, "%s", real);
    nlocks++;
}

// Dies unless every lock of this process is still the file at its path (not removed, not replaced).
static void locks_check(void) {
    for (int i = 0; i < nlocks; i++) {
        struct stat a, b;
        if (fstat(locks[i].fd, &b) || stat(locks[i].path, &a) || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
            die("%s: removed or replaced while this run held it: another pith train may be using this %s; "
                "stopping without saving",
                locks[i].path, locks[i].what);
    }
}

void ckpt_unlock(void) {
    for (int i = 0; i < nlocks; i++) close(locks[i].fd);
    nlocks = 0;
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
            char name[32];
            snprintf(name, sizeof name, "step-%08d", steps[i]);
            remove_step(loc, name);
        }
    }
}

// The temporary folder of the save in progress on rank 0: a save that fails (a full disk, a write error) removes
// it as it dies. (A rank killed outright leaves it to the next start's ckpt_find_latest.)
static char saving[4200];
static void save_failed(void) { remove_tree(saving); }

// The save in progress: its snapshot, taken by ckpt_save; its files, written inline or (checkpoint.async) by a
// background thread; the folder, completed by ckpt_wait.
typedef struct {
    bool active, threaded;
    pthread_t thread;
    int step;
    char tmp[4200], final[4200];
    SaveFile file[2];   // model, optimizer
    float *router_bias; // (layers·E) copy, or NULL
    double t0, issue_s; // when the save began; the loop's time taking the snapshot (its copies included)
} Save;
static Save save;
static double loop_unreported; // the loop's time in saves since ckpt_loop_seconds last asked

static void *write_files(void *arg) {
    (void)arg;
    write_file(&save.file[0]), write_file(&save.file[1]);
    return NULL;
}

// The parts of file i of a save: the model (the masters) or the optimizer (both moments). Returns their count.
static const char *const save_base[2] = {"model", "optimizer"};
static int save_parts(const Run *r, int i, Part p[2]) {
    if (i == 0) return p[0] = (Part){"", r->master}, 1;
    p[0] = (Part){"exp_avg.", r->adam_m}, p[1] = (Part){"exp_avg_sq.", r->adam_v};
    return 2;
}

size_t ckpt_snapshot_bytes(const Run *r) {
    const Part parts[3] = {{"", r->master}, {"", r->adam_m}, {"", r->adam_v}}; // save_parts' three
    return parts_bytes(&r->model.params, &r->dist, 3, parts);
}

void ckpt_save(Run *r) {
    const TrainConfig *c = &r->cfg;
    ckpt_wait(r);
    bool lead = r->dist.world.rank == 0, async = c->checkpoint.async;
    save = (Save){.active = true, .step = r->step, .t0 = now_seconds()};
    snprintf(save.tmp, sizeof save.tmp, "%s/.tmp-step-%08d", c->save_location, r->step);
    snprintf(save.final, sizeof save.final, "%s/step-%08d", c->save_location, r->step);
    if (lead) {
        locks_check();
        mkdir_p(c->save_location);
        remove_tree(save.tmp);
        mkdir_p(save.tmp);
        snprintf(saving, sizeof saving, "%s", save.tmp), die_cleanup = save_failed;
    }
    comm_barrier(&r->dist.world);
    size_t used = 0; // checkpoint.async: both files' snapshots in the run's arena, made once; else one file's at a time
    for (int i = 0; i < 2; i++) {
        Part parts[2];
        int n = save_parts(r, i, parts);
        used += snapshot_parts(r, &save.file[i], async ? r->snapshot.base + used : NULL, save.tmp, save_base[i], n,
                               parts, i ? NULL : "pith");
        if (!async) write_file(&save.file[i]);
    }
    CHECK(!async || used == r->snapshot.cap); // the plan's bytes exactly
    size_t nbias = (size_t)r->model.cfg.layers * r->model.cfg.experts * sizeof(float);
    if (r->router_bias) save.router_bias = memcpy(xmalloc(nbias), r->router_bias, nbias);
    if (async) { // the copies are waited for here: the next step's own device-to-host reads would queue behind them
        ops_copies_wait();
        int err = pthread_create(&save.thread, NULL, write_files, NULL);
        if (err) die("%s: cannot start the checkpoint writer thread: %s", save.tmp, strerror(err));
        save.threaded = true, save.issue_s = now_seconds() - save.t0;
        loop_unreported += save.issue_s;
        printf("checkpoint: step %d: snapshot of %.2f GB in %.3f s (%.1f GB/s), writing in the background\n", r->step,
               used / 1e9, save.issue_s, used / 1e9 / save.issue_s);
        return;
    }
    ckpt_wait(r);
}

void ckpt_wait(Run *r) {
    if (!save.active) return;
    const TrainConfig *c = &r->cfg;
    bool lead = r->dist.world.rank == 0;
    double t_wait = now_seconds();
    if (save.threaded) pthread_join(save.thread, NULL);
    json_t *sums = json_object();
    for (int i = 0; i < 2; i++) {
        Part parts[2];
        int n = save_parts(r, i, parts);
        finish_parts(r, &save.file[i], save.tmp, save_base[i], n, parts, sums);
    }
    if (lead) {
        // config.json: the model's own file, copied byte for byte
        char mcfg[4200], path[4400];
        path_in_folder(mcfg, sizeof mcfg, c->model, "config.json");
        size_t n;
        char *text = file_read_all(mcfg, &n);
        if (!text) die("%s: cannot read: %s", mcfg, strerror(errno));
        snprintf(path, sizeof path, "%s/config.json", save.tmp);
        file_write_atomic(path, text, n);
        checksum_add(sums, "config.json", hash64(text, n));
        free(text);
        json_t *run =
            json_pack("{s:s, s:s, s:i, s:I, s:I, s:o, s:O}", "format", CKPT_FORMAT, "pith_version", PITH_VERSION,
                      "step", save.step, "samples_consumed", (json_int_t)save.step * c->global_batch_size, "seed",
                      (json_int_t)c->seed, "train_config", config_effective(c), "checksums", sums);
        if (r->data.files) json_object_set_new(run, "data", dataset_recipe(&r->data));
        if (save.router_bias) { // aux-loss-free balancing: each layer's bias (shortest decimals: the floats exactly)
            json_t *rows = json_array();
            for (int l = 0; l < r->model.cfg.layers; l++) {
                json_t *row = json_array();
                for (int e = 0; e < r->model.cfg.experts; e++)
                    json_array_append_new(row,
                                          json_real(json_f32(save.router_bias[(size_t)l * r->model.cfg.experts + e])));
                json_array_append_new(rows, row);
            }
            json_object_set_new(run, "router_bias", rows);
        }
        text = json_text(run, 1, true);
        snprintf(path, sizeof path, "%s/run.json", save.tmp);
        file_write_atomic(path, text, strlen(text));
        free(text), json_decref(run);
        fsync_dir(save.tmp);
        if (path_exists(save.final)) remove_step(c->save_location, save.final + strlen(c->save_location) + 1);
        if (rename(save.tmp, save.final)) die("%s: cannot rename to %s: %s", save.tmp, save.final, strerror(errno));
        die_cleanup = NULL;
        fsync_dir(c->save_location);
        if (c->keep_last) prune(c->save_location, c->keep_last);
    }
    json_decref(sums);
    free(save.router_bias);
    comm_barrier(&r->dist.world);
    double now = now_seconds();
    if (save.threaded) {
        loop_unreported += now - t_wait;
        printf("checkpoint: step %d saved to %s (%.2f s in the background; the loop spent %.3f s: %.3f s taking the "
               "snapshot, %.3f s waiting for the files)\n",
               save.step, save.final, now - save.t0, save.issue_s + now - t_wait, save.issue_s, now - t_wait);
    } else {
        loop_unreported += now - save.t0;
        printf("checkpoint: step %d saved to %s (%.2f s)\n", save.step, save.final, now - save.t0);
    }
    save.active = false;
}

double ckpt_loop_seconds(void) {
    double s = loop_unreported;
    return loop_unreported = 0, s;
}

// Weights from a checkpoint or HF folder into this rank's master shards and the compute copies.
static void load_model(Run *r, const char *dir) {
    verify_folder(dir, r->dist.world.rank, r->dist.world.size);
    ParamTable all;
    ModelTensors mt;
    model_params_all(&r->model, &all);
    load_shards(r, model_tensors_open(&mt, dir, &all), dir, "", true, r->master);
    model_tensors_close(&mt);
    free(all.p);
    for (int g = 0; g < NGROUPS; g++) fsdp_gather(&r->fsdp, g, r->model.w[g], r->master[g]);
}

void ckpt_init_from(Run *r, const char *dir) {
    if (!path_is_dir(dir)) die("%s: init_from: not a folder", dir);
    load_model(r, dir);
    printf("init: weights loaded from %s\n", dir);
}

bool ckpt_load_router_bias(const char *dir, float *bias, int L, int E) {
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    if (!path_exists(path)) return false;
    json_t *root = json_load_or_die(path), *rb = json_object_get(root, "router_bias");
    JObj o = jobj_root(root, path);
    if (!rb) return json_decref(root), false;
    for (int l = 0; l < L; l++) { // (json_array_size: 0 for what is not an array)
        json_t *row = json_array_get(rb, l);
        if (json_array_size(rb) != (size_t)L || json_array_size(row) != (size_t)E)
            jdie(o, "router_bias", "expected %d rows of %d numbers", L, E);
        for (int e = 0; e < E; e++) {
            json_t *v = json_array_get(row, e);
            if (!json_is_number(v)) jdie(o, "router_bias", "row %d: expected numbers", l);
            bias[(size_t)l * E + e] = (float)json_number_value(v);
        }
    }
    json_decref(root);
    return true;
}

// Dies unless the checkpoint's config.json says what the model's own config file says (compared as JSON).
static void check_model_config(const Run *r, const char *dir) {
    char mine[4200], theirs[4200];
    path_in_folder(mine, sizeof mine, r->cfg.model, "config.json");
    snprintf(theirs, sizeof theirs, "%s/config.json", dir);
    if (!path_exists(theirs)) return; // written before checkpoints kept it
    json_t *a = json_load_or_die(mine), *b = json_load_or_die(theirs), *v;
    const char *key, *differs = NULL;
    json_object_foreach(a, key, v) if (!differs && !json_equal(v, json_object_get(b, key))) differs = key;
    json_object_foreach(b, key, v) if (!differs && !json_object_get(a, key)) differs = key;
    if (differs)
        die("%s: %s: differs from the model's config %s (a checkpoint resumes only the model it was saved from)",
            theirs, differs, mine);
    json_decref(a), json_decref(b);
}

void ckpt_resume(Run *r, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    if (!path_exists(path)) { // model-only (e.g. from `pith convert hf2pith`): fresh optimizer at step 0
        load_model(r, dir);
        printf("resume: weights from %s (model only, optimizer starts fresh)\n", dir);
        return;
    }
    json_t *root = json_load_or_die(path);
    JObj o = jobj_root(root, path);
    int64_t step = jint(o, "step", true, 0);
    if (step < 0 || step > r->cfg.max_steps)
        jdie(o, "step", "%lld is outside [0, max_steps = %d]", (long long)step, r->cfg.max_steps);
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    int folder_step;
    if (!parse_step_dir(base, &folder_step) || folder_step != step)
        jdie(o, "step", "%lld, but the folder is %s: run.json belongs to another checkpoint", (long long)step, base);
    if (!json_is_object(json_object_get(root, "train_config")))
        jdie(o, "train_config", "missing: a resume compares it with this run's config");
    check_model_config(r, dir);
    r->step = (int)step;
    // absent: a run that starts balancing here starts from zero
    if (r->router_bias && ckpt_load_router_bias(dir, r->router_bias, r->model.cfg.layers, r->model.cfg.experts))
        op_copy(r->model.router_bias, tf32_2(r->router_bias, r->model.cfg.layers, r->model.cfg.experts));
    // The optimizer state means what its optimizer made it mean (Muon keeps its momentum in exp_avg).
    json_t *ot = json_object_get(json_object_get(json_object_get(root, "train_config"), "optimizer"), "type");
    const char *was = json_is_string(ot) ? json_string_value(ot) : "adamw",
               *now = config_optimizer_name(r->cfg.optimizer.type);
    if (strcmp(was, now))
        die("%s: train_config.optimizer.type: the checkpoint's optimizer state is %s's, the config asks for %s "
            "(init_from starts from its weights alone)",
            path, was, now);
    config_check_resume(&r->cfg, json_object_get(root, "train_config"), path, r->cfg.allow_config_change);
    if (r->data.files) dataset_check_recipe(&r->data, json_object_get(root, "data"), path, r->cfg.allow_config_change);
    json_decref(root);
    load_model(r, dir);
    // the optimizer's file as ckpt_save writes it
    Part parts[2];
    int nparts = save_parts(r, 1, parts);
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", dir, save_base[1]);
    if (!path_exists(path)) snprintf(path, sizeof path, "%s/%s.safetensors", dir, save_base[1]);
    StSet s;
    st_set_open_or_die(&s, path);
    ParamTable all;
    model_params_all(&r->model, &all);
    check_known(&s, &all, nparts, (const char *[]){parts[0].prefix, parts[1].prefix}, false);
    free(all.p);
    for (int k = 0; k < nparts; k++) load_shards(r, &s, path, parts[k].prefix, false, parts[k].shard);
    st_set_close(&s);
    printf("resume: step %d from %s\n", r->step, dir);
}
