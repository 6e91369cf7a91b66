#include "backend/cpu/pool.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include "util/err.h"

/* Workers spin briefly (a few microseconds) on the job counter before
 * sleeping: a decode step issues hundreds of parallel loops back to back, and
 * a futex wake per loop costs more than a small loop. The spin is short so an
 * oversubscribed machine is not flooded with busy threads. */
#define SPIN_ITERS 2000

struct td_pool {
    int n_threads;            /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation;   /* bumped per job */
    atomic_int pending;       /* workers still busy on this job */
    atomic_int sleepers;
    atomic_bool quit;
    /* current job */
    void (*fn)(void *, int);
    void *ctx;
    atomic_int next;
    int n;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_job(td_pool *p) {
    /* Chunks of one index, taken dynamically: each index is computed
     * identically regardless of which thread runs it. */
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n) break;
        p->fn(p->ctx, i);
    }
}

static void *worker(void *arg) {
    td_pool *p = arg;
    unsigned seen = 0; /* generation at creation: a job posted before this thread runs is still seen */
    for (;;) {
        int spins = 0;
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit) && spins < SPIN_ITERS) {
            cpu_relax();
            spins++;
        }
        if (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = atomic_load(&p->generation);
        run_job(p);
        atomic_fetch_sub(&p->pending, 1);
    }
    return NULL;
}

int td_pool_create(int n_threads, td_pool **out, td_err *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    td_pool *p = TD_CALLOC(err, 1, sizeof *p);
    if (!p) return TD_ERR_NOMEM;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = TD_CALLOC(err, (size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { free(p); return TD_ERR_NOMEM; }
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
            p->n_threads = i;
            td_pool_free(p);
            return TD_FAIL(err, TD_ERR_INTERNAL, "pthread_create failed");
        }
    }
    *out = p;
    return TD_OK;
}

void td_pool_free(td_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int td_pool_threads(const td_pool *p) { return p->n_threads; }

void td_pool_for(td_pool *p, int n, void (*fn)(void *ctx, int i), void *ctx) {
    if (n <= 0) return;
    if (p->n_threads == 1 || n == 1) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_job(p);
    int spins = 0;
    while (atomic_load(&p->pending) > 0) {
        if (++spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
}
