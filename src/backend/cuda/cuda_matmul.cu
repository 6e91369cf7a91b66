/* CUDA matmul: y[M,N] = x[M,K] · W[N,K]^T for every weight dtype the CPU
 * kernels take (td_matmul_supported): F32, BF16, F16, FP8 e4m3 per-tensor or
 * with block scales (F32/BF16/F16, [ceil(N/bn), ceil(K/bk)]), NVFP4 (e2m1
 * nibbles, low nibble first, fp8 e4m3 scale per 16 inputs, global
 * multiplier scale_f) and Q8 (int8, BF16 scale per 32 inputs).
 *
 * Reduction order (batch invariance): every output y[m,n] is the CPU's AVX
 * order exactly. 16 lanes; lane j accumulates the elements k = j, j+16,
 * j+32, ... in increasing k with one fused multiply-add each (__fmaf_rn),
 * the last partial chunk zero padded; then the fixed tree of kernels.c
 * reduce16: s8[j] = a[j] + a[j+8], s4[j] = s8[j] + s8[j+4],
 * (s4[0] + s4[2]) + (s4[1] + s4[3]); then the per-tensor multiplier (FP8
 * per-tensor: scale_f * 256, NVFP4: scale_f). The weight value each lane
 * multiplies is dequantized by one function (w_at) in both kernels, with
 * the same roundings as kernels_x86.c w16_512 (FP8 carries 2^-8 there).
 * Both kernels below compute that same sequence for each element; they
 * differ only in which elements one block computes together. So the result
 * does not depend on M, on the kernel chosen, or on the grid: verifying k+1
 * tokens gives the bits of k+1 single-token passes (and, given the same
 * inputs, the bits of the CPU's AVX2 / AVX-512 path).
 *
 *  - gemv_kernel (M <= 16: decode, verify): a half-warp per weight row;
 *    each thread loads each of its weight elements once, dequantizes it in
 *    registers and uses it for all M activation rows (acc[16] per thread),
 *    so every weight byte is read once per call.
 *    Up to 128 rows (a batch of decode / verify items) it runs in 16-row
 *    slices: ceil(M/16) reads of the weight, still far less than staging it.
 *  - tiled_kernel (M > 128: prefill): 32 x 32 output tiles, K in steps of
 *    16 staged through shared memory (x rows and dequantized weight rows);
 *    thread (group g, lane j) keeps the lane-j accumulators of an 8 x 8
 *    sub-tile, no tensor cores (those would change the reduction order).
 *
 * The fast mode (td_backend.batch_invariant false, the default) gives up that
 * invariance for prefill only: a matmul of more than 16 rows (BF16 weights,
 * read in place) or more than 128 (the others, which are dequantized to a
 * BF16 copy first) goes to cuBLAS
 * (gemm_fast below: BF16 tensor cores, f32 accumulation in cuBLAS's order).
 * The activations are rounded to BF16, and the weights too where BF16 does
 * not hold them exactly (FP8 per-tensor and NVFP4 values are exact in BF16,
 * their multiplier is the GEMM's alpha; FP8 with block scales, Q8, F16 and F32
 * round). Decode and verify rows (<= 16) stay on gemv_kernel, so a k-token
 * verify still equals k decode steps whenever the batch has <= 16 rows (<= 128
 * for quantized weights). */
#include "backend/cuda/cuda_internal.cuh"
extern "C" {
#include "backend/cpu/kernels.h"
}

enum { KF32, KBF16, KF16, KF8, KF8B, KFP4, KQ8 };

/* The weight as the kernels take it (by value). */
typedef struct wdesc {
    const uint8_t *data;
    const void *scales;
    int sdt;              /* block scales dtype (KF8B) */
    int64_t N, K, bn, bk, sc;
    float post;           /* multiplier after the reduction (KF8, KFP4) */
} wdesc;

static __device__ __forceinline__ float block_scale(const wdesc &d, int64_t n, int64_t i) {
    int64_t idx = (n / d.bn) * d.sc + i / d.bk;
    if (d.sdt == TD_DTYPE_F32) return ((const float *)d.scales)[idx];
    if (d.sdt == TD_DTYPE_BF16) return td_cu_bf16(((const uint16_t *)d.scales)[idx]);
    return td_cu_f16(((const uint16_t *)d.scales)[idx]);
}

