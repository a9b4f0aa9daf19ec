/* half.h — IEEE fp16 and bfloat16 <-> float conversions (scalar, exact, inline). */
#ifndef TESSERA_UTIL_HALF_H
#define TESSERA_UTIL_HALF_H

#include <stdint.h>
#include <string.h>

static inline float fp32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fp32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return fp32_from_bits(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return fp32_from_bits(sign | 0x7f800000u | (man << 13));
    return fp32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Round-to-nearest-even float -> fp16, with overflow to inf and subnormals. */
static inline uint16_t fp32_to_fp16(float f)
{
    uint32_t x = fp32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520 -> inf */
    if (ax < 0x38800000u) { /* below fp16 normal range: subnormal or zero */
        float v = fp32_from_bits(ax) * 16777216.0f; /* scale by 2^24 */
        uint32_t r = (uint32_t)v;
        float frac = v - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t mant_odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + mant_odd; /* rebias exponent (-112<<23) and round to nearest even */
    return (uint16_t)(sign | (ax >> 13));
}

static inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits((uint32_t)h << 16); }

static inline uint16_t fp32_to_bf16(float f)
{
    uint32_t x = fp32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif
