/* Matmul kernels (backend/cpu): every weight dtype against a plain
 * double-precision reference built here from the raw bytes, on every ISA this
 * CPU has (C, AVX2, AVX-512); then batch invariance (rows bit-identical for
 * M = 1..16 and for a prefill-sized M), thread-count invariance (1/2/3
 * threads), and AVX2 == AVX-512 bit for bit.
 *
 * Tolerance: |y - ref| <= 1e-5 * sum_k |x_k w_k| + 1e-30 (f32 accumulation
 * over 16 lanes of K/16 terms each gives about K/16 * 6e-8 relative to that
 * sum; the largest K here is 1000). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "backend/cpu/fp8_table.h"
#include "model/quant.h"
#include "tandem.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

/* Reference decoders, written independently of the kernels. */
static double ref_e4m3(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}
static double ref_e2m1(int nib) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (nib & 8 ? -1 : 1) * mag[nib & 7];
}
static uint8_t rand_fp8(void) { /* any finite e4m3 (not 0x7f / 0xff) */
    uint8_t b;
    do b = (uint8_t)rnd(); while ((b & 0x7f) == 0x7f);
    return b;
}
static uint8_t rand_fp8_scale(void) { /* positive, normal, moderate: 2^-4 .. 2^3 */
    return (uint8_t)(((3 + rnd() % 8) << 3) | (rnd() & 7));
}

typedef enum { C_F32, C_BF16, C_F16, C_F8T, C_F8B, C_F8CH, C_FP4MO, C_FP4CT, C_Q8, C_F8BX, C_COUNT } wcase;
static const char *case_names[C_COUNT] = {"f32", "bf16", "f16", "fp8-tensor", "fp8-block128", "fp8-channel", "nvfp4-modelopt", "nvfp4-ct", "q8",
                                          "fp8-block3x48" /* blocks that are not powers of two: the kernels divide */};

typedef struct {
    td_tensor t;
    void *data, *scales;
    double *deq; /* [N*K] reference dequantized weights */
} wmat;

