/* scheduler.c — see scheduler.h for the policy, the overlap and the invariants.
 *
 * One sched_step:
 *   1. drop aborted sequences (reported at once; freed when no step in flight has them);
 *   2. plan the next step into the free plan: running sequences (preempting the newest
 *      when blocks run out), then FCFS admission; fill its flat batch — a decode row whose
 *      token is still being sampled by the step in flight is BACKEND_TOKEN_PREV(row);
 *   3. wait for the step in flight (overlap) and record it: commit its KV, append each
 *      sampled token to its sequence and its sampler, decide EOS / length / row errors;
 *   4. fill the token masks of the planned step's constrained rows (their matchers now
 *      hold every recorded token), then submit it (unless every sequence in it has
 *      finished meanwhile); without overlap, wait for it and record it right away;
 *   5. report what was recorded through the callback; free finished sequences that no
 *      step in flight refers to.
 * Recording happens before the next submit, so every sampler holds its sequence's full
 * history when the backend samples from it; reporting happens after, so the caller's
 * per-token work overlaps the backend's step.
 */
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "grammar/grammar.h"
#include "model/batch.h"
#include "model/model.h"
#include "util/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* a speculative row looks past at most the whole proposal (backend_sample.prior) */
_Static_assert(SPEC_MAX_TOKENS <= SAMPLER_MAX_AHEAD, "a proposal longer than a draw can look ahead");

/* One sequence's share of a step. */
struct sched_entry {
    struct sched_seq *seq;
    int n_new;      /* rows: positions pos0 .. pos0 + n_new - 1 */
    int logit;      /* logits row of this step, or -1 (mid-prefill chunk) */
    bool admitted;  /* admitted in this step (reported as an admitted event) */
    int n_score;    /* scoring rows (prompt logprobs): logits rows score_row .. + n_score - 1 */
    int score_row;  /* score positions score_pos .. (each gives the next prompt token's logprob) */
    int score_pos;
    int n_draft;    /* speculative: rows 1..n_draft check these proposed tokens; the logits
                       rows logit .. logit + n_draft all sample (see record_spec) */
    int32_t draft[SPEC_MAX_TOKENS];
};

/* One step's description: planned, then in flight until recorded. The batch and the
 * samples are borrowed by the backend from submit until wait. */
struct sched_plan {
    struct sched_entry *entries;      /* [max_num_seqs] */
    int n_entries;
    int32_t *token_ids;               /* [max_num_batched_tokens] */
    int32_t *positions;               /* [max_num_batched_tokens] */
    int64_t *slot_mapping;            /* [max_num_batched_tokens] */
    int32_t *query_start;             /* [max_num_seqs + 1] */
    int32_t *seq_lens;                /* [max_num_seqs] */
    int32_t *block_tables;            /* [max_num_seqs][max_blocks_per_seq] */
    int32_t *logits_indices;          /* [max_num_seqs] */
    struct backend_sample *samples;   /* [max_num_seqs] */
    uint32_t *masks;                  /* [max_num_seqs][mask_words] the token masks of
                                         constrained logits rows (row = logits index) */
    struct batch b;
    int n_sample;                     /* logits rows that sample (the others score) */
};

struct sched {
    const struct model *m;            /* borrowed */
    struct sched_config cfg;
    struct backend *be;
    struct block_manager *bm;
    int max_blocks_per_seq;           /* ceil(max_model_len / block_size) */
    int mask_words;                   /* grammar_mask_words(vocab_size) */
    int64_t next_id;
    bool overlap;

    struct sched_seq **waiting;       /* [cap_waiting] FCFS queue, front = index 0 */
    int n_waiting, cap_waiting;
    struct sched_seq **running;       /* [max_num_seqs] in admission order, newest last */
    int n_running;
    struct sched_seq *zombies;        /* finished / aborted, still referenced by a step */

    struct sched_plan plans[2];
    int flight;                       /* index of the plan in flight, or -1 */
    struct backend_token *out;        /* [max_num_seqs] tokens of the step waited for */
    struct sched_output *events;      /* [4 * max_num_seqs] recorded, not yet reported: an
                                         admitted and a token event per row of the step
                                         recorded, a prompt event per scoring row (logits
                                         rows: max_num_seqs in all), a mask failure per row
                                         of the next */
    int n_events;
    struct sched_logprob *lps;        /* [max_num_seqs] the events' logprobs */

    uint64_t steps, preemptions, prefill_tokens, batched_tokens, discarded;
    uint64_t masked_rows, mask_ns;
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
    int n_samplers, n_matchers;
    bool broken;                      /* a backend call failed: no more steps */
    char broken_msg[ERR_BUF];
};

static const char ROW_ERROR[] = "no token can be sampled: every logit is NaN or -inf (after the logit bias)";
static const char ROW_CONSTRAINED[] = "no token satisfies the request's constraints together (the structured-output "
                                      "grammar, allowed_token_ids, min_tokens, bad_words and logit_bias leave none)";
static const char GRAMMAR_REFUSED[] = "the sampled token is not allowed by the structured-output grammar";
static const char MASK_NOMEM[] = "out of memory computing the structured-output token mask";
static const char GRAMMAR_TOO_AMBIGUOUS[] = "the structured-output grammar is too ambiguous to continue (its parses "
                                            "multiply past the matcher's work bound: docs/grammar.md)";

void sched_config_default(struct sched_config *c)
{
    *c = (struct sched_config){ .max_num_seqs = 256, .max_num_batched_tokens = 2048,
                                .block_size = KV_DEFAULT_BLOCK_SIZE, .enable_prefix_caching = true,
                                .enable_chunked_prefill = true, .overlap = SCHED_OVERLAP_AUTO };
    backend_config_default(&c->backend);
}

static void seq_destroy(struct sched *s, struct sched_seq *q)
{
    if (!q) return;
    bm_seq_free(s->bm, q->bs);
    if (q->sampler) {
        sampler_free(q->sampler);
        s->n_samplers--;
    }
    if (q->gm) {
        gm_free(q->gm);
        s->n_matchers--;
    }
    if (q->gm_spec) {
        gm_free(q->gm_spec);
        s->n_matchers--;
    }
    grammar_unref(q->grammar);
    free(q->tokens);
    free(q->bias_ids);
    free(q->bias);
    free(q->allowed);
    free(q->bad_words);
    free(q);
}

static void plan_free(struct sched_plan *p)
{
    free(p->entries);
    free(p->token_ids);
    free(p->positions);
    free(p->slot_mapping);
    free(p->query_start);
    free(p->seq_lens);
    free(p->block_tables);
    free(p->logits_indices);
    free(p->samples);
    free(p->masks);
}

static bool plan_alloc(struct sched_plan *p, size_t T, size_t S, size_t max_blocks, size_t mask_words)
{
    p->entries = calloc(S, sizeof *p->entries);
    p->token_ids = calloc(T, sizeof *p->token_ids);
    p->positions = calloc(T, sizeof *p->positions);
    p->slot_mapping = calloc(T, sizeof *p->slot_mapping);
    p->query_start = calloc(S + 1, sizeof *p->query_start);
    p->seq_lens = calloc(S, sizeof *p->seq_lens);
    p->block_tables = calloc(S * max_blocks, sizeof *p->block_tables);
    p->logits_indices = calloc(S, sizeof *p->logits_indices);
    p->samples = calloc(S, sizeof *p->samples);
    p->masks = calloc(S * mask_words, sizeof *p->masks);
    return p->entries && p->token_ids && p->positions && p->slot_mapping && p->query_start && p->seq_lens &&
           p->block_tables && p->logits_indices && p->samples && p->masks;
}

