/* Adaptive draft depth: the policy (see autodepth.h). */
#include "spec/autodepth.h"
#include <string.h>

void td_ad_costs_init(td_ad_costs *c) {
    memset(c, 0, sizeof *c);
    c->dirty = c->cal_dirty = true;
    c->rho_fwd = c->rho_mtp = 1.0;
}

void td_ad_engine_init(td_ad_engine *e) {
    memset(e, 0, sizeof *e);
    td_ad_costs_init(&e->costs);
    td_ad_explore_init(&e->explore);
}

void td_ad_explore_init(td_ad_explore *x) {
    x->since = 0;
    x->every = TD_AD_EXPLORE_MIN;
}

static void add(double *v, uint32_t *n, double x) {
    if (!(x >= 0) || x > 1e6) return; /* NaN or absurd */
    if (*n == 0) *v = x;
    else *v += TD_AD_COST_ALPHA * (x - *v);
    if (*n < 1000000) (*n)++;
}

/* An online entry: x into its window, the entry = the window's lower third
 * (its smallest of up to 3, its 3rd smallest of 9). */
static void add_online(double *v, uint32_t *n, float *win, double x) {
    if (!(x >= 0) || x > 1e6) return;
    if (*n >= 1000000u * TD_AD_COST_WIN) *n -= TD_AD_COST_WIN; /* bounded; a multiple of the window keeps the ring's order */
    win[*n % TD_AD_COST_WIN] = (float)x;
    (*n)++;
    int m = *n < TD_AD_COST_WIN ? (int)*n : TD_AD_COST_WIN;
    float s[TD_AD_COST_WIN];
    memcpy(s, win, (size_t)m * sizeof *s);
    for (int i = 1; i < m; i++) /* insertion sort of <= 9 */
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) { float t = s[j]; s[j] = s[j - 1]; s[j - 1] = t; }
    *v = s[(m - 1) / 3];
}

static void densify(const double *v, const uint32_t *n, int max, double empty1, double *d);

/* rho: the running ratio of a real measurement to the calibration at its size */
static void track_rho(double *rho, double *cal_d, const double *cal, const uint32_t *n_cal, bool *cal_dirty, int max, int i, double x) {
    bool any = false;
    for (int j = 1; j <= max && !any; j++) any = n_cal[j] > 0;
    if (!any) return;
    if (*cal_dirty) { densify(cal, n_cal, max, 1, cal_d); *cal_dirty = false; }
    if (cal_d[i] > 0 && x >= 0 && x < 1e6) *rho += TD_AD_COST_ALPHA * (x / cal_d[i] - *rho);
}

void td_ad_costs_fwd(td_ad_costs *c, int tokens, double seconds) {
    if (tokens < 1) return;
    if (tokens > TD_AD_MAX_T) tokens = TD_AD_MAX_T;
    add_online(&c->fwd[tokens], &c->n_fwd[tokens], c->win_fwd[tokens], seconds);
    c->at_fwd[tokens] = ++c->n_steps;
    track_rho(&c->rho_fwd, c->cal_fwd_d, c->cal_fwd, c->n_cal_fwd, &c->cal_dirty, TD_AD_MAX_T, tokens, seconds);
    c->dirty = true;
}

void td_ad_costs_mtp(td_ad_costs *c, int m, double seconds) {
    if (m < 1) return;
    if (m > TD_AD_MAX_M) m = TD_AD_MAX_M;
    add_online(&c->mtp[m], &c->n_mtp[m], c->win_mtp[m], seconds);
    track_rho(&c->rho_mtp, c->cal_mtp_d, c->cal_mtp, c->n_cal_mtp, &c->cal_dirty, TD_AD_MAX_M, m, seconds);
    c->dirty = true;
}

void td_ad_costs_cal_fwd(td_ad_costs *c, int tokens, double seconds) {
    if (tokens < 1 || tokens > TD_AD_MAX_T) return;
    add(&c->cal_fwd[tokens], &c->n_cal_fwd[tokens], seconds);
    c->dirty = c->cal_dirty = true;
}

void td_ad_costs_cal_mtp(td_ad_costs *c, int m, double seconds) {
    if (m < 1 || m > TD_AD_MAX_M) return;
    add(&c->cal_mtp[m], &c->n_cal_mtp[m], seconds);
    c->dirty = c->cal_dirty = true;
}

/* Dense table d[1..max] from the measured entries: linear between them,
 * flat-then-sloped outside; made non-decreasing (a noisy larger step does
 * not read cheaper than a smaller one). */
static void densify(const double *v, const uint32_t *n, int max, double empty1, double *d) {
    int first = 0, last = 0, prev = 0;
    for (int i = 1; i <= max; i++)
        if (n[i]) { if (!first) first = i; last = i; }
    if (!first) {
        for (int i = 1; i <= max; i++) d[i] = empty1 * (1.0 + (i - 1) / 8.0);
        d[0] = 0;
        return;
    }
    for (int i = 1, nx = 0; i <= max; i++) {
        if (n[i]) { d[i] = v[i]; prev = i; continue; }
        if (i < first) { d[i] = v[first]; continue; }
        if (i > last) break;
        if (nx <= i) /* the next measured entry, once per gap (a scan per entry was quadratic in the gap) */
            for (nx = i + 1; !n[nx]; nx++) {}
        d[i] = v[prev] + (v[nx] - v[prev]) * (double)(i - prev) / (double)(nx - prev);
    }
    /* beyond the last measured: the slope of the last two measured entries
     * (or 1/8 of the cost per token when only one is known) */
    int p2 = 0;
    for (int i = last - 1; i >= 1; i--)
        if (n[i]) { p2 = i; break; }
    double slope = p2 ? (v[last] - v[p2]) / (double)(last - p2) : v[last] / 8.0;
    if (slope < 0) slope = 0;
    for (int i = last + 1; i <= max; i++) d[i] = v[last] + slope * (double)(i - last);
    for (int i = 2; i <= max; i++)
        if (d[i] < d[i - 1]) d[i] = d[i - 1];
    d[0] = 0;
}

/* Online entries measured at least TD_AD_MIN_SAMPLES times win; elsewhere, when there is a
 * calibration, the calibration x the ratio online / calibration of the
 * nearest such entries (linear in T between the one below and the one
 * above; rho when there is none), else the online entries interpolated. */
static void merge(double *d, const double *v, const uint32_t *n, const uint32_t *n_cal, const double *cal_d, double rho, int max) {
    bool cal = false;
    for (int i = 1; i <= max && !cal; i++) cal = n_cal[i] > 0;
    if (!cal) return;
    int lo = 0; /* the last visited entry below i */
    for (int i = 1; i <= max; i++) {
        if (n[i] >= TD_AD_MIN_SAMPLES) {
            d[i] = v[i];
            lo = i;
            continue;
        }
        int hi = i + 1;
        while (hi <= max && n[hi] < TD_AD_MIN_SAMPLES) hi++;
        double rlo = lo && cal_d[lo] > 0 ? v[lo] / cal_d[lo] : -1, rhi = hi <= max && cal_d[hi] > 0 ? v[hi] / cal_d[hi] : -1;
        for (int j = i; j < hi && j <= max; j++) /* the gap up to hi shares lo and hi: filled in one go */
            d[j] = cal_d[j] * (rlo >= 0 && rhi >= 0 ? rlo + (rhi - rlo) * (double)(j - lo) / (double)(hi - lo)
                               : rlo >= 0                ? rlo
                               : rhi >= 0                ? rhi
                                                         : rho);
        i = hi - 1;
    }
    /* the filled entries non-decreasing; measured ones stay as measured: raising
     * a measured entry to a noisy smaller one made every token between them
     * free, which is what a draft then looks like (a 3-token entry read high
     * lifted the 4-token one from its measured 0.9 ms to 1.9 ms, and 4
     * requests at depth 1 looked almost free) */
    for (int i = 2; i <= max; i++)
        if (n[i] < TD_AD_MIN_SAMPLES && d[i] < d[i - 1]) d[i] = d[i - 1];
}

static void rebuild(td_ad_costs *c) {
    if (!c->dirty) return;
    if (c->cal_dirty) {
        densify(c->cal_fwd, c->n_cal_fwd, TD_AD_MAX_T, 1, c->cal_fwd_d);
        densify(c->cal_mtp, c->n_cal_mtp, TD_AD_MAX_M, 1, c->cal_mtp_d);
        c->cal_dirty = false;
    }
    densify(c->fwd, c->n_fwd, TD_AD_MAX_T, 1e-3, c->fwd_d);
    densify(c->mtp, c->n_mtp, TD_AD_MAX_M, 1e-4, c->mtp_d);
    merge(c->fwd_d, c->fwd, c->n_fwd, c->n_cal_fwd, c->cal_fwd_d, c->rho_fwd, TD_AD_MAX_T);
    merge(c->mtp_d, c->mtp, c->n_mtp, c->n_cal_mtp, c->cal_mtp_d, c->rho_mtp, TD_AD_MAX_M);
    c->dirty = false;
}

double td_ad_fwd(td_ad_costs *c, int tokens) {
    rebuild(c);
    if (tokens <= 0) return 0;
    if (tokens > TD_AD_MAX_T) { /* linear beyond the table */
        double s = c->fwd_d[TD_AD_MAX_T] - c->fwd_d[TD_AD_MAX_T - 1];
        return c->fwd_d[TD_AD_MAX_T] + s * (tokens - TD_AD_MAX_T);
    }
    return c->fwd_d[tokens];
}

double td_ad_mtp(td_ad_costs *c, int m) {
    rebuild(c);
    if (m <= 0) return 0;
    if (m > TD_AD_MAX_M) m = TD_AD_MAX_M;
    return c->mtp_d[m];
}

double td_ad_p(const td_ad_accept *a, int j) {
    if (j < 0 || j >= TD_MAX_SPEC_DEPTH || a->n[j] < 1e-9) return 0.5;
    double p = a->a[j] / a->n[j];
    return p < 0 ? 0 : p > 1 ? 1 : p;
}

double td_ad_expected(const double *p, int k) {
    double e = 1, prod = 1;
    for (int i = 0; i < k && i < TD_MAX_SPEC_DEPTH; i++) {
        prod *= p[i];
        e += prod;
    }
    return e;
}

double td_ad_p_global(const td_ad_accept *g, int j) {
    if (!g || j < 0 || j >= TD_MAX_SPEC_DEPTH || !(g->n[j] >= 0) || !(g->a[j] >= 0)) return TD_AD_P_PRIOR;
    double p = (g->a[j] + TD_AD_GLOBAL_PRIOR_WEIGHT * TD_AD_P_PRIOR) / (g->n[j] + TD_AD_GLOBAL_PRIOR_WEIGHT);
    return p < 0 ? 0 : p > 1 ? 1 : p;
}

void td_ad_observe(td_ad_accept *acc, int k, int a, double decay) {
    if (k > TD_MAX_SPEC_DEPTH) k = TD_MAX_SPEC_DEPTH;
    for (int j = 0; j < k && j <= a; j++) {
        acc->n[j] = acc->n[j] * decay + 1;
        acc->a[j] = acc->a[j] * decay + (j < a ? 1 : 0);
    }
}

void td_ad_state_init(td_ad_state *s, const td_ad_accept *global, uint64_t force_seed) {
    memset(s, 0, sizeof *s);
    for (int j = 0; j < TD_MAX_SPEC_DEPTH; j++) {
        double p = td_ad_p_global(global, j);
        s->acc.n[j] = TD_AD_PRIOR_WEIGHT;
        s->acc.a[j] = TD_AD_PRIOR_WEIGHT * p;
    }
    s->probe = TD_AD_PROBE_MIN;
    s->force_seed = force_seed;
}

void td_ad_state_seed_real(td_ad_state *s, const td_ad_real *g) {
    memset(&s->real, 0, sizeof s->real);
    if (!g) return;
    for (int k = 1; k <= TD_MAX_SPEC_DEPTH; k++) {
        if (!(g->n[k] > 1e-9) || !(g->sum[k] >= 0)) continue;
        double w = g->n[k] < TD_AD_REAL_SEED ? g->n[k] : TD_AD_REAL_SEED;
        s->real.n[k] = w;
        s->real.sum[k] = w * g->sum[k] / g->n[k];
    }
}

void td_ad_observe_step(td_ad_state *s, td_ad_real *global, int k, int a) {
    if (k < 1) return;
    if (k > TD_MAX_SPEC_DEPTH) k = TD_MAX_SPEC_DEPTH;
    if (a < 0) a = 0;
    if (a > k) a = k;
    td_ad_observe(&s->acc, k, a, TD_AD_DECAY);
    bool settled = k == s->last_k; /* a step right after one at another depth starts where that depth left the text: not k's own */
    s->last_k = k;
    if (!settled) return;
    s->real.n[k] += 1;
    s->real.sum[k] += a + 1;
    if (global) {
        for (int j = 1; j <= TD_MAX_SPEC_DEPTH; j++) global->n[j] *= TD_AD_GLOBAL_REAL_DECAY, global->sum[j] *= TD_AD_GLOBAL_REAL_DECAY;
        global->n[k] += 1;
        global->sum[k] += a + 1;
    }
}

double td_ad_req_expected(const td_ad_req *r, int k) {
    if (k <= 0) return 1;
    if (k > TD_MAX_SPEC_DEPTH) k = TD_MAX_SPEC_DEPTH;
    double model = td_ad_expected(r->p, k), w = r->real_w[k];
    if (!(w > 0) || !(r->real[k] >= 1)) return model;
    return (w * r->real[k] + TD_AD_REAL_PRIOR * model) / (w + TD_AD_REAL_PRIOR);
}

void td_ad_req_from_state(td_ad_req *r, const td_ad_state *s) {
    for (int j = 0; j < TD_MAX_SPEC_DEPTH; j++) r->p[j] = td_ad_p(&s->acc, j);
    r->real[0] = 1, r->real_w[0] = 0;
    for (int k = 1; k <= TD_MAX_SPEC_DEPTH; k++) {
        r->real_w[k] = s->real.n[k];
        r->real[k] = s->real.n[k] > 1e-9 ? s->real.sum[k] / s->real.n[k] : 0;
    }
    r->prev = s->last_choice;
    if (s->burst_left > 0) {
        r->fixed = true;
        r->k = s->burst_k < r->kmax ? s->burst_k : r->kmax;
    }
}

/* The depth an exploration burst runs from `choice`: a deeper one within the
 * window of the choice's predicted rate, the least measured (ties, within
 * half a step of weight: the deeper); 0: none. */
static int explore_pick(const td_ad_req *r, int choice) {
    int pick = 0;
    double floor = r->rate[choice] * (1 - TD_AD_EXPLORE_WINDOW);
    for (int k = r->kmax; k >= 1; k--) {
        if (k <= choice || !(r->rate[k] >= floor)) continue;
        if (!pick || r->real_w[k] < r->real_w[pick] - 0.5) pick = k;
    }
    return pick;
}

/* One step of a burst: a drafting step of the request's own, counted as explored. */
static void burst_step(td_ad_state *s) {
    s->steps++;
    s->explored++;
    s->since_draft = 0;
}

int td_ad_next(td_ad_state *s, td_ad_explore *x, const td_ad_req *r) {
    for (int k = 1; k <= TD_MAX_SPEC_DEPTH; k++) { /* every step: what a depth measured long ago fades back to the model */
        s->real.n[k] *= TD_AD_REAL_DECAY;
        s->real.sum[k] *= TD_AD_REAL_DECAY;
    }
    if (s->burst_left > 0) { /* r was fixed at the burst's depth */
        burst_step(s);
        if (--s->burst_left == 0) s->burst_ended = true;
        return r->k;
    }
    int choice = r->k;
    s->last_choice = choice + 1;
    s->zero_run = choice == 0 ? s->zero_run + 1 : 0;
    if (s->burst_ended) { /* the choice after a burst: the same as before it, explore less often */
        s->burst_ended = false;
        if (choice == s->burst_from) x->every = x->every * 2 > TD_AD_EXPLORE_MAX ? TD_AD_EXPLORE_MAX : x->every * 2;
        else x->every = TD_AD_EXPLORE_MIN;
    }
    if (choice > 0 && ++x->since >= x->every) {
        int k = explore_pick(r, choice);
        if (k > 0) {
            x->since = 0;
            s->burst_k = k, s->burst_from = choice;
            s->burst_left = TD_AD_EXPLORE_BURST - 1;
            s->burst_ended = s->burst_left == 0;
            burst_step(s);
            s->probe = TD_AD_PROBE_MIN;
            return k;
        }
    }
    return td_ad_probe(s, choice, r->kmax);
}

/* The step's rate with the sums kept by the caller: E total, tokens, and
 * rows per MTP pass. */
static double rate_of(td_ad_costs *c, double e, int tokens, const int *pass_rows, int max_k) {
    double t = td_ad_fwd(c, tokens);
    for (int j = 0; j < max_k; j++) t += td_ad_mtp(c, pass_rows[j]);
    return t > 0 ? e / t : 0;
}

double td_ad_rate(td_ad_costs *c, const td_ad_req *r, int n, int extra_tokens) {
    int rows[TD_MAX_SPEC_DEPTH] = {0}, tokens = extra_tokens, max_k = 0;
    double e = 0;
    for (int i = 0; i < n; i++) {
        e += td_ad_req_expected(&r[i], r[i].k);
        tokens += r[i].k + 1;
        for (int j = 0; j < r[i].k; j++) rows[j]++;
        if (r[i].k > max_k) max_k = r[i].k;
    }
    return rate_of(c, e, tokens, rows, max_k);
}

double td_ad_choose(td_ad_costs *c, td_ad_req *r, int n, int extra_tokens) {
    rebuild(c);
    int rows[TD_MAX_SPEC_DEPTH] = {0}, tokens = extra_tokens;
    double e = 0;
    for (int i = 0; i < n; i++) { /* start: fixed ones as given, auto ones at 0 */
        if (r[i].kmax < 0) r[i].kmax = 0;
        if (r[i].kmax > TD_MAX_SPEC_DEPTH) r[i].kmax = TD_MAX_SPEC_DEPTH;
        if (!r[i].fixed) r[i].k = 0;
        if (r[i].k > r[i].kmax) r[i].k = r[i].kmax;
        memset(r[i].rate, 0, sizeof r[i].rate);
        e += td_ad_req_expected(&r[i], r[i].k);
        tokens += r[i].k + 1;
        for (int j = 0; j < r[i].k; j++) rows[j]++;
    }
    double base = td_ad_rate(c, r, n, extra_tokens); /* the start: every auto request at 0 */
    double best_rate = 0;
    for (int pass = 0; pass < 2; pass++) {
        bool changed = false;
        for (int i = 0; i < n; i++) {
            if (r[i].fixed || r[i].kmax == 0) continue;
            int k0 = r[i].k;
            /* take request i out */
            double e0 = e - td_ad_req_expected(&r[i], k0);
            int t0 = tokens - (k0 + 1);
            for (int j = 0; j < k0; j++) rows[j]--;
            int others_max = 0;
            for (int j = 0; j < TD_MAX_SPEC_DEPTH; j++)
                if (rows[j] > 0) others_max = j + 1;
            int best = 0;
            double br = -1, rts[TD_MAX_SPEC_DEPTH + 1];
            for (int k = 0; k <= r[i].kmax; k++) {
                if (k > 0) rows[k - 1]++;
                int mk = k > others_max ? k : others_max;
                rts[k] = rate_of(c, e0 + td_ad_req_expected(&r[i], k), t0 + k + 1, rows, mk);
                r[i].rate[k] = rts[k];
                if (rts[k] > br * (1 + 1e-9)) { br = rts[k]; best = k; }
            }
            /* the deepest k within TD_AD_DEEPER_MARGIN of the best (see autodepth.h) */
            for (int k = r[i].kmax; k > best; k--)
                if (rts[k] >= br * (1 - TD_AD_DEEPER_MARGIN)) { best = k; br = rts[k]; break; }
            /* the depth it ran at last, while within TD_AD_STICKY of the best (see autodepth.h) */
            int pk = r[i].prev - 1;
            if (pk >= 0 && pk <= r[i].kmax && pk != best && rts[pk] >= br * (1 - TD_AD_STICKY)) best = pk, br = rts[pk];
            for (int k = r[i].kmax; k > best; k--) rows[k - 1]--;
            r[i].k = best;
            e = e0 + td_ad_req_expected(&r[i], best);
            tokens = t0 + best + 1;
            best_rate = br;
            if (best != k0) changed = true;
        }
        if (!changed) break;
    }
    /* drafting at all must be predicted to pay TD_AD_DRAFT_MARGIN over every auto request at 0 */
    bool any = false;
    for (int i = 0; i < n; i++) any |= !r[i].fixed && r[i].k > 0;
    if (any && td_ad_rate(c, r, n, extra_tokens) < base * TD_AD_DRAFT_MARGIN) {
        for (int i = 0; i < n; i++)
            if (!r[i].fixed) r[i].k = 0;
        best_rate = base;
    }
    return best_rate > 0 ? best_rate : td_ad_rate(c, r, n, extra_tokens);
}

