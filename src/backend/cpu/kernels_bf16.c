/* BF16-activation matmul (`--precision bf16`, td_backend.precision): the
 * activation rows are rounded to BF16 once per matmul (td_x_to_bf16, round to
 * nearest even) and each 32-element chunk of a weight row is dequantized to
 * f32 as in kernels_x86.c and rounded to BF16, then VDPBF16PS (AVX-512 BF16)
 * adds the two products of each element pair into one f32 lane: twice the
 * multiply-adds per instruction of the f32 FMA path, and half the activation
 * bytes, which is what prefill (compute-bound) gains from.
 *
 * Weights that are exact in BF16 stay exact: BF16 itself, FP8 e4m3 with a
 * per-tensor scale (the scale is applied after the sum, as in the f32 path)
 * and NVFP4 (e2m1 x an e4m3 block scale has at most 6 significant bits; the
 * global multiplier is applied after the sum). F32, F16, FP8 with block
 * scales and q8 lose their low bits to the rounding.
 *
 * Batch invariance, as in every kernel: output y[m,n] is one 16-lane
 * accumulator over the whole K, lane j taking the pair (2j, 2j+1) of every
 * 32-chunk in increasing k (the last chunk zero padded), then the fixed
 * reduce16 tree. The decode/verify tiles and the prefill panels only change
 * which outputs are computed together, so any M, tile, thread split or row
 * block gives the same bits (test_kernels checks every row of a prefill-sized
 * batch against M = 1). Results are not bit-identical to the f32 path: that
 * is the tolerance test_precision states. */
#include "backend/cpu/kernels_x86.h"
#include "util/err.h"
#if defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 10)
#define TBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,avx2")))

bool td_kernels_have_bf16(void) {
    __builtin_cpu_init();
    return td_kernels_best_isa() == TD_ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
}

TBF void td_x_to_bf16(const float *x, int M, int64_t K, int64_t ldb, uint16_t *xb) {
    for (int m = 0; m < M; m++) {
        const float *src = x + (int64_t)m * K;
        uint16_t *dst = xb + (int64_t)m * ldb;
        int64_t i = 0;
        for (; i + 16 <= K; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
        if (i < K) {
            float t[16] = {0};
            memcpy(t, src + i, (size_t)(K - i) * sizeof(float));
            uint16_t o[16];
            _mm256_storeu_si256((__m256i *)o, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(t)));
            memcpy(dst + i, o, (size_t)(K - i) * sizeof(uint16_t));
        }
        for (i = K; i < ldb; i++) dst[i] = 0; /* the zero padding the last chunk reads */
    }
}

/* 32 weights of row n at column i as BF16 pairs; `rem` < 32 for the last chunk (zero padded). */
TBF INL __m512bh wbf32(const wd *d, const int kind, const uint8_t *row, int64_t n, int64_t i, int rem) {
    if (rem >= 32) {
        if (kind == KBF16) return (__m512bh)_mm512_loadu_si512((const void *)((const uint16_t *)row + i));
        return _mm512_cvtne2ps_pbh(w16_512(d, kind, row, n, i + 16), w16_512(d, kind, row, n, i));
    }
    /* nvfp4 and q8 have K % 16 == 0, so their tail is exactly one full 16-chunk */
    float lo[16], hi[16];
    if (rem >= 16) _mm512_storeu_ps(lo, w16_512(d, kind, row, n, i));
    else w_tail(d, kind, row, n, i, rem, lo);
    if (rem > 16) w_tail(d, kind, row, n, i + 16, rem - 16, hi);
    else memset(hi, 0, sizeof hi);
    return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo));
}

INL float finish(const wd *d, const int kind, const float *a) {
    float v = reduce16(a);
    return kind == KF8 || kind == KFP4 ? v * d->post : v;
}

/* Decode and verify (M < 32) with K sliced, as kernels_x86.c's sliced512:
 * weight rows in groups of DG5, activation rows in chunks of up to 6 (evenly
 * split), K in DK5-element slices (whole 32-chunks), every tile of up to 4
 * weight rows x the chunk's rows running over one slice while its activation
 * rows stay in L1, each prefetching the row slices DPF5 ahead of its own;
 * the running sums stay in acc between slices, and the zero-padded last
 * chunk follows as in the panels. The same VDPBF16PS sequence per output as
 * the full-K tiles it replaced (test_kernels: every M against M = 1).
 * Measured side by side: bench/results/verify-sliced-2026-12-05.md. */
