/* cuBLAS for the fast mode's prefill GEMM (cuda_matmul.cu td_cuda_gemm):
 * loading the library, the handle, its workspace and the two BF16 staging
 * buffers, made once per backend and freed with it.
 *
 * Why dlopen and not -lcublas: the toolkit ships cuBLAS only as a shared
 * library (libcublas.so.13, 54 MB, with libcublasLt.so.13, 540 MB), and a
 * tandem binary built where nvcc is found must still start on a machine that
 * has a driver but not those libraries (or no GPU at all: the CPU path). So
 * cudart stays static and cuBLAS is looked up when the fast mode first needs
 * it; when it is missing the backend says so once and every matmul runs on
 * the exact kernels (the batch-invariant path), which is correct, only slower
 * for prefill. Under cuemu (tests/cuemu) the emulator's own cuBLAS subset is
 * taken instead, so the same host logic (chunking, layouts, scales) is tested
 * on the CPU.
 *
 * Memory (td_backend.h TD_CUDA_GEMM_BYTES, counted by the planner): a 32 MiB
 * cuBLAS workspace (its documented recommendation for Hopper; set explicitly so
 * that graph capture never makes cuBLAS allocate), 64 MiB for one chunk of
 * dequantized weight rows and 32 MiB for one chunk of activation rows, both
 * BF16; and the split attention's 512 KiB of counters (cuda_attn.cu), made
 * here with the buffer that holds its partials. */
#include "backend/cuda/cuda_internal.cuh"
#ifndef TD_CUEMU
#include <dlfcn.h>
#endif

#ifdef TD_CUEMU
static int load_fns(td_cu_blas *f, char *why, size_t cap) {
    f->create = cublasCreate_v2;
    f->destroy = cublasDestroy_v2;
    f->set_stream = cublasSetStream_v2;
    f->set_workspace = cublasSetWorkspace_v2;
    f->set_math_mode = cublasSetMathMode;
    f->gemm_ex = cublasGemmEx;
    f->lib = NULL;
    (void)why; (void)cap;
    return 0;
}
#else
/* The first of lib.so.13 and lib.so that loads, or NULL with the reason in why. */
extern "C" void *td_cu_dlopen(const char *lib, const char *what, char *why, size_t cap) {
    char name[64];
    void *h = NULL;
    for (int i = 0; i < 2 && !h; i++) {
        snprintf(name, sizeof name, i ? "%s.so" : "%s.so.13", lib);
        h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        const char *e = dlerror();
        snprintf(why, cap, "cannot load %s (%s.so.13): %s", what, lib, e ? e : "not found");
    }
    return h;
}

static int load_fns(td_cu_blas *f, char *why, size_t cap) {
    void *h = td_cu_dlopen("libcublas", "cuBLAS", why, cap);
    if (!h) return -1;
    /* POSIX: a function pointer may travel through void * (dlsym) */
    *(void **)&f->create = dlsym(h, "cublasCreate_v2");
    *(void **)&f->destroy = dlsym(h, "cublasDestroy_v2");
    *(void **)&f->set_stream = dlsym(h, "cublasSetStream_v2");
    *(void **)&f->set_workspace = dlsym(h, "cublasSetWorkspace_v2");
    *(void **)&f->set_math_mode = dlsym(h, "cublasSetMathMode");
    *(void **)&f->gemm_ex = dlsym(h, "cublasGemmEx");
    if (!f->create || !f->destroy || !f->set_stream || !f->set_workspace || !f->set_math_mode || !f->gemm_ex) {
        snprintf(why, cap, "cuBLAS (libcublas.so.13) lacks cublasCreate_v2 / cublasGemmEx / cublasSetWorkspace_v2");
        dlclose(h);
        return -1;
    }
    f->lib = h;
    return 0;
}
#endif

/* Frees whatever of the handle, buffers and library is there (set-up failures, teardown). */
static void release(td_cuda *cu) {
    if (cu->blas_handle) cu->blas.destroy(cu->blas_handle);
    if (cu->gemm_ws) (void)cudaFree(cu->gemm_ws);
    if (cu->gemm_w) (void)cudaFree(cu->gemm_w);
    if (cu->gemm_x) (void)cudaFree(cu->gemm_x);
    if (cu->attn_counters) (void)cudaFree(cu->attn_counters);
#ifndef TD_CUEMU
    if (cu->blas.lib) dlclose(cu->blas.lib);
#endif
    cu->blas_handle = NULL;
    cu->gemm_ws = cu->gemm_w = cu->gemm_x = cu->attn_counters = NULL;
    cu->blas.lib = NULL;
}

/* The staging buffers and the handle, or state TD_CU_GEMM_OFF with the reason
 * printed once. Called outside graph capture only (alloc, weight_load and an
 * eager matmul call it). */
