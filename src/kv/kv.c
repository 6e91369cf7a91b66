#include "kv/kv.h"
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "model/tensor.h"
#include "util/err.h"

typedef struct ckpt {
    bool used;
    bool pinned;         /* being matched: td_kv_alloc must not evict it */
    uint64_t lru;
    int n;               /* tokens */
    int32_t *tokens;     /* [n] exact prefix (no hash collision can alias a hit) */
    int n_full;
    int *blocks;         /* [n_full] cached full blocks */
    uint64_t *hashes;    /* [n_full] their chained hashes, to detect eviction */
    int tail;            /* block holding the partial tail (referenced), -1 if n % B == 0 */
    float *state, *hidden;
    bool mtp_ok;
} ckpt;

struct td_kv {
    td_kv_shape sh;
    td_backend *b;                 /* owns the storage below */
    int n_blocks;
    size_t esize;                  /* bytes per stored element */
    int n_heads;                   /* kv heads (fp8 scales) */
    void **k, **v;                 /* [layers] -> backend [n_blocks][B][kv_dim] elements */
    float **ks, **vs;              /* fp8: [layers] -> backend [n_blocks][B][kv heads] scales */
    int *ref;
    uint64_t *hash;
    bool *hashed, *mtp_ok;
    int *prev, *next;              /* free list: head = next victim */
    int free_head, free_tail, n_free;
    uint64_t *map_key;             /* open addressing: chained hash -> block */
    int *map_val;
    size_t map_cap;
    ckpt *ck;
    int n_ckpt;
    uint64_t tick;
};

static size_t elem_size(td_kv_dtype st) { return st == TD_KV_F32 ? 4 : st == TD_KV_BF16 ? 2 : 1; }
static int kv_heads(const td_kv_shape *s) { return s->head_dim > 0 ? s->kv_dim / s->head_dim : 1; }

size_t td_kv_bytes_per_block(const td_kv_shape *s) {
    size_t row = (size_t)s->kv_dim * elem_size(s->store) + (s->store == TD_KV_FP8 ? (size_t)kv_heads(s) * sizeof(float) : 0);
    return (size_t)s->n_layers * 2 * TD_KV_BLOCK * row;
}
static size_t map_cap_for(int n_blocks) {
    size_t cap = 16;
    while (cap < (size_t)n_blocks * 4) cap *= 2;
    return cap;
}

size_t td_kv_alloc_bytes(const td_kv_shape *s, int n_blocks, int n_ckpt) {
    size_t per_block = td_kv_bytes_per_block(s) + sizeof(int) * 3 + sizeof(uint64_t) + 2 * sizeof(bool); /* ref, prev, next, hash, hashed, mtp_ok */
    size_t tables = (size_t)s->n_layers * 2 * sizeof(void *) * (s->store == TD_KV_FP8 ? 2 : 1);
    return (size_t)n_blocks * per_block + map_cap_for(n_blocks) * (sizeof(uint64_t) + sizeof(int)) + tables +
           (size_t)(n_ckpt ? n_ckpt : 1) * sizeof(ckpt) + sizeof(td_kv);
}

size_t td_kv_pool_bytes(const td_kv *kv) { return td_kv_alloc_bytes(&kv->sh, kv->n_blocks, kv->n_ckpt); }

size_t td_kv_ckpt_bytes_for(const td_kv_shape *s, int n) {
    int n_full = n / TD_KV_BLOCK;
    return s->state_floats * sizeof(float) + 1 + (size_t)s->hidden * sizeof(float) + (size_t)n * sizeof(int32_t) +
           (size_t)(n_full + 1) * (sizeof(int) + sizeof(uint64_t));
}

size_t td_kv_ckpt_bytes(const td_kv *kv) {
    size_t b = 0;
    for (int i = 0; i < kv->n_ckpt; i++)
        if (kv->ck[i].used) b += td_kv_ckpt_bytes_for(&kv->sh, kv->ck[i].n);
    return b;
}

int td_kv_n_blocks(const td_kv *kv) { return kv->n_blocks; }
int td_kv_free_blocks(const td_kv *kv) { return kv->n_free; }
int td_kv_checkpoint_blocks(const td_kv *kv) {
    int n = 0;
    for (int i = 0; i < kv->n_ckpt; i++) n += kv->ck[i].used && kv->ck[i].tail >= 0;
    return n;
}

static size_t row_index(const td_kv *kv, int b, int off) {
    (void)kv;
    return (size_t)b * TD_KV_BLOCK + off;
}

td_backend *td_kv_backend(const td_kv *kv) { return kv->b; }

