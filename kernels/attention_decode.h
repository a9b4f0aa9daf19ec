/* attention_decode.h — paged attention for decode steps on the GPU (one query row per
 * sequence), the CUDA twin of cpu_paged_attention (src/backend/cpu/ops.h) with
 * query_start = {0, 1, ..., num_seqs}.
 *
 * For sequence s and query head h (GQA: kv head h / (n_heads / n_kv_heads)):
 *   out[s][h] = softmax(q[s][h] . K[0 .. seq_lens[s])^T * scale) . V[0 .. seq_lens[s])
 * with K/V rows read from the paged pool through block_tables (position p lives in block
 * block_tables[s][p / block_size] at offset p % block_size), softmax in F32.
 *
 * Long contexts are split into partitions computed by different thread blocks
 * (flash-decoding); their partial results go to a caller-provided workspace and a second
 * kernel combines them. See kernels/attention_decode.cu and docs/kernels.md.
 *
 * Supported: head_dim 64, 96, 128; any n_heads / n_kv_heads ratio; block_size a power of
 * two >= 16; KV F16, BF16, FP8 e4m3 (k_scale / v_scale); out F32, F16, BF16. Anything else
 * returns cudaErrorInvalidValue without launching.
 */
#ifndef TESSERA_KERNELS_ATTENTION_DECODE_H
#define TESSERA_KERNELS_ATTENTION_DECODE_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/kv_dtype.h"
#include "util/tensor.h"

/* Bytes of workspace cuda_attention_decode needs for a batch of at most num_seqs
 * sequences whose seq_lens are all <= max_seq_len, with the same partition_size and
 * max_partitions arguments (0 = automatic). An upper bound for every partition count the
 * launcher can choose, so a backend sizes it once for its largest batch and context.
 * 0 when no split can happen. */
size_t cuda_attention_decode_workspace_size(int num_seqs, int n_heads, int head_dim,
                                            int max_seq_len, int partition_size, int max_partitions);

/* The automatic max_partitions for num_seqs sequences on a device of num_sms
 * multiprocessors, with the same head_rows as cuda_attention_decode: as many partitions
 * per sequence as still fit one wave of resident thread blocks (>= 1). A caller that
 * captures graphs computes it once per batch size. */
int cuda_attention_decode_max_partitions(int num_seqs, int n_heads, int n_kv_heads, int head_rows,
                                         int num_sms);

/* Decode attention over the paged KV pool (the new token's K/V already written there).
 *   out:          [num_seqs][n_heads][head_dim] of out_dtype (DT_F32, DT_F16, DT_BF16),
 *                 16-byte aligned
 *   q:            [num_seqs][q_stride] F32 (RoPE applied): query head h of sequence s at
 *                 q + s*q_stride + h*head_dim (q_stride = n_heads*head_dim when dense; the
 *                 fused QKV row length when q is read in place); 16-byte aligned,
 *                 q_stride a multiple of 4
 *   kv:           host struct (read during the call only); kv->data is the device pool
 *                 [num_blocks][2][n_kv_heads][block_size][head_dim], 16-byte aligned
 *   seq_lens:     [num_seqs] context length of each sequence, <= max_seq_len; a sequence
 *                 with seq_lens[s] <= 0 (batch padding) gets an all-zero output
 *   block_tables: [num_seqs][max_blocks_per_seq]; entries past ceil(seq_lens[s] /
 *                 block_size) are never read
 *   scale:        usually 1 / sqrt(head_dim)
 *   max_seq_len:  host-side bound on every seq_lens[s] (chooses the partitioning)
 *   partition_size: context positions per thread block, a multiple of 16 (0: 64);
 *                 max_partitions: the most thread blocks per sequence, kv head and head
 *                 group (0: cuda_attention_decode_max_partitions for this device). Each
 *                 sequence is split on its own into n = min(ceil(seq_lens[s] /
 *                 partition_size), P) partitions of one size, ceil(seq_lens[s] / n)
 *                 rounded up to 64 positions (16 if partition_size is not a multiple of
 *                 64): at most partition_size unless the cap binds, where
 *                 P = min(ceil(max_seq_len / partition_size), max_partitions)
 *   head_rows:    query heads per thread block: 8 (32x8x16 tensor-core fragments with
 *                 the heads as N) or 16 (16x16x16, the heads as M); 0: 8 when
 *                 n_heads / n_kv_heads <= 8, else 16. A group larger than head_rows
 *                 takes several thread blocks per kv head, each reading its K/V.
 *   workspace:    device memory, 16-byte aligned, >= cuda_attention_decode_workspace_size()
 *                 bytes (may be NULL when that is 0); scratch, overwritten
 *   qact:         NULL, or out quantized for the quantized GEMV of the O projection as
 *                 well: the bytes cuda_quantize_act(out, n_heads * head_dim, num_seqs,
 *                 qact) would write (kernels/quant_matmul.h), rows of padding sequences
 *                 included; needs out_dtype DT_F32, 16-byte aligned
 *   pdl:          non-zero: both kernels are programmatic dependent launches (common.cuh,
 *                 ts_pdl_wait)
 * All pointers except kv are device pointers. Asynchronous on stream; returns 0 or a
 * cudaError_t (cudaErrorInvalidValue for unsupported shapes, dtypes or a short
 * workspace). Safe to capture in a CUDA graph (no allocation, no synchronisation). */
int cuda_attention_decode(void *out, enum dtype out_dtype, const float *q, int64_t q_stride,
                          const struct kv_layer *kv, const int32_t *seq_lens,
                          const int32_t *block_tables, int max_blocks_per_seq, int num_seqs,
                          int n_heads, float scale, int max_seq_len, int partition_size,
                          int max_partitions, int head_rows, void *workspace, size_t workspace_bytes, void *qact,
                          int pdl, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
