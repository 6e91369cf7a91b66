/* Step-wise generation: one td_gen per request; td_gen_step advances many
 * requests with ONE batched MTP pass per draft depth and ONE batched target
 * forward (prefill chunks, verify runs and plain decode rows together).
 * td_session_generate (single request) and the scheduler (many) both run
 * through td_gen_step, so they share one code path. */
#ifndef TANDEM_SPEC_GEN_H
#define TANDEM_SPEC_GEN_H
#include <stdbool.h>
#include "tandem.h"

typedef struct td_gen td_gen;

/* Called for each generated token with the target's logits row that
 * produced it (vocab floats, valid during the call). Returns 0 to go on,
 * 1 to stop (TD_FINISH_STOP), 2 to cancel. */
typedef int (*td_gen_emit_fn)(void *user, int32_t token, const float *logits);

/* Prepares a request on session s (borrowed until td_gen_end). Reuses the
 * session's state when it holds a strict prefix of the prompt. */
int td_gen_begin(td_session *s, const int32_t *prompt, int n_prompt, const td_sampling *sampling, const td_gen_opts *opts,
                 td_gen_emit_fn emit, void *user, td_gen **out, td_err *err);
bool td_gen_done(const td_gen *g);
const td_gen_result *td_gen_result_of(const td_gen *g);
/* Prompt tokens still to prefill (0 once decoding). */
int td_gen_prefill_left(const td_gen *g);
void td_gen_cancel(td_gen *g);
/* KV is allocated on demand: before each td_gen_step, the KV slots the next
 * step may write (its prefill chunk under prefill_budget, or x plus the
 * drafts and the MTP slot) are reserved. TD_ERR_LIMIT when the pool cannot
 * hold them: then nothing was allocated or evicted (the caller preempts a
 * request and tries again). */
int td_gen_reserve_step(td_gen *g, int prefill_budget, td_err *err);
/* Preemption by recompute: the request's state goes to the prefix cache
 * (checkpoint) and its blocks back to the pool; its prompt becomes the prompt
 * plus every token emitted so far, to be prefilled again by td_gen_resume
 * (which reuses what the prefix cache still holds). Sampler, counters and
 * emitted tokens are kept, so the continuation is the one it would have been
 * (greedy: identical). */
int td_gen_preempt(td_gen *g, td_err *err);
/* Restarts a preempted request's prefill; TD_ERR_LIMIT (holding nothing)
 * when the pool cannot take its first chunk yet. */
int td_gen_resume(td_gen *g, td_err *err);
/* The request's draft depth (0 without an MTP head). */
int td_gen_depth(const td_gen *g);
/* Adds the request's counters to the engine totals and frees it. */
void td_gen_end(td_gen *g);
/* One batched step over the unfinished gens (all on the same engine).
 * Prefill chunks share `prefill_budget` tokens. On error every gen in the
 * batch is left in an undefined state and must be ended. */
int td_gen_step(td_gen **gens, int n, int prefill_budget, td_err *err);

/* Bytes of a session's generation buffers at depth k (pend_cap pending
 * hidden rows): what td_gen_begin allocates, and what the planner counts. */
struct td_config;
size_t td_gen_work_bytes_for(const struct td_config *c, int k, int pend_cap, int max_chunk);
#endif
