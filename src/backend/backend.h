/* One backend interface: a table of function pointers that carries the whole
 * forward step, so the CPU backend (the numerical reference), the guard
 * backend (tests) and a device backend share the model code, scheduler, KV
 * metadata and spec decoding. src/backend/README.md documents every op.
 *
 * Memory: every pointer an op takes is backend memory (alloc, or a weight
 * from weight_load), except the small host structs passed as arguments
 * (td_config, td_batch, td_kv_view, td_tensor: their fields are host values,
 * their array / data pointers backend memory). Host code never dereferences
 * backend memory: it moves data with upload / download (counted in
 * td_backend.counters) and copies within the backend with copy / copy_rows.
 * Like device pointers, backend pointers may be offset by host arithmetic.
 *
 * Batch invariance: every op computes each output row with the same
 * arithmetic whatever M (rows in the batch) is, so verifying k+1 tokens in
 * one pass gives bit-identical logits to k+1 single-token passes. Greedy
 * speculative decoding is lossless by construction, not by tolerance. */
#ifndef TANDEM_BACKEND_H
#define TANDEM_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model/config.h"
#include "model/tensor.h"
#include "tandem.h"

typedef struct td_backend td_backend;
struct td_sampler;     /* sample/sampler.h */
struct td_sample_call;

/* KV element storage: td_kv_dtype (tandem.h), never TD_KV_AUTO here. F32 is
 * exact; BF16 halves the memory; FP8 is e4m3 with one f32 scale per (token,
 * kv head) = absmax / 448, computed when the row is written (no calibration
 * data; a per-token scale cannot overflow). */

/* Tokens per KV block. */
#define TD_KV_BLOCK 16

/* One paged KV layer as the ops see it (host struct, backend arrays). */
typedef struct td_kv_view {
    td_kv_dtype store;
    int kv_dim, head_dim;  /* kv_dim = kv heads x head_dim */
    void *k, *v;           /* [n_blocks][TD_KV_BLOCK][kv_dim] elements */
    float *ks, *vs;        /* fp8: [n_blocks][TD_KV_BLOCK][kv heads] scales; else NULL */
} td_kv_view;

/* Per-segment fields of a batch (td_batch.seg rows). */
enum {
    TD_SEG_POS0,    /* position of the segment's first token */
    TD_SEG_N,       /* tokens in the segment */
    TD_SEG_ROW0,    /* its first row in the batch */
    TD_SEG_BT,      /* offset of its block table in td_batch.block_tables */
    TD_SEG_SLOT,    /* live DeltaNet state slot of its sequence */
    TD_SEG_CKPT,    /* 1: token t's state goes to slot (SLOT + 1 + t) % NSLOTS; 0: updated in place */
    TD_SEG_NSLOTS,  /* state slots its sequence owns */
    TD_SEG_FIELDS
};

/* One forward's batch description: M token rows in n_seg segments (runs of
 * consecutive tokens of one sequence), filled on the host and handed to the
 * backend in one upload. Arrays are backend memory. */
typedef struct td_batch {
    int M, n_seg;
    const int32_t *tokens;       /* [M] token ids */
    const int32_t *row_seg;      /* [M] segment of each row */
    const int32_t *seg;          /* [n_seg][TD_SEG_FIELDS] */
    const int32_t *block_tables; /* KV slot s of segment i: block block_tables[seg.BT + s / TD_KV_BLOCK] */
    float *const *state;         /* [n_seg] DeltaNet state pool of each segment's sequence:
                                    [NSLOTS][n_lin][conv_len*conv_dim + nv*dk*dv] floats */
} td_batch;

/* The DeltaNet weights one op needs (backend pointers). */
typedef struct td_gdn_params {
    const float *conv;     /* [conv_dim, K] depthwise causal kernel */
    const float *dt_bias;  /* [nv] */
    const float *neg_A;    /* [nv] = -exp(A_log) */
    const float *norm;     /* [dv] */
} td_gdn_params;

