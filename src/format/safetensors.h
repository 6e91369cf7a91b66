/* Safetensors reader: memory-maps one or more files (single file or a
 * model.safetensors.index.json shard set) and validates every header entry
 * against the file (dtype, shape, offsets in range, sizes, no overlaps).
 * Model files are untrusted: nothing here trusts a size it has not checked. */
#ifndef TANDEM_FORMAT_SAFETENSORS_H
#define TANDEM_FORMAT_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "model/tensor.h"
#include "tandem.h"

/* A header may give a tensor any rank (real checkpoints carry a 5-D Conv3d
 * vision patch embedding); the reader bounds it only to keep a hostile header
 * from allocating without limit. The engine's own tensors have at most
 * TD_MAX_DIMS dims; get_tensor in model.c checks the rank it needs. */
#define TD_ST_MAX_DIMS 64

typedef struct td_st_entry {
    char *name;
    char dtype_str[16];   /* as written in the header, e.g. "BF16" */
    td_dtype dtype;       /* TD_DTYPE_COUNT when the dtype is valid but unsupported here */
    int ndim;             /* 0..TD_ST_MAX_DIMS */
    int64_t shape[TD_ST_MAX_DIMS];
    const void *data;     /* points into the mapping */
    size_t nbytes;
    int file;             /* index into td_weights.files */
} td_st_entry;

typedef struct td_st_file {
    char *path;
    void *map;
    size_t size;
} td_st_file;

typedef struct td_weights {
    td_st_file *files;
    int n_files;
    td_st_entry *entries; /* sorted by name */
    int n_entries;
} td_weights;

/* Opens <dir>/model.safetensors.index.json if present, else <dir>/model.safetensors. */
int td_weights_open_dir(const char *dir, td_weights **out, td_err *err);
/* Opens explicit files (used by tests and the index loader). */
int td_weights_open_files(const char *const *paths, int n, td_weights **out, td_err *err);
void td_weights_free(td_weights *w);
/* Drops this process's pages of the file mappings (MADV_DONTNEED; the page
 * cache keeps them, reclaimable): after the backend copied the tensors it
 * uses, so they are not resident twice. The mappings stay valid; a later read
 * faults its page back from the file. */
void td_weights_release_pages(const td_weights *w);
const td_st_entry *td_weights_find(const td_weights *w, const char *name);
/* Fills a td_tensor view of an entry. An entry of more than TD_MAX_DIMS dims
 * is viewed with its trailing dims folded into the last one (same element
 * count); the loader never maps such a tensor into compute. */
void td_st_entry_tensor(const td_st_entry *e, td_tensor *t);

#endif
