/* Constrained generation with drafting (issue 17, structured outputs): a
 * td_constraint masks the logits; drafts are proposed under the mask and
 * every verified position is checked under its own mask, so
 *  (a) greedy output at depths 1..4 is byte-identical to depth 0, every token
 *      allowed, and differs from the unconstrained output (the mask matters);
 *  (b) a dead end (no token allowed) and a complete grammar (accept returns 1)
 *      end the generation at the same token at every depth;
 *  (c) sampled output at depth 3 follows the constrained law (chi-square
 *      against the exact masked Markov chain of tests/models/spec-agree,
 *      enumerated independently of the sampler), argmax and sampled drafts.
 * The toy constraint is position-dependent, as a grammar's state is. */
#include <math.h>
#include "check.h"
#include "engine/engine.h"
#include "chi2.h"

#if defined(__SANITIZE_ADDRESS__)
#define SCALE 8
#else
#define SCALE 1
#endif

/* Token t is allowed at output position pos unless (7t + 3pos) % 4 == 0;
 * at dead_pos nothing is allowed; after end_at tokens the grammar is complete. */
typedef struct {
    int vocab, committed, dead_pos, end_at;
    int violations, mask_calls;
    uint32_t mask[1024];
} toy;

static bool toy_ok(const toy *c, int32_t t, int pos) {
    if (pos == c->dead_pos) return false;
    return (7 * t + 3 * pos) % 4 != 0;
}

static const uint32_t *toy_mask(void *u, const int32_t *spec, int n) {
    toy *c = u;
    c->mask_calls++;
    for (int i = 0; i < n; i++)
        if (!toy_ok(c, spec[i], c->committed + i)) return NULL;
    int pos = c->committed + n;
    memset(c->mask, 0, sizeof c->mask);
    for (int t = 0; t < c->vocab; t++)
        if (toy_ok(c, t, pos)) c->mask[t >> 5] |= 1u << (t & 31);
    return c->mask;
}

static int toy_accept(void *u, int32_t t) {
    toy *c = u;
    if (!toy_ok(c, t, c->committed)) { c->violations++; return -1; }
    c->committed++;
    return c->end_at > 0 && c->committed == c->end_at ? 1 : 0;
}

typedef struct { int32_t *buf; int n, cap; } tokvec;
static int collect(void *u, int32_t t) {
    tokvec *v = u;
    if (v->n < v->cap) v->buf[v->n++] = t;
    return 0;
}

static td_engine *load(const char *dir, int depth) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 1, .spec_depth = depth, .max_context = 2048};
    td_engine *e = NULL;
    int rc = td_engine_load(dir, &o, &e, &err);
    CHECK(rc == 0, "%s: %s", dir, err.msg);
    return e;
}

/* Generates with a fresh toy constraint (NULL cfg: unconstrained). */
static int gen(td_session *s, const int32_t *prompt, int n, int depth, int max_tokens, const td_sampling *sp, bool draft_sampling,
               const toy *cfg, int32_t *out, td_gen_result *res, toy *used) {
    td_err err = {0};
    toy c;
    td_constraint tc = {toy_mask, toy_accept, &c};
    if (cfg) c = *cfg;
    td_gen_opts o = {.max_tokens = max_tokens, .spec_depth = depth, .ignore_eos = true, .draft_sampling = draft_sampling,
                     .constraint = cfg ? &tc : NULL};
    tokvec v = {out, 0, max_tokens};
    td_session_reset(s);
    int rc = td_session_generate(s, prompt, n, sp, &o, collect, &v, res, &err);
    CHECK(rc == 0, "generate: %s", err.msg);
    if (used && cfg) *used = c;
    return v.n;
}

