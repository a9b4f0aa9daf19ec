/* quant_dot_avx2.c — the SIMD kernel set (x86-64 AVX2 + FMA + F16C; AVX512-VNNI/VL and
 * AVX512BW used where the build enables them). Same math as quant_dot_scalar.c (see its
 * header); this file only changes how the integer block sums are formed:
 *   - 32 weight codes and 32 int8 activations sit in one 256-bit register each;
 *   - unsigned x signed byte products summed in fours: _mm256_dpbusd_epi32 (VNNI), else
 *     _mm256_maddubs_epi16 + _mm256_madd_epi16(.., 1). Signed weights (Q8_0, Q4_0, Q5_0)
 *     use the sign trick |w| * (sign(w) x), which is exact: |w| <= 128, |x| <= 127, so a
 *     maddubs pair is <= 2*128*127 < 32767 and never saturates;
 *   - per block, the 8 int32 lanes are converted to f32 and FMA'd with dw*dx into a vector
 *     accumulator (four blocks per iteration, scales converted four at a time, four
 *     accumulators to hide FMA latency);
 *   - K-quants form int16 pair sums with maddubs and apply the 6/8-bit sub-block scales
 *     with madd, so a whole 256-super-block accumulates in int32 before one f32 FMA.
 * One call = one row x one activation row, single-threaded; cpu_matmul parallelises.
 * Loads are unaligned (GGUF blocks are 18..210 bytes, so rows are not 32-byte aligned).
 */
#include "backend/cpu/quant_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "util/half.h"

#include <immintrin.h>
#include <string.h>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QK_VNNI 1
#define QK_NAME "avx2+avx512vnni"
#elif defined(__AVXVNNI__)
#define QK_VNNI 2
#define QK_NAME "avx2+avxvnni"
#else
#define QK_VNNI 0
#define QK_NAME "avx2"
#endif

