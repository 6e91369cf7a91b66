/* Memory plan at start-up (CPU): weights + activations + DeltaNet state +
 * the paged KV pool must fit the budget; refuse before loading otherwise,
 * saying what would fit. */
#ifndef TANDEM_CLI_MEMORY_H
#define TANDEM_CLI_MEMORY_H
#include <stdint.h>
#include <stdio.h>
#include "cli/opts.h"

/* MemTotal of /proc/meminfo in bytes (0 when unreadable): the RAM the CPU budget is a fraction of. */
uint64_t td_cli_mem_total(void);
/* The engine's draft depth for this command line: --spec-depth N, or with
 * auto --spec-depth-max when the model has an MTP head and 0 when not. */
int td_cli_engine_spec_depth(const common_opts *o);
/* On a CUDA engine: one line on its matmul mode (td_backend_cuda_mode).
 * Nothing on other backends. */
void td_cli_print_cuda_mode(FILE *log, const char *who, td_engine *eng);
/* Fills eo (threads, context, depth, KV size/dtype, prefix caching) for
 * max_seqs concurrent sequences and batch_tokens prefill tokens a step,
 * from the planner's CPU mode (src/plan). Returns 0 when it fits (a one-line summary
 * of the KV cache goes to `summary`, for the caller to log once the model
 * has loaded), 1 when one request of max_model_len does not (the refusal,
 * one line, is written to log), 2 on a bad model directory (one line). */
int td_cli_engine_opts(const common_opts *o, int max_seqs, int batch_tokens, td_engine_opts *eo, FILE *log, char *summary, size_t cap_summary);
#endif
