/* Structured outputs: the request fields that constrain the output, the
 * compiled-grammar cache, and each job's constraint (a td_constraint over
 * a grammar matcher, src/grammar/grammar.h).
 *
 * Fields (one constraint per request; more is a 400):
 *   response_format  {type: text | json_object | json_schema {name, schema, strict}}
 *   structured_outputs (vLLM) {json: schema | string, regex, choice: [...], json_object: true}
 *   guided_json / guided_regex / guided_choice (vLLM's older names)
 *   tool_choice      "required": a JSON array [{name, parameters}, ...] of the
 *                    request's tools (vLLM's form; one item when
 *                    parallel_tool_calls is false); {type: function, function:
 *                    {name}}: that function's arguments object. The text is
 *                    then returned as tool calls, never as content.
 * Unsupported schema features are a 400 that names them (the grammar
 * compilers refuse them); never a silently unconstrained answer. A missing
 * additionalProperties means false, as xgrammar's strict mode (vLLM's
 * default) reads it, whatever `strict` says.
 *
 * Reasoning: when the prompt leaves the output inside <think> (chat parser
 * mode 2), the grammar applies after the </think> token, as vLLM's
 * reasoning-aware structured outputs do; until then every token is allowed.
 *
 * ignore_eos: end ids are masked out while the grammar allows anything
 * else, so the request runs to max_tokens unless the document is complete.
 *
 * Threads: the cache is shared under so_cache.mu; a job's matcher is used
 * only by the scheduler thread (the constraint callbacks). */
#include <stdlib.h>
#include <string.h>
#include "server/srv_internal.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#define SO_CACHE_MAX 32           /* compiled grammars kept (LRU) */
#define SO_KEY_MAX (1u << 20)     /* bytes of one schema / regex / choice list */

struct so_grammar {
    so_cache *c;
    td_grammar *g;
    char *key;                    /* kind byte + canonical text */
    size_t klen;
    int refs;                     /* the cache's (while listed) + each request's */
    uint64_t used;
};

struct so_cache {
    pthread_mutex_t mu;
    td_grammar_vocab *vocab;
    int vocab_n;
    int32_t think_end;            /* </think>, or -1 */
    int32_t ends[16];             /* the vocabulary's end ids */
    int n_end;
    so_grammar *e[SO_CACHE_MAX];
    int n;
    uint64_t clock, hits, misses;
};

/* ---- the cache ------------------------------------------------------------ */

int td_so_init(srv *s, td_err *err) {
    so_cache *c = TD_CALLOC(err, 1, sizeof *c);
    if (!c) return TD_ERR_NOMEM;
    if (pthread_mutex_init(&c->mu, NULL)) { free(c); return TD_FAIL(err, TD_ERR_INTERNAL, "mutex"); }
    int V = s->vocab, nt = td_tok_vocab_size(s->tok);
    const uint8_t **bytes = TD_CALLOC(err, (size_t)V, sizeof *bytes);
    size_t *lens = TD_CALLOC(err, (size_t)V, sizeof *lens);
    int rc = bytes && lens ? 0 : TD_ERR_NOMEM;
    for (int i = 0; i < V && i < nt && !rc; i++) {
        if (td_tok_is_special(s->tok, i)) continue; /* control tokens: never inside constrained text */
        size_t n = 0;
        const uint8_t *b = td_tok_id_bytes(s->tok, i, &n);
        if (b && n) bytes[i] = b, lens[i] = n;
    }
    td_model_info mi = {0};
    if (s->eng) td_engine_info(s->eng, &mi); /* the request-path fuzz harness has no engine */
    int32_t ends[16];
    int n_end = 0;
    for (int i = 0; i < mi.n_eos && n_end < 15; i++) ends[n_end++] = mi.eos_token_ids[i];
    if (td_tok_eos_id(s->tok) >= 0) ends[n_end++] = td_tok_eos_id(s->tok);
    if (!rc) rc = td_grammar_vocab_new(V, bytes, lens, ends, n_end, &c->vocab, err);
    free(bytes);
    free(lens);
    if (rc) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return rc;
    }
    c->vocab_n = V;
    memcpy(c->ends, ends, sizeof ends);
    c->n_end = n_end;
    c->think_end = td_tok_token_id(s->tok, "</think>");
    s->so = c;
    return TD_OK;
}

