/* Generation with speculative decoding by the model's own MTP head.
 *
 * One step at depth k, with n tokens held and x the next token (sampled,
 * not yet fed):
 *   1. draft d1..dk with the MTP head (entry p pairs target h_p with token p+1;
 *      pending target hidden states are consumed first, then the MTP feeds
 *      its own h' back for depth > 1);
 *   2. verify [x, d1..dk] in ONE batched forward of the target, keeping the
 *      DeltaNet state after every position;
 *   3. accept (greedy: exact match; sampling: rejection sampling), roll the
 *      sequence back to the last accepted token (attention KV truncates,
 *      DeltaNet state restores from its checkpoint) and keep the target's
 *      hidden states of the accepted positions so the MTP entries drafted
 *      from h' are rewritten from the target's states before the next draft.
 * Kernels are batch-invariant (backend.h), so greedy output is
 * bit-identical to depth 0. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine/engine.h"
#include "sample/sampler.h"
#include "util/err.h"

#define PREFILL_CHUNK 256

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Scratch: logits and hidden rows for verify / prefill / drafts. */
typedef struct {
    float *vlogits;  /* [(k+1) x V] */
    float *vhidden;  /* [max(k+1, CHUNK) x H] */
    float *mhidden;  /* [pend_cap + 1 x H] MTP h' rows */
    float *qprobs;   /* [k x V] draft distributions (draft sampling) */
    float *probs;    /* [V] */
    float *mlogits;  /* [V] */
} gen_buffers;

static int buffers(td_session *s, int k, gen_buffers *b, td_err *err) {
    const td_config *c = &s->eng->model->cfg;
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden_size;
    size_t rows_h = (size_t)(k + 1 > PREFILL_CHUNK ? k + 1 : PREFILL_CHUNK);
    size_t need = (size_t)(k + 1) * V + rows_h * H + (size_t)(s->pend_cap + 1) * H + (size_t)(k ? k : 1) * V + 2 * V;
    if (need > s->work_cap) {
        free(s->work);
        s->work = malloc(need * sizeof(float));
        s->work_cap = s->work ? need : 0;
        if (!s->work) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for generation buffers");
    }
    float *p = s->work;
    b->vlogits = p; p += (size_t)(k + 1) * V;
    b->vhidden = p; p += rows_h * H;
    b->mhidden = p; p += (size_t)(s->pend_cap + 1) * H;
    b->qprobs = p; p += (size_t)(k ? k : 1) * V;
    b->probs = p; p += V;
    b->mlogits = p;
    return TD_OK;
}

/* Writes MTP entries for all pending rows but the last (their next token is
 * held), leaving one pending row. Used during prefill and when pend fills. */
static int mtp_catch_up(td_session *s, td_err *err) {
    td_seq *q = &s->seq;
    int P = q->n_past - q->mtp_n, H = s->eng->model->cfg.hidden_size;
    if (P <= 1) return TD_OK;
    td_mtp_item it = {.seq = q, .tokens = q->tokens + q->mtp_n + 1, .hidden = s->pend, .pos0 = q->mtp_n, .n = P - 1};
    int rc = td_mtp_forward(s->eng->fwd, &it, 1, err);
    if (rc) return rc;
    memmove(s->pend, s->pend + (size_t)(P - 1) * H, (size_t)H * sizeof(float));
    return TD_OK;
}

/* Appends target hidden rows for the newest n positions to pend. */
static int pend_push(td_session *s, const float *rows, int n, td_err *err) {
    int H = s->eng->model->cfg.hidden_size;
    for (int i = 0; i < n; i++) {
        int P = s->seq.n_past - n + i - s->seq.mtp_n; /* rows already pending before this one */
        if (P >= s->pend_cap) {
            /* keep pend bounded: write the entries whose token is known */
            int saved = s->seq.n_past;
            s->seq.n_past = s->seq.n_past - n + i;
            int rc = mtp_catch_up(s, err);
            s->seq.n_past = saved;
            if (rc) return rc;
            P = s->seq.n_past - n + i - s->seq.mtp_n;
        }
        memcpy(s->pend + (size_t)P * H, rows + (size_t)i * H, (size_t)H * sizeof(float));
    }
    return TD_OK;
}

