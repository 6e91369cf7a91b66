/* The verify-sized matmul: BF16 weights [N, K = 2048] (default N = 262144: 1 GiB,
 * larger than the caches, so it streams from memory as a decode step does)
 * times M = 1..5 activation rows, on 2 threads in 16-row tasks (static
 * halves), on one ISA. Prints the median of 9 per M and t(M)/t(1): the cost of
 * checking M - 1 drafted tokens against a decode step (issue 18's verify goal
 * is t(5)/t(1) <= 1.25).
 *   usage: verify_matmul [N] [avx2|avx512]
 * Built against the internal headers (as bench/prefill_matmul.c):
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o build/verify_matmul bench/verify_matmul.c build/libtandem.a \
 *       -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lm -pthread [-L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lstdc++] */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/cpu/kernels.h"
#include "model/tensor.h"

typedef struct {
    td_tensor W;
    const float *x;
    float *y;
    int M;
    int64_t N;
    td_isa isa;
} job;

typedef struct {
    const job *j;
    int half;
} part;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void *run_half(void *arg) {
    const part *p = arg;
    const job *j = p->j;
    const int64_t n0 = p->half * j->N / 2, n1 = (p->half + 1) * j->N / 2;
    for (int64_t n = n0; n < n1; n += 16) {
        const int64_t e = n + 16 < n1 ? n + 16 : n1;
        td_matmul_block(j->isa, td_kernels_best_tune(), &j->W, j->x, 0, j->M, n, e, j->y, j->N);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static double median_time(job *j, int M) {
    enum { REPS = 9 };
    double t[REPS];
    j->M = M;
    for (int r = 0; r < REPS; r++) {
        pthread_t th[2];
        part p[2] = {{j, 0}, {j, 1}};
        double t0 = now();
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run_half, &p[i]);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        t[r] = now() - t0;
    }
    qsort(t, REPS, sizeof t[0], cmp_double);
    return t[REPS / 2];
}

int main(int argc, char **argv) {
    const int64_t N = argc > 1 ? atoll(argv[1]) : 262144, K = 2048;
    const td_isa isa = argc > 2 && !strcmp(argv[2], "avx512") ? TD_ISA_AVX512 : TD_ISA_AVX2;
    if (N < 32 || N > (int64_t)1 << 24) { fprintf(stderr, "usage: verify_matmul [N, 32..16777216] [avx2|avx512]\n"); return 2; }
    if (!td_kernels_have_isa(isa)) { fprintf(stderr, "this CPU has no %s\n", td_isa_name(isa)); return 1; }
    uint16_t *w = malloc(sizeof *w * (size_t)(N * K));
    float *x = malloc(sizeof *x * 5 * (size_t)K), *y = malloc(sizeof *y * 5 * (size_t)N);
    if (!w || !x || !y) return 1;
    for (int64_t i = 0; i < N * K; i++) w[i] = (uint16_t)(0x3f80 ^ (((uint64_t)i * 2654435761u) >> 20 & 0x7f)); /* values in [0.5, 2) */
    for (int64_t i = 0; i < 5 * K; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    job j = {.W = {.dtype = TD_DTYPE_BF16, .ndim = 2, .shape = {N, K}, .data = w}, .x = x, .y = y, .N = N, .isa = isa};
    const double t1 = median_time(&j, 1);
    printf("%s N %lld K %lld, 2 threads: M=1 %.2f ms (%.1f GB/s)", td_isa_name(isa), (long long)N, (long long)K, t1 * 1e3,
           (double)N * K * 2 / t1 / 1e9);
    for (int m = 2; m <= 5; m++) {
        const double t = median_time(&j, m);
        printf("  M=%d %.2f ms %.2fx", m, t * 1e3, t / t1);
    }
    printf("\n");
    free(w), free(x), free(y);
    return 0;
}