td_kv_view td_kv_layer(const td_kv *kv, int l) {
    return (td_kv_view){.store = kv->sh.store, .kv_dim = kv->sh.kv_dim, .head_dim = kv->sh.head_dim, .k = kv->k[l], .v = kv->v[l],
                        .ks = kv->ks ? kv->ks[l] : NULL, .vs = kv->vs ? kv->vs[l] : NULL};
}

/* Host access (tests, tools): staged through backend buffers. */
void td_kv_write(td_kv *kv, int l, int b, int off, const float *k, const float *v) {
    size_t n = (size_t)kv->sh.kv_dim * sizeof(float);
    float *d = kv->b->ops->alloc(kv->b, 2 * n);
    TD_ASSERT(d);
    td_bk_upload(kv->b, d, k, n);
    td_bk_upload(kv->b, d + kv->sh.kv_dim, v, n);
    td_kv_view view = td_kv_layer(kv, l);
    kv->b->ops->kv_store(kv->b, &view, (int)row_index(kv, b, off), d, d + kv->sh.kv_dim);
    kv->b->ops->free(kv->b, d);
}

static const float *read_head(td_kv *kv, int l, int b, int off, int h, int which, float *tmp) {
    size_t D = (size_t)kv->sh.kv_dim;
    float *d = kv->b->ops->alloc(kv->b, D * sizeof(float));
    TD_ASSERT(d);
    td_kv_view view = td_kv_layer(kv, l);
    kv->b->ops->kv_load(kv->b, &view, (int)row_index(kv, b, off), which, d);
    td_bk_download(kv->b, tmp, d + (size_t)h * kv->sh.head_dim, (size_t)kv->sh.head_dim * sizeof(float));
    kv->b->ops->free(kv->b, d);
    return tmp;
}
const float *td_kv_k_head(td_kv *kv, int l, int b, int off, int h, float *tmp) { return read_head(kv, l, b, off, h, 0, tmp); }
const float *td_kv_v_head(td_kv *kv, int l, int b, int off, int h, float *tmp) { return read_head(kv, l, b, off, h, 1, tmp); }

static void list_remove(td_kv *kv, int b) {
    if (kv->prev[b] >= 0) kv->next[kv->prev[b]] = kv->next[b]; else kv->free_head = kv->next[b];
    if (kv->next[b] >= 0) kv->prev[kv->next[b]] = kv->prev[b]; else kv->free_tail = kv->prev[b];
    kv->prev[b] = kv->next[b] = -1;
    kv->n_free--;
}
static void list_push_head(td_kv *kv, int b) {
    kv->prev[b] = -1;
    kv->next[b] = kv->free_head;
    if (kv->free_head >= 0) kv->prev[kv->free_head] = b; else kv->free_tail = b;
    kv->free_head = b;
    kv->n_free++;
}
static void list_push_tail(td_kv *kv, int b) {
    kv->next[b] = -1;
    kv->prev[b] = kv->free_tail;
    if (kv->free_tail >= 0) kv->next[kv->free_tail] = b; else kv->free_head = b;
    kv->free_tail = b;
    kv->n_free++;
}