/* Feeds tokens in chunks; leaves logits of the last token in s->logits. */
static int prefill(td_session *s, const int32_t *toks, int n, bool track_mtp, gen_buffers *b, td_err *err) {
    for (int i = 0; i < n; i += PREFILL_CHUNK) {
        int c = n - i < PREFILL_CHUNK ? n - i : PREFILL_CHUNK;
        bool last = i + c == n;
        td_fwd_item it = {.seq = &s->seq, .tokens = toks + i, .n = c, .logits_rows = last ? 1 : 0, .logits = s->logits,
                          .hidden = track_mtp ? b->vhidden : NULL};
        int rc = td_forward(s->eng->fwd, &it, 1, err);
        if (rc) return rc;
        if (track_mtp && ((rc = pend_push(s, b->vhidden, c, err)) || (rc = mtp_catch_up(s, err)))) return rc;
    }
    return TD_OK;
}

static bool is_stop(const td_engine *e, const td_gen_opts *o, int32_t t) {
    if (!o->ignore_eos)
        for (int i = 0; i < e->model->cfg.n_eos; i++)
            if (t == e->model->cfg.eos_token_ids[i]) return true;
    for (int i = 0; i < o->n_stop; i++)
        if (t == o->stop_ids[i]) return true;
    return false;
}

typedef struct {
    td_session *s;
    const td_gen_opts *o;
    td_token_fn fn;
    void *user;
    td_gen_result *res;
} emitter;

/* Emits one token; returns true when generation must end. */
static bool emit(emitter *em, int32_t t) {
    em->res->n_generated++;
    int r = em->fn ? em->fn(em->user, t) : 0;
    if (r) { em->res->finish = r == 2 ? TD_FINISH_STOP : TD_FINISH_CANCEL; return true; }
    if (is_stop(em->s->eng, em->o, t)) { em->res->finish = TD_FINISH_STOP; return true; }
    if (em->res->n_generated >= em->o->max_tokens) { em->res->finish = TD_FINISH_LENGTH; return true; }
    return false;
}

/* Draws from the residual normalize(max(0, p - q)); q == NULL means one-hot at d. */
static int32_t sample_residual(td_sampler *sm, float *p, const float *q, int32_t d, int V) {
    double sum = 0;
    for (int i = 0; i < V; i++) {
        float r = q ? p[i] - q[i] : (i == d ? 0.0f : p[i]);
        p[i] = r > 0 ? r : 0.0f;
        sum += p[i];
    }
    if (sum <= 0) return d; /* p == q: rejection had probability 0 */
    for (int i = 0; i < V; i++) p[i] = (float)(p[i] / sum);
    return td_sample_from(sm, p);
}

