/* Minimal test harness: CHECK(cond, fmt...) counts passes and failures;
 * TEST_MAIN_END prints "name: N passed, N failed" and returns non-zero on failure. */
#ifndef TANDEM_TEST_CHECK_H
#define TANDEM_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            check_passed++;                                                     \
        } else {                                                                \
            check_failed++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

#define TEST_MAIN_END(name)                                                     \
    do {                                                                        \
        printf("%s: %d passed, %d failed\n", name, check_passed, check_failed); \
        return check_failed ? 1 : 0;                                            \
    } while (0)

/* Whole file as a malloc'd NUL-terminated string, or NULL. */
static inline char *test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

#endif
