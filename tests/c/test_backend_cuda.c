/* The CUDA backend against the CPU reference, op by op (matmul in every
 * weight dtype and its batch invariance, rmsnorm, add, silu_mul, embed,
 * argmax, KV rows in every KV dtype, the memory ops, fill_random, the sample op, attn_prep
 * and attention, gdn_conv and gdn_recur on a two-segment batch). The
 * whole engine on CUDA is the rest of the suite with TANDEM_BACKEND=cuda
 * (scripts/gpu-check.sh).
 *
 * Without CUDA (a build with CUDA=0, or no device / driver, as on the CI
 * machine) td_backend_create("cuda") must fail with one clear line; the test
 * checks that and skips the device checks. The fast mode's cuBLAS, cuBLASLt
 * and split-attention paths are test_cuda_fast_ops. */
#include "cuda_test_util.h"
#include "model/config.h"
#include "sample/sampler.h"

/* ---- matmul ---- */

static void test_matmul(void) {
    const int Ms[] = {1, 2, 5, 16, 17, 33, 70, 128, 129, 150};
    const int MMAX = 150;
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
        /* batch invariance: every M (one gemv pass, 16-row slices, tiles) gives the rows of the M = 150 pass, bit for bit */
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

static void test_sample(const char *standin) {
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
    int same = 1, probs_same = 1, small = 1;
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
        uint64_t b0 = td_backend_cuda_sample_bytes(cu);
        same &= td_sampler_accept_draft(&sc, hp, hq, d) == td_sampler_accept_draft(&sg, dp, dq, d);
        if (!standin) small &= td_backend_cuda_sample_bytes(cu) - b0 == 8; /* p[d] and q[d] */
        same &= td_sampler_residual(&sc, hp, hq, d) == td_sampler_residual(&sg, dp, dq, d);
    }
    CHECK(same, "sampled ids or rejection tests differ between cuda and cpu");
    CHECK(probs_same, "sampler probabilities differ between cuda and cpu");
    CHECK(small, "a rejection test moved more than p[d] and q[d]");
    td_sampler_free(&sc);
    td_sampler_free(&sg);
    cu->ops->free(cu, dl); cu->ops->free(cu, dp); cu->ops->free(cu, dq);
    cpu->ops->free(cpu, hl); cpu->ops->free(cpu, hp); cpu->ops->free(cpu, hq);
}


/* ---- T > 0 on the device: the same ids and distributions as the CPU, 8 bytes per call ----
 * Each config runs SAMPLE, PROBS (into another row and in place), FROM and
 * RESIDUAL (against a distribution and one-hot) on both backends: ids equal,
 * probabilities within 1e-5 relative (same operations; the device adds its
 * double sums in a tree), and what crossed: 8 bytes (+ a bias list) when the
 * device took the call. A flat distribution with top-p 0.99 and no top-k
 * needs more than 1024 tokens: that call goes to the host (and must still
 * agree), and the test checks it did. */
