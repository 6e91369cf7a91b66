/* One generation request: scheduler callbacks (on the scheduler thread),
 * detokenization, stop strings, reasoning/tool-call parsing, SSE chunks for
 * streamed responses and the final JSON for the others.
 *
 * Locking: every field after creation is guarded by job->mu. The job is
 * reference-counted: the scheduler (until on_done), the connection context
 * (until libmicrohttpd's request-completed callback) and a streamed
 * response (until its free callback) each hold one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include "server/srv_internal.h"
#include "util/err.h"

static int on_event(void *user, const cp_event *ev);

job *td_job_new(srv *s, oai_req *r, int n_prompt, int reasoning_mode, td_err *err) {
    job *j = TD_CALLOC(err, 1, sizeof *j);
    if (!j) return NULL;
    if (pthread_mutex_init(&j->mu, NULL)) { free(j); TD_FAIL(err, TD_ERR_INTERNAL, "mutex"); return NULL; }
    j->srv = s;
    j->refs = 1;
    pthread_mutex_lock(&s->jobs_mu);
    s->n_open++; /* td_job_unref's decrement balances it */
    pthread_mutex_unlock(&s->jobs_mu);
    j->fd = -1;
    j->req = *r;
    memset(r, 0, sizeof *r);
    j->n_prompt = n_prompt;
    j->n_ctx = s->n_ctx;
    uint64_t id = td_srv_next_id(s);
    snprintf(j->id, sizeof j->id, "%s-%016llx%08llx", j->req.kind == OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)(s->id_base ^ (id * 0x9e3779b97f4a7c15ull)), (unsigned long long)(id & 0xffffffffull));
    j->created = (long long)time(NULL);
    j->t_arrival = td_srv_now();
    td_tok_stream_init(&j->ts, s->tok, j->req.skip_special);
    bool ok = td_stop_init(&j->stop, (const char *const *)j->req.stops, j->req.n_stops, j->req.include_stop, err) == 0;
    if (j->req.kind == OAI_CHAT) {
        cp_config cfg = {.reasoning = reasoning_mode, .parse_tools = j->req.parse_tools, .tools = j->req.tools,
                         .id_seed = s->id_base ^ (id << 20)};
        td_cp_init(&j->cp, &cfg, on_event, j);
        j->use_cp = true;
        j->calls = json_array();
        ok = ok && j->calls;
    }
    if (j->req.logprobs >= 0) {
        j->lp_pending = json_array();
        j->lp_all = json_array();
        ok = ok && j->lp_pending && j->lp_all;
    }
    if (!j->req.seed_set && !s->cfg.sampling_seed_set) j->req.sampling.seed = s->id_base ^ (id * 0xbf58476d1ce4e5b9ull);
    if (ok && td_so_job_init(j, reasoning_mode, err)) ok = false; /* structured outputs: the grammar matcher */
    if (!ok) {
        if (!err || !err->code) TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        td_job_unref(j);
        return NULL;
    }
    return j;
}

void td_job_ref(job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void td_job_unref(job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    srv *s = j->srv;
    if (j->group) td_group_free(j);
    json_decref(j->gchoice);
    td_api_state_free(j->api);
    td_tok_stream_free(&j->ts);
    td_stop_free(&j->stop);
    if (j->use_cp) td_cp_free(&j->cp);
    td_so_job_free(j);
    td_sb_free(&j->scratch);
    td_sb_free(&j->out);
    td_sb_free(&j->dtext);
    td_sb_free(&j->content);
    td_sb_free(&j->reasoning);
    td_sb_free(&j->raw);
    for (int i = 0; i < j->cargs_cap; i++) td_sb_free(&j->cargs[i]);
    free(j->cargs);
    json_decref(j->calls);
    json_decref(j->lp_pending);
    json_decref(j->lp_all);
    free(j->body);
    td_oai_req_free(&j->req);
    pthread_mutex_destroy(&j->mu);
    free(j);
    pthread_mutex_lock(&s->jobs_mu);
    s->n_open--;
    pthread_cond_broadcast(&s->jobs_cv);
    pthread_mutex_unlock(&s->jobs_mu);
}

/* ---- JSON pieces --------------------------------------------------------- */

static json_t *usage_json(const job *j) {
    int gen = j->res.n_generated;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->n_prompt, "completion_tokens", gen, "total_tokens",
                     j->n_prompt + gen, "prompt_tokens_details", "cached_tokens", j->res.n_reused);
}

