/* sampler.c — one row of logits → one token id (contract in sampler.h, the rule and its
 * numbers in docs/sampling.md, the bit-exact arithmetic in sampler/exact.h).
 *
 * Owns, per sequence: the step counter, the token history (counts[vocab] plus the list
 * of ids ever touched, so reset and the penalty pass are O(tokens seen), not O(vocab)),
 * the logit-bias table (repeated ids merged), and the scratch used while sampling
 * (cand[vocab] candidates, w[vocab] weights in id order, saved logits for the restore:
 * the touched and biased entries, or the whole raw row when a token mask bans tokens).
 * All of it is allocated by sampler_create; nothing else here allocates.
 *
 * The rule is defined on sets, not on an order of visits, so the selections below are
 * free to use heaps and quickselect: top-k keeps every token whose logit is >= the k-th
 * largest; top-p keeps every token whose weight is >= the largest threshold whose mass
 * reaches the target; min-p keeps weights >= ceil(min_p * 2^31); the draw walks the
 * support in token-id order. The CUDA kernel computes the same sets its own way.
 *
 * Invariants:
 *   - counts[id] != 0  <=>  id appears exactly once in touched[0, n_touched).
 *   - counts[id] = (SMP_PROMPT_FLAG if id was in the prompt) | output count (31 bits,
 *     saturating).
 *   - bias_ids[0, n_bias) are distinct.
 *   - sampler_sample(_masked) returns with logits[] bit-identical to its input.
 *
 * A token mask (constrained decoding) is applied right after the bias by setting every
 * banned logit to -inf: the outcome of a -inf bias (a NaN or +inf logit plus a -inf bias
 * is NaN, which is never samplable either), and what the CUDA kernel computes.
 */
#include "sampler/sampler.h"
#include "sampler/row_scan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/exact.h"
#include "util/err.h"

/* top-k up to this size selects with a k-heap straight from logits[]; larger k copies the
 * samplable logits into cand[] and quickselects. */
#define HEAP_TOP_K_MAX 128
/* a sparse support up to this size is sorted by id for the draw; a larger one is
 * scattered into w[] and walked in id order */
#define SORT_SUPPORT_MAX 256
/* Dense loops run in chunks of this many ids: gcc -O2's cheap vectorizer cost model wants
 * a constant trip count, and with it the weight pass runs ~6x faster (AVX2/AVX-512). The
 * vector instructions (vfmadd, vroundps) round exactly as their scalar forms. */
#define CHUNK 16

struct cand {
    int32_t id;
    uint32_t v; /* smp_key(logit) during top-k selection, then the weight W */
};

struct sampler {
    struct sampler_params p;
    int vocab_size;
    uint64_t step;        /* tokens accepted since create/reset: keys the draw */
    uint32_t *counts;     /* (vocab_size) SMP_PROMPT_FLAG | output count */
    int32_t *touched;     /* (vocab_size) ids with counts != 0, first-seen order */
    float *touched_saved; /* (vocab_size) logits[touched[j]] before the penalties */
    float *raw_saved;     /* (vocab_size) the raw row, saved when a mask bans tokens */
    int n_touched;
    int n_bias;
    int32_t bias_ids[SAMPLER_MAX_LOGIT_BIAS];   /* distinct */
    float bias_vals[SAMPLER_MAX_LOGIT_BIAS];
    float bias_saved[SAMPLER_MAX_LOGIT_BIAS];   /* logits[bias_ids[j]] before the bias */
    struct cand *cand;    /* (vocab_size) selection candidates */
    uint32_t *w;          /* (vocab_size) weights in id order (dense supports) */
};

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
    s->raw_saved = malloc(n * sizeof *s->raw_saved);
    s->cand = malloc(n * sizeof *s->cand);
    s->w = malloc(n * sizeof *s->w);
    if (!s->counts || !s->touched || !s->touched_saved || !s->raw_saved || !s->cand || !s->w)
        goto fail;
    s->p = *p;
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
    free(s->raw_saved);
    free(s->cand);
    free(s->w);
    free(s);
}

