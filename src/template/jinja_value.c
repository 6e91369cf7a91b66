/* Arena, containers and the Python value semantics the templates observe:
 * truthiness, ==, str()/repr(), json.dumps. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "template/jinja.h"
#include "util/err.h"

_Noreturn void td_jlimit_fail(jarena *a, const char *fmt, ...) {
    jlimits *l = a->lim;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    a->lim = NULL; /* no limit checks while unwinding */
    if (l->at) TD_FAIL(l->err, TD_ERR_ARG, "template line %d column %d: %s", l->at->line, l->at->col, msg);
    else TD_FAIL(l->err, TD_ERR_ARG, "template: %s", msg);
    longjmp(*l->jb, 1);
}

void td_jlimit_clock(jarena *a) {
    jlimits *l = a->lim;
    l->countdown = TPL_CLOCK_EVERY;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec > l->deadline_ns)
        td_jlimit_fail(a, "template rendering ran past its time limit (%d ms)", TPL_MAX_RENDER_MS);
}

struct jchunk { struct jchunk *next; size_t used, cap; _Alignas(16) char mem[]; };

void *td_ja_alloc(jarena *a, size_t n) {
    if (a->lim) {
        if (n > TPL_MAX_MEMORY || a->lim->mem + n > TPL_MAX_MEMORY)
            td_jlimit_fail(a, "template used more than its memory limit (%zu MiB)", TPL_MAX_MEMORY >> 20);
        a->lim->mem += n;
        jwork(a, n >> 6);
    }
    n = (n + 15) & ~(size_t)15;
    struct jchunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) {
            if (a->oom) longjmp(*a->oom, 1);
            abort(); /* no recovery point: cannot happen, every user sets one */
        }
        c->used = 0;
        c->cap = cap;
        if (n > 65536 && a->head) { /* keep the current chunk for small allocs */
            c->next = a->head->next;
            a->head->next = c;
            c->used = n;
            return c->mem;
        }
        c->next = a->head;
        a->head = c;
    }
    void *p = c->mem + c->used;
    c->used += n;
    return p;
}

