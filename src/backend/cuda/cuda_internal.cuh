/* Internal to the CUDA backend (the .cu files of src/backend/cuda): the impl struct that
 * hangs off td_backend.impl, error checking, and the device helpers the op
 * files share (element decoding, deterministic block reductions).
 *
 * Arithmetic: the .cu files are compiled with -fmad=false, so no multiply and
 * add is fused unless the code says so (__fmaf_rn in the matmul lanes, which
 * mirrors the CPU's AVX FMA). Every reduction has a fixed order that depends
 * only on the row it reduces (and the fixed block size), never on M or on the
 * rest of the batch: that is the backend's batch-invariance rule. */
#ifndef TANDEM_CUDA_INTERNAL_CUH
#define TANDEM_CUDA_INTERNAL_CUH
#ifdef TD_CUEMU /* the kernels run on the CPU (tests/cuemu, make cuemu) */
#include "cuemu.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
#include <math.h>
#include <string.h>
#include <stdint.h>
extern "C" {
#include "backend/backend.h"
#include "util/err.h"
}

/* One captured graph of the cache (cuda_graph.cu): its key bytes and the
 * instantiated executable. */
typedef struct td_cu_graph {
    unsigned char *key;
    size_t key_len;
    cudaGraphExec_t exec;
    uint64_t last_use;     /* graph clock at its last launch (least recently used is evicted) */
    size_t nodes;          /* kernel, copy and memset nodes */
    size_t bytes;          /* device memory cudaMemGetInfo lost across its instantiation */
} td_cu_graph;
enum { TD_CU_MAX_GRAPHS = TD_GRAPH_CACHE_MAX };

/* The cuBLAS entry points the fast GEMM uses (cuda_blas.cu: dlopen'd, or
 * cuemu's own under TD_CUEMU). */
typedef struct td_cu_blas {
    void *lib;
    cublasStatus_t (*create)(cublasHandle_t *h);
    cublasStatus_t (*destroy)(cublasHandle_t h);
    cublasStatus_t (*set_stream)(cublasHandle_t h, cudaStream_t s);
    cublasStatus_t (*set_workspace)(cublasHandle_t h, void *ws, size_t bytes);
    cublasStatus_t (*set_math_mode)(cublasHandle_t h, cublasMath_t mode);
    cublasStatus_t (*gemm_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                              int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                              cublasGemmAlgo_t algo);
} td_cu_blas;
enum { TD_CU_GEMM_UNTRIED, TD_CU_GEMM_ON, TD_CU_GEMM_OFF };

/* The cuBLASLt entry points of the quantized prefill GEMMs (cuda_lt.cu:
 * dlopen'd libcublasLt.so.13, or cuemu's own). */
typedef struct td_cu_lt {
    void *lib;
    cublasStatus_t (*create)(cublasLtHandle_t *h);
    cublasStatus_t (*destroy)(cublasLtHandle_t h);
    cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale);
    cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t d);
    cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n);
    cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld);
    cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t l);
    cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t *p);
    cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t p);
    cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n);
    cublasStatus_t (*heuristic)(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int want,
                                cublasLtMatmulHeuristicResult_t *res, int *got);
    cublasStatus_t (*matmul)(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t al,
                             const void *B, cublasLtMatrixLayout_t bl, const void *beta, const void *C, cublasLtMatrixLayout_t cl,
                             void *D, cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                             cudaStream_t st);
} td_cu_lt;
/* The cuBLASLt paths (cuda_lt.cu): FP8 e4m3 per-tensor weights x FP8
 * activations with per-row scales (sm_90) or one scale per chunk (sm_89,
 * sm_100+), NVFP4 weights x NVFP4 activations with 16-element block scales
 * (sm_100+), FP8 e4m3 weights with 128 x 128 block scales x FP8 activations
 * with 1 x 128 block scales (sm_90), and on that path too FP8 per-channel
 * weights (outer-vector weight scales, per-row activations; sm_90). A
 * refusal of either turns both off. */
enum { TD_CU_LT_FP8, TD_CU_LT_FP4, TD_CU_LT_FP8B, TD_CU_LT_N };

/* A quantized weight as the cuBLASLt paths take it. */
typedef struct td_cu_lt_weight {
    const uint8_t *data;   /* FP8: e4m3 [N, K]; NVFP4: e2m1 nibbles [N, K/2], low nibble first */
    const void *scales;    /* NVFP4: e4m3 [N, K/16]; FP8B: [ceil(N/bn), ceil(K/bk)] of scales_dtype; row-major as loaded */
    int scales_dtype;      /* FP8B: TD_DTYPE_F32 / BF16 / F16 */
    int64_t N, K, bn, bk;  /* bn, bk: FP8B's block */
    float mult;            /* W = value x mult: FP8 the tensor scale, NVFP4 the global multiplier, FP8B 1 */
} td_cu_lt_weight;

