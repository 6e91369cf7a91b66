/* AVX2 and AVX-512 matmul kernels, compiled per function with target
 * attributes (the rest of the binary stays baseline x86-64) and chosen at run
 * time by kernels.c.
 *
 * Register tiles: up to 4 weight rows x 6 activation rows (AVX-512: over one
 * K slice at a time for decode and verify, sliced512; prefill panels); AVX2:
 * half-lane tiles for 1..31 rows (two passes over K, one ymm accumulator per
 * output: see htile256) that take every row of a verify of up to 5 tokens at
 * once (quantized weights: full-width 4x1 tiles for decode, 2x2 and 1x5 for
 * verify), and for prefill outer products over one residue mod 16
 * at a time (rpanel256); each weight chunk is loaded and dequantized once per
 * tile and used for every activation row in it. Every output element still has its
 * own 16-lane accumulator over the whole K, filled in increasing k with one
 * FMA per element, then reduced with the same fixed tree as kernels.c: the
 * tile shape changes only which elements are computed together, never how
 * any one is computed. 16 lanes in one zmm or two ymm round identically, so
 * the two ISAs agree bit for bit. */
#include "backend/cpu/kernels_x86.h"
#if defined(__x86_64__) && defined(__GNUC__)
/* Prefill (many activation rows): the same per-element arithmetic as sliced512,
 * reordered for the caches. A panel of PAN_N weight rows x PAN_K columns is
 * dequantized once into f32 (L1-resident) and reused by every activation row
 * of the block, and x is walked in PAN_K-wide slices so that it is read from
 * L1 rather than L2. Each output keeps its own 16-lane accumulator in `acc`
 * between K slices, filled in increasing k with one FMA per element, then the
 * same tail and reduction as sliced512: results are bit-identical to the
 * decode path (test_kernels compares every row of a prefill-sized batch with M = 1). */
enum { PAN_N = 32, PAN_K = 256, PAN_M = 64 };
/* Row stride of the weight panel, padded by one cache line so that its rows
 * do not fall on the same L1 sets. */
enum { WSTR = PAN_K + 16 };

/* Up to 4 weight rows x 6 activation rows: 10 loads per 24 FMAs (4 x 4: 8 per 16,
 * which the load ports bound; +3-6% on the 27B-shaped matrices, one thread).
 * first: the K slice at 0, whose accumulators start at zero (not read from acc). */
T512 INL void micro512(const int RN, const int RM, const float *wp, const float *xp, int64_t ldx, int kk, float *acc,
                       const bool first) {
    __m512 a[4][6];
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) a[r][q] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + ((int64_t)r * PAN_M + q) * 16);
    for (int i = 0; i < kk; i += 16) {
        __m512 w[4];
        for (int r = 0; r < RN; r++) w[r] = _mm512_loadu_ps(wp + r * WSTR + i);
        for (int q = 0; q < RM; q++) {
            __m512 xv = _mm512_loadu_ps(xp + q * ldx + i);
            for (int r = 0; r < RN; r++) a[r][q] = _mm512_fmadd_ps(xv, w[r], a[r][q]);
        }
    }
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) _mm512_storeu_ps(acc + ((int64_t)r * PAN_M + q) * 16, a[r][q]);
}

/* One panel block: weight rows [n, n+nn), activation rows [m, m+mm), nn <= PAN_N, mm <= PAN_M. */
T512 INL void panel_block512(const wd *d, const int kind, const float *x, int m, int mm, int64_t n, int nn, float *y,
                             int64_t ldy, float *wpan, float *acc) {
    const int64_t K = d->K, Kfull = K & ~(int64_t)15;
    if (Kfull == 0) memset(acc, 0, sizeof(float) * (size_t)PAN_N * PAN_M * 16); /* K < 16: only the tail below */
    for (int64_t k0 = 0; k0 < Kfull; k0 += PAN_K) {
        const bool first = k0 == 0;
        int kk = (int)(Kfull - k0 < PAN_K ? Kfull - k0 : PAN_K);
        for (int r = 0; r < nn; r++) {
            const uint8_t *row = d->data + (n + r) * d->row_bytes;
            for (int i = 0; i < kk; i += 16) _mm512_storeu_ps(wpan + r * WSTR + i, w16_512(d, kind, row, n + r, k0 + i));
        }
        for (int q = 0; q < mm;) {
            int rm = mm - q >= 6 ? 6 : mm - q >= 4 ? 4 : mm - q >= 2 ? 2 : 1;
            const float *xp = x + (int64_t)(m + q) * K + k0;
            for (int r = 0; r < nn;) {
                int rn = nn - r >= 4 ? 4 : nn - r >= 2 ? 2 : 1;
                float *ap = acc + ((int64_t)r * PAN_M + q) * 16;
                const float *wp = wpan + r * WSTR;
                if (rn == 4) {
                    if (rm == 6) micro512(4, 6, wp, xp, K, kk, ap, first);
                    else if (rm == 4) micro512(4, 4, wp, xp, K, kk, ap, first);
                    else if (rm == 2) micro512(4, 2, wp, xp, K, kk, ap, first);
                    else micro512(4, 1, wp, xp, K, kk, ap, first);
                } else if (rn == 2) {
                    if (rm == 6) micro512(2, 6, wp, xp, K, kk, ap, first);
                    else if (rm == 4) micro512(2, 4, wp, xp, K, kk, ap, first);
                    else if (rm == 2) micro512(2, 2, wp, xp, K, kk, ap, first);
                    else micro512(2, 1, wp, xp, K, kk, ap, first);
                } else {
                    if (rm == 6) micro512(1, 6, wp, xp, K, kk, ap, first);
                    else if (rm == 4) micro512(1, 4, wp, xp, K, kk, ap, first);
                    else if (rm == 2) micro512(1, 2, wp, xp, K, kk, ap, first);
                    else micro512(1, 1, wp, xp, K, kk, ap, first);
                }
                r += rn;
            }
            q += rm;
        }
    }
    if (Kfull < K) {
        int rem = (int)(K - Kfull);
        float wb[16], xb[16] = {0};
        for (int r = 0; r < nn; r++) {
            w_tail(d, kind, d->data + (n + r) * d->row_bytes, n + r, Kfull, rem, wb);
            __m512 wv = _mm512_loadu_ps(wb);
            for (int q = 0; q < mm; q++) {
                memcpy(xb, x + (int64_t)(m + q) * K + Kfull, (size_t)rem * sizeof(float));
                float *ap = acc + ((int64_t)r * PAN_M + q) * 16;
                _mm512_storeu_ps(ap, _mm512_fmadd_ps(_mm512_loadu_ps(xb), wv, _mm512_loadu_ps(ap)));
            }
        }
    }
    finish_panel512(d, kind, acc, PAN_M, m, mm, n, nn, y, ldy);
}

/* Scratch on the stack: 32 KiB weight panel + 128 KiB accumulators (pool
 * threads run on default 8 MiB stacks). */