static inline float ld_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* [f16 at p, f16 at p+2] -> floats in lanes 0, 1 */
static inline __m128 ld_f16x2(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum8i(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* sum of u[4k..4k+3] * s[4k..4k+3] per int32 lane; u unsigned, s signed bytes */
static inline __m256i dot_us8(__m256i u, __m256i s)
{
#if QK_VNNI == 1
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif QK_VNNI == 2
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* signed x signed via |a| * sign(b, a) */
static inline __m256i dot_ss8(__m256i a, __m256i b)
{
    return dot_us8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* 16 packed bytes -> 32 nibbles: low nibbles in bytes 0..15, high nibbles in 16..31 */
static inline __m256i unpack_nibbles(const uint8_t *p)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits (u32 LE at p) -> bytes: 0x10 where bit j is set, else 0 */
static inline __m256i bits_to_0x10(const uint8_t *p)
{
    uint32_t qh;
    memcpy(&qh, p, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10));
#else
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
#endif
}

/* ---- activation quantization (bytes identical to quantize_scalar) ---- */

static void quantize_avx2(enum dtype act, const float *x, int64_t b0, int64_t b1,
                          const struct qact *out)
{
    const int qa = act == DT_Q8_K ? 256 : 32;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = b0; b < b1; b++) {
        const float *xb = x + b * qa;
        int8_t *q = out->q + b * qa; /* Q8_0 / Q8_K */
        __m256 mx = _mm256_setzero_ps();
        for (int j = 0; j < qa; j += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(absmask, _mm256_loadu_ps(xb + j)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
        __m256i sum = _mm256_setzero_si256();
        for (int j = 0; j < qa; j += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++) {
                __m256 f = _mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * k), vid);
                f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
                v[k] = _mm256_cvtps_epi32(f);
            }
            if (act == DT_Q8_K) {
                out->bsums[b * 16 + j / 16] = (int16_t)hsum8i(_mm256_add_epi32(v[0], v[1]));
                out->bsums[b * 16 + j / 16 + 1] = (int16_t)hsum8i(_mm256_add_epi32(v[2], v[3]));
            } else {
                sum = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
            }
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            p = _mm256_permutevar8x32_epi32(p, perm);
            if (act == DT_Q8_1) { /* regrouped layout (quant_kernels.h) */
                _mm_storeu_si128((__m128i *)(out->q + q81_lo(b)), _mm256_castsi256_si128(p));
                _mm_storeu_si128((__m128i *)(out->q + q81_hi(b)), _mm256_extracti128_si256(p, 1));
            } else {
                _mm256_storeu_si256((__m256i *)(q + j), p);
            }
        }
        if (act == DT_Q8_1) {
            out->ds[2 * b] = d;
            out->ds[2 * b + 1] = d * (float)hsum8i(sum);
        } else {
            out->d[b] = d;
        }
    }
}

/* ---- float weights ---- */

static float dot1_f32(int64_t n, const void *w, const struct qact *xq, const float *x)
{
    (void)xq;
    const float *wf = w;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += wf[i] * x[i];
    return s;
}

static inline __m256 ld8_f16(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 ld8_bf16(const uint8_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define DOT_HALF(NAME, LD8, SCALAR)                                                      \
    static float NAME(int64_t n, const void *w, const struct qact *xq, const float *x)  \
    {                                                                                    \
        (void)xq;                                                                        \
        const uint8_t *p = w;                                                            \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                      \
        int64_t i = 0;                                                                   \
        for (; i + 32 <= n; i += 32) {                                                   \
            a0 = _mm256_fmadd_ps(LD8(p + 2 * i), _mm256_loadu_ps(x + i), a0);            \
            a1 = _mm256_fmadd_ps(LD8(p + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);   \
            a2 = _mm256_fmadd_ps(LD8(p + 2 * i + 32), _mm256_loadu_ps(x + i + 16), a2);  \
            a3 = _mm256_fmadd_ps(LD8(p + 2 * i + 48), _mm256_loadu_ps(x + i + 24), a3);  \
        }                                                                                \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LD8(p + 2 * i), _mm256_loadu_ps(x + i), a0); \
        float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));   \
        for (; i < n; i++) {                                                             \
            uint16_t h;                                                                  \
            memcpy(&h, p + 2 * i, 2);                                                    \
            s += SCALAR(h) * x[i];                                                       \
        }                                                                                \
        return s;                                                                        \
    }

DOT_HALF(dot1_f16, ld8_f16, fp16_to_fp32)
DOT_HALF(dot1_bf16, ld8_bf16, bf16_to_fp32)

/* ---- 32-element blocks: per-block int32 lanes, then f32 FMA with dw*dx ----
 *
 * Four blocks per iteration. Their scales are converted together: the four fp16 d (or
 * the four (d, m) pairs of Q?_1) go through one vcvtph2ps and one multiply with the
 * activation scales (d, or the interleaved (d, s) pairs of Q8_1), and block k's
 * multiplier is broadcast from that vector with one vpermps. For Q?_1 the odd lanes of
 * the same product are m_b * s_b, summed into macc and read once at the end. Four
 * accumulators keep four independent FMA chains.
 */

static inline uint32_t rd32u(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t rd16u(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Software prefetch QK_PF bytes ahead of the weight stream (the rest of the row, then
 * the next rows of this thread's range): one decode pass touches each weight line once,
 * and with ~10 instructions per 20-byte block the out-of-order window alone keeps too
 * few lines in flight to cover DRAM latency. Prefetching past the end of the matrix is
 * harmless (prefetches do not fault). Distance 384 B measured best here from DRAM (1 KB
 * cost Q8_0 ~20%; see docs/cpu-kernels.md); -DQK_PF=-1 disables, -DQK_PF_ONE=1 issues one
 * prefetch per step instead of one per 64 bytes (both for experiments). */
#ifndef QK_PF_ONE
#define QK_PF_ONE 0
#endif
#ifndef QK_PF
#define QK_PF 384
#endif
#if QK_PF < 0
#define PREFETCH_AHEAD(b, span) ((void)(b))
#else
#define PREFETCH_AHEAD(b, span)                                                          \
    do {                                                                                 \
        _mm_prefetch((const char *)(b) + QK_PF, _MM_HINT_T0);                            \
        if (!QK_PF_ONE && (span) > 64) _mm_prefetch((const char *)(b) + QK_PF + 64, _MM_HINT_T0); \
        if ((span) > 128) _mm_prefetch((const char *)(b) + QK_PF + 128, _MM_HINT_T0);    \
    } while (0)
#endif

#define XQ(i) _mm256_loadu_si256((const __m256i *)(xq->q + (i) * 32))

#define LANES_Q8_0(b, i) dot_ss8(_mm256_loadu_si256((const __m256i *)((b) + 2)), XQ(i))
#define LANES_Q4_0(b, i) dot_ss8(_mm256_sub_epi8(unpack_nibbles((b) + 2), _mm256_set1_epi8(8)), XQ(i))
/* Q8_1 codes of block i in element order (two 16-byte halves of the regrouped layout) */
#define XQ1(i) _mm256_loadu2_m128i((const __m128i *)(xq->q + q81_hi(i)), (const __m128i *)(xq->q + q81_lo(i)))
#define LANES_Q4_1(b, i) dot_us8(unpack_nibbles((b) + 4), XQ1(i))
#define LANES_Q5_0(b, i) \
    dot_ss8(_mm256_sub_epi8(_mm256_or_si256(unpack_nibbles((b) + 6), bits_to_0x10((b) + 2)), \
                            _mm256_set1_epi8(16)), XQ(i))
#define LANES_Q5_1(b, i) dot_us8(_mm256_or_si256(unpack_nibbles((b) + 8), bits_to_0x10((b) + 4)), XQ1(i))

/* Q8_0 activations: d only; weight d is the fp16 at the block start */
#define DOT_BLOCKS32_D(NAME, BB, LANES)                                                  \
    static inline float NAME(int64_t n, const void *w, const struct qact *xq, const float *xf) \
    {                                                                                    \
        (void)xf;                                                                        \
        const uint8_t *wb = w;                                                           \
        const int64_t nb = n / 32;                                                       \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;        \
        int64_t i = 0;                                                                   \
        for (; i + 4 <= nb; i += 4) {                                                    \
            const uint8_t *b = wb + i * BB;                                              \
            PREFETCH_AHEAD(b, 4 * BB);                                                   \
            uint64_t h4 = rd16u(b) | rd16u(b + BB) << 16 | rd16u(b + 2 * BB) << 32 |     \
                          rd16u(b + 3 * BB) << 48;                                       \
            __m128 s4 = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h4)),       \
                                   _mm_loadu_ps(xq->d + i));                             \
            __m256 sc = _mm256_castps128_ps256(s4);                                      \
            acc0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(0)),   \
                                   _mm256_cvtepi32_ps(LANES(b, i)), acc0);               \
            acc1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(1)),   \
                                   _mm256_cvtepi32_ps(LANES(b + BB, i + 1)), acc1);      \
            acc2 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(2)),   \
                                   _mm256_cvtepi32_ps(LANES(b + 2 * BB, i + 2)), acc2);  \
            acc3 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(3)),   \
                                   _mm256_cvtepi32_ps(LANES(b + 3 * BB, i + 3)), acc3);  \
        }                                                                                \
        for (; i < nb; i++) {                                                            \
            const uint8_t *b = wb + i * BB;                                              \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(ld_f16(b) * xq->d[i]),                 \
                                   _mm256_cvtepi32_ps(LANES(b, i)), acc0);               \
        }                                                                                \
        return hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))); \
    }

