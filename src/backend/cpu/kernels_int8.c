/* INT8-activation matmul (`--precision int8`, td_backend.precision) for q8
 * weights (--quantize q8: int8 with a BF16 scale per 32 inputs): W8A8 as
 * llama.cpp's Q8_0 x Q8_0. The activation rows are quantized the same way,
 * once per matmul (td_x_to_q8), and each 32-block's product is summed exactly
 * in integers with the CPU's byte dot-product instructions (AVX2 VPMADDUBSW +
 * VPMADDWD; VPDPBUSD where the CPU has AVX-512 VNNI). What prefill and verify
 * gain on CPUs without BF16 dot products (AVX2-only EPYC guests: issue 18 item 4).
 *
 * Layout: the weights (td_tensor.q8_grouped, made at load) and the quantized
 * activations are stored with each row's blocks in groups of 8
 * (td_q8g_offset): 32 consecutive bytes hold 4 elements of each of 8 blocks,
 * so the byte dot products leave block j's sum in int32 lane j, 8 chunks give
 * the 8 blocks' exact sums, and one convert + multiply + FMA serves 8 blocks
 * (with the row-major blocks each block needed its own: verify and prefill
 * were bound by those float operations, not by the integer products).
 *
 * Arithmetic, the same in every path (C reference, AVX2, VNNI):
 *   activations, per row and 32-block: amax = max |x| (lanes 8 apart, then a
 *   halving tree; max is exact), s = amax / 127, q = round-to-nearest-even of
 *   clamp(x * (127 / amax), -127, 127); a block with amax not > 0 gets s = 0, q = 0.
 *   output y[m,n]: 8 f32 lanes; for each block b in increasing order, lane
 *   j = b % 8 takes acc_j = fma(ws[n,b] * xs[m,b], (float)P_b, acc_j) with P_b
 *   the exact sum of the block's 32 products; then the lanes 4 apart, 2 apart,
 *   1 apart are added (reduce8).
 * So results do not depend on M, the tile, the thread split or the ISA
 * (test_kernels: every ISA bit for bit against the C reference, every M
 * against M = 1). They differ from the f32 path by the activation rounding:
 * at most s/2 per element (test_kernels checks that bound against a double
 * reference); test_demo and test_spec_int8 check the model and lossless
 * drafting. */
#include <math.h>
#include <string.h>
#include "backend/cpu/kernels_x86.h"
#include "model/tensor.h"
#include "util/err.h"

static inline float fmax_x86(float a, float b) { return a > b ? a : b; } /* MAXPS(a, b) */
static inline float fmin_x86(float a, float b) { return a < b ? a : b; } /* MINPS(a, b) */

/* One 32-block: the rule above, in the order the vector code takes. */
static void quant_block_c(const float *x, int8_t *q, int8_t *a, float *s) {
    float l[8];
    for (int j = 0; j < 8; j++) {
        /* max(max(v0, v1), max(v2, v3)) of the four 8-wide vectors */
        float v0 = fabsf(x[j]), v1 = fabsf(x[j + 8]), v2 = fabsf(x[j + 16]), v3 = fabsf(x[j + 24]);
        l[j] = fmax_x86(fmax_x86(v0, v1), fmax_x86(v2, v3));
    }
    float l4[4], l2[2];
    for (int j = 0; j < 4; j++) l4[j] = fmax_x86(l[j], l[j + 4]);
    for (int j = 0; j < 2; j++) l2[j] = fmax_x86(l4[j], l4[j + 2]);
    const float amax = fmax_x86(l2[0], l2[1]);
    if (!(amax > 0.0f)) {
        memset(q, 0, 32);
        memset(a, 0, 32);
        *s = 0.0f;
        return;
    }
    const float id = 127.0f / amax;
    *s = amax / 127.0f;
    for (int j = 0; j < 32; j++) {
        float v = fmin_x86(fmax_x86(x[j] * id, -127.0f), 127.0f);
        int t = (int)nearbyintf(v); /* the default rounding: to nearest, ties to even (CVTPS2DQ) */
        q[j] = (int8_t)t;
        a[j] = (int8_t)(t < 0 ? -t : t);
    }
}

/* One quantized block (q, |q|: 32 bytes each, in order) into row r of the grouped rows xq, xa: its 8
   pieces of 4 bytes at td_q8g_offset. */
static inline void put_block(const int8_t *q, const int8_t *a, int64_t K, int64_t b, int8_t *xq, int8_t *xa) {
    for (int v = 0; v < 8; v++) {
        const int64_t o = td_q8g_offset(b * 32 + 4 * v, K);
        memcpy(xq + o, q + 4 * v, 4);
        memcpy(xa + o, a + 4 * v, 4);
    }
}

