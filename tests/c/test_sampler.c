/* test_sampler.c — unit tests for src/sampler/sampler.c.
 *
 * Distribution tests draw many tokens with a fixed seed (one per step: each draw is
 * followed by sampler_accept, which advances the step that keys the random bits) and
 * compare the counts with the expected probabilities by Pearson's chi-square. The critical value is the 1 - 1e-4
 * quantile of chi-square (Wilson–Hilferty approximation): a correct sampler fails a given
 * test for a given seed with probability ~1e-4, and the seeds are fixed, so the result is
 * deterministic. Each distribution test also checks that it *rejects* a slightly wrong
 * distribution, so it is known to have the power to fail. Expected probabilities come
 * from an independent reference (double precision, full sort) written below.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sampler/exact.h"
#include "sampler/philox.h"
#include "sampler/row_scan.h"
#include "sampler/sampler.h"
#include "test.h"
#include "util/err.h"

/* ---- helpers ---- */

static uint64_t test_rng(uint64_t *x) /* splitmix64, for test inputs only */
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double test_unif(uint64_t *x) { return (double)(test_rng(x) >> 11) * 0x1.0p-53; }

/* Roughly normal logits (sum of uniforms), scaled: like a model's. */
static void random_logits(float *l, int n, float scale, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        double u = test_unif(&seed) + test_unif(&seed) + test_unif(&seed) - 1.5;
        l[i] = (float)(u * 2.0 * scale);
    }
}

static struct sampler_params params(float t, int k, float top_p, float min_p, uint64_t seed)
{
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    return p;
}

struct ref_c {
    int id;
    double v;
};

static int ref_cmp(const void *a, const void *b)
{
    const struct ref_c *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* Reference pipeline (no bias/penalties): full sort, double precision, the rule of
 * docs/sampling.md with real exponentials: top-k keeps every logit >= the k-th largest,
 * weights exp((l - max) / T) (0 below -22, as the rule's cut-off), top-p keeps the
 * smallest prefix of the weight order reaching top_p of the mass plus every tie of its
 * last weight, min-p keeps w >= min_p. Writes the final normalised probabilities to
 * prob[n] (0 outside the support); returns the support size. */
static int ref_dist(const float *logits, int n, const struct sampler_params *p, double *prob)
{
    struct ref_c *c = malloc((size_t)n * sizeof *c);
    int m = 0;
    for (int i = 0; i < n; i++) {
        prob[i] = 0.0;
        if (logits[i] > -INFINITY)
            c[m++] = (struct ref_c){i, logits[i]};
    }
    qsort(c, (size_t)m, sizeof *c, ref_cmp);
    if (p->top_k > 0 && p->top_k < m) {
        int k = p->top_k;
        while (k < m && c[k].v == c[p->top_k - 1].v)
            k++;
        m = k;
    }
    double mx = c[0].v, total = 0.0;
    int pos = 0;
    for (int i = 0; i < m; i++) {
        double x = (c[i].v - mx) / p->temperature;
        if (x < -22.0)
            continue;
        c[pos].id = c[i].id;
        c[pos++].v = exp(x);
        total += exp(x);
    }
    m = pos;
    if (p->top_p < 1.0f) {
        double acc = 0.0, target = p->top_p * total;
        int cut = m;
        for (int i = 0; i < m; i++) {
            acc += c[i].v;
            if (acc >= target) {
                cut = i + 1;
                break;
            }
        }
        while (cut < m && c[cut].v == c[cut - 1].v)
            cut++;
        m = cut;
    }
    int kept = 0;
    total = 0.0;
    for (int i = 0; i < m; i++)
        if (c[i].v >= p->min_p) {
            c[kept++] = c[i];
            total += c[i].v;
        }
    for (int i = 0; i < kept; i++)
        prob[c[i].id] = c[i].v / total;
    free(c);
    return kept;
}

/* 1 - 1e-4 quantile of chi-square with df degrees of freedom (Wilson–Hilferty). */
static double chi2_crit(int df)
{
    const double z = 3.719; /* standard normal 1 - 1e-4 quantile */
    double a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + z * sqrt(a), 3.0);
}

/* Pearson chi-square of counts[n] against prob[n] over `draws`; bins expecting fewer
 * than 5 draws are pooled into one. Returns the statistic and writes df. */
static double chi2_stat(const long *counts, const double *prob, int n, long draws, int *df)
{
    double stat = 0.0, pool_e = 0.0, pool_o = 0.0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)draws;
        if (e < 5.0) {
            pool_e += e;
            pool_o += (double)counts[i];
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (pool_e >= 5.0) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    } else if (pool_o > 0 && pool_e == 0.0) {
        stat = INFINITY; /* draws where nothing is allowed */
    }
    *df = bins - 1;
    return stat;
}

/* Draws `draws` tokens into counts[n], accepting each (the step advances; with the
 * penalties off the history changes nothing else). Returns the number of draws that fell
 * where prob == 0 (outside the expected support). */
static long draw_counts(struct sampler *s, float *logits, int n, long draws, long *counts,
                        const double *prob)
{
    long outside = 0;
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (long d = 0; d < draws; d++) {
        int32_t t = sampler_sample(s, logits);
        sampler_accept(s, t);
        if (t < 0 || t >= n) {
            outside++;
            continue;
        }
        counts[t]++;
        if (prob[t] == 0.0)
            outside++;
    }
    return outside;
}

/* ---- parameters ---- */

static void test_params_validate(void)
{
    char err[ERR_BUF];
    struct sampler_params p;
    sampler_params_default(&p);
    CHECK(sampler_params_validate(&p, err, sizeof err) == 0, "defaults rejected: %s", err);
    CHECK(p.temperature == 1.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f &&
              p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
              p.frequency_penalty == 0.0f && p.seed == 0,
          "defaults");
    struct {
        const char *name;
        float *field;
        float bad;
    } cases[] = {
        {"temperature", &p.temperature, -0.1f},       {"temperature", &p.temperature, NAN},
        {"temperature", &p.temperature, INFINITY},    {"top_p", &p.top_p, 0.0f},
        {"top_p", &p.top_p, 1.01f},                   {"top_p", &p.top_p, NAN},
        {"min_p", &p.min_p, -0.01f},                  {"min_p", &p.min_p, 1.5f},
        {"repetition_penalty", &p.repetition_penalty, 0.0f},
        {"repetition_penalty", &p.repetition_penalty, NAN},
        {"presence_penalty", &p.presence_penalty, 2.5f},
        {"frequency_penalty", &p.frequency_penalty, -2.5f},
        {"frequency_penalty", &p.frequency_penalty, NAN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sampler_params_default(&p);
        *cases[i].field = cases[i].bad;
        err[0] = 0;
        int rc = sampler_params_validate(&p, err, sizeof err);
        CHECK(rc == ERR_RANGE, "%s=%g accepted", cases[i].name, (double)cases[i].bad);
        CHECK(strncmp(err, cases[i].name, strlen(cases[i].name)) == 0, "message '%s' for %s", err,
              cases[i].name);
        CHECK(sampler_create(&p, 10) == NULL, "create accepted %s=%g", cases[i].name,
              (double)cases[i].bad);
    }
    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.top_k = -5;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    CHECK(sampler_params_validate(&p, err, sizeof err) == 0, "edge values rejected: %s", err);
    CHECK(sampler_create(&p, 0) == NULL, "vocab 0 accepted");
}

/* ---- greedy and its equivalents ---- */

static void test_greedy_argmax_ties(void)
{
    struct sampler_params p = params(0.0f, 0, 1.0f, 0.0f, 1);
    struct sampler *s = sampler_create(&p, 6);
    float l[6] = {1.0f, 5.0f, -2.0f, 5.0f, 4.99f, 0.0f};
    for (int i = 0; i < 10; i++)
        CHECK(sampler_sample(s, l) == 1, "argmax with tie must be lowest id 1");
    float l2[6] = {-INFINITY, NAN, -INFINITY, -3.0f, NAN, -3.0f};
    CHECK(sampler_sample(s, l2) == 3, "NaN never chosen, tie -> lowest");
    float l3[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, NAN, -INFINITY};
    CHECK(sampler_sample(s, l3) == ERR_RANGE, "nothing samplable");
    float l4[6] = {0.0f, INFINITY, 1.0f, INFINITY, 0.0f, 0.0f};
    CHECK(sampler_sample(s, l4) == 1, "+inf: lowest id");
    sampler_free(s);
}

/* top_k = 1, tiny top_p and min_p = 1 all reduce to greedy at any temperature — except
 * that all three keep every token tied at the maximum (the rule includes ties at each
 * filter's boundary), and the draw then picks among the tied tokens with equal odds. */
static void test_greedy_equivalents(void)
{
    enum { V = 1000 };
    float *l = malloc(V * sizeof *l);
    const float temps[] = {0.05f, 0.7f, 1.0f, 3.0f, 100.0f};
    for (int trial = 0; trial < 20; trial++) {
        random_logits(l, V, 3.0f, 100 + (uint64_t)trial);
        int32_t tie_a = trial * 7, tie_b = V - 1 - trial;
        if (trial % 2) /* plant a tie at the max: both tokens stay, drawn evenly */
            l[tie_b] = l[tie_a] = 50.0f;
        struct sampler_params g = params(0.0f, 0, 1.0f, 0.0f, 0);
        struct sampler *gs = sampler_create(&g, V);
        int32_t want = sampler_sample(gs, l);
        sampler_free(gs);
        if (trial % 2)
            CHECK(want == tie_a, "greedy tie: got %d, want the lower id %d", want, tie_a);
        for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
            struct sampler_params variants[3] = {
                params(temps[ti], 1, 1.0f, 0.0f, (uint64_t)trial),
                params(temps[ti], 0, 1e-6f, 0.0f, (uint64_t)trial),
                params(temps[ti], 0, 1.0f, 1.0f, (uint64_t)trial),
            };
            for (int v = 0; v < 3; v++) {
                struct sampler *s = sampler_create(&variants[v], V);
                int n_a = 0, n_b = 0;
                for (int d = 0; d < 50; d++) {
                    int32_t got = sampler_sample(s, l);
                    sampler_accept(s, got);
                    if (trial % 2) {
                        n_a += got == tie_a;
                        n_b += got == tie_b;
                        CHECK(got == tie_a || got == tie_b, "variant %d T=%g trial %d: got %d, "
                              "want %d or %d", v, (double)temps[ti], trial, got, tie_a, tie_b);
                    } else {
                        CHECK(got == want, "variant %d T=%g trial %d: got %d want %d", v,
                              (double)temps[ti], trial, got, want);
                    }
                }
                if (trial % 2) /* 50 fair coin flips: each side >= 8 fails with p ~ 2e-6 */
                    CHECK(n_a >= 8 && n_b >= 8, "variant %d T=%g trial %d: tie drawn %d / %d",
                          v, (double)temps[ti], trial, n_a, n_b);
                sampler_free(s);
            }
        }
    }
    free(l);
}

