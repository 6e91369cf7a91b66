/* Dot-product kernels. Each has one fixed summation order (16 lanes, then a
 * fixed tree) so results do not depend on batch size, thread count or which
 * ISA clone runs (ISO C mode: no FMA contraction). */
#ifndef TANDEM_CPU_KERNELS_H
#define TANDEM_CPU_KERNELS_H
#include <stdint.h>

float td_dot_f32(const float *x, const float *w, int64_t n);
float td_dot_bf16(const float *x, const uint16_t *w, int64_t n);
float td_dot_f16(const float *x, const uint16_t *w, int64_t n);
#endif
