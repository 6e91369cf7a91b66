/* The CUDA backend's fast mode, op by op against the CPU reference: the
 * cuBLAS BF16 GEMM for prompt-sized batches (every weight dtype, staging
 * buffers capped into chunks), the cuBLASLt FP8 / NVFP4 tensor-core paths on
 * each device generation (cuemu's TD_CUEMU_SM; a GPU is its own), and the split
 * (flash-decoding) attention for decode rows and the tiled attention for
 * prompt chunks. These are CUDA's own libraries and kernels, so a
 * stand-in backend has none: without a CUDA device the test checks the one-line
 * refusal and skips (tests/c/cuda_test_util.h). The exact kernels are
 * test_backend_cuda's. */
#include "cuda_test_util.h"
#include "model/config.h"

/* The fast mode (batch_invariant false): M > 16 (BF16 weights) or M > 128
 * (the others) goes to cuBLAS with BF16 activations and weights. Bound: |y - ref| <= 2^-6 sum_k |x_k w_k| + 1e-6
 * (each product carries at most ~2^-8 + 2^-8 of BF16 rounding; 2^-6 leaves
 * room for the f32 sums; a wrong layout or scale is off by O(sum |x w|)).
 * With the staging buffers capped, the rows and the weight rows take several
 * chunks. Below the thresholds the exact kernels' bits stay. */
static void test_matmul_fast(void) {
    const int Ms[] = {17, 70, 129, 150};
    const int MMAX = 150;
    cu->batch_invariant = false;
    int on = 0;
    uint64_t calls0 = 0, calls = 0;
    for (int caps = 0; caps < 2; caps++) {
        /* caps 1: 16 weight rows of K = 96 (3 KiB) and 24 activation rows per chunk */
        CHECK(td_backend_cuda_gemm_caps(cu, caps ? 16 * 96 * 2 : 0, caps ? 24 * 96 * 2 : 0) == 0, "gemm caps");
        for (int kind = 0; kind < 8; kind++) {
            int64_t N = 37, K = 96;
            weight w = make_weight(kind, N, K);
            float *x = malloc(sizeof(float) * (size_t)(MMAX * K));
            for (int64_t i = 0; i < MMAX * K; i++) x[i] = rndf();
            float *ref = malloc(sizeof(float) * (size_t)(MMAX * N)), *got = malloc(sizeof(float) * (size_t)(MMAX * N));
            float *exact = malloc(sizeof(float) * (size_t)(MMAX * N));
            cpu->ops->matmul(cpu, &w.W, x, MMAX, ref);
            /* sum |x w| per output, from the CPU's dequantized weights (the matmul of |x| and |W|
               would need |W| in every dtype: take the rows one unit vector at a time instead) */
            float *wf = malloc(sizeof(float) * (size_t)(N * K)), *e = calloc((size_t)K, sizeof(float));
            for (int64_t k = 0; k < K; k++) {
                e[k] = 1.0f;
                float *col = malloc(sizeof(float) * (size_t)N);
                cpu->ops->matmul(cpu, &w.W, e, 1, col);
                for (int64_t n = 0; n < N; n++) wf[n * K + k] = col[n];
                free(col);
                e[k] = 0.0f;
            }
            td_tensor Wd;
            td_err err;
            CHECK(td_bk_tensor_load(cu, &w.W, &Wd, &err) == 0, "%s: load: %s", w.name, err.msg);
            float *dx = dev_copy(x, sizeof(float) * (size_t)(MMAX * K));
            float *dy = cu->ops->alloc(cu, sizeof(float) * (size_t)(MMAX * N));
            CHECK(td_backend_cuda_gemm_info(cu, &on, &calls0) == 0 && on, "%s: the fast GEMM is set up", w.name);
            for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                int M = Ms[mi];
                cu->ops->fill0(cu, dy, sizeof(float) * (size_t)(MMAX * N));
                cu->ops->matmul(cu, &Wd, dx, M, dy);
                td_bk_download(cu, got, dy, sizeof(float) * (size_t)(M * N));
                double worst = 0;
                int64_t at = 0;
                for (int64_t m = 0; m < M; m++)
                    for (int64_t n = 0; n < N; n++) {
                        double mag = 0;
                        for (int64_t k = 0; k < K; k++) mag += fabs((double)x[m * K + k] * wf[n * K + k]);
                        double r = fabs((double)got[m * N + n] - ref[m * N + n]) / (mag * 0x1p-6 + 1e-6);
                        if (!(r <= worst)) { worst = r; at = m * N + n; }
                    }
                CHECK(worst <= 1.0, "%s fast M=%d caps %d: %.9g vs cpu %.9g at %lld (%.3g of the bound)", w.name, M, caps, got[at], ref[at],
                      (long long)at, worst);
            }
            td_backend_cuda_gemm_info(cu, &on, &calls);
            /* one call per (row chunk, weight chunk) of each M over the dtype's threshold; BF16
               weights are read in place in one chunk */
            uint64_t want = 0;
            for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                if (Ms[mi] <= (kind == 1 ? 16 : 128)) continue;
                int64_t mch = caps ? (Ms[mi] + 23) / 24 : 1, nch = caps && kind != 1 ? (N + 15) / 16 : 1;
                want += (uint64_t)(mch * nch);
            }
            CHECK(calls - calls0 == want, "%s caps %d: %llu cuBLAS calls, %llu expected", w.name, caps,
                  (unsigned long long)(calls - calls0), (unsigned long long)want);
            /* up to the threshold (16 rows BF16, 128 the others) the exact kernels' bits */
            const int mt = kind == 1 ? 16 : 128;
            cu->ops->matmul(cu, &Wd, dx, mt, dy);
            td_bk_download(cu, exact, dy, sizeof(float) * (size_t)(mt * N));
            size_t bad = 0;
            if (cpu->isa != TD_ISA_C)
                CHECK(same_bits(exact, ref, (size_t)(mt * N), &bad), "%s fast mode, M=%d: cuda %.9g vs cpu %.9g at %zu", w.name, mt,
                      exact[bad], ref[bad], bad);
            td_backend_cuda_gemm_info(cu, &on, &calls0);
            CHECK(calls0 == calls, "%s: M=%d issued no cuBLAS call", w.name, mt);
            td_bk_tensor_free(cu, &Wd);
            cu->ops->free(cu, dx);
            cu->ops->free(cu, dy);
            free(x); free(ref); free(got); free(exact); free(wf); free(e); free(w.data); free(w.scales);
        }
    }
    CHECK(td_backend_cuda_gemm_caps(cu, 0, 0) == 0 && td_backend_cuda_gemm_caps(cpu, 0, 0) == TD_ERR_ARG, "caps reset; a CPU backend refused");
    cu->batch_invariant = true;
}

