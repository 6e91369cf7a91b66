/* `tandem serve`: an OpenAI-compatible HTTP server (chat completions,
 * completions, models, tokenize/detokenize, health, Prometheus metrics) on
 * top of the request scheduler (src/sched/sched.h).
 *
 * HTTP comes from libmicrohttpd; see src/server/README.md for why.
 *
 * Life cycle: td_srv_start binds the port at once and answers /health with 503;
 * td_srv_set_model makes it serve requests (200); td_srv_drain stops taking new
 * generations and waits for those in flight; td_srv_detach_sched hands the
 * scheduler back so the caller can free it (cancelling what is left, which
 * ends their streams); td_srv_free closes the listener and every connection. */
#ifndef TANDEM_SERVER_H
#define TANDEM_SERVER_H
#include <stdbool.h>
#include <stddef.h>
#include "sched/sched.h"
#include "tandem.h"
#include "tokenizer/tokenizer.h"

typedef struct srv_config {
    const char *host;               /* default "127.0.0.1" */
    int port;                       /* 0 = any free port (see td_srv_port) */
    const char *api_key;            /* NULL: no auth */
    const char *served_model_name;  /* "model" in requests and /v1/models */
    const char *model_dir;
    size_t max_body;                /* bytes; 413 above (default 32 MiB) */
    int http_threads;               /* libmicrohttpd polling threads (default 4); as many
                                       prompt workers render and tokenize requests */
    unsigned max_conn_per_ip;       /* connections from one address at once; 0: no limit */
    unsigned idle_timeout_s;        /* a connection with no traffic this long is closed; 0: never
                                       (suspended ones, waiting for the scheduler, are exempt) */
    size_t max_stream_buffer;       /* SSE bytes buffered for a client that does not read before
                                       its request is cancelled; 0: no bound */
    int max_num_seqs, max_queue;    /* as given to the scheduler (reported) */
    int spec_depth;                 /* draft tokens per step for every request (the maximum with spec_auto) */
    bool spec_auto;                 /* --spec-depth auto: each step picks 0..spec_depth (spec/autodepth.h) */
    bool draft_sampling;
    td_sampling sampling;           /* defaults for fields a request leaves out */
    bool sampling_seed_set;         /* sampling.seed was given: default seed */
    int default_max_tokens;         /* 0: up to the context */
    bool quiet;                     /* no per-request log lines */
    int reasoning_field;            /* SRV_REASONING_*: the name(s) of the reasoning output field */
    /* CORS (vLLM's flags): origins allowed (NULL or empty: no CORS headers;
     * "*" any), and the methods / headers answered to a preflight */
    const char *const *allowed_origins;
    int n_allowed_origins;
    const char *allowed_methods, *allowed_headers; /* NULL: "*" */
    bool allow_credentials;
    int responses_store_max;        /* stored /v1/responses (previous_response_id, GET): at most this
                                       many, least recently used dropped first; 0: 1000, < 0: none */
    size_t responses_store_bytes;   /* and at most this many bytes (0: 64 MiB) */
} srv_config;

enum { SRV_REASONING_BOTH = 0, SRV_REASONING_NEW, SRV_REASONING_CONTENT }; /* reasoning, reasoning_content */

typedef struct srv srv;

int td_srv_start(const srv_config *cfg, srv **out, td_err *err);
int td_srv_port(const srv *s);

/* Borrowed; they must outlive the server (sched until td_srv_detach_sched). */
typedef struct srv_model {
    tokenizer *tok;
    td_engine *eng;
    td_sched *sched;
    int n_ctx;                      /* context window (tokens) */
} srv_model;
int td_srv_set_model(srv *s, const srv_model *m, td_err *err);

/* Refuses new generations (503) and waits up to timeout_s for the running
 * ones. Returns how many are still running. */
int td_srv_drain(srv *s, double timeout_s);
/* Stops using the scheduler and returns it (NULL if none). */
td_sched *td_srv_detach_sched(srv *s);
/* Waits up to timeout_s for open responses to finish, then stops. */
void td_srv_free(srv *s, double timeout_s);
#endif
