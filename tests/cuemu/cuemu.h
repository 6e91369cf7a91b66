/* cuemu: the subset of CUDA that src/backend/cuda uses, run on the CPU, so
 * that the CUDA backend's kernels (their indexing, reductions, barriers,
 * warp shuffles and arithmetic) are tested on machines without a GPU
 * (`make cuemu`: build-cuemu/, tests/cuemu/README.md).
 *
 * What it is: g++ compiles the .cu files as C++ with this header in place of
 * cuda_runtime.h / cuda_fp16.h. A kernel launch (TD_CU_KERNEL in
 * cuda_internal.cuh) runs the grid's blocks one after another; the threads
 * of a block are fibers on the launching thread, each run until it
 * reaches a barrier (__syncthreads: the whole block; a warp shuffle: its 32
 * lanes) or returns. __shared__ variables are function statics: one copy,
 * which is the block's, since one block runs at a time. Device memory is host
 * memory; the stream is the calling thread (every call completes before it
 * returns). Float arithmetic is the host's IEEE single precision with no
 * contraction (-ffp-contract=off, as nvcc -fmad=false); __fmaf_rn is fmaf.
 *
 * What it is not: a GPU. It says nothing of speed, of races between threads
 * (fibers switch only at barriers, so a missing __syncthreads goes unseen
 * unless TD_CUEMU_ORDER=reverse shows it), of the memory model, or of device
 * libm (expf, sinf, ... are glibc's, within the ulps CUDA documents but
 * not always the same bits). A kernel that passes here has still to run on a
 * device (scripts/gpu-check.sh). Not thread-safe across launching threads
 * beyond this: each OS thread has its own scheduler (thread_local). */
#ifndef TANDEM_CUEMU_H
#define TANDEM_CUEMU_H
#ifndef __cplusplus
#error "cuemu.h is C++ (the .cu files compiled by g++)"
#endif
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <functional>

#define TD_CUEMU_MAX_THREADS 1024

/* ---- qualifiers ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__
#define __align__(n) __attribute__((aligned(n)))

/* ---- types ---- */
struct alignas(16) float4 { float x, y, z, w; }; /* CUDA's vector types: one 16-byte load */
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorIllegalState = 401,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
} cudaError_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;
typedef struct td_cuemu_stream *cudaStream_t;
#define cudaStreamNonBlocking 0x01

/* Stream capture and graphs: while a stream captures, what is issued on it
 * (launches, device-to-device copies, memsets) is recorded, not run, and a
 * graph launch runs the record in order. As CUDA does, a capture refuses
 * (cudaErrorStreamCaptureUnsupported, and the capture is invalidated) a
 * synchronize of the stream, a copy from or to host memory on it, and
 * cudaMalloc / cudaFree while it captures in a mode other than relaxed. */
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
typedef struct td_cuemu_graph *cudaGraph_t;
typedef struct td_cuemu_graph_exec *cudaGraphExec_t;
typedef struct td_cuemu_graph_node *cudaGraphNode_t;
bool td_cuemu_capturing(cudaStream_t s);
void td_cuemu_record(cudaStream_t s, std::function<void()> op);

struct __half {
    uint16_t x;
};

/* ---- the executing thread ---- */
struct td_cuemu_ids {
    dim3 thread, block, block_dim, grid_dim;
};
const td_cuemu_ids *td_cuemu_self(void);
#define threadIdx (td_cuemu_self()->thread)
#define blockIdx (td_cuemu_self()->block)
#define blockDim (td_cuemu_self()->block_dim)
#define gridDim (td_cuemu_self()->grid_dim)

void td_cuemu_syncthreads(void);
#define __syncthreads() td_cuemu_syncthreads()
/* The value of lane + delta of the lane's segment of `width` lanes (a power
 * of two <= 32), its own when that is past the segment's end. */
uint64_t td_cuemu_shfl_down_bits(uint64_t v, unsigned delta, int width);
/* The value of lane ^ mask within the lane's segment of `width` lanes (mask <
 * width: the partner is in the same segment). */
uint64_t td_cuemu_shfl_xor_bits(uint64_t v, unsigned mask, int width);
/* A shuffle of any value of at most 8 bytes through one of the above. */
template <class T> static inline T td_cuemu_shfl(uint64_t (*bits)(uint64_t, unsigned, int), T v, unsigned x, int width) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = bits(b, x, width);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}
/* every caller passes the full warp as the mask */
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    return td_cuemu_shfl(td_cuemu_shfl_down_bits, v, delta, width);
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, unsigned lane_mask, int width = 32) {
    return td_cuemu_shfl(td_cuemu_shfl_xor_bits, v, lane_mask, width);
}

/* Runs body() once per thread of the grid (see the top of this file), or,
 * while stream s captures, records that launch (body holds the kernel's
 * arguments by value). */
