/* One backend interface: a table of function pointers, so the CPU and a
 * future CUDA backend share the model code, scheduler, KV cache and spec
 * decoding. Buffers passed to ops are backend memory (host memory for CPU).
 *
 * Batch invariance: every op computes each output row with the same
 * arithmetic whatever M (rows in the batch) is, so verifying k+1 tokens in
 * one pass gives bit-identical logits to k+1 single-token passes. Greedy
 * speculative decoding is lossless by construction, not by tolerance. */
#ifndef TANDEM_BACKEND_H
#define TANDEM_BACKEND_H
#include <stddef.h>
#include "model/tensor.h"
#include "tandem.h"

typedef struct td_backend td_backend;

typedef struct td_backend_ops {
    const char *name;
    /* y[M,N] = x[M,K] · W[N,K]^T ; W in any supported weight dtype. */
    void (*matmul)(td_backend *b, const td_tensor *W, const float *x, int M, float *y);
    /* y[m,:] = x[m,:] * rsqrt(mean(x^2) + eps) * w   (w holds 1+w for zero-centred norms) */
    void (*rmsnorm)(td_backend *b, float *y, const float *x, const float *w, int M, int n, float eps);
    /* out[m, :] = embedding rows of tokens[m] */
    void (*embed)(td_backend *b, const td_tensor *E, const int32_t *tokens, int M, float *out);
    /* Runs fn(ctx, i) for i in [0, n) on the backend's threads (CPU only). */
    void (*parallel_for)(td_backend *b, int n, void (*fn)(void *ctx, int i), void *ctx);
} td_backend_ops;

struct td_backend {
    const td_backend_ops *ops;
    void *impl;
    int n_threads;
    int isa; /* CPU: the td_isa its matmul kernels use (backend/cpu/kernels.h); the best the CPU has at
                creation, and one the CPU has whoever sets it (td_kernels_have_isa) */
};

int td_backend_cpu_create(int n_threads, td_backend **out, td_err *err);
void td_backend_free(td_backend *b);

#endif
