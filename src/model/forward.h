/* Forward pass of the target model and of the MTP head over a batch made of
 * token runs from several sequences (continuous batching, chunked prefill,
 * speculative verify all go through here). fp32 compute.
 *
 * This file only orchestrates: every computation is a backend op on backend
 * memory (backend/backend.h); what crosses to the host is the batch
 * description (one upload per forward) and the outputs asked for in host
 * memory (logits, hidden rows). */
#ifndef TANDEM_MODEL_FORWARD_H
#define TANDEM_MODEL_FORWARD_H
#include <stdbool.h>
#include "backend/backend.h"
#include "model/model.h"
#include "model/seq.h"

typedef struct td_fwd_item {
    td_seq *seq;
    const int32_t *tokens; /* n tokens, at positions seq->n_past .. +n-1 */
    int n;
    int logits_rows;       /* 0: none; 1: last token only; n: every token */
    float *logits;         /* caller-owned host [logits_rows][vocab] (downloaded), or NULL */
    float *logits_d;       /* or / and the same into backend memory */
    int32_t *argmax;       /* optional host [logits_rows]: argmax of each logits row, computed by the
                              backend (only the ids cross to the host) */
    float *hidden;         /* optional caller-owned host [n][H]: final-normed hidden states */
    float *hidden_d;       /* optional, the same into backend memory [n][H] */
    bool checkpoint;       /* keep DeltaNet state after each token (n <= ckpt slots) */
    /* Tokens already in backend memory (draft ids of the MTP passes): with
     * tokens_d, tokens[] holds only the first n_host tokens and the other
     * n - n_host come from tokens_d, copied within the backend (the host never
     * sees them here: their seq->tokens entries are -1 until the caller, who
     * downloads them later, writes them). */
    const int32_t *tokens_d;
    int n_host;
    int32_t *argmax_d;     /* optional backend [logits_rows]: the rows' argmax, left in backend memory */
} td_fwd_item;

typedef struct td_mtp_item {
    td_seq *seq;
    const int32_t *tokens; /* token at position p+1 for each entry */
    const float *hidden;   /* host [n][H] h_p (target's final-normed hidden), or NULL and: */
    const float *hidden_d; /* backend [n][H] h_p */
    int pos0;              /* position of the first entry; entries pos0..pos0+n-1 */
    int n;
    int logits_rows;       /* 0, 1 (last) or n */
    float *logits;         /* host [logits_rows][vocab], or NULL */
    float *logits_d;       /* or / and the same into backend memory */
    int32_t *argmax;       /* optional host [logits_rows]: the rows' argmax (see td_fwd_item) */
    float *hidden_out;     /* optional host [n][H]: h' = mtp.norm(u), fed back for depth > 1 */
    float *hidden_out_d;   /* optional, the same into backend memory */
    const int32_t *tokens_d; /* as td_fwd_item: tokens n_host..n-1 from backend memory */
    int n_host;
    int32_t *argmax_d;     /* as td_fwd_item */
} td_mtp_item;

typedef struct td_fwd_ctx td_fwd_ctx;

int td_fwd_ctx_new(const td_model *m, td_backend *b, td_fwd_ctx **out, td_err *err);
/* Prompt segments (items without checkpoints) run the DeltaNet recurrence in
 * chunks of this many tokens (td_gdn_chunk): equal to the token-by-token form
 * up to rounding, so off (0) by default, where prefix-cache hits and chunked
 * prefill are bit-exact. */
void td_fwd_set_deltanet_chunk(td_fwd_ctx *c, int tokens);
/* eager: every forward issues its ops directly. Otherwise, on a backend with
 * graphs (CUDA), the device part of each decode / draft / verify forward
 * (items of at most 16 tokens, at most 128 rows) is captured once per shape
 * and replayed (td_bk_graph). Default false; the CPU has no graphs. */
void td_fwd_set_eager(td_fwd_ctx *c, bool eager);
void td_fwd_ctx_free(td_fwd_ctx *c);
/* Bytes of the forward scratch for a batch of `rows` tokens of which
 * `logits_rows` need logits (what ensure_scratch and the logits buffer
 * allocate; the planner uses the same count), and what c holds now. */
size_t td_fwd_scratch_bytes_for(const td_config *c, int rows, int logits_rows);
size_t td_fwd_scratch_bytes(const td_fwd_ctx *c);
/* Backend ops (graph nodes on CUDA: one kernel or copy each) in the graph
 * region of one forward whose items include logits_items wanting logits:
 * the trunk (mtp false) or the MTP head. What the planner counts per graph. */
int td_fwd_region_ops_for(const td_config *c, bool mtp, int logits_items, bool argmax);

/* Runs the target model; advances each seq->n_past by its item's n. */
int td_forward(td_fwd_ctx *c, td_fwd_item *items, int n_items, td_err *err);
/* Runs the MTP head; writes MTP KV entries pos0.. and sets mtp_n = pos0 + n. */
int td_mtp_forward(td_fwd_ctx *c, td_mtp_item *items, int n_items, td_err *err);

#endif