static void test_sample_dist(const char *standin) {
    typedef struct { float t; int k; float p, minp; int pen, bias, mask, flat; int host; } cfg_t;
    static const cfg_t cfgs[] = {
        {0.7f, 0, 1.0f, 0.0f, 0, 0, 0, 0, 0}, {1.0f, 5, 1.0f, 0.0f, 0, 0, 0, 0, 0},   {0.9f, 2000, 0.8f, 0.0f, 0, 0, 0, 0, 0},
        {0.8f, 0, 0.9f, 0.0f, 0, 0, 0, 0, 0}, {1.3f, 0, 1.0f, 0.1f, 0, 0, 0, 0, 0},   {0.8f, 40, 0.95f, 0.05f, 1, 1, 1, 0, 0},
        {1.0f, 0, 0.99f, 0.0f, 0, 0, 0, 1, 1}, {1.0f, 3000, 1.0f, 0.0f, 1, 0, 1, 1, 0},
    };
    static const int vocabs[] = {77, 3001};
    for (int vi = 0; vi < 2; vi++)
        for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
            const cfg_t *cf = &cfgs[ci];
            const int V = vocabs[vi];
            td_sampling p;
            td_sampling_default(&p);
            p.temperature = cf->t; p.top_k = cf->k; p.top_p = cf->p; p.min_p = cf->minp; p.seed = 7 + ci;
            td_logit_bias bias[3] = {{3, 4.0f}, {V - 1, 2.5f}, {3, -1.0f}};
            if (cf->pen) { p.repetition_penalty = 1.3f; p.frequency_penalty = 0.2f; p.presence_penalty = 0.4f; }
            if (cf->bias) { p.logit_bias = bias; p.n_logit_bias = 3; }
            int32_t prompt[3] = {0, 5, V - 3};
            td_sampler sc, sg;
            td_err err;
            CHECK(td_sampler_init_backend(&sc, cpu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
            CHECK(td_sampler_init_backend(&sg, cu, &p, V, prompt, 3, &err) == 0, "%s", err.msg);
            size_t fb = sizeof(float) * (size_t)V;
            float *lg = malloc(fb), *pc = malloc(fb), *pg = malloc(fb);
            uint32_t *mask = calloc((size_t)(V + 31) / 32, sizeof(uint32_t));
            for (int i = 0; i < V; i++) if (rnd() % 4) mask[i >> 5] |= 1u << (i & 31);
            float *dl = cu->ops->alloc(cu, fb), *dp = cu->ops->alloc(cu, fb), *dq = cu->ops->alloc(cu, fb);
            float *hl = cpu->ops->alloc(cpu, fb), *hp = cpu->ops->alloc(cpu, fb), *hq = cpu->ops->alloc(cpu, fb);
            int same = 1, device = 1, host = 1, first_bad = -1;
            double worst = 0;
            const uint64_t extra = cf->bias ? 3 * sizeof(td_logit_bias) : 0;
            for (int step = 0; step < 12; step++) {
                for (int i = 0; i < V; i++) lg[i] = cf->flat ? rndf() * 0.05f : rndf() * 6.0f;
                td_bk_upload(cu, dl, lg, fb);
                td_bk_upload(cpu, hl, lg, fb);
                td_sampler_set_mask(&sc, cf->mask ? mask : NULL);
                td_sampler_set_mask(&sg, cf->mask ? mask : NULL);
                uint64_t b0 = td_backend_cuda_sample_bytes(cu);
                int32_t a = td_sampler_sample(&sc, hl), b = td_sampler_sample(&sg, dl);
                uint64_t moved = td_backend_cuda_sample_bytes(cu) - b0;
                if (!standin) { if (moved == 8 + extra) host = 0; else device = 0; }
                int ok = a == b;
                td_sampler_accept(&sc, a);
                td_sampler_accept(&sg, a);
                td_sampler_probs(&sc, hl, hp);
                td_sampler_probs(&sg, dl, dp);
                td_bk_download(cu, pg, dp, fb);
                double r = max_rel(pg, hp, (size_t)V);
                if (!(r <= worst)) worst = r;
                /* in place, as the spec path does for the draft rows */
                td_bk_upload(cu, dq, lg, fb);
                td_bk_upload(cpu, hq, lg, fb);
                td_sampler_probs(&sc, hq, hq);
                td_sampler_probs(&sg, dq, dq);
                td_bk_download(cu, pc, dq, fb);
                r = max_rel(pc, hq, (size_t)V);
                if (!(r <= worst)) worst = r;
                td_sampler_set_mask(&sc, NULL);
                td_sampler_set_mask(&sg, NULL);
                ok &= td_sample_from(&sc, hp) == td_sample_from(&sg, dp);
                int d = (int)(rnd() % V);
                b0 = td_backend_cuda_sample_bytes(cu);
                ok &= td_sampler_residual(&sc, hp, step & 1 ? hq : NULL, d) == td_sampler_residual(&sg, dp, step & 1 ? dq : NULL, d);
                if (!standin && td_backend_cuda_sample_bytes(cu) - b0 != 8) device = 0; /* residual: always on the device */
                td_bk_download(cu, pg, dp, fb);
                r = max_rel(pg, hp, (size_t)V);
                if (!(r <= worst)) worst = r;
                if (!ok && first_bad < 0) first_bad = step;
                same &= ok;
            }
            CHECK(same, "V %d config %zu: T>0 ids differ between cuda and cpu (first at step %d)", V, ci, first_bad);
            CHECK(worst <= 1e-5, "V %d config %zu: probabilities differ by %.3g (relative)", V, ci, worst);
            CHECK(memcmp(&sc.rng, &sg.rng, sizeof sc.rng) == 0, "V %d config %zu: the RNGs drifted apart", V, ci);
            if (!standin) {
                /* the flat top-p config needs the host only where more than 1024 tokens exist */
                bool want_host = cf->host && V > 1024;
                CHECK(want_host ? host : device, "V %d config %zu: expected every SAMPLE on the %s", V, ci, want_host ? "host" : "device");
            }
            td_sampler_free(&sc);
            td_sampler_free(&sg);
            cu->ops->free(cu, dl); cu->ops->free(cu, dp); cu->ops->free(cu, dq);
            cpu->ops->free(cpu, hl); cpu->ops->free(cpu, hp); cpu->ops->free(cpu, hq);
            free(lg); free(pc); free(pg); free(mask);
        }
}

/* ---- greedy and draft argmax on the device: ids equal to the CPU's, 4 bytes per call ----
 * Logits on a coarse grid (ties are common, and penalties make more), a
 * NaN or -inf now and then, vocabularies below and above one block's
 * threads and not a multiple of 32; each sampler config runs the same calls
 * on both backends: GREEDY, SAMPLE (greedy sampler), DRAFT_ARGMAX, with and
 * without a mask (some allowing one token or none). */
static void test_sample_greedy(const char *standin) {
    static const int vocabs[] = {77, 3001};
    for (int vi = 0; vi < 2; vi++)
        for (int cfg = 0; cfg < 4; cfg++) {
            const int V = vocabs[vi];
            td_sampling p;
            td_sampling_default(&p);
            td_logit_bias bias[4] = {{5, 2.5f}, {V - 1, -1.0f}, {5, -0.75f}, {V / 2, 0.25f}}; /* token 5 twice: summed in order */
            if (cfg == 1 || cfg == 3) { p.repetition_penalty = 1.3f; p.frequency_penalty = 0.25f; p.presence_penalty = 0.5f; }
            if (cfg >= 2) { p.logit_bias = bias; p.n_logit_bias = 4; }
            int32_t prompt[4] = {0, 3, 7, V - 2};
            td_sampler sc, sg;
            td_err err;
            CHECK(td_sampler_init_backend(&sc, cpu, &p, V, prompt, 4, &err) == 0, "%s", err.msg);
            CHECK(td_sampler_init_backend(&sg, cu, &p, V, prompt, 4, &err) == 0, "%s", err.msg);
            float *lg = malloc(sizeof(float) * (size_t)V);
            uint32_t *mask = calloc((size_t)(V + 31) / 32, sizeof(uint32_t));
            float *dl = cu->ops->alloc(cu, sizeof(float) * (size_t)V), *hl = cpu->ops->alloc(cpu, sizeof(float) * (size_t)V);
            int same = 1, small = 1, first_bad = -1;
            for (int step = 0; step < 24; step++) {
                /* every (mask mode, logits case) pair once */
                const int mode = step % 4, lcase = step / 4; /* mode: 0 no mask, 1 random, 2 one token, 3 none */
                memset(mask, 0, sizeof(uint32_t) * (size_t)((V + 31) / 32));
                if (mode == 1) for (int i = 0; i < V; i++) { if (rnd() % 3) mask[i >> 5] |= 1u << (i & 31); }
                if (mode == 2) { int t = 1 + (int)(rnd() % (V - 1)); mask[t >> 5] |= 1u << (t & 31); }
                if (mode == 1 && lcase >= 2) mask[0] &= ~1u; /* the first allowed token is not token 0 */
                int first = 0; /* the first token the mask allows (0 without a mask) */
                while (mode && first < V && !td_mask_allows(mask, first)) first++;
                for (int i = 0; i < V; i++) lg[i] = (float)(int)(rndf() * 6.0f) * 0.5f; /* 25 values: many ties */
                if (lcase == 1) lg[rnd() % V] = NAN;
                if (lcase == 2 && first < V) lg[first] = NAN; /* a NaN where the scan starts keeps it */
                if (lcase == 3) for (int i = 0; i < V; i++) lg[i] = -INFINITY; /* penalize's -inf of a masked token ties */
                if (lcase == 4) for (int i = 0; i < V; i++) lg[i] = 1.0f; /* all tied */
                if (lcase == 5) lg[0] = NAN;
                td_bk_upload(cu, dl, lg, sizeof(float) * (size_t)V);
                td_bk_upload(cpu, hl, lg, sizeof(float) * (size_t)V);
                td_sampler_set_mask(&sc, mode ? mask : NULL);
                td_sampler_set_mask(&sg, mode ? mask : NULL);
                uint64_t b0 = td_backend_cuda_sample_bytes(cu);
                int32_t a = td_sampler_greedy(&sc, hl), b = td_sampler_greedy(&sg, dl);
                int32_t a2 = td_sampler_sample(&sc, hl), b2 = td_sampler_sample(&sg, dl);
                int32_t a3 = td_sampler_draft_argmax(&sc, hl, sc.mask), b3 = td_sampler_draft_argmax(&sg, dl, sg.mask);
                uint64_t moved = td_backend_cuda_sample_bytes(cu) - b0;
                /* 4 bytes of result per call, and the bias list when there is one */
                uint64_t want = 3 * (4 + (cfg >= 2 ? 4 * sizeof(td_logit_bias) : 0));
                if (!standin && moved != want) small = 0;
                if (!(a == b && a2 == b2 && a3 == b3) && first_bad < 0) first_bad = step;
                same &= a == b && a2 == b2 && a3 == b3;
                if (mode == 3) same &= a3 == -1 && b3 == -1;
                td_sampler_accept(&sc, a);
                td_sampler_accept(&sg, a);
            }
            CHECK(same, "V %d config %d: greedy / draft ids differ between cuda and cpu (first at step %d)", V, cfg, first_bad);
            CHECK(small, "V %d config %d: a device greedy call moved more than its result", V, cfg);
            td_sampler_set_mask(&sc, NULL);
            td_sampler_set_mask(&sg, NULL);
            td_sampler_free(&sc);
            td_sampler_free(&sg);
            cu->ops->free(cu, dl);
            cpu->ops->free(cpu, hl);
            free(lg);
            free(mask);
        }
}


/* ---- attention and DeltaNet on a two-segment batch ----
 * Segment 0: a 5-token prompt at positions 0..4 (DeltaNet slot 0 in place);
 * segment 1: a 2-token verify at positions 3, 4 of another sequence (slot 1,
 * checkpoints into slots 2 and 0), its positions 0..2 already in the KV. The
 * CUDA results are compared with the CPU's (expf, cosf and the sums of the
 * norms round differently: a norm-wise tolerance), and segment 1 alone must
 * give the bits it gives in the full batch (batch invariance). */

enum { NSEG = 2, MB = 7, NSLOT = 3 };
static float *dvec(const float *h, size_t n) { return dev_copy(h, n * sizeof(float)); }
static void dget(float *h, const float *d, size_t n) { td_bk_download(cu, h, d, n * sizeof(float)); }

/* batch arrays in host memory (hb) and the same on the device (db); only_seg1: a batch of segment 1 alone */
typedef struct { td_batch hb, db; int32_t tokens[MB], row_seg[MB], seg[NSEG * TD_SEG_FIELDS], bts[4]; float *hstate[NSEG], *dstate[NSEG]; void *dmem; } batch;
static void make_batch(batch *b, int only_seg1, float *const *hpool, float *const *dpool) {
    memset(b, 0, sizeof *b);
    int32_t s0[TD_SEG_FIELDS] = {0, 5, 0, 0, 0, 0, NSLOT}, s1[TD_SEG_FIELDS] = {3, 2, 5, 2, 1, 1, NSLOT};
    int ns = 0;
    if (!only_seg1) { memcpy(b->seg, s0, sizeof s0); b->hstate[ns] = hpool[0]; b->dstate[ns] = dpool[0]; ns++; }
    memcpy(b->seg + ns * TD_SEG_FIELDS, s1, sizeof s1);
    if (only_seg1) b->seg[TD_SEG_ROW0] = 0;
    b->hstate[ns] = hpool[1]; b->dstate[ns] = dpool[1]; ns++;
    int M = 0;
    for (int i = 0; i < ns; i++)
        for (int t = 0; t < b->seg[i * TD_SEG_FIELDS + TD_SEG_N]; t++) b->row_seg[M] = i, b->tokens[M++] = t;
    int32_t bts[4] = {0, 1, 2, 3};
    memcpy(b->bts, bts, sizeof bts);
    b->hb = (td_batch){.M = M, .n_seg = ns, .tokens = b->tokens, .row_seg = b->row_seg, .seg = b->seg, .block_tables = b->bts,
                       .state = b->hstate};
    /* the device copy: one buffer [state pointers | tokens | row_seg | seg | block tables], as forward.c uploads it */
    size_t np = sizeof(float *) * NSEG, nt = sizeof(int32_t) * MB;
    unsigned char *d = cu->ops->alloc(cu, np + 2 * nt + sizeof b->seg + sizeof b->bts);
    td_bk_upload(cu, d, b->dstate, np);
    td_bk_upload(cu, d + np, b->tokens, nt);
    td_bk_upload(cu, d + np + nt, b->row_seg, nt);
    td_bk_upload(cu, d + np + 2 * nt, b->seg, sizeof b->seg);
    td_bk_upload(cu, d + np + 2 * nt + sizeof b->seg, b->bts, sizeof b->bts);
    b->dmem = d;
    b->db = (td_batch){.M = M, .n_seg = ns, .tokens = (const int32_t *)(d + np), .row_seg = (const int32_t *)(d + np + nt),
                       .seg = (const int32_t *)(d + np + 2 * nt), .block_tables = (const int32_t *)(d + np + 2 * nt + sizeof b->seg),
                       .state = (float *const *)d};
}

static void test_attention(const td_config *g) {
    int nh = g->n_heads, hd = g->head_dim, nkv = g->n_kv_heads, ad = nh * hd, kvd = nkv * hd;
    size_t nqg = (size_t)MB * ad * 2, nk = (size_t)MB * kvd, nq = (size_t)MB * ad;
    float *qg = rnd_vec(nqg, 2.0f, 0), *k = rnd_vec(nk, 2.0f, 0), *v = rnd_vec(nk, 1.0f, 0);
    float *qn = rnd_vec((size_t)hd, 0.2f, 1.0f), *kn = rnd_vec((size_t)hd, 0.2f, 1.0f), inv[64];
    for (int i = 0; i < g->rot_dim / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)g->rot_dim);
    const td_kv_dtype st[] = {TD_KV_F32, TD_KV_FP8};
    for (int si = 0; si < 2; si++) {
        size_t rows = 4 * TD_KV_BLOCK, es = st[si] == TD_KV_F32 ? 4 : 1;
        td_kv_view hv = {.store = st[si], .kv_dim = kvd, .head_dim = hd}, dv = hv;
        hv.k = calloc(rows * kvd, es); hv.v = calloc(rows * kvd, es);
        dv.k = cu->ops->alloc(cu, rows * kvd * es); dv.v = cu->ops->alloc(cu, rows * kvd * es);
        if (st[si] == TD_KV_FP8) {
            hv.ks = calloc(rows * nkv, 4); hv.vs = calloc(rows * nkv, 4);
            dv.ks = cu->ops->alloc(cu, rows * nkv * 4); dv.vs = cu->ops->alloc(cu, rows * nkv * 4);
        }
        /* segment 1's positions 0..2 (block 2, rows 32..34), the same on both backends */
        float *dtmp = cu->ops->alloc(cu, 2 * sizeof(float) * kvd);
        for (int p = 0; p < 3; p++) {
            float *kk = rnd_vec((size_t)kvd, 1.0f, 0), *vv = rnd_vec((size_t)kvd, 1.0f, 0);
            cpu->ops->kv_store(cpu, &hv, 2 * TD_KV_BLOCK + p, kk, vv);
            td_bk_upload(cu, dtmp, kk, sizeof(float) * kvd);
            td_bk_upload(cu, dtmp + kvd, vv, sizeof(float) * kvd);
            cu->ops->kv_store(cu, &dv, 2 * TD_KV_BLOCK + p, dtmp, dtmp + kvd);
            free(kk); free(vv);
        }
        float *none[NSEG] = {NULL, NULL};
        batch b;
        make_batch(&b, 0, none, none);
        float *hk = malloc(nk * 4), *hq = calloc(nq, 4), *hgate = calloc(nq, 4), *hout = calloc(nq, 4);
        memcpy(hk, k, nk * 4);
        cpu->ops->attn_prep(cpu, g, &b.hb, qg, hk, v, qn, kn, inv, hq, hgate, &hv, 0);
        cpu->ops->attention(cpu, g, &b.hb, hq, hgate, &hv, 0, hout);
        float *dqg = dvec(qg, nqg), *dk = dvec(k, nk), *dvv = dvec(v, nk), *dqn = dvec(qn, (size_t)hd), *dkn = dvec(kn, (size_t)hd);
        float *dinv = dvec(inv, (size_t)g->rot_dim / 2);
        float *dq = cu->ops->alloc(cu, nq * 4), *dgate = cu->ops->alloc(cu, nq * 4), *dout = cu->ops->alloc(cu, nq * 4);
        cu->ops->attn_prep(cu, g, &b.db, dqg, dk, dvv, dqn, dkn, dinv, dq, dgate, &dv, 0);
        cu->ops->attention(cu, g, &b.db, dq, dgate, &dv, 0, dout);
        float *got = malloc(nq * 4), *one = malloc(nq * 4);
        dget(got, dq, nq);
        CHECK(max_abs_norm(got, hq, nq) < 1e-5, "attn_prep q (kv %d): %g", (int)st[si], max_abs_norm(got, hq, nq));
        dget(got, dgate, nq);
        size_t at;
        CHECK(same_bits(got, hgate, nq, &at), "attn_prep gate split differs at %zu", at);
        dget(got, dk, nk);
        CHECK(max_abs_norm(got, hk, nk) < 1e-5, "attn_prep k (kv %d): %g", (int)st[si], max_abs_norm(got, hk, nk));
        dget(got, dout, nq);
        double tol = st[si] == TD_KV_F32 ? 1e-5 : 3e-2; /* fp8: a code can differ where k differs by an ulp */
        CHECK(max_abs_norm(got, hout, nq) < tol, "attention (kv %d): %g", (int)st[si], max_abs_norm(got, hout, nq));
        /* batch invariance: segment 1 alone gives its rows' bits */
        batch b1;
        make_batch(&b1, 1, none, none);
        float *dk1 = dvec(k + 5 * kvd, 2 * (size_t)kvd), *dout1 = cu->ops->alloc(cu, nq * 4), *dq1 = cu->ops->alloc(cu, nq * 4);
        cu->ops->attn_prep(cu, g, &b1.db, dqg + 5 * 2 * ad, dk1, dvv + 5 * kvd, dqn, dkn, dinv, dq1, dgate, &dv, 0);
        cu->ops->attention(cu, g, &b1.db, dq1, dgate, &dv, 0, dout1);
        dget(one, dout1, 2 * (size_t)ad);
        CHECK(same_bits(one, got + 5 * ad, 2 * (size_t)ad, &at), "attention (kv %d): segment 1 alone differs at %zu", (int)st[si], at);
        cu->ops->free(cu, b.dmem); cu->ops->free(cu, b1.dmem);
        cu->ops->free(cu, dk1); cu->ops->free(cu, dout1); cu->ops->free(cu, dq1); cu->ops->free(cu, dtmp);
        cu->ops->free(cu, dqg); cu->ops->free(cu, dk); cu->ops->free(cu, dvv); cu->ops->free(cu, dqn); cu->ops->free(cu, dkn);
        cu->ops->free(cu, dinv); cu->ops->free(cu, dq); cu->ops->free(cu, dgate); cu->ops->free(cu, dout);
        cu->ops->free(cu, dv.k); cu->ops->free(cu, dv.v); cu->ops->free(cu, dv.ks); cu->ops->free(cu, dv.vs);
        free(hv.k); free(hv.v); free(hv.ks); free(hv.vs);
        free(hk); free(hq); free(hgate); free(hout); free(got); free(one);
    }
    free(qg); free(k); free(v); free(qn); free(kn);
}

