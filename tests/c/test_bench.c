/* tandem bench: the pure parts (statistics, run order, cells, sanity flags,
 * the speedup model, metrics and URL parsing, CSV/SVG writers, prompt
 * loading), then a short end-to-end run of build/tandem bench on the tiny
 * random-weight model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "bench/runner.h"
#include "check.h"

/* The binary under test: $BUILD/tandem (tests/run_all.sh sets BUILD). */
static char tandem[512] = "build/tandem";

static bool near(double a, double b) { return fabs(a - b) < 1e-9 * (1 + fabs(b)); }

static void test_stats(void) {
    double a[] = {3, 1, 2};
    bench_stat s = td_bench_stat_of(a, 3);
    CHECK(s.median == 2 && s.min == 1 && s.max == 3 && s.n == 3, "odd: %g %g %g", s.median, s.min, s.max);
    CHECK(a[0] == 3 && a[1] == 1, "input untouched");
    double b[] = {10, 1, 3, 2};
    s = td_bench_stat_of(b, 4);
    CHECK(s.median == 2.5 && s.min == 1 && s.max == 10, "even: %g", s.median);
    s = td_bench_stat_of(b, 0);
    CHECK(s.n == 0 && s.median == 0, "empty");
    double c[] = {10, 9, 11};
    s = td_bench_stat_of(c, 3);
    CHECK(near(td_bench_spread(&s), 0.2), "spread %g", td_bench_spread(&s));
    double big[100];
    for (int i = 0; i < 100; i++) big[i] = 100 - i;
    s = td_bench_stat_of(big, 100);
    CHECK(s.median == 50.5 && s.min == 1 && s.max == 100, "100 values: %g", s.median);
}

static void test_order(void) {
    int np[2] = {2, 1};
    int n = td_bench_order_len(2, 2, np, 3);
    CHECK(n == 18, "len %d", n);
    bench_slot o[18];
    td_bench_order(2, 2, np, 3, o);
    /* run 0: depths ascending per prompt; run 1: descending */
    CHECK(o[0].run == 0 && o[0].task == 0 && o[0].prompt == 0 && o[0].depth_idx == 0, "slot 0");
    CHECK(o[1].depth_idx == 1 && o[2].depth_idx == 2 && o[3].prompt == 1 && o[3].depth_idx == 0, "ABC per prompt");
    CHECK(o[6].task == 1 && o[6].prompt == 0, "task 1 after task 0's prompts");
    CHECK(o[9].run == 1 && o[9].depth_idx == 2 && o[10].depth_idx == 1 && o[11].depth_idx == 0, "CBA on odd runs");
    int seen[2][2][2][3] = {{{{0}}}};
    bool ok = true;
    for (int i = 0; i < n; i++) seen[o[i].run][o[i].task][o[i].prompt][o[i].depth_idx]++;
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 2; t++)
            for (int p = 0; p < np[t]; p++)
                for (int d = 0; d < 3; d++) ok &= seen[r][t][p][d] == 1;
    CHECK(ok, "every (run, task, prompt, depth) exactly once");
    /* every depth sees every run within one prompt's window: no depth is
     * measured only early or only late */
    double mean_pos[3] = {0};
    for (int i = 0; i < n; i++) mean_pos[o[i].depth_idx] += i;
    CHECK(fabs(mean_pos[0] - mean_pos[2]) <= 6, "depths share positions: %g %g", mean_pos[0], mean_pos[2]);
}

static bench_sample mk(int run, int task, int prompt, int depth, int gen, double decode_s) {
    bench_sample s;
    memset(&s, 0, sizeof s);
    s.run = run;
    s.task = task;
    s.prompt = prompt;
    s.depth = depth;
    s.n_prompt = 100;
    s.n_generated = gen;
    s.prefill_s = 0.5;
    s.decode_s = decode_s;
    s.ttft_s = 0.5;
    s.cond.threads = 8;
    s.cond.max_tokens = 64;
    s.cond.engine_depth = 2;
    s.cond.load1 = 1.0;
    snprintf(s.cond.backend, sizeof s.cond.backend, "in-process");
    if (depth > 0) {
        s.spec.drafts = 10;
        s.spec.draft_tokens = 10 * (uint64_t)depth;
        s.spec.accepted_tokens = 15;
        s.spec.accepted_per_pos[0] = 9;
        if (depth > 1) s.spec.accepted_per_pos[1] = 6;
    }
    return s;
}

