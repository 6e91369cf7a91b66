/* CUDA backend: the td_backend_ops table on one device and one stream.
 * This file: creation, memory ops, mem_info. The compute ops live by concern
 * in cuda_matmul.cu, cuda_ops.cu, cuda_attn.cu, cuda_gdn.cu, the sample op in
 * cuda_sample.cu.
 *
 * Memory: alloc is cudaMalloc + an async memset on the stream (zeroed, in
 * stream order before any op that uses it); upload / download are
 * cudaMemcpyAsync on the stream (download then waits for the stream, so it
 * sees every op issued before it; an upload from pageable memory returns
 * once the source is staged, so the caller may reuse it); copy is a
 * device-to-device copy (overlapping ranges go through a scratch buffer);
 * weight_load is a cudaMalloc + synchronous copy of the host weights. */
#include "backend/cuda/cuda_internal.cuh"

extern "C" void td_cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "%s:%d: CUDA error: %s: %s\n", file, line, what, cudaGetErrorString(e));
    abort();
}

/* ---- memory -------------------------------------------------------------- */

static void *cu_alloc(td_backend *b, size_t bytes) {
    TD_CU_NOT_CAPTURING(td_cu(b), "alloc");
    td_cuda_gemm_prepare(b); /* once: the fast mode's buffers before the engine's (never inside a capture) */
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it: out of memory is an answer (NULL), not a broken context */
        return NULL;
    }
    TD_CU(e);
    TD_CU(cudaMemsetAsync(p, 0, n, td_cu(b)->stream));
    return p;
}

static void cu_free(td_backend *b, void *p) {
    TD_CU_NOT_CAPTURING(td_cu(b), "free");
    if (p) TD_CU(cudaFree(p)); /* cudaFree waits for the device to finish using it */
}

static void cu_upload(td_backend *b, void *dst, const void *src, size_t n) {
    TD_CU_NOT_CAPTURING(td_cu(b), "upload");
    if (n) TD_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, td_cu(b)->stream));
}

static void cu_download(td_backend *b, void *dst, const void *src, size_t n) {
    td_cuda *cu = td_cu(b);
    TD_CU_NOT_CAPTURING(cu, "download");
    if (!n) return;
    TD_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cu->stream));
    TD_CU(cudaStreamSynchronize(cu->stream));
}

/* Scratch device buffer of at least n bytes (grown; stream-ordered use only). */
static void *scratch(td_cuda *cu, size_t n) {
    if (cu->scratch_bytes >= n) return cu->scratch;
    TD_CU_NOT_CAPTURING(cu, "an overlapping copy (its scratch buffer grows)");
    /* a graph that copied through the old buffer would replay on freed memory
       (graph keys do not know this buffer): drop them, they are captured again */
    if (cu->scratch) {
        TD_CU(cudaStreamSynchronize(cu->stream)); /* none of them is still running */
        td_cuda_graphs_free(cu);
        TD_CU(cudaFree(cu->scratch));
    }
    cu->scratch = NULL;
    cu->scratch_bytes = 0;
    TD_CU(cudaMalloc(&cu->scratch, n));
    cu->scratch_bytes = n;
    return cu->scratch;
}

static void cu_copy(td_backend *b, void *dst, const void *src, size_t n) {
    if (!n || dst == src) return;
    td_cuda *cu = td_cu(b);
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + n && s < d + n) { /* overlap: cudaMemcpy does not allow it */
        void *t = scratch(cu, n);
        TD_CU(cudaMemcpyAsync(t, src, n, cudaMemcpyDeviceToDevice, cu->stream));
        TD_CU(cudaMemcpyAsync(dst, t, n, cudaMemcpyDeviceToDevice, cu->stream));
        return;
    }
    TD_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cu->stream));
}

static void cu_fill0(td_backend *b, void *dst, size_t n) {
    if (n) TD_CU(cudaMemsetAsync(dst, 0, n, td_cu(b)->stream));
}

static void cu_copy_rows(td_backend *b, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t width, int rows) {
    if (rows <= 0 || !width) return;
    TD_CU(cudaMemcpy2DAsync(dst, dst_ld * sizeof(float), src, src_ld * sizeof(float), width * sizeof(float), (size_t)rows,
                            cudaMemcpyDeviceToDevice, td_cu(b)->stream));
}

static void cu_sync(td_backend *b) {
    TD_CU_NOT_CAPTURING(td_cu(b), "sync");
    TD_CU(cudaStreamSynchronize(td_cu(b)->stream));
}