void sampler_reset(struct sampler *s, const struct sampler_params *p)
{
    if (p)
        s->p = *p;
    s->step = 0;
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
    /* merge repeated ids, summing in the given order (O(n^2) for n <= 300, once per
     * request): the device sampler takes one entry per id */
    int m = 0;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < m && s->bias_ids[j] != ids[i])
            j++;
        if (j == m) {
            s->bias_ids[m] = ids[i];
            s->bias_vals[m++] = bias[i];
        } else {
            s->bias_vals[j] += bias[i];
        }
    }
    s->n_bias = m;
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
        s->counts[id] |= SMP_PROMPT_FLAG;
    }
}

void sampler_accept(struct sampler *s, int32_t token)
{
    s->step++;
    if (token < 0 || token >= s->vocab_size)
        return;
    touch(s, token);
    if ((s->counts[token] & SMP_COUNT_MASK) != SMP_COUNT_MASK)
        s->counts[token]++;
}

uint64_t sampler_step(const struct sampler *s) { return s->step; }

const struct sampler_params *sampler_get_params(const struct sampler *s) { return &s->p; }

void sampler_set_step(struct sampler *s, uint64_t step) { s->step = step; }

int sampler_history_len(const struct sampler *s) { return s->n_touched; }

void sampler_history(const struct sampler *s, int32_t *ids, uint32_t *info)
{
    for (int j = 0; j < s->n_touched; j++) {
        ids[j] = s->touched[j];
        info[j] = s->counts[s->touched[j]];
    }
}

int sampler_history_ahead(const struct sampler *s, const int32_t *prior, int n, int32_t *ids, uint32_t *info)
{
    int len = s->n_touched;
    sampler_history(s, ids, info);
    for (int i = 0; i < n; i++) { /* as sampler_accept would count them; O(len) each, few */
        const int32_t t = prior[i];
        if (t < 0 || t >= s->vocab_size)
            continue;
        int j = 0;
        while (j < len && ids[j] != t)
            j++;
        if (j == len) {
            ids[len] = t;
            info[len++] = 0;
        }
        if ((info[j] & SMP_COUNT_MASK) != SMP_COUNT_MASK)
            info[j]++;
    }
    return len;
}

int sampler_logit_bias(const struct sampler *s, int32_t *ids, float *vals)
{
    memcpy(ids, s->bias_ids, (size_t)s->n_bias * sizeof *ids);
    memcpy(vals, s->bias_vals, (size_t)s->n_bias * sizeof *vals);
    return s->n_bias;
}

/* ---- bias, mask and penalties, applied in place and undone by restore_logits ---- */

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
 * output (smp_penalize: one rounding each, the same on every backend). */
static void apply_penalties(struct sampler *s, float *logits)
{
    const float rep = s->p.repetition_penalty;
    const float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    for (int j = 0; j < s->n_touched; j++) {
        int32_t id = s->touched[j];
        s->touched_saved[j] = logits[id];
        logits[id] = smp_penalize(logits[id], rep, pres, freq, s->counts[id]);
    }
}

/* Whether mask bans any id < vocab (the bits past the vocabulary mean nothing). */
static bool mask_bans(const uint32_t *mask, int vocab)
{
    const int full = vocab / 32, rem = vocab % 32;
    for (int w = 0; w < full; w++)
        if (mask[w] != ~0u)
            return true;
    return rem != 0 && (mask[full] | (~0u << rem)) != ~0u;
}

/* Sets every logit the mask bans to -inf (branch-free over whole words, which gcc
 * vectorizes; words allowing everything are skipped). */
static void apply_mask(float *logits, int vocab, const uint32_t *mask)
{
    int w = 0;
    for (; (w + 1) * 32 <= vocab; w++) {
        const uint32_t m = mask[w];
        if (m == ~0u)
            continue;
        float *l = logits + (size_t)w * 32;
        for (int j = 0; j < 32; j++)
            l[j] = (m >> j) & 1u ? l[j] : -INFINITY;
    }
    for (int i = w * 32; i < vocab; i++)
        if (!((mask[w] >> (i & 31)) & 1u))
            logits[i] = -INFINITY;
}

