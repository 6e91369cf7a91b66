/* CPU backend: plain C kernels (the numerical reference) run on a thread
 * pool. Backend memory is host memory: alloc is calloc, upload / download /
 * copy are memcpy. Weights are used in place (memory-mapped files), or with
 * td_backend.copy_weights copied into transparent huge pages (below). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/fill_random.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "sample/sampler.h"
#include "util/err.h"
#include "util/hugemem.h"

/* ---- memory -------------------------------------------------------------- */

static void *cpu_alloc(td_backend *b, size_t bytes) { (void)b; return calloc(1, bytes ? bytes : 1); }
static void cpu_free(td_backend *b, void *p) { (void)b; free(p); }
static void cpu_memcpy(td_backend *b, void *dst, const void *src, size_t n) { (void)b; if (n) memmove(dst, src, n); }
static void cpu_fill0(td_backend *b, void *dst, size_t n) { (void)b; if (n) memset(dst, 0, n); }
static void cpu_copy_rows(td_backend *b, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t width, int rows) {
    (void)b;
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * dst_ld, src + (size_t)r * src_ld, width * sizeof(float));
}
static void cpu_sync(td_backend *b) { (void)b; }
/* The backend's own state: its thread pool and the weight copies it made. */
typedef struct {
    td_pool *pool;
    bool thp;            /* the kernel gives huge pages on request (transparent_hugepage: always or madvise) */
    pthread_mutex_t mu;  /* guards copies: the engine loads on one thread and may free on another */
    struct copy { void *p; size_t len; } *copies; /* mappings of copied weights (len: rounded to pages) */
    int n_copies, cap_copies;
} cpu_impl;

static td_pool *pool_of(td_backend *b) { return ((cpu_impl *)b->impl)->pool; }

enum { COPY_MIN = 64 << 10, COPY_CHUNK = 4 << 20 };

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} copy_job;

static void copy_task(void *ctx, int task) {
    const copy_job *j = ctx;
    size_t o = (size_t)task * COPY_CHUNK, n = j->n - o < COPY_CHUNK ? j->n - o : COPY_CHUNK;
    memcpy(j->dst + o, j->src + o, n);
}

/* Weights: with b->copy_weights (the engine's default; td_engine_opts.mmap_weights
 * turns it off) every tensor of COPY_MIN bytes or more is copied into an
 * anonymous mapping of its own that starts on a 2 MiB boundary and asks for
 * transparent huge pages. Read in place from the file mapping, a decode step
 * walks the page tables once per 4 KiB of weights; from huge pages once per
 * 2 MiB. Measured on the 27B-proportioned BF16 model (Xeon VM, 2 threads,
 * bench/results/weights-hugepages-2026-12-06.md): decode and the 5-token
 * verify 7-13% faster. The engine then releases the files' pages
 * (td_weights_release_pages), so the weights are not resident twice. Bits are
 * unchanged: the same bytes on other pages. Without huge pages from the
 * kernel a copy gains nothing, and the weights stay in place. */
static const void *cpu_weight_load(td_backend *b, const void *host, size_t bytes) {
    cpu_impl *im = b->impl;
    if (!b->copy_weights || !im->thp || bytes < COPY_MIN) return host;
    size_t len;
    char *p = td_huge_map(bytes, &len);
    if (!p) return NULL;
    copy_job cj = {p, host, bytes};
    td_pool_for(im->pool, (int)((bytes + COPY_CHUNK - 1) / COPY_CHUNK), copy_task, &cj); /* the threads fault and fill in parallel */
    pthread_mutex_lock(&im->mu);
    if (im->n_copies == im->cap_copies) {
        int cap = im->cap_copies ? 2 * im->cap_copies : 256;
        struct copy *nc = cap <= (1 << 24) ? realloc(im->copies, (size_t)cap * sizeof *nc) : NULL;
        if (!nc) {
            pthread_mutex_unlock(&im->mu);
            td_huge_unmap(p, len);
            return NULL;
        }
        im->copies = nc, im->cap_copies = cap;
    }
    im->copies[im->n_copies++] = (struct copy){p, len};
    b->counters.weight_copy_bytes += bytes;
    pthread_mutex_unlock(&im->mu);
    return p;
}