static void x_to_q8_c(const float *x, int M, int64_t K, int8_t *xq, int8_t *xa, float *xs) {
    const int64_t nb = K / 32;
    int8_t q[32], a[32];
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            quant_block_c(x + m * K + b * 32, q, a, xs + m * nb + b);
            put_block(q, a, K, b, xq + m * K, xa + m * K);
        }
}

static void mm_i8_c(const td_tensor *W, const int8_t *xq, const float *xs, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    const int64_t K = W->shape[1], nb = K / 32;
    const int8_t *wq = W->data;
    const uint16_t *ws = W->scales;
    for (int64_t m = m0; m < m1; m++)
        for (int64_t n = n0; n < n1; n++) {
            float acc[8] = {0};
            const int8_t *xr = xq + m * K, *wr = wq + n * K; /* both grouped: the same offsets */
            for (int64_t b = 0; b < nb; b++) {
                int32_t p = 0;
                for (int i = 0; i < 32; i++) {
                    const int64_t o = td_q8g_offset(b * 32 + i, K);
                    p += (int32_t)xr[o] * (int32_t)wr[o];
                }
                acc[b % 8] = fmaf(td_bf16_to_f32(ws[n * nb + b]) * xs[m * nb + b], (float)p, acc[b % 8]);
            }
            float s4[4], s2[2];
            for (int j = 0; j < 4; j++) s4[j] = acc[j] + acc[j + 4];
            for (int j = 0; j < 2; j++) s2[j] = s4[j] + s4[j + 2];
            y[m * ldy + n] = s2[0] + s2[1];
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The row pointers of activation rows mc .. mc + rm - 1 (rm <= 5) for a tile: quantized, |q|, scales, outputs. */
static inline void i8_rows(const int8_t *xq, const int8_t *xa, const float *xs, float *y, int64_t K, int64_t ldy, int mc, int rm,
                           const int8_t **q, const int8_t **a, const float **s, float **yr) {
    for (int i = 0; i < rm; i++) {
        q[i] = xq + (int64_t)(mc + i) * K;
        a[i] = xa + (int64_t)(mc + i) * K;
        s[i] = xs + (int64_t)(mc + i) * (K / 32);
        yr[i] = y + (int64_t)(mc + i) * ldy;
    }
}

/* How many tiles of rn weight rows ahead the tiles prefetch: at least I8_PF_BYTES of the stream ahead */
#ifndef I8_PF_BYTES
#define I8_PF_BYTES 4096
#endif
static inline int64_t i8_tiles_ahead(int rn, int64_t K) {
    const int64_t t = (I8_PF_BYTES + rn * K - 1) / (rn * K);
    return t < 1 ? 1 : t;
}

/* decode: one zmm pair (2 weight rows) per tile; two pairs decoded 2-11% slower (3 alternating rounds:
   39.6 / 47.2 / 46.0 against 38.8 / 42.4 / 42.4 tokens/s) */
#ifndef I8Z_RP_DECODE
#define I8Z_RP_DECODE 1
#endif
#define TVNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni")))

/* No CPUID here (a VM exit in a guest): this runs once per matmul. The caller's
   ISA being AVX-512 says the rest. */
bool td_kernels_have_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* 8 q8 block scales (BF16) from p as floats, exactly (the F32 bits are the BF16 bits << 16); the _part
   form reads only gs < 8 of them (the row's last group; the rest 0, as a masked load gives). */
__attribute__((target("avx2"))) INL __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), 16));
}
__attribute__((target("avx2"))) INL __m256 bf16x8_part(const uint16_t *p, int gs) {
    uint16_t t[8] = {0};
    memcpy(t, p, (size_t)gs * sizeof *p);
    return bf16x8(t);
}

/* The sum of v's 8 lanes in a fixed order: lanes 4 apart, then 2, then 1 (every tile's last step, so
   every tile shape gives the same bits). Target avx2 alone: each caller's target (ymm, VNNI, zmm tiles)
   includes it. */
__attribute__((target("avx2"))) INL float reduce8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

T256 static void x_to_q8_avx2(const float *x, int M, int64_t K, int8_t *xq, int8_t *xa, float *xs) {
    const int64_t nb = K / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + m * K + b * 32;
            int8_t q[32], a[32];
            __m256 v[4];
            for (int t = 0; t < 4; t++) v[t] = _mm256_loadu_ps(xb + 8 * t);
            __m256 l = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                     _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            if (!(amax > 0.0f)) {
                memset(q, 0, 32);
                memset(a, 0, 32);
                xs[m * nb + b] = 0.0f;
                put_block(q, a, K, b, xq + m * K, xa + m * K);
                continue;
            }
            const __m256 id = _mm256_set1_ps(127.0f / amax);
            xs[m * nb + b] = amax / 127.0f;
            __m256i i[4];
            for (int t = 0; t < 4; t++) i[t] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[t], id), lo), hi));
            /* packs interleave the 128-bit halves: 4-element groups come out 0 2 4 6 1 3 5 7 */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
            p = _mm256_permutevar8x32_epi32(p, order);
            _mm256_storeu_si256((__m256i *)q, p);
            _mm256_storeu_si256((__m256i *)a, _mm256_abs_epi8(p));
            put_block(q, a, K, b, xq + m * K, xa + m * K);
        }
}