static void grammar_unref_locked(so_grammar *h) {
    if (--h->refs) return;
    td_grammar_free(h->g);
    free(h->key);
    free(h);
}

void td_so_release(srv *s) {
    so_cache *c = s->so;
    if (!c) return;
    for (int i = 0; i < c->n; i++) grammar_unref_locked(c->e[i]);
    td_grammar_vocab_free(c->vocab);
    pthread_mutex_destroy(&c->mu);
    free(c);
    s->so = NULL;
}

void td_so_grammar_unref(so_grammar *h) {
    if (!h) return;
    so_cache *c = h->c;
    pthread_mutex_lock(&c->mu);
    grammar_unref_locked(h);
    pthread_mutex_unlock(&c->mu);
}

enum { K_SCHEMA = 's', K_OBJECT = 'o', K_REGEX = 'r', K_CHOICE = 'c' };

/* Compiles key (kind byte + text; choices NUL-separated) or finds it in the cache. */
static int grammar_get(srv *s, const char *key, size_t klen, bool strict, so_grammar **out, http_err *e) {
    so_cache *c = s->so;
    *out = NULL;
    if (!c) { td_http_err_set(e, 500, "server_error", "structured outputs are not available"); return -1; }
    if (klen > SO_KEY_MAX) { td_http_err_set(e, 400, "invalid_request_error", "the output constraint is too large (%zu bytes, max %u)", klen, SO_KEY_MAX); return -1; }
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (c->e[i]->klen == klen && !memcmp(c->e[i]->key, key, klen)) {
            c->e[i]->refs++;
            c->e[i]->used = ++c->clock;
            c->hits++;
            *out = c->e[i];
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    c->misses++;
    pthread_mutex_unlock(&c->mu);
    /* compile outside the lock: a large schema must not stall other requests */
    td_err err = {0};
    td_grammar_opts o = td_grammar_opts_default();
    /* a missing additionalProperties is false, as in xgrammar's strict mode
     * (vLLM's default backend), whether or not the request says strict: a
     * looser grammar lets a weak model add keys until max_tokens */
    o.strict = true;
    (void)strict;
    td_grammar *g = NULL;
    const char *text = key + 1;
    size_t tl = klen - 1;
    int rc;
    if (key[0] == K_SCHEMA) rc = td_grammar_json_schema(text, tl, &o, &g, &err);
    else if (key[0] == K_OBJECT) rc = td_grammar_json_object(&o, &g, &err);
    else if (key[0] == K_REGEX) rc = td_grammar_regex(text, tl, &o, &g, &err);
    else {
        int n = 0;
        for (size_t i = 0; i < tl; i++) n += text[i] == 0;
        const char **ch = calloc((size_t)n + 1, sizeof *ch);
        size_t *ln = calloc((size_t)n + 1, sizeof *ln);
        rc = ch && ln ? 0 : TD_ERR_NOMEM;
        for (size_t i = 0, k = 0; !rc && k < (size_t)n; k++) {
            ch[k] = text + i;
            ln[k] = strlen(text + i);
            i += ln[k] + 1;
        }
        if (!rc) rc = td_grammar_choice(ch, ln, n, &o, &g, &err);
        else TD_FAIL(&err, rc, "out of memory");
        free(ch);
        free(ln);
    }
    if (rc) {
        const char *m = strstr(err.msg, ": ");
        const char *why = m && !strncmp(err.msg, "src/", 4) ? m + 2 : err.msg;
        if (rc == TD_ERR_NOMEM) td_http_err_set(e, 500, "server_error", "cannot compile the output constraint: %.400s", why);
        else td_http_err_set(e, 400, "invalid_request_error", "%s: %.400s", rc == TD_ERR_UNSUPPORTED ? "unsupported output constraint" : "invalid output constraint", why);
        return -1;
    }
    so_grammar *h = calloc(1, sizeof *h);
    char *k = h ? malloc(klen) : NULL;
    if (!k) {
        free(h);
        td_grammar_free(g);
        td_http_err_set(e, 500, "server_error", "out of memory");
        return -1;
    }
    memcpy(k, key, klen);
    *h = (so_grammar){.c = c, .g = g, .key = k, .klen = klen, .refs = 2};
    pthread_mutex_lock(&c->mu);
    h->used = ++c->clock;
    if (c->n == SO_CACHE_MAX) { /* evict the least recently used */
        int lru = 0;
        for (int i = 1; i < c->n; i++) if (c->e[i]->used < c->e[lru]->used) lru = i;
        grammar_unref_locked(c->e[lru]);
        c->e[lru] = c->e[--c->n];
    }
    c->e[c->n++] = h;
    pthread_mutex_unlock(&c->mu);
    *out = h;
    return 0;
}

void td_so_cache_stats(srv *s, uint64_t *hits, uint64_t *misses) {
    *hits = *misses = 0;
    if (!s->so) return;
    pthread_mutex_lock(&s->so->mu);
    *hits = s->so->hits;
    *misses = s->so->misses;
    pthread_mutex_unlock(&s->so->mu);
}

/* ---- request fields --------------------------------------------------------- */

static bool absent(const json_t *v) { return !v || json_is_null(v); }

static int bad(http_err *e, const char *param, const char *msg) {
    td_http_err_set(e, 400, "invalid_request_error", "%s", msg);
    e->param = param;
    return -1;
}

/* key = kind + compact JSON of v (a schema object, or a string holding one) */
static int schema_key(char kind, const json_t *v, sbuf *key, http_err *e, const char *param) {
    td_sb_clear(key);
    if (td_sb_add(key, &kind, 1)) return bad(e, param, "out of memory");
    if (json_is_string(v)) { /* vLLM accepts the schema as a JSON string */
        json_error_t je;
        json_t *p = json_loadb(json_string_value(v), json_string_length(v), 0, &je);
        if (!json_is_object(p)) { json_decref(p); return bad(e, param, "the JSON schema string is not a JSON object"); }
        char *t = json_dumps(p, JSON_COMPACT);
        json_decref(p);
        int rc = !t || td_sb_adds(key, t);
        free(t);
        return rc ? bad(e, param, "out of memory") : 0;
    }
    if (!json_is_object(v) && !json_is_boolean(v)) return bad(e, param, "the JSON schema must be an object");
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    int rc = !t || td_sb_adds(key, t);
    free(t);
    return rc ? bad(e, param, "out of memory") : 0;
}

static int choice_key(const json_t *v, sbuf *key, http_err *e, const char *param) {
    if (!json_is_array(v) || !json_array_size(v)) return bad(e, param, "'choice' must be a non-empty array of strings");
    if (json_array_size(v) > 4096) return bad(e, param, "'choice' has more than 4096 strings");
    td_sb_clear(key);
    if (td_sb_add(key, "c", 1)) return bad(e, param, "out of memory");
    size_t i;
    const json_t *c;
    json_array_foreach(v, i, c) {
        if (!json_is_string(c) || memchr(json_string_value(c), 0, json_string_length(c)))
            return bad(e, param, "'choice' must hold strings (without NUL)");
        if (td_sb_add(key, json_string_value(c), json_string_length(c)) || td_sb_add(key, "", 1)) return bad(e, param, "out of memory");
    }
    return 0;
}

static int regex_key(const json_t *v, sbuf *key, http_err *e, const char *param) {
    if (!json_is_string(v)) return bad(e, param, "'regex' must be a string");
    td_sb_clear(key);
    return td_sb_add(key, "r", 1) || td_sb_add(key, json_string_value(v), json_string_length(v)) ? bad(e, param, "out of memory") : 0;
}

/* The function of tools named name, or NULL. */
static const json_t *find_tool(const json_t *tools, const char *name) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(f, "name"));
        if (n && !strcmp(n, name)) return f;
    }
    return NULL;
}

