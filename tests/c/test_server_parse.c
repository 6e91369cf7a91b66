/* Unit tests of the server's output parsers (src/server/chat_parse.c):
 * stop strings, <think> reasoning split, Qwen3 hermes and Qwen3.5 XML tool
 * calls, fed whole, token-sized and byte by byte; results must not depend
 * on how the text is split. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "server/chat_parse.h"

#define MAXC 8
typedef struct {
    sbuf reasoning, content;
    int n_calls;
    char name[MAXC][64], id[MAXC][64];
    sbuf args[MAXC];
    int order_bad;   /* args before start, wrong index, duplicate start */
} rec;

static int on_ev(void *u, const cp_event *ev) {
    rec *r = u;
    switch (ev->kind) {
    case CP_REASONING: td_sb_add(&r->reasoning, ev->text, ev->len); break;
    case CP_CONTENT: td_sb_add(&r->content, ev->text, ev->len); break;
    case CP_TOOL_START:
        if (ev->index != r->n_calls || ev->index >= MAXC) { r->order_bad++; break; }
        snprintf(r->name[ev->index], 64, "%s", ev->name);
        snprintf(r->id[ev->index], 64, "%s", ev->id);
        r->n_calls++;
        break;
    case CP_TOOL_ARGS:
        if (ev->index != r->n_calls - 1 || ev->index < 0) { r->order_bad++; break; }
        td_sb_add(&r->args[ev->index], ev->text, ev->len);
        break;
    }
    return 0;
}

static void rec_free(rec *r) {
    td_sb_free(&r->reasoning);
    td_sb_free(&r->content);
    for (int i = 0; i < MAXC; i++) td_sb_free(&r->args[i]);
}

static const char *S(const sbuf *b) { return b->p ? b->p : ""; }

/* chunk: 0 = whole, else fixed size in bytes. */
static void parse(const char *text, int mode, bool tools_on, const json_t *tools, size_t chunk, rec *r) {
    memset(r, 0, sizeof *r);
    chat_parser p;
    cp_config cfg = {.reasoning = mode, .parse_tools = tools_on, .tools = tools, .id_seed = 42};
    td_cp_init(&p, &cfg, on_ev, r);
    td_err err = {0};
    size_t n = strlen(text);
    if (!chunk) chunk = n ? n : 1;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        CHECK(td_cp_push(&p, text + i, k, &err) == 0, "push: %s", err.msg);
    }
    CHECK(td_cp_finish(&p, &err) == 0, "finish: %s", err.msg);
    td_cp_free(&p);
}

static const size_t chunks[] = {0, 1, 2, 3, 5, 7, 11};
#define NCHUNK (sizeof chunks / sizeof chunks[0])

/* Checks reasoning/content and call names/args (args compared as JSON). */
static void expect(const char *label, const char *text, int mode, const json_t *tools, const char *reasoning, const char *content,
                   int n_calls, const char *const *names, const char *const *args) {
    for (size_t c = 0; c < NCHUNK; c++) {
        rec r;
        parse(text, mode, true, tools, chunks[c], &r);
        CHECK(!strcmp(S(&r.reasoning), reasoning), "%s chunk %zu: reasoning [%s] want [%s]", label, chunks[c], S(&r.reasoning),
              reasoning);
        CHECK(!strcmp(S(&r.content), content), "%s chunk %zu: content [%s] want [%s]", label, chunks[c], S(&r.content), content);
        CHECK(r.n_calls == n_calls, "%s chunk %zu: %d calls want %d", label, chunks[c], r.n_calls, n_calls);
        CHECK(r.order_bad == 0, "%s chunk %zu: fragments out of order", label, chunks[c]);
        for (int i = 0; i < n_calls && i < r.n_calls; i++) {
            CHECK(!strcmp(r.name[i], names[i]), "%s: call %d name %s want %s", label, i, r.name[i], names[i]);
            CHECK(!strncmp(r.id[i], "call_", 5) && strlen(r.id[i]) == 29, "%s: id %s", label, r.id[i]);
            json_t *got = json_loads(S(&r.args[i]), 0, NULL), *want = json_loads(args[i], 0, NULL);
            CHECK(got && want && json_equal(got, want), "%s chunk %zu: call %d args [%s] want [%s]", label, chunks[c], i,
                  S(&r.args[i]), args[i]);
            json_decref(got);
            json_decref(want);
        }
        if (n_calls == 2 && r.n_calls == 2) CHECK(strcmp(r.id[0], r.id[1]) != 0, "%s: distinct ids", label);
        rec_free(&r);
    }
}

