/* row_scan.c — see row_scan.h. */
#include "sampler/row_scan.h"

#include <math.h>

#if defined(__AVX512F__)
#include "util/simd_exp.h"
#include <immintrin.h>
#endif

/* Inserts entry (i, v) into top[0, *m) (capacity k) if it belongs there: scanning ids in
 * increasing order, an entry equal to the last kept one has the higher id and loses. */
static inline void top_insert(struct row_top *top, int *m, int k, int32_t i, float v)
{
    if (*m == k && !(v > top[*m - 1].v)) return;
    int j = *m < k ? (*m)++ : *m - 1;
    for (; j > 0 && v > top[j - 1].v; j--) top[j] = top[j - 1];
    top[j].id = i;
    top[j].v = v;
}

float row_max(const float *x, int n)
{
    float mx = -INFINITY;
    int i = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_loadu_ps(x + i), acc); /* a NaN x gives acc */
    mx = _mm512_reduce_max_ps(acc);
#endif
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

double row_sum_exp(const float *x, int n, float mx)
{
    double sum = 0.0;
    int i = 0;
#if defined(__AVX512F__)
    const __m512 vmx = _mm512_set1_ps(mx), ninf = _mm512_set1_ps(-INFINITY);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 live = _mm512_cmp_ps_mask(v, ninf, _CMP_GT_OQ); /* false for -inf and NaN */
        const __m512 e = _mm512_maskz_mov_ps(live, exp16_ps(_mm512_sub_ps(v, vmx)));
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    sum = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
#endif
    for (; i < n; i++)
        if (x[i] > -INFINITY) sum += exp((double)x[i] - (double)mx);
    return sum;
}

int row_top_n(const float *x, int n, int k, struct row_top *top)
{
    int m = 0, i = 0;
    if (k <= 0) return 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        /* the lanes that could enter: above the last kept entry once top is full */
        const __m512 thr = _mm512_set1_ps(m == k ? top[m - 1].v : -INFINITY);
        unsigned c = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), thr, _CMP_GT_OQ);
        for (; c; c &= c - 1) {
            int l = __builtin_ctz(c);
            top_insert(top, &m, k, i + l, x[i + l]);
        }
    }
#endif
    for (; i < n; i++)
        if (x[i] > -INFINITY) top_insert(top, &m, k, i, x[i]);
    return m;
}

int row_count_ge(const float *x, int n, float v)
{
    int count = 0, i = 0;
#if defined(__AVX512F__)
    const __m512 vv = _mm512_set1_ps(v);
    for (; i + 16 <= n; i += 16) /* ordered compare: false when either side is NaN */
        count += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vv, _CMP_GE_OQ));
#endif
    for (; i < n; i++) count += x[i] >= v;
    return count;
}
