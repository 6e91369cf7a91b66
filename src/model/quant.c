/* Load-time quantization (--quantize q8): linear weights stored in F32, BF16
 * or F16 become int8 with one BF16 scale per 32 inputs (absmax / 127 rounded
 * to whichever BF16 neighbour gives the block the smaller squared error, the
 * int8 values rounded to nearest against it and clamped to +-127), 1.0625
 * bytes per weight, as llama.cpp's Q8_0 (which keeps F16 scales). BF16 rather
 * than F32 scales: decode streams the weights every step, and the 2 bytes
 * saved per 32 weights are 5.6% of them; BF16 -> F32 is exact and one shift
 * in every kernel (F16 needs F16C and loses range below 6e-5). The choice of
 * neighbour matters: rounding every scale up (no clamping) left the q8 logits
 * of test_quant 1.17-1.25x as far from the unquantized ones as F32 scales
 * did; the better of the two left them 0.74x (tiny-b) and 0.98x (demo).
 * The kernels dequantize in registers (kernels.c, kernels_x86.c). Embeddings
 * and a tied lm_head stay as they are (the embedding rows are gathered, not
 * multiplied). */
#include "model/quant.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "util/err.h"
#include "util/hugemem.h"

/* Block row[32] on scale sc: q = round(w / sc) clamped to +-127; returns the squared error. */
static double q8_block(const float *row, float sc, int8_t *q) {
    double e = 0.0;
    for (int j = 0; j < 32; j++) {
        long v = sc > 0.0f ? lrintf(row[j] / sc) : 0;
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        q[j] = (int8_t)v;
        const double d = (double)v * sc - row[j];
        e += d * d;
    }
    return e;
}

void td_quantize_q8_rows(const td_tensor *W, int64_t r0, int64_t r1, int8_t *q, uint16_t *s) {
    int64_t K = W->shape[1];
    float row[32];
    int8_t qd[32];
    for (int64_t n = r0; n < r1; n++)
        for (int64_t b = 0; b < K / 32; b++) {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) {
                row[j] = td_tensor_get_f32(W, n * K + b * 32 + j);
                float a = fabsf(row[j]);
                if (a > amax) amax = a;
            }
            /* amax / 127 is rarely a BF16: of its two BF16 neighbours take the one whose grid fits the
               block better (below it, the largest |w| clamps at 127; above it, every step is wider) */
            float t = amax / 127.0f; /* rounded to nearest: up one step where that fell below (t * 127 is exact in double) */
            if ((double)t * 127.0 < (double)amax) t = nextafterf(t, INFINITY);
            const uint16_t up = td_f32_to_bf16_up(t), dn = td_bf16_to_f32(up) > t && up > 0 ? (uint16_t)(up - 1) : up;
            int8_t *qb = q + n * K + b * 32;
            const double e_up = q8_block(row, td_bf16_to_f32(up), qb);
            uint16_t sb = up;
            if (dn != up && q8_block(row, td_bf16_to_f32(dn), qd) < e_up) {
                memcpy(qb, qd, sizeof qd);
                sb = dn;
            }
            s[n * (K / 32) + b] = sb;
        }
}

void td_q8_group_rows(int8_t *q, int64_t K, int64_t r0, int64_t r1) {
    int8_t g[256];
    const int64_t nb = K / 32;
    for (int64_t n = r0; n < r1; n++)
        for (int64_t b0 = 0; b0 < nb; b0 += 8) { /* one group at a time: it stays within its 32 * gs bytes */
            int8_t *grp = q + n * K + 32 * b0;
            const int gs = nb - b0 < 8 ? (int)(nb - b0) : 8;
            for (int j = 0; j < gs; j++) /* block j's 4-byte pieces v to 4 * gs * v + 4 * j (td_q8g_offset) */
                for (int v = 0; v < 8; v++) memcpy(g + 4 * gs * v + 4 * j, grp + 32 * j + 4 * v, 4);
            memcpy(grp, g, (size_t)(32 * gs));
        }
}

/* Replaces *t by its Q8 form in one owned allocation [int8 data | BF16 scales]
 * (in huge pages when the kernel offers them: the kernels stream it every
 * step; measured AVX-512 q8 decode 18.5 -> 19.9 tokens/s on the
 * 27B-proportioned model); *part (the model's byte count for that part) follows. */
