#include "engine/engine.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "spec/gen.h"
#include "model/quant.h"
#include "util/err.h"
#include "backend/cpu/kernels.h"

td_kv_shape td_engine_kv_shape_for(const td_config *c, bool has_mtp, td_kv_dtype kv_dtype) {
    td_kv_shape ks = {.n_layers = c->n_full_attn + (has_mtp ? 1 : 0), .kv_dim = c->n_kv_heads * c->head_dim,
                      .head_dim = c->head_dim, .store = kv_dtype == TD_KV_AUTO ? TD_KV_F32 : kv_dtype,
                      .state_floats = td_cfg_deltanet_state_floats(c),
                      .hidden = c->hidden_size};
    if (ks.n_layers == 0) ks.n_layers = 1;
    return ks;
}

static td_kv_shape kv_shape(const td_engine *e) {
    return td_engine_kv_shape_for(&e->model->cfg, e->model->has_mtp, e->opts.kv_cache_dtype);
}

size_t td_session_bytes_for(const td_config *c, int depth, int max_chunk) {
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden_size;
    return sizeof(td_session) + (V + H) * sizeof(float) + td_mtp_track_bytes_for(c->hidden_size) +
           td_gen_work_bytes_for(c, depth, TD_MTP_PEND_CAP, max_chunk);
}

/* The backend of e->opts: created, its ISA and precision set. q8: the model's linear weights will be q8
   (--quantize q8, or a random model generated in q8). */
static int setup_backend(td_engine *e, bool q8, td_err *err) {
    int rc;
    int threads = e->opts.n_threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    const char *bname = e->opts.backend ? e->opts.backend : getenv("TANDEM_BACKEND"); /* the env: tests run on the guard */
    if ((rc = td_backend_create(bname, threads, &e->backend, err))) goto fail;
    if (e->opts.isa < 0 || e->opts.isa > 3) {
        rc = TD_FAIL(err, TD_ERR_ARG, "isa %d (0 best, 1 c, 2 avx2, 3 avx512)", e->opts.isa);
        goto fail;
    }
    if (e->opts.isa) {
        td_isa want = (td_isa)(e->opts.isa - 1);
        if (!td_kernels_have_isa(want)) {
            rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "this CPU has no %s (best %s)", td_isa_name(want), td_isa_name(td_kernels_best_isa()));
            goto fail;
        }
        e->backend->isa = (int)want;
    }
    if (e->opts.kernel_tune < 0 || e->opts.kernel_tune > TD_TUNE_COUNT) {
        rc = TD_FAIL(err, TD_ERR_ARG, "kernel_tune %d (0 this CPU's, 1 default, 2 amd)", e->opts.kernel_tune);
        goto fail;
    }
    if (e->opts.kernel_tune) e->backend->tune = e->opts.kernel_tune - 1;
    if (e->opts.precision != TD_PRECISION_F32 && e->opts.precision != TD_PRECISION_BF16 && e->opts.precision != TD_PRECISION_INT8) {
        rc = TD_FAIL(err, TD_ERR_ARG, "precision %d (0 f32, 1 bf16, 2 int8)", (int)e->opts.precision);
        goto fail;
    }
    if (e->opts.precision == TD_PRECISION_INT8 && !q8) {
        rc = TD_FAIL(err, TD_ERR_ARG, "--precision int8 needs --quantize q8 (it multiplies the q8 weights by int8 activations)");
        goto fail;
    }
    if (e->opts.precision == TD_PRECISION_INT8 && strcmp(e->backend->ops->name, "cpu") && strcmp(e->backend->ops->name, "guard")) {
        rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "--precision int8 runs on the CPU backend only (this one: %s)", e->backend->ops->name);
        goto fail;
    }
    if (e->opts.precision == TD_PRECISION_BF16 && (e->backend->isa != TD_ISA_AVX512 || !td_kernels_have_bf16())) {
        rc = TD_FAIL(err, TD_ERR_UNSUPPORTED, "--precision bf16 needs AVX-512 BF16 (this CPU: %s%s; kernels %s)",
                     td_isa_name(td_kernels_best_isa()), td_kernels_best_isa() == TD_ISA_AVX512 ? " without BF16" : "",
                     td_isa_name((td_isa)e->backend->isa));
        goto fail;
    }
    e->backend->precision = (int)e->opts.precision;
    e->backend->copy_weights = !e->opts.mmap_weights && !e->opts.quantize;
    const char *bi = getenv("TANDEM_BATCH_INVARIANT"); /* the env: the suites' exact checks on a device */
    e->backend->batch_invariant = e->opts.batch_invariant || (bi && !strcmp(bi, "1"));
    return TD_OK;
