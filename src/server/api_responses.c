/* The OpenAI Responses API (POST /v1/responses, GET and DELETE
 * /v1/responses/{id}) on top of the chat path (see api.h).
 *
 * Request: `input` (a string or items: messages, function_call,
 * function_call_output, reasoning), `instructions`, flat function tools,
 * tool_choice, max_output_tokens, text.format, reasoning.effort and the
 * sampling fields become a chat-completions body. `previous_response_id`
 * prepends the stored conversation of that response (its prompt and output
 * as chat messages), so the new prompt starts with the old one and its
 * prefix comes from the prefix cache.
 *
 * Output: the event sequence of the OpenAI SDK's typed stream (created,
 * in_progress, output_item.added, content_part.added, *.delta, *.done,
 * content_part.done, output_item.done, completed | incomplete | failed),
 * every event with its sequence_number; or the response object.
 *
 * Store: responses with store (the default) are kept in memory, least
 * recently used first out, bounded in count and bytes (srv_config
 * responses_store_max / _bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/api.h"

#define BAD(e, ...) (td_http_err_set((e), 400, "invalid_request_error", __VA_ARGS__), -1)
#define NOMEM(e) (td_http_err_set((e), 500, "server_error", "out of memory"), -1)

static bool absent(const json_t *v) { return !v || json_is_null(v); }

/* ---- the store ------------------------------------------------------------ */

typedef struct rs_entry {
    struct rs_entry *prev, *next;   /* most recently used first */
    char id[64];
    char *response;                 /* the response object (JSON text) */
    char *conv;                     /* the conversation: chat messages (JSON text) */
    size_t bytes;
} rs_entry;

struct resp_store {
    pthread_mutex_t mu;
    rs_entry *head, *tail;
    int n;
    size_t bytes;
};

static pthread_mutex_t store_init_mu = PTHREAD_MUTEX_INITIALIZER;

static int store_max(const srv *s) { return s->cfg.responses_store_max ? s->cfg.responses_store_max : 1000; }
static size_t store_max_bytes(const srv *s) { return s->cfg.responses_store_bytes ? s->cfg.responses_store_bytes : (size_t)64 << 20; }

/* Created on first use (most servers never see a Responses request). */
static struct resp_store *store_get(srv *s) {
    pthread_mutex_lock(&store_init_mu);
    if (!s->rstore && (s->rstore = calloc(1, sizeof *s->rstore)) && pthread_mutex_init(&s->rstore->mu, NULL)) {
        free(s->rstore);
        s->rstore = NULL;
    }
    struct resp_store *r = s->rstore;
    pthread_mutex_unlock(&store_init_mu);
    return r;
}

static void entry_free(rs_entry *x) {
    free(x->response);
    free(x->conv);
    free(x);
}

static void unlink_entry(struct resp_store *r, rs_entry *x) {
    if (x->prev) x->prev->next = x->next;
    else r->head = x->next;
    if (x->next) x->next->prev = x->prev;
    else r->tail = x->prev;
    x->prev = x->next = NULL;
    r->n--;
    r->bytes -= x->bytes;
}

static void push_front(struct resp_store *r, rs_entry *x) {
    x->prev = NULL;
    x->next = r->head;
    if (r->head) r->head->prev = x;
    r->head = x;
    if (!r->tail) r->tail = x;
    r->n++;
    r->bytes += x->bytes;
}

/* Linear: the store holds at most a few thousand entries and a lookup is one
 * per request, far below the cost of the request's prompt. */