/* ---- the cuBLASLt paths (cuda_lt.cu): FP8 and NVFP4 weights on their own tensor cores ----
 * The host quantizers below restate the rules (each by search over the
 * format's values, nearest with ties to the even code, not by the kernels'
 * arithmetic), and the reference is sum_k deq(q(x)) w in double: the device
 * must match it within f32 summation error (1e-5 of sum |deq(q(x)) w|). A
 * wrong nibble order, scale tile, row stride, chunk offset or alpha is off by
 * O(1) of that sum. Odd rows have absmax 1.5, even rows 0.45: every
 * chunk of two rows or more (each chunk here) has absmax 1.5, so NVFP4's
 * chunk scale g and FP8's tensor-wide activation scale do not depend on how
 * rows are chunked, while a per-row scale in their place (or the first row's
 * for the chunk) gives other codes. */

/* e4m3 code nearest to v (ties: even code), saturating at 448; what the kernels round activations and scales with */
static uint8_t host_e4m3(float v) {
    float a = fabsf(v);
    uint8_t best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 0x7f; c++) { /* 0x7f is NaN */
        double d = fabs((double)td_fp8_e4m3_to_f32((uint8_t)c) - a);
        if (d < bd || (d == bd && !(c & 1))) { bd = d; best = (uint8_t)c; }
    }
    return (uint8_t)(best | (v < 0 ? 0x80 : 0));
}
static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
static uint8_t host_e2m1(float v) {
    float a = fabsf(v);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 8; c++) {
        double d = fabs((double)e2m1_mag[c] - a);
        if (d < bd || (d == bd && !(c & 1))) { bd = d; best = c; }
    }
    return (uint8_t)(best | (v < 0 ? 8 : 0));
}

/* xq[m, k]: the activation as the path quantizes it (dequantized, f64), divided by NVFP4's g.
 * FP8 per-tensor: one scale per row on sm_90 (outer-vector scales), one for all rows elsewhere. */
static void host_quant(int path, int sm, const float *x, int M, int64_t K, double *xq) {
    float g = 1.0f, all = 0.0f;
    for (int64_t i = 0; i < M * K; i++) all = fmaxf(all, fabsf(x[i]));
    if (path == 1) {
        float am = 0.0f;
        for (int64_t i = 0; i < M * K; i++) am = fmaxf(am, fabsf(x[i]));
        g = am > 0 ? 2688.0f / am : 1.0f;
    }
    for (int m = 0; m < M; m++) {
        const float *r = x + (int64_t)m * K;
        if (path == 2) {
            for (int64_t c = 0; c < K / 128; c++) {
                float am = 0.0f;
                for (int i = 0; i < 128; i++) am = fmaxf(am, fabsf(r[c * 128 + i]));
                float s = am > 0 ? am / 448.0f : 1.0f;
                for (int i = 0; i < 128; i++) xq[m * K + c * 128 + i] = (double)td_fp8_e4m3_to_f32(host_e4m3(r[c * 128 + i] / s)) * s;
            }
        } else if (path == 0) {
            float am = 0.0f;
            for (int64_t k = 0; k < K; k++) am = fmaxf(am, fabsf(r[k]));
            if (sm != 90) am = all;
            float s = am > 0 ? am / 448.0f : 1.0f;
            for (int64_t k = 0; k < K; k++) xq[m * K + k] = (double)td_fp8_e4m3_to_f32(host_e4m3(r[k] / s)) * s;
        } else {
            for (int64_t c = 0; c < K / 16; c++) {
                float mb = 0.0f;
                for (int i = 0; i < 16; i++) mb = fmaxf(mb, fabsf(r[c * 16 + i]));
                float sb = td_fp8_e4m3_to_f32(host_e4m3(mb / 6.0f * g)), inv = sb > 0 ? g / sb : 0.0f;
                for (int i = 0; i < 16; i++) {
                    uint8_t q = host_e2m1(r[c * 16 + i] * inv);
                    double v = (q & 8) ? -e2m1_mag[q & 7] : e2m1_mag[q & 7];
                    xq[m * K + c * 16 + i] = v * sb / g;
                }
            }
        }
    }
}

/* A CUDA backend on cuemu's device generation `sm` (TD_CUEMU_SM, left set:
 * cuemu's cuBLASLt reads it when the backend sets it up; a real device
 * ignores it). */
static td_backend *cuda_with_sm(const char *sm) {
    td_err err;
    td_backend *b = NULL;
    setenv("TD_CUEMU_SM", sm, 1);
    CHECK(td_backend_create("cuda", 1, &b, &err) == 0, "%s", err.msg);
    b->batch_invariant = false;
    return b;
}

/* The weight of an lt path: 0 FP8 per-tensor, 1 NVFP4 (positive scales: ue4m3), 2 FP8 with 128 x 128 block scales,
 * 3 FP8 per-channel ([N, 1] scales; the FP8B path's too) (f32 or bf16 scales). */
