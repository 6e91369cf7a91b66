/* The CUDA backend against the CPU reference, op by op (matmul in every
 * weight dtype and its batch invariance, rmsnorm, add, silu_mul, embed,
 * argmax, KV rows in every KV dtype, the memory ops, fill_random, the sample op, attn_prep
 * and attention, gdn_conv and gdn_recur on a two-segment batch). The
 * whole engine on CUDA is the rest of the suite with TANDEM_BACKEND=cuda
 * (scripts/gpu-check.sh).
 *
 * Without CUDA (a build with CUDA=0, or no device / driver, as on the CI
 * machine) td_backend_create("cuda") must fail with one clear line; the test
 * checks that and skips the device checks. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "model/config.h"
#include "sample/sampler.h"
#include "util/err.h"

static td_backend *cpu, *cu;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { /* xorshift64*: reproducible test data */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)(rnd() >> 8) / (float)(1u << 24) * 2.0f - 1.0f; } /* [-1, 1) */

static void *dev_copy(const void *h, size_t n) {
    void *d = cu->ops->alloc(cu, n);
    TD_ASSERT(d);
    td_bk_upload(cu, d, h, n);
    return d;
}
static int same_bits(const float *a, const float *b, size_t n, size_t *at) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) { *at = i; return 0; }
    return 1;
}
static double max_rel(const float *a, const float *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / (fabs((double)ref[i]) + 1e-6);
        if (!(d <= m)) m = d; /* NaN counts as the worst */
    }
    return m;
}

/* ---- matmul ---- */

static uint8_t fp8_finite(void) { uint8_t b = (uint8_t)rnd(); return (b & 0x7f) == 0x7f ? b ^ 1 : b; }
static uint16_t f16_finite(void) { uint16_t h = (uint16_t)rnd(); return ((h >> 10) & 31) == 31 ? h & 0xbfff : h; }

typedef struct { td_tensor W; void *data, *scales; const char *name; } weight;

static weight make_weight(int kind, int64_t N, int64_t K) {
    weight w;
    memset(&w, 0, sizeof w);
    td_tensor *W = &w.W;
    W->ndim = 2; W->shape[0] = N; W->shape[1] = K; W->scale_f = 1.0f;
    size_t n = (size_t)(N * K);
    switch (kind) {
    case 0: W->dtype = TD_DTYPE_F32; w.name = "f32"; {
        float *p = malloc(n * 4); for (size_t i = 0; i < n; i++) p[i] = rndf() * 0.1f; w.data = p; } break;
    case 1: W->dtype = TD_DTYPE_BF16; w.name = "bf16"; {
        uint16_t *p = malloc(n * 2); for (size_t i = 0; i < n; i++) p[i] = td_f32_to_bf16(rndf() * 0.1f); w.data = p; } break;
    case 2: W->dtype = TD_DTYPE_F16; w.name = "f16"; {
        uint16_t *p = malloc(n * 2); for (size_t i = 0; i < n; i++) p[i] = f16_finite(); w.data = p; } break;
    case 3: W->dtype = TD_DTYPE_F8_E4M3; w.name = "fp8 per-tensor"; W->scale_f = 0.013f; {
        uint8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = fp8_finite(); w.data = p; } break;
    case 4: W->dtype = TD_DTYPE_F8_E4M3; w.name = "fp8 block (f32 scales 8x32)"; {
        uint8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = fp8_finite(); w.data = p;
        W->scale_block[0] = 8; W->scale_block[1] = 32; W->scales_dtype = TD_DTYPE_F32;
        size_t ns = (size_t)(((N + 7) / 8) * ((K + 31) / 32));
        float *s = malloc(ns * 4); for (size_t i = 0; i < ns; i++) s[i] = 0.01f + 0.02f * (rndf() + 1.0f); w.scales = s; } break;
    case 5: W->dtype = TD_DTYPE_F8_E4M3; w.name = "fp8 block (bf16 scales 16x16)"; {
        uint8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = fp8_finite(); w.data = p;
        W->scale_block[0] = 16; W->scale_block[1] = 16; W->scales_dtype = TD_DTYPE_BF16;
        size_t ns = (size_t)(((N + 15) / 16) * ((K + 15) / 16));
        uint16_t *s = malloc(ns * 2); for (size_t i = 0; i < ns; i++) s[i] = td_f32_to_bf16(0.01f + 0.02f * (rndf() + 1.0f)); w.scales = s; } break;
    case 6: W->dtype = TD_DTYPE_NVFP4; w.name = "nvfp4"; W->scale_f = 0.7f; {
        uint8_t *p = malloc(n / 2); for (size_t i = 0; i < n / 2; i++) p[i] = (uint8_t)rnd(); w.data = p;
        W->scale_block[0] = 1; W->scale_block[1] = 16; W->scales_dtype = TD_DTYPE_F8_E4M3;
        size_t ns = n / 16;
        uint8_t *s = malloc(ns); for (size_t i = 0; i < ns; i++) s[i] = (uint8_t)(0x28 + rnd() % 24); w.scales = s; } break;
    default: W->dtype = TD_DTYPE_Q8; w.name = "q8"; {
        int8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = (int8_t)rnd(); w.data = p;
        W->scale_block[0] = 1; W->scale_block[1] = 32; W->scales_dtype = TD_DTYPE_F32;
        size_t ns = n / 32;
        float *s = malloc(ns * 4); for (size_t i = 0; i < ns; i++) s[i] = 0.001f * (rndf() + 1.5f); w.scales = s; } break;
    }
    W->data = w.data;
    W->scales = w.scales;
    return w;
}

