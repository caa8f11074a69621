// test_ckpt.c — checkpoints, resume, crash safety, HF conversion and HF parity (tests/hf fixtures made
// by transformers in fp64: tests/hf/make_fixtures.py).

#include "base/safetensors.h"
#include "test.h"
#include "train/trainer.h"

#define FIX "tests/hf/qwen3_moe"

// Reads key `key` of the metrics line of `step` from a metrics.jsonl.
static double metric(const char *file, int step, const char *key) {
    char out[1 << 16];
    ASSERT(run_cmd(out, sizeof out, "grep '^{\"step\": %d,' %s", step, file) == 0);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *p = strstr(out, pat);
    ASSERT_MSG(p, "no %s in %s", key, out);
    return strtod(p + strlen(pat), NULL);
}

TEST(hf_parity_qwen3_moe_eval) {
    char out[4096];
    ASSERT(run_cmd(out, sizeof out, "%s eval --model " FIX " --data " FIX "/tokens.bin --seq 16 --batch 4", PITH_BIN) ==
           0);
    char *p = strstr(out, "loss ");
    ASSERT(p);
    double got = strtod(p + 5, NULL), want = hf_expected(FIX, "loss", -1);
    printf("     eval loss %.10f vs transformers %.10f (rel %.2e)\n", got, want, fabs(got - want) / want);
    ASSERT(fabs(got - want) / want < 1e-5);
}

TEST(hf_parity_qwen3_moe_train) {
    const char *d = test_tmpdir();
    char out[16384], m[512];
    ASSERT(run_cmd(out, sizeof out, "%s train " FIX "/train.json --set run_dir=%s", PITH_BIN, d) == 0);
    snprintf(m, sizeof m, "%s/metrics.jsonl", d);
    double worst = 0;
    for (int s = 0; s < 5; s++) {
        double l = metric(m, s + 1, "loss"), g = metric(m, s + 1, "grad_norm");
        double el = hf_expected(FIX, "loss", s), eg = hf_expected(FIX, "grad_norm", s);
        double e = fmax(fabs(l - el) / el, fabs(g - eg) / eg);
        worst = fmax(worst, e);
        ASSERT_MSG(e < 1e-4, "step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g", s + 1, l, el, g, eg);
    }
    printf("     5 AdamW steps: worst relative difference %.2e\n", worst);
}

// Every tensor of a against b: same names, dtypes, shapes and bytes.
static void assert_same_tensors(const char *a, const char *b) {
    StSet x, y;
    st_set_open_or_die(&x, a);
    st_set_open_or_die(&y, b);
    ASSERT(x.n == y.n);
    for (int i = 0; i < x.n; i++) {
        const StTensor *t = st_set_find(&y, x.t[i]->name);
        ASSERT_MSG(t, "%s missing in %s", x.t[i]->name, b);
        ASSERT(t->dt == x.t[i]->dt && t->bytes == x.t[i]->bytes && t->nd == x.t[i]->nd);
        ASSERT_MSG(!memcmp(t->data, x.t[i]->data, t->bytes), "%s differs", x.t[i]->name);
    }
    st_set_close(&x), st_set_close(&y);
}

TEST(convert_round_trip_bit_exact) {
    const char *d = test_tmpdir();
    char out[8192];
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith " FIX " %s/ck", PITH_BIN, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s convert pith2hf %s/ck %s/hf", PITH_BIN, d, d) == 0);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/hf", d);
    assert_same_tensors(FIX, a);
    // a save_location stands for its newest checkpoint
    ASSERT(run_cmd(out, sizeof out, "mkdir -p %s/run && cp -r %s/ck %s/run/step-00000000", d, d, d) == 0);
    ASSERT_MSG(run_cmd(out, sizeof out, "%s convert pith2hf %s/run %s/hf_run", PITH_BIN, d, d) == 0 &&
                   strstr(out, "is a save_location; its newest checkpoint is "),
               "%s", out);
    snprintf(a, sizeof a, "%s/hf_run", d);
    assert_same_tensors(FIX, a);
    // bf16 export in several shards with an index; it loads back and evaluates close to fp32
    ASSERT(run_cmd(out, sizeof out, "%s convert pith2hf %s/ck %s/hf16 --dtype bf16 --max-shard-size 40KB", PITH_BIN, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, " files"), "%s", out);
    snprintf(b, sizeof b, "%s/hf16/model.safetensors.index.json", d);
    ASSERT(path_exists(b));
    ASSERT(run_cmd(out, sizeof out, "grep -c bfloat16 %s/hf16/config.json", d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s/hf16 --data " FIX "/tokens.bin --seq 16 --batch 4", PITH_BIN,
                   d) == 0);
    double got = strtod(strstr(out, "loss ") + 5, NULL), want = hf_expected(FIX, "loss", -1);
    ASSERT(fabs(got - want) / want < 1e-2);
    // refusing to overwrite, and bad arguments
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith " FIX " %s/ck", PITH_BIN, d) == 1 &&
           strstr(out, "already exists"));
    ASSERT(run_cmd(out, sizeof out, "%s convert pith2hf %s/ck %s/x --dtype fp8", PITH_BIN, d, d) == 1 &&
           strstr(out, "--dtype must be bf16 or fp32"));
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith /nonexistent %s/y", PITH_BIN, d) == 1 &&
           strstr(out, "/nonexistent: not a folder"));
}

