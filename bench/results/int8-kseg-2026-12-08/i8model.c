/* A/B of two int8 kernel builds on the rand27b matmul sequence (12 layers + lm_head), 2 threads, interleaved */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <pthread.h>
#include <time.h>
#include <sys/mman.h>
#include "backend/cpu/kernels.h"
#include "model/tensor.h"
void old_mm(td_isa isa, const td_tensor *W, const int8_t *xq, const int8_t *xa, const float *xs, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy);
typedef void (*mmfn)(td_isa, const td_tensor *, const int8_t *, const int8_t *, const float *, int, int, int64_t, int64_t, float *, int64_t);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void *halloc(size_t n){ n=(n+(2<<20)-1)/(2<<20)*(2<<20); void *p=aligned_alloc(2<<20,n); madvise(p,n,MADV_HUGEPAGE); return p; }
enum { NM = 128 };
static td_tensor W[NM]; static int nmat, nthr = 2, M; static atomic_long cnt[NM]; static pthread_barrier_t bar; static mmfn fn; static volatile int stop;
static int8_t *xq[NM], *xa[NM]; static float *xs[NM], *y;
static void add(int64_t N, int64_t K) { td_tensor *t = &W[nmat]; memset(t, 0, sizeof *t); int8_t *q = halloc(N*K); float *s = halloc(N*K/32*4);
  for (int64_t j = 0; j < N*K; j++) q[j] = (int8_t)((j * 2654435761u >> 13) % 255 - 127); for (int64_t j = 0; j < N*K/32; j++) s[j] = 1e-3f;
  t->ndim = 2; t->shape[0] = N; t->shape[1] = K; t->dtype = TD_DTYPE_Q8; t->data = q; t->scales = s; t->scales_dtype = TD_DTYPE_F32; t->q8_grouped = true; t->scale_f = 1;
  float *x = malloc(4*5*K); for (int i = 0; i < 5*K; i++) x[i] = (float)((i*7919)%1000)*1e-3f - 0.5f;
  xq[nmat] = aligned_alloc(64, 5*K); xa[nmat] = aligned_alloc(64, 5*K); xs[nmat] = malloc(4*5*K/32); td_x_to_q8(TD_ISA_AVX2, x, 5, K, xq[nmat], xa[nmat], xs[nmat]); free(x); nmat++; }
static void run_all(void) { for (int i = 0; i < nmat; i++) { int64_t N = W[i].shape[0]; int64_t rt = N / 64 >= 4 * nthr ? 64 : 16; long nt = (N + rt - 1) / rt;
    for (;;) { long t = atomic_fetch_add(&cnt[i], 1); if (t >= nt) break; int64_t n0 = t * rt, n1 = n0 + rt < N ? n0 + rt : N;
      fn(TD_ISA_AVX2, &W[i], xq[i], xa[i], xs[i], 0, M, n0, n1, y, N); }
    pthread_barrier_wait(&bar); } }
static void *worker(void *a) { (void)a; for (;;) { pthread_barrier_wait(&bar); if (stop) return NULL; run_all(); pthread_barrier_wait(&bar); } }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, z = *(const double *)b; return x < z ? -1 : x > z; }
int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 10; y = malloc(4 * 5 * 17408); const char *only = argc > 2 ? argv[2] : "all";
  if (!strcmp(only, "down")) for (int l = 0; l < 36; l++) add(2048, 6912);
  else if (!strcmp(only, "down27")) for (int l = 0; l < 6; l++) add(5120, 17408);
  else if (!strcmp(only, "up27")) for (int l = 0; l < 6; l++) add(17408, 5120);
  else if (!strcmp(only, "up")) for (int l = 0; l < 36; l++) add(6912, 2048);
  else { for (int l = 0; l < 12; l++) { if (l % 4 == 3) { add(5120, 2048); add(512, 2048); add(512, 2048); add(2048, 2560); } else { add(3840, 2048); add(2304, 2048); add(18, 2048); add(18, 2048); add(2048, 2304); }
    add(6912, 2048); add(6912, 2048); add(2048, 6912); }
  add(8192, 2048); }
  double bytes = 0; for (int i = 0; i < nmat; i++) bytes += W[i].shape[0] * W[i].shape[1];
  pthread_barrier_init(&bar, NULL, nthr); pthread_t th; pthread_create(&th, NULL, worker, NULL);
  mmfn fns[2] = {old_mm, td_matmul_block_i8}; double t[2][6][64];
  for (int r = 0; r < reps; r++) for (M = 1; M <= 5; M++) for (int v = 0; v < 2; v++) { fn = fns[(v + r) % 2 ? 1 : 0]; int vi = (v + r) % 2 ? 1 : 0;
      for (int i = 0; i < nmat; i++) atomic_store(&cnt[i], 0); pthread_barrier_wait(&bar); double t0 = now(); run_all(); t[vi][M][r] = now() - t0; pthread_barrier_wait(&bar); }
  stop = 1; pthread_barrier_wait(&bar); pthread_join(th, NULL);
  printf("%d matrices, %.0f MB int8, 2 threads, %d interleaved reps, medians\n| M | old ms | new ms | old GMAC/s | new GMAC/s | new/old time | old t(M)/t(1) | new t(M)/t(1) |\n|---|---|---|---|---|---|---|---|\n", nmat, bytes/1e6, reps);
  double m1[2];
  for (M = 1; M <= 5; M++) { double md[2]; for (int v = 0; v < 2; v++) { qsort(t[v][M], reps, sizeof(double), cmpd); md[v] = t[v][M][reps/2]; if (M == 1) m1[v] = md[v]; }
    printf("| %d | %.2f | %.2f | %.1f | %.1f | %.3f | %.2f | %.2f |\n", M, md[0]*1e3, md[1]*1e3, M*bytes/md[0]/1e9, M*bytes/md[1]/1e9, md[1]/md[0], md[0]/m1[0], md[1]/m1[1]); }
  return 0; }
