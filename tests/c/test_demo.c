/* The shipped demo model (models/demo) against transformers
 * (tools/reference/make_demo_golden.py): prefill logits of the last 8 prompt
 * positions within 1e-4 relative, the 32-token greedy continuation identical,
 * and identical again with MTP drafting at depths 1..4. */
#include "check.h"
#include "engine/engine.h"
#include "golden.h"

int main(void) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 2, .spec_depth = 4, .max_context = 1024};
    td_engine *e;
    int rc = td_engine_load("models/demo", &o, &e, &err);
    CHECK(rc == 0, "models/demo: %s", err.msg);
    if (rc) TEST_MAIN_END("demo");
    td_weights *rw;
    const char *rp = "tests/golden/demo-reference.safetensors";
    rc = td_weights_open_files(&rp, 1, &rw, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) { td_engine_free(e); TEST_MAIN_END("demo"); }
    int64_t T, G;
    const int32_t *prompt = ref_tensor(rw, "prompt", &T);
    const float *tail = ref_tensor(rw, "logits_tail", NULL);
    const int32_t *greedy = ref_tensor(rw, "greedy", &G);
    int V = e->model->cfg.vocab_size;
    float *logits = malloc((size_t)T * V * sizeof(float));
    td_session *s;
    td_session_new(e, &s, &err);
    td_fwd_item it = {.seq = &s->seq, .tokens = prompt, .n = (int)T, .logits_rows = (int)T, .logits = logits};
    rc = td_forward(e->fwd, &it, 1, &err);
    CHECK(rc == 0, "%s", err.msg);
    double er = rel_err(logits + (size_t)(T - 8) * V, tail, 8 * (int64_t)V);
    CHECK(er < 1e-4, "demo prefill logits rel err %.3g", er);
    td_sampling sp;
    td_sampling_default(&sp);
    int same = 0;
    for (int d = 0; d <= 4; d++) {
        td_session_reset(s);
        tok64 v = {.n = 0};
        td_gen_opts go = {.max_tokens = (int)G, .spec_depth = d, .ignore_eos = true};
        td_gen_result r;
        rc = td_session_generate(s, prompt, (int)T, &sp, &go, collect64, &v, &r, &err);
        bool ok = rc == 0 && v.n == G && memcmp(v.buf, greedy, sizeof(int32_t) * (size_t)G) == 0;
        CHECK(ok, "demo greedy at depth %d differs from transformers", d);
        same += ok;
    }
    printf("demo: prefill logits rel err %.2e vs transformers; 32-token greedy identical at depths 0-4: %d/5\n", er, same);
    free(logits);
    td_session_free(s);
    td_weights_free(rw);
    td_engine_free(e);
    TEST_MAIN_END("demo");
}
