/* What the x86 matmul kernels share (kernels_x86.c: f32 activations;
 * kernels_bf16.c: BF16 activations): the weight descriptor, its setup from a
 * td_tensor, and the per-16-element dequantizers, all static inline so each
 * kernel file compiles them with its own target attributes. */
#ifndef TANDEM_CPU_KERNELS_X86_H
#define TANDEM_CPU_KERNELS_X86_H
#include "backend/cpu/kernels.h"
#include "backend/cpu/fp8_table.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define INL static inline __attribute__((always_inline))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")))
#define T256 __attribute__((target("avx2,fma,f16c")))

enum { KF32, KBF16, KF16, KF8, KF8B, KFP4, KQ8 };

typedef struct {
    const uint8_t *data, *s4; /* s4: nvfp4 block scales */
    const uint16_t *sq;       /* q8 block scales [N, K/32], BF16 */
    int64_t K, row_bytes;
    const td_tensor *W;       /* fp8 block scales */
    int64_t bn, bk, sc;
    int bnsh, bksh;           /* n / bn, i / bk as shifts where they are (powers of two; bk >= K: i / bk = 0
                                 = i >> 62), else -1: divide (a division per 16 weights was most of FP8's decode) */
    float post;               /* final multiplier, 1 = none */
} wd;

static const float e2m1_lut[16] __attribute__((unused)) = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

#define fp8_lut td_fp8_e4m3_table /* backend/cpu/fp8_table.h: constant */

static inline float block_scale_val(const wd *d, int64_t n, int64_t i) {
    const td_tensor *W = d->W;
    const int64_t idx = (d->bnsh >= 0 ? n >> d->bnsh : n / d->bn) * d->sc + (d->bksh >= 0 ? i >> d->bksh : i / d->bk);
    switch (W->scales_dtype) {
    case TD_DTYPE_F32: return ((const float *)W->scales)[idx];
    case TD_DTYPE_BF16: return td_bf16_to_f32(((const uint16_t *)W->scales)[idx]);
    default: return td_f16_to_f32(((const uint16_t *)W->scales)[idx]);
    }
}

/* log2(v) for a power of two v >= 1, else -1 */
static inline int pow2_shift(int64_t v) { return v >= 1 && (v & (v - 1)) == 0 ? __builtin_ctzll((unsigned long long)v) : -1; }

/* The first column after i where the FP8 block scale changes: the tiles that
 * stream a row fetch its scale once per block, not per 16 weights (the fetch
 * per 16 weights had FP8 decode at 16 tokens/s where the weights stream at 38). */
static inline int64_t block_scale_next(const wd *d, int64_t i) {
    return ((d->bksh >= 0 ? i >> d->bksh : i / d->bk) + 1) * d->bk; /* bk >= K: i >> 62 = 0, so bk */
}

/* FP8 block scales of rows n .. n + rn - 1 at column i, times 256, into sv,
 * fetched only when i reaches *next (the first column of the next block;
 * start it at the tile's first column). */
static inline void block_scales_at(const wd *d, int64_t n, int rn, int64_t i, float *sv, int64_t *next) {
    if (i < *next) return;
    for (int r = 0; r < rn; r++) sv[r] = block_scale_val(d, n + r, i) * 256.0f;
    *next = block_scale_next(d, i);
}

static inline int setup(const td_tensor *W, wd *d) {
    memset(d, 0, sizeof *d);
    d->W = W;
    d->data = W->data;
    d->K = W->shape[1];
    d->post = 1.0f;
    switch (W->dtype) {
    case TD_DTYPE_F32: d->row_bytes = d->K * 4; return KF32;
    case TD_DTYPE_BF16: d->row_bytes = d->K * 2; return KBF16;
    case TD_DTYPE_F16: d->row_bytes = d->K * 2; return KF16;
    case TD_DTYPE_F8_E4M3:
        d->row_bytes = d->K;
        if (!W->scales) { d->post = W->scale_f * 256.0f; return KF8; }
        d->bn = W->scale_block[0];
        d->bk = W->scale_block[1];
        d->sc = (d->K + d->bk - 1) / d->bk;
        d->bnsh = pow2_shift(d->bn);
        d->bksh = d->bk >= d->K ? 62 : pow2_shift(d->bk);
        return KF8B;
    case TD_DTYPE_Q8:
        d->row_bytes = d->K;
        d->sq = W->scales;
        return KQ8;
    default:
        d->row_bytes = d->K / 2;
        d->s4 = W->scales;
        d->post = W->scale_f;
        return KFP4;
    }
}

