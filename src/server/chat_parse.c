/* Incremental stop-string, reasoning and tool-call parsers (see chat_parse.h). */
#include "server/chat_parse.h"
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#define NOMEM(err) TD_FAIL(err, TD_ERR_NOMEM, "out of memory")

/* ---- stop strings ------------------------------------------------------ */

int td_stop_init(stop_matcher *m, const char *const *stops, int n, bool include_stop, td_err *err) {
    memset(m, 0, sizeof *m);
    m->include_stop = include_stop;
    if (n < 0 || n > STOP_MAX) return TD_FAIL(err, TD_ERR_ARG, "at most %d stop strings", STOP_MAX);
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0 || l > STOP_MAX_LEN) {
            td_stop_free(m);
            return TD_FAIL(err, TD_ERR_ARG, "stop strings must be 1..%d bytes", STOP_MAX_LEN);
        }
        m->stops[i] = strdup(stops[i]);
        if (!m->stops[i]) { td_stop_free(m); return NOMEM(err); }
        m->lens[i] = l;
        m->n = i + 1;
    }
    return 0;
}

int td_stop_push(stop_matcher *m, const char *text, size_t len, sbuf *out, td_err *err) {
    if (m->hit) return 1;
    if (m->n == 0) return td_sb_add(out, text, len) ? NOMEM(err) : 0;
    if (td_sb_add(&m->held, text, len)) return NOMEM(err);
    const char *h = m->held.p;
    size_t hl = m->held.len, best = (size_t)-1, best_len = 0;
    int best_i = -1;
    for (int i = 0; i < m->n; i++) {
        const char *f = memmem(h, hl, m->stops[i], m->lens[i]);
        if (f && (size_t)(f - h) < best) best = (size_t)(f - h), best_len = m->lens[i], best_i = i;
    }
    if (best != (size_t)-1) {
        size_t n = best + (m->include_stop ? best_len : 0);
        if (td_sb_add(out, h, n)) return NOMEM(err);
        m->hit = true;
        m->hit_index = best_i;
        td_sb_clear(&m->held);
        return 1;
    }
    size_t keep = 0;
    for (int i = 0; i < m->n; i++) {
        size_t k = td_sb_partial_suffix(h, hl, m->stops[i]);
        if (k > keep) keep = k;
    }
    if (td_sb_add(out, h, hl - keep)) return NOMEM(err);
    td_sb_consume(&m->held, hl - keep);
    return 0;
}

int td_stop_flush(stop_matcher *m, sbuf *out, td_err *err) {
    if (m->hit || !m->held.len) return 0;
    if (td_sb_add(out, m->held.p, m->held.len)) return NOMEM(err);
    td_sb_clear(&m->held);
    return 0;
}

void td_stop_free(stop_matcher *m) {
    for (int i = 0; i < m->n; i++) free(m->stops[i]);
    td_sb_free(&m->held);
    memset(m, 0, sizeof *m);
}

/* ---- schema-typed parameter values ------------------------------------- */

static const json_t *find_param_schema(const json_t *tools, const char *fname, const char *param) {
    size_t i;
    const json_t *t;
    if (!json_is_array(tools)) return NULL;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        if (!json_is_object(f)) f = t;
        const char *n = json_string_value(json_object_get(f, "name"));
        if (!n || strcmp(n, fname)) continue;
        const json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
        return json_object_get(props, param);
    }
    return NULL;
}

static void collect_types(const json_t *schema, const char **types, int *n, int max) {
    const json_t *t = json_object_get(schema, "type");
    if (json_is_string(t) && *n < max) types[(*n)++] = json_string_value(t);
    size_t i;
    const json_t *v;
    if (json_is_array(t))
        json_array_foreach(t, i, v) if (json_is_string(v) && *n < max) types[(*n)++] = json_string_value(v);
    const char *alts[] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++) {
        const json_t *arr = json_object_get(schema, alts[a]);
        if (json_is_array(arr)) json_array_foreach(arr, i, v) collect_types(v, types, n, max);
    }
}

