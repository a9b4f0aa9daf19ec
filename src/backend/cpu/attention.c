/* attention.c — varlen causal attention over the paged KV pool (contract in ops.h).
 *
 * Flash-style and blocked. A work unit is a tile of query rows that share one KV head:
 * up to a few dozen consecutive query tokens of one sequence x the query heads of that
 * head's GQA group. The tile walks its context one chunk of 16 key positions at a time
 * ([16c, 16c + 16), gathered across KV blocks when block_size is not a multiple of 16):
 * the chunk's K and V rows are read from the pool and converted to f32 once per tile, K
 * transposed to kt[head_dim][16] so that a row's 16 scores are one vector (lane = key)
 * built by head_dim broadcast FMAs with no horizontal sum. Every row then keeps an online softmax (running max m, running
 * sum l) and an f32 output accumulator o, rescaled by exp(m_old - m_new) when the max
 * grows; out = o / l at the end. Memory is O(tile): no T x T score matrix, no per-row
 * context-length buffer. With AVX-512, the tile's rows in whole groups of 16 run the same
 * arithmetic with one lane per row instead (see "row groups" below): no horizontal
 * reductions, and prefill tiles are shaped to hold only whole groups.
 *
 * Batch invariance (a hard contract, relied on by the engine's "a token's logits do not
 * depend on its batch" tests): the sequence of float operations applied to one query row
 * depends only on that row (its q, its context length, the pool), never on the tile it
 * lands in, its place in the tile, the thread count or the other sequences. So:
 *   - chunks are fixed by context positions (multiples of 16), not by the tile nor by the
 *     pool's block size;
 *   - a score lane is its own FMA chains over head_dim (two per row, even and odd d, summed
 *     once); rows run four at a time, padded with a repeated row, never mixed;
 *   - keys past a row's context are masked by selection (-inf score, 0 weight) and skipped
 *     in P V, never multiplied in, so stale pool contents cannot leak in;
 *   - P V is elementwise in d and accumulates keys in position order.
 * Decode (one token) runs the same code as a tile of one token.
 *
 * SIMD: AVX-512F where the build has it, AVX2/FMA otherwise, scalar loops as fallback (as
 * in ops.c, chosen at compile time; results are bitwise reproducible within one build).
 */
#include "backend/cpu/ops.h"

#include "util/fp8.h"
#include "util/half.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "util/simd_exp.h"
#define ATT_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ATT_AVX2 1
#endif

#define ATT_KEYS 16          /* keys per chunk: one score vector */
#define ATT_MAX_ROWS 128     /* query rows per tile */
#define ATT_O_FLOATS 16384   /* o accumulators of a tile: rows * head_dim */
#define ATT_MAX_HEAD_DIM 1024 /* the loader's bound (model/config.c) */

/* Per-thread scratch, in floats: kt [head_dim][16], kf and vf [16][head_dim] (chunk rows
 * converted to f32), o [rows][head_dim], p [rows][16], m and l [rows], qt (row groups'
 * queries transposed, as many floats as o). */
#define ATT_SCRATCH_PER_THREAD \
    (3 * ATT_KEYS * ATT_MAX_HEAD_DIM + 2 * ATT_O_FLOATS + ATT_MAX_ROWS * ATT_KEYS + 2 * ATT_MAX_ROWS)

size_t cpu_paged_attention_scratch_floats(int n_threads, int max_ctx)
{
    (void)max_ctx; /* O(tile), independent of the context length */
    return (size_t)(n_threads > 0 ? n_threads : 1) * ATT_SCRATCH_PER_THREAD;
}

/* ---- 16-lane score vectors ------------------------------------------------------------- */

#if defined(ATT_AVX512)
typedef __m512 v16;
static inline v16 v16_zero(void) { return _mm512_setzero_ps(); }
static inline v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v16_store(float *p, v16 v) { _mm512_storeu_ps(p, v); }
static inline v16 v16_fma1(float a, const float *b, v16 c)
{
    return _mm512_fmadd_ps(_mm512_set1_ps(a), _mm512_loadu_ps(b), c);
}
static inline v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
static inline v16 v16_scale(v16 a, float s) { return _mm512_mul_ps(a, _mm512_set1_ps(s)); }
static inline v16 v16_sub1(v16 a, float s) { return _mm512_sub_ps(a, _mm512_set1_ps(s)); }
/* lanes >= n become fill */
static inline v16 v16_keep(v16 a, int n, float fill)
{
    __mmask16 k = (__mmask16)((1u << n) - 1u);
    return _mm512_mask_mov_ps(_mm512_set1_ps(fill), k, a);
}
static inline float v16_max(v16 a) { return _mm512_reduce_max_ps(a); }
/* The sum of the 16 lanes as the tree ((j + j+8) + (j+4)) + (j+2)) + (j+1) (j = 0), the
 * order the row-group kernel adds its 16 key vectors in (att_group_chunk). */
