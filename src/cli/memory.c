#include "cli/memory.h"
#include "cli/cli.h"
#include <stdint.h>
#include <string.h>
#include "kv/kv.h"
#include "model/config.h"
#include "plan/plan.h"
#include "backend/backend.h"
#include "engine/engine.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

uint64_t td_cli_mem_total(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) break;
        fclose(f);
    }
    return (uint64_t)kb * 1024;
}

/* Plan options for this command line at spec depth d (the CPU mode of the
 * planner: the same byte counts the engine allocates with). */
static void plan_opts(const common_opts *o, const td_config *cfg, const td_plan_weights *w, bool has_mtp, int max_seqs,
                      int batch_tokens, uint64_t budget, int depth, td_plan_opts *po) {
    td_plan_opts_default(po);
    po->backend = TD_PLAN_CPU;
    po->kv_dtype = o->kv_dtype;
    po->device_bytes = budget;
    po->gpu_util = 1.0;
    po->cuda_graphs = false;
    po->runtime_bytes = 0;
    po->spec_depth = depth;
    po->max_num_seqs = max_seqs;
    po->max_num_batched_tokens = batch_tokens;
    po->block_size = TD_KV_BLOCK;
    po->weights_given = true;
    po->weights = *w;
    po->has_mtp = has_mtp;
    po->kv_cache_bytes = o->kv_cache_memory;
    /* Without an explicit size, keep the pool to what max_seqs full windows
     * need, twice over (the rest serves the prefix cache): on a CPU the
     * memory is shared with everything else on the machine. */
    po->kv_pool_windows = !o->kv_cache_memory && !o->memory_budget ? 2 : 0;
    po->prefix_checkpoints = o->prefix_caching ? 8 * max_seqs : 0;
    (void)cfg;
}

/* --device cuda: the device's memory as cudaMemGetInfo reports it, read
 * through a short-lived CUDA backend before the model loads (so a window that
 * does not fit is refused before any weight moves). *runtime = what is in use
 * already (our context, and anything else on the device). */
static int cuda_memory(FILE *log, uint64_t *total, uint64_t *runtime) {
    td_err err = {0};
    td_backend *b = NULL;
    if (td_backend_create("cuda", 1, &b, &err)) { fprintf(log, "tandem: %s\n", td_cli_errmsg(&err)); return 1; }
    size_t fr = 0, tot = 0;
    int rc = td_backend_cuda_mem_info(b, &fr, &tot);
    td_backend_free(b);
    if (rc || tot == 0) { fprintf(log, "tandem: cannot read the CUDA device's memory (cudaMemGetInfo)\n"); return 1; }
    *total = tot;
    *runtime = tot - fr;
    return 0;
}

int td_cli_engine_spec_depth(const common_opts *o) {
    if (!o->spec_auto) return o->spec_depth;
    td_err err = {0};
    td_config cfg;
    td_plan_weights w;
    if (td_config_load(o->model, &cfg, &err) || td_plan_weights_from_dir(o->model, &w, &err)) return o->spec_depth; /* reported at load */
    return w.mtp > 0 && cfg.mtp_layers > 0 ? o->spec_depth : 0;
}

