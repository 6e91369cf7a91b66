/* Tokenizer encode/decode on arbitrary bytes, with the real Qwen3 tokenizer
 * (tests/data/qwen3-tokenizer, 151k BPE) and the same vocabulary with the
 * Qwen3.5 pre-tokenizer regex (\p{M}), loaded once.
 *
 * Input: one mode byte, then the text. Checks:
 *  - every id is inside the vocabulary;
 *  - a long-lived tok_encoder (its word cache warm from earlier inputs)
 *    gives the same ids as td_tok_encode;
 *  - round trip: text that is valid UTF-8 and already NFC decodes back to
 *    itself (skip_special = false);
 *  - the streaming detokenizer's output equals td_tok_decode, both skip modes;
 *  - the text's bytes read as int32 ids (negative, huge, unknown) decode
 *    and stream without crashing. */
#include <jansson.h>
#include <utf8proc.h>
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

static tokenizer *g_tok[2];
static tok_encoder *g_enc[2];

static const char RE35[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char p[4096], c[4096];
    fuzz_path(p, sizeof p, "tests/data/qwen3-tokenizer/tokenizer.json");
    fuzz_path(c, sizeof c, "tests/data/qwen3-tokenizer/tokenizer_config.json");
    td_err err = {0};
    if (td_tok_load_files(p, c, &g_tok[0], &err)) { fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg); abort(); }
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    json_t *split = json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"), "pretokenizers"), 0);
    if (!j || !split) abort();
    json_object_set_new(json_object_get(split, "pattern"), "Regex", json_string(RE35));
    fuzz_file f;
    fuzz_file_init(&f, "tokenizer35.json");
    char *s = json_dumps(j, JSON_COMPACT);
    fuzz_file_set(&f, s, strlen(s));
    free(s);
    json_decref(j);
    if (td_tok_load_files(f.path, c, &g_tok[1], &err)) { fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg); abort(); }
    close(f.fd);
    for (int i = 0; i < 2; i++)
        if (td_tok_encoder_new(g_tok[i], &g_enc[i], &err)) abort();
    return 0;
}

static bool valid_nfc(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int bad = 0, l = td_tok_utf8_seq(s + i, n - i, &bad);
        if (l <= 0) return false;
        i += (size_t)l;
    }
    if (memchr(s, 0, n)) return false; /* utf8proc_NFC takes a C string */
    char *z = strndup((const char *)s, n);
    uint8_t *nfc = utf8proc_NFC((const uint8_t *)z);
    bool same = nfc && strlen((char *)nfc) == n && memcmp(nfc, s, n) == 0;
    free(nfc);
    free(z);
    return same;
}

static void check_stream(const tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    td_err err = {0};
    char *full = NULL;
    size_t fl = 0;
    int rc = td_tok_decode(t, ids, n, skip, &full, &fl, &err);
    FUZZ_ASSERT(rc == 0, "decode: %s", err.msg);
    tok_stream st;
    td_tok_stream_init(&st, t, skip);
    char *acc = malloc(fl + 16);
    size_t al = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t pl;
        FUZZ_ASSERT(td_tok_stream_push(&st, ids[i], &p, &pl, &err) == 0, "stream push: %s", err.msg);
        FUZZ_ASSERT(al + pl <= fl, "stream longer than decode");
        memcpy(acc + al, p, pl);
        al += pl;
    }
    const char *p;
    size_t pl;
    FUZZ_ASSERT(td_tok_stream_flush(&st, &p, &pl, &err) == 0, "flush");
    FUZZ_ASSERT(al + pl <= fl, "stream longer than decode");
    memcpy(acc + al, p, pl);
    al += pl;
    FUZZ_ASSERT(al == fl && memcmp(acc, full, fl) == 0, "stream != decode (skip %d)", skip);
    td_tok_stream_free(&st);
    free(acc);
    free(full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    int which = mode & 1;
    bool add = mode & 2;
    const tokenizer *t = g_tok[which];
    int nv = td_tok_vocab_size(t);
    td_err err = {0};
    int32_t *ids = NULL, *ids2 = NULL;
    size_t ni = 0, ni2 = 0;
    int rc = td_tok_encode(t, text, n, add, &ids, &ni, &err);
    FUZZ_ASSERT(rc == 0, "encode failed: %s", err.msg);
    for (size_t i = 0; i < ni; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < nv, "id %d", ids[i]);
    rc = td_tok_encoder_encode(g_enc[which], text, n, add, &ids2, &ni2, &err);
    FUZZ_ASSERT(rc == 0, "encoder failed: %s", err.msg);
    FUZZ_ASSERT(ni == ni2 && (ni == 0 || memcmp(ids, ids2, ni * sizeof *ids) == 0), "tok_encoder differs from td_tok_encode");
    char *out = NULL;
    size_t ol = 0;
    rc = td_tok_decode(t, ids, ni, false, &out, &ol, &err);
    FUZZ_ASSERT(rc == 0, "decode: %s", err.msg);
    if (!add && valid_nfc((const uint8_t *)text, n))
        FUZZ_ASSERT(ol == n && memcmp(out, text, n) == 0, "round trip of %zu bytes gives %zu", n, ol);
    free(out);
    check_stream(t, ids, ni, false);
    check_stream(t, ids, ni, true);
    /* the bytes as raw ids: anything from the wire's /detokenize or a model */
    size_t nr = n / 4;
    int32_t *raw = malloc((nr ? nr : 1) * sizeof *raw);
    memcpy(raw, text, nr * 4);
    if (mode & 4)
        for (size_t i = 0; i < nr; i++) raw[i] = (int32_t)((uint32_t)raw[i] % (uint32_t)(nv + 8)) - 4;
    check_stream(t, raw, nr, mode & 8);
    free(raw);
    free(ids);
    free(ids2);
    return 0;
}
