/* The measuring side of `tandem bench`: prompts, the in-process runner,
 * the HTTP client and server runner, agent-trace replay, memory. */
#ifndef TANDEM_BENCH_RUNNER_H
#define TANDEM_BENCH_RUNNER_H
#include <jansson.h>
#include <stddef.h>
#include "bench/bench.h"
#include "tokenizer/tokenizer.h"

/* ---- prompts (prompts.c) ------------------------------------------------------ */

/* One prompt file: DIR/<task>/<name>.txt (the user message) or .json
 * ({"messages": [...]} or a bare messages array). */
typedef struct bench_prompt {
    char name[BENCH_NAME];
    json_t *messages;
} bench_prompt;

typedef struct bench_prompts {
    int n[BENCH_MAX_TASKS];
    bench_prompt *p[BENCH_MAX_TASKS];
} bench_prompts;

/* Loads every prompt of each task, sorted by file name; a task without
 * prompts is an error. */
int td_bench_prompts_load(const char *dir, const bench_suite *su, bench_prompts *out, td_err *err);
void td_bench_prompts_free(bench_prompts *p);

/* The model's chat template, rendered as the server renders it: thinking
 * off, generation prompt added, tool-call arguments given as JSON strings
 * turned into objects. */
typedef struct bench_chat {
    const tokenizer *tok;
    void *tpl;
} bench_chat;
int td_bench_chat_init(bench_chat *c, const tokenizer *tok, td_err *err);
void td_bench_chat_free(bench_chat *c);
int td_bench_chat_encode(bench_chat *c, const json_t *messages, const json_t *tools, int32_t **ids, size_t *n, td_err *err);

/* ---- what every request asks for ----------------------------------------------- */

typedef struct bench_params {
    int max_tokens;
    td_sampling sampling;       /* temperature etc. */
    bool ignore_eos;
    bool draft_sampling;
} bench_params;

/* 1-minute load average, or -1. */
double td_bench_load1(void);
double td_bench_now(void);         /* monotonic seconds */

/* ---- in-process (local.c) -------------------------------------------------------- */

typedef struct bench_local {
    td_engine *eng;
    tokenizer *tok;
    bench_chat chat;
    td_session *s;
    int threads, engine_depth;
    int auto_max;               /* the largest depth `auto` picks (BENCH_DEPTH_AUTO) */
    bool prefix_caching;
    int32_t stop[TD_MAX_SPEC_DEPTH];
    int n_stop;
} bench_local;

/* prefix_caching: keep the engine's prefix cache on (agent traces); the
 * suite turns it off so every request's prefill is cold. */
int td_bench_local_open(const char *dir, int threads, int max_context, int engine_depth, bool prefix_caching, int quantize, int precision, int isa, bool mmap_weights, bench_local *out,
                     td_err *err);
void td_bench_local_close(bench_local *L);
/* One request from a fresh session state (no prefix reuse). */
int td_bench_local_run(bench_local *L, const int32_t *ids, int n, int depth, const bench_params *p, bench_sample *out, td_err *err);
/* Same, but keeps the session's state: the prefix of earlier turns is reused. */
int td_bench_local_turn(bench_local *L, const int32_t *ids, int n, int depth, const bench_params *p, bench_sample *out, td_err *err);
/* Times a target forward of n = 1..max_n tokens (as verify runs it) and one
 * MTP step after prefilling ctx; reps repeats each, median. */
int td_bench_local_costs(bench_local *L, const int32_t *ctx, int n_ctx, int max_n, int reps, bench_costs *out, td_err *err);
/* Bytes one sequence of `tokens` positions needs on this engine: its KV
 * blocks (attention and MTP layers, at the engine's KV dtype), DeltaNet
 * state and its verify checkpoints (allocated for the engine's depth). */
uint64_t td_bench_local_session_bytes(const bench_local *L, int tokens);

/* ---- HTTP (http.c) ---------------------------------------------------------------- */

