/* test_philox.c — unit tests for src/sampler/philox.h (Philox4x32-10) and the bit-exact
 * arithmetic of the sampling rule, src/sampler/exact.h.
 *
 * Philox is checked three independent ways: the published known-answer vectors (Random123's
 * kat_vectors for philox4x32_10, also used by TensorFlow's and JAX's tests), values from the
 * Python reference of the rule in docs/sampling.md, and — once, when this was written —
 * 2,000,000 random counters and keys against cuRAND's curand_Philox4x32_10 compiled for the
 * host (identical; on a GPU, tests/kernels/test_kernel_sampling.cu repeats that comparison
 * on the device). The weight function is checked against exp() in double, for its
 * monotonicity (every float in [-22, 0] when TESSERA_SLOW_TESTS=1, ~8 s; a dense subset
 * otherwise), and pinned where a change would move tokens.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/exact.h"
#include "sampler/philox.h"
#include "test.h"

static void test_known_answers(void)
{
    /* Random123 kat_vectors: philox4x32 10 <counter x4> <key x2> <output x4> */
    static const uint32_t kat[3][10] = {
        { 0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u },
        { 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
          0xa20bc7c6u, 0x6d5451fdu },
        { 0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
          0x5001e420u, 0x24126ea1u },
    };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        philox4x32_10(kat[v], kat[v] + 4, out);
        for (int j = 0; j < 4; j++)
            CHECK(out[j] == kat[v][6 + j], "vector %d word %d: %08x want %08x", v, j, out[j], kat[v][6 + j]);
    }
    /* one round by hand (counter 1, key 0): hi/lo of 0xD2511F53 * 1 and of 0xCD9E8D57 * 0 */
    uint32_t c[4] = { 1, 0, 0, 0 }, k[2] = { 0, 0 };
    philox4x32_round(c, k);
    CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 0xD2511F53u, "one round: %08x %08x %08x %08x", c[0], c[1],
          c[2], c[3]);
}

/* The draw's 64 bits and scaling. Expected values from the Python reference. */
static void test_draw(void)
{
    CHECK(smp_draw_bits(0, 0) == 0xe169c58d6627e8d5ull, "bits(0, 0) = %016llx",
          (unsigned long long)smp_draw_bits(0, 0));
    /* (seed, step) map to (key, counter) word by word: seed 2^32 is key word 1 */
    uint32_t ctr[4] = { 5, 0, SMP_STREAM_DRAW, 0 }, key[2] = { 0, 1 }, out[4];
    philox4x32_10(ctr, key, out);
    CHECK(smp_draw_bits(1ull << 32, 5) == (((uint64_t)out[1] << 32) | out[0]), "seed high word");
    ctr[0] = 0;
    ctr[1] = 7;
    key[0] = 3;
    key[1] = 0;
    philox4x32_10(ctr, key, out);
    CHECK(smp_draw_bits(3, 7ull << 32) == (((uint64_t)out[1] << 32) | out[0]), "step high word");
    CHECK(smp_draw_bits(1, 2) != smp_draw_bits(2, 1), "seed and step are not interchangeable");
    /* floor(bits * total / 2^64): the ends of the range and an exact midpoint */
    CHECK(smp_draw_point(0, 1000) == 0, "bits 0");
    CHECK(smp_draw_point(~0ull, 1000) == 999, "bits max");
    CHECK(smp_draw_point(1ull << 63, 1000) == 500, "half");
    CHECK(smp_draw_point(~0ull, 1ull << 50) == (1ull << 50) - 1, "large total");
}

