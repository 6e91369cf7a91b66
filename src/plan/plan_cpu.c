/* Memory planner, CPU mode (issue 5 item 4): what the CPU engine allocates.
 * Every term comes from the function the engine itself sizes its buffers
 * with, so plan and engine cannot drift:
 *   weights     safetensors bytes (mapped, or copied into huge pages: the same
 *               bytes either way) + td_model_owned_bytes_for (f32 copies)
 *   KV pool     td_kv_alloc_bytes (whole 16-token blocks, f32/bf16/fp8 rows, tables)
 *   state       td_seq_state_bytes_for(depth + 1 checkpoint slots) per sequence
 *   scratch     td_fwd_scratch_bytes_for(batched tokens + seqs x (depth+1) rows)
 *   sessions    td_session_bytes_for(depth) per sequence
 *   prefix      prefix_checkpoints x td_kv_ckpt_bytes_for(window)
 *   runtime     o->runtime_bytes: 0 on the CPU; on a CUDA device what the
 *               context and libraries hold (cli/memory.c measures it), plus
 *               TD_CUDA_GEMM_BYTES in the fast mode (o->cuda_gemm: cuBLAS's
 *               workspace and the BF16 staging buffers, backend/cuda/cuda_blas.cu)
 *   graphs      CUDA graphs (o->cuda_graphs): the cache's TD_GRAPH_CACHE_MAX
 *               graphs x td_fwd_region_ops_for (nodes of a trunk forward of
 *               max_num_seqs items) x GRAPH_NODE_BYTES. The per-node figure
 *               is an estimate until a device measures it (gpu-check prints
 *               td_backend_cuda_graph_info's bytes and nodes).
 * The CUDA backend allocates the same buffers in device memory, so
 * `serve --device cuda` plans with this mode too (prefix checkpoints stay in
 * host memory there: the caller passes 0 of them).
 * See src/plan/README.md, "CPU backend". */
#include <math.h>
#include <string.h>
#include "engine/engine.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/seq.h"
#include "plan/plan.h"
#include "util/err.h"

typedef struct cpu_parts {
    uint64_t weights, owned, scratch, sessions, state, ckpt, runtime, graphs;
} cpu_parts;

/* Device memory per instantiated graph node (kernel parameters and the
 * driver's node state): an estimate, not yet measured on a GPU. */
#define GRAPH_NODE_BYTES 4096ull

/* Blocks one request of len tokens takes: its tokens, the MTP entry of the
 * last one and one spare slot (cli/memory.c's rule since the paged cache). */
static int64_t blocks_for(int64_t len, int bs) { return (len + 2 + bs - 1) / bs; }

static td_kv_shape shape_of(const td_config *c, const td_plan_opts *o) {
    return td_engine_kv_shape_for(c, o->has_mtp, o->kv_dtype);
}

static void parts_at(const td_config *c, const td_plan_opts *o, int depth, int64_t len, cpu_parts *p) {
    uint64_t S = (uint64_t)o->max_num_seqs, rows = S * (uint64_t)(depth + 1);
    const td_plan_weights *w = &o->weights;
    memset(p, 0, sizeof *p);
    p->weights = w->main + w->mtp + w->embed + (c->tie_word_embeddings ? 0 : w->lm_head);
    p->owned = td_model_owned_bytes_for(c, o->has_mtp);
    p->scratch = td_fwd_scratch_bytes_for(c, o->max_num_batched_tokens + (int)rows, (int)rows);
    p->sessions = S * td_session_bytes_for(c, depth, o->max_num_batched_tokens);
    p->state = S * td_seq_state_bytes_for(c, depth + 1);
    td_kv_shape ks = shape_of(c, o);
    p->ckpt = (uint64_t)o->prefix_checkpoints * td_kv_ckpt_bytes_for(&ks, (int)(len > 0 ? len : 0));
    p->runtime = o->runtime_bytes + (o->cuda_gemm ? TD_CUDA_GEMM_BYTES : 0);
    if (o->cuda_graphs)
        p->graphs = (uint64_t)TD_GRAPH_CACHE_MAX * (uint64_t)td_fwd_region_ops_for(c, false, (int)S, true) * GRAPH_NODE_BYTES;
}

