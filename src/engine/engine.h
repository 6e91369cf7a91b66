/* Engine internals shared by the library's modules (spec/, sched/, server/). */
#ifndef TANDEM_ENGINE_ENGINE_H
#define TANDEM_ENGINE_ENGINE_H
#include "backend/backend.h"
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
};

struct td_session {
    td_engine *eng;
    td_seq seq;
    float *logits;   /* [vocab] logits after the last fed token */
    float *hidden;   /* [H] final-normed hidden state of the last fed token */
};
#endif