fail:
    return rc;
}

/* Everything after the model and the backend: forward context, limits, KV cache. */
static int finish_load(td_engine *e, td_err *err) {
    int rc;
    if ((rc = td_fwd_ctx_new(e->model, e->backend, &e->fwd, err))) goto fail;
    if (e->opts.deltanet_chunk < 0 || e->opts.deltanet_chunk > 256) {
        rc = TD_FAIL(err, TD_ERR_ARG, "deltanet_chunk %d (0 = off, up to 256 tokens)", e->opts.deltanet_chunk);
        goto fail;
    }
    td_fwd_set_deltanet_chunk(e->fwd, e->opts.deltanet_chunk);
    td_fwd_set_eager(e->fwd, e->opts.enforce_eager);
    int maxc = e->opts.max_context;
    if (maxc <= 0) maxc = e->model->cfg.max_position_embeddings < 32768 ? e->model->cfg.max_position_embeddings : 32768;
    if (maxc > e->model->cfg.max_position_embeddings) maxc = e->model->cfg.max_position_embeddings;
    e->max_context = maxc;
    td_ad_engine_init(&e->ad);
    if (e->opts.spec_depth < 0 || e->opts.spec_depth > 64) {
        rc = TD_FAIL(err, TD_ERR_ARG, "spec depth %d out of range 0..64", e->opts.spec_depth);
        goto fail;
    }
    /* paged KV cache */
    if ((int)e->opts.kv_cache_dtype < 0 || (int)e->opts.kv_cache_dtype > 3) {
        rc = TD_FAIL(err, TD_ERR_ARG, "kv_cache_dtype %d (0 auto, 1 bf16, 2 fp8, 3 f32)", (int)e->opts.kv_cache_dtype);
        goto fail;
    }
    td_kv_shape ks = kv_shape(e);
    int seqs = e->opts.max_seqs > 0 ? e->opts.max_seqs : 4;
    size_t per_block = td_kv_bytes_per_block(&ks);
    long n_blocks = e->opts.kv_cache_bytes ? (long)(e->opts.kv_cache_bytes / per_block)
                                           : (long)seqs * ((maxc + 1 + TD_KV_BLOCK - 1) / TD_KV_BLOCK + 1);
    if (n_blocks < 2 || n_blocks > (1L << 30)) {
        rc = TD_FAIL(err, TD_ERR_ARG, "KV cache of %zu bytes holds %ld blocks of %d tokens (%zu bytes each): too small", e->opts.kv_cache_bytes,
                     n_blocks, TD_KV_BLOCK, per_block);
        goto fail;
    }
    int n_ckpt = e->opts.no_prefix_caching ? 0 : e->opts.prefix_checkpoints > 0 ? e->opts.prefix_checkpoints : 8 * seqs;
    if ((rc = td_kv_new(&ks, (int)n_blocks, n_ckpt, e->backend, &e->kv, err))) goto fail;
    return TD_OK;
fail:
    return rc;
}

int td_engine_load(const char *model_dir, const td_engine_opts *opts, td_engine **out, td_err *err) {
    *out = NULL;
    td_engine *e = TD_CALLOC(err, 1, sizeof *e);
    if (!e) return TD_ERR_NOMEM;
    if (opts) e->opts = *opts;
    int rc = td_model_load(model_dir, &e->model, err);
    if (rc) goto fail;
    if (e->opts.quantize < 0 || e->opts.quantize > 1) {
        rc = TD_FAIL(err, TD_ERR_ARG, "quantize %d (0 none, 1 q8)", e->opts.quantize);
        goto fail;
    }
    if ((rc = td_model_quantize(e->model, (td_quant_kind)e->opts.quantize, e->opts.precision == TD_PRECISION_INT8, err))) goto fail;
    if ((rc = setup_backend(e, e->opts.quantize == TD_QUANT_Q8, err)) || (rc = finish_load(e, err))) goto fail;
    if (e->backend->counters.weight_copy_bytes) td_weights_release_pages(e->model->weights);
    *out = e;
    return TD_OK;
fail:
    td_engine_free(e);
    return rc;
}

