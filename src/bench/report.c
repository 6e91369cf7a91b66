/* Writers: the markdown report (stdout), CSV (samples and cells) and a
 * hand-written SVG chart of tokens/s against depth. */
#include <math.h>
#include <string.h>
#include "bench/bench.h"

static const bench_cell *cell(const bench_report *r, int t, int d) { return &r->cells[t * r->su->n_depths + d]; }

static void depth_label(char *b, size_t n, int depth) {
    if (depth == 0) snprintf(b, n, "none");
    else if (depth == BENCH_DEPTH_AUTO) snprintf(b, n, "auto");
    else snprintf(b, n, "%d", depth);
}

static td_spec_counters depth_counters(const bench_report *r, int d) {
    td_spec_counters s;
    memset(&s, 0, sizeof s);
    for (int t = 0; t < r->su->n_tasks; t++) td_spec_counters_add(&s, &cell(r, t, d)->spec);
    return s;
}

static void md_tps_table(FILE *f, const bench_report *r) {
    const bench_suite *su = r->su;
    fprintf(f, "## Tokens/s\n\nDecode tokens/s (first token to last), median of %d run%s [min-max]; "
               "accepted = accepted / drafted tokens over all tasks.\n\n| depth |",
            su->n_runs, su->n_runs == 1 ? "" : "s");
    for (int t = 0; t < su->n_tasks; t++) fprintf(f, " %s |", su->tasks[t]);
    fprintf(f, " accepted |\n|---|");
    for (int t = 0; t <= su->n_tasks; t++) fprintf(f, "---|");
    fprintf(f, "\n");
    for (int d = 0; d < su->n_depths; d++) {
        char dl[16];
        depth_label(dl, sizeof dl, su->depths[d]);
        fprintf(f, "| %s |", dl);
        for (int t = 0; t < su->n_tasks; t++) {
            const bench_cell *c = cell(r, t, d);
            if (c->tps.n) fprintf(f, " %.1f [%.1f-%.1f] |", c->tps.median, c->tps.min, c->tps.max);
            else fprintf(f, " - |");
        }
        td_spec_counters s = depth_counters(r, d);
        if (su->depths[d] == 0 || !s.draft_tokens) fprintf(f, " - |\n");
        else fprintf(f, " %.0f%% |\n", 100 * td_bench_accept_rate(&s));
    }
}

static void md_speedup_table(FILE *f, const bench_report *r) {
    const bench_suite *su = r->su;
    bool any = false;
    for (int i = 0; i < su->n_tasks * su->n_depths; i++)
        if (r->cells[i].speedup > 0 && r->cells[i].depth > 0) any = true;
    if (!any) return;
    fprintf(f, "\n## Speedup over depth 0\n\nmeasured / predicted by the model (%s); ceiling k + 1.\n\n| depth |",
            r->costs ? "E[tokens per step] / (verify(k+1) + k x draft)" : "no cost measurement with --server");
    for (int t = 0; t < su->n_tasks; t++) fprintf(f, " %s |", su->tasks[t]);
    fprintf(f, " ceiling |\n|---|");
    for (int t = 0; t <= su->n_tasks; t++) fprintf(f, "---|");
    fprintf(f, "\n");
    for (int d = 0; d < su->n_depths; d++) {
        int k = su->depths[d];
        if (k == 0) continue;
        char dl[16];
        depth_label(dl, sizeof dl, k);
        fprintf(f, "| %s |", dl);
        for (int t = 0; t < su->n_tasks; t++) {
            const bench_cell *c = cell(r, t, d);
            if (c->speedup > 0 && c->predicted > 0) fprintf(f, " %.2fx / %.2fx |", c->speedup, c->predicted);
            else if (c->speedup > 0) fprintf(f, " %.2fx / - |", c->speedup);
            else fprintf(f, " - |");
        }
        if (k == BENCH_DEPTH_AUTO) fprintf(f, " - |\n");
        else fprintf(f, " %dx |\n", k + 1);
    }
}

