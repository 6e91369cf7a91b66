/* The shipped demo model (models/demo) against transformers
 * (tools/reference/make_demo_golden.py):
 * - f32 (the reference): prefill logits of the last 8 prompt positions
 *   within 1e-4 relative, the 32-token greedy continuation identical, and
 *   identical again with MTP drafting at depths 1..4;
 * - --precision bf16 (BF16 matmul activations, where the CPU has AVX-512
 *   BF16): logits within 5e-2, greedy at depths 1..4 equal to its own depth 0
 *   (lossless), agreement with transformers' 32 tokens reported;
 * - --quantize q8 --precision int8 (W8A8: int8 activations against the q8
 *   weights, every CPU): logits within 5e-2 of transformers and within 2e-2
 *   of q8 with f32 activations but not equal to them, greedy at depths 1..4
 *   equal to its own depth 0 (lossless). */
#include "check.h"
#include "engine/engine.h"
#include "golden.h"
#include "backend/cpu/kernels.h"

static float *q8_f32_tail; /* the last 8 prompt positions' logits of q8 with f32 activations */

static void run(td_precision prec, int quantize) {
    bool bf16 = prec != TD_PRECISION_F32 || quantize; /* checked against its own depth 0 */
    const char *tag = prec == TD_PRECISION_BF16 ? "demo (precision bf16)"
                      : prec == TD_PRECISION_INT8 ? "demo (q8, precision int8)"
                      : quantize ? "demo (q8)" : "demo";
    td_err err = {0};
    td_engine_opts o = {.n_threads = 2, .spec_depth = 4, .max_context = 1024, .precision = prec, .quantize = quantize};
    td_engine *e;
    int rc = td_engine_load("models/demo", &o, &e, &err);
    CHECK(rc == 0, "models/demo: %s", err.msg);
    if (rc) return;
    td_weights *rw;
    const char *rp = "tests/golden/demo-reference.safetensors";
    rc = td_weights_open_files(&rp, 1, &rw, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) { td_engine_free(e); return; }
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
    CHECK(er < (bf16 ? 5e-2 : 1e-4), "%s prefill logits rel err %.3g", tag, er);
    if (quantize && prec == TD_PRECISION_F32) {
        q8_f32_tail = malloc(sizeof(float) * 8 * (size_t)V);
        memcpy(q8_f32_tail, logits + (size_t)(T - 8) * V, sizeof(float) * 8 * (size_t)V);
    } else if (quantize && q8_f32_tail) {
        double eq = rel_err(logits + (size_t)(T - 8) * V, q8_f32_tail, 8 * (int64_t)V);
        CHECK(eq < 2e-2 && eq > 0, "%s prefill logits rel err %.3g against q8 with f32 activations", tag, eq);
        printf("%s: prefill logits rel err %.2e against q8 with f32 activations\n", tag, eq);
    }
    td_sampling sp;
    td_sampling_default(&sp);
    int32_t d0[64];
    int same = 0, agree = 0;
    for (int d = 0; d <= 4; d++) {
        td_session_reset(s);
        tok64 v = {.n = 0};
        td_gen_opts go = {.max_tokens = (int)G, .spec_depth = d, .ignore_eos = true};
        td_gen_result r;
        rc = td_session_generate(s, prompt, (int)T, &sp, &go, collect64, &v, &r, &err);
        CHECK(rc == 0 && v.n == G, "%s depth %d: %s", tag, d, err.msg);
        if (d == 0) {
            memcpy(d0, v.buf, sizeof(int32_t) * (size_t)G);
            while (agree < G && v.buf[agree] == greedy[agree]) agree++;
        }
        /* f32: every depth equals transformers; bf16: every depth equals its own depth 0 */
        bool ok = memcmp(v.buf, bf16 ? d0 : greedy, sizeof(int32_t) * (size_t)G) == 0;
        CHECK(ok, "%s greedy at depth %d differs from %s", tag, d, bf16 ? "depth 0" : "transformers");
        same += ok;
    }
    printf("%s: prefill logits rel err %.2e vs transformers; greedy agrees with transformers for %d of %lld tokens; "
           "depths 0-4 identical to %s: %d/5\n", tag, er, agree, (long long)G, bf16 ? "depth 0" : "transformers", same);
    free(logits);
    td_session_free(s);
    td_weights_free(rw);
    td_engine_free(e);
}

int main(void) {
    run(TD_PRECISION_F32, 0);
    /* BF16 activations are the CPU kernels' (AVX-512 BF16): not on a device backend (TANDEM_BACKEND=cuda,
       which refuses the precision) */
    const char *bk = getenv("TANDEM_BACKEND");
    bool cpu_ops = !bk || !*bk || !strcmp(bk, "cpu") || !strcmp(bk, "guard");
    if (td_kernels_have_bf16() && cpu_ops) run(TD_PRECISION_BF16, 0);
    else printf("demo: no AVX-512 BF16 on this CPU: --precision bf16 not run (test_golden_bf16 checks its refusal)\n");
    if (cpu_ops) { /* int8 activations: the CPU backend's, on every CPU */
        run(TD_PRECISION_F32, 1);
        run(TD_PRECISION_INT8, 1);
    }
    free(q8_f32_tail);
    TEST_MAIN_END("demo");
}
