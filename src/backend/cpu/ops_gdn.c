/* CPU ops: Gated DeltaNet — depthwise causal conv with its rolling state,
 * and the gated delta rule (token by token, or chunked for prompts).
 *
 * State slots (backend.h td_batch.state): a sequence owns NSLOTS slots of
 * [n_lin][conv_len*conv_dim + nv*dk*dv] floats. A segment without
 * checkpoints updates its live slot SLOT in place; a verify segment reads
 * SLOT and writes the state after its token t into slot (SLOT + 1 + t) %
 * NSLOTS, so accepting t tokens is switching the live slot (no copy back).
 * Either way the arithmetic is the same, bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"
#include "util/err.h"

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#define CONV_CH_PER_TASK 64

typedef struct {
    const td_config *g;
    const td_batch *bt;
    const td_gdn_params *w;
    int lin;              /* this layer's index among DeltaNet layers */
    int conv_len, conv_dim;
    size_t conv_floats, layer_floats; /* conv state; conv + recurrent state of one layer */
    const float *qkv;     /* [M, conv_dim] pre-conv */
    float *conv_out;      /* [M, conv_dim] silu(conv) */
    const float *z, *b_in, *a_in; /* z [M, vd]; b, a [M, nv] */
    float *o;             /* [M, vd] gated-normed output */
    int n_ch_tasks;
    int chunk;            /* tokens per chunk for prompt segments; 0 = token by token */
} gdn_job;

/* This layer's state in slot `slot` of segment sg's sequence. */
static float *layer_state(const gdn_job *j, int si, int slot) {
    return j->bt->state[si] + (size_t)slot * (j->layer_floats * (size_t)(j->g->n_layers - j->g->n_full_attn)) +
           (size_t)j->lin * j->layer_floats;
}
static int out_slot(const int32_t *sg, int t) { return (sg[TD_SEG_SLOT] + 1 + t) % sg[TD_SEG_NSLOTS]; }

static void conv_task(void *ctx, int task) {
    const gdn_job *j = ctx;
    int si = task / j->n_ch_tasks, c0 = (task % j->n_ch_tasks) * CONV_CH_PER_TASK;
    const int32_t *sg = j->bt->seg + (size_t)si * TD_SEG_FIELDS;
    int C = j->conv_dim, L = j->conv_len, K = L + 1, ck = sg[TD_SEG_CKPT];
    int c1 = c0 + CONV_CH_PER_TASK < C ? c0 + CONV_CH_PER_TASK : C;
    float *state = layer_state(j, si, sg[TD_SEG_SLOT]);
    for (int t = 0; t < sg[TD_SEG_N]; t++) {
        int m = sg[TD_SEG_ROW0] + t;
        if (ck) { /* token t's state in its own slot, from the previous token's */
            float *dst = layer_state(j, si, out_slot(sg, t));
            for (int k = 0; k < L; k++)
                memcpy(dst + (size_t)k * C + c0, state + (size_t)k * C + c0, (size_t)(c1 - c0) * sizeof(float));
            state = dst;
        }
        const float *x = j->qkv + (size_t)m * C;
        float *y = j->conv_out + (size_t)m * C;
        for (int ch = c0; ch < c1; ch++) {
            const float *w = j->w->conv + (size_t)ch * K;
            float acc = 0.0f;
            for (int k = 0; k < L; k++) acc += w[k] * state[(size_t)k * C + ch];
            acc += w[L] * x[ch];
            y[ch] = silu(acc);
            for (int k = 0; k + 1 < L; k++) state[(size_t)k * C + ch] = state[(size_t)(k + 1) * C + ch];
            if (L > 0) state[(size_t)(L - 1) * C + ch] = x[ch];
        }
    }
}

void td_cpu_gdn_conv(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                     const float *qkv, float *conv_out) {
    gdn_job j = {.g = g, .bt = bt, .w = w, .lin = lin, .conv_len = g->conv_kernel - 1, .conv_dim = td_cfg_lin_conv_dim(g),
                 .qkv = qkv, .conv_out = conv_out};
    j.conv_floats = (size_t)j.conv_len * j.conv_dim;
    j.layer_floats = j.conv_floats + (size_t)g->lin_nv * g->lin_dk * g->lin_dv;
    j.n_ch_tasks = (j.conv_dim + CONV_CH_PER_TASK - 1) / CONV_CH_PER_TASK;
    td_cpu_par_for(b, bt->n_seg * j.n_ch_tasks, conv_task, &j, (double)bt->M * j.conv_dim * 4);
}

static void l2norm(float *v, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += v[i] * v[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) v[i] *= r;
}

/* Token m of head h: l2-normed q (scaled by 1/sqrt(dk)) and k, its v row, beta and log-decay. */
static const float *gdn_prep(const gdn_job *j, int m, int h, float *qv, float *kv, float *beta, float *logdecay) {
    const td_config *g = j->g;
    int nv = g->lin_nv, dk = g->lin_dk, dv = g->lin_dv, kh = h / (g->lin_nv / g->lin_nk), key_dim = g->lin_nk * dk;
    const float *row = j->conv_out + (size_t)m * j->conv_dim;
    memcpy(qv, row + (size_t)kh * dk, (size_t)dk * sizeof(float));
    memcpy(kv, row + key_dim + (size_t)kh * dk, (size_t)dk * sizeof(float));
    l2norm(qv, dk);
    l2norm(kv, dk);
    float qscale = 1.0f / sqrtf((float)dk);
    for (int i = 0; i < dk; i++) qv[i] *= qscale;
    *beta = sigmoid(j->b_in[(size_t)m * nv + h]);
    *logdecay = j->w->neg_A[h] * softplus(j->a_in[(size_t)m * nv + h] + j->w->dt_bias[h]);
    return row + 2 * key_dim + (size_t)h * dv;
}

