/* norm.h — RMSNorm kernels (kernels/norm.cu): RMSNorm fused with the residual add, and the
 * per-head RMSNorm of Qwen3's q/k. CPU twins: src/backend/cpu/ops_fused.h (same arguments,
 * host pointers, no stream).
 *
 * All pointers are device pointers; launchers enqueue on `stream`, allocate nothing and
 * return the launch's cudaError_t as an int (0 = success; cudaErrorInvalidValue for an
 * unsupported dtype or shape). Any host thread that owns the stream may call them.
 * pdl != 0 launches the kernels with programmatic stream serialization (common.cuh,
 * ts_pdl_wait): on sm_90+ they may be scheduled while the previous kernel on the stream
 * finishes, and wait for it before touching memory; 0 is an ordinary launch.
 */
#ifndef TESSERA_KERNELS_NORM_H
#define TESSERA_KERNELS_NORM_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/l2_hint.h"
#include "util/tensor.h"

/* Per row r < num_rows: if delta != NULL, residual[r] += delta[r] (in place); then
 *   out[r] = residual[r] / sqrt(mean(residual[r]^2) + eps) * w
 * in out_dtype (DT_F32, DT_F16 or DT_BF16; round to nearest even). delta == NULL is the
 * plain RMSNorm (first layer, final norm). dim >= 1; the fast path (row in registers,
 * 16-byte loads) takes dim % 4 == 0, dim <= 8192 and 16-byte aligned F32 pointers (8-byte
 * aligned 16-bit out), anything else runs a slower generic kernel.
 *   out:      [num_rows][dim] of out_dtype (must not alias residual/delta)
 *   residual: [num_rows][dim] F32, updated in place when delta != NULL
 *   delta:    [num_rows][dim] F32 (the previous linear layer's output) or NULL
 *   w:        [dim] F32
 *   l2:       weights to prefetch into the L2 once the inputs are ready, or NULL
 *             (kernels/l2_hint.h)
 *   qact:     NULL, or out quantized for the quantized GEMV as well: the bytes
 *             cuda_quantize_act(out, dim, num_rows, qact) would write (kernels/quant_matmul.h;
 *             cuda_quant_act_size(dim, num_rows) bytes, 16-byte aligned), saving that launch.
 *             Needs out_dtype DT_F32 and dim % 32 == 0. */
int cuda_rmsnorm_residual(void *out, enum dtype out_dtype, float *residual, const float *delta,
                          const float *w, int num_rows, int dim, float eps, const struct cuda_l2_hint *l2,
                          void *qact, int pdl, cudaStream_t stream);

/* Qwen3's q/k norm, in place on the fused QKV buffer: every q head of every token is
 * RMS-normalised over head_dim with q_norm, every k head with k_norm; v is untouched.
 * head_dim in {64, 128, 256}; qkv 16-byte aligned and row_stride % 4 == 0.
 *   qkv:    [num_tokens][row_stride] F32: q heads [n_heads][head_dim] at column 0, then
 *           k heads [n_kv_heads][head_dim] (then v, untouched)
 *   q_norm: [head_dim] F32,  k_norm: [head_dim] F32 */
int cuda_head_rmsnorm(float *qkv, int64_t row_stride, const float *q_norm, const float *k_norm,
                      int num_tokens, int n_heads, int n_kv_heads, int head_dim, float eps, int pdl,
                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
