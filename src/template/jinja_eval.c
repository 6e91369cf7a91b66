/* Evaluation of the AST with Jinja2 runtime semantics: scoping (for-loop
 * bodies and macros get their own frame; if does not), Undefined that is
 * falsy/empty but fails on attribute access, loop.* variables, namespaces,
 * and the statements of the supported subset. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include "template/jinja.h"
#include "util/err.h"

_Noreturn void td_jfail(jctx *c, const jnode *n, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n) TD_FAIL(c->err, TD_ERR_ARG, "template line %d column %d: %s", n->line, n->col, msg);
    else TD_FAIL(c->err, TD_ERR_ARG, "template: %s", msg);
    longjmp(c->jb, 1);
}

_Noreturn void td_jint_overflow(jctx *c, const jnode *n) { td_jfail(c, n, "integer overflow (64-bit integers)"); }

/* One step of the render budget: a node evaluated or a loop iteration. */
static void step(jctx *c, const jnode *n) {
    jlimits *l = &c->lim;
    l->at = n;
    if (++l->steps > TPL_MAX_STEPS) td_jfail(c, n, "template exceeded its limit of %d evaluation steps", TPL_MAX_STEPS);
    jwork(c->a, 16);
}

static bool lookup(jframe *f, const char *name, size_t n, jv *out) {
    for (; f; f = f->parent)
        if (td_jd_get(f->vars, name, n, out)) return true;
    return false;
}

static void set_var(jctx *c, jframe *f, const char *name, jv v) {
    td_jd_set(c->a, f->vars, jv_str(name, strlen(name)), v);
}

static jframe *new_frame(jctx *c, jframe *parent) {
    jframe *f = td_ja_alloc(c->a, sizeof *f);
    f->parent = parent;
    f->vars = td_jd_new(c->a, 8);
    return f;
}

jv td_jstr_value(jctx *c, jv v) {
    if (v.k == V_STR) return v;
    jbuf b = {.a = c->a};
    td_jb_put(&b, "", 0);
    td_jv_str_to(&b, v, false);
    return jv_str(b.p, b.n);
}

static const char *undef_msg(jv v) { return v.undef ? v.undef : "value"; }

static jv get_attr(jctx *c, const jnode *n, jv obj, const char *name, size_t nl) {
    jv out;
    switch (obj.k) {
    case V_UNDEF: td_jfail(c, n, "'%s' is undefined (reading attribute '%s')", undef_msg(obj), name);
    case V_DICT:
        if (td_jd_get(obj.d, name, nl, &out)) return out;
        break;
    default: break;
    }
    char *nm = td_ja_alloc(c->a, nl + 64);
    snprintf(nm, nl + 64, "%s object has no attribute '%s'", td_jv_type_name(obj), name);
    return jv_undef(nm);
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

static jv get_item(jctx *c, const jnode *n, jv obj, jv key) {
    switch (obj.k) {
    case V_UNDEF: td_jfail(c, n, "'%s' is undefined (subscripted)", undef_msg(obj));
    case V_DICT: {
        jv out;
        if (td_jd_getv(obj.d, key, &out)) return out;
        if (key.k == V_STR) return get_attr(c, n, obj, key.s.p, key.s.n);
        return jv_undef("missing key");
    }
    case V_LIST:
        if (key.k == V_INT || key.k == V_BOOL) {
            int64_t i = norm_index(key.k == V_INT ? key.i : key.b, obj.l->n);
            if (i >= 0 && (size_t)i < obj.l->n) return obj.l->v[i];
            return jv_undef("list index out of range");
        }
        break;
    case V_STR:
        if (key.k == V_INT || key.k == V_BOOL) {
            jwork(c->a, obj.s.n >> 5);
            size_t len = td_ju_len(obj.s.p, obj.s.n);
            int64_t i = norm_index(key.k == V_INT ? key.i : key.b, len);
            if (i >= 0 && (size_t)i < len) {
                size_t a = td_ju_off(obj.s.p, obj.s.n, (size_t)i), b = td_ju_off(obj.s.p, obj.s.n, (size_t)i + 1);
                return jv_str(obj.s.p + a, b - a);
            }
            return jv_undef("string index out of range");
        }
        break;
    default: break;
    }
    if (key.k == V_STR) return get_attr(c, n, obj, key.s.p, key.s.n);
    return jv_undef("no such item");
}

static int64_t slice_bound(jctx *c, const jnode *n, jv v, int64_t dflt, int64_t len, int64_t step) {
    if (v.k == V_NONE || v.k == V_UNDEF) return dflt;
    if (v.k != V_INT) td_jfail(c, n, "slice indices must be integers");
    int64_t i = v.i;
    if (i < 0) { i += len; if (i < 0) i = step < 0 ? -1 : 0; }
    else if (i >= len) i = step < 0 ? len - 1 : len;
    return i;
}

static jv do_slice(jctx *c, const jnode *n, jv obj, jv a, jv b, jv s) {
    int64_t step = 1;
    if (s.k == V_INT) step = s.i;
    else if (s.k != V_NONE && s.k != V_UNDEF) td_jfail(c, n, "slice step must be an integer");
    if (step == 0) td_jfail(c, n, "slice step cannot be zero");
    bool is_str = obj.k == V_STR;
    if (!is_str && obj.k != V_LIST) td_jfail(c, n, "cannot slice a %s", td_jv_type_name(obj));
    if (is_str) jwork(c->a, obj.s.n >> 5);
    int64_t len = is_str ? (int64_t)td_ju_len(obj.s.p, obj.s.n) : (int64_t)obj.l->n;
    int64_t start = slice_bound(c, n, a, step < 0 ? len - 1 : 0, len, step);
    int64_t stop = slice_bound(c, n, b, step < 0 ? -1 : len, len, step);
    if (is_str) {
        jbuf out = {.a = c->a};
        td_jb_put(&out, "", 0);
        /* code point offsets once, then pick */
        size_t *offs = td_ja_alloc(c->a, ((size_t)len + 1) * sizeof *offs);
        size_t k = 0;
        for (size_t i = 0; i < obj.s.n; i++)
            if (((unsigned char)obj.s.p[i] & 0xC0) != 0x80) offs[k++] = i;
        offs[k] = obj.s.n;
        for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
            td_jb_put(&out, obj.s.p + offs[i], offs[i + 1] - offs[i]);
            if (__builtin_add_overflow(i, step, &i)) break;
        }
        return jv_str(out.p, out.n);
    }
    jlist *l = td_jl_new(c->a, 8);
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        td_jl_push(c->a, l, obj.l->v[i]);
        if (__builtin_add_overflow(i, step, &i)) break;
    }
    return jv_list(l);
}

