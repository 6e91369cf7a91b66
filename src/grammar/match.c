/* Matcher: parse-stack sets advanced byte by byte, token masks by a DFS over
 * the vocabulary's byte trie, and the grammar's bounded mask cache.
 *
 * A state is a set of parse stacks. A stack lists element positions (frames);
 * its top is always an E_BYTES element (the next byte to match) and an empty
 * stack means "the root rule is complete". Positions after which nothing
 * remains in an alternative are never pushed (tail calls), so right-recursive
 * loops run in constant depth. Expanding rule references is iterative, with a
 * per-step memo of the stacks already expanded, so nullable loops and
 * left-recursive rules terminate; a stack deeper than GR_MAX_DEPTH is dropped,
 * and a state with more than GR_MAX_STACKS stacks (or a step over GR_MAX_MEMO
 * expansions) is dead — consistently for masks and accepts. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "grammar/internal.h"

/* ---- stack sets ---- */
typedef struct {
    uint32_t *buf; /* [len, p0 .. p_{len-1}] per stack */
    size_t nb, cb;
    uint32_t *off;
    uint32_t n, cap;
    uint32_t *ht, *htgen, htc, gen; /* dedup table: slot valid iff htgen == gen */
    bool over;
} sset;

static void ss_free(sset *s) {
    free(s->buf), free(s->off), free(s->ht), free(s->htgen);
    memset(s, 0, sizeof *s);
}

static void ss_clear(sset *s) {
    s->nb = 0, s->n = 0, s->over = false;
    if (++s->gen == 0) { /* wrapped: really clear */
        if (s->htgen) memset(s->htgen, 0, s->htc * sizeof *s->htgen);
        s->gen = 1;
    }
}

static inline uint32_t *ss_stack(const sset *s, uint32_t i, uint32_t *len) {
    uint32_t *p = s->buf + s->off[i];
    *len = p[0];
    return p + 1;
}

static bool ss_rehash(sset *s, uint32_t nc) {
    uint32_t *nh = malloc(nc * sizeof *nh), *ng = calloc(nc, sizeof *ng);
    if (!nh || !ng) return free(nh), free(ng), false;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t len, *st = ss_stack(s, i, &len);
        uint32_t h = (uint32_t)XXH3_64bits(st, len * 4u) & (nc - 1);
        while (ng[h] == 1) h = (h + 1) & (nc - 1);
        ng[h] = 1, nh[h] = i;
    }
    free(s->ht), free(s->htgen);
    s->ht = nh, s->htgen = ng, s->htc = nc, s->gen = 1;
    return true;
}

/* Adds a stack unless present. Returns 1 added, 0 present, -1 over a limit. */
static int ss_add(sset *s, const uint32_t *st, uint32_t len, uint32_t limit) {
    if (s->over) return -1;
    if ((s->n + 1) * 2 > s->htc && !ss_rehash(s, s->htc ? s->htc * 2 : 16)) return s->over = true, -1;
    uint32_t h = (uint32_t)XXH3_64bits(st, len * 4u) & (s->htc - 1);
    while (s->htgen[h] == s->gen) {
        uint32_t l2, *o = ss_stack(s, s->ht[h], &l2);
        if (l2 == len && (!len || !memcmp(o, st, len * 4u))) return 0;
        h = (h + 1) & (s->htc - 1);
    }
    if (s->n >= limit) return s->over = true, -1;
    if (s->n == s->cap) {
        uint32_t nc = s->cap ? s->cap * 2 : 16;
        uint32_t *no = realloc(s->off, nc * sizeof *no);
        if (!no) return s->over = true, -1;
        s->off = no, s->cap = nc;
    }
    if (s->nb + len + 1 > (limit == GR_MAX_MEMO ? GR_MAX_MEMO_WORDS : GR_MAX_STATE_WORDS)) return s->over = true, -1;
    if (s->nb + len + 1 > s->cb) {
        size_t nc = s->cb ? s->cb * 2 : 256;
        while (nc < s->nb + len + 1) nc *= 2;
        uint32_t *nb = realloc(s->buf, nc * sizeof *nb);
        if (!nb) return s->over = true, -1;
        s->buf = nb, s->cb = nc;
    }
    s->off[s->n] = (uint32_t)s->nb;
    s->buf[s->nb] = len;
    if (len) memcpy(s->buf + s->nb + 1, st, len * 4u);
    s->nb += len + 1;
    s->htgen[h] = s->gen, s->ht[h] = s->n;
    s->n++;
    return 1;
}

