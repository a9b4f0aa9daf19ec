/* backend_cpu.c — the CPU implementation of backend.h: the forward of model/forward.c over
 * a paged KV cache in host memory (model/kv_cache.c), and host sampling with each row's
 * struct sampler — sampler_sample_masked (under the row's token mask, if any), then
 * sampler_logprobs over the same raw row when asked (logprobs ignore the mask). A scoring
 * row (prompt logprobs) is sampler_logprobs alone, for the row's score_token.
 *
 * Owns the forward state (every activation buffer for max_num_batched_tokens rows and
 * max_num_seqs logits rows), the KV cache (sized from num_blocks, or from cpu_kv_bytes),
 * and the step's results. submit computes the whole step before it returns (the CPU has
 * nothing to overlap with); wait hands the results over. BACKEND_TOKEN_PREV(k) rows are
 * resolved from the tokens of the step waited for last, which this file keeps.
 *
 * Test hook (documented in docs/engine.md): TESSERA_TEST_FAULT, read once at create:
 *   "nan-row=K"   the K-th logits row sampled by this backend (counting from 1, over all
 *                 steps, the warm-up step included; scoring rows sample nothing and do
 *                 not count) has NaN logits: that row's token has status ERR_RANGE
 *                 (nothing samplable), the other rows are unaffected;
 *   "fail-step=K" the K-th submit fails with ERR_IO, as a device fault would.
 * Single-threaded like every backend; the forward's work runs on its own thread pool, and so
 * does sampling: a step's logits rows are split over the pool (each sampling row has its own
 * sequence's sampler; scoring rows read none).
 */
#include "backend/backend_impl.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "sampler/row_scan.h"
#include "util/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cpu_backend {
    const struct model *m;          /* borrowed */
    struct forward_state *fs;
    struct kv_cache *kv;
    struct backend_token *out;      /* [max_num_seqs] the step computed last */
    int n_out;
    bool have_out;                  /* out holds a sampled step (BACKEND_TOKEN_PREV source) */
    int32_t *ids;                   /* [max_num_batched_tokens] token ids with PREV resolved */
    uint64_t rows, steps;           /* logits rows sampled, steps submitted */
    uint64_t fault_nan_row, fault_fail_step; /* TESSERA_TEST_FAULT; 0 = none */
};

static void cpu_destroy(void *impl)
{
    struct cpu_backend *c = impl;
    if (!c) return;
    if (c->fs) forward_free(c->fs);
    if (c->kv) kv_cache_free(c->kv);
    free(c->out);
    free(c->ids);
    free(c);
}

/* Copies batch's token ids into c->ids with every BACKEND_TOKEN_PREV(k) replaced. */
static int resolve_prev(struct cpu_backend *c, const struct batch *b, char *err, size_t errlen)
{
    for (int r = 0; r < b->num_tokens; r++) {
        int32_t t = b->token_ids[r];
        if (t >= 0) {
            c->ids[r] = t;
            continue;
        }
        int k = -1 - t;
        if (!c->have_out || k >= c->n_out || c->out[k].status != 0)
            return err_set(err, errlen, ERR_INVALID, "row %d names logits row %d of the previous step, which "
                           "has no token", r, k);
        c->ids[r] = c->out[k].token;
    }
    return 0;
}

/* A scoring row: no sampling, no sampler state, no mask; score_token with its raw logprob,
 * max(n_logprobs, 0) top alternatives (sampler_logprobs over the raw row) and its rank (the
 * raw logits >= its own). */
static void score_row(const float *row, int vocab, const struct backend_sample *s, struct backend_token *o)
{
    *o = (struct backend_token){ .token = -1, .rank = 0 };
    if (s->score_token < 0 || s->score_token >= vocab) {
        o->status = ERR_INVALID;
        return;
    }
    o->token = s->score_token;
    o->logprob = -INFINITY;
    int n_top = sampler_logprobs(row, vocab, s->score_token, s->n_logprobs > 0 ? s->n_logprobs : 0, o->top_ids,
                                 o->top_logprobs, &o->logprob);
    o->n_top = n_top > 0 ? n_top : 0;
    o->rank = row_count_ge(row, vocab, row[s->score_token]);
}

static void sample_row(struct cpu_backend *c, float *row, const struct backend_sample *s, struct backend_token *o)
{
    int vocab = c->m->cfg.vocab_size;
    if (s->score) {
        score_row(row, vocab, s, o);
        return;
    }
    *o = (struct backend_token){ .token = -1, .rank = 0 }; /* every field: out is reused across steps */
    int32_t tok = sampler_sample_ahead(s->sampler, row, s->mask, s->ahead, s->prior);
    if (tok < 0) {
        o->status = tok;
        return;
    }
    o->token = tok;
    if (s->n_logprobs < 0) return;
    /* sampler_sample_masked restored the raw row: logprobs are over the model's logits */
    o->logprob = -INFINITY;
    int n_top = sampler_logprobs(row, vocab, tok, s->n_logprobs, o->top_ids, o->top_logprobs, &o->logprob);
    o->n_top = n_top > 0 ? n_top : 0;
}

