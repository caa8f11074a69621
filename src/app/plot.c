// plot.c — `pith plot RUN_DIR... [--output FILE.png|.svg]`: the loss curves of one or more runs from their
// metrics.jsonl — training loss (solid), validation loss (dashed, with markers) on the left axis, the learning
// rate (dotted) on the right axis — drawn with cairo into a PNG or an SVG of a fixed size. A run still in
// progress is fine: a last line that is not complete yet is left out.
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include <cairo/cairo-svg.h>
#include <cairo/cairo.h>
#include <jansson.h>

#include "app/app.h"

enum { PLOT_W = 1000, PLOT_H = 600, MAX_RUNS = 8 };
// The plotting area inside the picture (pixels from the left and top edges).
static const double X0 = 80, X1 = PLOT_W - 90, Y0 = 50, Y1 = PLOT_H - 70;

typedef struct {
    char name[256];
    int n, nval;
    double *step, *loss, *lr; // (n) training rows
    double *vstep, *vloss;    // (nval) rows that carry val_loss
} Series;

// Reads <dir>/metrics.jsonl. Every line but the last must be a JSON object with step, loss and lr; the last
// may be incomplete (the run is still writing it) and is then skipped. A loss or val_loss of null (a step
// that was not finite: JSON has no NaN) is read as NaN and leaves a gap in its curve.
static void series_read(Series *s, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    size_t len = 0;
    char *text = file_read_all(path, &len);
    if (!text) die("%s: cannot read: %s", path, strerror(errno));
    const char *base = strrchr(dir, '/') && strrchr(dir, '/')[1] ? strrchr(dir, '/') + 1 : dir;
    snprintf(s->name, sizeof s->name, "%s", base);
    int cap = 1;
    for (size_t i = 0; i < len; i++) cap += text[i] == '\n';
    s->step = xmalloc(cap * sizeof(double)), s->loss = xmalloc(cap * sizeof(double));
    s->lr = xmalloc(cap * sizeof(double));
    s->vstep = xmalloc(cap * sizeof(double)), s->vloss = xmalloc(cap * sizeof(double));
    int lineno = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        bool complete = nl != NULL;
        if (nl) *nl = 0;
        lineno++;
        json_t *row = json_loads(line, 0, NULL);
        json_t *st = json_object_get(row, "step"), *lo = json_object_get(row, "loss"), *lr = json_object_get(row, "lr");
        if (!row || !json_is_integer(st) || !(json_is_number(lo) || json_is_null(lo)) || !json_is_number(lr)) {
            if (!complete) break;
            die("%s: line %d: expected a JSON object with step, loss and lr", path, lineno);
        }
        s->step[s->n] = (double)json_integer_value(st), s->loss[s->n] = json_is_null(lo) ? NAN : json_number_value(lo);
        s->lr[s->n++] = json_number_value(lr);
        json_t *vl = json_object_get(row, "val_loss");
        if (json_is_number(vl) || json_is_null(vl))
            s->vstep[s->nval] = (double)json_integer_value(st),
            s->vloss[s->nval++] = json_is_null(vl) ? NAN : json_number_value(vl);
        json_decref(row);
        if (!complete) break;
        line = nl + 1;
    }
    free(text);
    if (!s->n) die("%s: no complete rows yet", path);
}

// A tick spacing of 1, 2 or 5 × 10^k giving about `want` ticks over [lo, hi].
static double nice_step(double lo, double hi, int want) {
    double raw = (hi - lo) / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

// The range [lo, hi] widened a little, and to a unit interval around a single value.
static void pad_range(double *lo, double *hi) {
    if (*hi - *lo < 1e-12 * fmax(1, fabs(*hi))) {
        double c = *lo, h = fmax(fabs(c) * 0.1, 0.5);
        *lo = c - h, *hi = c + h;
    } else {
        double m = 0.05 * (*hi - *lo);
        *lo -= m, *hi += m;
    }
}

static void text_at(cairo_t *cr, double x, double y, double align, const char *s) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - align * e.width, y);
    cairo_show_text(cr, s);
}

static const double colours[MAX_RUNS][3] = {{0.12, 0.47, 0.71}, {0.84, 0.15, 0.16}, {0.17, 0.63, 0.17},
                                            {1.0, 0.50, 0.05},  {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29},
                                            {0.89, 0.47, 0.76}, {0.5, 0.5, 0.5}};

