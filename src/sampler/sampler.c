/* sampler.c — one row of logits → one token id (contract in sampler.h, pipeline and
 * numbers in docs/sampling.md).
 *
 * Owns, per sequence: the RNG (xoshiro256**, state seeded by splitmix64), the token
 * history (counts[vocab] plus the list of ids ever touched, so reset and the penalty
 * pass are O(tokens seen), not O(vocab)), the logit-bias table, and the scratch used
 * while sampling (cand[vocab] candidates, saved logits for the restore). All of it is
 * allocated by sampler_create; nothing else here allocates.
 *
 * Invariants:
 *   - counts[id] != 0  <=>  id appears exactly once in touched[0, n_touched).
 *   - counts[id] = (SEEN_PROMPT if id was in the prompt) | output count (31 bits,
 *     saturating).
 *   - candidates are ordered by the strict total order cand_before(): larger value first,
 *     lower id first among equal values — every tie in the pipeline (greedy, top-k, top-p
 *     boundary) is broken towards the lower id, so results do not depend on the order in
 *     which the selection algorithms happen to visit elements.
 *   - sampler_sample returns with logits[] bit-identical to its input.
 */
#include "sampler/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#define SEEN_PROMPT 0x80000000u
#define COUNT_MASK 0x7fffffffu
/* top-k up to this size selects with a k-heap straight from logits[]; larger k copies the
 * finite logits into cand[] and quickselects. */
#define HEAP_TOP_K_MAX 128
/* ranges at most this long are finished by insertion sort in the top-p selection */
#define SMALL_RANGE 16

struct cand {
    int32_t id;
    float v; /* a logit, then an unnormalised probability exp((logit - max) / T) */
};

struct sampler {
    struct sampler_params p;
    int vocab_size;
    uint64_t rng[4];      /* xoshiro256** state, never all zero */
    uint32_t *counts;     /* (vocab_size) SEEN_PROMPT | output count */
    int32_t *touched;     /* (vocab_size) ids with counts != 0, first-seen order */
    float *touched_saved; /* (vocab_size) logits[touched[j]] before the penalties */
    int n_touched;
    int n_bias;
    int32_t bias_ids[SAMPLER_MAX_LOGIT_BIAS];
    float bias_vals[SAMPLER_MAX_LOGIT_BIAS];
    float bias_saved[SAMPLER_MAX_LOGIT_BIAS]; /* logits[bias_ids[j]] before bias j */
    struct cand *cand;    /* (vocab_size) sampling candidates */
};

/* ---- RNG: splitmix64 for seeding, xoshiro256** for draws (Blackman & Vigna) ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    /* splitmix64 is a bijection of its counter, so four consecutive outputs are never
     * all zero — the one state xoshiro must avoid. */
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform double in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

/* ---- parameters ---- */

void sampler_params_default(struct sampler_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
}

