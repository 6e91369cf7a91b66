/* A chat template ships inside a downloaded model: it is untrusted code.
 * Every hostile template here must end in an error return with a message,
 * never a crash, an abort, a hang or unbounded memory. Each case runs in a
 * forked child with an alarm, so a crash or a hang is reported as a failure
 * of that case (signal number) instead of killing the whole test. */
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "template/template.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs fn(arg) in a child killed after timeout_s; its CHECK counts come
 * back through a pipe. A child that dies is one failure naming the signal
 * (SIGALRM: it hung). verbose prints a line per group. */
static void isolated_arg(const char *name, void (*fn)(const void *), const void *arg, unsigned timeout_s, bool verbose) {
    int fds[2];
    if (pipe(fds)) { CHECK(0, "%s: pipe failed", name); return; }
    fflush(stdout);
    fflush(stderr);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        alarm(timeout_s);
#ifndef __SANITIZE_ADDRESS__ /* ASan reserves terabytes of address space */
        /* a template that ran away with memory fails its case, not the machine */
        struct rlimit rl = {(rlim_t)8 << 30, (rlim_t)8 << 30};
        setrlimit(RLIMIT_AS, &rl);
#endif
        check_passed = check_failed = 0;
        fn(arg);
        int counts[2] = {check_passed, check_failed};
        if (write(fds[1], counts, sizeof counts) != (ssize_t)sizeof counts) _exit(3);
        fflush(stderr);
        _exit(0);
    }
    close(fds[1]);
    if (pid < 0) { close(fds[0]); CHECK(0, "%s: fork failed", name); return; }
    int counts[2] = {0, 0};
    ssize_t got = read(fds[0], counts, sizeof counts);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    double dt = now_s() - t0;
    if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        CHECK(0, "%s: child killed by signal %d (%s) after %.1f s%s", name, sig, strsignal(sig), dt,
              sig == SIGALRM ? " -- hung" : "");
        return;
    }
    if (got != (ssize_t)sizeof counts || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        CHECK(0, "%s: child exited with status %d", name, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        return;
    }
    check_passed += counts[0];
    check_failed += counts[1];
    if (verbose) fprintf(stderr, "  %-16s %3d passed, %d failed (%.2f s)\n", name, counts[0], counts[1], dt);
}

static void call_void(const void *fn) { ((void (*)(void))fn)(); }
static void isolated(const char *name, void (*fn)(void), unsigned timeout_s) {
    const char *only = getenv("TEST_ONLY"); /* e.g. TEST_ONLY=numbers: one group */
    if (only && *only && !strstr(name, only)) return;
    isolated_arg(name, call_void, (const void *)fn, timeout_s, true);
}

/* parse + render with no variables; *out is malloc'd on success */
static int run_src(const char *src, size_t n, char **out, size_t *len, td_err *err) {
    tpl *t = NULL;
    *out = NULL;
    *len = 0;
    int rc = td_tpl_parse(src, n, &t, err);
    if (rc == 0) rc = td_tpl_render(t, NULL, out, len, err);
    td_tpl_free(t);
    return rc;
}

/* The template must fail, with a message containing every needle ('|'
 * separates alternatives inside one needle), within max_s seconds. */
typedef struct { const char *what, *src, *needle; size_t n; double max_s; } expect_case;

