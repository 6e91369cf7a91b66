/* Single-thread encode throughput of src/tokenizer on the corpus written by
 * make_corpus.py (same documents, same order as hf_bench.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: tok_bench MODEL_DIR CORPUS [reps]\n"); return 2; }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    td_err err = {0};
    double t0 = now();
    tokenizer *t;
    if (td_tok_load(argv[1], &t, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double load = now() - t0;
    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc(n + 1);
    if (!data || fread(data, 1, n, f) != n) return 1;
    fclose(f);
    char idx[4096];
    snprintf(idx, sizeof idx, "%s.idx", argv[2]);
    f = fopen(idx, "r");
    if (!f) { perror(idx); return 1; }
    size_t cap = 1024, nd = 0, *lens = malloc(cap * sizeof *lens);
    unsigned long long l;
    while (fscanf(f, "%llu", &l) == 1) {
        if (nd == cap) lens = realloc(lens, (cap *= 2) * sizeof *lens);
        lens[nd++] = (size_t)l;
    }
    fclose(f);
    tok_encoder *e;
    if (td_tok_encoder_new(t, &e, &err)) return 1;
    double best = 1e30;
    size_t n_ids = 0;
    unsigned long long h = 0;
    for (int r = 0; r < reps; r++) {
        /* a fresh encoder each repetition: the word cache starts empty, as
         * HF's does per Tokenizer (which also keeps its cache across calls) */
        td_tok_encoder_free(e);
        td_tok_encoder_new(t, &e, &err);
        double s = now();
        size_t off = 0;
        n_ids = 0;
        h = 0;
        for (size_t d = 0; d < nd; d++) {
            int32_t *ids;
            size_t k;
            if (td_tok_encoder_encode(e, data + off, lens[d], true, &ids, &k, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            unsigned long long sum = 0;
            for (size_t i = 0; i < k; i++) sum += (unsigned long long)ids[i];
            h = h * 31 + sum;
            n_ids += k;
            free(ids);
            off += lens[d];
        }
        double dt = now() - s;
        if (dt < best) best = dt;
    }
    printf("tandem:        %.2f MB in %.3f s = %.2f MB/s, %zu ids, check %016llx (load %.3f s)\n", n / 1e6, best,
           n / 1e6 / best, n_ids, h, load);
    td_tok_encoder_free(e);
    td_tok_free(t);
    free(data);
    free(lens);
    return 0;
}