// Draws every series: axes with ticks on the left (loss) and right (lr), a legend, the curves.
static void draw(cairo_t *cr, Series *runs, int nruns) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY, lrhi = 0;
    for (int r = 0; r < nruns; r++) {
        Series *s = &runs[r];
        for (int i = 0; i < s->n; i++) {
            xlo = fmin(xlo, s->step[i]), xhi = fmax(xhi, s->step[i]), lrhi = fmax(lrhi, s->lr[i]);
            if (isfinite(s->loss[i])) ylo = fmin(ylo, s->loss[i]), yhi = fmax(yhi, s->loss[i]);
        }
        for (int i = 0; i < s->nval; i++)
            if (isfinite(s->vloss[i])) ylo = fmin(ylo, s->vloss[i]), yhi = fmax(yhi, s->vloss[i]);
    }
    if (!isfinite(ylo)) ylo = 0, yhi = 1;
    pad_range(&xlo, &xhi), pad_range(&ylo, &yhi);
    if (xlo < 0 && xlo > -0.5 * (xhi - xlo)) xlo = 0;
    double lrlo = 0;
    lrhi = lrhi > 0 ? lrhi * 1.05 : 1;
#define PX(x) (X0 + ((x)-xlo) / (xhi - xlo) * (X1 - X0))
#define PY(y) (Y1 - ((y)-ylo) / (yhi - ylo) * (Y1 - Y0))
#define PL(y) (Y1 - ((y)-lrlo) / (lrhi - lrlo) * (Y1 - Y0))
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 13);
    // Grid and ticks: steps below, loss on the left, lr on the right.
    char lab[64];
    cairo_set_line_width(cr, 1);
    double dx = nice_step(xlo, xhi, 8), dy = nice_step(ylo, yhi, 6), dl = nice_step(lrlo, lrhi, 6);
    for (double x = ceil(xlo / dx) * dx; x <= xhi; x += dx) {
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, PX(x), Y0), cairo_line_to(cr, PX(x), Y1), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(lab, sizeof lab, "%g", x);
        text_at(cr, PX(x), Y1 + 18, 0.5, lab);
    }
    for (double y = ceil(ylo / dy) * dy; y <= yhi; y += dy) {
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, X0, PY(y)), cairo_line_to(cr, X1, PY(y)), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(lab, sizeof lab, "%.4g", fabs(y) < 1e-9 * dy ? 0.0 : y);
        text_at(cr, X0 - 6, PY(y) + 4, 1, lab);
    }
    for (double y = 0; y <= lrhi; y += dl) {
        snprintf(lab, sizeof lab, "%.2g", y);
        text_at(cr, X1 + 6, PL(y) + 4, 0, lab);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_rectangle(cr, X0, Y0, X1 - X0, Y1 - Y0), cairo_stroke(cr);
    text_at(cr, (X0 + X1) / 2, PLOT_H - 25, 0.5, "step");
    cairo_save(cr);
    cairo_translate(cr, 25, (Y0 + Y1) / 2), cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, 0.5, "loss (solid: train, dashed: validation)");
    cairo_restore(cr);
    cairo_save(cr);
    cairo_translate(cr, PLOT_W - 25, (Y0 + Y1) / 2), cairo_rotate(cr, M_PI / 2);
    text_at(cr, 0, 0, 0.5, "learning rate (dotted)");
    cairo_restore(cr);
    // Curves, clipped to the plotting area.
    cairo_save(cr);
    cairo_rectangle(cr, X0, Y0, X1 - X0, Y1 - Y0), cairo_clip(cr);
    for (int r = 0; r < nruns; r++) {
        Series *s = &runs[r];
        const double *c = colours[r % MAX_RUNS];
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        double dots[] = {2, 3}, dashes[] = {7, 4};
        cairo_set_line_width(cr, 1.2), cairo_set_dash(cr, dots, 2, 0);
        for (int i = 0; i < s->n; i++) (i ? cairo_line_to : cairo_move_to)(cr, PX(s->step[i]), PL(s->lr[i]));
        cairo_stroke(cr);
        cairo_set_line_width(cr, 2), cairo_set_dash(cr, NULL, 0, 0);
        for (int i = 0; i < s->n; i++) // a non-finite loss breaks the line (the pen lifts)
            if (isfinite(s->loss[i]))
                (i && isfinite(s->loss[i - 1]) ? cairo_line_to : cairo_move_to)(cr, PX(s->step[i]), PY(s->loss[i]));
        cairo_stroke(cr);
        for (int i = 0; i < s->n; i++) // a point with no finite neighbour (one row, or between gaps): a dot
            if (isfinite(s->loss[i]) && !(i && isfinite(s->loss[i - 1])) && !(i + 1 < s->n && isfinite(s->loss[i + 1])))
                cairo_arc(cr, PX(s->step[i]), PY(s->loss[i]), 3.5, 0, 2 * M_PI), cairo_fill(cr);
        cairo_set_dash(cr, dashes, 2, 0);
        for (int i = 0; i < s->nval; i++)
            if (isfinite(s->vloss[i]))
                (i && isfinite(s->vloss[i - 1]) ? cairo_line_to : cairo_move_to)(cr, PX(s->vstep[i]), PY(s->vloss[i]));
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        for (int i = 0; i < s->nval; i++)
            if (isfinite(s->vloss[i]))
                cairo_arc(cr, PX(s->vstep[i]), PY(s->vloss[i]), 3.5, 0, 2 * M_PI), cairo_fill(cr);
    }
    cairo_restore(cr);
    // Legend, top right on a white box: one line per run with its last losses.
    char lines[MAX_RUNS][400];
    double lw = 0;
    for (int r = 0; r < nruns; r++) {
        Series *s = &runs[r];
        int k = snprintf(lines[r], sizeof lines[r], "%s: loss %.4f at step %g", s->name, s->loss[s->n - 1],
                         s->step[s->n - 1]);
        if (s->nval) snprintf(lines[r] + k, sizeof lines[r] - k, ", val %.4f", s->vloss[s->nval - 1]);
        cairo_text_extents_t e;
        cairo_text_extents(cr, lines[r], &e);
        lw = fmax(lw, e.x_advance);
    }
    double lx = X1 - lw - 40, ly = Y0 + 8;
    cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
    cairo_rectangle(cr, lx - 6, ly, lw + 40, 18 * nruns + 8), cairo_fill(cr);
    for (int r = 0; r < nruns; r++) {
        const double *c = colours[r % MAX_RUNS];
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        cairo_rectangle(cr, lx, ly + 10 + 18 * r, 14, 4), cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, lx + 20, ly + 16 + 18 * r, 0, lines[r]);
    }
    cairo_set_font_size(cr, 15);
    text_at(cr, (X0 + X1) / 2, 30, 0.5, nruns == 1 ? runs[0].name : "loss curves");
