/* What the command line tells a user when something goes wrong: one plain
 * line, with the library's "src/x.c:123:" detail only under -v. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/cli.h"
#include "util/err.h"

bool cli_verbose;

const char *cli_errmsg(const td_err *e) { return cli_verbose ? e->msg : td_err_text(e); }

void cli_error(const char *prefix, const td_err *e) { fprintf(stderr, "%s: %s\n", prefix, cli_errmsg(e)); }

int cli_check_model_dir(const char *prefix, const char *dir) {
    struct stat st;
    if (!dir || !*dir) { fprintf(stderr, "%s: no model directory given (-m DIR)\n", prefix); return 1; }
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) fprintf(stderr, "%s: %s: no such model directory\n", prefix, dir);
        else fprintf(stderr, "%s: %s: cannot open the model directory: %s\n", prefix, dir, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) { fprintf(stderr, "%s: %s: not a directory (-m wants a model directory)\n", prefix, dir); return 1; }
    return 0;
}

int cli_unknown(const char *cmd, const char *opt) {
    fprintf(stderr, "tandem %s: unknown option %s (usage: tandem %s --help)\n", cmd, opt, cmd);
    return 2;
}

int cli_missing(const char *cmd, const char *opt, const char *want) {
    fprintf(stderr, "tandem %s: %s needs a value (%s)\n", cmd, opt, want);
    return 2;
}

bool cli_is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }
bool cli_is_verbose(const char *a) { return !strcmp(a, "-v") || !strcmp(a, "--verbose"); }
