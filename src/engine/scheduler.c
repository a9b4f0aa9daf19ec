/* scheduler.c — see scheduler.h for the policy and invariants.
 *
 * One step: drop aborted sequences → schedule running sequences (preempting the newest
 * when blocks run out) → admit waiting ones → fill the flat batch → model_forward →
 * commit KV, sample, check EOS / length, report, free finished sequences.
 */
#include "engine/scheduler.h"
#include "model/batch.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "util/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* One sequence's share of a step. */
struct sched_entry {
    struct sched_seq *seq;
    int n_new;      /* rows: positions num_computed .. num_computed + n_new - 1 */
    int logit;      /* index into fs->logits, or -1 (mid-prefill chunk) */
    bool admitted;  /* admitted in this step (reported as an admitted event) */
};

struct sched {
    const struct model *m;            /* borrowed */
    struct sched_config cfg;
    struct forward_state *fs;
    struct kv_cache *kv;
    struct block_manager *bm;
    int max_blocks_per_seq;           /* ceil(max_model_len / block_size) */
    int64_t next_id;

    struct sched_seq **waiting;       /* [cap_waiting] FCFS queue, front = index 0 */
    int n_waiting, cap_waiting;
    struct sched_seq **running;       /* [max_num_seqs] in admission order, newest last */
    int n_running;

    /* per-step arrays, allocated once */
    struct sched_entry *entries;      /* [max_num_seqs] */
    int32_t *token_ids;               /* [max_num_batched_tokens] */
    int32_t *positions;               /* [max_num_batched_tokens] */
    int64_t *slot_mapping;            /* [max_num_batched_tokens] */
    int32_t *query_start;             /* [max_num_seqs + 1] */
    int32_t *seq_lens;                /* [max_num_seqs] */
    int32_t *block_tables;            /* [max_num_seqs][max_blocks_per_seq] */
    int32_t *logits_indices;          /* [max_num_seqs] */
    struct sched_logprob lp;          /* the token event's logprobs, reused every token */

    uint64_t steps, preemptions, prefill_tokens, batched_tokens;
};

static void seq_destroy(struct sched *s, struct sched_seq *q)
{
    if (!q) return;
    bm_seq_free(s->bm, q->bs);
    sampler_free(q->sampler);
    free(q->tokens);
    free(q);
}

void sched_free(struct sched *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_waiting; i++) seq_destroy(s, s->waiting[i]);
    for (int i = 0; i < s->n_running; i++) seq_destroy(s, s->running[i]);
    bm_free(s->bm);
    if (s->kv) kv_cache_free(s->kv);
    if (s->fs) forward_free(s->fs);
    free(s->waiting);
    free(s->running);
    free(s->entries);
    free(s->token_ids);
    free(s->positions);
    free(s->slot_mapping);
    free(s->query_start);
    free(s->seq_lens);
    free(s->block_tables);
    free(s->logits_indices);
    free(s);
}

