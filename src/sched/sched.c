/* Scheduler: continuous batching over td_gen_step. New requests join
 * between steps; prefill is chunked under a token budget so a long prompt
 * does not stall the others; each request drafts at its own depth inside
 * the shared verify batch. Earlier requests' state is reused through the
 * engine's exact prefix cache (kv/kv.h). */
#include "sched/sched.h"
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "spec/gen.h"
#include "util/err.h"

typedef struct req {
    uint64_t id;
    td_request r;          /* prompt and stop_ids owned copies */
    int32_t *prompt, *stop_ids;
    td_logit_bias *bias;   /* owned copy of r.sampling.logit_bias */
    bool cancel;           /* guarded by the scheduler mutex */
    bool poison;           /* test hook: the prompt holds opts.debug_fail_token */
    bool suspect;          /* in a batch whose step failed: runs alone until it passes */
    td_gen *g;             /* NULL until admitted; kept while preempted */
    int sess;
    char error[sizeof(((td_err *)0)->msg)];
    struct req *next;
    td_sched *owner;
} req;

struct td_sched {
    td_engine *eng;
    td_sched_opts o;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, started;
    req *wait_head, *wait_tail;
    int n_waiting;
    req **running;
    int n_running;
    td_session **sessions;
    bool *sess_busy;
    uint64_t *sess_used;
    int n_sessions, max_sessions;
    uint64_t next_id, tick;
    int blocked_avail;     /* blocks available when the queue head was refused (-1: not blocked) */
    td_sched_stats st;     /* guarded by mu */
};

const int td_iter_token_bounds[TD_ITER_NB] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};

void td_sched_opts_default(td_sched_opts *o) {
    o->max_num_seqs = 8;
    o->max_queue = 64;
    o->max_batch_tokens = 512;
    o->prefix_caching = true;
    o->on_log = NULL;
    o->log_user = NULL;
    o->debug_fail_token = -1;
}

static void free_req(req *q) {
    if (!q) return;
    free(q->prompt);
    free(q->stop_ids);
    free(q->bias);
    free(q);
}

/* log-probability of tokens under a logits row, plus the top alternatives. */
static void fill_logprobs(const float *row, int V, int32_t tok, int n_top, td_token_event *ev) {
    float mx = row[0];
    for (int i = 1; i < V; i++) if (row[i] > mx) mx = row[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    float lse = mx + (float)log(sum);
    ev->logprob = row[tok] - lse;
    if (n_top > TD_MAX_TOP_LOGPROBS) n_top = TD_MAX_TOP_LOGPROBS;
    if (n_top > V) n_top = V;
    ev->n_top = 0;
    for (int i = 0; i < V; i++) { /* insertion into a small sorted list */
        float v = row[i];
        int n = ev->n_top;
        if (n == n_top && (n == 0 || v <= ev->top_logprobs[n - 1])) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && ev->top_logprobs[j - 1] < v) {
            ev->top_logprobs[j] = ev->top_logprobs[j - 1];
            ev->top_ids[j] = ev->top_ids[j - 1];
            j--;
        }
        ev->top_logprobs[j] = v;
        ev->top_ids[j] = i;
        ev->n_top = n;
    }
    for (int i = 0; i < ev->n_top; i++) ev->top_logprobs[i] -= lse;
}

static int on_emit(void *user, int32_t tok, const float *row) {
    req *q = user;
    td_token_event ev;
    memset(&ev, 0, sizeof ev);
    ev.token = tok;
    if (q->r.top_logprobs >= 0 && row) fill_logprobs(row, td_engine_cfg(q->owner->eng)->vocab_size, tok, q->r.top_logprobs, &ev);
    int r = q->r.on_token ? q->r.on_token(q->r.user, &ev) : 0;
    pthread_mutex_lock(&q->owner->mu);
    if (q->cancel) r = 2;
    pthread_mutex_unlock(&q->owner->mu);
    return r;
}

/* Picks an idle session (mu held): the least recently used, or a new one.
 * Sessions hold no blocks while idle (reset after each request); reuse of
 * earlier requests' state comes from the engine's prefix cache. */
static int pick_session(td_sched *s, td_err *err) {
    int best = -1;
    for (int i = 0; i < s->n_sessions; i++)
        if (!s->sess_busy[i] && (best < 0 || s->sess_used[i] < s->sess_used[best])) best = i;
    if (best >= 0) return best;
    if (s->n_sessions < s->max_sessions) {
        int rc = td_session_new(s->eng, &s->sessions[s->n_sessions], err);
        if (rc) return rc;
        s->sess_busy[s->n_sessions] = false;
        s->sess_used[s->n_sessions] = 0;
        return s->n_sessions++;
    }
    return TD_FAIL(err, TD_ERR_INTERNAL, "no idle session");
}

