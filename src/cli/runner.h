/* runner.h — drives ONE sequence through the forward pass: the prompt in chunks, then
 * one token per step. Used by `generate` and `bench` until the continuous-batching
 * engine takes over. Owns the forward state, the KV cache (sized for max_ctx tokens)
 * and the per-step batch arrays, all allocated in runner_create: feeding tokens does not
 * allocate. Single-threaded (the work inside runs on the forward's thread pool).
 */
#ifndef TESSERA_CLI_RUNNER_H
#define TESSERA_CLI_RUNNER_H

#include "util/kv_dtype.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

struct runner {
    const struct model *m;  /* borrowed */
    struct forward_state *fs;
    struct kv_cache *kv;
    struct kv_seq seq;
    int max_ctx;            /* tokens the sequence may hold */
    int chunk;              /* tokens per forward step while prefilling */
    int32_t *positions;     /* [chunk] */
    int64_t *slots;         /* [chunk] */
};

int runner_create(struct runner *r, const struct model *m, int max_ctx, int chunk, int n_threads,
                  enum kv_dtype kv_dtype, char *err, size_t errlen);
void runner_free(struct runner *r);

/* Appends n tokens to the sequence (in steps of at most chunk tokens) and returns the
 * logits row of the last one in *logits (valid until the next call; the caller may
 * modify it). ERR_RANGE when the context would exceed max_ctx. */
int runner_feed(struct runner *r, const int32_t *ids, int n, float **logits, char *err,
                size_t errlen);

/* Tokens held so far. */
static inline int runner_len(const struct runner *r) { return r->seq.len; }

#endif
