/* Decoding: ids -> bytes (ByteLevel decoder, precomputed per id at load)
 * -> UTF-8 with invalid sequences replaced by U+FFFD, like tokenizers'
 * String::from_utf8_lossy. The streaming detokenizer holds back only an
 * incomplete sequence that later bytes could still complete, so its output
 * concatenates to exactly what td_tok_decode returns. */
#include <string.h>
#include "tokenizer/tok_internal.h"
#include "util/err.h"

const uint8_t *td_tok_id_bytes(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->id_str[id]) return NULL;
    *len = t->dec_len[id];
    return t->dec_bytes + t->dec_off[id];
}

int td_tok_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out,
               size_t *len, td_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        if (td_tok_id_bytes(t, ids[i], &l) && !(skip_special && t->is_special[ids[i]])) total += l;
    }
    char *raw = TD_MALLOC(err, total + 1);
    if (!raw) return TD_ERR_NOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *b = td_tok_id_bytes(t, ids[i], &l);
        if (!b || (skip_special && t->is_special[ids[i]])) continue;
        memcpy(raw + o, b, l);
        o += l;
    }
    char *clean = td_tok_utf8_sanitize(raw, o, len);
    free(raw);
    if (!clean) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    *out = clean;
    return 0;
}

void td_tok_stream_init(tok_stream *s, const tokenizer *t, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->skip_special = skip_special;
}

void td_tok_stream_free(tok_stream *s) {
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}

static int reserve(tok_stream *s, size_t n, td_err *err) {
    if (n <= s->cap) return 0;
    size_t c = s->cap ? s->cap : 64;
    while (c < n) c *= 2;
    char *b = realloc(s->buf, c);
    if (!b) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    s->buf = b;
    s->cap = c;
    return 0;
}

/* Appends bytes b[0..n) after the pending ones; emits what is decided. */
static int stream_bytes(tok_stream *s, const uint8_t *b, size_t n, bool final, size_t *olen, td_err *err) {
    size_t tot = (size_t)s->npend + n;
    /* each input byte yields at most 3 output bytes */
    if (reserve(s, tot * 3 + 1, err)) return TD_ERR_NOMEM;
    uint8_t small[4 + 64];
    uint8_t *in = small;
    bool heap = false;
    if (tot > sizeof small) {
        in = malloc(tot);
        if (!in) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        heap = true;
    }
    memcpy(in, s->pend, (size_t)s->npend);
    memcpy(in + s->npend, b, n);
    size_t o = 0, i = 0;
    s->npend = 0;
    while (i < tot) {
        if (in[i] < 0x80) { s->buf[o++] = (char)in[i++]; continue; }
        int bad = 0, k = td_tok_utf8_seq(in + i, tot - i, &bad);
        if (k) {
            memcpy(s->buf + o, in + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else if (!final && i + (size_t)bad == tot) {
            /* a valid prefix cut by the end of input: wait for more */
            memcpy(s->pend, in + i, (size_t)bad);
            s->npend = bad;
            break;
        } else {
            memcpy(s->buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)bad;
        }
    }
    s->buf[o] = 0;
    *olen = o;
    if (heap) free(in);
    return 0;
}

int td_tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len, td_err *err) {
    size_t l = 0;
    const uint8_t *b = td_tok_id_bytes(s->tok, id, &l);
    if (!b || (s->skip_special && s->tok->is_special[id])) l = 0;
    int rc = stream_bytes(s, b ? b : (const uint8_t *)"", l, false, len, err);
    if (rc) return rc;
    *text = s->buf;
    return 0;
}

int td_tok_stream_flush(tok_stream *s, const char **text, size_t *len, td_err *err) {
    int rc = stream_bytes(s, (const uint8_t *)"", 0, true, len, err);
    if (rc) return rc;
    *text = s->buf;
    return 0;
}
