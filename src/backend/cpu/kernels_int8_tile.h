/* The int8 x int8 tiles of kernels_int8.c, included once per instruction set:
 * the includer defines I8T (target attribute), I8N(name) (a suffixed name)
 * and I8_DOTACC(acc, a, s) (acc + the 8 int32 lanes sum(a[4j..4j+3] * s[4j..4j+3])
 * of an unsigned-by-signed byte product: VPMADDUBSW + VPMADDWD + VPADDD on AVX2,
 * VPDPBUSD where the CPU has VNNI; both exact, so the same integers).
 *
 * Tile: RN weight rows x RM activation rows over the whole K, in groups of 8
 * blocks (td_q8g_offset: chunk v of a group holds elements 4v..4v+3 of each of
 * its blocks, block j in lane j). Per group and output (n, m): the 8 chunks'
 * byte products summed in int32 lanes (with the sign of x moved onto w:
 * |x| * (w * sign x) = x * w), so lane j ends with block j's exact sum P; then
 * acc = fma(ws[n, 8 blocks] * xs[m, 8 blocks], (float)P, acc): the arithmetic
 * of mm_i8_c, lane by lane, so every tile shape and M gives the C reference's
 * bits. The last group of a row whose blocks are not a multiple of 8 loads its
 * chunks of 4 * gs bytes masked (lanes >= gs read as 0, scales too: their FMA
 * adds 0 * 0, which leaves acc as it is, and acc is never -0). */

/* Tile shapes by M (AVX2 forced on the EPYC Zen 5, one thread, weights in L2, 256 x 4096 x M, GMAC/s):
   grouped tiles 1 x 5 92, 2 x 5 75 (accumulators spill past 16 ymm), 2 x 4 95, 1 x 4 78, 2 x 3 97, 1 x 3 77,
   4 x 2 92, 2 x 2 70, 4 x 1 81, 2 x 1 77; the per-block tiles they replaced ran 57-66. In the model
   (27B-proportioned, q8, 2 threads, alternating rounds, medians): decode with 4 and with 2 rows per tile
   37.8 tokens/s each (5 rounds); M = 4 as 4 x 2 chunks and M = 5 as 2 x 3 + 2 x 2 chunks were no faster
   than 2 x 4 and 1 x 5 (5-token verify 46.8 ms against 40.3, 6 rounds). */
#ifndef I8_RN_DECODE
#define I8_RN_DECODE 4
#endif
#ifndef I8_RN_PREFILL
#define I8_RN_PREFILL 2
#define I8_RM_PREFILL 3
#endif
#ifndef I8_RN_M4
#define I8_RN_M4 2
#define I8_RM_M4 4
#endif
#ifndef I8_RN_M5
#define I8_RN_M5 1
#define I8_RM_M5 5
#endif

/* One group of tile(): blocks b0 .. b0 + gs - 1; masked: gs < 8 (a constant at each call, so the full
   groups carry no masks). */
I8T INL void I8N(group)(const int RN, const int RM, const bool masked, const int8_t *w, const uint16_t *ws, int64_t K, int64_t b0,
                        int gs, const int8_t *const *xq, const int8_t *const *xa, const float *const *xs, __m256 (*acc)[5]) {
    const int64_t nb = K / 32, cs = masked ? 4 * gs : 32;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(gs), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i ia[4][5];
    for (int r = 0; r < RN; r++)
        for (int m = 0; m < RM; m++) ia[r][m] = _mm256_setzero_si256();
    /* Prefetch the next tile's rows (and their scales) at the same offset, as kernels_x86.c's
       tile256: the hardware prefetchers alone leave too few lines in flight for a few short rows */
    if (!masked) {
        const int64_t ahead = RN * i8_tiles_ahead(RN, K);
        for (int r = 0; r < RN; r++)
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(w + (ahead + r) * K + 32 * b0 + 64 * l), _MM_HINT_T0);
        if ((b0 & 31) == 0) /* 32 BF16 scales per line */
            for (int r = 0; r < RN; r++) _mm_prefetch((const char *)(ws + (ahead + r) * nb + b0), _MM_HINT_T0);
    }
    for (int v = 0; v < 8; v++) {
        const int64_t off = 32 * b0 + cs * v;
        __m256i wv[4];
        for (int r = 0; r < RN; r++)
            wv[r] = masked ? _mm256_maskload_epi32((const int *)(const void *)(w + r * K + off), mask)
                           : _mm256_loadu_si256((const __m256i *)(w + r * K + off));
        for (int m = 0; m < RM; m++) {
            const __m256i q = masked ? _mm256_maskload_epi32((const int *)(const void *)(xq[m] + off), mask)
                                     : _mm256_loadu_si256((const __m256i *)(xq[m] + off));
            const __m256i a = masked ? _mm256_maskload_epi32((const int *)(const void *)(xa[m] + off), mask)
                                     : _mm256_loadu_si256((const __m256i *)(xa[m] + off));
            for (int r = 0; r < RN; r++) ia[r][m] = I8_DOTACC(ia[r][m], a, _mm256_sign_epi8(wv[r], q));
        }
    }
    for (int r = 0; r < RN; r++) {
        const __m256 dw = masked ? bf16x8_part(ws + r * nb + b0, gs) : bf16x8(ws + r * nb + b0);
        for (int m = 0; m < RM; m++) {
            const __m256 dx = masked ? _mm256_maskload_ps(xs[m] + b0, mask) : _mm256_loadu_ps(xs[m] + b0);
            acc[r][m] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(ia[r][m]), acc[r][m]);
        }
    }
}

