/* JSON grammars: JSON Schema subset -> grammar, any JSON object, and choice.
 * See README.md for the subset, the caps and what is refused. Everything
 * refused names the keyword and its JSON pointer; nothing is silently
 * loosened (some things are tightened: property order, canonical forms). */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/internal.h"

#define INT_DIGITS 20  /* integer part: at most 20 digits */
#define FRAC_DIGITS 16 /* fraction: 1..16 digits */
#define EXP_DIGITS 3   /* exponent: 1..3 digits */
#define ANY_DEPTH 16   /* nesting of unconstrained values (json_object, true schemas) */

/* ---- shared JSON rules ---- */
static void put_ws(gr_builder *b, int32_t r) {
    if (b->max_ws <= 0) return;
    if (b->r_ws < 0) {
        b->r_ws = td_gb_rule(b);
        uint32_t s[8] = {0};
        s[0] = 1u << '\t' | 1u << '\n' | 1u << '\r';
        s[1] = 1u; /* ' ' = 0x20 */
        uint32_t el = EL(E_BYTES, td_gb_set(b, s));
        td_gb_repeat(b, b->r_ws, &el, 1, 0, b->max_ws);
    }
    td_gb_ref(b, r, b->r_ws);
}

static void put_sep(gr_builder *b, int32_t r, char c) { /* ws c ws */
    put_ws(b, r);
    td_gb_lit(b, r, &c, 1);
    put_ws(b, r);
}

static int32_t str_char(gr_builder *b) {
    if (b->r_strchar < 0) {
        cpset s = {0};
        td_cps_add(b, &s, 0x20, 0x21), td_cps_add(b, &s, 0x23, 0x5B), td_cps_add(b, &s, 0x5D, 0x10FFFF);
        int32_t raw = td_gb_cpset_rule(b, &s, false);
        td_cps_free(&s);
        int32_t r = b->r_strchar = td_gb_rule(b);
        td_gb_ref(b, r, raw);
        td_gb_alt(b, r);
        td_gb_lit(b, r, "\\", 1);
        uint32_t e[8] = {0};
        for (const char *p = "\"\\/bfnrt"; *p; p++) e[*p >> 5] |= 1u << (*p & 31);
        td_gb_push(b, r, EL(E_BYTES, td_gb_set(b, e)));
        td_gb_alt(b, r);
        td_gb_lit(b, r, "\\u", 2);
        for (int k = 0; k < 4; k++) {
            uint32_t h[8] = {0};
            for (const char *p = "0123456789abcdefABCDEF"; *p; p++) h[*p >> 5] |= 1u << (*p & 31);
            td_gb_push(b, r, EL(E_BYTES, td_gb_set(b, h)));
        }
    }
    return b->r_strchar;
}

/* '"' char{lo,hi} '"' (hi < 0: unbounded) */
static int32_t str_rule(gr_builder *b, int lo, int hi) {
    if (lo == 0 && hi < 0 && b->r_str >= 0) return b->r_str;
    int32_t r = td_gb_rule(b);
    uint32_t ch = EL(E_REF, (uint32_t)str_char(b));
    td_gb_lit(b, r, "\"", 1);
    td_gb_repeat(b, r, &ch, 1, lo, hi);
    td_gb_lit(b, r, "\"", 1);
    if (lo == 0 && hi < 0) b->r_str = r;
    return r;
}

static void put_digits(gr_builder *b, int32_t r, int lo, int hi) {
    td_gb_byte_range(b, r, '0', '9'); /* the first one is mandatory (lo >= 1) */
    uint32_t d = b->rules[r].n ? b->rules[r].v[b->rules[r].n - 1] : 0;
    td_gb_repeat(b, r, &d, 1, lo - 1, hi - 1);
}

/* -?(0|[1-9][0-9]{0,19}), and for numbers (.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})? */
static int32_t num_rule(gr_builder *b, bool integer, bool nonneg) {
    int32_t r = td_gb_rule(b);
    int32_t in = td_gb_rule(b); /* unsigned integer part */
    td_gb_lit(b, in, "0", 1);
    td_gb_alt(b, in);
    td_gb_byte_range(b, in, '1', '9');
    uint32_t d = 0;
    { uint32_t s[8] = {0}; for (int c = '0'; c <= '9'; c++) s[c >> 5] |= 1u << (c & 31); d = EL(E_BYTES, td_gb_set(b, s)); }
    td_gb_repeat(b, in, &d, 1, 0, INT_DIGITS - 1);
    if (!nonneg) {
        int32_t sign = td_gb_rule(b);
        td_gb_lit(b, sign, "-", 1);
        td_gb_alt(b, sign);
        td_gb_ref(b, r, sign);
    }
    td_gb_ref(b, r, in);
    if (!integer) {
        int32_t fr = td_gb_rule(b);
        td_gb_lit(b, fr, ".", 1);
        put_digits(b, fr, 1, FRAC_DIGITS);
        td_gb_alt(b, fr);
        int32_t ex = td_gb_rule(b);
        uint32_t e[8] = {0};
        e['e' >> 5] |= 1u << ('e' & 31), e['E' >> 5] |= 1u << ('E' & 31);
        td_gb_push(b, ex, EL(E_BYTES, td_gb_set(b, e)));
        int32_t sg = td_gb_rule(b);
        td_gb_lit(b, sg, "+", 1);
        td_gb_alt(b, sg);
        td_gb_lit(b, sg, "-", 1);
        td_gb_alt(b, sg);
        td_gb_ref(b, ex, sg);
        put_digits(b, ex, 1, EXP_DIGITS);
        td_gb_alt(b, ex);
        td_gb_ref(b, r, fr);
        td_gb_ref(b, r, ex);
    }
    return r;
}

