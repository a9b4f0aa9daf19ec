/* ops.h — the CPU twins of the transformer's non-matmul ops: RMSNorm, RoPE (both
 * layouts, with llama3/linear frequency scaling), softmax, SiLU·mul, KV-cache writes
 * and varlen paged attention (attention.c).
 *
 * Every op is stateless: it takes plain arrays, positions, slot mappings and block
 * tables, and owns no memory. These are the references future CUDA kernels are tested
 * against (same arguments, `cuda_<op>` vs `cpu_<op>`), so each contract below is the
 * specification. Shapes are written outermost first: q [num_tokens][n_heads][head_dim]
 * means head_dim is contiguous. Matmuls live in quant.h (weights stay quantized).
 *
 * The KV pool layout (one pool per layer):
 *   [num_blocks][2 (k, v)][n_kv_heads][block_size][head_dim]
 * so that for one (block, kv head) the block_size key rows are contiguous head_dim
 * vectors: the attention loop streams them with unit stride, and a block of one layer
 * is one contiguous chunk (copy/swap of a block is one memcpy).
 */
#ifndef TESSERA_BACKEND_CPU_OPS_H
#define TESSERA_BACKEND_CPU_OPS_H

#include "util/kv_dtype.h"
#include "util/rope.h"
#include "util/threadpool.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- KV cache storage ---------------------------------------------------------------- */

/* ---- elementwise / row ops ----------------------------------------------------------- */

/* RMSNorm of each row: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w
 *   x, out: [num_rows][n] (may alias), w: [n] */
void cpu_rmsnorm(float *out, const float *x, const float *w, int num_rows, int n, float eps);

/* In place: x[i] = exp(x[i] - max) / sum, in F32 with max subtraction. n >= 1. */
void cpu_softmax(float *x, int n);

/* out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]; may alias. */
void cpu_silu_mul(float *out, const float *gate, const float *up, int64_t n);

/* y[i] += x[i] (the residual add). */
void cpu_add(float *y, const float *x, int64_t n);

/* ---- rotary position embedding ------------------------------------------------------- */

/* In place: rotate every head of token t by angle positions[t] * inv_freq[i].
 *   x: [num_tokens][n_heads][head_dim], head_dim even and <= 1024
 *   NORMAL pairs (x[2i], x[2i+1]); NEOX pairs (x[i], x[i + head_dim/2]); both use
 *   (a, b) -> (a cos - b sin, a sin + b cos). */
void cpu_rope(float *x, const int32_t *positions, int num_tokens, int n_heads, int head_dim,
              const float *inv_freq, enum rope_layout layout);

/* cpu_rope in two steps, so a forward pass computes the angles once for all its layers:
 *   cpu_rope_angles: cs[t][i] = cos(positions[t] * inv_freq[i]), sn likewise with sin, for
 *     i < head_dim / 2 (evaluated in double, rounded once to float);
 *   cpu_rope_rotate: x rotated by those angles, bitwise what cpu_rope gives. */
void cpu_rope_angles(float *cs, float *sn, const int32_t *positions, int num_tokens, int head_dim,
                     const float *inv_freq);
void cpu_rope_rotate(float *x, const float *cs, const float *sn, int num_tokens, int n_heads, int head_dim,
                     enum rope_layout layout);

/* ---- KV cache write (vLLM's reshape_and_cache) ---------------------------------------- */

/* Stores token t's K and V rows in slot slot_mapping[t] (= block * block_size + offset) of
 * the pool, converting to the pool's dtype; slot < 0 skips the token (padding).
 *   k, v: [num_tokens][n_kv_heads][head_dim] f32 */
void cpu_kv_write(const struct kv_layer *kv, const float *k, const float *v,
                  const int64_t *slot_mapping, int num_tokens);

/* ---- paged attention ------------------------------------------------------------------ */

/* Varlen causal attention over a paged KV pool (the new tokens' K/V are already written).
 * Sequence s owns query rows [query_start[s], query_start[s+1]); after this step it holds
 * seq_lens[s] tokens, the last of which is its last query row, so query row i (in seq s)
 * sees context positions [0, seq_lens[s] - (query_start[s+1] - i) + 1). Context position
 * p lives in block block_tables[s * max_blocks_per_seq + p / block_size] at offset
 * p % block_size. GQA: query head h reads kv head h / (n_heads / n_kv_heads).
 *   out = softmax(q k^T * scale) v, in F32 (online softmax: running max and sum).
 * head_dim <= 1024 (the loader's bound), n_heads a multiple of n_kv_heads.
 *
 * Blocked, flash-style (attention.c): tiles of query tokens x one GQA group's heads walk
 * the context 16 keys at a time; memory is O(tile), not O(context).
 * Batch invariant: each output row is bitwise the same whatever else is in the call
 * (other tokens of its prompt, chunking of the prefill, other sequences, thread count);
 * decode and prefill run the same arithmetic per row.
 * Parallel over (sequence, kv head, query tile) units; scratch holds
 * cpu_paged_attention_scratch_floats(nth, max_ctx) floats for nth threads (a fixed
 * per-thread tile area: max_ctx no longer changes it). */
struct paged_attention_args {
    float *out;                 /* [num_tokens][n_heads][head_dim] */
    const float *q;             /* [num_tokens][n_heads][head_dim] */
    const struct kv_layer *kv;
    const int32_t *query_start; /* [num_seqs + 1], query_start[0] = 0, [num_seqs] = num_tokens */
    const int32_t *seq_lens;    /* [num_seqs] */
    const int32_t *block_tables;/* [num_seqs][max_blocks_per_seq] */
    int max_blocks_per_seq;
    int num_seqs;
    int num_tokens;
    int n_heads;
    float scale;                /* usually 1/sqrt(head_dim) */
    float *scratch;             /* cpu_paged_attention_scratch_floats(nth, max_ctx) floats */
    int max_ctx;                /* bounds every seq_lens[s] */
};

/* Scratch floats for n_threads threads (>= 1 used when <= 0); max_ctx is accepted for
 * callers that size by context, the blocked kernel does not need it. */
size_t cpu_paged_attention_scratch_floats(int n_threads, int max_ctx);
/* tp may be NULL (runs on the caller). Called by the forward's thread only. */
void cpu_paged_attention(struct threadpool *tp, const struct paged_attention_args *a);

/* ---- small vector kernels (SIMD), exposed for the forward and tests ------------------- */

float cpu_dot_f32(const float *a, const float *b, int n);
float cpu_dot_f16(const float *a, const uint16_t *b, int n);
/* y[i] += a * x[i] */
void cpu_axpy_f32(float *y, float a, const float *x, int n);
void cpu_axpy_f16(float *y, float a, const uint16_t *x, int n);
float cpu_dot_bf16(const float *a, const uint16_t *b, int n);
void cpu_axpy_bf16(float *y, float a, const uint16_t *x, int n);
/* the same over e4m3fn codes (their decoded values; the caller applies the scale) */
float cpu_dot_fp8(const float *a, const uint8_t *b, int n);
void cpu_axpy_fp8(float *y, float a, const uint8_t *x, int n);

#ifdef __cplusplus
}
#endif

#endif
