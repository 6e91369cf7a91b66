/* `tandem bench` (issue 8): speculative-decoding throughput per task and
 * depth, measured so that its usual mistakes show.
 *
 * The pieces, one concern per file:
 *   stats.c   median/min/max, the interleaved run order, aggregation of
 *             samples into cells, the sanity flags, the speedup model
 *   report.c  markdown (stdout), CSV and SVG writers
 *   prompts.c the prompt suite (bench/prompts/TASK/NAME.txt or .json)
 *   local.c   in-process runner on one warm engine; verify/draft cost timer
 *   http.c    a tiny blocking HTTP/1.1 client (SSE streaming)
 *   remote.c  the same suite against an OpenAI-compatible server, /metrics
 *   trace.c   agent-trace replay (in-process and against a server)
 *   memory.c  --memory: the planner's numbers next to measured memory
 *
 * Everything here is plain data and pure functions except the runners and
 * the writers; tests/c/test_bench.c tests the pure parts. */
#ifndef TANDEM_BENCH_BENCH_H
#define TANDEM_BENCH_BENCH_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "tandem.h"

#define BENCH_MAX_DEPTHS (TD_MAX_SPEC_DEPTH + 1)
#define BENCH_MAX_TASKS 8
#define BENCH_NAME 64
/* `auto` in a depth list (--spec-depth auto, spec/autodepth.h): sorts after every fixed depth */
#define BENCH_DEPTH_AUTO 1000

/* ---- statistics --------------------------------------------------------- */

typedef struct bench_stat {
    double median, min, max;
    int n;
} bench_stat;

/* Median (mean of the two middle values for even n), min and max of n
 * values; all zero with n = 0. Does not modify v. */
bench_stat td_bench_stat_of(const double *v, int n);
/* (max - min) / median; 0 when the median is 0. */
double td_bench_spread(const bench_stat *s);

/* ---- the run order -------------------------------------------------------- */

typedef struct bench_slot {
    int run, task, prompt, depth_idx;
} bench_slot;

/* Number of slots: runs x (sum of prompts over tasks) x depths. */
int td_bench_order_len(int n_runs, int n_tasks, const int *n_prompts, int n_depths);
/* Fills out (td_bench_order_len entries): for each run, for each task, for
 * each prompt, every depth in turn; the depth order is reversed on odd
 * runs (A B C, C B A, ...), so a slow drift in machine speed lands on every
 * depth alike, within seconds of each other rather than one depth per
 * minute. */
void td_bench_order(int n_runs, int n_tasks, const int *n_prompts, int n_depths, bench_slot *out);

/* ---- samples: one request each --------------------------------------------- */

/* What a measurement depended on. Samples of one report are comparable only
 * when these agree (load average aside, which is compared loosely). */
typedef struct bench_conditions {
    int threads;           /* engine threads (0 = unknown, e.g. a server) */
    int max_tokens;
    double temperature;
    int engine_depth;      /* the engine's checkpoint depth / the server's configured depth (-1 unknown) */
    bool ignore_eos;
    char backend[128];     /* "in-process" or the server URL */
    double load1;          /* 1-minute load average when the request started */
} bench_conditions;

typedef struct bench_sample {
    int run, task, prompt, depth;   /* depth value, not index */
    int n_prompt, n_reused, n_generated;
    double prefill_s;               /* prompt processing (request start .. first token) */
    double decode_s;                /* first token .. last token */
    double ttft_s;                  /* request start .. first token seen by the client */
    td_spec_counters spec;
    bench_conditions cond;
} bench_sample;

/* ---- cells: one (task, depth) over every run -------------------------------- */

typedef struct bench_cell {
    int task, depth;
    int n_samples;
    bench_stat tps;          /* decode tokens/s, one value per run: sum(gen - 1) / sum(decode_s) */
    bench_stat prefill_tps;  /* per run: sum(prompt - reused) / sum(prefill_s) */
    bench_stat ttft;         /* seconds, one value per request */
    td_spec_counters spec;   /* summed over every sample */
    uint64_t generated;      /* tokens */
    double speedup;          /* tps.median / depth-0 tps.median of the task; 0 when no baseline */
    double predicted;        /* the model's speedup; 0 when not computed */
} bench_cell;

