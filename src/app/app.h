// app.h — the subcommands of build/pith. Each returns the process exit status.
#pragma once
int cmd_train(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_estimate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_plot(int argc, char **argv);
