/* Which AVX2 instruction mix computes the exact int8 x int8 block sums of
 * --precision int8 fastest (issue 18 item 4: the 5-token verify on AVX2).
 * Weights and activations sit in L1/L2 (16 rows x 4096 bytes; 5 activation
 * rows), so this times the arithmetic alone, one thread.
 *   A  shipped (kernels_int8_tile.h): |x| precomputed; per (chunk, w row, x row)
 *      vpsignb (sign of x onto w) + vpmaddubsw + vpmaddwd(ones) + vpaddd
 *   B  int16: w widened once per chunk (vpmovsxbw), x stored as int16;
 *      per pair 2 x (vpmaddwd + vpaddd)
 *   C  no sign: vpmaddubsw(|x|, w) + vpmaddwd + vpaddd -- the op count of
 *      the offset trick (x + 128 unsigned); NOT exact (vpmaddubsw saturates),
 *      timed only as the bound that trick could reach
 *   D  the sign as (w ^ m) - m with m = (x < 0), m once per (chunk, x row)
 * A, B and D must give the same integers (checked); C is not compared.
 * Build: gcc -O3 -mavx2 -mfma -o int8-ops int8-ops.c */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define K 4096
#define NR 16
static int8_t w[NR][K] __attribute__((aligned(64)));
static int8_t q[5][K] __attribute__((aligned(64))), a[5][K] __attribute__((aligned(64)));
static int16_t x16[5][K] __attribute__((aligned(64)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define INL static inline __attribute__((always_inline))
INL __m256i dot(__m256i acc, __m256i u, __m256i s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))); }
/* V: 0 = A, 2 = C, 3 = D */
INL void tile8(const int V, const int RN, const int RM, int r0, int32_t *out) {
    __m256i acc[4][5];
    for (int r = 0; r < RN; r++) for (int m = 0; m < RM; m++) acc[r][m] = _mm256_setzero_si256();
    for (int o = 0; o < K; o += 32) {
        __m256i wv[4];
        for (int r = 0; r < RN; r++) wv[r] = _mm256_load_si256((const __m256i *)(w[r0 + r] + o));
        for (int m = 0; m < RM; m++) {
            const __m256i qq = _mm256_load_si256((const __m256i *)(q[m] + o)), aa = _mm256_load_si256((const __m256i *)(a[m] + o));
            const __m256i mx = _mm256_cmpgt_epi8(_mm256_setzero_si256(), qq);
            for (int r = 0; r < RN; r++) {
                const __m256i s = V == 0 ? _mm256_sign_epi8(wv[r], qq) : V == 2 ? wv[r] : _mm256_sub_epi8(_mm256_xor_si256(wv[r], mx), mx);
                acc[r][m] = dot(acc[r][m], aa, s);
            }
        }
    }
    for (int r = 0; r < RN; r++) for (int m = 0; m < RM; m++) {
        int32_t l[8]; _mm256_storeu_si256((__m256i *)l, acc[r][m]);
        int32_t t = 0; for (int i = 0; i < 8; i++) t += l[i];
        out[(r0 + r) * 5 + m] = t;
    }
}
INL void tile16(const int RN, const int RM, int r0, int32_t *out) {
    __m256i lo[2][5], hi[2][5];
    for (int r = 0; r < RN; r++) for (int m = 0; m < RM; m++) lo[r][m] = hi[r][m] = _mm256_setzero_si256();
    for (int o = 0; o < K; o += 32) {
        __m256i wv[2];
        for (int r = 0; r < RN; r++) wv[r] = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(w[r0 + r] + o)));
        for (int m = 0; m < RM; m++) {
            const __m256i x = _mm256_load_si256((const __m256i *)(x16[m] + o));
            for (int r = 0; r < RN; r++) lo[r][m] = _mm256_add_epi32(lo[r][m], _mm256_madd_epi16(wv[r], x));
        }
        for (int r = 0; r < RN; r++) wv[r] = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(w[r0 + r] + o + 16)));
        for (int m = 0; m < RM; m++) {
            const __m256i x = _mm256_load_si256((const __m256i *)(x16[m] + o + 16));
            for (int r = 0; r < RN; r++) hi[r][m] = _mm256_add_epi32(hi[r][m], _mm256_madd_epi16(wv[r], x));
        }
    }
    for (int r = 0; r < RN; r++) for (int m = 0; m < RM; m++) {
        int32_t l[8]; _mm256_storeu_si256((__m256i *)l, _mm256_add_epi32(lo[r][m], hi[r][m]));
        int32_t t = 0; for (int i = 0; i < 8; i++) t += l[i];
        out[(r0 + r) * 5 + m] = t;
    }
}
#define PASS(name, RN, call) __attribute__((noinline)) static void name(int32_t *out) { for (int r = 0; r < NR; r += RN) call; }
PASS(a15, 1, tile8(0, 1, 5, r, out)) PASS(b15, 1, tile16(1, 5, r, out)) PASS(c15, 1, tile8(2, 1, 5, r, out)) PASS(d15, 1, tile8(3, 1, 5, r, out))
PASS(a24, 2, tile8(0, 2, 4, r, out)) PASS(b14, 1, tile16(1, 4, r, out)) PASS(c24, 2, tile8(2, 2, 4, r, out)) PASS(d24, 2, tile8(3, 2, 4, r, out))
PASS(a23, 2, tile8(0, 2, 3, r, out)) PASS(b23, 2, tile16(2, 3, r, out)) PASS(c23, 2, tile8(2, 2, 3, r, out)) PASS(d23, 2, tile8(3, 2, 3, r, out))
int main(void) {
    srand(1);
    for (int r = 0; r < NR; r++) for (int k = 0; k < K; k++) w[r][k] = (int8_t)(rand() % 255 - 127);
    for (int m = 0; m < 5; m++) for (int k = 0; k < K; k++) { int v = rand() % 255 - 127; q[m][k] = (int8_t)v; a[m][k] = (int8_t)abs(v); x16[m][k] = (int16_t)v; }
    int32_t ref[NR * 5];
    for (int r = 0; r < NR; r++) for (int m = 0; m < 5; m++) { int32_t t = 0; for (int k = 0; k < K; k++) t += w[r][k] * q[m][k]; ref[r * 5 + m] = t; }
    struct { const char *name; void (*f)(int32_t *); int M, exact; } T[] = {
        {"A 1x5", a15, 5, 1}, {"B 1x5", b15, 5, 1}, {"C 1x5", c15, 5, 0}, {"D 1x5", d15, 5, 1},
        {"A 2x4", a24, 4, 1}, {"B 1x4", b14, 4, 1}, {"C 2x4", c24, 4, 0}, {"D 2x4", d24, 4, 1},
        {"A 2x3", a23, 3, 1}, {"B 2x3", b23, 3, 1}, {"C 2x3", c23, 3, 0}, {"D 2x3", d23, 3, 1}};
    const int n = (int)(sizeof T / sizeof T[0]), reps = 3000;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t out[NR * 5];
        T[i].f(out);
        for (int r = 0; r < NR && T[i].exact; r++) for (int m = 0; m < T[i].M; m++) bad += out[r * 5 + m] != ref[r * 5 + m];
    }
    printf("exactness: %d wrong sums (A, B, D against the scalar reference)\n", bad);
    for (int round = 0; round < 3; round++) {
        printf("round %d (GMAC/s):", round + 1);
        for (int i = 0; i < n; i++) {
            int32_t out[NR * 5];
            const double t0 = now();
            for (int it = 0; it < reps; it++) { T[i].f(out); __asm__ volatile("" ::: "memory"); }
            const double t1 = now();
            printf("  %s %.1f", T[i].name, (double)reps * NR * K * T[i].M / (t1 - t0) / 1e9);
        }
        printf("\n");
    }
    return bad != 0;
}
