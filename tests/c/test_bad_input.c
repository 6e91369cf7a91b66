/* Bad input: model directories broken on purpose, built at run time from the
 * golden models (tests/golden/tiny-a/f32, single file; tiny-b/f32, sharded).
 * Every case must make td_engine_load fail with a negative status and one
 * non-empty line naming the file (and the tensor where there is one); never
 * a crash. Some cases also go through `tandem inspect` and `tandem run`:
 * non-zero exit (not a signal) and exactly one stderr line "tandem: ...".
 * Set TANDEM_VERBOSE=1 to print every case's message. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "golden.h"
#include "tandem.h"

static char g_root[64];       /* mkdtemp */
static char g_tandem[512];    /* CLI binary, "" when absent */
static int g_cases, g_cli_cases, g_verbose;

#define A_FILE "model.safetensors"
#define B_SHARD1 "model-00001-of-00002.safetensors"
#define B_SHARD2 "model-00002-of-00002.safetensors"
#define B_INDEX "model.safetensors.index.json"

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "test_bad_input: setup: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* ---- files ------------------------------------------------------------- */

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", path);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) die("cannot write %s", path);
}

static void path_in(char *out, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) die("path too long");
}

static void copy_dir(const char *src, const char *dst) {
    DIR *d = opendir(src);
    if (!d) die("cannot open %s", src);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char a[1024], b[1024];
        path_in(a, sizeof a, src, de->d_name);
        path_in(b, sizeof b, dst, de->d_name);
        size_t n;
        unsigned char *buf = slurp(a, &n);
        spit(b, buf, n);
        free(buf);
    }
    closedir(d);
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[1024];
        path_in(p, sizeof p, dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_dir(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* A fresh copy of golden model `name` ("tiny-a" or "tiny-b") in dir. */
static void new_case(char *dir, size_t cap, const char *name) {
    static int n;
    if ((size_t)snprintf(dir, cap, "%s/case%03d", g_root, ++n) >= cap) die("path too long");
    if (mkdir(dir, 0700) != 0) die("mkdir %s: %s", dir, strerror(errno));
    char src[512];
    snprintf(src, sizeof src, "%s/%s/f32", golden_root(), name);
    copy_dir(src, dir);
}

/* ---- safetensors editing ----------------------------------------------- */

typedef struct {
    json_t *hdr;          /* header object */
    unsigned char *data;  /* data section */
    size_t n;             /* its bytes */
} stfile;

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static stfile st_load(const char *path) {
    size_t len;
    unsigned char *b = slurp(path, &len);
    if (len < 8) die("%s: short", path);
    uint64_t hl = le64(b);
    if (hl > len - 8) die("%s: bad header length", path);
    json_error_t je;
    stfile f;
    f.hdr = json_loadb((const char *)b + 8, (size_t)hl, 0, &je);
    if (!f.hdr) die("%s: %s", path, je.text);
    f.n = len - 8 - (size_t)hl;
    f.data = malloc(f.n + 1);
    memcpy(f.data, b + 8 + hl, f.n);
    free(b);
    return f;
}

/* Writes the file back; the header is space-padded to 8 bytes, then `skew`
 * more spaces (to misalign the data on purpose). */
static void st_save(const char *path, const stfile *f, int skew) {
    char *h = json_dumps(f->hdr, JSON_COMPACT);
    size_t hl = strlen(h), pl = (hl + 7) / 8 * 8 + (size_t)skew;
    unsigned char *b = malloc(8 + pl + f->n);
    put_le64(b, pl);
    memcpy(b + 8, h, hl);
    memset(b + 8 + hl, ' ', pl - hl);
    memcpy(b + 8 + pl, f->data, f->n);
    spit(path, b, 8 + pl + f->n);
    free(b);
    free(h);
}

static void st_free(stfile *f) {
    json_decref(f->hdr);
    free(f->data);
}

static json_t *st_entry(stfile *f, const char *name) {
    json_t *e = json_object_get(f->hdr, name);
    if (!json_is_object(e)) die("tensor %s not in the golden file", name);
    return e;
}

static long long st_off(stfile *f, const char *name, int i) {
    return json_integer_value(json_array_get(json_object_get(st_entry(f, name), "data_offsets"), (size_t)i));
}

static void st_set_offsets(stfile *f, const char *name, long long b, long long e) {
    json_object_set_new(st_entry(f, name), "data_offsets", json_pack("[II]", (json_int_t)b, (json_int_t)e));
}

static void st_set_shape(stfile *f, const char *name, int nd, ...) {
    json_t *s = json_array();
    va_list ap;
    va_start(ap, nd);
    for (int i = 0; i < nd; i++) json_array_append_new(s, json_integer(va_arg(ap, long long)));
    va_end(ap);
    json_object_set_new(st_entry(f, name), "shape", s);
}

static void st_set_dtype(stfile *f, const char *name, const char *dt) {
    json_object_set_new(st_entry(f, name), "dtype", json_string(dt));
}

/* Writes raw header text (padded to 8) with the file's original data. */
static void st_save_raw_header(const char *path, const char *text) {
    stfile f = st_load(path);
    size_t hl = strlen(text), pl = (hl + 7) / 8 * 8;
    unsigned char *b = malloc(8 + pl + f.n);
    put_le64(b, pl);
    memcpy(b + 8, text, hl);
    memset(b + 8 + hl, ' ', pl - hl);
    memcpy(b + 8 + pl, f.data, f.n);
    spit(path, b, 8 + pl + f.n);
    free(b);
    st_free(&f);
}

static void file_truncate(const char *path, size_t len) {
    if (truncate(path, (off_t)len) != 0) die("truncate %s: %s", path, strerror(errno));
}

static size_t file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) die("stat %s", path);
    return (size_t)st.st_size;
}

