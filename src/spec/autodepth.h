/* Adaptive draft depth (`--spec-depth auto`, issue 18): each engine step
 * picks, for every request that runs at `auto`, the MTP draft depth k in
 * 0..its maximum that maximises the step's expected tokens per second
 *
 *     sum_i E[accepted_i + 1 | k_i]  /  (t_draft(k) + t_fwd(tokens in the step))
 *
 * where E[accepted + 1 | k] = 1 + sum_{i=1..k} prod_{j<=i} p_j from the
 * request's live per-position conditional acceptance p_j (exponentially
 * decayed, seeded from the engine-wide figures), blended with the tokens its
 * steps at k really emitted where it has them (TD_AD_REAL_DECAY; kept fresh
 * by short exploration bursts at a deeper depth, TD_AD_EXPLORE_BURST, and
 * steadied by a 5% hysteresis, TD_AD_STICKY), t_fwd(T) the measured cost
 * of a target forward over T tokens (the cost table, by tokens in the step:
 * prefill chunks + every decode row's k+1) and t_draft the measured cost of
 * the batched MTP passes (pass j runs over the requests with k > j). With
 * one request this is E[acc+1|k] / (t_draft(k) + t_verify(k+1)); with more,
 * each request's choice is made against the others' rows (coordinate ascent
 * on the batch's tokens/s), so depth falls as a verify row costs more.
 *
 * Everything here is plain data and pure functions (tests/c/test_autodepth.c
 * runs them on synthetic tables); src/spec/gen.c feeds it the step's
 * measured costs and each verify's outcome, src/spec/calibrate.c seeds the
 * cost table at start-up.
 *
 * Losslessness does not depend on the schedule: every step is an ordinary
 * speculative step at the k it was given (greedy: identical to depth 0),
 * k being chosen from the past only. The choice uses wall-clock costs, so
 * it differs run to run; a sampled request at `auto` (argmax drafts) is
 * therefore verified *coupled* to depth 0 (gen.c ad_coupled: each position's
 * token drawn as depth 0 draws it, the draft accepted iff equal), which makes
 * a seeded sampled request's output the depth-0 output byte for byte under
 * any schedule. Fixed depths keep the u < p/q rejection test.
 *
 * What a depth-0 request costs: a request at `auto` that may draft keeps
 * its MTP entries in step with the target (gen.c's `track`: one hidden-row
 * copy per token and one batched MTP-layer pass over the pending rows every
 * TD_MTP_PEND_CAP - 1 tokens, without the lm_head), so it can draft
 * again at any step without a gap in the MTP layer's KV. On a model in cache
 * (the demo model on a CPU) that pass is ~1/7 of a forward per token: more
 * than the whole gain drafting could bring. So a new request tracks only
 * when some depth is predicted to pay with the engine-wide acceptance
 * (td_ad_worth_tracking, with a 15% margin for the tracking itself); now
 * and then one tracks anyway (TD_AD_MEASURE_SHARE), so the engine-wide
 * acceptance and the cost table keep being measured. A request that does
 * not track runs exactly as a fixed depth-0 one; so does one that would have to give up a
 * prefix-cache hit to track (a checkpoint saved by a request that did not
 * track has no MTP entries; gen.c start_prefill), and one that began
 * tracking in a small batch and has chosen depth 0 for TD_AD_UNTRACK_AFTER
 * steps since its batch grew (td_ad_stop_tracking). The steps that track
 * are counted (td_spec_counters.tracked_steps,
 * tandem_spec_tracked_steps_total). A tracking request at depth 0 probes:
 * after `probe` steps at 0 it drafts one token, so p_1 keeps being
 * measured; a probe that does not change the choice doubles the interval
 * (16 .. 256 steps). */
#ifndef TANDEM_SPEC_AUTODEPTH_H
#define TANDEM_SPEC_AUTODEPTH_H
#include <stdbool.h>
#include <stdint.h>
#include "tandem.h"