// pith2hf's config.json names the dtype it wrote, whatever the checkpoint's config.json claimed, and --tokenizer
// copies the tokenizer files that are there (checked first: JSON, ids inside the model's vocabulary).
TEST(convert_pith2hf_dtype_and_tokenizer) {
    const char *d = test_tmpdir();
    char out[8192], path[600];
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith " FIX " %s/ck", PITH_BIN, d) == 0);
    // the checkpoint's config claims bf16 (a config copied from a bf16 model) but holds fp32 tensors
    ASSERT(run_cmd(out, sizeof out,
                   "sed -i 's/\"dtype\": \"float32\"/\"dtype\": \"bfloat16\", \"torch_dtype\": "
                   "\"bfloat16\"/' %s/ck/config.json && grep -c bfloat16 %s/ck/config.json",
                   d, d) == 0);
    write_text(d, "tok/tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
               " \"added_tokens\": [{\"id\": 127, \"content\": \"<eos>\"}]}");
    write_text(d, "tok/tokenizer_config.json", "{\"eos_token\": \"<eos>\"}");
    ASSERT(run_cmd(out, sizeof out, "%s convert pith2hf %s/ck %s/hf --tokenizer %s/tok/tokenizer.json", PITH_BIN, d, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, "(float32), with the tokenizer"), "%s", out);
    snprintf(path, sizeof path, "%s/hf/config.json", d);
    json_t *cfg = json_load_file(path, 0, NULL);
    ASSERT(cfg && !strcmp(json_string_value(json_object_get(cfg, "dtype")), "float32") &&
           !strcmp(json_string_value(json_object_get(cfg, "torch_dtype")), "float32"));
    json_decref(cfg);
    ASSERT(run_cmd(out, sizeof out,
                   "cmp %s/tok/tokenizer.json %s/hf/tokenizer.json && cmp %s/tok/tokenizer_config.json "
                   "%s/hf/tokenizer_config.json && ! test -e %s/hf/special_tokens_map.json",
                   d, d, d, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s convert pith2hf %s/ck %s/hf16 --dtype bf16 --tokenizer %s/tok", PITH_BIN, d, d,
                   d) == 0 &&
           strstr(out, "(bfloat16)"));
    ASSERT(run_cmd(out, sizeof out,
                   "grep -c '\"dtype\": \"bfloat16\"' %s/hf16/config.json && test -e "
                   "%s/hf16/tokenizer.json",
                   d, d) == 0);
    // bad tokenizers stop before anything is written
    static const struct {
        const char *tok, *msg;
    } bad[] = {{"data/tokenizers/deepseek_v3", "is outside the model's vocab_size 128"},
               {"/nonexistent", "/nonexistent: --tokenizer: no such file or folder"},
               {"tests/hf", "tests/hf/tokenizer.json: no such file"},
               {"BADJSON", "tokenizer.json:1:"}};
    write_text(d, "badtok/tokenizer.json", "{\"model\": ");
    for (int i = 0; i < 4; i++) {
        char tok[600];
        snprintf(tok, sizeof tok, "%s", strcmp(bad[i].tok, "BADJSON") ? bad[i].tok : "");
        if (!tok[0]) snprintf(tok, sizeof tok, "%s/badtok", d);
        ASSERT(run_cmd(out, sizeof out, "%s convert pith2hf %s/ck %s/x --tokenizer %s", PITH_BIN, d, d, tok) == 1);
        ASSERT_MSG(strstr(out, bad[i].msg) && strchr(out, '\n') == out + strlen(out) - 1, "%s", out);
        snprintf(path, sizeof path, "%s/x", d);
        ASSERT(!path_exists(path));
    }
    ASSERT(run_cmd(out, sizeof out, "ls %s | grep -c tmp", d) == 1); // no temporaries left
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith " FIX " %s/y --tokenizer %s/tok", PITH_BIN, d, d) == 1 &&
           strstr(out, "--tokenizer applies to pith2hf only"));
}

