/* Random-weight models generated in backend memory (model/random_model.h):
 *  - fill_random of every dtype equals a plain C reference of its hash
 *    (written here from the definition in backend/fill_random.h, with
 *    brute-force nearest-value rounding for fp8 / e2m1), Q8 included, at several offsets
 *    of a fill that spans many of the CPU's tasks, on the CPU and the guard;
 *    a CUDA run can be checked against the same reference (TANDEM_BACKEND);
 *  - the generated model gives bit-identical logits on the CPU and the guard
 *    (BF16, FP8, NVFP4, Q8), and generation is a pure function of the seed;
 *  - the MTP head of the --mtp MIX construction: MIX 0 drafts are accepted
 *    100% (greedy, depth 1), MIX 5 partly (on this small config the trunk's
 *    writes are small against the rms-1 embedding: MIX 0.05 to 1 still gives
 *    31-32 of 32; 5 gives 25 of 38); greedy output at depth 0 equals depth
 *    1..4 (lossless);
 *  - td_config_scale reproduces make_random_model.py's widths, and absurd or
 *    bad specs are clear errors, not crashes or huge allocations.
 * Small config: the 27B config scaled to hidden 256, 4 layers, vocab 4096. */
#include <math.h>
#include "check.h"
#include "backend/fill_random.h"
#include "engine/engine.h"
#include "model/random_model.h"
#include "model/tensor.h"

#define CONFIG "tests/data/configs/qwen3.6-27b.config.json"

/* ---- the reference, from the definition ---- */
static uint64_t ref_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double ref_value(uint64_t seed, uint64_t i, int constant, float v) {
    if (constant) return v;
    uint64_t h = ref_mix(ref_mix(seed) + (i + 1) * 0x9E3779B97F4A7C15ull);
    double s = ((double)(h >> 40) - 8388608.0) / 8388608.0; /* [-1, 1) */
    return (double)(float)(s * (double)v); /* the op's one f32 rounding of the product (exact in double) */
}
static double e4m3_val(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? m * ldexp(1, -9) : (1 + m / 8.0) * ldexp(1, e - 7);
    return (c & 0x80) ? -v : v;
}
static const double e2m1_tab[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
/* nearest of the positive codes 0..max_code of a table, ties to the even code */
static int nearest(double a, int max_code, double (*val)(int)) {
    int best = 0;
    for (int c = 1; c <= max_code; c++) {
        double d = fabs(val(c) - a), db = fabs(val(best) - a);
        if (d < db || (d == db && !(c & 1) && (best & 1))) best = c;
    }
    return best;
}
static double e2m1_val(int c) { return e2m1_tab[c & 7]; }
static uint8_t ref_e4m3(double v) { /* saturating at 448 = code 0x7e */
    uint8_t sign = signbit(v) ? 0x80 : 0;
    return (uint8_t)(sign | nearest(fabs(v), 0x7e, e4m3_val));
}
static uint8_t ref_e2m1(double v) { return (uint8_t)((signbit(v) ? 8 : 0) | nearest(fabs(v), 7, e2m1_val)); }
static int8_t ref_q8(double v) { double q = nearbyint(v); return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q); }
static uint16_t ref_bf16(double v) { /* nearest of the two bf16 neighbours, ties to even */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    float fl, fh;
    uint32_t ul = (uint32_t)lo << 16, uh = (uint32_t)hi << 16;
    memcpy(&fl, &ul, 4);
    memcpy(&fh, &uh, 4);
    double dl = fabs((double)fl - v), dh = fabs((double)fh - v);
    return dl < dh || (dl == dh && !(lo & 1)) ? lo : hi;
}

#define NFILL 300000 /* elements: several 65536-element tasks of the CPU op */

