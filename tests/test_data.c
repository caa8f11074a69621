// test_data.c — weighted data mixtures (their proportions, their order as a function of (seed, index), a
// resume after kill -9, the recipe a checkpoint records, bad lists) and asynchronous checkpoints (resume
// against synchronous saving, kill -9 while the background thread writes).
#include "base/npy.h"
#include "base/safetensors.h"
#include "test.h"
#include "train/ckpt.h"
#include "train/data.h"

// A token file of n uint32 tokens 20·k + (i mod 20): every sample tells its source k by its first token.
static void write_source(const char *dir, const char *name, int k, int64_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && npy_write_header(f, DT_U32, n));
    for (int64_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)(20 * k + i % 20);
        CHECK(fwrite(&t, 4, 1, f) == 1);
    }
    uint64_t end = (uint64_t)n;
    CHECK(npy_write_header(f, DT_U64, 1) && fwrite(&end, 8, 1, f) == 1 && !fclose(f));
}

static const char *mixture_of(const char *d, const char *w0, const char *w1, const char *w2) {
    static char list[1024];
    snprintf(list, sizeof list,
             "[{\"path\": \"%s/a.bin\", \"weight\": %s}, {\"path\": \"%s/b.bin\", \"weight\": %s}, {\"path\": "
             "\"%s/c\", \"weight\": %s}]",
             d, w0, d, w1, d, w2);
    return list;
}

// A run folder: tiny_run's model, sources a.bin (500 tokens), b.bin (3000), c/c.bin (1200) and train.json
// training on them with weights 5, 3, 2 (extra: more keys).
static const char *mix_run(const char *extra) {
    const char *d = tiny_run("");
    char cfg[4096], c[300];
    write_source(d, "a.bin", 0, 500), write_source(d, "b.bin", 1, 3000);
    snprintf(c, sizeof c, "%s/c", d), mkdir_p(c), write_source(c, "c.bin", 2, 1200);
    snprintf(cfg, sizeof cfg,
             "{\"model\": \"model.json\", \"dataset\": [{\"path\": \"a.bin\", \"weight\": 5}, {\"path\": \"b.bin\", "
             "\"weight\": 3}, {\"path\": \"c\", \"weight\": 2}], \"sequence_length\": 16, \"micro_batch_size\": 2, "
             "\"global_batch_size\": 4, \"max_steps\": 8, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01}%s}",
             extra);
    write_text(d, "train.json", cfg);
    return d;
}

static void open_mixture(Dataset *ds, const char *d, uint64_t seed) {
    TrainConfig c = {.sequence_length = 16, .seed = seed, .ndataset = 3, .mixture = true};
    const char *name[] = {"a.bin", "b.bin", "c"};
    const double w[] = {5, 3, 2};
    for (int k = 0; k < 3; k++)
        snprintf(c.dataset[k].path, PATH_MAX_LEN, "%s/%s", d, name[k]), c.dataset[k].weight = w[k];
    dataset_open_config(ds, &c, 64);
}

TEST(data_mixture_proportions_and_order) {
    const char *d = mix_run("");
    enum { N = 10000 };
    Dataset ds, fresh;
    open_mixture(&ds, d, 11);
    ASSERT(ds.nsrc == 3 && ds.nfiles == 3 && ds.total == 31 + 187 + 74);
    int32_t(*tok)[16] = xmalloc(N * sizeof *tok);
    int32_t lab[16], t2[16], l2[16];
    int64_t count[3] = {0}, drawn[3] = {0};
    for (int64_t i = 0; i < N; i++) {
        dataset_sample(&ds, i, tok[i], lab);
        int k = tok[i][0] / 20;
        ASSERT(k >= 0 && k < 3);
        count[k]++;
        // the n-th draw of source k is sample n of the source's own stream (every sample once per epoch)
        dataset_sample(&ds.src[k], drawn[k]++, t2, l2);
        ASSERT(!memcmp(tok[i], t2, sizeof t2) && !memcmp(lab, l2, sizeof l2));
    }
    // Each count is binomial(N, p_k): standard error √(N·p·(1−p)) (50, 46, 40 samples); 5 of them bound the
    // count, a failure probability below 1e-6 for a correct sampler (the draws are fixed by the seed besides).
    const double p[] = {0.5, 0.3, 0.2};
    for (int k = 0; k < 3; k++) {
        double se = sqrt(N * p[k] * (1 - p[k]));
        printf("     source %d: %lld of %d samples (expected %.0f ± %.0f)\n", k, (long long)count[k], N, N * p[k], se);
        ASSERT_MSG(fabs(count[k] - N * p[k]) <= 5 * se, "source %d: %lld samples, expected %.0f ± 5 × %.1f", k,
                   (long long)count[k], N * p[k], se);
    }
    // A function of (seed, index) alone: a dataset opened afresh and read backwards from the end, as a resume at
    // any step and a pipeline's out-of-order reads do, gives the same samples.
    open_mixture(&fresh, d, 11);
    for (int64_t i = N - 1; i >= 0; i -= 7) {
        dataset_sample(&fresh, i, t2, l2);
        ASSERT_MSG(!memcmp(tok[i], t2, sizeof t2), "sample %lld differs read out of order", (long long)i);
    }
    dataset_close(&fresh);
    open_mixture(&fresh, d, 12); // another seed, another order
    int same = 0;
    for (int64_t i = 0; i < 1000; i++) dataset_sample(&fresh, i, t2, l2), same += !memcmp(tok[i], t2, sizeof t2);
    ASSERT_MSG(same < 500, "seed 12 repeats %d of seed 11's first 1000 samples", same);
    dataset_close(&fresh), dataset_close(&ds), free(tok);
}

