/* Forward pass of qwen3_5 (Gated DeltaNet + gated full attention) and its
 * MTP head, fp32 compute. Formulas: tests/golden/NAMES.md (checked against
 * transformers by tools/reference/check_golden.py).
 *
 * A batch is a list of segments (runs of consecutive tokens of one
 * sequence). Projections run once over all M rows of the batch; attention
 * and the DeltaNet recurrence run per segment against that sequence's state.
 * Every row is computed with the same arithmetic whatever the batch holds. */
#include "model/forward.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h" /* vector helpers for attention / DeltaNet (CPU tasks) */
#include "util/err.h"

struct td_fwd_ctx {
    const td_model *m;
    td_backend *b;
    int cap_M;
    float *x, *xn, *t0, *t1, *t2, *t3, *t4, *t5;
    float *lg;        /* [cap_lg][vocab] logits rows */
    int cap_lg;
    int *layer_slot;  /* layer -> index among full-attn or among DeltaNet layers */
    float *inv_freq;  /* [rot/2] */
    int gdn_chunk;    /* td_fwd_set_deltanet_chunk */
};

typedef struct segment {
    td_seq *seq;
    int pos0, n, row0;
    bool checkpoint;
    int kv_layer;     /* this layer's index in the paged KV cache */
    int shift;        /* position p lives at KV slot p + shift (1 for the MTP layer) */
} segment;

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

int td_fwd_ctx_new(const td_model *m, td_backend *b, td_fwd_ctx **out, td_err *err) {
    *out = NULL;
    td_fwd_ctx *c = TD_CALLOC(err, 1, sizeof *c);
    if (!c) return TD_ERR_NOMEM;
    c->m = m;
    c->b = b;
    const td_config *cfg = &m->cfg;
    c->layer_slot = TD_CALLOC(err, (size_t)cfg->n_layers, sizeof(int));
    int half = cfg->rot_dim / 2;
    c->inv_freq = TD_CALLOC(err, (size_t)(half ? half : 1), sizeof(float));
    if (!c->layer_slot || !c->inv_freq) { td_fwd_ctx_free(c); return TD_ERR_NOMEM; }
    int fa = 0, lin = 0;
    for (int i = 0; i < cfg->n_layers; i++) c->layer_slot[i] = cfg->full_attn[i] ? fa++ : lin++;
    /* inv_freq_i = theta^(-2i/rot), computed in fp32 like the reference. */
    for (int i = 0; i < half; i++) c->inv_freq[i] = 1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)cfg->rot_dim);
    *out = c;
    return TD_OK;
}

void td_fwd_ctx_free(td_fwd_ctx *c) {
    if (!c) return;
    free(c->x); free(c->xn); free(c->t0); free(c->t1); free(c->t2); free(c->t3); free(c->t4); free(c->t5); free(c->lg);
    free(c->layer_slot);
    free(c->inv_freq);
    free(c);
}

static int imax(int a, int b) { return a > b ? a : b; }

/* Parallel loop, or a plain one when the work (in multiply-adds) is too
 * small to pay for waking threads. Results are identical either way. */
static void par_for(td_fwd_ctx *c, int n, void (*fn)(void *, int), void *ctx, double work) {
    if (work < 65536.0 || c->b->n_threads == 1) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    c->b->ops->parallel_for(c->b, n, fn, ctx);
}

/* Scratch row widths, in floats: x, xn, then t0..t5, each sized for the
 * widest use of it. */
static void scratch_widths(const td_config *g, size_t widths[8]) {
    int H = g->hidden_size, I = g->intermediate_size, conv = td_cfg_lin_conv_dim(g), vd = td_cfg_lin_value_dim(g);
    int qout = g->n_heads * g->head_dim * 2, kvd = g->n_kv_heads * g->head_dim, ad = g->n_heads * g->head_dim;
    widths[0] = widths[1] = (size_t)H;
    widths[2] = (size_t)imax(imax(qout, conv), imax(I, 2 * H));
    widths[3] = (size_t)imax(imax(kvd, conv), I);
    widths[4] = (size_t)imax(imax(kvd, vd), ad);
    widths[5] = (size_t)imax(ad, vd);
    widths[6] = (size_t)imax(ad, 2 * g->lin_nv);
    widths[7] = (size_t)imax(H, g->lin_nv);
}

