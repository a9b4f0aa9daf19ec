/* peak.c — register-only loops of the matmul kernels' instructions (see peak.h), one per
 * enum cpu_peak_kind, run on every thread of a pool.
 *
 * Each SIMD loop is compiled for its own instruction set with a target attribute, so it
 * exists whatever -march the build uses, and runs only where the CPU reports the feature
 * (__builtin_cpu_supports). Every SIMD loop body is the instruction itself in asm on 12
 * independent accumulators (more than the widest latency x throughput product among
 * these instructions, 5 x 2), so the compiler can neither hoist, merge nor spill the
 * work; the accumulators are summed at the end into a sink the caller keeps. The scalar
 * loops stay in C (they stand for the portable kernels, which are C too). Which instruction a kernel set uses for a weight
 * type mirrors quant_dot_x86.c, gemm_avx512.c and gemm_avx2.c (cpu_peak_kind_for).
 */
#include "backend/cpu/peak.h"
#include "backend/cpu/quant_kernels.h"
#include "util/err.h"
#include "util/threadpool.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define PEAK_X86 1
#include <immintrin.h>
#endif

#define PEAK_ACC 12
#define PEAK_MAX_THREADS 256

static const struct {
    const char *name;
    double ops; /* per instruction (per pair for maddubs, per multiply + add for scalar) */
} kind_info[CPU_PEAK_KIND_COUNT_] = {
    [CPU_PEAK_I8_DPBUSD_ZMM] = { "vpdpbusd zmm (int8)", 2.0 * 64 },
    [CPU_PEAK_I8_DPBUSD_YMM] = { "vpdpbusd ymm (int8)", 2.0 * 32 },
    [CPU_PEAK_I8_MADDUBS_YMM] = { "vpmaddubsw+vpmaddwd ymm (int8)", 2.0 * 32 },
    [CPU_PEAK_F32_FMA_ZMM] = { "vfmadd231ps zmm (f32)", 2.0 * 16 },
    [CPU_PEAK_F32_FMA_YMM] = { "vfmadd231ps ymm (f32)", 2.0 * 8 },
    [CPU_PEAK_F32_SCALAR] = { "scalar mul+add (f32)", 2.0 },
    [CPU_PEAK_I32_SCALAR] = { "scalar mul+add (int32)", 2.0 },
    [CPU_PEAK_BF16_DPBF16_ZMM] = { "vdpbf16ps zmm (bf16)", 2.0 * 32 },
};

const char *cpu_peak_kind_name(enum cpu_peak_kind k)
{
    return (unsigned)k < CPU_PEAK_KIND_COUNT_ ? kind_info[k].name : "unknown";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the loops: each runs iters x PEAK_ACC instructions and returns a sink ---- */

#ifdef PEAK_X86
/* The whole loop is one asm statement: the twelve accumulators are register operands
 * (loaded once before, stored once after), the body one instruction (or pair) per
 * accumulator, then a count down; the compiler can neither drop, hoist, merge nor spill
 * the work. iters >= 1. */
#define PEAK_OPS(c)                                                                          \
    [a0] c(a[0]), [a1] c(a[1]), [a2] c(a[2]), [a3] c(a[3]), [a4] c(a[4]), [a5] c(a[5]),     \
    [a6] c(a[6]), [a7] c(a[7]), [a8] c(a[8]), [a9] c(a[9]), [a10] c(a[10]), [a11] c(a[11])
#define PEAK_LOOP(X) "1:\n\t" PEAK_TEXT(X) "dec %[n]\n\tjnz 1b\n\t"
#define PEAK_TEXT(X) X("0") X("1") X("2") X("3") X("4") X("5") X("6") X("7") X("8") X("9") X("10") X("11")
#define PEAK_RW_V(x) "+v"(x)
#define PEAK_RW_X(x) "+x"(x)

#define DPBUSD(n) "vpdpbusd %[v], %[u], %[a" n "]\n\t"
#define DPBUSD_VEX(n) "%{vex%} vpdpbusd %[v], %[u], %[a" n "]\n\t"
#define FMA231(n) "vfmadd231ps %[v], %[u], %[a" n "]\n\t"
#define DPBF16(n) "vdpbf16ps %[v], %[u], %[a" n "]\n\t"
#define MADDUBS(n) "vpmaddubsw %[v], %[a" n "], %[t]\n\tvpmaddwd %[u], %[t], %[a" n "]\n\t"

__attribute__((target("avx512f,avx512vnni"))) static int64_t loop_dpbusd_zmm(long iters)
{
    __m512i a[PEAK_ACC], u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
    for (int k = 0; k < PEAK_ACC; k++) a[k] = _mm512_set1_epi32(k);
    __asm__ volatile(PEAK_LOOP(DPBUSD) : PEAK_OPS(PEAK_RW_V), [n] "+r"(iters) : [u] "v"(u), [v] "v"(v) : "cc");
    __m512i s = a[0];
    for (int k = 1; k < PEAK_ACC; k++) s = _mm512_add_epi32(s, a[k]);
    /* a sink, not a sum: the lanes have wrapped (int64, so adding them cannot overflow) */
    return (int64_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(s)) +
           (int64_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(s, 3), 3);
}

__attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))) static int64_t loop_dpbusd_ymm_evex(long iters)
{
    __m256i a[PEAK_ACC], u = _mm256_set1_epi8(3), v = _mm256_set1_epi8(-2);
    for (int k = 0; k < PEAK_ACC; k++) a[k] = _mm256_set1_epi32(k);
    __asm__ volatile(PEAK_LOOP(DPBUSD) : PEAK_OPS(PEAK_RW_V), [n] "+r"(iters) : [u] "v"(u), [v] "v"(v) : "cc");
    __m256i s = a[0];
    for (int k = 1; k < PEAK_ACC; k++) s = _mm256_add_epi32(s, a[k]);
    return (int64_t)_mm256_extract_epi32(s, 0) + (int64_t)_mm256_extract_epi32(s, 7);
}

