/* test_kernel_sampling.cu — kernels/sampling.cu against the CPU sampler.
 *
 * The twin is the CPU backend's own sampler: per row, a struct sampler given the same
 * parameters, history (prompt flags and output counts from the penalty CSR), logit bias
 * and step, then sampler_sample_masked on the raw row with the row's token mask and
 * sampler_logprobs (cpu_sampling below, with the launcher's arguments). The rule is computed with exact integer weights on both
 * sides, so the check is exact: the same token for every row (zero mismatches), the same
 * status, the same top-N logprob ids, the same rank (0 on every row but a scored one);
 * logprob values within float rounding of the CPU's double log-sum-exp.
 *
 * Rows: vocabularies 257, 1000, 1001 (odd stride: scalar loads), 6007, 9001, 49,152 and
 * 151,936; logits normal, peaked, flat (uniform: the candidate paths give way to the exact
 * fallback), all equal (ties everywhere), quantised (many ties), with NaN / -inf / +inf
 * entries, and all -inf/NaN (error); greedy, temperature only, top-k 1 / 5 / 50 / large,
 * top-p 0.1 / 0.9, min-p, their combinations; repetition / presence / frequency penalties
 * over random histories; logit bias with repeated ids and -inf bans; token masks (dense,
 * half, sparse, one token, banning the argmax or a +inf, allowing only non-finite logits
 * or nothing, shared by rows, on modified tokens, through every path); logprobs 0 / 5 / 20;
 * steps up to 2^50; every fast path and every fallback of the kernel; invalid parameters
 * and malformed CSR data per row; scoring rows (prompt logprobs: the given token's raw
 * logprobs, everything else ignored; out-of-range targets; the rank with ties, NaN, +-inf,
 * signed zeros and subnormals at and around the target). Plus: Philox on the device against the known-answer
 * vectors (and cuRAND on a GPU), batch independence, and a chi-square test of many GPU
 * draws against the exact distribution. Outputs are poisoned before every call and every
 * buffer's guards checked after it. ~10 s under the emulator (2 cores, -O2).
 */
#include "kernels/common.cuh"
#include "ktest.h"

extern "C" {
#include "sampler/row_scan.h"
#include "sampler/sampler.h"
#include "util/err.h"
}
#include "kernels/sampling.h"
#include "sampler/exact.h"
#include "sampler/philox.h"

#ifndef TESSERA_EMU
#include <curand_kernel.h>
#endif

#include <algorithm>
#include <string>

/* ---- the twin ---------------------------------------------------------------------------- */

/* A scoring row's twin: sampler_logprobs of score_token over the raw row and its rank as
 * the CPU backend counts it (row_count_ge of the raw logit), nothing else read
 * (sampling_params' comment). */
static void cpu_score_row(const float *row, int vocab, const sampling_params &P, sampling_output &o)
{
    if (P.n_logprobs < -1 || P.n_logprobs > SAMPLING_MAX_TOP_LOGPROBS) {
        o.status = SAMPLING_ERR_PARAMS;
        return;
    }
    if (P.score_token < 0 || P.score_token >= vocab) {
        o.status = SAMPLING_ERR_TARGET;
        return;
    }
    o.status = SAMPLING_OK;
    o.token = P.score_token;
    int n = sampler_logprobs(row, vocab, P.score_token, std::max(P.n_logprobs, 0), o.top_ids, o.top_logprobs,
                             &o.logprob);
    o.n_top = n > 0 ? n : 0;
    o.rank = row_count_ge(row, vocab, row[P.score_token]);
}

/* cuda_sampling's CPU twin, same arguments (host pointers): one struct sampler per row. */
static void cpu_sampling(const float *logits, int64_t row_stride, int num_rows, int vocab,
                         const sampling_params *params, const int32_t *pen_start, const int32_t *pen_ids,
                         const uint32_t *pen_info, const int32_t *bias_start, const int32_t *bias_ids,
                         const float *bias_vals, const int32_t *mask_row, const uint32_t *masks,
                         sampling_output *out)
{
    std::vector<float> row(vocab);
    const int64_t mask_words = (vocab + 31) / 32;
    for (int r = 0; r < num_rows; r++) {
        const sampling_params &P = params[r];
        sampling_output &o = out[r];
        o.token = -1;
        o.logprob = -INFINITY;
        o.n_top = 0;
        o.rank = 0; /* sampled and failed rows */
        for (int j = 0; j < SAMPLING_MAX_TOP_LOGPROBS; j++) {
            o.top_ids[j] = -1;
            o.top_logprobs[j] = -INFINITY;
        }
        if (P.score) {
            cpu_score_row(logits + (int64_t)r * row_stride, vocab, P, o);
            continue;
        }
        struct sampler_params sp;
        sampler_params_default(&sp);
        sp.temperature = P.temperature;
        sp.top_k = P.top_k;
        sp.top_p = P.top_p;
        sp.min_p = P.min_p;
        sp.repetition_penalty = P.repetition_penalty;
        sp.presence_penalty = P.presence_penalty;
        sp.frequency_penalty = P.frequency_penalty;
        sp.seed = P.seed;
        struct sampler *s = sampler_create(&sp, vocab);
        if (!s || P.n_logprobs < -1 || P.n_logprobs > SAMPLING_MAX_TOP_LOGPROBS) {
            o.status = SAMPLING_ERR_PARAMS;
            sampler_free(s);
            continue;
        }
        o.status = SAMPLING_OK;
        if (pen_start)
            for (int j = pen_start[r]; j < pen_start[r + 1]; j++) {
                int32_t id = pen_ids[j];
                if (id < 0 || id >= vocab) o.status = SAMPLING_ERR_INPUT;
                if (pen_info[j] & SMP_PROMPT_FLAG) sampler_accept_prompt(s, &id, 1);
                for (uint32_t n = 0; n < (pen_info[j] & SMP_COUNT_MASK); n++) sampler_accept(s, id);
            }
        if (bias_start && sampler_set_logit_bias(s, bias_ids + bias_start[r], bias_vals + bias_start[r],
                                                 bias_start[r + 1] - bias_start[r]) != 0)
            o.status = SAMPLING_ERR_INPUT;
        if (o.status == SAMPLING_OK) {
            sampler_set_step(s, P.step);
            memcpy(row.data(), logits + (int64_t)r * row_stride, (size_t)vocab * sizeof(float));
            const uint32_t *mask = mask_row && mask_row[r] >= 0 ? masks + mask_row[r] * mask_words : NULL;
            int32_t t = sampler_sample_masked(s, row.data(), mask);
            if (t < 0) {
                o.status = SAMPLING_ERR_NO_TOKEN;
            } else {
                o.token = t;
                if (P.n_logprobs >= 0) {
                    int n = sampler_logprobs(row.data(), vocab, t, P.n_logprobs, o.top_ids, o.top_logprobs,
                                             &o.logprob);
                    o.n_top = n > 0 ? n : 0;
                }
            }
        }
        sampler_free(s);
    }
}

/* ---- batches ----------------------------------------------------------------------------- */

struct batch {
    int V = 0;
    int64_t stride = 0;
    std::vector<float> logits;
    std::vector<sampling_params> params;
    std::vector<int32_t> pen_start{ 0 }, pen_ids;
    std::vector<uint32_t> pen_info;
    std::vector<int32_t> bias_start{ 0 }, bias_ids;
    std::vector<float> bias_vals;
    std::vector<int32_t> mask_row;  /* [rows] index into masks, -1: none */
    std::vector<uint32_t> masks;    /* [n][(V + 31) / 32] */
    std::vector<std::string> what;
    int rows() const { return (int)params.size(); }
    int mask_words() const { return (V + 31) / 32; }
    bool any_mask() const
    {
        for (int32_t m : mask_row)
            if (m >= 0) return true;
        return false;
    }
};

