/* Error reporting for library code: functions return 0 on success or a
 * negative td_status, and fill a caller-owned td_err with "file:line: message".
 * Only broken internal invariants abort (TD_ASSERT). */
#ifndef TANDEM_UTIL_ERR_H
#define TANDEM_UTIL_ERR_H
#include <stdio.h>
#include <stdlib.h>
#include "tandem.h"

/* td_err (message buffer) and td_status codes are declared in tandem.h. */

/* Formats "src/x.c:123: <message>" into e (if not NULL); returns code. */
int td_err_set(td_err *e, int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The message without its leading "src/x.c:123: " locations (what a user
 * should read); e->msg keeps them for a verbose report. */
const char *td_err_text(const td_err *e);

#define TD_FAIL(e, code, ...) td_err_set((e), (code), __FILE__, __LINE__, __VA_ARGS__)

#define TD_ASSERT(cond)                                                              \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: internal invariant broken: %s\n", __FILE__,      \
                    __LINE__, #cond);                                                \
            abort();                                                                 \
        }                                                                            \
    } while (0)

/* Checked allocation helpers: NULL on failure with e filled. */
void *td_malloc(td_err *e, size_t n, const char *file, int line);
void *td_calloc(td_err *e, size_t count, size_t size, const char *file, int line);
#define TD_MALLOC(e, n) td_malloc((e), (n), __FILE__, __LINE__)
#define TD_CALLOC(e, c, s) td_calloc((e), (c), (s), __FILE__, __LINE__)

#endif
