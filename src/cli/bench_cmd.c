/* `tandem bench`: tokens/s per task and MTP depth, acceptance, prefill,
 * TTFT, sanity flags and a model of the speedup (src/bench). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "bench/runner.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "engine/engine.h"
#include "backend/cpu/kernels.h"
#include "spec/calibrate.h"

typedef struct bench_cli {
    common_opts co;
    bench_suite su;
    bool depths_given, memory, ignore_eos, no_costs, max_tokens_given, prefix_caching, no_prefix_caching;
    int max_tokens, cost_reps;
    const char *out, *server, *api_key, *served_model, *trace, *prompts;
    const char *merge[8];
    int n_merge;
} bench_cli;

static void usage(FILE *f) {
    fprintf(f, "usage: tandem bench [-m DIR] [--depths 0,1,2,3,4,5,6] [--tasks edit,code,prose] [--runs 3] [--max-tokens N]\n"
               "                    [--temperature T] [--out DIR] [--server URL] [--agent-trace FILE] [--memory]\n"
               "  --depths LIST          MTP draft depths to compare, distinct, 0..%d or auto (default 0,1,2,3,4,auto; 0 = no\n"
               "                         drafting, the baseline; auto = each step picks 0..--spec-depth-max; --spec-depth N|auto\n"
               "                         = just that)\n"
               "  --tasks LIST           prompt sets under --prompts (default edit,code,prose)\n"
               "  --runs N               runs of the whole suite, 1..64; median, min and max over runs (default 3)\n"
               "  -n, --max-tokens N     tokens generated per request at most, 1..1000000 (default 128)\n"
               "  --ignore-eos           always generate max-tokens tokens (default: stop at EOS)\n"
               "  --out DIR              write samples.csv, summary.csv, chart.svg and report.md there (default: stdout only)\n"
               "  --prompts DIR          prompt directory (default bench/prompts)\n"
               "  --server URL           run against an OpenAI-compatible server (tandem serve, vLLM, llama.cpp) at its\n"
               "                         configured depth (from /metrics, or say it with a single --depths value; default: in-process)\n"
               "  --api-key KEY          bearer token for --server (default none);  --served-model NAME  model id (default: /v1/models)\n"
               "  --agent-trace FILE     replay a recorded multi-turn agent session instead of the suite (at --spec-depth,\n"
               "                         else the largest --depths value; each turn's max_tokens unless --max-tokens)\n"
               "  --memory               the planner's numbers and the measured memory for each depth (default off)\n"
               "  --merge FILE           add the samples.csv of an earlier run (e.g. a baseline against another server; up to 8)\n"
               "  --enable-prefix-caching  keep the prefix cache on in the suite (default off: cold prefill every request)\n"
               "  --kernels [OPTS]       kernel and engine speed instead of the suite: the same as `tandem kernels OPTS`\n"
               "                         (bandwidth probe, decode, verify cost t(k+1)/t(1), prefill 512 and 4096)\n"
               "  --no-prefix-caching    turn it off for --agent-trace (default on there)\n"
               "  --cost-reps N          repeats of each cost timing, 1..1000000 (default 9); --no-costs skips the cost model\n"
               "  -v, --verbose          errors with their source location\n"
               "  -h, --help             this help\n"
               "common options:\n%s",
            TD_MAX_SPEC_DEPTH, td_common_opts_help());
}

static int parse_list(const char *s, char items[][BENCH_NAME], int max, int *n) {
    *n = 0;
    while (*s) {
        size_t l = strcspn(s, ",");
        if (!l || l >= BENCH_NAME || *n >= max) return -1;
        memcpy(items[*n], s, l);
        items[(*n)++][l] = 0;
        s += l;
        if (*s == ',') s++;
    }
    return *n ? 0 : -1;
}

static int parse_depths(const char *s, bench_suite *su) {
    char items[BENCH_MAX_DEPTHS][BENCH_NAME];
    int n;
    if (parse_list(s, items, BENCH_MAX_DEPTHS, &n)) return -1;
    for (int i = 0; i < n; i++) {
        char *end;
        long v = strtol(items[i], &end, 10);
        if (!strcmp(items[i], "auto")) v = BENCH_DEPTH_AUTO, end = items[i] + 4;
        else if (*end || v < 0 || v > TD_MAX_SPEC_DEPTH) return -1;
        for (int j = 0; j < i; j++)
            if (su->depths[j] == v) return -1;
        su->depths[i] = (int)v;
    }
    su->n_depths = n;
    return 0;
}

static int parse_args(bench_cli *c, int argc, char **argv) {
    memset(c, 0, sizeof *c);
    td_common_opts_init(&c->co);
    c->co.spec_depth = -1; /* not given: the --depths list */
    c->co.spec_auto = false;
    c->max_tokens = 128;
    c->cost_reps = 9;
    c->su.n_runs = 3;
    c->prompts = "bench/prompts";
    parse_depths("0,1,2,3,4,auto", &c->su);
    parse_list("edit,code,prose", c->su.tasks, BENCH_MAX_TASKS, &c->su.n_tasks);
    for (int i = 1; i < argc; i++) {
        int r = td_common_opts_parse(&c->co, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VAL() (v ? (i++, v) : (td_cli_missing("bench", a, "see tandem bench --help"), NULL))
        if (td_cli_is_help(a)) { usage(stdout); return 1; }
        else if (td_cli_is_verbose(a)) td_cli_verbose = true;
        else if (!strcmp(a, "--memory")) c->memory = true;
        else if (!strcmp(a, "--ignore-eos")) c->ignore_eos = true;
        else if (!strcmp(a, "--no-costs")) c->no_costs = true;
        else if (!strcmp(a, "--enable-prefix-caching")) c->prefix_caching = true;
        else if (!strcmp(a, "--no-prefix-caching")) c->no_prefix_caching = true;
        else if (!strcmp(a, "--depths")) {
            const char *s = VAL();
            if (!s) return 2;
            if (parse_depths(s, &c->su)) { fprintf(stderr, "tandem bench: --depths wants distinct depths 0..%d, e.g. 0,1,2\n", TD_MAX_SPEC_DEPTH); return 2; }
            c->depths_given = true;
        } else if (!strcmp(a, "--tasks")) {
            const char *s = VAL();
            if (!s) return 2;
            if (parse_list(s, c->su.tasks, BENCH_MAX_TASKS, &c->su.n_tasks)) {
                fprintf(stderr, "tandem bench: --tasks must be a comma-separated list of up to %d prompt sets, got \"%s\"\n", BENCH_MAX_TASKS, s);
                return 2;
            }
        } else if (!strcmp(a, "--runs") || !strcmp(a, "--max-tokens") || !strcmp(a, "-n") || !strcmp(a, "--cost-reps")) {
            const char *s = VAL();
            char *end;
            if (!s) return 2;
            long n = strtol(s, &end, 10);
            long hi = !strcmp(a, "--runs") ? 64 : 1000000;
            if (end == s || *end || n < 1 || n > hi) { fprintf(stderr, "tandem bench: %s must be an integer in [1, %ld], got \"%s\"\n", a, hi, s); return 2; }
            if (!strcmp(a, "--runs")) c->su.n_runs = (int)n;
            else if (!strcmp(a, "--cost-reps")) c->cost_reps = (int)n;
            else c->max_tokens = (int)n, c->max_tokens_given = true;
        } else if (!strcmp(a, "--out")) { if (!(c->out = VAL())) return 2; }
        else if (!strcmp(a, "--prompts")) { if (!(c->prompts = VAL())) return 2; }
        else if (!strcmp(a, "--server")) { if (!(c->server = VAL())) return 2; }
        else if (!strcmp(a, "--api-key")) { if (!(c->api_key = VAL())) return 2; }
        else if (!strcmp(a, "--served-model")) { if (!(c->served_model = VAL())) return 2; }
        else if (!strcmp(a, "--agent-trace")) { if (!(c->trace = VAL())) return 2; }
        else if (!strcmp(a, "--merge")) {
            const char *f = VAL();
            if (!f) return 2;
            if (c->n_merge == 8) { fprintf(stderr, "tandem bench: at most 8 --merge files\n"); return 2; }
            c->merge[c->n_merge++] = f;
        }
        else return td_cli_unknown("bench", a);
#undef VAL
    }
    return 0;
}

