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
#include "util/err.h"

/* The model's weights as the backend holds them (weight_load): the same
 * structs as td_model with backend pointers (on the CPU, the host ones). */
typedef struct dev_weights {
    td_tensor embed, lm_head;
    const float *final_norm1;
    td_layer_weights *layers;    /* [n_layers] */
    td_mtp_weights mtp;
    const float *inv_freq;       /* [rot/2] */
    bool borrowed;               /* the model's own backend pointers (td_model.dev): not ours to free */
} dev_weights;

struct td_fwd_ctx {
    const td_model *m;
    td_backend *b;
    dev_weights w;
    int cap_M;
    float *x, *xn, *t0, *t1, *t2, *t3, *t4, *t5; /* backend scratch, rows of scratch_widths */
    float *lg;        /* backend [cap_lg][vocab] logits rows */
    int32_t *am;      /* backend [cap_lg] their argmax */
    int cap_lg;
    int *layer_slot;  /* layer -> index among full-attn or among DeltaNet layers */
    int gdn_chunk;    /* td_fwd_set_deltanet_chunk */
    bool eager;       /* td_fwd_set_eager: never through td_bk_graph's graphs */
    uint32_t gen;     /* bumped whenever a buffer the ops read or write is reallocated (part of every graph key) */
    /* batch description: built in host memory, one upload into bd */
    unsigned char *bh;
    void *bd;
    size_t cap_bd;
};

/* ---- weights into the backend --------------------------------------------- */

static int load_vec(td_backend *b, const float *host, size_t n, const float **out, td_err *err) {
    *out = NULL;
    if (!host) return TD_OK;
    if (!(*out = b->ops->weight_load(b, host, n * sizeof(float))))
        return TD_FAIL(err, TD_ERR_NOMEM, "out of backend memory for a weight vector (%zu floats)", n);
    return TD_OK;
}
static void free_vec(td_backend *b, const float *p) { if (p) b->ops->weight_free(b, p); }

static int load_layer(td_backend *b, const td_config *g, const td_layer_weights *h, td_layer_weights *d, td_err *err) {
    memset(d, 0, sizeof *d);
    d->full_attn = h->full_attn;
    int H = g->hidden_size, rc = 0;
    const float *v;
#define VEC(field, n) do { if ((rc = load_vec(b, h->field, (size_t)(n), &v, err))) return rc; d->field = (float *)v; } while (0)
#define TEN(field) do { if (h->field.data && (rc = td_bk_tensor_load(b, &h->field, &d->field, err))) return rc; } while (0)
    VEC(input_norm1, H);
    VEC(post_norm1, H);
    if (h->full_attn) {
        TEN(attn.q_proj); TEN(attn.k_proj); TEN(attn.v_proj); TEN(attn.o_proj);
        VEC(attn.q_norm1, g->head_dim);
        VEC(attn.k_norm1, g->head_dim);
    } else {
        TEN(lin.in_proj_qkv); TEN(lin.in_proj_z); TEN(lin.in_proj_b); TEN(lin.in_proj_a); TEN(lin.out_proj);
        VEC(lin.conv, (size_t)td_cfg_lin_conv_dim(g) * g->conv_kernel);
        VEC(lin.dt_bias, g->lin_nv);
        VEC(lin.neg_A, g->lin_nv);
        VEC(lin.norm, g->lin_dv);
    }
    TEN(gate_proj); TEN(up_proj); TEN(down_proj);
#undef VEC
#undef TEN
    return TD_OK;
}

static void free_layer(td_backend *b, td_layer_weights *d) {
    td_tensor *ts[] = {&d->attn.q_proj, &d->attn.k_proj, &d->attn.v_proj, &d->attn.o_proj, &d->lin.in_proj_qkv, &d->lin.in_proj_z,
                       &d->lin.in_proj_b, &d->lin.in_proj_a, &d->lin.out_proj, &d->gate_proj, &d->up_proj, &d->down_proj};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) td_bk_tensor_free(b, ts[i]);
    const float *vs[] = {d->input_norm1, d->post_norm1, d->attn.q_norm1, d->attn.k_norm1, d->lin.conv, d->lin.dt_bias, d->lin.neg_A, d->lin.norm};
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++) free_vec(b, vs[i]);
    memset(d, 0, sizeof *d);
}