#define PANEL512(NAME, KIND)                                                                                     \
    T512 __attribute__((noinline)) static void NAME(const wd *d, const float *x, int m0, int m1, int64_t n0,      \
                                                    int64_t n1, float *y, int64_t ldy) {                         \
        _Alignas(64) float wpan[PAN_N * WSTR];                                                                   \
        _Alignas(64) float acc[PAN_N * PAN_M * 16];                                                              \
        for (int64_t n = n0; n < n1; n += PAN_N)                                                                 \
            for (int m = m0; m < m1; m += PAN_M)                                                                 \
                panel_block512(d, KIND, x, m, m1 - m < PAN_M ? m1 - m : PAN_M, n, n1 - n < PAN_N ? (int)(n1 - n) : PAN_N, \
                               y, ldy, wpan, acc);                                                               \
    }
PANEL512(pan512_f32, KF32)
PANEL512(pan512_bf16, KBF16)
PANEL512(pan512_f16, KF16)
PANEL512(pan512_f8, KF8)
PANEL512(pan512_f8b, KF8B)
PANEL512(pan512_fp4, KFP4)
PANEL512(pan512_q8, KQ8)


/* RN weight rows x RM activation rows over k in [k0, k1) (multiples of 16);
 * output (r, q)'s running 16-lane sum at acc + r * ar + q * 16. Each weight
 * chunk is dequantized once and used by all RM rows (up to 4 x 6 = 24
 * accumulators + 4 weight chunks + 1 activation of the 32 zmm). */
T512 INL void stile512(const wd *d, const int kind, const int RN, const int RM, const uint8_t *const *row, int64_t n,
                       const float *const *xr, int64_t k0, int64_t k1, float *acc, int64_t ar, const uint8_t *const *pf,
                       int64_t step) {
    __m512 a[4][6];
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) a[r][q] = _mm512_loadu_ps(acc + r * ar + q * 16);
    float sv[4] = {0}; /* KF8B: each row's block scale x 256, fetched where a block starts (the same value w16_512 uses) */
    int64_t off = 0, snext = k0;
    for (int64_t i = k0; i < k1; i += 16, off += step) {
        if ((off & 63) == 0)
            for (int r = 0; r < RN; r++) _mm_prefetch((const char *)pf[r] + off, _MM_HINT_T0);
        if (kind == KF8B) block_scales_at(d, n, RN, i, sv, &snext);
        __m512 w[4];
        for (int r = 0; r < RN; r++)
            w[r] = kind == KF8B ? _mm512_mul_ps(f8x16_512(_mm_loadu_si128((const __m128i *)(row[r] + i))), _mm512_set1_ps(sv[r]))
                                : w16_512(d, kind, row[r], n + r, i);
        for (int q = 0; q < RM; q++) {
            const __m512 xv = _mm512_loadu_ps(xr[q] + i);
            for (int r = 0; r < RN; r++) a[r][q] = _mm512_fmadd_ps(xv, w[r], a[r][q]);
        }
    }
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) _mm512_storeu_ps(acc + r * ar + q * 16, a[r][q]);
}

#define ST512_RN(RM_)                                                                         \
    switch (t) {                                                                              \
    case 4: stile512(d, kind, 4, RM_, row, g + r, xr, k0, k1, ap, ar, pf, step); break;       \
    case 3: stile512(d, kind, 3, RM_, row, g + r, xr, k0, k1, ap, ar, pf, step); break;       \
    case 2: stile512(d, kind, 2, RM_, row, g + r, xr, k0, k1, ap, ar, pf, step); break;       \
    default: stile512(d, kind, 1, RM_, row, g + r, xr, k0, k1, ap, ar, pf, step); break;      \
    }

/* Decode and verify (M < PANEL_MIN_M) with K sliced, the traversal the AVX2
 * kernels take (verify256): the weight rows in groups of DG5, the activation
 * rows in chunks of up to DM5 (evenly split), and for each chunk K in
 * DK5-element slices, every tile of up to 4 rows of the group running over
 * the slice (its activation rows stay in L1), each prefetching the row slices
 * DPF5 ahead of its own (slice_rows); the running 16-lane sums stay in acc
 * between slices. A verify of up to 6 tokens streams each weight once and
 * dequantizes each chunk once. Per output: one FMA per element in increasing
 * k, the zero-padded K % 16 step, reduce16's tree, as every other kernel here
 * (test_kernels: every M against M = 1, AVX-512 against AVX2, bit for bit).
 * It replaced full-K tiles of 4 weight rows x up to 6 activation rows
 * (tile512), which prefetched the next tile's rows at the same offset.
 * Measured side by side on the Intel Xeon VM (2 threads, 2026-12-05,
 * bench/results/verify-sliced-2026-12-05.md): the 27B-proportioned model's
 * 94 BF16 matmuls M = 1 59.0-59.6 -> 51.4-51.6 ms, M = 5 66.3-68.4 ->
 * 56.7-57.7, M = 16 154 -> 139. */
enum { DM5 = 6 };

T512 INL void sliced512(const wd *d, const int kind, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y,
                        int64_t ldy) {
    const int64_t K = d->K, Kfull = K & ~(int64_t)15, rb = d->row_bytes, step = 16 * rb / K, ar = DM5 * 16;
    _Alignas(64) float acc[DG5 * DM5 * 16];
    const int M = m1 - m0, nch = (M + DM5 - 1) / DM5;
    for (int64_t g = n0; g < n1; g += DG5) {
        const int gn = n1 - g < DG5 ? (int)(n1 - g) : DG5;
        for (int c = 0; c < nch; c++) {
            const int cm0 = m0 + M * c / nch, rm = m0 + M * (c + 1) / nch - cm0;
            const float *xr[DM5];
            for (int q = 0; q < rm; q++) xr[q] = x + (int64_t)(cm0 + q) * K;
            memset(acc, 0, sizeof(float) * (size_t)gn * ar);
            for (int64_t k0 = 0; k0 < Kfull; k0 += DK5) {
                const int64_t k1 = Kfull - k0 < DK5 ? Kfull : k0 + DK5;
                for (int r = 0; r < gn;) {
                    const int t = gn - r < 4 ? gn - r : 4;
                    const uint8_t *row[4], *pf[4];
                    float *ap = acc + (int64_t)r * ar;
                    slice_rows(d, g, gn, r, t, k0, Kfull, n1, DK5, DPF5, step, row, pf);
                    switch (rm) {
                    case 1: ST512_RN(1) break;
                    case 2: ST512_RN(2) break;
                    case 3: ST512_RN(3) break;
                    case 4: ST512_RN(4) break;
                    case 5: ST512_RN(5) break;
                    default: ST512_RN(6) break;
                    }
                    r += t;
                }
            }
            if (Kfull < K) { /* the K % 16 tail: one more step, zero padded */
                const int rem = (int)(K - Kfull);
                float wb[16], xb[16] = {0};
                for (int r = 0; r < gn; r++) {
                    w_tail(d, kind, d->data + (g + r) * rb, g + r, Kfull, rem, wb);
                    const __m512 wv = _mm512_loadu_ps(wb);
                    for (int q = 0; q < rm; q++) {
                        memcpy(xb, xr[q] + Kfull, (size_t)rem * sizeof(float));
                        float *ap = acc + r * ar + q * 16;
                        _mm512_storeu_ps(ap, _mm512_fmadd_ps(_mm512_loadu_ps(xb), wv, _mm512_loadu_ps(ap)));
                    }
                }
            }
            for (int q = 0; q < rm; q++) {
                float *yq = y + (int64_t)(cm0 + q) * ldy + g;
                if (gn == DG5) finish16(d, kind, acc + q * 16, ar, yq);
                else
                    for (int r = 0; r < gn; r++) {
                        const float v = reduce16(acc + r * ar + q * 16);
                        yq[r] = kind == KF8 || kind == KFP4 ? v * d->post : v;
                    }
            }
        }
    }
}
#undef ST512_RN

