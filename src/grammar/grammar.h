/* Grammar engine for constrained decoding (structured outputs).
 *
 * A compiled grammar (JSON Schema, any JSON object, regex, choice) is a small
 * byte-level context-free grammar. A matcher tracks one request's parse state
 * (a deduplicated set of parse stacks, as llama.cpp's GBNF matcher) and gives,
 * at each step, the bitmask of vocabulary tokens whose bytes keep the output a
 * prefix of the language. Masks are computed by a DFS over a byte trie of the
 * vocabulary and cached per (grammar state, vocabulary) in a bounded,
 * mutex-guarded table on the grammar, shared by every request using it.
 *
 * Masks: ceil(V/32) uint32 words; bit t%32 of word t/32 = token t allowed.
 * In any reachable state the mask is non-empty while the grammar can still be
 * completed with the vocabulary (end ids are allowed exactly where the grammar
 * may end). A state with no allowed token at all (e.g. a regex needing a byte no
 * token has, or one whose continuations all exceed the matcher's depth limit)
 * gives an all-zero mask: the caller ends the request.
 * Supported subsets and limits: src/grammar/README.md. */
#ifndef TANDEM_GRAMMAR_H
#define TANDEM_GRAMMAR_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tandem.h"

typedef struct td_grammar td_grammar;             /* compiled; immutable except its mask cache; thread-safe */
typedef struct td_grammar_vocab td_grammar_vocab; /* token bytes + byte trie; immutable, shareable */
typedef struct td_matcher td_matcher;             /* one request's state; single-threaded */

/* Compile options. NULL = td_grammar_opts_default(). */
typedef struct td_grammar_opts {
    /* Whitespace characters ([ \t\n\r]) allowed at each place JSON allows
     * whitespace (after '{' '[' ',' ':' and before '}' ']' ',' ':'). 0 = none
     * (compact output: {"a":1,"b":[2]}); capped at 16. Default 1 (", " and ": "
     * separators allowed). Bounded so that a weak model cannot emit whitespace
     * forever. Ignored by regex and choice. */
    int max_ws;
    /* json_schema: a missing additionalProperties means false (OpenAI strict
     * mode). Otherwise it means true, as JSON Schema says. */
    bool strict;
    /* Bytes of mask cache on this grammar (all vocabularies together); 0 =
     * default 64 MiB. */
    size_t cache_bytes;
} td_grammar_opts;

td_grammar_opts td_grammar_opts_default(void);

/* tok_bytes[i]/tok_len[i]: raw bytes of token i (tok_bytes[i] == NULL or
 * tok_len[i] == 0: a special/control token that a grammar never allows).
 * end_ids: ids that end generation (EOS and stop ids), allowed only where the
 * grammar may end. The bytes are copied. */
int td_grammar_vocab_new(int n_vocab, const uint8_t *const *tok_bytes, const size_t *tok_len,
                         const int32_t *end_ids, int n_end, td_grammar_vocab **out, td_err *err);
void td_grammar_vocab_free(td_grammar_vocab *v);
int td_grammar_vocab_size(const td_grammar_vocab *v);

/* Compilers. Unsupported features: TD_ERR_UNSUPPORTED with a message naming
 * them (never a silently looser grammar); bad input: TD_ERR_ARG; input over a
 * size/depth limit: TD_ERR_LIMIT. */
int td_grammar_json_schema(const char *schema, size_t len, const td_grammar_opts *o, td_grammar **out,
                           td_err *err);
/* Any JSON object (response_format json_object), nesting depth <= 16. */
int td_grammar_json_object(const td_grammar_opts *o, td_grammar **out, td_err *err);
/* The whole output matches the regex (fullmatch). */
int td_grammar_regex(const char *re, size_t len, const td_grammar_opts *o, td_grammar **out, td_err *err);
/* The output is exactly one of the n byte strings. */
int td_grammar_choice(const char *const *choices, const size_t *lens, int n, const td_grammar_opts *o,
                      td_grammar **out, td_err *err);
void td_grammar_free(td_grammar *g);

/* Mask-cache counters (for tests and metrics). */
void td_grammar_cache_stats(const td_grammar *g, uint64_t *hits, uint64_t *misses, size_t *entries);

/* A matcher of grammar g over vocabulary v (both borrowed; must outlive it). */
int td_matcher_new(const td_grammar *g, const td_grammar_vocab *v, td_matcher **out, td_err *err);
void td_matcher_free(td_matcher *m);
/* Commits one token: 0, or TD_ERR_ARG if it is not allowed (state unchanged).
 * An end id is allowed only where the grammar may end; the matcher is then
 * finished and allows nothing more. */
int td_matcher_accept(td_matcher *m, int32_t tok);
/* Commits raw bytes (e.g. a forced prefix): 0, or TD_ERR_ARG (state unchanged). */
int td_matcher_accept_bytes(td_matcher *m, const uint8_t *bytes, size_t len);
/* Allowed-token mask in the state reached from the committed one by the n
 * (0 <= n <= 16) speculative tokens spec[0..n), without committing them; NULL
 * when spec is not a valid continuation (or n is out of range). After an end
 * id (or on a finished matcher) the mask is all-zero. The words are owned by m
 * and valid until the next call on m. */
const uint32_t *td_matcher_mask(td_matcher *m, const int32_t *spec, int n);
bool td_matcher_finished(const td_matcher *m); /* an end id was accepted */
bool td_matcher_can_end(const td_matcher *m);  /* the committed bytes are a complete match */
/* The committed bytes are complete and nothing may follow: only end ids are allowed. */
bool td_matcher_must_end(const td_matcher *m);
/* A new matcher in m's committed state (e.g. to fork a request or to check
 * masks by brute force). */
int td_matcher_clone(const td_matcher *m, td_matcher **out, td_err *err);
/* Back to the start state (same grammar and vocabulary). */
void td_matcher_reset(td_matcher *m);

#endif