bool td_ad_worth_tracking(td_ad_costs *c, const td_ad_accept *global, int kmax, int batch, double margin) {
    td_ad_req r[64];
    if (kmax < 1) return false;
    if (batch < 1) batch = 1;
    if (batch > 64) batch = 64; /* beyond, the same answer: verify rows cost compute */
    if (kmax > TD_MAX_SPEC_DEPTH) kmax = TD_MAX_SPEC_DEPTH;
    for (int i = 0; i < batch; i++) {
        r[i] = (td_ad_req){.kmax = kmax};
        for (int j = 0; j < TD_MAX_SPEC_DEPTH; j++) r[i].p[j] = td_ad_p_global(global, j);
    }
    double base = td_ad_rate(c, r, batch, 0); /* all at k = 0 */
    double best = td_ad_choose(c, r, batch, 0);
    return best > base * margin;
}

bool td_ad_stop_tracking(const td_ad_state *s, bool worth_now) {
    return !s->measure_only && !s->force_seed && s->zero_run >= TD_AD_UNTRACK_AFTER && !worth_now;
}

bool td_ad_measure_turn(td_ad_engine *ae, int n_prompt) {
    if (n_prompt < 1) n_prompt = 1;
    ae->measure_credit += n_prompt * TD_AD_MEASURE_SHARE;
    if (ae->measure_credit < n_prompt) return false;
    ae->measure_credit -= n_prompt;
    return true;
}

void td_ad_measure_refund(td_ad_engine *ae, int n_prompt) { ae->measure_credit += n_prompt < 1 ? 1 : n_prompt; } /* as td_ad_measure_turn spent it */

bool td_ad_measure_base(const td_ad_costs *c, const td_ad_req *r, int n, int extra_tokens) {
    if (extra_tokens != 0 || n <= 0) return false;
    int tokens = 0;
    bool any = false;
    for (int i = 0; i < n; i++) {
        tokens += (r[i].fixed ? r[i].k : 0) + 1;
        any |= !r[i].fixed && r[i].kmax > 0;
    }
    if (!any || tokens > TD_AD_MAX_T) return false;
    return c->n_fwd[tokens] < TD_AD_MIN_SAMPLES || c->n_steps - c->at_fwd[tokens] >= TD_AD_BASE_EVERY;
}

int td_ad_probe(td_ad_state *s, int choice, int kmax) {
    s->steps++;
    s->probing = false;
    if (choice > 0) {
        s->since_draft = 0;
        s->probe = TD_AD_PROBE_MIN;
        return choice;
    }
    if (kmax < 1) return 0;
    if (++s->since_draft >= s->probe) {
        s->since_draft = 0;
        s->probe = s->probe * 2 > TD_AD_PROBE_MAX ? TD_AD_PROBE_MAX : s->probe * 2;
        s->probing = true;
        return 1;
    }
    return 0;
}

int td_ad_forced(uint64_t seed, uint64_t step, int kmax) {
    uint64_t x = seed ^ (step * 0x9E3779B97F4A7C15ull);
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return kmax > 0 ? (int)(x % (uint64_t)(kmax + 1)) : 0;
}
