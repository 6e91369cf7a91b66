/* The server's generation path (src/server/gen.c) without HTTP: recorded
 * model outputs (Qwen3 hermes and Qwen3.5 XML tool calls, thinking) are
 * tokenized with the tiny-b tokenizer and fed token by token through the
 * scheduler callbacks; the SSE stream and the non-streamed JSON must have
 * OpenAI's structure (role first, reasoning_content / content deltas,
 * tool-call fragments with index, id, type, name and arguments "" first,
 * finish_reason tool_calls, usage chunk, [DONE]). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "server/srv_internal.h"

static const char *MODEL = "tests/golden/tiny-b/f32";

static json_t *tools_json(void) {
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"run\",\"parameters\":{\"type\":\"object\",\"properties\":{"
                      "\"cmd\":{\"type\":\"string\"},\"timeout\":{\"type\":\"integer\"}}}}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
                      "\"city\":{\"type\":\"string\"}}}}}]",
                      0, NULL);
}

/* Feeds `output` through a job; returns the SSE text (stream) or body. */
static char *run_job(srv *s, const char *output, bool stream, int reasoning, bool tools, bool usage, td_finish fin, int *n_events) {
    oai_req r;
    memset(&r, 0, sizeof r);
    r.kind = OAI_CHAT;
    r.stream = stream;
    r.include_usage = usage;
    r.logprobs = -1;
    r.skip_special = true;
    r.max_tokens = 1000;
    if (tools) {
        r.tools = tools_json();
        r.parse_tools = true;
    }
    td_err err = {0};
    job *j = td_job_new(s, &r, 7, reasoning, &err);
    CHECK(j != NULL, "td_job_new: %s", err.msg);
    if (!j) return NULL;
    if (stream) CHECK(td_job_stream_begin(j) == 0, "stream begin");
    int32_t prompt[1] = {1};
    td_request tr;
    td_job_sched_request(j, prompt, 1, &tr);
    j->submitted = true;
    td_job_ref(j); /* the scheduler's */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(td_tok_encode(s->tok, output, strlen(output), false, &ids, &n, &err) == 0, "encode: %s", err.msg);
    for (size_t i = 0; i < n; i++) {
        td_token_event ev = {.token = ids[i], .logprob = -0.5f};
        CHECK(tr.on_token(tr.user, &ev) == 0, "on_token %zu", i);
    }
    td_gen_result res = {.n_prompt = 7, .n_reused = 3, .n_generated = (int)n, .finish = fin};
    tr.on_done(tr.user, &res, NULL);
    char *out;
    if (stream) {
        out = strndup(j->out.p ? j->out.p : "", j->out.len);
        *n_events = 0;
        for (const char *p = out; (p = strstr(p, "data: ")); p += 6) (*n_events)++;
    } else {
        out = j->body ? strdup(j->body) : NULL;
    }
    free(ids);
    td_job_unref(j);
    return out;
}

typedef struct {
    json_t *chunks; /* parsed data: objects */
    bool done;
} sse;

static sse parse_sse(const char *t) {
    sse r = {json_array(), false};
    const char *p = t;
    while (*p) {
        CHECK(!strncmp(p, "data: ", 6), "event starts with data: [%.40s]", p);
        if (strncmp(p, "data: ", 6)) break;
        p += 6;
        const char *e = strstr(p, "\n\n");
        CHECK(e != NULL, "event ends with a blank line");
        if (!e) break;
        if (!strncmp(p, "[DONE]", 6)) {
            r.done = true;
            CHECK(e[2] == 0, "[DONE] is last");
        } else {
            json_t *o = json_loadb(p, (size_t)(e - p), 0, NULL);
            CHECK(o != NULL, "chunk is JSON: %.*s", (int)(e - p), p);
            if (o) json_array_append_new(r.chunks, o);
        }
        p = e + 2;
    }
    return r;
}

static const char *S(const json_t *o, const char *path1, const char *path2) {
    const json_t *v = json_object_get(o, path1);
    if (path2) v = json_object_get(v, path2);
    return json_string_value(v);
}