/* ---- distributions ---- */

static void test_temperature_distribution(void)
{
    enum { V = 5 };
    const long N = 200000;
    float l[V] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f};
    const float temps[] = {0.5f, 1.0f, 2.0f};
    long counts[V];
    double prob[V], wrong[V];
    for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
        struct sampler_params p = params(temps[ti], 0, 1.0f, 0.0f, 7 + ti);
        struct sampler *s = sampler_create(&p, V);
        double z = 0.0, zw = 0.0;
        for (int i = 0; i < V; i++) {
            z += exp(l[i] / temps[ti]);
            zw += exp(l[i] / (temps[ti] * 1.05));
        }
        for (int i = 0; i < V; i++) {
            prob[i] = exp(l[i] / temps[ti]) / z;
            wrong[i] = exp(l[i] / (temps[ti] * 1.05)) / zw;
        }
        draw_counts(s, l, V, N, counts, prob);
        int df;
        double stat = chi2_stat(counts, prob, V, N, &df);
        CHECK(stat < chi2_crit(df), "T=%g chi2=%g crit=%g", (double)temps[ti], stat, chi2_crit(df));
        /* absolute check: each frequency within 5 standard errors (<= 0.0056 at N=200k) */
        for (int i = 0; i < V; i++) {
            double f = (double)counts[i] / N, se = sqrt(prob[i] * (1 - prob[i]) / N);
            CHECK(fabs(f - prob[i]) <= 5 * se + 1e-12, "T=%g token %d freq %g want %g",
                  (double)temps[ti], i, f, prob[i]);
        }
        /* power: a 5% error in temperature is rejected */
        double stat_w = chi2_stat(counts, wrong, V, N, &df);
        CHECK(stat_w > chi2_crit(df), "T=%g: wrong distribution not rejected (chi2=%g)",
              (double)temps[ti], stat_w);
        sampler_free(s);
    }
}

/* Samples with p from logits[n] and checks support and frequencies against ref_dist. */
static void check_against_ref(const float *lin, int n, struct sampler_params p, long draws,
                              int want_support)
{
    float *l = malloc((size_t)n * sizeof *l);
    memcpy(l, lin, (size_t)n * sizeof *l);
    double *prob = malloc((size_t)n * sizeof *prob);
    long *counts = malloc((size_t)n * sizeof *counts);
    int support = ref_dist(l, n, &p, prob);
    if (want_support > 0)
        CHECK(support == want_support, "reference support %d, test expects %d", support,
              want_support);
    struct sampler *s = sampler_create(&p, n);
    /* the exact distribution: same support, same probabilities */
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *pr = malloc((size_t)n * sizeof *pr);
    int got = sampler_probs(s, l, ids, pr);
    CHECK(got == support, "k=%d p=%g min_p=%g T=%g: support %d, reference %d", p.top_k,
          (double)p.top_p, (double)p.min_p, (double)p.temperature, got, support);
    int bad = 0;
    double sum = 0.0;
    for (int i = 0; i < got; i++) {
        sum += pr[i];
        if (!(fabs(pr[i] - prob[ids[i]]) <= 1e-7 + 1e-4 * prob[ids[i]]) && bad++ < 3)
            CHECK(false, "token %d: p=%g reference %g", ids[i], (double)pr[i], prob[ids[i]]);
    }
    CHECK_CLOSE(sum, 1.0, 1e-5, 0);
    free(pr);
    free(ids);
    long outside = draw_counts(s, l, n, draws, counts, prob);
    CHECK(outside == 0, "k=%d p=%g min_p=%g T=%g: %ld draws outside the support", p.top_k,
          (double)p.top_p, (double)p.min_p, (double)p.temperature, outside);
    int df;
    double stat = chi2_stat(counts, prob, n, draws, &df);
    if (df > 0)
        CHECK(stat < chi2_crit(df), "k=%d p=%g min_p=%g: chi2=%g crit=%g df=%d", p.top_k,
              (double)p.top_p, (double)p.min_p, stat, chi2_crit(df), df);
    /* every supported token with a decent expectation was actually drawn */
    for (int i = 0; i < n; i++)
        if (prob[i] * draws >= 20.0)
            CHECK(counts[i] > 0, "token %d (p=%g) never drawn", i, prob[i]);
    CHECK(memcmp(l, lin, (size_t)n * sizeof *l) == 0, "logits not restored");
    sampler_free(s);
    free(counts);
    free(prob);
    free(l);
}

static void test_top_k_support(void)
{
    /* small k (heap path) and large k (quickselect path), on a vocabulary with ties */
    enum { V = 2000 };
    float *l = malloc(V * sizeof *l);
    random_logits(l, V, 2.0f, 11);
    for (int i = 0; i < V; i += 97)
        l[i] = l[i / 2]; /* duplicates: ties at the boundary are broken by id */
    check_against_ref(l, V, params(1.0f, 5, 1.0f, 0.0f, 1), 20000, 5);
    check_against_ref(l, V, params(0.6f, 128, 1.0f, 0.0f, 2), 40000, 128);
    check_against_ref(l, V, params(1.3f, 129, 1.0f, 0.0f, 3), 40000, 129);
    check_against_ref(l, V, params(1.0f, 700, 1.0f, 0.0f, 4), 40000, 700);
    check_against_ref(l, V, params(1.0f, V + 5, 1.0f, 0.0f, 5), 20000, V);
    /* a tie exactly at the top-k boundary: k = 2 over {5, 4, 4, 4} keeps every tie */
    float t[6] = {5.0f, 4.0f, 4.0f, 4.0f, -INFINITY, 1.0f};
    check_against_ref(t, 6, params(1.0f, 2, 1.0f, 0.0f, 6), 50000, 4);
    check_against_ref(t, 6, params(1.0f, 1, 1.0f, 0.0f, 6), 50000, 1);
    free(l);
}

static void test_top_p_support(void)
{
    /* probabilities 0.4, 0.3, 0.15, 0.1, 0.05: top_p 0.8 keeps three (0.7 < 0.8 <= 0.85) */
    float l[5] = {logf(0.1f), logf(0.4f), logf(0.05f), logf(0.3f), logf(0.15f)};
    check_against_ref(l, 5, params(1.0f, 0, 0.8f, 0.0f, 21), 200000, 3);
    check_against_ref(l, 5, params(1.0f, 0, 0.71f, 0.0f, 22), 200000, 3);
    check_against_ref(l, 5, params(1.0f, 0, 0.5f, 0.0f, 23), 200000, 2);
    check_against_ref(l, 5, params(1.0f, 0, 0.99f, 0.0f, 24), 200000, 5);
    /* power: sampling with top_p 0.8 is not the distribution of top_p 0.99 */
    {
        double prob[5];
        long counts[5];
        struct sampler_params p = params(1.0f, 0, 0.8f, 0.0f, 25), q = p;
        q.top_p = 0.99f;
        ref_dist(l, 5, &q, prob);
        struct sampler *s = sampler_create(&p, 5);
        long outside = draw_counts(s, l, 5, 20000, counts, prob);
        (void)outside;
        int df;
        CHECK(chi2_stat(counts, prob, 5, 20000, &df) > chi2_crit(df), "top-p test has no power");
        sampler_free(s);
    }
    /* large vocabulary: the quickselect nucleus vs the sorted reference */
    enum { V = 2000 };
    float *big = malloc(V * sizeof *big);
    random_logits(big, V, 4.0f, 31);
    check_against_ref(big, V, params(1.0f, 0, 0.9f, 0.0f, 32), 40000, 0);
    check_against_ref(big, V, params(0.7f, 0, 0.5f, 0.0f, 33), 40000, 0);
    check_against_ref(big, V, params(1.5f, 300, 0.95f, 0.0f, 34), 40000, 0);
    random_logits(big, V, 0.2f, 35); /* flat: the nucleus is most of the vocabulary */
    check_against_ref(big, V, params(1.0f, 0, 0.97f, 0.0f, 36), 60000, 0);
    free(big);
}

static void test_min_p_support(void)
{
    /* p_max 0.4: min_p 0.2 keeps p >= 0.08 (four tokens), 0.5 keeps p >= 0.2 (two) */
    float l[5] = {logf(0.1f), logf(0.4f), logf(0.05f), logf(0.3f), logf(0.15f)};
    check_against_ref(l, 5, params(1.0f, 0, 1.0f, 0.2f, 41), 200000, 4);
    check_against_ref(l, 5, params(1.0f, 0, 1.0f, 0.5f, 42), 200000, 2);
    /* at T = 2 the weights flatten: p ∝ sqrt(q), ratios sqrt(q / 0.4); min_p 0.45 keeps
     * q >= 0.081 (four tokens), where at T = 1 it keeps two */
    check_against_ref(l, 5, params(2.0f, 0, 1.0f, 0.45f, 43), 200000, 4);
    check_against_ref(l, 5, params(1.0f, 0, 1.0f, 0.45f, 43), 200000, 2);
    enum { V = 2000 };
    float *big = malloc(V * sizeof *big);
    random_logits(big, V, 3.0f, 44);
    check_against_ref(big, V, params(1.0f, 0, 1.0f, 0.05f, 45), 40000, 0);
    /* all three filters together */
    check_against_ref(big, V, params(0.8f, 1000, 0.9f, 0.02f, 46), 40000, 0);
    check_against_ref(big, V, params(1.2f, 40, 0.95f, 0.1f, 47), 40000, 0);
    free(big);
}

/* Many random small cases, exact distribution only (no draws): random vocabularies (with
 * ties and -inf), temperatures and filter combinations against the reference. */