#define TD_AD_MAX_T 1024      /* tokens per step the cost table keeps */
#define TD_AD_MAX_M 256       /* requests per MTP pass the draft table keeps */
#define TD_AD_PROBE_MIN 16
#define TD_AD_PROBE_MAX 256
#define TD_AD_DECAY 0.9       /* per-request weight of older outcomes, per verify */
#define TD_AD_GLOBAL_DECAY 0.995
#define TD_AD_PRIOR_WEIGHT 4.0 /* pseudo-observations a request starts with from the engine-wide figures */
#define TD_AD_P_PRIOR 0.7     /* p_j before anything was measured */
#define TD_AD_GLOBAL_PRIOR_WEIGHT 4.0 /* pseudo-observations of TD_AD_P_PRIOR in the engine-wide figures */
#define TD_AD_COST_ALPHA 0.2  /* weight of a new measurement in rho and a calibration entry */
/* An online cost entry is the lower third of its last TD_AD_COST_WIN
 * measurements (the 3rd smallest of 9). Step times on a shared machine are
 * heavy-tailed and the noise is one-sided (the demo model under 4 clients on
 * 2 cores, one run: a 4-token step p10 1.2 ms, median 2.0 ms, p90 18.5 ms,
 * max 78 ms: the HTTP threads and the clients preempt the step); an average
 * follows the tail (one 78 ms step moved an EMA entry 8x, and the choice
 * with it), a low quantile tracks the step's own cost. */
#define TD_AD_COST_WIN 9
/* An online entry replaces the calibration's estimate once it holds this many
 * measurements. */
#define TD_AD_MIN_SAMPLES 3
/* A deeper k whose predicted rate is within this fraction of the best is taken:
 * the acceptance of positions beyond the k in use is never observed (td_ad_observe
 * sees only the drafted positions), so a request drafting at k holds stale, and in
 * practice low, estimates for k+1 (on the 27B-proportioned model auto split 3/4
 * where depth 4 measured 25% faster: bench/results/autodepth-quiet-2026-12-01.md). */
#define TD_AD_DEEPER_MARGIN 0.02
/* A request keeps the depth it chose last while that is predicted within this
 * fraction of the best: switching between two depths that price alike breaks
 * what consecutive steps at one depth build (on the random model's repeating
 * text, a step length locked onto the period: auto alternating 2 and 4
 * accepted 88.8 / 82.2 / 60.9 / 44.4% at positions 1-4 of its depth-4 steps,
 * fixed depth 4 90.2 / 86.9 / 77.1 / 61.4%), and each switch acts on a noisy
 * difference of a few percent. */
#define TD_AD_STICKY 0.05
/* Drafting at all (any auto request of the step at k > 0) must be predicted
 * this much faster than the same step with every auto request at 0. The
 * costs compared are wall-clock figures measured at different times on a
 * machine whose speed drifts (the demo model under 4 clients on a shared
 * 2-core host: the same 4-token step measured 0.9 ms, then 2.2 ms a few
 * seconds later); a predicted gain of a few percent is inside that noise,
 * and a wrong draft costs real compute where a verify row is not free. */
#define TD_AD_DRAFT_MARGIN 1.10

/* Decayed conditional acceptance per position: p_j = a[j] / n[j]
 * (j = 0 is the first draft). */
typedef struct td_ad_accept {
    double n[TD_MAX_SPEC_DEPTH], a[TD_MAX_SPEC_DEPTH];
} td_ad_accept;

/* Measured step costs, seconds. fwd[T]: a step whose target forward runs
 * over T tokens, measured by gen.c from the forward to the last token out
 * (acceptance, sampling, the emit callbacks: what a step really costs);
 * mtp[m]: one MTP pass over m requests and choosing their drafts; each the
 * lower third of the entry's last TD_AD_COST_WIN measurements (win_*). n*: how
 * many measurements an entry holds (0 = unknown). cal*: the start-up
 * calibration (the forward alone); an entry real steps have not visited
 * (TD_AD_MIN_SAMPLES times, yet) reads calibration x the ratio real / calibration of the
 * nearest visited entries (interpolated between the one below and the one
 * above), so the overhead outside the forward counts and the calibrated
 * shape is kept: a 4-token decode step of 4 requests that really costs 1.1x
 * its calibration prices an unvisited 8-token step at 1.1x its calibration,
 * not at the global ratio of steps of every size (rho, the fallback when
 * no entry was visited; prefill-sized steps, whose calibration is
 * extrapolated, pulled it to 0.3-2x) and so never below the 4-token step. */