/* Whether pick_session would find or make a session (mu held). */
static bool session_free(const td_sched *s) {
    if (s->n_sessions < s->max_sessions) return true;
    for (int i = 0; i < s->n_sessions; i++)
        if (!s->sess_busy[i]) return true;
    return false;
}

static void finish_req(td_sched *s, req *q, const char *error) {
    td_gen_result res;
    memset(&res, 0, sizeof res);
    if (q->g) res = *td_gen_result_of(q->g);
    if (!q->g && !error) res.finish = TD_FINISH_CANCEL;
    /* checkpoint into the prefix cache, then give the blocks back */
    td_gen_end(q->g);
    q->g = NULL;
    if (q->sess >= 0) td_session_reset(s->sessions[q->sess]);
    pthread_mutex_lock(&s->mu);
    s->st.requests_finished++;
    s->st.prompt_tokens += (uint64_t)res.n_prompt;
    s->st.generation_tokens += (uint64_t)res.n_generated;
    if (res.n_prompt) {
        s->st.prefix_cache_queries += (uint64_t)res.n_prompt;
        s->st.prefix_cache_hits += (uint64_t)res.n_reused;
        td_spec_counters_add(&s->st.spec, &res.spec);
    }
    if (q->sess >= 0) {
        s->sess_busy[q->sess] = false;
        s->sess_used[q->sess] = ++s->tick;
    }
    pthread_mutex_unlock(&s->mu);
    if (q->r.on_done) q->r.on_done(q->r.user, &res, error);
    free_req(q);
}