/* Acceptance measures of summed counters (0 when there were no drafts). */
double td_bench_accept_rate(const td_spec_counters *s);          /* accepted / draft tokens */
double td_bench_accept_pos(const td_spec_counters *s, int i);    /* P(accepted >= i+1) = per_pos[i] / drafts */
double td_bench_mean_accept_len(const td_spec_counters *s);      /* 1 + accepted / drafts */

typedef struct bench_suite {
    int n_tasks;
    char tasks[BENCH_MAX_TASKS][BENCH_NAME];
    int n_depths;
    int depths[BENCH_MAX_DEPTHS];
    int n_runs;
} bench_suite;

/* Aggregates samples into n_tasks x n_depths cells (cells[t * n_depths + d]),
 * with speedups against depth 0 when the suite has it. */
void td_bench_cells(const bench_suite *su, const bench_sample *samples, int n, bench_cell *cells);

/* ---- the model of the result ---------------------------------------------- */

/* Verify and draft cost in units of one target decode step. */
typedef struct bench_costs {
    int max_n;                              /* verify[n] known for n = 1..max_n */
    double verify[BENCH_MAX_DEPTHS + 1];    /* t(n) / t(1) */
    double t1_s;                            /* t(1): one target step, seconds */
    double verify_s[BENCH_MAX_DEPTHS + 1];  /* t(n), seconds (median) */
    double draft;                           /* MTP step / target step */
    double draft_s;                         /* MTP step, seconds */
    int context;                            /* tokens in the session when timed */
} bench_costs;

/* E[tokens per step] = 1 + sum_{i=1..k} P(accepted >= i), the P's given
 * as p_ge[0..k-1]. */
double td_bench_expected_tokens(const double *p_ge, int k);
/* E / (verify(k+1) + k * draft): predicted speedup over depth 0 at depth k.
 * 0 when the costs do not cover k+1 tokens. */
double td_bench_predict_speedup(const double *p_ge, int k, const bench_costs *c);
/* Fills cells[].predicted from each cell's own per-position acceptance. */
void td_bench_predict_cells(const bench_suite *su, bench_cell *cells, const bench_costs *c);

/* ---- sanity flags ------------------------------------------------------------ */

typedef enum {
    BENCH_FLAG_IMPOSSIBLE = 1,  /* depth-k speedup above k + 1 */
    BENCH_FLAG_SPREAD,          /* (max - min) / median above the limit */
    BENCH_FLAG_BASELINE,        /* depth-0 samples under other conditions than the rest */
    BENCH_FLAG_NO_BASELINE,     /* no depth 0 in the suite: speedups unknown */
    BENCH_FLAG_WORKLOAD,        /* greedy, yet depth 0 generated other token counts (lossless?) */
    BENCH_FLAG_CACHE,           /* prompt tokens came from a prefix cache: prefill and TTFT are not cold */
} bench_flag_kind;

typedef struct bench_flag {
    bench_flag_kind kind;
    int task, depth;            /* -1 when not about one cell */
    double value;
    char text[320];
} bench_flag;

#define BENCH_SPREAD_LIMIT 0.10
#define BENCH_LOAD_LIMIT 0.25   /* relative difference of median load averages */

/* Writes up to max flags; returns how many there are (may exceed max). */
int td_bench_sanity(const bench_suite *su, const bench_cell *cells, const bench_sample *samples, int n_samples,
                 bench_flag *out, int max);

/* ---- writers ------------------------------------------------------------------- */

typedef struct bench_report {
    const bench_suite *su;
    const bench_cell *cells;       /* n_tasks x n_depths */
    const bench_sample *samples;
    int n_samples;
    const bench_costs *costs;      /* NULL when not measured (server) */
    const bench_flag *flags;
    int n_flags;
    const char *title;             /* model and backend, one line */
    const char *machine;           /* one line, may be NULL */
} bench_report;

void td_bench_write_markdown(FILE *f, const bench_report *r);
/* One row per request, every field and condition; the first line is the header. */
int td_bench_write_samples_csv(FILE *f, const bench_suite *su, const bench_sample *s, int n);
/* One row per cell. */
int td_bench_write_cells_csv(FILE *f, const bench_suite *su, const bench_cell *cells);
/* tokens/s (median, min-max whiskers) against depth, one line per task. */
int td_bench_write_svg(FILE *f, const bench_suite *su, const bench_cell *cells, const char *title);

/* Writes str escaped for CSV (quoted when it holds , " or a newline). */
void td_bench_csv_field(FILE *f, const char *str);

#endif