static inline float v16_sum(v16 a)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
/* exp(x) for one x <= 0, by the vector polynomial (the row-group kernel's alpha) */
static inline float att_expf(float x) { return _mm512_cvtss_f32(exp16_ps(_mm512_set1_ps(x))); }
/* exp(x), x <= 0 here (simd_exp.h; below -87.3 it returns ~1e-38) */
static inline v16 v16_exp(v16 x) { return exp16_ps(x); }
#elif defined(ATT_AVX2)
typedef struct { __m256 lo, hi; } v16;
static inline v16 v16_zero(void) { return (v16){ _mm256_setzero_ps(), _mm256_setzero_ps() }; }
static inline v16 v16_load(const float *p) { return (v16){ _mm256_loadu_ps(p), _mm256_loadu_ps(p + 8) }; }
static inline void v16_store(float *p, v16 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
static inline v16 v16_fma1(float a, const float *b, v16 c)
{
    __m256 va = _mm256_set1_ps(a);
    return (v16){ _mm256_fmadd_ps(va, _mm256_loadu_ps(b), c.lo), _mm256_fmadd_ps(va, _mm256_loadu_ps(b + 8), c.hi) };
}
static inline v16 v16_add(v16 a, v16 b) { return (v16){ _mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi) }; }
static inline v16 v16_scale(v16 a, float s)
{
    __m256 vs = _mm256_set1_ps(s);
    return (v16){ _mm256_mul_ps(a.lo, vs), _mm256_mul_ps(a.hi, vs) };
}
static inline v16 v16_sub1(v16 a, float s)
{
    __m256 vs = _mm256_set1_ps(s);
    return (v16){ _mm256_sub_ps(a.lo, vs), _mm256_sub_ps(a.hi, vs) };
}
static inline v16 v16_keep(v16 a, int n, float fill)
{
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), vn = _mm256_set1_epi32(n);
    __m256 f = _mm256_set1_ps(fill);
    __m256 klo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vn, lane));
    __m256 khi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vn, _mm256_add_epi32(lane, _mm256_set1_epi32(8))));
    return (v16){ _mm256_blendv_ps(f, a.lo, klo), _mm256_blendv_ps(f, a.hi, khi) };
}
static inline float v16_max(v16 a)
{
    __m256 m = _mm256_max_ps(a.lo, a.hi);
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
static inline float v16_sum(v16 a)
{
    __m256 m = _mm256_add_ps(a.lo, a.hi);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
static inline __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n for n in [-126, 0]: the exponent field */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
static inline v16 v16_exp(v16 x) { return (v16){ exp8(x.lo), exp8(x.hi) }; }
static inline float att_expf(float x) { return expf(x); }
#else
typedef struct { float v[16]; } v16;
static inline v16 v16_zero(void) { return (v16){ { 0 } }; }
static inline v16 v16_load(const float *p)
{
    v16 r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
static inline void v16_store(float *p, v16 v) { memcpy(p, v.v, sizeof v.v); }
static inline v16 v16_fma1(float a, const float *b, v16 c)
{
    for (int i = 0; i < 16; i++) c.v[i] += a * b[i];
    return c;
}
static inline v16 v16_add(v16 a, v16 b)
{
    for (int i = 0; i < 16; i++) a.v[i] += b.v[i];
    return a;
}
static inline v16 v16_scale(v16 a, float s)
{
    for (int i = 0; i < 16; i++) a.v[i] *= s;
    return a;
}
static inline v16 v16_sub1(v16 a, float s)
{
    for (int i = 0; i < 16; i++) a.v[i] -= s;
    return a;
}
static inline v16 v16_keep(v16 a, int n, float fill)
{
    for (int i = n; i < 16; i++) a.v[i] = fill;
    return a;
}
static inline float v16_max(v16 a)
{
    float m = a.v[0];
    for (int i = 1; i < 16; i++) m = a.v[i] > m ? a.v[i] : m;
    return m;
}
static inline float v16_sum(v16 a)
{
    float s = 0.0f;
    for (int i = 0; i < 16; i++) s += a.v[i];
    return s;
}
static inline v16 v16_exp(v16 a)
{
    for (int i = 0; i < 16; i++) a.v[i] = expf(a.v[i]);
    return a;
}
static inline float att_expf(float x) { return expf(x); }
#endif

/* ---- chunk loading ----------------------------------------------------------------------- */

/* Element offset of (block, k/v, kv head, offset 0) in a layer pool. */
static inline int64_t att_kv_off(const struct kv_layer *kv, int64_t block, int which, int h)
{
    return ((block * 2 + which) * kv->n_kv_heads + h) * (int64_t)kv->block_size * kv->head_dim;
}

/* dst[i] = value of element i (fp8: the code's value, without the scale); exact. */
static void att_convert_row(float *dst, const struct kv_layer *kv, int64_t off, int n)
{
    int i = 0;
    if (kv->dtype == KV_F16) {
        const uint16_t *s = (const uint16_t *)kv->data + off;
#if defined(ATT_AVX512)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#endif
#if defined(ATT_AVX512) || defined(ATT_AVX2)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
        for (; i < n; i++) dst[i] = fp16_to_fp32(s[i]);
    } else if (kv->dtype == KV_BF16) {
        const uint16_t *s = (const uint16_t *)kv->data + off;
#if defined(ATT_AVX512)
        for (; i + 16 <= n; i += 16) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(s + i));
            _mm512_storeu_si512((void *)(dst + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
#endif
#if defined(ATT_AVX512) || defined(ATT_AVX2)
        for (; i + 8 <= n; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
            _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
#endif
        for (; i < n; i++) dst[i] = bf16_to_fp32(s[i]);
    } else if (kv->dtype == KV_FP8_E4M3) {
        const uint8_t *s = (const uint8_t *)kv->data + off;
#if defined(ATT_AVX512) || defined(ATT_AVX2)
        /* e4m3 -> fp16 by shifts (see ops.c), the fp16 value is code value * 2^-8 */
        for (; i + 8 <= n; i += 8) {
            __m128i b = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)(s + i)));
            __m128i h = _mm_and_si128(_mm_srai_epi16(b, 1), _mm_set1_epi16((short)0xbfff));
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f)));
        }
#endif
        for (; i < n; i++) dst[i] = fp8_e4m3_to_fp32(s[i]);
    } else {
        memcpy(dst, (const float *)kv->data + off, sizeof(float) * (size_t)n);
    }
}

/* Element offset of context position p's row (k or v) for kv head h of a sequence. */
static inline int64_t att_row_off(const struct kv_layer *kv, const int32_t *bt, int p, int which, int h)
{
    return att_kv_off(kv, bt[p / kv->block_size], which, h) + (int64_t)(p % kv->block_size) * kv->head_dim;
}