static rs_entry *find(struct resp_store *r, const char *id) {
    for (rs_entry *x = r->head; x; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

void td_api_store_free(srv *s) {
    struct resp_store *r = s->rstore;
    if (!r) return;
    for (rs_entry *x = r->head, *n; x; x = n) {
        n = x->next;
        entry_free(x);
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
    s->rstore = NULL;
}

/* Takes response and conv (malloc'd). Entries over the byte limit alone are dropped. */
static void store_put(srv *s, const char *id, char *response, char *conv) {
    struct resp_store *r = s->cfg.responses_store_max < 0 ? NULL : store_get(s);
    rs_entry *x = r && response && conv ? calloc(1, sizeof *x) : NULL;
    if (!x) {
        free(response);
        free(conv);
        return;
    }
    snprintf(x->id, sizeof x->id, "%s", id);
    x->response = response;
    x->conv = conv;
    x->bytes = strlen(response) + strlen(conv) + sizeof *x;
    int max = store_max(s);
    size_t max_b = store_max_bytes(s);
    if (x->bytes > max_b) {
        entry_free(x);
        return;
    }
    pthread_mutex_lock(&r->mu);
    rs_entry *old = find(r, id);
    if (old) {
        unlink_entry(r, old);
        entry_free(old);
    }
    while (r->tail && (r->n >= max || r->bytes + x->bytes > max_b)) {
        rs_entry *t = r->tail;
        unlink_entry(r, t);
        entry_free(t);
    }
    push_front(r, x);
    pthread_mutex_unlock(&r->mu);
}

/* A copy of the stored field (conv or response), marking the entry used; NULL if absent. */
static char *store_copy(srv *s, const char *id, bool conv) {
    struct resp_store *r = store_get(s);
    if (!r) return NULL;
    char *out = NULL;
    pthread_mutex_lock(&r->mu);
    rs_entry *x = find(r, id);
    if (x) {
        unlink_entry(r, x);
        push_front(r, x);
        out = strdup(conv ? x->conv : x->response);
    }
    pthread_mutex_unlock(&r->mu);
    return out;
}

static bool store_delete(srv *s, const char *id) {
    struct resp_store *r = store_get(s);
    if (!r) return false;
    pthread_mutex_lock(&r->mu);
    rs_entry *x = find(r, id);
    if (x) unlink_entry(r, x);
    pthread_mutex_unlock(&r->mu);
    if (x) entry_free(x);
    return x != NULL;
}

enum MHD_Result td_ep_response_item(srv *s, struct MHD_Connection *c, const char *method, const char *id) {
    http_err e;
    bool del = !strcmp(method, "DELETE");
    if (del && store_delete(s, id))
        return td_srv_reply_json(s, c, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1));
    char *t = del ? NULL : store_copy(s, id, false);
    if (!t) {
        td_http_err_set(&e, 404, "invalid_request_error", "Response with id '%.100s' not found.", id);
        return td_srv_reply_error(s, c, &e);
    }
    enum MHD_Result rc = td_srv_reply(s, c, 200, "application/json", t, strlen(t));
    free(t);
    return rc;
}

/* ---- request translation ------------------------------------------------------- */

static const char *const TEXT_PARTS[] = {"input_text", "output_text", "text", "refusal", NULL};

/* The last chat message if it is an assistant turn that function calls may join. */
static json_t *open_assistant(json_t *conv) {
    json_t *m = json_array_get(conv, json_array_size(conv) - 1);
    const char *role = json_string_value(json_object_get(m, "role"));
    return role && !strcmp(role, "assistant") ? m : NULL;
}

static int add_reasoning(json_t *m, sbuf *pending, http_err *e) {
    if (!pending->len) return 0;
    json_t *r = json_stringn(pending->p, pending->len);
    td_sb_clear(pending);
    if (!r) return BAD(e, "reasoning text is not valid UTF-8");
    json_object_set_new(m, "reasoning_content", r);
    return 0;
}

/* One input item -> chat messages appended to conv. */
static int input_item(const json_t *it, size_t i, json_t *conv, sbuf *reasoning, http_err *e) {
    if (!json_is_object(it)) return BAD(e, "input[%zu] must be an object", i);
    const char *type = json_string_value(json_object_get(it, "type"));
    if (!type && json_object_get(it, "role")) type = "message";
    if (!type) return BAD(e, "input[%zu] needs a 'type'", i);
    char what[64];
    snprintf(what, sizeof what, "input[%zu].content", i);
    if (!strcmp(type, "message")) {
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "assistant")))
            return BAD(e, "input[%zu]: role must be user, system, developer or assistant", i);
        json_t *text = td_api_text_of(json_object_get(it, "content"), TEXT_PARTS, "\n", what, e);
        if (!text) return -1;
        json_t *m = json_pack("{s:s, s:o}", "role", role, "content", text);
        if (!m || json_array_append_new(conv, m)) return NOMEM(e);
        return !strcmp(role, "assistant") ? add_reasoning(m, reasoning, e) : 0;
    }
    if (!strcmp(type, "function_call")) {
        const json_t *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments"), *cid = json_object_get(it, "call_id");
        if (!json_is_string(name) || !json_is_string(cid)) return BAD(e, "input[%zu]: a function_call needs string 'name' and 'call_id'", i);
        if (!absent(args) && !json_is_string(args)) return BAD(e, "input[%zu]: function_call 'arguments' must be a string", i);
        json_t *m = open_assistant(conv);
        if (!m || json_object_get(m, "tool_calls") == NULL) {
            if (!m) {
                m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
                if (!m || json_array_append_new(conv, m)) return NOMEM(e);
            }
            json_object_set_new(m, "tool_calls", json_array());
        }
        if (add_reasoning(m, reasoning, e)) return -1;
        json_t *a = json_is_string(args) ? json_incref((json_t *)args) : json_string("{}");
        json_t *c = json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", cid, "type", "function", "function", "name", name, "arguments", a);
        if (!c || json_array_append_new(json_object_get(m, "tool_calls"), c)) return NOMEM(e);
        return 0;
    }
    if (!strcmp(type, "function_call_output")) {
        const json_t *cid = json_object_get(it, "call_id");
        if (!json_is_string(cid)) return BAD(e, "input[%zu]: a function_call_output needs a string 'call_id'", i);
        snprintf(what, sizeof what, "input[%zu].output", i);
        json_t *out = td_api_text_of(json_object_get(it, "output"), TEXT_PARTS, "\n", what, e);
        if (!out) return -1;
        json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", cid, "content", out);
        return m && !json_array_append_new(conv, m) ? 0 : NOMEM(e);
    }
    if (!strcmp(type, "reasoning")) {
        /* its text goes to the next assistant turn as reasoning_content */
        const char *keys[] = {"content", "summary"};
        for (int k = 0; k < 2; k++) {
            const json_t *arr = json_object_get(it, keys[k]), *p;
            size_t n;
            if (absent(arr)) continue;
            if (!json_is_array(arr) || json_array_size(arr) > API_MAX_PARTS) return BAD(e, "input[%zu].%s must be an array", i, keys[k]);
            json_array_foreach(arr, n, p) {
                const json_t *t = json_object_get(p, "text");
                if (!json_is_string(t)) return BAD(e, "input[%zu].%s[%zu] needs a string 'text'", i, keys[k], n);
                if ((reasoning->len && td_sb_adds(reasoning, "\n")) || td_sb_add(reasoning, json_string_value(t), json_string_length(t)))
                    return NOMEM(e);
            }
            if (json_array_size(arr)) break; /* the full text when given, else the summary */
        }
        return 0;
    }
    return BAD(e, "input[%zu]: item type '%.64s' is not supported", i, type);
}