int td_kv_new(const td_kv_shape *shape, int n_blocks, int n_ckpt, td_backend *bk, td_kv **out, td_err *err) {
    *out = NULL;
    if (n_blocks < 1 || n_ckpt < 0) return TD_FAIL(err, TD_ERR_ARG, "KV cache of %d blocks", n_blocks);
    if (shape->store != TD_KV_F32 && shape->store != TD_KV_BF16 && shape->store != TD_KV_FP8)
        return TD_FAIL(err, TD_ERR_ARG, "KV storage dtype %d (f32, bf16 or fp8; auto is resolved by the engine)", (int)shape->store);
    td_kv *kv = TD_CALLOC(err, 1, sizeof *kv);
    if (!kv) return TD_ERR_NOMEM;
    kv->sh = *shape;
    kv->b = bk;
    kv->n_blocks = n_blocks;
    kv->n_ckpt = n_ckpt;
    kv->esize = elem_size(shape->store);
    kv->n_heads = kv_heads(shape);
    size_t rows = (size_t)n_blocks * TD_KV_BLOCK, per_layer = rows * shape->kv_dim * kv->esize;
    kv->map_cap = map_cap_for(n_blocks);
    kv->k = TD_CALLOC(err, (size_t)shape->n_layers, sizeof(void *));
    kv->v = TD_CALLOC(err, (size_t)shape->n_layers, sizeof(void *));
    if (shape->store == TD_KV_FP8) {
        kv->ks = TD_CALLOC(err, (size_t)shape->n_layers, sizeof(float *));
        kv->vs = TD_CALLOC(err, (size_t)shape->n_layers, sizeof(float *));
    }
    kv->ref = TD_CALLOC(err, (size_t)n_blocks, sizeof(int));
    kv->hash = TD_CALLOC(err, (size_t)n_blocks, sizeof(uint64_t));
    kv->hashed = TD_CALLOC(err, (size_t)n_blocks, sizeof(bool));
    kv->mtp_ok = TD_CALLOC(err, (size_t)n_blocks, sizeof(bool));
    kv->prev = TD_CALLOC(err, (size_t)n_blocks, sizeof(int));
    kv->next = TD_CALLOC(err, (size_t)n_blocks, sizeof(int));
    kv->map_key = TD_CALLOC(err, kv->map_cap, sizeof(uint64_t));
    kv->map_val = TD_CALLOC(err, kv->map_cap, sizeof(int));
    kv->ck = TD_CALLOC(err, (size_t)(n_ckpt ? n_ckpt : 1), sizeof(ckpt));
    bool ok = kv->k && kv->v && kv->ref && kv->hash && kv->hashed && kv->mtp_ok && kv->prev && kv->next && kv->map_key && kv->map_val && kv->ck;
    for (int l = 0; ok && l < shape->n_layers; l++) {
        kv->k[l] = bk->ops->alloc(bk, per_layer);
        kv->v[l] = bk->ops->alloc(bk, per_layer);
        ok = kv->k[l] && kv->v[l];
        if (ok && shape->store == TD_KV_FP8) {
            ok = kv->ks && kv->vs && (kv->ks[l] = bk->ops->alloc(bk, rows * kv->n_heads * sizeof(float))) &&
                 (kv->vs[l] = bk->ops->alloc(bk, rows * kv->n_heads * sizeof(float)));
        }
    }
    if (!ok) {
        td_kv_free(kv);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for a KV cache of %d blocks (%.1f MiB)", n_blocks,
                       (double)n_blocks * (double)td_kv_bytes_per_block(shape) / 1048576.0);
    }
    for (size_t i = 0; i < kv->map_cap; i++) kv->map_val[i] = -1;
    kv->free_head = kv->free_tail = -1;
    for (int b = n_blocks - 1; b >= 0; b--) list_push_head(kv, b);
    *out = kv;
    return TD_OK;
}

static void ckpt_clear(td_kv *kv, ckpt *c) {
    if (c->tail >= 0 && c->used) td_kv_release(kv, c->tail);
    free(c->tokens); free(c->blocks); free(c->hashes); free(c->state); free(c->hidden);
    memset(c, 0, sizeof *c);
    c->tail = -1;
}

void td_kv_free(td_kv *kv) {
    if (!kv) return;
    for (int i = 0; kv->ck && i < kv->n_ckpt; i++) {
        kv->ck[i].used = false; /* blocks go away with the pool */
        ckpt_clear(kv, &kv->ck[i]);
    }
    td_backend *bk = kv->b;
    for (int l = 0; kv->k && l < kv->sh.n_layers; l++) { bk->ops->free(bk, kv->k[l]); bk->ops->free(bk, kv->v[l]); }
    for (int l = 0; kv->ks && l < kv->sh.n_layers; l++) bk->ops->free(bk, kv->ks[l]);
    for (int l = 0; kv->vs && l < kv->sh.n_layers; l++) bk->ops->free(bk, kv->vs[l]);
    free(kv->ks); free(kv->vs);
    free(kv->k); free(kv->v); free(kv->ref); free(kv->hash); free(kv->hashed); free(kv->mtp_ok);
    free(kv->prev); free(kv->next); free(kv->map_key); free(kv->map_val); free(kv->ck);
    free(kv);
}

/* ---- hash table: stale entries (block re-used) are skipped and overwritten */

static bool map_live(const td_kv *kv, size_t i) {
    int b = kv->map_val[i];
    return b >= 0 && kv->hashed[b] && kv->hash[b] == kv->map_key[i];
}

int td_kv_lookup(td_kv *kv, uint64_t h, bool need_mtp) {
    size_t m = kv->map_cap - 1;
    for (size_t i = h & m, n = 0; n < kv->map_cap; i = (i + 1) & m, n++) {
        if (kv->map_val[i] < 0) return -1;
        if (kv->map_key[i] == h && map_live(kv, i)) {
            int b = kv->map_val[i];
            return need_mtp && !kv->mtp_ok[b] ? -1 : b;
        }
    }
    return -1;
}

