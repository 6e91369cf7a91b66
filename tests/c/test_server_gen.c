/* gen.c's output path driven without a model: a parsed request's job gets
 * the tokens of a chosen text through the scheduler callbacks, and the
 * response (body or SSE) is checked. Covers what a random-weight model
 * cannot be made to say: several tool calls (parallel_tool_calls: false
 * keeps the first), invalid tool-call arguments (the whole output becomes
 * content, finish_reason "stop", streamed too), the reasoning field names. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "server/srv_internal.h"

static srv S;

static void setup(void) {
    memset(&S, 0, sizeof S);
    td_err err = {0};
    if (td_tok_load("tests/golden/tiny-b/f32", &S.tok, &err)) {
        fprintf(stderr, "cannot load the tokenizer: %s\n", err.msg);
        exit(1);
    }
    td_metrics_init(&S.metrics);
    pthread_mutex_init(&S.jobs_mu, NULL);
    pthread_cond_init(&S.jobs_cv, NULL);
    S.vocab = td_tok_vocab_size(S.tok);
    S.model_name = "m";
    S.model_dir = "d";
    S.n_ctx = 4096;
    S.cfg.quiet = true;
    S.cfg.max_num_seqs = 8;
    S.cfg.max_queue = 64;
    td_sampling_default(&S.cfg.sampling);
}

static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}},"
                           "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\"}}}]";

/* The response to request `extra` (JSON members) when the model says `text`:
 * the body, or the SSE bytes when streamed (malloc'd). */
static char *run(const char *extra, const char *text, int reasoning_mode) {
    char body[2048];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":%s,\"skip_special_tokens\":false%s%s}", TOOLS,
             *extra ? "," : "", extra);
    json_t *b = json_loads(body, 0, NULL);
    oai_req r;
    http_err e = {0};
    if (!b || td_oai_parse(&S, b, OAI_CHAT, &r, &e)) {
        fprintf(stderr, "bad request %s: %s\n", body, e.msg);
        exit(1);
    }
    json_decref(b);
    td_err err = {0};
    job *j = td_job_new(&S, &r, 1, reasoning_mode, &err);
    if (!j) exit(1);
    if (j->req.stream) td_job_stream_begin(j);
    td_request tr;
    int32_t prompt[1] = {1};
    td_job_sched_request(j, prompt, 1, &tr);
    td_job_ref(j); /* as the scheduler holds one until on_done */
    int32_t *ids = NULL;
    size_t n = 0;
    td_tok_encode(S.tok, text, strlen(text), false, &ids, &n, &err);
    int stop = 0;
    for (size_t i = 0; i < n && !stop; i++) {
        td_token_event ev = {.token = ids[i]};
        stop = tr.on_token(tr.user, &ev);
    }
    td_gen_result res = {.n_prompt = 1, .n_generated = (int)n, .finish = TD_FINISH_STOP};
    tr.on_done(tr.user, &res, NULL);
    free(ids);
    char *out = strdup(j->req.stream ? (j->out.p ? j->out.p : "") : (j->body ? j->body : ""));
    td_job_unref(j);
    return out;
}

/* The message of a non-streamed chat body. */
static json_t *message(const char *body, const char **finish) {
    json_t *o = json_loads(body, 0, NULL);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    static char fin[32];
    snprintf(fin, sizeof fin, "%s", json_string_value(json_object_get(c, "finish_reason")) ?: "");
    *finish = fin;
    json_t *m = json_incref(json_object_get(c, "message"));
    json_decref(o);
    return m;
}

/* A streamed chat: content, reasoning and tool-call texts joined, the finish reason. */
typedef struct {
    sbuf content, reasoning, reasoning_content;
    int n_calls, n_tool_deltas;
    char name[4][16];
    sbuf args[4];
    char finish[32];
    bool done;
} streamed;

static void parse_sse(const char *sse, streamed *st) {
    memset(st, 0, sizeof *st);
    for (const char *p = sse; (p = strstr(p, "data: "));) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (!strncmp(p, "[DONE]", 6)) st->done = true;
        json_t *o = json_loadb(p, (size_t)(e - p), 0, NULL);
        json_t *c = json_array_get(json_object_get(o, "choices"), 0), *d = json_object_get(c, "delta");
        const char *t;
        if ((t = json_string_value(json_object_get(d, "content")))) td_sb_adds(&st->content, t);
        if ((t = json_string_value(json_object_get(d, "reasoning")))) td_sb_adds(&st->reasoning, t);
        if ((t = json_string_value(json_object_get(d, "reasoning_content")))) td_sb_adds(&st->reasoning_content, t);
        size_t i;
        json_t *tc;
        json_array_foreach(json_object_get(d, "tool_calls"), i, tc) {
            int k = (int)json_integer_value(json_object_get(tc, "index"));
            if (k < 0 || k > 3) continue;
            st->n_tool_deltas++;
            json_t *f = json_object_get(tc, "function");
            if ((t = json_string_value(json_object_get(f, "name")))) snprintf(st->name[k], 16, "%s", t), st->n_calls++;
            if ((t = json_string_value(json_object_get(f, "arguments")))) td_sb_adds(&st->args[k], t);
        }
        if ((t = json_string_value(json_object_get(c, "finish_reason")))) snprintf(st->finish, sizeof st->finish, "%s", t);
        json_decref(o);
        p = e;
    }
}

