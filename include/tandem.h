/* tandem — inference engine for models with a built-in MTP draft head.
 *
 * Narrow public C API: engine (a loaded model), session (one sequence's state:
 * KV cache, DeltaNet state, MTP KV) and the tokenizer/template helpers.
 *
 * Ownership rules, for every function below:
 *  - Pointers passed IN are borrowed for the duration of the call only, unless
 *    the comment says otherwise.
 *  - Objects returned through `T **out` are owned by the caller and released
 *    with the matching td_*_free (free functions accept NULL).
 *  - Buffers returned through `const T *` pointers are owned by the object they
 *    came from and stay valid until the next call on that object or its free.
 *  - Errors: functions return TD_OK (0) or a negative td_status and, if `err`
 *    is not NULL, write a NUL-terminated message ("file:line: what") into it.
 *  - No process-wide mutable state: two engines in one process are independent.
 *    One engine may be used from one thread at a time; sessions belong to
 *    their engine.
 */
#ifndef TANDEM_H
#define TANDEM_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TD_OK = 0,
    TD_ERR_IO = -1,          /* file missing / unreadable / mmap failed */
    TD_ERR_FORMAT = -2,      /* malformed model file, header, config */
    TD_ERR_UNSUPPORTED = -3, /* valid input we do not support (model type, dtype) */
    TD_ERR_NOMEM = -4,
    TD_ERR_ARG = -5,         /* bad argument from the caller */
    TD_ERR_LIMIT = -6,       /* context / capacity exceeded */
    TD_ERR_INTERNAL = -7,
} td_status;

/* Caller-owned error buffer. */
typedef struct td_err {
    int code;
    char msg[1024];
} td_err;

typedef struct td_engine td_engine;
typedef struct td_session td_session;

/* ---- engine ---------------------------------------------------------- */

/* KV cache element type: one enum for the engine (td_engine_opts.kv_cache_dtype),
 * the memory planner and the backend's KV storage. AUTO is f32 on the CPU (the
 * planner's GPU rows: bf16); the storage never holds AUTO (resolved first).
 * FP8 is e4m3 with one f32 scale per (token, kv head). */
typedef enum { TD_KV_AUTO = 0, TD_KV_BF16 = 1, TD_KV_FP8 = 2, TD_KV_F32 = 3 } td_kv_dtype;

/* Matmul activation precision. F32 (default) is the reference the golden tests
 * check to 1e-5. BF16 rounds activations (and weights that are not exact in
 * BF16) to BF16 and uses the CPU's BF16 dot-product instructions (AVX-512
 * BF16): faster prefill, within the tolerance test_precision states. INT8
 * (with quantize q8 only) quantizes the activations of the q8 weights' matmuls
 * as the weights are (int8, an f32 scale per 32; the weights' are BF16) and sums each block's
 * products exactly in integers (AVX2 VPMADDUBSW, VNNI): W8A8 as llama.cpp's
 * Q8_0, faster decode, verify and prefill where there is no BF16 dot product;
 * other weights keep f32. All are batch-invariant, so greedy output at any
 * draft depth equals depth 0 within one precision. */
typedef enum { TD_PRECISION_F32 = 0, TD_PRECISION_BF16 = 1, TD_PRECISION_INT8 = 2 } td_precision;

typedef struct td_engine_opts {
    int n_threads;       /* 0 = all cores */
    int max_context;     /* per-session token capacity; 0 = model's max_position_embeddings, capped at 32768 */
    int spec_depth;      /* draft tokens per step kept as DeltaNet checkpoints (0 = off) */
    size_t kv_cache_bytes; /* paged KV cache size; 0 = room for max_seqs full windows */
    int max_seqs;        /* sequences expected at once, for the default KV size (0 = 4) */
    bool no_prefix_caching; /* do not keep prefix-cache checkpoints */
    int prefix_checkpoints; /* DeltaNet checkpoints kept for prefix hits (0 = 8 x max_seqs) */
    td_kv_dtype kv_cache_dtype; /* TD_KV_AUTO (f32 on CPU), TD_KV_BF16, TD_KV_FP8 (e4m3, per-token per-head scales), TD_KV_F32 */
    int quantize;        /* 0 = weights as stored; 1 = q8: F32/BF16/F16 linear weights to int8 with an F32
                            scale per 32 inputs, made at load (the engine owns the copies) */
    int max_prefill_chunk; /* prompt tokens one request prefills per step at most (0 = 256); set it to the
                              scheduler's max_num_batched_tokens so one chunk can use the whole budget */
    int deltanet_chunk;  /* 0 = prompt DeltaNet token by token (bit-exact across chunkings and prefix hits);
                            N > 1 = in chunks of N tokens (the chunked form: equal up to rounding) */
    int isa;             /* CPU kernels of this engine: 0 = the best the CPU has, 1 = portable C, 2 = AVX2,
                            3 = AVX-512 (TD_ERR_UNSUPPORTED when the CPU lacks it); all give the same
                            tokens, AVX2 and AVX-512 the same bits */
    int kernel_tune;     /* CPU kernels' tile shapes: 0 = this CPU's (AMD Zen 5+: 2), 1 = default (tuned on Intel),
                            2 = AMD (tuned on an EPYC Zen 5); the same bits whichever, only the speed differs */
    const char *backend; /* "cpu" (NULL: $TANDEM_BACKEND, else cpu) or "guard" (tests: the CPU ops with all
                            backend memory inaccessible to host code; see src/backend/README.md) */
    td_precision precision; /* matmul activations (TD_ERR_UNSUPPORTED when the backend cannot) */
    bool enforce_eager;  /* CUDA: issue every op of every forward (no CUDA graphs; as vLLM's --enforce-eager).
                            Default false: decode, draft and verify forwards are captured once per shape and
                            replayed. Same results either way; the CPU has no graphs. */
    bool batch_invariant; /* CUDA: every kernel keeps its fixed reduction order whatever the batch, so greedy
                            output at any draft depth equals depth 0 bit for bit (also when $TANDEM_BATCH_INVARIANT
                            is 1: the test suites). Default false: matmuls of more than 16 rows of BF16 weights
                            (128 of quantized ones: prefill, large batches) run on BF16 tensor cores through cuBLAS, within the tolerance test_cuda_fast
                            states; decode and verify rows keep the exact kernels. The CPU is batch-invariant
                            either way. */
    bool mmap_weights;   /* CPU: use the weights in place in the memory-mapped files (as llama.cpp by default).
                            Default false: at load, every tensor of 64 KiB or more is copied into transparent huge
                            pages when the kernel offers them (THP enabled "always" or "madvise"), and the files'
                            pages are released: fewer TLB misses per step (decode and verify 7-13% faster on the
                            27B-proportioned model), the same bits. With quantize nothing is copied: the int8
                            copies are made in huge pages themselves. */
} td_engine_opts;