static int count_kind(const bench_flag *f, int n, bench_flag_kind k) {
    int c = 0;
    for (int i = 0; i < n; i++) c += f[i].kind == k;
    return c;
}

static void test_cells_and_flags(void) {
    bench_suite su = {.n_tasks = 1, .n_depths = 3, .depths = {0, 1, 2}, .n_runs = 3};
    snprintf(su.tasks[0], BENCH_NAME, "edit");
    bench_sample s[9];
    int k = 0;
    for (int r = 0; r < 3; r++) {
        s[k++] = mk(r, 0, 0, 0, 11, 1.0);  /* 10 tok/s */
        s[k++] = mk(r, 0, 0, 1, 11, 0.55); /* 18.2 tok/s */
        s[k++] = mk(r, 0, 0, 2, 11, 0.4);  /* 25 tok/s */
    }
    bench_cell cells[3];
    td_bench_cells(&su, s, 9, cells);
    CHECK(cells[0].tps.n == 3 && near(cells[0].tps.median, 10), "baseline %g", cells[0].tps.median);
    CHECK(near(cells[2].speedup, 2.5), "speedup %g", cells[2].speedup);
    CHECK(cells[1].spec.drafts == 30 && near(td_bench_accept_pos(&cells[1].spec, 0), 0.9), "summed counters");
    CHECK(near(td_bench_mean_accept_len(&cells[2].spec), 2.5), "mean acceptance length %g", td_bench_mean_accept_len(&cells[2].spec));
    CHECK(near(cells[0].prefill_tps.median, 200), "prefill %g", cells[0].prefill_tps.median);
    bench_flag f[16];
    int nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(nf == 0, "clean run has no flags (%d: %s)", nf, nf ? f[0].text : "");
    /* depth 1 at 2.1x: impossible */
    for (int r = 0; r < 3; r++) s[r * 3 + 1].decode_s = 10.0 / 21.0;
    td_bench_cells(&su, s, 9, cells);
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(count_kind(f, nf, BENCH_FLAG_IMPOSSIBLE) == 1 && f[0].depth == 1, "2.1x at depth 1 flagged (%d)", nf);
    CHECK(strstr(f[0].text, "IMPOSSIBLE") != NULL, "%s", f[0].text);
    for (int r = 0; r < 3; r++) s[r * 3 + 1].decode_s = 0.55;
    /* spread: one run of depth 2 a sixth slower */
    s[2].decode_s = 0.4 * 7 / 6;
    td_bench_cells(&su, s, 9, cells);
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(count_kind(f, nf, BENCH_FLAG_SPREAD) == 1 && nf == 1, "spread flagged (%d)", nf);
    s[2].decode_s = 0.4 * 1.05;
    td_bench_cells(&su, s, 9, cells);
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(nf == 0, "5%% spread is fine (%d)", nf);
    s[2].decode_s = 0.4;
    /* baseline under other conditions */
    for (int r = 0; r < 3; r++) s[r * 3].cond.threads = 4;
    td_bench_cells(&su, s, 9, cells);
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(count_kind(f, nf, BENCH_FLAG_BASELINE) == 1 && strstr(f[0].text, "threads = 4"), "threads flagged: %s", nf ? f[0].text : "");
    for (int r = 0; r < 3; r++) s[r * 3].cond.threads = 8, s[r * 3].cond.load1 = 3.0;
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(count_kind(f, nf, BENCH_FLAG_BASELINE) == 1 && strstr(f[0].text, "load"), "load flagged");
    for (int r = 0; r < 3; r++) s[r * 3].cond.load1 = 1.1;
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(nf == 0, "small load difference is fine");
    /* greedy yet other token counts */
    s[1].n_generated = 9;
    td_bench_cells(&su, s, 9, cells);
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(count_kind(f, nf, BENCH_FLAG_WORKLOAD) == 1, "workload flagged (%d)", nf);
    for (int i = 0; i < 9; i++) s[i].cond.temperature = 0.7;
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    CHECK(count_kind(f, nf, BENCH_FLAG_WORKLOAD) == 0, "not with sampling");
    s[1].n_generated = 11;
    s[4].n_reused = 80;
    nf = td_bench_sanity(&su, cells, s, 9, f, 16);
    int ci = -1;
    for (int i = 0; i < nf && i < 16; i++)
        if (f[i].kind == BENCH_FLAG_CACHE) ci = i;
    CHECK(count_kind(f, nf, BENCH_FLAG_CACHE) == 1 && ci >= 0 && strstr(f[ci].text, "1 of 9 requests"), "cache hits flagged: %s",
          ci >= 0 ? f[ci].text : "");
    s[4].n_reused = 0;
    /* no baseline */
    bench_suite su2 = su;
    su2.n_depths = 2;
    su2.depths[0] = 1;
    su2.depths[1] = 2;
    bench_cell c2[2];
    td_bench_cells(&su2, s, 9, c2);
    nf = td_bench_sanity(&su2, c2, s, 9, f, 16);
    CHECK(count_kind(f, nf, BENCH_FLAG_NO_BASELINE) == 1 && c2[0].speedup == 0, "no baseline flagged");
    /* more flags than room: the count still comes back */
    nf = td_bench_sanity(&su2, c2, s, 9, f, 0);
    CHECK(nf == 1, "count without room %d", nf);
}