#define SLICED512(NAME, KIND)                                                                                   \
    T512 __attribute__((noinline)) static void NAME(const wd *d, const float *x, int m0, int m1, int64_t n0,     \
                                                    int64_t n1, float *y, int64_t ldy) {                        \
        sliced512(d, KIND, x, m0, m1, n0, n1, y, ldy);                                                          \
    }
SLICED512(sl512_f32, KF32)
SLICED512(sl512_bf16, KBF16)
SLICED512(sl512_f16, KF16)
SLICED512(sl512_f8, KF8)
SLICED512(sl512_f8b, KF8B)
SLICED512(sl512_fp4, KFP4)
SLICED512(sl512_q8, KQ8)

/* Activation blocks of at least this many rows (prefill) take the panel path;
 * below that (decode, verify) the weights stream once through the register tiles. */
#define PANEL_MIN_M 32

typedef void (*mm_fn)(const wd *d, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy);
/* by kind: KF32, KBF16, KF16, KF8, KF8B, KFP4, KQ8 */
static const mm_fn panels512[] = {pan512_f32, pan512_bf16, pan512_f16, pan512_f8, pan512_f8b, pan512_fp4, pan512_q8};

static const mm_fn sliced512s[] = {sl512_f32, sl512_bf16, sl512_f16, sl512_f8, sl512_f8b, sl512_fp4, sl512_q8};

/* AVX2's full-K 4 x 1 q8 tiles (below), which TD_TUNE_AMD decodes with. */
T256 __attribute__((noinline)) static void mm256_q8(const wd *d, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y,
                                                    int64_t ldy);

void td_mm_avx512(td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    wd d;
    int kind = setup(W, &d);
    /* q8 decode on AMD: the sliced zmm tiles dequantized slower than the stream there (EPYC Zen 5 guest,
       the 27B-proportioned model: 27-28 against 32-34 tokens/s through mm256_q8; bench/results/zen5-2026-12-07.md),
       while on the Intel Xeon they decode faster than mm256_q8 (19.6 against 17.4, weights-hugepages-2026-12-06.md) */
    if (tune == TD_TUNE_AMD && kind == KQ8 && m1 - m0 == 1) { mm256_q8(&d, x, m0, m1, n0, n1, y, ldy); return; }
    (m1 - m0 >= PANEL_MIN_M ? panels512 : sliced512s)[kind](&d, x, m0, m1, n0, n1, y, ldy);
}

/* ======================= AVX2 ======================= */

typedef struct { __m256 lo, hi; } v16;

T256 INL v16 f8x16_256(__m128i b) { /* see f8x16_512 */
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xbfff));
    return (v16){_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}

T256 INL __m256 fp4x8_256(__m128i nib8 /* 8 nibble bytes in the low half */) {
    __m256i idx = _mm256_cvtepu8_epi32(nib8);
    __m256 mag = _mm256_permutevar8x32_ps(_mm256_loadu_ps(e2m1_lut), _mm256_and_si256(idx, _mm256_set1_epi32(7)));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
}

T256 INL v16 w16_256(const wd *d, const int kind, const uint8_t *row, int64_t n, int64_t i) {
    switch (kind) {
    case KF32: return (v16){_mm256_loadu_ps((const float *)row + i), _mm256_loadu_ps((const float *)row + i + 8)};
    case KBF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
        return (v16){_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16)),
                     _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16))};
    }
    case KF16: {
        const uint16_t *p = (const uint16_t *)row + i;
        return (v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
    }
    case KF8: return f8x16_256(_mm_loadu_si128((const __m128i *)(row + i)));
    case KQ8: { /* two 8-byte loads widened straight from memory (one shuffle uop each; a 16-byte load
                   needed a third to bring its high half down) */
        __m256 sc = _mm256_set1_ps(td_bf16_to_f32(d->sq[n * (d->K / 32) + i / 32]));
        return (v16){_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i)))), sc),
                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i + 8)))), sc)};
    }
    case KF8B: {
        v16 v = f8x16_256(_mm_loadu_si128((const __m128i *)(row + i)));
        __m256 s = _mm256_set1_ps(block_scale_val(d, n, i) * 256.0f);
        return (v16){_mm256_mul_ps(v.lo, s), _mm256_mul_ps(v.hi, s)};
    }
    default: {
        __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + i / 2)));
        __m128i nib = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0f)), _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
        __m256 s = _mm256_set1_ps(fp8_lut[d->s4[n * (d->K / 16) + i / 16]]);
        return (v16){_mm256_mul_ps(fp4x8_256(nib), s), _mm256_mul_ps(fp4x8_256(_mm_unpackhi_epi64(nib, nib)), s)};
    }
    }
}

/* 16 FP8 weights at p times s (the block scale x 256): w16_256's KF8B with the scale given. */
T256 INL v16 f8b16_256(const uint8_t *p, float s) {
    v16 v = f8x16_256(_mm_loadu_si128((const __m128i *)p));
    const __m256 sc = _mm256_set1_ps(s);
    return (v16){_mm256_mul_ps(v.lo, sc), _mm256_mul_ps(v.hi, sc)};
}

T256 INL void tile256(const wd *d, const int kind, const int RN, const int RM, const float *x, int m, int64_t n, float *y, int64_t ldy) {
    const int64_t K = d->K;
    __m256 lo[4][5], hi[4][5]; /* RN x RM <= 4 x 2, or 1 x 5 (qverify256) */
    const uint8_t *row[4];
    const float *xr[5];
    for (int r = 0; r < RN; r++) row[r] = d->data + (n + r) * d->row_bytes;
    for (int q = 0; q < RM; q++) xr[q] = x + (int64_t)(m + q) * K;
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) lo[r][q] = hi[r][q] = _mm256_setzero_ps();
    int64_t i = 0;
    /* Prefetch the next tile's rows at the same offset: decode streams each weight once, and the
     * hardware prefetchers alone leave too few lines in flight for 4 short interleaved rows (the
     * AVX-512 tiles with the same scheme, decode on the 27B-shaped test model: FP8 +30-38%, BF16 +5-12%). */
    const int64_t step = 16 * d->row_bytes / K, pf = RN * d->row_bytes;
    int64_t off = 0, snext = 0;
    float sv[4] = {0}; /* KF8B: each row's block scale x 256, fetched where a block starts (as stile512) */
