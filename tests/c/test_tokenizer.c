/* Tokenizer vs Hugging Face `tokenizers` (tests/golden/tokenizer, produced
 * by tools/reference/tok_golden.py) on the Qwen3 tokenizer in
 * tests/data/qwen3-tokenizer: ids, decode, streaming decode, round
 * trip, the llama.cpp vectors, the Qwen3.5 regex variant, invalid UTF-8
 * and unsupported components. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>
#include "check.h"
#include "tokenizer/tokenizer.h"

static char g_dir[512];

/* --- the generated 1 MB strings: same algorithm as tok_strings.gen_long --- */
static const char *FRAGS[] = {
    "the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dog", ". ", ", ", "\n", "\n\n", "    ",
    "\t", "def ", "return ", "(x)", "[i]", "{}", " = ", "==", "+= 1;", "// comment", "# note", "12345",
    "3.14", "don't ", "it's ", "\u4f60\u597d", "\u4e16\u754c", "\u3002", "caf\u00e9 ", "e\u0301", "\U0001f600",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u0645\u0631\u062d\u0628\u0627 ", "\u00a0", "\r\n",
    "<|im_end|>", "<think>", "   \n", "Hello", "WORLD", "_snake_case_", "camelCase", "!!!", "...",
};

static uint32_t lcg(uint32_t s) { return s * 1103515245u + 12345u; }

static char *gen_long(const char *kind, size_t *len) {
    size_t size = 1000000, cap = size + 8192, n = 0;
    char *b = malloc(cap);
    if (!strcmp(kind, "letters")) {
        for (n = 0; n < size; n++) b[n] = (char)('a' + n % 26);
    } else if (!strcmp(kind, "spaces")) {
        uint32_t st = 7;
        while (n < size) {
            st = lcg(st);
            size_t k = (st >> 16) % 5000 + 1;
            memset(b + n, ' ', k);
            n += k;
            b[n++] = ((st >> 8) & 1) ? '\n' : 'x';
        }
    } else {
        uint32_t st = 12345;
        size_t nf = sizeof FRAGS / sizeof *FRAGS;
        while (n < size) {
            st = lcg(st);
            const char *f = FRAGS[(st >> 16) % nf];
            size_t k = strlen(f);
            memcpy(b + n, f, k);
            n += k;
        }
    }
    b[n] = 0;
    *len = n;
    return b;
}

static uint64_t fnv(const int32_t *ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) { h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xff; h *= 0x100000001b3ULL; }
    return h;
}

static size_t unhex(const char *h, char *out) {
    size_t n = 0;
    for (; h[0] && h[1]; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (char)v;
    }
    return n;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int bad, k = td_tok_utf8_seq((const uint8_t *)s + i, n - i, &bad);
        if (!k) return false;
        i += (size_t)k;
    }
    return true;
}

static void check_stream(const tokenizer *t, const int32_t *ids, size_t n, const char *expect, size_t elen, const char *what) {
    tok_stream s;
    td_tok_stream_init(&s, t, false);
    char *acc = malloc(elen * 2 + 16);
    size_t al = 0;
    bool chunks_ok = true;
    td_err err = {0};
    for (size_t i = 0; i <= n; i++) {
        const char *txt;
        size_t tl;
        int rc = i < n ? td_tok_stream_push(&s, ids[i], &txt, &tl, &err) : td_tok_stream_flush(&s, &txt, &tl, &err);
        if (rc || al + tl > elen * 2 + 16) { chunks_ok = false; break; }
        chunks_ok &= valid_utf8(txt, tl);
        memcpy(acc + al, txt, tl);
        al += tl;
    }
    CHECK(chunks_ok, "%s: stream chunk not whole code points", what);
    CHECK(al == elen && memcmp(acc, expect, elen) == 0, "%s: streamed text differs from decode", what);
    free(acc);
    td_tok_stream_free(&s);
}

