/* sampling.h — sampling on the device (kernels/sampling.cu): one token per row of logits,
 * by tessera's sampling rule (docs/sampling.md), plus raw logprobs; or, on a scoring row,
 * the raw logprob of a given token (prompt logprobs).
 *
 * For the same raw logits, parameters, penalty history, logit bias, token mask, seed and
 * step, the kernel picks exactly the token the CPU sampler picks (src/sampler/sampler.h): both
 * compute the rule with the bit-exact arithmetic of src/sampler/exact.h and the counter-
 * based Philox4x32-10 generator (src/sampler/philox.h), so a token does not depend on the
 * backend, the batch or the thread count. CPU twin: sampler_sample_masked + sampler_logprobs
 * on a struct sampler holding the same history, bias and step, or sampler_logprobs alone
 * for a scoring row (tests/kernels/test_kernel_sampling.cu wraps them with this launcher's
 * arguments as cpu_sampling).
 *
 * All pointers are device pointers; the launcher enqueues one kernel on `stream`,
 * allocates nothing and returns the launch's cudaError_t as an int (0 = success;
 * cudaErrorInvalidValue for arguments it cannot run with). Per-row problems (invalid
 * parameters, malformed CSR data, nothing samplable, a score_token out of range) do not
 * fail the launch: they are reported in that row's sampling_output.status, and the other
 * rows are sampled. Any host thread that owns the stream may call it.
 */
#ifndef TESSERA_KERNELS_SAMPLING_H
#define TESSERA_KERNELS_SAMPLING_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SAMPLING_MAX_TOP_LOGPROBS 20 /* = SAMPLER_MAX_TOP_LOGPROBS */
#define SAMPLING_MAX_BIAS 512        /* logit-bias entries per row (OpenAI allows 300) */
#define SAMPLING_MAX_VOCAB 262144    /* the per-row bitmap of modified ids lives in shared memory */

/* Per-row parameters (a device array, one per row). The fields and their ranges are
 * struct sampler_params' (sampler_params_validate); a row outside them gets
 * SAMPLING_ERR_PARAMS.
 *
 * A scoring row (score != 0; prompt logprobs) samples nothing: its token is score_token,
 * with that token's raw logprob and max(n_logprobs, 0) top ones, exactly as
 * sampler_logprobs gives them. Only n_logprobs and score_token are read: the sampling
 * parameters, the penalties, the bias and the token mask are neither applied nor checked.
 * A score_token outside [0, vocab) gets SAMPLING_ERR_TARGET. */
struct sampling_params {
    float temperature;        /* 0: greedy (argmax, lowest id wins ties); else finite > 0 */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1]; 0: off */
    float repetition_penalty; /* finite > 0; 1: off */
    float presence_penalty;   /* [-2, 2]; 0: off */
    float frequency_penalty;  /* [-2, 2]; 0: off */
    int32_t top_k;            /* <= 0 or >= the number of samplable tokens: off */
    int32_t n_logprobs;       /* -1: none; 0..20: the token's raw logprob and that many top ones */
    int32_t score;            /* 0: sample; 1: a scoring row (above) */
    int32_t score_token;      /* scoring rows: the token to score */
    uint64_t seed;
    uint64_t step;            /* tokens this sequence has generated so far (sampler_step) */
};

enum sampling_status {
    SAMPLING_OK = 0,
    SAMPLING_ERR_NO_TOKEN = 1, /* every logit -inf or NaN after the bias and the mask
                                  (sampler: ERR_RANGE) */
    SAMPLING_ERR_PARAMS = 2,   /* a parameter outside its range */
    SAMPLING_ERR_INPUT = 3,    /* CSR data: an id out of range or repeated, a NaN or +inf
                                  bias, more than SAMPLING_MAX_BIAS bias entries */
    SAMPLING_ERR_TARGET = 4,   /* a scoring row's score_token outside [0, vocab) */
};

/* Per-row result. Every field is written, whatever the status. */
struct sampling_output {
    int32_t token;  /* the sampled id (a scoring row: score_token); -1 unless status ==
                       SAMPLING_OK */
    int32_t status; /* enum sampling_status */
    float logprob;  /* raw logprob of token (sampler_logprobs); -inf when not requested,
                       when the token's raw logit is -inf/NaN, or when the raw row has no
                       finite logit or a +inf one */
    int32_t n_top;  /* entries in top_ids / top_logprobs: min(n_logprobs, finite raw logits);
                       0 when not requested or unavailable (as above) */
    int32_t rank;   /* scoring rows with status SAMPLING_OK: the number of ids whose raw
                       logit is >= score_token's (itself included; NaN never counts);
                       0 for sampled rows */
    int32_t top_ids[SAMPLING_MAX_TOP_LOGPROBS];    /* most likely first, lower id first among
                                                      equal logits; -1 past n_top */
    float top_logprobs[SAMPLING_MAX_TOP_LOGPROBS]; /* -inf past n_top */
};

/* Samples one token per row r < num_rows from logits + r * row_stride.
 *   logits:     [num_rows][row_stride] F32, the first vocab entries of each row are the
 *               raw model logits (row_stride >= vocab; 16-byte aligned rows take the
 *               vectorised path)
 *   params:     [num_rows]
 *   pen_start:  [num_rows + 1] CSR offsets into pen_ids / pen_info, or NULL (no penalties)
 *   pen_ids:    [pen_start[num_rows]] token ids, unique within a row: the tokens seen in
 *               the prompt or the output (sampler_history)
 *   pen_info:   [pen_start[num_rows]] bit 31 = seen in the prompt, bits 0-30 = times
 *               generated (SMP_PROMPT_FLAG | count, src/sampler/exact.h)
 *   bias_start: [num_rows + 1] CSR offsets into bias_ids / bias_vals, or NULL (no bias)
 *   bias_ids:   [bias_start[num_rows]] token ids, unique within a row (repeated request
 *               ids summed first: sampler_logit_bias)
 *   bias_vals:  [bias_start[num_rows]] added to the raw logit; -inf bans a token
 *   mask_row:   [num_rows] index into masks of row r's token mask, or -1 (no mask); or
 *               NULL (no row has a mask). Indices must be < the number of masks given
 *   masks:      [num_masks][(vocab + 31) / 32] token masks (constrained decoding): bit
 *               id % 32 of word id / 32 set = id allowed. A clear bit bans the token as
 *               a -inf bias would, applied after the bias and before the penalties
 *               (sampler_sample_masked); logprobs stay raw. Bits past vocab are ignored
 *   out:        [num_rows]
 * vocab in [1, SAMPLING_MAX_VOCAB]. No workspace: one CTA of 512 threads per row, with
 * up to ~120 KiB of dynamic shared memory (the launcher raises the kernel's limit). */
int cuda_sampling(const float *logits, int64_t row_stride, int num_rows, int vocab,
                  const struct sampling_params *params, const int32_t *pen_start,
                  const int32_t *pen_ids, const uint32_t *pen_info, const int32_t *bias_start,
                  const int32_t *bias_ids, const float *bias_vals, const int32_t *mask_row,
                  const uint32_t *masks, struct sampling_output *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
