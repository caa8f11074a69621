// args.c — command-line values shared by the subcommands (see app.h).
#include <errno.h>
#include <getopt.h>

#include "app/app.h"
#include "train/ckpt.h"

int64_t arg_int(const char *cmd, const char *opt, const char *val, int64_t lo, int64_t hi) {
    char *end;
    errno = 0;
    long long v = val ? strtoll(val, &end, 10) : 0;
    if (!val || !val[0] || *end || errno == ERANGE || v < lo || v > hi)
        die("%s: %s needs an integer in [%lld, %lld] (got %s%s%s)", cmd, opt, (long long)lo, (long long)hi,
            val ? "'" : "", val ? val : "nothing", val ? "'" : "");
    return v;
}

double arg_num(const char *cmd, const char *opt, const char *val, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (!val[0] || *end || errno == ERANGE || !(v >= lo && v <= hi))
        die("%s: %s needs a number in [%g, %g] (got '%s')", cmd, opt, lo, hi, val);
    return v;
}

Device arg_device(const char *cmd, const char *device) {
    if (strcmp(device, "auto") && strcmp(device, "cpu") && strcmp(device, "cuda"))
        die("%s: --device must be auto, cpu or cuda (got '%s')", cmd, device);
    if (!strcmp(device, "cuda") && !ops_cuda_available())
        die("%s: --device cuda: no usable GPU or no CUDA backend in this build", cmd);
    return strcmp(device, "cpu") && ops_cuda_available() ? DEV_CUDA : DEV_CPU;
}

void arg_model_dir(const char *cmd, const char *model, char *dir, size_t cap) {
    char cfg[4300];
    snprintf(dir, cap, "%s", model);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    if (!path_is_dir(model) || path_exists(cfg)) return;
    if (!ckpt_find_latest(model, dir, cap, false))
        die("%s: no config.json and no checkpoints (step-N folders): not a model folder or a save_location", model);
    fprintf(stderr, "%s: %s is a save_location; its newest checkpoint is %s\n", cmd, model, dir);
}

void arg_load_weights(Model *m, const char *dir) {
    ParamTable all;
    model_params_all(m, &all);
    float *w[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) w[g] = xmalloc(m->params.numel[g] * sizeof(float) + 1);
    ckpt_load_model_part(&all, &m->params, w, dir);
    free(all.p);
    for (int g = 0; g < NGROUPS; g++) {
        op_copy(m->w[g], tf32_1(w[g], m->params.numel[g]));
        free(w[g]);
    }
}

void arg_suggest_option(const struct option *opts, char **argv) {
    const char *arg = argv[optind - 1], *names[64];
    if (strncmp(arg, "--", 2)) return;
    char word[128];
    snprintf(word, sizeof word, "%.*s", (int)strcspn(arg + 2, "="), arg + 2);
    int n = 0;
    for (; opts[n].name && n < 64; n++) {
        if (!strcmp(opts[n].name, word)) return; // a known option that lacks its value: getopt said so
        names[n] = opts[n].name;
    }
    const char *near = closest_name(word, names, n);
    if (near) fprintf(stderr, "did you mean --%s?\n", near);
}
