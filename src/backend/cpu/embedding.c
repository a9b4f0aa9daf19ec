/* embedding.c — cpu_embedding (see embedding.h): one quant_dequant_row per token. */
#include "backend/cpu/embedding.h"
#include "backend/cpu/quant.h"

#include <string.h>

void cpu_embedding(enum dtype type, const void *table, int64_t vocab, int64_t dim, const int32_t *token_ids,
                   int num_tokens, float *out)
{
    size_t row_bytes = dtype_row_bytes(type, dim);
    for (int t = 0; t < num_tokens; t++) {
        float *o = out + (size_t)t * (size_t)dim;
        int64_t id = token_ids[t];
        if (id < 0 || id >= vocab) memset(o, 0, (size_t)dim * sizeof *o);
        else quant_dequant_row(type, (const uint8_t *)table + (size_t)id * row_bytes, o, dim);
    }
}