static json_t *convert_as(const char *type, const char *s, size_t len) {
    char buf[64];
    if (!strcmp(type, "string")) return NULL; /* handled by the caller */
    if (!strcmp(type, "null")) return (len == 4 && !strncasecmp(s, "null", 4)) ? json_null() : NULL;
    if (!strcmp(type, "boolean")) {
        if (len == 4 && !strncasecmp(s, "true", 4)) return json_true();
        if (len == 5 && !strncasecmp(s, "false", 5)) return json_false();
        return NULL;
    }
    if (!strcmp(type, "integer") || !strcmp(type, "number")) {
        if (len == 0 || len >= sizeof buf) return NULL;
        memcpy(buf, s, len);
        buf[len] = 0;
        char *end;
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (!*end && !errno) return json_integer(v);
        if (!strcmp(type, "integer")) return NULL;
        errno = 0;
        double d = strtod(buf, &end);
        if (*end || errno || d != d) return NULL;
        return json_real(d);
    }
    if (!strcmp(type, "object") || !strcmp(type, "array")) {
        json_t *v = json_loadb(s, len, JSON_DECODE_ANY, NULL);
        if (v && ((type[0] == 'o' && json_is_object(v)) || (type[0] == 'a' && json_is_array(v)))) return v;
        json_decref(v);
        return NULL;
    }
    return NULL;
}

/* A JSON string of the value; bytes that are not UTF-8 (td_cp_push takes any
 * bytes) become U+FFFD instead of failing as "out of memory". */
static json_t *string_value(const char *value, size_t len) {
    json_t *v = json_stringn(value, len);
    if (v) return v;
    size_t n = 0;
    char *clean = td_tok_utf8_sanitize(value, len, &n);
    v = clean ? json_stringn(clean, n) : NULL;
    free(clean);
    return v;
}

json_t *td_cp_convert_param(const json_t *tools, const char *fname, const char *param, const char *value, size_t len) {
    const json_t *schema = fname && param ? find_param_schema(tools, fname, param) : NULL;
    if (!schema) return string_value(value, len);
    const char *types[8];
    int n = 0;
    collect_types(schema, types, &n, 8);
    /* Trimmed copy for non-string types. */
    const char *s = value;
    size_t l = len;
    while (l && isspace((unsigned char)*s)) s++, l--;
    while (l && isspace((unsigned char)s[l - 1])) l--;
    bool has_string = false;
    for (int i = 0; i < n; i++) {
        if (!strcmp(types[i], "string")) { has_string = true; continue; }
        json_t *v = convert_as(types[i], s, l);
        if (v) return v;
    }
    if (n == 0 && !has_string) { /* no type: JSON if it parses */
        json_t *v = json_loadb(s, l, JSON_DECODE_ANY, NULL);
        if (v) return v;
    }
    return string_value(value, len);
}

int td_cp_reasoning_mode(const char *prompt, size_t len, bool thinking_enabled) {
    if (!thinking_enabled) return 0;
    while (len && isspace((unsigned char)prompt[len - 1])) len--;
    return (len >= 7 && !memcmp(prompt + len - 7, "<think>", 7)) ? 2 : 1;
}

/* ---- chat parser ------------------------------------------------------- */

enum { ST_THINK_START = 1, ST_REASONING, ST_CONTENT, ST_TOOL, ST_AFTER_TOOL };
enum { FMT_UNKNOWN = 0, FMT_JSON, FMT_XML, FMT_BAD };

static const char T_THINK[] = "<think>", T_ENDTHINK[] = "</think>", T_CALL[] = "<tool_call>", T_ENDCALL[] = "</tool_call>",
                  T_FUNC[] = "<function=", T_ENDFUNC[] = "</function>", T_PARAM[] = "<parameter=", T_ENDPARAM[] = "</parameter>";
#define TL(t) (sizeof(t) - 1)

