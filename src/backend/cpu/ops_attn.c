/* CPU ops: paged KV rows (f32 / bf16 / fp8 e4m3 with per-token, per-head
 * scales), attention prep (gate split, q/k RMSNorm, partial RoPE, KV store)
 * and causal GQA attention with the sigmoid output gate. Formulas:
 * tests/golden/NAMES.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"
#include "util/err.h"

/* ---- element formats ---------------------------------------------------- */

static uint8_t f32_to_e4m3(float x) { /* round to nearest even, saturating at 448 */
    uint8_t sign = x < 0 ? 0x80 : 0;
    float a = x < 0 ? -x : x;
    if (!(a == a)) return 0x7f;
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0x1p-10f) return sign; /* below half the smallest subnormal (2^-9) */
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int exp = e - 1 + 7;     /* biased exponent for 1.mmm form */
    if (exp <= 0) {          /* subnormal: value = k * 2^-9 */
        float k = nearbyintf(a * 512.0f);
        return sign | (uint8_t)k; /* k <= 8 rounds up into the normal range correctly */
    }
    float frac = (m * 2.0f - 1.0f) * 8.0f; /* 3 mantissa bits */
    float r = nearbyintf(frac);
    if (r >= 8.0f) { r = 0; exp++; }
    if (exp > 15 || (exp == 15 && r > 6)) return sign | 0x7e;
    return sign | (uint8_t)(exp << 3) | (uint8_t)r;
}

static float e4m3_to_f32(uint8_t v) {
    int exp = (v >> 3) & 0xf, man = v & 7;
    float f = exp == 0 ? ldexpf((float)man, -9) : ldexpf(1.0f + man / 8.0f, exp - 7);
    return v & 0x80 ? -f : f;
}

static int kv_heads(const td_kv_view *kv) { return kv->head_dim > 0 ? kv->kv_dim / kv->head_dim : 1; }

static void write_row(const td_kv_view *kv, void *basev, float *scales, size_t row, const float *x) {
    unsigned char *base = basev;
    int D = kv->kv_dim;
    switch (kv->store) {
    case TD_KV_AUTO: TD_ASSERT(!"KV storage dtype not resolved"); break;
    case TD_KV_F32: memcpy(base + row * D * 4, x, (size_t)D * 4); break;
    case TD_KV_BF16: {
        uint16_t *d = (uint16_t *)(base + row * D * 2);
        for (int i = 0; i < D; i++) d[i] = td_f32_to_bf16(x[i]);
        break;
    }
    case TD_KV_FP8: {
        int hd = kv->head_dim, nh = kv_heads(kv);
        uint8_t *d = base + row * D;
        for (int h = 0; h < nh; h++) {
            float mx = 0;
            for (int i = 0; i < hd; i++) mx = fmaxf(mx, fabsf(x[h * hd + i]));
            float sc = mx > 0 ? mx / 448.0f : 1.0f;
            scales[row * nh + h] = sc;
            for (int i = 0; i < hd; i++) d[h * hd + i] = f32_to_e4m3(x[h * hd + i] / sc);
        }
        break;
    }
    }
}

/* K or V of one kv head at a row as f32: a pointer into the cache (F32) or into tmp[head_dim]. */
static const float *read_head(const td_kv_view *kv, const void *basev, const float *scales, size_t row, int h, float *tmp) {
    const unsigned char *base = basev;
    int D = kv->kv_dim, hd = kv->head_dim;
    switch (kv->store) {
    case TD_KV_AUTO: TD_ASSERT(!"KV storage dtype not resolved"); break;
    case TD_KV_F32: return (const float *)(base + row * D * 4) + (size_t)h * hd;
    case TD_KV_BF16: {
        const uint16_t *s = (const uint16_t *)(base + row * D * 2) + (size_t)h * hd;
        for (int i = 0; i < hd; i++) tmp[i] = td_bf16_to_f32(s[i]);
        return tmp;
    }
    case TD_KV_FP8: {
        const uint8_t *s = base + row * D + (size_t)h * hd;
        float sc = scales[row * kv_heads(kv) + h];
        for (int i = 0; i < hd; i++) tmp[i] = e4m3_to_f32(s[i]) * sc;
        return tmp;
    }
    }
    return tmp;
}