#undef PX
#undef PY
#undef PL
}

static void plot_usage(FILE *f) {
    fprintf(f,
            "usage: pith plot RUN_DIR [RUN_DIR ...] [--output FILE.png|FILE.svg]\n"
            "  Draws the training loss, validation loss and learning rate of each run's metrics.jsonl\n"
            "  (%dx%d). Default output: <first RUN_DIR>/loss.png. Prints the path it wrote.\n",
            PLOT_W, PLOT_H);
}

int cmd_plot(int argc, char **argv) {
    const char *dirs[MAX_RUNS], *output = NULL;
    int nruns = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return plot_usage(stdout), 0;
        if (!strcmp(argv[i], "--output") || !strcmp(argv[i], "-o")) {
            if (i + 1 >= argc) die("plot: --output needs a file name ending in .png or .svg");
            output = argv[++i];
        } else if (argv[i][0] == '-') die("plot: unknown option '%s' (see pith plot --help)", argv[i]);
        else if (nruns == MAX_RUNS) die("plot: at most %d runs in one picture", MAX_RUNS);
        else dirs[nruns++] = argv[i];
    }
    if (!nruns) {
        plot_usage(stderr);
        return 2;
    }
    char def[4200], tmp[4300];
    if (!output) snprintf(def, sizeof def, "%s/loss.png", dirs[0]), output = def;
    bool svg = str_ends_with(output, ".svg");
    if (!svg && !str_ends_with(output, ".png")) die("plot: --output %s: the name must end in .png or .svg", output);
    Series runs[MAX_RUNS] = {0};
    for (int r = 0; r < nruns; r++) series_read(&runs[r], dirs[r]);
    // Drawn under a temporary name and renamed: a failed plot leaves no half-written picture.
    snprintf(tmp, sizeof tmp, "%s.tmp%s", output, svg ? ".svg" : ".png");
    cairo_surface_t *surf = svg ? cairo_svg_surface_create(tmp, PLOT_W, PLOT_H)
                                : cairo_image_surface_create(CAIRO_FORMAT_ARGB32, PLOT_W, PLOT_H);
    cairo_t *cr = cairo_create(surf);
    draw(cr, runs, nruns);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (!svg && st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png(surf, tmp);
    cairo_surface_finish(surf);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(surf);
    cairo_surface_destroy(surf);
    if (st != CAIRO_STATUS_SUCCESS) {
        remove(tmp);
        die("plot: %s: cannot write: %s", output, cairo_status_to_string(st));
    }
    if (rename(tmp, output)) die("plot: %s: cannot write: %s", output, strerror(errno));
    for (int r = 0; r < nruns; r++)
        free(runs[r].step), free(runs[r].loss), free(runs[r].lr), free(runs[r].vstep), free(runs[r].vloss);
    printf("%s\n", output);
    return 0;
}