/* Everything the backend owns: no process-wide state. Ops run on the
 * engine's thread (as on the CPU and guard backends). */
/* The fast mode's attention for prompt chunks (TD_CUDA_ATTN_TILE=0/1/2, cuda_attn.cu): per-row kernel, f32 tiles on
   CUDA cores, bf16 tiles on tensor cores (the default; sm_80 and later, else the f32 tiles). */
enum { TD_CU_ATTN_TILE_OFF, TD_CU_ATTN_TILE_F32, TD_CU_ATTN_TILE_MMA };

typedef struct td_cuda {
    int device;
    cudaStream_t stream;     /* every op and transfer is issued here, in order */
    void *scratch;           /* copy() of overlapping ranges goes through it */
    size_t scratch_bytes;
    unsigned char *pin;      /* pinned host buffer of the sample op (phase 1: rows cross) */
    size_t pin_bytes;
    uint64_t sample_bytes;   /* bytes the sample op moved (not in td_backend.counters) */
    bool capturing;          /* inside graph_run's capture: ops that cannot be captured abort */
    td_cu_graph graphs[TD_CU_MAX_GRAPHS];
    int n_graphs;
    uint64_t graph_clock;
    int gemm_state;          /* TD_CU_GEMM_*: the fast mode's cuBLAS GEMM (cuda_blas.cu) */
    td_cu_blas blas;
    cublasHandle_t blas_handle;
    void *gemm_ws, *gemm_w, *gemm_x; /* workspace, BF16 weight chunk, BF16 activation chunk */
    void *attn_counters;     /* split attention's per-(row, KV head) counters, zero between launches (cuda_attn.cu) */
    uint64_t gemm_calls;     /* cublasGemmEx calls issued */
    size_t gemm_w_cap, gemm_x_cap; /* bytes of gemm_w / gemm_x used (tests shrink them) */
    int sm;                  /* compute capability x 10 + minor (89, 90, 100, 120, ...) */
    int attn_split_pos;      /* the fast mode's split attention: positions per partition (cuda_attn.cu) */
    int attn_tile;           /* TD_CU_ATTN_TILE_*: the fast mode's tiled attention for prompt chunks (cuda_attn.cu) */
    int lt_state[TD_CU_LT_N]; /* TD_CU_GEMM_*: each cuBLASLt path (cuda_lt.cu) */
    td_cu_lt lt;
    cublasLtHandle_t lt_handle;
    uint64_t lt_calls[TD_CU_LT_N]; /* cublasLtMatmul calls issued per path */
    char mode_line[256];     /* td_backend_cuda_mode's text */
} td_cuda;

/* A broken invariant: an op that a graph cannot hold (alloc, free, a host
 * transfer, sync, sample) was issued inside graph_run's region. */
#define TD_CU_NOT_CAPTURING(cu, what) \
    do { if ((cu)->capturing) { fprintf(stderr, "%s:%d: %s inside a graph capture\n", __FILE__, __LINE__, what); abort(); } } while (0)

static inline td_cuda *td_cu(td_backend *b) { return (td_cuda *)b->impl; }

/* Aborts with file:line and the CUDA error string when e is not cudaSuccess:
 * the void ops have no error return, and a failed kernel leaves the context
 * unusable (a broken invariant, as TD_ASSERT). */
extern "C" void td_cuda_check(cudaError_t e, const char *what, const char *file, int line);
#define TD_CU(call) td_cuda_check((call), #call, __FILE__, __LINE__)
#define TD_CU_LAUNCH(name) td_cuda_check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

/* Launches kernel k over grid blocks of `block` threads on stream st, with no
 * dynamic shared memory. One macro for every launch so that the cuemu build
 * (tests/cuemu) can run the same launches on the CPU. */
#ifdef TD_CUEMU
#define TD_CU_KERNEL(k, grid, block, st, ...) \
    do {                                      \
        td_cuemu_launch((st), dim3(grid), dim3(block), [=] { k(__VA_ARGS__); }); \
    } while (0)
#else
#define TD_CU_KERNEL(k, grid, block, st, ...) k<<<(grid), (block), 0, (st)>>>(__VA_ARGS__)
#endif

/* d += A B on a warp's tensor cores: mma.sync m16n8k16, bf16 in, f32
 * accumulate (sm_80 and later), fragments as the PTX ISA lays them out
 * (cuemu.h td_cuemu_mma_bf16_16816 restates them). The whole warp calls it. */