int sched_create(struct sched **out, const struct model *m, const struct sched_config *cfg,
                 char *err, size_t errlen)
{
    *out = NULL;
    struct sched_config c = *cfg;
    if (c.block_size <= 0) c.block_size = KV_DEFAULT_BLOCK_SIZE;
    if (c.max_num_seqs <= 0 || c.max_num_batched_tokens <= 0 || c.max_model_len <= 1 ||
        c.num_blocks <= 0)
        return err_set(err, errlen, ERR_INVALID,
                       "scheduler: max_num_seqs, max_num_batched_tokens, num_blocks must be > 0 "
                       "and max_model_len > 1");
    if (c.max_model_len > m->cfg.max_seq_len)
        return err_set(err, errlen, ERR_RANGE, "scheduler: max_model_len %d exceeds the model's %d",
                       c.max_model_len, m->cfg.max_seq_len);
    if (!c.enable_chunked_prefill && c.max_num_batched_tokens < c.max_model_len)
        return err_set(err, errlen, ERR_INVALID,
                       "scheduler: without chunked prefill max_num_batched_tokens (%d) must be "
                       ">= max_model_len (%d)", c.max_num_batched_tokens, c.max_model_len);
    /* one sequence alone must always fit, or preemption could never make progress */
    if ((int64_t)c.num_blocks * c.block_size < c.max_model_len)
        return err_set(err, errlen, ERR_INVALID,
                       "scheduler: %d blocks of %d tokens cannot hold max_model_len %d",
                       c.num_blocks, c.block_size, c.max_model_len);

    struct sched *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, errlen, ERR_NOMEM, "scheduler: out of memory");
    s->m = m;
    s->cfg = c;
    s->next_id = 1;
    s->max_blocks_per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
    int rc;
    struct forward_opts fo = { .max_tokens = c.max_num_batched_tokens,
                               .max_logits = c.max_num_seqs, .max_ctx = c.max_model_len,
                               .n_threads = c.n_threads, .tp = NULL };
    if ((rc = forward_create(&s->fs, &m->cfg, &m->w, &fo, err, errlen))) goto fail;
    if ((rc = kv_cache_create(&s->kv, &m->cfg, c.num_blocks, c.block_size, c.kv_dtype, err,
                              errlen)))
        goto fail;
    /* a secret key, so clients cannot aim prefix-cache hash collisions */
    uint8_t key[16];
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) {
        rc = err_set(err, errlen, ERR_IO, "scheduler: getrandom failed");
        goto fail;
    }
    if ((rc = bm_create(&s->bm, c.num_blocks, c.block_size, c.enable_prefix_caching, key, err,
                        errlen)))
        goto fail;
    size_t T = (size_t)c.max_num_batched_tokens, S = (size_t)c.max_num_seqs;
    s->running = calloc(S, sizeof *s->running);
    s->entries = calloc(S, sizeof *s->entries);
    s->token_ids = calloc(T, sizeof *s->token_ids);
    s->positions = calloc(T, sizeof *s->positions);
    s->slot_mapping = calloc(T, sizeof *s->slot_mapping);
    s->query_start = calloc(S + 1, sizeof *s->query_start);
    s->seq_lens = calloc(S, sizeof *s->seq_lens);
    s->block_tables = calloc(S * (size_t)s->max_blocks_per_seq, sizeof *s->block_tables);
    s->logits_indices = calloc(S, sizeof *s->logits_indices);
    if (!s->running || !s->entries || !s->token_ids || !s->positions || !s->slot_mapping ||
        !s->query_start || !s->seq_lens || !s->block_tables || !s->logits_indices) {
        rc = err_set(err, errlen, ERR_NOMEM, "scheduler: out of memory for step arrays");
        goto fail;
    }
    *out = s;
    return 0;
fail:
    sched_free(s);
    return rc;
}

void sched_seq_params_default(struct sched_seq_params *p)
{
    *p = (struct sched_seq_params){ .logprobs = -1 };
    sampler_params_default(&p->sp);
}