static int translate_tools(const json_t *in, json_t *chat, http_err *e) {
    const json_t *tools = json_object_get(in, "tools"), *t;
    size_t i;
    if (!absent(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) > API_MAX_TOOLS) return BAD(e, "'tools' must be an array of at most %d tools", API_MAX_TOOLS);
        json_t *out = json_array();
        if (!out) return NOMEM(e);
        json_object_set_new(chat, "tools", out);
        json_array_foreach(tools, i, t) {
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!type || strcmp(type, "function"))
                return BAD(e, "tools[%zu]: tool type '%.64s' is not supported (function tools only)", i, type ? type : "(none)");
            const json_t *name = json_object_get(t, "name");
            if (!json_is_string(name)) return BAD(e, "tools[%zu] needs a string 'name'", i);
            json_t *f = json_pack("{s:O}", "name", name);
            if (!f) return NOMEM(e);
            td_api_pass(f, t, (const char *const[]){"description", "parameters", "strict", NULL});
            if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f))) return NOMEM(e);
        }
    }
    const json_t *tc = json_object_get(in, "tool_choice");
    if (json_is_string(tc)) {
        json_object_set(chat, "tool_choice", (json_t *)tc);
    } else if (json_is_object(tc)) {
        const char *type = json_string_value(json_object_get(tc, "type"));
        const json_t *name = json_object_get(tc, "name");
        if (!type || strcmp(type, "function") || !json_is_string(name))
            return BAD(e, "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
        json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    } else if (!absent(tc)) {
        return BAD(e, "'tool_choice' must be a string or an object");
    }
    return 0;
}