static void put_lit_str(gr_builder *b, int32_t r, const char *s) { td_gb_lit(b, r, s, strlen(s)); }

/* Any JSON value with containers nested at most ANY_DEPTH - d + 1 more levels. */
static int32_t any_value(gr_builder *b, int d) {
    if (d < 1) d = 1;
    if (d > ANY_DEPTH + 1) d = ANY_DEPTH + 1;
    if (b->r_any_value[d] >= 0) return b->r_any_value[d];
    int32_t v = b->r_any_value[d] = td_gb_rule(b);
    if (b->r_num < 0) b->r_num = num_rule(b, false, false);
    td_gb_ref(b, v, str_rule(b, 0, -1));
    td_gb_alt(b, v), td_gb_ref(b, v, b->r_num);
    td_gb_alt(b, v), put_lit_str(b, v, "true");
    td_gb_alt(b, v), put_lit_str(b, v, "false");
    td_gb_alt(b, v), put_lit_str(b, v, "null");
    if (d <= ANY_DEPTH) {
        int32_t inner = any_value(b, d + 1);
        /* object: { ws (member (sep member)*)? ws } */
        int32_t mem = td_gb_rule(b), more = td_gb_rule(b), obj = td_gb_rule(b), body = td_gb_rule(b);
        td_gb_ref(b, mem, str_rule(b, 0, -1));
        put_sep(b, mem, ':');
        td_gb_ref(b, mem, inner);
        put_sep(b, more, ',');
        td_gb_ref(b, more, mem);
        td_gb_ref(b, body, mem);
        uint32_t m = EL(E_REF, (uint32_t)more);
        td_gb_repeat(b, body, &m, 1, 0, -1);
        td_gb_alt(b, body);
        td_gb_lit(b, obj, "{", 1), put_ws(b, obj), td_gb_ref(b, obj, body), put_ws(b, obj), td_gb_lit(b, obj, "}", 1);
        /* array */
        int32_t arr = td_gb_rule(b), amore = td_gb_rule(b), abody = td_gb_rule(b);
        put_sep(b, amore, ',');
        td_gb_ref(b, amore, inner);
        td_gb_ref(b, abody, inner);
        m = EL(E_REF, (uint32_t)amore);
        td_gb_repeat(b, abody, &m, 1, 0, -1);
        td_gb_alt(b, abody);
        td_gb_lit(b, arr, "[", 1), put_ws(b, arr), td_gb_ref(b, arr, abody), put_ws(b, arr), td_gb_lit(b, arr, "]", 1);
        td_gb_alt(b, v), td_gb_ref(b, v, obj);
        td_gb_alt(b, v), td_gb_ref(b, v, arr);
        if (d == 1) b->r_any_value[0] = obj; /* the top-level object (json_object) */
    }
    return v;
}

static void set_ws(gr_builder *b, const td_grammar_opts *o) {
    td_grammar_opts d = td_grammar_opts_default();
    b->max_ws = o ? o->max_ws : d.max_ws;
    if (b->max_ws < 0) b->max_ws = 0;
    if (b->max_ws > GR_MAX_WS) b->max_ws = GR_MAX_WS;
}

int td_grammar_json_object(const td_grammar_opts *o, td_grammar **out, td_err *err) {
    gr_builder b;
    td_gb_init(&b, err);
    set_ws(&b, o);
    any_value(&b, 1);
    return td_gb_finish(&b, b.r_any_value[0], o, out);
}

int td_grammar_choice(const char *const *choices, const size_t *lens, int n, const td_grammar_opts *o, td_grammar **out,
                      td_err *err) {
    *out = NULL;
    if (n < 0 || (n && (!choices || !lens))) return TD_FAIL(err, TD_ERR_ARG, "choice: bad arguments");
    for (int i = 0; i < n; i++)
        if (!choices[i] && lens[i]) return TD_FAIL(err, TD_ERR_ARG, "choice %d is NULL", i);
    if (n == 0) return TD_FAIL(err, TD_ERR_ARG, "choice: no choices");
    gr_builder b;
    td_gb_init(&b, err);
    int32_t r = td_gb_literals(&b, (const uint8_t *const *)choices, lens, n);
    return td_gb_finish(&b, r, o, out);
}

/* ---- JSON Schema ---- */
enum {
    K_TYPE, K_ENUM, K_CONST, K_PROPS, K_REQ, K_ADDL, K_ITEMS, K_PREFIX, K_MINI, K_MAXI,
    K_ANYOF, K_ONEOF, K_ALLOF, K_REF, K_MINL, K_MAXL, K_PATTERN, K_MIN, K_MAX, K_XMIN, K_XMAX, K_N
};
static const char *const kw_names[K_N] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum"};
static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_NUM = 32, T_INT = 64, T_ALL = 127 };
static const char *const type_names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};

