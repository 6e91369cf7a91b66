/* The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens)
 * on top of the chat path (see api.h).
 *
 * Request: `system`, `messages` with string or block content (text,
 * tool_use, tool_result, thinking / redacted_thinking), tools
 * ({name, description, input_schema}), tool_choice (auto, any, tool, none),
 * max_tokens (required, as Anthropic), stop_sequences, temperature / top_p /
 * top_k and `thinking` ({type: enabled|disabled}: the template's
 * enable_thinking) become a chat-completions body.
 *
 * Output: the message object, or the stream the anthropic SDK parses:
 * message_start, ping, content_block_start / _delta (text_delta,
 * thinking_delta, input_json_delta) / _stop per block, message_delta (stop
 * reason, usage), message_stop; a failure mid-stream is an `error` event.
 *
 * Usage follows Anthropic: input_tokens counts the prompt tokens not read
 * from the prefix cache, cache_read_input_tokens those that were (their sum
 * is the prompt, what count_tokens returns). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/api.h"
#include "util/err.h"

#define BAD(e, ...) (td_http_err_set((e), 400, "invalid_request_error", __VA_ARGS__), -1)
#define NOMEM(e) (td_http_err_set((e), 500, "server_error", "out of memory"), -1)

static bool absent(const json_t *v) { return !v || json_is_null(v); }

static const char *const TEXT_BLOCKS[] = {"text", NULL};

/* ---- request translation --------------------------------------------------- */

static int flush_user(json_t *msgs, sbuf *text, bool force, http_err *e) {
    if (!text->len && !force) return 0;
    json_t *c = json_stringn(text->p ? text->p : "", text->len);
    td_sb_clear(text);
    if (!c) return BAD(e, "message text is not valid UTF-8");
    return json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "user", "content", c)) ? NOMEM(e) : 0;
}

/* A user turn: text blocks join into user messages; each tool_result is a
 * chat tool message, in the order given. */
static int user_blocks(const json_t *blocks, size_t mi, json_t *msgs, http_err *e) {
    sbuf text = {0};
    size_t i;
    const json_t *b;
    bool any_tool = false;
    json_array_foreach(blocks, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !type) {
            td_sb_free(&text);
            return BAD(e, "messages[%zu].content[%zu] must be a block with a 'type'", mi, i);
        }
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                td_sb_free(&text);
                return BAD(e, "messages[%zu].content[%zu]: a text block needs a string 'text'", mi, i);
            }
            if ((text.len && td_sb_adds(&text, "\n")) || td_sb_add(&text, json_string_value(t), json_string_length(t))) {
                td_sb_free(&text);
                return NOMEM(e);
            }
        } else if (!strcmp(type, "tool_result")) {
            const json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content");
            if (!json_is_string(id)) {
                td_sb_free(&text);
                return BAD(e, "messages[%zu].content[%zu]: a tool_result needs a string 'tool_use_id'", mi, i);
            }
            char what[80];
            snprintf(what, sizeof what, "messages[%zu].content[%zu].content", mi, i);
            json_t *ct = absent(c) ? json_string("") : td_api_text_of(c, TEXT_BLOCKS, "\n", what, e);
            if (!ct || flush_user(msgs, &text, false, e) ||
                json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", ct))) {
                td_sb_free(&text);
                return e->status ? -1 : NOMEM(e);
            }
            any_tool = true;
        } else {
            td_sb_free(&text);
            return BAD(e, "messages[%zu].content[%zu]: block type '%.64s' is not supported in a user turn (text and tool_result)", mi, i, type);
        }
    }
    int rc = flush_user(msgs, &text, !any_tool, e);
    td_sb_free(&text);
    return rc;
}

/* An assistant turn: text, tool_use (a chat tool call) and thinking
 * (reasoning_content) blocks become one chat assistant message. */
