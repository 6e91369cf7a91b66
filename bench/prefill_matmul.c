/* One prefill-sized matmul on one thread: BF16 weights [N, K] times M = 512
 * activation rows, in the blocks cpu_backend.c hands its tasks (32 weight
 * rows x one activation block), through the BF16-activation path
 * (td_matmul_block_bf16, `--precision bf16`) or the f32 path (td_matmul_block)
 * on the best ISA (`f32`) or on AVX2 (`f32-avx2`). Prints the best of REPS in GFLOP/s and an FNV-1a hash of
 * every output bit, so two builds can be compared for speed and checked for
 * identical results side by side.
 *   usage: prefill_matmul bf16|f32 N K [REPS] [M_BLOCK]
 *   (M_BLOCK default: 128 for bf16, 64 for f32, the backend's blocks)
 * Built against the internal headers:
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o build/prefill_matmul bench/prefill_matmul.c build/libtandem.a \
 *       -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lm -pthread [-L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lstdc++]
 * The shapes of the 27B-proportioned test model: 6912 2048 (gate / up) and
 * 2048 6912 (down). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/cpu/kernels.h"
#include "model/tensor.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: prefill_matmul bf16|f32|f32-avx2 N K [REPS] [M_BLOCK]\n"); return 2; }
    const int bf = !strcmp(argv[1], "bf16"), M = 512;
    const td_isa isa = !strcmp(argv[1], "f32-avx2") || !td_kernels_have_isa(TD_ISA_AVX512) ? TD_ISA_AVX2 : TD_ISA_AVX512;
    const int64_t N = atoll(argv[2]), K = atoll(argv[3]);
    const int reps = argc > 4 ? atoi(argv[4]) : 3, mb = argc > 5 ? atoi(argv[5]) : bf ? TD_BF16_M_BLOCK : 64;
    if (N < 1 || N > 1 << 20 || K < 1 || K > 1 << 20 || reps < 1 || reps > 100 || mb < 1 || mb > M) return 2;
    if (bf && !td_kernels_have_bf16()) { fprintf(stderr, "this CPU has no AVX-512 BF16\n"); return 1; }
    if (!bf && !td_kernels_have_isa(isa)) { fprintf(stderr, "this CPU has no %s\n", td_isa_name(isa)); return 1; }
    const int64_t ldb = (K + 31) & ~(int64_t)31;
    uint16_t *w = malloc(sizeof *w * (size_t)(N * K)), *xb = malloc(sizeof *xb * (size_t)(M * ldb));
    float *x = malloc(sizeof *x * (size_t)(M * K)), *y = malloc(sizeof *y * (size_t)(M * N));
    if (!w || !xb || !x || !y) return 1;
    for (int64_t i = 0; i < N * K; i++) w[i] = (uint16_t)(0x3f80 ^ (((uint64_t)i * 2654435761u) >> 20 & 0x7f)); /* values in [0.5, 2) */
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    if (bf) td_x_to_bf16(x, M, K, ldb, xb);
    td_tensor W = {.dtype = TD_DTYPE_BF16, .ndim = 2, .shape = {N, K}, .data = w};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int64_t n0 = 0; n0 < N; n0 += 32)
            for (int m0 = 0; m0 < M; m0 += mb) {
                int m1 = m0 + mb < M ? m0 + mb : M;
                int64_t n1 = n0 + 32 < N ? n0 + 32 : N;
                if (bf) td_matmul_block_bf16(&W, xb, ldb, m0, m1, n0, n1, y, N);
                else td_matmul_block(isa, td_kernels_best_tune(), &W, x, m0, m1, n0, n1, y, N);
            }
        double t = now() - t0;
        if (t < best) best = t;
    }
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < M * N; i++) {
        uint32_t u;
        memcpy(&u, &y[i], 4);
        h = (h ^ u) * 1099511628211ull;
    }
    printf("%s (%s) M %d N %lld K %lld block %d: best %.1f ms, %.1f GFLOP/s, output hash %016llx\n", bf ? "bf16" : "f32", bf ? "avx512bf16" : td_isa_name(isa), M, (long long)N,
           (long long)K, mb, best * 1e3, 2.0 * M * (double)N * (double)K / best / 1e9, (unsigned long long)h);
    free(w), free(xb), free(x), free(y);
    return 0;
}
