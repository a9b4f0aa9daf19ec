/* membw.c — see membw.h. Each thread sums its contiguous slice of the buffer with
 * 4 independent accumulators (enough loads in flight to saturate a core's share). */
#define _GNU_SOURCE
#include "util/membw.h"
#include "util/bigalloc.h"
#include "util/threadpool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

struct membw_job {
    const uint64_t *buf;
    size_t n; /* elements */
    uint64_t sink[64];
};

static void membw_slice(void *p, int ith, int nth)
{
    struct membw_job *j = p;
    long b, e;
    tp_split((long)(j->n / 32), ith, nth, &b, &e);
    const uint64_t *s = j->buf + (size_t)b * 32, *end = j->buf + (size_t)e * 32;
#if defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; s < end; s += 32) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)s));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(s + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(s + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(s + 12)));
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(s + 16)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(s + 20)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(s + 24)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(s + 28)));
    }
    __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a);
    j->sink[ith & 63] = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (; s < end; s += 4) { a0 += s[0]; a1 += s[1]; a2 += s[2]; a3 += s[3]; }
    j->sink[ith & 63] = a0 + a1 + a2 + a3;
#endif
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double membw_read(struct threadpool *tp, size_t bytes, int reps)
{
    if (bytes == 0) bytes = (size_t)256 << 20;
    bytes &= ~(size_t)255;
    uint64_t *buf = big_alloc(bytes); /* the page size of the weights it is compared with */
    if (!buf) return -1.0;
    memset(buf, 1, bytes); /* fault every page in before timing */
    struct membw_job job = { .buf = buf, .n = bytes / sizeof(uint64_t) };
    double best = 0;
    for (int r = 0; r < (reps > 0 ? reps : 5); r++) {
        double t0 = now_s();
        tp_run(tp, membw_slice, &job);
        double dt = now_s() - t0;
        if (dt > 0 && (double)bytes / dt > best) best = (double)bytes / dt;
    }
    big_free(buf, bytes);
    return best;
}
