/* What the server does with the body of a /v1/chat/completions,
 * /v1/completions or /tokenize request, without HTTP and without a model:
 * src/server/oai_req.c (td_oai_parse / td_oai_chat_fields: validation,
 * normalisation of messages, tools, stops, sampling), the chat template
 * render (td_oai_render_chat: the real Qwen3 template from tokenizer_config.json,
 * or tests/data/chat-templates/qwen3.5.jinja, or none), td_cp_reasoning_mode,
 * tokenization with the real Qwen3 tokenizer, and then src/server/gen.c: a
 * job is created for the request and a "generated" text is fed token by
 * token through the scheduler callbacks (on_token / on_done, with logprob
 * alternatives when asked), producing the SSE stream or the final JSON.
 *
 * Input: [mode byte] [JSON body] [NUL [generated text]]. Mode bits 0-1:
 * chat, completions, tokenize (messages), chat; bits 2-3: chat template
 * (Qwen3, Qwen3.5, none, Qwen3); bits 4-5: finish (stop, length, cancel,
 * stop); bits 6-7: default generated text when none is given.
 *
 * The body is parsed as endpoints.c's parse_body does (json_loadb with JSON_REJECT_DUPLICATES,
 * an object); the steps of td_ep_generate between parsing and the scheduler
 * (prompt too long, max_tokens clamp) are repeated here because they are
 * static in endpoints.c. Checks: every response body / SSE event the job
 * writes is valid JSON (the stream ends with [DONE]); errors carry a
 * status and message; no crash or leak. */
#include "fuzz_srv.h"

static srv g_srv;
static tpl *g_tpl[2];
static const int N_CTX = 4096;

static const char *const OUTPUTS[4] = {
    "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "Let me check.\n<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>",
    "Hello! \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 STOP here <|im_end|> more",
    "</think>plain answer with \"quotes\" and \\ backslash\n",
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_srv_init(&g_srv, g_tpl, N_CTX, "fuzz_oai_req");
    atomic_store(&g_srv.ready, 1);
    return 0;
}

static void check_output(job *j) {
    if (j->req.stream) {
        const char *p = j->out.p ? j->out.p : "";
        bool done = false;
        while (*p) {
            FUZZ_ASSERT(!done, "data after [DONE]");
            FUZZ_ASSERT(!strncmp(p, "data: ", 6), "SSE event does not start with data: [%.40s]", p);
            p += 6;
            const char *end = fuzz_event_end(p);
            FUZZ_ASSERT(end, "SSE event not terminated");
            if (end - p == 6 && !strncmp(p, "[DONE]", 6)) done = true;
            else {
                json_error_t je;
                json_t *o = json_loadb(p, (size_t)(end - p), JSON_ALLOW_NUL, &je);
                FUZZ_ASSERT(json_is_object(o), "SSE event is not a JSON object: %s [%.*s]", je.text, (int)(end - p), p);
                json_decref(o);
            }
            p = end + 2;
        }
        FUZZ_ASSERT(done || j->error[0] || j->res.finish == TD_FINISH_CANCEL, "stream without [DONE]");
        char buf[512];
        ssize_t r;
        while ((r = td_job_stream_read(j, 0, buf, sizeof buf)) > 0) {}
        FUZZ_ASSERT(r == MHD_CONTENT_READER_END_OF_STREAM || r == MHD_CONTENT_READER_END_WITH_ERROR, "stream read %zd", r);
    } else if (j->body) {
        json_error_t je;
        json_t *o = json_loads(j->body, JSON_ALLOW_NUL, &je);
        FUZZ_ASSERT(json_is_object(o), "response body is not a JSON object: %s", je.text);
        json_decref(o);
    }
}

