/* bench_sampling.cu — benchmarks of kernels/sampling.cu at Qwen2.5-7B's vocabulary
 * (152,064) and 64 rows: greedy, temperature only (the direct draw), top-p 0.9, and the
 * full row (top-k 50 + top-p 0.9 + penalties over a 512-token history + 20 logprobs), and
 * greedy / top-p under a token mask per row allowing a tenth of the ids (constrained
 * decoding: the mask words are read beside the logits).
 * Each row reports the bytes one call must read at least (every logit once) against the
 * measured copy bandwidth; the issue's target is < 50 us per call for the 64 x 152k rows.
 *
 * The logits are shaped like a model's: a bulk N(0, 2^2) and a head of a few dozen tokens
 * 8-16 logits above it (the sampling paths depend on the shape: a flat row makes the
 * nucleus huge and takes the exact fallback; the "flat" row measures that too).
 * b->tiny: 3 rows of 4096.
 */
#include "kbench.h"

#include "kernels/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

static uint64_t bench_rng(uint64_t *x) /* splitmix64 */
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float bench_unif(uint64_t *x) { return (float)(bench_rng(x) >> 40) * (1.0f / 16777216.0f); }

template <typename T> static T *upload(const std::vector<T> &h)
{
    T *d;
    KB_CHECK(cudaMalloc((void **)&d, h.size() * sizeof(T) + 16));
    KB_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

struct sampling_case {
    const char *name;
    float t, top_p;
    int k, n_logprobs;
    bool penalties, flat, masked;
};

static void bench_one(struct kbench *b, const float *d_logits_peaked, const float *d_logits_flat, int rows,
                      int vocab, const sampling_case &c)
{
    std::vector<sampling_params> hp(rows);
    std::vector<int32_t> ps(rows + 1), pid;
    std::vector<uint32_t> pinfo;
    std::vector<int32_t> bs(rows + 1), bid;
    std::vector<float> bval;
    uint64_t x = 12345;
    for (int r = 0; r < rows; r++) {
        sampling_params &p = hp[r];
        memset(&p, 0, sizeof p);
        p.temperature = c.t;
        p.top_k = c.k;
        p.top_p = c.top_p;
        p.repetition_penalty = c.penalties ? 1.1f : 1.0f;
        p.presence_penalty = c.penalties ? 0.5f : 0.0f;
        p.frequency_penalty = c.penalties ? 0.2f : 0.0f;
        p.n_logprobs = c.n_logprobs;
        p.seed = 1000 + r;
        p.step = 77;
        ps[r] = (int32_t)pid.size();
        bs[r] = (int32_t)bid.size();
        if (c.penalties) {
            /* 512 distinct tokens of history (a third from the prompt), 8 bias entries */
            for (int j = 0; j < 512; j++) {
                pid.push_back((int32_t)((j * 2654435761u + r * 977u) % (uint32_t)vocab));
                pinfo.push_back(j % 3 == 0 ? 0x80000000u : 1u + (uint32_t)(j % 4));
            }
            for (int j = 0; j < 8; j++) {
                bid.push_back((int32_t)((j * 40503u + r) % (uint32_t)vocab));
                bval.push_back(j == 7 ? -INFINITY : 2.0f * bench_unif(&x) - 1.0f);
            }
        }
    }
    ps[rows] = (int32_t)pid.size();
    bs[rows] = (int32_t)bid.size();
    /* one mask per row: a pseudo-random tenth of the ids allowed */
    const int words = (vocab + 31) / 32;
    std::vector<int32_t> mrow(rows);
    std::vector<uint32_t> masks(c.masked ? (size_t)rows * words : 1, 0u);
    for (int r = 0; r < rows; r++) {
        mrow[r] = r;
        for (int i = 0; c.masked && i < vocab; i++)
            if ((bench_rng(&x) & 1023) < 102) masks[(size_t)r * words + i / 32] |= 1u << (i % 32);
    }
    /* ids must be unique within a row: step past repeats */
    for (int r = 0; r < rows; r++) {
        std::vector<char> seen(vocab, 0);
        for (int j = ps[r]; j < ps[r + 1]; j++) {
            while (seen[pid[j]]) pid[j] = (pid[j] + 1) % vocab;
            seen[pid[j]] = 1;
        }
        std::vector<char> seen_b(vocab, 0);
        for (int j = bs[r]; j < bs[r + 1]; j++) {
            while (seen_b[bid[j]]) bid[j] = (bid[j] + 1) % vocab;
            seen_b[bid[j]] = 1;
        }
    }
    if (pid.empty()) {
        pid.push_back(0);
        pinfo.push_back(0);
    }
    if (bid.empty()) {
        bid.push_back(0);
        bval.push_back(0.0f);
    }
    sampling_params *d_p = upload(hp);
    int32_t *d_ps = upload(ps), *d_pid = upload(pid), *d_bs = upload(bs), *d_bid = upload(bid);
    uint32_t *d_pinfo = upload(pinfo);
    float *d_bval = upload(bval);
    int32_t *d_mrow = upload(mrow);
    uint32_t *d_masks = upload(masks);
    sampling_output *d_out;
    KB_CHECK(cudaMalloc((void **)&d_out, rows * sizeof(sampling_output)));
    const float *lg = c.flat ? d_logits_flat : d_logits_peaked;
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_sampling(lg, vocab, rows, vocab, d_p, c.penalties ? d_ps : NULL, d_pid, d_pinfo,
                             c.penalties ? d_bs : NULL, d_bid, d_bval, c.masked ? d_mrow : NULL, d_masks, d_out,
                             b->stream));
    });
    std::vector<sampling_output> o(rows);
    KB_CHECK(cudaMemcpy(o.data(), d_out, rows * sizeof(sampling_output), cudaMemcpyDeviceToHost));
    for (int r = 0; r < rows; r++)
        if (o[r].status != SAMPLING_OK || o[r].token < 0 || o[r].token >= vocab) {
            fprintf(stderr, "bench_sampling %s: row %d status %d token %d\n", c.name, r, o[r].status, o[r].token);
            exit(2);
        }
    char shape[64];
    snprintf(shape, sizeof shape, "%d x %d%s", rows, vocab, c.flat ? " flat" : "");
    kbench_row(b, c.name, shape, s, (double)rows * vocab * (c.masked ? 4.125 : 4.0), 0.0, KB_MEMORY);
    cudaFree(d_p);
    cudaFree(d_ps);
    cudaFree(d_pid);
    cudaFree(d_pinfo);
    cudaFree(d_bs);
    cudaFree(d_bid);
    cudaFree(d_bval);
    cudaFree(d_mrow);
    cudaFree(d_masks);
    cudaFree(d_out);
}

