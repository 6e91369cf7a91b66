#include "model/seq.h"
#include <stdlib.h>
#include <string.h>
#include "util/err.h"

static float **alloc_ptrs(int n, td_err *err) { return TD_CALLOC(err, (size_t)(n ? n : 1), sizeof(float *)); }

int td_seq_init(td_seq *s, const td_model *m, int max_cap, int ckpt_slots, td_err *err) {
    const td_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    s->max_cap = max_cap;
    s->n_fa = c->n_full_attn;
    s->n_lin = c->n_layers - c->n_full_attn;
    s->kv_dim = c->n_kv_heads * c->head_dim;
    s->conv_len = c->conv_kernel - 1;
    s->conv_dim = td_cfg_lin_conv_dim(c);
    s->ssm_size = (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
    s->n_ckpt_slots = ckpt_slots;
    if (!(s->k = alloc_ptrs(s->n_fa, err)) || !(s->v = alloc_ptrs(s->n_fa, err)) || !(s->conv = alloc_ptrs(s->n_lin, err)) ||
        !(s->ssm = alloc_ptrs(s->n_lin, err)) || !(s->ck_conv = alloc_ptrs(s->n_lin, err)) || !(s->ck_ssm = alloc_ptrs(s->n_lin, err)))
        goto fail;
    for (int i = 0; i < s->n_lin; i++) {
        if (!(s->conv[i] = TD_CALLOC(err, (size_t)s->conv_len * s->conv_dim + 1, sizeof(float)))) goto fail;
        if (!(s->ssm[i] = TD_CALLOC(err, s->ssm_size, sizeof(float)))) goto fail;
        if (ckpt_slots > 0) {
            if (!(s->ck_conv[i] = TD_CALLOC(err, (size_t)ckpt_slots * ((size_t)s->conv_len * s->conv_dim + 1), sizeof(float)))) goto fail;
            if (!(s->ck_ssm[i] = TD_CALLOC(err, (size_t)ckpt_slots * s->ssm_size, sizeof(float)))) goto fail;
        }
    }
    if (td_seq_reserve(s, 64 < max_cap ? 64 : max_cap, err)) goto fail;
    return TD_OK;
fail:
    td_seq_free(s);
    return err ? err->code : TD_ERR_NOMEM;
}

void td_seq_free(td_seq *s) {
    for (int i = 0; s->k && i < s->n_fa; i++) { free(s->k[i]); free(s->v[i]); }
    for (int i = 0; s->conv && i < s->n_lin; i++) {
        free(s->conv[i]);
        free(s->ssm[i]);
        if (s->ck_conv) free(s->ck_conv[i]);
        if (s->ck_ssm) free(s->ck_ssm[i]);
    }
    free(s->k); free(s->v); free(s->conv); free(s->ssm); free(s->ck_conv); free(s->ck_ssm);
    free(s->mtp_k); free(s->mtp_v); free(s->tokens);
    memset(s, 0, sizeof *s);
}

static int grow(float **p, size_t n, td_err *err) {
    float *q = realloc(*p, n * sizeof(float));
    if (!q) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory growing the KV cache to %zu floats", n);
    *p = q;
    return TD_OK;
}

int td_seq_reserve(td_seq *s, int need, td_err *err) {
    if (need <= s->cap) return TD_OK;
    if (need > s->max_cap)
        return TD_FAIL(err, TD_ERR_LIMIT, "sequence of %d tokens exceeds the context size (%d tokens)", need, s->max_cap);
    int cap = s->cap ? s->cap : 64;
    while (cap < need) cap *= 2;
    if (cap > s->max_cap) cap = s->max_cap;
    size_t n = (size_t)cap * s->kv_dim;
    for (int i = 0; i < s->n_fa; i++)
        if (grow(&s->k[i], n, err) || grow(&s->v[i], n, err)) return TD_ERR_NOMEM;
    if (grow(&s->mtp_k, n, err) || grow(&s->mtp_v, n, err)) return TD_ERR_NOMEM;
    int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
    if (!t) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    s->tokens = t;
    s->cap = cap;
    return TD_OK;
}

void td_seq_reset(td_seq *s) {
    s->n_past = 0;
    s->mtp_n = 0;
    s->n_ckpt_valid = 0;
    for (int i = 0; i < s->n_lin; i++) {
        memset(s->conv[i], 0, (size_t)s->conv_len * s->conv_dim * sizeof(float));
        memset(s->ssm[i], 0, s->ssm_size * sizeof(float));
    }
}

int td_seq_truncate(td_seq *s, int n, td_err *err) {
    if (n == s->n_past) return TD_OK;
    if (n > s->n_past || n < 0) return TD_FAIL(err, TD_ERR_ARG, "truncate to %d of %d tokens", n, s->n_past);
    if (s->n_lin > 0) {
        int slot = n - 1 - s->ckpt_base;
        if (n == 0) {
            td_seq_reset(s);
            return TD_OK;
        }
        if (slot < 0 || slot >= s->n_ckpt_valid)
            return TD_FAIL(err, TD_ERR_ARG, "no DeltaNet checkpoint for position %d (have %d..%d)", n - 1, s->ckpt_base,
                           s->ckpt_base + s->n_ckpt_valid - 1);
        size_t cs = (size_t)s->conv_len * s->conv_dim;
        for (int i = 0; i < s->n_lin; i++) {
            memcpy(s->conv[i], s->ck_conv[i] + (size_t)slot * (cs + 1), cs * sizeof(float));
            memcpy(s->ssm[i], s->ck_ssm[i] + (size_t)slot * s->ssm_size, s->ssm_size * sizeof(float));
        }
        s->n_ckpt_valid = slot + 1;
    }
    s->n_past = n;
    if (s->mtp_n > n - 1) s->mtp_n = n > 0 ? n - 1 : 0; /* entry p needs token p+1 */
    return TD_OK;
}