static void check_fill(td_backend *b, td_dtype dt, td_fill_mode mode, float value, uint64_t seed) {
    size_t bytes = dt == TD_DTYPE_NVFP4 ? NFILL / 2 : dt == TD_DTYPE_Q8 ? NFILL : NFILL * td_dtype_size(dt);
    void *d = b->ops->alloc(b, bytes);
    unsigned char *h = malloc(bytes);
    b->ops->fill_random(b, d, dt, NFILL, seed, mode, value);
    td_bk_download(b, h, d, bytes);
    static const size_t offs[] = {0, 65536 - 700, 131072 + 3, NFILL - 2000};
    int bad = 0, checked = 0;
    double maxabs = 0, sum = 0;
    for (size_t o = 0; o < sizeof offs / sizeof *offs; o++)
        for (size_t i = offs[o]; i < offs[o] + 2000; i++) {
            double v = ref_value(seed, i, mode == TD_FILL_CONST, value);
            bool ok;
            if (dt == TD_DTYPE_F32) { float f; memcpy(&f, h + 4 * i, 4); ok = (double)f == v; maxabs = fmax(maxabs, fabs(f)); sum += f; }
            else if (dt == TD_DTYPE_BF16) { uint16_t x; memcpy(&x, h + 2 * i, 2); ok = x == ref_bf16(v); }
            else if (dt == TD_DTYPE_F8_E4M3) ok = h[i] == ref_e4m3(v);
            else if (dt == TD_DTYPE_Q8) ok = (int8_t)h[i] == ref_q8(v);
            else ok = ((h[i / 2] >> ((i & 1) * 4)) & 15) == ref_e2m1(v);
            if (!ok && bad++ < 3) fprintf(stderr, "  %s element %zu (value %.9g)\n", td_dtype_name(dt), i, v);
            checked++;
        }
    CHECK(bad == 0, "%s on %s, %s %g: %d of %d elements differ from the reference", td_dtype_name(dt), b->ops->name,
          mode == TD_FILL_CONST ? "const" : "uniform", (double)value, bad, checked);
    if (dt == TD_DTYPE_F32 && mode == TD_FILL_UNIFORM) { /* the values do spread over [-v, v) */
        CHECK(maxabs <= value && maxabs > 0.99 * value && fabs(sum / checked) < 0.05 * value, "uniform f32: max %g, mean %g", maxabs,
              sum / checked);
    }
    b->ops->free(b, d);
    free(h);
}

static void test_fill(const char *backend) {
    td_err err = {0};
    td_backend *b;
    if (td_backend_create(backend, 2, &b, &err)) { CHECK(0, "%s: %s", backend, err.msg); return; }
    td_dtype dts[] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F8_E4M3, TD_DTYPE_NVFP4, TD_DTYPE_Q8};
    float scales[] = {0.03f, 448.0f, 6.0f, 1.7320508f, 127.0f};
    float consts[] = {0.03f / 448.0f, 1.0f, 2.5f, 0.75f, 0.25f, -1.25f}; /* ties of e2m1 and q8 rounding among them */
    for (int d = 0; d < 5; d++) {
        for (int s = 0; s < 5; s++) check_fill(b, dts[d], TD_FILL_UNIFORM, scales[s], 7 + (uint64_t)s);
        for (int s = 0; s < 6; s++) check_fill(b, dts[d], TD_FILL_CONST, consts[s], 3);
    }
    /* the seed matters: two seeds, different bytes */
    uint16_t *x = b->ops->alloc(b, 2 * 4096), *y = b->ops->alloc(b, 2 * 4096);
    b->ops->fill_random(b, x, TD_DTYPE_BF16, 4096, 1, TD_FILL_UNIFORM, 1.0f);
    b->ops->fill_random(b, y, TD_DTYPE_BF16, 4096, 2, TD_FILL_UNIFORM, 1.0f);
    uint16_t hx[4096], hy[4096];
    td_bk_download(b, hx, x, sizeof hx);
    td_bk_download(b, hy, y, sizeof hy);
    int same = 0;
    for (int i = 0; i < 4096; i++) same += hx[i] == hy[i];
    CHECK(same < 100, "seeds 1 and 2 agree on %d of 4096 elements", same);
    b->ops->free(b, x);
    b->ops->free(b, y);
    td_backend_free(b);
}