static int quantize_tensor(td_model *m, td_tensor *t, size_t *part, bool huge, bool grouped, td_err *err) {
    if (t->ndim != 2 || t->shape[1] % 32 || !t->data) return TD_OK; /* left as is */
    if (t->dtype != TD_DTYPE_F32 && t->dtype != TD_DTYPE_BF16 && t->dtype != TD_DTYPE_F16) return TD_OK;
    int64_t N = t->shape[0], K = t->shape[1];
    size_t qbytes = (size_t)(N * K), sbytes = (size_t)(N * (K / 32)) * sizeof(uint16_t);
    size_t qpad = (qbytes + 63) & ~(size_t)63;
    size_t hlen = 0;
    char *buf = huge ? td_huge_map(qpad + sbytes, &hlen) : NULL;
    if (buf) {
        struct td_huge_buf *nb = realloc(m->huge_bufs, (size_t)(m->n_huge_bufs + 1) * sizeof *nb);
        if (!nb) { td_huge_unmap(buf, hlen); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); }
        m->huge_bufs = nb;
        m->huge_bufs[m->n_huge_bufs++] = (struct td_huge_buf){buf, hlen};
    } else {
        if (!(buf = TD_MALLOC(err, qpad + sbytes))) return TD_ERR_NOMEM;
        float **nv = realloc(m->owned_vecs, (size_t)(m->n_owned_vecs + 1) * sizeof *nv);
        if (!nv) { free(buf); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); }
        m->owned_vecs = nv;
        m->owned_vecs[m->n_owned_vecs++] = (float *)(void *)buf;
    }
    m->owned_bytes += qpad + sbytes;
    td_quantize_q8_rows(t, 0, N, (int8_t *)buf, (uint16_t *)(void *)(buf + qpad));
    if (grouped) td_q8_group_rows((int8_t *)buf, K, 0, N);
    *part = *part - (size_t)(N * K) * td_dtype_size(t->dtype) + qbytes + sbytes;
    td_tensor q = *t;
    q.dtype = TD_DTYPE_Q8;
    q.data = buf;
    q.scales = buf + qpad;
    q.scales_dtype = TD_DTYPE_BF16;
    q.scale_block[0] = 1;
    q.scale_block[1] = 32;
    q.scale_f = 1.0f;
    q.q8_grouped = grouped;
    *t = q;
    return TD_OK;
}

static int quantize_layer(td_model *m, td_layer_weights *l, size_t *part, bool huge, bool grouped, td_err *err) {
    td_tensor *ts[] = {&l->attn.q_proj, &l->attn.k_proj, &l->attn.v_proj, &l->attn.o_proj, &l->lin.in_proj_qkv,
                       &l->lin.in_proj_z, &l->lin.in_proj_b, &l->lin.in_proj_a, &l->lin.out_proj, &l->gate_proj,
                       &l->up_proj, &l->down_proj};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        int rc = quantize_tensor(m, ts[i], part, huge, grouped, err);
        if (rc) return rc;
    }
    return TD_OK;
}

int td_model_quantize(td_model *m, td_quant_kind kind, bool grouped, td_err *err) {
    /* m->bytes_* become the bytes the kernels read (int8 + scales) */
    if (kind == TD_QUANT_NONE) return TD_OK;
    if (kind != TD_QUANT_Q8) return TD_FAIL(err, TD_ERR_ARG, "quantize: unknown kind %d", (int)kind);
    int rc;
    const bool huge = td_thp_offered();
    for (int i = 0; i < m->cfg.n_layers; i++)
        if ((rc = quantize_layer(m, &m->layers[i], &m->bytes_main, huge, grouped, err))) return rc;
    if (m->has_mtp) {
        if ((rc = quantize_tensor(m, &m->mtp.fc, &m->bytes_mtp, huge, grouped, err))) return rc;
        if ((rc = quantize_layer(m, &m->mtp.layer, &m->bytes_mtp, huge, grouped, err))) return rc;
    }
    if (m->lm_head.data != m->embed.data && (rc = quantize_tensor(m, &m->lm_head, &m->bytes_head, huge, grouped, err))) return rc;
    return TD_OK;
}