static int run_file(const tokenizer *t, const char *path, int *n_vectors) {
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return 0;
    json_error_t je;
    json_t *rec;
    int line = 0;
    char *buf = malloc(1 << 20);
    while ((rec = json_loadf(f, JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &je))) {
        line++;
        td_err err = {0};
        int32_t *ids = NULL;
        size_t n = 0;
        char what[64];
        snprintf(what, sizeof what, "%s:%d", strrchr(path, '/') + 1, line);
        const char *gen = json_string_value(json_object_get(rec, "gen"));
        if (gen) {
            size_t len;
            char *s = gen_long(gen, &len);
            int rc = td_tok_encode(t, s, len, true, &ids, &n, &err);
            CHECK(rc == 0, "%s: %s", what, err.msg);
            char hx[20];
            snprintf(hx, sizeof hx, "%016llx", (unsigned long long)fnv(ids, n));
            CHECK(n == (size_t)json_integer_value(json_object_get(rec, "n_ids")), "%s (%s): %zu ids, expected %lld", what, gen,
                  n, (long long)json_integer_value(json_object_get(rec, "n_ids")));
            CHECK(!strcmp(hx, json_string_value(json_object_get(rec, "fnv"))), "%s (%s): ids differ", what, gen);
            char *d;
            size_t dl;
            if (td_tok_decode(t, ids, n, false, &d, &dl, &err) == 0) {
                /* "mixed" holds e+U+0301, which NFC composes */
                char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)s);
                CHECK(nfc && dl == strlen(nfc) && !memcmp(d, nfc, dl), "%s: decode(encode(s)) != NFC(s)", what);
                free(nfc);
                free(d);
            }
            free(s);
            free(ids);
            json_decref(rec);
            (*n_vectors)++;
            continue;
        }
        const char *text = json_string_value(json_object_get(rec, "text"));
        size_t tl;
        if (text) tl = json_string_length(json_object_get(rec, "text")), memcpy(buf, text, tl);
        else tl = unhex(json_string_value(json_object_get(rec, "hex")), buf);
        int rc = td_tok_encode(t, buf, tl, true, &ids, &n, &err);
        CHECK(rc == 0, "%s: %s", what, err.msg);
        json_t *exp = json_object_get(rec, "ids");
        bool same = n == json_array_size(exp);
        for (size_t i = 0; same && i < n; i++) same = ids[i] == json_integer_value(json_array_get(exp, i));
        CHECK(same, "%s: ids differ for %.60s", what, text ? text : "(bytes)");
        if (!same) {
            fprintf(stderr, "  got:");
            for (size_t i = 0; i < n && i < 30; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  exp:");
            for (size_t i = 0; i < json_array_size(exp) && i < 30; i++) fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(exp, i)));
            fprintf(stderr, "\n");
        }
        /* decode(encode(s)) == NFC(s) (the reference's decode of the same ids) */
        json_t *dec = json_object_get(rec, "decoded");
        char *d;
        size_t dl;
        if (td_tok_decode(t, ids, n, false, &d, &dl, &err) == 0) {
            CHECK(dl == json_string_length(dec) && !memcmp(d, json_string_value(dec), dl), "%s: decode differs", what);
            free(d);
        }
        check_stream(t, ids, n, json_string_value(dec), json_string_length(dec), what);
        free(ids);
        json_decref(rec);
        (*n_vectors)++;
    }
    free(buf);
    fclose(f);
    return line;
}

static void llama_vectors(const tokenizer *t) {
    char p[700];
    snprintf(p, sizeof p, "%s/../tokenizer-tests/qwen2-vectors.json", g_dir);
    json_error_t je;
    json_t *arr = json_load_file(p, 0, &je);
    CHECK(json_is_array(arr), "cannot read %s", p);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        json_t *tx = json_object_get(v, "text"), *exp = json_object_get(v, "ids");
        td_err err = {0};
        int32_t *ids;
        size_t n;
        td_tok_encode(t, json_string_value(tx), json_string_length(tx), true, &ids, &n, &err);
        bool same = n == json_array_size(exp);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(exp, k));
        CHECK(same, "llama.cpp vector %zu differs: %.40s", i, json_string_value(tx));
        free(ids);
    }
    json_decref(arr);
}

/* The Qwen3.5 regex (with \p{M}) on the Qwen3 vocabulary: write a copy of
 * tokenizer.json with the pattern replaced, as tok_golden.py does. */
static void qwen35_regex(int *nv) {
    static const char RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", g_dir);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    CHECK(j != NULL, "cannot read %s", p);
    if (!j) return;
    json_t *split = json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(json_object_get(split, "pattern"), "Regex", json_string(RE));
    char tmp[] = "/tmp/tandem_tok35_XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) { json_decref(j); return; }
    close(fd);
    json_dump_file(j, tmp, JSON_COMPACT);
    json_decref(j);
    tokenizer *t;
    td_err err = {0};
    int rc = td_tok_load_files(tmp, NULL, &t, &err);
    CHECK(rc == 0, "load qwen3.5-regex tokenizer: %s", err.msg);
    if (rc == 0) {
        run_file(t, "tests/golden/tokenizer/qwen35re.jsonl", nv);
        td_tok_free(t);
    }
    unlink(tmp);
}

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
}

/* A tiny hand-made tokenizer.json: unsupported parts are named errors,
 * merges in both forms, added-token flags. */
