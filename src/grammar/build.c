/* Grammar builder: rules as growable element vectors, dedup'd byte sets,
 * UTF-8 code-point classes, literal tries and bounded repetition. Every
 * allocation is bounded by GR_MAX_* and the first error sticks in b->rc, so
 * compilers can build freely and check once. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/internal.h"

void td_gb_init(gr_builder *b, td_err *err) {
    memset(b, 0, sizeof *b);
    b->err = err;
    b->r_ws = b->r_str = b->r_strchar = b->r_num = b->r_int = b->r_never = -1;
    for (int i = 0; i < 18; i++) b->r_any_value[i] = -1;
    td_gb_rule(b); /* rule 0: the root, filled by td_gb_finish */
}

void td_gb_free(gr_builder *b) {
    for (uint32_t i = 0; i < b->n_rules; i++) free(b->rules[i].v);
    free(b->rules);
    free(b->sets);
    free(b->set_ht);
    memset(b, 0, sizeof *b);
}

int td_gb_fail(gr_builder *b, int code, const char *fmt, ...) {
    if (b->rc) return b->rc; /* keep the first error */
    char msg[sizeof b->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->rc = code;
    if (b->err) td_err_set(b->err, code, __FILE__, __LINE__, "%s", msg);
    return code;
}

static bool vec_push(gr_builder *b, gr_vec *v, uint32_t x) {
    if (b->rc) return false;
    if (++b->total > GR_MAX_ELEMS) {
        td_gb_fail(b, TD_ERR_LIMIT, "grammar too large (over %u elements)", GR_MAX_ELEMS);
        return false;
    }
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        uint32_t *nv = realloc(v->v, nc * sizeof *nv);
        if (!nv) {
            td_gb_fail(b, TD_ERR_NOMEM, "out of memory building grammar");
            return false;
        }
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return true;
}

int32_t td_gb_rule(gr_builder *b) {
    if (b->rc) return 0;
    if (b->n_rules >= GR_MAX_RULES) {
        td_gb_fail(b, TD_ERR_LIMIT, "grammar too large (over %u rules)", GR_MAX_RULES);
        return 0;
    }
    if (b->n_rules == b->cap_rules) {
        uint32_t nc = b->cap_rules ? b->cap_rules * 2 : 64;
        gr_vec *nr = realloc(b->rules, nc * sizeof *nr);
        if (!nr) {
            td_gb_fail(b, TD_ERR_NOMEM, "out of memory building grammar");
            return 0;
        }
        b->rules = nr;
        b->cap_rules = nc;
    }
    memset(&b->rules[b->n_rules], 0, sizeof(gr_vec));
    return (int32_t)b->n_rules++;
}

void td_gb_push(gr_builder *b, int32_t r, uint32_t el) {
    if (b->rc) return;
    TD_ASSERT(r >= 0 && (uint32_t)r < b->n_rules);
    vec_push(b, &b->rules[r], el);
}
void td_gb_alt(gr_builder *b, int32_t r) { td_gb_push(b, r, EL(E_ALT, 0)); }
void td_gb_ref(gr_builder *b, int32_t r, int32_t target) { td_gb_push(b, r, EL(E_REF, (uint32_t)target)); }

static uint32_t set_hash(const uint32_t s[8]) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 8; i++) h = (h ^ s[i]) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 32));
}

uint32_t td_gb_set(gr_builder *b, const uint32_t set[8]) {
    if (b->rc) return 0;
    if (b->n_sets * 2 >= b->set_ht_cap) { /* grow + rehash */
        uint32_t nc = b->set_ht_cap ? b->set_ht_cap * 2 : 256;
        uint32_t *nh = calloc(nc, sizeof *nh);
        if (!nh) return (void)td_gb_fail(b, TD_ERR_NOMEM, "out of memory building grammar"), 0;
        for (uint32_t i = 0; i < b->n_sets; i++) {
            uint32_t h = set_hash(b->sets[i]) & (nc - 1);
            while (nh[h]) h = (h + 1) & (nc - 1);
            nh[h] = i + 1;
        }
        free(b->set_ht);
        b->set_ht = nh;
        b->set_ht_cap = nc;
    }
    uint32_t h = set_hash(set) & (b->set_ht_cap - 1);
    while (b->set_ht[h]) {
        uint32_t i = b->set_ht[h] - 1;
        if (!memcmp(b->sets[i], set, 32)) return i;
        h = (h + 1) & (b->set_ht_cap - 1);
    }
    if (b->n_sets >= GR_MAX_SETS) return (void)td_gb_fail(b, TD_ERR_LIMIT, "grammar has too many byte sets"), 0;
    if (b->n_sets == b->cap_sets) {
        uint32_t nc = b->cap_sets ? b->cap_sets * 2 : 64;
        void *ns = realloc(b->sets, nc * sizeof *b->sets);
        if (!ns) return (void)td_gb_fail(b, TD_ERR_NOMEM, "out of memory building grammar"), 0;
        b->sets = ns;
        b->cap_sets = nc;
    }
    memcpy(b->sets[b->n_sets], set, 32);
    b->set_ht[h] = b->n_sets + 1;
    return b->n_sets++;
}

