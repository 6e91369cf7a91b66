/* The suite against an OpenAI-compatible server (tandem serve, vLLM,
 * llama.cpp): streamed /v1/chat/completions for TTFT and tokens/s,
 * acceptance from /metrics deltas around each request. */
#include <stdlib.h>
#include <string.h>
#include "bench/runner.h"
#include "util/err.h"

#define HTTP_TIMEOUT_S 600.0

/* ---- Prometheus text --------------------------------------------------------- */

static bool name_is(const char *name, size_t n, const char *want) {
    size_t w = strlen(want);
    if (n == w && !memcmp(name, want, n)) return true;
    return n == w + 6 && !memcmp(name, want, w) && !memcmp(name + w, "_total", 6);
}

void td_bench_metrics_parse(const char *text, bench_metrics *m) {
    memset(m, 0, sizeof *m);
    m->depth = -1;
    for (const char *p = text; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t ll = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        if (ll < sizeof line && *p != '#') {
            memcpy(line, p, ll);
            line[ll] = 0;
            size_t nl = strcspn(line, "{ \t");
            const char *labels = line[nl] == '{' ? line + nl + 1 : NULL;
            const char *val = labels ? strchr(labels, '}') : line + nl;
            double v = 0;
            if (val && sscanf(labels ? val + 1 : val, "%lf", &v) == 1) {
                int pos = -1;
                const char *pp = labels ? strstr(labels, "position=\"") : NULL;
                if (pp && pp < val) pos = atoi(pp + 10);
                if (name_is(line, nl, "vllm:spec_decode_num_drafts")) m->spec.drafts += (uint64_t)v, m->have_spec = true;
                else if (name_is(line, nl, "vllm:spec_decode_num_draft_tokens")) m->spec.draft_tokens += (uint64_t)v;
                else if (name_is(line, nl, "vllm:spec_decode_num_accepted_tokens")) m->spec.accepted_tokens += (uint64_t)v;
                else if (name_is(line, nl, "vllm:spec_decode_num_accepted_tokens_per_pos")) {
                    if (pos >= 0 && pos < TD_MAX_SPEC_DEPTH) m->spec.accepted_per_pos[pos] += (uint64_t)v;
                } else if (name_is(line, nl, "vllm:prefix_cache_queries")) m->prefix_queries += v;
                else if (name_is(line, nl, "vllm:prefix_cache_hits")) m->prefix_hits += v;
                else if (name_is(line, nl, "vllm:prompt_tokens")) m->prompt_tokens += v;
                else if (name_is(line, nl, "vllm:generation_tokens")) m->generation_tokens += v;
                else if (nl == strlen("tandem_spec_decode_depth") && !memcmp(line, "tandem_spec_decode_depth", nl)) m->depth = (int)v;
            }
        }
        p = eol ? eol + 1 : NULL;
    }
}

static int fetch_metrics(bench_remote *R, bench_metrics *m, td_err *err) {
    char *body = NULL;
    int status = 0;
    int rc = td_bench_http_fetch(&R->url, "GET", "/metrics", R->auth, NULL, 30, &status, &body, NULL, err);
    if (rc) return rc;
    if (status != 200) rc = TD_FAIL(err, TD_ERR_IO, "GET /metrics: HTTP %d", status);
    else td_bench_metrics_parse(body, m);
    free(body);
    return rc;
}

int td_bench_remote_open(const char *url, const char *api_key, const char *model, bench_remote *R, td_err *err) {
    memset(R, 0, sizeof *R);
    R->depth = -1;
    int rc = td_bench_url_parse(url, &R->url, err);
    if (rc) return rc;
    if (api_key) snprintf(R->auth, sizeof R->auth, "Authorization: Bearer %.256s\r\n", api_key);
    if (model) {
        snprintf(R->model, sizeof R->model, "%s", model);
    } else {
        char *body = NULL;
        int status = 0;
        if ((rc = td_bench_http_fetch(&R->url, "GET", "/v1/models", R->auth, NULL, 30, &status, &body, NULL, err))) return rc;
        json_t *j = status == 200 ? json_loads(body, 0, NULL) : NULL;
        const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
        if (id) snprintf(R->model, sizeof R->model, "%s", id);
        else rc = TD_FAIL(err, TD_ERR_IO, "GET %s/v1/models: HTTP %d, no model id (give --served-model NAME)", url, status);
        json_decref(j);
        free(body);
        if (rc) return rc;
    }
    bench_metrics m;
    td_err e2 = {0};
    if (fetch_metrics(R, &m, &e2) == 0) {
        R->metrics_ok = true;
        R->depth = m.depth;
    }
    return TD_OK;
}

/* ---- one streamed request ------------------------------------------------------- */

typedef struct sse {
    char *line;
    size_t len, cap;
    double t0, first, last;
    int chunks;                 /* chunks that carried output */
    json_t *usage;
    char error[512];
    bool done, oom;
} sse;

static bool nonempty_str(const json_t *j) { return json_is_string(j) && json_string_length(j) > 0; }

