/* The structured-output grammar compilers and matcher (src/grammar) on
 * arbitrary input: the first byte picks the compiler (JSON schema, regex,
 * choice list split at '\n', json_object), the rest is its text — what a
 * request's response_format / structured_outputs carries. An accepted grammar
 * is walked for up to 48 tokens over a small byte vocabulary, choosing among
 * the allowed tokens with the input's bytes; every chosen token must be
 * accepted, masks after speculative tokens must match the masks after
 * committing them, and nothing may crash, leak or hang. */
#include "fuzz_util.h"
#include "grammar/grammar.h"

#define NV 300 /* 256 single bytes, a few multi-byte tokens, a special and an end id */
static td_grammar_vocab *g_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static uint8_t single[256];
    static const char *multi[] = {"{\"", "\":", "\",\"", "true", "false", "null", "\"}", "[1", ", ", "\xc3\xa9", "\xe2\x82", "\xac", "abc", "  "};
    const uint8_t *bytes[NV] = {0};
    size_t lens[NV] = {0};
    for (int i = 0; i < 256; i++) single[i] = (uint8_t)i, bytes[i] = &single[i], lens[i] = 1;
    for (int i = 0; i < (int)(sizeof multi / sizeof *multi); i++) bytes[256 + i] = (const uint8_t *)multi[i], lens[256 + i] = strlen(multi[i]);
    int32_t end = NV - 1; /* NV - 2: a special token (NULL bytes) */
    td_err err = {0};
    if (td_grammar_vocab_new(NV, bytes, lens, &end, 1, &g_vocab, &err)) { fprintf(stderr, "vocab: %s\n", err.msg); abort(); }
    return 0;
}

static int allowed(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1u; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    td_grammar_opts o = td_grammar_opts_default();
    o.max_ws = data[0] / 4 % 3;
    o.strict = data[0] & 0x80;
    o.cache_bytes = 1 << 20;
    td_grammar *g = NULL;
    td_err err = {0};
    int rc;
    if (mode == 0) rc = td_grammar_json_schema(text, len, &o, &g, &err);
    else if (mode == 1) rc = td_grammar_regex(text, len, &o, &g, &err);
    else if (mode == 2) {
        const char *ch[16];
        size_t ln[16];
        int n = 0;
        size_t start = 0;
        for (size_t i = 0; i <= len && n < 16; i++)
            if (i == len || text[i] == '\n') { ch[n] = text + start; ln[n] = i - start; n++; start = i + 1; }
        rc = td_grammar_choice(ch, ln, n, &o, &g, &err);
    } else rc = td_grammar_json_object(&o, &g, &err);
    if (rc) {
        FUZZ_ASSERT(rc < 0 && err.msg[0] && !g, "rc %d without a message", rc);
        return 0;
    }
    td_matcher *m = NULL;
    rc = td_matcher_new(g, g_vocab, &m, &err);
    FUZZ_ASSERT(rc == 0 || rc == TD_ERR_NOMEM, "matcher: %s", err.msg);
    if (rc) { td_grammar_free(g); return 0; }
    const size_t W = (NV + 31) / 32;
    uint32_t expect[(NV + 31) / 32];
    size_t pick = 0;
    int32_t spec[2];
    for (int step = 0; step < 48 && !td_matcher_finished(m); step++) {
        const uint32_t *mk = td_matcher_mask(m, NULL, 0);
        FUZZ_ASSERT(mk, "NULL mask with no speculative tokens");
        int cand[NV], nc = 0;
        for (int t = 0; t < NV; t++) if (allowed(mk, t)) cand[nc++] = t;
        FUZZ_ASSERT(!allowed(mk, NV - 2), "a special token is allowed");
        if (!nc) break; /* dead end: all-zero mask */
        int32_t t = cand[(data[pick++ % size] * 131u + (unsigned)step) % (unsigned)nc];
        /* the mask after t, speculatively, must equal the mask after committing t */
        spec[0] = t;
        const uint32_t *sm = td_matcher_mask(m, spec, 1);
        FUZZ_ASSERT(sm, "NULL mask after an allowed token %d", t);
        memcpy(expect, sm, W * sizeof *expect);
        FUZZ_ASSERT(td_matcher_accept(m, t) == 0, "allowed token %d refused", t);
        const uint32_t *cm = td_matcher_mask(m, NULL, 0);
        FUZZ_ASSERT(cm && !memcmp(cm, expect, W * sizeof *expect), "speculative and committed masks differ after %d", t);
    }
    td_matcher_free(m);
    td_grammar_free(g);
    return 0;
}
