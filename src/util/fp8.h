/* fp8.h — OCP FP8 E4M3 "fn" <-> float conversions (scalar, exact, inline).
 *
 * E4M3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities: exponent 1111
 * with mantissa 111 is NaN (0x7f / 0xff); every other code is finite, so the largest
 * value is 1.75 * 2^8 = 448. Subnormals (exponent 0000) are m * 2^-9, m = 1..7, and the
 * smallest normal is 2^-6. This is PyTorch's torch.float8_e4m3fn and NVIDIA's __nv_fp8_e4m3.
 *
 * Encoding rounds to nearest, ties to even. Overflow SATURATES: any |x| >= 448, including
 * +-inf, becomes +-448 (0x7e / 0xfe), as vLLM's scaled_fp8_conversion does (it clamps to
 * +-448 before the cast) and as cuda's __nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..) does.
 * A plain PyTorch .to(float8_e4m3fn) would instead give NaN above 464; for a KV cache a
 * clipped value is far less harmful than a NaN that poisons the whole softmax. NaN input
 * stays NaN (sign kept). -0 encodes as 0x80.
 *
 * Decoding is a 256-entry table built at compile time (fp8_e4m3_table), so the hot
 * attention loops need no branches per element.
 */
#ifndef TESSERA_UTIL_FP8_H
#define TESSERA_UTIL_FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define FP8_E4M3_MAX 448.0f

/* value of code c (0..255) as a constant expression: 2^(e-7) * (1 + m/8), or m * 2^-9 */
#define FP8_E4M3_POW2_(e) ((e) >= 10 ? (float)(1u << ((e) - 10)) : 1.0f / (float)(1u << (10 - (e))))
/* (arithmetic rather than masks: C++ compilers warn about a mask compared with a constant) */
#define FP8_E4M3_MAG_(c)                                                                   \
    ((c) % 128 == 127    ? NAN                                                             \
     : (c) / 8 % 16 == 0 ? (float)((c) % 8) / 512.0f                                       \
                         : (float)(8 + (c) % 8) * FP8_E4M3_POW2_((c) / 8 % 16))
#define FP8_E4M3_VAL_(c) ((c) >= 128 ? -FP8_E4M3_MAG_(c) : FP8_E4M3_MAG_(c))
#define FP8_E4M3_X4_(c) FP8_E4M3_VAL_(c), FP8_E4M3_VAL_((c) + 1), FP8_E4M3_VAL_((c) + 2), FP8_E4M3_VAL_((c) + 3)
#define FP8_E4M3_X16_(c) FP8_E4M3_X4_(c), FP8_E4M3_X4_((c) + 4), FP8_E4M3_X4_((c) + 8), FP8_E4M3_X4_((c) + 12)
#define FP8_E4M3_X64_(c) FP8_E4M3_X16_(c), FP8_E4M3_X16_((c) + 16), FP8_E4M3_X16_((c) + 32), FP8_E4M3_X16_((c) + 48)

/* [256] decoded value of every code; NaN for 0x7f and 0xff. */
static const float fp8_e4m3_table[256] = {
    FP8_E4M3_X64_(0), FP8_E4M3_X64_(64), FP8_E4M3_X64_(128), FP8_E4M3_X64_(192),
};

static inline float fp8_e4m3_to_fp32(uint8_t c) { return fp8_e4m3_table[c]; }

/* Round-to-nearest-even float -> e4m3fn, saturating to +-448; NaN -> 0x7f | sign. */
static inline uint8_t fp32_to_fp8_e4m3(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);  /* NaN */
    if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 (and inf): saturate */
    if (ax < 0x3c800000u) { /* below 2^-6: subnormal or zero, in steps of 2^-9 */
        float a;
        memcpy(&a, &ax, 4);
        float v = a * 512.0f; /* exact: a power-of-two scale, v < 8 */
        uint32_t r = (uint32_t)v;
        float frac = v - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint8_t)(sign | r); /* r == 8 is the smallest normal, code 0x08 */
    }
    /* normal: keep 3 of the 23 mantissa bits, rounding to nearest even (a carry into the
     * exponent is correct), then rebias the exponent from 127 to 7 */
    ax += 0x7ffffu + ((ax >> 20) & 1u);
    return (uint8_t)(sign | ((ax >> 20) - (120u << 3)));
}

#endif
