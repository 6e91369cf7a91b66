#include "sample/sampler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "util/err.h"

void td_sampling_default(td_sampling *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

uint64_t td_rng_next(td_rng *r);

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
void td_rng_seed(td_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
    /* Consecutive seeds (a benchmark's 1, 2, 3, ...) gave measurably
     * correlated early outputs in a chi-square test; warming the state up
     * removes that. */
    for (int i = 0; i < 16; i++) (void)td_rng_next(r);
}
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t td_rng_next(td_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return out;
}
double td_rng_uniform(td_rng *r) { return (double)(td_rng_next(r) >> 11) * 0x1.0p-53; }

int td_sampler_init(td_sampler *s, const td_sampling *p, int vocab, const int32_t *prompt, int n_prompt, td_err *err) {
    memset(s, 0, sizeof *s);
    if (!(p->temperature >= 0.0f) || !(p->top_p > 0.0f && p->top_p <= 1.0f) || !(p->min_p >= 0.0f && p->min_p <= 1.0f) ||
        p->top_k < 0 || !(p->repetition_penalty > 0.0f))
        return TD_FAIL(err, TD_ERR_ARG, "invalid sampling parameters (temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, top_k >= 0, repetition_penalty > 0)");
    s->p = *p;
    s->vocab = vocab;
    s->counts = TD_CALLOC(err, (size_t)vocab, sizeof *s->counts);
    s->in_prompt = TD_CALLOC(err, (size_t)vocab, 1);
    s->work = TD_MALLOC(err, (size_t)vocab * sizeof(float));
    s->idx = TD_MALLOC(err, (size_t)vocab * sizeof(int32_t));
    if (!s->counts || !s->in_prompt || !s->work || !s->idx) { td_sampler_free(s); return TD_ERR_NOMEM; }
    if (p->n_logit_bias > 0 && p->logit_bias) { /* own copy: the caller's request may go first */
        s->bias = TD_MALLOC(err, (size_t)p->n_logit_bias * sizeof *s->bias);
        if (!s->bias) { td_sampler_free(s); return TD_ERR_NOMEM; }
        for (int i = 0; i < p->n_logit_bias; i++)
            if (p->logit_bias[i].token >= 0 && p->logit_bias[i].token < vocab) s->bias[s->n_bias++] = p->logit_bias[i];
    }
    s->p.logit_bias = NULL;
    s->p.n_logit_bias = 0;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < vocab) s->in_prompt[prompt[i]] = 1;
    td_rng_seed(&s->rng, p->seed);
    return TD_OK;
}

int td_sampler_init_backend(td_sampler *s, td_backend *b, const td_sampling *p, int vocab, const int32_t *prompt, int n_prompt,
                            td_err *err) {
    int rc = td_sampler_init(s, p, vocab, prompt, n_prompt, err); /* validation, bias, in_prompt, the RNG */
    if (rc) return rc;
    uint8_t *in_prompt = s->in_prompt;
    free(s->counts); free(s->work); free(s->idx);
    s->counts = NULL; s->work = NULL; s->idx = NULL; s->in_prompt = NULL;
    s->b = b;
    size_t V = (size_t)vocab;
    s->counts = b->ops->alloc(b, V * sizeof *s->counts);
    s->in_prompt = b->ops->alloc(b, V);
    s->work = b->ops->alloc(b, V * sizeof(float));
    s->idx = b->ops->alloc(b, V * sizeof(int32_t));
    s->probs = b->ops->alloc(b, V * sizeof(float));
    if (!s->counts || !s->in_prompt || !s->work || !s->idx || !s->probs) {
        free(in_prompt);
        td_sampler_free(s);
        return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for a sampler");
    }
    td_bk_upload(b, s->in_prompt, in_prompt, V);
    free(in_prompt);
    return TD_OK;
}

void td_sampler_free(td_sampler *s) {
    if (s->b) {
        td_backend *b = s->b;
        b->ops->free(b, s->counts); b->ops->free(b, s->in_prompt); b->ops->free(b, s->work); b->ops->free(b, s->idx);
        b->ops->free(b, s->probs);
        b->ops->free(b, s->dmask);
    } else {
        free(s->counts); free(s->in_prompt); free(s->work); free(s->idx); free(s->probs);
    }
    free(s->bias);
    memset(s, 0, sizeof *s);
}

static void ref_accept(td_sampler *s, int32_t tok) {
    if (tok >= 0 && tok < s->vocab) s->counts[tok]++;
}

/* below vLLM's _SAMPLING_EPS (1e-5) is greedy: 1/T would overflow the logits */
int td_sampler_is_greedy(const td_sampler *s) { return s->p.temperature < 1e-5f; }

static int has_penalties(const td_sampler *s) {
    return s->p.repetition_penalty != 1.0f || s->p.presence_penalty != 0.0f || s->p.frequency_penalty != 0.0f;
}

