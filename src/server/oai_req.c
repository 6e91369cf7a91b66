/* OpenAI request parsing and validation (chat completions, completions,
 * tokenize). Bodies are untrusted: every field is type- and range-checked;
 * unknown fields are ignored. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/srv_internal.h"

void td_http_err_set(http_err *e, int status, const char *type, const char *fmt, ...) {
    va_list ap;
    memset(e, 0, sizeof *e);
    e->status = status;
    e->type = type;
    va_start(ap, fmt);
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->msg) { /* cut: drop a partial last character */
        size_t len = strlen(e->msg), k = len, cont = 0;
        while (k > 0 && cont < 3 && ((unsigned char)e->msg[k - 1] & 0xc0) == 0x80) k--, cont++;
        unsigned char lead = k > 0 ? (unsigned char)e->msg[k - 1] : 0;
        size_t need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
        if (k > 0 && lead >= 0xc0 && cont + 1 < need) e->msg[k - 1] = 0;
    }
}

#define BAD(e, ...) (td_http_err_set((e), 400, "invalid_request_error", __VA_ARGS__), -1)

static bool absent(const json_t *v) { return !v || json_is_null(v); }

/* An error naming the request field it is about. */
#define BADP(e, p, ...) (td_http_err_set((e), 400, "invalid_request_error", __VA_ARGS__), (e)->param = (p), -1)

/* logit_bias: {"token id": bias in [-100, 100]} (OpenAI, vLLM). */
static int logit_bias_field(srv *s, const json_t *b, oai_req *r, http_err *e) {
    const json_t *lb = json_object_get(b, "logit_bias");
    if (absent(lb)) return 0;
    if (!json_is_object(lb)) return BADP(e, "logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    size_t n = json_object_size(lb), i = 0;
    if (n > (1u << 16)) return BADP(e, "logit_bias", "'logit_bias' holds at most 65536 tokens");
    if (!n) return 0;
    r->logit_bias = malloc(n * sizeof *r->logit_bias);
    if (!r->logit_bias) return BAD(e, "out of memory");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)lb, k, v) {
        char *end = NULL;
        long long id = strtoll(k, &end, 10);
        if (!*k || *end || id < 0 || id >= s->vocab)
            return BADP(e, "logit_bias", "'logit_bias' key '%.32s' is not a token id below %d", k, s->vocab);
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
            return BADP(e, "logit_bias", "'logit_bias' values must be numbers between -100 and 100 (token %lld)", id);
        r->logit_bias[i++] = (td_logit_bias){.token = (int32_t)id, .bias = (float)json_number_value(v)};
    }
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.n_logit_bias = (int)i;
    return 0;
}

/* Number field in [lo, hi]. Returns 1 when set, 0 when absent, -1 bad. */
static int num_field(const json_t *o, const char *k, double lo, double hi, double *out, http_err *e) {
    const json_t *v = json_object_get(o, k);
    if (absent(v)) return 0;
    if (!json_is_number(v)) return BAD(e, "'%s' must be a number", k);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return BAD(e, "'%s' must be between %g and %g, got %g", k, lo, hi, d);
    *out = d;
    return 1;
}

