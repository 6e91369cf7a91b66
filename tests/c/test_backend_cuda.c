/* The CUDA backend against the CPU reference, op by op (matmul in every
 * weight dtype and its batch invariance, rmsnorm, add, silu_mul, embed,
 * argmax, KV rows in every KV dtype, the memory ops, the sample op). The
 * whole engine on CUDA is the rest of the suite with TANDEM_BACKEND=cuda
 * (scripts/gpu-check.sh).
 *
 * Without CUDA (a build with CUDA=0, or no device / driver, as on the CI
 * machine) td_backend_create("cuda") must fail with one clear line; the test
 * checks that and skips the device checks. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "sample/sampler.h"
#include "util/err.h"

static td_backend *cpu, *cu;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { /* xorshift64*: reproducible test data */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return (float)(rnd() >> 8) / (float)(1u << 24) * 2.0f - 1.0f; } /* [-1, 1) */

static void *dev_copy(const void *h, size_t n) {
    void *d = cu->ops->alloc(cu, n);
    TD_ASSERT(d);
    td_bk_upload(cu, d, h, n);
    return d;
}
static int same_bits(const float *a, const float *b, size_t n, size_t *at) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) { *at = i; return 0; }
    return 1;
}
static double max_rel(const float *a, const float *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / (fabs((double)ref[i]) + 1e-6);
        if (!(d <= m)) m = d; /* NaN counts as the worst */
    }
    return m;
}

/* ---- matmul ---- */

static uint8_t fp8_finite(void) { uint8_t b = (uint8_t)rnd(); return (b & 0x7f) == 0x7f ? b ^ 1 : b; }
static uint16_t f16_finite(void) { uint16_t h = (uint16_t)rnd(); return ((h >> 10) & 31) == 31 ? h & 0xbfff : h; }

typedef struct { td_tensor W; void *data, *scales; const char *name; } weight;

static weight make_weight(int kind, int64_t N, int64_t K) {
    weight w;
    memset(&w, 0, sizeof w);
    td_tensor *W = &w.W;
    W->ndim = 2; W->shape[0] = N; W->shape[1] = K; W->scale_f = 1.0f;
    size_t n = (size_t)(N * K);
    switch (kind) {
    case 0: W->dtype = TD_DTYPE_F32; w.name = "f32"; {
        float *p = malloc(n * 4); for (size_t i = 0; i < n; i++) p[i] = rndf() * 0.1f; w.data = p; } break;
    case 1: W->dtype = TD_DTYPE_BF16; w.name = "bf16"; {
        uint16_t *p = malloc(n * 2); for (size_t i = 0; i < n; i++) p[i] = td_f32_to_bf16(rndf() * 0.1f); w.data = p; } break;
    case 2: W->dtype = TD_DTYPE_F16; w.name = "f16"; {
        uint16_t *p = malloc(n * 2); for (size_t i = 0; i < n; i++) p[i] = f16_finite(); w.data = p; } break;
    case 3: W->dtype = TD_DTYPE_F8_E4M3; w.name = "fp8 per-tensor"; W->scale_f = 0.013f; {
        uint8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = fp8_finite(); w.data = p; } break;
    case 4: W->dtype = TD_DTYPE_F8_E4M3; w.name = "fp8 block (f32 scales 8x32)"; {
        uint8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = fp8_finite(); w.data = p;
        W->scale_block[0] = 8; W->scale_block[1] = 32; W->scales_dtype = TD_DTYPE_F32;
        size_t ns = (size_t)(((N + 7) / 8) * ((K + 31) / 32));
        float *s = malloc(ns * 4); for (size_t i = 0; i < ns; i++) s[i] = 0.01f + 0.02f * (rndf() + 1.0f); w.scales = s; } break;
    case 5: W->dtype = TD_DTYPE_F8_E4M3; w.name = "fp8 block (bf16 scales 16x16)"; {
        uint8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = fp8_finite(); w.data = p;
        W->scale_block[0] = 16; W->scale_block[1] = 16; W->scales_dtype = TD_DTYPE_BF16;
        size_t ns = (size_t)(((N + 15) / 16) * ((K + 15) / 16));
        uint16_t *s = malloc(ns * 2); for (size_t i = 0; i < ns; i++) s[i] = td_f32_to_bf16(0.01f + 0.02f * (rndf() + 1.0f)); w.scales = s; } break;
    case 6: W->dtype = TD_DTYPE_NVFP4; w.name = "nvfp4"; W->scale_f = 0.7f; {
        uint8_t *p = malloc(n / 2); for (size_t i = 0; i < n / 2; i++) p[i] = (uint8_t)rnd(); w.data = p;
        W->scale_block[0] = 1; W->scale_block[1] = 16; W->scales_dtype = TD_DTYPE_F8_E4M3;
        size_t ns = n / 16;
        uint8_t *s = malloc(ns); for (size_t i = 0; i < ns; i++) s[i] = (uint8_t)(0x28 + rnd() % 24); w.scales = s; } break;
    default: W->dtype = TD_DTYPE_Q8; w.name = "q8"; {
        int8_t *p = malloc(n); for (size_t i = 0; i < n; i++) p[i] = (int8_t)rnd(); w.data = p;
        W->scale_block[0] = 1; W->scale_block[1] = 32; W->scales_dtype = TD_DTYPE_F32;
        size_t ns = n / 32;
        float *s = malloc(ns * 4); for (size_t i = 0; i < ns; i++) s[i] = 0.001f * (rndf() + 1.5f); w.scales = s; } break;
    }
    W->data = w.data;
    W->scales = w.scales;
    return w;
}

