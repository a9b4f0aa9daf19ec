/* embedding.h — the embedding gather on the GPU (kernels/embedding.cu): the first op of
 * the forward pass, writing the residual stream.
 *     out[t][:] = row token_ids[t] of the embedding table, as F32
 * The table stays in its stored type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q6_K), rows of dim elements back to back as in the GGUF file. Values are bitwise those of
 * quant_dequant_row. CPU twin: cpu_embedding (src/backend/cpu/embedding.h, same arguments).
 *
 * Token ids outside [0, vocab) are never read through: their output row is all zeros (the
 * engine validates ids before they reach the forward pass; this only keeps a bad id from
 * reading out of bounds).
 *
 * Device pointers; enqueued on `stream`, nothing allocated; returns a cudaError_t as an
 * int (0 = success; cudaErrorInvalidValue for an unsupported type, dim not a whole number
 * of blocks, or a quantized table / out not 16-byte aligned). Any host thread that owns
 * the stream may call it.
 */
#ifndef TESSERA_KERNELS_EMBEDDING_H
#define TESSERA_KERNELS_EMBEDDING_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/tensor.h"

/*   table:     [vocab][dim] of `type` (row_bytes = dtype_row_bytes(type, dim))
 *   token_ids: [num_tokens] int32
 *   out:       [num_tokens][dim] F32 */
int cuda_embedding(enum dtype type, const void *table, int64_t vocab, int64_t dim, const int32_t *token_ids,
                   int num_tokens, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
