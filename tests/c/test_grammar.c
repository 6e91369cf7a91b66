/* Grammar engine (src/grammar): compilers accept/reject the right texts fed
 * byte by byte and token by token; masks equal a brute-force reference (clone
 * the state, feed each token) on random walks, speculative masks included;
 * the official JSON-Schema-Test-Suite subset; hostile inputs fail fast and
 * cleanly; mask timings on the qwen3 vocabulary (printed, not asserted). */
#include <jansson.h>
#include <dirent.h>
#include <pthread.h>
#include <time.h>
#include "check.h"
#include "grammar/grammar.h"
#include "util/err.h"
#include "tokenizer/tokenizer.h"

extern int td_grammar_test_plain_dfs; /* match.c: DFS without interned states */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- fake vocabulary ---- */
static const char *const multi[] = {"{\"", "\":", "\":\"", "\",\"", "\"}", "true", "false", "null", "ab", "abc", "ab",
                                    "12", "3.", ".5", "e+", "\xc3\xa9", "\xa9z", "\xe2\x82", "\x82\xac", "\xe2\x82\xac",
                                    "  ", " \"", "\n  ", "},", "]}", "[{", "[1", ",\"", "aaaaaaaa", "\\n", "\\u00", "name",
                                    "\"name\"", "x\"", "}", "foo", "bar", "-1", "00", "\"\":"};
#define N_MULTI (int)(sizeof multi / sizeof *multi)
static int V_SPECIAL, V_EOS, V_N;
static td_grammar_vocab *fake;
static const uint8_t **fb;
static size_t *fl;

static void make_fake(void) {
    V_N = 256 + N_MULTI + 2;
    V_SPECIAL = 256 + N_MULTI, V_EOS = V_SPECIAL + 1;
    fb = calloc((size_t)V_N, sizeof *fb), fl = calloc((size_t)V_N, sizeof *fl);
    static uint8_t bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, fb[i] = bytes + i, fl[i] = 1;
    for (int i = 0; i < N_MULTI; i++) fb[256 + i] = (const uint8_t *)multi[i], fl[256 + i] = strlen(multi[i]);
    int32_t end = V_EOS;
    td_err err;
    CHECK(td_grammar_vocab_new(V_N, fb, fl, &end, 1, &fake, &err) == 0, "%s", err.msg);
}

/* Greedy longest-match tokenization over the fake vocab (any split of a valid
 * text must be accepted token by token). */
static int tokenize(const char *s, size_t n, int32_t *out) {
    int k = 0;
    for (size_t i = 0; i < n;) {
        int best = (unsigned char)s[i];
        size_t bl = 1;
        for (int t = 256; t < 256 + N_MULTI; t++)
            if (fl[t] > bl && fl[t] <= n - i && !memcmp(s + i, fb[t], fl[t])) best = t, bl = fl[t];
        out[k++] = best;
        i += bl;
    }
    return k;
}

/* Whether the grammar matches s exactly: byte by byte, then token by token
 * (both must agree, and the end id must be accepted iff complete). */
static int matches(td_grammar *g, const char *s, size_t n) {
    td_matcher *m;
    td_err err;
    if (td_matcher_new(g, fake, &m, &err)) return -1;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) ok = td_matcher_accept_bytes(m, (const uint8_t *)s + i, 1) == 0;
    bool byte_res = ok && td_matcher_can_end(m);
    td_matcher_reset(m);
    int32_t *toks = malloc((n + 1) * sizeof *toks);
    int nt = tokenize(s, n, toks);
    ok = true;
    for (int i = 0; i < nt && ok; i++) ok = td_matcher_accept(m, toks[i]) == 0;
    bool tok_prefix = ok;
    bool tok_res = ok && td_matcher_accept(m, V_EOS) == 0;
    if (tok_res) CHECK(td_matcher_finished(m), "finished after EOS");
    free(toks);
    td_matcher_free(m);
    if (byte_res != tok_res) {
        CHECK(byte_res == tok_res, "bytes %d vs tokens %d (prefix ok %d) on '%.*s'", byte_res, tok_res, tok_prefix, (int)n, s);
    }
    return byte_res;
}
static int matchs(td_grammar *g, const char *s) { return matches(g, s, strlen(s)); }

/* Brute-force mask: for each token, clone the state and try it. */
static void brute_mask(td_matcher *m, uint32_t *mask, int words) {
    memset(mask, 0, (size_t)words * 4);
    td_err err;
    for (int t = 0; t < V_N; t++) {
        td_matcher *c;
        if (td_matcher_clone(m, &c, &err)) continue;
        if (td_matcher_accept(c, t) == 0) mask[t >> 5] |= 1u << (t & 31);
        td_matcher_free(c);
    }
}

static uint64_t rng = 88172645463325252ull;
static long brute_checked; /* masks compared with the brute force */
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}

/* Random walks: at each step mask == brute force, spec masks == masks after
 * committing, and the sampled token is accepted. */