static sampling_params make_params(float t, int k, float top_p, float min_p, int n_lp, uint64_t seed, uint64_t step)
{
    sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = 1.0f;
    p.n_logprobs = n_lp;
    p.seed = seed;
    p.step = step;
    return p;
}

enum kind { K_NORMAL, K_PEAKED, K_FLAT, K_EQUAL, K_QUANT, K_WILD, K_DEAD, K_COUNT };
static const char *const KIND_NAME[K_COUNT] = { "normal", "peaked", "flat", "equal", "quantised", "wild", "dead" };

static void gen_row(ktest_rng &rng, float *l, int V, kind k)
{
    switch (k) {
    case K_NORMAL:
        rng.fill_normal(l, V, 3.0f);
        break;
    case K_PEAKED:
        rng.fill_normal(l, V, 2.0f);
        for (int i = 0; i < 6; i++) l[rng.below(V)] = 9.0f + 3.0f * rng.uniform();
        break;
    case K_FLAT:
        rng.fill_uniform(l, V, -1.0f, 1.0f);
        break;
    case K_EQUAL:
        for (int i = 0; i < V; i++) l[i] = 1.5f;
        break;
    case K_QUANT:
        for (int i = 0; i < V; i++) l[i] = 0.25f * (float)(int)(8.0f * rng.normal());
        break;
    case K_WILD:
        rng.fill_normal(l, V, 4.0f);
        for (int i = 0; i < V / 20 + 1; i++) l[rng.below(V)] = rng.below(2) ? -INFINITY : NAN;
        if (rng.below(3) == 0) l[rng.below(V)] = INFINITY;
        break;
    default:
        for (int i = 0; i < V; i++) l[i] = i % 3 ? -INFINITY : NAN;
        break;
    }
}

/* Appends a row: logits of `kind`, parameters p, a random history of n_hist tokens (a third
 * in the prompt) and n_bias bias entries (repeated ids, some -inf), merged through a CPU
 * sampler the way the backend builds its CSR. */
