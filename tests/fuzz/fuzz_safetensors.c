/* Safetensors header parsing and validation (src/format/safetensors.c):
 * the input is a whole .safetensors file (8-byte little-endian header
 * length, JSON header, data), opened through td_weights_open_files as a
 * memfd. An accepted file must keep its promises: every entry's bytes lie
 * in the data section, no two non-empty tensors overlap, sizes match
 * shapes, and lookups by name find each entry. */
#include <stdint.h>
#include "format/safetensors.h"
#include "fuzz_util.h"

static fuzz_file g_file;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_file_init(&g_file, "fuzz.safetensors");
    return 0;
}

typedef struct { const uint8_t *b, *e; } span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file_set(&g_file, data, size);
    const char *paths[1] = {g_file.path};
    td_weights *w = NULL;
    td_err err = {0};
    int rc = td_weights_open_files(paths, 1, &w, &err);
    if (rc != TD_OK) {
        FUZZ_ASSERT(w == NULL && rc < 0 && err.msg[0], "rc %d", rc);
        return 0;
    }
    FUZZ_ASSERT(w->n_files == 1 && w->files[0].size == size, "file size");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    const uint8_t *map = w->files[0].map, *dbeg = map + 8 + hlen, *dend = map + size;
    span *sp = calloc((size_t)w->n_entries + 1, sizeof *sp);
    int ns = 0;
    for (int i = 0; i < w->n_entries; i++) {
        const td_st_entry *e = &w->entries[i];
        FUZZ_ASSERT(e->name && e->ndim >= 0 && e->ndim <= TD_ST_MAX_DIMS, "entry %d", i);
        FUZZ_ASSERT((const uint8_t *)e->data >= dbeg && (const uint8_t *)e->data + e->nbytes <= dend,
                    "tensor %s outside the data section", e->name);
        FUZZ_ASSERT(td_weights_find(w, e->name) == e, "find %s", e->name);
        if (i) FUZZ_ASSERT(strcmp(w->entries[i - 1].name, e->name) < 0, "entries sorted and unique");
        td_tensor t;
        td_st_entry_tensor(e, &t);
        FUZZ_ASSERT(t.ndim <= TD_MAX_DIMS, "tensor view rank");
        volatile uint8_t sink = 0;
        if (e->nbytes) sink ^= ((const uint8_t *)e->data)[0] ^ ((const uint8_t *)e->data)[e->nbytes - 1];
        (void)sink;
        if (e->nbytes) sp[ns++] = (span){e->data, (const uint8_t *)e->data + e->nbytes};
    }
    qsort(sp, (size_t)ns, sizeof *sp, cmp_span);
    for (int i = 1; i < ns; i++) FUZZ_ASSERT(sp[i].b >= sp[i - 1].e, "overlapping tensors accepted");
    free(sp);
    FUZZ_ASSERT(td_weights_find(w, "\x01no such tensor") == NULL, "find missing");
    td_weights_free(w);
    return 0;
}
