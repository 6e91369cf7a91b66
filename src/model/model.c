#include "model/model.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "model/genconfig.h"
#include "util/err.h"
#include "util/hugemem.h"

/* Loader context: owned f32 vectors are tracked for freeing. */
typedef struct {
    td_model *m;
    const char *dir;
    td_err *err;
    char index_path[4200];
    float **owned;
    int n_owned, cap_owned;
} loader;

static const td_st_entry *lookup(loader *L, const char *name) { return td_weights_find(L->m->weights, name); }

static const char *file_of(loader *L, const td_st_entry *e) { return L->m->weights->files[e->file].path; }

/* Where a missing tensor was looked for: the one weights file, else the index. */
static const char *weights_source(loader *L) {
    const td_weights *w = L->m->weights;
    return w->n_files == 1 ? w->files[0].path : L->index_path;
}

static bool is_float_dtype(td_dtype t) { return t == TD_DTYPE_F32 || t == TD_DTYPE_BF16 || t == TD_DTYPE_F16; }

/* Checks presence, dtype and shape of `name`; shape given as ndim then dims. */
static int get_tensor(loader *L, td_tensor *out, const char *name, int ndim, ...) {
    const td_st_entry *e = lookup(L, name);
    if (!e) return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: missing tensor %s", weights_source(L), name);
    if (!is_float_dtype(e->dtype))
        return TD_FAIL(L->err, TD_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (supported: F32, BF16, F16)", file_of(L, e), name, e->dtype_str);
    /* Kernels load elements in place: the data must be aligned to them. */
    size_t esize = td_dtype_size(e->dtype);
    if (esize > 1 && (uintptr_t)e->data % esize)
        return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: tensor %s: data at file offset %zu is not aligned to its %zu-byte elements",
                       file_of(L, e), name, (size_t)((const char *)e->data - (const char *)L->m->weights->files[e->file].map), esize);
    va_list ap;
    va_start(ap, ndim);
    int64_t want[TD_MAX_DIMS];
    for (int i = 0; i < ndim; i++) want[i] = va_arg(ap, int64_t);
    va_end(ap);
    bool ok = e->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = e->shape[i] == want[i];
    if (!ok) {
        char got[96] = "", exp[96] = "";
        for (int i = 0; i < e->ndim; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)e->shape[i]);
        for (int i = 0; i < ndim; i++) snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%lld", i ? ", " : "", (long long)want[i]);
        char why[700] = "";
        if (L->m->cfg.defaulted[0])
            snprintf(why, sizeof why, " (%s/config.json leaves these out, so transformers' defaults apply: %s)", L->dir, L->m->cfg.defaulted);
        return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: tensor %s has shape [%s], config needs [%s]%s", file_of(L, e), name, got, exp, why);
    }
    td_st_entry_tensor(e, out);
    return TD_OK;
}

/* Reads a scalar (any float dtype, shape [] or [1]) into *v. */
static int get_scalar(loader *L, const td_st_entry *e, float *v) {
    td_tensor t;
    td_st_entry_tensor(e, &t);
    if (!is_float_dtype(e->dtype) || td_tensor_numel(&t) != 1)
        return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: tensor %s: expected one float scale", file_of(L, e), e->name);
    *v = td_tensor_get_f32(&t, 0);
    return TD_OK;
}

/* A big linear weight [rows, cols]: a float tensor, or quantized with its
 * scales attached (kernels dequantize in registers; reference notes §7):
 *  - FP8 e4m3 `weight` + `weight_scale_inv` [rows/bn, cols/bk] (HF block FP8),
 *    or `weight_scale` scalar (per tensor) / [rows, 1] (per channel);
 *  - NVFP4 ModelOpt: U8 `weight` [rows, cols/2], fp8 `weight_scale`
 *    [rows, cols/16], `weight_scale_2` (W = e2m1 * scale * weight_scale_2);
 *  - NVFP4 compressed-tensors: `weight_packed`, `weight_scale`,
 *    `weight_global_scale` (W = e2m1 * scale / weight_global_scale). */