typedef struct td_backend_counters {
    uint64_t uploads, upload_bytes;     /* host -> backend */
    uint64_t downloads, download_bytes; /* backend -> host */
    uint64_t graph_captures, graph_replays, graph_evictions; /* graph_run: captured (and run once), launched again, dropped */
    uint64_t graph_eager;               /* td_bk_graph calls that ran fn directly (no graph_run, or eager) */
    uint64_t weight_copy_bytes;         /* CPU: weight bytes weight_load copied into huge pages (copy_weights) */
} td_backend_counters;

/* fill_random: what each element is. */
typedef enum { TD_FILL_UNIFORM = 0, TD_FILL_CONST = 1 } td_fill_mode;

typedef struct td_backend_ops {
    const char *name;
    /* ---- memory ---- */
    void *(*alloc)(td_backend *b, size_t bytes);  /* zeroed; NULL when out of memory */
    void (*free)(td_backend *b, void *p);          /* NULL is a no-op */
    void (*upload)(td_backend *b, void *dst, const void *src, size_t bytes);
    void (*download)(td_backend *b, void *dst, const void *src, size_t bytes);
    void (*copy)(td_backend *b, void *dst, const void *src, size_t bytes);   /* within the backend; may overlap */
    void (*fill0)(td_backend *b, void *dst, size_t bytes);
    /* dst[r*dst_ld + i] = src[r*src_ld + i], i < width, r < rows (floats; no overlap) */
    void (*copy_rows)(td_backend *b, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t width, int rows);
    /* Waits for every op issued so far (the CPU runs ops synchronously). */
    void (*sync)(td_backend *b);
    /* A read-only backend copy of `bytes` of host weights (CPU: the host
     * pointer itself, or with copy_weights a copy in huge pages); NULL when out
     * of memory. weight_free undoes it. */
    const void *(*weight_load)(td_backend *b, const void *host, size_t bytes);
    void (*weight_free)(td_backend *b, const void *dev);
    /* n elements of dtype (F32, BF16, F8_E4M3, NVFP4: n even, n/2 bytes; Q8: its int8 data) at dst, element i a
     * pure function of (seed, i) (backend/fill_random.h): TD_FILL_UNIFORM uniform in
     * [-value, value), TD_FILL_CONST every element `value`, rounded to the dtype. Every backend
     * writes the same bytes: weights generated in backend memory (td_model_random). */
    void (*fill_random)(td_backend *b, void *dst, td_dtype dtype, size_t n, uint64_t seed, td_fill_mode mode, float value);

    /* ---- compute (backend pointers unless stated) ---- */
    /* y[M,N] = x[M,K] · W[N,K]^T ; W in any supported weight dtype. */
    void (*matmul)(td_backend *b, const td_tensor *W, const float *x, int M, float *y);
    /* y[m,:] = x[m,:] * rsqrt(mean(x^2) + eps) * w   (w holds 1+w for zero-centred norms) */
    void (*rmsnorm)(td_backend *b, float *y, const float *x, const float *w, int M, int n, float eps);
    /* out[m, :] = embedding row tokens[m] (tokens: backend int32 [M]) */
    void (*embed)(td_backend *b, const td_tensor *E, const int32_t *tokens, int M, float *out);
    /* y[i] += x[i], i < n */
    void (*add)(td_backend *b, float *y, const float *x, size_t n);
    /* a[i] = silu(a[i]) * u[i], i < n */
    void (*silu_mul)(td_backend *b, float *a, const float *u, size_t n);
    /* Attention prep for the rows of bt: q[m] = rope(rmsnorm(q part of qg[m]) * qn) per head,
     * gate[m] = gate part of qg[m] (NULL without an output gate), k[m] normed with kn and
     * roped in place, then K/V rows stored in kv at slot pos + shift. qg [M, nh*hd*(gate?2:1)],
     * k, v [M, kv_dim], q, gate [M, nh*hd]; inv_freq [rot/2]. */
    void (*attn_prep)(td_backend *b, const td_config *g, const td_batch *bt, const float *qg, float *k, const float *v,
                      const float *qn, const float *kn, const float *inv_freq, float *q, float *gate, const td_kv_view *kv,
                      int shift);
    /* Causal GQA attention of every row over its sequence's KV (positions 0..pos, at slots
     * + shift), exact two-pass softmax; out[m, head] *= sigmoid(gate) when gate != NULL. */
    void (*attention)(td_backend *b, const td_config *g, const td_batch *bt, const float *q, const float *gate,
                      const td_kv_view *kv, int shift, float *out);
    /* DeltaNet layer `lin` (index among DeltaNet layers): depthwise causal conv + silu of
     * qkv [M, conv_dim] into conv_out, reading the conv state of slot SLOT and writing it
     * back (in place, or per token into the checkpoint slots). */
    void (*gdn_conv)(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                     const float *qkv, float *conv_out);
    /* The gated delta rule over conv_out, z [M, nv*dv], beta/alpha inputs b_in, a_in [M, nv],
     * into o [M, nv*dv] (gated RMSNorm applied); recurrent state as gdn_conv. chunk > 1:
     * prompt segments without checkpoints in chunks of that many tokens (equal up to rounding). */
    void (*gdn_recur)(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                      const float *conv_out, const float *z, const float *b_in, const float *a_in, float *o, int chunk);
    /* KV row `row` (= block * TD_KV_BLOCK + offset) of one layer: store k, v [kv_dim]
     * (converted to kv->store), or load K (which 0) or V (1) as f32 into out [kv_dim]. */
    void (*kv_store)(td_backend *b, const td_kv_view *kv, int row, const float *k, const float *v);
    void (*kv_load)(td_backend *b, const td_kv_view *kv, int row, int which, float *out);
    /* out[r] = argmax_i x[r*n + i] (lowest index on ties), r < rows; out: backend int32 */
    void (*argmax)(td_backend *b, const float *x, int rows, int n, int32_t *out);
    /* One call of a request's sampler (sample/sampler.h td_sample_call: sample, greedy,
     * probabilities, draw, draft argmax, count an accepted token, the rejection test, the
     * residual draw) on logits / probability rows and sampler arrays in backend memory; the
     * sampler's parameters and RNG state are host values that travel with the call.
     * Returns the token id or the test's 0/1. The CPU op is td_sampler_run. */
    int32_t (*sample)(td_backend *b, struct td_sampler *s, const struct td_sample_call *c);
    /* CPU backends only (NULL on a device): fn(ctx, i) for i in [0, n) on the backend's
     * threads, on host memory (the kernels benchmark's bandwidth probe). */
    void (*parallel_for)(td_backend *b, int n, void (*fn)(void *ctx, int i), void *ctx);
    /* Optional (NULL: td_bk_graph calls fn(ctx) itself). Runs fn(ctx) as a replayed graph:
     * the first time this exact key (key_len bytes, compared whole) is seen, the ops fn issues
     * are captured instead of run, and the graph is then launched; later calls with the same
     * key launch the graph again and do not call fn. So fn must issue only compute ops and
     * copies (no alloc, free, upload, download, sync or sample) whose host arguments, buffer
     * pointers included, are a pure function of the key: every per-step value (tokens,
     * positions, block tables, state slots) is read by the kernels from backend memory.
     * TD_ERR_UNSUPPORTED when a capture fails (the caller then runs fn eagerly). */
    int (*graph_run)(td_backend *b, const void *key, size_t key_len, void (*fn)(void *ctx), void *ctx, td_err *err);
} td_backend_ops;

