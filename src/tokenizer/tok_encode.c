/* Encoding: added-token extraction, normalization, pre-tokenization and
 * byte-level BPE. The vocab is keyed by raw bytes (the ByteLevel mapping is
 * a bijection), so pieces go to BPE without being re-encoded as the GPT-2
 * unicode alphabet. */
#include <string.h>
#include <utf8proc.h>
#include "tokenizer/tok_internal.h"
#include "util/err.h"

#define CACHE_MAX_WORD 256     /* longer pieces are not cached */
#define CACHE_MAX_ENTRIES 200000
#define SHORT_WORD 48          /* below this, the quadratic merge loop wins */

struct tok_encoder {
    const tokenizer *t;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
    int32_t *ids;              /* output of the current call */
    size_t n, cap;
    /* BPE scratch */
    int32_t *sym;
    uint32_t *rank, *prev, *next;
    uint64_t *heap;            /* (rank << 32 | pos) */
    size_t scap;
    /* prefix-space buffer for ByteLevel(add_prefix_space) */
    char *pbuf;
    size_t pcap;
    /* cache: word -> offset into cids (cids[off] = count, then ids) */
    tm_strmap cache;
    int32_t *cids;
    size_t cn, ccap;
};

static int push_id(tok_encoder *e, int32_t id) {
    if (e->n == e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 1024;
        int32_t *p = realloc(e->ids, nc * sizeof *p);
        if (!p) return -1;
        e->ids = p;
        e->cap = nc;
    }
    e->ids[e->n++] = id;
    return 0;
}

int td_tok_encoder_new(const tokenizer *t, tok_encoder **out, td_err *err) {
    tok_encoder *e = TD_CALLOC(err, 1, sizeof *e);
    if (!e) return TD_ERR_NOMEM;
    e->t = t;
    e->md = pcre2_match_data_create(4, NULL);
    e->mctx = pcre2_match_context_create(NULL);
    /* \s+(?!\S) backtracks through whole whitespace runs: give the JIT a
     * stack large enough for megabyte-long runs (mapped lazily). */
    e->js = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, NULL);
    if (!e->md || !e->mctx || !e->js || td_tm_str_init(&e->cache, 4096)) {
        td_tok_encoder_free(e);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory (encoder)");
    }
    pcre2_jit_stack_assign(e->mctx, NULL, e->js);
    *out = e;
    return 0;
}

void td_tok_encoder_free(tok_encoder *e) {
    if (!e) return;
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->js);
    free(e->ids); free(e->sym); free(e->rank); free(e->prev); free(e->next); free(e->heap);
    free(e->pbuf);
    td_tm_str_free(&e->cache);
    free(e->cids);
    free(e);
}

static int scratch(tok_encoder *e, size_t n) {
    if (n <= e->scap) return 0;
    size_t c = n < 256 ? 256 : n;
    free(e->sym); free(e->rank); free(e->prev); free(e->next); free(e->heap);
    e->sym = malloc(c * sizeof *e->sym);
    e->rank = malloc(c * sizeof *e->rank);
    e->prev = malloc(c * sizeof *e->prev);
    e->next = malloc(c * sizeof *e->next);
    e->heap = malloc(c * 2 * sizeof *e->heap);
    e->scap = (e->sym && e->rank && e->prev && e->next && e->heap) ? c : 0;
    return e->scap ? 0 : -1;
}

static inline uint32_t pair_rank(const tokenizer *t, int32_t a, int32_t b, int32_t *merged) {
    uint64_t v;
    if (!tm_u64_get(&t->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, &v)) return UINT32_MAX;
    *merged = (int32_t)(uint32_t)v;
    return (uint32_t)(v >> 32);
}

/* Quadratic merge loop for short words: merge the lowest-ranked pair
 * (leftmost on ties) until none applies, as tokenizers' Word::merge_all. */
