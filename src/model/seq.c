#include "model/seq.h"
#include <stdlib.h>
#include <string.h>
#include "util/err.h"

static float **alloc_ptrs(int n, td_err *err) { return TD_CALLOC(err, (size_t)(n ? n : 1), sizeof(float *)); }

int td_seq_init(td_seq *s, const td_model *m, td_kv *kv, int max_cap, int ckpt_slots, td_err *err) {
    const td_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    s->kv = kv;
    s->max_cap = max_cap;
    s->n_fa = c->n_full_attn;
    s->n_lin = c->n_layers - c->n_full_attn;
    s->kv_dim = c->n_kv_heads * c->head_dim;
    s->conv_len = c->conv_kernel - 1;
    s->conv_dim = td_cfg_lin_conv_dim(c);
    s->ssm_size = (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
    s->n_ckpt_slots = ckpt_slots;
    if (!(s->conv = alloc_ptrs(s->n_lin, err)) || !(s->ssm = alloc_ptrs(s->n_lin, err)) || !(s->ck_conv = alloc_ptrs(s->n_lin, err)) ||
        !(s->ck_ssm = alloc_ptrs(s->n_lin, err)))
        goto fail;
    for (int i = 0; i < s->n_lin; i++) {
        if (!(s->conv[i] = TD_CALLOC(err, (size_t)s->conv_len * s->conv_dim + 1, sizeof(float)))) goto fail;
        if (!(s->ssm[i] = TD_CALLOC(err, s->ssm_size, sizeof(float)))) goto fail;
        if (ckpt_slots > 0) {
            if (!(s->ck_conv[i] = TD_CALLOC(err, (size_t)ckpt_slots * ((size_t)s->conv_len * s->conv_dim + 1), sizeof(float)))) goto fail;
            if (!(s->ck_ssm[i] = TD_CALLOC(err, (size_t)ckpt_slots * s->ssm_size, sizeof(float)))) goto fail;
        }
    }
    return TD_OK;
fail:
    td_seq_free(s);
    return err ? err->code : TD_ERR_NOMEM;
}

void td_seq_free(td_seq *s) {
    td_seq_reset(s);
    for (int i = 0; s->conv && i < s->n_lin; i++) {
        free(s->conv[i]);
        free(s->ssm[i]);
        if (s->ck_conv) free(s->ck_conv[i]);
        if (s->ck_ssm) free(s->ck_ssm[i]);
    }
    free(s->conv); free(s->ssm); free(s->ck_conv); free(s->ck_ssm);
    free(s->blocks); free(s->tokens);
    memset(s, 0, sizeof *s);
}

int td_seq_reserve(td_seq *s, int slots, td_err *err) {
    if (slots > s->max_cap + 1)
        return TD_FAIL(err, TD_ERR_LIMIT, "sequence of %d tokens exceeds the context size (%d tokens)", slots - 1, s->max_cap);
    if (slots > s->cap_tokens) {
        int cap = s->cap_tokens ? s->cap_tokens : 64;
        while (cap < slots) cap *= 2;
        int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
        if (!t) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        s->tokens = t;
        s->cap_tokens = cap;
    }
    int need = (slots + TD_KV_BLOCK - 1) / TD_KV_BLOCK;
    if (need > s->cap_blocks) {
        int cap = s->cap_blocks ? s->cap_blocks : 8;
        while (cap < need) cap *= 2;
        int *b = realloc(s->blocks, (size_t)cap * sizeof *b);
        if (!b) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        s->blocks = b;
        s->cap_blocks = cap;
    }
    /* All or nothing: allocating block by block and then failing would evict
     * cached prefix blocks (each allocation unhashes one) for nothing. */
    if (need - s->n_blocks > td_kv_free_blocks(s->kv) + td_kv_checkpoint_blocks(s->kv))
        return TD_FAIL(err, TD_ERR_LIMIT, "KV cache full: %d more blocks of %d tokens needed, %d free", need - s->n_blocks, TD_KV_BLOCK,
                       td_kv_free_blocks(s->kv) + td_kv_checkpoint_blocks(s->kv));
    while (s->n_blocks < need) {
        int b = td_kv_alloc(s->kv);
        if (b < 0)
            return TD_FAIL(err, TD_ERR_LIMIT, "KV cache full: %d more blocks of %d tokens needed, none free", need - s->n_blocks, TD_KV_BLOCK);
        s->blocks[s->n_blocks++] = b;
    }
    return TD_OK;
}

void td_seq_reset(td_seq *s) {
    for (int i = 0; i < s->n_blocks; i++) td_kv_release(s->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_past = 0;
    s->mtp_n = 0;
    s->n_ckpt_valid = 0;
    for (int i = 0; s->conv && i < s->n_lin; i++) {
        memset(s->conv[i], 0, (size_t)s->conv_len * s->conv_dim * sizeof(float));
        memset(s->ssm[i], 0, s->ssm_size * sizeof(float));
    }
}

int td_seq_truncate(td_seq *s, int n, td_err *err) {
    if (n == s->n_past) return TD_OK;
    if (n > s->n_past || n < 0) return TD_FAIL(err, TD_ERR_ARG, "truncate to %d of %d tokens", n, s->n_past);
    if (n == 0) {
        td_seq_reset(s);
        return TD_OK;
    }
    if (s->n_lin > 0) {
        int slot = n - 1 - s->ckpt_base;
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
    if (s->mtp_n > n - 1) s->mtp_n = n - 1; /* entry p needs token p+1 */
    return TD_OK;
}

size_t td_seq_state_bytes_for(const td_config *c, int ckpt_slots) {
    size_t n_lin = (size_t)(c->n_layers - c->n_full_attn);
    size_t per = (size_t)(c->conv_kernel - 1) * (size_t)td_cfg_lin_conv_dim(c) + 1 + (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
    return n_lin * per * (size_t)(1 + (ckpt_slots > 0 ? ckpt_slots : 0)) * sizeof(float);
}

size_t td_seq_bytes(const td_seq *s) {
    size_t state = (size_t)s->n_lin * ((size_t)s->conv_len * s->conv_dim + 1 + s->ssm_size) * (size_t)(1 + s->n_ckpt_slots) * sizeof(float);
    return state + (size_t)s->cap_tokens * sizeof(int32_t) + (size_t)s->cap_blocks * sizeof(int);
}

size_t td_seq_state_floats(const td_seq *s) { return (size_t)s->n_lin * ((size_t)s->conv_len * s->conv_dim + s->ssm_size); }

void td_seq_state_save(const td_seq *s, float *out) {
    size_t cs = (size_t)s->conv_len * s->conv_dim;
    for (int i = 0; i < s->n_lin; i++) {
        memcpy(out, s->conv[i], cs * sizeof(float)); out += cs;
        memcpy(out, s->ssm[i], s->ssm_size * sizeof(float)); out += s->ssm_size;
    }
}

void td_seq_state_load(td_seq *s, const float *in) {
    size_t cs = (size_t)s->conv_len * s->conv_dim;
    for (int i = 0; i < s->n_lin; i++) {
        memcpy(s->conv[i], in, cs * sizeof(float)); in += cs;
        memcpy(s->ssm[i], in, s->ssm_size * sizeof(float)); in += s->ssm_size;
    }
    s->n_ckpt_valid = 0;
}

int td_seq_adopt(td_seq *s, const int *blocks, int n_blocks, const int32_t *tokens, int n, const float *state, td_err *err) {
    td_seq_reset(s);
    if (n_blocks > s->cap_blocks) {
        int *b = realloc(s->blocks, (size_t)n_blocks * sizeof *b);
        if (!b) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        s->blocks = b;
        s->cap_blocks = n_blocks;
    }
    memcpy(s->blocks, blocks, (size_t)n_blocks * sizeof *blocks);
    s->n_blocks = n_blocks;
    int rc = td_seq_reserve(s, n + 1, err); /* token array (and the MTP slot of position n-1) */
    if (rc) return rc;
    memcpy(s->tokens, tokens, (size_t)n * sizeof(int32_t));
    s->n_past = n;
    td_seq_state_load(s, state);
    return TD_OK;
}