struct td_backend {
    const td_backend_ops *ops;
    void *impl;
    int n_threads;
    int isa; /* CPU: the td_isa its matmul kernels use (backend/cpu/kernels.h); the best the CPU has at
                creation, and one the CPU has whoever sets it (td_kernels_have_isa) */
    int tune; /* CPU: the td_tune of its matmul kernels (backend/cpu/kernels.h): this CPU's at creation; any
                 td_tune gives the same bits */
    int precision; /* td_precision (tandem.h): the matmul activations; CPU BF16 needs AVX-512 BF16; INT8 applies to q8 weights */
    bool batch_invariant; /* CUDA: every kernel keeps its fixed reduction order (td_engine_opts.batch_invariant);
                             false (the default) lets prefill matmuls use tensor cores. Set before the first
                             alloc. The CPU and guard backends are batch-invariant whatever it says. */
    bool copy_weights; /* CPU: weight_load copies tensors into transparent huge pages (when the kernel
                          offers them) instead of using the host pointer (td_engine_opts.mmap_weights off).
                          Set before the first weight_load. Other backends copy to the device anyway. */
    td_backend_counters counters;
    void (*destroy)(td_backend *b);
};

int td_backend_cpu_create(int n_threads, td_backend **out, td_err *err);
/* The guard backend (tests): the CPU ops, but all backend memory is PROT_NONE
 * except while one of its own ops runs, so host code that touches
 * activations, KV or state crashes. */