/* W = rint(e(x) * 2^31): values, accuracy, the cut-off, monotonicity. */
static void test_weight(void)
{
    CHECK(smp_weight(0.0f) == SMP_W_MAX && smp_weight(-0.0f) == SMP_W_MAX, "W(0) must be exactly 2^31");
    CHECK(smp_weight(-1e-30f) == SMP_W_MAX, "W(-tiny)");
    CHECK(smp_weight(-22.0f) == 1u && smp_weight(nextafterf(-22.0f, -INFINITY)) == 0u, "cut-off at -22");
    CHECK(smp_weight(-INFINITY) == 0 && smp_weight(NAN) == 0 && smp_weight(-1e30f) == 0, "non-finite");
    /* pinned: the Python reference (exact rational arithmetic) gives these */
    static const float xs[4] = { -0.5f, -1.0f, -3.25f, -21.0f };
    static const uint32_t ws[4] = { 1302514688u, 790015104u, 83266976u, 2u };
    for (int i = 0; i < 4; i++)
        CHECK(smp_weight(xs[i]) == ws[i], "W(%g) = %u want %u", (double)xs[i], smp_weight(xs[i]), ws[i]);
    /* within 1.5 ulp (2^-24 relative) of exp(x) 2^31, plus the final rounding to an integer */
    double worst = 0.0;
    for (float x = -22.0f; x <= 0.0f; x += 0.00073f) {
        double ref = exp((double)x) * 2147483648.0, err = fabs((double)smp_weight(x) - ref);
        double r = (err - 0.5 > 0.0 ? err - 0.5 : 0.0) / ref;
        worst = r > worst ? r : worst;
    }
    CHECK(worst < 1.5 * 0x1p-24, "relative error %g", worst);
    /* monotone non-decreasing in x: floats walked upwards from -22 to 0 (every 61st, plus
     * every float within 4096 ulps of each range-reduction boundary (k + 1/2) ln 2) */
    const int slow = getenv("TESSERA_SLOW_TESTS") != NULL;
    const uint32_t step = slow ? 1 : 61;
    uint32_t u, prev = 0;
    long viol = 0, n = 0;
    float x = -22.0f;
    memcpy(&u, &x, 4);
    for (; u > 0x80000000u; u = u > step + 0x80000000u ? u - step : 0x80000000u) {
        memcpy(&x, &u, 4);
        uint32_t w = smp_weight(x);
        viol += w < prev;
        prev = w;
        n++;
    }
    for (int k = -32; k <= 0; k++) {
        float b = (float)((k + 0.5) * 0.69314718055994531), y = nextafterf(b, -INFINITY);
        uint32_t p = smp_weight(y);
        for (int i = 0; i < 8192; i++) {
            y = nextafterf(y, INFINITY);
            uint32_t w = smp_weight(y);
            viol += w < p;
            p = w;
        }
    }
    CHECK(viol == 0, "%ld decreasing steps among %ld floats", viol, n);
}

/* The order-preserving keys used for top-k and the top-N logprobs. */
static void test_keys(void)
{
    const float v[] = { -INFINITY, -3e38f, -1.0f, -1e-30f, -0.0f, 0.0f, 1e-45f, 1.0f, 2.5f, 3e38f, INFINITY };
    const int n = sizeof v / sizeof v[0];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int fc = (v[i] > v[j]) - (v[i] < v[j]);
            int kc = (smp_key(v[i]) > smp_key(v[j])) - (smp_key(v[i]) < smp_key(v[j]));
            CHECK(fc == kc, "order of %g and %g: floats %d keys %d", (double)v[i], (double)v[j], fc, kc);
        }
    for (int i = 0; i < n; i++) {
        float back = smp_key_value(smp_key(v[i]));
        CHECK(back == v[i], "key inverse of %g: %g", (double)v[i], (double)back);
    }
    CHECK(smp_key(-INFINITY) == 0x007fffffu, "key(-inf) %08x", smp_key(-INFINITY));
}

/* The penalties' roundings are part of the rule: pinned on a case where a fused and an
 * unfused multiply-add differ. */
static void test_penalize(void)
{
    CHECK(smp_penalize(2.0f, 2.0f, 0.5f, 0.25f, 1u) == 0.25f, "positive logit");
    CHECK(smp_penalize(-2.0f, 2.0f, 0.5f, 0.25f, SMP_PROMPT_FLAG) == -4.0f, "prompt only: repetition only");
    CHECK(smp_penalize(3.0f, 1.0f, 0.0f, 0.0f, 5u) == 3.0f, "all off");
    CHECK(isnan(smp_penalize(NAN, 1.3f, 0.5f, 0.5f, 2u)), "NaN stays NaN");
    CHECK(smp_penalize(-INFINITY, 1.3f, 0.5f, 0.5f, 2u) == -INFINITY, "-inf stays -inf");
    /* l <= 0: fmaf(l, rep, -t), one rounding — not RN(RN(l * rep) - t) */
    const float l = -0x1.a9fbe8p-6f, rep = 0x1.343958p+0f, pres = 0.1f, freq = 0.7f;
    float t = fmaf(freq, 3.0f, pres);
    volatile float prod = l * rep;
    float unfused = prod - t, fused = fmaf(l, rep, -t);
    CHECK(fused != unfused, "the example no longer separates the two (%a)", (double)fused);
    CHECK(smp_penalize(l, rep, pres, freq, 3u) == fused, "penalize %a, want the fused %a",
          (double)smp_penalize(l, rep, pres, freq, 3u), (double)fused);
    CHECK(smp_min_p_weight(0.0f) == 0 && smp_min_p_weight(1.0f) == SMP_W_MAX && smp_min_p_weight(0.5f) == 1u << 30,
          "min-p thresholds");
    CHECK(smp_scaled(1.0f, 1.0f, INFINITY) == 0.0f, "x of the max with an infinite 1/T");
    CHECK(smp_scaled(0.5f, 1.0f, 2.0f) == -1.0f, "x");
}

int main(void)
{
    RUN(test_known_answers);
    RUN(test_draw);
    RUN(test_weight);
    RUN(test_keys);
    RUN(test_penalize);
    return test_summary();
}
