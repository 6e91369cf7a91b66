/* Regex -> grammar: the ERE/PCRE subset used by structured outputs (see
 * README.md). Recursive descent bounded by GR_MAX_NEST; each group becomes a
 * rule, each quantified atom a repetition of one "unit" (a few elements). In
 * JSON mode (schema "pattern") code points are emitted as they appear inside a
 * JSON string (canonical escapes for '"', '\\' and controls). */
#include <stdlib.h>
#include <string.h>
#include "grammar/internal.h"

typedef struct {
    gr_builder *b;
    const unsigned char *s;
    size_t n, i;
    bool json;
    int depth;
    int32_t dot; /* rule for '.', built once */
} rx;

#define UNIT_MAX 8

static int rx_fail(rx *p, int code, const char *what) {
    return td_gb_fail(p->b, code, "regex: %s at offset %zu", what, p->i);
}

/* Decodes one UTF-8 code point at p->i (strict); -1 on invalid input. */
static int32_t rx_utf8(rx *p) {
    const unsigned char *s = p->s + p->i;
    size_t left = p->n - p->i;
    uint32_t c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) return -1;
    if (len > 1) c &= 0x3Fu >> (len - 1);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return -1;
        c = c << 6 | (s[k] & 63);
    }
    static const uint32_t minv[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < minv[len] || c > 0x10FFFF || (c >= 0xD800 && c < 0xE000)) return -1;
    p->i += (size_t)len;
    return (int32_t)c;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Hex digits: exactly `fixed` of them, or {...} when braces are allowed. */
static int32_t rx_hex(rx *p, int fixed) {
    uint32_t v = 0;
    if (p->i < p->n && p->s[p->i] == '{') {
        p->i++;
        int nd = 0;
        while (p->i < p->n && hexval(p->s[p->i]) >= 0 && nd < 7) v = v * 16 + (uint32_t)hexval(p->s[p->i++]), nd++;
        if (!nd || p->i >= p->n || p->s[p->i] != '}') return -1;
        p->i++;
    } else {
        for (int k = 0; k < fixed; k++) {
            if (p->i >= p->n || hexval(p->s[p->i]) < 0) return -1;
            v = v * 16 + (uint32_t)hexval(p->s[p->i++]);
        }
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) return -1;
    return (int32_t)v;
}

/* Class escapes \d \w \s and their complements into s; true if c was one. */
static bool class_escape(rx *p, int c, cpset *s) {
    cpset t = {0};
    int lc = c | 0x20;
    if (lc == 'd') td_cps_add(p->b, &t, '0', '9');
    else if (lc == 'w') {
        td_cps_add(p->b, &t, '0', '9'), td_cps_add(p->b, &t, 'A', 'Z'), td_cps_add(p->b, &t, 'a', 'z');
        td_cps_add(p->b, &t, '_', '_');
    } else if (lc == 's') {
        td_cps_add(p->b, &t, '\t', '\r'), td_cps_add(p->b, &t, ' ', ' ');
    } else return false;
    if (c != lc) td_cps_negate(p->b, &t);
    for (int i = 0; i < t.n; i++) td_cps_add(p->b, s, t.r[i][0], t.r[i][1]);
    td_cps_free(&t);
    return true;
}

/* After a backslash: a literal code point, or -2 after adding a class to cls
 * (when cls is not NULL), or -1 on error (reported). */
static int32_t rx_escape(rx *p, cpset *cls) {
    if (p->i >= p->n) return rx_fail(p, TD_ERR_ARG, "trailing backslash"), -1;
    int c = p->s[p->i++];
    if (cls && class_escape(p, c, cls)) return -2;
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return 7;
    case 'e': return 27;
    case '0': return 0;
    case 'x': {
        int32_t v = rx_hex(p, 2);
        return v < 0 ? (rx_fail(p, TD_ERR_ARG, "bad \\x escape"), -1) : v;
    }
    case 'u': {
        int32_t v = rx_hex(p, 4);
        return v < 0 ? (rx_fail(p, TD_ERR_ARG, "bad \\u escape"), -1) : v;
    }
    }
    if (c >= 0x80) { /* escaped non-ASCII: itself */
        p->i--;
        int32_t v = rx_utf8(p);
        return v < 0 ? (rx_fail(p, TD_ERR_ARG, "invalid UTF-8"), -1) : v;
    }
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return c; /* punctuation */
    char what[64];
    snprintf(what, sizeof what, "unsupported escape '\\%c'%s", c,
             c >= '1' && c <= '9' ? " (backreference)" : c == 'b' || c == 'B' ? " (word boundary)" : "");
    p->i--;
    rx_fail(p, TD_ERR_UNSUPPORTED, what);
    return -1;
}

/* Unit elements for one literal code point. */
static int unit_cp(rx *p, uint32_t cp, uint32_t *el) {
    int32_t r = td_gb_rule(p->b); /* scratch rule, left empty afterwards (unused) */
    if (p->b->rc) return 0;
    td_gb_cp(p->b, r, cp, p->json);
    gr_vec *v = &p->b->rules[r];
    int n = (int)v->n;
    memcpy(el, v->v, (size_t)n * 4);
    p->b->total -= v->n;
    v->n = 0;
    return n;
}