static json_t *bytes_json(const char *s) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)s; a && *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

static char *token_text(job *j, int32_t id) {
    if (!j->req.tokens_as_ids) return td_oai_token_text(j->srv, id);
    char *t = malloc(24);
    if (t) snprintf(t, 24, "token_id:%d", (int)id);
    return t;
}

/* One chat-format logprob entry for a generated token. */
static json_t *lp_entry(job *j, const td_token_event *ev) {
    char *t = token_text(j, ev->token);
    json_t *e = json_pack("{s:s, s:f, s:o, s:[]}", "token", t ? t : "", "logprob", (double)ev->logprob, "bytes", bytes_json(t ? t : ""),
                          "top_logprobs");
    free(t);
    json_t *top = json_object_get(e, "top_logprobs");
    int n = ev->n_top < j->req.logprobs ? ev->n_top : j->req.logprobs;
    for (int i = 0; e && i < n; i++) {
        char *tt = token_text(j, ev->top_ids[i]);
        json_array_append_new(top, json_pack("{s:s, s:f, s:o}", "token", tt ? tt : "", "logprob", (double)ev->top_logprobs[i], "bytes",
                                             bytes_json(tt ? tt : "")));
        free(tt);
    }
    return e;
}

/* Chat entries -> the completions logprobs object. */
static json_t *lp_completions(job *j, const json_t *entries) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i;
    const json_t *e;
    json_array_foreach(entries, i, e) {
        const char *t = json_string_value(json_object_get(e, "token"));
        json_array_append(toks, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *m = json_object();
        size_t k;
        const json_t *alt;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, alt)
            json_object_set(m, json_string_value(json_object_get(alt, "token")), json_object_get(alt, "logprob"));
        json_array_append_new(tops, m);
        json_array_append_new(offs, json_integer((json_int_t)j->text_offset));
        j->text_offset += t ? strlen(t) : 0;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset", offs);
}

/* Logprobs object for a chunk/response from entries (steals nothing). */
static json_t *lp_object(job *j, json_t *entries) {
    if (!entries || j->req.logprobs < 0) return json_null();
    /* a copy: the stream clears lp_pending once the chunk is built, before it is serialized */
    if (j->req.kind == OAI_CHAT) return json_pack("{s:o}", "content", json_copy(entries));
    return lp_completions(j, entries);
}

static const char *finish_reason(const job *j) {
    switch (j->res.finish) {
    case TD_FINISH_LENGTH: return "length";
    case TD_FINISH_CANCEL: return "abort";
    default: return j->n_calls ? "tool_calls" : "stop";
    }
}

int td_job_cp_event(job *j, const cp_event *ev) { return on_event(j, ev); }

/* ---- streamed output ------------------------------------------------------ */

static int sse(job *j, json_t *obj) { /* steals obj */
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    int rc = !s || td_sb_adds(&j->out, "data: ") || td_sb_adds(&j->out, s) || td_sb_adds(&j->out, "\n\n") ? -1 : 0;
    free(s);
    return rc;
}

static json_t *chunk(job *j, json_t *choice) { /* steals choice (may be NULL: choices []) */
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", j->id, "object",
                          j->req.kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created,
                          "model", j->srv->model_name, "choices");
    if (c && choice) json_array_append_new(json_object_get(c, "choices"), choice);
    else json_decref(choice);
    return c;
}