typedef struct {
    gr_builder *b;
    json_t *root;
    bool strict;
    struct { json_t *target; int32_t rule; } *refs;
    int n_refs, cap_refs;
} sc;

static int32_t sc_node(sc *c, json_t *n, const char *ptr, int depth);

static const char *at(const char *ptr) { return ptr[0] ? ptr : "/"; }

static int32_t sc_fail(sc *c, int code, const char *ptr, const char *what, const char *kw) {
    td_gb_fail(c->b, code, "json_schema: %s '%s' at %s", what, kw, at(ptr));
    return 0;
}

static void child_ptr(char *out, size_t cap, const char *ptr, const char *a, const char *b) {
    snprintf(out, cap, "%s/%s%s%s", ptr, a, b ? "/" : "", b ? b : "");
}

/* Resolves a local "$ref" ("#" or "#/json/pointer", ~0 ~1 and %XX unescaped). */
static json_t *resolve(sc *c, const char *ref, const char *ptr) {
    if (strcmp(ref, "#") && strncmp(ref, "#/", 2)) {
        td_gb_fail(c->b, TD_ERR_UNSUPPORTED, "json_schema: unsupported $ref '%.100s' at %s (only local #/... references)", ref,
                at(ptr));
        return NULL;
    }
    json_t *cur = c->root;
    const char *p = ref + 1;
    char tok[512];
    while (*p == '/' && cur) {
        p++;
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof tok) {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1')) ch = *p++ == '0' ? '~' : '/';
            else if (ch == '%' && p[0] && p[1]) {
                char hx[3] = {p[0], p[1], 0};
                char *e;
                long v = strtol(hx, &e, 16);
                if (!*e) ch = (char)v, p += 2;
            }
            tok[k++] = ch;
        }
        tok[k] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *e;
            long i = strtol(tok, &e, 10);
            cur = *e || i < 0 ? NULL : json_array_get(cur, (size_t)i);
        } else cur = NULL;
    }
    if (!cur) td_gb_fail(c->b, TD_ERR_ARG, "json_schema: unresolvable $ref '%.100s' at %s", ref, at(ptr));
    return cur;
}

static int32_t sc_ref(sc *c, json_t *target, const char *ptr, int depth) {
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == target) return c->refs[i].rule;
    if (c->n_refs == c->cap_refs) {
        int nc = c->cap_refs ? c->cap_refs * 2 : 16;
        void *nr = realloc(c->refs, (size_t)nc * sizeof *c->refs);
        if (!nr) return td_gb_fail(c->b, TD_ERR_NOMEM, "json_schema: out of memory"), 0;
        c->refs = nr, c->cap_refs = nc;
    }
    int32_t r = td_gb_rule(c->b); /* placeholder first: recursive references find it */
    c->refs[c->n_refs].target = target, c->refs[c->n_refs].rule = r, c->n_refs++;
    int32_t body = sc_node(c, target, ptr, depth + 1);
    td_gb_ref(c->b, r, body);
    return r;
}

static int json_types(json_t *v) {
    if (json_is_null(v)) return T_NULL;
    if (json_is_boolean(v)) return T_BOOL;
    if (json_is_object(v)) return T_OBJ;
    if (json_is_array(v)) return T_ARR;
    if (json_is_string(v)) return T_STR;
    if (json_is_integer(v)) return T_NUM | T_INT;
    double d = json_real_value(v);
    return T_NUM | (d == (double)(long long)d ? T_INT : 0);
}

/* One enum/const value: scalars as their compact serialization; integral
 * numbers also with ".0" (JSON Schema: 1 == 1.0); containers structurally,
 * with whitespace allowed as elsewhere (object keys in the value's order). */
static int32_t const_value(sc *c, json_t *v, int depth) {
    gr_builder *b = c->b;
    if (depth > GR_MAX_NEST) return td_gb_fail(b, TD_ERR_LIMIT, "json_schema: enum/const value nested deeper than %d", GR_MAX_NEST), 0;
    int32_t r = td_gb_rule(b);
    if (json_is_array(v) || json_is_object(v)) {
        bool arr = json_is_array(v);
        td_gb_lit(b, r, arr ? "[" : "{", 1), put_ws(b, r);
        size_t i = 0;
        const char *k;
        json_t *x;
        if (arr) {
            json_array_foreach(v, i, x) {
                if (i) put_sep(b, r, ',');
                td_gb_ref(b, r, const_value(c, x, depth + 1));
            }
        } else {
            json_object_foreach(v, k, x) {
                if (i++) put_sep(b, r, ',');
                json_t *js = json_string(k);
                char *lit = json_dumps(js, JSON_ENCODE_ANY);
                json_decref(js);
                if (lit) td_gb_lit(b, r, lit, strlen(lit));
                free(lit);
                put_sep(b, r, ':');
                td_gb_ref(b, r, const_value(c, x, depth + 1));
            }
        }
        put_ws(b, r), td_gb_lit(b, r, arr ? "]" : "}", 1);
        return r;
    }
    char buf[64], *lit = NULL;
    const char *txt = buf;
    bool integral = false;
    if (json_is_integer(v)) snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v)), integral = true;
    else if (json_is_real(v) && fabs(json_real_value(v)) < 9007199254740992.5 && json_real_value(v) == floor(json_real_value(v)))
        snprintf(buf, sizeof buf, "%.0f", json_real_value(v)), integral = true;
    else txt = lit = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!txt) return td_gb_fail(b, TD_ERR_NOMEM, "json_schema: out of memory"), 0;
    if (integral && !strcmp(buf, "-0")) snprintf(buf, sizeof buf, "0"); /* -0 == 0: accept "0"; "-0" is left out */
    td_gb_lit(b, r, txt, strlen(txt));
    free(lit);
    if (integral) {
        int32_t frac = td_gb_rule(b);
        td_gb_lit(b, frac, ".0", 2);
        td_gb_alt(b, frac);
        td_gb_ref(b, r, frac);
    }
    return r;
}

