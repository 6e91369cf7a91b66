#include "format/safetensors.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/err.h"

/* Every dtype the safetensors format defines, with its element size, so that
 * sizes can be validated even for tensors we never use (e.g. model.visual.*). */
static const struct { const char *name; size_t size; td_dtype dtype; } st_dtypes[] = {
    {"F32", 4, TD_DTYPE_F32},   {"BF16", 2, TD_DTYPE_BF16},  {"F16", 2, TD_DTYPE_F16},
    {"F8_E4M3", 1, TD_DTYPE_F8_E4M3}, {"I32", 4, TD_DTYPE_I32}, {"I64", 8, TD_DTYPE_I64},
    {"U8", 1, TD_DTYPE_U8},     {"F64", 8, TD_DTYPE_COUNT},   {"I16", 2, TD_DTYPE_COUNT},
    {"U16", 2, TD_DTYPE_COUNT}, {"I8", 1, TD_DTYPE_COUNT},    {"BOOL", 1, TD_DTYPE_COUNT},
    {"F8_E5M2", 1, TD_DTYPE_COUNT}, {"U32", 4, TD_DTYPE_COUNT}, {"U64", 8, TD_DTYPE_COUNT},
};

#define ST_MAX_HEADER (256u << 20)

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const td_st_entry *)a)->name, ((const td_st_entry *)b)->name);
}

typedef struct { size_t begin, end; const char *name; } span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int map_file(const char *path, td_st_file *f, td_err *err) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return TD_FAIL(err, TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return TD_FAIL(err, TD_ERR_IO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: not a regular file", path);
    }
    f->size = (size_t)st.st_size;
    f->map = NULL;
    if (f->size > 0) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            int e = errno;
            f->map = NULL;
            close(fd);
            return TD_FAIL(err, TD_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
    }
    close(fd);
    f->path = strdup(path);
    if (!f->path) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

/* Parses one file's header and appends its entries to *entries. */
static int parse_header(td_st_file *f, int file_idx, td_st_entry **entries, int *n_entries, int *cap,
                        td_err *err) {
    const char *path = f->path;
    if (f->size < 8) return TD_FAIL(err, TD_ERR_FORMAT, "%s: truncated safetensors file (%zu bytes, need at least 8)", path, f->size);
    const unsigned char *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8)
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes)", path,
                       (unsigned long long)hlen, f->size);
    const char *hdr = (const char *)p + 8;
    size_t data_size = f->size - 8 - (size_t)hlen;
    const unsigned char *data = p + 8 + hlen;
    json_error_t je;
    json_t *root = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) return TD_FAIL(err, TD_ERR_FORMAT, "%s: bad header JSON at byte %d: %s", path, je.position, je.text);
    int rc = TD_OK;
    if (!json_is_object(root)) {
        rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto out;
    }
    size_t n_keys = json_object_size(root);
    span *spans = calloc(n_keys + 1, sizeof *spans);
    if (!spans) { rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); goto out; }
    size_t n_spans = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        if (!json_is_object(val)) { rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: entry is not an object", path, key); break; }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"), *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
            rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: needs dtype, shape and data_offsets[2]", path, key);
            break;
        }
        const char *ds = json_string_value(jd);
        size_t k, esize = 0;
        td_dtype dt = TD_DTYPE_COUNT;
        for (k = 0; k < sizeof st_dtypes / sizeof st_dtypes[0]; k++)
            if (strcmp(ds, st_dtypes[k].name) == 0) { esize = st_dtypes[k].size; dt = st_dtypes[k].dtype; break; }
        if (!esize) { rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: unknown dtype \"%s\"", path, key, ds); break; }
        size_t nd = json_array_size(js);
        if (nd > TD_ST_MAX_DIMS) { rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: %zu dims (at most %d are read)", path, key, nd, TD_ST_MAX_DIMS); break; }
        td_st_entry e;
        memset(&e, 0, sizeof e);
        e.ndim = (int)nd;
        e.dtype = dt;
        snprintf(e.dtype_str, sizeof e.dtype_str, "%s", ds);
        uint64_t numel = 1;
        int bad = 0;
        for (size_t d = 0; d < nd; d++) {
            json_t *x = json_array_get(js, d);
            json_int_t v = json_is_integer(x) ? json_integer_value(x) : -1;
            if (v < 0 || v > (json_int_t)1 << 40) { bad = 1; break; }
            e.shape[d] = v;
            if (v && numel > UINT64_MAX / (uint64_t)v) { bad = 1; break; }
            numel *= (uint64_t)v;
        }
        if (bad) { rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: invalid shape", path, key); break; }
        json_t *b = json_array_get(jo, 0), *en = json_array_get(jo, 1);
        if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
            json_integer_value(en) < json_integer_value(b) || (uint64_t)json_integer_value(en) > data_size) {
            rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: data_offsets out of the file's data (%zu bytes)", path, key, data_size);
            break;
        }
        size_t begin = (size_t)json_integer_value(b), end = (size_t)json_integer_value(en);
        if (numel > SIZE_MAX / esize || numel * esize != end - begin) {
            rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: %zu bytes for shape of %llu x %s", path, key,
                         end - begin, (unsigned long long)numel, ds);
            break;
        }
        e.data = data + begin;
        e.nbytes = end - begin;
        e.file = file_idx;
        e.name = strdup(key);
        if (!e.name) { rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); break; }
        if (*n_entries == *cap) {
            int nc = *cap ? *cap * 2 : 256;
            td_st_entry *ne = realloc(*entries, (size_t)nc * sizeof *ne);
            if (!ne) { free(e.name); rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); break; }
            *entries = ne;
            *cap = nc;
        }
        (*entries)[(*n_entries)++] = e;
        spans[n_spans].begin = begin;
        spans[n_spans].end = end;
        spans[n_spans].name = (*entries)[*n_entries - 1].name;
        n_spans++;
    }
    if (rc == TD_OK) {
        /* Sorted by begin, each non-empty span must start at or after the
         * furthest end so far (not only the previous span's: a 0-byte tensor
         * in between must not hide an overlap). */
        qsort(spans, n_spans, sizeof *spans, cmp_span);
        size_t max_end = 0;
        const char *max_name = NULL;
        for (size_t i = 0; i < n_spans; i++) {
            if (spans[i].end == spans[i].begin) continue;
            if (max_name && spans[i].begin < max_end) {
                rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensors %s and %s overlap", path, max_name, spans[i].name);
                break;
            }
            max_end = spans[i].end;
            max_name = spans[i].name;
        }
    }
    free(spans);
