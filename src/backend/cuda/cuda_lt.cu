/* cuBLASLt for the fast mode's quantized prefill GEMMs (more than 128 rows;
 * cuda_matmul.cu gemm_fast calls td_cuda_lt_gemm before its BF16 path):
 * the weights are read as stored, in place, by the low-precision tensor
 * cores, and the activations are quantized to the weight's format first.
 *
 *  - FP8 (TD_CU_LT_FP8, sm_89 and later: Ada, Hopper, Blackwell): e4m3
 *    weights with one tensor scale (per-tensor FP8 checkpoints). On sm_90
 *    the activations are e4m3 with one scale per row (token): s_m =
 *    absmax_m / 448, q = e4m3(x / s_m) rounded to nearest even, and
 *    cuBLASLt's outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
 *    documented for compute capability 9.0 only) multiplies output (n, m) by
 *    the weight's scale (a vector of N copies of the tensor scale) and s_m.
 *    Elsewhere (Ada, Blackwell) both scales are tensor-wide
 *    (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, "8.9+"): one activation scale
 *    per chunk of rows, absmax over the chunk / 448, as vLLM's dynamic
 *    per-tensor FP8 activations. Half the bytes of the BF16 path's
 *    activations, no weight copy, and FP8 tensor cores run at twice the BF16
 *    rate. FP8 per-channel weights ([N, 1] scales) take the same kernel on
 *    sm_90 with those scales as the weight's outer vector (counted as the
 *    FP8B path, which is sm_90's too); elsewhere they stay on BF16.
 *  - NVFP4 (TD_CU_LT_FP4, sm_100 and later: Blackwell, including the
 *    RTX 5090's sm_120): e2m1 weights with e4m3 scales per 16 inputs and a
 *    global multiplier (ModelOpt, compressed-tensors). Activations in NVFP4
 *    as vLLM's W4A4 path makes them: a global scale g = 448 x 6 / absmax over
 *    the chunk (so every block scale fits e4m3), per 16 inputs a block scale
 *    s = e4m3(absmax_block / 6 x g) and q = e2m1(x x (g / s)) rounded to
 *    nearest even, saturating at 6. Both operands' block scales go in
 *    cuBLASLt's tiled layout (CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3,
 *    "1D block scaling factors layout": 128 x 4 tiles of 512 bytes, row r and
 *    scale column c of a tile at (r % 32) x 16 + (r / 32) x 4 + c, tiles in
 *    row-block-major order); alpha = multiplier / g is computed on the device
 *    (pointer mode DEVICE), so nothing waits for the host.
 *
 * Exactness: both give up more than the BF16 path (activations in 4 or 8
 * bits). The fast mode is what vLLM runs for these checkpoints; the exact
 * kernels stay one flag away (--batch-invariant), and decode / verify rows
 * (<= 128) never come here. The bounds are in test_backend_cuda
 * (test_matmul_lt): against a host quantizer of the same rules within f32
 * summation error, and against the CPU's f32 result within the format's
 * rounding.
 *
 * Memory: no buffer of its own. The activation chunk (quantized values,
 * scales, four device scalars) lives in the 32 MiB activation staging buffer,
 * the weight-side scales (FP8: N floats; NVFP4: the tiled copy of one chunk
 * of weight rows' scales) in the 64 MiB weight staging buffer, and the
 * cuBLAS workspace is shared (one stream: the calls never overlap). So the
 * planner's TD_CUDA_GEMM_BYTES stands.
 *
 * Where cuBLASLt is missing, or its heuristic has no kernel for the
 * combination on this device (the support tables move between releases),
 * the path is turned off with one line and the BF16 path runs instead. */
#include "backend/cuda/cuda_internal.cuh"
#ifndef TD_CUEMU
#include <dlfcn.h>
#endif