static void test_matmul(void) {
    const int Ms[] = {1, 2, 5, 16, 17, 33, 70};
    const int MMAX = 70;
    for (int kind = 0; kind < 8; kind++) {
        /* K with a partial last chunk where the dtype allows it (nvfp4, q8: multiples of 32) */
        int64_t N = 37, K = kind >= 6 ? 96 : 72;
        weight w = make_weight(kind, N, K);
        const char *why;
        CHECK(td_matmul_supported(&w.W, &why), "%s: %s", w.name, why);
        float *x = malloc(sizeof(float) * (size_t)(MMAX * K));
        for (int64_t i = 0; i < MMAX * K; i++) x[i] = rndf();
        float *ref = malloc(sizeof(float) * (size_t)(MMAX * N)), *got = malloc(sizeof(float) * (size_t)(MMAX * N));
        cpu->ops->matmul(cpu, &w.W, x, MMAX, ref);
        td_tensor Wd;
        td_err err;
        CHECK(td_bk_tensor_load(cu, &w.W, &Wd, &err) == 0, "%s: load: %s", w.name, err.msg);
        float *dx = dev_copy(x, sizeof(float) * (size_t)(MMAX * K));
        float *dy = cu->ops->alloc(cu, sizeof(float) * (size_t)(MMAX * N));
        float *full = malloc(sizeof(float) * (size_t)(MMAX * N));
        cu->ops->matmul(cu, &Wd, dx, MMAX, dy);
        td_bk_download(cu, full, dy, sizeof(float) * (size_t)(MMAX * N));
        /* the CPU's FMA paths (AVX2 / AVX-512) have the same per-element order: same bits */
        size_t at = 0;
        if (cpu->isa != TD_ISA_C)
            CHECK(same_bits(full, ref, (size_t)(MMAX * N), &at), "%s: cuda %.9g vs cpu %.9g at %zu", w.name, full[at], ref[at], at);
        else
            CHECK(max_rel(full, ref, (size_t)(MMAX * N)) < 1e-4, "%s: rel %g", w.name, max_rel(full, ref, (size_t)(MMAX * N)));
        /* batch invariance: every M (both kernels) gives the rows of the M = 70 pass, bit for bit */
        for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
            int M = Ms[mi];
            cu->ops->fill0(cu, dy, sizeof(float) * (size_t)(MMAX * N));
            cu->ops->matmul(cu, &Wd, dx, M, dy);
            td_bk_download(cu, got, dy, sizeof(float) * (size_t)(M * N));
            CHECK(same_bits(got, full, (size_t)(M * N), &at), "%s: M=%d differs from M=%d at %zu: %.9g vs %.9g", w.name, M, MMAX, at,
                  got[at], full[at]);
        }
        /* a row alone, at an offset (the verify rows of one sequence) */
        cu->ops->matmul(cu, &Wd, dx + 40 * K, 1, dy);
        td_bk_download(cu, got, dy, sizeof(float) * (size_t)N);
        CHECK(same_bits(got, full + 40 * N, (size_t)N, &at), "%s: row 40 alone differs at %zu", w.name, at);
        td_bk_tensor_free(cu, &Wd);
        cu->ops->free(cu, dx);
        cu->ops->free(cu, dy);
        free(x); free(ref); free(got); free(full); free(w.data); free(w.scales);
    }
}