static int32_t rx_class(rx *p) {
    cpset s = {0};
    bool neg = false;
    if (p->i < p->n && p->s[p->i] == '^') neg = true, p->i++;
    bool first = true;
    for (;;) {
        if (p->i >= p->n) {
            rx_fail(p, TD_ERR_ARG, "unterminated character class");
            break;
        }
        int c = p->s[p->i];
        if (c == ']' && !first) {
            p->i++;
            break;
        }
        first = false;
        if (c == '[' && p->i + 1 < p->n && (p->s[p->i + 1] == ':' || p->s[p->i + 1] == '=' || p->s[p->i + 1] == '.')) {
            rx_fail(p, TD_ERR_UNSUPPORTED, "unsupported POSIX class");
            break;
        }
        int32_t lo;
        if (c == '\\') {
            p->i++;
            lo = rx_escape(p, &s);
            if (lo == -2) continue;
        } else lo = rx_utf8(p);
        if (lo < 0) {
            if (!p->b->rc) rx_fail(p, TD_ERR_ARG, "invalid UTF-8");
            break;
        }
        int32_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                hi = rx_escape(p, NULL);
            } else hi = rx_utf8(p);
            if (hi < 0 || hi < lo) {
                if (!p->b->rc) rx_fail(p, TD_ERR_ARG, "bad range in character class");
                break;
            }
        }
        td_cps_add(p->b, &s, (uint32_t)lo, (uint32_t)hi);
        if (p->b->rc) break;
    }
    if (neg) td_cps_negate(p->b, &s);
    td_cps_norm(&s);
    int32_t r = p->b->rc ? 0 : td_gb_cpset_rule(p->b, &s, p->json);
    td_cps_free(&s);
    return r;
}

static int32_t rx_alt(rx *p);

/* {m}, {m,}, {,n}, {m,n} at p->i (which is '{'): true and the bounds, or
 * false (not a quantifier: '{' is then a literal). */
static bool rx_braces(rx *p, int *lo, int *hi) {
    size_t j = p->i + 1;
    long a = -1, z = -1;
    bool comma = false;
    while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9') a = (a < 0 ? 0 : a) * 10 + (p->s[j++] - '0'), a = a > 1L << 30 ? 1L << 30 : a;
    if (j < p->n && p->s[j] == ',') {
        comma = true, j++;
        while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9') z = (z < 0 ? 0 : z) * 10 + (p->s[j++] - '0'), z = z > 1L << 30 ? 1L << 30 : z;
    }
    if (j >= p->n || p->s[j] != '}' || (a < 0 && z < 0)) return false;
    p->i = j + 1;
    *lo = a < 0 ? 0 : (int)a;
    *hi = comma ? (int)z : (int)a; /* z < 0: unbounded */
    return true;
}