static void set_header_len(const char *path, uint64_t v) {
    size_t n;
    unsigned char *b = slurp(path, &n);
    put_le64(b, v);
    spit(path, b, n);
    free(b);
}

/* ---- JSON files (config, index) ---------------------------------------- */

static json_t *json_read(const char *dir, const char *name) {
    char p[1024];
    path_in(p, sizeof p, dir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) die("%s: %s", p, je.text);
    return j;
}

static void json_write(const char *dir, const char *name, json_t *j) {
    char p[1024];
    path_in(p, sizeof p, dir, name);
    if (json_dump_file(j, p, JSON_INDENT(2)) != 0) die("cannot write %s", p);
    json_decref(j);
}

static void text_write(const char *dir, const char *name, const char *text) {
    char p[1024];
    path_in(p, sizeof p, dir, name);
    spit(p, text, strlen(text));
}

/* Sets key k of config.json's text part (text_config for qwen3_5) to v (NULL deletes). */
static void cfg_set(const char *dir, const char *k, json_t *v) {
    json_t *root = json_read(dir, "config.json");
    json_t *t = json_object_get(root, "text_config");
    if (!t) t = root;
    if (v) json_object_set_new(t, k, v);
    else json_object_del(t, k);
    json_write(dir, "config.json", root);
}

static void index_map_set(const char *dir, const char *tensor, json_t *shard) {
    json_t *root = json_read(dir, B_INDEX);
    json_t *m = json_object_get(root, "weight_map");
    if (shard) json_object_set_new(m, tensor, shard);
    else json_object_del(m, tensor);
    json_write(dir, B_INDEX, root);
}

/* ---- checks ------------------------------------------------------------ */

/* Runs `tandem <args> -m dir`; exit must be a non-zero status (not a signal)
 * and stderr exactly one line starting with "tandem: ". */
static void cli_check(const char *what, const char *dir, const char *sub) {
    if (!g_tandem[0]) return;
    char errp[600], cmd[2048];
    snprintf(errp, sizeof errp, "%s/stderr.txt", g_root);
    snprintf(cmd, sizeof cmd, "'%s' %s -m '%s' %s </dev/null >/dev/null 2>'%s'", g_tandem, sub, dir,
             strcmp(sub, "run") == 0 ? "-p hi -n 4" : "", errp);
    int st = system(cmd);
    g_cli_cases++;
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) < 126,
          "%s: tandem %s: wait status 0x%x (exit %d)", what, sub, st, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    size_t n;
    unsigned char *out = slurp(errp, &n);
    const char *nl = memchr(out, '\n', n);
    CHECK(n > 0 && nl == (const char *)out + n - 1, "%s: tandem %s: stderr is not one line: %s", what, sub, (char *)out);
    CHECK(strncmp((const char *)out, "tandem: ", 8) == 0, "%s: tandem %s: stderr does not start with \"tandem: \": %s",
          what, sub, (char *)out);
    free(out);
}