static void sse_event(sse *s, const char *data) {
    if (!strcmp(data, "[DONE]")) { s->done = true; return; }
    json_t *j = json_loads(data, 0, NULL);
    if (!j) return;
    json_t *e = json_object_get(j, "error");
    if (e && !s->error[0]) {
        const char *msg = json_string_value(json_object_get(e, "message"));
        snprintf(s->error, sizeof s->error, "%s", msg ? msg : "server error");
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) { json_decref(s->usage); s->usage = json_incref(u); }
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *d = json_object_get(c, "delta");
    bool out = nonempty_str(json_object_get(d, "content")) || nonempty_str(json_object_get(d, "reasoning_content")) ||
               nonempty_str(json_object_get(d, "reasoning")) || json_array_size(json_object_get(d, "tool_calls")) > 0 ||
               nonempty_str(json_object_get(c, "text"));
    if (out) {
        double t = td_bench_now();
        if (!s->first) s->first = t;
        s->last = t;
        s->chunks++;
    }
    json_decref(j);
}

static int sse_fn(void *u, const char *d, size_t n) {
    sse *s = u;
    for (size_t i = 0; i < n; i++) {
        char ch = d[i];
        if (ch == '\n') {
            if (s->len && s->line[s->len - 1] == '\r') s->len--;
            if (s->line) s->line[s->len] = 0;
            if (s->len > 5 && !strncmp(s->line, "data:", 5)) sse_event(s, s->line + 5 + (s->line[5] == ' '));
            else if (s->len && s->line[0] == '{') sse_event(s, s->line); /* a plain JSON error body */
            s->len = 0;
            if (s->done) return 1;
            continue;
        }
        if (s->len + 2 > s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 4096;
            char *p = realloc(s->line, cap);
            if (!p) { s->oom = true; return 1; }
            s->line = p;
            s->cap = cap;
        }
        s->line[s->len++] = ch;
    }
    return 0;
}

int td_bench_remote_run(bench_remote *R, const json_t *messages, const json_t *tools, const bench_params *p, bench_sample *out,
                     td_err *err) {
    bench_metrics before = {0}, after = {0};
    int rc = 0;
    if (R->metrics_ok && (rc = fetch_metrics(R, &before, err))) return rc;
    json_t *req = json_pack("{s:s, s:O, s:i, s:f, s:b, s:{s:b}, s:{s:b}}", "model", R->model, "messages", messages, "max_tokens",
                            p->max_tokens, "temperature", (double)p->sampling.temperature, "stream", 1, "stream_options",
                            "include_usage", 1, "chat_template_kwargs", "enable_thinking", 0);
    if (!req) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    if (p->ignore_eos) json_object_set_new(req, "ignore_eos", json_true());
    if (p->sampling.seed) json_object_set_new(req, "seed", json_integer((json_int_t)(p->sampling.seed & 0x7fffffff)));
    if (tools && json_array_size(tools)) json_object_set(req, "tools", (json_t *)tools);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!body) return TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    sse s = {0};
    int status = 0;
    out->cond.load1 = td_bench_load1();
    s.t0 = td_bench_now();
    rc = td_bench_http(&R->url, "POST", "/v1/chat/completions", R->auth, body, strlen(body), HTTP_TIMEOUT_S, &status, sse_fn, &s, err);
    double t_end = td_bench_now();
    free(body);
    if (!rc && s.oom) rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory reading the stream");
    if (!rc && status != 200)
        rc = TD_FAIL(err, TD_ERR_IO, "POST /v1/chat/completions: HTTP %d%s%s", status, s.error[0] ? ": " : "", s.error);
    if (!rc && s.error[0]) rc = TD_FAIL(err, TD_ERR_IO, "server error in the stream: %s", s.error);
    if (!rc && R->metrics_ok) rc = fetch_metrics(R, &after, err);
    if (!rc) {
        json_t *u = s.usage;
        int ct = (int)json_integer_value(json_object_get(u, "completion_tokens"));
        out->n_generated = u ? ct : s.chunks;
        out->n_prompt = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
        out->n_reused = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
        out->ttft_s = s.first ? s.first - s.t0 : t_end - s.t0;
        out->prefill_s = out->ttft_s;
        out->decode_s = s.first ? s.last - s.first : 0;
        if (R->metrics_ok) {
            td_spec_counters *c = &out->spec;
            c->drafts = after.spec.drafts - before.spec.drafts;
            c->draft_tokens = after.spec.draft_tokens - before.spec.draft_tokens;
            c->accepted_tokens = after.spec.accepted_tokens - before.spec.accepted_tokens;
            for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) c->accepted_per_pos[i] = after.spec.accepted_per_pos[i] - before.spec.accepted_per_pos[i];
        }
        out->cond.threads = 0;
        out->cond.max_tokens = p->max_tokens;
        out->cond.temperature = p->sampling.temperature;
        out->cond.engine_depth = R->depth;
        out->cond.ignore_eos = p->ignore_eos;
        snprintf(out->cond.backend, sizeof out->cond.backend, "http://%.64s:%.8s%.40s", R->url.host, R->url.port, R->url.path);
    }
    json_decref(s.usage);
    free(s.line);
    return rc;
}
