/* Lexer: template text -> DATA tokens (with trim_blocks, lstrip_blocks,
 * whitespace control and newline normalisation already applied, as Jinja's
 * lexer does) and expression tokens inside {{ }} and {% %}. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "template/jinja.h"
#include "util/err.h"

typedef struct {
    jarena *a;
    const char *src;
    size_t len, pos;
    jtok *t;
    size_t n, cap;
    td_err *err;
    jmp_buf *jb;
    size_t lc_off;      /* line/column known at this offset (tokens come in order) */
    int lc_line, lc_col;
} lexer;

/* Line and column (in code points) of offset off. Tokens are pushed in
 * source order, so this walks forward from the previous answer: linear in
 * the template, not quadratic. An earlier offset (only an error's) starts
 * over from the top. */
static void pos_of(lexer *L, size_t off, int *line, int *col) {
    if (off > L->len) off = L->len;
    if (off < L->lc_off) { L->lc_off = 0; L->lc_line = 1; L->lc_col = 1; }
    int l = L->lc_line, c = L->lc_col;
    for (size_t i = L->lc_off; i < off; i++) {
        if (L->src[i] == '\n') { l++; c = 1; }
        else if (((unsigned char)L->src[i] & 0xC0) != 0x80) c++;
    }
    L->lc_off = off;
    L->lc_line = l;
    L->lc_col = c;
    *line = l;
    *col = c;
}

static _Noreturn void lfail(lexer *L, size_t off, const char *what) {
    int line, col;
    pos_of(L, off, &line, &col);
    TD_FAIL(L->err, TD_ERR_FORMAT, "template line %d column %d: %s", line, col, what);
    longjmp(*L->jb, 1);
}