/* KV cache figures (caller-owned copy). */
typedef struct td_kv_info {
    int block_size, n_blocks, free_blocks;
    int checkpoint_blocks;  /* held by prefix-cache checkpoints, given back when needed */
    size_t bytes_per_block, bytes_total;
    size_t deltanet_state_bytes; /* per sequence */
} td_kv_info;
void td_engine_kv_info(const td_engine *eng, td_kv_info *out);

/* What the engine holds now, in bytes (caller-owned copy): the figures the
 * memory planner (tandem plan --device cpu) predicts. */
typedef struct td_memory_info {
    size_t weights_mapped;     /* safetensors files, memory-mapped, less weights_copied */
    size_t weights_copied;     /* tensors copied into huge pages at load (td_engine_opts.mmap_weights off) */
    size_t weights_owned;      /* f32 copies of norms, conv1d, dt_bias, A (a generated model, td_engine_load_random: all its weights, in backend memory) */
    size_t kv_pool;            /* paged KV blocks + block tables + hash map */
    size_t prefix_checkpoints; /* DeltaNet states etc. held by prefix-cache checkpoints */
    size_t deltanet_state;     /* live sessions: state + verify checkpoints */
    size_t scratch;            /* forward buffers (grown to the largest batch so far) */
    size_t sessions;           /* live sessions: logits, hidden, pending rows, generation buffers, token tables */
    int n_sessions;
    size_t total;
} td_memory_info;
void td_engine_memory(const td_engine *eng, td_memory_info *out);

/* Loads a Hugging Face model directory (config.json, *.safetensors,
 * tokenizer.json if present). Weights are memory-mapped; on the CPU the
 * tensors of 64 KiB and more are then copied into transparent huge pages
 * unless opts->mmap_weights (see there). */
int td_engine_load(const char *model_dir, const td_engine_opts *opts, td_engine **out, td_err *err);
void td_engine_free(td_engine *eng);

typedef struct td_model_info {
    int vocab_size, hidden_size, n_layers, n_full_attn_layers, n_mtp_layers;
    int max_position_embeddings;
    int eos_token_ids[8], n_eos;   /* from config / generation_config */
    const char *model_type;        /* owned by the engine */
    const char *backend;           /* "cpu" or "guard" (static string) */
} td_model_info;
void td_engine_info(const td_engine *eng, td_model_info *out);

/* ---- session: one sequence --------------------------------------------- */

int td_session_new(td_engine *eng, td_session **out, td_err *err);
void td_session_free(td_session *s);
/* Number of tokens whose state the session holds. */
int td_session_len(const td_session *s);
/* Token ids held (length td_session_len); owned by the session. */
const int32_t *td_session_tokens(const td_session *s);
/* Forget everything (keeps allocations). */
void td_session_reset(td_session *s);

/* Feeds n tokens (prefill, or one decode step over several tokens) and
 * returns logits of the LAST token: vocab_size floats owned by the session,
 * valid until the next call on it. */
int td_session_feed(td_session *s, const int32_t *tokens, int n, const float **logits, td_err *err);

/* ---- sampling -------------------------------------------------------- */