#if defined(__AVXVNNI__)
/* The VEX form, for CPUs with AVX-VNNI but no AVX-512 (builds made for them define
 * __AVXVNNI__, as quant_dot_x86.c's QK_VNNI == 2 kernels need). */
static int64_t loop_dpbusd_ymm_vex(long iters)
{
    __m256i a[PEAK_ACC], u = _mm256_set1_epi8(3), v = _mm256_set1_epi8(-2);
    for (int k = 0; k < PEAK_ACC; k++) a[k] = _mm256_set1_epi32(k);
    __asm__ volatile(PEAK_LOOP(DPBUSD_VEX) : PEAK_OPS(PEAK_RW_X), [n] "+r"(iters) : [u] "x"(u), [v] "x"(v) : "cc");
    __m256i s = a[0];
    for (int k = 1; k < PEAK_ACC; k++) s = _mm256_add_epi32(s, a[k]);
    return (int64_t)_mm256_extract_epi32(s, 0) + (int64_t)_mm256_extract_epi32(s, 7);
}
#endif

/* Each accumulator is the next unsigned operand of its pair (the pair of the kernels:
 * u8 x s8 products summed in twos, then the int16 sums in twos by a multiply with 1);
 * one scratch register t (15 of the 16 ymm registers AVX2 has). */
__attribute__((target("avx2"))) static int64_t loop_maddubs_ymm(long iters)
{
    __m256i a[PEAK_ACC], t = _mm256_setzero_si256(), u = _mm256_set1_epi16(1), v = _mm256_set1_epi8(-2);
    for (int k = 0; k < PEAK_ACC; k++) a[k] = _mm256_set1_epi32(k);
    __asm__ volatile(PEAK_LOOP(MADDUBS) : PEAK_OPS(PEAK_RW_X), [n] "+r"(iters), [t] "+x"(t) : [u] "x"(u), [v] "x"(v) : "cc");
    __m256i s = a[0];
    for (int k = 1; k < PEAK_ACC; k++) s = _mm256_add_epi32(s, a[k]);
    return (int64_t)_mm256_extract_epi32(s, 0) + (int64_t)_mm256_extract_epi32(s, 7);
}

__attribute__((target("avx512f"))) static int64_t loop_fma_zmm(long iters)
{
    __m512 a[PEAK_ACC], u = _mm512_set1_ps(1.0f), v = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < PEAK_ACC; k++) a[k] = _mm512_set1_ps((float)k);
    __asm__ volatile(PEAK_LOOP(FMA231) : PEAK_OPS(PEAK_RW_V), [n] "+r"(iters) : [u] "v"(u), [v] "v"(v) : "cc");
    __m512 s = a[0];
    for (int k = 1; k < PEAK_ACC; k++) s = _mm512_add_ps(s, a[k]);
    return (int64_t)_mm512_reduce_add_ps(s);
}