static void md_accept_table(FILE *f, const bench_report *r) {
    const bench_suite *su = r->su;
    int kmax = 0;
    bool autod = false;
    for (int d = 0; d < su->n_depths; d++)
        if (su->depths[d] == BENCH_DEPTH_AUTO) autod = true;
        else if (su->depths[d] > kmax) kmax = su->depths[d];
    if (autod) /* the deepest position auto drafted */
        for (int d = 0; d < su->n_depths; d++)
            if (su->depths[d] == BENCH_DEPTH_AUTO) {
                td_spec_counters s = depth_counters(r, d);
                for (int i = TD_MAX_SPEC_DEPTH; i > kmax; i--)
                    if (s.chosen_depth[i]) { kmax = i; break; }
            }
    if (kmax == 0) return;
    if (kmax > TD_MAX_SPEC_DEPTH) kmax = TD_MAX_SPEC_DEPTH;
    fprintf(f, "\n## Acceptance per position\n\nP(accepted >= i) = accepted_per_pos[i-1] / drafts; "
               "mean acceptance length = 1 + accepted / drafts.\n\n| depth | task | drafts |");
    for (int i = 1; i <= kmax; i++) fprintf(f, " %d |", i);
    fprintf(f, " mean acceptance length |\n|---|---|---|");
    for (int i = 0; i <= kmax; i++) fprintf(f, "---|");
    fprintf(f, "\n");
    for (int d = 0; d < su->n_depths; d++) {
        int k = su->depths[d];
        if (k == 0) continue;
        for (int t = 0; t <= su->n_tasks; t++) {
            td_spec_counters s = t < su->n_tasks ? cell(r, t, d)->spec : depth_counters(r, d);
            char dl[16];
            depth_label(dl, sizeof dl, k);
            fprintf(f, "| %s | %s | %llu |", dl, t < su->n_tasks ? su->tasks[t] : "**all**", (unsigned long long)s.drafts);
            for (int i = 0; i < kmax; i++) {
                if (i < k) fprintf(f, " %.1f%% |", 100 * td_bench_accept_pos(&s, i));
                else fprintf(f, " |");
            }
            fprintf(f, " %.2f |\n", td_bench_mean_accept_len(&s));
        }
    }
}

/* The depth each decode step ran at, for `auto` (spec/autodepth.h). */
static void md_chosen_table(FILE *f, const bench_report *r) {
    const bench_suite *su = r->su;
    for (int d = 0; d < su->n_depths; d++) {
        if (su->depths[d] != BENCH_DEPTH_AUTO) continue;
        int kmax = 0;
        td_spec_counters all = depth_counters(r, d);
        for (int i = 0; i <= TD_MAX_SPEC_DEPTH; i++)
            if (all.chosen_depth[i]) kmax = i;
        fprintf(f, "\n## Chosen depth (auto)\n\nDecode steps at each draft depth (%% of the task's steps); mean depth; steps run in "
                   "exploration bursts (a deeper depth measured as it runs, counted in its column too); steps that kept the MTP layer "
                   "in step (able to draft: what depth 0 costs auto).\n\n| task |");
        for (int i = 0; i <= kmax; i++) fprintf(f, " %d |", i);
        fprintf(f, " mean | explored | tracked |\n|---|");
        for (int i = 0; i <= kmax + 3; i++) fprintf(f, "---|");
        fprintf(f, "\n");
        for (int t = 0; t <= su->n_tasks; t++) {
            td_spec_counters s = t < su->n_tasks ? cell(r, t, d)->spec : all;
            uint64_t n = 0, sum = 0;
            for (int i = 0; i <= TD_MAX_SPEC_DEPTH; i++) n += s.chosen_depth[i], sum += (uint64_t)i * s.chosen_depth[i];
            fprintf(f, "| %s |", t < su->n_tasks ? su->tasks[t] : "**all**");
            for (int i = 0; i <= kmax; i++) fprintf(f, " %llu (%.0f%%) |", (unsigned long long)s.chosen_depth[i], n ? 100.0 * s.chosen_depth[i] / n : 0.0);
            fprintf(f, " %.2f | %llu (%.0f%%) | %llu (%.0f%%) |\n", n ? (double)sum / n : 0.0, (unsigned long long)s.explored_steps,
                    n ? 100.0 * s.explored_steps / n : 0.0, (unsigned long long)s.tracked_steps, n ? 100.0 * s.tracked_steps / n : 0.0);
        }
    }
}

static void md_prefill_table(FILE *f, const bench_report *r) {
    const bench_suite *su = r->su;
    fprintf(f, "\n## Prefill and time to first token\n\n| depth | task | prompt tokens/s (median [min-max]) | "
               "TTFT ms (median [min-max]) | tokens generated |\n|---|---|---|---|---|\n");
    for (int d = 0; d < su->n_depths; d++) {
        char dl[16];
        depth_label(dl, sizeof dl, su->depths[d]);
        for (int t = 0; t < su->n_tasks; t++) {
            const bench_cell *c = cell(r, t, d);
            fprintf(f, "| %s | %s | ", dl, su->tasks[t]);
            if (c->prefill_tps.n) fprintf(f, "%.1f [%.1f-%.1f] | ", c->prefill_tps.median, c->prefill_tps.min, c->prefill_tps.max);
            else fprintf(f, "- | ");
            if (c->ttft.n) fprintf(f, "%.1f [%.1f-%.1f] | ", 1e3 * c->ttft.median, 1e3 * c->ttft.min, 1e3 * c->ttft.max);
            else fprintf(f, "- | ");
            fprintf(f, "%llu |\n", (unsigned long long)c->generated);
        }
    }
}

