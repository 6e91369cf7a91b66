/* --merge FILE: samples.csv of an earlier run joined to this one, e.g. a
 * depth-0 baseline measured against another server process. Its rows keep
 * their recorded conditions, so a baseline taken under other conditions is
 * flagged. Columns are found by their header names. */
#include <stdlib.h>
#include <string.h>
#include "bench/runner.h"
#include "util/err.h"

#define MAX_COLS 64

/* Splits one CSV line in place (quotes, "" escapes); returns the field count. */
static int split_csv(char *line, char **f, int max) {
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max) return n;
        char *w = p;
        f[n++] = w;
        if (*p == '"') {
            p++;
            for (;;) {
                if (!*p) break;
                if (*p == '"' && p[1] == '"') { *w++ = '"'; p += 2; continue; }
                if (*p == '"') { p++; break; }
                *w++ = *p++;
            }
            while (*p && *p != ',') p++;
        } else {
            while (*p && *p != ',' && *p != '\n' && *p != '\r') *w++ = *p++;
        }
        char c = *p;
        *w = 0;
        if (c != ',') return n;
        p++;
    }
}

static int col(char **h, int nh, const char *name) {
    for (int i = 0; i < nh; i++)
        if (!strcmp(h[i], name)) return i;
    return -1;
}

int td_bench_merge_csv(const char *path, bench_suite *su, bench_sample **samples, int *n, td_err *err) {
    FILE *fp = fopen(path, "r");
    if (!fp) return TD_FAIL(err, TD_ERR_IO, "cannot open %s", path);
    char head[8192], hcopy[8192], line[8192];
    char *h[MAX_COLS], *f[MAX_COLS];
    if (!fgets(head, sizeof head, fp)) { fclose(fp); return TD_FAIL(err, TD_ERR_FORMAT, "%s: empty", path); }
    memcpy(hcopy, head, sizeof head);
    int nh = split_csv(hcopy, h, MAX_COLS);
    static const char *const need[] = {"run", "depth", "task", "prompt", "n_prompt", "n_reused", "n_generated", "prefill_s", "decode_s",
                                       "ttft_s", "drafts", "draft_tokens", "accepted_tokens", "threads", "max_tokens", "temperature",
                                       "engine_depth", "ignore_eos", "backend", "load1"};
    int ci[20];
    for (int i = 0; i < 20; i++)
        if ((ci[i] = col(h, nh, need[i])) < 0) { fclose(fp); return TD_FAIL(err, TD_ERR_FORMAT, "%s: no column \"%s\"", path, need[i]); }
    int pos[TD_MAX_SPEC_DEPTH];
    for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "accepted_pos_%d", i + 1);
        pos[i] = col(h, nh, nm);
    }
    int lineno = 1, rc = 0;
    while (!rc && fgets(line, sizeof line, fp)) {
        lineno++;
        if (line[0] == '\n' || !line[0]) continue;
        int nf = split_csv(line, f, MAX_COLS);
        if (nf < nh) { rc = TD_FAIL(err, TD_ERR_FORMAT, "%s:%d: %d fields, header has %d", path, lineno, nf, nh); break; }
        int task = -1;
        for (int t = 0; t < su->n_tasks; t++)
            if (!strcmp(su->tasks[t], f[ci[2]])) task = t;
        if (task < 0) continue; /* a task this run does not report */
        int depth = atoi(f[ci[1]]), di = -1;
        for (int d = 0; d < su->n_depths; d++)
            if (su->depths[d] == depth) di = d;
        if (di < 0) {
            if (su->n_depths == BENCH_MAX_DEPTHS || depth < 0 || depth > TD_MAX_SPEC_DEPTH) continue;
            su->depths[su->n_depths++] = depth;
        }
        bench_sample *ns = realloc(*samples, (size_t)(*n + 1) * sizeof **samples);
        if (!ns) { rc = TD_FAIL(err, TD_ERR_NOMEM, "out of memory"); break; }
        *samples = ns;
        bench_sample *s = &ns[(*n)++];
        memset(s, 0, sizeof *s);
        s->run = atoi(f[ci[0]]);
        if (s->run < 0 || s->run > 63) s->run = 0;
        if (s->run + 1 > su->n_runs) su->n_runs = s->run + 1;
        s->depth = depth;
        s->task = task;
        s->prompt = atoi(f[ci[3]]);
        s->n_prompt = atoi(f[ci[4]]);
        s->n_reused = atoi(f[ci[5]]);
        s->n_generated = atoi(f[ci[6]]);
        s->prefill_s = atof(f[ci[7]]);
        s->decode_s = atof(f[ci[8]]);
        s->ttft_s = atof(f[ci[9]]);
        s->spec.drafts = strtoull(f[ci[10]], NULL, 10);
        s->spec.draft_tokens = strtoull(f[ci[11]], NULL, 10);
        s->spec.accepted_tokens = strtoull(f[ci[12]], NULL, 10);
        for (int i = 0; i < TD_MAX_SPEC_DEPTH; i++) s->spec.accepted_per_pos[i] = pos[i] >= 0 ? strtoull(f[pos[i]], NULL, 10) : 0;
        s->cond.threads = atoi(f[ci[13]]);
        s->cond.max_tokens = atoi(f[ci[14]]);
        s->cond.temperature = atof(f[ci[15]]);
        s->cond.engine_depth = atoi(f[ci[16]]);
        s->cond.ignore_eos = atoi(f[ci[17]]) != 0;
        snprintf(s->cond.backend, sizeof s->cond.backend, "%s", f[ci[18]]);
        s->cond.load1 = atof(f[ci[19]]);
    }
    fclose(fp);
    return rc;
}
