// test_reliability.c — what pith refuses to save or load: updates that are not finite, corrupt or mismatched
// checkpoints, inputs that are not regular files, lock gaps, bad token ids and the smaller input checks.

#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/json.h"
#include "base/npy.h"
#include "ops/ops.h"
#include "base/safetensors.h"
#include "test.h"

#define FIX "tests/hf/qwen3_moe"

// A tiny run (model.json, data.bin, train.json: 6 steps) in a fresh folder.
static const char *rel_run(void) { return tiny_run(""); }

// Rewrites tensor `name` of the safetensors file at path with element 0 set to v (other tensors as they are).
static void poke_tensor(const char *path, const char *name, float v) {
    StFile f;
    st_open_or_die(&f, path);
    StWriter w;
    st_writer_init(&w);
    bool found = false;
    for (int i = 0; i < f.n; i++) {
        const StTensor *t = &f.t[i];
        void *copy = xmalloc(t->bytes + 1);
        memcpy(copy, t->data, t->bytes);
        if (!strcmp(t->name, name)) {
            ASSERT(t->dt == ST_F32);
            memcpy(copy, &v, 4), found = true;
        }
        st_writer_add_raw(&w, t->name, t->dt, t->nd, t->shape, copy);
    }
    ASSERT_MSG(found, "%s: no tensor %s", path, name);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    st_writer_write(&w, tmp);
    st_writer_free(&w), st_close(&f);
    ASSERT(rename(tmp, path) == 0);
}

// Records the current checksum of file `name` of checkpoint folder dir in its run.json (a consistent edit).
static void reseal(const char *dir, const char *name) {
    char path[600], run[600], hex[24];
    snprintf(path, sizeof path, "%s/%s", dir, name), snprintf(run, sizeof run, "%s/run.json", dir);
    uint64_t h;
    ASSERT(file_hash64(path, &h));
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_t *root = json_load_or_die(run);
    json_object_set_new(json_object_get(root, "checksums"), name, json_string(hex));
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
    file_write_atomic(run, text, strlen(text));
    free(text), json_decref(root);
}

// ---- 1. nothing non-finite is saved or loaded ----

TEST(nonfinite_update_stops_and_saves_nothing) {
    const char *d = rel_run();
    char out[1 << 16];
    static const char *const modes[] = {"fail", "skip"};
    for (int k = 0; k < 2; k++) {
        int rc = run_cmd(out, sizeof out,
                         "%s train %s/train.json --set max_steps=1 --set optimizer.lr=1e300 --set "
                         "'scheduler={\"type\":\"constant\"}' --set on_nonfinite=%s --set save_location=%s/ck%d",
                         PITH_BIN, d, modes[k], d, k);
        ASSERT_MSG(rc == 1 && strstr(out, "train.json: optimizer.lr: step 1's update") &&
                       strstr(out, "not finite: stopping; nothing is saved after step 0") && !strstr(out, "done:"),
                   "%s: exit %d: %s", modes[k], rc, out);
        ASSERT(run_cmd(out, sizeof out, "ls -A %s/ck%d | grep -c step || true", d, k) == 0 && atoi(out) == 0);
    }
    // a good checkpoint is never pruned in favour of a bad one (keep_last = 1)
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/k --steps 2 --set keep_last=1",
                   PITH_BIN, d, d) == 0);
    int rc = run_cmd(out, sizeof out,
                     "%s train %s/train.json --set save_location=%s/k --set keep_last=1 --set save_interval=1 "
                     "--set optimizer.lr=1e300 --allow-config-change",
                     PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "step 3's update"), "exit %d: %s", rc, out);
    ASSERT(run_cmd(out, sizeof out, "ls -A %s/k | grep step", d) == 0 && !strcmp(out, "step-00000002\n"));
}