static void generate(oai_req *r, const int32_t *prompt, size_t n_prompt, int reasoning, const char *out, size_t out_len, int fin) {
    int room = N_CTX - (int)n_prompt;
    if (r->max_tokens < 0) r->max_tokens = room;
    if (r->max_tokens > room) r->max_tokens = room;
    td_err err = {0};
    job *j = td_job_new(&g_srv, r, (int)n_prompt, reasoning, &err);
    FUZZ_ASSERT(j, "td_job_new: %s", err.msg);
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
        td_token_event ev = {.token = ids[i], .logprob = -0.25f * (float)(i % 7)};
        if (tr.top_logprobs > 0) {
            ev.n_top = tr.top_logprobs;
            for (int k = 0; k < ev.n_top; k++) {
                ev.top_ids[k] = (int32_t)(((uint32_t)ids[i] + 7919u * (uint32_t)k) % (uint32_t)g_srv.vocab);
                ev.top_logprobs[k] = -0.5f * (float)k;
            }
        }
        gen++;
        int rc = tr.on_token(tr.user, &ev);
        FUZZ_ASSERT(rc >= 0 && rc <= 2, "on_token %d", rc);
        if (rc) { finish = rc == 1 ? TD_FINISH_STOP : TD_FINISH_CANCEL; break; }
        bool stop = false;
        for (int k = 0; k < tr.gen.n_stop; k++) stop |= tr.gen.stop_ids[k] == ids[i];
        if (stop && !tr.gen.ignore_eos) { finish = TD_FINISH_STOP; break; }
    }
    if (gen == tr.gen.max_tokens && finish == TD_FINISH_STOP && fin == 0) finish = TD_FINISH_LENGTH;
    td_gen_result res = {.n_prompt = (int)n_prompt, .n_reused = 0, .n_generated = gen, .finish = finish};
    tr.on_done(tr.user, &res, fin == 3 && (out_len & 1) ? "engine failed (fuzz)" : NULL);
    check_output(j);
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
    int kinds[4] = {OAI_CHAT, OAI_COMPLETION, 0, OAI_CHAT};
    int kind = kinds[mode & 3];

    http_err e = {0};
    json_error_t je;
    json_t *b = json_loadb(body, blen, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(b)) {
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
    if (kind == 0) { /* /tokenize with messages */
        if (!td_oai_chat_fields(b, &r, &e) && !td_oai_render_chat(&g_srv, &r, &text, &tl, &e)) {
            FUZZ_ASSERT(td_tok_encode(g_srv.tok, text, tl, false, &ids, &n, &err) == 0, "encode prompt: %s", err.msg);
        } else {
            check_err(&e);
        }
        td_oai_req_free(&r);
        goto out;
    }
    if (td_oai_parse(&g_srv, b, kind, &r, &e)) {
        check_err(&e);
        td_oai_req_free(&r);
        goto out;
    }
    FUZZ_ASSERT(r.n_stops >= 0 && r.n_stops <= STOP_MAX && r.n_stop_ids >= 0 && r.n_stop_ids <= 64, "stops");
    for (int i = 0; i < r.n_stop_ids; i++) FUZZ_ASSERT(r.stop_ids[i] >= 0 && r.stop_ids[i] < g_srv.vocab, "stop id");
    int reasoning = 0;
    if (kind == OAI_CHAT) {
        if (td_oai_render_chat(&g_srv, &r, &text, &tl, &e)) {
            check_err(&e);
            td_oai_req_free(&r);
            goto out;
        }
        reasoning = td_cp_reasoning_mode(text, tl, r.thinking);
        FUZZ_ASSERT(td_tok_encode(g_srv.tok, text, tl, false, &ids, &n, &err) == 0, "encode prompt: %s", err.msg);
    } else if (r.prompt_ids) {
        for (size_t i = 0; i < r.n_prompt_ids; i++) FUZZ_ASSERT(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < g_srv.vocab, "prompt id");
        ids = r.prompt_ids;
        n = r.n_prompt_ids;
        r.prompt_ids = NULL;
        r.n_prompt_ids = 0;
    } else {
        FUZZ_ASSERT(r.prompt_text, "no prompt");
        FUZZ_ASSERT(td_tok_encode(g_srv.tok, r.prompt_text, strlen(r.prompt_text), true, &ids, &n, &err) == 0, "encode: %s", err.msg);
    }
    if (n == 0 || (long long)n >= N_CTX) {
        td_oai_req_free(&r);
        goto out;
    }
    generate(&r, ids, n, reasoning, out, out_len, (mode >> 4) & 3);
    td_oai_req_free(&r); /* td_job_new took it over: empty */
out:
    free(text);
    free(ids);
    json_decref(b);
    FUZZ_ASSERT(g_srv.n_open == 0, "job not freed (%d open)", g_srv.n_open);
    return 0;
}