static void add_row(batch &b, ktest_rng &rng, kind k, sampling_params p, int n_hist, int n_bias)
{
    const int V = b.V;
    size_t off = b.logits.size();
    b.logits.resize(off + (size_t)b.stride, -7.0f); /* padding columns must be ignored */
    gen_row(rng, b.logits.data() + off, V, k);
    struct sampler_params sp;
    sampler_params_default(&sp);
    struct sampler *s = sampler_create(&sp, V);
    uint64_t gen = 0;
    for (int i = 0; i < n_hist; i++) {
        int32_t t = rng.below(i % 2 ? V : std::min(V, 64)); /* repeats likely */
        if (i % 3 == 0) sampler_accept_prompt(s, &t, 1);
        else {
            sampler_accept(s, t);
            gen++;
        }
    }
    int nh = sampler_history_len(s);
    std::vector<int32_t> ids(nh);
    std::vector<uint32_t> info(nh);
    sampler_history(s, ids.data(), info.data());
    /* the kernel must not depend on the order of the CSR entries */
    for (int i = nh - 1; i > 0; i--) {
        int j = rng.below(i + 1);
        std::swap(ids[i], ids[j]);
        std::swap(info[i], info[j]);
    }
    b.pen_ids.insert(b.pen_ids.end(), ids.begin(), ids.end());
    b.pen_info.insert(b.pen_info.end(), info.begin(), info.end());
    b.pen_start.push_back((int32_t)b.pen_ids.size());
    std::vector<int32_t> bid(n_bias);
    std::vector<float> bv(n_bias);
    for (int i = 0; i < n_bias; i++) {
        bid[i] = i > 0 && i % 4 == 0 ? bid[i - 1] : rng.below(V);
        bv[i] = i % 5 == 4 ? -INFINITY : rng.uniform(-6.0f, 6.0f);
    }
    CHECK(sampler_set_logit_bias(s, bid.data(), bv.data(), n_bias) == 0, "bias rejected");
    int32_t mid[SAMPLER_MAX_LOGIT_BIAS];
    float mv[SAMPLER_MAX_LOGIT_BIAS];
    int nb = sampler_logit_bias(s, mid, mv);
    b.bias_ids.insert(b.bias_ids.end(), mid, mid + nb);
    b.bias_vals.insert(b.bias_vals.end(), mv, mv + nb);
    b.bias_start.push_back((int32_t)b.bias_ids.size());
    sampler_free(s);
    if (p.step < gen) p.step = gen; /* the step counts the generated tokens at least */
    b.params.push_back(p);
    b.mask_row.push_back(-1);
    char w[192];
    snprintf(w, sizeof w, "V=%d %s T=%g k=%d p=%g min_p=%g rep=%g pres=%g freq=%g lp=%d hist=%d bias=%d step=%llu",
             V, KIND_NAME[k], (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p,
             (double)p.repetition_penalty, (double)p.presence_penalty, (double)p.frequency_penalty, p.n_logprobs,
             nh, nb, (unsigned long long)p.step);
    b.what.push_back(w);
}

/* Logprob tolerance: the CPU sums exp() in double, the kernel in float per thread (at most
 * ~300 terms each, relative error < 300 * 2^-24 = 2e-5) combined in double; a logprob is
 * one float subtraction of ~|30|: an absolute error below 1e-4 covers both. */
static bool lp_close(float got, float ref)
{
    if (ref == -INFINITY || got == -INFINITY) return got == ref;
    return fabsf(got - ref) <= 1e-4f;
}

static int compare_rows(const batch &b, const std::vector<sampling_output> &got,
                        const std::vector<sampling_output> &ref, const char *tag)
{
    int bad = 0;
    for (int r = 0; r < b.rows(); r++) {
        const sampling_output &g = got[r], &e = ref[r];
        bool ok = g.status == e.status && g.token == e.token && lp_close(g.logprob, e.logprob) && g.n_top == e.n_top &&
                  g.rank == e.rank;
        for (int j = 0; ok && j < SAMPLING_MAX_TOP_LOGPROBS; j++)
            ok = g.top_ids[j] == e.top_ids[j] && lp_close(g.top_logprobs[j], e.top_logprobs[j]);
        if (!ok && bad++ < 4) {
            fprintf(stderr, "    %s row %d (%s): gpu status %d token %d lp %.7g n_top %d rank %d | cpu status %d "
                    "token %d lp %.7g n_top %d rank %d\n", tag, r, b.what[r].c_str(), g.status, g.token,
                    (double)g.logprob, g.n_top, g.rank, e.status, e.token, (double)e.logprob, e.n_top, e.rank);
            for (int j = 0; j < std::max(g.n_top, e.n_top) && j < SAMPLING_MAX_TOP_LOGPROBS; j++)
                if (g.top_ids[j] != e.top_ids[j] || !lp_close(g.top_logprobs[j], e.top_logprobs[j]))
                    fprintf(stderr, "      top[%d]: gpu %d %.7g cpu %d %.7g\n", j, g.top_ids[j],
                            (double)g.top_logprobs[j], e.top_ids[j], (double)e.top_logprobs[j]);
        }
    }
    return bad;
}

/* Runs the batch on the device under every fiber-order seed and compares with the twin. */
static void check_batch(const batch &b, const char *tag)
{
    const int n = b.rows();
    std::vector<sampling_output> ref(n);
    const bool masked = b.any_mask();
    cpu_sampling(b.logits.data(), b.stride, n, b.V, b.params.data(), b.pen_start.data(), b.pen_ids.data(),
                 b.pen_info.data(), b.bias_start.data(), b.bias_ids.data(), b.bias_vals.data(),
                 masked ? b.mask_row.data() : NULL, b.masks.data(), ref.data());
    kbuf<int32_t> d_mr(n);
    kbuf<uint32_t> d_masks(b.masks.size() + 1);
    if (masked) {
        d_mr.upload(b.mask_row);
        KCHECK_CUDA(cudaMemcpy(d_masks.ptr, b.masks.data(), b.masks.size() * 4, cudaMemcpyHostToDevice));
    }
    kbuf<float> d_logits(b.logits.size());
    kbuf<sampling_params> d_params(n);
    kbuf<int32_t> d_ps(n + 1), d_pi(b.pen_ids.size() + 1), d_bs(n + 1), d_bi(b.bias_ids.size() + 1);
    kbuf<uint32_t> d_pn(b.pen_info.size() + 1);
    kbuf<float> d_bv(b.bias_vals.size() + 1);
    kbuf<sampling_output> d_out(n);
    d_logits.upload(b.logits);
    d_params.upload(b.params);
    d_ps.upload(b.pen_start);
    d_bs.upload(b.bias_start);
    if (!b.pen_ids.empty()) {
        KCHECK_CUDA(cudaMemcpy(d_pi.ptr, b.pen_ids.data(), b.pen_ids.size() * 4, cudaMemcpyHostToDevice));
        KCHECK_CUDA(cudaMemcpy(d_pn.ptr, b.pen_info.data(), b.pen_info.size() * 4, cudaMemcpyHostToDevice));
    }
    if (!b.bias_ids.empty()) {
        KCHECK_CUDA(cudaMemcpy(d_bi.ptr, b.bias_ids.data(), b.bias_ids.size() * 4, cudaMemcpyHostToDevice));
        KCHECK_CUDA(cudaMemcpy(d_bv.ptr, b.bias_vals.data(), b.bias_vals.size() * 4, cudaMemcpyHostToDevice));
    }
    KTEST_SEEDS(s) {
        d_out.poison();
        int rc = cuda_sampling(d_logits.ptr, b.stride, n, b.V, d_params.ptr, d_ps.ptr, d_pi.ptr, d_pn.ptr, d_bs.ptr,
                               d_bi.ptr, d_bv.ptr, masked ? d_mr.ptr : NULL, d_masks.ptr, d_out.ptr, 0);
        CHECK(rc == 0, "%s: cuda_sampling returned %d", tag, rc);
        KCHECK_CUDA(cudaDeviceSynchronize());
        std::vector<sampling_output> got = d_out.download();
        int bad = compare_rows(b, got, ref, tag);
        CHECK(bad == 0, "%s: %d of %d rows differ from the CPU sampler", tag, bad, n);
    }
    CHECK_GUARD(d_logits);
    CHECK_GUARD(d_params);
    CHECK_GUARD(d_ps);
    CHECK_GUARD(d_pi);
    CHECK_GUARD(d_pn);
    CHECK_GUARD(d_bs);
    CHECK_GUARD(d_bi);
    CHECK_GUARD(d_bv);
    CHECK_GUARD(d_mr);
    CHECK_GUARD(d_masks);
    CHECK_GUARD(d_out);
}

/* ---- cases ------------------------------------------------------------------------------- */

struct cfg {
    float t;
    int k;
    float top_p, min_p;
};

/* Every parameter family on a small vocabulary, all logit kinds, penalties and bias. */
static void test_small_vocab(void)
{
    static const cfg cfgs[] = {
        { 0.0f, 0, 1.0f, 0.0f },  { 1.0f, 0, 1.0f, 0.0f },   { 0.7f, 1, 1.0f, 0.0f },  { 0.8f, 5, 1.0f, 0.0f },
        { 1.2f, 50, 1.0f, 0.0f }, { 1.0f, 0, 0.1f, 0.0f },   { 1.0f, 0, 0.9f, 0.0f },  { 0.9f, 0, 1.0f, 0.05f },
        { 0.6f, 40, 0.9f, 0.02f }, { 2.0f, 700, 0.95f, 0.0f }, { 1e-3f, 0, 1.0f, 0.0f }, { 0.5f, 5, 0.5f, 0.3f },
    };
    uint64_t seed = 1;
    for (int V : { 1000, 1001 }) {
        batch b;
        b.V = V;
        b.stride = V == 1000 ? 1000 : 1003; /* 1003: rows unaligned (scalar loads) */
        ktest_rng rng(77 + V);
        int i = 0;
        for (const cfg &c : cfgs)
            for (int k = 0; k < K_COUNT; k++, i++) {
                if (k == K_DEAD && i % 3) continue;
                sampling_params p = make_params(c.t, c.k, c.top_p, c.min_p, (int)(i % 4 == 0 ? -1 : i % 21),
                                                seed++, (uint64_t)rng.below(1000) << (i % 41));
                int n_hist = 0, n_bias = 0;
                if (i % 3 == 1) {
                    p.repetition_penalty = rng.uniform(0.7f, 1.6f);
                    p.presence_penalty = rng.uniform(-1.0f, 1.0f);
                    p.frequency_penalty = rng.uniform(-1.0f, 1.0f);
                    n_hist = 1 + rng.below(120);
                }
                if (i % 4 == 2) n_bias = 1 + rng.below(12);
                if (i % 7 == 5) n_hist = 30; /* a history with the penalties off */
                add_row(b, rng, (kind)k, p, n_hist, n_bias);
            }
        check_batch(b, V == 1000 ? "V=1000" : "V=1001 unaligned");
    }
}

/* Many cheap random rows: random parameters of every kind, as a fuzz against the twin. */
static void test_random_rows(void)
{
    batch b;
    b.V = 257;
    b.stride = 260;
    ktest_rng rng(4242);
    for (int i = 0; i < 160; i++) {
        sampling_params p = make_params(rng.below(6) == 0 ? 0.0f : rng.uniform(0.05f, 2.5f),
                                        rng.below(2) ? rng.below(300) : 0, rng.below(2) ? rng.uniform(0.02f, 1.0f) : 1.0f,
                                        rng.below(3) == 0 ? rng.uniform(0.0f, 0.5f) : 0.0f, rng.below(22) - 1,
                                        rng.next(), rng.next() >> rng.below(64));
        if (rng.below(3) == 0) {
            p.repetition_penalty = rng.uniform(0.5f, 2.0f);
            p.presence_penalty = rng.uniform(-2.0f, 2.0f);
            p.frequency_penalty = rng.uniform(-2.0f, 2.0f);
        }
        add_row(b, rng, (kind)rng.below(K_COUNT - 1), p, rng.below(40), rng.below(3) ? 0 : rng.below(20));
    }
    check_batch(b, "random V=257");
}

/* Qwen-sized and SmolLM-sized vocabularies: a few rows each (the emulator's budget). */
static void test_large_vocab(void)
{
    {
        batch b;
        b.V = 49152;
        b.stride = 49152;
        ktest_rng rng(9);
        add_row(b, rng, K_NORMAL, make_params(0.0f, 0, 1.0f, 0.0f, 20, 1, 0), 0, 0);
        add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 1.0f, 0.0f, 5, 2, 17), 200, 0);
        add_row(b, rng, K_PEAKED, make_params(0.7f, 50, 0.9f, 0.0f, 20, 3, 5), 0, 8);
        add_row(b, rng, K_NORMAL, make_params(0.8f, 0, 0.9f, 0.0f, 0, 4, 9), 0, 0);
        add_row(b, rng, K_FLAT, make_params(1.0f, 0, 0.9f, 0.0f, 20, 5, 3), 0, 0);    /* nucleus > candidates */
        add_row(b, rng, K_FLAT, make_params(1.0f, 3000, 1.0f, 0.0f, -1, 6, 1), 0, 0); /* candidates overflow */
        add_row(b, rng, K_NORMAL, make_params(1.0f, 6000, 0.8f, 0.0f, -1, 7, 2), 0, 0); /* k > cap / 2 */
        add_row(b, rng, K_EQUAL, make_params(1.0f, 5, 1.0f, 0.0f, 20, 8, 4), 0, 0);    /* ties everywhere */
        add_row(b, rng, K_QUANT, make_params(0.9f, 0, 0.95f, 0.1f, 7, 9, 8), 50, 6);
        add_row(b, rng, K_NORMAL, make_params(1.1f, 0, 1.0f, 0.05f, 3, 10, 6), 0, 0);
        check_batch(b, "V=49152");
    }
    {
        batch b;
        b.V = 151936;
        b.stride = 152064;
        ktest_rng rng(10);
        sampling_params p = make_params(0.7f, 20, 0.8f, 0.0f, 20, 11, 123456789);
        p.repetition_penalty = 1.1f;
        p.frequency_penalty = 0.3f;
        add_row(b, rng, K_PEAKED, p, 400, 30);
        add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 0.9f, 0.0f, 5, 12, 77), 0, 0);
        add_row(b, rng, K_NORMAL, make_params(0.0f, 0, 1.0f, 0.0f, -1, 13, 1), 0, 0);
        check_batch(b, "V=151936");
    }
}