static void sched_log(td_sched *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sched_log(td_sched *s, const char *fmt, ...) {
    if (!s->o.on_log) return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    s->o.on_log(s->o.log_user, buf);
}

/* Blocks a new allocation could take: free, cached, and checkpoint tails. */
static int kv_available(td_sched *s) {
    td_kv_info ki;
    td_engine_kv_info(s->eng, &ki);
    return ki.free_blocks + ki.checkpoint_blocks;
}

/* Queues q (mu held) in arrival order: preempted requests are older than
 * every request that never ran, so FCFS puts them back at the front. */
static void queue_in_order(td_sched *s, req *q) {
    req **pp = &s->wait_head;
    while (*pp && (*pp)->id < q->id) pp = &(*pp)->next;
    q->next = *pp;
    *pp = q;
    if (!q->next) s->wait_tail = q;
    s->n_waiting++;
}

/* Removes running[i] keeping arrival order (mu held). */
static void remove_running(td_sched *s, int i) {
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

/* Preempts running[i] (mu held): recompute, back to the queue. */
static void preempt_running(td_sched *s, int i, const char *why) {
    req *q = s->running[i];
    td_err err = {0};
    remove_running(s, i);
    if (td_gen_preempt(q->g, &err) != 0) { /* out of memory for its token list: it cannot be resumed */
        td_gen_cancel(q->g);
        snprintf(q->error, sizeof q->error, "preemption failed: %s", td_err_text(&err));
    }
    queue_in_order(s, q);
    s->st.preemptions++;
    sched_log(s, "preempted request %llu (%s); %llu preemptions so far", (unsigned long long)q->id, why,
              (unsigned long long)s->st.preemptions);
}

static void *loop(void *arg) {
    td_sched *s = arg;
    td_gen **gens = calloc((size_t)s->o.max_num_seqs, sizeof *gens);
    req **batch = calloc((size_t)s->o.max_num_seqs, sizeof *batch);
    if (!gens || !batch) abort(); /* allocated before the thread could report anything */
    s->blocked_avail = -1;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->n_running == 0 && s->n_waiting == 0) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop) { pthread_mutex_unlock(&s->mu); break; }
        /* admit, in arrival order; a refused head waits until blocks come back
         * (not retried every step: each try would match the prefix cache and
         * adopt a DeltaNet state for nothing) */
        req *failed = NULL;
        if (s->blocked_avail >= 0 && (s->n_running == 0 || kv_available(s) > s->blocked_avail)) s->blocked_avail = -1;
        while (s->n_running < s->o.max_num_seqs && s->wait_head && s->blocked_avail < 0) {
            req *q = s->wait_head;
            s->wait_head = q->next;
            if (!s->wait_head) s->wait_tail = NULL;
            s->n_waiting--;
            q->next = NULL;
            td_err err = {0};
            int brc = 0;
            if (q->cancel || q->error[0]) {
                if (q->g) td_gen_cancel(q->g);
            } else if (q->g) { /* preempted earlier: prefill its prompt and output again */
                brc = td_gen_resume(q->g, &err);
            } else if (!session_free(s) && failed) {
                /* every session is held, by running requests and by requests that
                 * failed in this pass (a preempted request keeps its session while
                 * it waits, and one cancelled there gives it back only in
                 * finish_req, after this loop). Preempted requests are older than
                 * q, so none waits behind it: wait at the head for the next pass.
                 * (With nothing failed, pick_session's error stands: it would be a
                 * broken invariant, and one request's 500 beats a stuck queue.) */
                queue_in_order(s, q);
                break;
            } else {
                int si = pick_session(s, &err);
                if (si >= 0) {
                    s->sess_busy[si] = true;
                    q->sess = si;
                    q->r.gen.want_logits = q->r.top_logprobs >= 0; /* on_emit reads the row only then */
                    int slots = s->o.max_num_seqs - s->n_running - 1; /* the queue behind it that this pass admits too */
                    q->r.gen.joining = s->n_waiting < slots ? s->n_waiting : slots > 0 ? slots : 0;
                    if ((brc = td_gen_begin(s->sessions[si], q->prompt, q->r.n_prompt, &q->r.sampling, &q->r.gen, on_emit, q, &q->g, &err)))
                        q->g = NULL;
                } else {
                    brc = si;
                }
            }
            if (brc == TD_ERR_LIMIT && s->n_running > 0) {
                /* KV pool full: wait at the head of the queue for blocks */
                if (!q->g && q->sess >= 0) { s->sess_busy[q->sess] = false; q->sess = -1; }
                queue_in_order(s, q);
                s->blocked_avail = kv_available(s);
                break;
            }
            if (brc || !q->g || q->cancel || q->error[0]) {
                if (!q->cancel && !q->error[0])
                    snprintf(q->error, sizeof q->error, "%s", err.msg[0] ? td_err_text(&err) : "no session available");
                if (q->g && !td_gen_done(q->g)) td_gen_cancel(q->g);
                q->next = failed;
                failed = q;
                continue;
            }
            s->running[s->n_running++] = q; /* admitted last: the newest */
        }
        for (int i = 0; i < s->n_running; i++)
            if (s->running[i]->cancel) td_gen_cancel(s->running[i]->g);
        /* KV for this step, oldest request first; when the pool runs out the
         * newest running request is preempted (vLLM's recompute policy). */
        for (bool again = true; again;) {
            /* the budget as td_gen_step hands it out: decode rows first, then
             * prefill chunks in this (arrival) order */
            again = false;
            int budget = s->o.max_batch_tokens;
            for (int i = 0; i < s->n_running; i++) {
                td_gen *g = s->running[i]->g;
                if (!td_gen_done(g) && td_gen_prefill_left(g) == 0) budget -= td_gen_depth(g) + 1;
            }
            for (int i = 0; i < s->n_running && !again; i++) {
                req *q = s->running[i];
                if (td_gen_done(q->g)) continue;
                td_err err = {0};
                int left = td_gen_prefill_left(q->g);
                if (left && budget <= 0) continue; /* no prefill this step */
                int rc = td_gen_reserve_step(q->g, left ? budget : 0, &err);
                if (rc == 0) {
                    if (left) budget -= left < budget ? left : budget;
                } else if (rc != TD_ERR_LIMIT || s->n_running == 1) { /* alone and still no room: it cannot fit the pool */
                    snprintf(q->error, sizeof q->error, "%s", td_err_text(&err));
                    td_gen_cancel(q->g);
                } else {
                    preempt_running(s, s->n_running - 1, "KV cache full");
                    again = true; /* the budget changed: plan again */
                }
            }
        }
        /* a batch whose step failed runs again one request at a time */
        int n = 0, solo = -1;
        for (int i = 0; i < s->n_running && solo < 0; i++)
            if (s->running[i]->suspect && !td_gen_done(s->running[i]->g)) solo = i;
        for (int i = 0; i < s->n_running; i++)
            if (!td_gen_done(s->running[i]->g) && (solo < 0 || i == solo)) { batch[n] = s->running[i]; gens[n++] = s->running[i]->g; }
        s->st.running = s->n_running;
        s->st.waiting = s->n_waiting;
        pthread_mutex_unlock(&s->mu);
        while (failed) {
            req *q = failed;
            failed = q->next;
            finish_req(s, q, q->error[0] ? q->error : NULL);
        }
        td_err err = {0};
        int rc = 0;
        for (int i = 0; i < n && !rc; i++)
            if (batch[i]->poison) rc = TD_FAIL(&err, TD_ERR_INTERNAL, "injected step failure (debug_fail_token)");
        long long before = 0; /* tokens this step: prefilled + generated (vLLM's iteration tokens) */
        for (int i = 0; i < n; i++) before += td_gen_prefill_left(gens[i]) - td_gen_result_of(gens[i])->n_generated;
        if (!rc && n) rc = td_gen_step(gens, n, s->o.max_batch_tokens, &err);
        long long after = 0;
        for (int i = 0; i < n && !rc; i++) after += td_gen_prefill_left(gens[i]) - td_gen_result_of(gens[i])->n_generated;
        pthread_mutex_lock(&s->mu);
        if (!rc && n && before > after) {
            int bi = 0;
            while (bi < TD_ITER_NB && before - after > td_iter_token_bounds[bi]) bi++;
            s->st.iter_tokens[bi]++;
            s->st.iter_tokens_sum += (uint64_t)(before - after);
        }
        if (rc && n == 1) { /* alone: the error is its own */
            snprintf(batch[0]->error, sizeof batch[0]->error, "%s", td_err_text(&err));
            td_gen_cancel(batch[0]->g);
        } else if (rc) {
            /* the state of every request in the step is undefined: each restarts
             * from its tokens (recompute) and runs alone until one step passes,
             * so only the request that fails on its own gets the error */
            for (int j = 0; j < n; j++) {
                td_err e2 = {0};
                batch[j]->suspect = true;
                if (td_gen_preempt(batch[j]->g, &e2) || td_gen_resume(batch[j]->g, &e2)) {
                    for (int i = 0; i < s->n_running; i++)
                        if (s->running[i] == batch[j]) { remove_running(s, i); break; }
                    queue_in_order(s, batch[j]);
                }
            }
            sched_log(s, "a step of %d requests failed (%s): they run again one at a time", n, td_err_text(&err));
        } else if (solo >= 0 && n == 1) {
            batch[0]->suspect = false;
        }
        /* retire finished requests */
        req *done = NULL, **tail = &done;
        for (int i = 0; i < s->n_running;) {
            req *q = s->running[i];
            if (td_gen_done(q->g)) {
                remove_running(s, i);
                q->next = NULL;
                *tail = q;
                tail = &q->next;
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&s->mu);
        while (done) {
            req *q = done;
            done = q->next;
            finish_req(s, q, q->error[0] ? q->error : NULL);
        }
        /* measured after retiring, so an idle server reads 0 (blocks held by
         * running sequences; cached and checkpoint blocks are reclaimable) */
        td_kv_info ki;
        td_engine_kv_info(s->eng, &ki);
        td_memory_info mem;
        td_engine_memory(s->eng, &mem);
        pthread_mutex_lock(&s->mu);
        s->st.prefix_checkpoint_bytes = mem.prefix_checkpoints;
        s->st.kv_cache_usage = ki.n_blocks ? (double)(ki.n_blocks - ki.free_blocks - ki.checkpoint_blocks) / ki.n_blocks : 0.0;
        s->st.kv_blocks = ki.n_blocks;
        s->st.kv_free_blocks = ki.free_blocks;
        s->st.kv_checkpoint_blocks = ki.checkpoint_blocks;
        pthread_mutex_unlock(&s->mu);
    }
    /* shutdown: everything left is cancelled */
    pthread_mutex_lock(&s->mu);
    req *left = s->wait_head;
    s->wait_head = s->wait_tail = NULL;
    s->n_waiting = 0;
    int nr = s->n_running;
    s->n_running = 0;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < nr; i++) {
        td_gen_cancel(s->running[i]->g);
        finish_req(s, s->running[i], NULL);
    }
    while (left) {
        req *q = left;
        left = q->next;
        if (q->g) td_gen_cancel(q->g);
        finish_req(s, q, NULL);
    }
    free(gens);
    free(batch);
    return NULL;
}