static void test_reasoning(void) {
    expect("think-in-prompt", "\nLet me think.\n</think>\n\nHello!", 2, NULL, "Let me think.\n", "Hello!", 0, NULL, NULL);
    expect("think-in-output", "<think>\nabc\n</think>\n\nxyz", 1, NULL, "abc\n", "xyz", 0, NULL, NULL);
    expect("no-think", "Hello <b>bold</b> <th", 1, NULL, "", "Hello <b>bold</b> <th", 0, NULL, NULL);
    expect("thinking-off", "<think>a</think>b", 0, NULL, "", "<think>a</think>b", 0, NULL, NULL);
    expect("unterminated-thinking", "\nstill thinking <", 2, NULL, "still thinking <", "", 0, NULL, NULL);
    expect("empty", "", 2, NULL, "", "", 0, NULL, NULL);
    expect("lt-in-reasoning", "a </thin b</think>c", 2, NULL, "a </thin b", "c", 0, NULL, NULL);
}

static void test_hermes(void) {
    const char *n1[] = {"get_weather"};
    const char *a1[] = {"{\"city\": \"Paris\", \"n\": [1, {\"a\": \"}\\\"\"}]}"};
    expect("hermes", "I'll call.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, {\"a\": \"}\\\"\"}]}}\n</tool_call>",
           1, NULL, "", "I'll call.\n", 1, n1, a1);
    const char *n2[] = {"a", "b"};
    const char *a2[] = {"{}", "{\"x\": 1}"};
    expect("hermes-two", "<think>\nhmm\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"x\": 1}, \"name\": \"b\"}\n</tool_call>",
           1, NULL, "hmm\n", "", 2, n2, a2);
    const char *a3[] = {"{\"q\": \"x\"}"};
    const char *n3[] = {"s"};
    expect("hermes-string-args", "<tool_call>{\"name\": \"s\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}</tool_call>", 0, NULL, "", "", 1, n3,
           a3);
    expect("not-a-call", "<tool_call>garbage</tool_call> after", 0, NULL, "", "<tool_call>garbage</tool_call> after", 0, NULL, NULL);
    const char *n4[] = {"t"};
    const char *a4[] = {"{\"k\": \"v\"}"};
    expect("hermes-unterminated", "<tool_call>\n{\"name\": \"t\", \"arguments\": {\"k\": \"v\"}}", 0, NULL, "", "", 1, n4, a4);
}

static void test_xml(void) {
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"run\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"cmd\":{\"type\":\"string\"},\"timeout\":{\"type\":\"integer\"},\"ratio\":{\"type\":\"number\"},"
        "\"flags\":{\"type\":\"object\"},\"list\":{\"type\":\"array\"},\"dry\":{\"type\":\"boolean\"},"
        "\"opt\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]},\"code\":{\"type\":\"string\"}}}}}]",
        0, NULL);
    CHECK(tools != NULL, "tools json");
    const char *n1[] = {"run"};
    const char *a1[] = {"{\"cmd\": \"ls -la\", \"timeout\": 30, \"ratio\": 0.5, \"flags\": {\"a\": true}, \"list\": [1, 2], \"dry\": false, "
                        "\"opt\": null, \"code\": \"if a < b:\\n    print(\\\"x\\\")\"}"};
    const char *xml = "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n"
                      "<parameter=ratio>\n0.5\n</parameter>\n<parameter=flags>\n{\"a\": true}\n</parameter>\n<parameter=list>\n[1, 2]\n"
                      "</parameter>\n<parameter=dry>\nfalse\n</parameter>\n<parameter=opt>\nnull\n</parameter>\n<parameter=code>\n"
                      "if a < b:\n    print(\"x\")\n</parameter>\n</function>\n</tool_call>";
    expect("xml", xml, 0, tools, "", "", 1, n1, a1);
    /* Qwen3.5: thinking opened by the prompt, content, then two calls. */
    const char *n2[] = {"run", "other"};
    const char *a2[] = {"{\"timeout\": 5}", "{}"};
    expect("xml-qwen35", "\nplan\n</think>\n\nDoing it.\n\n<tool_call>\n<function=run>\n<parameter=timeout>\n5\n</parameter>\n</function>\n"
           "</tool_call>\n<tool_call>\n<function=other>\n</function>\n</tool_call>",
           2, tools, "plan\n", "Doing it.\n\n", 2, n2, a2);
    /* Wrong types fall back to strings; unknown function: strings. */
    const char *n3[] = {"run"};
    const char *a3[] = {"{\"timeout\": \"soon\", \"dry\": \"maybe\"}"};
    expect("xml-fallback", "<tool_call>\n<function=run>\n<parameter=timeout>\nsoon\n</parameter>\n<parameter=dry>\nmaybe\n</parameter>\n"
           "</function>\n</tool_call>", 0, tools, "", "", 1, n3, a3);
    const char *n4[] = {"nope"};
    const char *a4[] = {"{\"x\": \"1\"}"};
    expect("xml-unknown-fn", "<tool_call>\n<function=nope>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>", 0, tools, "", "",
           1, n4, a4);
    /* Cut off by max_tokens inside a parameter. */
    const char *a5[] = {"{\"cmd\": \"abc\"}"};
    expect("xml-truncated", "<tool_call>\n<function=run>\n<parameter=cmd>\nabc", 0, tools, "", "", 1, n1, a5);
    /* Missing </parameter> before </function>. */
    const char *a6[] = {"{\"timeout\": 7}"};
    expect("xml-missing-endparam", "<tool_call>\n<function=run>\n<parameter=timeout>\n7\n</function>\n</tool_call>", 0, tools, "", "", 1, n1,
           a6);
    /* Tools off: text stays content. */
    rec r;
    parse(xml, 0, false, tools, 1, &r);
    CHECK(!strcmp(S(&r.content), xml) && r.n_calls == 0, "tools off: content kept");
    rec_free(&r);
    /* Direct conversions. */
    json_t *v = td_cp_convert_param(tools, "run", "ratio", " 2 ", 3);
    CHECK(json_is_integer(v) && json_integer_value(v) == 2, "number 2 -> integer");
    json_decref(v);
    v = td_cp_convert_param(tools, "run", "ratio", "1e3", 3);
    CHECK(json_is_real(v) && json_real_value(v) == 1000.0, "number 1e3");
    json_decref(v);
    v = td_cp_convert_param(tools, "run", "cmd", " 2 ", 3);
    CHECK(json_is_string(v) && !strcmp(json_string_value(v), " 2 "), "string kept verbatim");
    json_decref(v);
    v = td_cp_convert_param(NULL, "run", "timeout", "5", 1);
    CHECK(json_is_string(v), "no tools: string");
    json_decref(v);
    json_decref(tools);
}