static int get_linear(loader *L, td_tensor *out, const char *name, int ndim, int64_t rows, int64_t cols) {
    char base[512], sn[600];
    size_t bl = strlen(name);
    const td_st_entry *e = lookup(L, name);
    if (ndim != 2 || bl < 6 || strcmp(name + bl - 6, "weight")) return get_tensor(L, out, name, ndim, rows, cols);
    snprintf(base, sizeof base, "%.*s", (int)(bl - 6), name);
#define SCALE(suffix) (snprintf(sn, sizeof sn, "%s%s", base, suffix), lookup(L, sn))
    bool packed = false;
    if (!e && (e = SCALE("weight_packed")) != NULL) packed = true;
    if (!e || (e->dtype != TD_DTYPE_F8_E4M3 && e->dtype != TD_DTYPE_U8)) return get_tensor(L, out, name, ndim, rows, cols);
    int rc;
    if (e->dtype == TD_DTYPE_F8_E4M3) {
        if (e->ndim != 2 || e->shape[0] != rows || e->shape[1] != cols)
            return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: tensor %s: fp8 weight shape does not match [%lld, %lld]", file_of(L, e), e->name,
                           (long long)rows, (long long)cols);
        td_st_entry_tensor(e, out);
        out->scale_f = 1.0f;
        const td_st_entry *s = SCALE("weight_scale_inv");
        if (!s) s = SCALE("weight_scale");
        if (!s) return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: fp8 tensor %s has no %sweight_scale_inv or %sweight_scale", file_of(L, e), e->name, base, base);
        td_tensor st;
        td_st_entry_tensor(s, &st);
        if (td_tensor_numel(&st) == 1 && s->ndim < 2) return get_scalar(L, s, &out->scale_f);
        if (!is_float_dtype(s->dtype) || s->ndim != 2 || s->shape[0] < 1 || s->shape[1] < 1)
            return TD_FAIL(L->err, TD_ERR_UNSUPPORTED, "%s: fp8 scales %s: need a float scalar or a 2-D float grid", file_of(L, s), s->name);
        /* 128 x 128 (HF weight_block_size) when it tiles the grid, else the even split */
        int64_t bn = (rows + 127) / 128 == s->shape[0] ? 128 : (rows + s->shape[0] - 1) / s->shape[0];
        int64_t bk = (cols + 127) / 128 == s->shape[1] ? 128 : (cols + s->shape[1] - 1) / s->shape[1];
        if (s->shape[0] == rows) bn = 1;
        if (s->shape[1] == 1) bk = cols;
        if ((rows + bn - 1) / bn != s->shape[0] || (cols + bk - 1) / bk != s->shape[1] || bk % 16)
            return TD_FAIL(L->err, TD_ERR_UNSUPPORTED, "%s: fp8 scales %s [%lld, %lld]: blocks must tile [%lld, %lld] with column blocks of 16k",
                           file_of(L, s), s->name, (long long)s->shape[0], (long long)s->shape[1], (long long)rows, (long long)cols);
        out->scales = s->data;
        out->scales_dtype = s->dtype;
        out->scale_block[0] = bn;
        out->scale_block[1] = bk;
        return TD_OK;
    }
    /* NVFP4: two e2m1 per byte */
    if (e->ndim != 2 || e->shape[0] != rows || e->shape[1] * 2 != cols || cols % 16)
        return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: tensor %s: nvfp4 weight must be U8 [%lld, %lld] with in_features %% 16 == 0", file_of(L, e),
                       e->name, (long long)rows, (long long)cols / 2);
    const td_st_entry *s = SCALE("weight_scale");
    if (!s || s->dtype != TD_DTYPE_F8_E4M3 || s->ndim != 2 || s->shape[0] != rows || s->shape[1] != cols / 16)
        return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: nvfp4 tensor %s needs %sweight_scale F8_E4M3 [%lld, %lld]", file_of(L, e), e->name, base,
                       (long long)rows, (long long)cols / 16);
    float g;
    const td_st_entry *gs = SCALE(packed ? "weight_global_scale" : "weight_scale_2");
    if (!gs) return TD_FAIL(L->err, TD_ERR_FORMAT, "%s: nvfp4 tensor %s has no %s", file_of(L, e), e->name, sn);
    if ((rc = get_scalar(L, gs, &g))) return rc;
    td_st_entry_tensor(e, out);
    out->dtype = TD_DTYPE_NVFP4;
    out->shape[1] = cols;
    out->scales = s->data;
    out->scales_dtype = TD_DTYPE_F8_E4M3;
    out->scale_block[0] = 1;
    out->scale_block[1] = 16;
    out->scale_f = packed ? 1.0f / g : g;