char *td_ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = td_ja_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void td_ja_free(jarena *a) {
    struct jchunk *c = a->head;
    while (c) {
        struct jchunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
}

void td_jb_put(jbuf *b, const char *s, size_t n) {
    if (b->a->lim) {
        if (n > TPL_MAX_OUTPUT || b->n + n > TPL_MAX_OUTPUT)
            td_jlimit_fail(b->a, "template output or string too large (over %zu MiB)", TPL_MAX_OUTPUT >> 20);
        jwork(b->a, 1 + (n >> 6));
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = td_ja_alloc(b->a, nc);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void td_jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { td_jb_put(b, tmp, (size_t)n); return; }
    char *big = td_ja_alloc(b->a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    td_jb_put(b, big, (size_t)n);
}

jlist *td_jl_new(jarena *a, size_t cap) {
    jlist *l = td_ja_alloc(a, sizeof *l);
    l->n = 0;
    l->cap = cap ? cap : 4;
    l->v = td_ja_alloc(a, l->cap * sizeof *l->v);
    l->depth = 1;
    return l;
}

static uint32_t vdepth(jv v) { return v.k == V_LIST ? v.l->depth : v.k == V_DICT ? v.d->depth : 0; }

/* keeps c->depth; over the limits only while rendering */
static void grow_check(jarena *a, uint32_t *depth, size_t n, jv v) {
    uint32_t d = vdepth(v) + 1;
    if (d > *depth) *depth = d;
    if (a->lim) {
        if (*depth > TPL_MAX_VALUE_DEPTH)
            td_jlimit_fail(a, "value nested too deeply (more than %d lists/dicts)", TPL_MAX_VALUE_DEPTH);
        if (n >= TPL_MAX_ITEMS) td_jlimit_fail(a, "list or dict too large (over %zu items)", TPL_MAX_ITEMS);
    }
}

void td_jl_push(jarena *a, jlist *l, jv v) {
    grow_check(a, &l->depth, l->n, v);
    if (l->n == l->cap) {
        jv *nv = td_ja_alloc(a, l->cap * 2 * sizeof *nv);
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

jdict *td_jd_new(jarena *a, size_t cap) {
    jdict *d = td_ja_alloc(a, sizeof *d);
    d->n = 0;
    d->cap = cap ? cap : 4;
    d->k = td_ja_alloc(a, d->cap * sizeof *d->k);
    d->v = td_ja_alloc(a, d->cap * sizeof *d->v);
    d->depth = 1;
    return d;
}

/* Linear probing is fine: template dicts (messages, tool schemas) are
 * small, and insertion order must be kept anyway. */
bool td_jd_getv(const jdict *d, jv key, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (td_jv_eq(d->k[i], key)) { if (out) *out = d->v[i]; return true; }
    return false;
}

bool td_jd_get(const jdict *d, const char *key, size_t n, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].k == V_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, key, n) == 0) {
            if (out) *out = d->v[i];
            return true;
        }
    return false;
}

void td_jd_set(jarena *a, jdict *d, jv key, jv val) {
    jwork(a, d->n >> 2);
    grow_check(a, &d->depth, d->n, vdepth(key) > vdepth(val) ? key : val);
    for (size_t i = 0; i < d->n; i++)
        if (td_jv_eq(d->k[i], key)) { d->v[i] = val; return; }
    if (d->n == d->cap) {
        jv *nk = td_ja_alloc(a, d->cap * 2 * sizeof *nk), *nv = td_ja_alloc(a, d->cap * 2 * sizeof *nv);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = key;
    d->v[d->n++] = val;
}

bool td_jv_truthy(jv v) {
    switch (v.k) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0.0;
    case V_STR: return v.s.n != 0;
    case V_LIST: return v.l->n != 0;
    case V_DICT: return (v.flags & (JF_NS | JF_LOOP)) ? true : v.d->n != 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; }
static double num(jv v) { return v.k == V_FLOAT ? v.f : v.k == V_INT ? (double)v.i : (double)v.b; }

bool td_jv_eq(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT)
            return (a.k == V_INT ? a.i : a.b) == (b.k == V_INT ? b.i : b.b);
        return num(a) == num(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case V_LIST:
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!td_jv_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.d == b.d) return true;
        if ((a.flags | b.flags) & (JF_NS | JF_LOOP)) return false; /* identity */
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv o;
            if (!td_jd_getv(b.d, a.d->k[i], &o) || !td_jv_eq(a.d->v[i], o)) return false;
        }
        return true;
    case V_MACRO: return a.m == b.m;
    case V_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

/* Shortest repr that round-trips, formatted like Python's float.__repr__. */
void td_jv_float_repr(char out[40], double f) {
    if (isnan(f)) { strcpy(out, "nan"); return; }
    if (isinf(f)) { strcpy(out, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { strcpy(out, signbit(f) ? "-0.0" : "0.0"); return; }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf = [-]d.ddde[+-]XX : split digits and exponent */
    char digits[32];
    int nd = 0, exp10;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -5 && exp10 < 16) {
        if (exp10 < 0) {
            *o++ = '0'; *o++ = '.';
            for (int i = 0; i < -exp10 - 1; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++) *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > exp10 + 1) for (int i = exp10 + 1; i < nd; i++) *o++ = digits[i];
            else *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) { *o++ = '.'; for (int i = 1; i < nd; i++) *o++ = digits[i]; }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static void repr_str(jbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    td_jb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') td_jb_put(b, "\\\\", 2);
        else if (c == (unsigned char)q) { td_jb_put(b, "\\", 1); td_jb_put(b, &q, 1); }
        else if (c == '\n') td_jb_put(b, "\\n", 2);
        else if (c == '\r') td_jb_put(b, "\\r", 2);
        else if (c == '\t') td_jb_put(b, "\\t", 2);
        else if (c < 0x20 || c == 0x7f) td_jb_printf(b, "\\x%02x", c);
        else td_jb_put(b, (const char *)&s[i], 1);
    }
    td_jb_put(b, &q, 1);
}

void td_jv_str_to(jbuf *b, jv v, bool repr) {
    char tmp[40];
    switch (v.k) {
    case V_UNDEF: break;
    case V_NONE: jb_puts(b, "None"); break;
    case V_BOOL: jb_puts(b, v.b ? "True" : "False"); break;
    case V_INT: td_jb_printf(b, "%lld", (long long)v.i); break;
    case V_FLOAT: td_jv_float_repr(tmp, v.f); jb_puts(b, tmp); break;
    case V_STR:
        if (repr) repr_str(b, v.s.p, v.s.n);
        else td_jb_put(b, v.s.p, v.s.n);
        break;
    case V_LIST: {
        bool tup = v.flags & JF_TUPLE;
        jb_puts(b, tup ? "(" : "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jb_puts(b, ", ");
            td_jv_str_to(b, v.l->v[i], true);
        }
        if (tup && v.l->n == 1) jb_puts(b, ",");
        jb_puts(b, tup ? ")" : "]");
        break;
    }
    case V_DICT:
        if (v.flags & JF_NS) { jb_puts(b, "<Namespace>"); break; }
        if (v.flags & JF_LOOP) { jb_puts(b, "<LoopContext>"); break; }
        jb_puts(b, "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jb_puts(b, ", ");
            td_jv_str_to(b, v.d->k[i], true);
            jb_puts(b, ": ");
            td_jv_str_to(b, v.d->v[i], true);
        }
        jb_puts(b, "}");
        break;
    case V_MACRO: jb_puts(b, "<Macro>"); break;
    case V_FUNC: jb_puts(b, "<function>"); break;
    }
}

static void json_str(jbuf *b, const char *s, size_t n) {
    td_jb_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); esc = u; }
        if (esc) {
            td_jb_put(b, s + i - run, run);
            run = 0;
            jb_puts(b, esc);
        } else {
            run++;
        }
    }
    td_jb_put(b, s + n - run, run);
    td_jb_put(b, "\"", 1);
}

static void json_newline(jbuf *b, const char *indent, int level) {
    td_jb_put(b, "\n", 1);
    for (int i = 0; i < level; i++) jb_puts(b, indent);
}

