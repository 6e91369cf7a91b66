#include "cli/opts.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plan/plan.h"
#include "model/genconfig.h"
#include "cli/cli.h"

#define TD_STR_(x) #x
#define TD_STR(x) TD_STR_(x)

void td_common_opts_init(common_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = TD_DEFAULT_MODEL;
    o->mem_util = 0.9;
    o->prefix_caching = true;
    td_sampling_default(&o->sampling);
    o->generation_config = "auto";
    o->spec_auto = true;
    o->spec_depth_max = 4;
    o->spec_depth = 4;
}

long td_parse_size_suffix(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    if (*end == 'k' || *end == 'K') v *= 1024, end++;
    else if (*end == 'm' || *end == 'M') v *= 1024 * 1024, end++;
    if (*end || v > 1e12) return -1;
    return (long)v;
}

/* One line: what the option wants and what it got. */
static int bad(const char *opt, const char *val, const char *want) {
    if (!val) fprintf(stderr, "tandem: %s needs a value (%s)\n", opt, want);
    else fprintf(stderr, "tandem: %s must be %s, got \"%s\"\n", opt, want, val);
    return -1;
}

/* A number in [lo, hi] (an integer when `integer`); `range` describes it
 * in the message when the plain "[lo, hi]" would not read well. */
static int num(const char *opt, const char *val, double lo, double hi, bool integer, const char *range, double *out) {
    char want[128];
    if (range) snprintf(want, sizeof want, "%s in %s", integer ? "an integer" : "a number", range);
    else if (integer) snprintf(want, sizeof want, "an integer in [%.0f, %.0f]", lo, hi);
    else snprintf(want, sizeof want, "a number in [%g, %g]", lo, hi);
    char *end;
    if (!val) return bad(opt, val, want);
    errno = 0;
    double v = strtod(val, &end);
    if (end == val || *end || errno || !(v >= lo && v <= hi) || (integer && floor(v) != v)) return bad(opt, val, want);
    *out = v;
    return 0;
}

/* vLLM's --speculative-config '{"method":"mtp","num_speculative_tokens":N}' */
static int speculative_config(common_opts *o, const char *val) {
    json_error_t je;
    json_t *j = json_loads(val ? val : "", 0, &je);
    if (!json_is_object(j)) { json_decref(j); return bad("--speculative-config", val, "a JSON object such as '{\"method\":\"mtp\",\"num_speculative_tokens\":2}'"); }
    const char *method = json_string_value(json_object_get(j, "method"));
    json_t *n = json_object_get(j, "num_speculative_tokens");
    int rc = 0;
    if (method && strcmp(method, "mtp") != 0 && strcmp(method, "qwen3_next_mtp") != 0) {
        fprintf(stderr, "tandem: --speculative-config method \"%s\" is not supported (only \"mtp\")\n", method);
        rc = -1;
    } else if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > TD_MAX_SPEC_DEPTH) {
        rc = bad("--speculative-config num_speculative_tokens", val, "an integer in [0, " TD_STR(TD_MAX_SPEC_DEPTH) "]");
    } else {
        o->spec_depth = (int)json_integer_value(n);
        o->spec_auto = false;
    }
    json_decref(j);
    return rc;
}

