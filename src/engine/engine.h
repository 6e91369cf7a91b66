/* Engine internals shared by the library's modules (spec/, sched/, server/). */
#ifndef TANDEM_ENGINE_ENGINE_H
#define TANDEM_ENGINE_ENGINE_H
#include "backend/backend.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/seq.h"
#include "tandem.h"

struct td_engine {
    td_engine_opts opts;
    td_model *model;
    td_backend *backend;
    td_fwd_ctx *fwd;
    int max_context;
    td_kv *kv;                    /* paged KV cache + prefix cache */
    td_spec_counters spec_totals; /* over every generation */
};

struct td_session {
    td_engine *eng;
    td_seq seq;
    float *logits;   /* [vocab] logits after the last fed token */
    float *hidden;   /* [H] scratch */
    /* MTP tracking: target hidden states of positions seq.mtp_n .. n_past-1
     * whose MTP entries are not written yet (they need the next token). */
    bool mtp_ok;     /* pend describes the state above */
    float *pend;     /* [pend_cap][H] */
    int pend_cap;
    float *work;     /* generation scratch, see spec/generate.c */
    size_t work_cap;
};
#endif
