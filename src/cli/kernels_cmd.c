/* tandem kernels: see src/bench/kernels.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "bench/kernels.h"
#include "cli/cli.h"

static int usage(void) {
    printf("usage: tandem kernels [-m DIR] [-t THREADS] [--reps N] [--probe-mb MB] [--mm-mb MB] [--mm-k K]\n"
           "                      [--dtype bf16|f32|f16|fp8|nvfp4] [--prefill 512,4096] [--max-k 8] [--decode-at N] [--prefill-at N] [--isa c|avx2|avx512]\n"
           "                      [--tune default|amd]\n"
           "                      [--quantize none|q8] [--precision f32|bf16|int8] [--device cpu|guard|cuda] [--enforce-eager] [--batch-invariant]\n"
           "                      [--mmap] [--random-config FILE [--mtp-mix F] [--hidden N] [--layers N] [--vocab N]]\n"
           "  bandwidth probe, matmul GB/s per ISA and M = 1..16 on a synthetic weight (--mm-mb 0 skips it),\n"
           "  and with -m or --random-config: decode tokens/s (depth 0), verify cost t(k+1)/t(1), prefill tokens/s\n"
           "  -m, --model DIR     model for the decode / verify / prefill rows (default: none, kernels only)\n"
           "  --random-config FILE  instead of -m: a random-weight model of this config.json generated in the\n"
           "                      backend's memory (no weight files), its linear weights in --dtype (bf16, f32, fp8, nvfp4,\n"
           "                      q8; the matmul table has no q8 and is skipped with it; q8 runs with --precision int8 too)\n"
           "  --mtp-mix F         with it: an MTP head that partly agrees with the trunk (make_random_model.py --mtp F,\n"
           "                      0..100: 0 agrees always); default -1 = no MTP head\n"
           "  --hidden N, --layers N, --vocab N  with it: the config scaled down as make_random_model.py (default: as is)\n"
           "  --device, --backend cpu|guard|cuda  backend of the model rows (default cpu; the probe and matmul table run on the CPU)\n"
           "  --enforce-eager     cuda: time the model rows without CUDA graphs (default: decode and verify replay graphs)\n"
           "  --batch-invariant   cuda: exact kernels only (default: over 16 rows of BF16 weights, 128 of others, on cuBLAS BF16)\n"
           "  --mmap              -m: the weights in place in the mapped files (default: copied into huge pages, as serve)\n"
           "  -t, --threads N     threads, 0..1024 (default 0 = all cores)\n"
           "  --reps N            repetitions per timing, 1..64 (default 5)\n"
           "  --probe-mb MB       bandwidth probe buffer, 16..65536 MB (default 1024)\n"
           "  --mm-mb MB          synthetic matmul weight, 0..65536 MB (default 512; 0 = skip the matmul table)\n"
           "  --mm-k K            its input dimension, 16..1048576 (default 5120)\n"
           "  --dtype D           its format: bf16, f32, f16, fp8, nvfp4 (default bf16)\n"
           "  --prefill LIST      prompt lengths for prefill tokens/s, up to 4 (default 512,4096; 0 = none)\n"
           "  --max-k K           largest verify batch k+1 - 1, 1..16 (default 8)\n"
           "  --decode-at N       decode and verify rows after a prompt of N tokens, 16..1048576 (default 16): their\n"
           "                      attention reads N positions (the prompt is prefilled in chunks of 4096 first)\n"
           "  --prefill-at N      the prefill rows after a prompt of N tokens, 0..1048576 (default 0): a prompt tail\n"
           "                      after a prefix-cache hit (the N tokens are prefilled first, untimed, in chunks of 4096)\n"
           "  --isa c|avx2|avx512 model rows on this ISA (default: the best the CPU has)\n"
           "  --tune default|amd  model rows with these kernel tile choices (default: this CPU's, amd on AMD Zen 5+;\n"
           "                      the same bits either way)\n"
           "  --quantize none|q8  model weights to int8 at load (default none)\n"
           "  --precision f32|bf16|int8 model runs with f32 (default), bf16 or int8 (q8 weights: --quantize q8,\n"
           "                      or --random-config with --dtype q8) matmul activations\n"
           "  -v, --verbose       errors with their source location\n"
           "  -h, --help          this help\n");
    return 0;
}

/* an integer option in [lo, hi]: 0, or the exit code 2 after one line */
static int int_opt(const char *a, const char *v, long lo, long hi, int *out) {
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || *end || n < lo || n > hi) {
        fprintf(stderr, "tandem kernels: %s must be an integer in [%ld, %ld], got \"%s\"\n", a, lo, hi, v);
        return 2;
    }
    *out = (int)n;
    return 0;
}