static void free_weights(td_fwd_ctx *c) {
    dev_weights *w = &c->w;
    td_backend *b = c->b;
    if (w->borrowed) { /* only inv_freq and the layer array are ours */
        b->ops->free(b, (void *)w->inv_freq);
        free(w->layers);
        memset(w, 0, sizeof *w);
        return;
    }
    bool tied = w->lm_head.data == w->embed.data;
    td_bk_tensor_free(b, &w->embed);
    if (!tied) td_bk_tensor_free(b, &w->lm_head);
    free_vec(b, w->final_norm1);
    b->ops->free(b, (void *)w->inv_freq);
    for (int i = 0; w->layers && i < c->m->cfg.n_layers; i++) free_layer(b, &w->layers[i]);
    free(w->layers);
    td_bk_tensor_free(b, &w->mtp.fc);
    free_vec(b, w->mtp.pre_fc_norm_embedding1);
    free_vec(b, w->mtp.pre_fc_norm_hidden1);
    free_vec(b, w->mtp.norm1);
    free_layer(b, &w->mtp.layer);
    memset(w, 0, sizeof *w);
}

static int load_weights(td_fwd_ctx *c, const float *inv_freq, td_err *err) {
    const td_model *m = c->m;
    const td_config *g = &m->cfg;
    td_backend *b = c->b;
    dev_weights *w = &c->w;
    int rc, H = g->hidden_size;
    if (m->dev) { /* generated in this backend's memory (td_model_random): used in place */
        if (m->dev != b) return TD_FAIL(err, TD_ERR_ARG, "the model's weights live in another backend");
        size_t nf = (size_t)(g->rot_dim / 2 > 0 ? g->rot_dim / 2 : 1) * sizeof(float);
        float *f = b->ops->alloc(b, nf);
        if (!f) return TD_FAIL(err, TD_ERR_NOMEM, "out of backend memory");
        td_bk_upload(b, f, inv_freq, nf);
        w->inv_freq = f;
        w->borrowed = true;
        if (!(w->layers = TD_CALLOC(err, (size_t)g->n_layers, sizeof *w->layers))) return TD_ERR_NOMEM;
        memcpy(w->layers, m->layers, (size_t)g->n_layers * sizeof *w->layers);
        w->embed = m->embed;
        w->lm_head = m->lm_head;
        w->final_norm1 = m->final_norm1;
        if (m->has_mtp) w->mtp = m->mtp;
        return TD_OK;
    }
    if ((rc = td_bk_tensor_load(b, &m->embed, &w->embed, err))) return rc;
    if (m->lm_head.data == m->embed.data) w->lm_head = w->embed;
    else if ((rc = td_bk_tensor_load(b, &m->lm_head, &w->lm_head, err))) return rc;
    if ((rc = load_vec(b, m->final_norm1, (size_t)H, &w->final_norm1, err))) return rc;
    size_t nf = (size_t)(g->rot_dim / 2 > 0 ? g->rot_dim / 2 : 1) * sizeof(float);
    float *f = b->ops->alloc(b, nf); /* a backend buffer, not a weight: the host copy goes away */
    if (!f) return TD_FAIL(err, TD_ERR_NOMEM, "out of backend memory");
    td_bk_upload(b, f, inv_freq, nf);
    w->inv_freq = f;
    if (!(w->layers = TD_CALLOC(err, (size_t)g->n_layers, sizeof *w->layers))) return TD_ERR_NOMEM;
    for (int i = 0; i < g->n_layers; i++)
        if ((rc = load_layer(b, g, &m->layers[i], &w->layers[i], err))) return rc;
    if (m->has_mtp) {
        const td_mtp_weights *h = &m->mtp;
        if ((rc = td_bk_tensor_load(b, &h->fc, &w->mtp.fc, err))) return rc;
        const float *v;
        if ((rc = load_vec(b, h->pre_fc_norm_embedding1, (size_t)H, &v, err))) return rc;
        w->mtp.pre_fc_norm_embedding1 = (float *)v;
        if ((rc = load_vec(b, h->pre_fc_norm_hidden1, (size_t)H, &v, err))) return rc;
        w->mtp.pre_fc_norm_hidden1 = (float *)v;
        if ((rc = load_vec(b, h->norm1, (size_t)H, &v, err))) return rc;
        w->mtp.norm1 = (float *)v;
        if ((rc = load_layer(b, g, &h->layer, &w->mtp.layer, err))) return rc;
    }
    return TD_OK;
}

