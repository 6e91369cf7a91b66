/* q8 F32 scales (HEAD's kernels, renamed) against BF16 scales (this tree), same int8 data, in one process:
   int8 activations (td_matmul_block_i8) and f32 activations (td_mm_avx2, tune amd); 2 threads, interleaved */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <pthread.h>
#include <time.h>
#include <sys/mman.h>
#include "backend/cpu/kernels.h"
#include "model/tensor.h"
void old_mm_i8(td_isa, const td_tensor *, const int8_t *, const int8_t *, const float *, int, int, int64_t, int64_t, float *, int64_t);
void old_mm_avx2(td_tune, const td_tensor *, const float *, int, int, int64_t, int64_t, float *, int64_t);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void *halloc(size_t n){ n=(n+(2<<20)-1)/(2<<20)*(2<<20); void *p=aligned_alloc(2<<20,n); madvise(p,n,MADV_HUGEPAGE); memset(p,1,n); return p; }
enum { NM = 48, NV = 4 };
static td_tensor Wold[NM], Wnew[NM]; static int nthr = 2, which, M = 1; static atomic_long cnt[NM]; static pthread_barrier_t bar; static volatile int stop;
static float *x; static int8_t *xq, *xa; static float *xs; static float *y;
static const char *names[NV] = {"int8 act, F32 scales (HEAD)", "int8 act, BF16 scales (new)", "f32 act, F32 scales (HEAD)", "f32 act, BF16 scales (new)"};
static void run_all(void) { td_tensor *W = which % 2 ? Wnew : Wold;
  for (int i = 0; i < NM; i++) { td_tensor t = W[i]; t.q8_grouped = which < 2; int64_t N = t.shape[0]; int64_t rt = N / 64 >= 4 * nthr ? 64 : 16; long nt = (N + rt - 1) / rt;
    for (;;) { long k = atomic_fetch_add(&cnt[i], 1); if (k >= nt) break; int64_t n0 = k * rt, n1 = n0 + rt < N ? n0 + rt : N;
      switch (which) { case 0: old_mm_i8(TD_ISA_AVX2, &t, xq, xa, xs, 0, M, n0, n1, y, N); break; case 1: td_matmul_block_i8(TD_ISA_AVX2, &t, xq, xa, xs, 0, M, n0, n1, y, N); break;
        case 2: old_mm_avx2(TD_TUNE_AMD, &t, x, 0, M, n0, n1, y, N); break; default: td_mm_avx2(TD_TUNE_AMD, &t, x, 0, M, n0, n1, y, N); } }
    pthread_barrier_wait(&bar); } }
static void *worker(void *a) { (void)a; for (;;) { pthread_barrier_wait(&bar); if (stop) return NULL; run_all(); pthread_barrier_wait(&bar); } }
static int cmpd(const void *a, const void *b) { double p = *(const double *)a, q = *(const double *)b; return p < q ? -1 : p > q; }
int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 15; M = argc > 2 ? atoi(argv[2]) : 1; int64_t N = 6912, K = 2048; double params = 0;
  for (int l = 0; l < NM; l++) { int64_t n = l % 2 ? N : K, k = l % 2 ? K : N;
    int8_t *q = halloc(n * k); for (int64_t j = 0; j < n * k; j++) q[j] = (int8_t)((j * 2654435761u >> 13) % 255 - 127);
    float *sf = halloc(n * k / 32 * 4); uint16_t *sb = halloc(n * k / 32 * 2); for (int64_t j = 0; j < n * k / 32; j++) { sb[j] = td_f32_to_bf16(1e-3f * (1 + j % 7)); sf[j] = td_bf16_to_f32(sb[j]); }
    td_tensor t = {.dtype = TD_DTYPE_Q8, .ndim = 2, .shape = {n, k}, .data = q, .scale_block = {1, 32}, .scale_f = 1};
    Wold[l] = t; Wold[l].scales = sf; Wold[l].scales_dtype = TD_DTYPE_F32; Wnew[l] = t; Wnew[l].scales = sb; Wnew[l].scales_dtype = TD_DTYPE_BF16; params += n * k; }
  x = malloc(4 * 16 * N); for (int i = 0; i < 16 * N; i++) x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  xq = aligned_alloc(64, 16 * N); xa = aligned_alloc(64, 16 * N); xs = malloc(4 * 16 * N / 32); y = malloc(4 * 16 * N);
  td_x_to_q8(TD_ISA_AVX2, x, M, N, xq, xa, xs);
  pthread_barrier_init(&bar, NULL, nthr); pthread_t th; pthread_create(&th, NULL, worker, NULL);
  static double t[NV][64];
  for (int r = 0; r < reps; r++) for (int v = 0; v < NV; v++) { which = (v + r) % NV;
      for (int i = 0; i < NM; i++) atomic_store(&cnt[i], 0); pthread_barrier_wait(&bar); double t0 = now(); run_all(); t[which][r] = now() - t0; pthread_barrier_wait(&bar); }
  stop = 1; pthread_barrier_wait(&bar); pthread_join(th, NULL);
  double md[NV]; printf("%d q8 matrices [2048 x 6912] / [6912 x 2048], %.0f M weights, M = %d, AVX2, 2 threads, %d interleaved reps\n", NM, params / 1e6, M, reps);
  for (int v = 0; v < NV; v++) { qsort(t[v], reps, sizeof(double), cmpd); md[v] = t[v][reps/2];
    printf("%-30s median %7.2f ms  (%.1f GB/s of int8 + scales; min %.2f, max %.2f)\n", names[v], md[v]*1e3, params * (v % 2 ? 1.0625 : 1.125) / md[v] / 1e9, t[v][0]*1e3, t[v][reps-1]*1e3); }
  printf("new / old time: int8 act %.3f, f32 act %.3f\n", md[1] / md[0], md[3] / md[2]);
  return 0; }
