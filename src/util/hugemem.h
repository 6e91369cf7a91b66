/* Anonymous memory in transparent huge pages, for weights: a decode step
 * streams every weight once, and from 4 KiB pages it walks the page tables
 * once per 4 KiB (measured: bench/results/weights-hugepages-2026-12-06.md). */
#ifndef TANDEM_UTIL_HUGEMEM_H
#define TANDEM_UTIL_HUGEMEM_H
#include <stdbool.h>
#include <stddef.h>

/* Whether the kernel gives huge pages on request: transparent_hugepage
 * "enabled" is [always] or [madvise] (read from sysfs on each call). */
bool td_thp_offered(void);

/* A zeroed read-write mapping of at least `bytes` that starts on a 2 MiB
 * boundary and asks for huge pages (a hint: without them it is still a
 * valid mapping); *len receives its length (bytes rounded up to the page
 * size) for td_huge_unmap. NULL when the mapping fails or bytes is 0. */
void *td_huge_map(size_t bytes, size_t *len);
void td_huge_unmap(void *p, size_t len);

#endif
