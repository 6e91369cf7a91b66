/* Jinja lexer, parser and renderer (src/template) on arbitrary template
 * source. Each input is parsed; a template that parses is rendered twice:
 * td_tpl_apply_chat with a fixed small conversation (system, user, an
 * assistant turn with reasoning and a tool call, a tool result, user;
 * one tool; add_generation_prompt and enable_thinking from the parsed
 * conversation) and td_tpl_render with a plain context. The engine's
 * per-render limits (src/template/README.md: steps, output, items,
 * memory, 2 s wall clock, recursion) must turn every hostile template into
 * an error; a crash, hang (libFuzzer -timeout) or leak is a finding. */
#include <jansson.h>
#include "fuzz_util.h"
#include "template/template.h"

static json_t *g_msgs, *g_tools, *g_kwargs[2], *g_ctx;

static const char MSGS[] =
    "[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
    "{\"role\":\"user\",\"content\":\"What is the weather in Paris? \\u00e9\\u4f60\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Call the tool.\","
    "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"{\\\"temp\\\": 21.5}\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>\\nok\\n</think>\\n\\nIt is 21.5 C.\"},"
    "{\"role\":\"user\",\"content\":\"Thanks!\"}]";
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},"
    "\"required\":[\"city\"]}}}]";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_msgs = json_loads(MSGS, 0, NULL);
    g_tools = json_loads(TOOLS, 0, NULL);
    g_kwargs[0] = json_pack("{s:b}", "enable_thinking", 0);
    g_kwargs[1] = json_pack("{s:b, s:s}", "enable_thinking", 1, "custom", "x");
    g_ctx = json_pack("{s:O, s:O, s:b, s:s, s:s, s:i, s:f, s:[i,i,i], s:{s:s}, s:n}", "messages", g_msgs, "tools", g_tools,
                      "add_generation_prompt", 1, "bos_token", "<s>", "eos_token", "</s>", "n", 3, "x", 2.5, "list", 1, 2, 3, "obj",
                      "k", "v", "none");
    if (!g_msgs || !g_tools || !g_kwargs[0] || !g_kwargs[1] || !g_ctx) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tpl *t = NULL;
    td_err err = {0};
    if (td_tpl_parse((const char *)data, size, &t, &err)) {
        FUZZ_ASSERT(t == NULL && err.msg[0], "parse error without a message");
        return 0;
    }
    unsigned h = size ? data[size - 1] : 0;
    tpl_chat_args a = {.messages = g_msgs, .tools = (h & 1) ? g_tools : NULL, .kwargs = g_kwargs[(h >> 1) & 1],
                       .add_generation_prompt = (h >> 2) & 1, .bos_token = "<s>", .eos_token = "<|im_end|>"};
    char *out = NULL;
    size_t len = 0;
    if (td_tpl_apply_chat(t, &a, &out, &len, &err) == 0) {
        FUZZ_ASSERT(out && strlen(out) <= len, "output length");
        free(out);
    } else {
        FUZZ_ASSERT(err.msg[0], "render error without a message");
    }
    out = NULL;
    if (td_tpl_render(t, g_ctx, &out, &len, &err) == 0) free(out);
    td_tpl_free(t);
    return 0;
}
