/* CPU backend: plain C kernels (the numerical reference) run on a thread pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "util/err.h"

#define ROWS_PER_TASK 16

typedef struct {
    const td_tensor *W;
    const float *x;
    float *y;
    int M;
    int64_t N, K;
} matmul_job;

static void matmul_task(void *ctx, int task) {
    const matmul_job *j = ctx;
    int64_t n0 = (int64_t)task * ROWS_PER_TASK, n1 = n0 + ROWS_PER_TASK;
    if (n1 > j->N) n1 = j->N;
    for (int64_t n = n0; n < n1; n++) {
        for (int m = 0; m < j->M; m++) {
            const float *xm = j->x + (int64_t)m * j->K;
            float v;
            switch (j->W->dtype) {
            case TD_DTYPE_F32: v = td_dot_f32(xm, (const float *)j->W->data + n * j->K, j->K); break;
            case TD_DTYPE_BF16: v = td_dot_bf16(xm, (const uint16_t *)j->W->data + n * j->K, j->K); break;
            case TD_DTYPE_F16: v = td_dot_f16(xm, (const uint16_t *)j->W->data + n * j->K, j->K); break;
            default: TD_ASSERT(!"matmul: unsupported weight dtype"); v = 0;
            }
            j->y[(int64_t)m * j->N + n] = v;
        }
    }
}

static void cpu_matmul(td_backend *b, const td_tensor *W, const float *x, int M, float *y) {
    matmul_job j = {.W = W, .x = x, .y = y, .M = M, .N = W->shape[0], .K = W->shape[1]};
    int tasks = (int)((j.N + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
    if ((double)M * (double)j.N * (double)j.K < 32768.0) { /* too small to share */
        for (int t = 0; t < tasks; t++) matmul_task(&j, t);
        return;
    }
    td_pool_for(b->impl, tasks, matmul_task, &j);
}

static void cpu_rmsnorm(td_backend *b, float *y, const float *x, const float *w, int M, int n, float eps) {
    (void)b;
    for (int m = 0; m < M; m++) {
        const float *xm = x + (int64_t)m * n;
        float *ym = y + (int64_t)m * n;
        float ss = 0.0f;
        for (int i = 0; i < n; i++) ss += xm[i] * xm[i];
        float r = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) ym[i] = (xm[i] * r) * w[i];
    }
}

static void cpu_embed(td_backend *b, const td_tensor *E, const int32_t *tokens, int M, float *out) {
    (void)b;
    int64_t H = E->shape[1];
    for (int m = 0; m < M; m++) td_tensor_row_f32(E, tokens[m], out + (int64_t)m * H);
}

static void cpu_parallel_for(td_backend *b, int n, void (*fn)(void *, int), void *ctx) { td_pool_for(b->impl, n, fn, ctx); }

static const td_backend_ops cpu_ops = {
    .name = "cpu",
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .embed = cpu_embed,
    .parallel_for = cpu_parallel_for,
};

int td_backend_cpu_create(int n_threads, td_backend **out, td_err *err) {
    *out = NULL;
    td_backend *b = TD_CALLOC(err, 1, sizeof *b);
    if (!b) return TD_ERR_NOMEM;
    td_pool *p;
    int rc = td_pool_create(n_threads, &p, err);
    if (rc) { free(b); return rc; }
    b->ops = &cpu_ops;
    b->impl = p;
    b->n_threads = td_pool_threads(p);
    *out = b;
    return TD_OK;
}

void td_backend_free(td_backend *b) {
    if (!b) return;
    td_pool_free(b->impl);
    free(b);
}
