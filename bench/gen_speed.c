/* Greedy generation speed through the public API (td_session_generate), for
 * comparing two builds side by side: compile it against each build's
 * libtandem.a and run them alternately (bench/results/backend-step-2026-12-01.md).
 *   usage: gen_speed MODEL_DIR DEPTH REPS THREADS MAX_TOKENS [PROMPT_TOKENS]
 * prints the best wall time (ms) of REPS generations of MAX_TOKENS tokens from
 * a fixed prompt of PROMPT_TOKENS (default 32) tokens (prefix caching off, so
 * every rep prefills). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "tandem.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int depth=atoi(argv[2]), reps=atoi(argv[3]), th=atoi(argv[4]);
  td_err err; td_engine_opts o={.n_threads=th,.spec_depth=4,.max_context=4096,.no_prefix_caching=true};
  td_engine*e; if(td_engine_load(argv[1],&o,&e,&err)){puts(err.msg);return 1;}
  td_session*s; td_session_new(e,&s,&err);
  int np = argc > 6 ? atoi(argv[6]) : 32;
  int32_t *p = malloc((size_t)np * sizeof *p); for(int i=0;i<np;i++) p[i]=(i*7919+13)%8000;
  td_sampling sp; td_sampling_default(&sp);
  td_gen_opts go={.max_tokens=atoi(argv[5]),.spec_depth=depth,.ignore_eos=true};
  double best=1e9; 
  for(int r=0;r<reps;r++){ td_session_reset(s); td_gen_result res; double t0=now();
    if(td_session_generate(s,p,np,&sp,&go,NULL,NULL,&res,&err)){puts(err.msg);return 1;}
    double t=(now()-t0); if(t<best) best=t; }
  printf("%.3f\n", best*1e3); return 0;}