TBF INL void stilebf(const wd *d, const int kind, const int RN, const int RM, const uint8_t *const *row, int64_t n,
                     const uint16_t *const *xr, int64_t k0, int64_t k1, float *acc, int64_t ar, const uint8_t *const *pf,
                     int64_t step32) {
    __m512 a[4][6];
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) a[r][q] = _mm512_loadu_ps(acc + r * ar + q * 16);
    int64_t off = 0, snext = k0;
    float cur[4] = {0}, slo[4] = {0}, shi[4] = {0}; /* KF8B: block scales x 256 of the two 16-chunks, fetched where a
                                                       block starts (as kernels_x86.c's stile512) */
    for (int64_t i = k0; i < k1; i += 32, off += step32) {
        if ((off & 63) == 0)
            for (int r = 0; r < RN; r++) _mm_prefetch((const char *)pf[r] + off, _MM_HINT_T0);
        if (kind == KF8B) {
            block_scales_at(d, n, RN, i, cur, &snext);
            memcpy(slo, cur, sizeof slo);
            block_scales_at(d, n, RN, i + 16, cur, &snext); /* a block may start half way (blocks of 16, 48, ...) */
            memcpy(shi, cur, sizeof shi);
        }
        __m512bh w[4];
        for (int r = 0; r < RN; r++)
            w[r] = kind == KF8B ? _mm512_cvtne2ps_pbh(
                                      _mm512_mul_ps(f8x16_512(_mm_loadu_si128((const __m128i *)(row[r] + i + 16))), _mm512_set1_ps(shi[r])),
                                      _mm512_mul_ps(f8x16_512(_mm_loadu_si128((const __m128i *)(row[r] + i))), _mm512_set1_ps(slo[r])))
                                : wbf32(d, kind, row[r], n + r, i, 32);
        for (int q = 0; q < RM; q++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xr[q] + i));
            for (int r = 0; r < RN; r++) a[r][q] = _mm512_dpbf16_ps(a[r][q], xv, w[r]);
        }
    }
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) _mm512_storeu_ps(acc + r * ar + q * 16, a[r][q]);
}

#define STBF_RN(RM_)                                                                              \
    switch (t) {                                                                                  \
    case 4: stilebf(d, kind, 4, RM_, row, g + r, xr, k0, k1, ap, ar, pf, 2 * step); break;        \
    case 3: stilebf(d, kind, 3, RM_, row, g + r, xr, k0, k1, ap, ar, pf, 2 * step); break;        \
    case 2: stilebf(d, kind, 2, RM_, row, g + r, xr, k0, k1, ap, ar, pf, 2 * step); break;        \
    default: stilebf(d, kind, 1, RM_, row, g + r, xr, k0, k1, ap, ar, pf, 2 * step); break;       \
    }

TBF INL void slicedbf(const wd *d, const int kind, const uint16_t *xb, int64_t ldb, int m0, int m1, int64_t n0, int64_t n1,
                      float *y, int64_t ldy) {
    enum { CM = 6 };
    const int64_t K = d->K, K32 = K & ~(int64_t)31, rb = d->row_bytes, step = 16 * rb / K, ar = CM * 16;
    _Alignas(64) float acc[DG5 * CM * 16];
    const int M = m1 - m0, nch = (M + CM - 1) / CM;
    for (int64_t g = n0; g < n1; g += DG5) {
        const int gn = n1 - g < DG5 ? (int)(n1 - g) : DG5;
        for (int c = 0; c < nch; c++) {
            const int cm0 = m0 + M * c / nch, rm = m0 + M * (c + 1) / nch - cm0;
            const uint16_t *xr[CM];
            for (int q = 0; q < rm; q++) xr[q] = xb + (int64_t)(cm0 + q) * ldb;
            memset(acc, 0, sizeof(float) * (size_t)gn * ar);
            for (int64_t k0 = 0; k0 < K32; k0 += DK5) {
                const int64_t k1 = K32 - k0 < DK5 ? K32 : k0 + DK5;
                for (int r = 0; r < gn;) {
                    const int t = gn - r < 4 ? gn - r : 4;
                    const uint8_t *row[4], *pf[4];
                    float *ap = acc + (int64_t)r * ar;
                    slice_rows(d, g, gn, r, t, k0, K32, n1, DK5, DPF5, step, row, pf);
                    switch (rm) {
                    case 1: STBF_RN(1) break;
                    case 2: STBF_RN(2) break;
                    case 3: STBF_RN(3) break;
                    case 4: STBF_RN(4) break;
                    case 5: STBF_RN(5) break;
                    default: STBF_RN(6) break;
                    }
                    r += t;
                }
            }
            if (K32 < K) /* the zero-padded last chunk: the same VDPBF16PS sequence as the panel's */
                for (int r = 0; r < gn; r++) {
                    const __m512bh wt = wbf32(d, kind, d->data + (g + r) * rb, g + r, K32, (int)(K - K32));
                    for (int q = 0; q < rm; q++) {
                        float *ap = acc + r * ar + q * 16;
                        const __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xr[q] + K32));
                        _mm512_storeu_ps(ap, _mm512_dpbf16_ps(_mm512_loadu_ps(ap), xv, wt));
                    }
                }
            for (int q = 0; q < rm; q++) {
                float *yq = y + (int64_t)(cm0 + q) * ldy + g;
                if (gn == DG5) finish16(d, kind, acc + q * 16, ar, yq);
                else
                    for (int r = 0; r < gn; r++) yq[r] = finish(d, kind, acc + r * ar + q * 16);
            }
        }
    }
}
#undef STBF_RN

