/* Memory planner: from a model config and serving options, how the device
 * memory splits into weights, activations, CUDA graphs and KV cache, whether
 * one request of the full window fits, and if not what would (issue 5).
 *
 * Pure functions of their arguments (no I/O except td_plan_weights_from_dir),
 * so `tandem plan`, `tandem serve`'s start-up check and the tests share one
 * set of formulas. The formulas and their calibration against the reference
 * measurement are in src/plan/README.md. */
#ifndef TANDEM_PLAN_PLAN_H
#define TANDEM_PLAN_PLAN_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "model/config.h"
#include "tandem.h"

#define TD_PLAN_GIB (1024.0 * 1024.0 * 1024.0)
#define TD_PLAN_DEPTHS 9 /* the per-depth table covers depths 0..8 */

typedef enum { TD_QUANT_NVFP4 = 0, TD_QUANT_FP8, TD_QUANT_BF16 } td_quant;
/* GPU: the vLLM-calibrated model below. CPU: what the CPU engine allocates
 * (src/plan/README.md, "CPU backend"): KV f32 under AUTO, no graphs, no
 * runtime reserve, the engine's own scratch / session / state sizes. */
typedef enum { TD_PLAN_GPU = 0, TD_PLAN_CPU } td_plan_backend;

/* Weight bytes by part. "main" is the decoder layers plus the final norm. */
typedef struct td_plan_weights {
    uint64_t main, mtp, embed, lm_head;
} td_plan_weights;

typedef struct td_plan_opts {
    td_quant quant;               /* used when weights are estimated */
    td_kv_dtype kv_dtype;         /* AUTO means bf16 here: callers resolve it from the checkpoint first */
    uint64_t device_bytes;        /* total device memory */
    double gpu_util;              /* fraction of device_bytes we may use, (0, 1] */
    int64_t max_model_len;        /* tokens; 0 = "auto": the largest window that fits */
    int spec_depth;               /* MTP draft tokens per step, 0..TD_MAX_SPEC_DEPTH */
    bool cuda_graphs;             /* false = --enforce-eager: no graph memory */
    int max_num_seqs;             /* concurrent sequences (sampler rows, graph capture sizes) */
    int max_num_batched_tokens;   /* prefill chunk: tokens in one forward */
    int block_size;               /* KV block, tokens; requests take whole blocks */
    uint64_t runtime_bytes;       /* fixed runtime reserve (CUDA context, library workspaces) */
    bool weights_given;           /* use `weights` instead of the estimate from the config */
    td_plan_weights weights;
    td_plan_backend backend;      /* GPU (default) or CPU */
    /* CPU only. device_bytes x gpu_util is the memory budget. */
    bool has_mtp;                 /* the checkpoint has the mtp.* tensors (one more KV layer) */
    uint64_t kv_cache_bytes;      /* fixed KV pool size (0 = what the budget leaves) */
    int kv_pool_windows;          /* cap the pool at this many full windows per sequence (0 = no cap) */
    int prefix_checkpoints;       /* prefix-cache checkpoints the engine keeps (0 = caching off) */
    bool cuda_gemm;               /* on a CUDA device without --batch-invariant: the fast GEMM's staging
                                     buffers (TD_CUDA_GEMM_BYTES), counted in runtime_bytes */
} td_plan_opts;

/* Defaults: NVFP4, auto KV, a 32 GB RTX 5090 (32,607 MiB as the driver
 * reports it), 0.90, auto window, depth 0, CUDA graphs on, vLLM's defaults
 * for a < 70 GiB card (256 sequences, 2,048 batched tokens), 16-token blocks,
 * and the calibrated runtime reserve (README). */
void td_plan_opts_default(td_plan_opts *o);