static void walks(td_grammar *g, const char *name, int n_walks, int max_steps) {
    int words = (V_N + 31) / 32;
    uint32_t *bm = malloc((size_t)words * 4), *mk = malloc((size_t)words * 4);
    int bad = 0, steps = 0, empty = 0;
    td_err err;
    for (int w = 0; w < n_walks; w++) {
        td_matcher *m;
        if (td_matcher_new(g, fake, &m, &err)) break;
        int32_t hist[64];
        int nh = 0;
        for (int s = 0; s < max_steps && !td_matcher_finished(m); s++) {
            const uint32_t *mm = td_matcher_mask(m, NULL, 0);
            if (!mm) {
                bad++;
                break;
            }
            memcpy(mk, mm, (size_t)words * 4);
            brute_mask(m, bm, words);
            if (memcmp(mk, bm, (size_t)words * 4)) bad++;
            steps++, brute_checked++;
            int allowed[512], na = 0;
            for (int t = 0; t < V_N; t++)
                if (mk[t >> 5] >> (t & 31) & 1) allowed[na++] = t;
            if (!na) {
                empty++;
                break;
            }
            /* prefer not ending early */
            int t = allowed[rnd() % na];
            if (t == V_EOS && na > 1 && s < max_steps / 2) t = allowed[rnd() % na];
            CHECK(td_matcher_accept(m, t) == 0, "%s: allowed token %d rejected", name, t);
            if (nh < 64) hist[nh++] = t;
            /* spec masks over the last up-to-3 tokens, from a clone 3 steps back */
            if (nh >= 3 && w % 2 == 0) {
                td_matcher *b;
                if (td_matcher_new(g, fake, &b, &err) == 0) {
                    for (int i = 0; i < nh - 3; i++) td_matcher_accept(b, hist[i]);
                    const uint32_t *sm = td_matcher_mask(b, hist + nh - 3, 3);
                    const uint32_t *cm = td_matcher_finished(m) ? NULL : td_matcher_mask(m, NULL, 0);
                    if (cm) CHECK(sm && !memcmp(sm, cm, (size_t)words * 4), "%s: spec mask differs", name);
                    td_matcher_free(b);
                }
            }
        }
        td_matcher_free(m);
    }
    CHECK(bad == 0, "%s: %d of %d masks differ from brute force", name, bad, steps);
    CHECK(empty == 0, "%s: %d empty masks", name, empty);
    free(bm), free(mk);
}

static td_grammar *schema(const char *s, const td_grammar_opts *o) {
    td_grammar *g = NULL;
    td_err err = {0};
    int rc = td_grammar_json_schema(s, strlen(s), o, &g, &err);
    CHECK(rc == 0, "schema %s: %s", s, err.msg);
    return g;
}

