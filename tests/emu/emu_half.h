/* emu_half.h — fp16 / bf16 device functions missing from the toolkit's host path (emu.h).
 *
 * CUDA 12.9 and 13.0 declare most of cuda_fp16.h / cuda_bf16.h for the host too (arithmetic
 * operators, __hadd2, __hmul, __hmax, conversions, comparisons), but not the fused
 * multiply-adds, the math functions (hexp, hsqrt, ...) or a few conversions. They are
 * defined here, computed in float and rounded once to the element type. Each is a
 * template restricted to the half types, so a toolkit that later declares the same
 * function for the host wins overload resolution instead of clashing.
 */
#ifndef TESSERA_EMU_HALF_H
#define TESSERA_EMU_HALF_H

template <typename H> struct emu_is_half_ : std::false_type {};
template <> struct emu_is_half_<__half> : std::true_type {};
template <> struct emu_is_half_<__nv_bfloat16> : std::true_type {};
template <typename H2> struct emu_is_half2_ : std::false_type {};
template <> struct emu_is_half2_<__half2> : std::true_type {};
template <> struct emu_is_half2_<__nv_bfloat162> : std::true_type {};

static inline float emu_h2f_(__half x) { return __half2float(x); }
static inline float emu_h2f_(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename H> static inline H emu_f2h_(float x);
template <> inline __half emu_f2h_<__half>(float x) { return __float2half_rn(x); }
template <> inline __nv_bfloat16 emu_f2h_<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename H2> struct emu_half_of_;
template <> struct emu_half_of_<__half2> { typedef __half type; };
template <> struct emu_half_of_<__nv_bfloat162> { typedef __nv_bfloat16 type; };

#define EMU_H_(H) typename std::enable_if<emu_is_half_<H>::value, H>::type
#define EMU_H2_(H2) typename std::enable_if<emu_is_half2_<H2>::value, H2>::type

/* Applies a float function to each half of a pair. */
template <typename H2, typename F> static inline H2 emu_h2_map_(H2 x, F f)
{
    typedef typename emu_half_of_<H2>::type H;
    H2 r = x;
    r.x = emu_f2h_<H>(f(emu_h2f_(x.x)));
    r.y = emu_f2h_<H>(f(emu_h2f_(x.y)));
    return r;
}

template <typename H> static inline EMU_H_(H) __hfma(H a, H b, H c)
{
    return emu_f2h_<H>(fmaf(emu_h2f_(a), emu_h2f_(b), emu_h2f_(c)));
}
template <typename H> static inline EMU_H_(H) __hfma_sat(H a, H b, H c)
{
    return emu_f2h_<H>(__saturatef(fmaf(emu_h2f_(a), emu_h2f_(b), emu_h2f_(c))));
}
template <typename H> static inline EMU_H_(H) __hfma_relu(H a, H b, H c)
{
    float r = fmaf(emu_h2f_(a), emu_h2f_(b), emu_h2f_(c));
    return emu_f2h_<H>(r < 0.0f ? 0.0f : r); /* NaN stays NaN */
}
template <typename H2> static inline EMU_H2_(H2) __hfma2(H2 a, H2 b, H2 c)
{
    H2 r = a;
    r.x = __hfma(a.x, b.x, c.x);
    r.y = __hfma(a.y, b.y, c.y);
    return r;
}
template <typename H2> static inline EMU_H2_(H2) __hfma2_relu(H2 a, H2 b, H2 c)
{
    H2 r = a;
    r.x = __hfma_relu(a.x, b.x, c.x);
    r.y = __hfma_relu(a.y, b.y, c.y);
    return r;
}
/* (a.x + i a.y) * (b.x + i b.y) + (c.x + i c.y) */
template <typename H2> static inline EMU_H2_(H2) __hcmadd(H2 a, H2 b, H2 c)
{
    typedef typename emu_half_of_<H2>::type H;
    float ax = emu_h2f_(a.x), ay = emu_h2f_(a.y), bx = emu_h2f_(b.x), by = emu_h2f_(b.y);
    H2 r = a;
    r.x = emu_f2h_<H>(ax * bx - ay * by + emu_h2f_(c.x));
    r.y = emu_f2h_<H>(ax * by + ay * bx + emu_h2f_(c.y));
    return r;
}

#define EMU_HMATH_(name, h2name, expr)                                                         \
    template <typename H> static inline EMU_H_(H) name(H a)                                    \
    {                                                                                          \
        float x = emu_h2f_(a);                                                                 \
        return emu_f2h_<H>(expr);                                                              \
    }                                                                                          \
    template <typename H2> static inline EMU_H2_(H2) h2name(H2 a)                              \
    {                                                                                          \
        return emu_h2_map_(a, [](float x) { return (expr); });                                 \
    }
EMU_HMATH_(hexp, h2exp, expf(x))
EMU_HMATH_(hexp2, h2exp2, exp2f(x))
EMU_HMATH_(hexp10, h2exp10, exp10f(x))
EMU_HMATH_(hlog, h2log, logf(x))
EMU_HMATH_(hlog2, h2log2, log2f(x))
EMU_HMATH_(hlog10, h2log10, log10f(x))
EMU_HMATH_(hsqrt, h2sqrt, sqrtf(x))
EMU_HMATH_(hrsqrt, h2rsqrt, 1.0f / sqrtf(x))
EMU_HMATH_(hrcp, h2rcp, 1.0f / x)
EMU_HMATH_(hsin, h2sin, sinf(x))
EMU_HMATH_(hcos, h2cos, cosf(x))
EMU_HMATH_(htanh, h2tanh, tanhf(x))
EMU_HMATH_(hceil, h2ceil, ceilf(x))
EMU_HMATH_(hfloor, h2floor, floorf(x))
EMU_HMATH_(htrunc, h2trunc, truncf(x))
EMU_HMATH_(hrint, h2rint, rintf(x))
#undef EMU_HMATH_

/* Round-to-nearest-even conversions to integers (NaN -> 0, saturating like CUDA). */
template <typename I, typename H> static inline I emu_h2int_rn_(H a)
{
    float x = emu_h2f_(a);
    if (x != x) return 0;
    float r = rintf(x);
    if (r <= (float)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
    if (r >= (float)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max();
    return (I)r;
}
template <typename H> static inline typename std::enable_if<emu_is_half_<H>::value, int>::type __half2int_rn(H a)
{
    return emu_h2int_rn_<int>(a);
}
template <typename H>
static inline typename std::enable_if<emu_is_half_<H>::value, unsigned>::type __half2uint_rn(H a)
{
    return emu_h2int_rn_<unsigned>(a);
}
template <typename H>
static inline typename std::enable_if<emu_is_half_<H>::value, short>::type __half2short_rn(H a)
{
    return emu_h2int_rn_<short>(a);
}
template <typename H>
static inline typename std::enable_if<emu_is_half_<H>::value, unsigned short>::type __half2ushort_rn(H a)
{
    return emu_h2int_rn_<unsigned short>(a);
}
template <typename H>
static inline typename std::enable_if<emu_is_half_<H>::value, int>::type __bfloat162int_rn(H a)
{
    return emu_h2int_rn_<int>(a);
}
template <typename H>
static inline typename std::enable_if<emu_is_half_<H>::value, unsigned>::type __bfloat162uint_rn(H a)
{
    return emu_h2int_rn_<unsigned>(a);
}

#undef EMU_H_
#undef EMU_H2_

#endif
