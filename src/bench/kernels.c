#include "bench/kernels.h"
#include "bench/runner.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "tandem.h"


/* ---- bandwidth probe: parallel read of one large buffer ---- */
typedef struct { const float *a; int64_t n, chunk; double *part; } probe_job;
static void probe_task(void *ctx, int i) {
    probe_job *j = ctx;
    int64_t s = (int64_t)i * j->chunk, e = s + j->chunk;
    if (e > j->n) e = j->n;
    j->part[i] = td_dot_f32(j->a + s, j->a + s, e - s); /* one stream: same address twice */
}
static double probe_gbs(td_backend *b, int mb, int reps) {
    int64_t n = (int64_t)mb * (1 << 20) / 4, chunk = 1 << 18;
    float *a = aligned_alloc(64, (size_t)n * 4);
    if (!a) return 0;
    for (int64_t i = 0; i < n; i++) a[i] = (float)(i & 1023) * 1e-3f;
    int tasks = (int)((n + chunk - 1) / chunk);
    probe_job j = {a, n, chunk, calloc((size_t)tasks, sizeof(double))};
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        double t0 = td_bench_now();
        b->ops->parallel_for(b, tasks, probe_task, &j);
        t[r] = td_bench_now() - t0;
    }
    free(j.part);
    free(a);
    return (double)n * 4 / td_bench_stat_of(t, reps).median / 1e9;
}

/* ---- synthetic matmul ---- */
static int make_weight(const char *dt, int64_t N, int64_t K, td_tensor *W, void **own) {
    memset(W, 0, sizeof *W);
    W->ndim = 2; W->shape[0] = N; W->shape[1] = K; W->scale_f = 1.0f;
    size_t bytes, sbytes = 0;
    if (!strcmp(dt, "f32")) { W->dtype = TD_DTYPE_F32; bytes = (size_t)(N * K) * 4; }
    else if (!strcmp(dt, "bf16")) { W->dtype = TD_DTYPE_BF16; bytes = (size_t)(N * K) * 2; }
    else if (!strcmp(dt, "f16")) { W->dtype = TD_DTYPE_F16; bytes = (size_t)(N * K) * 2; }
    else if (!strcmp(dt, "fp8")) { W->dtype = TD_DTYPE_F8_E4M3; bytes = (size_t)(N * K); W->scale_f = 0.01f; }
    else if (!strcmp(dt, "nvfp4")) { W->dtype = TD_DTYPE_NVFP4; bytes = (size_t)(N * K) / 2; sbytes = (size_t)(N * K) / 16; }
    else return -1;
    uint8_t *p = aligned_alloc(64, (bytes + sbytes + 63) / 64 * 64);
    if (!p) return -1;
    uint32_t s = 12345;
    for (size_t i = 0; i < bytes; i += 2) { /* small finite values in every format */
        s = s * 1664525u + 1013904223u;
        uint16_t v = (uint16_t)(0x3c00 | ((s >> 16) & 0x83ff));
        if (W->dtype == TD_DTYPE_F32) { float f = ((float)((s >> 8) & 0xffff) - 32768.0f) * 1e-5f; memcpy(p + (i & ~(size_t)3), &f, 4); i += 2; continue; }
        if (W->dtype == TD_DTYPE_BF16) v = (uint16_t)(0x3c00 | ((s >> 16) & 0x807f));
        if (W->dtype == TD_DTYPE_F8_E4M3 || W->dtype == TD_DTYPE_NVFP4) v = (uint16_t)((s >> 16) & 0x7e7e);
        memcpy(p + i, &v, i + 2 <= bytes ? 2 : 1);
    }
    for (size_t i = 0; i < sbytes; i++) p[bytes + i] = 0x38; /* fp8 1.0 */
    W->data = p;
    if (sbytes) { W->scales = p + bytes; W->scales_dtype = TD_DTYPE_F8_E4M3; W->scale_block[0] = 1; W->scale_block[1] = 16; }
    *own = p;
    return 0;
}

static size_t weight_bytes(const td_tensor *W) {
    int64_t n = W->shape[0] * W->shape[1];
    return W->dtype == TD_DTYPE_NVFP4 ? (size_t)n / 2 + (size_t)n / 16 : (size_t)n * td_dtype_size(W->dtype);
}