static void make_w(wcase c, int64_t N, int64_t K, wmat *w) {
    memset(w, 0, sizeof *w);
    w->t.ndim = 2;
    w->t.shape[0] = N;
    w->t.shape[1] = K;
    w->t.name = case_names[c];
    w->deq = malloc(sizeof(double) * (size_t)(N * K));
    switch (c) {
    case C_F32: {
        float *d = malloc(sizeof(float) * (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) w->deq[i] = d[i] = frand();
        w->t.dtype = TD_DTYPE_F32; w->data = d; break;
    }
    case C_BF16: case C_F16: {
        uint16_t *d = malloc(2 * (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) {
            float f = frand();
            if (c == C_BF16) { d[i] = td_f32_to_bf16(f); uint32_t u = (uint32_t)d[i] << 16; float g; memcpy(&g, &u, 4); w->deq[i] = g; }
            else {
                /* f16 from a random sign/exponent/mantissa in a sane range */
                uint16_t h = (uint16_t)((rnd() & 0x8000) | ((10 + rnd() % 6) << 10) | (rnd() & 0x3ff));
                d[i] = h;
                int e = (h >> 10) & 31, m = h & 0x3ff;
                w->deq[i] = (h & 0x8000 ? -1 : 1) * ldexp(1.0 + m / 1024.0, e - 15);
            }
        }
        w->t.dtype = c == C_BF16 ? TD_DTYPE_BF16 : TD_DTYPE_F16; w->data = d; break;
    }
    case C_F8T: case C_F8B: case C_F8CH: case C_F8BX: {
        uint8_t *d = malloc((size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) d[i] = rand_fp8();
        w->t.dtype = TD_DTYPE_F8_E4M3; w->data = d;
        if (c == C_F8T) {
            w->t.scale_f = 0.0123f;
            for (int64_t i = 0; i < N * K; i++) w->deq[i] = ref_e4m3(d[i]) * (double)w->t.scale_f;
            break;
        }
        int64_t bn = c == C_F8B ? 128 : c == C_F8BX ? 3 : 1, bk = c == C_F8B ? 128 : c == C_F8BX ? 48 : K;
        int64_t sr = (N + bn - 1) / bn, sc = (K + bk - 1) / bk;
        float *s = malloc(sizeof(float) * (size_t)(sr * sc));
        for (int64_t i = 0; i < sr * sc; i++) s[i] = 0.001f + 0.01f * (float)(rnd() % 100);
        w->t.scales = w->scales = s; w->t.scales_dtype = TD_DTYPE_F32;
        w->t.scale_block[0] = bn; w->t.scale_block[1] = bk; w->t.scale_f = 1.0f;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) w->deq[n * K + k] = ref_e4m3(d[n * K + k]) * (double)s[(n / bn) * sc + k / bk];
        break;
    }
    case C_FP4MO: case C_FP4CT: {
        uint8_t *d = malloc((size_t)(N * K / 2)), *s = malloc((size_t)(N * K / 16));
        for (int64_t i = 0; i < N * K / 2; i++) d[i] = (uint8_t)rnd();
        for (int64_t i = 0; i < N * K / 16; i++) s[i] = rand_fp8_scale();
        double g = c == C_FP4MO ? 0.0371 : 1.0 / 448.0; /* ModelOpt weight_scale_2; 1/weight_global_scale */
        w->t.dtype = TD_DTYPE_NVFP4; w->data = d;
        w->t.scales = w->scales = s; w->t.scales_dtype = TD_DTYPE_F8_E4M3; w->t.scale_f = (float)g;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                int nib = (d[(n * K + k) / 2] >> ((k & 1) * 4)) & 15;
                w->deq[n * K + k] = ref_e2m1(nib) * ref_e4m3(s[n * (K / 16) + k / 16]) * (double)w->t.scale_f;
            }
        break;
    }
    case C_Q8: { /* made by the load-time quantizer from random f32 weights */
        float *f = malloc(sizeof(float) * (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) f[i] = frand() * (i % 97 == 0 ? 8.0f : 1.0f); /* some outliers */
        td_tensor src = {.dtype = TD_DTYPE_F32, .ndim = 2, .shape = {N, K}, .data = f};
        int8_t *q = malloc((size_t)(N * K));
        uint16_t *sc = malloc(sizeof(uint16_t) * (size_t)(N * K / 32));
        td_quantize_q8_rows(&src, 0, N, q, sc);
        int bad = 0, bad_scale = 0, full = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t b = 0; b < K / 32; b++) {
                /* the scale: a BF16 next to absmax / 127 (it and its BF16 neighbour on the other side
                   bracket it), and the one of the two whose grid (round, clamp to +-127) has the
                   smaller squared error; each weight within half a step, or clamped at +-127 */
                const uint16_t sb = sc[n * (K / 32) + b];
                const double s = td_bf16_to_f32(sb);
                const float *fb = f + n * K + b * 32;
                double amax = 0;
                for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(fb[j]));
                const double o = td_bf16_to_f32((uint16_t)(s * 127 >= amax ? sb - 1 : sb + 1));
                double e_s = 0, e_o = 0;
                for (int j = 0; j < 32; j++) {
                    const double rs = fmax(-127, fmin(127, nearbyint(fb[j] / s))), ro = fmax(-127, fmin(127, nearbyint(fb[j] / o)));
                    e_s += (rs * s - fb[j]) * (rs * s - fb[j]);
                    e_o += (ro * o - fb[j]) * (ro * o - fb[j]);
                }
                bad_scale += !(fmin(s, o) * 127 <= amax * (1 + 1e-6) && fmax(s, o) * 127 >= amax * (1 - 1e-6) && e_s <= e_o * (1 + 1e-9));
                int qmax = 0;
                for (int j = 0; j < 32; j++) {
                    const int64_t i = n * K + b * 32 + j;
                    qmax = abs(q[i]) > qmax ? abs(q[i]) : qmax;
                    const double v = (double)q[i] * s;
                    w->deq[i] = v;
                    const bool clamped = abs(q[i]) == 127 && fabs(f[i]) > 127 * s && (q[i] > 0) == (f[i] > 0);
                    bad += !clamped && fabs(v - f[i]) > 0.5 * s * (1 + 1e-6);
                }
                full += qmax >= 126;
            }
        CHECK(bad == 0, "q8 N=%lld K=%lld: %d weights off by more than half a step", (long long)N, (long long)K, bad);
        CHECK(bad_scale == 0 && full == N * (K / 32), "q8 N=%lld K=%lld: %d scales not the better BF16 neighbour of absmax / 127, %d of %lld blocks use the range",
              (long long)N, (long long)K, bad_scale, full, (long long)(N * (K / 32)));
        free(f);
        w->t.dtype = TD_DTYPE_Q8; w->data = q;
        w->t.scales = w->scales = sc; w->t.scales_dtype = TD_DTYPE_BF16;
        w->t.scale_block[0] = 1; w->t.scale_block[1] = 32; w->t.scale_f = 1.0f;
        break;
    }
    default: break;
    }
    w->t.data = w->data;
}
static void free_w(wmat *w) { free(w->data); free(w->scales); free(w->deq); }

static td_backend *bk[4]; /* by thread count 1..3 */

static void run_mm(int threads, const td_tensor *W, const float *x, int M, float *y) {
    bk[threads]->ops->matmul(bk[threads], W, x, M, y);
}