#ifdef TD_CUEMU
static int load_lt(td_cu_lt *f, char *why, size_t cap) {
    f->create = cublasLtCreate;
    f->destroy = cublasLtDestroy;
    f->desc_create = cublasLtMatmulDescCreate;
    f->desc_destroy = cublasLtMatmulDescDestroy;
    f->desc_set = cublasLtMatmulDescSetAttribute;
    f->layout_create = cublasLtMatrixLayoutCreate;
    f->layout_destroy = cublasLtMatrixLayoutDestroy;
    f->pref_create = cublasLtMatmulPreferenceCreate;
    f->pref_destroy = cublasLtMatmulPreferenceDestroy;
    f->pref_set = cublasLtMatmulPreferenceSetAttribute;
    f->heuristic = cublasLtMatmulAlgoGetHeuristic;
    f->matmul = cublasLtMatmul;
    f->lib = NULL;
    (void)why; (void)cap;
    return 0;
}
#else
static int load_lt(td_cu_lt *f, char *why, size_t cap) {
    void *h = td_cu_dlopen("libcublasLt", "cuBLASLt", why, cap);
    if (!h) return -1;
    /* POSIX: a function pointer may travel through void * (dlsym) */
    *(void **)&f->create = dlsym(h, "cublasLtCreate");
    *(void **)&f->destroy = dlsym(h, "cublasLtDestroy");
    *(void **)&f->desc_create = dlsym(h, "cublasLtMatmulDescCreate");
    *(void **)&f->desc_destroy = dlsym(h, "cublasLtMatmulDescDestroy");
    *(void **)&f->desc_set = dlsym(h, "cublasLtMatmulDescSetAttribute");
    *(void **)&f->layout_create = dlsym(h, "cublasLtMatrixLayoutCreate");
    *(void **)&f->layout_destroy = dlsym(h, "cublasLtMatrixLayoutDestroy");
    *(void **)&f->pref_create = dlsym(h, "cublasLtMatmulPreferenceCreate");
    *(void **)&f->pref_destroy = dlsym(h, "cublasLtMatmulPreferenceDestroy");
    *(void **)&f->pref_set = dlsym(h, "cublasLtMatmulPreferenceSetAttribute");
    *(void **)&f->heuristic = dlsym(h, "cublasLtMatmulAlgoGetHeuristic");
    *(void **)&f->matmul = dlsym(h, "cublasLtMatmul");
    if (!f->create || !f->destroy || !f->desc_create || !f->desc_destroy || !f->desc_set || !f->layout_create ||
        !f->layout_destroy || !f->pref_create || !f->pref_destroy || !f->pref_set || !f->heuristic || !f->matmul) {
        snprintf(why, cap, "cuBLASLt (libcublasLt.so.13) lacks an entry point of cublasLtMatmul's API");
        dlclose(h);
        return -1;
    }
    f->lib = h;
    return 0;
}
#endif

static const char *const path_name[TD_CU_LT_N] = {"FP8", "NVFP4", "FP8 128x128-block / per-channel"};

/* Called once the cuBLAS GEMM is on (its buffers and workspace exist). Each
 * path the device's generation has is tried; TANDEM_CUDA_LT=0 keeps all three off
 * (an A/B switch for scripts/gpu-check.sh). */
extern "C" void td_cuda_lt_prepare(td_cuda *cu) {
    /* cuBLAS's support table: FP8 tensor-wide 8.9+ (outer-vector 9.0), FP4 10.0+, FP8 128x128 blocks 9.0 */
    bool want[TD_CU_LT_N] = {cu->sm >= 89, cu->sm >= 100, cu->sm == 90};
    const char *env = getenv("TANDEM_CUDA_LT");
    bool off = env && !strcmp(env, "0");
    char why[256] = "";
    for (int p = 0; p < TD_CU_LT_N; p++) cu->lt_state[p] = TD_CU_GEMM_OFF;
    if (off || !want[TD_CU_LT_FP8]) return; /* every path needs sm_89 or later */
    if (load_lt(&cu->lt, why, sizeof why) == 0 && cu->lt.create(&cu->lt_handle) != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "cublasLtCreate failed");
        cu->lt_handle = NULL;
    }
    if (!cu->lt_handle) {
        td_cuda_lt_free(cu);
        fprintf(stderr, "tandem: cuda: %s; quantized prefill runs on the BF16 tensor cores\n", why);
        return;
    }
    for (int p = 0; p < TD_CU_LT_N; p++) cu->lt_state[p] = want[p] ? TD_CU_GEMM_ON : TD_CU_GEMM_OFF;
}