/* dst[j][d] = row (k: which 0, v: which 1) of position p0 + j, element d, for j < nv: in
 * one pass when the nv positions lie in one block (their rows are contiguous there). */
static void att_load_rows(float *dst, const struct kv_layer *kv, const int32_t *bt, int which, int kvh, int p0,
                          int nv)
{
    int hd = kv->head_dim;
    if (p0 % kv->block_size + nv <= kv->block_size)
        att_convert_row(dst, kv, att_row_off(kv, bt, p0, which, kvh), nv * hd);
    else
        for (int j = 0; j < nv; j++) att_convert_row(dst + (size_t)j * hd, kv, att_row_off(kv, bt, p0 + j, which, kvh), hd);
}

/* kf[j][d] = key at position p0 + j, element d, for j < nv; 0 for nv <= j < 16. */
static void att_load_kf(float *kf, const struct kv_layer *kv, const int32_t *bt, int kvh, int p0, int nv)
{
    int hd = kv->head_dim;
    att_load_rows(kf, kv, bt, 0, kvh, p0, nv);
    if (nv < ATT_KEYS) memset(kf + (size_t)nv * hd, 0, sizeof(float) * (size_t)(ATT_KEYS - nv) * hd);
}

#if defined(ATT_AVX512)
/* In-register 16 x 16 transpose: on return lane j of r[e] is what lane e of r[j] was. */
static inline __attribute__((always_inline)) void att_transpose16(__m512 *r)
{
    __m512 t[16];
#pragma GCC unroll 8
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 16; j += 4) {
        r[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
        r[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
        r[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
        r[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
    }
    /* r[4a + b] holds, in each 128-bit lane c, elements e = 4c + b of rows 4a..4a+3 */
#pragma GCC unroll 4
    for (int b = 0; b < 4; b++) {
        __m512 x0 = _mm512_shuffle_f32x4(r[b], r[4 + b], 0x88);      /* lanes 0,2 | 0,2 */
        __m512 x1 = _mm512_shuffle_f32x4(r[b], r[4 + b], 0xdd);      /* lanes 1,3 | 1,3 */
        __m512 y0 = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0x88);
        __m512 y1 = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0xdd);
        t[b] = _mm512_shuffle_f32x4(x0, y0, 0x88);       /* c = 0 */
        t[8 + b] = _mm512_shuffle_f32x4(x0, y0, 0xdd);   /* c = 2 */
        t[4 + b] = _mm512_shuffle_f32x4(x1, y1, 0x88);   /* c = 1 */
        t[12 + b] = _mm512_shuffle_f32x4(x1, y1, 0xdd);  /* c = 3 */
    }
#pragma GCC unroll 16
    for (int e = 0; e < 16; e++) r[e] = t[e];
}
#endif

/* kt[d][j] = kf[j][d]: the chunk's keys transposed for the lane-per-key kernel. */
static void att_transpose_kt(float *kt, const float *kf, int hd)
{
    int d = 0;
#if defined(ATT_AVX512)
    for (; d + 16 <= hd; d += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(kf + (size_t)j * hd + d);
        att_transpose16(r);
#pragma GCC unroll 16
        for (int e = 0; e < 16; e++) _mm512_storeu_ps(kt + (size_t)(d + e) * ATT_KEYS, r[e]);
    }
#endif
    for (; d < hd; d++)
        for (int j = 0; j < ATT_KEYS; j++) kt[(size_t)d * ATT_KEYS + j] = kf[(size_t)j * hd + d];
}

#if defined(ATT_AVX512)
/* kt[d][j] = f16 key at position p0 + j, element d, for j < nv; 0 for nv <= j < 16: the
 * conversion and the transpose in registers, without the kf rows (tiles with no row
 * group, i.e. decode, need only kt). The nv positions lie in one block; hd % 16 == 0.
 * The same values as att_load_kf + att_transpose_kt. */
static void att_load_kt_f16(float *kt, const struct kv_layer *kv, const int32_t *bt, int kvh, int p0, int nv)
{
    const int hd = kv->head_dim;
    const uint16_t *src = (const uint16_t *)kv->data + att_row_off(kv, bt, p0, 0, kvh);
    for (int d = 0; d < hd; d += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++)
            r[j] = j < nv ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + (size_t)j * hd + d)))
                          : _mm512_setzero_ps();
        att_transpose16(r);
#pragma GCC unroll 16
        for (int e = 0; e < 16; e++) _mm512_storeu_ps(kt + (size_t)(d + e) * ATT_KEYS, r[e]);
    }
}
#endif

/* ---- per-row math ------------------------------------------------------------------------- */

/* Raw scores of four rows against the chunk: lane j of s[i] = sum_d q[i][d] kt[d][j], as
 * two FMA chains per row (even and odd d) added once. Rows never mix, so a row's result does
 * not depend on the other three (callers pad with a repeated row). */
static inline void att_scores4(v16 *s, const float *const *q, const float *kt, int hd)
{
    v16 a0 = v16_zero(), a1 = v16_zero(), b0 = v16_zero(), b1 = v16_zero();
    v16 c0 = v16_zero(), c1 = v16_zero(), e0 = v16_zero(), e1 = v16_zero();
    int d = 0;
    for (; d + 2 <= hd; d += 2) {
        const float *k0 = kt + (size_t)d * ATT_KEYS, *k1 = k0 + ATT_KEYS;
        a0 = v16_fma1(q[0][d], k0, a0);
        a1 = v16_fma1(q[0][d + 1], k1, a1);
        b0 = v16_fma1(q[1][d], k0, b0);
        b1 = v16_fma1(q[1][d + 1], k1, b1);
        c0 = v16_fma1(q[2][d], k0, c0);
        c1 = v16_fma1(q[2][d + 1], k1, c1);
        e0 = v16_fma1(q[3][d], k0, e0);
        e1 = v16_fma1(q[3][d + 1], k1, e1);
    }
    if (d < hd) {
        const float *k0 = kt + (size_t)d * ATT_KEYS;
        a0 = v16_fma1(q[0][d], k0, a0);
        b0 = v16_fma1(q[1][d], k0, b0);
        c0 = v16_fma1(q[2][d], k0, c0);
        e0 = v16_fma1(q[3][d], k0, e0);
    }
    s[0] = v16_add(a0, a1);
    s[1] = v16_add(b0, b1);
    s[2] = v16_add(c0, c1);
    s[3] = v16_add(e0, e1);
}

