/* Scheduler: continuous batching over td_gen_step. New requests join
 * between steps; prefill is chunked under a token budget so a long prompt
 * does not stall the others; each request drafts at its own depth inside
 * the shared verify batch. Earlier requests' state is reused through the
 * engine's exact prefix cache (kv/kv.h). */
#include "sched/sched.h"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "spec/gen.h"
#include "util/err.h"

typedef struct req {
    uint64_t id;
    td_request r;          /* prompt and stop_ids owned copies */
    int32_t *prompt, *stop_ids;
    bool cancel;           /* guarded by the scheduler mutex */
    td_gen *g;
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
    td_sched_stats st;     /* guarded by mu */
};

void td_sched_opts_default(td_sched_opts *o) {
    o->max_num_seqs = 8;
    o->max_queue = 64;
    o->max_batch_tokens = 512;
    o->prefix_caching = true;
}

static void free_req(req *q) {
    if (!q) return;
    free(q->prompt);
    free(q->stop_ids);
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
    if (q->r.top_logprobs >= 0) fill_logprobs(row, q->owner->eng->model->cfg.vocab_size, tok, q->r.top_logprobs, &ev);
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
        td_spec_counters *t = &s->st.spec;
        t->drafts += res.spec.drafts;
        t->draft_tokens += res.spec.draft_tokens;
        t->accepted_tokens += res.spec.accepted_tokens;
        for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) t->accepted_per_pos[i] += res.spec.accepted_per_pos[i];
    }
    if (q->sess >= 0) {
        s->sess_busy[q->sess] = false;
        s->sess_used[q->sess] = ++s->tick;
    }
    pthread_mutex_unlock(&s->mu);
    if (q->r.on_done) q->r.on_done(q->r.user, &res, error);
    free_req(q);
}

static void *loop(void *arg) {
    td_sched *s = arg;
    td_gen **gens = calloc((size_t)s->o.max_num_seqs, sizeof *gens);
    req **batch = calloc((size_t)s->o.max_num_seqs, sizeof *batch);
    if (!gens || !batch) abort(); /* allocated before the thread could report anything */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->n_running == 0 && s->n_waiting == 0) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop) { pthread_mutex_unlock(&s->mu); break; }
        /* admit */
        req *failed = NULL;
        while (s->n_running < s->o.max_num_seqs && s->wait_head) {
            req *q = s->wait_head;
            s->wait_head = q->next;
            if (!s->wait_head) s->wait_tail = NULL;
            s->n_waiting--;
            q->next = NULL;
            td_err err = {0};
            int si = q->cancel ? -1 : pick_session(s, &err);
            int brc = 0;
            if (si >= 0) {
                s->sess_busy[si] = true;
                q->sess = si;
                if ((brc = td_gen_begin(s->sessions[si], q->prompt, q->r.n_prompt, &q->r.sampling, &q->r.gen, on_emit, q, &q->g, &err))) q->g = NULL;
            }
            if (brc == TD_ERR_LIMIT && s->n_running > 0) {
                /* KV cache full: wait at the head of the queue for blocks */
                s->sess_busy[si] = false;
                q->sess = -1;
                q->next = s->wait_head;
                s->wait_head = q;
                if (!s->wait_tail) s->wait_tail = q;
                s->n_waiting++;
                break;
            }
            if (!q->g) {
                if (!q->cancel) snprintf(q->error, sizeof q->error, "%s", err.msg[0] ? td_err_text(&err) : "no session available");
                q->next = failed;
                failed = q;
                continue;
            }
            s->running[s->n_running++] = q;
        }
        for (int i = 0; i < s->n_running; i++)
            if (s->running[i]->cancel) td_gen_cancel(s->running[i]->g);
        int n = 0;
        for (int i = 0; i < s->n_running; i++)
            if (!td_gen_done(s->running[i]->g)) { batch[n] = s->running[i]; gens[n++] = s->running[i]->g; }
        s->st.running = s->n_running;
        s->st.waiting = s->n_waiting;
        pthread_mutex_unlock(&s->mu);
        while (failed) {
            req *q = failed;
            failed = q->next;
            finish_req(s, q, q->error[0] ? q->error : NULL);
        }
        td_err err = {0};
        int rc = n ? td_gen_step(gens, n, s->o.max_batch_tokens, &err) : 0;
        /* blocks held by running sequences (cached and checkpoint blocks are reclaimable) */
        td_kv_info ki;
        td_engine_kv_info(s->eng, &ki);
        /* retire finished (or failed) requests */
        pthread_mutex_lock(&s->mu);
        s->st.kv_cache_usage = ki.n_blocks ? (double)(ki.n_blocks - ki.free_blocks - ki.checkpoint_blocks) / ki.n_blocks : 0.0;
        req *done = NULL;
        for (int i = 0; i < s->n_running;) {
            req *q = s->running[i];
            bool in_batch = false;
            for (int j = 0; j < n && !in_batch; j++) in_batch = batch[j] == q;
            if (td_gen_done(q->g) || (rc && in_batch)) {
                if (rc && in_batch) {
                    snprintf(q->error, sizeof q->error, "%s", td_err_text(&err));
                    td_session_reset(s->sessions[q->sess]); /* state undefined after a failed step */
                }
                s->running[i] = s->running[--s->n_running];
                q->next = done;
                done = q;
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
    int maxc = s->eng->max_context;
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
    q->r.gen.stop_ids = q->stop_ids;
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