static void test_gdn(const td_config *g) {
    int C = td_cfg_lin_conv_dim(g), Kc = g->conv_kernel, nv = g->lin_nv, vd = nv * g->lin_dv;
    size_t pool = NSLOT * td_cfg_deltanet_state_floats(g);
    float *qkv = rnd_vec((size_t)MB * C, 1.0f, 0), *z = rnd_vec((size_t)MB * vd, 1.0f, 0);
    float *bin = rnd_vec((size_t)MB * nv, 2.0f, 0), *ain = rnd_vec((size_t)MB * nv, 2.0f, 0);
    float *conv = rnd_vec((size_t)C * Kc, 0.5f, 0), *dtb = rnd_vec((size_t)nv, 0.5f, 0), *negA = rnd_vec((size_t)nv, 0.3f, -0.5f);
    float *norm = rnd_vec((size_t)g->lin_dv, 0.1f, 1.0f);
    float *hpool[NSEG] = {rnd_vec(pool, 0.5f, 0), rnd_vec(pool, 0.5f, 0)}, *pool0[NSEG];
    float *dpool[NSEG];
    for (int i = 0; i < NSEG; i++) {
        pool0[i] = malloc(pool * 4);
        memcpy(pool0[i], hpool[i], pool * 4);
        dpool[i] = dvec(hpool[i], pool);
    }
    batch b;
    make_batch(&b, 0, hpool, dpool);
    td_gdn_params hp = {conv, dtb, negA, norm};
    td_gdn_params dp = {dvec(conv, (size_t)C * Kc), dvec(dtb, (size_t)nv), dvec(negA, (size_t)nv), dvec(norm, (size_t)g->lin_dv)};
    float *hco = calloc((size_t)MB * C, 4), *ho = calloc((size_t)MB * vd, 4);
    cpu->ops->gdn_conv(cpu, g, &b.hb, 0, &hp, qkv, hco);
    cpu->ops->gdn_recur(cpu, g, &b.hb, 0, &hp, hco, z, bin, ain, ho, 0);
    float *dqkv = dvec(qkv, (size_t)MB * C), *dz = dvec(z, (size_t)MB * vd), *db = dvec(bin, (size_t)MB * nv), *da = dvec(ain, (size_t)MB * nv);
    float *dco = cu->ops->alloc(cu, (size_t)MB * C * 4), *dout = cu->ops->alloc(cu, (size_t)MB * vd * 4);
    cu->ops->gdn_conv(cu, g, &b.db, 0, &dp, dqkv, dco);
    cu->ops->gdn_recur(cu, g, &b.db, 0, &dp, dco, dz, db, da, dout, 0);
    float *got = malloc((size_t)MB * C * 4), *gpool = malloc(pool * 4);
    dget(got, dco, (size_t)MB * C);
    CHECK(max_abs_norm(got, hco, (size_t)MB * C) < 1e-5, "gdn_conv: %g", max_abs_norm(got, hco, (size_t)MB * C));
    float *go = malloc((size_t)MB * vd * 4), *go1 = malloc((size_t)MB * vd * 4);
    dget(go, dout, (size_t)MB * vd);
    CHECK(max_abs_norm(go, ho, (size_t)MB * vd) < 1e-4, "gdn_recur: %g", max_abs_norm(go, ho, (size_t)MB * vd));
    for (int i = 0; i < NSEG; i++) {
        dget(gpool, dpool[i], pool);
        CHECK(max_abs_norm(gpool, hpool[i], pool) < 1e-5, "gdn state pool %d: %g", i, max_abs_norm(gpool, hpool[i], pool));
    }
    float *full1 = malloc(pool * 4);
    dget(full1, dpool[1], pool);
    /* batch invariance: segment 1 alone, from the same starting state */
    td_bk_upload(cu, dpool[1], pool0[1], pool * 4);
    batch b1;
    make_batch(&b1, 1, hpool, dpool);
    cu->ops->gdn_conv(cu, g, &b1.db, 0, &dp, dqkv + 5 * C, dco);
    cu->ops->gdn_recur(cu, g, &b1.db, 0, &dp, dco, dz + 5 * vd, db + 5 * nv, da + 5 * nv, dout, 0);
    dget(go1, dout, 2 * (size_t)vd);
    size_t at;
    CHECK(same_bits(go1, go + 5 * vd, 2 * (size_t)vd, &at), "gdn: segment 1 alone differs at %zu", at);
    dget(gpool, dpool[1], pool);
    CHECK(same_bits(gpool, full1, pool, &at), "gdn: segment 1's state alone differs at %zu", at);
    /* chunk > 1 leaves a verify segment (checkpoints) token by token: the same bits */
    td_bk_upload(cu, dpool[1], pool0[1], pool * 4);
    cu->ops->gdn_conv(cu, g, &b1.db, 0, &dp, dqkv + 5 * C, dco);
    cu->ops->gdn_recur(cu, g, &b1.db, 0, &dp, dco, dz + 5 * vd, db + 5 * nv, da + 5 * nv, dout, 64);
    dget(go1, dout, 2 * (size_t)vd);
    CHECK(same_bits(go1, go + 5 * vd, 2 * (size_t)vd, &at), "gdn chunk 64 differs at %zu", at);
    cu->ops->free(cu, b.dmem); cu->ops->free(cu, b1.dmem);
    cu->ops->free(cu, (void *)dp.conv); cu->ops->free(cu, (void *)dp.dt_bias); cu->ops->free(cu, (void *)dp.neg_A);
    cu->ops->free(cu, (void *)dp.norm);
    cu->ops->free(cu, dqkv); cu->ops->free(cu, dz); cu->ops->free(cu, db); cu->ops->free(cu, da);
    cu->ops->free(cu, dco); cu->ops->free(cu, dout);
    for (int i = 0; i < NSEG; i++) { cu->ops->free(cu, dpool[i]); free(hpool[i]); free(pool0[i]); }
    free(qkv); free(z); free(bin); free(ain); free(conv); free(dtb); free(negA); free(norm);
    free(hco); free(ho); free(got); free(gpool); free(go); free(go1); free(full1);
}