/* gated RMSNorm over dv, in place: w * rmsnorm(o) * silu(z) (plain w) */
static void gdn_gated_norm(const gdn_job *j, int m, int h, float *o) {
    const td_config *g = j->g;
    int dv = g->lin_dv, vd = g->lin_nv * dv;
    float ss = 0.0f;
    for (int e = 0; e < dv; e++) ss += o[e] * o[e];
    float rn = 1.0f / sqrtf(ss / (float)dv + (float)g->rms_norm_eps);
    const float *z = j->z + (size_t)m * vd + (size_t)h * dv;
    for (int e = 0; e < dv; e++) o[e] = (j->w->norm[e] * (o[e] * rn)) * silu(z[e]);
}

static void recur_task(void *ctx, int task) {
    const gdn_job *j = ctx;
    const td_config *g = j->g;
    int nv = g->lin_nv, dk = g->lin_dk, dv = g->lin_dv, vd = nv * dv;
    int si = task / nv, h = task % nv;
    const int32_t *sg = j->bt->seg + (size_t)si * TD_SEG_FIELDS;
    int n = sg[TD_SEG_N], row0 = sg[TD_SEG_ROW0], ck = sg[TD_SEG_CKPT];
    size_t head = j->conv_floats + (size_t)h * dk * dv;
    float *S = layer_state(j, si, sg[TD_SEG_SLOT]) + head;
    float qv[TD_MAX_HEAD_DIM], kv[TD_MAX_HEAD_DIM], mem[TD_MAX_HEAD_DIM];
    TD_ASSERT(dk <= TD_MAX_HEAD_DIM && dv <= TD_MAX_HEAD_DIM);
    int t = 0;
    /* Opt-in chunked form for prompt segments (no per-token checkpoints): the
     * same recurrence to rounding; a heap failure falls back to token by token. */
    int CH = j->chunk;
    float *cb = CH > 1 && !ck && n >= CH ? malloc(sizeof(float) * ((size_t)CH * (2 * (size_t)dk + 5 * (size_t)dv) + 3 * (size_t)CH)) : NULL;
    if (cb) {
        float *K = cb, *Q = K + (size_t)CH * dk, *V = Q + (size_t)CH * dk, *O = V + (size_t)CH * dv;
        float *beta = O + (size_t)CH * dv, *ld = beta + CH, *scr = ld + CH;
        for (; t + CH <= n; t += CH) {
            for (int u = 0; u < CH; u++) {
                const float *vv = gdn_prep(j, row0 + t + u, h, Q + (size_t)u * dk, K + (size_t)u * dk, &beta[u], &ld[u]);
                memcpy(V + (size_t)u * dv, vv, (size_t)dv * sizeof(float));
            }
            td_gdn_chunk(S, dk, dv, CH, K, V, Q, beta, ld, scr, O);
            for (int u = 0; u < CH; u++) {
                int m = row0 + t + u;
                float *o = j->o + (size_t)m * vd + (size_t)h * dv;
                memcpy(o, O + (size_t)u * dv, (size_t)dv * sizeof(float));
                gdn_gated_norm(j, m, h, o);
            }
        }
        free(cb);
    }
    for (; t < n; t++) {
        int m = row0 + t;
        float beta, gl;
        const float *vv = gdn_prep(j, m, h, qv, kv, &beta, &gl);
        if (ck) { /* token t's state in its own slot, from the previous token's */
            float *dst = layer_state(j, si, out_slot(sg, t)) + head;
            memcpy(dst, S, (size_t)dk * dv * sizeof(float));
            S = dst;
        }
        /* S = decay*S ; mem = S^T k ; d = beta (v - mem) ; S += k d^T ; o = S^T q */
        float *o = j->o + (size_t)m * vd + (size_t)h * dv;
        td_gdn_step(S, dk, dv, kv, vv, qv, beta, expf(gl), mem, o);
        gdn_gated_norm(j, m, h, o);
    }
}

void td_cpu_gdn_recur(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                      const float *conv_out, const float *z, const float *b_in, const float *a_in, float *o, int chunk) {
    gdn_job j = {.g = g, .bt = bt, .w = w, .lin = lin, .conv_len = g->conv_kernel - 1, .conv_dim = td_cfg_lin_conv_dim(g),
                 .conv_out = (float *)conv_out, .z = z, .b_in = b_in, .a_in = a_in, .o = o, .chunk = chunk};
    j.conv_floats = (size_t)j.conv_len * j.conv_dim;
    j.layer_floats = j.conv_floats + (size_t)g->lin_nv * g->lin_dk * g->lin_dv;
    td_cpu_par_for(b, bt->n_seg * g->lin_nv, recur_task, &j, (double)bt->M * g->lin_nv * g->lin_dk * g->lin_dv * 4);
}
