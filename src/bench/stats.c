/* Pure parts of the benchmark: statistics, run order, aggregation, the
 * speedup model and the sanity flags. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench/bench.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

bench_stat td_bench_stat_of(const double *v, int n) {
    bench_stat s = {0, 0, 0, 0};
    if (n <= 0) return s;
    double small[64], *w = n <= 64 ? small : malloc((size_t)n * sizeof *w);
    if (!w) { /* out of memory: min/max still exact, median approximated by the mean */
        double sum = 0;
        s.min = s.max = v[0];
        for (int i = 0; i < n; i++) { sum += v[i]; s.min = fmin(s.min, v[i]); s.max = fmax(s.max, v[i]); }
        s.median = sum / n;
        s.n = n;
        return s;
    }
    memcpy(w, v, (size_t)n * sizeof *w);
    qsort(w, (size_t)n, sizeof *w, cmp_double);
    s.min = w[0];
    s.max = w[n - 1];
    s.median = n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
    s.n = n;
    if (w != small) free(w);
    return s;
}

double td_bench_spread(const bench_stat *s) { return s->median > 0 ? (s->max - s->min) / s->median : 0.0; }

/* ---- order ------------------------------------------------------------------ */

int td_bench_order_len(int n_runs, int n_tasks, const int *n_prompts, int n_depths) {
    int per = 0;
    for (int t = 0; t < n_tasks; t++) per += n_prompts[t];
    return n_runs * per * n_depths;
}

void td_bench_order(int n_runs, int n_tasks, const int *n_prompts, int n_depths, bench_slot *out) {
    int k = 0;
    for (int r = 0; r < n_runs; r++)
        for (int t = 0; t < n_tasks; t++)
            for (int p = 0; p < n_prompts[t]; p++)
                for (int j = 0; j < n_depths; j++)
                    out[k++] = (bench_slot){.run = r, .task = t, .prompt = p, .depth_idx = r % 2 ? n_depths - 1 - j : j};
}

/* ---- acceptance -------------------------------------------------------------- */

double td_bench_accept_rate(const td_spec_counters *s) {
    return s->draft_tokens ? (double)s->accepted_tokens / (double)s->draft_tokens : 0.0;
}
double td_bench_accept_pos(const td_spec_counters *s, int i) {
    return s->drafts && i >= 0 && i < TD_MAX_SPEC_DEPTH ? (double)s->accepted_per_pos[i] / (double)s->drafts : 0.0;
}
double td_bench_mean_accept_len(const td_spec_counters *s) {
    return s->drafts ? 1.0 + (double)s->accepted_tokens / (double)s->drafts : 0.0;
}

/* ---- cells --------------------------------------------------------------------- */

static int depth_index(const bench_suite *su, int depth) {
    for (int d = 0; d < su->n_depths; d++)
        if (su->depths[d] == depth) return d;
    return -1;
}

void td_bench_cells(const bench_suite *su, const bench_sample *samples, int n, bench_cell *cells) {
    int max_run = 0;
    for (int i = 0; i < n; i++)
        if (samples[i].run + 1 > max_run) max_run = samples[i].run + 1;
    int nv = n > max_run ? n : max_run;
    double *tps = calloc((size_t)nv + 1, sizeof *tps), *pre = calloc((size_t)nv + 1, sizeof *pre);
    double *ttft = calloc((size_t)nv + 1, sizeof *ttft);
    double *gen = calloc((size_t)max_run + 1, sizeof *gen), *dec = calloc((size_t)max_run + 1, sizeof *dec);
    double *ptok = calloc((size_t)max_run + 1, sizeof *ptok), *psec = calloc((size_t)max_run + 1, sizeof *psec);
    for (int t = 0; t < su->n_tasks; t++) {
        for (int d = 0; d < su->n_depths; d++) {
            bench_cell *c = &cells[t * su->n_depths + d];
            memset(c, 0, sizeof *c);
            c->task = t;
            c->depth = su->depths[d];
            if (!tps || !pre || !ttft || !gen || !dec || !ptok || !psec) continue;
            memset(gen, 0, (size_t)max_run * sizeof *gen);
            memset(dec, 0, (size_t)max_run * sizeof *dec);
            memset(ptok, 0, (size_t)max_run * sizeof *ptok);
            memset(psec, 0, (size_t)max_run * sizeof *psec);
            int nt = 0;
            for (int i = 0; i < n; i++) {
                const bench_sample *s = &samples[i];
                if (s->task != t || s->depth != c->depth) continue;
                c->n_samples++;
                if (s->n_generated > 1) gen[s->run] += s->n_generated - 1;
                dec[s->run] += s->decode_s;
                ptok[s->run] += s->n_prompt - s->n_reused;
                psec[s->run] += s->prefill_s;
                c->generated += (uint64_t)(s->n_generated > 0 ? s->n_generated : 0);
                if (s->n_generated > 0) ttft[nt++] = s->ttft_s;
                td_spec_counters_add(&c->spec, &s->spec);
            }
            int nr = 0, np = 0;
            for (int r = 0; r < max_run; r++) {
                if (dec[r] > 0) tps[nr++] = gen[r] / dec[r];
                if (psec[r] > 0) pre[np++] = ptok[r] / psec[r];
            }
            c->tps = td_bench_stat_of(tps, nr);
            c->prefill_tps = td_bench_stat_of(pre, np);
            c->ttft = td_bench_stat_of(ttft, nt);
        }
        int b = depth_index(su, 0);
        if (b < 0) continue;
        double base = cells[t * su->n_depths + b].tps.median;
        for (int d = 0; d < su->n_depths; d++)
            cells[t * su->n_depths + d].speedup = base > 0 ? cells[t * su->n_depths + d].tps.median / base : 0.0;
    }
    free(tps); free(pre); free(ttft); free(gen); free(dec); free(ptok); free(psec);
}