void td_cp_init(chat_parser *p, const cp_config *cfg, cp_emit_fn emit, void *user) {
    memset(p, 0, sizeof *p);
    p->cfg = *cfg;
    p->emit = emit;
    p->user = user;
    p->state = cfg->reasoning == 2 ? ST_REASONING : cfg->reasoning == 1 ? ST_THINK_START : ST_CONTENT;
    p->strip_nl = cfg->reasoning == 2;
}

static int emit_text(chat_parser *p, cp_kind k, const char *s, size_t n) {
    if (!n) return 0;
    cp_event ev = {.kind = k, .text = s, .len = n, .index = p->n_calls};
    return p->emit(p->user, &ev);
}

static bool starts(const char *s, size_t n, const char *tag, size_t tl) { return n >= tl && !memcmp(s, tag, tl); }
/* s[0..n) is a proper prefix of tag. */
static bool proper_prefix(const char *s, size_t n, const char *tag, size_t tl) { return n < tl && !memcmp(s, tag, n); }

static void call_reset(chat_parser *p) {
    td_sb_clear(&p->call);
    p->cpos = 0;
    p->fmt = FMT_UNKNOWN;
    p->started = p->args_done = p->args_open = false;
    p->n_params = 0;
    free(p->fname), p->fname = NULL;
    free(p->pname), p->pname = NULL;
    free(p->key), p->key = NULL;
    p->depth = 0;
    p->in_str = p->esc = p->want_value = false;
    p->args_depth = 0;
}

static int tool_start(chat_parser *p, const char *name, size_t n, td_err *err) {
    free(p->fname);
    p->fname = strndup(name, n);
    if (!p->fname) return NOMEM(err);
    /* id: call_ + 24 hex digits from the seed and the index (splitmix64). */
    char id[32];
    uint64_t x = p->cfg.id_seed + 0x9e3779b97f4a7c15ull * (uint64_t)(p->n_calls + 1), h[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        h[i] = z ^ (z >> 31);
    }
    snprintf(id, sizeof id, "call_%016llx%08llx", (unsigned long long)h[0], (unsigned long long)(h[1] & 0xffffffffull));
    cp_event ev = {.kind = CP_TOOL_START, .index = p->n_calls, .id = id, .name = p->fname};
    p->started = true;
    return p->emit(p->user, &ev);
}

static int tool_args(chat_parser *p, const char *s, size_t n) { return emit_text(p, CP_TOOL_ARGS, s, n); }

/* XML: one parameter done; emits `{"p": v` or `, "p": v`. */
static int xml_param(chat_parser *p, const char *v, size_t n, td_err *err) {
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    json_t *val = td_cp_convert_param(p->cfg.tools, p->fname, p->pname, v, n);
    char *js = val ? json_dumps(val, JSON_ENCODE_ANY) : NULL;
    json_decref(val);
    sbuf b = {0};
    int rc = 0;
    if (!js || td_sb_adds(&b, p->n_params ? ", " : "{") || td_sb_json_str(&b, p->pname, strlen(p->pname)) || td_sb_adds(&b, ": ") ||
        td_sb_adds(&b, js))
        rc = NOMEM(err);
    else
        rc = tool_args(p, b.p, b.len);
    free(js);
    td_sb_free(&b);
    free(p->pname);
    p->pname = NULL;
    p->n_params++;
    return rc;
}

static int args_close(chat_parser *p) {
    if (p->args_done) return 0;
    p->args_done = true;
    return tool_args(p, p->n_params ? "}" : "{}", p->n_params ? 1 : 2);
}