// A model folder derived from the fixture with one change to its tensors.
static const char *doctored(const char *what) {
    const char *d = test_tmpdir();
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/m", d);
    mkdir_p(dir);
    char out[1024];
    ASSERT(run_cmd(out, sizeof out, "cp " FIX "/config.json %s/", dir) == 0);
    StFile f;
    st_open_or_die(&f, FIX "/model.safetensors");
    StWriter w;
    st_writer_init(&w);
    static float extra[4];
    for (int i = 0; i < f.n; i++) {
        const StTensor *t = &f.t[i];
        if (!strcmp(what, "missing") && strstr(t->name, "layers.2.self_attn.k_norm")) continue;
        int64_t shape[8];
        memcpy(shape, t->shape, sizeof shape);
        if (!strcmp(what, "shape") && strstr(t->name, "model.norm.weight")) shape[0] = 16; // 32 → 16 (bytes halve)
        st_writer_add_raw(&w, t->name, t->dt, t->nd, shape, t->data);
    }
    if (!strcmp(what, "extra"))
        st_writer_add_f32(&w, "model.layers.0.mlp.shared_expert.weight", ST_F32, 1, (int64_t[]){4}, extra);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_writer_write(&w, path);
    st_writer_free(&w), st_close(&f);
    return dir;
}

TEST(checkpoint_corrupt_inputs) {
    char out[8192];
    const char *dir = doctored("missing");
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s --data " FIX "/tokens.bin --seq 16 --batch 1", PITH_BIN, dir) ==
           1);
    ASSERT_MSG(strstr(out, "tensor 'layers.2.self_attn.k_norm.weight' is missing"), "%s", out);
    dir = doctored("extra");
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s --data " FIX "/tokens.bin --seq 16 --batch 1", PITH_BIN, dir) ==
           1);
    ASSERT_MSG(strstr(out, "tensor 'model.layers.0.mlp.shared_expert.weight' is not a parameter of this model"), "%s",
               out);
    dir = doctored("shape");
    ASSERT(run_cmd(out, sizeof out, "%s eval --model %s --data " FIX "/tokens.bin --seq 16 --batch 1", PITH_BIN, dir) ==
           1);
    ASSERT_MSG(strstr(out, "model.norm.weight") && strstr(out, "shape [16], expected [32]"), "%s", out);
    // a truncated file, an index naming a missing shard
    ASSERT(run_cmd(out, sizeof out,
                   "truncate -s 1000 %s/model.safetensors && %s eval --model %s --data " FIX
                   "/tokens.bin --seq 16 --batch 1",
                   dir, PITH_BIN, dir) == 1);
    ASSERT_MSG(strstr(out, "model.safetensors") && strstr(out, "pith: error:"), "%s", out);
    ASSERT(run_cmd(out, sizeof out,
                   "rm %s/model.safetensors && echo '{\"weight_map\": {\"model.norm.weight\": "
                   "\"model-00001-of-00002.safetensors\"}}' > %s/model.safetensors.index.json"
                   " && %s eval --model %s --data " FIX "/tokens.bin --seq 16 --batch 1",
                   dir, dir, PITH_BIN, dir) == 1);
    ASSERT_MSG(strstr(out, "model-00001-of-00002.safetensors"), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s eval --model " FIX " --data " FIX "/tokens.bin --seq 16 --batch 5", PITH_BIN) ==
           1);
    ASSERT_MSG(strstr(out, "more samples than the data holds"), "%s", out);
}

static const char *make_run(void) {
    return tiny_run(", \"moe_load_balance_coef\": 0.01, \"scheduler\": {\"type\": \"wsd\", \"warmup_ratio\": 0.2, "
                    "\"decay_ratio\": 0.5}");
}

