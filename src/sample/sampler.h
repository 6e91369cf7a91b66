/* Token sampling for one request: penalties, temperature, top-k, top-p,
 * min-p and a seeded RNG owned by the sampler (same seed, same output).
 * Order (as transformers' logits processors): repetition penalty,
 * presence/frequency penalties, temperature, top-k, top-p, min-p. */
#ifndef TANDEM_SAMPLE_SAMPLER_H
#define TANDEM_SAMPLE_SAMPLER_H
#include <stdint.h>
#include "tandem.h"

typedef struct td_rng { uint64_t s[4]; } td_rng;
void td_rng_seed(td_rng *r, uint64_t seed);
uint64_t td_rng_next(td_rng *r);
double td_rng_uniform(td_rng *r); /* [0, 1) */

struct td_backend;

typedef struct td_sampler {
    struct td_backend *b;  /* NULL: the arrays below are host memory and every call runs here; else they
                              are that backend's memory and every call that reads logits, probabilities
                              or the arrays runs as its `sample` op (only ids and flags cross) */
    td_sampling p;
    int vocab;
    uint32_t *counts;      /* [vocab] occurrences in the generated output */
    uint8_t *in_prompt;    /* [vocab] 1 when the token is in the prompt */
    float *work;           /* [vocab] processed logits / probabilities */
    int32_t *idx;          /* [vocab] sort scratch */
    float *probs;          /* [vocab] td_sampler_sample's distribution */
    td_rng rng;
    td_logit_bias *bias;   /* owned copy of p.logit_bias (n_bias entries) */
    int n_bias;
    const uint32_t *mask;  /* allowed tokens (bit t%32 of word t/32) or NULL: the others get -inf
                              before every processor (set per call by td_sampler_set_mask; with a
                              backend, the backend copy in dmask) */
    uint32_t *dmask;       /* backend [vocab/32] copy of the mask (backend samplers) */
} td_sampler;

int td_sampler_init(td_sampler *s, const td_sampling *p, int vocab, const int32_t *prompt, int n_prompt, td_err *err);
/* The same with the arrays in backend memory (b borrowed): logits and
 * probabilities passed to it are then backend memory too; a mask set with
 * td_sampler_set_mask (host memory) is uploaded (V/32 words per call). */
int td_sampler_init_backend(td_sampler *s, struct td_backend *b, const td_sampling *p, int vocab, const int32_t *prompt, int n_prompt,
                            td_err *err);
void td_sampler_free(td_sampler *s);
/* Restricts the next calls to the tokens of mask (host memory, borrowed;
 * NULL = all), as vLLM's structured-output bitmask: masked tokens are -inf
 * logits. A backend sampler uploads it (as vLLM uploads its bitmask). */
void td_sampler_set_mask(td_sampler *s, const uint32_t *mask);
/* Whether token t is allowed by mask (NULL: every token). */
static inline int td_mask_allows(const uint32_t *mask, int32_t t) { return !mask || ((mask[t >> 5] >> (t & 31)) & 1u); }
/* Whether mask allows no token of [0, vocab). */
int td_mask_empty(const uint32_t *mask, int vocab);
/* The argmax of logits + logit_bias over the tokens of mask (NULL: all):
 * argmax drafts are proposed under the bias. */
int32_t td_sampler_draft_argmax(td_sampler *s, const float *logits, const uint32_t *mask);
/* Records a generated token (for penalties). */
void td_sampler_accept(td_sampler *s, int32_t tok);
/* True when sampling reduces to argmax (temperature 0). */
int td_sampler_is_greedy(const td_sampler *s);
/* Greedy with no penalty and no logit_bias: the token is the plain argmax of
 * the logits (what the backend's argmax op computes, ties to the lowest id). */
int td_sampler_is_plain_greedy(const td_sampler *s);
/* Whether a repetition, presence or frequency penalty is set. */
int td_sampler_has_penalties(const td_sampler *s);
/* The rejection test's arithmetic on the two values it reads (p[d], q[d];
 * qd = 1 for a one-hot draft): true when u < pd / qd for a fresh uniform u
 * from the sampler's RNG. td_sampler_accept_draft is this on its rows; a
 * backend op that reads only those two values calls it. */
int td_sampler_accept_test(td_sampler *s, float pd, float qd);
/* Applies penalties to a copy of logits; greedy: returns the argmax. */
int32_t td_sampler_greedy(td_sampler *s, const float *logits);
/* Writes the final normalized distribution (after every processor) into
 * probs[vocab]. Not valid for greedy samplers. */
void td_sampler_probs(td_sampler *s, const float *logits, float *probs);
/* Draws from a normalized distribution with the sampler's RNG. */
int32_t td_sample_from(td_sampler *s, const float *probs);
/* One step: greedy argmax or a draw from td_sampler_probs. */
int32_t td_sampler_sample(td_sampler *s, const float *logits);
/* Rejection test of draft d (speculative sampling): true when u < p[d] / q[d]
 * for a fresh uniform u (q NULL: one-hot at d, q[d] = 1). */
int td_sampler_accept_draft(td_sampler *s, const float *p, const float *q, int32_t d);
/* After a rejection: draws from normalize(max(0, p - q)) (q NULL: one-hot at d);
 * p is overwritten. */
int32_t td_sampler_residual(td_sampler *s, float *p, const float *q, int32_t d);

/* One sampler call as the backend's `sample` op receives it; the CPU op is
 * td_sampler_run (these same functions on its memory). */
typedef enum {
    TD_SAMPLE_SAMPLE, TD_SAMPLE_GREEDY, TD_SAMPLE_PROBS, TD_SAMPLE_FROM, TD_SAMPLE_DRAFT_ARGMAX, TD_SAMPLE_ACCEPT,
    TD_SAMPLE_ACCEPT_DRAFT, TD_SAMPLE_RESIDUAL
} td_sample_kind;
typedef struct td_sample_call {
    td_sample_kind kind;
    const float *x;   /* logits or probabilities row */
    float *out;       /* PROBS: the distribution; RESIDUAL: p (overwritten) */
    const float *q;   /* ACCEPT_DRAFT, RESIDUAL: the draft distribution or NULL */
    int32_t token;    /* ACCEPT: the token; ACCEPT_DRAFT, RESIDUAL: the draft */
} td_sample_call;
int32_t td_sampler_run(td_sampler *s, const td_sample_call *c);
#endif