static size_t scratch_floats_per_row(const td_config *g) {
    size_t w[8], n = 0;
    scratch_widths(g, w);
    for (int i = 0; i < 8; i++) n += w[i];
    return n;
}

size_t td_fwd_scratch_bytes_for(const td_config *g, int rows, int logits_rows) {
    return ((size_t)rows * scratch_floats_per_row(g) + (size_t)logits_rows * (size_t)g->vocab_size) * sizeof(float);
}

size_t td_fwd_scratch_bytes(const td_fwd_ctx *c) { return td_fwd_scratch_bytes_for(&c->m->cfg, c->cap_M, c->cap_lg); }

/* Scratch for M rows. */
static int ensure_scratch(td_fwd_ctx *c, int M, td_err *err) {
    if (M <= c->cap_M) return TD_OK;
    float **bufs[] = {&c->x, &c->xn, &c->t0, &c->t1, &c->t2, &c->t3, &c->t4, &c->t5};
    size_t widths[8];
    scratch_widths(&c->m->cfg, widths);
    for (int i = 0; i < 8; i++) {
        free(*bufs[i]);
        *bufs[i] = malloc((size_t)M * widths[i] * sizeof(float));
        if (!*bufs[i]) { c->cap_M = 0; return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for %d-row scratch", M); }
    }
    c->cap_M = M;
    return TD_OK;
}

static void rope(float *v, int pos, const float *inv_freq, int rot) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        float cs = cosf(ang), sn = sinf(ang);
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cs - x2 * sn;
        v[i + half] = x2 * cs + x1 * sn;
    }
}

static void head_rmsnorm(float *v, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += v[i] * v[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) v[i] = (v[i] * r) * w[i];
}

/* ---- gated full attention ------------------------------------------- */

typedef struct {
    const td_config *g;
    const segment *segs;
    int nseg;
    const float *q;      /* [M, nh*hd] normed + roped */
    const float *gate;   /* [M, nh*hd] */
    float *out;          /* [M, nh*hd] */
    int *row_seg;        /* row -> segment */
} attn_job;

/* Scores and accumulators of one task live on the stack up to this many
 * floats (8 KiB); longer contexts take a heap buffer (the tests reach both). */
#define ATTN_STACK_FLOATS 2048

/* out[m, head h] = (acc / sum) * sigmoid(gate) (gate: the attention output gate, if any) */
static void attn_finish(const attn_job *j, int m, int h, const float *acc, float sum) {
    int nh = j->g->n_heads, hd = j->g->head_dim;
    float *o = j->out + (size_t)m * nh * hd + (size_t)h * hd;
    const float *gt = j->gate ? j->gate + (size_t)m * nh * hd + (size_t)h * hd : NULL;
    for (int i = 0; i < hd; i++) o[i] = (acc[i] / sum) * (gt ? sigmoid(gt[i]) : 1.0f);
}

/* One query row m and one KV head: the `group` query heads that share it.
 * Each K and V row is read once for the whole group. Exact two-pass softmax:
 * the scaled scores of pass 1 are kept, so pass 2 reuses them (the same
 * values a recomputation would give). Per head and row the arithmetic does
 * not depend on M or on the other heads (batch invariance). */