static jtok *push(lexer *L, jtk type, const char *s, size_t n, size_t off) {
    if (L->n == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        jtok *nt = td_ja_alloc(L->a, nc * sizeof *nt);
        if (L->n) memcpy(nt, L->t, L->n * sizeof *nt);
        L->t = nt;
        L->cap = nc;
    }
    jtok *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    t->t = type;
    t->s = s;
    t->n = n;
    pos_of(L, off, &t->line, &t->col);
    return t;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Newlines in data become \n (Jinja's newline_sequence). */
static void push_data(lexer *L, const char *s, size_t n, size_t off) {
    if (!n) return;
    char *d = td_ja_alloc(L->a, n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r') {
            d[o++] = '\n';
            if (i + 1 < n && s[i + 1] == '\n') i++;
        } else {
            d[o++] = s[i];
        }
    }
    d[o] = 0;
    push(L, TK_DATA, d, o, off);
}

static size_t find_tag(const lexer *L, size_t from) {
    for (size_t i = from; i + 1 < L->len; i++)
        if (L->src[i] == '{' && (L->src[i + 1] == '{' || L->src[i + 1] == '%' || L->src[i + 1] == '#')) return i;
    return L->len;
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void put_utf8(char *d, size_t *o, uint32_t cp) {
    if (cp < 0x80) d[(*o)++] = (char)cp;
    else if (cp < 0x800) { d[(*o)++] = (char)(0xC0 | cp >> 6); d[(*o)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        d[(*o)++] = (char)(0xE0 | cp >> 12); d[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        d[(*o)++] = (char)(0xF0 | cp >> 18); d[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        d[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* String literal with Python's unicode-escape rules. */
static size_t lex_string(lexer *L, size_t i) {
    char q = L->src[i];
    size_t start = i++;
    /* the decoded text is never longer than the literal: size it by the
     * literal, not by the rest of the template (quadratic memory) */
    size_t end = i;
    while (end < L->len && L->src[end] != q) end += L->src[end] == '\\' ? 2 : 1;
    if (end > L->len) end = L->len;
    char *d = td_ja_alloc(L->a, end - i + 1);
    size_t o = 0;
    while (i < L->len && L->src[i] != q) {
        char c = L->src[i];
        if (c == '\r') { d[o++] = '\n'; if (i + 1 < L->len && L->src[i + 1] == '\n') i++; i++; continue; }
        if (c != '\\') { d[o++] = c; i++; continue; }
        if (i + 1 >= L->len) break;
        char e = L->src[i + 1];
        i += 2;
        switch (e) {
        case 'n': d[o++] = '\n'; break;
        case 't': d[o++] = '\t'; break;
        case 'r': d[o++] = '\r'; break;
        case 'b': d[o++] = '\b'; break;
        case 'f': d[o++] = '\f'; break;
        case 'v': d[o++] = '\v'; break;
        case 'a': d[o++] = '\a'; break;
        case '\\': d[o++] = '\\'; break;
        case '\'': d[o++] = '\''; break;
        case '"': d[o++] = '"'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = i < L->len ? hexv(L->src[i]) : -1;
                if (h < 0) lfail(L, i, "bad escape in string literal");
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) lfail(L, i, "unsupported code point escape");
            put_utf8(d, &o, cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < L->len && L->src[i] >= '0' && L->src[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(L->src[i++] - '0');
                put_utf8(d, &o, cp);
            } else { /* unknown escapes are kept verbatim, as Python does */
                d[o++] = '\\';
                i--;
            }
        }
    }
    if (i >= L->len) lfail(L, start, "unterminated string literal");
    d[o] = 0;
    push(L, TK_STRING, d, o, start);
    return i + 1;
}

static const char *OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                            "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", NULL};

/* Lexes expression tokens from i until the closing delimiter ("}}" or
 * "%}", optionally preceded by '-' or '+'). Returns the offset just after
 * it; *strip tells whether it was "-}}" / "-%}". */
static size_t lex_expr(lexer *L, size_t i, char close, bool *strip) {
    int depth = 0;
    for (;;) {
        while (i < L->len && is_ws(L->src[i])) i++;
        if (i >= L->len) lfail(L, i, close == '%' ? "unclosed block tag" : "unclosed variable tag");
        const char *s = L->src + i;
        size_t rest = L->len - i;
        if (depth == 0) {
            if ((s[0] == '-' || s[0] == '+') && rest >= 3 && s[1] == close && s[2] == '}') {
                *strip = s[0] == '-';
                return i + 3;
            }
            if (rest >= 2 && s[0] == close && s[1] == '}') { *strip = false; return i + 2; }
        }
        char c = s[0];
        if (c == '\'' || c == '"') { i = lex_string(L, i); continue; }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = i;
            while (j < L->len && ((L->src[j] >= 'a' && L->src[j] <= 'z') || (L->src[j] >= 'A' && L->src[j] <= 'Z') ||
                                  (L->src[j] >= '0' && L->src[j] <= '9') || L->src[j] == '_'))
                j++;
            push(L, TK_NAME, s, j - i, i);
            i = j;
            continue;
        }
        if (c >= '0' && c <= '9') {
            /* extent first, then the digits (without '_') into a buffer
             * of that size: any length is safe */
            size_t j = i;
            bool is_float = false;
            while (j < L->len && ((L->src[j] >= '0' && L->src[j] <= '9') || L->src[j] == '_')) j++;
            if (j + 1 < L->len && L->src[j] == '.' && L->src[j + 1] >= '0' && L->src[j + 1] <= '9') {
                is_float = true;
                j++;
                while (j < L->len && ((L->src[j] >= '0' && L->src[j] <= '9') || L->src[j] == '_')) j++;
            }
            if (j < L->len && (L->src[j] == 'e' || L->src[j] == 'E')) {
                size_t k = j + 1;
                if (k < L->len && (L->src[k] == '+' || L->src[k] == '-')) k++;
                if (k < L->len && L->src[k] >= '0' && L->src[k] <= '9') {
                    is_float = true;
                    j = k;
                    while (j < L->len && L->src[j] >= '0' && L->src[j] <= '9') j++;
                }
            }
            char *buf = td_ja_alloc(L->a, j - i + 1);
            size_t bn = 0;
            for (size_t k = i; k < j; k++)
                if (L->src[k] != '_') buf[bn++] = L->src[k];
            buf[bn] = 0;
            jtok *t = push(L, is_float ? TK_FLOAT : TK_INT, s, j - i, i);
            if (is_float) {
                t->f = strtod(buf, NULL); /* too large is inf, as in Python */
            } else {
                errno = 0;
                t->i = strtoll(buf, NULL, 10);
                if (errno == ERANGE) lfail(L, i, "integer literal out of range (64-bit integers)");
            }
            i = j;
            continue;
        }
        const char *op = NULL;
        for (int k = 0; OPS[k]; k++) {
            size_t ol = strlen(OPS[k]);
            if (rest >= ol && memcmp(s, OPS[k], ol) == 0) { op = OPS[k]; break; }
        }
        if (!op) lfail(L, i, "unexpected character in expression");
        if (*op == '(' || *op == '[' || *op == '{') depth++;
        if ((*op == ')' || *op == ']' || *op == '}') && depth > 0) depth--;
        push(L, TK_OP, op, strlen(op), i);
        i += strlen(op);
    }
}

/* Is the block at i (just after "{%" and its sign) `raw`? Returns the
 * offset after its closing "%}" or 0. */
static size_t raw_tag(const lexer *L, size_t i, const char *word, bool *strip_after) {
    while (i < L->len && is_ws(L->src[i])) i++;
    size_t wl = strlen(word);
    if (L->len - i < wl || memcmp(L->src + i, word, wl)) return 0;
    i += wl;
    while (i < L->len && is_ws(L->src[i])) i++;
    if (i + 2 < L->len && (L->src[i] == '-' || L->src[i] == '+') && L->src[i + 1] == '%' && L->src[i + 2] == '}') {
        *strip_after = L->src[i] == '-';
        return i + 3;
    }
    if (i + 1 < L->len && L->src[i] == '%' && L->src[i + 1] == '}') { *strip_after = false; return i + 2; }
    return 0;
}

int td_jinja_lex(jarena *a, const char *src0, size_t len0, jtok **toks, size_t *nt, td_err *err) {
    jmp_buf jb;
    /* Like Jinja: every \r\n or \r becomes \n before lexing, and one
     * trailing newline is dropped (keep_trailing_newline=False). */
    char *norm = td_ja_alloc(a, len0 + 1);
    size_t len = 0;
    for (size_t i = 0; i < len0; i++) {
        if (src0[i] == '\r') {
            norm[len++] = '\n';
            if (i + 1 < len0 && src0[i + 1] == '\n') i++;
        } else {
            norm[len++] = src0[i];
        }
    }
    if (len && norm[len - 1] == '\n') len--;
    norm[len] = 0;
    const char *src = norm;
    lexer L = {.a = a, .src = src, .len = len, .err = err, .jb = &jb, .lc_line = 1, .lc_col = 1};
    if (setjmp(jb)) return err ? err->code : TD_ERR_FORMAT;
    size_t pos = 0;
    bool lstrip_next = false, line_starting = true;
    while (pos <= len) {
        size_t tag = find_tag(&L, pos);
        const char *text = src + pos;
        size_t tn = tag - pos;
        if (lstrip_next) {
            while (tn && is_ws(*text)) { text++; tn--; }
            lstrip_next = false;
        }
        if (tag >= len) {
            push_data(&L, text, tn, (size_t)(text - src));
            break;
        }
        char kind = src[tag + 1];
        char sign = tag + 2 < len ? src[tag + 2] : 0;
        if (sign == '-') {
            while (tn && is_ws(text[tn - 1])) tn--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t l = tn;
            while (l && text[l - 1] != '\n') l--;
            if (l > 0 || line_starting) {
                bool only_ws = tn > l;
                for (size_t k = l; k < tn; k++) only_ws &= is_ws(text[k]);
                if (only_ws) tn = l;
            }
        }
        push_data(&L, text, tn, (size_t)(text - src));
        size_t inner = tag + 2 + (sign == '-' || sign == '+');
        size_t end;
        bool strip = false;
        if (kind == '#') {
            size_t j = inner;
            while (j + 1 < len && !(src[j] == '#' && src[j + 1] == '}')) j++;
            if (j + 1 >= len) lfail(&L, tag, "unclosed comment");
            strip = j > inner && src[j - 1] == '-';
            end = j + 2;
        } else if (kind == '%' && (end = raw_tag(&L, inner, "raw", &strip))) {
            /* raw: copy verbatim up to {% endraw %} */
            size_t j = end, close = 0, body_end = 0;
            bool strip2 = false;
            for (; j + 1 < len; j++) {
                if (src[j] == '{' && src[j + 1] == '%') {
                    size_t in2 = j + 2 + (j + 2 < len && (src[j + 2] == '-' || src[j + 2] == '+'));
                    if ((close = raw_tag(&L, in2, "endraw", &strip2))) { body_end = j; break; }
                }
            }
            if (!close) lfail(&L, tag, "unclosed raw block");
            const char *b = src + end;
            size_t bn = body_end - end;
            if (strip) while (bn && is_ws(*b)) { b++; bn--; }
            if (src[body_end + 2] == '-') while (bn && is_ws(b[bn - 1])) bn--;
            push_data(&L, b, bn, end);
            end = close;
            strip = strip2;
        } else {
            push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, src + tag, 2, tag);
            end = lex_expr(&L, inner, kind == '{' ? '}' : '%', &strip);
            push(&L, kind == '{' ? TK_VAR_END : TK_BLOCK_END, src + end - 2, 2, end - 2);
        }
        line_starting = false;
        if (strip) {
            lstrip_next = true;
        } else if (kind != '{' && end < len && src[end] == '\n') { /* trim_blocks */
            end++;
            line_starting = true;
        }
        pos = end;
    }
    push(&L, TK_EOF, "", 0, len);
    *toks = L.t;
    *nt = L.n;
    return 0;
}