out:
    json_decref(root);
    return rc;
}

int td_weights_open_files(const char *const *paths, int n, td_weights **out, td_err *err) {
    *out = NULL;
    td_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->files = calloc(n > 0 ? (size_t)n : 1, sizeof *w->files))) {
        free(w);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    }
    int cap = 0, rc = TD_OK;
    for (int i = 0; i < n && rc == TD_OK; i++) {
        rc = map_file(paths[i], &w->files[i], err);
        if (rc == TD_OK) {
            w->n_files = i + 1;
            rc = parse_header(&w->files[i], i, &w->entries, &w->n_entries, &cap, err);
        }
    }
    if (rc == TD_OK && w->n_entries > 0) { /* entries is NULL when there are none */
        qsort(w->entries, (size_t)w->n_entries, sizeof *w->entries, cmp_entry);
        for (int i = 1; i < w->n_entries; i++)
            if (strcmp(w->entries[i].name, w->entries[i - 1].name) == 0) {
                rc = TD_FAIL(err, TD_ERR_FORMAT, "tensor %s appears twice (%s and %s)", w->entries[i].name,
                             w->files[w->entries[i - 1].file].path, w->files[w->entries[i].file].path);
                break;
            }
    }
    if (rc != TD_OK) {
        td_weights_free(w);
        return rc;
    }
    *out = w;
    return TD_OK;
}