static size_t merge_short(const tokenizer *t, int32_t *sym, uint32_t *rank, size_t m) {
    int32_t dummy;
    for (size_t i = 0; i + 1 < m; i++) rank[i] = pair_rank(t, sym[i], sym[i + 1], &dummy);
    while (m > 1) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) { best = rank[i]; bi = i; }
        if (best == UINT32_MAX) break;
        int32_t merged = -1;
        pair_rank(t, sym[bi], sym[bi + 1], &merged);
        sym[bi] = merged;
        memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof *sym);
        memmove(rank + bi + 1, rank + bi + 2, (m > bi + 3 ? m - bi - 3 : 0) * sizeof *rank);
        m--;
        if (bi > 0) rank[bi - 1] = pair_rank(t, sym[bi - 1], sym[bi], &dummy);
        if (bi + 1 < m) rank[bi] = pair_rank(t, sym[bi], sym[bi + 1], &dummy);
    }
    return m;
}

/* Binary heap of (rank << 32 | position): ties go to the leftmost pair. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i && h[(i - 1) / 2] > v) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = v;
}
static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* O(n log n) merging for long words (a megabyte of letters is one piece).
 * Entries are validated lazily: a popped pair applies only if both symbols
 * are still alive and still hold the ids it was computed from. */
static size_t merge_long(tok_encoder *e, size_t m) {
    const tokenizer *t = e->t;
    int32_t *sym = e->sym;
    uint32_t *prev = e->prev, *next = e->next, *pa = e->rank; /* pa: right id when queued */
    uint64_t *h = e->heap;
    size_t hn = 0;
    const uint32_t NONE = UINT32_MAX;
    for (size_t i = 0; i < m; i++) {
        prev[i] = i ? (uint32_t)(i - 1) : NONE;
        next[i] = i + 1 < m ? (uint32_t)(i + 1) : NONE;
    }
    int32_t merged = -1;
    for (size_t i = 0; i + 1 < m; i++) {
        uint32_t r = pair_rank(t, sym[i], sym[i + 1], &merged);
        if (r != UINT32_MAX) heap_push(h, &hn, ((uint64_t)r << 32) | i);
    }
    /* Lazy validation needs the pair's ids: recompute the rank and compare. */
    while (hn) {
        uint64_t top = heap_pop(h, &hn);
        uint32_t r = (uint32_t)(top >> 32), i = (uint32_t)top;
        if (sym[i] < 0 || next[i] == NONE) continue;
        uint32_t j = next[i];
        if (pair_rank(t, sym[i], sym[j], &merged) != r) continue;
        sym[i] = merged;
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] != NONE) prev[next[j]] = i;
        if (prev[i] != NONE) {
            uint32_t p = prev[i];
            uint32_t r2 = pair_rank(t, sym[p], sym[i], &merged);
            if (r2 != UINT32_MAX) heap_push(h, &hn, ((uint64_t)r2 << 32) | p);
        }
        if (next[i] != NONE) {
            uint32_t r2 = pair_rank(t, sym[i], sym[next[i]], &merged);
            if (r2 != UINT32_MAX) heap_push(h, &hn, ((uint64_t)r2 << 32) | i);
        }
    }
    (void)pa;
    size_t o = 0;
    for (size_t i = 0; i < m; i++)
        if (sym[i] >= 0) sym[o++] = sym[i];
    return o;
}

static int cache_put(tok_encoder *e, const uint8_t *s, size_t n, const int32_t *ids, size_t k) {
    if (e->cache.n >= CACHE_MAX_ENTRIES) { td_tm_str_clear(&e->cache); e->cn = 0; }
    if (e->cn + k + 1 > e->ccap) {
        size_t nc = e->ccap ? e->ccap * 2 : 65536;
        while (nc < e->cn + k + 1) nc *= 2;
        int32_t *p = realloc(e->cids, nc * sizeof *p);
        if (!p) return -1;
        e->cids = p;
        e->ccap = nc;
    }
    size_t off = e->cn;
    e->cids[off] = (int32_t)k;
    memcpy(e->cids + off + 1, ids, k * sizeof *ids);
    e->cn += k + 1;
    return td_tm_str_put(&e->cache, s, n, (int32_t)off);
}