void sched_free(struct sched *s)
{
    if (!s) return;
    /* the backend first: a step in flight finishes before its sequences go */
    backend_free(s->be);
    for (int i = 0; i < s->n_waiting; i++) seq_destroy(s, s->waiting[i]);
    for (int i = 0; i < s->n_running; i++) seq_destroy(s, s->running[i]);
    while (s->zombies) {
        struct sched_seq *q = s->zombies;
        s->zombies = q->next_zombie;
        seq_destroy(s, q);
    }
    bm_free(s->bm);
    free(s->waiting);
    free(s->running);
    for (int i = 0; i < 2; i++) plan_free(&s->plans[i]);
    free(s->out);
    free(s->events);
    free(s->lps);
    free(s);
}

int sched_create(struct sched **out, const struct model *m, const struct sched_config *cfg,
                 char *err, size_t errlen)
{
    *out = NULL;
    struct sched_config c = *cfg;
    if (c.block_size <= 0) c.block_size = KV_DEFAULT_BLOCK_SIZE;
    if (c.max_num_seqs <= 0 || c.max_num_batched_tokens <= 0 || c.max_model_len <= 1)
        return err_set(err, errlen, ERR_INVALID,
                       "scheduler: max_num_seqs, max_num_batched_tokens must be > 0 and max_model_len > 1");
    if (c.max_model_len > m->cfg.max_seq_len)
        return err_set(err, errlen, ERR_RANGE, "scheduler: max_model_len %d exceeds the model's %d",
                       c.max_model_len, m->cfg.max_seq_len);
    if (!c.enable_chunked_prefill && c.max_num_batched_tokens < c.max_model_len)
        return err_set(err, errlen, ERR_INVALID,
                       "scheduler: without chunked prefill max_num_batched_tokens (%d) must be "
                       ">= max_model_len (%d)", c.max_num_batched_tokens, c.max_model_len);
    int rc = spec_config_check(&c.spec, err, errlen);
    if (rc) return rc;
    c.backend.max_num_seqs = c.max_num_seqs;
    c.backend.max_num_batched_tokens = c.max_num_batched_tokens;
    c.backend.max_model_len = c.max_model_len;
    c.backend.block_size = c.block_size;

    struct sched *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, errlen, ERR_NOMEM, "scheduler: out of memory");
    s->m = m;
    s->next_id = 1;
    s->flight = -1;
    s->max_blocks_per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
    s->mask_words = grammar_mask_words(m->cfg.vocab_size);
    if ((rc = backend_create(&s->be, m, &c.backend, err, errlen))) goto fail;
    const struct backend_info *info = backend_get_info(s->be);
    /* one sequence alone must always fit, or preemption could never make progress */
    if ((int64_t)info->num_blocks * c.block_size < c.max_model_len) {
        rc = err_set(err, errlen, ERR_INVALID, "scheduler: %d blocks of %d tokens cannot hold max_model_len %d",
                     info->num_blocks, c.block_size, c.max_model_len);
        goto fail;
    }
    c.backend.num_blocks = info->num_blocks;
    c.backend.kv_dtype = info->kv_dtype;
    c.backend.kv_dtype_auto = false;
    if (c.overlap == SCHED_OVERLAP_AUTO) c.overlap = !strcmp(info->name, "cuda") ? SCHED_OVERLAP_ON : SCHED_OVERLAP_OFF;
    if (c.spec.num_tokens > 0) c.overlap = SCHED_OVERLAP_OFF; /* a proposal needs the last token */
    s->overlap = c.overlap == SCHED_OVERLAP_ON;
    s->cfg = c;
    /* a secret key, so clients cannot aim prefix-cache hash collisions */
    uint8_t key[16];
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) {
        rc = err_set(err, errlen, ERR_IO, "scheduler: getrandom failed");
        goto fail;
    }
    if ((rc = bm_create(&s->bm, info->num_blocks, c.block_size, c.enable_prefix_caching, key, err, errlen)))
        goto fail;
    size_t T = (size_t)c.max_num_batched_tokens, S = (size_t)c.max_num_seqs;
    s->running = calloc(S, sizeof *s->running);
    s->out = calloc(S, sizeof *s->out);
    s->events = calloc(4 * S, sizeof *s->events);
    s->lps = calloc(S, sizeof *s->lps);
    bool ok = s->running && s->out && s->events && s->lps;
    for (int i = 0; i < 2; i++) ok = plan_alloc(&s->plans[i], T, S, (size_t)s->max_blocks_per_seq, (size_t)s->mask_words) && ok;
    if (!ok) {
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
    *p = (struct sched_seq_params){ .logprobs = -1, .prompt_logprobs = -1 };
    sampler_params_default(&p->sp);
}

int sched_check_bad_words(const int32_t *words, int len, int vocab, char *err, size_t errlen)
{
    if (len < 0 || (len && !words)) return err_set(err, errlen, ERR_INVALID, "bad_words: %d entries", len);
    int n = 0;
    for (int i = 0; i < len; i += 1 + words[i], n++) {
        if (words[i] < 1 || words[i] > SCHED_MAX_BAD_WORD_TOKENS || words[i] >= len - i)
            return err_set(err, errlen, ERR_INVALID, "bad_words: word %d has %d tokens (1..%d, within the list)", n,
                           words[i], SCHED_MAX_BAD_WORD_TOKENS);
        for (int k = 1; k <= words[i]; k++)
            if (words[i + k] < 0 || words[i + k] >= vocab)
                return err_set(err, errlen, ERR_INVALID, "bad_words: token id %d is outside the vocabulary [0, %d)",
                               words[i + k], vocab);
    }
    if (n > SCHED_MAX_BAD_WORDS)
        return err_set(err, errlen, ERR_INVALID, "bad_words: %d token sequences (at most %d)", n, SCHED_MAX_BAD_WORDS);
    return 0;
}

int sched_check_end_params(const int32_t *stop_ids, int n_stop_ids, int min_tokens, int vocab, char *err,
                           size_t errlen)
{
    if (min_tokens < 0) return err_set(err, errlen, ERR_INVALID, "min_tokens: %d < 0", min_tokens);
    if (n_stop_ids < 0 || n_stop_ids > SCHED_MAX_STOP_IDS)
        return err_set(err, errlen, ERR_INVALID, "stop_token_ids: %d ids (at most %d)", n_stop_ids,
                       SCHED_MAX_STOP_IDS);
    for (int i = 0; i < n_stop_ids; i++)
        if (stop_ids[i] < 0 || stop_ids[i] >= vocab)
            return err_set(err, errlen, ERR_INVALID, "stop_token_ids: token id %d is outside the vocabulary [0, %d)",
                           stop_ids[i], vocab);
    return 0;
}

/* Whether a goes before b under the PRIORITY policy: lower priority value, then earlier
 * arrival. */