/* Vocabularies around the candidate capacity, where the fast paths give way to the exact
 * fallback: a nucleus larger than the candidates, top-k beyond half the capacity, raw ties
 * beyond the raw candidates, and weights tied across the candidates' boundary. */
static void test_fallbacks(void)
{
    batch b;
    b.V = 6007;
    b.stride = 6009;
    ktest_rng rng(606);
    add_row(b, rng, K_FLAT, make_params(1.0f, 0, 0.9f, 0.0f, 5, 1, 10), 0, 0);      /* nucleus > candidates */
    add_row(b, rng, K_FLAT, make_params(0.8f, 4500, 0.5f, 0.0f, -1, 2, 11), 0, 0);  /* k > capacity / 2 */
    add_row(b, rng, K_NORMAL, make_params(1.3f, 4100, 1.0f, 0.01f, -1, 3, 12), 0, 0);
    add_row(b, rng, K_EQUAL, make_params(0.9f, 5, 1.0f, 0.0f, 20, 4, 13), 0, 0);    /* raw ties > raw capacity */
    add_row(b, rng, K_QUANT, make_params(0.0f, 0, 1.0f, 0.0f, 20, 5, 14), 0, 0);
    sampling_params p = make_params(1.0f, 0, 0.97f, 0.0f, 2, 6, 15);
    p.repetition_penalty = 1.3f;
    add_row(b, rng, K_FLAT, p, 300, 20);
    check_batch(b, "fallbacks V=6007");

    /* 8000 tokens within 0.3 logits of the max, the rest far below; T = 1e8 ties their
     * weights at 2^31, so a tiny top-p keeps all 8000 — more than the candidates hold */
    batch t;
    t.V = 9001;
    t.stride = 9001;
    t.params.push_back(make_params(1e8f, 0, 0.001f, 0.0f, 3, 7, 16));
    t.logits.resize(9001);
    for (int i = 0; i < 9001; i++) t.logits[i] = i < 8000 ? 5.0f - 0.3f * (float)((i * 7919) % 8000) / 8000.0f : -10.0f;
    t.pen_start.push_back(0);
    t.bias_start.push_back(0);
    t.what.push_back("V=9001 weight ties across the candidates' boundary");
    check_batch(t, "weight ties");
}

/* Per-row errors never fail the launch, and never disturb the other rows. */
static void test_row_errors(void)
{
    batch b;
    b.V = 300;
    b.stride = 300;
    ktest_rng rng(5);
    add_row(b, rng, K_DEAD, make_params(1.0f, 0, 1.0f, 0.0f, 3, 1, 0), 0, 0); /* nothing samplable */
    add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 1.0f, 0.0f, 3, 1, 0), 0, 0);
    /* every logit banned by the bias */
    add_row(b, rng, K_NORMAL, make_params(0.0f, 0, 1.0f, 0.0f, 3, 2, 0), 0, 0);
    b.bias_start.back() = b.bias_start[b.bias_start.size() - 2];
    b.bias_ids.resize(b.bias_start.back());
    b.bias_vals.resize(b.bias_start.back());
    for (int i = 0; i < 300; i++) {
        b.bias_ids.push_back(i);
        b.bias_vals.push_back(-INFINITY);
    }
    b.bias_start.back() = (int32_t)b.bias_ids.size();
    add_row(b, rng, K_NORMAL, make_params(-1.0f, 0, 1.0f, 0.0f, 3, 3, 0), 0, 0);  /* bad temperature */
    add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 0.0f, 0.0f, 3, 4, 0), 0, 0);   /* bad top_p */
    add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 1.0f, 0.0f, 21, 5, 0), 0, 0);  /* too many logprobs */
    add_row(b, rng, K_NORMAL, make_params(0.5f, 3, 1.0f, 0.0f, 2, 6, 0), 0, 0);
    check_batch(b, "row errors");

    /* malformed CSR data: a repeated penalty id, an id out of range, a NaN bias */
    for (int which = 0; which < 3; which++) {
        batch e;
        e.V = 300;
        e.stride = 300;
        ktest_rng r2(6);
        sampling_params p = make_params(1.0f, 0, 1.0f, 0.0f, 2, 7, 3);
        p.presence_penalty = 0.5f;
        add_row(e, r2, K_NORMAL, p, 10, 3);
        add_row(e, r2, K_NORMAL, p, 10, 3);
        /* row 0 is the malformed one; row 1 must come out as the twin says */
        std::vector<sampling_output> ref(2);
        cpu_sampling(e.logits.data(), 300, 2, 300, e.params.data(), e.pen_start.data(), e.pen_ids.data(),
                     e.pen_info.data(), e.bias_start.data(), e.bias_ids.data(), e.bias_vals.data(), NULL, NULL,
                     ref.data());
        if (which == 0) e.pen_ids[0] = e.pen_ids[1];
        if (which == 1) e.bias_ids[0] = 300;
        if (which == 2) e.bias_vals[0] = NAN;
        kbuf<float> d_l(e.logits.size());
        kbuf<sampling_params> d_p(2);
        kbuf<int32_t> d_ps(3), d_pi(e.pen_ids.size()), d_bs(3), d_bi(e.bias_ids.size());
        kbuf<uint32_t> d_pn(e.pen_info.size());
        kbuf<float> d_bv(e.bias_vals.size());
        kbuf<sampling_output> d_o(2);
        d_l.upload(e.logits);
        d_p.upload(e.params);
        d_ps.upload(e.pen_start);
        d_pi.upload(e.pen_ids);
        d_pn.upload(e.pen_info);
        d_bs.upload(e.bias_start);
        d_bi.upload(e.bias_ids);
        d_bv.upload(e.bias_vals);
        KTEST_SEEDS(s) {
            d_o.poison();
            int rc = cuda_sampling(d_l.ptr, 300, 2, 300, d_p.ptr, d_ps.ptr, d_pi.ptr, d_pn.ptr, d_bs.ptr, d_bi.ptr,
                                   d_bv.ptr, NULL, NULL, d_o.ptr, 0);
            CHECK(rc == 0, "malformed %d: launch %d", which, rc);
            std::vector<sampling_output> got = d_o.download();
            CHECK(got[0].status == SAMPLING_ERR_INPUT && got[0].token == -1 && got[0].n_top == 0,
                  "malformed %d: status %d token %d", which, got[0].status, got[0].token);
            CHECK(got[1].status == ref[1].status && got[1].token == ref[1].token,
                  "malformed %d: the good row: %d / %d, cpu %d / %d", which, got[1].status, got[1].token,
                  ref[1].status, ref[1].token);
        }
        CHECK_GUARD(d_l);
        CHECK_GUARD(d_pi);
        CHECK_GUARD(d_bv);
        CHECK_GUARD(d_o);
    }
}

