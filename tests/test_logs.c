// test_logs.c — what a run leaves for people to look at: TensorBoard event files (read back by
// tests/tboard_read.py, a decoder that shares no code with src/train/tboard.c) and `pith plot` pictures.
#include <jansson.h>

#include "test.h"
#include "train/tboard.h"

static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(text, f);
    fclose(f);
}

// A tiny Qwen3-MoE, synthetic tokens and a train.json of `steps` steps in dir.
static void make_tiny_run(const char *dir, int steps) {
    write_file(
        dir, "model.json",
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 4, "
        "\"num_experts_per_tok\": 2,"
        " \"moe_intermediate_size\": 8, \"rope_theta\": 10000.0}");
    char out[4096], cfg[1024];
    ASSERT(run_cmd(out, sizeof out, "mkdir -p %s/data && %s synth --output %s/data/a.bin --vocab 64 --tokens 4000", dir,
                   PITH_BIN, dir) == 0);
    snprintf(cfg, sizeof cfg,
             "{\"model\": \"model.json\", \"dataset\": \"data\", \"sequence_length\": 8, \"micro_batch_size\": 2,"
             " \"global_batch_size\": 4, \"max_steps\": %d, \"device\": \"cpu\", \"moe_load_balance_coef\": 0.01,"
             " \"scheduler\": {\"type\": \"wsd\", \"warmup_ratio\": 0.5}, \"optimizer\": {\"lr\": 0.01}}",
             steps);
    write_file(dir, "train.json", cfg);
}

// The events of an event file as JSON objects (one per record), from tests/tboard_read.py.
static json_t *read_events(const char *file, char *err, size_t cap) {
    static char out[1 << 20];
    ASSERT_MSG(run_cmd(out, sizeof out, "python3 tests/tboard_read.py '%s' 2>%s.err", file, file) == 0, "%s", out);
    json_t *all = json_array();
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *e = json_loads(line, 0, NULL);
        ASSERT_MSG(e, "not JSON: %s", line);
        json_array_append_new(all, e);
    }
    char path[600];
    snprintf(path, sizeof path, "%s.err", file);
    size_t n = 0;
    char *e = file_read_all(path, &n);
    snprintf(err, cap, "%s", e ? e : "");
    free(e);
    return all;
}

TEST(tboard_crc32c_known_values) {
    // CRC-32C check value (RFC 3720 / iSCSI): "123456789" → 0xE3069283; 32 zero bytes → 0x8A9136AA.
    ASSERT(tboard_crc32c("123456789", 9) == 0xE3069283u);
    uint8_t z[32] = {0};
    ASSERT(tboard_crc32c(z, 32) == 0x8A9136AAu);
    ASSERT(tboard_crc32c("", 0) == 0);
}

TEST(tboard_every_scalar_of_every_step_reads_back) {
    const char *d = test_tmpdir();
    make_tiny_run(d, 6);
    char out[65536], file[512], err[4096];
    ASSERT_MSG(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/run", PITH_BIN, d, d) == 0, "%s", out);
    ASSERT(run_cmd(file, sizeof file, "ls %s/run/events.out.tfevents.* | head -1 | tr -d '\\n'", d) == 0 && file[0]);
    json_t *ev = read_events(file, err, sizeof err);
    ASSERT_MSG(!err[0], "%s", err);
    ASSERT(json_array_size(ev) == 7);
    ASSERT(!strcmp(json_string_value(json_object_get(json_array_get(ev, 0), "file_version")), "brain.Event:2"));
    // Every key of every metrics.jsonl line, as float32, in the event of its step.
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/run/metrics.jsonl", d);
    FILE *f = fopen(mpath, "r");
    ASSERT(f);
    char line[4096];
    int rows = 0, checked = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *m = json_loads(line, 0, NULL), *e = json_array_get(ev, ++rows);
        ASSERT(m && e);
        ASSERT(json_integer_value(json_object_get(e, "step")) == json_integer_value(json_object_get(m, "step")));
        ASSERT(json_number_value(json_object_get(e, "wall_time")) > 1.7e9);
        json_t *vals = json_object_get(e, "values");
        const char *key;
        json_t *v;
        json_object_foreach(m, key, v) {
            if (!strcmp(key, "step")) continue;
            json_t *got = json_object_get(vals, key);
            ASSERT_MSG(got, "step %d: %s missing from the event file", rows, key);
            ASSERT_MSG(json_number_value(got) == (double)(float)json_number_value(v), "step %d: %s = %.9g vs %.9g",
                       rows, key, json_number_value(got), json_number_value(v));
            checked++;
        }
        ASSERT(json_object_size(vals) == json_object_size(m) - 1);
        json_decref(m);
    }
    fclose(f);
    ASSERT(rows == 6);
    printf("     %d scalars of %d steps read back\n", checked, rows);
    json_decref(ev);
    // tensorboard: false writes none.
    ASSERT(run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/off --set tensorboard=false && ls %s/off",
                   PITH_BIN, d, d, d) == 0);
    ASSERT(!strstr(out, "tfevents"));
}

TEST(tboard_truncated_file_reads_to_last_whole_record) {
    const char *d = test_tmpdir();
    TbWriter w;
    tboard_open(&w, d);
    const char *tags[] = {"loss", "lr"};
    int64_t ends[8];
    int n = 0;
    ends[n++] = ftell(w.f);
    for (int s = 1; s <= 5; s++) {
        double vals[] = {10.0 / s, 1e-3 * s};
        tboard_scalars(&w, s, 2, tags, vals);
        ends[n++] = ftell(w.f);
    }
    // Without closing (a process killed now): every record is already in the file.
    char err[4096], cut[600], out[1024];
    json_t *ev = read_events(w.path, err, sizeof err);
    ASSERT(json_array_size(ev) == 6 && !err[0]);
    ASSERT(json_number_value(json_object_get(json_object_get(json_array_get(ev, 3), "values"), "loss")) ==
           (double)(float)(10.0 / 3));
    json_decref(ev);
    tboard_close(&w);
    // Cut at every record boundary and at points inside the next record: the reader returns the whole
    // records before the cut and says the rest is a partial record.
    snprintf(cut, sizeof cut, "%s/cut", d);
    int trials = 0;
    for (int r = 0; r < n; r++)
        for (int off = 0; off <= 13; off += (off < 12 ? 4 : 1)) {
            int64_t at = ends[r] + off;
            if (at > ends[n - 1]) continue;
            ASSERT(run_cmd(out, sizeof out, "head -c %lld '%s' > '%s'", (long long)at, w.path, cut) == 0);
            ev = read_events(cut, err, sizeof err);
            ASSERT_MSG((int)json_array_size(ev) == r + 1, "cut at %lld: %zu records, want %d", (long long)at,
                       json_array_size(ev), r + 1);
            ASSERT(off == 0 ? !err[0] : strstr(err, "truncated") != NULL);
            json_decref(ev);
            trials++;
        }
    printf("     %d cuts read back to their last whole record\n", trials);
    // A flipped byte is an error, never a silently wrong value.
    ASSERT(run_cmd(out, sizeof out,
                   "cp '%s' '%s' && printf '\\377' | dd of='%s' bs=1 seek=%lld conv=notrunc 2>/dev/null", w.path, cut,
                   cut, (long long)ends[2] + 20) == 0);
    ASSERT(run_cmd(out, sizeof out, "python3 tests/tboard_read.py '%s'", cut) != 0 &&
           strstr(out, "CRC does not match"));
}