static void test_choice(void) {
    const char *ch[] = {"yes", "no", "maybe", "y", ""};
    size_t ln[] = {3, 2, 5, 1, 0};
    td_grammar *g;
    td_err err;
    CHECK(td_grammar_choice(ch, ln, 5, NULL, &g, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 5; i++) CHECK(matchs(g, ch[i]) == 1, "choice %s", ch[i]);
    CHECK(matchs(g, "ye") == 0 && matchs(g, "yess") == 0 && matchs(g, "n") == 0, "choice rejects");
    walks(g, "choice", 20, 10);
    td_grammar_free(g);
}

static void test_regex(void) {
    struct { const char *re, *yes[4], *no[4]; } cs[] = {
        {"[a-c]+x?", {"a", "abcx", "cc", NULL}, {"", "x", "ad", NULL}},
        {"\\d{3}-\\d{2,4}", {"123-45", "000-1234", NULL}, {"12-34", "123-4", "123-12345", NULL}},
        {"^(?:foo|bar)*$", {"", "foo", "barfoo", NULL}, {"fo", "foob", NULL}},
        {"(a|ab)(c|bcd)", {"abcd", "ac", "abc", NULL}, {"ab", "abcdd", NULL}},
        {"[^a-z]é.", {"Aéz", "1é€", NULL}, {"aéz", "Aé", "Aé\n", NULL}},
        {"\\w+@\\w+\\.com", {"a_1@b.com", NULL}, {"a@b.org", "@b.com", NULL}},
        {"(a*)*b", {"b", "aaab", NULL}, {"a", "", NULL}},
        {"\\u00e9\\x41[\\s]\\.", {"éA .", "éA\t.", NULL}, {"éA a", NULL}},
        {"a{2}b{0,2}c{1,}", {"aac", "aabbcc", NULL}, {"ac", "aabbbc", "aab", NULL}},
        {"(x|y|)z?", {"", "x", "yz", "z"}, {"xy", NULL}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        td_grammar *g;
        td_err err;
        int rc = td_grammar_regex(cs[i].re, strlen(cs[i].re), NULL, &g, &err);
        CHECK(rc == 0, "regex %s: %s", cs[i].re, err.msg);
        if (rc) continue;
        for (int k = 0; k < 4 && cs[i].yes[k]; k++) CHECK(matchs(g, cs[i].yes[k]) == 1, "/%s/ should match '%s'", cs[i].re, cs[i].yes[k]);
        for (int k = 0; k < 4 && cs[i].no[k]; k++) CHECK(matchs(g, cs[i].no[k]) == 0, "/%s/ should not match '%s'", cs[i].re, cs[i].no[k]);
        walks(g, cs[i].re, 6, 12);
        td_grammar_free(g);
    }
    const char *unsup[] = {"(?=a)b", "(a)\\1", "a\\bb", "a++", "a^b", "[[:alpha:]]", "(?i)a", "\\p{L}"};
    for (size_t i = 0; i < sizeof unsup / sizeof *unsup; i++) {
        td_grammar *g;
        td_err err = {0};
        CHECK(td_grammar_regex(unsup[i], strlen(unsup[i]), NULL, &g, &err) == TD_ERR_UNSUPPORTED, "/%s/ unsupported: %s", unsup[i], err.msg);
    }
    const char *bad[] = {"(a", "a)", "[a-", "*a", "a{3,2}", "\\", "[z-a]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        td_grammar *g;
        td_err err = {0};
        CHECK(td_grammar_regex(bad[i], strlen(bad[i]), NULL, &g, &err) == TD_ERR_ARG, "/%s/ bad: %s", bad[i], err.msg);
    }
    /* a needed byte that no token has: the mask is all-zero, documented */
    {
        const uint8_t *tb[2] = {(const uint8_t *)"a", NULL};
        size_t tl[2] = {1, 0};
        int32_t end = 1;
        td_grammar_vocab *v;
        td_grammar *g;
        td_matcher *m;
        td_err err;
        CHECK(td_grammar_vocab_new(2, tb, tl, &end, 1, &v, &err) == 0, "%s", err.msg);
        CHECK(td_grammar_regex("ab", 2, NULL, &g, &err) == 0, "%s", err.msg);
        CHECK(td_matcher_new(g, v, &m, &err) == 0, "%s", err.msg);
        CHECK(td_matcher_accept(m, 0) == 0, "a");
        const uint32_t *mk = td_matcher_mask(m, NULL, 0);
        CHECK(mk && mk[0] == 0, "all-zero mask when no token continues");
        CHECK(td_matcher_accept(m, 1) != 0 && !td_matcher_can_end(m), "cannot end");
        td_matcher_free(m), td_grammar_free(g), td_grammar_vocab_free(v);
    }
}

static void test_json(void) {
    td_grammar *g;
    td_err err;
    td_grammar_opts o = td_grammar_opts_default();
    CHECK(td_grammar_json_object(&o, &g, &err) == 0, "%s", err.msg);
    const char *yes[] = {"{}", "{\"a\":1}", "{\"a\": [1, 2.5e+3, \"x\\n\\u00e9\"], \"b\": {\"c\": null}}", "{ }",
                         "{\"é€\":true,\"\":false}", "{\"a\":-0.5}", "{\"a\":1E3}"};
    const char *no[] = {"", "[]", "{\"a\"}", "{\"a\":01}", "{\"a\":1,}", "{'a':1}", "{\"a\":\"\x01\"}", "{\"a\":1}x",
                        "{\"a\":  1}", "{\"a\":\"\\x\"}", "{\"a\":1.}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xed\xa0\x80\"}"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) CHECK(matchs(g, yes[i]) == 1, "json_object accepts %s", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) CHECK(matchs(g, no[i]) == 0, "json_object rejects %s", no[i]);
    /* nesting bound 16 */
    char deep[128] = {0};
    for (int i = 0; i < 16; i++) strcat(deep, "{\"\":");
    CHECK(matches(g, deep, strlen(deep)) == 0, "prefix");
    {
        td_matcher *m;
        td_matcher_new(g, fake, &m, &err);
        CHECK(td_matcher_accept_bytes(m, (const uint8_t *)deep, strlen(deep)) == 0, "depth 16 prefix");
        CHECK(td_matcher_accept_bytes(m, (const uint8_t *)"{", 1) != 0, "depth 17 refused");
        CHECK(td_matcher_accept_bytes(m, (const uint8_t *)"1}}}}}}}}}}}}}}}}", 17) == 0, "closing");
        CHECK(td_matcher_must_end(m) && td_matcher_can_end(m), "must end");
        const uint32_t *mk = td_matcher_mask(m, NULL, 0);
        int n = 0;
        for (int t = 0; t < V_N; t++) n += mk[t >> 5] >> (t & 31) & 1;
        CHECK(n == 1 && (mk[V_EOS >> 5] >> (V_EOS & 31) & 1), "only EOS at the end (%d)", n);
        CHECK(td_matcher_accept(m, V_SPECIAL) != 0, "special never allowed");
        td_matcher_free(m);
    }
    walks(g, "json_object", 30, 40);
    td_grammar_free(g);
    o.max_ws = 0;
    CHECK(td_grammar_json_object(&o, &g, &err) == 0, "%s", err.msg);
    CHECK(matchs(g, "{\"a\": 1}") == 0 && matchs(g, "{\"a\":1}") == 1, "max_ws 0");
    td_grammar_free(g);

    /* a schema like a tool call */
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"foo\",\"bar\"]},"
                    "\"n\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3},"
                    "\"minItems\":1,\"maxItems\":2},\"opt\":{\"anyOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}},"
                    "\"required\":[\"name\",\"n\",\"tags\"],\"additionalProperties\":false}";
    g = schema(s, NULL);
    if (g) {
        const char *sy[] = {"{\"name\":\"foo\",\"n\":-12,\"tags\":[\"ab\"]}", "{\"name\": \"bar\", \"n\": 0, \"tags\": [\"\", \"xyz\"], \"opt\": null}",
                            "{\"name\":\"foo\",\"n\":1,\"tags\":[\"a\"],\"opt\":true}"};
        const char *sn[] = {"{\"name\":\"baz\",\"n\":1,\"tags\":[\"a\"]}", "{\"name\":\"foo\",\"n\":1.5,\"tags\":[\"a\"]}",
                            "{\"name\":\"foo\",\"n\":1,\"tags\":[]}", "{\"name\":\"foo\",\"n\":1,\"tags\":[\"abcd\"]}",
                            "{\"name\":\"foo\",\"n\":1,\"tags\":[\"a\",\"b\",\"c\"]}", "{\"n\":1,\"name\":\"foo\",\"tags\":[\"a\"]}",
                            "{\"name\":\"foo\",\"n\":1,\"tags\":[\"a\"],\"x\":1}", "{\"name\":\"foo\",\"n\":123456789012345678901,\"tags\":[\"a\"]}"};
        for (size_t i = 0; i < sizeof sy / sizeof *sy; i++) CHECK(matchs(g, sy[i]) == 1, "accepts %s", sy[i]);
        for (size_t i = 0; i < sizeof sn / sizeof *sn; i++) CHECK(matchs(g, sn[i]) == 0, "rejects %s", sn[i]);
        walks(g, "tool schema", 30, 40);
        td_grammar_free(g);
    }
    /* recursion through $defs, pattern, extra keys that must differ from declared names */
    g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d?$\"},"
               "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}", NULL);
    if (g) {
        CHECK(matchs(g, "{\"v\":\"ab1\",\"kids\":[{\"v\":\"c\"},{\"v\":\"d\",\"kids\":[]}]}") == 1, "tree");
        CHECK(matchs(g, "{\"v\":\"ab12\"}") == 0 && matchs(g, "{\"v\":\"\"}") == 0, "pattern");
        CHECK(matchs(g, "{\"v\":\"a\",\"x\":1}") == 1 && matchs(g, "{\"v\":\"a\",\"v\":\"b\"}") == 0 && matchs(g, "{\"v\":\"a\",\"kids\":[],\"kid\":0}") == 1,
              "extra keys other than declared ones");
        walks(g, "tree", 20, 40);
        td_grammar_free(g);
    }
    g = schema("{\"type\":\"string\",\"pattern\":\"a\\\"b\"}", NULL);
    if (g) {
        CHECK(matchs(g, "\"xa\\\"by\"") == 1 && matchs(g, "\"xa\"by\"") == 0 && matchs(g, "\"ab\"") == 0, "pattern with quote, unanchored");
        walks(g, "pattern", 10, 20);
        td_grammar_free(g);
    }
    /* recursion through $ref is bounded by the stack depth: deep input is refused, never a crash */
    g = schema("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", NULL);
    if (g) {
        td_matcher *m;
        td_matcher_new(g, fake, &m, &err);
        int depth = 0;
        while (depth < 10000 && td_matcher_accept(m, '[') == 0) depth++;
        printf("recursive $ref array: nesting accepted up to %d\n", depth);
        CHECK(depth >= 40 && depth < 10000, "recursion bound %d", depth);
        const uint32_t *mk = td_matcher_mask(m, NULL, 0);
        CHECK(mk && (mk[']' >> 5] >> (']' & 31) & 1) && !(mk['[' >> 5] >> ('[' & 31) & 1), "at the bound: ']' allowed, '[' not");
        for (int i = 0; i < depth; i++) CHECK(td_matcher_accept(m, ']') == 0, "close %d", i);
        CHECK(td_matcher_must_end(m), "must end");
        td_matcher_free(m);
        td_grammar_free(g);
    }
    /* spec masks: an end id, an invalid token */
    g = schema("{\"enum\":[\"ab\",\"abc\"]}", NULL);
    if (g) {
        td_matcher *m;
        td_matcher_new(g, fake, &m, &err);
        int32_t sp[3] = {'"', 256 + 8 /* "ab" */, '"'};
        const uint32_t *mk = td_matcher_mask(m, sp, 3);
        CHECK(mk && (mk[V_EOS >> 5] >> (V_EOS & 31) & 1), "EOS after \"ab\"");
        int32_t sp2[4] = {'"', 256 + 8, '"', V_EOS};
        mk = td_matcher_mask(m, sp2, 4);
        int nz = 0;
        for (int i = 0; mk && i < (V_N + 31) / 32; i++) nz += mk[i] != 0;
        CHECK(mk && nz == 0, "all-zero after an end id");
        int32_t sp3[2] = {'"', 'x'};
        CHECK(td_matcher_mask(m, sp3, 2) == NULL, "invalid spec: NULL");
        CHECK(td_matcher_accept(m, V_EOS) != 0, "cannot end at start");
        CHECK(td_matcher_accept_bytes(m, (const uint8_t *)"\"abc\"", 5) == 0 && td_matcher_must_end(m), "abc");
        CHECK(td_matcher_accept(m, V_EOS) == 0 && td_matcher_finished(m) && td_matcher_accept(m, 'a') != 0, "end");
        td_matcher_free(m);
        td_grammar_free(g);
    }
    /* strict: additionalProperties absent means false */
    {
        td_grammar_opts so = td_grammar_opts_default();
        so.strict = true;
        const char *sch = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}";
        td_grammar *gs = schema(sch, &so), *gl = schema(sch, NULL);
        if (gs && gl) {
            CHECK(matchs(gs, "{\"a\":1}") == 1 && matchs(gs, "{\"a\":1,\"b\":2}") == 0 && matchs(gs, "{}") == 1, "strict");
            CHECK(matchs(gl, "{\"a\":1,\"b\":2}") == 1 && matchs(gl, "{\"b\":2}") == 1 && matchs(gl, "{\"a\":1,\"a\":2}") == 0,
                  "non-strict: extra keys other than a");
            CHECK(matchs(gl, "{ \"a\" : 1 }") == 1 && matchs(gl, "{\"a\":  1}") == 0, "max_ws 1");
        }
        td_grammar_free(gs), td_grammar_free(gl);
    }
    /* integer ranges against the arithmetic */
    struct { const char *kw; long lo, hi; } rg[] = {
        {"\"minimum\":-123,\"maximum\":4567", -123, 4567}, {"\"minimum\":7", 7, 1L << 40},
        {"\"maximum\":-20", -(1L << 40), -20}, {"\"exclusiveMinimum\":-1,\"exclusiveMaximum\":10", 0, 9},
        {"\"minimum\":0,\"maximum\":0", 0, 0}, {"\"minimum\":100,\"maximum\":99", 1, 0},
        {"\"minimum\":1.5,\"maximum\":1000", 2, 1000}, {"\"minimum\":-999,\"maximum\":-100", -999, -100}};
    for (size_t i = 0; i < sizeof rg / sizeof *rg; i++) {
        char sch[200], num[32];
        snprintf(sch, sizeof sch, "{\"type\":\"integer\",%s}", rg[i].kw);
        g = schema(sch, NULL);
        if (!g) continue;
        int bad = 0;
        for (long v = -1100; v <= 5000; v++) {
            snprintf(num, sizeof num, "%ld", v);
            if (matchs(g, num) != (v >= rg[i].lo && v <= rg[i].hi)) bad++;
        }
        CHECK(matchs(g, "-0") == 0 && matchs(g, "007") == 0, "%s: no -0, no leading zeros", sch);
        if (rg[i].hi == 1L << 40) CHECK(matchs(g, "99999999999999999999") == 1 && matchs(g, "100000000000000000000") == 0, "20 digits");
        CHECK(bad == 0, "%s: %d values wrong", sch, bad);
        td_grammar_free(g);
    }
    /* unsupported and bad schemas */
    struct { const char *s; int rc; const char *msg; } bad[] = {
        {"{\"type\":\"string\",\"format\":\"date\"}", TD_ERR_UNSUPPORTED, "'format' at /"},
        {"{\"properties\":{\"when\":{\"format\":\"date\"}}}", TD_ERR_UNSUPPORTED, "'format' at /properties/when"},
        {"{\"type\":\"number\",\"maximum\":3}", TD_ERR_UNSUPPORTED, "maximum"},
        {"{\"type\":\"integer\",\"maximum\":1e19}", TD_ERR_UNSUPPORTED, "maximum"},
        {"{\"allOf\":[{},{}]}", TD_ERR_UNSUPPORTED, "allOf"},
        {"{\"type\":\"object\",\"anyOf\":[{}]}", TD_ERR_UNSUPPORTED, "anyOf"},
        {"{\"$ref\":\"http://x/y\"}", TD_ERR_UNSUPPORTED, "$ref"},
        {"{\"$ref\":\"#/$defs/none\"}", TD_ERR_ARG, "unresolvable"},
        {"{\"type\":\"strin\"}", TD_ERR_ARG, "type"},
        {"{\"type\":", TD_ERR_ARG, "invalid JSON"},
        {"{\"maxLength\":100000}", TD_ERR_LIMIT, "maxLength"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        td_err e = {0};
        int rc = td_grammar_json_schema(bad[i].s, strlen(bad[i].s), NULL, &g, &e);
        CHECK(rc == bad[i].rc && strstr(e.msg, bad[i].msg), "%s: rc %d '%s'", bad[i].s, rc, e.msg);
    }
}

/* The plain DFS (used when interned states outgrow their bounds) gives the
 * same masks; a fresh grammar so that nothing comes from the mask cache. */
static void test_plain_dfs(void) {
    td_grammar *g;
    td_err err;
    td_grammar_test_plain_dfs = 1;
    CHECK(td_grammar_json_object(NULL, &g, &err) == 0, "%s", err.msg);
    walks(g, "json_object plain dfs", 20, 40);
    td_grammar_free(g);
    CHECK(td_grammar_regex("(a|ab)*[^x]{2,5}\\d", 18, NULL, &g, &err) == 0, "%s", err.msg);
    walks(g, "regex plain dfs", 10, 12);
    td_grammar_free(g);
    td_grammar_test_plain_dfs = 0;
}

/* Matchers of one grammar on several threads share its mask cache: masks
 * equal those of a single-threaded run. */
typedef struct { td_grammar *g; uint32_t seed; int bad; } thr_arg;
static void *thr_walk(void *p) {
    thr_arg *a = p;
    td_err err;
    int words = (V_N + 31) / 32;
    uint32_t *ref = malloc((size_t)words * 4);
    for (int w = 0; w < 30; w++) {
        td_matcher *m, *solo;
        td_matcher_new(a->g, fake, &m, &err);
        for (int s = 0; s < 30 && !td_matcher_finished(m); s++) {
            const uint32_t *mk = td_matcher_mask(m, NULL, 0);
            if (!mk) { a->bad++; break; }
            /* reference: the brute force */
            td_matcher_clone(m, &solo, &err);
            memset(ref, 0, (size_t)words * 4);
            for (int t = 0; t < V_N; t++) {
                td_matcher *c;
                td_matcher_clone(solo, &c, &err);
                if (td_matcher_accept(c, t) == 0) ref[t >> 5] |= 1u << (t & 31);
                td_matcher_free(c);
            }
            td_matcher_free(solo);
            if (memcmp(ref, mk, (size_t)words * 4)) a->bad++;
            int allowed[512], na = 0;
            for (int t = 0; t < V_N; t++)
                if (mk[t >> 5] >> (t & 31) & 1) allowed[na++] = t;
            if (!na) break;
            a->seed = a->seed * 1103515245u + 12345u;
            td_matcher_accept(m, allowed[(a->seed >> 8) % (uint32_t)na]);
        }
        td_matcher_free(m);
    }
    free(ref);
    return NULL;
}

static void test_threads(void) {
    td_grammar *g;
    td_err err;
    td_grammar_opts o = td_grammar_opts_default();
    o.cache_bytes = 8 << 10; /* small: eviction happens while others read */
    CHECK(td_grammar_json_object(&o, &g, &err) == 0, "%s", err.msg);
    pthread_t th[4];
    thr_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thr_arg){g, 1234u + (uint32_t)i * 77u, 0};
        pthread_create(&th[i], NULL, thr_walk, &a[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL), bad += a[i].bad;
    size_t entries;
    uint64_t hits, misses;
    td_grammar_cache_stats(g, &hits, &misses, &entries);
    CHECK(bad == 0, "threads: %d masks differ", bad);
    CHECK(hits > 0 && entries > 0, "cache used (hits %llu, entries %zu)", (unsigned long long)hits, entries);
    printf("threads: cache hits %llu, misses %llu, %zu entries in 8 KiB\n", (unsigned long long)hits, (unsigned long long)misses, entries);
    td_grammar_free(g);
}

/* ---- JSON-Schema-Test-Suite ---- */
/* Known, accepted differences: name -> reason. A name is "file: group / test". */
static const char *const expected_diff[][2] = {
    {"oneOf.json: oneOf with boolean schemas, all true / any value is invalid", "oneOf is treated as anyOf (exclusivity not checked)"},
    {"oneOf.json: oneOf with boolean schemas, more than one true / any value is invalid", "oneOf treated as anyOf"},
    {"oneOf.json: oneOf complex types / both oneOf valid (complex)", "oneOf treated as anyOf"},
    {"oneOf.json: oneOf with empty schema / both valid - invalid", "oneOf treated as anyOf"},
    {"oneOf.json: oneOf with missing optional property / both oneOf valid", "oneOf treated as anyOf"},
    {"type.json: integer type matches integers / a float with zero fractional part is an integer", "integers are generated without a fraction"},
    {"const.json: const with object / same object with different property order is valid", "object values keep the schema's key order"},
    {NULL, NULL},
};

static const char *expected(const char *name) {
    for (int i = 0; expected_diff[i][0]; i++)
        if (!strcmp(expected_diff[i][0], name)) return expected_diff[i][1];
    return NULL;
}

static void test_suite(void) {
    const char *dir = "tests/data/json-schema-test-suite";
    DIR *d = opendir(dir);
    CHECK(d != NULL, "%s", dir);
    if (!d) return;
    char *names[64];
    int nf = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nf < 64)
        if (strstr(e->d_name, ".json")) names[nf++] = strdup(e->d_name);
    closedir(d);
    int pass = 0, diff = 0, fail = 0, unsup = 0, groups = 0, unused = 0;
    for (int f = 0; f < nf; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[f]);
        json_error_t je;
        json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
        CHECK(root != NULL, "%s: %s", path, je.text);
        size_t gi;
        json_t *grp;
        json_array_foreach(root, gi, grp) {
            groups++;
            char *sch = json_dumps(json_object_get(grp, "schema"), JSON_ENCODE_ANY | JSON_COMPACT);
            td_grammar *g = NULL;
            td_err err = {0};
            int rc = td_grammar_json_schema(sch, strlen(sch), NULL, &g, &err);
            const char *gdesc = json_string_value(json_object_get(grp, "description"));
            if (rc == TD_ERR_UNSUPPORTED) {
                unsup++;
                printf("  unsupported: %s: %s (%s)\n", names[f], gdesc, td_err_text(&err));
                free(sch);
                continue;
            }
            CHECK(rc == 0, "%s: %s: %s", names[f], gdesc, err.msg);
            free(sch);
            if (rc) continue;
            size_t ti;
            json_t *tc;
            json_array_foreach(json_object_get(grp, "tests"), ti, tc) {
                char name[512];
                snprintf(name, sizeof name, "%s: %s / %s", names[f], gdesc, json_string_value(json_object_get(tc, "description")));
                bool valid = json_is_true(json_object_get(tc, "valid"));
                json_t *data = json_object_get(tc, "data");
                bool ok = true;
                for (int style = 0; style < 2; style++) {
                    char *txt = json_dumps(data, JSON_ENCODE_ANY | (style ? 0 : JSON_COMPACT));
                    int got = matchs(g, txt);
                    if (got != (int)valid) ok = false;
                    free(txt);
                }
                const char *why = expected(name);
                if (ok) {
                    pass++;
                    if (why) unused++, printf("  expected difference did not occur: %s\n", name);
                } else if (why) diff++;
                else {
                    fail++;
                    char *txt = json_dumps(data, JSON_ENCODE_ANY | JSON_COMPACT);
                    CHECK(0, "suite: %s (valid %d): %s", name, valid, txt);
                    free(txt);
                }
            }
            td_grammar_free(g);
        }
        json_decref(root);
        free(names[f]);
    }
    printf("JSON-Schema-Test-Suite: %d groups, %d unsupported schemas; instances: %d pass, %d expected differences, %d fail\n",
           groups, unsup, pass, diff, fail);
    CHECK(unused == 0, "%d expected differences did not occur", unused);
}

