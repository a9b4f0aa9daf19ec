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

/* The arguments of the fused gate/up + SiLU·mul kernels (cuda_dense_gemv_silu below and
 * skinny_gemm.h's): those of a plain call over the 2 ffn rows into a [num_tokens][2 ffn]
 * output, and an activation dtype of F32, F16 or BF16. */
static inline int dense_silu_args_ok(enum dtype type, const void *w, int64_t n_in, int64_t ffn, const void *x,
                                     const void *act, enum dtype act_dtype, int num_tokens, int max_tokens)
{
    return dense_linear_args_ok(type, w, n_in, 2 * ffn, x, (const float *)act, 2 * ffn, num_tokens, max_tokens) &&
           (act_dtype == DT_F32 || act_dtype == DT_F16 || act_dtype == DT_BF16);
}

int cuda_dense_gemv(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x, float *y,
                    int64_t ldy, int num_tokens, int pdl, cudaStream_t stream);

/* The MLP's gate/up projection and its SiLU·mul in one kernel (the decode step's
 *     act[t][j] = silu(g) * u,  g = sum_i W[j][i] x[t][i],  u = sum_i W[ffn + j][i] x[t][i]
 * for j < ffn): w is the fused [2 ffn][n_in] gate | up matrix (gate rows first), act
 * [num_tokens][ffn] of act_dtype (DT_F32, DT_F16 or DT_BF16). Bit for bit
 * cuda_dense_gemv of w into a [num_tokens][2 ffn] buffer followed by cuda_silu_mul_rows
 * (kernels/activation.h) of its halves: each row is summed in the same order and the
 * activation is the same F32 expression, rounded once, but the gate/up rows never go to
 * memory and there is one launch fewer. Same argument rules and pdl as cuda_dense_gemv. */
int cuda_dense_gemv_silu(enum dtype type, const void *w, int64_t n_in, int64_t ffn, const void *x, void *act,
                         enum dtype act_dtype, int num_tokens, int pdl, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