typedef struct td_ad_costs {
    double fwd[TD_AD_MAX_T + 1];
    uint32_t n_fwd[TD_AD_MAX_T + 1];
    float win_fwd[TD_AD_MAX_T + 1][TD_AD_COST_WIN];
    uint64_t at_fwd[TD_AD_MAX_T + 1]; /* n_steps when the entry was last measured */
    uint64_t n_steps;                 /* forwards measured so far */
    double mtp[TD_AD_MAX_M + 1];
    uint32_t n_mtp[TD_AD_MAX_M + 1];
    float win_mtp[TD_AD_MAX_M + 1][TD_AD_COST_WIN];
    double cal_fwd[TD_AD_MAX_T + 1], cal_mtp[TD_AD_MAX_M + 1];
    uint32_t n_cal_fwd[TD_AD_MAX_T + 1], n_cal_mtp[TD_AD_MAX_M + 1];
    double rho_fwd, rho_mtp;
    double cal_fwd_d[TD_AD_MAX_T + 1], cal_mtp_d[TD_AD_MAX_M + 1];
    bool cal_dirty;
    /* dense interpolated copies, rebuilt when a measurement came in */
    double fwd_d[TD_AD_MAX_T + 1], mtp_d[TD_AD_MAX_M + 1];
    bool dirty;
} td_ad_costs;

/* Decayed steps and tokens emitted, by depth (see TD_AD_REAL_DECAY). */
typedef struct td_ad_real {
    double n[TD_MAX_SPEC_DEPTH + 1], sum[TD_MAX_SPEC_DEPTH + 1];
} td_ad_real;

/* The exploration schedule (see TD_AD_EXPLORE_BURST), engine-wide: a
 * request lives a few dozen steps (128 tokens at 2-4 per step), so an
 * interval per request would never come round; one request's burst seeds
 * every later request through the engine-wide realized figures. */
typedef struct td_ad_explore {
    int since;           /* drafting steps of auto requests since the last burst began */
    int every;           /* the interval now */
} td_ad_explore;

/* Engine-wide state (td_engine.ad): the cost table, the server-wide
 * acceptance every new request is seeded from, and the chosen-depth totals. */
typedef struct td_ad_engine {
    td_ad_costs costs;
    td_ad_accept global[2];  /* [0] greedy, [1] sampled requests (acceptance falls with temperature) */
    td_ad_real real[2];      /* realized tokens per step by depth, from auto requests, the same two buckets */
    td_ad_explore explore;
    double measure_credit;   /* MTP prompt rows a measuring request may still spend (TD_AD_MEASURE_SHARE) */
    int n_live;              /* requests begun and not yet ended, any depth: the batch a new one joins */
    bool calibrated;
} td_ad_engine;

/* Now and then an auto request keeps MTP tracking and probes even where
 * drafting does not pay (td_ad_worth_tracking), so the engine-wide
 * acceptance and costs keep being measured; such a request (measure_only)
 * runs at depth 0 but for its probes (one draft token every 16..256 steps):
 * drafting deeper where it was predicted not to pay would slow every request
 * of its batch (each MTP pass holds up the whole step). What it costs is
 * the MTP layer over its prompt, so measuring is budgeted in prompt rows:
 * every auto request that does not track adds TD_AD_MEASURE_SHARE of its
 * prompt to ae->measure_credit, and the first whose whole prompt fits the
 * credit measures and spends it (td_ad_measure_turn). Measuring thus takes
 * at most that share of the MTP rows tracking every request would, and
 * falls on short prompts. It was every 8th request, whatever its prompt: under 4
 * clients on the 27B-proportioned model that was the 9th request of each
 * load, a 464-token prompt, 525 of the ~700 MTP rows a load ran, for 2 probes
 * (bench/results/autodepth-measure-2026-12-07.md). */
#define TD_AD_MEASURE_SHARE (1.0 / 32)
/* Tracking must buy at least this much predicted speedup (its own cost: the MTP
 * layer over every prompt token and a pass per generated one, on top of
 * TD_AD_DRAFT_MARGIN's noise). */
#define TD_AD_TRACK_MARGIN 1.15
/* A request that tracks because drafting paid when it began (a batch of one
 * or two) keeps paying for it when the batch grows and depth 0 becomes the
 * choice: the first requests of a 4-client load began alone, tracked and
 * chose depth 0 on 96-99% of their steps
 * (bench/results/autodepth-realized-2026-12-07.md). So a tracking request
 * (not a measuring one, TD_AD_MEASURE_SHARE) whose choice has been 0 for
 * TD_AD_UNTRACK_AFTER consecutive steps, in a batch of the requests now
 * live where td_ad_worth_tracking says no, stops tracking and runs as a
 * fixed depth-0 request from there (td_ad_stop_tracking). The number is one
 * probe interval (TD_AD_PROBE_MIN): its first probe has been seen. */
