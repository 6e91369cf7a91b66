/* Filters, tests, string/dict/list methods and globals, with the Python /
 * Jinja2 behaviour chat templates rely on. Anything not listed here is an
 * error naming it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <utf8proc.h>
#include "template/jinja.h"

/* ---- helpers ---- */
static jv mkstr(jctx *c, const char *s, size_t n) { return jv_str(td_ja_strndup(c->a, s, n), n); }

static int32_t next_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp = -1;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    *i += k > 0 ? (size_t)k : 1;
    return cp;
}

/* Python str.isspace */
static bool py_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool in_chars(int32_t cp, jv chars) {
    for (size_t i = 0; i < chars.s.n;)
        if (next_cp(chars.s.p, chars.s.n, &i) == cp) return true;
    return false;
}

/* strip(chars): which = 1 left, 2 right, 3 both */
static jv py_strip(jctx *c, const jnode *n, jv s, jv chars, int which) {
    if (chars.k != V_NONE && chars.k != V_UNDEF && chars.k != V_STR) td_jfail(c, n, "strip arg must be None or str");
    bool ws = chars.k != V_STR;
    size_t a = 0, b = s.s.n;
    if (which & 1)
        while (a < b) {
            size_t j = a;
            int32_t cp = next_cp(s.s.p, b, &j);
            if (ws ? !py_space(cp) : !in_chars(cp, chars)) break;
            a = j;
        }
    if (which & 2)
        while (b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)s.s.p[j] & 0xC0) == 0x80) j--;
            size_t k = j;
            int32_t cp = next_cp(s.s.p, b, &k);
            if (ws ? !py_space(cp) : !in_chars(cp, chars)) break;
            b = j;
        }
    return jv_str(s.s.p + a, b - a);
}

static jv map_case(jctx *c, jv s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    jbuf b = {.a = c->a};
    td_jb_put(&b, "", 0);
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.s.n;) {
        int32_t cp = next_cp(s.s.p, s.s.n, &i);
        int32_t o;
        if (mode == 0) o = utf8proc_tolower(cp);
        else if (mode == 1) o = utf8proc_toupper(cp);
        else if (mode == 2) o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        else o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        first = false;
        utf8proc_category_t k = utf8proc_category(cp);
        prev_cased = k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t el = utf8proc_encode_char(o, enc);
        td_jb_put(&b, (const char *)enc, (size_t)el);
    }
    return jv_str(b.p, b.n);
}

static jv str_replace(jctx *c, jv s, jv old, jv new, int64_t count) {
    jbuf b = {.a = c->a};
    td_jb_put(&b, "", 0);
    if (!old.s.n) { /* Python inserts between every code point */
        size_t i = 0;
        int64_t k = 0;
        while (i <= s.s.n) {
            if (count < 0 || k < count) { td_jb_put(&b, new.s.p, new.s.n); k++; }
            if (i == s.s.n) break;
            size_t j = i;
            next_cp(s.s.p, s.s.n, &j);
            td_jb_put(&b, s.s.p + i, j - i);
            i = j;
        }
        return jv_str(b.p, b.n);
    }
    size_t i = 0;
    int64_t k = 0;
    while (i < s.s.n) {
        const char *hit = (count < 0 || k < count) ? memmem(s.s.p + i, s.s.n - i, old.s.p, old.s.n) : NULL;
        if (!hit) break;
        td_jb_put(&b, s.s.p + i, (size_t)(hit - (s.s.p + i)));
        td_jb_put(&b, new.s.p, new.s.n);
        i = (size_t)(hit - s.s.p) + old.s.n;
        k++;
    }
    td_jb_put(&b, s.s.p + i, s.s.n - i);
    return jv_str(b.p, b.n);
}