int td_backend_guard_create(int n_threads, td_backend **out, td_err *err);
/* The CUDA backend (backend/cuda, built with make CUDA=1): the ops on device 0
 * and one stream. TD_ERR_UNSUPPORTED with "no CUDA device: ..." when there is
 * no device or driver. */
int td_backend_cuda_create(int n_threads, td_backend **out, td_err *err);
/* Free and total bytes of a CUDA backend's device (cudaMemGetInfo), for the
 * planner; TD_ERR_ARG when b is not a CUDA backend, TD_ERR_UNSUPPORTED in a
 * build without CUDA. */
int td_backend_cuda_mem_info(td_backend *b, size_t *free_bytes, size_t *total_bytes);
/* Bytes a CUDA backend's sample op has moved between host and device so far
 * (rows, arrays and results: the traffic td_backend.counters leave out); 0
 * for any other backend. */
uint64_t td_backend_cuda_sample_bytes(td_backend *b);
/* The CUDA backend's graph cache (graph_run): graphs held, their nodes, and
 * the device memory their instantiations took (cudaMemGetInfo before and
 * after each). TD_ERR_ARG for another backend, TD_ERR_UNSUPPORTED without CUDA. */
int td_backend_cuda_graph_info(td_backend *b, int *graphs, size_t *nodes, size_t *bytes);
/* The CUDA fast mode's GEMM (batch_invariant false): matmuls of more than 16
 * rows of BF16 weights (128 of other dtypes) go to cuBLAS (BF16 tensor cores, f32 accumulation) through staging
 * buffers of these sizes, made once (backend/cuda/cuda_blas.cu). The planner
 * counts TD_CUDA_GEMM_BYTES on a CUDA device in that mode. */
#define TD_CUDA_GEMM_WS_BYTES (32ull << 20) /* cuBLAS workspace */
#define TD_CUDA_GEMM_W_BYTES (64ull << 20)  /* one chunk of weight rows, dequantized to BF16 */
#define TD_CUDA_GEMM_X_BYTES (32ull << 20)  /* one chunk of activation rows, rounded to BF16 */
/* The fast mode's split attention (backend/cuda/cuda_attn.cu): one counter per
 * (row, KV head) for up to 128 rows of TD_CUDA_ATTN_MAX_HEADS KV heads (its partials
 * live in the weight staging buffer). */
#define TD_CUDA_ATTN_MAX_HEADS 1024
#define TD_CUDA_ATTN_COUNTER_BYTES (128ull * TD_CUDA_ATTN_MAX_HEADS * 4)
#define TD_CUDA_GEMM_BYTES (TD_CUDA_GEMM_WS_BYTES + TD_CUDA_GEMM_W_BYTES + TD_CUDA_GEMM_X_BYTES + TD_CUDA_ATTN_COUNTER_BYTES)
/* Whether a CUDA backend's fast GEMM is set up (*on: cuBLAS loaded, buffers
 * made) and how many cuBLAS GEMM calls it has issued. TD_ERR_ARG for another
 * backend, TD_ERR_UNSUPPORTED without CUDA. */
