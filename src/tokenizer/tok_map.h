/* Open-addressing hash maps used by the tokenizer (xxHash3 keys).
 * Private to src/tokenizer. */
#ifndef TANDEM_TOK_MAP_H
#define TANDEM_TOK_MAP_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* Byte-string -> int32 map. Keys are copied into an arena owned by the map,
 * so callers may pass transient buffers. */
typedef struct {
    uint32_t *slots;   /* index+1 into ents, 0 = empty */
    size_t mask;       /* slots - 1 (power of two) */
    struct tm_ent { uint64_t hash; uint32_t off, len; int32_t val; } *ents;
    size_t n, cap;
    char *arena;
    size_t alen, acap;
} tm_strmap;

int td_tm_str_init(tm_strmap *m, size_t expect);
void td_tm_str_free(tm_strmap *m);
/* Inserts or replaces; returns 0 or -1 on allocation failure. */
int td_tm_str_put(tm_strmap *m, const void *key, size_t len, int32_t val);
/* Returns true and *val when present. */
bool td_tm_str_get(const tm_strmap *m, const void *key, size_t len, int32_t *val);
void td_tm_str_clear(tm_strmap *m);
static inline const char *tm_str_key(const tm_strmap *m, size_t i, size_t *len) {
    *len = m->ents[i].len;
    return m->arena + m->ents[i].off;
}

/* uint64 -> uint64 map (merge pairs). Key UINT64_MAX is reserved. */
typedef struct {
    uint64_t *keys, *vals;
    size_t mask, n;
} tm_u64map;

int td_tm_u64_init(tm_u64map *m, size_t expect);
void td_tm_u64_free(tm_u64map *m);
int td_tm_u64_put(tm_u64map *m, uint64_t key, uint64_t val);
static inline uint64_t tm_u64_mix(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL; k ^= k >> 33;
    return k;
}
/* Hot path of BPE: inline lookup. */
static inline bool tm_u64_get(const tm_u64map *m, uint64_t key, uint64_t *val) {
    size_t i = (size_t)tm_u64_mix(key) & m->mask;
    for (;;) {
        uint64_t k = m->keys[i];
        if (k == key) { *val = m->vals[i]; return true; }
        if (k == UINT64_MAX) return false;
        i = (i + 1) & m->mask;
    }
}
#endif