int td_fwd_ctx_new(const td_model *m, td_backend *b, td_fwd_ctx **out, td_err *err) {
    *out = NULL;
    td_fwd_ctx *c = TD_CALLOC(err, 1, sizeof *c);
    if (!c) return TD_ERR_NOMEM;
    c->m = m;
    c->b = b;
    const td_config *cfg = &m->cfg;
    c->layer_slot = TD_CALLOC(err, (size_t)cfg->n_layers, sizeof(int));
    int half = cfg->rot_dim / 2;
    float *inv_freq = TD_CALLOC(err, (size_t)(half ? half : 1), sizeof(float));
    if (!c->layer_slot || !inv_freq) { free(inv_freq); td_fwd_ctx_free(c); return TD_ERR_NOMEM; }
    int fa = 0, lin = 0;
    for (int i = 0; i < cfg->n_layers; i++) c->layer_slot[i] = cfg->full_attn[i] ? fa++ : lin++;
    /* inv_freq_i = theta^(-2i/rot), computed in fp32 like the reference. */
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)cfg->rot_dim);
    int rc = load_weights(c, inv_freq, err);
    free(inv_freq);
    if (rc) { td_fwd_ctx_free(c); return rc; }
    *out = c;
    return TD_OK;
}

void td_fwd_ctx_free(td_fwd_ctx *c) {
    if (!c) return;
    td_backend *b = c->b;
    float *bufs[] = {c->x, c->xn, c->t0, c->t1, c->t2, c->t3, c->t4, c->t5, c->lg};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) b->ops->free(b, bufs[i]);
    b->ops->free(b, c->bd);
    b->ops->free(b, c->am);
    free(c->bh);
    free_weights(c);
    free(c->layer_slot);
    free(c);
}

static int imax(int a, int b) { return a > b ? a : b; }

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

/* Ops of decoder_layer: input norm, the mixer (attention: q/k/v, prep,
 * attention, o_proj, add; DeltaNet: 4 projections, conv, recurrence,
 * out_proj, add) and the MLP (norm, gate, up, silu_mul, down, add). */
static int layer_ops(bool full_attn) { return 1 + (full_attn ? 7 : 8) + 6; }

int td_fwd_region_ops_for(const td_config *c, bool mtp, int logits_items, bool argmax) {
    int n = 0;
    if (!mtp) {
        n = 1; /* embed */
        for (int l = 0; l < c->n_layers; l++) n += layer_ops(c->full_attn[l]);
    } else
        n = 6 + layer_ops(true); /* embed, 2 norms, 2 copy_rows, fc; the MTP layer is full attention */
    n += 1; /* final norm */
    if (logits_items > 0) n += logits_items + 1 + (argmax ? 1 : 0); /* gathers, lm_head, argmax */
    return n;
}

size_t td_fwd_scratch_bytes(const td_fwd_ctx *c) { return td_fwd_scratch_bytes_for(&c->m->cfg, c->cap_M, c->cap_lg); }