static bool goes_before(const struct sched_seq *a, const struct sched_seq *b)
{
    return a->priority != b->priority ? a->priority < b->priority : a->id < b->id;
}

/* Adds q to the list arr[*n] (capacity checked by the caller): at the end under FCFS, at
 * its (priority, arrival) place under PRIORITY. */
static void insert_ordered(struct sched *s, struct sched_seq **arr, int *n, struct sched_seq *q)
{
    int i = *n;
    if (s->cfg.policy == SCHED_PRIORITY)
        while (i > 0 && goes_before(q, arr[i - 1])) i--;
    memmove(arr + i + 1, arr + i, sizeof *arr * (size_t)(*n - i));
    arr[i] = q;
    (*n)++;
}

int sched_add(struct sched *s, const int32_t *ids, int n, const struct sched_seq_params *p,
              int64_t *seq_id, char *err, size_t errlen)
{
    int vocab = s->m->cfg.vocab_size;
    if (!ids || n <= 0) return err_set(err, errlen, ERR_INVALID, "empty prompt");
    if (n >= s->cfg.max_model_len)
        return err_set(err, errlen, ERR_RANGE,
                       "prompt of %d tokens leaves no room to generate (max_model_len %d)", n,
                       s->cfg.max_model_len);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return err_set(err, errlen, ERR_INVALID, "token id %d at %d outside the vocabulary",
                           ids[i], i);
    int rc = sampler_params_validate(&p->sp, err, errlen);
    if (rc) return rc;
    if (p->logprobs < -1 || p->logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return err_set(err, errlen, ERR_RANGE, "logprobs %d outside [-1, %d]", p->logprobs,
                       SAMPLER_MAX_TOP_LOGPROBS);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return err_set(err, errlen, ERR_RANGE, "prompt_logprobs %d outside [-1, %d]", p->prompt_logprobs,
                       SAMPLER_MAX_TOP_LOGPROBS);
    if (p->salt_len > BM_SALT_MAX || (p->salt_len && !p->salt))
        return err_set(err, errlen, ERR_RANGE, "cache salt of %zu bytes (at most %d)",
                       p->salt_len, BM_SALT_MAX);
    /* the logit bias is checked here as sampler_set_logit_bias will at admission */
    if (p->n_bias < 0 || p->n_bias > SAMPLER_MAX_LOGIT_BIAS || (p->n_bias && (!p->bias_ids || !p->bias)))
        return err_set(err, errlen, ERR_RANGE, "logit_bias: %d entries (at most %d)", p->n_bias,
                       SAMPLER_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= vocab || isnan(p->bias[i]) || p->bias[i] == INFINITY)
            return err_set(err, errlen, ERR_RANGE, "logit_bias: %d entries, ids must be in [0, %d) and biases "
                           "not NaN or +inf", p->n_bias, vocab);
    if ((rc = sched_check_end_params(p->stop_ids, p->n_stop_ids, p->min_tokens, vocab, err, errlen))) return rc;
    if (p->n_allowed < 0 || (p->n_allowed && !p->allowed_ids))
        return err_set(err, errlen, ERR_INVALID, "allowed_token_ids: %d ids", p->n_allowed);
    for (int i = 0; i < p->n_allowed; i++)
        if (p->allowed_ids[i] < 0 || p->allowed_ids[i] >= vocab)
            return err_set(err, errlen, ERR_INVALID, "allowed_token_ids: token id %d is outside the vocabulary [0, %d)",
                           p->allowed_ids[i], vocab);
    if ((rc = sched_check_bad_words(p->bad_words, p->bad_words_len, vocab, err, errlen))) return rc;
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
    if (p->n_bias) {
        q->bias_ids = malloc(sizeof *q->bias_ids * (size_t)p->n_bias);
        q->bias = malloc(sizeof *q->bias * (size_t)p->n_bias);
    }
    if (p->n_allowed) {
        q->allowed = calloc((size_t)s->mask_words, sizeof *q->allowed);
        for (int i = 0; q->allowed && i < p->n_allowed; i++)
            q->allowed[p->allowed_ids[i] / 32] |= 1u << (p->allowed_ids[i] % 32);
    }
    if (p->bad_words_len) {
        q->bad_words = malloc(sizeof *q->bad_words * (size_t)p->bad_words_len);
        if (q->bad_words) memcpy(q->bad_words, p->bad_words, sizeof *q->bad_words * (size_t)p->bad_words_len);
        q->bad_words_len = p->bad_words_len;
    }
    if (!q->tokens || (p->n_bias && (!q->bias_ids || !q->bias)) || (p->n_allowed && !q->allowed) ||
        (p->bad_words_len && !q->bad_words)) {
        rc = err_set(err, errlen, ERR_NOMEM, "out of memory creating a sequence");
        goto fail;
    }
    if ((rc = bm_seq_create(s->bm, n + max_tokens, p->salt, p->salt_len, &q->bs, err, errlen)))
        goto fail;
    memcpy(q->tokens, ids, sizeof *ids * (size_t)n);
    if (p->n_bias) {
        memcpy(q->bias_ids, p->bias_ids, sizeof *q->bias_ids * (size_t)p->n_bias);
        memcpy(q->bias, p->bias, sizeof *q->bias * (size_t)p->n_bias);
    }
    q->n_bias = p->n_bias;
    q->sp = p->sp;
    if (p->salt_len) memcpy(q->salt, p->salt, p->salt_len);
    q->salt_len = p->salt_len;
    q->id = s->next_id++;
    q->status = SEQ_WAITING;
    q->n_prompt = q->n_tokens = n;
    q->max_tokens = max_tokens;
    q->ignore_eos = p->ignore_eos;
    memcpy(q->stop_ids, p->stop_ids, sizeof q->stop_ids[0] * (size_t)p->n_stop_ids);
    q->n_stop_ids = p->n_stop_ids;
    q->min_tokens = p->min_tokens;
    q->logprobs = p->logprobs;
    q->prompt_logprobs = p->prompt_logprobs;
    q->plp_next = p->prompt_logprobs >= 0 ? 1 : n;
    q->user = p->user;
    q->grammar = grammar_ref(p->grammar);
    q->gm_on = !p->grammar_deferred;
    q->grammar_start_token = p->grammar_start_token;
    q->pending_row = -1;
    q->spec_cap = s->cfg.spec.num_tokens;
    q->priority = p->priority;
    insert_ordered(s, s->waiting, &s->n_waiting, q);
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

bool sched_has_work(const struct sched *s)
{
    return s->n_waiting + s->n_running > 0 || s->flight >= 0 || s->zombies;
}

/* Removes element i of arr[*n], keeping the order. */
static void remove_at(struct sched_seq **arr, int *n, int i)
{
    memmove(arr + i, arr + i + 1, sizeof *arr * (size_t)(*n - i - 1));
    (*n)--;
}

/* Takes q off the waiting or running list. */
static void unlist(struct sched *s, struct sched_seq *q)
{
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == q) return remove_at(s->running, &s->n_running, i);
    for (int i = 0; i < s->n_waiting; i++)
        if (s->waiting[i] == q) return remove_at(s->waiting, &s->n_waiting, i);
}

/* q has finished (reported or about to be): off the lists; freed now, or once the steps
 * that include it have completed. */
static void retire(struct sched *s, struct sched_seq *q)
{
    unlist(s, q);
    if (q->refs == 0) {
        seq_destroy(s, q);
        return;
    }
    q->next_zombie = s->zombies;
    s->zombies = q;
}

static void reap_zombies(struct sched *s)
{
    for (struct sched_seq **pp = &s->zombies; *pp;) {
        struct sched_seq *q = *pp;
        if (q->refs > 0) {
            pp = &q->next_zombie;
            continue;
        }
        *pp = q->next_zombie;
        seq_destroy(s, q);
    }
}

static void emit(sched_output_fn cb, void *ud, const struct sched_seq *q, int32_t token,
                 enum sched_finish f, const struct sched_logprob *lp)
{
    if (!cb) return;
    struct sched_output o = { .seq_id = q->id, .user = q->user, .token = token,
                              .finished = f != FINISH_NONE, .finish = f, .logprob = lp };
    cb(ud, &o);
}

/* Drops every sequence with a pending abort: reports it; its blocks go with it (after the
 * step in flight, if that step includes it). */
static void drop_aborted(struct sched *s, sched_output_fn cb, void *ud)
{
    struct sched_seq **lists[2] = { s->waiting, s->running };
    int *counts[2] = { &s->n_waiting, &s->n_running };
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < *counts[l];) {
            struct sched_seq *q = lists[l][i];
            if (!q->abort_requested) { i++; continue; }
            q->status = SEQ_ABORTED;
            q->finish = FINISH_ABORT;
            emit(cb, ud, q, -1, FINISH_ABORT, NULL);
            retire(s, q); /* removes lists[l][i] */
        }
    }
}