static void small_tokenizers(void) {
    char tmp[] = "/tmp/tandem_toksmall_XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) return;
    close(fd);
    /* byte-level alphabet for 'a','b',' ' (Ġ) */
    const char *base =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"\\u0120\":2,\"ab\":3,\"\\u0120ab\":4},"
        "\"merges\":[%s]},\"added_tokens\":[{\"id\":5,\"content\":\"<x>\",\"special\":true,\"normalized\":false,"
        "\"lstrip\":%s,\"rstrip\":%s,\"single_word\":%s}],\"normalizer\":%s,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
        "\"decoder\":{\"type\":\"ByteLevel\"}}";
    char js[2048];
    struct { const char *merges, *l, *r, *sw, *norm, *text; const char *expect; } cases[] = {
        {"\"a b\",\"\\u0120 ab\"", "false", "false", "false", "null", "ab ab", "3 4"},
        {"[\"a\",\"b\"],[\"\\u0120\",\"ab\"]", "false", "false", "false", "{\"type\":\"NFC\"}", "ab ab", "3 4"},
        {"\"a b\"", "false", "false", "false", "null", "a<x>b", "0 5 1"},
        {"\"a b\"", "true", "false", "false", "null", "a  <x>b", "0 5 1"},
        {"\"a b\"", "false", "true", "false", "null", "a<x>  b", "0 5 1"},
        {"\"a b\"", "false", "false", "true", "null", "a<x>b", "0 1"},
        {"\"a b\"", "false", "false", "true", "null", "a <x> b", "0 2 5 2 1"},
    };
    /* '<', 'x', '>' are not in the vocab, so an unmatched "<x>" vanishes
     * (no unk token); expectations checked with tokenizers 0.23.3 */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(js, sizeof js, base, cases[i].merges, cases[i].l, cases[i].r, cases[i].sw, cases[i].norm);
        write_file(tmp, js);
        tokenizer *t;
        td_err err = {0};
        int rc = td_tok_load_files(tmp, NULL, &t, &err);
        CHECK(rc == 0, "small tokenizer %zu: %s", i, err.msg);
        if (rc) continue;
        int32_t *ids;
        size_t n;
        td_tok_encode(t, cases[i].text, strlen(cases[i].text), true, &ids, &n, &err);
        char got[256] = "";
        for (size_t k = 0; k < n; k++) snprintf(got + strlen(got), sizeof got - strlen(got), k ? " %d" : "%d", ids[k]);
        CHECK(!strcmp(got, cases[i].expect), "small tokenizer %zu: got [%s] expected [%s]", i, got, cases[i].expect);
        free(ids);
        td_tok_free(t);
    }
    snprintf(js, sizeof js, base, "\"a b\"", "false", "false", "false", "{\"type\":\"Lowercase\"}");
    write_file(tmp, js);
    tokenizer *t = NULL;
    td_err err = {0};
    int rc = td_tok_load_files(tmp, NULL, &t, &err);
    CHECK(rc == TD_ERR_UNSUPPORTED && strstr(err.msg, "Lowercase"), "unsupported normalizer named: %s", err.msg);
    td_tok_free(t);
    write_file(tmp, "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"decoder\":{\"type\":\"ByteLevel\"},"
                    "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}");
    rc = td_tok_load_files(tmp, NULL, &t, &err);
    CHECK(rc == TD_ERR_UNSUPPORTED && strstr(err.msg, "WordPiece"), "unsupported model named: %s", err.msg);
    write_file(tmp, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},"
                    "\"pre_tokenizer\":{\"type\":\"Metaspace\"}}");
    rc = td_tok_load_files(tmp, NULL, &t, &err);
    CHECK(rc == TD_ERR_UNSUPPORTED && strstr(err.msg, "Metaspace"), "unsupported pre-tokenizer named: %s", err.msg);
    rc = td_tok_load_files("/nonexistent/tokenizer.json", NULL, &t, &err);
    CHECK(rc == TD_ERR_IO, "missing file is TD_ERR_IO");
    unlink(tmp);
}