/* enum / const: the values filtered by type; strings, booleans and null in
 * one literal trie (deterministic even for huge enums), the rest one by one. */
static int32_t sc_enum(sc *c, json_t *vals, int types) {
    size_t n = json_array_size(vals);
    char **s = calloc(n ? n : 1, sizeof *s);
    size_t *len = calloc(n ? n : 1, sizeof *len);
    int k = 0;
    int32_t r = td_gb_rule(c->b);
    bool first = true;
    if (!s || !len) {
        td_gb_fail(c->b, TD_ERR_NOMEM, "json_schema: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n && !c->b->rc; i++) {
        json_t *v = json_array_get(vals, i);
        if (!(json_types(v) & types)) continue;
        if (json_is_string(v) || json_is_boolean(v) || json_is_null(v)) {
            s[k] = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!s[k]) {
                td_gb_fail(c->b, TD_ERR_NOMEM, "json_schema: out of memory");
                goto done;
            }
            len[k] = strlen(s[k]);
            k++;
            continue;
        }
        if (!first) td_gb_alt(c->b, r);
        first = false;
        td_gb_ref(c->b, r, const_value(c, v, 0));
    }
    if (k || first) {
        if (!first) td_gb_alt(c->b, r);
        td_gb_ref(c->b, r, td_gb_literals(c->b, (const uint8_t *const *)s, len, k));
    }
done:
    for (int i = 0; i < k; i++) free(s[i]);
    free(s), free(len);
    return r;
}

static int get_count(sc *c, json_t *n, const char *kw, const char *ptr, int dflt) {
    json_t *v = json_object_get(n, kw);
    if (!v) return dflt;
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (d < 0 || d != (double)(long long)d) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", kw), dflt;
    if (d > GR_MAX_REPEAT) {
        td_gb_fail(c->b, TD_ERR_LIMIT, "json_schema: '%s' over %d at %s", kw, GR_MAX_REPEAT, at(ptr));
        return dflt;
    }
    return (int)d;
}

static int32_t sc_string(sc *c, json_t *n, const char *ptr) {
    json_t *pat = json_object_get(n, "pattern");
    int lo = get_count(c, n, "minLength", ptr, 0), hi = get_count(c, n, "maxLength", ptr, -1);
    if (pat) {
        if (!json_is_string(pat)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "pattern");
        if (json_object_get(n, "minLength") || json_object_get(n, "maxLength"))
            return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported: minLength/maxLength combined with", "pattern");
        int32_t body;
        if (td_gr_regex_compile(c->b, json_string_value(pat), json_string_length(pat), true, true, &body)) return 0;
        int32_t r = td_gb_rule(c->b);
        td_gb_lit(c->b, r, "\"", 1), td_gb_ref(c->b, r, body), td_gb_lit(c->b, r, "\"", 1);
        return r;
    }
    if (hi >= 0 && hi < lo) return td_gb_never(c->b);
    return str_rule(c->b, lo, hi);
}

/* Digit strings of length L from a to z (same length, a <= z), O(L^2) rules. */
static int32_t same_len(gr_builder *b, const char *a, const char *z, int L) {
    int32_t r = td_gb_rule(b);
    if (L == 0) return r;
    bool lo0 = true, hi9 = true;
    for (int i = 1; i < L; i++) lo0 &= a[i] == '0', hi9 &= z[i] == '9';
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    if (lo0 && hi9) {
        td_gb_byte_range(b, r, a[0], z[0]);
        for (int i = 1; i < L; i++) td_gb_byte_range(b, r, '0', '9');
    } else if (a[0] == z[0]) {
        td_gb_lit(b, r, a, 1), td_gb_ref(b, r, same_len(b, a + 1, z + 1, L - 1));
    } else {
        td_gb_lit(b, r, a, 1), td_gb_ref(b, r, same_len(b, a + 1, nines, L - 1));
        if (a[0] + 1 <= z[0] - 1) {
            td_gb_alt(b, r), td_gb_byte_range(b, r, a[0] + 1, z[0] - 1);
            for (int i = 1; i < L; i++) td_gb_byte_range(b, r, '0', '9');
        }
        td_gb_alt(b, r), td_gb_lit(b, r, z, 1), td_gb_ref(b, r, same_len(b, zeros, z + 1, L - 1));
    }
    return r;
}