#define W16(r_) (kind == KF8B ? f8b16_256(row[r_] + i, sv[r_]) : w16_256(d, kind, row[r_], n + (r_), i))
    for (; i + 16 <= K; i += 16, off += step) {
        v16 w[4];
        if ((off & 63) == 0)
            for (int r = 0; r < RN; r++) _mm_prefetch((const char *)row[r] + off + pf, _MM_HINT_T0);
        if (kind == KF8B) block_scales_at(d, n, RN, i, sv, &snext);
        if (RM == 1) { /* decode: each row's weights used as soon as they are converted, so at most
                          one row's are live (all four at once spilled q8's to the stack) */
            const __m256 xl = _mm256_loadu_ps(xr[0] + i), xh = _mm256_loadu_ps(xr[0] + i + 8);
            for (int r = 0; r < RN; r++) {
                const v16 wr = W16(r);
                lo[r][0] = _mm256_fmadd_ps(xl, wr.lo, lo[r][0]);
                hi[r][0] = _mm256_fmadd_ps(xh, wr.hi, hi[r][0]);
            }
            continue;
        }
        for (int r = 0; r < RN; r++) w[r] = W16(r);
        for (int q = 0; q < RM; q++) {
            __m256 xl = _mm256_loadu_ps(xr[q] + i), xh = _mm256_loadu_ps(xr[q] + i + 8);
            for (int r = 0; r < RN; r++) {
                lo[r][q] = _mm256_fmadd_ps(xl, w[r].lo, lo[r][q]);
                hi[r][q] = _mm256_fmadd_ps(xh, w[r].hi, hi[r][q]);
            }
        }
    }
#undef W16
    if (i < K) {
        int rem = (int)(K - i);
        float wb[16], xb[16] = {0};
        for (int r = 0; r < RN; r++) {
            w_tail(d, kind, row[r], n + r, i, rem, wb);
            for (int q = 0; q < RM; q++) {
                memcpy(xb, xr[q] + i, (size_t)rem * sizeof(float));
                lo[r][q] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(wb), lo[r][q]);
                hi[r][q] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), _mm256_loadu_ps(wb + 8), hi[r][q]);
            }
        }
    }
    float a[16];
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) {
            _mm256_storeu_ps(a, lo[r][q]);
            _mm256_storeu_ps(a + 8, hi[r][q]);
            float v = reduce16(a);
            if (kind == KF8 || kind == KFP4) v *= d->post;
            y[(int64_t)(m + q) * ldy + n + r] = v;
        }
}

/* Quantized weights, 1 or 2 rows: 4 weight rows per group; within it 2x2
 * tiles while two activation rows remain, then 4x1 (so decode, M = 1, still
 * shares nothing but streams 4 rows). */
#define DRIVER256(NAME, KIND)                                                                              \
    T256 __attribute__((noinline)) static void NAME(const wd *d, const float *x, int m0, int m1, int64_t n0, \
                                                    int64_t n1, float *y, int64_t ldy) {                   \
        for (int64_t n = n0; n < n1;) {                                                                    \
            int rn = n1 - n >= 4 ? 4 : n1 - n >= 2 ? 2 : 1;                                                \
            int m = m0;                                                                                    \
            for (; m + 2 <= m1; m += 2) {                                                                  \
                if (rn == 4) {                                                                             \
                    tile256(d, KIND, 2, 2, x, m, n, y, ldy);                                               \
                    tile256(d, KIND, 2, 2, x, m, n + 2, y, ldy);                                           \
                } else if (rn == 2) tile256(d, KIND, 2, 2, x, m, n, y, ldy);                               \
                else tile256(d, KIND, 1, 2, x, m, n, y, ldy);                                              \
            }                                                                                              \
            if (m < m1) {                                                                                  \
                if (rn == 4) tile256(d, KIND, 4, 1, x, m, n, y, ldy);                                      \
                else if (rn == 2) tile256(d, KIND, 2, 1, x, m, n, y, ldy);                                 \
                else tile256(d, KIND, 1, 1, x, m, n, y, ldy);                                              \
            }                                                                                              \
            n += rn;                                                                                       \
        }                                                                                                  \
    }
DRIVER256(mm256_f8, KF8)
DRIVER256(mm256_f8b, KF8B)
DRIVER256(mm256_fp4, KFP4)
DRIVER256(mm256_q8, KQ8)

/* ---- AVX2, two rows and more: 8 lanes at a time ----
 * A 16-lane accumulator is two independent 8-lane halves (lanes 0..7 sum the
 * elements i mod 16 in 0..7, lanes 8..15 the rest), so a tile can run its K
 * range twice, once per half, with one ymm per output instead of two: twice
 * the outputs per register file, which is what lets one weight chunk be
 * loaded and dequantized once for every activation row of a verify (up to
 * 5 rows). Each half still gets one
 * FMA per element in increasing k, and the halves meet in the same reduce16:
 * bit-identical to tile256 and to the AVX-512 kernels. */

/* Values h*8 .. h*8+7 of the 16-chunk at i: the same as w16_256's lo / hi. */
T256 INL __m256 f8x8_256(__m128i b /* 8 bytes in the low half */) {
    __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xbfff));
    return _mm256_cvtph_ps(h);
}

T256 INL __m256 w8_256(const wd *d, const int kind, const uint8_t *row, int64_t n, int64_t i, int h) {
    const int64_t j = i + 8 * h;
    switch (kind) {
    case KF32: return _mm256_loadu_ps((const float *)row + j);
    case KBF16: { /* each bf16 to the high half of its lane, zeros below: one in-lane byte shuffle of the
                     8 values loaded into both halves (widen + shift took two uops, the shift on the FMA ports) */
        const __m256i ctl = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1, -1, 10, 11, -1, -1,
                                             12, 13, -1, -1, 14, 15);
        return _mm256_castsi256_ps(
            _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + j))), ctl));
    }
    case KF16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + j)));
    case KF8: return f8x8_256(_mm_loadl_epi64((const __m128i *)(row + j)));
    case KF8B:
        return _mm256_mul_ps(f8x8_256(_mm_loadl_epi64((const __m128i *)(row + j))), _mm256_set1_ps(block_scale_val(d, n, i) * 256.0f));
    case KQ8:
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + j)))),
                             _mm256_set1_ps(td_bf16_to_f32(d->sq[n * (d->K / 32) + i / 32])));
    default: {
        int32_t b4;
        memcpy(&b4, row + j / 2, 4);
        __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(b4));
        __m128i nib = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0f)), _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
        return _mm256_mul_ps(fp4x8_256(nib), _mm256_set1_ps(fp8_lut[d->s4[n * (d->K / 16) + i / 16]]));
    }
    }
}

