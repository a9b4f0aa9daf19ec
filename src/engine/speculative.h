/* speculative.h — n-gram speculative decoding (prompt lookup): its configuration and the
 * proposer.
 *
 * Speculation guesses a sequence's next tokens cheaply and lets one forward step check
 * several of them at once. The n-gram proposer guesses by looking back: when the last n
 * tokens of the context (prompt and output) also occur earlier, the tokens that followed
 * that earlier occurrence are proposed as the next ones. Code edits, summaries that quote,
 * retrieval answers and JSON that repeats keys hit often; free prose rarely.
 *
 * The scheduler (scheduler.h, "Speculative decoding") runs the proposal as extra rows of
 * the sequence's decode step, samples every row exactly as a decode step would (same
 * rule, same (seed, step) draw), and keeps the sampled tokens up to and including the
 * first one that differs from the proposal. With a proposal that is a single token, the
 * chance of keeping it is exactly its probability under the sampling rule, and a token
 * that differs is drawn from the rest — the speculative sampling of Leviathan et al.
 * (2023) for a point-mass draft — so outputs are the ones decoding one token per step
 * gives: the same greedy text, and the same text for a seeded request.
 *
 * Pure functions; no state, no allocation. Any thread.
 */
#ifndef TESSERA_ENGINE_SPECULATIVE_H
#define TESSERA_ENGINE_SPECULATIVE_H

#include <stddef.h>
#include <stdint.h>

#define SPEC_MAX_TOKENS 16 /* the most tokens proposed per sequence and step */
#define SPEC_MAX_NGRAM 64  /* the longest n-gram matched */
#define SPEC_MAX_BATCH_LIMIT 1048576

/* vLLM's speculative_config for method "ngram". num_tokens == 0: speculation off. */
struct spec_config {
    int num_tokens; /* num_speculative_tokens: proposed per sequence and step (1..SPEC_MAX_TOKENS) */
    int lookup_min; /* prompt_lookup_min: the shortest suffix that may match (1..lookup_max) */
    int lookup_max; /* prompt_lookup_max: the longest suffix tried (lookup_min..SPEC_MAX_NGRAM) */
    int disable_by_batch_size; /* > 0: nothing is proposed in a step while more sequences than
                                  this run (their rows cost compute a big batch has not got
                                  to spare); 0: no limit */
};

/* Parses vLLM's --speculative-config JSON text (NULL or "" = off: *out zeroed), e.g.
 * {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}. Keys:
 * method ("ngram", required), num_speculative_tokens (required), prompt_lookup_max,
 * prompt_lookup_min (as vLLM: neither given = 5 and 5; one given = the other too),
 * disable_by_batch_size (2..SPEC_MAX_BATCH_LIMIT).
 * Another method, an unknown key, a value of the wrong type or out of range: ERR_INVALID /
 * ERR_RANGE naming the key and what is accepted. */
int spec_config_parse(const char *json, struct spec_config *out, char *err, size_t errlen);

/* Checks a filled-in configuration (num_tokens 0: off, nothing else checked): 0, or
 * ERR_RANGE naming the field out of range. spec_config_parse's results pass; sched_create
 * runs it for callers that fill the struct themselves. */
int spec_config_check(const struct spec_config *c, char *err, size_t errlen);

/* Writes "ngram, 5 tokens, n-gram 1..4" (", up to 8 running" with disable_by_batch_size 8;
 * "off" when off) to buf. */
void spec_config_describe(const struct spec_config *c, char *buf, size_t cap);

/* The proposal for the context tokens[0, n): the longest suffix of length
 * lookup_min..lookup_max that occurs earlier in the context is looked up, and up to
 * max_tokens of the tokens that followed it (never past the context's end) are written to
 * out. Among occurrences of the longest suffix, the one followed by the most tokens (up to
 * max_tokens) wins, then the most recent. Returns their number, 0 when no suffix matches.
 * O(n · lookup_max) at worst. */
int spec_ngram_propose(const int32_t *tokens, int n, const struct spec_config *c, int max_tokens,
                       int32_t *out);

#endif
