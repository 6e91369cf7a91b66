/* CPU backend: plain C kernels (the numerical reference) run on a thread pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "util/err.h"

/* Matmul work is split into tasks of (weight rows x activation rows). Each
 * output element is computed whole by one task with the kernels' fixed
 * summation order, so neither the split nor the thread count changes a bit.
 * Decode/verify (M <= 16): every task takes all M rows, so each weight row is
 * read from memory once. Prefill: 64-row activation blocks keep x in L2 while
 * a group of weight rows is reused from L1. */
#define ROWS_SMALL_M 16
#define ROWS_LARGE_M 32
#define M_BLOCK 64

typedef struct {
    const td_tensor *W;
    const float *x;
    float *y;
    int M, mb, n_mblocks, isa;
    int64_t N, rows;
} matmul_job;

static void matmul_task(void *ctx, int task) {
    const matmul_job *j = ctx;
    int rb = task / j->n_mblocks, mbi = task % j->n_mblocks;
    int64_t n0 = (int64_t)rb * j->rows, n1 = n0 + j->rows;
    if (n1 > j->N) n1 = j->N;
    int m0 = mbi * j->mb, m1 = m0 + j->mb;
    if (m1 > j->M) m1 = j->M;
    td_matmul_block((td_isa)j->isa, j->W, j->x, m0, m1, n0, n1, j->y, j->N);
}

static void cpu_matmul(td_backend *b, const td_tensor *W, const float *x, int M, float *y) {
    const char *why;
    if (!td_matmul_supported(W, &why)) TD_ASSERT(!"matmul: unsupported weight");
    matmul_job j = {.W = W, .x = x, .y = y, .M = M, .N = W->shape[0], .isa = b->isa};
    int64_t K = W->shape[1];
    j.rows = M <= 16 ? ROWS_SMALL_M : ROWS_LARGE_M;
    j.mb = M <= 16 ? M : M_BLOCK;
    j.n_mblocks = (M + j.mb - 1) / j.mb;
    int tasks = (int)((j.N + j.rows - 1) / j.rows) * j.n_mblocks;
    if ((double)M * (double)j.N * (double)K < 32768.0) { /* too small to share */
        td_matmul_block((td_isa)b->isa, W, x, 0, M, 0, j.N, y, j.N);
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
    b->isa = (int)td_kernels_best_isa();
    *out = b;
    return TD_OK;
}

void td_backend_free(td_backend *b) {
    if (!b) return;
    td_pool_free(b->impl);
    free(b);
}