#define SLICEDBF(NAME, KIND)                                                                                          \
    TBF __attribute__((noinline)) static void NAME(const wd *d, const uint16_t *xb, int64_t ldb, int m0, int m1,      \
                                                   int64_t n0, int64_t n1, float *y, int64_t ldy) {                  \
        slicedbf(d, KIND, xb, ldb, m0, m1, n0, n1, y, ldy);                                                           \
    }
SLICEDBF(tbf_f32, KF32)
SLICEDBF(tbf_bf16, KBF16)
SLICEDBF(tbf_f16, KF16)
SLICEDBF(tbf_f8, KF8)
SLICEDBF(tbf_f8b, KF8B)
SLICEDBF(tbf_fp4, KFP4)
SLICEDBF(tbf_q8, KQ8)

/* Prefill: a panel of PB_N weight rows x PB_K columns converted to BF16 once
 * (L1-resident, 34 KiB) and reused by every activation row of the block; each
 * output's accumulator lives in `acc` between K slices, so the per-element
 * sequence of VDPBF16PS is the tile's. */
enum { PB_N = 32, PB_K = 512, PB_M = TD_BF16_M_BLOCK, PB_STR = PB_K + 32 };

/* first: the K slice at 0, whose accumulators start at zero (not read from acc) */
TBF INL void microbf(const int RN, const int RM, const uint16_t *wp, const uint16_t *xp, int64_t ldb, int kk, float *acc,
                     const bool first) {
    __m512 a[4][4];
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) a[r][q] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + ((int64_t)r * PB_M + q) * 16);
    for (int i = 0; i < kk; i += 32) {
        __m512bh w[4];
        for (int r = 0; r < RN; r++) w[r] = (__m512bh)_mm512_loadu_si512((const void *)(wp + r * PB_STR + i));
        for (int q = 0; q < RM; q++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xp + q * ldb + i));
            for (int r = 0; r < RN; r++) a[r][q] = _mm512_dpbf16_ps(a[r][q], xv, w[r]);
        }
    }
    for (int r = 0; r < RN; r++)
        for (int q = 0; q < RM; q++) _mm512_storeu_ps(acc + ((int64_t)r * PB_M + q) * 16, a[r][q]);
}