/* ---- elementwise and row ops ---- */

static void test_rows(void) {
    enum { M = 5, H = 300, V = 1000 };
    float *x = malloc(sizeof(float) * M * H), *w = malloc(sizeof(float) * H), *u = malloc(sizeof(float) * M * H);
    float *ref = malloc(sizeof(float) * M * H), *got = malloc(sizeof(float) * M * H);
    for (int i = 0; i < M * H; i++) x[i] = rndf() * 3.0f, u[i] = rndf();
    for (int i = 0; i < H; i++) w[i] = 1.0f + 0.1f * rndf();
    float *dx = dev_copy(x, sizeof(float) * M * H), *dw = dev_copy(w, sizeof(float) * H), *du = dev_copy(u, sizeof(float) * M * H);
    float *dy = cu->ops->alloc(cu, sizeof(float) * M * H);

    cpu->ops->rmsnorm(cpu, ref, x, w, M, H, 1e-6f);
    cu->ops->rmsnorm(cu, dy, dx, dw, M, H, 1e-6f);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    CHECK(max_rel(got, ref, M * H) < 1e-5, "rmsnorm rel %g", max_rel(got, ref, M * H));
    float one[H];
    cu->ops->rmsnorm(cu, dy, dx + 3 * H, dw, 1, H, 1e-6f); /* batch invariance */
    td_bk_download(cu, one, dy, sizeof one);
    size_t at;
    CHECK(same_bits(one, got + 3 * H, H, &at), "rmsnorm row 3 alone differs at %zu", at);

    memcpy(ref, x, sizeof(float) * M * H);
    cpu->ops->add(cpu, ref, u, M * H);
    cu->ops->copy(cu, dy, dx, sizeof(float) * M * H);
    cu->ops->add(cu, dy, du, M * H);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    CHECK(same_bits(got, ref, M * H, &at), "add differs at %zu", at);

    memcpy(ref, x, sizeof(float) * M * H);
    cpu->ops->silu_mul(cpu, ref, u, M * H);
    cu->ops->copy(cu, dy, dx, sizeof(float) * M * H);
    cu->ops->silu_mul(cu, dy, du, M * H);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    CHECK(max_rel(got, ref, M * H) < 1e-5, "silu_mul rel %g", max_rel(got, ref, M * H));

    /* copy with overlap (memmove semantics), copy_rows, fill0, alloc zeroed */
    cu->ops->copy(cu, dy, dx, sizeof(float) * M * H);
    cu->ops->copy(cu, dy + 7, dy, sizeof(float) * 100);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    memcpy(ref, x, sizeof(float) * M * H);
    memmove(ref + 7, ref, sizeof(float) * 100);
    CHECK(same_bits(got, ref, M * H, &at), "overlapping copy differs at %zu", at);
    cu->ops->fill0(cu, dy, sizeof(float) * M * H);
    cu->ops->copy_rows(cu, dy, H, dx + 5, H, 20, M);
    td_bk_download(cu, got, dy, sizeof(float) * M * H);
    int ok = 1;
    for (int r = 0; r < M; r++)
        for (int i = 0; i < H; i++) ok &= got[r * H + i] == (i < 20 ? x[r * H + 5 + i] : 0.0f);
    CHECK(ok, "copy_rows");
    unsigned char *z = cu->ops->alloc(cu, 4096), zh[4096];
    memset(zh, 0xab, sizeof zh);
    td_bk_download(cu, zh, z, sizeof zh);
    ok = 1;
    for (size_t i = 0; i < sizeof zh; i++) ok &= zh[i] == 0;
    CHECK(ok, "alloc is zeroed");
    cu->ops->free(cu, z);
    cu->ops->free(cu, NULL);

    /* argmax: ties to the lowest index, NaNs never win, NaN at 0 keeps 0 */
    float *lg = malloc(sizeof(float) * 4 * V);
    for (int i = 0; i < 4 * V; i++) lg[i] = rndf();
    lg[0 * V + 10] = lg[0 * V + 700] = 5.0f;
    lg[1 * V + 3] = NAN; lg[1 * V + 999] = 9.0f;
    lg[2 * V + 0] = NAN;
    for (int i = 0; i < V; i++) lg[3 * V + i] = -INFINITY;
    float *dl = dev_copy(lg, sizeof(float) * 4 * V);
    int32_t *dam = cu->ops->alloc(cu, 4 * sizeof(int32_t)), am[4], amc[4];
    cu->ops->argmax(cu, dl, 4, V, dam);
    td_bk_download(cu, am, dam, sizeof am);
    cpu->ops->argmax(cpu, lg, 4, V, amc);
    for (int r = 0; r < 4; r++) CHECK(am[r] == amc[r], "argmax row %d: cuda %d cpu %d", r, am[r], amc[r]);

    /* embed in each float dtype: exact */
    for (int dt = 0; dt < 3; dt++) {
        weight e = make_weight(dt, 50, H);
        td_tensor Ed;
        td_err err;
        CHECK(td_bk_tensor_load(cu, &e.W, &Ed, &err) == 0, "embed load: %s", err.msg);
        int32_t tok[M] = {3, 49, 0, 3, 17};
        int32_t *dt_ = dev_copy(tok, sizeof tok);
        cpu->ops->embed(cpu, &e.W, tok, M, ref);
        cu->ops->embed(cu, &Ed, dt_, M, dy);
        td_bk_download(cu, got, dy, sizeof(float) * M * H);
        CHECK(same_bits(got, ref, M * H, &at), "embed %s differs at %zu", e.name, at);
        td_bk_tensor_free(cu, &Ed);
        cu->ops->free(cu, dt_);
        free(e.data);
    }
    cu->ops->free(cu, dl); cu->ops->free(cu, dam);
    cu->ops->free(cu, dx); cu->ops->free(cu, dw); cu->ops->free(cu, du); cu->ops->free(cu, dy);
    free(x); free(w); free(u); free(ref); free(got); free(lg);
}