/* fill_random: the same bytes as the CPU op, every dtype and mode, odd sizes and a grid-stride-sized fill */
/* ---- DeltaNet prompt chunks on the device ----
 * One 45-token prompt segment: the device's chunked form (chunk 16: two
 * chunks and 13 tokens one by one; chunk 64: one device chunk of 32 and 13)
 * against the CPU op with the same chunk (at 64 the CPU leaves 45 tokens
 * token by token) and against the token-by-token form, outputs and final state; on the device it must not
 * be the token-by-token kernel's bits (so the chunk path ran). */
enum { CN = 45 };
static void test_gdn_chunk(const td_config *g, const char *standin) {
    int C = td_cfg_lin_conv_dim(g), Kc = g->conv_kernel, nv = g->lin_nv, vd = nv * g->lin_dv;
    size_t pool = td_cfg_deltanet_state_floats(g);
    float *qkv = rnd_vec((size_t)CN * C, 1.0f, 0), *z = rnd_vec((size_t)CN * vd, 1.0f, 0);
    float *bin = rnd_vec((size_t)CN * nv, 2.0f, 0), *ain = rnd_vec((size_t)CN * nv, 2.0f, 0);
    float *conv = rnd_vec((size_t)C * Kc, 0.5f, 0), *dtb = rnd_vec((size_t)nv, 0.5f, 0), *negA = rnd_vec((size_t)nv, 0.1f, -0.15f);
    float *norm = rnd_vec((size_t)g->lin_dv, 0.1f, 1.0f), *pool0 = rnd_vec(pool, 0.5f, 0);
    int32_t seg[TD_SEG_FIELDS] = {0, CN, 0, 0, 0, 0, 1}, rows[CN], toks[CN], bts[4] = {0, 1, 2, 3};
    for (int t = 0; t < CN; t++) rows[t] = 0, toks[t] = t;
    float *hstate[1] = {malloc(pool * 4)}, *dstate[1] = {dvec(pool0, pool)};
    td_batch hb = {.M = CN, .n_seg = 1, .tokens = toks, .row_seg = rows, .seg = seg, .block_tables = bts, .state = hstate};
    size_t np = sizeof(float *), nt = sizeof(int32_t) * CN;
    unsigned char *dm = cu->ops->alloc(cu, np + 2 * nt + sizeof seg + sizeof bts);
    td_bk_upload(cu, dm, dstate, np);
    td_bk_upload(cu, dm + np, toks, nt);
    td_bk_upload(cu, dm + np + nt, rows, nt);
    td_bk_upload(cu, dm + np + 2 * nt, seg, sizeof seg);
    td_bk_upload(cu, dm + np + 2 * nt + sizeof seg, bts, sizeof bts);
    td_batch db = {.M = CN, .n_seg = 1, .tokens = (const int32_t *)(dm + np), .row_seg = (const int32_t *)(dm + np + nt),
                   .seg = (const int32_t *)(dm + np + 2 * nt), .block_tables = (const int32_t *)(dm + np + 2 * nt + sizeof seg),
                   .state = (float *const *)dm};
    td_gdn_params hp = {conv, dtb, negA, norm};
    td_gdn_params dp = {dvec(conv, (size_t)C * Kc), dvec(dtb, (size_t)nv), dvec(negA, (size_t)nv), dvec(norm, (size_t)g->lin_dv)};
    float *dqkv = dvec(qkv, (size_t)CN * C), *dz = dvec(z, (size_t)CN * vd), *dbin = dvec(bin, (size_t)CN * nv);
    float *dain = dvec(ain, (size_t)CN * nv), *dco = cu->ops->alloc(cu, (size_t)CN * C * 4), *dout = cu->ops->alloc(cu, (size_t)CN * vd * 4);
    float *hco = malloc((size_t)CN * C * 4), *o_ref[3], *s_ref[3], *o_dev[3], *s_dev[3];
    const int chunks[3] = {0, 16, 64};
    for (int c = 0; c < 3; c++) {
        o_ref[c] = malloc((size_t)CN * vd * 4); s_ref[c] = malloc(pool * 4);
        o_dev[c] = malloc((size_t)CN * vd * 4); s_dev[c] = malloc(pool * 4);
        memcpy(hstate[0], pool0, pool * 4);
        cpu->ops->gdn_conv(cpu, g, &hb, 0, &hp, qkv, hco);
        cpu->ops->gdn_recur(cpu, g, &hb, 0, &hp, hco, z, bin, ain, o_ref[c], chunks[c]);
        memcpy(s_ref[c], hstate[0], pool * 4);
        td_bk_upload(cu, dstate[0], pool0, pool * 4);
        cu->ops->gdn_conv(cu, g, &db, 0, &dp, dqkv, dco);
        cu->ops->gdn_recur(cu, g, &db, 0, &dp, dco, dz, dbin, dain, dout, chunks[c]);
        dget(o_dev[c], dout, (size_t)CN * vd);
        dget(s_dev[c], dstate[0], pool);
    }
    size_t no = (size_t)CN * vd, at;
    for (int c = 1; c < 3; c++) {
        double e1 = max_abs_norm(o_dev[c], o_ref[c], no), e2 = max_abs_norm(o_dev[c], o_ref[0], no);
        double e3 = max_abs_norm(s_dev[c], s_ref[c], pool), e4 = max_abs_norm(s_dev[c], s_ref[0], pool);
        CHECK(e1 < 1e-4 && e3 < 1e-4, "gdn chunk %d: device vs cpu chunked: outputs %g, state %g", chunks[c], e1, e3);
        CHECK(e2 < 1e-4 && e4 < 1e-4, "gdn chunk %d: device vs token by token: outputs %g, state %g", chunks[c], e2, e4);
        /* (a stand-in runs the CPU op, whose chunk 64 leaves 45 tokens token by token) */
        CHECK(standin || !same_bits(o_dev[c], o_dev[0], no, &at), "gdn chunk %d: the device ran token by token (same bits)", chunks[c]);
    }
    for (int c = 0; c < 3; c++) { free(o_ref[c]); free(s_ref[c]); free(o_dev[c]); free(s_dev[c]); }
    cu->ops->free(cu, dm); cu->ops->free(cu, dstate[0]);
    cu->ops->free(cu, (void *)dp.conv); cu->ops->free(cu, (void *)dp.dt_bias); cu->ops->free(cu, (void *)dp.neg_A);
    cu->ops->free(cu, (void *)dp.norm);
    cu->ops->free(cu, dqkv); cu->ops->free(cu, dz); cu->ops->free(cu, dbin); cu->ops->free(cu, dain);
    cu->ops->free(cu, dco); cu->ops->free(cu, dout);
    free(hstate[0]); free(hco); free(pool0);
    free(qkv); free(z); free(bin); free(ain); free(conv); free(dtb); free(negA); free(norm);
}

