#include "backend/cpu/kernels.h"
#include <math.h>
#include <stdbool.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#include <string.h>
#include "model/tensor.h"
#include "util/err.h"

/* Run-time ISA choice for the portable loops: GCC builds one clone per target
 * and picks at load (no FMA contraction in ISO C mode, so every clone rounds
 * alike). The hand-written AVX2/AVX-512 kernels live in kernels_x86.c. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__) /* ifunc resolvers run before the sanitizers start */
#define TD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TD_CLONES
#endif

#define LANES 16

static inline float reduce16(const float *a) {
    float s8[8], s4[4];
    for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

TD_CLONES float td_dot_f32(const float *x, const float *w, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * w[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += x[i] * w[i];
    return reduce16(acc);
}

TD_CLONES float td_dot_bf16(const float *x, const uint16_t *w, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            uint32_t u = (uint32_t)w[i + j] << 16;
            float f;
            memcpy(&f, &u, 4);
            acc[j] += x[i + j] * f;
        }
    for (int j = 0; i < n; i++, j++) acc[j] += x[i] * td_bf16_to_f32(w[i]);
    return reduce16(acc);
}

float td_dot_f16(const float *x, const uint16_t *w, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * td_f16_to_f32(w[i + j]);
    for (int j = 0; i < n; i++, j++) acc[j] += x[i] * td_f16_to_f32(w[i]);
    return reduce16(acc);
}

/* ---- FP8 / NVFP4 element decoding ---- */

float td_fp8_e4m3_to_f32(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return s ? -v : v;
}

static const float e2m1_vals[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static float scale_at(const td_tensor *W, int64_t idx) {
    switch (W->scales_dtype) {
    case TD_DTYPE_F32: return ((const float *)W->scales)[idx];
    case TD_DTYPE_BF16: return td_bf16_to_f32(((const uint16_t *)W->scales)[idx]);
    case TD_DTYPE_F16: return td_f16_to_f32(((const uint16_t *)W->scales)[idx]);
    case TD_DTYPE_F8_E4M3: return td_fp8_e4m3_to_f32(((const uint8_t *)W->scales)[idx]);
    default: return NAN;
    }
}

bool td_matmul_supported(const td_tensor *W, const char **why) {
    const char *w = NULL;
    int64_t K = W->ndim == 2 ? W->shape[1] : 0;
    if (W->ndim != 2) w = "weight is not 2-D";
    else switch (W->dtype) {
    case TD_DTYPE_F32: case TD_DTYPE_BF16: case TD_DTYPE_F16: break;
    case TD_DTYPE_F8_E4M3:
        if (W->scales) {
            if (W->scale_block[0] < 1 || W->scale_block[1] < 16 || W->scale_block[1] % 16) w = "fp8 block scales need a column block that is a multiple of 16";
            else if (W->scales_dtype != TD_DTYPE_F32 && W->scales_dtype != TD_DTYPE_BF16 && W->scales_dtype != TD_DTYPE_F16) w = "fp8 block scales must be F32, BF16 or F16";
        }
        break;
    case TD_DTYPE_Q8:
        if (K % 32) w = "q8 needs in_features divisible by 32";
        else if (!W->scales || W->scales_dtype != TD_DTYPE_BF16) w = "q8 needs BF16 block scales";
        break;
    case TD_DTYPE_NVFP4:
        if (K % 16) w = "nvfp4 needs in_features divisible by 16";
        else if (!W->scales || W->scales_dtype != TD_DTYPE_F8_E4M3) w = "nvfp4 needs fp8 e4m3 block scales";
        break;
    default: w = "unsupported weight dtype";
    }
    if (why) *why = w;
    return w == NULL;
}

/* Portable path: one element at a time, same 16-lane order, multiply then add. */
static float dot_quant_c(const td_tensor *W, const float *x, int64_t n) {
    int64_t K = W->shape[1];
    float acc[LANES] = {0};
    if (W->dtype == TD_DTYPE_Q8) {
        const int8_t *w = (const int8_t *)W->data + n * K;
        const uint16_t *s = (const uint16_t *)W->scales + n * (K / 32);
        for (int64_t i = 0; i < K; i++) acc[i % LANES] += x[i] * ((float)w[i] * td_bf16_to_f32(s[i / 32]));
        return reduce16(acc);
    }
    if (W->dtype == TD_DTYPE_F8_E4M3) {
        const uint8_t *w = (const uint8_t *)W->data + n * K;
        if (!W->scales) {
            for (int64_t i = 0; i < K; i++) acc[i % LANES] += x[i] * td_fp8_e4m3_to_f32(w[i]);
            return reduce16(acc) * W->scale_f;
        }
        int64_t bn = W->scale_block[0], bk = W->scale_block[1], sc = (K + bk - 1) / bk;
        for (int64_t i = 0; i < K; i++) {
            float s = scale_at(W, (n / bn) * sc + i / bk);
            acc[i % LANES] += x[i] * (td_fp8_e4m3_to_f32(w[i]) * s);
        }
        return reduce16(acc);
    }
    /* NVFP4: block value e2m1 * fp8 scale is exact in f32; global multiplier at the end. */
    const uint8_t *w = (const uint8_t *)W->data + n * (K / 2);
    const uint8_t *s = (const uint8_t *)W->scales + n * (K / 16);
    for (int64_t i = 0; i < K; i++) {
        uint8_t nib = (w[i / 2] >> ((i & 1) * 4)) & 0xf;
        acc[i % LANES] += x[i] * (e2m1_vals[nib] * td_fp8_e4m3_to_f32(s[i / 16]));
    }
    return reduce16(acc) * W->scale_f;
}

static void mm_c(const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    int64_t K = W->shape[1];
    for (int64_t n = n0; n < n1; n++)
        for (int m = m0; m < m1; m++) {
            const float *xm = x + (int64_t)m * K;
            float v;
            switch (W->dtype) {
            case TD_DTYPE_F32: v = td_dot_f32(xm, (const float *)W->data + n * K, K); break;
            case TD_DTYPE_BF16: v = td_dot_bf16(xm, (const uint16_t *)W->data + n * K, K); break;
            case TD_DTYPE_F16: v = td_dot_f16(xm, (const uint16_t *)W->data + n * K, K); break;
            default: v = dot_quant_c(W, xm, n);
            }
            y[(int64_t)m * ldy + n] = v;
        }
}

/* ---- dispatch ---- */

const char *td_isa_name(td_isa i) {
    switch (i) {
    case TD_ISA_C: return "c";
    case TD_ISA_AVX2: return "avx2";
    case TD_ISA_AVX512: return "avx512";
    default: return "auto";
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 15 has no "f16c" for
 * __builtin_cpu_supports, and the fuzz build (tests/fuzz) uses clang. */
static bool cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

td_isa td_kernels_best_isa(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("fma") && cpu_has_f16c())
        return TD_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) return TD_ISA_AVX2;
#endif
    return TD_ISA_C;
}

bool td_kernels_have_isa(td_isa i) { return i == TD_ISA_AUTO || (i >= TD_ISA_C && i <= td_kernels_best_isa()); }

const char *td_tune_name(td_tune t) { return t == TD_TUNE_AMD ? "amd" : "default"; }

td_tune td_kernels_best_tune(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    /* vendor "AuthenticAMD" in EBX, EDX, ECX of leaf 0; family 0x1a (Zen 5) or later in leaf 1: the AMD
       tuning was measured on Zen 5 only (Zen 3 and 4, family 0x19, keep the default, measured there before) */
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u && __get_cpuid(1, &a, &b, &c, &d)) {
        const unsigned base = (a >> 8) & 0xf, family = base == 0xf ? base + ((a >> 20) & 0xff) : base;
        if (family >= 0x1a) return TD_TUNE_AMD;
    }
#endif
    return TD_TUNE_DEFAULT;
}

void td_matmul_block(td_isa isa, td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y,
                     int64_t ldy) {
    (void)tune; /* the C kernel has one shape */
    TD_ASSERT(!(W->dtype == TD_DTYPE_Q8 && W->q8_grouped) && "matmul: grouped q8 weights take int8 activations");
    switch (isa) {
#if defined(__x86_64__) && defined(__GNUC__)
    case TD_ISA_AVX512: td_mm_avx512(tune, W, x, m0, m1, n0, n1, y, ldy); return;
    case TD_ISA_AVX2: td_mm_avx2(tune, W, x, m0, m1, n0, n1, y, ldy); return;
#endif
    default: mm_c(W, x, m0, m1, n0, n1, y, ldy);
    }
}

/* ---- vector helpers for attention and DeltaNet (model/forward.c) ----
 * Element-wise loops over contiguous rows (vectorized by the clones without
 * changing any element's arithmetic) and the dot product's fixed 16-lane order. */

TD_CLONES void td_vec_axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* One token of the gated delta rule for one head; S [dk, dv] row-major:
 *   S = decay*S ; mem = S^T k ; d = beta (v - mem) ; S += k d^T ; o = S^T q
 * Two passes over S instead of four, each element still computed in the
 * reference order: row i is decayed before it enters mem, and updated before
 * it enters o; mem and o accumulate over i in increasing order. */
TD_CLONES void td_gdn_step(float *restrict S, int dk, int dv, const float *restrict k, const float *restrict v,
                           const float *restrict q, float beta, float decay, float *restrict mem, float *restrict o) {
    for (int e = 0; e < dv; e++) mem[e] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float *restrict Si = S + (size_t)i * dv;
        float ki = k[i];
        for (int e = 0; e < dv; e++) {
            Si[e] *= decay;
            mem[e] += Si[e] * ki;
        }
    }
    for (int e = 0; e < dv; e++) mem[e] = (v[e] - mem[e]) * beta;
    for (int e = 0; e < dv; e++) o[e] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float *restrict Si = S + (size_t)i * dv;
        float ki = k[i], qi = q[i];
        for (int e = 0; e < dv; e++) {
            Si[e] += ki * mem[e];
            o[e] += Si[e] * qi;
        }
    }
}

