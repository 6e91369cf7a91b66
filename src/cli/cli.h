/* Sub-commands of the `tandem` binary; each returns the process exit code. */
#ifndef TANDEM_CLI_H
#define TANDEM_CLI_H
#include <stdbool.h>
#include "tandem.h"

int td_cmd_run(int argc, char **argv);
int td_cmd_serve(int argc, char **argv);
int td_cmd_inspect(int argc, char **argv);
int td_cmd_tokenize(int argc, char **argv);
int td_cmd_detokenize(int argc, char **argv);
int td_cmd_template(int argc, char **argv);
int td_cmd_plan(int argc, char **argv);
int td_cmd_bench(int argc, char **argv);
int td_cmd_kernels(int argc, char **argv);

/* ---- user-facing reports (report.c) ---- */
/* -v / --verbose: library errors keep their "src/x.c:123: " locations. */
extern bool td_cli_verbose;
/* A library error as a user reads it: without the locations, or whole under -v. */
const char *td_cli_errmsg(const td_err *e);
/* "PREFIX: message\n" on stderr. */
void td_cli_error(const char *prefix, const td_err *e);
/* 0 when dir is a directory; else one line ("PREFIX: DIR: no such model directory") and 1. */
int td_cli_check_model_dir(const char *prefix, const char *dir);
/* One line on stderr; both return 2 (bad usage). */
int td_cli_unknown(const char *cmd, const char *opt);
int td_cli_missing(const char *cmd, const char *opt, const char *want);
bool td_cli_is_help(const char *arg);    /* -h, --help */
bool td_cli_is_verbose(const char *arg); /* -v, --verbose */
#endif
