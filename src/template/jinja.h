/* Internals of the Jinja subset: arena, values, tokens, AST. */
#ifndef TANDEM_JINJA_H
#define TANDEM_JINJA_H
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "template/template.h"

/* ---- limits ----
 * A chat template ships inside a downloaded model, so it is untrusted code:
 * every way it can use stack, memory or time is bounded, and going over a
 * bound is an error with a message (never a crash or a hang). The real
 * templates (tests/data/chat-templates) stay far below each one; the
 * numbers and why they are generous are in src/template/README.md. */
/* Parser recursion: nested (), [], {}, unary -/+, not, and nested block
 * tags ({% if %} inside {% for %} ...) together. Real templates: < 10. */
#define TPL_MAX_NESTING 256
/* Render recursion: nested evaluation of expressions and statements
 * (including macro calls and the deep left-leaning trees of long chains such
 * as a + b + c + ...). Real templates: < 40. */
#define TPL_MAX_EVAL_DEPTH 1000
/* Macro calls active at once (a macro that calls itself). */
#define TPL_MAX_MACRO_DEPTH 200
/* Nesting of lists and dicts a template builds (printing, comparing and
 * serialising them recurse). Python's own recursion limit is 1000. */
#define TPL_MAX_VALUE_DEPTH 1000
/* Expression/statement evaluations plus loop iterations per render;
 * bytes of the output and of any one string a render builds; items of any
 * one list or dict a render builds (range() included); bytes a render
 * allocates (the converted messages/tools are not counted).
 * TPL_FUZZ_LIMITS (the libFuzzer build only, see tests/fuzz/README.md)
 * divides these four by 10-16: the same code paths and errors, but a
 * hostile input hits them in ~10 ms instead of ~1 s under ASan. */
#ifndef TPL_FUZZ_LIMITS
#define TPL_MAX_STEPS 10000000
#define TPL_MAX_OUTPUT ((size_t)16 << 20)
#define TPL_MAX_ITEMS ((size_t)16 << 20)
#define TPL_MAX_MEMORY ((size_t)256 << 20)
#else
#define TPL_MAX_STEPS 1000000
#define TPL_MAX_OUTPUT ((size_t)1 << 20)
#define TPL_MAX_ITEMS ((size_t)1 << 20)
#define TPL_MAX_MEMORY ((size_t)16 << 20)
#endif
/* Wall-clock time per render, in milliseconds. */
#define TPL_MAX_RENDER_MS 2000
/* Work units (about one per cheap operation) between clock reads. */
#define TPL_CLOCK_EVERY 4096

struct jnode;
/* The budget of one render; the render's arena points at it, so that the
 * arena, buffers and containers can enforce it too. */
typedef struct jlimits {
    uint64_t steps;
    int64_t countdown;       /* work units until the next clock read */
    size_t mem;              /* bytes allocated in the arena since the render began */
    int64_t deadline_ns;     /* CLOCK_MONOTONIC */
    const struct jnode *at;  /* node being evaluated, for error positions */
    td_err *err;
    jmp_buf *jb;             /* the render's error exit */
} jlimits;

/* ---- arena: every allocation of a parse or a render lives here ---- */
typedef struct jarena {
    struct jchunk *head;
    jmp_buf *oom;      /* longjmp target on allocation failure */
    jlimits *lim;      /* set while rendering: limits enforced */
} jarena;
/* Fails the render that owns a (a->lim set) with a message at lim->at. */
_Noreturn void td_jlimit_fail(jarena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void td_jlimit_clock(jarena *a); /* reads the clock; fails past the deadline */
/* Accounts w units of work: the clock is read every TPL_CLOCK_EVERY. */
static inline void jwork(jarena *a, size_t w) {
    jlimits *l = a->lim;
    if (l && (l->countdown -= (int64_t)(w > (size_t)1 << 40 ? (size_t)1 << 40 : w)) < 0) td_jlimit_clock(a);
}
void *td_ja_alloc(jarena *a, size_t n);
char *td_ja_strndup(jarena *a, const char *s, size_t n);
void td_ja_free(jarena *a);

/* ---- values (Python semantics) ---- */
typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_MACRO, V_FUNC } jvkind;
enum { JF_TUPLE = 1, JF_NS = 2, JF_LOOP = 4, JF_SAFE = 8 };

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jv {
    uint8_t k, flags;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        jlist *l;
        jdict *d;
        const struct jnode *m;  /* V_MACRO */
        int fn;                 /* V_FUNC: builtin global */
        const char *undef;      /* V_UNDEF: name, for messages (may be NULL) */
    };
} jv;
/* depth: 1 + the deepest item's depth (scalars are 0); kept by td_jl_push,
 * td_jd_set and td_jv_from_json */
struct jlist { size_t n, cap; jv *v; uint32_t depth; };
struct jdict { size_t n, cap; jv *k, *v; uint32_t depth; };

static inline jv jv_undef(const char *name) { jv v = {.k = V_UNDEF}; v.undef = name; return v; }
static inline jv jv_none(void) { return (jv){.k = V_NONE}; }
static inline jv jv_bool(bool b) { jv v = {.k = V_BOOL}; v.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {.k = V_INT}; v.i = i; return v; }
static inline jv jv_float(double f) { jv v = {.k = V_FLOAT}; v.f = f; return v; }
static inline jv jv_str(const char *p, size_t n) { jv v = {.k = V_STR}; v.s.p = p; v.s.n = n; return v; }

