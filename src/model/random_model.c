/* td_model_random: see random_model.h. One walk over the model's tensors
 * (build) runs twice: first counting bytes with checked arithmetic (nothing
 * allocated), then, once the total fits the backend, allocating and filling. */
#include "model/random_model.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/fill_random.h"
#include "model/quant.h"
#include "util/err.h"

typedef struct {
    const td_random_spec *s;
    td_model *m;         /* the model built (its config and layer array also while counting) */
    bool counting;       /* first walk: count bytes, allocate and fill nothing */
    td_backend *b;
    td_err *err;
    uint64_t bytes;      /* counting: the total so far */
    bool overflow;
    int ordinal;         /* tensors so far: each gets its own seed */
    int cap_bufs;
} builder;

static uint64_t tensor_seed(builder *B) { return td_rand_mix(B->s->seed) + (uint64_t)B->ordinal++; }

/* a * b, flagging overflow */
static uint64_t mul(builder *B, uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) { B->overflow = true; return 0; }
    return r;
}

/* count (counting) or allocate `bytes` of zeroed backend memory, owned by the model */
static void *buf(builder *B, uint64_t bytes) {
    if (B->counting) {
        if (__builtin_add_overflow(B->bytes, bytes, &B->bytes)) B->overflow = true;
        return NULL;
    }
    td_model *m = B->m;
    if (m->n_dev_bufs == B->cap_bufs) {
        int nc = B->cap_bufs ? 2 * B->cap_bufs : 256;
        void **nb = realloc(m->dev_bufs, (size_t)nc * sizeof *nb);
        if (!nb) { TD_FAIL(B->err, TD_ERR_NOMEM, "out of memory"); return NULL; }
        m->dev_bufs = nb;
        B->cap_bufs = nc;
    }
    void *p = B->b->ops->alloc(B->b, (size_t)bytes);
    if (!p) { TD_FAIL(B->err, TD_ERR_NOMEM, "out of backend memory for the generated weights (%llu bytes more)", (unsigned long long)bytes); return NULL; }
    m->dev_bufs[m->n_dev_bufs++] = p;
    m->dev_bytes += (size_t)bytes;
    return p;
}

/* f32 vector [n]: constant v, or uniform in +-v (uniform) */
static int vec(builder *B, float **out, uint64_t n, bool uniform, float v) {
    uint64_t seed = tensor_seed(B);
    float *p = buf(B, mul(B, n, sizeof(float)));
    if (B->counting) return TD_OK;
    if (!p) return B->err->code;
    B->b->ops->fill_random(B->b, p, TD_DTYPE_F32, (size_t)n, seed, uniform ? TD_FILL_UNIFORM : TD_FILL_CONST, v);
    *out = p;
    return TD_OK;
}

/* The format of the embedding, lm_head and MTP fc (and of unquantizable weights). */
static td_dtype plain_dtype(const td_random_spec *s) { return s->dtype == TD_DTYPE_F32 ? TD_DTYPE_F32 : TD_DTYPE_BF16; }

/* Rows of a drawn Q8 weight d [rows, cols] in backend memory put in the grouped order (td_q8_group_rows),
   through the host in chunks of about 4 MB (the backend's memory may not be the host's). */
static int group_q8(builder *B, int8_t *d, int64_t rows, int64_t cols) {
    int64_t per = ((int64_t)4 << 20) / cols;
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    int8_t *h = TD_CALLOC(B->err, (size_t)per, (size_t)cols);
    if (!h) return TD_ERR_NOMEM;
    td_backend *b = B->b;
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        const int64_t nr = rows - r0 < per ? rows - r0 : per;
        b->ops->download(b, h, d + r0 * cols, (size_t)(nr * cols));
        td_q8_group_rows(h, cols, 0, nr);
        b->ops->upload(b, d + r0 * cols, h, (size_t)(nr * cols));
    }
    free(h);
    return TD_OK;
}

/* Linear weight [rows, cols] uniform in +-scale (scale 0: zeros) in the spec's
 * dtype (quant) or the plain one. FP8: e4m3 of uniform +-448 with F32 block
 * scales scale / 448 per 128 x 128; NVFP4: e2m1 of uniform +-6, fp8 block
 * scales 1.0 per 16 inputs, global scale / 6; Q8: int8 of uniform +-127,
 * BF16 scales scale / 127 per 32 inputs. */