int td_engine_load_random(const char *config_path, const td_random_spec *spec, const td_engine_opts *opts, td_engine **out,
                          td_err *err) {
    *out = NULL;
    td_engine *e = TD_CALLOC(err, 1, sizeof *e);
    if (!e) return TD_ERR_NOMEM;
    if (opts) e->opts = *opts;
    td_config cfg;
    int rc;
    if (e->opts.quantize) {
        rc = TD_FAIL(err, TD_ERR_ARG, "a random model is generated in its dtype: no quantize (use the spec's dtype)");
        goto fail;
    }
    td_random_spec rs = *spec;
    rs.q8_grouped = e->opts.precision == TD_PRECISION_INT8; /* the int8 kernels' order (setup_backend: a Q8 spec) */
    if ((rc = td_config_load(config_path, &cfg, err)) || (rc = setup_backend(e, spec->dtype == TD_DTYPE_Q8, err))) goto fail;
    if ((rc = td_model_random(&cfg, &rs, e->backend, &e->model, err)) || (rc = finish_load(e, err))) goto fail;
    *out = e;
    return TD_OK;
fail:
    td_engine_free(e);
    return rc;
}

void td_engine_free(td_engine *e) {
    if (!e) return;
    td_kv_free(e->kv);
    td_fwd_ctx_free(e->fwd);
    td_model_free(e->model); /* before the backend: a generated model's weights live there */
    td_backend_free(e->backend);
    free(e);
}

void td_engine_info(const td_engine *e, td_model_info *o) {
    const td_config *c = &e->model->cfg;
    memset(o, 0, sizeof *o);
    o->vocab_size = c->vocab_size;
    o->hidden_size = c->hidden_size;
    o->n_layers = c->n_layers;
    o->n_full_attn_layers = c->n_full_attn;
    o->n_mtp_layers = e->model->has_mtp ? c->mtp_layers : 0;
    o->max_position_embeddings = e->max_context;
    o->n_eos = c->n_eos;
    memcpy(o->eos_token_ids, c->eos_token_ids, sizeof o->eos_token_ids);
    o->model_type = c->model_type;
    o->backend = e->backend->ops->name;
}

int td_session_new(td_engine *eng, td_session **out, td_err *err) {
    *out = NULL;
    td_session *s = TD_CALLOC(err, 1, sizeof *s);
    if (!s) return TD_ERR_NOMEM;
    s->eng = eng;
    const td_config *c = &eng->model->cfg;
    int rc = td_seq_init(&s->seq, eng->model, eng->kv, eng->max_context, eng->opts.spec_depth + 1, err);
    if (rc) { free(s); return rc; }
    s->logits = TD_CALLOC(err, (size_t)c->vocab_size, sizeof(float));
    s->hidden = TD_CALLOC(err, (size_t)c->hidden_size, sizeof(float));
    if (!s->logits || !s->hidden) { td_session_free(s); return TD_ERR_NOMEM; }
    if ((rc = td_mtp_track_init(&s->mtp, eng->backend, c->hidden_size, err))) { td_session_free(s); return rc; }
    s->next = eng->sessions;
    if (eng->sessions) eng->sessions->prev = s;
    eng->sessions = s;
    *out = s;
    return TD_OK;
}

void td_session_free(td_session *s) {
    if (!s) return;
    if (s->prev) s->prev->next = s->next;
    else if (s->eng->sessions == s) s->eng->sessions = s->next;
    if (s->next) s->next->prev = s->prev;
    td_seq_free(&s->seq);
    free(s->logits);
    free(s->hidden);
    td_mtp_track_free(&s->mtp, s->eng->backend);
    s->eng->backend->ops->free(s->eng->backend, s->dwork);
    free(s->work);
    free(s);
}

int td_session_work(td_session *s, size_t host_floats, size_t dev_floats, float **host, float **dev, td_err *err) {
    if (host_floats > s->work_cap) {
        free(s->work);
        s->work = malloc(host_floats * sizeof(float));
        s->work_cap = s->work ? host_floats : 0;
        if (!s->work) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for generation buffers");
    }
    td_backend *b = s->eng->backend;
    if (dev_floats > s->dwork_cap) {
        b->ops->free(b, s->dwork);
        s->dwork = b->ops->alloc(b, dev_floats * sizeof(float));
        s->dwork_cap = s->dwork ? dev_floats : 0;
        if (!s->dwork) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory for generation buffers");
    }
    *host = s->work;
    *dev = s->dwork;
    return TD_OK;
}