/* u and v are bf16 pairs of 1.0 and 1e-7 (bits 0x3F80 and 0x33D7), so the sums stay finite. */
__attribute__((target("avx512f,avx512bf16"))) static int64_t loop_dpbf16_zmm(long iters)
{
    __m512 a[PEAK_ACC];
    __m512i u = _mm512_set1_epi32(0x3F803F80), v = _mm512_set1_epi32(0x33D733D7);
    for (int k = 0; k < PEAK_ACC; k++) a[k] = _mm512_set1_ps((float)k);
    __asm__ volatile(PEAK_LOOP(DPBF16) : PEAK_OPS(PEAK_RW_V), [n] "+r"(iters) : [u] "v"(u), [v] "v"(v) : "cc");
    __m512 s = a[0];
    for (int k = 1; k < PEAK_ACC; k++) s = _mm512_add_ps(s, a[k]);
    return (int64_t)_mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static int64_t loop_fma_ymm(long iters)
{
    __m256 a[PEAK_ACC], u = _mm256_set1_ps(1.0f), v = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < PEAK_ACC; k++) a[k] = _mm256_set1_ps((float)k);
    __asm__ volatile(PEAK_LOOP(FMA231) : PEAK_OPS(PEAK_RW_X), [n] "+r"(iters) : [u] "x"(u), [v] "x"(v) : "cc");
    __m256 s = a[0];
    for (int k = 1; k < PEAK_ACC; k++) s = _mm256_add_ps(s, a[k]);
    float f[8];
    _mm256_storeu_ps(f, s);
    return (int64_t)(f[0] + f[7]);
}
#endif

/* The scalar loops: vectorizing them would measure a different instruction, so the
 * vectorizer is off for them (GCC; other compilers do not vectorize these chains at -O2). */
#if defined(__GNUC__) && !defined(__clang__)
#define PEAK_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#else
#define PEAK_NO_VECTORIZE
#endif

PEAK_NO_VECTORIZE static int64_t loop_scalar_f32(long iters)
{
    volatile float vu = 0.999f, vv = 1e-3f;
    float a[PEAK_ACC], u = vu, v = vv;
    for (int k = 0; k < PEAK_ACC; k++) a[k] = (float)k;
    for (long i = 0; i < iters; i++) {
        _Pragma("GCC unroll 12") for (int k = 0; k < PEAK_ACC; k++) a[k] = a[k] * u + v;
    }
    float s = 0;
    for (int k = 0; k < PEAK_ACC; k++) s += a[k];
    return (int64_t)s;
}

PEAK_NO_VECTORIZE static int64_t loop_scalar_i32(long iters)
{
    volatile uint32_t vu = 3, vv = 5;
    uint32_t a[PEAK_ACC], u = vu, v = vv; /* unsigned: wraps, never overflows */
    for (int k = 0; k < PEAK_ACC; k++) a[k] = (uint32_t)k;
    for (long i = 0; i < iters; i++) {
        _Pragma("GCC unroll 12") for (int k = 0; k < PEAK_ACC; k++) a[k] = a[k] * u + v;
    }
    uint32_t s = 0;
    for (int k = 0; k < PEAK_ACC; k++) s += a[k];
    return (int64_t)s;
}

bool cpu_peak_kind_available(enum cpu_peak_kind k)
{
    switch (k) {
#ifdef PEAK_X86
    case CPU_PEAK_I8_DPBUSD_ZMM:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
    case CPU_PEAK_I8_DPBUSD_YMM:
#if defined(__AVXVNNI__)
        if (__builtin_cpu_supports("avxvnni")) return true;
#endif
        return __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    case CPU_PEAK_I8_MADDUBS_YMM:
        return __builtin_cpu_supports("avx2");
    case CPU_PEAK_F32_FMA_ZMM:
        return __builtin_cpu_supports("avx512f");
    case CPU_PEAK_F32_FMA_YMM:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CPU_PEAK_BF16_DPBF16_ZMM:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#endif
    case CPU_PEAK_F32_SCALAR:
    case CPU_PEAK_I32_SCALAR:
        return true;
    default:
        return false;
    }
}