static void md_costs(FILE *f, const bench_costs *c) {
    fprintf(f, "\n## Cost model\n\nTimed on the warm engine after a %d-token prefill (median of repeats): a target forward of n "
               "tokens as the verify runs it (logits for every row, DeltaNet checkpoints), and one MTP draft step.\n\n"
               "| tokens n | t(n) ms | verify cost t(n)/t(1) |\n|---|---|---|\n",
            c->context);
    for (int n = 1; n <= c->max_n; n++) fprintf(f, "| %d | %.3f | %.3f |\n", n, 1e3 * c->verify_s[n], c->verify[n]);
    fprintf(f, "\ndraft cost: one MTP step %.3f ms = %.3f target steps. Predicted speedup at depth k = "
               "(1 + sum_i P(accepted >= i)) / (t(k+1)/t(1) + k x %.3f).\n",
            1e3 * c->draft_s, c->draft, c->draft);
}

static void md_conditions(FILE *f, const bench_report *r) {
    if (!r->n_samples) return;
    const bench_conditions *c = &r->samples[0].cond;
    double lmin = c->load1, lmax = c->load1;
    for (int i = 0; i < r->n_samples; i++) {
        lmin = fmin(lmin, r->samples[i].cond.load1);
        lmax = fmax(lmax, r->samples[i].cond.load1);
    }
    fprintf(f, "\n## Conditions\n\n%s; threads %d; max_tokens %d; temperature %g; engine depth %d; ignore_eos %s; "
               "%d requests; 1-minute load average %.2f-%.2f. Runs interleaved: every prompt at every depth in turn, "
               "depth order reversed on odd runs.\n",
            c->backend, c->threads, c->max_tokens, c->temperature, c->engine_depth, c->ignore_eos ? "on" : "off", r->n_samples,
            lmin, lmax);
}

void td_bench_write_markdown(FILE *f, const bench_report *r) {
    fprintf(f, "# tandem bench\n\n%s\n", r->title ? r->title : "");
    if (r->machine) fprintf(f, "\n%s\n", r->machine);
    fprintf(f, "\n");
    md_tps_table(f, r);
    fprintf(f, "\n### Sanity flags\n\n");
    if (!r->n_flags) fprintf(f, "none\n");
    for (int i = 0; i < r->n_flags; i++) fprintf(f, "- %s\n", r->flags[i].text);
    md_speedup_table(f, r);
    md_accept_table(f, r);
    md_chosen_table(f, r);
    md_prefill_table(f, r);
    if (r->costs) md_costs(f, r->costs);
    md_conditions(f, r);
}

/* ---- CSV ------------------------------------------------------------------------ */

void td_bench_csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n\r")) { fputs(s, f); return; }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

int td_bench_write_samples_csv(FILE *f, const bench_suite *su, const bench_sample *s, int n) {
    fprintf(f, "run,depth,task,prompt,n_prompt,n_reused,n_generated,prefill_s,decode_s,ttft_s,tokens_per_s,drafts,draft_tokens,"
               "accepted_tokens");
    for (int i = 1; i <= TD_MAX_SPEC_DEPTH; i++) fprintf(f, ",accepted_pos_%d", i);
    fprintf(f, ",threads,max_tokens,temperature,engine_depth,ignore_eos,backend,load1\n");
    for (int k = 0; k < n; k++) {
        const bench_sample *x = &s[k];
        fprintf(f, "%d,%d,", x->run, x->depth);
        td_bench_csv_field(f, x->task >= 0 && x->task < su->n_tasks ? su->tasks[x->task] : "");
        fprintf(f, ",%d,%d,%d,%d,%.6f,%.6f,%.6f,%.3f,%llu,%llu,%llu", x->prompt, x->n_prompt, x->n_reused, x->n_generated,
                x->prefill_s, x->decode_s, x->ttft_s, x->decode_s > 0 && x->n_generated > 1 ? (x->n_generated - 1) / x->decode_s : 0.0,
                (unsigned long long)x->spec.drafts, (unsigned long long)x->spec.draft_tokens,
                (unsigned long long)x->spec.accepted_tokens);
        for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) fprintf(f, ",%llu", (unsigned long long)x->spec.accepted_per_pos[i]);
        const bench_conditions *c = &x->cond;
        fprintf(f, ",%d,%d,%g,%d,%d,", c->threads, c->max_tokens, c->temperature, c->engine_depth, c->ignore_eos);
        td_bench_csv_field(f, c->backend);
        fprintf(f, ",%.2f\n", c->load1);
    }
    return ferror(f) ? -1 : 0;
}