void td_kv_register(td_kv *kv, int b, uint64_t h, bool mtp_ok) {
    if (kv->hashed[b]) return;
    size_t m = kv->map_cap - 1, slot = SIZE_MAX;
    for (size_t i = h & m, n = 0; n < kv->map_cap; i = (i + 1) & m, n++) {
        if (kv->map_val[i] >= 0 && kv->map_key[i] == h && map_live(kv, i)) {
            int old = kv->map_val[i];
            if (kv->mtp_ok[old] || !mtp_ok) return; /* another block has it */
            /* same tokens, but only this one has valid MTP entries: it wins */
            kv->hashed[old] = false;
            kv->map_val[i] = b;
            kv->hash[b] = h;
            kv->hashed[b] = true;
            kv->mtp_ok[b] = true;
            return;
        }
        if (slot == SIZE_MAX && (kv->map_val[i] < 0 || !map_live(kv, i))) slot = i;
        if (kv->map_val[i] < 0) break;
    }
    if (slot == SIZE_MAX) return; /* table full of live entries: not cached */
    kv->map_key[slot] = h;
    kv->map_val[slot] = b;
    kv->hash[b] = h;
    kv->hashed[b] = true;
    kv->mtp_ok[b] = mtp_ok;
}

uint64_t td_kv_hash(uint64_t parent, const int32_t *tokens, int n) {
    /* the parent hash seeds the block's hash: H(parent, tokens) */
    return XXH3_64bits_withSeed(tokens, (size_t)n * sizeof(int32_t), parent);
}

/* ---- blocks ------------------------------------------------------------ */

static void ckpt_clear(td_kv *kv, ckpt *c);

int td_kv_alloc(td_kv *kv) {
    /* out of blocks: checkpoints give back their tail blocks, oldest first */
    while (kv->free_head < 0) {
        ckpt *old = NULL;
        for (int i = 0; i < kv->n_ckpt; i++)
            if (kv->ck[i].used && !kv->ck[i].pinned && kv->ck[i].tail >= 0 && (!old || kv->ck[i].lru < old->lru)) old = &kv->ck[i];
        if (!old) return -1;
        ckpt_clear(kv, old);
    }
    int b = kv->free_head;
    list_remove(kv, b);
    kv->hashed[b] = false; /* evicted from the prefix cache */
    kv->ref[b] = 1;
    return b;
}

void td_kv_ref(td_kv *kv, int b) {
    if (kv->ref[b]++ == 0) list_remove(kv, b);
}

void td_kv_release(td_kv *kv, int b) {
    TD_ASSERT(kv->ref[b] > 0);
    if (--kv->ref[b] > 0) return;
    if (kv->hashed[b]) list_push_tail(kv, b); /* cached: evicted last */
    else list_push_head(kv, b);
}

/* ---- checkpoints -------------------------------------------------------- */

static void copy_block(td_kv *kv, int dst, int src, int n) {
    size_t row = (size_t)kv->sh.kv_dim * kv->esize, bytes = (size_t)n * row;
    size_t d0 = row_index(kv, dst, 0), s0 = row_index(kv, src, 0);
    td_backend *bk = kv->b; /* KV block copy: within the backend */
    for (int l = 0; l < kv->sh.n_layers; l++) {
        bk->ops->copy(bk, (unsigned char *)kv->k[l] + d0 * row, (unsigned char *)kv->k[l] + s0 * row, bytes);
        bk->ops->copy(bk, (unsigned char *)kv->v[l] + d0 * row, (unsigned char *)kv->v[l] + s0 * row, bytes);
        if (kv->ks) {
            size_t sb = (size_t)n * kv->n_heads * sizeof(float);
            bk->ops->copy(bk, kv->ks[l] + d0 * kv->n_heads, kv->ks[l] + s0 * kv->n_heads, sb);
            bk->ops->copy(bk, kv->vs[l] + d0 * kv->n_heads, kv->vs[l] + s0 * kv->n_heads, sb);
        }
    }
}

