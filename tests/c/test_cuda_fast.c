/* The CUDA backend's two modes on the whole engine (the shipped demo model):
 * - fast (the default, td_engine_opts.batch_invariant false): matmuls of more
 *   than 16 rows on cuBLAS (BF16 tensor cores, cuda_matmul.cu gemm_fast).
 *   The prefill logits of the last 8 prompt positions are within 5e-2
 *   relative of the CPU reference (f32) engine's, the tolerance of the CPU's
 *   own BF16 activations (test_demo); the cuBLAS path did run (its call
 *   counter); the greedy continuation's agreement with the CPU's is reported
 *   and its first 8 tokens must agree; and greedy output at depths 1..4
 *   equals fast mode's own depth 0 bit for bit (one request: its verify rows
 *   stay on the exact kernels, and its prompt is prefilled the same way;
 *   attention of decode and verify rows is split into partitions of 8
 *   positions and merged, cuda_attn.cu). A prompt of more than 128 tokens
 *   (its attention on the tensor-core tiles, the emulator's sm_90) is within
 *   the same 5e-2, as is the per-row kernel's (TD_CUDA_ATTN_TILE=0), and
 *   their logits differ.
 * - batch-invariant (td_engine_opts.batch_invariant, and TANDEM_BATCH_INVARIANT=1
 *   for the suites): no cuBLAS call, no buffers made for it, prefill logits
 *   within 1e-4 of the CPU's and greedy equal to the CPU's token for token.
 * The CUDA backend runs where it exists: on a GPU, or on the CPU under the
 * emulator (make cuemu; tests/cuemu, whose cuBLAS sums in a tensor core's
 * order, not the CPU's). Without it the test checks the one-line error and
 * stops. */
#include "check.h"
#include "engine/engine.h"
#include "golden.h"

#define MODEL "models/demo"
#define G 24

static td_engine *load(const char *backend, bool invariant, int depth) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 2, .spec_depth = depth, .max_context = 512, .backend = backend, .batch_invariant = invariant};
    td_engine *e = NULL;
    int rc = td_engine_load(MODEL, &o, &e, &err);
    CHECK(rc == 0, "%s on %s (batch-invariant %d): %s", MODEL, backend, invariant, err.msg);
    return e;
}

/* Prefill logits of every prompt position into out (T x V). */
static int prefill(td_engine *e, const int32_t *prompt, int T, float *out) {
    td_err err = {0};
    td_session *s;
    if (td_session_new(e, &s, &err)) { CHECK(0, "session: %s", err.msg); return -1; }
    td_fwd_item it = {.seq = &s->seq, .tokens = prompt, .n = T, .logits_rows = T, .logits = out};
    int rc = td_forward(e->fwd, &it, 1, &err);
    CHECK(rc == 0, "forward: %s", err.msg);
    td_session_free(s);
    return rc;
}

static int greedy(td_engine *e, const int32_t *prompt, int T, int depth, int32_t *out) {
    td_err err = {0};
    td_session *s;
    if (td_session_new(e, &s, &err)) { CHECK(0, "session: %s", err.msg); return -1; }
    td_sampling sp;
    td_sampling_default(&sp);
    tok64 v = {.n = 0};
    td_gen_opts go = {.max_tokens = G, .spec_depth = depth, .ignore_eos = true};
    td_gen_result r;
    int rc = td_session_generate(s, prompt, T, &sp, &go, collect64, &v, &r, &err);
    CHECK(rc == 0 && v.n == G, "generate at depth %d: %s (%d tokens)", depth, err.msg, v.n);
    memcpy(out, v.buf, sizeof(int32_t) * G);
    td_session_free(s);
    return rc;
}

