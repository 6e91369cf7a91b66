/* Cost of one target forward by (sequences, tokens per sequence), against a
 * single sequence of the same token count: what a batched verify step costs
 * the adaptive-depth policy (src/spec/autodepth.h keys its table by tokens).
 *   usage: step_cost MODEL_DIR THREADS REPS [MAX_S] [MAX_K]
 * For S = 1..MAX_S sequences (each with a 64-token context) and k = 0..MAX_K
 * every sequence runs k + 1 tokens (checkpointed when k > 0, every row's
 * logits, as a verify does), rolled back after each timing (the single
 * sequence beyond its checkpoint slots is not checkpointed and grows);
 * prints the median ms. Built against the internal headers (it times td_forward):
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o build/step_cost bench/step_cost.c build/libtandem.a \
 *       -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lm -pthread [-L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lstdc++]
 * (the CUDA libraries when the build has the CUDA backend). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "engine/engine.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: step_cost MODEL_DIR THREADS REPS [MAX_S] [MAX_K]\n"); return 2; }
    int th = atoi(argv[2]), reps = atoi(argv[3]), maxs = argc > 4 ? atoi(argv[4]) : 4, maxk = argc > 5 ? atoi(argv[5]) : 4;
    if (reps < 1 || reps > 99 || maxs < 1 || maxs > 8 || maxk < 0 || maxk > 8) return 2;
    td_err err;
    td_engine_opts o = {.n_threads = th, .spec_depth = maxk > 0 ? maxk : 1, .max_context = 4096, .max_seqs = maxs + 1, .no_prefix_caching = true};
    td_engine *e;
    if (td_engine_load(argv[1], &o, &e, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    const td_config *c = td_engine_cfg(e);
    int V = c->vocab_size, T = maxs * (maxk + 1);
    float *logits = malloc((size_t)T * V * sizeof(float));
    int32_t toks[64 + 64];
    for (int i = 0; i < 128; i++) toks[i] = (i * 7919 + 13) % V;
    td_session *s[9];
    for (int i = 0; i <= maxs; i++) {
        if (td_session_new(e, &s[i], &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        td_fwd_item pf = {.seq = td_session_seq(s[i]), .tokens = toks, .n = 64, .logits_rows = 1, .logits = logits};
        if (td_forward(td_engine_fwd(e), &pf, 1, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    }
    printf("| S | k | tokens | ms (median of %d) | one sequence of as many tokens, ms | ratio |\n|---|---|---|---|---|---|\n", reps);
    double *v = malloc(sizeof(double) * (size_t)reps);
    for (int S = 1; S <= maxs; S++)
        for (int k = 0; k <= maxk; k++) {
            double med[2];
            for (int single = 0; single < 2; single++) {
                int n_items = single ? 1 : S, n = single ? S * (k + 1) : k + 1;
                for (int r = -1; r < reps; r++) {
                    td_fwd_item it[8];
                    int base[8];
                    for (int i = 0; i < n_items; i++) {
                        td_seq *q = td_session_seq(s[single ? maxs : i]);
                        base[i] = q->n_past;
                        bool ck = n > 1 && n <= q->n_ckpt_slots;
                        it[i] = (td_fwd_item){.seq = q, .tokens = toks + 64, .n = n, .logits_rows = n, .logits = logits + (size_t)i * (k + 1) * V, .checkpoint = ck};
                    }
                    double t0 = now();
                    if (td_forward(td_engine_fwd(e), it, n_items, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                    if (r >= 0) v[r] = now() - t0;
                    for (int i = 0; i < n_items; i++)
                        if (it[i].checkpoint && td_seq_truncate(it[i].seq, base[i] + 1, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                }
                qsort(v, (size_t)reps, sizeof *v, cmp);
                med[single] = v[reps / 2] * 1e3;
            }
            printf("| %d | %d | %d | %.1f | %.1f | %.2f |\n", S, k, S * (k + 1), med[0], med[1], med[0] / med[1]);
            fflush(stdout);
        }
    for (int i = 0; i <= maxs; i++) td_session_free(s[i]);
    td_engine_free(e);
    free(logits); free(v);
    return 0;
}