/* ---- model ------------------------------------------------------------------------ */

double td_bench_expected_tokens(const double *p_ge, int k) {
    double e = 1.0;
    for (int i = 0; i < k; i++) e += p_ge[i];
    return e;
}

double td_bench_predict_speedup(const double *p_ge, int k, const bench_costs *c) {
    if (k < 0 || k + 1 > c->max_n || c->verify[k + 1] <= 0) return 0.0;
    double step = c->verify[k + 1] + k * c->draft;
    return step > 0 ? td_bench_expected_tokens(p_ge, k) / step : 0.0;
}

void td_bench_predict_cells(const bench_suite *su, bench_cell *cells, const bench_costs *c) {
    for (int i = 0; i < su->n_tasks * su->n_depths; i++) {
        bench_cell *x = &cells[i];
        double p[TD_MAX_SPEC_DEPTH];
        int k = x->depth < TD_MAX_SPEC_DEPTH ? x->depth : TD_MAX_SPEC_DEPTH;
        for (int j = 0; j < k; j++) p[j] = td_bench_accept_pos(&x->spec, j);
        x->predicted = (k == 0 || x->spec.drafts) ? td_bench_predict_speedup(p, k, c) : 0.0;
    }
}

/* ---- sanity flags ---------------------------------------------------------------------- */

typedef struct flag_list {
    bench_flag *out;
    int max, n;
} flag_list;

static bench_flag *flag_add(flag_list *l, bench_flag_kind kind, int task, int depth, double value) {
    int i = l->n++;
    if (i >= l->max) return NULL;
    bench_flag *f = &l->out[i];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->task = task;
    f->depth = depth;
    f->value = value;
    return f;
}

enum { C_THREADS, C_MAX_TOKENS, C_TEMPERATURE, C_ENGINE_DEPTH, C_IGNORE_EOS, C_BACKEND, C_NFIELDS };
static const char *const cond_names[C_NFIELDS] = {"threads", "max_tokens", "temperature", "engine depth", "ignore_eos", "backend"};

static void cond_str(const bench_conditions *c, int field, char *buf, size_t n) {
    switch (field) {
    case C_THREADS: snprintf(buf, n, "%d", c->threads); break;
    case C_MAX_TOKENS: snprintf(buf, n, "%d", c->max_tokens); break;
    case C_TEMPERATURE: snprintf(buf, n, "%g", c->temperature); break;
    case C_ENGINE_DEPTH: snprintf(buf, n, "%d", c->engine_depth); break;
    case C_IGNORE_EOS: snprintf(buf, n, "%s", c->ignore_eos ? "true" : "false"); break;
    default: snprintf(buf, n, "%s", c->backend); break;
    }
}

/* Distinct values of one field in a group (up to 6, in order of first
 * appearance), joined with " or " into out. */
static void distinct(const bench_sample *s, int n, bool baseline, int field, char *out, size_t cap) {
    char seen[6][160];
    int ns = 0;
    bool more = false;
    for (int i = 0; i < n; i++) {
        if ((s[i].depth == 0) != baseline) continue;
        char v[160];
        cond_str(&s[i].cond, field, v, sizeof v);
        bool dup = false;
        for (int k = 0; k < ns && !dup; k++) dup = !strcmp(seen[k], v);
        if (dup) continue;
        if (ns == 6) { more = true; continue; }
        memcpy(seen[ns++], v, sizeof v);
    }
    size_t len = 0;
    out[0] = 0;
    for (int k = 0; k < ns; k++) {
        int w = snprintf(out + len, cap - len, "%s%s", k ? " or " : "", seen[k]);
        if (w < 0 || (size_t)w >= cap - len) { out[cap - 1] = 0; return; }
        len += (size_t)w;
    }
    if (more && len + 5 < cap) strcat(out, " ...");
}

static double median_load(const bench_sample *s, int n, bool baseline) {
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) return 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if ((s[i].depth == 0) == baseline) v[k++] = s[i].cond.load1;
    bench_stat st = td_bench_stat_of(v, k);
    free(v);
    return st.median;
}

