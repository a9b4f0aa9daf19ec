/* kv_dtype.h — the element types of a paged KV cache, shared by the engine, the model and
 * every backend (a backend-neutral type: the CPU ops and the CUDA kernels read the same
 * pool layout in any of these types).
 *
 * FP8 stores OCP e4m3fn codes (util/fp8.h) with a per-layer scale for K and for V: a
 * write stores code = e4m3(x / scale) (round to nearest even, saturating at +-448), a
 * read gives code * scale. F16 and BF16 round to nearest even (util/half.h).
 */
#ifndef TESSERA_UTIL_KV_DTYPE_H
#define TESSERA_UTIL_KV_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum kv_dtype { KV_F32 = 0, KV_F16 = 1, KV_FP8_E4M3 = 2, KV_BF16 = 3 };

#define KV_DEFAULT_BLOCK_SIZE 16 /* tokens per KV block unless configured */

size_t kv_dtype_size(enum kv_dtype t); /* bytes per element; 0 if unknown */
const char *kv_dtype_name(enum kv_dtype t); /* "f32", "f16", "fp8", "bf16"; "unknown" */
/* "f32", "f16" (alias "fp16", vLLM's name), "bf16", "fp8" (alias "fp8_e4m3") -> 0 and *out;
 * ERR_INVALID otherwise. */
int kv_dtype_parse(const char *s, enum kv_dtype *out);

/* One layer's KV pool: a view (the owner — the model's kv_cache on the CPU, the CUDA
 * backend's device pool — keeps the memory). Layout, outermost first:
 *   [num_blocks][2 (k, v)][n_kv_heads][block_size][head_dim] of dtype
 * so the block_size key rows of one (block, kv head) are one contiguous chunk. data is a
 * host pointer for the CPU ops and a device pointer for the CUDA kernels. */
struct kv_layer {
    void *data;     /* [num_blocks][2][n_kv_heads][block_size][head_dim] of dtype */
    enum kv_dtype dtype;
    int num_blocks;
    int block_size;
    int n_kv_heads;
    int head_dim;
    float k_scale;  /* FP8 only: stored code * k_scale = value (1 otherwise) */
    float v_scale;
};

#ifdef __cplusplus
}
#endif

#endif