static void attn_task(void *ctx, int task) {
    const attn_job *j = ctx;
    const td_config *g = j->g;
    int nh = g->n_heads, hd = g->head_dim, nkv = g->n_kv_heads, group = nh / nkv;
    int m = task / nkv, kh = task % nkv, h0 = kh * group;
    const segment *s = &j->segs[j->row_seg[m]];
    int pos = s->pos0 + (m - s->row0), n = pos + 1;
    const float *q = j->q + (size_t)m * nh * hd + (size_t)h0 * hd; /* the group's heads are adjacent */
    float tk[TD_MAX_HEAD_DIM], tv[TD_MAX_HEAD_DIM], sbuf[ATTN_STACK_FLOATS];
    TD_ASSERT(hd <= TD_MAX_HEAD_DIM);
    td_seq *sq = s->seq;
    int L = s->kv_layer, sh = s->shift;
    float scale = 1.0f / sqrtf((float)hd);
    size_t need = (size_t)group * ((size_t)n + (size_t)hd + 2);
    float *buf = need <= ATTN_STACK_FLOATS ? sbuf : malloc(need * sizeof(float));
    if (!buf) {   /* out of memory: recompute scores head by head, nothing kept */
        for (int gi = 0; gi < group; gi++) {
            const float *qh = q + (size_t)gi * hd;
            float mx = -INFINITY, sum = 0.0f, acc[TD_MAX_HEAD_DIM];
            for (int p = 0; p < n; p++) {
                float d = td_dot_f32(qh, td_seq_k_head(sq, L, p + sh, kh, tk), hd) * scale;
                if (d > mx) mx = d;
            }
            for (int i = 0; i < hd; i++) acc[i] = 0.0f;
            for (int p = 0; p < n; p++) {
                float e = expf(td_dot_f32(qh, td_seq_k_head(sq, L, p + sh, kh, tk), hd) * scale - mx);
                sum += e;
                td_vec_axpy(acc, e, td_seq_v_head(sq, L, p + sh, kh, tv), hd);
            }
            attn_finish(j, m, h0 + gi, acc, sum);
        }
        return;
    }
    float *sc = buf, *acc = buf + (size_t)group * n, *mx = acc + (size_t)group * hd, *sum = mx + group;
    for (int gi = 0; gi < group; gi++) mx[gi] = -INFINITY, sum[gi] = 0.0f;
    for (int p = 0; p < n; p++) {
        const float *k = td_seq_k_head(sq, L, p + sh, kh, tk);
        for (int gi = 0; gi < group; gi++) {
            float d = td_dot_f32(q + (size_t)gi * hd, k, hd) * scale;
            sc[(size_t)gi * n + p] = d;
            if (d > mx[gi]) mx[gi] = d;
        }
    }
    for (size_t i = 0; i < (size_t)group * hd; i++) acc[i] = 0.0f;
    for (int p = 0; p < n; p++) {
        const float *v = td_seq_v_head(sq, L, p + sh, kh, tv);
        for (int gi = 0; gi < group; gi++) {
            float e = expf(sc[(size_t)gi * n + p] - mx[gi]);
            sum[gi] += e;
            td_vec_axpy(acc + (size_t)gi * hd, e, v, hd);
        }
    }
    for (int gi = 0; gi < group; gi++) attn_finish(j, m, h0 + gi, acc + (size_t)gi * hd, sum[gi]);
    if (buf != sbuf) free(buf);
}

