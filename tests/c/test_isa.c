/* The CPU kernels' ISAs through the whole engine (issue 18 item 4):
 * `isa` in td_engine_opts promises that AVX2 and AVX-512 give the same bits
 * and every ISA the same tokens. test_kernels checks single matmuls; this
 * checks whole forwards, where every path of a step is reached:
 *   - a 99-token prompt in one feed: the backend hands the kernels blocks of
 *     64 rows, so this is a 64-row and a 35-row panel, and the compared last
 *     row comes from a panel's last 6-row group of 5,
 *   - single tokens (the decode tiles),
 *   - 5 tokens at once (the verify tiles),
 *   - 37, 32 and 33 more tokens after a cached prefix (panels whose last
 *     groups have 1, 2 and 3 rows; with the 64 and 35 above every group size
 *     1..6 runs).
 * The models are tiny-b (BF16 and F32 weights, with the MTP layer) and the
 * trained demo model, each as stored and as q8 (quantized at load).
 * For each feed, the last token's logits of the AVX2 engine equal those of
 * the AVX-512 engine bit for bit. On a CPU without AVX-512, they are checked
 * against the portable C kernels instead: the same greedy token, within 1e-4.
 * Within AVX2, feeding the same tokens one at a time gives the same bits as
 * the batched feeds (batch invariance through the model). */
#include <math.h>
#include "check.h"
#include "golden.h"
#include "backend/cpu/kernels.h"
#include "tandem.h"

enum { N_FEEDS = 8 };
static const int piece[N_FEEDS] = {99, 1, 1, 1, 5, 37, 32, 33};
enum { N_ALL = 99 + 3 + 5 + 37 + 32 + 33 };

static td_engine *load(const char *dir, int isa, int quantize) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 2, .max_context = 512, .max_seqs = 1, .quantize = quantize, .isa = isa};
    td_engine *e = NULL;
    int rc = td_engine_load(dir, &o, &e, &err);
    CHECK(rc == 0, "%s isa %d q8 %d: %s", dir, isa, quantize, err.msg);
    return rc ? NULL : e;
}

/* Feeds toks in the pieces above (one_at_a_time: the same tokens one per
 * feed); the logits after the last token of each piece to out[f]. */
static int feeds(td_engine *e, const int32_t *toks, int vocab, bool one_at_a_time, float *out) {
    td_session *s = NULL;
    td_err err = {0};
    if (td_session_new(e, &s, &err)) return -1;
    int at = 0, rc = 0;
    for (int f = 0; f < N_FEEDS && rc == 0; f++) {
        const int end = at + piece[f];
        const float *lg = NULL;
        for (; at < end && rc == 0; at += one_at_a_time ? 1 : piece[f])
            if ((rc = td_session_feed(s, toks + at, one_at_a_time ? 1 : piece[f], &lg, &err))) fprintf(stderr, "feed: %s\n", err.msg);
        if (rc == 0) memcpy(out + (size_t)f * vocab, lg, sizeof(float) * (size_t)vocab);
    }
    td_session_free(s);
    return rc ? -1 : 0;
}

static void one_model(const char *dir, int quantize, bool have512) {
    td_engine *a = load(dir, 2, quantize), *b = load(dir, have512 ? 3 : 1, quantize);
    if (!a || !b) {
        td_engine_free(a);
        td_engine_free(b);
        return;
    }
    td_model_info mi;
    td_engine_info(a, &mi);
    const int V = mi.vocab_size;
    int32_t toks[N_ALL];
    uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)quantize;
    for (int i = 0; i < N_ALL; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((r >> 33) % (uint64_t)V);
    }
    float *la = malloc(sizeof(float) * N_FEEDS * (size_t)V), *lb = malloc(sizeof(float) * N_FEEDS * (size_t)V),
          *l1 = malloc(sizeof(float) * N_FEEDS * (size_t)V);
    int rc = feeds(a, toks, V, false, la) | feeds(b, toks, V, false, lb) | feeds(a, toks, V, true, l1);
    CHECK(rc == 0, "%s q8 %d: a feed failed", dir, quantize);
    if (rc == 0) {
        static const char *what[N_FEEDS] = {"99-token prompt", "decode 1", "decode 2", "decode 3", "5 tokens", "37 more", "32 more",
                                            "33 more"};
        for (int f = 0; f < N_FEEDS; f++) {
            const float *x = la + (size_t)f * V, *y = lb + (size_t)f * V, *z = l1 + (size_t)f * V;
            if (have512)
                CHECK(memcmp(x, y, sizeof(float) * (size_t)V) == 0, "%s q8 %d, %s: avx2 and avx512 logits differ (rel %.3g)", dir,
                      quantize, what[f], rel_err(x, y, V));
            else
                CHECK(argmax_f(x, V) == argmax_f(y, V) && rel_err(x, y, V) < 1e-4, "%s q8 %d, %s: avx2 vs c: argmax %d / %d, rel %.3g",
                      dir, quantize, what[f], argmax_f(x, V), argmax_f(y, V), rel_err(x, y, V));
            CHECK(memcmp(x, z, sizeof(float) * (size_t)V) == 0, "%s q8 %d, %s: avx2 batched and one-by-one logits differ (rel %.3g)", dir,
                  quantize, what[f], rel_err(x, z, V));
        }
    }
    free(la), free(lb), free(l1);
    td_engine_free(a);
    td_engine_free(b);
}

int main(void) {
    if (!td_kernels_have_isa(TD_ISA_AVX2)) {
        /* nothing to compare: the engine refuses isa 2 here, which is what it must do */
        td_err err = {0};
        td_engine *e = NULL;
        td_engine_opts o = {.n_threads = 1, .max_context = 64, .isa = 2};
        char d[512];
        snprintf(d, sizeof d, "%s/tiny-b/bf16", golden_root());
        CHECK(td_engine_load(d, &o, &e, &err) != 0, "isa avx2 accepted on a CPU without it");
        td_engine_free(e);
        printf("isa: this CPU has no AVX2\n");
        TEST_MAIN_END("isa");
    }
    const bool have512 = td_kernels_have_isa(TD_ISA_AVX512);
    char d[512];
    static const char *models[] = {"tiny-b/bf16", "tiny-b/f32"};
    for (int m = 0; m < 2; m++)
        for (int q = 0; q <= 1; q++) {
            snprintf(d, sizeof d, "%s/%s", golden_root(), models[m]);
            one_model(d, q, have512);
        }
    for (int q = 0; q <= 1; q++) one_model("models/demo", q, have512);
    printf("isa: avx2 against %s\n", have512 ? "avx512 (bits)" : "c (tokens, 1e-4)");
    TEST_MAIN_END("isa");
}
