/* The request-path harnesses' server (fuzz_oai_req, fuzz_api): a srv with
 * the real Qwen3 tokenizer, its template and the Qwen3.5 template, metrics,
 * locks and structured outputs, but no engine or scheduler (the harness
 * calls the scheduler callbacks itself). Not a library API. */
#ifndef TANDEM_FUZZ_SRV_H
#define TANDEM_FUZZ_SRV_H
#include <jansson.h>
#include "fuzz_util.h"
#include "server/srv_internal.h"

/* tpls[0]: the tokenizer's chat template, tpls[1]: qwen3.5.jinja. */
static inline void fuzz_srv_init(srv *s, tpl *tpls[2], int n_ctx, const char *who) {
    char d[4096], p[4096];
    td_err err = {0};
    fuzz_path(d, sizeof d, "tests/data/qwen3-tokenizer");
    if (td_tok_load(d, &s->tok, &err)) { fprintf(stderr, "%s: %s\n", who, err.msg); abort(); }
    const char *ct = td_tok_chat_template(s->tok);
    if (!ct || td_tpl_parse(ct, strlen(ct), &tpls[0], &err)) { fprintf(stderr, "%s: template: %s\n", who, err.msg); abort(); }
    fuzz_path(p, sizeof p, "tests/data/chat-templates/qwen3.5.jinja");
    FILE *f = fopen(p, "rb");
    if (!f) abort();
    static char src[1 << 16];
    size_t n = fread(src, 1, sizeof src, f);
    fclose(f);
    if (td_tpl_parse(src, n, &tpls[1], &err)) { fprintf(stderr, "%s: %s\n", who, err.msg); abort(); }
    td_metrics_init(&s->metrics);
    pthread_mutex_init(&s->jobs_mu, NULL);
    pthread_cond_init(&s->jobs_cv, NULL);
    pthread_rwlock_init(&s->sched_lock, NULL);
    s->model_name = "tandem";
    s->model_dir = strdup(d);
    s->n_ctx = n_ctx;
    s->vocab = td_tok_vocab_size(s->tok);
    s->cfg.quiet = true;
    s->bos = td_tok_bos_token(s->tok) ? strdup(td_tok_bos_token(s->tok)) : NULL;
    s->eos = td_tok_eos_token(s->tok) ? strdup(td_tok_eos_token(s->tok)) : NULL;
    td_sampling_default(&s->cfg.sampling);
    if (td_so_init(s, &err)) { fprintf(stderr, "%s: structured outputs: %s\n", who, err.msg); abort(); }
}

static inline void check_err(const http_err *e) {
    FUZZ_ASSERT(e->status >= 400 && e->status < 600 && e->msg[0], "error %d without a message", e->status);
}
#endif
