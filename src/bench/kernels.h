/* `tandem kernels` (issue 9): what the CPU kernels reach on this machine —
 * a STREAM-like read-bandwidth probe, matmul GB/s per ISA and batch size M,
 * and, given a model, decode tokens/s at depth 0, verify cost t(k+1)/t(1)
 * for k = 1..8 and prefill tokens/s, with achieved GB/s against the probe. */
#ifndef TANDEM_BENCH_KERNELS_H
#define TANDEM_BENCH_KERNELS_H
#include <stdio.h>
#include "tandem.h"

typedef struct kbench_opts {
    const char *model_dir;  /* NULL: probe and matmul only */
    int threads;            /* 0 = all cores */
    int reps;               /* timed repetitions per measurement (median reported) */
    int probe_mb;           /* bandwidth probe buffer */
    int mm_mb;              /* synthetic matmul weight size */
    int mm_k;               /* its in_features */
    int prefill[4], n_prefill;
    int max_k;              /* verify k = 1..max_k */
    int decode_at;          /* decode / verify rows after a prompt of this many tokens (>= 16) */
    int prefill_at;         /* the prefill rows after a prompt of this many tokens (0: from position 0) */
    const char *mm_dtype;   /* bf16, f32, f16, fp8, nvfp4 */
    int quantize;           /* td_engine_opts.quantize for the model runs */
    int isa;                /* td_engine_opts.isa for the model runs (0 = best) */
    int tune;               /* td_engine_opts.kernel_tune for them (0 = this CPU's) */
    td_precision precision; /* td_engine_opts.precision for the model runs */
    const char *backend;    /* td_engine_opts.backend for the model runs (NULL: cpu / $TANDEM_BACKEND) */
    bool enforce_eager;     /* td_engine_opts.enforce_eager (CUDA: no graphs) */
    bool batch_invariant;   /* td_engine_opts.batch_invariant (CUDA: no cuBLAS prefill) */
    bool mmap_weights;      /* td_engine_opts.mmap_weights (--mmap) */
    /* Instead of model_dir: a model generated in backend memory from this config
     * (td_engine_load_random), weights in random_dtype ("bf16", "f32", "fp8", "nvfp4"). */
    const char *random_config;
    const char *random_dtype;
    float mtp_mix;          /* < 0: no MTP head */
    int r_hidden, r_layers, r_vocab; /* 0: as the config (td_config_scale) */
} kbench_opts;

int td_kbench_run(const kbench_opts *o, FILE *out);
#endif
