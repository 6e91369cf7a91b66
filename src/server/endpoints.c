/* Endpoint handlers: /v1/models, /metrics, /tokenize, /detokenize and the
 * generation endpoints (/v1/chat/completions, /v1/completions).
 *
 * /tokenize, /detokenize and the generation endpoints run on a prompt
 * worker (http.c) with the connection suspended: a huge body's parsing,
 * template rendering and tokenization do not hold a polling thread. They
 * leave their answer in the task; http.c sends it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "server/api.h"
#include "server/srv_internal.h"
#include "util/err.h"

static json_t *parse_body(const char *body, size_t len, http_err *e) {
    json_error_t je;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) td_http_err_set(e, 400, "invalid_request_error", "malformed JSON body: %.200s (line %d, column %d)", je.text, je.line, je.column);
    else if (!json_is_object(j)) {
        json_decref(j);
        j = NULL;
        td_http_err_set(e, 400, "invalid_request_error", "the request body must be a JSON object");
    }
    return j;
}

enum MHD_Result td_ep_models(srv *s, struct MHD_Connection *c) {
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:[]}", "id", s->model_name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "tandem", "root", s->model_dir, "parent", "max_model_len", s->n_ctx,
                          "permission");
    return td_srv_reply_json(s, c, 200, m ? json_pack("{s:s, s:[o]}", "object", "list", "data", m) : NULL);
}

/* The scheduler's stats call (one place to adapt if sched.h renames it). */
static void sched_stats(td_sched *sc, struct td_sched_stats *st) { td_sched_get_stats(sc, st); }

