/* Agent-trace replay: a recorded multi-turn session (each turn the full
 * messages array the agent sent, growing with tool calls and results) sent
 * again turn by turn; tokens read and written, prefix-cache hits, time per
 * turn. Format (bench/traces/README.md):
 *   {"description": "...", "tools": [...],
 *    "turns": [{"messages": [...], "max_tokens": N, "tools"?: [...]}, ...]}
 * or a bare array of turns. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench/runner.h"
#include "util/err.h"

static int load_trace(const char *file, json_t **turns, json_t **tools, char *desc, size_t dcap, td_err *err) {
    json_error_t je;
    json_t *j = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
    if (!j) return TD_FAIL(err, TD_ERR_FORMAT, "%s:%d:%d: %s", file, je.line, je.column, je.text);
    json_t *t = json_is_array(j) ? j : json_object_get(j, "turns");
    if (!json_is_array(t) || !json_array_size(t)) {
        json_decref(j);
        return TD_FAIL(err, TD_ERR_FORMAT, "%s: no \"turns\" array", file);
    }
    size_t i;
    json_t *turn;
    json_array_foreach(t, i, turn) {
        if (!json_is_array(json_object_get(turn, "messages")) || !json_array_size(json_object_get(turn, "messages"))) {
            json_decref(j);
            return TD_FAIL(err, TD_ERR_FORMAT, "%s: turn %zu has no \"messages\" array", file, i + 1);
        }
    }
    *turns = json_incref(t);
    json_t *tl = json_is_object(j) ? json_object_get(j, "tools") : NULL;
    *tools = json_is_array(tl) ? json_incref(tl) : NULL;
    const char *d = json_is_object(j) ? json_string_value(json_object_get(j, "description")) : NULL;
    snprintf(desc, dcap, "%s", d ? d : "");
    json_decref(j);
    return TD_OK;
}

static int common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return (int)i;
}

int td_bench_trace_run(const bench_trace_opts *o, bench_local *L, bench_remote *R, bench_chat *chat, FILE *md, FILE *csv,
                    td_err *err) {
    json_t *turns = NULL, *tools = NULL;
    char desc[512];
    int rc = load_trace(o->file, &turns, &tools, desc, sizeof desc, err);
    if (rc) return rc;
    int n = (int)json_array_size(turns);
    bench_sample *s = calloc((size_t)n, sizeof *s);
    double *wall = calloc((size_t)n, sizeof *wall);
    int *avail = calloc((size_t)n, sizeof *avail), *local_n = calloc((size_t)n, sizeof *local_n);
    if (!s || !wall || !avail || !local_n) rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory");
    int32_t *prev = NULL;
    size_t n_prev = 0;
    if (L) td_session_reset(L->s);
    bool tty = isatty(2);
    for (int t = 0; t < n && !rc; t++) {
        json_t *turn = json_array_get(turns, (size_t)t);
        json_t *msgs = json_object_get(turn, "messages");
        json_t *tt = json_object_get(turn, "tools");
        const json_t *use_tools = json_is_array(tt) ? tt : tools;
        bench_params p = o->params;
        json_t *mt = json_object_get(turn, "max_tokens");
        if (o->respect_turn_max_tokens && json_is_integer(mt) && json_integer_value(mt) > 0) p.max_tokens = (int)json_integer_value(mt);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        avail[t] = -1;
        if (chat) {
            if ((rc = td_bench_chat_encode(chat, msgs, use_tools, &ids, &n_ids, err))) break;
            avail[t] = prev ? common_prefix(prev, n_prev, ids, n_ids) : 0;
            local_n[t] = (int)n_ids;
        }
        double t0 = td_bench_now();
        if (L) rc = td_bench_local_turn(L, ids, (int)n_ids, o->depth, &p, &s[t], err);
        else rc = td_bench_remote_run(R, msgs, use_tools, &p, &s[t], err);
        wall[t] = td_bench_now() - t0;
        s[t].run = 0;
        s[t].prompt = t;
        free(prev);
        prev = ids;
        n_prev = n_ids;
        if (!rc) fprintf(stderr, "%strace: turn %d/%d: %d prompt tokens (%d reused), %d generated, %.2f s%s", tty ? "\r" : "", t + 1, n,
                         s[t].n_prompt, s[t].n_reused, s[t].n_generated, wall[t], tty ? "   " : "\n");
    }
    if (tty) fprintf(stderr, "\n");
    free(prev);
    if (!rc) {
        uint64_t read = 0, wrote = 0, reused = 0, avail_sum = 0, local_sum = 0;
        td_spec_counters sp;
        memset(&sp, 0, sizeof sp);
        double *w = malloc((size_t)n * sizeof *w);
        fprintf(md, "## Agent trace\n\n%s: %d turns%s%s; %s, depth %d, max_tokens %d%s.\n\n", o->file, n, desc[0] ? " - " : "", desc,
                L ? "in-process" : s[0].cond.backend, L ? o->depth : R->depth, o->params.max_tokens,
                o->respect_turn_max_tokens ? " (or the turn's own)" : "");
        fprintf(md, "| turn | messages | prompt tokens | reused (cached) | shared with previous prompt | generated | TTFT ms | "
                    "time s |\n|---|---|---|---|---|---|---|---|\n");
        if (csv) fprintf(csv, "turn,messages,prompt_tokens,reused_tokens,shared_prefix_tokens,generated_tokens,ttft_s,time_s,decode_s\n");
        for (int t = 0; t < n; t++) {
            int nm = (int)json_array_size(json_object_get(json_array_get(turns, (size_t)t), "messages"));
            read += (uint64_t)s[t].n_prompt;
            wrote += (uint64_t)s[t].n_generated;
            reused += (uint64_t)s[t].n_reused;
            if (avail[t] >= 0) { avail_sum += (uint64_t)avail[t]; local_sum += (uint64_t)local_n[t]; }
            sp.drafts += s[t].spec.drafts;
            sp.draft_tokens += s[t].spec.draft_tokens;
            sp.accepted_tokens += s[t].spec.accepted_tokens;
            for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) sp.accepted_per_pos[i] += s[t].spec.accepted_per_pos[i];
            if (w) w[t] = wall[t];
            char av[32] = "-";
            if (avail[t] >= 0) snprintf(av, sizeof av, "%d", avail[t]);
            fprintf(md, "| %d | %d | %d | %d | %s | %d | %.1f | %.2f |\n", t + 1, nm, s[t].n_prompt, s[t].n_reused, av, s[t].n_generated,
                    1e3 * s[t].ttft_s, wall[t]);
            if (csv)
                fprintf(csv, "%d,%d,%d,%d,%d,%d,%.6f,%.6f,%.6f\n", t + 1, nm, s[t].n_prompt, s[t].n_reused, avail[t], s[t].n_generated,
                        s[t].ttft_s, wall[t], s[t].decode_s);
        }
        bench_stat ts = w ? td_bench_stat_of(w, n) : (bench_stat){0};
        fprintf(md, "\nRead %llu tokens, wrote %llu", (unsigned long long)read, (unsigned long long)wrote);
        if (wrote) fprintf(md, " (read:write %.1f:1)", (double)read / (double)wrote);
        fprintf(md, ". Prefix cache: %.1f%% of the prompt tokens reused (%llu of %llu)", read ? 100.0 * (double)reused / (double)read : 0.0,
                (unsigned long long)reused, (unsigned long long)read);
        if (local_sum)
            fprintf(md, "; %.1f%% of them were shared with the previous turn's prompt (the most a prefix cache could reuse, "
                        "less the last prompt token it always recomputes)",
                    100.0 * (double)avail_sum / (double)local_sum);
        fprintf(md, ". Time per turn: median %.2f s [%.2f-%.2f]", ts.median, ts.min, ts.max);
        if (sp.drafts)
            fprintf(md, ". Acceptance %.1f%%, mean acceptance length %.2f, per position:", 100 * td_bench_accept_rate(&sp),
                    td_bench_mean_accept_len(&sp));
        for (int i = 0; sp.drafts && i < o->depth && i < TD_MAX_SPEC_DEPTH; i++) fprintf(md, "%s%.0f%%", i ? "/" : " ", 100 * td_bench_accept_pos(&sp, i));
        fprintf(md, ".\n");
        free(w);
    }
    free(s);
    free(wall);
    free(avail);
    free(local_n);
    json_decref(turns);
    json_decref(tools);
    return rc;
}