static void metrics_without_timing(char *out, size_t cap, const char *dir) {
    ASSERT(run_cmd(out, cap, "sed 's/, \"tokens_per_s.*//' %s/metrics.jsonl", dir) == 0);
}

TEST(resume_bit_exact) {
    const char *d = make_run();
    char out[16384], a[8192], b[8192];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/full", PITH_BIN, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --steps 3", PITH_BIN, d, d) == 0);
    ASSERT(strstr(out, "stopped: 3 of 6 steps"));
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d) == 0);
    ASSERT_MSG(strstr(out, "resume: step 3 from"), "%s", out);
    char full[300], ck[300];
    snprintf(full, sizeof full, "%s/full", d), snprintf(ck, sizeof ck, "%s/ck", d);
    metrics_without_timing(a, sizeof a, full), metrics_without_timing(b, sizeof b, ck);
    ASSERT_MSG(!strcmp(a, b), "uninterrupted:\n%s\nresumed:\n%s", a, b);
    // keep_last prunes older checkpoints
    ASSERT(
        run_cmd(out, sizeof out,
                "%s train %s/train.json --set save_location=%s/k2 --set save_interval=1 --set keep_last=2 && ls %s/k2",
                PITH_BIN, d, d, d) == 0);
    ASSERT_MSG(strstr(out, "step-00000005\nstep-00000006") && !strstr(out, "step-00000004\n"), "%s", out);
}

TEST(crash_safety_kill_9) {
    const char *d = make_run();
    char out[1 << 16], ref[8192], got[8192];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/ref --set max_steps=8", PITH_BIN, d, d) ==
           0);
    char refdir[300];
    snprintf(refdir, sizeof refdir, "%s/ref", d);
    metrics_without_timing(ref, sizeof ref, refdir);
    double t0 = now_seconds();
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set save_location=%s/time --set save_interval=1 --set max_steps=8",
                   PITH_BIN, d, d) == 0);
    double run_s = now_seconds() - t0;
    int killed_mid = 0;
    for (int trial = 0; trial < 20; trial++) {
        // kill -9 at an instant spread over the whole run (startup, steps and saves)
        double at = run_s * (trial + 0.5) / 20.0;
        char ck[300];
        snprintf(ck, sizeof ck, "%s/t%d", d, trial);
        ASSERT(run_cmd(out, sizeof out,
                       "%s train %s/train.json --set save_location=%s --set save_interval=1 --set max_steps=8 "
                       ">/dev/null & p=$!; sleep %.3f; kill -9 $p 2>/dev/null && echo killed; wait $p; true",
                       PITH_BIN, d, ck, at) == 0);
        killed_mid += strstr(out, "killed") != NULL;
        ASSERT(run_cmd(out, sizeof out,
                       "%s train %s/train.json --set save_location=%s --set save_interval=1 --set max_steps=8",
                       PITH_BIN, d, ck) == 0);
        ASSERT_MSG(strstr(out, "done: 8 of 8 steps"), "trial %d: %s", trial, out);
        metrics_without_timing(got, sizeof got, ck);
        ASSERT_MSG(!strcmp(ref, got), "trial %d (killed at %.3f s):\n%s\nvs uninterrupted:\n%s", trial, at, got, ref);
    }
    printf("     20 trials, %d killed mid-run (run takes %.2f s)\n", killed_mid, run_s);
    ASSERT_MSG(killed_mid >= 5, "only %d of 20 trials were killed before finishing", killed_mid);
}

TEST(train_from_hf2pith_checkpoint) {
    // hf2pith output named step-00000000 under save_location: `pith train` starts from those weights.
    const char *d = test_tmpdir();
    char out[16384], m[512];
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith " FIX " %s/ck/step-00000000", PITH_BIN, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   "%s train " FIX "/train.json --set init_from= --set save_location=%s/ck --set max_steps=1", PITH_BIN,
                   d) == 0);
    ASSERT_MSG(strstr(out, "model only, optimizer starts fresh"), "%s", out);
    snprintf(m, sizeof m, "%s/ck/metrics.jsonl", d);
    ASSERT(fabs(metric(m, 1, "loss") - hf_expected(FIX, "loss", 0)) / hf_expected(FIX, "loss", 0) < 1e-5);
}

// ---- what must never happen ----