/* text.format -> response_format (the chat form). */
static int translate_format(const json_t *in, json_t *chat, json_t *echo, http_err *e) {
    const json_t *text = json_object_get(in, "text"), *f = json_object_get(text, "format");
    if (!absent(text) && !json_is_object(text)) return BAD(e, "'text' must be an object");
    if (absent(f)) {
        json_object_set_new(echo, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
        return 0;
    }
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type) return BAD(e, "'text.format' must be an object with a 'type'");
    json_object_set_new(echo, "text", json_pack("{s:O}", "format", f));
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (!strcmp(type, "json_schema")) {
        json_t *js = json_object();
        if (!js) return NOMEM(e);
        td_api_pass(js, f, (const char *const[]){"name", "schema", "strict", "description", NULL});
        json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
        return 0;
    }
    return BAD(e, "'text.format.type' must be text, json_object or json_schema, got '%.64s'", type);
}

int td_resp_translate(srv *s, const json_t *in, json_t *chat, api_state *st, http_err *e) {
    json_t *msgs = json_array(), *conv = json_array(), *echo = json_object();
    if (!msgs || !conv || !echo) {
        json_decref(msgs);
        json_decref(conv);
        json_decref(echo);
        return NOMEM(e);
    }
    st->conv = conv;
    st->echo = echo;
    json_object_set_new(chat, "messages", msgs);
    /* sampling and tandem/vLLM extensions pass through unchanged */
    td_api_pass(chat, in, (const char *const[]){"model", "stream", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                             "presence_penalty", "frequency_penalty", "seed", "stop", "ignore_eos", "logit_bias",
                                             "num_speculative_tokens", "chat_template_kwargs", "parallel_tool_calls",
                                             "structured_outputs", "skip_special_tokens", NULL});
    const json_t *v = json_object_get(in, "max_output_tokens");
    if (!absent(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) return BAD(e, "'max_output_tokens' must be a positive integer");
        json_object_set(chat, "max_tokens", (json_t *)v);
    }
    st->store = true;
    v = json_object_get(in, "store");
    if (!absent(v)) {
        if (!json_is_boolean(v)) return BAD(e, "'store' must be a boolean");
        st->store = json_is_true(v);
    }
    /* the previous conversation first: the prompt then starts as the previous one did */
    const json_t *prev = json_object_get(in, "previous_response_id");
    if (!absent(prev)) {
        if (!json_is_string(prev)) return BAD(e, "'previous_response_id' must be a string");
        char *t = store_copy(s, json_string_value(prev), true);
        if (!t) {
            td_http_err_set(e, 404, "invalid_request_error", "Previous response with id '%.100s' not found.", json_string_value(prev));
            e->param = "previous_response_id";
            return -1;
        }
        json_t *old = json_loads(t, 0, NULL);
        free(t);
        if (!json_is_array(old)) {
            json_decref(old);
            return NOMEM(e);
        }
        json_array_extend(conv, old);
        json_decref(old);
    }
    const json_t *input = json_object_get(in, "input");
    if (json_is_string(input)) {
        if (json_array_append_new(conv, json_pack("{s:s, s:O}", "role", "user", "content", input))) return NOMEM(e);
    } else if (json_is_array(input)) {
        if (json_array_size(input) > API_MAX_ITEMS) return BAD(e, "'input' has more than %d items", API_MAX_ITEMS);
        sbuf reasoning = {0};
        size_t i;
        const json_t *it;
        json_array_foreach(input, i, it) if (input_item(it, i, conv, &reasoning, e)) {
            td_sb_free(&reasoning);
            return -1;
        }
        td_sb_free(&reasoning);
    } else if (!absent(input)) {
        return BAD(e, "'input' must be a string or an array of items");
    }
    if (!json_array_size(conv)) return BAD(e, "'input' is required");
    const json_t *ins = json_object_get(in, "instructions");
    if (json_is_string(ins)) {
        if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins))) return NOMEM(e);
    } else if (!absent(ins)) {
        return BAD(e, "'instructions' must be a string");
    }
    json_array_extend(msgs, conv);
    if (translate_tools(in, chat, e) || translate_format(in, chat, echo, e)) return -1;
    const json_t *re = json_object_get(in, "reasoning");
    const char *effort = json_string_value(json_object_get(re, "effort"));
    if (!absent(re) && !json_is_object(re)) return BAD(e, "'reasoning' must be an object");
    if (effort && !strcmp(effort, "none")) { /* no thinking: the template's switch, unless set explicitly */
        json_t *kw = json_object_get(chat, "chat_template_kwargs");
        if (!kw) json_object_set_new(chat, "chat_template_kwargs", kw = json_object());
        if (json_is_object(kw) && !json_object_get(kw, "enable_thinking")) json_object_set_new(kw, "enable_thinking", json_false());
    }
    /* fields the response object echoes */
    const char *echo_keys[] = {"instructions", "max_output_tokens", "previous_response_id", "temperature", "top_p", "metadata", "user", NULL};
    for (int k = 0; echo_keys[k]; k++) {
        json_t *x = json_object_get(in, echo_keys[k]);
        json_object_set_new(echo, echo_keys[k], x ? json_incref(x) : json_null());
    }
    if (json_is_null(json_object_get(echo, "metadata"))) json_object_set_new(echo, "metadata", json_object());
    json_t *x = json_object_get(in, "tools");
    json_object_set_new(echo, "tools", json_is_array(x) ? json_incref(x) : json_array());
    x = json_object_get(in, "tool_choice");
    json_object_set_new(echo, "tool_choice", x && !json_is_null(x) ? json_incref(x) : json_string("auto"));
    x = json_object_get(in, "parallel_tool_calls");
    json_object_set_new(echo, "parallel_tool_calls", json_boolean(!json_is_false(x)));
    json_object_set_new(echo, "reasoning", json_pack("{s:s?, s:n}", "effort", effort, "summary"));
    json_object_set_new(echo, "store", json_boolean(st->store));
    json_object_set_new(echo, "truncation", json_string("disabled"));
    return 0;
}

