/* The int8 x int8 tiles of kernels_int8.c, included once per instruction set:
 * the includer defines I8T (target attribute), I8N(name) (a suffixed name)
 * and I8_DOT(a, s) (the 8 int32 lanes sum(a[4j..4j+3] * s[4j..4j+3]) of an
 * unsigned-by-signed byte product: VPMADDUBSW + VPMADDWD on AVX2, VPDPBUSD
 * where the CPU has VNNI; both exact, so the same integers).
 *
 * Tile: RN weight rows x RM activation rows over the whole K. Per 32-block b
 * and output (n, m): the block's exact integer lanes p (above, with the sign
 * of x moved onto w: |x| * (w * sign x) = x * w), converted to float, and
 * acc = fma(ws[n,b] * xs[m,b], p, acc): the arithmetic of mm_i8_c, lane
 * by lane, so every tile shape and M gives the C reference's bits. */

/* Tile shapes by M, measured with AVX2 forced on the EPYC Zen 5 (bench/results/int8-avx2-2026-12-07.md):
   on the 27B-proportioned q8 model (2 threads), 2 x M tiles for M = 2..5 against 1 x M for M = 3..5: a 3-row verify
   30 against 35 ms, a 5-row one 43 against 47-50 ms; prefill 4 x 3 tiles: 146-154 against 134-135 tokens/s with
   2 x 4 (prefill-512, 3 alternating rounds; one thread on 256 x 2048 x 64: 4 x 2, 4 x 3, 2 x 3 0.52-0.54 ms, 2 x 4
   0.56-0.57, 2 x 5 0.58-0.61; 1 x 4 and 1 x 5 ran 0.96x the f32 path). Tried and dropped: the scale products of
   8 blocks in one vector multiply, broadcast from the stack (no faster; 2 rows 25% slower). */
/* decode (M = 1): 2 weight rows per tile; 4 rows decoded 3-10% slower (AVX2 forced, 6 alternating rounds:
   2 rows 39.9-46.3 tokens/s, 4 rows 37.6-40.0; 1 row 40.4-41.4) */
#ifndef I8_RN_DECODE
#define I8_RN_DECODE 2
#endif
#ifndef I8_RN2_MAX
#define I8_RN2_MAX 5
#define I8_RN_PREFILL 4
#define I8_RM_PREFILL 3
#endif

I8T INL void I8N(tile)(const int RN, const int RM, const int8_t *w, const float *ws, int64_t K, const int8_t *const *xq,
                       const int8_t *const *xa, const float *const *xs, float *const *y, int64_t n) {
    const int64_t nb = K / 32;
    __m256 acc[4][5];
    for (int r = 0; r < RN; r++)
        for (int m = 0; m < RM; m++) acc[r][m] = _mm256_setzero_ps();
    /* Prefetch the next tile's rows (and their scales) at the same offset, as kernels_x86.c's
       tile256: the hardware prefetchers alone leave too few lines in flight for a few short rows */
    for (int64_t b = 0; b < nb; b++) {
        __m256i wv[4];
        __m256 dw[4];
        if ((b & 1) == 0)
            for (int r = 0; r < RN; r++) _mm_prefetch((const char *)(w + (RN + r) * K + b * 32), _MM_HINT_T0);
        if ((b & 15) == 0)
            for (int r = 0; r < RN; r++) _mm_prefetch((const char *)(ws + (RN + r) * nb + b), _MM_HINT_T0);
        for (int r = 0; r < RN; r++) {
            wv[r] = _mm256_loadu_si256((const __m256i *)(w + r * K + b * 32));
            dw[r] = _mm256_broadcast_ss(ws + r * nb + b);
        }
        for (int m = 0; m < RM; m++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(xq[m] + b * 32));
            const __m256i a = _mm256_loadu_si256((const __m256i *)(xa[m] + b * 32));
            const __m256 dx = _mm256_broadcast_ss(xs[m] + b);
            for (int r = 0; r < RN; r++) {
                const __m256i p = I8_DOT(a, _mm256_sign_epi8(wv[r], q));
                acc[r][m] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), _mm256_cvtepi32_ps(p), acc[r][m]);
            }
        }
    }
    for (int r = 0; r < RN; r++)
        for (int m = 0; m < RM; m++) { /* reduce8: lanes 4 apart, then 2, then 1 */
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r][m]), _mm256_extractf128_ps(acc[r][m], 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h = _mm_add_ss(h, _mm_movehdup_ps(h));
            y[m][n + r] = _mm_cvtss_f32(h);
        }
}

/* Rows [n0, n1) x [m0, m1) of y: weight rows in tiles of 2 for one activation
 * row (decode), of 2 against 2..5 activation rows
 * (verify: one tile, each weight chunk loaded once for all), and of 4 against
 * 3-row chunks in prefill (4 weight rows x K stay in L1 while the chunks of the
 * row block stream past). */
I8T static void I8N(mm)(const td_tensor *W, const int8_t *xq, const int8_t *xa, const float *xs, int m0, int m1, int64_t n0, int64_t n1,
                        float *y, int64_t ldy) {
    const int64_t K = W->shape[1], nb = K / 32;
    const int8_t *wq = W->data;
    const float *wsc = W->scales;
    const int M = m1 - m0, RN = M == 1 ? I8_RN_DECODE : M <= I8_RN2_MAX ? 2 : M <= 5 ? 1 : I8_RN_PREFILL;
    const int RMX = M <= 5 ? M : I8_RM_PREFILL;
    for (int64_t n = n0; n < n1;) {
        const int rn = n1 - n >= RN ? RN : 1; /* the last rows go one at a time */
        for (int mc = m0; mc < m1; mc += RMX) {
            const int rm = m1 - mc >= RMX ? RMX : m1 - mc;
            const int8_t *q[5], *a[5];
            const float *s[5];
            float *yr[5];
            i8_rows(xq, xa, xs, y, K, ldy, mc, rm, q, a, s, yr);
            const int8_t *wr = wq + n * K;
            const float *sr = wsc + n * nb;
            if (rn == RN) {
#define I8CASE(R, M_)                                                                                                                \
    case M_: I8N(tile)(R, M_, wr, sr, K, q, a, s, yr, n); break;
                if (RN == 4)
                    switch (rm) { I8CASE(4, 1) I8CASE(4, 2) I8CASE(4, 3) default: break; }
                else if (RN == 2)
                    switch (rm) { I8CASE(2, 1) I8CASE(2, 2) I8CASE(2, 3) I8CASE(2, 4) I8CASE(2, 5) }
                else
                    switch (rm) { I8CASE(1, 1) I8CASE(1, 2) I8CASE(1, 3) I8CASE(1, 4) I8CASE(1, 5) }
            } else {
                switch (rm) { I8CASE(1, 1) I8CASE(1, 2) I8CASE(1, 3) I8CASE(1, 4) I8CASE(1, 5) }
#undef I8CASE
            }
        }
        n += rn;
    }
}