static uint64_t parts_sum(const cpu_parts *p) {
    return p->weights + p->owned + p->scratch + p->sessions + p->state + p->ckpt + p->runtime + p->graphs;
}

static uint64_t budget_of(const td_plan_opts *o) { return (uint64_t)((double)o->device_bytes * o->gpu_util); }

/* Bytes left for the KV pool at depth (before the windows cap). */
static int64_t room_at(const td_config *c, const td_plan_opts *o, int depth, int64_t len) {
    if (o->kv_cache_bytes) return (int64_t)o->kv_cache_bytes;
    cpu_parts p;
    parts_at(c, o, depth, len, &p);
    return (int64_t)budget_of(o) - (int64_t)parts_sum(&p);
}

/* Largest window whose blocks fit the room at depth (<= max_position_embeddings). */
static int64_t max_len_at(const td_config *c, const td_plan_opts *o, int depth) {
    td_kv_shape ks = shape_of(c, o);
    uint64_t bpb = td_kv_bytes_per_block(&ks);
    int64_t cap = c->max_position_embeddings, len = cap;
    /* the prefix checkpoints grow with the window: two passes settle it */
    for (int pass = 0; pass < 3; pass++) {
        int64_t room = room_at(c, o, depth, len);
        int64_t l = room > 0 ? room / (int64_t)bpb * o->block_size - 2 : 0;
        if (l < 0) l = 0;
        if (l > cap) l = cap;
        if (l == len) break;
        len = l;
    }
    return len;
}