/* Q8_1 activations: (d, s) pairs; weight (d, m) are the two fp16 at the block start */
#define DOT_BLOCKS32_DM(NAME, BB, LANES)                                                 \
    static inline float NAME(int64_t n, const void *w, const struct qact *xq, const float *xf) \
    {                                                                                    \
        (void)xf;                                                                        \
        const uint8_t *wb = w;                                                           \
        const int64_t nb = n / 32;                                                       \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;        \
        __m256 macc = _mm256_setzero_ps();                                               \
        int64_t i = 0;                                                                   \
        for (; i + 4 <= nb; i += 4) {                                                    \
            const uint8_t *b = wb + i * BB;                                              \
            PREFETCH_AHEAD(b, 4 * BB);                                                   \
            __m128i dm = _mm_setr_epi32((int)rd32u(b), (int)rd32u(b + BB),               \
                                        (int)rd32u(b + 2 * BB), (int)rd32u(b + 3 * BB)); \
            __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(dm), _mm256_loadu_ps(xq->ds + 2 * i)); \
            macc = _mm256_add_ps(macc, sc);                                              \
            acc0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(0)),   \
                                   _mm256_cvtepi32_ps(LANES(b, i)), acc0);               \
            acc1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(2)),   \
                                   _mm256_cvtepi32_ps(LANES(b + BB, i + 1)), acc1);      \
            acc2 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(4)),   \
                                   _mm256_cvtepi32_ps(LANES(b + 2 * BB, i + 2)), acc2);  \
            acc3 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(6)),   \
                                   _mm256_cvtepi32_ps(LANES(b + 3 * BB, i + 3)), acc3);  \
        }                                                                                \
        float m = hsum8(_mm256_blend_ps(_mm256_setzero_ps(), macc, 0xAA));               \
        for (; i < nb; i++) {                                                            \
            const uint8_t *b = wb + i * BB;                                              \
            __m128 s2 = _mm_mul_ps(ld_f16x2(b), _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(xq->ds + 2 * i))); \
            acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(s2), _mm256_cvtepi32_ps(LANES(b, i)), acc0); \
            m += _mm_cvtss_f32(_mm_movehdup_ps(s2));                                     \
        }                                                                                \
        return hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) + m; \
    }