/* ---- output -------------------------------------------------------------- */

static json_t *usage_json(const job *j) {
    const api_state *st = j->api;
    int gen = j->res.n_generated;
    return json_pack("{s:i, s:{s:i, s:i}, s:i, s:{s:i}, s:i}", "input_tokens", j->n_prompt, "input_tokens_details", "cached_tokens",
                     j->res.n_reused, "cache_write_tokens", 0, "output_tokens", gen, "output_tokens_details", "reasoning_tokens",
                     st->reasoning_tokens, "total_tokens", j->n_prompt + gen);
}

/* The item of block bi; `full`: with its text (else as first announced). */
static json_t *item_json(const api_block *b, bool full, const char *status) {
    const char *t = full && b->text.p ? b->text.p : "";
    size_t n = full ? b->text.len : 0;
    if (b->kind == CP_REASONING)
        return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}], s:s}", "id", b->id, "type", "reasoning", "summary", "content", "type",
                         "reasoning_text", "text", t, n, "status", status);
    if (b->kind == CP_CONTENT) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", b->id, "type", "message", "role", "assistant", "status", status, "content");
        if (o && full)
            json_array_append_new(json_object_get(o, "content"),
                                  json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", t, n, "annotations", "logprobs"));
        return o;
    }
    if (full && !n) t = "{}", n = 2; /* a call without arguments */
    return json_pack("{s:s, s:s, s:s, s:s, s:s%, s:s}", "id", b->id, "type", "function_call", "call_id", b->call_id, "name",
                     b->name ? b->name : "", "arguments", t, n, "status", status);
}

