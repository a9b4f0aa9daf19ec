/* dense_gemv.h — y = x W^T for F16/BF16 weights and a few activation rows
 * (kernels/dense_gemv.cu): the batch-1 decode step's linear layers of unquantized models,
 * where a step reads every weight once and cuBLAS's GEMM for one column leaves bandwidth
 * unused (on an H200: 86-105% of the copy bandwidth here, 64-99% there; from 4 rows on
 * cuBLAS's tensor-core kernels are faster; the CUDA backend measures which one to call).
 *     y[t * ldy + o] = sum_i W[o][i] * x[t][i]      t < num_tokens, o < n_out, i < n_in
 * CPU twin: cpu_matmul_ref (src/backend/cpu/quant.h) on x widened from the weight type to
 * F32 (the same products; F32 sums in another order).
 *
 * w: [n_out][n_in] of `type` (DT_F16 or DT_BF16); x: [num_tokens][n_in] of the same type;
 * y: F32, row t at y + t * ldy (ldy >= n_out). All device pointers. Takes num_tokens
 * 1..DENSE_GEMV_MAX_TOKENS, n_in a multiple of 8 and w, x 16-byte aligned; anything else is
 * cudaErrorInvalidValue (callers use cuBLAS there). pdl != 0 launches it with
 * programmatic stream serialization (sm_90+; common.cuh, ts_pdl_wait): its threads load
 * their first weight chunks, which no kernel writes, while the previous kernel on the
 * stream finishes, then wait for it before reading x or writing y. Enqueues on `stream`,
 * allocates nothing, returns the launch's cudaError_t as an int (0 = success).
 */
#ifndef TESSERA_KERNELS_DENSE_GEMV_H
#define TESSERA_KERNELS_DENSE_GEMV_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/tensor.h"

#define DENSE_GEMV_MAX_TOKENS 8

/* The arguments both dense linear kernels take (this contract, and skinny_gemm.h's with
 * its own token limit): F16/BF16 weights, n_in > 0 a multiple of 8, ldy >= n_out >= 0,
 * 1..max_tokens rows, w and x 16-byte aligned. */
static inline int dense_linear_args_ok(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x,
                                       const float *y, int64_t ldy, int num_tokens, int max_tokens)
{
    return (type == DT_F16 || type == DT_BF16) && w && x && y && n_in > 0 && n_in % 8 == 0 && n_out >= 0 &&
           ldy >= n_out && num_tokens >= 1 && num_tokens <= max_tokens && ((uintptr_t)w | (uintptr_t)x) % 16 == 0;
}

int cuda_dense_gemv(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x, float *y,
                    int64_t ldy, int num_tokens, int pdl, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
