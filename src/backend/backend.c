/* Backend creation by name and the helpers every backend shares. */
#include "backend/backend.h"
#include <stdlib.h>
#include <string.h>
#include "util/err.h"

/* TD_HAVE_CUDA: set by the Makefile (1 with make CUDA=1, which builds backend/cuda). */
#ifndef TD_HAVE_CUDA
#define TD_HAVE_CUDA 0
#endif

int td_backend_create(const char *name, int n_threads, td_backend **out, td_err *err) {
    *out = NULL;
    if (!name || !*name || strcmp(name, "cpu") == 0) return td_backend_cpu_create(n_threads, out, err);
    if (strcmp(name, "guard") == 0) return td_backend_guard_create(n_threads, out, err);
    if (strcmp(name, "cuda") == 0) {
#if TD_HAVE_CUDA
        return td_backend_cuda_create(n_threads, out, err);
#else
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "this build has no CUDA backend: rebuild with make CUDA=1");
#endif
    }
    return TD_FAIL(err, TD_ERR_ARG, "unknown backend '%s' (cpu, guard, cuda)", name);
}

#if !TD_HAVE_CUDA
/* Without the CUDA backend no backend is a CUDA one. */
int td_backend_cuda_mem_info(td_backend *b, size_t *free_bytes, size_t *total_bytes) {
    (void)b;
    *free_bytes = *total_bytes = 0;
    return TD_ERR_UNSUPPORTED;
}
uint64_t td_backend_cuda_sample_bytes(td_backend *b) {
    (void)b;
    return 0;
}
int td_backend_cuda_graph_info(td_backend *b, int *graphs, size_t *nodes, size_t *bytes) {
    (void)b;
    *graphs = 0;
    *nodes = *bytes = 0;
    return TD_ERR_UNSUPPORTED;
}
int td_backend_cuda_gemm_info(td_backend *b, int *on, uint64_t *calls) {
    (void)b;
    *on = 0;
    *calls = 0;
    return TD_ERR_UNSUPPORTED;
}
int td_backend_cuda_gemm_caps(td_backend *b, size_t w_bytes, size_t x_bytes) {
    (void)b; (void)w_bytes; (void)x_bytes;
    return TD_ERR_UNSUPPORTED;
}
const char *td_backend_cuda_mode(td_backend *b) {
    (void)b;
    return NULL;
}
int td_backend_cuda_lt_info(td_backend *b, int *sm, int on[3], uint64_t calls[3]) {
    (void)b;
    *sm = 0;
    for (int i = 0; i < 3; i++) on[i] = 0, calls[i] = 0;
    return TD_ERR_UNSUPPORTED;
}
#endif

void td_backend_free(td_backend *b) {
    if (!b) return;
    if (b->destroy) b->destroy(b);
    free(b);
}

size_t td_tensor_data_bytes(const td_tensor *t) {
    int64_t n = td_tensor_numel(t);
    return t->dtype == TD_DTYPE_NVFP4 ? (size_t)(n + 1) / 2 : (size_t)n * td_dtype_size(t->dtype);
}

size_t td_tensor_scales_bytes(const td_tensor *t) {
    if (!t->scales || t->ndim != 2 || t->scale_block[0] <= 0 || t->scale_block[1] <= 0) return 0;
    int64_t r = (t->shape[0] + t->scale_block[0] - 1) / t->scale_block[0];
    int64_t c = (t->shape[1] + t->scale_block[1] - 1) / t->scale_block[1];
    return (size_t)(r * c) * td_dtype_size(t->scales_dtype);
}

int td_bk_tensor_load(td_backend *b, const td_tensor *host, td_tensor *dev, td_err *err) {
    *dev = *host;
    dev->data = dev->scales = NULL;
    size_t nd = td_tensor_data_bytes(host), ns = td_tensor_scales_bytes(host);
    if (host->data && !(dev->data = b->ops->weight_load(b, host->data, nd)))
        return TD_FAIL(err, TD_ERR_NOMEM, "out of backend memory for weight %s (%zu bytes)", host->name ? host->name : "?", nd);
    if (host->scales && !(dev->scales = b->ops->weight_load(b, host->scales, ns))) {
        td_bk_tensor_free(b, dev);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of backend memory for the scales of %s", host->name ? host->name : "?");
    }
    return TD_OK;
}

void td_bk_tensor_free(td_backend *b, td_tensor *dev) {
    if (dev->data) b->ops->weight_free(b, dev->data);
    if (dev->scales) b->ops->weight_free(b, dev->scales);
    dev->data = dev->scales = NULL;
}
