/* Growable byte buffer used by the server (always NUL-terminated). */
#ifndef TANDEM_SERVER_SBUF_H
#define TANDEM_SERVER_SBUF_H
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct sbuf {
    char *p;      /* NULL until the first append */
    size_t len, cap;
} sbuf;

/* Each returns 0, or -1 when out of memory (the buffer is left as it was). */
int td_sb_reserve(sbuf *b, size_t extra);
int td_sb_add(sbuf *b, const char *s, size_t n);
int td_sb_adds(sbuf *b, const char *s);
int td_sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s (n bytes) as a JSON string literal, quotes included. */
int td_sb_json_str(sbuf *b, const char *s, size_t n);
/* Drops the first n bytes. */
void td_sb_consume(sbuf *b, size_t n);
void td_sb_clear(sbuf *b);
void td_sb_free(sbuf *b);
/* Hands the buffer over (caller frees); the sbuf is empty afterwards.
 * Never NULL unless out of memory. */
char *td_sb_take(sbuf *b);
/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
size_t td_sb_partial_suffix(const char *s, size_t n, const char *tag);
#endif