/* ---- the generated model ---- */

static td_engine *load(const char *backend, td_dtype dt, float mix, uint64_t seed, int depth) {
    td_err err = {0};
    td_engine_opts o = {.n_threads = 2, .spec_depth = depth, .max_context = 512, .backend = backend, .max_seqs = 1};
    td_random_spec rs = {.dtype = dt, .seed = seed, .mtp_mix = mix, .hidden = 256, .layers = 4, .vocab = 4096};
    td_engine *e = NULL;
    int rc = td_engine_load_random(CONFIG, &rs, &o, &e, &err);
    CHECK(rc == 0, "random model on %s: %s", backend, err.msg);
    return e;
}

static const int32_t prompt[] = {1, 17, 230, 9, 4021, 77, 13, 600, 5, 88, 1200, 41, 7, 3000, 2, 19, 512, 64, 999, 3333, 4095, 0, 12, 2048};
#define NP ((int)(sizeof prompt / sizeof *prompt))

/* logits after the prompt and after two more tokens: [2][V] */
static float *logits_of(td_engine *e) {
    td_err err = {0};
    td_session *s;
    int V = td_engine_cfg(e)->vocab_size;
    float *out = calloc(2 * (size_t)V, sizeof(float));
    if (td_session_new(e, &s, &err)) { CHECK(0, "%s", err.msg); return out; }
    const float *lg;
    CHECK(td_session_feed(s, prompt, NP, &lg, &err) == 0, "%s", err.msg);
    memcpy(out, lg, (size_t)V * sizeof(float));
    CHECK(td_session_feed(s, prompt + 3, 2, &lg, &err) == 0, "%s", err.msg);
    memcpy(out + V, lg, (size_t)V * sizeof(float));
    td_session_free(s);
    return out;
}

static void test_cpu_guard(td_dtype dt) {
    td_engine *c = load("cpu", dt, 0.05f, 11, 1), *g = load("guard", dt, 0.05f, 11, 1), *c2 = load("cpu", dt, 0.05f, 12, 1);
    if (!c || !g || !c2) { td_engine_free(c); td_engine_free(g); td_engine_free(c2); return; }
    int V = td_engine_cfg(c)->vocab_size;
    float *a = logits_of(c), *b = logits_of(g), *z = logits_of(c2);
    CHECK(memcmp(a, b, 2 * (size_t)V * sizeof(float)) == 0, "%s: cpu and guard logits differ", td_dtype_name(dt));
    bool finite = true, spread = false;
    for (int i = 0; i < 2 * V; i++) { finite &= isfinite(a[i]); spread |= a[i] != a[0]; }
    CHECK(finite && spread, "%s: logits finite and not constant", td_dtype_name(dt));
    CHECK(memcmp(a, z, 2 * (size_t)V * sizeof(float)) != 0, "%s: seeds 11 and 12 give the same logits", td_dtype_name(dt));
    const td_model *m = td_engine_model(c);
    CHECK(m->dev == td_engine_backend(c) && m->has_mtp && m->layers[0].gate_proj.dtype == dt, "%s: generated in the backend, dtype %s",
          td_dtype_name(dt), td_dtype_name(m->layers[0].gate_proj.dtype));
    free(a); free(b); free(z);
    td_engine_free(c); td_engine_free(g); td_engine_free(c2);
}

/* --precision int8 on a random Q8 model: the weights are drawn as for the f32 path, then stored in the
   int8 kernels' grouped order, so the two paths run the same model. The byte-for-byte check below is
   what pins the permutation: on this small model the layers move the logits little, and unpermuted
   weights still gave logits within 2.8e-3 (correlation 0.999996). The logits agree to the int8
   activations' rounding, cpu and guard give the same bits, and a BF16 spec is refused (int8
   multiplies q8 weights only). */
