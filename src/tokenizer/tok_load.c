/* Loading tokenizer.json / tokenizer_config.json (Hugging Face format).
 * Everything that changes the ids produced is checked: an unsupported
 * normalizer, pre-tokenizer, model option or post-processor is an error
 * that names it, never a silent approximation. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>
#include "tokenizer/tok_internal.h"
#include "util/err.h"

void td_tok_bytelevel_tables(uint32_t byte2cp[256]) {
    /* GPT-2: printable Latin-1 bytes map to themselves, the other 68 bytes
     * to U+0100.. in byte order. */
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte2cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* Maps a byte-level string back to raw bytes; false when some character is
 * not in the ByteLevel alphabet (the decoder then keeps the UTF-8 as is). */
static bool bytelevel_to_bytes(const int16_t *cp2byte, const char *s, size_t n, uint8_t *out, size_t *out_len) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp >= 324 || cp2byte[cp] < 0) return false;
        out[o++] = (uint8_t)cp2byte[cp];
        i += (size_t)k;
    }
    *out_len = o;
    return true;
}

static char *xstrdup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

static int compile_re(const char *pat, bool literal, pcre2_code **out, td_err *err) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return TD_FAIL(err, TD_ERR_FORMAT, "pre-tokenizer regex at offset %zu: %s", (size_t)eo, (char *)msg);
    }
    /* JIT is an optimisation: without it (unsupported CPU) matching still works. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return 0;
}

/* The GPT-2 split used by ByteLevel(use_regex=true). */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_normalizer(tokenizer *t, json_t *n, td_err *err) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return TD_FAIL(err, TD_ERR_FORMAT, "normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            int rc = parse_normalizer(t, v, err);
            if (rc) return rc;
        }
        return 0;
    }
    int k = !strcmp(type, "NFC") ? NORM_NFC : !strcmp(type, "NFD") ? NORM_NFD
          : !strcmp(type, "NFKC") ? NORM_NFKC : !strcmp(type, "NFKD") ? NORM_NFKD : 0;
    if (!k) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported normalizer \"%s\"", type);
    if (t->n_norm == TOK_MAX_NORM) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "too many normalizers");
    t->norm[t->n_norm++] = k;
    return 0;
}

static int parse_pretok(tokenizer *t, json_t *p, td_err *err) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return TD_FAIL(err, TD_ERR_FORMAT, "pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            int rc = parse_pretok(t, v, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (t->n_pt == TOK_MAX_PT) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "too many pre-tokenizers");
    tok_pt_step *s = &t->pt[t->n_pt];
    memset(s, 0, sizeof *s);
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *rx = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (!rx && !lit) return TD_FAIL(err, TD_ERR_FORMAT, "Split pre-tokenizer without a pattern");
        if (json_is_true(json_object_get(p, "invert")))
            return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported pre-tokenizer option Split.invert=true");
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!beh) beh = "";
        s->behavior = !strcmp(beh, "Isolated") ? SPLIT_ISOLATED : !strcmp(beh, "Removed") ? SPLIT_REMOVED
                    : !strcmp(beh, "MergedWithPrevious") ? SPLIT_MERGED_PREV
                    : !strcmp(beh, "MergedWithNext") ? SPLIT_MERGED_NEXT : 0;
        if (!s->behavior) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported Split behavior \"%s\"", beh);
        s->kind = PT_SPLIT;
        int rc = compile_re(rx ? rx : lit, !rx, &s->re, err);
        if (rc) return rc;
    } else if (!strcmp(type, "ByteLevel")) {
        s->kind = PT_BYTELEVEL;
        s->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            int rc = compile_re(GPT2_RE, false, &s->re, err);
            if (rc) return rc;
        }
    } else {
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported pre-tokenizer \"%s\"", type);
    }
    t->n_pt++;
    return 0;
}