int td_common_opts_parse(common_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    double v;
#define TAKE() (*i)++
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!val) return bad(a, val, "a model directory"); o->model = val; TAKE(); return 1; }
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (num(a, val, 0, 1024, true, NULL, &v)) return -1; o->threads = (int)v; TAKE(); return 1; }
    if (!strcmp(a, "--max-model-len") || !strcmp(a, "-c")) {
        if (val && !strcmp(val, "auto")) { o->max_model_len_auto = true; o->max_model_len = 0; TAKE(); return 1; }
        int64_t n = val ? td_plan_parse_tokens(val) : -1; /* vLLM's convention: k = 1000, K = 1024 */
        if (n < 1 || n > (1 << 24)) return bad(a, val, "a token count in [1, 16777216] (130k = 130000, 128K = 131072) or auto");
        o->max_model_len = (int)n; TAKE(); return 1;
    }
    if (!strcmp(a, "--kv-cache-dtype")) {
        if (!val) return bad(a, val, "one of auto, f32, bf16, fp8");
        if (!strcmp(val, "auto")) o->kv_dtype = TD_KV_AUTO;
        else if (!strcmp(val, "f32") || !strcmp(val, "float32")) o->kv_dtype = TD_KV_F32;
        else if (!strcmp(val, "bf16") || !strcmp(val, "bfloat16")) o->kv_dtype = TD_KV_BF16;
        else if (!strcmp(val, "fp8") || !strcmp(val, "fp8_e4m3")) o->kv_dtype = TD_KV_FP8;
        else return bad(a, val, "one of auto, f32, bf16, fp8");
        TAKE(); return 1;
    }
    if (!strcmp(a, "--backend")) {
        if (!val || (strcmp(val, "cpu") && strcmp(val, "guard") && strcmp(val, "cuda"))) return bad(a, val, "cpu, guard or cuda");
        o->backend = val; TAKE(); return 1;
    }
    if (!strcmp(a, "--device")) { /* the user-facing name of the backend choice: cpu -> "cpu", cuda -> "cuda" */
        if (!val || (strcmp(val, "cpu") && strcmp(val, "cuda"))) return bad(a, val, "cpu or cuda");
        o->backend = val; TAKE(); return 1;
    }
    if (!strcmp(a, "--deltanet-chunk")) {
        if (num(a, val, 0, 256, true, NULL, &v)) return -1;
        o->deltanet_chunk = (int)v; TAKE(); return 1;
    }
    if (!strcmp(a, "--precision")) {
        if (!val) return bad(a, val, "f32, bf16 or int8");
        if (!strcmp(val, "f32") || !strcmp(val, "float32")) o->precision = TD_PRECISION_F32;
        else if (!strcmp(val, "bf16") || !strcmp(val, "bfloat16")) o->precision = TD_PRECISION_BF16;
        else if (!strcmp(val, "int8")) o->precision = TD_PRECISION_INT8;
        else return bad(a, val, "f32, bf16 or int8");
        TAKE(); return 1;
    }
    if (!strcmp(a, "--isa")) {
        if (!val) return bad(a, val, "auto, c, avx2 or avx512");
        if (!strcmp(val, "auto")) o->isa = 0;
        else if (!strcmp(val, "c")) o->isa = 1; /* td_engine_opts.isa */
        else if (!strcmp(val, "avx2")) o->isa = 2;
        else if (!strcmp(val, "avx512")) o->isa = 3;
        else return bad(a, val, "auto, c, avx2 or avx512");
        TAKE(); return 1;
    }
    if (!strcmp(a, "--quantize")) {
        if (!val) return bad(a, val, "none or q8");
        if (!strcmp(val, "none")) o->quantize = 0;
        else if (!strcmp(val, "q8")) o->quantize = 1;
        else return bad(a, val, "none or q8");
        TAKE(); return 1;
    }
    if (!strcmp(a, "--kv-cache-memory") || !strcmp(a, "--memory-budget")) {
        bool kvm = !strcmp(a, "--kv-cache-memory");
        if (val && !kvm && !strcmp(val, "auto")) { o->memory_budget = 0; TAKE(); return 1; }
        uint64_t b = val ? td_plan_parse_bytes(val) : 0;
        if (!b) return bad(a, val, kvm ? "a size such as 2GiB, 512MiB or 3GB" : "a size such as 16GiB, or auto");
        if (kvm) o->kv_cache_memory = b; else o->memory_budget = b;
        TAKE(); return 1;
    }
    if (!strcmp(a, "--gpu-memory-utilization")) { if (num(a, val, 0.01, 1, false, NULL, &v)) return -1; o->mem_util = v; TAKE(); return 1; }
    if (!strcmp(a, "--no-prefix-caching") || !strcmp(a, "--no-enable-prefix-caching")) { o->prefix_caching = false; return 1; }
    if (!strcmp(a, "--enforce-eager")) { o->enforce_eager = true; return 1; }
    if (!strcmp(a, "--batch-invariant")) { o->batch_invariant = true; return 1; }
    if (!strcmp(a, "--mmap")) { o->mmap_weights = true; return 1; }
    if (!strcmp(a, "--enable-prefix-caching")) { o->prefix_caching = true; return 1; }
    if (!strcmp(a, "--spec-depth")) {
        if (val && !strcmp(val, "auto")) { o->spec_auto = true; o->spec_depth = o->spec_depth_max; TAKE(); return 1; }
        if (num(a, val, 0, TD_MAX_SPEC_DEPTH, true, "[0, " TD_STR(TD_MAX_SPEC_DEPTH) "] or auto", &v)) return -1;
        o->spec_auto = false; o->spec_depth = (int)v; TAKE(); return 1;
    }
    if (!strcmp(a, "--spec-depth-max")) {
        if (num(a, val, 1, TD_MAX_SPEC_DEPTH, true, NULL, &v)) return -1;
        o->spec_depth_max = (int)v;
        if (o->spec_auto) o->spec_depth = (int)v;
        TAKE(); return 1;
    }
    if (!strcmp(a, "--speculative-config")) { if (speculative_config(o, val)) return -1; TAKE(); return 1; }
    if (!strcmp(a, "--draft-sampling")) { o->draft_sampling = true; return 1; }
    if (!strcmp(a, "--generation-config")) { if (!val) return bad(a, val, "auto, none or a folder"); o->generation_config = val; TAKE(); return 1; }
    td_sampling *s = &o->sampling;
    if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) { if (num(a, val, 0, 100, false, NULL, &v)) return -1; s->temperature = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--top-k")) { if (num(a, val, 0, 1e9, true, NULL, &v)) return -1; s->top_k = (int)v; TAKE(); return 1; }
    if (!strcmp(a, "--top-p")) { if (num(a, val, 1e-9, 1, false, "(0, 1]", &v)) return -1; s->top_p = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--min-p")) { if (num(a, val, 0, 1, false, NULL, &v)) return -1; s->min_p = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--repetition-penalty")) { if (num(a, val, 1e-3, 100, false, NULL, &v)) return -1; s->repetition_penalty = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--presence-penalty")) { if (num(a, val, -2, 2, false, NULL, &v)) return -1; s->presence_penalty = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--frequency-penalty")) { if (num(a, val, -2, 2, false, NULL, &v)) return -1; s->frequency_penalty = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--seed")) { if (num(a, val, 0, 1.8e19, true, "[0, 2^64)", &v)) return -1; s->seed = (uint64_t)v; TAKE(); return 1; }
#undef TAKE
    return 0;
}

