#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define BODY(j) a##j = _mm256_add_epi32(a##j, _mm256_madd_epi16(_mm256_maddubs_epi16(x, OP(w##j)), ones));
__attribute__((target("avx2"),noinline)) int run(long n) {
  __m256i x = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
  __m256i w0=_mm256_set1_epi8(1),w1=_mm256_set1_epi8(2),w2=_mm256_set1_epi8(3),w3=_mm256_set1_epi8(4),w4=_mm256_set1_epi8(5),w5=_mm256_set1_epi8(6),w6=_mm256_set1_epi8(7),w7=_mm256_set1_epi8(8);
  __m256i a0=w0,a1=w1,a2=w2,a3=w3,a4=w4,a5=w5,a6=w6,a7=w7;
  for (long i = 0; i < n; i++) {
    BODY(0) BODY(1) BODY(2) BODY(3) BODY(4) BODY(5) BODY(6) BODY(7)
    __asm__ volatile("" : "+x"(x));
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0,a1),_mm256_add_epi32(a2,a3)),_mm256_add_epi32(_mm256_add_epi32(a4,a5),_mm256_add_epi32(a6,a7)));
  return _mm256_extract_epi32(s, 0);
}
int main(void){ long n = 100000000; double t0 = now(); int r = run(n); double t = now() - t0;
  printf("%.1f GMAC/s (%.3f ns = %.2f cycles@3.57 per chunk) %d\n", n*8*32/t/1e9, t/(n*8)*1e9, t/(n*8)*3.57e9, r); }