/* x += o_proj(attn(norm1(x))) for a full-attention layer; xn holds norm1(x). */
static void attention_block(td_fwd_ctx *c, const td_attn_weights *w, const float *xn, int M, segment *segs, int nseg,
                            int *row_seg) {
    const td_config *g = &c->m->cfg;
    td_backend *b = c->b;
    int nh = g->n_heads, hd = g->head_dim, nkv = g->n_kv_heads, kvd = nkv * hd, ad = nh * hd;
    int qout = ad * (g->attn_output_gate ? 2 : 1);
    float *qg = c->t0, *k = c->t1, *v = c->t2, *q = c->t3, *gate = c->t4, *out = c->t2 /* reused after v is cached */;
    b->ops->matmul(b, &w->q_proj, xn, M, qg);
    b->ops->matmul(b, &w->k_proj, xn, M, k);
    b->ops->matmul(b, &w->v_proj, xn, M, v);
    float eps = (float)g->rms_norm_eps;
    for (int si = 0; si < nseg; si++) {
        segment *s = &segs[si];
        for (int j = 0; j < s->n; j++) {
            int m = s->row0 + j, pos = s->pos0 + j;
            for (int h = 0; h < nh; h++) {
                const float *src = qg + (size_t)m * qout + (size_t)h * hd * (g->attn_output_gate ? 2 : 1);
                float *qd = q + (size_t)m * ad + (size_t)h * hd;
                memcpy(qd, src, (size_t)hd * sizeof(float));
                if (g->attn_output_gate) memcpy(gate + (size_t)m * ad + (size_t)h * hd, src + hd, (size_t)hd * sizeof(float));
                head_rmsnorm(qd, w->q_norm1, hd, eps);
                rope(qd, pos, c->inv_freq, g->rot_dim);
            }
            float *kd = k + (size_t)m * kvd; /* normed and roped in place, then stored */
            for (int h = 0; h < nkv; h++) {
                head_rmsnorm(kd + (size_t)h * hd, w->k_norm1, hd, eps);
                rope(kd + (size_t)h * hd, pos, c->inv_freq, g->rot_dim);
            }
            td_seq_kv_write(s->seq, s->kv_layer, pos + s->shift, kd, v + (size_t)m * kvd);
        }
    }
    attn_job j = {.g = g, .segs = segs, .nseg = nseg, .q = q, .gate = g->attn_output_gate ? gate : NULL, .out = out, .row_seg = row_seg};
    double work = 0;
    for (int si = 0; si < nseg; si++) work += (double)segs[si].n * (segs[si].pos0 + segs[si].n) * nh * hd * 2;
    par_for(c, M * nkv, attn_task, &j, work);
    b->ops->matmul(b, &w->o_proj, out, M, c->t0);
    for (size_t i = 0; i < (size_t)M * g->hidden_size; i++) c->x[i] += c->t0[i];
}

/* ---- Gated DeltaNet ---------------------------------------------------- */

#define CONV_CH_PER_TASK 64

typedef struct {
    const td_config *g;
    const td_deltanet_weights *w;
    segment *segs;
    int nseg, slot;       /* slot: this layer's index among DeltaNet layers */
    const float *qkv;     /* [M, conv_dim] pre-conv */
    float *conv_out;      /* [M, conv_dim] silu(conv) */
    const float *z, *ba;  /* z [M, vd]; ba [M, 2*nv] = [b | a] */
    float *o;             /* [M, vd] gated-normed output */
    int n_ch_tasks;
    int chunk;            /* tokens per chunk for prompt segments; 0 = token by token */
} gdn_job;

static void conv_task(void *ctx, int task) {
    const gdn_job *j = ctx;
    int si = task / j->n_ch_tasks, c0 = (task % j->n_ch_tasks) * CONV_CH_PER_TASK;
    const segment *s = &j->segs[si];
    td_seq *q = s->seq;
    int C = q->conv_dim, L = q->conv_len, K = L + 1;
    int c1 = c0 + CONV_CH_PER_TASK < C ? c0 + CONV_CH_PER_TASK : C;
    float *state = q->conv[j->slot];
    size_t cs = (size_t)L * C;
    for (int t = 0; t < s->n; t++) {
        int m = s->row0 + t;
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
        if (s->checkpoint) {
            float *ck = q->ck_conv[j->slot] + (size_t)t * (cs + 1);
            for (int k = 0; k < L; k++)
                memcpy(ck + (size_t)k * C + c0, state + (size_t)k * C + c0, (size_t)(c1 - c0) * sizeof(float));
        }
    }
}

static void l2norm(float *v, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += v[i] * v[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) v[i] *= r;
}