static weight lt_weight(int path, int64_t N, int64_t K, int bf16_scales) {
    weight w = make_weight(path == 0 ? 3 : path == 1 ? 6 : 4, N, K);
    if (path == 1)
        for (int64_t i = 0; i < N * K / 16; i++) ((uint8_t *)w.scales)[i] = (uint8_t)(0x28 + rnd() % 24);
    if (path >= 2) {
        free(w.scales);
        size_t ns = path == 3 ? (size_t)N : (size_t)(((N + 127) / 128) * ((K + 127) / 128));
        w.W.scale_block[0] = path == 3 ? 1 : 128;
        w.W.scale_block[1] = path == 3 ? K : 128;
        w.W.scales_dtype = bf16_scales ? TD_DTYPE_BF16 : TD_DTYPE_F32;
        w.scales = malloc(ns * 4);
        for (size_t i = 0; i < ns; i++) {
            float v = 0.01f + 0.02f * (rndf() + 1.0f);
            if (bf16_scales) ((uint16_t *)w.scales)[i] = td_f32_to_bf16(v);
            else ((float *)w.scales)[i] = v;
        }
        w.W.scales = w.scales;
        w.name = path == 3 ? (bf16_scales ? "fp8 per-channel (bf16 scales)" : "fp8 per-channel (f32 scales)")
                           : (bf16_scales ? "fp8 block 128x128 (bf16 scales)" : "fp8 block 128x128 (f32 scales)");
    }
    return w;
}

/* The weight, M rows of x and an M x N output on backend b. */
typedef struct { td_tensor Wd; void *dx; float *dy; } lt_dev;
static lt_dev lt_dev_load(td_backend *b, const weight *w, const float *x, int64_t M, int64_t N, int64_t K) {
    lt_dev d;
    td_err err;
    CHECK(td_bk_tensor_load(b, &w->W, &d.Wd, &err) == 0, "%s: load: %s", w->name, err.msg);
    d.dx = b->ops->alloc(b, sizeof(float) * (size_t)(M * K));
    td_bk_upload(b, d.dx, x, sizeof(float) * (size_t)(M * K));
    d.dy = b->ops->alloc(b, sizeof(float) * (size_t)(M * N));
    return d;
}
static void lt_dev_free(td_backend *b, lt_dev *d) {
    td_bk_tensor_free(b, &d->Wd);
    b->ops->free(b, d->dx);
    b->ops->free(b, d->dy);
}

/* The bound against the host quantizer, as a fraction of sum |q(x) w|: 1e-5
 * (f32 summation) under cuemu, whose cuBLASLt sums exactly in double; 2^-10
 * on a GPU, whose FP8 / FP4 tensor cores accumulate with fewer bits between
 * promotions to f32 (about 14 on Hopper, DeepSeek-V3 report section 3.3.2).
 * Either is far below the O(1) of a wrong layout, scale or nibble order. */
static double lt_tol = 1e-5;

static void lt_case(td_backend *b, int path, int64_t N, int64_t K, int caps) {
    const int Ms[] = {129, 300};
    const int ctr = path == 3 ? 2 : path; /* per-channel FP8 is the FP8B path's (counters, on[]) */
    const int MMAX = 300;
    weight w = lt_weight(path, N, K, caps);
    float *x = malloc(sizeof(float) * (size_t)(MMAX * K));
    for (int64_t i = 0; i < MMAX * K; i++) x[i] = rndf();
    for (int m = 0; m < MMAX; m++) {
        x[(int64_t)m * K + (m * 7) % K] = m & 1 ? 1.5f : -1.5f; /* absmax 1.5 in odd rows, 0.45 in even ones */
        if (!(m & 1))
            for (int64_t k = 0; k < K; k++) x[(int64_t)m * K + k] *= 0.3f; /* not a power of 2: e4m3 codes change with the scale */
    }
    /* dequantized weights from the CPU backend, one unit vector at a time */
    float *wf = malloc(sizeof(float) * (size_t)(N * K)), *e = calloc((size_t)K, sizeof(float)), *col = malloc(sizeof(float) * (size_t)N);
    for (int64_t k = 0; k < K; k++) {
        e[k] = 1.0f;
        cpu->ops->matmul(cpu, &w.W, e, 1, col);
        for (int64_t n = 0; n < N; n++) wf[n * K + k] = col[n];
        e[k] = 0.0f;
    }
    float *ref = malloc(sizeof(float) * (size_t)(MMAX * N)), *got = malloc(sizeof(float) * (size_t)(MMAX * N));
    cpu->ops->matmul(cpu, &w.W, x, MMAX, ref);
    lt_dev dv = lt_dev_load(b, &w, x, MMAX, N, K);
    /* caps 1: 128 weight rows' tiled scales (NVFP4) / 256 scale floats (FP8) and ~100 / ~77 activation rows per chunk */
    int64_t cols4 = (K / 16 + 3) / 4 * 4;
    CHECK(td_backend_cuda_gemm_caps(b, caps ? (size_t)(path == 1 ? 128 * cols4 : path != 2 ? 1024 : 0) : 0, caps ? 9072 : 0) == 0,
          "caps");
    int sm, on[3];
    uint64_t c0[3], c1[3];
    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
        int M = Ms[mi];
        double *xq = malloc(sizeof(double) * (size_t)(M * K));
        td_backend_cuda_lt_info(b, &sm, on, c0);
        host_quant(path == 3 ? 0 : path, sm, x, M, K, xq);
        b->ops->fill0(b, dv.dy, sizeof(float) * (size_t)(MMAX * N));
        b->ops->matmul(b, &dv.Wd, dv.dx, M, dv.dy);
        td_bk_download(b, got, dv.dy, sizeof(float) * (size_t)(M * N));
        td_backend_cuda_lt_info(b, &sm, on, c1);
        CHECK(c1[ctr] > c0[ctr] + (caps ? 1 : 0), "%s sm_%d M=%d caps %d: %llu cublasLtMatmul calls", w.name, sm, M, caps,
              (unsigned long long)(c1[ctr] - c0[ctr]));
        double worst = 0, worst_f = 0, want_at = 0;
        int64_t at = 0;
        /* FP8B takes rows in fours: the last M % 4 are the exact kernels' (the CPU's bits) */
        int64_t Mq = path == 2 ? M / 4 * 4 : M;
        size_t bad = 0;
        if (Mq < M && cpu->isa != TD_ISA_C)
            CHECK(same_bits(got + Mq * N, ref + Mq * N, (size_t)((M - Mq) * N), &bad), "%s: the last %lld rows differ from the CPU at %zu",
                  w.name, (long long)(M - Mq), bad);
        for (int64_t m = 0; m < Mq; m++)
            for (int64_t n = 0; n < N; n++) {
                double want = 0, mag = 0, magx = 0;
                for (int64_t k = 0; k < K; k++) {
                    want += xq[m * K + k] * wf[n * K + k];
                    mag += fabs(xq[m * K + k] * wf[n * K + k]);
                    magx += fabs((double)x[m * K + k] * wf[n * K + k]);
                }
                double r = fabs((double)got[m * N + n] - want) / (mag * lt_tol + 1e-30);
                if (!(r <= worst)) { worst = r; at = m * N + n; want_at = want; }
                /* against the unquantized f32 result: e4m3 keeps 3 mantissa bits (2^-4 of each
                   product), NVFP4's e2m1 1 bit under a rounded block scale (up to 1/3 of a product) */
                double rf = fabs((double)got[m * N + n] - ref[m * N + n]) / (magx * (path == 1 ? 0.5 : 0x1p-3) + 1e-30);
                if (!(rf <= worst_f)) worst_f = rf;
            }
        CHECK(worst <= 1.0, "%s sm_%d M=%d caps %d: %.9g vs host-quantized %.9g at %lld (%.3g of the %g bound)", w.name, sm, M, caps,
              got[at], want_at, (long long)at, worst, lt_tol);
        CHECK(worst_f <= 1.0, "%s sm_%d M=%d caps %d: %.3g of the bound against f32", w.name, sm, M, caps, worst_f);
        free(xq);
    }
    CHECK(td_backend_cuda_gemm_caps(b, 0, 0) == 0, "caps reset");
    lt_dev_free(b, &dv);
    free(x); free(wf); free(e); free(col); free(ref); free(got); free(w.data); free(w.scales);
}