/* td_engine_load(dir) must fail with one line containing need1 and need2 (if set). */
static void expect_fail_ex(const char *what, const char *dir, const char *need1, const char *need2, bool cli) {
    td_err err;
    memset(&err, 0, sizeof err);
    td_engine_opts o = {.n_threads = 1};
    td_engine *eng = NULL;
    int rc = td_engine_load(dir, &o, &eng, &err);
    g_cases++;
    CHECK(rc < 0, "%s: td_engine_load returned %d", what, rc);
    CHECK(eng == NULL, "%s: engine returned on failure", what);
    if (rc == 0) {
        td_engine_free(eng);
    } else {
        size_t len = strnlen(err.msg, sizeof err.msg);
        CHECK(len > 0 && len < sizeof err.msg, "%s: empty or unterminated message", what);
        bool one_line = true;
        for (size_t i = 0; i < len; i++) one_line &= (unsigned char)err.msg[i] >= 0x20 && err.msg[i] != 0x7f;
        CHECK(one_line, "%s: message is not one printable line: %s", what, err.msg);
        CHECK(err.code == rc, "%s: err.code %d, returned %d", what, err.code, rc);
        if (need1) CHECK(strstr(err.msg, need1) != NULL, "%s: message lacks \"%s\": %s", what, need1, err.msg);
        if (need2) CHECK(strstr(err.msg, need2) != NULL, "%s: message lacks \"%s\": %s", what, need2, err.msg);
        if (g_verbose) printf("  %-34s %s\n", what, err.msg);
    }
    if (cli) {
        cli_check(what, dir, "inspect");
        cli_check(what, dir, "run");
    }
    rm_dir(dir);
}

#define expect_fail(what, dir, n1, n2) expect_fail_ex(what, dir, n1, n2, false)

static void expect_ok(const char *what, const char *dir) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 1};
    td_engine *eng = NULL;
    int rc = td_engine_load(dir, &o, &eng, &err);
    CHECK(rc == 0 && eng, "%s: control case must load: %s", what, err.msg);
    td_engine_free(eng);
    rm_dir(dir);
}

/* ---- cases: safetensors file (tiny-a) ------------------------------------ */

#define EMBED_A "model.embed_tokens.weight"
#define NORM_A "model.norm.weight"
#define GATE_A "model.layers.0.mlp.gate_proj.weight" /* [128, 64] F32 */
#define UP_A "model.layers.0.mlp.up_proj.weight"     /* [128, 64] F32 */
#define UP5_A "model.layers.5.mlp.up_proj.weight"

static void cases_truncated(void) {
    char dir[256], p[512];
    new_case(dir, sizeof dir, "tiny-a");
    path_in(p, sizeof p, dir, A_FILE);
    size_t size = file_size(p);
    size_t n;
    unsigned char *b = slurp(p, &n);
    uint64_t hl = le64(b);
    free(b);
    rm_dir(dir);
    struct { const char *what; size_t at; const char *need; } cuts[] = {
        {"truncated: empty file", 0, "truncated"},
        {"truncated: inside length (3)", 3, "truncated"},
        {"truncated: inside length (7)", 7, "truncated"},
        {"truncated: after length", 8, "header length"},
        {"truncated: inside header", 8 + (size_t)hl / 2, "header length"},
        {"truncated: header minus 1", 8 + (size_t)hl - 1, "header length"},
        {"truncated: no data", 8 + (size_t)hl, "data_offsets"},
        {"truncated: inside data", 8 + (size_t)hl + 1000, "data_offsets"},
        {"truncated: last byte", size - 1, "data_offsets"},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        new_case(dir, sizeof dir, "tiny-a");
        path_in(p, sizeof p, dir, A_FILE);
        file_truncate(p, cuts[i].at);
        expect_fail_ex(cuts[i].what, dir, A_FILE, cuts[i].need, i == 1 || i == 7);
    }
}

static void cases_header(void) {
    char dir[256], p[512];
    static const struct { const char *what; const char *text; const char *need; } raw[] = {
        {"header: garbage", "this is not json at all", "bad header JSON"},
        {"header: empty", "", "bad header JSON"},
        {"header: array", "[1, 2, 3]", "not a JSON object"},
        {"header: string", "\"model\"", "bad header JSON"},
        {"header: entry not object", "{\"" NORM_A "\": 5}", NORM_A},
        {"header: no offsets", "{\"" NORM_A "\": {\"dtype\": \"F32\", \"shape\": [64]}}", NORM_A},
        {"header: offsets size 1", "{\"" NORM_A "\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [0]}}", NORM_A},
        {"header: offsets strings", "{\"" NORM_A "\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [\"0\", \"256\"]}}", NORM_A},
        {"header: offsets reals", "{\"" NORM_A "\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [0.0, 256.0]}}", NORM_A},
        {"header: dtype not string", "{\"" NORM_A "\": {\"dtype\": 5, \"shape\": [64], \"data_offsets\": [0, 256]}}", NORM_A},
        {"header: shape not array", "{\"" NORM_A "\": {\"dtype\": \"F32\", \"shape\": 64, \"data_offsets\": [0, 256]}}", NORM_A},
        {"header: duplicate key",
         "{\"" NORM_A "\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [0, 256]}, "
         "\"" NORM_A "\": {\"dtype\": \"F32\", \"shape\": [64], \"data_offsets\": [256, 512]}}", "bad header JSON"},
        {"header: nested 100k deep", NULL, "bad header JSON"},
        {"header: empty object", "{}", "missing tensor"},
        {"header: control chars in name", "{\"a\\nb\\u0001\": {\"dtype\": \"Q\\n4\", \"shape\": [1], \"data_offsets\": [0, 1]}}", "unknown dtype"},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        new_case(dir, sizeof dir, "tiny-a");
        path_in(p, sizeof p, dir, A_FILE);
        if (raw[i].text) {
            st_save_raw_header(p, raw[i].text);
        } else {
            size_t depth = 100000;
            char *t = malloc(2 * depth + 1);
            memset(t, '[', depth);
            memset(t + depth, ']', depth);
            t[2 * depth] = 0;
            st_save_raw_header(p, t);
            free(t);
        }
        expect_fail_ex(raw[i].what, dir, A_FILE, raw[i].need, i == 0);
    }
    struct { const char *what; uint64_t len; } lens[] = {
        {"header length = file size", 0}, {"header length = 2^64-1", UINT64_MAX},
        {"header length = 2^63", (uint64_t)1 << 63}, {"header length = 0", 1},
    };
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        new_case(dir, sizeof dir, "tiny-a");
        path_in(p, sizeof p, dir, A_FILE);
        uint64_t v = i == 0 ? file_size(p) : i == 3 ? 0 : lens[i].len;
        set_header_len(p, v);
        expect_fail(lens[i].what, dir, A_FILE, i == 3 ? "bad header JSON" : "header length");
    }
}