/* Token m of head h: l2-normed q (scaled by 1/sqrt(dk)) and k, its v row, beta and log-decay. */
static const float *gdn_prep(const gdn_job *j, const td_seq *q, int m, int h, float *qv, float *kv, float *beta, float *logdecay) {
    const td_config *g = j->g;
    int nv = g->lin_nv, dk = g->lin_dk, dv = g->lin_dv, kh = h / (g->lin_nv / g->lin_nk), key_dim = g->lin_nk * dk;
    const float *row = j->conv_out + (size_t)m * q->conv_dim;
    memcpy(qv, row + (size_t)kh * dk, (size_t)dk * sizeof(float));
    memcpy(kv, row + key_dim + (size_t)kh * dk, (size_t)dk * sizeof(float));
    l2norm(qv, dk);
    l2norm(kv, dk);
    float qscale = 1.0f / sqrtf((float)dk);
    for (int i = 0; i < dk; i++) qv[i] *= qscale;
    *beta = sigmoid(j->ba[(size_t)m * 2 * nv + h]);
    *logdecay = j->w->neg_A[h] * softplus(j->ba[(size_t)m * 2 * nv + nv + h] + j->w->dt_bias[h]);
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
    const segment *s = &j->segs[si];
    td_seq *q = s->seq;
    float *S = q->ssm[j->slot] + (size_t)h * dk * dv;
    float qv[TD_MAX_HEAD_DIM], kv[TD_MAX_HEAD_DIM], mem[TD_MAX_HEAD_DIM];
    TD_ASSERT(dk <= TD_MAX_HEAD_DIM && dv <= TD_MAX_HEAD_DIM);
    int t = 0;
    /* Opt-in chunked form for prompt segments (no per-token checkpoints): the
     * same recurrence to rounding; a heap failure falls back to token by token. */
    int CH = j->chunk;
    float *cb = CH > 1 && !s->checkpoint && s->n >= CH
                    ? malloc(sizeof(float) * ((size_t)CH * (2 * (size_t)dk + 5 * (size_t)dv) + 3 * (size_t)CH))
                    : NULL;
    if (cb) {
        float *K = cb, *Q = K + (size_t)CH * dk, *V = Q + (size_t)CH * dk, *O = V + (size_t)CH * dv;
        float *beta = O + (size_t)CH * dv, *ld = beta + CH, *scr = ld + CH;
        for (; t + CH <= s->n; t += CH) {
            for (int u = 0; u < CH; u++) {
                const float *vv = gdn_prep(j, q, s->row0 + t + u, h, Q + (size_t)u * dk, K + (size_t)u * dk, &beta[u], &ld[u]);
                memcpy(V + (size_t)u * dv, vv, (size_t)dv * sizeof(float));
            }
            td_gdn_chunk(S, dk, dv, CH, K, V, Q, beta, ld, scr, O);
            for (int u = 0; u < CH; u++) {
                int m = s->row0 + t + u;
                float *o = j->o + (size_t)m * vd + (size_t)h * dv;
                memcpy(o, O + (size_t)u * dv, (size_t)dv * sizeof(float));
                gdn_gated_norm(j, m, h, o);
            }
        }
        free(cb);
    }
    for (; t < s->n; t++) {
        int m = s->row0 + t;
        float beta, gl;
        const float *vv = gdn_prep(j, q, m, h, qv, kv, &beta, &gl);
        /* S = decay*S ; mem = S^T k ; d = beta (v - mem) ; S += k d^T ; o = S^T q */
        float *o = j->o + (size_t)m * vd + (size_t)h * dv;
        td_gdn_step(S, dk, dv, kv, vv, qv, beta, expf(gl), mem, o);
        gdn_gated_norm(j, m, h, o);
        if (s->checkpoint)
            memcpy(q->ck_ssm[j->slot] + (size_t)t * q->ssm_size + (size_t)h * dk * dv, S, (size_t)dk * dv * sizeof(float));
    }
}

static void deltanet_block(td_fwd_ctx *c, const td_deltanet_weights *w, int slot, const float *xn, int M, segment *segs,
                           int nseg) {
    const td_config *g = &c->m->cfg;
    td_backend *b = c->b;
    int nv = g->lin_nv, C = td_cfg_lin_conv_dim(g);
    float *qkv = c->t0, *conv_out = c->t1, *z = c->t2, *o = c->t3, *ba = c->t4;
    b->ops->matmul(b, &w->in_proj_qkv, xn, M, qkv);
    b->ops->matmul(b, &w->in_proj_z, xn, M, z);
    /* b and a side by side per row: [b (nv) | a (nv)] */
    float *tmp = c->t5;
    b->ops->matmul(b, &w->in_proj_b, xn, M, tmp);
    for (int m = 0; m < M; m++) memcpy(ba + (size_t)m * 2 * nv, tmp + (size_t)m * nv, (size_t)nv * sizeof(float));
    b->ops->matmul(b, &w->in_proj_a, xn, M, tmp);
    for (int m = 0; m < M; m++) memcpy(ba + (size_t)m * 2 * nv + nv, tmp + (size_t)m * nv, (size_t)nv * sizeof(float));
    gdn_job j = {.g = g, .w = w, .segs = segs, .nseg = nseg, .slot = slot, .qkv = qkv, .conv_out = conv_out, .z = z, .ba = ba, .o = o,
                 .chunk = c->gdn_chunk,
                 .n_ch_tasks = (C + CONV_CH_PER_TASK - 1) / CONV_CH_PER_TASK};
    par_for(c, nseg * j.n_ch_tasks, conv_task, &j, (double)M * C * 4);
    par_for(c, nseg * nv, recur_task, &j, (double)M * nv * g->lin_dk * g->lin_dv * 4);
    b->ops->matmul(b, &w->out_proj, o, M, c->t0);
    for (size_t i = 0; i < (size_t)M * g->hidden_size; i++) c->x[i] += c->t0[i];
}