static void test_int8(void) {
    td_err err = {0};
    td_engine *e[3] = {0};
    const char *bk[3] = {"cpu", "cpu", "guard"};
    const td_precision pr[3] = {TD_PRECISION_F32, TD_PRECISION_INT8, TD_PRECISION_INT8};
    for (int i = 0; i < 3; i++) {
        td_engine_opts o = {.n_threads = 2, .spec_depth = 1, .max_context = 512, .backend = bk[i], .max_seqs = 1, .precision = pr[i]};
        td_random_spec rs = {.dtype = TD_DTYPE_Q8, .seed = 11, .mtp_mix = 0.05f, .hidden = 256, .layers = 4, .vocab = 4096};
        CHECK(td_engine_load_random(CONFIG, &rs, &o, &e[i], &err) == 0, "random q8, precision %d on %s: %s", (int)pr[i], bk[i], err.msg);
    }
    if (e[0] && e[1] && e[2]) {
        int V = td_engine_cfg(e[0])->vocab_size;
        float *f = logits_of(e[0]), *q = logits_of(e[1]), *g = logits_of(e[2]);
        CHECK(memcmp(q, g, 2 * (size_t)V * sizeof(float)) == 0, "int8: cpu and guard logits differ");
        double big = 0, diff = 0, sf = 0, sq = 0, sfq = 0;
        for (int i = 0; i < 2 * V; i++) {
            big = fmax(big, fabs(f[i]));
            diff = fmax(diff, fabs((double)f[i] - q[i]));
            sf += (double)f[i] * f[i], sq += (double)q[i] * q[i], sfq += (double)f[i] * q[i];
        }
        const double rel = diff / big, corr = sfq / sqrt(sf * sq);
        printf("random q8: int8 vs f32 activations, largest logit difference %.3g of the largest logit, correlation %.6f\n", rel, corr);
        CHECK(rel < 0.05 && corr > 0.999, "int8 vs f32 on the same random q8 model: %.3g of the largest logit apart, correlation %.6f", rel,
              corr);
        /* byte for byte: each grouped row is the f32 model's row in td_q8g_offset's order */
        const td_model *mf = td_engine_model(e[0]), *mq = td_engine_model(e[1]);
        const td_tensor *tf[3] = {&mf->layers[0].gate_proj, &mf->layers[3].down_proj, &mf->mtp.layer.up_proj};
        const td_tensor *tq[3] = {&mq->layers[0].gate_proj, &mq->layers[3].down_proj, &mq->mtp.layer.up_proj};
        for (int i = 0; i < 3; i++) {
            CHECK(tq[i]->dtype == TD_DTYPE_Q8 && tq[i]->q8_grouped && !tf[i]->q8_grouped, "int8: tensor %d's q8 weights grouped (and only there)", i);
            const int64_t N = tq[i]->shape[0], K = tq[i]->shape[1];
            int8_t *a = malloc((size_t)(N * K)), *b = malloc((size_t)(N * K));
            td_backend *bf = td_engine_backend(e[0]), *bq = td_engine_backend(e[1]);
            bf->ops->download(bf, a, tf[i]->data, (size_t)(N * K));
            bq->ops->download(bq, b, tq[i]->data, (size_t)(N * K));
            int64_t bad = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) bad += b[n * K + td_q8g_offset(k, K)] != a[n * K + k];
            CHECK(bad == 0 && tq[i]->shape[0] == tf[i]->shape[0] && tq[i]->shape[1] == tf[i]->shape[1],
                  "int8: tensor %d [%lld x %lld]: %lld bytes not where td_q8g_offset puts them", i, (long long)N, (long long)K, (long long)bad);
            free(a); free(b);
        }
        free(f); free(q); free(g);
    }
    for (int i = 0; i < 3; i++) td_engine_free(e[i]);
    td_engine_opts o = {.n_threads = 1, .precision = TD_PRECISION_INT8};
    td_random_spec rs = {.dtype = TD_DTYPE_BF16, .seed = 1, .mtp_mix = -1, .hidden = 256, .layers = 4, .vocab = 4096};
    td_engine *x = NULL;
    CHECK(td_engine_load_random(CONFIG, &rs, &o, &x, &err) == TD_ERR_ARG && x == NULL, "precision int8 with a BF16 random model accepted");
}