/* Alternatives of r: the decimal forms (no leading zeros) of a..z (z NULL: up to INT_DIGITS digits). */
static void mag_range(gr_builder *b, int32_t r, bool *first, unsigned long long a, const unsigned long long *z) {
    char as[24], zs[24], lo[24], hi[24];
    int la = snprintf(as, sizeof as, "%llu", a), lz = z ? snprintf(zs, sizeof zs, "%llu", *z) : INT_DIGITS;
    for (int L = la; L <= lz; L++) {
        if (L == la) memcpy(lo, as, (size_t)L + 1);
        else memset(lo, '0', (size_t)L), lo[0] = '1', lo[L] = 0;
        if (z && L == lz) memcpy(hi, zs, (size_t)L + 1);
        else memset(hi, '9', (size_t)L), hi[L] = 0;
        if (!*first) td_gb_alt(b, r);
        *first = false;
        td_gb_ref(b, r, same_len(b, lo, hi, L));
    }
}

/* Integers in [lo, hi] (either side may be open: then up to INT_DIGITS digits). */
static int32_t int_range(gr_builder *b, bool has_lo, long long lo, bool has_hi, long long hi) {
    int32_t r = td_gb_rule(b);
    bool first = true;
    if (!has_lo || lo < 0) { /* negatives: "-" then magnitudes |min(hi,-1)| .. |lo| */
        long long nh = has_hi && hi < -1 ? hi : -1;
        {
            int32_t neg = td_gb_rule(b);
            bool f2 = true;
            unsigned long long top = has_lo ? (unsigned long long)(-lo) : 0;
            mag_range(b, neg, &f2, (unsigned long long)(-nh), has_lo ? &top : NULL);
            first = false;
            td_gb_lit(b, r, "-", 1), td_gb_ref(b, r, neg);
        }
    }
    long long pl = has_lo && lo > 0 ? lo : 0;
    if (!has_hi || hi >= pl) {
        unsigned long long top = has_hi ? (unsigned long long)hi : 0;
        mag_range(b, r, &first, (unsigned long long)pl, has_hi ? &top : NULL);
    }
    if (first) td_gb_ref(b, r, td_gb_never(b));
    return r;
}

