/* sampler.h — turns one row of logits into a token id.
 *
 * Pipeline, in the order vLLM / llama.cpp apply it: logit bias → repetition, presence
 * and frequency penalties (over the tokens seen so far) → greedy if temperature == 0,
 * else temperature → top-k → top-p → min-p → draw. The rule is defined exactly in
 * docs/sampling.md and computed with the bit-exact arithmetic of sampler/exact.h, which
 * the CUDA kernel (kernels/sampling.cu) shares: for the same logits, parameters, history,
 * seed and step, both backends pick the same token. The draw is keyed by (seed, step) —
 * step = the number of tokens accepted so far — through the counter-based Philox4x32-10
 * generator (sampler/philox.h), so a token never depends on batch composition, thread
 * count, preemption or backend. A struct sampler owns its step counter and preallocated
 * scratch sized for the vocabulary (about 28 bytes per vocabulary entry), so sampling
 * does not allocate. One sampler per sequence; not shared between threads (any thread
 * may use it, one at a time).
 *
 * History: sampler_accept_prompt() records prompt tokens, which count for the
 * repetition penalty only; sampler_accept() records generated tokens, which count for
 * all three penalties (vLLM's convention; OpenAI's presence/frequency penalties are
 * defined over the completion), and advances the step.
 *
 * Logprobs: sampler_logprobs() is a pure function over the *raw* model logits (before
 * bias, penalties and temperature — vLLM's default "raw_logprobs"; OpenAI's logprobs do
 * not depend on temperature either). sampler_sample() restores logits[] before it
 * returns, so the engine calls sampler_sample() then sampler_logprobs() on the same row.
 */
#ifndef TESSERA_SAMPLER_H
#define TESSERA_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SAMPLER_MAX_LOGIT_BIAS 300  /* OpenAI's limit on logit_bias entries */
#define SAMPLER_MAX_TOP_LOGPROBS 20 /* OpenAI's limit on top_logprobs */

struct sampler_params {
    float temperature;        /* 0 = greedy (argmax, lowest id wins ties); else finite > 0 */
    int top_k;                /* <= 0 or >= vocab_size: off */
    float top_p;              /* 1.0: off; (0, 1] */
    float min_p;              /* 0: off; [0, 1] */
    float repetition_penalty; /* 1.0: off; > 0. Divides positive / multiplies negative logits
                                 of tokens seen in the prompt or the output */
    float presence_penalty;   /* 0: off; [-2, 2]; subtracted once per token seen in the output */
    float frequency_penalty;  /* 0: off; [-2, 2]; subtracted per occurrence in the output */
    uint64_t seed;            /* draw seed; the API layer picks one when a request has none */
};

/* Defaults: temperature 1, top_k off, top_p 1, min_p 0, penalties off, seed 0. */
void sampler_params_default(struct sampler_params *p);
/* Checks ranges; returns 0 or ERR_RANGE and writes the offending parameter's name and
 * reason to err (caller-owned, may be NULL). */
int sampler_params_validate(const struct sampler_params *p, char *err, size_t errlen);

struct sampler;

/* Creates a sampler for vocab_size logits, with p copied (p must pass
 * sampler_params_validate). Allocates everything sampling will need. NULL on allocation
 * failure, vocab_size <= 0 or invalid p. The caller owns the result (sampler_free). */
struct sampler *sampler_create(const struct sampler_params *p, int vocab_size);
/* Frees s and its scratch; NULL is a no-op. */
void sampler_free(struct sampler *s);
/* Reuse across requests: copies p (if not NULL; must be valid), restarts the step at 0,
 * clears the history (O(tokens seen), not O(vocab)) and the logit bias. */
void sampler_reset(struct sampler *s, const struct sampler_params *p);
/* Replaces the logit bias with n entries: bias[i] is added to logits[ids[i]] before the
 * penalties (OpenAI's logit_bias). A repeated id adds up: its values are summed in the
 * given order and the sum is added once. -INFINITY bans a token. The arrays are copied.
 * Returns 0, or ERR_RANGE (n outside [0, SAMPLER_MAX_LOGIT_BIAS], an id outside
 * [0, vocab_size)) or ERR_INVALID (NULL arrays with n > 0, a NaN or +inf bias), leaving
 * the previous bias in place. n == 0 clears it. */
int sampler_set_logit_bias(struct sampler *s, const int32_t *ids, const float *bias, int n);
/* Records n prompt tokens: they count for the repetition penalty only. Ids outside
 * [0, vocab_size) are ignored. */
void sampler_accept_prompt(struct sampler *s, const int32_t *tokens, int n);
/* Records a generated token: it counts for the repetition, presence and frequency
 * penalties, and the step advances by one (the next draw uses fresh random bits). Call
 * it with each token sampler_sample returned (or that the engine forced). An id outside
 * [0, vocab_size) is not recorded, but the step still advances. */
void sampler_accept(struct sampler *s, int32_t token);
/* Samples from logits[vocab_size] with the current step's random bits: calling it again
 * without sampler_accept returns the same token. Returns the token id, or ERR_RANGE
 * (negative) when no token can be sampled (every logit -inf or NaN after the bias). NaN
 * logits are never chosen. With a +inf logit (after bias and penalties) the lowest such
 * id is returned. logits[] is used as scratch for the bias and penalties and holds
 * exactly its input values again on return. Does not record the token (see
 * sampler_accept). No allocation. */