/* Online-softmax step of one row over a chunk with n valid keys: scales the raw scores,
 * updates m and l, writes the chunk's weights to p[16] (0 past n) and returns the factor
 * the row's accumulator must be multiplied by before adding this chunk. */
static inline float att_softmax_step(v16 raw, float sm, int n, float *m, float *l, float *p)
{
    v16 s = v16_keep(v16_scale(raw, sm), n, -INFINITY);
    float bm = v16_max(s), m_old = *m;
    float m_new = bm > m_old ? bm : m_old;
    /* exp(0) is exactly 1, so an unchanged max skips the call with the same result */
    float alpha = m_new == m_old ? 1.0f : m_old == -INFINITY ? 0.0f : att_expf(m_old - m_new);
    v16 e = v16_keep(v16_exp(v16_sub1(s, m_new)), n, 0.0f);
    *l = *l * alpha + v16_sum(e);
    *m = m_new;
    v16_store(p, e);
    return alpha;
}

/* o = o * alpha + sum_{j < n} p[j] v[j] for nr (1 or 2) rows sharing the chunk, in key
 * order; elementwise in d, so grouping rows or splitting d changes nothing. */
static void att_pv(float *const *o, const float *const *p, const float *alpha, int nr, const float *vf,
                   int n, int hd)
{
    int d = 0;
#if defined(ATT_AVX512)
    if (nr == 2) { /* 2 rows x 64 floats of o in 8 registers, each V vector loaded once */
        for (; d + 64 <= hd; d += 64) {
            float *o0 = o[0] + d, *o1 = o[1] + d;
            __m512 ax = _mm512_set1_ps(alpha[0]), ay = _mm512_set1_ps(alpha[1]);
            __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(o0), ax), x1 = _mm512_mul_ps(_mm512_loadu_ps(o0 + 16), ax);
            __m512 x2 = _mm512_mul_ps(_mm512_loadu_ps(o0 + 32), ax), x3 = _mm512_mul_ps(_mm512_loadu_ps(o0 + 48), ax);
            __m512 y0 = _mm512_mul_ps(_mm512_loadu_ps(o1), ay), y1 = _mm512_mul_ps(_mm512_loadu_ps(o1 + 16), ay);
            __m512 y2 = _mm512_mul_ps(_mm512_loadu_ps(o1 + 32), ay), y3 = _mm512_mul_ps(_mm512_loadu_ps(o1 + 48), ay);
            for (int j = 0; j < n; j++) {
                const float *v = vf + (size_t)j * hd + d;
                __m512 px = _mm512_set1_ps(p[0][j]), py = _mm512_set1_ps(p[1][j]);
                __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
                __m512 v2 = _mm512_loadu_ps(v + 32), v3 = _mm512_loadu_ps(v + 48);
                x0 = _mm512_fmadd_ps(px, v0, x0);
                y0 = _mm512_fmadd_ps(py, v0, y0);
                x1 = _mm512_fmadd_ps(px, v1, x1);
                y1 = _mm512_fmadd_ps(py, v1, y1);
                x2 = _mm512_fmadd_ps(px, v2, x2);
                y2 = _mm512_fmadd_ps(py, v2, y2);
                x3 = _mm512_fmadd_ps(px, v3, x3);
                y3 = _mm512_fmadd_ps(py, v3, y3);
            }
            _mm512_storeu_ps(o0, x0), _mm512_storeu_ps(o0 + 16, x1);
            _mm512_storeu_ps(o0 + 32, x2), _mm512_storeu_ps(o0 + 48, x3);
            _mm512_storeu_ps(o1, y0), _mm512_storeu_ps(o1 + 16, y1);
            _mm512_storeu_ps(o1 + 32, y2), _mm512_storeu_ps(o1 + 48, y3);
        }
    }
    if (nr == 1) /* 64 floats of o in 4 registers */
        for (; d + 64 <= hd; d += 64) {
            float *o0 = o[0] + d;
            __m512 ax = _mm512_set1_ps(alpha[0]);
            __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(o0), ax), x1 = _mm512_mul_ps(_mm512_loadu_ps(o0 + 16), ax);
            __m512 x2 = _mm512_mul_ps(_mm512_loadu_ps(o0 + 32), ax), x3 = _mm512_mul_ps(_mm512_loadu_ps(o0 + 48), ax);
            for (int j = 0; j < n; j++) {
                const float *v = vf + (size_t)j * hd + d;
                __m512 px = _mm512_set1_ps(p[0][j]);
                x0 = _mm512_fmadd_ps(px, _mm512_loadu_ps(v), x0);
                x1 = _mm512_fmadd_ps(px, _mm512_loadu_ps(v + 16), x1);
                x2 = _mm512_fmadd_ps(px, _mm512_loadu_ps(v + 32), x2);
                x3 = _mm512_fmadd_ps(px, _mm512_loadu_ps(v + 48), x3);
            }
            _mm512_storeu_ps(o0, x0), _mm512_storeu_ps(o0 + 16, x1);
            _mm512_storeu_ps(o0 + 32, x2), _mm512_storeu_ps(o0 + 48, x3);
        }
    for (int r = 0; r < nr; r++)
        for (int d1 = d; d1 + 16 <= hd; d1 += 16) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(o[r] + d1), _mm512_set1_ps(alpha[r]));
            for (int j = 0; j < n; j++)
                x = _mm512_fmadd_ps(_mm512_set1_ps(p[r][j]), _mm512_loadu_ps(vf + (size_t)j * hd + d1), x);
            _mm512_storeu_ps(o[r] + d1, x);
        }
    d += (hd - d) / 16 * 16;