static jv str_split(jctx *c, jv s, jv sep, int64_t maxsplit, bool from_right) {
    jlist *l = td_jl_new(c->a, 8);
    if (sep.k != V_STR) { /* runs of whitespace, empty strings dropped */
        size_t i = 0;
        int64_t k = 0;
        if (from_right) { /* rsplit(None): collect all then merge the head */
            jlist *all = td_jl_new(c->a, 8);
            jv r = str_split(c, s, jv_none(), -1, false);
            all = r.l;
            if (maxsplit < 0 || (int64_t)all->n <= maxsplit) return r; /* every word split off */
            /* the last maxsplit words split off; the head is the text before them, right-stripped
               (Python keeps its leading whitespace: ' a b '.rsplit(None, 1) == [' a', 'b']) */
            size_t keep = all->n - (size_t)maxsplit; /* >= 1 */
            const char *end = keep < all->n ? all->v[keep].s.p : s.s.p + s.s.n;
            jv head = py_strip(c, NULL, jv_str(s.s.p, (size_t)(end - s.s.p)), jv_none(), 2);
            td_jl_push(c->a, l, head);
            for (size_t j = keep; j < all->n; j++) td_jl_push(c->a, l, all->v[j]);
            return jv_list(l);
        }
        while (i < s.s.n) {
            size_t j = i;
            while (j < s.s.n) { size_t t = j; if (!py_space(next_cp(s.s.p, s.s.n, &t))) break; j = t; }
            i = j;
            if (i >= s.s.n) break;
            if (maxsplit >= 0 && k == maxsplit) { /* the remainder, trailing whitespace kept (as Python) */
                td_jl_push(c->a, l, jv_str(s.s.p + i, s.s.n - i));
                break;
            }
            while (j < s.s.n) { size_t t = j; if (py_space(next_cp(s.s.p, s.s.n, &t))) break; j = t; }
            td_jl_push(c->a, l, jv_str(s.s.p + i, j - i));
            k++;
            i = j;
        }
        return jv_list(l);
    }
    if (!sep.s.n) return jv_undef("empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || k < maxsplit) ? memmem(s.s.p + i, s.s.n - i, sep.s.p, sep.s.n) : NULL;
            if (!hit) { td_jl_push(c->a, l, jv_str(s.s.p + i, s.s.n - i)); break; }
            td_jl_push(c->a, l, jv_str(s.s.p + i, (size_t)(hit - s.s.p) - i));
            i = (size_t)(hit - s.s.p) + sep.s.n;
            k++;
        }
        return jv_list(l);
    }
    /* rsplit with a separator: scan from the right, then reverse */
    jwork(c->a, (s.s.n >> 6) * (1 + (sep.s.n >> 4)));
    jlist *rev = td_jl_new(c->a, 8);
    size_t end = s.s.n;
    int64_t k = 0;
    for (;;) {
        const char *hit = NULL;
        if (maxsplit < 0 || k < maxsplit)
            for (size_t p = end >= sep.s.n ? end - sep.s.n + 1 : 0; p-- > 0;)
                if (!memcmp(s.s.p + p, sep.s.p, sep.s.n)) { hit = s.s.p + p; break; }
        if (!hit) { td_jl_push(c->a, rev, jv_str(s.s.p, end)); break; }
        size_t hp = (size_t)(hit - s.s.p);
        td_jl_push(c->a, rev, jv_str(s.s.p + hp + sep.s.n, end - hp - sep.s.n));
        end = hp;
        k++;
    }
    for (size_t i = rev->n; i-- > 0;) td_jl_push(c->a, l, rev->v[i]);
    return jv_list(l);
}

static bool prefix_match(jctx *c, const jnode *n, jv s, jv p, bool suffix) {
    if (p.k == V_LIST && (p.flags & JF_TUPLE)) {
        for (size_t i = 0; i < p.l->n; i++)
            if (prefix_match(c, n, s, p.l->v[i], suffix)) return true;
        return false;
    }
    if (p.k != V_STR) td_jfail(c, n, "%s first arg must be str or a tuple of str, not %s", suffix ? "endswith" : "startswith", td_jv_type_name(p));
    if (p.s.n > s.s.n) return false;
    return !memcmp(s.s.p + (suffix ? s.s.n - p.s.n : 0), p.s.p, p.s.n);
}

/* Argument access: positional i, or keyword name, or default. */
static jv arg(jv *args, int nargs, const char **kw, jv *kwv, int nkw, int i, const char *name, jv dflt) {
    if (i >= 0 && i < nargs) return args[i];
    for (int k = 0; k < nkw; k++)
        if (name && !strcmp(kw[k], name)) return kwv[k];
    return dflt;
}
#define ARG(i, name, d) arg(args, nargs, kw, kwv, nkw, (i), (name), (d))

static void need_str(jctx *c, const jnode *n, jv v, const char *what) {
    if (v.k != V_STR) td_jfail(c, n, "%s expects a string, got %s", what, td_jv_type_name(v));
}

static int64_t as_int(jctx *c, const jnode *n, jv v, const char *what) {
    if (v.k == V_INT) return v.i;
    if (v.k == V_BOOL) return v.b;
    td_jfail(c, n, "%s expects an integer, got %s", what, td_jv_type_name(v));
}

static jv tojson(jctx *c, const jnode *n, jv v, jv indent, jv seps, jv sort_keys, jv ensure_ascii) {
    if (td_jv_truthy(ensure_ascii)) td_jfail(c, n, "tojson(ensure_ascii=True) is not supported");
    const char *ind = NULL;
    if (indent.k == V_INT) {
        char *s = td_ja_alloc(c->a, (size_t)(indent.i > 0 ? indent.i : 0) + 1);
        int64_t k = 0;
        for (; k < indent.i; k++) s[k] = ' ';
        s[k] = 0;
        ind = s;
    } else if (indent.k == V_STR) {
        ind = td_ja_strndup(c->a, indent.s.p, indent.s.n);
    } else if (indent.k != V_NONE && indent.k != V_UNDEF) {
        td_jfail(c, n, "tojson indent must be an int or a string");
    }
    const char *item_sep = ind ? "," : ", ", *key_sep = ": ";
    if (seps.k == V_LIST && seps.l->n == 2 && seps.l->v[0].k == V_STR && seps.l->v[1].k == V_STR) {
        item_sep = td_ja_strndup(c->a, seps.l->v[0].s.p, seps.l->v[0].s.n);
        key_sep = td_ja_strndup(c->a, seps.l->v[1].s.p, seps.l->v[1].s.n);
    }
    jbuf b = {.a = c->a};
    td_jb_put(&b, "", 0);
    jv bad;
    if (!td_jv_json_to(&b, v, ind, 0, item_sep, key_sep, td_jv_truthy(sort_keys), &bad))
        td_jfail(c, n, "Object of type %s is not JSON serializable", td_jv_type_name(bad));
    return jv_str(b.p, b.n);
}

