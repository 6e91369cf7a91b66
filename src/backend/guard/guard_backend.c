/* Guard backend, for tests: the CPU ops, with every byte of backend memory
 * (weights, activations, KV, DeltaNet state, batch descriptions) in one
 * reserved address range that is PROT_NONE except while one of the
 * backend's own ops runs. Host code that still reads or writes backend
 * memory directly crashes (SIGSEGV) instead of working by accident, and the
 * counters in td_backend show every host <-> backend transfer. That is the
 * proof a device backend can run the step: it only has to provide the ops.
 *
 * The range is reserved once (MAP_NORESERVE, nothing committed) and handed
 * out page by page, first fit, in 2 MiB steps backed by transparent huge
 * pages (mprotect costs per page-table entry); freed ranges are zeroed and
 * coalesced for reuse. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "util/err.h"

#define GUARD_RESERVE ((size_t)32 << 30) /* address space, not memory */

typedef struct { size_t off, len; } span;

typedef struct {
    td_backend *cpu;      /* runs the ops */
    unsigned char *base;  /* 2 MiB aligned, in map */
    void *map;
    size_t page, top;     /* bytes handed out so far from base (high-water mark) */
    span *free_l; int n_free, cap_free;   /* sorted by offset */
    span *live; int n_live, cap_live;     /* allocations, for free() */
    pthread_mutex_t mu;   /* allocation tables; ops themselves run on the engine's thread */
} guard;

static guard *G(td_backend *b) { return b->impl; }

static void open_all(td_backend *b) {
    guard *g = G(b);
    if (g->top && mprotect(g->base, g->top, PROT_READ | PROT_WRITE) != 0) TD_ASSERT(!"guard: mprotect RW failed");
    g->cpu->isa = b->isa; /* the engine may pick the ISA, tuning and precision after creation */
    g->cpu->tune = b->tune;
    g->cpu->precision = b->precision;
}
static void close_all(td_backend *b) {
    guard *g = G(b);
    if (g->top && mprotect(g->base, g->top, PROT_NONE) != 0) TD_ASSERT(!"guard: mprotect NONE failed");
}

static bool push_span(span **a, int *n, int *cap, int at, span s) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        span *p = realloc(*a, (size_t)nc * sizeof *p);
        if (!p) return false;
        *a = p;
        *cap = nc;
    }
    memmove(*a + at + 1, *a + at, (size_t)(*n - at) * sizeof **a);
    (*a)[at] = s;
    (*n)++;
    return true;
}

static void *guard_alloc(td_backend *b, size_t bytes) {
    guard *g = G(b);
    size_t len = (bytes + g->page - 1) / g->page * g->page;
    if (!len) len = g->page;
    pthread_mutex_lock(&g->mu);
    size_t off = SIZE_MAX;
    for (int i = 0; i < g->n_free; i++)
        if (g->free_l[i].len >= len) {
            off = g->free_l[i].off;
            g->free_l[i].off += len;
            g->free_l[i].len -= len;
            if (!g->free_l[i].len) memmove(g->free_l + i, g->free_l + i + 1, (size_t)(--g->n_free - i) * sizeof(span));
            break;
        }
    if (off == SIZE_MAX) {
        /* grow by whole 2 MiB (huge page) steps; the rest of the step is free */
        size_t step = (size_t)2 << 20, grow = (len + step - 1) / step * step;
        if (g->top + grow > GUARD_RESERVE) { pthread_mutex_unlock(&g->mu); return NULL; }
        off = g->top;
        g->top += grow; /* the new pages stay PROT_NONE until the next op opens the range */
        if (grow > len) {
            span rest = {off + len, grow - len};
            if (g->n_free && g->free_l[g->n_free - 1].off + g->free_l[g->n_free - 1].len == rest.off) {
                g->free_l[g->n_free - 1].len += rest.len;
            } else {
                push_span(&g->free_l, &g->n_free, &g->cap_free, g->n_free, rest);
            }
        }
    }
    if (!push_span(&g->live, &g->n_live, &g->cap_live, g->n_live, (span){off, len})) {
        pthread_mutex_unlock(&g->mu);
        return NULL; /* the range leaks; only under host memory exhaustion */
    }
    pthread_mutex_unlock(&g->mu);
    return g->base + off;
}