// Every line of a metrics.jsonl is a JSON object; returns the number of lines.
static int metrics_lines_valid(const char *file) {
    size_t n;
    char *text = file_read_all(file, &n);
    ASSERT_MSG(text, "%s: cannot read", file);
    int lines = 0;
    for (char *line = text, *nl; *line; line = nl + 1, lines++) {
        nl = strchr(line, '\n');
        ASSERT_MSG(nl, "%s: a line without its end: %s", file, line);
        *nl = 0;
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        ASSERT_MSG(j && json_is_object(j), "%s: not JSON: %s (%s)", file, line, err.text);
        json_decref(j);
    }
    free(text);
    return lines;
}

TEST(nonfinite_loss_stops_and_saves_nothing_after) {
    // lr = 1e6 diverges within a few steps: the run stops naming the step, with exit status 1, and the last
    // checkpoint (keep_last = 1) is the one before it — never a NaN one, never pruned by one.
    const char *d = make_run();
    char out[1 << 16], m[512];
    int rc = run_cmd(out, sizeof out,
                     "%s train %s/train.json --set optimizer.lr=1e6 --set max_steps=30 --set save_location=%s/ck "
                     "--set save_interval=1 --set keep_last=1 2>&1",
                     PITH_BIN, d, d);
    ASSERT_MSG(rc == 1, "exit %d: %s", rc, out);
    const char *e = strstr(out, "pith: error: step ");
    int bad = 0;
    ASSERT_MSG(e && sscanf(e, "pith: error: step %d:", &bad) == 1 && (strstr(e, "is NaN") || strstr(e, "is infinite")),
               "%s", out);
    ASSERT(strstr(out, "done:") == NULL);
    char last[64];
    snprintf(last, sizeof last, "step-%08d\n", bad - 1);
    ASSERT(run_cmd(out, sizeof out, "cd %s/ck && ls -d step-*", d) == 0);
    ASSERT_MSG(!strcmp(out, last), "expected only %s in save_location, got: %s", last, out);
    snprintf(m, sizeof m, "%s/ck/metrics.jsonl", d);
    ASSERT(metrics_lines_valid(m) == bad);
    ASSERT(run_cmd(out, sizeof out, "tail -1 %s", m) == 0 && strstr(out, ": null"));
    printf("     lr 1e6: stopped at step %d, step-%08d kept\n", bad, bad - 1);
}

TEST(nonfinite_skip_leaves_weights) {
    // on_nonfinite = skip: a step whose loss or norm is not finite leaves weights and moments bit for bit.
    const char *d = make_run();
    char path[512];
    snprintf(path, sizeof path, "%s/train.json", d);
    char *sets[] = {"optimizer.lr=1e6", "max_steps=40", "on_nonfinite=skip"};
    TrainConfig c;
    config_load(&c, path, sets, 3);
    static Run r;
    run_setup(&r, &c, true);
    int64_t n = r.master[GROUP_DENSE].n[0];
    float *before = xmalloc(n * sizeof(float)), *m_before = xmalloc(n * sizeof(float));
    bool seen = false;
    for (int s = 0; s < 40 && !seen; s++) {
        memcpy(before, r.master[GROUP_DENSE].p, n * sizeof(float));
        memcpy(m_before, r.adam_m[GROUP_DENSE].p, n * sizeof(float));
        StepStats st = run_step(&r);
        if (!st.nonfinite) continue;
        seen = true;
        ASSERT(r.step == s + 1);
        ASSERT(!memcmp(before, r.master[GROUP_DENSE].p, n * sizeof(float)));
        ASSERT(!memcmp(m_before, r.adam_m[GROUP_DENSE].p, n * sizeof(float)));
    }
    ASSERT_MSG(seen, "lr 1e6 never gave a non-finite step in 40 steps");
    free(before), free(m_before);
    run_free(&r);
    json_decref(c.json);
}

