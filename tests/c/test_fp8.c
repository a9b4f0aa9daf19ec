/* test_fp8.c — util/fp8.h: every e4m3fn code decodes to the formula's value, and fp32 ->
 * e4m3fn is round-to-nearest-even with saturation at +-448, checked against an
 * independent nearest-code search over a dense sweep of fp32 values. */
#include "test.h"

#include "util/fp8.h"

#include <float.h>
#include <stdint.h>

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* the OCP E4M3 "fn" definition, written independently of the table's macros */
static double e4m3_formula(int c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static void test_decode_all_codes(void)
{
    for (int c = 0; c < 256; c++) {
        double want = e4m3_formula(c);
        float got = fp8_e4m3_to_fp32((uint8_t)c);
        if (isnan(want)) CHECK(isnan(got), "code 0x%02x should be NaN, got %g", c, got);
        else CHECK(got == want, "code 0x%02x: %.9g, want %.9g", c, got, want);
    }
    CHECK(fp8_e4m3_to_fp32(0x7e) == 448.0f && fp8_e4m3_to_fp32(0xfe) == -448.0f, "max finite");
    CHECK(fp8_e4m3_to_fp32(0x08) == 0.015625f, "min normal 2^-6");
    CHECK(fp8_e4m3_to_fp32(0x01) == 0.001953125f, "min subnormal 2^-9");
    CHECK(fp8_e4m3_to_fp32(0x80) == 0.0f && signbit(fp8_e4m3_to_fp32(0x80)), "-0");
    CHECK(!signbit(fp8_e4m3_to_fp32(0x00)), "+0");
}

static void test_roundtrip_codes(void)
{
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        uint8_t back = fp32_to_fp8_e4m3(fp8_e4m3_to_fp32((uint8_t)c));
        CHECK(back == c, "code 0x%02x -> %g -> 0x%02x", c, fp8_e4m3_to_fp32((uint8_t)c), back);
    }
}

/* Sweeps positive fp32 upward (bit order = value order) with a monotone pointer to the
 * largest code <= x, so the nearest code is found without the encoder's arithmetic. */
static void test_dense_sweep_nearest_even(void)
{
    int lo = 0; /* positive codes 0x00..0x7e increase with the code */
    long checked = 0;
    for (uint64_t u = 0; u < 0x44000000u; u += 3) { /* [0, 512): past 448 into saturation */
        float x = bits_f((uint32_t)u);
        while (lo < 0x7e && fp8_e4m3_to_fp32((uint8_t)(lo + 1)) <= x) lo++;
        int want;
        if (lo == 0x7e) {
            want = 0x7e; /* saturate */
        } else {
            double dl = (double)x - fp8_e4m3_to_fp32((uint8_t)lo);
            double dh = (double)fp8_e4m3_to_fp32((uint8_t)(lo + 1)) - x;
            want = dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1 ? lo + 1 : lo);
        }
        uint8_t got = fp32_to_fp8_e4m3(x), gotn = fp32_to_fp8_e4m3(-x);
        CHECK(got == want, "x=%.9g (0x%08x): 0x%02x, want 0x%02x", x, (unsigned)u, got, want);
        CHECK(gotn == (want | 0x80), "-x=%.9g: 0x%02x, want 0x%02x", -x, gotn, want | 0x80);
        checked++;
    }
    CHECK(checked > 300000000, "checked %ld", checked);
}

/* Every midpoint between adjacent codes ties to the even code; one ulp either side goes
 * to the nearer code. */
static void test_ties_to_even(void)
{
    for (int c = 0; c < 0x7e; c++) {
        float a = fp8_e4m3_to_fp32((uint8_t)c), b = fp8_e4m3_to_fp32((uint8_t)(c + 1));
        float mid = (a + b) / 2; /* exact: both have <= 4 significant bits */
        int even = c & 1 ? c + 1 : c;
        CHECK(fp32_to_fp8_e4m3(mid) == even, "mid of 0x%02x: 0x%02x", c, fp32_to_fp8_e4m3(mid));
        CHECK(fp32_to_fp8_e4m3(-mid) == (even | 0x80), "-mid of 0x%02x", c);
        CHECK(fp32_to_fp8_e4m3(nextafterf(mid, 0)) == c, "below mid of 0x%02x", c);
        CHECK(fp32_to_fp8_e4m3(nextafterf(mid, 1000)) == c + 1, "above mid of 0x%02x", c);
    }
}

static void test_special_values(void)
{
    /* saturation: everything >= 448 (including the would-be-NaN range > 464 and inf) */
    float big[] = { 448.0f, 448.5f, 463.99f, 464.0f, 465.0f, 480.0f, 1e6f, FLT_MAX, INFINITY };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        CHECK(fp32_to_fp8_e4m3(big[i]) == 0x7e, "%g -> 0x%02x", big[i], fp32_to_fp8_e4m3(big[i]));
        CHECK(fp32_to_fp8_e4m3(-big[i]) == 0xfe, "%g -> 0x%02x", -big[i], fp32_to_fp8_e4m3(-big[i]));
    }
    CHECK(fp32_to_fp8_e4m3(447.99f) == 0x7e, "just below 448");
    CHECK(fp32_to_fp8_e4m3(431.99f) == 0x7d, "416 + just under half a step");
    /* NaN keeps its sign, and never comes from a finite value */
    CHECK(fp32_to_fp8_e4m3(NAN) == 0x7f, "nan");
    CHECK(fp32_to_fp8_e4m3(-NAN) == 0xff, "-nan");
    CHECK(fp32_to_fp8_e4m3(bits_f(0x7f800001u)) == 0x7f, "snan");
    /* signed zero */
    CHECK(fp32_to_fp8_e4m3(0.0f) == 0x00, "+0");
    CHECK(fp32_to_fp8_e4m3(-0.0f) == 0x80, "-0");
    /* subnormals and underflow */
    CHECK(fp32_to_fp8_e4m3(0.001953125f) == 0x01, "2^-9");
    CHECK(fp32_to_fp8_e4m3(0.0009765625f) == 0x00, "2^-10 ties to even 0");
    CHECK(fp32_to_fp8_e4m3(nextafterf(0.0009765625f, 1)) == 0x01, "just above 2^-10");
    CHECK(fp32_to_fp8_e4m3(-0.0009765625f) == 0x80, "-2^-10 -> -0");
    CHECK(fp32_to_fp8_e4m3(0.0029296875f) == 0x02, "1.5 * 2^-9 ties to even 2");
    CHECK(fp32_to_fp8_e4m3(0.0146484375f) == 0x08, "7.5 * 2^-9 rounds up to min normal");
    CHECK(fp32_to_fp8_e4m3(bits_f(1)) == 0x00, "fp32 denormal -> 0");
    CHECK(fp32_to_fp8_e4m3(FLT_MIN) == 0x00, "FLT_MIN -> 0");
    CHECK(fp32_to_fp8_e4m3(1.0f) == 0x38 && fp32_to_fp8_e4m3(-2.0f) == 0xc0, "1, -2");
}

int main(void)
{
    RUN(test_decode_all_codes);
    RUN(test_roundtrip_codes);
    RUN(test_ties_to_even);
    RUN(test_special_values);
    RUN(test_dense_sweep_nearest_even);
    return test_summary();
}