/* A chunk with a chat delta (or completions text) and pending logprobs. */
static int emit_chunk(job *j, json_t *delta, const char *text, size_t len, const char *finish) {
    json_t *lp = json_null();
    if (j->lp_pending && json_array_size(j->lp_pending)) {
        json_decref(lp);
        lp = lp_object(j, j->lp_pending);
        json_array_clear(j->lp_pending);
    }
    json_t *choice;
    if (j->req.kind == OAI_CHAT)
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", j->choice_index, "delta", delta ? delta : json_object(), "logprobs", lp, "finish_reason", finish);
    else
        choice = json_pack("{s:i, s:s%, s:o, s:s?}", "index", j->choice_index, "text", text ? text : "", text ? len : 0, "logprobs", lp, "finish_reason",
                           finish);
    if (choice && !finish) json_object_set_new(choice, "finish_reason", json_null());
    return sse(j, chunk(j, choice));
}

/* {"reasoning": t} (vLLM), {"reasoning_content": t} (llama.cpp, older vLLM)
 * or both, by --reasoning-field; steals t. */
static json_t *reasoning_json(const job *j, json_t *t) {
    int f = j->srv->cfg.reasoning_field;
    json_t *o = json_object();
    if (o && f != SRV_REASONING_CONTENT) json_object_set(o, "reasoning", t);
    if (o && f != SRV_REASONING_NEW) json_object_set(o, "reasoning_content", t);
    json_decref(t);
    return o;
}

static int flush_delta(job *j) {
    if (!j->dkind) return 0;
    int rc;
    if (j->dialect) { /* Responses / Anthropic events (api_common.c) */
        rc = td_api_stream_delta(j, j->dkind, j->dindex, j->dtext.p, j->dtext.len);
    } else if (j->req.kind != OAI_CHAT) {
        rc = emit_chunk(j, NULL, j->dtext.p, j->dtext.len, NULL);
    } else {
        json_t *d;
        json_t *txt = json_stringn(j->dtext.p ? j->dtext.p : "", j->dtext.len);
        if (j->dkind == CP_REASONING) d = reasoning_json(j, txt);
        else if (j->dkind == CP_CONTENT) d = json_pack("{s:o}", "content", txt), j->content_sent += j->dtext.len;
        else d = json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", j->dindex, "function", "arguments", txt);
        rc = d ? emit_chunk(j, d, NULL, 0, NULL) : -1;
    }
    j->dkind = 0;
    td_sb_clear(&j->dtext);
    return rc;
}

static int cargs_at(job *j, int i) {
    if (i < j->cargs_cap) return 0;
    int cap = j->cargs_cap ? j->cargs_cap * 2 : 4;
    while (cap <= i) cap *= 2;
    sbuf *n = realloc(j->cargs, (size_t)cap * sizeof *n);
    if (!n) return -1;
    memset(n + j->cargs_cap, 0, (size_t)(cap - j->cargs_cap) * sizeof *n);
    j->cargs = n;
    j->cargs_cap = cap;
    return 0;
}

