/* Engine internals shared by the library's modules (spec/, sched/, server/). */
#ifndef TANDEM_ENGINE_ENGINE_H
#define TANDEM_ENGINE_ENGINE_H
#include "backend/backend.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/seq.h"
#include "spec/autodepth.h"
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
    /* MTP tracking: target hidden states of positions seq.mtp_n .. n_past-1
     * whose MTP entries are not written yet (they need the next token). */
    bool mtp_ok;     /* pend describes the state above */
    float *pend;     /* backend [pend_cap][H] */
    int pend_cap;
    float *work;     /* host generation scratch (logits, probabilities), see spec/gen.c */
    size_t work_cap;
    float *dwork;    /* backend generation scratch (hidden rows), see spec/gen.c */
    size_t dwork_cap;
    td_session *prev, *next;  /* the engine's list of live sessions */
};

/* Pending hidden rows a session keeps for the MTP head. */
#define TD_SESSION_PEND_CAP (TD_MAX_SPEC_DEPTH + 4)

/* Shape of the paged KV cache for a config (one MTP layer when the model
 * has the head; kv_dtype 0 f32, 1 bf16, 2 fp8), and the bytes one session
 * allocates besides its DeltaNet state: logits, hidden and pending rows and
 * the generation buffers at `depth`. Used by the engine and the planner. */
td_kv_shape td_engine_kv_shape_for(const td_config *c, bool has_mtp, int kv_dtype);
size_t td_session_bytes_for(const td_config *c, int depth, int max_chunk);
#endif