static bool ss_copy(sset *d, const sset *s) {
    ss_clear(d);
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t len, *st = ss_stack(s, i, &len);
        if (ss_add(d, st, len, GR_MAX_STACKS) < 0) return false;
    }
    return true;
}

static bool ss_can_end(const sset *s) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->buf[s->off[i]] == 0) return true;
    return false;
}

/* ---- vocabulary ---- */
typedef struct {
    uint32_t child, sib; /* 0 = none */
    int32_t tok;         /* first token ending here, -1 none; more via tok_next */
    uint8_t byte;
} tnode;

struct td_grammar_vocab {
    int n;
    uint8_t *blob;
    size_t *off, *len;
    uint8_t *is_end;
    int32_t *end_ids;
    int n_end;
    tnode *trie;
    uint32_t n_nodes;
    int32_t *tok_next;
    /* the trie in preorder, for a cache-friendly linear DFS: node i has byte
     * pbyte[i] at depth pdepth[i] (root: 0), its subtree ends before pskip[i],
     * ptok[i] is its first token */
    uint8_t *pbyte;
    uint32_t *pdepth, *pskip;
    int32_t *ptok;
    size_t max_len;
    uint32_t id; /* distinguishes vocabularies in the grammar's cache */
};

static atomic_uint vocab_ids = 1;

int td_grammar_vocab_size(const td_grammar_vocab *v) { return v ? v->n : 0; }

void td_grammar_vocab_free(td_grammar_vocab *v) {
    if (!v) return;
    free(v->blob), free(v->off), free(v->len), free(v->is_end), free(v->end_ids), free(v->trie), free(v->tok_next);
    free(v->pbyte), free(v->pdepth), free(v->pskip), free(v->ptok);
    free(v);
}

int td_grammar_vocab_new(int n_vocab, const uint8_t *const *tok_bytes, const size_t *tok_len, const int32_t *end_ids,
                         int n_end, td_grammar_vocab **out, td_err *err) {
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > (1 << 24) || !tok_bytes || !tok_len || n_end < 0 || (n_end && !end_ids))
        return TD_FAIL(err, TD_ERR_ARG, "grammar vocab: bad arguments (n_vocab %d, n_end %d)", n_vocab, n_end);
    td_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return TD_FAIL(err, TD_ERR_NOMEM, "grammar vocab: out of memory");
    v->n = n_vocab;
    v->id = atomic_fetch_add(&vocab_ids, 1);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++)
        if (tok_bytes[i]) {
            if (tok_len[i] > 65536) {
                td_grammar_vocab_free(v);
                return TD_FAIL(err, TD_ERR_ARG, "grammar vocab: token %d is %zu bytes", i, tok_len[i]);
            }
            total += tok_len[i];
        }
    v->blob = malloc(total ? total : 1);
    v->off = calloc((size_t)n_vocab, sizeof *v->off);
    v->len = calloc((size_t)n_vocab, sizeof *v->len);
    v->is_end = calloc((size_t)n_vocab, 1);
    v->end_ids = malloc((size_t)(n_end ? n_end : 1) * sizeof *v->end_ids);
    v->trie = calloc(total + 1, sizeof *v->trie);
    v->tok_next = malloc((size_t)n_vocab * sizeof *v->tok_next);
    if (!v->blob || !v->off || !v->len || !v->is_end || !v->end_ids || !v->trie || !v->tok_next) {
        td_grammar_vocab_free(v);
        return TD_FAIL(err, TD_ERR_NOMEM, "grammar vocab: out of memory");
    }
    for (int i = 0; i < n_end; i++) {
        if (end_ids[i] < 0 || end_ids[i] >= n_vocab) {
            td_grammar_vocab_free(v);
            return TD_FAIL(err, TD_ERR_ARG, "grammar vocab: end id %d out of range", end_ids[i]);
        }
        if (!v->is_end[end_ids[i]]) v->end_ids[v->n_end++] = end_ids[i];
        v->is_end[end_ids[i]] = 1;
    }
    /* Byte trie of every non-special, non-end token; ids with equal bytes share a node. */
    v->trie[0].tok = -1;
    v->n_nodes = 1;
    uint32_t root_kid[256] = {0};
    size_t pos = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->tok_next[i] = -1;
        if (!tok_bytes[i] || !tok_len[i]) continue;
        memcpy(v->blob + pos, tok_bytes[i], tok_len[i]);
        v->off[i] = pos, v->len[i] = tok_len[i];
        pos += tok_len[i];
        if (v->is_end[i]) continue;
        if (tok_len[i] > v->max_len) v->max_len = tok_len[i];
        uint32_t cur = 0;
        for (size_t k = 0; k < tok_len[i]; k++) {
            uint32_t c = k ? v->trie[cur].child : root_kid[tok_bytes[i][0]]; /* the root has up to 256 children */
            if (k) while (c && v->trie[c].byte != tok_bytes[i][k]) c = v->trie[c].sib;
            if (!c) {
                c = v->n_nodes++;
                v->trie[c].byte = tok_bytes[i][k];
                v->trie[c].tok = -1;
                v->trie[c].sib = v->trie[cur].child;
                v->trie[cur].child = c;
                if (!k) root_kid[tok_bytes[i][0]] = c;
            }
            cur = c;
        }
        v->tok_next[i] = v->trie[cur].tok;
        v->trie[cur].tok = i;
    }
    uint32_t nn = v->n_nodes;
    v->pbyte = malloc(nn), v->pdepth = malloc(nn * 4u), v->pskip = malloc(nn * 4u), v->ptok = malloc(nn * 4u);
    uint32_t *stk = malloc((v->max_len + 2) * 2 * sizeof *stk); /* (node, preorder index) per depth */
    if (!v->pbyte || !v->pdepth || !v->pskip || !v->ptok || !stk) {
        free(stk);
        td_grammar_vocab_free(v);
        return TD_FAIL(err, TD_ERR_NOMEM, "grammar vocab: out of memory");
    }
    /* iterative preorder walk; a node's skip is set when its subtree is done */
    uint32_t k = 0, d = 0;
    stk[0] = 0, stk[1] = 0;
    v->pbyte[0] = 0, v->pdepth[0] = 0, v->ptok[0] = -1, k = 1;
    uint32_t cur = v->trie[0].child;
    for (;;) {
        if (cur) {
            v->pbyte[k] = v->trie[cur].byte, v->pdepth[k] = d + 1, v->ptok[k] = v->trie[cur].tok;
            d++;
            stk[2 * d] = cur, stk[2 * d + 1] = k++;
            cur = v->trie[cur].child;
            continue;
        }
        /* subtree at depth d done: close it, go to its sibling */
        v->pskip[stk[2 * d + 1]] = k;
        if (d == 0) break;
        cur = v->trie[stk[2 * d]].sib;
        d--;
    }
    free(stk);
    free(v->trie);
    v->trie = NULL;
    *out = v;
    return 0;
}

