/* tokenizer.json (+ tokenizer_config.json) loading (src/tokenizer/tok_load.c,
 * td_tok_load_files) on arbitrary bytes. The input is tokenizer.json, or
 * tokenizer.json NUL tokenizer_config.json (JSON text has no raw NUL byte).
 * A tokenizer that loads is then used: a fixed text with special tokens,
 * Unicode and invalid UTF-8 is encoded, decoded and streamed, and every id
 * (up to 4096) is looked up, so bad tables show up as crashes here. */
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

static fuzz_file g_tok, g_cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_file_init(&g_tok, "tokenizer.json");
    fuzz_file_init(&g_cfg, "tokenizer_config.json");
    return 0;
}

static const char SAMPLE[] = "<|im_start|>user\nHello, wörld! 你好 \xf0\x9f\x98\x80 e\xcc\x81 \xff\xc3 12345  \t\r\n"
                             "<think>x</think><tool_call>{\"a\": 1}</tool_call><|im_end|><|endoftext|>";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tl = nul ? (size_t)(nul - data) : size;
    fuzz_file_set(&g_tok, data, tl);
    if (nul) fuzz_file_set(&g_cfg, nul + 1, size - tl - 1);
    tokenizer *t = NULL;
    td_err err = {0};
    int rc = td_tok_load_files(g_tok.path, nul ? g_cfg.path : NULL, &t, &err);
    if (rc) {
        FUZZ_ASSERT(t == NULL && rc < 0 && err.msg[0], "rc %d", rc);
        return 0;
    }
    int nv = td_tok_vocab_size(t);
    FUZZ_ASSERT(nv >= 0, "vocab %d", nv);
    for (int32_t id = -1; id < nv && id < 4096; id++) {
        const char *s = td_tok_token_str(t, id);
        size_t bl = 0;
        const uint8_t *b = td_tok_id_bytes(t, id, &bl);
        (void)td_tok_is_special(t, id);
        if (s) FUZZ_ASSERT(td_tok_token_id(t, s) >= 0, "id of token %d's own string", id);
        if (b && bl) { volatile uint8_t x = b[bl - 1]; (void)x; }
    }
    (void)td_tok_token_id(t, "");
    (void)td_tok_bos_id(t), (void)td_tok_eos_id(t);
    const char *ct = td_tok_chat_template(t);
    if (ct) (void)strlen(ct);
    for (int add = 0; add < 2; add++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (td_tok_encode(t, SAMPLE, sizeof SAMPLE - 1, add, &ids, &n, &err) == 0) {
            for (size_t i = 0; i < n; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < nv, "id %d of %d", ids[i], nv);
            char *out = NULL;
            size_t ol = 0;
            if (td_tok_decode(t, ids, n, add, &out, &ol, &err) == 0) {
                FUZZ_ASSERT(out && strlen(out) <= ol, "decode length");
                tok_stream st;
                td_tok_stream_init(&st, t, add);
                for (size_t i = 0; i < n; i++) {
                    const char *p;
                    size_t pl;
                    if (td_tok_stream_push(&st, ids[i], &p, &pl, &err)) break;
                }
                const char *p;
                size_t pl;
                (void)td_tok_stream_flush(&st, &p, &pl, &err);
                td_tok_stream_free(&st);
            }
            free(out);
        }
        free(ids);
    }
    td_tok_free(t);
    return 0;
}