static void test_random_exact(void)
{
    uint64_t x = 555;
    enum { VMAX = 600 };
    float l[VMAX], pr[VMAX];
    int32_t ids[VMAX];
    double prob[VMAX];
    int failures = 0;
    for (int iter = 0; iter < 3000 && failures < 3; iter++) {
        int n = 1 + (int)(test_rng(&x) % VMAX);
        random_logits(l, n, (float)(0.1 + 5 * test_unif(&x)), test_rng(&x));
        for (int i = 0; i < n / 10; i++) /* some ties and bans */
            l[test_rng(&x) % (uint64_t)n] = l[test_rng(&x) % (uint64_t)n];
        if (n > 1)
            l[test_rng(&x) % (uint64_t)n] = -INFINITY;
        int k = test_rng(&x) % 3 ? (int)(test_rng(&x) % (uint64_t)(n + 2)) : 0;
        float top_p = test_rng(&x) % 3 ? (float)(0.05 + 0.95 * test_unif(&x)) : 1.0f;
        float min_p = test_rng(&x) % 3 ? 0.0f : (float)(0.3 * test_unif(&x));
        float t = (float)(0.2 + 2.0 * test_unif(&x));
        struct sampler_params p = params(t, k, top_p, min_p, 0);
        int want = ref_dist(l, n, &p, prob);
        struct sampler *s = sampler_create(&p, n);
        int got = sampler_probs(s, l, ids, pr);
        bool ok = got == want;
        for (int i = 0; ok && i < got; i++)
            ok = fabs(pr[i] - prob[ids[i]]) <= 1e-6 + 1e-4 * prob[ids[i]];
        CHECK(ok, "iter %d: n=%d T=%g k=%d top_p=%g min_p=%g: support %d, reference %d", iter, n,
              (double)t, k, (double)top_p, (double)min_p, got, want);
        failures += !ok;
        sampler_free(s);
    }
}

/* ---- penalties and bias ---- */

static void test_penalties_exact(void)
{
    enum { V = 7 };
    struct sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 0);
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    struct sampler *s = sampler_create(&p, V);
    int32_t prompt[] = {0, 1, 0, 99, -1}; /* out-of-range ids ignored */
    sampler_accept_prompt(s, prompt, 5);
    sampler_accept(s, 2);
    sampler_accept(s, 2);
    sampler_accept(s, 3);
    sampler_accept(s, 0);
    sampler_accept(s, 1234); /* ignored */
    float l[V] = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f, 3.0f, 0.0f};
    float want[V] = {
        2.0f / 2 - (0.25f * 1 + 0.5f), /* prompt + 1 output: all three */
        -2.0f * 2,                     /* prompt only: repetition only */
        1.0f / 2 - (0.25f * 2 + 0.5f), /* output x2 */
        0.5f / 2 - (0.25f * 1 + 0.5f), /* output x1 */
        -1.0f, 3.0f, 0.0f,             /* unseen */
    };
    float orig[V];
    memcpy(orig, l, sizeof l);
    sampler_sample(s, l);
    CHECK(memcmp(l, orig, sizeof l) == 0, "sampler_sample did not restore logits");
    sampler_process_logits(s, l);
    for (int i = 0; i < V; i++)
        CHECK(l[i] == want[i], "id %d: %g want %g", i, (double)l[i], (double)want[i]);

    /* each penalty alone */
    struct {
        float rep, pres, freq;
        float want2; /* token 2: logit 1, seen twice in the output */
        float want1; /* token 1: logit -2, prompt only */
    } one[] = {
        {1.0f, 0.0f, 0.0f, 1.0f, -2.0f},
        {1.5f, 0.0f, 0.0f, 1.0f / 1.5f, -3.0f},
        {1.0f, 0.7f, 0.0f, 1.0f - 0.7f, -2.0f},
        {1.0f, 0.0f, -0.5f, 1.0f + 1.0f, -2.0f},
        {0.5f, 0.0f, 0.0f, 2.0f, -1.0f}, /* < 1 rewards repetition */
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
        p.repetition_penalty = one[i].rep;
        p.presence_penalty = one[i].pres;
        p.frequency_penalty = one[i].freq;
        sampler_reset(s, &p);
        sampler_accept_prompt(s, prompt, 3);
        sampler_accept(s, 2);
        sampler_accept(s, 2);
        float x[V] = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f, 3.0f, 0.0f};
        sampler_process_logits(s, x);
        CHECK(x[2] == one[i].want2, "case %zu: token 2 %g want %g", i, (double)x[2],
              (double)one[i].want2);
        CHECK(x[1] == one[i].want1, "case %zu: token 1 %g want %g", i, (double)x[1],
              (double)one[i].want1);
        CHECK(x[5] == 3.0f && x[6] == 0.0f, "case %zu: unseen tokens changed", i);
    }

    /* penalties change greedy decisions: token 5 wins until seen, then token 0 */
    p = params(0.0f, 0, 1.0f, 0.0f, 0);
    p.presence_penalty = 2.0f;
    sampler_reset(s, &p);
    float g[V] = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f, 3.0f, 0.0f};
    CHECK(sampler_sample(s, g) == 5, "greedy before penalty");
    sampler_accept(s, 5);
    CHECK(sampler_sample(s, g) == 0, "greedy after presence penalty");
    sampler_free(s);
}

static void test_logit_bias(void)
{
    enum { V = 8 };
    struct sampler_params p = params(0.0f, 0, 1.0f, 0.0f, 3);
    struct sampler *s = sampler_create(&p, V);
    float l[V] = {0.0f, 1.0f, 6.0f, 2.0f, 5.9f, -1.0f, 0.5f, 0.0f};
    CHECK(sampler_sample(s, l) == 2, "unbiased greedy");
    int32_t ban = 2;
    float ninf = -INFINITY;
    CHECK(sampler_set_logit_bias(s, &ban, &ninf, 1) == 0, "set bias");
    CHECK(sampler_sample(s, l) == 4, "banned token chosen");
    CHECK(l[2] == 6.0f, "bias not undone");

    /* exact values, and a repeated id adds up */
    int32_t ids[4] = {0, 5, 0, 7};
    float b[4] = {10.0f, -100.0f, 2.5f, 100.0f};
    CHECK(sampler_set_logit_bias(s, ids, b, 4) == 0, "set bias");
    float x[V];
    memcpy(x, l, sizeof x);
    sampler_process_logits(s, x);
    CHECK(x[0] == 12.5f && x[5] == -101.0f && x[7] == 100.0f && x[2] == 6.0f, "bias values");
    CHECK(sampler_sample(s, l) == 7, "bias +100 wins");

    /* bias composes with penalties (bias first, then penalty on the biased value) */
    p.repetition_penalty = 2.0f;
    sampler_reset(s, &p);
    CHECK(sampler_set_logit_bias(s, ids, b, 4) == 0, "set bias after reset");
    sampler_accept(s, 0);
    memcpy(x, l, sizeof x);
    sampler_process_logits(s, x);
    CHECK(x[0] == 12.5f / 2, "bias then repetition: %g", (double)x[0]);
    float y[V];
    memcpy(y, l, sizeof y);
    sampler_sample(s, y);
    CHECK(memcmp(y, l, sizeof y) == 0, "bias+penalty not undone");

    /* errors leave the previous bias in place */
    int32_t bad_id = V;
    float nan = NAN, pinf = INFINITY, one = 1.0f;
    CHECK(sampler_set_logit_bias(s, &bad_id, &one, 1) == ERR_RANGE, "id out of range");
    CHECK(sampler_set_logit_bias(s, &ban, &nan, 1) == ERR_INVALID, "NaN bias");
    CHECK(sampler_set_logit_bias(s, &ban, &pinf, 1) == ERR_INVALID, "+inf bias");
    CHECK(sampler_set_logit_bias(s, NULL, NULL, 1) == ERR_INVALID, "NULL arrays");
    CHECK(sampler_set_logit_bias(s, ids, b, SAMPLER_MAX_LOGIT_BIAS + 1) == ERR_RANGE, "n > max");
    CHECK(sampler_set_logit_bias(s, ids, b, -1) == ERR_RANGE, "n < 0");
    memcpy(x, l, sizeof x);
    sampler_process_logits(s, x);
    CHECK(x[7] == 100.0f, "failed set changed the bias");
    CHECK(sampler_set_logit_bias(s, NULL, NULL, 0) == 0, "clear");
    p.repetition_penalty = 1.0f;
    sampler_reset(s, &p);
    CHECK(sampler_sample(s, l) == 2, "cleared bias still applied");

    /* at temperature 1, a banned token is never drawn; everything banned -> ERR_RANGE */
    p = params(1.0f, 0, 1.0f, 0.0f, 4);
    sampler_reset(s, &p);
    float flat[V] = {0};
    int32_t bans[3] = {1, 3, 6};
    float nb[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(sampler_set_logit_bias(s, bans, nb, 3) == 0, "set bans");
    long seen[V] = {0};
    for (int d = 0; d < 20000; d++) {
        int32_t t = sampler_sample(s, flat);
        sampler_accept(s, t);
        if (t >= 0 && t < V)
            seen[t]++;
    }
    CHECK(seen[1] == 0 && seen[3] == 0 && seen[6] == 0, "banned drawn %ld %ld %ld", seen[1],
          seen[3], seen[6]);
    CHECK(seen[0] > 3000 && seen[2] > 3000 && seen[7] > 3000, "allowed tokens not drawn evenly");
    int32_t all[V] = {0, 1, 2, 3, 4, 5, 6, 7};
    float allb[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                     -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    sampler_set_logit_bias(s, all, allb, V);
    CHECK(sampler_sample(s, flat) == ERR_RANGE, "all banned, T=1");
    p.temperature = 0.0f;
    sampler_reset(s, &p);
    sampler_set_logit_bias(s, all, allb, V);
    CHECK(sampler_sample(s, flat) == ERR_RANGE, "all banned, greedy");
    for (int i = 0; i < V; i++)
        CHECK(flat[i] == 0.0f, "flat[%d] not restored", i);
    sampler_free(s);
}

/* ---- determinism ---- */

static void draw_seq(struct sampler *s, float *l, int n, int32_t *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = sampler_sample(s, l);
        sampler_accept(s, out[i]);
    }
}

static void test_seed_and_reset(void)
{
    enum { V = 500, N = 400 };
    float *l = malloc(V * sizeof *l);
    random_logits(l, V, 1.0f, 77);
    struct sampler_params p = params(1.0f, 50, 0.95f, 0.0f, 1234);
    p.frequency_penalty = 0.3f;
    p.repetition_penalty = 1.1f;
    struct sampler *a = sampler_create(&p, V), *b = sampler_create(&p, V);
    int32_t sa[N], sb[N], sc[N];
    draw_seq(a, l, N, sa);
    draw_seq(b, l, N, sb);
    CHECK(memcmp(sa, sb, sizeof sa) == 0, "same seed, different sequence");
    /* reset restores RNG and history: the same sequence again */
    sampler_reset(a, &p);
    draw_seq(a, l, N, sc);
    CHECK(memcmp(sa, sc, sizeof sa) == 0, "reset did not restore the sequence");
    sampler_reset(a, NULL);
    draw_seq(a, l, N, sc);
    CHECK(memcmp(sa, sc, sizeof sa) == 0, "reset(NULL) did not restore the sequence");
    /* reset clears the history: no penalty applies afterwards */
    sampler_reset(a, &p);
    float x[V];
    memcpy(x, l, sizeof x);
    sampler_process_logits(a, x);
    CHECK(memcmp(x, l, sizeof x) == 0, "history survived reset");
    /* another seed gives another sequence */
    p.seed = 1235;
    sampler_reset(b, &p);
    draw_seq(b, l, N, sb);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += sa[i] == sb[i];
    CHECK(same < N / 4, "seeds 1234 and 1235 agree on %d of %d tokens", same, N);
    sampler_free(a);
    sampler_free(b);
    free(l);
}

/* The exact sequence for one seed, pinned: Philox, the weights, the draw and the step
 * counting must give these tokens on every platform, in every backend and in every future
 * version (change them only on purpose, and say so in docs/sampling.md). The expected
 * values come from the independent Python implementation of the rule in docs/sampling.md
 * (exact rational arithmetic), not from this code. */
static void test_golden_sequence(void)
{
    float l[8] = {0.5f, 1.0f, -0.25f, 2.0f, 0.0f, 1.5f, -1.0f, 0.75f};
    struct sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 42);
    struct sampler *s = sampler_create(&p, 8);
    static const int32_t want[24] = {3, 3, 4, 5, 5, 3, 5, 3, 1, 3, 5, 3,
                                     1, 3, 5, 3, 1, 3, 7, 1, 7, 3, 4, 6};
    int32_t got[24];
    for (int i = 0; i < 24; i++) {
        got[i] = sampler_sample(s, l);
        sampler_accept(s, got[i]);
    }
    char buf[256];
    int o = 0;
    for (int i = 0; i < 24; i++)
        o += snprintf(buf + o, sizeof buf - (size_t)o, "%d,", got[i]);
    CHECK(memcmp(got, want, sizeof want) == 0, "golden sequence changed: got %s", buf);
    /* the filters too: T = 0.7, top-k 5, top-p 0.8, min-p 0.1, seed 2^40 + 7 */
    p = params(0.7f, 5, 0.8f, 0.1f, (1ull << 40) + 7);
    sampler_reset(s, &p);
    static const int32_t want2[24] = {5, 3, 5, 1, 3, 3, 3, 3, 1, 5, 3, 5,
                                      3, 5, 1, 3, 3, 3, 3, 3, 5, 3, 3, 3};
    for (int i = 0; i < 24; i++) {
        got[i] = sampler_sample(s, l);
        sampler_accept(s, got[i]);
    }
    o = 0;
    for (int i = 0; i < 24; i++)
        o += snprintf(buf + o, sizeof buf - (size_t)o, "%d,", got[i]);
    CHECK(memcmp(got, want2, sizeof want2) == 0, "golden filtered sequence changed: got %s", buf);
    /* the integer weights of the rule, pinned (W = rint(e(x) * 2^31)) */
    static const float xs[6] = {0.0f, -0.5f, -1.0f, -3.25f, -21.0f, -22.5f};
    static const uint32_t ws[6] = {2147483648u, 1302514688u, 790015104u, 83266976u, 2u, 0u};
    for (int i = 0; i < 6; i++)
        CHECK(smp_weight(xs[i]) == ws[i], "W(%g) = %u, want %u", (double)xs[i],
              smp_weight(xs[i]), ws[i]);
    sampler_free(s);
}