static int xml_step(chat_parser *p, bool final, td_err *err) {
    int rc;
    for (;;) {
        const char *s = p->call.p + p->cpos;
        size_t n = p->call.len - p->cpos;
        if (!p->started) {
            const char *gt = memchr(s, '>', n);
            if (!gt && !final) return 0;
            size_t nl = gt ? (size_t)(gt - s) : n;
            const char *name = s + TL(T_FUNC);
            size_t len = nl > TL(T_FUNC) ? nl - TL(T_FUNC) : 0;
            while (len && isspace((unsigned char)name[len - 1])) len--;
            if ((rc = tool_start(p, name, len, err))) return rc;
            p->cpos += gt ? nl + 1 : n;
            continue;
        }
        if (!p->pname) {
            size_t i = 0;
            while (i < n && isspace((unsigned char)s[i])) i++;
            p->cpos += i, s += i, n -= i;
            if (!n) return final ? args_close(p) : 0;
            if (p->args_done) { p->cpos = p->call.len; return 0; }
            if (starts(s, n, T_PARAM, TL(T_PARAM))) {
                const char *gt = memchr(s, '>', n);
                if (!gt) return final ? args_close(p) : 0;
                const char *nm = s + TL(T_PARAM);
                size_t len = (size_t)(gt - nm);
                while (len && isspace((unsigned char)nm[len - 1])) len--;
                p->pname = strndup(nm, len);
                if (!p->pname) return NOMEM(err);
                p->cpos += (size_t)(gt - s) + 1;
                continue;
            }
            if (starts(s, n, T_ENDFUNC, TL(T_ENDFUNC))) {
                p->cpos += TL(T_ENDFUNC);
                if ((rc = args_close(p))) return rc;
                continue;
            }
            if (!final && (proper_prefix(s, n, T_PARAM, TL(T_PARAM)) || proper_prefix(s, n, T_ENDFUNC, TL(T_ENDFUNC)))) return 0;
            /* Stray text between parameters: skip to the next tag. */
            const char *lt = memchr(s + 1, '<', n - 1);
            p->cpos += lt ? (size_t)(lt - s) : n;
            continue;
        }
        const char *e = memmem(s, n, T_ENDPARAM, TL(T_ENDPARAM));
        if (e) {
            if ((rc = xml_param(p, s, (size_t)(e - s), err))) return rc;
            p->cpos += (size_t)(e - s) + TL(T_ENDPARAM);
            continue;
        }
        if (!final) return 0;
        const char *f = memmem(s, n, T_ENDFUNC, TL(T_ENDFUNC));
        size_t vl = f ? (size_t)(f - s) : n;
        while (vl && isspace((unsigned char)s[vl - 1]) && s[vl - 1] != '\n') vl--;
        if ((rc = xml_param(p, s, vl, err))) return rc;
        p->cpos = p->call.len;
        return args_close(p);
    }
}

/* JSON (hermes): incremental scan for "name" and a streamed "arguments" object. */
static int json_step(chat_parser *p, bool final, td_err *err) {
    int rc;
    const char *c = p->call.p;
    size_t i = p->cpos, emit_from = p->cpos;
    for (; i < p->call.len; i++) {
        char ch = c[i];
        if (p->in_str) {
            if (p->esc) p->esc = false;
            else if (ch == '\\') p->esc = true;
            else if (ch == '"') {
                p->in_str = false;
                if (p->depth != 1) continue;
                json_t *sv = json_loadb(c + p->str_start, i + 1 - p->str_start, JSON_DECODE_ANY, NULL);
                const char *str = json_string_value(sv);
                if (!p->want_value) {
                    free(p->key);
                    p->key = str ? strdup(str) : NULL;
                } else if (p->key && !strcmp(p->key, "name") && str && !p->started) {
                    rc = tool_start(p, str, strlen(str), err);
                    if (rc) { json_decref(sv); return rc; }
                }
                if (p->want_value) p->want_value = false;
                json_decref(sv);
            }
            continue;
        }
        switch (ch) {
        case '"':
            p->in_str = true;
            p->str_start = i;
            break;
        case '{':
        case '[':
            p->depth++;
            if (p->depth == 2 && p->want_value && ch == '{' && p->started && !p->args_done && p->key &&
                (!strcmp(p->key, "arguments") || !strcmp(p->key, "parameters"))) {
                p->args_open = true;
                emit_from = i;
            }
            if (p->depth == 2) p->want_value = false;
            break;
        case '}':
        case ']':
            p->depth--;
            if (p->args_open && p->depth == 1) {
                if ((rc = tool_args(p, c + emit_from, i + 1 - emit_from))) return rc;
                p->args_open = false;
                p->args_done = true;
            }
            break;
        case ':':
            if (p->depth == 1) p->want_value = true;
            break;
        case ',':
            if (p->depth == 1) p->want_value = false;
            break;
        default:
            break;
        }
    }
    if (p->args_open && i > emit_from && (rc = tool_args(p, c + emit_from, i - emit_from))) return rc;
    p->cpos = i;
    if (!final || p->args_done) return 0;
    /* End of the call and arguments not streamed: parse the whole object. */
    json_t *o = json_loadb(c, p->call.len, 0, NULL);
    const char *name = json_string_value(json_object_get(o, "name"));
    json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    rc = 0;
    if (!name && !p->started) {
        json_decref(o);
        return 1; /* not a tool call */
    }
    if (!p->started) rc = tool_start(p, name, strlen(name), err);
    if (!rc && !p->args_open) {
        if (json_is_string(args)) {
            rc = tool_args(p, json_string_value(args), strlen(json_string_value(args)));
            if (!json_string_length(args)) rc = tool_args(p, "{}", 2);
        } else if (args) {
            char *js = json_dumps(args, JSON_ENCODE_ANY);
            rc = js ? tool_args(p, js, strlen(js)) : NOMEM(err);
            free(js);
        } else {
            rc = tool_args(p, "{}", 2);
        }
    }
    p->args_done = true;
    json_decref(o);
    return rc;
}