/* A shape or device a path does not take: the BF16 cuBLAS path (or the exact kernels up to 128 rows) instead. */
static void lt_fallback(td_backend *b, int path, int64_t N, int64_t K, int M) {
    weight w = lt_weight(path, N, K, 0);
    const int ctr = path == 3 ? 2 : path;
    float *x = malloc(sizeof(float) * (size_t)(M * K)), *y = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = rndf();
    lt_dev dv = lt_dev_load(b, &w, x, M, N, K);
    int sm, on[3], gon;
    uint64_t c0[3], c1[3], g0, g1;
    td_backend_cuda_lt_info(b, &sm, on, c0);
    td_backend_cuda_gemm_info(b, &gon, &g0);
    b->ops->matmul(b, &dv.Wd, dv.dx, M, dv.dy);
    td_bk_download(b, y, dv.dy, sizeof(float) * (size_t)(M * N));
    td_backend_cuda_lt_info(b, &sm, on, c1);
    td_backend_cuda_gemm_info(b, &gon, &g1);
    CHECK(c1[ctr] == c0[ctr], "%s sm_%d N=%lld K=%lld M=%d: no cuBLASLt call", w.name, sm, (long long)N, (long long)K, M);
    CHECK(g1 - g0 == (M > 128 ? 1u : 0u), "%s sm_%d N=%lld M=%d: %llu BF16 cuBLAS calls", w.name, sm, (long long)N, M,
          (unsigned long long)(g1 - g0));
    lt_dev_free(b, &dv);
    free(x); free(y); free(w.data); free(w.scales);
}