static void test_stream_tools_xml(srv *s) {
    const char *out = "\nI should list files.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n"
                      "</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
                      "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
    int ne = 0;
    char *t = run_job(s, out, true, 2, true, true, TD_FINISH_STOP, &ne);
    if (!t) return;
    sse r = parse_sse(t);
    CHECK(r.done, "ends with [DONE]");
    size_t n = json_array_size(r.chunks), i;
    CHECK(n >= 6, "chunks: %zu", n);
    json_t *c;
    sbuf reasoning = {0}, content = {0}, args[2] = {{0}, {0}};
    int starts = 0, finals = 0;
    const char *names[2] = {0}, *ids[2] = {0};
    json_array_foreach(r.chunks, i, c) {
        CHECK(!strcmp(S(c, "object", NULL), "chat.completion.chunk"), "object");
        json_t *choices = json_object_get(c, "choices");
        if (i == n - 1) { /* usage chunk */
            CHECK(json_array_size(choices) == 0, "usage chunk has choices []");
            json_t *u = json_object_get(c, "usage");
            CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 7, "usage prompt");
            CHECK(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 3, "cached");
            continue;
        }
        json_t *ch = json_array_get(choices, 0), *d = json_object_get(ch, "delta");
        if (i == 0) CHECK(!strcmp(S(d, "role", NULL), "assistant"), "first delta has the role");
        else CHECK(!json_object_get(d, "role"), "role only first");
        const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
        if (fr) {
            finals++;
            CHECK(!strcmp(fr, "tool_calls"), "finish_reason %s", fr);
        }
        if (S(d, "reasoning_content", NULL)) td_sb_adds(&reasoning, S(d, "reasoning_content", NULL));
        if (S(d, "content", NULL)) td_sb_adds(&content, S(d, "content", NULL));
        json_t *tc = json_object_get(d, "tool_calls");
        if (tc) {
            CHECK(json_array_size(tc) == 1, "one fragment per chunk");
            json_t *f = json_array_get(tc, 0);
            json_int_t idx = json_integer_value(json_object_get(f, "index"));
            CHECK(idx >= 0 && idx < 2, "index");
            if (idx < 0 || idx > 1) continue;
            if (json_object_get(f, "id")) {
                starts++;
                CHECK(!strcmp(S(f, "type", NULL), "function"), "type function");
                CHECK(S(f, "function", "arguments") && !strcmp(S(f, "function", "arguments"), ""), "first fragment arguments \"\"");
                names[idx] = S(f, "function", "name");
                ids[idx] = S(f, "id", NULL);
                CHECK(args[idx].len == 0, "start before arguments");
            } else {
                CHECK(names[idx] != NULL, "arguments after the start");
                CHECK(!json_object_get(json_object_get(f, "function"), "name"), "name only in the first fragment");
                td_sb_adds(&args[idx], S(f, "function", "arguments"));
            }
        }
    }
    CHECK(finals == 1 && starts == 2, "finals %d starts %d", finals, starts);
    CHECK(reasoning.p && !strcmp(reasoning.p, "I should list files.\n"), "reasoning [%s]", reasoning.p);
    CHECK(content.p && !strcmp(content.p, "Let me check.\n\n"), "content [%s]", content.p);
    CHECK(names[0] && !strcmp(names[0], "run") && names[1] && !strcmp(names[1], "get_weather"), "names");
    CHECK(ids[0] && ids[1] && strcmp(ids[0], ids[1]), "distinct ids");
    json_t *a0 = json_loads(args[0].p ? args[0].p : "", 0, NULL), *w0 = json_pack("{s:s, s:i}", "cmd", "ls -la", "timeout", 30);
    json_t *a1 = json_loads(args[1].p ? args[1].p : "", 0, NULL), *w1 = json_pack("{s:s}", "city", "Paris");
    CHECK(json_equal(a0, w0), "args 0 [%s]", args[0].p);
    CHECK(json_equal(a1, w1), "args 1 [%s]", args[1].p);
    json_decref(a0), json_decref(w0), json_decref(a1), json_decref(w1);
    td_sb_free(&reasoning), td_sb_free(&content), td_sb_free(&args[0]), td_sb_free(&args[1]);
    json_decref(r.chunks);
    free(t);
}