TEST(save_location_lock) {
    const char *d = make_run();
    char out[1 << 16];
    // Two runs on one save_location: the second stops at once naming the first (pid and host).
    // (grep -s: the log may not exist yet when the first grep runs)
    int rc = run_cmd(out, sizeof out,
                     "%s train %s/train.json --set max_steps=100000 --set save_location=%s/ck > %s/a.log 2>&1 & p=$!; "
                     "until grep -qs '^step ' %s/a.log || ! kill -0 $p 2>/dev/null; do sleep 0.05; done; "
                     "%s train %s/train.json --set max_steps=100000 --set save_location=%s/ck; rc=$?; "
                     "echo holder=$p; kill -9 $p; wait $p; exit $rc",
                     PITH_BIN, d, d, d, d, PITH_BIN, d, d);
    ASSERT_MSG(rc == 1, "exit %d: %s", rc, out);
    int holder = 0;
    ASSERT(sscanf(strstr(out, "holder="), "holder=%d", &holder) == 1);
    char pid[64];
    snprintf(pid, sizeof pid, "(pid %d on ", holder);
    ASSERT_MSG(strstr(out, "pith: error: ") == out && strstr(out, "save_location is in use by another pith train") &&
                   strstr(out, pid),
               "%s", out);
    // The holder was killed with -9: the kernel released its lock, the next run takes it and finishes.
    rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d);
    ASSERT_MSG(rc == 0 && strstr(out, "done: 6 of 6 steps"), "exit %d: %s", rc, out);
}

TEST(save_location_unwritable_before_step_1) {
    const char *d = make_run();
    char out[1 << 16];
    int rc = run_cmd(out, sizeof out, "touch %s/file && %s train %s/train.json --set save_location=%s/file/ck", d,
                     PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "file/ck") && !strstr(out, "step 0000"), "exit %d: %s", rc, out);
}