extern "C" void td_cuda_lt_free(td_cuda *cu) {
    if (cu->lt_handle) cu->lt.destroy(cu->lt_handle);
#ifndef TD_CUEMU
    if (cu->lt.lib) dlclose(cu->lt.lib);
#endif
    cu->lt_handle = NULL;
    cu->lt.lib = NULL;
    for (int p = 0; p < TD_CU_LT_N; p++) cu->lt_state[p] = TD_CU_GEMM_UNTRIED;
}

/* ---- quantization kernels ---- */

#define QT 256

/* amax[r] = max |x[r, :]| (one block per row; fmaxf is exact, any order). */
static __global__ void __launch_bounds__(QT) row_absmax_kernel(const float *x, int64_t K, float *amax) {
    __shared__ float red[33];
    const float *row = x + (int64_t)blockIdx.x * K;
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < K; i += QT) m = fmaxf(m, fabsf(row[i]));
    m = td_cu_block_max(m, red);
    if (threadIdx.x == 0) amax[blockIdx.x] = m;
}

/* amax[r] = max over the chunk's rows of amax (one block): the FP8 path's tensor-wide activation scale. */
static __global__ void __launch_bounds__(QT) chunk_absmax_kernel(float *amax, int rows) {
    __shared__ float red[33];
    float m = 0.0f;
    for (int r = threadIdx.x; r < rows; r += QT) m = fmaxf(m, amax[r]);
    m = td_cu_block_max(m, red);
    __syncthreads(); /* every thread has read amax before any is overwritten */
    for (int r = threadIdx.x; r < rows; r += QT) amax[r] = m;
}

/* FP8 rows: s[r] = absmax / 448 (1 for a zero row), q = e4m3(x / s). Grid (K chunks, rows). */
static __global__ void __launch_bounds__(QT) fp8_rows_kernel(const float *x, int64_t K, const float *amax, uint8_t *q, float *s) {
    int64_t r = blockIdx.y, i = (int64_t)blockIdx.x * QT + threadIdx.x;
    float a = amax[r], sc = a > 0.0f ? a / 448.0f : 1.0f;
    if (i == 0) s[r] = sc;
    if (i < K) q[r * K + i] = td_cu_f32_to_e4m3(x[r * K + i] / sc);
}

static __global__ void __launch_bounds__(QT) fill_f32_kernel(float *p, int64_t n, float v) {
    int64_t i = (int64_t)blockIdx.x * QT + threadIdx.x;
    if (i < n) p[i] = v;
}

/* NVFP4 chunk scalars from the rows' absmax: [0] absmax, [1] g, [2] alpha =
 * mult / g, [3] beta = 0. One block. */
static __global__ void __launch_bounds__(QT) fp4_global_kernel(const float *amax, int rows, float mult, float *sc) {
    __shared__ float red[33];
    float m = 0.0f;
    for (int r = threadIdx.x; r < rows; r += QT) m = fmaxf(m, amax[r]);
    m = td_cu_block_max(m, red);
    if (threadIdx.x == 0) {
        float g = m > 0.0f ? 2688.0f / m : 1.0f; /* 448 x 6: the largest block scale times the largest e2m1 */
        if (!(g <= 3.0e38f)) g = 1.0f;          /* absmax subnormal (or NaN): no global scale */
        sc[0] = m;
        sc[1] = g;
        sc[2] = mult / g;
        sc[3] = 0.0f;
    }
}

/* e2m1 code of v, round to nearest even, saturating at 6 (codes 0..7 are
 * 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign). */
static __device__ __forceinline__ uint8_t f32_to_e2m1(float v) {
    float a = fabsf(v);
    uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
    return (uint8_t)(c | (v < 0.0f ? 8 : 0));
}