static void guard_free(td_backend *b, void *p) {
    if (!p) return;
    guard *g = G(b);
    size_t off = (size_t)((unsigned char *)p - g->base);
    pthread_mutex_lock(&g->mu);
    int li = -1;
    for (int i = g->n_live - 1; i >= 0; i--)
        if (g->live[i].off == off) { li = i; break; }
    TD_ASSERT(li >= 0); /* freeing what this backend did not allocate */
    span s = g->live[li];
    memmove(g->live + li, g->live + li + 1, (size_t)(--g->n_live - li) * sizeof(span));
    /* Zeroed now, so alloc hands out zeros; not MADV_DONTNEED: that splits
     * the huge pages, and 4 KiB page-table entries make every op's mprotect
     * slow (the range is kept and reused instead). */
    open_all(b); /* the whole range: a partial mprotect would split huge pages too */
    memset(g->base + s.off, 0, s.len);
    close_all(b);
    int at = 0;
    while (at < g->n_free && g->free_l[at].off < s.off) at++;
    if (at > 0 && g->free_l[at - 1].off + g->free_l[at - 1].len == s.off) { /* merge left */
        g->free_l[at - 1].len += s.len;
        if (at < g->n_free && g->free_l[at - 1].off + g->free_l[at - 1].len == g->free_l[at].off) {
            g->free_l[at - 1].len += g->free_l[at].len;
            memmove(g->free_l + at, g->free_l + at + 1, (size_t)(--g->n_free - at) * sizeof(span));
        }
    } else if (at < g->n_free && s.off + s.len == g->free_l[at].off) { /* merge right */
        g->free_l[at].off = s.off;
        g->free_l[at].len += s.len;
    } else {
        push_span(&g->free_l, &g->n_free, &g->cap_free, at, s); /* on failure the range is lost, not reused */
    }
    pthread_mutex_unlock(&g->mu);
}

/* Every op: open the range, run the CPU op on the inner backend, close. */
#define INNER G(b)->cpu
#define CPU td_cpu_backend_ops()

static void g_upload(td_backend *b, void *d, const void *s, size_t n) { open_all(b); CPU->upload(INNER, d, s, n); close_all(b); }
static void g_download(td_backend *b, void *d, const void *s, size_t n) { open_all(b); CPU->download(INNER, d, s, n); close_all(b); }
static void g_copy(td_backend *b, void *d, const void *s, size_t n) { open_all(b); CPU->copy(INNER, d, s, n); close_all(b); }
static void g_fill0(td_backend *b, void *d, size_t n) { open_all(b); CPU->fill0(INNER, d, n); close_all(b); }
static void g_copy_rows(td_backend *b, float *d, size_t dl, const float *s, size_t sl, size_t w, int r) {
    open_all(b); CPU->copy_rows(INNER, d, dl, s, sl, w, r); close_all(b);
}
static void g_sync(td_backend *b) { (void)b; }
static const void *g_weight_load(td_backend *b, const void *host, size_t bytes) {
    void *d = guard_alloc(b, bytes);
    if (d) { open_all(b); memcpy(d, host, bytes); close_all(b); }
    return d;
}
static void g_weight_free(td_backend *b, const void *dev) { guard_free(b, (void *)dev); }
static void g_fill_random(td_backend *b, void *d, td_dtype dt, size_t n, uint64_t seed, td_fill_mode mode, float value) {
    open_all(b); CPU->fill_random(INNER, d, dt, n, seed, mode, value); close_all(b);
}
static void g_matmul(td_backend *b, const td_tensor *W, const float *x, int M, float *y) {
    open_all(b); CPU->matmul(INNER, W, x, M, y); close_all(b);
}
static void g_rmsnorm(td_backend *b, float *y, const float *x, const float *w, int M, int n, float eps) {
    open_all(b); CPU->rmsnorm(INNER, y, x, w, M, n, eps); close_all(b);
}
static void g_embed(td_backend *b, const td_tensor *E, const int32_t *t, int M, float *out) {
    open_all(b); CPU->embed(INNER, E, t, M, out); close_all(b);
}
static void g_add(td_backend *b, float *y, const float *x, size_t n) { open_all(b); CPU->add(INNER, y, x, n); close_all(b); }
static void g_silu_mul(td_backend *b, float *a, const float *u, size_t n) { open_all(b); CPU->silu_mul(INNER, a, u, n); close_all(b); }
static void g_attn_prep(td_backend *b, const td_config *g, const td_batch *bt, const float *qg, float *k, const float *v,
                        const float *qn, const float *kn, const float *inv_freq, float *q, float *gate, const td_kv_view *kv,
                        int shift) {
    open_all(b); CPU->attn_prep(INNER, g, bt, qg, k, v, qn, kn, inv_freq, q, gate, kv, shift); close_all(b);
}
static void g_attention(td_backend *b, const td_config *g, const td_batch *bt, const float *q, const float *gate,
                        const td_kv_view *kv, int shift, float *out) {
    open_all(b); CPU->attention(INNER, g, bt, q, gate, kv, shift, out); close_all(b);
}
static void g_gdn_conv(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                       const float *qkv, float *conv_out) {
    open_all(b); CPU->gdn_conv(INNER, g, bt, lin, w, qkv, conv_out); close_all(b);
}
static void g_gdn_recur(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                        const float *conv_out, const float *z, const float *bi, const float *ai, float *o, int chunk) {
    open_all(b); CPU->gdn_recur(INNER, g, bt, lin, w, conv_out, z, bi, ai, o, chunk); close_all(b);
}
static void g_kv_store(td_backend *b, const td_kv_view *kv, int row, const float *k, const float *v) {
    open_all(b); CPU->kv_store(INNER, kv, row, k, v); close_all(b);
}
static void g_kv_load(td_backend *b, const td_kv_view *kv, int row, int which, float *out) {
    open_all(b); CPU->kv_load(INNER, kv, row, which, out); close_all(b);
}
static void g_argmax(td_backend *b, const float *x, int rows, int n, int32_t *out) {
    open_all(b); CPU->argmax(INNER, x, rows, n, out); close_all(b);
}

