#include "util/hugemem.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { HUGE_PAGE = 2 << 20 };

bool td_thp_offered(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r"); /* e.g. "always [madvise] never" */
    if (!f) return false;
    char line[128] = {0};
    bool ok = fgets(line, sizeof line, f) && (strstr(line, "[always]") || strstr(line, "[madvise]"));
    fclose(f);
    return ok;
}

void *td_huge_map(size_t bytes, size_t *len) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes == 0 || bytes > SIZE_MAX - HUGE_PAGE - page) return NULL;
    const size_t n = (bytes + page - 1) / page * page;
    /* map n + 2 MiB, keep the 2 MiB-aligned n inside it, give back the rest */
    char *m = mmap(NULL, n + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > m) munmap(m, (size_t)(p - m));
    munmap(p + n, (size_t)(m + n + HUGE_PAGE - (p + n)));
    (void)madvise(p, n, MADV_HUGEPAGE);
    *len = n;
    return p;
}

void td_huge_unmap(void *p, size_t len) {
    if (p) munmap(p, len);
}
