/* The server's incremental output parsers (src/server/chat_parse.c):
 * <think> reasoning split, hermes JSON tool calls, Qwen3.5 XML tool calls
 * (with schema-typed parameter values), and the stop-string matcher.
 *
 * Input: 4 config bytes, then the model output text. Config: reasoning mode
 * (0/1/2), parse_tools, which tools array, stop strings taken from the
 * text, and a seed for the fragment sizes. The same text is fed three ways
 * (all at once, byte by byte, in seeded random fragments). Checks: no
 * crash/leak; the parsers' output does not depend on how the text was cut
 * (events are compared after merging consecutive pieces of the same kind
 * and index); the stop matcher keeps its contract (see check_stop) for each
 * of the three ways. */
#include <jansson.h>
#include "fuzz_util.h"
#include "server/chat_parse.h"

static json_t *g_tools[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_tools[0] = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"run\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"cmd\":{\"type\":\"string\"},\"timeout\":{\"type\":\"integer\"},\"ratio\":{\"type\":\"number\"},\"force\":{\"type\":\"boolean\"},"
        "\"args\":{\"type\":\"array\"},\"env\":{\"type\":\"object\"},\"opt\":{\"type\":[\"string\",\"null\"]},\"any\":{}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"city\":{\"type\":\"string\"}}}}}]",
        0, NULL);
    g_tools[1] = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}, {\"function\":{\"name\":\"g\",\"parameters\":"
                            "{\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":7}}}}]",
                            0, NULL);
    if (!g_tools[0] || !g_tools[1]) abort();
    return 0;
}

typedef struct ev {
    int kind, index;
    sbuf text;
    char *id, *name;
} ev;
typedef struct rec {
    ev *v;
    int n, cap;
} rec;

static int on_event(void *user, const cp_event *e) {
    rec *r = user;
    FUZZ_ASSERT(e->kind >= CP_REASONING && e->kind <= CP_TOOL_ARGS, "kind %d", e->kind);
    FUZZ_ASSERT(e->len == 0 || e->text, "text pointer");
    if (e->kind == CP_TOOL_START) FUZZ_ASSERT(e->id && e->name, "tool start without id/name");
    ev *last = r->n ? &r->v[r->n - 1] : NULL;
    if (last && e->kind != CP_TOOL_START && last->kind == (int)e->kind && last->index == e->index) {
        td_sb_add(&last->text, e->text, e->len);
        return 0;
    }
    if (e->kind != CP_TOOL_START && e->len == 0) return 0;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 16;
        r->v = realloc(r->v, (size_t)r->cap * sizeof *r->v);
    }
    ev *n = &r->v[r->n++];
    memset(n, 0, sizeof *n);
    n->kind = (int)e->kind;
    n->index = e->index;
    if (e->len) td_sb_add(&n->text, e->text, e->len);
    if (e->kind == CP_TOOL_START) n->id = strdup(e->id), n->name = strdup(e->name);
    return 0;
}

static void rec_free(rec *r) {
    for (int i = 0; i < r->n; i++) td_sb_free(&r->v[i].text), free(r->v[i].id), free(r->v[i].name);
    free(r->v);
}

static uint32_t rnd(uint32_t *s) {
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return *s;
}

/* how: 0 whole, 1 bytes, 2 random fragments */
static void run_cp(const cp_config *cfg, const char *t, size_t n, int how, uint32_t seed, rec *r) {
    chat_parser p;
    td_cp_init(&p, cfg, on_event, r);
    td_err err = {0};
    for (size_t i = 0; i < n;) {
        size_t k = how == 0 ? n - i : how == 1 ? 1 : 1 + rnd(&seed) % 9;
        if (k > n - i) k = n - i;
        FUZZ_ASSERT(td_cp_push(&p, t + i, k, &err) == 0, "td_cp_push: %s", err.msg);
        i += k;
    }
    FUZZ_ASSERT(td_cp_finish(&p, &err) == 0, "td_cp_finish: %s", err.msg);
    td_cp_free(&p);
}

static bool same(const rec *a, const rec *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++) {
        const ev *x = &a->v[i], *y = &b->v[i];
        if (x->kind != y->kind || x->index != y->index || x->text.len != y->text.len ||
            (x->text.len && memcmp(x->text.p, y->text.p, x->text.len)))
            return false;
        if ((x->name || y->name) && (!x->name || !y->name || strcmp(x->name, y->name) || strcmp(x->id, y->id))) return false;
    }
    return true;
}