static int32_t g_sample(td_backend *b, struct td_sampler *s, const struct td_sample_call *c) {
    open_all(b);
    int32_t r = CPU->sample(INNER, s, c);
    close_all(b);
    return r;
}
static void g_parallel_for(td_backend *b, int n, void (*fn)(void *, int), void *ctx) { CPU->parallel_for(INNER, n, fn, ctx); }

static const td_backend_ops guard_ops = {
    .name = "guard",
    .alloc = guard_alloc,
    .free = guard_free,
    .upload = g_upload,
    .download = g_download,
    .copy = g_copy,
    .fill0 = g_fill0,
    .copy_rows = g_copy_rows,
    .sync = g_sync,
    .weight_load = g_weight_load,
    .weight_free = g_weight_free,
    .fill_random = g_fill_random,
    .matmul = g_matmul,
    .rmsnorm = g_rmsnorm,
    .embed = g_embed,
    .add = g_add,
    .silu_mul = g_silu_mul,
    .attn_prep = g_attn_prep,
    .attention = g_attention,
    .gdn_conv = g_gdn_conv,
    .gdn_recur = g_gdn_recur,
    .kv_store = g_kv_store,
    .kv_load = g_kv_load,
    .argmax = g_argmax,
    .sample = g_sample,
    .parallel_for = g_parallel_for,
};

static void guard_destroy(td_backend *b) {
    guard *g = G(b);
    if (!g) return;
    if (g->map) munmap(g->map, GUARD_RESERVE + ((size_t)2 << 20));
    td_backend_free(g->cpu);
    pthread_mutex_destroy(&g->mu);
    free(g->free_l);
    free(g->live);
    free(g);
}

int td_backend_guard_create(int n_threads, td_backend **out, td_err *err) {
    *out = NULL;
    td_backend *b = TD_CALLOC(err, 1, sizeof *b);
    guard *g = b ? TD_CALLOC(err, 1, sizeof *g) : NULL;
    if (!g) { free(b); return TD_ERR_NOMEM; }
    b->ops = &guard_ops;
    b->impl = g;
    b->destroy = guard_destroy;
    pthread_mutex_init(&g->mu, NULL);
    g->page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, GUARD_RESERVE + ((size_t)2 << 20), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { td_backend_free(b); return TD_FAIL(err, TD_ERR_NOMEM, "guard backend: cannot reserve address space"); }
    g->base = (unsigned char *)(((uintptr_t)p + ((uintptr_t)2 << 20) - 1) & ~(((uintptr_t)2 << 20) - 1));
    g->map = p;
    /* Transparent huge pages where the kernel offers them: mprotect costs per
     * page-table entry, and every op flips the whole range twice. */
    madvise(g->base, GUARD_RESERVE, MADV_HUGEPAGE);
    int rc = td_backend_cpu_create(n_threads, &g->cpu, err);
    if (rc) { td_backend_free(b); return rc; }
    b->n_threads = g->cpu->n_threads;
    b->isa = g->cpu->isa;
    b->tune = g->cpu->tune;
    *out = b;
    return TD_OK;
}