typedef struct bench_url {
    char host[256], port[16], path[512]; /* path: the base path without a trailing '/' */
} bench_url;

int td_bench_url_parse(const char *url, bench_url *u, td_err *err);
/* Called with body bytes as they arrive (chunked encoding removed); return
 * non-zero to stop reading. */
typedef int (*bench_http_fn)(void *user, const char *data, size_t n);
/* One request over a fresh connection (Connection: close). path is appended
 * to the URL's base path. extra_headers: "Name: value\r\n" lines or NULL. */
int td_bench_http(const bench_url *u, const char *method, const char *path, const char *extra_headers, const char *body,
               size_t body_len, double timeout_s, int *status, bench_http_fn fn, void *user, td_err *err);
/* GET/POST collecting the body (malloc'd, NUL-terminated). */
int td_bench_http_fetch(const bench_url *u, const char *method, const char *path, const char *extra_headers, const char *body,
                     double timeout_s, int *status, char **out, size_t *len, td_err *err);

/* ---- server (remote.c) ------------------------------------------------------------ */

typedef struct bench_metrics {
    td_spec_counters spec;
    double prefix_queries, prefix_hits, prompt_tokens, generation_tokens;
    int depth;                  /* tandem_spec_decode_depth, -1 when absent */
    bool have_spec;
} bench_metrics;

/* Parses Prometheus text: vllm:spec_decode_* (with or without _total, summed
 * over label sets), prefix-cache and token counters, tandem's depth gauge. */
void td_bench_metrics_parse(const char *text, bench_metrics *m);

typedef struct bench_remote {
    bench_url url;
    char model[256];
    char auth[320];             /* "Authorization: Bearer ...\r\n" or "" */
    bool metrics_ok;
    int depth;                  /* server's depth from /metrics, -1 unknown */
} bench_remote;

int td_bench_remote_open(const char *url, const char *api_key, const char *model, bench_remote *out, td_err *err);
/* One streamed chat completion; spec counters are the /metrics deltas. */
int td_bench_remote_run(bench_remote *R, const json_t *messages, const json_t *tools, const bench_params *p, bench_sample *out,
                     td_err *err);

/* ---- agent trace (trace.c) -------------------------------------------------------------- */

typedef struct bench_trace_opts {
    const char *file;
    bench_params params;        /* max_tokens: used when a turn has none */
    int depth;
    bool respect_turn_max_tokens;
} bench_trace_opts;

/* Replays the trace on L (in-process) or R (server) and prints the report
 * (markdown to md, one row per turn to csv when not NULL). chat (may be
 * NULL with R) tokenizes each turn locally to measure the prefix the turn
 * shares with the previous one: what a prefix cache could reuse at most. */
int td_bench_trace_run(const bench_trace_opts *o, bench_local *L, bench_remote *R, bench_chat *chat, FILE *md, FILE *csv,
                    td_err *err);

/* ---- merge (merge.c) ---------------------------------------------------------------------- */

/* Appends the rows of an earlier samples.csv (*samples is realloc'd) whose
 * task is in the suite; their depths join the suite, runs keep their
 * numbers, conditions are as recorded. */
int td_bench_merge_csv(const char *path, bench_suite *su, bench_sample **samples, int *n, td_err *err);

/* ---- memory (memory.c) --------------------------------------------------------------------- */

/* Peak and current resident set (bytes) from /proc/self/status; 0 when unknown. */
uint64_t td_bench_vm_hwm(void);
uint64_t td_bench_vm_rss(void);
/* For each depth: the planner's numbers for the model at `window` tokens,
 * and the measured: session bytes, max RSS after a request at that depth
 * (rss_after[d], may be 0) and the process peak. */
int td_bench_memory_report(FILE *f, const char *model_dir, const bench_suite *su, int window, uint64_t session_bytes,
                        const td_kv_info *kv, const uint64_t *rss_after, td_err *err);

#endif