static void run_stop(stop_matcher *m, const char *t, size_t n, int how, uint32_t seed, sbuf *out, int *hit) {
    td_err err = {0};
    *hit = 0;
    for (size_t i = 0; i < n && !*hit;) {
        size_t k = how == 0 ? n - i : how == 1 ? 1 : 1 + rnd(&seed) % 9;
        if (k > n - i) k = n - i;
        int rc = td_stop_push(m, t + i, k, out, &err);
        FUZZ_ASSERT(rc == 0 || rc == 1, "td_stop_push %d", rc);
        *hit = rc;
        i += k;
    }
    if (!*hit) FUZZ_ASSERT(td_stop_flush(m, out, &err) == 0, "td_stop_flush");
}

/* Stop matching is checked against its contract, not for equality across
 * fragmentations: with overlapping stop strings the first one to complete
 * wins, which depends on where the text was cut (as in vLLM, which checks
 * after each token). Contract: a stop is hit iff the text holds one; the
 * released text ends where some stop occurrence starts (or ends, with
 * include_stop) and holds no complete stop string before that point;
 * with no hit everything is released. */
static void check_stop(const char *t, size_t n, const char *const *stops, int ns, bool inc, const sbuf *out, int hit, int how) {
    bool any = false;
    for (int i = 0; i < ns; i++) any |= memmem(t, n, stops[i], strlen(stops[i])) != NULL;
    FUZZ_ASSERT(hit == any, "hit %d but the text %s a stop string (way %d)", hit, any ? "holds" : "holds no", how);
    FUZZ_ASSERT(out->len <= n && (!out->len || !memcmp(out->p, t, out->len)), "released text is not a prefix of the input (way %d)", how);
    if (!hit) {
        FUZZ_ASSERT(out->len == n, "no stop, but %zu of %zu bytes released (way %d)", out->len, n, how);
        return;
    }
    /* some stop occurrence ends the released text and no stop is complete before it */
    bool ok = false;
    for (int i = 0; i < ns && !ok; i++) {
        size_t l = strlen(stops[i]);
        if (inc && out->len < l) continue;
        size_t q = inc ? out->len - l : out->len;
        if (q + l > n || memcmp(t + q, stops[i], l)) continue;
        bool clean = true;
        for (int k = 0; k < ns && clean; k++) clean = !q || !memmem(t, q, stops[k], strlen(stops[k]));
        ok = clean;
    }
    FUZZ_ASSERT(ok, "released text (%zu bytes) does not end at the first stop string (way %d)", out->len, how);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    cp_config cfg = {.reasoning = data[0] % 3, .parse_tools = data[0] & 4, .tools = (data[0] & 8) ? g_tools[(data[0] >> 4) & 1] : NULL,
                     .id_seed = data[1]};
    uint32_t seed = (uint32_t)data[2] * 2654435761u + 1;
    const char *t = (const char *)data + 4;
    size_t n = size - 4;
    rec r[3] = {{0}};
    for (int how = 0; how < 3; how++) run_cp(&cfg, t, n, how, seed, &r[how]);
    FUZZ_ASSERT(same(&r[0], &r[1]), "byte-by-byte differs from whole (%d vs %d events)", r[0].n, r[1].n);
    FUZZ_ASSERT(same(&r[0], &r[2]), "fragments differ from whole (%d vs %d events)", r[0].n, r[2].n);
    for (int i = 0; i < 3; i++) rec_free(&r[i]);
    (void)td_cp_reasoning_mode(t, n, data[0] & 32);

    /* stop strings: up to 3 taken from the text itself, lengths from data[3] */
    const char *stops[3];
    char buf[3][16];
    int ns = 0;
    for (int i = 0; i < 3 && n; i++) {
        size_t l = 1 + ((data[3] >> (2 * i)) & 3) * 3, off = (size_t)((data[1] + 7 * i) % n);
        if (off + l > n) l = n - off;
        memcpy(buf[i], t + off, l);
        buf[i][l] = 0;
        if (i == 0 && (data[3] & 128) && l) buf[i][l - 1] ^= 1; /* often not in the text */
        if (strlen(buf[i])) stops[ns++] = buf[i];
    }
    if (!ns) return 0;
    bool inc = data[3] & 64;
    sbuf out[3] = {{0}};
    int hit[3];
    for (int how = 0; how < 3; how++) {
        stop_matcher m;
        td_err err = {0};
        FUZZ_ASSERT(td_stop_init(&m, stops, ns, inc, &err) == 0, "td_stop_init: %s", err.msg);
        run_stop(&m, t, n, how, seed, &out[how], &hit[how]);
        td_stop_free(&m);
    }
    for (int how = 0; how < 3; how++) check_stop(t, n, stops, ns, inc, &out[how], hit[how], how);
    for (int i = 0; i < 3; i++) td_sb_free(&out[i]);
    return 0;
}
