/* The element function of the fill_random op (backend.h): a pure function of
 * (seed, element index), shared verbatim by the CPU op and the CUDA kernel
 * (compiled as host and device code), so every backend writes the same bytes.
 * Only integer arithmetic and one float multiply per element (no add to fuse,
 * no library call), so the result cannot depend on FMA contraction, the math
 * library or the compiler.
 *
 *   key     = mix(seed)                          (once per call)
 *   bits(i) = mix(key + (i + 1) * 0x9E3779B97F4A7C15)   (splitmix64's stream)
 *   u(i)    = ((int)(bits >> 40) - 2^23) * (scale * 2^-23)   in [-scale, scale)
 *
 * and the element is u(i) (TD_FILL_UNIFORM) or the constant (TD_FILL_CONST),
 * rounded to the dtype: F32 as is, BF16 round to nearest even, F8_E4M3
 * (e4m3fn) round to nearest even saturating at 448, NVFP4 E2M1 nearest with
 * ties to the even code (element 2j: low nibble of byte j, 2j+1: high), Q8
 * (int8 data) the nearest integer, ties to even, saturating at +-127. */
#ifndef TANDEM_BACKEND_FILL_RANDOM_H
#define TANDEM_BACKEND_FILL_RANDOM_H
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TD_RAND_FN static __host__ __device__ __forceinline__
#else
#define TD_RAND_FN static inline
#endif

TD_RAND_FN uint64_t td_rand_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
TD_RAND_FN uint64_t td_rand_key(uint64_t seed) { return td_rand_mix(seed); }
TD_RAND_FN uint64_t td_rand_bits(uint64_t key, uint64_t i) { return td_rand_mix(key + (i + 1) * 0x9E3779B97F4A7C15ull); }
/* step = scale * 2^-23 (exact unless scale is below 2^-103) */
TD_RAND_FN float td_rand_uniform(uint64_t bits, float step) { return (float)((int32_t)(bits >> 40) - 8388608) * step; }

TD_RAND_FN uint32_t td_rand_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
TD_RAND_FN uint16_t td_rand_bf16(float f) { /* as td_f32_to_bf16 */
    uint32_t u = td_rand_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* m * 2^-sh rounded to the nearest integer, ties to even (sh 1..31) */
TD_RAND_FN uint32_t td_rand_rne_shift(uint32_t m, uint32_t sh) {
    uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    return q + (uint32_t)(rem > half || (rem == half && (q & 1u)));
}
/* e4m3fn: exponent bias 7, 3 mantissa bits, subnormals m * 2^-9, max 448 (0x7e); NaN 0x7f. */
TD_RAND_FN uint8_t td_rand_e4m3(float f) {
    uint32_t u = td_rand_f32_bits(f), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e);           /* >= 448: saturate */
    if (a <= 0x3a800000u) return sign;                             /* <= 2^-10: rounds to 0 (the tie too) */
    if (a < 0x3c800000u) {                                         /* below 2^-6: q = RNE(a * 2^9) */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        return (uint8_t)(sign | td_rand_rne_shift(m, 141u - e));   /* shift 21..24; 8 is 2^-6, the smallest normal */
    }
    uint32_t v = a - (120u << 23);                                 /* rebias 127 -> 7 */
    v += 0x7ffffu + ((v >> 20) & 1u);                              /* round to 3 mantissa bits, nearest even */
    uint32_t c = v >> 20;
    return (uint8_t)(sign | (c > 0x7e ? 0x7e : c));
}
/* E2M1 codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 the sign bit of f: the
 * count of midpoints below |f| (compared as float bits, which order like the
 * values), with a tie going to the even code (0.25 -> 0, 0.75 -> 1.0, ...). */
TD_RAND_FN uint8_t td_rand_e2m1(float f) {
    uint32_t u = td_rand_f32_bits(f), a = u & 0x7fffffffu;
    uint32_t c = (uint32_t)(a > 0x3e800000u) + (uint32_t)(a >= 0x3f400000u) + (uint32_t)(a > 0x3fa00000u) + (uint32_t)(a >= 0x3fe00000u) +
                 (uint32_t)(a > 0x40200000u) + (uint32_t)(a >= 0x40600000u) + (uint32_t)(a > 0x40a00000u);
    return (uint8_t)(((u >> 28) & 8u) | c);
}

/* int8 of Q8 weights: the nearest integer (ties to even), saturating at +-127.
 * |f| + 1.5 * 2^23 - 1.5 * 2^23 is |f| rounded to an integer by the IEEE add
 * itself (round to nearest even, exact below 2^22); two separate float ops, which
 * no compiler may reassociate or fuse without fast-math, and no variable shift,
 * so the CPU loop vectorizes. */
TD_RAND_FN int8_t td_rand_q8(float f) {
    uint32_t u = td_rand_f32_bits(f), ua = u & 0x7fffffffu;
    float a;
    memcpy(&a, &ua, 4);
    a = a < 127.0f ? a : 127.0f; /* saturate first (NaN, never generated, too) */
    int32_t q = (int32_t)((a + 12582912.0f) - 12582912.0f), neg = -(int32_t)(u >> 31); /* 0 or -1 */
    return (int8_t)((q ^ neg) - neg);
}

/* Element i as f32 before rounding to the dtype. */
TD_RAND_FN float td_rand_value(uint64_t key, uint64_t i, int constant, float value) {
    return constant ? value : td_rand_uniform(td_rand_bits(key, i), value * 0x1p-23f);
}

#endif