int sched_add(struct sched *s, const int32_t *ids, int n, const struct sched_seq_params *p,
              int64_t *seq_id, char *err, size_t errlen)
{
    if (!ids || n <= 0) return err_set(err, errlen, ERR_INVALID, "empty prompt");
    if (n >= s->cfg.max_model_len)
        return err_set(err, errlen, ERR_RANGE,
                       "prompt of %d tokens leaves no room to generate (max_model_len %d)", n,
                       s->cfg.max_model_len);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->m->cfg.vocab_size)
            return err_set(err, errlen, ERR_INVALID, "token id %d at %d outside the vocabulary",
                           ids[i], i);
    int rc = sampler_params_validate(&p->sp, err, errlen);
    if (rc) return rc;
    if (p->logprobs < -1 || p->logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return err_set(err, errlen, ERR_RANGE, "logprobs %d outside [-1, %d]", p->logprobs,
                       SAMPLER_MAX_TOP_LOGPROBS);
    if (p->salt_len > BM_SALT_MAX || (p->salt_len && !p->salt))
        return err_set(err, errlen, ERR_RANGE, "cache salt of %zu bytes (at most %d)",
                       p->salt_len, BM_SALT_MAX);
    int max_tokens = p->max_tokens;
    if (max_tokens <= 0 || max_tokens > s->cfg.max_model_len - n)
        max_tokens = s->cfg.max_model_len - n;

    /* the waiting queue must hold every live sequence (preemption pushes back into it) */
    int live = s->n_waiting + s->n_running + 1;
    if (live > s->cap_waiting) {
        int cap = s->cap_waiting ? s->cap_waiting * 2 : 16;
        while (cap < live) cap *= 2;
        struct sched_seq **w = realloc(s->waiting, sizeof *w * (size_t)cap);
        if (!w) return err_set(err, errlen, ERR_NOMEM, "out of memory queueing a sequence");
        s->waiting = w;
        s->cap_waiting = cap;
    }
    struct sched_seq *q = calloc(1, sizeof *q);
    if (!q) return err_set(err, errlen, ERR_NOMEM, "out of memory queueing a sequence");
    q->tokens = malloc(sizeof *q->tokens * (size_t)(n + max_tokens));
    q->sampler = sampler_create(&p->sp, s->m->cfg.vocab_size);
    if (!q->tokens || !q->sampler) {
        rc = err_set(err, errlen, ERR_NOMEM, "out of memory creating a sequence");
        goto fail;
    }
    if (p->n_bias && (rc = sampler_set_logit_bias(q->sampler, p->bias_ids, p->bias, p->n_bias))) {
        err_set(err, errlen, rc, "logit_bias: %d entries, ids must be in [0, %d) and biases "
                "not NaN or +inf", p->n_bias, s->m->cfg.vocab_size);
        goto fail;
    }
    if ((rc = bm_seq_create(s->bm, n + max_tokens, p->salt, p->salt_len, &q->bs, err, errlen)))
        goto fail;
    memcpy(q->tokens, ids, sizeof *ids * (size_t)n);
    if (p->salt_len) memcpy(q->salt, p->salt, p->salt_len);
    q->salt_len = p->salt_len;
    sampler_accept_prompt(q->sampler, ids, n);
    q->id = s->next_id++;
    q->status = SEQ_WAITING;
    q->n_prompt = q->n_tokens = n;
    q->max_tokens = max_tokens;
    q->ignore_eos = p->ignore_eos;
    q->logprobs = p->logprobs;
    q->user = p->user;
    s->waiting[s->n_waiting++] = q;
    *seq_id = q->id;
    return 0;
fail:
    seq_destroy(s, q);
    return rc;
}

static struct sched_seq *find_seq(const struct sched *s, int64_t id)
{
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->id == id) return s->running[i];
    for (int i = 0; i < s->n_waiting; i++)
        if (s->waiting[i]->id == id) return s->waiting[i];
    return NULL;
}

const struct sched_seq *sched_find(const struct sched *s, int64_t seq_id)
{
    return find_seq(s, seq_id);
}

int sched_abort(struct sched *s, int64_t seq_id, char *err, size_t errlen)
{
    struct sched_seq *q = find_seq(s, seq_id);
    if (!q) return err_set(err, errlen, ERR_NOT_FOUND, "no live sequence %lld", (long long)seq_id);
    q->abort_requested = true;
    return 0;
}

bool sched_has_work(const struct sched *s) { return s->n_waiting + s->n_running > 0; }

/* Removes element i of arr[*n], keeping the order. */
static void remove_at(struct sched_seq **arr, int *n, int i)
{
    memmove(arr + i, arr + i + 1, sizeof *arr * (size_t)(*n - i - 1));
    (*n)--;
}

static void emit(sched_output_fn cb, void *ud, const struct sched_seq *q, int32_t token,
                 enum sched_finish f, const struct sched_logprob *lp)
{
    if (!cb) return;
    struct sched_output o = { .seq_id = q->id, .user = q->user, .token = token,
                              .finished = f != FINISH_NONE, .finish = f, .logprob = lp };
    cb(ud, &o);
}

/* Drops every sequence with a pending abort: frees its blocks and reports it. */
static void drop_aborted(struct sched *s, sched_output_fn cb, void *ud)
{
    struct sched_seq **lists[2] = { s->waiting, s->running };
    int *counts[2] = { &s->n_waiting, &s->n_running };
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < *counts[l];) {
            struct sched_seq *q = lists[l][i];
            if (!q->abort_requested) { i++; continue; }
            remove_at(lists[l], counts[l], i);
            q->status = SEQ_ABORTED;
            q->finish = FINISH_ABORT;
            emit(cb, ud, q, -1, FINISH_ABORT, NULL);
            seq_destroy(s, q);
        }
    }
}

/* Moves running[i] back to the front of the waiting queue with no blocks; it recomputes
 * its prompt and generated tokens when readmitted. */