/* ---- KV rows: store / load in each KV dtype, same bits as the CPU ---- */

static void test_kv(void) {
    enum { NKV = 2, HD = 64, D = NKV * HD, ROWS = 32 };
    const td_kv_dtype st[] = {TD_KV_F32, TD_KV_BF16, TD_KV_FP8};
    const size_t esz[] = {4, 2, 1};
    for (int s = 0; s < 3; s++) {
        td_kv_view hv = {.store = st[s], .kv_dim = D, .head_dim = HD}, dv = hv;
        hv.k = calloc(ROWS * D, esz[s]); hv.v = calloc(ROWS * D, esz[s]);
        dv.k = cu->ops->alloc(cu, ROWS * D * esz[s]); dv.v = cu->ops->alloc(cu, ROWS * D * esz[s]);
        if (st[s] == TD_KV_FP8) {
            hv.ks = calloc(ROWS * NKV, 4); hv.vs = calloc(ROWS * NKV, 4);
            dv.ks = cu->ops->alloc(cu, ROWS * NKV * 4); dv.vs = cu->ops->alloc(cu, ROWS * NKV * 4);
        }
        float k[D], v[D], a[D], b[D];
        float *dk = cu->ops->alloc(cu, sizeof k), *dvv = cu->ops->alloc(cu, sizeof v), *dout = cu->ops->alloc(cu, sizeof a);
        int ok = 1;
        for (int row = 0; row < ROWS; row += 5) {
            for (int i = 0; i < D; i++) k[i] = rndf() * (float)(row + 1), v[i] = rndf() * 1e-3f;
            if (row == 10) for (int i = 0; i < HD; i++) k[i] = 0.0f; /* an all-zero head: scale 1 */
            td_bk_upload(cu, dk, k, sizeof k);
            td_bk_upload(cu, dvv, v, sizeof v);
            cpu->ops->kv_store(cpu, &hv, row, k, v);
            cu->ops->kv_store(cu, &dv, row, dk, dvv);
            for (int which = 0; which < 2; which++) {
                cpu->ops->kv_load(cpu, &hv, row, which, a);
                cu->ops->kv_load(cu, &dv, row, which, dout);
                td_bk_download(cu, b, dout, sizeof b);
                size_t at;
                ok &= same_bits(b, a, D, &at);
            }
        }
        CHECK(ok, "kv rows differ from the CPU's (store %d)", (int)st[s]);
        free(hv.k); free(hv.v); free(hv.ks); free(hv.vs);
        cu->ops->free(cu, dv.k); cu->ops->free(cu, dv.v); cu->ops->free(cu, dv.ks); cu->ops->free(cu, dv.vs);
        cu->ops->free(cu, dk); cu->ops->free(cu, dvv); cu->ops->free(cu, dout);
    }
}

/* ---- sample: the same sampler calls on both backends give the same ids ---- */

