/* n > 1 and list prompts on /v1/chat/completions and /v1/completions: one
 * HTTP response, one scheduler request (a job) per choice.
 *
 * Choice c is prompt c / n, sample c % n (vLLM's and OpenAI's index order).
 * The lead (choice 0) holds the connection, the stream buffer and the final
 * body; the other jobs ("followers") send their SSE bytes and their choice
 * objects to it, and the last one to finish completes the response (usage:
 * each prompt's tokens counted once, as vLLM does; completion tokens summed).
 *
 * Prefix sharing: sample 0 of each prompt is submitted at once, its other
 * samples at its first token. The prefill saves a prefix-cache checkpoint one
 * token before the prompt's end (src/spec/gen.c), so by then the others find
 * the whole prompt but its last token in the cache instead of prefilling it
 * again side by side.
 *
 * Seeds: with a seed (the request's or the server's), sample j uses seed + j
 * (vLLM's parallel sampling); without one each gets its own random seed.
 * Greedy requests give n identical choices.
 *
 * Locks: a follower's lock, then the lead's (never the other way); the
 * group's mu guards fanned[] only and is never held with a job lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/srv_internal.h"
#include "util/err.h"

static job_group *group_of(job *j) { return j->lead ? j->lead->group : j->group; }

static json_t *group_usage(const job_group *g) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)g->prompt_tokens, "completion_tokens",
                     (json_int_t)g->completion_tokens, "total_tokens", (json_int_t)(g->prompt_tokens + g->completion_tokens),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)g->cached_tokens);
}

/* The last choice finished (lead's lock held): usage and [DONE], or the body. */
static void group_complete(job *L) {
    job_group *g = L->group;
    bool chat = L->req.kind == OAI_CHAT;
    if (L->req.stream) {
        int rc = 0;
        if (!L->conn_gone && L->req.include_usage) {
            json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", L->id, "object", chat ? "chat.completion.chunk" : "text_completion",
                                  "created", (json_int_t)L->created, "model", L->srv->model_name, "choices", "usage", group_usage(g));
            char *t = c ? json_dumps(c, JSON_COMPACT) : NULL;
            json_decref(c);
            rc |= !t || td_sb_adds(&L->out, "data: ") || td_sb_adds(&L->out, t) || td_sb_adds(&L->out, "\n\n");
            free(t);
        }
        if (!L->conn_gone) rc |= td_sb_adds(&L->out, "data: [DONE]\n\n");
        if (rc) fprintf(stderr, "tandem serve: out of memory finishing %s\n", L->id);
        L->out_done = true;
        return;
    }
    json_t *o;
    if (g->error[0]) {
        char msg[sizeof g->error];
        td_srv_utf8_clean(g->error, msg, sizeof msg);
        o = json_pack("{s:{s:s, s:s, s:i}}", "error", "message", msg, "type", g->error_status == 503 ? "service_unavailable_error" : "server_error",
                      "code", g->error_status);
        L->body_status = g->error_status;
    } else {
        json_t *cs = json_array();
        for (int c = 0; cs && c < g->n_choices; c++)
            if (g->choices[c]) {
                json_array_append_new(cs, g->choices[c]);
                g->choices[c] = NULL;
            }
        o = cs ? json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", L->id, "object", chat ? "chat.completion" : "text_completion", "created",
                           (json_int_t)L->created, "model", L->srv->model_name, "choices", cs, "usage", group_usage(g))
               : NULL;
        L->body_status = 200;
    }
    L->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!L->body) L->body_status = 500;
}

void td_group_member_done(job *j) {
    job *L = j->lead ? j->lead : j;
    job_group *g = L->group;
    if (j != L) pthread_mutex_lock(&L->mu);
    int c = j->choice_index;
    if (c % g->n == 0) { /* the prompt counts once, with sample 0's cache reuse */
        g->prompt_tokens += j->n_prompt;
        g->cached_tokens += j->res.n_reused;
    }
    g->completion_tokens += j->res.n_generated;
    if (j->error[0] && !g->error[0]) {
        snprintf(g->error, sizeof g->error, "%s", j->error);
        g->error_status = strstr(j->error, "busy") ? 503 : 500;
    }
    if (L->req.stream) {
        if (j != L && !L->conn_gone && j->out.len) td_sb_add(&L->out, j->out.p, j->out.len);
        if (j != L) td_sb_clear(&j->out);
    } else {
        g->choices[c] = j->gchoice;
        j->gchoice = NULL;
    }
    if (++g->n_done == g->n_choices) {
        group_complete(L);
        L->finished = true;
    }
    td_srv_wake(L);
    if (j != L) pthread_mutex_unlock(&L->mu);
}