/* Runs the current call's parser; 1 = "not a tool call" (only when final). */
static int call_step(chat_parser *p, bool final, td_err *err) {
    if (p->fmt == FMT_UNKNOWN) {
        size_t i = p->cpos;
        while (i < p->call.len && isspace((unsigned char)p->call.p[i])) i++;
        const char *s = p->call.p + i;
        size_t n = p->call.len - i;
        if (n && s[0] == '{') p->fmt = FMT_JSON, p->cpos = i;
        else if (starts(s, n, T_FUNC, TL(T_FUNC))) p->fmt = FMT_XML, p->cpos = i;
        else if (!final && (n == 0 || proper_prefix(s, n, T_FUNC, TL(T_FUNC)))) return 0;
        else p->fmt = FMT_BAD;
    }
    if (p->fmt == FMT_JSON) return json_step(p, final, err);
    if (p->fmt == FMT_XML) return xml_step(p, final, err);
    return final ? 1 : 0;
}

/* Ends the current call: counts it, or re-emits its text as content. */
static int call_end(chat_parser *p, int step_rc, bool closed, td_err *err) {
    int rc = 0;
    if (step_rc < 0) return step_rc;
    if (p->started) {
        if (!p->args_done && !p->args_open) rc = tool_args(p, "{}", 2);
        p->n_calls++;
    } else {
        sbuf b = {0};
        if (td_sb_adds(&b, T_CALL) || td_sb_add(&b, p->call.p, p->call.len) || (closed && td_sb_adds(&b, T_ENDCALL))) rc = NOMEM(err);
        else rc = emit_text(p, CP_CONTENT, b.p, b.len);
        td_sb_free(&b);
    }
    call_reset(p);
    return rc;
}