int32_t sampler_sample(struct sampler *s, float *logits);
/* sampler_sample with a token mask (constrained decoding): mask is NULL (= sampler_sample)
 * or [(vocab_size + 31) / 32] words, bit id % 32 of word id / 32 set = id allowed. A
 * clear bit bans the token exactly as a -inf logit bias would: applied right after the
 * logit bias, before the penalties, so a banned token is never drawn and ERR_RANGE means
 * nothing allowed is samplable. logits[] is restored; logprobs stay raw (unmasked). */
int32_t sampler_sample_masked(struct sampler *s, float *logits, const uint32_t *mask);
/* The most tokens a draw may look ahead (sampler_sample_ahead, sampler_history_ahead). */
#define SAMPLER_MAX_AHEAD 16

/* sampler_sample_masked as it would draw after the `ahead` tokens prior[0, ahead) were
 * accepted: with the random bits of step sampler_step(s) + ahead, and those tokens
 * counted for the penalties as generated ones — for a speculative row that checks a
 * proposed token (engine/speculative.h). prior NULL: none counted (the same draw where no
 * penalty applies). s is as before on return. ahead 0 is sampler_sample_masked; ahead
 * above SAMPLER_MAX_AHEAD with prior is ERR_INVALID. No allocation. */
int32_t sampler_sample_ahead(struct sampler *s, float *logits, const uint32_t *mask, uint32_t ahead,
                             const int32_t *prior);
/* The distribution sampler_sample would draw from next, without drawing: writes the
 * support's ids and normalised probabilities (in no particular order) into the caller's
 * ids[vocab_size] / probs[vocab_size] and returns its size (1 when greedy), or ERR_RANGE
 * / ERR_INVALID as sampler_sample. The probabilities are the integer weights of the rule
 * divided by their sum (exact to float rounding). Draws nothing. logits[] is restored. For
 * tests, and for speculative decoding (which needs the target distribution). No
 * allocation. */
int sampler_probs(struct sampler *s, float *logits, int32_t *ids, float *probs);
/* sampler_probs under a token mask (NULL: none; layout and meaning as in
 * sampler_sample_masked): the distribution sampler_sample_masked draws from. */
int sampler_probs_masked(struct sampler *s, float *logits, const uint32_t *mask, int32_t *ids,
                         float *probs);

/* Applies the logit bias and the penalties to logits[vocab_size] in place — the first
 * steps of sampler_sample — and leaves them applied. For tests and for a future
 * "processed logprobs" mode; sampling does not need it. */
void sampler_process_logits(struct sampler *s, float *logits);

/* The state a device sampler (kernels/sampling.h) needs per row, read from s (the CUDA
 * backend keeps one struct sampler per sequence, as the CPU backend does):
 *   sampler_step          the step the next draw uses (tokens accepted since create/reset);
 *   sampler_history_len   the number of distinct tokens seen (prompt or output);
 *   sampler_history       writes them to the caller's ids[len] / info[len]: info =
 *                         SMP_PROMPT_FLAG (bit 31) if seen in the prompt | output count
 *                         (sampler/exact.h), ids unique, in first-seen order;
 *   sampler_logit_bias    writes the logit bias, repeated ids merged (unique ids), to the
 *                         caller's ids / vals [SAMPLER_MAX_LOGIT_BIAS] and returns its size.
 * Any thread that may use s; O(tokens seen). */
uint64_t sampler_step(const struct sampler *s);
/* The parameters s samples with (owned by s; valid until sampler_reset or sampler_free). */
const struct sampler_params *sampler_get_params(const struct sampler *s);
/* Sets the step the next draw uses (restoring a sequence's sampler; the kernel test's
 * twin, which takes the step as data). */
void sampler_set_step(struct sampler *s, uint64_t step);
int sampler_history_len(const struct sampler *s);
void sampler_history(const struct sampler *s, int32_t *ids, uint32_t *info);
/* sampler_history as it would be after the n tokens prior[0, n) were accepted (the
 * speculative rows' history, see sampler_sample_ahead): ids[] and info[] must hold
 * sampler_history_len(s) + n entries. Returns the number written. */
int sampler_history_ahead(const struct sampler *s, const int32_t *prior, int n, int32_t *ids, uint32_t *info);
int sampler_logit_bias(const struct sampler *s, int32_t *ids, float *vals);

/* Log-softmax of the raw logits[vocab_size] (caller-owned, read only; normally the row
 * just given to sampler_sample): writes the log-probability of `token` to *token_logprob
 * and the n_top (0..SAMPLER_MAX_TOP_LOGPROBS) most likely tokens, most likely first (lowest
 * id first among equals), to the caller's top_ids[n_top] / top_logprobs[n_top] (may be
 * NULL when n_top == 0). NaN and -inf logits get logprob -inf and are never listed. Returns
 * the number of entries written (< n_top only when fewer tokens have finite logits), or
 * ERR_INVALID (bad argument) / ERR_RANGE (no finite logit, or a +inf one). Pure; any
 * thread; no allocation; O(vocab_size). */
int sampler_logprobs(const float *logits, int vocab_size, int32_t token, int n_top,
                     int32_t *top_ids, float *top_logprobs, float *token_logprob);

#ifdef __cplusplus
}
#endif

#endif