static int bpe(tok_encoder *e, const uint8_t *s, size_t n) {
    const tokenizer *t = e->t;
    if (n == 0) return 0;
    if (n == 1) return t->byte_id[s[0]] >= 0 ? push_id(e, t->byte_id[s[0]]) : 0;
    int32_t off;
    if (n <= CACHE_MAX_WORD && td_tm_str_get(&e->cache, s, n, &off)) {
        int32_t k = e->cids[off];
        for (int32_t i = 0; i < k; i++)
            if (push_id(e, e->cids[off + 1 + i])) return -1;
        return 0;
    }
    int32_t whole;
    if (t->ignore_merges && td_tm_str_get(&t->bytes2id, s, n, &whole)) return push_id(e, whole);
    if (scratch(e, n)) return -1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) e->sym[m++] = t->byte_id[s[i]];
    m = m < SHORT_WORD ? merge_short(t, e->sym, e->rank, m) : merge_long(e, m);
    if (n <= CACHE_MAX_WORD && cache_put(e, s, n, e->sym, m)) return -1;
    for (size_t i = 0; i < m; i++)
        if (push_id(e, e->sym[i])) return -1;
    return 0;
}

/* The end of the code point that starts at byte a of s (n bytes): where to
 * go on after an empty match. The next pcre2_match starts there with
 * PCRE2_NO_UTF_CHECK, so it must never be inside a code point (one byte
 * on crashed the JIT). */
static size_t next_code_point(const char *s, size_t a, size_t n) {
    size_t b = a + 1;
    while (b < n && ((uint8_t)s[b] & 0xC0) == 0x80) b++;
    return b;
}

/* Splits s by re (Isolated behaviour) and BPEs each piece. */
static int split_bpe(tok_encoder *e, pcre2_code *re, const char *s, size_t n) {
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -2;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t a = ov[0], b = ov[1];
        if (a > pos && bpe(e, (const uint8_t *)s + pos, a - pos)) return -1;
        if (b > a && bpe(e, (const uint8_t *)s + a, b - a)) return -1;
        if (b == a) { /* empty match: step one code point */
            b = next_code_point(s, a, n);
            if (bpe(e, (const uint8_t *)s + a, b - a)) return -1;
        }
        pos = b;
    }
    if (pos < n && bpe(e, (const uint8_t *)s + pos, n - pos)) return -1;
    return 0;
}

static int pretok(tok_encoder *e, int step, const char *s, size_t n);

static int emit_piece(tok_encoder *e, int step, const char *s, size_t n) {
    return n ? pretok(e, step + 1, s, n) : 0;
}

static int pretok(tok_encoder *e, int step, const char *s, size_t n) {
    const tok_pt_step *p = &e->t->pt[step];
    if (p->kind == PT_BYTELEVEL) {
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
            if (n + 1 > e->pcap) {
                char *b = realloc(e->pbuf, n + 1);
                if (!b) return -1;
                e->pbuf = b;
                e->pcap = n + 1;
            }
            e->pbuf[0] = ' ';
            memcpy(e->pbuf + 1, s, n);
            s = e->pbuf;
            n++;
        }
        return p->re ? split_bpe(e, p->re, s, n) : bpe(e, (const uint8_t *)s, n);
    }
    if (p->behavior == SPLIT_ISOLATED && step + 1 == e->t->n_pt - 1 && !e->t->pt[step + 1].re &&
        !e->t->pt[step + 1].add_prefix_space)
        return split_bpe(e, p->re, s, n); /* the Qwen fast path */
    /* General case. Match data is reused by the recursion, so collect the
     * match boundaries first. */
    size_t cap = 64, nb = 0, pos = 0;
    size_t *bd = malloc(cap * sizeof *bd);
    if (!bd) return -1;
    while (pos < n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { free(bd); return -2; }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        if (nb + 2 > cap) {
            size_t *nbd = realloc(bd, (cap *= 2) * sizeof *bd);
            if (!nbd) { free(bd); return -1; }
            bd = nbd;
        }
        size_t b = ov[1] > ov[0] ? ov[1] : next_code_point(s, ov[0], n); /* empty match: one code point on */
        bd[nb++] = ov[0];
        bd[nb++] = b;
        pos = b;
    }
    int rc = 0;
    size_t last = 0;
    for (size_t i = 0; i < nb && !rc; i += 2) {
        size_t a = bd[i], b = bd[i + 1] > n ? n : bd[i + 1];
        switch (p->behavior) {
        case SPLIT_ISOLATED:
            rc = emit_piece(e, step, s + last, a - last);
            if (!rc) rc = emit_piece(e, step, s + a, b - a);
            last = b;
            break;
        case SPLIT_REMOVED:
            rc = emit_piece(e, step, s + last, a - last);
            last = b;
            break;
        case SPLIT_MERGED_PREV:
            rc = emit_piece(e, step, s + last, b - last);
            last = b;
            break;
        case SPLIT_MERGED_NEXT:
            rc = emit_piece(e, step, s + last, a - last);
            last = a;
            break;
        }
    }
    if (!rc) rc = emit_piece(e, step, s + last, n - last);
    free(bd);
    return rc;
}