static size_t length_of(jctx *c, const jnode *n, jv v) {
    switch (v.k) {
    case V_STR: return td_ju_len(v.s.p, v.s.n);
    case V_LIST: return v.l->n;
    case V_DICT: return v.d->n;
    case V_UNDEF: return 0;
    default: td_jfail(c, n, "object of type '%s' has no len()", td_jv_type_name(v));
    }
}

static jv items_of(jctx *c, const jnode *n, jv v) {
    if (v.k == V_UNDEF) return jv_list(td_jl_new(c->a, 1));
    if (v.k != V_DICT || (v.flags & (JF_NS | JF_LOOP))) td_jfail(c, n, "Can only get item pairs from a mapping.");
    jlist *l = td_jl_new(c->a, v.d->n + 1);
    for (size_t i = 0; i < v.d->n; i++) {
        jlist *p = td_jl_new(c->a, 2);
        td_jl_push(c->a, p, v.d->k[i]);
        td_jl_push(c->a, p, v.d->v[i]);
        jv t = jv_list(p);
        t.flags = JF_TUPLE;
        td_jl_push(c->a, l, t);
    }
    return jv_list(l);
}

/* Jinja's attribute lookup for filters (map/selectattr/sort): dotted path. */
static jv attr_path(jctx *c, jv v, jv path) {
    if (path.k == V_INT) return v.k == V_LIST && path.i >= 0 && (size_t)path.i < v.l->n ? v.l->v[path.i] : jv_undef(NULL);
    if (path.k != V_STR) return jv_undef(NULL);
    size_t i = 0;
    while (i <= path.s.n) {
        const char *dot = memchr(path.s.p + i, '.', path.s.n - i);
        size_t e = dot ? (size_t)(dot - path.s.p) : path.s.n;
        jv out;
        if (v.k == V_DICT && td_jd_get(v.d, path.s.p + i, e - i, &out)) v = out;
        else return jv_undef(NULL);
        i = e + 1;
        (void)c;
    }
    return v;
}


/* int(x) of a float: truncation; NaN is the filter's default (Python's
 * ValueError), out of the 64-bit range an overflow */
static jv float_to_int(jctx *c, const jnode *n, double x, jv dflt) {
    if (isnan(x)) return dflt;
    if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) td_jint_overflow(c, n);
    return jv_int((int64_t)x);
}