int td_bench_sanity(const bench_suite *su, const bench_cell *cells, const bench_sample *samples, int n_samples,
                 bench_flag *out, int max) {
    flag_list l = {out, max, 0};
    bench_flag *f;
    int base = depth_index(su, 0);
    for (int t = 0; t < su->n_tasks; t++) {
        for (int d = 0; d < su->n_depths; d++) {
            const bench_cell *c = &cells[t * su->n_depths + d];
            int k = c->depth;
            if (k > 0 && c->speedup > k + 1.0 && (f = flag_add(&l, BENCH_FLAG_IMPOSSIBLE, t, k, c->speedup)))
                snprintf(f->text, sizeof f->text,
                         "IMPOSSIBLE: %s at depth %d is %.2fx the depth-0 baseline, above the ceiling of %dx (k + 1 tokens a step); "
                         "the baseline is too low or the runs were not comparable",
                         su->tasks[t], k, c->speedup, k + 1);
            double sp = td_bench_spread(&c->tps);
            if (c->tps.n >= 2 && sp > BENCH_SPREAD_LIMIT && (f = flag_add(&l, BENCH_FLAG_SPREAD, t, k, sp)))
                snprintf(f->text, sizeof f->text,
                         "SPREAD: %s at depth %d: runs range %.2f..%.2f tokens/s, %.0f%% of the median %.2f (limit %.0f%%); "
                         "the machine was not steady, more runs or a quieter machine needed",
                         su->tasks[t], k, c->tps.min, c->tps.max, 100 * sp, c->tps.median, 100 * BENCH_SPREAD_LIMIT);
        }
    }
    long long reused = 0, prompt = 0;
    int hits = 0;
    for (int i = 0; i < n_samples; i++) {
        reused += samples[i].n_reused;
        prompt += samples[i].n_prompt;
        hits += samples[i].n_reused > 0;
    }
    if (hits && (f = flag_add(&l, BENCH_FLAG_CACHE, -1, -1, prompt ? (double)reused / (double)prompt : 0)))
        snprintf(f->text, sizeof f->text,
                 "PREFIX CACHE: %d of %d requests reused cached prompt tokens (%.0f%% of all prompt tokens): prefill tokens/s and "
                 "TTFT are not cold numbers (repeated prompts hit the cache; turn it off on the server)",
                 hits, n_samples, prompt ? 100.0 * (double)reused / (double)prompt : 0.0);
    if (base < 0) {
        if ((f = flag_add(&l, BENCH_FLAG_NO_BASELINE, -1, -1, 0)))
            snprintf(f->text, sizeof f->text, "NO BASELINE: depth 0 was not measured, so no speedup can be stated");
        return l.n;
    }
    int nb = 0, no = 0;
    for (int i = 0; i < n_samples; i++) *(samples[i].depth == 0 ? &nb : &no) += 1;
    if (!nb || !no) return l.n;
    for (int fld = 0; fld < C_NFIELDS; fld++) {
        char vb[256], vo[256];
        distinct(samples, n_samples, true, fld, vb, sizeof vb);
        distinct(samples, n_samples, false, fld, vo, sizeof vo);
        if (strcmp(vb, vo) != 0 && (f = flag_add(&l, BENCH_FLAG_BASELINE, -1, 0, fld)))
            snprintf(f->text, sizeof f->text, "BASELINE CONDITIONS: depth 0 ran with %s = %.100s, the other depths with %s = %.100s",
                     cond_names[fld], vb, cond_names[fld], vo);
    }
    double lb = median_load(samples, n_samples, true), lo = median_load(samples, n_samples, false);
    double ref = fmax(fmax(lb, lo), 0.5);
    if (fabs(lb - lo) / ref > BENCH_LOAD_LIMIT && (f = flag_add(&l, BENCH_FLAG_BASELINE, -1, 0, lb - lo)))
        snprintf(f->text, sizeof f->text,
                 "BASELINE CONDITIONS: median 1-minute load average %.2f during depth 0, %.2f during the other depths", lb, lo);
    /* Greedy decoding is lossless at every depth: the same prompt must give
     * the same number of tokens. A different count means another workload. */
    bool greedy = true;
    for (int i = 0; i < n_samples; i++)
        if (samples[i].cond.temperature != 0) greedy = false;
    if (greedy) {
        int mism = 0, pairs = 0;
        for (int i = 0; i < n_samples; i++) {
            const bench_sample *a = &samples[i];
            if (a->depth != 0) continue;
            for (int j = 0; j < n_samples; j++) {
                const bench_sample *b = &samples[j];
                if (b->depth == 0 || b->run != a->run || b->task != a->task || b->prompt != a->prompt) continue;
                pairs++;
                if (b->n_generated != a->n_generated) mism++;
            }
        }
        if (mism && (f = flag_add(&l, BENCH_FLAG_WORKLOAD, -1, -1, mism)))
            snprintf(f->text, sizeof f->text,
                     "WORKLOAD: greedy, yet %d of %d requests generated a different number of tokens than at depth 0 "
                     "(drafting must not change greedy output)",
                     mism, pairs);
    }
    return l.n;
}