static void stop_case(const char *label, const char *const *stops, int ns, const char *text, size_t chunk, const char *want, int want_hit) {
    stop_matcher m;
    td_err err = {0};
    CHECK(td_stop_init(&m, stops, ns, false, &err) == 0, "%s: init %s", label, err.msg);
    sbuf out = {0};
    int hit = 0;
    size_t n = strlen(text);
    if (!chunk) chunk = n ? n : 1;
    for (size_t i = 0; i < n && !hit; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        size_t before = out.len;
        hit = td_stop_push(&m, text + i, k, &out, &err);
        /* What is released must never contain a stop string's start that later completes. */
        (void)before;
    }
    if (!hit) td_stop_flush(&m, &out, &err);
    CHECK(!strcmp(S(&out), want), "%s chunk %zu: [%s] want [%s]", label, chunk, S(&out), want);
    CHECK(hit == want_hit, "%s chunk %zu: hit %d", label, chunk, hit);
    td_sb_free(&out);
    td_stop_free(&m);
}

static void test_stop(void) {
    const char *s1[] = {"STOP"};
    const char *s2[] = {"\n\n", "aab", "xyz"};
    const char *s3[] = {"é!"};
    for (size_t c = 0; c < NCHUNK; c++) {
        stop_case("simple", s1, 1, "abcSTOPdef", chunks[c], "abc", 1);
        stop_case("none", s1, 1, "abcSTOdef STO", chunks[c], "abcSTOdef STO", 0);
        stop_case("overlap", s2, 3, "xaaab", chunks[c], "xa", 1);
        stop_case("earliest", s2, 3, "q xyz\n\n", chunks[c], "q ", 1);
        stop_case("utf8", s3, 1, "café!", chunks[c], "caf", 1);
        stop_case("no-stops", NULL, 0, "anything", chunks[c], "anything", 0);
    }
    /* Held-back text is released only when it cannot start a stop string. */
    stop_matcher m;
    td_err err = {0};
    td_stop_init(&m, s1, 1, false, &err);
    sbuf out = {0};
    td_stop_push(&m, "abST", 4, &out, &err);
    CHECK(!strcmp(S(&out), "ab"), "held ST: [%s]", S(&out));
    td_stop_push(&m, "x", 1, &out, &err);
    CHECK(!strcmp(S(&out), "abSTx"), "released STx: [%s]", S(&out));
    td_sb_free(&out);
    td_stop_free(&m);
    /* include_stop_str_in_output */
    td_stop_init(&m, s1, 1, true, &err);
    CHECK(td_stop_push(&m, "aSTOPb", 6, &out, &err) == 1 && !strcmp(S(&out), "aSTOP"), "include stop");
    td_sb_free(&out);
    td_stop_free(&m);
    const char *empty[] = {""};
    CHECK(td_stop_init(&m, empty, 1, false, &err) == TD_ERR_ARG, "empty stop string refused");
    CHECK(td_cp_reasoning_mode("x<think>\n", 9, true) == 2, "mode 2");
    CHECK(td_cp_reasoning_mode("x<think>\n\n</think>\n\n", 20, true) == 1, "mode 1");
    CHECK(td_cp_reasoning_mode("x<think>\n", 9, false) == 0, "mode 0");
}

int main(void) {
    test_reasoning();
    test_hermes();
    test_xml();
    test_stop();
    TEST_MAIN_END("test_server_parse");
}