static void test_matmul_lt(void) {
    static const char *const sms[] = {"120", "90", "89", "80"};
    const char *old = getenv("TD_CUEMU_SM");
    char keep[16] = "";
    if (old) snprintf(keep, sizeof keep, "%s", old);
    /* the emulator: a backend reports the generation TD_CUEMU_SM asks for (a GPU its own, whatever is asked) */
    int probe_sm[2];
    for (int i = 0; i < 2; i++) {
        td_backend *p = cuda_with_sm(i ? "86" : "75");
        int on[3];
        uint64_t calls[3];
        td_backend_cuda_lt_info(p, &probe_sm[i], on, calls);
        td_backend_free(p);
    }
    bool emulated = probe_sm[0] == 75 && probe_sm[1] == 86;
    lt_tol = emulated ? 1e-5 : 0x1p-10;
    printf("cuda_fast_ops: cuBLASLt on %s: bound %g of sum |q(x) w|\n", emulated ? "cuemu" : "a GPU", lt_tol);
    for (int si = 0; si < 4; si++) {
        td_backend *b = cuda_with_sm(sms[si]);
        int sm, on[3];
        uint64_t calls[3];
        /* the paths are set up with the cuBLAS GEMM: one quantized matmul over 128 rows does it */
        lt_fallback(b, 0, 37, 96, 129); /* N % 4: not a cuBLASLt shape */
        CHECK(td_backend_cuda_lt_info(b, &sm, on, calls) == 0, "lt_info");
        CHECK(td_backend_cuda_lt_info(cpu, &sm, on, calls) == TD_ERR_ARG, "lt_info refuses a CPU backend");
        td_backend_cuda_lt_info(b, &sm, on, calls);
        CHECK(on[0] == (sm >= 89) && on[1] == (sm >= 100) && on[2] == (sm == 90), "sm_%d: paths %d %d %d", sm, on[0], on[1], on[2]);
        const char *mode = td_backend_cuda_mode(b);
        CHECK(mode && (strstr(mode, "FP8") != NULL) == (on[0] != 0) && (strstr(mode, "NVFP4") != NULL) == (on[1] != 0), "mode line: %s",
              mode ? mode : "(null)");
        for (int path = 0; path < 4; path++) { /* 3: FP8 per-channel, on the FP8B path (sm_90: outer-vector weight scales) */
            int64_t K = path == 2 ? 256 : 96;
            const int ctr = path == 3 ? 2 : path;
            if (path == 2 && on[2]) {
                /* 128 x 128 blocks: the heuristic decides (cuBLAS documents them for sm_90; cuemu has them on 90 only).
                   One matmul: taken, or refused and then off (its result is the BF16 path's, not checked here) */
                weight w = lt_weight(2, 260, 256, 0);
                float *x0 = calloc(132 * 256, sizeof(float));
                lt_dev dv = lt_dev_load(b, &w, x0, 132, 260, 256);
                b->ops->matmul(b, &dv.Wd, dv.dx, 132, dv.dy);
                lt_dev_free(b, &dv);
                free(x0); free(w.data); free(w.scales);
                td_backend_cuda_lt_info(b, &sm, on, calls);
                CHECK(on[2] == (calls[2] > 0) && (on[2] || sm != 90), "sm_%d: the FP8 128x128-block path taken %d, calls %llu", sm,
                      on[2], (unsigned long long)calls[2]);
                if (!on[2]) {
                    printf("cuda_fast_ops: sm_%d: the FP8 128x128-block path was refused (BF16 tensor cores instead)\n", sm);
                    lt_fallback(b, 2, 260, 256, 150);
                    continue;
                }
            }
            if (on[ctr]) {
                for (int caps = 0; caps < 2; caps++) lt_case(b, path, 260, K, caps);
                lt_case(b, path, 132, path == 2 ? 384 : 160, 0);
                lt_fallback(b, path, 38, K, 150); /* N % 4 */
                lt_fallback(b, path, 40, path == 2 ? 160 : 48, 150); /* K % 32 (FP8B: K % 128) */
                lt_fallback(b, path, 40, K, 128); /* decode / verify rows: the exact kernels */
            } else {
                lt_fallback(b, path, 40, K, 150);
            }
        }
        td_backend_cuda_lt_info(b, &sm, on, calls);
        printf("cuda_fast_ops: sm_%d: FP8 path %s, NVFP4 path %s, FP8 128x128-block path %s\n", sm, on[0] ? "on" : "off",
               on[1] ? "on" : "off", on[2] ? "on" : "off");
        td_backend_free(b);
    }
    /* TANDEM_CUDA_LT=0: every path off whatever the device */
    setenv("TANDEM_CUDA_LT", "0", 1);
    td_backend *b = cuda_with_sm("120");
    for (int path = 0; path < 3; path++) lt_fallback(b, path, 40, 256, 150);
    int sm, on[3];
    uint64_t calls[3];
    td_backend_cuda_lt_info(b, &sm, on, calls);
    CHECK(!on[0] && !on[1] && !on[2], "TANDEM_CUDA_LT=0 turns every path off");
    td_backend_free(b);
    unsetenv("TANDEM_CUDA_LT");
    if (*keep) setenv("TD_CUEMU_SM", keep, 1);
    else unsetenv("TD_CUEMU_SM");
}

/* ---- the fast mode's split attention (cuda_attn.cu): long contexts in partitions ----
 * Partitions of 32 positions (TD_CUDA_ATTN_SPLIT) and max_position_embeddings 320: Z = 10; blocks per
 * (row, KV head, partition), each for the KV head's query heads.
 * Three segments in one batch: A, 3 rows at positions 297..299 (10 partitions); B, 2 rows at
 * 10..11 (one partition); C, 1 row at position 339 (past Z x P: the per-row computation).
 * Checked against the CPU within 1e-5 (f32 and bf16 KV), A's bits not the per-row kernel's
 * (the split ran and merged), B's and C's bits the per-row kernel's, and A alone gives its
 * bits in the batch (batch invariance). */