int td_sched_new(td_engine *eng, const td_sched_opts *opts, td_sched **out, td_err *err) {
    *out = NULL;
    td_sched *s = TD_CALLOC(err, 1, sizeof *s);
    if (!s) return TD_ERR_NOMEM;
    s->eng = eng;
    td_sched_opts_default(&s->o);
    if (opts) s->o = *opts;
    if (s->o.max_num_seqs < 1 || s->o.max_num_seqs > 256 || s->o.max_queue < 0 || s->o.max_batch_tokens < 1) {
        free(s);
        return TD_FAIL(err, TD_ERR_ARG, "max_num_seqs must be 1..256, max_queue >= 0, max_batch_tokens >= 1");
    }
    s->max_sessions = s->o.max_num_seqs; /* one per running request; idle ones hold no blocks */
    s->running = TD_CALLOC(err, (size_t)s->o.max_num_seqs, sizeof *s->running);
    s->sessions = TD_CALLOC(err, (size_t)s->max_sessions, sizeof *s->sessions);
    s->sess_busy = TD_CALLOC(err, (size_t)s->max_sessions, sizeof *s->sess_busy);
    s->sess_used = TD_CALLOC(err, (size_t)s->max_sessions, sizeof *s->sess_used);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->running || !s->sessions || !s->sess_busy || !s->sess_used) { td_sched_free(s); return TD_ERR_NOMEM; }
    if (pthread_create(&s->thread, NULL, loop, s) != 0) { td_sched_free(s); return TD_FAIL(err, TD_ERR_INTERNAL, "pthread_create failed"); }
    s->started = true;
    *out = s;
    return TD_OK;
}