void td_gb_byte_range(gr_builder *b, int32_t r, int lo, int hi) {
    uint32_t s[8] = {0};
    for (int c = lo; c <= hi; c++) s[c >> 5] |= 1u << (c & 31);
    td_gb_push(b, r, EL(E_BYTES, td_gb_set(b, s)));
}

void td_gb_lit(gr_builder *b, int32_t r, const void *bytes, size_t n) {
    const uint8_t *p = bytes;
    for (size_t i = 0; i < n && !b->rc; i++) td_gb_byte_range(b, r, p[i], p[i]);
}

int32_t td_gb_never(gr_builder *b) {
    if (b->r_never < 0) {
        uint32_t s[8] = {0};
        b->r_never = td_gb_rule(b);
        td_gb_push(b, b->r_never, EL(E_BYTES, td_gb_set(b, s)));
    }
    return b->r_never;
}

void td_gb_repeat(gr_builder *b, int32_t r, const uint32_t *el, int n, int lo, int hi) {
    for (int i = 0; i < lo && !b->rc; i++)
        for (int k = 0; k < n; k++) td_gb_push(b, r, el[k]);
    if (hi < 0) { /* S := el S | eps (tail recursion: constant stack depth) */
        int32_t s = td_gb_rule(b);
        for (int k = 0; k < n; k++) td_gb_push(b, s, el[k]);
        td_gb_ref(b, s, s);
        td_gb_alt(b, s);
        td_gb_ref(b, r, s);
        return;
    }
    /* O_1 := el | eps; O_k := el O_{k-1} | eps */
    int32_t prev = -1;
    for (int i = 0; i < hi - lo && !b->rc; i++) {
        int32_t o = td_gb_rule(b);
        for (int k = 0; k < n; k++) td_gb_push(b, o, el[k]);
        if (prev >= 0) td_gb_ref(b, o, prev);
        td_gb_alt(b, o);
        prev = o;
    }
    if (prev >= 0) td_gb_ref(b, r, prev);
}

/* ---- code-point sets ---- */
void td_cps_add(gr_builder *b, cpset *s, uint32_t lo, uint32_t hi) {
    if (b->rc || lo > hi) return;
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        if (nc > 1 << 20) {
            td_gb_fail(b, TD_ERR_LIMIT, "character class too large");
            return;
        }
        void *nr = realloc(s->r, (size_t)nc * sizeof *s->r);
        if (!nr) {
            td_gb_fail(b, TD_ERR_NOMEM, "out of memory building grammar");
            return;
        }
        s->r = nr;
        s->cap = nc;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void td_cps_norm(cpset *s) {
    if (s->n < 2) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[k][1] + 1) {
            if (s->r[i][1] > s->r[k][1]) s->r[k][1] = s->r[i][1];
        } else {
            k++;
            s->r[k][0] = s->r[i][0];
            s->r[k][1] = s->r[i][1];
        }
    }
    s->n = k + 1;
}

void td_cps_negate(gr_builder *b, cpset *s) {
    td_cps_norm(s);
    cpset o = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i][0] > next) td_cps_add(b, &o, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= 0x10FFFF) td_cps_add(b, &o, next, 0x10FFFF);
    td_cps_free(s);
    *s = o;
}

void td_cps_free(cpset *s) {
    free(s->r);
    memset(s, 0, sizeof *s);
}

