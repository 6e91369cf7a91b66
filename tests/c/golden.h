/* Helpers for golden tests: locate tests/golden, read reference tensors. */
#ifndef TANDEM_TEST_GOLDEN_H
#define TANDEM_TEST_GOLDEN_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "format/safetensors.h"
#include "util/err.h"

static inline const char *golden_root(void) {
    const char *r = getenv("TANDEM_GOLDEN");
    return r ? r : "tests/golden";
}

static inline const void *ref_tensor(td_weights *w, const char *name, int64_t *n_out) {
    const td_st_entry *e = td_weights_find(w, name);
    if (!e) { fprintf(stderr, "reference tensor %s missing\n", name); exit(2); }
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    if (n_out) *n_out = n;
    return e->data;
}

/* max |a-b| / max(|b|) over n values. */
static inline double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / den;
}

static inline int32_t argmax_f(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}
/* Up to 64 generated tokens, for td_session_generate's token callback. */
typedef struct { int32_t buf[64]; int n; } tok64;
static inline int collect64(void *u, int32_t t) {
    tok64 *v = u;
    if (v->n < 64) v->buf[v->n++] = t;
    return 0;
}

/* A fresh session's forward over toks, every row's logits ([n][vocab]). */
static inline int prefill_logits(td_engine *e, const int32_t *toks, int n, float *logits, td_err *err) {
    td_session *s;
    int rc = td_session_new(e, &s, err);
    if (rc) return rc;
    td_fwd_item it = {.seq = &s->seq, .tokens = toks, .n = n, .logits_rows = n, .logits = logits};
    rc = td_forward(e->fwd, &it, 1, err);
    td_session_free(s);
    return rc;
}

/* Loads dir with a KV pool of n_blocks blocks (a first load reads the block size). */
static inline int load_with_kv_blocks(const char *dir, td_engine_opts *eo, int n_blocks, td_engine **e, td_err *err) {
    int rc = td_engine_load(dir, eo, e, err);
    if (rc) return rc;
    td_kv_info ki;
    td_engine_kv_info(*e, &ki);
    td_engine_free(*e);
    eo->kv_cache_bytes = (size_t)n_blocks * ki.bytes_per_block;
    return td_engine_load(dir, eo, e, err);
}

/* The greedy answer of a prompt alone on a fresh session (EOS ignored): its
 * first n_out tokens. The session's tokens hold all but the last generated
 * one, so n_out + 1 are generated. */
static inline int solo_greedy(td_engine *e, const int32_t *prompt, int n, int n_out, int32_t *out, td_err *err) {
    td_session *s;
    int rc = td_session_new(e, &s, err);
    if (rc) return rc;
    td_gen_opts go = {.max_tokens = n_out + 1, .ignore_eos = true};
    td_sampling sp;
    td_sampling_default(&sp);
    td_gen_result r;
    rc = td_session_generate(s, prompt, n, &sp, &go, NULL, NULL, &r, err);
    if (!rc && r.n_generated != n_out + 1) rc = TD_FAIL(err, TD_ERR_INTERNAL, "solo: %d of %d tokens", r.n_generated, n_out + 1);
    if (!rc) memcpy(out, td_session_tokens(s) + n, sizeof(int32_t) * (size_t)n_out);
    td_session_free(s);
    return rc;
}

#endif