static int assistant_blocks(const json_t *blocks, size_t mi, json_t *msgs, http_err *e) {
    sbuf text = {0}, think = {0};
    json_t *calls = json_array();
    size_t i;
    const json_t *b;
    int rc = calls ? 0 : NOMEM(e);
    json_array_foreach(blocks, i, b) {
        if (rc) break;
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !type) {
            rc = BAD(e, "messages[%zu].content[%zu] must be a block with a 'type'", mi, i);
        } else if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
            bool th = type[1] == 'h';
            const json_t *t = json_object_get(b, th ? "thinking" : "text");
            sbuf *dst = th ? &think : &text;
            if (!json_is_string(t)) rc = BAD(e, "messages[%zu].content[%zu]: a %s block needs a string '%s'", mi, i, type, th ? "thinking" : "text");
            else if (td_sb_add(dst, json_string_value(t), json_string_length(t))) rc = NOMEM(e);
        } else if (!strcmp(type, "redacted_thinking")) {
            /* encrypted: nothing to show the model */
        } else if (!strcmp(type, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || (!absent(input) && !json_is_object(input))) {
                rc = BAD(e, "messages[%zu].content[%zu]: a tool_use needs string 'id' and 'name' and an object 'input'", mi, i);
            } else {
                char *args = absent(input) ? strdup("{}") : json_dumps(input, JSON_COMPACT);
                json_t *c = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name, "arguments", args)
                                 : NULL;
                free(args);
                if (!c || json_array_append_new(calls, c)) rc = NOMEM(e);
            }
        } else {
            rc = BAD(e, "messages[%zu].content[%zu]: block type '%.64s' is not supported in an assistant turn", mi, i, type);
        }
    }
    json_t *m = rc ? NULL : json_pack("{s:s, s:s%}", "role", "assistant", "content", text.p ? text.p : "", text.len);
    if (!rc && !m) rc = BAD(e, "messages[%zu]: text is not valid UTF-8", mi);
    if (!rc && think.len) json_object_set_new(m, "reasoning_content", json_stringn(think.p, think.len));
    if (!rc && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (!rc && json_array_append_new(msgs, m)) rc = NOMEM(e);
    else if (rc) json_decref(m);
    json_decref(calls);
    td_sb_free(&text);
    td_sb_free(&think);
    return rc;
}

static int translate_tools(const json_t *in, json_t *chat, http_err *e) {
    const json_t *tools = json_object_get(in, "tools"), *t;
    size_t i;
    if (!absent(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) > API_MAX_TOOLS) return BAD(e, "tools: must be an array of at most %d tools", API_MAX_TOOLS);
        json_t *out = json_array();
        if (!out) return NOMEM(e);
        json_object_set_new(chat, "tools", out);
        json_array_foreach(tools, i, t) {
            const char *type = json_string_value(json_object_get(t, "type"));
            const json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
            if (type && strcmp(type, "custom"))
                return BAD(e, "tools.%zu: tool type '%.64s' is not supported (custom tools only)", i, type);
            if (!json_is_object(t) || !json_is_string(name)) return BAD(e, "tools.%zu.name: Field required", i);
            if (!absent(schema) && !json_is_object(schema)) return BAD(e, "tools.%zu.input_schema: must be an object", i);
            json_t *f = json_pack("{s:O}", "name", name);
            if (!f) return NOMEM(e);
            if (!absent(schema)) json_object_set(f, "parameters", (json_t *)schema);
            td_api_pass(f, t, (const char *const[]){"description", "strict", NULL});
            if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f))) return NOMEM(e);
        }
    }
    const json_t *tc = json_object_get(in, "tool_choice");
    if (absent(tc)) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type) return BAD(e, "tool_choice: must be an object with a 'type'");
    if (!strcmp(type, "auto") || !strcmp(type, "none")) json_object_set_new(chat, "tool_choice", json_string(type));
    else if (!strcmp(type, "any")) json_object_set_new(chat, "tool_choice", json_string("required"));
    else if (!strcmp(type, "tool")) {
        const json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) return BAD(e, "tool_choice.name: Field required");
        json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    } else {
        return BAD(e, "tool_choice.type: must be auto, any, tool or none, got '%.64s'", type);
    }
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use"))) json_object_set_new(chat, "parallel_tool_calls", json_false());
    return 0;
}

