/* MTP bookkeeping of a session, in one place: which MTP entries are valid
 * and the target hidden rows still waiting for theirs.
 *
 * Entry p of the MTP layer pairs the target's final-normed hidden state h_p
 * with token p+1 (it lives at KV slot p+1 of the MTP layer, so each KV block
 * depends only on its own tokens). seq.mtp_n entries are valid (positions
 * 0..mtp_n-1; td_mtp_forward sets it, td_seq_truncate clips it). The hidden
 * rows of positions mtp_n .. n_past-1 are kept in `pend` (backend memory)
 * until the token after each is known; `ok` says they are all there (a feed
 * without hidden states, or a failed step, loses them: the next request then
 * recomputes from scratch rather than draft from a wrong history). */
#ifndef TANDEM_SPEC_MTP_H
#define TANDEM_SPEC_MTP_H
#include <stdbool.h>
#include "model/forward.h"
#include "tandem.h"

typedef struct td_mtp_track {
    float *pend;  /* backend [cap][H] */
    int cap, H;
    bool ok;      /* pend holds every row of mtp_n .. n_past-1 */
} td_mtp_track;

/* Pending rows a session keeps for the MTP head. */
#define TD_MTP_PEND_CAP (TD_MAX_SPEC_DEPTH + 4)

int td_mtp_track_init(td_mtp_track *t, td_backend *b, int H, td_err *err);
void td_mtp_track_free(td_mtp_track *t, td_backend *b);
/* Bytes td_mtp_track_init allocates. */
size_t td_mtp_track_bytes_for(int H);

/* The history is gone (feed without hidden rows, failed step, reset). */
void td_mtp_lost(td_session *s);
bool td_mtp_valid(const td_session *s);
/* A fresh sequence: no entries; tracked from now on when `track`. */
void td_mtp_start(td_session *s, bool track);
/* A prefix-cache hit of len tokens with valid MTP entries before len-1 and
 * h_{len-1} (host memory). */
void td_mtp_adopt(td_session *s, int len, const float *hidden);
/* Appends the target hidden rows (backend) of the newest n positions. */
int td_mtp_push(td_session *s, const float *rows, int n, td_err *err);
/* Writes the entries of every pending row but the last (their next token
 * is held), leaving one pending row. */
int td_mtp_catch_up(td_session *s, td_err *err);
/* After a verify that started at n0 and keeps positions up to keep-1: the
 * entries from n0 on were drafted from h', so they are rewritten from the
 * target's rows (backend, [keep - n0][H]). */
void td_mtp_rewind(td_session *s, int n0, const float *rows, int keep);
/* The first draft pass of a step: the pending rows and then x (the newest
 * token, not fed). tokens has room for TD_MTP_PEND_CAP entries. */
void td_mtp_first_item(td_session *s, int32_t x, int32_t *tokens, td_mtp_item *it);
/* Before a prefix-cache checkpoint: whether its MTP entries can be marked
 * valid (catching up first); the last pending row is td_mtp_last_row. */
bool td_mtp_checkpoint_ready(td_session *s, bool track);
const float *td_mtp_last_row(const td_session *s);
#endif