static void bench_matmul(td_backend *b, const kbench_opts *o, double bw, FILE *out) {
    int64_t K = o->mm_k;
    td_tensor W;
    void *own;
    int64_t N = (int64_t)o->mm_mb * (1 << 20) / (K * 2);
    if (make_weight(o->mm_dtype, N, K, &W, &own)) { fprintf(out, "matmul: bad --dtype %s\n", o->mm_dtype); return; }
    N = W.shape[0];
    size_t wb = weight_bytes(&W);
    float *x = malloc(sizeof(float) * (size_t)(16 * K)), *y = malloc(sizeof(float) * (size_t)(16 * N));
    for (int64_t i = 0; i < 16 * K; i++) x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    static const int Ms[] = {1, 2, 4, 8, 16};
    fprintf(out, "\n## matmul %s [%lld x %lld] = %.0f MB, %d threads (median of %d)\n\n", o->mm_dtype, (long long)N, (long long)K,
            (double)wb / 1e6, b->n_threads, o->reps);
    fprintf(out, "| isa | M | ms | GB/s | %% of probe | t(M)/t(1) | vs c |\n|---|---|---|---|---|---|---|\n");
    double tc[5] = {0};
    int cur = b->isa;
    for (int isa = TD_ISA_C; isa <= TD_ISA_AVX512; isa++) {
        if (!td_kernels_have_isa((td_isa)isa)) continue;
        b->isa = isa;
        double t1 = 0;
        for (int mi = 0; mi < 5; mi++) {
            double t[64];
            int reps = o->reps > 64 ? 64 : o->reps;
            b->ops->matmul(b, &W, x, Ms[mi], y); /* warm */
            for (int r = 0; r < reps; r++) {
                double t0 = td_bench_now();
                b->ops->matmul(b, &W, x, Ms[mi], y);
                t[r] = td_bench_now() - t0;
            }
            double m = td_bench_stat_of(t, reps).median;
            if (mi == 0) t1 = m;
            if (isa == TD_ISA_C) tc[mi] = m;
            fprintf(out, "| %s | %d | %.2f | %.1f | %.0f%% | %.2f | %.2fx |\n", td_isa_name((td_isa)isa), Ms[mi], m * 1e3, (double)wb / m / 1e9,
                    100.0 * (double)wb / m / 1e9 / bw, m / t1, tc[mi] / m);
        }
    }
    b->isa = cur;
    free(x); free(y); free(own);
}

/* ---- model level ---- */
static size_t model_read_bytes(const td_model *m) { return m->bytes_main + m->bytes_head + m->bytes_embed / (size_t)m->cfg.vocab_size; }