#define NGEN 64
typedef struct { int32_t t[NGEN + 8]; int n; } toks;
static int keep(void *u, int32_t t) {
    toks *k = u;
    if (k->n < NGEN + 8) k->t[k->n++] = t;
    return 0;
}

static td_spec_counters greedy(td_engine *e, int depth, toks *out) {
    td_err err = {0};
    td_session *s;
    td_gen_result res = {0};
    out->n = 0;
    if (td_session_new(e, &s, &err)) { CHECK(0, "%s", err.msg); return res.spec; }
    td_sampling sp;
    td_sampling_default(&sp);
    sp.temperature = 0;
    td_gen_opts go = {.max_tokens = NGEN, .spec_depth = depth, .ignore_eos = true};
    CHECK(td_session_generate(s, prompt, NP, &sp, &go, keep, out, &res, &err) == 0, "%s", err.msg);
    td_session_free(s);
    return res.spec;
}

#define MIX_PARTIAL 5.0f

static void test_mtp(void) {
    toks t0, tk;
    td_engine *e = load(NULL, TD_DTYPE_BF16, 0.0f, 5, 4);
    if (e) {
        td_spec_counters c = greedy(e, 1, &tk);
        CHECK(c.draft_tokens > 20 && c.accepted_tokens == c.draft_tokens, "MIX 0: %llu of %llu drafts accepted (want all)",
              (unsigned long long)c.accepted_tokens, (unsigned long long)c.draft_tokens);
        printf("MIX 0: depth-1 acceptance %llu / %llu\n", (unsigned long long)c.accepted_tokens, (unsigned long long)c.draft_tokens);
        td_engine_free(e);
    }
    e = load(NULL, TD_DTYPE_BF16, MIX_PARTIAL, 5, 4);
    if (!e) return;
    greedy(e, 0, &t0);
    CHECK(t0.n == NGEN, "depth 0: %d tokens", t0.n);
    int distinct = 0;
    for (int i = 0; i < t0.n; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= t0.t[j] == t0.t[i];
        distinct += !seen;
    }
    CHECK(distinct > 4, "MIX 5: %d distinct tokens in %d (a degenerate model)", distinct, t0.n);
    for (int d = 1; d <= 4; d++) {
        td_spec_counters c = greedy(e, d, &tk);
        CHECK(tk.n == t0.n && memcmp(tk.t, t0.t, sizeof(int32_t) * (size_t)t0.n) == 0, "MIX 5: depth %d output differs from depth 0", d);
        if (d == 1) {
            CHECK(c.accepted_tokens > 0 && c.accepted_tokens < c.draft_tokens, "MIX 5: %llu of %llu accepted (want partly)",
                  (unsigned long long)c.accepted_tokens, (unsigned long long)c.draft_tokens);
            printf("MIX 5: depth-1 acceptance %llu / %llu\n", (unsigned long long)c.accepted_tokens, (unsigned long long)c.draft_tokens);
        }
    }
    td_engine_free(e);
}

/* ---- config scaling and errors ---- */