/* ---- the step keys the draw ---- */

/* The draw depends on (seed, step) only: not on which tokens were accepted (with the
 * penalties off), not on other samplers, not on how often sample is called per step. */
static void test_step_keys_draw(void)
{
    enum { V = 300, N = 64 };
    float l[V];
    random_logits(l, V, 1.0f, 4242);
    struct sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 99);
    struct sampler *a = sampler_create(&p, V), *b = sampler_create(&p, V);
    CHECK(sampler_step(a) == 0, "fresh step %llu", (unsigned long long)sampler_step(a));
    int32_t sa[N];
    for (int i = 0; i < N; i++) {
        sa[i] = sampler_sample(a, l);
        CHECK(sampler_sample(a, l) == sa[i], "step %d: a second call drew another token", i);
        sampler_accept(a, sa[i]);
        sampler_accept(b, (int32_t)((i * 37) % V)); /* other tokens, same steps */
    }
    CHECK(sampler_step(a) == N && sampler_step(b) == N, "steps %llu %llu",
          (unsigned long long)sampler_step(a), (unsigned long long)sampler_step(b));
    sampler_reset(b, NULL);
    int same = 0;
    for (int i = 0; i < N; i++) {
        int32_t t = sampler_sample(b, l);
        same += t == sa[i];
        sampler_accept(b, -1); /* an ignored id still advances the step */
    }
    CHECK(same == N, "replaying the steps with another history: %d of %d tokens agree", same, N);
    /* the step counter is the only state: a sampler at step N draws what a fresh one draws
     * after N accepts of anything */
    sampler_reset(a, NULL);
    for (int i = 0; i < 10; i++)
        sampler_accept(a, 0);
    CHECK(sampler_sample(a, l) == sa[10], "step 10 after reset: %d want %d",
          sampler_sample(a, l), sa[10]);
    sampler_free(a);
    sampler_free(b);
}

/* A speculative row's draw (sampler_sample_ahead with the proposed tokens before it) is
 * the draw after accepting those tokens, penalties included, and leaves the sampler as it
 * was; sampler_history_ahead is the history after accepting them (what the device
 * sampler is given). Checked to matter: without the prior tokens some draws differ. */
static void test_ahead_prior(void)
{
    enum { V = 64, TRIALS = 200 };
    const int32_t prompt[] = { 1, 2, 3, 5 }, output[] = { 7, 7, 9 };
    const int32_t prior[] = { 5, 7, 60, 5, 11, 60 }; /* repeats, seen and new ids */
    const int np = (int)(sizeof prior / sizeof prior[0]);
    int differs = 0, draws = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        float l[V];
        random_logits(l, V, 1.5f, 777 + (uint64_t)trial);
        struct sampler_params p = params(trial % 4 ? 0.9f : 0.0f, 0, 1.0f, 0.0f, 31 + (uint64_t)trial);
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.4f;
        struct sampler *a = sampler_create(&p, V);
        sampler_accept_prompt(a, prompt, 4);
        for (int i = 0; i < 3; i++)
            sampler_accept(a, output[i]);
        int32_t ids0[V], ids[V], ids_b[V];
        uint32_t info0[V], info[V], info_b[V];
        const int n0 = sampler_history_len(a);
        sampler_history(a, ids0, info0);
        for (int k = 0; k <= np; k++) {
            struct sampler *b = sampler_create(&p, V);
            sampler_accept_prompt(b, prompt, 4);
            for (int i = 0; i < 3; i++)
                sampler_accept(b, output[i]);
            for (int i = 0; i < k; i++)
                sampler_accept(b, prior[i]);
            const int32_t want = sampler_sample(b, l);
            const int32_t got = sampler_sample_ahead(a, l, NULL, (uint32_t)k, prior);
            CHECK(got == want, "trial %d, %d ahead: %d, after accepting them %d", trial, k, got, want);
            differs += k > 0 && sampler_sample_ahead(a, l, NULL, (uint32_t)k, NULL) != want;
            draws++;
            const int n = sampler_history_ahead(a, prior, k, ids, info), nb = sampler_history_len(b);
            sampler_history(b, ids_b, info_b);
            CHECK(n == nb && !memcmp(ids, ids_b, sizeof *ids * (size_t)n) &&
                      !memcmp(info, info_b, sizeof *info * (size_t)n),
                  "trial %d, %d ahead: history of %d entries, after accepting them %d", trial, k, n, nb);
            sampler_free(b);
        }
        CHECK(sampler_step(a) == 3 && sampler_history_len(a) == n0, "trial %d: the sampler moved", trial);
        sampler_history(a, ids, info);
        CHECK(!memcmp(ids, ids0, sizeof *ids * (size_t)n0) && !memcmp(info, info0, sizeof *info * (size_t)n0),
              "trial %d: the history changed", trial);
        sampler_free(a);
    }
    CHECK(differs > draws / 20, "the proposed tokens changed only %d of %d draws", differs, draws);
    struct sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 1);
    struct sampler *a = sampler_create(&p, V);
    float l[V] = { 0 };
    int32_t many[SAMPLER_MAX_AHEAD + 1] = { 0 };
    CHECK(sampler_sample_ahead(a, l, NULL, SAMPLER_MAX_AHEAD + 1, many) == ERR_INVALID,
          "looking %d ahead was not refused", SAMPLER_MAX_AHEAD + 1);
    sampler_free(a);
}

/* Exported state for the device sampler: the history with its prompt flags and counts,
 * and the merged logit bias. */
static void test_export(void)
{
    struct sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 1);
    struct sampler *s = sampler_create(&p, 50);
    int32_t prompt[4] = {7, 3, 7, 60};
    sampler_accept_prompt(s, prompt, 4);
    sampler_accept(s, 3);
    sampler_accept(s, 9);
    sampler_accept(s, 9);
    CHECK(sampler_history_len(s) == 3, "history %d", sampler_history_len(s));
    int32_t ids[3];
    uint32_t info[3];
    sampler_history(s, ids, info);
    CHECK(ids[0] == 7 && info[0] == SMP_PROMPT_FLAG, "entry 0: %d %#x", ids[0], info[0]);
    CHECK(ids[1] == 3 && info[1] == (SMP_PROMPT_FLAG | 1u), "entry 1: %d %#x", ids[1], info[1]);
    CHECK(ids[2] == 9 && info[2] == 2u, "entry 2: %d %#x", ids[2], info[2]);
    int32_t bid[5] = {4, 8, 4, 4, 1};
    float bv[5] = {0.1f, -1.0f, 0.2f, 0.4f, -INFINITY};
    CHECK(sampler_set_logit_bias(s, bid, bv, 5) == 0, "set bias");
    int32_t oid[SAMPLER_MAX_LOGIT_BIAS];
    float ov[SAMPLER_MAX_LOGIT_BIAS];
    int nb = sampler_logit_bias(s, oid, ov);
    CHECK(nb == 3 && oid[0] == 4 && oid[1] == 8 && oid[2] == 1, "merged bias ids");
    CHECK(ov[0] == (0.1f + 0.2f) + 0.4f && ov[1] == -1.0f && ov[2] == -INFINITY,
          "merged bias values %g %g %g", (double)ov[0], (double)ov[1], (double)ov[2]);
    /* the merged sum is added once: logit + ((0.1 + 0.2) + 0.4) */
    float x[50] = {0};
    x[4] = 1e-8f;
    sampler_process_logits(s, x);
    CHECK(x[4] == 1e-8f + ((0.1f + 0.2f) + 0.4f), "bias applied as one sum: %.9g", (double)x[4]);
    sampler_free(s);
}

/* ---- the rule against an independent, sorting implementation ---- */

struct spec_e {
    int id;
    float l;
    uint32_t w;
};

static int spec_by_l(const void *a, const void *b)
{
    float x = ((const struct spec_e *)a)->l, y = ((const struct spec_e *)b)->l;
    return (x < y) - (x > y);
}

static int spec_by_w(const void *a, const void *b)
{
    uint32_t x = ((const struct spec_e *)a)->w, y = ((const struct spec_e *)b)->w;
    return (x < y) - (x > y);
}

static int spec_by_id(const void *a, const void *b)
{
    return ((const struct spec_e *)a)->id - ((const struct spec_e *)b)->id;
}

/* docs/sampling.md step by step, with full sorts, over processed logits l[n]. */
static int32_t spec_sample(const float *l, int n, const struct sampler_params *p, uint64_t step)
{
    struct spec_e *e = malloc((size_t)n * sizeof *e);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (l[i] > -INFINITY)
            e[m++] = (struct spec_e){i, l[i], 0};
    int32_t tok = ERR_RANGE;
    if (m == 0)
        goto out;
    qsort(e, (size_t)m, sizeof *e, spec_by_l); /* larger first (ties: any order) */
    if (p->temperature == 0.0f || e[0].l == INFINITY) {
        tok = INT32_MAX;
        for (int i = 0; i < m && e[i].l == e[0].l; i++)
            tok = e[i].id < tok ? e[i].id : tok;
        goto out;
    }
    if (p->top_k > 0 && p->top_k < m) {
        int k = p->top_k;
        while (k < m && e[k].l == e[p->top_k - 1].l)
            k++;
        m = k;
    }
    float inv_t = smp_inv_temperature(p->temperature);
    uint64_t total = 0;
    for (int i = 0; i < m; i++) {
        e[i].w = smp_weight(smp_scaled(e[i].l, e[0].l, inv_t));
        total += e[i].w;
    }
    uint32_t theta = 1;
    if (p->top_p < 1.0f) {
        qsort(e, (size_t)m, sizeof *e, spec_by_w);
        double target = smp_top_p_target(p->top_p, total);
        uint64_t acc = 0;
        for (int i = 0; i < m; i++) {
            acc += e[i].w;
            if ((double)acc >= target) {
                theta = e[i].w;
                break;
            }
        }
    }
    if (p->min_p > 0.0f && smp_min_p_weight(p->min_p) > theta)
        theta = smp_min_p_weight(p->min_p);
    qsort(e, (size_t)m, sizeof *e, spec_by_id);
    total = 0;
    for (int i = 0; i < m; i++)
        total += e[i].w >= theta ? e[i].w : 0;
    uint64_t r = smp_draw_point(smp_draw_bits(p->seed, step), total), acc = 0;
    for (int i = 0; i < m; i++)
        if (e[i].w >= theta && r < (acc += e[i].w)) {
            tok = e[i].id;
            break;
        }
out:
    free(e);
    return tok;
}

/* Many random rows and parameter sets, token by token against spec_sample: the heap,
 * quickselect, prefilter and dense/sparse draw paths must pick exactly the same token.
 * Rows have planted ties, bans, NaN, +inf; penalties and bias go through the sampler and
 * spec_sample sees the processed logits (sampler_process_logits). */
static void test_against_spec(void)
{
    uint64_t x = 777;
    enum { VMAX = 3000 };
    float *l = malloc(VMAX * sizeof *l), *proc = malloc(VMAX * sizeof *proc);
    int failures = 0;
    for (int iter = 0; iter < 1500 && failures < 5; iter++) {
        int n = 1 + (int)(test_rng(&x) % (iter % 10 == 0 ? VMAX : 400));
        random_logits(l, n, (float)(0.05 + 6 * test_unif(&x)), test_rng(&x));
        for (int i = 0; i < n / 8; i++) /* ties */
            l[test_rng(&x) % (uint64_t)n] = l[test_rng(&x) % (uint64_t)n];
        if (test_rng(&x) % 4 == 0)
            for (int i = 0; i < n / 10 + 1; i++)
                l[test_rng(&x) % (uint64_t)n] = test_rng(&x) % 2 ? -INFINITY : NAN;
        if (test_rng(&x) % 50 == 0)
            l[test_rng(&x) % (uint64_t)n] = INFINITY;
        if (test_rng(&x) % 30 == 0) /* flat: everything ties */
            for (int i = 0; i < n; i++)
                l[i] = 0.5f;
        struct sampler_params p = params(test_rng(&x) % 8 ? (float)(0.05 + 2.5 * test_unif(&x)) : 0.0f,
                                         test_rng(&x) % 2 ? (int)(test_rng(&x) % (uint64_t)(n + 3)) : 0,
                                         test_rng(&x) % 2 ? (float)(0.02 + test_unif(&x)) : 1.0f,
                                         test_rng(&x) % 3 ? 0.0f : (float)(0.4 * test_unif(&x)),
                                         test_rng(&x));
        if (p.top_p > 1.0f)
            p.top_p = 1.0f;
        if (test_rng(&x) % 3 == 0) {
            p.repetition_penalty = (float)(0.5 + test_unif(&x));
            p.presence_penalty = (float)(2 * test_unif(&x) - 1);
            p.frequency_penalty = (float)(2 * test_unif(&x) - 1);
        }
        struct sampler *s = sampler_create(&p, n);
        int hist = (int)(test_rng(&x) % 40);
        for (int i = 0; i < hist; i++) {
            int32_t t = (int32_t)(test_rng(&x) % (uint64_t)n);
            if (i % 3)
                sampler_accept(s, t);
            else
                sampler_accept_prompt(s, &t, 1);
        }
        if (test_rng(&x) % 4 == 0) {
            int32_t bid[4];
            float bv[4];
            for (int i = 0; i < 4; i++) {
                bid[i] = (int32_t)(test_rng(&x) % (uint64_t)n);
                bv[i] = i == 3 ? -INFINITY : (float)(20 * test_unif(&x) - 10);
            }
            sampler_set_logit_bias(s, bid, bv, 4);
        }
        memcpy(proc, l, (size_t)n * sizeof *l);
        sampler_process_logits(s, proc);
        bool ok = true;
        for (int d = 0; d < 3 && ok; d++) {
            int32_t want = spec_sample(proc, n, &p, sampler_step(s));
            int32_t got = sampler_sample(s, l);
            ok = got == want;
            CHECK(ok, "iter %d draw %d: n=%d T=%g k=%d top_p=%g min_p=%g: got %d, spec %d", iter,
                  d, n, (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p, got, want);
            sampler_accept(s, -1); /* advance the step without touching the history */
        }
        failures += !ok;
        sampler_free(s);
    }
    free(l);
    free(proc);
}

/* ---- cost: inverse CDF (the rule) against an exponential race ---- */

/* The alternative draw that was not chosen (docs/sampling.md, "Why an inverse CDF"):
 * argmax over the support of W_i / E_i with E_i = -log(u_i), u_i from Philox(seed, step,
 * i) (four uniforms per call). Timed only. */
static int32_t race_draw(const float *l, int n, float m, float inv_t, uint64_t seed, uint64_t step)
{
    float best = -1.0f;
    int32_t tok = -1;
    for (int i = 0; i < n; i += 4) {
        uint32_t ctr[4] = {(uint32_t)i, (uint32_t)step, (uint32_t)(step >> 32), 1u};
        uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, u[4];
        philox4x32_10(ctr, key, u);
        for (int j = 0; j < 4 && i + j < n; j++) {
            uint32_t wi = smp_weight(smp_scaled(l[i + j], m, inv_t));
            float e = -logf(((float)(u[j] >> 8) + 0.5f) * 0x1.0p-24f);
            float sc = (float)wi / e;
            if (wi && sc > best) {
                best = sc;
                tok = i + j;
            }
        }
    }
    return tok;
}

static void test_cost(void)
{
    static const int vocabs[2] = {49152, 152064};
    for (int vi = 0; vi < 2; vi++) {
        int V = vocabs[vi];
        float *l = malloc((size_t)V * sizeof *l);
        random_logits(l, V, 4.0f, 31337);
        float m = -INFINITY;
        for (int i = 0; i < V; i++)
            m = l[i] > m ? l[i] : m;
        const struct {
            const char *what;
            float t, top_p;
            int k;
        } cfg[] = {{"greedy", 0.0f, 1.0f, 0}, {"T=1", 1.0f, 1.0f, 0}, {"T=0.7 top-p 0.9", 0.7f, 0.9f, 0},
                   {"T=0.7 top-k 50", 0.7f, 1.0f, 50}};
        char line[512];
        int o = snprintf(line, sizeof line, "     vocab %6d:", V);
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            struct sampler_params p = params(cfg[c].t, cfg[c].k, cfg[c].top_p, 0.0f, 5);
            struct sampler *s = sampler_create(&p, V);
            clock_t t0 = clock();
            for (int d = 0; d < 40; d++)
                sampler_accept(s, sampler_sample(s, l));
            double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC / 40;
            o += snprintf(line + o, sizeof line - (size_t)o, " %s %.3f ms,", cfg[c].what, ms);
            sampler_free(s);
        }
        int32_t sink = 0;
        clock_t t0 = clock();
        for (int d = 0; d < 40; d++)
            sink += race_draw(l, V, m, 1.0f, 5, (uint64_t)d);
        double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC / 40;
        snprintf(line + o, sizeof line - (size_t)o, " [race T=1 %.3f ms]", ms);
        printf("%s\n", line);
        CHECK(sink >= 0, "race drew nothing");
        /* the same under a token mask allowing every 10th id (a grammar's typical state) */
        uint32_t *mask = calloc((size_t)(V + 31) / 32, sizeof *mask);
        for (int i = 0; i < V; i += 10)
            mask[i / 32] |= 1u << (i % 32);
        o = snprintf(line, sizeof line, "     vocab %6d, mask 10%%:", V);
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            struct sampler_params p = params(cfg[c].t, cfg[c].k, cfg[c].top_p, 0.0f, 5);
            struct sampler *s = sampler_create(&p, V);
            clock_t t1 = clock();
            for (int d = 0; d < 40; d++) {
                int32_t t = sampler_sample_masked(s, l, mask);
                CHECK(t >= 0 && t % 10 == 0, "masked draw %d", t);
                sampler_accept(s, t);
            }
            double mms = 1000.0 * (double)(clock() - t1) / CLOCKS_PER_SEC / 40;
            o += snprintf(line + o, sizeof line - (size_t)o, " %s %.3f ms,", cfg[c].what, mms);
            sampler_free(s);
        }
        printf("%s\n", line);
        free(mask);
        free(l);
    }
}

