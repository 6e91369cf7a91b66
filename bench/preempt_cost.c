/* Preemption by swap vs by recompute, measured on this machine (issue 16).
 *   usage: preempt_cost MODEL_DIR TOKENS THREADS REPS
 * For a request holding TOKENS tokens: the swap round trip copies its KV
 * blocks (every layer, K and V) and its DeltaNet state to host memory and
 * back (td_bk_download / td_bk_upload: what a swap-out and swap-in move); the
 * recompute re-prefills the tokens (what preemption by recompute costs when
 * the prefix cache no longer holds them). Prints the best of REPS for each.
 * Build: gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/preempt_cost.c build/libtandem.a \
 *        -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lm -pthread -o build/preempt_cost */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine/engine.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: preempt_cost MODEL_DIR TOKENS THREADS REPS\n"); return 2; }
    int T = atoi(argv[2]), th = atoi(argv[3]), reps = atoi(argv[4]);
    td_err err;
    td_engine_opts o = {.n_threads = th, .spec_depth = 4, .max_context = T + 64, .no_prefix_caching = true, .max_seqs = 1};
    td_engine *e;
    if (td_engine_load(argv[1], &o, &e, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    td_session *s;
    if (td_session_new(e, &s, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    const td_config *c = td_engine_cfg(e);
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    td_seq *q = td_session_seq(s);
    td_fwd_item it = {.seq = q, .tokens = tok, .n = T, .logits_rows = 1, .logits = td_session_logits(s)};
    double best_re = 1e9, best_sw = 1e9;
    td_kv *kv = td_engine_kv(e);
    td_backend *b = td_engine_backend(e);
    td_kv_shape ks = td_engine_kv_shape_for(c, td_engine_model(e)->has_mtp, o.kv_cache_dtype);
    size_t per_block = td_kv_bytes_per_block(&ks), state = td_seq_state_floats(q) * sizeof(float);
    size_t row = (size_t)ks.kv_dim * (ks.store == TD_KV_F32 ? 4 : ks.store == TD_KV_BF16 ? 2 : 1);
    unsigned char *host = NULL;
    size_t kv_bytes = 0;
    for (int r = 0; r < reps; r++) {
        td_session_reset(s);
        double t0 = now();
        if (td_forward(td_engine_fwd(e), &it, 1, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        double t = now() - t0;
        if (t < best_re) best_re = t;
        /* swap out + in: each block's rows of every layer, K and V, and the live state */
        int nb = q->n_blocks;
        kv_bytes = (size_t)nb * per_block;
        if (!host) host = malloc(kv_bytes + state);
        t0 = now();
        size_t off = 0;
        for (int l = 0; l < ks.n_layers; l++) {
            td_kv_view v = td_kv_layer(kv, l);
            for (int i = 0; i < nb; i++) {
                size_t at = (size_t)q->blocks[i] * TD_KV_BLOCK * row;
                td_bk_download(b, host + off, (unsigned char *)v.k + at, TD_KV_BLOCK * row), off += TD_KV_BLOCK * row;
                td_bk_download(b, host + off, (unsigned char *)v.v + at, TD_KV_BLOCK * row), off += TD_KV_BLOCK * row;
            }
        }
        td_seq_state_save(q, (float *)(host + off));
        off = 0;
        for (int l = 0; l < ks.n_layers; l++) {
            td_kv_view v = td_kv_layer(kv, l);
            for (int i = 0; i < nb; i++) {
                size_t at = (size_t)q->blocks[i] * TD_KV_BLOCK * row;
                td_bk_upload(b, (unsigned char *)v.k + at, host + off, TD_KV_BLOCK * row), off += TD_KV_BLOCK * row;
                td_bk_upload(b, (unsigned char *)v.v + at, host + off, TD_KV_BLOCK * row), off += TD_KV_BLOCK * row;
            }
        }
        td_seq_state_load(q, (const float *)(host + off));
        t = now() - t0;
        if (t < best_sw) best_sw = t;
    }
    printf("%s: %d tokens, %d threads: recompute (prefill) %.1f ms; swap out+in of %.1f MiB KV + %.1f MiB DeltaNet state %.2f ms (%.0fx cheaper)\n",
           argv[1], T, th, best_re * 1e3, (double)kv_bytes / 1048576.0, (double)state / 1048576.0, best_sw * 1e3, best_re / best_sw);
    free(host);
    free(tok);
    td_session_free(s);
    td_engine_free(e);
    return 0;
}