int td_plan_compute_cpu(const td_config *c, const td_plan_opts *o, td_plan *p, td_err *err) {
    if (!(o->gpu_util > 0.0 && o->gpu_util <= 1.0))
        return TD_FAIL(err, TD_ERR_ARG, "memory utilization %g must be in (0, 1]", o->gpu_util);
    if (o->spec_depth < 0 || o->spec_depth > TD_MAX_SPEC_DEPTH)
        return TD_FAIL(err, TD_ERR_ARG, "spec depth %d must be in [0, %d]", o->spec_depth, TD_MAX_SPEC_DEPTH);
    if (o->device_bytes == 0 && !o->kv_cache_bytes) return TD_FAIL(err, TD_ERR_ARG, "memory budget must be > 0");
    if (o->max_num_seqs < 1 || o->max_num_batched_tokens < 1 || o->block_size != TD_KV_BLOCK)
        return TD_FAIL(err, TD_ERR_ARG, "max_num_seqs and max_num_batched_tokens must be >= 1, block size %d on CPU", TD_KV_BLOCK);
    if (!o->weights_given) return TD_FAIL(err, TD_ERR_ARG, "the CPU plan needs the measured weights (-m DIR)");
    if (o->max_model_len < 0 || o->max_model_len > c->max_position_embeddings)
        return TD_FAIL(err, TD_ERR_ARG, "max_model_len %lld outside 0..%d (0 = auto)", (long long)o->max_model_len,
                       c->max_position_embeddings);
    memset(p, 0, sizeof *p);
    int d = o->spec_depth, S = o->max_num_seqs;
    td_kv_shape ks = shape_of(c, o);
    uint64_t bpb = td_kv_bytes_per_block(&ks);
    p->spec_depth = d;
    p->w = o->weights;
    if (c->tie_word_embeddings) p->w.lm_head = 0;
    p->kv_dtype_bytes = o->kv_dtype == TD_KV_FP8 ? 1 : o->kv_dtype == TD_KV_BF16 ? 2 : 4;
    p->kv_bytes_per_block = bpb;
    p->kv_bytes_per_token = bpb / (uint64_t)o->block_size;
    p->budget_bytes = budget_of(o);
    p->max_len_at_depth = max_len_at(c, o, d);
    for (int k = 0; k < TD_PLAN_DEPTHS; k++) p->max_len_by_depth[k] = max_len_at(c, o, k);
    p->auto_len = o->max_model_len == 0;
    int64_t len = p->auto_len ? p->max_len_at_depth : o->max_model_len;
    p->max_model_len = len;

    cpu_parts pt;
    parts_at(c, o, d, len, &pt);
    p->weights_bytes = pt.weights;
    p->runtime_bytes = pt.owned + pt.runtime;
    p->scratch_bytes = pt.scratch;
    p->session_bytes = pt.sessions;
    p->act_tokens_bytes = pt.scratch;
    p->activation_bytes = pt.scratch + pt.sessions;
    p->linear_state_slot_bytes = td_seq_state_bytes_for(c, 0);
    p->linear_state_bytes = pt.state;
    p->prefix_ckpt_bytes = pt.ckpt;
    p->graph_bytes = pt.graphs;
    p->n_graphs = o->cuda_graphs ? TD_GRAPH_CACHE_MAX : 0;
    int64_t room = room_at(c, o, d, len);
    p->available_kv_bytes = room;
    int64_t need_blocks = len > 0 ? blocks_for(len, o->block_size) : 0;
    p->request_bytes = (uint64_t)need_blocks * bpb;
    int64_t blocks = room > 0 ? room / (int64_t)bpb : 0;
    if (!o->kv_cache_bytes && o->kv_pool_windows > 0 && len > 0) {
        int64_t enough = need_blocks * S * o->kv_pool_windows;
        if (blocks > enough) blocks = enough;
    }
    p->kv_blocks = blocks;
    p->kv_pool_bytes = blocks > 0 ? td_kv_alloc_bytes(&ks, (int)blocks, o->prefix_checkpoints) : 0;
    p->kv_tokens = blocks * o->block_size;
    p->fits = len > 0 && blocks >= need_blocks && blocks >= 2;
    p->max_concurrency = p->request_bytes ? (double)blocks * (double)bpb / (double)p->request_bytes : 0.0;
    p->needed_bytes = parts_sum(&pt) + p->request_bytes;
    p->total_bytes = parts_sum(&pt) + p->kv_pool_bytes;
    p->max_depth_at_len = -1;
    for (int k = TD_MAX_SPEC_DEPTH; k >= 0 && p->max_depth_at_len < 0; k--)
        if (len > 0 && room_at(c, o, k, len) >= (int64_t)p->request_bytes) p->max_depth_at_len = k;
    double need = o->device_bytes ? (double)p->needed_bytes / (double)o->device_bytes : 2.0;
    p->util_needed = ceil(need * 1000.0 - 1e-9) / 1000.0;
    double g = TD_PLAN_GIB;
    if (p->fits)
        snprintf(p->message, sizeof p->message,
                 "Fits (CPU): %lld tokens at spec depth %d; KV pool %.2f GiB (%s, %d-token blocks, %lld tokens), max concurrency %.2f; "
                 "total %.2f GiB of the %.2f GiB budget.",
                 (long long)len, d, (double)p->kv_pool_bytes / g, td_kv_dtype_name(o->kv_dtype == TD_KV_AUTO ? TD_KV_F32 : o->kv_dtype),
                 o->block_size, (long long)p->kv_tokens, p->max_concurrency, (double)p->total_bytes / g, (double)p->budget_bytes / g);
    else
        snprintf(p->message, sizeof p->message,
                 "To serve one request of %lld tokens at spec depth %d, %.2f GiB of KV cache and %.2f GiB of DeltaNet state (x%d "
                 "sequences) are needed, but %.2f GiB are available for the KV cache (budget %.2f GiB - weights %.2f GiB - "
                 "activations %.2f GiB - DeltaNet state and prefix checkpoints). The largest window that fits at depth %d is %lld "
                 "tokens; the largest depth that fits is %d; a budget of %.2f GiB would make it fit.",
                 (long long)len, d, (double)p->request_bytes / g, (double)pt.state / S / g, S, room > 0 ? (double)room / g : 0.0,
                 (double)p->budget_bytes / g, (double)(pt.weights + pt.owned + pt.runtime) / g, (double)p->activation_bytes / g, d,
                 (long long)p->max_len_at_depth, p->max_depth_at_len, (double)p->needed_bytes / g + 0.005);
    return TD_OK;
}