static void preempt(struct sched *s, int i)
{
    struct sched_seq *q = s->running[i];
    remove_at(s->running, &s->n_running, i);
    bm_seq_release(s->bm, q->bs);
    q->num_computed = 0;
    q->status = SEQ_WAITING;
    q->num_preemptions++;
    memmove(s->waiting + 1, s->waiting, sizeof *s->waiting * (size_t)s->n_waiting);
    s->waiting[0] = q;
    s->n_waiting++;
    s->preemptions++;
}

/* Picks this step's work into s->entries; returns the number of entries or a negative
 * code. Running sequences first (oldest first), then FCFS admission. */
static int schedule(struct sched *s, char *err, size_t errlen)
{
    int budget = s->cfg.max_num_batched_tokens, n_entries = 0, rc;
    bool preempted = false;
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct sched_seq *q = s->running[i];
        int n_new = q->n_tokens - q->num_computed;
        if (n_new > budget) {
            if (!s->cfg.enable_chunked_prefill) continue;
            n_new = budget;
        }
        /* make room by preempting the newest running sequences, this one last */
        while (!bm_seq_can_append(s->bm, q->bs, n_new)) {
            int victim = s->n_running - 1;
            preempt(s, victim);
            preempted = true;
            if (victim == i) break;
        }
        if (i >= s->n_running) break; /* q itself was preempted */
        if ((rc = bm_seq_append_slots(s->bm, q->bs, n_new, err, errlen))) return rc;
        s->entries[n_entries++] = (struct sched_entry){ .seq = q, .n_new = n_new, .logit = -1 };
        budget -= n_new;
    }
    const void *salt;
    while (!preempted && s->n_waiting > 0 && s->n_running < s->cfg.max_num_seqs && budget > 0) {
        struct sched_seq *q = s->waiting[0];
        int64_t n_cached = 0;
        salt = q->salt_len ? q->salt : NULL;
        bm_can_allocate(s->bm, q->tokens, q->n_tokens, salt, q->salt_len, q->n_tokens, &n_cached,
                        NULL);
        int n_new = q->n_tokens - (int)n_cached;
        if (n_new > budget) {
            if (!s->cfg.enable_chunked_prefill) break;
            n_new = budget;
        }
        if (!bm_can_allocate(s->bm, q->tokens, q->n_tokens, salt, q->salt_len, n_cached + n_new,
                             NULL, NULL))
            break;
        if ((rc = bm_seq_alloc_prompt(s->bm, q->bs, q->tokens, q->n_tokens, &n_cached, err,
                                      errlen)))
            return rc;
        if ((rc = bm_seq_append_slots(s->bm, q->bs, n_new, err, errlen))) return rc;
        q->num_computed = q->n_cached = (int)n_cached;
        q->status = SEQ_RUNNING;
        remove_at(s->waiting, &s->n_waiting, 0);
        s->running[s->n_running++] = q;
        s->entries[n_entries++] = (struct sched_entry){ .seq = q, .n_new = n_new, .logit = -1,
                                                        .admitted = true };
        budget -= n_new;
    }
    return n_entries;
}

/* Fills the flat batch arrays from s->entries[0, n). */
static int fill_batch(struct sched *s, int n, struct batch *b, char *err, size_t errlen)
{
    int row = 0, n_logits = 0, rc;
    for (int e = 0; e < n; e++) {
        struct sched_entry *en = &s->entries[e];
        struct sched_seq *q = en->seq;
        int pos0 = q->num_computed;
        s->query_start[e] = row;
        memcpy(s->token_ids + row, q->tokens + pos0, sizeof *s->token_ids * (size_t)en->n_new);
        for (int k = 0; k < en->n_new; k++) s->positions[row + k] = pos0 + k;
        if ((rc = bm_seq_slot_mapping(s->bm, q->bs, pos0, en->n_new, s->slot_mapping + row, err,
                                      errlen)))
            return rc;
        s->seq_lens[e] = pos0 + en->n_new;
        int nb;
        const int32_t *bt = bm_seq_block_table(q->bs, &nb);
        memcpy(s->block_tables + (size_t)e * (size_t)s->max_blocks_per_seq, bt,
               sizeof *bt * (size_t)nb);
        row += en->n_new;
        /* logits only where the whole context is now computed: the next token is due */
        if (pos0 + en->n_new == q->n_tokens) {
            en->logit = n_logits;
            s->logits_indices[n_logits++] = row - 1;
        }
    }
    s->query_start[n] = row;
    *b = (struct batch){
        .num_tokens = row, .num_seqs = n, .token_ids = s->token_ids, .positions = s->positions,
        .slot_mapping = s->slot_mapping, .query_start = s->query_start, .seq_lens = s->seq_lens,
        .block_tables = s->block_tables, .max_blocks_per_seq = s->max_blocks_per_seq,
        .num_logits = n_logits, .logits_indices = s->logits_indices,
    };
    return 0;
}