/* The logits rows of a step, split over the forward's thread pool. Scoring rows read no
 * sampler, and a sampling row has its own sequence's sampler — except the speculative rows
 * of one sequence, consecutive rows sharing one (and its scratch): a share boundary never
 * falls between two of them. */
struct sample_job {
    struct cpu_backend *c;
    const struct backend_sample *samples;
    int n;
};

/* The first row at or after i that does not share its predecessor's sampler (n at most). */
static long share_boundary(const struct backend_sample *smp, long n, long i)
{
    while (i > 0 && i < n && !smp[i].score && !smp[i - 1].score && smp[i].sampler == smp[i - 1].sampler) i++;
    return i;
}

static void sample_worker(void *arg, int ith, int nth)
{
    struct sample_job *j = arg;
    long begin, end;
    tp_split(j->n, ith, nth, &begin, &end);
    begin = share_boundary(j->samples, j->n, begin);
    end = share_boundary(j->samples, j->n, end);
    size_t vocab = (size_t)j->c->m->cfg.vocab_size;
    for (long i = begin; i < end; i++)
        sample_row(j->c, j->c->fs->logits + (size_t)i * vocab, &j->samples[i], &j->c->out[i]);
}

static int cpu_forward(struct cpu_backend *c, const struct batch *batch, char *err, size_t errlen)
{
    int rc = resolve_prev(c, batch, err, errlen);
    if (rc) return rc;
    struct batch b = *batch;
    b.token_ids = c->ids;
    /* model_forward only checks and computes: every failure is a batch that breaks the
     * invariants, nothing was computed */
    if ((rc = model_forward(c->fs, c->kv, &b, err, errlen))) return ERR_INVALID;
    return 0;
}

static int cpu_submit(void *impl, const struct batch *batch, const struct backend_sample *samples, char *err,
                      size_t errlen)
{
    struct cpu_backend *c = impl;
    if (c->fault_fail_step && ++c->steps == c->fault_fail_step)
        return err_set(err, errlen, ERR_IO, "injected fault (TESSERA_TEST_FAULT=fail-step=%llu)",
                       (unsigned long long)c->fault_fail_step);
    int rc = cpu_forward(c, batch, err, errlen);
    if (rc) return rc;
    int vocab = c->m->cfg.vocab_size;
    for (int i = 0; c->fault_nan_row && i < batch->num_logits; i++) /* TESSERA_TEST_FAULT nan-row=K */
        if (!samples[i].score && ++c->rows == c->fault_nan_row)
            for (int v = 0; v < vocab; v++) c->fs->logits[(size_t)i * (size_t)vocab + (size_t)v] = NAN;
    struct sample_job job = { c, samples, batch->num_logits };
    if (batch->num_logits > 1) tp_run(c->fs->tp, sample_worker, &job);
    else sample_worker(&job, 0, 1);
    c->n_out = batch->num_logits;
    c->have_out = true;
    return 0;
}

static int cpu_wait(void *impl, struct backend_token *out, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    struct cpu_backend *c = impl;
    if (c->n_out > 0) memcpy(out, c->out, sizeof *out * (size_t)c->n_out);
    return 0;
}

static int cpu_logits(void *impl, const struct batch *batch, const float **logits, char *err, size_t errlen)
{
    struct cpu_backend *c = impl;
    int rc = cpu_forward(c, batch, err, errlen);
    if (rc) return rc;
    c->have_out = false;
    *logits = c->fs->logits;
    return 0;
}

static const struct backend_ops cpu_ops = {
    .submit = cpu_submit, .wait = cpu_wait, .logits = cpu_logits, .destroy = cpu_destroy,
};

/* TESSERA_TEST_FAULT (see the file comment). */
static void read_fault(struct cpu_backend *c)
{
    const char *f = getenv("TESSERA_TEST_FAULT");
    unsigned long long k = 0;
    if (!f || !*f) return;
    if (sscanf(f, "nan-row=%llu", &k) == 1) c->fault_nan_row = k;
    else if (sscanf(f, "fail-step=%llu", &k) == 1) c->fault_fail_step = k;
}

/* Bytes of the weight matrices (mmapped views: the CPU reads them in place). */
static size_t weight_bytes(const struct model_weights *w)
{
    size_t b = w->token_embd->nbytes + (w->output != w->token_embd ? w->output->nbytes : 0);
    for (int l = 0; l < w->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        b += L->wq->nbytes + L->wk->nbytes + L->wv->nbytes + L->wo->nbytes + L->w_gate->nbytes +
             L->w_up->nbytes + L->w_down->nbytes;
    }
    return b;
}