int sampler_params_validate(const struct sampler_params *p, char *err, size_t errlen)
{
    /* comparisons are written so that NaN fails them */
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return err_set(err, errlen, ERR_RANGE, "temperature: must be finite and >= 0, got %g",
                       (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return err_set(err, errlen, ERR_RANGE, "top_p: must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(err, errlen, ERR_RANGE, "min_p: must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return err_set(err, errlen, ERR_RANGE, "repetition_penalty: must be finite and > 0, got %g",
                       (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return err_set(err, errlen, ERR_RANGE, "presence_penalty: must be in [-2, 2], got %g",
                       (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return err_set(err, errlen, ERR_RANGE, "frequency_penalty: must be in [-2, 2], got %g",
                       (double)p->frequency_penalty);
    return 0;
}

/* ---- lifetime and history ---- */

struct sampler *sampler_create(const struct sampler_params *p, int vocab_size)
{
    if (vocab_size <= 0 || !p || sampler_params_validate(p, NULL, 0) != 0)
        return NULL;
    struct sampler *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    size_t n = (size_t)vocab_size;
    s->vocab_size = vocab_size;
    s->counts = calloc(n, sizeof *s->counts);
    s->touched = malloc(n * sizeof *s->touched);
    s->touched_saved = malloc(n * sizeof *s->touched_saved);
    s->cand = malloc(n * sizeof *s->cand);
    if (!s->counts || !s->touched || !s->touched_saved || !s->cand)
        goto fail;
    s->p = *p;
    rng_seed(s->rng, p->seed);
    return s;
fail:
    sampler_free(s);
    return NULL;
}

void sampler_free(struct sampler *s)
{
    if (!s)
        return;
    free(s->counts);
    free(s->touched);
    free(s->touched_saved);
    free(s->cand);
    free(s);
}

void sampler_reset(struct sampler *s, const struct sampler_params *p)
{
    if (p)
        s->p = *p;
    rng_seed(s->rng, s->p.seed);
    for (int j = 0; j < s->n_touched; j++)
        s->counts[s->touched[j]] = 0;
    s->n_touched = 0;
    s->n_bias = 0;
}

int sampler_set_logit_bias(struct sampler *s, const int32_t *ids, const float *bias, int n)
{
    if (n < 0 || n > SAMPLER_MAX_LOGIT_BIAS)
        return ERR_RANGE;
    if (n > 0 && (!ids || !bias))
        return ERR_INVALID;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->vocab_size)
            return ERR_RANGE;
        if (isnan(bias[i]) || bias[i] == INFINITY)
            return ERR_INVALID;
    }
    if (n > 0) {
        memcpy(s->bias_ids, ids, (size_t)n * sizeof *ids);
        memcpy(s->bias_vals, bias, (size_t)n * sizeof *bias);
    }
    s->n_bias = n;
    return 0;
}

static void touch(struct sampler *s, int32_t id)
{
    if (s->counts[id] == 0)
        s->touched[s->n_touched++] = id;
}

void sampler_accept_prompt(struct sampler *s, const int32_t *tokens, int n)
{
    for (int i = 0; i < n; i++) {
        int32_t id = tokens[i];
        if (id < 0 || id >= s->vocab_size)
            continue;
        touch(s, id);
        s->counts[id] |= SEEN_PROMPT;
    }
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (token < 0 || token >= s->vocab_size)
        return;
    touch(s, token);
    if ((s->counts[token] & COUNT_MASK) != COUNT_MASK)
        s->counts[token]++;
}

/* ---- bias and penalties, applied in place and undone by restore_logits ---- */

static void apply_bias(struct sampler *s, float *logits)
{
    for (int j = 0; j < s->n_bias; j++) {
        int32_t id = s->bias_ids[j];
        s->bias_saved[j] = logits[id];
        logits[id] += s->bias_vals[j];
    }
}

static bool penalties_on(const struct sampler_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* HF/vLLM repetition penalty over prompt+output, then OpenAI presence/frequency over
 * output: l -= frequency * count + presence * (count > 0). */
static void apply_penalties(struct sampler *s, float *logits)
{
    const float rep = s->p.repetition_penalty;
    const float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    for (int j = 0; j < s->n_touched; j++) {
        int32_t id = s->touched[j];
        uint32_t c = s->counts[id], out = c & COUNT_MASK;
        float l = logits[id];
        s->touched_saved[j] = l;
        if (rep != 1.0f)
            l = l > 0.0f ? l / rep : l * rep;
        if (out > 0)
            l -= freq * (float)out + pres;
        logits[id] = l;
    }
}

static void restore_logits(struct sampler *s, float *logits, bool penalised)
{
    /* touched_saved holds post-bias values, bias_saved pre-bias ones: undo in reverse order
     * of application (a repeated bias id is restored through its first entry last). */
    if (penalised)
        for (int j = 0; j < s->n_touched; j++)
            logits[s->touched[j]] = s->touched_saved[j];
    for (int j = s->n_bias - 1; j >= 0; j--)
        logits[s->bias_ids[j]] = s->bias_saved[j];
}

/* ---- candidate selection ---- */

static inline bool cand_before(struct cand a, struct cand b)
{
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

static inline void cand_swap(struct cand *c, int i, int j)
{
    struct cand t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* Greedy: the first (lowest) id with the largest logit; -1 if every logit is -inf/NaN. */
static int32_t argmax(const float *logits, int n)
{
    float best = -INFINITY;
    int32_t id = -1;
    for (int i = 0; i < n; i++)
        if (logits[i] > best) { /* NaN compares false: never chosen */
            best = logits[i];
            id = i;
        }
    return id;
}

/* Heap of the k best (root = the worst of them) over the finite-or-+inf logits.
 * O(vocab) comparisons plus O(log k) per element that enters the heap. Returns the count
 * (< k when fewer logits are > -inf). */
static int select_heap(const float *logits, int n, int k, struct cand *h)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (!(v > -INFINITY))
            continue;
        struct cand c = {i, v};
        if (m < k) {
            int j = m++;
            h[j] = c;
            while (j > 0 && cand_before(h[(j - 1) / 2], h[j])) {
                cand_swap(h, j, (j - 1) / 2);
                j = (j - 1) / 2;
            }
        } else if (cand_before(c, h[0])) {
            h[0] = c;
            int j = 0;
            for (;;) {
                int l = 2 * j + 1, r = l + 1, w = j;
                if (l < m && cand_before(h[w], h[l]))
                    w = l;
                if (r < m && cand_before(h[w], h[r]))
                    w = r;
                if (w == j)
                    break;
                cand_swap(h, j, w);
                j = w;
            }
        }
    }
    return m;
}

/* Partitions c[lo, hi) (hi - lo >= 2) around a median-of-three pivot: on return c[lo, m)
 * come before the pivot in cand_before order, c[m] is the pivot, c(m, hi) come after. */
static int cand_partition(struct cand *c, int lo, int hi)
{
    int mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_before(c[mid], c[lo]))
        cand_swap(c, lo, mid);
    if (cand_before(c[last], c[lo]))
        cand_swap(c, lo, last);
    if (cand_before(c[mid], c[last]))
        cand_swap(c, mid, last);
    struct cand pivot = c[last];
    int store = lo;
    for (int i = lo; i < last; i++)
        if (cand_before(c[i], pivot))
            cand_swap(c, i, store++);
    cand_swap(c, store, last);
    return store;
}

/* Quickselect: moves the k best of c[0, n) (0 < k < n) into c[0, k), unordered. */
static void select_top_k(struct cand *c, int n, int k)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int m = cand_partition(c, lo, hi);
        if (m == k || m == k - 1)
            return;
        if (m < k)
            lo = m + 1;
        else
            hi = m;
    }
}

static void sort_range(struct cand *c, int lo, int hi)
{
    for (int i = lo + 1; i < hi; i++) {
        struct cand x = c[i];
        int j = i;
        for (; j > lo && cand_before(x, c[j - 1]); j--)
            c[j] = c[j - 1];
        c[j] = x;
    }
}

/* Top-p: moves into c[0, ret) the smallest prefix (in cand_before order) of the weights
 * c[0, n) whose mass reaches target, without sorting: quickselect on mass, expected O(n).
 * Writes that prefix's mass to *mass. */
static int select_nucleus(struct cand *c, int n, double target, double *mass)
{
    int lo = 0, hi = n;
    double acc = 0.0; /* mass of c[0, lo), all of which is in the nucleus */
    while (hi - lo > SMALL_RANGE) {
        int m = cand_partition(c, lo, hi);
        double upper = 0.0;
        for (int i = lo; i < m; i++)
            upper += c[i].v;
        if (acc + upper >= target) { /* the nucleus ends inside c[lo, m) */
            hi = m;
            continue;
        }
        acc += upper + c[m].v;
        if (acc >= target) {
            *mass = acc;
            return m + 1;
        }
        lo = m + 1;
    }
    sort_range(c, lo, hi);
    for (int i = lo; i < hi; i++) {
        acc += c[i].v;
        if (acc >= target) {
            *mass = acc;
            return i + 1;
        }
    }
    *mass = acc; /* rounding kept acc just below target: keep the whole range */
    return hi;
}

/* temperature → top-k → top-p → min-p on logits already biased and penalised. Leaves the
 * support with unnormalised weights in s->cand[0, *n_out) and their sum in *total_out, and
 * returns 0; or returns the lowest id with a +inf logit (all the mass is there) with
 * *n_out = 0; or ERR_RANGE when no logit is > -inf. */
static int32_t build_dist(struct sampler *s, const float *logits, int *n_out, double *total_out)
{
    const int vocab = s->vocab_size, k = s->p.top_k;
    struct cand *c = s->cand;
    int n;
    if (k > 0 && k <= HEAP_TOP_K_MAX && k < vocab) {
        n = select_heap(logits, vocab, k, c);
    } else {
        n = 0;
        for (int i = 0; i < vocab; i++)
            if (logits[i] > -INFINITY)
                c[n++] = (struct cand){i, logits[i]};
        if (k > 0 && k < n) {
            select_top_k(c, n, k);
            n = k;
        }
    }
    *n_out = 0;
    if (n == 0)
        return ERR_RANGE;

    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = c[i].v > mx ? c[i].v : mx;
    if (mx == INFINITY) { /* degenerate: all the mass on the +inf logits; lowest id wins */
        int32_t id = INT32_MAX;
        for (int i = 0; i < n; i++)
            if (c[i].v == INFINITY && c[i].id < id)
                id = c[i].id;
        return id;
    }

    /* Temperature: weights exp((l - max) / T), the max having weight exactly 1. Dividing
     * (not multiplying by 1/T) keeps tiny temperatures finite. Zero weights are dropped. */
    const float t = s->p.temperature;
    double total = 0.0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float w = expf((c[i].v - mx) / t);
        if (w > 0.0f) {
            c[m++] = (struct cand){c[i].id, w};
            total += w;
        }
    }
    n = m;

    if (s->p.top_p < 1.0f) {
        /* Prefilter: the weights below tau = (1 - top_p) * total / n sum to less than
         * (1 - top_p) * total, so those at or above tau — a prefix in key order — already
         * reach the target and contain the nucleus. On peaked distributions this drops most
         * of the vocabulary before the selection. */
        const double target = (double)s->p.top_p * total;
        const double tau = (1.0 - (double)s->p.top_p) * total / n;
        double kept = 0.0;
        m = 0;
        for (int i = 0; i < n; i++)
            if ((double)c[i].v >= tau) {
                c[m++] = c[i];
                kept += c[i].v;
            }
        n = m;
        n = select_nucleus(c, n, target < kept ? target : kept, &total);
    }

    /* min-p: p_i < min_p * p_max  <=>  w_i < min_p, since the max weight is 1 */
    if (s->p.min_p > 0.0f) {
        const float mp = s->p.min_p;
        total = 0.0;
        m = 0;
        for (int i = 0; i < n; i++)
            if (c[i].v >= mp) {
                c[m++] = c[i];
                total += c[i].v;
            }
        n = m;
    }
    *n_out = n;
    *total_out = total;
    return 0;
}

static int32_t sample_dist(struct sampler *s, const float *logits)
{
    int n;
    double total;
    int32_t rc = build_dist(s, logits, &n, &total);
    if (n == 0)
        return rc;
    const struct cand *c = s->cand;
    double r = rng_uniform(s->rng) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += c[i].v;
        if (r < acc)
            return c[i].id;
    }
    return c[n - 1].id; /* r within rounding of total */
}

int32_t sampler_sample(struct sampler *s, float *logits)
{
    if (!s || !logits)
        return ERR_INVALID;
    apply_bias(s, logits);
    bool penalised = s->n_touched > 0 && penalties_on(&s->p);
    if (penalised)
        apply_penalties(s, logits);
    int32_t tok;
    if (s->p.temperature == 0.0f) {
        tok = argmax(logits, s->vocab_size);
        if (tok < 0)
            tok = ERR_RANGE;
    } else {
        tok = sample_dist(s, logits);
    }
    restore_logits(s, logits, penalised);
    return tok;
}

int sampler_probs(struct sampler *s, float *logits, int32_t *ids, float *probs)
{
    if (!s || !logits || !ids || !probs)
        return ERR_INVALID;
    apply_bias(s, logits);
    bool penalised = s->n_touched > 0 && penalties_on(&s->p);
    if (penalised)
        apply_penalties(s, logits);
    int n = 0;
    double total = 0.0;
    int32_t rc;
    if (s->p.temperature == 0.0f)
        rc = argmax(logits, s->vocab_size);
    else
        rc = build_dist(s, logits, &n, &total);
    restore_logits(s, logits, penalised);
    if (n == 0) { /* greedy, +inf or nothing: one token with probability 1, or an error */
        if (rc < 0)
            return ERR_RANGE;
        ids[0] = rc;
        probs[0] = 1.0f;
        return 1;
    }
    for (int i = 0; i < n; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = (float)(s->cand[i].v / total);
    }
    return n;
}

void sampler_process_logits(struct sampler *s, float *logits)
{
    apply_bias(s, logits);
    if (s->n_touched > 0 && penalties_on(&s->p))
        apply_penalties(s, logits);
}

/* ---- logprobs ---- */

int sampler_logprobs(const float *logits, int vocab_size, int32_t token, int n_top,
                     int32_t *top_ids, float *top_logprobs, float *token_logprob)
{
    if (!logits || vocab_size <= 0 || token < 0 || token >= vocab_size || !token_logprob ||
        n_top < 0 || n_top > SAMPLER_MAX_TOP_LOGPROBS || (n_top > 0 && (!top_ids || !top_logprobs)))
        return ERR_INVALID;
    float mx = -INFINITY;
    for (int i = 0; i < vocab_size; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    if (!isfinite(mx))
        return ERR_RANGE;

    /* one pass: the log-sum-exp in double, and the n_top best kept sorted by insertion */
    struct cand top[SAMPLER_MAX_TOP_LOGPROBS];
    int m = 0;
    double sum = 0.0;
    for (int i = 0; i < vocab_size; i++) {
        float v = logits[i];
        if (!(v > -INFINITY))
            continue;
        sum += exp((double)v - (double)mx);
        struct cand c = {i, v};
        if (n_top == 0 || (m == n_top && !cand_before(c, top[m - 1])))
            continue;
        int j = m < n_top ? m++ : m - 1;
        for (; j > 0 && cand_before(c, top[j - 1]); j--)
            top[j] = top[j - 1];
        top[j] = c;
    }
    double lse = (double)mx + log(sum);
    for (int j = 0; j < m; j++) {
        top_ids[j] = top[j].id;
        top_logprobs[j] = (float)((double)top[j].v - lse);
    }
    float v = logits[token];
    *token_logprob = v > -INFINITY ? (float)((double)v - lse) : -INFINITY;
    return m;
}
