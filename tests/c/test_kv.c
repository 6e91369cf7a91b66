/* Paged KV cache and exact prefix caching (issue 5): outputs with cache
 * hits equal outputs without the cache, at every depth; hits land where the
 * checkpoints are; eviction under a small cache stays exact; block refcounts
 * return to zero. */
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>
#include "check.h"
#include "test_backend.h"
#include "engine/engine.h"

static td_engine *load_dt(const char *dir, bool caching, size_t kv_bytes, int dtype) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 1, .spec_depth = 4, .max_context = 4096, .no_prefix_caching = !caching, .kv_cache_bytes = kv_bytes,
                        .kv_cache_dtype = dtype};
    td_engine *e = NULL;
    int rc = td_engine_load(dir, &o, &e, &err);
    CHECK(rc == 0, "%s: %s", dir, err.msg);
    return e;
}
static td_engine *load(const char *dir, bool caching, size_t kv_bytes) { return load_dt(dir, caching, kv_bytes, 0); }

static int gen(td_engine *e, const int32_t *prompt, int n, int depth, int32_t *out, int max, td_gen_result *r);

/* fp8 e4m3 storage: every representable value (times the row's scale)
 * survives a write and a read exactly; bf16 rounds to nearest even. */
static void storage_formats(void) {
    td_err err;
    td_kv_shape sh = {.n_layers = 1, .kv_dim = 128, .head_dim = 128, .store = TD_KV_FP8, .state_floats = 1, .hidden = 1};
    td_kv *kv;
    CHECK(td_kv_new(&sh, 2, 0, test_backend(), &kv, &err) == 0, "%s", err.msg);
    float row[128], back[128], tmp[128];
    /* the 127 non-negative finite e4m3 values: 0, subnormals k*2^-9, normals */
    int n = 0;
    for (int e = 0; e < 16; e++)
        for (int m = 0; m < 8 && n < 128; m++) {
            if (e == 15 && m == 7) continue; /* NaN */
            row[n++] = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
        }
    while (n < 128) row[n++] = 0;
    row[127] = -448.0f; /* absmax 448: scale 1 */
    int b = td_kv_alloc(kv);
    td_kv_write(kv, 0, b, 3, row, row);
    const float *k = td_kv_k_head(kv, 0, b, 3, 0, tmp);
    memcpy(back, k, sizeof back);
    int exact = 0;
    for (int i = 0; i < 128; i++) exact += back[i] == row[i];
    CHECK(exact == 128, "fp8 round trip exact for %d of 128 values", exact);
    /* scaled rows: values near absmax keep 3 mantissa bits (rel err <= 1/16) */
    for (int i = 0; i < 128; i++) row[i] = sinf((float)i) * 37.5f;
    td_kv_write(kv, 0, b, 4, row, row);
    const float *v = td_kv_v_head(kv, 0, b, 4, 0, tmp);
    double worst = 0;
    for (int i = 0; i < 128; i++)
        if (fabsf(row[i]) > 37.5f / 64) worst = fmax(worst, fabs(v[i] - row[i]) / fabsf(row[i]));
    CHECK(worst <= 1.0 / 16 + 1e-6, "fp8 relative error %.4f", worst);
    td_kv_free(kv);
    td_kv_shape b16 = sh, f32 = sh;
    b16.store = TD_KV_BF16;
    f32.store = TD_KV_F32;
    CHECK(td_kv_bytes_per_block(&b16) * 2 == td_kv_bytes_per_block(&f32), "bf16 block bytes");
    CHECK(td_kv_bytes_per_block(&sh) == td_kv_bytes_per_block(&f32) / 4 + 2 * TD_KV_BLOCK * sizeof(float), "fp8 block bytes");
}

/* bf16/fp8 KV: logits stay close to f32, greedy output is deterministic, and
 * prefix-cache hits stay exact within the same storage format. */