static int linear(builder *B, td_tensor *t, int64_t rows, int64_t cols, float scale, bool quant, int64_t *params, size_t *bytes) {
    td_dtype dt = quant && cols % (B->s->dtype == TD_DTYPE_Q8 ? 32 : 16) == 0 ? B->s->dtype : plain_dtype(B->s);
    uint64_t seed = tensor_seed(B), n = mul(B, (uint64_t)rows, (uint64_t)cols);
    uint64_t nd = dt == TD_DTYPE_NVFP4 ? n / 2 : dt == TD_DTYPE_Q8 ? n : mul(B, n, td_dtype_size(dt)), ns = 0;
    uint64_t sr = 0, sc = 0;
    if (dt == TD_DTYPE_F8_E4M3) { sr = ((uint64_t)rows + 127) / 128; sc = ((uint64_t)cols + 127) / 128; ns = mul(B, mul(B, sr, sc), 4); }
    if (dt == TD_DTYPE_NVFP4) { sr = (uint64_t)rows; sc = (uint64_t)cols / 16; ns = mul(B, sr, sc); }
    if (dt == TD_DTYPE_Q8) { sr = (uint64_t)rows; sc = (uint64_t)cols / 32; ns = mul(B, mul(B, sr, sc), 2); }
    void *d = buf(B, nd), *sp = ns ? buf(B, ns) : NULL;
    *params += (int64_t)n;
    *bytes += (size_t)(nd + ns);
    if (B->counting) return TD_OK;
    if (!d || (ns && !sp)) return B->err->code;
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->scale_f = 1.0f;
    t->data = d;
    td_backend *b = B->b;
    if (dt == TD_DTYPE_F8_E4M3) {
        if (scale != 0) b->ops->fill_random(b, d, dt, (size_t)n, seed, TD_FILL_UNIFORM, 448.0f);
        b->ops->fill_random(b, sp, TD_DTYPE_F32, (size_t)(sr * sc), seed + 1, TD_FILL_CONST, scale / 448.0f);
        t->scales_dtype = TD_DTYPE_F32;
        t->scale_block[0] = t->scale_block[1] = 128;
    } else if (dt == TD_DTYPE_NVFP4) {
        if (scale != 0) b->ops->fill_random(b, d, dt, (size_t)n, seed, TD_FILL_UNIFORM, 6.0f);
        b->ops->fill_random(b, sp, TD_DTYPE_F8_E4M3, (size_t)(sr * sc), seed + 1, TD_FILL_CONST, 1.0f);
        t->scales_dtype = TD_DTYPE_F8_E4M3;
        t->scale_block[0] = 1;
        t->scale_block[1] = 16;
        t->scale_f = scale / 6.0f;
    } else if (dt == TD_DTYPE_Q8) {
        if (scale != 0) b->ops->fill_random(b, d, dt, (size_t)n, seed, TD_FILL_UNIFORM, 127.0f);
        b->ops->fill_random(b, sp, TD_DTYPE_BF16, (size_t)(sr * sc), seed + 1, TD_FILL_CONST, scale / 127.0f);
        t->scales_dtype = TD_DTYPE_BF16;
        t->scale_block[0] = 1;
        t->scale_block[1] = 32;
        if (B->s->q8_grouped) {
            int rc = scale != 0 ? group_q8(B, d, rows, cols) : TD_OK; /* zeros: any order */
            if (rc) return rc;
            t->q8_grouped = true;
        }
    } else if (scale != 0) {
        b->ops->fill_random(b, d, dt, (size_t)n, seed, TD_FILL_UNIFORM, scale);
    }
    t->scales = sp;
    return TD_OK;
}

