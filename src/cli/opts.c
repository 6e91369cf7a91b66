#include "cli/opts.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plan/plan.h"

void common_opts_init(common_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = TD_DEFAULT_MODEL;
    o->mem_util = 0.9;
    o->prefix_caching = true;
    td_sampling_default(&o->sampling);
}

long parse_size_suffix(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    if (*end == 'k' || *end == 'K') v *= 1024, end++;
    else if (*end == 'm' || *end == 'M') v *= 1024 * 1024, end++;
    if (*end || v > 1e12) return -1;
    return (long)v;
}

static int bad(const char *opt, const char *val) {
    fprintf(stderr, "tandem: invalid value \"%s\" for %s\n", val ? val : "", opt);
    return -1;
}

static int num(const char *opt, const char *val, double lo, double hi, double *out) {
    char *end;
    if (!val) return bad(opt, val);
    double v = strtod(val, &end);
    if (end == val || *end || !(v >= lo && v <= hi)) return bad(opt, val);
    *out = v;
    return 0;
}

/* vLLM's --speculative-config '{"method":"mtp","num_speculative_tokens":N}' */
static int speculative_config(common_opts *o, const char *val) {
    json_error_t je;
    json_t *j = json_loads(val ? val : "", 0, &je);
    if (!json_is_object(j)) { json_decref(j); return bad("--speculative-config", val); }
    const char *method = json_string_value(json_object_get(j, "method"));
    json_t *n = json_object_get(j, "num_speculative_tokens");
    int rc = 0;
    if (method && strcmp(method, "mtp") != 0 && strcmp(method, "qwen3_next_mtp") != 0) {
        fprintf(stderr, "tandem: --speculative-config method \"%s\" is not supported (only \"mtp\")\n", method);
        rc = -1;
    } else if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > TD_MAX_SPEC_DEPTH) {
        rc = bad("--speculative-config num_speculative_tokens", val);
    } else {
        o->spec_depth = (int)json_integer_value(n);
    }
    json_decref(j);
    return rc;
}

