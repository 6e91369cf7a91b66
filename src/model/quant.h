/* Load-time weight quantization (--quantize q8). */
#ifndef TANDEM_MODEL_QUANT_H
#define TANDEM_MODEL_QUANT_H
#include "model/model.h"
#include "tandem.h"

typedef enum { TD_QUANT_NONE = 0, TD_QUANT_Q8 = 1 } td_quant_kind;

/* Rows [r0, r1) of a [N, K] F32/BF16/F16 weight (K % 32 == 0) as int8 q [N*K]
 * and BF16 scales s [N*K/32]: s = one of the two BF16 neighbours of the
 * 32-block's absmax / 127 (the one with the smaller squared error), q =
 * round(w / s) clamped to +-127. */
void td_quantize_q8_rows(const td_tensor *W, int64_t r0, int64_t r1, int8_t *q, uint16_t *s);

/* Rows [r0, r1) of row-major q8 data [N, K] rearranged in place into the grouped order of
 * td_q8g_offset (the int8-activation kernels' layout); the scales keep their order. */
void td_q8_group_rows(int8_t *q, int64_t K, int64_t r0, int64_t r1);

/* Quantizes every linear weight of a loaded model that is F32/BF16/F16 with
 * in_features % 32 == 0 (not the embedding or a tied lm_head); the int8 copies
 * are owned by the model (freed by td_model_free) and counted in owned_bytes.
 * grouped: in the int8-activation kernels' order (td_tensor.q8_grouped). */
int td_model_quantize(td_model *m, td_quant_kind kind, bool grouped, td_err *err);

#endif
