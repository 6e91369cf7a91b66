/* M = 1 streaming: BF16 (f32 activations) against int8 on q8, equal weight bytes, 2 threads, interleaved */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <pthread.h>
#include <time.h>
#include <sys/mman.h>
#include "backend/cpu/kernels.h"
#include "model/tensor.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void *halloc(size_t n){ n=(n+(2<<20)-1)/(2<<20)*(2<<20); void *p=aligned_alloc(2<<20,n); madvise(p,n,MADV_HUGEPAGE); memset(p,1,n); return p; }
enum { NM = 64 };
typedef void (*i8fn)(td_isa, const td_tensor *, const int8_t *, const int8_t *, const float *, int, int, int64_t, int64_t, float *, int64_t);
VDECL
static i8fn fns[] = {td_matmul_block_i8 VLIST}; static const char *names[] = {"bf16 f32", "int8 default" VNAMES}; enum { NV = sizeof fns / sizeof fns[0] + 1 };
static td_tensor Wb[NM], Wq[NM]; static int nb_, nq_, nthr = 2, which, M = 1; static atomic_long cnt[NM]; static pthread_barrier_t bar; static volatile int stop;
static float *x; static int8_t *xq, *xa; static float *xs; static float *y;
static void run_all(void) { int n = which ? nq_ : nb_; td_tensor *W = which ? Wq : Wb;
  for (int i = 0; i < n; i++) { int64_t N = W[i].shape[0]; int64_t rt = N / 64 >= 4 * nthr ? 64 : 16; long nt = (N + rt - 1) / rt;
    for (;;) { long t = atomic_fetch_add(&cnt[i], 1); if (t >= nt) break; int64_t n0 = t * rt, n1 = n0 + rt < N ? n0 + rt : N;
      if (which) fns[which - 1](TD_ISA_AVX2, &W[i], xq, xa, xs, 0, M, n0, n1, y, N); else td_matmul_block(TD_ISA_AVX2, TD_TUNE_AMD, &W[i], x, 0, M, n0, n1, y, N); }
    pthread_barrier_wait(&bar); } }
static void *worker(void *a) { (void)a; for (;;) { pthread_barrier_wait(&bar); if (stop) return NULL; run_all(); pthread_barrier_wait(&bar); } }
static int cmpd(const void *a, const void *b) { double p = *(const double *)a, q = *(const double *)b; return p < q ? -1 : p > q; }
int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 15; M = argc > 2 ? atoi(argv[2]) : 1; int64_t N = 6912, K = 2048; double bytes = 0;
  for (int l = 0; l < 24; l++) { int64_t n = l % 2 ? N : K, k = l % 2 ? K : N; td_tensor *t = &Wb[nb_++]; memset(t, 0, sizeof *t);
    uint16_t *d = halloc(n * k * 2); for (int64_t j = 0; j < n * k; j++) d[j] = 0x3c00 + (j % 97); t->dtype = TD_DTYPE_BF16; t->ndim = 2; t->shape[0] = n; t->shape[1] = k; t->data = d; bytes += n * k * 2; }
  for (int l = 0; l < 48; l++) { int64_t n = l % 2 ? N : K, k = l % 2 ? K : N; td_tensor *t = &Wq[nq_++]; memset(t, 0, sizeof *t);
    int8_t *q = halloc(n * k); for (int64_t j = 0; j < n * k; j++) q[j] = (int8_t)((j * 2654435761u >> 13) % 255 - 127); float *s = halloc(n * k / 32 * 4); for (int64_t j = 0; j < n * k / 32; j++) s[j] = 1e-3f;
    t->ndim = 2; t->shape[0] = n; t->shape[1] = k; t->dtype = TD_DTYPE_Q8; t->data = q; t->scales = s; t->scales_dtype = TD_DTYPE_F32; t->q8_grouped = true; t->scale_f = 1; }
  x = malloc(4 * 16 * N); for (int i = 0; i < 16 * N; i++) x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  xq = aligned_alloc(64, 16 * N); xa = aligned_alloc(64, 16 * N); xs = malloc(4 * 16 * N / 32); y = malloc(4 * 16 * N);
  td_x_to_q8(TD_ISA_AVX2, x, 1, N, xq, xa, xs); /* only K = N rows used for the down matrices; the up ones read the first K */
  pthread_barrier_init(&bar, NULL, nthr); pthread_t th; pthread_create(&th, NULL, worker, NULL);
  double t[NV][64];
  for (int r = 0; r < reps; r++) for (int v = 0; v < NV; v++) { which = (v + r) % NV;
      for (int i = 0; i < NM; i++) atomic_store(&cnt[i], 0); pthread_barrier_wait(&bar); double t0 = now(); run_all(); t[which][r] = now() - t0; pthread_barrier_wait(&bar); }
  stop = 1; pthread_barrier_wait(&bar); pthread_join(th, NULL);
  for (int v = 0; v < NV; v++) { qsort(t[v], reps, sizeof(double), cmpd); printf("%s M=%d: median %.2f ms, %.1f GB/s (min %.2f max %.2f)\n", names[v], M, t[v][reps/2]*1e3, bytes/t[v][reps/2]/1e9, t[v][0]*1e3, t[v][reps-1]*1e3); }
  return 0; }