static void test_nonstream_hermes(srv *s) {
    const char *out = "<think>\nweather?\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    int ne;
    char *t = run_job(s, out, false, 1, true, false, TD_FINISH_STOP, &ne);
    json_t *o = t ? json_loads(t, 0, NULL) : NULL;
    CHECK(o != NULL, "body JSON");
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0), *m = json_object_get(ch, "message");
    CHECK(!strcmp(S(ch, "finish_reason", NULL), "tool_calls"), "finish tool_calls");
    CHECK(json_is_null(json_object_get(m, "content")), "content null with tool calls");
    CHECK(S(m, "reasoning_content", NULL) && !strcmp(S(m, "reasoning_content", NULL), "weather?\n"), "reasoning");
    json_t *tc = json_array_get(json_object_get(m, "tool_calls"), 0);
    CHECK(!strcmp(S(tc, "type", NULL), "function") && !strcmp(S(tc, "function", "name"), "get_weather"), "call");
    json_t *a = json_loads(S(tc, "function", "arguments"), 0, NULL), *w = json_pack("{s:s}", "city", "Paris");
    CHECK(json_equal(a, w), "arguments [%s]", S(tc, "function", "arguments"));
    CHECK(json_integer_value(json_object_get(json_object_get(o, "usage"), "total_tokens")) > 7, "usage");
    json_decref(a), json_decref(w), json_decref(o);
    free(t);
}

static void test_plain(srv *s) {
    /* Thinking off / no tools: everything is content; length finish. */
    int ne = 0;
    char *t = run_job(s, "<think>not reasoning</think> <tool_call>{}</tool_call>", true, 0, false, false, TD_FINISH_LENGTH, &ne);
    if (!t) return;
    sse r = parse_sse(t);
    sbuf content = {0};
    size_t i;
    json_t *c;
    const char *fin = NULL;
    json_array_foreach(r.chunks, i, c) {
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0), *d = json_object_get(ch, "delta");
        CHECK(!json_object_get(d, "reasoning_content") && !json_object_get(d, "tool_calls"), "content only");
        if (S(d, "content", NULL)) td_sb_adds(&content, S(d, "content", NULL));
        if (json_string_value(json_object_get(ch, "finish_reason"))) fin = json_string_value(json_object_get(ch, "finish_reason"));
    }
    CHECK(content.p && !strcmp(content.p, "<think>not reasoning</think> <tool_call>{}</tool_call>"), "content [%s]", content.p);
    CHECK(fin && !strcmp(fin, "length"), "finish length");
    CHECK(json_array_size(json_object_get(json_array_get(r.chunks, json_array_size(r.chunks) - 1), "choices")) == 1,
          "no usage chunk unless asked");
    td_sb_free(&content);
    json_decref(r.chunks);
    free(t);
}

int main(void) {
    td_err err = {0};
    srv s;
    memset(&s, 0, sizeof s);
    if (td_tok_load(MODEL, &s.tok, &err)) {
        printf("test_server_stream: cannot load %s (%s); run from the repository root\n", MODEL, err.msg);
        return 1;
    }
    td_metrics_init(&s.metrics);
    pthread_mutex_init(&s.jobs_mu, NULL);
    pthread_cond_init(&s.jobs_cv, NULL);
    pthread_rwlock_init(&s.sched_lock, NULL);
    s.model_name = "tiny";
    s.model_dir = (char *)MODEL;
    s.n_ctx = 4096;
    s.vocab = td_tok_vocab_size(s.tok);
    s.cfg.quiet = true;
    td_sampling_default(&s.cfg.sampling);
    test_stream_tools_xml(&s);
    test_nonstream_hermes(&s);
    test_plain(&s);
    CHECK(s.n_open == 0, "every job freed (%d open)", s.n_open);
    td_tok_free(s.tok);
    td_metrics_destroy(&s.metrics);
    TEST_MAIN_END("test_server_stream");
}
