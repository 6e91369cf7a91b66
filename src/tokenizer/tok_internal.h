/* Internal layout of the tokenizer, shared by tok_load.c, tok_encode.c and
 * tok_decode.c. Not part of the API. */
#ifndef TANDEM_TOK_INTERNAL_H
#define TANDEM_TOK_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include "tokenizer/tokenizer.h"
#include "tokenizer/tok_map.h"

typedef struct {
    char *content;      /* as given (UTF-8) */
    size_t len;
    char *match;        /* what is searched: content, NFC-normalized if `normalized` */
    size_t match_len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} tok_added;

enum { NORM_NFC = 1, NORM_NFD, NORM_NFKC, NORM_NFKD };
enum { PT_SPLIT = 1, PT_BYTELEVEL };
enum { SPLIT_ISOLATED = 1, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT };

typedef struct {
    int kind;
    pcre2_code *re;     /* PT_SPLIT, or PT_BYTELEVEL with use_regex */
    int behavior;
    bool add_prefix_space;
} tok_pt_step;

#define TOK_MAX_NORM 8
#define TOK_MAX_PT 8

struct tokenizer {
    int32_t n_ids;             /* max id + 1 */
    char **id_str;             /* id -> surface string (NULL if unused id) */
    uint32_t *dec_off, *dec_len; /* id -> bytes after the ByteLevel decoder */
    uint8_t *dec_bytes;
    uint8_t *is_special;       /* id -> special added token */
    tm_strmap tok2id;          /* surface string -> id (vocab and added) */
    size_t n_model;            /* tok2id entries [0, n_model) are model.vocab */
    tm_strmap bytes2id;        /* raw bytes -> id (model vocab only) */
    int32_t byte_id[256];      /* single byte -> id, -1 if absent */
    tm_u64map merges;          /* (a<<32|b) -> (rank<<32 | merged id) */
    bool ignore_merges;

    tok_added *added;
    int n_added;
    bool first_raw[256], first_norm[256]; /* first bytes of (non-)normalized added tokens */
    bool any_norm_added;

    int norm[TOK_MAX_NORM];
    int n_norm;
    tok_pt_step pt[TOK_MAX_PT];
    int n_pt;
    bool byte_level_decoder;

    int32_t post_pre[8], post_post[8]; /* TemplateProcessing "single" around $A */
    int n_post_pre, n_post_post;

    tok_chat_config cfg;       /* tokenizer_config.json / chat_template.jinja */

    pthread_mutex_t mu;        /* guards enc */
    tok_encoder *enc;
};

/* The GPT-2 byte <-> unicode mapping used by ByteLevel. */
void td_tok_bytelevel_tables(uint32_t byte2cp[256]);
/* Normalizes text with the tokenizer's normalizers; returns a malloc'd
 * buffer (or NULL with *same set when the text is unchanged). */
char *td_tok_normalize(const tokenizer *t, const char *s, size_t n, size_t *out_len, bool *same);
#endif