void td_group_flush(job *j) {
    job *L = j->lead;
    if (!L || !j->out.len) return;
    pthread_mutex_lock(&L->mu);
    if (!L->conn_gone && !L->out_done && td_sb_add(&L->out, j->out.p, j->out.len) == 0) td_job_backlog_over(L);
    td_srv_wake(L);
    pthread_mutex_unlock(&L->mu);
    td_sb_clear(&j->out);
}

/* Submits j (scheduler and connection bookkeeping as td_ep_generate). Returns
 * the scheduler's status; on failure nothing is left submitted. */
static int submit(srv *s, job *j, td_request *tr, td_err *err) {
    pthread_mutex_lock(&s->jobs_mu);
    j->counted_active = true;
    s->n_active++;
    pthread_mutex_unlock(&s->jobs_mu);
    td_srv_track(s, j);
    uint64_t id = 0;
    pthread_rwlock_rdlock(&s->sched_lock);
    int src = s->sched && atomic_load(&s->ready) == 1 ? td_sched_submit(s->sched, tr, &id, err) : TD_ERR_LIMIT;
    if (src == TD_ERR_LIMIT && !s->sched) err->msg[0] = 0;
    pthread_rwlock_unlock(&s->sched_lock);
    if (src) {
        td_srv_untrack(s, j);
        td_srv_job_finished(s, j);
        return src;
    }
    td_metrics_add(&s->metrics, &s->metrics.requests, 1);
    if (j->req.stream) td_metrics_add(&s->metrics, &s->metrics.stream_requests, 1);
    pthread_mutex_lock(&j->mu);
    j->sched_id = id;
    j->submitted = true;
    bool gone = j->conn_gone && !j->finished && !j->cancel_sent; /* the client left while we submitted */
    if (gone) j->cancel_sent = true;
    pthread_mutex_unlock(&j->mu);
    if (gone) td_srv_cancel(s, id);
    return 0;
}

/* Starts follower j: submitted, or finished at once with the reason it could
 * not be (through its own on_done, so every choice reports exactly once). */
static void follower_start(srv *s, job *j, const int32_t *ids, int n) {
    td_job_ref(j->lead); /* dropped at the end of j's on_done */
    td_request tr;
    td_job_sched_request(j, ids, n, &tr);
    td_job_ref(j); /* the scheduler's, dropped by on_done */
    pthread_mutex_lock(&j->mu);
    bool gone = j->conn_gone;
    pthread_mutex_unlock(&j->mu);
    td_err err = {0};
    int src = gone ? TD_ERR_LIMIT : submit(s, j, &tr, &err);
    if (!src) return;
    td_gen_result res;
    memset(&res, 0, sizeof res);
    res.finish = TD_FINISH_CANCEL; /* n_prompt 0: never admitted (no request histograms) */
    char msg[300];
    if (src == TD_ERR_LIMIT) snprintf(msg, sizeof msg, "the server is busy (request queue full); retry later");
    else snprintf(msg, sizeof msg, "%.280s", err.msg[0] ? td_err_text(&err) : "cannot submit the request");
    if (src == TD_ERR_LIMIT && !gone) td_metrics_add(&s->metrics, &s->metrics.rejected_queue_full, 1);
    tr.on_done(tr.user, &res, gone ? NULL : msg);
}

void td_group_fan_out(job *j) {
    job_group *g = group_of(j);
    if (!g || g->n < 2) return;
    int p = j->choice_index / g->n;
    pthread_mutex_lock(&g->mu);
    bool go = !g->fanned[p];
    g->fanned[p] = true;
    pthread_mutex_unlock(&g->mu);
    if (!go) return;
    srv *s = j->srv;
    for (int k = 1; k < g->n; k++) follower_start(s, g->m[p * g->n + k], g->ids[p], g->n_ids[p]);
}