void td_sampler_set_mask(td_sampler *s, const uint32_t *mask) {
    if (!s->b || !mask) { s->mask = mask; return; }
    /* a backend sampler reads the mask in backend memory: one upload of V/32 words */
    size_t words = ((size_t)s->vocab + 31) / 32;
    if (!s->dmask) s->dmask = s->b->ops->alloc(s->b, words * sizeof(uint32_t));
    TD_ASSERT(s->dmask); /* a few KiB; only under backend memory exhaustion */
    td_bk_upload(s->b, s->dmask, mask, words * sizeof(uint32_t));
    s->mask = s->dmask;
}

int td_mask_empty(const uint32_t *mask, int vocab) {
    if (!mask) return 0;
    for (int w = 0; w < vocab / 32; w++)
        if (mask[w]) return 0;
    for (int t = vocab / 32 * 32; t < vocab; t++)
        if (td_mask_allows(mask, t)) return 0;
    return 1;
}

/* work = logits with the mask and penalties applied. */
static void penalize(td_sampler *s, const float *logits) {
    memcpy(s->work, logits, (size_t)s->vocab * sizeof(float));
    for (int i = 0; i < s->n_bias; i++) s->work[s->bias[i].token] += s->bias[i].bias; /* logit_bias first, as vLLM */
    if (s->mask)
        for (int i = 0; i < s->vocab; i++)
            if (!td_mask_allows(s->mask, i)) s->work[i] = -INFINITY;
    if (!has_penalties(s)) return;
    float rp = s->p.repetition_penalty;
    for (int i = 0; i < s->vocab; i++) {
        float *x = &s->work[i];
        if (rp != 1.0f && (s->counts[i] || s->in_prompt[i])) *x = *x > 0 ? *x / rp : *x * rp;
        if (s->counts[i]) *x -= s->p.frequency_penalty * (float)s->counts[i] + s->p.presence_penalty;
    }
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int32_t ref_draft_argmax(td_sampler *s, const float *logits, const uint32_t *mask) {
    const float *bl = logits;
    if (s->n_bias) {
        memcpy(s->work, logits, (size_t)s->vocab * sizeof(float));
        for (int i = 0; i < s->n_bias; i++) s->work[s->bias[i].token] += s->bias[i].bias;
        bl = s->work;
    }
    int32_t best = -1;
    for (int i = 0; i < s->vocab; i++)
        if (td_mask_allows(mask, i) && (best < 0 || bl[i] > bl[best])) best = i;
    return best;
}

/* argmax over the tokens of mask (the first of equal maxima, as argmax):
 * no copy of the logits, words without an allowed token skipped. */
static int32_t argmax_masked(const float *x, int n, const uint32_t *mask) {
    int32_t best = -1;
    for (int w = 0; w * 32 < n; w++)
        for (uint32_t b = mask[w]; b; b &= b - 1) {
            int t = w * 32 + __builtin_ctz(b);
            if (t >= n) break;
            if (best < 0 || x[t] > x[best]) best = t;
        }
    return best < 0 ? 0 : best;
}

int td_sampler_is_plain_greedy(const td_sampler *s) { return td_sampler_is_greedy(s) && !has_penalties(s) && !s->n_bias; }
int td_sampler_has_penalties(const td_sampler *s) { return has_penalties(s); }

static int32_t ref_greedy(td_sampler *s, const float *logits) {
    if (!has_penalties(s) && !s->n_bias && s->mask) return argmax_masked(logits, s->vocab, s->mask);
    if (!has_penalties(s) && !s->mask && !s->n_bias) return argmax(logits, s->vocab);
    penalize(s, logits);
    return argmax(s->work, s->vocab);
}

static int cmp_desc(const void *a, const void *b, void *keys) {
    const float *k = keys;
    float x = k[*(const int32_t *)a], y = k[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

static void ref_probs(td_sampler *s, const float *logits, float *probs) {
    int V = s->vocab;
    penalize(s, logits);
    float *x = s->work, inv_t = 1.0f / (s->p.temperature > 0 ? s->p.temperature : 1.0f);
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) { x[i] *= inv_t; if (x[i] > mx) mx = x[i]; }
    double sum = 0.0;
    for (int i = 0; i < V; i++) { probs[i] = expf(x[i] - mx); sum += probs[i]; }
    for (int i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);
    int need_sort = (s->p.top_k > 0 && s->p.top_k < V) || s->p.top_p < 1.0f;
    if (need_sort) {
        /* Sorted by probability, descending, ties by id: a total order. */
        for (int i = 0; i < V; i++) s->idx[i] = i;
        qsort_r(s->idx, (size_t)V, sizeof(int32_t), cmp_desc, probs);
        int keep = V;
        if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
        if (s->p.top_p < 1.0f) {
            double kept = 0.0;
            for (int i = 0; i < keep; i++) kept += probs[s->idx[i]];
            double cum = 0.0;
            int n = 0;
            for (; n < keep; n++) { /* smallest prefix whose mass reaches top_p (of the top-k mass) */
                cum += probs[s->idx[n]];
                if (cum >= s->p.top_p * kept) { n++; break; }
            }
            keep = n < 1 ? 1 : n;
        }
        for (int i = keep; i < V; i++) probs[s->idx[i]] = 0.0f;
    }
    if (s->p.min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < V; i++) if (probs[i] > pmax) pmax = probs[i];
        for (int i = 0; i < V; i++) if (probs[i] < s->p.min_p * pmax) probs[i] = 0.0f;
    }
    sum = 0.0;
    for (int i = 0; i < V; i++) sum += probs[i];
    for (int i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);
}

static int32_t ref_from(td_sampler *s, const float *probs) {
    double u = td_rng_uniform(&s->rng), cum = 0.0;
    int32_t last = 0;
    for (int i = 0; i < s->vocab; i++) {
        if (probs[i] <= 0.0f) continue;
        cum += probs[i];
        last = i;
        if (u < cum) return i;
    }
    return last; /* rounding: u beyond the accumulated mass */
}

static int32_t ref_sample(td_sampler *s, const float *logits) {
    if (td_sampler_is_greedy(s)) return ref_greedy(s, logits);
    float *probs = s->probs ? s->probs : malloc((size_t)s->vocab * sizeof(float));
    if (!probs) return ref_greedy(s, logits);
    ref_probs(s, logits, probs);
    int32_t t = ref_from(s, probs);
    if (probs != s->probs) free(probs);
    return t;
}

int td_sampler_accept_test(td_sampler *s, float pd, float qd) {
    double u = td_rng_uniform(&s->rng);
    return qd > 0 && u < (double)pd / qd;
}

static int ref_accept_draft(td_sampler *s, const float *p, const float *q, int32_t d) {
    return td_sampler_accept_test(s, p[d], q ? q[d] : 1.0f);
}

static int32_t ref_residual(td_sampler *s, float *p, const float *q, int32_t d) {
    double sum = 0;
    for (int i = 0; i < s->vocab; i++) {
#ifdef TD_MUTATE_RESIDUAL /* test-only build: a deliberately wrong residual */
        float r = p[i];
        (void)q;
#else
        float r = q ? p[i] - q[i] : (i == d ? 0.0f : p[i]);
#endif
        p[i] = r > 0 ? r : 0.0f;
        sum += p[i];
    }
    if (sum <= 0) return d; /* p == q: rejection had probability 0 */
    for (int i = 0; i < s->vocab; i++) p[i] = (float)(p[i] / sum);
    return ref_from(s, p);
}

int32_t td_sampler_run(td_sampler *s, const td_sample_call *c) {
    switch (c->kind) {
    case TD_SAMPLE_SAMPLE: return ref_sample(s, c->x);
    case TD_SAMPLE_GREEDY: return ref_greedy(s, c->x);
    case TD_SAMPLE_PROBS: ref_probs(s, c->x, c->out); return 0;
    case TD_SAMPLE_FROM: return ref_from(s, c->x);
    case TD_SAMPLE_DRAFT_ARGMAX: return ref_draft_argmax(s, c->x, s->mask);
    case TD_SAMPLE_ACCEPT: ref_accept(s, c->token); return 0;
    case TD_SAMPLE_ACCEPT_DRAFT: return ref_accept_draft(s, c->x, c->q, c->token);
    case TD_SAMPLE_RESIDUAL: return ref_residual(s, c->out, c->q, c->token);
    }
    return 0;
}

/* Here, or as the backend's op (arrays and rows in its memory). */
static int32_t call(td_sampler *s, td_sample_call c) { return s->b ? td_bk_sample(s->b, s, &c) : td_sampler_run(s, &c); }

void td_sampler_accept(td_sampler *s, int32_t tok) { call(s, (td_sample_call){.kind = TD_SAMPLE_ACCEPT, .token = tok}); }
int32_t td_sampler_greedy(td_sampler *s, const float *logits) { return call(s, (td_sample_call){.kind = TD_SAMPLE_GREEDY, .x = logits}); }
void td_sampler_probs(td_sampler *s, const float *logits, float *probs) {
    call(s, (td_sample_call){.kind = TD_SAMPLE_PROBS, .x = logits, .out = probs});
}
int32_t td_sample_from(td_sampler *s, const float *probs) { return call(s, (td_sample_call){.kind = TD_SAMPLE_FROM, .x = probs}); }
int32_t td_sampler_sample(td_sampler *s, const float *logits) { return call(s, (td_sample_call){.kind = TD_SAMPLE_SAMPLE, .x = logits}); }
int32_t td_sampler_draft_argmax(td_sampler *s, const float *logits, const uint32_t *mask) {
    const uint32_t *m = s->mask;
    td_sampler_set_mask(s, mask);
    int32_t t = call(s, (td_sample_call){.kind = TD_SAMPLE_DRAFT_ARGMAX, .x = logits});
    s->mask = m; /* callers set the mask per call; a backend copy of it is stale now (re-uploaded when set) */
    return t;
}
int td_sampler_accept_draft(td_sampler *s, const float *p, const float *q, int32_t d) {
    return call(s, (td_sample_call){.kind = TD_SAMPLE_ACCEPT_DRAFT, .x = p, .q = q, .token = d});
}
int32_t td_sampler_residual(td_sampler *s, float *p, const float *q, int32_t d) {
    return call(s, (td_sample_call){.kind = TD_SAMPLE_RESIDUAL, .out = p, .q = q, .token = d});
}
