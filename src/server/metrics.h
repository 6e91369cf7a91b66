/* Prometheus metrics of the server: vLLM's names (reference notes §5;
 * counters get the _total suffix) from the scheduler's counters, the
 * latency histograms measured here, and tandem_* of our own. */
#ifndef TANDEM_SERVER_METRICS_H
#define TANDEM_SERVER_METRICS_H
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "sched/sched.h"
#include "server/sbuf.h"

#define HIST_MAX_BUCKETS 32

typedef struct srv_hist {
    const double *bounds;
    int nb;
    uint64_t counts[HIST_MAX_BUCKETS]; /* per bucket, not cumulative */
    uint64_t n;
    double sum;
} srv_hist;

typedef enum {
    M_TTFT, M_ITL, M_E2E,
    /* per finished request, as vLLM's request_*_time_seconds and request_*_tokens */
    M_QUEUE, M_PREFILL, M_DECODE, M_INFER, M_PROMPT_TOKENS, M_GEN_TOKENS,
    M_NHIST
} srv_hist_id;
typedef enum { F_STOP, F_LENGTH, F_ABORT, F_ERROR, F_NFINISH } srv_finish_id;

#define SRV_N_CODES 10

typedef struct srv_metrics {
    pthread_mutex_t mu;
    srv_hist hist[M_NHIST];
    uint64_t http[SRV_N_CODES + 1];  /* per status code; last = other */
    uint64_t finished[F_NFINISH];
    uint64_t cancelled_disconnect;   /* clients gone before the end */
    uint64_t rejected_queue_full;
    uint64_t tool_calls;
    uint64_t stream_requests, requests;
} srv_metrics;

int td_metrics_init(srv_metrics *m);
void td_metrics_destroy(srv_metrics *m);
void td_metrics_observe(srv_metrics *m, srv_hist_id h, double seconds);
void td_metrics_http(srv_metrics *m, int status);
void td_metrics_add(srv_metrics *m, uint64_t *counter, uint64_t n); /* counter inside m */
/* A request that ran finished: queue (arrival to admission), prefill,
 * decode and inference times, its prompt and generated token counts. */
void td_metrics_request_done(srv_metrics *m, double e2e_s, int n_prompt, const td_gen_result *res);

typedef struct metrics_ctx {
    const char *model_name;
    bool loaded;
    bool have_stats;          /* st is valid */
    const struct td_sched_stats *st;
    int spec_depth;           /* server default (the maximum with spec_auto) */
    bool spec_auto;           /* --spec-depth auto */
    int max_num_seqs, max_queue, n_ctx;
    double uptime_s;
} metrics_ctx;

/* Prometheus text format (version 0.0.4). Returns 0 or -1 (out of memory). */
int td_metrics_render(srv_metrics *m, const metrics_ctx *c, sbuf *out);
#endif
