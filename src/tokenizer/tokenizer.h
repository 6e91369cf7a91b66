/* Byte-level BPE tokenizer compatible with Hugging Face `tokenizers`
 * (tokenizer.json) for the Qwen2/Qwen3/Qwen3.5 family.
 *
 * Pipeline (same order as tokenizers' Tokenizer::encode):
 *   invalid UTF-8 -> U+FFFD (maximal-subpart rule, as Python's
 *   bytes.decode('utf-8', 'replace'))
 *   -> split out added tokens that are not `normalized` (leftmost-longest)
 *   -> normalizer (NFC / Sequence) on the remaining pieces
 *   -> split out `normalized` added tokens
 *   -> pre-tokenizer (Split regex + ByteLevel) -> BPE (with a word cache)
 *   -> post-processor (ByteLevel: nothing; TemplateProcessing: single).
 *
 * Thread safety: a loaded tokenizer is immutable except for its built-in
 * encoder (word cache), which is guarded by a mutex; concurrent callers
 * that find it busy use a temporary encoder. For heavy multi-threaded use
 * give each thread its own tok_encoder. */
#ifndef TANDEM_TOKENIZER_H
#define TANDEM_TOKENIZER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tandem.h"

typedef struct tokenizer tokenizer;
typedef struct tok_encoder tok_encoder;

/* Loads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json and
 * DIR/chat_template.jinja. Unsupported components are TD_ERR_UNSUPPORTED
 * errors naming the component. */
int td_tok_load(const char *dir, tokenizer **out, td_err *err);
/* Loads from explicit paths (config_path may be NULL). */
int td_tok_load_files(const char *tokenizer_json, const char *config_json, tokenizer **out, td_err *err);
void td_tok_free(tokenizer *t);

/* Number of ids (max id + 1, counting added tokens). */
int td_tok_vocab_size(const tokenizer *t);
/* Id of a token given its surface form (added-token content or the
 * byte-level vocab string), or -1. */
int32_t td_tok_token_id(const tokenizer *t, const char *token);
/* Surface form of an id as stored in tokenizer.json (byte-level string for
 * vocab tokens), or NULL for an unknown id. Owned by t. */
const char *td_tok_token_str(const tokenizer *t, int32_t id);
/* Whether the id is an added token marked special. */
bool td_tok_is_special(const tokenizer *t, int32_t id);

/* Special tokens named in tokenizer_config.json (NULL when absent), their ids
 * (-1 when absent), and the chat template (tokenizer_config.json
 * "chat_template" string or its "default" entry, else chat_template.jinja;
 * NULL if none). All owned by t. */
const char *td_tok_bos_token(const tokenizer *t);
const char *td_tok_eos_token(const tokenizer *t);
const char *td_tok_pad_token(const tokenizer *t);
const char *td_tok_unk_token(const tokenizer *t);
int32_t td_tok_bos_id(const tokenizer *t);
int32_t td_tok_eos_id(const tokenizer *t);
const char *td_tok_chat_template(const tokenizer *t);
/* tokenizer_config.json parsed (a jansson json_t *, borrowed), or NULL. */
const void *td_tok_config_json(const tokenizer *t);

/* Encodes len bytes of text. *ids is malloc'd (caller frees), *n_ids its
 * length. add_special: apply the post-processor's special tokens (BOS/EOS
 * of a TemplateProcessing; Qwen adds none). Added tokens in the text are
 * always recognised, as in `tokenizers`. */
int td_tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
               size_t *n_ids, td_err *err);

/* A per-thread encoder: scratch buffers and a cache of pre-token -> ids. */
int td_tok_encoder_new(const tokenizer *t, tok_encoder **out, td_err *err);
void td_tok_encoder_free(tok_encoder *e);
int td_tok_encoder_encode(tok_encoder *e, const char *text, size_t len, bool add_special, int32_t **ids,
                       size_t *n_ids, td_err *err);

/* Decodes ids to UTF-8 (malloc'd, NUL-terminated; *len without the NUL).
 * Unknown ids are skipped (as `tokenizers` does); byte sequences that are
 * not valid UTF-8 become U+FFFD (maximal-subpart rule). */
int td_tok_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out,
               size_t *len, td_err *err);
/* Raw bytes of one id after the ByteLevel decoder (may be part of a UTF-8
 * sequence); NULL for an unknown id. */
const uint8_t *td_tok_id_bytes(const tokenizer *t, int32_t id, size_t *len);

/* Incremental detokenizer for streaming: push ids, receive text that never
 * ends in the middle of a code point. The concatenation of everything it
 * returns, plus td_tok_stream_flush, equals td_tok_decode of all ids. */
typedef struct tok_stream {
    const tokenizer *tok;
    bool skip_special;
    uint8_t pend[4];   /* bytes of an incomplete UTF-8 sequence */
    int npend;
    char *buf;         /* output of the last call, NUL-terminated */
    size_t cap;
} tok_stream;
void td_tok_stream_init(tok_stream *s, const tokenizer *t, bool skip_special);
void td_tok_stream_free(tok_stream *s);
/* Feeds one id; *text (owned by s, valid until the next call) receives the
 * newly completed text (possibly ""). */
int td_tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len, td_err *err);
/* Ends the stream: a pending incomplete sequence becomes U+FFFD. */
int td_tok_stream_flush(tok_stream *s, const char **text, size_t *len, td_err *err);

/* Just the chat-related part of a model directory: tokenizer_config.json
 * (special tokens, chat_template) and chat_template.jinja, without the
 * vocabulary. Strings are NULL when absent. */
typedef struct tok_chat_config {
    char *bos, *eos, *pad, *unk, *chat_template;
    void *json; /* json_t * of tokenizer_config.json, or NULL */
} tok_chat_config;
int td_tok_chat_config_load(const char *dir, tok_chat_config *out, td_err *err);
void td_tok_chat_config_free(tok_chat_config *c);

/* UTF-8 helpers shared with the template engine. */
/* Appends src (n bytes) to a malloc'd buffer with invalid sequences
 * replaced by U+FFFD; returns the new buffer (NUL-terminated) or NULL. */
char *td_tok_utf8_sanitize(const char *src, size_t n, size_t *out_len);
/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid /
 * truncated; *maximal_invalid gets the length of the maximal invalid
 * subpart to replace with one U+FFFD when it returns 0. */
int td_tok_utf8_seq(const uint8_t *s, size_t n, int *maximal_invalid);

#endif