/* ---- large vocabulary ---- */

static void test_large_vocab(void)
{
    enum { V = 151936 };
    float *l = malloc(V * sizeof *l), *orig = malloc(V * sizeof *orig);
    random_logits(l, V, 4.0f, 2024);
    memcpy(orig, l, V * sizeof *l);
    struct {
        float t;
        int k;
        float top_p, min_p;
    } cfg[] = {
        {0.0f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 0.0f},  {0.8f, 40, 0.95f, 0.0f},
        {0.7f, 1, 1.0f, 0.0f},  {1.0f, 0, 0.9f, 0.0f},  {1.0f, 0, 1.0f, 0.05f},
        {0.6f, 1000, 0.9f, 0.0f}, {1.0f, 50000, 1.0f, 0.0f}, {1.0f, 20, 0.8f, 0.1f},
    };
    int32_t prompt[64];
    for (int i = 0; i < 64; i++)
        prompt[i] = (int32_t)((i * 2654435761u) % V);
    double *prob = malloc(V * sizeof *prob);
    int32_t argmax = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[argmax])
            argmax = i;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        struct sampler_params p = params(cfg[c].t, cfg[c].k, cfg[c].top_p, cfg[c].min_p, c);
        if (cfg[c].t > 0.0f)
            ref_dist(l, V, &p, prob);
        struct sampler *s = sampler_create(&p, V);
        CHECK(s != NULL, "create vocab %d", V);
        if (!s)
            continue;
        int bad = 0;
        clock_t t0 = clock();
        for (int d = 0; d < 60; d++) {
            int32_t t = sampler_sample(s, l);
            if (t < 0 || t >= V || (cfg[c].t > 0.0f ? prob[t] == 0.0 : t != argmax))
                bad++;
        }
        double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC / 60;
        CHECK(bad == 0, "cfg %zu: %d draws outside the support", c, bad);
        printf("     vocab %d T=%.1f k=%d p=%.2f min_p=%.2f: %.3f ms/token\n", V,
               (double)cfg[c].t, cfg[c].k, (double)cfg[c].top_p, (double)cfg[c].min_p, ms);
        /* with history and penalties: valid ids, logits restored */
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.5f;
        sampler_reset(s, &p);
        sampler_accept_prompt(s, prompt, 64);
        for (int d = 0; d < 60; d++) {
            int32_t t = sampler_sample(s, l);
            CHECK(t >= 0 && t < V, "cfg %zu: token %d", c, t);
            sampler_accept(s, t);
        }
        CHECK(memcmp(l, orig, V * sizeof *l) == 0, "cfg %zu: logits not restored", c);
        sampler_free(s);
    }
    free(prob);
    free(l);
    free(orig);
}

/* ---- logprobs ---- */

static void test_logprobs(void)
{
    float l[6] = {logf(0.1f), logf(0.2f), logf(0.4f), -INFINITY, logf(0.2f), logf(0.1f)};
    int32_t ids[SAMPLER_MAX_TOP_LOGPROBS];
    float lp[SAMPLER_MAX_TOP_LOGPROBS], tlp;
    int n = sampler_logprobs(l, 6, 4, 3, ids, lp, &tlp);
    CHECK(n == 3, "n=%d", n);
    CHECK(ids[0] == 2 && ids[1] == 1 && ids[2] == 4, "order %d %d %d", ids[0], ids[1], ids[2]);
    CHECK_CLOSE(lp[0], log(0.4), 1e-6, 0);
    CHECK_CLOSE(lp[1], log(0.2), 1e-6, 0);
    CHECK_CLOSE(lp[2], log(0.2), 1e-6, 0);
    CHECK_CLOSE(tlp, log(0.2), 1e-6, 0);
    n = sampler_logprobs(l, 6, 3, SAMPLER_MAX_TOP_LOGPROBS, ids, lp, &tlp);
    CHECK(n == 5, "only finite logits listed: n=%d", n);
    CHECK(tlp == -INFINITY, "-inf logit: %g", (double)tlp);
    CHECK(ids[3] == 0 && ids[4] == 5, "tie order by id");
    CHECK(sampler_logprobs(l, 6, 0, 0, NULL, NULL, &tlp) == 0, "n_top 0");
    CHECK_CLOSE(tlp, log(0.1), 1e-6, 0);
    /* shift invariance and normalisation on a big random row */
    enum { V = 151936 };
    float *big = malloc(V * sizeof *big);
    random_logits(big, V, 5.0f, 99);
    n = sampler_logprobs(big, V, 17, 20, ids, lp, &tlp);
    CHECK(n == 20, "n=%d", n);
    double mx = -INFINITY, z = 0.0;
    for (int i = 0; i < V; i++)
        mx = big[i] > mx ? big[i] : mx;
    for (int i = 0; i < V; i++)
        z += exp(big[i] - mx);
    CHECK_CLOSE(tlp, big[17] - mx - log(z), 1e-4, 0);
    CHECK(big[ids[0]] == mx, "top-1 is the argmax");
    for (int j = 1; j < 20; j++)
        CHECK(lp[j] <= lp[j - 1], "top list not descending at %d", j);
    int above = 0; /* exactly 19 tokens beat the 20th (no ties in random data) */
    for (int i = 0; i < V; i++)
        above += big[i] > big[ids[19]];
    CHECK(above == 19, "%d tokens above the 20th", above);
    for (int i = 0; i < V; i++)
        big[i] += 1000.0f;
    float tlp2;
    sampler_logprobs(big, V, 17, 0, NULL, NULL, &tlp2);
    CHECK_CLOSE(tlp2, tlp, 2e-3, 0); /* float rounding of +1000 shifts by <= 6e-5 per logit */
    free(big);
    /* errors */
    CHECK(sampler_logprobs(l, 6, 6, 1, ids, lp, &tlp) == ERR_INVALID, "token out of range");
    CHECK(sampler_logprobs(l, 6, 0, 21, ids, lp, &tlp) == ERR_INVALID, "n_top > 20");
    CHECK(sampler_logprobs(l, 6, 0, 2, NULL, lp, &tlp) == ERR_INVALID, "NULL top_ids");
    float dead[3] = {-INFINITY, NAN, -INFINITY};
    CHECK(sampler_logprobs(dead, 3, 0, 1, ids, lp, &tlp) == ERR_RANGE, "no finite logit");
}

/* ---- odd inputs at temperature > 0 ---- */

static void test_nonfinite_logits(void)
{
    struct sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 5);
    struct sampler *s = sampler_create(&p, 6);
    float l[6] = {NAN, 0.0f, -INFINITY, 0.0f, NAN, 0.0f};
    int seen[6] = {0};
    for (int d = 0; d < 3000; d++) {
        int32_t t = sampler_sample(s, l);
        sampler_accept(s, t);
        CHECK(t == 1 || t == 3 || t == 5, "drew %d", t);
        if (t >= 0 && t < 6)
            seen[t]++;
    }
    CHECK(seen[1] > 800 && seen[3] > 800 && seen[5] > 800, "uneven: %d %d %d", seen[1], seen[3],
          seen[5]);
    float inf[6] = {0.0f, 1.0f, INFINITY, 3.0f, INFINITY, NAN};
    CHECK(sampler_sample(s, inf) == 2, "+inf lowest id");
    float dead[6] = {NAN, NAN, -INFINITY, NAN, -INFINITY, NAN};
    CHECK(sampler_sample(s, dead) == ERR_RANGE, "nothing samplable");
    /* tiny temperature: finite, behaves as greedy */
    p.temperature = 1e-30f;
    sampler_reset(s, &p);
    float g[6] = {0.0f, 1.0f, 0.5f, 0.999999f, 0.0f, -1.0f};
    for (int d = 0; d < 100; d++)
        CHECK(sampler_sample(s, g) == 1, "T=1e-30");
    sampler_free(s);
}

/* ---- token masks (constrained decoding) ---- */

/* mask[(V + 31) / 32] allowing exactly the ids with allow[id] != 0; the bits past the
 * vocabulary are set to `pad` (they must not matter). */