/* One test case's weights and buffers: x [CASE_MBIG, K] random, outputs y16
 * [16, N], y [CASE_MBIG, N], aux [16, N] (a second M = 16 result), row1 [N]. */
enum { CASE_MBIG = 70 };
typedef struct {
    wmat w;
    float *x, *y16, *y, *aux, *row1;
} case_bufs;

static void bufs_new(wcase c, int64_t N, int64_t K, case_bufs *b) {
    make_w(c, N, K, &b->w);
    b->x = malloc(sizeof(float) * (size_t)(CASE_MBIG * K));
    for (int64_t i = 0; i < CASE_MBIG * K; i++) b->x[i] = frand();
    b->y16 = malloc(sizeof(float) * (size_t)(16 * N));
    b->y = malloc(sizeof(float) * (size_t)(CASE_MBIG * N));
    b->aux = malloc(sizeof(float) * (size_t)(16 * N));
    b->row1 = malloc(sizeof(float) * (size_t)N);
}

static void bufs_free(case_bufs *b) {
    free(b->x); free(b->y); free(b->y16); free(b->aux); free(b->row1);
    free_w(&b->w);
}

/* Batch, prefill-row and thread invariance against y16 (the M = 16 result on 2
 * threads): M = 1..15 and a prefill-sized MBIG give the same rows bit for bit,
 * rows 16..MBIG-1 (the prefill panel path) equal M = 1 on that row, and 1..3
 * threads equal 2. Counts the differing cases into dm / dr / dt. */
static void invariance(const td_tensor *W, const float *x, int64_t N, int64_t K, int MBIG, const float *y16, float *y, float *row1,
                       int *dm, int *dr, int *dt) {
    *dm = *dr = *dt = 0;
    for (int M = 1; M <= 15; M++) {
        run_mm(2, W, x, M, y);
        if (memcmp(y, y16, sizeof(float) * (size_t)(M * N))) (*dm)++;
    }
    run_mm(2, W, x, MBIG, y);
    if (memcmp(y, y16, sizeof(float) * (size_t)(16 * N))) (*dm)++;
    for (int m = 16; m < MBIG; m++) {
        run_mm(1, W, x + (int64_t)m * K, 1, row1);
        if (memcmp(row1, y + (int64_t)m * N, sizeof(float) * (size_t)N)) (*dr)++;
    }
    for (int th = 1; th <= 3; th++) {
        run_mm(th, W, x, 16, y);
        if (memcmp(y, y16, sizeof(float) * (size_t)(16 * N))) (*dt)++;
    }
}

static void test_case(wcase c, int64_t N, int64_t K, const td_isa *isas, int n_isas) {
    case_bufs cb;
    bufs_new(c, N, K, &cb);
    const int MBIG = CASE_MBIG;
    wmat w = cb.w;
    float *x = cb.x, *y16 = cb.y16, *y = cb.y, *first = cb.aux, *row1 = cb.row1;
    bool have_first = false;
    /* every ISA with every kernel tuning (td_tune: other tiles for the same arithmetic; the C kernel has one) */
    for (int it = 0; it < n_isas * TD_TUNE_COUNT; it++) {
        const int ii = it / TD_TUNE_COUNT, tu = it % TD_TUNE_COUNT;
        if (isas[ii] == TD_ISA_C && tu != TD_TUNE_DEFAULT) continue;
        for (int t = 1; t <= 3; t++) bk[t]->isa = (int)isas[ii], bk[t]->tune = tu;
        char in[32];
        snprintf(in, sizeof in, "%s/%s", td_isa_name(isas[ii]), td_tune_name((td_tune)tu));
        /* accuracy vs double reference, M = 16 */
        run_mm(2, &w.t, x, 16, y16);
        double worst = 0;
        int bad = 0;
        for (int m = 0; m < 16; m++)
            for (int64_t n = 0; n < N; n++) {
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double p = (double)x[m * K + k] * w.deq[n * K + k];
                    ref += p;
                    mag += fabs(p);
                }
                double e = fabs((double)y16[m * N + n] - ref) / (mag + 1e-30);
                if (e > worst) worst = e;
                if (!(e <= 1e-5)) bad++;
            }
        CHECK(bad == 0, "%s %s N=%lld K=%lld: %d outputs off the double reference (worst rel %.3g)", case_names[c], in,
              (long long)N, (long long)K, bad, worst);
        int diff_m, diff_rows, diff_t;
        invariance(&w.t, x, N, K, MBIG, y16, y, row1, &diff_m, &diff_rows, &diff_t);
        CHECK(diff_rows == 0, "%s %s N=%lld K=%lld: %d of rows 16..%d differ from M=1", case_names[c], in, (long long)N,
              (long long)K, diff_rows, MBIG - 1);
        CHECK(diff_m == 0, "%s %s N=%lld K=%lld: %d batch sizes differ from M=16", case_names[c], in, (long long)N, (long long)K, diff_m);
        CHECK(diff_t == 0, "%s %s: %d thread counts differ", case_names[c], in, diff_t);
        /* AVX2 and AVX-512, whatever the tuning, round alike (with the invariance above: at every M) */
        if (isas[ii] != TD_ISA_C && !have_first) memcpy(first, y16, sizeof(float) * (size_t)(16 * N)), have_first = true;
        else if (isas[ii] != TD_ISA_C)
            CHECK(memcmp(first, y16, sizeof(float) * (size_t)(16 * N)) == 0, "%s N=%lld K=%lld: %s differs from %s/default", case_names[c],
                  (long long)N, (long long)K, in, td_isa_name(TD_ISA_AVX2));
    }
    for (int t = 1; t <= 3; t++) bk[t]->isa = (int)td_kernels_best_isa(), bk[t]->tune = (int)td_kernels_best_tune();
    bufs_free(&cb);
}

