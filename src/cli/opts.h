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
    int spec_depth;            /* draft depth; with spec_auto the maximum (= spec_depth_max) */
    bool spec_auto;            /* --spec-depth auto (default): each step picks 0..spec_depth (spec/autodepth.h) */
    int spec_depth_max;        /* --spec-depth-max (default 4) */
    bool draft_sampling;
    td_sampling sampling;
    /* memory (CPU): budget = --memory-budget, or MemTotal x --gpu-memory-utilization */
    bool max_model_len_auto;
    td_kv_dtype kv_dtype;      /* td_engine_opts.kv_cache_dtype */
    int quantize;              /* 0 none, 1 q8 (td_engine_opts.quantize) */
    td_precision precision;    /* --precision f32|bf16|int8 (td_engine_opts.precision) */
    int isa;                   /* --isa auto|c|avx2|avx512 (td_engine_opts.isa: 0 = the best the CPU has) */
    int deltanet_chunk;        /* td_engine_opts.deltanet_chunk */
    bool enforce_eager;        /* td_engine_opts.enforce_eager (--enforce-eager) */
    bool batch_invariant;      /* td_engine_opts.batch_invariant (--batch-invariant) */
    bool mmap_weights;         /* td_engine_opts.mmap_weights (--mmap) */
    const char *backend;       /* td_engine_opts.backend (NULL: $TANDEM_BACKEND, else cpu) */
    uint64_t kv_cache_memory;  /* bytes; 0 = from the budget */
    uint64_t memory_budget;    /* bytes; 0 = auto */
    double mem_util;           /* default 0.9 */
    bool prefix_caching;       /* default on */
    const char *generation_config; /* auto (the model's generation_config.json), none/vllm, or a folder */
    char sampling_source[4300];    /* where the sampling defaults came from, for the start-up line */
} common_opts;

void td_common_opts_init(common_opts *o);
/* Consumes argv[*i] (and its value) if it is a common option: returns 1 if
 * consumed, 0 if not ours, -1 on a bad value (message printed). */
int td_common_opts_parse(common_opts *o, int argc, char **argv, int *i);
const char *td_common_opts_help(void);
/* run / serve: the sampling defaults before the flags are parsed. Pre-scans
 * argv for -m and --generation-config, starts from vLLM's neutral defaults
 * (temperature 1, top_p 1, top_k off) and applies the model's
 * generation_config.json over them unless --generation-config none; sets
 * *max_new_tokens when the file has max_new_tokens. Returns 0, or prints one
 * line and returns 1 when the file is bad. Flags parsed afterwards win. */
int td_cli_generation_defaults(common_opts *o, int argc, char **argv, int *max_new_tokens);
/* The start-up line: "PREFIX: sampling defaults: temperature 0.6, ... (from ...)". */
void td_cli_print_sampling(const char *prefix, const common_opts *o);
/* Parses "123", "32k", "1M" (k = 1024). Returns -1 when invalid. */
long td_parse_size_suffix(const char *s);
#endif
