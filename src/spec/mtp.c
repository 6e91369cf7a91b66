#include "spec/mtp.h"
#include <string.h>
#include "engine/engine.h"
#include "util/err.h"

int td_mtp_track_init(td_mtp_track *t, td_backend *b, int H, td_err *err) {
    memset(t, 0, sizeof *t);
    t->cap = TD_MTP_PEND_CAP;
    t->H = H;
    t->pend = b->ops->alloc(b, td_mtp_track_bytes_for(H));
    if (!t->pend) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for the MTP rows");
    return TD_OK;
}

void td_mtp_track_free(td_mtp_track *t, td_backend *b) {
    b->ops->free(b, t->pend);
    t->pend = NULL;
}

size_t td_mtp_track_bytes_for(int H) { return (size_t)TD_MTP_PEND_CAP * (size_t)H * sizeof(float); }

void td_mtp_lost(td_session *s) { s->mtp.ok = false; }
bool td_mtp_valid(const td_session *s) { return s->mtp.ok; }

void td_mtp_start(td_session *s, bool track) {
    s->seq.mtp_n = 0;
    s->mtp.ok = track;
}

void td_mtp_adopt(td_session *s, int len, const float *hidden) {
    td_bk_upload(s->eng->backend, s->mtp.pend, hidden, (size_t)s->mtp.H * sizeof(float));
    s->seq.mtp_n = len - 1;
    s->mtp.ok = true;
}

/* Entries of the pending rows of positions mtp_n .. n_past-2 (held tokens). */
static int catch_up_to(td_session *s, int n_past, td_err *err) {
    td_seq *q = &s->seq;
    td_mtp_track *t = &s->mtp;
    int P = n_past - q->mtp_n;
    if (P <= 1) return TD_OK;
    td_mtp_item it = {.seq = q, .tokens = q->tokens + q->mtp_n + 1, .hidden_d = t->pend, .pos0 = q->mtp_n, .n = P - 1};
    int rc = td_mtp_forward(s->eng->fwd, &it, 1, err);
    if (rc) return rc;
    td_backend *b = s->eng->backend;
    b->ops->copy(b, t->pend, t->pend + (size_t)(P - 1) * t->H, (size_t)t->H * sizeof(float));
    return TD_OK;
}

int td_mtp_catch_up(td_session *s, td_err *err) { return catch_up_to(s, s->seq.n_past, err); }

/* A prefill chunk of n > 1 rows (positions n0 .. n_past-1): the entries of
 * the rows pending before it (their next token is the chunk's first), then
 * those of the chunk's rows but its last, each in one pass; the last row
 * stays pending. Pushed row by row, a 512-token chunk ran 27 passes of 19
 * rows, each reading the MTP layer's weights once; now they are read once
 * per chunk. (On the 2-core CPU with int8, 19 rows are already compute-bound:
 * the time stayed ~0.6 ms per row, bench/results/autodepth-fresh-aa-2026-12-07.md.)
 * The kernels give the same bits for any number of rows, so the entries are
 * the same (test_spec). */
static int push_chunk(td_session *s, const float *rows, int n, td_err *err) {
    td_seq *q = &s->seq;
    td_mtp_track *t = &s->mtp;
    td_backend *b = s->eng->backend;
    int n0 = q->n_past - n, rc;
    TD_ASSERT(q->mtp_n <= n0 && n0 - q->mtp_n <= t->cap);
    if (q->mtp_n < n0) {
        td_mtp_item it = {.seq = q, .tokens = q->tokens + q->mtp_n + 1, .hidden_d = t->pend, .pos0 = q->mtp_n, .n = n0 - q->mtp_n};
        if ((rc = td_mtp_forward(s->eng->fwd, &it, 1, err))) return rc;
    }
    td_mtp_item it = {.seq = q, .tokens = q->tokens + n0 + 1, .hidden_d = rows, .pos0 = n0, .n = n - 1};
    if ((rc = td_mtp_forward(s->eng->fwd, &it, 1, err))) return rc;
    b->ops->copy(b, t->pend, rows + (size_t)(n - 1) * t->H, (size_t)t->H * sizeof(float));
    return TD_OK;
}

int td_mtp_push(td_session *s, const float *rows, int n, td_err *err) {
    td_mtp_track *t = &s->mtp;
    td_backend *b = s->eng->backend;
    if (n > 1) return push_chunk(s, rows, n, err);
    if (n < 1) return TD_OK;
    int pos = s->seq.n_past - 1; /* a decode step's one row */
    if (pos - s->seq.mtp_n >= t->cap) { /* full: write the entries whose next token is known */
        int rc = catch_up_to(s, pos, err);
        if (rc) return rc;
    }
    b->ops->copy(b, t->pend + (size_t)(pos - s->seq.mtp_n) * t->H, rows, (size_t)t->H * sizeof(float));
    return TD_OK;
}

void td_mtp_rewind(td_session *s, int n0, const float *rows, int keep) {
    td_backend *b = s->eng->backend;
    s->seq.mtp_n = n0;
    b->ops->copy(b, s->mtp.pend, rows, (size_t)(keep - n0) * s->mtp.H * sizeof(float));
}

void td_mtp_first_item(td_session *s, int32_t x, int32_t *tokens, td_mtp_item *it) {
    td_seq *q = &s->seq;
    int P = q->n_past - q->mtp_n;
    TD_ASSERT(P >= 1 && P <= s->mtp.cap);
    for (int t = 0; t < P - 1; t++) tokens[t] = q->tokens[q->mtp_n + 1 + t];
    tokens[P - 1] = x;
    *it = (td_mtp_item){.seq = q, .tokens = tokens, .hidden_d = s->mtp.pend, .pos0 = q->mtp_n, .n = P};
}

bool td_mtp_checkpoint_ready(td_session *s, bool track) {
    td_err err;
    if (!track || !s->mtp.ok) return false;
    if (td_mtp_catch_up(s, &err) != 0) s->mtp.ok = false;
    return s->mtp.ok;
}

const float *td_mtp_last_row(const td_session *s) { return s->mtp.pend; }