static int path_join(char *buf, size_t cap, const char *dir, const char *name, td_err *err) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return TD_FAIL(err, TD_ERR_ARG, "path too long: %s/%s", dir, name);
    return TD_OK;
}

int td_weights_open_dir(const char *dir, td_weights **out, td_err *err) {
    char path[4096];
    int rc = path_join(path, sizeof path, dir, "model.safetensors.index.json", err);
    if (rc) return rc;
    if (access(path, F_OK) != 0) {
        if ((rc = path_join(path, sizeof path, dir, "model.safetensors", err))) return rc;
        const char *p = path;
        return td_weights_open_files(&p, 1, out, err);
    }
    json_error_t je;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return TD_FAIL(err, TD_ERR_FORMAT, "%s: not a regular file", path);
    json_t *idx = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!idx) return TD_FAIL(err, TD_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    json_t *map = json_object_get(idx, "weight_map");
    if (!json_is_object(map)) {
        json_decref(idx);
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: no \"weight_map\" object", path);
    }
    /* Unique shard names, in first-seen order. */
    size_t n_map = json_object_size(map);
    char **names = calloc(n_map + 1, sizeof *names);
    int n_names = 0;
    if (!names) { json_decref(idx); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); }
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        const char *f = json_string_value(val);
        if (!f || !*f || strchr(f, '/') || strcmp(f, "..") == 0) {
            rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s: bad shard file name", path, key);
            break;
        }
        int seen = 0;
        for (int i = 0; i < n_names && !seen; i++) seen = strcmp(strrchr(names[i], '/') + 1, f) == 0;
        if (!seen) {
            size_t len = strlen(dir) + strlen(f) + 2;
            names[n_names] = malloc(len);
            if (!names[n_names]) { rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); break; }
            snprintf(names[n_names], len, "%s/%s", dir, f);
            n_names++;
        }
    }
    if (rc == TD_OK) rc = td_weights_open_files((const char *const *)names, n_names, out, err);
    /* Every tensor the index names must exist in the file it names. */
    if (rc == TD_OK) {
        json_object_foreach(map, key, val) {
            const td_st_entry *e = td_weights_find(*out, key);
            const char *f = json_string_value(val);
            const char *actual = e ? strrchr((*out)->files[e->file].path, '/') : NULL;
            if (!e || !actual || strcmp(actual + 1, f) != 0) {
                rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: tensor %s is not in %s", path, key, f);
                td_weights_free(*out);
                *out = NULL;
                break;
            }
        }
    }
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    json_decref(idx);
    return rc;
}

void td_weights_free(td_weights *w) {
    if (!w) return;
    for (int i = 0; i < w->n_entries; i++) free(w->entries[i].name);
    free(w->entries);
    for (int i = 0; i < w->n_files; i++) {
        if (w->files[i].map) munmap(w->files[i].map, w->files[i].size);
        free(w->files[i].path);
    }
    free(w->files);
    free(w);
}

void td_weights_release_pages(const td_weights *w) {
    for (int i = 0; w && i < w->n_files; i++)
        if (w->files[i].map) (void)madvise(w->files[i].map, w->files[i].size, MADV_DONTNEED); /* read-only, private: nothing lost */
}

const td_st_entry *td_weights_find(const td_weights *w, const char *name) {
    if (w->n_entries == 0) return NULL;
    td_st_entry key;
    key.name = (char *)name;
    return bsearch(&key, w->entries, (size_t)w->n_entries, sizeof key, cmp_entry);
}

void td_st_entry_tensor(const td_st_entry *e, td_tensor *t) {
    memset(t, 0, sizeof *t);
    t->dtype = e->dtype;
    t->ndim = e->ndim < TD_MAX_DIMS ? e->ndim : TD_MAX_DIMS;
    for (int d = 0; d < t->ndim; d++) t->shape[d] = e->shape[d];
    for (int d = TD_MAX_DIMS; d < e->ndim; d++) t->shape[TD_MAX_DIMS - 1] *= e->shape[d];
    t->data = e->data;
    t->name = e->name;
    t->scale_f = 1.0f;
}
