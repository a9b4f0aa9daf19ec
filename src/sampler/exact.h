/* exact.h — the bit-exact arithmetic of tessera's sampling rule, shared by the CPU sampler
 * (src/sampler/sampler.c) and the CUDA kernel (kernels/sampling.cu).
 *
 * docs/sampling.md defines the rule. Both backends must pick the same token for the same
 * logits, parameters, seed and step, so every number that decides a token is computed by
 * the functions below, from IEEE-754 single operations that are correctly rounded on
 * every platform (+, -, *, /, fmaf, rintf, conversions) and integer arithmetic:
 *
 *   - penalties: l > 0 ? l / rep - t : fmaf(l, rep, -t), t = fmaf(freq, count, pres);
 *   - scaled logit x = (l - max) * RN(1 / T) (0 for the maximum itself);
 *   - integer weight W = rint(e(x) * 2^31) for x >= -22, else 0, where e() is the
 *     polynomial exp below (about 1 ulp; monotone on [-22, 0], checked exhaustively):
 *     the most likely token weighs exactly 2^31 and sums of weights are exact integers,
 *     so top-p masses and the draw are the same whatever the summation order;
 *   - the draw: one 64-bit Philox output per (seed, step), scaled to [0, total).
 *
 * Traps this file avoids: no libm exp/log (they differ between glibc and CUDA); no
 * expression where a product feeds an addition, because g++ (the emulator build, C++17)
 * and nvcc contract those into fused multiply-adds while gcc -std=c11 does not — fused
 * operations are spelled fmaf() explicitly, and on the device the plain operations go
 * through the __f*_rn intrinsics, which are never contracted.
 *
 * Header-only, static inline; C11, C++17 and CUDA (__host__ __device__).
 */
#ifndef TESSERA_SAMPLER_EXACT_H
#define TESSERA_SAMPLER_EXACT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sampler/philox.h"

#define SMP_FN PHILOX_FN

#if defined(__CUDA_ARCH__)
#define SMP_MUL(a, b) __fmul_rn((a), (b))
#define SMP_ADD(a, b) __fadd_rn((a), (b))
#define SMP_SUB(a, b) __fsub_rn((a), (b))
#define SMP_DIV(a, b) __fdiv_rn((a), (b))
#else
#define SMP_MUL(a, b) ((a) * (b))
#define SMP_ADD(a, b) ((a) + (b))
#define SMP_SUB(a, b) ((a) - (b))
#define SMP_DIV(a, b) ((a) / (b))
#endif

#define SMP_W_MAX 2147483648u /* weight of the most likely token: 2^31 */
#define SMP_X_MIN (-22.0f)    /* scaled logits below this weigh 0 (W would round to 0 or 1) */
#define SMP_STREAM_DRAW 0u    /* Philox counter word 2 of the per-step draw */
#define SMP_PROMPT_FLAG 0x80000000u /* penalty info: bit 31 = seen in the prompt, */
#define SMP_COUNT_MASK 0x7fffffffu  /* bits 0-30 = times generated (saturating) */

SMP_FN uint32_t smp_f2u(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

SMP_FN float smp_u2f(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Repetition, then presence and frequency penalty, on a (biased) logit l of a token with
 * penalty info `info` (SMP_PROMPT_FLAG | output count; != 0). rep == 1, pres == freq == 0
 * leave l unchanged. NaN stays NaN, -inf stays -inf. */
SMP_FN float smp_penalize(float l, float rep, float pres, float freq, uint32_t info)
{
    uint32_t out = info & SMP_COUNT_MASK;
    float t = out ? fmaf(freq, (float)out, pres) : 0.0f;
    return l > 0.0f ? SMP_SUB(SMP_DIV(l, rep), t) : fmaf(l, rep, -t);
}

/* RN(1 / T), T > 0 (finite). Infinite for subnormal T: smp_scaled still works. */
SMP_FN float smp_inv_temperature(float t) { return SMP_DIV(1.0f, t); }

/* Scaled logit x = (l - m) * inv_t <= 0 for a finite l <= m (m: the row's largest
 * processed logit); exactly 0 when l == m, even if inv_t is infinite. */
SMP_FN float smp_scaled(float l, float m, float inv_t)
{
    float d = SMP_SUB(l, m);
    return d < 0.0f ? SMP_MUL(d, inv_t) : 0.0f;
}

/* Integer weight of a scaled logit: rint(e(x) * 2^31), e(x) ~ exp(x) within ~1 ulp;
 * 0 for x < -22 or NaN; exactly 2^31 for x == 0. Monotone non-decreasing in x. */
SMP_FN uint32_t smp_weight(float x)
{
    if (!(x >= SMP_X_MIN))
        return 0;
    /* x = k ln2 + r, |r| <= ln2 / 2 (Cody-Waite: ln2 = 0.693359375 - 2.12194440e-4) */
    float k = rintf(SMP_MUL(x, 1.44269504f));
    float r = fmaf(k, -0.693359375f, x);
    r = fmaf(k, 2.12194440e-4f, r);
    /* exp(r) = 1 + r + r^2 P(r): the Cephes expf minimax polynomial */
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float e = SMP_ADD(fmaf(p, SMP_MUL(r, r), r), 1.0f);
    /* y = e * 2^(k + 31), by adding to the exponent field (k + 31 >= -1, e in [0.7, 1.5]:
     * the result stays normal), then rounded to an integer */
    int32_t sh = (int32_t)k + 31;
    float y = smp_u2f(smp_f2u(e) + (uint32_t)sh * 0x800000u);
    return (uint32_t)rintf(y);
}

/* Order-preserving image of a non-NaN float: a < b <=> key(a) < key(b); -0 and +0 map to
 * the same key (they compare equal). key(-inf) = 0x007fffff. */
SMP_FN uint32_t smp_key(float v)
{
    uint32_t u = smp_f2u(v);
    if (u == 0x80000000u)
        u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The float whose key is k (+0 for the key of zero). */
SMP_FN float smp_key_value(uint32_t k)
{
    return smp_u2f((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Smallest weight min-p keeps: p_i >= min_p * p_max <=> W_i >= min_p * 2^31 (exact in
 * double) <=> W_i >= ceil(min_p * 2^31). 0 when min-p is off. */
SMP_FN uint32_t smp_min_p_weight(float min_p)
{
    return (uint32_t)ceil((double)min_p * 2147483648.0);
}

/* Top-p mass target: top_p * total, rounded once to double (total < 2^53 is exact). */
SMP_FN double smp_top_p_target(float top_p, uint64_t total)
{
    return (double)top_p * (double)total;
}

/* The 64 random bits of the draw for (seed, step). */
SMP_FN uint64_t smp_draw_bits(uint64_t seed, uint64_t step)
{
    uint32_t ctr[4] = { (uint32_t)step, (uint32_t)(step >> 32), SMP_STREAM_DRAW, 0u };
    uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    uint32_t out[4];
    philox4x32_10(ctr, key, out);
    return ((uint64_t)out[1] << 32) | out[0];
}

/* The draw point in [0, total): floor(bits * total / 2^64). */
SMP_FN uint64_t smp_draw_point(uint64_t bits, uint64_t total)
{
#if defined(__CUDA_ARCH__)
    return __umul64hi(bits, total);
#else
    return (uint64_t)(((unsigned __int128)bits * total) >> 64);
#endif
}

#endif
