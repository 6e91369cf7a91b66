/* Recursive-descent parser with Jinja2's operator precedence:
 *   cond-expr < or < and < not < compare/in/is < + - < ~ < * / // % < ** < unary
 * with filters (|f) and tests (is t) binding to the unary operand. */
#include <stdio.h>
#include "template/jinja.h"
#include "util/err.h"

static _Noreturn void pfail(jparse *p, const jtok *t, const char *fmt, const char *arg) {
    char msg[300];
    snprintf(msg, sizeof msg, fmt, arg);
    TD_FAIL(p->err, TD_ERR_FORMAT, "template line %d column %d: %s", t->line, t->col, msg);
    longjmp(p->jb, 1);
}

/* Every recursive path of the parser goes through enter(): nested
 * expressions, unary operators, `not` and block bodies. */
static void enter(jparse *p, const jtok *at) {
    if (++p->depth > TPL_MAX_NESTING) {
        char msg[80];
        snprintf(msg, sizeof msg, "template nested too deeply (more than %d levels)", TPL_MAX_NESTING);
        pfail(p, at, "%s", msg);
    }
}
static void leave(jparse *p) { p->depth--; }

static jtok *peek(jparse *p) { return &p->toks[p->pos]; }
static jtok *peek2(jparse *p) { return &p->toks[p->pos + 1 < p->nt ? p->pos + 1 : p->pos]; }
static jtok *next(jparse *p) { jtok *t = &p->toks[p->pos]; if (p->pos + 1 < p->nt) p->pos++; return t; }
static bool is_op(const jtok *t, const char *op) { return t->t == TK_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static bool is_name(const jtok *t, const char *nm) { return t->t == TK_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n); }
static bool accept_op(jparse *p, const char *op) { if (is_op(peek(p), op)) { next(p); return true; } return false; }
static bool accept_name(jparse *p, const char *nm) { if (is_name(peek(p), nm)) { next(p); return true; } return false; }
static void expect_op(jparse *p, const char *op) { if (!accept_op(p, op)) pfail(p, peek(p), "expected '%s'", op); }
static const char *tokname(jparse *p, const jtok *t) { return td_ja_strndup(p->a, t->s, t->n); }

