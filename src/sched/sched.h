/* Request scheduler: a bounded queue and one engine thread that runs every
 * admitted request. Used by `tandem serve` and `tandem bench`.
 *
 * Threading: td_sched_submit / td_sched_cancel / td_sched_stats may be called
 * from any thread. Callbacks run on the scheduler thread (its lock not held)
 * and must not block for long; they must not call back into the scheduler
 * except td_sched_cancel and td_sched_submit (the server submits the other
 * samples of an n > 1 request from the first one's first token). on_done is the last call for a request: after it the
 * scheduler never touches `user` again. */
#ifndef TANDEM_SCHED_H
#define TANDEM_SCHED_H
#include <stdbool.h>
#include <stdint.h>
#include "tandem.h"

typedef struct td_sched td_sched;

typedef struct td_sched_opts {
    int max_num_seqs;      /* requests running at once (default 8) */
    int max_queue;         /* waiting requests before submit refuses (default 64) */
    int max_batch_tokens;  /* tokens per engine step, for chunked prefill (default 512) */
    bool prefix_caching;   /* reuse state of earlier requests sharing a prefix (default on) */
    /* One line per notable event (a preemption, a failed step), from the
     * scheduler thread; NULL = silent. */
    void (*on_log)(void *user, const char *line);
    void *log_user;
    /* Test hook (fault injection; -1 = off): a step that holds a request whose
     * prompt contains this token id fails, as an engine error would. */
    int32_t debug_fail_token;
} td_sched_opts;
void td_sched_opts_default(td_sched_opts *o);

#define TD_MAX_TOP_LOGPROBS 20

typedef struct td_token_event {
    int32_t token;
    float logprob;               /* log-probability under the model (raw logits) */
    int n_top;                   /* top alternatives, when requested */
    int32_t top_ids[TD_MAX_TOP_LOGPROBS];
    float top_logprobs[TD_MAX_TOP_LOGPROBS];
} td_token_event;

typedef struct td_request {
    const int32_t *prompt;       /* copied at submit */
    int n_prompt;
    td_sampling sampling;
    td_gen_opts gen;             /* stop_ids copied at submit */
    int top_logprobs;            /* -1: no logprobs; 0..20: logprob and that many alternatives */
    /* Returns 0 to go on, 1 to stop (finish STOP: e.g. a stop string
     * matched), 2 to cancel. */
    int (*on_token)(void *user, const td_token_event *ev);
    /* Last call. error is NULL on success (message owned by the scheduler,
     * valid during the call). */
    void (*on_done)(void *user, const td_gen_result *res, const char *error);
    void *user;
} td_request;

#define TD_ITER_NB 12
extern const int td_iter_token_bounds[TD_ITER_NB];

typedef struct td_sched_stats {
    int running, waiting;
    uint64_t preemptions;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t prefix_cache_queries, prefix_cache_hits; /* tokens */
    uint64_t requests_finished;
    double kv_cache_usage;       /* 0..1 */
    int kv_blocks, kv_free_blocks, kv_checkpoint_blocks; /* pool; free + cached; checkpoint tails */
    size_t prefix_checkpoint_bytes; /* DeltaNet states etc. held by prefix-cache checkpoints (bounded by their count) */
    td_spec_counters spec;
    /* tokens per engine step (prefilled + generated), per bucket of
     * td_iter_token_bounds (vLLM's eager buckets); [TD_ITER_NB] = above */
    uint64_t iter_tokens[TD_ITER_NB + 1];
    uint64_t iter_tokens_sum;
} td_sched_stats;

/* Starts the scheduler thread on eng (borrowed; must outlive the scheduler). */
int td_sched_new(td_engine *eng, const td_sched_opts *opts, td_sched **out, td_err *err);
/* Cancels everything (on_done is called for each), stops the thread, frees. */
void td_sched_free(td_sched *s);
/* Queues a request. TD_ERR_LIMIT only when the queue is full; TD_ERR_ARG
 * for a bad request (e.g. a prompt longer than the context: the message
 * says "request (M tokens) exceeds the available context size (N tokens)"). */
int td_sched_submit(td_sched *s, const td_request *req, uint64_t *id, td_err *err);
/* Cancels a queued or running request at the next step; its on_done runs
 * with finish = TD_FINISH_CANCEL. Unknown ids are ignored. */
void td_sched_cancel(td_sched *s, uint64_t id);
void td_sched_get_stats(td_sched *s, td_sched_stats *out);
#endif