DOT_BLOCKS32_D(dot1_q8_0, 34, LANES_Q8_0)
DOT_BLOCKS32_D(dot1_q4_0, 18, LANES_Q4_0)
DOT_BLOCKS32_D(dot1_q5_0, 22, LANES_Q5_0)
DOT_BLOCKS32_DM(dot1_q4_1, 20, LANES_Q4_1)
DOT_BLOCKS32_DM(dot1_q5_1, 24, LANES_Q5_1)

/* ---- K-quants x Q8_K ---- */

static float dot1_q4_k(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    float macc = 0.0f;
    for (int64_t i = 0; i < n / 256; i++, b += 144) {
        const int8_t *qx = xq->q + i * 256;
        const int16_t *bs = xq->bsums + i * 16;
        uint8_t sc[8], m[8];
        quant_q4k_scales(b + 4, sc, m);
        int summ = 0;
        for (int k = 0; k < 8; k++) summ += m[k] * (bs[2 * k] + bs[2 * k + 1]);
        __m256i sumi = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * k));
            __m256i lo = _mm256_and_si256(q4, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(qx + 64 * k)));
            __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qx + 64 * k + 32)));
            p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * k]));
            p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * k + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        __m128 dd = _mm_mul_ps(ld_f16x2(b), _mm_set1_ps(xq->d[i])); /* [d*dx, dmin*dx] */
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
        macc += _mm_cvtss_f32(_mm_movehdup_ps(dd)) * (float)summ;
    }
    return hsum8(acc) - macc;
}

static float dot1_q6_k(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    /* byte shuffles picking int16 scale 2j (low 128-bit lane) and 2j+1 (high lane) */
    __m256i pick[4];
    for (int j = 0; j < 4; j++) {
        int lo = (2 * j) * 2, hi = (2 * j + 1) * 2;
        pick[j] = _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                   lo, lo + 1, lo, lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                                   hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1);
    }
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++, b += 210) {
        const int8_t *qx = xq->q + i * 256;
        __m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
        /* offset: 32 * sum_g sc_g * bsum_g, folded into the int32 lanes */
        __m256i off = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                        _mm256_loadu_si256((const __m256i *)(xq->bsums + i * 16)));
        __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            __m256i sch = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(sc8, 8) : sc8));
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
            for (int j = 0; j < 4; j++) {
                __m256i y = _mm256_loadu_si256((const __m256i *)(qx + 128 * h + 32 * j));
                __m256i p = _mm256_maddubs_epi16(q[j], y);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sch, pick[j])));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(ld_f16(b + 208) * xq->d[i]), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

