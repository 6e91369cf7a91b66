/* Paged KV cache and exact prefix caching (issue 5): outputs with cache
 * hits equal outputs without the cache, at every depth; hits land where the
 * checkpoints are; eviction under a small cache stays exact; block refcounts
 * return to zero. */
#include <stdlib.h>
#include "check.h"
#include "engine/engine.h"

static td_engine *load(const char *dir, bool caching, size_t kv_bytes) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 1, .spec_depth = 4, .max_context = 4096, .no_prefix_caching = !caching, .kv_cache_bytes = kv_bytes};
    td_engine *e = NULL;
    int rc = td_engine_load(dir, &o, &e, &err);
    CHECK(rc == 0, "%s: %s", dir, err.msg);
    return e;
}

typedef struct { int32_t *buf; int n, cap; } tokvec;
static int collect(void *u, int32_t t) {
    tokvec *v = u;
    if (v->n < v->cap) v->buf[v->n++] = t;
    return 0;
}

static int gen(td_engine *e, const int32_t *prompt, int n, int depth, int32_t *out, int max, td_gen_result *r) {
    td_err err = {0};
    td_session *s;
    td_session_new(e, &s, &err);
    td_sampling sp;
    td_sampling_default(&sp);
    td_gen_opts o = {.max_tokens = max, .spec_depth = depth, .ignore_eos = true};
    tokvec v = {out, 0, max};
    int rc = td_session_generate(s, prompt, n, &sp, &o, collect, &v, r, &err);
    if (rc) CHECK(rc == 0, "%s", err.msg);
    td_session_free(s); /* fresh session each time: reuse can only come from the cache */
    return v.n;
}

int main(void) {
    const char *dir = "tests/models/spec-partial";
    td_engine *ref = load(dir, false, 0), *e = load(dir, true, 0);
    if (!ref || !e) TEST_MAIN_END("kv");
    int32_t head[1200], p[1400], a[64], b[64];
    for (int i = 0; i < 1200; i++) head[i] = (i * 11 + 7) % 60;
    td_gen_result r;
    int depths[] = {0, 2, 4};
    for (int di = 0; di < 3; di++) {
        int d = depths[di];
        /* 1. the same prompt twice: the second hits all but the last token */
        gen(e, head, 300, d, a, 48, &r);
        gen(e, head, 300, d, b, 48, &r);
        CHECK(r.n_reused == 299, "depth %d: identical prompt reused %d (want 299)", d, r.n_reused);
        int32_t c[64];
        gen(ref, head, 300, d, c, 48, &r);
        CHECK(memcmp(a, c, sizeof(int32_t) * 48) == 0 && memcmp(b, c, sizeof(int32_t) * 48) == 0, "depth %d: cached output differs", d);
        /* 2. extend the conversation: prompt + output + new text hits the end checkpoint */
        memcpy(p, head, sizeof(int32_t) * 300);
        memcpy(p + 300, b, sizeof(int32_t) * 48);
        for (int i = 0; i < 20; i++) p[348 + i] = (i * 5 + d) % 60;
        gen(e, p, 368, d, a, 32, &r);
        CHECK(r.n_reused == 347, "depth %d: extension reused %d (want 347)", d, r.n_reused);
        gen(ref, p, 368, d, c, 32, &r);
        CHECK(memcmp(a, c, sizeof(int32_t) * 32) == 0, "depth %d: extension output differs", d);
        /* 3. a long shared head with a different tail hits the 1024 checkpoint */
        memcpy(p, head, sizeof(int32_t) * 1200);
        gen(e, p, 1100, d, a, 16, &r);
        p[1090] = (p[1090] + 1 + d) % 60; /* diverge after the 1024 boundary */
        gen(e, p, 1100, d, a, 16, &r);
        CHECK(r.n_reused == 1024, "depth %d: shared head reused %d (want 1024)", d, r.n_reused);
        gen(ref, p, 1100, d, c, 16, &r);
        CHECK(memcmp(a, c, sizeof(int32_t) * 16) == 0, "depth %d: shared-head output differs", d);
    }
    /* 4. no block leaks: everything is free or cached */
    td_kv_info ki;
    td_engine_kv_info(e, &ki);
    CHECK(ki.free_blocks + ki.checkpoint_blocks == ki.n_blocks, "%d free + %d in checkpoints of %d blocks after all sessions ended",
          ki.free_blocks, ki.checkpoint_blocks, ki.n_blocks);
    printf("prefix cache: identical prompt reused 299/300, extension 347/368, shared head 1024/1100 at depths 0/2/4; outputs equal the uncached engine\n");
    td_engine_free(e);
    /* 5. a cache too small to keep much: eviction, still exact */
    td_kv_info ri;
    td_engine_kv_info(ref, &ri);
    e = load(dir, true, ri.bytes_per_block * 100);
    int32_t c[64];
    int hits = 0;
    for (int round = 0; round < 6; round++) {
        int32_t q[400];
        for (int i = 0; i < 400; i++) q[i] = (i * (round % 3 + 2) + round % 3) % 60; /* rounds 3-5 repeat 0-2 */
        gen(e, q, 400, 2, a, 24, &r);
        hits += r.n_reused > 0;
        gen(ref, q, 400, 2, c, 24, &r);
        CHECK(memcmp(a, c, sizeof(int32_t) * 24) == 0, "round %d: output differs under eviction", round);
    }
    td_engine_kv_info(e, &ki);
    CHECK(ki.free_blocks + ki.checkpoint_blocks == ki.n_blocks, "%d free + %d in checkpoints of %d blocks after eviction rounds",
          ki.free_blocks, ki.checkpoint_blocks, ki.n_blocks);
    printf("small cache (100 blocks): 6 rounds exact, %d hits after eviction\n", hits);
    td_engine_free(e);
    td_engine_free(ref);
    TEST_MAIN_END("kv");
}