static void test_model(void) {
    double p[2] = {0.9, 0.8};
    CHECK(near(td_bench_expected_tokens(p, 2), 2.7), "E");
    CHECK(near(td_bench_expected_tokens(p, 0), 1.0), "E at 0");
    bench_costs c;
    memset(&c, 0, sizeof c);
    c.max_n = 3;
    c.verify[1] = 1.0;
    c.verify[2] = 1.1;
    c.verify[3] = 1.2;
    c.draft = 0.1;
    CHECK(near(td_bench_predict_speedup(p, 2, &c), 2.7 / 1.4), "k=2: %g", td_bench_predict_speedup(p, 2, &c));
    CHECK(near(td_bench_predict_speedup(p, 0, &c), 1.0), "k=0");
    CHECK(td_bench_predict_speedup(p, 3, &c) == 0, "beyond the timed sizes");
    /* perfect acceptance and free verify/draft: the ceiling k + 1 */
    double one[4] = {1, 1, 1, 1};
    bench_costs z;
    memset(&z, 0, sizeof z);
    z.max_n = 5;
    for (int n = 1; n <= 5; n++) z.verify[n] = 1;
    CHECK(near(td_bench_predict_speedup(one, 4, &z), 5), "ceiling");
    bench_suite su = {.n_tasks = 1, .n_depths = 2, .depths = {0, 2}, .n_runs = 1};
    bench_cell cells[2];
    memset(cells, 0, sizeof cells);
    cells[1].depth = 2;
    cells[1].spec.drafts = 10;
    cells[1].spec.accepted_per_pos[0] = 9;
    cells[1].spec.accepted_per_pos[1] = 8;
    td_bench_predict_cells(&su, cells, &c);
    CHECK(near(cells[1].predicted, 2.7 / 1.4) && near(cells[0].predicted, 1.0), "cells: %g", cells[1].predicted);
}

