/* Model hyper-parameters read from a Hugging Face config.json
 * (`qwen3_5` with `text_config`, or flat `qwen3_5_text`). */
#ifndef TANDEM_MODEL_CONFIG_H
#define TANDEM_MODEL_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include "tandem.h"

#define TD_MAX_LAYERS 1024
#define TD_MAX_EOS 8
/* Largest attention / DeltaNet head dim the CPU kernels take (per-head
 * scratch lives on the stack in forward.c); checked at config load. */
#define TD_MAX_HEAD_DIM 1024

typedef struct td_config {
    char model_type[32];      /* outer model_type as written */
    int hidden_size, n_layers, vocab_size, intermediate_size;
    int n_heads, n_kv_heads, head_dim;   /* full attention */
    bool attn_output_gate;               /* q_proj emits [q | gate] per head */
    int rot_dim;                         /* head_dim * partial_rotary_factor (even) */
    double rope_theta, rms_norm_eps;
    int lin_nk, lin_nv, lin_dk, lin_dv, conv_kernel; /* Gated DeltaNet */
    bool full_attn[TD_MAX_LAYERS];       /* layer_types[i] == full_attention */
    int n_full_attn;
    bool tie_word_embeddings;
    int mtp_layers;                      /* mtp_num_hidden_layers (0 when absent) */
    bool mtp_layers_given;               /* false: td_model_load counts mtp.layers.N */
    int max_position_embeddings;
    int bos_token_id;                    /* -1 when absent */
    int eos_token_ids[TD_MAX_EOS], n_eos;
    char defaulted[512];                 /* "head_dim=256, ...": size fields config.json left out */
} td_config;

/* Reads and validates <dir>/config.json (or a config file path). */
int td_config_load(const char *path, td_config *cfg, td_err *err);

/* Derived sizes. */
static inline int td_cfg_lin_key_dim(const td_config *c) { return c->lin_nk * c->lin_dk; }
static inline int td_cfg_lin_value_dim(const td_config *c) { return c->lin_nv * c->lin_dv; }
static inline int td_cfg_lin_conv_dim(const td_config *c) { return 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv; }
/* DeltaNet state of one DeltaNet layer (conv window, then recurrent state)
 * and of the whole model, in floats: the one formula for its size. */
static inline size_t td_cfg_deltanet_layer_floats(const td_config *c) {
    return (size_t)(c->conv_kernel - 1) * (size_t)td_cfg_lin_conv_dim(c) + (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
}
static inline size_t td_cfg_deltanet_state_floats(const td_config *c) {
    return (size_t)(c->n_layers - c->n_full_attn) * td_cfg_deltanet_layer_floats(c);
}

#endif