/* Drafts k tokens; returns them in d[]. q rows filled when draft sampling. */
static int draft(td_session *s, int32_t x, int k, td_sampler *sm, bool draft_sampling, gen_buffers *b, int32_t *d, td_err *err) {
    td_seq *q = &s->seq;
    const td_config *c = &s->eng->model->cfg;
    int V = c->vocab_size, H = c->hidden_size, P = q->n_past - q->mtp_n;
    /* entries mtp_n .. n_past-1: tokens at mtp_n+1 .. n_past-1, then x */
    int32_t toks[TD_MAX_SPEC_DEPTH + 8];
    TD_ASSERT(P >= 1 && P <= s->pend_cap);
    for (int i = 0; i < P - 1; i++) toks[i] = q->tokens[q->mtp_n + 1 + i];
    toks[P - 1] = x;
    td_mtp_item it = {.seq = q, .tokens = toks, .hidden = s->pend, .pos0 = q->mtp_n, .n = P, .logits_rows = 1, .logits = b->mlogits,
                      .hidden_out = b->mhidden};
    int rc = td_mtp_forward(s->eng->fwd, &it, 1, err);
    if (rc) return rc;
    float *h = b->mhidden + (size_t)(P - 1) * H;
    for (int j = 0; j < k; j++) {
        if (j > 0) {
            td_mtp_item ci = {.seq = q, .tokens = &d[j - 1], .hidden = h, .pos0 = q->n_past - 1 + j, .n = 1, .logits_rows = 1,
                              .logits = b->mlogits, .hidden_out = b->mhidden};
            if ((rc = td_mtp_forward(s->eng->fwd, &ci, 1, err))) return rc;
            h = b->mhidden;
        }
        if (draft_sampling && !td_sampler_is_greedy(sm)) {
            float *qp = b->qprobs + (size_t)j * V;
            td_sampler_probs(sm, b->mlogits, qp);
            d[j] = td_sample_from(sm, qp);
        } else {
            int32_t best = 0;
            for (int i = 1; i < V; i++) if (b->mlogits[i] > b->mlogits[best]) best = i;
            d[j] = best;
        }
        if (j == 0) memmove(b->mhidden, h, (size_t)H * sizeof(float)), h = b->mhidden;
    }
    return TD_OK;
}

