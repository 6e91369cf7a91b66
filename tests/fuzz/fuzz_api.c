/* What the server does with the body of a /v1/responses, /v1/messages or
 * /v1/messages/count_tokens request, without HTTP and without a model:
 * td_api_translate (src/server/api_responses.c, api_anthropic.c) into a chat
 * body, td_oai_parse, the chat template (the real Qwen3 template,
 * tests/data/chat-templates/qwen3.5.jinja, or none), tokenization with the
 * real Qwen3 tokenizer, then a job in that dialect fed a "generated" text
 * token by token through gen.c's scheduler callbacks (the td_api_* hooks write
 * the events or the final object).
 *
 * Input: [mode byte] [JSON body] [NUL [generated text]]. Mode bit 0:
 * Responses or Messages; bit 1 (Messages): count_tokens instead; bits 2-3:
 * chat template (Qwen3, Qwen3.5, none, Qwen3); bits 4-5: finish (stop,
 * length, cancel, an engine error); bits 6-7: default generated text.
 *
 * Checks: errors carry a status and message; every SSE event is
 * "event: NAME" + "data: {JSON object with type NAME}" (keep-alive comments
 * aside), Responses events numbered 0, 1, ... from response.created to
 * response.completed / incomplete / failed, Messages events from
 * message_start to message_stop (or error); bodies are JSON objects; no
 * crash or leak. */
#include "fuzz_srv.h"

static srv g_srv;
static tpl *g_tpl[2];
static const int N_CTX = 4096;

static const char *const OUTPUTS[4] = {
    "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "Let me check.\n<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>\nand text after",
    "Hello! \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 STOP here <|im_end|> more",
    "</think>plain answer <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, ",
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_srv_init(&g_srv, g_tpl, N_CTX, "fuzz_api");
    g_srv.cfg.responses_store_max = 64; /* stored responses stay few */
    atomic_store(&g_srv.ready, 1);
    return 0;
}

static void check_stream(job *j, int dialect) {
    const char *p = j->out.p ? j->out.p : "";
    int n = 0;
    char last[64] = "";
    while (*p) {
        const char *end = fuzz_event_end(p);
        FUZZ_ASSERT(end, "SSE event not terminated [%.40s]", p);
        if (*p == ':') { /* keep-alive comment */
            p = end + 2;
            continue;
        }
        FUZZ_ASSERT(!strncmp(p, "event: ", 7), "SSE event without its name [%.40s]", p);
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        FUZZ_ASSERT(nl && !strncmp(nl + 1, "data: ", 6), "SSE event without data");
        size_t nlen = (size_t)(nl - p - 7);
        FUZZ_ASSERT(nlen < sizeof last, "event name too long");
        memcpy(last, p + 7, nlen);
        last[nlen] = 0;
        json_error_t je;
        json_t *o = json_loadb(nl + 7, (size_t)(end - nl - 7), JSON_ALLOW_NUL, &je);
        FUZZ_ASSERT(json_is_object(o), "SSE data is not a JSON object: %s", je.text);
        const char *type = json_string_value(json_object_get(o, "type"));
        FUZZ_ASSERT(type && !strcmp(type, last), "event %s with data type %s", last, type ? type : "(none)");
        if (dialect == DIALECT_RESPONSES) {
            FUZZ_ASSERT(json_integer_value(json_object_get(o, "sequence_number")) == n, "sequence_number");
            FUZZ_ASSERT(n || !strcmp(type, "response.created"), "first event %s", type);
        } else {
            FUZZ_ASSERT(n || !strcmp(type, "message_start"), "first event %s", type);
        }
        json_decref(o);
        n++;
        p = end + 2;
    }
    if (j->res.finish == TD_FINISH_CANCEL && !j->error[0]) return;
    if (dialect == DIALECT_RESPONSES)
        FUZZ_ASSERT(!strcmp(last, "response.completed") || !strcmp(last, "response.incomplete") || !strcmp(last, "response.failed"),
                    "last event %s", last);
    else
        FUZZ_ASSERT(!strcmp(last, "message_stop") || !strcmp(last, "error"), "last event %s", last);
}