static json_t *part_json(const api_block *b, bool full) {
    const char *t = full && b->text.p ? b->text.p : "";
    size_t n = full ? b->text.len : 0;
    if (b->kind == CP_REASONING) return json_pack("{s:s, s:s%}", "type", "reasoning_text", "text", t, n);
    return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", t, n, "annotations", "logprobs");
}

/* The response object; final: with output and usage. */
static json_t *response_json(job *j, const char *status, bool final) {
    api_state *st = j->api;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s, s:[]}", "id", st->id, "object", "response", "created_at",
                          (json_int_t)st->created, "status", status, "error", "incomplete_details", "model", j->srv->model_name, "output");
    if (!o) return NULL;
    json_object_update(o, st->echo);
    json_object_set_new(o, "usage", final ? usage_json(j) : json_null());
    if (!final) return o;
    const char *item_status = !strcmp(status, "incomplete") ? "incomplete" : "completed";
    json_t *out = json_object_get(o, "output");
    for (int i = 0; i < st->nb; i++)
        json_array_append_new(out, item_json(&st->b[i], true, i == st->nb - 1 ? item_status : "completed"));
    if (!strcmp(status, "incomplete") && j->res.finish == TD_FINISH_LENGTH)
        json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    return o;
}

/* One event: type first, then the fields, then its sequence number. Steals fields. */
static int event(job *j, const char *type, json_t *fields) {
    json_t *o = json_pack("{s:s}", "type", type);
    if (!o || !fields) {
        json_decref(o);
        json_decref(fields);
        return -1;
    }
    json_object_update(o, fields);
    json_decref(fields);
    json_object_set_new(o, "sequence_number", json_integer(j->api->seq++));
    return td_api_sse(j, type, o);
}

int td_resp_begin(job *j) {
    return event(j, "response.created", json_pack("{s:o}", "response", response_json(j, "in_progress", false))) ||
                   event(j, "response.in_progress", json_pack("{s:o}", "response", response_json(j, "in_progress", false)))
               ? -1
               : 0;
}

int td_resp_open(job *j, int bi) {
    api_block *b = &j->api->b[bi];
    if (event(j, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", bi, "item", item_json(b, false, "in_progress"))))
        return -1;
    if (b->kind == CP_TOOL_START) return 0;
    return event(j, "response.content_part.added",
                 json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->id, "output_index", bi, "content_index", 0, "part", part_json(b, false)));
}

int td_resp_delta(job *j, int bi, const char *text, size_t len) {
    api_block *b = &j->api->b[bi];
    if (b->kind == CP_TOOL_START)
        return event(j, "response.function_call_arguments.delta",
                     json_pack("{s:s, s:i, s:s%}", "item_id", b->id, "output_index", bi, "delta", text, len));
    if (b->kind == CP_REASONING)
        return event(j, "response.reasoning_text.delta",
                     json_pack("{s:s, s:i, s:i, s:s%}", "item_id", b->id, "output_index", bi, "content_index", 0, "delta", text, len));
    return event(j, "response.output_text.delta",
                 json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", b->id, "output_index", bi, "content_index", 0, "delta", text, len,
                           "logprobs"));
}