/* MTP fc [H, 2H] = [I | 0]: rows uploaded in chunks (1.0 at column r of row r). */
static int identity_fc(builder *B, td_tensor *t, int64_t H, int64_t *params, size_t *bytes) {
    int rc = linear(B, t, H, 2 * H, 0.0f, false, params, bytes); /* zeros, plain dtype */
    if (rc || B->counting) return rc;
    size_t es = td_dtype_size(t->dtype), row = (size_t)(2 * H) * es, per = ((size_t)4 << 20) / row;
    if (per < 1) per = 1;
    if (per > (size_t)H) per = (size_t)H;
    unsigned char *h = TD_CALLOC(B->err, per, row);
    if (!h) return TD_ERR_NOMEM;
    for (int64_t r0 = 0; r0 < H; r0 += (int64_t)per) {
        size_t nr = (size_t)(H - r0) < per ? (size_t)(H - r0) : per;
        memset(h, 0, nr * row);
        for (size_t i = 0; i < nr; i++) {
            unsigned char *e = h + i * row + (size_t)(r0 + (int64_t)i) * es;
            if (t->dtype == TD_DTYPE_F32) { float one = 1.0f; memcpy(e, &one, 4); }
            else { uint16_t one = 0x3f80; memcpy(e, &one, 2); } /* bf16 1.0 */
        }
        td_bk_upload(B->b, (unsigned char *)t->data + (size_t)r0 * row, h, nr * row);
    }
    free(h);
    return TD_OK;
}

/* One decoder layer; `out` = the scale of its residual writes (o_proj / out_proj / down_proj). */
static int layer(builder *B, td_layer_weights *lw, bool full, float out, int64_t *params, size_t *bytes) {
    const td_config *c = &B->m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int rc;
#define L(dst, rows, cols, sc) do { if ((rc = linear(B, dst, rows, cols, sc, true, params, bytes))) return rc; } while (0)
#define V(dst, n, uni, v) do { if ((rc = vec(B, dst, (uint64_t)(n), uni, v))) return rc; *params += (int64_t)(n); *bytes += (size_t)(n) * 2; } while (0)
    lw->full_attn = full;
    V(&lw->input_norm1, H, false, 1.0f);
    V(&lw->post_norm1, H, false, 1.0f);
    if (full) {
        int64_t hd = c->head_dim, q_out = (int64_t)c->n_heads * hd * (c->attn_output_gate ? 2 : 1);
        L(&lw->attn.q_proj, q_out, H, 0.03f);
        L(&lw->attn.k_proj, (int64_t)c->n_kv_heads * hd, H, 0.03f);
        L(&lw->attn.v_proj, (int64_t)c->n_kv_heads * hd, H, 0.03f);
        L(&lw->attn.o_proj, H, (int64_t)c->n_heads * hd, out);
        V(&lw->attn.q_norm1, hd, false, 1.0f);
        V(&lw->attn.k_norm1, hd, false, 1.0f);
    } else {
        int64_t conv = td_cfg_lin_conv_dim(c), vd = td_cfg_lin_value_dim(c), nv = c->lin_nv;
        L(&lw->lin.in_proj_qkv, conv, H, 0.03f);
        L(&lw->lin.in_proj_z, vd, H, 0.03f);
        L(&lw->lin.in_proj_b, nv, H, 0.03f);
        L(&lw->lin.in_proj_a, nv, H, 0.03f);
        L(&lw->lin.out_proj, H, vd, out);
        V(&lw->lin.conv, (uint64_t)conv * (uint64_t)c->conv_kernel, true, 0.03f);
        V(&lw->lin.dt_bias, nv, false, 0.0f);
        V(&lw->lin.neg_A, nv, false, -1.0f); /* -exp(A_log), A_log = 0 */
        V(&lw->lin.norm, c->lin_dv, false, 1.0f);
    }
    L(&lw->gate_proj, I, H, 0.03f);
    L(&lw->up_proj, I, H, 0.03f);
    L(&lw->down_proj, H, I, out);
#undef L
#undef V
    return TD_OK;
}

