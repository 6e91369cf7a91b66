/* Engine internals shared by the library's modules (spec/, sched/, server/). */
#ifndef TANDEM_ENGINE_ENGINE_H
#define TANDEM_ENGINE_ENGINE_H
#include "backend/backend.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model/seq.h"
#include "spec/autodepth.h"
#include "spec/mtp.h"
#include "tandem.h"

struct td_engine {
    td_engine_opts opts;
    td_model *model;
    td_backend *backend;
    td_fwd_ctx *fwd;
    int max_context;
    td_kv *kv;                    /* paged KV cache + prefix cache */
    td_spec_counters spec_totals; /* over every generation */
    td_ad_engine ad;              /* adaptive depth: step-cost table, engine-wide acceptance (spec/autodepth.h) */
    td_session *sessions;         /* live sessions, for td_engine_memory */
};

struct td_session {
    td_engine *eng;
    td_seq seq;
    float *logits;   /* [vocab] logits after the last fed token */
    float *hidden;   /* [H] scratch */
    td_mtp_track mtp; /* MTP bookkeeping (spec/mtp.h): only spec/mtp.c touches it */
    float *work;     /* host generation scratch (logits, probabilities), see spec/gen.c */
    size_t work_cap;
    float *dwork;    /* backend generation scratch (hidden rows), see spec/gen.c */
    size_t dwork_cap;
    td_session *prev, *next;  /* the engine's list of live sessions */
};


/* Shape of the paged KV cache for a config (one MTP layer when the model
 * has the head; AUTO stores f32), and the bytes one session
 * allocates besides its DeltaNet state: logits, hidden and pending rows and
 * the generation buffers at `depth`. Used by the engine and the planner. */
/* An engine whose model is generated in its backend's memory (td_model_random:
 * no weight files, no tokenizer) from the config at config_path (a config.json
 * or a model directory) as spec says: the benchmarks' test vehicle, e.g. a full
 * 27B config on a device. opts as td_engine_load (quantize must be 0: the spec
 * has the dtype; precision int8 needs a Q8 spec, whose weights are then
 * generated in the grouped order the int8 kernels read). *out is caller-owned (td_engine_free, which frees the
 * weights before the backend); on error *out is NULL and err says why (bad
 * spec or config, weights that do not fit the backend). */
int td_engine_load_random(const char *config_path, const td_random_spec *spec, const td_engine_opts *opts, td_engine **out,
                          td_err *err);

td_kv_shape td_engine_kv_shape_for(const td_config *c, bool has_mtp, td_kv_dtype kv_dtype);
size_t td_session_bytes_for(const td_config *c, int depth, int max_chunk);

/* What spec/, sched/, plan/ and bench/ read of an engine or a session. */
static inline const td_model *td_engine_model(const td_engine *e) { return e->model; }
static inline const td_config *td_engine_cfg(const td_engine *e) { return &e->model->cfg; }
static inline td_fwd_ctx *td_engine_fwd(const td_engine *e) { return e->fwd; }
static inline td_backend *td_engine_backend(const td_engine *e) { return e->backend; }
static inline td_kv *td_engine_kv(const td_engine *e) { return e->kv; }
static inline td_ad_engine *td_engine_ad(td_engine *e) { return &e->ad; }
static inline const td_engine_opts *td_engine_options(const td_engine *e) { return &e->opts; }
static inline int td_engine_max_ctx(const td_engine *e) { return e->max_context; }
static inline td_seq *td_session_seq(td_session *s) { return &s->seq; }
static inline td_engine *td_session_engine(const td_session *s) { return s->eng; }
/* Adds one generation's counters to the engine totals (td_engine_spec_counters). */
void td_engine_add_spec(td_engine *e, const td_spec_counters *c);
static inline float *td_session_logits(td_session *s) { return s->logits; }
/* The session's generation scratch, grown to host_floats (host) and
 * dev_floats (backend) floats; valid until the next call. */
int td_session_work(td_session *s, size_t host_floats, size_t dev_floats, float **host, float **dev, td_err *err);
#endif