static void greedy(const char *dir) {
    td_engine *e = load(dir, 4);
    if (!e) return;
    int V = e->model->cfg.vocab_size;
    CHECK(V <= 1024 * 32, "vocab %d too large for the toy mask", V);
    td_sampling sp;
    td_sampling_default(&sp);
    td_session *s;
    td_err err;
    CHECK(td_session_new(e, &s, &err) == 0, "%s", err.msg);
    int32_t prompt[12], ref[400], out[400], free_out[400];
    for (int i = 0; i < 12; i++) prompt[i] = (i * 5 + 1) % (V - 4);
    const int N = 400 / SCALE;
    toy cfg = {.vocab = V, .dead_pos = -1, .end_at = 0};
    td_gen_result r;
    toy used;
    int nf = gen(s, prompt, 12, 0, N, &sp, false, NULL, free_out, &r, NULL);
    int n0 = gen(s, prompt, 12, 0, N, &sp, false, &cfg, ref, &r, &used);
    CHECK(n0 == N && used.violations == 0, "%s: depth 0 constrained: %d tokens, %d violations", dir, n0, used.violations);
    int differ = 0;
    for (int i = 0; i < n0 && i < nf; i++) differ += ref[i] != free_out[i];
    CHECK(differ > 0, "%s: the mask changed nothing (test is vacuous)", dir);
    for (int i = 0; i < n0; i++) CHECK(toy_ok(&cfg, ref[i], i), "%s: token %d at %d not allowed", dir, ref[i], i);
    for (int d = 1; d <= 4; d++) {
        int n = gen(s, prompt, 12, d, N, &sp, false, &cfg, out, &r, &used);
        CHECK(n == n0 && memcmp(out, ref, (size_t)n0 * sizeof *ref) == 0, "%s: constrained greedy at depth %d differs from depth 0", dir, d);
        CHECK(used.violations == 0 && used.committed == n, "%s: depth %d: %d violations, %d committed of %d", dir, d, used.violations,
              used.committed, n);
        if (d == 4)
            printf("%s: constrained greedy, %d tokens identical at depths 0..4 (%d differ from unconstrained); depth 4 acceptance %.2f\n",
                   dir, n0, differ, r.spec.draft_tokens ? (double)r.spec.accepted_tokens / (double)r.spec.draft_tokens : 0.0);
    }
    /* (b) endings inside the N tokens (N is smaller under ASan): a dead end
     * at 3N/10, a complete grammar after 13N/20 */
    const int dead_at = N * 3 / 10, end_at = N * 13 / 20;
    for (int d = 0; d <= 4; d++) {
        toy dead = cfg, done = cfg;
        dead.dead_pos = dead_at;
        done.end_at = end_at;
        int n = gen(s, prompt, 12, d, N, &sp, false, &dead, out, &r, &used);
        CHECK(n == dead_at && r.finish == TD_FINISH_STOP && memcmp(out, ref, (size_t)dead_at * sizeof *ref) == 0,
              "%s: depth %d dead end: %d tokens, finish %d", dir, d, n, (int)r.finish);
        n = gen(s, prompt, 12, d, N, &sp, false, &done, out, &r, &used);
        CHECK(n == end_at && r.finish == TD_FINISH_STOP && memcmp(out, ref, (size_t)end_at * sizeof *ref) == 0,
              "%s: depth %d complete grammar: %d tokens, finish %d", dir, d, n, (int)r.finish);
    }
    td_session_free(s);
    td_engine_free(e);
}

/* The target of spec-agree is a Markov chain P[a][b]; under the toy mask
 * position i draws from P[prev][.] restricted to the allowed tokens and
 * renormalized. Enumerate the exact law of (x2, x3) (positions 2, 3). */
static double distribution(bool draft_sampling) {
    td_engine *e = load("tests/models/spec-agree", 3);
    if (!e) return 0;
    int V = e->model->cfg.vocab_size;
    double P[16][16];
    td_session *s;
    td_err err;
    td_session_new(e, &s, &err);
    markov_probs(s, V, P);
    toy cfg = {.vocab = V, .dead_pos = -1};
    /* Q[i][a][b]: masked transition into position i */
    double Q[4][16][16];
    for (int i = 0; i < 4; i++)
        for (int a = 0; a < V; a++) {
            double z = 0;
            for (int b = 0; b < V; b++) z += toy_ok(&cfg, b, i) ? P[a][b] : 0;
            for (int b = 0; b < V; b++) Q[i][a][b] = toy_ok(&cfg, b, i) ? P[a][b] / z : 0;
        }
    int t0 = 3;
    double m[16] = {0}, m1[16] = {0}, pair[256] = {0};
    for (int a = 0; a < V; a++) m[a] = Q[0][t0][a];
    for (int a = 0; a < V; a++) for (int b = 0; b < V; b++) m1[b] += m[a] * Q[1][a][b];
    for (int b = 0; b < V; b++) for (int c = 0; c < V; c++) for (int d = 0; d < V; d++) pair[c * V + d] += m1[b] * Q[2][b][c] * Q[3][c][d];
    const int N = 20000 / SCALE;
    int cnt[256] = {0};
    td_sampling sp;
    td_sampling_default(&sp);
    sp.temperature = 1.0f;
    uint64_t drafted = 0, accepted = 0;
    for (int i = 0; i < N; i++) {
        sp.seed = 91000 + (uint64_t)i;
        int32_t prompt = t0, out[4];
        td_gen_result r;
        toy used;
        int n = gen(s, &prompt, 1, 3, 4, &sp, draft_sampling, &cfg, out, &r, &used);
        if (n != 4 || used.violations) { CHECK(0, "sample %d: %d tokens, %d violations", i, n, used.violations); break; }
        cnt[out[2] * V + out[3]]++;
        drafted += r.spec.draft_tokens;
        accepted += r.spec.accepted_tokens;
    }
    double st;
    int dof;
    CHECK(chi2_impossible(pair, cnt, V * V) == 0, "a token the mask forbids was sampled");
    double p = chi2_p(pair, cnt, V * V, N, &st, &dof);
    printf("constrained distribution at depth 3 (%s drafts, %d samples, acceptance %.2f): chi2 (x2,x3) %.1f p=%.3f\n",
           draft_sampling ? "sampled" : "argmax", N, drafted ? (double)accepted / (double)drafted : 0.0, st, p);
    td_session_free(s);
    td_engine_free(e);
    return p;
}

int main(void) {
    greedy("models/demo");
    greedy("tests/models/spec-partial");
    double p = distribution(false);
    CHECK(p > 0.01, "constrained rejection sampling (argmax drafts) fails chi-square: p = %.4f", p);
    p = distribution(true);
    CHECK(p > 0.01, "constrained rejection sampling (sampled drafts) fails chi-square: p = %.4f", p);
    TEST_MAIN_END("test_constraint");
}