/* What process_logits applied, for restore_logits. */
struct applied {
    bool masked;    /* the raw row is in raw_saved */
    bool penalised; /* touched_saved holds the values before the penalties */
};

/* bias → mask → penalties, in place (the first steps of the rule). */
static struct applied process_logits(struct sampler *s, float *logits, const uint32_t *mask)
{
    struct applied a = {mask && mask_bans(mask, s->vocab_size), false};
    if (a.masked)
        memcpy(s->raw_saved, logits, (size_t)s->vocab_size * sizeof *logits);
    apply_bias(s, logits);
    if (a.masked)
        apply_mask(logits, s->vocab_size, mask);
    a.penalised = s->n_touched > 0 && penalties_on(&s->p);
    if (a.penalised)
        apply_penalties(s, logits);
    return a;
}

static void restore_logits(struct sampler *s, float *logits, struct applied a)
{
    if (a.masked) {
        memcpy(logits, s->raw_saved, (size_t)s->vocab_size * sizeof *logits);
        return;
    }
    /* touched_saved holds post-bias values, bias_saved pre-bias ones: undo in reverse order
     * of application */
    if (a.penalised)
        for (int j = 0; j < s->n_touched; j++)
            logits[s->touched[j]] = s->touched_saved[j];
    for (int j = 0; j < s->n_bias; j++)
        logits[s->bias_ids[j]] = s->bias_saved[j];
}

/* ---- selection helpers ---- */

/* larger value first, lower id first among equals: a strict total order */
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

/* Key of the k-th largest samplable logit (k < number of samplable logits), by a heap of
 * the k best (root = the worst of them) in cand order over (key, id). */
static uint32_t kth_key_heap(const float *logits, int n, int k, struct cand *h)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (!(v > -INFINITY))
            continue;
        struct cand c = {i, smp_key(v)};
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
    return h[0].v;
}

static uint32_t median3(uint32_t a, uint32_t b, uint32_t c)
{
    if (a > b) {
        uint32_t t = a;
        a = b;
        b = t;
    }
    return c <= a ? a : c >= b ? b : c;
}

/* Three-way partition of c[lo, hi) by v around pv: on return c[lo, *lt) > pv,
 * c[*lt, *gt) == pv, c[*gt, hi) < pv. */
static void partition3(struct cand *c, int lo, int hi, uint32_t pv, int *lt, int *gt)
{
    int a = lo, i = lo, b = hi;
    while (i < b) {
        if (c[i].v > pv)
            cand_swap(c, a++, i++);
        else if (c[i].v < pv)
            cand_swap(c, i, --b);
        else
            i++;
    }
    *lt = a;
    *gt = b;
}

/* The k-th largest v of c[0, n) (1 <= k <= n), by quickselect. Permutes c. */
static uint32_t kth_value(struct cand *c, int n, int k)
{
    int lo = 0, hi = n;
    for (;;) {
        uint32_t pv = median3(c[lo].v, c[lo + (hi - lo) / 2].v, c[hi - 1].v);
        int lt, gt;
        partition3(c, lo, hi, pv, &lt, &gt);
        if (k <= lt)
            hi = lt;
        else if (k <= gt)
            return pv;
        else
            lo = gt;
    }
}

/* Top-p threshold: the largest weight theta among c[0, n) with
 * mass(c.v >= theta) >= target, by quickselect on exact integer masses. Requires
 * mass(c) >= target. Permutes c. */