static bool is_num(jv v) { return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; }
static double numf(jv v) { return v.k == V_FLOAT ? v.f : v.k == V_INT ? (double)v.i : (double)v.b; }
static int64_t numi(jv v) { return v.k == V_INT ? v.i : (int64_t)v.b; }

/* b != 0 and not (a == INT64_MIN && b == -1): checked by the caller */
static int64_t floordiv(int64_t a, int64_t b) { int64_t q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q--; return q; }

/* x ** e for e >= 0 by squaring (at most 63 rounds); false on overflow */
static bool ipow(int64_t x, int64_t e, int64_t *out) {
    int64_t r = 1;
    while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(r, x, &r)) return false;
        e >>= 1;
        /* squaring overflows only when a further factor would overflow r too */
        if (e && __builtin_mul_overflow(x, x, &x)) return false;
    }
    *out = r;
    return true;
}

/* Python's int arithmetic, but 64-bit: overflow is an error. */
static jv int_binop(jctx *c, const jnode *n, const char *op, int64_t x, int64_t y) {
    int64_t r;
    switch (op[0]) {
    case '+': if (__builtin_add_overflow(x, y, &r)) td_jint_overflow(c, n); return jv_int(r);
    case '-': if (__builtin_sub_overflow(x, y, &r)) td_jint_overflow(c, n); return jv_int(r);
    case '*':
        if (op[1] == '*') {
            if (y < 0) {
                if (x == 0) td_jfail(c, n, "division by zero (0 cannot be raised to a negative power)");
                return jv_float(pow((double)x, (double)y));
            }
            if (!ipow(x, y, &r)) td_jint_overflow(c, n);
            return jv_int(r);
        }
        if (__builtin_mul_overflow(x, y, &r)) td_jint_overflow(c, n);
        return jv_int(r);
    case '/':
        if (y == 0) td_jfail(c, n, "division by zero");
        if (op[1] == '/') {
            if (x == INT64_MIN && y == -1) td_jint_overflow(c, n);
            return jv_int(floordiv(x, y));
        }
        return jv_float((double)x / (double)y);
    default: /* % */
        if (y == 0) td_jfail(c, n, "modulo by zero");
        if (y == -1) return jv_int(0);
        r = x % y;
        if (r && ((r < 0) != (y < 0))) r += y;
        return jv_int(r);
    }
}

