/* Per-sequence model state: a block table into the paged KV cache (every
 * full-attention layer and the MTP layer), DeltaNet conv and recurrent
 * state, per-position DeltaNet checkpoints for speculative verification.
 * Owned by a session; the KV blocks belong to the engine's td_kv. */
#ifndef TANDEM_MODEL_SEQ_H
#define TANDEM_MODEL_SEQ_H
#include <stdbool.h>
#include <stdint.h>
#include "kv/kv.h"
#include "model/model.h"

typedef struct td_seq {
    td_kv *kv;           /* borrowed */
    int n_past;          /* tokens whose state is held */
    int max_cap;         /* context limit in tokens */
    int n_fa, n_lin;     /* full-attention / DeltaNet layer counts; KV layer n_fa is the MTP layer */
    int kv_dim;          /* n_kv_heads * head_dim */
    int *blocks;         /* block table: position p -> blocks[p / TD_KV_BLOCK] */
    int n_blocks, cap_blocks;
    int conv_len, conv_dim; /* K-1 saved inputs per channel */
    size_t ssm_size;     /* nv*dk*dv floats per layer */
    float **conv;        /* [n_lin] -> [conv_len][conv_dim] */
    float **ssm;         /* [n_lin] -> [nv][dk][dv] */
    /* Checkpoints: DeltaNet state after token j of the last checkpointed
     * forward (j < n_ckpt_slots), so a verify can roll back exactly. */
    int n_ckpt_slots, n_ckpt_valid, ckpt_base; /* base = n_past before that forward */
    float **ck_conv, **ck_ssm; /* [n_lin] -> [slots][...] */
    /* MTP entries: entry p pairs h_p with token p+1 and lives at KV slot p+1
     * of layer n_fa, so each block depends only on tokens up to its own. */
    int mtp_n;             /* valid MTP entries (positions 0..mtp_n-1) */
    int32_t *tokens;       /* [cap_tokens] token ids held */
    int cap_tokens;
} td_seq;

int td_seq_init(td_seq *s, const td_model *m, td_kv *kv, int max_cap, int ckpt_slots, td_err *err);
void td_seq_free(td_seq *s);
/* Ensures KV slots 0..slots-1 exist (TD_ERR_LIMIT when the context or the
 * KV cache is full). */
int td_seq_reserve(td_seq *s, int slots, td_err *err);
/* Forgets everything; blocks go back to the cache. */
void td_seq_reset(td_seq *s);
/* Keeps the first `n` tokens. Attention KV simply truncates; DeltaNet
 * state is restored from the checkpoint taken after token n-1, which must
 * lie in the last checkpointed forward (returns TD_ERR_ARG otherwise). */
int td_seq_truncate(td_seq *s, int n, td_err *err);
/* All DeltaNet state as one vector (for prefix-cache checkpoints). */
size_t td_seq_state_floats(const td_seq *s);
/* Bytes td_seq_init allocates for the DeltaNet state: the live state plus
 * ckpt_slots verify checkpoints (f32, one guard float per conv state), and
 * what s holds now (that state plus its token and block tables). */
size_t td_seq_state_bytes_for(const td_config *c, int ckpt_slots);
size_t td_seq_bytes(const td_seq *s);
void td_seq_state_save(const td_seq *s, float *out);
void td_seq_state_load(td_seq *s, const float *in);
/* Takes over referenced blocks holding the KV of tokens[0..n) and restores
 * the DeltaNet state after them (a prefix-cache hit). */
int td_seq_adopt(td_seq *s, const int *blocks, int n_blocks, const int32_t *tokens, int n, const float *state, td_err *err);
/* KV of layer l at a slot: write whole rows, read one head (as f32). */
static inline void td_seq_kv_write(td_seq *s, int l, int slot, const float *k, const float *v) {
    td_kv_write(s->kv, l, s->blocks[slot / TD_KV_BLOCK], slot % TD_KV_BLOCK, k, v);
}
static inline const float *td_seq_k_head(td_seq *s, int l, int slot, int h, float *tmp) {
    return td_kv_k_head(s->kv, l, s->blocks[slot / TD_KV_BLOCK], slot % TD_KV_BLOCK, h, tmp);
}
static inline const float *td_seq_v_head(td_seq *s, int l, int slot, int h, float *tmp) {
    return td_kv_v_head(s->kv, l, s->blocks[slot / TD_KV_BLOCK], slot % TD_KV_BLOCK, h, tmp);
}
#endif