static __constant__ float td_cu_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Weight element (n, i), i < K, dequantized exactly as kernels_x86.c does. */
template <int KIND> static __device__ __forceinline__ float w_at(const wdesc &d, int64_t n, int64_t i) {
    if (KIND == KF32) return ((const float *)d.data)[n * d.K + i];
    if (KIND == KBF16) return td_cu_bf16(((const uint16_t *)d.data)[n * d.K + i]);
    if (KIND == KF16) return td_cu_f16(((const uint16_t *)d.data)[n * d.K + i]);
    if (KIND == KF8) return td_cu_e4m3(d.data[n * d.K + i]) * 0x1p-8f;
    if (KIND == KF8B) return (td_cu_e4m3(d.data[n * d.K + i]) * 0x1p-8f) * (block_scale(d, n, i) * 256.0f);
    if (KIND == KQ8) return (float)((const int8_t *)d.data)[n * d.K + i] * td_cu_bf16(((const uint16_t *)d.scales)[n * (d.K / 32) + i / 32]);
    /* KFP4: byte i/2 of the row, low nibble = even element */
    uint8_t byte = d.data[n * (d.K / 2) + i / 2];
    return td_cu_e2m1[(byte >> ((i & 1) * 4)) & 15] * td_cu_e4m3(((const uint8_t *)d.scales)[n * (d.K / 16) + i / 16]);
}

/* reduce16 over the 16 lanes of a half-warp (lane = threadIdx.x & 15): the
 * result is valid in lane 0. Additions pair the same operands as reduce16. */
static __device__ __forceinline__ float reduce16(float v) {
    v += __shfl_down_sync(0xffffffffu, v, 8, 16); /* lanes 0..7: s8 */
    v += __shfl_down_sync(0xffffffffu, v, 4, 16); /* lanes 0..3: s4 */
    v += __shfl_down_sync(0xffffffffu, v, 2, 16); /* lanes 0,1: s4[j] + s4[j+2] */
    v += __shfl_down_sync(0xffffffffu, v, 1, 16); /* lane 0: the sum of those two */
    return v;
}

#define GEMV_THREADS 256 /* 16 weight rows per block */
#define GEMV_MAX_M 16
#define GEMV_SLICE_MAX 128 /* up to this many rows: gemv_kernel in 16-row slices (batched decode / verify) */

template <int KIND> static __global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(wdesc d, const float *x, int M, float *y) {
    int lane = threadIdx.x & 15;
    int64_t n = (int64_t)blockIdx.x * (GEMV_THREADS / 16) + (threadIdx.x >> 4);
    bool valid = n < d.N;
    if (!valid) n = d.N - 1; /* computes a row it will not store: every lane stays in the shuffles */
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) acc[m] = 0.0f;
    const int64_t K = d.K;
    for (int64_t c = 0; c < K; c += 16) {
        int64_t i = c + lane;
        bool in = i < K;
        float w = in ? w_at<KIND>(d, n, i) : 0.0f;
#pragma unroll
        for (int m = 0; m < GEMV_MAX_M; m++)
            if (m < M) acc[m] = __fmaf_rn(in ? __ldg(x + (int64_t)m * K + i) : 0.0f, w, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) {
        if (m >= M) break; /* M is uniform over the block: no divergence around the shuffles */
        float v = reduce16(acc[m]);
        if (KIND == KF8 || KIND == KFP4) v = v * d.post;
        if (lane == 0 && valid) y[(int64_t)m * d.N + n] = v;
    }
}

#define TILE 32
#define TILED_THREADS 256 /* 16 groups of 16 lanes; group g: rows (g/4)*8.., cols (g%4)*8.. */

template <int KIND> static __global__ void __launch_bounds__(TILED_THREADS) tiled_kernel(wdesc d, const float *x, int M, float *y) {
    __shared__ float xs[TILE][17], ws[TILE][17]; /* [row][lane], padded against bank conflicts */
    int tid = threadIdx.x, lane = tid & 15, grp = tid >> 4, gm = (grp >> 2) * 8, gn = (grp & 3) * 8;
    int64_t n0 = (int64_t)blockIdx.x * TILE;
    int64_t m0 = (int64_t)blockIdx.y * TILE;
    const int64_t K = d.K;
    float acc[8][8];
#pragma unroll
    for (int a = 0; a < 8; a++)
#pragma unroll
        for (int c = 0; c < 8; c++) acc[a][c] = 0.0f;
    for (int64_t c0 = 0; c0 < K; c0 += 16) {
        /* stage 32 x rows and 32 weight rows of this 16-wide chunk (zero padded) */
        for (int e = tid; e < TILE * 16; e += TILED_THREADS) {
            int r = e >> 4, j = e & 15;
            int64_t i = c0 + j, m = m0 + r, n = n0 + r;
            xs[r][j] = (m < M && i < K) ? x[m * K + i] : 0.0f;
            ws[r][j] = (n < d.N && i < K) ? w_at<KIND>(d, n, i) : 0.0f;
        }
        __syncthreads();
        float xv[8], wv[8];
#pragma unroll
        for (int a = 0; a < 8; a++) xv[a] = xs[gm + a][lane];
#pragma unroll
        for (int c = 0; c < 8; c++) wv[c] = ws[gn + c][lane];
#pragma unroll
        for (int a = 0; a < 8; a++)
#pragma unroll
            for (int c = 0; c < 8; c++) acc[a][c] = __fmaf_rn(xv[a], wv[c], acc[a][c]);
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 8; a++)
#pragma unroll
        for (int c = 0; c < 8; c++) {
            float v = reduce16(acc[a][c]);
            if (KIND == KF8 || KIND == KFP4) v = v * d.post;
            int64_t m = m0 + gm + a, n = n0 + gn + c;
            if (lane == 0 && m < M && n < d.N) y[m * d.N + n] = v;
        }
}

