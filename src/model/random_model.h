/* A random-weight model generated directly in backend memory from a config
 * (no weight files): every tensor is written by the backend's fill_random op,
 * so a device benchmark at a full config (54 GB of BF16 for Qwen3.6-27B)
 * needs no disk and no host copy, and the weights are the same bytes on
 * every backend for one (config, spec).
 *
 * Values follow tools/bench/make_random_model.py: linear weights uniform in
 * +-0.03, zero-centred norms 0 (stored 1 + 0), dt_bias 0, A_log 0. With an
 * MTP head (mtp_mix >= 0) its --mtp MIX construction: the trunk's residual
 * writes (o_proj, out_proj, down_proj) uniform in +-0.03 MIX, the embedding
 * uniform in +-sqrt(3) (rms 1), MTP fc = [I | 0] and the MTP layer's o_proj
 * and down_proj 0, so the head drafts argmax lm_head(rms(embed(x))) and the
 * trunk agrees with it the more the smaller MIX (MIX 0: always). One
 * difference: the DeltaNet gated norm weight (not zero-centred) is 1 here,
 * where the script writes 0 (which silences every DeltaNet layer). */
#ifndef TANDEM_MODEL_RANDOM_MODEL_H
#define TANDEM_MODEL_RANDOM_MODEL_H
#include <stdint.h>
#include "backend/backend.h"
#include "model/model.h"

typedef struct td_random_spec {
    td_dtype dtype;    /* linear weights: F32, BF16, F8_E4M3 (128 x 128 F32 block scales), NVFP4 (fp8
                          scales per 16 inputs, global scale) or Q8 (BF16 scales per 32 inputs, as
                          --quantize q8 makes); the embedding, lm_head and MTP fc are BF16 (F32 when
                          dtype is F32), and so is a linear weight whose in_features is not a multiple
                          of the format's block (16; Q8: 32) */
    uint64_t seed;     /* the weights are a pure function of (config, spec) */
    float mtp_mix;     /* < 0: no MTP head; >= 0: the head above with MIX = mtp_mix (at most 100) */
    int hidden, layers, vocab; /* 0: as the config; else scaled as make_random_model.py (td_config_scale) */
    bool q8_grouped;   /* Q8 weights stored in the grouped order of td_q8g_offset (--precision int8 reads
                          that): the same weights, each row's bytes permuted after they are drawn */
} td_random_spec;

/* Scales c as make_random_model.py does: hidden > 0 scales the widths by
 * hidden / hidden_size (intermediate to a multiple of 128, attention and
 * DeltaNet key heads rounded, GQA and value/key ratios kept, head dims kept);
 * layers > 0 repeats the layer-type pattern; vocab > 0 sets the vocabulary
 * (bos / eos ids outside it dropped). TD_ERR_ARG when a result leaves the
 * config's bounds. */
int td_config_scale(td_config *c, int hidden, int layers, int vocab, td_err *err);

/* Bytes of backend memory the generated weights of (c, s) take (tensors, scales and
 * f32 vectors), with every product checked; TD_ERR_ARG when it overflows. */
int td_random_model_bytes(const td_config *c, const td_random_spec *s, uint64_t *bytes, td_err *err);

/* Generates the model of (c, s) in b's memory: *out is caller-owned
 * (td_model_free, before b is freed) with m->dev = b. TD_ERR_ARG for a bad
 * spec, TD_ERR_NOMEM when the weights do not fit b (checked against the
 * device's free memory or the machine's RAM before anything is allocated). */
int td_model_random(const td_config *c, const td_random_spec *s, td_backend *b, td_model **out, td_err *err);

#endif