/* Row-run wrappers (QK_ROWS in quant_kernels.h) for the one-row kernels above. */
QK_ROWS_ALL()

/* ---- AVX-512 (F, BW, VL, VBMI, VNNI): Q4_1 / Q5_1, four 32-blocks per 512-bit step ----
 *
 * One group of 4 blocks (A, B, C, D) per step. Two 64-byte loads cover the group's GGUF
 * blocks; one two-source byte permute (vpermt2b) gathers the four blocks' 16 code bytes
 * as [A B C D]; low nibbles (and) and high nibbles (word shift + and) are then exactly
 * the element order of the regrouped Q8_1 activations (quant_kernels.h: [A0-15 .. D0-15]
 * and [A16-31 .. D16-31]), so two vpdpbusd into one register give each block's sum in 4
 * int32 lanes (lanes 0-3 A, 4-7 B, 8-11 C, 12-15 D). The group's four (d, m) pairs go
 * through one dword permute, one vcvtph2ps and one multiply with the activation (d, s)
 * pairs; the d products are spread to the 16 lanes with one vpermps, the m * s products
 * are summed in macc. Per group: 2 byte/dword permutes + 1 float permute, 3 logic ops,
 * 2 vpdpbusd, 1 convert, 1 FMA (the earlier layout needed 5 permutes and 2 FMAs).
 * A row whose block count is not a multiple of 4 (n_in = 576 is 18 blocks) ends with one
 * more step on masked loads, which read nothing past the row (masked-off bytes never
 * fault and load as zero, so missing blocks contribute 0).
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VBMI__) && defined(__AVX512VNNI__)
#define QK_HAVE_AVX512 1

#include "backend/cpu/avx512_bytes.h"

/* Masks for one group of k (1..4) blocks of bb bytes: weight loads at byte offsets 0 and
 * o1, each half (16 k bytes) of the activation codes, the k (d, s) pairs. */
struct step_masks { __mmask64 w0, w1, x; __mmask8 f; };

static inline struct step_masks step_masks(int k, int bb, int o1)
{
    struct step_masks m = { bytes_mask(k * bb), bytes_mask(k * bb - o1), bytes_mask(k * 16),
                            (__mmask8)bytes_mask(2 * k) };
    return m;
}

/* sums of the 4 blocks (lanes 4k..4k+3 = block k) from the unsigned 4-bit codes
 * [A B C D] (16 bytes each) and the group's 128 activation bytes */
static inline __m512i group_sums(__m512i lo, __m512i hi, const int8_t *xg, __mmask64 mx)
{
    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_maskz_loadu_epi8(mx, xg));
    return _mm512_dpbusd_epi32(p, hi, _mm512_maskz_loadu_epi8(mx, xg + 64));
}

/* acc += (dw dx)_block * sums; macc += [dw dx, m s] of the 4 blocks */
static inline __m512 group_scale(__m128i dm16, const float *ds, __mmask8 mf, __m512i sums, __m512 acc,
                                 __m256 *macc)
{
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(dm16), _mm256_maskz_loadu_ps(mf, ds));
    *macc = _mm256_add_ps(*macc, sc);
    return _mm512_fmadd_ps(_mm512_permutexvar_ps(spread, _mm512_castps256_ps512(sc)),
                           _mm512_cvtepi32_ps(sums), acc);
}