int td_backend_cuda_gemm_info(td_backend *b, int *on, uint64_t *calls);
/* The CUDA fast mode's cuBLASLt paths (backend/cuda/cuda_lt.cu). sm: the
 * device's compute capability x 10 + minor. on[0] / on[1] / on[2]: the FP8
 * per-tensor / NVFP4 / FP8 128x128-block and per-channel (sm_90) path is usable (set up, not refused
 * by the heuristic); calls[]: cublasLtMatmul calls each issued. TD_ERR_ARG for
 * another backend, TD_ERR_UNSUPPORTED without CUDA. */
int td_backend_cuda_lt_info(td_backend *b, int *sm, int on[3], uint64_t calls[3]);
/* One line on a CUDA backend's matmul mode (batch-invariant; fast with cuBLAS;
 * fast but cuBLAS missing), a static string; NULL for any other backend. */
const char *td_backend_cuda_mode(td_backend *b);
/* Tests: the fast GEMM uses at most w_bytes / x_bytes of its weight and
 * activation buffers (0: all of them), so that small matrices take several
 * chunks. TD_ERR_ARG for another backend or a size over the buffer's. */
int td_backend_cuda_gemm_caps(td_backend *b, size_t w_bytes, size_t x_bytes);
/* By name: "cpu", "guard" or "cuda" (a clear error when this build or
 * machine has no CUDA). */
int td_backend_create(const char *name, int n_threads, td_backend **out, td_err *err);
void td_backend_free(td_backend *b);

/* Counted host <-> backend transfers: the only way core code moves data. */
static inline void td_bk_upload(td_backend *b, void *dst, const void *src, size_t n) {
    b->counters.uploads++;
    b->counters.upload_bytes += n;
    b->ops->upload(b, dst, src, n);
}
static inline void td_bk_download(td_backend *b, void *dst, const void *src, size_t n) {
    b->counters.downloads++;
    b->counters.download_bytes += n;
    b->ops->download(b, dst, src, n);
}

/* A sampler call; its result (an id or a flag) counts as a 4-byte download. */
static inline int32_t td_bk_sample(td_backend *b, struct td_sampler *s, const struct td_sample_call *c) {
    b->counters.downloads++;
    b->counters.download_bytes += 4;
    return b->ops->sample(b, s, c);
}

/* Graphs a backend's graph_run keeps at most (the CUDA cache; the planner
 * counts this many). */
#define TD_GRAPH_CACHE_MAX 64

/* Runs fn(ctx) through the backend's graph_run when it has one and `eager`
 * is false, else directly (the CPU, the guard, --enforce-eager). A failed
 * capture falls back to running fn. */
static inline int td_bk_graph(td_backend *b, bool eager, const void *key, size_t key_len, void (*fn)(void *ctx), void *ctx, td_err *err) {
    if (!eager && b->ops->graph_run) {
        int rc = b->ops->graph_run(b, key, key_len, fn, ctx, err);
        if (rc != TD_ERR_UNSUPPORTED) return rc;
    }
    b->counters.graph_eager++;
    fn(ctx);
    return TD_OK;
}

/* Bytes of a weight tensor's data and of its scale array (0 when none). */
size_t td_tensor_data_bytes(const td_tensor *t);
size_t td_tensor_scales_bytes(const td_tensor *t);
/* dev = host with data and scales loaded into the backend (weight_load);
 * TD_ERR_NOMEM when it cannot; td_bk_tensor_free undoes it. */
int td_bk_tensor_load(td_backend *b, const td_tensor *host, td_tensor *dev, td_err *err);
void td_bk_tensor_free(td_backend *b, td_tensor *dev);

#endif