/* ---- matcher ---- */
struct td_matcher {
    const td_grammar *g;
    const td_grammar_vocab *v;
    sset cur, a, b;   /* committed state; ping-pong scratch */
    sset memo;        /* stacks expanded in the current byte step */
    uint32_t *work;   /* expansion worklist: [frames..., len] entries */
    size_t nw, cw;
    sset *pool;       /* DFS states per trie depth */
    size_t n_pool;
    uint32_t (*uni)[8]; /* per DFS depth: union of the next-byte sets */
    uint32_t *mask, *key;
    size_t nkey, ckey;
    int words;
    bool finished, dead;
    /* Interned DFS states with their byte transitions, kept across mask calls:
     * inside a JSON string almost every trie edge leads back to one of a few
     * states, so the DFS mostly follows cached transitions. Bounded: reset
     * between calls past IST_SOFT; a DFS that outgrows IST_HARD restarts on
     * the plain path (no interning). */
    struct ist { uint64_t h; size_t koff; uint32_t klen; uint32_t uni[8]; int32_t *tr; } *ist;
    uint32_t n_ist, cap_ist;
    uint32_t *ikey;
    size_t n_ikey, cap_ikey;
    uint32_t *iht, ihtc;
    uint32_t *dstate; /* per DFS depth: interned state id */
};
#define IST_SOFT_STATES 2048
#define IST_SOFT_WORDS (1u << 20)
#define IST_HARD_STATES 16384
#define IST_HARD_WORDS (4u << 20)
#define TR_UNKNOWN (-2)
#define TR_DEAD (-1)

static void ist_reset(td_matcher *m);

static bool work_push(td_matcher *m, const uint32_t *st, uint32_t len, int extra, uint32_t x) {
    size_t need = m->nw + len + 2;
    if (need > m->cw) {
        size_t nc = m->cw ? m->cw * 2 : 1024;
        while (nc < need) nc *= 2;
        uint32_t *nb = realloc(m->work, nc * sizeof *nb);
        if (!nb) return false;
        m->work = nb, m->cw = nc;
    }
    memcpy(m->work + m->nw, st, len * 4u);
    m->nw += len;
    if (extra) m->work[m->nw++] = x;
    m->work[m->nw++] = len + (uint32_t)extra;
    return true;
}