TEST(ckpt_load_refuses_nonfinite_weights_and_moments) {
    const char *d = rel_run();
    char out[1 << 16], ck[512], path[600];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --steps 2", PITH_BIN, d, d) == 0);
    snprintf(ck, sizeof ck, "%s/ck/step-00000002", d);
    // a second moment below zero: the resume refuses it, naming the file and tensor
    snprintf(path, sizeof path, "%s/optimizer.safetensors", ck);
    poke_tensor(path, "exp_avg_sq.layers.0.self_attn.q_proj.weight", -1);
    reseal(ck, "optimizer.safetensors");
    int rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 &&
                   strstr(out, "optimizer.safetensors: tensor 'exp_avg_sq.layers.0.self_attn.q_proj.weight': element "
                               "0 is -1 (a second moment must be finite and not negative)"),
               "exit %d: %s", rc, out);
    // a NaN weight: eval refuses it
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    poke_tensor(path, "layers.1.self_attn.q_proj.weight", NAN);
    reseal(ck, "model.safetensors");
    rc = run_cmd(out, sizeof out, "%s eval --model %s --data %s/data.bin --seq 16 --batch 1", PITH_BIN, ck, d);
    ASSERT_MSG(rc == 1 && strstr(out, "model.safetensors: tensor 'layers.1.self_attn.q_proj.weight': element 0 is nan"),
               "exit %d: %s", rc, out);
}

// ---- 2. a checkpoint proves it is the one it claims ----

TEST(ckpt_checksums_and_run_json) {
    const char *d = rel_run();
    char out[1 << 16], ck[512], path[600];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --steps 2", PITH_BIN, d, d) == 0);
    snprintf(ck, sizeof ck, "%s/ck/step-00000002", d);
    ASSERT(run_cmd(out, sizeof out, "cp -r %s %s/good", ck, d) == 0);
    // one flipped bit in the middle of the weights
    ASSERT(run_cmd(out, sizeof out,
                   "f=%s/model.safetensors; n=$(($(stat -c %%s $f) / 2)); b=$(od -An -tu1 -j$n -N1 $f); "
                   "printf \"$(printf '\\\\%%03o' $((b ^ 4)))\" | dd of=$f bs=1 seek=$n conv=notrunc status=none",
                   ck) == 0);
    int rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "step-00000002/model.safetensors: checksum") && strstr(out, "corrupt"),
               "exit %d: %s", rc, out);
    rc = run_cmd(out, sizeof out, "%s eval --model %s --data %s/data.bin --seq 16 --batch 1", PITH_BIN, ck, d);
    ASSERT_MSG(rc == 1 && strstr(out, "checksum"), "eval: exit %d: %s", rc, out);
    // run.json edits, each refused naming run.json and the key
    static const char *const edits[][2] = {
        {"s/\"step\": 2,/\"step\": 5,/", "run.json: step: 5, but the folder is step-00000002"},
        {"s/pith-checkpoint-2/pith-checkpoint-9/", "run.json: format: 'pith-checkpoint-9' is not a checkpoint format"},
        {"/\"checksums\"/,/}/d", "run.json: checksums: missing"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        ASSERT(run_cmd(out, sizeof out, "rm -r %s && cp -r %s/good %s && sed -i '%s' %s/run.json", ck, d, ck,
                       edits[i][0], ck) == 0);
        rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d);
        ASSERT_MSG(rc == 1 && strstr(out, edits[i][1]), "%s: exit %d: %s", edits[i][0], rc, out);
    }
    // no train_config; the model's config changed since the save
    ASSERT(run_cmd(out, sizeof out, "rm -r %s && cp -r %s/good %s", ck, d, ck) == 0);
    snprintf(path, sizeof path, "%s/run.json", ck);
    json_t *root = json_load_or_die(path);
    json_object_del(root, "train_config");
    char *text = json_dumps(root, JSON_INDENT(1));
    file_write_atomic(path, text, strlen(text));
    free(text), json_decref(root);
    rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "run.json: train_config: missing"), "exit %d: %s", rc, out);
    ASSERT(run_cmd(out, sizeof out, "rm -r %s && cp -r %s/good %s", ck, d, ck) == 0);
    ASSERT(run_cmd(out, sizeof out, "sed -i 's/\"norm_topk_prob\": true/\"norm_topk_prob\": false/' %s/model.json",
                   d) == 0);
    rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "step-00000002/config.json: norm_topk_prob: differs from the model's config"),
               "exit %d: %s", rc, out);
    // the untouched copy resumes
    ASSERT(run_cmd(out, sizeof out, "sed -i 's/\"norm_topk_prob\": false/\"norm_topk_prob\": true/' %s/model.json",
                   d) == 0);
    rc = run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck", PITH_BIN, d, d);
    ASSERT_MSG(rc == 0 && strstr(out, "resume: step 2 from") && strstr(out, "done: 6 of 6"), "exit %d: %s", rc, out);
}