static void unit_checks(const tokenizer *t) {
    CHECK(td_tok_token_id(t, "<|im_end|>") == 151645, "im_end id");
    CHECK(td_tok_eos_id(t) == 151645, "eos id from tokenizer_config");
    CHECK(td_tok_bos_id(t) == -1 && td_tok_bos_token(t) == NULL, "no bos");
    CHECK(td_tok_is_special(t, 151644) && !td_tok_is_special(t, 100), "special flags");
    CHECK(td_tok_vocab_size(t) == 151669, "vocab size %d", td_tok_vocab_size(t));
    CHECK(td_tok_chat_template(t) && strstr(td_tok_chat_template(t), "<|im_start|>"), "chat template present");
    CHECK(td_tok_token_str(t, 9707) && !strcmp(td_tok_token_str(t, 9707), "Hello"), "token string");
    /* invalid UTF-8: maximal subparts -> one U+FFFD each */
    size_t n;
    char *s = td_tok_utf8_sanitize("a\xf0\x9f\x98" "b\xed\xa0\x80" "c\xc3", 10, &n);
    CHECK(s && !strcmp(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "c\xef\xbf\xbd"), "sanitize");
    free(s);
    /* streaming: 4-byte emoji split over byte tokens is held until complete */
    td_err err = {0};
    int32_t *ids;
    size_t ni;
    td_tok_encode(t, "\xf0\x9f\xab\xa0", 4, false, &ids, &ni, &err); /* U+1FAE0: several byte tokens */
    CHECK(ni >= 2, "emoji split into %zu tokens", ni);
    tok_stream st;
    td_tok_stream_init(&st, t, false);
    const char *txt;
    size_t tl, total = 0;
    for (size_t i = 0; i < ni; i++) {
        td_tok_stream_push(&st, ids[i], &txt, &tl, &err);
        CHECK(i + 1 == ni ? tl == 4 : tl == 0, "stream holds partial code point (piece %zu gave %zu bytes)", i, tl);
        total += tl;
    }
    td_tok_stream_flush(&st, &txt, &tl, &err);
    CHECK(total == 4 && tl == 0, "stream total");
    /* an unfinished sequence at the end becomes U+FFFD on flush */
    td_tok_stream_push(&st, ids[0], &txt, &tl, &err);
    td_tok_stream_flush(&st, &txt, &tl, &err);
    CHECK(tl == 3 && !memcmp(txt, "\xef\xbf\xbd", 3), "flush replaces a dangling prefix");
    td_tok_stream_free(&st);
    free(ids);
    /* skip_special */
    int32_t sp[] = {151644, 9707, 151645};
    char *d;
    size_t dl;
    td_tok_decode(t, sp, 3, true, &d, &dl, &err);
    CHECK(!strcmp(d, "Hello"), "skip_special decode: %s", d);
    free(d);
    /* unknown ids are skipped, as tokenizers does */
    int32_t bad[] = {-1, 9707, 99999999};
    td_tok_decode(t, bad, 3, false, &d, &dl, &err);
    CHECK(!strcmp(d, "Hello"), "unknown ids skipped: %s", d);
    free(d);
    /* a per-thread encoder gives the same ids */
    tok_encoder *e;
    td_tok_encoder_new(t, &e, &err);
    td_tok_encoder_encode(e, "Hello world", 11, false, &ids, &ni, &err);
    CHECK(ni == 2 && ids[0] == 9707 && ids[1] == 1879, "tok_encoder");
    free(ids);
    td_tok_encoder_free(e);
}


/* The CLI, when the binary is built (src/cli/main.c dispatches to
 * src/cli/tok_cmds.c): tokenize / detokenize on a sample of the golden
 * vectors, template on one conversation per real template. */
static char *run_cmd(const char *cmd, const char *in, size_t inlen, size_t *outlen) {
    char tin[] = "/tmp/tandem_cli_in_XXXXXX";
    int fd = mkstemp(tin);
    if (fd < 0) return NULL;
    if (write(fd, in, inlen) != (ssize_t)inlen) { close(fd); return NULL; }
    close(fd);
    char full[2048];
    snprintf(full, sizeof full, "%s < %s", cmd, tin);
    FILE *p = popen(full, "r");
    char *out = malloc(1 << 20);
    size_t n = p ? fread(out, 1, (1 << 20) - 1, p) : 0;
    int rc = p ? pclose(p) : -1;
    unlink(tin);
    out[n] = 0;
    *outlen = n;
    if (rc != 0) { free(out); return NULL; }
    return out;
}