static void test_matmul(void) {
    const int Ms[] = {1, 2, 5, 16, 17, 33, 70, 128, 129, 150};
    const int MMAX = 150;
    for (int kind = 0; kind < 8; kind++) {
        /* K with a partial last chunk where the dtype allows it (nvfp4, q8: multiples of 32) */
        int64_t N = 37, K = kind >= 6 ? 96 : 72;
        weight w = make_weight(kind, N, K);
        const char *why;
        CHECK(td_matmul_supported(&w.W, &why), "%s: %s", w.name, why);
        float *x = malloc(sizeof(float) * (size_t)(MMAX * K));
        for (int64_t i = 0; i < MMAX * K; i++) x[i] = rndf();
        float *ref = malloc(sizeof(float) * (size_t)(MMAX * N)), *got = malloc(sizeof(float) * (size_t)(MMAX * N));
        cpu->ops->matmul(cpu, &w.W, x, MMAX, ref);
        td_tensor Wd;
        td_err err;
        CHECK(td_bk_tensor_load(cu, &w.W, &Wd, &err) == 0, "%s: load: %s", w.name, err.msg);
        float *dx = dev_copy(x, sizeof(float) * (size_t)(MMAX * K));
        float *dy = cu->ops->alloc(cu, sizeof(float) * (size_t)(MMAX * N));
        float *full = malloc(sizeof(float) * (size_t)(MMAX * N));
        cu->ops->matmul(cu, &Wd, dx, MMAX, dy);
        td_bk_download(cu, full, dy, sizeof(float) * (size_t)(MMAX * N));
        /* the CPU's FMA paths (AVX2 / AVX-512) have the same per-element order: same bits */
        size_t at = 0;
        if (cpu->isa != TD_ISA_C)
            CHECK(same_bits(full, ref, (size_t)(MMAX * N), &at), "%s: cuda %.9g vs cpu %.9g at %zu", w.name, full[at], ref[at], at);
        else
            CHECK(max_rel(full, ref, (size_t)(MMAX * N)) < 1e-4, "%s: rel %g", w.name, max_rel(full, ref, (size_t)(MMAX * N)));
        /* batch invariance: every M (one gemv pass, 16-row slices, tiles) gives the rows of the M = 150 pass, bit for bit */
        for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
            int M = Ms[mi];
            cu->ops->fill0(cu, dy, sizeof(float) * (size_t)(MMAX * N));
            cu->ops->matmul(cu, &Wd, dx, M, dy);
            td_bk_download(cu, got, dy, sizeof(float) * (size_t)(M * N));
            CHECK(same_bits(got, full, (size_t)(M * N), &at), "%s: M=%d differs from M=%d at %zu: %.9g vs %.9g", w.name, M, MMAX, at,
                  got[at], full[at]);
        }
        /* a row alone, at an offset (the verify rows of one sequence) */
        cu->ops->matmul(cu, &Wd, dx + 40 * K, 1, dy);
        td_bk_download(cu, got, dy, sizeof(float) * (size_t)N);
        CHECK(same_bits(got, full + 40 * N, (size_t)N, &at), "%s: row 40 alone differs at %zu", w.name, at);
        td_bk_tensor_free(cu, &Wd);
        cu->ops->free(cu, dx);
        cu->ops->free(cu, dy);
        free(x); free(ref); free(got); free(full); free(w.data); free(w.scales);
    }
}

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
    printf("backend_cuda: cuBLASLt on %s: bound %g of sum |q(x) w|\n", emulated ? "cuemu" : "a GPU", lt_tol);
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
                    printf("backend_cuda: sm_%d: the FP8 128x128-block path was refused (BF16 tensor cores instead)\n", sm);
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
        printf("backend_cuda: sm_%d: FP8 path %s, NVFP4 path %s, FP8 128x128-block path %s\n", sm, on[0] ? "on" : "off",
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

/* ---- elementwise and row ops ---- */

static void test_rows(void) {
    enum { M = 5, H = 300, V = 1000 };
    float *x = malloc(sizeof(float) * M * H), *w = malloc(sizeof(float) * H), *u = malloc(sizeof(float) * M * H);
    float *ref = malloc(sizeof(float) * M * H), *got = malloc(sizeof(float) * M * H);
    for (int i = 0; i < M * H; i++) x[i] = rndf() * 3.0f, u[i] = rndf();
    for (int i = 0; i < H; i++) w[i] = 1.0f + 0.1f * rndf();
    float *dx = dev_copy(x, sizeof(float) * M * H), *dw = dev_copy(w, sizeof(float) * H), *du = dev_copy(u, sizeof(float) * M * H);
    float *dy = cu->ops->alloc(cu, sizeof(float) * M * H);

    cpu->ops->rmsnorm(cpu, ref, x, w, M, H, 1e-6f);
    cu->ops->rmsnorm(cu, dy, dx, dw, M, H, 1e-6f);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    CHECK(max_rel(got, ref, M * H) < 1e-5, "rmsnorm rel %g", max_rel(got, ref, M * H));
    float one[H];
    cu->ops->rmsnorm(cu, dy, dx + 3 * H, dw, 1, H, 1e-6f); /* batch invariance */
    td_bk_download(cu, one, dy, sizeof one);
    size_t at;
    CHECK(same_bits(one, got + 3 * H, H, &at), "rmsnorm row 3 alone differs at %zu", at);

    memcpy(ref, x, sizeof(float) * M * H);
    cpu->ops->add(cpu, ref, u, M * H);
    cu->ops->copy(cu, dy, dx, sizeof(float) * M * H);
    cu->ops->add(cu, dy, du, M * H);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    CHECK(same_bits(got, ref, M * H, &at), "add differs at %zu", at);

    memcpy(ref, x, sizeof(float) * M * H);
    cpu->ops->silu_mul(cpu, ref, u, M * H);
    cu->ops->copy(cu, dy, dx, sizeof(float) * M * H);
    cu->ops->silu_mul(cu, dy, du, M * H);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    CHECK(max_rel(got, ref, M * H) < 1e-5, "silu_mul rel %g", max_rel(got, ref, M * H));

    /* copy with overlap (memmove semantics), copy_rows, fill0, alloc zeroed */
    cu->ops->copy(cu, dy, dx, sizeof(float) * M * H);
    cu->ops->copy(cu, dy + 7, dy, sizeof(float) * 100);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    memcpy(ref, x, sizeof(float) * M * H);
    memmove(ref + 7, ref, sizeof(float) * 100);
    CHECK(same_bits(got, ref, M * H, &at), "overlapping copy differs at %zu", at);
    cu->ops->fill0(cu, dy, sizeof(float) * M * H);
    cu->ops->copy_rows(cu, dy, H, dx + 5, H, 20, M);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    int ok = 1;
    for (int r = 0; r < M; r++)
        for (int i = 0; i < H; i++) ok &= got[r * H + i] == (i < 20 ? x[r * H + 5 + i] : 0.0f);
    CHECK(ok, "copy_rows");
    unsigned char *z = cu->ops->alloc(cu, 4096), zh[4096];
    memset(zh, 0xab, sizeof zh);
    td_bk_download(cu, zh, z, sizeof zh);
    ok = 1;
    for (size_t i = 0; i < sizeof zh; i++) ok &= zh[i] == 0;
    CHECK(ok, "alloc is zeroed");
    cu->ops->free(cu, z);
    cu->ops->free(cu, NULL);

    /* argmax: ties to the lowest index, NaNs never win, NaN at 0 keeps 0 */
    float *lg = malloc(sizeof(float) * 4 * V);
    for (int i = 0; i < 4 * V; i++) lg[i] = rndf();
    lg[0 * V + 10] = lg[0 * V + 700] = 5.0f;
    lg[1 * V + 3] = NAN; lg[1 * V + 999] = 9.0f;
    lg[2 * V + 0] = NAN;
    for (int i = 0; i < V; i++) lg[3 * V + i] = -INFINITY;
    float *dl = dev_copy(lg, sizeof(float) * 4 * V);
    int32_t *dam = cu->ops->alloc(cu, 4 * sizeof(int32_t)), am[4], amc[4];
    cu->ops->argmax(cu, dl, 4, V, dam);
    td_bk_download(cu, am, dam, sizeof am);
    cpu->ops->argmax(cpu, lg, 4, V, amc);
    for (int r = 0; r < 4; r++) CHECK(am[r] == amc[r], "argmax row %d: cuda %d cpu %d", r, am[r], amc[r]);

    /* embed in each float dtype: exact */
    for (int dt = 0; dt < 3; dt++) {
        weight e = make_weight(dt, 50, H);
        td_tensor Ed;
        td_err err;
        CHECK(td_bk_tensor_load(cu, &e.W, &Ed, &err) == 0, "embed load: %s", err.msg);
        int32_t tok[M] = {3, 49, 0, 3, 17};
        int32_t *dt_ = dev_copy(tok, sizeof tok);
        cpu->ops->embed(cpu, &e.W, tok, M, ref);
        cu->ops->embed(cu, &Ed, dt_, M, dy);
        td_bk_download(cu, got, dy, sizeof(float) * M * H);
        CHECK(same_bits(got, ref, M * H, &at), "embed %s differs at %zu", e.name, at);
        td_bk_tensor_free(cu, &Ed);
        cu->ops->free(cu, dt_);
        free(e.data);
    }
    cu->ops->free(cu, dl); cu->ops->free(cu, dam);
    cu->ops->free(cu, dx); cu->ops->free(cu, dw); cu->ops->free(cu, du); cu->ops->free(cu, dy);
    free(x); free(w); free(u); free(ref); free(got); free(lg);
}

/* ---- KV rows: store / load in each KV dtype, same bits as the CPU ---- */

static void test_kv(void) {
    enum { NKV = 2, HD = 64, D = NKV * HD, ROWS = 32 };
    const td_kv_dtype st[] = {TD_KV_F32, TD_KV_BF16, TD_KV_FP8};
    const size_t esz[] = {4, 2, 1};
    for (int s = 0; s < 3; s++) {
        td_kv_view hv = {.store = st[s], .kv_dim = D, .head_dim = HD}, dv = hv;
        hv.k = calloc(ROWS * D, esz[s]); hv.v = calloc(ROWS * D, esz[s]);
        dv.k = cu->ops->alloc(cu, ROWS * D * esz[s]); dv.v = cu->ops->alloc(cu, ROWS * D * esz[s]);
        if (st[s] == TD_KV_FP8) {
            hv.ks = calloc(ROWS * NKV, 4); hv.vs = calloc(ROWS * NKV, 4);
            dv.ks = cu->ops->alloc(cu, ROWS * NKV * 4); dv.vs = cu->ops->alloc(cu, ROWS * NKV * 4);
        }
        float k[D], v[D], a[D], b[D];
        float *dk = cu->ops->alloc(cu, sizeof k), *dvv = cu->ops->alloc(cu, sizeof v), *dout = cu->ops->alloc(cu, sizeof a);
        int ok = 1;
        for (int row = 0; row < ROWS; row += 5) {
            for (int i = 0; i < D; i++) k[i] = rndf() * (float)(row + 1), v[i] = rndf() * 1e-3f;
            if (row == 10) for (int i = 0; i < HD; i++) k[i] = 0.0f; /* an all-zero head: scale 1 */
            td_bk_upload(cu, dk, k, sizeof k);
            td_bk_upload(cu, dvv, v, sizeof v);
            cpu->ops->kv_store(cpu, &hv, row, k, v);
            cu->ops->kv_store(cu, &dv, row, dk, dvv);
            for (int which = 0; which < 2; which++) {
                cpu->ops->kv_load(cpu, &hv, row, which, a);
                cu->ops->kv_load(cu, &dv, row, which, dout);
                td_bk_download(cu, b, dout, sizeof b);
                size_t at;
                ok &= same_bits(b, a, D, &at);
            }
        }
        CHECK(ok, "kv rows differ from the CPU's (store %d)", (int)st[s]);
        free(hv.k); free(hv.v); free(hv.ks); free(hv.vs);
        cu->ops->free(cu, dv.k); cu->ops->free(cu, dv.v); cu->ops->free(cu, dv.ks); cu->ops->free(cu, dv.vs);
        cu->ops->free(cu, dk); cu->ops->free(cu, dvv); cu->ops->free(cu, dout);
    }
}

/* ---- sample: the same sampler calls on both backends give the same ids ---- */

static void test_sample(const char *standin) {
    enum { V = 512 };
    td_sampling p;
    td_sampling_default(&p);
    p.temperature = 0.8f; p.top_k = 40; p.top_p = 0.9f; p.repetition_penalty = 1.2f; p.frequency_penalty = 0.1f; p.seed = 11;
    int32_t prompt[3] = {1, 2, 3};
    td_sampler sc, sg;
    td_err err;
    CHECK(td_sampler_init_backend(&sc, cpu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
    CHECK(td_sampler_init_backend(&sg, cu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
    float lg[V], pc[V], pg[V];
    float *dl = cu->ops->alloc(cu, sizeof lg), *dp = cu->ops->alloc(cu, sizeof lg), *dq = cu->ops->alloc(cu, sizeof lg);
    float *hl = cpu->ops->alloc(cpu, sizeof lg), *hp = cpu->ops->alloc(cpu, sizeof lg), *hq = cpu->ops->alloc(cpu, sizeof lg);
    int same = 1, probs_same = 1, small = 1;
    for (int step = 0; step < 20; step++) {
        for (int i = 0; i < V; i++) lg[i] = rndf() * 4.0f;
        td_bk_upload(cu, dl, lg, sizeof lg);
        td_bk_upload(cpu, hl, lg, sizeof lg);
        int32_t a = td_sampler_sample(&sc, hl), b = td_sampler_sample(&sg, dl);
        same &= a == b;
        td_sampler_accept(&sc, a);
        td_sampler_accept(&sg, a);
        /* the speculative calls: probabilities, the rejection test, the residual draw */
        td_sampler_probs(&sc, hl, hp);
        td_sampler_probs(&sg, dl, dp);
        td_bk_download(cu, pg, dp, sizeof pg);
        memcpy(pc, hp, sizeof pc);
        size_t at;
        probs_same &= same_bits(pg, pc, V, &at);
        for (int i = 0; i < V; i++) lg[i] = rndf() * 4.0f;
        td_bk_upload(cu, dq, lg, sizeof lg);
        td_bk_upload(cpu, hq, lg, sizeof lg);
        td_sampler_probs(&sc, hq, hq);
        td_sampler_probs(&sg, dq, dq);
        int d = (int)(rnd() % V);
        uint64_t b0 = td_backend_cuda_sample_bytes(cu);
        same &= td_sampler_accept_draft(&sc, hp, hq, d) == td_sampler_accept_draft(&sg, dp, dq, d);
        if (!standin) small &= td_backend_cuda_sample_bytes(cu) - b0 == 8; /* p[d] and q[d] */
        same &= td_sampler_residual(&sc, hp, hq, d) == td_sampler_residual(&sg, dp, dq, d);
    }
    CHECK(same, "sampled ids or rejection tests differ between cuda and cpu");
    CHECK(probs_same, "sampler probabilities differ between cuda and cpu");
    CHECK(small, "a rejection test moved more than p[d] and q[d]");
    td_sampler_free(&sc);
    td_sampler_free(&sg);
    cu->ops->free(cu, dl); cu->ops->free(cu, dp); cu->ops->free(cu, dq);
    cpu->ops->free(cpu, hl); cpu->ops->free(cpu, hp); cpu->ops->free(cpu, hq);
}


/* ---- T > 0 on the device: the same ids and distributions as the CPU, 8 bytes per call ----
 * Each config runs SAMPLE, PROBS (into another row and in place), FROM and
 * RESIDUAL (against a distribution and one-hot) on both backends: ids equal,
 * probabilities within 1e-5 relative (same operations; the device adds its
 * double sums in a tree), and what crossed: 8 bytes (+ a bias list) when the
 * device took the call. A flat distribution with top-p 0.99 and no top-k
 * needs more than 1024 tokens: that call goes to the host (and must still
 * agree), and the test checks it did. */
static void test_sample_dist(const char *standin) {
    typedef struct { float t; int k; float p, minp; int pen, bias, mask, flat; int host; } cfg_t;
    static const cfg_t cfgs[] = {
        {0.7f, 0, 1.0f, 0.0f, 0, 0, 0, 0, 0}, {1.0f, 5, 1.0f, 0.0f, 0, 0, 0, 0, 0},   {0.9f, 2000, 0.8f, 0.0f, 0, 0, 0, 0, 0},
        {0.8f, 0, 0.9f, 0.0f, 0, 0, 0, 0, 0}, {1.3f, 0, 1.0f, 0.1f, 0, 0, 0, 0, 0},   {0.8f, 40, 0.95f, 0.05f, 1, 1, 1, 0, 0},
        {1.0f, 0, 0.99f, 0.0f, 0, 0, 0, 1, 1}, {1.0f, 3000, 1.0f, 0.0f, 1, 0, 1, 1, 0},
    };
    static const int vocabs[] = {77, 3001};
    for (int vi = 0; vi < 2; vi++)
        for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
            const cfg_t *cf = &cfgs[ci];
            const int V = vocabs[vi];
            td_sampling p;
            td_sampling_default(&p);
            p.temperature = cf->t; p.top_k = cf->k; p.top_p = cf->p; p.min_p = cf->minp; p.seed = 7 + ci;
            td_logit_bias bias[3] = {{3, 4.0f}, {V - 1, 2.5f}, {3, -1.0f}};
            if (cf->pen) { p.repetition_penalty = 1.3f; p.frequency_penalty = 0.2f; p.presence_penalty = 0.4f; }
            if (cf->bias) { p.logit_bias = bias; p.n_logit_bias = 3; }
            int32_t prompt[3] = {0, 5, V - 3};
            td_sampler sc, sg;
            td_err err;
            CHECK(td_sampler_init_backend(&sc, cpu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
            CHECK(td_sampler_init_backend(&sg, cu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
            size_t fb = sizeof(float) * (size_t)V;
            float *lg = malloc(fb), *pc = malloc(fb), *pg = malloc(fb);
            uint32_t *mask = calloc((size_t)(V + 31) / 32, sizeof(uint32_t));
            for (int i = 0; i < V; i++) if (rnd() % 4) mask[i >> 5] |= 1u << (i & 31);
            float *dl = cu->ops->alloc(cu, fb), *dp = cu->ops->alloc(cu, fb), *dq = cu->ops->alloc(cu, fb);
            float *hl = cpu->ops->alloc(cpu, fb), *hp = cpu->ops->alloc(cpu, fb), *hq = cpu->ops->alloc(cpu, fb);
            int same = 1, device = 1, host = 1, first_bad = -1;
            double worst = 0;
            const uint64_t extra = cf->bias ? 3 * sizeof(td_logit_bias) : 0;
            for (int step = 0; step < 12; step++) {
                for (int i = 0; i < V; i++) lg[i] = cf->flat ? rndf() * 0.05f : rndf() * 6.0f;
                td_bk_upload(cu, dl, lg, fb);
                td_bk_upload(cpu, hl, lg, fb);
                td_sampler_set_mask(&sc, cf->mask ? mask : NULL);
                td_sampler_set_mask(&sg, cf->mask ? mask : NULL);
                uint64_t b0 = td_backend_cuda_sample_bytes(cu);
                int32_t a = td_sampler_sample(&sc, hl), b = td_sampler_sample(&sg, dl);
                uint64_t moved = td_backend_cuda_sample_bytes(cu) - b0;
                if (!standin) { if (moved == 8 + extra) host = 0; else device = 0; }
                int ok = a == b;
                td_sampler_accept(&sc, a);
                td_sampler_accept(&sg, a);
                td_sampler_probs(&sc, hl, hp);
                td_sampler_probs(&sg, dl, dp);
                td_bk_download(cu, pg, dp, fb);
                double r = max_rel(pg, hp, (size_t)V);
                if (!(r <= worst)) worst = r;
                /* in place, as the spec path does for the draft rows */
                td_bk_upload(cu, dq, lg, fb);
                td_bk_upload(cpu, hq, lg, fb);
                td_sampler_probs(&sc, hq, hq);
                td_sampler_probs(&sg, dq, dq);
                td_bk_download(cu, pc, dq, fb);
                r = max_rel(pc, hq, (size_t)V);
                if (!(r <= worst)) worst = r;
                td_sampler_set_mask(&sc, NULL);
                td_sampler_set_mask(&sg, NULL);
                ok &= td_sample_from(&sc, hp) == td_sample_from(&sg, dp);
                int d = (int)(rnd() % V);
                b0 = td_backend_cuda_sample_bytes(cu);
                ok &= td_sampler_residual(&sc, hp, step & 1 ? hq : NULL, d) == td_sampler_residual(&sg, dp, step & 1 ? dq : NULL, d);
                if (!standin && td_backend_cuda_sample_bytes(cu) - b0 != 8) device = 0; /* residual: always on the device */
                td_bk_download(cu, pg, dp, fb);
                r = max_rel(pg, hp, (size_t)V);
                if (!(r <= worst)) worst = r;
                if (!ok && first_bad < 0) first_bad = step;
                same &= ok;
            }
            CHECK(same, "V %d config %zu: T>0 ids differ between cuda and cpu (first at step %d)", V, ci, first_bad);
            CHECK(worst <= 1e-5, "V %d config %zu: probabilities differ by %.3g (relative)", V, ci, worst);
            CHECK(memcmp(&sc.rng, &sg.rng, sizeof sc.rng) == 0, "V %d config %zu: the RNGs drifted apart", V, ci);
            if (!standin) {
                /* the flat top-p config needs the host only where more than 1024 tokens exist */
                bool want_host = cf->host && V > 1024;
                CHECK(want_host ? host : device, "V %d config %zu: expected every SAMPLE on the %s", V, ci, want_host ? "host" : "device");
            }
            td_sampler_free(&sc);
            td_sampler_free(&sg);
            cu->ops->free(cu, dl); cu->ops->free(cu, dp); cu->ops->free(cu, dq);
            cpu->ops->free(cpu, hl); cpu->ops->free(cpu, hp); cpu->ops->free(cpu, hq);
            free(lg); free(pc); free(pg); free(mask);
        }
}

/* ---- greedy and draft argmax on the device: ids equal to the CPU's, 4 bytes per call ----
 * Logits on a coarse grid (ties are common, and penalties make more), a
 * NaN or -inf now and then, vocabularies below and above one block's
 * threads and not a multiple of 32; each sampler config runs the same calls
 * on both backends: GREEDY, SAMPLE (greedy sampler), DRAFT_ARGMAX, with and
 * without a mask (some allowing one token or none). */
static void test_sample_greedy(const char *standin) {
    static const int vocabs[] = {77, 3001};
    for (int vi = 0; vi < 2; vi++)
        for (int cfg = 0; cfg < 4; cfg++) {
            const int V = vocabs[vi];
            td_sampling p;
            td_sampling_default(&p);
            td_logit_bias bias[4] = {{5, 2.5f}, {V - 1, -1.0f}, {5, -0.75f}, {V / 2, 0.25f}}; /* token 5 twice: summed in order */
            if (cfg == 1 || cfg == 3) { p.repetition_penalty = 1.3f; p.frequency_penalty = 0.25f; p.presence_penalty = 0.5f; }
            if (cfg >= 2) { p.logit_bias = bias; p.n_logit_bias = 4; }
            int32_t prompt[4] = {0, 3, 7, V - 2};
            td_sampler sc, sg;
            td_err err;
            CHECK(td_sampler_init_backend(&sc, cpu, &p, V, prompt, 4, &err) == 0, "%s", err.msg);
            CHECK(td_sampler_init_backend(&sg, cu, &p, V, prompt, 4, &err) == 0, "%s", err.msg);
            float *lg = malloc(sizeof(float) * (size_t)V);
            uint32_t *mask = calloc((size_t)(V + 31) / 32, sizeof(uint32_t));
            float *dl = cu->ops->alloc(cu, sizeof(float) * (size_t)V), *hl = cpu->ops->alloc(cpu, sizeof(float) * (size_t)V);
            int same = 1, small = 1, first_bad = -1;
            for (int step = 0; step < 24; step++) {
                /* every (mask mode, logits case) pair once */
                const int mode = step % 4, lcase = step / 4; /* mode: 0 no mask, 1 random, 2 one token, 3 none */
                memset(mask, 0, sizeof(uint32_t) * (size_t)((V + 31) / 32));
                if (mode == 1) for (int i = 0; i < V; i++) { if (rnd() % 3) mask[i >> 5] |= 1u << (i & 31); }
                if (mode == 2) { int t = 1 + (int)(rnd() % (V - 1)); mask[t >> 5] |= 1u << (t & 31); }
                if (mode == 1 && lcase >= 2) mask[0] &= ~1u; /* the first allowed token is not token 0 */
                int first = 0; /* the first token the mask allows (0 without a mask) */
                while (mode && first < V && !td_mask_allows(mask, first)) first++;
                for (int i = 0; i < V; i++) lg[i] = (float)(int)(rndf() * 6.0f) * 0.5f; /* 25 values: many ties */
                if (lcase == 1) lg[rnd() % V] = NAN;
                if (lcase == 2 && first < V) lg[first] = NAN; /* a NaN where the scan starts keeps it */
                if (lcase == 3) for (int i = 0; i < V; i++) lg[i] = -INFINITY; /* penalize's -inf of a masked token ties */
                if (lcase == 4) for (int i = 0; i < V; i++) lg[i] = 1.0f; /* all tied */
                if (lcase == 5) lg[0] = NAN;
                td_bk_upload(cu, dl, lg, sizeof(float) * (size_t)V);
                td_bk_upload(cpu, hl, lg, sizeof(float) * (size_t)V);
                td_sampler_set_mask(&sc, mode ? mask : NULL);
                td_sampler_set_mask(&sg, mode ? mask : NULL);
                uint64_t b0 = td_backend_cuda_sample_bytes(cu);
                int32_t a = td_sampler_greedy(&sc, hl), b = td_sampler_greedy(&sg, dl);
                int32_t a2 = td_sampler_sample(&sc, hl), b2 = td_sampler_sample(&sg, dl);
                int32_t a3 = td_sampler_draft_argmax(&sc, hl, sc.mask), b3 = td_sampler_draft_argmax(&sg, dl, sg.mask);
                uint64_t moved = td_backend_cuda_sample_bytes(cu) - b0;
                /* 4 bytes of result per call, and the bias list when there is one */
                uint64_t want = 3 * (4 + (cfg >= 2 ? 4 * sizeof(td_logit_bias) : 0));
                if (!standin && moved != want) small = 0;
                if (!(a == b && a2 == b2 && a3 == b3) && first_bad < 0) first_bad = step;
                same &= a == b && a2 == b2 && a3 == b3;
                if (mode == 3) same &= a3 == -1 && b3 == -1;
                td_sampler_accept(&sc, a);
                td_sampler_accept(&sg, a);
            }
            CHECK(same, "V %d config %d: greedy / draft ids differ between cuda and cpu (first at step %d)", V, cfg, first_bad);
            CHECK(small, "V %d config %d: a device greedy call moved more than its result", V, cfg);
            td_sampler_set_mask(&sc, NULL);
            td_sampler_set_mask(&sg, NULL);
            td_sampler_free(&sc);
            td_sampler_free(&sg);
            cu->ops->free(cu, dl);
            cpu->ops->free(cpu, hl);
            free(lg);
            free(mask);
        }
}


/* ---- attention and DeltaNet on a two-segment batch ----
 * Segment 0: a 5-token prompt at positions 0..4 (DeltaNet slot 0 in place);
 * segment 1: a 2-token verify at positions 3, 4 of another sequence (slot 1,
 * checkpoints into slots 2 and 0), its positions 0..2 already in the KV. The
 * CUDA results are compared with the CPU's (expf, cosf and the sums of the
 * norms round differently: a norm-wise tolerance), and segment 1 alone must
 * give the bits it gives in the full batch (batch invariance). */

enum { NSEG = 2, MB = 7, NSLOT = 3 };
static double max_abs_norm(const float *a, const float *ref, size_t n) { /* max |a - ref| / max |ref| */
    double d = 0, r = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]);
        if (!(e <= d)) d = e;
        if (fabs(ref[i]) > r) r = fabs(ref[i]);
    }
    return d / r;
}
static float *rnd_vec(size_t n, float scale, float bias) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = bias + scale * rndf();
    return v;
}
static float *dvec(const float *h, size_t n) { return dev_copy(h, n * sizeof(float)); }
static void dget(float *h, const float *d, size_t n) { td_bk_download(cu, h, d, n * sizeof(float)); }

/* batch arrays in host memory (hb) and the same on the device (db); only_seg1: a batch of segment 1 alone */
typedef struct { td_batch hb, db; int32_t tokens[MB], row_seg[MB], seg[NSEG * TD_SEG_FIELDS], bts[4]; float *hstate[NSEG], *dstate[NSEG]; void *dmem; } batch;
static void make_batch(batch *b, int only_seg1, float *const *hpool, float *const *dpool) {
    memset(b, 0, sizeof *b);
    int32_t s0[TD_SEG_FIELDS] = {0, 5, 0, 0, 0, 0, NSLOT}, s1[TD_SEG_FIELDS] = {3, 2, 5, 2, 1, 1, NSLOT};
    int ns = 0;
    if (!only_seg1) { memcpy(b->seg, s0, sizeof s0); b->hstate[ns] = hpool[0]; b->dstate[ns] = dpool[0]; ns++; }
    memcpy(b->seg + ns * TD_SEG_FIELDS, s1, sizeof s1);
    if (only_seg1) b->seg[TD_SEG_ROW0] = 0;
    b->hstate[ns] = hpool[1]; b->dstate[ns] = dpool[1]; ns++;
    int M = 0;
    for (int i = 0; i < ns; i++)
        for (int t = 0; t < b->seg[i * TD_SEG_FIELDS + TD_SEG_N]; t++) b->row_seg[M] = i, b->tokens[M++] = t;
    int32_t bts[4] = {0, 1, 2, 3};
    memcpy(b->bts, bts, sizeof bts);
    b->hb = (td_batch){.M = M, .n_seg = ns, .tokens = b->tokens, .row_seg = b->row_seg, .seg = b->seg, .block_tables = b->bts,
                       .state = b->hstate};
    /* the device copy: one buffer [state pointers | tokens | row_seg | seg | block tables], as forward.c uploads it */
    size_t np = sizeof(float *) * NSEG, nt = sizeof(int32_t) * MB;
    unsigned char *d = cu->ops->alloc(cu, np + 2 * nt + sizeof b->seg + sizeof b->bts);
    td_bk_upload(cu, d, b->dstate, np);
    td_bk_upload(cu, d + np, b->tokens, nt);
    td_bk_upload(cu, d + np + nt, b->row_seg, nt);
    td_bk_upload(cu, d + np + 2 * nt, b->seg, sizeof b->seg);
    td_bk_upload(cu, d + np + 2 * nt + sizeof b->seg, b->bts, sizeof b->bts);
    b->dmem = d;
    b->db = (td_batch){.M = M, .n_seg = ns, .tokens = (const int32_t *)(d + np), .row_seg = (const int32_t *)(d + np + nt),
                       .seg = (const int32_t *)(d + np + 2 * nt), .block_tables = (const int32_t *)(d + np + 2 * nt + sizeof b->seg),
                       .state = (float *const *)d};
}

static void test_attention(const td_config *g) {
    int nh = g->n_heads, hd = g->head_dim, nkv = g->n_kv_heads, ad = nh * hd, kvd = nkv * hd;
    size_t nqg = (size_t)MB * ad * 2, nk = (size_t)MB * kvd, nq = (size_t)MB * ad;
    float *qg = rnd_vec(nqg, 2.0f, 0), *k = rnd_vec(nk, 2.0f, 0), *v = rnd_vec(nk, 1.0f, 0);
    float *qn = rnd_vec((size_t)hd, 0.2f, 1.0f), *kn = rnd_vec((size_t)hd, 0.2f, 1.0f), inv[64];
    for (int i = 0; i < g->rot_dim / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)g->rot_dim);
    const td_kv_dtype st[] = {TD_KV_F32, TD_KV_FP8};
    for (int si = 0; si < 2; si++) {
        size_t rows = 4 * TD_KV_BLOCK, es = st[si] == TD_KV_F32 ? 4 : 1;
        td_kv_view hv = {.store = st[si], .kv_dim = kvd, .head_dim = hd}, dv = hv;
        hv.k = calloc(rows * kvd, es); hv.v = calloc(rows * kvd, es);
        dv.k = cu->ops->alloc(cu, rows * kvd * es); dv.v = cu->ops->alloc(cu, rows * kvd * es);
        if (st[si] == TD_KV_FP8) {
            hv.ks = calloc(rows * nkv, 4); hv.vs = calloc(rows * nkv, 4);
            dv.ks = cu->ops->alloc(cu, rows * nkv * 4); dv.vs = cu->ops->alloc(cu, rows * nkv * 4);
        }
        /* segment 1's positions 0..2 (block 2, rows 32..34), the same on both backends */
        float *dtmp = cu->ops->alloc(cu, 2 * sizeof(float) * kvd);
        for (int p = 0; p < 3; p++) {
            float *kk = rnd_vec((size_t)kvd, 1.0f, 0), *vv = rnd_vec((size_t)kvd, 1.0f, 0);
            cpu->ops->kv_store(cpu, &hv, 2 * TD_KV_BLOCK + p, kk, vv);
            td_bk_upload(cu, dtmp, kk, sizeof(float) * kvd);
            td_bk_upload(cu, dtmp + kvd, vv, sizeof(float) * kvd);
            cu->ops->kv_store(cu, &dv, 2 * TD_KV_BLOCK + p, dtmp, dtmp + kvd);
            free(kk); free(vv);
        }
        float *none[NSEG] = {NULL, NULL};
        batch b;
        make_batch(&b, 0, none, none);
        float *hk = malloc(nk * 4), *hq = calloc(nq, 4), *hgate = calloc(nq, 4), *hout = calloc(nq, 4);
        memcpy(hk, k, nk * 4);
        cpu->ops->attn_prep(cpu, g, &b.hb, qg, hk, v, qn, kn, inv, hq, hgate, &hv, 0);
        cpu->ops->attention(cpu, g, &b.hb, hq, hgate, &hv, 0, hout);
        float *dqg = dvec(qg, nqg), *dk = dvec(k, nk), *dvv = dvec(v, nk), *dqn = dvec(qn, (size_t)hd), *dkn = dvec(kn, (size_t)hd);
        float *dinv = dvec(inv, (size_t)g->rot_dim / 2);
        float *dq = cu->ops->alloc(cu, nq * 4), *dgate = cu->ops->alloc(cu, nq * 4), *dout = cu->ops->alloc(cu, nq * 4);
        cu->ops->attn_prep(cu, g, &b.db, dqg, dk, dvv, dqn, dkn, dinv, dq, dgate, &dv, 0);
        cu->ops->attention(cu, g, &b.db, dq, dgate, &dv, 0, dout);
        float *got = malloc(nq * 4), *one = malloc(nq * 4);
        dget(got, dq, nq);
        CHECK(max_abs_norm(got, hq, nq) < 1e-5, "attn_prep q (kv %d): %g", (int)st[si], max_abs_norm(got, hq, nq));
        dget(got, dgate, nq);
        size_t at;
        CHECK(same_bits(got, hgate, nq, &at), "attn_prep gate split differs at %zu", at);
        dget(got, dk, nk);
        CHECK(max_abs_norm(got, hk, nk) < 1e-5, "attn_prep k (kv %d): %g", (int)st[si], max_abs_norm(got, hk, nk));
        dget(got, dout, nq);
        double tol = st[si] == TD_KV_F32 ? 1e-5 : 3e-2; /* fp8: a code can differ where k differs by an ulp */
        CHECK(max_abs_norm(got, hout, nq) < tol, "attention (kv %d): %g", (int)st[si], max_abs_norm(got, hout, nq));
        /* batch invariance: segment 1 alone gives its rows' bits */
        batch b1;
        make_batch(&b1, 1, none, none);
        float *dk1 = dvec(k + 5 * kvd, 2 * (size_t)kvd), *dout1 = cu->ops->alloc(cu, nq * 4), *dq1 = cu->ops->alloc(cu, nq * 4);
        cu->ops->attn_prep(cu, g, &b1.db, dqg + 5 * 2 * ad, dk1, dvv + 5 * kvd, dqn, dkn, dinv, dq1, dgate, &dv, 0);
        cu->ops->attention(cu, g, &b1.db, dq1, dgate, &dv, 0, dout1);
        dget(one, dout1, 2 * (size_t)ad);
        CHECK(same_bits(one, got + 5 * ad, 2 * (size_t)ad, &at), "attention (kv %d): segment 1 alone differs at %zu", (int)st[si], at);
        cu->ops->free(cu, b.dmem); cu->ops->free(cu, b1.dmem);
        cu->ops->free(cu, dk1); cu->ops->free(cu, dout1); cu->ops->free(cu, dq1); cu->ops->free(cu, dtmp);
        cu->ops->free(cu, dqg); cu->ops->free(cu, dk); cu->ops->free(cu, dvv); cu->ops->free(cu, dqn); cu->ops->free(cu, dkn);
        cu->ops->free(cu, dinv); cu->ops->free(cu, dq); cu->ops->free(cu, dgate); cu->ops->free(cu, dout);
        cu->ops->free(cu, dv.k); cu->ops->free(cu, dv.v); cu->ops->free(cu, dv.ks); cu->ops->free(cu, dv.vs);
        free(hv.k); free(hv.v); free(hv.ks); free(hv.vs);
        free(hk); free(hq); free(hgate); free(hout); free(got); free(one);
    }
    free(qg); free(k); free(v); free(qn); free(kn);
}

static void test_gdn(const td_config *g) {
    int C = td_cfg_lin_conv_dim(g), Kc = g->conv_kernel, nv = g->lin_nv, vd = nv * g->lin_dv;
    size_t pool = NSLOT * td_cfg_deltanet_state_floats(g);
    float *qkv = rnd_vec((size_t)MB * C, 1.0f, 0), *z = rnd_vec((size_t)MB * vd, 1.0f, 0);
    float *bin = rnd_vec((size_t)MB * nv, 2.0f, 0), *ain = rnd_vec((size_t)MB * nv, 2.0f, 0);
    float *conv = rnd_vec((size_t)C * Kc, 0.5f, 0), *dtb = rnd_vec((size_t)nv, 0.5f, 0), *negA = rnd_vec((size_t)nv, 0.3f, -0.5f);
    float *norm = rnd_vec((size_t)g->lin_dv, 0.1f, 1.0f);
    float *hpool[NSEG] = {rnd_vec(pool, 0.5f, 0), rnd_vec(pool, 0.5f, 0)}, *pool0[NSEG];
    float *dpool[NSEG];
    for (int i = 0; i < NSEG; i++) {
        pool0[i] = malloc(pool * 4);
        memcpy(pool0[i], hpool[i], pool * 4);
        dpool[i] = dvec(hpool[i], pool);
    }
    batch b;
    make_batch(&b, 0, hpool, dpool);
    td_gdn_params hp = {conv, dtb, negA, norm};
    td_gdn_params dp = {dvec(conv, (size_t)C * Kc), dvec(dtb, (size_t)nv), dvec(negA, (size_t)nv), dvec(norm, (size_t)g->lin_dv)};
    float *hco = calloc((size_t)MB * C, 4), *ho = calloc((size_t)MB * vd, 4);
    cpu->ops->gdn_conv(cpu, g, &b.hb, 0, &hp, qkv, hco);
    cpu->ops->gdn_recur(cpu, g, &b.hb, 0, &hp, hco, z, bin, ain, ho, 0);
    float *dqkv = dvec(qkv, (size_t)MB * C), *dz = dvec(z, (size_t)MB * vd), *db = dvec(bin, (size_t)MB * nv), *da = dvec(ain, (size_t)MB * nv);
    float *dco = cu->ops->alloc(cu, (size_t)MB * C * 4), *dout = cu->ops->alloc(cu, (size_t)MB * vd * 4);
    cu->ops->gdn_conv(cu, g, &b.db, 0, &dp, dqkv, dco);
    cu->ops->gdn_recur(cu, g, &b.db, 0, &dp, dco, dz, db, da, dout, 0);
    float *got = malloc((size_t)MB * C * 4), *gpool = malloc(pool * 4);
    dget(got, dco, (size_t)MB * C);
    CHECK(max_abs_norm(got, hco, (size_t)MB * C) < 1e-5, "gdn_conv: %g", max_abs_norm(got, hco, (size_t)MB * C));
    float *go = malloc((size_t)MB * vd * 4), *go1 = malloc((size_t)MB * vd * 4);
    dget(go, dout, (size_t)MB * vd);
    CHECK(max_abs_norm(go, ho, (size_t)MB * vd) < 1e-4, "gdn_recur: %g", max_abs_norm(go, ho, (size_t)MB * vd));
    for (int i = 0; i < NSEG; i++) {
        dget(gpool, dpool[i], pool);
        CHECK(max_abs_norm(gpool, hpool[i], pool) < 1e-5, "gdn state pool %d: %g", i, max_abs_norm(gpool, hpool[i], pool));
    }
    float *full1 = malloc(pool * 4);
    dget(full1, dpool[1], pool);
    /* batch invariance: segment 1 alone, from the same starting state */
    td_bk_upload(cu, dpool[1], pool0[1], pool * 4);
    batch b1;
    make_batch(&b1, 1, hpool, dpool);
    cu->ops->gdn_conv(cu, g, &b1.db, 0, &dp, dqkv + 5 * C, dco);
    cu->ops->gdn_recur(cu, g, &b1.db, 0, &dp, dco, dz + 5 * vd, db + 5 * nv, da + 5 * nv, dout, 0);
    dget(go1, dout, 2 * (size_t)vd);
    size_t at;
    CHECK(same_bits(go1, go + 5 * vd, 2 * (size_t)vd, &at), "gdn: segment 1 alone differs at %zu", at);
    dget(gpool, dpool[1], pool);
    CHECK(same_bits(gpool, full1, pool, &at), "gdn: segment 1's state alone differs at %zu", at);
    /* chunk > 1 leaves a verify segment (checkpoints) token by token: the same bits */
    td_bk_upload(cu, dpool[1], pool0[1], pool * 4);
    cu->ops->gdn_conv(cu, g, &b1.db, 0, &dp, dqkv + 5 * C, dco);
    cu->ops->gdn_recur(cu, g, &b1.db, 0, &dp, dco, dz + 5 * vd, db + 5 * nv, da + 5 * nv, dout, 64);
    dget(go1, dout, 2 * (size_t)vd);
    CHECK(same_bits(go1, go + 5 * vd, 2 * (size_t)vd, &at), "gdn chunk 64 differs at %zu", at);
    cu->ops->free(cu, b.dmem); cu->ops->free(cu, b1.dmem);
    cu->ops->free(cu, (void *)dp.conv); cu->ops->free(cu, (void *)dp.dt_bias); cu->ops->free(cu, (void *)dp.neg_A);
    cu->ops->free(cu, (void *)dp.norm);
    cu->ops->free(cu, dqkv); cu->ops->free(cu, dz); cu->ops->free(cu, db); cu->ops->free(cu, da);
    cu->ops->free(cu, dco); cu->ops->free(cu, dout);
    for (int i = 0; i < NSEG; i++) { cu->ops->free(cu, dpool[i]); free(hpool[i]); free(pool0[i]); }
    free(qkv); free(z); free(bin); free(ain); free(conv); free(dtb); free(negA); free(norm);
    free(hco); free(ho); free(got); free(gpool); free(go); free(go1); free(full1);
}

/* fill_random: the same bytes as the CPU op, every dtype and mode, odd sizes and a grid-stride-sized fill */
/* ---- DeltaNet prompt chunks on the device ----
 * One 45-token prompt segment: the device's chunked form (chunk 16: two
 * chunks and 13 tokens one by one; chunk 64: one device chunk of 32 and 13)
 * against the CPU op with the same chunk (at 64 the CPU leaves 45 tokens
 * token by token) and against the token-by-token form, outputs and final state; on the device it must not
 * be the token-by-token kernel's bits (so the chunk path ran). */
enum { CN = 45 };
static void test_gdn_chunk(const td_config *g, const char *standin) {
    int C = td_cfg_lin_conv_dim(g), Kc = g->conv_kernel, nv = g->lin_nv, vd = nv * g->lin_dv;
    size_t pool = td_cfg_deltanet_state_floats(g);
    float *qkv = rnd_vec((size_t)CN * C, 1.0f, 0), *z = rnd_vec((size_t)CN * vd, 1.0f, 0);
    float *bin = rnd_vec((size_t)CN * nv, 2.0f, 0), *ain = rnd_vec((size_t)CN * nv, 2.0f, 0);
    float *conv = rnd_vec((size_t)C * Kc, 0.5f, 0), *dtb = rnd_vec((size_t)nv, 0.5f, 0), *negA = rnd_vec((size_t)nv, 0.1f, -0.15f);
    float *norm = rnd_vec((size_t)g->lin_dv, 0.1f, 1.0f), *pool0 = rnd_vec(pool, 0.5f, 0);
    int32_t seg[TD_SEG_FIELDS] = {0, CN, 0, 0, 0, 0, 1}, rows[CN], toks[CN], bts[4] = {0, 1, 2, 3};
    for (int t = 0; t < CN; t++) rows[t] = 0, toks[t] = t;
    float *hstate[1] = {malloc(pool * 4)}, *dstate[1] = {dvec(pool0, pool)};
    td_batch hb = {.M = CN, .n_seg = 1, .tokens = toks, .row_seg = rows, .seg = seg, .block_tables = bts, .state = hstate};
    size_t np = sizeof(float *), nt = sizeof(int32_t) * CN;
    unsigned char *dm = cu->ops->alloc(cu, np + 2 * nt + sizeof seg + sizeof bts);
    td_bk_upload(cu, dm, dstate, np);
    td_bk_upload(cu, dm + np, toks, nt);
    td_bk_upload(cu, dm + np + nt, rows, nt);
    td_bk_upload(cu, dm + np + 2 * nt, seg, sizeof seg);
    td_bk_upload(cu, dm + np + 2 * nt + sizeof seg, bts, sizeof bts);
    td_batch db = {.M = CN, .n_seg = 1, .tokens = (const int32_t *)(dm + np), .row_seg = (const int32_t *)(dm + np + nt),
                   .seg = (const int32_t *)(dm + np + 2 * nt), .block_tables = (const int32_t *)(dm + np + 2 * nt + sizeof seg),
                   .state = (float *const *)dm};
    td_gdn_params hp = {conv, dtb, negA, norm};
    td_gdn_params dp = {dvec(conv, (size_t)C * Kc), dvec(dtb, (size_t)nv), dvec(negA, (size_t)nv), dvec(norm, (size_t)g->lin_dv)};
    float *dqkv = dvec(qkv, (size_t)CN * C), *dz = dvec(z, (size_t)CN * vd), *dbin = dvec(bin, (size_t)CN * nv);
    float *dain = dvec(ain, (size_t)CN * nv), *dco = cu->ops->alloc(cu, (size_t)CN * C * 4), *dout = cu->ops->alloc(cu, (size_t)CN * vd * 4);
    float *hco = malloc((size_t)CN * C * 4), *o_ref[3], *s_ref[3], *o_dev[3], *s_dev[3];
    const int chunks[3] = {0, 16, 64};
    for (int c = 0; c < 3; c++) {
        o_ref[c] = malloc((size_t)CN * vd * 4); s_ref[c] = malloc(pool * 4);
        o_dev[c] = malloc((size_t)CN * vd * 4); s_dev[c] = malloc(pool * 4);
        memcpy(hstate[0], pool0, pool * 4);
        cpu->ops->gdn_conv(cpu, g, &hb, 0, &hp, qkv, hco);
        cpu->ops->gdn_recur(cpu, g, &hb, 0, &hp, hco, z, bin, ain, o_ref[c], chunks[c]);
        memcpy(s_ref[c], hstate[0], pool * 4);
        td_bk_upload(cu, dstate[0], pool0, pool * 4);
        cu->ops->gdn_conv(cu, g, &db, 0, &dp, dqkv, dco);
        cu->ops->gdn_recur(cu, g, &db, 0, &dp, dco, dz, dbin, dain, dout, chunks[c]);
        dget(o_dev[c], dout, (size_t)CN * vd);
        dget(s_dev[c], dstate[0], pool);
    }
    size_t no = (size_t)CN * vd, at;
    for (int c = 1; c < 3; c++) {
        double e1 = max_abs_norm(o_dev[c], o_ref[c], no), e2 = max_abs_norm(o_dev[c], o_ref[0], no);
        double e3 = max_abs_norm(s_dev[c], s_ref[c], pool), e4 = max_abs_norm(s_dev[c], s_ref[0], pool);
        CHECK(e1 < 1e-4 && e3 < 1e-4, "gdn chunk %d: device vs cpu chunked: outputs %g, state %g", chunks[c], e1, e3);
        CHECK(e2 < 1e-4 && e4 < 1e-4, "gdn chunk %d: device vs token by token: outputs %g, state %g", chunks[c], e2, e4);
        /* (a stand-in runs the CPU op, whose chunk 64 leaves 45 tokens token by token) */
        CHECK(standin || !same_bits(o_dev[c], o_dev[0], no, &at), "gdn chunk %d: the device ran token by token (same bits)", chunks[c]);
    }
    for (int c = 0; c < 3; c++) { free(o_ref[c]); free(s_ref[c]); free(o_dev[c]); free(s_dev[c]); }
    cu->ops->free(cu, dm); cu->ops->free(cu, dstate[0]);
    cu->ops->free(cu, (void *)dp.conv); cu->ops->free(cu, (void *)dp.dt_bias); cu->ops->free(cu, (void *)dp.neg_A);
    cu->ops->free(cu, (void *)dp.norm);
    cu->ops->free(cu, dqkv); cu->ops->free(cu, dz); cu->ops->free(cu, dbin); cu->ops->free(cu, dain);
    cu->ops->free(cu, dco); cu->ops->free(cu, dout);
    free(hstate[0]); free(hco); free(pool0);
    free(qkv); free(z); free(bin); free(ain); free(conv); free(dtb); free(negA); free(norm);
}

static void test_fill_random(void) {
    static const td_dtype dts[] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F8_E4M3, TD_DTYPE_NVFP4, TD_DTYPE_Q8};
    static const size_t ns[] = {2, 1000, 65536 * 3 + 10, (size_t)256 * 65536 + 4096}; /* the last: more than one grid */
    for (int d = 0; d < 5; d++)
        for (int k = 0; k < 4; k++)
            for (int mode = 0; mode < 2; mode++) {
                size_t n = ns[k], bytes = dts[d] == TD_DTYPE_NVFP4 ? n / 2 : dts[d] == TD_DTYPE_Q8 ? n : n * td_dtype_size(dts[d]);
                float v = mode ? 0.75f : (dts[d] == TD_DTYPE_F8_E4M3 ? 448.0f : dts[d] == TD_DTYPE_NVFP4 ? 6.0f : dts[d] == TD_DTYPE_Q8 ? 127.0f : 0.03f);
                unsigned char *hc = cpu->ops->alloc(cpu, bytes), *hd = malloc(bytes);
                void *dd = cu->ops->alloc(cu, bytes);
                cpu->ops->fill_random(cpu, hc, dts[d], n, 99 + (uint64_t)k, (td_fill_mode)mode, v);
                cu->ops->fill_random(cu, dd, dts[d], n, 99 + (uint64_t)k, (td_fill_mode)mode, v);
                td_bk_download(cu, hd, dd, bytes);
                size_t at = 0;
                while (at < bytes && hc[at] == hd[at]) at++;
                CHECK(at == bytes, "fill_random %s n %zu mode %d: byte %zu differs", td_dtype_name(dts[d]), n, mode, at);
                cu->ops->free(cu, dd);
                cpu->ops->free(cpu, hc);
                free(hd);
            }
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

int main(void) {
    td_err err;
    /* TEST_BACKEND_CUDA_STANDIN=guard runs every check with the guard backend in
     * the CUDA backend's place: it checks the test itself on a machine without a
     * GPU (the guard faults on host access to its memory, as a device would). */
    const char *standin = getenv("TEST_BACKEND_CUDA_STANDIN");
    int rc = td_backend_create(standin ? standin : "cuda", 1, &cu, &err);
    if (rc) {
        const char *m = td_err_text(&err);
        int no_build = strstr(m, "this build has no CUDA backend: rebuild with make CUDA=1") != NULL;
        int no_dev = strncmp(m, "no CUDA device: ", 16) == 0;
        CHECK(no_build || no_dev, "unexpected error: %s", err.msg);
        CHECK(!strchr(err.msg, '\n'), "one line");
        CHECK(cu == NULL, "no backend on failure");
        printf("backend_cuda: device checks skipped (%s)\n", m);
        TEST_MAIN_END("backend_cuda");
    }
    size_t fr = 0, tot = 0;
    if (!standin) {
        CHECK(strcmp(cu->ops->name, "cuda") == 0, "name");
        CHECK(cu->ops->parallel_for == NULL, "no host pool on a device");
        CHECK(td_backend_cuda_mem_info(cu, &fr, &tot) == 0 && tot > 0 && fr <= tot, "mem_info %zu / %zu", fr, tot);
    }
    CHECK(td_backend_create("cpu", 2, &cpu, &err) == 0, "%s", err.msg);
    CHECK(td_backend_cuda_mem_info(cpu, &fr, &tot) != 0, "mem_info refuses a CPU backend");
    cu->batch_invariant = true; /* the exact kernels' bits first (no cuBLAS set-up at the first alloc) */
    test_matmul();
    if (!standin) test_matmul_fast(); /* cuBLAS: the CUDA backend's own (a stand-in has none) */
    else printf("backend_cuda: the fast GEMM is CUDA's: not checked on the stand-in\n");
    if (!standin) test_matmul_lt(); /* cuBLASLt, likewise */
    if (!standin) { /* the fast mode's split attention, likewise: 2 and 3 query heads per KV head, 1 and 2 dims per thread */
        test_attention_split(4, 2, 48);
        test_attention_split(6, 2, 160);
    }
    test_rows();
    test_kv();
    test_sample(standin);
    test_sample_greedy(standin);
    test_sample_dist(standin);
    test_fill_random();
    td_config g;
    memset(&g, 0, sizeof g);
    g.n_layers = 2; g.n_full_attn = 1; /* one DeltaNet layer */
    g.n_heads = 4; g.n_kv_heads = 2; g.head_dim = 48; g.attn_output_gate = true; g.rot_dim = 16; g.rms_norm_eps = 1e-6;
    g.lin_nk = 2; g.lin_nv = 4; g.lin_dk = 16; g.lin_dv = 40; g.conv_kernel = 4;
    test_attention(&g);
    test_gdn(&g);
    test_gdn_chunk(&g, standin);
    printf("backend_cuda: on %s (cpu kernels: %s)\n", standin ? standin : "the device", td_isa_name((td_isa)cpu->isa));
    td_backend_free(cu);
    td_backend_free(cpu);
    TEST_MAIN_END("backend_cuda");
}
