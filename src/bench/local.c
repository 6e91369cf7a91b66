/* In-process runner: one warm engine and one session for every depth, and
 * the verify/draft cost timer of the speedup model. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench/runner.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "model/seq.h"
#include "util/err.h"

int td_bench_local_open(const char *dir, int threads, int max_context, int engine_depth, bool prefix_caching, int quantize, int precision, int isa, bool mmap_weights, bench_local *L,
                     td_err *err) {
    memset(L, 0, sizeof *L);
    int rc = td_tok_load(dir, &L->tok, err);
    if (rc) return rc;
    if ((rc = td_bench_chat_init(&L->chat, L->tok, err))) goto fail;
    /* one request at a time: room for one sequence; prefix caching only
     * when asked (the suite measures cold prefill) */
    td_engine_opts eo = {.n_threads = threads, .max_context = max_context, .spec_depth = engine_depth, .max_seqs = 1,
                         .no_prefix_caching = !prefix_caching, .quantize = quantize,
                         .precision = (td_precision)precision, .isa = isa, .mmap_weights = mmap_weights};
    if ((rc = td_engine_load(dir, &eo, &L->eng, err))) goto fail;
    if ((rc = td_session_new(L->eng, &L->s, err))) goto fail;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    L->threads = threads;
    L->engine_depth = engine_depth;
    L->prefix_caching = prefix_caching;
    td_model_info mi;
    td_engine_info(L->eng, &mi);
    for (int i = 0; i < mi.n_eos && L->n_stop < TD_MAX_SPEC_DEPTH; i++) L->stop[L->n_stop++] = mi.eos_token_ids[i];
    int32_t e = td_tok_eos_id(L->tok);
    bool have = false;
    for (int i = 0; i < L->n_stop; i++) have |= L->stop[i] == e;
    if (e >= 0 && !have && L->n_stop < TD_MAX_SPEC_DEPTH) L->stop[L->n_stop++] = e;
    /* the chat turn end, when the vocabulary has it */
    int32_t im_end = td_tok_token_id(L->tok, "<|im_end|>");
    have = false;
    for (int i = 0; i < L->n_stop; i++) have |= L->stop[i] == im_end;
    if (im_end >= 0 && !have && L->n_stop < TD_MAX_SPEC_DEPTH) L->stop[L->n_stop++] = im_end;
    return TD_OK;
fail:
    td_bench_local_close(L);
    return rc;
}

void td_bench_local_close(bench_local *L) {
    td_session_free(L->s);
    td_engine_free(L->eng);
    td_bench_chat_free(&L->chat);
    td_tok_free(L->tok);
    memset(L, 0, sizeof *L);
}

typedef struct first_tok {
    double t0, first;
} first_tok;

static int on_token(void *u, int32_t t) {
    (void)t;
    first_tok *f = u;
    if (f->first == 0) f->first = td_bench_now();
    return 0;
}

static int generate(bench_local *L, const int32_t *ids, int n, int depth, const bench_params *p, bench_sample *out, td_err *err) {
    bool autod = depth == BENCH_DEPTH_AUTO;
    td_gen_opts go = {.max_tokens = p->max_tokens, .spec_depth = autod ? L->auto_max : depth, .spec_auto = autod, .draft_sampling = p->draft_sampling,
                      .ignore_eos = p->ignore_eos, .stop_ids = p->ignore_eos ? NULL : L->stop, .n_stop = p->ignore_eos ? 0 : L->n_stop};
    out->cond.load1 = td_bench_load1();
    first_tok ft = {td_bench_now(), 0};
    td_gen_result res;
    int rc = td_session_generate(L->s, ids, n, &p->sampling, &go, on_token, &ft, &res, err);
    if (rc) return rc;
    out->n_prompt = res.n_prompt;
    out->n_reused = res.n_reused;
    out->n_generated = res.n_generated;
    out->prefill_s = res.prefill_seconds;
    out->decode_s = res.decode_seconds;
    out->ttft_s = ft.first > 0 ? ft.first - ft.t0 : 0;
    out->spec = res.spec;
    out->depth = depth;
    out->cond.threads = L->threads;
    out->cond.max_tokens = p->max_tokens;
    out->cond.temperature = p->sampling.temperature;
    out->cond.engine_depth = L->engine_depth;
    out->cond.ignore_eos = p->ignore_eos;
    snprintf(out->cond.backend, sizeof out->cond.backend, "in-process%s",
             td_engine_options(L->eng)->precision == TD_PRECISION_BF16 ? ", bf16 activations" : td_engine_options(L->eng)->precision == TD_PRECISION_INT8 ? ", int8 activations" : "");
    return TD_OK;
}

int td_bench_local_run(bench_local *L, const int32_t *ids, int n, int depth, const bench_params *p, bench_sample *out, td_err *err) {
    td_session_reset(L->s);
    return generate(L, ids, n, depth, p, out, err);
}

int td_bench_local_turn(bench_local *L, const int32_t *ids, int n, int depth, const bench_params *p, bench_sample *out, td_err *err) {
    return generate(L, ids, n, depth, p, out, err);
}