extern "C" void td_cuda_gemm_prepare(td_backend *b) {
    td_cuda *cu = td_cu(b);
    if (b->batch_invariant || cu->gemm_state != TD_CU_GEMM_UNTRIED) return;
    TD_CU_NOT_CAPTURING(cu, "the fast GEMM's set-up");
    char why[256] = "";
    td_cu_blas *f = &cu->blas;
    cu->gemm_state = TD_CU_GEMM_OFF;
    if (load_fns(f, why, sizeof why)) goto off;
    if (f->create(&cu->blas_handle) != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "cublasCreate failed");
        cu->blas_handle = NULL;
        goto off;
    }
    if (cudaMalloc(&cu->gemm_ws, TD_CUDA_GEMM_WS_BYTES) != cudaSuccess ||
        cudaMalloc(&cu->gemm_w, TD_CUDA_GEMM_W_BYTES) != cudaSuccess ||
        cudaMalloc(&cu->gemm_x, TD_CUDA_GEMM_X_BYTES) != cudaSuccess ||
        cudaMalloc(&cu->attn_counters, TD_CUDA_ATTN_COUNTER_BYTES) != cudaSuccess ||
        cudaMemsetAsync(cu->attn_counters, 0, TD_CUDA_ATTN_COUNTER_BYTES, cu->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, sizeof why, "no device memory for its %.1f MiB of buffers", (double)TD_CUDA_GEMM_BYTES / 1048576.0);
        goto off;
    }
    if (f->set_stream(cu->blas_handle, cu->stream) != CUBLAS_STATUS_SUCCESS ||
        f->set_workspace(cu->blas_handle, cu->gemm_ws, TD_CUDA_GEMM_WS_BYTES) != CUBLAS_STATUS_SUCCESS ||
        f->set_math_mode(cu->blas_handle, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "cublasSetStream / cublasSetWorkspace failed");
        goto off;
    }
    if (!cu->gemm_w_cap) cu->gemm_w_cap = TD_CUDA_GEMM_W_BYTES;
    if (!cu->gemm_x_cap) cu->gemm_x_cap = TD_CUDA_GEMM_X_BYTES;
    cu->gemm_state = TD_CU_GEMM_ON;
    td_cuda_lt_prepare(cu);
    return;
off:
    release(cu);
    fprintf(stderr, "tandem: cuda: %s; prefill runs on the exact kernels (as --batch-invariant)\n", why);
}

extern "C" void td_cuda_gemm_free(td_cuda *cu) {
    td_cuda_lt_free(cu);
    release(cu);
    cu->gemm_state = TD_CU_GEMM_UNTRIED;
}

extern "C" int td_backend_cuda_gemm_info(td_backend *b, int *on, uint64_t *calls) {
    *on = 0;
    *calls = 0;
    if (!b || !b->ops || strcmp(b->ops->name, "cuda")) return TD_ERR_ARG;
    *on = td_cu(b)->gemm_state == TD_CU_GEMM_ON;
    *calls = td_cu(b)->gemm_calls;
    return TD_OK;
}

extern "C" int td_backend_cuda_gemm_caps(td_backend *b, size_t w_bytes, size_t x_bytes) {
    if (!b || !b->ops || strcmp(b->ops->name, "cuda") || w_bytes > TD_CUDA_GEMM_W_BYTES || x_bytes > TD_CUDA_GEMM_X_BYTES)
        return TD_ERR_ARG;
    td_cu(b)->gemm_w_cap = w_bytes ? w_bytes : TD_CUDA_GEMM_W_BYTES;
    td_cu(b)->gemm_x_cap = x_bytes ? x_bytes : TD_CUDA_GEMM_X_BYTES;
    return TD_OK;
}

extern "C" const char *td_backend_cuda_mode(td_backend *b) {
    if (!b || !b->ops || strcmp(b->ops->name, "cuda")) return NULL;
    if (b->batch_invariant) return "batch-invariant (every kernel in its fixed order: greedy at any depth = depth 0)";
    td_cuda *cu = td_cu(b);
    if (cu->gemm_state != TD_CU_GEMM_ON) return "fast, but cuBLAS is unavailable: every matmul on the exact kernels";
    bool f8 = cu->lt_state[TD_CU_LT_FP8] == TD_CU_GEMM_ON, f4 = cu->lt_state[TD_CU_LT_FP4] == TD_CU_GEMM_ON;
    snprintf(cu->mode_line, sizeof cu->mode_line,
             "fast (prompt chunks and large batches, over 16 rows of BF16 weights or 128 of others, on cuBLAS BF16 tensor cores%s%s%s; "
             "--batch-invariant: exact kernels)",
             f8 || f4 ? ", with " : "", f8 ? (f4 ? "FP8 and NVFP4" : "FP8") : (f4 ? "NVFP4" : ""),
             f8 || f4 ? " weights on their own tensor cores (activations quantized alike)" : "");
    return cu->mode_line;
}