int td_resp_close(job *j, int bi, bool complete) {
    api_block *b = &j->api->b[bi];
    const char *status = complete ? "completed" : "incomplete";
    const char *t = b->text.p ? b->text.p : "";
    int rc;
    if (b->kind == CP_TOOL_START) {
        if (!b->text.len) t = "{}";
        rc = event(j, "response.function_call_arguments.done",
                   json_pack("{s:s, s:i, s:s, s:s}", "item_id", b->id, "output_index", bi, "name", b->name ? b->name : "", "arguments", t));
    } else {
        if (b->kind == CP_REASONING)
            rc = event(j, "response.reasoning_text.done",
                       json_pack("{s:s, s:i, s:i, s:s%}", "item_id", b->id, "output_index", bi, "content_index", 0, "text", t, b->text.len));
        else
            rc = event(j, "response.output_text.done",
                       json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", b->id, "output_index", bi, "content_index", 0, "text", t,
                                 b->text.len, "logprobs"));
        rc = rc || event(j, "response.content_part.done",
                         json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->id, "output_index", bi, "content_index", 0, "part", part_json(b, true)));
    }
    return rc || event(j, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", bi, "item", item_json(b, true, status)));
}

/* The conversation for the store: the request's messages and this output as
 * an assistant turn (text, reasoning_content, tool_calls), JSON text. */
static char *conv_with_output(api_state *st) {
    json_t *m = json_pack("{s:s}", "role", "assistant"), *calls = json_array();
    sbuf text = {0}, reasoning = {0};
    int bad = !m || !calls;
    for (int i = 0; !bad && i < st->nb; i++) {
        api_block *b = &st->b[i];
        if (b->kind == CP_CONTENT) bad |= td_sb_add(&text, b->text.p ? b->text.p : "", b->text.len);
        else if (b->kind == CP_REASONING) bad |= td_sb_add(&reasoning, b->text.p ? b->text.p : "", b->text.len);
        else
            bad |= json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", b->call_id, "type", "function", "function", "name",
                                                          b->name ? b->name : "", "arguments", b->text.len ? b->text.p : "{}"));
    }
    char *out = NULL;
    if (!bad) {
        json_object_set_new(m, "content", json_stringn(text.p ? text.p : "", text.len));
        if (reasoning.len) json_object_set_new(m, "reasoning_content", json_stringn(reasoning.p, reasoning.len));
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        json_t *conv = json_copy(st->conv);
        if (conv && !json_array_append(conv, m)) out = json_dumps(conv, JSON_COMPACT);
        json_decref(conv);
    }
    json_decref(m);
    json_decref(calls);
    td_sb_free(&text);
    td_sb_free(&reasoning);
    return out;
}

static void store_response(job *j, const json_t *resp) {
    api_state *st = j->api;
    if (!st->store || j->srv->cfg.responses_store_max < 0) return;
    store_put(j->srv, st->id, json_dumps(resp, JSON_COMPACT), conv_with_output(st));
}

/* Cut by the length, or cancelled (the server shutting down): incomplete. */
static const char *final_status(const job *j) {
    return j->res.finish == TD_FINISH_LENGTH || j->res.finish == TD_FINISH_CANCEL ? "incomplete" : "completed";
}

static json_t *failed_json(job *j) {
    json_t *o = response_json(j, "failed", true);
    if (o) json_object_set_new(o, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", j->error));
    return o;
}

int td_resp_finish_stream(job *j) {
    api_state *st = j->api;
    if (j->error[0]) return event(j, "response.failed", json_pack("{s:o}", "response", failed_json(j)));
    int rc = 0;
    if (!st->nb) { /* nothing came out: an empty message, so output_text is "" */
        rc = !td_api_block_add(st, CP_CONTENT) || td_resp_open(j, 0) || td_resp_close(j, 0, true);
    }
    const char *status = final_status(j);
    json_t *r = response_json(j, status, true);
    if (r) store_response(j, r);
    return rc | event(j, !strcmp(status, "incomplete") ? "response.incomplete" : "response.completed", r ? json_pack("{s:o}", "response", r) : NULL);
}

void td_resp_finish_body(job *j) {
    json_t *o;
    if (j->error[0]) {
        o = json_pack("{s:{s:s, s:s, s:i}}", "error", "message", j->error, "type", "server_error", "code", 500);
        j->body_status = 500;
    } else {
        o = response_json(j, final_status(j), true);
        if (o) store_response(j, o);
        j->body_status = 200;
    }
    j->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!j->body) j->body_status = 500;
}