/* ---- hostile inputs ---- */
static void test_hostile(void) {
    td_grammar *g = NULL;
    td_err err;
    double t0 = now();
    size_t n = 10000;
    char *s = malloc(n * 12 + 16), *p = s;
    for (size_t i = 0; i < n; i++) p += sprintf(p, "{\"anyOf\":[");
    p += sprintf(p, "{}");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "]}");
    int rc = td_grammar_json_schema(s, strlen(s), NULL, &g, &err);
    CHECK(rc == TD_ERR_LIMIT, "anyOf 10000 deep: %d %s", rc, err.msg);
    p = s;
    for (size_t i = 0; i < 1000; i++) p += sprintf(p, "{\"items\":");
    p += sprintf(p, "{}");
    for (size_t i = 0; i < 1000; i++) p += sprintf(p, "}");
    rc = td_grammar_json_schema(s, strlen(s), NULL, &g, &err);
    CHECK(rc == TD_ERR_LIMIT, "items 1000 deep: %d %s", rc, err.msg);
    free(s);
    n = 100000;
    s = malloc(2 * n + 2);
    memset(s, '(', n), memset(s + n, ')', n), s[2 * n] = 0;
    rc = td_grammar_regex(s, 2 * n, NULL, &g, &err);
    CHECK(rc == TD_ERR_LIMIT, "regex 100000 parens: %d %s", rc, err.msg);
    free(s);
    const char *big[] = {"a{1000000}", "((a{1000}){1000}){1000}", "((((a{1000}){1000}){1000}){1000})", "(([a-z]{999}){999}){999}"};
    for (int i = 0; i < 4; i++) {
        rc = td_grammar_regex(big[i], strlen(big[i]), NULL, &g, &err);
        if (rc == 0) { /* small grammar (refs), fine: must still match fast */
            CHECK(matchs(g, "a") == 0, "%s", big[i]);
            td_grammar_free(g);
        } else CHECK(rc == TD_ERR_LIMIT, "%s: %d %s", big[i], rc, err.msg);
    }
    /* huge enum: 300k strings (4 MB) -> over the grammar limit or fine, never a crash */
    n = 300000;
    s = malloc(n * 16 + 32);
    p = s + sprintf(s, "{\"enum\":[");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "%s\"v%zu\"", i ? "," : "", i);
    sprintf(p, "]}");
    rc = td_grammar_json_schema(s, strlen(s), NULL, &g, &err);
    CHECK(rc == 0 || rc == TD_ERR_LIMIT, "huge enum %d %s", rc, err.msg);
    if (rc == 0) {
        CHECK(matchs(g, "\"v123456\"") == 1 && matchs(g, "\"v3000000\"") == 0, "huge enum");
        td_grammar_free(g);
    }
    free(s);
    /* ambiguous regexes: stack sets stay bounded */
    const char *amb[] = {"(a|a)*(a|a)*(a|a)*b", "(a?){500}a{500}", "(.*,){20}x", "((a*)*)*b"};
    for (int i = 0; i < 4; i++) {
        rc = td_grammar_regex(amb[i], strlen(amb[i]), NULL, &g, &err);
        CHECK(rc == 0, "%s: %s", amb[i], err.msg);
        if (rc) continue;
        char txt[1200];
        memset(txt, i == 2 ? ',' : 'a', 1000);
        txt[1000] = 0;
        matchs(g, txt);
        td_grammar_free(g);
    }
    double dt = now() - t0;
    printf("hostile inputs: %.3f s\n", dt);
    CHECK(dt < 20, "hostile inputs took %.1f s", dt);
}