/* number: minimum 0 (no minus sign) only. integer: minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum within +-1e18. */
static int32_t sc_number(sc *c, json_t *n, const char *ptr, bool integer) {
    static const char *const kws[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    bool has[4] = {0};
    double val[4] = {0};
    for (int i = 0; i < 4; i++) {
        json_t *x = json_object_get(n, kws[i]);
        if (!x) continue;
        if (!json_is_number(x)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", kws[i]);
        has[i] = true, val[i] = json_number_value(x);
        if (fabs(val[i]) > 1e18) return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported: bound beyond 1e18 in", kws[i]);
    }
    if (!integer) {
        for (int i = 1; i < 4; i++)
            if (has[i]) return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported on type number:", kws[i]);
        if (has[0] && val[0] != 0) return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported on type number (only 0):", "minimum");
        return num_rule(c->b, false, has[0]);
    }
    if (!has[0] && !has[1] && !has[2] && !has[3]) return num_rule(c->b, true, false);
    bool hl = has[0] || has[1], hh = has[2] || has[3];
    long long lo = LLONG_MIN, hi = LLONG_MAX;
    if (has[0]) lo = (long long)ceil(val[0]);
    if (has[1] && (long long)floor(val[1]) + 1 > lo) lo = (long long)floor(val[1]) + 1;
    if (has[2]) hi = (long long)floor(val[2]);
    if (has[3] && (long long)ceil(val[3]) - 1 < hi) hi = (long long)ceil(val[3]) - 1;
    if (hl && hh && lo > hi) return td_gb_never(c->b);
    return int_range(c->b, hl, lo, hh, hi);
}

/* Extra-property keys: raw (unescaped) strings other than the declared
 * names, as a code-point trie whose off-trie branches loop on any char. */
static int32_t extra_key(sc *c, json_t *props) {
    gr_builder *b = c->b;
    cpset raw = {0};
    td_cps_add(b, &raw, 0x20, 0x21), td_cps_add(b, &raw, 0x23, 0x5B), td_cps_add(b, &raw, 0x5D, 0x10FFFF);
    int32_t any = td_gb_cpset_rule(b, &raw, false), loop = td_gb_rule(b);
    uint32_t ae = EL(E_REF, (uint32_t)any);
    td_gb_repeat(b, loop, &ae, 1, 0, -1);
    /* trie over the names' code points (names with chars needing escapes cannot collide) */
    typedef struct { uint32_t cp, child, sib; bool term; int32_t rule; } node;
    size_t cap = 1;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) cap += strlen(k);
    node *t = calloc(cap, sizeof *t);
    uint32_t *q = malloc(cap * sizeof *q);
    int32_t key = td_gb_rule(b);
    if (!t || !q) {
        free(t), free(q), td_cps_free(&raw);
        return td_gb_fail(b, TD_ERR_NOMEM, "json_schema: out of memory"), 0;
    }
    uint32_t nn = 1;
    json_object_foreach(props, k, v) {
        uint32_t cur = 0;
        bool ok = true;
        for (const unsigned char *p = (const unsigned char *)k; *p && ok;) {
            uint32_t cp = *p;
            int l = cp < 0x80 ? 1 : cp < 0xE0 ? 2 : cp < 0xF0 ? 3 : 4;
            if (l > 1) cp &= 0x3Fu >> (l - 1);
            for (int i = 1; i < l; i++) cp = cp << 6 | (p[i] & 63u);
            p += l;
            if (cp < 0x20 || cp == '"' || cp == '\\') ok = false;
            if (!ok) break;
            uint32_t ch = t[cur].child;
            while (ch && t[ch].cp != cp) ch = t[ch].sib;
            if (!ch) ch = nn++, t[ch].cp = cp, t[ch].sib = t[cur].child, t[cur].child = ch;
            cur = ch;
        }
        if (ok) t[cur].term = true;
    }
    uint32_t qh = 0, qt = 0;
    t[0].rule = td_gb_rule(b);
    q[qt++] = 0;
    while (qh < qt && !b->rc) {
        uint32_t x = q[qh++];
        int32_t r = t[x].rule;
        cpset other = {0};
        for (uint32_t i = 0; i < (uint32_t)raw.n; i++) td_cps_add(b, &other, raw.r[i][0], raw.r[i][1]);
        for (uint32_t ch = t[x].child; ch; ch = t[ch].sib) {
            t[ch].rule = td_gb_rule(b);
            q[qt++] = ch;
            td_gb_cp(b, r, t[ch].cp, false);
            td_gb_ref(b, r, t[ch].rule);
            td_gb_alt(b, r);
            cpset one = {0};
            td_cps_add(b, &one, t[ch].cp, t[ch].cp);
            td_cps_negate(b, &one);
            /* other &= ~{cp}: intersect by rebuilding */
            cpset nx = {0};
            for (int i = 0; i < other.n; i++)
                for (int j = 0; j < one.n; j++) {
                    uint32_t lo = other.r[i][0] > one.r[j][0] ? other.r[i][0] : one.r[j][0];
                    uint32_t hi = other.r[i][1] < one.r[j][1] ? other.r[i][1] : one.r[j][1];
                    if (lo <= hi) td_cps_add(b, &nx, lo, hi);
                }
            td_cps_free(&one), td_cps_free(&other);
            other = nx;
        }
        td_gb_ref(b, r, td_gb_cpset_rule(b, &other, false));
        td_gb_ref(b, r, loop);
        if (!t[x].term) td_gb_alt(b, r); /* stopping here is a key that is not a name */
        td_cps_free(&other);
    }
    td_gb_lit(b, key, "\"", 1), td_gb_ref(b, key, t[0].rule), td_gb_lit(b, key, "\"", 1);
    free(t), free(q), td_cps_free(&raw);
    return key;
}

static int32_t sc_object(sc *c, json_t *n, const char *ptr, int depth) {
    gr_builder *b = c->b;
    json_t *props = json_object_get(n, "properties"), *req = json_object_get(n, "required");
    json_t *addl = json_object_get(n, "additionalProperties");
    if (props && !json_is_object(props)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "properties");
    if (req && !json_is_array(req)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "required");
    size_t nreq = json_array_size(req);
    for (size_t i = 0; i < nreq; i++)
        if (!json_is_string(json_array_get(req, i))) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "required");
    /* entries: declared properties in schema order, then required names not declared (any value) */
    size_t np = json_object_size(props), ne = 0;
    const char **name = calloc(np + nreq + 1, sizeof *name);
    int32_t *val = calloc(np + nreq + 1, sizeof *val);
    bool *must = calloc(np + nreq + 1, sizeof *must);
    int32_t r = 0;
    if (!name || !val || !must) {
        td_gb_fail(b, TD_ERR_NOMEM, "json_schema: out of memory");
        goto done;
    }
    const char *k;
    json_t *v;
    char cp[512];
    json_object_foreach(props, k, v) {
        child_ptr(cp, sizeof cp, ptr, "properties", k);
        name[ne] = k, val[ne] = sc_node(c, v, cp, depth + 1);
        for (size_t i = 0; i < nreq; i++) must[ne] |= !strcmp(json_string_value(json_array_get(req, i)), k);
        ne++;
        if (b->rc) goto done;
    }
    for (size_t i = 0; i < nreq; i++) {
        const char *rn = json_string_value(json_array_get(req, i));
        bool dup = false;
        for (size_t j = 0; j < ne; j++) dup |= !strcmp(name[j], rn);
        if (!dup) name[ne] = rn, val[ne] = any_value(b, 1), must[ne] = true, ne++;
    }
    int32_t xkey = -1, xval = -1;
    if (addl ? !json_is_false(addl) : !c->strict) {
        child_ptr(cp, sizeof cp, ptr, "additionalProperties", NULL);
        xval = addl && !json_is_true(addl) ? sc_node(c, addl, cp, depth + 1) : any_value(b, 1);
        json_t *names = json_object();
        for (size_t i = 0; i < ne; i++) json_object_set_new(names, name[i], json_null());
        xkey = extra_key(c, names);
        json_decref(names);
    }
    /* A_i: nothing emitted yet; B_i: something emitted (a comma comes first) */
    int32_t A = td_gb_rule(b), B = td_gb_rule(b), A0 = A;
    for (size_t i = 0; i <= ne && !b->rc; i++) {
        int32_t A2 = i < ne ? td_gb_rule(b) : -1, B2 = i < ne ? td_gb_rule(b) : -1;
        for (int pass = 0; pass < 2; pass++) {
            int32_t R = pass ? B : A;
            if (i == ne) { /* tail: additional properties, any number */
                if (xkey >= 0) {
                    if (pass) put_sep(b, R, ',');
                    td_gb_ref(b, R, xkey), put_sep(b, R, ':'), td_gb_ref(b, R, xval), td_gb_ref(b, R, B);
                    td_gb_alt(b, R);
                }
                continue;
            }
            if (pass) put_sep(b, R, ',');
            json_t *js = json_string(name[i]);
            char *lit = json_dumps(js, JSON_ENCODE_ANY);
            json_decref(js);
            if (!lit) {
                td_gb_fail(b, TD_ERR_NOMEM, "json_schema: out of memory");
                break;
            }
            td_gb_lit(b, R, lit, strlen(lit));
            free(lit);
            put_sep(b, R, ':');
            td_gb_ref(b, R, val[i]);
            td_gb_ref(b, R, B2);
            if (!must[i]) td_gb_alt(b, R), td_gb_ref(b, R, pass ? B2 : A2);
        }
        A = A2, B = B2;
    }
    r = td_gb_rule(b);
    td_gb_lit(b, r, "{", 1), put_ws(b, r), td_gb_ref(b, r, A0), put_ws(b, r), td_gb_lit(b, r, "}", 1);
done:
    free(name), free(val), free(must);
    return r;
}

