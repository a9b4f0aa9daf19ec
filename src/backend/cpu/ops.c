/* ops.c — CPU twins of the non-matmul ops (contracts in ops.h).
 *
 * Plain C loops, with AVX2/FMA/F16C paths for the dot products and axpys (row norms,
 * tests and the reference attention in tests use them); everything else is O(num_tokens * dim) and left to the compiler. No op
 * allocates. Paged attention itself is in attention.c.
 */
#include "backend/cpu/ops.h"

#include "util/err.h"
#include "util/fp8.h"
#include "util/half.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#ifdef __AVX512F__
#include "util/simd_exp.h"
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define OPS_AVX2 1
#endif

/* ---- vector kernels ------------------------------------------------------------------- */

#ifdef OPS_AVX2
static inline float hsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#endif

float cpu_dot_f32(const float *a, const float *b, int n)
{
    int i = 0;
    float s = 0.0f;
#ifdef OPS_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = hsum256(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

float cpu_dot_f16(const float *a, const uint16_t *b, int n)
{
    int i = 0;
    float s = 0.0f;
#if defined(OPS_AVX2) && defined(__F16C__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
        __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
    }
    s = hsum256(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * fp16_to_fp32(b[i]);
    return s;
}

void cpu_axpy_f32(float *y, float a, const float *x, int n)
{
    int i = 0;
#ifdef OPS_AVX2
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

void cpu_axpy_f16(float *y, float a, const uint16_t *x, int n)
{
    int i = 0;
#if defined(OPS_AVX2) && defined(__F16C__)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) {
        __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, vx, _mm256_loadu_ps(y + i)));
    }
#endif
    for (; i < n; i++) y[i] += a * fp16_to_fp32(x[i]);
}

/* bf16 -> f32 is a 16-bit shift: widen each 16-bit lane into the high half of a 32-bit
 * lane. */
#ifdef OPS_AVX2
static inline __m256 bf16x8_to_ps(const uint16_t *p)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

float cpu_dot_bf16(const float *a, const uint16_t *b, int n)
{
    int i = 0;
    float s = 0.0f;
#ifdef OPS_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bf16x8_to_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), bf16x8_to_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bf16x8_to_ps(b + i), acc0);
    s = hsum256(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * bf16_to_fp32(b[i]);
    return s;
}

void cpu_axpy_bf16(float *y, float a, const uint16_t *x, int n)
{
    int i = 0;
#ifdef OPS_AVX2
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, bf16x8_to_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * bf16_to_fp32(x[i]);
}

/* e4m3 -> fp16 is a bit shift: sign to bit 15, the 4 exponent and 3 mantissa bits to
 * bits 13..7, so the fp16 value is the e4m3 value * 2^-8 (bias 15 vs 7), subnormals
 * included; only NaN (0x7f) is lost, and cpu_kv_write never stores it from finite input.
 * The vector paths below decode 8 codes this way with F16C and fold the 2^8 into the
 * final scale (exact: a power of two); the scalar tails use the table. */
#if defined(OPS_AVX2) && defined(__F16C__)
static inline __m256 fp8x8_to_ps_div256(const uint8_t *c)
{
    /* code to the high byte of each 16-bit lane (c << 8), arithmetic shift right by one
     * (sign now in bits 15 and 14, exponent and mantissa in 13..7), clear bit 14 */
    __m128i b = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)c));
    __m128i h = _mm_and_si128(_mm_srai_epi16(b, 1), _mm_set1_epi16((short)0xbfff));
    return _mm256_cvtph_ps(h);
}
#endif

float cpu_dot_fp8(const float *a, const uint8_t *b, int n)
{
    int i = 0;
    float s = 0.0f;
#if defined(OPS_AVX2) && defined(__F16C__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), fp8x8_to_ps_div256(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), fp8x8_to_ps_div256(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), fp8x8_to_ps_div256(b + i), acc0);
    s = hsum256(_mm256_add_ps(acc0, acc1)) * 256.0f;
#endif
    for (; i < n; i++) s += a[i] * fp8_e4m3_to_fp32(b[i]);
    return s;
}

void cpu_axpy_fp8(float *y, float a, const uint8_t *x, int n)
{
    int i = 0;
#if defined(OPS_AVX2) && defined(__F16C__)
    __m256 va = _mm256_set1_ps(a * 256.0f);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, fp8x8_to_ps_div256(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * fp8_e4m3_to_fp32(x[i]);
}

/* ---- row ops -------------------------------------------------------------------------- */

void cpu_rmsnorm(float *out, const float *x, const float *w, int num_rows, int n, float eps)
{
    for (int r = 0; r < num_rows; r++) {
        const float *xr = x + (int64_t)r * n;
        float *o = out + (int64_t)r * n;
        float ss = cpu_dot_f32(xr, xr, n);
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        int i = 0;
#ifdef __AVX512F__ /* (x * inv) * w per element, as the loop below; out may be x */
        const __m512 vinv = _mm512_set1_ps(inv);
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + i), vinv), _mm512_loadu_ps(w + i)));
#endif
        for (; i < n; i++) o[i] = xr[i] * inv * w[i];
    }
}

void cpu_add(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] += x[i];
}

void cpu_softmax(float *x, int n)
{
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* Every element goes through the same arithmetic (16 lanes, the tail masked), so an
 * element's result does not depend on n or on where a row starts. */
void cpu_silu_mul(float *out, const float *gate, const float *up, int64_t n)
{
#ifdef __AVX512F__
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 e = exp16_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
    }
#else
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
#endif
}