static void kv_dtypes(const char *dir) {
    int32_t p[200], a[48], b[48];
    for (int i = 0; i < 200; i++) p[i] = (i * 13 + 1) % 60;
    td_engine *f = load_dt(dir, false, 0, 0);
    double errs[3] = {0};
    for (int dt = 1; dt <= 2; dt++) {
        td_engine *e = load_dt(dir, true, 0, dt), *u = load_dt(dir, false, 0, dt);
        td_err err;
        td_session *s1, *s2;
        td_session_new(f, &s1, &err);
        td_session_new(e, &s2, &err);
        const float *l1, *l2;
        td_session_feed(s1, p, 200, &l1, &err);
        td_session_feed(s2, p, 200, &l2, &err);
        double num = 0, den = 0;
        for (int i = 0; i < 60; i++) { num = fmax(num, fabs(l1[i] - l2[i])); den = fmax(den, fabs(l1[i])); }
        errs[dt] = num / den;
        td_session_free(s1);
        td_session_free(s2);
        td_gen_result r;
        gen(e, p, 200, 3, a, 48, &r);
        gen(e, p, 200, 3, b, 48, &r); /* hits the cache */
        CHECK(r.n_reused == 199, "dtype %d: reused %d", dt, r.n_reused);
        int32_t c[48];
        gen(u, p, 200, 3, c, 48, &r);
        CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(a, c, sizeof a) == 0, "dtype %d: cached/uncached outputs differ", dt);
        td_engine_free(e);
        td_engine_free(u);
    }
    CHECK(errs[1] < 2e-2 && errs[2] < 1e-1, "KV dtype logit error: bf16 %.4f fp8 %.4f", errs[1], errs[2]);
    printf("KV storage: max logit error vs f32 (relative to max |logit|): bf16 %.2e, fp8 %.2e; cache hits exact in both\n", errs[1], errs[2]);
    td_engine_free(f);
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

/* An agent-like conversation: each turn's prompt is the previous prompt +
 * the assistant's output + a tool result. Turn 5 branches from turn 2
 * (a retry); turn results with caching on must equal caching off, depths 0..4. */
static void agent_conversation(const char *dir) {
    td_engine *on = load(dir, true, 0), *off = load(dir, false, 0);
    int total_hits = 0, mid_block = 0, branch_hit = 0;
    for (int d = 0; d <= 4; d++) {
        int32_t convo[8][2600];
        int len[8];
        int32_t out_on[40], out_off[40];
        td_gen_result r;
        int same = 1;
        for (int t = 0; t < 8; t++) {
            int base = t == 5 ? 2 : t - 1; /* turn 5 branches from turn 2's conversation */
            int n = 0;
            if (t == 0) {
                for (int i = 0; i < 150; i++) convo[t][n++] = (i * 7 + 3) % 60; /* system prompt + tools */
            } else {
                memcpy(convo[t], convo[base], sizeof(int32_t) * (size_t)len[base]);
                n = len[base];
            }
            for (int i = 0; i < 23 + t; i++) convo[t][n++] = (i * 3 + t * 17 + d) % 60; /* tool result / user text */
            len[t] = n;
            gen(on, convo[t], n, d, out_on, 40, &r);
            if (r.n_reused) total_hits++;
            if (r.n_reused % TD_KV_BLOCK) mid_block++;
            if (t == 5 && r.n_reused > 0) branch_hit = 1;
            gen(off, convo[t], n, d, out_off, 40, &r);
            same &= memcmp(out_on, out_off, sizeof out_on) == 0;
            memcpy(convo[t] + n, out_on, sizeof out_on); /* the assistant's output joins the conversation */
            len[t] += 40;
        }
        CHECK(same, "depth %d: 8-turn agent conversation differs with prefix caching", d);
    }
    CHECK(total_hits >= 5 * 7 && mid_block > 0 && branch_hit, "hits %d, mid-block %d, branch %d", total_hits, mid_block, branch_hit);
    printf("agent conversation: 8 turns x depths 0-4 identical with caching on/off; %d turns hit (%d mid-block), branch from turn 2 hit\n",
           total_hits, mid_block);
    td_engine_free(on);
    td_engine_free(off);
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
    storage_formats();
    kv_dtypes(dir);
    agent_conversation(dir);
    /* start-up check: a window that does not fit is refused before loading */
    FILE *f = popen("build/tandem run -m tests/golden/tiny-b/bf16 -p x -c 4000 --spec-depth 2 --kv-cache-memory 64KiB 2>&1", "r");
    if (f) {
        char out[4096] = "";
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        int st = pclose(f);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "refusal exit status %d", st);
        CHECK(strstr(out, "4000 tokens") && strstr(out, "largest window that fits at depth 2") && strstr(out, "GiB"), "refusal message: %s", out);
    }
    f = popen("build/tandem run -m tests/golden/tiny-b/bf16 -p x -n 2 -c auto --memory-budget 64MiB -v 2>&1", "r");
    if (f) {
        char out[4096] = "";
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        int st = pclose(f);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(out, "KV cache") && strstr(out, "max concurrency"), "auto window: %s", out);
    }
    TEST_MAIN_END("kv");
}