static int parse_post(tokenizer *t, json_t *p, td_err *err) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return TD_FAIL(err, TD_ERR_FORMAT, "post_processor without a type");
    if (!strcmp(type, "ByteLevel")) return 0; /* only adjusts offsets */
    if (strcmp(type, "TemplateProcessing"))
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported post_processor \"%s\"", type);
    json_t *single = json_object_get(p, "single"), *sp = json_object_get(p, "special_tokens");
    size_t i;
    json_t *v;
    bool seen_a = false;
    json_array_foreach(single, i, v) {
        json_t *st = json_object_get(v, "SpecialToken");
        if (json_object_get(v, "Sequence")) { seen_a = true; continue; }
        const char *name = json_string_value(json_object_get(st, "id"));
        json_t *ids = json_object_get(json_object_get(sp, name ? name : ""), "ids");
        size_t j;
        json_t *idv;
        json_array_foreach(ids, j, idv) {
            int *n = seen_a ? &t->n_post_post : &t->n_post_pre;
            int32_t *arr = seen_a ? t->post_post : t->post_pre;
            if (*n == 8) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "TemplateProcessing with too many tokens");
            arr[(*n)++] = (int32_t)json_integer_value(idv);
        }
    }
    return 0;
}

/* Largest token id a tokenizer.json may use: the id tables are dense, so an
 * id of 99,999,999 would allocate a 100M-entry vocabulary (Qwen3.5: 248k). */
#define TOK_MAX_ID (1 << 22)

static int parse_model(tokenizer *t, json_t *m, td_err *err) {
    const char *type = json_string_value(json_object_get(m, "type"));
    if (type && strcmp(type, "BPE")) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported model \"%s\"", type);
    json_t *d = json_object_get(m, "dropout");
    if (d && !json_is_null(d) && json_number_value(d) != 0.0)
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported BPE option dropout");
    if (json_is_true(json_object_get(m, "byte_fallback")))
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported BPE option byte_fallback");
    const char *csp = json_string_value(json_object_get(m, "continuing_subword_prefix"));
    const char *ews = json_string_value(json_object_get(m, "end_of_word_suffix"));
    if ((csp && *csp) || (ews && *ews))
        return TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported BPE option continuing_subword_prefix/end_of_word_suffix");
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return TD_FAIL(err, TD_ERR_FORMAT, "model.vocab missing");
    json_t *merges = json_object_get(m, "merges");
    if (merges && !json_is_array(merges)) return TD_FAIL(err, TD_ERR_FORMAT, "model.merges is not an array");
    size_t nv = json_object_size(vocab);
    if (td_tm_str_init(&t->tok2id, nv + 64) || td_tm_str_init(&t->bytes2id, nv + 64) ||
        td_tm_u64_init(&t->merges, merges ? json_array_size(merges) : 16))
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory (vocab)");
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= TOK_MAX_ID)
            return TD_FAIL(err, TD_ERR_FORMAT, "vocab entry \"%.64s\" has a bad id (ids are 0..%d)", k, TOK_MAX_ID - 1);
        if (td_tm_str_put(&t->tok2id, k, strlen(k), (int32_t)id)) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        if (id >= t->n_ids) t->n_ids = (int32_t)id + 1;
    }
    t->n_model = t->tok2id.n;
    /* one token per id: a second token with the same id would decode wrongly */
    unsigned char *seen = TD_CALLOC(err, (size_t)t->n_ids + 1, 1);
    if (!seen) return TD_ERR_NOMEM;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_integer_value(v);
        if (seen[id]) { free(seen); return TD_FAIL(err, TD_ERR_FORMAT, "vocab id %lld is given to two tokens (one is \"%.64s\")", (long long)id, k); }
        seen[id] = 1;
    }
    free(seen);
    return 0;
}