/* Expands stack st (top may be a rule reference) into out: every resulting
 * stack has an E_BYTES top, or is empty. */
static void expand(td_matcher *m, const uint32_t *st, uint32_t len, sset *out) {
    const td_grammar *g = m->g;
    uint32_t tmp[GR_MAX_DEPTH + 2];
    m->nw = 0;
    if (!work_push(m, st, len, 0, 0)) goto over;
    while (m->nw && !out->over) {
        uint32_t l = m->work[--m->nw];
        m->nw -= l;
        memcpy(tmp, m->work + m->nw, l * 4u);
        if (l == 0 || EL_T(g->elems[tmp[l - 1]]) == E_BYTES) {
            ss_add(out, tmp, l, GR_MAX_STACKS);
            continue;
        }
        int r = ss_add(&m->memo, tmp, l, GR_MAX_MEMO);
        if (r < 0) goto over;
        if (r == 0) continue; /* already expanded in this step */
        uint32_t p = tmp[l - 1], nxt = p + 1, base = l - 1;
        if (EL_T(g->elems[nxt]) >= E_BYTES) tmp[base++] = nxt;
        if (base + 1 > GR_MAX_DEPTH) continue; /* too deep: this branch dies */
        uint32_t a = g->rule_start[EL_A(g->elems[p])];
        for (;;) {
            uint32_t t = EL_T(g->elems[a]);
            bool ok = t >= E_BYTES ? work_push(m, tmp, base, 1, a) : work_push(m, tmp, base, 0, 0);
            if (!ok) goto over;
            while (EL_T(g->elems[a]) >= E_BYTES) a++;
            if (EL_T(g->elems[a]) == E_END) break;
            a++; /* past E_ALT */
        }
    }
    return;
over:
    out->over = true;
}

/* out = the stacks buf[0..nb) ([len, frames...] each) advanced by byte c;
 * false when dead. */
static bool advance_raw(td_matcher *m, const uint32_t *buf, size_t nb, uint8_t c, sset *out) {
    const td_grammar *g = m->g;
    ss_clear(out);
    ss_clear(&m->memo);
    uint32_t tmp[GR_MAX_DEPTH + 2];
    for (size_t o = 0; o < nb && !out->over; o += buf[o] + 1) {
        uint32_t len = buf[o];
        const uint32_t *st = buf + o + 1;
        if (!len) continue;
        uint32_t p = st[len - 1];
        const uint32_t *set = g->sets[EL_A(g->elems[p])];
        if (!(set[c >> 5] >> (c & 31) & 1)) continue;
        memcpy(tmp, st, (len - 1) * 4u);
        uint32_t l = len - 1;
        uint32_t t = EL_T(g->elems[p + 1]);
        if (t >= E_BYTES) tmp[l++] = p + 1;
        if (l == 0 || t == E_BYTES) ss_add(out, tmp, l, GR_MAX_STACKS); /* no expansion needed */
        else expand(m, tmp, l, out);
    }
    return out->n > 0 && !out->over;
}

static bool advance(td_matcher *m, const sset *in, uint8_t c, sset *out) { return advance_raw(m, in->buf, in->nb, c, out); }

static bool advance_bytes(td_matcher *m, const sset *in, const uint8_t *b, size_t n, sset **res) {
    const sset *src = in;
    for (size_t i = 0; i < n; i++) {
        sset *dst = src == &m->a ? &m->b : &m->a;
        if (!advance(m, src, b[i], dst)) return false;
        src = dst;
    }
    *res = (sset *)src;
    return true;
}

static void start_state(td_matcher *m) {
    const td_grammar *g = m->g;
    ss_clear(&m->cur);
    ss_clear(&m->memo);
    /* Expand rule 0 as if referenced from an empty stack: push its alternatives. */
    uint32_t a = g->rule_start[0];
    for (;;) {
        if (EL_T(g->elems[a]) >= E_BYTES) expand(m, &a, 1, &m->cur);
        else ss_add(&m->cur, NULL, 0, GR_MAX_STACKS);
        while (EL_T(g->elems[a]) >= E_BYTES) a++;
        if (EL_T(g->elems[a]) == E_END) break;
        a++;
    }
    m->dead = m->cur.over || m->cur.n == 0;
    m->finished = false;
}

void td_matcher_reset(td_matcher *m) { start_state(m); }