I8T INL void I8N(tile)(const int RN, const int RM, const int8_t *w, const uint16_t *ws, int64_t K, const int8_t *const *xq,
                       const int8_t *const *xa, const float *const *xs, float *const *y, int64_t n) {
    const int64_t nb = K / 32, full = nb & ~(int64_t)7;
    __m256 acc[4][5];
    for (int r = 0; r < RN; r++)
        for (int m = 0; m < RM; m++) acc[r][m] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < full; b0 += 8) I8N(group)(RN, RM, false, w, ws, K, b0, 8, xq, xa, xs, acc);
    if (full < nb) I8N(group)(RN, RM, true, w, ws, K, full, (int)(nb - full), xq, xa, xs, acc);
    for (int r = 0; r < RN; r++)
        for (int m = 0; m < RM; m++) y[m][n + r] = reduce8(acc[r][m]);
}

/* K segments for 5-row verify: the 1 x 5 tile reads its activation rows (q and |q|: 10 x K bytes) once
 * per weight row, and past L1 they come from L2 each time. Where they pass I8_SEG_BYTES, blocks of up to
 * 64 weight rows go over K in segments of whole groups whose activation bytes stay under it, the
 * accumulators kept in buf between segments; every weight byte is still read once. Measured in one
 * process, the two builds interleaved (16 reps, medians, 2 threads, AVX2 forced on the Zen 5 guest,
 * weights streaming from memory, int8; bench/results/int8-kseg-2026-12-08.md): the 27B's own shapes,
 * 6 x [5120 x 17408] and 6 x [17408 x 5120], 5 rows took 0.81-0.87x and 0.79-0.83x the time (an A/A
 * pair 0.99-1.00); 4 rows (2 x 4 tiles) segmented too took 0.97-1.08x, so M = 4 is left whole. */
#ifndef I8_SEG_BYTES
#define I8_SEG_BYTES 32768
#endif
#define I8_SEG_ROWS 64

/* A 1 x 5 tile at row n over groups [g0, g1) of ng: the accumulators start at 0 (g0 = 0) or from buf
   ([5][8] floats, this row's earlier segment), and go back to buf or, after the last group, are reduced
   into y as in tile(). Loaded and stored whole, so each lane sees the same FMAs in the same order: the
   same bits as tile(). */
I8T INL void I8N(tile_seg5)(const int8_t *w, const uint16_t *ws, int64_t K, int64_t g0, int64_t g1, int64_t ng, float *buf,
                            const int8_t *const *xq, const int8_t *const *xa, const float *const *xs, float *const *y, int64_t n) {
    const int64_t nb = K / 32, full = nb & ~(int64_t)7, ge = g1 < full / 8 ? g1 : full / 8;
    __m256 acc[1][5];
    for (int m = 0; m < 5; m++) acc[0][m] = g0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(buf + m * 8);
    for (int64_t b0 = 8 * g0; b0 < 8 * ge; b0 += 8) I8N(group)(1, 5, false, w, ws, K, b0, 8, xq, xa, xs, acc);
    if (g1 > full / 8) I8N(group)(1, 5, true, w, ws, K, full, (int)(nb - full), xq, xa, xs, acc); /* the tail group */
    if (g1 < ng) {
        for (int m = 0; m < 5; m++) _mm256_store_ps(buf + m * 8, acc[0][m]);
        return;
    }
    for (int m = 0; m < 5; m++) y[m][n] = reduce8(acc[0][m]);
}