/* ---- token masks ------------------------------------------------------------------------- */

enum mask_kind { M_DENSE, M_HALF, M_SPARSE, M_ONE, M_NO_ARGMAX, M_NONFINITE, M_NONE, M_COUNT };
static const char *const MASK_NAME[M_COUNT] = { "dense", "half", "sparse", "one", "no-argmax", "nonfinite-only",
                                                "none-allowed" };

/* Gives the last row a token mask of kind k (a new one, or with share the previous row's
 * when that has one). The bits past the vocabulary are random: they must not matter. */
static void mask_last_row(batch &b, ktest_rng &rng, mask_kind k, bool share = false)
{
    const int V = b.V, W = b.mask_words(), r = b.rows() - 1;
    if (share && r > 0 && b.mask_row[r - 1] >= 0) {
        b.mask_row[r] = b.mask_row[r - 1];
        b.what[r] += " mask=shared";
        return;
    }
    const float *l = b.logits.data() + (size_t)r * b.stride;
    const size_t off = b.masks.size();
    b.masks.resize(off + (size_t)W, 0u);
    uint32_t *m = b.masks.data() + off;
    for (int i = V; i < W * 32; i++)
        if (rng.below(2)) m[i >> 5] |= 1u << (i & 31);
    int best = -1; /* the raw argmax (a +inf included) */
    for (int i = 0; i < V; i++)
        if (l[i] > -INFINITY && (best < 0 || l[i] > l[best])) best = i;
    const int one = rng.below(V);
    for (int i = 0; i < V; i++) {
        bool on = false;
        switch (k) {
        case M_DENSE: on = rng.below(10) != 0; break;
        case M_HALF: on = rng.below(2) != 0; break;
        case M_SPARSE: on = rng.below(100) == 0 || i == one; break;
        case M_ONE: on = i == one; break;
        case M_NO_ARGMAX: on = i != best && rng.below(4) != 0; break;
        case M_NONFINITE: on = !(l[i] > -INFINITY && l[i] < INFINITY); break;
        default: on = false; break;
        }
        if (on) m[i >> 5] |= 1u << (i & 31);
    }
    b.mask_row[r] = (int32_t)(off / (size_t)W);
    b.what[r] += std::string(" mask=") + MASK_NAME[k];
}

/* Masked rows against the twin: every mask kind under every parameter family, on rows
 * with penalties and bias (banned modified tokens), unmasked rows between them, shared
 * masks; then the paths of a large row: the exact fallbacks, the direct draw, greedy. */
static void test_masks(void)
{
    static const cfg cfgs[] = {
        { 0.0f, 0, 1.0f, 0.0f },   { 1.0f, 0, 1.0f, 0.0f },  { 0.8f, 5, 1.0f, 0.0f },  { 1.2f, 50, 1.0f, 0.0f },
        { 1.0f, 0, 0.9f, 0.0f },   { 1.0f, 0, 0.1f, 0.0f },  { 0.9f, 0, 1.0f, 0.05f }, { 0.6f, 40, 0.9f, 0.02f },
        { 2.0f, 700, 0.95f, 0.0f },
    };
    uint64_t seed = 500;
    for (int V : { 257, 1001 }) {
        batch b;
        b.V = V;
        b.stride = V == 257 ? 260 : 1003;
        ktest_rng rng(1234 + V);
        int i = 0;
        for (const cfg &c : cfgs)
            for (int m = 0; m < M_COUNT; m++, i++) {
                sampling_params p = make_params(c.t, c.k, c.top_p, c.min_p, (int)(i % 4 == 0 ? -1 : i % 21), seed++,
                                                (uint64_t)rng.below(1000) << (i % 37));
                int n_hist = 0, n_bias = 0;
                if (i % 3 == 1) {
                    p.repetition_penalty = rng.uniform(0.7f, 1.6f);
                    p.presence_penalty = rng.uniform(-2.0f, 1.0f);
                    p.frequency_penalty = rng.uniform(-1.0f, 1.0f);
                    n_hist = 1 + rng.below(120);
                }
                if (i % 4 != 0) n_bias = 1 + rng.below(12);
                kind k = (kind)(i % (K_COUNT - 1)); /* the dead rows fail whatever the mask */
                add_row(b, rng, k, p, n_hist, n_bias);
                mask_last_row(b, rng, (mask_kind)m, i % 11 == 10);
                if (i % 5 == 0) /* an unmasked row between masked ones */
                    add_row(b, rng, k, make_params(c.t, c.k, c.top_p, c.min_p, 3, seed++, 9), 0, 2);
            }
        check_batch(b, V == 257 ? "masks V=257" : "masks V=1001 unaligned");
    }
    {
        batch b;
        b.V = 6007;
        b.stride = 6009;
        ktest_rng rng(6006);
        add_row(b, rng, K_FLAT, make_params(1.0f, 0, 0.9f, 0.0f, 5, 1, 10), 0, 0); /* nucleus > candidates */
        mask_last_row(b, rng, M_HALF);
        add_row(b, rng, K_FLAT, make_params(0.8f, 4500, 0.5f, 0.0f, -1, 2, 11), 0, 4); /* k > capacity / 2 */
        mask_last_row(b, rng, M_DENSE);
        add_row(b, rng, K_EQUAL, make_params(0.9f, 5, 1.0f, 0.0f, 20, 4, 13), 0, 0); /* ties, raw ties > capacity */
        mask_last_row(b, rng, M_SPARSE);
        add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 1.0f, 0.0f, 3, 5, 14), 40, 6); /* the direct draw */
        mask_last_row(b, rng, M_HALF);
        sampling_params p = make_params(1.0f, 0, 0.97f, 0.0f, 2, 6, 15);
        p.repetition_penalty = 1.3f;
        add_row(b, rng, K_FLAT, p, 300, 20);
        mask_last_row(b, rng, M_NO_ARGMAX);
        check_batch(b, "masks V=6007");
    }
    {
        batch b;
        b.V = 49152;
        b.stride = 49152;
        ktest_rng rng(49);
        add_row(b, rng, K_PEAKED, make_params(0.0f, 0, 1.0f, 0.0f, 20, 1, 0), 0, 0);
        mask_last_row(b, rng, M_NO_ARGMAX);
        sampling_params p = make_params(0.7f, 0, 0.9f, 0.0f, 20, 2, 31);
        p.presence_penalty = -1.0f;
        add_row(b, rng, K_NORMAL, p, 200, 8);
        mask_last_row(b, rng, M_SPARSE);
        add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 1.0f, 0.0f, -1, 3, 5), 0, 0);
        mask_last_row(b, rng, M_HALF, true);
        add_row(b, rng, K_FLAT, make_params(1.0f, 3000, 1.0f, 0.0f, 5, 4, 6), 0, 0); /* candidates overflow */
        mask_last_row(b, rng, M_DENSE);
        add_row(b, rng, K_NORMAL, make_params(0.8f, 20, 1.0f, 0.0f, 5, 5, 7), 0, 0); /* unmasked */
        check_batch(b, "masks V=49152");
    }
}