static jv binop(jctx *c, const jnode *n, const char *op, jv a, jv b) {
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        td_jfail(c, n, "'%s' is undefined (operand of '%s')", undef_msg(a.k == V_UNDEF ? a : b), op);
    bool both_int = (a.k == V_INT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_BOOL);
    if (is_num(a) && is_num(b)) {
        if (both_int) return int_binop(c, n, op, numi(a), numi(b));
        switch (op[0]) {
        case '+': return jv_float(numf(a) + numf(b));
        case '-': return jv_float(numf(a) - numf(b));
        case '*':
            if (op[1] == '*') return jv_float(pow(numf(a), numf(b)));
            return jv_float(numf(a) * numf(b));
        case '/':
            if (numf(b) == 0) td_jfail(c, n, "division by zero");
            if (op[1] == '/') return jv_float(floor(numf(a) / numf(b)));
            return jv_float(numf(a) / numf(b));
        case '%':
            if (numf(b) == 0) td_jfail(c, n, "modulo by zero");
            { double r = fmod(numf(a), numf(b)); if (r != 0 && ((r < 0) != (numf(b) < 0))) r += numf(b); return jv_float(r); }
        }
    }
    if (op[0] == '+' && a.k == V_STR && b.k == V_STR) {
        if (a.s.n + b.s.n > TPL_MAX_OUTPUT) td_jfail(c, n, "string too large (over %zu MiB)", TPL_MAX_OUTPUT >> 20);
        char *p = td_ja_alloc(c->a, a.s.n + b.s.n + 1);
        memcpy(p, a.s.p, a.s.n);
        memcpy(p + a.s.n, b.s.p, b.s.n);
        p[a.s.n + b.s.n] = 0;
        return jv_str(p, a.s.n + b.s.n);
    }
    if (op[0] == '+' && a.k == V_LIST && b.k == V_LIST) {
        if (a.l->n + b.l->n > TPL_MAX_ITEMS) td_jfail(c, n, "list too large (over %zu items)", TPL_MAX_ITEMS);
        jlist *l = td_jl_new(c->a, a.l->n + b.l->n + 1);
        for (size_t i = 0; i < a.l->n; i++) td_jl_push(c->a, l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) td_jl_push(c->a, l, b.l->v[i]);
        return jv_list(l);
    }
    if (op[0] == '*' && op[1] == 0 && ((a.k == V_STR && b.k == V_INT) || (a.k == V_INT && b.k == V_STR))) {
        jv s = a.k == V_STR ? a : b;
        int64_t k = a.k == V_INT ? a.i : b.i;
        if (k <= 0 || !s.s.n) return jv_str("", 0);
        if ((uint64_t)k > TPL_MAX_OUTPUT / s.s.n) td_jfail(c, n, "string too large (over %zu MiB)", TPL_MAX_OUTPUT >> 20);
        jbuf o = {.a = c->a};
        td_jb_put(&o, "", 0);
        for (int64_t i = 0; i < k; i++) td_jb_put(&o, s.s.p, s.s.n);
        return jv_str(o.p, o.n);
    }
    if (op[0] == '*' && op[1] == 0 && a.k == V_LIST && b.k == V_INT) {
        if (b.i <= 0 || !a.l->n) return jv_list(td_jl_new(c->a, 1));
        if ((uint64_t)b.i > TPL_MAX_ITEMS / a.l->n) td_jfail(c, n, "list too large (over %zu items)", TPL_MAX_ITEMS);
        jlist *l = td_jl_new(c->a, a.l->n * (size_t)b.i);
        for (int64_t i = 0; i < b.i; i++)
            for (size_t j = 0; j < a.l->n; j++) td_jl_push(c->a, l, a.l->v[j]);
        return jv_list(l);
    }
    td_jfail(c, n, "unsupported operand types for %s: '%s' and '%s'", op, td_jv_type_name(a), td_jv_type_name(b));
}

static int cmp_str(jv a, jv b) {
    size_t m = a.s.n < b.s.n ? a.s.n : b.s.n;
    int r = memcmp(a.s.p, b.s.p, m);
    return r ? r : (a.s.n > b.s.n) - (a.s.n < b.s.n);
}

