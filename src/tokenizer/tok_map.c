/* Hash maps for vocab, merges and the word cache. Linear probing keeps the
 * lookups cache-friendly; the string map stores the full 64-bit hash so a
 * probe only touches key bytes when hashes agree. */
#include "tokenizer/tok_map.h"
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

int td_tm_str_init(tm_strmap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    size_t ns = pow2_at_least(expect * 2 + 1);
    m->slots = calloc(ns, sizeof *m->slots);
    m->cap = expect > 16 ? expect : 16;
    m->ents = malloc(m->cap * sizeof *m->ents);
    m->acap = m->cap * 8;
    m->arena = malloc(m->acap);
    if (!m->slots || !m->ents || !m->arena) { td_tm_str_free(m); return -1; }
    m->mask = ns - 1;
    return 0;
}

void td_tm_str_free(tm_strmap *m) {
    free(m->slots); free(m->ents); free(m->arena);
    memset(m, 0, sizeof *m);
}

void td_tm_str_clear(tm_strmap *m) {
    memset(m->slots, 0, (m->mask + 1) * sizeof *m->slots);
    m->n = 0;
    m->alen = 0;
}

static int rehash(tm_strmap *m, size_t ns) {
    uint32_t *s = calloc(ns, sizeof *s);
    if (!s) return -1;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = (size_t)m->ents[e].hash & (ns - 1);
        while (s[i]) i = (i + 1) & (ns - 1);
        s[i] = (uint32_t)(e + 1);
    }
    free(m->slots);
    m->slots = s;
    m->mask = ns - 1;
    return 0;
}

static inline size_t find_slot(const tm_strmap *m, const void *key, size_t len, uint64_t h, bool *found) {
    size_t i = (size_t)h & m->mask;
    for (;;) {
        uint32_t s = m->slots[i];
        if (!s) { *found = false; return i; }
        const struct tm_ent *e = &m->ents[s - 1];
        if (e->hash == h && e->len == len && memcmp(m->arena + e->off, key, len) == 0) {
            *found = true;
            return i;
        }
        i = (i + 1) & m->mask;
    }
}

bool td_tm_str_get(const tm_strmap *m, const void *key, size_t len, int32_t *val) {
    if (!m->slots) return false;
    bool found;
    size_t i = find_slot(m, key, len, XXH3_64bits(key, len), &found);
    if (found) *val = m->ents[m->slots[i] - 1].val;
    return found;
}

int td_tm_str_put(tm_strmap *m, const void *key, size_t len, int32_t val) {
    uint64_t h = XXH3_64bits(key, len);
    bool found;
    size_t i = find_slot(m, key, len, h, &found);
    if (found) { m->ents[m->slots[i] - 1].val = val; return 0; }
    if (m->n + 1 > UINT32_MAX - 1 || m->alen + len > UINT32_MAX) return -1;
    if (m->n == m->cap) {
        size_t nc = m->cap * 2;
        struct tm_ent *ne = realloc(m->ents, nc * sizeof *ne);
        if (!ne) return -1;
        m->ents = ne; m->cap = nc;
    }
    if (m->alen + len > m->acap) {
        size_t nc = m->acap * 2;
        while (nc < m->alen + len) nc *= 2;
        char *na = realloc(m->arena, nc);
        if (!na) return -1;
        m->arena = na; m->acap = nc;
    }
    memcpy(m->arena + m->alen, key, len);
    m->ents[m->n] = (struct tm_ent){h, (uint32_t)m->alen, (uint32_t)len, val};
    m->alen += len;
    m->slots[i] = (uint32_t)(++m->n);
    if (m->n * 2 > m->mask + 1) return rehash(m, (m->mask + 1) * 2);
    return 0;
}

int td_tm_u64_init(tm_u64map *m, size_t expect) {
    size_t ns = pow2_at_least(expect * 2 + 1);
    m->keys = malloc(ns * sizeof *m->keys);
    m->vals = malloc(ns * sizeof *m->vals);
    if (!m->keys || !m->vals) { free(m->keys); free(m->vals); m->keys = m->vals = NULL; return -1; }
    memset(m->keys, 0xff, ns * sizeof *m->keys);
    m->mask = ns - 1;
    m->n = 0;
    return 0;
}

void td_tm_u64_free(tm_u64map *m) {
    free(m->keys); free(m->vals);
    m->keys = m->vals = NULL;
}

int td_tm_u64_put(tm_u64map *m, uint64_t key, uint64_t val) {
    if ((m->n + 1) * 2 > m->mask + 1) {
        tm_u64map g;
        if (td_tm_u64_init(&g, (m->mask + 1)) != 0) return -1;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->keys[i] != UINT64_MAX) td_tm_u64_put(&g, m->keys[i], m->vals[i]);
        td_tm_u64_free(m);
        *m = g;
    }
    size_t i = (size_t)tm_u64_mix(key) & m->mask;
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key) i = (i + 1) & m->mask;
    if (m->keys[i] == UINT64_MAX) m->n++;
    m->keys[i] = key;
    m->vals[i] = val;
    return 0;
}