static __device__ __forceinline__ void td_cu_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef TD_CUEMU
    td_cuemu_mma_bf16_16816(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Grid size for n items of `per` each, at least 1 block. */
static inline unsigned td_cu_blocks(size_t n, unsigned per) { return n ? (unsigned)((n + per - 1) / per) : 1u; }

/* ---- element decoding (exact, as the CPU's) ---- */

static __device__ __forceinline__ float td_cu_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static __device__ __forceinline__ float td_cu_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* e4m3fn byte -> float (0x7f / 0xff NaN), as td_fp8_e4m3_to_f32 (weights). */
static __device__ __forceinline__ float td_cu_e4m3(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = __uint_as_float(0x7fc00000u);
    else if (e == 0) v = (float)m * 0x1p-9f;
    else v = __uint_as_float((uint32_t)(e + 120) << 23 | (uint32_t)m << 20); /* (1 + m/8) 2^(e-7) */
    return (b & 0x80) ? -v : v;
}

/* e4m3 byte of the KV cache -> float, as ops_attn.c e4m3_to_f32 (no NaN:
 * the writer saturates at 0x7e, so 0x7f never occurs). */
static __device__ __forceinline__ float td_cu_kv_e4m3(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float v = e == 0 ? (float)m * 0x1p-9f : __uint_as_float((uint32_t)(e + 120) << 23 | (uint32_t)m << 20);
    return (b & 0x80) ? -v : v;
}

/* f32 -> e4m3, round to nearest even, saturating at 448: ops_attn.c
 * f32_to_e4m3 line by line (same results for every input). */
static __device__ __forceinline__ uint8_t td_cu_f32_to_e4m3(float x) {
    uint8_t sign = x < 0 ? 0x80 : 0;
    float a = x < 0 ? -x : x;
    if (!(a == a)) return 0x7f;
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0x1p-10f) return sign;
    int e;
    float m = frexpf(a, &e);
    int exp = e - 1 + 7;
    if (exp <= 0) return sign | (uint8_t)nearbyintf(a * 512.0f);
    float r = nearbyintf((m * 2.0f - 1.0f) * 8.0f);
    if (r >= 8.0f) { r = 0; exp++; }
    if (exp > 15 || (exp == 15 && r > 6)) return sign | 0x7e;
    return sign | (uint8_t)(exp << 3) | (uint8_t)r;
}

static __device__ __forceinline__ float td_cu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float td_cu_silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- deterministic block reductions ----
 * Sum / max of one value per thread over the block (blockDim.x a multiple of
 * 32, at most 1024): a shuffle tree in each warp, then the warp results in
 * warp order through shared memory. The order depends only on blockDim.x, so
 * the result is the same in every launch. Every thread gets the result;
 * every thread of the block must call it (it synchronizes). red: 33 floats. */
static __device__ __forceinline__ float td_cu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float td_cu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
/* Argmax step: (bv, bi) takes (v, i) when v is larger, or equal with a lower
 * index. NaNs never win; combining partial results this way picks the
 * lowest index of the largest value in any order (argmax, sample). */
static __device__ __forceinline__ void td_cu_argmax_take(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}
static __device__ __forceinline__ float td_cu_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = td_cu_warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < nw ? red[lane] : 0.0f;
        s = td_cu_warp_sum(s);
        if (lane == 0) red[32] = s;
    }
    __syncthreads();
    return red[32];
}
/* max of non-negative values (absmax): fmaxf is exact, so any order gives the same */
static __device__ __forceinline__ float td_cu_block_max(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = td_cu_warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < nw ? red[lane] : -INFINITY;
        s = td_cu_warp_max(s);
        if (lane == 0) red[32] = s;
    }
    __syncthreads();
    return red[32];
}

/* KV layer as the kernels take it (td_kv_view by value). */
typedef struct td_cu_kv {
    int store, kv_dim, head_dim;
    void *k, *v;
    float *ks, *vs;
} td_cu_kv;
static inline td_cu_kv td_cu_kv_of(const td_kv_view *kv) {
    td_cu_kv r = {(int)kv->store, kv->kv_dim, kv->head_dim, kv->k, kv->v, kv->ks, kv->vs};
    return r;
}

/* Stores head h of row `row` (x: hd floats, any memory the block can read)
 * into base / scales in the KV dtype: f32 copy, bf16 round to nearest even,
 * fp8 e4m3 of x / scale with scale = absmax / 448 per (row, head) as
 * ops_attn.c write_row. The whole block calls it. red: 33 floats. */