/* RNE to BF16 and back (finite inputs): what td_x_to_bf16 does to x. */
static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* --precision bf16 (kernels_bf16.c) on AVX-512 BF16 machines:
 * - against the double reference: |y - ref| <= 2^-7 * sum |x w| (x rounded to
 *   BF16, 2^-8 relative, and the weight too where it is not exact in BF16);
 * - weights exact in BF16 (bf16, fp8 per-tensor, nvfp4): against the double
 *   reference of the BF16-rounded x to the f32 path's 1e-5, so the rounding is
 *   exactly round-to-nearest-even of x and nothing else;
 * - the same batch / thread invariance as the f32 path (bit for bit), and the
 *   result differs from the f32 path (the BF16 path really ran). */
static void test_case_bf16(wcase c, int64_t N, int64_t K) {
    case_bufs cb;
    bufs_new(c, N, K, &cb);
    const int MBIG = CASE_MBIG;
    wmat w = cb.w;
    float *x = cb.x, *y16 = cb.y16, *y = cb.y, *yf = cb.aux, *row1 = cb.row1;
    for (int t = 1; t <= 3; t++) bk[t]->isa = TD_ISA_AVX512;
    run_mm(2, &w.t, x, 16, yf); /* f32 path */
    for (int t = 1; t <= 3; t++) bk[t]->precision = TD_PRECISION_BF16;
    run_mm(2, &w.t, x, 16, y16);
    bool exact_w = c == C_BF16 || c == C_F8T || c == C_FP4MO || c == C_FP4CT;
    double worst = 0, worst_x = 0;
    int bad = 0, bad_x = 0;
    for (int m = 0; m < 16; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = 0, mag = 0, refx = 0, magx = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[m * K + k] * w.deq[n * K + k], px = (double)bf16_round(x[m * K + k]) * w.deq[n * K + k];
                ref += p, mag += fabs(p), refx += px, magx += fabs(px);
            }
            double e = fabs((double)y16[m * N + n] - ref) / (mag + 1e-30), ex = fabs((double)y16[m * N + n] - refx) / (magx + 1e-30);
            if (e > worst) worst = e;
            if (ex > worst_x) worst_x = ex;
            bad += !(e <= 0x1p-7);
            bad_x += exact_w && !(ex <= 1e-5);
        }
    CHECK(bad == 0, "bf16 %s N=%lld K=%lld: %d outputs beyond 2^-7 of the double reference (worst rel %.3g)", case_names[c], (long long)N,
          (long long)K, bad, worst);
    CHECK(bad_x == 0, "bf16 %s N=%lld K=%lld: %d outputs off the reference of the rounded x (worst rel %.3g)", case_names[c], (long long)N,
          (long long)K, bad_x, worst_x);
    CHECK(memcmp(yf, y16, sizeof(float) * (size_t)(16 * N)) != 0, "bf16 %s: the result equals the f32 path's", case_names[c]);
    int diff_m, diff_rows, diff_t;
    invariance(&w.t, x, N, K, MBIG, y16, y, row1, &diff_m, &diff_rows, &diff_t);
    CHECK(diff_m == 0 && diff_rows == 0 && diff_t == 0, "bf16 %s N=%lld K=%lld: %d batch sizes, %d prefill rows, %d thread counts differ",
          case_names[c], (long long)N, (long long)K, diff_m, diff_rows, diff_t);
    for (int t = 1; t <= 3; t++) bk[t]->precision = TD_PRECISION_F32, bk[t]->isa = (int)td_kernels_best_isa();
    bufs_free(&cb);
}

