/* The CUDA backend's cuBLASLt paths (cuda_lt.cu), as tests and tools see
 * them. C-callable; compiled in only where the CUDA backend is. */
#ifndef TANDEM_CUDA_LT_H
#define TANDEM_CUDA_LT_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
struct td_backend;
/* sm: the device's compute capability x 10 + minor. on[0] / on[1] / on[2]:
 * the FP8 per-tensor / NVFP4 / FP8 128x128-block path is usable (set up, not
 * refused); calls[]: cublasLtMatmul calls each issued. TD_ERR_ARG when b is
 * not a CUDA backend. */
int td_backend_cuda_lt_info(struct td_backend *b, int *sm, int on[3], uint64_t calls[3]);
#ifdef __cplusplus
}
#endif
#endif