/* KV blocks: cfg->num_blocks exactly, or as many as cpu_kv_bytes holds; one max_model_len
 * sequence must fit either way. */
static int size_kv(const struct model *m, const struct backend_config *cfg, enum kv_dtype dt, int *num_blocks,
                   char *err, size_t errlen)
{
    int bs = cfg->block_size;
    int need = (cfg->max_model_len + bs - 1) / bs;
    if (cfg->num_blocks > 0) {
        if (cfg->num_blocks < need)
            return err_set(err, errlen, ERR_INVALID,
                           "%d KV blocks of %d tokens cannot hold one %d-token sequence (max_model_len): "
                           "%d needed", cfg->num_blocks, bs, cfg->max_model_len, need);
        *num_blocks = cfg->num_blocks;
        return 0;
    }
    size_t block_bytes = kv_cache_block_bytes(&m->cfg, bs, dt);
    size_t fit = block_bytes ? cfg->cpu_kv_bytes / block_bytes : 0;
    if (fit > ((size_t)1 << 30)) fit = (size_t)1 << 30;
    if ((int)fit < need)
        return err_set(err, errlen, ERR_NOMEM,
                       "a KV cache of %.1f MiB holds %d blocks of %d tokens (%s); one %d-token sequence needs %d "
                       "(%.1f MiB): raise the KV cache memory (--kv-cache-memory) or lower max_model_len "
                       "(--max-model-len; generate: --ctx)", (double)cfg->cpu_kv_bytes / 1048576.0, (int)fit, bs, kv_dtype_name(dt),
                       cfg->max_model_len, need, (double)need * (double)block_bytes / 1048576.0);
    *num_blocks = (int)fit;
    return 0;
}

int backend_cpu_create(const struct model *m, const struct backend_config *cfg, const struct backend_ops **ops,
                       void **impl, struct backend_info *info, char *err, size_t errlen)
{
    *ops = NULL;
    *impl = NULL;
    enum kv_dtype dt = cfg->kv_dtype_auto ? KV_F16 : cfg->kv_dtype;
    int num_blocks = 0;
    int rc = size_kv(m, cfg, dt, &num_blocks, err, errlen);
    if (rc) return rc;
    struct cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return err_set(err, errlen, ERR_NOMEM, "cpu backend: out of memory");
    c->m = m;
    read_fault(c);
    struct forward_opts fo = { .max_tokens = cfg->max_num_batched_tokens, .max_logits = cfg->max_num_seqs,
                               .max_ctx = cfg->max_model_len, .n_threads = cfg->n_threads, .tp = NULL };
    if ((rc = forward_create(&c->fs, &m->cfg, &m->w, &fo, err, errlen))) goto fail;
    if ((rc = kv_cache_create(&c->kv, &m->cfg, num_blocks, cfg->block_size, dt, err, errlen))) goto fail;
    c->out = calloc((size_t)cfg->max_num_seqs, sizeof *c->out);
    c->ids = calloc((size_t)cfg->max_num_batched_tokens, sizeof *c->ids);
    if (!c->out || !c->ids) {
        rc = err_set(err, errlen, ERR_NOMEM, "cpu backend: out of memory for the step buffers");
        goto fail;
    }
    const struct forward_state *fs = c->fs;
    size_t dim = (size_t)m->cfg.dim, qd = (size_t)m->cfg.n_heads * m->cfg.head_dim,
           kvd = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim, ffn = (size_t)m->cfg.ffn_dim;
    size_t act = sizeof(float) * ((size_t)fs->max_tokens * (2 * dim + 2 * qd + 2 * kvd + 2 * ffn) +
                                  (size_t)fs->max_logits * (dim + (size_t)m->cfg.vocab_size));
    snprintf(info->name, sizeof info->name, "cpu");
    snprintf(info->device, sizeof info->device, "%d thread%s", tp_size(fs->tp), tp_size(fs->tp) == 1 ? "" : "s");
    info->kv_dtype = dt;
    info->block_size = cfg->block_size;
    info->num_blocks = num_blocks;
    info->weight_bytes = weight_bytes(&m->w);
    info->kv_bytes = (size_t)m->cfg.n_layers * c->kv->layer_bytes;
    info->activation_bytes = act;
    info->max_concurrency = (int)((int64_t)num_blocks * cfg->block_size / cfg->max_model_len);
    info->graphs = false;
    *ops = &cpu_ops;
    *impl = c;
    return 0;
fail:
    cpu_destroy(c);
    return rc;
}