void td_matcher_free(td_matcher *m) {
    if (!m) return;
    ss_free(&m->cur), ss_free(&m->a), ss_free(&m->b), ss_free(&m->memo);
    for (size_t i = 0; i < m->n_pool; i++) ss_free(&m->pool[i]);
    free(m->pool), free(m->uni), free(m->work), free(m->mask), free(m->key);
    ist_reset(m);
    free(m->ist), free(m->ikey), free(m->iht), free(m->dstate);
    free(m);
}

int td_matcher_new(const td_grammar *g, const td_grammar_vocab *v, td_matcher **out, td_err *err) {
    *out = NULL;
    if (!g || !v) return TD_FAIL(err, TD_ERR_ARG, "td_matcher_new: NULL grammar or vocab");
    td_matcher *m = calloc(1, sizeof *m);
    if (!m) return TD_FAIL(err, TD_ERR_NOMEM, "matcher: out of memory");
    m->g = g, m->v = v;
    m->words = (v->n + 31) / 32;
    m->n_pool = v->max_len + 1;
    m->pool = calloc(m->n_pool, sizeof *m->pool);
    m->uni = calloc(m->n_pool, sizeof *m->uni);
    m->mask = calloc((size_t)m->words, 4);
    m->dstate = calloc(m->n_pool, sizeof *m->dstate);
    if (!m->pool || !m->uni || !m->mask || !m->dstate) {
        td_matcher_free(m);
        return TD_FAIL(err, TD_ERR_NOMEM, "matcher: out of memory");
    }
    start_state(m);
    *out = m;
    return 0;
}

bool td_matcher_finished(const td_matcher *m) { return m->finished; }
bool td_matcher_can_end(const td_matcher *m) { return !m->finished && !m->dead && ss_can_end(&m->cur); }
bool td_matcher_must_end(const td_matcher *m) {
    return !m->finished && !m->dead && m->cur.n == 1 && m->cur.buf[m->cur.off[0]] == 0;
}

int td_matcher_accept_bytes(td_matcher *m, const uint8_t *bytes, size_t len) {
    if (m->finished || m->dead) return TD_ERR_ARG;
    sset *res;
    if (!advance_bytes(m, &m->cur, bytes, len, &res)) return TD_ERR_ARG;
    if (len && !ss_copy(&m->cur, res)) return TD_ERR_ARG; /* cannot fail: res is within limits */
    return 0;
}

int td_matcher_accept(td_matcher *m, int32_t tok) {
    const td_grammar_vocab *v = m->v;
    if (tok < 0 || tok >= v->n || m->finished || m->dead) return TD_ERR_ARG;
    if (v->is_end[tok]) {
        if (!ss_can_end(&m->cur)) return TD_ERR_ARG;
        m->finished = true;
        return 0;
    }
    if (!v->len[tok]) return TD_ERR_ARG;
    return td_matcher_accept_bytes(m, v->blob + v->off[tok], v->len[tok]);
}

/* ---- mask ---- */
static void unite(const td_grammar *g, const sset *s, uint32_t u[8]) {
    memset(u, 0, 32);
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t len, *st = ss_stack(s, i, &len);
        if (!len) continue;
        const uint32_t *set = g->sets[EL_A(g->elems[st[len - 1]])];
        for (int k = 0; k < 8; k++) u[k] |= set[k];
    }
}

static void ist_reset(td_matcher *m) {
    for (uint32_t i = 0; i < m->n_ist; i++) free(m->ist[i].tr);
    m->n_ist = 0, m->n_ikey = 0;
    if (m->iht) memset(m->iht, 0, m->ihtc * sizeof *m->iht);
}

static bool make_key(td_matcher *m, sset *s);

/* Interned id of state s (canonicalized; s's order changes), or -1 when over
 * the hard bound / out of memory. */