void td_cuemu_run(dim3 grid, dim3 block, void (*fn)(void *), void *ctx);

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, a warp-collective:
 * d += A B with A 16 x 16 and B 16 x 8 in bf16 and d 16 x 8 in f32, each lane
 * holding the fragments the PTX ISA lays out (lane = 4 groupID +
 * threadID_in_group; a: 4 registers of 2 bf16, the lower index in the low
 * half; b: 2; d: 4). Each element of D is c plus the 16 exact products summed
 * in f32 in k order (a tensor core's order is its own: the tolerance covers it). */
void td_cuemu_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);

template <class F> static inline void td_cuemu_launch(cudaStream_t s, dim3 grid, dim3 block, F body) {
    if (td_cuemu_capturing(s)) {
        td_cuemu_record(s, [=]() mutable { td_cuemu_run(grid, block, [](void *c) { (*(F *)c)(); }, &body); });
        return;
    }
    td_cuemu_run(grid, block, [](void *c) { (*(F *)c)(); }, &body);
}

/* ---- device intrinsics ---- */
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
/* Blocks run one after another: a block's writes are visible to the next without a fence. */
static inline void __threadfence(void) {}
/* One block runs at a time and its fibers switch only at barriers: a plain
 * read-modify-write is atomic here. */
static inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
[[noreturn]] static inline void __trap(void) {
    fprintf(stderr, "cuemu: __trap() in a kernel\n");
    abort();
}
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
static inline float __half2float(__half h) { /* exact: every f16 is a float */
    uint32_t s = (uint32_t)(h.x >> 15) << 31, e = (h.x >> 10) & 31, m = h.x & 1023;
    if (e == 31) return __uint_as_float(s | 0x7f800000u | m << 13);
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return s ? -v : v;
    }
    return __uint_as_float(s | (e + 112) << 23 | m << 13);
}

/* ---- runtime API (host) ---- */
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
/* The emulated device's compute capability: TD_CUEMU_SM (e.g. 90, 100, 120;
 * default 90, an H200's), read at each call. */
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s); /* nothing to set up here */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t g);

/* ---- cuBLAS: the subset the fast GEMM uses (cuda_blas.cu, cuda_matmul.cu) ----
 * cublasGemmEx takes only what the backend issues: A transposed, B not, both
 * BF16, C f32 with beta 0, compute 32F; anything else is
 * CUBLAS_STATUS_NOT_SUPPORTED. Its arithmetic is not the CPU's order (as a
 * tensor core's is not): each run of 16 products along k (one BF16 MMA's k)
 * is summed exactly (in double) and rounded to float, and those partial sums
 * are added in increasing k in float; then alpha times the sum. So a test
 * that expects the exact kernels' bits from the fast path fails here as it
 * would on a GPU. Recorded, not run, while the stream captures. */
typedef struct td_cuemu_blas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_INVALID_VALUE = 7,
               CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28, CUDA_R_4F_E2M1 = 33 } cudaDataType;
typedef cudaDataType cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasCreate_v2(cublasHandle_t *h);
cublasStatus_t cublasDestroy_v2(cublasHandle_t h);
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo);

/* ---- cuBLASLt: the subset of the quantized prefill GEMMs (cuda_lt.cu) ----
 * cublasLtMatmul takes what the backend issues: A transposed, B not, C = D
 * f32, compute and scale type 32F, beta 0, and A, B both e4m3 with
 * tensor-wide f32 scales (sm >= 89) or outer-vector ones (sm 90), both e4m3 with A's 128 x 128 block scales
 * ([ceil(m/128)][ceil(k/128) rounded up to 4], f32) and B's 1 x 128 ones
 * (block j of column c at j x n + c, n a multiple of 4; sm 90 only), or both
 * e2m1 with VEC16 ue4m3 block scales in the tiled layout cuBLAS documents
 * (sm >= 100); the heuristic returns no
 * algorithm for anything else (as a device without those kernels does), and
 * the call NOT_SUPPORTED. Arithmetic: each product of decoded values (times
 * both block scales for e2m1) is exact in double; runs of 32 along k are
 * summed in double and rounded to float, those added in increasing k in
 * float (for 128-blocks: each block's sum times both block scales, then
 * added); then the outer-vector scales and alpha. */
typedef struct td_cuemu_lt *cublasLtHandle_t;
typedef struct td_cuemu_lt_desc *cublasLtMatmulDesc_t;
typedef struct td_cuemu_lt_layout *cublasLtMatrixLayout_t;
typedef struct td_cuemu_lt_pref *cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2, CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31, CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
} cublasLtMatmulDescAttributes_t;
typedef enum { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 } cublasLtMatmulPreferenceAttributes_t;
typedef enum { CUBLASLT_POINTER_MODE_HOST = 0, CUBLASLT_POINTER_MODE_DEVICE = 1 } cublasLtPointerMode_t;
typedef enum {
    CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 = 1,
    CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4,
    CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5,
} cublasLtMatmulMatrixScale_t;
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t n);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int want, cublasLtMatmulHeuristicResult_t *res, int *got);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t al,
                              const void *B, cublasLtMatrixLayout_t bl, const void *beta, const void *C, cublasLtMatrixLayout_t cl,
                              void *D, cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                              cudaStream_t st);
#endif