/* Q4_1 group: 4 blocks = 80 bytes (d, m, qs[16] each), z0 = b[0..63], z1 = b[16..79] */
static inline __m512 q4_1_group(const uint8_t *b, const int8_t *xg, const float *ds, struct step_masks m,
                                __m512 acc, __m256 *macc)
{
    const __m512i idx = quad_index(4, 24, 44, 64 + 48);
    const __m512i i_dm = _mm512_setr_epi32(0, 5, 10, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i z0 = _mm512_maskz_loadu_epi8(m.w0, b), z1 = _mm512_maskz_loadu_epi8(m.w1, b + 16);
    __m512i codes = _mm512_permutex2var_epi8(z0, idx, z1);
    __m512i lo = _mm512_and_si512(codes, m4), hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
    __m512i sums = group_sums(lo, hi, xg, m.x);
    return group_scale(_mm512_castsi512_si128(_mm512_permutexvar_epi32(i_dm, z0)), ds, m.f, sums, acc, macc);
}

/* Q5_1 group: 4 blocks = 96 bytes (d, m, qh[4], qs[16] each), z0 = b[0..63], z1 = b[32..95];
 * k = blocks present (the high bits are read with scalar loads, so only those). */
static inline __m512 q5_1_group(const uint8_t *b, int k, const int8_t *xg, const float *ds, struct step_masks m,
                                __m512 acc, __m256 *macc)
{
    const __m512i idx = quad_index(8, 32, 64 + 24, 64 + 48);
    const __m512i i_dm = _mm512_setr_epi32(0, 6, 12, 16 + 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m4 = _mm512_set1_epi8(0x0F), x10 = _mm512_set1_epi8(0x10);
    __m512i z0 = _mm512_maskz_loadu_epi8(m.w0, b), z1 = _mm512_maskz_loadu_epi8(m.w1, b + 32);
    __m512i codes = _mm512_permutex2var_epi8(z0, idx, z1);
    uint64_t hl = 0, hh = 0; /* 5th bits: elements 0-15 / 16-31 of each block, 16 bits per block */
    for (int j = 0; j < k; j++) {
        uint64_t h = rd32u(b + 24 * j + 4);
        hl |= (h & 0xFFFF) << (16 * j);
        hh |= (h >> 16) << (16 * j);
    }
    __m512i lo = _mm512_and_si512(codes, m4), hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
    lo = _mm512_mask_add_epi8(lo, (__mmask64)hl, lo, x10);
    hi = _mm512_mask_add_epi8(hi, (__mmask64)hh, hi, x10);
    __m512i sums = group_sums(lo, hi, xg, m.x);
    return group_scale(_mm512_castsi512_si128(_mm512_permutex2var_epi32(z0, i_dm, z1)), ds, m.f, sums, acc, macc);
}

#define DOT_DM_AVX512(NAME, BB, O1, GROUP_CALL)                                            \
    static void NAME(int64_t n, const void *w, size_t row_bytes, int64_t nrows,            \
                     const struct qact *xq, const float *xf, float *out)                   \
    {                                                                                      \
        (void)xf;                                                                          \
        const int64_t nb = n / 32, nfull = nb & ~(int64_t)3;                               \
        const int rem = (int)(nb & 3);                                                     \
        const struct step_masks full = step_masks(4, BB, O1), tail = step_masks(rem, BB, O1); \
        for (int64_t r = 0; r < nrows; r++) {                                              \
            const uint8_t *wb = (const uint8_t *)w + (size_t)r * row_bytes;                \
            __m512 acc = _mm512_setzero_ps();                                              \
            __m256 macc = _mm256_setzero_ps();                                             \
            int64_t i = 0;                                                                 \
            for (; i < nfull; i += 4) {                                                    \
                const uint8_t *b = wb + i * BB;                                            \
                PREFETCH_AHEAD(b, 4 * BB);                                                 \
                acc = GROUP_CALL(b, 4, full);                                              \
            }                                                                              \
            if (rem) {                                                                     \
                const uint8_t *b = wb + i * BB;                                            \
                acc = GROUP_CALL(b, rem, tail);                                            \
            }                                                                              \
            __m256 ms = _mm256_blend_ps(_mm256_setzero_ps(), macc, 0xAA);                  \
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc, _mm512_zextps256_ps512(ms))); \
        }                                                                                  \
    }