int td_anth_translate(srv *s, const json_t *in, json_t *chat, bool count_only, http_err *e) {
    (void)s;
    json_t *msgs = json_array();
    if (!msgs) return NOMEM(e);
    json_object_set_new(chat, "messages", msgs);
    td_api_pass(chat, in, (const char *const[]){"model", "temperature", "top_p", "top_k", "num_speculative_tokens", "seed", NULL});
    if (!count_only) {
        const json_t *mt = json_object_get(in, "max_tokens");
        if (absent(mt)) return BAD(e, "max_tokens: Field required");
        if (!json_is_integer(mt) || json_integer_value(mt) < 1) return BAD(e, "max_tokens: must be a positive integer");
        json_object_set(chat, "max_tokens", (json_t *)mt);
        td_api_pass(chat, in, (const char *const[]){"stream", NULL});
    }
    const json_t *ss = json_object_get(in, "stop_sequences");
    if (!absent(ss)) {
        if (!json_is_array(ss)) return BAD(e, "stop_sequences: must be an array of strings");
        json_object_set(chat, "stop", (json_t *)ss);
    }
    const json_t *sys = json_object_get(in, "system");
    if (!absent(sys)) {
        json_t *t = td_api_text_of(sys, TEXT_BLOCKS, "\n", "system", e);
        if (!t) return -1;
        if (json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", t))) return NOMEM(e);
    }
    const json_t *ms = json_object_get(in, "messages"), *m;
    size_t i;
    if (absent(ms)) return BAD(e, "messages: Field required");
    if (!json_is_array(ms) || json_array_size(ms) > API_MAX_ITEMS) return BAD(e, "messages: must be an array of at most %d messages", API_MAX_ITEMS);
    json_array_foreach(ms, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *c = json_object_get(m, "content");
        if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
            return BAD(e, "messages.%zu.role: must be user or assistant", i);
        if (json_is_string(c)) {
            if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", c))) return NOMEM(e);
            continue;
        }
        if (!json_is_array(c) || json_array_size(c) > API_MAX_PARTS)
            return BAD(e, "messages.%zu.content: must be a string or an array of at most %d blocks", i, API_MAX_PARTS);
        if ((role[0] == 'u' ? user_blocks : assistant_blocks)(c, i, msgs, e)) return -1;
    }
    if (json_array_size(ms) == 0) return BAD(e, "messages: at least one message is required");
    if (translate_tools(in, chat, e)) return -1;
    const json_t *th = json_object_get(in, "thinking");
    if (!absent(th)) {
        const char *type = json_string_value(json_object_get(th, "type"));
        if (!json_is_object(th) || !type || (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive")))
            return BAD(e, "thinking.type: must be enabled or disabled");
        json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", strcmp(type, "disabled") != 0));
    }
    return 0;
}

/* ---- count_tokens ---------------------------------------------------------- */

void td_ep_count_tokens(srv *s, task *t) {
    http_err *e = &t->e;
    json_error_t je;
    json_t *b = json_loadb(t->body, t->len, JSON_REJECT_DUPLICATES, &je), *chat = json_object();
    oai_req r;
    memset(&r, 0, sizeof r);
    char *text = NULL;
    size_t tl = 0, n = 0;
    int32_t *ids = NULL;
    td_err err = {0};
    if (!chat) td_http_err_set(e, 500, "server_error", "out of memory");
    else if (!json_is_object(b)) td_http_err_set(e, 400, "invalid_request_error", "the request body must be a JSON object");
    else if (!td_anth_translate(s, b, chat, true, e) && !td_oai_parse(s, chat, OAI_CHAT, &r, e) && !td_oai_render_chat(s, &r, &text, &tl, e) &&
             td_tok_encode(s->tok, text, tl, false, &ids, &n, &err))
        td_http_err_set(e, 400, "invalid_request_error", "cannot tokenize the prompt: %.400s", td_err_text(&err));
    if (!e->status) {
        json_t *o = json_pack("{s:i}", "input_tokens", (int)n);
        t->reply = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (t->reply) t->status = 200;
        else td_http_err_set(e, 500, "server_error", "out of memory");
    }
    free(ids);
    free(text);
    td_oai_req_free(&r);
    json_decref(chat);
    json_decref(b);
}

/* ---- output ---------------------------------------------------------------- */

static const char *stop_reason(const job *j) {
    if (j->res.finish == TD_FINISH_LENGTH) return "max_tokens";
    if (j->n_calls) return "tool_use";
    if (td_api_stop_sequence(j)) return "stop_sequence";
    return "end_turn";
}

static json_t *usage_json(const job *j, bool final) {
    int cached = final ? j->res.n_reused : 0;
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", j->n_prompt - cached, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", cached, "output_tokens", final ? j->res.n_generated : 0);
}

static json_t *block_json(const api_block *b, bool full) {
    const char *t = full && b->text.p ? b->text.p : "";
    size_t n = full ? b->text.len : 0;
    if (b->kind == CP_REASONING) return json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", t, n, "signature", "");
    if (b->kind == CP_CONTENT) return json_pack("{s:s, s:s%}", "type", "text", "text", t, n);
    json_t *input = full && n ? json_loadb(t, n, 0, NULL) : NULL;
    if (!json_is_object(input)) { /* arguments that are not an object: an empty input */
        json_decref(input);
        input = json_object();
    }
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", b->id, "name", b->name ? b->name : "", "input", input);
}

static json_t *message_json(job *j, bool final) {
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}", "id", j->api->id, "type", "message", "role", "assistant", "model",
                          j->srv->model_name, "content", "stop_reason", "stop_sequence", "usage", usage_json(j, final));
    if (!o || !final) return o;
    api_state *st = j->api;
    json_t *c = json_object_get(o, "content");
    for (int i = 0; i < st->nb; i++) {
        if (st->b[i].kind == CP_CONTENT && !st->b[i].text.len && st->nb > 1) continue; /* no empty text beside other blocks */
        json_array_append_new(c, block_json(&st->b[i], true));
    }
    const char *sq = td_api_stop_sequence(j);
    json_object_set_new(o, "stop_reason", json_string(stop_reason(j)));
    json_object_set_new(o, "stop_sequence", sq && !strcmp(stop_reason(j), "stop_sequence") ? json_string(sq) : json_null());
    return o;
}