static void test_fill_random(void) {
    static const td_dtype dts[] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F8_E4M3, TD_DTYPE_NVFP4, TD_DTYPE_Q8};
    static const size_t ns[] = {2, 1000, 65536 * 3 + 10, (size_t)256 * 65536 + 4096}; /* the last: more than one grid */
    for (int d = 0; d < 5; d++)
        for (int k = 0; k < 4; k++)
            for (int mode = 0; mode < 2; mode++) {
                size_t n = ns[k], bytes = dts[d] == TD_DTYPE_NVFP4 ? n / 2 : dts[d] == TD_DTYPE_Q8 ? n : n * td_dtype_size(dts[d]);
                float v = mode ? 0.75f : (dts[d] == TD_DTYPE_F8_E4M3 ? 448.0f : dts[d] == TD_DTYPE_NVFP4 ? 6.0f : dts[d] == TD_DTYPE_Q8 ? 127.0f : 0.03f);
                unsigned char *hc = cpu->ops->alloc(cpu, bytes), *hd = malloc(bytes);
                void *dd = cu->ops->alloc(cu, bytes);
                cpu->ops->fill_random(cpu, hc, dts[d], n, 99 + (uint64_t)k, (td_fill_mode)mode, v);
                cu->ops->fill_random(cu, dd, dts[d], n, 99 + (uint64_t)k, (td_fill_mode)mode, v);
                td_bk_download(cu, hd, dd, bytes);
                size_t at = 0;
                while (at < bytes && hc[at] == hd[at]) at++;
                CHECK(at == bytes, "fill_random %s n %zu mode %d: byte %zu differs", td_dtype_name(dts[d]), n, mode, at);
                cu->ops->free(cu, dd);
                cpu->ops->free(cpu, hc);
                free(hd);
            }
}