static int resolve_merges(tokenizer *t, json_t *merges, td_err *err) {
    size_t i;
    json_t *v;
    char buf[1024];
    json_array_foreach(merges, i, v) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(v)) {
            const char *s = json_string_value(v);
            const char *sp = strchr(s, ' ');
            if (!sp) return TD_FAIL(err, TD_ERR_FORMAT, "merge %zu \"%s\" has no space", i, s);
            a = s; la = (size_t)(sp - s); b = sp + 1; lb = strlen(b);
        } else if (json_is_array(v) && json_array_size(v) == 2) {
            a = json_string_value(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            if (!a || !b) return TD_FAIL(err, TD_ERR_FORMAT, "merge %zu is not two strings", i);
            la = strlen(a); lb = strlen(b);
        } else {
            return TD_FAIL(err, TD_ERR_FORMAT, "merge %zu has a bad form", i);
        }
        int32_t ia, ib, in;
        if (la + lb >= sizeof buf) return TD_FAIL(err, TD_ERR_FORMAT, "merge %zu too long", i);
        memcpy(buf, a, la); memcpy(buf + la, b, lb);
        if (!td_tm_str_get(&t->tok2id, a, la, &ia) || !td_tm_str_get(&t->tok2id, b, lb, &ib))
            return TD_FAIL(err, TD_ERR_FORMAT, "merge %zu refers to a token missing from the vocab", i);
        if (!td_tm_str_get(&t->tok2id, buf, la + lb, &in))
            return TD_FAIL(err, TD_ERR_FORMAT, "merge %zu: merged token missing from the vocab", i);
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint64_t old;
        if (tm_u64_get(&t->merges, key, &old)) continue; /* first (lowest rank) wins */
        if (td_tm_u64_put(&t->merges, key, ((uint64_t)i << 32) | (uint32_t)in))
            return TD_FAIL(err, TD_ERR_NOMEM, "out of memory (merges)");
    }
    return 0;
}

static int parse_added(tokenizer *t, json_t *arr, td_err *err) {
    size_t na = json_array_size(arr);
    t->added = TD_CALLOC(err, na ? na : 1, sizeof *t->added);
    if (!t->added) return TD_ERR_NOMEM;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        const char *c = json_string_value(json_object_get(v, "content"));
        json_t *idv = json_object_get(v, "id");
        if (!c || !json_is_integer(idv) || json_integer_value(idv) < 0 || json_integer_value(idv) >= TOK_MAX_ID)
            return TD_FAIL(err, TD_ERR_FORMAT, "added_tokens[%zu] malformed (needs content and an id in 0..%d)", i, TOK_MAX_ID - 1);
        if (!*c) continue;
        tok_added *a = &t->added[t->n_added++];
        a->len = strlen(c);
        a->content = xstrdup(c, a->len);
        if (!a->content) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        a->id = (int32_t)json_integer_value(idv);
        a->single_word = json_is_true(json_object_get(v, "single_word"));
        a->lstrip = json_is_true(json_object_get(v, "lstrip"));
        a->rstrip = json_is_true(json_object_get(v, "rstrip"));
        json_t *nz = json_object_get(v, "normalized");
        a->special = json_is_true(json_object_get(v, "special"));
        a->normalized = nz ? json_is_true(nz) : !a->special;
        if (td_tm_str_put(&t->tok2id, c, a->len, a->id)) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        if (a->id >= t->n_ids) t->n_ids = a->id + 1;
    }
    return 0;
}

/* Added tokens marked `normalized` are searched for in normalized text, so
 * their pattern is normalized too (as tokenizers' refresh_added_tokens). */
static int prepare_added(tokenizer *t, td_err *err) {
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (a->normalized && t->n_norm) {
            bool same;
            size_t nl;
            char *nz = td_tok_normalize(t, a->content, a->len, &nl, &same);
            if (!same && !nz) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
            a->match = same ? a->content : nz;
            a->match_len = same ? a->len : nl;
        } else {
            a->match = a->content;
            a->match_len = a->len;
        }
        if (!a->match_len) continue;
        if (a->normalized) { t->first_norm[(uint8_t)a->match[0]] = true; t->any_norm_added = true; }
        else t->first_raw[(uint8_t)a->match[0]] = true;
    }
    return 0;
}

