/* submit.cu — one step on the GPU: validate the batch, pack its inputs into the pinned
 * staging buffer, and enqueue everything on the backend's stream; wait for it; or run the
 * forward alone and bring the logits back (backend_logits).
 *
 * A step on the stream, in order:
 *   1. one cudaMemcpyAsync of the packed inputs (token ids, positions, slots, query
 *      starts, sequence lengths, block tables in CSR form, logits rows, sampling
 *      parameters, penalty-history and logit-bias CSRs, the token masks of the rows that
 *      have one) into the device staging buffer;
 *   2. cuda_step_unpack into the fixed device buffers, resolving BACKEND_TOKEN_PREV(k)
 *      from the previous step's sampled tokens, still on the device, and padding a decode
 *      step to its graph bucket (slot -1, seq_len 0);
 *   3. the forward: the bucket's CUDA graph for a decode-only step, else the kernels one
 *      by one (prefill, mixed, enforce_eager, batches past the last bucket);
 *   4. cuda_sampling over the logits rows (logits never leave the device); a scoring
 *      row (backend_sample.score: prompt logprobs) gets its given token's raw logprobs,
 *      and none of its sequence's penalty history, bias or mask is packed;
 *   5. one cudaMemcpyAsync of the sampled tokens (struct sampling_output rows) into
 *      pinned memory, and an event.
 * submit returns with all of it queued; wait synchronises on the event. Tensor parallel:
 * rank 0 validates and packs once; every rank copies rank 0's staging and runs 1-3 (the
 * forward's all-reduces pair the ranks up), rank 0 alone 4-5, and an NCCL broadcast of the
 * sampled rows gives every rank the next step's lag tokens. The host thread
 * is therefore free between the two (the engine prepares the next step and streams text),
 * and the next step can name tokens it has not seen yet.
 *
 * Logits rows may be any rows of the batch, several per sequence (scoring rows over a
 * prompt chunk), at most one per row: a decode step (one row per sequence) then has at
 * most one per sequence, and its graph computes the logits of the bucket's padded rows,
 * of which sampling reads the first num_logits.
 *
 * Samplers are read at submit (params, step, penalty history, logit bias), never
 * advanced: the engine must sampler_accept the previous step's tokens before it submits
 * a step that samples the same sequence again. Token masks are copied at submit too, so
 * the caller may reuse a mask's memory once submit returns.
 */
#include "backend/cuda/cuda_backend.h"

#include "kernels/step.h"

extern "C" {
#include "sampler/exact.h"
#include "util/err.h"
#include "util/log.h"
}

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static_assert(sizeof(struct backend_token) == sizeof(struct sampling_output), "backend_token mirrors sampling_output");
static_assert(offsetof(struct backend_token, rank) == offsetof(struct sampling_output, rank) &&
                  offsetof(struct backend_token, top_ids) == offsetof(struct sampling_output, top_ids),
              "backend_token's fields in sampling_output's order (wait_rank copies one into the other)");
static_assert(SAMPLER_MAX_TOP_LOGPROBS == SAMPLING_MAX_TOP_LOGPROBS, "top-logprob limits differ");

static size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

static void layout_for(struct cu_layout *o, size_t T, size_t S, size_t nbt, size_t L, size_t npen, size_t nbias,
                       size_t nmask, size_t mask_words)
{
    size_t off = 0;
#define SEC(field, bytes)                                                                      \
    do {                                                                                       \
        o->field = off;                                                                        \
        off = al16(off + (bytes));                                                             \
    } while (0)
    SEC(tok, 4 * T);
    SEC(pos, 4 * T);
    SEC(slot, 8 * T);
    SEC(qs, 4 * (S + 1));
    SEC(lens, 4 * S);
    SEC(bt_start, 4 * (S + 1));
    SEC(bt_ids, 4 * nbt);
    SEC(li, 4 * L);
    SEC(params, sizeof(struct sampling_params) * L);
    SEC(pen_start, 4 * (L + 1));
    SEC(pen_ids, 4 * npen);
    SEC(pen_info, 4 * npen);
    SEC(bias_start, 4 * (L + 1));
    SEC(bias_ids, 4 * nbias);
    SEC(bias_vals, 4 * nbias);
    SEC(mask_row, 4 * L);
    SEC(masks, 4 * nmask * mask_words);
#undef SEC
    o->total = off;
    o->npen = npen;
    o->nbias = nbias;
    o->nmask = nmask;
}