/* growable byte buffer in the arena */
typedef struct jbuf { char *p; size_t n, cap; jarena *a; } jbuf;
void td_jb_put(jbuf *b, const char *s, size_t n);
static inline void jb_puts(jbuf *b, const char *s) { td_jb_put(b, s, strlen(s)); }
void td_jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

jlist *td_jl_new(jarena *a, size_t cap);
void td_jl_push(jarena *a, jlist *l, jv v);
jdict *td_jd_new(jarena *a, size_t cap);
void td_jd_set(jarena *a, jdict *d, jv key, jv val);
bool td_jd_get(const jdict *d, const char *key, size_t n, jv *out);
bool td_jd_getv(const jdict *d, jv key, jv *out);
static inline jv jv_list(jlist *l) { jv v = {.k = V_LIST}; v.l = l; return v; }
static inline jv jv_dict(jdict *d) { jv v = {.k = V_DICT}; v.d = d; return v; }

bool td_jv_truthy(jv v);
bool td_jv_eq(jv a, jv b);
/* Python str() (and repr() when repr is true) appended to b. */
void td_jv_str_to(jbuf *b, jv v, bool repr);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys);
 * returns false (with *bad set) on an unserialisable value. */
bool td_jv_json_to(jbuf *b, jv v, const char *indent, int level, const char *item_sep, const char *key_sep,
                bool sort_keys, jv *bad);
jv td_jv_from_json(jarena *a, const json_t *j);
const char *td_jv_type_name(jv v);
/* Python repr of a float (shortest round-trip). */
void td_jv_float_repr(char out[40], double f);
/* number of code points */
size_t td_ju_len(const char *s, size_t n);
/* byte offset of code point index i (clamped to n) */
size_t td_ju_off(const char *s, size_t n, size_t i);

/* ---- tokens ---- */
typedef enum {
    TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP, TK_EOF
} jtk;
typedef struct jtok {
    jtk t;
    const char *s;   /* text (names, operators, decoded strings, data) */
    size_t n;
    int line, col;
    int64_t i;
    double f;
} jtok;

/* ---- AST ---- */
typedef enum {
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_BIN, N_NEG, N_POS, N_NOT, N_AND, N_OR, N_COND, N_CONCAT, N_CMP,
    /* statements */
    N_DATA, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BODY
} jnk;

typedef struct jnode {
    jnk k;
    int line, col;
    const char *name;     /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_BIN/N_CMP op, N_MACRO, N_SET attr */
    size_t name_n;
    jv lit;               /* N_LIT */
    struct jnode **a;     /* children (meaning depends on kind) */
    int na;
    const char **kw;      /* keyword names for N_CALL/N_FILTER/N_TEST/N_MACRO: kwargs are a[nargs..] */
    int nkw;
    bool neg;             /* N_TEST: is not */
} jnode;

typedef struct jparse {
    jarena *a;
    jtok *toks;
    size_t nt, pos;
    jmp_buf jb;
    td_err *err;
    int depth;           /* nesting, bounded by TPL_MAX_NESTING */
} jparse;

int td_jinja_lex(jarena *a, const char *src, size_t len, jtok **toks, size_t *nt, td_err *err);
jnode *td_jinja_parse(jparse *p);

struct tpl {
    jarena arena;
    jnode *root;
};

/* ---- render ---- */
typedef struct jframe {
    struct jframe *parent;
    jdict *vars;
} jframe;

typedef struct jctx {
    jarena *a;
    jmp_buf jb;
    td_err *err;
    jframe *root;
    int depth;            /* macro recursion guard */
    int edepth;           /* td_jeval/td_jexec recursion, bounded by TPL_MAX_EVAL_DEPTH */
    jlimits lim;          /* c->a->lim points here while rendering */
} jctx;

_Noreturn void td_jfail(jctx *c, const jnode *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
jv td_jeval(jctx *c, jframe *f, const jnode *n);
int td_jexec(jctx *c, jframe *f, const jnode *n, jbuf *out);
jlist *td_jiter(jctx *c, const jnode *n, jv v);     /* items a for loop visits */
int td_jv_cmp(jctx *c, const jnode *n, jv a, jv b);  /* Python ordering or error */
bool td_jv_contains(jctx *c, const jnode *n, jv hay, jv needle);
jv td_jcall_macro(jctx *c, const jnode *macro, jv *args, int nargs, const char **kw, jv *kwv, int nkw, const jnode *at);

/* builtins (jinja_builtins.c) */
jv td_jfilter(jctx *c, jframe *f, const jnode *n, jv v, jv *args, int nargs, const char **kw, jv *kwv, int nkw);
bool td_jtest(jctx *c, const jnode *n, const char *name, jv v, jv *args, int nargs);
/* method call obj.name(args); sets *found=false if no such method */
jv td_jmethod(jctx *c, const jnode *n, jv obj, const char *name, jv *args, int nargs, const char **kw, jv *kwv,
           int nkw, bool *found);
enum { FN_RANGE = 1, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME, FN_JOINER, FN_CYCLER };
jv td_jcall_global(jctx *c, const jnode *n, int fn, jv *args, int nargs, const char **kw, jv *kwv, int nkw);
/* "integer overflow" error at n */
_Noreturn void td_jint_overflow(jctx *c, const jnode *n);
jv td_jstr_value(jctx *c, jv v); /* str(v) as a V_STR */
#endif
