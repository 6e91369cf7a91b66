/* tandem kernels: see src/bench/kernels.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "bench/kernels.h"
#include "cli/cli.h"

static int usage(FILE *f) {
    fprintf(f, "usage: tandem kernels [-m DIR] [-t THREADS] [--reps N] [--probe-mb MB] [--mm-mb MB] [--mm-k K]\n"
               "                      [--dtype bf16|f32|f16|fp8|nvfp4] [--prefill 512,4096] [--max-k 8] [--isa c|avx2|avx512]\n"
               "                      [--quantize none|q8]\n"
               "  bandwidth probe, matmul GB/s per ISA and M = 1..16 on a synthetic weight (--mm-mb 0 skips it),\n"
               "  and with -m: decode tokens/s (depth 0), verify cost t(k+1)/t(1), prefill tokens/s\n");
    return f == stdout ? 0 : 2;
}

int cmd_kernels(int argc, char **argv) {
    kbench_opts o = {.reps = 5, .probe_mb = 1024, .mm_mb = 512, .mm_k = 5120, .max_k = 8, .mm_dtype = "bf16",
                     .prefill = {512, 4096}, .n_prefill = 2};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!v) return usage(stderr);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model_dir = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--probe-mb")) o.probe_mb = atoi(v);
        else if (!strcmp(a, "--mm-mb")) o.mm_mb = atoi(v);
        else if (!strcmp(a, "--mm-k")) o.mm_k = atoi(v);
        else if (!strcmp(a, "--dtype")) o.mm_dtype = v;
        else if (!strcmp(a, "--isa")) { /* model-level runs only; the matmul table covers every ISA */
            td_isa want = !strcmp(v, "c") ? TD_ISA_C : !strcmp(v, "avx2") ? TD_ISA_AVX2 : !strcmp(v, "avx512") ? TD_ISA_AVX512 : TD_ISA_AUTO;
            if (!td_kernels_set_isa(want)) { fprintf(stderr, "tandem kernels: this CPU has no %s\n", v); return 2; }
        }
        else if (!strcmp(a, "--max-k")) o.max_k = atoi(v);
        else if (!strcmp(a, "--quantize")) {
            if (!strcmp(v, "q8")) o.quantize = 1;
            else if (!strcmp(v, "none")) o.quantize = 0;
            else return usage(stderr);
        }
        else if (!strcmp(a, "--prefill")) {
            o.n_prefill = 0;
            for (const char *p = v; *p && o.n_prefill < 4;) {
                o.prefill[o.n_prefill++] = atoi(p);
                const char *c = strchr(p, ',');
                if (!c) break;
                p = c + 1;
            }
            if (o.n_prefill == 1 && o.prefill[0] == 0) o.n_prefill = 0;
        } else return usage(stderr);
    }
    if (o.reps < 1 || o.reps > 64 || o.max_k < 1 || o.max_k > 16 || o.probe_mb < 16 || o.mm_k < 16) return usage(stderr);
    return kbench_run(&o, stdout);
}