/* Scalar dequantization of a partial chunk (K % 16 != 0), zero padded; the
 * same values the vector loaders produce (fp8 carries the 2^-8 of the f16 trick). */
static inline void w_tail(const wd *d, int kind, const uint8_t *row, int64_t n, int64_t i, int rem, float *out) {
    for (int j = 0; j < 16; j++) out[j] = 0.0f;
    for (int j = 0; j < rem; j++) {
        switch (kind) {
        case KF32: out[j] = ((const float *)row)[i + j]; break;
        case KBF16: out[j] = td_bf16_to_f32(((const uint16_t *)row)[i + j]); break;
        case KF16: out[j] = td_f16_to_f32(((const uint16_t *)row)[i + j]); break;
        case KF8: out[j] = fp8_lut[row[i + j]] * (1.0f / 256.0f); break;
        case KF8B: out[j] = (fp8_lut[row[i + j]] * (1.0f / 256.0f)) * (block_scale_val(d, n, i) * 256.0f); break;
        default: break; /* nvfp4, q8: K % 16 == 0 */
        }
    }
}

INL float reduce16(const float *a) {
    float s8[8], s4[4];
    for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* ======================= AVX-512 ======================= */

/* reduce16 of 16 outputs at once, the prefill panels' last step: accumulator
 * j at a + j * stride, its result to y[j] (x d->post for fp8 / nvfp4). The
 * same four halving steps as reduce16 (lanes 8 apart, then 4, 2, 1), each
 * adding the same two values per output, so every result is bit-identical to
 * reduce16's; the shuffles only pack the outputs' partial sums together (2,
 * 4, 8, then 16 outputs per zmm). Measured on the 27B-shaped matrices, one
 * thread, M = 512: the scalar reductions had taken ~12% of a BF16 panel. */
T512 INL void finish16(const wd *d, const int kind, const float *a, int64_t stride, float *y) {
    __m512 v[16], u[8], w[4], z[2];
    for (int j = 0; j < 16; j++) v[j] = _mm512_loadu_ps(a + j * stride);
    for (int j = 0; j < 8; j++) /* [o(2j) lanes 0..7 + 8..15, o(2j+1) the same] */
        u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44), _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xee));
    for (int j = 0; j < 4; j++) /* 4 lanes per output: s8[0..3] + s8[4..7] of o(4j) .. o(4j+3) */
        w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0x88), _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0xdd));
    for (int j = 0; j < 2; j++) /* 2 lanes per output: s4[0] + s4[2], s4[1] + s4[3] */
        z[j] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * j], w[2 * j + 1], 0x44), _mm512_shuffle_ps(w[2 * j], w[2 * j + 1], 0xee));
    /* s2[0] + s2[1]: lanes hold outputs 0 4 8 12 1 5 9 13 2 6 10 14 3 7 11 15 */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xdd));
    r = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
    if (kind == KF8 || kind == KFP4) r = _mm512_mul_ps(r, _mm512_set1_ps(d->post));
    _mm512_storeu_ps(y, r);
}

/* A prefill panel's outputs: rows [n, n+nn) x activation rows [m, m+mm), the
 * accumulator of (r, q) at acc + (r * pm + q) * 16; 16 rows at a time through
 * finish16, the rest one by one with the same reduce16. */
