/* `tandem plan`: how device memory splits for a model and a serving setting,
 * whether one full-window request fits, and what would (src/plan). Exit 0
 * when it fits, 1 when it does not, 2 on bad usage. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/cli.h"
#include "cli/memory.h"
#include "plan/plan.h"

#define TD_PLAN_STR_(x) #x
#define TD_PLAN_STR(x) TD_PLAN_STR_(x)

static int usage(FILE *f) {
    fprintf(f,
            "usage: tandem plan -m DIR | --config FILE [options]\n"
            "  memory plan: weights, activations, KV cache; whether one full-window request fits (exit 0) or not (exit 1)\n"
            "  -m, --model DIR               model directory (config.json; weights measured from its safetensors)\n"
            "  --config FILE                 a config.json alone (weights estimated)\n"
            "  --quant nvfp4|fp8|bf16        weight format for the estimate (default: the checkpoint's, else nvfp4)\n"
            "  --device gpu|cpu              GPU model (default) or what the CPU engine allocates (needs -m DIR;\n"
            "                                KV f32 unless --kv-cache-dtype; --max-num-seqs 4, --max-num-batched-tokens 512 defaults)\n"
            "  --device-memory SIZE          e.g. 32GiB, 32607MiB, 34GB (default: GPU 32607MiB, an RTX 5090;\n"
            "                                CPU this machine's MemTotal, as run / serve use)\n"
            "  --gpu-memory-utilization F    fraction of the device to use, (0, 1] (default 0.90)\n"
            "  --memory-budget SIZE          CPU: memory for everything (default: --device-memory x utilization)\n"
            "  -c, --max-model-len N|auto    window, 1.. tokens; 130k = 130,000, 128K = 131,072 (default auto: largest that fits)\n"
            "  --spec-depth N                MTP draft tokens per step, 0..%d (default 0)\n"
            "  --cuda-graphs | --enforce-eager  graph memory on (default) or off (GPU)\n"
            "  --kv-cache-dtype auto|bf16|fp8  (default auto: fp8 if the checkpoint asks for it, else bf16; CPU: f32)\n"
            "  --max-num-seqs N              concurrent sequences, 1..16M (default 256; CPU 4)\n"
            "  --max-num-batched-tokens N    prefill chunk, 1..16M (default 2048; CPU 512)\n"
            "  --block-size N                KV block tokens, 1..16M (default 16)\n"
            "  --weights SIZE                total weight bytes incl. MTP instead of the estimate\n"
            "  --mtp-weights SIZE            MTP head bytes (with --weights)\n"
            "  --runtime-reserve SIZE        fixed runtime reserve (default 576MiB, calibrated; 0 = none)\n"
            "  --reference                   also replay the reference measurement (RTX 5090, Qwen3.6-27B; src/plan/README.md):\n"
            "                                needs the 27B's config, e.g. --config tests/data/configs/qwen3.6-27b.config.json\n"
            "  --json                        print the plan as JSON (bytes)\n"
            "  -v, --verbose                 errors with their source location\n"
            "  -h, --help                    this help\n",
            TD_MAX_SPEC_DEPTH);
    return f == stdout ? 0 : 2;
}

static int bad(const char *opt, const char *val, const char *want) {
    fprintf(stderr, "tandem plan: %s must be %s, got \"%s\"\n", opt, want, val ? val : "");
    return 2;
}

#define SIZE_WANT "a size such as 32GiB, 32607MiB or 34GB"

static double gib(uint64_t b) { return (double)b / TD_PLAN_GIB; }
static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static void row(const char *what, uint64_t bytes) { printf("| %-40s | %9.2f GiB | %15llu |\n", what, gib(bytes), (unsigned long long)bytes); }

static void print_table(const td_config *c, const td_plan_opts *o, const td_plan *p, const char *src, const char *wsrc) {
    printf("model: %s (%s): %d layers (%d full attention, %d Gated DeltaNet), %d MTP layer(s)\n", src, c->model_type, c->n_layers,
           c->n_full_attn, c->n_layers - c->n_full_attn, c->mtp_layers);
    printf("weights: %s\n", wsrc);
    printf("device: %.2f GiB x %.2f = %.2f GiB; KV cache %s; spec depth %d; CUDA graphs %s (%d sizes); max_num_seqs %d, "
           "max_num_batched_tokens %d\n\n",
           gib(o->device_bytes), o->gpu_util, gib(p->budget_bytes), td_kv_dtype_name(o->kv_dtype), p->spec_depth,
           o->cuda_graphs ? "on" : "off", p->n_graphs, o->max_num_seqs, o->max_num_batched_tokens);
    printf("| part                                     |           GiB |           bytes |\n|---|---|---|\n");
    row("weights: main layers", p->w.main);
    row("weights: MTP head", p->w.mtp);
    row("weights: embeddings + lm_head", p->w.embed + p->w.lm_head);
    row("activations (tokens + sampler + runtime)", p->activation_bytes);
    row("CUDA graphs", p->graph_bytes);
    row("available for KV cache", p->available_kv_bytes > 0 ? (uint64_t)p->available_kv_bytes : 0);
    printf("| %-40s | %9llu B   |                 |\n", "KV per token", (unsigned long long)p->kv_bytes_per_token);
    char s[80];
    snprintf(s, sizeof s, "DeltaNet state (%.1f MiB x %d)", mib(p->linear_state_slot_bytes), 1 + p->spec_depth);
    row(s, p->linear_state_bytes);
    snprintf(s, sizeof s, "one request (%lld tokens)", (long long)p->max_model_len);
    row(s, p->request_bytes);
    row("total (all above but available)", p->weights_bytes + p->activation_bytes + p->graph_bytes + p->request_bytes);
    printf("\n%s\n", p->message);
    if (p->fits) printf("KV cache: %.2f GiB, %lld tokens; maximum concurrency at %lld tokens: %.2fx\n", gib((uint64_t)p->available_kv_bytes),
                        (long long)p->kv_tokens, (long long)p->max_model_len, p->max_concurrency);
    printf("\n| depth | largest window |\n|---|---|\n");
    for (int d = 0; d < TD_PLAN_DEPTHS; d++) printf("| %d | %lld |\n", d, (long long)p->max_len_by_depth[d]);
}

static void print_cpu(const td_config *c, const td_plan_opts *o, const td_plan *p, const char *src) {
    printf("model: %s (%s), CPU backend: budget %.2f GiB (%.2f GiB x %.2f); KV %s; spec depth %d; max_num_seqs %d, max_num_batched_tokens %d; "
           "%d prefix checkpoints\n\n",
           src, c->model_type, gib(p->budget_bytes), gib(o->device_bytes), o->gpu_util, o->kv_dtype == TD_KV_AUTO ? "f32" : td_kv_dtype_name(o->kv_dtype), p->spec_depth,
           o->max_num_seqs, o->max_num_batched_tokens, o->prefix_checkpoints);
    printf("| part                                     |           GiB |           bytes |\n|---|---|---|\n");
    row("weights (safetensors)", p->weights_bytes);
    row("f32 copies (norms, conv1d, A, dt_bias)", p->runtime_bytes);
    row("forward scratch (largest batch)", p->scratch_bytes);
    row("session buffers (all sequences)", p->session_bytes);
    char s[80];
    snprintf(s, sizeof s, "DeltaNet state (x%d per sequence)", p->spec_depth + 2);
    row(s, p->linear_state_bytes);
    row("prefix-cache checkpoints (at most)", p->prefix_ckpt_bytes);
    snprintf(s, sizeof s, "KV pool (%lld blocks)", (long long)p->kv_blocks);
    row(s, p->kv_pool_bytes);
    row("total", p->total_bytes);
    printf("\n%s\n\n| depth | largest window |\n|---|---|\n", p->message);
    for (int d = 0; d < TD_PLAN_DEPTHS; d++) printf("| %d | %lld |\n", d, (long long)p->max_len_by_depth[d]);
}

static void print_json(const td_config *c, const td_plan_opts *o, const td_plan *p, const char *src) {
    json_t *by = json_array();
    for (int d = 0; d < TD_PLAN_DEPTHS; d++) json_array_append_new(by, json_integer(p->max_len_by_depth[d]));
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:f, s:I, s:I, s:b, s:i, s:b}", "model", src, "model_type", c->model_type,
                          "quant", td_quant_name(o->quant), "kv_cache_dtype", td_kv_dtype_name(o->kv_dtype), "device_bytes",
                          (json_int_t)o->device_bytes, "gpu_memory_utilization", o->gpu_util, "budget_bytes", (json_int_t)p->budget_bytes,
                          "max_model_len", (json_int_t)p->max_model_len, "max_model_len_auto", p->auto_len, "spec_depth", p->spec_depth,
                          "cuda_graphs", o->cuda_graphs);
#define SETI(k, v) json_object_set_new(j, k, json_integer((json_int_t)(v)))
    SETI("weights_bytes", p->weights_bytes);
    SETI("main_bytes", p->w.main);
    SETI("mtp_bytes", p->w.mtp);
    SETI("embed_bytes", p->w.embed);
    SETI("lm_head_bytes", p->w.lm_head);
    SETI("activation_bytes", p->activation_bytes);
    SETI("activation_tokens_bytes", p->act_tokens_bytes);
    SETI("activation_sampler_bytes", p->act_logits_bytes);
    SETI("runtime_bytes", p->runtime_bytes);
    SETI("graph_bytes", p->graph_bytes);
    SETI("graph_sizes", p->n_graphs);
    SETI("kv_bytes_per_token", p->kv_bytes_per_token);
    SETI("linear_state_slot_bytes", p->linear_state_slot_bytes);
    SETI("linear_state_bytes", p->linear_state_bytes);
    SETI("request_bytes", p->request_bytes);
    SETI("available_kv_bytes", p->available_kv_bytes);
    SETI("kv_tokens", p->kv_tokens);
    SETI("max_len_at_depth", p->max_len_at_depth);
    SETI("max_depth_at_len", p->max_depth_at_len);
#undef SETI
    json_object_set_new(j, "max_concurrency", json_real(p->max_concurrency));
    json_object_set_new(j, "util_needed", json_real(p->util_needed));
    json_object_set_new(j, "fits", json_boolean(p->fits));
    json_object_set_new(j, "max_len_by_depth", by);
    json_object_set_new(j, "message", json_string(p->message));
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    if (s) puts(s);
    free(s);
    json_decref(j);
}

int td_cmd_plan(int argc, char **argv) {
    const char *dir = NULL, *cfg_file = NULL;
    bool device_set = false, json = false, reference = false, quant_set = false, kv_set = false, cpu = false, seqs_set = false, batch_set = false;
    uint64_t cpu_budget = 0;
    uint64_t weights_total = 0, mtp_weights = 0;
    td_plan_opts o;
    td_plan_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (td_cli_is_help(a)) return usage(stdout);
        if (td_cli_is_verbose(a)) { td_cli_verbose = true; continue; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--reference")) { reference = true; continue; }
        if (!strcmp(a, "--cuda-graphs")) { o.cuda_graphs = true; continue; }
        if (!strcmp(a, "--enforce-eager")) { o.cuda_graphs = false; continue; }
        static const char *const valued[] = {"-m", "--model", "--device", "--memory-budget", "--config", "--quant", "--kv-cache-dtype",
                                             "--device-memory", "--gpu-memory-utilization", "--max-model-len", "-c", "--spec-depth",
                                             "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--weights", "--mtp-weights",
                                             "--runtime-reserve"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
        if (!known) return td_cli_unknown("plan", a);
        if (!v) return td_cli_missing("plan", a, "see tandem plan --help");
        i++;
        char *end;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) cpu = true;
            else if (!strcmp(v, "gpu") || !strcmp(v, "cuda")) cpu = false;
            else return bad(a, v, "gpu or cpu");
        } else if (!strcmp(a, "--memory-budget")) {
            if (!(cpu_budget = td_plan_parse_bytes(v))) return bad(a, v, SIZE_WANT);
        }
        else if (!strcmp(a, "--config")) cfg_file = v;
        else if (!strcmp(a, "--quant")) {
            quant_set = true;
            if (!strcmp(v, "nvfp4")) o.quant = TD_QUANT_NVFP4;
            else if (!strcmp(v, "fp8")) o.quant = TD_QUANT_FP8;
            else if (!strcmp(v, "bf16")) o.quant = TD_QUANT_BF16;
            else return bad(a, v, "one of nvfp4, fp8, bf16");
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            kv_set = strcmp(v, "auto") != 0;
            if (!strcmp(v, "auto")) o.kv_dtype = TD_KV_AUTO;
            else if (!strcmp(v, "bf16")) o.kv_dtype = TD_KV_BF16;
            else if (!strcmp(v, "fp8") || !strcmp(v, "fp8_e4m3")) o.kv_dtype = TD_KV_FP8;
            else return bad(a, v, "one of auto, bf16, fp8");
        } else if (!strcmp(a, "--device-memory")) {
            if (!(o.device_bytes = td_plan_parse_bytes(v))) return bad(a, v, SIZE_WANT);
            device_set = true;
        } else if (!strcmp(a, "--gpu-memory-utilization")) {
            o.gpu_util = strtod(v, &end);
            if (end == v || *end || !(o.gpu_util > 0 && o.gpu_util <= 1)) return bad(a, v, "a number in (0, 1]");
        } else if (!strcmp(a, "--max-model-len") || !strcmp(a, "-c")) {
            if (!strcmp(v, "auto") || !strcmp(v, "-1")) o.max_model_len = 0;
            else if ((o.max_model_len = td_plan_parse_tokens(v)) < 1) return bad(a, v, "a token count (130k = 130000, 128K = 131072) or auto");
        } else if (!strcmp(a, "--spec-depth") || !strcmp(a, "--max-num-seqs") || !strcmp(a, "--max-num-batched-tokens") ||
                   !strcmp(a, "--block-size")) {
            long n = strtol(v, &end, 10);
            bool depth = !strcmp(a, "--spec-depth");
            if (end == v || *end || n < (depth ? 0 : 1) || n > (depth ? TD_MAX_SPEC_DEPTH : 1 << 24))
                return bad(a, v, depth ? "an integer in [0, " TD_PLAN_STR(TD_MAX_SPEC_DEPTH) "]" : "an integer in [1, 16777216]");
            if (depth) o.spec_depth = (int)n;
            else if (!strcmp(a, "--max-num-seqs")) o.max_num_seqs = (int)n, seqs_set = true;
            else if (!strcmp(a, "--block-size")) o.block_size = (int)n;
            else o.max_num_batched_tokens = (int)n, batch_set = true;
        } else if (!strcmp(a, "--weights")) {
            if (!(weights_total = td_plan_parse_bytes(v))) return bad(a, v, SIZE_WANT);
        } else if (!strcmp(a, "--mtp-weights")) {
            if (!(mtp_weights = td_plan_parse_bytes(v))) return bad(a, v, SIZE_WANT);
        } else if (!strcmp(a, "--runtime-reserve")) {
            if (!strcmp(v, "0")) o.runtime_bytes = 0;
            else if (!(o.runtime_bytes = td_plan_parse_bytes(v))) return bad(a, v, SIZE_WANT " or 0");
        }
    }
    if (!!dir == !!cfg_file) { fprintf(stderr, "tandem plan: give exactly one of -m DIR or --config FILE (usage: tandem plan --help)\n"); return 2; }
    if (dir && td_cli_check_model_dir("tandem plan", dir)) return 2;
    if (mtp_weights && !weights_total) { fprintf(stderr, "tandem plan: --mtp-weights needs --weights\n"); return 2; }

    td_err err = {0};
    td_config *c = calloc(1, sizeof *c); /* ~1 KB of layer flags: keep it off the stack */
    if (!c) { fprintf(stderr, "tandem plan: out of memory\n"); return 1; }
    const char *src = dir ? dir : cfg_file;
    if (td_config_load(src, c, &err)) { td_cli_error("tandem plan", &err); free(c); return 2; }
    if (reference && !td_plan_reference_applies(c)) {
        fprintf(stderr, "tandem plan: --reference replays a Qwen3.6-27B measurement; %s is another model (try --config "
                        "tests/data/configs/qwen3.6-27b.config.json)\n", src);
        free(c);
        return 2;
    }

    /* A checkpoint without a quantization description is BF16; a bare config is estimated as NVFP4. */
    td_quant dq = dir ? TD_QUANT_BF16 : o.quant;
    td_kv_dtype dkv = TD_KV_AUTO;
    if (dir) td_plan_detect_quant(dir, &dq, &dkv);
    if (!quant_set) o.quant = dq;
    if (!kv_set) o.kv_dtype = dkv == TD_KV_FP8 ? TD_KV_FP8 : TD_KV_BF16;
    if (cpu) { /* what `tandem serve` allocates on the CPU backend (cli/memory.c) */
        if (!dir) { fprintf(stderr, "tandem plan: --device cpu needs -m DIR (measured weights)\n"); free(c); return 2; }
        o.backend = TD_PLAN_CPU;
        if (!kv_set) o.kv_dtype = TD_KV_AUTO; /* f32 */
        o.cuda_graphs = false;
        o.runtime_bytes = 0;
        if (!seqs_set) o.max_num_seqs = 4;
        if (!batch_set) o.max_num_batched_tokens = 512;
        /* the budget run / serve use: --memory-budget, else MemTotal x utilization */
        if (cpu_budget) o.device_bytes = cpu_budget, o.gpu_util = 1.0;
        else if (!device_set) o.device_bytes = td_cli_mem_total();
        if (!o.device_bytes) { fprintf(stderr, "tandem plan: cannot read MemTotal from /proc/meminfo; give --device-memory or --memory-budget\n"); free(c); return 2; }
        o.prefix_checkpoints = 8 * o.max_num_seqs;
        o.kv_pool_windows = cpu_budget ? 0 : 2;
    }

    char wsrc[512];
    td_plan_weights est;
    td_plan_weights_estimate(c, o.quant, &est);
    if (weights_total) {
        /* Split a reported total: embeddings and head at their BF16 size, MTP as given (or estimated), the rest main. */
        o.weights_given = true;
        o.weights.embed = est.embed;
        o.weights.lm_head = est.lm_head;
        o.weights.mtp = mtp_weights ? mtp_weights : est.mtp;
        if (weights_total < o.weights.embed + o.weights.lm_head + o.weights.mtp) {
            fprintf(stderr, "tandem plan: --weights %.2f GiB is less than embeddings + lm_head + MTP (%.2f GiB)\n", gib(weights_total),
                    gib(o.weights.embed + o.weights.lm_head + o.weights.mtp));
            free(c);
            return 2;
        }
        o.weights.main = weights_total - o.weights.embed - o.weights.lm_head - o.weights.mtp;
        snprintf(wsrc, sizeof wsrc, "given, %.2f GiB in all", gib(weights_total));
    } else if (dir && td_plan_weights_from_dir(dir, &o.weights, &err) == 0) {
        o.weights_given = true;
        o.has_mtp = o.weights.mtp > 0 && c->mtp_layers > 0;
        snprintf(wsrc, sizeof wsrc, "measured from %s's safetensors", dir);
    } else {
        snprintf(wsrc, sizeof wsrc, "estimated from the config, %s%s", td_quant_name(o.quant),
                 o.quant == TD_QUANT_BF16 ? "" : " (embeddings, lm_head, MTP head, conv1d, in_proj_a/b kept BF16)");
    }

    td_plan p;
    if (td_plan_compute(c, &o, &p, &err)) { td_cli_error("tandem plan", &err); free(c); return 2; }
    if (json) print_json(c, &o, &p, src);
    else if (cpu) print_cpu(c, &o, &p, src);
    else print_table(c, &o, &p, src, wsrc);
    if (reference && !json) { printf("\n"); td_plan_reference_report(c, stdout); }
    if (!p.fits) fprintf(stderr, "tandem plan: %s\n", p.message);
    free(c);
    return p.fits ? 0 : 1;
}
