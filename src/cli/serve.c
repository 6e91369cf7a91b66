/* `tandem serve`: OpenAI-compatible HTTP server (see src/server/server.h).
 * Binds first (so /health answers 503 while loading), then loads the
 * tokenizer, the engine and the scheduler, and serves until SIGINT/SIGTERM:
 * new requests are refused, those in flight get --shutdown-timeout seconds
 * to finish, the rest are cancelled, and it exits 0. */
#include <jansson.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "cli/memory.h"
#include "spec/calibrate.h"
#include "cli/opts.h"
#include "sched/sched.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

/* A JSON list of strings or a comma list -> strings (malloc'd, for the
 * process's lifetime). Returns the count, -1 when malformed. */
static int parse_list(const char *v, char ***out) {
    int n = 0;
    char **a = NULL;
    json_t *j = *v == '[' ? json_loads(v, 0, NULL) : NULL;
    if (*v == '[') {
        size_t i;
        json_t *x;
        if (!json_is_array(j)) { json_decref(j); return -1; }
        a = calloc(json_array_size(j) + 1, sizeof *a);
        json_array_foreach(j, i, x) {
            if (!a || !json_is_string(x)) {
                for (int k = 0; a && k < n; k++) free(a[k]);
                json_decref(j);
                free(a);
                return -1;
            }
            a[n++] = strdup(json_string_value(x));
        }
        json_decref(j);
    } else {
        a = calloc(strlen(v) + 2, sizeof *a);
        char *copy = strdup(v), *save = NULL;
        for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; a && t; t = strtok_r(NULL, ",", &save)) {
            while (*t == ' ') t++;
            size_t l = strlen(t);
            while (l && t[l - 1] == ' ') t[--l] = 0;
            if (l) a[n++] = strdup(t);
        }
        free(copy);
    }
    if (!a) return -1;
    *out = a;
    return n;
}

static void free_list(char **a) {
    for (char **p = a; p && *p; p++) free(*p);
    free(a);
}

/* Joins a list with ", " (a CORS header value). */
static char *join_list(char **a, int n) {
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(a[i]) + 2;
    char *s = calloc(len, 1);
    for (int i = 0; s && i < n; i++) {
        if (i) strcat(s, ", ");
        strcat(s, a[i]);
    }
    return s;
}

/* The scheduler's notable events (preemptions, failed steps), one line each. */
static void sched_log_line(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "tandem serve: %s\n", line);
}

static const char *help =
    "usage: tandem serve [-m DIR] [options]\n"
    "  OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/responses, /v1/models, /health, /metrics,\n"
    "  and the Anthropic Messages API (/v1/messages, /v1/messages/count_tokens); the /v1 prefix is optional\n"
    "  --host ADDR                  bind address (default 127.0.0.1)\n"
    "  --port N                     port (default 8000; 0 = any free port)\n"
    "  --api-key KEY                require 'Authorization: Bearer KEY' (all routes but /health)\n"
    "  --served-model-name NAME     model id in the API (default: the directory's name)\n"
    "  --max-num-seqs N             requests run at once, 1..16M (default 8)\n"
    "  --max-queue N                waiting requests before 503, 0..16M (default 64)\n"
    "  --max-num-batched-tokens N   tokens per engine step, for chunked prefill, 1..16M (default 512)\n"
    "  --enable-prefix-caching / --no-prefix-caching   (default on)\n"
    "  --max-body BYTES             largest request body, at least 1k, k/M suffixes (default 32M)\n"
    "  --http-threads N             HTTP polling threads (and as many prompt workers), 1..64 (default 4)\n"
    "  --max-connections-per-ip N   connections from one address at once, 0..1000, 0 = no limit (default 128;\n"
    "                               behind a reverse proxy every client shares its address: raise it)\n"
    "  --idle-timeout S             close a connection after S seconds without traffic, 0..86400, 0 = never\n"
    "                               (default 30; requests waiting for the model are exempt)\n"
    "  --max-stream-buffer BYTES    unsent stream output before a client that does not read is cancelled,\n"
    "                               at least 4k, k/M suffixes (default 4M)\n"
    "  --responses-store N          /v1/responses kept in memory for previous_response_id and GET, least\n"
    "                               recently used dropped first, 0..1M, 0 = none (default 1000)\n"
    "  --responses-store-bytes BYTES  memory for them, at least 1k, k/M suffixes (default 64M)\n"
    "  --shutdown-timeout S         on SIGTERM, seconds for requests in flight, 0..86400 (default 10)\n"
    "  --enforce-eager              accepted (GPU only; the CPU backend captures no graphs)\n"
    "  --quiet                      no per-request log lines (default: one line per request)\n"
    "  --reasoning-field F          name of the reasoning output: reasoning (vLLM), reasoning_content\n"
    "                               (llama.cpp, older vLLM) or both (default both; input takes either)\n"
    "  --allowed-origins LIST       CORS: origins allowed, a JSON list or comma list, \"*\" = any\n"
    "                               (default none: no CORS headers)\n"
    "  --allowed-methods LIST       CORS: methods a preflight allows (default \"*\")\n"
    "  --allowed-headers LIST       CORS: request headers a preflight allows (default \"*\")\n"
    "  --allow-credentials          CORS: Access-Control-Allow-Credentials: true\n"
    "  -v, --verbose                errors with their source location\n"
    "  -h, --help                   this help\n"
    "common options (sampling flags set the defaults for requests that leave them out;\n"
    "--generation-config sets them first):\n";