static const void *cu_weight_load(td_backend *b, const void *host, size_t bytes) {
    td_cuda_gemm_prepare(b);
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return NULL;
    }
    TD_CU(e);
    td_cuda *cu = td_cu(b);
    if (bytes) TD_CU(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, cu->stream));
    TD_CU(cudaStreamSynchronize(cu->stream)); /* the host weights may be unmapped after load */
    return p;
}

static void cu_weight_free(td_backend *b, const void *dev) { cu_free(b, (void *)dev); }

/* ---- the table ----------------------------------------------------------- */

static const td_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .fill0 = cu_fill0,
    .copy_rows = cu_copy_rows,
    .sync = cu_sync,
    .weight_load = cu_weight_load,
    .weight_free = cu_weight_free,
    .fill_random = td_cuda_fill_random,
    .matmul = td_cuda_matmul,
    .rmsnorm = td_cuda_rmsnorm,
    .embed = td_cuda_embed,
    .add = td_cuda_add,
    .silu_mul = td_cuda_silu_mul,
    .attn_prep = td_cuda_attn_prep,
    .attention = td_cuda_attention,
    .gdn_conv = td_cuda_gdn_conv,
    .gdn_recur = td_cuda_gdn_recur,
    .kv_store = td_cuda_kv_store,
    .kv_load = td_cuda_kv_load,
    .argmax = td_cuda_argmax,
    .sample = td_cuda_sample,
    .parallel_for = NULL, /* a device has no host thread pool */
    .graph_run = td_cuda_graph_run,
};

static void cuda_destroy(td_backend *b) {
    td_cuda *cu = td_cu(b);
    if (!cu) return;
    /* teardown: report but do not abort (the process may be exiting after a device error) */
    cudaError_t e = cudaStreamSynchronize(cu->stream);
    if (e != cudaSuccess) fprintf(stderr, "cuda backend: at teardown: %s\n", cudaGetErrorString(e));
    td_cuda_graphs_free(cu);
    td_cuda_gemm_free(cu);
    if (cu->scratch) (void)cudaFree(cu->scratch);
    if (cu->pin) (void)cudaFreeHost(cu->pin);
    (void)cudaStreamDestroy(cu->stream);
    free(cu);
    b->impl = NULL;
}

extern "C" int td_backend_cuda_create(int n_threads, td_backend **out, td_err *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "no CUDA device: %s", cudaGetErrorString(e));
    }
    if (n <= 0) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "no CUDA device: cudaGetDeviceCount found none");
    td_cuda *cu = (td_cuda *)TD_CALLOC(err, 1, sizeof *cu);
    if (!cu) return TD_ERR_NOMEM;
    td_backend *b = (td_backend *)TD_CALLOC(err, 1, sizeof *b);
    if (!b) { free(cu); return TD_ERR_NOMEM; }
    cu->device = 0;
    if ((e = cudaSetDevice(cu->device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(cu);
        free(b);
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "CUDA device 0 unusable: %s", cudaGetErrorString(e));
    }
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cu->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, cu->device) != cudaSuccess)
        major = minor = 0; /* unknown: no cuBLASLt path is tried (cuda_lt.cu) */
    cu->sm = major * 10 + minor;
    /* TD_CUDA_ATTN_SPLIT=P (tests, A/B): the split attention's partition, 1..8192 positions (a
       partition is one block's serial walk); 0 turns the split off */
    const char *split = getenv("TD_CUDA_ATTN_SPLIT");
    cu->attn_split_pos = split && atoi(split) >= 0 && atoi(split) <= 8192 ? atoi(split) : 2048;
    /* TD_CUDA_ATTN_TILE (A/B, tests): the fast mode's prompt-chunk attention, 0 the per-row kernel, 1 f32 tiles
       on CUDA cores, 2 (default) bf16 tiles on tensor cores where the device has them */
    const char *tile = getenv("TD_CUDA_ATTN_TILE");
    cu->attn_tile = tile && (!strcmp(tile, "0") || !strcmp(tile, "1")) ? atoi(tile) : TD_CU_ATTN_TILE_MMA;
    b->ops = &cuda_ops;
    b->impl = cu;
    b->n_threads = n_threads > 0 ? n_threads : 1; /* host threads: none used by the ops */
    b->isa = 0;
    b->destroy = cuda_destroy;
    *out = b;
    return TD_OK;
}

extern "C" int td_backend_cuda_mem_info(td_backend *b, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (!b || b->ops != &cuda_ops) return TD_ERR_ARG;
    TD_CU(cudaSetDevice(td_cu(b)->device));
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? TD_OK : TD_ERR_INTERNAL;
}

extern "C" uint64_t td_backend_cuda_sample_bytes(td_backend *b) { return b && b->ops == &cuda_ops ? td_cu(b)->sample_bytes : 0; }