// metrics.jsonl up to the timings (loss, lb_loss, lr, grad_norm of every step).
static void metrics_of(char *out, size_t cap, const char *dir) {
    ASSERT(run_cmd(out, cap, "sed 's/, \"tokens_per_s.*//' %s/metrics.jsonl", dir) == 0);
}

// Kills `pith train` (the config of d with `sets`, saving every step into save_location ck) with -9 at `trials` instants spread over
// a whole run, resumes each to the end and compares its metrics with the uninterrupted run's. Returns how many
// kills left a save unfinished (a .tmp-step-N folder).
static int kill_and_resume(const char *d, const char *async, int trials) {
    char sets[200];
    snprintf(sets, sizeof sets, "--set save_interval=1 %s", async);
    char out[1 << 16], ref[8192], got[8192], refdir[300];
    snprintf(refdir, sizeof refdir, "%s/ref", d);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s", PITH_BIN, d, refdir) == 0);
    metrics_of(ref, sizeof ref, refdir);
    double t0 = now_seconds();
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set save_location=%s/time", PITH_BIN, d, sets, d) ==
           0);
    double run_s = now_seconds() - t0;
    int mid_save = 0;
    for (int trial = 0; trial < trials; trial++) {
        double at = run_s * (trial + 0.5) / trials;
        char ck[300];
        snprintf(ck, sizeof ck, "%s/t%d", d, trial);
        ASSERT(run_cmd(out, sizeof out,
                       "%s train %s/train.json %s --set save_location=%s >/dev/null & p=$!; sleep %.3f; "
                       "kill -9 $p 2>/dev/null; wait $p; ls -a %s 2>/dev/null; true",
                       PITH_BIN, d, sets, ck, at, ck) == 0);
        mid_save += strstr(out, ".tmp-step-") != NULL;
        // Every step-N folder left is complete: run.json and its checksums verify (pith eval reads the newest).
        ASSERT(run_cmd(out, sizeof out,
                       "for s in %s/step-*; do [ -e \"$s\" ] || continue; test -f $s/run.json || { echo partial $s; "
                       "exit 1; }; %s eval --model $s --data %s/a.bin --seq 16 --batch 1 >/dev/null || exit 1; done",
                       ck, PITH_BIN, d) == 0);
        ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set save_location=%s", PITH_BIN, d, sets, ck) ==
               0);
        ASSERT_MSG(strstr(out, "done: 8 of 8 steps"), "trial %d: %s", trial, out);
        metrics_of(got, sizeof got, ck);
        ASSERT_MSG(!strcmp(ref, got), "trial %d (killed at %.3f s):\n%s\nvs uninterrupted:\n%s", trial, at, got, ref);
    }
    printf("     %d trials, %d killed with a save unfinished (run takes %.2f s)\n", trials, mid_save, run_s);
    return mid_save;
}

TEST(data_mixture_kill_9_resume_bit_exact) { kill_and_resume(mix_run(""), "", 8); }

TEST(ckpt_async_kill_9_leaves_no_partial_step) { kill_and_resume(mix_run(""), "--set checkpoint.async=true", 8); }