#undef SCALE
    return TD_OK;
}

/* A 1-D (or flattened) float vector copied to owned f32, plus `add` (1 for zero-centred norms). */
static int get_vec(loader *L, float **out, const char *name, int64_t n, float add, int ndim, ...) {
    td_tensor t;
    va_list ap;
    va_start(ap, ndim);
    int64_t d[TD_MAX_DIMS] = {n, 1, 1, 1};
    if (ndim == 3)
        for (int i = 0; i < 3; i++) d[i] = va_arg(ap, int64_t);
    va_end(ap);
    int rc = ndim == 3 ? get_tensor(L, &t, name, 3, d[0], d[1], d[2]) : get_tensor(L, &t, name, 1, n);
    if (rc) return rc;
    float *v = TD_MALLOC(L->err, (size_t)n * sizeof(float));
    if (!v) return TD_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) v[i] = td_tensor_get_f32(&t, i) + add;
    if (L->n_owned == L->cap_owned) {
        int nc = L->cap_owned ? L->cap_owned * 2 : 64;
        float **no = realloc(L->owned, (size_t)nc * sizeof *no);
        if (!no) { free(v); return TD_FAIL(L->err, TD_ERR_NOMEM, "out of memory"); }
        L->owned = no;
        L->cap_owned = nc;
    }
    L->owned[L->n_owned++] = v;
    L->m->owned_bytes += (size_t)n * sizeof(float);
    *out = v;
    return TD_OK;
}

static int64_t tensor_params(const td_tensor *t) { return td_tensor_numel(t); }
static size_t tensor_bytes(const td_tensor *t) {
    if (t->dtype == TD_DTYPE_NVFP4) return (size_t)td_tensor_numel(t) / 2 + (size_t)td_tensor_numel(t) / 16;
    return (size_t)td_tensor_numel(t) * td_dtype_size(t->dtype);
}

static size_t owned_layer_floats(const td_config *c, bool full) {
    size_t f = 2 * (size_t)c->hidden_size; /* input / post-attention norms */
    if (full) return f + 2 * (size_t)c->head_dim; /* q_norm, k_norm */
    return f + (size_t)td_cfg_lin_conv_dim(c) * (size_t)c->conv_kernel + 2 * (size_t)c->lin_nv + (size_t)c->lin_dv;
}

size_t td_model_owned_bytes_for(const td_config *c, bool has_mtp) {
    size_t f = (size_t)c->hidden_size; /* final norm */
    for (int i = 0; i < c->n_layers; i++) f += owned_layer_floats(c, c->full_attn[i]);
    if (has_mtp) f += 3 * (size_t)c->hidden_size + owned_layer_floats(c, true);
    return f * sizeof(float);
}

/* Loads a decoder layer whose tensors live under `base` (e.g. "model.layers.3."). */
static int load_layer(loader *L, td_layer_weights *lw, const char *base, bool full, int64_t *params, size_t *bytes) {
    const td_config *c = &L->m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size;
    char n[512];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "%s%s", base, s), n)
