#include "model/config.h"
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/err.h"

static const char *const supported_types = "qwen3_5, qwen3_5_text";

/* Notes "key=value" of a defaulted field in c->defaulted, so that a shape
 * mismatch later can say which default it came from. */
static void note_default(td_config *c, const char *k, long v) {
    size_t len = strlen(c->defaulted);
    snprintf(c->defaulted + len, sizeof c->defaulted - len, "%s%s=%ld", len ? ", " : "", k, v);
}

/* Integer field with bounds; missing → def (def < 0 means required). */
static int get_int(json_t *o, const char *k, long def, long lo, long hi, int *out, const char *path, td_err *err) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        if (def < 0 && lo >= 0) return TD_FAIL(err, TD_ERR_FORMAT, "%s: missing \"%s\"", path, k);
        if (def < lo || def > hi) /* a derived default, e.g. head_dim = hidden_size / num_attention_heads */
            return TD_FAIL(err, TD_ERR_FORMAT, "%s: \"%s\" is missing and its default %ld is outside [%ld, %ld]", path, k, def, lo, hi);
        *out = (int)def;
        return TD_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: \"%s\" must be an integer in [%ld, %ld]", path, k, lo, hi);
    *out = (int)json_integer_value(v);
    return TD_OK;
}

static int get_num(json_t *o, const char *k, double def, double lo, double hi, double *out, const char *path, td_err *err) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) { *out = def; return TD_OK; }
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: \"%s\" must be a number in [%g, %g]", path, k, lo, hi);
    *out = json_number_value(v);
    return TD_OK;
}

static int parse_text_config(json_t *t, json_t *outer, td_config *c, const char *path, td_err *err) {
    int rc;
#define I(key, def, lo, hi, dst)                                                          \
    do {                                                                                  \
        if ((rc = get_int(t, key, def, lo, hi, dst, path, err))) return rc;               \
        if (def >= 0 && !json_object_get(t, key)) note_default(c, key, def);              \
    } while (0)
    /* A missing field takes the default of transformers' Qwen3_5TextConfig
     * (transformers 5.23, configuration_qwen3_5.py), so a config means the
     * same model here as there. Size fields are checked again against every
     * tensor's shape; the others (rotary factor, theta, eps) are not, which
     * is why their defaults must be transformers' own. The head-dim bounds are
     * the kernels' limit (TD_MAX_HEAD_DIM), so a config that passes here never
     * reaches a kernel that cannot run it. */
    I("hidden_size", 4096, 1, 1 << 16, &c->hidden_size);
    I("num_hidden_layers", 32, 1, TD_MAX_LAYERS, &c->n_layers);
    I("vocab_size", 248320, 1, 1 << 22, &c->vocab_size);
    I("intermediate_size", 12288, 1, 1 << 20, &c->intermediate_size);
    I("num_attention_heads", 16, 1, 1024, &c->n_heads);
    I("num_key_value_heads", 4, 1, 1024, &c->n_kv_heads);
    I("head_dim", 256, 1, TD_MAX_HEAD_DIM, &c->head_dim);
    I("linear_num_key_heads", 16, 1, 1024, &c->lin_nk);
    I("linear_num_value_heads", 32, 1, 1024, &c->lin_nv);
    I("linear_key_head_dim", 128, 1, TD_MAX_HEAD_DIM, &c->lin_dk);
    I("linear_value_head_dim", 128, 1, TD_MAX_HEAD_DIM, &c->lin_dv);
    I("linear_conv_kernel_dim", 4, 1, 64, &c->conv_kernel);
    /* Not a transformers field (vLLM reads it): absent = as many MTP layers as
     * the weights hold (td_model_load counts mtp.layers.N). */
    c->mtp_layers_given = json_object_get(t, "mtp_num_hidden_layers") != NULL;
    if ((rc = get_int(t, "mtp_num_hidden_layers", 0, 0, 16, &c->mtp_layers, path, err))) return rc;
    I("max_position_embeddings", 32768, 1, 1 << 24, &c->max_position_embeddings);
    if ((rc = get_int(t, "bos_token_id", -1, -1, 1 << 22, &c->bos_token_id, path, err))) return rc;
    if (c->bos_token_id >= c->vocab_size)
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: bos_token_id %d outside the vocabulary (%d tokens)", path, c->bos_token_id, c->vocab_size);
    int interval;
    if (json_object_get(t, "layer_types")) { if ((rc = get_int(t, "full_attention_interval", 4, 1, TD_MAX_LAYERS, &interval, path, err))) return rc; }
    else I("full_attention_interval", 4, 1, TD_MAX_LAYERS, &interval);
#undef I

    if (c->n_heads % c->n_kv_heads)
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: num_attention_heads %d not a multiple of num_key_value_heads %d", path, c->n_heads, c->n_kv_heads);
    if (c->lin_nv % c->lin_nk)
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: linear_num_value_heads %d not a multiple of linear_num_key_heads %d", path, c->lin_nv, c->lin_nk);

    json_t *gate = json_object_get(t, "attn_output_gate");
    c->attn_output_gate = gate ? json_is_true(gate) : true;
    /* transformers ties when the config of the model class says so: the outer
     * Qwen3_5Config for the multimodal checkpoint, the text config for a flat
     * one (default false both). A checkpoint whose two say different things
     * means two different models to two readers: refused. */
    json_t *tie_in = json_object_get(t, "tie_word_embeddings"), *tie_out = outer ? json_object_get(outer, "tie_word_embeddings") : NULL;
    if ((tie_in && !json_is_boolean(tie_in)) || (tie_out && !json_is_boolean(tie_out)))
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: \"tie_word_embeddings\" must be true or false", path);
    if (tie_in && tie_out && json_is_true(tie_in) != json_is_true(tie_out))
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: tie_word_embeddings is %s at the top and %s in text_config", path,
                       json_is_true(tie_out) ? "true" : "false", json_is_true(tie_in) ? "true" : "false");
    json_t *tie = tie_out ? tie_out : tie_in;
    c->tie_word_embeddings = tie ? json_is_true(tie) : false;

    json_t *rp = json_object_get(t, "rope_parameters");
    if (!rp) rp = json_object_get(t, "rope_scaling");
    double theta, prf;
    if ((rc = get_num(t, "rope_theta", 10000.0, 1.0, 1e12, &theta, path, err))) return rc;
    /* transformers: 0.25 when neither rope_parameters nor the top level gives it */
    if ((rc = get_num(t, "partial_rotary_factor", 0.25, 0.0, 1.0, &prf, path, err))) return rc;
    if (json_is_object(rp)) {
        if ((rc = get_num(rp, "rope_theta", theta, 1.0, 1e12, &theta, path, err))) return rc;
        if ((rc = get_num(rp, "partial_rotary_factor", prf, 0.0, 1.0, &prf, path, err))) return rc;
        json_t *ty = json_object_get(rp, "rope_type");
        if (json_is_string(ty) && strcmp(json_string_value(ty), "default") != 0)
            return TD_FAIL(err, TD_ERR_UNSUPPORTED, "%s: rope_type \"%s\" is not supported (only \"default\")", path, json_string_value(ty));
    }
    c->rope_theta = theta;
    c->rot_dim = (int)(c->head_dim * prf);
    if (c->rot_dim % 2 || c->rot_dim > c->head_dim)
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: rotary dims %d (head_dim %d x %g) must be even", path, c->rot_dim, c->head_dim, prf);
    if ((rc = get_num(t, "rms_norm_eps", 1e-6, 0.0, 1.0, &c->rms_norm_eps, path, err))) return rc;

    json_t *lt = json_object_get(t, "layer_types");
    c->n_full_attn = 0;
    if (lt) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layers)
            return TD_FAIL(err, TD_ERR_FORMAT, "%s: layer_types must be an array of num_hidden_layers (%d) strings", path, c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && strcmp(s, "full_attention") == 0) c->full_attn[i] = true;
            else if (s && strcmp(s, "linear_attention") == 0) c->full_attn[i] = false;
            else return TD_FAIL(err, TD_ERR_FORMAT, "%s: layer_types[%d] must be full_attention or linear_attention", path, i);
        }
    } else {
        for (int i = 0; i < c->n_layers; i++) c->full_attn[i] = (i + 1) % interval == 0;
    }
    for (int i = 0; i < c->n_layers; i++) c->n_full_attn += c->full_attn[i];

    /* eos_token_id: int or list. */
    json_t *eos = json_object_get(t, "eos_token_id");
    if (!eos && outer) eos = json_object_get(outer, "eos_token_id");
    c->n_eos = 0;
    size_t n_eos = json_is_integer(eos) ? 1 : json_is_array(eos) ? json_array_size(eos) : 0;
    for (size_t i = 0; i < n_eos && c->n_eos < TD_MAX_EOS; i++) {
        json_t *x = json_is_integer(eos) ? eos : json_array_get(eos, i);
        if (!json_is_integer(x)) continue;
        json_int_t id = json_integer_value(x); /* range-checked before narrowing */
        if (id < 0 || id >= c->vocab_size)
            return TD_FAIL(err, TD_ERR_FORMAT, "%s: eos_token_id %lld outside the vocabulary", path, (long long)id);
        c->eos_token_ids[c->n_eos++] = (int)id;
    }
    return TD_OK;
}