static void test_attention_split(int nh, int nkv, int hd) {
    td_config g;
    memset(&g, 0, sizeof g);
    g.n_heads = nh; g.n_kv_heads = nkv; g.head_dim = hd; g.attn_output_gate = true; g.max_position_embeddings = 320;
    enum { M = 6 };
    const int ad = nh * hd, kvd = nkv * hd, NB = 48;
    const char *old = getenv("TD_CUEMU_SM");
    char keep[16] = "";
    if (old) snprintf(keep, sizeof keep, "%s", old);
    setenv("TD_CUDA_ATTN_SPLIT", "32", 1);
    td_backend *fast = cuda_with_sm("90");
    unsetenv("TD_CUDA_ATTN_SPLIT");
    if (*keep) setenv("TD_CUEMU_SM", keep, 1); /* both are read at creation only */
    else unsetenv("TD_CUEMU_SM");
    /* blocks: A 0..18 (19 x 16 >= 300), B 19, C 20..41 (22 x 16 >= 340) */
    int32_t seg[3 * TD_SEG_FIELDS] = {297, 3, 0, 0, 0, 0, 1,  10, 2, 3, 19, 0, 0, 1,  339, 1, 5, 20, 0, 0, 1};
    int32_t bts[42], row_seg[M] = {0, 0, 0, 1, 1, 2}, toks[M] = {0};
    for (int i = 0; i < 42; i++) bts[i] = i;
    float *q = rnd_vec((size_t)M * ad, 1.5f, 0), *gate = rnd_vec((size_t)M * ad, 2.0f, 0);
    const td_kv_dtype st[] = {TD_KV_F32, TD_KV_BF16};
    for (int si = 0; si < 2; si++) {
        size_t rows = (size_t)NB * TD_KV_BLOCK, es = st[si] == TD_KV_F32 ? 4 : 2;
        td_kv_view hv = {.store = st[si], .kv_dim = kvd, .head_dim = hd}, dv = hv;
        hv.k = calloc(rows * kvd, es); hv.v = calloc(rows * kvd, es);
        td_backend *bk[2] = {cu, fast};
        void *dk[2], *dvv[2];
        for (int j = 0; j < 2; j++) {
            dk[j] = bk[j]->ops->alloc(bk[j], rows * kvd * es);
            dvv[j] = bk[j]->ops->alloc(bk[j], rows * kvd * es);
        }
        float *kk = malloc(sizeof(float) * 2 * kvd);
        float *dtmp[2] = {cu->ops->alloc(cu, sizeof(float) * 2 * kvd), fast->ops->alloc(fast, sizeof(float) * 2 * kvd)};
        for (size_t r = 0; r < 42 * TD_KV_BLOCK; r++) {
            for (int i = 0; i < 2 * kvd; i++) kk[i] = rndf() * (i < kvd ? 1.0f : 2.0f);
            cpu->ops->kv_store(cpu, &hv, r, kk, kk + kvd);
            for (int j = 0; j < 2; j++) {
                td_kv_view v = dv;
                v.k = dk[j]; v.v = dvv[j];
                td_bk_upload(bk[j], dtmp[j], kk, sizeof(float) * 2 * kvd);
                bk[j]->ops->kv_store(bk[j], &v, r, dtmp[j], dtmp[j] + kvd);
            }
        }
        td_batch hb = {.M = M, .n_seg = 3, .tokens = toks, .row_seg = row_seg, .seg = seg, .block_tables = bts};
        float *ref = malloc(sizeof(float) * M * ad), *got[2], *alone = malloc(sizeof(float) * 3 * ad);
        cpu->ops->attention(cpu, &g, &hb, q, gate, &hv, 0, ref);
        for (int j = 0; j < 2; j++) {
            td_backend *b = bk[j];
            td_kv_view v = dv;
            v.k = dk[j]; v.v = dvv[j];
            int32_t *d = b->ops->alloc(b, sizeof(int32_t) * (2 * M + sizeof seg / 4 + 42));
            td_bk_upload(b, d, toks, sizeof toks);
            td_bk_upload(b, d + M, row_seg, sizeof row_seg);
            td_bk_upload(b, d + 2 * M, seg, sizeof seg);
            td_bk_upload(b, d + 2 * M + sizeof seg / 4, bts, sizeof bts);
            td_batch db = {.M = M, .n_seg = 3, .tokens = d, .row_seg = d + M, .seg = d + 2 * M, .block_tables = d + 2 * M + sizeof seg / 4};
            float *dq = b->ops->alloc(b, sizeof(float) * M * ad), *dg = b->ops->alloc(b, sizeof(float) * M * ad);
            float *dout = b->ops->alloc(b, sizeof(float) * M * ad);
            td_bk_upload(b, dq, q, sizeof(float) * M * ad);
            td_bk_upload(b, dg, gate, sizeof(float) * M * ad);
            b->ops->attention(b, &g, &db, dq, dg, &v, 0, dout);
            got[j] = malloc(sizeof(float) * M * ad);
            td_bk_download(b, got[j], dout, sizeof(float) * M * ad);
            if (j == 1) { /* segment A alone, into a zeroed output (a second launch: the counters were reset) */
                b->ops->fill0(b, dout, sizeof(float) * M * ad);
                td_batch d1 = db;
                d1.M = 3;
                d1.n_seg = 1;
                b->ops->attention(b, &g, &d1, dq, dg, &v, 0, dout);
                td_bk_download(b, alone, dout, sizeof(float) * 3 * ad);
                /* partials for 2 rows at a time (three launches): the same bits; for none: the per-row kernel's */
                size_t row_bytes = (size_t)nh * 10 * (size_t)(hd + 2) * 4, at = 0;
                float *chunked = malloc(sizeof(float) * M * ad);
                CHECK(td_backend_cuda_gemm_caps(b, 2 * row_bytes, 0) == 0, "caps");
                b->ops->fill0(b, dout, sizeof(float) * M * ad);
                b->ops->attention(b, &g, &db, dq, dg, &v, 0, dout);
                td_bk_download(b, chunked, dout, sizeof(float) * M * ad);
                CHECK(same_bits(chunked, got[1], (size_t)M * ad, &at), "split attention in row chunks of 2 differs at %zu", at);
                CHECK(td_backend_cuda_gemm_caps(b, row_bytes - 4, 0) == 0, "caps");
                b->ops->attention(b, &g, &db, dq, dg, &v, 0, dout);
                td_bk_download(b, chunked, dout, sizeof(float) * M * ad);
                CHECK(same_bits(chunked, got[0], (size_t)M * ad, &at), "no room for a row's partials: not the per-row kernel's bits at %zu", at);
                CHECK(td_backend_cuda_gemm_caps(b, 0, 0) == 0, "caps reset");
                free(chunked);
            }
            b->ops->free(b, d); b->ops->free(b, dq); b->ops->free(b, dg); b->ops->free(b, dout);
        }
        const char *kvn = st[si] == TD_KV_F32 ? "f32" : "bf16";
        CHECK(max_abs_norm(got[1], ref, (size_t)M * ad) < 1e-5, "split attention (%d/%d heads, dim %d, kv %s) vs cpu: %g", nh, nkv, hd, kvn,
              max_abs_norm(got[1], ref, (size_t)M * ad));
        CHECK(max_abs_norm(got[0], ref, (size_t)M * ad) < 1e-5, "per-row attention (kv %s) vs cpu: %g", kvn,
              max_abs_norm(got[0], ref, (size_t)M * ad));
        size_t at = 0;
        CHECK(!same_bits(got[1], got[0], 3 * (size_t)ad, &at), "kv %s: segment A's bits are the per-row kernel's (no split ran)", kvn);
        CHECK(same_bits(got[1] + 3 * ad, got[0] + 3 * ad, 3 * (size_t)ad, &at),
              "kv %s: one partition (B) and past Z x P (C) give the per-row kernel's bits; differ at %zu", kvn, at);
        CHECK(same_bits(alone, got[1], 3 * (size_t)ad, &at), "kv %s: segment A alone differs from A in the batch at %zu", kvn, at);
        for (int j = 0; j < 2; j++) {
            bk[j]->ops->free(bk[j], dk[j]);
            bk[j]->ops->free(bk[j], dvv[j]);
            bk[j]->ops->free(bk[j], dtmp[j]);
            free(got[j]);
        }
        free(hv.k); free(hv.v); free(kk); free(ref); free(alone);
    }
    free(q); free(gate);
    td_backend_free(fast);
}

