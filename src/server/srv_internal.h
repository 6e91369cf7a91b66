/* Internals shared by the server's files (not a public API).
 *
 *   http.c      daemon, routing, auth, bodies, errors, suspend/resume,
 *               disconnect watchdog
 *   endpoints.c /v1/models, /health, /metrics, /tokenize, /detokenize,
 *               and the generation handlers (prompt, submit)
 *   oai_req.c   OpenAI request parsing and validation, chat messages
 *   gen.c       one generation: scheduler callbacks, detokenize, stop
 *               strings, reasoning/tool parsing, SSE chunks, final JSON
 *   chat_parse.c incremental parsers (pure)
 *   metrics.c   Prometheus text
 */
#ifndef TANDEM_SERVER_INTERNAL_H
#define TANDEM_SERVER_INTERNAL_H
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include "server/chat_parse.h"
#include "server/metrics.h"
#include "server/sbuf.h"
#include "server/server.h"
#include "template/template.h"
#include "grammar/grammar.h"

typedef struct job job;
typedef struct task task;
typedef struct so_cache so_cache;       /* structured.c */
typedef struct so_grammar so_grammar;
typedef struct job_group job_group;

struct srv {
    srv_config cfg;
    char *host, *api_key, *model_name, *model_dir; /* owned copies */
    struct MHD_Daemon *daemon;
    int port;
    double t_start;
    srv_metrics metrics;
    _Atomic uint64_t next_id;       /* request ids, seeds */
    uint64_t id_base;
    /* model: set once by td_srv_set_model */
    _Atomic int ready;              /* 0 loading, 1 serving, 2 draining */
    tokenizer *tok;
    td_engine *eng;
    tpl *chat_tpl;                  /* NULL: the model has no chat template */
    char *bos, *eos;                /* template special tokens */
    int n_ctx, vocab;
    so_cache *so;                   /* compiled grammars + the grammar vocabulary (structured.c) */
    /* scheduler: read under rdlock (submit, cancel, stats), cleared under wrlock */
    pthread_rwlock_t sched_lock;
    td_sched *sched;
    /* jobs with a live connection, for the disconnect watchdog */
    pthread_mutex_t jobs_mu;
    pthread_cond_t jobs_cv;
    job *jobs;                      /* doubly linked */
    int n_active;                   /* submitted and not finished */
    int n_open;                     /* jobs not yet freed */
    pthread_t watchdog;
    bool watchdog_started, stopping;
    /* prompt workers: request parsing, template rendering and tokenization
     * run here, not on libmicrohttpd's polling threads */
    pthread_mutex_t tasks_mu;
    pthread_cond_t tasks_cv;
    task *tasks_head, *tasks_tail;
    pthread_t *workers;
    int n_workers;
    bool workers_stop;
    struct resp_store *rstore;      /* stored Responses (api_responses.c), created on first use */
};

