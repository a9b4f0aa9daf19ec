/* step.h — the CUDA backend's glue kernels around the forward pass (kernels/step.cu):
 * unpacking one step's packed inputs into the fixed device buffers the forward and its
 * CUDA graphs read (resolving the one-step-lag tokens on the device), gathering rows,
 * and converting F32 activations to the 16-bit type of a cuBLAS GEMM.
 *
 * CPU twins: plain loops in tests/kernels/test_kernel_step.cu (the CPU backend has no use
 * for these ops). All pointers are device pointers; launchers enqueue on `stream`,
 * allocate nothing, launch nothing for empty work and return the launch's cudaError_t as
 * an int (cudaErrorInvalidValue for arguments they cannot run with). Safe to capture in a
 * CUDA graph. Any host thread that owns the stream may call them.
 */
#ifndef TESSERA_KERNELS_STEP_H
#define TESSERA_KERNELS_STEP_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "util/tensor.h"

/* One step's inputs as the host packed them (the staging buffer, copied to the device
 * with one cudaMemcpyAsync), and the fixed buffers to unpack them into.
 *
 * Rows past the real counts, up to the padded counts, are batch padding for a CUDA graph
 * captured at a larger batch: token 0, position 0, slot -1 (no KV write), seq_len 0
 * (the decode attention kernel gives a zero row), query_start continuing one row per
 * padding sequence, logits index = the row itself. */
struct step_unpack_args {
    /* packed inputs (device) */
    const int32_t *token_ids;      /* [num_tokens] ids, or -1 - k = the token sampled for row k of
                                      the previous step (BACKEND_TOKEN_PREV(k)) */
    const int32_t *positions;      /* [num_tokens] */
    const int64_t *slot_mapping;   /* [num_tokens] */
    const int32_t *query_start;    /* [num_seqs + 1] */
    const int32_t *seq_lens;       /* [num_seqs] */
    const int32_t *bt_start;       /* [num_seqs + 1] CSR offsets into bt_ids: sequence s owns
                                      bt_ids[bt_start[s], bt_start[s+1]) (its used blocks) */
    const int32_t *bt_ids;         /* block ids */
    const int32_t *logits_indices; /* [num_logits] */
    /* the previous step's sampled tokens: row k's at prev_tokens[k * prev_stride] (the token
       field of its struct sampling_output); an index k >= prev_count resolves to -1 */
    const int32_t *prev_tokens;
    int64_t prev_stride;           /* in int32 elements */
    int prev_count;
    int num_tokens, num_seqs, num_logits;
    int pad_tokens, pad_seqs, pad_logits; /* >= the counts above */
    /* outputs (the fixed device buffers) */
    int32_t *out_token_ids;        /* [pad_tokens] */
    int32_t *out_positions;        /* [pad_tokens] */
    int64_t *out_slot_mapping;     /* [pad_tokens] */
    int32_t *out_query_start;      /* [pad_seqs + 1] */
    int32_t *out_seq_lens;         /* [pad_seqs] */
    int32_t *out_block_tables;     /* [pad_seqs][max_blocks_per_seq]: entries past a sequence's
                                      used blocks are left as they were (never read) */
    int max_blocks_per_seq;
    int32_t *out_logits_indices;   /* [pad_logits] */
};

/* Unpacks one step (see struct step_unpack_args). A sequence with more blocks than
 * max_blocks_per_seq gets only the first max_blocks_per_seq (the host validates before). */
int cuda_step_unpack(const struct step_unpack_args *a, cudaStream_t stream);

/* out[i][:] = in[rows[i]][:] for i < num_rows, rows of dim floats. */
int cuda_gather_rows(float *out, const float *in, int64_t dim, const int32_t *rows, int num_rows,
                     cudaStream_t stream);

/* out[i] = in[i] rounded to nearest even in out_dtype (DT_F16 or DT_BF16), i < n. */
int cuda_convert_f32(void *out, enum dtype out_dtype, const float *in, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