#elif defined(ATT_AVX2)
    for (int r = 0; r < nr; r++)
        for (int d1 = d; d1 + 8 <= hd; d1 += 8) {
            __m256 x = _mm256_mul_ps(_mm256_loadu_ps(o[r] + d1), _mm256_set1_ps(alpha[r]));
            for (int j = 0; j < n; j++)
                x = _mm256_fmadd_ps(_mm256_set1_ps(p[r][j]), _mm256_loadu_ps(vf + (size_t)j * hd + d1), x);
            _mm256_storeu_ps(o[r] + d1, x);
        }
    d += (hd - d) / 8 * 8;
#endif
    for (int r = 0; r < nr; r++)
        for (int d1 = d; d1 < hd; d1++) {
            float x = o[r][d1] * alpha[r];
            for (int j = 0; j < n; j++) x = fmaf(p[r][j], vf[(size_t)j * hd + d1], x);
            o[r][d1] = x;
        }
}

/* ---- row groups: 16 query rows per vector (lane = row) --------------------------------------
 *
 * In a prefill tile most rows are in whole groups of 16 consecutive rows, and those run
 * with one vector lane per row instead of one per key: a score vector holds one key's score
 * for 16 rows, so the running max, the exp and the sum are plain vertical operations (no
 * horizontal reduction, no scalar exp per row), a key's K and V elements are broadcast from
 * the converted chunk (no transpose), and every broadcast feeds 16 rows. The arithmetic per
 * row is exactly the lane-per-key kernel's, so a row's result does not depend on which
 * kernel ran it (the batch invariance above):
 *   scores: two FMA chains over even and odd d, added once (att_scores4);
 *   max as att_softmax_step (m_new = bm > m_old ? bm : m_old); alpha as there, with the
 *     same vector exp; weights exp(s - m_new), 0 for masked keys;
 *   l = l * alpha + (the chunk's weights summed in v16_sum's tree order);
 *   o = o * alpha, then one FMA per valid key in key order (a masked key's weight is 0 and
 *     its V row finite, so its FMA leaves o unchanged: the lane-per-key kernel skips it).
 * The group's o is kept transposed, ot[d][16], in the rows' own place of the o scratch. */

#if defined(ATT_AVX512)
#define ATT_GROUP 16

/* qt[d][i] = q[i][d] for the group's 16 rows */
static void att_gather_qt(float *qt, const float *const *q, int hd)
{
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < ATT_GROUP; i++) r[i] = _mm512_loadu_ps(q[i] + d);
        att_transpose16(r);
#pragma GCC unroll 16
        for (int e = 0; e < 16; e++) _mm512_storeu_ps(qt + (size_t)(d + e) * ATT_GROUP, r[e]);
    }
    for (; d < hd; d++)
        for (int i = 0; i < ATT_GROUP; i++) qt[(size_t)d * ATT_GROUP + i] = q[i][d];
}

/* dst[i][d] = ot[d][i] * inv[i] for the group's 16 rows (the same product per element as
 * the lane-per-key rows' o[d] * inv) */
static void att_scatter_out(float *const *dst, const float *ot, const float *inv, int hd)
{
    const __m512 vinv = _mm512_loadu_ps(inv);
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int e = 0; e < 16; e++) r[e] = _mm512_mul_ps(_mm512_loadu_ps(ot + (size_t)(d + e) * ATT_GROUP), vinv);
        att_transpose16(r);
#pragma GCC unroll 16
        for (int i = 0; i < ATT_GROUP; i++) _mm512_storeu_ps(dst[i] + d, r[i]);
    }
    for (; d < hd; d++)
        for (int i = 0; i < ATT_GROUP; i++) dst[i][d] = ot[(size_t)d * ATT_GROUP + i] * inv[i];
}

/* Raw scores of the group against keys [j0, j0 + 8) of the chunk: s[j] lane i = q_i . k_j. */
static inline __attribute__((always_inline)) void att_group_scores8(__m512 *s, const float *qt, const float *kf,
                                                                    int j0, int hd)
{
    __m512 e[8], o[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) e[j] = o[j] = _mm512_setzero_ps();
    const float *k = kf + (size_t)j0 * hd;
    int d = 0;
    for (; d + 2 <= hd; d += 2) {
        const __m512 q0 = _mm512_loadu_ps(qt + (size_t)d * ATT_GROUP), q1 = _mm512_loadu_ps(qt + (size_t)(d + 1) * ATT_GROUP);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            e[j] = _mm512_fmadd_ps(q0, _mm512_set1_ps(k[(size_t)j * hd + d]), e[j]);
            o[j] = _mm512_fmadd_ps(q1, _mm512_set1_ps(k[(size_t)j * hd + d + 1]), o[j]);
        }
    }
    if (d < hd) {
        const __m512 q0 = _mm512_loadu_ps(qt + (size_t)d * ATT_GROUP);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) e[j] = _mm512_fmadd_ps(q0, _mm512_set1_ps(k[(size_t)j * hd + d]), e[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) s[j] = _mm512_add_ps(e[j], o[j]);
}

/* One chunk [p0, p0 + nv) for a group: ctx lane i = the context length of row i (keys at
 * positions < ctx are visible); m, l: the rows' running max and sum; ot [hd][16]. Inlined
 * into att_group_chunk with head_dim a constant for the common sizes. */