/* Per-id tables: surface string, decoded bytes, special flag. */
static int build_id_tables(tokenizer *t, td_err *err) {
    size_t n = (size_t)t->n_ids;
    t->id_str = TD_CALLOC(err, n, sizeof *t->id_str);
    t->dec_off = TD_CALLOC(err, n, sizeof *t->dec_off);
    t->dec_len = TD_CALLOC(err, n, sizeof *t->dec_len);
    t->is_special = TD_CALLOC(err, n, 1);
    if (!t->id_str || !t->dec_off || !t->dec_len || !t->is_special) return TD_ERR_NOMEM;
    uint32_t b2c[256];
    int16_t c2b[324];
    td_tok_bytelevel_tables(b2c);
    memset(c2b, 0xff, sizeof c2b);
    for (int b = 0; b < 256; b++) c2b[b2c[b]] = (int16_t)b;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    /* Strings: the map's arena holds every key; point into a copy. */
    for (size_t e = 0; e < t->tok2id.n; e++) {
        size_t kl;
        const char *k = tm_str_key(&t->tok2id, e, &kl);
        int32_t id = t->tok2id.ents[e].val;
        if (!t->id_str[id]) {
            t->id_str[id] = xstrdup(k, kl);
            if (!t->id_str[id]) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        }
    }
    for (int i = 0; i < t->n_added; i++) { /* added content wins for decoding */
        tok_added *a = &t->added[i];
        t->is_special[a->id] = a->special;
        /* NULL when the same content is listed under two ids (tok2id keeps one) */
        if (!t->id_str[a->id] || strcmp(t->id_str[a->id], a->content)) {
            free(t->id_str[a->id]);
            t->id_str[a->id] = xstrdup(a->content, a->len);
            if (!t->id_str[a->id]) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        }
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += t->id_str[i] ? strlen(t->id_str[i]) : 0;
    t->dec_bytes = TD_MALLOC(err, total + 1);
    if (!t->dec_bytes) return TD_ERR_NOMEM;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = t->id_str[i];
        if (!s) continue;
        size_t sl = strlen(s), bl;
        t->dec_off[i] = (uint32_t)off;
        if (!bytelevel_to_bytes(c2b, s, sl, t->dec_bytes + off, &bl)) {
            memcpy(t->dec_bytes + off, s, sl);
            bl = sl;
        }
        t->dec_len[i] = (uint32_t)bl;
        off += bl;
    }
    /* BPE works on raw bytes: key the model vocab (the first n_model
     * entries of tok2id) by its byte-level-decoded form. */
    uint8_t tmp[1024];
    for (size_t e = 0; e < t->n_model; e++) {
        size_t kl, bl;
        const char *k = tm_str_key(&t->tok2id, e, &kl);
        int32_t id = t->tok2id.ents[e].val;
        if (kl > sizeof tmp || !bytelevel_to_bytes(c2b, k, kl, tmp, &bl)) continue;
        if (td_tm_str_put(&t->bytes2id, tmp, bl, id)) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        if (bl == 1) t->byte_id[tmp[0]] = id;
    }
    return 0;
}

static char *token_name(json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    const char *s = json_string_value(v);
    return s ? xstrdup(s, strlen(s)) : NULL;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t r = fread(b + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) { free(b); b = NULL; }
            else b = nb;
        }
    }
    fclose(f);
    if (b) { b[n] = 0; if (len) *len = n; }
    return b;
}