int td_cmd_serve(int argc, char **argv) {
    common_opts o;
    td_common_opts_init(&o);
    int gen_max = 0;
    bool want_help = false;
    for (int i = 1; i < argc; i++) want_help |= td_cli_is_help(argv[i]);
    if (!want_help && td_cli_generation_defaults(&o, argc, argv, &gen_max)) return 1;
    srv_config cfg = {.host = "127.0.0.1", .port = 8000, .max_body = 32u << 20, .http_threads = 4,
                      .max_conn_per_ip = 128, .idle_timeout_s = 30, .max_stream_buffer = 4u << 20};
    td_sched_opts so;
    td_sched_opts_default(&so);
    double shutdown_s = 10;
    const char *gpu_only[3] = {NULL, NULL, NULL};
    for (int i = 1; i < argc; i++) {
        int r = td_common_opts_parse(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r) {
            if (!strcmp(argv[i], "--seed") || !strcmp(argv[i - 1], "--seed")) cfg.sampling_seed_set = true;
            continue;
        }
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
#define NEED()                                                                     \
    do {                                                                           \
        if (!v) { fprintf(stderr, "tandem serve: %s needs a value\n", a); return 2; } \
        i++;                                                                       \
    } while (0)
        if (!strcmp(a, "--host")) { NEED(); cfg.host = v; }
        else if (!strcmp(a, "--port")) {
            NEED();
            n = td_parse_size_suffix(v);
            if (n < 0 || n > 65535 || strpbrk(v, "kKmM.")) { fprintf(stderr, "tandem serve: --port must be an integer in [0, 65535], got \"%s\"\n", v); return 2; }
            cfg.port = (int)n;
        } else if (!strcmp(a, "--api-key")) {
            NEED();
            if (!*v) { fprintf(stderr, "tandem serve: --api-key is empty (an unset variable?): give a key, or leave the option out to serve without one\n"); return 2; }
            cfg.api_key = v;
        }
        else if (!strcmp(a, "--served-model-name")) { NEED(); cfg.served_model_name = v; }
        else if (!strcmp(a, "--max-num-seqs") || !strcmp(a, "--max-queue") || !strcmp(a, "--max-num-batched-tokens") ||
                 !strcmp(a, "--http-threads")) {
            NEED();
            n = td_parse_size_suffix(v);
            bool q = !strcmp(a, "--max-queue");
            if (n < (q ? 0 : 1) || n > (1 << 24)) { fprintf(stderr, "tandem serve: %s must be an integer in [%d, 16777216], got \"%s\"\n", a, q ? 0 : 1, v); return 2; }
            if (!strcmp(a, "--max-num-seqs")) so.max_num_seqs = (int)n;
            else if (q) so.max_queue = (int)n;
            else if (!strcmp(a, "--http-threads")) cfg.http_threads = n > 64 ? 64 : (int)n;
            else so.max_batch_tokens = (int)n;
        } else if (!strcmp(a, "--max-body")) {
            NEED();
            n = td_parse_size_suffix(v);
            if (n < 1024) { fprintf(stderr, "tandem serve: --max-body must be a size of at least 1k (e.g. 32M), got \"%s\"\n", v); return 2; }
            cfg.max_body = (size_t)n;
        } else if (!strcmp(a, "--max-connections-per-ip") || !strcmp(a, "--idle-timeout")) {
            NEED();
            bool ip = !strcmp(a, "--max-connections-per-ip");
            long hi = ip ? 1000 : 86400;
            n = strpbrk(v, "kKmM.") ? -1 : td_parse_size_suffix(v);
            if (n < 0 || n > hi) {
                fprintf(stderr, "tandem serve: %s must be an integer in [0, %ld], got \"%s\"\n", a, hi, v);
                return 2;
            }
            if (ip) cfg.max_conn_per_ip = (unsigned)n;
            else cfg.idle_timeout_s = (unsigned)n;
        } else if (!strcmp(a, "--max-stream-buffer")) {
            NEED();
            n = td_parse_size_suffix(v);
            if (n < 4096) { fprintf(stderr, "tandem serve: --max-stream-buffer must be a size of at least 4k (e.g. 4M), got \"%s\"\n", v); return 2; }
            cfg.max_stream_buffer = (size_t)n;
        } else if (!strcmp(a, "--responses-store")) {
            NEED();
            n = strpbrk(v, "kKmM.") ? -1 : td_parse_size_suffix(v);
            if (n < 0 || n > (1 << 20)) { fprintf(stderr, "tandem serve: --responses-store must be an integer in [0, 1048576], got \"%s\"\n", v); return 2; }
            cfg.responses_store_max = n ? (int)n : -1;
        } else if (!strcmp(a, "--responses-store-bytes")) {
            NEED();
            n = td_parse_size_suffix(v);
            if (n < 1024) { fprintf(stderr, "tandem serve: --responses-store-bytes must be a size of at least 1k (e.g. 64M), got \"%s\"\n", v); return 2; }
            cfg.responses_store_bytes = (size_t)n;
        } else if (!strcmp(a, "--shutdown-timeout")) {
            NEED();
            char *end;
            shutdown_s = strtod(v, &end);
            if (end == v || *end || !(shutdown_s >= 0 && shutdown_s <= 86400)) {
                fprintf(stderr, "tandem serve: --shutdown-timeout must be a number of seconds in [0, 86400], got \"%s\"\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--enforce-eager")) gpu_only[2] = "on";
        else if (!strcmp(a, "--quiet")) cfg.quiet = true;
        else if (!strcmp(a, "--reasoning-field")) {
            NEED();
            if (!strcmp(v, "both")) cfg.reasoning_field = SRV_REASONING_BOTH;
            else if (!strcmp(v, "reasoning")) cfg.reasoning_field = SRV_REASONING_NEW;
            else if (!strcmp(v, "reasoning_content")) cfg.reasoning_field = SRV_REASONING_CONTENT;
            else { fprintf(stderr, "tandem serve: --reasoning-field must be reasoning, reasoning_content or both, got \"%s\"\n", v); return 2; }
        } else if (!strcmp(a, "--allowed-origins") || !strcmp(a, "--allowed-methods") || !strcmp(a, "--allowed-headers")) {
            NEED();
            char **l = NULL;
            int k = parse_list(v, &l);
            if (k < 0) { fprintf(stderr, "tandem serve: %s must be a JSON list of strings or a comma list, got \"%s\"\n", a, v); return 2; }
            if (a[10] == 'o') {
                free_list((char **)cfg.allowed_origins);
                cfg.allowed_origins = (const char *const *)l, cfg.n_allowed_origins = k;
                continue;
            }
            const char **dst = a[10] == 'm' ? &cfg.allowed_methods : &cfg.allowed_headers;
            free((char *)*dst);
            *dst = join_list(l, k);
            free_list(l);
        } else if (!strcmp(a, "--allow-credentials")) cfg.allow_credentials = true;
        else if (td_cli_is_verbose(a)) td_cli_verbose = true;
        else if (td_cli_is_help(a)) {
            printf("%s%s", help, td_common_opts_help());
            return 0;
        } else {
            return td_cli_unknown("serve", a);
        }
#undef NEED
    }
    if (td_cli_check_model_dir("tandem serve", o.model)) return 1;
    char *dir_copy = strdup(o.model), *base = NULL;
    if (!dir_copy) return 1;
    size_t dl = strlen(dir_copy);
    while (dl > 1 && dir_copy[dl - 1] == '/') dir_copy[--dl] = 0;
    base = basename(dir_copy);
    cfg.served_model_name = cfg.served_model_name ? cfg.served_model_name : base;
    cfg.model_dir = o.model;
    cfg.spec_depth = td_cli_engine_spec_depth(&o);
    cfg.spec_auto = o.spec_auto && cfg.spec_depth > 0;
    cfg.draft_sampling = o.draft_sampling;
    cfg.sampling = o.sampling;
    cfg.default_max_tokens = gen_max;
    cfg.max_num_seqs = so.max_num_seqs;
    cfg.max_queue = so.max_queue;
    if (gpu_only[2]) fprintf(stderr, "tandem serve: --enforce-eager accepted (GPU backends only)\n");

    /* Signals are taken by sigwait below; every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    td_err err = {0};
    srv *s = NULL;
    if (td_srv_start(&cfg, &s, &err)) {
        td_cli_error("tandem serve", &err);
        free(dir_copy);
        return 1;
    }
    bool v6 = strchr(cfg.host, ':') != NULL;
    fprintf(stderr, "tandem serve: listening on http://%s%s%s:%d (loading %s; /health is 503 until ready)\n",
            v6 ? "[" : "", cfg.host, v6 ? "]" : "", td_srv_port(s), o.model);
    fflush(stderr);

    int rc = 1;
    tokenizer *tok = NULL;
    td_engine *eng = NULL;
    td_sched *sched = NULL;
    if (td_tok_load(o.model, &tok, &err)) { td_cli_error("tandem serve", &err); goto out; }
    so.prefix_caching = o.prefix_caching;
    so.on_log = sched_log_line;
    td_engine_opts eo;
    char kv_summary[512] = "";
    if (td_cli_engine_opts(&o, so.max_num_seqs, so.max_batch_tokens, &eo, stderr, kv_summary, sizeof kv_summary)) goto out;
    if (td_engine_load(o.model, &eo, &eng, &err)) { td_cli_error("tandem serve", &err); goto out; }
    char graphs[256];
    if (td_engine_capture_graphs(eng, eo.spec_depth, graphs, sizeof graphs, &err)) { td_cli_error("tandem serve", &err); goto out; }
    if (graphs[0]) fprintf(stderr, "tandem serve: %s\n", graphs);
    td_cli_print_cuda_mode(stderr, "tandem serve", eng);
    if (cfg.spec_auto && td_engine_calibrate_spec(eng, eo.spec_depth, so.max_num_seqs, 3, &err)) { td_cli_error("tandem serve", &err); goto out; }
    td_cli_print_sampling("tandem serve", &o);
    fprintf(stderr, "%s\n", kv_summary);
    td_model_info mi;
    td_engine_info(eng, &mi);
    if (td_sched_new(eng, &so, &sched, &err)) { td_cli_error("tandem serve", &err); goto out; }
    srv_model m = {.tok = tok, .eng = eng, .sched = sched, .n_ctx = mi.max_position_embeddings};
    if (td_srv_set_model(s, &m, &err)) { td_cli_error("tandem serve", &err); goto out; }
    fprintf(stderr, "tandem serve: ready on http://%s%s%s:%d: model \"%s\" (%s), max_model_len %d, backend %s%s, spec depth %s%d, max_num_seqs %d, max_queue %d%s\n",
            v6 ? "[" : "", cfg.host, v6 ? "]" : "", td_srv_port(s), cfg.served_model_name, mi.model_type ? mi.model_type : "?",
            mi.max_position_embeddings, mi.backend, eo.precision == TD_PRECISION_BF16 ? " (bf16 activations)" : eo.precision == TD_PRECISION_INT8 ? " (int8 activations)" : "", cfg.spec_auto ? "auto, at most " : "", cfg.spec_depth, so.max_num_seqs, so.max_queue, cfg.api_key ? ", API key required" : "");
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "tandem serve: %s: finishing requests in flight (up to %.0fs)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", shutdown_s);
    int left = td_srv_drain(s, shutdown_s);
    if (left) fprintf(stderr, "tandem serve: cancelling %d requests\n", left);
    rc = 0;
out:
    {
        td_sched *sc = s ? td_srv_detach_sched(s) : NULL;
        if (!sc) sc = sched;
        td_sched_free(sc); /* cancels what is left: their streams end */
        td_srv_free(s, 2.0);
        td_engine_free(eng);
        td_tok_free(tok);
        free(dir_copy);
        free_list((char **)cfg.allowed_origins);
        free((char *)cfg.allowed_methods);
        free((char *)cfg.allowed_headers);
    }
    return rc;
}