static int64_t run_loop(enum cpu_peak_kind k, long iters)
{
    switch (k) {
#ifdef PEAK_X86
    case CPU_PEAK_I8_DPBUSD_ZMM: return loop_dpbusd_zmm(iters);
    case CPU_PEAK_I8_DPBUSD_YMM:
#if defined(__AVXVNNI__)
        if (!__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni"))
            return loop_dpbusd_ymm_vex(iters);
#endif
        return loop_dpbusd_ymm_evex(iters);
    case CPU_PEAK_I8_MADDUBS_YMM: return loop_maddubs_ymm(iters);
    case CPU_PEAK_F32_FMA_ZMM: return loop_fma_zmm(iters);
    case CPU_PEAK_F32_FMA_YMM: return loop_fma_ymm(iters);
    case CPU_PEAK_BF16_DPBF16_ZMM: return loop_dpbf16_zmm(iters);
#endif
    case CPU_PEAK_F32_SCALAR: return loop_scalar_f32(iters);
    case CPU_PEAK_I32_SCALAR: return loop_scalar_i32(iters);
    default: return 0; /* unreachable: cpu_peak_measure checks availability first */
    }
}

/* ---- which instruction a kernel set uses ---- */

static bool is_float(enum dtype t) { return t == DT_F32 || t == DT_F16 || t == DT_BF16; }

enum cpu_peak_kind cpu_peak_kind_for(const struct quant_impl *impl, enum dtype wtype)
{
    if (!impl) impl = quant_impl_best();
    if (impl == quant_impl_scalar()) return is_float(wtype) ? CPU_PEAK_F32_SCALAR : CPU_PEAK_I32_SCALAR;
#ifdef GEMM_HAVE_AVX512
    /* gemm_avx512.c: float tiles on vfmadd231ps zmm (BF16 on vdpbf16ps zmm in builds
     * with GEMM_BF16_DOT), quantized types (32-block and K-quants) on vpdpbusd zmm */
    if (impl->gemm == &quant_gemm_avx512 && impl->gemm->strip_rows[wtype]) {
#ifdef GEMM_BF16_DOT
        if (wtype == DT_BF16) return CPU_PEAK_BF16_DPBF16_ZMM;
#endif
        return is_float(wtype) ? CPU_PEAK_F32_FMA_ZMM : CPU_PEAK_I8_DPBUSD_ZMM;
    }
#endif
#ifdef GEMM_HAVE_AVX2
    /* gemm_avx2.c: float tiles on vfmadd231ps ymm, quantized types (32-block and K-quants)
     * on vpmaddubsw + vpmaddwd */
    if (impl->gemm == &quant_gemm_avx2 && impl->gemm->strip_rows[wtype])
        return is_float(wtype) ? CPU_PEAK_F32_FMA_YMM : CPU_PEAK_I8_MADDUBS_YMM;
#endif
    /* quant_dot_x86.c, per-token dots: floats on ymm FMAs; K-quants on maddubs + madd;
     * Q4_1 / Q5_1 of the AVX-512 sets on zmm vpdpbusd; the other 32-block quants on ymm
     * vpdpbusd where the build has VNNI, else maddubs + madd. */
    if (is_float(wtype)) return CPU_PEAK_F32_FMA_YMM;
    if (wtype == DT_Q4_K || wtype == DT_Q6_K) return CPU_PEAK_I8_MADDUBS_YMM;
    if ((wtype == DT_Q4_1 || wtype == DT_Q5_1) && !strncmp(impl->name, "avx512", 6)) return CPU_PEAK_I8_DPBUSD_ZMM;
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
    return CPU_PEAK_I8_DPBUSD_YMM;
#else
    return CPU_PEAK_I8_MADDUBS_YMM;
#endif
}

/* ---- measurement ---- */

struct peak_job {
    enum cpu_peak_kind kind;
    long iters;
    int64_t sink[PEAK_MAX_THREADS * 8]; /* one cache line per thread */
};

static void peak_task(void *arg, int ith, int nth)
{
    (void)nth;
    struct peak_job *j = arg;
    int64_t s = run_loop(j->kind, j->iters);
    if (ith < PEAK_MAX_THREADS) j->sink[ith * 8] = s;
}

int cpu_peak_measure(struct threadpool *tp, enum cpu_peak_kind k, double seconds, int reps, double *gops,
                     char *err, size_t errlen)
{
    *gops = 0;
    if ((unsigned)k >= CPU_PEAK_KIND_COUNT_ || !cpu_peak_kind_available(k))
        return err_set(err, errlen, ERR_UNSUPPORTED, "this CPU or build has no %s", cpu_peak_kind_name(k));
    if (seconds <= 0) seconds = 0.05;
    if (reps <= 0) reps = 3;
    struct peak_job job = { .kind = k, .iters = 1000 }, *j = &job; /* 16 KB of stack */
    /* calibrate: grow the count until a run takes a tenth of the target */
    double el;
    for (;;) {
        double t0 = now_s();
        tp_run(tp, peak_task, j);
        el = now_s() - t0;
        if (el >= seconds / 10 || j->iters > (1L << 40)) break;
        j->iters *= 4;
    }
    j->iters = (long)((double)j->iters * seconds / (el > 0 ? el : 1e-9)) + 1;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        tp_run(tp, peak_task, j);
        el = now_s() - t0;
        double g = (double)tp_size(tp) * (double)j->iters * PEAK_ACC * kind_info[k].ops / el / 1e9;
        if (g > best) best = g;
    }
    *gops = best;
    return 0;
}