static void cpu_weight_free(td_backend *b, const void *dev) {
    cpu_impl *im = b->impl;
    pthread_mutex_lock(&im->mu);
    for (int i = 0; i < im->n_copies; i++)
        if (im->copies[i].p == dev) {
            td_huge_unmap(im->copies[i].p, im->copies[i].len);
            im->copies[i] = im->copies[--im->n_copies];
            break;
        }
    pthread_mutex_unlock(&im->mu); /* not found: a weight used in place, nothing to free */
}

void td_cpu_par_for(td_backend *b, int n, void (*fn)(void *, int), void *ctx, double work) {
    if (work < 65536.0 || b->n_threads == 1) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    td_pool_for(pool_of(b), n, fn, ctx);
}

/* ---- fill_random (backend/fill_random.h) ---------------------------------- */

/* Tasks of FILL_CHUNK elements (even, for NVFP4's byte pairs); each element
 * depends only on (seed, its index), so the split changes nothing. */
#define FILL_CHUNK ((size_t)1 << 16)

typedef struct {
    void *dst;
    td_dtype dtype;
    size_t n;
    uint64_t key;
    int constant;
    float value;
} fill_job;

static void fill_task(void *ctx, int task) {
    const fill_job *j = ctx;
    size_t i0 = (size_t)task * FILL_CHUNK, i1 = i0 + FILL_CHUNK < j->n ? i0 + FILL_CHUNK : j->n;
    /* locals: a byte store may alias the job, which would reload it every element */
    const uint64_t key = j->key;
    const int c = j->constant;
    const float v = j->value;
    switch (j->dtype) {
    case TD_DTYPE_F32: {
        float *d = j->dst;
        for (size_t i = i0; i < i1; i++) d[i] = td_rand_value(key, i, c, v);
        break;
    }
    case TD_DTYPE_BF16: {
        uint16_t *d = j->dst;
        for (size_t i = i0; i < i1; i++) d[i] = td_rand_bf16(td_rand_value(key, i, c, v));
        break;
    }
    case TD_DTYPE_F8_E4M3: {
        uint8_t *d = j->dst;
        for (size_t i = i0; i < i1; i++) d[i] = td_rand_e4m3(td_rand_value(key, i, c, v));
        break;
    }
    case TD_DTYPE_Q8: {
        int8_t *d = j->dst;
        for (size_t i = i0; i < i1; i++) d[i] = td_rand_q8(td_rand_value(key, i, c, v));
        break;
    }
    default: { /* NVFP4 (checked by the op) */
        uint8_t *d = j->dst;
        for (size_t i = i0; i < i1; i += 2)
            d[i / 2] = (uint8_t)(td_rand_e2m1(td_rand_value(key, i, c, v)) | td_rand_e2m1(td_rand_value(key, i + 1, c, v)) << 4);
    }
    }
}

static void cpu_fill_random(td_backend *b, void *dst, td_dtype dtype, size_t n, uint64_t seed, td_fill_mode mode, float value) {
    TD_ASSERT((dtype == TD_DTYPE_F32 || dtype == TD_DTYPE_BF16 || dtype == TD_DTYPE_F8_E4M3 || dtype == TD_DTYPE_NVFP4 ||
               dtype == TD_DTYPE_Q8) && "fill_random: F32, BF16, F8_E4M3, NVFP4 or Q8");
    TD_ASSERT((dtype != TD_DTYPE_NVFP4 || n % 2 == 0) && "fill_random: NVFP4 fills whole bytes");
    TD_ASSERT(n / FILL_CHUNK < (size_t)1 << 30);
    if (!n) return;
    fill_job j = {dst, dtype, n, td_rand_key(seed), mode == TD_FILL_CONST, value};
    td_cpu_par_for(b, (int)((n + FILL_CHUNK - 1) / FILL_CHUNK), fill_task, &j, (double)n);
}

/* ---- matmul -------------------------------------------------------------- */

/* Matmul work is split into tasks of (weight rows x activation rows). Each
 * output element is computed whole by one task with the kernels' fixed
 * summation order, so neither the split nor the thread count changes a bit.
 * Decode/verify (M <= 16): every task takes all M rows, so each weight row is
 * read from memory once. Prefill: 64-row activation blocks keep x in L2 while
 * a group of weight rows is reused from L1 (BF16 activations: 128-row blocks,
 * the BF16 panel's, which halve its weight conversions: +6-10% on the
 * 27B-shaped matrices, one thread, side by side). */