static void test_metrics_url(void) {
    const char *text = "# HELP vllm:spec_decode_num_drafts_total x\n# TYPE vllm:spec_decode_num_drafts_total counter\n"
                       "vllm:spec_decode_num_drafts_total{model_name=\"m\",engine=\"0\"} 10\n"
                       "vllm:spec_decode_num_drafts_created{model_name=\"m\"} 1.7e9\n"
                       "vllm:spec_decode_num_draft_tokens{model_name=\"m\"} 30\n"
                       "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 21\n"
                       "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 9\n"
                       "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"2\"} 5\n"
                       "vllm:prefix_cache_hits_total{model_name=\"m\"} 74\nvllm:prefix_cache_queries_total{model_name=\"m\"} 100\n"
                       "tandem_spec_decode_depth{model_name=\"m\"} 3\n";
    bench_metrics m;
    td_bench_metrics_parse(text, &m);
    CHECK(m.spec.drafts == 10 && m.spec.draft_tokens == 30 && m.spec.accepted_tokens == 21, "counters %llu",
          (unsigned long long)m.spec.drafts);
    CHECK(m.spec.accepted_per_pos[0] == 9 && m.spec.accepted_per_pos[1] == 0 && m.spec.accepted_per_pos[2] == 5, "per pos");
    CHECK(m.prefix_hits == 74 && m.prefix_queries == 100 && m.depth == 3 && m.have_spec, "prefix cache and depth");
    bench_url u;
    td_err e = {0};
    CHECK(td_bench_url_parse("http://127.0.0.1:8000/v1", &u, &e) == 0 && !strcmp(u.host, "127.0.0.1") && !strcmp(u.port, "8000") &&
              !strcmp(u.path, ""),
          "url: %s %s '%s'", u.host, u.port, u.path);
    CHECK(td_bench_url_parse("http://[::1]:9/base/", &u, &e) == 0 && !strcmp(u.host, "::1") && !strcmp(u.path, "/base"), "ipv6 %s", u.path);
    CHECK(td_bench_url_parse("localhost", &u, &e) == 0 && !strcmp(u.port, "80"), "bare host");
    CHECK(td_bench_url_parse("https://x", &u, &e) == TD_ERR_UNSUPPORTED, "https refused");
    CHECK(td_bench_url_parse("http://h:port", &u, &e) != 0, "bad port");
    /* a closed port: connection error, not a hang */
    char *body = NULL;
    int status;
    td_bench_url_parse("http://127.0.0.1:1", &u, &e);
    CHECK(td_bench_http_fetch(&u, "GET", "/metrics", NULL, NULL, 2, &status, &body, NULL, &e) != 0 && strstr(e.msg, "connect"), "%s", e.msg);
}

static int count_lines(const char *path, int *fields_first, int *fields_all_equal) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[16384];
    int n = 0, first = -1;
    *fields_all_equal = 1;
    while (fgets(line, sizeof line, f)) {
        int commas = 0;
        bool q = false;
        for (char *p = line; *p; p++) {
            if (*p == '"') q = !q;
            else if (*p == ',' && !q) commas++;
        }
        if (first < 0) first = commas;
        else if (commas != first) *fields_all_equal = 0;
        n++;
    }
    fclose(f);
    *fields_first = first + 1;
    return n;
}

