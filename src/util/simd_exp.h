/* simd_exp.h — exp over 16 f32 lanes (AVX-512), shared by the CPU attention's softmax,
 * SiLU and the log-sum-exp of logprobs (sampler/row_scan.c). Include only inside an
 * __AVX512F__ region.
 *
 * x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2 (ln2 split in two for an exact
 * reduction); exp(r) by Cephes' expf polynomial (~2 ulp); times 2^n with vscalefps.
 * x is clamped to [-87.33654, 88.7]: below, the result is ~1e-38 instead of a denormal
 * or 0; above, ~3.3e38 instead of inf. The same arithmetic in every lane, so a value's
 * result does not depend on its neighbours.
 */
#ifndef TESSERA_UTIL_SIMD_EXP_H
#define TESSERA_UTIL_SIMD_EXP_H

#include <immintrin.h>

static inline __m512 exp16_ps(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-87.33654f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

#endif