#define I8T T256
#define I8N(x) x##_avx2
#define I8_DOTACC(acc, a, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((a), (s)), _mm256_set1_epi16(1)))
#include "backend/cpu/kernels_int8_tile.h"
#undef I8T
#undef I8N
#undef I8_DOTACC

#define I8T TVNNI
#define I8N(x) x##_vnni
#define I8_DOTACC(acc, a, s) _mm256_dpbusd_epi32((acc), (a), (s))
#include "backend/cpu/kernels_int8_tile.h"
#undef I8T
#undef I8N
#undef I8_DOTACC

/* AVX-512 VNNI with zmm: two weight rows per register (lanes 0..7 row n, 8..15 row n + 1; the chunk of x
 * broadcast into both halves), so each instruction works for two outputs. No VPSIGNB in AVX-512: x goes
 * in unsigned, x + 128 (= q ^ 0x80), and -128 * (each block's weight sum), which one VPDPBUSD of 128s per
 * weight chunk pair gives, is taken off the group's sums: the same exact integers P, then the same
 * cvt / scale product / FMA per lane as the ymm tiles, so the same bits (test_kernels). */
#define TZ __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* Two rows' chunks (or scales) at p and p + stride in one zmm; masked: lanes >= gs are 0. */
TZ INL __m512i pair_i32(const bool masked, __mmask8 k, const int8_t *p, int64_t stride) {
    if (masked)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi32(k, p)), _mm256_maskz_loadu_epi32(k, p + stride), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)), _mm256_loadu_si256((const __m256i *)(p + stride)), 1);
}

TZ INL void groupz(const int RP, const int RM, const bool masked, const int8_t *w, const uint16_t *ws, int64_t K, int64_t b0, int gs,
                   const int8_t *const *xq, const float *const *xs, __m512 (*acc)[5]) {
    const int64_t nb = K / 32, cs = masked ? 4 * gs : 32;
    const __mmask8 k = (__mmask8)((1u << gs) - 1);
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    __m512i ia[2][5], nc[2];
    for (int p = 0; p < RP; p++) {
        nc[p] = _mm512_setzero_si512();
        for (int m = 0; m < RM; m++) ia[p][m] = _mm512_setzero_si512();
    }
    if (!masked) { /* rows ahead, as the ymm tiles */
        const int64_t ahead = 2 * RP * i8_tiles_ahead(2 * RP, K);
        for (int r = 0; r < 2 * RP; r++)
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(w + (ahead + r) * K + 32 * b0 + 64 * l), _MM_HINT_T0);
        if ((b0 & 31) == 0) /* 32 BF16 scales per line */
            for (int r = 0; r < 2 * RP; r++) _mm_prefetch((const char *)(ws + (ahead + r) * nb + b0), _MM_HINT_T0);
    }
    for (int v = 0; v < 8; v++) {
        const int64_t off = 32 * b0 + cs * v;
        __m512i wv[2];
        for (int p = 0; p < RP; p++) {
            wv[p] = pair_i32(masked, k, w + (2 * p) * K + off, K);
            nc[p] = _mm512_dpbusd_epi32(nc[p], c128, wv[p]);
        }
        for (int m = 0; m < RM; m++) {
            const __m256i q = masked ? _mm256_maskz_loadu_epi32(k, xq[m] + off) : _mm256_loadu_si256((const __m256i *)(xq[m] + off));
            const __m512i xu = _mm512_xor_si512(_mm512_broadcast_i64x4(q), c128);
            for (int p = 0; p < RP; p++) ia[p][m] = _mm512_dpbusd_epi32(ia[p][m], xu, wv[p]);
        }
    }
    for (int p = 0; p < RP; p++) {
        const uint16_t *s0 = ws + (2 * p) * nb + b0; /* two rows' 8 BF16 scales, widened exactly */
        const __m256i sb = masked ? _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_maskz_loadu_epi16(k, s0)), _mm_maskz_loadu_epi16(k, s0 + nb), 1)
                                  : _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)s0)),
                                                            _mm_loadu_si128((const __m128i *)(const void *)(s0 + nb)), 1);
        const __m512 dw = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(sb), 16));
        for (int m = 0; m < RM; m++) {
            const __m512 dx = _mm512_broadcast_f32x8(masked ? _mm256_maskz_loadu_ps(k, xs[m] + b0) : _mm256_loadu_ps(xs[m] + b0));
            acc[p][m] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(_mm512_sub_epi32(ia[p][m], nc[p])), acc[p][m]);
        }
    }
}