static json_t *error_json(const char *type, const char *msg) {
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", msg);
}

/* data carries its type first, as Anthropic's stream does. Steals fields. */
static int event(job *j, const char *type, json_t *fields) {
    json_t *o = json_pack("{s:s}", "type", type);
    if (!o || !fields) {
        json_decref(o);
        json_decref(fields);
        return -1;
    }
    json_object_update(o, fields);
    json_decref(fields);
    return td_api_sse(j, type, o);
}

int td_anth_begin(job *j) {
    return event(j, "message_start", json_pack("{s:o}", "message", message_json(j, false))) || event(j, "ping", json_object()) ? -1 : 0;
}

int td_anth_open(job *j, int bi) {
    return event(j, "content_block_start", json_pack("{s:i, s:o}", "index", bi, "content_block", block_json(&j->api->b[bi], false)));
}

int td_anth_delta(job *j, int bi, const char *text, size_t len) {
    api_block *b = &j->api->b[bi];
    json_t *d = b->kind == CP_REASONING ? json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", text, len)
                : b->kind == CP_CONTENT ? json_pack("{s:s, s:s%}", "type", "text_delta", "text", text, len)
                                        : json_pack("{s:s, s:s%}", "type", "input_json_delta", "partial_json", text, len);
    return event(j, "content_block_delta", json_pack("{s:i, s:o}", "index", bi, "delta", d));
}

int td_anth_close(job *j, int bi) { return event(j, "content_block_stop", json_pack("{s:i}", "index", bi)); }

int td_anth_finish_stream(job *j) {
    if (j->error[0]) return td_api_sse(j, "error", error_json("api_error", j->error));
    const char *sq = td_api_stop_sequence(j), *why = stop_reason(j);
    json_t *d = json_pack("{s:{s:s, s:o}, s:o}", "delta", "stop_reason", why, "stop_sequence",
                          sq && !strcmp(why, "stop_sequence") ? json_string(sq) : json_null(), "usage", usage_json(j, true));
    return event(j, "message_delta", d) || event(j, "message_stop", json_object()) ? -1 : 0;
}

void td_anth_finish_body(job *j) {
    json_t *o;
    if (j->error[0]) {
        o = error_json("api_error", j->error);
        j->body_status = 500;
    } else {
        o = message_json(j, true);
        j->body_status = 200;
    }
    j->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!j->body) j->body_status = 500;
}

/* ---- errors ---------------------------------------------------------------- */

/* Anthropic's error type for an HTTP status. */
static const char *error_type(int status) {
    switch (status) {
    case 400: case 405: case 413: case 501: return status == 413 ? "request_too_large" : "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: case 503: case 529: return "overloaded_error";
    default: return "api_error";
    }
}

json_t *td_anth_error_body(int status, const char *msg) { return error_json(error_type(status), msg); }
