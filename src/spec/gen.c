/* Generation with speculative decoding by the model's own MTP head.
 *
 * One decode step at depth k, with n tokens held and x the newest token
 * (sampled and emitted, not yet fed):
 *   1. draft d1..dk with the MTP head (entry p pairs target h_p with token
 *      p+1; pending target hidden states are consumed first, then the MTP
 *      feeds its own h' back for depth > 1);
 *   2. verify [x, d1..dk] in ONE batched forward of the target, keeping the
 *      DeltaNet state after every position;
 *   3. accept (greedy: exact match; sampling: rejection sampling), roll the
 *      sequence back to the last accepted token (attention KV truncates,
 *      DeltaNet state restores from its checkpoint) and keep the target's
 *      hidden states of the accepted positions, so the MTP entries drafted
 *      from h' are rewritten from the target's states before the next draft.
 * Kernels are batch-invariant (backend.h): greedy output is bit-identical
 * to depth 0 whatever else shares the batch. */
#include "spec/gen.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine/engine.h"
#include "sample/sampler.h"
#include "util/err.h"

/* prompt tokens per request and step when td_engine_opts.max_prefill_chunk is 0 */
#define PREFILL_CHUNK 256
/* Long prompts also leave prefix-cache checkpoints every this many tokens,
 * so prompts sharing only a long head (a system prompt and tools) hit. */
#define CKPT_INTERVAL 1024
#define MAX_BATCH 256

typedef enum { G_PREFILL, G_DECODE, G_DONE } gen_phase;

typedef struct {
    float *vlogits;  /* [(k+1) x V] verify logits */
    float *vhidden;  /* backend [max(k+1, CHUNK) x H] target hidden rows */
    float *mhidden;  /* backend [pend_cap + 1 x H] MTP h' rows */
    float *qprobs;   /* [k x V] draft distributions (draft sampling) */
    float *probs;    /* [V] */
    float *mlogits;  /* [V] */
    int32_t *ids;    /* backend [2 x depth + 1] (dev_pick): the step's draft ids, then the verify's argmax ids */
} gen_buffers;

/* Floats of backend work memory the ids take (2 x TD_MAX_SPEC_DEPTH + 1 int32s, rounded up). */
#define IDS_FLOATS (2 * TD_MAX_SPEC_DEPTH + 2)

struct td_gen {
    td_session *s;
    td_engine *e;
    td_sampler sm;
    td_gen_opts o;
    int32_t *stop_ids;
    td_gen_emit_fn emit;
    void *user;
    const td_constraint *cons; /* borrowed; NULL = unconstrained */
    td_gen_result res;
    int32_t *prompt;
    int n_prompt, fed;     /* prompt tokens whose state is held */
    int n_prompt0;         /* the request's own prompt (prompt grows by the output after a preemption) */
    int32_t *out;          /* every emitted token, [n_generated] (cap_out) */
    int cap_out;
    int depth;
    bool track;            /* keep MTP entries in step with the target */
    bool autod;            /* adaptive depth: depth is the maximum, ad_plan picks each step's k */
    td_ad_state ad;
    gen_phase phase;
    int32_t x;             /* newest token: emitted, not fed */
    gen_buffers b;
    double t_begin, t_first;
    bool broken;           /* a failed step left the session's state undefined */
    bool dev_pick;         /* plain greedy, no logits wanted: tokens are argmax ids from the backend */
    bool dev_sample;       /* any other request that wants no logits (constrained ones too): the sampler runs
                              on the backend and every logits / probability buffer below is backend memory */
    int32_t am[TD_MAX_SPEC_DEPTH + 1]; /* this step's argmax ids: target rows, or am[0] the MTP row */
    /* this step */
    int chunk, k, n0;
    int32_t toks[TD_MAX_SPEC_DEPTH + 1];
    float *h;              /* MTP hidden fed back */
};

/* Whether the logits rows come to the host (and go to the emit callback). */
static bool host_rows(const td_gen *g) { return !g->dev_pick && !g->dev_sample; }
/* The target's last logits row after a prefill chunk or a decode row: host,
 * backend (dev_sample) or none (dev_pick: the argmax id is in am[0]). */
