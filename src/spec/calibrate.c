/* Start-up calibration of the adaptive-depth cost table. */
#include "spec/calibrate.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine/engine.h"
#include "spec/gen.h"
#include "util/err.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CAL_CTX 16
#define CAL_MAX_REPS 15
#define CAL_BUDGET_S 0.3 /* rounds beyond the caller's reps: while they fit in this (fast models only) */
#define CAL_MAX_POINTS 32

int td_engine_calibrate_spec(td_engine *e, int max_k, int rows, int reps, td_err *err) {
    const td_config *c = td_engine_cfg(e);
    if (max_k < 0) max_k = 0;
    if (max_k > td_engine_options(e)->spec_depth) max_k = td_engine_options(e)->spec_depth;
    if (rows < 1) rows = 1;
    if (reps < 1) reps = 1;
    if (reps > CAL_MAX_REPS) reps = CAL_MAX_REPS;
    /* a fast model gets more rounds, up to CAL_MAX_REPS or CAL_BUDGET_S: on the
     * demo model a forward takes ~0.5 ms and 3 rounds left medians 2-3x off
     * (the table's shape comes from here: see td_ad_costs) */
    int max_reps = CAL_MAX_REPS;
    /* the T to time: 1..max_k+1; with several requests every T up to 16
     * (a few requests' verify rows: the matmul's cost is not linear there,
     * 4 -> 8 rows cost 1.6x on the 27B shape with AVX-512, and interpolating
     * from 5 to 10 priced 8 rows 30% low), then the rows of 4, 8, ...
     * requests at max_k */
    int pts[CAL_MAX_POINTS], np = 0;
    for (int t = 1; t <= max_k + 1 && np < CAL_MAX_POINTS; t++) pts[np++] = t;
    for (int t = max_k + 2; rows > 1 && max_k > 0 && t <= 16 && t <= rows * (max_k + 1) && np < CAL_MAX_POINTS; t++) pts[np++] = t;
    for (int r = 2; r <= rows && max_k > 0 && r * (max_k + 1) <= 64 && np < CAL_MAX_POINTS; r *= 2)
        if (r * (max_k + 1) > 16) pts[np++] = r * (max_k + 1);
    int max_t = pts[np - 1];
    /* positions written: the context, then per round every point (a
     * checkpointed verify is rolled back to one token) */
    int need;
    for (;;) {
        need = CAL_CTX + 8;
        for (int p = 0; p < np; p++) need += (max_reps + 1) * (pts[p] > 1 && pts[p] <= max_k + 1 ? 1 : pts[p]);
        if (need < td_engine_max_ctx(e)) break;
        if (max_reps > reps) { max_reps = reps; continue; } /* no room for more rounds */
        if (np == 1) break;
        np--; /* a tiny window: only what fits */
    }
    if (need >= td_engine_max_ctx(e)) return TD_OK;
    max_t = pts[np - 1];
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden_size;
    td_session *s = NULL;
    int rc = td_session_new(e, &s, err);
    if (rc) return rc;
    float *logits = malloc((size_t)max_t * V * sizeof(float));
    float *hid = malloc((size_t)(max_t > CAL_CTX ? max_t : CAL_CTX) * H * sizeof(float));
    float *hout = malloc(H * sizeof(float));
    int32_t *toks = malloc((size_t)(max_t > CAL_CTX ? max_t : CAL_CTX) * sizeof(int32_t));
    double *times = malloc((size_t)(np + 1) * (size_t)max_reps * sizeof(double));
    if (!logits || !hid || !hout || !toks || !times) { rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory for calibration"); goto out; }
    for (int i = 0; i < (max_t > CAL_CTX ? max_t : CAL_CTX); i++) toks[i] = (int32_t)((i * 7 + 3) % c->vocab_size);
    td_seq *q = td_session_seq(s);
    rc = td_seq_reserve(q, need, err);
    td_fwd_item pf = {.seq = q, .tokens = toks, .n = CAL_CTX, .logits_rows = 1, .logits = logits, .hidden = hid};
    if (!rc) rc = td_forward(td_engine_fwd(e), &pf, 1, err); /* also the warm-up: weights paged in */
    bool mtp = td_engine_model(e)->has_mtp;
    if (!rc && mtp) {
        td_mtp_item mi = {.seq = q, .tokens = toks + 1, .hidden = hid, .pos0 = 0, .n = CAL_CTX - 1};
        rc = td_mtp_forward(td_engine_fwd(e), &mi, 1, err);
    }
    for (int r = -1; r < reps && !rc; r++) { /* r = -1: a warm-up round, not kept */
        double r0 = now_s();
        for (int p = 0; p <= np && !rc; p++) {
            double t0 = now_s();
            if (p < np) {
                int n = pts[p], base = q->n_past;
                bool ck = n > 1 && n <= q->n_ckpt_slots;
                td_fwd_item it = {.seq = q, .tokens = toks, .n = n, .logits_rows = n, .logits = logits, .checkpoint = ck};
                rc = td_forward(td_engine_fwd(e), &it, 1, err);
                if (r >= 0) times[(size_t)p * max_reps + r] = now_s() - t0;
                if (!rc && ck) rc = td_seq_truncate(q, base + 1, err);
            } else if (mtp) {
                int pos0 = q->mtp_n < q->n_past - 1 ? q->mtp_n : q->n_past - 2;
                td_mtp_item mi = {.seq = q, .tokens = toks, .hidden = hid, .pos0 = pos0, .n = 1, .logits_rows = 1, .logits = logits,
                                  .hidden_out = hout};
                rc = td_mtp_forward(td_engine_fwd(e), &mi, 1, err);
                if (r >= 0) times[(size_t)p * max_reps + r] = now_s() - t0;
            }
        }
        if (r == -1 && max_reps > reps) { /* the warm-up round's time sets how many rounds the budget holds */
            double dt = now_s() - r0;
            int fit = dt > 0 ? (int)(CAL_BUDGET_S / dt) : max_reps;
            if (fit > max_reps) fit = max_reps;
            if (fit > reps) reps = fit | 1; /* odd: the median is one round's */
            if (reps > max_reps) reps = max_reps;
        }
    }
    if (!rc) {
        for (int p = 0; p <= np; p++) {
            if (p == np && !mtp) break;
            double *v = times + (size_t)p * max_reps;
            qsort(v, (size_t)reps, sizeof *v, cmp_d);
            double med = v[reps / 2];
            if (p < np) td_ad_costs_cal_fwd(&td_engine_ad(e)->costs, pts[p], med);
            else td_ad_costs_cal_mtp(&td_engine_ad(e)->costs, 1, med);
        }
        td_engine_ad(e)->calibrated = true;
    }
out:
    free(logits); free(hid); free(hout); free(toks); free(times);
    td_session_free(s);
    return rc;
}

static int discard(void *user, int32_t token, const float *logits) {
    (void)user, (void)token, (void)logits;
    return 0;
}

int td_engine_capture_graphs(td_engine *e, int max_depth, char *summary, size_t cap, td_err *err) {
    td_backend *b = td_engine_backend(e);
    if (cap) summary[0] = 0;
    if (!b->ops->graph_run || td_engine_options(e)->enforce_eager) return TD_OK;
    if (max_depth > td_engine_options(e)->spec_depth) max_depth = td_engine_options(e)->spec_depth;
    if (!td_engine_model(e)->has_mtp || max_depth < 0) max_depth = 0;
    uint64_t c0 = b->counters.graph_captures;
    const td_config *c = td_engine_cfg(e);
    int32_t prompt[4];
    for (int i = 0; i < 4; i++) prompt[i] = (int32_t)((i * 131 + 7) % c->vocab_size);
    int rc = TD_OK;
    for (int sampled = 0; sampled < 2 && !rc; sampled++)
        for (int d = 0; d <= max_depth && !rc; d++) {
            /* enough tokens for a few steady steps at this depth, within the window */
            int n = 3 * (d + 1) + 2;
            if (4 + n + d + 2 >= td_engine_max_ctx(e)) continue;
            td_session *s = NULL;
            if ((rc = td_session_new(e, &s, err))) break;
            td_sampling sp;
            td_sampling_default(&sp);
            sp.temperature = sampled ? 1.0f : 0.0f;
            sp.seed = 1;
            td_gen_opts go = {.max_tokens = n, .spec_depth = d, .ignore_eos = true};
            td_gen *g = NULL;
            rc = td_gen_begin(s, prompt, 4, &sp, &go, discard, NULL, &g, err);
            while (!rc && !td_gen_done(g)) {
                if (!(rc = td_gen_reserve_step(g, 64, err))) rc = td_gen_step(&g, 1, 64, err);
            }
            if (g) td_gen_end(g);
            td_session_free(s);
        }
    int held = 0;
    size_t nodes = 0, bytes = 0;
    (void)td_backend_cuda_graph_info(b, &held, &nodes, &bytes);
    if (cap)
        snprintf(summary, cap, "CUDA graphs: %llu captured at start-up for one request at depths 0..%d (%d held, %zu nodes, %.1f MiB "
                 "of device memory; others are captured when first seen; --enforce-eager turns them off)",
                 (unsigned long long)(b->counters.graph_captures - c0), max_depth, held, nodes, (double)bytes / 1048576.0);
    return rc;
}