int td_session_len(const td_session *s) { return s->seq.n_past; }
const int32_t *td_session_tokens(const td_session *s) { return s->seq.tokens; }
void td_session_reset(td_session *s) {
    td_seq_reset(&s->seq);
    td_mtp_lost(s);
}

void td_engine_kv_info(const td_engine *e, td_kv_info *o) {
    const td_config *c = &e->model->cfg;
    td_kv_shape ks = kv_shape(e);
    o->block_size = TD_KV_BLOCK;
    o->n_blocks = td_kv_n_blocks(e->kv);
    o->free_blocks = td_kv_free_blocks(e->kv);
    o->checkpoint_blocks = td_kv_checkpoint_blocks(e->kv);
    o->bytes_per_block = td_kv_bytes_per_block(&ks);
    o->bytes_total = o->bytes_per_block * (size_t)o->n_blocks;
    o->deltanet_state_bytes = td_cfg_deltanet_state_floats(c) * sizeof(float);
}

void td_engine_memory(const td_engine *e, td_memory_info *o) {
    memset(o, 0, sizeof *o);
    const td_weights *w = e->model->weights;
    for (int i = 0; w && i < w->n_files; i++) o->weights_mapped += w->files[i].size;
    o->weights_copied = (size_t)e->backend->counters.weight_copy_bytes; /* their file pages released (td_weights_release_pages) */
    o->weights_mapped -= o->weights_copied < o->weights_mapped ? o->weights_copied : o->weights_mapped;
    o->weights_owned = e->model->owned_bytes + e->model->dev_bytes; /* dev_bytes: a generated model's weights */
    o->kv_pool = td_kv_pool_bytes(e->kv);
    o->prefix_checkpoints = td_kv_ckpt_bytes(e->kv);
    o->scratch = td_fwd_scratch_bytes(e->fwd);
    for (const td_session *s = e->sessions; s; s = s->next) {
        o->n_sessions++;
        size_t seq = td_seq_bytes(&s->seq), state = td_seq_state_bytes_for(&e->model->cfg, s->seq.n_ckpt_slots);
        o->deltanet_state += state;
        o->sessions += sizeof *s + seq - state + ((size_t)e->model->cfg.vocab_size + (size_t)e->model->cfg.hidden_size) * sizeof(float) +
                       td_mtp_track_bytes_for(e->model->cfg.hidden_size) +
                       (s->work_cap + s->dwork_cap) * sizeof(float);
    }
    o->total = o->weights_mapped + o->weights_copied + o->weights_owned + o->kv_pool + o->prefix_checkpoints + o->scratch + o->deltanet_state + o->sessions;
}

void td_engine_spec_counters(const td_engine *e, td_spec_counters *out) { *out = e->spec_totals; }

void td_spec_counters_add(td_spec_counters *to, const td_spec_counters *c) {
    to->drafts += c->drafts;
    to->draft_tokens += c->draft_tokens;
    to->accepted_tokens += c->accepted_tokens;
    for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) to->accepted_per_pos[i] += c->accepted_per_pos[i];
    for (int i = 0; i <= TD_MAX_SPEC_DEPTH; i++) to->chosen_depth[i] += c->chosen_depth[i];
    to->explored_steps += c->explored_steps;
    to->tracked_steps += c->tracked_steps;
}

void td_engine_add_spec(td_engine *e, const td_spec_counters *c) { td_spec_counters_add(&e->spec_totals, c); }

int td_session_feed(td_session *s, const int32_t *tokens, int n, const float **logits, td_err *err) {
    if (n <= 0) return TD_FAIL(err, TD_ERR_ARG, "feed of %d tokens", n);
    td_fwd_item it = {.seq = &s->seq, .tokens = tokens, .n = n, .logits_rows = 1, .logits = s->logits};
    td_mtp_lost(s); /* no hidden states kept: MTP history is lost */
    int rc = td_forward(s->eng->fwd, &it, 1, err);
    if (rc) return rc;
    if (logits) *logits = s->logits;
    return TD_OK;
}
