/* runner.c — see runner.h. */
#include "cli/runner.h"
#include "util/err.h"

#include <stdlib.h>
#include <string.h>

int runner_create(struct runner *r, const struct model *m, int max_ctx, int chunk, int n_threads,
                  enum kv_dtype kv_dtype, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->m = m;
    r->max_ctx = max_ctx;
    r->chunk = chunk;
    int block_size = KV_DEFAULT_BLOCK_SIZE;
    int num_blocks = (max_ctx + block_size - 1) / block_size;
    struct forward_opts fo = { .max_tokens = chunk, .max_logits = 1, .max_ctx = max_ctx,
                               .n_threads = n_threads, .tp = NULL };
    int rc;
    if ((rc = forward_create(&r->fs, &m->cfg, &m->w, &fo, err, errlen))) goto fail;
    if ((rc = kv_cache_create(&r->kv, &m->cfg, num_blocks, block_size, kv_dtype, err, errlen))) goto fail;
    if ((rc = kv_seq_init(&r->seq, r->kv, 0, num_blocks, err, errlen))) goto fail;
    r->positions = malloc(sizeof *r->positions * (size_t)chunk);
    r->slots = malloc(sizeof *r->slots * (size_t)chunk);
    if (!r->positions || !r->slots) {
        rc = err_set(err, errlen, ERR_NOMEM, "out of memory allocating batch arrays");
        goto fail;
    }
    return 0;
fail:
    runner_free(r);
    return rc;
}

void runner_free(struct runner *r)
{
    if (r->fs) forward_free(r->fs);
    if (r->seq.block_table) kv_seq_free(&r->seq);
    if (r->kv) kv_cache_free(r->kv);
    free(r->positions);
    free(r->slots);
    memset(r, 0, sizeof *r);
}

int runner_feed(struct runner *r, const int32_t *ids, int n, float **logits, char *err,
                size_t errlen)
{
    if (n <= 0) return err_set(err, errlen, ERR_INVALID, "no tokens to feed");
    if (r->seq.len + n > r->max_ctx)
        return err_set(err, errlen, ERR_RANGE, "context of %d tokens would exceed the limit of %d",
                       r->seq.len + n, r->max_ctx);
    for (int done = 0; done < n;) {
        int step = n - done < r->chunk ? n - done : r->chunk;
        int rc = kv_seq_append(&r->seq, r->kv->block_size, step, r->slots, r->positions, err, errlen);
        if (rc) return rc;
        int32_t query_start[2] = { 0, step };
        int32_t seq_len = r->seq.len;
        int32_t last = step - 1;
        int final = done + step == n; /* only the last token's logits are needed */
        struct batch b = {
            .num_tokens = step, .num_seqs = 1, .token_ids = ids + done,
            .positions = r->positions, .slot_mapping = r->slots, .query_start = query_start,
            .seq_lens = &seq_len, .block_tables = r->seq.block_table,
            .max_blocks_per_seq = r->seq.max_blocks, .num_logits = final ? 1 : 0,
            .logits_indices = &last,
        };
        if ((rc = model_forward(r->fs, r->kv, &b, err, errlen))) return rc;
        done += step;
    }
    *logits = r->fs->logits;
    return 0;
}