static uint32_t nucleus_threshold(struct cand *c, int n, double target)
{
    int lo = 0, hi = n;
    uint64_t acc = 0; /* mass of c[0, lo): all of it above the range */
    while (lo < hi) {
        uint32_t pv = median3(c[lo].v, c[lo + (hi - lo) / 2].v, c[hi - 1].v);
        int lt, gt;
        partition3(c, lo, hi, pv, &lt, &gt);
        uint64_t above = 0;
        for (int i = lo; i < lt; i++)
            above += c[i].v;
        if ((double)(acc + above) >= target) {
            hi = lt; /* theta > pv (lt > lo, since acc alone is below target) */
            continue;
        }
        acc += above + (uint64_t)pv * (uint64_t)(gt - lt);
        if ((double)acc >= target)
            return pv;
        lo = gt;
    }
    return 1; /* unreachable when mass(c) >= target */
}

/* ---- the distribution and the draw ---- */

/* The support of the draw: either sparse (cand[0, n) with weights v > 0, any order) or
 * dense (every id with w[id] >= theta, theta >= 1), and its total weight. */
struct dist {
    bool sparse;
    int n;
    uint32_t theta;
    uint64_t total;
};

static inline uint32_t weight_of(float v, float m, float inv_t)
{
    uint32_t wi = smp_weight(smp_scaled(v, m, inv_t));
    return v > -INFINITY ? wi : 0; /* NaN and -inf weigh nothing */
}

/* w[i] = the weight of logits[i] for every id; returns their sum. */
static uint64_t dense_weights(const float *logits, int n, float m, float inv_t, uint32_t *w)
{
    uint64_t total = 0;
    int i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        for (int j = 0; j < CHUNK; j++)
            w[i + j] = weight_of(logits[i + j], m, inv_t);
        uint64_t part = 0;
        for (int j = 0; j < CHUNK; j++)
            part += w[i + j];
        total += part;
    }
    for (; i < n; i++) {
        w[i] = weight_of(logits[i], m, inv_t);
        total += w[i];
    }
    return total;
}

/* Sum of the weights w[i] >= theta over [lo, hi). */
static uint64_t mass_at_least(const uint32_t *w, int lo, int hi, uint32_t theta)
{
    uint64_t total = 0;
    int i = lo;
    for (; i + CHUNK <= hi; i += CHUNK) {
        uint64_t part = 0;
        for (int j = 0; j < CHUNK; j++)
            part += w[i + j] >= theta ? w[i + j] : 0;
        total += part;
    }
    for (; i < hi; i++)
        total += w[i] >= theta ? w[i] : 0;
    return total;
}

/* temperature → top-k → top-p → min-p on logits already biased and penalised. Fills *d
 * and returns 0; or returns the lowest id with a +inf logit (the rule gives it all the
 * mass); or ERR_RANGE when no logit is > -inf. */