static void expect_error_body(const void *arg) {
    const expect_case *e = arg;
    const char *what = e->what, *src = e->src, *needle = e->needle;
    size_t n = e->n;
    double max_s = e->max_s;
    td_err err = {0};
    char *out;
    size_t len;
    double t0 = now_s();
    int rc = run_src(src, n, &out, &len, &err);
    double dt = now_s() - t0;
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "  %-34s %.2f s  %s\n", what, dt, rc ? err.msg : "(no error)");
    CHECK(rc != 0, "%s: expected an error, got output of %zu bytes: %.80s", what, len, out ? out : "");
    if (rc == 0) { free(out); return; }
    CHECK(err.msg[0] != 0, "%s: error without a message", what);
    bool any = false;
    char alt[200];
    const char *p = needle;
    while (p && !any) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        snprintf(alt, sizeof alt, "%.*s", (int)l, p);
        any = strstr(err.msg, alt) != NULL;
        p = bar ? bar + 1 : NULL;
    }
    CHECK(any, "%s: message lacks '%s': %s", what, needle, err.msg);
    CHECK(dt < max_s, "%s: took %.2f s (limit %.1f s)", what, dt, max_s);
}
/* each case in its own child: a crash or hang fails that case only */
static void expect_error_n(const char *what, const char *src, size_t n, const char *needle, double max_s) {
    expect_case e = {what, src, needle, n, max_s};
    isolated_arg(what, expect_error_body, &e, (unsigned)(max_s * 3 + 10), false);
}
static void expect_error(const char *what, const char *src, const char *needle) {
    expect_error_n(what, src, strlen(src), needle, 5.0);
}

static void expect_output_body(const void *arg) {
    const expect_case *e = arg;
    const char *what = e->what, *src = e->src, *expected = e->needle;
    td_err err = {0};
    char *out;
    size_t len;
    int rc = run_src(src, strlen(src), &out, &len, &err);
    CHECK(rc == 0, "%s: %s", what, err.msg);
    if (rc) return;
    CHECK(len == strlen(expected) && !memcmp(out, expected, len), "%s: got '%.100s', expected '%s'", what, out, expected);
    free(out);
}
static void expect_output(const char *what, const char *src, const char *expected) {
    expect_case e = {what, src, expected, strlen(src), 0};
    isolated_arg(what, expect_output_body, &e, 20, false);
}

static char *repeat(const char *head, const char *unit, size_t k, const char *tail, size_t *n) {
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * k + tl + 1);
    memcpy(s, head, hl);
    for (size_t i = 0; i < k; i++) memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + ul * k, tail, tl + 1);
    *n = hl + ul * k + tl;
    return s;
}

/* ---- 1. nesting depth ---- */
static void nesting(void) {
    size_t n;
    char *s = malloc(50000);
    /* 20,000 nested parentheses */
    size_t k = 20000;
    char *p = malloc(2 * k + 16);
    size_t o = 0;
    o += (size_t)sprintf(p, "{{ ");
    for (size_t i = 0; i < k; i++) p[o++] = '(';
    p[o++] = '1';
    for (size_t i = 0; i < k; i++) p[o++] = ')';
    o += (size_t)sprintf(p + o, " }}");
    expect_error_n("20000 parentheses", p, o, "nest", 5.0);
    expect_error_n("20000 parentheses: position", p, o, "line 1 column", 5.0);
    free(p);
    /* 10,000 nested ifs */
    char *a = repeat("", "{% if true %}", 10000, "x", &n);
    char *b = repeat(a, "{% endif %}", 10000, "", &n);
    expect_error_n("10000 nested ifs", b, n, "nest", 5.0);
    free(a);
    free(b);
    /* other recursive paths of the parser */
    char *u = repeat("{{ ", "-", 100000, "1 }}", &n);
    expect_error_n("100000 unary minus", u, n, "nest", 5.0);
    free(u);
    u = repeat("{{ ", "not ", 100000, "1 }}", &n);
    expect_error_n("100000 not", u, n, "nest", 5.0);
    free(u);
    a = repeat("{{ ", "[", 20000, "1", &n);
    b = repeat(a, "]", 20000, " }}", &n);
    expect_error_n("20000 nested lists", b, n, "nest", 5.0);
    free(a);
    free(b);
    a = repeat("", "{% for x in [1] %}", 10000, "x", &n);
    b = repeat(a, "{% endfor %}", 10000, "", &n);
    expect_error_n("10000 nested fors", b, n, "nest", 5.0);
    free(a);
    free(b);
    /* flat chains the parser builds in a loop are deep trees: evaluating
     * them recursively must be bounded too */
    u = repeat("{{ 1", " + 1", 200000, " }}", &n);
    expect_error_n("200000-term sum", u, n, "nest", 5.0);
    free(u);
    u = repeat("{% set d = {} %}{{ d", ".a", 200000, " }}", &n);
    expect_error_n("200000 attribute chain", u, n, "nest", 5.0);
    free(u);
    u = repeat("{{ 'x'", "|trim", 200000, " }}", &n);
    expect_error_n("200000 filter chain", u, n, "nest", 5.0);
    free(u);
    /* values nested by a loop: printing them recurses */
    expect_error("1000000-deep list value",
                 "{% set ns = namespace(x=1) %}{% for i in range(1000000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
                 "nest");
    /* what real templates do stays fine: 100 levels of each */
    a = repeat("{{ ", "(", 100, "7", &n);
    b = repeat(a, ")", 100, " }}", &n);
    expect_output("100 parentheses", b, "7");
    free(a);
    free(b);
    a = repeat("", "{% if true %}", 100, "y", &n);
    b = repeat(a, "{% endif %}", 100, "", &n);
    expect_output("100 nested ifs", b, "y");
    free(a);
    free(b);
    u = repeat("{{ 0", " + 1", 500, " }}", &n); /* jinja2 itself fails at 1000 */
    expect_output("500-term sum", u, "500");
    free(u);
    expect_output("macro recursion 50 deep",
                  "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}done{% endif %}{% endmacro %}{{ f(50) }}", "done");
    free(s);
}