static __device__ __forceinline__ uint16_t td_cu_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    uint32_t r = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + r) >> 16);
}
static __device__ __forceinline__ void td_cu_kv_write_head(const td_cu_kv &kv, void *base, float *scales, size_t row, int h,
                                                    const float *x, float *red) {
    int D = kv.kv_dim, hd = kv.head_dim, nh = hd > 0 ? D / hd : 1;
    size_t off = row * (size_t)D + (size_t)h * hd;
    if (kv.store == TD_KV_F32) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ((float *)base)[off + i] = x[i];
    } else if (kv.store == TD_KV_BF16) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ((uint16_t *)base)[off + i] = td_cu_f32_to_bf16(x[i]);
    } else { /* TD_KV_FP8 (AUTO is refused on the host) */
        float mx = 0.0f;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) mx = fmaxf(mx, fabsf(x[i]));
        mx = td_cu_block_max(mx, red);
        float sc = mx > 0 ? mx / 448.0f : 1.0f;
        if (threadIdx.x == 0) scales[row * (size_t)nh + h] = sc;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ((uint8_t *)base)[off + i] = td_cu_f32_to_e4m3(x[i] / sc);
    }
}
/* Element i of head h at row `row` as f32 (ops_attn.c read_head). */
static __device__ __forceinline__ float td_cu_kv_read(const td_cu_kv &kv, const void *base, const float *scales, size_t row, int h,
                                               int i) {
    int D = kv.kv_dim, hd = kv.head_dim;
    size_t off = row * (size_t)D + (size_t)h * hd + i;
    if (kv.store == TD_KV_F32) return ((const float *)base)[off];
    if (kv.store == TD_KV_BF16) return td_cu_bf16(((const uint16_t *)base)[off]);
    return td_cu_kv_e4m3(((const uint8_t *)base)[off]) * scales[row * (size_t)(D / hd) + h];
}

/* KV row of slot s of a segment (bt arrays in device memory). */
static __device__ __forceinline__ size_t td_cu_kv_row(const int32_t *block_tables, const int32_t *sg, int slot) {
    return (size_t)block_tables[sg[TD_SEG_BT] + slot / TD_KV_BLOCK] * TD_KV_BLOCK + (size_t)(slot % TD_KV_BLOCK);
}

/* ---- the ops (one file per concern) ---- */
extern "C" {
void td_cuda_matmul(td_backend *b, const td_tensor *W, const float *x, int M, float *y);
void td_cuda_rmsnorm(td_backend *b, float *y, const float *x, const float *w, int M, int n, float eps);
void td_cuda_embed(td_backend *b, const td_tensor *E, const int32_t *tokens, int M, float *out);
void td_cuda_add(td_backend *b, float *y, const float *x, size_t n);
void td_cuda_silu_mul(td_backend *b, float *a, const float *u, size_t n);
void td_cuda_argmax(td_backend *b, const float *x, int rows, int n, int32_t *out);
void td_cuda_kv_store(td_backend *b, const td_kv_view *kv, int row, const float *k, const float *v);
void td_cuda_kv_load(td_backend *b, const td_kv_view *kv, int row, int which, float *out);
void td_cuda_attn_prep(td_backend *b, const td_config *g, const td_batch *bt, const float *qg, float *k, const float *v,
                       const float *qn, const float *kn, const float *inv_freq, float *q, float *gate, const td_kv_view *kv,
                       int shift);
void td_cuda_attention(td_backend *b, const td_config *g, const td_batch *bt, const float *q, const float *gate,
                       const td_kv_view *kv, int shift, float *out);
void td_cuda_gdn_conv(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                      const float *qkv, float *conv_out);
void td_cuda_gdn_recur(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                       const float *conv_out, const float *z, const float *b_in, const float *a_in, float *o, int chunk);
int32_t td_cuda_sample(td_backend *b, struct td_sampler *s, const struct td_sample_call *c);
void td_cuda_fill_random(td_backend *b, void *dst, td_dtype dtype, size_t n, uint64_t seed, td_fill_mode mode, float value);
int td_cuda_graph_run(td_backend *b, const void *key, size_t key_len, void (*fn)(void *ctx), void *ctx, td_err *err);
void td_cuda_graphs_free(td_cuda *cu);
void td_cuda_gemm_prepare(td_backend *b);
void td_cuda_gemm_free(td_cuda *cu);
#ifndef TD_CUEMU
void *td_cu_dlopen(const char *lib, const char *what, char *why, size_t cap);
#endif
void td_cuda_lt_prepare(td_cuda *cu);
void td_cuda_lt_free(td_cuda *cu);
int td_cuda_lt_gemm(td_backend *b, int path, const td_cu_lt_weight *w, const float *x, int M, float *y);
}
#endif