static void machine_line(char *buf, size_t n, td_isa isa, td_tune tune) {
    char model[160] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 1 + (c[1] == ' ');
                c[strcspn(c, "\n")] = 0;
                snprintf(model, sizeof model, "%s", c);
            }
            break;
        }
    }
    if (f) fclose(f);
    unsigned long long mem = 0;
    f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu", &mem) == 1) break;
    if (f) fclose(f);
    /* the CPU kernels the in-process engine runs (--isa; the tuning is this CPU's) */
    snprintf(buf, n, "Machine: %s, %ld cores online, %.1f GiB RAM, CPU kernels %s (tuning %s), 1-minute load average %.2f at the start.",
             model, sysconf(_SC_NPROCESSORS_ONLN), (double)mem / (1024.0 * 1024.0), td_isa_name(isa),
             td_tune_name(tune), td_bench_load1());
}

static void progress(int i, int total, double t0, const char *what, double tps) {
    double el = td_bench_now() - t0, eta = i ? el / i * (total - i) : 0;
    int w = 30, fill = total ? i * w / total : w;
    char bar[64];
    for (int k = 0; k < w; k++) bar[k] = k < fill ? '#' : '.';
    bar[w] = 0;
    bool tty = isatty(2);
    if (!tty && i != total && total >= 10 && i % (total / 10) != 0) return;
    fprintf(stderr, "%s[%s] %d/%d %-24.24s %7.1f tok/s  elapsed %.0fs  eta %.0fs%s", tty ? "\r" : "", bar, i, total, what, tps, el, eta,
            tty ? "" : "\n");
    if (tty && i == total) fprintf(stderr, "\n");
}