/* ---- the fast mode's prefill GEMM ---- */

#define CONV_THREADS 256

/* out[r, i] = bf16(w_at(n0 + r, i)) for r < rows: one chunk of weight rows. */
template <int KIND> static __global__ void __launch_bounds__(CONV_THREADS) dequant_bf16_kernel(wdesc d, int64_t n0, int64_t rows,
                                                                                                 uint16_t *out) {
    int64_t e = (int64_t)blockIdx.x * CONV_THREADS + threadIdx.x;
    if (e >= rows * d.K) return;
    int64_t r = e / d.K, i = e % d.K;
    out[e] = td_cu_f32_to_bf16(w_at<KIND>(d, n0 + r, i));
}

static __global__ void __launch_bounds__(CONV_THREADS) f32_to_bf16_kernel(const float *x, int64_t n, uint16_t *out) {
    int64_t e = (int64_t)blockIdx.x * CONV_THREADS + threadIdx.x;
    if (e < n) out[e] = td_cu_f32_to_bf16(x[e]);
}

static void gemm_check(cublasStatus_t s, int m, int n, int k) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "%s:%d: cublasGemmEx (%d x %d x %d) failed: status %d\n", __FILE__, __LINE__, m, n, k, (int)s);
    abort(); /* as a failed kernel: the stream's work is lost */
}

/* y = x W^T through cuBLAS when the fast mode is on and M > 16 (false: the
 * caller runs the exact kernels). Row-major y[M,N] is column-major y^T
 * (N x M, ld N) = W (op T of the column-major K x N array W^T) times x^T
 * (column-major K x M, ld K). Activations in chunks of the staging buffer's
 * rows, each rounded to BF16 once; for each, the weight rows in chunks
 * dequantized to BF16 (BF16 weights are read in place, in one call). */
template <int KIND> static void launch(td_backend *b, const wdesc &d, const float *x, int M, float *y);
template <int KIND> static bool gemm_fast(td_backend *b, const wdesc &d, const float *x, int M, float *y) {
    td_cuda *cu = td_cu(b);
    /* BF16 is read in place, once: cuBLAS from 17 rows. Other dtypes cost a BF16 copy (write
       and read 2 bytes per weight) on top of their own 0.5-1 bytes, more than the GEMV slices'
       ceil(M/16) reads of the packed weight up to ~128 rows. */
    if (b->batch_invariant || M <= (KIND == KBF16 ? GEMV_MAX_M : GEMV_SLICE_MAX)) return false;
    if (cu->gemm_state == TD_CU_GEMM_UNTRIED) {
        if (cu->capturing) return false; /* never happens in the engine: its allocs came first (cu_alloc) */
        td_cuda_gemm_prepare(b);
    }
    if (cu->gemm_state != TD_CU_GEMM_ON || d.K > 1 << 24 || d.N > INT32_MAX) return false;
    if (KIND == KF8 || KIND == KFP4 || KIND == KF8B) { /* FP8 / NVFP4 tensor cores, where the device has them (cuda_lt.cu) */
        td_cu_lt_weight lw = {d.data, d.scales, d.sdt, d.N, d.K, d.bn, d.bk, KIND == KF8 ? d.post / 256.0f : d.post};
        int done = td_cuda_lt_gemm(b, KIND == KF8 ? TD_CU_LT_FP8 : KIND == KFP4 ? TD_CU_LT_FP4 : TD_CU_LT_FP8B, &lw, x, M, y);
        if (done > 0) { /* the rows it left (fewer than 4: FP8B takes multiples of 4) on the exact kernels */
            if (done < M) launch<KIND>(b, d, x + (int64_t)done * d.K, M - done, y + (int64_t)done * d.N);
            return true;
        }
    }
    const int64_t N = d.N, K = d.K;
    int64_t mc = (int64_t)(cu->gemm_x_cap / 2) / K;
    int64_t nc = KIND == KBF16 ? N : ((int64_t)(cu->gemm_w_cap / 2) / K) / 16 * 16; /* keeps y + n0 64-byte aligned */
    if (mc < 1 || nc < 1) return false;
    if (mc > M) mc = M;
    if (nc > N) nc = N;
    cudaStream_t st = cu->stream;
    const float alpha = (KIND == KF8 || KIND == KFP4) ? d.post : 1.0f, beta = 0.0f;
    uint16_t *xb = (uint16_t *)cu->gemm_x, *wb = (uint16_t *)cu->gemm_w;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        int64_t rows = M - m0 < mc ? M - m0 : mc;
        TD_CU_KERNEL(f32_to_bf16_kernel, td_cu_blocks((size_t)(rows * K), CONV_THREADS), CONV_THREADS, st, x + m0 * K, rows * K, xb);
        TD_CU_LAUNCH("f32_to_bf16_kernel");
        for (int64_t n0 = 0; n0 < N; n0 += nc) {
            int64_t nr = N - n0 < nc ? N - n0 : nc;
            const void *A;
            if (KIND == KBF16) A = d.data; /* one chunk of all N rows: n0 = 0 */
            else {
                TD_CU_KERNEL(dequant_bf16_kernel<KIND>, td_cu_blocks((size_t)(nr * K), CONV_THREADS), CONV_THREADS, st, d, n0, nr, wb);
                TD_CU_LAUNCH("dequant_bf16_kernel");
                A = wb;
            }
            gemm_check(cu->blas.gemm_ex(cu->blas_handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)rows, (int)K, &alpha, A, CUDA_R_16BF,
                                        (int)K, xb, CUDA_R_16BF, (int)K, &beta, y + m0 * N + n0, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                       (int)nr, (int)rows, (int)K);
            cu->gemm_calls++;
        }
    }
    return true;
}