TBF INL void panelbf_block(const wd *d, const int kind, const uint16_t *xb, int64_t ldb, int m, int mm, int64_t n, int nn,
                           float *y, int64_t ldy, uint16_t *wpan, float *acc) {
    const int64_t K = d->K;
    if (K == 0) memset(acc, 0, sizeof(float) * (size_t)PB_N * PB_M * 16); /* no slice below sets them */
    for (int64_t k0 = 0; k0 < K; k0 += PB_K) {
        const bool first = k0 == 0;
        int kk = (int)(K - k0 < PB_K ? K - k0 : PB_K);
        int kpad = (kk + 31) & ~31; /* the tail chunk is zero padded, like the tile's */
        for (int r = 0; r < nn; r++) {
            const uint8_t *row = d->data + (n + r) * d->row_bytes;
            for (int i = 0; i < kpad; i += 32)
                _mm512_storeu_si512((void *)(wpan + r * PB_STR + i), (__m512i)wbf32(d, kind, row, n + r, k0 + i, kk - i));
        }
        for (int q = 0; q < mm;) {
            int rm = mm - q >= 4 ? 4 : mm - q >= 2 ? 2 : 1;
            const uint16_t *xp = xb + (int64_t)(m + q) * ldb + k0;
            for (int r = 0; r < nn;) {
                int rn = nn - r >= 4 ? 4 : nn - r >= 2 ? 2 : 1;
                float *ap = acc + ((int64_t)r * PB_M + q) * 16;
                const uint16_t *wp = wpan + r * PB_STR;
                if (rn == 4) {
                    if (rm == 4) microbf(4, 4, wp, xp, ldb, kpad, ap, first);
                    else if (rm == 2) microbf(4, 2, wp, xp, ldb, kpad, ap, first);
                    else microbf(4, 1, wp, xp, ldb, kpad, ap, first);
                } else if (rn == 2) {
                    if (rm == 4) microbf(2, 4, wp, xp, ldb, kpad, ap, first);
                    else if (rm == 2) microbf(2, 2, wp, xp, ldb, kpad, ap, first);
                    else microbf(2, 1, wp, xp, ldb, kpad, ap, first);
                } else {
                    if (rm == 4) microbf(1, 4, wp, xp, ldb, kpad, ap, first);
                    else if (rm == 2) microbf(1, 2, wp, xp, ldb, kpad, ap, first);
                    else microbf(1, 1, wp, xp, ldb, kpad, ap, first);
                }
                r += rn;
            }
            q += rm;
        }
    }
    finish_panel512(d, kind, acc, PB_M, m, mm, n, nn, y, ldy);
}

/* Scratch on the stack: 34 KiB weight panel + 256 KiB accumulators (pool
 * threads run on default 8 MiB stacks). */
#define PANELBF(NAME, KIND)                                                                                          \
    TBF __attribute__((noinline)) static void NAME(const wd *d, const uint16_t *xb, int64_t ldb, int m0, int m1,      \
                                                   int64_t n0, int64_t n1, float *y, int64_t ldy) {                  \
        _Alignas(64) uint16_t wpan[PB_N * PB_STR];                                                                   \
        _Alignas(64) float acc[PB_N * PB_M * 16];                                                                    \
        for (int64_t n = n0; n < n1; n += PB_N)                                                                      \
            for (int m = m0; m < m1; m += PB_M)                                                                      \
                panelbf_block(d, KIND, xb, ldb, m, m1 - m < PB_M ? m1 - m : PB_M, n,                                  \
                              n1 - n < PB_N ? (int)(n1 - n) : PB_N, y, ldy, wpan, acc);                              \
    }
PANELBF(pbf_f32, KF32)
PANELBF(pbf_bf16, KBF16)
PANELBF(pbf_f16, KF16)
PANELBF(pbf_f8, KF8)
PANELBF(pbf_f8b, KF8B)
PANELBF(pbf_fp4, KFP4)
PANELBF(pbf_q8, KQ8)

typedef void (*mmbf_fn)(const wd *d, const uint16_t *xb, int64_t ldb, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy);
static const mmbf_fn tilesbf[] = {tbf_f32, tbf_bf16, tbf_f16, tbf_f8, tbf_f8b, tbf_fp4, tbf_q8};
static const mmbf_fn panelsbf[] = {pbf_f32, pbf_bf16, pbf_f16, pbf_f8, pbf_f8b, pbf_fp4, pbf_q8};

void td_matmul_block_bf16(const td_tensor *W, const uint16_t *xb, int64_t ldb, int m0, int m1, int64_t n0, int64_t n1, float *y,
                          int64_t ldy) {
    wd d;
    int kind = setup(W, &d);
    (m1 - m0 >= 32 ? panelsbf : tilesbf)[kind](&d, xb, ldb, m0, m1, n0, n1, y, ldy);
}
#else
bool td_kernels_have_bf16(void) { return false; }
void td_x_to_bf16(const float *x, int M, int64_t K, int64_t ldb, uint16_t *xb) {
    (void)x, (void)M, (void)K, (void)ldb, (void)xb;
    TD_ASSERT(!"td_x_to_bf16 without AVX-512 BF16");
}
void td_matmul_block_bf16(const td_tensor *W, const uint16_t *xb, int64_t ldb, int m0, int m1, int64_t n0, int64_t n1, float *y,
                          int64_t ldy) {
    (void)W, (void)xb, (void)ldb, (void)m0, (void)m1, (void)n0, (void)n1, (void)y, (void)ldy;
    TD_ASSERT(!"td_matmul_block_bf16 without AVX-512 BF16");
}
#endif
