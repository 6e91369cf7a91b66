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
    td_backend *b;       /* the KV cache's backend: owns `state` */
    int n_past;          /* tokens whose state is held */
    int max_cap;         /* context limit in tokens */
    int n_fa, n_lin;     /* full-attention / DeltaNet layer counts; KV layer n_fa is the MTP layer */
    int kv_dim;          /* n_kv_heads * head_dim */
    int *blocks;         /* block table: position p -> blocks[p / TD_KV_BLOCK] */
    int n_blocks, cap_blocks;
    /* DeltaNet state: a pool of n_slots slots, each the whole state
     * (td_cfg_deltanet_state_floats), in backend memory. `live` holds the
     * state after n_past tokens. A checkpointed forward of n tokens writes
     * the state after its token t into slot (ckpt_slot0 + t) % n_slots
     * (ckpt_slot0 = live + 1 before it) and leaves live on the last one, so
     * a verify rolls back by moving `live`: no copy. */
    float *state;
    int n_slots, live;
    size_t slot_floats;
    int n_ckpt_slots, n_ckpt_valid, ckpt_base, ckpt_slot0; /* base = n_past before that forward */
    /* MTP entries: entry p pairs h_p with token p+1 and lives at KV slot p+1
     * of layer n_fa, so each block depends only on tokens up to its own. */
    int mtp_n;             /* valid MTP entries (positions 0..mtp_n-1) */
    int32_t *tokens;       /* [cap_tokens] token ids held (host) */
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
/* All DeltaNet state as one vector (for prefix-cache checkpoints): its
 * size, and the live slot (backend memory, valid until the next forward). */
size_t td_seq_state_floats(const td_seq *s);
const float *td_seq_live_state(const td_seq *s);
/* Bytes td_seq_init allocates for the DeltaNet state: 1 + ckpt_slots slots
 * (the live state and the verify checkpoints, f32), and
 * what s holds now (that state plus its token and block tables). */
size_t td_seq_state_bytes_for(const td_config *c, int ckpt_slots);
size_t td_seq_bytes(const td_seq *s);
/* The live state to / from host memory (td_seq_state_floats floats). */
void td_seq_state_save(const td_seq *s, float *out);
void td_seq_state_load(td_seq *s, const float *in);
/* Takes over referenced blocks holding the KV of tokens[0..n) and restores
 * the DeltaNet state after them (host memory; a prefix-cache hit). */
int td_seq_adopt(td_seq *s, const int *blocks, int n_blocks, const int32_t *tokens, int n, const float *state, td_err *err);
#endif