static size_t mask_words(const struct cuda_backend *b) { return ((size_t)b->m->cfg.vocab_size + 31) / 32; }

size_t cu_staging_capacity(const struct cuda_backend *b)
{
    struct cu_layout o;
    layout_for(&o, (size_t)b->Tmax, (size_t)b->Smax, (size_t)b->Smax * (size_t)b->max_blocks, (size_t)b->Lmax,
               b->pen_cap, (size_t)b->Lmax * SAMPLER_MAX_LOGIT_BIAS, (size_t)b->Lmax, mask_words(b));
    return o.total;
}

const struct cu_graph *cu_graph_for(const struct cuda_backend *b, int rows)
{
    for (int i = 0; i < b->n_graphs; i++)
        if (b->graphs[i].batch >= rows) return &b->graphs[i];
    return NULL;
}

/* What the forward needs to know of a batch beyond its arrays (check_batch). */
struct batch_shape {
    bool decode;      /* every sequence has exactly one new row */
    int max_len;      /* the longest context */
    int lead;         /* leading sequences of one new row each (rows 0 .. lead-1) */
    int lead_max_len; /* their longest context */
};

/* batch.h's invariants against this backend's limits (forward.c's check_batch, plus the
 * lag tokens). Sets *shp and *nbt (block-table entries in use). */
static int check_batch(const struct cuda_backend *b, const struct batch *bt, struct batch_shape *shp, size_t *nbt,
                       char *err, size_t errlen)
{
    const struct model_config *c = &b->m->cfg;
    const int bs = b->cfg.block_size, num_blocks = b->kv[0].num_blocks;
    if (bt->num_tokens <= 0 || bt->num_tokens > b->Tmax)
        return err_set(err, errlen, ERR_RANGE, "batch: num_tokens %d outside 1..%d (max_num_batched_tokens)",
                       bt->num_tokens, b->Tmax);
    if (bt->num_seqs <= 0 || bt->num_seqs > b->Smax)
        return err_set(err, errlen, ERR_RANGE, "batch: num_seqs %d outside 1..%d", bt->num_seqs, b->Smax);
    if (bt->num_logits < 0 || bt->num_logits > b->Lmax)
        return err_set(err, errlen, ERR_RANGE, "batch: num_logits %d outside 0..%d (max_num_seqs)", bt->num_logits,
                       b->Lmax);
    if (bt->query_start[0] != 0 || bt->query_start[bt->num_seqs] != bt->num_tokens)
        return err_set(err, errlen, ERR_INVALID, "batch: query_start must run from 0 to num_tokens");
    *shp = (struct batch_shape){ bt->num_tokens == bt->num_seqs, 0, 0, 0 };
    *nbt = 0;
    for (int s = 0; s < bt->num_seqs; s++) {
        const int q0 = bt->query_start[s], q1 = bt->query_start[s + 1], len = bt->seq_lens[s];
        if (q1 < q0 || q1 - q0 > len || len > b->cfg.max_model_len)
            return err_set(err, errlen, ERR_INVALID, "batch: sequence %d has %d new tokens, seq_len %d (max_model_len %d)",
                           s, q1 - q0, len, b->cfg.max_model_len);
        if (q1 - q0 != 1) shp->decode = false;
        if (len > shp->max_len) shp->max_len = len;
        if (q1 - q0 == 1 && shp->lead == s) {
            shp->lead = s + 1;
            if (len > shp->lead_max_len) shp->lead_max_len = len;
        }
        const int nblk = (len + bs - 1) / bs;
        if (nblk > bt->max_blocks_per_seq)
            return err_set(err, errlen, ERR_INVALID, "batch: sequence %d needs %d blocks, table holds %d", s, nblk,
                           bt->max_blocks_per_seq);
        const int32_t *row = bt->block_tables + (int64_t)s * bt->max_blocks_per_seq;
        for (int i = 0; i < nblk; i++)
            if (row[i] < 0 || row[i] >= num_blocks)
                return err_set(err, errlen, ERR_INVALID, "batch: sequence %d block %d = %d out of range (%d blocks)", s,
                               i, row[i], num_blocks);
        *nbt += (size_t)nblk;
        for (int t = q0; t < q1; t++) {
            const int pos = len - (q1 - t);
            if (bt->positions[t] != pos)
                return err_set(err, errlen, ERR_INVALID, "batch: row %d has position %d, expected %d", t,
                               bt->positions[t], pos);
            const int32_t id = bt->token_ids[t];
            if (id >= c->vocab_size)
                return err_set(err, errlen, ERR_INVALID, "batch: token id %d out of range (vocab %d)", id,
                               c->vocab_size);
            if (id < 0 && -1 - (int64_t)id >= b->prev_logits)
                return err_set(err, errlen, ERR_INVALID,
                               "batch: row %d stands for row %lld of the previous step, which sampled %d rows", t,
                               (long long)(-1 - (int64_t)id), b->prev_logits);
            const int64_t slot = bt->slot_mapping[t];
            if (slot >= 0 && slot != (int64_t)row[pos / bs] * bs + pos % bs)
                return err_set(err, errlen, ERR_INVALID, "batch: row %d slot %lld does not match its block table", t,
                               (long long)slot);
        }
    }
    for (int i = 0; i < bt->num_logits; i++)
        if (bt->logits_indices[i] < 0 || bt->logits_indices[i] >= bt->num_tokens)
            return err_set(err, errlen, ERR_INVALID, "batch: logits index %d out of range", bt->logits_indices[i]);
    /* step_unpack pads the logits rows only up to the padded token rows (a decode graph's
     * bucket holds as many of each): more logits rows than rows would fail on the device */
    if (bt->num_logits > bt->num_tokens)
        return err_set(err, errlen, ERR_INVALID, "batch: %d logits rows for %d rows (a row repeated)", bt->num_logits,
                       bt->num_tokens);
    return 0;
}