void td_cpu_kv_store(td_backend *b, const td_kv_view *kv, int row, const float *k, const float *v) {
    (void)b;
    write_row(kv, kv->k, kv->ks, (size_t)row, k);
    write_row(kv, kv->v, kv->vs, (size_t)row, v);
}

void td_cpu_kv_load(td_backend *b, const td_kv_view *kv, int row, int which, float *out) {
    (void)b;
    float tmp[TD_MAX_HEAD_DIM];
    for (int h = 0; h < kv_heads(kv); h++) {
        const float *src = read_head(kv, which ? kv->v : kv->k, which ? kv->vs : kv->ks, (size_t)row, h, tmp);
        memcpy(out + (size_t)h * kv->head_dim, src, (size_t)kv->head_dim * sizeof(float));
    }
}

/* KV row of slot s of segment si. */
static size_t kv_row(const td_batch *bt, const int32_t *sg, int slot) {
    return (size_t)bt->block_tables[sg[TD_SEG_BT] + slot / TD_KV_BLOCK] * TD_KV_BLOCK + (size_t)(slot % TD_KV_BLOCK);
}

/* ---- attention prep ------------------------------------------------------ */

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

void td_cpu_attn_prep(td_backend *b, const td_config *g, const td_batch *bt, const float *qg, float *k, const float *v,
                      const float *qn, const float *kn, const float *inv_freq, float *q, float *gate, const td_kv_view *kv,
                      int shift) {
    (void)b;
    int nh = g->n_heads, hd = g->head_dim, nkv = g->n_kv_heads, kvd = nkv * hd, ad = nh * hd;
    int per = g->attn_output_gate ? 2 : 1, qout = ad * per;
    float eps = (float)g->rms_norm_eps;
    for (int si = 0; si < bt->n_seg; si++) {
        const int32_t *sg = bt->seg + (size_t)si * TD_SEG_FIELDS;
        for (int j = 0; j < sg[TD_SEG_N]; j++) {
            int m = sg[TD_SEG_ROW0] + j, pos = sg[TD_SEG_POS0] + j;
            for (int h = 0; h < nh; h++) {
                const float *src = qg + (size_t)m * qout + (size_t)h * hd * per;
                float *qd = q + (size_t)m * ad + (size_t)h * hd;
                memcpy(qd, src, (size_t)hd * sizeof(float));
                if (g->attn_output_gate) memcpy(gate + (size_t)m * ad + (size_t)h * hd, src + hd, (size_t)hd * sizeof(float));
                head_rmsnorm(qd, qn, hd, eps);
                rope(qd, pos, inv_freq, g->rot_dim);
            }
            float *kd = k + (size_t)m * kvd; /* normed and roped in place, then stored */
            for (int h = 0; h < nkv; h++) {
                head_rmsnorm(kd + (size_t)h * hd, kn, hd, eps);
                rope(kd + (size_t)h * hd, pos, inv_freq, g->rot_dim);
            }
            size_t row = kv_row(bt, sg, pos + shift);
            write_row(kv, kv->k, kv->ks, row, kd);
            write_row(kv, kv->v, kv->vs, row, v + (size_t)m * kvd);
        }
    }
}

/* ---- attention ----------------------------------------------------------- */

typedef struct {
    const td_config *g;
    const td_batch *bt;
    const td_kv_view *kv;
    int shift;
    const float *q;      /* [M, nh*hd] normed + roped */
    const float *gate;   /* [M, nh*hd] or NULL */
    float *out;          /* [M, nh*hd] */
} attn_job;

/* Scores and accumulators of one task live on the stack up to this many
 * floats (8 KiB); longer contexts take a heap buffer (the tests reach both). */
