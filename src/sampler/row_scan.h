/* row_scan.h — the scans of a raw logits row behind sampler_logprobs: its maximum, the
 * sum of exp(x - max) over its entries above -inf, and its n best entries; and the count of
 * entries >= a value (a scored token's rank, src/backend/cpu/backend_cpu.c).
 *
 * With AVX-512 they run 16 entries at a time (exp from util/simd_exp.h, ~2 ulp in float,
 * summed in double; the top-n candidates found by one compare per 16 entries), else in
 * plain C (exp in double). The two differ by the float rounding of exp, ~1e-7 relative in
 * the sum: far inside the 1e-4 that logprobs are compared to across backends. The top-n
 * are the same entries, in the same order, either way; the counts are equal.
 */
#ifndef TESSERA_SAMPLER_ROW_SCAN_H
#define TESSERA_SAMPLER_ROW_SCAN_H

#include <stdint.h>

struct row_top {
    int32_t id;
    float v;
};

/* The largest of x[0, n), NaN skipped (-inf when every entry is -inf or NaN). */
float row_max(const float *x, int n);

/* Sum over i < n with x[i] > -inf (NaN skipped) of exp(x[i] - mx); mx is the row's finite
 * maximum. */
double row_sum_exp(const float *x, int n, float mx);

/* The k (<= 20) largest entries above -inf (NaN skipped) into top[0, m), larger first,
 * lower id first among equals; returns m = min(k, entries above -inf). */
int row_top_n(const float *x, int n, int k, struct row_top *top);

/* The number of i < n with x[i] >= v (IEEE: a NaN entry never counts; a NaN v counts
 * nothing; v = -inf counts every non-NaN entry; -0.0 and +0.0 are equal). */
int row_count_ge(const float *x, int n, float v);

#endif
