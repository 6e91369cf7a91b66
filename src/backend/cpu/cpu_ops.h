/* Internal to the CPU backend: the op implementations split over files by
 * concern (cpu_backend.c: memory and elementwise ops; ops_attn.c: KV rows and
 * attention; ops_gdn.c: Gated DeltaNet). The guard backend reuses them. */
#ifndef TANDEM_CPU_OPS_H
#define TANDEM_CPU_OPS_H
#include "backend/backend.h"

/* The CPU op table (the guard backend wraps it). */
const td_backend_ops *td_cpu_backend_ops(void);

/* Parallel loop on the backend's pool, or a plain one when the work (in
 * multiply-adds) is too small to pay for waking threads. Results are
 * identical either way. */
void td_cpu_par_for(td_backend *b, int n, void (*fn)(void *, int), void *ctx, double work);

void td_cpu_attn_prep(td_backend *b, const td_config *g, const td_batch *bt, const float *qg, float *k, const float *v,
                      const float *qn, const float *kn, const float *inv_freq, float *q, float *gate, const td_kv_view *kv,
                      int shift);
void td_cpu_attention(td_backend *b, const td_config *g, const td_batch *bt, const float *q, const float *gate,
                      const td_kv_view *kv, int shift, float *out);
void td_cpu_kv_store(td_backend *b, const td_kv_view *kv, int row, const float *k, const float *v);
void td_cpu_kv_load(td_backend *b, const td_kv_view *kv, int row, int which, float *out);
void td_cpu_gdn_conv(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                     const float *qkv, float *conv_out);
void td_cpu_gdn_recur(td_backend *b, const td_config *g, const td_batch *bt, int lin, const td_gdn_params *w,
                      const float *conv_out, const float *z, const float *b_in, const float *a_in, float *o, int chunk);
#endif