/* One edit of tiny-a's model.safetensors per case. */
enum {
    E_END_OUT, E_BEGIN_NEG, E_BEGIN_GT_END, E_HUGE_OFF, E_SIZE_SHAPE, E_SHAPE_NEG, E_SHAPE_5D, E_SHAPE_STR,
    E_SHAPE_OVERFLOW, E_OVERLAP_SAME, E_OVERLAP_PART, E_OVERLAP_ZERO, E_DTYPE_UNKNOWN, E_DTYPE_LOWER, E_DTYPE_I32,
    E_DTYPE_U8, E_DTYPE_F64, E_DTYPE_BOOL, E_SHAPE_T, E_SHAPE_ND, E_SHAPE_VEC, E_MISSING, E_MISSING_EMBED,
    E_MISSING_NORM, E_MTP_NO_FC, E_MTP_NO_NORM, E_MTP_SHAPE, E_MISALIGNED, E_COUNT
};

static void cases_entries(void) {
    static const struct { const char *what; const char *need; } info[E_COUNT] = {
        [E_END_OUT] = {"offsets: end past data", NORM_A},
        [E_BEGIN_NEG] = {"offsets: negative begin", NORM_A},
        [E_BEGIN_GT_END] = {"offsets: begin > end", NORM_A},
        [E_HUGE_OFF] = {"offsets: 2^62", NORM_A},
        [E_SIZE_SHAPE] = {"size != shape x dtype", NORM_A},
        [E_SHAPE_NEG] = {"shape: negative dim", NORM_A},
        [E_SHAPE_5D] = {"shape: 5 dims", NORM_A},
        [E_SHAPE_STR] = {"shape: string dim", NORM_A},
        [E_SHAPE_OVERFLOW] = {"shape: numel overflow", NORM_A},
        [E_OVERLAP_SAME] = {"overlap: same range", "overlap"},
        [E_OVERLAP_PART] = {"overlap: 4 bytes", "overlap"},
        [E_OVERLAP_ZERO] = {"overlap: behind a 0-byte tensor", "overlap"},
        [E_DTYPE_UNKNOWN] = {"dtype: Q4_K", "Q4_K"},
        [E_DTYPE_LOWER] = {"dtype: f32 (lower case)", "f32"},
        [E_DTYPE_I32] = {"dtype: I32 model tensor", GATE_A},
        [E_DTYPE_U8] = {"dtype: U8 model tensor", GATE_A},
        [E_DTYPE_F64] = {"dtype: F64 model tensor", GATE_A},
        [E_DTYPE_BOOL] = {"dtype: BOOL norm", NORM_A},
        [E_SHAPE_T] = {"shape: transposed", GATE_A},
        [E_SHAPE_ND] = {"shape: 1-D as 2-D", NORM_A},
        [E_SHAPE_VEC] = {"shape: 2-D flattened", GATE_A},
        [E_MISSING] = {"missing tensor", UP5_A},
        [E_MISSING_EMBED] = {"missing embed_tokens", "embed_tokens"},
        [E_MISSING_NORM] = {"missing final norm", NORM_A},
        [E_MTP_NO_FC] = {"MTP without mtp.fc.weight", "mtp.fc.weight"},
        [E_MTP_NO_NORM] = {"MTP without mtp.norm.weight", "mtp.norm.weight"},
        [E_MTP_SHAPE] = {"MTP fc wrong shape", "mtp.fc.weight"},
        [E_MISALIGNED] = {"data misaligned", "align"},
    };
    for (int c = 0; c < E_COUNT; c++) {
        char dir[256], p[512];
        new_case(dir, sizeof dir, "tiny-a");
        path_in(p, sizeof p, dir, A_FILE);
        stfile f = st_load(p);
        long long nb = st_off(&f, NORM_A, 0), ne = st_off(&f, NORM_A, 1);
        long long gb = st_off(&f, GATE_A, 0), ge = st_off(&f, GATE_A, 1);
        long long eb = st_off(&f, EMBED_A, 0);
        int skew = 0;
        switch (c) {
        case E_END_OUT: st_set_offsets(&f, NORM_A, (long long)f.n - 252, (long long)f.n + 4); break;
        case E_BEGIN_NEG: st_set_offsets(&f, NORM_A, -256, 0); break;
        case E_BEGIN_GT_END: st_set_offsets(&f, NORM_A, ne, nb); break;
        case E_HUGE_OFF: st_set_offsets(&f, NORM_A, (1LL << 62), (1LL << 62) + 256); break;
        case E_SIZE_SHAPE: st_set_shape(&f, NORM_A, 1, 65LL); break;
        case E_SHAPE_NEG: st_set_shape(&f, NORM_A, 2, -1LL, -64LL); break;
        case E_SHAPE_5D: st_set_shape(&f, NORM_A, 5, 1LL, 1LL, 1LL, 1LL, 64LL); break;
        case E_SHAPE_STR: json_object_set_new(st_entry(&f, NORM_A), "shape", json_pack("[s]", "64")); break;
        case E_SHAPE_OVERFLOW: st_set_shape(&f, NORM_A, 4, 1LL << 40, 1LL << 40, 1LL << 40, 0LL); break;
        case E_OVERLAP_SAME: st_set_offsets(&f, UP_A, gb, ge); break;
        case E_OVERLAP_PART: st_set_offsets(&f, NORM_A, gb + 4, gb + 4 + (ne - nb)); break;
        case E_OVERLAP_ZERO:
            /* embed [eb, ...) holds a 0-byte tensor, then the norm inside it */
            json_object_set_new(f.hdr, "extra.zero", json_pack("{s:s, s:[i], s:[II]}", "dtype", "F32", "shape", 0,
                                                               "data_offsets", (json_int_t)eb + 8, (json_int_t)eb + 8));
            st_set_offsets(&f, NORM_A, eb + 64, eb + 64 + (ne - nb));
            break;
        case E_DTYPE_UNKNOWN: st_set_dtype(&f, NORM_A, "Q4_K"); break;
        case E_DTYPE_LOWER: st_set_dtype(&f, NORM_A, "f32"); break;
        case E_DTYPE_I32: st_set_dtype(&f, GATE_A, "I32"); break;
        case E_DTYPE_U8: st_set_dtype(&f, GATE_A, "U8"); st_set_shape(&f, GATE_A, 2, 128LL, 256LL); break;
        case E_DTYPE_F64: st_set_dtype(&f, GATE_A, "F64"); st_set_shape(&f, GATE_A, 2, 64LL, 64LL); break;
        case E_DTYPE_BOOL: st_set_dtype(&f, NORM_A, "BOOL"); st_set_shape(&f, NORM_A, 1, 256LL); break;
        case E_SHAPE_T: st_set_shape(&f, GATE_A, 2, 64LL, 128LL); break;
        case E_SHAPE_ND: st_set_shape(&f, NORM_A, 2, 8LL, 8LL); break;
        case E_SHAPE_VEC: st_set_shape(&f, GATE_A, 1, 128LL * 64); break;
        case E_MISSING: json_object_del(f.hdr, UP5_A); break;
        case E_MISSING_EMBED: json_object_del(f.hdr, EMBED_A); break;
        case E_MISSING_NORM: json_object_del(f.hdr, NORM_A); break;
        case E_MTP_NO_FC: json_object_del(f.hdr, "mtp.fc.weight"); break;
        case E_MTP_NO_NORM: json_object_del(f.hdr, "mtp.norm.weight"); break;
        case E_MTP_SHAPE: st_set_shape(&f, "mtp.fc.weight", 2, 128LL, 64LL); break;
        case E_MISALIGNED: skew = 1; break;
        }
        st_save(p, &f, skew);
        st_free(&f);
        bool cli = c == E_OVERLAP_SAME || c == E_DTYPE_I32 || c == E_SHAPE_T || c == E_MISSING || c == E_MTP_NO_FC;
        expect_fail_ex(info[c].what, dir, A_FILE, info[c].need, cli);
    }
    /* Controls: a rewritten header, and a model without any mtp.* tensor, still load. */
    char dir[256], p[512];
    new_case(dir, sizeof dir, "tiny-a");
    path_in(p, sizeof p, dir, A_FILE);
    stfile f = st_load(p);
    st_save(p, &f, 0);
    st_free(&f);
    expect_ok("control: header rewritten", dir);
    new_case(dir, sizeof dir, "tiny-a");
    path_in(p, sizeof p, dir, A_FILE);
    f = st_load(p);
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(f.hdr, tmp, k, v) if (!strncmp(k, "mtp.", 4)) json_object_del(f.hdr, k);
    st_save(p, &f, 0);
    st_free(&f);
    expect_ok("control: MTP head stripped", dir);
}