/* ---- MLP and the layer ------------------------------------------------ */

static void mlp_block(td_fwd_ctx *c, const td_layer_weights *lw, int M) {
    const td_config *g = &c->m->cfg;
    td_backend *b = c->b;
    int H = g->hidden_size, I = g->intermediate_size;
    b->ops->rmsnorm(b, c->xn, c->x, lw->post_norm1, M, H, (float)g->rms_norm_eps);
    b->ops->matmul(b, &lw->gate_proj, c->xn, M, c->t0);
    b->ops->matmul(b, &lw->up_proj, c->xn, M, c->t1);
    for (size_t i = 0; i < (size_t)M * I; i++) c->t0[i] = silu(c->t0[i]) * c->t1[i];
    b->ops->matmul(b, &lw->down_proj, c->t0, M, c->t1);
    for (size_t i = 0; i < (size_t)M * H; i++) c->x[i] += c->t1[i];
}

static void decoder_layer(td_fwd_ctx *c, const td_layer_weights *lw, int slot, int M, segment *segs, int nseg, int *row_seg) {
    const td_config *g = &c->m->cfg;
    c->b->ops->rmsnorm(c->b, c->xn, c->x, lw->input_norm1, M, g->hidden_size, (float)g->rms_norm_eps);
    if (lw->full_attn) attention_block(c, &lw->attn, c->xn, M, segs, nseg, row_seg);
    else deltanet_block(c, &lw->lin, slot, c->xn, M, segs, nseg);
    mlp_block(c, lw, M);
}

/* Final norm into xn; copies hidden rows and computes the requested logits. */
static int emit_outputs(td_fwd_ctx *c, const float *normw, int M, int n_items, const int *row0, const int *n,
                        const int *logits_rows, float *const *logits, float *const *hidden, td_err *err) {
    const td_model *m = c->m;
    int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    c->b->ops->rmsnorm(c->b, c->xn, c->x, normw, M, H, (float)m->cfg.rms_norm_eps);
    /* Gather the rows that need logits, one matmul for all of them. */
    int R = 0;
    for (int i = 0; i < n_items; i++) {
        if (hidden[i]) memcpy(hidden[i], c->xn + (size_t)row0[i] * H, (size_t)n[i] * H * sizeof(float));
        int first = row0[i] + n[i] - logits_rows[i];
        memmove(c->t0 + (size_t)R * H, c->xn + (size_t)first * H, (size_t)logits_rows[i] * H * sizeof(float));
        R += logits_rows[i];
    }
    if (!R) return TD_OK;
    if (R > c->cap_lg) {
        free(c->lg);
        c->lg = malloc((size_t)R * V * sizeof(float));
        c->cap_lg = c->lg ? R : 0;
        if (!c->lg) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for %d logits rows", R);
    }
    float *lg = c->lg;
    c->b->ops->matmul(c->b, &m->lm_head, c->t0, R, lg);
    R = 0;
    for (int i = 0; i < n_items; i++) {
        memcpy(logits[i], lg + (size_t)R * V, (size_t)logits_rows[i] * V * sizeof(float));
        R += logits_rows[i];
    }
    return TD_OK;
}

#define MAX_ITEMS 256