#define ROWS_SMALL_M 64
#define ROWS_LARGE_M 32
#define M_BLOCK 64

/* Weight rows per decode/verify task (M <= 16): 64, halved (down to 16) while that leaves fewer than 4
   tasks per thread, so a many-core CPU still splits the smaller matrices (N = 1024 on 16 threads: 64 tasks
   of 16 rows, not 16 of 64). The split never changes a bit. Why 64 and not 16: the tiles prefetch ahead
   within a task, and each task boundary restarts that stream. Measured on the EPYC Zen 5 guest
   (27B-proportioned model, 2 threads, alternating rounds, medians), 16 rows -> 64 rows:
   - int8 activations, AVX2, q8 (6 rounds): 5-token verify 41.5 -> 35.3 ms (256 rows: 35.8), decode 37.3
     -> 41.4 tokens/s (256 rows: 39.8);
   - f32, AVX2, BF16 weights (3 rounds): decode level (22.9-23.3), 5-token verify 53.8-55.7 -> 50.4-51.8 ms;
   - f32, AVX-512, BF16: decode 24.0-24.5 -> 24.1-25.0 tokens/s, verify 43.8-45.5 -> 42.9-44.2 ms;
   - f32, AVX2, q8: decode 31.3-35.4 -> 39.7-40.1 tokens/s, verify 65.3-72.0 -> 63.9-67.1 ms. */
static int64_t small_m_rows(int64_t N, int threads) {
    int64_t rows = ROWS_SMALL_M;
    while (rows > 16 && N < rows * 4 * threads) rows /= 2;
    return rows;
}

typedef struct {
    const td_tensor *W;
    const float *x;
    const uint16_t *xb; /* precision bf16: x rounded, rows of ldb */
    const int8_t *xq, *xa; /* precision int8 with q8 weights: x quantized [M, K], |xq|, scales xs [M, K/32] */
    const float *xs;
    int64_t ldb;
    float *y;
    int M, mb, n_mblocks, isa, tune;
    int64_t N, rows;
} matmul_job;

static void matmul_task(void *ctx, int task) {
    const matmul_job *j = ctx;
    int rb = task / j->n_mblocks, mbi = task % j->n_mblocks;
    int64_t n0 = (int64_t)rb * j->rows, n1 = n0 + j->rows;
    if (n1 > j->N) n1 = j->N;
    int m0 = mbi * j->mb, m1 = m0 + j->mb;
    if (m1 > j->M) m1 = j->M;
    if (j->xq) td_matmul_block_i8((td_isa)j->isa, j->W, j->xq, j->xa, j->xs, m0, m1, n0, n1, j->y, j->N);
    else if (j->xb) td_matmul_block_bf16(j->W, j->xb, j->ldb, m0, m1, n0, n1, j->y, j->N);
    else td_matmul_block((td_isa)j->isa, (td_tune)j->tune, j->W, j->x, m0, m1, n0, n1, j->y, j->N);
}

static void cpu_matmul(td_backend *b, const td_tensor *W, const float *x, int M, float *y) {
    const char *why;
    if (!td_matmul_supported(W, &why)) TD_ASSERT(!"matmul: unsupported weight");
    matmul_job j = {.W = W, .x = x, .y = y, .M = M, .N = W->shape[0], .isa = b->isa, .tune = b->tune};
    int64_t K = W->shape[1];
    const bool int8 = b->precision == TD_PRECISION_INT8 && W->dtype == TD_DTYPE_Q8; /* other weights: the f32 path */
    j.rows = M > 16 ? ROWS_LARGE_M : small_m_rows(j.N, b->n_threads);
    j.mb = M <= 16 ? M : b->precision == TD_PRECISION_BF16 ? TD_BF16_M_BLOCK : M_BLOCK;
    j.n_mblocks = (M + j.mb - 1) / j.mb;
    int tasks = (int)((j.N + j.rows - 1) / j.rows) * j.n_mblocks;
    uint16_t *xb = NULL;
    if (b->precision == TD_PRECISION_BF16) {
        /* x rounded once for every task; a failed allocation is an out-of-memory
         * the op table has no error path for (the forward's own buffers are larger) */
        j.ldb = (K + 31) & ~(int64_t)31;
        xb = malloc((size_t)M * (size_t)j.ldb * sizeof *xb);
        TD_ASSERT(xb && "matmul: out of memory for the bf16 activations");
        td_x_to_bf16(x, M, K, j.ldb, xb);
        j.xb = xb;
    }
    void *xi = NULL;
    if (int8) {
        const size_t qb = (size_t)M * (size_t)K;
        xi = malloc(2 * qb + (size_t)M * (size_t)(K / 32) * sizeof(float));
        TD_ASSERT(xi && "matmul: out of memory for the int8 activations");
        int8_t *xq = xi, *xa = xq + qb;
        float *xs = (float *)(void *)(xa + qb); /* K % 32 == 0: 4-byte aligned */
        td_x_to_q8((td_isa)b->isa, x, M, K, xq, xa, xs);
        j.xq = xq;
        j.xa = xa;
        j.xs = xs;
    }
    if ((double)M * (double)j.N * (double)K < 32768.0) { /* too small to share: one task takes it all */
        matmul_job one = j;
        one.mb = M, one.n_mblocks = 1, one.rows = j.N;
        matmul_task(&one, 0);
    } else td_pool_for(pool_of(b), tasks, matmul_task, &j);
    free(xb);
    free(xi);
}

