/* Fixed thread pool: parallel_for over an index range, the caller thread
 * takes part. Work is split into contiguous chunks per thread so the result
 * never depends on the thread count. */
#ifndef TANDEM_CPU_POOL_H
#define TANDEM_CPU_POOL_H
#include "tandem.h"

typedef struct td_pool td_pool;
int td_pool_create(int n_threads, td_pool **out, td_err *err);
void td_pool_free(td_pool *p);
int td_pool_threads(const td_pool *p);
/* Calls fn(ctx, i) for every i in [0, n), distributed over the threads. */
void td_pool_for(td_pool *p, int n, void (*fn)(void *ctx, int i), void *ctx);
#endif
