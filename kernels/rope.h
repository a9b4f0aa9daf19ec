/* rope.h — RoPE fused with the paged KV-cache write (kernels/rope.cu): vLLM's
 * rotary_embedding + reshape_and_cache in one kernel. CPU twin: cpu_rope_kv_write
 * (src/backend/cpu/ops_fused.h, same arguments, host pointers, no stream).
 *
 * All pointers are device pointers except kv, a host struct whose data is the device
 * pool; the launcher enqueues on `stream`, allocates nothing and returns the launch's
 * cudaError_t as an int (0 = success; cudaErrorInvalidValue for an unsupported shape,
 * alignment or dtype). Any host thread that owns the stream may call it.
 */
#ifndef TESSERA_KERNELS_ROPE_H
#define TESSERA_KERNELS_ROPE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/l2_hint.h"
#include "util/kv_dtype.h"
#include "util/rope.h"

/* For token t, with row = qkv[t] (+ qkv_bias when not NULL):
 *   q_out[t][h] = rope(row q head h)                          every token, padding too
 *   k = rope(row k head), v = row v head -> cache slot slot_mapping[t], converted to
 *       kv->dtype (F16/BF16 round to nearest even; FP8 e4m3 code = e4m3(x / k_scale or
 *       v_scale), saturating; F32 as is); nothing is written when slot_mapping[t] < 0
 * rope rotates pairs (a, b) -> (a cos - b sin, a sin + b cos) with angle
 * positions[t] * inv_freq[i] and cos, sin multiplied by mscale (YaRN; 1 otherwise); pairs
 * are (x[2i], x[2i+1]) for ROPE_NORMAL and (x[i], x[i + head_dim/2]) for ROPE_NEOX. The
 * angle is reduced in double precision, so large positions (131071) match the CPU's
 * double-precision cos/sin to a few float ulps.
 * Requires head_dim = kv->head_dim a multiple of 8 (<= 1024), row_stride % 4 == 0, and
 * 16-byte aligned qkv, qkv_bias, q_out, inv_freq and kv->data.
 *   q_out:        [num_tokens][n_heads][head_dim] F32
 *   kv:           pool [num_blocks][2 (k, v)][n_kv_heads][block_size][head_dim] of kv->dtype
 *   qkv:          [num_tokens][row_stride] F32 (the fused QKV GEMM output):
 *                 q [n_heads][head_dim] | k [n_kv_heads][head_dim] | v [n_kv_heads][head_dim]
 *   qkv_bias:     [(n_heads + 2 * n_kv_heads) * head_dim] F32 or NULL (Qwen2)
 *   positions:    [num_tokens] int32
 *   slot_mapping: [num_tokens] int64, slot = block * block_size + offset, -1 = padding
 *   inv_freq:     [head_dim / 2] F32, from rope_inv_freq (util/rope.h)
 *   l2:           weights to prefetch into the L2 once the inputs are ready, or NULL
 *                 (kernels/l2_hint.h)
 *   pdl:          non-zero: a programmatic dependent launch (common.cuh, ts_pdl_wait) */
int cuda_rope_kv_write(float *q_out, const struct kv_layer *kv, const float *qkv, int64_t row_stride,
                       const float *qkv_bias, const int32_t *positions, const int64_t *slot_mapping,
                       const float *inv_freq, float mscale, enum rope_layout layout, int num_tokens,
                       int n_heads, const struct cuda_l2_hint *l2, int pdl, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