static int mkdir_p(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0777) && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(p, 0777) && errno != EEXIST ? -1 : 0;
}

static int write_outputs(const bench_cli *c, const bench_report *r, const bench_sample *s, int n) {
    if (mkdir_p(c->out)) { fprintf(stderr, "tandem bench: cannot create %s: %s\n", c->out, strerror(errno)); return 1; }
    const char *names[4] = {"samples.csv", "summary.csv", "chart.svg", "report.md"};
    int bad = 0;
    for (int k = 0; k < 4; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", c->out, names[k]);
        FILE *f = fopen(path, "w");
        if (!f) { fprintf(stderr, "tandem bench: cannot write %s: %s\n", path, strerror(errno)); return 1; }
        if (k == 0) bad |= td_bench_write_samples_csv(f, &c->su, s, n);
        else if (k == 1) bad |= td_bench_write_cells_csv(f, &c->su, r->cells);
        else if (k == 2) bad |= td_bench_write_svg(f, &c->su, r->cells, r->title);
        else td_bench_write_markdown(f, r);
        bad |= fclose(f) != 0;
    }
    if (bad) fprintf(stderr, "tandem bench: error writing to %s\n", c->out);
    return bad ? 1 : 0;
}

/* The engine's depth: the largest fixed depth, or auto's maximum. */
static int max_depth(const bench_suite *su, int auto_max) {
    int m = 0;
    for (int d = 0; d < su->n_depths; d++) {
        int k = su->depths[d] == BENCH_DEPTH_AUTO ? auto_max : su->depths[d];
        if (k > m) m = k;
    }
    return m;
}

static bool has_auto(const bench_suite *su) {
    for (int d = 0; d < su->n_depths; d++)
        if (su->depths[d] == BENCH_DEPTH_AUTO) return true;
    return false;
}