#define TD_AD_UNTRACK_AFTER TD_AD_PROBE_MIN

/* Realized tokens per step, by depth. The per-position acceptance model
 * (td_ad_expected) takes positions as independent of the depth in use, and
 * learns position j only where it drafts j. Where acceptance depends on
 * the depth, that model misjudges the depths not in use: greedy text that
 * repeats with period P lets the step length lock onto it, so the
 * 27B-proportioned random model accepted 100% / 96.6% at positions 1 / 2
 * at depth 4 but 86-92% at depths 1-3, and auto, learning at depth 2,
 * priced depth 4 below it and stayed there 95% of the steps, 6.5-7.7%
 * behind depth 4 (bench/results/int8-grouped-2026-12-07.md). So each
 * request also keeps, per depth k, the tokens its steps at k emitted
 * (accepted + 1) and the steps, both decayed by TD_AD_REAL_DECAY every
 * decode step (a depth measured long ago fades back to the model); a step
 * counts for k only when the one before it also ran at k (the first starts
 * where another depth left the text). The choice reads E[emitted | k] as
 * that mean shrunk toward the per-position model by TD_AD_REAL_PRIOR
 * pseudo-steps. */
#define TD_AD_REAL_DECAY 0.97
#define TD_AD_REAL_PRIOR 4.0
/* The engine-wide figures (td_ad_engine.real) decay by this at every settled
 * step of any auto request; a new request starts from them at a weight of at
 * most TD_AD_REAL_SEED steps per depth. */
#define TD_AD_GLOBAL_REAL_DECAY 0.99
#define TD_AD_REAL_SEED 8.0
/* Exploration: every `every` drafting steps of auto requests
 * (td_ad_explore: TD_AD_EXPLORE_MIN, doubling up to TD_AD_EXPLORE_MAX
 * while a burst does not change the choice), the next request drafting at
 * 0 < k < max runs TD_AD_EXPLORE_BURST consecutive steps at a deeper depth,
 * so a depth the model prices low is measured as it really runs
 * (consecutive: a lock-on needs a few steps to form). Only deeper: a shallower depth's positions are
 * the ones being observed now, a deeper one's are stale or the prior. Which
 * one: among those predicted within TD_AD_EXPLORE_WINDOW of the choice's
 * rate, the least measured (ties: the deeper). Its cost is bounded: at most
 * BURST / (BURST + MIN) of the steps, each predicted at most WINDOW
 * slower. In a simulated engine (tests/c/test_autodepth.c, sim_run: 18
 * requests of 128 tokens, 10 seeds) on periodic text where depth 4 runs
 * 21% faster than the depth 2 the model picks, auto went from 0.83 to 0.96
 * of the best fixed depth; where acceptance does not depend on the depth
 * (i.i.d.) it costs 0.5%. On the random model itself, int8 AVX2, 5 runs:
 * 1.01 / 1.00 / 1.01x depth 4 (edit / code / prose), from 0.94-0.99x
 * (bench/results/autodepth-realized-2026-12-07.md). */
#define TD_AD_EXPLORE_BURST 8
#define TD_AD_EXPLORE_MIN 48
#define TD_AD_EXPLORE_MAX 384
#define TD_AD_EXPLORE_WINDOW 0.25

/* Per request. */
typedef struct td_ad_state {
    int bucket;          /* global[bucket]: 0 greedy, 1 sampled */
    td_ad_accept acc;
    int since_draft;     /* steps at depth 0 since the last draft */
    int probe;           /* probe interval now */
    bool probing;        /* the last step was a probe */
    bool measure_only;   /* tracks only to keep the figures measured (TD_AD_MEASURE_SHARE): depth 0 but for its probes */
    int probe_base;      /* the choice before that probe */
    td_ad_real real;     /* realized, by depth: seeded from the engine's, then its own */
    int burst_k, burst_left; /* a burst in progress: its depth and the steps left */
    int burst_from;      /* the choice the burst interrupted */
    bool burst_ended;    /* the next choice decides the backoff */
    int last_k;          /* the depth of the last drafting step observed */
    int last_choice;     /* 1 + the depth td_ad_next last chose outside bursts and probes (0: none) */
    int zero_run;        /* consecutive choices of depth 0 (td_ad_next, outside bursts) */
    uint64_t explored;   /* steps run in bursts */
    uint64_t steps;      /* decode steps so far (forced schedule) */
    uint64_t force_seed; /* test hook: non-zero = depth from a hash of (seed, step) */
} td_ad_state;

