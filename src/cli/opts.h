/* Options shared by run / serve / bench: model, threads, context, sampling,
 * speculative decoding (tandem names and vLLM's). */
#ifndef TANDEM_CLI_OPTS_H
#define TANDEM_CLI_OPTS_H
#include <stdbool.h>
#include "tandem.h"

#define TD_DEFAULT_MODEL "models/demo"

typedef struct common_opts {
    const char *model;
    int threads;
    int max_model_len;
    int spec_depth;
    bool draft_sampling;
    td_sampling sampling;
} common_opts;

void common_opts_init(common_opts *o);
/* Consumes argv[*i] (and its value) if it is a common option: returns 1 if
 * consumed, 0 if not ours, -1 on a bad value (message printed). */
int common_opts_parse(common_opts *o, int argc, char **argv, int *i);
const char *common_opts_help(void);
/* Parses "123", "32k", "1M" (k = 1024). Returns -1 when invalid. */
long parse_size_suffix(const char *s);
#endif
