/* Incremental output parsers for the OpenAI layer, fed with detokenized
 * text in arbitrary fragments (token by token, or byte by byte):
 *
 *  - stop_matcher: finds stop strings, holding back any tail that could be
 *    the start of one, so a stop string is never emitted even when split
 *    across tokens.
 *  - chat_parser: splits <think>...</think> into reasoning, and parses tool
 *    calls in both Qwen formats:
 *      Qwen3 (hermes):  <tool_call>{"name": "f", "arguments": {...}}</tool_call>
 *      Qwen3.5 (qwen3_coder XML):
 *        <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
 *    XML parameter values are converted by the tool's JSON-schema type.
 *    Tool calls are emitted as OpenAI streaming fragments: a start (index,
 *    id, name) then argument text pieces whose concatenation is the JSON
 *    arguments object.
 *
 * Pure code: no I/O, no threads; used by the server and unit-tested in
 * tests/c/test_server_parse.c. */
#ifndef TANDEM_SERVER_CHAT_PARSE_H
#define TANDEM_SERVER_CHAT_PARSE_H
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include "server/sbuf.h"
#include "tandem.h"

/* ---- stop strings ------------------------------------------------------ */

#define STOP_MAX 16
#define STOP_MAX_LEN 1024

typedef struct stop_matcher {
    char *stops[STOP_MAX];
    size_t lens[STOP_MAX];
    int n;
    bool include_stop; /* vLLM's include_stop_str_in_output */
    bool hit;          /* a stop string matched: nothing more is emitted */
    int hit_index;     /* which one (stops[hit_index]) */
    sbuf held;         /* text not yet released */
} stop_matcher;

/* Copies the strings (each 1..STOP_MAX_LEN bytes, at most STOP_MAX). */
int td_stop_init(stop_matcher *m, const char *const *stops, int n, bool include_stop, td_err *err);
/* Appends text; releases (appends to out) what can no longer start a stop
 * string. Returns 1 when a stop string matched (text up to it released,
 * the rest dropped), 0 otherwise, TD_ERR_NOMEM on allocation failure. */
int td_stop_push(stop_matcher *m, const char *text, size_t len, sbuf *out, td_err *err);
/* End of generation: releases the held tail. */
int td_stop_flush(stop_matcher *m, sbuf *out, td_err *err);
void td_stop_free(stop_matcher *m);

/* ---- reasoning and tool calls ------------------------------------------ */

typedef enum {
    CP_REASONING = 1, /* text: reasoning_content */
    CP_CONTENT,       /* text: content */
    CP_TOOL_START,    /* index, id, name: first fragment of a tool call */
    CP_TOOL_ARGS,     /* index, text: a piece of the arguments JSON */
} cp_kind;

typedef struct cp_event {
    cp_kind kind;
    int index;            /* tool-call index (0, 1, ...) */
    const char *text;     /* not NUL-terminated; len bytes */
    size_t len;
    const char *id, *name; /* CP_TOOL_START only, NUL-terminated */
} cp_event;

/* Return 0, or a negative td_status to abort parsing. */
typedef int (*cp_emit_fn)(void *user, const cp_event *ev);

typedef struct cp_config {
    /* Reasoning: 0 = none (all output is content); 1 = output may start with
     * <think>; 2 = output starts inside thinking (the prompt ended with
     * <think>). */
    int reasoning;
    bool parse_tools;
    const json_t *tools;  /* OpenAI tools array (borrowed), for XML value types */
    uint64_t id_seed;     /* tool-call ids derive from it */
} cp_config;

typedef struct chat_parser {
    cp_config cfg;
    cp_emit_fn emit;
    void *user;
    int state;
    bool strip_nl;        /* drop leading newlines of the next section */
    sbuf pend;            /* text not yet classified */
    sbuf ws;              /* whitespace held after a tool call */
    int n_calls;
    /* current tool call */
    sbuf call;            /* text after <tool_call> */
    size_t cpos;          /* processed bytes of call */
    int fmt;              /* 0 unknown, 1 JSON, 2 XML */
    bool started;         /* CP_TOOL_START emitted */
    bool args_done;       /* whole arguments emitted */
    bool args_open;       /* JSON: streaming raw arguments */
    int n_params;
    char *fname;          /* function name */
    char *pname;          /* XML: open parameter */
    /* JSON scanner */
    int depth;
    bool in_str, esc;
    size_t str_start;
    char *key;            /* last depth-1 key */
    bool want_value;
    int args_depth;
} chat_parser;

void td_cp_init(chat_parser *p, const cp_config *cfg, cp_emit_fn emit, void *user);
int td_cp_push(chat_parser *p, const char *text, size_t len, td_err *err);
/* End of output: flushes held text, closes an unterminated tool call. */
int td_cp_finish(chat_parser *p, td_err *err);
void td_cp_free(chat_parser *p);

/* Converts an XML parameter value to JSON by the schema type of parameter
 * `param` of function `fname` in tools (string when unknown). New ref. */
json_t *td_cp_convert_param(const json_t *tools, const char *fname, const char *param, const char *value, size_t len);

/* 2 when the rendered prompt ends inside an open <think> block, 1 when
 * thinking is allowed but not started, 0 when disabled. */
int td_cp_reasoning_mode(const char *prompt, size_t len, bool thinking_enabled);
#endif
