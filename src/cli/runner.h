/* runner.h — drives ONE sequence through a backend (backend.h): the prompt in chunks,
 * then one token per step, each step's next token sampled by the backend with the
 * caller's sampler. Used by `generate` and `bench`. Owns the backend (sized for max_ctx
 * tokens of one sequence: ceil(max_ctx / block_size) KV blocks, used in order) and the
 * per-step batch arrays, all allocated in runner_create: feeding tokens does not
 * allocate. Single-threaded (the work inside runs on the backend).
 */
#ifndef TESSERA_CLI_RUNNER_H
#define TESSERA_CLI_RUNNER_H

#include "backend/backend.h"
#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

struct runner {
    const struct model *m;  /* borrowed */
    struct backend *be;
    int max_ctx;            /* tokens the sequence may hold */
    int chunk;              /* tokens per step while prefilling */
    int block_size;
    int len;                /* tokens fed so far */
    int32_t *block_table;   /* [ceil(max_ctx / block_size)] = 0, 1, 2, ... */
    int max_blocks;
    int32_t *positions;     /* [chunk] */
    int64_t *slots;         /* [chunk] */
};

/* Creates the backend of bc (device, KV dtype, threads, graphs; its sizes are set here)
 * for one sequence of up to max_ctx tokens fed in steps of up to chunk. */
int runner_create(struct runner *r, const struct model *m, const struct backend_config *bc, int max_ctx,
                  int chunk, char *err, size_t errlen);
void runner_free(struct runner *r);

/* Appends n tokens to the sequence (in steps of at most chunk tokens). With smp, the
 * last step also samples the next token with smp (read, not advanced: the caller calls
 * sampler_accept) into *token; ERR_RANGE when nothing can be sampled (NaN / -inf
 * logits). ERR_RANGE when the context would exceed max_ctx. */
int runner_feed(struct runner *r, const int32_t *ids, int n, struct sampler *smp, int32_t *token, char *err,
                size_t errlen);

/* Forgets the sequence: the next runner_feed starts again at position 0 and overwrites the
 * cache. The backend and its buffers are kept (allocated and already touched, as a server's
 * are between requests). */
static inline void runner_restart(struct runner *r) { r->len = 0; }

/* Tokens held so far. */
static inline int runner_len(const struct runner *r) { return r->len; }

#endif