/* C tokens of the gated delta rule for one head at once (the chunked form used
 * for prefill). With cumulative log-decay c_t = sum_{i<=t} log g_i:
 *   d_t = b_t (v_t - e^{c_t} S0^T k_t - sum_{i<t} e^{c_t - c_i} (k_i.k_t) d_i)   (forward substitution)
 *   o_t = e^{c_t} S0^T q_t + sum_{i<=t} e^{c_t - c_i} (k_i.q_t) d_i
 *   S   = e^{c_C} S0 + sum_i e^{c_C - c_i} k_i d_i^T
 * which is the recurrence of td_gdn_step unrolled; the sums run in another
 * order, so results agree with it to rounding, not bit for bit. Decay ratios
 * are formed from log differences (no overflow for long chunks).
 * scratch: 3*C*dv + C floats. */
TD_CLONES void td_gdn_chunk(float *restrict S, int dk, int dv, int C, const float *restrict K, const float *restrict V,
                            const float *restrict Q, const float *restrict beta, const float *restrict logdecay,
                            float *restrict scratch, float *restrict O) {
    float *U = scratch, *D = U + (size_t)C * dv, *QS = D + (size_t)C * dv, *cum = QS + (size_t)C * dv;
    float c = 0.0f;
    for (int t = 0; t < C; t++) cum[t] = (c += logdecay[t]);
    /* U = K S0, QS = Q S0 (rows of S0 walked once per token: S0 stays in cache) */
    for (int t = 0; t < C; t++) {
        float *u = U + (size_t)t * dv, *qs = QS + (size_t)t * dv;
        for (int e = 0; e < dv; e++) u[e] = qs[e] = 0.0f;
        for (int i = 0; i < dk; i++) {
            const float *Si = S + (size_t)i * dv;
            float kt = K[(size_t)t * dk + i], qt = Q[(size_t)t * dk + i];
            for (int e = 0; e < dv; e++) {
                u[e] += Si[e] * kt;
                qs[e] += Si[e] * qt;
            }
        }
    }
    for (int t = 0; t < C; t++) {
        const float *kt = K + (size_t)t * dk, *qt = Q + (size_t)t * dk;
        float *d = D + (size_t)t * dv, *o = O + (size_t)t * dv;
        float gt = expf(cum[t]);
        for (int e = 0; e < dv; e++) {
            d[e] = V[(size_t)t * dv + e] - gt * U[(size_t)t * dv + e];
            o[e] = gt * QS[(size_t)t * dv + e];
        }
        for (int i = 0; i < t; i++) {
            const float *ki = K + (size_t)i * dk, *di = D + (size_t)i * dv;
            float kk = 0.0f;
            for (int a = 0; a < dk; a++) kk += ki[a] * kt[a];
            float w = expf(cum[t] - cum[i]) * kk;
            for (int e = 0; e < dv; e++) d[e] -= w * di[e];
        }
        for (int e = 0; e < dv; e++) d[e] *= beta[t];
        for (int i = 0; i <= t; i++) {
            const float *ki = K + (size_t)i * dk, *di = D + (size_t)i * dv;
            float kq = 0.0f;
            for (int a = 0; a < dk; a++) kq += ki[a] * qt[a];
            float w = expf(cum[t] - cum[i]) * kq;
            for (int e = 0; e < dv; e++) o[e] += w * di[e];
        }
    }
    float gC = expf(cum[C - 1]);
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv;
        for (int e = 0; e < dv; e++) Si[e] *= gC;
        for (int t = 0; t < C; t++) {
            float w = expf(cum[C - 1] - cum[t]) * K[(size_t)t * dk + i];
            const float *dt = D + (size_t)t * dv;
            for (int e = 0; e < dv; e++) Si[e] += w * dt[e];
        }
    }
}