int td_bench_write_cells_csv(FILE *f, const bench_suite *su, const bench_cell *cells) {
    fprintf(f, "task,depth,runs,tokens_per_s_median,tokens_per_s_min,tokens_per_s_max,spread,accept_rate,mean_accept_len");
    for (int i = 1; i <= TD_MAX_SPEC_DEPTH; i++) fprintf(f, ",p_accepted_ge_%d", i);
    fprintf(f, ",prefill_tokens_per_s,ttft_ms,speedup,predicted_speedup\n");
    for (int i = 0; i < su->n_tasks * su->n_depths; i++) {
        const bench_cell *c = &cells[i];
        td_bench_csv_field(f, su->tasks[c->task]);
        fprintf(f, ",%d,%d,%.3f,%.3f,%.3f,%.4f,%.4f,%.4f", c->depth, c->tps.n, c->tps.median, c->tps.min, c->tps.max,
                td_bench_spread(&c->tps), td_bench_accept_rate(&c->spec), td_bench_mean_accept_len(&c->spec));
        for (int k = 0; k < TD_MAX_SPEC_DEPTH; k++) {
            if (k < c->depth) fprintf(f, ",%.4f", td_bench_accept_pos(&c->spec, k));
            else fprintf(f, ",");
        }
        fprintf(f, ",%.2f,%.3f,%.4f,%.4f\n", c->prefill_tps.median, 1e3 * c->ttft.median, c->speedup, c->predicted);
    }
    return ferror(f) ? -1 : 0;
}

/* ---- SVG ---------------------------------------------------------------------------- */

static void xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
        }
    }
}

/* A "nice" tick step (1, 2 or 5 x 10^n) for about 5 ticks up to max. */
static double nice_step(double max) {
    double raw = max / 5, p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

int td_bench_write_svg(FILE *f, const bench_suite *su, const bench_cell *cells, const char *title) {
    static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
    const double W = 720, H = 440, L = 70, R = 150, T = 50, B = 60;
    double ymax = 0;
    int dmin = 1 << 30, dmax = -1;
    for (int i = 0; i < su->n_tasks * su->n_depths; i++) {
        if (cells[i].tps.n && cells[i].tps.max > ymax) ymax = cells[i].tps.max;
    }
    for (int d = 0; d < su->n_depths; d++) {
        if (su->depths[d] < dmin) dmin = su->depths[d];
        if (su->depths[d] > dmax) dmax = su->depths[d];
    }
    if (ymax <= 0) ymax = 1;
    double step = nice_step(ymax * 1.05), ytop = ceil(ymax * 1.05 / step) * step;
    double pw = W - L - R, ph = H - T - B;
#define XP(dep) (L + (dmax > dmin ? ((dep) - dmin) * pw / (dmax - dmin) : pw / 2))
#define YP(v) (T + ph - (v) / ytop * ph)
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"24\" font-size=\"15\">",
            W, H, W, H, W, H, L);
    xml_text(f, title ? title : "tandem bench");
    fprintf(f, "</text>\n");
    for (double v = 0; v <= ytop + step / 2; v += step) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, YP(v), L + pw, YP(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L - 6, YP(v) + 4, v);
    }
    for (int d = 0; d < su->n_depths; d++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", XP(su->depths[d]), T + ph + 18, su->depths[d]);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, T + ph, L + pw, T + ph);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", L, T, L, T + ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">MTP draft depth (tokens per step)</text>\n", L + pw / 2, H - 18);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">tokens/s (median, min-max)</text>\n",
            T + ph / 2, T + ph / 2);
    for (int t = 0; t < su->n_tasks; t++) {
        const char *col = colors[t % 8];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        /* depths in ascending order */
        int order[BENCH_MAX_DEPTHS], n = 0;
        for (int d = 0; d < su->n_depths; d++) order[n++] = d;
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && su->depths[order[j]] < su->depths[order[j - 1]]; j--) {
                int x = order[j]; order[j] = order[j - 1]; order[j - 1] = x;
            }
        for (int i = 0; i < n; i++) {
            const bench_cell *c = &cells[t * su->n_depths + order[i]];
            if (c->tps.n) fprintf(f, "%s%.1f,%.1f", i ? " " : "", XP(c->depth), YP(c->tps.median));
        }
        fprintf(f, "\"/>\n");
        for (int d = 0; d < su->n_depths; d++) {
            const bench_cell *c = &cells[t * su->n_depths + d];
            if (!c->tps.n) continue;
            double x = XP(c->depth);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", x, YP(c->tps.min), x, YP(c->tps.max), col);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>", x, YP(c->tps.median), col);
            xml_text(f, su->tasks[t]);
            fprintf(f, " depth %d: %.2f tokens/s</title></circle>\n", c->depth, c->tps.median);
        }
        double ly = T + 10 + 20 * t;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n", L + pw + 15, ly,
                L + pw + 40, ly, col);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", L + pw + 46, ly + 4);
        xml_text(f, su->tasks[t]);
        fprintf(f, "</text>\n");
    }
#undef XP
#undef YP
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}