static int bench_model(const kbench_opts *o, double bw, FILE *out) {
    td_err err = {0};
    int maxp = 0;
    for (int i = 0; i < o->n_prefill; i++) if (o->prefill[i] > maxp) maxp = o->prefill[i];
    const int at = o->decode_at > 16 ? o->decode_at : 16;
    /* the decode / verify rows add up to reps x (max_k + 1) positions after the prompt */
    const int pat = o->prefill_at > 0 ? o->prefill_at : 0;
    td_engine_opts eo = {.n_threads = o->threads, .max_context = (pat + maxp > at ? pat + maxp : at) + 64 * 17 + 512, .spec_depth = o->max_k, .no_prefix_caching = true, .max_seqs = 1,
                          .quantize = o->quantize, .isa = o->isa, .kernel_tune = o->tune, .precision = o->precision};
    eo.backend = o->backend;
    eo.enforce_eager = o->enforce_eager;
    eo.batch_invariant = o->batch_invariant;
    eo.mmap_weights = o->mmap_weights;
    td_engine *eng;
    double tgen = td_bench_now();
    if (o->random_config) {
        const char *d = o->random_dtype ? o->random_dtype : "bf16";
        td_random_spec rs = {.dtype = !strcmp(d, "f32") ? TD_DTYPE_F32 : !strcmp(d, "fp8") ? TD_DTYPE_F8_E4M3 : !strcmp(d, "nvfp4") ? TD_DTYPE_NVFP4
                                    : !strcmp(d, "q8") ? TD_DTYPE_Q8 : TD_DTYPE_BF16,
                             .seed = 1, .mtp_mix = o->mtp_mix, .hidden = o->r_hidden, .layers = o->r_layers, .vocab = o->r_vocab};
        if (strcmp(d, "f32") && strcmp(d, "bf16") && strcmp(d, "fp8") && strcmp(d, "nvfp4") && strcmp(d, "q8")) {
            fprintf(stderr, "tandem kernels: a random model's --dtype is bf16, f32, fp8, nvfp4 or q8, got %s\n", d);
            return 1;
        }
        if (td_engine_load_random(o->random_config, &rs, &eo, &eng, &err)) { fprintf(stderr, "tandem kernels: %s\n", err.msg); return 1; }
        td_engine_backend(eng)->ops->sync(td_engine_backend(eng)); /* a device fills asynchronously */
        const td_config *rc = td_engine_cfg(eng);
        fprintf(out, "\n## random model from %s, %s weights (seed 1, %s): hidden %d, intermediate %d, heads %d/%d, linear heads %d/%d, "
                     "%d layers, vocab %d: %.2f GB generated in backend memory (%s) in %.2f s\n",
                o->random_config, d, o->mtp_mix >= 0 ? "MTP head" : "no MTP head", rc->hidden_size, rc->intermediate_size, rc->n_heads,
                rc->n_kv_heads, rc->lin_nk, rc->lin_nv, rc->n_layers, rc->vocab_size, (double)td_engine_model(eng)->dev_bytes / 1e9,
                td_engine_backend(eng)->ops->name, td_bench_now() - tgen);
    } else if (td_engine_load(o->model_dir, &eo, &eng, &err)) {
        fprintf(stderr, "tandem kernels: %s\n", err.msg);
        return 1;
    }
    const td_model *m = td_engine_model(eng);
    int V = m->cfg.vocab_size;
    size_t rb = model_read_bytes(m);
    td_session *s;
    if (td_session_new(eng, &s, &err)) { fprintf(stderr, "tandem kernels: %s\n", err.msg); td_engine_free(eng); return 1; }
    int ntok = pat + maxp > at + 64 ? pat + maxp : at + 64;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)ntok);
    for (int i = 0; i < ntok; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)(o->max_k + 1));
    int reps = o->reps > 64 ? 64 : o->reps;
    fprintf(out, "\n## model %s: %.0f MB read per decode step (weights without the embedding table), backend %s, %d threads, isa %s, tuning %s, precision %s\n\n",
            o->model_dir ? o->model_dir : o->random_config, (double)rb / 1e6, td_engine_backend(eng)->ops->name, td_engine_backend(eng)->n_threads, td_isa_name((td_isa)td_engine_backend(eng)->isa),
            td_tune_name((td_tune)td_engine_backend(eng)->tune),
            td_engine_backend(eng)->precision == TD_PRECISION_BF16 ? "bf16" : td_engine_backend(eng)->precision == TD_PRECISION_INT8 ? "int8" : "f32");
    /* state: a prompt of `at` tokens (16 by default), in chunks of 4096 */
    int rc = 0;
    for (int p0 = 0; p0 < at && !rc; p0 += 4096) {
        td_fwd_item it = {.seq = td_session_seq(s), .tokens = toks + p0, .n = at - p0 < 4096 ? at - p0 : 4096, .logits_rows = 1, .logits = lg};
        rc = td_forward(td_engine_fwd(eng), &it, 1, &err);
    }
    if (at > 16) fprintf(out, "decode and verify rows at position %d\n", at);
    /* t(k+1) for k = 0..max_k, interleaved over reps so drift hits all alike */
    double t[17][64];
    for (int r = 0; r < reps && !rc; r++)
        for (int k = 0; k <= o->max_k && !rc; k++) {
            int n0 = td_session_seq(s)->n_past;
            td_fwd_item v = {.seq = td_session_seq(s), .tokens = toks + 20, .n = k + 1, .logits_rows = k + 1, .logits = lg, .checkpoint = k > 0};
            double t0 = td_bench_now();
            rc = td_forward(td_engine_fwd(eng), &v, 1, &err);
            t[k][r] = td_bench_now() - t0;
            if (!rc && k > 0) rc = td_seq_truncate(td_session_seq(s), n0 + 1, &err); /* as after a verify with no draft accepted */
        }
    if (rc) { fprintf(stderr, "tandem kernels: %s\n", err.msg); goto done; }
    double t1 = td_bench_stat_of(t[0], reps).median;
    fprintf(out, "decode (depth 0): %.2f tokens/s, %.1f ms/token, %.1f GB/s = %.0f%% of the probe's %.1f GB/s\n\n", 1.0 / t1, t1 * 1e3,
            (double)rb / t1 / 1e9, 100.0 * (double)rb / t1 / 1e9 / bw, bw);
    fprintf(out, "| k | tokens in verify | ms | t(k+1)/t(1) |\n|---|---|---|---|\n");
    for (int k = 1; k <= o->max_k; k++) {
        double tk = td_bench_stat_of(t[k], reps).median;
        fprintf(out, "| %d | %d | %.1f | %.2f |\n", k, k + 1, tk * 1e3, tk / t1);
    }
    if (pat > 0) fprintf(out, "\nprefill rows after a prompt of %d tokens (prefilled first, untimed)\n", pat);
    fprintf(out, "\n| prefill tokens | s | tokens/s |\n|---|---|---|\n");
    for (int i = 0; i < o->n_prefill && !rc; i++) {
        td_session_reset(s);
        for (int p0 = 0; p0 < pat && !rc; p0 += 4096) { /* the prompt before, in chunks of 4096 */
            td_fwd_item it = {.seq = td_session_seq(s), .tokens = toks + p0, .n = pat - p0 < 4096 ? pat - p0 : 4096, .logits_rows = 1, .logits = lg};
            rc = td_forward(td_engine_fwd(eng), &it, 1, &err);
        }
        if (rc) { fprintf(stderr, "tandem kernels: the %d-token prompt before prefill: %s\n", pat, err.msg); break; }
        td_fwd_item p = {.seq = td_session_seq(s), .tokens = toks + pat, .n = o->prefill[i], .logits_rows = 1, .logits = lg};
        double t0 = td_bench_now();
        rc = td_forward(td_engine_fwd(eng), &p, 1, &err);
        double dt = td_bench_now() - t0;
        if (rc) { fprintf(stderr, "tandem kernels: prefill %d: %s\n", o->prefill[i], err.msg); break; }
        fprintf(out, "| %d | %.2f | %.1f |\n", o->prefill[i], dt, o->prefill[i] / dt);
    }