static inline __attribute__((always_inline)) void att_group_chunk_hd(const float *qt, const float *kf, const float *vf,
                                                                     int nv, int p0, __m512i ctx, float sm, float *m,
                                                                     float *l, float *ot, int hd)
{
    __m512 s[ATT_KEYS];
    att_group_scores8(s, qt, kf, 0, hd);
    if (nv > 8) att_group_scores8(s + 8, qt, kf, 8, hd);
    else
        for (int j = 8; j < ATT_KEYS; j++) s[j] = _mm512_setzero_ps(); /* masked below */

    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __mmask16 valid[ATT_KEYS];
    __m512 bm = ninf;
#pragma GCC unroll 16
    for (int j = 0; j < ATT_KEYS; j++) {
        valid[j] = _mm512_cmplt_epi32_mask(_mm512_set1_epi32(p0 + j), ctx);
        s[j] = _mm512_mask_mov_ps(ninf, valid[j], _mm512_mul_ps(s[j], _mm512_set1_ps(sm)));
        bm = _mm512_max_ps(bm, s[j]);
    }
    const __m512 m_old = _mm512_loadu_ps(m);
    const __m512 m_new = _mm512_max_ps(bm, m_old); /* bm > m_old ? bm : m_old */
    __m512 alpha = exp16_ps(_mm512_sub_ps(m_old, m_new));
    alpha = _mm512_mask_mov_ps(alpha, _mm512_cmp_ps_mask(m_old, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
    alpha = _mm512_mask_mov_ps(alpha, _mm512_cmp_ps_mask(m_new, m_old, _CMP_EQ_OQ), _mm512_set1_ps(1.0f));
#pragma GCC unroll 16
    for (int j = 0; j < ATT_KEYS; j++) s[j] = _mm512_maskz_mov_ps(valid[j], exp16_ps(_mm512_sub_ps(s[j], m_new)));
    __m512 t[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) t[j] = _mm512_add_ps(s[j], s[j + 8]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) t[j] = _mm512_add_ps(t[j], t[j + 4]);
    t[0] = _mm512_add_ps(t[0], t[2]);
    t[1] = _mm512_add_ps(t[1], t[3]);
    const __m512 sum = _mm512_add_ps(t[0], t[1]);
    _mm512_storeu_ps(l, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l), alpha), sum));
    _mm512_storeu_ps(m, m_new);

    /* o = o * alpha + sum_j p_j v_j, 8 elements of d at a time (8 accumulators, 16 weights) */
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        __m512 x[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) x[i] = _mm512_mul_ps(_mm512_loadu_ps(ot + (size_t)(d + i) * ATT_GROUP), alpha);
        if (nv == ATT_KEYS) { /* a whole chunk: no bound checks */
#pragma GCC unroll 16
            for (int j = 0; j < ATT_KEYS; j++) {
                const float *v = vf + (size_t)j * hd + d;
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) x[i] = _mm512_fmadd_ps(s[j], _mm512_set1_ps(v[i]), x[i]);
            }
        } else {
            for (int j = 0; j < nv; j++) {
                const float *v = vf + (size_t)j * hd + d;
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) x[i] = _mm512_fmadd_ps(s[j], _mm512_set1_ps(v[i]), x[i]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) _mm512_storeu_ps(ot + (size_t)(d + i) * ATT_GROUP, x[i]);
    }
    for (; d < hd; d++) {
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(ot + (size_t)d * ATT_GROUP), alpha);
        for (int j = 0; j < nv; j++) x = _mm512_fmadd_ps(s[j], _mm512_set1_ps(vf[(size_t)j * hd + d]), x);
        _mm512_storeu_ps(ot + (size_t)d * ATT_GROUP, x);
    }
}

static void att_group_chunk(const float *qt, const float *kf, const float *vf, int nv, int p0, __m512i ctx,
                            float sm, float *m, float *l, float *ot, int hd)
{
    if (hd == 64) att_group_chunk_hd(qt, kf, vf, nv, p0, ctx, sm, m, l, ot, 64);
    else if (hd == 128) att_group_chunk_hd(qt, kf, vf, nv, p0, ctx, sm, m, l, ot, 128);
    else att_group_chunk_hd(qt, kf, vf, nv, p0, ctx, sm, m, l, ot, hd);
}
#else
#define ATT_GROUP 0 /* no row groups: every row runs lane-per-key */
#endif

/* ---- tiles --------------------------------------------------------------------------------- */

/* A work unit: query tokens [t0, t0 + nt) of sequence s x query heads [h0, h0 + nh), all
 * reading kv head kvh. Rows are token-major: row r is token t0 + r / nh, head h0 + r % nh. */
struct att_tile {
    int s, kvh, h0, nh, t0, nt;
};

struct att_scratch {
    float *kt, *kf, *vf, *o, *p, *m, *l, *qt;
};