const char *td_common_opts_help(void) {
    return "  -m, --model DIR           Hugging Face model directory (default " TD_DEFAULT_MODEL ")\n"
           "  -t, --threads N           CPU threads, 0..1024 (default 0 = all cores)\n"
           "  -c, --max-model-len N|auto  context window, 1..16M tokens (130k = 130000, 128K = 131072); auto = largest\n"
           "                            that fits (default: the model's max_position_embeddings, at most 32768)\n"
           "  --kv-cache-dtype auto|f32|bf16|fp8  KV storage (default auto = f32 on CPU; fp8 = e4m3, per-token per-head scales)\n"
           "  --precision f32|bf16|int8 matmul activations: f32 (default, the reference), bf16 (AVX-512 BF16\n"
           "                            dot products: faster prefill) or int8 (with --quantize q8: W8A8 integer dot\n"
           "                            products, faster on AVX2); within a stated tolerance, lossless drafting kept\n"
           "  --isa auto|c|avx2|avx512  CPU kernels (default auto: the best this CPU has; all give the same tokens)\n"
           "  --quantize none|q8        q8: BF16/F16/F32 linear weights to int8 at load, BF16 scale per 32 inputs (default none)\n"
           "  --device cpu|cuda         where the model runs: cpu (default) or cuda (an NVIDIA GPU; a build with\n"
           "                            make CUDA=1); the same as --backend cpu|cuda\n"
           "  --backend cpu|guard|cuda  cpu (default; $TANDEM_BACKEND when not given); guard = the CPU ops with all\n"
           "                            engine memory unreadable by host code, for tests (slow); cuda = --device cuda\n"
           "  --enforce-eager           cuda: no CUDA graphs (default: decode, draft and verify forwards are captured\n"
           "                            once per shape and replayed; the same tokens either way)\n"
           "  --batch-invariant         cuda: every kernel in its fixed reduction order whatever the batch (greedy output at\n"
           "                            any draft depth equals depth 0 bit for bit; the CPU always is); default: matmuls of\n"
           "                            > 16 rows of BF16 weights (128 of others) on BF16 tensor cores (cuBLAS), within a\n"
           "                            stated tolerance\n"
           "  --mmap                    cpu: use the weights in place in the mapped files (default: tensors copied into\n"
           "                            transparent huge pages at load when the kernel offers them: fewer TLB misses,\n"
           "                            decode 7-13% faster measured, the same bits; --quantize makes its copies there)\n"
           "  --deltanet-chunk N        prompt DeltaNet in chunks of N tokens, 0..256 (default 0 = off: token by token,\n"
           "                            bit-exact across chunkings and prefix-cache hits)\n"
           "  --kv-cache-memory BYTES   KV cache size (e.g. 2GiB); default: what the budget leaves\n"
           "  --memory-budget BYTES|auto  memory for everything (default auto = RAM x --gpu-memory-utilization)\n"
           "  --gpu-memory-utilization F  fraction of RAM for the budget, 0.01..1 (default 0.9)\n"
           "  --no-prefix-caching       do not reuse exact prefixes across requests (default: on; --enable-prefix-caching,\n"
           "                            --no-enable-prefix-caching as in vLLM)\n"
           "  --spec-depth auto|N       MTP draft tokens per step: auto = each step picks 0..--spec-depth-max for each\n"
           "                            request from its live acceptance and the measured step costs (0 where drafting\n"
           "                            does not pay); N = fixed, 0.." TD_STR(TD_MAX_SPEC_DEPTH) " (0 = off) (default auto; off without an MTP head)\n"
           "  --spec-depth-max N        the largest depth auto picks, 1.." TD_STR(TD_MAX_SPEC_DEPTH) "; memory is planned for it (default 4)\n"
           "  --speculative-config JSON vLLM form: '{\"method\":\"mtp\",\"num_speculative_tokens\":N}'\n"
           "  --draft-sampling          sample drafts (keep q) instead of argmax drafts (default off)\n"
           "  --generation-config auto|none|DIR  sampling defaults (run, serve): auto = the model's generation_config.json,\n"
           "                            none (or vllm) = temperature 1, top_p 1, top_k off; flags below override (default auto)\n"
           "  --temperature, --temp T   0..100 (default: from --generation-config; bench: 0 = greedy)\n"
           "  --top-k K                 0..1e9 (default 0 = off)\n"
           "  --top-p P                 (0, 1] (default 1 = off)\n"
           "  --min-p P                 0..1 (default 0 = off)\n"
           "  --repetition-penalty R    0.001..100 (default 1 = off)\n"
           "  --presence-penalty P      -2..2 (default 0)\n"
           "  --frequency-penalty F     -2..2 (default 0)\n"
           "  --seed S                  0..2^64-1 (default 0)\n";
}

