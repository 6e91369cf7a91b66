#include "backend/cpu/kernels.h"
#include <string.h>
#include "model/tensor.h"

/* Run-time ISA choice: GCC builds one clone per target and picks at load. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
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