template <int KIND> static void launch(td_backend *b, const wdesc &d, const float *x, int M, float *y) {
    if (gemm_fast<KIND>(b, d, x, M, y)) return;
    cudaStream_t st = td_cu(b)->stream;
    if (M <= GEMV_SLICE_MAX) { /* slices of 16 rows: each weight byte read once per slice, the same bits as one pass */
        for (int m0 = 0; m0 < M; m0 += GEMV_MAX_M) {
            int rows = M - m0 < GEMV_MAX_M ? M - m0 : GEMV_MAX_M;
            TD_CU_KERNEL(gemv_kernel<KIND>, td_cu_blocks((size_t)d.N, GEMV_THREADS / 16), GEMV_THREADS, st, d, x + (int64_t)m0 * d.K, rows,
                         y + (int64_t)m0 * d.N);
            TD_CU_LAUNCH("gemv_kernel");
        }
    } else {
        dim3 grid(td_cu_blocks((size_t)d.N, TILE), td_cu_blocks((size_t)M, TILE));
        TD_ASSERT(grid.y <= 65535);
        TD_CU_KERNEL(tiled_kernel<KIND>, grid, TILED_THREADS, st, d, x, M, y);
        TD_CU_LAUNCH("tiled_kernel");
    }
}

extern "C" void td_cuda_matmul(td_backend *b, const td_tensor *W, const float *x, int M, float *y) {
    const char *why;
    if (!td_matmul_supported(W, &why)) {
        fprintf(stderr, "cuda matmul: %s: %s\n", W->name ? W->name : "?", why);
        TD_ASSERT(!"matmul: unsupported weight");
    }
    if (M <= 0 || W->shape[0] <= 0) return;
    wdesc d;
    memset(&d, 0, sizeof d);
    d.data = (const uint8_t *)W->data;
    d.scales = W->scales;
    d.sdt = (int)W->scales_dtype;
    d.N = W->shape[0];
    d.K = W->shape[1];
    d.post = 1.0f;
    switch (W->dtype) {
    case TD_DTYPE_F32: launch<KF32>(b, d, x, M, y); break;
    case TD_DTYPE_BF16: launch<KBF16>(b, d, x, M, y); break;
    case TD_DTYPE_F16: launch<KF16>(b, d, x, M, y); break;
    case TD_DTYPE_F8_E4M3:
        if (!W->scales) {
            d.post = W->scale_f * 256.0f;
            launch<KF8>(b, d, x, M, y);
        } else {
            d.bn = W->scale_block[0];
            d.bk = W->scale_block[1];
            d.sc = (d.K + d.bk - 1) / d.bk;
            launch<KF8B>(b, d, x, M, y);
        }
        break;
    case TD_DTYPE_Q8: launch<KQ8>(b, d, x, M, y); break;
    case TD_DTYPE_NVFP4: d.post = W->scale_f; launch<KFP4>(b, d, x, M, y); break;
    default: TD_ASSERT(!"matmul: unsupported weight dtype");
    }
}