/* The whole model; B->m holds the config and a layer array. */
static int build(builder *B) {
    td_model *m = B->m;
    const td_config *c = &m->cfg;
    const td_random_spec *s = B->s;
    bool mtp = s->mtp_mix >= 0;
    int64_t H = c->hidden_size, V = c->vocab_size;
    float out = mtp ? 0.03f * s->mtp_mix : 0.03f; /* the trunk's residual writes */
    int rc;
    m->n_params_main = m->n_params_mtp = m->n_params_embed = m->n_params_head = 0;
    m->bytes_main = m->bytes_mtp = m->bytes_embed = m->bytes_head = 0;
    /* embedding [V, H]: rms 1 under the MTP construction (uniform +-sqrt 3) */
    if ((rc = linear(B, &m->embed, V, H, mtp ? sqrtf(3.0f) : 0.03f, false, &m->n_params_embed, &m->bytes_embed))) return rc;
    if (c->tie_word_embeddings) {
        if (!B->counting) m->lm_head = m->embed;
    } else if ((rc = linear(B, &m->lm_head, V, H, 0.03f, false, &m->n_params_head, &m->bytes_head))) {
        return rc;
    }
    if ((rc = vec(B, &m->final_norm1, (uint64_t)H, false, 1.0f))) return rc;
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = layer(B, &m->layers[i], c->full_attn[i], out, &m->n_params_main, &m->bytes_main))) return rc;
    m->n_params_main += H;
    m->has_mtp = mtp;
    if (mtp) {
        td_mtp_weights *t = &m->mtp;
        if ((rc = identity_fc(B, &t->fc, H, &m->n_params_mtp, &m->bytes_mtp))) return rc;
        if ((rc = vec(B, &t->pre_fc_norm_embedding1, (uint64_t)H, false, 1.0f))) return rc;
        if ((rc = vec(B, &t->pre_fc_norm_hidden1, (uint64_t)H, false, 1.0f))) return rc;
        if ((rc = vec(B, &t->norm1, (uint64_t)H, false, 1.0f))) return rc;
        m->n_params_mtp += 3 * H;
        m->bytes_mtp += 3 * (size_t)H * 2;
        if ((rc = layer(B, &t->layer, true, 0.0f, &m->n_params_mtp, &m->bytes_mtp))) return rc; /* writes nothing */
    }
    return TD_OK;
}

static int check_spec(const td_random_spec *s, td_err *err) {
    if (s->dtype != TD_DTYPE_F32 && s->dtype != TD_DTYPE_BF16 && s->dtype != TD_DTYPE_F8_E4M3 && s->dtype != TD_DTYPE_NVFP4 &&
        s->dtype != TD_DTYPE_Q8)
        return TD_FAIL(err, TD_ERR_ARG, "random model: dtype %s (F32, BF16, F8_E4M3, NVFP4 or Q8)", td_dtype_name(s->dtype));
    if (!(s->mtp_mix <= 100.0f)) return TD_FAIL(err, TD_ERR_ARG, "random model: mtp_mix %g (negative: no MTP head; 0..100)", (double)s->mtp_mix);
    return TD_OK;
}

/* The config the spec describes: c scaled, the MTP head as the spec says. */
static int spec_config(const td_config *c, const td_random_spec *s, td_config *out, td_err *err) {
    *out = *c;
    int rc = td_config_scale(out, s->hidden, s->layers, s->vocab, err);
    if (rc) return rc;
    out->mtp_layers = s->mtp_mix >= 0 ? 1 : 0;
    out->mtp_layers_given = true;
    return TD_OK;
}

static int count_bytes(const td_config *cfg, const td_random_spec *s, uint64_t *bytes, td_err *err) {
    td_model scratch = {.cfg = *cfg};
    scratch.layers = TD_CALLOC(err, (size_t)cfg->n_layers, sizeof *scratch.layers);
    if (!scratch.layers) return TD_ERR_NOMEM;
    builder B = {.s = s, .m = &scratch, .counting = true, .err = err};
    int rc = build(&B);
    free(scratch.layers);
    if (rc) return rc;
    if (B.overflow) return TD_FAIL(err, TD_ERR_ARG, "random model: the config's weight sizes overflow 64 bits");
    *bytes = B.bytes;
    return TD_OK;
}

int td_random_model_bytes(const td_config *c, const td_random_spec *s, uint64_t *bytes, td_err *err) {
    *bytes = 0;
    td_config cfg;
    int rc = check_spec(s, err);
    if (!rc) rc = spec_config(c, s, &cfg, err);
    if (!rc) rc = count_bytes(&cfg, s, bytes, err);
    return rc;
}

