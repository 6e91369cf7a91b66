#include "server/sbuf.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int td_sb_reserve(sbuf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int td_sb_add(sbuf *b, const char *s, size_t n) {
    if (td_sb_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int td_sb_adds(sbuf *b, const char *s) { return td_sb_add(b, s, strlen(s)); }

int td_sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || td_sb_reserve(b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int td_sb_json_str(sbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (td_sb_reserve(b, n + 2)) return -1;
    if (td_sb_add(b, "\"", 1)) return -1;
    size_t run = 0; /* bytes copied verbatim in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0', u[4] = hex[c >> 4], u[5] = hex[c & 15], u[6] = 0;
            esc = u;
        }
        if (!esc) continue;
        if (td_sb_add(b, s + run, i - run) || td_sb_adds(b, esc)) return -1;
        run = i + 1;
    }
    if (td_sb_add(b, s + run, n - run)) return -1;
    return td_sb_add(b, "\"", 1);
}

void td_sb_consume(sbuf *b, size_t n) {
    if (n >= b->len) { td_sb_clear(b); return; }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = 0;
}

void td_sb_clear(sbuf *b) {
    b->len = 0;
    if (b->p) b->p[0] = 0;
}

void td_sb_free(sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

char *td_sb_take(sbuf *b) {
    if (!b->p && td_sb_reserve(b, 0)) return NULL;
    if (!b->p) return NULL;
    b->p[b->len] = 0;
    char *p = b->p;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

size_t td_sb_partial_suffix(const char *s, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    size_t k = tl ? tl - 1 : 0;
    if (k > n) k = n;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}