/* One request's input to the batch choice. */
typedef struct td_ad_req {
    double p[TD_MAX_SPEC_DEPTH]; /* conditional acceptance per position */
    int kmax;            /* largest depth allowed this step (cap by max_tokens, context) */
    bool fixed;          /* not auto: k is given */
    int k;               /* in: the fixed depth; out: the choice */
    double real[TD_MAX_SPEC_DEPTH + 1], real_w[TD_MAX_SPEC_DEPTH + 1]; /* realized E[emitted | k] and its weight (0: none; td_ad_req_from_state) */
    double rate[TD_MAX_SPEC_DEPTH + 1]; /* out (auto requests): the step's predicted tokens/s with this request at k, the others as chosen */
    int prev;            /* 1 + the depth chosen at its last step (0: none), kept while within TD_AD_STICKY of the best */
} td_ad_req;

void td_ad_engine_init(td_ad_engine *e);
void td_ad_costs_init(td_ad_costs *c);
/* Adds a measurement (the entry: the lower third of its last TD_AD_COST_WIN).
 * T or m out of range are clamped to the table. */
void td_ad_costs_fwd(td_ad_costs *c, int tokens, double seconds);
void td_ad_costs_mtp(td_ad_costs *c, int m, double seconds);
/* Calibration entries (spec/calibrate.c). */
void td_ad_costs_cal_fwd(td_ad_costs *c, int tokens, double seconds);
void td_ad_costs_cal_mtp(td_ad_costs *c, int m, double seconds);
/* Interpolated cost (linear between measured entries; beyond the largest,
 * extrapolated with the last measured slope, never decreasing; an empty
 * table reads 1e-3 s per forward and 1e-4 s per MTP pass, with a slope of
 * 1/8 per token). Rebuilds the dense copies when dirty. */
double td_ad_fwd(td_ad_costs *c, int tokens);
double td_ad_mtp(td_ad_costs *c, int m);

/* p_j of a, with n < 1e-9 reading 0.5. */
double td_ad_p(const td_ad_accept *a, int j);
/* The engine-wide p_j a new request starts from: g's rate shrunk toward
 * TD_AD_P_PRIOR by TD_AD_GLOBAL_PRIOR_WEIGHT pseudo-observations (NULL or
 * nothing measured: the prior). Read raw, a position seen once or twice
 * (deeper positions are drafted rarely where auto mostly runs at 0) gave
 * 0.00 or 1.00, and every later request planned as if it were certain: on
 * the 27B-shaped model under 4 clients p_3 read 0.00 after one rejection,
 * p_2 1.00 after two acceptances, and no request tracked after the first
 * four. */
double td_ad_p_global(const td_ad_accept *g, int j);
/* E[accepted + 1 | k] = 1 + sum_{i=1..k} prod_{j<i+1} p_j. */
double td_ad_expected(const double *p, int k);
/* A verify drafted k and accepted a: updates positions 0..min(a, k-1)
 * with decay `decay`. */
void td_ad_observe(td_ad_accept *acc, int k, int a, double decay);
/* A request's step at depth k (> 0) accepted a: its per-position acceptance
 * (TD_AD_DECAY) and its realized tokens at k, and those of `global` (the
 * engine's, for its bucket; NULL: none). */
void td_ad_observe_step(td_ad_state *s, td_ad_real *global, int k, int a);
/* A new request's realized figures from the engine's (see TD_AD_REAL_SEED). */
void td_ad_state_seed_real(td_ad_state *s, const td_ad_real *global);
/* The schedule at its start: TD_AD_EXPLORE_MIN, nothing counted. */
void td_ad_explore_init(td_ad_explore *x);
/* E[emitted | k] the choice uses for r: the per-position model, blended
 * with the realized mean where there is one. */