static int parse_config(tok_chat_config *cfg, const char *path, const char *jinja_path, td_err *err) {
    json_error_t je;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return TD_FAIL(err, TD_ERR_FORMAT, "%s: not a regular file", path);
    if (jinja_path && stat(jinja_path, &st) == 0 && !S_ISREG(st.st_mode)) return TD_FAIL(err, TD_ERR_FORMAT, "%s: not a regular file", jinja_path);
    json_t *c = json_load_file(path, 0, &je);
    if (!c) {
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return TD_FAIL(err, TD_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        }
        /* the file is optional */
    } else {
        cfg->json = c;
        cfg->bos = token_name(json_object_get(c, "bos_token"));
        cfg->eos = token_name(json_object_get(c, "eos_token"));
        cfg->pad = token_name(json_object_get(c, "pad_token"));
        cfg->unk = token_name(json_object_get(c, "unk_token"));
        json_t *ct = json_object_get(c, "chat_template");
        if (json_is_string(ct)) {
            cfg->chat_template = xstrdup(json_string_value(ct), json_string_length(ct));
        } else if (json_is_array(ct)) { /* [{name, template}]: the "default" one */
            size_t i;
            json_t *v;
            json_array_foreach(ct, i, v) {
                const char *name = json_string_value(json_object_get(v, "name"));
                json_t *tp = json_object_get(v, "template");
                if (name && !strcmp(name, "default") && json_is_string(tp) && !cfg->chat_template)
                    cfg->chat_template = xstrdup(json_string_value(tp), json_string_length(tp));
            }
        }
    }
    if (jinja_path) {
        size_t n;
        char *s = read_file(jinja_path, &n);
        if (s) { /* transformers lets chat_template.jinja override the config */
            free(cfg->chat_template);
            cfg->chat_template = s;
        }
    }
    return 0;
}

int td_tok_chat_config_load(const char *dir, tok_chat_config *out, td_err *err) {
    memset(out, 0, sizeof *out);
    char a[4096], b[4096];
    if (snprintf(a, sizeof a, "%s/tokenizer_config.json", dir) >= (int)sizeof a ||
        snprintf(b, sizeof b, "%s/chat_template.jinja", dir) >= (int)sizeof b)
        return TD_FAIL(err, TD_ERR_ARG, "path too long");
    int rc = parse_config(out, a, b, err);
    if (rc) td_tok_chat_config_free(out);
    return rc;
}

void td_tok_chat_config_free(tok_chat_config *c) {
    json_decref(c->json);
    free(c->bos); free(c->eos); free(c->pad); free(c->unk); free(c->chat_template);
    memset(c, 0, sizeof *c);
}

int td_tok_load_files(const char *tokenizer_json, const char *config_json, tokenizer **out, td_err *err) {
    *out = NULL;
    tokenizer *t = TD_CALLOC(err, 1, sizeof *t);
    if (!t) return TD_ERR_NOMEM;
    pthread_mutex_init(&t->mu, NULL);
    int rc = 0;
    json_error_t je;
    struct stat stt;
    json_t *root = NULL;
    if (stat(tokenizer_json, &stt) == 0 && !S_ISREG(stt.st_mode)) { /* a FIFO would block the loader forever */
        rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: not a regular file", tokenizer_json);
        goto fail;
    }
    root = json_load_file(tokenizer_json, 0, &je);
    if (!root) {
        FILE *f = fopen(tokenizer_json, "rb");
        if (!f) rc = TD_FAIL(err, TD_ERR_IO, "cannot open %s", tokenizer_json);
        else {
            fclose(f);
            rc = TD_FAIL(err, TD_ERR_FORMAT, "%s:%d:%d: %s", tokenizer_json, je.line, je.column, je.text);
        }
        goto fail;
    }
    json_t *dec = json_object_get(root, "decoder");
    const char *dtype = json_string_value(json_object_get(dec, "type"));
    if (!dtype || strcmp(dtype, "ByteLevel")) {
        rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported decoder \"%s\"", dtype ? dtype : "null");
        goto fail;
    }
    t->byte_level_decoder = true;
    if ((rc = parse_model(t, json_object_get(root, "model"), err))) goto fail;
    if ((rc = parse_added(t, json_object_get(root, "added_tokens"), err))) goto fail;
    if ((rc = parse_normalizer(t, json_object_get(root, "normalizer"), err))) goto fail;
    if ((rc = parse_pretok(t, json_object_get(root, "pre_tokenizer"), err))) goto fail;
    if ((rc = parse_post(t, json_object_get(root, "post_processor"), err))) goto fail;
    if (t->n_pt == 0 || t->pt[t->n_pt - 1].kind != PT_BYTELEVEL) {
        rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported pre-tokenizer: BPE needs ByteLevel as the last pre-tokenizer");
        goto fail;
    }
    for (int i = 0; i + 1 < t->n_pt; i++)
        if (t->pt[i].kind == PT_BYTELEVEL) {
            rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "unsupported pre-tokenizer: ByteLevel before another pre-tokenizer");
            goto fail;
        }
    if ((rc = build_id_tables(t, err))) goto fail;
    if ((rc = resolve_merges(t, json_object_get(json_object_get(root, "model"), "merges"), err))) goto fail;
    if ((rc = prepare_added(t, err))) goto fail;
    json_decref(root);
    root = NULL;
    if (config_json) {
        char jp[4096];
        const char *slash = strrchr(config_json, '/');
        int dl = slash ? (int)(slash - config_json) : 1;
        snprintf(jp, sizeof jp, "%.*s/chat_template.jinja", dl, slash ? config_json : ".");
        if ((rc = parse_config(&t->cfg, config_json, jp, err))) goto fail;
    }
    *out = t;
    return 0;
