/* attention_prefill.h — paged attention for prefill and chunked prefill on the GPU
 * (kernels/attention_prefill.cu): varlen causal queries over the paged KV cache,
 * flash-attention style on the tensor cores (ldmatrix + mma.sync, S and P in registers).
 *
 * The contract is cpu_paged_attention's (src/backend/cpu/ops.h), the CPU twin: sequence s
 * owns query rows [query_start[s], query_start[s+1]); its new tokens' K/V are already in
 * the pool (the RoPE + KV-write kernel ran first); after this step it holds seq_lens[s]
 * tokens, so query row i of s sees context positions [0, seq_lens[s] - (query_start[s+1] -
 * i) + 1) — a prefix from earlier chunks or the prefix cache included. Context position p
 * lives in block block_tables[s * max_blocks_per_seq + p / block_size] at offset
 * p % block_size. GQA: query head h reads kv head h / (n_heads / n_kv_heads).
 *   out = softmax(q k^T * scale) v, softmax in F32.
 * Any mix of sequences is correct (prefill chunks beside 1-row decode sequences), though
 * one-row sequences are faster through kernels/attention_decode.h: a decode-only step
 * calls that alone, and a mixed step that kernel for its leading one-row sequences and
 * this one for the rest (query_start then starts past row 0, below).
 *
 * Numerics: Q and the softmax probabilities P are rounded to the cache's 16-bit type (F16
 * for F16 and FP8 caches, BF16 for BF16 caches) to feed the tensor cores; everything else
 * (scores, softmax, the P·V accumulation) is F32. FP8 codes are exact in F16, and the
 * per-layer scales are applied in F32 (k_scale to the scores, v_scale to the output).
 *
 * Supported: head_dim 64, 96, 128; KV_F16, KV_BF16, KV_FP8_E4M3 (KV_F32 is not: use
 * the CPU backend's path); block_size a power of two (16 and 32 in practice); any
 * n_heads / n_kv_heads ratio; out dtype DT_F32, DT_F16, DT_BF16. q, out and kv->data
 * 16-byte aligned, q_stride a multiple of 4. Anything else returns cudaErrorInvalidValue
 * without launching. No workspace: query tiles find their sequence by a binary search of
 * query_start on the device.
 *
 * All pointers are device pointers except kv (the host-side view of the device pool; read
 * during the call only). Launches on stream; the caller's thread owns the stream.
 */
#ifndef TESSERA_KERNELS_ATTENTION_PREFILL_H
#define TESSERA_KERNELS_ATTENTION_PREFILL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inside the C linkage block: these util headers declare C functions (kv_dtype_size, ...)
 * without guards of their own */
#include "util/kv_dtype.h"
#include "util/tensor.h"

/* Causal varlen paged attention (see above). Returns 0 or a cudaError_t value.
 *   out:          [q0 + num_tokens][n_heads][head_dim] of out_dtype (DT_F32, DT_F16,
 *                 DT_BF16), q0 = query_start[0]
 *   q:            [q0 + num_tokens][q_stride], query head h of token t at q + t*q_stride +
 *                 h*head_dim (q_stride = n_heads*head_dim when dense; the fused QKV
 *                 buffer's row length when q is read in place)
 *   kv:           one layer's pool [num_blocks][2][n_kv_heads][block_size][head_dim]
 *   query_start:  [num_seqs + 1], query_start[num_seqs] <= q0 + num_tokens: the call
 *                 computes rows [q0, query_start[num_seqs]); rows before q0 (a step's
 *                 leading one-row sequences, computed by cuda_attention_decode: pass
 *                 query_start + k, seq_lens + k, block_tables + k * max_blocks_per_seq
 *                 and num_tokens = rows - q0) and past query_start[num_seqs] (batch
 *                 padding) are left unwritten
 *   seq_lens:     [num_seqs], seq_lens[s] >= query_start[s+1] - query_start[s]
 *   block_tables: [num_seqs][max_blocks_per_seq]
 * scale is usually 1/sqrt(head_dim). num_tokens == 0 launches nothing. */
int cuda_attention_prefill(void *out, enum dtype out_dtype, const float *q, int64_t q_stride,
                           const struct kv_layer *kv, const int32_t *query_start,
                           const int32_t *seq_lens, const int32_t *block_tables,
                           int max_blocks_per_seq, int num_seqs, int num_tokens, int n_heads,
                           float scale, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