TEST(ckpt_hash64_sees_every_byte) {
    unsigned char buf[100];
    for (int i = 0; i < 100; i++) buf[i] = (unsigned char)(i * 7);
    uint64_t h = hash64(buf, sizeof buf);
    for (int i = 0; i < 100; i++)
        for (int b = 0; b < 8; b++) {
            buf[i] ^= 1 << b;
            ASSERT_MSG(hash64(buf, sizeof buf) != h, "byte %d bit %d", i, b);
            buf[i] ^= 1 << b;
        }
    ASSERT(hash64(buf, 99) != hash64(buf, 100) && hash64(buf, 0) != hash64(buf, 1));
    ASSERT(hash64(buf, sizeof buf) == h);
}

// ---- 4. only regular files are read; an index stays in its folder ----

TEST(errors_fifo_inputs) {
    const char *d = rel_run();
    char out[1 << 16];
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set save_location=%s/ck --steps 1", PITH_BIN, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "mkdir -p %s/m && cp " FIX "/config.json " FIX "/model.safetensors %s/m/", d, d) ==
           0);
    // each command with one input replaced by a FIFO; a hang would end by timeout (exit 124)
    static const char *const cases[][2] = {
        {"mkfifo %1$s/f.json; %2$s train %1$s/f.json", "f.json: not a regular file (a FIFO)"},
        {"rm %1$s/m/model.safetensors; mkfifo %1$s/m/model.safetensors; %2$s eval --model %1$s/m --data %1$s/data.bin "
         "--seq 16 --batch 1",
         "m/model.safetensors: not a regular file"},
        {"cp -r %1$s/m %1$s/m2; rm %1$s/m2/config.json; mkfifo %1$s/m2/config.json; %2$s eval --model %1$s/m2 --data "
         "%1$s/data.bin --seq 16 --batch 1",
         "m2/config.json: not a regular file (a FIFO)"},
        {"o=%1$s/ck/step-00000001/optimizer.safetensors; rm $o; mkfifo $o; %2$s train %1$s/train.json --set "
         "save_location=%1$s/ck",
         "optimizer.safetensors"},
        {"mkfifo %1$s/tok.json; echo hi > %1$s/in.txt; %2$s tokenize --tokenizer %1$s/tok.json --input %1$s/in.txt "
         "--output %1$s/tk",
         "tok.json: not a regular file (a FIFO)"},
        {"mkdir -p %1$s/p; mkfifo %1$s/p/metrics.jsonl; %2$s plot %1$s/p", "metrics.jsonl: not a regular file"},
        {"mkdir -p %1$s/tf; mkfifo %1$s/tf/a.bin; %2$s train %1$s/train.json --set dataset=%1$s/tf",
         "a.bin: not a regular file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, cases[i][0], d, PITH_BIN);
        int rc = run_cmd(out, sizeof out, "timeout 30 sh -c '%s'", cmd);
        ASSERT_MSG(rc == 1 && strstr(out, "pith: error: ") && strstr(out, cases[i][1]), "case %zu: exit %d: %s", i, rc,
                   out);
    }
    // an index whose weight_map leads out of its folder
    int rc = run_cmd(out, sizeof out,
                     "mv %s/m/model.safetensors %s/outside.safetensors && echo '{\"weight_map\": "
                     "{\"model.norm.weight\": \"../outside.safetensors\"}}' > %s/m/model.safetensors.index.json && "
                     "%s eval --model %s/m --data %s/data.bin --seq 16 --batch 1",
                     d, d, d, PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "shard '../outside.safetensors' is not a file name of this folder"),
               "exit %d: %s", rc, out);
}