/* ---- scoring rows ------------------------------------------------------------------------ */

/* Makes the last row a scoring row for token t (any value: out of range fails the row). */
static void score_last_row(batch &b, int32_t t)
{
    b.params.back().score = 1;
    b.params.back().score_token = t;
    b.what.back() += " score=" + std::to_string(t);
}

/* A token to score in the last row: how 0 = any, 1 = the raw argmax, 2 = one with a -inf
 * or NaN logit (any when there is none). */
static int32_t pick_target(const batch &b, ktest_rng &rng, int how)
{
    const float *l = b.logits.data() + (size_t)(b.rows() - 1) * (size_t)b.stride;
    int32_t t = rng.below(b.V);
    if (how == 1) {
        for (int i = 0; i < b.V; i++)
            if (l[i] > l[t]) t = i;
    } else if (how == 2) {
        for (int i = 0; i < b.V; i++)
            if (!(l[i] > -INFINITY)) return i;
    }
    return t;
}

/* Scoring rows against the twin (sampler_logprobs of the target on the raw row): every
 * logit kind, no / 0 / 5 / 20 top logprobs, targets anywhere (random, the argmax, a -inf or
 * NaN logit), with penalties, a bias, a mask (allowing nothing, or a few tokens), invalid
 * sampling parameters and malformed CSR data on the same rows — all ignored (a sampled
 * row with any of them would differ or fail) — and sampled rows between them. A target
 * out of range and too many logprobs fail their row only. Then a large row of ties, where
 * the top-N take the exact fallback. */
static void test_scoring_rows(void)
{
    static const int lps[] = { -1, 0, 5, 20 };
    for (int V : { 257, 1001 }) {
        batch b;
        b.V = V;
        b.stride = V == 257 ? 260 : 1003;
        ktest_rng rng(808 + V);
        int i = 0;
        for (int k = 0; k < K_COUNT; k++)
            for (int j = 0; j < 4; j++, i++) {
                sampling_params p = make_params(i % 5 == 0 ? 0.0f : 0.8f, i % 3 ? 0 : 5, i % 4 ? 1.0f : 0.9f,
                                                i % 6 == 1 ? 0.2f : 0.0f, lps[j], 100 + i, (uint64_t)i);
                if (i % 2) {
                    p.repetition_penalty = 1.5f;
                    p.presence_penalty = 1.0f;
                    p.frequency_penalty = -1.0f;
                }
                if (i % 7 == 3) p.temperature = -1.0f; /* invalid for a sampled row */
                if (i % 7 == 5) p.top_p = 0.0f;
                add_row(b, rng, (kind)k, p, i % 2 ? 40 : 0, i % 3 ? 6 : 0);
                if (i % 3 == 1) mask_last_row(b, rng, M_NONE);
                else if (i % 3 == 2) mask_last_row(b, rng, M_SPARSE);
                score_last_row(b, pick_target(b, rng, i % 3));
                if (i % 4 == 0) /* a sampled row between scoring rows */
                    add_row(b, rng, (kind)k, make_params(0.9f, 20, 0.95f, 0.0f, 5, 900 + i, 3), 10, 2);
            }
        /* malformed CSR data on a scoring row: a repeated penalty id, a bias id out of range */
        sampling_params pen = make_params(1.0f, 0, 1.0f, 0.0f, 5, 7, 0);
        pen.presence_penalty = 0.5f;
        add_row(b, rng, K_NORMAL, pen, 20, 3);
        const int r = b.rows() - 1;
        b.pen_ids[b.pen_start[r]] = b.pen_ids[b.pen_start[r] + 1];
        b.bias_ids[b.bias_start[r]] = V;
        score_last_row(b, pick_target(b, rng, 0));
        b.what.back() += " malformed-csr";
        /* rows that fail alone, then a sampled row */
        for (int32_t t : { (int32_t)V, (int32_t)-1, (int32_t)INT32_MIN }) {
            add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 1.0f, 0.0f, 5, 1, 0), 0, 0);
            score_last_row(b, t);
        }
        add_row(b, rng, K_NORMAL, make_params(1.0f, 0, 1.0f, 0.0f, 21, 1, 0), 0, 0); /* too many logprobs */
        score_last_row(b, 3);
        add_row(b, rng, K_PEAKED, make_params(0.0f, 0, 1.0f, 0.0f, 5, 2, 0), 0, 0);
        check_batch(b, V == 257 ? "scoring V=257" : "scoring V=1001 unaligned");
    }
    {
        batch b;
        b.V = 49152;
        b.stride = 49152;
        ktest_rng rng(4915);
        add_row(b, rng, K_EQUAL, make_params(1.0f, 0, 1.0f, 0.0f, 20, 1, 0), 0, 0); /* raw ties > capacity */
        score_last_row(b, 40000);
        sampling_params p = make_params(0.7f, 20, 0.8f, 0.0f, 20, 2, 9);
        p.repetition_penalty = 1.2f;
        add_row(b, rng, K_PEAKED, p, 200, 8);
        mask_last_row(b, rng, M_ONE);
        score_last_row(b, pick_target(b, rng, 1));
        add_row(b, rng, K_NORMAL, make_params(0.9f, 0, 0.9f, 0.0f, 5, 3, 4), 0, 0);
        check_batch(b, "scoring V=49152");
    }
}

/* The rank of scoring rows (the raw logits >= the target's, NaN never counted) on crafted
 * rows, each beside a sampled row (rank 0): the target tied with a few ids or with the
 * whole row, tied at the maximum, the unique maximum, the minimum; NaN / -inf / +inf around
 * a finite target; a -inf target (every non-NaN id counts), a NaN one (none), a +inf one;
 * a row of only -inf and NaN; +0.0 against -0.0 (equal) and subnormals (not zero: a
 * flush-to-zero compare would count 0 >= 1e-45); targets at id 0 and V - 1 (the tail of
 * the last tile). Vocabularies over one and several tiles, with the float4 path and
 * without (odd stride: its padding columns, -7, must not count). */
