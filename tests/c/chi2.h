/* Chi-square goodness of fit for the sampling tests (test_spec,
 * test_constraint): the regularized lower incomplete gamma function, the
 * Pearson p-value of observed counts against exact probabilities, and the
 * exact transition law of the Markov-chain test models. */
#ifndef TANDEM_TEST_CHI2_H
#define TANDEM_TEST_CHI2_H
#include <math.h>
#include "tandem.h"

static inline double gammp(double a, double x) {
    if (x <= 0) return 0;
    double gln = lgamma(a);
    if (x < a + 1) {
        double ap = a, sum = 1.0 / a, del = sum;
        for (int n = 0; n < 1000; n++) { ap += 1; del *= x / ap; sum += del; if (fabs(del) < fabs(sum) * 1e-14) break; }
        return sum * exp(-x + a * log(x) - gln);
    }
    double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
    for (int i = 1; i < 1000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b; if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c; if (fabs(c) < 1e-300) c = 1e-300;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-14) break;
    }
    return 1 - exp(-x + a * log(x) - gln) * h;
}

/* Chi-square p-value of observed counts vs expected probabilities; cells
 * with expected count < 20 are pooled into one (small expected counts make
 * the chi-square approximation anti-conservative). */
static inline double chi2_p(const double *prob, const int *count, int cells, int N, double *stat_out, int *dof_out) {
    double stat = 0, pool_e = 0, pool_o = 0;
    int dof = -1;
    for (int i = 0; i < cells; i++) {
        double ex = prob[i] * N;
        if (ex < 20) { pool_e += ex; pool_o += count[i]; continue; }
        stat += (count[i] - ex) * (count[i] - ex) / ex;
        dof++;
    }
    if (pool_e > 0) { stat += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e > 1e-9 ? pool_e : 1e-9); dof++; }
    *stat_out = stat;
    *dof_out = dof;
    return 1 - gammp(dof / 2.0, stat / 2.0);
}

/* The spec-* test models' target is a Markov chain (its logits depend on
 * the last token only): P[a][b] = softmax of the logits after token a. */
static inline void markov_probs(td_session *s, int V, double P[16][16]) {
    td_err err;
    for (int a = 0; a < V; a++) {
        const float *lg;
        td_session_reset(s);
        int32_t t = a;
        td_session_feed(s, &t, 1, &lg, &err);
        double mx = -1e30, sum = 0;
        for (int b = 0; b < V; b++) if (lg[b] > mx) mx = lg[b];
        for (int b = 0; b < V; b++) sum += exp(lg[b] - mx);
        for (int b = 0; b < V; b++) P[a][b] = exp(lg[b] - mx) / sum;
    }
}

/* Outcomes observed that the exact law gives probability 0 (must be none). */
static inline int chi2_impossible(const double *prob, const int *count, int cells) {
    int n = 0;
    for (int i = 0; i < cells; i++) n += prob[i] <= 0 && count[i] > 0;
    return n;
}
#endif