static void att_run_tile(const struct paged_attention_args *a, const struct att_tile *u,
                         const struct att_scratch *w)
{
    const struct kv_layer *kv = a->kv;
    int hd = kv->head_dim, bs = kv->block_size, nh = u->nh, nrows = u->nt * u->nh;
    int fp8 = kv->dtype == KV_FP8_E4M3;
    float sm = fp8 ? a->scale * kv->k_scale : a->scale;
    const int32_t *bt = a->block_tables + (int64_t)u->s * a->max_blocks_per_seq;
    /* token t0 + i sees ctx0 + i positions */
    int ctx0 = a->seq_lens[u->s] - (a->query_start[u->s + 1] - u->t0) + 1;
    int ctx_end = ctx0 + u->nt - 1;
    /* rows [0, r1) run as row groups of 16, the rest lane per key */
#if defined(ATT_AVX512)
    int ng = nrows / ATT_GROUP, r1 = ng * ATT_GROUP;
#else
    int r1 = 0;
#endif

    const float *q[ATT_MAX_ROWS];
    float *o[ATT_MAX_ROWS];
    for (int r = 0; r < nrows; r++) {
        int t = u->t0 + r / nh, h = u->h0 + r % nh;
        q[r] = a->q + ((int64_t)t * a->n_heads + h) * hd;
        o[r] = w->o + (size_t)r * hd;
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->o, 0, sizeof(float) * (size_t)nrows * hd);
#if defined(ATT_AVX512)
    for (int g = 0; g < ng; g++) att_gather_qt(w->qt + (size_t)g * ATT_GROUP * hd, q + g * ATT_GROUP, hd);
    int32_t row_ctx[ATT_MAX_ROWS]; /* row r sees keys at positions < row_ctx[r] */
    for (int r = 0; r < r1; r++) row_ctx[r] = ctx0 + r / nh;
#endif

    float alpha[ATT_MAX_ROWS];
    for (int p0 = 0; p0 < ctx_end;) {
        /* keys [p0, p0 + 16): fixed by position alone, not by the tile or the block size */
        int nv = ctx_end - p0 < ATT_KEYS ? ctx_end - p0 : ATT_KEYS; /* keys the tile's last row sees */
#if defined(ATT_AVX512)
        /* no row group (decode): f16 keys straight to kt when the chunk lies in one block */
        const int kt_direct = ng == 0 && kv->dtype == KV_F16 && hd % 16 == 0 && p0 % bs + nv <= bs;
        if (kt_direct) att_load_kt_f16(w->kt, kv, bt, u->kvh, p0, nv);
        else att_load_kf(w->kf, kv, bt, u->kvh, p0, nv);
#else
        const int kt_direct = 0;
        att_load_kf(w->kf, kv, bt, u->kvh, p0, nv);
#endif
        const float *vf;
        if (kv->dtype == KV_F32 && p0 % bs + nv <= bs) { /* one block: read in place */
            vf = (const float *)kv->data + att_row_off(kv, bt, p0, 1, u->kvh);
        } else {
            att_load_rows(w->vf, kv, bt, 1, u->kvh, p0, nv);
            vf = w->vf;
        }
#if defined(ATT_AVX512)
        for (int g = 0; g < ng; g++) {
            int r0 = g * ATT_GROUP;
            if (row_ctx[r0 + ATT_GROUP - 1] <= p0) continue; /* every row's context ends before p0 */
            const __m512i ctx = _mm512_loadu_si512((const void *)(row_ctx + r0));
            att_group_chunk(w->qt + (size_t)r0 * hd, w->kf, vf, nv, p0, ctx, sm, w->m + r0, w->l + r0,
                            w->o + (size_t)r0 * hd, hd);
        }
#endif
        /* the other rows, lane per key; rows of tokens whose context ends at or before p0 are done */
        int ti0 = p0 + 1 - ctx0 > 0 ? p0 + 1 - ctx0 : 0;
        int r = ti0 * nh > r1 ? ti0 * nh : r1;
        if (r < nrows && !kt_direct) att_transpose_kt(w->kt, w->kf, hd);
        for (; r + 4 <= nrows; r += 4) {
            v16 s[4];
            att_scores4(s, q + r, w->kt, hd);
            for (int i = 0; i < 4; i++) {
                int ctx = ctx0 + (r + i) / nh, n = ctx - p0 < ATT_KEYS ? ctx - p0 : ATT_KEYS;
                alpha[r + i] = att_softmax_step(s[i], sm, n, &w->m[r + i], &w->l[r + i], w->p + (size_t)(r + i) * ATT_KEYS);
            }
        }
        if (r < nrows) { /* 1-3 rows left: the 4-row kernel with the last row repeated */
            const float *qr[4];
            v16 s[4];
            for (int i = 0; i < 4; i++) qr[i] = q[r + i < nrows ? r + i : nrows - 1];
            att_scores4(s, qr, w->kt, hd);
            for (int i = 0; r + i < nrows; i++) {
                int ctx = ctx0 + (r + i) / nh, n = ctx - p0 < ATT_KEYS ? ctx - p0 : ATT_KEYS;
                alpha[r + i] = att_softmax_step(s[i], sm, n, &w->m[r + i], &w->l[r + i], w->p + (size_t)(r + i) * ATT_KEYS);
            }
        }
        for (r = ti0 * nh > r1 ? ti0 * nh : r1; r < nrows;) {
            int ctx = ctx0 + r / nh, n = ctx - p0 < ATT_KEYS ? ctx - p0 : ATT_KEYS;
            int nr = 1;
            if (r + 1 < nrows) {
                int ctx1 = ctx0 + (r + 1) / nh, n1 = ctx1 - p0 < ATT_KEYS ? ctx1 - p0 : ATT_KEYS;
                if (n1 == n) nr = 2;
            }
            const float *pp[2] = { w->p + (size_t)r * ATT_KEYS, w->p + (size_t)(r + nr - 1) * ATT_KEYS };
            att_pv(o + r, pp, alpha + r, nr, vf, n, hd);
            r += nr;
        }
        p0 += ATT_KEYS;
    }

    float *dst[ATT_MAX_ROWS], inv[ATT_MAX_ROWS];
    for (int r = 0; r < nrows; r++) {
        int t = u->t0 + r / nh, h = u->h0 + r % nh;
        dst[r] = a->out + ((int64_t)t * a->n_heads + h) * hd;
        inv[r] = (fp8 ? kv->v_scale : 1.0f) / w->l[r];
    }
#if defined(ATT_AVX512)
    for (int g = 0; g < ng; g++) /* a row group's o is [d][16] */
        att_scatter_out(dst + g * ATT_GROUP, w->o + (size_t)g * ATT_GROUP * hd, inv + g * ATT_GROUP, hd);
#endif
    for (int r = r1; r < nrows; r++)
        for (int d = 0; d < hd; d++) dst[r][d] = o[r][d] * inv[r];
}