static void cli_checks(void) {
    const char *b = getenv("BUILD");
    char bin[512];
    snprintf(bin, sizeof bin, "%s/tandem", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        printf("test_tokenizer: %s not built, CLI checks skipped\n", bin);
        return;
    }
    FILE *f = fopen("tests/golden/tokenizer/qwen3.jsonl", "r");
    if (!f) return;
    json_error_t je;
    json_t *rec;
    int line = 0;
    char cmd[8192], buf[4096];
    while ((rec = json_loadf(f, JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &je))) {
        line++;
        json_t *tx = json_object_get(rec, "text");
        const char *hx = json_string_value(json_object_get(rec, "hex"));
        /* each call loads the 11 MB tokenizer: a handful of vectors only */
        if ((line % 80 == 1 && tx) || (hx && line % 5 == 0)) {
            size_t tl = tx ? json_string_length(tx) : unhex(hx, buf);
            if (tx) memcpy(buf, json_string_value(tx), tl < sizeof buf ? tl : 0);
            snprintf(cmd, sizeof cmd, "%s tokenize -m %s", bin, g_dir);
            size_t ol;
            char *out = tl < sizeof buf ? run_cmd(cmd, buf, tl, &ol) : NULL;
            json_t *got = out ? json_loads(out, 0, &je) : NULL;
            CHECK(got && json_equal(got, json_object_get(rec, "ids")), "tandem tokenize, qwen3.jsonl:%d", line);
            char *ids = json_dumps(json_object_get(rec, "ids"), JSON_COMPACT);
            snprintf(cmd, sizeof cmd, "%s detokenize -m %s", bin, g_dir);
            char *text = run_cmd(cmd, ids, strlen(ids), &ol);
            json_t *dec = json_object_get(rec, "decoded");
            CHECK(text && ol == json_string_length(dec) && !memcmp(text, json_string_value(dec), ol),
                  "tandem detokenize, qwen3.jsonl:%d", line);
            free(ids); free(text); free(out);
            json_decref(got);
        }
        json_decref(rec);
    }
    fclose(f);
    /* template: the first rendered chat of each template, via a model dir
     * holding tokenizer_config.json and that template as chat_template.jinja */
    f = fopen("tests/golden/templates/chats.jsonl", "r");
    if (!f) return;
    char done[3][32] = {{0}};
    int nd = 0;
    while (nd < 3 && (rec = json_loadf(f, JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &je))) {
        const char *name = json_string_value(json_object_get(rec, "template"));
        json_t *kw = json_object_get(rec, "kwargs");
        bool seen = false;
        for (int i = 0; i < nd; i++) seen |= !strcmp(done[i], name);
        if (seen || json_is_true(json_object_get(rec, "error")) || !json_object_get(rec, "tools") ||
            json_is_null(json_object_get(rec, "tools"))) { json_decref(rec); continue; }
        char dir[] = "/tmp/tandem_cli_dir_XXXXXX";
        if (!mkdtemp(dir)) { json_decref(rec); break; }
        snprintf(cmd, sizeof cmd, "cp %s/tokenizer_config.json %s/ && cp %s/../chat-templates/%s.jinja %s/chat_template.jinja",
                 g_dir, dir, g_dir, name, dir);
        CHECK(system(cmd) == 0, "copy template");
        char mpath[600], tpath[600];
        snprintf(mpath, sizeof mpath, "%s/m.json", dir);
        snprintf(tpath, sizeof tpath, "%s/t.json", dir);
        json_dump_file(json_object_get(rec, "messages"), mpath, 0);
        json_dump_file(json_object_get(rec, "tools"), tpath, 0);
        char *kws = json_dumps(kw, JSON_COMPACT);
        snprintf(cmd, sizeof cmd, "%s template -m %s --messages %s --tools %s %s --kwargs '%s'", bin, dir, mpath, tpath,
                 json_is_true(json_object_get(rec, "add_generation_prompt")) ? "" : "--no-generation-prompt", kws);
        size_t ol;
        char *out = run_cmd(cmd, "", 0, &ol);
        json_t *exp = json_object_get(rec, "expected");
        CHECK(out && ol == json_string_length(exp) && !memcmp(out, json_string_value(exp), ol), "tandem template (%s)", name);
        free(out);
        free(kws);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
        snprintf(done[nd++], sizeof done[0], "%s", name);
        json_decref(rec);
    }
    fclose(f);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "tests/data/qwen3-tokenizer");
    td_err err = {0};
    tokenizer *t;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = td_tok_load(g_dir, &t, &err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    CHECK(rc == 0, "load %s: %s", g_dir, err.msg);
    if (rc) TEST_MAIN_END("test_tokenizer");
    printf("test_tokenizer: loaded %s in %.3f s\n", g_dir, (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    int nv = 0;
    run_file(t, "tests/golden/tokenizer/qwen3.jsonl", &nv);
    llama_vectors(t);
    unit_checks(t);
    td_tok_free(t);
    qwen35_regex(&nv);
    small_tokenizers();
    cli_checks();
    printf("test_tokenizer: %d golden vectors\n", nv);
    CHECK(nv >= 600, "too few vectors: %d", nv);
    TEST_MAIN_END("test_tokenizer");
}