/* --precision int8 (kernels_int8.c) for q8 weights, on every ISA this CPU has:
 * - the activation rounding, recomputed here from x: |y - ref_q| <= 1e-5 *
 *   sum |x w| with ref_q the double sum over the quantized x (q = nearest-even
 *   of x * (127 / amax), scale amax / 127 per 32-block), and against the
 *   double reference of x itself within half a step per element:
 *   |y - ref| <= sum |w| * s / 2 (+ 1e-5 relative);
 * - every ISA gives the same bits (C reference, AVX2, AVX-512 with VNNI where
 *   the CPU has it), and the same batch / prefill-row / thread invariance;
 * - the result differs from the f32 path (the int8 path really ran). */
static void test_case_int8(int64_t N, int64_t K, const td_isa *isas, int n_isas) {
    case_bufs cb;
    bufs_new(C_Q8, N, K, &cb);
    const int MBIG = CASE_MBIG, nb = (int)(K / 32);
    wmat w = cb.w;
    float *x = cb.x, *y16 = cb.y16, *y = cb.y, *yf = cb.aux, *row1 = cb.row1;
    for (int64_t i = 0; i < K && i < 64; i++) x[i] = 0.0f;       /* row 0: zero blocks (scale 0) */
    for (int64_t i = 0; i < K; i += 7) x[K + i] = 127.0f / 254.0f; /* row 1: ties x * 127 / amax = k + 0.5 */
    if (K >= 32) x[K + 31] = 1.0f;
    float *first = malloc(sizeof(float) * (size_t)(16 * N));
    /* the int8 kernels' copy of the weights: grouped as --precision int8 loads them (td_q8g_offset) */
    td_tensor wg = w.t;
    int8_t *gq = malloc((size_t)(N * K));
    memcpy(gq, w.data, (size_t)(N * K));
    td_q8_group_rows(gq, K, 0, N);
    wg.data = gq, wg.q8_grouped = true;
    {
        int perm_ok = 1; /* a permutation of each row's bytes: every element found where td_q8g_offset says */
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) perm_ok &= gq[n * K + td_q8g_offset(k, K)] == ((const int8_t *)w.data)[n * K + k];
        unsigned char *seen = calloc((size_t)K, 1);
        for (int64_t k = 0; k < K; k++) {
            const int64_t o = td_q8g_offset(k, K);
            perm_ok &= o >= 0 && o < K && !seen[o];
            if (o >= 0 && o < K) seen[o] = 1;
        }
        free(seen);
        CHECK(perm_ok, "q8 grouping N=%lld K=%lld: not the permutation td_q8g_offset states", (long long)N, (long long)K);
    }
    for (int ii = 0; ii < n_isas; ii++) {
        for (int t = 1; t <= 3; t++) bk[t]->isa = (int)isas[ii], bk[t]->precision = TD_PRECISION_F32;
        run_mm(2, &w.t, x, 16, yf);
        for (int t = 1; t <= 3; t++) bk[t]->precision = TD_PRECISION_INT8;
        run_mm(2, &wg, x, 16, y16);
        const char *in = td_isa_name(isas[ii]);
        double worst = 0, worst_q = 0;
        int bad = 0, bad_q = 0;
        for (int m = 0; m < 16; m++)
            for (int64_t n = 0; n < N; n++) {
                double ref = 0, refq = 0, mag = 0, half = 0;
                for (int b = 0; b < nb; b++) {
                    const float *xb = x + m * K + b * 32;
                    float amax = 0.0f;
                    for (int j = 0; j < 32; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
                    const float s = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
                    for (int j = 0; j < 32; j++) {
                        const double wv = w.deq[n * K + b * 32 + j];
                        const double q = amax > 0.0f ? nearbyint((double)(xb[j] * id)) : 0.0;
                        ref += (double)xb[j] * wv, refq += q * (double)s * wv, mag += fabs((double)xb[j] * wv);
                        half += fabs(wv) * 0.5 * s;
                    }
                }
                const double yv = y16[m * N + n], e = fabs(yv - ref), eq = fabs(yv - refq);
                if (e / (mag + 1e-30) > worst) worst = e / (mag + 1e-30);
                if (eq / (mag + 1e-30) > worst_q) worst_q = eq / (mag + 1e-30);
                bad += !(e <= half * (1 + 1e-5) + 1e-5 * mag);
                bad_q += !(eq <= 1e-5 * mag + 1e-30);
            }
        CHECK(bad == 0, "int8 %s N=%lld K=%lld: %d outputs beyond half a step of the double reference (worst rel %.3g)", in, (long long)N,
              (long long)K, bad, worst);
        CHECK(bad_q == 0, "int8 %s N=%lld K=%lld: %d outputs off the reference of the quantized x (worst rel %.3g)", in, (long long)N,
              (long long)K, bad_q, worst_q);
        CHECK(memcmp(yf, y16, sizeof(float) * (size_t)(16 * N)) != 0, "int8 %s: the result equals the f32 path's", in);
        int diff_m, diff_rows, diff_t;
        invariance(&wg, x, N, K, MBIG, y16, y, row1, &diff_m, &diff_rows, &diff_t);
        CHECK(diff_m == 0 && diff_rows == 0 && diff_t == 0, "int8 %s N=%lld K=%lld: %d batch sizes, %d prefill rows, %d thread counts differ",
              in, (long long)N, (long long)K, diff_m, diff_rows, diff_t);
        if (ii == 0) memcpy(first, y16, sizeof(float) * (size_t)(16 * N));
        else
            CHECK(memcmp(first, y16, sizeof(float) * (size_t)(16 * N)) == 0, "int8 N=%lld K=%lld: %s differs from %s", (long long)N,
                  (long long)K, in, td_isa_name(isas[0]));
    }
    /* one call over all N rows and 5 activation rows (the backend hands the kernels at most 64 rows per
       task; the 1 x 5 tiles go over K in segments per block of 64 rows): every ISA equals the C path */
    {
        int8_t *q5 = malloc((size_t)(10 * K)), *a5 = q5 + 5 * K;
        float *s5 = malloc(sizeof(float) * (size_t)(5 * nb)), *yc = malloc(sizeof(float) * (size_t)(10 * N)), *yi = yc + 5 * N;
        td_x_to_q8(TD_ISA_C, x, 5, K, q5, a5, s5);
        td_matmul_block_i8(TD_ISA_C, &wg, q5, a5, s5, 0, 5, 0, N, yc, N);
        for (int ii = 0; ii < n_isas; ii++) {
            memset(yi, 0, sizeof(float) * (size_t)(5 * N));
            td_matmul_block_i8(isas[ii], &wg, q5, a5, s5, 0, 5, 0, N, yi, N);
            CHECK(!memcmp(yc, yi, sizeof(float) * (size_t)(5 * N)), "int8 %s N=%lld K=%lld: one call over all rows differs from c",
                  td_isa_name(isas[ii]), (long long)N, (long long)K);
        }
        free(q5); free(s5); free(yc);
    }
    /* the activation quantizer alone: every ISA's bytes and scales equal the C reference's, on blocks
       with zeros, ties, an infinity and a NaN (what a broken upstream layer could hand it) */
    {
        const int QM = 3;
        float *qx = malloc(sizeof(float) * (size_t)(QM * K));
        memcpy(qx, x, sizeof(float) * (size_t)(QM * K));
        if (K >= 64) qx[2 * K + 3] = INFINITY, qx[2 * K + 40] = NAN;
        int8_t *q0 = malloc((size_t)(4 * QM * K)), *a0 = q0 + QM * K, *q1 = a0 + QM * K, *a1 = q1 + QM * K;
        float *s0 = malloc(sizeof(float) * (size_t)(2 * QM * nb)), *s1 = s0 + QM * nb;
        td_x_to_q8(TD_ISA_C, qx, QM, K, q0, a0, s0);
        for (int ii = 0; ii < n_isas; ii++) {
            td_x_to_q8(isas[ii], qx, QM, K, q1, a1, s1);
            CHECK(!memcmp(q0, q1, (size_t)(2 * QM * K)) && !memcmp(s0, s1, sizeof(float) * (size_t)(QM * nb)),
                  "x_to_q8 K=%lld: %s differs from c", (long long)K, td_isa_name(isas[ii]));
        }
        int abs_ok = 1;
        for (int64_t i = 0; i < QM * K; i++) abs_ok &= a0[i] == (q0[i] < 0 ? -q0[i] : q0[i]) && q0[i] >= -127;
        CHECK(abs_ok, "x_to_q8 K=%lld: |q| or the range is wrong", (long long)K);
        free(qx); free(q0); free(s0);
    }
    free(first);
    free(gq);
    for (int t = 1; t <= 3; t++) bk[t]->precision = TD_PRECISION_F32, bk[t]->isa = (int)td_kernels_best_isa();
    bufs_free(&cb);
}

