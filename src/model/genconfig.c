#include "model/genconfig.h"
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "util/err.h"

/* A number field in [lo, hi]: absent or null leaves *has false. */
static int num_field(json_t *g, const char *k, double lo, double hi, bool *has, float *out, const char *path, td_err *err) {
    json_t *v = json_object_get(g, k);
    *has = false;
    if (!v || json_is_null(v)) return TD_OK;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: \"%s\" must be a number in [%g, %g]", path, k, lo, hi);
    *has = true;
    *out = (float)json_number_value(v);
    return TD_OK;
}

static int int_field(json_t *g, const char *k, long lo, long hi, bool *has, int *out, const char *path, td_err *err) {
    json_t *v = json_object_get(g, k);
    *has = false;
    if (!v || json_is_null(v)) return TD_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: \"%s\" must be an integer in [%ld, %ld]", path, k, lo, hi);
    *has = true;
    *out = (int)json_integer_value(v);
    return TD_OK;
}

int td_gen_config_load(const char *dir, int vocab_size, td_gen_config *g, td_err *err) {
    memset(g, 0, sizeof *g);
    char path[4200];
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/generation_config.json", dir);
    else snprintf(path, sizeof path, "%s", dir);
    if (stat(path, &st) != 0) return TD_OK; /* optional */
    if (!S_ISREG(st.st_mode)) return TD_FAIL(err, TD_ERR_FORMAT, "%s: not a regular file", path);
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) return TD_FAIL(err, TD_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    int rc = TD_OK;
    if (!json_is_object(j)) { rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: not a JSON object", path); goto out; }
    g->found = true;
    json_t *ds = json_object_get(j, "do_sample");
    if (ds && !json_is_boolean(ds) && !json_is_null(ds)) { rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: \"do_sample\" must be true or false", path); goto out; }
    g->greedy = json_is_false(ds);
    if ((rc = num_field(j, "temperature", 0, 100, &g->has_temperature, &g->temperature, path, err))) goto out;
    if ((rc = num_field(j, "top_p", 1e-9, 1, &g->has_top_p, &g->top_p, path, err))) goto out;
    if ((rc = num_field(j, "min_p", 0, 1, &g->has_min_p, &g->min_p, path, err))) goto out;
    if ((rc = num_field(j, "repetition_penalty", 1e-3, 100, &g->has_repetition_penalty, &g->repetition_penalty, path, err))) goto out;
    if ((rc = int_field(j, "top_k", 0, 1 << 30, &g->has_top_k, &g->top_k, path, err))) goto out;
    if ((rc = int_field(j, "max_new_tokens", 1, 1 << 30, &g->has_max_new_tokens, &g->max_new_tokens, path, err))) goto out;
    /* eos_token_id: an id or a list of ids (all of them end generation) */
    json_t *eos = json_object_get(j, "eos_token_id");
    if (eos && !json_is_null(eos)) {
        size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
        if ((!json_is_array(eos) && !json_is_integer(eos)) || n > TD_MAX_EOS) {
            rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: \"eos_token_id\" must be an id or a list of at most %d ids", path, TD_MAX_EOS);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_is_array(eos) ? json_array_get(eos, i) : eos;
            json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
            if (id < 0 || (vocab_size > 0 && id >= vocab_size) || id > (1 << 30)) {
                rc = TD_FAIL(err, TD_ERR_FORMAT, "%s: eos_token_id entry %zu is not an id in the vocabulary (%d tokens)", path, i, vocab_size);
                goto out;
            }
            g->eos_token_ids[g->n_eos++] = (int)id;
        }
    }
out:
    json_decref(j);
    return rc;
}

void td_gen_config_apply(const td_gen_config *g, td_sampling *s, int *max_new_tokens) {
    if (!g->found) return;
    if (g->greedy) s->temperature = 0;
    else if (g->has_temperature) s->temperature = g->temperature;
    if (g->has_top_p) s->top_p = g->top_p;
    if (g->has_top_k) s->top_k = g->top_k;
    if (g->has_min_p) s->min_p = g->min_p;
    if (g->has_repetition_penalty) s->repetition_penalty = g->repetition_penalty;
    if (max_new_tokens && g->has_max_new_tokens) *max_new_tokens = g->max_new_tokens;
}

static void append(char *buf, size_t n, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

void td_gen_config_describe(const td_gen_config *g, char *buf, size_t n) {
    if (!n) return;
    buf[0] = 0;
    if (g->greedy) append(buf, n, "greedy (do_sample false)");
    else if (g->has_temperature) append(buf, n, "temperature %g", g->temperature);
    if (g->has_top_k) append(buf, n, "%stop_k %d", buf[0] ? ", " : "", g->top_k);
    if (g->has_top_p) append(buf, n, "%stop_p %g", buf[0] ? ", " : "", g->top_p);
    if (g->has_min_p) append(buf, n, "%smin_p %g", buf[0] ? ", " : "", g->min_p);
    if (g->has_repetition_penalty) append(buf, n, "%srepetition_penalty %g", buf[0] ? ", " : "", g->repetition_penalty);
    if (g->has_max_new_tokens) append(buf, n, "%smax_new_tokens %d", buf[0] ? ", " : "", g->max_new_tokens);
    if (!buf[0]) append(buf, n, "no sampling fields");
}
