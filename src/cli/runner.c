/* runner.c — see runner.h. */
#include "cli/runner.h"
#include "util/err.h"

#include <stdlib.h>
#include <string.h>

int runner_create(struct runner *r, const struct model *m, const struct backend_config *bc, int max_ctx,
                  int chunk, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->m = m;
    r->max_ctx = max_ctx;
    r->chunk = chunk;
    r->block_size = KV_DEFAULT_BLOCK_SIZE;
    r->max_blocks = (max_ctx + r->block_size - 1) / r->block_size;
    struct backend_config c = *bc;
    c.max_num_seqs = 1;
    c.max_num_batched_tokens = chunk;
    c.max_model_len = max_ctx;
    c.block_size = r->block_size;
    c.num_blocks = r->max_blocks;
    int rc;
    if ((rc = backend_create(&r->be, m, &c, err, errlen))) goto fail;
    r->block_table = malloc(sizeof *r->block_table * (size_t)r->max_blocks);
    r->positions = malloc(sizeof *r->positions * (size_t)chunk);
    r->slots = malloc(sizeof *r->slots * (size_t)chunk);
    if (!r->block_table || !r->positions || !r->slots) {
        rc = err_set(err, errlen, ERR_NOMEM, "out of memory allocating batch arrays");
        goto fail;
    }
    for (int i = 0; i < r->max_blocks; i++) r->block_table[i] = i;
    return 0;
fail:
    runner_free(r);
    return rc;
}

void runner_free(struct runner *r)
{
    backend_free(r->be);
    free(r->block_table);
    free(r->positions);
    free(r->slots);
    memset(r, 0, sizeof *r);
}

int runner_feed(struct runner *r, const int32_t *ids, int n, struct sampler *smp, int32_t *token, char *err,
                size_t errlen)
{
    if (n <= 0) return err_set(err, errlen, ERR_INVALID, "no tokens to feed");
    if (r->len + n > r->max_ctx)
        return err_set(err, errlen, ERR_RANGE, "context of %d tokens would exceed the limit of %d",
                       r->len + n, r->max_ctx);
    for (int done = 0; done < n;) {
        int step = n - done < r->chunk ? n - done : r->chunk;
        for (int i = 0; i < step; i++) {
            int p = r->len + i;
            r->positions[i] = p;
            r->slots[i] = (int64_t)r->block_table[p / r->block_size] * r->block_size + p % r->block_size;
        }
        int32_t query_start[2] = { 0, step };
        int32_t seq_len = r->len + step;
        int32_t last = step - 1;
        bool sample = smp && done + step == n; /* only the last token's logits are needed */
        struct batch b = {
            .num_tokens = step, .num_seqs = 1, .token_ids = ids + done, .positions = r->positions,
            .slot_mapping = r->slots, .query_start = query_start, .seq_lens = &seq_len,
            .block_tables = r->block_table, .max_blocks_per_seq = r->max_blocks, .num_logits = sample ? 1 : 0,
            .logits_indices = &last,
        };
        struct backend_sample bs = { .sampler = smp, .n_logprobs = -1 };
        struct backend_token out;
        int rc = backend_step(r->be, &b, &bs, &out, err, errlen);
        if (rc) return rc;
        r->len += step;
        done += step;
        if (sample) {
            if (out.status != 0)
                return err_set(err, errlen, ERR_RANGE, "no token can be sampled (all logits are -inf, NaN or banned)");
            *token = out.token;
        }
    }
    return 0;
}
