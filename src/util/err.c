#include "util/err.h"
#include <stdarg.h>
#include <string.h>

int td_err_set(td_err *e, int code, const char *file, int line, const char *fmt, ...) {
    if (e) {
        int n = snprintf(e->msg, sizeof e->msg, "%s:%d: ", file, line);
        if (n < 0 || (size_t)n >= sizeof e->msg) n = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg + n, sizeof e->msg - (size_t)n, fmt, ap);
        va_end(ap);
        /* One line, always: names and values from untrusted files may hold
         * newlines or other control bytes. */
        for (char *p = e->msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
        e->code = code;
    }
    return code;
}

/* Whether s[0..i) ends in a source suffix: .c, .h, or CUDA's .cu, .cuh. */
static int source_suffix(const char *s, size_t i) {
    static const char *const suf[] = {".c", ".h", ".cu", ".cuh"};
    for (size_t k = 0; k < sizeof suf / sizeof *suf; k++) {
        size_t n = strlen(suf[k]);
        if (i > n && memcmp(s + i - n, suf[k], n) == 0) return 1;
    }
    return 0;
}

/* Length of a "path.c:123: " prefix at s (a source file name, no spaces), else 0. */
static size_t location_len(const char *s) {
    size_t i = 0;
    while (s[i] && s[i] != ':' && s[i] != ' ') i++;
    if (i < 3 || s[i] != ':' || !source_suffix(s, i)) return 0;
    size_t j = i + 1;
    while (s[j] >= '0' && s[j] <= '9') j++;
    if (j == i + 1 || s[j] != ':' || s[j + 1] != ' ') return 0;
    return j + 2;
}

const char *td_err_text(const td_err *e) {
    if (!e) return "";
    const char *m = e->msg;
    for (size_t n; (n = location_len(m)) > 0;) m += n;
    return m;
}

void *td_malloc(td_err *e, size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) td_err_set(e, TD_ERR_NOMEM, file, line, "out of memory allocating %zu bytes", n);
    return p;
}

void *td_calloc(td_err *e, size_t count, size_t size, const char *file, int line) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) td_err_set(e, TD_ERR_NOMEM, file, line, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}