int td_model_random(const td_config *c, const td_random_spec *s, td_backend *b, td_model **out, td_err *err) {
    *out = NULL;
    td_config cfg;
    uint64_t need;
    int rc = check_spec(s, err);
    if (!rc) rc = spec_config(c, s, &cfg, err);
    if (!rc) rc = count_bytes(&cfg, s, &need, err);
    if (rc) return rc;
    if (!b->ops->fill_random) return TD_FAIL(err, TD_ERR_UNSUPPORTED, "backend %s has no fill_random op", b->ops->name);
    /* Does it fit? A device: its free memory; the CPU backends: the machine's RAM
     * (calloc would overcommit and the fill be killed half way). */
    size_t dfree = 0, dtotal = 0;
    uint64_t have;
    const char *where;
    if (td_backend_cuda_mem_info(b, &dfree, &dtotal) == TD_OK) {
        have = dfree;
        where = "free on the CUDA device";
    } else {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        have = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
        where = "of RAM";
    }
    if (need > have)
        return TD_FAIL(err, TD_ERR_NOMEM, "random model: the weights need %.2f GiB, %.2f GiB %s", (double)need / (1u << 30),
                       (double)have / (1u << 30), where);
    td_model *m = TD_CALLOC(err, 1, sizeof *m);
    if (!m) return TD_ERR_NOMEM;
    m->cfg = cfg;
    m->dev = b;
    snprintf(m->prefix, sizeof m->prefix, "random.");
    if (!(m->layers = TD_CALLOC(err, (size_t)cfg.n_layers, sizeof *m->layers))) { td_model_free(m); return TD_ERR_NOMEM; }
    builder B = {.s = s, .m = m, .b = b, .err = err};
    if ((rc = build(&B))) { td_model_free(m); return rc; }
    *out = m;
    return TD_OK;
}

/* ---- scaling (tools/bench/make_random_model.py) ---- */

static int round_half_even(double x) { return (int)nearbyint(x); } /* Python's round() */

int td_config_scale(td_config *c, int hidden, int layers, int vocab, td_err *err) {
    if (hidden < 0 || layers < 0 || vocab < 0) return TD_FAIL(err, TD_ERR_ARG, "random model: negative --hidden / --layers / --vocab");
    if (hidden > (1 << 16) || layers > TD_MAX_LAYERS || vocab > (1 << 22))
        return TD_FAIL(err, TD_ERR_ARG, "random model: hidden %d (at most 65536), layers %d (at most %d), vocab %d (at most 4194304)", hidden,
                       layers, TD_MAX_LAYERS, vocab);
    if (hidden > 0 && hidden != c->hidden_size) {
        if (hidden % 16) return TD_FAIL(err, TD_ERR_ARG, "random model: hidden %d is not a multiple of 16", hidden);
        double r = (double)hidden / c->hidden_size;
        int I = round_half_even(c->intermediate_size * r / 128.0) * 128;
        int nh = round_half_even(c->n_heads * r), nkv = round_half_even(c->n_kv_heads * r), nk = round_half_even(c->lin_nk * r);
        int ratio = c->lin_nv / c->lin_nk;
        if (I < 128) I = 128;
        if (nh < 1) nh = 1;
        if (nkv < 1) nkv = 1;
        if (nk < 1) nk = 1;
        while (nh % nkv) nh++;
        if (I > (1 << 20) || nh > 1024 || nk * ratio > 1024)
            return TD_FAIL(err, TD_ERR_ARG, "random model: hidden %d scales the config beyond its bounds", hidden);
        c->hidden_size = hidden;
        c->intermediate_size = I;
        c->n_heads = nh;
        c->n_kv_heads = nkv;
        c->lin_nk = nk;
        c->lin_nv = nk * ratio;
    }
    if (layers > 0 && layers != c->n_layers) {
        bool pat[TD_MAX_LAYERS];
        int n0 = c->n_layers;
        memcpy(pat, c->full_attn, sizeof pat);
        c->n_layers = layers;
        c->n_full_attn = 0;
        for (int i = 0; i < layers; i++) c->n_full_attn += (c->full_attn[i] = pat[i % n0]);
    }
    if (vocab > 0) {
        c->vocab_size = vocab;
        if (c->bos_token_id >= vocab) c->bos_token_id = -1;
        int k = 0;
        for (int i = 0; i < c->n_eos; i++)
            if (c->eos_token_ids[i] < vocab) c->eos_token_ids[k++] = c->eos_token_ids[i];
        c->n_eos = k;
    }
    return TD_OK;
}
