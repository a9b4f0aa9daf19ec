/* quant_matmul.h — matmul over GGUF-quantized weights on the GPU (kernels/quant_matmul.cu):
 *     y[t][o] = sum_i W[o][i] * x[t][i]        t < num_tokens, o < n_out, i < n_in
 * W stays in its stored block format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K), rows of
 * n_in elements back to back, byte-identical to the GGUF file. CPU twins: cpu_matmul (same
 * function, activations quantized per the CPU's Q8_0/Q8_1/Q8_K) and cpu_matmul_ref
 * (dequantize, then an F32 dot), src/backend/cpu/quant.h.
 *
 * Paths, picked by cuda_quant_matmul from num_tokens:
 *   1..QMM_GEMV_MAX_TOKENS  quantize x to int8 per 32 elements (cuda_quantize_act), then one
 *                           pass over W that dequantizes in registers and dots with __dp4a
 *                           for all tokens at once (cuda_quant_gemv): W is read once.
 *   more                    W is dequantized to BF16 a slice of rows at a time into the
 *                           workspace (cuda_dequant_bf16; a slice is sized to stay in L2),
 *                           x converted to BF16, and each slice multiplied on the tensor
 *                           cores by cuBLAS (GemmEx, BF16 x BF16 -> F32, F32 accumulate).
 *
 * All pointers are device pointers; launchers enqueue on `stream`, allocate nothing, and
 * return a cudaError_t as an int (0 = success; cudaErrorInvalidValue for an unsupported
 * type, a shape that is not a whole number of blocks, a misaligned pointer or too small a
 * workspace; cudaErrorUnknown when cuBLAS fails). Alignment: w, x, the workspace and
 * BF16 outputs 16-byte aligned (cudaMalloc gives 256). Any host thread that owns the
 * stream may call them; a cuBLAS handle must not be used by two threads at once.
 */
#ifndef TESSERA_KERNELS_QUANT_MATMUL_H
#define TESSERA_KERNELS_QUANT_MATMUL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/tensor.h"

/* cuBLAS's handle type (cublasHandle_t is `struct cublasContext *`), declared here so that
 * C callers need not include cublas_v2.h. */
struct cublasContext;

/* Largest num_tokens served by the GEMV path; above it the BF16 tensor-core path. */
#define QMM_GEMV_MAX_TOKENS 8

/* Bytes of workspace cuda_quant_matmul needs for this weight and up to max_tokens rows of
 * x (the quantized activations, or the BF16 copy of x plus one BF16 slice of W). */
size_t cuda_quant_matmul_workspace_size(enum dtype type, int64_t n_in, int64_t n_out, int max_tokens);

/* y = x W^T as above, the path chosen by num_tokens (>= 1; 0 does nothing).
 *   w:  [n_out][row_bytes] blocks of `type` (row_bytes = dtype_row_bytes(type, n_in);
 *       n_in a multiple of 32, of 256 for Q4_K / Q6_K)
 *   x:  [num_tokens][n_in] F32
 *   y:  [num_tokens][ldy] F32, ldy >= n_out: columns [0, n_out) of each row overwritten,
 *       the rest untouched (so q, k and v can be written into the fused QKV rows)
 *   workspace: workspace_bytes >= cuda_quant_matmul_workspace_size(type, n_in, n_out,
 *       num_tokens) bytes; the BF16 path dequantizes as many rows per slice as the
 *       workspace holds beyond the BF16 copy of x (at least one).
 *   cublas: a cuBLAS handle (its stream is set to `stream`); may be NULL when num_tokens
 *       <= QMM_GEMV_MAX_TOKENS.
 *   direct: the GEMV's weight loads (cuda_quant_gemv).
 *   pdl: the GEMV path's two kernels (the activation quantization and the GEMV) are
 *       programmatic dependent launches (common.cuh, ts_pdl_wait); the BF16 path's kernels
 *       and cuBLAS launch plainly either way. */
int cuda_quant_matmul(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const float *x,
                      float *y, int64_t ldy, int num_tokens, void *workspace, size_t workspace_bytes,
                      struct cublasContext *cublas, int direct, int pdl, cudaStream_t stream);

/* ---- the building blocks, for callers that share one quantized x between several
 *      weights (gate and up) or manage their own scratch ---------------------------------- */

/* Bytes of a quantized activation buffer for num_tokens rows of n_in (multiple of 32):
 *   q:  int8 [num_tokens][n_in]                 at offset 0
 *   ds: float2 [num_tokens][n_in / 32]          at offset cuda_quant_act_ds_offset(...)
 * ds[t][b] = (d, s): d = max |x| of the block / 127, q = round-half-even(x / d) clamped to
 * +-127 (the CPU's Q8_0 rule, bit for bit), s = sum of the block's 32 codes (exact). */
size_t cuda_quant_act_size(int64_t n_in, int num_tokens);
size_t cuda_quant_act_ds_offset(int64_t n_in, int num_tokens);

/* Quantizes x [num_tokens][n_in] F32 into act (layout above, cuda_quant_act_size bytes).
 * pdl != 0: a programmatic dependent launch, which waits for the previous kernel before
 * reading x. */
int cuda_quantize_act(const float *x, int64_t n_in, int num_tokens, void *act, int pdl, cudaStream_t stream);

/* y [num_tokens][ldy] (columns [0, n_out)) = W x^T from quantized activations
 * (cuda_quantize_act's act, made for this num_tokens and n_in);
 * 1 <= num_tokens <= QMM_GEMV_MAX_TOKENS.
 * direct != 0: Q4_K weights (whose blocks keep 16-byte alignment) are loaded straight into
 * each lane's registers; 0: through shared memory, as every other type always is. Same
 * sums, added in the same order either way.
 * pdl != 0: a programmatic dependent launch: the first chunk of weights is loaded before the
 * wait for the previous kernel, which may be the one writing act. */
int cuda_quant_gemv(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *act,
                    int num_tokens, float *y, int64_t ldy, int direct, int pdl, cudaStream_t stream);

/* Dequantizes rows [row0, row0 + rows) of W into out [rows][n_in] BF16 (round to nearest
 * even from the exact F32 values quant_dequant_row gives). */
int cuda_dequant_bf16(enum dtype type, const void *w, int64_t n_in, int64_t row0, int64_t rows, void *out,
                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
