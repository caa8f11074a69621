// main.c — `pith <command> [args]`: the one binary of pith.
#include <signal.h>
#include <unistd.h>

#include "app/app.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"train", cmd_train, "train a model from a JSON config"},
    {"eval", cmd_eval, "mean token cross-entropy of a model on the first samples of a dataset"},
    {"estimate", cmd_estimate, "per-rank memory plan of a training config on N GPUs, without allocating"},
    {"generate", cmd_generate, "continue a prompt with a model (KV cache; greedy, temperature and top-p sampling)"},
    {"convert", cmd_convert, "Hugging Face folders <-> pith checkpoints (hf2pith, pith2hf)"},
    {"plot", cmd_plot, "draw the loss and learning-rate curves of runs (metrics.jsonl) into a PNG or SVG"},
    {"synth", cmd_synth, "write a synthetic token file (for tests and quick runs)"},
    {"tokenize", cmd_tokenize, "tokenize .jsonl/.jsonl.zst/.txt corpora into token files (HF tokenizer.json)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: pith <command> [args]   (pith <command> --help for a command's options; pith --version)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

// OpenMP threads that wait by spinning take the cores from everything else on a shared machine (the tiny
// example: 23.8 s with GCC's default waiting, 0.55 s passive, measured on 2 busy cores). The OpenMP runtime
// reads OMP_WAIT_POLICY when the program loads, so train and eval set it and start again once; a value the
// user set is kept. The binary's own path is started (not /proc/self/exe, which ps and pgrep would then call "exe").
static void prefer_passive_waiting(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv(self, argv); // returns only if it failed: then run as we are
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    // A file-size limit (ulimit -f) turns into a write error that names the file, not a silent SIGXFSZ death.
    signal(SIGXFSZ, SIG_IGN);
    if (argc == 2 && !strcmp(argv[1], "--version")) return printf("pith %s\n", PITH_VERSION), 0;
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "train") || !strcmp(argv[1], "eval") || !strcmp(argv[1], "generate"))
        prefer_passive_waiting(argv);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    const char *names[sizeof commands / sizeof *commands], *near;
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) names[i] = commands[i].name;
    near = closest_name(argv[1], names, (int)(sizeof commands / sizeof *commands));
    fprintf(stderr, "pith: error: unknown command '%s'%s%s%s\n", argv[1], near ? " (did you mean " : "",
            near ? near : "", near ? "?)" : "");
    usage(stderr);
    return 2;
}
