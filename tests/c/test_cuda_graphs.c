/* CUDA graphs (the backend's graph_run op, cuda_graph.cu, and the graph
 * regions of model/forward.c) against eager issue, on the CUDA backend:
 *  - the cache itself: a region is captured once per key and replayed
 *    without calling its function again; a replay reads the buffers as they
 *    are at launch (not at capture); keys are compared whole; past 64 graphs
 *    the least recently launched is evicted and later captured again; the
 *    ops a graph cannot hold (alloc, free, upload, download, sync) abort
 *    when issued inside a region;
 *  - the engine: greedy generation at depths 0, 1 and 3 (decode, MTP draft
 *    and verify forwards through graphs) gives the same tokens and the same
 *    logits, bit for bit, as the engine with enforce_eager, and graphs were
 *    captured and replayed (counters); two requests at different positions
 *    decoded in one batch give their solo tokens (a replayed graph reads
 *    each step's positions, block tables and state slots from device
 *    memory).
 * The CUDA backend runs where it exists: on a GPU, or on the CPU under the
 * emulator (make cuemu; tests/cuemu). Without it (CUDA=0, or no device) the
 * test checks the one-line error and stops. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "spec/calibrate.h"
#include "spec/gen.h"

#define MODEL "tests/golden/tiny-a/f32"

/* ---- the cache, directly ---- */

typedef struct {
    td_backend *b;
    float *dst;
    const float *src;
    size_t n;
    int calls;
    int illegal; /* 0: a plain copy; 1 alloc, 2 free, 3 upload, 4 download, 5 sync inside the region */
} copy_region;

static void copy_fn(void *p) {
    copy_region *r = p;
    r->calls++;
    td_backend *b = r->b;
    float h[4] = {0};
    switch (r->illegal) {
    case 1: (void)b->ops->alloc(b, 64); break;
    case 2: b->ops->free(b, r->dst); break;
    case 3: b->ops->upload(b, r->dst, h, sizeof h); break;
    case 4: b->ops->download(b, h, r->src, sizeof h); break;
    case 5: b->ops->sync(b); break;
    }
    b->ops->copy(b, r->dst, r->src, r->n * sizeof(float));
}

static bool dev_equals(td_backend *b, const float *d, const float *h, size_t n) {
    float *t = malloc(n * sizeof *t);
    b->ops->download(b, t, d, n * sizeof *t);
    bool eq = memcmp(t, h, n * sizeof *t) == 0;
    free(t);
    return eq;
}