static void test_scoring_rank(void)
{
    for (int V : { 257, 1001, 6007 }) {
        batch b;
        b.V = V;
        b.stride = V == 1001 ? 1003 : V;
        ktest_rng rng(4242 + V);
        /* a scoring row of kind k for target t, its logits edited by edit(l) first */
        auto scored = [&](kind k, int n_lp, auto edit, int32_t t, const char *what) {
            add_row(b, rng, k, make_params(1.0f, 0, 1.0f, 0.0f, n_lp, 11, 0), 0, 0);
            edit(b.logits.data() + (size_t)(b.rows() - 1) * (size_t)b.stride);
            score_last_row(b, t);
            b.what.back() += std::string(" ") + what;
            add_row(b, rng, K_NORMAL, make_params(0.8f, 0, 1.0f, 0.0f, 3, 12, 1), 0, 0); /* sampled: rank 0 */
        };
        auto none = [](float *) {};
        const int mid = V / 2, last = V - 1;
        scored(K_QUANT, 5, [&](float *l) { l[3] = l[mid] = l[last] = 0.5f; }, mid, "ties");
        scored(K_QUANT, -1, none, 0, "quantised id 0");
        scored(K_EQUAL, 0, none, last, "all equal");
        scored(K_NORMAL, 5, [&](float *l) { l[3] = l[100] = l[last] = 50.0f; }, 100, "tied max");
        scored(K_NORMAL, 20, [&](float *l) { l[3] = l[100] = l[last] = 50.0f; }, last, "tied max, last id");
        scored(K_NORMAL, 5, [&](float *l) { l[7] = 60.0f; }, 7, "unique max");
        scored(K_NORMAL, 5, [&](float *l) { l[mid] = -100.0f; }, mid, "min");
        scored(K_WILD, 5, [&](float *l) { l[9] = 0.0f; }, 9, "wild, finite target");
        scored(K_WILD, 5, [&](float *l) { l[1] = l[2] = NAN; l[last] = INFINITY; l[9] = -INFINITY; }, 9, "-inf target");
        scored(K_WILD, 5, [&](float *l) { l[mid] = NAN; }, mid, "NaN target");
        scored(K_NORMAL, 5, [&](float *l) { l[4] = l[last] = INFINITY; l[5] = NAN; }, last, "+inf target");
        scored(K_NORMAL, 5, [&](float *l) { l[4] = INFINITY; l[5] = NAN; l[6] = -INFINITY; }, 0, "+inf in the row");
        scored(K_DEAD, 5, none, 1, "dead row, -inf target");
        scored(K_DEAD, 5, none, 0, "dead row, NaN target");
        auto zeros = [&](float *l) {
            l[10] = 0.0f;
            l[11] = -0.0f;
            l[12] = 1e-45f;
            l[13] = -1e-45f;
            l[mid] = 0.0f;
            l[last] = -0.0f;
        };
        scored(K_NORMAL, 5, zeros, mid, "+0 target");
        scored(K_NORMAL, 5, zeros, 11, "-0 target");
        scored(K_NORMAL, 5, zeros, 12, "subnormal target");
        scored(K_NORMAL, 5, zeros, 13, "negative subnormal target");
        /* the expected ranks of a few rows, by hand: the twin itself must be right */
        std::vector<sampling_output> ref(b.rows());
        cpu_sampling(b.logits.data(), b.stride, b.rows(), b.V, b.params.data(), NULL, NULL, NULL, NULL, NULL, NULL,
                     NULL, NULL, ref.data());
        CHECK(ref[4].rank == V, "all equal: twin rank %d", ref[4].rank);
        CHECK(ref[6].rank == 3 && ref[8].rank == 3 && ref[10].rank == 1, "tied / unique max: twin ranks %d %d %d",
              ref[6].rank, ref[8].rank, ref[10].rank);
        CHECK(ref[18].rank == 0 && ref[19].rank == 0, "NaN target: twin rank %d (sampled row %d)", ref[18].rank,
              ref[19].rank);
        CHECK(ref[20].rank == 2 && ref[24].rank == 2 * V / 3, "+inf target / dead row: twin ranks %d %d",
              ref[20].rank, ref[24].rank);
        check_batch(b, V == 1001 ? "rank V=1001 unaligned" : V == 257 ? "rank V=257" : "rank V=6007");
    }
}

/* Launcher arguments it cannot run with. */
static void test_invalid_args(void)
{
    kbuf<float> d_l(64);
    kbuf<sampling_params> d_p(1);
    kbuf<sampling_output> d_o(1);
    CHECK(cuda_sampling(d_l.ptr, 64, 1, 0, d_p.ptr, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, d_o.ptr, 0) ==
              (int)cudaErrorInvalidValue, "vocab 0");
    CHECK(cuda_sampling(d_l.ptr, 32, 1, 64, d_p.ptr, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, d_o.ptr, 0) ==
              (int)cudaErrorInvalidValue, "stride < vocab");
    CHECK(cuda_sampling(d_l.ptr, SAMPLING_MAX_VOCAB + 1, 1, SAMPLING_MAX_VOCAB + 1, d_p.ptr, NULL, NULL, NULL, NULL,
                        NULL, NULL, NULL, NULL, d_o.ptr, 0) == (int)cudaErrorInvalidValue, "vocab too large");
    int32_t *fake = (int32_t *)d_l.ptr;
    CHECK(cuda_sampling(d_l.ptr, 64, 1, 64, d_p.ptr, fake, NULL, NULL, NULL, NULL, NULL, NULL, NULL, d_o.ptr, 0) ==
              (int)cudaErrorInvalidValue, "penalty offsets without ids");
    CHECK(cuda_sampling(d_l.ptr, 64, 1, 64, d_p.ptr, NULL, NULL, NULL, NULL, NULL, NULL, fake, NULL, d_o.ptr, 0) ==
              (int)cudaErrorInvalidValue, "mask rows without masks");
    CHECK(cuda_sampling(d_l.ptr, 64, 0, 64, d_p.ptr, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, d_o.ptr, 0) == 0,
          "0 rows");
    std::vector<sampling_output> o = d_o.download();
    const unsigned char *bytes = (const unsigned char *)o.data();
    bool untouched = true;
    for (size_t i = 0; i < sizeof(sampling_output); i++) untouched = untouched && bytes[i] == 0xff;
    CHECK(untouched, "a rejected or empty call wrote the output");
    CHECK_GUARD(d_o);
}

/* The same row samples the same token whatever else is in the batch and wherever it is. */
static void test_batch_independence(void)
{
    batch b;
    b.V = 500;
    b.stride = 500;
    ktest_rng rng(31);
    for (int i = 0; i < 12; i++)
        add_row(b, rng, i % 2 ? K_NORMAL : K_PEAKED,
                make_params(0.9f, i % 3 ? 0 : 20, i % 4 ? 1.0f : 0.9f, 0.0f, 5, 1000 + i, (uint64_t)i * 7), i % 3 * 9,
                i % 5 == 0 ? 4 : 0);
    /* the reversed batch */
    batch rb = b;
    rb.logits.clear();
    rb.params.clear();
    rb.what.clear();
    rb.pen_start = { 0 };
    rb.pen_ids.clear();
    rb.pen_info.clear();
    rb.bias_start = { 0 };
    rb.bias_ids.clear();
    rb.bias_vals.clear();
    rb.mask_row.clear();
    for (int r = b.rows() - 1; r >= 0; r--) {
        rb.logits.insert(rb.logits.end(), b.logits.begin() + (size_t)r * 500, b.logits.begin() + (size_t)(r + 1) * 500);
        rb.params.push_back(b.params[r]);
        rb.mask_row.push_back(b.mask_row[r]);
        rb.what.push_back(b.what[r]);
        rb.pen_ids.insert(rb.pen_ids.end(), b.pen_ids.begin() + b.pen_start[r], b.pen_ids.begin() + b.pen_start[r + 1]);
        rb.pen_info.insert(rb.pen_info.end(), b.pen_info.begin() + b.pen_start[r],
                           b.pen_info.begin() + b.pen_start[r + 1]);
        rb.pen_start.push_back((int32_t)rb.pen_ids.size());
        rb.bias_ids.insert(rb.bias_ids.end(), b.bias_ids.begin() + b.bias_start[r],
                           b.bias_ids.begin() + b.bias_start[r + 1]);
        rb.bias_vals.insert(rb.bias_vals.end(), b.bias_vals.begin() + b.bias_start[r],
                            b.bias_vals.begin() + b.bias_start[r + 1]);
        rb.bias_start.push_back((int32_t)rb.bias_ids.size());
    }
    check_batch(b, "batch");
    check_batch(rb, "reversed batch");
}

/* ---- the draws' distribution ------------------------------------------------------------- */