int td_cmd_kernels(int argc, char **argv) {
    kbench_opts o = {.reps = 5, .probe_mb = 1024, .mm_mb = 512, .mm_k = 5120, .max_k = 8, .mm_dtype = "bf16",
                     .prefill = {512, 4096}, .n_prefill = 2, .mtp_mix = -1.0f,
                     .decode_at = 16};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (td_cli_is_help(a)) return usage();
        if (td_cli_is_verbose(a)) { td_cli_verbose = true; continue; }
        if (!strcmp(a, "--enforce-eager")) { o.enforce_eager = true; continue; }
        if (!strcmp(a, "--batch-invariant")) { o.batch_invariant = true; continue; }
        if (!strcmp(a, "--mmap")) { o.mmap_weights = true; continue; }
        static const char *const valued[] = {"-m", "--model", "-t", "--threads", "--reps", "--probe-mb", "--mm-mb", "--mm-k",
                                             "--dtype", "--isa", "--tune", "--max-k", "--decode-at", "--prefill-at", "--quantize", "--prefill", "--precision",
                                             "--random-config", "--mtp-mix", "--hidden", "--layers", "--vocab", "--device", "--backend"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
        if (!known) return td_cli_unknown("kernels", a);
        if (!v) return td_cli_missing("kernels", a, "see tandem kernels --help");
        i++;
        int rc = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model_dir = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) rc = int_opt(a, v, 0, 1024, &o.threads);
        else if (!strcmp(a, "--reps")) rc = int_opt(a, v, 1, 64, &o.reps);
        else if (!strcmp(a, "--probe-mb")) rc = int_opt(a, v, 16, 65536, &o.probe_mb);
        else if (!strcmp(a, "--mm-mb")) rc = int_opt(a, v, 0, 65536, &o.mm_mb);
        else if (!strcmp(a, "--mm-k")) rc = int_opt(a, v, 16, 1 << 20, &o.mm_k);
        else if (!strcmp(a, "--max-k")) rc = int_opt(a, v, 1, 16, &o.max_k);
        else if (!strcmp(a, "--decode-at")) rc = int_opt(a, v, 16, 1 << 20, &o.decode_at);
        else if (!strcmp(a, "--prefill-at")) rc = int_opt(a, v, 0, 1 << 20, &o.prefill_at);
        else if (!strcmp(a, "--random-config")) o.random_config = v;
        else if (!strcmp(a, "--hidden")) rc = int_opt(a, v, 16, 1 << 16, &o.r_hidden);
        else if (!strcmp(a, "--layers")) rc = int_opt(a, v, 1, 1024, &o.r_layers);
        else if (!strcmp(a, "--vocab")) rc = int_opt(a, v, 1, 1 << 22, &o.r_vocab);
        else if (!strcmp(a, "--mtp-mix")) {
            char *end;
            double f = strtod(v, &end);
            if (end == v || *end || !(f <= 100.0) || (f < 0 && f != -1.0)) {
                fprintf(stderr, "tandem kernels: --mtp-mix must be a number in [0, 100] (or -1: no MTP head), got \"%s\"\n", v);
                return 2;
            }
            o.mtp_mix = (float)f;
        }
        else if (!strcmp(a, "--device") || !strcmp(a, "--backend")) {
            if (strcmp(v, "cpu") && strcmp(v, "guard") && strcmp(v, "cuda")) {
                fprintf(stderr, "tandem kernels: %s must be cpu, guard or cuda, got \"%s\"\n", a, v);
                return 2;
            }
            o.backend = v;
        }
        else if (!strcmp(a, "--dtype")) {
            if (strcmp(v, "bf16") && strcmp(v, "f32") && strcmp(v, "f16") && strcmp(v, "fp8") && strcmp(v, "nvfp4") && strcmp(v, "q8")) {
                fprintf(stderr, "tandem kernels: --dtype must be one of bf16, f32, f16, fp8, nvfp4, q8, got \"%s\"\n", v);
                return 2;
            }
            o.mm_dtype = v;
            o.random_dtype = v; /* a random model's linear weights too */
        }
        else if (!strcmp(a, "--isa")) { /* model-level runs only; the matmul table covers every ISA */
            td_isa want = !strcmp(v, "c") ? TD_ISA_C : !strcmp(v, "avx2") ? TD_ISA_AVX2 : !strcmp(v, "avx512") ? TD_ISA_AVX512 : TD_ISA_AUTO;
            if (want == TD_ISA_AUTO) { fprintf(stderr, "tandem kernels: --isa must be one of c, avx2, avx512, got \"%s\"\n", v); return 2; }
            if (!td_kernels_have_isa(want)) { fprintf(stderr, "tandem kernels: this CPU has no %s\n", v); return 2; }
            o.isa = (int)want + 1; /* td_engine_opts.isa */
        }
        else if (!strcmp(a, "--tune")) {
            if (!strcmp(v, "default")) o.tune = 1 + TD_TUNE_DEFAULT; /* td_engine_opts.kernel_tune */
            else if (!strcmp(v, "amd")) o.tune = 1 + TD_TUNE_AMD;
            else { fprintf(stderr, "tandem kernels: --tune must be default or amd, got \"%s\"\n", v); return 2; }
        }
        else if (!strcmp(a, "--precision")) {
            if (!strcmp(v, "bf16")) o.precision = TD_PRECISION_BF16;
            else if (!strcmp(v, "f32")) o.precision = TD_PRECISION_F32;
            else if (!strcmp(v, "int8")) o.precision = TD_PRECISION_INT8;
            else { fprintf(stderr, "tandem kernels: --precision must be f32, bf16 or int8, got \"%s\"\n", v); return 2; }
        }
        else if (!strcmp(a, "--quantize")) {
            if (!strcmp(v, "q8")) o.quantize = 1;
            else if (!strcmp(v, "none")) o.quantize = 0;
            else { fprintf(stderr, "tandem kernels: --quantize must be none or q8, got \"%s\"\n", v); return 2; }
        }
        else { /* --prefill */
            o.n_prefill = 0;
            for (const char *p = v; *p && o.n_prefill < 4;) {
                char *end;
                long n = strtol(p, &end, 10);
                if (end == p || (*end && *end != ',') || n < 0 || n > (1 << 20)) {
                    fprintf(stderr, "tandem kernels: --prefill must be up to 4 lengths in [0, 1048576] like 512,4096, got \"%s\"\n", v);
                    return 2;
                }
                o.prefill[o.n_prefill++] = (int)n;
                if (!*end) break;
                p = end + 1;
            }
            if (o.n_prefill == 1 && o.prefill[0] == 0) o.n_prefill = 0;
        }
        if (rc) return rc;
    }
    if (!strcmp(o.mm_dtype, "q8") && !o.random_config) {
        fprintf(stderr, "tandem kernels: --dtype q8 is for --random-config (a loaded model: --quantize q8)\n");
        return 2;
    }
    if (o.model_dir && o.random_config) { fprintf(stderr, "tandem kernels: -m and --random-config exclude each other\n"); return 2; }
    if (!o.random_config && (o.r_hidden || o.r_layers || o.r_vocab || o.mtp_mix >= 0)) {
        fprintf(stderr, "tandem kernels: --hidden, --layers, --vocab and --mtp-mix need --random-config\n");
        return 2;
    }
    if (o.model_dir && td_cli_check_model_dir("tandem kernels", o.model_dir)) return 1;
    return td_kbench_run(&o, stdout);
}