static void test_config(void) {
    td_err err = {0};
    td_config c;
    CHECK(td_config_load(CONFIG, &c, &err) == 0, "%s", err.msg);
    td_config s = c;
    /* make_random_model.py's defaults: hidden 2048, intermediate 6912, heads 10/2, linear heads 6/18 */
    CHECK(td_config_scale(&s, 2048, 12, 16384, &err) == 0, "%s", err.msg);
    CHECK(s.hidden_size == 2048 && s.intermediate_size == 6912 && s.n_heads == 10 && s.n_kv_heads == 2 && s.lin_nk == 6 && s.lin_nv == 18 &&
              s.n_layers == 12 && s.n_full_attn == 3 && s.vocab_size == 16384 && s.head_dim == c.head_dim,
          "scaled: hidden %d, I %d, heads %d/%d, linear %d/%d, layers %d (%d full), vocab %d", s.hidden_size, s.intermediate_size, s.n_heads,
          s.n_kv_heads, s.lin_nk, s.lin_nv, s.n_layers, s.n_full_attn, s.vocab_size);
    for (int i = 0; i < s.n_eos; i++) CHECK(s.eos_token_ids[i] < 16384, "eos %d outside the vocabulary", s.eos_token_ids[i]);
    s = c;
    CHECK(td_config_scale(&s, 100, 0, 0, &err) == TD_ERR_ARG, "hidden 100 (not a multiple of 16) accepted");
    /* the full config: 27B parameters, about 50 GiB of BF16 */
    td_random_spec rs = {.dtype = TD_DTYPE_BF16, .seed = 1, .mtp_mix = 0.05f};
    uint64_t bytes = 0;
    CHECK(td_random_model_bytes(&c, &rs, &bytes, &err) == 0, "%s", err.msg);
    CHECK(bytes > 50e9 && bytes < 60e9, "27B BF16 weights: %.2f GB", bytes / 1e9);
    rs.dtype = TD_DTYPE_NVFP4;
    uint64_t b4 = 0;
    CHECK(td_random_model_bytes(&c, &rs, &b4, &err) == 0 && b4 < bytes / 2, "27B NVFP4 weights: %.2f GB", b4 / 1e9);
    /* absurd: every width at its bound; refused before any allocation */
    td_config big = c;
    big.hidden_size = 1 << 16;
    big.intermediate_size = 1 << 20;
    big.vocab_size = 1 << 22;
    rs.dtype = TD_DTYPE_F32;
    td_backend *b;
    CHECK(td_backend_cpu_create(1, &b, &err) == 0, "%s", err.msg);
    td_model *m = NULL;
    int rc = td_model_random(&big, &rs, b, &m, &err);
    CHECK(rc == TD_ERR_NOMEM && m == NULL && strstr(err.msg, "GiB"), "absurd config: rc %d, %s", rc, err.msg);
    rs.mtp_mix = 200.0f;
    CHECK(td_model_random(&c, &rs, b, &m, &err) == TD_ERR_ARG && m == NULL, "mtp_mix 200 accepted");
    rs.mtp_mix = -1.0f;
    rs.dtype = TD_DTYPE_F16;
    CHECK(td_model_random(&c, &rs, b, &m, &err) == TD_ERR_ARG && m == NULL, "dtype F16 accepted");
    td_backend_free(b);
    td_engine_opts o = {.n_threads = 1, .quantize = 1};
    td_engine *e = NULL;
    rs.dtype = TD_DTYPE_BF16;
    CHECK(td_engine_load_random(CONFIG, &rs, &o, &e, &err) == TD_ERR_ARG && e == NULL, "quantize with a random model accepted");
    CHECK(td_engine_load_random("tests/data/configs/no-such.json", &rs, NULL, &e, &err) != 0 && e == NULL, "a missing config accepted");
}

int main(void) {
    test_fill("cpu");
    test_fill("guard");
    const char *env = getenv("TANDEM_BACKEND");
    if (env && strcmp(env, "cpu") && strcmp(env, "guard")) test_fill(env); /* e.g. cuda, against the same reference */
    test_config();
    test_cpu_guard(TD_DTYPE_BF16);
    test_cpu_guard(TD_DTYPE_F8_E4M3);
    test_cpu_guard(TD_DTYPE_NVFP4);
    test_cpu_guard(TD_DTYPE_Q8);
    test_int8();
    test_mtp();
    TEST_MAIN_END("test_random_model");
}