/* Moves running[i] back to the waiting queue (FCFS: its front) with no blocks; it recomputes
 * its prompt and generated tokens when readmitted. A token it has in flight is still
 * recorded when that step completes (its sampler keeps it). */
static void preempt(struct sched *s, int i)
{
    struct sched_seq *q = s->running[i];
    remove_at(s->running, &s->n_running, i);
    bm_seq_release(s->bm, q->bs);
    q->num_computed = 0;
    q->num_done = 0;
    q->status = SEQ_WAITING;
    q->num_preemptions++;
    if (s->cfg.policy == SCHED_PRIORITY) {
        insert_ordered(s, s->waiting, &s->n_waiting, q);
    } else { /* FCFS: it was admitted before everything waiting */
        memmove(s->waiting + 1, s->waiting, sizeof *s->waiting * (size_t)s->n_waiting);
        s->waiting[0] = q;
        s->n_waiting++;
    }
    s->preemptions++;
}

/* Tokens of q known or being sampled: the step in flight may owe it one. */
static int known_len(const struct sched_seq *q) { return q->n_tokens + (q->pending_row >= 0); }

/* Creates q's sampler at its first admission: params, logit bias, prompt history; and
 * the grammar matcher of a constrained sequence (at the start of its grammar: nothing
 * generated yet). */
static int make_sampler(struct sched *s, struct sched_seq *q, char *err, size_t errlen)
{
    if (q->grammar && !q->gm) {
        q->gm = gm_create(q->grammar);
        if (!q->gm) return err_set(err, errlen, ERR_NOMEM, "out of memory creating a grammar matcher");
        s->n_matchers++;
    }
    if (q->grammar && s->cfg.spec.num_tokens > 0 && !q->gm_spec) { /* speculative rows' masks */
        q->gm_spec = gm_create(q->grammar);
        if (!q->gm_spec) return err_set(err, errlen, ERR_NOMEM, "out of memory creating a grammar matcher");
        s->n_matchers++;
    }
    if (q->sampler) return 0;
    q->sampler = sampler_create(&q->sp, s->m->cfg.vocab_size);
    if (!q->sampler) return err_set(err, errlen, ERR_NOMEM, "out of memory creating a sampler");
    s->n_samplers++;
    /* checked at sched_add */
    if (q->n_bias) sampler_set_logit_bias(q->sampler, q->bias_ids, q->bias, q->n_bias);
    sampler_accept_prompt(q->sampler, q->tokens, q->n_prompt);
    return 0;
}

/* Scoring rows (prompt logprobs) of q's chunk [pos0, pos0 + n_new): the positions from
 * *first on whose logits give a prompt token's logprob still due. */
static int score_count(const struct sched_seq *q, int pos0, int n_new, int *first)
{
    int lo = pos0 > q->plp_next - 1 ? pos0 : q->plp_next - 1;
    int hi = pos0 + n_new < q->n_prompt - 1 ? pos0 + n_new : q->n_prompt - 1;
    *first = lo;
    return hi > lo ? hi - lo : 0;
}

/* The logits rows q's chunk [pos0, pos0 + *n_new) needs: its scoring rows, and the
 * sampling row when the chunk reaches q's known length. More than avail (>= 1): the chunk
 * is cut after avail scoring rows (it then ends inside the prompt, with no sampling row). */
static int fit_rows(const struct sched_seq *q, int pos0, int *n_new, int avail)
{
    int first, ns = score_count(q, pos0, *n_new, &first);
    int rows = ns + (pos0 + *n_new == known_len(q));
    if (rows <= avail) return rows;
    *n_new = first + avail - pos0;
    return avail;
}

/* How much of q's prompt the prefix cache may serve: all of it, or while prompt logprobs
 * are due, the positions before the first one whose logits are needed. */
static int lookup_len(const struct sched_seq *q)
{
    return q->plp_next < q->n_prompt ? q->plp_next - 1 : q->n_tokens;
}

/* Speculative decoding: the tokens proposed for decoding sequence q (its next token due, no
 * step in flight for it) into draft[], at most what the step has to spare: budget tokens,
 * rows logits rows, q's max_tokens (every row may yield a token), and KV blocks (a
 * proposal never preempts). 0 when speculation is off, for a sequence whose deferred
 * grammar has not started, or while a request waits for the rows. Penalties, a grammar,
 * min_tokens and bad words do not stop it: each row counts the proposed tokens before it
 * (backend_sample.prior), and its mask is the one those tokens lead to (plan_masks: the
 * grammar's state after them, the end tokens out while its own token is short of
 * min_tokens, the bad words they would complete). */
static int propose(struct sched *s, struct sched_seq *q, int budget, int rows, int32_t *draft)
{
    const struct sched_config *c = &s->cfg;
    int n_gen = q->n_tokens - q->n_prompt;
    if (c->spec.num_tokens <= 0 || s->n_waiting > 0 ||
        (c->spec.disable_by_batch_size > 0 && s->n_running > c->spec.disable_by_batch_size) ||
        q->pending_row >= 0 || (q->gm && !q->gm_on))
        return 0;
    if (q->spec_wait > 0) { /* backing off after proposals that kept nothing */
        q->spec_wait--;
        return 0;
    }
    int max = q->max_tokens - n_gen - 1;
    if (max > q->spec_cap) max = q->spec_cap;
    if (max > budget) max = budget;
    if (max > rows) max = rows;
    if (max <= 0) return 0;
    int n = spec_ngram_propose(q->tokens, q->n_tokens, &c->spec, max, draft);
    while (n > 0 && !bm_seq_can_append(s->bm, q->bs, 1 + n)) n--;
    return n;
}