static int32_t sc_array(sc *c, json_t *n, const char *ptr, int depth) {
    gr_builder *b = c->b;
    json_t *items = json_object_get(n, "items"), *prefix = json_object_get(n, "prefixItems");
    int lo = get_count(c, n, "minItems", ptr, 0), hi = get_count(c, n, "maxItems", ptr, -1);
    char cp[512];
    if (json_is_array(items)) { /* draft 4-2019 tuple form = prefixItems, rest unconstrained */
        if (prefix) return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported: array-form items with", "prefixItems");
        prefix = items, items = NULL;
    }
    if (prefix && !json_is_array(prefix)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "prefixItems");
    int k = (int)json_array_size(prefix);
    if (k > GR_MAX_REPEAT) return td_gb_fail(b, TD_ERR_LIMIT, "json_schema: prefixItems over %d at %s", GR_MAX_REPEAT, at(ptr)), 0;
    if (hi >= 0 && hi < lo) return td_gb_never(b);
    int32_t *S = calloc((size_t)k + 1, sizeof *S);
    if (!S) return td_gb_fail(b, TD_ERR_NOMEM, "json_schema: out of memory"), 0;
    for (int j = 0; j < k && !b->rc; j++) {
        snprintf(cp, sizeof cp, "%s/prefixItems/%d", ptr, j);
        S[j] = sc_node(c, json_array_get(prefix, (size_t)j), cp, depth + 1);
    }
    int32_t I = -1; /* -1: no items past the prefix */
    child_ptr(cp, sizeof cp, ptr, "items", NULL);
    if (!items || json_is_true(items)) I = any_value(b, 1);
    else if (!json_is_false(items)) I = sc_node(c, items, cp, depth + 1);
    /* C_j: j items emitted. The chain ends at hi, or loops once past max(k, lo). */
    int top = hi >= 0 ? hi : (k > lo ? k : lo);
    if (hi < 0 && top < 1) top = 1; /* the loop needs the comma: it starts at item 2 */
    int32_t C0 = td_gb_rule(b), C = C0;
    for (int j = 0; j <= top && !b->rc; j++) {
        int32_t Sj = j < k ? S[j] : I;
        bool loop = hi < 0 && j == top;
        if (j == hi || Sj < 0) { /* nothing more may follow */
            if (j < lo) td_gb_ref(b, C, td_gb_never(b));
            break;
        }
        int32_t next = loop ? C : td_gb_rule(b);
        if (j) put_sep(b, C, ',');
        td_gb_ref(b, C, Sj), td_gb_ref(b, C, next);
        if (j >= lo) td_gb_alt(b, C);
        if (loop) break;
        C = next;
    }
    free(S);
    int32_t r = td_gb_rule(b);
    td_gb_lit(b, r, "[", 1), put_ws(b, r), td_gb_ref(b, r, C0), put_ws(b, r), td_gb_lit(b, r, "]", 1);
    return r;
}