double td_ad_req_expected(const td_ad_req *r, int k);
/* r's acceptance inputs from an auto request's state (p, real, real_w);
 * during an exploration burst r is fixed at the burst's depth (capped by
 * r->kmax, which the caller sets first). */
void td_ad_req_from_state(td_ad_req *r, const td_ad_state *s);
/* A new request's state: prior = the engine-wide figures at
 * TD_AD_PRIOR_WEIGHT observations per position (td_ad_p_global). */
void td_ad_state_init(td_ad_state *s, const td_ad_accept *global, uint64_t force_seed);
/* Whether a new request should keep MTP tracking (and so be able to
 * draft): the depths td_ad_choose picks for `batch` requests alike (the new
 * one and those already running), with the engine-wide acceptance `global`
 * (td_ad_p_global), are predicted at least
 * `margin` times faster than depth 0 for all of them. A request that does
 * not track runs exactly as a fixed depth-0 one (no MTP work at all): where
 * drafting does not pay (a model in cache; a batch whose verify rows cost
 * real compute), tracking itself is the largest cost of `auto`: the MTP
 * layer over every prompt token (~1/12 of a prefill on the 27B shape) and
 * one pass per generated token. */
bool td_ad_worth_tracking(td_ad_costs *c, const td_ad_accept *global, int kmax, int batch, double margin);

/* Whether the tracking auto request s should stop tracking now: it is not
 * a measuring one nor under the forced test schedule, its choice has been 0
 * for TD_AD_UNTRACK_AFTER steps, and `worth_now` (td_ad_worth_tracking for
 * the batch it runs in) is false. */
bool td_ad_stop_tracking(const td_ad_state *s, bool worth_now);

/* For an auto request of n_prompt tokens that will not track: adds its
 * share to ae->measure_credit (TD_AD_MEASURE_SHARE) and returns whether it
 * measures (its whole prompt fits the credit, which it then spends). */
bool td_ad_measure_turn(td_ad_engine *ae, int n_prompt);
/* Gives back what td_ad_measure_turn spent, for a request that will not measure after all. */
void td_ad_measure_refund(td_ad_engine *ae, int n_prompt);

/* Chooses k for every non-fixed request of the step (in place), given
 * `extra_tokens` prefill tokens in the same target forward. Coordinate
 * ascent on the step's expected tokens/s, two passes, ties to the lower
 * depth; every auto request at 0 unless that choice is predicted
 * TD_AD_DRAFT_MARGIN faster. Returns the predicted tokens/s. */
double td_ad_choose(td_ad_costs *c, td_ad_req *r, int n, int extra_tokens);
/* The objective itself (tests, reports): sum E / (draft + forward). */
double td_ad_rate(td_ad_costs *c, const td_ad_req *r, int n, int extra_tokens);

/* Whether this step should run every non-fixed request at k = 0 to measure
 * the cost it is compared against: a decode-only step (extra_tokens 0)
 * whose token count at k = 0 (fixed requests at their k, the others at 0)
 * has fewer than TD_AD_MIN_SAMPLES online measurements, or none in the last
 * TD_AD_BASE_EVERY forwards. Without it a batch that always drafts never
 * times its own depth-0 step, which is then read from the start-up
 * calibration scaled by the ratio the drafting steps showed (off by 10-25%
 * on a shared 2-core machine), and an entry that one noisy step made look
 * expensive is never visited again to be corrected (the probes explore
 * the other way, 0 -> 1): every comparison is then made against a wrong
 * baseline. Costs at most one depth-0 step in TD_AD_BASE_EVERY. */
#define TD_AD_BASE_EVERY 128
bool td_ad_measure_base(const td_ad_costs *c, const td_ad_req *r, int n, int extra_tokens);

/* After td_ad_choose: the probe rule for one request (returns the k to run).
 * choice: what td_ad_choose gave; kmax as in td_ad_req. */
int td_ad_probe(td_ad_state *s, int choice, int kmax);
/* After td_ad_choose, for an auto request whose r came from
 * td_ad_req_from_state: the k to run, with exploration bursts (above) on
 * top of the probe rule. */
int td_ad_next(td_ad_state *s, td_ad_explore *x, const td_ad_req *r);
/* Test hook: the forced depth for step `step` (0..kmax). */
int td_ad_forced(uint64_t seed, uint64_t step, int kmax);
#endif
