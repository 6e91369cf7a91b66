#include "model/tensor.h"
#include <math.h>
#include <string.h>
#include "util/err.h"

static const char *const dtype_names[TD_DTYPE_COUNT] = {
    "F32", "BF16", "F16", "F8_E4M3", "NVFP4", "I32", "I64", "U8", "Q8",
};
static const size_t dtype_sizes[TD_DTYPE_COUNT] = {4, 2, 2, 1, 0, 4, 8, 1, 1};

const char *td_dtype_name(td_dtype t) { return (unsigned)t < TD_DTYPE_COUNT ? dtype_names[t] : "?"; }
size_t td_dtype_size(td_dtype t) { return (unsigned)t < TD_DTYPE_COUNT ? dtype_sizes[t] : 0; }

float td_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) f = ldexpf((float)man, -24);
    else if (exp == 31) f = man ? NAN : INFINITY;
    else f = ldexpf((float)(man | 0x400), (int)exp - 25);
    union { float f; uint32_t u; } v = { f };
    v.u |= sign;
    return v.f;
}

float td_tensor_get_f32(const td_tensor *t, int64_t i) {
    switch (t->dtype) {
    case TD_DTYPE_F32: return ((const float *)t->data)[i];
    case TD_DTYPE_BF16: return td_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case TD_DTYPE_F16: return td_f16_to_f32(((const uint16_t *)t->data)[i]);
    default: TD_ASSERT(!"td_tensor_get_f32 on a non-float tensor");
    }
    return 0;
}

void td_tensor_row_f32(const td_tensor *t, int64_t row, float *out) {
    int64_t n = t->shape[t->ndim - 1], base = row * n;
    switch (t->dtype) {
    case TD_DTYPE_F32: memcpy(out, (const float *)t->data + base, (size_t)n * sizeof(float)); break;
    case TD_DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)t->data + base;
        for (int64_t i = 0; i < n; i++) out[i] = td_bf16_to_f32(p[i]);
        break;
    }
    case TD_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)t->data + base;
        for (int64_t i = 0; i < n; i++) out[i] = td_f16_to_f32(p[i]);
        break;
    }
    default: TD_ASSERT(!"td_tensor_row_f32 on a non-float tensor");
    }
}