#define T(dst, s, ...) do { if ((rc = get_linear(L, dst, NAME(s), __VA_ARGS__))) return rc; *params += tensor_params(dst); *bytes += tensor_bytes(dst); } while (0)
#define V(dst, s, len, add) do { if ((rc = get_vec(L, dst, NAME(s), len, add, 1))) return rc; *params += len; *bytes += (size_t)(len) * 2; } while (0)
    lw->full_attn = full;
    V(&lw->input_norm1, "input_layernorm.weight", H, 1.0f);
    V(&lw->post_norm1, "post_attention_layernorm.weight", H, 1.0f);
    if (full) {
        int64_t hd = c->head_dim, q_out = (int64_t)c->n_heads * hd * (c->attn_output_gate ? 2 : 1);
        T(&lw->attn.q_proj, "self_attn.q_proj.weight", 2, q_out, H);
        T(&lw->attn.k_proj, "self_attn.k_proj.weight", 2, (int64_t)c->n_kv_heads * hd, H);
        T(&lw->attn.v_proj, "self_attn.v_proj.weight", 2, (int64_t)c->n_kv_heads * hd, H);
        T(&lw->attn.o_proj, "self_attn.o_proj.weight", 2, H, (int64_t)c->n_heads * hd);
        V(&lw->attn.q_norm1, "self_attn.q_norm.weight", hd, 1.0f);
        V(&lw->attn.k_norm1, "self_attn.k_norm.weight", hd, 1.0f);
    } else {
        int64_t conv = td_cfg_lin_conv_dim(c), vd = td_cfg_lin_value_dim(c), nv = c->lin_nv, K = c->conv_kernel;
        T(&lw->lin.in_proj_qkv, "linear_attn.in_proj_qkv.weight", 2, conv, H);
        T(&lw->lin.in_proj_z, "linear_attn.in_proj_z.weight", 2, vd, H);
        T(&lw->lin.in_proj_b, "linear_attn.in_proj_b.weight", 2, nv, H);
        T(&lw->lin.in_proj_a, "linear_attn.in_proj_a.weight", 2, nv, H);
        T(&lw->lin.out_proj, "linear_attn.out_proj.weight", 2, H, vd);
        if ((rc = get_vec(L, &lw->lin.conv, NAME("linear_attn.conv1d.weight"), conv * K, 0.0f, 3, conv, (int64_t)1, K))) return rc;
        *params += conv * K;
        V(&lw->lin.dt_bias, "linear_attn.dt_bias", nv, 0.0f);
        V(&lw->lin.neg_A, "linear_attn.A_log", nv, 0.0f);
        for (int64_t h = 0; h < nv; h++) lw->lin.neg_A[h] = -expf(lw->lin.neg_A[h]);
        V(&lw->lin.norm, "linear_attn.norm.weight", (int64_t)c->lin_dv, 0.0f);
    }
    T(&lw->gate_proj, "mlp.gate_proj.weight", 2, I, H);
    T(&lw->up_proj, "mlp.up_proj.weight", 2, I, H);
    T(&lw->down_proj, "mlp.down_proj.weight", 2, H, I);
#undef T
#undef V
#undef NAME
    return TD_OK;
}

static bool has_prefix_tensor(td_weights *w, const char *prefix) {
    char n[256];
    snprintf(n, sizeof n, "%sembed_tokens.weight", prefix);
    return td_weights_find(w, n) != NULL;
}