static int check_items(td_fwd_ctx *c, int n_items, int *M_out, td_err *err) {
    if (n_items <= 0 || n_items > MAX_ITEMS) return TD_FAIL(err, TD_ERR_ARG, "batch of %d items (1..%d)", n_items, MAX_ITEMS);
    (void)c;
    *M_out = 0;
    return TD_OK;
}

int td_forward(td_fwd_ctx *c, td_fwd_item *items, int n_items, td_err *err) {
    const td_model *m = c->m;
    const td_config *g = &m->cfg;
    int M, rc;
    if ((rc = check_items(c, n_items, &M, err))) return rc;
    for (int i = 0; i < n_items; i++) {
        td_fwd_item *it = &items[i];
        if (it->n <= 0 || (it->logits_rows != 0 && it->logits_rows != 1 && it->logits_rows != it->n))
            return TD_FAIL(err, TD_ERR_ARG, "item %d: %d tokens, %d logits rows", i, it->n, it->logits_rows);
        if (it->checkpoint && it->n > it->seq->n_ckpt_slots && it->seq->n_lin > 0)
            return TD_FAIL(err, TD_ERR_ARG, "item %d: %d tokens to checkpoint, %d slots", i, it->n, it->seq->n_ckpt_slots);
        for (int t = 0; t < it->n; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= g->vocab_size)
                return TD_FAIL(err, TD_ERR_ARG, "token id %d outside the vocabulary (%d)", it->tokens[t], g->vocab_size);
        /* +1: the MTP entry of the last token will live at the next slot */
        if ((rc = td_seq_reserve(it->seq, it->seq->n_past + it->n + 1, err))) return rc;
        M += it->n;
    }
    if ((rc = ensure_scratch(c, M, err))) return rc;
    segment segs[MAX_ITEMS];
    int *row_seg = malloc((size_t)M * sizeof(int));
    int32_t *toks = malloc((size_t)M * sizeof(int32_t));
    if (!row_seg || !toks) { free(row_seg); free(toks); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); }
    int row = 0;
    for (int i = 0; i < n_items; i++) {
        segs[i] = (segment){.seq = items[i].seq, .pos0 = items[i].seq->n_past, .n = items[i].n, .row0 = row, .checkpoint = items[i].checkpoint};
        memcpy(toks + row, items[i].tokens, (size_t)items[i].n * sizeof(int32_t));
        for (int t = 0; t < items[i].n; t++) row_seg[row + t] = i;
        row += items[i].n;
    }
    c->b->ops->embed(c->b, &m->embed, toks, M, c->x);
    for (int l = 0; l < g->n_layers; l++) {
        int slot = c->layer_slot[l];
        if (g->full_attn[l])
            for (int i = 0; i < n_items; i++) { segs[i].kv_layer = slot; segs[i].shift = 0; }
        decoder_layer(c, &m->layers[l], slot, M, segs, n_items, row_seg);
    }
    int row0[MAX_ITEMS] = {0}, nn[MAX_ITEMS] = {0}, lr[MAX_ITEMS] = {0};
    float *lg[MAX_ITEMS] = {0}, *hd[MAX_ITEMS] = {0};
    for (int i = 0; i < n_items; i++) {
        row0[i] = segs[i].row0; nn[i] = items[i].n; lr[i] = items[i].logits_rows; lg[i] = items[i].logits; hd[i] = items[i].hidden;
    }
    rc = emit_outputs(c, m->final_norm1, M, n_items, row0, nn, lr, lg, hd, err);
    for (int i = 0; i < n_items; i++) {
        td_seq *s = items[i].seq;
        memcpy(s->tokens + s->n_past, items[i].tokens, (size_t)items[i].n * sizeof(int32_t));
        if (items[i].checkpoint) { s->ckpt_base = s->n_past; s->n_ckpt_valid = items[i].n; }
        else s->n_ckpt_valid = 0;
        s->n_past += items[i].n;
    }
    free(row_seg);
    free(toks);
    return rc;
}