static bool penalties_on(const struct sampler_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* At most the penalty-history entries row smp packs: its sequence's distinct tokens plus
 * the proposed ones it looks past (sampler_history_ahead), never more than the vocabulary. */
static int history_bound(const struct cuda_backend *b, const struct backend_sample *smp)
{
    const int n = sampler_history_len(smp->sampler) + (smp->prior ? (int)smp->ahead : 0);
    return n < b->m->cfg.vocab_size ? n : b->m->cfg.vocab_size;
}

/* Packs the batch (and, with samples, the sampling inputs) into h_staging per *lo. */
static int pack(struct cuda_backend *b, const struct batch *bt, const struct backend_sample *samples, size_t nbt,
                struct cu_layout *lo, char *err, size_t errlen)
{
    const int T = bt->num_tokens, S = bt->num_seqs, L = samples ? bt->num_logits : 0;
    size_t npen = 0, nbias = 0, nmask = 0;
    for (int i = 0; i < L; i++) {
        const struct sampler *s = samples[i].sampler;
        if (!s) return err_set(err, errlen, ERR_INVALID, "batch: logits row %d has no sampler", i);
        if (samples[i].n_logprobs < -1 || samples[i].n_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
            return err_set(err, errlen, ERR_INVALID, "batch: logits row %d asks for %d logprobs", i,
                           samples[i].n_logprobs);
        b->h_bias_start[i] = (int32_t)nbias;
        if (samples[i].score) continue; /* a scoring row: no penalties, bias or mask to pack */
        if (samples[i].prior && samples[i].ahead > SAMPLER_MAX_AHEAD)
            return err_set(err, errlen, ERR_INVALID, "batch: logits row %d looks %u tokens ahead", i,
                           samples[i].ahead);
        if (penalties_on(sampler_get_params(s))) npen += (size_t)history_bound(b, &samples[i]);
        nbias += (size_t)sampler_logit_bias(s, b->h_bias_ids + nbias, b->h_bias_vals + nbias);
        nmask += samples[i].mask != NULL;
    }
    b->h_bias_start[L] = (int32_t)nbias;
    if (npen > b->pen_cap)
        return err_set(err, errlen, ERR_RANGE, "batch: %zu penalty-history entries, the backend holds %zu", npen,
                       b->pen_cap);
    const size_t mw = mask_words(b);
    layout_for(lo, (size_t)T, (size_t)S, nbt, (size_t)bt->num_logits, npen, nbias, nmask, mw);
    unsigned char *h = b->h_staging;
    memcpy(h + lo->tok, bt->token_ids, 4 * (size_t)T);
    memcpy(h + lo->pos, bt->positions, 4 * (size_t)T);
    memcpy(h + lo->slot, bt->slot_mapping, 8 * (size_t)T);
    memcpy(h + lo->qs, bt->query_start, 4 * (size_t)(S + 1));
    memcpy(h + lo->lens, bt->seq_lens, 4 * (size_t)S);
    int32_t *bts = (int32_t *)(h + lo->bt_start), *btid = (int32_t *)(h + lo->bt_ids);
    const int bs = b->cfg.block_size;
    bts[0] = 0;
    for (int s = 0; s < S; s++) {
        const int nblk = (bt->seq_lens[s] + bs - 1) / bs;
        memcpy(btid + bts[s], bt->block_tables + (int64_t)s * bt->max_blocks_per_seq, 4 * (size_t)nblk);
        bts[s + 1] = bts[s] + nblk;
    }
    memcpy(h + lo->li, bt->logits_indices, 4 * (size_t)bt->num_logits);
    if (!L) return 0;

    struct sampling_params *sp = (struct sampling_params *)(h + lo->params);
    int32_t *ps = (int32_t *)(h + lo->pen_start), *pid = (int32_t *)(h + lo->pen_ids);
    uint32_t *pinfo = (uint32_t *)(h + lo->pen_info);
    ps[0] = 0;
    memcpy(h + lo->bias_start, b->h_bias_start, 4 * (size_t)(L + 1));
    memcpy(h + lo->bias_ids, b->h_bias_ids, 4 * nbias);
    memcpy(h + lo->bias_vals, b->h_bias_vals, 4 * nbias);
    int32_t *mrow = (int32_t *)(h + lo->mask_row);
    uint32_t *masks = (uint32_t *)(h + lo->masks);
    int32_t nm = 0;
    for (int i = 0; i < L; i++) {
        const bool masked = samples[i].mask && !samples[i].score;
        mrow[i] = masked ? nm : -1;
        if (masked) memcpy(masks + (size_t)nm++ * mw, samples[i].mask, 4 * mw);
    }
    for (int i = 0; i < L; i++) {
        const struct sampler *s = samples[i].sampler;
        const struct sampler_params *p = sampler_get_params(s);
        sp[i] = (struct sampling_params){ .temperature = p->temperature, .top_p = p->top_p, .min_p = p->min_p,
                                          .repetition_penalty = p->repetition_penalty,
                                          .presence_penalty = p->presence_penalty,
                                          .frequency_penalty = p->frequency_penalty, .top_k = p->top_k,
                                          .n_logprobs = samples[i].n_logprobs, .score = samples[i].score,
                                          .score_token = samples[i].score_token, .seed = p->seed,
                                          .step = sampler_step(s) + samples[i].ahead };
        int n = 0;
        if (penalties_on(p) && !samples[i].score) {
            n = sampler_history_ahead(s, samples[i].prior, samples[i].prior ? (int)samples[i].ahead : 0, pid + ps[i],
                                      pinfo + ps[i]);
        }
        ps[i + 1] = ps[i] + n;
    }
    return 0;
}

/* Queues steps 1-5 of the file comment (sampling and its copy only when `sample`). */
static int enqueue(struct cuda_backend *b, const struct batch *bt, const struct cu_layout *lo,
                   const struct batch_shape *shp, bool sample, bool timed, char *err, size_t errlen)
{
    const bool decode = shp->decode;
    const int T = bt->num_tokens, S = bt->num_seqs, L = bt->num_logits;
    const int vocab = b->m->cfg.vocab_size;
    const struct cu_graph *g = decode ? cu_graph_for(b, T) : NULL;
    const int padT = g ? g->batch : T, padS = g ? g->batch : S, padL = g ? g->batch : L;
    cudaStream_t st = b->stream;
    struct cu_bufs *d = &b->d;
    int e;
    if (timed && (e = cudaEventRecord(b->ev_start[b->parity], st)))
        return cu_error(b, true, e, err, errlen, "step %ld: cudaEventRecord", b->step_no);
    if ((e = cudaMemcpyAsync(d->staging, b->h_src, lo->total, cudaMemcpyHostToDevice, st)))
        return cu_error(b, true, e, err, errlen, "step %ld: copying the step's inputs to the device", b->step_no);

    const unsigned char *ds = d->staging;
    struct step_unpack_args a;
    memset(&a, 0, sizeof a);
    a.token_ids = (const int32_t *)(ds + lo->tok);
    a.positions = (const int32_t *)(ds + lo->pos);
    a.slot_mapping = (const int64_t *)(ds + lo->slot);
    a.query_start = (const int32_t *)(ds + lo->qs);
    a.seq_lens = (const int32_t *)(ds + lo->lens);
    a.bt_start = (const int32_t *)(ds + lo->bt_start);
    a.bt_ids = (const int32_t *)(ds + lo->bt_ids);
    a.logits_indices = (const int32_t *)(ds + lo->li);
    a.prev_tokens = &d->samples[0].token;
    a.prev_stride = sizeof(struct sampling_output) / sizeof(int32_t);
    a.prev_count = b->prev_logits;
    a.num_tokens = T;
    a.num_seqs = S;
    a.num_logits = L;
    a.pad_tokens = padT;
    a.pad_seqs = padS;
    a.pad_logits = padL;
    a.out_token_ids = d->token_ids;
    a.out_positions = d->positions;
    a.out_slot_mapping = d->slots;
    a.out_query_start = d->query_start;
    a.out_seq_lens = d->seq_lens;
    a.out_block_tables = d->block_tables;
    a.max_blocks_per_seq = b->max_blocks;
    a.out_logits_indices = d->logits_idx;
    if ((e = cuda_step_unpack(&a, st)))
        return cu_error(b, true, e, err, errlen, "step %ld: kernel step_unpack", b->step_no);

    if (g) {
        b->last_shape = cu_decode_graph_shape(b, g->batch);
        b->has_last_shape = true;
        if ((e = cudaGraphLaunch(g->exec, st)))
            return cu_error(b, true, e, err, errlen, "step %ld: launching the CUDA graph of batch %d", b->step_no,
                            g->batch);
    } else {
        struct cu_shape sh = { T, S, L, decode, shp->max_len, 0, 0, 0, 0, 0 };
        if (decode) {
            cu_decode_split(b, T, &sh);
        } else if (b->mixed_split && shp->lead > 0) { /* split as a decode step of those rows */
            sh.lead = shp->lead;
            sh.lead_max_len = shp->lead_max_len;
            cu_decode_split(b, sh.lead, &sh);
        }
        b->last_shape = sh;
        b->has_last_shape = true;
        const char *where = "";
        int layer = -1;
        if ((e = cu_forward(b, &sh, &where, &layer))) {
            if (layer >= 0)
                return cu_error(b, true, e, err, errlen, "step %ld: kernel %s, layer %d", b->step_no, where, layer);
            return cu_error(b, true, e, err, errlen, "step %ld: kernel %s", b->step_no, where);
        }
    }
    if (sample && L && b->rank == 0) {
        const bool pen = lo->npen > 0, bias = lo->nbias > 0, mask = lo->nmask > 0;
        e = cuda_sampling(d->logits, vocab, L, vocab, (const struct sampling_params *)(ds + lo->params),
                          pen ? (const int32_t *)(ds + lo->pen_start) : NULL, (const int32_t *)(ds + lo->pen_ids),
                          (const uint32_t *)(ds + lo->pen_info), bias ? (const int32_t *)(ds + lo->bias_start) : NULL,
                          (const int32_t *)(ds + lo->bias_ids), (const float *)(ds + lo->bias_vals),
                          mask ? (const int32_t *)(ds + lo->mask_row) : NULL, (const uint32_t *)(ds + lo->masks),
                          d->samples, st);
        if (e) return cu_error(b, true, e, err, errlen, "step %ld: kernel sampling", b->step_no);
        if ((e = cudaMemcpyAsync(b->h_samples, d->samples, sizeof(struct sampling_output) * (size_t)L,
                                 cudaMemcpyDeviceToHost, st)))
            return cu_error(b, true, e, err, errlen, "step %ld: copying the sampled tokens to the host", b->step_no);
    }
    if (sample && L && b->world > 1) { /* every rank gets the lag tokens of the next step */
        const int r = b->nccl->broadcast(d->samples, d->samples, sizeof(struct sampling_output) * (size_t)L,
                                         CU_NCCL_UINT8, 0, b->comm, st);
        if (r) {
            LOG_ERR("cuda", "GPU %d: ncclBroadcast: %s", b->rank, b->nccl->error_string(r));
            return cu_error(b, true, cudaErrorUnknown, err, errlen, "step %ld: broadcasting the sampled tokens",
                            b->step_no);
        }
    }
    if (timed && (e = cudaEventRecord(b->ev_end[b->parity], st)))
        return cu_error(b, true, e, err, errlen, "step %ld: cudaEventRecord", b->step_no);
    if ((e = cudaEventRecord(b->ev_done, st)))
        return cu_error(b, true, e, err, errlen, "step %ld: cudaEventRecord", b->step_no);
    return 0;
}

static int check_usable(const struct cu_group *g, char *err, size_t errlen)
{
    for (int r = 0; r < g->world; r++)
        if (g->ranks[r]->broken)
            return err_set(err, errlen, ERR_IO, "cuda: backend unusable after an earlier device error%s: %s",
                           g->world > 1 ? " on one of its GPUs" : "", g->ranks[r]->broken_msg);
    if (g->ranks[0]->in_flight) return err_set(err, errlen, ERR_BUSY, "cuda: a step is already in flight");
    return 0;
}

/* One rank's part of a step: what enqueue takes, and whether to bring the logits back. */
struct step_job {
    const struct batch *bt;
    const struct cu_layout *lo;
    struct batch_shape shape;
    bool sample, timed, logits;
};

static int step_rank(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    const struct step_job *j = (const struct step_job *)arg;
    b->step_no++;
    if (!j->timed) b->timed_prev = false; /* the gap after a logits call is not a step-to-step gap */
    int rc = enqueue(b, j->bt, j->lo, &j->shape, j->sample, j->timed, err, errlen);
    if (rc) return rc;
    if (!j->logits) {
        b->in_flight = true;
        b->cur_logits = j->bt->num_logits;
        return 0;
    }
    int e = cudaSuccess;
    if (b->rank == 0)
        e = cudaMemcpyAsync(b->h_logits, b->d.logits, sizeof(float) * (size_t)b->m->cfg.vocab_size *
                            (size_t)j->bt->num_logits, cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) return cu_error(b, true, e, err, errlen, "step %ld (logits) failed on the device", b->step_no);
    return 0;
}

/* Validates the batch against rank 0's limits (every rank has the same) and packs it into
 * rank 0's staging, which every rank copies from: nothing runs anywhere on an error. */
static int prepare(struct cu_group *g, const struct batch *bt, const struct backend_sample *samples,
                   struct step_job *j, struct cu_layout *lo, char *err, size_t errlen)
{
    struct cuda_backend *b = g->ranks[0];
    size_t nbt = 0;
    int rc;
    if ((rc = check_usable(g, err, errlen))) return rc;
    if ((rc = check_batch(b, bt, &j->shape, &nbt, err, errlen))) return rc;
    if ((rc = pack(b, bt, samples, nbt, lo, err, errlen))) return rc;
    j->bt = bt;
    j->lo = lo;
    return 0;
}

int cu_submit(void *impl, const struct batch *bt, const struct backend_sample *samples, char *err, size_t errlen)
{
    struct cu_group *g = (struct cu_group *)impl;
    struct step_job j = {};
    struct cu_layout lo;
    int rc;
    if (bt->num_logits > 0 && !samples) return err_set(err, errlen, ERR_INVALID, "batch: logits rows without samplers");
    if ((rc = prepare(g, bt, samples, &j, &lo, err, errlen))) return rc;
    j.sample = j.timed = true;
    rc = cu_group_run(g, step_rank, &j, err, errlen);
    if (rc) /* no step in flight: one rank's failure fails the step (and broke the backend) */
        for (int r = 0; r < g->world; r++) g->ranks[r]->in_flight = false;
    return rc;
}

static int status_of(int32_t s)
{
    switch (s) {
    case SAMPLING_OK: return 0;
    case SAMPLING_ERR_NO_TOKEN:
    case SAMPLING_ERR_PARAMS: return ERR_RANGE;
    case SAMPLING_ERR_TARGET: /* a scoring row's token out of range */
    default: return ERR_INVALID;
    }
}

/* One rank's wait: the step's end; rank 0 also writes the sampled tokens to arg. */
static int wait_rank(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    struct backend_token *out = (struct backend_token *)arg;
    b->in_flight = false;
    int e = cudaEventSynchronize(b->ev_done);
    if (e != cudaSuccess)
        return cu_error(b, true, e, err, errlen, "step %ld failed on the device (a kernel faulted or the GPU was lost; "
                        "CUDA_LAUNCH_BLOCKING=1 names the kernel)", b->step_no);
    float busy = 0.0f, idle = 0.0f;
    const int p = b->parity;
    if (cudaEventElapsedTime(&busy, b->ev_start[p], b->ev_end[p]) == cudaSuccess) {
        b->busy_ms += busy;
        if (b->timed_prev && cudaEventElapsedTime(&idle, b->ev_end[p ^ 1], b->ev_start[p]) == cudaSuccess)
            b->idle_ms += idle;
        b->timed_steps++;
        b->timed_prev = true;
    }
    b->parity ^= 1;
    for (int i = 0; b->rank == 0 && i < b->cur_logits; i++) {
        const struct sampling_output *o = &b->h_samples[i];
        memcpy(&out[i], o, sizeof *o);
        out[i].status = status_of(o->status);
        if (out[i].status) out[i].token = -1;
    }
    b->prev_logits = b->cur_logits;
    return 0;
}

int cu_wait(void *impl, struct backend_token *out, char *err, size_t errlen)
{
    struct cu_group *g = (struct cu_group *)impl;
    if (!g->ranks[0]->in_flight) return err_set(err, errlen, ERR_INVALID, "cuda: no step in flight");
    return cu_group_run(g, wait_rank, out, err, errlen);
}

int cu_logits(void *impl, const struct batch *bt, const float **logits, char *err, size_t errlen)
{
    struct cu_group *g = (struct cu_group *)impl;
    struct cuda_backend *b = g->ranks[0];
    struct step_job j = {};
    struct cu_layout lo;
    int rc;
    *logits = NULL;
    if ((rc = prepare(g, bt, NULL, &j, &lo, err, errlen))) return rc;
    const size_t vocab = (size_t)b->m->cfg.vocab_size;
    if (!b->h_logits && !(b->h_logits = (float *)malloc(sizeof(float) * vocab * (size_t)b->Lmax)))
        return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory for %d x %zu logits", b->Lmax, vocab);
    j.logits = true;
    if ((rc = cu_group_run(g, step_rank, &j, err, errlen))) return rc;
    *logits = b->h_logits;
    return 0;
}