static int32_t intern(td_matcher *m, sset *s) {
    if (!make_key(m, s)) return -1;
    uint64_t h = XXH3_64bits(m->key, m->nkey * 4);
    if (m->ihtc)
        for (uint32_t i = (uint32_t)h & (m->ihtc - 1); m->iht[i]; i = (i + 1) & (m->ihtc - 1)) {
            struct ist *e = &m->ist[m->iht[i] - 1];
            if (e->h == h && e->klen == m->nkey && !memcmp(m->ikey + e->koff, m->key, m->nkey * 4)) return (int32_t)(m->iht[i] - 1);
        }
    if (m->n_ist >= IST_HARD_STATES || m->n_ikey + m->nkey > IST_HARD_WORDS) return -1;
    if ((m->n_ist + 1) * 2 > m->ihtc) {
        uint32_t nc = m->ihtc ? m->ihtc * 2 : 1024;
        uint32_t *nh = calloc(nc, sizeof *nh);
        if (!nh) return -1;
        for (uint32_t k = 0; k < m->n_ist; k++) {
            uint32_t i = (uint32_t)m->ist[k].h & (nc - 1);
            while (nh[i]) i = (i + 1) & (nc - 1);
            nh[i] = k + 1;
        }
        free(m->iht);
        m->iht = nh, m->ihtc = nc;
    }
    if (m->n_ist == m->cap_ist) {
        uint32_t nc = m->cap_ist ? m->cap_ist * 2 : 256;
        void *ni = realloc(m->ist, nc * sizeof *m->ist);
        if (!ni) return -1;
        m->ist = ni, m->cap_ist = nc;
    }
    if (m->n_ikey + m->nkey > m->cap_ikey) {
        size_t nc = m->cap_ikey ? m->cap_ikey * 2 : 4096;
        while (nc < m->n_ikey + m->nkey) nc *= 2;
        uint32_t *nk = realloc(m->ikey, nc * 4);
        if (!nk) return -1;
        m->ikey = nk, m->cap_ikey = nc;
    }
    struct ist *e = &m->ist[m->n_ist];
    e->h = h, e->koff = m->n_ikey, e->klen = (uint32_t)m->nkey, e->tr = NULL;
    memcpy(m->ikey + m->n_ikey, m->key, m->nkey * 4);
    m->n_ikey += m->nkey;
    unite(m->g, s, e->uni);
    uint32_t i = (uint32_t)h & (m->ihtc - 1);
    while (m->iht[i]) i = (i + 1) & (m->ihtc - 1);
    m->iht[i] = m->n_ist + 1;
    return (int32_t)m->n_ist++;
}

/* Transition of interned state id by byte c: a state id, TR_DEAD, or -3
 * (over the bounds: give up on interning). */
static int32_t transition(td_matcher *m, int32_t id, uint8_t c) {
    struct ist *e = &m->ist[id];
    if (!e->tr) {
        e->tr = malloc(256 * sizeof *e->tr);
        if (!e->tr) return -3;
        for (int k = 0; k < 256; k++) e->tr[k] = TR_UNKNOWN;
    }
    if (e->tr[c] != TR_UNKNOWN) return e->tr[c];
    /* stacks of the key start after [vocab id, n] */
    bool live = advance_raw(m, m->ikey + e->koff + 2, e->klen - 2, c, &m->a);
    int32_t r = live ? intern(m, &m->a) : TR_DEAD;
    if (r == -1 && live) return -3;
    m->ist[id].tr[c] = r; /* (m->ist may have moved: index again) */
    return r;
}

static void set_toks(const td_grammar_vocab *v, uint32_t i, uint32_t *mask) {
    for (int32_t t = v->ptok[i]; t >= 0; t = v->tok_next[t]) mask[t >> 5] |= 1u << (t & 31);
}

/* DFS over the preorder trie with interned states; false if it outgrew the bounds. */
static bool dfs_interned(td_matcher *m, sset *s0, uint32_t *mask) {
    const td_grammar_vocab *v = m->v;
    if (m->n_ist > IST_SOFT_STATES || m->n_ikey > IST_SOFT_WORDS) ist_reset(m);
    int32_t root = intern(m, s0);
    if (root < 0) return false;
    m->dstate[0] = (uint32_t)root;
    for (uint32_t i = 1; i < v->n_nodes;) {
        uint32_t d = v->pdepth[i];
        int32_t par = (int32_t)m->dstate[d - 1];
        uint8_t c = v->pbyte[i];
        if (!(m->ist[par].uni[c >> 5] >> (c & 31) & 1)) {
            i = v->pskip[i];
            continue;
        }
        int32_t nx = transition(m, par, c);
        if (nx == -3) return false;
        if (nx < 0) {
            i = v->pskip[i];
            continue;
        }
        m->dstate[d] = (uint32_t)nx;
        set_toks(v, i, mask);
        i++;
    }
    return true;
}

/* The same DFS without interning (one advance per trie edge). */
static void dfs_plain(td_matcher *m, const sset *s0, uint32_t *mask) {
    const td_grammar_vocab *v = m->v;
    unite(m->g, s0, m->uni[0]);
    for (uint32_t i = 1; i < v->n_nodes;) {
        uint32_t d = v->pdepth[i];
        uint8_t c = v->pbyte[i];
        const sset *src = d > 1 ? &m->pool[d - 1] : s0;
        if (!(m->uni[d - 1][c >> 5] >> (c & 31) & 1) || !advance(m, src, c, &m->pool[d])) {
            i = v->pskip[i];
            continue;
        }
        unite(m->g, &m->pool[d], m->uni[d]);
        set_toks(v, i, mask);
        i++;
    }
}