static int32_t build_dist(struct sampler *s, const float *logits, struct dist *d)
{
    const int vocab = s->vocab_size;
    struct cand *c = s->cand;
    uint32_t *w = s->w;

    float m = -INFINITY;
    int n_ok = 0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        n_ok += v > -INFINITY; /* NaN compares false */
        m = v > m ? v : m;
    }
    if (n_ok == 0)
        return ERR_RANGE;
    if (m == INFINITY) { /* degenerate: all the mass on the +inf logits; lowest id wins */
        for (int i = 0; i < vocab; i++)
            if (logits[i] == INFINITY)
                return i;
    }

    const float inv_t = smp_inv_temperature(s->p.temperature);
    const int k = s->p.top_k;
    uint64_t total = 0;
    int n = 0;
    d->sparse = k > 0 && k < n_ok;
    if (d->sparse) {
        /* top-k: every samplable token whose logit is >= the k-th largest */
        uint32_t vk;
        if (k <= HEAP_TOP_K_MAX) {
            vk = kth_key_heap(logits, vocab, k, c);
        } else {
            for (int i = 0; i < vocab; i++)
                if (logits[i] > -INFINITY)
                    c[n++] = (struct cand){i, smp_key(logits[i])};
            vk = kth_value(c, n, k);
            n = 0;
        }
        for (int i = 0; i < vocab; i++) {
            float v = logits[i];
            if (v > -INFINITY && smp_key(v) >= vk) {
                uint32_t wi = weight_of(v, m, inv_t);
                c[n++] = (struct cand){i, wi};
                total += wi;
            }
        }
    } else {
        total = dense_weights(logits, vocab, m, inv_t, w);
    }

    uint32_t theta = 1;
    if (s->p.top_p < 1.0f) {
        const double target = smp_top_p_target(s->p.top_p, total);
        if (d->sparse) {
            theta = nucleus_threshold(c, n, target);
        } else {
            /* Prefilter: weights below tau = (1 - top_p) * total / (2 n_ok) sum to less
             * than half of (1 - top_p) * total, so those at or above it carry more than the
             * target and contain the nucleus — with a margin far above double rounding. On
             * peaked distributions this drops most of the vocabulary. */
            const double tau = (1.0 - (double)s->p.top_p) * (double)total / (2.0 * n_ok);
            int nc = 0;
            for (int i = 0; i < vocab; i++)
                if (w[i] != 0 && (double)w[i] >= tau)
                    c[nc++] = (struct cand){i, w[i]};
            theta = nucleus_threshold(c, nc, target);
        }
    }
    if (s->p.min_p > 0.0f) {
        uint32_t tm = smp_min_p_weight(s->p.min_p);
        theta = tm > theta ? tm : theta;
    }

    if (d->sparse) {
        int kept = 0;
        total = 0;
        for (int i = 0; i < n; i++)
            if (c[i].v >= theta) {
                c[kept++] = c[i];
                total += c[i].v;
            }
        d->n = kept;
    } else {
        if (theta > 1)
            total = mass_at_least(w, 0, vocab, theta);
        d->n = -1; /* not needed for a dense draw; sampler_probs counts as it lists */
    }
    d->theta = theta;
    d->total = total;
    return 0;
}

static int cand_id_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* The draw: the token whose interval [C(<t), C(<=t)) of the cumulative support weight, in
 * token-id order, holds floor(bits * total / 2^64). */
static int32_t draw(struct sampler *s, struct dist *d, uint64_t step)
{
    uint64_t r = smp_draw_point(smp_draw_bits(s->p.seed, step), d->total);
    uint32_t theta = d->theta;
    if (d->sparse) {
        struct cand *c = s->cand;
        if (d->n <= SORT_SUPPORT_MAX) {
            qsort(c, (size_t)d->n, sizeof *c, cand_id_cmp);
            uint64_t acc = 0;
            for (int i = 0; i < d->n; i++) {
                acc += c[i].v;
                if (r < acc)
                    return c[i].id;
            }
            return c[d->n - 1].id; /* unreachable: r < total */
        }
        memset(s->w, 0, (size_t)s->vocab_size * sizeof *s->w);
        for (int i = 0; i < d->n; i++)
            s->w[c[i].id] = c[i].v;
        theta = 1;
    }
    /* skip whole chunks while the cumulative weight stays <= r */
    const uint32_t *w = s->w;
    const int vocab = s->vocab_size;
    uint64_t acc = 0;
    int i = 0;
    for (; i + CHUNK <= vocab; i += CHUNK) {
        uint64_t part = mass_at_least(w, i, i + CHUNK, theta);
        if (acc + part > r)
            break;
        acc += part;
    }
    for (; i < vocab; i++)
        if (w[i] >= theta) {
            acc += w[i];
            if (r < acc)
                return i;
        }
    return ERR_RANGE; /* unreachable: r < total */
}

/* Counts prior[0, n) for the penalties as sampler_accept would (the step stays): the
 * counts they change go to saved[] and the history length is returned, for pop_prior. */
static int push_prior(struct sampler *s, const int32_t *prior, int n, uint32_t *saved)
{
    const int before = s->n_touched;
    for (int i = 0; i < n; i++) {
        const int32_t t = prior[i];
        if (t < 0 || t >= s->vocab_size)
            continue;
        saved[i] = s->counts[t];
        touch(s, t);
        if ((s->counts[t] & SMP_COUNT_MASK) != SMP_COUNT_MASK)
            s->counts[t]++;
    }
    return before;
}