int td_cli_engine_opts(const common_opts *o, int max_seqs, int batch_tokens, td_engine_opts *eo, FILE *log, char *summary, size_t cap_summary) {
    td_err err = {0};
    td_config cfg;
    if (td_config_load(o->model, &cfg, &err)) { fprintf(log, "tandem: %s\n", td_cli_errmsg(&err)); return 2; }
    td_plan_weights w;
    if (td_plan_weights_from_dir(o->model, &w, &err)) { fprintf(log, "tandem: %s\n", td_cli_errmsg(&err)); return 2; }
    memset(eo, 0, sizeof *eo);
    eo->n_threads = o->threads;
    bool has_mtp = w.mtp > 0 && cfg.mtp_layers > 0;
    eo->spec_depth = o->spec_auto && !has_mtp ? 0 : o->spec_depth; /* auto without an MTP head: off */
    eo->kv_cache_dtype = o->kv_dtype;
    eo->quantize = o->quantize;
    eo->precision = o->precision;
    eo->isa = o->isa;
    eo->deltanet_chunk = o->deltanet_chunk;
    eo->enforce_eager = o->enforce_eager;
    eo->batch_invariant = o->batch_invariant;
    eo->mmap_weights = o->mmap_weights;
    eo->backend = o->backend;
    eo->max_prefill_chunk = batch_tokens; /* one chunk may use the whole step budget */
    if (o->quantize) {
        /* the int8 copies (1.0625 bytes per weight: int8 and a BF16 scale per 32) come on top of
         * the mapped file, which stays counted: a conservative 9/16 of the BF16 bytes (17/32 and
         * the norms and embedding, which are not quantized, included) */
        w.main += w.main * 9 / 16;
        w.mtp += w.mtp * 9 / 16;
        w.lm_head += w.lm_head * 9 / 16;
    }
    eo->no_prefix_caching = !o->prefix_caching;
    eo->max_seqs = max_seqs;
    int d = eo->spec_depth;
    bool cuda = o->backend && !strcmp(o->backend, "cuda");
    uint64_t total = 0, runtime = 0;
    if (cuda) {
        /* the device, not RAM: budget = total x --gpu-memory-utilization as in vLLM, and
         * what the context (and any other process) already holds is planned as runtime */
        if (cuda_memory(log, &total, &runtime)) return 1;
    } else total = td_cli_mem_total();
    uint64_t budget = o->memory_budget ? o->memory_budget : (uint64_t)((double)total * o->mem_util);
    if (cuda && runtime >= budget) {
        fprintf(log, "tandem: the CUDA device has %.2f GiB in use of %.2f GiB already, more than --gpu-memory-utilization %.2f "
                "allows (%.2f GiB); raise it or free the device\n", (double)runtime / GIB, (double)total / GIB, o->mem_util,
                (double)budget / GIB);
        return 1;
    }
    int64_t cap = cfg.max_position_embeddings;
    if (o->max_model_len > cap) {
        fprintf(log, "tandem: --max-model-len %lld exceeds the model's max_position_embeddings (%lld)\n", (long long)o->max_model_len, (long long)cap);
        return 1;
    }
    td_plan_opts po;
    plan_opts(o, &cfg, &w, has_mtp, max_seqs, batch_tokens, budget, d, &po);
    if (cuda) {
        /* the engine's buffers are device memory; its prefix-cache checkpoints stay in
         * host memory; the pool takes what is left, as vLLM's does; KV bf16 unless asked */
        po.runtime_bytes = runtime;
        po.cuda_graphs = !o->enforce_eager; /* the graph cache's device memory (plan_cpu.c) */
        po.cuda_gemm = !o->batch_invariant;  /* the fast GEMM's staging buffers (TD_CUDA_GEMM_BYTES) */
        po.prefix_checkpoints = 0;
        po.kv_pool_windows = 0;
        if (po.kv_dtype == TD_KV_AUTO) po.kv_dtype = TD_KV_BF16;
        eo->kv_cache_dtype = po.kv_dtype;
    }
    po.max_model_len = o->max_model_len > 0 ? o->max_model_len : o->max_model_len_auto ? 0 : (cap < 32768 ? cap : 32768);
    td_plan p;
    if (td_plan_compute(&cfg, &po, &p, &err)) { fprintf(log, "tandem: %s\n", td_cli_errmsg(&err)); return 1; }
    int64_t want = p.max_model_len;
    if (!p.fits) {
        char depth_msg[96];
        if (p.max_depth_at_len >= 0) snprintf(depth_msg, sizeof depth_msg, "the largest depth that fits %lld tokens is %d", (long long)want, p.max_depth_at_len);
        else snprintf(depth_msg, sizeof depth_msg, "no depth fits %lld tokens", (long long)want);
        char fix[160];
        double used = (double)p.needed_bytes;
        if (o->kv_cache_memory) snprintf(fix, sizeof fix, "a larger --kv-cache-memory would make it fit");
        else if (!o->memory_budget && total && used > (double)total)
            snprintf(fix, sizeof fix, "no --gpu-memory-utilization would make it fit (%.2f GiB needed, %.2f GiB in all)", used / GIB,
                     (double)total / GIB);
        else if (!o->memory_budget && total)
            snprintf(fix, sizeof fix, "--gpu-memory-utilization %.3f (of %.2f GiB) would make it fit", used / (double)total, (double)total / GIB);
        else snprintf(fix, sizeof fix, "--memory-budget %.2fGiB would make it fit", used / GIB + 0.005);
        int64_t pool = p.available_kv_bytes;
        char graphs_msg[64] = "";
        if (p.graph_bytes) snprintf(graphs_msg, sizeof graphs_msg, " - CUDA graphs %.2f GiB", (double)p.graph_bytes / GIB);
        fprintf(log,
                "tandem: to serve one request of the model's max seq len (%lld tokens) at spec depth %d%s, %.2f GiB of KV cache and "
                "%.2f GiB of DeltaNet state (x%d sequences) are needed, but %.2f GiB are available for the KV cache "
                "(budget %.2f GiB - weights %.2f GiB - activations %.2f GiB%s - DeltaNet state). The largest window that fits at depth %d "
                "is %lld tokens; %s; %s.\n",
                (long long)want, d, cuda ? " on the CUDA device" : "", (double)p.request_bytes / GIB, (double)p.linear_state_bytes / max_seqs / GIB, max_seqs,
                (pool > 0 ? (double)pool : 0.0) / GIB, (double)p.budget_bytes / GIB, (double)(p.weights_bytes + p.runtime_bytes) / GIB,
                (double)p.activation_bytes / GIB, graphs_msg, d, (long long)p.max_len_at_depth, depth_msg, fix);
        return 1;
    }
    eo->max_context = (int)want;
    eo->kv_cache_bytes = (size_t)p.kv_blocks * (size_t)p.kv_bytes_per_block;
    snprintf(summary, cap_summary, "tandem: KV cache %.2f GiB (%s, %d-token blocks): %lld tokens, max concurrency %.2f at the full window (%lld tokens, depth %d)%s\n",
            (double)eo->kv_cache_bytes / GIB, td_kv_dtype_name(o->kv_dtype == TD_KV_AUTO ? TD_KV_F32 : o->kv_dtype), TD_KV_BLOCK, (long long)p.kv_tokens,
            p.max_concurrency, (long long)want, d, o->quantize ? "; linear weights quantized to q8 at load" : "");
    return 0;
}

void td_cli_print_cuda_mode(FILE *log, const char *who, td_engine *eng) {
    const char *mode = td_backend_cuda_mode(td_engine_backend(eng));
    if (mode) fprintf(log, "%s: cuda: %s\n", who, mode);
}