/* Picks the next step's work into plan p; returns the number of entries or a negative
 * code. Running sequences first (oldest first), then FCFS admission. Logits rows: one per
 * running sequence is reserved; scoring rows and admissions take the others, so a step
 * never has more than max_num_seqs. */
static int schedule(struct sched *s, struct sched_plan *p, char *err, size_t errlen)
{
    int budget = s->cfg.max_num_batched_tokens, n_entries = 0, rc;
    int rows_left = s->cfg.max_num_seqs - s->n_running;
    bool preempted = false;
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct sched_seq *q = s->running[i];
        /* the token in flight ends it by length: nothing more to compute */
        if (q->pending_row >= 0 && q->n_tokens + 1 - q->n_prompt >= q->max_tokens) continue;
        int n_new = known_len(q) - q->num_computed;
        if (n_new <= 0) continue;
        if (n_new > budget) {
            if (!s->cfg.enable_chunked_prefill) continue;
            n_new = budget;
        }
        int rows = fit_rows(q, q->num_computed, &n_new, rows_left + 1);
        int32_t draft[SPEC_MAX_TOKENS];
        int n_draft = n_new == 1 && rows == 1 ? propose(s, q, budget - 1, rows_left, draft) : 0;
        n_new += n_draft;
        rows_left -= n_draft;
        /* make room by preempting the last running sequences (the newest; PRIORITY: the
           lowest priority), this one last */
        while (!bm_seq_can_append(s->bm, q->bs, n_new)) {
            int victim = s->n_running - 1;
            preempt(s, victim);
            preempted = true;
            if (victim == i) break;
        }
        if (i >= s->n_running) break; /* q itself was preempted */
        if ((rc = bm_seq_append_slots(s->bm, q->bs, n_new, err, errlen))) return rc;
        struct sched_entry *en = &p->entries[n_entries++];
        *en = (struct sched_entry){ .seq = q, .n_new = n_new, .logit = -1, .n_draft = n_draft };
        memcpy(en->draft, draft, sizeof *draft * (size_t)n_draft);
        budget -= n_new;
        if (rows > 1) rows_left -= rows - 1;
    }
    const void *salt;
    while (!preempted && s->n_waiting > 0 && s->n_running < s->cfg.max_num_seqs && budget > 0 &&
           rows_left > 0) {
        struct sched_seq *q = s->waiting[0];
        if (q->pending_row >= 0) break; /* preempted with a token in flight: next time */
        int64_t n_cached = 0;
        int n_look = lookup_len(q);
        salt = q->salt_len ? q->salt : NULL;
        bm_can_allocate(s->bm, q->tokens, n_look, salt, q->salt_len, q->n_tokens, &n_cached, NULL);
        /* a full hit (every token's KV cached) still forwards the last token for its
         * logits; its KV is not rewritten (bm_seq_slot_mapping gives it slot -1) */
        int start = n_cached < q->n_tokens ? (int)n_cached : q->n_tokens - 1;
        int n_new = q->n_tokens - start;
        if (n_new > budget) {
            if (!s->cfg.enable_chunked_prefill) break;
            n_new = budget;
        }
        int rows = fit_rows(q, start, &n_new, rows_left);
        if (!bm_can_allocate(s->bm, q->tokens, n_look, salt, q->salt_len, start + n_new, NULL, NULL))
            break;
        if ((rc = make_sampler(s, q, err, errlen))) return rc;
        bm_seq_limit_lookup(q->bs, n_look);
        if ((rc = bm_seq_alloc_prompt(s->bm, q->bs, q->tokens, q->n_tokens, &n_cached, err,
                                      errlen)))
            return rc;
        if ((rc = bm_seq_append_slots(s->bm, q->bs, n_new, err, errlen))) return rc;
        q->num_computed = q->num_done = start;
        q->n_cached = (int)n_cached;
        q->status = SEQ_RUNNING;
        remove_at(s->waiting, &s->n_waiting, 0);
        insert_ordered(s, s->running, &s->n_running, q);
        p->entries[n_entries++] = (struct sched_entry){ .seq = q, .n_new = n_new, .logit = -1,
                                                        .admitted = true };
        budget -= n_new;
        rows_left -= rows;
    }
    p->n_entries = n_entries;
    return n_entries;
}

/* Fills plan p's flat batch from its entries; advances each sequence's num_computed and
 * takes a reference on it for the step. */
static int fill_batch(struct sched *s, struct sched_plan *p, char *err, size_t errlen)
{
    int row = 0, n_logits = 0, rc, n = p->n_entries;
    p->n_sample = 0;
    for (int e = 0; e < n; e++) {
        struct sched_entry *en = &p->entries[e];
        struct sched_seq *q = en->seq;
        int pos0 = q->num_computed, known = known_len(q);
        p->query_start[e] = row;
        for (int k = 0; k < en->n_new; k++) {
            int pos = pos0 + k;
            p->token_ids[row + k] = pos < q->n_tokens   ? q->tokens[pos]
                                    : en->n_draft ? en->draft[pos - q->n_tokens]
                                                  : BACKEND_TOKEN_PREV(q->pending_row);
            p->positions[row + k] = pos;
        }
        if ((rc = bm_seq_slot_mapping(s->bm, q->bs, pos0, en->n_new, p->slot_mapping + row, err,
                                      errlen)))
            return rc;
        p->seq_lens[e] = pos0 + en->n_new;
        int nb;
        const int32_t *bt = bm_seq_block_table(q->bs, &nb);
        memcpy(p->block_tables + (size_t)e * (size_t)s->max_blocks_per_seq, bt, sizeof *bt * (size_t)nb);
        /* scoring rows: each position's logits give the next prompt token's logprob */
        en->n_score = score_count(q, pos0, en->n_new, &en->score_pos);
        en->score_row = n_logits;
        for (int k = 0; k < en->n_score; k++) {
            int pos = en->score_pos + k;
            p->samples[n_logits] = (struct backend_sample){ .sampler = q->sampler, .n_logprobs = q->prompt_logprobs,
                                                            .score = true, .score_token = q->tokens[pos + 1] };
            p->logits_indices[n_logits++] = row + pos - pos0;
        }
        row += en->n_new;
        q->num_computed += en->n_new;
        q->refs++;
        /* logits only where the whole known context is now computed: the next token is due
         * (and, speculating, the n_draft after it, one row each) */
        if (pos0 + en->n_new == known + en->n_draft) {
            en->logit = n_logits;
            q->pending_row = n_logits;
            q->pending_plan = (int)(p - s->plans);
            for (int k = 0; k <= en->n_draft; k++) {
                p->samples[n_logits] = (struct backend_sample){ .sampler = q->sampler, .n_logprobs = q->logprobs,
                                                                .ahead = (uint32_t)k,
                                                                .prior = k ? en->draft : NULL };
                p->logits_indices[n_logits++] = row - 1 - en->n_draft + k;
            }
            p->n_sample += 1 + en->n_draft;
        }
    }
    p->query_start[n] = row;
    p->b = (struct batch){
        .num_tokens = row, .num_seqs = n, .token_ids = p->token_ids, .positions = p->positions,
        .slot_mapping = p->slot_mapping, .query_start = p->query_start, .seq_lens = p->seq_lens,
        .block_tables = p->block_tables, .max_blocks_per_seq = s->max_blocks_per_seq,
        .num_logits = n_logits, .logits_indices = p->logits_indices,
    };
    return 0;
}