static void test_writers(const char *tmp) {
    bench_suite su = {.n_tasks = 2, .n_depths = 2, .depths = {0, 3}, .n_runs = 2};
    snprintf(su.tasks[0], BENCH_NAME, "a<b&c");
    snprintf(su.tasks[1], BENCH_NAME, "with,comma");
    bench_sample s[8];
    int k = 0;
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 2; t++) {
            s[k] = mk(r, t, 0, 0, 11, 1.0 + 0.01 * r);
            s[k + 1] = mk(r, t, 0, 3, 11, 0.5);
            snprintf(s[k + 1].cond.backend, sizeof s[k + 1].cond.backend, "in-process");
            k += 2;
        }
    bench_cell cells[4];
    td_bench_cells(&su, s, 8, cells);
    char path[600];
    snprintf(path, sizeof path, "%s/s.csv", tmp);
    FILE *f = fopen(path, "w");
    CHECK(f && td_bench_write_samples_csv(f, &su, s, 8) == 0, "samples csv");
    if (f) fclose(f);
    int nfields, eq;
    CHECK(count_lines(path, &nfields, &eq) == 9 && eq && nfields == 14 + TD_MAX_SPEC_DEPTH + 7, "samples csv shape %d", nfields);
    char *txt = test_read_file(path);
    CHECK(txt && strstr(txt, "\"with,comma\""), "quoted field");
    free(txt);
    /* round trip through --merge */
    bench_suite su2 = su;
    su2.n_depths = 1;
    bench_sample *back = NULL;
    int nb = 0;
    td_err e = {0};
    CHECK(td_bench_merge_csv(path, &su2, &back, &nb, &e) == 0 && nb == 8 && su2.n_depths == 2, "merge: %d rows %s", nb, e.msg);
    CHECK(back && back[1].depth == 3 && back[1].spec.accepted_per_pos[1] == 6 && back[3].task == 1 && back[2].run == 0 &&
              near(back[0].decode_s, 1.0) && !strcmp(back[1].cond.backend, "in-process"),
          "merged fields");
    free(back);
    snprintf(path, sizeof path, "%s/c.csv", tmp);
    f = fopen(path, "w");
    CHECK(f && td_bench_write_cells_csv(f, &su, cells) == 0, "cells csv");
    if (f) fclose(f);
    CHECK(count_lines(path, &nfields, &eq) == 5 && eq, "cells csv shape");
    snprintf(path, sizeof path, "%s/c.svg", tmp);
    f = fopen(path, "w");
    CHECK(f && td_bench_write_svg(f, &su, cells, "title <&>") == 0, "svg");
    if (f) fclose(f);
    txt = test_read_file(path);
    CHECK(txt && !strncmp(txt, "<?xml", 5) && strstr(txt, "<svg") && strstr(txt + strlen(txt) - 8, "</svg>"), "svg frame");
    int polys = 0, opens = 0, closes = 0;
    for (const char *p = txt; p && (p = strstr(p, "<polyline")); p++) polys++;
    for (const char *p = txt; p && *p; p++) { opens += *p == '<'; closes += *p == '>'; }
    CHECK(polys == 2 && opens == closes, "one line per task, balanced tags (%d, %d/%d)", polys, opens, closes);
    CHECK(txt && strstr(txt, "a&lt;b&amp;c") && strstr(txt, "title &lt;&amp;&gt;") && !strstr(txt, "a<b"), "escaped");
    CHECK(txt && !strstr(txt, "nan") && !strstr(txt, "inf"), "finite coordinates");
    free(txt);
    snprintf(path, sizeof path, "%s/r.md", tmp);
    f = fopen(path, "w");
    bench_flag fl[8];
    int nf = td_bench_sanity(&su, cells, s, 8, fl, 8);
    bench_report rep = {.su = &su, .cells = cells, .samples = s, .n_samples = 8, .flags = fl, .n_flags = nf, .title = "t"};
    if (f) td_bench_write_markdown(f, &rep), fclose(f);
    txt = test_read_file(path);
    CHECK(txt && strstr(txt, "| depth | a<b&c | with,comma | accepted |") && strstr(txt, "| none |") && strstr(txt, "| 3 |") &&
              strstr(txt, "Sanity flags"),
          "markdown table");
    free(txt);
}

static void test_prompts(void) {
    if (access("bench/prompts/edit", F_OK)) return;
    bench_suite su = {.n_tasks = 3};
    snprintf(su.tasks[0], BENCH_NAME, "edit");
    snprintf(su.tasks[1], BENCH_NAME, "code");
    snprintf(su.tasks[2], BENCH_NAME, "prose");
    bench_prompts p;
    td_err e = {0};
    CHECK(td_bench_prompts_load("bench/prompts", &su, &p, &e) == 0, "%s", e.msg);
    for (int t = 0; t < 3; t++) CHECK(p.n[t] >= 5, "%s has %d prompts", su.tasks[t], p.n[t]);
    td_bench_prompts_free(&p);
    snprintf(su.tasks[0], BENCH_NAME, "nosuchtask");
    CHECK(td_bench_prompts_load("bench/prompts", &su, &p, &e) == TD_ERR_IO && strstr(e.msg, "nosuchtask"), "missing task: %s", e.msg);
}

