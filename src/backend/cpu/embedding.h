/* embedding.h — the embedding gather of the CPU backend, twin of the GPU's cuda_embedding
 * (kernels/embedding.h): the same arguments on host memory.
 *
 *     out[t][:] = quant_dequant_row(row token_ids[t] of table)        t < num_tokens
 * and an all-zero row for an id outside [0, vocab) (never read: the engine validates ids,
 * this keeps a bad one from reading out of bounds). Called by the forward pass's thread.
 */
#ifndef TESSERA_BACKEND_CPU_EMBEDDING_H
#define TESSERA_BACKEND_CPU_EMBEDDING_H

#include "util/tensor.h"

#include <stdint.h>

/*   table: [vocab][dim] of type;  token_ids: [num_tokens];  out: [num_tokens][dim] F32 */
void cpu_embedding(enum dtype type, const void *table, int64_t vocab, int64_t dim, const int32_t *token_ids,
                   int num_tokens, float *out);

#endif