/* NFC is a no-op on code points below U+0300 and on some large blocks of
 * starters that never compose (CJK ideographs, kana, Hangul syllables);
 * skipping utf8proc for such text keeps English/code/CJK fast. */
static bool nfc_trivial(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0xCC) { i += u[i] < 0x80 ? 1 : 2; continue; }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(u + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return false;
        if (!((cp >= 0x3040 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
              (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3)))
            return false;
        i += (size_t)k;
    }
    return true;
}

char *td_tok_normalize(const tokenizer *t, const char *s, size_t n, size_t *out_len, bool *same) {
    *same = true;
    char *cur = NULL;
    size_t cl = n;
    for (int i = 0; i < t->n_norm; i++) {
        const char *in = cur ? cur : s;
        bool ascii = true;
        for (size_t j = 0; j < cl && ascii; j++) ascii = (uint8_t)in[j] < 0x80;
        if (ascii) continue;
        if (t->norm[i] == NORM_NFC && nfc_trivial(in, cl)) continue;
        int opt = UTF8PROC_STABLE;
        switch (t->norm[i]) {
        case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        case NORM_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *o = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)cl, &o, opt);
        if (r < 0) { free(cur); *same = false; return NULL; }
        free(cur);
        cur = (char *)o;
        cl = (size_t)r;
        *same = false;
    }
    *out_len = cl;
    return cur;
}

/* Finds the next added token in s[from..n) among those whose `normalized`
 * flag equals norm: leftmost start, longest at that start (aho-corasick
 * LeftmostLongest). Returns its index or -1. */
static int find_added(const tokenizer *t, bool norm, const char *s, size_t n, size_t from, size_t *start) {
    const bool *first = norm ? t->first_norm : t->first_raw;
    for (size_t i = from; i < n; i++) {
        if (!first[(uint8_t)s[i]]) continue;
        int best = -1;
        size_t bl = 0;
        for (int a = 0; a < t->n_added; a++) {
            const tok_added *ad = &t->added[a];
            if (ad->normalized != norm || ad->match_len <= bl || ad->match_len > n - i) continue;
            if (memcmp(s + i, ad->match, ad->match_len) == 0) { best = a; bl = ad->match_len; }
        }
        if (best >= 0) { *start = i; return best; }
    }
    return -1;
}