/* Byte offset of scale (r, c) in cuBLASLt's tiled block-scale layout; cols4 = scale columns rounded up to 4. */
static __device__ __forceinline__ int64_t tiled_at(int64_t r, int64_t c, int64_t cols4) {
    return ((r >> 7) * (cols4 >> 2) + (c >> 2)) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (c & 3);
}

/* NVFP4 rows: one thread per 16-input block (r, c). q: rows x K/2 bytes; sf: tiled scales (zeroed before). */
static __global__ void __launch_bounds__(QT) fp4_rows_kernel(const float *x, int rows, int64_t K, const float *sc, uint8_t *q,
                                                              uint8_t *sf, int64_t cols4) {
    int64_t S = K / 16, e = (int64_t)blockIdx.x * QT + threadIdx.x;
    if (e >= rows * S) return;
    int64_t r = e / S, c = e % S;
    const float *xb = x + r * K + c * 16;
    float g = sc[1], m = 0.0f;
    for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(xb[i]));
    uint8_t sb = td_cu_f32_to_e4m3(m / 6.0f * g);
    float s = td_cu_e4m3(sb), inv = s > 0.0f ? g / s : 0.0f;
    uint8_t *qb = q + r * (K / 2) + c * 8;
    for (int i = 0; i < 16; i += 2) qb[i / 2] = (uint8_t)(f32_to_e2m1(xb[i] * inv) | f32_to_e2m1(xb[i + 1] * inv) << 4);
    sf[tiled_at(r, c, cols4)] = sb;
}

/* The weight's row-major e4m3 scales [N, S] of rows n0 .. n0 + nr in the tiled layout (padding zero). */
static __global__ void __launch_bounds__(QT) fp4_tile_scales_kernel(const uint8_t *scales, int64_t S, int64_t n0, int64_t nr,
                                                                     int64_t rows128, int64_t cols4, uint8_t *out) {
    int64_t e = (int64_t)blockIdx.x * QT + threadIdx.x;
    if (e >= rows128 * cols4) return;
    int64_t r = e / cols4, c = e % cols4;
    out[tiled_at(r, c, cols4)] = (r < nr && c < S) ? scales[(n0 + r) * S + c] : 0;
}

/* ---- one cublasLtMatmul: y^T (nr x rows, ld ldy) = op_T(A: K x nr) B (K x rows), column-major ---- */

typedef struct lt_call {
    cudaDataType type;        /* A and B */
    int32_t a_mode, b_mode;   /* scale modes */
    const void *A, *B, *a_scale, *b_scale;
    const float *alpha, *beta; /* device pointers when dev_scalars */
    bool dev_scalars;
    int64_t nr, rows, K, ldy;
    float *y;
} lt_call;

static void lt_check(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, what, (int)s);
    abort(); /* as a failed kernel: the stream's work is lost */
}