int td_config_load(const char *path_in, td_config *c, td_err *err) {
    char path[4096];
    struct stat st;
    if (stat(path_in, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/config.json", path_in);
    else snprintf(path, sizeof path, "%s", path_in);
    memset(c, 0, sizeof *c);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return TD_FAIL(err, TD_ERR_FORMAT, "%s: not a regular file", path);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (access(path, R_OK) != 0) return TD_FAIL(err, TD_ERR_IO, "%s: cannot read config", path);
        return TD_FAIL(err, TD_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    }
    int rc;
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!json_is_object(root) || !mt) {
        rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: no \"model_type\" (supported: %s)", path, supported_types);
    } else if (strcmp(mt, "qwen3_5") == 0) {
        json_t *t = json_object_get(root, "text_config");
        json_t *tmt = json_is_object(t) ? json_object_get(t, "model_type") : NULL;
        if (!json_is_object(t)) rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: model_type qwen3_5 needs a \"text_config\" object", path);
        else if (tmt && (!json_is_string(tmt) || strcmp(json_string_value(tmt), "qwen3_5_text") != 0))
            rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "%s: text_config.model_type \"%s\" is not supported under qwen3_5 (only \"qwen3_5_text\")",
                         path, json_is_string(tmt) ? json_string_value(tmt) : "?");
        else rc = parse_text_config(t, root, c, path, err);
    } else if (strcmp(mt, "qwen3_5_text") == 0) {
        rc = parse_text_config(root, NULL, c, path, err);
    } else {
        rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (supported: %s)", path, mt, supported_types);
    }
    if (rc == TD_OK) snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    json_decref(root);
    return rc;
}
