/* CUDA graphs for the backend's graph_run op (backend.h): the device part of
 * a decode, draft or verify forward is captured once per key and replayed,
 * so a forward costs one graph launch instead of one launch per op (a 27B
 * qwen3_5 trunk forward issues ~950 kernels and copies; their launch
 * overhead, not the GPU, bounds an eager decode step).
 *
 * The cache: up to TD_CU_MAX_GRAPHS graphs, looked up by the whole key
 * (bytes compared, no hash: a collision would replay the wrong launches);
 * when full, the least recently launched graph is destroyed. Keys hold
 * every host value the region's ops take (model/forward.c builds them), so
 * a graph is replayed only where an eager run would have issued the same
 * launches with the same arguments; per-step data (tokens, positions, block
 * tables, state slots) is read by the kernels from device memory that the
 * caller uploaded before the launch, which is why graphs are exact.
 *
 * Capture is in thread-local mode: a cudaMalloc or a synchronizing call in
 * the region is an error, and the backend's own ops that cannot be captured
 * (alloc, free, upload, download, sync, sample) abort with file:line when
 * called inside it (TD_CU_NOT_CAPTURING). */
#include "backend/cuda/cuda_internal.cuh"

static void graph_destroy(td_cu_graph *g) {
    if (g->exec) (void)cudaGraphExecDestroy(g->exec);
    free(g->key);
    memset(g, 0, sizeof *g);
}

void td_cuda_graphs_free(td_cuda *cu) {
    for (int i = 0; i < cu->n_graphs; i++) graph_destroy(&cu->graphs[i]);
    cu->n_graphs = 0;
}

/* A free entry, evicting the least recently launched graph when full. */
static td_cu_graph *graph_slot(td_backend *b, td_cuda *cu) {
    if (cu->n_graphs < TD_CU_MAX_GRAPHS) return &cu->graphs[cu->n_graphs++];
    int lru = 0;
    for (int i = 1; i < cu->n_graphs; i++)
        if (cu->graphs[i].last_use < cu->graphs[lru].last_use) lru = i;
    TD_CU(cudaStreamSynchronize(cu->stream)); /* it may still be running */
    graph_destroy(&cu->graphs[lru]);
    b->counters.graph_evictions++;
    return &cu->graphs[lru];
}

extern "C" int td_cuda_graph_run(td_backend *b, const void *key, size_t key_len, void (*fn)(void *ctx), void *ctx,
                                 td_err *err) {
    td_cuda *cu = td_cu(b);
    TD_ASSERT(!cu->capturing); /* regions do not nest */
    cu->graph_clock++;
    for (int i = 0; i < cu->n_graphs; i++) {
        td_cu_graph *g = &cu->graphs[i];
        if (g->key_len == key_len && !memcmp(g->key, key, key_len)) {
            g->last_use = cu->graph_clock;
            TD_CU(cudaGraphLaunch(g->exec, cu->stream));
            b->counters.graph_replays++;
            return TD_OK;
        }
    }
    unsigned char *k = (unsigned char *)malloc(key_len ? key_len : 1);
    if (!k) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for a graph key");
    memcpy(k, key, key_len);
    TD_CU(cudaStreamBeginCapture(cu->stream, cudaStreamCaptureModeThreadLocal));
    cu->capturing = true;
    fn(ctx);
    cu->capturing = false;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cu->stream, &graph);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(k);
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "graph capture failed: %s", cudaGetErrorString(e));
    }
    size_t nodes = 0, free0 = 0, free1 = 0, total = 0;
    TD_CU(cudaGraphGetNodes(graph, NULL, &nodes));
    TD_CU(cudaMemGetInfo(&free0, &total));
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(k);
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "graph instantiation failed: %s", cudaGetErrorString(e));
    }
    /* the executable's device memory may be set up at its first launch
       instead (cudaGraphUpload's documentation): upload it now so that the
       second reading counts it */
    TD_CU(cudaGraphUpload(exec, cu->stream));
    TD_CU(cudaStreamSynchronize(cu->stream));
    TD_CU(cudaMemGetInfo(&free1, &total));
    td_cu_graph *g = graph_slot(b, cu);
    *g = (td_cu_graph){.key = k, .key_len = key_len, .exec = exec, .last_use = cu->graph_clock, .nodes = nodes,
                       .bytes = free0 > free1 ? free0 - free1 : 0};
    TD_CU(cudaGraphLaunch(exec, cu->stream)); /* capturing ran nothing: this is the region's first run */
    b->counters.graph_captures++;
    return TD_OK;
}

extern "C" int td_backend_cuda_graph_info(td_backend *b, int *graphs, size_t *nodes, size_t *bytes) {
    *graphs = 0;
    *nodes = *bytes = 0;
    if (!b || b->ops->graph_run != td_cuda_graph_run) return TD_ERR_ARG;
    td_cuda *cu = td_cu(b);
    *graphs = cu->n_graphs;
    for (int i = 0; i < cu->n_graphs; i++) {
        *nodes += cu->graphs[i].nodes;
        *bytes += cu->graphs[i].bytes;
    }
    return TD_OK;
}