uint64_t td_bench_local_session_bytes(const bench_local *L, int tokens) {
    if (!L->s) return 0;
    td_kv_info ki;
    td_engine_kv_info(L->eng, &ki);
    const td_seq *q = td_session_seq(L->s);
    uint64_t blocks = ki.block_size > 0 ? ((uint64_t)tokens + 1 + (uint64_t)ki.block_size - 1) / (uint64_t)ki.block_size : 0;
    uint64_t b = blocks * ki.bytes_per_block;                                          /* KV blocks, MTP layer included */
    b += td_seq_state_bytes_for(td_engine_cfg(L->eng), q->n_ckpt_slots); /* DeltaNet + checkpoints */
    return b;
}

/* ---- verify / draft cost ------------------------------------------------------- */


int td_bench_local_costs(bench_local *L, const int32_t *ctx, int n_ctx, int max_n, int reps, bench_costs *out, td_err *err) {
    memset(out, 0, sizeof *out);
    td_engine *e = L->eng;
    const td_config *cfg = td_engine_cfg(e);
    if (max_n > L->engine_depth + 1) max_n = L->engine_depth + 1;
    if (max_n > BENCH_MAX_DEPTHS) max_n = BENCH_MAX_DEPTHS;
    if (max_n < 1) max_n = 1;
    if (reps < 1) reps = 1;
    if (reps > 64) reps = 64;
    if (n_ctx < 2) return TD_FAIL(err, TD_ERR_ARG, "cost timing needs a context of at least 2 tokens");
    size_t V = (size_t)cfg->vocab_size, H = (size_t)cfg->hidden_size;
    float *logits = malloc((size_t)(max_n + 1) * V * sizeof(float));
    float *hid = malloc((size_t)(n_ctx > max_n ? n_ctx : max_n) * H * sizeof(float));
    float *hout = malloc(H * sizeof(float));
    double *times = malloc((size_t)(max_n + 2) * reps * sizeof(double));
    if (!logits || !hid || !hout || !times) {
        free(logits); free(hid); free(hout); free(times);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for cost timing");
    }
    td_seq *q = td_session_seq(L->s);
    td_session_reset(L->s);
    int rc = td_seq_reserve(q, n_ctx + max_n * reps * 2 + 8, err);
    /* prefill with hidden states, then the MTP entries of the context */
    td_fwd_item pf = {.seq = q, .tokens = ctx, .n = n_ctx, .logits_rows = 1, .logits = logits, .hidden = hid};
    if (!rc) rc = td_forward(td_engine_fwd(e), &pf, 1, err);
    bool mtp = td_engine_model(e)->has_mtp;
    if (!rc && mtp) {
        td_mtp_item mi = {.seq = q, .tokens = ctx + 1, .hidden = hid, .pos0 = 0, .n = n_ctx - 1};
        rc = td_mtp_forward(td_engine_fwd(e), &mi, 1, err);
    }
    int32_t toks[BENCH_MAX_DEPTHS + 1];
    for (int i = 0; i <= max_n && i < BENCH_MAX_DEPTHS + 1; i++) toks[i] = ctx[(n_ctx - 1 - i + 4 * n_ctx) % n_ctx];
    out->context = n_ctx;
    /* repeats interleaved over n (and the draft step) so drift is shared */
    for (int r = 0; r < reps && !rc; r++) {
        for (int n = 1; n <= max_n + 1 && !rc; n++) {
            double t0 = td_bench_now();
            if (n <= max_n) {
                int base = q->n_past;
                td_fwd_item it = {.seq = q, .tokens = toks, .n = n, .logits_rows = n == 1 ? 1 : n, .logits = logits,
                                  .checkpoint = n > 1};
                rc = td_forward(td_engine_fwd(e), &it, 1, err);
                times[(size_t)n * reps + r] = td_bench_now() - t0;
                /* drop all but one of the n tokens (their DeltaNet checkpoints allow it) */
                if (!rc && n > 1) rc = td_seq_truncate(q, base + 1, err);
            } else if (mtp) {
                /* one draft step: rewrites the newest MTP entry */
                int pos0 = q->mtp_n < q->n_past - 1 ? q->mtp_n : q->n_past - 2;
                td_mtp_item mi = {.seq = q, .tokens = toks, .hidden = hid, .pos0 = pos0, .n = 1, .logits_rows = 1, .logits = logits,
                                  .hidden_out = hout};
                rc = td_mtp_forward(td_engine_fwd(e), &mi, 1, err);
                times[(size_t)n * reps + r] = td_bench_now() - t0;
            }
        }
    }
    if (!rc) {
        out->max_n = max_n;
        for (int n = 1; n <= max_n; n++) out->verify_s[n] = td_bench_stat_of(times + (size_t)n * reps, reps).median;
        out->t1_s = out->verify_s[1];
        for (int n = 1; n <= max_n; n++) out->verify[n] = out->t1_s > 0 ? out->verify_s[n] / out->t1_s : 0;
        if (mtp) {
            out->draft_s = td_bench_stat_of(times + (size_t)(max_n + 1) * reps, reps).median;
            out->draft = out->t1_s > 0 ? out->draft_s / out->t1_s : 0;
        }
    }
    td_session_reset(L->s);
    td_mtp_lost(L->s);
    free(logits); free(hid); free(hout); free(times);
    return rc;
}