static void streamed_free(streamed *st) {
    td_sb_free(&st->content), td_sb_free(&st->reasoning), td_sb_free(&st->reasoning_content);
    for (int i = 0; i < 4; i++) td_sb_free(&st->args[i]);
}

static const char *SB(const sbuf *b) { return b->p ? b->p : ""; }

static void test_parallel_tool_calls(void) {
    const char *two = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"b\": 2}}\n</tool_call>";
    const char *fin;
    char *b = run("", two, 0);
    json_t *m = message(b, &fin);
    CHECK(json_array_size(json_object_get(m, "tool_calls")) == 2 && !strcmp(fin, "tool_calls"), "%s", b);
    json_decref(m), free(b);
    b = run("\"parallel_tool_calls\":false", two, 0);
    m = message(b, &fin);
    json_t *calls = json_object_get(m, "tool_calls");
    CHECK(json_array_size(calls) == 1 && !strcmp(fin, "tool_calls"), "%s", b);
    const char *name = json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name"));
    CHECK(name && !strcmp(name, "f"), "%s", b);
    json_decref(m), free(b);
    streamed st;
    b = run("\"parallel_tool_calls\":false,\"stream\":true", two, 0);
    parse_sse(b, &st);
    CHECK(st.n_calls == 1 && !strcmp(st.name[0], "f") && !strcmp(SB(&st.args[0]), "{\"a\": 1}") && !st.args[1].len, "%s", b);
    CHECK(!strcmp(st.finish, "tool_calls") && st.done, "%s", b);
    streamed_free(&st), free(b);
}

static void test_invalid_arguments(void) {
    const char *bad = "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1,}}\n</tool_call>";
    const char *fin;
    char *b = run("", bad, 0);
    json_t *m = message(b, &fin);
    CHECK(!json_object_get(m, "tool_calls") && !strcmp(fin, "stop"), "%s", b);
    CHECK(json_is_string(json_object_get(m, "content")) && !strcmp(json_string_value(json_object_get(m, "content")), bad), "%s", b);
    json_decref(m), free(b);
    streamed st;
    b = run("\"stream\":true", bad, 0);
    parse_sse(b, &st);
    CHECK(!st.n_tool_deltas && !strcmp(SB(&st.content), bad) && !strcmp(st.finish, "stop") && st.done, "%s", b);
    streamed_free(&st), free(b);
    /* a valid call after an invalid one: still all content (vLLM's parsers fail as a whole) */
    const char *mixed = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                        "<tool_call>\n{\"name\": \"g\", \"arguments\": {b: 2}}\n</tool_call>";
    b = run("\"stream\":true", mixed, 0);
    parse_sse(b, &st);
    CHECK(!st.n_tool_deltas && !strcmp(SB(&st.content), mixed) && !strcmp(st.finish, "stop"), "%s", b);
    streamed_free(&st), free(b);
    /* valid calls are streamed (held until the end), after the content before them */
    const char *good = "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n</tool_call>";
    b = run("\"stream\":true", good, 0);
    parse_sse(b, &st);
    CHECK(st.n_calls == 1 && !strcmp(SB(&st.args[0]), "{\"a\": [1, 2]}") && !strcmp(SB(&st.content), "Sure. "), "%s", b);
    CHECK(!strcmp(st.finish, "tool_calls"), "%s", b);
    streamed_free(&st), free(b);
    /* after reasoning: the content is what followed </think> */
    const char *th = "<think>hmm</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>";
    b = run("", th, 1);
    m = message(b, &fin);
    const char *c = json_string_value(json_object_get(m, "content"));
    CHECK(c && !strcmp(c, th + strlen("<think>hmm</think>\n\n")) && !strcmp(fin, "stop"), "%s", b);
    CHECK(!strcmp(json_string_value(json_object_get(m, "reasoning")) ?: "", "hmm"), "%s", b);
    json_decref(m), free(b);
}

static void test_reasoning_field(void) {
    const char *t = "<think>why</think>\n\nanswer";
    const char *fin;
    for (int f = SRV_REASONING_BOTH; f <= SRV_REASONING_CONTENT; f++) {
        S.cfg.reasoning_field = f;
        char *b = run("", t, 1);
        json_t *m = message(b, &fin);
        bool has_new = json_object_get(m, "reasoning") != NULL, has_old = json_object_get(m, "reasoning_content") != NULL;
        CHECK(has_new == (f != SRV_REASONING_CONTENT) && has_old == (f != SRV_REASONING_NEW), "field %d: %s", f, b);
        json_decref(m), free(b);
        streamed st;
        b = run("\"stream\":true", t, 1);
        parse_sse(b, &st);
        CHECK(!strcmp(SB(&st.reasoning), f != SRV_REASONING_CONTENT ? "why" : ""), "field %d: %s", f, b);
        CHECK(!strcmp(SB(&st.reasoning_content), f != SRV_REASONING_NEW ? "why" : ""), "field %d: %s", f, b);
        CHECK(!strcmp(SB(&st.content), "answer"), "%s", b);
        streamed_free(&st), free(b);
    }
    S.cfg.reasoning_field = SRV_REASONING_BOTH;
}

int main(void) {
    setup();
    test_parallel_tool_calls();
    test_invalid_arguments();
    test_reasoning_field();
    td_tok_free(S.tok);
    td_metrics_destroy(&S.metrics);
    TEST_MAIN_END("test_server_gen");
}
