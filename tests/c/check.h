/* Minimal test harness: CHECK(cond, fmt...) counts passes and failures;
 * TEST_MAIN_END prints "name: N passed, N failed" and returns non-zero on failure. */
#ifndef TANDEM_TEST_CHECK_H
#define TANDEM_TEST_CHECK_H
#include <stdio.h>
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

#endif