// ---- 5. the lock covers run_dir, and a removed lock stops its holder ----

TEST(save_location_lock_run_dir_and_removed_lock) {
    const char *d = rel_run();
    char out[1 << 16];
    // two runs with different save_locations and one run_dir: the second stops at once
    int rc = run_cmd(out, sizeof out,
                     "%s train %s/train.json --set max_steps=100000 --set save_location=%s/a --set run_dir=%s/r "
                     "> %s/a.log 2>&1 & p=$!; "
                     "until grep -qs '^step ' %s/a.log || ! kill -0 $p 2>/dev/null; do sleep 0.05; done; "
                     "%s train %s/train.json --set max_steps=100000 --set save_location=%s/b --set run_dir=%s/r; "
                     "rc=$?; kill -9 $p; wait $p; exit $rc",
                     PITH_BIN, d, d, d, d, d, PITH_BIN, d, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "/r: run_dir is in use by another pith train (pid "), "exit %d: %s", rc, out);
    // .lock removed under a running job: the job stops at its next save, saving nothing more
    rc = run_cmd(out, sizeof out,
                 "%s train %s/train.json --set max_steps=100000 --set save_interval=20 --set save_location=%s/c "
                 "> %s/c.log 2>&1 & p=$!; "
                 "until grep -qs '^step ' %s/c.log || ! kill -0 $p 2>/dev/null; do sleep 0.05; done; "
                 "rm %s/c/.lock; wait $p; rc=$?; cat %s/c.log; exit $rc",
                 PITH_BIN, d, d, d, d, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "c/.lock: removed or replaced while this run held it") &&
                   strstr(out, "stopping without saving"),
               "exit %d: %s", rc, out);
    // the save due at the last step taken was not written
    ASSERT(run_cmd(out, sizeof out, "grep '^step ' %s/c.log | tail -1", d) == 0);
    int last = atoi(out + 5);
    char path[600];
    snprintf(path, sizeof path, "%s/c/step-%08d", d, last);
    ASSERT_MSG(last > 0 && last % 20 == 0 && !path_exists(path), "%s exists", path);
}

// ---- 6. the smaller ones ----

TEST(write_failures_leave_no_tmp_step) {
    const char *d = rel_run();
    char out[1 << 16];
    int rc = run_cmd(out, sizeof out,
                     "ulimit -f 16; %s train %s/train.json --set save_location=%s/ck --set tensorboard=false --steps 1",
                     PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "write failed: File too large"), "exit %d: %s", rc, out);
    ASSERT(run_cmd(out, sizeof out, "ls -A %s/ck", d) == 0);
    ASSERT_MSG(!strstr(out, "tmp") && !strstr(out, "step-"), "left behind: %s", out);
}

// ---- 3. token ids: the scan's cache follows the file's content; the embedding checks every id ----

// Sets every 16th token of the token file at path (from position 5) to v in place, keeping its size and mtime.
static void poke_tokens(const char *path, uint32_t v) {
    size_t n;
    char *buf = file_read_all(path, &n), err[300];
    ASSERT(buf);
    NpyRecord tok, ends;
    ASSERT_MSG(npy_token_file_parse((const uint8_t *)buf, n, &tok, &ends, &(NpyRecord){0}, err, sizeof err), "%s", err);
    size_t off = (size_t)((const char *)tok.data - buf), es = dtype_size(tok.dt);
    struct stat st;
    ASSERT(stat(path, &st) == 0);
    int fd = open(path, O_WRONLY);
    ASSERT(fd >= 0);
    for (int64_t i = 5; i < tok.n; i += 16) ASSERT(pwrite(fd, &v, es, off + i * es) == (ssize_t)es);
    close(fd), free(buf);
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    ASSERT(utimensat(AT_FDCWD, path, ts, 0) == 0);
}

