/* A loaded qwen3_5 model: config, memory-mapped weight views, small f32
 * copies of the vectors (norms, conv kernels, gates) and the MTP head. */
#ifndef TANDEM_MODEL_MODEL_H
#define TANDEM_MODEL_MODEL_H
#include <stdbool.h>
#include "format/safetensors.h"
#include "model/config.h"
#include "model/tensor.h"

typedef struct td_attn_weights {
    td_tensor q_proj;   /* [n_heads*head_dim*(gate?2:1), H]; per head [q | gate] */
    td_tensor k_proj;   /* [n_kv*head_dim, H] */
    td_tensor v_proj;   /* [n_kv*head_dim, H] */
    td_tensor o_proj;   /* [H, n_heads*head_dim] */
    float *q_norm1;     /* [head_dim], holds 1 + w (zero-centred RMSNorm) */
    float *k_norm1;     /* [head_dim], 1 + w */
} td_attn_weights;

typedef struct td_deltanet_weights {
    td_tensor in_proj_qkv; /* [2*nk*dk + nv*dv, H], rows [q | k | v] */
    td_tensor in_proj_z;   /* [nv*dv, H] */
    td_tensor in_proj_b;   /* [nv, H] */
    td_tensor in_proj_a;   /* [nv, H] */
    td_tensor out_proj;    /* [H, nv*dv] */
    float *conv;           /* [conv_dim, K] depthwise causal kernel */
    float *dt_bias;        /* [nv] */
    float *neg_A;          /* [nv] = -exp(A_log) */
    float *norm;           /* [dv] plain w (gated norm is not zero-centred) */
} td_deltanet_weights;

typedef struct td_layer_weights {
    bool full_attn;
    float *input_norm1;    /* [H], 1 + w */
    float *post_norm1;     /* [H], 1 + w */
    td_attn_weights attn;
    td_deltanet_weights lin;
    td_tensor gate_proj, up_proj; /* [I, H] */
    td_tensor down_proj;          /* [H, I] */
} td_layer_weights;

typedef struct td_mtp_weights {
    td_tensor fc;                 /* [H, 2H], input concat(embed, hidden) */
    float *pre_fc_norm_embedding1, *pre_fc_norm_hidden1, *norm1; /* [H], 1 + w */
    td_layer_weights layer;       /* one full-attention decoder layer */
} td_mtp_weights;

typedef struct td_model {
    td_config cfg;
    td_weights *weights;
    char prefix[32];              /* "model.language_model." or "model." */
    td_tensor embed;              /* [V, H] */
    td_tensor lm_head;            /* [V, H] (== embed when tied) */
    float *final_norm1;           /* [H], 1 + w */
    td_layer_weights *layers;     /* [n_layers] */
    bool has_mtp;
    td_mtp_weights mtp;
    /* Parameter counts by part, for `inspect` and the planner. */
    int64_t n_params_main, n_params_mtp, n_params_embed, n_params_head;
    size_t bytes_main, bytes_mtp, bytes_embed, bytes_head;
    float **owned_vecs; /* every f32 vector above, for freeing */
    int n_owned_vecs;
    struct td_huge_buf { void *p; size_t len; } *huge_bufs; /* --quantize q8 copies in huge pages (util/hugemem.h) */
    int n_huge_bufs;
    size_t owned_bytes; /* their total size */
    /* A generated model (td_model_random, model/random_model.h): non-NULL when every
     * tensor's data and scales and every vector above are already memory of this
     * backend. The forward then uses them as they are (no weight_load) and
     * td_model_free gives dev_bufs back to it, so the backend must outlive the model. */
    struct td_backend *dev;
    void **dev_bufs;
    int n_dev_bufs;
    size_t dev_bytes; /* their total size */
} td_model;

/* Bytes of the f32 copies the loader makes (norms, conv1d, dt_bias, A):
 * what td_model_load allocates besides the mapped safetensors. */
size_t td_model_owned_bytes_for(const td_config *c, bool has_mtp);

int td_model_load(const char *dir, td_model **out, td_err *err);
void td_model_free(td_model *m);

#endif