/* Rows [n0, n1) x activation rows m0 .. m0 + 4 in 1 x 5 tiles, K in segments of whole groups (as evenly as
   they go) whose activation bytes stay under I8_SEG_BYTES, per block of up to I8_SEG_ROWS weight rows. */
I8T __attribute__((noinline)) static void I8N(mm_seg5)(const td_tensor *W, const int8_t *xq, const int8_t *xa, const float *xs, int m0, int64_t n0, int64_t n1,
                             float *y, int64_t ldy) {
    const int64_t K = W->shape[1], nb = K / 32, ng = (nb + 7) / 8;
    const int8_t *wq = W->data;
    const uint16_t *wsc = W->scales;
    int64_t most = I8_SEG_BYTES / (2 * 5 * 256);
    if (most < 1) most = 1;
    const int64_t nseg = (ng + most - 1) / most, gps = (ng + nseg - 1) / nseg;
    const int8_t *q[5], *a[5];
    const float *s[5];
    float *yr[5];
    i8_rows(xq, xa, xs, y, K, ldy, m0, 5, q, a, s, yr);
    _Alignas(32) float buf[I8_SEG_ROWS * 5 * 8];
    for (int64_t nblk = n0; nblk < n1; nblk += I8_SEG_ROWS) {
        const int64_t nend = n1 - nblk > I8_SEG_ROWS ? nblk + I8_SEG_ROWS : n1;
        for (int64_t g0 = 0; g0 < ng; g0 += gps) {
            const int64_t g1 = ng - g0 > gps ? g0 + gps : ng;
            for (int64_t n = nblk; n < nend; n++)
                I8N(tile_seg5)(wq + n * K, wsc + n * nb, K, g0, g1, ng, buf + (n - nblk) * 5 * 8, q, a, s, yr, n);
        }
    }
}

/* Rows [n0, n1) x [m0, m1) of y: weight rows in tiles of RN against the
 * activation rows (decode 4 x 1, verify 4 x 2, 2 x 3, 2 x 4, 1 x 5: each
 * weight chunk loaded once for all of them), and of 2 against 3-row chunks in
 * prefill (2 weight rows x K stay in L1 while the chunks of the row block
 * stream past). */
I8T static void I8N(mm)(const td_tensor *W, const int8_t *xq, const int8_t *xa, const float *xs, int m0, int m1, int64_t n0, int64_t n1,
                        float *y, int64_t ldy) {
    const int64_t K = W->shape[1], nb = K / 32;
    const int8_t *wq = W->data;
    const uint16_t *wsc = W->scales;
    const int M = m1 - m0;
    const int RN = M == 1 ? I8_RN_DECODE : M == 2 ? 4 : M == 3 ? 2 : M == 4 ? I8_RN_M4 : M == 5 ? I8_RN_M5 : I8_RN_PREFILL;
    const int RMX = M <= 3 ? M : M == 4 ? I8_RM_M4 : M == 5 ? I8_RM_M5 : I8_RM_PREFILL;
    if (M == 5 && RMX == 5 && I8_RN_M5 == 1 && 2 * 5 * K > I8_SEG_BYTES) {
        I8N(mm_seg5)(W, xq, xa, xs, m0, n0, n1, y, ldy);
        return;
    }
    for (int64_t n = n0; n < n1;) {
        const int rn = n1 - n >= RN ? RN : 1; /* the last rows go one at a time */
        for (int mc = m0; mc < m1; mc += RMX) {
            const int rm = m1 - mc >= RMX ? RMX : m1 - mc;
            const int8_t *q[5], *a[5];
            const float *s[5];
            float *yr[5];
            i8_rows(xq, xa, xs, y, K, ldy, mc, rm, q, a, s, yr);
            const int8_t *wr = wq + n * K;
            const uint16_t *sr = wsc + n * nb;
#define I8CASE(R, M_)                                                                                                                \
    case M_: I8N(tile)(R, M_, wr, sr, K, q, a, s, yr, n); break;
            if (rn == 1) switch (rm) { I8CASE(1, 1) I8CASE(1, 2) I8CASE(1, 3) I8CASE(1, 4) I8CASE(1, 5) }
            else if (RN == 4) switch (rm) { I8CASE(4, 1) I8CASE(4, 2) I8CASE(4, 3) default: break; }
            else switch (rm) { I8CASE(2, 1) I8CASE(2, 2) I8CASE(2, 3) I8CASE(2, 4) I8CASE(2, 5) }
#undef I8CASE
        }
        n += rn;
    }
}
