/* --deltanet-chunk N: prompt segments run the DeltaNet recurrence in chunks
 * (td_gdn_chunk). Logits agree with the token-by-token engine to rounding,
 * and speculative decoding stays lossless on the chunked engine. */
#include "check.h"
#include "engine/engine.h"
#include "golden.h"

static void check_model(const char *dir, int chunk) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 2, .spec_depth = 3, .max_context = 512};
    td_engine *ref, *ch;
    int rc = td_engine_load(dir, &o, &ref, &err);
    CHECK(rc == 0, "%s: %s", dir, err.msg);
    o.deltanet_chunk = chunk;
    int rc2 = td_engine_load(dir, &o, &ch, &err);
    CHECK(rc2 == 0, "%s chunk %d: %s", dir, chunk, err.msg);
    if (rc || rc2) return;
    int V = ref->model->cfg.vocab_size, T = 150;
    int32_t toks[150];
    for (int i = 0; i < T; i++) toks[i] = (int32_t)((i * 7919 + 5) % V);
    float *a = malloc(sizeof(float) * (size_t)T * V), *b = malloc(sizeof(float) * (size_t)T * V);
    td_engine *es[2] = {ref, ch};
    float *outs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        td_session *s;
        td_session_new(es[k], &s, &err);
        td_fwd_item it = {.seq = &s->seq, .tokens = toks, .n = T, .logits_rows = T, .logits = outs[k]};
        CHECK(td_forward(es[k]->fwd, &it, 1, &err) == 0, "%s", err.msg);
        td_session_free(s);
    }
    double er = rel_err(b, a, (int64_t)T * V);
    CHECK(er < 1e-4, "%s chunk %d: prefill logits rel err %.3g", dir, chunk, er);
    td_session *s;
    td_session_new(ch, &s, &err);
    td_sampling sp;
    td_sampling_default(&sp);
    tok64 v[2] = {{.n = 0}, {.n = 0}};
    for (int k = 0; k < 2; k++) {
        td_session_reset(s);
        td_gen_opts go = {.max_tokens = 48, .spec_depth = k ? 3 : 0, .ignore_eos = true};
        td_gen_result r;
        CHECK(td_session_generate(s, toks, 100, &sp, &go, collect64, &v[k], &r, &err) == 0, "%s", err.msg);
    }
    CHECK(v[0].n == 48 && v[1].n == 48 && memcmp(v[0].buf, v[1].buf, sizeof(int32_t) * 48) == 0,
          "%s chunk %d: greedy at depth 3 differs from depth 0", dir, chunk);
    printf("gdn_chunk %s: chunk %d, prefill logits rel err %.2e vs token by token; greedy depth 3 == depth 0\n", dir, chunk, er);
    free(a); free(b);
    td_session_free(s);
    td_engine_free(ch);
    td_engine_free(ref);
}

int main(void) {
    check_model("tests/golden/tiny-c/f32", 16);
    check_model("tests/golden/tiny-b/bf16", 64);
    check_model("models/demo", 32);
    td_err err = {0};
    td_engine_opts o = {.n_threads = 1, .deltanet_chunk = 999};
    td_engine *e = NULL;
    CHECK(td_engine_load("tests/golden/tiny-b/bf16", &o, &e, &err) != 0 && e == NULL, "deltanet_chunk 999 accepted");
    TEST_MAIN_END("gdn_chunk");
}