typedef struct td_sampling {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint64_t seed;
    /* OpenAI logit_bias: added to the raw logits before every processor, at
     * every sampled and verified position (borrowed; td_sampler_init and
     * td_sched_submit copy it) */
    const struct td_logit_bias *logit_bias;
    int n_logit_bias;
} td_sampling;
typedef struct td_logit_bias { int32_t token; float bias; } td_logit_bias;
void td_sampling_default(td_sampling *p);

/* ---- generation with speculative decoding ------------------------------ */

#define TD_MAX_SPEC_DEPTH 16

/* A constraint on the output (structured outputs): the caller's grammar
 * matcher, borrowed by the generation until it ends. The generator asks for
 * the allowed tokens after the committed output plus up to TD_MAX_SPEC_DEPTH
 * speculative tokens (the drafts of one step), so drafts are proposed under
 * the mask and every verified position is checked under its own mask:
 * output at any depth equals the constrained output at depth 0. */
typedef struct td_constraint {
    /* Allowed next tokens after the committed tokens and spec[0..n): a bitmask
     * of ceil(vocab/32) words (token t: bit t%32 of word t/32), owned by the
     * constraint, valid until its next call. NULL when spec is no valid
     * continuation; an all-zero mask ends the generation (TD_FINISH_STOP). */
    const uint32_t *(*mask)(void *user, const int32_t *spec, int n);
    /* Commits a token that the mask allowed: 0 to go on, 1 when the grammar
     * is complete (the generation ends, TD_FINISH_STOP), negative on error
     * (it ends, TD_FINISH_CANCEL). */
    int (*accept)(void *user, int32_t tok);
    void *user;
} td_constraint;

typedef struct td_gen_opts {
    int max_tokens;          /* generated tokens at most (> 0) */
    int spec_depth;          /* MTP draft tokens per step; 0 = off; <= engine's spec_depth */
    bool draft_sampling;     /* sample drafts from the MTP distribution (keeps q) instead of argmax */
    bool spec_auto;          /* adaptive depth: spec_depth is the maximum, each step picks 0..spec_depth (spec/autodepth.h) */
    uint64_t spec_schedule_seed; /* test hook: non-zero = each step's depth is a hash of (seed, step) in 0..spec_depth */
    int joining;             /* with spec_auto: requests being admitted together with this one, after it (a
                                scheduler's queue), counted in the batch it judges whether drafting pays in */
    bool ignore_eos;
    const int32_t *stop_ids; /* extra token ids that end generation (borrowed) */
    int n_stop;
    const td_constraint *constraint; /* NULL = unconstrained (borrowed until the generation ends) */
    bool want_logits;        /* the emit callback gets each token's logits row (logprobs); otherwise it gets
                                NULL, and a plain greedy request (no penalties, bias or constraint) picks
                                its tokens on the backend: only token ids cross to the host */
} td_gen_opts;

/* Speculative decoding counters, named as vLLM's spec_decode metrics.
 * accepted_per_pos[i] counts drafts with at least i+1 accepted tokens. */
typedef struct td_spec_counters {
    uint64_t drafts, draft_tokens, accepted_tokens;
    uint64_t accepted_per_pos[TD_MAX_SPEC_DEPTH];
    uint64_t chosen_depth[TD_MAX_SPEC_DEPTH + 1]; /* decode steps run at each draft depth (0 = no draft) */
    uint64_t explored_steps; /* of those, steps `auto` ran at a depth other than its choice, to measure it (exploration bursts) */
    uint64_t tracked_steps;  /* decode steps that kept the MTP layer in step with the target (every step at a fixed
                                depth > 0; at `auto`, the steps of requests that can draft: their cost at depth 0) */
} td_spec_counters;
/* Adds c to *to, field by field (every counter is a sum). */
void td_spec_counters_add(td_spec_counters *to, const td_spec_counters *c);

typedef enum { TD_FINISH_NONE = 0, TD_FINISH_STOP, TD_FINISH_LENGTH, TD_FINISH_CANCEL } td_finish;

typedef struct td_gen_result {
    int n_prompt;            /* prompt tokens */
    int n_reused;            /* prompt tokens whose state the session already held */
    int n_generated;
    td_finish finish;
    int n_preemptions;       /* times the scheduler preempted it (KV pool full) */
    int n_resumed_reused;    /* tokens restored from the prefix cache when it resumed */
    int n_resumed_computed;  /* tokens prefilled again when it resumed (recompute cost) */
    double prefill_seconds, decode_seconds;
    td_spec_counters spec;
} td_gen_result;

/* Called for every generated token in order; return non-zero to stop
 * (finish = TD_FINISH_CANCEL, or STOP if the callback says so by returning 2). */
typedef int (*td_token_fn)(void *user, int32_t token);

/* Generates after `prompt`. If the session already holds a prefix of the
 * prompt (multi-turn), only the rest is computed. `res` is caller-owned. */
int td_session_generate(td_session *s, const int32_t *prompt, int n_prompt, const td_sampling *sampling,
                        const td_gen_opts *opts, td_token_fn fn, void *user, td_gen_result *res, td_err *err);

/* Totals over every generation on this engine (caller-owned copy). */
void td_engine_spec_counters(const td_engine *eng, td_spec_counters *out);

#ifdef __cplusplus
}
#endif
#endif