int td_mtp_forward(td_fwd_ctx *c, td_mtp_item *items, int n_items, td_err *err) {
    const td_model *m = c->m;
    const td_config *g = &m->cfg;
    if (!m->has_mtp) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "this model has no MTP head (mtp.* tensors)");
    int M, rc;
    if ((rc = check_items(c, n_items, &M, err))) return rc;
    int H = g->hidden_size;
    for (int i = 0; i < n_items; i++) {
        td_mtp_item *it = &items[i];
        if (it->n <= 0 || it->pos0 < 0 || it->pos0 > it->seq->mtp_n || (it->logits_rows != 0 && it->logits_rows != 1 && it->logits_rows != it->n))
            return TD_FAIL(err, TD_ERR_ARG, "MTP item %d: n=%d pos0=%d (have %d entries)", i, it->n, it->pos0, it->seq->mtp_n);
        for (int t = 0; t < it->n; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= g->vocab_size)
                return TD_FAIL(err, TD_ERR_ARG, "token id %d outside the vocabulary (%d)", it->tokens[t], g->vocab_size);
        if ((rc = td_seq_reserve(it->seq, it->pos0 + it->n + 1, err))) return rc;
        M += it->n;
    }
    if ((rc = ensure_scratch(c, M, err))) return rc;
    segment segs[MAX_ITEMS];
    int *row_seg = malloc((size_t)M * sizeof(int));
    int32_t *toks = malloc((size_t)M * sizeof(int32_t));
    float *cat = malloc((size_t)M * 2 * H * sizeof(float));
    if (!row_seg || !toks || !cat) { free(row_seg); free(toks); free(cat); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); }
    int row = 0;
    for (int i = 0; i < n_items; i++) {
        td_seq *s = items[i].seq;
        segs[i] = (segment){.seq = s, .pos0 = items[i].pos0, .n = items[i].n, .row0 = row, .kv_layer = s->n_fa, .shift = 1};
        memcpy(toks + row, items[i].tokens, (size_t)items[i].n * sizeof(int32_t));
        memcpy(c->t5 + (size_t)row * H, items[i].hidden, (size_t)items[i].n * H * sizeof(float));
        for (int t = 0; t < items[i].n; t++) row_seg[row + t] = i;
        row += items[i].n;
    }
    const td_mtp_weights *w = &m->mtp;
    float eps = (float)g->rms_norm_eps;
    /* u = fc(concat(norm_e(embed(x_{t+1})), norm_h(h_t))) */
    c->b->ops->embed(c->b, &m->embed, toks, M, c->x);
    c->b->ops->rmsnorm(c->b, c->xn, c->x, w->pre_fc_norm_embedding1, M, H, eps);
    c->b->ops->rmsnorm(c->b, c->x, c->t5, w->pre_fc_norm_hidden1, M, H, eps);
    for (int r = 0; r < M; r++) {
        memcpy(cat + (size_t)r * 2 * H, c->xn + (size_t)r * H, (size_t)H * sizeof(float));
        memcpy(cat + (size_t)r * 2 * H + H, c->x + (size_t)r * H, (size_t)H * sizeof(float));
    }
    c->b->ops->matmul(c->b, &w->fc, cat, M, c->x);
    free(cat);
    decoder_layer(c, &w->layer, -1, M, segs, n_items, row_seg);
    int row0[MAX_ITEMS] = {0}, nn[MAX_ITEMS] = {0}, lr[MAX_ITEMS] = {0};
    float *lg[MAX_ITEMS] = {0}, *hd[MAX_ITEMS] = {0};
    for (int i = 0; i < n_items; i++) {
        row0[i] = segs[i].row0; nn[i] = items[i].n; lr[i] = items[i].logits_rows; lg[i] = items[i].logits; hd[i] = items[i].hidden_out;
    }
    rc = emit_outputs(c, w->norm1, M, n_items, row0, nn, lr, lg, hd, err);
    for (int i = 0; i < n_items; i++) items[i].seq->mtp_n = items[i].pos0 + items[i].n;
    free(row_seg);
    free(toks);
    return rc;
}

void td_fwd_set_deltanet_chunk(td_fwd_ctx *c, int tokens) { c->gdn_chunk = tokens > 1 ? tokens : 0; }
