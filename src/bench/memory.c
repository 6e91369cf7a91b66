/* --memory: the planner's numbers (src/plan) for each depth next to what
 * this process measured. */
#include <stdlib.h>
#include <string.h>
#include "bench/runner.h"
#include "plan/plan.h"
#include "util/err.h"

static uint64_t status_kb(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') { v = strtoull(line + kl + 1, NULL, 10); break; }
    fclose(f);
    return v * 1024;
}

uint64_t td_bench_vm_hwm(void) { return status_kb("/proc/self/status", "VmHWM"); }
uint64_t td_bench_vm_rss(void) { return status_kb("/proc/self/status", "VmRSS"); }

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

int td_bench_memory_report(FILE *f, const char *dir, const bench_suite *su, int window, uint64_t session_bytes, const td_kv_info *kv,
                        const uint64_t *rss_after, td_err *err) {
    td_config cfg;
    int rc = td_config_load(dir, &cfg, err);
    if (rc) return rc;
    td_plan_opts o;
    td_plan_opts_default(&o);
    td_plan_detect_quant(dir, &o.quant, &o.kv_dtype);
    if (o.kv_dtype == TD_KV_AUTO) o.kv_dtype = TD_KV_BF16;
    td_err werr = {0};
    if (td_plan_weights_from_dir(dir, &o.weights, &werr) == 0) o.weights_given = true;
    uint64_t ram = status_kb("/proc/meminfo", "MemTotal");
    if (ram) o.device_bytes = ram;
    o.gpu_util = 0.9;
    o.cuda_graphs = false;
    o.max_num_seqs = 1;
    o.max_num_batched_tokens = 512;
    o.max_model_len = window;
    fprintf(f, "\n## Memory\n\nPlan (src/plan) for one request of %d tokens (the longest prompt plus max_tokens), KV %s, weights %s, "
               "device = this machine's RAM (%.1f GiB) x 0.9, no CUDA graphs. Measured on this engine: one request's KV blocks at "
               "the engine's KV dtype plus DeltaNet state and verify checkpoints (allocated for the engine's largest depth, so "
               "equal for every depth), and the resident set after the requests of each depth.\n\n"
               "| depth | plan: weights MiB | plan: KV B/token | plan: DeltaNet state MiB | plan: request MiB | plan: fits | "
               "measured: session MiB | measured: RSS MiB |\n|---|---|---|---|---|---|---|---|\n",
            window, td_kv_dtype_name(o.kv_dtype), o.weights_given ? "from the safetensors headers" : "estimated",
            (double)o.device_bytes / TD_PLAN_GIB);
    for (int d = 0; d < su->n_depths; d++) {
        o.spec_depth = su->depths[d];
        td_plan p;
        if ((rc = td_plan_compute(&cfg, &o, &p, err))) return rc;
        char rss[32] = "-";
        if (rss_after && rss_after[d]) snprintf(rss, sizeof rss, "%.1f", mib(rss_after[d]));
        fprintf(f, "| %d | %.1f | %llu | %.3f | %.3f | %s | %.3f | %s |\n", su->depths[d], mib(p.weights_bytes),
                (unsigned long long)p.kv_bytes_per_token, mib(p.linear_state_bytes), mib(p.request_bytes), p.fits ? "yes" : "no",
                mib(session_bytes), rss);
    }
    if (kv)
        fprintf(f, "\nEngine KV cache: %d blocks of %d tokens, %zu B a block (%.1f B a token), %.1f MiB in all; DeltaNet state "
                   "%.3f MiB a sequence.\n",
                kv->n_blocks, kv->block_size, kv->bytes_per_block,
                kv->block_size ? (double)kv->bytes_per_block / kv->block_size : 0.0, mib(kv->bytes_total), mib(kv->deltanet_state_bytes));
    fprintf(f, "\nProcess peak resident set (VmHWM): %.1f MiB; now (VmRSS): %.1f MiB.\n", mib(td_bench_vm_hwm()), mib(td_bench_vm_rss()));
    return TD_OK;
}