static bool exists_nonempty(const char *dir, const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0 && st.st_size > 0;
}

static void test_end_to_end(const char *tmp) {
    const char *model = "tests/golden/tiny-b/bf16";
    if (access(tandem, X_OK) || access(model, F_OK)) { printf("test_bench: end-to-end skipped (no build/tandem)\n"); return; }
    char pdir[600], cmd[2400], out[600];
    snprintf(pdir, sizeof pdir, "%s/prompts/edit", tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && printf 'Reproduce this line with x renamed to y:\\nint x = 1;\\n' > %s/a.txt && "
                              "printf '[{\"role\":\"user\",\"content\":\"Rename f to g: def f(): pass\"}]' > %s/b.json",
             pdir, pdir, pdir);
    CHECK(system(cmd) == 0, "prompt files");
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(cmd, sizeof cmd,
             "%s bench -m %s --depths 0,2 --runs 1 --max-tokens 16 --tasks edit --prompts %s/prompts --out %s --memory "
             "--cost-reps 3 2>%s/stderr.txt",
             tandem, model, tmp, out, tmp);
    FILE *p = popen(cmd, "r");
    char buf[65536];
    size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    buf[n] = 0;
    int rc = p ? pclose(p) : -1;
    CHECK(rc == 0, "bench exit %d", rc);
    CHECK(strstr(buf, "| depth | edit | accepted |") && strstr(buf, "| none |") && strstr(buf, "| 2 |"), "table in stdout");
    CHECK(strstr(buf, "## Acceptance per position") && strstr(buf, "## Cost model") && strstr(buf, "## Memory") &&
              strstr(buf, "Sanity flags") && strstr(buf, "TTFT"),
          "sections");
    CHECK(exists_nonempty(out, "samples.csv") && exists_nonempty(out, "summary.csv") && exists_nonempty(out, "chart.svg") &&
              exists_nonempty(out, "report.md"),
          "output files");
    char path[700];
    snprintf(path, sizeof path, "%s/samples.csv", out);
    int nf, eq;
    CHECK(count_lines(path, &nf, &eq) == 1 + 2 * 2 && eq, "4 requests recorded");
    snprintf(path, sizeof path, "%s/stderr.txt", tmp);
    char *err = test_read_file(path);
    CHECK(err && strstr(err, "4/4"), "progress on stderr");
    free(err);
    /* agent trace: 3 turns, growing prefix */
    snprintf(path, sizeof path, "%s/trace.json", tmp);
    FILE *t = fopen(path, "w");
    if (t) {
        fprintf(t, "{\"turns\": [{\"messages\": [{\"role\":\"system\",\"content\":\"You are a coding agent.\"},{\"role\":\"user\",\"content\":\"Fix it.\"}], \"max_tokens\": 4},"
                   "{\"messages\": [{\"role\":\"system\",\"content\":\"You are a coding agent.\"},{\"role\":\"user\",\"content\":\"Fix it.\"},"
                   "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"read\",\"arguments\":\"{\\\"path\\\": \\\"a.c\\\"}\"}}]},"
                   "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"int main(void) { return 1; }\"}], \"max_tokens\": 4},"
                   "{\"messages\": [{\"role\":\"system\",\"content\":\"You are a coding agent.\"},{\"role\":\"user\",\"content\":\"Fix it.\"},"
                   "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"read\",\"arguments\":\"{\\\"path\\\": \\\"a.c\\\"}\"}}]},"
                   "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"int main(void) { return 1; }\"},"
                   "{\"role\":\"assistant\",\"content\":\"Done.\"},{\"role\":\"user\",\"content\":\"Thanks.\"}], \"max_tokens\": 4}]}\n");
        fclose(t);
    }
    snprintf(cmd, sizeof cmd, "%s bench -m %s --agent-trace %s --spec-depth 2 --out %s 2>/dev/null", tandem, model, path, out);
    p = popen(cmd, "r");
    n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    buf[n] = 0;
    rc = p ? pclose(p) : -1;
    CHECK(rc == 0 && strstr(buf, "## Agent trace") && strstr(buf, "| 3 | 6 |") && strstr(buf, "read:write"), "trace report (rc %d)", rc);
    /* shared prefix with the previous turn is measured: turn 2 shares turn 1's whole prompt */
    CHECK(strstr(buf, "of them were shared with the previous turn"), "shared prefix measured");
    CHECK(exists_nonempty(out, "trace.csv"), "trace.csv");
    /* bad usage */
    snprintf(cmd, sizeof cmd, "%s bench --depths 0,x >/dev/null 2>&1", tandem);
    CHECK(system(cmd) != 0, "bad --depths refused");
    snprintf(cmd, sizeof cmd, "%s bench -m %s --prompts /nonexistent >/dev/null 2>&1", tandem, model);
    CHECK(system(cmd) != 0, "missing prompts refused");
}

