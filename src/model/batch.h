/* batch.h — one forward step's work, as flat arrays (ARCHITECTURE.md "Batch").
 *
 * The same struct drives the CPU forward and (later) the CUDA backend. Tokens of a
 * sequence are consecutive rows; sequences may mix prefill chunks and single decode
 * tokens. The batch only borrows its arrays: the engine (or a test / CLI) owns them.
 *
 * Invariants model_forward checks (ERR_INVALID otherwise):
 *   query_start[0] = 0, non-decreasing, query_start[num_seqs] = num_tokens;
 *   n_new(s) = query_start[s+1] - query_start[s] <= seq_lens[s];
 *   the new tokens of s sit at positions seq_lens[s] - n_new(s) .. seq_lens[s] - 1,
 *   and positions[i] equals that position (RoPE uses positions; attention uses seq_lens);
 *   block_tables[s][0 .. ceil(seq_lens[s] / block_size)) are valid block ids;
 *   slot_mapping[i] = block_tables[s][pos / block_size] * block_size + pos % block_size,
 *   or -1 to skip storing row i (padding);
 *   logits_indices are row indices < num_tokens, at most num_tokens of them (a sequence may
 *   have several: prompt logprobs score its prompt rows; the scheduler lists them in
 *   increasing order).
 */
#ifndef TESSERA_MODEL_BATCH_H
#define TESSERA_MODEL_BATCH_H

#include <stdint.h>

struct batch {
    int num_tokens;
    int num_seqs;
    const int32_t *token_ids;     /* [num_tokens] */
    const int32_t *positions;     /* [num_tokens] position of each token in its sequence */
    const int64_t *slot_mapping;  /* [num_tokens] KV slot = block * block_size + offset, -1 skip */
    const int32_t *query_start;   /* [num_seqs + 1] first row of each sequence */
    const int32_t *seq_lens;      /* [num_seqs] context length after this step */
    const int32_t *block_tables;  /* [num_seqs][max_blocks_per_seq] physical block ids */
    int max_blocks_per_seq;
    int num_logits;
    const int32_t *logits_indices;/* [num_logits] rows whose logits are computed, in order */
};

#endif