static void test_cache(td_backend *b) {
    enum { N = 1000 };
    float *h = malloc(N * sizeof *h), *junk = malloc(N * sizeof *junk);
    for (int i = 0; i < N; i++) h[i] = (float)i * 0.5f, junk[i] = -1.0f;
    float *src = b->ops->alloc(b, N * sizeof(float)), *dst = b->ops->alloc(b, N * sizeof(float));
    b->ops->upload(b, src, h, N * sizeof(float));
    td_backend_counters c0 = b->counters;
    copy_region r = {.b = b, .dst = dst, .src = src, .n = N};
    td_err err = {0};
    int key = 1;
    CHECK(td_bk_graph(b, false, &key, sizeof key, copy_fn, &r, &err) == 0, "%s", err.msg);
    CHECK(r.calls == 1 && dev_equals(b, dst, h, N), "first run of a key: captured, run once (calls %d)", r.calls);
    b->ops->upload(b, dst, junk, N * sizeof(float));
    CHECK(td_bk_graph(b, false, &key, sizeof key, copy_fn, &r, &err) == 0, "%s", err.msg);
    CHECK(r.calls == 1 && dev_equals(b, dst, h, N), "same key: replayed without calling fn (calls %d)", r.calls);
    for (int i = 0; i < N; i++) h[i] += 1.0f;
    b->ops->upload(b, src, h, N * sizeof(float));
    CHECK(td_bk_graph(b, false, &key, sizeof key, copy_fn, &r, &err) == 0, "%s", err.msg);
    CHECK(dev_equals(b, dst, h, N), "a replay reads the source as it is at launch");
    td_backend_counters c1 = b->counters;
    CHECK(c1.graph_captures - c0.graph_captures == 1 && c1.graph_replays - c0.graph_replays == 2,
          "1 capture, 2 replays (%llu, %llu)", (unsigned long long)(c1.graph_captures - c0.graph_captures),
          (unsigned long long)(c1.graph_replays - c0.graph_replays));
    /* a key is compared whole: a longer key with the same first bytes is another graph */
    int key2[2] = {1, 0};
    CHECK(td_bk_graph(b, false, key2, sizeof key2, copy_fn, &r, &err) == 0 && r.calls == 2, "longer key: captured (calls %d)", r.calls);
    /* eager: fn runs every time, nothing captured */
    CHECK(td_bk_graph(b, true, &key, sizeof key, copy_fn, &r, &err) == 0 && r.calls == 3, "eager: fn called (calls %d)", r.calls);
    /* 64 graphs at most: 70 more keys evict the least recently used, key 1 first */
    for (int k = 100; k < 170; k++) CHECK(td_bk_graph(b, false, &k, sizeof k, copy_fn, &r, &err) == 0, "%s", err.msg);
    int graphs = 0;
    size_t nodes = 0, bytes = 0;
    CHECK(td_backend_cuda_graph_info(b, &graphs, &nodes, &bytes) == 0, "graph info");
    td_backend_counters c2 = b->counters;
    CHECK(graphs == 64 && nodes == 64 && c2.graph_evictions - c1.graph_evictions == 8, "64 graphs of one copy node each, 8 evicted (%d, %zu, %llu)",
          graphs, nodes, (unsigned long long)(c2.graph_evictions - c1.graph_evictions));
    int calls = r.calls;
    CHECK(td_bk_graph(b, false, &key, sizeof key, copy_fn, &r, &err) == 0 && r.calls == calls + 1, "an evicted key is captured again");
    /* an overlapping copy in a region goes through the backend's scratch buffer; when that buffer
       grows later (outside any region) the graphs are dropped, not replayed on the freed one */
    {
        float *buf = b->ops->alloc(b, N * sizeof(float));
        b->ops->upload(b, buf, h, N * sizeof(float));
        b->ops->copy(b, buf + 1, buf, 100 * sizeof(float)); /* eager: the scratch buffer is made (400 bytes or more) */
        copy_region ov = {.b = b, .dst = buf + 1, .src = buf, .n = 100};
        int k = 3000;
        CHECK(td_bk_graph(b, false, &k, sizeof k, copy_fn, &ov, &err) == 0 && ov.calls == 1, "overlapping copy captured");
        CHECK(td_bk_graph(b, false, &k, sizeof k, copy_fn, &ov, &err) == 0 && ov.calls == 1, "overlapping copy replayed (calls %d)", ov.calls);
        CHECK(td_backend_cuda_graph_info(b, &graphs, &nodes, &bytes) == 0 && graphs > 0, "graphs held (%d)", graphs);
        b->ops->copy(b, buf + 1, buf, (N - 1) * sizeof(float)); /* the scratch buffer grows */
        CHECK(td_backend_cuda_graph_info(b, &graphs, &nodes, &bytes) == 0 && graphs == 0, "graphs dropped when the scratch grows (%d)",
              graphs);
        float *want = malloc(N * sizeof *want);
        b->ops->upload(b, buf, h, N * sizeof(float));
        memcpy(want, h, N * sizeof *want);
        memmove(want + 1, want, 100 * sizeof *want);
        CHECK(td_bk_graph(b, false, &k, sizeof k, copy_fn, &ov, &err) == 0 && ov.calls == 2 && dev_equals(b, buf, want, N),
              "the region is captured again and copies right (calls %d)", ov.calls);
        free(want);
        b->ops->free(b, buf);
    }
    /* what a graph cannot hold aborts (a broken invariant, with file:line) */
    for (int ill = 1; ill <= 5; ill++) {
        pid_t pid = fork();
        if (pid == 0) {
            signal(SIGABRT, SIG_DFL);
            copy_region bad = {.b = b, .dst = dst, .src = src, .n = N, .illegal = ill};
            int k = 1000 + ill;
            (void)td_bk_graph(b, false, &k, sizeof k, copy_fn, &bad, &err);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "op %d inside a region aborts (status %d)", ill, st);
    }
    b->ops->free(b, src);
    b->ops->free(b, dst);
    free(h);
    free(junk);
}

