/* Shared by the CUDA backend's op tests (test_backend_cuda, test_cuda_fast_ops):
 * the two backends under test, reproducible random data, device copies,
 * bit and tolerance comparisons, and random weights in every dtype. One copy
 * per test binary (static). */
#ifndef TANDEM_TEST_CUDA_UTIL_H
#define TANDEM_TEST_CUDA_UTIL_H
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "util/err.h"

static td_backend *cpu, *cu;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline uint32_t rnd(void) { /* xorshift64*: reproducible test data */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static inline float rndf(void) { return (float)(rnd() >> 8) / (float)(1u << 24) * 2.0f - 1.0f; } /* [-1, 1) */

static inline void *dev_copy(const void *h, size_t n) {
    void *d = cu->ops->alloc(cu, n);
    TD_ASSERT(d);
    td_bk_upload(cu, d, h, n);
    return d;
}
static inline int same_bits(const float *a, const float *b, size_t n, size_t *at) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) { *at = i; return 0; }
    return 1;
}
static inline double max_rel(const float *a, const float *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / (fabs((double)ref[i]) + 1e-6);
        if (!(d <= m)) m = d; /* NaN counts as the worst */
    }
    return m;
}

static inline uint8_t fp8_finite(void) { uint8_t b = (uint8_t)rnd(); return (b & 0x7f) == 0x7f ? b ^ 1 : b; }
static inline uint16_t f16_finite(void) { uint16_t h = (uint16_t)rnd(); return ((h >> 10) & 31) == 31 ? h & 0xbfff : h; }

typedef struct { td_tensor W; void *data, *scales; const char *name; } weight;

static inline weight make_weight(int kind, int64_t N, int64_t K) {
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
        W->scale_block[0] = 1; W->scale_block[1] = 32; W->scales_dtype = TD_DTYPE_BF16;
        size_t ns = n / 32;
        uint16_t *s = malloc(ns * 2); for (size_t i = 0; i < ns; i++) s[i] = td_f32_to_bf16(0.001f * (rndf() + 1.5f)); w.scales = s; } break;
    }
    W->data = w.data;
    W->scales = w.scales;
    return w;
}

static inline double max_abs_norm(const float *a, const float *ref, size_t n) { /* max |a - ref| / max |ref| */
    double d = 0, r = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]);
        if (!(e <= d)) d = e;
        if (fabs(ref[i]) > r) r = fabs(ref[i]);
    }
    return d / r;
}
static inline float *rnd_vec(size_t n, float scale, float bias) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = bias + scale * rndf();
    return v;
}

/* Opens the CUDA backend (or the stand-in TEST_BACKEND_CUDA_STANDIN names) into
 * `cu` and the CPU reference into `cpu`. Without CUDA (a build with CUDA=0, or
 * no device or driver, as on the CI machine) td_backend_create("cuda") must
 * fail with one clear line: that is checked, and 0 is returned (the caller
 * skips its device checks). */
static inline int cuda_test_open(const char *name, const char *standin) {
    td_err err;
    int rc = td_backend_create(standin ? standin : "cuda", 1, &cu, &err);
    if (rc) {
        const char *m = td_err_text(&err);
        int no_build = strstr(m, "this build has no CUDA backend: rebuild with make CUDA=1") != NULL;
        int no_dev = strncmp(m, "no CUDA device: ", 16) == 0;
        CHECK(no_build || no_dev, "unexpected error: %s", err.msg);
        CHECK(!strchr(err.msg, '\n'), "one line");
        CHECK(cu == NULL, "no backend on failure");
        printf("%s: device checks skipped (%s)\n", name, m);
        return 0;
    }
    CHECK(td_backend_create("cpu", 2, &cpu, &err) == 0, "%s", err.msg);
    return 1;
}
#endif