static void make_mask(uint32_t *mask, const unsigned char *allow, int V, bool pad)
{
    int words = (V + 31) / 32;
    for (int w = 0; w < words; w++)
        mask[w] = 0;
    for (int i = 0; i < words * 32; i++) {
        bool on = i < V ? allow[i] != 0 : pad;
        if (on)
            mask[i / 32] |= 1u << (i % 32);
    }
}

static bool mask_allows(const uint32_t *mask, int32_t id)
{
    return (mask[id / 32] >> (id % 32)) & 1u;
}

/* Greedy and sampled draws never pick a banned token, with bias and penalties that favour
 * the banned ones; the allowed ones keep their relative probabilities (chi-square against
 * the reference distribution over the allowed tokens); the logits come back bit-identical. */
static void test_mask_bans(void)
{
    enum { V = 40 };
    float l[V];
    random_logits(l, V, 1.0f, 4711);
    l[3] = NAN;
    l[9] = INFINITY; /* banned below: a banned +inf must not win */
    l[11] = -INFINITY;
    unsigned char allow[V];
    for (int i = 0; i < V; i++)
        allow[i] = i % 3 != 0 && i != 9;
    uint32_t mask[(V + 31) / 32];
    make_mask(mask, allow, V, false);
    float orig[V];
    memcpy(orig, l, sizeof l);

    /* greedy: the banned +inf and the banned largest logits lose */
    struct sampler_params p = params(0.0f, 0, 1.0f, 0.0f, 1);
    struct sampler *s = sampler_create(&p, V);
    float best = -INFINITY;
    int32_t want = -1;
    for (int i = 0; i < V; i++)
        if (allow[i] && l[i] > best) {
            best = l[i];
            want = i;
        }
    CHECK(sampler_sample_masked(s, l, mask) == want, "greedy under the mask: want %d", want);
    CHECK(sampler_sample(s, l) == 9, "unmasked greedy picks the +inf");
    CHECK(memcmp(l, orig, sizeof l) == 0, "greedy: logits not restored");

    /* bias +50 on banned ids and a presence penalty of -2 on a banned one (the mask comes
     * before the penalties, so raising it does not unban it) */
    p = params(1.0f, 0, 1.0f, 0.0f, 77);
    p.presence_penalty = -2.0f;
    p.repetition_penalty = 0.5f;
    sampler_reset(s, &p);
    int32_t bid[3] = {0, 6, 12};
    float bv[3] = {50.0f, 50.0f, 3.0f};
    CHECK(sampler_set_logit_bias(s, bid, bv, 3) == 0, "bias");
    int32_t hist[4] = {12, 12, 5, 30};
    for (int i = 0; i < 4; i++)
        sampler_accept(s, hist[i]);
    /* the reference distribution: processed logits (bias, penalties), banned ones -inf */
    float proc[V];
    memcpy(proc, l, sizeof l);
    sampler_process_logits(s, proc);
    for (int i = 0; i < V; i++)
        if (!allow[i])
            proc[i] = -INFINITY;
    double prob[V];
    int support = ref_dist(proc, V, &p, prob);
    CHECK(support > 10, "support %d", support);
    enum { DRAWS = 20000 };
    long counts[V] = {0};
    long banned = 0;
    for (int d = 0; d < DRAWS; d++) {
        int32_t t = sampler_sample_masked(s, l, mask);
        if (t < 0 || t >= V || !allow[t]) {
            banned++;
        } else {
            counts[t]++;
        }
        /* keep the history fixed: the step alone advances */
        sampler_set_step(s, sampler_step(s) + 1);
    }
    CHECK(banned == 0, "%ld draws banned or failed", banned);
    CHECK(memcmp(l, orig, sizeof l) == 0, "sampled: logits not restored");
    int df;
    double stat = chi2_stat(counts, prob, V, DRAWS, &df);
    CHECK(stat < chi2_crit(df), "chi2 %g >= %g (df %d)", stat, chi2_crit(df), df);
    /* power: the same draws against the distribution without the mask's renormalisation
     * of one token (a third of its mass moved to the next allowed token) */
    double wrong[V];
    memcpy(wrong, prob, sizeof prob);
    int hi = 0;
    for (int i = 0; i < V; i++)
        hi = prob[i] > prob[hi] ? i : hi;
    int nx = hi + 1;
    while (nx < V && prob[nx] == 0.0)
        nx++;
    if (nx == V)
        for (nx = 0; prob[nx] == 0.0 || nx == hi; nx++) {}
    wrong[nx] += prob[hi] / 3.0;
    wrong[hi] -= prob[hi] / 3.0;
    CHECK(chi2_stat(counts, wrong, V, DRAWS, &df) > chi2_crit(df), "a wrong distribution is not rejected");
    sampler_free(s);
}

/* The mask is exactly a -inf logit applied after the bias and before the penalties: for
 * random rows, parameters, histories, biases and masks (dense, sparse, one token, bits
 * past the vocabulary either way), sampler_sample_masked picks the token sampler_sample
 * picks on the row with the banned logits replaced by -inf, and sampler_probs_masked
 * gives the same support and probabilities. */
static void test_mask_equals_ban(void)
{
    static const int vocabs[3] = {37, 1000, 4099};
    uint64_t rng = 99;
    int compared = 0, errors = 0;
    for (int vi = 0; vi < 3; vi++) {
        const int V = vocabs[vi], W = (V + 31) / 32;
        float *l = malloc((size_t)V * sizeof *l), *banned = malloc((size_t)V * sizeof *l);
        float *orig = malloc((size_t)V * sizeof *l), *p1 = malloc((size_t)V * sizeof *l),
              *p2 = malloc((size_t)V * sizeof *l);
        int32_t *i1 = malloc((size_t)V * sizeof *i1), *i2 = malloc((size_t)V * sizeof *i2);
        unsigned char *allow = malloc((size_t)V);
        uint32_t *mask = malloc((size_t)W * sizeof *mask);
        for (int trial = 0; trial < 60; trial++) {
            random_logits(l, V, 1.0f + (float)(trial % 5), test_rng(&rng));
            if (trial % 4 == 3) {
                l[test_rng(&rng) % (uint64_t)V] = NAN;
                l[test_rng(&rng) % (uint64_t)V] = INFINITY;
                l[test_rng(&rng) % (uint64_t)V] = -INFINITY;
            }
            int density = (int)(test_rng(&rng) % 4); /* 0: one token, 1: 2%, 2: 50%, 3: 95% */
            for (int i = 0; i < V; i++) {
                uint64_t u = test_rng(&rng) % 100;
                allow[i] = density == 1 ? u < 2 : density == 2 ? u < 50 : density == 3 ? u < 95 : 0;
            }
            if (density == 0)
                allow[test_rng(&rng) % (uint64_t)V] = 1;
            make_mask(mask, allow, V, trial % 2);
            struct sampler_params p = params(trial % 6 == 0 ? 0.0f : 0.3f + 0.1f * (float)(trial % 13),
                                             trial % 3 == 1 ? 1 + (int)(test_rng(&rng) % 60) : 0,
                                             trial % 4 == 2 ? 0.7f : 1.0f, trial % 5 == 4 ? 0.05f : 0.0f,
                                             test_rng(&rng));
            if (trial % 2) {
                p.repetition_penalty = 1.3f;
                p.presence_penalty = -1.5f; /* raises seen tokens, banned ones included */
                p.frequency_penalty = 0.4f;
            }
            struct sampler *s = sampler_create(&p, V), *r = sampler_create(&p, V);
            int32_t bid[8];
            float bv[8];
            for (int j = 0; j < 8; j++) {
                bid[j] = (int32_t)(test_rng(&rng) % (uint64_t)V);
                bv[j] = j == 7 ? -INFINITY : (float)(test_unif(&rng) * 20.0 - 5.0);
            }
            sampler_set_logit_bias(s, bid, bv, 8);
            sampler_set_logit_bias(r, bid, bv, 8);
            for (int j = 0; j < 30; j++) {
                int32_t t = (int32_t)(test_rng(&rng) % (uint64_t)V);
                sampler_accept(s, t);
                sampler_accept(r, t);
            }
            memcpy(orig, l, (size_t)V * sizeof *l);
            for (int i = 0; i < V; i++)
                banned[i] = allow[i] ? l[i] : -INFINITY;
            for (int d = 0; d < 5; d++) {
                int32_t got = sampler_sample_masked(s, l, mask);
                int32_t want = sampler_sample(r, banned);
                compared++;
                if (got != want && errors++ < 5)
                    fprintf(stderr, "    V=%d trial %d draw %d: masked %d, banned %d\n", V, trial, d, got,
                            want);
                if (got >= 0 && !mask_allows(mask, got) && errors++ < 5)
                    fprintf(stderr, "    V=%d trial %d: drew banned %d\n", V, trial, got);
                sampler_accept(s, got);
                sampler_accept(r, got);
            }
            CHECK(memcmp(l, orig, (size_t)V * sizeof *l) == 0, "V=%d trial %d: logits not restored", V, trial);
            int n1 = sampler_probs_masked(s, l, mask, i1, p1);
            int n2 = sampler_probs(r, banned, i2, p2);
            bool same = n1 == n2;
            for (int j = 0; same && j < n1; j++)
                same = i1[j] == i2[j] && p1[j] == p2[j];
            CHECK(same, "V=%d trial %d: probs differ (%d vs %d entries)", V, trial, n1, n2);
            for (int j = 0; j < n1; j++)
                CHECK(mask_allows(mask, i1[j]), "V=%d trial %d: support holds banned %d", V, trial, i1[j]);
            CHECK(memcmp(l, orig, (size_t)V * sizeof *l) == 0, "V=%d trial %d: probs: logits not restored", V,
                  trial);
            sampler_free(s);
            sampler_free(r);
        }
        free(l);
        free(banned);
        free(orig);
        free(p1);
        free(p2);
        free(i1);
        free(i2);
        free(allow);
        free(mask);
    }
    CHECK(errors == 0, "%d of %d draws differ", errors, compared);
}