/* ---- elementwise ----------------------------------------------------------- */

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

static void cpu_add(td_backend *b, float *y, const float *x, size_t n) {
    (void)b;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_silu_mul(td_backend *b, float *a, const float *u, size_t n) {
    (void)b;
    for (size_t i = 0; i < n; i++) a[i] = (a[i] / (1.0f + expf(-a[i]))) * u[i];
}

static void cpu_argmax(td_backend *b, const float *x, int rows, int n, int32_t *out) {
    (void)b;
    for (int r = 0; r < rows; r++) {
        const float *v = x + (size_t)r * n;
        int best = 0;
        for (int i = 1; i < n; i++)
            if (v[i] > v[best]) best = i;
        out[r] = best;
    }
}

static int32_t cpu_sample(td_backend *b, td_sampler *s, const td_sample_call *c) { (void)b; return td_sampler_run(s, c); }

static void cpu_parallel_for(td_backend *b, int n, void (*fn)(void *, int), void *ctx) { td_pool_for(pool_of(b), n, fn, ctx); }

static const td_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .fill0 = cpu_fill0,
    .copy_rows = cpu_copy_rows,
    .sync = cpu_sync,
    .weight_load = cpu_weight_load,
    .weight_free = cpu_weight_free,
    .fill_random = cpu_fill_random,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .embed = cpu_embed,
    .add = cpu_add,
    .silu_mul = cpu_silu_mul,
    .attn_prep = td_cpu_attn_prep,
    .attention = td_cpu_attention,
    .gdn_conv = td_cpu_gdn_conv,
    .gdn_recur = td_cpu_gdn_recur,
    .kv_store = td_cpu_kv_store,
    .kv_load = td_cpu_kv_load,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .parallel_for = cpu_parallel_for,
};

const td_backend_ops *td_cpu_backend_ops(void) { return &cpu_ops; }

static void cpu_destroy(td_backend *b) {
    cpu_impl *im = b->impl;
    td_pool_free(im->pool);
    for (int i = 0; i < im->n_copies; i++) td_huge_unmap(im->copies[i].p, im->copies[i].len); /* weights not freed first */
    free(im->copies);
    pthread_mutex_destroy(&im->mu);
    free(im);
}

int td_backend_cpu_create(int n_threads, td_backend **out, td_err *err) {
    *out = NULL;
    td_backend *b = TD_CALLOC(err, 1, sizeof *b);
    if (!b) return TD_ERR_NOMEM;
    cpu_impl *im = TD_CALLOC(err, 1, sizeof *im);
    if (!im) { free(b); return TD_ERR_NOMEM; }
    int rc = td_pool_create(n_threads, &im->pool, err);
    if (rc) { free(im); free(b); return rc; }
    pthread_mutex_init(&im->mu, NULL);
    im->thp = td_thp_offered();
    b->ops = &cpu_ops;
    b->impl = im;
    b->n_threads = td_pool_threads(im->pool);
    b->isa = (int)td_kernels_best_isa();
    b->tune = (int)td_kernels_best_tune();
    b->destroy = cpu_destroy;
    *out = b;
    return TD_OK;
}
