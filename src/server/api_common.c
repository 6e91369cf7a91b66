/* The output side shared by /v1/responses and /v1/messages (see api.h):
 * the hooks gen.c calls for a job whose dialect is not chat, the block list,
 * SSE framing and small JSON helpers for the translators.
 *
 * Every hook runs with the job lock held (scheduler thread or the thread
 * that submitted the job), like gen.c's own output code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "server/api.h"

/* ---- translation ------------------------------------------------------- */

int td_api_translate(srv *s, int dialect, json_t **body, api_state **out, http_err *e) {
    *out = NULL;
    api_state *st = calloc(1, sizeof *st);
    json_t *chat = json_object();
    if (!st || !chat) {
        free(st);
        json_decref(chat);
        td_http_err_set(e, 500, "server_error", "out of memory");
        return -1;
    }
    st->dialect = dialect;
    st->cur = -1;
    st->created = (long long)time(NULL);
    uint64_t n = td_srv_next_id(s);
    snprintf(st->id, sizeof st->id, "%s%016llx%08llx", dialect == DIALECT_RESPONSES ? "resp_" : "msg_",
             (unsigned long long)(s->id_base ^ (n * 0x9e3779b97f4a7c15ull)), (unsigned long long)(n & 0xffffffffull));
    int rc = dialect == DIALECT_RESPONSES ? td_resp_translate(s, *body, chat, st, e) : td_anth_translate(s, *body, chat, false, e);
    if (rc) {
        json_decref(chat);
        td_api_state_free(st);
        return -1;
    }
    json_decref(*body);
    *body = chat;
    *out = st;
    return 0;
}

void td_api_state_free(api_state *st) {
    if (!st) return;
    for (int i = 0; i < st->nb; i++) {
        free(st->b[i].name);
        td_sb_free(&st->b[i].text);
    }
    free(st->b);
    json_decref(st->echo);
    json_decref(st->conv);
    free(st);
}

json_t *td_api_text_of(const json_t *c, const char *const *types, const char *sep, const char *what, http_err *e) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        td_http_err_set(e, 400, "invalid_request_error", "%s must be a string or an array of text parts", what);
        return NULL;
    }
    if (json_array_size(c) > API_MAX_PARTS) {
        td_http_err_set(e, 400, "invalid_request_error", "%s: more than %d parts", what, API_MAX_PARTS);
        return NULL;
    }
    sbuf b = {0};
    size_t i;
    const json_t *p;
    int n = 0;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *text = json_object_get(p, "text");
        bool ok = false;
        for (int k = 0; type && types[k]; k++) ok |= !strcmp(type, types[k]);
        if (!ok) {
            td_sb_free(&b);
            td_http_err_set(e, 400, "invalid_request_error", "%s: part type '%.64s' is not supported (text only)", what,
                         type ? type : "(none)");
            return NULL;
        }
        if (!json_is_string(text)) {
            td_sb_free(&b);
            td_http_err_set(e, 400, "invalid_request_error", "%s: a '%.64s' part needs a string 'text'", what, type);
            return NULL;
        }
        if ((n++ && td_sb_adds(&b, sep)) || td_sb_add(&b, json_string_value(text), json_string_length(text))) {
            td_sb_free(&b);
            td_http_err_set(e, 500, "server_error", "out of memory");
            return NULL;
        }
    }
    json_t *s = json_stringn(b.p ? b.p : "", b.len);
    td_sb_free(&b);
    if (!s) td_http_err_set(e, 400, "invalid_request_error", "%s is not valid UTF-8", what);
    return s;
}

void td_api_pass(json_t *chat, const json_t *b, const char *const *keys) {
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(b, keys[i]);
        if (v) json_object_set(chat, keys[i], v);
    }
}

/* ---- blocks ---------------------------------------------------------------- */