/* Everything a plan states, in bytes unless named otherwise. */
typedef struct td_plan {
    td_plan_weights w;
    uint64_t weights_bytes;          /* w.main + w.mtp + w.embed + w.lm_head */
    uint64_t activation_bytes;       /* act_tokens + act_logits + runtime */
    uint64_t act_tokens_bytes, act_logits_bytes, runtime_bytes;
    uint64_t graph_bytes;
    int n_graphs;                    /* captured batch sizes */
    int kv_dtype_bytes;
    uint64_t kv_bytes_per_token;     /* full-attention layers (+ MTP layers when depth > 0) */
    uint64_t linear_state_slot_bytes;/* DeltaNet state of one sequence, one position */
    uint64_t linear_state_bytes;     /* one request: slot x (1 + depth) */
    uint64_t budget_bytes;           /* device x utilization */
    int64_t available_kv_bytes;      /* budget - weights - activations - graphs (may be < 0) */
    int64_t max_model_len;           /* resolved window (auto -> largest that fits, 0 if none) */
    bool auto_len;
    int spec_depth;
    uint64_t request_bytes;          /* KV of one full window (whole blocks) + DeltaNet state */
    int64_t kv_tokens;               /* tokens the KV pool holds after one request's DeltaNet state */
    double max_concurrency;          /* available / request_bytes */
    bool fits;
    int64_t max_len_at_depth;        /* largest window at this depth (0: none) */
    int max_depth_at_len;            /* largest depth that fits this window (-1: none) */
    double util_needed;              /* utilization that fits this window at this depth (> 1: impossible) */
    int64_t max_len_by_depth[TD_PLAN_DEPTHS];
    /* CPU backend. There linear_state_bytes is the state of all max_num_seqs
     * sequences ((depth + 2) copies each: live + depth + 1 verify
     * checkpoints), available_kv_bytes is what is left for the pool after
     * it, request_bytes is the KV of one window (whole blocks, + 2 slots),
     * activation_bytes = scratch + sessions, runtime_bytes = f32 copies of
     * small weights. */
    uint64_t kv_bytes_per_block;
    int64_t kv_blocks;               /* blocks in the pool */
    uint64_t kv_pool_bytes;          /* the pool as td_kv_new allocates it */
    uint64_t scratch_bytes;          /* forward scratch at the largest batch */
    uint64_t session_bytes;          /* max_num_seqs sessions' buffers */
    uint64_t prefix_ckpt_bytes;      /* prefix_checkpoints full-window checkpoints */
    uint64_t needed_bytes;           /* everything but the pool + one window's KV */
    uint64_t total_bytes;            /* everything the engine allocates at the peak */
    char message[1024];              /* refusal (fits == false) or one-line summary */
} td_plan;

/* Computes the plan. Fails (TD_ERR_ARG) only on invalid options. */
int td_plan_compute(const td_config *cfg, const td_plan_opts *o, td_plan *out, td_err *err);

/* CPU mode of td_plan_compute (called by it when o->backend == TD_PLAN_CPU). */
int td_plan_compute_cpu(const td_config *cfg, const td_plan_opts *o, td_plan *out, td_err *err);

/* The formulas, exposed for tests and for the KV-cache allocator. */
void td_plan_weights_estimate(const td_config *cfg, td_quant q, td_plan_weights *out);
uint64_t td_plan_kv_bytes_per_token(const td_config *cfg, int spec_depth, td_kv_dtype kv);
uint64_t td_plan_linear_state_slot_bytes(const td_config *cfg);
/* Bytes one request of `len` tokens needs at `depth` (KV in whole blocks + DeltaNet state). */
uint64_t td_plan_request_bytes(const td_config *cfg, const td_plan_opts *o, int64_t len, int depth);
/* KV budget at `depth` (activations and graphs depend slightly on depth). */
int64_t td_plan_available_kv(const td_config *cfg, const td_plan_opts *o, int depth);
/* Largest window (multiple of the block size, <= max_position_embeddings) at `depth`; 0 if none. */
int64_t td_plan_max_len(const td_config *cfg, const td_plan_opts *o, int depth);

/* Measured weight bytes of a checkpoint directory by part (safetensors
 * headers only; model.visual.* skipped). TD_ERR_IO when it has no weights. */
int td_plan_weights_from_dir(const char *dir, td_plan_weights *out, td_err *err);
/* From <dir>/hf_quant_config.json or config.json's quantization_config:
 * the weight format and whether the checkpoint asks for an fp8 KV cache.
 * Leaves *q / *kv untouched when the directory says nothing. */
void td_plan_detect_quant(const char *dir, td_quant *q, td_kv_dtype *kv);

/* "130000", "130k" (x1000), "128K" (x1024), "1m" (x1e6), "1M" (x2^20):
 * vLLM's --max-model-len convention. -1 when invalid. */
int64_t td_plan_parse_tokens(const char *s);
/* "34359738368", "32GiB", "32607MiB", "32G" (= GiB), "34GB" (x1e9). 0 when invalid. */
uint64_t td_plan_parse_bytes(const char *s);

const char *td_quant_name(td_quant q);
const char *td_kv_dtype_name(td_kv_dtype k);

/* Reference measurement (reference notes §1): one RTX 5090 (32,607 MiB),
 * 22.15 GiB of weights incl. a 1.3 GiB MTP head, fp8 KV. Each scenario is
 * one setting and the verdict measured there. */
typedef struct td_plan_ref_scenario {
    double util;
    bool cuda_graphs;
    int64_t len;
    int depth;
    bool measured_fits;
    const char *source;
} td_plan_ref_scenario;
/* Number of scenarios; fills *out with a pointer to a constant table. */
int td_plan_reference_scenarios(const td_plan_ref_scenario **out);
/* Options of the reference setting for scenario s (cfg supplies embeddings/head sizes). */
void td_plan_reference_opts(const td_config *cfg, const td_plan_ref_scenario *s, td_plan_opts *o);
/* Whether cfg has the measured model's shape (Qwen3.6-27B: 64 layers, 16 full
 * attention, hidden 5120, vocab 248320): the replay means nothing for another. */
bool td_plan_reference_applies(const td_config *cfg);
/* Prints the comparison table; returns how many verdicts differ from the measurement. */
int td_plan_reference_report(const td_config *cfg, FILE *f);

#endif