/* \w / \s at a boundary, for single_word / lstrip / rstrip. */
static bool is_word_cp(utf8proc_int32_t c) {
    if (c == '_') return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_ND ||
           (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_PC ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
static bool is_space_cp(utf8proc_int32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
static size_t cp_before(const char *s, size_t i, utf8proc_int32_t *c) {
    size_t j = i - 1;
    while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80) j--;
    utf8proc_iterate((const utf8proc_uint8_t *)s + j, (utf8proc_ssize_t)(i - j), c);
    return j;
}

typedef int (*seg_fn)(tok_encoder *e, const char *s, size_t n);

/* Splits s on added tokens (of one `normalized` kind), emitting their ids
 * and passing the text between them to fn. Mirrors find_matches in
 * tokenizers' added_vocabulary.rs. */
static int split_added(tok_encoder *e, bool norm, const char *s, size_t n, seg_fn fn) {
    const tokenizer *t = e->t;
    size_t last = 0, from = 0, start;
    int a;
    while ((a = find_added(t, norm, s, n, from, &start)) >= 0) {
        const tok_added *ad = &t->added[a];
        size_t stop = start + ad->match_len;
        from = stop;
        utf8proc_int32_t c;
        if (ad->single_word) {
            bool l_ok = start == 0 || (cp_before(s, start, &c), !is_word_cp(c));
            bool r_ok = stop == n || (utf8proc_iterate((const utf8proc_uint8_t *)s + stop,
                                                        (utf8proc_ssize_t)(n - stop), &c) > 0 && !is_word_cp(c));
            if (!l_ok || !r_ok) continue;
        }
        if (ad->lstrip)
            while (start > last) {
                size_t j = cp_before(s, start, &c);
                if (!is_space_cp(c)) break;
                start = j;
            }
        if (ad->rstrip)
            while (stop < n) {
                utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + stop, (utf8proc_ssize_t)(n - stop), &c);
                if (k <= 0 || !is_space_cp(c)) break;
                stop += (size_t)k;
            }
        if (start > last) {
            int rc = fn(e, s + last, start - last);
            if (rc) return rc;
        }
        if (push_id(e, ad->id)) return -1;
        last = stop;
        if (from < stop) from = stop;
    }
    return n > last ? fn(e, s + last, n - last) : 0;
}

static int seg_pretok(tok_encoder *e, const char *s, size_t n) { return pretok(e, 0, s, n); }

static int seg_normalize(tok_encoder *e, const char *s, size_t n) {
    const tokenizer *t = e->t;
    bool same;
    size_t nl;
    char *nz = t->n_norm ? td_tok_normalize(t, s, n, &nl, &same) : NULL;
    if (t->n_norm && !same && !nz) return -1;
    const char *x = nz ? nz : s;
    size_t xl = nz ? nl : n;
    int rc = t->any_norm_added ? split_added(e, true, x, xl, seg_pretok) : pretok(e, 0, x, xl);
    free(nz);
    return rc;
}

int td_tok_encoder_encode(tok_encoder *e, const char *text, size_t len, bool add_special, int32_t **ids,
                       size_t *n_ids, td_err *err) {
    const tokenizer *t = e->t;
    *ids = NULL;
    *n_ids = 0;
    e->n = 0;
    char *clean = NULL;
    const uint8_t *u = (const uint8_t *)text;
    for (size_t i = 0; i < len;) { /* validate; sanitize only if needed */
        if (u[i] < 0x80) { i++; continue; }
        int bad, k = td_tok_utf8_seq(u + i, len - i, &bad);
        if (!k) {
            clean = td_tok_utf8_sanitize(text, len, &len);
            if (!clean) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
            text = clean;
            break;
        }
        i += (size_t)k;
    }
    int rc = 0;
    if (add_special)
        for (int i = 0; i < t->n_post_pre && !rc; i++) rc = push_id(e, t->post_pre[i]);
    if (!rc) rc = split_added(e, false, text, len, seg_normalize);
    if (add_special)
        for (int i = 0; i < t->n_post_post && !rc; i++) rc = push_id(e, t->post_post[i]);
    free(clean);
    if (rc == -2) return TD_FAIL(err, TD_ERR_INTERNAL, "pre-tokenizer regex failed (match limit)");
    if (rc) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory while encoding");
    *ids = TD_MALLOC(err, (e->n ? e->n : 1) * sizeof **ids);
    if (!*ids) return TD_ERR_NOMEM;
    if (e->n) memcpy(*ids, e->ids, e->n * sizeof **ids); /* e->ids is NULL for an empty text */
    *n_ids = e->n;
    return 0;
}

int td_tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
               size_t *n_ids, td_err *err) {
    tokenizer *mt = (tokenizer *)t; /* only the mutex-guarded encoder slot changes */
    if (pthread_mutex_trylock(&mt->mu) == 0) {
        int rc = 0;
        if (!mt->enc) rc = td_tok_encoder_new(t, &mt->enc, err);
        if (!rc) rc = td_tok_encoder_encode(mt->enc, text, len, add_special, ids, n_ids, err);
        pthread_mutex_unlock(&mt->mu);
        return rc;
    }
    tok_encoder *e;
    int rc = td_tok_encoder_new(t, &e, err);
    if (rc) return rc;
    rc = td_tok_encoder_encode(e, text, len, add_special, ids, n_ids, err);
    td_tok_encoder_free(e);
    return rc;
}