api_block *td_api_block_add(api_state *st, int kind) {
    if (st->nb == st->capb) {
        int cap = st->capb ? st->capb * 2 : 4;
        api_block *n = realloc(st->b, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        st->b = n;
        st->capb = cap;
    }
    api_block *b = &st->b[st->nb++];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->call = -1;
    /* item ids: the response's id with a per-item suffix (Responses needs one per item) */
    const char *hex = strchr(st->id, '_');
    snprintf(b->id, sizeof b->id, "%s_%s_%d",
             kind == CP_REASONING ? "rs" : kind == CP_CONTENT ? "msg" : st->dialect == DIALECT_ANTHROPIC ? "toolu" : "fc",
             hex ? hex + 1 : st->id, st->n_items++);
    return b;
}

static int dialect_open(job *j, int bi) {
    return j->api->dialect == DIALECT_RESPONSES ? td_resp_open(j, bi) : td_anth_open(j, bi);
}

static int close_current(job *j, bool complete) {
    api_state *st = j->api;
    if (st->cur < 0) return 0;
    int bi = st->cur;
    st->cur = -1;
    return st->dialect == DIALECT_RESPONSES ? td_resp_close(j, bi, complete) : td_anth_close(j, bi);
}

int td_api_stream_delta(job *j, int kind, int index, const char *text, size_t len) {
    api_state *st = j->api;
    if (!len) return 0;
    if (kind == CP_REASONING) st->reasoning_bytes += len;
    int bi = st->cur;
    if (kind == CP_TOOL_ARGS) {
        if (bi < 0 || st->b[bi].kind != CP_TOOL_START || st->b[bi].call != index) {
            /* arguments of a call that is not the open one (the parser never
             * interleaves calls): kept for the final item, no delta event */
            for (int i = 0; i < st->nb; i++)
                if (st->b[i].kind == CP_TOOL_START && st->b[i].call == index) return td_sb_add(&st->b[i].text, text, len);
            return 0;
        }
    } else if (bi < 0 || st->b[bi].kind != kind) {
        if (close_current(j, true)) return -1;
        if (!td_api_block_add(st, kind)) return -1;
        bi = st->nb - 1;
        st->cur = bi;
        if (dialect_open(j, bi)) return -1;
    }
    if (td_sb_add(&st->b[bi].text, text, len)) return -1;
    return st->dialect == DIALECT_RESPONSES ? td_resp_delta(j, bi, text, len) : td_anth_delta(j, bi, text, len);
}

static int set_call(api_state *st, api_block *b, int index, const char *id, const char *name) {
    b->call = index;
    snprintf(b->call_id, sizeof b->call_id, "%s", id ? id : "");
    if (st->dialect == DIALECT_ANTHROPIC && id) {
        /* Anthropic ids look like toolu_...; the chat id's random part is kept */
        const char *u = strchr(id, '_');
        snprintf(b->id, sizeof b->id, "toolu_%s", u ? u + 1 : id);
    }
    b->name = strdup(name ? name : "");
    return b->name ? 0 : -1;
}

int td_api_stream_tool(job *j, const cp_event *ev) {
    api_state *st = j->api;
    if (close_current(j, true)) return -1;
    api_block *b = td_api_block_add(st, CP_TOOL_START);
    if (!b || set_call(st, b, ev->index, ev->id, ev->name)) return -1;
    st->cur = st->nb - 1;
    return dialect_open(j, st->cur);
}

void td_api_on_token(job *j) {
    api_state *st = j->api;
    size_t r = j->req.stream ? st->reasoning_bytes : j->reasoning.len;
    if (r > st->reasoning_seen) st->reasoning_tokens++;
    st->reasoning_seen = r;
}

int td_api_stream_begin(job *j) {
    return j->api->dialect == DIALECT_RESPONSES ? td_resp_begin(j) : td_anth_begin(j);
}

int td_api_finish_stream(job *j) {
    api_state *st = j->api;
    int rc = 0;
    if (!j->error[0]) rc = close_current(j, j->res.finish != TD_FINISH_LENGTH && j->res.finish != TD_FINISH_CANCEL);
    return rc | (st->dialect == DIALECT_RESPONSES ? td_resp_finish_stream(j) : td_anth_finish_stream(j));
}

/* Non-streamed: gen.c accumulated reasoning, content and calls; they become
 * blocks in the order the model writes them. */
static int blocks_from_job(job *j) {
    api_state *st = j->api;
    api_block *b;
    if (j->reasoning.len && (!(b = td_api_block_add(st, CP_REASONING)) || td_sb_add(&b->text, j->reasoning.p, j->reasoning.len))) return -1;
    if (j->content.len || !j->n_calls) {
        if (!(b = td_api_block_add(st, CP_CONTENT)) || td_sb_add(&b->text, j->content.p ? j->content.p : "", j->content.len)) return -1;
    }
    size_t i;
    json_t *c;
    json_array_foreach(j->n_calls ? j->calls : NULL, i, c) { /* n_calls 0: the calls fell back to content */
        const json_t *f = json_object_get(c, "function");
        if (!(b = td_api_block_add(st, CP_TOOL_START)) ||
            set_call(st, b, (int)i, json_string_value(json_object_get(c, "id")), json_string_value(json_object_get(f, "name"))))
            return -1;
        sbuf *a = (int)i < j->cargs_cap ? &j->cargs[i] : NULL;
        if (a && a->len && td_sb_add(&b->text, a->p, a->len)) return -1;
    }
    return 0;
}

void td_api_finish_body(job *j) {
    if (!j->error[0] && blocks_from_job(j)) snprintf(j->error, sizeof j->error, "out of memory");
    if (j->api->dialect == DIALECT_RESPONSES) td_resp_finish_body(j);
    else td_anth_finish_body(j);
}

int td_api_keepalive(job *j) {
    /* Anthropic streams have ping events; an SSE comment elsewhere (clients skip it) */
    if (j->api->dialect == DIALECT_ANTHROPIC) return td_api_sse(j, "ping", json_pack("{s:s}", "type", "ping"));
    return td_sb_adds(&j->out, ": keepalive\n\n");
}

/* ---- output helpers ---------------------------------------------------------- */

int td_api_sse(job *j, const char *event, json_t *data) {
    char *s = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    int rc = !s || td_sb_adds(&j->out, "event: ") || td_sb_adds(&j->out, event) || td_sb_adds(&j->out, "\ndata: ") || td_sb_adds(&j->out, s) ||
                     td_sb_adds(&j->out, "\n\n")
                 ? -1
                 : 0;
    free(s);
    return rc;
}

const char *td_api_stop_sequence(const job *j) {
    if (!j->stop.hit || j->stop.hit_index < 0 || j->stop.hit_index >= j->stop.n) return NULL;
    return j->stop.stops[j->stop.hit_index];
}