/* ---- filters ---- */
jv td_jfilter(jctx *c, jframe *f, const jnode *n, jv v, jv *args, int nargs, const char **kw, jv *kwv, int nkw) {
    const char *nm = n->name;
    (void)f;
    if (!strcmp(nm, "tojson"))
        return tojson(c, n, v, ARG(0, "indent", jv_none()), ARG(-1, "separators", jv_none()),
                      ARG(-1, "sort_keys", jv_bool(false)), ARG(-1, "ensure_ascii", jv_bool(false)));
    if (!strcmp(nm, "length") || !strcmp(nm, "count")) return jv_int((int64_t)length_of(c, n, v));
    if (!strcmp(nm, "string")) return td_jstr_value(c, v);
    if (!strcmp(nm, "safe")) { jv s = td_jstr_value(c, v); s.flags = JF_SAFE; return v.k == V_STR ? s : (v.flags |= JF_SAFE, v); }
    if (!strcmp(nm, "trim")) return py_strip(c, n, td_jstr_value(c, v), ARG(0, "chars", jv_none()), 3);
    if (!strcmp(nm, "default") || !strcmp(nm, "d")) {
        jv d = ARG(0, "default_value", mkstr(c, "", 0));
        bool boolean = td_jv_truthy(ARG(1, "boolean", jv_bool(false)));
        if (v.k == V_UNDEF || (boolean && !td_jv_truthy(v))) return d;
        return v;
    }
    if (!strcmp(nm, "join")) {
        jv sep = ARG(0, "d", jv_str("", 0)), at = ARG(1, "attribute", jv_none());
        jlist *l = td_jiter(c, n, v);
        jbuf b = {.a = c->a};
        td_jb_put(&b, "", 0);
        sep = td_jstr_value(c, sep);
        for (size_t i = 0; i < l->n; i++) {
            if (i) td_jb_put(&b, sep.s.p, sep.s.n);
            td_jv_str_to(&b, at.k == V_NONE ? l->v[i] : attr_path(c, l->v[i], at), false);
        }
        return jv_str(b.p, b.n);
    }
    if (!strcmp(nm, "items")) return items_of(c, n, v);
    if (!strcmp(nm, "lower")) return map_case(c, td_jstr_value(c, v), 0);
    if (!strcmp(nm, "upper")) return map_case(c, td_jstr_value(c, v), 1);
    if (!strcmp(nm, "title")) return map_case(c, td_jstr_value(c, v), 2);
    if (!strcmp(nm, "capitalize")) return map_case(c, td_jstr_value(c, v), 3);
    if (!strcmp(nm, "replace")) {
        jv s = td_jstr_value(c, v), o = td_jstr_value(c, ARG(0, "old", jv_str("", 0))), w = td_jstr_value(c, ARG(1, "new", jv_str("", 0)));
        jv cnt = ARG(2, "count", jv_none());
        return str_replace(c, s, o, w, cnt.k == V_NONE ? -1 : as_int(c, n, cnt, "replace count"));
    }
    if (!strcmp(nm, "first") || !strcmp(nm, "last")) {
        jlist *l = td_jiter(c, n, v);
        if (!l->n) return jv_undef("No first item, sequence was empty.");
        return nm[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (!strcmp(nm, "list")) { jlist *l = td_jiter(c, n, v); jlist *o = td_jl_new(c->a, l->n + 1); for (size_t i = 0; i < l->n; i++) td_jl_push(c->a, o, l->v[i]); return jv_list(o); }
    if (!strcmp(nm, "reverse")) {
        if (v.k == V_STR) {
            jlist *l = td_jiter(c, n, v);
            jbuf b = {.a = c->a};
            td_jb_put(&b, "", 0);
            for (size_t i = l->n; i-- > 0;) td_jb_put(&b, l->v[i].s.p, l->v[i].s.n);
            return jv_str(b.p, b.n);
        }
        jlist *l = td_jiter(c, n, v), *o = td_jl_new(c->a, l->n + 1);
        for (size_t i = l->n; i-- > 0;) td_jl_push(c->a, o, l->v[i]);
        return jv_list(o);
    }
    if (!strcmp(nm, "unique")) {
        jlist *l = td_jiter(c, n, v), *o = td_jl_new(c->a, l->n + 1);
        for (size_t i = 0; i < l->n; i++) {
            bool seen = false;
            jwork(c->a, o->n);
            for (size_t j = 0; j < o->n && !seen; j++) seen = td_jv_eq(o->v[j], l->v[i]);
            if (!seen) td_jl_push(c->a, o, l->v[i]);
        }
        return jv_list(o);
    }
    if (!strcmp(nm, "sort") || !strcmp(nm, "dictsort")) {
        bool dictsort = nm[0] == 'd';
        jlist *l = dictsort ? items_of(c, n, v).l : td_jiter(c, n, v);
        bool rev = td_jv_truthy(ARG(dictsort ? 2 : 0, "reverse", jv_bool(false)));
        jv at = dictsort ? jv_int(0) : ARG(2, "attribute", jv_none());
        if (dictsort) { /* by: 'key' or 'value' (jinja2 raises FilterArgumentError for anything else) */
            jv by = ARG(1, "by", jv_str("key", 3));
            bool key = by.k == V_STR && by.s.n == 3 && !memcmp(by.s.p, "key", 3);
            bool value = by.k == V_STR && by.s.n == 5 && !memcmp(by.s.p, "value", 5);
            if (!key && !value) td_jfail(c, n, "dictsort: You can only sort by either 'key' or 'value'");
            if (value) at = jv_int(1);
        }
        jlist *o = td_jl_new(c->a, l->n + 1);
        for (size_t i = 0; i < l->n; i++) td_jl_push(c->a, o, l->v[i]);
        /* insertion sort keeps Python's stability */
        for (size_t i = 1; i < o->n; i++) {
            jv x = o->v[i];
            jv kx = at.k == V_NONE ? x : attr_path(c, x, at);
            size_t j = i;
            while (j > 0) {
                jv ky = at.k == V_NONE ? o->v[j - 1] : attr_path(c, o->v[j - 1], at);
                int r = td_jv_cmp(c, n, ky, kx);
                jwork(c->a, 4);
                if (rev ? r >= 0 : r <= 0) break;
                o->v[j] = o->v[j - 1];
                j--;
            }
            o->v[j] = x;
        }
        return jv_list(o);
    }
    if (!strcmp(nm, "min") || !strcmp(nm, "max")) {
        jlist *l = td_jiter(c, n, v);
        if (!l->n) return jv_undef("empty sequence");
        jv best = l->v[0];
        for (size_t i = 1; i < l->n; i++) {
            int r = td_jv_cmp(c, n, l->v[i], best);
            if (nm[1] == 'i' ? r < 0 : r > 0) best = l->v[i];
        }
        return best;
    }
    if (!strcmp(nm, "sum")) {
        jlist *l = td_jiter(c, n, v);
        jv at = ARG(0, "attribute", jv_none());
        jv acc = ARG(1, "start", jv_int(0));
        for (size_t i = 0; i < l->n; i++) {
            jv x = at.k == V_NONE ? l->v[i] : attr_path(c, l->v[i], at);
            if (acc.k == V_FLOAT || x.k == V_FLOAT) acc = jv_float((acc.k == V_FLOAT ? acc.f : (double)as_int(c, n, acc, "sum")) + (x.k == V_FLOAT ? x.f : (double)as_int(c, n, x, "sum")));
            else {
                int64_t r;
                if (__builtin_add_overflow(as_int(c, n, acc, "sum"), as_int(c, n, x, "sum"), &r)) td_jint_overflow(c, n);
                acc = jv_int(r);
            }
        }
        return acc;
    }
    if (!strcmp(nm, "abs")) {
        if (v.k == V_FLOAT) return jv_float(fabs(v.f));
        int64_t i = as_int(c, n, v, "abs");
        if (i == INT64_MIN) td_jint_overflow(c, n);
        return jv_int(i < 0 ? -i : i);
    }
    if (!strcmp(nm, "int")) {
        jv d = ARG(0, "default", jv_int(0));
        if (v.k == V_INT) return v;
        if (v.k == V_BOOL) return jv_int(v.b);
        if (v.k == V_FLOAT) return float_to_int(c, n, v.f, d);
        if (v.k == V_STR) {
            char *e;
            char *s = td_ja_strndup(c->a, v.s.p, v.s.n);
            errno = 0;
            long long x = strtoll(s, &e, 10);
            if (e != s && *e == 0) {
                if (errno == ERANGE) td_jint_overflow(c, n);
                return jv_int(x);
            }
            double fx = strtod(s, &e);
            if (e != s && *e == 0) return float_to_int(c, n, fx, d);
        }
        return d;
    }
    if (!strcmp(nm, "float")) {
        jv d = ARG(0, "default", jv_float(0));
        if (v.k == V_FLOAT) return v;
        if (v.k == V_INT || v.k == V_BOOL) return jv_float(v.k == V_INT ? (double)v.i : v.b);
        if (v.k == V_STR) {
            char *e;
            char *s = td_ja_strndup(c->a, v.s.p, v.s.n);
            double x = strtod(s, &e);
            if (e != s && *e == 0) return jv_float(x);
        }
        return d;
    }
    if (!strcmp(nm, "round")) {
        int64_t prec = as_int(c, n, ARG(0, "precision", jv_int(0)), "round precision");
        jv m = ARG(1, "method", jv_str("common", 6));
        double x = v.k == V_FLOAT ? v.f : (double)as_int(c, n, v, "round");
        double p = pow(10, (double)prec);
        double r = m.k == V_STR && !strcmp(m.s.p, "floor") ? floor(x * p) / p
                 : m.k == V_STR && !strcmp(m.s.p, "ceil") ? ceil(x * p) / p : rint(x * p) / p; /* Python rounds half to even */
        return jv_float(r);
    }
    if (!strcmp(nm, "map")) {
        jlist *l = td_jiter(c, n, v), *o = td_jl_new(c->a, l->n + 1);
        jv at = ARG(-1, "attribute", jv_none());
        if (at.k != V_NONE) {
            jv d = ARG(-1, "default", jv_undef(NULL));
            for (size_t i = 0; i < l->n; i++) {
                jv x = attr_path(c, l->v[i], at);
                td_jl_push(c->a, o, x.k == V_UNDEF ? d : x);
            }
            return jv_list(o);
        }
        if (nargs < 1 || args[0].k != V_STR) td_jfail(c, n, "map needs a filter name or attribute=");
        jnode sub = *n;
        sub.name = args[0].s.p;
        for (size_t i = 0; i < l->n; i++)
            td_jl_push(c->a, o, td_jfilter(c, f, &sub, l->v[i], args + 1, nargs - 1, kw, kwv, nkw));
        return jv_list(o);
    }
    if (!strcmp(nm, "select") || !strcmp(nm, "reject") || !strcmp(nm, "selectattr") || !strcmp(nm, "rejectattr")) {
        bool attr = strstr(nm, "attr") != NULL, keep_true = nm[0] == 's';
        jlist *l = td_jiter(c, n, v), *o = td_jl_new(c->a, l->n + 1);
        int base = attr ? 1 : 0;
        if (attr && nargs < 1) td_jfail(c, n, "%s needs an attribute name", nm);
        const char *test = nargs > base ? (args[base].k == V_STR ? args[base].s.p : NULL) : NULL;
        if (nargs > base && !test) td_jfail(c, n, "%s: test name must be a string", nm);
        for (size_t i = 0; i < l->n; i++) {
            jv x = attr ? attr_path(c, l->v[i], args[0]) : l->v[i];
            bool r = test ? td_jtest(c, n, test, x, args + base + 1, nargs - base - 1) : td_jv_truthy(x);
            if (r == keep_true) td_jl_push(c->a, o, l->v[i]);
        }
        return jv_list(o);
    }
    if (!strcmp(nm, "indent")) {
        jv wv = ARG(0, "width", jv_int(4));
        bool first = td_jv_truthy(ARG(1, "first", jv_bool(false))), blank = td_jv_truthy(ARG(2, "blank", jv_bool(false)));
        jv pad = wv.k == V_STR ? wv : jv_none();
        jbuf pb = {.a = c->a};
        td_jb_put(&pb, "", 0);
        if (pad.k == V_NONE) for (int64_t i = 0; i < as_int(c, n, wv, "indent width"); i++) td_jb_put(&pb, " ", 1);
        else td_jb_put(&pb, pad.s.p, pad.s.n);
        jv s = td_jstr_value(c, v);
        jbuf b = {.a = c->a};
        td_jb_put(&b, "", 0);
        size_t i = 0;
        bool line0 = true;
        while (i <= s.s.n) {
            const char *nl = memchr(s.s.p + i, '\n', s.s.n - i);
            size_t e = nl ? (size_t)(nl - s.s.p) : s.s.n;
            bool empty = e == i;
            if ((line0 ? first : true) && (blank || !empty)) td_jb_put(&b, pb.p, pb.n);
            td_jb_put(&b, s.s.p + i, e - i);
            if (!nl) break;
            td_jb_put(&b, "\n", 1);
            i = e + 1;
            line0 = false;
        }
        return jv_str(b.p, b.n);
    }
    if (!strcmp(nm, "e") || !strcmp(nm, "escape") || !strcmp(nm, "forceescape")) {
        jv s = td_jstr_value(c, v);
        jbuf b = {.a = c->a};
        td_jb_put(&b, "", 0);
        for (size_t i = 0; i < s.s.n; i++) {
            switch (s.s.p[i]) {
            case '&': jb_puts(&b, "&amp;"); break;
            case '<': jb_puts(&b, "&lt;"); break;
            case '>': jb_puts(&b, "&gt;"); break;
            case '"': jb_puts(&b, "&#34;"); break;
            case '\'': jb_puts(&b, "&#39;"); break;
            default: td_jb_put(&b, s.s.p + i, 1);
            }
        }
        return jv_str(b.p, b.n);
    }
    if (!strcmp(nm, "wordcount")) {
        jv s = td_jstr_value(c, v);
        return jv_int((int64_t)str_split(c, s, jv_none(), -1, false).l->n);
    }
    if (!strcmp(nm, "center")) {
        jv s = td_jstr_value(c, v);
        int64_t w = as_int(c, n, ARG(0, "width", jv_int(80)), "center width"), len = (int64_t)td_ju_len(s.s.p, s.s.n);
        if (w <= len) return s;
        int64_t total = w - len, left = total / 2 + (total & w & 1);
        jbuf b = {.a = c->a};
        td_jb_put(&b, "", 0);
        for (int64_t i = 0; i < left; i++) td_jb_put(&b, " ", 1);
        td_jb_put(&b, s.s.p, s.s.n);
        for (int64_t i = 0; i < total - left; i++) td_jb_put(&b, " ", 1);
        return jv_str(b.p, b.n);
    }
    td_jfail(c, n, "unknown filter '%s'", nm);
}

/* ---- tests ---- */
bool td_jtest(jctx *c, const jnode *n, const char *t, jv v, jv *args, int nargs) {
    jv a0 = nargs > 0 ? args[0] : jv_undef(NULL);
    if (!strcmp(t, "defined")) return v.k != V_UNDEF;
    if (!strcmp(t, "undefined")) return v.k == V_UNDEF;
    if (!strcmp(t, "none")) return v.k == V_NONE;
    if (!strcmp(t, "boolean")) return v.k == V_BOOL;
    if (!strcmp(t, "true")) return v.k == V_BOOL && v.b;
    if (!strcmp(t, "false")) return v.k == V_BOOL && !v.b;
    if (!strcmp(t, "integer")) return v.k == V_INT;
    if (!strcmp(t, "float")) return v.k == V_FLOAT;
    if (!strcmp(t, "number")) return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL;
    if (!strcmp(t, "string")) return v.k == V_STR;
    if (!strcmp(t, "mapping")) return v.k == V_DICT && !(v.flags & (JF_NS | JF_LOOP));
    if (!strcmp(t, "iterable")) return v.k == V_STR || v.k == V_LIST || v.k == V_UNDEF || (v.k == V_DICT && !(v.flags & (JF_NS | JF_LOOP)));
    if (!strcmp(t, "sequence")) return v.k == V_STR || v.k == V_LIST || (v.k == V_DICT && !(v.flags & (JF_NS | JF_LOOP)));
    if (!strcmp(t, "callable")) return v.k == V_MACRO || v.k == V_FUNC;
    if (!strcmp(t, "sameas")) {
        if (v.k != a0.k) return false;
        if (v.k == V_NONE || v.k == V_UNDEF) return true;
        if (v.k == V_BOOL) return v.b == a0.b;
        if (v.k == V_LIST) return v.l == a0.l;
        if (v.k == V_DICT) return v.d == a0.d;
        return td_jv_eq(v, a0) && (v.k == V_INT ? v.i >= -5 && v.i <= 256 : false);
    }
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) return td_jv_eq(v, a0);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !td_jv_eq(v, a0);
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<")) return td_jv_cmp(c, n, v, a0) < 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return td_jv_cmp(c, n, v, a0) <= 0;
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">")) return td_jv_cmp(c, n, v, a0) > 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) return td_jv_cmp(c, n, v, a0) >= 0;
    if (!strcmp(t, "in")) return td_jv_contains(c, n, a0, v);
    if (!strcmp(t, "even") || !strcmp(t, "odd")) {
        int64_t i = as_int(c, n, v, t);
        return ((i % 2) == 0) == (t[0] == 'e');
    }
    if (!strcmp(t, "divisibleby")) {
        int64_t d = as_int(c, n, a0, "divisibleby");
        if (!d) td_jfail(c, n, "division by zero");
        return as_int(c, n, v, "divisibleby") % d == 0;
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.k != V_STR) return false;
        jv m = map_case(c, v, t[0] == 'l' ? 0 : 1);
        return td_jv_eq(m, v);
    }
    if (!strcmp(t, "escaped")) return (v.flags & JF_SAFE) != 0;
    td_jfail(c, n, "unknown test '%s'", t);
}