TEST(data_token_cache_follows_content) {
    const char *d = rel_run();
    char out[1 << 16], data[512];
    snprintf(data, sizeof data, "%s/data.bin", d);
    ASSERT(run_cmd(out, sizeof out, "PITH_CACHE_DIR=%s/cache %s train %s/train.json --steps 1 --set run_dir=%s/r", d,
                   PITH_BIN, d, d) == 0);
    ASSERT(run_cmd(out, sizeof out, "ls %s/cache | grep -c token-max", d) == 0 && atoi(out) == 1);
    poke_tokens(data, 200);
    int rc = run_cmd(out, sizeof out, "PITH_CACHE_DIR=%s/cache %s train %s/train.json --steps 1 --set run_dir=%s/r", d,
                     PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "data.bin: token 200 at position 5 is outside the model's vocabulary of 64"),
               "exit %d: %s", rc, out);
    // a cache that lies (written under this very file's key): the embedding stops the run, naming the id
    ASSERT(run_cmd(out, sizeof out, "cd %s/cache && for f in token-max-*; do rm $f; done", d) == 0);
    rc = run_cmd(out, sizeof out, "PITH_CACHE_DIR=%s/cache %s train %s/train.json --steps 1 --set run_dir=%s/r", d,
                 PITH_BIN, d, d);
    ASSERT(rc == 1);
    ASSERT(run_cmd(out, sizeof out, "cd %s/cache && for f in token-max-*; do echo 5 > $f; done", d) == 0);
    rc = run_cmd(out, sizeof out, "PITH_CACHE_DIR=%s/cache %s train %s/train.json --steps 1 --set run_dir=%s/r", d,
                 PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "pith: error: embedding: token id 200 (position ") &&
                   strstr(out, "is outside the vocabulary of 64 (during step 1)"),
               "exit %d: %s", rc, out);
}

TEST(data_symlink_to_parent_refused) {
    const char *d = rel_run();
    char out[1 << 16];
    int rc = run_cmd(out, sizeof out,
                     "mkdir -p %s/ds && cp %s/data.bin %s/ds/ && ln -s .. %s/ds/up && %s train %s/train.json --set "
                     "dataset=%s/ds",
                     d, d, d, d, PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "ds/up/ds: the same folder as ") &&
                   strstr(out, "(a link): the dataset would read it more than once"),
               "exit %d: %s", rc, out);
    // a second link to one token file
    rc = run_cmd(out, sizeof out,
                 "rm %s/ds/up && ln -s data.bin %s/ds/again.bin && %s train %s/train.json --set dataset=%s/ds", d, d,
                 PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "the same file as"), "exit %d: %s", rc, out);
}

// Qwen3's tokenizer in dir/tok with added_tokens[0].id set to id and tokenizer_config.json's eos_token to eos.
static void qwen3_tokenizer(const char *dir, json_int_t id, const char *eos) {
    char path[600];
    json_t *t = json_load_or_die("data/tokenizers/qwen3/tokenizer.json");
    json_object_set_new(json_array_get(json_object_get(t, "added_tokens"), 0), "id", json_integer(id));
    snprintf(path, sizeof path, "%s/tok", dir);
    mkdir_p(path);
    snprintf(path, sizeof path, "%s/tok/tokenizer.json", dir);
    ASSERT(json_dump_file(t, path, 0) == 0);
    json_decref(t);
    char text[256];
    snprintf(text, sizeof text, "{\"eos_token\": \"%s\"}", eos);
    snprintf(path, sizeof path, "%s/tok", dir);
    write_text(path, "tokenizer_config.json", text);
}

