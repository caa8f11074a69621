// test_logs.c — what a run leaves for people to look at: TensorBoard event files (read back by
// tests/tboard_read.py, a decoder that shares no code with src/train/tboard.c) and `pith plot` pictures.
#include <cairo/cairo.h>
#include <jansson.h>

#include "test.h"
#include "train/tboard.h"

// A tiny Qwen3-MoE, synthetic tokens and a train.json of `steps` steps in dir.
static void make_tiny_run(const char *dir, int steps) {
    write_text(
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
    write_text(dir, "train.json", cfg);
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
            // float32 of the value; metrics.jsonl holds it to 9 digits, so the two may round one float apart.
            double a = json_number_value(got), b = json_number_value(v);
            ASSERT_MSG(fabs(a - b) <= 0x1p-23 * fabs(b), "step %d: %s = %.9g vs %.9g", rows, key, a, b);
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

// ---- pith plot ------------------------------------------------------------------------------------

// Pixels of a PNG within 0.1 of colour (r, g, b); the picture's size in w, h.
static int png_pixels_near(const char *file, double r, double g, double b, int *w, int *h) {
    cairo_surface_t *s = cairo_image_surface_create_from_png(file);
    ASSERT_MSG(cairo_surface_status(s) == CAIRO_STATUS_SUCCESS, "%s: %s", file,
               cairo_status_to_string(cairo_surface_status(s)));
    *w = cairo_image_surface_get_width(s), *h = cairo_image_surface_get_height(s);
    int stride = cairo_image_surface_get_stride(s), n = 0;
    const uint8_t *px = cairo_image_surface_get_data(s);
    for (int y = 0; y < *h; y++)
        for (int x = 0; x < *w; x++) {
            uint32_t v = *(const uint32_t *)(px + y * stride + 4 * x); // ARGB32, native endian
            double pr = ((v >> 16) & 255) / 255.0, pg = ((v >> 8) & 255) / 255.0, pb = (v & 255) / 255.0;
            n += fabs(pr - r) < 0.1 && fabs(pg - g) < 0.1 && fabs(pb - b) < 0.1;
        }
    cairo_surface_destroy(s);
    return n;
}

TEST(plot_png_and_svg_of_one_several_and_unfinished_runs) {
    const char *d = test_tmpdir();
    make_tiny_run(d, 12);
    char out[65536], png[512];
    ASSERT(run_cmd(out, sizeof out,
                   "%s train %s/train.json --set run_dir=%s/a && %s train %s/train.json --set run_dir=%s/b "
                   "--set optimizer.lr=0.003 --set max_steps=8",
                   PITH_BIN, d, d, PITH_BIN, d, d) == 0);
    // One run, the default output: <run>/loss.png, 1000×600, with the first run's colour (blue) drawn.
    ASSERT_MSG(run_cmd(out, sizeof out, "%s plot %s/a", PITH_BIN, d) == 0, "%s", out);
    snprintf(png, sizeof png, "%s/a/loss.png", d);
    ASSERT(strstr(out, png));
    int w, h, blue = png_pixels_near(png, 0.12, 0.47, 0.71, &w, &h);
    ASSERT(w == 1000 && h == 600);
    ASSERT_MSG(blue > 500, "only %d pixels of the curve's colour", blue);
    // Two runs: both colours appear.
    snprintf(png, sizeof png, "%s/ab.png", d);
    ASSERT(run_cmd(out, sizeof out, "%s plot %s/a %s/b --output %s", PITH_BIN, d, d, png) == 0);
    int red = png_pixels_near(png, 0.84, 0.15, 0.16, &w, &h);
    blue = png_pixels_near(png, 0.12, 0.47, 0.71, &w, &h);
    ASSERT_MSG(red > 500 && blue > 500, "red %d, blue %d pixels", red, blue);
    // SVG of the same size.
    ASSERT(run_cmd(out, sizeof out, "%s plot %s/a %s/b --output %s/ab.svg && head -c 400 %s/ab.svg", PITH_BIN, d, d, d,
                   d) == 0);
    ASSERT_MSG(strstr(out, "<svg") && strstr(out, "width=\"1000pt\"") && strstr(out, "height=\"600pt\""), "%s", out);
    // A run with one row, and a run still writing its last line: both plot.
    ASSERT(run_cmd(out, sizeof out,
                   "mkdir -p %s/one %s/live && head -1 %s/a/metrics.jsonl > %s/one/metrics.jsonl && "
                   "head -5 %s/a/metrics.jsonl > %s/live/metrics.jsonl && "
                   "sed -n 6p %s/a/metrics.jsonl | head -c 40 >> %s/live/metrics.jsonl",
                   d, d, d, d, d, d, d, d) == 0);
    ASSERT_MSG(run_cmd(out, sizeof out, "%s plot %s/one %s/live --output %s/ol.png", PITH_BIN, d, d, d) == 0, "%s",
               out);
    snprintf(png, sizeof png, "%s/ol.png", d);
    blue = png_pixels_near(png, 0.12, 0.47, 0.71, &w, &h);
    ASSERT(w == 1000 && h == 600 && blue > 20);
    // Bad input: a broken line inside the file, a folder without metrics, a wrong extension; none leaves a file.
    ASSERT(run_cmd(out, sizeof out, "cp -r %s/a %s/bad && sed -i '3s/.*/{\"step\": 3, /' %s/bad/metrics.jsonl", d, d,
                   d) == 0);
    ASSERT(run_cmd(out, sizeof out, "%s plot %s/bad --output %s/bad.png", PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "bad/metrics.jsonl: line 3:"), "%s", out);
    ASSERT(run_cmd(out, sizeof out, "%s plot %s/nothing --output %s/n.png", PITH_BIN, d, d) == 1);
    ASSERT(strstr(out, "nothing/metrics.jsonl: cannot read"));
    ASSERT(run_cmd(out, sizeof out, "%s plot %s/a --output %s/a.jpg", PITH_BIN, d, d) == 1 &&
           strstr(out, ".png or .svg"));
    ASSERT(run_cmd(out, sizeof out, "ls %s", d) == 0 && !strstr(out, "bad.png") && !strstr(out, "n.png") &&
           !strstr(out, "tmp"));
}

// A run that diverged has `null` losses in metrics.jsonl (JSON has no NaN): it plots, with a gap where the loss
// was not finite (a point between two gaps is a dot), instead of being refused.
TEST(plot_run_with_nonfinite_steps) {
    const char *d = test_tmpdir();
    make_tiny_run(d, 30);
    char out[65536], png[512];
    int rc =
        run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/nan --set optimizer.lr=1e6", PITH_BIN, d, d);
    ASSERT_MSG(rc == 1 && strstr(out, "pith: error: step "), "exit %d: %s", rc, out);
    ASSERT(run_cmd(out, sizeof out, "tail -1 %s/nan/metrics.jsonl", d) == 0 && strstr(out, "\"loss\": null"));
    ASSERT_MSG(run_cmd(out, sizeof out, "%s plot %s/nan", PITH_BIN, d) == 0, "%s", out);
    snprintf(png, sizeof png, "%s/nan/loss.png", d);
    int w, h, blue = png_pixels_near(png, 0.12, 0.47, 0.71, &w, &h);
    ASSERT(w == 1000 && h == 600 && blue > 20);
    // a gap in the middle, a lone point between gaps, and a null val_loss
    write_text(
        d, "gap/metrics.jsonl",
        "{\"step\": 1, \"loss\": 4, \"lr\": 0.1}\n{\"step\": 2, \"loss\": null, \"lr\": 0.1}\n"
        "{\"step\": 3, \"loss\": 3.5, \"val_loss\": null, \"lr\": 0.1}\n{\"step\": 4, \"loss\": null, \"lr\": 0.1}\n"
        "{\"step\": 5, \"loss\": 3, \"lr\": 0.1}\n{\"step\": 6, \"loss\": 2.5, \"val_loss\": 2.6, \"lr\": 0.1}\n");
    ASSERT_MSG(run_cmd(out, sizeof out, "%s plot %s/gap", PITH_BIN, d) == 0, "%s", out);
    snprintf(png, sizeof png, "%s/gap/loss.png", d);
    blue = png_pixels_near(png, 0.12, 0.47, 0.71, &w, &h);
    ASSERT(w == 1000 && h == 600 && blue > 20);
}