/* ---- methods ---- */
static jv is_class(jctx *c, jv s, int cls) { /* 0 digit 1 alpha 2 alnum 3 space 4 lower 5 upper */
    (void)c;
    if (!s.s.n) return jv_bool(false);
    bool cased = false;
    for (size_t i = 0; i < s.s.n;) {
        int32_t cp = next_cp(s.s.p, s.s.n, &i);
        utf8proc_category_t k = utf8proc_category(cp);
        bool letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        bool digit = k == UTF8PROC_CATEGORY_ND;
        switch (cls) {
        case 0: if (!digit) return jv_bool(false); break;
        case 1: if (!letter) return jv_bool(false); break;
        case 2: if (!letter && !digit && k != UTF8PROC_CATEGORY_NL && k != UTF8PROC_CATEGORY_NO) return jv_bool(false); break;
        case 3: if (!py_space(cp)) return jv_bool(false); break;
        case 4: if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) return jv_bool(false); cased |= k == UTF8PROC_CATEGORY_LL; break;
        case 5: if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return jv_bool(false); cased |= k == UTF8PROC_CATEGORY_LU; break;
        }
    }
    return jv_bool(cls < 4 || cased);
}

static jv str_find(jctx *c, const jnode *n, jv s, jv sub, bool rev) {
    need_str(c, n, sub, "find");
    jwork(c->a, (s.s.n >> 6) * (rev ? 1 + (sub.s.n >> 4) : 1));
    const char *hit = NULL;
    if (!rev) hit = sub.s.n ? memmem(s.s.p, s.s.n, sub.s.p, sub.s.n) : s.s.p;
    else
        for (size_t p = s.s.n >= sub.s.n ? s.s.n - sub.s.n + 1 : 0; p-- > 0;)
            if (!memcmp(s.s.p + p, sub.s.p, sub.s.n)) { hit = s.s.p + p; break; }
    if (!hit) return jv_int(-1);
    return jv_int((int64_t)td_ju_len(s.s.p, (size_t)(hit - s.s.p)));
}

