/* sampler.h — turns one row of logits into a token id.
 *
 * Pipeline, in the order vLLM / llama.cpp apply it: logit bias → repetition, presence
 * and frequency penalties (over the tokens seen so far) → greedy if temperature == 0,
 * else temperature → top-k → top-p → min-p → sample from the renormalised distribution
 * with the sampler's own RNG (seeded: the same seed, logits and history give the same
 * token on any machine). A struct sampler owns its RNG state and preallocated scratch
 * sized for the vocabulary, so sampling does not allocate. One sampler per sequence;
 * not shared between threads.
 */
#ifndef TESSERA_SAMPLER_H
#define TESSERA_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sampler_params {
    float temperature;        /* 0 = greedy (argmax, lowest id wins ties) */
    int top_k;                /* <= 0: off */
    float top_p;              /* 1.0: off; (0, 1] */
    float min_p;              /* 0: off; [0, 1] */
    float repetition_penalty; /* 1.0: off; > 0. Divides positive / multiplies negative logits of seen tokens */
    float presence_penalty;   /* 0: off; subtracted once per seen token */
    float frequency_penalty;  /* 0: off; subtracted per occurrence */
    uint64_t seed;
};

/* Defaults: temperature 1, top_k off, top_p 1, min_p 0, penalties off, seed 0. */
void sampler_params_default(struct sampler_params *p);
/* Checks ranges; writes the offending parameter's name and reason to err. */
int sampler_params_validate(const struct sampler_params *p, char *err, size_t errlen);

struct sampler;

/* Creates a sampler for vocab_size logits. NULL on allocation failure. */
struct sampler *sampler_create(const struct sampler_params *p, int vocab_size);
void sampler_free(struct sampler *s);
/* Restarts the RNG and the history (for reuse across requests). */
void sampler_reset(struct sampler *s, const struct sampler_params *p);
/* Records a token as seen (prompt tokens, if penalties should count them, and each
 * generated token). */
void sampler_accept(struct sampler *s, int32_t token);
/* Samples from logits[vocab_size] (modified in place). Returns the token id. */
int32_t sampler_sample(struct sampler *s, float *logits);

#endif