/* ---- RoPE ----------------------------------------------------------------------------- */

void cpu_rope_angles(float *cs, float *sn, const int32_t *positions, int num_tokens, int head_dim,
                     const float *inv_freq)
{
    int half = head_dim / 2;
    for (int t = 0; t < num_tokens; t++) {
        double pos = (double)positions[t];
        for (int i = 0; i < half; i++) {
            double a = pos * (double)inv_freq[i];
            cs[(int64_t)t * half + i] = (float)cos(a);
            sn[(int64_t)t * half + i] = (float)sin(a);
        }
    }
}

void cpu_rope_rotate(float *x, const float *cs, const float *sn, int num_tokens, int n_heads, int head_dim,
                     enum rope_layout layout)
{
    int half = head_dim / 2;
    for (int t = 0; t < num_tokens; t++) {
        const float *c = cs + (int64_t)t * half, *s = sn + (int64_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((int64_t)t * n_heads + h) * head_dim;
            if (layout == ROPE_NEOX) {
                for (int i = 0; i < half; i++) {
                    float a = v[i], b = v[i + half];
                    v[i] = a * c[i] - b * s[i];
                    v[i + half] = a * s[i] + b * c[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * c[i] - b * s[i];
                    v[2 * i + 1] = a * s[i] + b * c[i];
                }
            }
        }
    }
}

void cpu_rope(float *x, const int32_t *positions, int num_tokens, int n_heads, int head_dim,
              const float *inv_freq, enum rope_layout layout)
{
    float cs[512], sn[512];
    assert(head_dim / 2 <= 512);
    for (int t = 0; t < num_tokens; t++) {
        cpu_rope_angles(cs, sn, positions + t, 1, head_dim, inv_freq);
        cpu_rope_rotate(x + (int64_t)t * n_heads * head_dim, cs, sn, 1, n_heads, head_dim, layout);
    }
}

/* ---- KV write ------------------------------------------------------------------------- */

/* Element offset of (block, k/v, kv head, offset 0) in a layer pool. */
static inline int64_t kv_off(const struct kv_layer *kv, int64_t block, int which, int h)
{
    return ((block * 2 + which) * kv->n_kv_heads + h) * (int64_t)kv->block_size * kv->head_dim;
}

/* dst[i] = fp32_to_fp16(src[i]), bitwise (round to nearest even; a NaN becomes the quiet
 * NaN 0x7e00 with its sign, where the instruction would keep payload bits). */
static void store_f16(uint16_t *dst, const float *src, int n)
{
    int i = 0;
#if defined(OPS_AVX2) && defined(__F16C__)
    const __m128i sign = _mm_set1_epi16((short)0x8000), qnan = _mm_set1_epi16(0x7e00);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
        h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, sign), qnan), nan16);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
#endif
    for (; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

/* dst[i] = fp32_to_bf16(src[i]), bitwise (round to nearest even, NaN quieted). */
static void store_bf16(uint16_t *dst, const float *src, int n)
{
    int i = 0;
#ifdef OPS_AVX2
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
    for (; i + 8 <= n; i += 8) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(src + i));
        const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), one))), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, absm), inf);
        const __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
        const __m256i h = _mm256_blendv_epi8(r, q, nan); /* 16-bit values in 32-bit lanes */
        const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        _mm_storeu_si128((__m128i *)(dst + i), p);
    }
#endif
    for (; i < n; i++) dst[i] = fp32_to_bf16(src[i]);
}

void cpu_kv_write(const struct kv_layer *kv, const float *k, const float *v,
                  const int64_t *slot_mapping, int num_tokens)
{
    int hd = kv->head_dim, nkv = kv->n_kv_heads;
    for (int t = 0; t < num_tokens; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        int64_t block = slot / kv->block_size, off = slot % kv->block_size;
        assert(block < kv->num_blocks);
        for (int h = 0; h < nkv; h++) {
            const float *ks = k + ((int64_t)t * nkv + h) * hd;
            const float *vs = v + ((int64_t)t * nkv + h) * hd;
            int64_t ko = kv_off(kv, block, 0, h) + off * hd;
            int64_t vo = kv_off(kv, block, 1, h) + off * hd;
            if (kv->dtype == KV_F32) {
                memcpy((float *)kv->data + ko, ks, sizeof(float) * hd);
                memcpy((float *)kv->data + vo, vs, sizeof(float) * hd);
            } else if (kv->dtype == KV_FP8_E4M3) {
                /* code = e4m3(x / scale); a division, not a reciprocal multiply, so the
                 * stored code is exactly the documented one */
                uint8_t *kd = (uint8_t *)kv->data + ko, *vd = (uint8_t *)kv->data + vo;
                for (int i = 0; i < hd; i++) {
                    kd[i] = fp32_to_fp8_e4m3(ks[i] / kv->k_scale);
                    vd[i] = fp32_to_fp8_e4m3(vs[i] / kv->v_scale);
                }
            } else if (kv->dtype == KV_BF16) {
                store_bf16((uint16_t *)kv->data + ko, ks, hd);
                store_bf16((uint16_t *)kv->data + vo, vs, hd);
            } else {
                store_f16((uint16_t *)kv->data + ko, ks, hd);
                store_f16((uint16_t *)kv->data + vo, vs, hd);
            }
        }
    }
}
