/* Prometheus text exposition of the server's metrics (see metrics.h). */
#include "server/metrics.h"
#include <stdio.h>
#include <string.h>

/* Buckets as vLLM's. */
static const double ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_b[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_b[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                               30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
/* vLLM's build_1_2_5_buckets, up to 10^7; rendered up to max_model_len */
static const double tok_b[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7};
static const int codes[SRV_N_CODES] = {200, 400, 401, 404, 405, 413, 415, 500, 503, 501};

int td_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    m->hist[M_TTFT] = (srv_hist){.bounds = ttft_b, .nb = (int)(sizeof ttft_b / sizeof ttft_b[0])};
    m->hist[M_ITL] = (srv_hist){.bounds = itl_b, .nb = (int)(sizeof itl_b / sizeof itl_b[0])};
    m->hist[M_E2E] = (srv_hist){.bounds = e2e_b, .nb = (int)(sizeof e2e_b / sizeof e2e_b[0])};
    for (int i = M_QUEUE; i <= M_INFER; i++) m->hist[i] = m->hist[M_E2E]; /* vLLM: request_latency_buckets for all */
    m->hist[M_PROMPT_TOKENS] = (srv_hist){.bounds = tok_b, .nb = (int)(sizeof tok_b / sizeof tok_b[0])};
    m->hist[M_GEN_TOKENS] = m->hist[M_PROMPT_TOKENS];
    return pthread_mutex_init(&m->mu, NULL) ? -1 : 0;
}

void td_metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void td_metrics_observe(srv_metrics *m, srv_hist_id id, double v) {
    pthread_mutex_lock(&m->mu);
    srv_hist *h = &m->hist[id];
    int i = 0;
    while (i < h->nb && v > h->bounds[i]) i++;
    h->counts[i]++; /* i == nb: +Inf only */
    h->n++;
    h->sum += v;
    pthread_mutex_unlock(&m->mu);
}

void td_metrics_http(srv_metrics *m, int status) {
    int i = 0;
    while (i < SRV_N_CODES && codes[i] != status) i++;
    pthread_mutex_lock(&m->mu);
    m->http[i]++;
    pthread_mutex_unlock(&m->mu);
}

void td_metrics_add(srv_metrics *m, uint64_t *counter, uint64_t n) {
    pthread_mutex_lock(&m->mu);
    *counter += n;
    pthread_mutex_unlock(&m->mu);
}

void td_metrics_request_done(srv_metrics *m, double e2e, int n_prompt, const td_gen_result *res) {
    if (!res || res->n_prompt <= 0) return; /* never admitted */
    double infer = res->prefill_seconds + res->decode_seconds, queue = e2e - infer;
    td_metrics_observe(m, M_QUEUE, queue > 0 ? queue : 0);
    td_metrics_observe(m, M_PREFILL, res->prefill_seconds);
    td_metrics_observe(m, M_DECODE, res->decode_seconds);
    td_metrics_observe(m, M_INFER, infer);
    td_metrics_observe(m, M_PROMPT_TOKENS, n_prompt);
    td_metrics_observe(m, M_GEN_TOKENS, res->n_generated);
}

/* model_name="..." with Prometheus label escaping. */
static int label(sbuf *b, const char *name) {
    if (td_sb_adds(b, "model_name=\"")) return -1;
    for (const char *p = name; *p; p++) {
        const char *e = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        if (e ? td_sb_adds(b, e) : td_sb_add(b, p, 1)) return -1;
    }
    return td_sb_adds(b, "\"");
}

static int head(sbuf *b, const char *name, const char *type, const char *help) {
    return td_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static int sample_u(sbuf *b, const char *name, const char *model, const char *extra, uint64_t v) {
    if (td_sb_printf(b, "%s{", name) || label(b, model)) return -1;
    if (extra && td_sb_printf(b, ",%s", extra)) return -1;
    return td_sb_printf(b, "} %llu\n", (unsigned long long)v);
}

static int sample_d(sbuf *b, const char *name, const char *model, const char *extra, double v) {
    if (td_sb_printf(b, "%s{", name) || label(b, model)) return -1;
    if (extra && td_sb_printf(b, ",%s", extra)) return -1;
    return td_sb_printf(b, "} %.9g\n", v);
}

static int counter(sbuf *b, const char *name, const char *help, const char *model, uint64_t v) {
    return head(b, name, "counter", help) || sample_u(b, name, model, NULL, v) ? -1 : 0;
}

static int gauge(sbuf *b, const char *name, const char *help, const char *model, double v) {
    return head(b, name, "gauge", help) || sample_d(b, name, model, NULL, v) ? -1 : 0;
}

/* Buckets up to max_le (0: all), then +Inf. */
static int histogram_upto(sbuf *b, const char *name, const char *help, const char *model, const srv_hist *h, double max_le) {
    char n2[128], le[64];
    if (head(b, name, "histogram", help)) return -1;
    snprintf(n2, sizeof n2, "%s_bucket", name);
    uint64_t cum = 0;
    for (int i = 0; i <= h->nb; i++) {
        cum += h->counts[i];
        if (i < h->nb && max_le > 0 && h->bounds[i] > max_le) continue;
        if (i < h->nb) snprintf(le, sizeof le, "le=\"%g\"", h->bounds[i]);
        else snprintf(le, sizeof le, "le=\"+Inf\"");
        if (sample_u(b, n2, model, le, cum)) return -1;
    }
    snprintf(n2, sizeof n2, "%s_sum", name);
    if (sample_d(b, n2, model, NULL, h->sum)) return -1;
    snprintf(n2, sizeof n2, "%s_count", name);
    return sample_u(b, n2, model, NULL, h->n);
}

static int histogram(sbuf *b, const char *name, const char *help, const char *model, const srv_hist *h) {
    return histogram_upto(b, name, help, model, h, 0);
}

/* vllm:iteration_tokens_total from the scheduler's per-step counts. */
static int iteration_hist(sbuf *b, const char *model, const struct td_sched_stats *st) {
    srv_hist h = {.nb = TD_ITER_NB};
    double bounds[TD_ITER_NB];
    for (int i = 0; i < TD_ITER_NB; i++) bounds[i] = td_iter_token_bounds[i];
    h.bounds = bounds;
    for (int i = 0; i <= TD_ITER_NB; i++) {
        h.counts[i] = st->iter_tokens[i];
        h.n += st->iter_tokens[i];
    }
    h.sum = (double)st->iter_tokens_sum;
    return histogram(b, "vllm:iteration_tokens_total", "Tokens per engine step (prefilled + generated).", model, &h);
}

int td_metrics_render(srv_metrics *m, const metrics_ctx *c, sbuf *out) {
    struct td_sched_stats z;
    memset(&z, 0, sizeof z);
    const struct td_sched_stats *st = c->have_stats ? c->st : &z;
    const char *mn = c->model_name;
    srv_metrics s; /* consistent snapshot */
    pthread_mutex_lock(&m->mu);
    memcpy(s.hist, m->hist, sizeof s.hist);
    memcpy(s.http, m->http, sizeof s.http);
    memcpy(s.finished, m->finished, sizeof s.finished);
    s.cancelled_disconnect = m->cancelled_disconnect;
    s.rejected_queue_full = m->rejected_queue_full;
    s.tool_calls = m->tool_calls;
    s.stream_requests = m->stream_requests;
    s.requests = m->requests;
    pthread_mutex_unlock(&m->mu);
    const td_spec_counters *sp = &st->spec;
    sbuf *b = out;
    int r = 0;
    r |= gauge(b, "vllm:num_requests_running", "Number of requests running (in the batch).", mn, st->running);
    r |= gauge(b, "vllm:num_requests_waiting", "Number of requests waiting to be scheduled.", mn, st->waiting);
    r |= gauge(b, "vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100%.", mn, st->kv_cache_usage);
    r |= counter(b, "vllm:num_preemptions_total", "Cumulative number of preemptions.", mn, st->preemptions);
    r |= gauge(b, "tandem_kv_blocks", "KV-cache blocks in the pool.", mn, st->kv_blocks);
    r |= gauge(b, "tandem_prefix_checkpoint_bytes", "Bytes held by prefix-cache checkpoints (DeltaNet states; bounded).", mn,
               (double)st->prefix_checkpoint_bytes);
    r |= gauge(b, "tandem_kv_blocks_free", "KV-cache blocks free or cached (evictable).", mn, st->kv_free_blocks);
    r |= gauge(b, "tandem_kv_blocks_checkpoint", "KV-cache blocks held by prefix-cache checkpoints (given back when needed).", mn,
               st->kv_checkpoint_blocks);
    r |= counter(b, "vllm:prompt_tokens_total", "Prefill tokens processed.", mn, st->prompt_tokens);
    r |= counter(b, "vllm:generation_tokens_total", "Generation tokens produced.", mn, st->generation_tokens);
    r |= counter(b, "vllm:prefix_cache_queries_total", "Prefix-cache queries, in tokens.", mn, st->prefix_cache_queries);
    r |= counter(b, "vllm:prefix_cache_hits_total", "Prefix-cache hits, in tokens.", mn, st->prefix_cache_hits);
    r |= counter(b, "vllm:spec_decode_num_drafts_total", "Speculative-decoding drafts.", mn, sp->drafts);
    r |= counter(b, "vllm:spec_decode_num_draft_tokens_total", "Draft tokens proposed.", mn, sp->draft_tokens);
    r |= counter(b, "vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", mn, sp->accepted_tokens);
    const char *pp = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
    r |= head(b, pp, "counter", "Drafts with at least position+1 accepted tokens.");
    int npos = c->spec_depth > 0 ? c->spec_depth : 0;
    for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++)
        if (sp->accepted_per_pos[i] && i + 1 > npos) npos = i + 1;
    for (int i = 0; i < npos; i++) {
        char pos[32];
        snprintf(pos, sizeof pos, "position=\"%d\"", i);
        r |= sample_u(b, pp, mn, pos, sp->accepted_per_pos[i]);
    }
    r |= head(b, "vllm:request_success_total", "counter", "Finished requests by finish reason.");
    static const char *const fin[F_NFINISH] = {"stop", "length", "abort", "error"};
    for (int i = 0; i < F_NFINISH; i++) {
        char l[48];
        snprintf(l, sizeof l, "finished_reason=\"%s\"", fin[i]);
        r |= sample_u(b, "vllm:request_success_total", mn, l, s.finished[i]);
    }
    r |= histogram(b, "vllm:time_to_first_token_seconds", "Time to first token.", mn, &s.hist[M_TTFT]);
    r |= histogram(b, "vllm:inter_token_latency_seconds", "Time between generated tokens.", mn, &s.hist[M_ITL]);
    r |= histogram(b, "vllm:e2e_request_latency_seconds", "Request latency, arrival to last token.", mn, &s.hist[M_E2E]);
    r |= histogram(b, "vllm:request_queue_time_seconds", "Time a request waited for admission.", mn, &s.hist[M_QUEUE]);
    r |= histogram(b, "vllm:request_prefill_time_seconds", "Prefill time of a request (admission to first token).", mn, &s.hist[M_PREFILL]);
    r |= histogram(b, "vllm:request_decode_time_seconds", "Decode time of a request (first to last token).", mn, &s.hist[M_DECODE]);
    r |= histogram(b, "vllm:request_inference_time_seconds", "Prefill plus decode time of a request.", mn, &s.hist[M_INFER]);
    r |= histogram_upto(b, "vllm:request_prompt_tokens", "Prompt tokens per finished request.", mn, &s.hist[M_PROMPT_TOKENS], c->n_ctx);
    r |= histogram_upto(b, "vllm:request_generation_tokens", "Generated tokens per finished request.", mn, &s.hist[M_GEN_TOKENS], c->n_ctx);
    r |= iteration_hist(b, mn, st);
    r |= counter(b, "vllm:prompt_tokens_cached_total", "Prompt tokens restored from the prefix cache.", mn, st->prefix_cache_hits);
    /* tandem's own */
    r |= gauge(b, "tandem_model_loaded", "1 once the model is loaded and requests are served.", mn, c->loaded);
    r |= gauge(b, "tandem_uptime_seconds", "Seconds since the server started.", mn, c->uptime_s);
    r |= gauge(b, "tandem_spec_decode_depth", "Default MTP draft tokens per step (the maximum with auto).", mn, c->spec_depth);
    r |= gauge(b, "tandem_spec_decode_auto", "1 when the draft depth is chosen per step (--spec-depth auto).", mn, c->spec_auto);
    {   /* the depth each decode step ran at (auto: chosen), finished requests */
        const char *cd = "tandem_spec_chosen_depth";
        char n2[64], le[32];
        uint64_t cum = 0, sum = 0;
        int kmax = c->spec_depth > 0 ? c->spec_depth : 0;
        for (int k = 0; k <= TD_MAX_SPEC_DEPTH; k++)
            if (sp->chosen_depth[k] && k > kmax) kmax = k;
        r |= head(b, cd, "histogram", "Draft depth of each decode step (0 = no draft).");
        snprintf(n2, sizeof n2, "%s_bucket", cd);
        for (int k = 0; k <= kmax; k++) {
            cum += sp->chosen_depth[k];
            sum += (uint64_t)k * sp->chosen_depth[k];
            snprintf(le, sizeof le, "le=\"%d\"", k);
            r |= sample_u(b, n2, mn, le, cum);
        }
        r |= sample_u(b, n2, mn, "le=\"+Inf\"", cum);
        snprintf(n2, sizeof n2, "%s_sum", cd);
        r |= sample_u(b, n2, mn, NULL, sum);
        snprintf(n2, sizeof n2, "%s_count", cd);
        r |= sample_u(b, n2, mn, NULL, cum);
    }
    r |= counter(b, "tandem_spec_explored_steps_total", "Decode steps auto ran at a deeper depth than its choice, to measure it.", mn,
                 sp->explored_steps);
    r |= counter(b, "tandem_spec_tracked_steps_total", "Decode steps that kept the MTP layer in step with the target (what auto pays at depth 0 to be able to draft).", mn,
                 sp->tracked_steps);
    r |= gauge(b, "tandem_max_num_seqs", "Requests run at once at most.", mn, c->max_num_seqs);
    r |= gauge(b, "tandem_max_queue", "Waiting requests before 503.", mn, c->max_queue);
    r |= gauge(b, "tandem_max_model_len", "Context window in tokens.", mn, c->n_ctx);
    r |= gauge(b, "tandem_spec_decode_mean_acceptance_length", "1 + accepted / drafts.", mn,
               sp->drafts ? 1.0 + (double)sp->accepted_tokens / (double)sp->drafts : 0.0);
    r |= counter(b, "tandem_requests_total", "Generation requests accepted (chat and completions).", mn, s.requests);
    r |= counter(b, "tandem_stream_requests_total", "Streamed generation requests.", mn, s.stream_requests);
    r |= counter(b, "tandem_requests_finished_total", "Requests the scheduler finished.", mn, st->requests_finished);
    r |= counter(b, "tandem_requests_cancelled_total", "Requests cancelled because the client went away.", mn, s.cancelled_disconnect);
    r |= counter(b, "tandem_requests_rejected_total", "Requests refused with 503 because the queue was full.", mn, s.rejected_queue_full);
    r |= counter(b, "tandem_tool_calls_total", "Tool calls parsed from model output.", mn, s.tool_calls);
    r |= head(b, "tandem_http_responses_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i <= SRV_N_CODES; i++) {
        char l[32];
        if (i < SRV_N_CODES) snprintf(l, sizeof l, "code=\"%d\"", codes[i]);
        else snprintf(l, sizeof l, "code=\"other\"");
        r |= sample_u(b, "tandem_http_responses_total", mn, l, s.http[i]);
    }
    return r ? -1 : 0;
}