/* ---- the engine ---- */

static td_engine *load(bool eager, int max_seqs) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 1, .spec_depth = 3, .max_context = 160, .max_seqs = max_seqs, .backend = "cuda",
                        .enforce_eager = eager};
    td_engine *e = NULL;
    int rc = td_engine_load(MODEL, &o, &e, &err);
    CHECK(rc == 0, "%s on cuda (eager %d): %s", MODEL, eager, err.msg);
    return e;
}

#define NGEN 24
typedef struct {
    int32_t t[NGEN + 8];
    uint64_t h[NGEN + 8]; /* FNV-1a of each token's logits row */
    int n, vocab;
} toks;

static int keep(void *u, int32_t t, const float *row) {
    toks *k = u;
    if (k->n >= NGEN + 8) return 0;
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)row;
    for (size_t i = 0; row && i < (size_t)k->vocab * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ull;
    k->t[k->n] = t;
    k->h[k->n++] = h;
    return 0;
}

/* Greedy generation of n requests stepped together (n = 1: solo); request i
 * joins at step start[i] (NULL: all at once). */
static void generate_at(td_engine *e, int n, const int32_t *const *prompts, const int *lens, const int *start, int depth, bool logits,
                        toks *out) {
    td_err err = {0};
    td_session *s[2];
    td_gen *g[2];
    td_sampling sp;
    td_sampling_default(&sp);
    sp.temperature = 0;
    td_gen_opts go = {.max_tokens = NGEN, .spec_depth = depth, .ignore_eos = true, .want_logits = logits};
    bool begun[2] = {false, false};
    for (int step = 0;; step++) {
        for (int i = 0; i < n; i++) {
            if (begun[i] || (start && step < start[i])) continue;
            out[i].n = 0;
            out[i].vocab = e->model->cfg.vocab_size;
            CHECK(td_session_new(e, &s[i], &err) == 0, "%s", err.msg);
            CHECK(td_gen_begin(s[i], prompts[i], lens[i], &sp, &go, keep, &out[i], &g[i], &err) == 0, "%s", err.msg);
            begun[i] = true;
        }
        td_gen *live[2];
        int m = 0;
        for (int i = 0; i < n; i++)
            if (begun[i] && !td_gen_done(g[i])) live[m++] = g[i];
        if (!m && begun[0] && (n < 2 || begun[1])) break;
        if (!m) continue;
        for (int i = 0; i < m; i++) CHECK(td_gen_reserve_step(live[i], 64, &err) == 0, "%s", err.msg);
        if (td_gen_step(live, m, 64, &err)) {
            CHECK(0, "step: %s", err.msg);
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        td_gen_end(g[i]);
        td_session_free(s[i]);
    }
}

static void generate(td_engine *e, int n, const int32_t *const *prompts, const int *lens, int depth, bool logits, toks *out) {
    generate_at(e, n, prompts, lens, NULL, depth, logits, out);
}

static bool same(const toks *a, const toks *b, bool hashes) {
    return a->n == b->n && !memcmp(a->t, b->t, (size_t)a->n * sizeof a->t[0]) &&
           (!hashes || !memcmp(a->h, b->h, (size_t)a->n * sizeof a->h[0]));
}

/* Start-up capture: after td_engine_capture_graphs, one request's decode
 * steps (depth 0) capture nothing but its prompt chunk and the MTP pass over
 * it (2 shapes); at depth 2 the verify and first draft shapes are there, and
 * what is new is the MTP catch-up passes after partial accepts (n = accepted
 * + 1), which depend on the text: few against the replays. */
static void test_startup(void) {
    td_engine *e = load(false, 1);
    if (!e) return;
    td_backend *b = td_engine_backend(e);
    char line[256];
    td_err err = {0};
    CHECK(td_engine_capture_graphs(e, 2, line, sizeof line, &err) == 0, "%s", err.msg);
    uint64_t c0 = b->counters.graph_captures;
    CHECK(c0 > 0 && strstr(line, "captured at start-up"), "start-up: %s", line);
    printf("%s\n", line);
    static const int32_t p[] = {9, 4, 77, 31, 2, 60, 18, 5};
    const int32_t *ps[1] = {p};
    int len[1] = {(int)(sizeof p / sizeof *p)};
    for (int d = 0; d <= 2; d += 2) {
        toks t[1];
        uint64_t r0 = b->counters.graph_replays, k0 = b->counters.graph_captures;
        generate(e, 1, ps, len, d, false, t);
        uint64_t k1 = b->counters.graph_captures;
        uint64_t rp = b->counters.graph_replays - r0;
        CHECK(t[0].n == NGEN && rp >= (uint64_t)NGEN / (d + 1) / 2 && (d == 0 ? k1 - k0 <= 2 : (k1 - k0) * 4 <= rp),
              "depth %d after start-up capture: %llu new captures (the prompt's), %llu replays", d, (unsigned long long)(k1 - k0),
              (unsigned long long)(b->counters.graph_replays - r0));
    }
    td_engine_free(e);
}

/* The planner's node count per graph (td_fwd_region_ops_for) against the
 * nodes a capture really holds: a decode forward (argmax), a verify forward
 * (logits of 3 rows), an MTP draft pass. */
static size_t nodes_now(td_backend *b) {
    int g = 0;
    size_t n = 0, by = 0;
    td_backend_cuda_graph_info(b, &g, &n, &by);
    return n;
}

static void test_nodes(void) {
    td_engine *e = load(false, 1);
    if (!e) return;
    td_backend *b = td_engine_backend(e);
    const td_config *c = td_engine_cfg(e);
    td_err err = {0};
    td_session *s = NULL;
    CHECK(td_session_new(e, &s, &err) == 0, "%s", err.msg);
    td_seq *q = td_session_seq(s);
    int32_t toks[20], am[3];
    for (int i = 0; i < 20; i++) toks[i] = (int32_t)((i * 13 + 5) % c->vocab_size);
    float *hid = malloc(sizeof(float) * 20 * (size_t)c->hidden_size), *lg = malloc(sizeof(float) * 3 * (size_t)c->vocab_size);
    CHECK(td_seq_reserve(q, 40, &err) == 0, "%s", err.msg);
    td_fwd_item pf = {.seq = q, .tokens = toks, .n = 20, .logits_rows = 1, .argmax = am, .hidden = hid}; /* 20 tokens: eager */
    CHECK(td_forward(td_engine_fwd(e), &pf, 1, &err) == 0, "%s", err.msg);
    size_t n0 = nodes_now(b);
    CHECK(n0 == 0, "a 20-token prompt ran eagerly (%zu nodes held)", n0);
    td_fwd_item dec = {.seq = q, .tokens = toks, .n = 1, .logits_rows = 1, .argmax = am};
    CHECK(td_forward(td_engine_fwd(e), &dec, 1, &err) == 0, "%s", err.msg);
    size_t n1 = nodes_now(b);
    CHECK(n1 - n0 == (size_t)td_fwd_region_ops_for(c, false, 1, true), "decode graph: %zu nodes, planner %d", n1 - n0,
          td_fwd_region_ops_for(c, false, 1, true));
    td_fwd_item ver = {.seq = q, .tokens = toks, .n = 3, .logits_rows = 3, .logits = lg};
    CHECK(td_forward(td_engine_fwd(e), &ver, 1, &err) == 0, "%s", err.msg);
    size_t n2 = nodes_now(b);
    CHECK(n2 - n1 == (size_t)td_fwd_region_ops_for(c, false, 1, false), "verify graph: %zu nodes, planner %d", n2 - n1,
          td_fwd_region_ops_for(c, false, 1, false));
    if (td_engine_model(e)->has_mtp) {
        td_mtp_item mp = {.seq = q, .tokens = toks + 1, .hidden = hid, .pos0 = 0, .n = 19}; /* eager: 19 tokens */
        CHECK(td_mtp_forward(td_engine_fwd(e), &mp, 1, &err) == 0, "%s", err.msg);
        td_mtp_item m1 = {.seq = q, .tokens = toks, .hidden = hid, .pos0 = 19, .n = 1, .logits_rows = 1, .argmax = am};
        CHECK(td_mtp_forward(td_engine_fwd(e), &m1, 1, &err) == 0, "%s", err.msg);
        size_t n3 = nodes_now(b);
        CHECK(n3 - n2 == (size_t)td_fwd_region_ops_for(c, true, 1, true), "MTP graph: %zu nodes, planner %d", n3 - n2,
              td_fwd_region_ops_for(c, true, 1, true));
    }
    free(hid);
    free(lg);
    td_session_free(s);
    td_engine_free(e);
}

static void test_engine(void) {
    td_engine *gr = load(false, 2), *ea = load(true, 2);
    if (!gr || !ea) return;
    /* prompts longer than a graph item (16 tokens): their prefill runs eagerly, the decode steps through graphs */
    static const int32_t p1[] = {3, 17, 41, 9, 60, 77, 13, 25, 5, 88, 12, 41, 7, 30, 2, 19, 51, 64, 8, 11};
    static const int32_t p2[] = {5, 90, 2, 14, 33, 71, 8, 19, 40, 6, 21, 3, 55, 70, 12, 9, 1, 44, 27, 38, 60, 15, 4, 31, 2, 10, 49};
    const int32_t *ps[2] = {p1, p2}, *rev[2] = {p2, p1};
    int lens[2] = {(int)(sizeof p1 / sizeof *p1), (int)(sizeof p2 / sizeof *p2)}, rlens[2] = {lens[1], lens[0]};
    td_backend *b = td_engine_backend(gr), *be = td_engine_backend(ea);
    for (int di = 0; di < 3; di++) {
        int d = (int[]){0, 1, 3}[di];
        toks a[2], e[2];
        td_backend_counters c0 = b->counters;
        generate(gr, 1, ps, lens, d, true, a);
        td_backend_counters c1 = b->counters;
        generate(ea, 1, ps, lens, d, true, e);
        CHECK(a[0].n == NGEN && same(&a[0], &e[0], true), "depth %d: graphs give the eager tokens and logits bits (%d tokens)", d, a[0].n);
        CHECK(c1.graph_captures > c0.graph_captures || c1.graph_replays > c0.graph_replays, "depth %d: forwards went through graphs", d);
        CHECK(c1.graph_replays - c0.graph_replays >= (uint64_t)NGEN / (d + 1) / 2, "depth %d: %llu replays, %llu captures", d,
              (unsigned long long)(c1.graph_replays - c0.graph_replays), (unsigned long long)(c1.graph_captures - c0.graph_captures));
        if (d == 0) /* later runs of this prompt hit the prefix cache: the rest is short enough for a graph */
            CHECK(c1.graph_eager > c0.graph_eager, "depth %d: the prompt's prefill ran eagerly", d);
        /* two requests in one batch, in both orders: each gets its solo tokens (no logits wanted: the
           forwards' argmax path) */
        toks solo2[2], both[2], both_r[2], both_e[2];
        generate(gr, 1, ps + 1, lens + 1, d, false, solo2);
        generate(gr, 1, ps, lens, d, false, solo2 + 1);
        generate(gr, 2, ps, lens, d, false, both);
        generate(gr, 2, rev, rlens, d, false, both_r);
        generate(ea, 2, ps, lens, d, false, both_e);
        CHECK(same(&both[0], &solo2[1], false) && same(&both[1], &solo2[0], false), "depth %d: batched = solo with graphs", d);
        CHECK(same(&both_r[0], &solo2[0], false) && same(&both_r[1], &solo2[1], false), "depth %d: batched (other order) = solo", d);
        CHECK(same(&both[0], &both_e[0], false) && same(&both[1], &both_e[1], false), "depth %d: batched with graphs = eager", d);
        CHECK(same(&both[0], &a[0], false), "depth %d: no-logits tokens = logits-wanted tokens", d);
        /* staggered: p3 (p1 + 7 tokens) joins at step 3, its prompt's tail after the prefix-cache hit on p1
           (a prefill chunk of at most 16 tokens, through a graph) beside p1's decode or verify rows */
        static const int32_t p3[] = {3, 17, 41, 9, 60, 77, 13, 25, 5, 88, 12, 41, 7, 30, 2, 19, 51, 64, 8, 11, 6, 6, 90, 1, 23, 45, 2};
        const int32_t *pst[2] = {p1, p3};
        int lst[2] = {lens[0], (int)(sizeof p3 / sizeof *p3)}, start[2] = {0, 3};
        toks solo3, stag[2], stag_e[2];
        generate(gr, 1, pst + 1, lst + 1, d, false, &solo3);
        generate_at(gr, 2, pst, lst, start, d, false, stag);
        generate_at(ea, 2, pst, lst, start, d, false, stag_e);
        CHECK(same(&stag[0], &solo2[1], false) && same(&stag[1], &solo3, false), "depth %d: staggered batch = solo with graphs", d);
        CHECK(same(&stag[0], &stag_e[0], false) && same(&stag[1], &stag_e[1], false), "depth %d: staggered with graphs = eager", d);
    }
    CHECK(be->counters.graph_captures == 0 && be->counters.graph_replays == 0 && be->counters.graph_eager > 0,
          "enforce_eager: no graph captured or replayed");
    int graphs = 0;
    size_t nodes = 0, bytes = 0;
    CHECK(td_backend_cuda_graph_info(b, &graphs, &nodes, &bytes) == 0 && graphs > 0 && nodes > (size_t)graphs * 10,
          "graph info: %d graphs, %zu nodes, %zu bytes", graphs, nodes, bytes);
    printf("cuda graphs: %d graphs held, %zu nodes, %zu bytes; %llu captures, %llu replays, %llu eager regions\n", graphs, nodes, bytes,
           (unsigned long long)b->counters.graph_captures, (unsigned long long)b->counters.graph_replays,
           (unsigned long long)b->counters.graph_eager);
    td_engine_free(gr);
    td_engine_free(ea);
}

int main(void) {
    td_err err = {0};
    td_backend *b = NULL;
    int rc = td_backend_create("cuda", 1, &b, &err);
    if (rc) { /* no CUDA here: one clear line, then nothing to test */
        CHECK(rc == TD_ERR_UNSUPPORTED && (strstr(err.msg, "CUDA") || strstr(err.msg, "cuda")), "no CUDA: %s", err.msg);
        printf("cuda graphs: no CUDA backend here (%s); nothing else to check\n", err.msg);
        TEST_MAIN_END("cuda_graphs");
    }
    test_cache(b);
    td_backend_free(b);
    test_nodes();
    test_startup();
    test_engine();
    TEST_MAIN_END("cuda_graphs");
}
