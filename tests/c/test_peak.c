/* test_peak.c — backend/cpu/peak.h: the register-only peak loops and the choice of
 * instruction per kernel set and weight type.
 *
 * A peak cannot be compared with a reference value (it depends on the CPU and on what
 * else runs), so the checks are bounds that a wrong op count or a loop the compiler
 * emptied would break: every available loop runs at 0.05..4 instructions per cycle at
 * 0.5..6 GHz per thread; a SIMD loop beats the scalar loop of its element type by a wide
 * margin (ymm FMA and the int8 pair by 4x and 8x, half their lane counts; zmm FMA by 4x
 * only, because CPUs that split 512-bit operations in two run it at the ymm rate); the
 * int8 dot beats the f32 FMA of the same width by 1.5x (4 products per lane against 1:
 * ~3.8x on a quiet machine), and the bf16 pair dot reaches at least 0.8x of it (2 products
 * per lane: 2.0x on Zen 4; CPUs that issue it at half the FMA rate give 1.0x).
 * Each loop is measured at another moment, and a hypervisor that takes the core for a
 * few tens of milliseconds halves one figure, so a ratio that misses is measured again
 * (both loops, up to four rounds, keeping each loop's best): noise passes on a later
 * round, a wrong count misses in every round.
 */
#include "backend/cpu/peak.h"
#include "backend/cpu/quant_kernels.h"
#include "util/err.h"
#include "util/threadpool.h"

#include "test.h"

/* ops per instruction (or pair), as peak.c counts them */
static double ops_of(enum cpu_peak_kind k)
{
    switch (k) {
    case CPU_PEAK_I8_DPBUSD_ZMM: return 128;
    case CPU_PEAK_I8_DPBUSD_YMM: return 64;
    case CPU_PEAK_I8_MADDUBS_YMM: return 64;
    case CPU_PEAK_F32_FMA_ZMM: return 32;
    case CPU_PEAK_F32_FMA_YMM: return 16;
    case CPU_PEAK_BF16_DPBF16_ZMM: return 64;
    default: return 2;
    }
}

static double measure(struct threadpool *tp, enum cpu_peak_kind k)
{
    char err[ERR_BUF];
    double g = -1;
    int rc = cpu_peak_measure(tp, k, 0.01, 5, &g, err, sizeof err);
    CHECK(rc == 0, "%s: %s", cpu_peak_kind_name(k), err);
    return g;
}

static void test_every_available_loop_is_plausible(void)
{
    struct threadpool *tp = tp_create(1);
    CHECK(tp != NULL, "thread pool");
    if (!tp) return;
    double g[CPU_PEAK_KIND_COUNT_] = { 0 };
    for (int k = 0; k < CPU_PEAK_KIND_COUNT_; k++) {
        if (!cpu_peak_kind_available((enum cpu_peak_kind)k)) continue;
        g[k] = measure(tp, (enum cpu_peak_kind)k);
        double ginstr = g[k] / ops_of((enum cpu_peak_kind)k); /* G instructions / s */
        CHECK(ginstr > 0.05 * 0.5 && ginstr < 4 * 6.0, "%s: %.1f GOP/s = %.2f G instructions/s",
              cpu_peak_kind_name((enum cpu_peak_kind)k), g[k], ginstr);
        printf("  %-32s %8.1f G(FL)OP/s (1 thread)\n", cpu_peak_kind_name((enum cpu_peak_kind)k), g[k]);
    }
    CHECK(g[CPU_PEAK_F32_SCALAR] > 0 && g[CPU_PEAK_I32_SCALAR] > 0, "the scalar loops always run");
    const struct {
        enum cpu_peak_kind fast, slow;
        double factor;
        const char *what;
    } ratios[] = {
        { CPU_PEAK_F32_FMA_YMM, CPU_PEAK_F32_SCALAR, 4, "ymm FMA vs scalar" },
        { CPU_PEAK_F32_FMA_ZMM, CPU_PEAK_F32_SCALAR, 4, "zmm FMA vs scalar" },
        { CPU_PEAK_I8_DPBUSD_YMM, CPU_PEAK_F32_FMA_YMM, 1.5, "int8 dot vs f32 FMA, ymm" },
        { CPU_PEAK_I8_DPBUSD_ZMM, CPU_PEAK_F32_FMA_ZMM, 1.5, "int8 dot vs f32 FMA, zmm" },
        /* vdpbf16ps zmm issues at a half (1.0x the FMA's FLOPs) or a quarter (0.5x: measured
           on an AVX512-BF16 / AMX Xeon, with 12 and with 24 independent accumulators alike)
           of the FMA's rate; a loop bound by its latency instead falls to ~0.2x */
        { CPU_PEAK_BF16_DPBF16_ZMM, CPU_PEAK_F32_FMA_ZMM, 0.4, "bf16 dot vs f32 FMA, zmm" },
        { CPU_PEAK_I8_MADDUBS_YMM, CPU_PEAK_I32_SCALAR, 8, "maddubs pair vs scalar int32" },
    };
    for (size_t i = 0; i < sizeof ratios / sizeof ratios[0]; i++) {
        enum cpu_peak_kind a = ratios[i].fast, b = ratios[i].slow;
        if (g[a] <= 0 || g[b] <= 0) continue; /* not on this CPU or build */
        /* a ratio that misses is measured again, both loops back to back (a busy machine
           slows both alike), up to 6 rounds; the best round's ratio counts */
        double ra = g[a], rb = g[b];
        for (int round = 1; round < 7 && !(ra > ratios[i].factor * rb); round++) {
            double ga = measure(tp, a), gb = measure(tp, b);
            if (ga * rb > ra * gb) {
                ra = ga;
                rb = gb;
            }
        }
        CHECK(ra > ratios[i].factor * rb, "%s: %.1f vs %.1f G(FL)OP/s, wanted %.1fx", ratios[i].what, ra, rb,
              ratios[i].factor);
    }
    tp_free(tp);
}