jv td_jmethod(jctx *c, const jnode *n, jv obj, const char *m, jv *args, int nargs, const char **kw, jv *kwv,
           int nkw, bool *found) {
    *found = true;
    if (obj.k == V_STR) {
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
            return jv_bool(prefix_match(c, n, obj, ARG(0, NULL, jv_undef(NULL)), m[0] == 'e'));
        if (!strcmp(m, "strip")) return py_strip(c, n, obj, ARG(0, "chars", jv_none()), 3);
        if (!strcmp(m, "lstrip")) return py_strip(c, n, obj, ARG(0, "chars", jv_none()), 1);
        if (!strcmp(m, "rstrip")) return py_strip(c, n, obj, ARG(0, "chars", jv_none()), 2);
        if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
            jv sep = ARG(0, "sep", jv_none());
            jv ms = ARG(1, "maxsplit", jv_int(-1));
            if (sep.k != V_STR && sep.k != V_NONE && sep.k != V_UNDEF) td_jfail(c, n, "split separator must be str or None");
            if (sep.k == V_STR && !sep.s.n) td_jfail(c, n, "empty separator");
            return str_split(c, obj, sep, as_int(c, n, ms, "maxsplit"), m[0] == 'r');
        }
        if (!strcmp(m, "replace")) {
            jv o = ARG(0, "old", jv_undef(NULL)), w = ARG(1, "new", jv_undef(NULL)), cnt = ARG(2, "count", jv_int(-1));
            need_str(c, n, o, "replace");
            need_str(c, n, w, "replace");
            return str_replace(c, obj, o, w, as_int(c, n, cnt, "replace count"));
        }
        if (!strcmp(m, "upper")) return map_case(c, obj, 1);
        if (!strcmp(m, "lower")) return map_case(c, obj, 0);
        if (!strcmp(m, "title")) return map_case(c, obj, 2);
        if (!strcmp(m, "capitalize")) return map_case(c, obj, 3);
        if (!strcmp(m, "find")) return str_find(c, n, obj, ARG(0, NULL, jv_undef(NULL)), false);
        if (!strcmp(m, "rfind")) return str_find(c, n, obj, ARG(0, NULL, jv_undef(NULL)), true);
        if (!strcmp(m, "index") || !strcmp(m, "rindex")) {
            jv r = str_find(c, n, obj, ARG(0, NULL, jv_undef(NULL)), m[0] == 'r');
            if (r.i < 0) td_jfail(c, n, "substring not found");
            return r;
        }
        if (!strcmp(m, "count")) {
            jv sub = ARG(0, NULL, jv_undef(NULL));
            need_str(c, n, sub, "count");
            if (!sub.s.n) return jv_int((int64_t)td_ju_len(obj.s.p, obj.s.n) + 1);
            int64_t k = 0;
            for (const char *p = obj.s.p; (p = memmem(p, obj.s.n - (size_t)(p - obj.s.p), sub.s.p, sub.s.n)); p += sub.s.n) k++;
            return jv_int(k);
        }
        if (!strcmp(m, "join")) {
            jlist *l = td_jiter(c, n, ARG(0, NULL, jv_undef(NULL)));
            jbuf b = {.a = c->a};
            td_jb_put(&b, "", 0);
            for (size_t i = 0; i < l->n; i++) {
                if (l->v[i].k != V_STR) td_jfail(c, n, "sequence item %zu: expected str instance, %s found", i, td_jv_type_name(l->v[i]));
                if (i) td_jb_put(&b, obj.s.p, obj.s.n);
                td_jb_put(&b, l->v[i].s.p, l->v[i].s.n);
            }
            return jv_str(b.p, b.n);
        }
        if (!strcmp(m, "splitlines")) {
            jlist *l = td_jl_new(c->a, 8);
            size_t i = 0;
            while (i < obj.s.n) {
                size_t e = i;
                while (e < obj.s.n && obj.s.p[e] != '\n' && obj.s.p[e] != '\r') e++;
                td_jl_push(c->a, l, jv_str(obj.s.p + i, e - i));
                if (e < obj.s.n && obj.s.p[e] == '\r' && e + 1 < obj.s.n && obj.s.p[e + 1] == '\n') e++;
                i = e + 1;
            }
            return jv_list(l);
        }
        if (!strcmp(m, "isdigit") || !strcmp(m, "isnumeric") || !strcmp(m, "isdecimal")) return is_class(c, obj, 0);
        if (!strcmp(m, "isalpha")) return is_class(c, obj, 1);
        if (!strcmp(m, "isalnum")) return is_class(c, obj, 2);
        if (!strcmp(m, "isspace")) return is_class(c, obj, 3);
        if (!strcmp(m, "islower")) return is_class(c, obj, 4);
        if (!strcmp(m, "isupper")) return is_class(c, obj, 5);
    } else if (obj.k == V_DICT && !(obj.flags & JF_NS)) {
        if (obj.flags & JF_LOOP) {
            if (!strcmp(m, "cycle")) {
                if (!nargs) td_jfail(c, n, "no items for cycling given");
                jv idx;
                td_jd_get(obj.d, "index0", 6, &idx);
                return args[idx.i % nargs];
            }
        } else {
            if (!strcmp(m, "get")) {
                jv out;
                if (td_jd_getv(obj.d, ARG(0, NULL, jv_undef(NULL)), &out)) return out;
                return ARG(1, NULL, jv_none());
            }
            if (!strcmp(m, "items")) return items_of(c, n, obj);
            if (!strcmp(m, "keys") || !strcmp(m, "values")) {
                jlist *l = td_jl_new(c->a, obj.d->n + 1);
                for (size_t i = 0; i < obj.d->n; i++) td_jl_push(c->a, l, m[0] == 'k' ? obj.d->k[i] : obj.d->v[i]);
                return jv_list(l);
            }
        }
    } else if (obj.k == V_LIST) {
        if (!strcmp(m, "index") || !strcmp(m, "count")) {
            jv x = ARG(0, NULL, jv_undef(NULL));
            int64_t k = 0;
            for (size_t i = 0; i < obj.l->n; i++)
                if (td_jv_eq(obj.l->v[i], x)) {
                    if (m[0] == 'i') return jv_int((int64_t)i);
                    k++;
                }
            if (m[0] == 'i') td_jfail(c, n, "value is not in list");
            return jv_int(k);
        }
    }
    *found = false;
    return jv_undef(NULL);
}

