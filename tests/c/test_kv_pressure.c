/* The prefix cache under a full pool (issue 16): a hit whose partial tail
 * needs a fresh block must neither hand out one of its own shared blocks as
 * that tail (two views of one block: wrong attention), nor evict the very
 * checkpoint it is matching and leak the block it had taken. Block
 * accounting is checked after each case: free + cached + checkpoint tails +
 * blocks still held = pool. */
#include <stdint.h>
#include "check.h"
#include "test_backend.h"
#include "kv/kv.h"

#define B TD_KV_BLOCK

static td_kv_shape shape(void) {
    td_kv_shape s = {.n_layers = 1, .kv_dim = 4, .head_dim = 4, .store = TD_KV_F32, .state_floats = 8, .hidden = 4};
    return s;
}

/* Writes token t's K = V = (t, t, t, t) at row off of block b. */
static void write_tok(td_kv *kv, int b, int off, int t) {
    float r[4] = {(float)t, (float)t, (float)t, (float)t};
    td_kv_write(kv, 0, b, off, r, r);
}

static float k_at(td_kv *kv, int b, int off) {
    float tmp[4];
    return td_kv_k_head(kv, 0, b, off, 0, tmp)[0];
}

/* A finished 20-token sequence in blocks b0 (full) and b1 (4 rows), with a
 * checkpoint at 20 (its tail copied into a third block). Returns b0. */
static int finished_sequence(td_kv *kv, int32_t *toks) {
    int b0 = td_kv_alloc(kv), b1 = td_kv_alloc(kv);
    for (int i = 0; i < 20; i++) {
        toks[i] = 100 + i;
        write_tok(kv, i < B ? b0 : b1, i % B, toks[i]);
    }
    float state[8] = {0}, hidden[4] = {0};
    int blocks[2] = {b0, b1};
    td_kv_checkpoint(kv, toks, 20, blocks, state, hidden, true);
    CHECK(td_kv_checkpoint_blocks(kv) == 1, "checkpoint holds its tail");
    return b0;
}

/* The only free block is the hit's own cached full block. */
static void alias_case(void) {
    td_kv_shape s = shape();
    td_kv *kv;
    td_err err = {0};
    CHECK(td_kv_new(&s, 4, 2, test_backend(), &kv, &err) == 0, "%s", err.msg);
    int32_t toks[20];
    int b0 = finished_sequence(kv, toks);
    td_kv_release(kv, b0); /* b0: cached, free to evict */
    /* free now: b0 (cached) and one plain block (b1 is still held by the
     * sequence, the third block by the checkpoint); take the plain one */
    int held[4], n_held = 0;
    while (td_kv_free_blocks(kv) > 1) held[n_held++] = td_kv_alloc(kv);
    int blocks[4] = {-1, -1, -1, -1};
    td_kv_hit hit;
    int n = td_kv_match(kv, toks, 20, false, blocks, 4, &hit);
    if (n > 0) {
        CHECK(blocks[0] != blocks[1], "hit of %d: the tail block is the shared block %d itself", n, blocks[0]);
        CHECK(k_at(kv, blocks[0], 0) == 100.0f && k_at(kv, blocks[0], 15) == 115.0f, "shared block overwritten by the tail copy");
        CHECK(k_at(kv, blocks[1], 3) == 119.0f, "tail copied");
        for (int j = 0; j < 2; j++) td_kv_release(kv, blocks[j]);
    } else {
        CHECK(td_kv_free_blocks(kv) == 1, "a refused hit keeps nothing (free %d)", td_kv_free_blocks(kv));
    }
    for (int i = 0; i < n_held; i++) td_kv_release(kv, held[i]);
    /* the 20-token sequence's second block is still held by it: one block */
    CHECK(td_kv_free_blocks(kv) + td_kv_checkpoint_blocks(kv) == 3, "accounting: free %d + checkpoint %d + 1 held = 4",
          td_kv_free_blocks(kv), td_kv_checkpoint_blocks(kv));
    td_kv_free(kv);
}

/* The pool is full (the shared block is held by a running sequence): the
 * tail allocation can only come from giving back a checkpoint's tail, and the
 * one being matched must not be the one given back. */
static void evict_self_case(void) {
    td_kv_shape s = shape();
    td_kv *kv;
    td_err err = {0};
    CHECK(td_kv_new(&s, 4, 2, test_backend(), &kv, &err) == 0, "%s", err.msg);
    int32_t toks[20];
    int b0 = finished_sequence(kv, toks); /* b0 and b1 stay referenced: a running sequence */
    int held[4], n_held = 0;
    while (td_kv_free_blocks(kv) > 0) held[n_held++] = td_kv_alloc(kv);
    int blocks[4] = {-1, -1, -1, -1};
    td_kv_hit hit;
    int n = td_kv_match(kv, toks, 20, false, blocks, 4, &hit);
    if (n > 0) {
        CHECK(blocks[0] == b0 && blocks[1] != b0, "hit blocks");
        for (int j = 0; j < 2; j++) td_kv_release(kv, blocks[j]);
    }
    /* everything ends: the running sequence (b0 and its second block) and the fillers */
    td_kv_release(kv, b0);
    td_kv_release(kv, b0 + 1 < 4 ? b0 + 1 : 0); /* finished_sequence allocated b0 then b0+1 from a fresh pool */
    for (int i = 0; i < n_held; i++) td_kv_release(kv, held[i]);
    int free_b = td_kv_free_blocks(kv), ck = td_kv_checkpoint_blocks(kv);
    CHECK(free_b + ck == 4, "after every sequence ended: free %d + checkpoint %d != 4 blocks (a block leaked)", free_b, ck);
    td_kv_free(kv);
}

int main(void) {
    alias_case();
    evict_self_case();
    printf("kv pressure: a prefix hit under a full pool neither aliases its shared block nor leaks its tail\n");
    TEST_MAIN_END("kv_pressure");
}
