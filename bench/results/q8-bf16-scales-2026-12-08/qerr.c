#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "model/quant.h"
#include "model/tensor.h"
static double gauss(void){ double u=(rand()+1.0)/(RAND_MAX+2.0), v=(rand()+1.0)/(RAND_MAX+2.0); return sqrt(-2*log(u))*cos(6.283185307*v); }
int main(void){ int64_t N=4096,K=256; float *f=malloc(4*N*K); for(int64_t i=0;i<N*K;i++) f[i]=(float)gauss()*0.02f;
 td_tensor t={.dtype=TD_DTYPE_F32,.ndim=2,.shape={N,K},.data=f}; int8_t *q=malloc(N*K); uint16_t *s=malloc(2*N*K/32);
 td_quantize_q8_rows(&t,0,N,q,s); double eo=0,en=0,sig=0;
 for(int64_t n=0;n<N;n++) for(int64_t b=0;b<K/32;b++){ float amax=0; for(int j=0;j<32;j++) amax=fmaxf(amax,fabsf(f[n*K+b*32+j]));
   float sc=amax/127.0f, inv=127.0f/amax; for(int j=0;j<32;j++){ int64_t i=n*K+b*32+j; long v=lrintf(f[i]*inv); v=v>127?127:v<-127?-127:v;
   double d=(double)v*sc-f[i]; eo+=d*d; double d2=(double)q[i]*td_bf16_to_f32(s[n*(K/32)+b])-f[i]; en+=d2*d2; sig+=(double)f[i]*f[i]; } }
 double yo=0,yn=0,ys=0; float *x=malloc(4*K); for(int k=0;k<K;k++) x[k]=(float)gauss();
 for(int64_t n=0;n<N;n++){ double a=0,b=0,c=0; for(int64_t k=0;k<K;k++){ int64_t i=n*K+k; float amax=0; int64_t b0=n*K+(k/32)*32; for(int j=0;j<32;j++) amax=fmaxf(amax,fabsf(f[b0+j])); long v=lrintf(f[i]*(127.0f/amax)); v=v>127?127:v<-127?-127:v; a+=(double)v*(amax/127.0f)*x[k]; b+=(double)q[i]*td_bf16_to_f32(s[n*(K/32)+k/32])*x[k]; c+=(double)f[i]*x[k]; } yo+=(a-c)*(a-c); yn+=(b-c)*(b-c); ys+=c*c; }
 printf("matvec rel err old %.4e new %.4e ratio %.4f\n", sqrt(yo/ys), sqrt(yn/ys), sqrt(yn/yo));
 printf("rms err old %.4e new %.4e ratio %.4f (signal rms %.3e)\n", sqrt(eo/(N*K)), sqrt(en/(N*K)), sqrt(en/eo), sqrt(sig/(N*K))); }