/* Parser events -> deltas (stream) or accumulated message (non-stream). */
static int on_event(void *user, const cp_event *ev) {
    job *j = user;
    /* tool_choice required / named: the constrained text is held back and
     * becomes the tool calls when the request ends (td_so_tools_finish) */
    if ((j->req.so_kind == SO_TOOLS || j->req.so_kind == SO_TOOL) && ev->kind == CP_CONTENT)
        return td_sb_add(&j->content, ev->text, ev->len) ? TD_ERR_NOMEM : 0;
    /* parallel_tool_calls: false: the first call only, as vLLM */
    if (j->req.no_parallel_tools && ev->index > 0 && (ev->kind == CP_TOOL_START || ev->kind == CP_TOOL_ARGS)) return 0;
    /* A streamed chat holds everything from its first tool call to the end,
     * where invalid arguments fall back to content (release_tools). */
    bool live = j->req.stream && (j->dialect || !(j->tc_hold || ev->kind == CP_TOOL_START));
    if (j->req.stream && !live && !j->tc_hold) {
        if (flush_delta(j)) return TD_ERR_NOMEM;
        j->tc_hold = true;
    }
    if (ev->kind == CP_TOOL_START) {
        j->n_calls++;
        if (live) {
            if (flush_delta(j)) return TD_ERR_NOMEM;
            if (j->dialect) return td_api_stream_tool(j, ev) ? TD_ERR_NOMEM : 0;
            json_t *d = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", ev->index, "id", ev->id, "type", "function",
                                  "function", "name", ev->name, "arguments", "");
            return d && !emit_chunk(j, d, NULL, 0, NULL) ? 0 : TD_ERR_NOMEM;
        }
        if (cargs_at(j, ev->index)) return TD_ERR_NOMEM;
        json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", ev->id, "type", "function", "function", "name", ev->name, "arguments", "");
        return c && !json_array_append_new(j->calls, c) ? 0 : TD_ERR_NOMEM;
    }
    if (live) {
        if (j->dkind && (j->dkind != (int)ev->kind || j->dindex != ev->index) && flush_delta(j)) return TD_ERR_NOMEM;
        j->dkind = (int)ev->kind;
        j->dindex = ev->index;
        return td_sb_add(&j->dtext, ev->text, ev->len) ? TD_ERR_NOMEM : 0;
    }
    sbuf *b = ev->kind == CP_REASONING ? &j->reasoning : ev->kind == CP_CONTENT ? &j->content : NULL;
    if (!b) {
        if (cargs_at(j, ev->index)) return TD_ERR_NOMEM;
        b = &j->cargs[ev->index];
    }
    return td_sb_add(b, ev->text, ev->len) ? TD_ERR_NOMEM : 0;
}

/* The chat parser's input is kept while tools are parsed: the content to
 * fall back to when a call's arguments are not valid JSON. */
static int feed_cp(job *j, const char *t, size_t n, td_err *err) {
    if (j->req.parse_tools && td_sb_add(&j->raw, t, n)) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    return td_cp_push(&j->cp, t, n, err);
}

/* Every parsed call's arguments are a JSON object (vLLM's tool parsers
 * return the output as content otherwise). */
static bool tools_valid(job *j) {
    for (int i = 0; i < j->n_calls; i++) {
        sbuf *a = i < j->cargs_cap ? &j->cargs[i] : NULL;
        json_t *o = a && a->len ? json_loadb(a->p, a->len, 0, NULL) : NULL;
        bool ok = json_is_object(o);
        json_decref(o);
        if (!ok) return false;
    }
    return true;
}

/* The output after the reasoning, as the parser saw it (tool markup included). */
static const char *raw_content(job *j, size_t *len) {
    const char *p = j->raw.p ? j->raw.p : "";
    size_t n = j->raw.len;
    const char *e = j->use_cp && j->cp.cfg.reasoning ? memmem(p, n, "</think>", 8) : NULL;
    if (e) n -= (size_t)(e + 8 - p), p = e + 8;
    while (n && (*p == '\n' || *p == '\r')) p++, n--;
    *len = n;
    return p;
}

/* Streamed tool calls, held since the first: sent now, or (invalid
 * arguments) the rest of the output as content, finish_reason "stop". */