/* ---- 2, 4. integer arithmetic ---- */
static void arithmetic(void) {
    expect_error("INT64_MIN // -1", "{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow");
    expect_output("INT64_MIN % -1", "{{ (-9223372036854775807 - 1) % -1 }}", "0");
    expect_error("INT64_MAX + 1", "{{ 9223372036854775807 + 1 }}", "integer overflow");
    expect_error("INT64_MIN - 1", "{{ -9223372036854775807 - 2 }}", "integer overflow");
    expect_error("2^32 * 2^32", "{{ 4294967296 * 4294967296 }}", "integer overflow");
    expect_error("-INT64_MIN", "{{ -(-9223372036854775807 - 1) }}", "integer overflow");
    expect_error("2 ** 63", "{{ 2 ** 63 }}", "integer overflow");
    expect_error("3 ** 40", "{{ 3 ** 40 }}", "integer overflow");
    expect_error_n("2 ** INT64_MAX", "{{ 2 ** 9223372036854775807 }}", strlen("{{ 2 ** 9223372036854775807 }}"),
                   "integer overflow", 1.0);
    expect_error("sum overflow", "{{ [9223372036854775807, 1]|sum }}", "integer overflow");
    expect_error("abs(INT64_MIN)", "{{ (-9223372036854775807 - 1)|abs }}", "integer overflow");
    expect_error("1e300|int", "{{ 1e300|int }}", "integer overflow");
    expect_error("integer literal past int64", "{{ 9223372036854775808 }}", "line 1 column 4");
    expect_error("1 // 0", "{{ 1 // 0 }}", "zero");
    expect_error("1 % 0", "{{ 1 % 0 }}", "zero");
    expect_error("1 / 0", "{{ 1 / 0 }}", "zero");
    expect_error("1.5 // 0.0", "{{ 1.5 // 0.0 }}", "zero");
    expect_error("divisibleby 0", "{{ 4 is divisibleby 0 }}", "zero");
    /* the ordinary results, as Python gives them */
    expect_output("2 ** 62", "{{ 2 ** 62 }}", "4611686018427387904");
    expect_output("(-2) ** 63", "{{ (-2) ** 63 }}", "-9223372036854775808");
    expect_output("1 ** INT64_MAX", "{{ 1 ** 9223372036854775807 }}", "1");
    expect_output("(-1) ** INT64_MAX", "{{ (-1) ** 9223372036854775807 }}", "-1");
    expect_output("0 ** INT64_MAX", "{{ 0 ** 9223372036854775807 }}", "0");
    expect_output("floordiv / mod signs", "{{ -7 // 2 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** -1 }}",
                  "-4 -4 2 -2 0.5");
    expect_output("INT64_MIN literal expression", "{{ -9223372036854775807 - 1 }}", "-9223372036854775808");
    expect_output("range near INT64_MAX",
                  "{% for i in range(9223372036854775800, 9223372036854775807, 5) %}{{ i }} {% endfor %}",
                  "9223372036854775800 9223372036854775805 ");
    expect_output("range down near INT64_MIN",
                  "{% for i in range(-9223372036854775800, -9223372036854775807 - 1, -5) %}{{ i }} {% endfor %}",
                  "-9223372036854775800 -9223372036854775805 ");
    expect_output("slice with a huge step", "{{ 'abc'[2::9223372036854775807] }}{{ [1, 2, 3][1::9223372036854775807] }}",
                  "c[2]");
}

