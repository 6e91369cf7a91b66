#include "model/seq.h"
#include <stdlib.h>
#include <string.h>
#include "util/err.h"

int td_seq_init(td_seq *s, const td_model *m, td_kv *kv, int max_cap, int ckpt_slots, td_err *err) {
    const td_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    s->kv = kv;
    s->b = td_kv_backend(kv);
    s->max_cap = max_cap;
    s->n_fa = c->n_full_attn;
    s->n_lin = c->n_layers - c->n_full_attn;
    s->kv_dim = c->n_kv_heads * c->head_dim;
    s->n_ckpt_slots = ckpt_slots > 0 ? ckpt_slots : 0;
    s->n_slots = 1 + s->n_ckpt_slots;
    s->slot_floats = td_cfg_deltanet_state_floats(c);
    s->state = s->b->ops->alloc(s->b, td_seq_state_bytes_for(c, ckpt_slots));
    if (!s->state) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for the DeltaNet state (%zu bytes)", td_seq_state_bytes_for(c, ckpt_slots));
    return TD_OK;
}

void td_seq_free(td_seq *s) {
    if (!s->b) return;
    td_seq_reset(s);
    s->b->ops->free(s->b, s->state);
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

static float *slot_ptr(const td_seq *s, int slot) { return s->state + (size_t)slot * s->slot_floats; }

void td_seq_reset(td_seq *s) {
    for (int i = 0; i < s->n_blocks; i++) td_kv_release(s->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_past = 0;
    s->mtp_n = 0;
    s->n_ckpt_valid = 0;
    s->live = 0;
    if (s->state && s->slot_floats) s->b->ops->fill0(s->b, slot_ptr(s, 0), s->slot_floats * sizeof(float));
}

int td_seq_truncate(td_seq *s, int n, td_err *err) {
    if (n == s->n_past) return TD_OK;
    if (n > s->n_past || n < 0) return TD_FAIL(err, TD_ERR_ARG, "truncate to %d of %d tokens", n, s->n_past);
    if (n == 0) {
        td_seq_reset(s);
        return TD_OK;
    }
    if (s->n_lin > 0) {
        int j = n - 1 - s->ckpt_base;
        if (j < 0 || j >= s->n_ckpt_valid)
            return TD_FAIL(err, TD_ERR_ARG, "no DeltaNet checkpoint for position %d (have %d..%d)", n - 1, s->ckpt_base,
                           s->ckpt_base + s->n_ckpt_valid - 1);
        s->live = (s->ckpt_slot0 + j) % s->n_slots; /* the state after token n-1 is already in its slot */
        s->n_ckpt_valid = j + 1;
    }
    s->n_past = n;
    if (s->mtp_n > n - 1) s->mtp_n = n - 1; /* entry p needs token p+1 */
    return TD_OK;
}

size_t td_seq_state_bytes_for(const td_config *c, int ckpt_slots) {
    return td_cfg_deltanet_state_floats(c) * (size_t)(1 + (ckpt_slots > 0 ? ckpt_slots : 0)) * sizeof(float) + sizeof(float);
}

size_t td_seq_bytes(const td_seq *s) {
    size_t state = s->slot_floats * (size_t)s->n_slots * sizeof(float) + sizeof(float);
    return state + (size_t)s->cap_tokens * sizeof(int32_t) + (size_t)s->cap_blocks * sizeof(int);
}

size_t td_seq_state_floats(const td_seq *s) { return s->slot_floats; }
const float *td_seq_live_state(const td_seq *s) { return slot_ptr(s, s->live); }

void td_seq_state_save(const td_seq *s, float *out) {
    td_bk_download(s->b, out, slot_ptr(s, s->live), s->slot_floats * sizeof(float));
}

void td_seq_state_load(td_seq *s, const float *in) {
    td_bk_upload(s->b, slot_ptr(s, s->live), in, s->slot_floats * sizeof(float));
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
