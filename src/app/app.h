// app.h — the subcommands of build/pith. Each returns the process exit status.
#pragma once
int cmd_train(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_estimate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_generate(int argc, char **argv);

#include <stdint.h>
// The integer value of option opt of command cmd, in [lo, hi]; dies naming both otherwise (val NULL:
// the option had no value).
int64_t arg_int(const char *cmd, const char *opt, const char *val, int64_t lo, int64_t hi);
// The number value of option opt of command cmd, in [lo, hi]; dies naming both otherwise.
double arg_num(const char *cmd, const char *opt, const char *val, double lo, double hi);

#include "base/base.h"
struct option;
// After getopt_long answered '?' for argv[optind - 1] (it has said why): "did you mean --x?" when an option of opts
// is a near miss, on stderr.
void arg_suggest_option(const struct option *opts, char **argv);
// The device of --device auto|cpu|cuda (auto: the GPU when this build has a usable one); dies naming cmd otherwise.
Device arg_device(const char *cmd, const char *device);
// The model folder --model names, into dir: the folder itself when it holds config.json, else a save_location's
// newest checkpoint (said on stderr; read only: a run may be saving). Dies when it is neither.
void arg_model_dir(const char *cmd, const char *model, char *dir, size_t cap);
typedef struct Model Model;
// m's weights (this rank's part of the model) from the model folder dir, into its compute dtype.
void arg_load_weights(Model *m, const char *dir);