/* ---- 3. long number literals ---- */
static void numbers(void) {
    char src[600];
    /* 63 digits then ".5": wrote one byte past a 64-byte stack buffer */
    snprintf(src, sizeof src, "{{ %s.5 }}", "111111111111111111111111111111111111111111111111111111111111111");
    expect_output("63 digits + .5", src, "1.1111111111111112e+62");
    char digits[401];
    memset(digits, '1', 400);
    digits[400] = 0;
    snprintf(src, sizeof src, "{{ 0.%s }}", digits);
    expect_output("400-digit fraction", src, "0.1111111111111111");
    snprintf(src, sizeof src, "{{ %s.0 }}", digits);
    expect_output("400-digit float", src, "inf");
    snprintf(src, sizeof src, "{{ %s }}", digits);
    expect_error("400-digit integer", src, "integer literal");
    expect_output("underscores and exponents", "{{ 1_000_000 }} {{ 1_0.2_5 }} {{ 1e3 }} {{ 2.5E-3 }}", "1000000 10.25 1000.0 0.0025");
}

/* ---- 5, 7. work, size and time ---- */
static void work(void) {
    expect_error_n("'x' * 10**9", "{{ 'x' * 1000000000 }}", strlen("{{ 'x' * 1000000000 }}"), "too large", 1.0);
    expect_error_n("[1] * 10**9", "{{ [1] * 1000000000 }}", strlen("{{ [1] * 1000000000 }}"), "too large", 1.0);
    expect_error_n("range(10**12)", "{% for i in range(10**12) %}{% endfor %}",
                   strlen("{% for i in range(10**12) %}{% endfor %}"), "too large", 1.0);
    /* 10^10 iterations: ends at the step, memory or time limit, quickly */
    expect_error_n("nested 10^5 x 10^5 loops",
                   "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                   strlen("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                   "steps|memory|time", 4.0);
    /* cheap steps only: the step limit is what ends it */
    size_t n;
    char *s = repeat("{% for i in range(1000000) %}{{ 1", " and 1", 100, " }}{% endfor %}", &n);
    expect_error_n("10^8 expression steps", s, n, "steps|time", 4.0);
    free(s);
    /* output: 2^25 bytes by doubling, each string under the limit */
    expect_error_n("output over the limit",
                   "{% set s = 'x' * 4000000 %}{% for i in range(5) %}{{ s }}{% endfor %}",
                   strlen("{% set s = 'x' * 4000000 %}{% for i in range(5) %}{{ s }}{% endfor %}"), "too large", 2.0);
    expect_error_n("string doubling",
                   "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   strlen("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
                   "too large", 2.0);
    expect_error_n("shared value printed 2^40 times",
                   "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}",
                   strlen("{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}"),
                   "too large", 2.0);
    expect_error_n("center(10**12)", "{{ 'a'|center(1000000000000) }}", strlen("{{ 'a'|center(1000000000000) }}"),
                   "too large", 2.0);
    expect_error_n("tojson(indent=10**12)", "{{ [1]|tojson(indent=1000000000000) }}",
                   strlen("{{ [1]|tojson(indent=1000000000000) }}"), "too large|memory", 2.0);
    /* memory: 16 MB strings copied in a loop, each under the size limit */
    expect_error_n("memory in a loop",
                   "{% set s = 'x' * 16000000 %}{% for i in range(1000) %}{% set t = s ~ 'y' %}{% endfor %}",
                   strlen("{% set s = 'x' * 16000000 %}{% for i in range(1000) %}{% set t = s ~ 'y' %}{% endfor %}"),
                   "memory|time", 4.0);
    /* slow steps (a 16 MB scan each): the wall-clock limit ends it */
    expect_error_n("wall-clock limit",
                   "{% set s = 'x' * 16000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}",
                   strlen("{% set s = 'x' * 16000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}"),
                   "time", 5.0);
    expect_error_n("quadratic sort",
                   "{{ range(200000)|reverse|sort|first }}", strlen("{{ range(200000)|reverse|sort|first }}"),
                   "time|steps", 5.0);
    /* empty operands of huge repetitions: nothing to build, no loop */
    expect_output("'' * 10**18", "{{ '' * 1000000000000000000 }}|{{ ([] * 1000000000000000000)|length }}", "|0");
    /* a loop of real size is fine */
    expect_output("10000 iterations", "{% set ns = namespace(n=0) %}{% for i in range(10000) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
                  "49995000");
}