/* Tests set this to check the plain DFS against the brute force too. */
int td_grammar_test_plain_dfs;

static void compute_mask(td_matcher *m, sset *s0, uint32_t *mask) {
    const td_grammar_vocab *v = m->v;
    memset(mask, 0, (size_t)m->words * 4);
    if (ss_can_end(s0))
        for (int i = 0; i < v->n_end; i++) mask[v->end_ids[i] >> 5] |= 1u << (v->end_ids[i] & 31);
    if (!td_grammar_test_plain_dfs && dfs_interned(m, s0, mask)) return;
    ist_reset(m);
    memset(mask, 0, (size_t)m->words * 4);
    if (ss_can_end(s0))
        for (int i = 0; i < v->n_end; i++) mask[v->end_ids[i] >> 5] |= 1u << (v->end_ids[i] & 31);
    dfs_plain(m, s0, mask);
}

/* Canonical key of a state: vocab id, stack count, then the stacks sorted. */
static int cmp_stack(const void *x, const void *y, void *ctx) {
    const uint32_t *buf = ctx;
    const uint32_t *a = buf + *(const uint32_t *)x, *b = buf + *(const uint32_t *)y;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    for (uint32_t i = 1; i <= a[0]; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

static bool make_key(td_matcher *m, sset *s) {
    size_t need = s->nb + 2;
    if (need > m->ckey) {
        uint32_t *nk = realloc(m->key, need * 4);
        if (!nk) return false;
        m->key = nk, m->ckey = need;
    }
    qsort_r(s->off, s->n, sizeof *s->off, cmp_stack, s->buf);
    m->key[0] = m->v->id, m->key[1] = s->n;
    size_t k = 2;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t *st = s->buf + s->off[i];
        memcpy(m->key + k, st, (st[0] + 1) * 4u);
        k += st[0] + 1;
    }
    m->nkey = k;
    /* The sort permuted off[], so the dedup table is stale; every later insert
     * into s starts with ss_clear, which invalidates it anyway. */
    return true;
}

typedef struct gr_centry {
    struct gr_centry *next, *fifo;
    uint64_t h;
    size_t nkey;
    int words;
    uint32_t *mask; /* points into data */
    uint32_t data[];
} gr_centry;

static size_t centry_bytes(size_t nkey, int words) { return sizeof(gr_centry) + (nkey + (size_t)words) * 4; }

static bool cache_get(td_grammar *g, uint64_t h, const uint32_t *key, size_t nkey, uint32_t *mask, int words) {
    bool hit = false;
    pthread_mutex_lock(&g->mu);
    if (g->tab_cap)
        for (gr_centry *e = g->tab[h & (g->tab_cap - 1)]; e; e = e->next)
            if (e->h == h && e->nkey == nkey && e->words == words && !memcmp(e->data, key, nkey * 4)) {
                memcpy(mask, e->mask, (size_t)words * 4);
                hit = true;
                break;
            }
    if (hit) g->hits++;
    else g->misses++;
    pthread_mutex_unlock(&g->mu);
    return hit;
}

static void cache_unlink(td_grammar *g, gr_centry *e) {
    gr_centry **pp = &g->tab[e->h & (g->tab_cap - 1)];
    while (*pp != e) pp = &(*pp)->next;
    *pp = e->next;
    g->bytes -= centry_bytes(e->nkey, e->words);
    g->n_entries--;
}

static void cache_put(td_grammar *g, uint64_t h, const uint32_t *key, size_t nkey, const uint32_t *mask, int words) {
    size_t sz = centry_bytes(nkey, words);
    if (sz > g->cap_bytes / 4) return; /* would evict most of the cache */
    gr_centry *e = malloc(sz);
    if (!e) return;
    e->h = h, e->nkey = nkey, e->words = words, e->fifo = NULL;
    memcpy(e->data, key, nkey * 4);
    e->mask = e->data + nkey;
    memcpy(e->mask, mask, (size_t)words * 4);
    pthread_mutex_lock(&g->mu);
    if (g->n_entries + 1 > g->tab_cap * 2 || !g->tab_cap) { /* grow the table */
        size_t nc = g->tab_cap ? g->tab_cap * 2 : 256;
        gr_centry **nt = calloc(nc, sizeof *nt);
        if (!nt) goto fail;
        for (size_t i = 0; i < g->tab_cap; i++)
            for (gr_centry *x = g->tab[i], *nx; x; x = nx) {
                nx = x->next;
                x->next = nt[x->h & (nc - 1)];
                nt[x->h & (nc - 1)] = x;
            }
        free(g->tab);
        g->tab = nt, g->tab_cap = nc;
    }
    for (gr_centry *x = g->tab[h & (g->tab_cap - 1)]; x; x = x->next) /* another thread won the race */
        if (x->h == h && x->nkey == nkey && x->words == words && !memcmp(x->data, key, nkey * 4)) goto fail;
    while (g->fifo_head && g->bytes + sz > g->cap_bytes) { /* evict oldest */
        gr_centry *old = g->fifo_head;
        g->fifo_head = old->fifo;
        if (!g->fifo_head) g->fifo_tail = NULL;
        cache_unlink(g, old);
        free(old);
    }
    e->next = g->tab[h & (g->tab_cap - 1)];
    g->tab[h & (g->tab_cap - 1)] = e;
    if (g->fifo_tail) g->fifo_tail->fifo = e;
    else g->fifo_head = e;
    g->fifo_tail = e;
    g->bytes += sz, g->n_entries++;
    pthread_mutex_unlock(&g->mu);
    return;
fail:
    pthread_mutex_unlock(&g->mu);
    free(e);
}

const uint32_t *td_matcher_mask(td_matcher *m, const int32_t *spec, int n) {
    const td_grammar_vocab *v = m->v;
    if (n < 0 || n > 16 || (n && !spec)) return NULL;
    if (m->dead) { /* the start state was already over a bound: nothing is allowed */
        memset(m->mask, 0, (size_t)m->words * 4);
        return n ? NULL : m->mask;
    }
    bool fin = m->finished;
    sset *s = &m->cur;
    for (int i = 0; i < n; i++) {
        int32_t t = spec[i];
        if (fin || t < 0 || t >= v->n) return NULL;
        if (v->is_end[t]) {
            if (!ss_can_end(s)) return NULL;
            fin = true;
            continue;
        }
        if (!v->len[t]) return NULL;
        sset *res; /* advance_bytes ping-pongs a/b; pool[0] (unused by the DFS) keeps the result */
        if (!advance_bytes(m, s, v->blob + v->off[t], v->len[t], &res)) return NULL;
        if (!ss_copy(&m->pool[0], res)) return NULL;
        s = &m->pool[0];
    }
    if (fin) {
        memset(m->mask, 0, (size_t)m->words * 4);
        return m->mask;
    }
    TD_ASSERT(s->n > 0);
    if (!make_key(m, s)) return NULL;
    td_grammar *g = (td_grammar *)m->g; /* the cache is the grammar's one mutable part */
    uint64_t h = XXH3_64bits(m->key, m->nkey * 4);
    if (cache_get(g, h, m->key, m->nkey, m->mask, m->words)) return m->mask;
    compute_mask(m, s, m->mask);
    if (!make_key(m, s)) return m->mask; /* the DFS reused m->key: rebuild it (s is already sorted) */
    cache_put(g, h, m->key, m->nkey, m->mask, m->words);
    return m->mask;
}

void td_grammar_cache_stats(const td_grammar *g, uint64_t *hits, uint64_t *misses, size_t *entries) {
    td_grammar *gg = (td_grammar *)g;
    pthread_mutex_lock(&gg->mu);
    if (hits) *hits = g->hits;
    if (misses) *misses = g->misses;
    if (entries) *entries = g->n_entries;
    pthread_mutex_unlock(&gg->mu);
}

void td_grammar_free(td_grammar *g) {
    if (!g) return;
    for (size_t i = 0; i < g->tab_cap; i++)
        for (gr_centry *x = g->tab[i], *nx; x; x = nx) {
            nx = x->next;
            free(x);
        }
    free(g->tab);
    pthread_mutex_destroy(&g->mu);
    free(g->elems), free(g->rule_start), free(g->sets);
    free(g);
}

int td_matcher_clone(const td_matcher *m, td_matcher **out, td_err *err) {
    int rc = td_matcher_new(m->g, m->v, out, err);
    if (rc) return rc;
    if (!ss_copy(&(*out)->cur, &m->cur)) {
        td_matcher_free(*out);
        *out = NULL;
        return TD_FAIL(err, TD_ERR_NOMEM, "matcher clone: out of memory");
    }
    (*out)->finished = m->finished, (*out)->dead = m->dead;
    return 0;
}
