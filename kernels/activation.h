/* activation.h — SiLU·mul (kernels/activation.cu), the MLP's gate activation. CPU twin:
 * cpu_silu_mul_rows (src/backend/cpu/ops_fused.h, same arguments, host pointers, no stream).
 *
 * All pointers are device pointers; the launcher enqueues on `stream`, allocates nothing
 * and returns the launch's cudaError_t as an int (0 = success; cudaErrorInvalidValue for an
 * unsupported dtype or shape). Any host thread that owns the stream may call it.
 * pdl != 0 launches the kernel with programmatic stream serialization (common.cuh,
 * ts_pdl_wait): on sm_90+ it may be scheduled while the previous kernel on the stream
 * finishes, and waits for it before touching memory; 0 is an ordinary launch.
 */
#ifndef TESSERA_KERNELS_ACTIVATION_H
#define TESSERA_KERNELS_ACTIVATION_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/tensor.h"

/* out[t][i] = silu(gate[t][i]) * up[t][i] = gate / (1 + exp(-gate)) * up, in F32, rounded
 * once to out_dtype (DT_F32, DT_F16 or DT_BF16). Gate and up rows are in_stride floats
 * apart: for the fused gate/up GEMM output gu [num_tokens][2 * ffn] (gate first) pass
 * gate = gu, up = gu + ffn, in_stride = 2 * ffn; separate buffers work too. The fast path
 * (16-byte loads) takes ffn % 4 == 0, in_stride % 4 == 0 and 16-byte aligned gate/up
 * (8-byte aligned 16-bit out); anything else runs a scalar kernel.
 *   out:  [num_tokens][ffn] of out_dtype
 *   gate: [num_tokens][in_stride] F32 (first ffn of each row used)
 *   up:   [num_tokens][in_stride] F32 (first ffn of each row used)
 *   qact: NULL, or out quantized for the quantized GEMV as well: the bytes
 *         cuda_quantize_act(out, ffn, num_tokens, qact) would write (kernels/quant_matmul.h;
 *         cuda_quant_act_size(ffn, num_tokens) bytes, 16-byte aligned). Needs out_dtype
 *         DT_F32, ffn % 32 == 0 and the fast path. */
int cuda_silu_mul_rows(void *out, enum dtype out_dtype, const float *gate, const float *up,
                       int64_t in_stride, int num_tokens, int ffn, void *qact, int pdl, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