/* ---- 6. linear lexing ---- */
static void lexing(void) {
    size_t n;
    char *s = repeat("", "{{ 1 }}", 40000, "", &n); /* 280 KB */
    td_err err = {0};
    char *out;
    size_t len;
    double t0 = now_s();
    int rc = run_src(s, n, &out, &len, &err);
    double dt = now_s() - t0;
    CHECK(rc == 0, "280 KB of {{ 1 }}: %s", err.msg);
    CHECK(rc != 0 || len == 40000, "280 KB of {{ 1 }}: %zu bytes out", len);
    CHECK(dt < 2.0, "280 KB of {{ 1 }} took %.2f s (quadratic lexing?)", dt);
    if (!rc) free(out);
    free(s);
    /* string literals: each one allocated the rest of the source */
    s = repeat("", "{{ 'a' }}", 40000, "", &n);
    t0 = now_s();
    rc = run_src(s, n, &out, &len, &err);
    dt = now_s() - t0;
    CHECK(rc == 0 && len == 40000, "360 KB of {{ 'a' }}: %s", err.msg);
    CHECK(dt < 2.0, "360 KB of {{ 'a' }} took %.2f s", dt);
    if (!rc) free(out);
    free(s);
    /* positions stay right after the change */
    s = repeat("", "{{ 1 }}\n", 3000, "  {{ 1 ? 2 }}", &n);
    rc = run_src(s, n, &out, &len, &err);
    CHECK(rc != 0 && strstr(err.msg, "line 3001 column 8"), "position after 3000 lines: %s", err.msg);
    free(s);
    rc = run_src("é{{ x|bogus }}", strlen("é{{ x|bogus }}"), &out, &len, &err);
    CHECK(rc != 0 && strstr(err.msg, "line 1 column 7"), "column counts code points: %s", err.msg);
}

/* ---- the real templates under the limits ---- */
static json_t *richest_chat(const char *tname) {
    FILE *f = fopen("tests/golden/templates/chats.jsonl", "r");
    if (!f) return NULL;
    json_error_t je;
    json_t *rec, *best = NULL;
    size_t best_n = 0;
    while ((rec = json_loadf(f, JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &je))) {
        json_t *e = json_object_get(rec, "expected");
        if (!strcmp(json_string_value(json_object_get(rec, "template")), tname) && json_is_string(e) &&
            json_string_length(e) > best_n && json_is_array(json_object_get(rec, "tools"))) {
            best_n = json_string_length(e);
            json_decref(best);
            best = rec;
        } else {
            json_decref(rec);
        }
    }
    fclose(f);
    return best;
}