static jnode *mk(jparse *p, jnk k, const jtok *at) {
    jnode *n = td_ja_alloc(p->a, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* growable child list */
typedef struct { jnode **v; int n, cap; } nvec;
static void nv_push(jparse *p, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        jnode **nn = td_ja_alloc(p->a, (size_t)nc * sizeof *nn);
        if (v->n) memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static jnode *parse_expr(jparse *p);
static jnode *parse_or(jparse *p);
static jnode *parse_unary(jparse *p, bool with_filter);

/* (args, kw=val) after '(' was consumed. */
static void parse_args(jparse *p, jnode *n) {
    nvec args = {0}, kwv = {0};
    const char **kw = NULL;
    int nkw = 0, kcap = 0;
    while (!is_op(peek(p), ")")) {
        if (args.n + kwv.n) expect_op(p, ",");
        if (is_op(peek(p), ")")) break; /* trailing comma */
        if (peek(p)->t == TK_NAME && is_op(peek2(p), "=")) {
            jtok *nm = next(p);
            next(p);
            if (nkw == kcap) {
                kcap = kcap ? kcap * 2 : 4;
                const char **nk = td_ja_alloc(p->a, (size_t)kcap * sizeof *nk);
                if (nkw) memcpy(nk, kw, (size_t)nkw * sizeof *nk);
                kw = nk;
            }
            kw[nkw++] = tokname(p, nm);
            nv_push(p, &kwv, parse_expr(p));
        } else {
            if (kwv.n) pfail(p, peek(p), "%s", "positional argument after keyword argument");
            nv_push(p, &args, parse_expr(p));
        }
    }
    expect_op(p, ")");
    n->na = args.n + kwv.n;
    n->a = td_ja_alloc(p->a, (size_t)(n->na ? n->na : 1) * sizeof *n->a);
    for (int i = 0; i < args.n; i++) n->a[i] = args.v[i];
    for (int i = 0; i < kwv.n; i++) n->a[args.n + i] = kwv.v[i];
    n->kw = kw;
    n->nkw = nkw;
}

static jnode *parse_primary(jparse *p) {
    jtok *t = peek(p);
    jnode *n;
    if (t->t == TK_NAME) {
        next(p);
        if (is_name(t, "true") || is_name(t, "True")) { n = mk(p, N_LIT, t); n->lit = jv_bool(true); return n; }
        if (is_name(t, "false") || is_name(t, "False")) { n = mk(p, N_LIT, t); n->lit = jv_bool(false); return n; }
        if (is_name(t, "none") || is_name(t, "None")) { n = mk(p, N_LIT, t); n->lit = jv_none(); return n; }
        n = mk(p, N_NAME, t);
        n->name = tokname(p, t);
        n->name_n = t->n;
        return n;
    }
    if (t->t == TK_STRING) {
        /* adjacent literals concatenate */
        jbuf b = {.a = p->a};
        td_jb_put(&b, "", 0);
        while (peek(p)->t == TK_STRING) { jtok *s = next(p); td_jb_put(&b, s->s, s->n); }
        n = mk(p, N_LIT, t);
        n->lit = jv_str(b.p, b.n);
        return n;
    }
    if (t->t == TK_INT) { next(p); n = mk(p, N_LIT, t); n->lit = jv_int(t->i); return n; }
    if (t->t == TK_FLOAT) { next(p); n = mk(p, N_LIT, t); n->lit = jv_float(t->f); return n; }
    if (is_op(t, "(")) {
        next(p);
        if (accept_op(p, ")")) { n = mk(p, N_TUPLE, t); return n; }
        jnode *e = parse_expr(p);
        if (is_op(peek(p), ",")) {
            nvec v = {0};
            nv_push(p, &v, e);
            while (accept_op(p, ",")) {
                if (is_op(peek(p), ")")) break;
                nv_push(p, &v, parse_expr(p));
            }
            expect_op(p, ")");
            n = mk(p, N_TUPLE, t);
            n->a = v.v;
            n->na = v.n;
            return n;
        }
        expect_op(p, ")");
        return e;
    }
    if (is_op(t, "[")) {
        next(p);
        nvec v = {0};
        while (!is_op(peek(p), "]")) {
            if (v.n) expect_op(p, ",");
            if (is_op(peek(p), "]")) break;
            nv_push(p, &v, parse_expr(p));
        }
        expect_op(p, "]");
        n = mk(p, N_LIST, t);
        n->a = v.v;
        n->na = v.n;
        return n;
    }
    if (is_op(t, "{")) {
        next(p);
        nvec v = {0};
        while (!is_op(peek(p), "}")) {
            if (v.n) expect_op(p, ",");
            if (is_op(peek(p), "}")) break;
            nv_push(p, &v, parse_expr(p));
            expect_op(p, ":");
            nv_push(p, &v, parse_expr(p));
        }
        expect_op(p, "}");
        n = mk(p, N_DICT, t);
        n->a = v.v;
        n->na = v.n;
        return n;
    }
    pfail(p, t, "unexpected '%s'", t->t == TK_EOF ? "end of template" : tokname(p, t));
}

static jnode *parse_postfix(jparse *p, jnode *n) {
    for (;;) {
        jtok *t = peek(p);
        if (is_op(t, ".")) {
            next(p);
            jtok *nm = next(p);
            if (nm->t == TK_INT) { /* x.0 is x[0] */
                jnode *idx = mk(p, N_LIT, nm);
                idx->lit = jv_int(nm->i);
                jnode *it = mk(p, N_ITEM, t);
                it->a = td_ja_alloc(p->a, 2 * sizeof *it->a);
                it->a[0] = n; it->a[1] = idx; it->na = 2;
                n = it;
                continue;
            }
            if (nm->t != TK_NAME) pfail(p, nm, "%s", "expected an attribute name");
            jnode *at = mk(p, N_ATTR, t);
            at->name = tokname(p, nm);
            at->name_n = nm->n;
            at->a = td_ja_alloc(p->a, sizeof *at->a);
            at->a[0] = n; at->na = 1;
            n = at;
        } else if (is_op(t, "[")) {
            next(p);
            jnode *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (is_op(peek(p), ":")) { next(p); slice = true; np++; if (np > 2) pfail(p, t, "%s", "bad slice"); continue; }
                if (is_op(peek(p), "]")) break;
                parts[np] = parse_expr(p);
                if (!slice && !is_op(peek(p), ":")) break;
            }
            expect_op(p, "]");
            jnode *it = mk(p, slice ? N_SLICE : N_ITEM, t);
            it->a = td_ja_alloc(p->a, 4 * sizeof *it->a);
            it->a[0] = n;
            if (slice) { it->a[1] = parts[0]; it->a[2] = parts[1]; it->a[3] = parts[2]; it->na = 4; }
            else { it->a[1] = parts[0]; it->na = 2; if (!parts[0]) pfail(p, t, "%s", "empty subscript"); }
            n = it;
        } else if (is_op(t, "(")) {
            next(p);
            jnode *c = mk(p, N_CALL, t);
            parse_args(p, c);
            /* callee stored as name slot child: prepend */
            jnode **na = td_ja_alloc(p->a, (size_t)(c->na + 1) * sizeof *na);
            na[0] = n;
            for (int i = 0; i < c->na; i++) na[i + 1] = c->a[i];
            c->a = na;
            c->na++;
            n = c;
        } else {
            return n;
        }
    }
}

/* Filter/test nodes: a[0] = operand, a[1..] = args (kwargs last, names in kw). */
static jnode *with_operand(jparse *p, jnode *f, jnode *operand) {
    jnode **na = td_ja_alloc(p->a, (size_t)(f->na + 1) * sizeof *na);
    na[0] = operand;
    for (int i = 0; i < f->na; i++) na[i + 1] = f->a[i];
    f->a = na;
    f->na++;
    return f;
}

static jnode *parse_filter_expr(jparse *p, jnode *n) {
    for (;;) {
        jtok *t = peek(p);
        if (is_op(t, "|")) {
            next(p);
            jtok *nm = next(p);
            if (nm->t != TK_NAME) pfail(p, nm, "%s", "expected a filter name");
            jnode *f = mk(p, N_FILTER, nm);
            f->name = tokname(p, nm);
            if (accept_op(p, "(")) parse_args(p, f);
            n = with_operand(p, f, n);
        } else if (is_name(t, "is")) {
            next(p);
            bool neg = accept_name(p, "not");
            jtok *nm = next(p);
            if (nm->t != TK_NAME) pfail(p, nm, "%s", "expected a test name");
            jnode *f = mk(p, N_TEST, nm);
            f->name = tokname(p, nm);
            f->neg = neg;
            jtok *a = peek(p);
            if (accept_op(p, "(")) parse_args(p, f);
            else if (a->t == TK_STRING || a->t == TK_INT || a->t == TK_FLOAT ||
                     (a->t == TK_NAME && !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and") &&
                      !is_name(a, "if") && !is_name(a, "in") && !is_name(a, "is") && !is_name(a, "not")) ||
                     is_op(a, "[") || is_op(a, "{")) {
                /* one argument without parentheses: `is divisibleby 3` */
                jnode *arg = parse_primary(p);
                arg = parse_postfix(p, arg);
                f->a = td_ja_alloc(p->a, sizeof *f->a);
                f->a[0] = arg;
                f->na = 1;
            }
            n = with_operand(p, f, n);
        } else if (is_op(t, "(")) {
            n = parse_postfix(p, n);
        } else {
            return n;
        }
    }
}

static jnode *parse_unary(jparse *p, bool with_filter) {
    jtok *t = peek(p);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        n = mk(p, is_op(t, "-") ? N_NEG : N_POS, t);
        n->a = td_ja_alloc(p->a, sizeof *n->a);
        enter(p, t);
        n->a[0] = parse_unary(p, false);
        leave(p);
        n->na = 1;
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    return with_filter ? parse_filter_expr(p, n) : n;
}

static jnode *bin(jparse *p, jnk k, const jtok *t, const char *op, jnode *l, jnode *r) {
    jnode *n = mk(p, k, t);
    n->name = op;
    n->a = td_ja_alloc(p->a, 2 * sizeof *n->a);
    n->a[0] = l; n->a[1] = r; n->na = 2;
    return n;
}

static jnode *parse_pow(jparse *p) {
    jnode *l = parse_unary(p, true);
    while (is_op(peek(p), "**")) { jtok *t = next(p); l = bin(p, N_BIN, t, "**", l, parse_unary(p, true)); }
    return l;
}

static jnode *parse_math2(jparse *p) {
    jnode *l = parse_pow(p);
    for (;;) {
        jtok *t = peek(p);
        const char *op = is_op(t, "*") ? "*" : is_op(t, "/") ? "/" : is_op(t, "//") ? "//" : is_op(t, "%") ? "%" : NULL;
        if (!op) return l;
        next(p);
        l = bin(p, N_BIN, t, op, l, parse_pow(p));
    }
}

static jnode *parse_concat(jparse *p) {
    jnode *l = parse_math2(p);
    while (is_op(peek(p), "~")) { jtok *t = next(p); l = bin(p, N_CONCAT, t, "~", l, parse_math2(p)); }
    return l;
}

static jnode *parse_math1(jparse *p) {
    jnode *l = parse_concat(p);
    for (;;) {
        jtok *t = peek(p);
        const char *op = is_op(t, "+") ? "+" : is_op(t, "-") ? "-" : NULL;
        if (!op) return l;
        next(p);
        l = bin(p, N_BIN, t, op, l, parse_concat(p));
    }
}

/* Comparisons chain like Python: a < b < c is (a < b) and (b < c). */
static jnode *parse_compare(jparse *p) {
    jnode *l = parse_math1(p), *res = NULL;
    for (;;) {
        jtok *t = peek(p);
        const char *op = NULL;
        if (is_op(t, "==")) op = "==";
        else if (is_op(t, "!=")) op = "!=";
        else if (is_op(t, "<")) op = "<";
        else if (is_op(t, ">")) op = ">";
        else if (is_op(t, "<=")) op = "<=";
        else if (is_op(t, ">=")) op = ">=";
        else if (is_name(t, "in")) op = "in";
        else if (is_name(t, "not") && is_name(peek2(p), "in")) { next(p); op = "not in"; }
        if (!op) return res ? res : l;
        next(p);
        jnode *r = parse_math1(p);
        jnode *c = bin(p, N_CMP, t, op, l, r);
        res = res ? bin(p, N_AND, t, "and", res, c) : c;
        l = r;
    }
}

static jnode *parse_not(jparse *p) {
    jtok *t = peek(p);
    if (is_name(t, "not")) {
        next(p);
        jnode *n = mk(p, N_NOT, t);
        n->a = td_ja_alloc(p->a, sizeof *n->a);
        enter(p, t);
        n->a[0] = parse_not(p);
        leave(p);
        n->na = 1;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_and(jparse *p) {
    jnode *l = parse_not(p);
    while (is_name(peek(p), "and")) { jtok *t = next(p); l = bin(p, N_AND, t, "and", l, parse_not(p)); }
    return l;
}

static jnode *parse_or(jparse *p) {
    jnode *l = parse_and(p);
    while (is_name(peek(p), "or")) { jtok *t = next(p); l = bin(p, N_OR, t, "or", l, parse_and(p)); }
    return l;
}

static jnode *parse_expr1(jparse *p);
static jnode *parse_expr(jparse *p) {
    enter(p, peek(p));
    jnode *e = parse_expr1(p);
    leave(p);
    return e;
}

static jnode *parse_expr1(jparse *p) {
    jnode *e = parse_or(p);
    while (is_name(peek(p), "if")) {
        jtok *t = next(p);
        jnode *cond = parse_or(p);
        jnode *els = NULL;
        if (accept_name(p, "else")) els = parse_expr(p);
        jnode *n = mk(p, N_COND, t);
        n->a = td_ja_alloc(p->a, 3 * sizeof *n->a);
        n->a[0] = cond; n->a[1] = e; n->a[2] = els; n->na = 3;
        e = n;
    }
    return e;
}

/* Expression or bare tuple (for `set a = 1, 2` and `for` iterables). */
static jnode *parse_tuple_expr(jparse *p) {
    jtok *t = peek(p);
    jnode *e = parse_expr(p);
    if (!is_op(peek(p), ",")) return e;
    nvec v = {0};
    nv_push(p, &v, e);
    while (accept_op(p, ",")) {
        if (peek(p)->t == TK_BLOCK_END) break;
        nv_push(p, &v, parse_expr(p));
    }
    jnode *n = mk(p, N_TUPLE, t);
    n->a = v.v;
    n->na = v.n;
    return n;
}

/* ---- statements ---- */

static jnode *parse_body(jparse *p, const char **ends, const char **which);

static void expect_block_end(jparse *p) {
    if (peek(p)->t != TK_BLOCK_END) pfail(p, peek(p), "unexpected '%s' (expected end of tag)", tokname(p, peek(p)));
    next(p);
}

static jnode *body_node(jparse *p, nvec *v, const jtok *t) {
    jnode *b = mk(p, N_BODY, t);
    b->a = v->v;
    b->na = v->n;
    return b;
}

/* Target of for/set: name, or name list. Returned as N_NAME or N_TUPLE. */
static jnode *parse_target(jparse *p, bool allow_attr) {
    jtok *t = peek(p);
    if (t->t != TK_NAME) pfail(p, t, "%s", "expected a name");
    next(p);
    jnode *n = mk(p, N_NAME, t);
    n->name = tokname(p, t);
    n->name_n = t->n;
    if (allow_attr && is_op(peek(p), ".")) {
        next(p);
        jtok *at = next(p);
        if (at->t != TK_NAME) pfail(p, at, "%s", "expected an attribute name");
        jnode *a = mk(p, N_ATTR, t);
        a->name = tokname(p, at);
        a->name_n = at->n;
        a->a = td_ja_alloc(p->a, sizeof *a->a);
        a->a[0] = n; a->na = 1;
        return a;
    }
    if (!is_op(peek(p), ",")) return n;
    nvec v = {0};
    nv_push(p, &v, n);
    while (accept_op(p, ",")) {
        jtok *x = next(p);
        if (x->t != TK_NAME) pfail(p, x, "%s", "expected a name");
        jnode *m = mk(p, N_NAME, x);
        m->name = tokname(p, x);
        m->name_n = x->n;
        nv_push(p, &v, m);
    }
    jnode *tup = mk(p, N_TUPLE, t);
    tup->a = v.v;
    tup->na = v.n;
    return tup;
}

static jnode *parse_stmt(jparse *p, jtok *kw) {
    jnode *n;
    if (is_name(kw, "if")) {
        /* a = [cond0, body0, cond1, body1, ..., else_body or NULL] */
        nvec v = {0};
        nv_push(p, &v, parse_expr(p));
        expect_block_end(p);
        static const char *ends[] = {"elif", "else", "endif", NULL};
        for (;;) {
            const char *which;
            nv_push(p, &v, parse_body(p, ends, &which));
            if (!strcmp(which, "elif")) { nv_push(p, &v, parse_expr(p)); expect_block_end(p); continue; }
            if (!strcmp(which, "else")) {
                expect_block_end(p);
                static const char *e2[] = {"endif", NULL};
                nv_push(p, &v, parse_body(p, e2, &which));
            } else {
                nv_push(p, &v, NULL);
            }
            expect_block_end(p);
            break;
        }
        n = mk(p, N_IF, kw);
        n->a = v.v;
        n->na = v.n;
        return n;
    }
    if (is_name(kw, "for")) {
        /* a = [target, iter, filter or NULL, body, else or NULL] */
        n = mk(p, N_FOR, kw);
        n->a = td_ja_alloc(p->a, 5 * sizeof *n->a);
        n->na = 5;
        n->a[0] = parse_target(p, false);
        if (!accept_name(p, "in")) pfail(p, peek(p), "%s", "expected 'in'");
        /* the iterable may not contain a bare conditional (`if` filters) */
        jnode *it = parse_or(p);
        n->a[1] = it;
        n->a[2] = NULL;
        if (accept_name(p, "if")) n->a[2] = parse_expr(p);
        if (is_name(peek(p), "recursive")) pfail(p, peek(p), "%s", "recursive loops are not supported");
        expect_block_end(p);
        static const char *ends[] = {"else", "endfor", NULL};
        const char *which;
        n->a[3] = parse_body(p, ends, &which);
        n->a[4] = NULL;
        if (!strcmp(which, "else")) {
            expect_block_end(p);
            static const char *e2[] = {"endfor", NULL};
            n->a[4] = parse_body(p, e2, &which);
        }
        expect_block_end(p);
        return n;
    }
    if (is_name(kw, "set")) {
        jnode *target = parse_target(p, true);
        if (accept_op(p, "=")) {
            n = mk(p, N_SET, kw);
            n->a = td_ja_alloc(p->a, 2 * sizeof *n->a);
            n->a[0] = target;
            n->a[1] = parse_tuple_expr(p);
            n->na = 2;
            expect_block_end(p);
            return n;
        }
        if (target->k != N_NAME) pfail(p, kw, "%s", "block set needs a single name");
        jnode *filt = NULL;
        if (is_op(peek(p), "|")) filt = parse_filter_expr(p, NULL);
        expect_block_end(p);
        static const char *ends[] = {"endset", NULL};
        const char *which;
        n = mk(p, N_SETBLOCK, kw);
        n->a = td_ja_alloc(p->a, 3 * sizeof *n->a);
        n->a[0] = target;
        n->a[1] = parse_body(p, ends, &which);
        n->a[2] = filt;
        n->na = 3;
        expect_block_end(p);
        return n;
    }
    if (is_name(kw, "macro")) {
        jtok *nm = next(p);
        if (nm->t != TK_NAME) pfail(p, nm, "%s", "expected a macro name");
        n = mk(p, N_MACRO, kw);
        n->name = tokname(p, nm);
        n->name_n = nm->n;
        expect_op(p, "(");
        /* params: kw[i] = name; a[i] = default or NULL; a[nkw] = body */
        nvec defs = {0};
        const char **names = td_ja_alloc(p->a, 64 * sizeof *names);
        int np = 0;
        while (!is_op(peek(p), ")")) {
            if (np) expect_op(p, ",");
            if (is_op(peek(p), ")")) break;
            jtok *pn = next(p);
            if (pn->t != TK_NAME) pfail(p, pn, "%s", "expected a parameter name");
            if (np == 64) pfail(p, pn, "%s", "too many macro parameters");
            names[np++] = tokname(p, pn);
            nv_push(p, &defs, accept_op(p, "=") ? parse_expr(p) : NULL);
        }
        expect_op(p, ")");
        expect_block_end(p);
        static const char *ends[] = {"endmacro", NULL};
        const char *which;
        jnode *body = parse_body(p, ends, &which);
        if (peek(p)->t == TK_NAME) next(p); /* {% endmacro name %} */
        expect_block_end(p);
        n->kw = names;
        n->nkw = np;
        n->a = td_ja_alloc(p->a, (size_t)(np + 1) * sizeof *n->a);
        for (int i = 0; i < np; i++) n->a[i] = defs.v[i];
        n->a[np] = body;
        n->na = np + 1;
        return n;
    }
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        n = mk(p, is_name(kw, "break") ? N_BREAK : N_CONTINUE, kw);
        expect_block_end(p);
        return n;
    }
    if (is_name(kw, "generation")) { /* transformers' AssistantTracker: renders its body */
        expect_block_end(p);
        static const char *ends[] = {"endgeneration", NULL};
        const char *which;
        jnode *b = parse_body(p, ends, &which);
        expect_block_end(p);
        return b;
    }
    pfail(p, kw, "unknown or unsupported tag '%s'", tokname(p, kw));
}

/* Parses statements until one of `ends` (a block tag name) or EOF when
 * ends is NULL; *which gets the end tag found (its name is consumed). */
static jnode *parse_body1(jparse *p, const char **ends, const char **which);
static jnode *parse_body(jparse *p, const char **ends, const char **which) {
    enter(p, &p->toks[p->pos ? p->pos - 1 : 0]); /* at the tag that opened it */
    jnode *b = parse_body1(p, ends, which);
    leave(p);
    return b;
}

static jnode *parse_body1(jparse *p, const char **ends, const char **which) {
    nvec v = {0};
    jtok *start = peek(p);
    for (;;) {
        jtok *t = next(p);
        if (t->t == TK_EOF) {
            if (ends) {
                int k = 0;
                while (ends[k + 1]) k++;
                pfail(p, t, "unexpected end of template (missing '{%% %s %%}')", ends[k]);
            }
            p->pos = p->nt - 1;
            return body_node(p, &v, start);
        }
        if (t->t == TK_DATA) {
            jnode *d = mk(p, N_DATA, t);
            d->lit = jv_str(t->s, t->n);
            nv_push(p, &v, d);
        } else if (t->t == TK_VAR_BEGIN) {
            jnode *o = mk(p, N_OUT, t);
            o->a = td_ja_alloc(p->a, sizeof *o->a);
            o->a[0] = parse_tuple_expr(p);
            o->na = 1;
            if (peek(p)->t != TK_VAR_END) pfail(p, peek(p), "unexpected '%s' (expected '}}')", tokname(p, peek(p)));
            next(p);
            nv_push(p, &v, o);
        } else if (t->t == TK_BLOCK_BEGIN) {
            jtok *kw = next(p);
            if (kw->t != TK_NAME) pfail(p, kw, "%s", "expected a tag name");
            for (int i = 0; ends && ends[i]; i++)
                if (is_name(kw, ends[i])) { *which = ends[i]; return body_node(p, &v, start); }
            nv_push(p, &v, parse_stmt(p, kw));
        } else {
            pfail(p, t, "unexpected '%s'", tokname(p, t));
        }
    }
}

jnode *td_jinja_parse(jparse *p) {
    const char *which;
    return parse_body(p, NULL, &which);
}