int main(void) {
    /* TEST_BACKEND_CUDA_STANDIN=guard runs every check with the guard backend in
     * the CUDA backend's place: it checks the test itself on a machine without a
     * GPU (the guard faults on host access to its memory, as a device would). */
    const char *standin = getenv("TEST_BACKEND_CUDA_STANDIN");
    if (!cuda_test_open("backend_cuda", standin)) TEST_MAIN_END("backend_cuda");
    size_t fr = 0, tot = 0;
    if (!standin) {
        CHECK(strcmp(cu->ops->name, "cuda") == 0, "name");
        CHECK(cu->ops->parallel_for == NULL, "no host pool on a device");
        CHECK(td_backend_cuda_mem_info(cu, &fr, &tot) == 0 && tot > 0 && fr <= tot, "mem_info %zu / %zu", fr, tot);
    }
    CHECK(td_backend_cuda_mem_info(cpu, &fr, &tot) != 0, "mem_info refuses a CPU backend");
    cu->batch_invariant = true; /* the exact kernels' bits */
    test_matmul();
    test_rows();
    test_kv();
    test_sample(standin);
    test_sample_greedy(standin);
    test_sample_dist(standin);
    test_fill_random();
    td_config g;
    memset(&g, 0, sizeof g);
    g.n_layers = 2; g.n_full_attn = 1; /* one DeltaNet layer */
    g.n_heads = 4; g.n_kv_heads = 2; g.head_dim = 48; g.attn_output_gate = true; g.rot_dim = 16; g.rms_norm_eps = 1e-6;
    g.lin_nk = 2; g.lin_nv = 4; g.lin_dk = 16; g.lin_dv = 40; g.conv_kernel = 4;
    test_attention(&g);
    test_gdn(&g);
    test_gdn_chunk(&g, standin);
    printf("backend_cuda: on %s (cpu kernels: %s)\n", standin ? standin : "the device", td_isa_name((td_isa)cpu->isa));
    td_backend_free(cu);
    td_backend_free(cpu);
    TEST_MAIN_END("backend_cuda");
}