static void test_unavailable_kind_is_an_error(void)
{
    struct threadpool *tp = tp_create(1);
    char err[ERR_BUF] = "";
    double g = 1;
    int rc = cpu_peak_measure(tp, CPU_PEAK_KIND_COUNT_, 0.01, 1, &g, err, sizeof err);
    CHECK(rc == ERR_UNSUPPORTED && g == 0 && err[0], "rc %d g %g err '%s'", rc, g, err);
    CHECK(!cpu_peak_kind_available(CPU_PEAK_KIND_COUNT_), "out of range kind");
    tp_free(tp);
}

static bool is_int8(enum cpu_peak_kind k)
{
    return k == CPU_PEAK_I8_DPBUSD_ZMM || k == CPU_PEAK_I8_DPBUSD_YMM || k == CPU_PEAK_I8_MADDUBS_YMM;
}

static void test_kind_follows_kernel_set_and_type(void)
{
    const struct quant_impl *sc = quant_impl_scalar();
    CHECK(cpu_peak_kind_for(sc, DT_Q4_1) == CPU_PEAK_I32_SCALAR, "scalar set, Q4_1");
    CHECK(cpu_peak_kind_for(sc, DT_F16) == CPU_PEAK_F32_SCALAR, "scalar set, F16");
    CHECK(cpu_peak_kind_for(NULL, DT_Q8_0) == cpu_peak_kind_for(quant_impl_best(), DT_Q8_0), "NULL = default set");
    const struct quant_impl *sets[8];
    int n = quant_impl_simd_list(sets, 8);
    for (int i = 0; i < n; i++) {
        const enum dtype quant[] = { DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q6_K };
        for (size_t t = 0; t < sizeof quant / sizeof quant[0]; t++) {
            enum cpu_peak_kind k = cpu_peak_kind_for(sets[i], quant[t]);
            CHECK(is_int8(k), "%s %s -> %s", sets[i]->name, dtype_name(quant[t]), cpu_peak_kind_name(k));
            CHECK(cpu_peak_kind_available(k), "%s %s -> %s not available on the CPU the set runs on",
                  sets[i]->name, dtype_name(quant[t]), cpu_peak_kind_name(k));
        }
        enum cpu_peak_kind kf = cpu_peak_kind_for(sets[i], DT_F16);
        CHECK(kf == CPU_PEAK_F32_FMA_YMM || kf == CPU_PEAK_F32_FMA_ZMM, "%s F16 -> %s", sets[i]->name,
              cpu_peak_kind_name(kf));
#ifdef GEMM_HAVE_AVX512
        if (sets[i]->gemm == &quant_gemm_avx512) { /* the AVX-512 batched kernels: zmm */
            CHECK(cpu_peak_kind_for(sets[i], DT_Q4_1) == CPU_PEAK_I8_DPBUSD_ZMM, "%s Q4_1", sets[i]->name);
            CHECK(kf == CPU_PEAK_F32_FMA_ZMM, "%s F16", sets[i]->name);
#ifdef GEMM_BF16_DOT
            CHECK(cpu_peak_kind_for(sets[i], DT_BF16) == CPU_PEAK_BF16_DPBF16_ZMM, "%s BF16", sets[i]->name);
#else
            CHECK(cpu_peak_kind_for(sets[i], DT_BF16) == CPU_PEAK_F32_FMA_ZMM, "%s BF16", sets[i]->name);
#endif
        }
#endif
#ifdef GEMM_HAVE_AVX2
        if (sets[i]->gemm == &quant_gemm_avx2) { /* the AVX2 batched kernels: maddubs, ymm FMAs */
            CHECK(cpu_peak_kind_for(sets[i], DT_Q4_1) == CPU_PEAK_I8_MADDUBS_YMM, "%s Q4_1", sets[i]->name);
            CHECK(cpu_peak_kind_for(sets[i], DT_Q4_K) == CPU_PEAK_I8_MADDUBS_YMM, "%s Q4_K", sets[i]->name);
            CHECK(cpu_peak_kind_for(sets[i], DT_Q6_K) == CPU_PEAK_I8_MADDUBS_YMM, "%s Q6_K", sets[i]->name);
            CHECK(sets[i]->gemm->strip_rows[DT_Q4_K] && sets[i]->gemm->strip_rows[DT_Q6_K],
                  "%s: K-quants packed (their kind is the packed kernels')", sets[i]->name);
            CHECK(kf == CPU_PEAK_F32_FMA_YMM, "%s F16", sets[i]->name);
        }
#endif
    }
}

int main(void)
{
    RUN(test_every_available_loop_is_plausible);
    RUN(test_unavailable_kind_is_an_error);
    RUN(test_kind_follows_kernel_set_and_type);
    return test_summary();
}