T512 INL void finish_panel512(const wd *d, const int kind, const float *acc, int pm, int m, int mm, int64_t n, int nn, float *y,
                              int64_t ldy) {
    const int n16 = nn & ~15;
    for (int q = 0; q < mm; q++) {
        float *yq = y + (int64_t)(m + q) * ldy + n;
        for (int r = 0; r < n16; r += 16) finish16(d, kind, acc + ((int64_t)r * pm + q) * 16, (int64_t)pm * 16, yq + r);
        for (int r = n16; r < nn; r++) {
            float v = reduce16(acc + ((int64_t)r * pm + q) * 16);
            yq[r] = kind == KF8 || kind == KFP4 ? v * d->post : v;
        }
    }
}

/* Decode and verify with K sliced (kernels_x86.c sliced512 and verify256,
 * kernels_bf16.c slicedbf): weight rows in groups of DG5, K in DK5-element
 * slices, each tile prefetching the row slices DPF5 ahead of its own. */
enum { DG5 = 16, DK5 = 512, DPF5 = 8 };

/* The sliced kernels' tile of t rows at group row r (rows g + r ..): its row
 * pointers, and the row slices it prefetches, pfr slices ahead of its own
 * (later rows of this slice, else the group's rows in the next slice, else the
 * next group's; clamped to n1 - 1). */
static inline void slice_rows(const wd *d, int64_t g, int gn, int r, int t, int64_t k0, int64_t Kfull, int64_t n1, int64_t vk,
                              int pfr, int64_t step, const uint8_t **row, const uint8_t **pf) {
    const int64_t rb = d->row_bytes, ahead = r + (int64_t)pfr;
    int64_t pn = g + ahead % gn, pk = k0 + ahead / gn * vk;
    if (pk >= Kfull) { pn = g + gn + ahead % gn; pk = 0; }
    for (int j = 0; j < t; j++) {
        row[j] = d->data + (g + r + j) * rb;
        const int64_t p = pn + j < n1 ? pn + j : n1 - 1;
        pf[j] = d->data + p * rb + pk / 16 * step;
    }
}

/* e4m3 byte -> f16 bits with the value scaled by 2^-8 (f16 bias 15 vs e4m3 7):
 * sign-extend the byte to 16 bits (bits 15..7 = sign, 6..0 = exponent and
 * mantissa), shift left 7 (sign lands in bit 15, magnitude in 13..7) and
 * clear bit 14, which holds a copy of the sign. Subnormals map to f16
 * subnormals, so every finite code is exact. */
T512 INL __m512 f8x16_512(__m128i b) {
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xbfff));
    return _mm512_cvtph_ps(h);
}

T512 INL __m128i nib16(const uint8_t *p) {
    __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i lo = _mm_and_si128(w, _mm_set1_epi16(0x0f)), hi = _mm_srli_epi16(w, 4);
    return _mm_or_si128(lo, _mm_slli_epi16(hi, 8));
}

T512 INL __m512 w16_512(const wd *d, const int kind, const uint8_t *row, int64_t n, int64_t i) {
    switch (kind) {
    case KF32: return _mm512_loadu_ps((const float *)row + i);
    case KBF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i))), 16));
    case KF16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    case KF8: return f8x16_512(_mm_loadu_si128((const __m128i *)(row + i)));
    case KF8B: return _mm512_mul_ps(f8x16_512(_mm_loadu_si128((const __m128i *)(row + i))), _mm512_set1_ps(block_scale_val(d, n, i) * 256.0f));
    case KQ8:
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i)))),
                             _mm512_set1_ps(td_bf16_to_f32(d->sq[n * (d->K / 32) + i / 32])));
    default: {
        __m512 v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nib16(row + i / 2)), _mm512_loadu_ps(e2m1_lut));
        return _mm512_mul_ps(v, _mm512_set1_ps(fp8_lut[d->s4[n * (d->K / 16) + i / 16]]));
    }
    }
}

#endif /* x86 */
#endif