/* Drops plan p without running it: its sequences all finished after it was planned. */
static void plan_discard(struct sched_plan *p)
{
    for (int e = 0; e < p->n_entries; e++) p->entries[e].seq->refs--;
    p->n_entries = 0;
}

static bool seq_live(const struct sched_seq *q) { return q->status == SEQ_RUNNING || q->status == SEQ_WAITING; }

static void push_event(struct sched *s, const struct sched_seq *q, int32_t token, enum sched_finish f,
                       const struct sched_logprob *lp, bool admitted, const char *error)
{
    s->events[s->n_events++] = (struct sched_output){
        .seq_id = q->id, .user = q->user, .token = token, .finished = f != FINISH_NONE, .finish = f,
        .admitted = admitted, .n_cached = q->n_cached, .logprob = lp, .error = error,
    };
}

/* A prompt event: position's token and its logprob (prompt_logprobs). */
static void push_prompt_event(struct sched *s, const struct sched_seq *q, int position,
                              const struct sched_logprob *lp)
{
    push_event(s, q, q->tokens[position], FINISH_NONE, lp, false, NULL);
    s->events[s->n_events - 1].prompt = true;
    s->events[s->n_events - 1].position = position;
}

/* Logits row `row`'s logprobs (backend token t) as an event's logprob. */
static const struct sched_logprob *row_logprob(struct sched *s, int row, const struct backend_token *t)
{
    struct sched_logprob *d = &s->lps[row];
    d->token = t->token;
    d->logprob = t->logprob;
    d->rank = t->rank;
    d->n_top = t->n_top;
    memcpy(d->top_ids, t->top_ids, sizeof d->top_ids[0] * (size_t)t->n_top);
    memcpy(d->top_logprobs, t->top_logprobs, sizeof d->top_logprobs[0] * (size_t)t->n_top);
    return d;
}

/* Is tok one of q's stop token ids? */
static bool is_stop_id(const struct sched_seq *q, int32_t tok)
{
    for (int i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok) return true;
    return false;
}

/* Ends q with f; retired (and freed) at the end of the step. */
static void finish_seq(struct sched_seq *q, enum sched_finish f)
{
    q->finish = f;
    q->status = SEQ_FINISHED;
}

/* The prompt events of entry en's scoring rows (positions already reported, by a step that
 * ran before a preemption, are not planned again). False if a row failed: q ends with an
 * error. */
static bool record_scores(struct sched *s, const struct sched_entry *en, struct sched_seq *q)
{
    for (int k = 0; k < en->n_score; k++) {
        const struct backend_token *t = &s->out[en->score_row + k];
        int pos = en->score_pos + k + 1; /* the prompt position whose token was scored */
        if (t->status != 0 || t->token != q->tokens[pos]) {
            finish_seq(q, FINISH_ERROR);
            push_event(s, q, -1, FINISH_ERROR, NULL, false, ROW_ERROR);
            return false;
        }
        push_prompt_event(s, q, pos, row_logprob(s, en->score_row + k, t));
        q->plp_next = pos + 1;
    }
    return true;
}

/* Keeps sampled token tok of q (backend token t of logits row `row`): the grammar first (a
 * refused token is not kept: q ends with an error), then q's sampler and tokens, then the
 * end checks; queues its event. False if q has finished. */
static bool keep_token(struct sched *s, struct sched_seq *q, int row, const struct backend_token *t,
                       const struct sched_plan *p)
{
    if (t->status != 0 || t->token < 0 || t->token >= s->m->cfg.vocab_size) {
        const bool masked = p->samples[row].mask != NULL;
        finish_seq(q, FINISH_ERROR);
        push_event(s, q, -1, FINISH_ERROR, NULL, false, masked ? ROW_CONSTRAINED : ROW_ERROR);
        s->events[s->n_events - 1].request_error = masked;
        return false;
    }
    int32_t tok = t->token;
    int grc = q->gm && q->gm_on ? gm_accept(q->gm, tok) : 0;
    if (grc != 0) {
        finish_seq(q, FINISH_ERROR);
        push_event(s, q, -1, FINISH_ERROR, NULL, false, grc == ERR_RANGE ? GRAMMAR_TOO_AMBIGUOUS : GRAMMAR_REFUSED);
        return false;
    }
    bool constrained = q->gm && q->gm_on;
    if (q->gm && !q->gm_on && tok == q->grammar_start_token) q->gm_on = true;
    sampler_accept(q->sampler, tok);
    q->tokens[q->n_tokens++] = tok;
    /* a constrained sequence ends where its grammar does, ignore_eos or not */
    if (((!q->ignore_eos || constrained) && model_is_eog(s->m, tok)) || is_stop_id(q, tok))
        finish_seq(q, FINISH_STOP);
    else if (q->n_tokens - q->n_prompt >= q->max_tokens) finish_seq(q, FINISH_LENGTH);
    const struct sched_logprob *lp = q->logprobs >= 0 ? row_logprob(s, row, t) : NULL;
    push_event(s, q, tok, q->finish, lp, false, NULL);
    return q->finish == FINISH_NONE;
}

/* Adapts q's next proposal to how much of its last one (n_draft tokens) was kept: kept
 * whole, the next may be twice as long (up to num_tokens); else one longer than what was
 * kept; nothing kept k times in a row, no proposal for the next 2^k - 1 steps (at most 31).
 * Outputs never depend on it, only the cost of the rows. */
static void spec_next(const struct sched *s, struct sched_seq *q, int n_draft, int accepted)
{
    int cap = accepted == n_draft ? 2 * n_draft : accepted + 1;
    q->spec_cap = cap < s->cfg.spec.num_tokens ? cap : s->cfg.spec.num_tokens;
    q->spec_misses = accepted ? 0 : q->spec_misses + 1;
    q->spec_wait = accepted ? 0 : (1 << (q->spec_misses < 5 ? q->spec_misses : 5)) - 1;
}

/* A speculative entry of a completed step (q running: no overlap with speculation): keeps
 * the sampled tokens of rows 0, 1, … up to the first that differs from the proposal (row
 * k's input was proposal k - 1, so row k counts only while every proposal before it was
 * sampled), then commits the KV of the rows whose inputs were kept and gives back the
 * other slots. */
static int record_spec(struct sched *s, const struct sched_plan *p, const struct sched_entry *en,
                       struct sched_seq *q, char *err, size_t errlen)
{
    int pos0 = q->num_computed - en->n_new, n_before = q->n_tokens, accepted = 0, rc;
    for (int k = 0; k <= en->n_draft; k++) {
        const struct backend_token *t = &s->out[en->logit + k];
        if (!keep_token(s, q, en->logit + k, t, p) || k == en->n_draft || t->token != en->draft[k]) break;
        accepted++;
    }
    int kept = q->n_tokens - n_before;
    s->spec_drafts++;
    s->spec_draft_tokens += (uint64_t)en->n_draft;
    s->spec_accepted += (uint64_t)accepted;
    spec_next(s, q, en->n_draft, accepted);
    /* rows 0 .. kept - 1 had real inputs (row 0 the last known token, row k proposal k - 1
     * == kept token k - 1); row 0's KV counts even when its token failed */
    int valid = kept > 1 ? kept : 1;
    q->num_computed = q->num_done = pos0 + valid;
    if ((rc = bm_seq_truncate(s->bm, q->bs, q->num_computed, err, errlen))) return rc;
    return bm_seq_commit(s->bm, q->bs, q->tokens, q->num_done, err, errlen);
}