/* 1 - 1e-4 quantile of chi-square with df degrees of freedom (Wilson-Hilferty). */
static double chi2_crit(int df)
{
    const double z = 3.719, a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + z * sqrt(a), 3.0);
}

static double chi2(const std::vector<long> &counts, const std::vector<double> &prob, long n, int *df)
{
    double stat = 0.0;
    int bins = 0;
    for (size_t i = 0; i < counts.size(); i++) {
        double e = prob[i] * (double)n;
        if (e == 0.0) {
            if (counts[i]) return INFINITY;
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    *df = bins - 1;
    return stat;
}

/* Draws per chi-square case: the emulator runs a 512-thread block per draw (the filtered
 * case goes through ~40 block barriers, the direct draw ~12), ASan several times slower;
 * a GPU affords many more. */
#ifdef TESSERA_EMU
#if defined(__SANITIZE_ADDRESS__)
#define CHI_SCALE 2
#else
#define CHI_SCALE 1
#endif
#define CHI_DRAWS_DIRECT (1600 / CHI_SCALE)
#define CHI_DRAWS_FILTERED (600 / CHI_SCALE)
#else
#define CHI_DRAWS_DIRECT 40000
#define CHI_DRAWS_FILTERED 40000
#endif

/* N draws of one row at steps 0 .. N-1 (one launch of N rows), against the exact
 * distribution (exp in double; the rule's supports) by Pearson's chi-square at the 1e-4
 * level; and the test's power: the draws must reject a wrong distribution — twice the
 * temperature (expected statistic >= 100 at 800 draws, critical value 30), or the same
 * filters without top-p (a token the nucleus excludes has probability 0.16 there: at 300
 * draws, an expected 48 never seen). */
static void test_chi_square(void)
{
    const int V = 8;
    const float l[V] = { 0.3f, 1.1f, -0.4f, 1.6f, 0.0f, 1.3f, -2.0f, 0.9f };
    struct {
        float t, top_p;
        int k, n;
    } cases[] = { { 1.0f, 1.0f, 0, CHI_DRAWS_DIRECT }, { 0.8f, 0.75f, 4, CHI_DRAWS_FILTERED } };
    for (auto &cs : cases) {
        const int N = cs.n;
        std::vector<float> logits;
        std::vector<sampling_params> params;
        for (int i = 0; i < N; i++) {
            logits.insert(logits.end(), l, l + V);
            params.push_back(make_params(cs.t, cs.k, cs.top_p, 0.0f, -1, 0xfeedull, (uint64_t)i));
        }
        kbuf<float> d_l(logits.size());
        kbuf<sampling_params> d_p(N);
        kbuf<sampling_output> d_o(N);
        d_l.upload(logits);
        d_p.upload(params);
        d_o.poison();
        int rc = cuda_sampling(d_l.ptr, V, N, V, d_p.ptr, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, d_o.ptr, 0);
        CHECK(rc == 0, "launch %d", rc);
        std::vector<sampling_output> got = d_o.download();
        /* the exact distribution: top-k (no ties here), weights exp((l - max) / T), nucleus */
        auto dist = [&](float t, float top_p) {
            std::vector<int> order(V);
            for (int i = 0; i < V; i++) order[i] = i;
            std::sort(order.begin(), order.end(), [&](int a, int c) { return l[a] > l[c]; });
            int kept = cs.k > 0 ? cs.k : V;
            std::vector<double> w(V, 0.0);
            double tot = 0.0;
            for (int i = 0; i < kept; i++) tot += w[order[i]] = exp((l[order[i]] - l[order[0]]) / t);
            if (top_p < 1.0f) {
                double acc = 0.0;
                int cut = kept;
                for (int i = 0; i < kept; i++)
                    if ((acc += w[order[i]]) >= top_p * tot) {
                        cut = i + 1;
                        break;
                    }
                for (int i = cut; i < kept; i++) w[order[i]] = 0.0;
            }
            double s = 0.0;
            for (double x : w) s += x;
            for (double &x : w) x /= s;
            return w;
        };
        std::vector<long> counts(V, 0);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            if (got[i].status != SAMPLING_OK || got[i].token < 0 || got[i].token >= V) bad++;
            else counts[got[i].token]++;
        }
        CHECK(bad == 0, "%d draws failed", bad);
        int df = 0;
        double stat = chi2(counts, dist(cs.t, cs.top_p), N, &df);
        CHECK(stat < chi2_crit(df), "T=%g k=%d p=%g: chi2 %g >= %g (df %d)", (double)cs.t, cs.k, (double)cs.top_p,
              stat, chi2_crit(df), df);
        double wrong = cs.top_p < 1.0f ? chi2(counts, dist(cs.t, 1.0f), N, &df) : chi2(counts, dist(2.0f * cs.t, 1.0f), N, &df);
        CHECK(wrong > chi2_crit(df), "T=%g p=%g: a wrong distribution is not rejected (chi2 %g)", (double)cs.t,
              (double)cs.top_p, wrong);
        CHECK_GUARD(d_l);
        CHECK_GUARD(d_p);
        CHECK_GUARD(d_o);
    }
}

/* ---- Philox on the device ----------------------------------------------------------------- */

__global__ void philox_kat_kernel(const uint32_t *in, uint32_t *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t ctr[4] = { in[6 * i], in[6 * i + 1], in[6 * i + 2], in[6 * i + 3] };
    uint32_t key[2] = { in[6 * i + 4], in[6 * i + 5] };
    uint32_t o[4];
    philox4x32_10(ctr, key, o);
#ifndef TESSERA_EMU
    /* cuRAND's implementation, where there is a GPU to run it */
    uint4 c2 = curand_Philox4x32_10(make_uint4(ctr[0], ctr[1], ctr[2], ctr[3]), make_uint2(key[0], key[1]));
    if (c2.x != o[0] || c2.y != o[1] || c2.z != o[2] || c2.w != o[3]) o[0] = o[1] = o[2] = o[3] = 0xdeadbeefu;
#endif
    for (int j = 0; j < 4; j++) out[4 * i + j] = o[j];
}

static void test_philox_device(void)
{
    /* Random123's kat_vectors for philox4x32_10: counter, key -> output */
    const uint32_t in[3][6] = { { 0, 0, 0, 0, 0, 0 },
                                { 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu },
                                { 0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u } };
    const uint32_t want[3][4] = { { 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u },
                                  { 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu },
                                  { 0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u } };
    kbuf<uint32_t> d_in(18), d_out(12);
    d_in.upload(&in[0][0]);
    KTEST_SEEDS(s) {
        d_out.poison();
        uint32_t *di = d_in.ptr, *dout = d_out.ptr;
        TS_LAUNCH(philox_kat_kernel, 1, 32, 0, 0, di, dout, 3);
        KCHECK_CUDA(cudaGetLastError());
        std::vector<uint32_t> got = d_out.download();
        for (int v = 0; v < 3; v++)
            for (int j = 0; j < 4; j++)
                CHECK(got[4 * v + j] == want[v][j], "vector %d word %d: %08x want %08x", v, j, got[4 * v + j],
                      want[v][j]);
    }
    CHECK_GUARD(d_in);
    CHECK_GUARD(d_out);
}

int main(void)
{
    RUN(test_philox_device);
    RUN(test_invalid_args);
    RUN(test_small_vocab);
    RUN(test_random_rows);
    RUN(test_fallbacks);
    RUN(test_row_errors);
    RUN(test_masks);
    RUN(test_scoring_rows);
    RUN(test_scoring_rank);
    RUN(test_batch_independence);
    RUN(test_large_vocab);
    RUN(test_chi_square);
    return test_summary();
}