/* Top-k, top-p and min-p apply to what the mask leaves: the k best *allowed* tokens. */
static void test_mask_filters(void)
{
    enum { V = 10 };
    /* logits descending with the id: 9 is the most likely */
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = 0.5f * (float)i;
    unsigned char allow[V] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
    uint32_t mask[1];
    make_mask(mask, allow, V, true);
    int32_t ids[V];
    float pr[V];
    struct sampler_params p = params(1.0f, 2, 1.0f, 0.0f, 5);
    struct sampler *s = sampler_create(&p, V);
    int n = sampler_probs_masked(s, l, mask, ids, pr);
    CHECK(n == 2, "top-2 under the mask: %d tokens", n);
    bool ok = n == 2 && ((ids[0] == 6 && ids[1] == 5) || (ids[0] == 5 && ids[1] == 6));
    CHECK(ok, "top-2 under the mask: the allowed 5 and 6");
    CHECK(sampler_probs(s, l, ids, pr) == 2 && (ids[0] == 9 || ids[0] == 8), "top-2 without the mask");
    /* top-p 0.5 over the allowed tokens 0..6: weights e^(0.5 (i - 6)); the nucleus is
     * {6, 5} (0.38 + 0.23 = 0.61 >= 0.5 of the mass, {6} alone 0.38 is not) */
    p = params(1.0f, 0, 0.5f, 0.0f, 5);
    sampler_reset(s, &p);
    n = sampler_probs_masked(s, l, mask, ids, pr);
    ok = n == 2 && ((ids[0] == 6 && ids[1] == 5) || (ids[0] == 5 && ids[1] == 6));
    CHECK(ok, "top-p under the mask: %d tokens", n);
    /* min-p 0.5 keeps weights >= half of the best allowed one: e^(-0.5) = 0.61, e^(-1) = 0.37 */
    p = params(1.0f, 0, 1.0f, 0.5f, 5);
    sampler_reset(s, &p);
    n = sampler_probs_masked(s, l, mask, ids, pr);
    ok = n == 2 && ((ids[0] == 6 && ids[1] == 5) || (ids[0] == 5 && ids[1] == 6));
    CHECK(ok, "min-p under the mask: %d tokens", n);
    /* a mask allowing everything (bits past the vocabulary clear) is no mask */
    uint32_t all[1] = {(1u << V) - 1u};
    p = params(0.9f, 0, 0.95f, 0.0f, 8);
    sampler_reset(s, &p);
    for (int d = 0; d < 50; d++) {
        int32_t a = sampler_sample_masked(s, l, all), b = sampler_sample(s, l);
        CHECK(a == b, "all-allowing mask changed draw %d: %d vs %d", d, a, b);
        sampler_accept(s, a);
    }
    sampler_free(s);
}

/* Nothing allowed is samplable → ERR_RANGE, greedy or not, logits restored. */
static void test_mask_nothing_allowed(void)
{
    enum { V = 70 };
    float l[V], orig[V];
    random_logits(l, V, 2.0f, 5);
    l[64] = NAN;
    l[65] = -INFINITY;
    memcpy(orig, l, sizeof l);
    unsigned char allow[V] = {0};
    uint32_t mask[3];
    int32_t ids[V];
    float pr[V];
    for (int greedy = 0; greedy < 2; greedy++) {
        struct sampler_params p = params(greedy ? 0.0f : 1.0f, 0, 1.0f, 0.0f, 3);
        struct sampler *s = sampler_create(&p, V);
        memset(allow, 0, sizeof allow);
        make_mask(mask, allow, V, true); /* only the bits past the vocabulary set */
        CHECK(sampler_sample_masked(s, l, mask) == ERR_RANGE, "all banned (greedy %d)", greedy);
        CHECK(sampler_probs_masked(s, l, mask, ids, pr) == ERR_RANGE, "probs, all banned (greedy %d)", greedy);
        allow[64] = allow[65] = 1; /* only a NaN and a -inf allowed */
        make_mask(mask, allow, V, false);
        CHECK(sampler_sample_masked(s, l, mask) == ERR_RANGE, "only non-finite allowed (greedy %d)", greedy);
        allow[10] = 1; /* one finite token allowed, but the bias bans it */
        make_mask(mask, allow, V, false);
        CHECK(sampler_sample_masked(s, l, mask) == 10, "the one allowed token (greedy %d)", greedy);
        int32_t ten = 10;
        float ninf = -INFINITY;
        sampler_set_logit_bias(s, &ten, &ninf, 1);
        CHECK(sampler_sample_masked(s, l, mask) == ERR_RANGE, "allowed but banned by the bias (greedy %d)",
              greedy);
        CHECK(sampler_sample_masked(NULL, l, mask) == ERR_INVALID, "NULL sampler");
        CHECK(memcmp(l, orig, sizeof l) == 0, "logits not restored (greedy %d)", greedy);
        sampler_free(s);
    }
}

/* row_scan (the vectorized scans behind sampler_logprobs) against plain references:
 * rows of several lengths (not multiples of 16), with NaN, -inf, +-large values and ties;
 * the maximum, the top-n and the counts exactly, the sum of exp within 1e-6 relative. */
static int cmp_top(const void *a, const void *b)
{
    const struct row_top *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

static void test_row_scan(void)
{
    static float x[1003];
    static struct row_top all[1003];
    const int lens[] = { 1, 15, 16, 17, 100, 1003 };
    uint64_t st = 12345;
    for (int li = 0; li < 6; li++)
        for (int trial = 0; trial < 20; trial++) {
            int n = lens[li], nall = 0;
            float mx = -INFINITY;
            for (int i = 0; i < n; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                unsigned r = (unsigned)(st >> 33);
                x[i] = r % 13 == 0 ? NAN : r % 11 == 0 ? -INFINITY : (float)(r % (trial % 2 ? 7 : 4000)) * 0.01f - 20.0f;
                if (x[i] > -INFINITY) {
                    all[nall++] = (struct row_top){ i, x[i] };
                    mx = x[i] > mx ? x[i] : mx;
                }
            }
            CHECK(row_max(x, n) == mx || (isinf(mx) && isinf(row_max(x, n))), "n %d: max %g vs %g", n,
                  (double)row_max(x, n), (double)mx);
            if (nall == 0) continue;
            double want = 0;
            for (int i = 0; i < nall; i++) want += exp((double)all[i].v - (double)mx);
            double got = row_sum_exp(x, n, mx);
            CHECK(fabs(got - want) <= 1e-6 * want, "n %d trial %d: sum %.9g vs %.9g", n, trial, got, want);
            qsort(all, (size_t)nall, sizeof *all, cmp_top);
            for (int k = 0; k <= 20; k += 5) {
                struct row_top top[20];
                int m = row_top_n(x, n, k, top), want_m = k < nall ? k : nall;
                bool same = m == want_m;
                for (int j = 0; same && j < m; j++) same = top[j].id == all[j].id && top[j].v == all[j].v;
                CHECK(same, "n %d trial %d k %d: top-n differ (m %d, want %d)", n, trial, k, m, want_m);
            }
        }
}

/* row_count_ge against a plain loop: rows of lengths around multiples of 16 with NaN,
 * +-inf, +-0.0, subnormals and many ties; v = each entry of the row (ties with itself and
 * others), NaN, +-inf, +-0.0 and a subnormal. Plus hand-counted cases. */
static int count_ge_ref(const float *x, int n, float v)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        if (x[i] >= v) c++;
    return c;
}

static void test_row_count_ge(void)
{
    static float x[1003];
    const float special[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, -1e-45f, 1.0f };
    const int lens[] = { 0, 1, 15, 16, 17, 31, 32, 33, 100, 1003 };
    uint64_t st = 777;
    int bad = 0;
    for (int li = 0; li < 10; li++)
        for (int trial = 0; trial < 8; trial++) {
            const int n = lens[li];
            for (int i = 0; i < n; i++) {
                unsigned r = (unsigned)(test_rng(&st) >> 33);
                x[i] = r % 7 == 0 ? special[r / 7 % 8] : (float)((int)(r % (trial % 2 ? 5 : 3000)) - 2) * 0.5f;
            }
            for (int j = 0; j < n + 8; j++) {
                const float v = j < n ? x[j] : special[j - n];
                const int got = row_count_ge(x, n, v), want = count_ge_ref(x, n, v);
                if (got != want && bad++ < 5)
                    CHECK(0, "n %d trial %d v %g: %d, want %d", n, trial, (double)v, got, want);
            }
        }
    CHECK(bad == 0, "%d counts differ", bad);
    /* by hand: 17 entries (one past a vector of 16) */
    float y[17];
    for (int i = 0; i < 17; i++) y[i] = 2.0f;
    y[0] = NAN;
    y[5] = -INFINITY;
    y[16] = 3.0f;
    y[15] = -0.0f;
    CHECK(row_count_ge(y, 17, 2.0f) == 14, "ties: %d", row_count_ge(y, 17, 2.0f));
    CHECK(row_count_ge(y, 17, 3.0f) == 1, "max in the tail: %d", row_count_ge(y, 17, 3.0f));
    CHECK(row_count_ge(y, 17, -INFINITY) == 16, "-inf counts every non-NaN: %d", row_count_ge(y, 17, -INFINITY));
    CHECK(row_count_ge(y, 17, NAN) == 0, "NaN counts nothing: %d", row_count_ge(y, 17, NAN));
    CHECK(row_count_ge(y, 17, 0.0f) == 15, "+0 counts -0: %d", row_count_ge(y, 17, 0.0f));
    CHECK(row_count_ge(y, 17, INFINITY) == 0, "+inf: %d", row_count_ge(y, 17, INFINITY));
}

int main(void)
{
    RUN(test_params_validate);
    RUN(test_greedy_argmax_ties);
    RUN(test_greedy_equivalents);
    RUN(test_temperature_distribution);
    RUN(test_top_k_support);
    RUN(test_top_p_support);
    RUN(test_min_p_support);
    RUN(test_random_exact);
    RUN(test_penalties_exact);
    RUN(test_logit_bias);
    RUN(test_seed_and_reset);
    RUN(test_golden_sequence);
    RUN(test_step_keys_draw);
    RUN(test_ahead_prior);
    RUN(test_export);
    RUN(test_against_spec);
    RUN(test_cost);
    RUN(test_large_vocab);
    RUN(test_logprobs);
    RUN(test_nonfinite_logits);
    RUN(test_mask_bans);
    RUN(test_mask_equals_ban);
    RUN(test_mask_filters);
    RUN(test_mask_nothing_allowed);
    RUN(test_row_scan);
    RUN(test_row_count_ge);
    return test_summary();
}