/* The step of plan p completed with tokens s->out: commit its KV, record every sampled
 * token, queue the events. */
static int record(struct sched *s, struct sched_plan *p, char *err, size_t errlen)
{
    int rc;
    for (int e = 0; e < p->n_entries; e++) {
        struct sched_entry *en = &p->entries[e];
        struct sched_seq *q = en->seq;
        q->refs--;
        /* the next step may already owe this sequence a token (planned before this wait) */
        if (en->logit >= 0 && q->pending_plan == (int)(p - s->plans)) q->pending_row = -1;
        if (!seq_live(q)) { /* finished or aborted while this step ran */
            if (en->logit >= 0) s->discarded++;
            continue;
        }
        if (en->n_draft) {
            if ((rc = record_spec(s, p, en, q, err, errlen))) return rc;
            continue;
        }
        if (q->status == SEQ_RUNNING) {
            q->num_done += en->n_new;
            if ((rc = bm_seq_commit(s->bm, q->bs, q->tokens, q->num_done, err, errlen))) return rc;
            if (en->admitted) push_event(s, q, -1, FINISH_NONE, NULL, true, NULL);
        } /* else preempted while this step ran: its KV is gone, its token still counts */
        if (!record_scores(s, en, q)) continue;
        if (en->logit >= 0) keep_token(s, q, en->logit, &s->out[en->logit], p);
    }
    return 0;
}

/* Waits for the step in flight and records it. */
static int wait_flight(struct sched *s, char *err, size_t errlen)
{
    struct sched_plan *p = &s->plans[s->flight];
    s->flight = -1;
    int rc = backend_wait(s->be, s->out, err, errlen);
    if (rc) return rc;
    return record(s, p, err, errlen);
}

/* Before submitting plan p: rows that name a failed row of the step just recorded get a
 * harmless token (their sequence has finished; the result is discarded). True if any
 * sequence of p is still live. */