/* ---- cases: shards (tiny-b) -------------------------------------------- */

static void cases_shards(void) {
    char dir[256], p[512];
    /* duplicate tensor across shards: shard 1 gets a copy of shard 2's mtp.fc.weight */
    new_case(dir, sizeof dir, "tiny-b");
    {
        char p2[512];
        path_in(p, sizeof p, dir, B_SHARD1);
        path_in(p2, sizeof p2, dir, B_SHARD2);
        stfile a = st_load(p), b = st_load(p2);
        json_t *e = json_deep_copy(st_entry(&b, "mtp.fc.weight"));
        long long bb = st_off(&b, "mtp.fc.weight", 0), be = st_off(&b, "mtp.fc.weight", 1);
        a.data = realloc(a.data, a.n + (size_t)(be - bb));
        memcpy(a.data + a.n, b.data + bb, (size_t)(be - bb));
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)a.n, (json_int_t)(a.n + (size_t)(be - bb))));
        a.n += (size_t)(be - bb);
        json_object_set_new(a.hdr, "mtp.fc.weight", e);
        st_save(p, &a, 0);
        st_free(&a);
        st_free(&b);
    }
    expect_fail_ex("shards: duplicate tensor", dir, "mtp.fc.weight", "appears twice", true);

    new_case(dir, sizeof dir, "tiny-b");
    index_map_set(dir, "mtp.fc.weight", json_string("model-00003-of-00002.safetensors"));
    expect_fail_ex("index: missing shard file", dir, "model-00003-of-00002.safetensors", "cannot open", true);

    new_case(dir, sizeof dir, "tiny-b");
    path_in(p, sizeof p, dir, B_SHARD2);
    unlink(p);
    expect_fail("shard file deleted", dir, B_SHARD2, "cannot open");

    new_case(dir, sizeof dir, "tiny-b");
    index_map_set(dir, "lm_head.weight", json_string(B_SHARD2));
    expect_fail("index: tensor in the other shard", dir, "lm_head.weight", B_SHARD2);

    new_case(dir, sizeof dir, "tiny-b");
    index_map_set(dir, "model.language_model.extra.weight", json_string(B_SHARD1));
    expect_fail("index: tensor in no shard", dir, "model.language_model.extra.weight", B_SHARD1);

    static const char *const bad_names[] = {"../f32/" B_SHARD1, "..", "", "/etc/passwd", "sub/" B_SHARD1};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        new_case(dir, sizeof dir, "tiny-b");
        index_map_set(dir, "lm_head.weight", json_string(bad_names[i]));
        char what[96];
        snprintf(what, sizeof what, "index: shard name \"%s\"", bad_names[i]);
        expect_fail_ex(what, dir, B_INDEX, "lm_head.weight", i == 0);
    }
    new_case(dir, sizeof dir, "tiny-b");
    index_map_set(dir, "lm_head.weight", json_integer(1));
    expect_fail("index: shard name not a string", dir, B_INDEX, "lm_head.weight");

    new_case(dir, sizeof dir, "tiny-b");
    text_write(dir, B_INDEX, "{\"weight_map\": {\"lm_head.weight\": ");
    expect_fail("index: garbage JSON", dir, B_INDEX, NULL);

    new_case(dir, sizeof dir, "tiny-b");
    text_write(dir, B_INDEX, "{\"metadata\": {}, \"weight_map\": [1, 2]}");
    expect_fail("index: weight_map not an object", dir, B_INDEX, "weight_map");

    new_case(dir, sizeof dir, "tiny-b");
    text_write(dir, B_INDEX, "[]");
    expect_fail("index: JSON array", dir, B_INDEX, "weight_map");

    new_case(dir, sizeof dir, "tiny-b");
    text_write(dir, B_INDEX, "{\"weight_map\": {}}");
    expect_fail("index: empty weight_map", dir, B_INDEX, "missing tensor");

    new_case(dir, sizeof dir, "tiny-b");
    path_in(p, sizeof p, dir, B_SHARD1);
    {
        stfile a = st_load(p);
        json_object_del(a.hdr, "lm_head.weight");
        st_save(p, &a, 0);
        st_free(&a);
    }
    index_map_set(dir, "lm_head.weight", NULL);
    expect_fail("shards: missing untied lm_head", dir, B_INDEX, "lm_head.weight");

    new_case(dir, sizeof dir, "tiny-b");
    path_in(p, sizeof p, dir, B_SHARD2);
    file_truncate(p, file_size(p) - 100);
    expect_fail("shards: shard 2 truncated", dir, B_SHARD2, "data_offsets");

    new_case(dir, sizeof dir, "tiny-b");
    path_in(p, sizeof p, dir, B_SHARD2);
    {
        stfile b = st_load(p);
        st_set_dtype(&b, "mtp.fc.weight", "I32");
        st_save(p, &b, 0);
        st_free(&b);
    }
    expect_fail("shards: I32 mtp.fc.weight", dir, B_SHARD2, "mtp.fc.weight");
}

