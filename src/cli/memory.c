#include "cli/memory.h"
#include <stdint.h>
#include <string.h>
#include "kv/kv.h"
#include "model/config.h"
#include "plan/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static uint64_t mem_total(void) {
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

typedef struct {
    uint64_t weights, act, state1, bpb, total, budget;
    int max_seqs;
} mem_model;

/* DeltaNet state of one sequence at depth d: the live state plus d+1 verify checkpoints. */
static uint64_t state_bytes(const mem_model *m, int d) { return m->state1 * (uint64_t)(d + 2); }
static uint64_t blocks_for(int64_t len) { return (uint64_t)((len + 2 + TD_KV_BLOCK - 1) / TD_KV_BLOCK); }
static int64_t pool_bytes(const mem_model *m, int d, uint64_t kv_fixed) {
    if (kv_fixed) return (int64_t)kv_fixed;
    return (int64_t)m->budget - (int64_t)m->weights - (int64_t)m->act - (int64_t)m->max_seqs * (int64_t)state_bytes(m, d);
}
static int64_t max_len(const mem_model *m, int d, uint64_t kv_fixed, int64_t cap) {
    int64_t pool = pool_bytes(m, d, kv_fixed);
    if (pool <= 0) return 0;
    int64_t len = (int64_t)(pool / (int64_t)m->bpb) * TD_KV_BLOCK - 2;
    return len > cap ? cap : len < 0 ? 0 : len;
}

int cli_engine_opts(const common_opts *o, int max_seqs, td_engine_opts *eo, FILE *log, char *summary, size_t cap_summary) {
    td_err err = {0};
    td_config cfg;
    if (td_config_load(o->model, &cfg, &err)) { fprintf(log, "tandem: %s\n", err.msg); return 2; }
    td_plan_weights w;
    if (td_plan_weights_from_dir(o->model, &w, &err)) { fprintf(log, "tandem: %s\n", err.msg); return 2; }
    memset(eo, 0, sizeof *eo);
    eo->n_threads = o->threads;
    eo->spec_depth = o->spec_depth;
    eo->kv_cache_dtype = o->kv_dtype;
    eo->no_prefix_caching = !o->prefix_caching;
    eo->max_seqs = max_seqs;
    mem_model m = {.weights = w.main + w.mtp + w.embed + (cfg.tie_word_embeddings ? 0 : w.lm_head), .max_seqs = max_seqs};
    int H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size, d = o->spec_depth;
    /* scratch of a 512-token step, plus per-sequence logits/hidden buffers */
    m.act = 4ull * (512ull * (6ull * H + 3ull * I + 4ull * cfg.n_heads * cfg.head_dim) + (uint64_t)max_seqs * ((2ull * d + 4) * V + 300ull * H));
    m.state1 = (uint64_t)(cfg.n_layers - cfg.n_full_attn) *
               ((uint64_t)(cfg.conv_kernel - 1) * td_cfg_lin_conv_dim(&cfg) + (uint64_t)cfg.lin_nv * cfg.lin_dk * cfg.lin_dv) * 4;
    td_kv_shape ks = {.n_layers = cfg.n_full_attn + (cfg.mtp_layers ? 1 : 0), .kv_dim = cfg.n_kv_heads * cfg.head_dim, .head_dim = cfg.head_dim,
                      .store = (td_kv_store)o->kv_dtype};
    m.bpb = td_kv_bytes_per_block(&ks);
    m.total = mem_total();
    m.budget = o->memory_budget ? o->memory_budget : (uint64_t)((double)m.total * o->mem_util);
    int64_t cap = cfg.max_position_embeddings;
    int64_t want = o->max_model_len > 0 ? o->max_model_len : o->max_model_len_auto ? max_len(&m, d, o->kv_cache_memory, cap) : (cap < 32768 ? cap : 32768);
    if (want > cap) {
        fprintf(log, "tandem: --max-model-len %lld exceeds the model's max_position_embeddings (%lld)\n", (long long)want, (long long)cap);
        return 1;
    }
    int64_t pool = pool_bytes(&m, d, o->kv_cache_memory);
    /* Without an explicit size, keep the pool to what max_seqs full windows
     * need, twice over (the rest serves the prefix cache): on a CPU the
     * memory is shared with everything else on the machine. */
    if (!o->kv_cache_memory && !o->memory_budget) {
        int64_t enough = (int64_t)(blocks_for(want) * m.bpb) * max_seqs * 2;
        if (pool > enough) pool = enough;
    }
    uint64_t need = blocks_for(want) * m.bpb;
    if (want <= 0 || pool < (int64_t)need) {
        int64_t best_len = max_len(&m, d, o->kv_cache_memory, cap);
        int best_d = -1;
        for (int dd = TD_MAX_SPEC_DEPTH; dd >= 0 && best_d < 0; dd--)
            if (want > 0 && pool_bytes(&m, dd, o->kv_cache_memory) >= (int64_t)(blocks_for(want) * m.bpb)) best_d = dd;
        double used = (double)m.weights + (double)m.act + (double)max_seqs * (double)state_bytes(&m, d) + (double)need;
        char depth_msg[96];
        if (best_d >= 0) snprintf(depth_msg, sizeof depth_msg, "the largest depth that fits %lld tokens is %d", (long long)want, best_d);
        else snprintf(depth_msg, sizeof depth_msg, "no depth fits %lld tokens", (long long)want);
        char fix[160];
        if (o->kv_cache_memory) snprintf(fix, sizeof fix, "a larger --kv-cache-memory would make it fit");
        else if (!o->memory_budget && m.total)
            snprintf(fix, sizeof fix, "--gpu-memory-utilization %.3f (of %.2f GiB) would make it fit", used / (double)m.total, (double)m.total / GIB);
        else snprintf(fix, sizeof fix, "--memory-budget %.2fGiB would make it fit", used / GIB + 0.005);
        fprintf(log,
                "tandem: to serve one request of the model's max seq len (%lld tokens) at spec depth %d, %.2f GiB of KV cache and "
                "%.2f GiB of DeltaNet state (x%d sequences) are needed, but %.2f GiB are available for the KV cache "
                "(budget %.2f GiB - weights %.2f GiB - activations %.2f GiB - DeltaNet state). The largest window that fits at depth %d "
                "is %lld tokens; %s; %s.\n",
                (long long)want, d, (double)need / GIB, (double)state_bytes(&m, d) / GIB, max_seqs, (pool > 0 ? (double)pool : 0.0) / GIB,
                (double)m.budget / GIB, (double)m.weights / GIB, (double)m.act / GIB, d, (long long)best_len,
                depth_msg, fix);
        return 1;
    }
    eo->max_context = (int)want;
    eo->kv_cache_bytes = (size_t)pool;
    int64_t tokens = pool / (int64_t)m.bpb * TD_KV_BLOCK;
    snprintf(summary, cap_summary, "tandem: KV cache %.2f GiB (%s, %d-token blocks): %lld tokens, max concurrency %.2f at the full window (%lld tokens, depth %d)\n",
            (double)pool / GIB, o->kv_dtype == 0 ? "f32" : o->kv_dtype == 1 ? "bf16" : "fp8", TD_KV_BLOCK, (long long)tokens,
            (double)pool / (double)need, (long long)want, d);
    return 0;
}