/* RN weight rows x RM activation rows over k in [k0, k1) (multiples of 16),
 * both halves; acc: output (r, q) at acc + r * ar + q * 16 (16 floats, the
 * running 16-lane sum). pf (may be NULL): rows to prefetch, at the same
 * offsets from k0 as this tile reads. */
T256 INL void htile256(const wd *d, const int kind, const int RN, const int RM, const uint8_t *const *row, int64_t n,
                       const float *const *xr, int64_t k0, int64_t k1, float *acc, int64_t ar,
                       const uint8_t *const *pf, int64_t step, const bool first) {
    for (int h = 0; h < 2; h++) {
        __m256 a[4][5];
        for (int r = 0; r < RN; r++)
            for (int q = 0; q < RM; q++) a[r][q] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * ar + q * 16 + 8 * h);
        int64_t off = 0;
        for (int64_t i = k0; i < k1; i += 16, off += step) {
            if (pf && h == 0 && (off & 63) == 0)
                for (int r = 0; r < RN; r++) _mm_prefetch((const char *)pf[r] + off, _MM_HINT_T0);
            __m256 w[4];
            for (int r = 0; r < RN; r++) w[r] = w8_256(d, kind, row[r], n + r, i, h);
            for (int q = 0; q < RM; q++) {
                __m256 xv = _mm256_loadu_ps(xr[q] + i + 8 * h);
                /* one load per activation chunk, not one per FMA (gcc folds it into every FMA, and the
                   loads then outnumber the FMAs: 12 per 10 in a 2 x 5 tile) */
                if (RN > 1) __asm__("" : "+x"(xv));
                for (int r = 0; r < RN; r++) a[r][q] = _mm256_fmadd_ps(xv, w[r], a[r][q]);
            }
        }
        for (int r = 0; r < RN; r++)
            for (int q = 0; q < RM; q++) _mm256_storeu_ps(acc + r * ar + q * 16 + 8 * h, a[r][q]);
    }
}

/* Decode (one activation row) with TD_TUNE_AMD: RN weight rows, both halves
 * of each 16-chunk in one pass (two ymm accumulators per output) instead of
 * htile256's two passes over the slice. Each lane gets the same FMAs in the
 * same order, so the same bits. On the EPYC Zen 5 guest it streamed the
 * weights faster (bench/results/zen5-2026-12-07.md); on the Intel Xeon the
 * half-lane passes were measured and kept. */
T256 INL void ftile256(const wd *d, const int kind, const int RN, const uint8_t *const *row, int64_t n, const float *xr,
                       int64_t k0, int64_t k1, float *acc, int64_t ar, const uint8_t *const *pf, int64_t step, const bool first) {
    __m256 a[4][2];
    for (int r = 0; r < RN; r++)
        for (int h = 0; h < 2; h++) a[r][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * ar + 8 * h);
    int64_t off = 0;
    for (int64_t i = k0; i < k1; i += 16, off += step) {
        if (pf && (off & 63) == 0)
            for (int r = 0; r < RN; r++) _mm_prefetch((const char *)pf[r] + off, _MM_HINT_T0);
        const __m256 x0 = _mm256_loadu_ps(xr + i), x1 = _mm256_loadu_ps(xr + i + 8);
        for (int r = 0; r < RN; r++) {
            a[r][0] = _mm256_fmadd_ps(x0, w8_256(d, kind, row[r], n + r, i, 0), a[r][0]);
            a[r][1] = _mm256_fmadd_ps(x1, w8_256(d, kind, row[r], n + r, i, 1), a[r][1]);
        }
    }
    for (int r = 0; r < RN; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(acc + r * ar + 8 * h, a[r][h]);
}

/* Weight rows per tile for RM (1..5) activation rows: RN * RM accumulators
 * + RN weights + 1 activation within the 16 ymm registers (3 x 4 at 16 was
 * measured slower than 2 x 4: spills). */
static inline int rn_for(int rm) { return rm <= 2 ? 4 : rm == 3 ? 3 : 2; }

#define HT(RN_, RM_) htile256(d, kind, RN_, RM_, row, n, xr, k0, k1, acc, ar, pf, step, first)
T256 INL void htile_any(const wd *d, const int kind, int rn, int rm, const uint8_t *const *row, int64_t n,
                        const float *const *xr, int64_t k0, int64_t k1, float *acc, int64_t ar,
                        const uint8_t *const *pf, int64_t step, const bool first, const bool full1) {
    if (full1 && rm == 1) {
        switch (rn) {
        case 4: ftile256(d, kind, 4, row, n, xr[0], k0, k1, acc, ar, pf, step, first); break;
        case 3: ftile256(d, kind, 3, row, n, xr[0], k0, k1, acc, ar, pf, step, first); break;
        case 2: ftile256(d, kind, 2, row, n, xr[0], k0, k1, acc, ar, pf, step, first); break;
        default: ftile256(d, kind, 1, row, n, xr[0], k0, k1, acc, ar, pf, step, first); break;
        }
        return;
    }
#define HT_RN4(RM_) switch (rn) { case 4: HT(4, RM_); break; case 3: HT(3, RM_); break; case 2: HT(2, RM_); break; default: HT(1, RM_); }
#define HT_RN3(RM_) switch (rn) { case 3: HT(3, RM_); break; case 2: HT(2, RM_); break; default: HT(1, RM_); }
#define HT_RN2(RM_) switch (rn) { case 2: HT(2, RM_); break; default: HT(1, RM_); }
    switch (rm) {
    case 1: HT_RN4(1) break;
    case 2: HT_RN4(2) break;
    case 3: HT_RN3(3) break;
    case 4: HT_RN3(4) break;
    default: HT_RN2(5) break;
    }
#undef HT_RN4
#undef HT_RN3
#undef HT_RN2
}
#undef HT

/* reduce16 of 16 outputs at once (as finish16 for AVX-512): accumulator j at
 * a + j * stride, its result to y[j]. Lanes 8 apart are added per output,
 * then lanes 4, 2 and 1 apart with the outputs packed 2, 4 and 8 to a ymm:
 * the same additions as reduce16, so the same bits. */
T256 INL void finish16_256(const wd *d, const int kind, const float *a, int64_t stride, float *y) {
    __m256 v[16], w[8], z[4];
    for (int j = 0; j < 16; j++) v[j] = _mm256_add_ps(_mm256_loadu_ps(a + j * stride), _mm256_loadu_ps(a + j * stride + 8));
    for (int j = 0; j < 8; j++) /* [s8[0..3] + s8[4..7] of o(2j) | of o(2j+1)] */
        w[j] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x20), _mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x31));
    for (int j = 0; j < 4; j++) /* [s2 of o(4j), o(4j+2) | o(4j+1), o(4j+3)] */
        z[j] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * j], w[2 * j + 1], 0x44), _mm256_shuffle_ps(w[2 * j], w[2 * j + 1], 0xee));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int j = 0; j < 2; j++) { /* lanes hold outputs 0 2 4 6 1 3 5 7 of this group of 8 */
        __m256 r = _mm256_add_ps(_mm256_shuffle_ps(z[2 * j], z[2 * j + 1], 0x88), _mm256_shuffle_ps(z[2 * j], z[2 * j + 1], 0xdd));
        r = _mm256_permutevar8x32_ps(r, order);
        if (kind == KF8 || kind == KFP4) r = _mm256_mul_ps(r, _mm256_set1_ps(d->post));
        _mm256_storeu_ps(y + 8 * j, r);
    }
}