TEST(tokenize_bad_eos_and_added_ids) {
    ASSERT_MSG(path_exists("data/tokenizers/qwen3/tokenizer.json"), "run scripts/tokenizers.sh");
    const char *d = test_tmpdir();
    char out[1 << 16];
    write_text(d, "in/a.txt", "ab");
    write_text(d, "in/empty.txt", "");
    qwen3_tokenizer(d, 151643, "<|nope|>");
    int rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer %s/tok --input %s/in --output %s/o", PITH_BIN, d, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "tokenizer_config.json: eos_token: '<|nope|>' is not in the vocabulary"),
               "exit %d: %s", rc, out);
    qwen3_tokenizer(d, 1000000000, "<|im_end|>");
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer %s/tok --input %s/in --output %s/o", PITH_BIN, d, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "tokenizer.json: added_tokens[0].id: expected an id in [0, 2^24)"), "exit %d: %s",
               rc, out);
    // a good one; the empty file becomes a token file without documents (its ends record is empty)
    qwen3_tokenizer(d, 151643, "<|im_end|>");
    rc = run_cmd(out, sizeof out, "%s tokenize --tokenizer %s/tok --input %s/in --output %s/o", PITH_BIN, d, d, d);
    ASSERT_MSG(rc == 0, "exit %d: %s", rc, out);
    size_t n;
    char path[600], err[300];
    snprintf(path, sizeof path, "%s/o/empty.txt.bin", d);
    char *buf = file_read_all(path, &n);
    ASSERT_MSG(buf, "%s missing", path);
    NpyRecord tok, ends;
    ASSERT_MSG(npy_token_file_parse((const uint8_t *)buf, n, &tok, &ends, &(NpyRecord){0}, err, sizeof err), "%s", err);
    ASSERT(tok.n == 0 && ends.n == 0);
    free(buf);
}

TEST(errors_config_bounds_and_messages) {
    const char *d = rel_run();
    char out[1 << 16];
    static const char *const cases[][2] = {
        {"--set moe_router_bias_update_rate=1e300", "--set: moe_router_bias_update_rate: must be in [0, 1]"},
        {"--set scheduler.type=wsd --set scheduler.final_lr=1e30",
         "--set: scheduler.final_lr: 1e+30 is above optimizer.lr = 0.01"},
        {"--set scheduler.type=cosine --set scheduler.start_lr=1",
         "--set: scheduler.start_lr: 1 is above optimizer.lr = 0.01"},
        {"--set optimizer..lr=1", "--set optimizer..lr=1: the key 'optimizer..lr' has an empty part"},
        {"--set validation.interval=-1", "--set: validation.interval: must be in [0, "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run_cmd(out, sizeof out, "%s train %s/train.json %s", PITH_BIN, d, cases[i][0]);
        ASSERT_MSG(rc == 1 && strstr(out, cases[i][1]) && strchr(out, '\n') == out + strlen(out) - 1, "%s: exit %d: %s",
                   cases[i][0], rc, out);
    }
    int rc = run_cmd(out, sizeof out, "%s convert foo %s/a %s/b", PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "convert: unknown direction 'foo' (hf2pith or pith2hf"), "exit %d: %s", rc, out);
}

static void quantise_nan(void) {
    float x[128];
    for (int i = 0; i < 128; i++) x[i] = 1;
    x[7] = NAN;
    snprintf(die_context, sizeof die_context, "step 7");
    Tensor t = tensor_make(x, DT_F32, DEV_CPU, 2, 1, 128, 1, 1);
    op_fp8_round(t, t, FP8_ROWS, (Tensor){0});
}

TEST(fp8_nonfinite_names_the_step) {
    const char *log = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/die.log", log);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CHECK(freopen(path, "w", stderr));
        quantise_nan();
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    char *msg = file_read_all(path, NULL);
    ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1 && msg &&
                   strstr(msg, "fp8: cannot quantise a non-finite value: x[0, 7] = nan") &&
                   strstr(msg, " (during step 7)\n"),
               "%s", msg ? msg : "");
    free(msg);
}