static int run_trace(bench_cli *c, bench_params *p) {
    td_err err = {0};
    int depth = c->co.spec_depth >= 0 ? c->co.spec_depth : max_depth(&c->su, c->co.spec_depth_max);
    bench_local L;
    bench_remote R;
    bool local = !c->server;
    int rc;
    tokenizer *tok = NULL;
    bench_chat chat = {0};
    bool have_chat = false;
    if (local) {
        rc = td_bench_local_open(c->co.model, c->co.threads, c->co.max_model_len, depth, !c->no_prefix_caching, c->co.quantize, (int)c->co.precision, c->co.isa, c->co.mmap_weights, &L, &err);
    } else {
        rc = td_bench_remote_open(c->server, c->api_key, c->served_model, &R, &err);
        /* a local tokenizer, when the model directory has one, measures the shareable prefix */
        td_err e2 = {0};
        if (!rc && td_tok_load(c->co.model, &tok, &e2) == 0 && td_bench_chat_init(&chat, tok, &e2) == 0) have_chat = true;
    }
    if (rc) { fprintf(stderr, "tandem bench: %s\n", td_cli_errmsg(&err)); td_tok_free(tok); return 1; }
    bench_trace_opts to = {.file = c->trace, .params = *p, .depth = local ? depth : R.depth, .respect_turn_max_tokens = !c->max_tokens_given};
    FILE *csv = NULL;
    if (c->out) {
        char path[4200];
        snprintf(path, sizeof path, "%s/trace.csv", c->out);
        if (mkdir_p(c->out) || !(csv = fopen(path, "w"))) fprintf(stderr, "tandem bench: cannot write %s\n", path);
    }
    rc = td_bench_trace_run(&to, local ? &L : NULL, local ? NULL : &R, local ? &L.chat : have_chat ? &chat : NULL, stdout, csv, &err);
    if (rc) fprintf(stderr, "tandem bench: %s\n", td_cli_errmsg(&err));
    if (csv) fclose(csv);
    if (local) td_bench_local_close(&L);
    td_bench_chat_free(&chat);
    td_tok_free(tok);
    return rc ? 1 : 0;
}

