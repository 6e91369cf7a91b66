/* A/B of an AVX2 or AVX-512 kernel variant against the built library, in one
 * process: A = td_mm_avx2 (td_mm_avx512 with KAB_ISA=avx512) from
 * build/libtandem.a, B = td_mm_avx2_B (td_mm_avx512_B) from a variant of
 * src/backend/cpu/kernels_x86.c compiled by bench/kernel_ab.sh (its entry
 * points renamed with objcopy). Weights: BF16 [262144 x 2048] = 1 GiB (with
 * KAB_DTYPE=q8: int8 of the same shape, 512 MiB, + BF16 scales per 32) in
 * MADV_HUGEPAGE memory (as the engine's copied weights), streaming from
 * memory as a decode step does; 2 threads in 16-row tasks (static halves).
 * Each repetition times M = 1 and M = 5 for A and B, the order of A and B
 * swapped every repetition, so drift on a shared host hits both alike.
 * Prints whether the outputs (M = 1 and M = 5) are bit-identical and the medians.
 *   usage: [KAB_ISA=avx2|avx512] [KAB_DTYPE=bf16|q8] [KAB_TUNE=default|amd] kernel_ab [REPS, 1..64; default 15]
 * (KAB_TUNE: the td_tune both A and B run with; default this CPU's)
 * Checked against itself (B = the unchanged kernels_x86.c): B/A 1.000. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "backend/cpu/kernels.h"
#include "model/tensor.h"

void td_mm_avx2_B(td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy);
void td_mm_avx512_B(td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy);
typedef void (*mm_fn)(td_tune, const td_tensor *, const float *, int, int, int64_t, int64_t, float *, int64_t);

typedef struct {
    mm_fn f;
    td_tune tune;
    const td_tensor *W;
    const float *x;
    float *y;
    int M, half;
} part;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void *run_half(void *arg) {
    const part *p = arg;
    const int64_t N = p->W->shape[0], n0 = p->half * N / 2, n1 = (p->half + 1) * N / 2;
    for (int64_t n = n0; n < n1; n += 16) p->f(p->tune, p->W, p->x, 0, p->M, n, n + 16 < n1 ? n + 16 : n1, p->y, N);
    return NULL;
}

static double timed(mm_fn f, td_tune tune, const td_tensor *W, const float *x, float *y, int M) {
    pthread_t th[2];
    part p[2] = {{f, tune, W, x, y, M, 0}, {f, tune, W, x, y, M, 1}};
    double t0 = now();
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run_half, &p[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    return now() - t0;
}

static int cmp_double(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const int64_t N = 262144, K = 2048;
    if (reps < 1 || reps > 64) { fprintf(stderr, "usage: kernel_ab [REPS, 1..64]\n"); return 2; }
    const char *isa_s = getenv("KAB_ISA"), *dt_s = getenv("KAB_DTYPE"), *tune_s = getenv("KAB_TUNE");
    const td_tune tune = !tune_s ? td_kernels_best_tune() : !strcmp(tune_s, "amd") ? TD_TUNE_AMD : TD_TUNE_DEFAULT;
    const bool avx512 = isa_s && !strcmp(isa_s, "avx512"), q8 = dt_s && !strcmp(dt_s, "q8");
    if ((isa_s && !avx512 && strcmp(isa_s, "avx2")) || (dt_s && !q8 && strcmp(dt_s, "bf16")) ||
        (tune_s && strcmp(tune_s, "amd") && strcmp(tune_s, "default"))) {
        fprintf(stderr, "KAB_ISA must be avx2 or avx512, KAB_DTYPE bf16 or q8, KAB_TUNE default or amd\n");
        return 2;
    }
    if (!td_kernels_have_isa(avx512 ? TD_ISA_AVX512 : TD_ISA_AVX2)) { fprintf(stderr, "this CPU has no %s\n", avx512 ? "avx512" : "avx2"); return 1; }
    const size_t bytes = (size_t)(N * K) * (q8 ? 1 : sizeof(uint16_t));
    uint8_t *w = aligned_alloc((size_t)1 << 21, bytes); /* bytes is a multiple of 2 MiB */
    uint16_t *s = q8 ? malloc(sizeof *s * (size_t)(N * K / 32)) : NULL;
    float *x = malloc(sizeof *x * 5 * (size_t)K), *ya = malloc(sizeof *ya * 5 * (size_t)N), *yb = malloc(sizeof *yb * 5 * (size_t)N);
    if (!w || !x || !ya || !yb || (q8 && !s)) return 1;
    madvise(w, bytes, MADV_HUGEPAGE);
    if (q8) {
        for (int64_t i = 0; i < N * K; i++) w[i] = (uint8_t)(((uint64_t)i * 2654435761u) >> 20); /* int8, all values */
        for (int64_t i = 0; i < N * K / 32; i++) s[i] = td_f32_to_bf16(1.0f / 64 + (float)(i % 13) / 1024);
    } else
        for (int64_t i = 0; i < N * K; i++) ((uint16_t *)w)[i] = (uint16_t)(0x3f80 ^ (((uint64_t)i * 2654435761u) >> 20 & 0x7f)); /* [0.5, 2) */
    for (int64_t i = 0; i < 5 * K; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    const td_tensor W = {.dtype = q8 ? TD_DTYPE_Q8 : TD_DTYPE_BF16, .ndim = 2, .shape = {N, K}, .data = w,
                         .scales = s, .scales_dtype = TD_DTYPE_BF16, .scale_block = {1, 32}};
    const mm_fn f[2] = {avx512 ? td_mm_avx512 : td_mm_avx2, avx512 ? td_mm_avx512_B : td_mm_avx2_B};
    bool same1 = true;
    static double t[2][2][64]; /* [A/B][M = 1 / 5][rep] */
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < 2; i++) {
            const int v = r & 1 ? 1 - i : i;
            t[v][0][r] = timed(f[v], tune, &W, x, v ? yb : ya, 1);
            if (r == 0 && i == 1) same1 = !memcmp(ya, yb, sizeof *ya * (size_t)N); /* both M = 1 outputs are in */
            t[v][1][r] = timed(f[v], tune, &W, x, v ? yb : ya, 5);
        }
    double med[2][2];
    for (int v = 0; v < 2; v++)
        for (int m = 0; m < 2; m++) {
            qsort(t[v][m], (size_t)reps, sizeof(double), cmp_double);
            med[v][m] = t[v][m][reps / 2];
        }
    printf("%s %s, tuning %s, outputs: M = 1 %s, M = 5 %s\n", avx512 ? "avx512" : "avx2", q8 ? "q8" : "bf16", td_tune_name(tune), same1 ? "bit-identical" : "DIFFER",
           memcmp(ya, yb, sizeof *ya * 5 * (size_t)N) ? "DIFFER" : "bit-identical");
    for (int v = 0; v < 2; v++)
        printf("%c: M=1 %.2f ms  M=5 %.2f ms  t(5)/t(1) %.3f\n", "AB"[v], med[v][0] * 1e3, med[v][1] * 1e3, med[v][1] / med[v][0]);
    printf("B/A: M=1 %.3f  M=5 %.3f (medians of %d)\n", med[1][0] / med[0][0], med[1][1] / med[0][1], reps);
    free(w), free(s), free(x), free(ya), free(yb);
    return 0;
}