static int release_tools(job *j) {
    int rc = 0;
    if (!tools_valid(j)) {
        size_t n;
        const char *p = raw_content(j, &n);
        size_t skip = j->content_sent < n ? j->content_sent : n; /* content already sent is a prefix of it */
        j->n_calls = 0;
        if (n > skip) rc = emit_chunk(j, json_pack("{s:s%}", "content", p + skip, n - skip), NULL, 0, NULL);
        return rc;
    }
    size_t i;
    json_t *c;
    json_array_foreach(j->calls, i, c) {
        json_t *f = json_object_get(c, "function");
        sbuf *a = (int)i < j->cargs_cap ? &j->cargs[i] : NULL;
        json_t *d = json_pack("{s:[{s:i, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls", "index", (int)i, "id", json_object_get(c, "id"), "type",
                              "function", "function", "name", json_object_get(f, "name"), "arguments", "");
        rc |= d ? emit_chunk(j, d, NULL, 0, NULL) : -1;
        d = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", (int)i, "function", "arguments", a && a->p ? a->p : "{}",
                      a && a->p ? a->len : 2);
        rc |= d ? emit_chunk(j, d, NULL, 0, NULL) : -1;
    }
    if (j->content.len) rc |= emit_chunk(j, json_pack("{s:s%}", "content", j->content.p, j->content.len), NULL, 0, NULL);
    return rc;
}

/* Text out of the detokenizer: stop strings, then the chat parser.
 * Returns 1 when a stop string matched, <0 on error. */
static int process_text(job *j, const char *t, size_t n, td_err *err) {
    td_sb_clear(&j->scratch);
    int hit = td_stop_push(&j->stop, t, n, &j->scratch, err);
    if (hit < 0) return hit;
    int rc = 0;
    if (j->scratch.len) {
        if (j->use_cp) rc = feed_cp(j, j->scratch.p, j->scratch.len, err);
        else {
            cp_event ev = {.kind = CP_CONTENT, .text = j->scratch.p, .len = j->scratch.len};
            rc = on_event(j, &ev);
        }
    }
    return rc < 0 ? rc : hit;
}

/* A client that does not read: its unsent SSE bytes over --max-stream-buffer
 * cancel the request; the buffer is dropped and the socket shut down, so
 * libmicrohttpd closes the connection (job lock held). Returns true then. */
bool td_job_backlog_over(job *j) {
    srv *s = j->srv;
    size_t pending = j->out.len - j->out_sent;
    if (!j->req.stream || !s->cfg.max_stream_buffer || pending <= s->cfg.max_stream_buffer) return false;
    j->overflow = true;
    j->conn_gone = true;
    bool count = !j->cancel_sent;
    j->cancel_sent = true;
    td_sb_free(&j->out);
    j->out_sent = 0;
    if (j->fd >= 0) shutdown(j->fd, SHUT_RDWR);
    if (count) td_metrics_add(&s->metrics, &s->metrics.cancelled_disconnect, 1);
    fprintf(stderr, "tandem serve: %s cancelled: the client is not reading (%zu bytes unsent, over --max-stream-buffer %zu)\n", j->id,
            pending, s->cfg.max_stream_buffer);
    return true;
}

static int on_token(void *user, const td_token_event *ev) {
    job *j = user;
    srv *s = j->srv;
    double now = td_srv_now();
    pthread_mutex_lock(&j->mu);
    if (!j->t_first) {
        j->t_first = now;
        td_metrics_observe(&s->metrics, M_TTFT, now - j->t_arrival);
    } else {
        td_metrics_observe(&s->metrics, M_ITL, now - j->t_last);
    }
    j->t_last = now;
    if (j->conn_gone) {
        pthread_mutex_unlock(&j->mu);
        return 2;
    }
    if (j->req.logprobs >= 0) {
        json_t *e = lp_entry(j, ev);
        if (e) json_array_append(j->req.stream ? j->lp_pending : j->lp_all, e);
        json_decref(e);
    }
    td_err err = {0};
    const char *text = NULL;
    size_t len = 0;
    int rc = td_tok_stream_push(&j->ts, ev->token, &text, &len, &err);
    if (rc == 0) rc = process_text(j, text, len, &err);
    if (rc >= 0 && j->req.stream && flush_delta(j)) rc = TD_ERR_NOMEM;
    if (rc >= 0 && j->dialect) td_api_on_token(j);
    if (rc < 0) snprintf(j->error, sizeof j->error, "output processing failed: %.400s", td_err_text(&err));
    if (td_job_backlog_over(j)) rc = -1;
    if (j->lead) td_group_flush(j);
    td_srv_wake(j);
    bool fan = j->fan_pending; /* the prompt is in the prefix cache now: its other samples */
    j->fan_pending = false;
    pthread_mutex_unlock(&j->mu);
    if (fan) td_group_fan_out(j);
    return rc < 0 ? 2 : rc == 1 ? 1 : 0;
}