int main(void) {
    td_err err = {0};
    td_backend *b = NULL;
    /* the fast mode's split attention in partitions of 8 positions (cuda_attn.cu; default 2048):
       decode and verify rows past position 8 are merged from several, so depths 1-4 = depth 0
       below also checks that a row's partitions do not depend on its batch */
    setenv("TD_CUDA_ATTN_SPLIT", "8", 0);
    int rc = td_backend_create("cuda", 1, &b, &err);
    if (rc) {
        CHECK(rc == TD_ERR_UNSUPPORTED && (strstr(err.msg, "CUDA") || strstr(err.msg, "cuda")), "no CUDA: %s", err.msg);
        printf("cuda fast: no CUDA backend here (%s); nothing else to check\n", err.msg);
        TEST_MAIN_END("cuda_fast");
    }
    td_backend_free(b);
    td_weights *rw;
    const char *rp = "tests/golden/demo-reference.safetensors";
    rc = td_weights_open_files(&rp, 1, &rw, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) TEST_MAIN_END("cuda_fast");
    int64_t T;
    const int32_t *prompt = ref_tensor(rw, "prompt", &T);
    CHECK(T > 16, "the prompt has %lld tokens: more than 16 are needed for the GEMM path", (long long)T);

    td_engine *cpu = load("cpu", false, 0), *fast = load("cuda", false, 4), *exact = load("cuda", true, 0);
    if (!cpu || !fast || !exact) TEST_MAIN_END("cuda_fast");
    int V = cpu->model->cfg.vocab_size;
    size_t nl = (size_t)T * (size_t)V;
    float *lc = malloc(nl * sizeof(float)), *lf = malloc(nl * sizeof(float)), *lx = malloc(nl * sizeof(float));
    int on = 0;
    uint64_t calls0 = 0, calls1 = 0;
    CHECK(td_backend_cuda_gemm_info(fast->backend, &on, &calls0) == 0 && on, "fast mode: the cuBLAS GEMM is set up");
    prefill(cpu, prompt, (int)T, lc);
    prefill(fast, prompt, (int)T, lf);
    prefill(exact, prompt, (int)T, lx);
    td_backend_cuda_gemm_info(fast->backend, &on, &calls1);
    CHECK(calls1 > calls0, "fast mode: the %lld-token prefill issued cuBLAS GEMMs (%llu)", (long long)T, (unsigned long long)(calls1 - calls0));
    size_t tail = (size_t)(T - 8) * (size_t)V;
    double ef = rel_err(lf + tail, lc + tail, 8 * (int64_t)V), ex = rel_err(lx + tail, lc + tail, 8 * (int64_t)V);
    CHECK(ef < 5e-2, "fast mode: prefill logits rel err %.3g vs the CPU", ef);
    CHECK(ef > 0, "fast mode: logits differ from the CPU's at all (rel err %.3g): else the GEMM path did not run", ef);
    uint64_t xc = 1;
    CHECK(td_backend_cuda_gemm_info(exact->backend, &on, &xc) == 0 && !on && xc == 0, "batch-invariant: no cuBLAS (on %d, %llu calls)",
          on, (unsigned long long)xc);
    CHECK(ex < 1e-4, "batch-invariant: prefill logits rel err %.3g vs the CPU", ex);

    /* a prompt of more than 128 tokens (the prompt 4 times, 4T + 4 >= 136): its attention takes the
       tensor-core tiles (cuda_attn.cu), TD_CUDA_ATTN_TILE=0 the per-row kernel; both within 5e-2 of the CPU */
    const int TL = 4 * (int)T + 4;
    int32_t *lp = malloc(sizeof(int32_t) * (size_t)TL);
    for (int i = 0; i < TL; i++) lp[i] = prompt[i % T];
    setenv("TD_CUDA_ATTN_TILE", "0", 1);
    td_engine *rowk = load("cuda", false, 0);
    unsetenv("TD_CUDA_ATTN_TILE");
    size_t nll = (size_t)TL * (size_t)V, tl = (size_t)(TL - 8) * (size_t)V;
    float *llc = malloc(nll * sizeof(float)), *llf = malloc(nll * sizeof(float)), *llr = malloc(nll * sizeof(float));
    double eft = 1, efr = 1;
    if (rowk) {
        prefill(cpu, lp, TL, llc);
        prefill(fast, lp, TL, llf);
        prefill(rowk, lp, TL, llr);
        eft = rel_err(llf + tl, llc + tl, 8 * (int64_t)V);
        efr = rel_err(llr + tl, llc + tl, 8 * (int64_t)V);
        CHECK(eft < 5e-2 && efr < 5e-2, "fast mode, %d-token prompt: logits rel err %.3g (tiled attention), %.3g (per-row) vs the CPU", TL,
              eft, efr);
        CHECK(memcmp(llf + tl, llr + tl, 8 * (size_t)V * sizeof(float)) != 0, "the %d-token prompt's logits are the per-row kernel's", TL);
        td_engine_free(rowk);
    }
    free(lp); free(llc); free(llf); free(llr);

    int32_t gc[G], gf[G], gx[G], gd[G];
    greedy(cpu, prompt, (int)T, 0, gc);
    greedy(exact, prompt, (int)T, 0, gx);
    greedy(fast, prompt, (int)T, 0, gf);
    int agree = 0;
    while (agree < G && gf[agree] == gc[agree]) agree++;
    CHECK(memcmp(gx, gc, sizeof gc) == 0, "batch-invariant: greedy equals the CPU's");
    CHECK(agree >= 8, "fast mode: greedy agrees with the CPU for %d of %d tokens (8 needed)", agree, G);
    int same = 0;
    for (int d = 1; d <= 4; d++) {
        greedy(fast, prompt, (int)T, d, gd);
        bool ok = memcmp(gd, gf, sizeof gf) == 0;
        CHECK(ok, "fast mode: greedy at depth %d differs from its depth 0", d);
        same += ok;
    }
    printf("cuda fast: prefill logits rel err %.2e (fast, %llu cuBLAS calls for a %lld-token prompt) and %.2e (batch-invariant) vs the CPU; "
           "a %d-token prompt %.2e (tensor-core attention tiles) and %.2e (per-row); "
           "fast greedy agrees with the CPU for %d of %d tokens; fast depths 1-4 equal its depth 0: %d/4\n",
           ef, (unsigned long long)(calls1 - calls0), (long long)T, ex, TL, eft, efr, agree, G, same);
    free(lc); free(lf); free(lx);
    td_engine_free(cpu);
    td_engine_free(fast);
    td_engine_free(exact);
    td_weights_free(rw);
    TEST_MAIN_END("cuda_fast");
}