int td_cli_generation_defaults(common_opts *o, int argc, char **argv, int *max_new_tokens) {
    const char *gc = o->generation_config;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) o->model = argv[i + 1];
        if (!strcmp(argv[i], "--generation-config")) gc = argv[i + 1];
    }
    td_sampling *s = &o->sampling;
    td_sampling_default(s);
    s->temperature = 1.0f; /* vLLM's and OpenAI's default when nothing else says */
    if (!strcmp(gc, "none") || !strcmp(gc, "vllm")) {
        snprintf(o->sampling_source, sizeof o->sampling_source, "--generation-config %s", gc);
        return 0;
    }
    const char *dir = strcmp(gc, "auto") ? gc : o->model;
    td_gen_config g;
    td_err err = {0};
    if (td_gen_config_load(dir, 0, &g, &err)) {
        td_cli_error("tandem", &err);
        return 1;
    }
    if (!g.found) {
        if (strcmp(gc, "auto")) { fprintf(stderr, "tandem: --generation-config %s: no generation_config.json there\n", gc); return 1; }
        snprintf(o->sampling_source, sizeof o->sampling_source, "%s has no generation_config.json", dir);
        return 0;
    }
    td_gen_config_apply(&g, s, max_new_tokens);
    snprintf(o->sampling_source, sizeof o->sampling_source, "%s/generation_config.json; --generation-config none for temperature 1", dir);
    return 0;
}

void td_cli_print_sampling(const char *prefix, const common_opts *o) {
    const td_sampling *s = &o->sampling;
    char b[256];
    if (s->temperature == 0) snprintf(b, sizeof b, "greedy");
    else snprintf(b, sizeof b, "temperature %g", (double)s->temperature);
    size_t n = strlen(b);
    if (s->temperature != 0) {
        if (s->top_k) n += (size_t)snprintf(b + n, sizeof b - n, ", top_k %d", s->top_k);
        if (s->top_p < 1) n += (size_t)snprintf(b + n, sizeof b - n, ", top_p %g", (double)s->top_p);
        if (s->min_p > 0) n += (size_t)snprintf(b + n, sizeof b - n, ", min_p %g", (double)s->min_p);
    }
    if (s->repetition_penalty != 1 && n < sizeof b) snprintf(b + n, sizeof b - n, ", repetition_penalty %g", (double)s->repetition_penalty);
    fprintf(stderr, "%s: sampling defaults: %s (%s)\n", prefix, b, o->sampling_source);
}