TZ INL void tilez(const int RP, const int RM, const int8_t *w, const uint16_t *ws, int64_t K, const int8_t *const *xq,
                  const float *const *xs, float *const *y, int64_t n) {
    const int64_t nb = K / 32, full = nb & ~(int64_t)7;
    __m512 acc[2][5];
    for (int p = 0; p < RP; p++)
        for (int m = 0; m < RM; m++) acc[p][m] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < full; b0 += 8) groupz(RP, RM, false, w, ws, K, b0, 8, xq, xs, acc);
    if (full < nb) groupz(RP, RM, true, w, ws, K, full, (int)(nb - full), xq, xs, acc);
    for (int p = 0; p < RP; p++)
        for (int m = 0; m < RM; m++)
            for (int h = 0; h < 2; h++) /* reduce8 of each half, as the ymm tiles */
                y[m][n + 2 * p + h] = reduce8(h ? _mm512_extractf32x8_ps(acc[p][m], 1) : _mm512_castps512_ps256(acc[p][m]));
}

/* Weight rows in tiles of 4 (two zmm pairs) against up to 5 activation rows (verify 4 x M, prefill 4 x 4
 * chunks; decode 2 x 1); the last rows of a task through the ymm VNNI tiles. */
TZ static void mm_vnni512(const td_tensor *W, const int8_t *xq, const int8_t *xa, const float *xs, int m0, int m1, int64_t n0, int64_t n1,
                          float *y, int64_t ldy) {
    const int64_t K = W->shape[1], nb = K / 32;
    const int8_t *wq = W->data;
    const uint16_t *wsc = W->scales;
    const int M = m1 - m0, RMX = M <= 5 ? M : 4, RP = M == 1 ? I8Z_RP_DECODE : 2;
    int64_t n = n0;
    for (; n + 2 * RP <= n1; n += 2 * RP)
        for (int mc = m0; mc < m1; mc += RMX) {
            const int rm = m1 - mc >= RMX ? RMX : m1 - mc;
            const int8_t *q[5], *a[5];
            const float *s[5];
            float *yr[5];
            i8_rows(xq, xa, xs, y, K, ldy, mc, rm, q, a, s, yr);
            if (RP == 1) tilez(1, 1, wq + n * K, wsc + n * nb, K, q, s, yr, n);
            else switch (rm) {
            case 1: tilez(2, 1, wq + n * K, wsc + n * nb, K, q, s, yr, n); break;
            case 2: tilez(2, 2, wq + n * K, wsc + n * nb, K, q, s, yr, n); break;
            case 3: tilez(2, 3, wq + n * K, wsc + n * nb, K, q, s, yr, n); break;
            case 4: tilez(2, 4, wq + n * K, wsc + n * nb, K, q, s, yr, n); break;
            default: tilez(2, 5, wq + n * K, wsc + n * nb, K, q, s, yr, n); break;
            }
        }
    if (n < n1) mm_vnni(W, xq, xa, xs, m0, m1, n, n1, y, ldy);
}
#else
bool td_kernels_have_vnni(void) { return false; }
#endif

void td_x_to_q8(td_isa isa, const float *x, int M, int64_t K, int8_t *xq, int8_t *xa, float *xs) {
    TD_ASSERT(K % 32 == 0 && "x_to_q8: K a multiple of 32");
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == TD_ISA_AVX2 || isa == TD_ISA_AVX512) {
        x_to_q8_avx2(x, M, K, xq, xa, xs);
        return;
    }
#endif
    (void)isa;
    x_to_q8_c(x, M, K, xq, xa, xs);
}

void td_matmul_block_i8(td_isa isa, const td_tensor *W, const int8_t *xq, const int8_t *xa, const float *xs, int m0, int m1, int64_t n0,
                        int64_t n1, float *y, int64_t ldy) {
    TD_ASSERT(W->dtype == TD_DTYPE_Q8 && W->q8_grouped && W->shape[1] % 32 == 0 && "matmul_i8: grouped q8 weights");
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == TD_ISA_AVX512 && td_kernels_have_vnni()) {
        mm_vnni512(W, xq, xa, xs, m0, m1, n0, n1, y, ldy);
        return;
    }
    if (isa == TD_ISA_AVX2 || isa == TD_ISA_AVX512) {
        mm_avx2(W, xq, xa, xs, m0, m1, n0, n1, y, ldy);
        return;
    }
#endif
    (void)xa;
    mm_i8_c(W, xq, xs, m0, m1, n0, n1, y, ldy);
}
