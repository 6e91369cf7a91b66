/* Paged KV cache with exact prefix caching for hybrid (DeltaNet +
 * attention) models with an MTP head.
 *
 * Blocks of `block_size` token positions hold K and V of every full-attention
 * layer and of the MTP layer. The MTP entry that pairs h_p with token p+1 is
 * stored at slot p+1, so every value in a block depends only on tokens up to
 * and including the block's own: a block is fully keyed by its chained hash
 * H(parent hash, block tokens) and can be shared by any sequence with that
 * prefix. Full blocks are registered in a hash table; freed ones stay cached
 * on an LRU list until their space is needed.
 *
 * DeltaNet state cannot be paged: it summarizes the whole prefix. So the
 * cache also keeps exact checkpoints (conv + recurrent state of every
 * DeltaNet layer, and the target's hidden state of the last position for the
 * MTP head) at the end of each request's prompt and output. A new prompt hits
 * when a checkpoint's token prefix is a prefix of it and that prefix's full
 * blocks are still cached; the checkpoint's partial last block is copied. */
#ifndef TANDEM_KV_KV_H
#define TANDEM_KV_KV_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"
#include "tandem.h"

typedef struct td_kv td_kv;

/* Storage of K and V rows: td_kv_dtype (backend/backend.h). The backend
 * owns the storage (its memory); the host keeps the metadata: block
 * refcounts, hashes, LRU, checkpoints. */
typedef struct td_kv_shape {
    int n_layers;        /* full-attention layers + 1 for the MTP layer */
    int kv_dim;          /* kv_heads * head_dim */
    int head_dim;        /* for per-head fp8 scales */
    td_kv_dtype store;
    size_t state_floats; /* DeltaNet state per sequence (all layers, conv + recurrent) */
    int hidden;          /* H, for the checkpoint's last hidden state */
} td_kv_shape;

/* n_blocks blocks in backend b's memory (borrowed; it must outlive kv);
 * n_ckpt checkpoints at most. */
int td_kv_new(const td_kv_shape *shape, int n_blocks, int n_ckpt, td_backend *b, td_kv **out, td_err *err);
td_backend *td_kv_backend(const td_kv *kv);
/* Layer l's storage as the backend ops see it. */
td_kv_view td_kv_layer(const td_kv *kv, int l);
void td_kv_free(td_kv *kv);
size_t td_kv_bytes_per_block(const td_kv_shape *shape);
/* Bytes td_kv_new allocates for n_blocks blocks and n_ckpt checkpoint
 * slots (the blocks plus per-block tables and the hash map), and what the
 * prefix-cache checkpoints of kv hold now (states, hidden rows, token and
 * block lists; their tail blocks are in the pool). A checkpoint of n tokens
 * holds td_kv_ckpt_bytes_for(shape, n). */
size_t td_kv_alloc_bytes(const td_kv_shape *s, int n_blocks, int n_ckpt);
size_t td_kv_pool_bytes(const td_kv *kv);
size_t td_kv_ckpt_bytes(const td_kv *kv);
size_t td_kv_ckpt_bytes_for(const td_kv_shape *s, int n);
int td_kv_n_blocks(const td_kv *kv);
int td_kv_free_blocks(const td_kv *kv);   /* free + cached (evictable) */
int td_kv_checkpoint_blocks(const td_kv *kv); /* partial tails held by checkpoints (also evictable) */

/* Host access for tests and tools, through the backend (counted copies):
 * writes K and V rows (kv_dim host floats each) of layer l at (block, offset);
 * reads K or V of one kv head at (block, offset) as f32 into tmp[head_dim]
 * (returns tmp). The forward pass never uses these (backend ops do). */
void td_kv_write(td_kv *kv, int layer, int block, int off, const float *k, const float *v);
const float *td_kv_k_head(td_kv *kv, int layer, int block, int off, int head, float *tmp);
const float *td_kv_v_head(td_kv *kv, int layer, int block, int off, int head, float *tmp);

/* Takes a free block (evicting the least recently used cached one); -1 when none. */
int td_kv_alloc(td_kv *kv);
void td_kv_ref(td_kv *kv, int block);
void td_kv_release(td_kv *kv, int block);

/* Chained block hash. */
uint64_t td_kv_hash(uint64_t parent, const int32_t *tokens, int n);
/* Registers full block `block` under hash h (if no block has it yet). */
void td_kv_register(td_kv *kv, int block, uint64_t h, bool mtp_ok);
/* Looks up a cached block by hash: its id (not referenced) or -1. */
int td_kv_lookup(td_kv *kv, uint64_t h, bool need_mtp);

/* Checkpoints. */
typedef struct td_kv_hit {
    int len;                 /* tokens restored */
    const float *state;      /* DeltaNet state to restore (owned by the cache) */
    const float *hidden;     /* h_{len-1} */
    bool mtp_ok;             /* MTP entries before len-1 are valid */
} td_kv_hit;

/* Saves a checkpoint of a sequence of n tokens whose blocks are `blocks`
 * (registers its full blocks). state [state_floats] and hidden [hidden]
 * are backend memory, copied to host memory the cache owns. */
void td_kv_checkpoint(td_kv *kv, const int32_t *tokens, int n, const int *blocks, const float *state, const float *hidden,
                      bool mtp_ok);
/* Finds the longest checkpoint whose tokens are a prefix of
 * tokens[0..max_len) and whose full blocks are still cached. On a hit the
 * shared blocks are referenced into blocks[] (capacity cap) and a private
 * copy of the partial last block is allocated; returns len (0 = miss; then
 * nothing was referenced). The hit's pointers stay valid until the next
 * call on kv. */
int td_kv_match(td_kv *kv, const int32_t *tokens, int max_len, bool need_mtp, int *blocks, int cap, td_kv_hit *hit);
/* The length td_kv_match would restore (without its tail allocation), and
 * nothing else: no reference taken, no LRU touched. */
int td_kv_match_len(const td_kv *kv, const int32_t *tokens, int max_len, bool need_mtp, int cap);
#endif