static const float *target_row(const td_gen *g, td_session *s) {
    return g->dev_pick ? NULL : g->dev_sample ? g->b.vlogits : td_session_logits(s);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool ad_coupled(const td_gen *g); /* adaptive depth, below */

static int chunk_cap(const td_engine *e) { return td_engine_options(e)->max_prefill_chunk > 0 ? td_engine_options(e)->max_prefill_chunk : PREFILL_CHUNK; }

size_t td_gen_work_bytes_for(const td_config *c, int k, int pend_cap, int max_chunk) {
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden_size;
    if (max_chunk <= 0) max_chunk = PREFILL_CHUNK;
    size_t rows_h = (size_t)(k + 1 > max_chunk ? k + 1 : max_chunk);
    return ((size_t)(k + 1) * V + rows_h * H + (size_t)(pend_cap + 1) * H + (size_t)(k ? k : 1) * V + 2 * V + IDS_FLOATS) * sizeof(float);
}

static int alloc_buffers(td_gen *g, td_err *err) {
    td_session *s = g->s;
    const td_config *c = td_engine_cfg(g->e);
    int k = g->depth;
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden_size;
    int max_chunk = chunk_cap(g->e);
    size_t rows_h = (size_t)(k + 1 > max_chunk ? k + 1 : max_chunk);
    /* host: logits and probabilities; backend: hidden rows (td_gen_work_bytes_for counts both) */
    size_t dneed = (rows_h + (size_t)(TD_MTP_PEND_CAP + 1)) * H + IDS_FLOATS;
    size_t need = td_gen_work_bytes_for(c, k, TD_MTP_PEND_CAP, max_chunk) / sizeof(float) - dneed;
    if (g->dev_sample) dneed += need, need = 0; /* logits and probabilities on the backend too */
    float *p, *dev;
    int rc = td_session_work(s, need, dneed, &p, &dev, err);
    if (rc) return rc;
    g->b.vhidden = dev;
    g->b.mhidden = dev + rows_h * H;
    g->b.ids = (int32_t *)(dev + rows_h * H + (size_t)(TD_MTP_PEND_CAP + 1) * H);
    if (g->dev_sample) p = dev + rows_h * H + (size_t)(TD_MTP_PEND_CAP + 1) * H + IDS_FLOATS;
    g->b.vlogits = p; p += (size_t)(k + 1) * V;
    g->b.qprobs = p; p += (size_t)(k ? k : 1) * V;
    g->b.probs = p; p += V;
    g->b.mlogits = p;
    return TD_OK;
}

/* ---- tokens out --------------------------------------------------------- */

static bool is_stop(const td_gen *g, int32_t t) {
    const td_config *c = td_engine_cfg(g->e);
    if (!g->o.ignore_eos)
        for (int i = 0; i < c->n_eos; i++)
            if (t == c->eos_token_ids[i]) return true;
    for (int i = 0; i < g->o.n_stop; i++)
        if (t == g->stop_ids[i]) return true;
    return false;
}

static void finish(td_gen *g, td_finish f) {
    g->res.finish = f;
    g->phase = G_DONE;
}

/* Emits one token (already recorded in the sampler); false when generation ends. */
static bool emit(td_gen *g, int32_t t, const float *row) {
    if (g->res.n_generated == 0) g->t_first = now_s();
    if (g->res.n_generated >= g->cap_out) { /* kept for a restart after a preemption */
        int cap = g->cap_out ? g->cap_out * 2 : 64;
        int32_t *o = realloc(g->out, (size_t)cap * sizeof *o);
        if (!o) { finish(g, TD_FINISH_CANCEL); return false; }
        g->out = o;
        g->cap_out = cap;
    }
    g->out[g->res.n_generated] = t;
    g->res.n_generated++;
    int c = g->cons ? g->cons->accept(g->cons->user, t) : 0; /* the grammar state follows the output */
    int r = g->emit ? g->emit(g->user, t, row) : 0;
    if (r) finish(g, r == 1 ? TD_FINISH_STOP : TD_FINISH_CANCEL);
    else if (c) finish(g, c > 0 ? TD_FINISH_STOP : TD_FINISH_CANCEL);
    else if (is_stop(g, t)) finish(g, TD_FINISH_STOP);
    else if (g->res.n_generated >= g->o.max_tokens) finish(g, TD_FINISH_LENGTH);
    return g->phase != G_DONE;
}

/* The constraint's mask after the committed output and spec[0..n) (NULL:
 * unconstrained, or spec is no valid continuation: see the callers). */
static const uint32_t *cmask(td_gen *g, const int32_t *spec, int n) {
    return g->cons ? g->cons->mask(g->cons->user, spec, n) : NULL;
}

/* True when the constraint leaves no token at all after the committed
 * output and spec: the generation has to end there. */
static bool dead_end(td_gen *g, const uint32_t *m) {
    return g->cons && (!m || td_mask_empty(m, td_engine_cfg(g->e)->vocab_size));
}

/* Samples and emits the next token from a target logits row (row NULL:
 * dev_pick, the backend's argmax in am[0]). */
static void next_token(td_gen *g, const float *row) {
    const uint32_t *m = cmask(g, NULL, 0);
    if (dead_end(g, m)) { finish(g, TD_FINISH_STOP); return; }
    td_sampler_set_mask(&g->sm, m);
    g->x = row ? td_sampler_sample(&g->sm, row) : g->am[0];
    td_sampler_set_mask(&g->sm, NULL);
    td_sampler_accept(&g->sm, g->x);
    emit(g, g->x, host_rows(g) ? row : NULL);
}

/* Draft j (0-based) from the MTP logits, under the constraint's mask after
 * x and the drafts before it. Where the mask is empty (a dead end) the
 * unmasked argmax is drafted: verify rejects it, since no token is allowed
 * there, and the generation ends at that position. */
static void choose_draft(td_gen *g, int j) {
    int V = td_engine_cfg(g->e)->vocab_size;
    const float *lg = g->b.mlogits;
    if (g->dev_pick) return; /* the MTP row's argmax stays in g->b.ids; it comes down after the verify */
    const uint32_t *m = cmask(g, g->toks + 1, j);
    if (dead_end(g, m)) m = NULL;
    if (g->o.draft_sampling && !td_sampler_is_greedy(&g->sm)) {
        float *qp = g->b.qprobs + (size_t)j * V;
        td_sampler_set_mask(&g->sm, m);
        td_sampler_probs(&g->sm, lg, qp);
        td_sampler_set_mask(&g->sm, NULL);
        g->toks[1 + j] = td_sample_from(&g->sm, qp);
    } else {
        g->toks[1 + j] = td_sampler_draft_argmax(&g->sm, lg, m); /* logit_bias: drafts proposed under it too */
    }
}

/* Accepts drafts after the verify forward, rolls back, emits. */
static int accept_verified(td_gen *g, td_err *err) {
    td_seq *q = td_session_seq(g->s);
    int V = td_engine_cfg(g->e)->vocab_size, k = g->k;
    int a = 0;
    int32_t next = -1;
    bool dead = false; /* the constraint allows nothing after the accepted drafts */
    for (; a <= k; a++) {
        /* position a is checked under the mask after x, d1..da (all allowed) */
        const uint32_t *m = cmask(g, g->toks + 1, a);
        if (dead_end(g, m)) { dead = true; break; }
        td_sampler_set_mask(&g->sm, m);
        if (a == k) break; /* the bonus token, below, under this mask */
        const float *row = g->dev_pick ? NULL : g->b.vlogits + (size_t)a * V;
        int32_t d = g->toks[1 + a];
        if (!td_mask_allows(m, d)) { /* a draft from a dead end (choose_draft): rejected outright */
            next = td_sampler_sample(&g->sm, row);
            break;
        }
        if (ad_coupled(g)) { int32_t t = td_sampler_sample(&g->sm, row); if (t != d) { next = t; break; } td_sampler_accept(&g->sm, d); continue; }
        if (td_sampler_is_greedy(&g->sm)) {
            int32_t t = row ? td_sampler_greedy(&g->sm, row) : g->am[a];
            if (t != d) { next = t; break; }
        } else {
            td_sampler_probs(&g->sm, row, g->b.probs);
            const float *qrow = g->o.draft_sampling ? g->b.qprobs + (size_t)a * V : NULL;
            if (!td_sampler_accept_draft(&g->sm, g->b.probs, qrow, d)) { next = td_sampler_residual(&g->sm, g->b.probs, qrow, d); break; }
        }
        td_sampler_accept(&g->sm, d);
    }
    if (a > k) a = k;
    if (next < 0 && !dead) next = g->dev_pick ? g->am[k] : td_sampler_sample(&g->sm, g->b.vlogits + (size_t)k * V); /* bonus token */
    td_sampler_set_mask(&g->sm, NULL);
    td_spec_counters *sc = &g->res.spec;
    sc->drafts++;
    sc->draft_tokens += (uint64_t)k;
    sc->accepted_tokens += (uint64_t)a;
    for (int i = 0; i < a; i++) sc->accepted_per_pos[i]++;
    int emitted = 0;
    bool going = true;
    while (emitted < a && going) {
        going = emit(g, g->toks[1 + emitted], host_rows(g) ? g->b.vlogits + (size_t)emitted * V : NULL);
        emitted++;
    }
    /* hold x and the accepted drafts, except a final token that ended generation */
    int keep = going ? g->n0 + 1 + a : g->n0 + emitted;
    int rc = td_seq_truncate(q, keep, err);
    if (rc) return rc;
    td_mtp_rewind(g->s, g->n0, g->b.vhidden, keep); /* entries >= n0 were drafted from h': rewrite from target states */
    if (going && dead) {
        finish(g, TD_FINISH_STOP);
    } else if (going) {
        g->x = next;
        td_sampler_accept(&g->sm, next);
        emit(g, next, host_rows(g) ? g->b.vlogits + (size_t)a * V : NULL);
    }
    return TD_OK;
}

/* Saves an exact prefix-cache checkpoint of the session's current state. */
static void save_checkpoint(td_gen *g) {
    td_session *s = g->s;
    td_seq *q = td_session_seq(s);
    if (td_engine_options(g->e)->no_prefix_caching || g->broken || q->n_past == 0) return;
    bool mtp_ok = td_mtp_checkpoint_ready(s, g->track);
    td_kv_checkpoint(td_engine_kv(g->e), q->tokens, q->n_past, q->blocks, td_seq_live_state(q), td_mtp_last_row(s), mtp_ok); /* state to host */
}

/* ---- adaptive depth (spec/autodepth.h) ----------------------------------- */

/* A request at `auto` (or under the test hook's forced schedule) keeps
 * track = true (its depth is the maximum), so its MTP entries follow the
 * target at depth 0 too and it can draft again at any step; unless
 * drafting is not predicted to pay at all in a batch of the requests now
 * running, this one and those admitted with it (td_gen_opts.joining: four
 * requests that arrive together judge a batch of four, not of 1, 2, 3 and 4)
 * (td_ad_worth_tracking), then it runs as depth 0 without MTP work, except
 * now and then one (td_ad_measure_turn: a budget of MTP prompt rows, spent
 * on short prompts first), which tracks and runs at depth 0 but for its
 * probes (measure_only), so the engine-wide acceptance and costs keep being
 * measured. One that does not track is a fixed depth-0 request from here on
 * (depth 0: its work buffers, the KV it reserves per step and the rows it
 * takes from the step's token budget are a depth-0 request's, not the
 * maximum depth's). */
static void ad_begin(td_gen *g, const td_sampling *sp, int n_prompt) {
    td_ad_engine *ae = td_engine_ad(g->e);
    int b = sp && sp->temperature > 0 ? 1 : 0;
    g->autod = true;
    td_ad_state_init(&g->ad, &ae->global[b], g->o.spec_schedule_seed);
    td_ad_state_seed_real(&g->ad, &ae->real[b]);
    g->ad.bucket = b;
    int batch = ae->n_live + 1 + (g->o.joining > 0 ? g->o.joining : 0); /* the running ones, this one, those admitted with it */
    if (!g->ad.force_seed && !td_ad_worth_tracking(&ae->costs, &ae->global[b], g->depth, batch, TD_AD_TRACK_MARGIN)) {
        if (td_ad_measure_turn(ae, n_prompt)) g->ad.measure_only = true; /* tracks, drafts only to probe */
        else g->track = false, g->depth = 0; /* a fixed depth-0 request: its buffers, KV steps and budget rows too */
    }
}

/* A measuring request that will not measure after all (a failed begin, a
 * prefix-cache hit it would have to give up) gives back what it spent: its
 * prompt as it began; refund false after a preemption (spent and used). */
static void ad_unmeasure(td_gen *g, int n_prompt, bool refund) {
    if (g->autod && g->ad.measure_only && refund) td_ad_measure_refund(td_engine_ad(g->e), n_prompt);
    g->ad.measure_only = false;
}

/* A tracking request stops tracking (TD_AD_UNTRACK_AFTER): from here it is a
 * fixed depth-0 request, as if ad_begin had decided so. */
static void ad_untrack(td_gen *g) {
    g->track = false;
    g->depth = 0;
    td_mtp_lost(g->s);
}

/* Chooses this step's depth for the auto requests among the active ones
 * (on entry g->k holds each decode row's cap: max depth, max_tokens,
 * context), counts every decode row's depth; returns the step's largest. */
static int ad_plan(td_gen **active, int n) {
    td_ad_req r[MAX_BATCH];
    td_gen *dec[MAX_BATCH];
    int nd = 0, extra = 0, n_auto = 0, max_k = 0;
    int worth[2] = {-1, -1}; /* td_ad_worth_tracking for the live batch, per bucket, when asked */
    td_ad_engine *ae = td_engine_ad(active[0]->e);
    for (int i = 0; i < n; i++) {
        td_gen *g = active[i];
        if (g->phase != G_DECODE) { extra += g->chunk; continue; }
        if (g->autod && g->track && g->ad.zero_run >= TD_AD_UNTRACK_AFTER) {
            int b = g->ad.bucket;
            if (worth[b] < 0) worth[b] = td_ad_worth_tracking(&ae->costs, &ae->global[b], g->depth, ae->n_live, TD_AD_TRACK_MARGIN);
            if (td_ad_stop_tracking(&g->ad, worth[b])) ad_untrack(g);
        }
        if (g->track) g->res.spec.tracked_steps++;
        td_ad_req *q = &r[nd];
        dec[nd++] = g;
        q->kmax = q->k = g->k;
        q->fixed = !g->autod || g->ad.force_seed || !g->track || g->ad.measure_only;
        if (g->autod && g->ad.force_seed) q->k = td_ad_forced(g->ad.force_seed, g->ad.steps++, g->k);
        if (g->autod && (!g->track || g->ad.measure_only)) q->k = 0; /* not tracking: depth 0 throughout; measuring: 0 but probes */
        memset(q->real, 0, sizeof q->real);
        memset(q->real_w, 0, sizeof q->real_w);
        q->prev = 0;
        if (g->autod && !q->fixed) td_ad_req_from_state(q, &g->ad); /* its acceptance; fixed at its depth during an exploration burst */
        else
            for (int j = 0; j < TD_MAX_SPEC_DEPTH; j++)
                q->p[j] = g->autod ? td_ad_p(&g->ad.acc, j) : td_ad_p_global(&ae->global[td_sampler_is_greedy(&g->sm) ? 0 : 1], j);
        n_auto += !q->fixed;
    }
    /* a decode-only step whose depth-0 cost was never timed: time it (see td_ad_measure_base) */
    bool base = n_auto && td_ad_measure_base(&ae->costs, r, nd, extra);
    if (base)
        for (int i = 0; i < nd; i++) r[i].k = r[i].fixed ? r[i].k : 0;
    else if (n_auto) td_ad_choose(&ae->costs, r, nd, extra);
    for (int i = 0; i < nd; i++) {
        td_gen *g = dec[i];
        int k = r[i].k;
        if (g->autod && !g->ad.force_seed && g->track && !base) k = g->ad.measure_only ? td_ad_probe(&g->ad, k, r[i].kmax) : td_ad_next(&g->ad, &ae->explore, &r[i]);
        g->k = k;
        g->res.spec.chosen_depth[k]++;
        if (g->autod) g->res.spec.explored_steps = g->ad.explored;
        if (k > max_k) max_k = k;
    }
    return max_k;
}

/* Sampled verification at `auto` (argmax drafts): the position's token is
 * drawn exactly as depth 0 draws it (td_sampler_sample, one per emitted
 * token, in order) and the draft is accepted iff it equals that token. This
 * is rejection sampling against a one-hot q (accepted with probability
 * p(d), the correction distributed as the residual p restricted to != d)
 * coupled to depth 0's random numbers: the output of a seeded sampled
 * request is the depth-0 output byte for byte, whatever depths the
 * (timing-dependent) schedule picks, so seeds stay reproducible. The
 * forced test schedule and fixed depths keep the u < p/q test. */
static bool ad_coupled(const td_gen *g) { return g->autod && !g->ad.force_seed && !g->o.draft_sampling && !td_sampler_is_greedy(&g->sm); }

/* A verify drafted g->k tokens and accepted a. */
static void ad_observe(td_gen *g, int a) {
    td_ad_observe(&td_engine_ad(g->e)->global[g->autod ? g->ad.bucket : td_sampler_is_greedy(&g->sm) ? 0 : 1], g->k, a, TD_AD_GLOBAL_DECAY);
    if (g->autod) td_ad_observe_step(&g->ad, g->ad.force_seed ? NULL : &td_engine_ad(g->e)->real[g->ad.bucket], g->k, a);
}

/* ---- lifecycle ---------------------------------------------------------- */

/* Starts (or restarts, after a preemption) the prefill of g->prompt on the
 * session: reuses the session's own prefix or the prefix cache, then
 * reserves the first step's KV (TD_ERR_LIMIT when the pool cannot hold it;
 * then nothing is held). */
static int start_prefill(td_gen *g, td_err *err) {
    td_session *s = g->s;
    td_engine *e = g->e;
    td_seq *q = td_session_seq(s);
    const int32_t *prompt = g->prompt;
    int n_prompt = g->n_prompt;
    /* Reuse the session's state when it holds a strict prefix of the prompt. */
    int reuse = q->n_past;
    /* An auto request does not pay for tracking with its prefix-cache reuse: a
     * checkpoint saved by a request that did not track has no MTP entries, and
     * tracking would recompute the prefix (the demo model under 4 clients: 923
     * of 6544 reused tokens lost, 27% more prefill; for an agent's 30k-token
     * prefix, minutes on a CPU, far more than drafting can win back). It runs
     * as a depth-0 request instead. */
    if (g->autod && g->track && !g->ad.force_seed && !td_engine_options(e)->no_prefix_caching && n_prompt > 1) {
        int cap = n_prompt / TD_KV_BLOCK + 2;
        int with = td_kv_match_len(td_engine_kv(e), prompt, n_prompt - 1, true, cap);
        int own = reuse < n_prompt && reuse > 0 && td_mtp_valid(s) && !memcmp(q->tokens, prompt, (size_t)reuse * sizeof(int32_t)) ? reuse : 0;
        if (td_kv_match_len(td_engine_kv(e), prompt, n_prompt - 1, false, cap) > (with > own ? with : own))
            ad_unmeasure(g, g->n_prompt0, g->res.n_preemptions == 0), g->track = false, g->depth = 0;
    }
    if (reuse >= n_prompt || (reuse > 0 && memcmp(q->tokens, prompt, (size_t)reuse * sizeof(int32_t)) != 0) || (g->track && !td_mtp_valid(s) && reuse > 0)) {
        td_session_reset(s);
        reuse = 0;
    }
    if (reuse == 0) td_mtp_start(s, g->track);
    if (!g->track) td_mtp_lost(s);
    /* Prefix cache: a longer exact prefix from an earlier request (the last
     * prompt token is always recomputed: it yields the first logits). */
    if (!td_engine_options(e)->no_prefix_caching && reuse < n_prompt - 1) {
        int cap = n_prompt / TD_KV_BLOCK + 2;
        int *blocks = malloc((size_t)cap * sizeof(int));
        td_kv_hit hit;
        int len = blocks ? td_kv_match(td_engine_kv(e), prompt, n_prompt - 1, g->track, blocks, cap, &hit) : 0;
        int nb = (len + TD_KV_BLOCK - 1) / TD_KV_BLOCK;
        if (len > reuse) {
            if (td_seq_adopt(q, blocks, nb, prompt, len, hit.state, err) == 0) {
                reuse = len;
                if (g->track) td_mtp_adopt(s, len, hit.hidden);
            } else {
                td_session_reset(s);
                reuse = 0;
                td_mtp_start(s, g->track);
            }
        } else {
            for (int i = 0; i < nb; i++) td_kv_release(td_engine_kv(e), blocks[i]);
        }
        free(blocks);
    }
    /* KV is allocated as tokens are written (td_gen_reserve_step before each
     * step); here only the first chunk's, so a request that cannot start
     * holds nothing while it waits. */
    g->fed = reuse;
    g->phase = G_PREFILL;
    if (g->res.n_preemptions) {
        g->res.n_resumed_reused += reuse;
        g->res.n_resumed_computed += n_prompt - reuse;
    }
    int rc = td_gen_reserve_step(g, 0, err);
    if (rc) {
        td_session_reset(s); /* give adopted blocks back while this request waits */
        g->fed = 0;
        return rc;
    }
    return TD_OK;
}

int td_gen_begin(td_session *s, const int32_t *prompt, int n_prompt, const td_sampling *sp, const td_gen_opts *o,
                 td_gen_emit_fn emitfn, void *user, td_gen **out, td_err *err) {
    *out = NULL;
    td_engine *e = td_session_engine(s);
    const td_config *c = td_engine_cfg(e);
    td_seq *q = td_session_seq(s);
    if (n_prompt <= 0) return TD_FAIL(err, TD_ERR_ARG, "empty prompt");
    if (o->max_tokens <= 0) return TD_FAIL(err, TD_ERR_ARG, "max_tokens must be positive");
    if (o->spec_depth < 0 || o->spec_depth > TD_MAX_SPEC_DEPTH) return TD_FAIL(err, TD_ERR_ARG, "spec depth %d out of 0..%d", o->spec_depth, TD_MAX_SPEC_DEPTH);
    if (o->spec_depth > q->n_ckpt_slots - 1)
        return TD_FAIL(err, TD_ERR_ARG, "spec depth %d exceeds the engine's %d (set td_engine_opts.spec_depth)", o->spec_depth, q->n_ckpt_slots - 1);
    if (n_prompt >= td_engine_max_ctx(e))
        return TD_FAIL(err, TD_ERR_LIMIT, "request (%d tokens) exceeds the available context size (%d tokens)", n_prompt, td_engine_max_ctx(e));
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size) return TD_FAIL(err, TD_ERR_ARG, "token id %d outside the vocabulary", prompt[i]);
    td_gen *g = TD_CALLOC(err, 1, sizeof *g);
    if (!g) return TD_ERR_NOMEM;
    g->s = s;
    g->e = e;
    g->o = *o;
    g->emit = emitfn;
    g->user = user;
    g->cons = o->constraint;
    g->depth = td_engine_model(e)->has_mtp ? o->spec_depth : 0;
    g->track = g->depth > 0;
    if (g->depth > 0 && (o->spec_auto || o->spec_schedule_seed)) ad_begin(g, sp, n_prompt);
    g->prompt = TD_MALLOC(err, (size_t)n_prompt * sizeof(int32_t));
    g->stop_ids = TD_MALLOC(err, (size_t)(o->n_stop + 1) * sizeof(int32_t));
    int rc = (!g->prompt || !g->stop_ids) ? TD_ERR_NOMEM : td_sampler_init(&g->sm, sp, c->vocab_size, prompt, n_prompt, err);
    if (!rc && !o->want_logits) {
        /* Nobody reads the logits on the host: plain greedy takes the backend's argmax of
         * each row, any other sampler (and any constrained request: its grammar mask is
         * uploaded per position) runs on the backend; only token ids (and masks) cross. */
        g->dev_pick = !g->cons && td_sampler_is_plain_greedy(&g->sm);
        if (!g->dev_pick) {
            td_sampler_free(&g->sm);
            rc = td_sampler_init_backend(&g->sm, td_engine_backend(e), sp, c->vocab_size, prompt, n_prompt, err);
            g->dev_sample = rc == 0;
        }
    }
    if (!rc) rc = alloc_buffers(g, err);
    if (rc) {
        ad_unmeasure(g, n_prompt, true);
        td_sampler_free(&g->sm);
        free(g->prompt);
        free(g->stop_ids);
        free(g);
        return rc;
    }
    memcpy(g->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (o->n_stop) memcpy(g->stop_ids, o->stop_ids, (size_t)o->n_stop * sizeof(int32_t));
    g->o.stop_ids = g->stop_ids;
    g->n_prompt = n_prompt;
    g->res.n_prompt = n_prompt;
    g->n_prompt0 = n_prompt;
    g->t_begin = now_s();
    rc = start_prefill(g, err);
    if (rc) {
        ad_unmeasure(g, n_prompt, true);
        free(g->out);
        td_sampler_free(&g->sm);
        free(g->prompt);
        free(g->stop_ids);
        free(g);
        return rc;
    }
    g->res.n_reused = g->fed;
    td_engine_ad(e)->n_live++; /* td_gen_end's decrement balances it */
    *out = g;
    return TD_OK;
}

bool td_gen_done(const td_gen *g) { return g->phase == G_DONE; }
int td_gen_prefill_left(const td_gen *g) { return g->phase == G_PREFILL ? g->n_prompt - g->fed : 0; }

const td_gen_result *td_gen_result_of(const td_gen *g) { return &g->res; }

void td_gen_cancel(td_gen *g) {
    if (g->phase != G_DONE) finish(g, TD_FINISH_CANCEL);
}

void td_gen_end(td_gen *g) {
    if (!g) return;
    save_checkpoint(g);
    td_engine_ad(g->e)->n_live--;
    td_engine_add_spec(g->e, &g->res.spec);
    td_sampler_free(&g->sm);
    free(g->prompt);
    free(g->stop_ids);
    free(g->out);
    free(g);
}

int td_gen_reserve_step(td_gen *g, int prefill_budget, td_err *err) {
    td_seq *q = td_session_seq(g->s);
    long slots;
    if (g->phase == G_PREFILL) {
        int c = g->n_prompt - g->fed;
        if (c > chunk_cap(g->e)) c = chunk_cap(g->e);
        if (prefill_budget > 0 && c > prefill_budget) c = prefill_budget;
        slots = (long)g->fed + c + 1;   /* + the MTP slot of the last position */
    } else if (g->phase == G_DECODE) {
        slots = (long)q->n_past + g->depth + 2; /* x and k drafts, + the MTP slot */
    } else {
        return TD_OK;
    }
    if (slots > td_engine_max_ctx(g->e) + 1) slots = td_engine_max_ctx(g->e) + 1;
    return td_seq_reserve(q, (int)slots, err);
}

int td_gen_preempt(td_gen *g, td_err *err) {
    if (g->phase == G_DONE) return TD_OK;
    if (g->res.n_generated > 0) {
        /* the restart prefills the prompt and every token emitted so far (the
         * last one, x, was emitted but never fed): its final logits are those
         * of the decode step that would have fed x */
        int n = g->n_prompt0 + g->res.n_generated;
        int32_t *p = TD_MALLOC(err, (size_t)n * sizeof(int32_t));
        if (!p) return TD_ERR_NOMEM;
        memcpy(p, g->prompt, (size_t)g->n_prompt0 * sizeof(int32_t));
        memcpy(p + g->n_prompt0, g->out, (size_t)g->res.n_generated * sizeof(int32_t));
        free(g->prompt);
        g->prompt = p;
        g->n_prompt = n;
    }
    save_checkpoint(g); /* what was computed stays in the prefix cache for the restart */
    td_session_reset(g->s);
    g->broken = false;
    g->fed = 0;
    g->phase = G_PREFILL;
    g->res.n_preemptions++;
    return TD_OK;
}

int td_gen_resume(td_gen *g, td_err *err) { return start_prefill(g, err); }

int td_gen_depth(const td_gen *g) { return g->depth; }

/* ---- the batched step ---------------------------------------------------- */

static void update_times(td_gen *g) {
    double t = now_s();
    if (g->res.n_generated == 0) g->res.prefill_seconds = t - g->t_begin;
    else {
        g->res.prefill_seconds = g->t_first - g->t_begin;
        g->res.decode_seconds = t - g->t_first;
    }
}

static int step(td_gen **gens, int n, int prefill_budget, td_err *err);

int td_gen_step(td_gen **gens, int n, int prefill_budget, td_err *err) {
    int rc = step(gens, n, prefill_budget, err);
    if (rc)
        for (int i = 0; i < n; i++) gens[i]->broken = true;
    return rc;
}

static int step(td_gen **gens, int n, int prefill_budget, td_err *err) {
    if (n <= 0) return TD_OK;
    if (n > MAX_BATCH) return TD_FAIL(err, TD_ERR_ARG, "step over %d requests (max %d)", n, MAX_BATCH);
    td_engine *e = gens[0]->e;
    const int H = td_engine_cfg(e)->hidden_size;
    td_fwd_item items[MAX_BATCH];
    td_mtp_item mitems[MAX_BATCH];
    td_gen *active[MAX_BATCH];
    int n_active = 0, max_k = 0, rc;
    if (prefill_budget <= 0) prefill_budget = chunk_cap(e);
    /* Decode rows count against the step's token budget first (depth + 1
     * each: what td_gen_reserve_step reserves for), prefill chunks get the
     * rest in the order given (the scheduler passes arrival order). */
    for (int i = 0; i < n; i++)
        if (gens[i]->phase == G_DECODE) prefill_budget -= gens[i]->depth + 1;
    /* 1. plan: prefill chunks within the budget, decode depth per request */
    for (int i = 0; i < n; i++) {
        td_gen *g = gens[i];
        if (g->e != e) return TD_FAIL(err, TD_ERR_ARG, "requests of different engines in one step");
        g->chunk = 0;
        g->k = 0;
        if (g->phase == G_PREFILL) {
            int c = g->n_prompt - g->fed;
            if (c > chunk_cap(e)) c = chunk_cap(e); /* the rows the generation buffers hold */
            if (c > prefill_budget) c = prefill_budget;
            /* never past what td_gen_reserve_step reserved (when it did) */
            int room = td_session_seq(g->s)->n_blocks * TD_KV_BLOCK - 1 - g->fed;
            if (room >= 1 && c > room) c = room;
            /* stop at checkpoint positions: every CKPT_INTERVAL, and one token
             * before the end (an identical prompt recomputes only its last) */
            int next_ck = (g->fed / CKPT_INTERVAL + 1) * CKPT_INTERVAL;
            if (g->fed + c > next_ck) c = next_ck - g->fed;
            if (g->fed < g->n_prompt - 1 && g->fed + c > g->n_prompt - 1) c = g->n_prompt - 1 - g->fed;
            if (c <= 0) continue;
            prefill_budget -= c;
            g->chunk = c;
        } else if (g->phase == G_DECODE) {
            td_seq *q = td_session_seq(g->s);
            if (q->n_past + 1 >= td_engine_max_ctx(e)) { finish(g, TD_FINISH_LENGTH); update_times(g); continue; }
            int k = g->depth;
            if (k > g->o.max_tokens - g->res.n_generated) k = g->o.max_tokens - g->res.n_generated;
            if (k > td_engine_max_ctx(e) - 1 - q->n_past) k = td_engine_max_ctx(e) - 1 - q->n_past;
            g->k = k > 0 ? k : 0;
            if (g->k > max_k) max_k = g->k;
        } else {
            continue;
        }
        active[n_active++] = g;
    }
    if (!n_active) return TD_OK;
    max_k = ad_plan(active, n_active); /* each decode row's k this step (spec/autodepth.h) */
    /* 2. drafts: one batched MTP pass per depth */
    int32_t mtoks[MAX_BATCH][TD_MAX_SPEC_DEPTH + 8];
    for (int j = 0; j < max_k; j++) {
        int m = 0;
        td_gen *drafting[MAX_BATCH];
        for (int i = 0; i < n_active; i++) {
            td_gen *g = active[i];
            if (g->k <= j) continue;
            td_seq *q = td_session_seq(g->s);
            if (j == 0) { /* pending target rows, then x */
                td_mtp_first_item(g->s, g->x, mtoks[m], &mitems[m]);
                mitems[m].logits_rows = 1;
                mitems[m].hidden_out_d = g->b.mhidden;
            } else {
                mitems[m] = (td_mtp_item){.seq = q, .tokens = &g->toks[j], .hidden_d = g->h, .pos0 = q->n_past - 1 + j, .n = 1,
                                          .logits_rows = 1, .hidden_out_d = g->b.mhidden};
                if (g->dev_pick) mitems[m].tokens = NULL, mitems[m].tokens_d = g->b.ids + j - 1, mitems[m].n_host = 0; /* draft j-1 */
            }
            /* plain greedy: the draft ids stay in backend memory through the MTP passes and the
             * verify (nothing crosses until the step's one download of its ids) */
            if (g->dev_pick) mitems[m].argmax_d = g->b.ids + j;
            else if (g->dev_sample) mitems[m].logits_d = g->b.mlogits;
            else mitems[m].logits = g->b.mlogits;
            drafting[m++] = g;
        }
        double ad_t0 = now_s();
        if ((rc = td_mtp_forward(td_engine_fwd(e), mitems, m, err))) return rc;
        for (int i = 0; i < m; i++) {
            td_gen *g = drafting[i];
            if (j == 0) { /* keep the last row's h' at row 0 */
                int P = mitems[i].n;
                td_engine_backend(e)->ops->copy(td_engine_backend(e), g->b.mhidden, g->b.mhidden + (size_t)(P - 1) * H, (size_t)H * sizeof(float));
            }
            g->h = g->b.mhidden;
            choose_draft(g, j);
        }
        td_ad_costs_mtp(&td_engine_ad(e)->costs, m, now_s() - ad_t0); /* the draft cost table: MTP pass + choosing the drafts */
    }
    /* 3. one target forward for everything */
    for (int i = 0; i < n_active; i++) {
        td_gen *g = active[i];
        td_session *s = g->s;
        if (g->phase == G_PREFILL) {
            bool last = g->fed + g->chunk == g->n_prompt;
            items[i] = (td_fwd_item){.seq = td_session_seq(s), .tokens = g->prompt + g->fed, .n = g->chunk, .logits_rows = last ? 1 : 0,
                                     .logits = host_rows(g) ? td_session_logits(s) : NULL, .logits_d = g->dev_sample ? g->b.vlogits : NULL,
                                     .argmax = g->dev_pick ? g->am : NULL, .hidden_d = g->track ? g->b.vhidden : NULL};
        } else if (g->k > 0) {
            g->toks[0] = g->x;
            g->n0 = td_session_seq(s)->n_past;
            items[i] = (td_fwd_item){.seq = td_session_seq(s), .tokens = g->toks, .n = g->k + 1, .logits_rows = g->k + 1,
                                     .logits = host_rows(g) ? g->b.vlogits : NULL, .logits_d = g->dev_sample ? g->b.vlogits : NULL,
                                     .hidden_d = g->b.vhidden, .checkpoint = true};
            if (g->dev_pick) /* x from the host, the drafts from b.ids[0..k-1]; argmax ids to b.ids[k..2k] */
                items[i].tokens_d = g->b.ids, items[i].n_host = 1, items[i].argmax_d = g->b.ids + g->k;
        } else {
            items[i] = (td_fwd_item){.seq = td_session_seq(s), .tokens = &g->x, .n = 1, .logits_rows = 1,
                                     .logits = host_rows(g) ? td_session_logits(s) : NULL, .logits_d = g->dev_sample ? g->b.vlogits : NULL,
                                     .argmax = g->dev_pick ? g->am : NULL, .hidden_d = g->track ? g->b.vhidden : NULL};
        }
    }
    int ad_tokens = 0;
    for (int i = 0; i < n_active; i++) ad_tokens += items[i].n;
    double ad_t0 = now_s();
    if ((rc = td_forward(td_engine_fwd(e), items, n_active, err))) return rc;
    /* 4. per request: MTP bookkeeping, acceptance, tokens out */
    for (int i = 0; i < n_active; i++) {
        td_gen *g = active[i];
        td_session *s = g->s;
        if (g->phase == G_PREFILL) {
            g->fed += g->chunk;
            if (g->track && ((rc = td_mtp_push(s, g->b.vhidden, g->chunk, err)) || (rc = td_mtp_catch_up(s, err)))) return rc;
            if (g->fed == g->n_prompt - 1 || (g->fed % CKPT_INTERVAL == 0 && g->fed < g->n_prompt)) save_checkpoint(g);
            if (g->fed == g->n_prompt) {
                g->phase = G_DECODE;
                next_token(g, target_row(g, s));
            }
        } else if (g->k > 0) {
            uint64_t ad_acc0 = g->res.spec.accepted_tokens;
            if (g->dev_pick) { /* the step's one download: k draft ids and k + 1 verify ids */
                int32_t ids[2 * TD_MAX_SPEC_DEPTH + 1];
                td_bk_download(td_engine_backend(e), ids, g->b.ids, (size_t)(2 * g->k + 1) * sizeof(int32_t));
                td_seq *q = td_session_seq(s);
                for (int j = 0; j < g->k; j++) g->toks[1 + j] = q->tokens[g->n0 + 1 + j] = ids[j];
                for (int j = 0; j <= g->k; j++) g->am[j] = ids[g->k + j];
            }
            if ((rc = accept_verified(g, err))) return rc;
            ad_observe(g, (int)(g->res.spec.accepted_tokens - ad_acc0));
        } else {
            if (g->track && (rc = td_mtp_push(s, g->b.vhidden, 1, err))) return rc;
            next_token(g, target_row(g, s));
        }
        update_times(g);
    }
    td_ad_costs_fwd(&td_engine_ad(e)->costs, ad_tokens, now_s() - ad_t0); /* the step cost table: forward, acceptance, tokens out */
    return TD_OK;
}

/* ---- single request ------------------------------------------------------ */

typedef struct { td_token_fn fn; void *user; } simple_cb;
static int simple_emit(void *u, int32_t t, const float *row) {
    (void)row;
    simple_cb *c = u;
    int r = c->fn ? c->fn(c->user, t) : 0; /* td_token_fn: 2 = stop, other non-zero = cancel */
    return r == 0 ? 0 : r == 2 ? 1 : 2;
}

int td_session_generate(td_session *s, const int32_t *prompt, int n_prompt, const td_sampling *sp, const td_gen_opts *o,
                        td_token_fn fn, void *user, td_gen_result *res, td_err *err) {
    memset(res, 0, sizeof *res);
    simple_cb cb = {fn, user};
    td_gen *g;
    int rc = td_gen_begin(s, prompt, n_prompt, sp, o, simple_emit, &cb, &g, err);
    if (rc) return rc;
    while (!td_gen_done(g) && rc == 0) {
        rc = td_gen_reserve_step(g, chunk_cap(td_session_engine(s)), err);
        if (!rc) rc = td_gen_step(&g, 1, chunk_cap(td_session_engine(s)), err);
    }
    if (rc) td_mtp_lost(s);
    *res = *td_gen_result_of(g);
    td_gen_end(g);
    return rc;
}