enum MHD_Result td_ep_metrics(srv *s, struct MHD_Connection *c) {
    struct td_sched_stats st;
    memset(&st, 0, sizeof st);
    bool have = false;
    pthread_rwlock_rdlock(&s->sched_lock);
    if (s->sched) {
        sched_stats(s->sched, &st);
        have = true;
    }
    pthread_rwlock_unlock(&s->sched_lock);
    metrics_ctx mc = {.model_name = s->model_name, .loaded = atomic_load(&s->ready) == 1, .have_stats = have, .st = &st,
                      .spec_depth = s->cfg.spec_depth, .spec_auto = s->cfg.spec_auto, .max_num_seqs = s->cfg.max_num_seqs, .max_queue = s->cfg.max_queue,
                      .n_ctx = s->n_ctx, .uptime_s = td_srv_now() - s->t_start};
    sbuf b = {0};
    enum MHD_Result rc;
    if (td_metrics_render(&s->metrics, &mc, &b)) {
        http_err e;
        td_http_err_set(&e, 500, "server_error", "out of memory");
        rc = td_srv_reply_error(s, c, &e);
    } else {
        rc = td_srv_reply(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", b.len);
    }
    td_sb_free(&b);
    return rc;
}

static int encode(srv *s, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n, http_err *e) {
    td_err err = {0};
    if (td_tok_encode(s->tok, text, len, add_special, ids, n, &err)) {
        td_http_err_set(e, 400, "invalid_request_error", "cannot tokenize the prompt: %.400s", td_err_text(&err));
        return -1;
    }
    return 0;
}

/* The task's answer: o (stolen) as JSON, or a 500. */
static void task_reply(task *t, int status, json_t *o) {
    t->reply = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (t->reply) t->status = status;
    else td_http_err_set(&t->e, 500, "server_error", "out of memory");
}

void td_ep_tokenize(srv *s, task *t) {
    http_err e = {0};
    json_t *b = parse_body(t->body, t->len, &e);
    if (!b) {
        t->e = e;
        return;
    }
    oai_req r;
    memset(&r, 0, sizeof r);
    char *text = NULL;
    size_t tl = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    bool add_special = true, strs = false;
    const json_t *as = json_object_get(b, "add_special_tokens"), *rs = json_object_get(b, "return_token_strs");
    if (as && !json_is_boolean(as) && !json_is_null(as)) td_http_err_set(&e, 400, "invalid_request_error", "'add_special_tokens' must be a boolean");
    if (rs && !json_is_boolean(rs) && !json_is_null(rs)) td_http_err_set(&e, 400, "invalid_request_error", "'return_token_strs' must be a boolean");
    strs = json_is_true(rs);
    if (!e.status && json_object_get(b, "messages")) {
        add_special = json_is_true(as); /* vLLM: off for chat unless asked */
        if (!td_oai_chat_fields(b, &r, &e) && !td_oai_render_chat(s, &r, &text, &tl, &e)) encode(s, text, tl, add_special, &ids, &n, &e);
    } else if (!e.status) {
        if (json_is_boolean(as)) add_special = json_is_true(as);
        const json_t *p = json_object_get(b, "prompt");
        if (!json_is_string(p)) td_http_err_set(&e, 400, "invalid_request_error", "'prompt' (a string) or 'messages' is required");
        else encode(s, json_string_value(p), json_string_length(p), add_special, &ids, &n, &e);
    }
    if (e.status) {
        t->e = e;
    } else {
        json_t *a = json_array(), *ts = strs ? json_array() : json_null();
        for (size_t i = 0; i < n; i++) {
            json_array_append_new(a, json_integer(ids[i]));
            if (strs) {
                const char *str = td_tok_token_str(s->tok, ids[i]);
                json_array_append_new(ts, json_string(str ? str : ""));
            }
        }
        task_reply(t, 200, json_pack("{s:i, s:i, s:o, s:o}", "count", (int)n, "max_model_len", s->n_ctx, "tokens", a, "token_strs", ts));
    }
    free(ids);
    free(text);
    td_oai_req_free(&r);
    json_decref(b);
}

void td_ep_detokenize(srv *s, task *tk) {
    http_err e = {0};
    json_t *b = parse_body(tk->body, tk->len, &e);
    if (!b) {
        tk->e = e;
        return;
    }
    const json_t *t = json_object_get(b, "tokens");
    size_t n = json_array_size(t), i;
    int32_t *ids = json_is_array(t) ? malloc((n ? n : 1) * sizeof *ids) : NULL;
    if (!json_is_array(t)) td_http_err_set(&e, 400, "invalid_request_error", "'tokens' must be an array of token ids");
    else if (!ids) td_http_err_set(&e, 500, "server_error", "out of memory");
    const json_t *v;
    if (!e.status) json_array_foreach(t, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= td_tok_vocab_size(s->tok)) {
            td_http_err_set(&e, 400, "invalid_request_error", "tokens[%zu] is not a token id below %d", i, td_tok_vocab_size(s->tok));
            break;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *text = NULL;
    size_t tl = 0;
    td_err err = {0};
    if (!e.status && td_tok_decode(s->tok, ids, n, false, &text, &tl, &err))
        td_http_err_set(&e, 400, "invalid_request_error", "cannot detokenize: %.400s", td_err_text(&err));
    if (e.status) tk->e = e;
    else task_reply(tk, 200, json_pack("{s:s%}", "prompt", text ? text : "", tl));
    free(text);
    free(ids);
    json_decref(b);
}

/* Prompt ids of a parsed request; *reasoning: parser mode. */
static int prompt_ids(srv *s, oai_req *r, int32_t **ids, size_t *n, int *reasoning, http_err *e) {
    *reasoning = 0;
    if (r->kind == OAI_CHAT) {
        char *text = NULL;
        size_t tl = 0;
        if (td_oai_render_chat(s, r, &text, &tl, e)) return -1;
        *reasoning = td_cp_reasoning_mode(text, tl, r->thinking);
        int rc = encode(s, text, tl, false, ids, n, e);
        free(text);
        return rc;
    }
    if (r->prompt_ids) {
        *ids = r->prompt_ids;
        *n = r->n_prompt_ids;
        r->prompt_ids = NULL;
        r->n_prompt_ids = 0;
        return 0;
    }
    return encode(s, r->prompt_text, strlen(r->prompt_text), true, ids, n, e);
}

void td_srv_submit_error(srv *s, int src, const td_err *err, int n_prompt, http_err *e) {
    if (src == TD_ERR_LIMIT && strstr(err->msg, "context size")) { /* the scheduler's own context check */
        td_http_err_set(e, 400, "exceed_context_size_error", "request (%d tokens) exceeds the available context size (%d tokens)", n_prompt, s->n_ctx);
        e->n_prompt = n_prompt;
        e->n_ctx = s->n_ctx;
    } else if (src == TD_ERR_LIMIT) {
        td_metrics_add(&s->metrics, &s->metrics.rejected_queue_full, 1);
        td_http_err_set(e, 503, "service_unavailable_error", "the server is busy (request queue full); retry later");
        e->retry_after = true;
    } else {
        const char *m = strstr(err->msg, ": ");
        td_http_err_set(e, src == TD_ERR_ARG ? 400 : 500, src == TD_ERR_ARG ? "invalid_request_error" : "server_error", "%.400s",
                     m && !strncmp(err->msg, "src/", 4) ? m + 2 : err->msg);
    }
}

void td_ep_generate(srv *s, task *t) {
    http_err *e = &t->e;
    if (atomic_load(&s->ready) != 1) { /* draining while the task waited */
        td_http_err_set(e, 503, "service_unavailable_error", "the server is shutting down");
        return;
    }
    json_t *b = parse_body(t->body, t->len, e);
    if (!b) return;
    api_state *ax = NULL; /* Responses / Anthropic: b becomes the chat body */
    if (t->dialect && td_api_translate(s, t->dialect, &b, &ax, e)) {
        json_decref(b);
        return;
    }
    oai_req r;
    int rc = td_oai_parse(s, b, t->kind, &r, e);
    int32_t *ids = NULL;
    size_t n = 0;
    int reasoning = 0;
    if (!rc) rc = prompt_ids(s, &r, &ids, &n, &reasoning, e);
    if (!rc && n == 0) rc = -1, td_http_err_set(e, 400, "invalid_request_error", "the prompt is empty");
    if (!rc && (long long)n >= s->n_ctx) {
        td_http_err_set(e, 400, "exceed_context_size_error", "request (%zu tokens) exceeds the available context size (%d tokens)", n, s->n_ctx);
        e->n_prompt = (int)n;
        e->n_ctx = s->n_ctx;
        rc = -1;
    }
    if (rc) {
        json_decref(b);
        free(ids);
        td_oai_req_free(&r);
        td_api_state_free(ax);
        return;
    }
    if (r.n > 1 || r.prompt_list) { /* several choices (group.c): each parses its own copy of b */
        td_api_state_free(ax); /* never set: the dialects have no n and no prompt lists */
        td_ep_generate_group(s, t, &r, ids, n, reasoning, b);
        json_decref(b);
        return;
    }
    json_decref(b);
    int room = s->n_ctx - (int)n;
    if (r.max_tokens < 0) r.max_tokens = s->cfg.default_max_tokens > 0 ? s->cfg.default_max_tokens : room;
    if (r.max_tokens > room) r.max_tokens = room;
    bool stream = r.stream;
    td_err err = {0};
    job *j = td_job_new(s, &r, (int)n, reasoning, &err);
    if (!j) {
        free(ids);
        td_oai_req_free(&r);
        td_api_state_free(ax);
        td_http_err_set(e, 500, "server_error", "cannot start the request: %.400s", td_err_text(&err));
        return;
    }
    j->dialect = ax ? t->dialect : DIALECT_CHAT;
    j->api = ax;
    if (ax) snprintf(j->id, sizeof j->id, "%s", ax->id); /* resp_... / msg_... in the logs */
    j->conn = t->conn;
    j->fd = t->fd;
    j->http11 = t->http11;
    if (stream && td_job_stream_begin(j)) {
        free(ids);
        td_job_unref(j);
        td_http_err_set(e, 500, "server_error", "out of memory");
        return;
    }
    td_request tr;
    td_job_sched_request(j, ids, (int)n, &tr);
    td_job_ref(j); /* the scheduler's, dropped by on_done */
    pthread_mutex_lock(&s->jobs_mu);
    j->counted_active = true;
    s->n_active++;
    pthread_mutex_unlock(&s->jobs_mu);
    td_srv_track(s, j);
    uint64_t id = 0;
    pthread_rwlock_rdlock(&s->sched_lock);
    int src = s->sched && atomic_load(&s->ready) == 1 ? td_sched_submit(s->sched, &tr, &id, &err) : TD_ERR_LIMIT;
    if (src == TD_ERR_LIMIT && !s->sched) err.msg[0] = 0;
    pthread_rwlock_unlock(&s->sched_lock);
    free(ids);
    if (src) {
        td_srv_untrack(s, j);
        td_srv_job_finished(s, j);
        td_job_unref(j); /* the scheduler's */
        td_job_unref(j); /* ours */
        td_srv_submit_error(s, src, &err, (int)n, e);
        return;
    }
    td_metrics_add(&s->metrics, &s->metrics.requests, 1);
    if (stream) td_metrics_add(&s->metrics, &s->metrics.stream_requests, 1);
    pthread_mutex_lock(&j->mu);
    j->sched_id = id;
    j->submitted = true;
    pthread_mutex_unlock(&j->mu);
    t->job = j; /* the connection context's reference */
}

enum MHD_Result td_ep_generate_respond(srv *s, struct MHD_Connection *c, job *j) {
    if (j->req.stream) { /* req.stream is fixed after td_job_new */
        td_job_ref(j); /* the response's, dropped by td_job_stream_free */
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, td_job_stream_read, j, td_job_stream_free);
        if (!resp) {
            td_job_unref(j);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        td_srv_cors_headers(s, c, resp);
        enum MHD_Result q = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        td_metrics_http(&s->metrics, 200);
        return q;
    }
    pthread_mutex_lock(&j->mu);
    if (!j->finished) {
        j->suspended = true;
        MHD_suspend_connection(c);
        pthread_mutex_unlock(&j->mu);
        return MHD_YES;
    }
    char *bd = j->body;
    int st = j->body_status ? j->body_status : 500;
    j->body = NULL;
    pthread_mutex_unlock(&j->mu);
    http_err e;
    enum MHD_Result q = bd ? td_srv_reply(s, c, st, "application/json", bd, strlen(bd))
                           : td_srv_reply_error(s, c, (td_http_err_set(&e, 500, "server_error", "no result"), &e));
    free(bd);
    return q;
}