int td_cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--kernels")) { /* tandem bench --kernels [OPTS] == tandem kernels [OPTS] */
            char *args[256];
            int n = 0;
            for (int k = 0; k < argc && n < 255; k++)
                if (k != i) args[n++] = argv[k];
            args[n] = NULL;
            return td_cmd_kernels(n, args);
        }
    bench_cli c;
    int pr = parse_args(&c, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    if (!c.server && td_cli_check_model_dir("tandem bench", c.co.model)) return 1;
    if (c.co.spec_depth >= 0 && !c.trace) {
        c.su.n_depths = 1;
        c.su.depths[0] = c.co.spec_auto ? BENCH_DEPTH_AUTO : c.co.spec_depth;
        c.depths_given = true;
    }
    bench_params p = {.max_tokens = c.max_tokens, .sampling = c.co.sampling, .ignore_eos = c.ignore_eos, .draft_sampling = c.co.draft_sampling};
    if (c.trace) return run_trace(&c, &p);

    td_err err = {0};
    bench_prompts pset;
    if (td_bench_prompts_load(c.prompts, &c.su, &pset, &err)) { fprintf(stderr, "tandem bench: %s\n", td_cli_errmsg(&err)); return 1; }
    bench_local L;
    bench_remote R;
    bool local = !c.server;
    int rc = local ? td_bench_local_open(c.co.model, c.co.threads, c.co.max_model_len, max_depth(&c.su, c.co.spec_depth_max), c.prefix_caching,
                                      c.co.quantize, (int)c.co.precision, c.co.isa, c.co.mmap_weights, &L, &err)
                   : td_bench_remote_open(c.server, c.api_key, c.served_model, &R, &err);
    if (!rc && local) {
        L.auto_max = c.co.spec_depth_max;
        if (has_auto(&c.su) && !L.eng->model->has_mtp) { /* auto without an MTP head: off */
            for (int d = 0; d < c.su.n_depths; d++)
                if (c.su.depths[d] == BENCH_DEPTH_AUTO) L.auto_max = 0;
        }
        if (has_auto(&c.su) && L.auto_max > 0) {
            fprintf(stderr, "calibrating the step costs for auto...\n");
            rc = td_engine_calibrate_spec(L.eng, L.auto_max, 1, 3, &err);
        }
    }
    if (rc) { fprintf(stderr, "tandem bench: %s\n", td_cli_errmsg(&err)); td_bench_prompts_free(&pset); return 1; }
    if (!local) {
        if (c.depths_given && c.su.n_depths != 1) rc = -1, fprintf(stderr, "tandem bench: with --server give one --depths value: the depth the server runs at\n");
        else if (R.depth >= 0 && c.depths_given && R.depth != c.su.depths[0])
            fprintf(stderr, "tandem bench: note: the server reports depth %d; labelling its results %d as asked\n", R.depth, c.su.depths[0]);
        else if (R.depth >= 0 && !c.depths_given) c.su.n_depths = 1, c.su.depths[0] = R.depth;
        else if (!c.depths_given) rc = -1, fprintf(stderr, "tandem bench: the server does not report its depth: give it as --depths N\n");
        if (!R.metrics_ok) fprintf(stderr, "tandem bench: note: no /metrics at %s: acceptance unknown\n", c.server);
        if (rc) { td_bench_prompts_free(&pset); return 2; }
    }
    /* tokenize every prompt once (in-process) */
    int32_t *ids[BENCH_MAX_TASKS][256];
    size_t nids[BENCH_MAX_TASKS][256];
    int longest = 0;
    memset(ids, 0, sizeof ids);
    for (int t = 0; local && t < c.su.n_tasks && !rc; t++)
        for (int i = 0; i < pset.n[t] && i < 256 && !rc; i++) {
            rc = td_bench_chat_encode(&L.chat, pset.p[t][i].messages, NULL, &ids[t][i], &nids[t][i], &err);
            if (!rc && (int)nids[t][i] > longest) longest = (int)nids[t][i];
        }
    int total = td_bench_order_len(c.su.n_runs, c.su.n_tasks, pset.n, c.su.n_depths);
    bench_slot *order = calloc((size_t)total, sizeof *order);
    bench_sample *samples = calloc((size_t)total, sizeof *samples);
    uint64_t rss_after[BENCH_MAX_DEPTHS] = {0};
    if (!rc && (!order || !samples)) rc = -1, snprintf(err.msg, sizeof err.msg, "out of memory");
    if (!rc) td_bench_order(c.su.n_runs, c.su.n_tasks, pset.n, c.su.n_depths, order);
    double t0 = td_bench_now();
    int done = 0;
    for (int k = 0; k < total && !rc; k++) {
        const bench_slot *sl = &order[k];
        bench_sample *s = &samples[k];
        int depth = c.su.depths[sl->depth_idx];
        rc = local ? td_bench_local_run(&L, ids[sl->task][sl->prompt], (int)nids[sl->task][sl->prompt], depth, &p, s, &err)
                   : td_bench_remote_run(&R, pset.p[sl->task][sl->prompt].messages, NULL, &p, s, &err);
        if (rc) break;
        s->run = sl->run;
        s->task = sl->task;
        s->prompt = sl->prompt;
        s->depth = depth;
        if (c.memory && local) {
            uint64_t r = td_bench_vm_rss();
            if (r > rss_after[sl->depth_idx]) rss_after[sl->depth_idx] = r;
        }
        done = k + 1;
        char what[96];
        if (depth == BENCH_DEPTH_AUTO) snprintf(what, sizeof what, "%s/%s auto", c.su.tasks[sl->task], pset.p[sl->task][sl->prompt].name);
        else snprintf(what, sizeof what, "%s/%s d%d", c.su.tasks[sl->task], pset.p[sl->task][sl->prompt].name, depth);
        progress(done, total, t0, what, s->decode_s > 0 && s->n_generated > 1 ? (s->n_generated - 1) / s->decode_s : 0);
    }
    if (rc) fprintf(stderr, "\ntandem bench: %s\n", td_cli_errmsg(&err));
    bench_costs costs;
    bool have_costs = false;
    if (!rc && local && !c.no_costs) {
        const int32_t *ctx = ids[0][0];
        int n_ctx = (int)nids[0][0];
        fprintf(stderr, "timing verify and draft cost...\n");
        if (td_bench_local_costs(&L, ctx, n_ctx, max_depth(&c.su, c.co.spec_depth_max) + 1, c.cost_reps, &costs, &err))
            fprintf(stderr, "tandem bench: cost timing failed: %s\n", td_cli_errmsg(&err));
        else have_costs = true;
    }
    for (int m = 0; m < c.n_merge && !rc; m++) {
        if (td_bench_merge_csv(c.merge[m], &c.su, &samples, &done, &err)) { fprintf(stderr, "tandem bench: %s\n", td_cli_errmsg(&err)); rc = -1; }
    }
    for (int i = 1; i < c.su.n_depths; i++) /* ascending depths after a merge */
        for (int j = i; j > 0 && c.su.depths[j] < c.su.depths[j - 1]; j--) {
            int x = c.su.depths[j]; c.su.depths[j] = c.su.depths[j - 1]; c.su.depths[j - 1] = x;
        }
    if (done > 0) {
        bench_cell *cells = calloc((size_t)(c.su.n_tasks * c.su.n_depths), sizeof *cells);
        bench_flag flags[64];
        if (!cells) { fprintf(stderr, "tandem bench: out of memory\n"); rc = -1; goto out; }
        td_bench_cells(&c.su, samples, done, cells);
        if (have_costs) td_bench_predict_cells(&c.su, cells, &costs);
        int nf = td_bench_sanity(&c.su, cells, samples, done, flags, 64);
        char title[600], machine[400];
        snprintf(title, sizeof title, "Model %s; %s; %d task%s x %d depth%s x %d run%s%s.", local ? c.co.model : R.model,
                 local ? "in-process, one warm engine for every depth" : samples[0].cond.backend, c.su.n_tasks, c.su.n_tasks == 1 ? "" : "s",
                 c.su.n_depths, c.su.n_depths == 1 ? "" : "s", c.su.n_runs, c.su.n_runs == 1 ? "" : "s", done < total ? " (INCOMPLETE)" : "");
        if (local) machine_line(machine, sizeof machine, (td_isa)td_engine_backend(L.eng)->isa, (td_tune)td_engine_backend(L.eng)->tune);
        bench_report r = {.su = &c.su, .cells = cells, .samples = samples, .n_samples = done, .costs = have_costs ? &costs : NULL,
                          .flags = flags, .n_flags = nf < 64 ? nf : 64, .title = title, .machine = local ? machine : NULL};
        td_bench_write_markdown(stdout, &r);
        if (c.memory && local) {
            td_kv_info ki;
            td_engine_kv_info(L.eng, &ki);
            if (td_bench_memory_report(stdout, c.co.model, &c.su, longest + c.max_tokens, td_bench_local_session_bytes(&L, longest + c.max_tokens),
                                    &ki, c.n_merge ? NULL : rss_after, &err))
                fprintf(stderr, "tandem bench: memory: %s\n", td_cli_errmsg(&err));
        } else if (c.memory) {
            fprintf(stdout, "\n## Memory\n\nNot measured with --server (run `tandem plan` for the server's model).\n");
        }
        fflush(stdout);
        if (c.out && write_outputs(&c, &r, samples, done)) rc = -1;
        free(cells);
    }
out:
    for (int t = 0; t < BENCH_MAX_TASKS; t++)
        for (int i = 0; i < 256; i++) free(ids[t][i]);
    free(order);
    free(samples);
    if (local) td_bench_local_close(&L);
    td_bench_prompts_free(&pset);
    return rc ? 1 : 0;
}