int td_session_generate(td_session *s, const int32_t *prompt, int n_prompt, const td_sampling *sp, const td_gen_opts *o,
                        td_token_fn fn, void *user, td_gen_result *res, td_err *err) {
    td_engine *e = s->eng;
    const td_config *c = &e->model->cfg;
    td_seq *q = &s->seq;
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    if (n_prompt <= 0) return TD_FAIL(err, TD_ERR_ARG, "empty prompt");
    if (o->max_tokens <= 0) return TD_FAIL(err, TD_ERR_ARG, "max_tokens must be positive");
    if (o->spec_depth < 0 || o->spec_depth > TD_MAX_SPEC_DEPTH) return TD_FAIL(err, TD_ERR_ARG, "spec depth %d out of 0..%d", o->spec_depth, TD_MAX_SPEC_DEPTH);
    if (o->spec_depth > q->n_ckpt_slots - 1)
        return TD_FAIL(err, TD_ERR_ARG, "spec depth %d exceeds the engine's %d (set td_engine_opts.spec_depth)", o->spec_depth, q->n_ckpt_slots - 1);
    if (n_prompt >= e->max_context)
        return TD_FAIL(err, TD_ERR_LIMIT, "request (%d tokens) exceeds the available context size (%d tokens)", n_prompt, e->max_context);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size) return TD_FAIL(err, TD_ERR_ARG, "token id %d outside the vocabulary", prompt[i]);
    int depth = e->model->has_mtp ? o->spec_depth : 0;
    bool track = depth > 0;
    gen_buffers b = {0};
    int rc = buffers(s, depth, &b, err);
    if (rc) return rc;
    td_sampler sm;
    if ((rc = td_sampler_init(&sm, sp, c->vocab_size, prompt, n_prompt, err))) return rc;

    /* Reuse the session's state when it holds a strict prefix of the prompt. */
    int reuse = q->n_past;
    if (reuse >= n_prompt || memcmp(q->tokens, prompt, (size_t)reuse * sizeof(int32_t)) != 0 || (track && !s->mtp_ok && reuse > 0)) {
        td_session_reset(s);
        reuse = 0;
    }
    if (reuse == 0) { q->mtp_n = 0; s->mtp_ok = true; }
    res->n_reused = reuse;
    double t0 = now_s();
    rc = prefill(s, prompt + reuse, n_prompt - reuse, track, &b, err);
    if (!track) s->mtp_ok = false;
    double t1 = now_s();
    res->prefill_seconds = t1 - t0;
    if (rc) goto out;

    emitter em = {.s = s, .o = o, .fn = fn, .user = user, .res = res};
    int V = c->vocab_size;
    int32_t x = td_sampler_sample(&sm, s->logits);
    for (;;) {
        td_sampler_accept(&sm, x);
        if (emit(&em, x)) break;
        int k = depth;
        if (k > o->max_tokens - res->n_generated) k = o->max_tokens - res->n_generated;
        if (k > e->max_context - 1 - q->n_past) k = e->max_context - 1 - q->n_past;
        if (q->n_past + 1 >= e->max_context) { res->finish = TD_FINISH_LENGTH; break; }
        if (k <= 0) {
            td_fwd_item it = {.seq = q, .tokens = &x, .n = 1, .logits_rows = 1, .logits = s->logits, .hidden = track ? b.vhidden : NULL};
            if ((rc = td_forward(e->fwd, &it, 1, err))) break;
            if (track && (rc = pend_push(s, b.vhidden, 1, err))) break;
            x = td_sampler_sample(&sm, s->logits);
            continue;
        }
        int32_t toks[TD_MAX_SPEC_DEPTH + 1];
        if ((rc = draft(s, x, k, &sm, o->draft_sampling, &b, toks + 1, err))) break;
        toks[0] = x;
        int n0 = q->n_past;
        td_fwd_item it = {.seq = q, .tokens = toks, .n = k + 1, .logits_rows = k + 1, .logits = b.vlogits, .hidden = b.vhidden, .checkpoint = true};
        if ((rc = td_forward(e->fwd, &it, 1, err))) break;
        /* accept */
        int a = 0;
        int32_t next = -1;
        for (; a < k; a++) {
            const float *row = b.vlogits + (size_t)a * V;
            int32_t d = toks[1 + a];
            if (td_sampler_is_greedy(&sm)) {
                int32_t t = td_sampler_greedy(&sm, row);
                if (t != d) { next = t; break; }
            } else {
                td_sampler_probs(&sm, row, b.probs);
                const float *qrow = o->draft_sampling ? b.qprobs + (size_t)a * V : NULL;
                float qd = qrow ? qrow[d] : 1.0f;
                double u = td_rng_uniform(&sm.rng);
                if (!(qd > 0 && u < (double)b.probs[d] / qd)) { next = sample_residual(&sm, b.probs, qrow, d, V); break; }
            }
            td_sampler_accept(&sm, d);
        }
        if (next < 0) next = td_sampler_sample(&sm, b.vlogits + (size_t)k * V); /* bonus token */
        res->spec.drafts++;
        res->spec.draft_tokens += (uint64_t)k;
        res->spec.accepted_tokens += (uint64_t)a;
        for (int i = 0; i < a; i++) res->spec.accepted_per_pos[i]++;
        /* emit accepted drafts; a stop inside them ends generation there */
        int emitted = 0;
        bool done = false;
        while (emitted < a && !done) done = emit(&em, toks[1 + emitted++]);
        /* hold x and the accepted drafts except a final stopping one */
        int keep = done ? n0 + emitted : n0 + 1 + a;
        if ((rc = td_seq_truncate(q, keep, err))) break;
        q->mtp_n = n0; /* entries >= n0 were drafted from h': rewrite from target states */
        memcpy(s->pend, b.vhidden, (size_t)(keep - n0) * c->hidden_size * sizeof(float));
        if (done) break;
        x = next;
    }
out:
    res->decode_seconds = now_s() - t1;
    if (rc) s->mtp_ok = false;
    td_spec_counters *tot = &e->spec_totals;
    tot->drafts += res->spec.drafts;
    tot->draft_tokens += res->spec.draft_tokens;
    tot->accepted_tokens += res->spec.accepted_tokens;
    for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) tot->accepted_per_pos[i] += res->spec.accepted_per_pos[i];
    td_sampler_free(&sm);
    return rc;
}
