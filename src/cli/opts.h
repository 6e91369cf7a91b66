/* Options shared by run / serve / bench: model, threads, context, sampling,
 * speculative decoding (tandem names and vLLM's). */
#ifndef TANDEM_CLI_OPTS_H
#define TANDEM_CLI_OPTS_H
#include <stdbool.h>
#include <stdint.h>
#include "tandem.h"

#define TD_DEFAULT_MODEL "models/demo"

typedef struct common_opts {
    const char *model;
    int threads;
    int max_model_len;
    int spec_depth;
    bool draft_sampling;
    td_sampling sampling;
    /* memory (CPU): budget = --memory-budget, or MemTotal x --gpu-memory-utilization */
    bool max_model_len_auto;
    int kv_dtype;              /* 0 auto (f32), 1 bf16, 2 fp8 */
    int quantize;              /* 0 none, 1 q8 (td_engine_opts.quantize) */
    int deltanet_chunk;        /* td_engine_opts.deltanet_chunk */
    uint64_t kv_cache_memory;  /* bytes; 0 = from the budget */
    uint64_t memory_budget;    /* bytes; 0 = auto */
    double mem_util;           /* default 0.9 */
    bool prefix_caching;       /* default on */
} common_opts;

void common_opts_init(common_opts *o);
/* Consumes argv[*i] (and its value) if it is a common option: returns 1 if
 * consumed, 0 if not ours, -1 on a bad value (message printed). */
int common_opts_parse(common_opts *o, int argc, char **argv, int *i);
const char *common_opts_help(void);
/* Parses "123", "32k", "1M" (k = 1024). Returns -1 when invalid. */
long parse_size_suffix(const char *s);
#endif
