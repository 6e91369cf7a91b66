/* Weight tensor view. Data is borrowed from a memory-mapped file (or owned by
 * the model when converted at load). Quantized formats carry their scales so
 * kernels can dequantize in registers instead of expanding in memory. */
#ifndef TANDEM_MODEL_TENSOR_H
#define TANDEM_MODEL_TENSOR_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    TD_DTYPE_F32 = 0,
    TD_DTYPE_BF16,
    TD_DTYPE_F16,
    TD_DTYPE_F8_E4M3,   /* one byte per element; scale below */
    TD_DTYPE_NVFP4,     /* E2M1 nibbles, uint8 [out, in/2]; block scales below */
    TD_DTYPE_I32,
    TD_DTYPE_I64,
    TD_DTYPE_U8,
    TD_DTYPE_Q8,        /* int8 [out, in], made at load by --quantize q8; BF16 scales [out, in/32] */
    TD_DTYPE_COUNT
} td_dtype;

const char *td_dtype_name(td_dtype t);
/* Bytes per element for plain dtypes; for NVFP4 returns 0 (two per byte). */
size_t td_dtype_size(td_dtype t);

#define TD_MAX_DIMS 4

typedef struct td_tensor {
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    const void *data;
    /* Quantization (unused for F32/BF16/F16):
     *  F8_E4M3: per-tensor `scale_f` or block scales `scales` ([out/blk, in/blk] F32).
     *  NVFP4:   `scales` = fp8 e4m3 [out, in/16], global multiplier `scale_f`.
     *  Q8:      `scales` = BF16 [out, in/32] (value = int8 * scale, blocks of 32 along in). */
    const void *scales;
    td_dtype scales_dtype;
    int64_t scale_block[2];
    float scale_f;
    const char *name; /* borrowed from the weight index */
    /* Q8 only: each row's blocks in groups of 8 (td_q8g_offset) for the int8-activation kernels
       (--precision int8); false: row-major, the order of every other path */
    bool q8_grouped;
} td_tensor;

/* Where element k of a q8 row of K (K % 32 == 0) lies when the row is grouped: the row's 32-blocks in
 * groups of 8 (the last group has gs = the blocks left, 1..8); element i of block b0 + j (j < gs) of the
 * group that starts at block b0 at 32 * b0 + 4 * gs * (i / 4) + 4 * j + i % 4. So 32 consecutive bytes of
 * a whole group hold 4 elements of each of its 8 blocks, and a byte dot product (VPMADDUBSW + VPMADDWD,
 * VPDPBUSD) sums each block's elements into its own int32 lane: 8 chunks give the 8 blocks' exact sums
 * side by side, and one scale multiply serves 8 blocks (kernels_int8.c). */
static inline int64_t td_q8g_offset(int64_t k, int64_t K) {
    const int64_t b = k / 32, i = k % 32, b0 = b & ~(int64_t)7, nb = K / 32, gs = nb - b0 < 8 ? nb - b0 : 8;
    return 32 * b0 + 4 * gs * (i / 4) + 4 * (b - b0) + i % 4;
}

static inline int64_t td_tensor_numel(const td_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* bf16/f16 <-> f32 conversions (exact for bf16 -> f32). */
static inline float td_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
static inline uint16_t td_f32_to_bf16(float f) { /* round to nearest even */
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t r = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + r) >> 16);
}
/* The least bf16 >= f for f >= 0 (the upper of a q8 block scale's two BF16 candidates, quant.c). */
static inline uint16_t td_f32_to_bf16_up(float f) {
    union { float f; uint32_t u; } v = { f };
    return (uint16_t)((v.u >> 16) + ((v.u & 0xffffu) != 0));
}
float td_f16_to_f32(uint16_t h);

/* Reads element i of a plain (non-quantized) float tensor as f32. */
float td_tensor_get_f32(const td_tensor *t, int64_t i);
/* Converts row `row` of a 2-D float tensor (any float dtype) to f32 `out[shape[1]]`. */
void td_tensor_row_f32(const td_tensor *t, int64_t row, float *out);

#endif