static void rx_seq(rx *p, int32_t r) {
    while (p->i < p->n && !p->b->rc) {
        int c = p->s[p->i];
        if (c == '|' || c == ')') return;
        uint32_t el[UNIT_MAX];
        int ne = 0;
        if (c == '(') {
            p->i++;
            if (p->i < p->n && p->s[p->i] == '?') {
                if (p->i + 1 < p->n && p->s[p->i + 1] == ':') p->i += 2;
                else if (p->i + 2 < p->n && (p->s[p->i + 1] == '<' || (p->s[p->i + 1] == 'P' && p->s[p->i + 2] == '<')) &&
                         p->s[p->i + 2] != '=' && p->s[p->i + 2] != '!') {
                    while (p->i < p->n && p->s[p->i] != '>') p->i++; /* named group: same language */
                    if (p->i >= p->n) return (void)rx_fail(p, TD_ERR_ARG, "unterminated group name");
                    p->i++;
                } else return (void)rx_fail(p, TD_ERR_UNSUPPORTED, "unsupported group (lookaround, flags or conditional)");
            }
            if (++p->depth > GR_MAX_NEST) return (void)rx_fail(p, TD_ERR_LIMIT, "groups nested too deeply");
            int32_t sub = rx_alt(p);
            p->depth--;
            if (p->b->rc) return;
            if (p->i >= p->n || p->s[p->i] != ')') return (void)rx_fail(p, TD_ERR_ARG, "missing ')'");
            p->i++;
            el[ne++] = EL(E_REF, (uint32_t)sub);
        } else if (c == '[') {
            p->i++;
            el[ne++] = EL(E_REF, (uint32_t)rx_class(p));
        } else if (c == '.') {
            p->i++;
            if (p->dot < 0) {
                cpset s = {0};
                td_cps_add(p->b, &s, '\n', '\n');
                td_cps_negate(p->b, &s);
                p->dot = td_gb_cpset_rule(p->b, &s, p->json);
                td_cps_free(&s);
            }
            el[ne++] = EL(E_REF, (uint32_t)p->dot);
        } else if (c == '\\') {
            p->i++;
            cpset s = {0};
            int32_t cp = rx_escape(p, &s);
            if (cp == -2) {
                td_cps_norm(&s);
                el[ne++] = EL(E_REF, (uint32_t)td_gb_cpset_rule(p->b, &s, p->json));
            } else if (cp >= 0) {
                ne = unit_cp(p, (uint32_t)cp, el);
            }
            td_cps_free(&s);
        } else if (c == '^' || c == '$') {
            return (void)rx_fail(p, TD_ERR_UNSUPPORTED, "anchor not at the start/end of the pattern");
        } else if (c == '*' || c == '+' || c == '?') {
            return (void)rx_fail(p, TD_ERR_ARG, "nothing to repeat");
        } else {
            int32_t cp = rx_utf8(p);
            if (cp < 0) return (void)rx_fail(p, TD_ERR_ARG, "invalid UTF-8");
            ne = unit_cp(p, (uint32_t)cp, el);
        }
        if (p->b->rc) return;
        /* quantifier */
        int lo = 1, hi = 1;
        bool quant = false;
        if (p->i < p->n) {
            int q = p->s[p->i];
            if (q == '*') lo = 0, hi = -1, p->i++, quant = true;
            else if (q == '+') lo = 1, hi = -1, p->i++, quant = true;
            else if (q == '?') lo = 0, hi = 1, p->i++, quant = true;
            else if (q == '{' && rx_braces(p, &lo, &hi)) {
                quant = true;
                if (lo > GR_MAX_REPEAT || hi > GR_MAX_REPEAT)
                    return (void)td_gb_fail(p->b, TD_ERR_LIMIT, "regex: repetition bound over %d at offset %zu", GR_MAX_REPEAT, p->i);
                if (hi >= 0 && hi < lo) return (void)rx_fail(p, TD_ERR_ARG, "bad repetition bounds");
            }
        }
        if (quant && p->i < p->n) {
            if (p->s[p->i] == '?') p->i++; /* lazy: same language */
            else if (p->s[p->i] == '+') return (void)rx_fail(p, TD_ERR_UNSUPPORTED, "possessive quantifier");
            int dummy_lo, dummy_hi;
            size_t save = p->i;
            if (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?' ||
                                (p->s[p->i] == '{' && rx_braces(p, &dummy_lo, &dummy_hi))))
                return (void)rx_fail(p, TD_ERR_ARG, "multiple repeat");
            p->i = save;
        }
        td_gb_repeat(p->b, r, el, ne, lo, hi);
    }
}

static int32_t rx_alt(rx *p) {
    int32_t r = td_gb_rule(p->b);
    for (;;) {
        rx_seq(p, r);
        if (p->b->rc || p->i >= p->n || p->s[p->i] != '|') break;
        p->i++;
        td_gb_alt(p->b, r);
    }
    return r;
}

int td_gr_regex_compile(gr_builder *b, const char *re, size_t len, bool json, bool search, int32_t *rule) {
    rx p = {.b = b, .s = (const unsigned char *)re, .n = len, .json = json, .dot = -1};
    bool start = false, end = false;
    if (p.n && p.s[0] == '^') start = true, p.i = 1;
    if (p.n > p.i && p.s[p.n - 1] == '$') {
        size_t bs = 0;
        while (p.n - 1 > p.i + bs && p.s[p.n - 2 - bs] == '\\') bs++;
        if (bs % 2 == 0) end = true, p.n--;
    }
    int32_t body = rx_alt(&p);
    if (!b->rc && p.i < p.n) rx_fail(&p, TD_ERR_ARG, "unbalanced ')'");
    if (b->rc) return b->rc;
    if (search && (!start || !end)) { /* JSON Schema patterns are unanchored: pad with any text */
        cpset all = {0};
        td_cps_add(b, &all, 0, 0x10FFFF);
        uint32_t any = EL(E_REF, (uint32_t)td_gb_cpset_rule(b, &all, json));
        td_cps_free(&all);
        int32_t r = td_gb_rule(b);
        if (!start) td_gb_repeat(b, r, &any, 1, 0, -1);
        td_gb_ref(b, r, body);
        if (!end) td_gb_repeat(b, r, &any, 1, 0, -1);
        body = r;
    }
    *rule = body;
    return b->rc;
}

int td_grammar_regex(const char *re, size_t len, const td_grammar_opts *o, td_grammar **out, td_err *err) {
    *out = NULL;
    if (!re && len) return TD_FAIL(err, TD_ERR_ARG, "regex: NULL");
    if (len > (1u << 20)) return TD_FAIL(err, TD_ERR_LIMIT, "regex: longer than 1 MiB");
    gr_builder b;
    td_gb_init(&b, err);
    int32_t root = 0;
    td_gr_regex_compile(&b, re ? re : "", len, false, false, &root);
    return td_gb_finish(&b, root, o, out);
}
