/* ops_fused.h — CPU twins of the fused row-wise CUDA kernels (kernels/norm.h, rope.h,
 * activation.h): the same arguments as cuda_<op> without the stream, on host pointers.
 *
 * Each is a plain loop over the CPU backend's ops (ops.h) — cpu_rmsnorm's formula,
 * cpu_rope, cpu_kv_write, cpu_silu_mul — so both backends compute the same function; the
 * kernel tests (tests/kernels/test_kernel_{norm,rope,activation}.cu) compare each kernel
 * with its twin. Stateless; no allocation; any thread.
 *
 * The data contract the CUDA backend chains: the residual stream is F32; linear layers
 * output F32; their inputs ("activations", produced here) are DT_F32, DT_F16 or DT_BF16,
 * rounded to nearest even once from the F32 result.
 */
#ifndef TESSERA_BACKEND_CPU_OPS_FUSED_H
#define TESSERA_BACKEND_CPU_OPS_FUSED_H

#include "util/kv_dtype.h"
#include "util/rope.h"
#include "util/tensor.h"

#include <stdint.h>

/* Per row r: if delta != NULL, residual[r] += delta[r] (in place); then
 *   out[r] = residual[r] / sqrt(mean(residual[r]^2) + eps) * w     (cpu_rmsnorm's formula)
 * in out_dtype (DT_F32, DT_F16, DT_BF16). Returns 0, or ERR_INVALID for another dtype.
 *   out: [num_rows][dim] of out_dtype; residual, delta: [num_rows][dim] F32; w: [dim] F32 */
int cpu_rmsnorm_residual(void *out, enum dtype out_dtype, float *residual, const float *delta,
                         const float *w, int num_rows, int dim, float eps);

/* In place on the fused QKV rows: cpu_rmsnorm of every q head with q_norm and of every k
 * head with k_norm (Qwen3), v untouched.
 *   qkv: [num_tokens][row_stride] F32, q heads at column 0, k heads at n_heads*head_dim
 *   q_norm, k_norm: [head_dim] F32 */
int cpu_head_rmsnorm(float *qkv, int64_t row_stride, const float *q_norm, const float *k_norm,
                     int num_tokens, int n_heads, int n_kv_heads, int head_dim, float eps);

/* Most n_kv_heads * head_dim cpu_rope_kv_write takes (its per-token K/V rows live on the
 * stack). */
#define ROPE_KV_ROW_MAX 8192

/* RoPE fused with the KV-cache write (vLLM's rotary_embedding + reshape_and_cache). For
 * token t, with row = qkv[t] (+ qkv_bias when not NULL):
 *   q_out[t] = rope(row q heads)                     cpu_rope, then * mscale if != 1
 *   k = rope(row k heads) (* mscale), v = row v heads
 *   cpu_kv_write(kv, k, v, slot_mapping[t])          skipped when slot_mapping[t] < 0
 * The angle is positions[t] * inv_freq[i] (inv_freq from rope_inv_freq, util/rope.h, so
 * linear / llama3 scaling are in it); mscale is YaRN's factor on cos and sin (1 otherwise).
 * n_kv_heads and head_dim come from kv. Returns 0, or ERR_INVALID (odd head_dim, head_dim >
 * 1024, n_kv_heads * head_dim > ROPE_KV_ROW_MAX, unknown kv dtype).
 *   q_out:        [num_tokens][n_heads][head_dim] F32
 *   qkv:          [num_tokens][row_stride] F32: q [n_heads][head_dim] | k [n_kv_heads][head_dim]
 *                 | v [n_kv_heads][head_dim]
 *   qkv_bias:     [(n_heads + 2 * n_kv_heads) * head_dim] F32 or NULL
 *   positions:    [num_tokens];  slot_mapping: [num_tokens] (-1: padding)
 *   inv_freq:     [head_dim / 2] */
int cpu_rope_kv_write(float *q_out, const struct kv_layer *kv, const float *qkv, int64_t row_stride,
                      const float *qkv_bias, const int32_t *positions, const int64_t *slot_mapping,
                      const float *inv_freq, float mscale, enum rope_layout layout, int num_tokens,
                      int n_heads);

/* out[t][i] = silu(gate[t][i]) * up[t][i] (cpu_silu_mul) in out_dtype (DT_F32, DT_F16,
 * DT_BF16), where gate and up rows are in_stride floats apart: for the fused gate/up GEMM
 * output [num_tokens][2 * ffn], gate = gu, up = gu + ffn, in_stride = 2 * ffn.
 * Returns 0, or ERR_INVALID for another dtype.
 *   out: [num_tokens][ffn] of out_dtype; gate, up: [num_tokens][in_stride] F32 */
int cpu_silu_mul_rows(void *out, enum dtype out_dtype, const float *gate, const float *up,
                      int64_t in_stride, int num_tokens, int ffn);

#endif