int td_model_load(const char *dir, td_model **out, td_err *err) {
    *out = NULL;
    td_model *m = TD_CALLOC(err, 1, sizeof *m);
    if (!m) return TD_ERR_NOMEM;
    loader L = {.m = m, .dir = dir, .err = err};
    snprintf(L.index_path, sizeof L.index_path, "%s/model.safetensors.index.json", dir);
    int rc = td_config_load(dir, &m->cfg, err);
    /* generation_config.json's eos ids end generation too (its list is what
     * transformers' generate stops on: the demo model's <|endoftext|> is only
     * there). */
    td_gen_config gc;
    if (!rc) rc = td_gen_config_load(dir, m->cfg.vocab_size, &gc, err);
    for (int i = 0; !rc && i < gc.n_eos; i++) {
        bool seen = false;
        for (int j = 0; j < m->cfg.n_eos; j++) seen |= m->cfg.eos_token_ids[j] == gc.eos_token_ids[i];
        if (!seen && m->cfg.n_eos < TD_MAX_EOS) m->cfg.eos_token_ids[m->cfg.n_eos++] = gc.eos_token_ids[i];
    }
    if (!rc) rc = td_weights_open_dir(dir, &m->weights, err);
    if (rc) goto fail;
    const td_config *c = &m->cfg;
    int64_t H = c->hidden_size, V = c->vocab_size;
    if (has_prefix_tensor(m->weights, "model.language_model.")) snprintf(m->prefix, sizeof m->prefix, "model.language_model.");
    else if (has_prefix_tensor(m->weights, "model.")) snprintf(m->prefix, sizeof m->prefix, "model.");
    else {
        rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: missing tensor model.language_model.embed_tokens.weight (or model.embed_tokens.weight)",
                     weights_source(&L));
        goto fail;
    }
    char n[512];
    snprintf(n, sizeof n, "%sembed_tokens.weight", m->prefix);
    if ((rc = get_tensor(&L, &m->embed, n, 2, V, H))) goto fail;
    m->n_params_embed = V * H;
    m->bytes_embed = tensor_bytes(&m->embed);
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else {
        if ((rc = get_tensor(&L, &m->lm_head, "lm_head.weight", 2, V, H))) goto fail;
        m->n_params_head = V * H;
        m->bytes_head = tensor_bytes(&m->lm_head);
    }
    snprintf(n, sizeof n, "%snorm.weight", m->prefix);
    if ((rc = get_vec(&L, &m->final_norm1, n, H, 1.0f, 1))) goto fail;
    m->layers = TD_CALLOC(err, (size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) { rc = TD_ERR_NOMEM; goto fail; }
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(n, sizeof n, "%slayers.%d.", m->prefix, i);
        if ((rc = load_layer(&L, &m->layers[i], n, c->full_attn[i], &m->n_params_main, &m->bytes_main))) goto fail;
    }
    m->n_params_main += H;
    /* mtp_num_hidden_layers is not a transformers field: when a config leaves
     * it out, the head is as deep as the mtp.layers.N the weights hold. */
    if (!c->mtp_layers_given) {
        int n_mtp = 0;
        while (n_mtp < 16) {
            snprintf(n, sizeof n, "mtp.layers.%d.input_layernorm.weight", n_mtp);
            if (!td_weights_find(m->weights, n)) break;
            n_mtp++;
        }
        m->cfg.mtp_layers = n_mtp;
    }
    /* MTP head: all of it or none of it (some exports strip mtp.*). */
    m->has_mtp = c->mtp_layers > 0 && td_weights_find(m->weights, "mtp.fc.weight") != NULL;
    if (m->has_mtp) {
        td_mtp_weights *t = &m->mtp;
        if ((rc = get_tensor(&L, &t->fc, "mtp.fc.weight", 2, H, 2 * H))) goto fail;
        if ((rc = get_vec(&L, &t->pre_fc_norm_embedding1, "mtp.pre_fc_norm_embedding.weight", H, 1.0f, 1))) goto fail;
        if ((rc = get_vec(&L, &t->pre_fc_norm_hidden1, "mtp.pre_fc_norm_hidden.weight", H, 1.0f, 1))) goto fail;
        if ((rc = get_vec(&L, &t->norm1, "mtp.norm.weight", H, 1.0f, 1))) goto fail;
        m->n_params_mtp = td_tensor_numel(&t->fc) + 3 * H;
        m->bytes_mtp = tensor_bytes(&t->fc) + 3 * (size_t)H * 2;
        if ((rc = load_layer(&L, &t->layer, "mtp.layers.0.", true, &m->n_params_mtp, &m->bytes_mtp))) goto fail;
    } else if (c->mtp_layers > 0) {
        for (int i = 0; i < m->weights->n_entries; i++)
            if (strncmp(m->weights->entries[i].name, "mtp.", 4) == 0) {
                rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: MTP head incomplete: has %s but no mtp.fc.weight", weights_source(&L),
                             m->weights->entries[i].name);
                goto fail;
            }
    }
    /* Owned vectors are freed through this list. */
    m->owned_vecs = L.owned;
    m->n_owned_vecs = L.n_owned;
    *out = m;
    return TD_OK;
fail:
    for (int i = 0; i < L.n_owned; i++) free(L.owned[i]);
    free(L.owned);
    td_weights_free(m->weights);
    free(m->layers);
    free(m);
    return rc;
}

void td_model_free(td_model *m) {
    if (!m) return;
    for (int i = 0; m->dev && i < m->n_dev_bufs; i++) m->dev->ops->free(m->dev, m->dev_bufs[i]);
    free(m->dev_bufs);
    for (int i = 0; i < m->n_owned_vecs; i++) free(m->owned_vecs[i]);
    free(m->owned_vecs);
    for (int i = 0; i < m->n_huge_bufs; i++) td_huge_unmap(m->huge_bufs[i].p, m->huge_bufs[i].len);
    free(m->huge_bufs);
    td_weights_free(m->weights);
    free(m->layers);
    free(m);
}