done:;
    const char *mode = td_backend_cuda_mode(eng->backend);
    int gemm_on = 0;
    uint64_t gemm_calls = 0;
    if (mode && td_backend_cuda_gemm_info(eng->backend, &gemm_on, &gemm_calls) == 0)
        fprintf(out, "\ncuda: %s; %llu cuBLAS GEMM calls in these rows\n", mode, (unsigned long long)gemm_calls);
    free(toks); free(lg);
    td_session_free(s);
    td_engine_free(eng);
    return rc ? 1 : 0;
}

int td_kbench_run(const kbench_opts *o, FILE *out) {
    td_err err = {0};
    td_backend *b;
    if (td_backend_cpu_create(o->threads > 0 ? o->threads : 2, &b, &err)) { fprintf(stderr, "tandem kernels: %s\n", err.msg); return 1; }
    double la[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) { if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = -1; fclose(f); }
    fprintf(out, "# tandem kernels: best isa %s, tuning %s, %d threads, load average %.2f\n\n", td_isa_name(td_kernels_best_isa()),
            td_tune_name(td_kernels_best_tune()), b->n_threads, la[0]);
    double bw = probe_gbs(b, o->probe_mb, o->reps);
    fprintf(out, "bandwidth probe (read, %d MB, median of %d): %.1f GB/s\n", o->probe_mb, o->reps, bw);
    if (o->mm_mb > 0 && !strcmp(o->mm_dtype, "q8")) fprintf(out, "\nmatmul table: skipped (no synthetic q8 weight)\n");
    else if (o->mm_mb > 0) bench_matmul(b, o, bw, out);
    td_backend_free(b);
    return o->model_dir || o->random_config ? bench_model(o, bw, out) : 0;
}