#define ATTN_STACK_FLOATS 2048

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

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
    const td_kv_view *kv = j->kv;
    int nh = g->n_heads, hd = g->head_dim, nkv = g->n_kv_heads, group = nh / nkv;
    int m = task / nkv, kh = task % nkv, h0 = kh * group;
    const int32_t *sg = j->bt->seg + (size_t)j->bt->row_seg[m] * TD_SEG_FIELDS;
    int pos = sg[TD_SEG_POS0] + (m - sg[TD_SEG_ROW0]), n = pos + 1;
    const float *q = j->q + (size_t)m * nh * hd + (size_t)h0 * hd; /* the group's heads are adjacent */
    float tk[TD_MAX_HEAD_DIM], tv[TD_MAX_HEAD_DIM], sbuf[ATTN_STACK_FLOATS];
    TD_ASSERT(hd <= TD_MAX_HEAD_DIM);
    int sh = j->shift;
    float scale = 1.0f / sqrtf((float)hd);
#define K_AT(p) read_head(kv, kv->k, kv->ks, kv_row(j->bt, sg, (p) + sh), kh, tk)
#define V_AT(p) read_head(kv, kv->v, kv->vs, kv_row(j->bt, sg, (p) + sh), kh, tv)
    size_t need = (size_t)group * ((size_t)n + (size_t)hd + 2);
    float *buf = need <= ATTN_STACK_FLOATS ? sbuf : malloc(need * sizeof(float));
    if (!buf) {   /* out of memory: recompute scores head by head, nothing kept */
        for (int gi = 0; gi < group; gi++) {
            const float *qh = q + (size_t)gi * hd;
            float mx = -INFINITY, sum = 0.0f, acc[TD_MAX_HEAD_DIM];
            for (int p = 0; p < n; p++) {
                float d = td_dot_f32(qh, K_AT(p), hd) * scale;
                if (d > mx) mx = d;
            }
            for (int i = 0; i < hd; i++) acc[i] = 0.0f;
            for (int p = 0; p < n; p++) {
                float e = expf(td_dot_f32(qh, K_AT(p), hd) * scale - mx);
                sum += e;
                td_vec_axpy(acc, e, V_AT(p), hd);
            }
            attn_finish(j, m, h0 + gi, acc, sum);
        }
        return;
    }
    float *sc = buf, *acc = buf + (size_t)group * n, *mx = acc + (size_t)group * hd, *sum = mx + group;
    for (int gi = 0; gi < group; gi++) mx[gi] = -INFINITY, sum[gi] = 0.0f;
    for (int p = 0; p < n; p++) {
        const float *k = K_AT(p);
        for (int gi = 0; gi < group; gi++) {
            float d = td_dot_f32(q + (size_t)gi * hd, k, hd) * scale;
            sc[(size_t)gi * n + p] = d;
            if (d > mx[gi]) mx[gi] = d;
        }
    }
    for (size_t i = 0; i < (size_t)group * hd; i++) acc[i] = 0.0f;
    for (int p = 0; p < n; p++) {
        const float *v = V_AT(p);
        for (int gi = 0; gi < group; gi++) {
            float e = expf(sc[(size_t)gi * n + p] - mx[gi]);
            sum[gi] += e;
            td_vec_axpy(acc + (size_t)gi * hd, e, v, hd);
        }
    }
#undef K_AT
#undef V_AT
    for (int gi = 0; gi < group; gi++) attn_finish(j, m, h0 + gi, acc + (size_t)gi * hd, sum[gi]);
    if (buf != sbuf) free(buf);
}

void td_cpu_attention(td_backend *b, const td_config *g, const td_batch *bt, const float *q, const float *gate,
                      const td_kv_view *kv, int shift, float *out) {
    attn_job j = {.g = g, .bt = bt, .kv = kv, .shift = shift, .q = q, .gate = gate, .out = out};
    double work = 0;
    for (int si = 0; si < bt->n_seg; si++) {
        const int32_t *sg = bt->seg + (size_t)si * TD_SEG_FIELDS;
        work += (double)sg[TD_SEG_N] * (sg[TD_SEG_POS0] + sg[TD_SEG_N]) * g->n_heads * g->head_dim * 2;
    }
    td_cpu_par_for(b, bt->M * g->n_kv_heads, attn_task, &j, work);
}