static int int_field(const json_t *o, const char *k, long long lo, long long hi, long long *out, http_err *e) {
    const json_t *v = json_object_get(o, k);
    if (absent(v)) return 0;
    if (!json_is_integer(v)) return BAD(e, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return BAD(e, "'%s' must be between %lld and %lld, got %lld", k, lo, hi, x);
    *out = x;
    return 1;
}

static int bool_field(const json_t *o, const char *k, bool *out, http_err *e) {
    const json_t *v = json_object_get(o, k);
    if (absent(v)) return 0;
    if (!json_is_boolean(v)) return BAD(e, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 1;
}

static int sampling_fields(const json_t *b, oai_req *r, http_err *e) {
    double d;
    long long x;
    int rc;
    td_sampling *s = &r->sampling;
    if ((rc = num_field(b, "temperature", 0, 100, &d, e)) < 0) return -1;
    /* below vLLM's _SAMPLING_EPS (1e-5) is greedy: 1/T would overflow the logits */
    if (rc) s->temperature = d < 1e-5 ? 0.0f : (float)d;
    if ((rc = num_field(b, "top_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) {
        if (d <= 0) return BAD(e, "'top_p' must be in (0, 1]");
        s->top_p = d < 1e-30 ? 1e-30f : (float)d; /* a positive top_p keeps the top token, even below float's range */
    }
    if ((rc = int_field(b, "top_k", -1, 1 << 30, &x, e)) < 0) return -1;
    if (rc) s->top_k = x < 0 ? 0 : (int)x;
    if ((rc = num_field(b, "min_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) s->min_p = (float)d;
    if ((rc = num_field(b, "repetition_penalty", 1e-6, 100, &d, e)) < 0) return -1;
    if (rc) s->repetition_penalty = (float)d;
    if ((rc = num_field(b, "presence_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) s->presence_penalty = (float)d;
    if ((rc = num_field(b, "frequency_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) s->frequency_penalty = (float)d;
    const json_t *seed = json_object_get(b, "seed");
    if (!absent(seed)) {
        if (!json_is_integer(seed)) return BAD(e, "'seed' must be an integer");
        s->seed = (uint64_t)json_integer_value(seed);
        r->seed_set = true;
    }
    return 0;
}

static int stop_fields(srv *sv, const json_t *b, oai_req *r, http_err *e) {
    const json_t *st = json_object_get(b, "stop");
    if (json_is_string(st)) {
        if (json_string_length(st) == 0) return 0;
        if (json_string_length(st) > STOP_MAX_LEN) return BAD(e, "'stop' strings are limited to %d bytes", STOP_MAX_LEN);
        if (!(r->stops[0] = strdup(json_string_value(st)))) return BAD(e, "out of memory");
        r->n_stops = 1;
    } else if (json_is_array(st)) {
        size_t i;
        const json_t *v;
        if (json_array_size(st) > STOP_MAX) return BAD(e, "at most %d stop strings", STOP_MAX);
        json_array_foreach(st, i, v) {
            if (!json_is_string(v)) return BAD(e, "'stop' must be a string or an array of strings");
            if (json_string_length(v) == 0) continue;
            if (json_string_length(v) > STOP_MAX_LEN) return BAD(e, "'stop' strings are limited to %d bytes", STOP_MAX_LEN);
            if (!(r->stops[r->n_stops] = strdup(json_string_value(v)))) return BAD(e, "out of memory");
            r->n_stops++;
        }
    } else if (!absent(st)) {
        return BAD(e, "'stop' must be a string or an array of strings");
    }
    const json_t *ids = json_object_get(b, "stop_token_ids");
    if (!absent(ids)) {
        size_t i;
        const json_t *v;
        if (!json_is_array(ids) || json_array_size(ids) > 64) return BAD(e, "'stop_token_ids' must be an array of at most 64 token ids");
        json_array_foreach(ids, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= sv->vocab)
                return BAD(e, "'stop_token_ids' must hold token ids below %d", sv->vocab);
            r->stop_ids[r->n_stop_ids++] = (int32_t)json_integer_value(v);
        }
    }
    if (bool_field(b, "include_stop_str_in_output", &r->include_stop, e) < 0) return -1;
    return 0;
}

/* Flattens OpenAI content (string, null, or parts) to a string. */
static int flatten_content(const json_t *c, json_t **out, http_err *e) {
    if (absent(c)) { *out = json_string(""); return *out ? 0 : BAD(e, "out of memory"); }
    if (json_is_string(c)) { *out = json_incref((json_t *)c); return 0; }
    if (!json_is_array(c)) return BAD(e, "message 'content' must be a string or an array of content parts");
    sbuf b = {0};
    size_t i;
    const json_t *p;
    int n = 0;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const char *text = json_string_value(json_object_get(p, "text"));
        if (!json_is_object(p) || !type) { td_sb_free(&b); return BAD(e, "content parts must be objects with a 'type'"); }
        if (strcmp(type, "text") != 0 && strcmp(type, "input_text") != 0) {
            td_sb_free(&b);
            return BAD(e, "content part type '%.64s' is not supported (text only)", type);
        }
        if (!text) { td_sb_free(&b); return BAD(e, "text content parts need a string 'text'"); }
        if ((n++ && td_sb_adds(&b, "\n")) || td_sb_adds(&b, text)) { td_sb_free(&b); return BAD(e, "out of memory"); }
    }
    *out = json_stringn(b.p ? b.p : "", b.len);
    td_sb_free(&b);
    return *out ? 0 : BAD(e, "out of memory");
}

static int norm_tool_calls(const json_t *tc, json_t *m, http_err *e) {
    if (absent(tc)) return 0;
    if (!json_is_array(tc)) return BAD(e, "'tool_calls' must be an array");
    json_t *arr = json_array();
    size_t i;
    const json_t *c;
    json_array_foreach(tc, i, c) {
        const json_t *f = json_object_get(c, "function");
        const json_t *name = json_object_get(f, "name");
        if (!json_is_object(c) || !json_is_object(f) || !json_is_string(name)) {
            json_decref(arr);
            return BAD(e, "each tool call needs a function with a string 'name'");
        }
        json_t *nc = json_deep_copy(c), *nf = json_object_get(nc, "function");
        const json_t *args = json_object_get(f, "arguments");
        if (json_is_string(args)) { /* templates iterate arguments as a mapping */
            json_t *o = json_loads(json_string_value(args), 0, NULL);
            if (json_is_object(o)) json_object_set(nf, "arguments", o);
            json_decref(o);
        } else if (absent(args)) {
            json_object_set_new(nf, "arguments", json_object());
        }
        json_array_append_new(arr, nc);
    }
    json_object_set_new(m, "tool_calls", arr);
    return 0;
}

int td_oai_chat_fields(const json_t *b, oai_req *r, http_err *e) {
    const json_t *msgs = json_object_get(b, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) return BAD(e, "'messages' must be a non-empty array");
    if (json_array_size(msgs) > 100000) return BAD(e, "too many messages");
    r->messages = json_array();
    if (!r->messages) return BAD(e, "out of memory");
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) return BAD(e, "messages[%zu] must be an object", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return BAD(e, "messages[%zu] needs a string 'role'", i);
        if (!strcmp(role, "developer")) role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))
            return BAD(e, "messages[%zu]: unknown role '%.32s'", i, role);
        json_t *nm = json_deep_copy(m), *content = NULL;
        if (!nm) return BAD(e, "out of memory");
        json_array_append_new(r->messages, nm);
        json_object_set_new(nm, "role", json_string(role));
        if (flatten_content(json_object_get(m, "content"), &content, e)) {
            char why[sizeof e->msg];
            snprintf(why, sizeof why, "%s", e->msg);
            return BAD(e, "messages[%zu]: %s", i, why);
        }
        json_object_set_new(nm, "content", content);
        if (!strcmp(role, "assistant") && norm_tool_calls(json_object_get(m, "tool_calls"), nm, e)) return -1;
        const json_t *rc = json_object_get(m, "reasoning_content"), *rn = json_object_get(m, "reasoning");
        if (!absent(rc) && !json_is_string(rc)) return BAD(e, "messages[%zu]: 'reasoning_content' must be a string", i);
        if (!absent(rn) && !json_is_string(rn)) return BAD(e, "messages[%zu]: 'reasoning' must be a string", i);
        /* vLLM's newer name: templates read reasoning_content */
        if (absent(rc) && json_is_string(rn)) json_object_set(nm, "reasoning_content", (json_t *)rn);
    }
    const json_t *tools = json_object_get(b, "tools");
    if (!absent(tools)) {
        if (!json_is_array(tools)) return BAD(e, "'tools' must be an array");
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *f = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_object(f) || !json_is_string(json_object_get(f, "name")))
                return BAD(e, "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
            const json_t *p = json_object_get(f, "parameters");
            if (!absent(p) && !json_is_object(p)) return BAD(e, "tools[%zu].function.parameters must be an object", i);
        }
        if (json_array_size(tools)) r->tools = json_incref((json_t *)tools);
    }
    r->parse_tools = r->tools != NULL;
    const json_t *tc = json_object_get(b, "tool_choice");
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "none")) r->parse_tools = false;
        else if (strcmp(s, "auto") && strcmp(s, "required")) return BAD(e, "'tool_choice' must be none, auto, required or a function");
    } else if (!absent(tc) && !json_is_object(tc)) {
        return BAD(e, "'tool_choice' must be a string or an object");
    }
    r->kwargs = json_object();
    if (!r->kwargs) return BAD(e, "out of memory");
    const json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (!absent(kw)) {
        if (!json_is_object(kw)) return BAD(e, "'chat_template_kwargs' must be an object");
        json_object_update(r->kwargs, (json_t *)kw);
    }
    r->thinking = true;
    const json_t *th = json_object_get(r->kwargs, "enable_thinking");
    if (json_is_boolean(th)) r->thinking = json_is_true(th);
    else if (!absent(th)) return BAD(e, "'chat_template_kwargs.enable_thinking' must be a boolean");
    r->add_generation_prompt = true;
    if (bool_field(b, "add_generation_prompt", &r->add_generation_prompt, e) < 0) return -1;
    if (bool_field(b, "continue_final_message", &r->continue_final, e) < 0) return -1;
    if (r->continue_final && r->add_generation_prompt) /* vLLM's rule; add_generation_prompt defaults to true */
        return BADP(e, "continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    if (r->continue_final &&
        strcmp(json_string_value(json_object_get(json_array_get(r->messages, json_array_size(r->messages) - 1), "role")), "assistant"))
        return BADP(e, "continue_final_message", "'continue_final_message' needs an assistant message last");
    return 0;
}

/* Last occurrence of n bytes of needle in hay (h bytes), or NULL. */
static const char *rfind(const char *hay, size_t h, const char *needle, size_t n) {
    if (n > h) return NULL;
    for (size_t i = h - n + 1; i-- > 0;)
        if (!memcmp(hay + i, needle, n)) return hay + i;
    return NULL;
}

/* continue_final_message: the rendered chat cut right after the final
 * assistant content, as transformers does (rindex of the content, then of
 * the content stripped: some templates trim messages), so the model
 * continues that message instead of starting a new turn. */
static int cut_after_final(const oai_req *r, char *text, size_t *len, http_err *e) {
    const json_t *last = json_array_get(r->messages, json_array_size(r->messages) - 1);
    const char *c = json_string_value(json_object_get(last, "content"));
    size_t n = json_string_length(json_object_get(last, "content"));
    const char *at = c ? rfind(text, *len, c, n) : NULL;
    if (!at && c) {
        while (n && strchr(" \t\r\n", *c)) c++, n--;
        while (n && strchr(" \t\r\n", c[n - 1])) n--;
        at = rfind(text, *len, c, n);
    }
    if (!at) return BADP(e, "continue_final_message", "the final message does not appear in the rendered chat; it cannot be continued");
    *len = (size_t)(at - text) + n;
    text[*len] = 0;
    return 0;
}

/* One completions prompt: a non-empty string or token-id list. */
static int prompt_one(srv *s, const json_t *p, bool ids_ok, http_err *e) {
    if (json_is_string(p)) return json_string_length(p) ? 0 : BADP(e, "prompt", "'prompt' must not be empty");
    if (!ids_ok || !json_is_array(p)) return BADP(e, "prompt", "'prompt' must be a string, a list of strings, a token-id list or a list of token-id lists");
    if (!json_array_size(p)) return BADP(e, "prompt", "'prompt' must not be empty");
    size_t i;
    const json_t *v;
    json_array_foreach(p, i, v) {
        if (!json_is_integer(v)) return BADP(e, "prompt", "'prompt' token-id lists must hold integers");
        long long id = json_integer_value(v);
        if (id < 0 || id >= s->vocab) return BADP(e, "prompt", "prompt token id %lld is out of range [0, %d)", id, s->vocab);
    }
    return 0;
}

/* Completions "prompt": a string, [string, ...], [ids] or [[ids], ...]. A
 * list of several prompts is kept in prompt_list (one choice per prompt, x n);
 * the first goes to prompt_text / prompt_ids like a single prompt. */
static int prompt_field(srv *s, const json_t *b, oai_req *r, http_err *e) {
    const json_t *p = json_object_get(b, "prompt");
    if (json_is_array(p) && json_array_size(p) > 0 && (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        size_t n = json_array_size(p), i;
        const json_t *v;
        bool strs = json_is_string(json_array_get(p, 0));
        if (n > SRV_MAX_CHOICES) return BADP(e, "prompt", "at most %d prompts per request", SRV_MAX_CHOICES);
        json_array_foreach(p, i, v) {
            if (strs != json_is_string(v)) return BADP(e, "prompt", "'prompt' lists must hold only strings or only token-id lists");
            if (prompt_one(s, v, !strs, e)) return -1;
        }
        if (n > 1) r->prompt_list = json_incref((json_t *)p);
        p = json_array_get(p, 0);
    } else if (p && prompt_one(s, p, true, e)) {
        return -1;
    }
    if (json_is_string(p)) {
        r->prompt_text = strdup(json_string_value(p));
        return r->prompt_text ? 0 : BAD(e, "out of memory");
    }
    if (!json_is_array(p)) return BADP(e, "prompt", "'prompt' must be a string or an array of token ids");
    size_t n = json_array_size(p), i;
    const json_t *v;
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return BAD(e, "out of memory");
    json_array_foreach(p, i, v) r->prompt_ids[i] = (int32_t)json_integer_value(v);
    r->n_prompt_ids = n;
    return 0;
}

/* n x prompts choices, each a scheduler request: bounded, and within what
 * the scheduler's slots and queue could ever hold. */
static int choices_check(srv *s, const oai_req *r, size_t n_prompts, http_err *e) {
    size_t total = n_prompts * (size_t)r->n;
    size_t cap = SRV_MAX_CHOICES;
    if (s->cfg.max_num_seqs > 0 && s->cfg.max_queue >= 0 && (size_t)(s->cfg.max_num_seqs + s->cfg.max_queue) < cap)
        cap = (size_t)(s->cfg.max_num_seqs + s->cfg.max_queue);
    if (total > cap)
        return BADP(e, r->n > 1 ? "n" : "prompt", "%zu choices (n = %d x %zu prompts) is over this server's limit of %zu", total, r->n, n_prompts,
                    cap);
    return 0;
}

int td_oai_parse(srv *s, const json_t *b, int kind, oai_req *r, http_err *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->logprobs = -1;
    r->spec_depth = -1;
    r->skip_special = true;
    r->sampling = s->cfg.sampling;
    if (!json_is_object(b)) return BAD(e, "the request body must be a JSON object");
    const json_t *model = json_object_get(b, "model");
    if (!absent(model)) {
        if (!json_is_string(model)) return BAD(e, "'model' must be a string");
        const char *m = json_string_value(model);
        if (strcmp(m, s->model_name) && strcmp(m, s->model_dir)) {
            td_http_err_set(e, 404, "not_found_error", "The model `%.200s` does not exist.", m);
            e->param = "model";
            return -1;
        }
    }
    long long x;
    int rc;
    r->n = 1;
    if ((rc = int_field(b, "n", 1, SRV_MAX_N, &x, e)) < 0) return BADP(e, "n", "'n' must be between 1 and %d", SRV_MAX_N);
    if (rc) r->n = (int)x;
    if (logit_bias_field(s, b, r, e)) return -1;
    if (bool_field(b, "stream", &r->stream, e) < 0) return -1;
    const json_t *so = json_object_get(b, "stream_options");
    if (!absent(so)) {
        if (!json_is_object(so)) return BAD(e, "'stream_options' must be an object");
        if (bool_field(so, "include_usage", &r->include_usage, e) < 0) return -1;
    }
    if ((rc = int_field(b, "max_tokens", 1, 1 << 30, &x, e)) < 0) return -1;
    if (rc) r->max_tokens = (int)x;
    if ((rc = int_field(b, "max_completion_tokens", 1, 1 << 30, &x, e)) < 0) return -1;
    if (rc) r->max_tokens = (int)x;
    if (sampling_fields(b, r, e) || stop_fields(s, b, r, e)) return -1;
    /* tandem extension: this request's MTP draft depth, at most the server's --spec-depth */
    if ((rc = int_field(b, "num_speculative_tokens", 0, s->cfg.spec_depth, &x, e)) < 0) return -1;
    if (rc) r->spec_depth = (int)x;
    if (bool_field(b, "ignore_eos", &r->ignore_eos, e) < 0 || bool_field(b, "skip_special_tokens", &r->skip_special, e) < 0 ||
        bool_field(b, "return_tokens_as_token_ids", &r->tokens_as_ids, e) < 0)
        return -1;
    if (kind == OAI_CHAT) {
        bool lp = false;
        if (bool_field(b, "logprobs", &lp, e) < 0) return -1;
        if ((rc = int_field(b, "top_logprobs", 0, TD_MAX_TOP_LOGPROBS, &x, e)) < 0) return -1;
        if (lp || rc) r->logprobs = rc ? (int)x : 0;
        bool par = true;
        if (bool_field(b, "parallel_tool_calls", &par, e) < 0) return -1;
        r->no_parallel_tools = !par;
        if (td_oai_chat_fields(b, r, e) || td_so_parse(s, b, r, e)) return -1;
        return choices_check(s, r, 1, e);
    }
    if ((rc = int_field(b, "logprobs", 0, TD_MAX_TOP_LOGPROBS, &x, e)) < 0) return -1;
    if (rc) r->logprobs = (int)x;
    if (bool_field(b, "echo", &r->echo, e) < 0) return -1;
    if (prompt_field(s, b, r, e) || td_so_parse(s, b, r, e)) return -1;
    return choices_check(s, r, r->prompt_list ? json_array_size(r->prompt_list) : 1, e);
}

void td_oai_req_free(oai_req *r) {
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->kwargs);
    free(r->prompt_text);
    free(r->prompt_ids);
    free(r->logit_bias);
    json_decref(r->prompt_list);
    td_so_req_free(r);
    memset(r, 0, sizeof *r);
}

int td_oai_render_chat(srv *s, const oai_req *r, char **text, size_t *len, http_err *e) {
    if (!s->chat_tpl) return BAD(e, "this model has no chat template; use /v1/completions");
    td_err err = {0};
    tpl_chat_args a = {.messages = r->messages, .tools = r->tools, .kwargs = r->kwargs,
                       .add_generation_prompt = r->add_generation_prompt, .bos_token = s->bos, .eos_token = s->eos};
    if (td_tpl_apply_chat(s->chat_tpl, &a, text, len, &err)) {
        /* Template errors (raise_exception) describe the request: 400. */
        const char *m = err.msg;
        const char *p = strstr(m, ": ");
        if (p && !strncmp(m, "src/", 4)) m = p + 2;
        return BAD(e, "chat template: %.400s", m);
    }
    if (r->continue_final && cut_after_final(r, *text, len, e)) {
        free(*text);
        *text = NULL;
        return -1;
    }
    return 0;
}

char *td_oai_token_text(srv *s, int32_t id) {
    size_t n = 0, ol;
    const uint8_t *b = td_tok_id_bytes(s->tok, id, &n);
    return td_tok_utf8_sanitize(b ? (const char *)b : "", b ? n : 0, &ol);
}