void td_kv_checkpoint(td_kv *kv, const int32_t *tokens, int n, const int *blocks, const float *state, const float *hidden, bool mtp_ok) {
    if (kv->n_ckpt == 0 || n <= 0) return;
    int B = TD_KV_BLOCK, n_full = n / B;
    /* register the full blocks, following the chain */
    uint64_t h = 0;
    int *canon = malloc((size_t)(n_full + 1) * sizeof(int));
    uint64_t *hashes = malloc((size_t)(n_full + 1) * sizeof(uint64_t));
    int32_t *toks = malloc((size_t)n * sizeof(int32_t));
    float *st = malloc(kv->sh.state_floats * sizeof(float) + 1);
    float *hd = malloc((size_t)kv->sh.hidden * sizeof(float));
    if (!canon || !hashes || !toks || !st || !hd) goto fail;
    for (int i = 0; i < n_full; i++) {
        h = td_kv_hash(h, tokens + (size_t)i * B, B);
        td_kv_register(kv, blocks[i], h, mtp_ok);
        int c = td_kv_lookup(kv, h, false);
        canon[i] = c >= 0 ? c : blocks[i];
        hashes[i] = h;
    }
    /* the partial tail needs its own copy (the sequence keeps writing its block) */
    int tail = -1;
    if (n % B) {
        tail = td_kv_alloc(kv);
        if (tail < 0) goto fail;
        copy_block(kv, tail, blocks[n_full], n % B);
    }
    /* replace an identical or the least recently used checkpoint */
    ckpt *slot = NULL;
    for (int i = 0; i < kv->n_ckpt && !slot; i++) {
        ckpt *c = &kv->ck[i];
        if (c->used && c->n == n && memcmp(c->tokens, tokens, (size_t)n * sizeof(int32_t)) == 0) slot = c;
    }
    for (int i = 0; i < kv->n_ckpt && !slot; i++)
        if (!kv->ck[i].used) slot = &kv->ck[i];
    if (!slot) { /* least recently used */
        slot = &kv->ck[0];
        for (int i = 1; i < kv->n_ckpt; i++)
            if (kv->ck[i].lru < slot->lru) slot = &kv->ck[i];
    }
    ckpt_clear(kv, slot);
    memcpy(toks, tokens, (size_t)n * sizeof(int32_t));
    td_bk_download(kv->b, st, state, kv->sh.state_floats * sizeof(float)); /* state to host */
    td_bk_download(kv->b, hd, hidden, (size_t)kv->sh.hidden * sizeof(float));
    *slot = (ckpt){.used = true, .lru = ++kv->tick, .n = n, .tokens = toks, .n_full = n_full, .blocks = canon, .hashes = hashes,
                   .tail = tail, .state = st, .hidden = hd, .mtp_ok = mtp_ok};
    return;
fail:
    free(canon); free(hashes); free(toks); free(st); free(hd);
}

/* The longest usable checkpoint (see td_kv_match), or NULL. */
static ckpt *best_match(const td_kv *kv, const int32_t *tokens, int max_len, bool need_mtp, int cap) {
    ckpt *best = NULL;
    for (int i = 0; i < kv->n_ckpt; i++) {
        ckpt *c = &kv->ck[i];
        if (!c->used || c->n > max_len || (best && c->n <= best->n) || (need_mtp && !c->mtp_ok)) continue;
        if (c->n_full + 1 > cap || memcmp(c->tokens, tokens, (size_t)c->n * sizeof(int32_t)) != 0) continue;
        bool cached = true;
        for (int j = 0; j < c->n_full && cached; j++) {
            int b = c->blocks[j];
            cached = kv->hashed[b] && kv->hash[b] == c->hashes[j] && (!need_mtp || kv->mtp_ok[b]);
        }
        if (cached) best = c;
    }
    return best;
}

int td_kv_match_len(const td_kv *kv, const int32_t *tokens, int max_len, bool need_mtp, int cap) {
    const ckpt *c = best_match(kv, tokens, max_len, need_mtp, cap);
    return c ? c->n : 0;
}

int td_kv_match(td_kv *kv, const int32_t *tokens, int max_len, bool need_mtp, int *blocks, int cap, td_kv_hit *hit) {
    memset(hit, 0, sizeof *hit);
    ckpt *best = best_match(kv, tokens, max_len, need_mtp, cap);
    if (!best) return 0;
    /* Take the shared blocks first: referenced, they leave the free list, so
     * the tail allocation below can neither evict them from the prefix cache
     * nor hand one of them out as the tail; the checkpoint is pinned so the
     * allocation cannot give back its tail and free it while we copy. */
    for (int j = 0; j < best->n_full; j++) {
        blocks[j] = best->blocks[j];
        td_kv_ref(kv, blocks[j]);
    }
    int tail = -1;
    if (best->tail >= 0) {
        best->pinned = true;
        tail = td_kv_alloc(kv);
        best->pinned = false;
        if (tail < 0) { /* no room for the tail: no hit, and nothing kept */
            for (int j = 0; j < best->n_full; j++) td_kv_release(kv, blocks[j]);
            return 0;
        }
        copy_block(kv, tail, best->tail, best->n % TD_KV_BLOCK);
        blocks[best->n_full] = tail;
    }
    best->lru = ++kv->tick;
    hit->len = best->n;
    hit->state = best->state;
    hit->hidden = best->hidden;
    hit->mtp_ok = best->mtp_ok;
    return best->n;
}