/* ---- timings on the qwen3 vocabulary ---- */
static void timing(const tokenizer *tk, int nv, const char *label) {
    const uint8_t **b = calloc((size_t)nv, sizeof *b);
    size_t *l = calloc((size_t)nv, sizeof *l);
    for (int i = 0; i < nv; i++)
        if (!td_tok_is_special(tk, i)) b[i] = td_tok_id_bytes(tk, i, &l[i]);
    int32_t eos = td_tok_token_id(tk, "<|im_end|>");
    if (eos >= nv) eos = nv - 1;
    td_grammar_vocab *v;
    td_err err;
    double t0 = now();
    CHECK(td_grammar_vocab_new(nv, b, l, &eos, 1, &v, &err) == 0, "%s", err.msg);
    double tv = now() - t0;
    const char *sch = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                      "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"ok\":{\"type\":\"boolean\"}},"
                      "\"required\":[\"name\",\"age\",\"tags\",\"ok\"],\"additionalProperties\":false}";
    const char *doc = "{\"name\": \"Ada Lovelace, the first programmer \u00e9\u20ac\", \"age\": 36, \"tags\": [\"math\", \"poetry\", \"engines\"], \"ok\": true}";
    td_grammar *g = schema(sch, NULL);
    int32_t *ids = NULL;
    size_t nid = 0;
    if (nv == td_tok_vocab_size(tk)) td_tok_encode(tk, doc, strlen(doc), false, &ids, &nid, &err);
    else { /* greedy longest match over the subset */
        size_t n = strlen(doc);
        ids = malloc(n * sizeof *ids);
        for (size_t i = 0; i < n;) {
            int best = -1;
            size_t bl = 0;
            for (int t = 0; t < nv; t++)
                if (b[t] && l[t] > bl && l[t] <= n - i && !memcmp(doc + i, b[t], l[t])) best = t, bl = l[t];
            if (best < 0) break;
            ids[nid++] = best, i += bl;
        }
    }
    if (g && ids) {
        for (int pass = 0; pass < 2; pass++) {
            td_matcher *m;
            td_matcher_new(g, v, &m, &err);
            double tn = 0, th = 0;
            size_t nn = 0, nh = 0;
            for (size_t i = 0; i < nid; i++) {
                if (ids[i] >= nv) break;
                uint64_t h0, m0, h1, m1;
                td_grammar_cache_stats(g, &h0, &m0, NULL);
                double a = now();
                const uint32_t *mk = td_matcher_mask(m, NULL, 0);
                double dt = now() - a;
                td_grammar_cache_stats(g, &h1, &m1, NULL);
                if (m1 > m0) tn += dt, nn++;
                else th += dt, nh++;
                CHECK(mk && (mk[ids[i] >> 5] >> (ids[i] & 31) & 1), "%s: token %zu (%d '%s') allowed", label, i, ids[i], td_tok_token_str(tk, ids[i]));
                if (td_matcher_accept(m, ids[i])) break;
            }
            printf("mask timing %s (V=%d, vocab built in %.0f ms), %s matcher: %zu new states %.3f ms each, %zu cached states %.4f ms each\n",
                   label, nv, tv * 1e3, pass ? "second" : "first", nn, nn ? tn * 1e3 / (double)nn : 0.0, nh, nh ? th * 1e3 / (double)nh : 0.0);
            td_matcher_free(m);
        }
        /* json_object, inside a string: the worst case (most tokens allowed) */
        td_grammar *jo;
        td_grammar_json_object(NULL, &jo, &err);
        td_matcher *m;
        td_matcher_new(jo, v, &m, &err);
        td_matcher_accept_bytes(m, (const uint8_t *)"{\"text\": \"abc", 13);
        double a = now();
        td_matcher_mask(m, NULL, 0);
        double t1 = now() - a;
        a = now();
        td_matcher_mask(m, NULL, 0);
        printf("mask timing %s: inside a JSON string: new %.2f ms, cached %.3f ms\n", label, t1 * 1e3, (now() - a) * 1e3);
        td_matcher_free(m);
        td_grammar_free(jo);
    }
    free(ids);
    td_grammar_free(g);
    td_grammar_vocab_free(v);
    free(b), free(l);
}

int main(void) {
    make_fake();
    test_choice();
    test_regex();
    test_json();
    test_plain_dfs();
    test_threads();
    test_suite();
    test_hostile();
    tokenizer *tk;
    td_err err;
    if (td_tok_load("tests/data/qwen3-tokenizer", &tk, &err) == 0) {
        timing(tk, 8192, "qwen3 first 8192 ids");
#if defined(__SANITIZE_ADDRESS__)
#define GRAMMAR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GRAMMAR_ASAN 1
#endif
#endif
#ifndef GRAMMAR_ASAN
        timing(tk, td_tok_vocab_size(tk), "qwen3 full");
#else
        printf("mask timing on the full vocabulary: skipped under AddressSanitizer\n");
#endif
        td_tok_free(tk);
    } else CHECK(0, "td_tok_load: %s", err.msg);
    printf("masks checked against the brute force: %ld (random walks)\n", brute_checked);
    td_grammar_vocab_free(fake);
    free(fb), free(fl);
    TEST_MAIN_END("test_grammar");
}