/* K % 16 tail of RN x RM outputs (zero padded, as tile256) and the final
 * reduction into y. */
T256 INL void finish256(const wd *d, const int kind, const float *x, int m, int rm, int64_t n, int rn, float *acc, int64_t ar,
                        float *y, int64_t ldy) {
    const int64_t K = d->K, Kfull = K & ~(int64_t)15;
    if (Kfull < K) {
        int rem = (int)(K - Kfull);
        float wb[16], xb[16] = {0};
        for (int r = 0; r < rn; r++) {
            w_tail(d, kind, d->data + (n + r) * d->row_bytes, n + r, Kfull, rem, wb);
            for (int q = 0; q < rm; q++) {
                memcpy(xb, x + (int64_t)(m + q) * K + Kfull, (size_t)rem * sizeof(float));
                float *ap = acc + r * ar + q * 16;
                _mm256_storeu_ps(ap, _mm256_fmadd_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(wb), _mm256_loadu_ps(ap)));
                _mm256_storeu_ps(ap + 8, _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), _mm256_loadu_ps(wb + 8), _mm256_loadu_ps(ap + 8)));
            }
        }
    }
    const int n16 = rn & ~15;
    for (int q = 0; q < rm; q++) {
        float *yq = y + (int64_t)(m + q) * ldy + n;
        for (int r = 0; r < n16; r += 16) finish16_256(d, kind, acc + r * ar + q * 16, ar, yq + r);
        for (int r = n16; r < rn; r++) {
            float v = reduce16(acc + r * ar + q * 16);
            yq[r] = kind == KF8 || kind == KFP4 ? v * d->post : v;
        }
    }
}

/* Verify (2 .. PANEL_MIN_M - 1 activation rows; 1 too, for unquantized
 * weights: see tiles256): groups of VG weight rows;
 * for each K slice of VK elements (its activation rows stay in L1) every
 * tile of the group runs over the slice, so each weight chunk streams from
 * memory once and is dequantized once per chunk of up to VM activation rows
 * (a verify of 5 tokens: once). Measured on the 27B-shaped matrices (Zen 4,
 * AVX2 forced): slicing K is worth 1.5x at M = 5 over full-K tiles (their
 * activation rows come from L2). Each tile prefetches the row slices PFR
 * ahead of its own (a fixed distance in bytes: a distance in tiles, 2, was
 * 4 row slices at M = 2..4 and 8 at 5 (M = 2 best), and 4 tiles the other
 * way round; BF16, 1 GiB matrix, 2 threads, AVX2 on the Xeon: t(5)/t(1)
 * 1.34-1.35 -> 1.27-1.30, t(2)/t(1) 1.05-1.06 -> 1.02-1.04; 6 and 12 no
 * better, 16 1.8x worse). */
enum { VG = 16, VK = 512, VM = 5, PFR = 8 };

T256 INL void verify256(const wd *d, const int kind, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy,
                        const bool full1) {
    const int64_t K = d->K, Kfull = K & ~(int64_t)15, rb = d->row_bytes;
    const int64_t step = 16 * rb / K;
    _Alignas(32) float acc[VG * VM * 16];
    const int M = m1 - m0, nch = (M + VM - 1) / VM;
    for (int64_t g = n0; g < n1; g += VG) {
        const int gn = n1 - g < VG ? (int)(n1 - g) : VG;
        for (int c = 0; c < nch; c++) {
            const int cm0 = m0 + M * c / nch, cm1 = m0 + M * (c + 1) / nch, rm = cm1 - cm0, rn = rn_for(rm);
            const float *xr[VM];
            for (int q = 0; q < rm; q++) xr[q] = x + (int64_t)(cm0 + q) * K;
            memset(acc, 0, sizeof(float) * (size_t)gn * VM * 16);
            for (int64_t k0 = 0; k0 < Kfull; k0 += VK) {
                const int64_t k1 = Kfull - k0 < VK ? Kfull : k0 + VK;
                for (int r = 0; r < gn;) {
                    const int t = gn - r < rn ? gn - r : rn;
                    const uint8_t *row[4], *pf[4];
                    slice_rows(d, g, gn, r, t, k0, Kfull, n1, VK, PFR, step, row, pf);
                    htile_any(d, kind, t, rm, row, g + r, xr, k0, k1, acc + (int64_t)r * VM * 16, VM * 16, pf, step, false, full1);
                    r += t;
                }
            }
            finish256(d, kind, x, cm0, rm, g, gn, acc, VM * 16, y, ldy);
        }
    }
}

/* Prefill (PANEL_MIN_M rows and more), outer products over residues. Every
 * output's accumulator is 16 lanes, lane j summing the products of k = j,
 * j + 16, j + 32, ... in increasing k; the 16 chains are independent, so a
 * panel runs them one after another (residue-major) instead of side by side.
 * Within one residue a ymm then holds that lane for 8 outputs (weight rows),
 * and a step is the classic GEMM outer product: 2 weight vectors (16 rows at
 * k) and 6 broadcast activations make 12 FMAs (a 6 x 16 register tile, 8
 * loads per 12 FMAs, no shuffles). The half-lane tiles it replaces kept each
 * output's lanes across a ymm, so every FMA needed an activation and a weight
 * vector of its own k range (7 loads per 12 FMAs), and each pass over K read
 * every cache line for half its floats. Each FMA is still fma(x[k], w[k],
 * lane k mod 16) in increasing k, the K % 16 tail is one more zero-padded
 * step, and the 16 lanes meet in reduce16's tree: the same bits as tile256,
 * verify256 and the AVX-512 kernels (test_kernels checks prefill rows against
 * M = 1 bit for bit).
 *
 * Weights: a panel of 16 rows x RPK columns is dequantized into f32 once per
 * activation block, transposed residue-major (wp[j][t][16 rows], k = k0 +
 * 16 t + j; 16 KiB, L1) and used by every 6-row group of the block. The
 * activations are read in place (a group's 6 x RPK slice stays in L1 over
 * the 16 residues). Accumulators between K slices: acc[q][j][16 rows]. */
enum { RPK = 256, RPT = RPK / 16, RPN = 16, RMR = 6, RPM = 64 };