fail:
    json_decref(root);
    td_tok_free(t);
    return rc;
}

int td_tok_load(const char *dir, tokenizer **out, td_err *err) {
    char a[4096], b[4096];
    if (snprintf(a, sizeof a, "%s/tokenizer.json", dir) >= (int)sizeof a ||
        snprintf(b, sizeof b, "%s/tokenizer_config.json", dir) >= (int)sizeof b)
        return TD_FAIL(err, TD_ERR_ARG, "path too long");
    return td_tok_load_files(a, b, out, err);
}

void td_tok_free(tokenizer *t) {
    if (!t) return;
    td_tok_encoder_free(t->enc);
    pthread_mutex_destroy(&t->mu);
    if (t->id_str)
        for (int32_t i = 0; i < t->n_ids; i++) free(t->id_str[i]);
    free(t->id_str); free(t->dec_off); free(t->dec_len); free(t->dec_bytes); free(t->is_special);
    td_tm_str_free(&t->tok2id);
    td_tm_str_free(&t->bytes2id);
    td_tm_u64_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].match != t->added[i].content) free(t->added[i].match);
        free(t->added[i].content);
    }
    free(t->added);
    for (int i = 0; i < t->n_pt; i++) pcre2_code_free(t->pt[i].re);
    td_tok_chat_config_free(&t->cfg);
    free(t);
}

int td_tok_vocab_size(const tokenizer *t) { return t->n_ids; }

int32_t td_tok_token_id(const tokenizer *t, const char *token) {
    int32_t id;
    return td_tm_str_get(&t->tok2id, token, strlen(token), &id) ? id : -1;
}

const char *td_tok_token_str(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->id_str[id] : NULL;
}

bool td_tok_is_special(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->is_special[id];
}

const char *td_tok_bos_token(const tokenizer *t) { return t->cfg.bos; }
const char *td_tok_eos_token(const tokenizer *t) { return t->cfg.eos; }
const char *td_tok_pad_token(const tokenizer *t) { return t->cfg.pad; }
const char *td_tok_unk_token(const tokenizer *t) { return t->cfg.unk; }
int32_t td_tok_bos_id(const tokenizer *t) { return t->cfg.bos ? td_tok_token_id(t, t->cfg.bos) : -1; }
int32_t td_tok_eos_id(const tokenizer *t) { return t->cfg.eos ? td_tok_token_id(t, t->cfg.eos) : -1; }
const char *td_tok_chat_template(const tokenizer *t) { return t->cfg.chat_template; }
const void *td_tok_config_json(const tokenizer *t) { return t->cfg.json; }