static void generate(oai_req *r, api_state *st, int dialect, const int32_t *prompt, size_t n_prompt, int reasoning, const char *out,
                     size_t out_len, int fin) {
    int room = N_CTX - (int)n_prompt;
    if (r->max_tokens < 0) r->max_tokens = room;
    if (r->max_tokens > room) r->max_tokens = room;
    td_err err = {0};
    job *j = td_job_new(&g_srv, r, (int)n_prompt, reasoning, &err);
    FUZZ_ASSERT(j, "td_job_new: %s", err.msg);
    j->dialect = dialect;
    j->api = st;
    if (j->req.stream) FUZZ_ASSERT(td_job_stream_begin(j) == 0, "stream begin");
    td_request tr;
    td_job_sched_request(j, prompt, (int)n_prompt, &tr);
    j->submitted = true;
    td_job_ref(j); /* the scheduler's, dropped by on_done */
    int32_t *ids = NULL;
    size_t n = 0;
    FUZZ_ASSERT(td_tok_encode(g_srv.tok, out, out_len, false, &ids, &n, &err) == 0, "encode output");
    td_finish finish = fin == 1 ? TD_FINISH_LENGTH : fin == 2 ? TD_FINISH_CANCEL : TD_FINISH_STOP;
    int gen = 0;
    for (size_t i = 0; i < n && gen < tr.gen.max_tokens; i++) {
        td_token_event ev = {.token = ids[i], .logprob = -0.25f};
        gen++;
        int rc = tr.on_token(tr.user, &ev);
        FUZZ_ASSERT(rc >= 0 && rc <= 2, "on_token %d", rc);
        if (rc) { finish = rc == 1 ? TD_FINISH_STOP : TD_FINISH_CANCEL; break; }
        bool stop = false;
        for (int k = 0; k < tr.gen.n_stop; k++) stop |= tr.gen.stop_ids[k] == ids[i];
        if (stop && !tr.gen.ignore_eos) { finish = TD_FINISH_STOP; break; }
    }
    if (gen == tr.gen.max_tokens && finish == TD_FINISH_STOP && fin == 0) finish = TD_FINISH_LENGTH;
    td_gen_result res = {.n_prompt = (int)n_prompt, .n_reused = (int)n_prompt / 2, .n_generated = gen, .finish = finish};
    tr.on_done(tr.user, &res, fin == 3 ? "engine failed (fuzz)" : NULL);
    if (j->req.stream) check_stream(j, dialect);
    else if (j->body) {
        json_error_t je;
        json_t *o = json_loads(j->body, JSON_ALLOW_NUL, &je);
        FUZZ_ASSERT(json_is_object(o), "response body is not a JSON object: %s", je.text);
        json_decref(o);
    }
    free(ids);
    td_job_unref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0];
    const char *body = (const char *)data + 1;
    size_t blen = size - 1;
    const char *nul = memchr(body, 0, blen);
    const char *out = OUTPUTS[(mode >> 6) & 3];
    size_t out_len = strlen(out);
    if (nul) {
        out = nul + 1;
        out_len = blen - (size_t)(nul + 1 - body);
        blen = (size_t)(nul - body);
    }
    int tsel = (mode >> 2) & 3;
    g_srv.chat_tpl = tsel == 2 ? NULL : g_tpl[tsel & 1];
    int dialect = mode & 1 ? DIALECT_ANTHROPIC : DIALECT_RESPONSES;
    if (dialect == DIALECT_ANTHROPIC && (mode & 2)) { /* count_tokens, as the prompt worker runs it */
        task t = {.srv = &g_srv, .what = TASK_COUNT_TOKENS, .dialect = dialect, .body = (char *)body, .len = blen};
        td_ep_count_tokens(&g_srv, &t);
        if (t.e.status) check_err(&t.e);
        else FUZZ_ASSERT(t.reply && t.status == 200, "count_tokens without a reply");
        free(t.reply);
        return 0;
    }
    http_err e = {0};
    json_error_t je;
    json_t *b = json_loadb(body, blen, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(b)) {
        json_decref(b);
        return 0;
    }
    api_state *st = NULL;
    if (td_api_translate(&g_srv, dialect, &b, &st, &e)) {
        check_err(&e);
        json_decref(b);
        return 0;
    }
    oai_req r;
    memset(&r, 0, sizeof r);
    char *text = NULL;
    size_t tl = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    td_err err = {0};
    if (td_oai_parse(&g_srv, b, OAI_CHAT, &r, &e) || td_oai_render_chat(&g_srv, &r, &text, &tl, &e)) {
        check_err(&e);
        td_api_state_free(st);
        goto out;
    }
    int reasoning = td_cp_reasoning_mode(text, tl, r.thinking);
    FUZZ_ASSERT(td_tok_encode(g_srv.tok, text, tl, false, &ids, &n, &err) == 0, "encode prompt: %s", err.msg);
    if (n == 0 || (long long)n >= N_CTX) {
        td_api_state_free(st);
        goto out;
    }
    generate(&r, st, dialect, ids, n, reasoning, out, out_len, (mode >> 4) & 3);
out:
    td_oai_req_free(&r);
    free(text);
    free(ids);
    json_decref(b);
    return 0;
}