TEST(prune_leftovers_are_never_resume_points) {
    // A kill in the middle of removing a checkpoint leaves .trash-step-N (removed at start-up); a step-N
    // folder without run.json is not a checkpoint pith wrote and is never resumed from.
    const char *d = make_run();
    char out[1 << 16];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --steps 2", PITH_BIN, d, d) == 0);
    ASSERT(
        run_cmd(out, sizeof out,
                "mkdir -p %s/ck/.trash-step-00000001 %s/ck/step-00000005 && cp %s/ck/step-00000002/model.safetensors "
                "%s/ck/step-00000005/",
                d, d, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck 2>&1", PITH_BIN, d, d) == 0);
    ASSERT_MSG(strstr(out, "step-00000005: no run.json") && strstr(out, "resume: step 2 from"), "%s", out);
    ASSERT(!path_exists(strcat(strcpy(out, d), "/ck/.trash-step-00000001")));
}

TEST(resume_with_changed_config) {
    const char *d = make_run();
    char out[1 << 16];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --steps 2", PITH_BIN, d, d) == 0);
    // a key that does not change the data order or the schedule: said, accepted
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set save_location=%s/ck --steps 1 --set clip_grad_norm=0.1", PITH_BIN, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, "resume: clip_grad_norm changed: 1.0 -> 0.1 ("), "%s",
               out); // short, not 0.10000000000000001
    // data order and schedule: refused, naming the key, unless --allow-config-change
    static const char *const refused[] = {"seed=7", "sequence_length=8", "global_batch_size=8", "max_steps=12",
                                          "scheduler.warmup_ratio=0.1"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        int rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --set %s", PITH_BIN, d, d,
                         refused[i]);
        ASSERT_MSG(rc == 1 && strstr(out, "--allow-config-change") && strstr(out, "run.json"), "%s: exit %d: %s",
                   refused[i], rc, out);
    }
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set save_location=%s/ck --set seed=7 --allow-config-change", PITH_BIN, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, "resume: seed changed: 1234 -> 7") && strstr(out, "done: 6 of 6"), "%s", out);
}

TEST(signals_checkpoint) {
    // SIGUSR1 checkpoints and goes on; SIGTERM checkpoints and stops (SLURM sends it before the time limit).
    const char *d = make_run();
    char out[1 << 16];
    int rc = run_cmd(out, sizeof out,
                     "%s train %s/train.json --set max_steps=100000 --set save_location=%s/ck > %s/a.log 2>&1 & p=$!; "
                     "until grep -qs '^step ' %s/a.log; do sleep 0.05; done; kill -USR1 $p; "
                     "until grep -qs '^signal: SIGUSR1' %s/a.log; do sleep 0.05; done; kill -TERM $p; wait $p; rc=$?; "
                     "cat %s/a.log; exit $rc",
                     PITH_BIN, d, d, d, d, d, d);
    ASSERT_MSG(rc == 0 && strstr(out, "signal: SIGUSR1 after step") && strstr(out, "stopped by SIGTERM"), "exit %d: %s",
               rc, out);
    int s1 = 0, s2 = 0;
    ASSERT(sscanf(strstr(out, "signal: SIGUSR1 after step "), "signal: SIGUSR1 after step %d", &s1) == 1);
    ASSERT(sscanf(strstr(out, "signal: SIGTERM after step "), "signal: SIGTERM after step %d", &s2) == 1 && s2 > s1);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ck/step-%08d/run.json", d, s1);
    ASSERT(path_exists(ck));
    snprintf(ck, sizeof ck, "%s/ck/step-%08d/run.json", d, s2);
    ASSERT(path_exists(ck));
}

// Ctrl-C (SIGINT) stops like SIGTERM: a checkpoint after the step under way, exit 0 (env --default-signal: a
// shell's background job would otherwise start with SIGINT ignored, which pith keeps).
TEST(signals_interrupt_checkpoints) {
    const char *d = make_run();
    char out[1 << 16];
    int rc = run_cmd(out, sizeof out,
                     "env --default-signal=INT %s train %s/train.json --set max_steps=100000 --set save_location=%s/ck "
                     "> %s/a.log 2>&1 & "
                     "p=$!; until grep -qs '^step ' %s/a.log; do sleep 0.05; done; kill -INT $p; wait $p; rc=$?; "
                     "cat %s/a.log; exit $rc",
                     PITH_BIN, d, d, d, d, d);
    ASSERT_MSG(rc == 0 && strstr(out, "pith: interrupted: stopping after this step") &&
                   strstr(out, "stopped by SIGINT"),
               "exit %d: %s", rc, out);
    int s = 0;
    ASSERT(sscanf(strstr(out, "signal: SIGINT after step "), "signal: SIGINT after step %d", &s) == 1);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ck/step-%08d/run.json", d, s);
    ASSERT_MSG(path_exists(ck), "%s", ck);
}

// Writers on a full disk: a file-size limit (ulimit -f; writes past it fail with EFBIG) and, where this
// machine lets a test mount one, a 64 KB tmpfs (ENOSPC). Each names its file, exits 1 and leaves no
// temporary and nothing truncated under a final name.
TEST(write_failures_name_the_file) {
    const char *d = make_run();
    char out[1 << 16], m[512];
    // synth
    int rc = run_cmd(out, sizeof out, "ulimit -f 16; %s synth --output %s/s/big.bin --tokens 100000", PITH_BIN, d);
    ASSERT_MSG(rc == 1 && strstr(out, "big.bin.tmp: write failed: File too large"), "exit %d: %s", rc, out);
    ASSERT(run_cmd(out, sizeof out, "ls -A %s/s", d) == 0 && !strcmp(out, ""));
    // metrics.jsonl: cut back to its last whole line
    rc = run_cmd(out, sizeof out,
                 "ulimit -f 1; %s train %s/train.json --set max_steps=40 --set tensorboard=false --set run_dir=%s/r",
                 PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "metrics.jsonl: write failed: File too large") && !strstr(out, "done:"),
               "exit %d: %s", rc, out);
    snprintf(m, sizeof m, "%s/r/metrics.jsonl", d);
    ASSERT(metrics_lines_valid(m) >= 1);
    // convert: its temporary folder goes too
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith " FIX " %s/ck", PITH_BIN, d) == 0);
    rc = run_cmd(out, sizeof out, "ulimit -f 8; %s convert pith2hf %s/ck %s/hf", PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "write failed: File too large"), "exit %d: %s", rc, out);
    ASSERT(run_cmd(out, sizeof out, "ls -A %s | grep -c '^hf' || true", d) == 0 && atoi(out) == 0);
    // a real full disk, where mounting is allowed
    if (run_cmd(out, sizeof out, "mkdir -p %s/fs && mount -t tmpfs -o size=64k tmpfs %s/fs 2>&1", d, d) != 0) {
        printf("     tmpfs: not allowed here (%s): the file-size limit stands in for a full disk\n", strtok(out, "\n"));
        return;
    }
    rc = run_cmd(out, sizeof out, "%s synth --output %s/fs/big.bin --tokens 100000", PITH_BIN, d);
    char ls[4096];
    run_cmd(ls, sizeof ls, "ls -A %s/fs; umount %s/fs", d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "big.bin.tmp: write failed: No space left on device") && !strcmp(ls, ""),
               "exit %d: %s / %s", rc, out, ls);
    printf("     tmpfs of 64 KB: synth stops with ENOSPC, nothing left behind\n");
}