int sched_step(struct sched *s, sched_output_fn cb, void *ud, char *err, size_t errlen)
{
    drop_aborted(s, cb, ud);
    if (!sched_has_work(s)) return 0;
    int n = schedule(s, err, errlen);
    if (n < 0) return n;
    if (n == 0)
        return err_set(err, errlen, ERR_RANGE, "scheduler: %d sequences waiting but none fits",
                       s->n_waiting);
    struct batch b;
    int rc;
    if ((rc = fill_batch(s, n, &b, err, errlen))) return rc;
    if ((rc = model_forward(s->fs, s->kv, &b, err, errlen))) return rc;
    s->steps++;
    s->batched_tokens += (uint64_t)b.num_tokens;
    s->prefill_tokens += (uint64_t)(b.num_tokens - b.num_logits);

    int vocab = s->m->cfg.vocab_size;
    for (int e = 0; e < n; e++) {
        struct sched_entry *en = &s->entries[e];
        struct sched_seq *q = en->seq;
        q->num_computed += en->n_new;
        if ((rc = bm_seq_commit(s->bm, q->bs, q->tokens, q->num_computed, err, errlen)))
            return rc;
        if (en->admitted && cb) {
            struct sched_output o = { .seq_id = q->id, .user = q->user, .token = -1,
                                      .admitted = true, .n_cached = q->n_cached };
            cb(ud, &o);
        }
        if (en->logit < 0) continue;
        float *row = s->fs->logits + (size_t)en->logit * (size_t)vocab;
        int32_t tok = sampler_sample(q->sampler, row);
        if (tok < 0) return err_set(err, errlen, tok, "seq %lld: no token can be sampled",
                                    (long long)q->id);
        sampler_accept(q->sampler, tok);
        q->tokens[q->n_tokens++] = tok;
        if (!q->ignore_eos && model_is_eog(s->m, tok)) q->finish = FINISH_STOP;
        else if (q->n_tokens - q->n_prompt >= q->max_tokens) q->finish = FINISH_LENGTH;
        if (q->finish != FINISH_NONE) q->status = SEQ_FINISHED;
        const struct sched_logprob *lp = NULL;
        if (q->logprobs >= 0) {
            /* sampler_sample restored the raw row: logprobs are over the model's logits */
            s->lp.token = tok;
            s->lp.logprob = -INFINITY;
            int n_top = sampler_logprobs(row, vocab, tok, q->logprobs, s->lp.top_ids,
                                         s->lp.top_logprobs, &s->lp.logprob);
            s->lp.n_top = n_top > 0 ? n_top : 0;
            lp = &s->lp;
        }
        emit(cb, ud, q, tok, q->finish, lp);
    }
    /* free finished sequences; their computed full blocks stay cached */
    for (int i = 0; i < s->n_running;) {
        struct sched_seq *q = s->running[i];
        if (q->status != SEQ_FINISHED) { i++; continue; }
        remove_at(s->running, &s->n_running, i);
        seq_destroy(s, q);
    }
    return 0;
}

void sched_get_stats(const struct sched *s, struct sched_stats *st)
{
    *st = (struct sched_stats){ .steps = s->steps, .preemptions = s->preemptions,
                                .prefill_tokens = s->prefill_tokens,
                                .batched_tokens = s->batched_tokens,
                                .num_waiting = s->n_waiting, .num_running = s->n_running };
    bm_get_stats(s->bm, &st->bm);
}

const struct block_manager *sched_block_manager(const struct sched *s) { return s->bm; }

const struct sched_config *sched_get_config(const struct sched *s) { return &s->cfg; }