/* false: the heuristic has no kernel for it, or cublasLtMatmul rejected the call (nothing was issued). */
static bool lt_run(td_cuda *cu, const lt_call &c) {
    td_cu_lt *f = &cu->lt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ly = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int32_t pm = c.dev_scalars ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
    uint64_t ws = TD_CUDA_GEMM_WS_BYTES;
    lt_check(f->desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    lt_check(f->desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "cublasLtMatmulDescSetAttribute");
    lt_check(f->desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "cublasLtMatmulDescSetAttribute");
    lt_check(f->desc_set(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm), "cublasLtMatmulDescSetAttribute");
    lt_check(f->desc_set(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &c.a_mode, sizeof c.a_mode), "cublasLtMatmulDescSetAttribute");
    lt_check(f->desc_set(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &c.b_mode, sizeof c.b_mode), "cublasLtMatmulDescSetAttribute");
    lt_check(f->desc_set(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.a_scale, sizeof c.a_scale), "cublasLtMatmulDescSetAttribute");
    lt_check(f->desc_set(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.b_scale, sizeof c.b_scale), "cublasLtMatmulDescSetAttribute");
    lt_check(f->layout_create(&la, c.type, (uint64_t)c.K, (uint64_t)c.nr, c.K), "cublasLtMatrixLayoutCreate");
    lt_check(f->layout_create(&lb, c.type, (uint64_t)c.K, (uint64_t)c.rows, c.K), "cublasLtMatrixLayoutCreate");
    lt_check(f->layout_create(&ly, CUDA_R_32F, (uint64_t)c.nr, (uint64_t)c.rows, c.ldy), "cublasLtMatrixLayoutCreate");
    lt_check(f->pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    lt_check(f->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "cublasLtMatmulPreferenceSetAttribute");
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int got = 0;
    cublasStatus_t hs = f->heuristic(cu->lt_handle, op, la, lb, ly, ly, pref, 1, &res, &got);
    bool ok = hs == CUBLAS_STATUS_SUCCESS && got > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    if (ok) {
        const float host_alpha = 1.0f, host_beta = 0.0f;
        const void *al = c.dev_scalars ? (const void *)c.alpha : &host_alpha, *be = c.dev_scalars ? (const void *)c.beta : &host_beta;
        /* an argument the chosen kernel rejects returns before anything is issued: a refusal too */
        ok = f->matmul(cu->lt_handle, op, al, c.A, la, c.B, lb, be, c.y, ly, c.y, ly, &res.algo, cu->gemm_ws, TD_CUDA_GEMM_WS_BYTES,
                       cu->stream) == CUBLAS_STATUS_SUCCESS;
    }
    f->pref_destroy(pref);
    f->layout_destroy(ly);
    f->layout_destroy(lb);
    f->layout_destroy(la);
    f->desc_destroy(op);
    return ok;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The first refusal of a path turns it off for the backend's life (one line). */
static int refused(td_cuda *cu, int path, int64_t nr, int64_t rows, int64_t K) {
    cu->lt_state[path] = TD_CU_GEMM_OFF;
    fprintf(stderr, "tandem: cuda: cuBLASLt has no (or refused its) %s kernel for %lld x %lld x %lld on sm_%d; that prefill stays on BF16 tensor cores\n",
            path_name[path], (long long)nr, (long long)rows, (long long)K, cu->sm);
    return 0;
}

static __global__ void __launch_bounds__(QT) wscale_f32_kernel(const void *sc, int dt, int64_t nb, int64_t kb, int64_t kb4, float *out);

/* FP8 e4m3 per-tensor: weights in place, activation rows in chunks of gemm_x;
 * per-row activation scales on sm_90, one per chunk elsewhere. Per-channel
 * (channel: the weight's [N, 1] scales, sm_90 only, its FP8B path): the
 * weight's scale vector is those scales instead of N copies of one. */
static int gemm_fp8(td_backend *b, const td_cu_lt_weight *w, const float *x, int M, float *y, bool channel) {
    td_cuda *cu = td_cu(b);
    const bool outer = cu->sm == 90;
    if (channel && !outer) return 0; /* tensor-wide scales cannot carry a scale per output row */
    const int path = channel ? TD_CU_LT_FP8B : TD_CU_LT_FP8;
    const int32_t mode = outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    const int64_t N = w->N, K = w->K;
    /* chunk: q [mc, K] | s [mc] | absmax [mc] */
    int64_t mc = ((int64_t)cu->gemm_x_cap - 1024) / (K + 8);
    int64_t nc = ((int64_t)cu->gemm_w_cap / 4) / 16 * 16; /* rows of the weight's scale vector */
    if (mc < 1 || nc < 16) return 0;
    if (mc > M) mc = M;
    if (mc > 65535) mc = 65535; /* fp8_rows_kernel's grid.y */
    if (nc > N) nc = N;
    cudaStream_t st = cu->stream;
    uint8_t *q = (uint8_t *)cu->gemm_x;
    float *s = (float *)((uint8_t *)cu->gemm_x + align256((size_t)(mc * K))), *amax = s + align256((size_t)mc * 4) / 4;
    float *ws = (float *)cu->gemm_w;
    if (!channel) {
        TD_CU_KERNEL(fill_f32_kernel, td_cu_blocks((size_t)nc, QT), QT, st, ws, nc, w->mult); /* the same value for every chunk */
        TD_CU_LAUNCH("fill_f32_kernel");
    }
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        int64_t rows = M - m0 < mc ? M - m0 : mc;
        TD_CU_KERNEL(row_absmax_kernel, (unsigned)rows, QT, st, x + m0 * K, K, amax);
        TD_CU_LAUNCH("row_absmax_kernel");
        if (!outer) {
            TD_CU_KERNEL(chunk_absmax_kernel, 1, QT, st, amax, (int)rows);
            TD_CU_LAUNCH("chunk_absmax_kernel");
        }
        TD_CU_KERNEL(fp8_rows_kernel, dim3(td_cu_blocks((size_t)K, QT), (unsigned)rows), QT, st, x + m0 * K, K, amax, q, s);
        TD_CU_LAUNCH("fp8_rows_kernel");
        for (int64_t n0 = 0; n0 < N; n0 += nc) {
            int64_t nr = N - n0 < nc ? N - n0 : nc;
            if (channel) { /* this chunk's rows' scales as f32 (the checkpoint's [N, 1] in f32, bf16 or f16) */
                const uint8_t *src = (const uint8_t *)w->scales + (size_t)n0 * (w->scales_dtype == TD_DTYPE_F32 ? 4 : 2);
                TD_CU_KERNEL(wscale_f32_kernel, td_cu_blocks((size_t)nr, QT), QT, st, (const void *)src, w->scales_dtype, nr, 1, 1, ws);
                TD_CU_LAUNCH("wscale_f32_kernel");
            }
            /* tensor-wide: cuBLASLt reads ws[0] and s[0] */
            lt_call c = {CUDA_R_8F_E4M3, mode, mode, w->data + n0 * K, q, ws, s, NULL, NULL, false, nr, rows, K, N, y + m0 * N + n0};
            if (!lt_run(cu, c)) {
                if (m0 == 0 && n0 == 0) return refused(cu, path, nr, rows, K);
                fprintf(stderr, "%s:%d: cuBLASLt refused a later FP8 chunk (%lld x %lld x %lld)\n", __FILE__, __LINE__, (long long)nr,
                        (long long)rows, (long long)K);
                abort(); /* part of y is written: nothing to fall back to */
            }
            cu->lt_calls[path]++;
        }
    }
    return M;
}

/* NVFP4: weights in place with their scales tiled per chunk of 128-row groups. */
static int gemm_fp4(td_backend *b, const td_cu_lt_weight *w, const float *x, int M, float *y) {
    td_cuda *cu = td_cu(b);
    const int64_t N = w->N, K = w->K, S = K / 16, cols4 = (S + 3) / 4 * 4;
    /* chunk: scalars [64 floats] | absmax [mc] | q [mc, K/2] | tiled scales [ceil128(mc), cols4] */
    int64_t per_row = 4 + K / 2 + cols4;
    int64_t mc = ((int64_t)cu->gemm_x_cap - 2048 - 128 * cols4) / per_row;
    int64_t nc = ((int64_t)cu->gemm_w_cap / cols4) / 128 * 128;
    if (mc < 1 || nc < 128) return 0;
    if (mc > M) mc = M;
    cudaStream_t st = cu->stream;
    float *sc = (float *)cu->gemm_x, *amax = sc + 64;
    uint8_t *q = (uint8_t *)cu->gemm_x + align256(256 + (size_t)mc * 4);
    uint8_t *sfx = q + align256((size_t)(mc * K / 2));
    uint8_t *sfw = (uint8_t *)cu->gemm_w;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        int64_t rows = M - m0 < mc ? M - m0 : mc, rows128 = (rows + 127) / 128 * 128;
        TD_CU_KERNEL(row_absmax_kernel, (unsigned)rows, QT, st, x + m0 * K, K, amax);
        TD_CU_LAUNCH("row_absmax_kernel");
        TD_CU_KERNEL(fp4_global_kernel, 1, QT, st, amax, (int)rows, w->mult, sc);
        TD_CU_LAUNCH("fp4_global_kernel");
        TD_CU(cudaMemsetAsync(sfx, 0, (size_t)(rows128 * cols4), st));
        TD_CU_KERNEL(fp4_rows_kernel, td_cu_blocks((size_t)(rows * S), QT), QT, st, x + m0 * K, (int)rows, K, sc, q, sfx, cols4);
        TD_CU_LAUNCH("fp4_rows_kernel");
        for (int64_t n0 = 0; n0 < N; n0 += nc) {
            int64_t nr = N - n0 < nc ? N - n0 : nc, nr128 = (nr + 127) / 128 * 128;
            TD_CU_KERNEL(fp4_tile_scales_kernel, td_cu_blocks((size_t)(nr128 * cols4), QT), QT, st, (const uint8_t *)w->scales, S, n0, nr, nr128, cols4, sfw);
            TD_CU_LAUNCH("fp4_tile_scales_kernel");
            lt_call c = {CUDA_R_4F_E2M1, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3, w->data + n0 * (K / 2), q, sfw, sfx, sc + 2, sc + 3,
                         true, nr, rows, K, N, y + m0 * N + n0};
            if (!lt_run(cu, c)) {
                if (m0 == 0 && n0 == 0) return refused(cu, TD_CU_LT_FP4, nr, rows, K);
                fprintf(stderr, "%s:%d: cuBLASLt refused a later NVFP4 chunk (%lld x %lld x %lld)\n", __FILE__, __LINE__, (long long)nr,
                        (long long)rows, (long long)K);
                abort();
            }
            cu->lt_calls[TD_CU_LT_FP4]++;
        }
    }
    return M;
}

/* FP8 with 128 x 128 weight blocks (DeepSeek-style checkpoints, Qwen's FP8
 * releases) on CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F for the weight and
 * VEC128_32F for the activations. Layouts as cuBLAS takes them for y^T =
 * op_T(W) x^T: the weight's scales f32 [ceil(N/128)][kb4], row-major with the
 * K blocks padded to a multiple of 4 (the checkpoint's order, converted to f32
 * once per call: N/128 x kb4 floats); the activations' scales per (row m,
 * block j) at j x rows + m (token-major), rows a multiple of 4: each chunk
 * takes a multiple of 4 rows and the caller runs the last M % 4 on the exact
 * kernels. Activations: per 128-input block s = absmax / 448, q = e4m3(x / s). */
static __global__ void __launch_bounds__(128) fp8_blocks_kernel(const float *x, int64_t K, int rows, uint8_t *q, float *s) {
    __shared__ float red[33];
    int64_t m = blockIdx.y, j = blockIdx.x, i = j * 128 + threadIdx.x;
    float v = x[m * K + i], a = td_cu_block_max(fabsf(v), red), sc = a > 0.0f ? a / 448.0f : 1.0f;
    if (threadIdx.x == 0) s[j * rows + m] = sc;
    q[m * K + i] = td_cu_f32_to_e4m3(v / sc);
}

/* f32 copy of a [nb, kb] scale grid, rows padded to kb4 with zeros. */
static __global__ void __launch_bounds__(QT) wscale_f32_kernel(const void *sc, int dt, int64_t nb, int64_t kb, int64_t kb4, float *out) {
    int64_t e = (int64_t)blockIdx.x * QT + threadIdx.x;
    if (e >= nb * kb4) return;
    int64_t r = e / kb4, c = e % kb4;
    float v = 0.0f;
    if (c < kb) {
        int64_t idx = r * kb + c;
        v = dt == TD_DTYPE_F32 ? ((const float *)sc)[idx] : dt == TD_DTYPE_BF16 ? td_cu_bf16(((const uint16_t *)sc)[idx])
                                                                                  : td_cu_f16(((const uint16_t *)sc)[idx]);
    }
    out[e] = v;
}

static int gemm_fp8b(td_backend *b, const td_cu_lt_weight *w, const float *x, int M, float *y) {
    td_cuda *cu = td_cu(b);
    const int64_t N = w->N, K = w->K, kb = K / 128, kb4 = (kb + 3) / 4 * 4, nb = (N + 127) / 128;
    if (w->bn != 128 || w->bk != 128 || K % 128 || M < 4) return 0;
    if ((int64_t)cu->gemm_w_cap < nb * kb4 * 4) return 0;
    /* chunk: q [mc, K] | s [kb, mc] */
    int64_t mc = (((int64_t)cu->gemm_x_cap - 1024) / (K + 4 * kb)) / 4 * 4;
    if (mc > 65532) mc = 65532; /* fp8_blocks_kernel's grid.y */
    if (mc < 4) return 0;
    int64_t M4 = M / 4 * 4;
    if (mc > M4) mc = M4;
    cudaStream_t st = cu->stream;
    uint8_t *q = (uint8_t *)cu->gemm_x;
    float *s = (float *)((uint8_t *)cu->gemm_x + align256((size_t)(mc * K)));
    float *ws = (float *)cu->gemm_w;
    TD_CU_KERNEL(wscale_f32_kernel, td_cu_blocks((size_t)(nb * kb4), QT), QT, st, w->scales, w->scales_dtype, nb, kb, kb4, ws);
    TD_CU_LAUNCH("wscale_f32_kernel");
    for (int64_t m0 = 0; m0 < M4; m0 += mc) {
        int64_t rows = M4 - m0 < mc ? M4 - m0 : mc;
        TD_CU_KERNEL(fp8_blocks_kernel, dim3((unsigned)kb, (unsigned)rows), 128, st, x + m0 * K, K, (int)rows, q, s);
        TD_CU_LAUNCH("fp8_blocks_kernel");
        lt_call c = {CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, w->data, q, ws,
                     s, NULL, NULL, false, N, rows, K, N, y + m0 * N};
        if (!lt_run(cu, c)) {
            if (m0 == 0) return refused(cu, TD_CU_LT_FP8B, N, rows, K);
            fprintf(stderr, "%s:%d: cuBLASLt refused a later FP8 block chunk (%lld x %lld x %lld)\n", __FILE__, __LINE__, (long long)N,
                    (long long)rows, (long long)K);
            abort();
        }
        cu->lt_calls[TD_CU_LT_FP8B]++;
    }
    return (int)M4;
}

/* y = x W^T on a cuBLASLt path: the rows done (the first ones; the caller
 * runs the rest), or 0 (the caller's BF16 path runs). Shapes cuBLASLt's
 * low-precision kernels take: K a multiple of 32 (16-byte row alignment in
 * every format), N a multiple of 4 (y's chunk columns stay 16-byte aligned). */
extern "C" int td_cuda_lt_gemm(td_backend *b, int path, const td_cu_lt_weight *w, const float *x, int M, float *y) {
    td_cuda *cu = td_cu(b);
    if (path < 0 || path >= TD_CU_LT_N || cu->lt_state[path] != TD_CU_GEMM_ON) return 0;
    if (w->K % 32 || w->N % 4 || w->K > 1 << 24 || w->N > INT32_MAX || !(w->mult == w->mult)) return 0;
    if (((uintptr_t)w->data | (uintptr_t)x | (uintptr_t)y) & 15) return 0;
    if (path == TD_CU_LT_FP8B && w->bn == 1 && w->bk >= w->K) return gemm_fp8(b, w, x, M, y, true); /* per-channel */
    return path == TD_CU_LT_FP8 ? gemm_fp8(b, w, x, M, y, false) : path == TD_CU_LT_FP4 ? gemm_fp4(b, w, x, M, y) : gemm_fp8b(b, w, x, M, y);
}

extern "C" int td_backend_cuda_lt_info(td_backend *b, int *sm, int on[3], uint64_t calls[3]) {
    if (!b || !b->ops || strcmp(b->ops->name, "cuda")) return TD_ERR_ARG;
    td_cuda *cu = td_cu(b);
    *sm = cu->sm;
    for (int p = 0; p < TD_CU_LT_N; p++) {
        on[p] = cu->lt_state[p] == TD_CU_GEMM_ON;
        calls[p] = cu->lt_calls[p];
    }
    return TD_OK;
}