/* The error text as valid UTF-8 (a cut message may end inside a character). */
static void clean_error(job *j) {
    char t[sizeof j->error];
    td_srv_utf8_clean(j->error, t, sizeof t);
    memcpy(j->error, t, sizeof t);
}

static void finish_stream(job *j) {
    int rc = 0;
    clean_error(j);
    if (j->dialect) { /* Responses / Anthropic: their closing events, no [DONE] */
        rc |= j->error[0] ? 0 : flush_delta(j);
        rc |= td_api_finish_stream(j);
        if (rc) fprintf(stderr, "tandem serve: out of memory finishing %s\n", j->id);
        j->out_done = true;
        return;
    }
    if (j->error[0]) {
        json_t *e = json_pack("{s:{s:s, s:s, s:i}}", "error", "message", j->error, "type", "server_error", "code", 500);
        rc |= sse(j, e);
    } else {
        rc |= flush_delta(j);
        if (j->tc_hold) rc |= release_tools(j);
        rc |= emit_chunk(j, j->req.kind == OAI_CHAT ? json_object() : NULL, NULL, 0, finish_reason(j));
        if (j->req.include_usage && !j->group && !j->lead) {
            json_t *c = chunk(j, NULL);
            if (c) json_object_set_new(c, "usage", usage_json(j));
            rc |= sse(j, c);
        }
    }
    if (j->group || j->lead) { /* one of several choices: td_group_member_done ends the stream */
        if (rc) fprintf(stderr, "tandem serve: out of memory finishing %s\n", j->id);
        return;
    }
    rc |= td_sb_adds(&j->out, "data: [DONE]\n\n");
    if (rc) fprintf(stderr, "tandem serve: out of memory finishing %s\n", j->id);
    j->out_done = true;
}

/* Tool calls whose arguments are not valid JSON: the output after the
 * reasoning becomes plain content, as vLLM's parsers fall back. */
static void tools_fallback(job *j) {
    if (j->req.kind != OAI_CHAT || !j->n_calls || tools_valid(j)) return;
    size_t n;
    const char *p = raw_content(j, &n);
    td_sb_clear(&j->content);
    td_sb_add(&j->content, p, n);
    j->n_calls = 0;
}