static int run(chat_parser *p, bool final, td_err *err) {
    int rc;
    static char empty[1]; /* pend.p is NULL until text arrives: no arithmetic on NULL */
    for (;;) {
        char *s = p->pend.p ? p->pend.p : empty;
        size_t n = p->pend.len;
        if (p->strip_nl && p->state != ST_TOOL && p->state != ST_AFTER_TOOL) {
            size_t i = 0;
            while (i < n && (s[i] == '\n' || s[i] == '\r')) i++;
            td_sb_consume(&p->pend, i);
            s = p->pend.p ? p->pend.p : empty, n = p->pend.len;
            if (!n) return 0;
            p->strip_nl = false;
        }
        switch (p->state) {
        case ST_THINK_START: {
            size_t i = 0;
            while (i < n && isspace((unsigned char)s[i])) i++;
            if (starts(s + i, n - i, T_THINK, TL(T_THINK))) {
                td_sb_consume(&p->pend, i + TL(T_THINK));
                p->state = ST_REASONING;
                p->strip_nl = true;
                continue;
            }
            if (!final && proper_prefix(s + i, n - i, T_THINK, TL(T_THINK))) return 0;
            p->state = ST_CONTENT;
            continue;
        }
        case ST_REASONING:
        case ST_CONTENT: {
            bool reasoning = p->state == ST_REASONING;
            const char *tag = reasoning ? T_ENDTHINK : T_CALL;
            size_t tl = reasoning ? TL(T_ENDTHINK) : TL(T_CALL);
            cp_kind k = reasoning ? CP_REASONING : CP_CONTENT;
            if (!reasoning && !p->cfg.parse_tools) {
                rc = emit_text(p, k, s, n);
                td_sb_clear(&p->pend);
                return rc;
            }
            const char *f = n ? memmem(s, n, tag, tl) : NULL;
            if (f) {
                size_t pos = (size_t)(f - s);
                if ((rc = emit_text(p, k, s, pos))) return rc;
                td_sb_consume(&p->pend, pos + tl);
                if (reasoning) {
                    p->state = ST_CONTENT;
                    p->strip_nl = true;
                } else {
                    call_reset(p);
                    p->state = ST_TOOL;
                }
                continue;
            }
            size_t keep = final ? 0 : td_sb_partial_suffix(s, n, tag);
            rc = emit_text(p, k, s, n - keep);
            td_sb_consume(&p->pend, n - keep);
            return rc;
        }
        case ST_TOOL: {
            const char *f = n ? memmem(s, n, T_ENDCALL, TL(T_ENDCALL)) : NULL;
            size_t take = f ? (size_t)(f - s) : n - (final ? 0 : td_sb_partial_suffix(s, n, T_ENDCALL));
            if (td_sb_add(&p->call, s, take)) return NOMEM(err);
            td_sb_consume(&p->pend, take + (f ? TL(T_ENDCALL) : 0));
            bool end = f || final;
            rc = call_step(p, end, err);
            if (rc < 0) return rc;
            if (!end) return 0;
            bool was_call = p->started;
            if ((rc = call_end(p, rc, f != NULL, err))) return rc;
            p->state = was_call ? ST_AFTER_TOOL : ST_CONTENT;
            td_sb_clear(&p->ws);
            continue;
        }
        case ST_AFTER_TOOL: {
            size_t i = 0;
            while (i < n && isspace((unsigned char)s[i])) i++;
            if (td_sb_add(&p->ws, s, i)) return NOMEM(err);
            td_sb_consume(&p->pend, i);
            s = p->pend.p ? p->pend.p : empty, n = p->pend.len;
            if (!n) return 0;
            if (starts(s, n, T_CALL, TL(T_CALL))) {
                td_sb_consume(&p->pend, TL(T_CALL));
                td_sb_clear(&p->ws);
                call_reset(p);
                p->state = ST_TOOL;
                continue;
            }
            if (!final && proper_prefix(s, n, T_CALL, TL(T_CALL))) return 0;
            td_sb_clear(&p->ws);
            p->state = ST_CONTENT;
            continue;
        }
        default:
            return TD_FAIL(err, TD_ERR_INTERNAL, "bad parser state %d", p->state);
        }
    }
}

int td_cp_push(chat_parser *p, const char *text, size_t len, td_err *err) {
    if (td_sb_add(&p->pend, text, len)) return NOMEM(err);
    return run(p, false, err);
}

int td_cp_finish(chat_parser *p, td_err *err) {
    int rc = run(p, true, err);
    if (rc) return rc;
    if (p->state == ST_TOOL) { /* empty unterminated call */
        rc = call_step(p, true, err);
        if (rc >= 0) rc = call_end(p, rc, false, err);
        p->state = ST_CONTENT;
    }
    return rc;
}

void td_cp_free(chat_parser *p) {
    call_reset(p);
    td_sb_free(&p->pend);
    td_sb_free(&p->ws);
    td_sb_free(&p->call);
}