static int32_t sc_node(sc *c, json_t *n, const char *ptr, int depth) {
    gr_builder *b = c->b;
    if (b->rc) return 0;
    if (depth > GR_MAX_NEST)
        return td_gb_fail(b, TD_ERR_LIMIT, "json_schema: nested deeper than %d at %.200s", GR_MAX_NEST, at(ptr)), 0;
    if (json_is_true(n)) return any_value(b, 1);
    if (json_is_false(n)) return td_gb_never(b);
    if (!json_is_object(n)) return td_gb_fail(b, TD_ERR_ARG, "json_schema: schema at %s is not an object", at(ptr)), 0;
    unsigned seen = 0;
    const char *key;
    json_t *v;
    json_object_foreach(n, key, v) {
        int kw = 0;
        while (kw < K_N && strcmp(kw_names[kw], key)) kw++;
        if (kw < K_N) {
            seen |= 1u << kw;
            continue;
        }
        int a = 0;
        while (annotations[a] && strcmp(annotations[a], key)) a++;
        if (!annotations[a]) return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported keyword", key);
    }
    char cp[512];
    /* combinators stand alone (besides annotations): no intersection needed */
    static const int comb[] = {K_REF, K_ANYOF, K_ONEOF, K_ALLOF};
    for (int i = 0; i < 4; i++) {
        if (!(seen & 1u << comb[i])) continue;
        for (int k = 0; k < K_N; k++)
            if (k != comb[i] && seen & 1u << k) {
                td_gb_fail(b, TD_ERR_UNSUPPORTED, "json_schema: unsupported combination of '%s' with '%s' at %s", kw_names[comb[i]],
                        kw_names[k], at(ptr));
                return 0;
            }
        json_t *x = json_object_get(n, kw_names[comb[i]]);
        if (comb[i] == K_REF) {
            if (!json_is_string(x)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "$ref");
            json_t *t = resolve(c, json_string_value(x), ptr);
            return t ? sc_ref(c, t, json_string_value(x), depth) : 0;
        }
        if (!json_is_array(x) || !json_array_size(x)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", kw_names[comb[i]]);
        if (comb[i] == K_ALLOF && json_array_size(x) != 1)
            return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported: more than one schema in", "allOf");
        int32_t r = td_gb_rule(b); /* oneOf is treated as anyOf (exclusivity is not checked) */
        for (size_t j = 0; j < json_array_size(x) && !b->rc; j++) {
            snprintf(cp, sizeof cp, "%s/%s/%zu", ptr, kw_names[comb[i]], j);
            if (j) td_gb_alt(b, r);
            td_gb_ref(b, r, sc_node(c, json_array_get(x, j), cp, depth + 1));
        }
        return r;
    }
    int types = T_ALL;
    json_t *ty = json_object_get(n, "type");
    if (ty) {
        types = 0;
        size_t nt = json_is_array(ty) ? json_array_size(ty) : 1;
        for (size_t i = 0; i < nt; i++) {
            json_t *t = json_is_array(ty) ? json_array_get(ty, i) : ty;
            int k = 0;
            while (k < 7 && (!json_is_string(t) || strcmp(json_string_value(t), type_names[k]))) k++;
            if (k == 7) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "type");
            types |= 1 << k;
        }
    }
    if (seen & (1u << K_ENUM | 1u << K_CONST)) {
        for (int k = 0; k < K_N; k++)
            if (k != K_ENUM && k != K_CONST && k != K_TYPE && seen & 1u << k)
                return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported: enum/const combined with", kw_names[k]);
        if ((seen & 1u << K_ENUM) && (seen & 1u << K_CONST))
            return sc_fail(c, TD_ERR_UNSUPPORTED, ptr, "unsupported: enum combined with", "const");
        json_t *vals = json_object_get(n, "enum");
        if (vals && !json_is_array(vals)) return sc_fail(c, TD_ERR_ARG, ptr, "bad value of", "enum");
        json_t *one = NULL;
        if (!vals) one = json_array(), json_array_append(one, json_object_get(n, "const")), vals = one;
        int32_t r = sc_enum(c, vals, types | (types & T_NUM ? T_INT : 0));
        json_decref(one);
        return r;
    }
    if (types & T_NUM) types &= ~T_INT;
    int32_t r = td_gb_rule(b);
    bool first = true;
    for (int k = 0; k < 7 && !b->rc; k++) {
        if (!(types & 1 << k)) continue;
        int32_t t = 0;
        switch (1 << k) {
        case T_NULL: t = td_gb_rule(b), put_lit_str(b, t, "null"); break;
        case T_BOOL: t = td_gb_rule(b), put_lit_str(b, t, "true"), td_gb_alt(b, t), put_lit_str(b, t, "false"); break;
        case T_OBJ: t = sc_object(c, n, ptr, depth); break;
        case T_ARR: t = sc_array(c, n, ptr, depth); break;
        case T_STR: t = sc_string(c, n, ptr); break;
        case T_NUM: t = sc_number(c, n, ptr, false); break;
        case T_INT: t = sc_number(c, n, ptr, true); break;
        }
        if (!first) td_gb_alt(b, r);
        first = false;
        td_gb_ref(b, r, t);
    }
    return r;
}

int td_grammar_json_schema(const char *schema, size_t len, const td_grammar_opts *o, td_grammar **out, td_err *err) {
    *out = NULL;
    if (!schema) return TD_FAIL(err, TD_ERR_ARG, "json_schema: NULL schema");
    if (len > (8u << 20)) return TD_FAIL(err, TD_ERR_LIMIT, "json_schema: schema over 8 MiB");
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root) {
        int code = json_error_code(&je) == json_error_stack_overflow ? TD_ERR_LIMIT : TD_ERR_ARG;
        return TD_FAIL(err, code, "json_schema: invalid JSON: %s (line %d)", je.text, je.line);
    }
    gr_builder b;
    td_gb_init(&b, err);
    set_ws(&b, o);
    sc c = {.b = &b, .root = root, .strict = o && o->strict};
    int32_t r = sc_ref(&c, root, "", 0);
    free(c.refs);
    json_decref(root);
    return td_gb_finish(&b, r, o, out);
}