/* ---- the fast mode's tiled attention for prompt chunks (cuda_attn.cu) ----
 * M = 171 > 128 rows in three segments: A, a prompt chunk of 150 rows at
 * positions 40..189 (a prefix-cache hit's tail: 40 positions before it);
 * B, one decode row at position 75; C, a first chunk of 20 rows at 0..19.
 * Block tables are a permutation of the pool's blocks, and KV slots are
 * position + shift (0, and 1 as the MTP layer's). In f32, bf16 and fp8 KV:
 * the f32 tiles (TD_CUDA_ATTN_TILE=1) within 1e-5 of the CPU norm-wise and
 * not the per-row kernel's bits (they ran); the tensor-core tiles (the
 * default on sm_80+: bf16 operands) within 1e-2 and not the f32 tiles' bits;
 * on sm_75 the default gives the f32 tiles' bits; TD_CUDA_ATTN_TILE=0, the
 * batch-invariant mode and a 128-row batch give the per-row kernel's bits. */
static double mma_worst;
static void test_attention_tile(int nh, int nkv, int hd) {
    td_config g;
    memset(&g, 0, sizeof g);
    g.n_heads = nh; g.n_kv_heads = nkv; g.head_dim = hd; g.attn_output_gate = true; g.max_position_embeddings = 320;
    enum { M = 171, NB = 24, NBT = 20, NBK = 5 };
    const int ad = nh * hd, kvd = nkv * hd;
    /* 0: default on sm_90 (tensor cores); 1: TD_CUDA_ATTN_TILE=0; 2: cu (batch-invariant); 3: TILE=1; 4: default on sm_75 */
    td_backend *bk[NBK] = {cuda_with_sm("90"), NULL, cu, NULL, cuda_with_sm("75")};
    setenv("TD_CUDA_ATTN_TILE", "0", 1);
    bk[1] = cuda_with_sm("90");
    setenv("TD_CUDA_ATTN_TILE", "1", 1);
    bk[3] = cuda_with_sm("90");
    unsetenv("TD_CUDA_ATTN_TILE");
    unsetenv("TD_CUEMU_SM");
    int32_t seg[3 * TD_SEG_FIELDS] = {40, 150, 0, 0, 0, 0, 1,  75, 1, 150, 13, 0, 0, 1,  0, 20, 151, 18, 0, 0, 1};
    int32_t bts[NBT], row_seg[M], toks[M] = {0};
    for (int i = 0; i < NBT; i++) bts[i] = (7 * i + 5) % NB; /* 7 is prime to 24: distinct blocks */
    for (int m = 0; m < M; m++) row_seg[m] = m < 150 ? 0 : m == 150 ? 1 : 2;
    float *q = rnd_vec((size_t)M * ad, 1.5f, 0), *gate = rnd_vec((size_t)M * ad, 2.0f, 0);
    const td_kv_dtype st[] = {TD_KV_F32, TD_KV_BF16, TD_KV_FP8};
    for (int si = 0; si < 3; si++)
        for (int shift = 0; shift < 2; shift++) {
            size_t rows = (size_t)NB * TD_KV_BLOCK, es = st[si] == TD_KV_F32 ? 4 : st[si] == TD_KV_BF16 ? 2 : 1;
            td_kv_view hv = {.store = st[si], .kv_dim = kvd, .head_dim = hd};
            hv.k = calloc(rows * kvd, es); hv.v = calloc(rows * kvd, es);
            if (st[si] == TD_KV_FP8) hv.ks = calloc(rows * nkv, sizeof(float)), hv.vs = calloc(rows * nkv, sizeof(float));
            td_kv_view dv[NBK];
            float *kk = malloc(sizeof(float) * 2 * kvd), *dtmp[NBK];
            for (int j = 0; j < NBK; j++) {
                td_backend *b = bk[j];
                dv[j] = hv;
                dv[j].k = b->ops->alloc(b, rows * kvd * es);
                dv[j].v = b->ops->alloc(b, rows * kvd * es);
                if (st[si] == TD_KV_FP8) dv[j].ks = b->ops->alloc(b, rows * nkv * 4), dv[j].vs = b->ops->alloc(b, rows * nkv * 4);
                dtmp[j] = b->ops->alloc(b, sizeof(float) * 2 * kvd);
            }
            for (size_t r = 0; r < rows; r++) {
                for (int i = 0; i < 2 * kvd; i++) kk[i] = rndf() * (i < kvd ? 1.0f : 2.0f);
                cpu->ops->kv_store(cpu, &hv, r, kk, kk + kvd);
                for (int j = 0; j < NBK; j++) {
                    td_bk_upload(bk[j], dtmp[j], kk, sizeof(float) * 2 * kvd);
                    bk[j]->ops->kv_store(bk[j], &dv[j], r, dtmp[j], dtmp[j] + kvd);
                }
            }
            td_batch hb = {.M = M, .n_seg = 3, .tokens = toks, .row_seg = row_seg, .seg = seg, .block_tables = bts};
            float *ref = malloc(sizeof(float) * M * ad), *got[NBK + 1];
            cpu->ops->attention(cpu, &g, &hb, q, gate, &hv, shift, ref);
            for (int j = 0; j <= NBK; j++) { /* NBK: backend 0 with 128 rows of A */
                td_backend *b = bk[j < NBK ? j : 0];
                const int Mj = j < NBK ? M : 128;
                int32_t seg1[TD_SEG_FIELDS] = {40, 128, 0, 0, 0, 0, 1};
                int32_t *d = b->ops->alloc(b, sizeof(int32_t) * (2 * M + sizeof seg / 4 + NBT));
                td_bk_upload(b, d, toks, sizeof toks);
                td_bk_upload(b, d + M, row_seg, sizeof row_seg);
                td_bk_upload(b, d + 2 * M, j < NBK ? seg : seg1, j < NBK ? sizeof seg : sizeof seg1);
                td_bk_upload(b, d + 2 * M + sizeof seg / 4, bts, sizeof bts);
                td_batch db = {.M = Mj, .n_seg = j < NBK ? 3 : 1, .tokens = d, .row_seg = d + M, .seg = d + 2 * M,
                               .block_tables = d + 2 * M + sizeof seg / 4};
                float *dq = b->ops->alloc(b, sizeof(float) * M * ad), *dg = b->ops->alloc(b, sizeof(float) * M * ad);
                float *dout = b->ops->alloc(b, sizeof(float) * M * ad);
                td_bk_upload(b, dq, q, sizeof(float) * M * ad);
                td_bk_upload(b, dg, gate, sizeof(float) * M * ad);
                b->ops->attention(b, &g, &db, dq, dg, &dv[j < NBK ? j : 0], shift, dout);
                got[j] = malloc(sizeof(float) * M * ad);
                td_bk_download(b, got[j], dout, sizeof(float) * Mj * ad);
                b->ops->free(b, d); b->ops->free(b, dq); b->ops->free(b, dg); b->ops->free(b, dout);
            }
            const char *kvn = st[si] == TD_KV_F32 ? "f32" : st[si] == TD_KV_BF16 ? "bf16" : "fp8";
            const size_t n = (size_t)M * ad;
            size_t at = 0;
            double em = max_abs_norm(got[0], ref, n), ef = max_abs_norm(got[3], ref, n);
            if (em > mma_worst) mma_worst = em;
            CHECK(ef < 1e-5, "f32 tiles (%d/%d heads, dim %d, kv %s, shift %d) vs cpu: %g", nh, nkv, hd, kvn, shift, ef);
            CHECK(em < 1e-2, "tensor-core tiles (%d/%d heads, dim %d, kv %s, shift %d) vs cpu: %g", nh, nkv, hd, kvn, shift, em);
            CHECK(max_abs_norm(got[1], ref, n) < 1e-5, "per-row attention (kv %s) vs cpu: %g", kvn, max_abs_norm(got[1], ref, n));
            CHECK(!same_bits(got[3], got[1], n, &at), "kv %s shift %d: the f32 tiles gave the per-row kernel's bits (did not run)", kvn, shift);
            CHECK(!same_bits(got[0], got[3], n, &at), "kv %s shift %d: the default on sm_90 gave the f32 tiles' bits (no tensor cores)", kvn,
                  shift);
            CHECK(same_bits(got[4], got[3], n, &at), "kv %s: sm_75's default is not the f32 tiles at %zu", kvn, at);
            CHECK(same_bits(got[2], got[1], n, &at), "kv %s: the batch-invariant mode is not the per-row kernel at %zu", kvn, at);
            CHECK(same_bits(got[NBK], got[1], (size_t)128 * ad, &at), "kv %s: 128 rows are not the per-row kernel's at %zu", kvn, at);
            for (int j = 0; j < NBK; j++) {
                td_backend *b = bk[j];
                b->ops->free(b, dv[j].k); b->ops->free(b, dv[j].v); b->ops->free(b, dtmp[j]);
                if (st[si] == TD_KV_FP8) b->ops->free(b, dv[j].ks), b->ops->free(b, dv[j].vs);
            }
            for (int j = 0; j <= NBK; j++) free(got[j]);
            free(hv.k); free(hv.v); free(hv.ks); free(hv.vs); free(kk); free(ref);
        }
    free(q); free(gate);
    for (int j = 0; j < NBK; j++)
        if (bk[j] != cu) td_backend_free(bk[j]);
}

