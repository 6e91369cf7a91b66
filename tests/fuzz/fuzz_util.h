/* Helpers shared by the libFuzzer harnesses in tests/fuzz (not a library API). */
#ifndef TANDEM_FUZZ_UTIL_H
#define TANDEM_FUZZ_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Repository root: $TANDEM_ROOT, else the folder the Makefile built from. */
#ifndef FUZZ_ROOT
#define FUZZ_ROOT "."
#endif
static inline const char *fuzz_root(void) {
    const char *r = getenv("TANDEM_ROOT");
    return r && *r ? r : FUZZ_ROOT;
}
static inline void fuzz_path(char *buf, size_t cap, const char *rel) { snprintf(buf, cap, "%s/%s", fuzz_root(), rel); }

/* An in-memory file (memfd) the loaders open by path (/proc/self/fd/N):
 * the harness drives the library's own file-based API, no library hook. */
typedef struct fuzz_file {
    int fd;
    char path[64];
} fuzz_file;

static inline void fuzz_file_init(fuzz_file *f, const char *name) {
    f->fd = memfd_create(name, MFD_CLOEXEC);
    if (f->fd < 0) { perror("memfd_create"); abort(); }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

static inline void fuzz_file_set(fuzz_file *f, const void *data, size_t n) {
    if (ftruncate(f->fd, 0) != 0) abort();
    const char *p = data;
    size_t off = 0;
    while (off < n) {
        ssize_t w = pwrite(f->fd, p + off, n - off, (off_t)off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
}

/* The end of the SSE event at p: the first "\n\n" at or after p, or NULL.
 * Not strstr: ASan's strstr (and strchr) interceptor takes strlen of the
 * whole rest of the stream on every call, quadratic over a stream's events
 * (20% of fuzz_api's time in a profile). This loop reads each byte once. */
static inline const char *fuzz_event_end(const char *p) {
    for (; *p; p++)
        if (p[0] == '\n' && p[1] == '\n') return p;
    return NULL;
}

/* A property the harness checks failed: a crash libFuzzer records. */
#define FUZZ_ASSERT(c, ...)                                                              \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "%s:%d: fuzz check failed: %s: ", __FILE__, __LINE__, #c);   \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#endif