static void test_sample(void) {
    enum { V = 512 };
    td_sampling p;
    td_sampling_default(&p);
    p.temperature = 0.8f; p.top_k = 40; p.top_p = 0.9f; p.repetition_penalty = 1.2f; p.frequency_penalty = 0.1f; p.seed = 11;
    int32_t prompt[3] = {1, 2, 3};
    td_sampler sc, sg;
    td_err err;
    CHECK(td_sampler_init_backend(&sc, cpu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
    CHECK(td_sampler_init_backend(&sg, cu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
    float lg[V], pc[V], pg[V];
    float *dl = cu->ops->alloc(cu, sizeof lg), *dp = cu->ops->alloc(cu, sizeof lg), *dq = cu->ops->alloc(cu, sizeof lg);
    float *hl = cpu->ops->alloc(cpu, sizeof lg), *hp = cpu->ops->alloc(cpu, sizeof lg), *hq = cpu->ops->alloc(cpu, sizeof lg);
    int same = 1, probs_same = 1;
    for (int step = 0; step < 20; step++) {
        for (int i = 0; i < V; i++) lg[i] = rndf() * 4.0f;
        td_bk_upload(cu, dl, lg, sizeof lg);
        td_bk_upload(cpu, hl, lg, sizeof lg);
        int32_t a = td_sampler_sample(&sc, hl), b = td_sampler_sample(&sg, dl);
        same &= a == b;
        td_sampler_accept(&sc, a);
        td_sampler_accept(&sg, a);
        /* the speculative calls: probabilities, the rejection test, the residual draw */
        td_sampler_probs(&sc, hl, hp);
        td_sampler_probs(&sg, dl, dp);
        td_bk_download(cu, pg, dp, sizeof pg);
        memcpy(pc, hp, sizeof pc);
        size_t at;
        probs_same &= same_bits(pg, pc, V, &at);
        for (int i = 0; i < V; i++) lg[i] = rndf() * 4.0f;
        td_bk_upload(cu, dq, lg, sizeof lg);
        td_bk_upload(cpu, hq, lg, sizeof lg);
        td_sampler_probs(&sc, hq, hq);
        td_sampler_probs(&sg, dq, dq);
        int d = (int)(rnd() % V);
        same &= td_sampler_accept_draft(&sc, hp, hq, d) == td_sampler_accept_draft(&sg, dp, dq, d);
        same &= td_sampler_residual(&sc, hp, hq, d) == td_sampler_residual(&sg, dp, dq, d);
    }
    CHECK(same, "sampled ids or rejection tests differ between cuda and cpu");
    CHECK(probs_same, "sampler probabilities differ between cuda and cpu");
    td_sampler_free(&sc);
    td_sampler_free(&sg);
    cu->ops->free(cu, dl); cu->ops->free(cu, dp); cu->ops->free(cu, dq);
    cpu->ops->free(cpu, hl); cpu->ops->free(cpu, hp); cpu->ops->free(cpu, hq);
}

int main(void) {
    td_err err;
    int rc = td_backend_create("cuda", 1, &cu, &err);
    if (rc) {
        const char *m = td_err_text(&err);
        int no_build = strstr(m, "this build has no CUDA backend: rebuild with make CUDA=1") != NULL;
        int no_dev = strncmp(m, "no CUDA device: ", 16) == 0;
        CHECK(no_build || no_dev, "unexpected error: %s", err.msg);
        CHECK(!strchr(err.msg, '\n'), "one line");
        CHECK(cu == NULL, "no backend on failure");
        printf("backend_cuda: device checks skipped (%s)\n", m);
        TEST_MAIN_END("backend_cuda");
    }
    CHECK(strcmp(cu->ops->name, "cuda") == 0, "name");
    CHECK(cu->ops->parallel_for == NULL, "no host pool on a device");
    size_t fr = 0, tot = 0;
    CHECK(td_backend_cuda_mem_info(cu, &fr, &tot) == 0 && tot > 0 && fr <= tot, "mem_info %zu / %zu", fr, tot);
    CHECK(td_backend_create("cpu", 2, &cpu, &err) == 0, "%s", err.msg);
    CHECK(td_backend_cuda_mem_info(cpu, &fr, &tot) != 0, "mem_info refuses a CPU backend");
    test_matmul();
    test_rows();
    test_kv();
    test_sample();
    printf("backend_cuda: on the device (cpu kernels: %s)\n", td_isa_name((td_isa)cpu->isa));
    td_backend_free(cu);
    td_backend_free(cpu);
    TEST_MAIN_END("backend_cuda");
}