/* ---- cases: config.json ------------------------------------------------- */

static void cases_config(void) {
    char dir[256];
    static const struct { const char *what; const char *text; const char *need; } raw[] = {
        {"config: not JSON", "{\"model_type\": \"qwen3_5_text\", hidden_size: 64", "invalid JSON"},
        {"config: empty file", "", "invalid JSON"},
        {"config: binary", "\x01\x02\xff\xfe\x00garbage", "invalid JSON"},
        {"config: JSON array", "[1, 2, 3]", "qwen3_5, qwen3_5_text"},
        {"config: JSON string", "\"qwen3_5\"", "invalid JSON"},
        {"config: empty object", "{}", "qwen3_5, qwen3_5_text"},
        {"config: model_type number", "{\"model_type\": 35}", "qwen3_5, qwen3_5_text"},
        {"config: unknown model_type", "{\"model_type\": \"llama\", \"hidden_size\": 64}", "qwen3_5, qwen3_5_text"},
        {"config: qwen3_5 without text_config", "{\"model_type\": \"qwen3_5\"}", "text_config"},
        {"config: text_config array", "{\"model_type\": \"qwen3_5\", \"text_config\": []}", "text_config"},
        {"config: text-only, no fields", "{\"model_type\": \"qwen3_5_text\"}", "hidden_size"},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        new_case(dir, sizeof dir, "tiny-a");
        text_write(dir, "config.json", raw[i].text);
        expect_fail_ex(raw[i].what, dir, "config.json", raw[i].need, i == 0 || i == 3 || i == 7);
    }
    /* unknown model_type names the type too */
    new_case(dir, sizeof dir, "tiny-b");
    {
        json_t *root = json_read(dir, "config.json");
        json_object_set_new(root, "model_type", json_string("qwen3_moe"));
        json_write(dir, "config.json", root);
    }
    expect_fail("config: model_type qwen3_moe", dir, "qwen3_moe", "supported: qwen3_5, qwen3_5_text");

    new_case(dir, sizeof dir, "tiny-a");
    {
        char p[512];
        path_in(p, sizeof p, dir, "config.json");
        unlink(p);
    }
    expect_fail_ex("config: missing", dir, "config.json", NULL, true);

    new_case(dir, sizeof dir, "tiny-a");
    {
        char p[512];
        path_in(p, sizeof p, dir, "config.json");
        unlink(p);
        mkdir(p, 0700);
    }
    expect_fail("config: a directory", dir, "config.json", NULL);

    /* head_dim absent and hidden_size / num_attention_heads == 0 */
    new_case(dir, sizeof dir, "tiny-a");
    cfg_set(dir, "head_dim", NULL);
    cfg_set(dir, "num_attention_heads", json_integer(128));
    cfg_set(dir, "num_key_value_heads", json_integer(128));
    expect_fail("config: derived head_dim 0", dir, "config.json", "head_dim");

    /* Field edits, on tiny-a (flat) and tiny-b (text_config). */
    struct { const char *what; const char *key; const char *json; const char *need; } edits[] = {
        {"hidden_size missing", "hidden_size", NULL, "hidden_size"},
        {"hidden_size negative", "hidden_size", "-64", "hidden_size"},
        {"hidden_size zero", "hidden_size", "0", "hidden_size"},
        {"hidden_size 1e12", "hidden_size", "1000000000000", "hidden_size"},
        {"hidden_size 2^63-1", "hidden_size", "9223372036854775807", "hidden_size"},
        {"hidden_size real", "hidden_size", "64.5", "hidden_size"},
        {"hidden_size string", "hidden_size", "\"64\"", "hidden_size"},
        {"hidden_size large (mismatch)", "hidden_size", "65536", "embed_tokens"},
        {"vocab_size 2^22 (mismatch)", "vocab_size", "4194304", "embed_tokens"},
        {"vocab_size huge", "vocab_size", "4294967296", "vocab_size"},
        {"layers zero", "num_hidden_layers", "0", "num_hidden_layers"},
        {"layers 100000", "num_hidden_layers", "100000", "num_hidden_layers"},
        {"intermediate_size negative", "intermediate_size", "-1", "intermediate_size"},
        {"heads not dividing", "num_key_value_heads", "3", "num_key_value_heads"},
        {"kv heads zero", "num_key_value_heads", "0", "num_key_value_heads"},
        {"linear heads not dividing", "linear_num_value_heads", "3", "linear_num_key_heads"},
        {"linear key heads missing", "linear_num_key_heads", NULL, "linear_num_key_heads"},
        {"head_dim zero", "head_dim", "0", "head_dim"},
        {"head_dim huge", "head_dim", "100000", "head_dim"},
        {"layer_types too short", "layer_types", "[\"full_attention\"]", "layer_types"},
        {"layer_types unknown", "layer_types",
         "[\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\", \"mamba\", \"full_attention\", "
         "\"full_attention\", \"full_attention\"]", "layer_types"},
        {"layer_types not array", "layer_types", "{}", "layer_types"},
        {"eos outside vocab", "eos_token_id", "100000", "eos_token_id"},
        {"eos negative", "eos_token_id", "[-5]", "eos_token_id"},
        {"eos 2^32+5", "eos_token_id", "[4294967301]", "eos_token_id"},
        {"rms_norm_eps negative", "rms_norm_eps", "-1.0", "rms_norm_eps"},
        {"rope_theta string", "rope_theta", "\"big\"", "rope_theta"},
        {"rope_type yarn", "rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 10000}", "yarn"},
        {"odd rotary dims", "rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.11}", "rotary"},
        {"mtp layers 100", "mtp_num_hidden_layers", "100", "mtp_num_hidden_layers"},
        {"conv kernel zero", "linear_conv_kernel_dim", "0", "linear_conv_kernel_dim"},
        {"conv kernel mismatch", "linear_conv_kernel_dim", "5", "conv1d"},
        {"untied without lm_head", "tie_word_embeddings", "false", "lm_head.weight"},
        {"no output gate (mismatch)", "attn_output_gate", "false", "q_proj"},
    };
    for (int m = 0; m < 2; m++)
        for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
            if (m == 1 && !strcmp(edits[i].key, "tie_word_embeddings")) continue; /* tiny-b is untied */
            new_case(dir, sizeof dir, m ? "tiny-b" : "tiny-a");
            json_t *v = NULL;
            if (edits[i].json) {
                json_error_t je;
                v = json_loads(edits[i].json, JSON_DECODE_ANY, &je);
                if (!v) die("%s: %s", edits[i].json, je.text);
            }
            cfg_set(dir, edits[i].key, v);
            char what[96];
            snprintf(what, sizeof what, "config %s: %s", m ? "b" : "a", edits[i].what);
            /* config errors name config.json; tensor mismatches name the weights */
            bool weights = !strcmp(edits[i].need, "embed_tokens") || !strcmp(edits[i].need, "conv1d") ||
                           !strcmp(edits[i].need, "lm_head.weight") || !strcmp(edits[i].need, "q_proj");
            expect_fail_ex(what, dir, weights ? (m ? "safetensors" : A_FILE) : "config.json", edits[i].need,
                           m == 0 && i == 13);
        }
}

int main(void) {
    g_verbose = getenv("TANDEM_VERBOSE") != NULL;
    snprintf(g_root, sizeof g_root, "/tmp/tandem-bad-input-XXXXXX");
    if (!mkdtemp(g_root)) die("mkdtemp: %s", strerror(errno));
    const char *b = getenv("BUILD");
    snprintf(g_tandem, sizeof g_tandem, "%s/tandem", b ? b : "build");
    if (access(g_tandem, X_OK) != 0) {
        printf("test_bad_input: %s not built, CLI checks skipped\n", g_tandem);
        g_tandem[0] = 0;
    }
    char dir[256];
    new_case(dir, sizeof dir, "tiny-a");
    expect_ok("control: tiny-a copy", dir);
    new_case(dir, sizeof dir, "tiny-b");
    expect_ok("control: tiny-b copy", dir);
    cases_truncated();
    cases_header();
    cases_entries();
    cases_shards();
    cases_config();
    rm_dir(g_root);
    printf("test_bad_input: %d bad-input cases through td_engine_load, %d CLI runs\n", g_cases, g_cli_cases);
    TEST_MAIN_END("test_bad_input");
}
