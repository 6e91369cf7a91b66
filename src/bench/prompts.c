/* The prompt suite (bench/prompts/TASK/NAME.txt or .json) and chat rendering. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench/runner.h"
#include "template/template.h"
#include "util/err.h"

double td_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double td_bench_load1(void) {
    double l[1];
    return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static char *read_file(const char *path, size_t *len, td_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { TD_FAIL(err, TD_ERR_IO, "cannot open %s", path); return NULL; }
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); TD_FAIL(err, TD_ERR_NOMEM, "out of memory reading %s", path); return NULL; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); TD_FAIL(err, TD_ERR_IO, "read error on %s", path); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}

static json_t *load_messages(const char *path, td_err *err) {
    size_t len;
    char *text = read_file(path, &len, err);
    if (!text) return NULL;
    json_t *m = NULL;
    if (has_suffix(path, ".txt")) {
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) text[--len] = 0;
        m = json_pack("[{s:s, s:s%}]", "role", "user", "content", text, len);
        if (!m) TD_FAIL(err, TD_ERR_FORMAT, "%s: not valid UTF-8 text", path);
    } else {
        json_error_t je;
        json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
        if (!j) {
            TD_FAIL(err, TD_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        } else {
            json_t *msgs = json_is_array(j) ? j : json_object_get(j, "messages");
            if (!json_is_array(msgs) || !json_array_size(msgs)) TD_FAIL(err, TD_ERR_FORMAT, "%s: no \"messages\" array", path);
            else m = json_incref(msgs);
            json_decref(j);
        }
    }
    free(text);
    return m;
}

int td_bench_prompts_load(const char *dir, const bench_suite *su, bench_prompts *out, td_err *err) {
    memset(out, 0, sizeof *out);
    for (int t = 0; t < su->n_tasks; t++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, su->tasks[t]);
        DIR *d = opendir(path);
        if (!d) { td_bench_prompts_free(out); return TD_FAIL(err, TD_ERR_IO, "no prompt directory %s for task \"%s\"", path, su->tasks[t]); }
        char *names[256];
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d)) && n < 256)
            if (e->d_name[0] != '.' && (has_suffix(e->d_name, ".txt") || has_suffix(e->d_name, ".json"))) names[n++] = strdup(e->d_name);
        closedir(d);
        qsort(names, (size_t)n, sizeof *names, by_name);
        int rc = 0;
        out->p[t] = calloc((size_t)(n ? n : 1), sizeof(bench_prompt));
        if (!out->p[t]) rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++) {
            if (!rc && !names[i]) rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
            if (!rc) {
                char fp[8192];
                snprintf(fp, sizeof fp, "%s/%s", path, names[i]);
                bench_prompt *p = &out->p[t][out->n[t]];
                snprintf(p->name, sizeof p->name, "%s", names[i]);
                char *dot = strrchr(p->name, '.');
                if (dot) *dot = 0;
                if (!(p->messages = load_messages(fp, err))) rc = err ? err->code : TD_ERR_FORMAT;
                else out->n[t]++;
            }
            free(names[i]);
        }
        if (!rc && !out->n[t]) rc = TD_FAIL(err, TD_ERR_IO, "no prompts (*.txt, *.json) in %s", path);
        if (rc) { td_bench_prompts_free(out); return rc; }
    }
    return TD_OK;
}

void td_bench_prompts_free(bench_prompts *p) {
    for (int t = 0; t < BENCH_MAX_TASKS; t++) {
        for (int i = 0; p->p[t] && i < p->n[t]; i++) json_decref(p->p[t][i].messages);
        free(p->p[t]);
        p->p[t] = NULL;
        p->n[t] = 0;
    }
}

/* ---- chat rendering ---------------------------------------------------------------- */

int td_bench_chat_init(bench_chat *c, const tokenizer *tok, td_err *err) {
    c->tok = tok;
    c->tpl = NULL;
    const char *src = td_tok_chat_template(tok);
    if (!src) return TD_FAIL(err, TD_ERR_FORMAT, "the model has no chat template");
    tpl *t = NULL;
    int rc = td_tpl_parse(src, strlen(src), &t, err);
    c->tpl = t;
    return rc;
}

void td_bench_chat_free(bench_chat *c) {
    td_tpl_free(c->tpl);
    c->tpl = NULL;
}

/* OpenAI messages -> what templates expect: tool-call arguments as objects. */
static json_t *normalize(const json_t *messages) {
    json_t *m = json_deep_copy(messages);
    size_t i, k;
    json_t *msg, *call;
    json_array_foreach(m, i, msg) {
        json_t *calls = json_object_get(msg, "tool_calls");
        json_array_foreach(calls, k, call) {
            json_t *f = json_object_get(call, "function");
            json_t *args = json_object_get(f, "arguments");
            if (json_is_string(args)) {
                json_t *o = json_loads(json_string_value(args), 0, NULL);
                if (json_is_object(o)) json_object_set(f, "arguments", o);
                json_decref(o);
            }
        }
        if (json_is_null(json_object_get(msg, "content"))) json_object_set_new(msg, "content", json_string(""));
    }
    return m;
}

int td_bench_chat_encode(bench_chat *c, const json_t *messages, const json_t *tools, int32_t **ids, size_t *n, td_err *err) {
    json_t *msgs = normalize(messages);
    json_t *kw = json_pack("{s:b}", "enable_thinking", 0);
    if (!msgs || !kw) { json_decref(msgs); json_decref(kw); return TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); }
    tpl_chat_args a = {.messages = msgs, .tools = tools, .kwargs = kw, .add_generation_prompt = true,
                       .bos_token = td_tok_bos_token(c->tok), .eos_token = td_tok_eos_token(c->tok),
                       .pad_token = td_tok_pad_token(c->tok), .unk_token = td_tok_unk_token(c->tok)};
    char *text = NULL;
    size_t len = 0;
    int rc = td_tpl_apply_chat(c->tpl, &a, &text, &len, err);
    if (!rc) rc = td_tok_encode(c->tok, text, len, false, ids, n, err);
    free(text);
    json_decref(msgs);
    json_decref(kw);
    return rc;
}
