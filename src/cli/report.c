/* What the command line tells a user when something goes wrong: one plain
 * line, with the library's "src/x.c:123:" detail only under -v. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/cli.h"
#include "util/err.h"

bool td_cli_verbose;

const char *td_cli_errmsg(const td_err *e) { return td_cli_verbose ? e->msg : td_err_text(e); }

void td_cli_error(const char *prefix, const td_err *e) { fprintf(stderr, "%s: %s\n", prefix, td_cli_errmsg(e)); }

int td_cli_check_model_dir(const char *prefix, const char *dir) {
    struct stat st;
    td_err e = {0};
    if (!dir || !*dir) TD_FAIL(&e, TD_ERR_ARG, "no model directory given (-m DIR)");
    else if (stat(dir, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) TD_FAIL(&e, TD_ERR_IO, "%s: no such model directory", dir);
        else TD_FAIL(&e, TD_ERR_IO, "%s: cannot open the model directory: %s", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) TD_FAIL(&e, TD_ERR_ARG, "%s: not a directory (-m wants a model directory)", dir);
    else return 0;
    td_cli_error(prefix, &e);
    return 1;
}

int td_cli_unknown(const char *cmd, const char *opt) {
    fprintf(stderr, "tandem %s: unknown option %s (usage: tandem %s --help)\n", cmd, opt, cmd);
    return 2;
}

int td_cli_missing(const char *cmd, const char *opt, const char *want) {
    fprintf(stderr, "tandem %s: %s needs a value (%s)\n", cmd, opt, want);
    return 2;
}

bool td_cli_is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }
bool td_cli_is_verbose(const char *a) { return !strcmp(a, "-v") || !strcmp(a, "--verbose"); }
