/* The backend a test that builds engine parts by hand runs on: the one
 * $TANDEM_BACKEND names (cpu when unset), like td_engine_load picks, so
 * `make test-guard` runs these tests on the guard backend too. One per
 * process, freed at exit. */
#ifndef TANDEM_TEST_BACKEND_H
#define TANDEM_TEST_BACKEND_H
#include <stdlib.h>
#include "backend/backend.h"

static td_backend *test_backend_one;
static inline void test_backend_free(void) { td_backend_free(test_backend_one); }
static inline td_backend *test_backend(void) {
    if (!test_backend_one) {
        td_err err;
        if (td_backend_create(getenv("TANDEM_BACKEND"), 1, &test_backend_one, &err)) {
            fprintf(stderr, "backend: %s\n", err.msg);
            exit(1);
        }
        atexit(test_backend_free);
    }
    return test_backend_one;
}
#endif
