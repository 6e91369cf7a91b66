/* UTF-8 validation with the Unicode "maximal subpart" replacement rule:
 * each maximal prefix of a would-be valid sequence becomes one U+FFFD.
 * Python's bytes.decode('utf-8', 'replace') and Rust's
 * String::from_utf8_lossy follow the same rule, so invalid input to
 * td_tok_encode behaves as the reference does on the decoded Python str. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"

int td_tok_utf8_seq(const uint8_t *s, size_t n, int *maximal_invalid) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else { *maximal_invalid = 1; return 0; }
    int i = 1;
    for (; i <= need; i++) {
        if ((size_t)i >= n) break;
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    }
    if (i == need + 1) return need + 1;
    *maximal_invalid = i;
    return 0;
}

char *td_tok_utf8_sanitize(const char *src, size_t n, size_t *out_len) {
    const uint8_t *s = (const uint8_t *)src;
    /* worst case: every byte becomes 3 bytes of U+FFFD */
    char *out = malloc(n * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) { out[o++] = (char)s[i++]; continue; }
        int bad = 0, k = td_tok_utf8_seq(s + i, n - i, &bad);
        if (k) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)bad;
        }
    }
    out[o] = 0;
    if (out_len) *out_len = o;
    return out;
}