int td_jv_cmp(jctx *c, const jnode *n, jv a, jv b) {
    if (is_num(a) && is_num(b)) { double x = numf(a), y = numf(b); return (x > y) - (x < y); }
    if (a.k == V_STR && b.k == V_STR) return cmp_str(a, b);
    if (a.k == V_LIST && b.k == V_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (td_jv_eq(a.l->v[i], b.l->v[i])) continue;
            return td_jv_cmp(c, n, a.l->v[i], b.l->v[i]);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    td_jfail(c, n, "'<' not supported between instances of '%s' and '%s'", td_jv_type_name(a), td_jv_type_name(b));
}

bool td_jv_contains(jctx *c, const jnode *n, jv hay, jv needle) {
    switch (hay.k) {
    case V_STR:
        if (needle.k != V_STR) td_jfail(c, n, "'in <string>' requires string as left operand, not %s", td_jv_type_name(needle));
        jwork(c->a, hay.s.n >> 6);
        if (!needle.s.n) return true;
        return memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
    case V_LIST:
        jwork(c->a, hay.l->n);
        for (size_t i = 0; i < hay.l->n; i++)
            if (td_jv_eq(hay.l->v[i], needle)) return true;
        return false;
    case V_DICT: return td_jd_getv(hay.d, needle, NULL);
    case V_UNDEF: return false;
    default: td_jfail(c, n, "argument of type '%s' is not iterable", td_jv_type_name(hay));
    }
}

static jv compare(jctx *c, const jnode *n, const char *op, jv a, jv b) {
    if (!strcmp(op, "==")) return jv_bool(td_jv_eq(a, b));
    if (!strcmp(op, "!=")) return jv_bool(!td_jv_eq(a, b));
    if (!strcmp(op, "in")) return jv_bool(td_jv_contains(c, n, b, a));
    if (!strcmp(op, "not in")) return jv_bool(!td_jv_contains(c, n, b, a));
    if (a.k == V_UNDEF || b.k == V_UNDEF) td_jfail(c, n, "'%s' is undefined (compared)", undef_msg(a.k == V_UNDEF ? a : b));
    int r = td_jv_cmp(c, n, a, b);
    if (!strcmp(op, "<")) return jv_bool(r < 0);
    if (!strcmp(op, ">")) return jv_bool(r > 0);
    if (!strcmp(op, "<=")) return jv_bool(r <= 0);
    return jv_bool(r >= 0);
}

/* Evaluates call arguments: n->a[first..] with the last nkw named. */
static int eval_args(jctx *c, jframe *f, const jnode *n, int first, jv **args, jv **kwv) {
    int total = n->na - first, npos = total - n->nkw;
    jv *all = td_ja_alloc(c->a, (size_t)(total + 1) * sizeof *all);
    for (int i = 0; i < total; i++) all[i] = td_jeval(c, f, n->a[first + i]);
    *args = all;
    *kwv = all + npos;
    return npos;
}

jv td_jcall_macro(jctx *c, const jnode *m, jv *args, int nargs, const char **kw, jv *kwv, int nkw, const jnode *at) {
    if (c->depth >= TPL_MAX_MACRO_DEPTH) td_jfail(c, at, "macro recursion too deep (more than %d calls)", TPL_MAX_MACRO_DEPTH);
    jframe *f = new_frame(c, c->root);
    int np = m->nkw;
    jlist *varargs = td_jl_new(c->a, 4);
    jdict *kwargs = td_jd_new(c->a, 4);
    for (int i = 0; i < nargs; i++) {
        if (i < np) set_var(c, f, m->kw[i], args[i]);
        else td_jl_push(c->a, varargs, args[i]);
    }
    for (int k = 0; k < nkw; k++) {
        int i = 0;
        while (i < np && strcmp(m->kw[i], kw[k])) i++;
        if (i == np) { td_jd_set(c->a, kwargs, jv_str(kw[k], strlen(kw[k])), kwv[k]); continue; }
        if (i < nargs) td_jfail(c, at, "macro '%s' got multiple values for argument '%s'", m->name, kw[k]);
        set_var(c, f, m->kw[i], kwv[k]);
    }
    for (int i = 0; i < np; i++) {
        if (td_jd_get(f->vars, m->kw[i], strlen(m->kw[i]), NULL)) continue;
        set_var(c, f, m->kw[i], m->a[i] ? td_jeval(c, f, m->a[i]) : jv_undef(m->kw[i]));
    }
    jv va = jv_list(varargs);
    va.flags = JF_TUPLE;
    set_var(c, f, "varargs", va);
    set_var(c, f, "kwargs", jv_dict(kwargs));
    jbuf out = {.a = c->a};
    td_jb_put(&out, "", 0);
    c->depth++;
    td_jexec(c, f, m->a[np], &out);
    c->depth--;
    jv r = jv_str(out.p, out.n);
    r.flags = JF_SAFE;
    return r;
}

static jv eval_call(jctx *c, jframe *f, const jnode *n) {
    const jnode *callee = n->a[0];
    jv *args, *kwv;
    if (callee->k == N_ATTR) {
        jv obj = td_jeval(c, f, callee->a[0]);
        if (obj.k == V_UNDEF) td_jfail(c, callee, "'%s' is undefined (calling .%s())", undef_msg(obj), callee->name);
        int na = eval_args(c, f, n, 1, &args, &kwv);
        bool found = false;
        if (!(obj.k == V_DICT && (obj.flags & JF_NS))) {
            jv r = td_jmethod(c, n, obj, callee->name, args, na, n->kw, kwv, n->nkw, &found);
            if (found) return r;
        }
        jv fn = get_attr(c, callee, obj, callee->name, callee->name_n);
        if (fn.k == V_MACRO) return td_jcall_macro(c, fn.m, args, na, n->kw, kwv, n->nkw, n);
        td_jfail(c, n, "'%s' object has no method '%s'", td_jv_type_name(obj), callee->name);
    }
    jv fn = td_jeval(c, f, callee);
    int na = eval_args(c, f, n, 1, &args, &kwv);
    if (fn.k == V_MACRO) return td_jcall_macro(c, fn.m, args, na, n->kw, kwv, n->nkw, n);
    if (fn.k == V_FUNC) return td_jcall_global(c, n, fn.fn, args, na, n->kw, kwv, n->nkw);
    if (fn.k == V_UNDEF) td_jfail(c, n, "'%s' is undefined (called)", undef_msg(fn));
    td_jfail(c, n, "'%s' object is not callable", td_jv_type_name(fn));
}

static const struct { const char *name; int fn; } GLOBALS[] = {
    {"range", FN_RANGE}, {"namespace", FN_NAMESPACE}, {"dict", FN_DICT}, {"raise_exception", FN_RAISE},
    {"strftime_now", FN_STRFTIME}, {"joiner", FN_JOINER}, {"cycler", FN_CYCLER}, {NULL, 0}};

static jv eval_node(jctx *c, jframe *f, const jnode *n);
static int exec_node(jctx *c, jframe *f, const jnode *n, jbuf *out);

/* Recursion through td_jeval/td_jexec is bounded: long chains (a + b + c ...)
 * parse into trees as deep as they are long. */
static void enter(jctx *c, const jnode *n) {
    if (++c->edepth > TPL_MAX_EVAL_DEPTH)
        td_jfail(c, n, "template nested too deeply (more than %d levels while rendering)", TPL_MAX_EVAL_DEPTH);
    step(c, n);
}

jv td_jeval(jctx *c, jframe *f, const jnode *n) {
    enter(c, n);
    jv v = eval_node(c, f, n);
    c->edepth--;
    return v;
}

int td_jexec(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    enter(c, n);
    int fl = exec_node(c, f, n, out);
    c->edepth--;
    return fl;
}

static jv eval_node(jctx *c, jframe *f, const jnode *n) {
    switch (n->k) {
    case N_LIT: return n->lit;
    case N_NAME: {
        jv v;
        if (lookup(f, n->name, n->name_n, &v)) return v;
        for (int i = 0; GLOBALS[i].name; i++)
            if (!strcmp(GLOBALS[i].name, n->name)) { jv g = {.k = V_FUNC}; g.fn = GLOBALS[i].fn; return g; }
        return jv_undef(n->name);
    }
    case N_LIST: case N_TUPLE: {
        jlist *l = td_jl_new(c->a, (size_t)n->na + 1);
        for (int i = 0; i < n->na; i++) td_jl_push(c->a, l, td_jeval(c, f, n->a[i]));
        jv v = jv_list(l);
        if (n->k == N_TUPLE) v.flags = JF_TUPLE;
        return v;
    }
    case N_DICT: {
        jdict *d = td_jd_new(c->a, (size_t)n->na / 2 + 1);
        for (int i = 0; i + 1 < n->na; i += 2) td_jd_set(c->a, d, td_jeval(c, f, n->a[i]), td_jeval(c, f, n->a[i + 1]));
        return jv_dict(d);
    }
    case N_ATTR: return get_attr(c, n, td_jeval(c, f, n->a[0]), n->name, n->name_n);
    case N_ITEM: return get_item(c, n, td_jeval(c, f, n->a[0]), td_jeval(c, f, n->a[1]));
    case N_SLICE: {
        jv o = td_jeval(c, f, n->a[0]);
        jv a = n->a[1] ? td_jeval(c, f, n->a[1]) : jv_none(), b = n->a[2] ? td_jeval(c, f, n->a[2]) : jv_none(),
           s = n->a[3] ? td_jeval(c, f, n->a[3]) : jv_none();
        if (o.k == V_UNDEF) td_jfail(c, n, "'%s' is undefined (sliced)", undef_msg(o));
        return do_slice(c, n, o, a, b, s);
    }
    case N_CALL: return eval_call(c, f, n);
    case N_FILTER: {
        jv *args, *kwv;
        jv v = n->a[0] ? td_jeval(c, f, n->a[0]) : jv_undef(NULL);
        int na = eval_args(c, f, n, 1, &args, &kwv);
        return td_jfilter(c, f, n, v, args, na, n->kw, kwv, n->nkw);
    }
    case N_TEST: {
        jv *args, *kwv;
        jv v = td_jeval(c, f, n->a[0]);
        int na = eval_args(c, f, n, 1, &args, &kwv);
        bool r = td_jtest(c, n, n->name, v, args, na);
        return jv_bool(n->neg ? !r : r);
    }
    case N_BIN: return binop(c, n, n->name, td_jeval(c, f, n->a[0]), td_jeval(c, f, n->a[1]));
    case N_CONCAT: {
        jv a = td_jstr_value(c, td_jeval(c, f, n->a[0])), b = td_jstr_value(c, td_jeval(c, f, n->a[1]));
        return binop(c, n, "+", a, b);
    }
    case N_CMP: return compare(c, n, n->name, td_jeval(c, f, n->a[0]), td_jeval(c, f, n->a[1]));
    case N_NEG: case N_POS: {
        jv v = td_jeval(c, f, n->a[0]);
        if (v.k == V_INT || v.k == V_BOOL) {
            if (n->k == N_NEG && numi(v) == INT64_MIN) td_jint_overflow(c, n);
            return jv_int(n->k == N_NEG ? -numi(v) : numi(v));
        }
        if (v.k == V_FLOAT) return jv_float(n->k == N_NEG ? -v.f : v.f);
        td_jfail(c, n, "bad operand type for unary %s: '%s'", n->k == N_NEG ? "-" : "+", td_jv_type_name(v));
    }
    case N_NOT: return jv_bool(!td_jv_truthy(td_jeval(c, f, n->a[0])));
    case N_AND: { jv a = td_jeval(c, f, n->a[0]); return td_jv_truthy(a) ? td_jeval(c, f, n->a[1]) : a; }
    case N_OR: { jv a = td_jeval(c, f, n->a[0]); return td_jv_truthy(a) ? a : td_jeval(c, f, n->a[1]); }
    case N_COND:
        if (td_jv_truthy(td_jeval(c, f, n->a[0]))) return td_jeval(c, f, n->a[1]);
        return n->a[2] ? td_jeval(c, f, n->a[2]) : jv_undef("conditional expression without else");
    default: td_jfail(c, n, "internal: not an expression");
    }
}

/* Items a for loop (or a filter) iterates over. */
jlist *td_jiter(jctx *c, const jnode *n, jv v) {
    switch (v.k) {
    case V_LIST: return v.l;
    case V_UNDEF: return td_jl_new(c->a, 1);
    case V_DICT: {
        if (v.flags & (JF_NS | JF_LOOP)) break;
        jlist *l = td_jl_new(c->a, v.d->n + 1);
        for (size_t i = 0; i < v.d->n; i++) td_jl_push(c->a, l, v.d->k[i]);
        return l;
    }
    case V_STR: {
        if (v.s.n >= TPL_MAX_ITEMS) td_jfail(c, n, "string too long to iterate (over %zu items)", TPL_MAX_ITEMS);
        jlist *l = td_jl_new(c->a, v.s.n + 1);
        for (size_t i = 0; i < v.s.n;) {
            size_t j = i + 1;
            while (j < v.s.n && ((unsigned char)v.s.p[j] & 0xC0) == 0x80) j++;
            td_jl_push(c->a, l, jv_str(v.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    default: break;
    }
    td_jfail(c, n, "'%s' object is not iterable", td_jv_type_name(v));
}

static void assign(jctx *c, jframe *f, const jnode *target, jv v) {
    if (target->k == N_NAME) { set_var(c, f, target->name, v); return; }
    if (target->k == N_ATTR) {
        jv ns;
        const jnode *obj = target->a[0];
        if (!lookup(f, obj->name, obj->name_n, &ns) || ns.k != V_DICT || !(ns.flags & JF_NS))
            td_jfail(c, target, "cannot assign attribute on non-namespace object '%s'", obj->name);
        td_jd_set(c->a, ns.d, jv_str(target->name, target->name_n), v);
        return;
    }
    /* tuple unpacking */
    jlist *items = td_jiter(c, target, v);
    if (items->n != (size_t)target->na)
        td_jfail(c, target, "cannot unpack %zu values into %d names", items->n, target->na);
    for (int i = 0; i < target->na; i++) set_var(c, f, target->a[i]->name, items->v[i]);
}

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static int exec_for(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    jlist *src = td_jiter(c, n, td_jeval(c, f, n->a[1]));
    jlist *items = src;
    if (n->a[2]) { /* `for x in xs if cond`: loop.* counts the kept items */
        items = td_jl_new(c->a, src->n + 1);
        for (size_t i = 0; i < src->n; i++) {
            jframe *tf = new_frame(c, f);
            assign(c, tf, n->a[0], src->v[i]);
            if (td_jv_truthy(td_jeval(c, tf, n->a[2]))) td_jl_push(c->a, items, src->v[i]);
        }
    }
    size_t len = items->n;
    if (!len) return n->a[4] ? td_jexec(c, f, n->a[4], out) : FLOW_NORMAL;
    for (size_t i = 0; i < len; i++) {
        step(c, n);
        jframe *lf = new_frame(c, f);
        jdict *loop = td_jd_new(c->a, 12);
#define LSET(k, v) td_jd_set(c->a, loop, jv_str(k, strlen(k)), v)
        LSET("index", jv_int((int64_t)i + 1));
        LSET("index0", jv_int((int64_t)i));
        LSET("revindex", jv_int((int64_t)(len - i)));
        LSET("revindex0", jv_int((int64_t)(len - i - 1)));
        LSET("first", jv_bool(i == 0));
        LSET("last", jv_bool(i + 1 == len));
        LSET("length", jv_int((int64_t)len));
        LSET("depth", jv_int(1));
        LSET("depth0", jv_int(0));
        if (i > 0) LSET("previtem", items->v[i - 1]);
        if (i + 1 < len) LSET("nextitem", items->v[i + 1]);
#undef LSET
        jv lv = jv_dict(loop);
        lv.flags = JF_LOOP;
        set_var(c, lf, "loop", lv);
        assign(c, lf, n->a[0], items->v[i]);
        int fl = td_jexec(c, lf, n->a[3], out);
        if (fl == FLOW_BREAK) break;
    }
    return FLOW_NORMAL;
}

static int exec_node(jctx *c, jframe *f, const jnode *n, jbuf *out) {
    switch (n->k) {
    case N_BODY:
        for (int i = 0; i < n->na; i++) {
            int fl = td_jexec(c, f, n->a[i], out);
            if (fl != FLOW_NORMAL) return fl;
        }
        return FLOW_NORMAL;
    case N_DATA: td_jb_put(out, n->lit.s.p, n->lit.s.n); return FLOW_NORMAL;
    case N_OUT: td_jv_str_to(out, td_jeval(c, f, n->a[0]), false); return FLOW_NORMAL;
    case N_IF:
        for (int i = 0; i + 1 < n->na; i += 2)
            if (td_jv_truthy(td_jeval(c, f, n->a[i]))) return td_jexec(c, f, n->a[i + 1], out);
        if (n->na % 2 == 1 && n->a[n->na - 1]) return td_jexec(c, f, n->a[n->na - 1], out);
        return FLOW_NORMAL;
    case N_FOR: return exec_for(c, f, n, out);
    case N_SET: assign(c, f, n->a[0], td_jeval(c, f, n->a[1])); return FLOW_NORMAL;
    case N_SETBLOCK: {
        jbuf b = {.a = c->a};
        td_jb_put(&b, "", 0);
        td_jexec(c, f, n->a[1], &b);
        jv v = jv_str(b.p, b.n);
        /* filters of a block set: a chain whose innermost operand is NULL */
        if (n->a[2]) {
            const jnode *chain[32];
            int k = 0;
            for (const jnode *x = n->a[2]; x && k < 32; x = x->a[0]) chain[k++] = x;
            while (k--) {
                jv *args, *kwv;
                int na = eval_args(c, f, chain[k], 1, &args, &kwv);
                v = td_jfilter(c, f, chain[k], v, args, na, chain[k]->kw, kwv, chain[k]->nkw);
            }
        }
        set_var(c, f, n->a[0]->name, v);
        return FLOW_NORMAL;
    }
    case N_MACRO: {
        jv m = {.k = V_MACRO};
        m.m = n;
        set_var(c, f, n->name, m);
        return FLOW_NORMAL;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    default: td_jv_str_to(out, td_jeval(c, f, n), false); return FLOW_NORMAL;
    }
}

int td_tpl_parse(const char *src, size_t len, tpl **out, td_err *err) {
    *out = NULL;
    tpl *t = TD_CALLOC(err, 1, sizeof *t);
    if (!t) return TD_ERR_NOMEM;
    jparse p = {.a = &t->arena, .err = err};
    jmp_buf oom;
    t->arena.oom = &oom;
    if (setjmp(oom)) {
        td_tpl_free(t);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory parsing template");
    }
    int rc = td_jinja_lex(&t->arena, src, len, &p.toks, &p.nt, err);
    if (rc) { td_tpl_free(t); return rc; }
    if (setjmp(p.jb)) { td_tpl_free(t); return TD_ERR_FORMAT; }
    t->root = td_jinja_parse(&p);
    t->arena.oom = NULL;
    *out = t;
    return 0;
}

void td_tpl_free(tpl *t) {
    if (!t) return;
    td_ja_free(&t->arena);
    free(t);
}

static int render(const tpl *t, jctx *c, jframe *root, char **out, size_t *len) {
    /* the budget starts now: the converted messages are not counted */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    c->lim = (jlimits){.countdown = TPL_CLOCK_EVERY, .err = c->err, .jb = &c->jb,
                       .deadline_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (int64_t)TPL_MAX_RENDER_MS * 1000000};
    c->a->lim = &c->lim;
    jbuf b = {.a = c->a};
    td_jb_put(&b, "", 0);
    td_jexec(c, root, t->root, &b);
    c->a->lim = NULL;
    char *r = TD_MALLOC(c->err, b.n + 1);
    if (!r) return TD_ERR_NOMEM;
    memcpy(r, b.p, b.n + 1);
    *out = r;
    *len = b.n;
    return 0;
}

int td_tpl_render(const tpl *t, const json_t *ctx, char **out, size_t *len, td_err *err) {
    jarena a = {0};
    jmp_buf oom;
    a.oom = &oom;
    jctx c = {.a = &a, .err = err};
    int rc;
    if (setjmp(oom)) { td_ja_free(&a); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory rendering template"); }
    if (setjmp(c.jb)) { td_ja_free(&a); return err ? err->code : TD_ERR_ARG; }
    jframe *root = new_frame(&c, NULL);
    c.root = root;
    if (ctx) {
        jv v = td_jv_from_json(&a, ctx);
        if (v.k == V_DICT) root->vars = v.d;
    }
    rc = render(t, &c, root, out, len);
    td_ja_free(&a);
    return rc;
}

/* transformers' _alias_reasoning_fields: {"thinking": r, **message,
 * "reasoning_content": r} for the first non-null of reasoning_content,
 * thinking, reasoning. */
static jv alias_reasoning(jctx *c, jv msg) {
    if (msg.k != V_DICT) return msg;
    static const char *F[] = {"reasoning_content", "thinking", "reasoning"};
    jv r;
    bool have = false;
    for (int i = 0; i < 3 && !have; i++)
        have = td_jd_get(msg.d, F[i], strlen(F[i]), &r) && r.k != V_NONE;
    if (!have) return msg;
    jdict *d = td_jd_new(c->a, msg.d->n + 3);
    td_jd_set(c->a, d, jv_str("thinking", 8), r);
    for (size_t i = 0; i < msg.d->n; i++) td_jd_set(c->a, d, msg.d->k[i], msg.d->v[i]);
    td_jd_set(c->a, d, jv_str("reasoning_content", 17), r);
    return jv_dict(d);
}

int td_tpl_apply_chat(const tpl *t, const tpl_chat_args *x, char **out, size_t *len, td_err *err) {
    jarena a = {0};
    jmp_buf oom;
    a.oom = &oom;
    jctx c = {.a = &a, .err = err};
    if (setjmp(oom)) { td_ja_free(&a); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory rendering template"); }
    if (setjmp(c.jb)) { td_ja_free(&a); return err ? err->code : TD_ERR_ARG; }
    if (!json_is_array(x->messages)) {
        td_ja_free(&a);
        return TD_FAIL(err, TD_ERR_ARG, "messages must be a JSON array");
    }
    jframe *root = new_frame(&c, NULL);
    c.root = root;
    const char *tok_names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    const char *tok_vals[] = {x->bos_token, x->eos_token, x->pad_token, x->unk_token};
    for (int i = 0; i < 4; i++)
        if (tok_vals[i]) set_var(&c, root, tok_names[i], jv_str(tok_vals[i], strlen(tok_vals[i])));
    if (x->kwargs) { /* kwargs override special tokens */
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)x->kwargs, k, v) set_var(&c, root, td_ja_strndup(&a, k, strlen(k)), td_jv_from_json(&a, v));
    }
    jv msgs = td_jv_from_json(&a, x->messages);
    for (size_t i = 0; i < msgs.l->n; i++) {
        if (msgs.l->v[i].k != V_DICT) td_jfail(&c, NULL, "chat messages should be objects");
        msgs.l->v[i] = alias_reasoning(&c, msgs.l->v[i]);
    }
    set_var(&c, root, "messages", msgs);
    set_var(&c, root, "tools", x->tools && !json_is_null(x->tools) ? td_jv_from_json(&a, x->tools) : jv_none());
    set_var(&c, root, "documents", x->documents && !json_is_null(x->documents) ? td_jv_from_json(&a, x->documents) : jv_none());
    set_var(&c, root, "add_generation_prompt", jv_bool(x->add_generation_prompt));
    int rc = render(t, &c, root, out, len);
    td_ja_free(&a);
    return rc;
}
