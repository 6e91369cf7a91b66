/* Matmul kernels. Each output element y[m,n] = dot(x[m,:], W[n,:]) has one
 * fixed summation order — 16 lanes (lane j sums elements i ≡ j mod 16 in
 * increasing i), then a fixed tree — whatever M, the tile it falls in, the
 * thread split or the row block. So results do not depend on batch size or
 * thread count (the backend's batch-invariance rule).
 *
 * ISAs, chosen per backend (td_backend.isa; the best the CPU has unless the
 * engine's td_engine_opts.isa says otherwise): AVX-512 (16-lane zmm FMA) and AVX2 (two
 * 8-lane ymm FMAs per 16 lanes) give bit-identical results to each other; the
 * portable C fallback uses a separate multiply and add (ISO C mode: no
 * contraction) and so rounds differently from the FMA paths, but it too is
 * batch-invariant.
 *
 * Weights are dequantized in registers: F32, BF16, F16, FP8 e4m3 (per-tensor
 * or block scales) and NVFP4 (e2m1 + fp8 e4m3 block-16 scales + a global
 * multiplier). See model/tensor.h for the scale fields. */
#ifndef TANDEM_CPU_KERNELS_H
#define TANDEM_CPU_KERNELS_H
#include <stdbool.h>
#include <stdint.h>
#include "model/tensor.h"

float td_dot_f32(const float *x, const float *w, int64_t n);
/* y[i] += a * x[i] */
void td_vec_axpy(float *y, float a, const float *x, int n);
/* One token of the gated delta rule for one head (see kernels.c); S [dk, dv]
 * updated in place, mem [dv] scratch, o [dv] output. Bit-identical to the
 * plain loops in every clone. */
void td_gdn_step(float *S, int dk, int dv, const float *k, const float *v, const float *q, float beta, float decay,
                 float *mem, float *o);
/* C tokens at once (chunked form, see kernels.c): K, Q [C, dk], V, O [C, dv],
 * beta [C], logdecay [C] (log of each token's decay); scratch 3*C*dv + C floats.
 * Equal to C td_gdn_step calls up to rounding. */
void td_gdn_chunk(float *S, int dk, int dv, int C, const float *K, const float *V, const float *Q, const float *beta,
                  const float *logdecay, float *scratch, float *O);
float td_dot_bf16(const float *x, const uint16_t *w, int64_t n);
float td_dot_f16(const float *x, const uint16_t *w, int64_t n);

typedef enum { TD_ISA_C = 0, TD_ISA_AVX2, TD_ISA_AVX512, TD_ISA_AUTO } td_isa;
const char *td_isa_name(td_isa i);
/* Best ISA this CPU supports. */
td_isa td_kernels_best_isa(void);
/* Whether this CPU runs isa (TD_ISA_AUTO: yes). No process-wide choice: each
 * backend holds its own (td_backend.isa, td_engine_opts.isa). */
bool td_kernels_have_isa(td_isa i);

/* Kernel choices for a CPU family: which tile shape and traversal stream the
 * weights fastest there, as measured (DEFAULT: tuned on Intel Xeon; AMD:
 * on an EPYC Zen 5 guest, bench/results/zen5-2026-12-07.md). Every choice
 * computes each output with the same arithmetic in the same order, so the
 * results are bit-identical whatever the tuning (test_kernels runs them all).
 * Like the ISA, each backend holds its own (td_backend.tune). */
typedef enum { TD_TUNE_DEFAULT = 0, TD_TUNE_AMD, TD_TUNE_COUNT } td_tune;
const char *td_tune_name(td_tune t);
/* TD_TUNE_AMD on AMD Zen 5 and later (family 0x1a+), else TD_TUNE_DEFAULT. */
td_tune td_kernels_best_tune(void);

/* Whether the kernels take W (dtype, shape, scale layout). */
bool td_matmul_supported(const td_tensor *W, const char **why);

/* y[m*ldy + n] = x[m*K + :] · W[n, :] for m in [m0, m1), n in [n0, n1);
 * K = W->shape[1]; isa: one this CPU has (td_kernels_have_isa), not AUTO;
 * tune: any td_tune (the same bits; only the speed differs). */
void td_matmul_block(td_isa isa, td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y,
                     int64_t ldy);

/* BF16 activations (kernels_bf16.c, `--precision bf16`): whether this CPU has
 * AVX-512 BF16 (VDPBF16PS), which the path needs. td_x_to_bf16 rounds x [M, K]
 * to BF16 (nearest even) into xb [M, ldb], ldb >= K a multiple of 32, zero
 * padded; td_matmul_block_bf16 is td_matmul_block on those rows. Same
 * batch-invariance rule, its own rounding (see kernels_bf16.c). */
bool td_kernels_have_bf16(void);
void td_x_to_bf16(const float *x, int M, int64_t K, int64_t ldb, uint16_t *xb);
void td_matmul_block_bf16(const td_tensor *W, const uint16_t *xb, int64_t ldb, int m0, int m1, int64_t n0, int64_t n1, float *y,
                          int64_t ldy);
/* The activation rows one prefill panel of kernels_bf16.c takes at once:
 * callers that split M hand it blocks of this size (its weight panel is
 * converted once per block). */
#define TD_BF16_M_BLOCK 128

/* INT8 activations (kernels_int8.c, `--precision int8`) for q8 weights:
 * td_x_to_q8 quantizes x [M, K] (K % 32 == 0) per 32-block as the q8 weights
 * are (s = absmax / 127): xq [M, K] int8 and xa [M, K] = |xq|, each row in the
 * grouped order of td_q8g_offset, and xs [M, K/32] in block order;
 * td_matmul_block_i8 is td_matmul_block for a grouped TD_DTYPE_Q8 W
 * (q8_grouped) on those rows, summing each block's products exactly in integers. Every isa gives the C
 * reference's bits (AVX-512 with VNNI uses VPDPBUSD; the rule is in
 * kernels_int8.c); same batch-invariance rule as the f32 kernels. */
bool td_kernels_have_vnni(void);
void td_x_to_q8(td_isa isa, const float *x, int M, int64_t K, int8_t *xq, int8_t *xa, float *xs);
void td_matmul_block_i8(td_isa isa, const td_tensor *W, const int8_t *xq, const int8_t *xa, const float *xs, int m0, int m1, int64_t n0,
                        int64_t n1, float *y, int64_t ldy);

/* e4m3 (fn: no infinities, 0x7f/0xff NaN) byte -> float, exact. */
float td_fp8_e4m3_to_f32(uint8_t b);

/* Per-ISA entry points (kernels_x86.c); same contract as td_matmul_block. */
void td_mm_avx2(td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy);
void td_mm_avx512(td_tune tune, const td_tensor *W, const float *x, int m0, int m1, int64_t n0, int64_t n1, float *y, int64_t ldy);
#endif
