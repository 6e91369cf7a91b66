/* generation_config.json: the end-of-sequence ids and the sampling defaults a
 * model ships with (Hugging Face GenerationConfig fields; vLLM's
 * `--generation-config auto` reads the same ones). The file is optional; a
 * file that exists but is not valid JSON, or holds out-of-range values, is an
 * error: a silently different default is worse than a refusal. */
#ifndef TANDEM_MODEL_GENCONFIG_H
#define TANDEM_MODEL_GENCONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include "model/config.h"
#include "tandem.h"

typedef struct td_gen_config {
    bool found;                  /* DIR/generation_config.json exists */
    bool greedy;                 /* do_sample: false */
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty, has_max_new_tokens;
    float temperature, top_p, min_p, repetition_penalty;
    int top_k, max_new_tokens;
    int eos_token_ids[TD_MAX_EOS], n_eos;
} td_gen_config;

/* Reads DIR/generation_config.json (DIR may also be the file itself). A
 * missing file gives found = false and TD_OK. vocab_size > 0 bounds the eos
 * ids. */
int td_gen_config_load(const char *dir, int vocab_size, td_gen_config *g, td_err *err);
/* Overwrites the fields of *s (and *max_new_tokens, if not NULL) that the
 * file sets; do_sample: false sets temperature 0. */
void td_gen_config_apply(const td_gen_config *g, td_sampling *s, int *max_new_tokens);
/* "temperature 0.6, top_k 20, top_p 0.95" (what the file set), into buf. */
void td_gen_config_describe(const td_gen_config *g, char *buf, size_t n);

#endif