/* Starts `tandem serve --port 0` and runs the suite against it over HTTP. */
static void test_server(const char *tmp) {
    const char *model = "tests/golden/tiny-b/bf16";
    if (access(tandem, X_OK) || access(model, F_OK)) return;
    int fds[2];
    if (pipe(fds)) return;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        execl(tandem, "tandem", "serve", "-m", model, "--port", "0", "--spec-depth", "2", "--quiet", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *err = fdopen(fds[0], "r");
    char line[1024], url[256] = "";
    while (err && fgets(line, sizeof line, err)) {
        char *r = strstr(line, "ready on "); /* "ready on http://127.0.0.1:PORT: model ..." */
        char *e = r ? strstr(r + 9, ": ") : NULL;
        if (e) {
            snprintf(url, sizeof url, "%.*s", (int)(e - (r + 9)), r + 9);
            break;
        }
    }
    CHECK(url[0] != 0, "server ready line");
    if (url[0]) {
        char cmd[1600], buf[32768];
        snprintf(cmd, sizeof cmd, "%s bench --server %s --runs 1 --max-tokens 8 --tasks edit --prompts %s/prompts --out %s/srv 2>/dev/null",
                 tandem, url, tmp, tmp);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
        buf[n] = 0;
        int rc = p ? pclose(p) : -1;
        CHECK(rc == 0 && strstr(buf, "| depth | edit | accepted |") && strstr(buf, "| 2 |"), "server suite at the server's depth (rc %d)", rc);
        CHECK(strstr(buf, "| 2 | edit |") && !strstr(buf, "| 2 | edit | 0 |"), "acceptance counted from /metrics");
        CHECK(strstr(buf, "NO BASELINE"), "no depth 0 against one server");
        char out[700];
        snprintf(out, sizeof out, "%s/srv", tmp);
        CHECK(exists_nonempty(out, "samples.csv"), "server samples");
        /* join with an in-process depth-0 run: the baseline's conditions differ */
        snprintf(cmd, sizeof cmd, "%s bench -m %s --depths 0 --runs 1 --max-tokens 8 --tasks edit --prompts %s/prompts --no-costs "
                                  "--merge %s/srv/samples.csv 2>/dev/null",
                 tandem, model, tmp, tmp);
        p = popen(cmd, "r");
        n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
        buf[n] = 0;
        rc = p ? pclose(p) : -1;
        CHECK(rc == 0 && strstr(buf, "BASELINE CONDITIONS") && strstr(buf, "backend = in-process") && strstr(buf, "| none |"),
              "merged baseline flagged (rc %d)", rc);
    }
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    if (err) fclose(err);
}

int main(void) {
    const char *b = getenv("BUILD");
    if (b && *b) snprintf(tandem, sizeof tandem, "%s/tandem", b);
    char tmp[] = "/tmp/test_bench_XXXXXX";
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    test_stats();
    test_order();
    test_cells_and_flags();
    test_model();
    test_metrics_url();
    test_writers(tmp);
    test_prompts();
    test_end_to_end(tmp);
    test_server(tmp);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    TEST_MAIN_END("test_bench");
}