int main(void) {
    td_err err = {0};
    int fp8_same = 0; /* the constant fp8 table the SIMD kernels read == the format's definition */
    for (int v = 0; v < 256; v++) {
        float a = td_fp8_e4m3_table[v], d = td_fp8_e4m3_to_f32((uint8_t)v);
        fp8_same += (a == d && signbit(a) == signbit(d)) || (isnan(a) && isnan(d));
    }
    CHECK(fp8_same == 256, "fp8 table: %d of 256 entries equal td_fp8_e4m3_to_f32", fp8_same);
    for (int t = 1; t <= 3; t++) CHECK(td_backend_cpu_create(t, &bk[t], &err) == 0, "backend %d threads", t);
    td_isa isas[3];
    int n_isas = 0;
    for (int i = TD_ISA_C; i <= TD_ISA_AVX512; i++)
        if (td_kernels_have_isa((td_isa)i)) isas[n_isas++] = (td_isa)i;
    printf("kernels: ISAs tested:");
    for (int i = 0; i < n_isas; i++) printf(" %s", td_isa_name(isas[i]));
    printf(" (best %s), each with the tunings default and amd (this CPU's: %s)\n", td_isa_name(td_kernels_best_isa()),
           td_tune_name(td_kernels_best_tune()));

    /* e4m3 decoding: every byte against the reference */
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) { bad += !isnan(td_fp8_e4m3_to_f32((uint8_t)b)); continue; }
        bad += td_fp8_e4m3_to_f32((uint8_t)b) != (float)ref_e4m3((uint8_t)b);
    }
    CHECK(bad == 0, "%d e4m3 bytes decode wrong", bad);

    /* shapes: odd N (row tiles 4/2/1), K with and without a 16-tail, K under 16 (only the tail) */
    static const int64_t float_shapes[][2] = {{13, 37}, {7, 256}, {33, 1000}, {5, 9}};
    static const int64_t quant_shapes[][2] = {{13, 256}, {33, 400}, {130, 272}};
    static const int64_t q8_shapes[][2] = {{13, 256}, {33, 416}, {130, 288}};
    for (int c = 0; c < C_COUNT; c++) {
        const int64_t (*sh)[2] = c <= C_F8T ? float_shapes : c == C_Q8 ? q8_shapes : quant_shapes;
        for (int s = 0; s < (sh == float_shapes ? 4 : 3); s++) {
            if (c >= C_FP4MO && sh[s][1] % 16) continue;
            if (c == C_F8B && sh[s][1] % 16) continue;
            test_case((wcase)c, sh[s][0], sh[s][1], isas, n_isas);
            if (td_kernels_have_bf16()) test_case_bf16((wcase)c, sh[s][0], sh[s][1]);
        }
    }
    printf("kernels: bf16 activations %s\n", td_kernels_have_bf16() ? "tested (AVX-512 BF16)" : "not tested: this CPU has no AVX-512 BF16");
    /* DeltaNet step and axpy (vector clones) equal the plain reference loops bit for bit */
    static const int gdn_shapes[][2] = {{128, 128}, {37, 19}, {32, 64}};
    for (int s = 0; s < 3; s++) {
        int dk = gdn_shapes[s][0], dv = gdn_shapes[s][1];
        float *S = malloc(sizeof(float) * (size_t)(dk * dv)), *R = malloc(sizeof(float) * (size_t)(dk * dv));
        float k[128], v[128], q[128], mem[128], o[128], rmem[128], ro[128];
        for (int i = 0; i < dk * dv; i++) S[i] = R[i] = frand();
        for (int i = 0; i < 128; i++) { k[i] = frand(); v[i] = frand(); q[i] = frand(); }
        int diff = 0;
        for (int step = 0; step < 3; step++) {
            float beta = 0.3f + 0.2f * (float)step, decay = 0.9f - 0.1f * (float)step;
            td_gdn_step(S, dk, dv, k, v, q, beta, decay, mem, o);
            for (int i = 0; i < dk * dv; i++) R[i] *= decay;
            for (int e = 0; e < dv; e++) rmem[e] = 0.0f;
            for (int i = 0; i < dk; i++)
                for (int e = 0; e < dv; e++) rmem[e] += R[i * dv + e] * k[i];
            for (int e = 0; e < dv; e++) rmem[e] = (v[e] - rmem[e]) * beta;
            for (int i = 0; i < dk; i++)
                for (int e = 0; e < dv; e++) R[i * dv + e] += k[i] * rmem[e];
            for (int e = 0; e < dv; e++) ro[e] = 0.0f;
            for (int i = 0; i < dk; i++)
                for (int e = 0; e < dv; e++) ro[e] += R[i * dv + e] * q[i];
            diff += memcmp(S, R, sizeof(float) * (size_t)(dk * dv)) != 0;
            diff += memcmp(o, ro, sizeof(float) * (size_t)dv) != 0;
        }
        CHECK(diff == 0, "td_gdn_step dk=%d dv=%d differs from the reference loops (%d)", dk, dv, diff);
        float y[128], ry[128];
        for (int i = 0; i < dv; i++) y[i] = ry[i] = frand();
        td_vec_axpy(y, 0.37f, v, dv);
        for (int i = 0; i < dv; i++) ry[i] += 0.37f * v[i];
        CHECK(memcmp(y, ry, sizeof(float) * (size_t)dv) == 0, "td_vec_axpy n=%d differs", dv);
        free(S); free(R);
    }
    /* chunked DeltaNet (prefill form) against the token-by-token step */
    static const int chunk_shapes[][3] = {{16, 32, 32}, {64, 128, 128}, {7, 37, 19}}; /* C, dk, dv */
    for (int s = 0; s < 3; s++) {
        int C = chunk_shapes[s][0], dk = chunk_shapes[s][1], dv = chunk_shapes[s][2];
        float *S = malloc(sizeof(float) * (size_t)(dk * dv)), *R = malloc(sizeof(float) * (size_t)(dk * dv));
        float *K = malloc(sizeof(float) * (size_t)(C * dk)), *Q = malloc(sizeof(float) * (size_t)(C * dk));
        float *V = malloc(sizeof(float) * (size_t)(C * dv)), *O = malloc(sizeof(float) * (size_t)(C * dv));
        float *RO = malloc(sizeof(float) * (size_t)(C * dv)), *scr = malloc(sizeof(float) * (size_t)(3 * C * dv + C));
        float beta[64], ld[64], mem[128];
        for (int i = 0; i < dk * dv; i++) S[i] = R[i] = 0.1f * frand();
        for (int t = 0; t < C; t++) {
            double nk = 0, nq = 0;
            for (int i = 0; i < dk; i++) { K[t * dk + i] = frand(); Q[t * dk + i] = frand(); }
            for (int i = 0; i < dk; i++) { nk += K[t * dk + i] * K[t * dk + i]; nq += Q[t * dk + i] * Q[t * dk + i]; }
            for (int i = 0; i < dk; i++) { K[t * dk + i] /= (float)sqrt(nk); Q[t * dk + i] /= (float)sqrt(nq * dk); } /* l2-normed, as in the model */
            for (int e = 0; e < dv; e++) V[t * dv + e] = frand();
            beta[t] = 0.2f + 0.7f * (float)(rnd() % 1000) / 1000.0f;
            ld[t] = -0.5f * (float)(rnd() % 1000) / 1000.0f;
        }
        td_gdn_chunk(S, dk, dv, C, K, V, Q, beta, ld, scr, O);
        for (int t = 0; t < C; t++) td_gdn_step(R, dk, dv, K + t * dk, V + t * dv, Q + t * dk, beta[t], expf(ld[t]), mem, RO + t * dv);
        double es = 0, ms = 0, eo = 0, mo = 0;
        for (int i = 0; i < dk * dv; i++) { es = fmax(es, fabs(S[i] - R[i])); ms = fmax(ms, fabs(R[i])); }
        for (int i = 0; i < C * dv; i++) { eo = fmax(eo, fabs(O[i] - RO[i])); mo = fmax(mo, fabs(RO[i])); }
        CHECK(es <= 1e-5 * ms && eo <= 1e-5 * mo, "td_gdn_chunk C=%d dk=%d dv=%d vs td_gdn_step: state %.3g, output %.3g (relative)", C, dk,
              dv, es / ms, eo / mo);
        free(S); free(R); free(K); free(Q); free(V); free(O); free(RO); free(scr);
    }
    /* int8 activations: block counts odd and even, weight-row tails of every tile; at M = 5, K = 4640
       and 8224 go over K in 2 and 3 segments (I8_SEG_BYTES), the last with a tail group */
    const int64_t i8_shapes[][2] = {{37, 32}, {9, 96}, {64, 256}, {13, 2080}, {130, 1024}, {70, 4640}, {67, 8224}};
    for (int i = 0; i < 7; i++) test_case_int8(i8_shapes[i][0], i8_shapes[i][1], isas, n_isas);
    printf("kernels: int8 activations on%s%s\n", n_isas > 2 && td_kernels_have_vnni() ? " (AVX-512 with VNNI)" : "",
           n_isas > 1 ? "" : " the C path only");
    /* unsupported layouts are refused, not miscomputed */
    td_tensor t = {.dtype = TD_DTYPE_NVFP4, .ndim = 2, .shape = {4, 24}};
    CHECK(!td_matmul_supported(&t, NULL), "nvfp4 with K %% 16 != 0 accepted");
    td_tensor t8 = {.dtype = TD_DTYPE_Q8, .ndim = 2, .shape = {4, 48}};
    CHECK(!td_matmul_supported(&t8, NULL), "q8 with K %% 32 != 0 accepted");
    for (int i = 1; i <= 3; i++) td_backend_free(bk[i]);
    TEST_MAIN_END("kernels");
}