static bool plan_patch(struct sched *s, struct sched_plan *p)
{
    bool live = false;
    for (int e = 0; e < p->n_entries; e++) live = live || seq_live(p->entries[e].seq);
    for (int r = 0; r < p->b.num_tokens; r++) {
        int32_t t = p->token_ids[r];
        if (t < 0 && s->out[-1 - t].status != 0) p->token_ids[r] = 0;
    }
    return live;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Clears the bits of q's end tokens (the model's end-of-generation ids, q's stop ids). */
static void mask_out_end_tokens(const struct sched *s, const struct sched_seq *q, uint32_t *mask)
{
    for (int i = 0; i < s->m->n_eog; i++) {
        int32_t t = s->m->eog_ids[i];
        if (t >= 0 && t < s->m->cfg.vocab_size) mask[t / 32] &= ~(1u << (t % 32));
    }
    for (int i = 0; i < q->n_stop_ids; i++) mask[q->stop_ids[i] / 32] &= ~(1u << (q->stop_ids[i] % 32));
}

/* Clears the bits of the bad words q would complete with its next token: a word's last
 * token where the generated tokens, followed by ahead[0, n_ahead) (a speculative row's
 * proposed tokens before it), end with the others (a one-token word: always). */
static void mask_out_bad_words(const struct sched_seq *q, const int32_t *ahead, int n_ahead, uint32_t *mask)
{
    const int n_gen = q->n_tokens - q->n_prompt, n = n_gen + n_ahead;
    const int32_t *gen = q->tokens + q->n_prompt;
    for (int i = 0; i < q->bad_words_len; i += 1 + q->bad_words[i]) {
        int len = q->bad_words[i];
        const int32_t *w = q->bad_words + i + 1;
        if (len - 1 > n) continue;
        bool match = true;
        for (int j = 0; j < len - 1 && match; j++) { /* token n - (len - 1) + j of gen + ahead */
            const int at = n - (len - 1) + j;
            match = (at < n_gen ? gen[at] : ahead[at - n_gen]) == w[j];
        }
        if (match) mask[w[len - 1] / 32] &= ~(1u << (w[len - 1] % 32));
    }
}

/* A mask that could not be computed (rc: out of memory, or the grammar's work bound)
 * fails q alone; its rows still run, unmasked, and are discarded. */
static void fail_mask(struct sched *s, struct sched_seq *q, int rc)
{
    finish_seq(q, FINISH_ERROR);
    push_event(s, q, -1, FINISH_ERROR, NULL, false, rc == ERR_RANGE ? GRAMMAR_TOO_AMBIGUOUS : MASK_NOMEM);
}

/* The masks of en's speculative rows 1..n_draft (plan p), after row 0's base mask (the
 * grammar's or the allowed ids, before min_tokens and bad words). Row k draws token
 * n_gen + k, after the proposed tokens draft[0, k): with a grammar, its mask is the
 * grammar's at the state they lead to (q->gm_spec, a copy of the matcher advanced along
 * them; once the grammar refuses one, row k - 1 cannot draw it, so no later row is kept
 * and they repeat the mask before), with the allowed ids; the end tokens are out while the
 * row's own token is short of min_tokens, and the bad words out that it would complete.
 * Returns the grammar masks filled, or ERR_NOMEM. */
static int spec_row_masks(struct sched *s, struct sched_plan *p, const struct sched_entry *en, const uint32_t *base,
                          bool constrained)
{
    struct sched_seq *q = en->seq;
    const int n_gen = q->n_tokens - q->n_prompt;
    bool follows = constrained;
    int filled = 0;
    if (follows && (!q->gm_spec || gm_copy(q->gm_spec, q->gm) != 0)) return ERR_NOMEM;
    for (int k = 1; k <= en->n_draft; k++) {
        uint32_t *mk = p->masks + (size_t)(en->logit + k) * (size_t)s->mask_words;
        const uint32_t *before = k == 1 ? base : mk - s->mask_words;
        int rc = follows ? gm_accept(q->gm_spec, en->draft[k - 1]) : ERR_INVALID;
        if (rc == 0) rc = gm_fill_mask(q->gm_spec, mk);
        if (rc == ERR_NOMEM) return rc;
        if (rc == 0) {
            filled++;
            for (int w = 0; q->allowed && w < s->mask_words; w++) mk[w] &= q->allowed[w];
        } else {
            follows = false;
            memcpy(mk, before, sizeof *mk * (size_t)s->mask_words);
        }
        if (q->min_tokens > n_gen + k) mask_out_end_tokens(s, q, mk);
        if (q->bad_words) mask_out_bad_words(q, en->draft, k, mk);
        p->samples[en->logit + k].mask = mk;
    }
    return filled;
}

/* Right before plan p is submitted (every earlier step recorded): fills the token mask of
 * each constrained logits row from its matcher (and with the sequence's allowed ids), of
 * each row with allowed ids from them, takes the end tokens out of the rows of sequences
 * short of their min_tokens and the bad words' next tokens out of the rows of sequences
 * with bad words (from those masks, or from all tokens). A
 * mask that cannot be computed (out of memory) fails that sequence alone; its row still
 * runs, unmasked, and is discarded. */
static void plan_masks(struct sched *s, struct sched_plan *p)
{
    uint64_t t0 = 0;
    int n_masked = 0;
    for (int e = 0; e < p->n_entries; e++) {
        struct sched_entry *en = &p->entries[e];
        struct sched_seq *q = en->seq;
        if (en->logit < 0) continue;
        struct backend_sample *smp = &p->samples[en->logit];
        for (int k = 0; k <= en->n_draft; k++) smp[k].mask = NULL;
        bool constrained = q->gm && q->gm_on, short_of_min = q->min_tokens > q->n_tokens - q->n_prompt;
        if ((!constrained && !short_of_min && !q->allowed && !q->bad_words) || !seq_live(q)) continue;
        uint32_t *mask = p->masks + (size_t)en->logit * (size_t)s->mask_words;
        if (constrained) {
            if (!n_masked++) t0 = now_ns();
            int rc = gm_fill_mask(q->gm, mask);
            if (rc != 0) {
                fail_mask(s, q, rc);
                continue;
            }
            for (int w = 0; q->allowed && w < s->mask_words; w++) mask[w] &= q->allowed[w];
        } else if (q->allowed) {
            memcpy(mask, q->allowed, sizeof *mask * (size_t)s->mask_words);
        } else {
            memset(mask, 0xFF, sizeof *mask * (size_t)s->mask_words);
        }
        const int filled = en->n_draft ? spec_row_masks(s, p, en, mask, constrained) : 0;
        if (filled < 0) {
            fail_mask(s, q, filled);
            continue;
        }
        n_masked += filled;
        if (short_of_min) mask_out_end_tokens(s, q, mask);
        if (q->bad_words) mask_out_bad_words(q, NULL, 0, mask);
        smp->mask = mask;
    }
    if (n_masked) {
        s->mask_ns += now_ns() - t0;
        s->masked_rows += (uint64_t)n_masked;
    }
}

/* Takes the finished sequences off the lists (freed once no step refers to them). */
static void retire_finished(struct sched *s)
{
    for (int i = 0; i < s->n_running;) {
        struct sched_seq *q = s->running[i];
        if (q->status == SEQ_FINISHED) retire(s, q);
        else i++;
    }
    for (int i = 0; i < s->n_waiting;) {
        struct sched_seq *q = s->waiting[i];
        if (q->status == SEQ_FINISHED) retire(s, q);
        else i++;
    }
}

/* The backend failed (rc from it): nothing more runs. */
static int fail(struct sched *s, int rc, const char *err)
{
    s->broken = true;
    snprintf(s->broken_msg, sizeof s->broken_msg, "%s", err ? err : err_name(rc));
    return rc;
}

int sched_step(struct sched *s, sched_output_fn cb, void *ud, char *err, size_t errlen)
{
    if (s->broken) return err_set(err, errlen, ERR_UNAVAILABLE, "scheduler: failed earlier: %s", s->broken_msg);
    drop_aborted(s, cb, ud);
    if (!sched_has_work(s)) return 0;
    int rc;
    struct sched_plan *p = &s->plans[s->flight == 0 ? 1 : 0];
    p->n_entries = 0;
    int n = s->n_waiting + s->n_running > 0 ? schedule(s, p, err, errlen) : 0;
    if (n < 0) return n;
    if (n == 0 && s->flight < 0 && s->n_waiting + s->n_running > 0)
        return err_set(err, errlen, ERR_RANGE, "scheduler: %d sequences waiting, %d running, but none fits",
                       s->n_waiting, s->n_running);
    if (n > 0 && (rc = fill_batch(s, p, err, errlen))) return fail(s, rc, err);
    s->n_events = 0;
    if (s->flight >= 0 && (rc = wait_flight(s, err, errlen))) return fail(s, rc, err);
    if (n > 0) {
        plan_masks(s, p);
        if (plan_patch(s, p)) {
            if ((rc = backend_submit(s->be, &p->b, p->samples, err, errlen))) return fail(s, rc, err);
            s->flight = (int)(p - s->plans);
            s->steps++;
            s->batched_tokens += (uint64_t)p->b.num_tokens;
            s->prefill_tokens += (uint64_t)(p->b.num_tokens - p->n_sample);
            if (!s->overlap && (rc = wait_flight(s, err, errlen))) return fail(s, rc, err);
        } else {
            plan_discard(p);
        }
    }
    retire_finished(s);
    /* report while the next step computes (overlap); the callback may only sched_abort */
    for (int i = 0; i < s->n_events && cb; i++) cb(ud, &s->events[i]);
    s->n_events = 0;
    reap_zombies(s);
    return 0;
}

int sched_warmup(struct sched *s, char *err, size_t errlen)
{
    if (sched_has_work(s)) return err_set(err, errlen, ERR_INVALID, "scheduler: warm-up with sequences live");
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    struct sampler *smp = sampler_create(&sp, s->m->cfg.vocab_size);
    if (!smp) return err_set(err, errlen, ERR_NOMEM, "scheduler: out of memory for the warm-up");
    /* one token at slot 0 of block 0: the block is free, and whoever takes it writes its
     * own KV before reading any */
    struct sched_plan *p = &s->plans[0];
    p->token_ids[0] = 0;
    p->positions[0] = 0;
    p->slot_mapping[0] = 0;
    p->query_start[0] = 0;
    p->query_start[1] = 1;
    p->seq_lens[0] = 1;
    p->block_tables[0] = 0;
    p->logits_indices[0] = 0;
    p->samples[0] = (struct backend_sample){ .sampler = smp, .n_logprobs = -1 };
    struct batch b = { .num_tokens = 1, .num_seqs = 1, .token_ids = p->token_ids, .positions = p->positions,
                       .slot_mapping = p->slot_mapping, .query_start = p->query_start, .seq_lens = p->seq_lens,
                       .block_tables = p->block_tables, .max_blocks_per_seq = s->max_blocks_per_seq,
                       .num_logits = 1, .logits_indices = p->logits_indices };
    int rc = backend_step(s->be, &b, p->samples, s->out, err, errlen);
    sampler_free(smp);
    return rc;
}

void sched_get_stats(const struct sched *s, struct sched_stats *st)
{
    *st = (struct sched_stats){ .steps = s->steps, .preemptions = s->preemptions,
                                .prefill_tokens = s->prefill_tokens,
                                .batched_tokens = s->batched_tokens, .discarded_tokens = s->discarded,
                                .num_waiting = s->n_waiting, .num_running = s->n_running,
                                .num_samplers = s->n_samplers, .num_matchers = s->n_matchers,
                                .masked_rows = s->masked_rows, .mask_ns = s->mask_ns,
                                .spec_drafts = s->spec_drafts, .spec_draft_tokens = s->spec_draft_tokens,
                                .spec_accepted_tokens = s->spec_accepted };
    bm_get_stats(s->bm, &st->bm);
}

const struct block_manager *sched_block_manager(const struct sched *s) { return s->bm; }

const struct sched_config *sched_get_config(const struct sched *s) { return &s->cfg; }

const struct backend_info *sched_backend_info(const struct sched *s) { return backend_get_info(s->be); }