jv td_jcall_global(jctx *c, const jnode *n, int fn, jv *args, int nargs, const char **kw, jv *kwv, int nkw) {
    switch (fn) {
    case FN_RANGE: {
        int64_t a = 0, b, s = 1;
        if (nargs == 1) b = as_int(c, n, args[0], "range");
        else if (nargs >= 2) { a = as_int(c, n, args[0], "range"); b = as_int(c, n, args[1], "range"); if (nargs > 2) s = as_int(c, n, args[2], "range"); }
        else td_jfail(c, n, "range expected at least 1 argument");
        if (!s) td_jfail(c, n, "range() arg 3 must not be zero");
        /* length first, in unsigned arithmetic (no overflow), then the items */
        uint64_t len = 0;
        if (s > 0 && a < b) len = ((uint64_t)b - (uint64_t)a - 1) / (uint64_t)s + 1;
        else if (s < 0 && a > b) len = ((uint64_t)a - (uint64_t)b - 1) / (0 - (uint64_t)s) + 1;
        if (len > TPL_MAX_ITEMS) td_jfail(c, n, "range too large (%llu items, limit %zu)", (unsigned long long)len, TPL_MAX_ITEMS);
        jlist *l = td_jl_new(c->a, (size_t)len + 1);
        int64_t i = a;
        for (uint64_t k = 0; k < len; k++) {
            td_jl_push(c->a, l, jv_int(i));
            if (k + 1 < len) i += s; /* stays inside [a, b) */
        }
        return jv_list(l);
    }
    case FN_NAMESPACE: case FN_DICT: {
        jdict *d = td_jd_new(c->a, (size_t)nkw + 4);
        for (int i = 0; i < nargs; i++) { /* namespace(dict) / dict(mapping) */
            if (args[i].k != V_DICT) td_jfail(c, n, "%s() positional argument must be a mapping", fn == FN_DICT ? "dict" : "namespace");
            for (size_t j = 0; j < args[i].d->n; j++) td_jd_set(c->a, d, args[i].d->k[j], args[i].d->v[j]);
        }
        for (int i = 0; i < nkw; i++) {
            if (fn == FN_NAMESPACE && kw[i][0] == '_') td_jfail(c, n, "namespace attributes cannot start with '_'");
            td_jd_set(c->a, d, jv_str(kw[i], strlen(kw[i])), kwv[i]);
        }
        jv v = jv_dict(d);
        if (fn == FN_NAMESPACE) v.flags = JF_NS;
        return v;
    }
    case FN_RAISE: {
        jv m = nargs ? td_jstr_value(c, args[0]) : jv_str("", 0);
        td_jfail(c, n, "raise_exception: %.*s", (int)(m.s.n > 600 ? 600 : m.s.n), m.s.p);
    }
    case FN_STRFTIME: {
        if (nargs < 1 || args[0].k != V_STR) td_jfail(c, n, "strftime_now needs a format string");
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char buf[256];
        size_t k = strftime(buf, sizeof buf, args[0].s.p, &tmv);
        return mkstr(c, buf, k);
    }
    default: td_jfail(c, n, "unsupported global function");
    }
}
