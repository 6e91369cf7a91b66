/* Per-sequence model state: full-attention KV cache, DeltaNet conv and
 * recurrent state, per-position DeltaNet checkpoints for speculative
 * verification, and the MTP layer's own KV cache. Owned by a session. */
#ifndef TANDEM_MODEL_SEQ_H
#define TANDEM_MODEL_SEQ_H
#include <stdbool.h>
#include <stdint.h>
#include "model/model.h"

typedef struct td_seq {
    int n_past;          /* tokens whose state is held */
    int cap;             /* KV capacity in tokens (grows up to max_cap) */
    int max_cap;
    int n_fa, n_lin;     /* full-attention / DeltaNet layer counts */
    int kv_dim;          /* n_kv_heads * head_dim */
    float **k, **v;      /* [n_fa] -> [cap][kv_dim] */
    int conv_len, conv_dim; /* K-1 saved inputs per channel */
    size_t ssm_size;     /* nv*dk*dv floats per layer */
    float **conv;        /* [n_lin] -> [conv_len][conv_dim] */
    float **ssm;         /* [n_lin] -> [nv][dk][dv] */
    /* Checkpoints: DeltaNet state after token j of the last checkpointed
     * forward (j < n_ckpt_slots), so a verify can roll back exactly. */
    int n_ckpt_slots, n_ckpt_valid, ckpt_base; /* base = n_past before that forward */
    float **ck_conv, **ck_ssm; /* [n_lin] -> [slots][...] */
    /* MTP layer KV: entry at position p pairs h_p with token p+1. */
    float *mtp_k, *mtp_v;  /* [cap][kv_dim] */
    int mtp_n;             /* valid MTP entries (positions 0..mtp_n-1) */
    int32_t *tokens;       /* [cap] token ids held */
} td_seq;

int td_seq_init(td_seq *s, const td_model *m, int max_cap, int ckpt_slots, td_err *err);
void td_seq_free(td_seq *s);
/* Ensures capacity for `need` tokens. */
int td_seq_reserve(td_seq *s, int need, td_err *err);
void td_seq_reset(td_seq *s);
/* Keeps the first `n` tokens. Full-attention KV simply truncates; DeltaNet
 * state is restored from the checkpoint taken after token n-1, which must
 * lie in the last checkpointed forward (returns TD_ERR_ARG otherwise). */
int td_seq_truncate(td_seq *s, int n, td_err *err);
#endif