static void finish_body(job *j) {
    json_t *o;
    clean_error(j);
    if (j->dialect) { /* Responses / Anthropic body (api_common.c) */
        if (!j->error[0]) tools_fallback(j);
        td_api_finish_body(j);
        return;
    }
    if (j->error[0] && (j->group || j->lead)) return; /* td_group_member_done reports it */
    if (j->error[0]) {
        o = json_pack("{s:{s:s, s:s, s:i}}", "error", "message", j->error, "type", "server_error", "code", 500);
        j->body_status = 500;
    } else {
        json_t *lp = lp_object(j, j->lp_all), *choice;
        tools_fallback(j);
        if (j->req.kind == OAI_CHAT) {
            json_t *msg = json_pack("{s:s}", "role", "assistant");
            if (j->content.len || !j->n_calls) json_object_set_new(msg, "content", json_stringn(j->content.p ? j->content.p : "", j->content.len));
            else json_object_set_new(msg, "content", json_null());
            if (j->reasoning.len) json_object_update_missing_new(msg, reasoning_json(j, json_stringn(j->reasoning.p, j->reasoning.len)));
            if (j->n_calls) {
                size_t i;
                json_t *c;
                json_array_foreach(j->calls, i, c) {
                    sbuf *a = (int)i < j->cargs_cap ? &j->cargs[i] : NULL;
                    json_object_set_new(json_object_get(c, "function"), "arguments",
                                        json_stringn(a && a->p ? a->p : "{}", a && a->p ? a->len : 2));
                }
                json_object_set(msg, "tool_calls", j->calls);
            }
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", j->choice_index, "message", msg, "logprobs", lp, "finish_reason", finish_reason(j));
        } else {
            sbuf t = {0};
            if (j->req.echo && j->req.prompt_text) td_sb_adds(&t, j->req.prompt_text);
            td_sb_add(&t, j->content.p ? j->content.p : "", j->content.len);
            choice = json_pack("{s:i, s:s%, s:o, s:s}", "index", j->choice_index, "text", t.p ? t.p : "", t.len, "logprobs", lp, "finish_reason",
                               finish_reason(j));
            td_sb_free(&t);
        }
        if (j->group || j->lead) { /* one of several choices: the lead assembles the body */
            j->gchoice = choice;
            return;
        }
        o = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", j->id, "object", j->req.kind == OAI_CHAT ? "chat.completion" : "text_completion",
                      "created", (json_int_t)j->created, "model", j->srv->model_name, "choices", choice, "usage", usage_json(j));
        j->body_status = 200;
    }
    j->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!j->body) j->body_status = 500;
}

static void on_done(void *user, const td_gen_result *res, const char *error) {
    job *j = user;
    srv *s = j->srv;
    double now = td_srv_now();
    pthread_mutex_lock(&j->mu);
    if (res) j->res = *res;
    if (error && !j->error[0]) snprintf(j->error, sizeof j->error, "%.500s", error);
    if (!j->error[0] && !j->conn_gone) {
        td_err err = {0};
        const char *text = NULL;
        size_t len = 0;
        int rc = td_tok_stream_flush(&j->ts, &text, &len, &err);
        if (rc == 0 && len) rc = process_text(j, text, len, &err);
        if (rc >= 0 && !j->stop.hit) {
            td_sb_clear(&j->scratch);
            rc = td_stop_flush(&j->stop, &j->scratch, &err);
            if (rc == 0 && j->scratch.len) {
                if (j->use_cp) rc = feed_cp(j, j->scratch.p, j->scratch.len, &err);
                else {
                    cp_event ev = {.kind = CP_CONTENT, .text = j->scratch.p, .len = j->scratch.len};
                    rc = on_event(j, &ev);
                }
            }
        }
        if (rc >= 0 && j->use_cp) rc = td_cp_finish(&j->cp, &err);
        if (rc >= 0 && td_so_tools_finish(j)) rc = TD_FAIL(&err, TD_ERR_NOMEM, "out of memory");
        if (rc < 0) snprintf(j->error, sizeof j->error, "output processing failed: %.400s", err.msg);
    }
    srv_finish_id f = j->error[0] ? F_ERROR : j->res.finish == TD_FINISH_LENGTH ? F_LENGTH : j->res.finish == TD_FINISH_CANCEL ? F_ABORT : F_STOP;
    td_metrics_add(&s->metrics, &s->metrics.finished[f], 1);
    if (j->n_calls) td_metrics_add(&s->metrics, &s->metrics.tool_calls, (uint64_t)j->n_calls);
    td_metrics_observe(&s->metrics, M_E2E, now - j->t_arrival);
    td_metrics_request_done(&s->metrics, now - j->t_arrival, j->n_prompt, res);
    if (!j->conn_gone) {
        if (j->req.stream) finish_stream(j);
        else finish_body(j);
    }
    if (j->group || j->lead) td_group_member_done(j); /* the lead is finished when every choice is */
    if (!j->group) j->finished = true;
    td_srv_wake(j);
    if (!s->cfg.quiet)
        fprintf(stderr, "tandem serve: %s %s prompt %d (cached %d) generated %d finish %s%s%s %.3fs\n", j->id, j->req.stream ? "stream" : "",
                j->n_prompt, j->res.n_reused, j->res.n_generated, finish_reason(j), j->error[0] ? " error: " : "", j->error,
                now - j->t_arrival);
    /* finish "length" because the window, not max_tokens, ran out */
    if (!s->cfg.quiet && !j->error[0] && f == F_LENGTH && j->n_ctx > 0 && j->n_prompt + j->res.n_generated >= j->n_ctx)
        fprintf(stderr, "tandem serve: %s stopped: the context window (%d tokens) is full\n", j->id, j->n_ctx);
    bool fan = j->fan_pending; /* ended before its first token: start the other samples anyway */
    j->fan_pending = false;
    job *lead = j->lead;
    pthread_mutex_unlock(&j->mu);
    if (fan) td_group_fan_out(j);
    td_srv_job_finished(s, j);
    td_job_unref(j);
    td_job_unref(lead); /* a follower's reference on its lead (group.c) */
}

