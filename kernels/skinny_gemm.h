/* skinny_gemm.h — y = x W^T for F16/BF16 weights and 1..16 activation rows on the tensor
 * cores (kernels/skinny_gemm.cu): the small-batch decode steps' linear layers of
 * unquantized models. Like dense_gemv.h's GEMV it reads every weight once per call, but
 * multiplies on the tensor cores, so 8 or 16 rows cost the GPU no more arithmetic time than
 * one (the GEMV's F32 FMAs grow with the rows and bind from 4 rows on). The CUDA backend
 * times it against the GEMV and cuBLAS at start-up for each of a model's linear shapes and
 * row counts and keeps the fastest (src/backend/cuda/linear.cu).
 *     y[t * ldy + o] = sum_i W[o][i] * x[t][i]      t < num_tokens, o < n_out, i < n_in
 * CPU twin: cpu_matmul_ref (src/backend/cpu/quant.h) on x widened from the weight type to
 * F32 (the same products; F32 sums in another order).
 *
 * w: [n_out][n_in] of `type` (DT_F16 or DT_BF16); x: [num_tokens][n_in] of the same type;
 * y: F32, row t at y + t * ldy (ldy >= n_out). All device pointers. Takes num_tokens
 * 1..SKINNY_GEMM_MAX_TOKENS, n_in a multiple of 8 and w, x 16-byte aligned
 * (dense_linear_args_ok in dense_gemv.h); anything else is cudaErrorInvalidValue. pdl != 0
 * launches it as dense_gemv.h's does (programmatic dependent launch: its first weight loads
 * overlap the end of the previous kernel on the stream). Enqueues on `stream`, allocates
 * nothing, returns the launch's cudaError_t as an int (0 = success). Deterministic: the same
 * inputs give the same bits.
 */
#ifndef TESSERA_KERNELS_SKINNY_GEMM_H
#define TESSERA_KERNELS_SKINNY_GEMM_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/tensor.h"

#define SKINNY_GEMM_MAX_TOKENS 16

int cuda_skinny_gemm(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x, float *y,
                     int64_t ldy, int num_tokens, int pdl, cudaStream_t stream);

/* The MLP's gate/up projection and its SiLU·mul in one kernel, as dense_gemv.h's
 * cuda_dense_gemv_silu (the same arguments, 1..SKINNY_GEMM_MAX_TOKENS rows): bit for bit
 * cuda_skinny_gemm of the fused [2 ffn][n_in] gate | up matrix followed by
 * cuda_silu_mul_rows. Each CTA takes 8 gate rows and their 8 up rows as its 16. */
int cuda_skinny_gemm_silu(enum dtype type, const void *w, int64_t n_in, int64_t ffn, const void *x, void *act,
                          enum dtype act_dtype, int num_tokens, int pdl, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