/* Tile shape: heads of one GQA group per tile (all of them when they fit) and as many
 * tokens as keep the tile within ATT_MAX_ROWS rows and the o scratch. */
static void att_tile_shape(const struct paged_attention_args *a, int *nh, int *tq)
{
    int group = a->n_heads / a->kv->n_kv_heads;
    int rows = ATT_O_FLOATS / a->kv->head_dim;
    if (rows > ATT_MAX_ROWS) rows = ATT_MAX_ROWS;
    *nh = group < rows ? group : rows;
    *tq = rows / *nh;
#if defined(ATT_AVX512)
    /* whole row groups of 16 when some token count gives them (then no lane-per-key rows) */
    for (int t = *tq; t >= 1; t--)
        if ((t * *nh) % ATT_GROUP == 0) {
            *tq = t;
            return;
        }
#endif
    while (*tq > 1 && (*tq * *nh) % 4) /* whole groups of 4 rows for att_scores4 */
        (*tq)--;
}

/* Units in a fixed order: sequence, kv head, head subgroup, token tile. att_first_unit
 * sets u to the first one, att_next_unit advances it; both return 0 when there is none. */
static int att_fill_unit(const struct paged_attention_args *a, struct att_tile *u)
{
    int nh_tile, tq, group = a->n_heads / a->kv->n_kv_heads;
    att_tile_shape(a, &nh_tile, &tq);
    for (;;) {
        if (u->s >= a->num_seqs) return 0;
        int end = a->query_start[u->s + 1];
        if (u->t0 < end) {
            int hend = (u->kvh + 1) * group;
            u->nh = hend - u->h0 < nh_tile ? hend - u->h0 : nh_tile;
            u->nt = end - u->t0 < tq ? end - u->t0 : tq;
            return 1;
        }
        /* past the sequence's last token: next head subgroup, kv head, sequence */
        u->h0 += nh_tile;
        if (u->h0 >= (u->kvh + 1) * group) {
            if (++u->kvh >= a->kv->n_kv_heads) {
                u->kvh = 0;
                u->s++;
            }
            u->h0 = u->kvh * group;
        }
        u->t0 = u->s < a->num_seqs ? a->query_start[u->s] : 0;
    }
}

static int att_first_unit(const struct paged_attention_args *a, struct att_tile *u)
{
    *u = (struct att_tile){ .s = 0, .kvh = 0, .h0 = 0, .t0 = a->query_start[0] };
    return att_fill_unit(a, u);
}

static int att_next_unit(const struct paged_attention_args *a, struct att_tile *u)
{
    int nh_tile, tq;
    att_tile_shape(a, &nh_tile, &tq);
    u->t0 += tq;
    return att_fill_unit(a, u);
}

static double att_unit_cost(const struct paged_attention_args *a, const struct att_tile *u)
{
    int ctx0 = a->seq_lens[u->s] - (a->query_start[u->s + 1] - u->t0) + 1;
    /* scores and P V over the causal trapezoid, plus converting the chunks once */
    return (double)u->nh * u->nt * (ctx0 + (u->nt - 1) * 0.5) + 4.0 * (ctx0 + u->nt);
}

struct att_job {
    const struct paged_attention_args *a;
    double total;
};

static void attention_worker(void *arg, int ith, int nth)
{
    const struct att_job *job = arg;
    const struct paged_attention_args *a = job->a;
    float *base = a->scratch + (size_t)ith * ATT_SCRATCH_PER_THREAD;
    int hdmax = ATT_MAX_HEAD_DIM;
    struct att_scratch w = {
        .kt = base,
        .kf = base + ATT_KEYS * hdmax,
        .vf = base + 2 * ATT_KEYS * hdmax,
        .o = base + 3 * ATT_KEYS * hdmax,
        .p = base + 3 * ATT_KEYS * hdmax + ATT_O_FLOATS,
        .m = base + 3 * ATT_KEYS * hdmax + ATT_O_FLOATS + ATT_MAX_ROWS * ATT_KEYS,
        .l = base + 3 * ATT_KEYS * hdmax + ATT_O_FLOATS + ATT_MAX_ROWS * ATT_KEYS + ATT_MAX_ROWS,
        .qt = base + 3 * ATT_KEYS * hdmax + ATT_O_FLOATS + ATT_MAX_ROWS * ATT_KEYS + 2 * ATT_MAX_ROWS,
    };

    /* Unit u goes to the thread whose share of the total cost holds u's midpoint: contiguous,
     * balanced for one long prompt, and independent of how results are computed. */
    double done = 0.0;
    struct att_tile u;
    for (int more = att_first_unit(a, &u); more; more = att_next_unit(a, &u)) {
        double c = att_unit_cost(a, &u);
        int owner = job->total > 0 ? (int)((done + 0.5 * c) * nth / job->total) : 0;
        if (owner > nth - 1) owner = nth - 1;
        done += c;
        if (owner == ith) att_run_tile(a, &u, &w);
    }
}

void cpu_paged_attention(struct threadpool *tp, const struct paged_attention_args *a)
{
    if (a->num_tokens <= 0) return;
    assert(a->kv->head_dim <= ATT_MAX_HEAD_DIM && a->n_heads % a->kv->n_kv_heads == 0);
    struct att_job job = { .a = a, .total = 0.0 };
    struct att_tile u;
    for (int more = att_first_unit(a, &u); more; more = att_next_unit(a, &u)) job.total += att_unit_cost(a, &u);
    if (tp) tp_run(tp, attention_worker, &job);
    else attention_worker(&job, 0, 1);
}