/* An error answered before any response started. */
typedef struct http_err {
    int status;                     /* 0: none */
    const char *type;               /* OpenAI error type */
    char msg[512];
    const char *param;
    int n_prompt, n_ctx;            /* context overflow details when n_ctx > 0 */
    bool retry_after;               /* 503 queue full */
    const char *allow;              /* 405: the Allow header */
} http_err;
/* A message cut by the buffer loses its partial last UTF-8 character. */
void td_http_err_set(http_err *e, int status, const char *type, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Copies in to out (cap bytes, NUL included) as valid UTF-8: an invalid
 * byte becomes the text \xNN; stops at a character boundary. Returns the length. */
size_t td_srv_utf8_clean(const char *in, char *out, size_t cap);

/* Work handed from a polling thread to a prompt worker (http.c), the
 * connection suspended meanwhile. */
enum { TASK_GENERATE = 1, TASK_TOKENIZE, TASK_DETOKENIZE, TASK_COUNT_TOKENS };
/* The API a request speaks: its body is translated to a chat request and its
 * output written back in that form (api_common.c). */
enum { DIALECT_CHAT = 0, DIALECT_RESPONSES, DIALECT_ANTHROPIC };
typedef struct api_state api_state;
struct task {
    srv *srv;
    struct MHD_Connection *conn;
    int what, kind;                 /* TASK_*, OAI_* for TASK_GENERATE */
    int dialect;                    /* DIALECT_* */
    int fd;
    bool http11;
    char *body;                     /* owned */
    size_t len;
    /* result */
    bool done;                      /* under srv->tasks_mu */
    http_err e;                     /* e.status: answer this error */
    int status;                     /* else this JSON, or the job */
    char *reply;
    job *job;                       /* submitted; the connection context's reference */
    task *next;
};
/* ---- requests (oai_req.c) ---- */
enum { OAI_CHAT = 1, OAI_COMPLETION };

typedef struct oai_req {
    int kind;
    bool stream, include_usage;
    int max_tokens;                 /* -1: unset */
    td_sampling sampling;
    bool seed_set;
    char *stops[STOP_MAX];
    int n_stops;
    bool include_stop;
    int32_t stop_ids[65];           /* + the tokenizer's EOS */
    int n_stop_ids;
    bool ignore_eos, skip_special;
    bool tokens_as_ids;             /* vLLM return_tokens_as_token_ids */
    int spec_depth;                 /* tandem extension num_speculative_tokens: -1 = the server's */
    int logprobs;                   /* -1 none, else number of alternatives */
    bool echo;
    int n;                          /* choices per prompt, 1..SRV_MAX_N (group.c) */
    td_logit_bias *logit_bias;      /* owned; sampling.logit_bias points here */
    bool no_parallel_tools;         /* parallel_tool_calls: false: at most one tool call */
    bool continue_final;            /* continue_final_message: the last assistant message is continued */
    /* structured outputs (structured.c) */
    int so_kind;                    /* SO_NONE, SO_TEXT (response_format etc.), SO_TOOLS (tool_choice required), SO_TOOL (named) */
    so_grammar *so_g;               /* the compiled grammar (a cache reference) */
    char so_tool[128];              /* SO_TOOL: the function's name */
    /* chat */
    json_t *messages;               /* normalized copy (owned) */
    json_t *tools;                  /* owned ref or NULL */
    json_t *kwargs;                 /* template kwargs (owned) */
    bool add_generation_prompt, parse_tools, thinking;
    /* completions */
    char *prompt_text;              /* owned, or NULL when ids given */
    int32_t *prompt_ids;            /* owned */
    size_t n_prompt_ids;
    json_t *prompt_list;            /* a list of more than one prompt (owned): prompt_text /
                                       prompt_ids hold the first, group.c the others */
} oai_req;

/* n > 1 and list prompts: choices per prompt, and in all (each choice is a
 * scheduler request; a request that could never fit the queue is a 400). */
#define SRV_MAX_N 16
#define SRV_MAX_CHOICES 128

int td_oai_parse(srv *s, const json_t *body, int kind, oai_req *r, http_err *e);
void td_oai_req_free(oai_req *r);
/* Messages/tools/kwargs validation shared with /tokenize. */
int td_oai_chat_fields(const json_t *body, oai_req *r, http_err *e);
/* Renders the chat template; *text malloc'd. */
int td_oai_render_chat(srv *s, const oai_req *r, char **text, size_t *len, http_err *e);
/* Token text for logprobs (sanitized UTF-8, malloc'd). */
char *td_oai_token_text(srv *s, int32_t id);

/* ---- generation (gen.c) ---- */
struct job {
    srv *srv;
    pthread_mutex_t mu;
    int refs;
    job *prev, *next;               /* srv->jobs, under jobs_mu */
    /* under jobs_mu, and kept apart from the flags under mu: the compiler may read a
     * word of adjacent flags at once (ThreadSanitizer reported the mixed word) */
    bool listed, counted_active;
    struct MHD_Connection *conn;
    int fd;                         /* client socket, for the watchdog */
    bool http11;                    /* may get an interim 100 response (disconnect probe) */
    bool probed;                    /* the probe was sent */
    bool overflow;                  /* stream cancelled: the client read too slowly */
    oai_req req;
    int n_prompt, n_ctx;
    uint64_t sched_id;
    bool submitted, suspended, finished, conn_gone, cancel_sent, out_done;
    char id[64];
    long long created;
    double t_arrival, t_first, t_last;
    double t_keepalive;             /* last empty chunk sent while waiting for the first token */
    /* output path */
    tok_stream ts;
    stop_matcher stop;
    chat_parser cp;
    bool use_cp;
    sbuf scratch;                   /* text out of the stop matcher */
    /* stream */
    sbuf out;                       /* SSE bytes to send */
    size_t out_sent;
    int dkind;                      /* pending delta: 0, CP_REASONING, CP_CONTENT, CP_TOOL_ARGS */
    int dindex;
    sbuf dtext;
    json_t *lp_pending;             /* logprob entries not yet sent (array) */
    /* non-stream */
    sbuf content, reasoning;
    json_t *calls;                  /* [{id,type,function:{name,arguments}}] */
    sbuf *cargs;                    /* arguments text per call */
    int cargs_cap;
    json_t *lp_all;                 /* all logprob entries */
    int n_calls;
    size_t text_offset;             /* completions logprobs text_offset */
    /* result */
    td_gen_result res;
    /* structured outputs (structured.c; scheduler thread only) */
    td_matcher *so_m;
    td_constraint so_cons;
    bool so_gate;                   /* output still inside <think>: unconstrained until so_think_end */
    int32_t so_think_end;
    uint32_t *so_all;               /* all-allowed mask for the gate */
    uint32_t *so_noend;             /* ignore_eos: the mask without end ids (scratch) */
    char error[512];
    char *body;                     /* non-stream: final JSON */
    int body_status;
    /* n > 1 and list prompts (group.c): one connection, one job per choice.
     * The lead (choice 0) holds the connection and the group; the others
     * ("followers") pass their SSE bytes and results to it. */
    int choice_index;
    job_group *group;               /* the lead's (owned); NULL otherwise */
    job *lead;                      /* a follower's lead; NULL for the lead and single jobs */
    bool fan_pending;               /* first sample of a prompt: submit the others at its first token */
    json_t *gchoice;                /* non-stream: this choice's object, for the lead */
    /* invalid tool-call arguments fall back to content (gen.c) */
    sbuf raw;                       /* the chat parser's input, when tools are parsed */
    bool tc_hold;                   /* stream: events since the first tool call held (in content/calls/cargs) */
    size_t content_sent;            /* stream: content bytes sent */
    /* /v1/responses and /v1/messages: output in that dialect (api_common.c) */
    int dialect;                    /* DIALECT_*; 0: chat / completions */
    api_state *api;                 /* owned */
};

/* Creates a job for a parsed request (takes over r); refs = 1. */
job *td_job_new(srv *s, oai_req *r, int n_prompt, int reasoning_mode, td_err *err);
void td_job_ref(job *j);
void td_job_unref(job *j);
/* Fills the scheduler request (callbacks point into gen.c). */
void td_job_sched_request(job *j, const int32_t *prompt, int n_prompt, td_request *out);
/* First SSE bytes (role chunk / echo), before the response is queued. */
int td_job_stream_begin(job *j);
/* Content reader for streamed responses. */
ssize_t td_job_stream_read(void *cls, uint64_t pos, char *buf, size_t max);
void td_job_stream_free(void *cls);
/* While a streamed request waits for its first token (queue, long
 * prefill), an empty delta every SRV_KEEPALIVE_S seconds (job lock held). */
#define SRV_KEEPALIVE_S 2.0
void td_job_keepalive(job *j, double now);

/* Over --max-stream-buffer: the stream is cancelled (job lock held). */
bool td_job_backlog_over(job *j);

/* ---- n > 1 and list prompts (group.c) ---- */
struct job_group {
    pthread_mutex_t mu;             /* fanned[] */
    int n, n_prompts, n_choices;    /* choice c: prompt c / n, sample c % n */
    job **m;                        /* [n_choices]; m[0] is the lead; the group holds a ref on the others */
    int32_t **ids;                  /* [n_prompts] prompt tokens (owned) */
    int *n_ids;
    bool *fanned;                   /* [n_prompts] samples 1..n-1 submitted (or failed) */
    /* results, under the lead's mu */
    json_t **choices;               /* [n_choices] non-stream choice objects */
    int n_done;
    long long prompt_tokens, completion_tokens, cached_tokens; /* each prompt counted once */
    char error[512];
    int error_status;
};
/* From td_ep_generate (a prompt worker): builds and submits every choice
 * (takes over r and ids, the first prompt's tokens); t->job or t->e. */
void td_ep_generate_group(srv *s, task *t, oai_req *r, int32_t *ids, size_t n, int reasoning, const json_t *body);
/* A follower's new SSE bytes to the lead's stream (follower's lock held). */
void td_group_flush(job *j);
/* Submits the other samples of j's prompt (no locks held). */
void td_group_fan_out(job *j);
/* A member's on_done: its result to the group; the last one completes the
 * response (member's lock held). */
void td_group_member_done(job *j);
/* The lead's connection is gone: cancel every choice (no locks held). */
void td_group_conn_gone(srv *s, job *lead);
/* The lead is freed: drop the followers. */
void td_group_free(job *lead);

/* ---- CORS (cors.c) ---- */
/* Access-Control-* headers on r when the request's Origin is allowed. */
void td_srv_cors_headers(srv *s, struct MHD_Connection *c, struct MHD_Response *r);
/* OPTIONS with Origin and Access-Control-Request-Method, CORS configured. */
bool td_srv_cors_is_preflight(srv *s, struct MHD_Connection *c, const char *method);
enum MHD_Result td_srv_cors_preflight(srv *s, struct MHD_Connection *c);

/* ---- http.c helpers used by the other files ---- */
double td_srv_now(void);
/* CLOCK_REALTIME now + ms, for pthread_cond_timedwait. */
struct timespec td_srv_deadline(long ms);
uint64_t td_srv_next_id(srv *s);
enum MHD_Result td_srv_reply(srv *s, struct MHD_Connection *c, int status, const char *ctype, const char *body, size_t len);
enum MHD_Result td_srv_reply_json(srv *s, struct MHD_Connection *c, int status, json_t *body); /* steals body */
enum MHD_Result td_srv_reply_error(srv *s, struct MHD_Connection *c, const http_err *e);
/* Resumes the job's connection if it is suspended (job lock held). */
void td_srv_wake(job *j);
/* Cancels a submitted request (no locks held). */
void td_srv_cancel(srv *s, uint64_t id);
/* Registers a submitted job with the watchdog. */
void td_srv_track(srv *s, job *j);
void td_srv_untrack(srv *s, job *j);
/* The job's client is gone: untracks it, marks it, cancels it if it runs (no locks held). */
void td_srv_conn_gone(srv *s, job *j);
/* The reply for a td_sched_submit failure src of an n_prompt-token request. */
void td_srv_submit_error(srv *s, int src, const td_err *err, int n_prompt, http_err *e);
void td_srv_job_finished(srv *s, job *j);

/* ---- endpoints.c ---- */
enum MHD_Result td_ep_models(srv *s, struct MHD_Connection *c);
enum MHD_Result td_ep_metrics(srv *s, struct MHD_Connection *c);
/* On a prompt worker (no libmicrohttpd calls): fill t's result. */
void td_ep_tokenize(srv *s, task *t);
void td_ep_detokenize(srv *s, task *t);
/* Parses, renders, tokenizes and submits; on success t->job. */
void td_ep_generate(srv *s, task *t);
/* Back on a polling thread: the streamed response, or the suspended wait
 * for the non-streamed one (j is the connection context's reference). */
enum MHD_Result td_ep_generate_respond(srv *s, struct MHD_Connection *c, job *j);

/* ---- Responses and Anthropic Messages (api_common.c, api_responses.c,
 * api_anthropic.c; see api.h) ---- */
/* Replaces *body (a Responses or Messages request) with the chat-completions
 * body td_oai_parse takes; *st: the output state for the job. */
int td_api_translate(srv *s, int dialect, json_t **body, api_state **st, http_err *e);
void td_api_state_free(api_state *st);
/* gen.c's hooks for a job with a dialect (job lock held). */
int td_api_stream_begin(job *j);
int td_api_stream_delta(job *j, int kind, int index, const char *text, size_t len);
int td_api_stream_tool(job *j, const cp_event *ev);
void td_api_on_token(job *j);
int td_api_finish_stream(job *j);
void td_api_finish_body(job *j);
int td_api_keepalive(job *j);
/* GET / DELETE /v1/responses/{id} (polling thread). */
enum MHD_Result td_ep_response_item(srv *s, struct MHD_Connection *c, const char *method, const char *id);
void td_api_store_free(srv *s);
/* POST /v1/messages/count_tokens (prompt worker). */
void td_ep_count_tokens(srv *s, task *t);
/* Anthropic's error body for an HTTP status. */
json_t *td_anth_error_body(int status, const char *msg);
/* ---- structured outputs (structured.c) ---- */
enum { SO_NONE = 0, SO_TEXT, SO_TOOLS, SO_TOOL };
/* Grammar vocabulary from the tokenizer, at td_srv_set_model; td_so_release frees the cache. */
int td_so_init(srv *s, td_err *err);
void td_so_release(srv *s);
/* response_format / structured_outputs / guided_* / tool_choice required or
 * named: sets r->so_kind and compiles (or finds) r->so_g. */
int td_so_parse(srv *s, const json_t *body, oai_req *r, http_err *e);
void td_so_req_free(oai_req *r);
void td_so_grammar_unref(so_grammar *g);
void td_so_cache_stats(srv *s, uint64_t *hits, uint64_t *misses);
/* The job's matcher (reasoning_mode 2: the grammar starts after </think>). */
int td_so_job_init(job *j, int reasoning_mode, td_err *err);
const td_constraint *td_so_job_constraint(job *j);
void td_so_job_free(job *j);
/* SO_TOOLS / SO_TOOL: the held-back text becomes tool calls (job lock held). */
int td_so_tools_finish(job *j);
/* gen.c: a chat-parser event into the job's output (job lock held). */
int td_job_cp_event(job *j, const cp_event *ev);
#endif