void td_job_sched_request(job *j, const int32_t *prompt, int n_prompt, td_request *r) {
    srv *s = j->srv;
    memset(r, 0, sizeof *r);
    r->prompt = prompt;
    r->n_prompt = n_prompt;
    r->sampling = j->req.sampling;
    int32_t eos = td_tok_eos_id(s->tok);
    if (!j->req.ignore_eos && eos >= 0) j->req.stop_ids[j->req.n_stop_ids++] = eos;
    r->gen.max_tokens = j->req.max_tokens;
    r->gen.spec_depth = j->req.spec_depth >= 0 ? j->req.spec_depth : s->cfg.spec_depth;
    r->gen.spec_auto = j->req.spec_depth < 0 && s->cfg.spec_auto; /* num_speculative_tokens fixes it */
    r->gen.draft_sampling = s->cfg.draft_sampling;
    r->gen.ignore_eos = j->req.ignore_eos;
    r->gen.stop_ids = j->req.stop_ids;
    r->gen.n_stop = j->req.n_stop_ids;
    r->top_logprobs = j->req.logprobs;
    r->gen.constraint = td_so_job_constraint(j);
    r->on_token = on_token;
    r->on_done = on_done;
    r->user = j;
}

int td_job_stream_begin(job *j) {
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    if (j->dialect) {
        rc = td_api_stream_begin(j);
    } else if (j->req.kind == OAI_CHAT) {
        json_t *d = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
        rc = d ? emit_chunk(j, d, NULL, 0, NULL) : -1;
    } else if (j->req.echo && j->req.prompt_text) {
        rc = emit_chunk(j, NULL, j->req.prompt_text, strlen(j->req.prompt_text), NULL);
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

ssize_t td_job_stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    size_t avail = j->out.len - j->out_sent;
    if (avail) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, j->out.p + j->out_sent, n);
        j->out_sent += n;
        if (j->out_sent == j->out.len) {
            td_sb_clear(&j->out);
            j->out_sent = 0;
        }
        pthread_mutex_unlock(&j->mu);
        return (ssize_t)n;
    }
    if (j->out_done || j->conn_gone || (j->finished && !j->req.stream)) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (j->finished) { /* finished without output (client gone): end */
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    j->suspended = true;
    MHD_suspend_connection(j->conn);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

void td_job_stream_free(void *cls) { td_job_unref(cls); }

void td_job_keepalive(job *j, double now) {
    if (!j->req.stream || j->t_first || j->finished || j->conn_gone || !j->submitted || j->lead) return;
    if (!j->t_keepalive) j->t_keepalive = j->t_arrival;
    if (now - j->t_keepalive < SRV_KEEPALIVE_S) return;
    j->t_keepalive = now;
    if ((j->dialect ? td_api_keepalive(j) : emit_chunk(j, j->req.kind == OAI_CHAT ? json_object() : NULL, NULL, 0, NULL)) == 0) td_srv_wake(j);
}