int main(void) {
    if (getenv("TEST_BACKEND_CUDA_STANDIN")) {
        printf("cuda_fast_ops: cuBLAS, cuBLASLt and the split attention are CUDA's own: nothing to check on a stand-in\n");
        TEST_MAIN_END("cuda_fast_ops");
    }
    if (!cuda_test_open("cuda_fast_ops", NULL)) TEST_MAIN_END("cuda_fast_ops");
    test_matmul_fast();
    test_matmul_lt();
    /* 2 and 3 query heads per KV head, 1 and 2 dims per thread */
    test_attention_split(4, 2, 48);
    test_attention_split(6, 2, 160);
    /* 2, 3 and 6 query heads per KV head (rows per block 32, 21, 10); 12, 40 and 64 dims per thread */
    cu->batch_invariant = true;
    test_attention_tile(4, 2, 48);
    test_attention_tile(6, 2, 160);
    test_attention_tile(12, 2, 256);
    printf("cuda_fast_ops: tensor-core attention tiles vs the CPU: worst %.3g of max |out|\n", mma_worst);
    printf("cuda_fast_ops: on the device (cpu kernels: %s)\n", td_isa_name((td_isa)cpu->isa));
    td_backend_free(cu);
    td_backend_free(cpu);
    TEST_MAIN_END("cuda_fast_ops");
}