// Asynchronous saves resume bit for bit like synchronous ones and write the same tensor files, with fp32 and with bf16
// moments; the snapshot's host memory is what the files hold: fp32 weights, moments in their own dtype.
TEST(ckpt_async_resume_equals_sync) {
    const char *d = mix_run(", \"save_interval\": 2");
    char out[1 << 16], a[8192], b[8192], p[300];
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const char *dt = bf16 ? "--set optimizer.state_dtype=bf16" : "";
        ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set save_location=%s/sync%d", PITH_BIN, d, dt, d,
                       bf16) == 0);
        ASSERT(run_cmd(out, sizeof out,
                       "%s train %s/train.json %s --set save_location=%s/async%d --set checkpoint.async=true --steps 5",
                       PITH_BIN, d, dt, d, bf16) == 0);
        ASSERT_MSG(strstr(out, "checkpoint: step 4: snapshot of ") && strstr(out, "writing in the background") &&
                       strstr(out, "waiting for the files") && strstr(out, "checkpoint: step 5 saved to") &&
                       strstr(out, "stopped: 5 of 8 steps"),
                   "%s", out);
        // The plan's snapshot: the weights and both moments of every tensor (one rank writes them all).
        const char *plan = strstr(out, "MB of checkpoint snapshot (checkpoint.async; ");
        ASSERT_MSG(plan, "%s", out);
        snprintf(p, sizeof p, "%s/async%d/step-00000004/model.safetensors", d, bf16);
        size_t n;
        char *st = file_read_all(p, &n);
        uint64_t header;
        ASSERT(st && n > 8);
        memcpy(&header, st, 8), free(st);
        ASSERT_MSG(strtoull(plan + strlen("MB of checkpoint snapshot (checkpoint.async; "), NULL, 10) ==
                       (3 - bf16) * (n - 8 - header),
                   "%s vs %d × %zu bytes of weights", plan, 3 - bf16, (size_t)(n - 8 - header));
        ASSERT(run_cmd(out, sizeof out, "grep -c '\"ckpt_s\": ' %s/async%d/metrics.jsonl", d, bf16) == 0 &&
               atoi(out) == 2);
        ASSERT(run_cmd(out, sizeof out,
                       "%s train %s/train.json %s --set save_location=%s/async%d --set checkpoint.async=true", PITH_BIN,
                       d, dt, d, bf16) == 0);
        ASSERT_MSG(strstr(out, "resume: step 5 from") && strstr(out, "done: 8 of 8 steps"), "%s", out);
        snprintf(p, sizeof p, "%s/sync%d", d, bf16), metrics_of(a, sizeof a, p);
        snprintf(p, sizeof p, "%s/async%d", d, bf16), metrics_of(b, sizeof b, p);
        ASSERT_MSG(!strcmp(a, b), "synchronous:\n%s\nasynchronous, resumed:\n%s", a, b);
        for (int s = 2; s <= 8; s += 2)
            ASSERT_MSG(run_cmd(out, sizeof out,
                               "cd %s && cmp sync%d/step-%08d/model.safetensors async%d/step-%08d/model.safetensors && "
                               "cmp sync%d/step-%08d/optimizer.safetensors async%d/step-%08d/optimizer.safetensors",
                               d, bf16, s, bf16, s, bf16, s, bf16, s) == 0,
                       "step %d: %s", s, out);
    }
    ASSERT(run_cmd(out, sizeof out, "grep -c BF16 %s/async1/step-00000008/optimizer.safetensors", d) == 0);
}

// checkpoint.async's snapshot arena is made once, at setup, of the plan's bytes: every save fills it (the masters in
// fp32, then both moments in bf16, tensor by tensor) and the files are written from it.
TEST(ckpt_async_snapshot_arena_made_once) {
    const char *d = mix_run("");
    char path[512], loc[300];
    snprintf(path, sizeof path, "%s/train.json", d), snprintf(loc, sizeof loc, "save_location=%s/ck", d);
    char *sets[] = {loc, "checkpoint.async=true", "optimizer.state_dtype=bf16"};
    TrainConfig c;
    config_load(&c, path, sets, 3);
    static Run r;
    run_setup(&r, &c, true);
    const ParamTable *t = &r.model.params;
    char *base = r.snapshot.base;
    ASSERT_MSG(r.snapshot.cap == r.plan.snapshot && r.plan.snapshot == ckpt_snapshot_bytes(&r),
               "arena %zu bytes, plan %zu", r.snapshot.cap, r.plan.snapshot);
    for (int save = 0; save < 2; save++) {
        run_step(&r);
        ckpt_save(&r);
        ASSERT(r.snapshot.base == base && r.snapshot.cap == r.plan.snapshot); // (ckpt_save waited for its copies)
        const char *at = base;
        for (int k = 0; k < 3; k++) {
            const Tensor *part = k == 0 ? r.master : k == 1 ? r.adam_m : r.adam_v;
            for (int i = 0; i < t->n; i++) {
                const ParamInfo *p = &t->p[i];
                size_t bytes = params_numel(p) * dtype_size(part[p->group].dt);
                ASSERT(part[p->group].dt == (k ? DT_BF16 : DT_F32));
                ASSERT_MSG(!memcmp(at, (const char *)part[p->group].p + p->off * dtype_size(part[p->group].dt), bytes),
                           "save %d: part %d, %s: the arena does not hold the state", save, k, p->name);
                at += bytes;
            }
        }
        ASSERT(at == base + r.snapshot.cap);
        ckpt_wait(&r);
        snprintf(path, sizeof path, "%s/ck/step-%08d/optimizer.safetensors", d, r.step);
        StSet s;
        st_set_open_or_die(&s, path);
        char name[200];
        snprintf(name, sizeof name, "exp_avg_sq.%s", t->p[0].name);
        const StTensor *x = st_set_find(&s, name);
        ASSERT(x && x->dt == ST_BF16);
        st_set_close(&s);
    }
    run_free(&r);
    json_decref(c.json);
}