static int cmp_keys(const void *x, const void *y) {
    const jv *a = *(const jv *const *)x, *b = *(const jv *const *)y;
    size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
    int c = memcmp(a->s.p, b->s.p, n);
    return c ? c : (a->s.n > b->s.n) - (a->s.n < b->s.n);
}

bool td_jv_json_to(jbuf *b, jv v, const char *indent, int level, const char *item_sep, const char *key_sep,
                bool sort_keys, jv *bad) {
    char tmp[40];
    switch (v.k) {
    case V_NONE: jb_puts(b, "null"); return true;
    case V_BOOL: jb_puts(b, v.b ? "true" : "false"); return true;
    case V_INT: td_jb_printf(b, "%lld", (long long)v.i); return true;
    case V_FLOAT:
        if (isnan(v.f)) jb_puts(b, "NaN");
        else if (isinf(v.f)) jb_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
        else { td_jv_float_repr(tmp, v.f); jb_puts(b, tmp); }
        return true;
    case V_STR: json_str(b, v.s.p, v.s.n); return true;
    case V_LIST:
        if (!v.l->n) { jb_puts(b, "[]"); return true; }
        jb_puts(b, "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jb_puts(b, item_sep);
            if (indent) json_newline(b, indent, level + 1);
            if (!td_jv_json_to(b, v.l->v[i], indent, level + 1, item_sep, key_sep, sort_keys, bad)) return false;
        }
        if (indent) json_newline(b, indent, level);
        jb_puts(b, "]");
        return true;
    case V_DICT: {
        if (v.flags & (JF_NS | JF_LOOP)) { *bad = v; return false; }
        if (!v.d->n) { jb_puts(b, "{}"); return true; }
        jv **order = td_ja_alloc(b->a, v.d->n * sizeof *order);
        for (size_t i = 0; i < v.d->n; i++) order[i] = &v.d->k[i];
        bool all_str = true;
        for (size_t i = 0; i < v.d->n; i++) all_str &= v.d->k[i].k == V_STR;
        if (sort_keys && all_str) qsort(order, v.d->n, sizeof *order, cmp_keys);
        jb_puts(b, "{");
        for (size_t i = 0; i < v.d->n; i++) {
            size_t idx = (size_t)(order[i] - v.d->k);
            jv key = v.d->k[idx];
            if (i) jb_puts(b, item_sep);
            if (indent) json_newline(b, indent, level + 1);
            if (key.k == V_STR) json_str(b, key.s.p, key.s.n);
            else if (key.k == V_INT || key.k == V_FLOAT || key.k == V_BOOL || key.k == V_NONE) {
                jbuf kb = {.a = b->a};
                if (key.k == V_BOOL) jb_puts(&kb, key.b ? "true" : "false");
                else if (key.k == V_NONE) jb_puts(&kb, "null");
                else td_jv_json_to(&kb, key, NULL, 0, ",", ":", false, bad);
                json_str(b, kb.p, kb.n);
            } else { *bad = key; return false; }
            jb_puts(b, key_sep);
            if (!td_jv_json_to(b, v.d->v[idx], indent, level + 1, item_sep, key_sep, sort_keys, bad)) return false;
        }
        if (indent) json_newline(b, indent, level);
        jb_puts(b, "}");
        return true;
    }
    default: *bad = v; return false;
    }
}

jv td_jv_from_json(jarena *a, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = td_jd_new(a, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            size_t kl = strlen(k);
            jv key = jv_str(td_ja_strndup(a, k, kl), kl);
            /* jansson keeps insertion order; keys are unique */
            d->k[d->n] = key;
            d->v[d->n] = td_jv_from_json(a, v);
            if (vdepth(d->v[d->n]) + 1 > d->depth) d->depth = vdepth(d->v[d->n]) + 1;
            d->n++;
            if (d->n == d->cap) { /* never: cap sized above, but stay safe */
                jdict *nd = td_jd_new(a, d->cap * 2);
                memcpy(nd->k, d->k, d->n * sizeof *d->k);
                memcpy(nd->v, d->v, d->n * sizeof *d->v);
                nd->n = d->n;
                nd->depth = d->depth;
                d = nd;
            }
        }
        return jv_dict(d);
    }
    case JSON_ARRAY: {
        jlist *l = td_jl_new(a, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) td_jl_push(a, l, td_jv_from_json(a, v));
        return jv_list(l);
    }
    case JSON_STRING: {
        size_t n = json_string_length(j);
        return jv_str(td_ja_strndup(a, json_string_value(j), n), n);
    }
    case JSON_INTEGER: return jv_int(json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
    }
}

const char *td_jv_type_name(jv v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "Macro", "function"};
    if (v.k == V_LIST && (v.flags & JF_TUPLE)) return "tuple";
    if (v.k == V_DICT && (v.flags & JF_NS)) return "Namespace";
    return names[v.k];
}

size_t td_ju_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

size_t td_ju_off(const char *s, size_t n, size_t idx) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == idx) return i;
            c++;
        }
    }
    return n;
}