static void real_templates(void) {
    static const char *names[] = {"qwen3", "qwen3.5", "qwen3-coder"};
    for (int k = 0; k < 3; k++) {
        char path[256];
        snprintf(path, sizeof path, "tests/data/chat-templates/%s.jinja", names[k]);
        char *src = test_read_file(path);
        CHECK(src != NULL, "missing %s", path);
        json_t *rec = richest_chat(names[k]);
        CHECK(rec != NULL, "%s: no conversation with tools in chats.jsonl", names[k]);
        if (!src || !rec) { free(src); json_decref(rec); continue; }
        td_err err = {0};
        tpl *t = NULL;
        int rc = td_tpl_parse(src, strlen(src), &t, &err);
        CHECK(rc == 0, "parse %s: %s", names[k], err.msg);
        if (rc) { free(src); json_decref(rec); continue; }
        tpl_chat_args a = {.messages = json_object_get(rec, "messages"), .tools = json_object_get(rec, "tools"),
                           .kwargs = json_object_get(rec, "kwargs"),
                           .add_generation_prompt = json_is_true(json_object_get(rec, "add_generation_prompt")),
                           .eos_token = "<|im_end|>", .pad_token = "<|endoftext|>"};
        char *out = NULL;
        size_t len = 0;
        rc = td_tpl_apply_chat(t, &a, &out, &len, &err);
        json_t *exp = json_object_get(rec, "expected");
        CHECK(rc == 0, "%s: typical conversation: %s", names[k], err.msg);
        if (!rc) {
            CHECK(len == json_string_length(exp) && !memcmp(out, json_string_value(exp), len),
                  "%s: typical conversation differs from jinja2", names[k]);
            free(out);
        }
        /* a long conversation (about 4 MB: 400 turns of 10 KB) */
        json_t *msgs = json_array();
        char *big = malloc(10001);
        memset(big, 'w', 10000);
        for (int i = 0; i < 10000; i += 80) big[i] = ' ';
        big[10000] = 0;
        for (int i = 0; i < 400; i++) {
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string(i % 2 ? "assistant" : "user"));
            json_object_set_new(m, "content", json_string(big));
            json_array_append_new(msgs, m);
        }
        a.messages = msgs;
        double t0 = now_s();
        rc = td_tpl_apply_chat(t, &a, &out, &len, &err);
        double dt = now_s() - t0;
        CHECK(rc == 0, "%s: 4 MB conversation: %s", names[k], err.msg);
        if (!rc) {
            CHECK(len > 4000000, "%s: 4 MB conversation gave %zu bytes", names[k], len);
            free(out);
        }
        CHECK(dt < 2.0, "%s: 4 MB conversation took %.2f s", names[k], dt);
        free(big);
        json_decref(msgs);
        td_tpl_free(t);
        json_decref(rec);
        free(src);
    }
}

/* The same errors in this process (not a child), so that LeakSanitizer
 * checks the error paths free what they allocated. */
static void in_process(void) {
    static const char *const cases[][2] = {
        {"{{ 'x' * 1000000000 }}", "too large"},
        {"{% set s = 'x' * 4000000 %}{% for i in range(5) %}{{ s }}{% endfor %}", "too large"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps|memory|time"},
        {"{% set ns = namespace(x=1) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}{% endfor %}", "nest"},
        {"{{ 2 ** 9223372036854775807 }}", "integer overflow"},
        {"{{ 1 // 0 }}", "zero"},
        {"{{ ((((((((((1)))))))))) + 9223372036854775807 }}", "integer overflow"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expect_case e = {cases[i][0], cases[i][0], cases[i][1], strlen(cases[i][0]), 5.0};
        expect_error_body(&e);
    }
    size_t n;
    char *a = repeat("{{ ", "(", 1000, "1", &n);
    char *b = repeat(a, ")", 1000, " }}", &n);
    expect_case e = {"1000 parentheses", b, "nest", n, 5.0};
    expect_error_body(&e);
    free(a);
    free(b);
}

int main(void) {
    isolated("nesting", nesting, 60);
    isolated("arithmetic", arithmetic, 30);
    isolated("numbers", numbers, 30);
    isolated("work", work, 120);
    isolated("lexing", lexing, 60);
    isolated("real templates", real_templates, 60);
    const char *only = getenv("TEST_ONLY");
    if (!only || !*only) in_process();
    TEST_MAIN_END("test_template_limits");
}