static void bench_sampling(struct kbench *b)
{
    const int rows = b->tiny ? 3 : 64, vocab = b->tiny ? 4096 : 152064;
    std::vector<float> peaked((size_t)rows * vocab), flat((size_t)rows * vocab);
    uint64_t x = 7;
    for (size_t i = 0; i < peaked.size(); i++) {
        float u1 = bench_unif(&x) + 1e-7f, u2 = bench_unif(&x);
        peaked[i] = 2.0f * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
        flat[i] = 2.0f * bench_unif(&x) - 1.0f;
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 40; j++) peaked[(size_t)r * vocab + bench_rng(&x) % vocab] = 8.0f + 8.0f * bench_unif(&x);
    float *d_peaked = upload(peaked), *d_flat = upload(flat);
    static const sampling_case cases[] = {
        { "sampling greedy", 0.0f, 1.0f, 0, -1, false, false, false },
        { "sampling T=1", 1.0f, 1.0f, 0, -1, false, false, false },
        { "sampling top-p 0.9", 0.8f, 0.9f, 0, -1, false, false, false },
        { "sampling k50 p0.9 pen lp20", 0.7f, 0.9f, 50, 20, true, false, false },
        { "sampling top-p 0.9", 0.8f, 0.9f, 0, -1, false, true, false },
        { "sampling greedy mask 10%", 0.0f, 1.0f, 0, -1, false, false, true },
        { "sampling top-p 0.9 mask 10%", 0.8f, 0.9f, 0, -1, false, false, true },
    };
    for (const sampling_case &c : cases) bench_one(b, d_peaked, d_flat, rows, vocab, c);
    cudaFree(d_peaked);
    cudaFree(d_flat);
}
KBENCH_REGISTER(bench_sampling);