/* Scratch for M rows. */
static int ensure_scratch(td_fwd_ctx *c, int M, td_err *err) {
    if (M <= c->cap_M) return TD_OK;
    td_backend *b = c->b;
    float **bufs[] = {&c->x, &c->xn, &c->t0, &c->t1, &c->t2, &c->t3, &c->t4, &c->t5};
    size_t widths[8];
    scratch_widths(&c->m->cfg, widths);
    for (int i = 0; i < 8; i++) {
        b->ops->free(b, *bufs[i]);
        *bufs[i] = b->ops->alloc(b, (size_t)M * widths[i] * sizeof(float));
        if (!*bufs[i]) { c->cap_M = 0; return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for %d-row scratch", M); }
    }
    c->cap_M = M;
    c->gen++;
    return TD_OK;
}

/* ---- the batch description -------------------------------------------------- */

typedef struct seg_src {
    td_seq *seq;
    int pos0, n;
    bool checkpoint;
    const int32_t *tokens_d; /* tokens n_host..n-1 in backend memory, or NULL */
    int n_host;
} seg_src;

/* Host tokens of an item: all n, or the first n_host when the rest are in backend memory. */
static int host_tokens(const int32_t *tokens_d, int n_host, int n) { return tokens_d ? n_host : n; }

/* Fills the batch description of n segments (tokens[] per segment) in host
 * memory and uploads it in one copy: [state pointers | tokens | row_seg |
 * seg fields | block tables]. */
static int build_batch(td_fwd_ctx *c, const seg_src *ss, const int32_t *const *tokens, int n, int M, td_batch *bt, td_err *err) {
    size_t n_bt = 0;
    for (int i = 0; i < n; i++) n_bt += (size_t)ss[i].seq->n_blocks;
    size_t bytes = (size_t)n * sizeof(float *) + ((size_t)2 * M + (size_t)n * TD_SEG_FIELDS + n_bt) * sizeof(int32_t);
    if (bytes > c->cap_bd) {
        td_backend *b = c->b;
        b->ops->free(b, c->bd);
        free(c->bh);
        c->bd = b->ops->alloc(b, bytes);
        c->bh = malloc(bytes);
        c->cap_bd = c->bd && c->bh ? bytes : 0;
        c->gen++;
        if (!c->cap_bd) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for a batch of %d rows", M);
    }
    float **st = (float **)c->bh;
    int32_t *tok = (int32_t *)(st + n), *row_seg = tok + M, *seg = row_seg + M, *blk = seg + (size_t)n * TD_SEG_FIELDS;
    int row = 0, off = 0;
    for (int i = 0; i < n; i++) {
        td_seq *q = ss[i].seq;
        st[i] = q->state;
        int32_t *f = seg + (size_t)i * TD_SEG_FIELDS;
        f[TD_SEG_POS0] = ss[i].pos0;
        f[TD_SEG_N] = ss[i].n;
        f[TD_SEG_ROW0] = row;
        f[TD_SEG_BT] = off;
        f[TD_SEG_SLOT] = q->live;
        f[TD_SEG_CKPT] = ss[i].checkpoint && q->n_lin > 0;
        f[TD_SEG_NSLOTS] = q->n_slots;
        int nh = host_tokens(ss[i].tokens_d, ss[i].n_host, ss[i].n);
        if (nh) memcpy(tok + row, tokens[i], (size_t)nh * sizeof(int32_t));
        for (int t = nh; t < ss[i].n; t++) tok[row + t] = 0; /* from tokens_d, below */
        for (int t = 0; t < ss[i].n; t++) row_seg[row + t] = i;
        memcpy(blk + off, q->blocks, (size_t)q->n_blocks * sizeof(int32_t));
        off += q->n_blocks;
        row += ss[i].n;
    }
    td_bk_upload(c->b, c->bd, c->bh, bytes);
    unsigned char *d = c->bd;
    size_t o_tok = (size_t)n * sizeof(float *);
    *bt = (td_batch){.M = M, .n_seg = n, .state = (float *const *)d, .tokens = (const int32_t *)(d + o_tok)};
    bt->row_seg = bt->tokens + M;
    bt->seg = bt->row_seg + M;
    bt->block_tables = bt->seg + (size_t)n * TD_SEG_FIELDS;
    for (int i = 0, r = 0; i < n; r += ss[i].n, i++) /* device-resident tokens: copied in place, nothing crosses */
        if (ss[i].tokens_d && ss[i].n > ss[i].n_host)
            c->b->ops->copy(c->b, (int32_t *)bt->tokens + r + ss[i].n_host, ss[i].tokens_d, (size_t)(ss[i].n - ss[i].n_host) * sizeof(int32_t));
    return TD_OK;
}

/* ---- the layers ----------------------------------------------------------------- */

/* What every layer of one forward shares. */
typedef struct pass {
    const td_batch *bt;
    td_kv *kv;        /* the sequences' KV cache (one per engine) */
    int shift;        /* position p lives at KV slot p + shift (1 for the MTP layer) */
    int n_fa;         /* the MTP layer's KV layer (after the trunk's full-attention layers) */
} pass;

/* x += o_proj(attn(xn)) for a full-attention layer; xn holds norm1(x). */
static void attention_block(td_fwd_ctx *c, const td_attn_weights *w, const pass *ps, int kv_layer) {
    const td_config *g = &c->m->cfg;
    td_backend *b = c->b;
    const td_batch *bt = ps->bt;
    int M = bt->M;
    float *qg = c->t0, *k = c->t1, *v = c->t2, *q = c->t3, *gate = c->t4, *out = c->t2 /* reused after v is stored */;
    b->ops->matmul(b, &w->q_proj, c->xn, M, qg);
    b->ops->matmul(b, &w->k_proj, c->xn, M, k);
    b->ops->matmul(b, &w->v_proj, c->xn, M, v);
    td_kv_view kv = td_kv_layer(ps->kv, kv_layer);
    if (!g->attn_output_gate) gate = NULL;
    b->ops->attn_prep(b, g, bt, qg, k, v, w->q_norm1, w->k_norm1, c->w.inv_freq, q, gate, &kv, ps->shift);
    b->ops->attention(b, g, bt, q, gate, &kv, ps->shift, out);
    b->ops->matmul(b, &w->o_proj, out, M, c->t0);
    b->ops->add(b, c->x, c->t0, (size_t)M * g->hidden_size);
}

/* x += out_proj(gated delta rule(xn)) for a DeltaNet layer. */
static void deltanet_block(td_fwd_ctx *c, const td_deltanet_weights *w, int lin, const pass *ps) {
    const td_config *g = &c->m->cfg;
    td_backend *b = c->b;
    const td_batch *bt = ps->bt;
    int M = bt->M;
    float *qkv = c->t0, *conv_out = c->t1, *z = c->t2, *o = c->t3, *beta_in = c->t4, *alpha_in = c->t5;
    b->ops->matmul(b, &w->in_proj_qkv, c->xn, M, qkv);
    b->ops->matmul(b, &w->in_proj_z, c->xn, M, z);
    b->ops->matmul(b, &w->in_proj_b, c->xn, M, beta_in);
    b->ops->matmul(b, &w->in_proj_a, c->xn, M, alpha_in);
    td_gdn_params gp = {.conv = w->conv, .dt_bias = w->dt_bias, .neg_A = w->neg_A, .norm = w->norm};
    b->ops->gdn_conv(b, g, bt, lin, &gp, qkv, conv_out);
    b->ops->gdn_recur(b, g, bt, lin, &gp, conv_out, z, beta_in, alpha_in, o, c->gdn_chunk);
    b->ops->matmul(b, &w->out_proj, o, M, c->t0);
    b->ops->add(b, c->x, c->t0, (size_t)M * g->hidden_size);
}

static void mlp_block(td_fwd_ctx *c, const td_layer_weights *lw, int M) {
    const td_config *g = &c->m->cfg;
    td_backend *b = c->b;
    int H = g->hidden_size, I = g->intermediate_size;
    b->ops->rmsnorm(b, c->xn, c->x, lw->post_norm1, M, H, (float)g->rms_norm_eps);
    b->ops->matmul(b, &lw->gate_proj, c->xn, M, c->t0);
    b->ops->matmul(b, &lw->up_proj, c->xn, M, c->t1);
    b->ops->silu_mul(b, c->t0, c->t1, (size_t)M * I);
    b->ops->matmul(b, &lw->down_proj, c->t0, M, c->t1);
    b->ops->add(b, c->x, c->t1, (size_t)M * H);
}

/* slot: the layer's index among full-attention layers (its KV layer) or among DeltaNet layers. */
static void decoder_layer(td_fwd_ctx *c, const td_layer_weights *lw, int slot, const pass *ps) {
    const td_config *g = &c->m->cfg;
    c->b->ops->rmsnorm(c->b, c->xn, c->x, lw->input_norm1, ps->bt->M, g->hidden_size, (float)g->rms_norm_eps);
    if (lw->full_attn) attention_block(c, &lw->attn, ps, slot);
    else deltanet_block(c, &lw->lin, slot, ps);
    mlp_block(c, lw, ps->bt->M);
}

/* What one item wants out of the final norm. */
typedef struct out_req {
    int row0, n, logits_rows;
    float *logits, *hidden, *hidden_d; /* host, host, backend; each optional */
    int32_t *argmax;                   /* host, optional */
    int32_t *argmax_d;                 /* backend, optional */
    float *logits_d;                   /* backend, optional */
} out_req;

/* Rows of every item's logits, and the logits buffers grown to them (before
 * the device part: no allocation may happen inside a graph region). */
static int prepare_outputs(td_fwd_ctx *c, const out_req *o, int n_items, int *R_out, bool *argmax_out, td_err *err) {
    td_backend *b = c->b;
    int R = 0;
    bool am = false;
    for (int i = 0; i < n_items; i++) {
        R += o[i].logits_rows;
        am |= o[i].logits_rows && (o[i].argmax || o[i].argmax_d);
    }
    if (R > c->cap_lg) {
        b->ops->free(b, c->lg);
        b->ops->free(b, c->am);
        c->lg = b->ops->alloc(b, (size_t)R * c->m->cfg.vocab_size * sizeof(float));
        c->am = b->ops->alloc(b, (size_t)R * sizeof(int32_t));
        c->cap_lg = c->lg && c->am ? R : 0;
        c->gen++;
        if (!c->cap_lg) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for %d logits rows", R);
    }
    *R_out = R;
    *argmax_out = am;
    return TD_OK;
}

/* The device part of the outputs: final norm into xn, the rows that need
 * logits gathered into t0, one lm_head matmul for all R of them into lg and,
 * when any item wants ids, the argmax of every row into am. Its ops depend
 * only on M, R and each item's (n, logits_rows): what the graph key holds. */
static void emit_device(td_fwd_ctx *c, const float *normw, int M, const out_req *o, int n_items, int R, bool want_argmax) {
    const td_model *m = c->m;
    td_backend *b = c->b;
    int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    b->ops->rmsnorm(b, c->xn, c->x, normw, M, H, (float)m->cfg.rms_norm_eps);
    if (!R) return;
    for (int i = 0, r = 0; i < n_items; r += o[i].logits_rows, i++) {
        int first = o[i].row0 + o[i].n - o[i].logits_rows;
        if (o[i].logits_rows)
            b->ops->copy(b, c->t0 + (size_t)r * H, c->xn + (size_t)first * H, (size_t)o[i].logits_rows * H * sizeof(float));
    }
    b->ops->matmul(b, &c->w.lm_head, c->t0, R, c->lg);
    if (want_argmax) b->ops->argmax(b, c->lg, R, V, c->am);
}

/* What each item asked for, from xn, lg and am (after the device part). */
static void emit_transfers(td_fwd_ctx *c, const out_req *o, int n_items) {
    td_backend *b = c->b;
    int H = c->m->cfg.hidden_size, V = c->m->cfg.vocab_size;
    for (int i = 0, R = 0; i < n_items; R += o[i].logits_rows, i++) {
        size_t hb = (size_t)o[i].n * H * sizeof(float);
        if (o[i].hidden) td_bk_download(b, o[i].hidden, c->xn + (size_t)o[i].row0 * H, hb);
        if (o[i].hidden_d) b->ops->copy(b, o[i].hidden_d, c->xn + (size_t)o[i].row0 * H, hb);
        int n = o[i].logits_rows;
        if (!n) continue;
        if (o[i].logits) td_bk_download(b, o[i].logits, c->lg + (size_t)R * V, (size_t)n * V * sizeof(float));
        if (o[i].logits_d) b->ops->copy(b, o[i].logits_d, c->lg + (size_t)R * V, (size_t)n * V * sizeof(float));
        if (o[i].argmax_d) b->ops->copy(b, o[i].argmax_d, c->am + R, (size_t)n * sizeof(int32_t));
        if (o[i].argmax) td_bk_download(b, o[i].argmax, c->am + R, (size_t)n * sizeof(int32_t));
    }
}

/* ---- graph regions ---------------------------------------------------------- */

/* One forward's device work between the batch upload and the output
 * transfers: what a device backend captures as a graph (td_bk_graph). */
typedef struct region {
    td_fwd_ctx *c;
    const pass *ps;
    bool mtp;
    int M, n_items, R;
    bool want_argmax;
    const out_req *o;
} region;

static void run_region(void *p) {
    const region *r = p;
    td_fwd_ctx *c = r->c;
    td_backend *b = c->b;
    const td_config *g = &c->m->cfg;
    const td_batch *bt = r->ps->bt;
    int M = r->M, H = g->hidden_size;
    if (!r->mtp) {
        b->ops->embed(b, &c->w.embed, bt->tokens, M, c->x);
        for (int l = 0; l < g->n_layers; l++) decoder_layer(c, &c->w.layers[l], c->layer_slot[l], r->ps);
        emit_device(c, c->w.final_norm1, M, r->o, r->n_items, r->R, r->want_argmax);
        return;
    }
    const td_mtp_weights *w = &c->w.mtp;
    float eps = (float)g->rms_norm_eps;
    /* u = fc(concat(norm_e(embed(x_{t+1})), norm_h(h_t))); t0 holds the concat ([M, 2H] fits its width) */
    b->ops->embed(b, &c->w.embed, bt->tokens, M, c->x);
    b->ops->rmsnorm(b, c->xn, c->x, w->pre_fc_norm_embedding1, M, H, eps);
    b->ops->rmsnorm(b, c->x, c->t5, w->pre_fc_norm_hidden1, M, H, eps);
    b->ops->copy_rows(b, c->t0, 2 * (size_t)H, c->xn, (size_t)H, (size_t)H, M);
    b->ops->copy_rows(b, c->t0 + H, 2 * (size_t)H, c->x, (size_t)H, (size_t)H, M);
    b->ops->matmul(b, &w->fc, c->t0, M, c->x);
    decoder_layer(c, &w->layer, r->ps->n_fa, r->ps);
    emit_device(c, w->norm1, M, r->o, r->n_items, r->R, r->want_argmax);
}

/* Graphs are for the small, repeating shapes of decode, draft and verify
 * (every item at most this many tokens, at most GRAPH_MAX_ROWS rows in all);
 * prompt chunks run eagerly, as vLLM's prefill does. */
enum { GRAPH_MAX_ITEM_TOKENS = 16, GRAPH_MAX_ROWS = 128 };

/* Runs the region, through a graph when the shape qualifies. The key holds
 * every host value the region's ops take: the forward kind, rows, items,
 * each item's (n, logits_rows), the argmax flag, the DeltaNet chunk, the
 * buffer generation (every scratch, batch and logits pointer is fixed
 * between reallocations) and the KV cache (its layer views). */
static int run_forward_region(td_fwd_ctx *c, const region *r, td_err *err) {
    bool small = r->M <= GRAPH_MAX_ROWS;
    for (int i = 0; small && i < r->n_items; i++) small = r->o[i].n <= GRAPH_MAX_ITEM_TOKENS;
    int32_t key[10 + 2 * GRAPH_MAX_ROWS];
    size_t nk = 0;
    if (small) {
        uintptr_t kv = (uintptr_t)r->ps->kv;
        key[nk++] = 0x74640001; /* layout version of this key */
        key[nk++] = r->mtp;
        key[nk++] = r->M;
        key[nk++] = r->n_items;
        key[nk++] = r->R;
        key[nk++] = r->want_argmax;
        key[nk++] = c->gdn_chunk;
        key[nk++] = (int32_t)c->gen;
        key[nk++] = (int32_t)(uint32_t)kv;
        key[nk++] = (int32_t)(uint32_t)((uint64_t)kv >> 32);
        for (int i = 0; i < r->n_items; i++) {
            key[nk++] = r->o[i].n;
            key[nk++] = r->o[i].logits_rows;
        }
    }
    return td_bk_graph(c->b, c->eager || !small, key, nk * sizeof key[0], run_region, (void *)r, err);
}

#define MAX_ITEMS 256

int td_forward(td_fwd_ctx *c, td_fwd_item *items, int n_items, td_err *err) {
    const td_model *m = c->m;
    const td_config *g = &m->cfg;
    int M = 0, rc;
    if (n_items <= 0 || n_items > MAX_ITEMS) return TD_FAIL(err, TD_ERR_ARG, "batch of %d items (1..%d)", n_items, MAX_ITEMS);
    for (int i = 0; i < n_items; i++) {
        td_fwd_item *it = &items[i];
        if (it->n <= 0 || (it->logits_rows != 0 && it->logits_rows != 1 && it->logits_rows != it->n))
            return TD_FAIL(err, TD_ERR_ARG, "item %d: %d tokens, %d logits rows", i, it->n, it->logits_rows);
        if (it->checkpoint && it->n > it->seq->n_ckpt_slots && it->seq->n_lin > 0)
            return TD_FAIL(err, TD_ERR_ARG, "item %d: %d tokens to checkpoint, %d slots", i, it->n, it->seq->n_ckpt_slots);
        if (it->tokens_d && (it->n_host < 0 || it->n_host > it->n)) return TD_FAIL(err, TD_ERR_ARG, "item %d: %d host tokens of %d", i, it->n_host, it->n);
        for (int t = 0; t < host_tokens(it->tokens_d, it->n_host, it->n); t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= g->vocab_size)
                return TD_FAIL(err, TD_ERR_ARG, "token id %d outside the vocabulary (%d)", it->tokens[t], g->vocab_size);
        /* +1: the MTP entry of the last token will live at the next slot */
        if ((rc = td_seq_reserve(it->seq, it->seq->n_past + it->n + 1, err))) return rc;
        M += it->n;
    }
    if ((rc = ensure_scratch(c, M, err))) return rc;
    seg_src ss[MAX_ITEMS];
    const int32_t *tk[MAX_ITEMS];
    out_req o[MAX_ITEMS];
    int row = 0;
    for (int i = 0; i < n_items; i++) {
        td_fwd_item *it = &items[i];
        ss[i] = (seg_src){.seq = it->seq, .pos0 = it->seq->n_past, .n = it->n, .checkpoint = it->checkpoint, .tokens_d = it->tokens_d,
                          .n_host = it->n_host};
        tk[i] = it->tokens;
        o[i] = (out_req){.row0 = row, .n = it->n, .logits_rows = it->logits_rows, .logits = it->logits, .hidden = it->hidden, .hidden_d = it->hidden_d,
                          .argmax = it->argmax, .argmax_d = it->argmax_d, .logits_d = it->logits_d};
        row += it->n;
    }
    int R;
    bool want_argmax;
    if ((rc = prepare_outputs(c, o, n_items, &R, &want_argmax, err))) return rc;
    td_batch bt;
    if ((rc = build_batch(c, ss, tk, n_items, M, &bt, err))) return rc;
    pass ps = {.bt = &bt, .kv = items[0].seq->kv, .shift = 0};
    region rg = {.c = c, .ps = &ps, .mtp = false, .M = M, .n_items = n_items, .R = R, .want_argmax = want_argmax, .o = o};
    if ((rc = run_forward_region(c, &rg, err))) return rc;
    emit_transfers(c, o, n_items);
    for (int i = 0; i < n_items; i++) {
        td_seq *s = items[i].seq;
        int nh = host_tokens(items[i].tokens_d, items[i].n_host, items[i].n);
        if (nh) memcpy(s->tokens + s->n_past, items[i].tokens, (size_t)nh * sizeof(int32_t));
        for (int t = nh; t < items[i].n; t++) s->tokens[s->n_past + t] = -1; /* in backend memory: the caller writes them */
        if (items[i].checkpoint && s->n_lin > 0) { /* the state after each token is in its own slot (backend.h) */
            s->ckpt_base = s->n_past;
            s->n_ckpt_valid = items[i].n;
            s->ckpt_slot0 = (s->live + 1) % s->n_slots;
            s->live = (s->live + items[i].n) % s->n_slots;
        } else {
            s->ckpt_base = s->n_past;
            s->n_ckpt_valid = items[i].checkpoint ? items[i].n : 0; /* no DeltaNet: nothing to restore */
        }
        s->n_past += items[i].n;
    }
    return rc;
}

int td_mtp_forward(td_fwd_ctx *c, td_mtp_item *items, int n_items, td_err *err) {
    const td_model *m = c->m;
    const td_config *g = &m->cfg;
    td_backend *b = c->b;
    if (!m->has_mtp) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "this model has no MTP head (mtp.* tensors)");
    int M = 0, rc;
    if (n_items <= 0 || n_items > MAX_ITEMS) return TD_FAIL(err, TD_ERR_ARG, "batch of %d items (1..%d)", n_items, MAX_ITEMS);
    int H = g->hidden_size;
    for (int i = 0; i < n_items; i++) {
        td_mtp_item *it = &items[i];
        if (it->n <= 0 || it->pos0 < 0 || it->pos0 > it->seq->mtp_n || (it->logits_rows != 0 && it->logits_rows != 1 && it->logits_rows != it->n) ||
            (!it->hidden && !it->hidden_d))
            return TD_FAIL(err, TD_ERR_ARG, "MTP item %d: n=%d pos0=%d (have %d entries)", i, it->n, it->pos0, it->seq->mtp_n);
        if (it->tokens_d && (it->n_host < 0 || it->n_host > it->n)) return TD_FAIL(err, TD_ERR_ARG, "MTP item %d: %d host tokens of %d", i, it->n_host, it->n);
        for (int t = 0; t < host_tokens(it->tokens_d, it->n_host, it->n); t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= g->vocab_size)
                return TD_FAIL(err, TD_ERR_ARG, "token id %d outside the vocabulary (%d)", it->tokens[t], g->vocab_size);
        if ((rc = td_seq_reserve(it->seq, it->pos0 + it->n + 1, err))) return rc;
        M += it->n;
    }
    if ((rc = ensure_scratch(c, M, err))) return rc;
    seg_src ss[MAX_ITEMS];
    const int32_t *tk[MAX_ITEMS];
    out_req o[MAX_ITEMS];
    int row = 0;
    for (int i = 0; i < n_items; i++) {
        td_mtp_item *it = &items[i];
        ss[i] = (seg_src){.seq = it->seq, .pos0 = it->pos0, .n = it->n, .tokens_d = it->tokens_d, .n_host = it->n_host};
        tk[i] = it->tokens;
        o[i] = (out_req){.row0 = row, .n = it->n, .logits_rows = it->logits_rows, .logits = it->logits, .hidden = it->hidden_out,
                         .hidden_d = it->hidden_out_d, .argmax = it->argmax, .argmax_d = it->argmax_d, .logits_d = it->logits_d};
        size_t hb = (size_t)it->n * H * sizeof(float);
        if (it->hidden_d) b->ops->copy(b, c->t5 + (size_t)row * H, it->hidden_d, hb);
        else td_bk_upload(b, c->t5 + (size_t)row * H, it->hidden, hb);
        row += it->n;
    }
    int R;
    bool want_argmax;
    if ((rc = prepare_outputs(c, o, n_items, &R, &want_argmax, err))) return rc;
    td_batch bt;
    if ((rc = build_batch(c, ss, tk, n_items, M, &bt, err))) return rc;
    pass ps = {.bt = &bt, .kv = items[0].seq->kv, .shift = 1, .n_fa = items[0].seq->n_fa};
    region rg = {.c = c, .ps = &ps, .mtp = true, .M = M, .n_items = n_items, .R = R, .want_argmax = want_argmax, .o = o};
    if ((rc = run_forward_region(c, &rg, err))) return rc;
    emit_transfers(c, o, n_items);
    for (int i = 0; i < n_items; i++) items[i].seq->mtp_n = items[i].pos0 + items[i].n;
    return TD_OK;
}

void td_fwd_set_deltanet_chunk(td_fwd_ctx *c, int tokens) { c->gdn_chunk = tokens > 1 ? tokens : 0; }

void td_fwd_set_eager(td_fwd_ctx *c, bool eager) { c->eager = eager; }