int common_opts_parse(common_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    double v;
#define TAKE() (*i)++
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!val) return bad(a, val); o->model = val; TAKE(); return 1; }
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (num(a, val, 0, 1024, &v)) return -1; o->threads = (int)v; TAKE(); return 1; }
    if (!strcmp(a, "--max-model-len") || !strcmp(a, "-c")) {
        if (val && !strcmp(val, "auto")) { o->max_model_len_auto = true; o->max_model_len = 0; TAKE(); return 1; }
        int64_t n = val ? td_plan_parse_tokens(val) : -1; /* vLLM's convention: k = 1000, K = 1024 */
        if (n < 1 || n > (1 << 24)) return bad(a, val);
        o->max_model_len = (int)n; TAKE(); return 1;
    }
    if (!strcmp(a, "--kv-cache-dtype")) {
        if (!val) return bad(a, val);
        if (!strcmp(val, "auto") || !strcmp(val, "f32") || !strcmp(val, "float32")) o->kv_dtype = 0;
        else if (!strcmp(val, "bf16") || !strcmp(val, "bfloat16")) o->kv_dtype = 1;
        else if (!strcmp(val, "fp8") || !strcmp(val, "fp8_e4m3")) o->kv_dtype = 2;
        else return bad(a, val);
        TAKE(); return 1;
    }
    if (!strcmp(a, "--deltanet-chunk")) {
        int n = val ? atoi(val) : -1;
        if (n < 0 || n > 256) return bad(a, val);
        o->deltanet_chunk = n; TAKE(); return 1;
    }
    if (!strcmp(a, "--quantize")) {
        if (!val) return bad(a, val);
        if (!strcmp(val, "none")) o->quantize = 0;
        else if (!strcmp(val, "q8")) o->quantize = 1;
        else return bad(a, val);
        TAKE(); return 1;
    }
    if (!strcmp(a, "--kv-cache-memory") || !strcmp(a, "--memory-budget")) {
        bool kvm = !strcmp(a, "--kv-cache-memory");
        if (val && !kvm && !strcmp(val, "auto")) { o->memory_budget = 0; TAKE(); return 1; }
        uint64_t b = val ? td_plan_parse_bytes(val) : 0;
        if (!b) return bad(a, val);
        if (kvm) o->kv_cache_memory = b; else o->memory_budget = b;
        TAKE(); return 1;
    }
    if (!strcmp(a, "--gpu-memory-utilization")) { if (num(a, val, 0.01, 1, &v)) return -1; o->mem_util = v; TAKE(); return 1; }
    if (!strcmp(a, "--no-prefix-caching") || !strcmp(a, "--no-enable-prefix-caching")) { o->prefix_caching = false; return 1; }
    if (!strcmp(a, "--enable-prefix-caching")) { o->prefix_caching = true; return 1; }
    if (!strcmp(a, "--spec-depth")) { if (num(a, val, 0, TD_MAX_SPEC_DEPTH, &v) || v != (int)v) return bad(a, val); o->spec_depth = (int)v; TAKE(); return 1; }
    if (!strcmp(a, "--speculative-config")) { if (speculative_config(o, val)) return -1; TAKE(); return 1; }
    if (!strcmp(a, "--draft-sampling")) { o->draft_sampling = true; return 1; }
    td_sampling *s = &o->sampling;
    if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) { if (num(a, val, 0, 100, &v)) return -1; s->temperature = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--top-k")) { if (num(a, val, 0, 1e9, &v)) return -1; s->top_k = (int)v; TAKE(); return 1; }
    if (!strcmp(a, "--top-p")) { if (num(a, val, 1e-9, 1, &v)) return -1; s->top_p = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--min-p")) { if (num(a, val, 0, 1, &v)) return -1; s->min_p = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--repetition-penalty")) { if (num(a, val, 1e-3, 100, &v)) return -1; s->repetition_penalty = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--presence-penalty")) { if (num(a, val, -2, 2, &v)) return -1; s->presence_penalty = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--frequency-penalty")) { if (num(a, val, -2, 2, &v)) return -1; s->frequency_penalty = (float)v; TAKE(); return 1; }
    if (!strcmp(a, "--seed")) { if (num(a, val, 0, 1.8e19, &v)) return -1; s->seed = (uint64_t)v; TAKE(); return 1; }
#undef TAKE
    return 0;
}

const char *common_opts_help(void) {
    return "  -m, --model DIR           Hugging Face model directory (default " TD_DEFAULT_MODEL ")\n"
           "  -t, --threads N           CPU threads (default: all cores)\n"
           "  -c, --max-model-len N|auto  context window (130k = 130000, 128K = 131072); auto = largest that fits\n"
           "  --kv-cache-dtype auto|bf16|fp8   KV storage (auto = f32 on CPU; fp8 = e4m3, per-token per-head scales)\n"
           "  --quantize none|q8        q8: BF16/F16/F32 linear weights to int8 at load, F32 scale per 32 inputs\n"
           "  --deltanet-chunk N        prompt DeltaNet in chunks of N tokens (chunked form; 0 = off: token by token,\n"
           "                            bit-exact across chunkings and prefix-cache hits)\n"
           "  --kv-cache-memory BYTES   KV cache size (e.g. 2GiB); default: what the budget leaves\n"
           "  --memory-budget BYTES|auto  memory for everything (auto = RAM x --gpu-memory-utilization, default 0.9)\n"
           "  --no-prefix-caching       do not reuse exact prefixes across requests (on by default)\n"
           "  --spec-depth N            MTP draft tokens per step (0 = off, up to 16)\n"
           "  --speculative-config JSON vLLM form: '{\"method\":\"mtp\",\"num_speculative_tokens\":N}'\n"
           "  --draft-sampling          sample drafts (keep q) instead of argmax drafts\n"
           "  --temperature T  --top-k K  --top-p P  --min-p P\n"
           "  --repetition-penalty R  --presence-penalty P  --frequency-penalty F  --seed S\n";
}