/* 8 x 8 transpose: r[i] lane l -> r[l] lane i. */
T256 INL void tr8x8_256(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) { /* u[4i + c]: column c | c + 4 of rows 4i .. 4i + 3 */
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* Weight rows [n, n + nn) (nn <= 16; the rest zero) over chunks k0 + 16 t,
 * t < nt, into wp[j][t][16] (a residue's rows RPT chunks apart). */
T256 INL void pack_rows256(const wd *d, const int kind, int64_t n, int nn, int64_t k0, int nt, float *wp) {
    for (int t = 0; t < nt; t++) {
        const int64_t i = k0 + 16 * (int64_t)t;
        for (int h = 0; h < 2; h++) /* rows 8h .. 8h + 7 */
            for (int e = 0; e < 2; e++) { /* residues 8e .. 8e + 7 */
                __m256 v[8];
                for (int r = 0; r < 8; r++)
                    v[r] = 8 * h + r < nn ? w8_256(d, kind, d->data + (n + 8 * h + r) * d->row_bytes, n + 8 * h + r, i, e)
                                          : _mm256_setzero_ps();
                tr8x8_256(v); /* v[j]: residue 8e + j of the 8 rows */
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(wp + ((int64_t)(8 * e + j) * RPT + t) * RPN + 8 * h, v[j]);
            }
    }
}

/* RM (<= 6) activation rows x 16 weight rows, residue j, nt steps: xr[q]
 * points at row q's element k0 + j (step t reads xr[q][16 t]), w at wp[j][0],
 * a at acc[q = 0][j] (row stride aq floats). */
T256 INL void rtile256(const int RM, const float *const *xr, const float *w, int nt, float *a, int64_t aq, const bool first) {
    __m256 c[RMR][2];
    for (int q = 0; q < RM; q++)
        for (int h = 0; h < 2; h++) c[q][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(a + q * aq + 8 * h);
    for (int t = 0; t < nt; t++) {
        const __m256 w0 = _mm256_loadu_ps(w + t * RPN), w1 = _mm256_loadu_ps(w + t * RPN + 8);
        for (int q = 0; q < RM; q++) {
            const __m256 xb = _mm256_broadcast_ss(xr[q] + 16 * t);
            c[q][0] = _mm256_fmadd_ps(xb, w0, c[q][0]);
            c[q][1] = _mm256_fmadd_ps(xb, w1, c[q][1]);
        }
    }
    for (int q = 0; q < RM; q++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(a + q * aq + 8 * h, c[q][h]);
}

T256 INL void rtile_any256(int rm, const float *const *xr, const float *w, int nt, float *a, int64_t aq, const bool first) {
    switch (rm) {
    case 1: rtile256(1, xr, w, nt, a, aq, first); break;
    case 2: rtile256(2, xr, w, nt, a, aq, first); break;
    case 3: rtile256(3, xr, w, nt, a, aq, first); break;
    case 4: rtile256(4, xr, w, nt, a, aq, first); break;
    case 5: rtile256(5, xr, w, nt, a, aq, first); break;
    default: rtile256(6, xr, w, nt, a, aq, first); break;
    }
}

/* Weight rows [n, n + nn) (nn <= 16) x activation rows [m, m + mm) (mm <=
 * RPM) over the whole K. wp: RPN * 16 * RPT floats; acc: RPM * 16 * RPN. */
T256 INL void rpanel256(const wd *d, const int kind, const float *x, int m, int mm, int64_t n, int nn, float *y, int64_t ldy,
                        float *wp, float *acc) {
    const int64_t K = d->K, Kfull = K & ~(int64_t)15, aq = 16 * RPN;
    const float *xr[RMR];
    for (int64_t k0 = 0; k0 < Kfull; k0 += RPK) {
        const int nt = (int)((Kfull - k0 < RPK ? Kfull - k0 : RPK) / 16);
        pack_rows256(d, kind, n, nn, k0, nt, wp);
        for (int g = 0; g < mm; g += RMR) {
            const int rm = mm - g < RMR ? mm - g : RMR;
            /* the next group's slice (else the first group's in the next slice), a line per row per residue:
               the 16 residues read each line of this group's slice in turn, so its first pass would wait
               on L2 for every step */
            const int64_t gn = g + RMR < mm ? g + RMR : 0, kn = g + RMR < mm ? k0 : k0 + RPK;
            const int rn = gn + RMR <= mm ? RMR : mm - (int)gn;
            for (int j = 0; j < 16; j++) {
                if (kn + 16 * j < Kfull) /* a hint, but its address stays inside x */
                    for (int q = 0; q < rn; q++) _mm_prefetch((const char *)(x + (m + gn + q) * K + kn + 16 * j), _MM_HINT_T0);
                for (int q = 0; q < rm; q++) xr[q] = x + (int64_t)(m + g + q) * K + k0 + j;
                rtile_any256(rm, xr, wp + (int64_t)j * RPT * RPN, nt, acc + (int64_t)g * aq + j * RPN, aq, k0 == 0);
            }
        }
    }
    if (Kfull < K || Kfull == 0) { /* one more step, zero padded as tile256's tail (lanes past K get fma(0, 0, a)) */
        float xt[RMR][16];
        if (Kfull == 0) memset(acc, 0, sizeof(float) * (size_t)mm * aq);
        for (int r = 0; r < 16; r++) { /* wp[j][0][r] */
            float wb[16] = {0};
            if (r < nn && Kfull < K) w_tail(d, kind, d->data + (n + r) * d->row_bytes, n + r, Kfull, (int)(K - Kfull), wb);
            for (int j = 0; j < 16; j++) wp[j * RPN + r] = wb[j];
        }
        for (int g = 0; g < mm; g += RMR) {
            const int rm = mm - g < RMR ? mm - g : RMR;
            for (int q = 0; q < rm; q++) {
                memset(xt[q], 0, sizeof xt[q]);
                memcpy(xt[q], x + (int64_t)(m + g + q) * K + Kfull, sizeof(float) * (size_t)(K - Kfull));
            }
            for (int j = 0; j < 16; j++) {
                for (int q = 0; q < rm; q++) xr[q] = xt[q] + j;
                rtile_any256(rm, xr, wp + j * RPN, 1, acc + (int64_t)g * aq + j * RPN, aq, false);
            }
        }
    }
    /* reduce16 down the residues, 8 outputs per ymm: lanes 8 apart, 4, then (0 + 2) + (1 + 3) */
    for (int q = 0; q < mm; q++) {
        const float *a = acc + (int64_t)q * aq;
        float *yq = y + (int64_t)(m + q) * ldy + n;
        for (int h = 0; h < nn; h += 8) {
            __m256 s8[8], s4[4];
            for (int j = 0; j < 8; j++) s8[j] = _mm256_add_ps(_mm256_loadu_ps(a + j * RPN + h), _mm256_loadu_ps(a + (j + 8) * RPN + h));
            for (int j = 0; j < 4; j++) s4[j] = _mm256_add_ps(s8[j], s8[j + 4]);
            __m256 r = _mm256_add_ps(_mm256_add_ps(s4[0], s4[2]), _mm256_add_ps(s4[1], s4[3]));
            if (kind == KF8 || kind == KFP4) r = _mm256_mul_ps(r, _mm256_set1_ps(d->post));
            if (nn - h >= 8) _mm256_storeu_ps(yq + h, r);
            else {
                float o[8];
                _mm256_storeu_ps(o, r);
                memcpy(yq + h, o, sizeof(float) * (size_t)(nn - h));
            }
        }
    }
}

/* NAME: half-lane tiles for every M (DEFAULT); DEC: full-width decode tiles at M = 1 (AMD). */
#define VERIFY256(NAME, DEC, KIND)                                                                                 \
    T256 __attribute__((noinline)) static void NAME(const wd *d, const float *x, int m0, int m1, int64_t n0,        \
                                                    int64_t n1, float *y, int64_t ldy) {                           \
        verify256(d, KIND, x, m0, m1, n0, n1, y, ldy, false);                                                      \
    }                                                                                                              \
    T256 __attribute__((noinline)) static void DEC(const wd *d, const float *x, int m0, int m1, int64_t n0,         \
                                                   int64_t n1, float *y, int64_t ldy) {                            \
        verify256(d, KIND, x, m0, m1, n0, n1, y, ldy, true);                                                       \
    }
VERIFY256(ver256_f32, dec256_f32, KF32)
VERIFY256(ver256_bf16, dec256_bf16, KBF16)
VERIFY256(ver256_f16, dec256_f16, KF16)

/* Scratch on the stack: 16 KiB weight panel + 64 KiB accumulators. */
#define PANEL256(NAME, KIND)                                                                                       \
    T256 __attribute__((noinline)) static void NAME(const wd *d, const float *x, int m0, int m1, int64_t n0,        \
                                                    int64_t n1, float *y, int64_t ldy) {                           \
        _Alignas(32) float wp[16 * RPT * RPN];                                                                       \
        _Alignas(32) float acc[RPM * 16 * RPN];                                                                     \
        for (int64_t n = n0; n < n1; n += RPN)                                                                      \
            for (int m = m0; m < m1; m += RPM)                                                                     \
                rpanel256(d, KIND, x, m, m1 - m < RPM ? m1 - m : RPM, n, n1 - n < RPN ? (int)(n1 - n) : RPN, y, ldy, \
                          wp, acc);                                                                                \
    }
PANEL256(pan256_f32, KF32)
PANEL256(pan256_bf16, KBF16)
PANEL256(pan256_f16, KF16)
PANEL256(pan256_f8, KF8)
PANEL256(pan256_f8b, KF8B)
PANEL256(pan256_fp4, KFP4)
PANEL256(pan256_q8, KQ8)

/* Verify with quantized weights (3 .. PANEL_MIN_M - 1 rows): one weight row x
 * up to 5 activation rows per tile (10 accumulators), so each chunk of 16
 * weights is dequantized once per 5 rows instead of once per 2 (the 2 x 2
 * tiles of DRIVER256); the weight row stays in L1 for the next chunk of rows.
 * Measured on an AVX2-only Zen 3 (q8, the 27B-proportioned model, 2 threads):
 * bench/results/avx2-epyc-2026-12-02.md. Full 16-lane accumulators, one FMA
 * per element in increasing k: the same bits as every other tile. */
#define QVERIFY256(NAME, KIND, TWO)                                                                               \
    T256 __attribute__((noinline)) static void NAME(const wd *d, const float *x, int m0, int m1, int64_t n0,        \
                                                    int64_t n1, float *y, int64_t ldy) {                           \
        const int M = m1 - m0, nch = (M + 4) / 5;                                                                  \
        if (M < 3) { TWO(d, x, m0, m1, n0, n1, y, ldy); return; }                                                  \
        for (int64_t n = n0; n < n1; n++)                                                                          \
            for (int c = 0; c < nch; c++) {                                                                        \
                const int cm0 = m0 + M * c / nch, rm = m0 + M * (c + 1) / nch - cm0;                               \
                switch (rm) {                                                                                      \
                case 3: tile256(d, KIND, 1, 3, x, cm0, n, y, ldy); break;                                          \
                case 4: tile256(d, KIND, 1, 4, x, cm0, n, y, ldy); break;                                          \
                default: tile256(d, KIND, 1, 5, x, cm0, n, y, ldy); break;                                         \
                }                                                                                                  \
            }                                                                                                      \
    }
QVERIFY256(qver256_f8, KF8, mm256_f8)
QVERIFY256(qver256_f8b, KF8B, mm256_f8b)
QVERIFY256(qver256_fp4, KFP4, mm256_fp4)
QVERIFY256(qver256_q8, KQ8, mm256_q8)

/* Decode (M = 1): unquantized weights (f32, bf16, f16) also take verify256,
 * K sliced and rows prefetched PFR slices ahead, a 4 x 1 half-lane tile:
 * it streams the weights faster than tile256's 4 full rows side by side
 * (BF16, AVX2 forced on the Intel Xeon VM, 2 threads, fuzz lanes stopped,
 * 2026-12-05: the 27B-proportioned 1.5 GB model's decode 13.0-13.7 -> 15.3-15.8
 * tokens/s, 23.1-23.8 GB/s = the read probe; bench/verify_matmul M = 1 46-49 ->
 * 41-45 ms). The quantized formats keep tile256 at M = 1 (q8 through verify256
 * decoded at 16.6-17.0 tokens/s against tile256's 19.0-19.2: it is compute-bound,
 * and the half-lane tiles dequantize 8 lanes per step, not 16). */
static const mm_fn tiles256[] = {ver256_f32, ver256_bf16, ver256_f16, mm256_f8, mm256_f8b, mm256_fp4, mm256_q8};
/* TD_TUNE_AMD: the unquantized formats' decode through ftile256 (one pass per slice). */
static const mm_fn tiles256_amd[] = {dec256_f32, dec256_bf16, dec256_f16, mm256_f8, mm256_f8b, mm256_fp4, mm256_q8};
/* The quantized formats keep full-width tiles for verify (qverify256: 1 x 3..5
 * from 3 rows, DRIVER256's 2 x 2 at 2): their dequantization per 8 lanes
 * (q8: load, widen, convert, scale) made the half-lane tiles slower than
 * tile256 at 2..4 rows (q8, 27B-shaped matrices, AVX2 forced on Zen 4: M = 2
 * 2.49 vs 1.71 ms) and only even at 5. */
static const mm_fn verify256s[] = {ver256_f32, ver256_bf16, ver256_f16, qver256_f8, qver256_f8b, qver256_fp4, qver256_q8};
static const mm_fn panels256[] = {pan256_f32, pan256_bf16, pan256_f16, pan256_f8, pan256_f8b, pan256_fp4, pan256_q8};

void td_mm_avx2(td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    wd d;
    int kind = setup(W, &d);
    int M = m1 - m0;
    (M >= PANEL_MIN_M ? panels256 : M >= 2 ? verify256s : tune == TD_TUNE_AMD ? tiles256_amd : tiles256)[kind](&d, x, m0, m1, n0, n1, y, ldy);
}
#else
typedef int td_kernels_x86_unused;
#endif
