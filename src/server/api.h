/* Shared by the non-chat API dialects (api_common.c, api_responses.c,
 * api_anthropic.c); not used elsewhere.
 *
 * A /v1/responses or /v1/messages request is translated at the JSON level
 * into a chat-completions body and runs through td_oai_parse and the normal
 * chat path (template, tool parsing, stop strings, prefix cache, structured
 * outputs). Only the output differs: gen.c hands the chat parser's deltas to
 * api_common.c, which keeps the output as a list of blocks in stream order
 * (reasoning, text, tool calls) and calls the dialect to open a block, append
 * to it and close it, then to finish the stream or write the final JSON. */
#ifndef TANDEM_SERVER_API_H
#define TANDEM_SERVER_API_H
#include "server/srv_internal.h"

/* Untrusted bounds, beside the body size limit (--max-body). */
#define API_MAX_ITEMS 100000        /* input items / messages */
#define API_MAX_PARTS 10000         /* content parts / blocks in one message */
#define API_MAX_TOOLS 4096

/* One output block: reasoning, text, or a tool call. */
typedef struct api_block {
    int kind;                       /* CP_REASONING, CP_CONTENT, or CP_TOOL_START for a call */
    int call;                       /* calls: the chat parser's tool-call index */
    char id[96];                    /* Responses item id; Anthropic tool_use id */
    char call_id[96];               /* calls: the chat tool-call id (Responses call_id) */
    char *name;                     /* calls: the function name */
    sbuf text;                      /* text, reasoning or arguments */
} api_block;

struct api_state {
    int dialect;                    /* DIALECT_RESPONSES or DIALECT_ANTHROPIC */
    char id[64];                    /* resp_... / msg_... */
    long long created;
    /* Responses */
    json_t *echo;                   /* request fields echoed in the response object */
    json_t *conv;                   /* the conversation (chat messages, instructions left out) for the store */
    bool store;
    long long seq;                  /* next sequence_number */
    /* output blocks */
    api_block *b;
    int nb, capb;
    int cur;                        /* the open block (streams), -1 none */
    int n_items;                    /* ids handed out */
    /* reasoning tokens: tokens during which reasoning text came out */
    int reasoning_tokens;
    size_t reasoning_bytes, reasoning_seen;
};

/* api_common.c */
/* One SSE event ("event: NAME" and "data: JSON"); steals data. */
int td_api_sse(job *j, const char *event, json_t *data);
/* A new block (NULL when out of memory). */
api_block *td_api_block_add(api_state *st, int kind);
/* The stop string that ended the output, or NULL. */
const char *td_api_stop_sequence(const job *j);
/* Text of a content given as a string or an array of text parts (types
 * listed in `types`, NULL-terminated), joined by sep; new string ref, NULL
 * with e set. `what` names the field in errors. */
json_t *td_api_text_of(const json_t *c, const char *const *types, const char *sep, const char *what, http_err *e);
/* Copies b[k] to chat[k] for each listed key present in b. */
void td_api_pass(json_t *chat, const json_t *b, const char *const *keys);

/* api_responses.c */
int td_resp_translate(srv *s, const json_t *in, json_t *chat, api_state *st, http_err *e);
int td_resp_begin(job *j);
int td_resp_open(job *j, int bi);
int td_resp_delta(job *j, int bi, const char *text, size_t len);
int td_resp_close(job *j, int bi, bool complete);
int td_resp_finish_stream(job *j);
void td_resp_finish_body(job *j);

/* api_anthropic.c */
int td_anth_translate(srv *s, const json_t *in, json_t *chat, bool count_only, http_err *e);
int td_anth_begin(job *j);
int td_anth_open(job *j, int bi);
int td_anth_delta(job *j, int bi, const char *text, size_t len);
int td_anth_close(job *j, int bi);
int td_anth_finish_stream(job *j);
void td_anth_finish_body(job *j);
#endif