static int utf8_enc(uint32_t c, uint8_t *o) {
    if (c < 0x80) return o[0] = (uint8_t)c, 1;
    if (c < 0x800) return o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12);
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18);
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63));
    o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* Splits [lo,hi] (same UTF-8 length, no surrogates) into ranges whose UTF-8
 * encodings are byte-wise rectangles, appending each as an alternative of r
 * (single-byte ones go into *ascii instead, merged into one set). Iterative
 * with an explicit stack (depth <= 2 * 3 splits). */
static void utf8_split(gr_builder *b, int32_t r, uint32_t lo, uint32_t hi, uint32_t ascii[8], bool *first) {
    uint32_t st[64][2];
    int sp = 0;
    st[sp][0] = lo, st[sp][1] = hi, sp++;
    while (sp > 0 && !b->rc) {
        sp--;
        lo = st[sp][0], hi = st[sp][1];
        if (lo > hi) continue;
        uint8_t a[4], z[4];
        int n = utf8_enc(lo, a);
        bool split = false;
        for (int i = 1; i < n && !split; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if ((lo & m) != 0) {
                    st[sp][0] = (lo | m) + 1, st[sp][1] = hi, sp++;
                    st[sp][0] = lo, st[sp][1] = lo | m, sp++;
                    split = true;
                } else if ((hi & m) != m) {
                    st[sp][0] = hi & ~m, st[sp][1] = hi, sp++;
                    st[sp][0] = lo, st[sp][1] = (hi & ~m) - 1, sp++;
                    split = true;
                }
            }
        }
        if (split) continue;
        utf8_enc(hi, z);
        if (n == 1) {
            for (uint32_t c = a[0]; c <= z[0]; c++) ascii[c >> 5] |= 1u << (c & 31);
            continue;
        }
        if (!*first) td_gb_alt(b, r);
        *first = false;
        for (int i = 0; i < n; i++) td_gb_byte_range(b, r, a[i], z[i]);
    }
}

static const char *json_esc(uint32_t c, char buf[8]) {
    switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: snprintf(buf, 8, "\\u%04X", (unsigned)c); return buf;
    }
}

void td_gb_cp(gr_builder *b, int32_t r, uint32_t cp, bool json) {
    if (json && (cp < 0x20 || cp == '"' || cp == '\\')) {
        char buf[8];
        const char *e = json_esc(cp, buf);
        td_gb_lit(b, r, e, strlen(e));
        return;
    }
    uint8_t o[4];
    int n = utf8_enc(cp, o);
    td_gb_lit(b, r, o, (size_t)n);
}