void td_sched_free(td_sched *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; i < s->n_sessions; i++) td_session_free(s->sessions[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->running);
    free(s->sessions);
    free(s->sess_busy);
    free(s->sess_used);
    free(s);
}

int td_sched_submit(td_sched *s, const td_request *r, uint64_t *id, td_err *err) {
    int maxc = td_engine_max_ctx(s->eng);
    if (r->n_prompt <= 0) return TD_FAIL(err, TD_ERR_ARG, "empty prompt");
    if (r->n_prompt >= maxc)
        return TD_FAIL(err, TD_ERR_ARG, "request (%d tokens) exceeds the available context size (%d tokens)", r->n_prompt, maxc);
    if (r->gen.n_stop < 0 || r->gen.n_stop > 1024 || r->top_logprobs > TD_MAX_TOP_LOGPROBS)
        return TD_FAIL(err, TD_ERR_ARG, "too many stop ids or top_logprobs > %d", TD_MAX_TOP_LOGPROBS);
    req *q = TD_CALLOC(err, 1, sizeof *q);
    if (!q) return TD_ERR_NOMEM;
    q->r = *r;
    q->sess = -1;
    q->owner = s;
    q->prompt = TD_MALLOC(err, (size_t)r->n_prompt * sizeof(int32_t));
    q->stop_ids = TD_MALLOC(err, (size_t)(r->gen.n_stop + 1) * sizeof(int32_t));
    if (!q->prompt || !q->stop_ids) { free_req(q); return TD_ERR_NOMEM; }
    memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    if (r->gen.n_stop) memcpy(q->stop_ids, r->gen.stop_ids, (size_t)r->gen.n_stop * sizeof(int32_t));
    q->r.prompt = q->prompt;
    for (int i = 0; i < r->n_prompt && s->o.debug_fail_token >= 0; i++) q->poison |= r->prompt[i] == s->o.debug_fail_token;
    q->r.gen.stop_ids = q->stop_ids;
    if (r->sampling.n_logit_bias > 0 && r->sampling.logit_bias) {
        if (r->sampling.n_logit_bias > (1 << 20)) { free_req(q); return TD_FAIL(err, TD_ERR_ARG, "too many logit_bias entries"); }
        q->bias = TD_MALLOC(err, (size_t)r->sampling.n_logit_bias * sizeof *q->bias);
        if (!q->bias) { free_req(q); return TD_ERR_NOMEM; }
        memcpy(q->bias, r->sampling.logit_bias, (size_t)r->sampling.n_logit_bias * sizeof *q->bias);
        q->r.sampling.logit_bias = q->bias;
    } else {
        q->r.sampling.logit_bias = NULL;
        q->r.sampling.n_logit_bias = 0;
    }
    pthread_mutex_lock(&s->mu);
    if (s->n_waiting + s->n_running >= s->o.max_queue + s->o.max_num_seqs) { /* running slots + queue are full */
        pthread_mutex_unlock(&s->mu);
        free_req(q);
        return TD_FAIL(err, TD_ERR_LIMIT, "server busy: %d requests waiting (--max-queue)", s->o.max_queue);
    }
    q->id = ++s->next_id;
    if (s->wait_tail) s->wait_tail->next = q;
    else s->wait_head = q;
    s->wait_tail = q;
    s->n_waiting++;
    s->st.waiting = s->n_waiting;
    if (id) *id = q->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return TD_OK;
}

void td_sched_cancel(td_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    for (req *q = s->wait_head; q; q = q->next)
        if (q->id == id) q->cancel = true;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->id == id) s->running[i]->cancel = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void td_sched_get_stats(td_sched *s, td_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    /* kv_cache_usage is measured on the scheduler thread, which owns the pool */
    pthread_mutex_unlock(&s->mu);
}