/* Undoes push_prior: the counts restored in reverse order (a token may repeat). */
static void pop_prior(struct sampler *s, const int32_t *prior, int n, const uint32_t *saved, int before)
{
    for (int i = n - 1; i >= 0; i--)
        if (prior[i] >= 0 && prior[i] < s->vocab_size)
            s->counts[prior[i]] = saved[i];
    s->n_touched = before;
}

int32_t sampler_sample_ahead(struct sampler *s, float *logits, const uint32_t *mask, uint32_t ahead,
                             const int32_t *prior)
{
    if (!s || !logits || (prior && ahead > SAMPLER_MAX_AHEAD))
        return ERR_INVALID;
    uint32_t saved[SAMPLER_MAX_AHEAD];
    const int n_prior = prior && penalties_on(&s->p) ? (int)ahead : 0;
    const int before = push_prior(s, prior, n_prior, saved);
    struct applied a = process_logits(s, logits, mask);
    int32_t tok;
    if (s->p.temperature == 0.0f) {
        tok = argmax(logits, s->vocab_size);
        if (tok < 0)
            tok = ERR_RANGE;
    } else {
        struct dist d;
        tok = build_dist(s, logits, &d);
        if (tok == 0)
            tok = draw(s, &d, s->step + ahead);
    }
    restore_logits(s, logits, a);
    pop_prior(s, prior, n_prior, saved, before);
    return tok;
}

int32_t sampler_sample_masked(struct sampler *s, float *logits, const uint32_t *mask)
{
    return sampler_sample_ahead(s, logits, mask, 0, NULL);
}

int32_t sampler_sample(struct sampler *s, float *logits)
{
    return sampler_sample_masked(s, logits, NULL);
}

int sampler_probs_masked(struct sampler *s, float *logits, const uint32_t *mask, int32_t *ids,
                         float *probs)
{
    if (!s || !logits || !ids || !probs)
        return ERR_INVALID;
    struct applied a = process_logits(s, logits, mask);
    struct dist d = {0};
    int32_t rc;
    if (s->p.temperature == 0.0f)
        rc = argmax(logits, s->vocab_size);
    else
        rc = build_dist(s, logits, &d);
    restore_logits(s, logits, a);
    if (s->p.temperature == 0.0f || rc != 0) { /* greedy, +inf or nothing */
        if (rc < 0)
            return ERR_RANGE;
        ids[0] = rc;
        probs[0] = 1.0f;
        return 1;
    }
    const double total = (double)d.total;
    int n = 0;
    if (d.sparse) {
        for (int i = 0; i < d.n; i++) {
            ids[n] = s->cand[i].id;
            probs[n++] = (float)((double)s->cand[i].v / total);
        }
    } else {
        for (int i = 0; i < s->vocab_size; i++)
            if (s->w[i] >= d.theta) {
                ids[n] = i;
                probs[n++] = (float)((double)s->w[i] / total);
            }
    }
    return n;
}

int sampler_probs(struct sampler *s, float *logits, int32_t *ids, float *probs)
{
    return sampler_probs_masked(s, logits, NULL, ids, probs);
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
    float mx = row_max(logits, vocab_size);
    if (!isfinite(mx))
        return ERR_RANGE;

    /* the log-sum-exp and the n_top best (larger logit first, lower id first among
     * equals) */
    struct row_top top[SAMPLER_MAX_TOP_LOGPROBS];
    int m = row_top_n(logits, vocab_size, n_top, top);
    double sum = row_sum_exp(logits, vocab_size, mx);
    double lse = (double)mx + log(sum);
    for (int j = 0; j < m; j++) {
        top_ids[j] = top[j].id;
        top_logprobs[j] = (float)((double)top[j].v - lse);
    }
    float v = logits[token];
    *token_logprob = v > -INFINITY ? (float)((double)v - lse) : -INFINITY;
    return m;
}