#define Q4_1_GROUP(b, k, m) q4_1_group(b, xq->q + 32 * i, xq->ds + 2 * i, m, acc, &macc)
#define Q5_1_GROUP(b, k, m) q5_1_group(b, k, xq->q + 32 * i, xq->ds + 2 * i, m, acc, &macc)
DOT_DM_AVX512(dot_q4_1_avx512, 20, 16, Q4_1_GROUP)
DOT_DM_AVX512(dot_q5_1_avx512, 24, 32, Q5_1_GROUP)

#endif

static const struct quant_impl impl_avx2 = {
    .name = QK_NAME,
    .dot = {
        [DT_F32] = dot_f32, [DT_F16] = dot_f16, [DT_BF16] = dot_bf16,
        [DT_Q8_0] = dot_q8_0, [DT_Q4_0] = dot_q4_0, [DT_Q4_1] = dot_q4_1,
        [DT_Q5_0] = dot_q5_0, [DT_Q5_1] = dot_q5_1, [DT_Q4_K] = dot_q4_k,
        [DT_Q6_K] = dot_q6_k,
    },
    .quantize = quantize_avx2,
    .gemm = &quant_gemm_avx2, /* gemm_avx2.c: packed-weight kernels where no AVX-512 set is */
};

#ifdef QK_HAVE_AVX512
/* AVX-512 kernels for Q4_1, Q5_1; the rest as AVX2 (both AVX-512 sets) */
#define AVX512_DOTS                                                                         \
    {                                                                                       \
        [DT_F32] = dot_f32, [DT_F16] = dot_f16, [DT_BF16] = dot_bf16,                       \
        [DT_Q8_0] = dot_q8_0, [DT_Q4_0] = dot_q4_0, [DT_Q4_1] = dot_q4_1_avx512,            \
        [DT_Q5_0] = dot_q5_0, [DT_Q5_1] = dot_q5_1_avx512, [DT_Q4_K] = dot_q4_k,            \
        [DT_Q6_K] = dot_q6_k,                                                               \
    }
static const struct quant_impl impl_avx512 = {
    .name = "avx512vbmi+vnni", /* AVX-512 kernels for Q4_1, Q5_1; the rest as AVX2 */
    .dot = AVX512_DOTS,
    .quantize = quantize_avx2,
};

#ifdef GEMM_HAVE_AVX512
/* impl_avx512 plus the packed-weight kernels of gemm_avx512.c: matrices packed at load
 * time (cpu_weight_pack) run on them for every number of tokens; unpacked ones on the
 * per-token dots above. The best set where the build has it. */
static const struct quant_impl impl_avx512_gemm = {
    .name = "avx512vbmi+vnni+gemm",
    .dot = AVX512_DOTS,
    .quantize = quantize_avx2,
    .gemm = &quant_gemm_avx512,
};
#define QK_BEST (&impl_avx512_gemm)
#else
#define QK_BEST (&impl_avx512)
#endif
#else
#define QK_BEST (&impl_avx2)
#endif

int quant_impl_simd_list(const struct quant_impl **out, int max)
{
    int n = 0;
    if (n < max) out[n++] = &impl_avx2;
#ifdef QK_HAVE_AVX512
    if (n < max) out[n++] = &impl_avx512;
#ifdef GEMM_HAVE_AVX512
    if (n < max) out[n++] = &impl_avx512_gemm;
#endif
#endif
    return n;
}

const struct quant_impl *quant_impl_simd(void) { return QK_BEST; }

#else /* no AVX2 + FMA + F16C in this build */

int quant_impl_simd_list(const struct quant_impl **out, int max)
{
    (void)out;
    (void)max;
    return 0;
}


const struct quant_impl *quant_impl_simd(void) { return NULL; }

#endif
