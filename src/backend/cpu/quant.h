/* quant.h — CPU kernels over stored weight types: dequantization and matmul.
 *
 * Weights stay in their stored type (util/tensor.h: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q6_K) and are dequantized inside the dot products; nothing is
 * expanded to F32 in RAM. Accumulation is F32. Block layouts are GGUF's.
 */
#ifndef TESSERA_BACKEND_CPU_QUANT_H
#define TESSERA_BACKEND_CPU_QUANT_H

#include "util/tensor.h"
#include "util/threadpool.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Dequantizes n elements (a multiple of the type's block size) starting at src, which
 * must point at the start of a block, into dst[n]. Used for embedding lookups. */
void quant_dequant_row(enum dtype type, const void *src, float *dst, int64_t n);

/* Bytes of scratch cpu_matmul needs for a weight of this type, n_in columns and up to
 * max_tokens activation rows (the quantized copy of x, or for >= 2 tokens the batched
 * kernels' packed activation tiles, whichever is larger). The caller allocates it once
 * (outside the decode loop) and passes it to every call. */
size_t cpu_matmul_scratch_size(enum dtype type, int64_t n_in, int max_tokens);

/* y[t][o] = sum_i W[o][i] * x[t][i]   for t < num_tokens, o < n_out
 *   w: ne[0] = n_in, ne[1] = n_out (rows of n_in elements in w->type)
 *   x: [num_tokens, n_in] f32 (row stride n_in)
 *   y: [num_tokens, n_out] f32 (row stride n_out)
 * Work is split across the pool by output rows (and tokens for large batches).
 * scratch: cpu_matmul_scratch_size(w->type, n_in, num_tokens) bytes.
 * Called by the forward pass's thread only. */
void cpu_matmul(struct threadpool *tp, const struct tensor *w, const float *x, float *y,
                int num_tokens, void *scratch);

/* Several weights over the same input, e.g. Q, K, V or gate, up: ys[k] = x @ ws[k] for
 * k < nw (nw <= 4), each with cpu_matmul's contract and results (bitwise). The input is
 * quantized once and all rows go to the pool in one dispatch when the weights share n_in
 * and activation format (else one cpu_matmul per weight). scratch: the largest
 * cpu_matmul_scratch_size of the weights. */
void cpu_matmul_multi(struct threadpool *tp, const struct tensor *const *ws, int nw, const float *x,
                      float *const *ys, int num_tokens, void *scratch);

/* Packed weights. The SIMD kernel set may have a packed layout for a weight type (strips
 * of rows interleaved for its register tiles: backend/cpu/gemm_avx512.c). A matrix packed
 * once, at load time, is read by one set of kernels for every number of tokens: prefill
 * runs register-tiled and decode streams the same bytes, with the same arithmetic, so a
 * token's result does not depend on its batch. Unpacked matrices use the per-token
 * kernels (also batch-independent, slower for prefill).
 *   cpu_weight_pack_bytes: bytes for w's packed copy; 0 when this build has no packed
 *     layout for its type (no AVX-512 VNNI/VBMI, or a type without one), then w stays
 *     unpacked.
 *   cpu_weight_pack: fills dst (64-byte aligned, that many bytes) from w->data, split over
 *     the pool; then a view with .cpu_packed = dst uses it (dst must outlive the view).
 * The packed copy has the same size as the stored matrix (plus padding to whole strips). */
size_t cpu_weight_pack_bytes(const struct tensor *w);
void cpu_weight_pack(struct threadpool *tp, const struct tensor *w, void *dst);

/* Reference (plain loop, dequantize-then-dot) version of cpu_matmul for tests. */
void cpu_matmul_ref(const struct tensor *w, const float *x, float *y, int num_tokens);

#ifdef __cplusplus
}
#endif

#endif