// A resume with another recipe is refused naming the field (or goes on with --allow-config-change, saying what
// changed); a bad list is a one-line error naming the file and the field.
TEST(data_mixture_recipe_checked_and_errors) {
    const char *d = mix_run("");
    char out[1 << 16], set[1200];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --steps 2", PITH_BIN, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "grep -c '\"fingerprint\"' %s/ck/step-00000002/run.json", d) == 0 &&
           atoi(out) == 4); // three files and the recipe
    snprintf(set, sizeof set, "--set 'dataset=%s'", mixture_of(d, "5", "3", "4"));
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck %s", PITH_BIN, d, d, set) == 1);
    ASSERT_MSG(strstr(out, "resume: dataset changed") &&
                   strstr(out, "resuming with dataset changed would change the data order of the run; pass "
                               "--allow-config-change"),
               "%s", out);
    write_source(d, "b.bin", 1, 2999); // the same path and weights, other tokens
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "resume: data.sources[1].files[0].bytes changed: ") && strstr(out, "pith: error: ") &&
                   strstr(out, "run.json: resuming with data.sources[1].files[0].bytes changed would change the data"),
               "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --allow-config-change", PITH_BIN,
                   d, d) == 0);
    ASSERT_MSG(strstr(out, "resume: data.sources[1].files[0].fingerprint changed") && strstr(out, "done: 8 of 8"), "%s",
               out);
    static const struct {
        const char *list, *error;
    } bad[] = {
        {"[]", "bad.json: dataset: an empty list"},
        {"[{\"path\": \"a.bin\"}]", "bad.json: dataset[0].weight: missing (a number > 0)"},
        {"[{\"path\": \"a.bin\", \"weight\": 0}]", "bad.json: dataset[0].weight: must be > 0 (got 0)"},
        {"[{\"path\": \"a.bin\", \"weight\": -1}]", "bad.json: dataset[0].weight: must be > 0 (got -1)"},
        {"[{\"path\": \"a.bin\", \"weight\": \"2\"}]", "bad.json: dataset[0].weight: not a number"},
        {"[{\"path\": \"a.bin\", \"weight\": 1}, {\"weight\": 1}]", "bad.json: dataset[1].path: missing"},
        {"[{\"path\": \"a.bin\", \"weight\": 1}, {\"path\": \"nowhere\", \"weight\": 1}]",
         "bad.json: dataset[1].path: "},
        {"[{\"path\": \"a.bin\", \"weight\": 1, \"share\": 1}]", "bad.json: dataset[0]: share: unknown key"},
        {"{\"path\": \"a.bin\"}", "bad.json: dataset: expected a path or a list"},
        {"\"a.bin\", \"checkpoint\": {\"async\": true}", "bad.json: checkpoint.async: needs save_location"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char cfg[2048];
        snprintf(cfg, sizeof cfg,
                 "{\"model\": \"model.json\", \"dataset\": %s, \"sequence_length\": 16, \"micro_batch_size\": 2, "
                 "\"global_batch_size\": 4, \"max_steps\": 8, \"device\": \"cpu\", \"optimizer\": {\"lr\": 0.01}}",
                 bad[i].list);
        write_text(d, "bad.json", cfg);
        int rc = run_cmd(out, sizeof out, "%s train %s/bad.json", PITH_BIN, d);
        ASSERT_MSG(rc == 1 && strstr(out, bad[i].error), "%s: exit %d: %s", bad[i].list, rc, out);
        ASSERT_MSG(strstr(out, "pith: error: ") == out && strchr(out, '\n') == out + strlen(out) - 1,
                   "not one line: %s", out);
    }
}