static json_t *params_of(const json_t *f) {
    const json_t *p = json_object_get(f, "parameters");
    return absent(p) ? json_pack("{s:s}", "type", "object") : json_deep_copy(p);
}

/* tool_choice "required": [{name, parameters}, ...] over every tool. */
static json_t *required_schema(const json_t *tools, bool one, bool *strict) {
    json_t *any = json_array();
    size_t i;
    const json_t *t;
    *strict = true;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        *strict = *strict && json_is_true(json_object_get(f, "strict"));
        json_t *item = json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s,s], s:b}", "type", "object", "properties", "name", "const",
                                 json_string_value(json_object_get(f, "name")), "parameters", params_of(f), "required", "name", "parameters",
                                 "additionalProperties", 0);
        if (!item || json_array_append_new(any, item)) { json_decref(any); return NULL; }
    }
    json_t *s = json_pack("{s:s, s:i, s:{s:o}}", "type", "array", "minItems", 1, "items", "anyOf", any);
    if (s && one) json_object_set_new(s, "maxItems", json_integer(1));
    return s;
}

int td_so_parse(srv *s, const json_t *b, oai_req *r, http_err *e) {
    sbuf key = {0};
    int n = 0, rc = 0;
    bool strict = false;
    const char *param = NULL;
    /* response_format */
    const json_t *rf = json_object_get(b, "response_format");
    if (!absent(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        param = "response_format";
        if (!json_is_object(rf) || !type) rc = bad(e, param, "'response_format' must be an object with a 'type'");
        else if (!strcmp(type, "text")) ;
        else if (!strcmp(type, "json_object")) n++, rc = td_sb_add(&key, "o", 1) ? bad(e, param, "out of memory") : 0;
        else if (!strcmp(type, "json_schema")) {
            const json_t *js = json_object_get(rf, "json_schema");
            const json_t *sc = json_object_get(js, "schema");
            if (!json_is_object(js) || absent(sc)) rc = bad(e, param, "'response_format.json_schema.schema' is required for type json_schema");
            else {
                n++;
                strict = json_is_true(json_object_get(js, "strict"));
                rc = schema_key(K_SCHEMA, sc, &key, e, param);
            }
        } else rc = bad(e, param, "'response_format.type' must be text, json_object or json_schema");
    }
    /* vLLM: structured_outputs, and the older guided_* fields */
    const json_t *so = json_object_get(b, "structured_outputs");
    if (!rc && !absent(so)) {
        param = "structured_outputs";
        if (!json_is_object(so)) rc = bad(e, param, "'structured_outputs' must be an object");
        const char *k;
        const json_t *v;
        if (!rc) json_object_foreach((json_t *)so, k, v) {
            if (absent(v) || rc) continue;
            if (!strcmp(k, "json")) n++, rc = schema_key(K_SCHEMA, v, &key, e, param);
            else if (!strcmp(k, "regex")) n++, rc = regex_key(v, &key, e, param);
            else if (!strcmp(k, "choice")) n++, rc = choice_key(v, &key, e, param);
            else if (!strcmp(k, "json_object")) {
                if (json_is_true(v)) {
                    n++;
                    td_sb_clear(&key);
                    rc = td_sb_add(&key, "o", 1) ? bad(e, param, "out of memory") : 0;
                }
            } else if (!strcmp(k, "disable_any_whitespace") || !strcmp(k, "disable_fallback") || !strcmp(k, "disable_additional_properties") ||
                       !strcmp(k, "whitespace_pattern")) {
                /* options of vLLM's backends; ours is always bounded-whitespace */
            } else {
                td_http_err_set(e, 400, "invalid_request_error", "unsupported output constraint: 'structured_outputs.%.64s' (supported: json, regex, choice, json_object)", k);
                e->param = param;
                rc = -1;
            }
        }
    }
    static const char *const guided[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar"};
    for (int i = 0; i < 4 && !rc; i++) {
        const json_t *v = json_object_get(b, guided[i]);
        if (absent(v)) continue;
        param = guided[i];
        n++;
        if (i == 0) rc = schema_key(K_SCHEMA, v, &key, e, param);
        else if (i == 1) rc = regex_key(v, &key, e, param);
        else if (i == 2) rc = choice_key(v, &key, e, param);
        else rc = bad(e, param, "unsupported output constraint: grammars (guided_grammar) are not supported; use a JSON schema or a regex");
    }
    if (!rc && n > 1) rc = bad(e, param, "only one output constraint per request (response_format, structured_outputs or guided_*)");
    /* tool_choice required / named */
    const json_t *tc = json_object_get(b, "tool_choice");
    bool req = json_is_string(tc) && !strcmp(json_string_value(tc), "required");
    if (!rc && r->kind == OAI_CHAT && (req || json_is_object(tc))) {
        param = "tool_choice";
        json_t *schema = NULL;
        if (!r->tools) rc = bad(e, param, "'tool_choice' requires 'tools'");
        else if (n) rc = bad(e, param, "'tool_choice' required or a named function cannot be combined with another output constraint");
        else if (req) {
            schema = required_schema(r->tools, r->no_parallel_tools, &strict);
            r->so_kind = SO_TOOLS;
        } else {
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!name) name = json_string_value(json_object_get(tc, "name")); /* the Responses API's flat form */
            const json_t *f = name ? find_tool(r->tools, name) : NULL;
            if (!name) rc = bad(e, param, "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
            else if (!f) {
                td_http_err_set(e, 400, "invalid_request_error", "tool_choice names the function '%.100s', which is not in 'tools'", name);
                e->param = param;
                rc = -1;
            } else {
                schema = params_of(f);
                strict = json_is_true(json_object_get(f, "strict"));
                r->so_kind = SO_TOOL;
                snprintf(r->so_tool, sizeof r->so_tool, "%s", name);
                if (strlen(name) >= sizeof r->so_tool) rc = bad(e, param, "the tool name is too long");
            }
        }
        if (!rc && !schema) rc = bad(e, param, "out of memory");
        if (!rc) rc = schema_key(K_SCHEMA, schema, &key, e, param);
        json_decref(schema);
        n = 1;
        if (!rc) r->parse_tools = false; /* the constrained text itself becomes the calls (td_so_tools_finish) */
    } else if (!rc && n) {
        r->so_kind = SO_TEXT;
    }
    if (!rc && n) rc = grammar_get(s, key.p, key.len, strict, &r->so_g, e);
    if (rc) r->so_kind = SO_NONE;
    td_sb_free(&key);
    return rc;
}

void td_so_req_free(oai_req *r) {
    td_so_grammar_unref(r->so_g);
    r->so_g = NULL;
}

/* ---- a job's constraint (scheduler thread) ------------------------------------ */

static const uint32_t *cb_mask(void *u, const int32_t *spec, int n) {
    job *j = u;
    if (j->so_gate) { /* still reasoning: free until </think>, then the grammar from its start */
        int i = 0;
        while (i < n && spec[i] != j->so_think_end) i++;
        if (i == n) return j->so_all;
        spec += i + 1;
        n -= i + 1;
    }
    const uint32_t *m = td_matcher_mask(j->so_m, spec, n);
    if (!m || !j->so_noend) return m;
    /* ignore_eos: no end token while the grammar can go on (only where
     * nothing else is allowed, so a complete document still ends) */
    so_cache *c = j->srv->so;
    size_t words = ((size_t)c->vocab_n + 31) / 32;
    memcpy(j->so_noend, m, words * sizeof *m);
    for (int i = 0; i < c->n_end; i++)
        if (c->ends[i] >= 0 && c->ends[i] < c->vocab_n) j->so_noend[c->ends[i] >> 5] &= ~(1u << (c->ends[i] & 31));
    for (size_t w = 0; w < words; w++)
        if (j->so_noend[w]) return j->so_noend;
    return m;
}

static int cb_accept(void *u, int32_t t) {
    job *j = u;
    if (j->so_gate) {
        if (t == j->so_think_end) j->so_gate = false;
        return 0;
    }
    if (td_matcher_accept(j->so_m, t)) return -1;
    /* complete, and only an end token could follow: stop here (saves a step) */
    return td_matcher_finished(j->so_m) || td_matcher_must_end(j->so_m) ? 1 : 0;
}

int td_so_job_init(job *j, int reasoning_mode, td_err *err) {
    if (!j->req.so_g) return TD_OK;
    so_cache *c = j->srv->so;
    int rc = td_matcher_new(j->req.so_g->g, c->vocab, &j->so_m, err);
    if (rc) return rc;
    j->so_think_end = c->think_end;
    if (j->req.ignore_eos) {
        j->so_noend = TD_MALLOC(err, ((size_t)c->vocab_n + 31) / 32 * sizeof *j->so_noend);
        if (!j->so_noend) return TD_ERR_NOMEM;
    }
    if (reasoning_mode == 2 && c->think_end >= 0) {
        size_t words = ((size_t)c->vocab_n + 31) / 32;
        j->so_all = TD_MALLOC(err, words * sizeof *j->so_all);
        if (!j->so_all) return TD_ERR_NOMEM;
        memset(j->so_all, 0xff, words * sizeof *j->so_all);
        j->so_gate = true;
    }
    j->so_cons = (td_constraint){.mask = cb_mask, .accept = cb_accept, .user = j};
    return TD_OK;
}

const td_constraint *td_so_job_constraint(job *j) { return j->so_m ? &j->so_cons : NULL; }

void td_so_job_free(job *j) {
    td_matcher_free(j->so_m);
    j->so_m = NULL;
    free(j->so_all);
    j->so_all = NULL;
    free(j->so_noend);
    j->so_noend = NULL;
}

/* Called with the job lock held when a SO_TOOLS / SO_TOOL request ends: its
 * text (held back in j->content) becomes tool calls through the same events
 * the chat parser sends, or — cut short (max_tokens), not valid JSON —
 * plain content, as vLLM falls back. */
int td_so_tools_finish(job *j) {
    if (j->req.so_kind != SO_TOOLS && j->req.so_kind != SO_TOOL) return 0;
    json_error_t je;
    json_t *v = j->content.len ? json_loadb(j->content.p, j->content.len, 0, &je) : NULL;
    bool ok = v && (j->req.so_kind == SO_TOOL ? json_is_object(v) : json_is_array(v) && json_array_size(v) > 0);
    size_t i;
    json_t *it;
    if (ok && j->req.so_kind == SO_TOOLS)
        json_array_foreach(v, i, it) ok = ok && json_is_string(json_object_get(it, "name")) && json_is_object(json_object_get(it, "parameters"));
    sbuf text = {0};
    int rc = 0;
    if (td_sb_add(&text, j->content.p ? j->content.p : "", j->content.len)) rc = TD_ERR_NOMEM;
    td_sb_clear(&j->content);
    int kind = j->req.so_kind;
    j->req.so_kind = SO_TEXT; /* from here on, events go out as usual */
    if (!ok) {
        cp_event ev = {.kind = CP_CONTENT, .text = text.p ? text.p : "", .len = text.len};
        if (!rc && text.len) rc = td_job_cp_event(j, &ev);
    } else {
        size_t n = kind == SO_TOOL ? 1 : json_array_size(v);
        for (i = 0; i < n && !rc; i++) {
            const char *name = kind == SO_TOOL ? j->req.so_tool : json_string_value(json_object_get(json_array_get(v, i), "name"));
            const json_t *args = kind == SO_TOOL ? v : json_object_get(json_array_get(v, i), "parameters");
            char id[48];
            snprintf(id, sizeof id, "chatcmpl-tool-%016llx%04zx", (unsigned long long)(td_srv_next_id(j->srv) * 0x9e3779b97f4a7c15ull), i);
            char *a = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
            cp_event st = {.kind = CP_TOOL_START, .index = (int)i, .id = id, .name = name};
            cp_event ar = {.kind = CP_TOOL_ARGS, .index = (int)i, .text = a ? a : "{}", .len = a ? strlen(a) : 2};
            rc = a ? td_job_cp_event(j, &st) : TD_ERR_NOMEM;
            if (!rc) rc = td_job_cp_event(j, &ar);
            free(a);
        }
    }
    json_decref(v);
    td_sb_free(&text);
    return rc;
}
