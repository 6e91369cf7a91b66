#include "backend/cpu/pool.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include "util/err.h"

struct td_pool {
    int n_threads;            /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    unsigned long generation; /* bumped per job */
    int pending;              /* workers still busy on this job */
    bool quit;
    /* current job */
    void (*fn)(void *, int);
    void *ctx;
    atomic_int next;
    int n;
};

static void run_job(td_pool *p) {
    /* Dynamic chunks of 1 index: each index is computed identically
     * regardless of which thread runs it. */
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n) break;
        p->fn(p->ctx, i);
    }
}

static void *worker(void *arg) {
    td_pool *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_job(p);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int td_pool_create(int n_threads, td_pool **out, td_err *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    td_pool *p = TD_CALLOC(err, 1, sizeof *p);
    if (!p) return TD_ERR_NOMEM;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
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
    p->quit = true;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store(&p->next, 0);
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    run_job(p);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