void td_group_conn_gone(srv *s, job *L) {
    job_group *g = L->group;
    for (int c = 1; c < g->n_choices; c++) td_srv_conn_gone(s, g->m[c]);
}

void td_group_free(job *L) {
    job_group *g = L->group;
    L->group = NULL;
    if (!g) return;
    for (int c = 1; c < g->n_choices; c++)
        if (g->m[c]) {
            td_srv_untrack(L->srv, g->m[c]);
            td_job_unref(g->m[c]);
        }
    for (int p = 0; p < g->n_prompts; p++) free(g->ids[p]);
    for (int c = 0; c < g->n_choices; c++) json_decref(g->choices[c]);
    free(g->m);
    free(g->ids);
    free(g->n_ids);
    free(g->fanned);
    free(g->choices);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Tokens of prompt item p (a string or a token-id list, validated by td_oai_parse). */
static int item_ids(srv *s, const json_t *p, int32_t **ids, int *n, http_err *e) {
    if (json_is_string(p)) {
        td_err err = {0};
        size_t len = 0;
        if (td_tok_encode(s->tok, json_string_value(p), json_string_length(p), true, ids, &len, &err)) {
            td_http_err_set(e, 400, "invalid_request_error", "cannot tokenize the prompt: %.400s", td_err_text(&err));
            return -1;
        }
        *n = (int)len;
        return 0;
    }
    size_t k = json_array_size(p), i;
    const json_t *v;
    *ids = malloc((k ? k : 1) * sizeof **ids);
    if (!*ids) return td_http_err_set(e, 500, "server_error", "out of memory"), -1;
    json_array_foreach(p, i, v)(*ids)[i] = (int32_t)json_integer_value(v);
    *n = (int)k;
    return 0;
}

static job_group *group_alloc(int n, int n_prompts) {
    job_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->n = n;
    g->n_prompts = n_prompts;
    g->n_choices = n * n_prompts;
    g->m = calloc((size_t)g->n_choices, sizeof *g->m);
    g->choices = calloc((size_t)g->n_choices, sizeof *g->choices);
    g->ids = calloc((size_t)n_prompts, sizeof *g->ids);
    g->n_ids = calloc((size_t)n_prompts, sizeof *g->n_ids);
    g->fanned = calloc((size_t)n_prompts, sizeof *g->fanned);
    if (!g->m || !g->choices || !g->ids || !g->n_ids || !g->fanned || pthread_mutex_init(&g->mu, NULL)) {
        free(g->m), free(g->choices), free(g->ids), free(g->n_ids), free(g->fanned), free(g);
        return NULL;
    }
    return g;
}

/* Frees a group whose lead was never created. */
static void group_discard(job_group *g) {
    for (int c = 0; c < g->n_choices; c++) td_job_unref(g->m[c]);
    for (int p = 0; p < g->n_prompts; p++) free(g->ids[p]);
    free(g->m), free(g->choices), free(g->ids), free(g->n_ids), free(g->fanned);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void td_ep_generate_group(srv *s, task *t, oai_req *r, int32_t *ids, size_t n_ids, int reasoning, const json_t *body) {
    http_err *e = &t->e;
    int n = r->n, P = r->prompt_list ? (int)json_array_size(r->prompt_list) : 1;
    job_group *g = group_alloc(n, P);
    if (!g) {
        free(ids);
        td_oai_req_free(r);
        td_http_err_set(e, 500, "server_error", "out of memory");
        return;
    }
    g->ids[0] = ids;
    g->n_ids[0] = (int)n_ids;
    json_t *list = r->prompt_list ? json_incref(r->prompt_list) : NULL;
    int rc = 0;
    for (int p = 1; p < P && !rc; p++) { /* every prompt is checked before anything runs */
        rc = item_ids(s, json_array_get(list, (size_t)p), &g->ids[p], &g->n_ids[p], e);
        if (!rc && g->n_ids[p] == 0) rc = -1, td_http_err_set(e, 400, "invalid_request_error", "prompt %d is empty", p);
        if (!rc && g->n_ids[p] >= s->n_ctx) {
            td_http_err_set(e, 400, "exceed_context_size_error", "request (%d tokens) exceeds the available context size (%d tokens)", g->n_ids[p],
                         s->n_ctx);
            e->n_prompt = g->n_ids[p];
            e->n_ctx = s->n_ctx;
            rc = -1;
        }
        if (rc) e->param = "prompt";
    }
    td_err err = {0};
    for (int c = 0; c < g->n_choices && !rc; c++) {
        int p = c / n;
        oai_req mr;
        if (c == 0) {
            mr = *r; /* the lead takes the parsed request */
            memset(r, 0, sizeof *r);
        } else if (td_oai_parse(s, body, t->kind, &mr, e)) { /* each choice its own copy of everything the request holds */
            td_oai_req_free(&mr);
            rc = -1;
            break;
        }
        json_decref(mr.prompt_list);
        mr.prompt_list = NULL;
        if (c > 0) {
            free(mr.prompt_ids);
            mr.prompt_ids = NULL;
            mr.n_prompt_ids = 0;
            json_decref(mr.messages); /* rendered once, by the lead's request */
            mr.messages = NULL;
            free(mr.prompt_text);
            mr.prompt_text = NULL;
            const json_t *item = list ? json_array_get(list, (size_t)p) : NULL;
            if (item && json_is_string(item)) mr.prompt_text = strdup(json_string_value(item)); /* for echo */
            else if (!item && t->kind != OAI_CHAT && g->m[0]->req.prompt_text) mr.prompt_text = strdup(g->m[0]->req.prompt_text);
        }
        if (mr.seed_set || s->cfg.sampling_seed_set) mr.sampling.seed += (uint64_t)(c % n);
        int room = s->n_ctx - g->n_ids[p];
        if (mr.max_tokens < 0) mr.max_tokens = s->cfg.default_max_tokens > 0 ? s->cfg.default_max_tokens : room;
        if (mr.max_tokens > room) mr.max_tokens = room;
        job *j = td_job_new(s, &mr, g->n_ids[p], reasoning, &err);
        if (!j) {
            td_oai_req_free(&mr);
            td_http_err_set(e, 500, "server_error", "cannot start the request: %.400s", td_err_text(&err));
            rc = -1;
            break;
        }
        g->m[c] = j;
        j->choice_index = c;
        j->fd = t->fd; /* the watchdog cancels every choice of a client gone */
        j->fan_pending = n > 1 && c % n == 0;
        if (c == 0) {
            j->conn = t->conn;
            j->http11 = t->http11;
        } else {
            j->lead = g->m[0];
            memcpy(j->id, g->m[0]->id, sizeof j->id); /* one response id */
            j->created = g->m[0]->created;
        }
    }
    json_decref(list);
    td_oai_req_free(r);
    if (rc) {
        group_discard(g);
        return;
    }
    job *L = g->m[0];
    L->group = g;
    if (L->req.stream) /* every choice's role (or echo) chunk first, in index order */
        for (int c = 0; c < g->n_choices && !rc; c++) {
            rc = td_job_stream_begin(g->m[c]);
            if (!rc && c) {
                rc = td_sb_add(&L->out, g->m[c]->out.p, g->m[c]->out.len);
                td_sb_clear(&g->m[c]->out);
            }
        }
    if (rc) {
        td_job_unref(L); /* frees the group */
        td_http_err_set(e, 500, "server_error", "out of memory");
        return;
    }
    td_request tr;
    int n0 = g->n_ids[0];
    td_job_sched_request(L, g->ids[0], n0, &tr);
    td_job_ref(L); /* the scheduler's */
    int src = submit(s, L, &tr, &err);
    if (src) {
        td_job_unref(L); /* the scheduler's */
        td_job_unref(L); /* ours: frees the group */
        td_srv_submit_error(s, src, &err, n0, e);
        return;
    }
    /* sample 0 of the other prompts now; the other samples at their first token */
    for (int p = 1; p < P; p++) follower_start(s, g->m[p * n], g->ids[p], g->n_ids[p]);
    t->job = L; /* the connection context's reference */
}
