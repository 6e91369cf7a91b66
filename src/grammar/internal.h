/* Internals shared by the grammar compilers (build.c, regex.c, schema.c) and
 * the matcher (match.c).
 *
 * Grammar: rules are alternatives of sequences of elements, stored flat:
 * rule r starts at elems[rule_start[r]]; alternatives are separated by E_ALT;
 * the rule ends with E_END. An element is (type << 30) | arg:
 *   E_BYTES arg = index of a 256-bit byte set (matches one byte in the set),
 *   E_REF   arg = rule id.
 * An empty alternative is epsilon; a rule that must never match holds the
 * empty byte set. Rule 0 is the root. Compilers never generate left
 * recursion; the matcher still terminates on it (depth bound + memo). */
#ifndef TANDEM_GRAMMAR_INTERNAL_H
#define TANDEM_GRAMMAR_INTERNAL_H
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "grammar/grammar.h"
#include "util/err.h"

enum { E_END = 0, E_ALT = 1, E_BYTES = 2, E_REF = 3 };
#define EL(t, a) (((uint32_t)(t) << 30) | (uint32_t)(a))
#define EL_T(e) ((e) >> 30)
#define EL_A(e) ((e) & 0x3fffffffu)

/* Limits on what untrusted schemas/regexes may make us build or walk. */
#define GR_MAX_ELEMS (1u << 21)   /* grammar elements (8 MiB) */
#define GR_MAX_RULES (1u << 19)
#define GR_MAX_SETS 65536
#define GR_MAX_DEPTH 256          /* frames in one parse stack */
#define GR_MAX_STACKS 4096        /* stacks in one matcher state */
#define GR_MAX_MEMO 65536         /* rule expansions per byte step */
#define GR_MAX_STATE_WORDS (1u << 16) /* frames of all stacks of one state (256 KiB) */
#define GR_MAX_MEMO_WORDS (1u << 20)  /* frames in one step's expansion memo (4 MiB) */
#define GR_MAX_NEST 64            /* schema / regex nesting */
#define GR_MAX_REPEAT 1000        /* {m,n}, minItems/maxItems, minLength/maxLength */
#define GR_MAX_WS 16

struct td_grammar {
    uint32_t *elems;
    uint32_t n_elems;
    uint32_t *rule_start;
    uint32_t n_rules;
    uint32_t (*sets)[8];
    uint32_t n_sets;
    /* mask cache, shared by all matchers of this grammar */
    pthread_mutex_t mu;
    struct gr_centry **tab;
    size_t tab_cap, n_entries, bytes, cap_bytes;
    struct gr_centry *fifo_head, *fifo_tail; /* eviction order: oldest first */
    uint64_t hits, misses;
};

/* ---- builder ---- */
typedef struct {
    uint32_t *v;
    uint32_t n, cap;
} gr_vec;

typedef struct gr_builder {
    gr_vec *rules;
    uint32_t n_rules, cap_rules;
    uint32_t (*sets)[8];
    uint32_t n_sets, cap_sets;
    uint32_t *set_ht; /* open addressing: set index + 1 */
    uint32_t set_ht_cap;
    uint64_t total; /* elements so far */
    int rc;          /* sticky first error */
    td_err *err;
    /* shared rules, created on demand (-1 = not yet) */
    int32_t r_ws, r_str, r_strchar, r_num, r_int, r_any_value[18], r_never;
    int max_ws;
} gr_builder;

void td_gb_init(gr_builder *b, td_err *err);
void td_gb_free(gr_builder *b);
int td_gb_fail(gr_builder *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int32_t td_gb_rule(gr_builder *b);                       /* new empty rule (epsilon until filled) */
void td_gb_push(gr_builder *b, int32_t r, uint32_t el);  /* append an element */
void td_gb_alt(gr_builder *b, int32_t r);                /* start a new alternative */
void td_gb_ref(gr_builder *b, int32_t r, int32_t target);
uint32_t td_gb_set(gr_builder *b, const uint32_t set[8]); /* dedup'd byte set index */
void td_gb_byte_range(gr_builder *b, int32_t r, int lo, int hi);
void td_gb_lit(gr_builder *b, int32_t r, const void *bytes, size_t n);
int32_t td_gb_never(gr_builder *b);                      /* a rule matching nothing */
/* Grammar from the builder with root rule `root` (copied to rule 0 position by
 * a wrapper rule); frees the builder. */
int td_gb_finish(gr_builder *b, int32_t root, const td_grammar_opts *o, td_grammar **out);

/* Code-point sets: sorted disjoint inclusive ranges. */
typedef struct {
    uint32_t (*r)[2];
    int n, cap;
} cpset;
void td_cps_add(gr_builder *b, cpset *s, uint32_t lo, uint32_t hi); /* union (unnormalized) */
void td_cps_norm(cpset *s);                                         /* sort + merge */
void td_cps_negate(gr_builder *b, cpset *s);                        /* complement in [0, 0x10FFFF] */
void td_cps_free(cpset *s);
/* Rule matching one code point of s as UTF-8 (surrogates excluded). json: the
 * code point as it appears inside a JSON string: '"' '\\' and controls as their
 * canonical escapes (\" \\ \n \t \r \b \f \u00XX), the rest raw. */
int32_t td_gb_cpset_rule(gr_builder *b, const cpset *s, bool json);
/* Appends one code point to rule r (UTF-8, or JSON-escaped as above). */
void td_gb_cp(gr_builder *b, int32_t r, uint32_t cp, bool json);
/* Rule matching exactly one of the n byte strings (a trie: deterministic). */
int32_t td_gb_literals(gr_builder *b, const uint8_t *const *s, const size_t *len, int n);
/* Bounded repetition of element sequence el[0..n) (a unit): {lo,hi}, hi < 0 = unbounded. */
void td_gb_repeat(gr_builder *b, int32_t r, const uint32_t *el, int n, int lo, int hi);

/* JSON building blocks (schema.c) used by regex.c for patterns. */
int td_gr_regex_compile(gr_builder *b, const char *re, size_t len, bool json, bool search, int32_t *rule);

#endif