int32_t td_gb_cpset_rule(gr_builder *b, const cpset *in, bool json) {
    int32_t r = td_gb_rule(b);
    uint32_t ascii[8] = {0};
    bool first = true;
    static const uint32_t bounds[][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (int i = 0; i < in->n && !b->rc; i++) {
        uint32_t lo = in->r[i][0], hi = in->r[i][1];
        if (json) /* escaped separately below */
            for (uint32_t c = lo; c <= hi && c < 0x80; c++)
                if (c < 0x20 || c == '"' || c == '\\') {
                    if (!first) td_gb_alt(b, r);
                    first = false;
                    td_gb_cp(b, r, c, true);
                }
        for (int k = 0; k < 5; k++) {
            uint32_t a = lo > bounds[k][0] ? lo : bounds[k][0];
            uint32_t z = hi < bounds[k][1] ? hi : bounds[k][1];
            if (a <= z) utf8_split(b, r, a, z, ascii, &first);
        }
    }
    if (json) {
        for (int c = 0; c < 0x20; c++) ascii[c >> 5] &= ~(1u << (c & 31));
        ascii['"' >> 5] &= ~(1u << ('"' & 31));
        ascii['\\' >> 5] &= ~(1u << ('\\' & 31));
    }
    bool any = false;
    for (int i = 0; i < 8; i++) any |= ascii[i] != 0;
    if (any || first) { /* first: the set is empty -> the empty byte set (never) */
        if (!first) td_gb_alt(b, r);
        td_gb_push(b, r, EL(E_BYTES, td_gb_set(b, ascii)));
    }
    return r;
}

/* ---- literal tries ---- */
typedef struct {
    uint32_t child, sib; /* 0 = none (node 0 is the root, never a child) */
    uint8_t byte, term;
    int32_t rule;
} lnode;

int32_t td_gb_literals(gr_builder *b, const uint8_t *const *s, const size_t *len, int n) {
    if (b->rc) return 0;
    if (n <= 0) return td_gb_never(b);
    size_t total = 1;
    for (int i = 0; i < n; i++) {
        total += len[i];
        if (total > GR_MAX_ELEMS) return td_gb_fail(b, TD_ERR_LIMIT, "choices/enum too large (over %u bytes)", GR_MAX_ELEMS), 0;
    }
    lnode *t = calloc(total, sizeof *t);
    uint32_t *queue = malloc(total * sizeof *queue);
    if (!t || !queue) {
        free(t), free(queue);
        return td_gb_fail(b, TD_ERR_NOMEM, "out of memory building grammar"), 0;
    }
    uint32_t nn = 1;
    for (int i = 0; i < n; i++) {
        uint32_t cur = 0;
        for (size_t k = 0; k < len[i]; k++) {
            uint32_t c = t[cur].child;
            while (c && t[c].byte != s[i][k]) c = t[c].sib;
            if (!c) {
                c = nn++;
                t[c].byte = s[i][k];
                t[c].sib = t[cur].child;
                t[cur].child = c;
            }
            cur = c;
        }
        t[cur].term = 1;
    }
    for (uint32_t i = 0; i < nn; i++) t[i].rule = -1;
    /* Node rules: one per branching/terminal node; single-child chains are
     * emitted inline. Breadth-first with a queue: no recursion. */
    uint32_t qh = 0, qt = 0;
    t[0].rule = td_gb_rule(b);
    queue[qt++] = 0;
    while (qh < qt && !b->rc) {
        uint32_t nd = queue[qh++];
        int32_t r = t[nd].rule;
        bool first = true;
        if (t[nd].term) first = false; /* the empty alternative comes first */
        for (uint32_t c = t[nd].child; c; c = t[c].sib) {
            if (!first) td_gb_alt(b, r);
            first = false;
            uint32_t x = c;
            for (;;) {
                td_gb_byte_range(b, r, t[x].byte, t[x].byte);
                if (t[x].term || !t[x].child || t[t[x].child].sib) break;
                x = t[x].child;
            }
            if (t[x].child) {
                if (t[x].rule < 0) {
                    t[x].rule = td_gb_rule(b);
                    queue[qt++] = x;
                }
                td_gb_ref(b, r, t[x].rule);
            }
        }
    }
    int32_t root = t[0].rule;
    free(t);
    free(queue);
    return root;
}

/* ---- finish ---- */
td_grammar_opts td_grammar_opts_default(void) {
    td_grammar_opts o = {.max_ws = 1, .strict = false, .cache_bytes = 0};
    return o;
}

int td_gb_finish(gr_builder *b, int32_t root, const td_grammar_opts *o, td_grammar **out) {
    *out = NULL;
    if (!b->rc && root != 0) td_gb_ref(b, 0, root);
    if (b->rc) {
        int rc = b->rc;
        td_gb_free(b);
        return rc;
    }
    td_grammar *g = calloc(1, sizeof *g);
    uint64_t ne = b->total + b->n_rules;
    if (g) {
        g->elems = malloc(ne * sizeof *g->elems);
        g->rule_start = malloc((size_t)b->n_rules * sizeof *g->rule_start);
        g->sets = malloc((size_t)(b->n_sets ? b->n_sets : 1) * sizeof *g->sets);
    }
    if (!g || !g->elems || !g->rule_start || !g->sets) {
        if (g) free(g->elems), free(g->rule_start), free(g->sets);
        free(g);
        int rc = td_gb_fail(b, TD_ERR_NOMEM, "out of memory building grammar");
        td_gb_free(b);
        return rc;
    }
    uint32_t k = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        g->rule_start[r] = k;
        if (b->rules[r].n) memcpy(g->elems + k, b->rules[r].v, b->rules[r].n * sizeof(uint32_t));
        k += b->rules[r].n;
        g->elems[k++] = EL(E_END, 0);
    }
    g->n_elems = k;
    g->n_rules = b->n_rules;
    if (b->n_sets) memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets); /* none: b->sets may be NULL */
    g->n_sets = b->n_sets;
    pthread_mutex_init(&g->mu, NULL);
    g->cap_bytes = o && o->cache_bytes ? o->cache_bytes : (size_t)64 << 20;
    td_gb_free(b);
    *out = g;
    return 0;
}