// Killed (-9) after its step-3 checkpoint, then resumed: the uninterrupted run's metrics bit for bit; the checkpoint
// holds the moments as bf16 tensors. A checkpoint of the other dtype resumes converted, saying so (bf16 → fp32 is
// exact, fp32 → bf16 rounds to nearest even).
#define BF16 "--set optimizer.state_dtype=bf16"
TEST(resume_state_dtype_bf16_kill_9) {
    const char *d = tiny_run(", \"moe_load_balance_coef\": 0.01");
    char out[16384], a[8192], b[8192], full[300], ck[300];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json " BF16 " --set run_dir=%s/full", PITH_BIN, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json " BF16 " --set save_location=%s/ck --set save_interval=3 --set max_steps=60 "
                   "--set scheduler.type=constant > %s/a.log 2>&1 & p=$!; "
                   "until [ -e %s/ck/step-00000003/run.json ] || ! kill -0 $p 2>/dev/null; do sleep 0.01; done; "
                   "kill -9 $p; wait $p; true",
                   PITH_BIN, d, d, d, d) == 0);
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "ls %s/ck/step-00000003/run.json && rm -rf %s/ck/step-0000000[4-9]* %s/ck/step-000000[1-9]*", d,
                       d, d) == 0,
               "%s", out);
    ASSERT(run_cmd(out, sizeof out, "grep -c BF16 %s/ck/step-00000003/optimizer.safetensors", d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json " BF16 " --set save_location=%s/ck", PITH_BIN, d, d) == 0);
    ASSERT_MSG(strstr(out, "resume: step 3 from"), "%s", out);
    snprintf(full, sizeof full, "%s/full", d), snprintf(ck, sizeof ck, "%s/ck", d);
    metrics_without_timing(a, sizeof a, full), metrics_without_timing(b, sizeof b, ck);
    ASSERT_MSG(!strcmp(a, b), "uninterrupted:\n%s\nresumed:\n%s", a, b);
    // bf16 → fp32, then fp32 → bf16
    ASSERT(run_cmd(
               out, sizeof out,
               "mkdir -p %s/up && cp -r %s/ck/step-00000003 %s/up/ && %s train %s/train.json --set save_location=%s/up "
               "--steps 4",
               d, d, d, PITH_BIN, d, d) == 0);
    ASSERT_MSG(strstr(out, "resume: optimizer.state_dtype changed: \"bf16\" -> \"fp32\""), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json " BF16 " --set save_location=%s/up", PITH_BIN, d, d) == 0);
    ASSERT_MSG(strstr(out, "resume: optimizer.state_dtype changed: \"fp32\" -> \"bf16\"") &&
                   strstr(out, "done: 6 of 6"),
               "%s", out);
}

// Gradients are not checkpointed (each step starts them from zero): with bf16 expert gradients (gradient_dtype) a run
// saved at step 3 and resumed gives the uninterrupted run's metrics bit for bit, and resuming in the other gradient
// dtype is allowed, saying so.
TEST(resume_gradient_dtype_bf16) {
    const char *d = tiny_run("");
    char out[16384], a[8192], b[8192], full[300], ck[300];
    const char *g = "--set gradient_dtype=bf16";
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/full", PITH_BIN, d, g, d) == 0);
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json %s --set save_location=%s/ck --steps 3 && %s train %s/train.json %s "
                   "--set save_location=%s/ck",
                   PITH_BIN, d, g, d, PITH_BIN, d, g, d) == 0);
    ASSERT_MSG(strstr(out, "resume: step 3 from"), "%s", out);
    snprintf(full, sizeof full, "%s/full", d), snprintf(ck, sizeof ck, "%s/ck", d);
    metrics_without_timing(a, sizeof a, full), metrics_without_timing(b, sizeof b, ck);
    ASSERT_MSG(!strcmp(a, b), "uninterrupted:\n%s\nresumed:\n%s", a, b);
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --set max_steps=7", PITH_BIN, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, "resume: gradient_dtype changed: \"bf16\" -> \"fp32\"") && strstr(out, "done: 7 of 7"), "%s",
               out);
}
