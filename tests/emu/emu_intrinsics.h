/* emu_intrinsics.h — CUDA device intrinsics on the host (included by emu.h).
 *
 * Math intrinsics compute the correctly rounded (or libm) result: the fast approximations
 * of __expf, __logf, __fdividef, ... are at least as accurate here, so a kernel test that
 * passes with them on the GPU's looser bounds is checked on the GPU by gpu-check.sh.
 * Rounding-mode suffixes (_rn, _rz, _rd, _ru) are honoured where the result depends on them.
 * Cache-hint loads and stores (__ldg, __ldcs, __stcs, ...) are plain loads and stores.
 * CUDA's integer/float min and max overloads are global functions, as in CUDA (not macros;
 * an unqualified min(a, b) on two ints picks them over std::min).
 */
#ifndef TESSERA_EMU_INTRINSICS_H
#define TESSERA_EMU_INTRINSICS_H

#include <time.h>

/* ---- float math ------------------------------------------------------------------------- */

/* glibc declares these names (extern "C", noexcept) without exporting them: define them. */
inline float __expf(float x) noexcept { return expf(x); }
inline float __exp10f(float x) noexcept { return exp10f(x); }
inline float __logf(float x) noexcept { return logf(x); }
inline float __log2f(float x) noexcept { return log2f(x); }
inline float __log10f(float x) noexcept { return log10f(x); }
inline float __powf(float x, float y) noexcept { return powf(x, y); }
inline float __sinf(float x) noexcept { return sinf(x); }
inline float __cosf(float x) noexcept { return cosf(x); }
inline float __tanf(float x) noexcept { return tanf(x); }
inline float __tanhf(float x) noexcept { return tanhf(x); }
inline void __sincosf(float x, float *s, float *c) noexcept { sincosf(x, s, c); }
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; } /* NaN -> 0 */
/* CUDA math functions a C library may or may not declare (C23 adds rsqrt and sinpi): plain
 * `inline ... noexcept` matches a libc declaration if there is one, and stands alone if not. */
inline float fdividef(float x, float y) noexcept { return x / y; }
inline float rsqrtf(float x) noexcept { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) noexcept { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) noexcept { return 1.0f / cbrtf(x); }
inline float sinpif(float x) noexcept { return sinf(3.14159265358979f * x); }
inline float cospif(float x) noexcept { return cosf(3.14159265358979f * x); }
inline float normcdff(float x) noexcept { return 0.5f * erfcf(-x * 0.70710678118654752f); }

/* Round-to-nearest-even operations: the host's default rounding mode. */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frsqrt_rn(float a) { return 1.0f / sqrtf(a); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

/* ---- conversions and reinterpretation --------------------------------------------------- */

static inline int __float2int_rn(float x) { return (int)lrintf(x); }
static inline int __float2int_rz(float x) { return (int)truncf(x); }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline unsigned __float2uint_rn(float x) { return (unsigned)llrintf(x); }
static inline unsigned __float2uint_rz(float x) { return (unsigned)truncf(x); }
static inline unsigned __float2uint_rd(float x) { return (unsigned)floorf(x); }
static inline unsigned __float2uint_ru(float x) { return (unsigned)ceilf(x); }
static inline long long __float2ll_rn(float x) { return llrintf(x); }
static inline long long __float2ll_rz(float x) { return (long long)truncf(x); }
static inline int __double2int_rn(double x) { return (int)lrint(x); }
static inline int __double2int_rz(double x) { return (int)trunc(x); }
static inline float __double2float_rn(double x) { return (float)x; }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __int2float_rz(int x)
{
    float f = (float)x; /* nearest; step back toward zero if that rounded away from it */
    if ((x > 0 && (long long)f > x) || (x < 0 && (long long)f < x)) f = nextafterf(f, 0.0f);
    return f;
}
static inline float __uint2float_rn(unsigned x) { return (float)x; }
static inline float __ll2float_rn(long long x) { return (float)x; }
static inline float __ull2float_rn(unsigned long long x) { return (float)x; }
static inline double __int2double_rn(int x) { return (double)x; }

static inline int __float_as_int(float x) { int r; memcpy(&r, &x, 4); return r; }
static inline unsigned __float_as_uint(float x) { unsigned r; memcpy(&r, &x, 4); return r; }
static inline float __int_as_float(int x) { float r; memcpy(&r, &x, 4); return r; }
static inline float __uint_as_float(unsigned x) { float r; memcpy(&r, &x, 4); return r; }
static inline long long __double_as_longlong(double x) { long long r; memcpy(&r, &x, 8); return r; }
static inline double __longlong_as_double(long long x) { double r; memcpy(&r, &x, 8); return r; }
static inline int __double2hiint(double x) { return (int)(__double_as_longlong(x) >> 32); }
static inline int __double2loint(double x) { return (int)__double_as_longlong(x); }
static inline double __hiloint2double(int hi, int lo)
{
    return __longlong_as_double((long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo));
}

/* ---- integer intrinsics ----------------------------------------------------------------- */

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
static inline unsigned long long __brevll(unsigned long long x)
{
    return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
/* Byte i of the result is byte (s >> 4i) & 7 of the 8-byte value {y:x}. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift)
{
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)((v << (shift & 31)) >> 32);
}
static inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned shift)
{
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)((v << (shift > 32 ? 32 : shift)) >> 32);
}
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift)
{
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (shift & 31));
}
static inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift)
{
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (shift > 32 ? 32 : shift));
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
static inline int __mul24(int a, int b)
{
    return (int)((long long)((a << 8) >> 8) * (long long)((b << 8) >> 8));
}
static inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
static inline int __hadd(int a, int b) { return (int)(((long long)a + b) >> 1); }
static inline int __rhadd(int a, int b) { return (int)(((long long)a + b + 1) >> 1); }
static inline unsigned __uhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b) >> 1); }
static inline unsigned __urhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b + 1) >> 1); }
static inline unsigned __sad(int a, int b, unsigned c) { return c + (unsigned)(a > b ? a - b : b - a); }
static inline unsigned __usad(unsigned a, unsigned b, unsigned c) { return c + (a > b ? a - b : b - a); }

/* 4-way byte dot product with 32-bit accumulate (sm_61+). */
static inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline unsigned __dp4a(unsigned a, unsigned b, unsigned c)
{
    for (int i = 0; i < 4; i++) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}
static inline int __dp4a(char4 a, char4 b, int c)
{
    return c + a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
static inline unsigned __dp4a(uchar4 a, uchar4 b, unsigned c)
{
    return c + a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
/* Two 16-bit halves of a times two bytes of b (bytes 0-1: _lo, 2-3: _hi), plus c. */
static inline int __dp2a_lo(int a, int b, int c)
{
    return c + (int)(int16_t)a * (int)(int8_t)b + (int)(int16_t)(a >> 16) * (int)(int8_t)(b >> 8);
}
static inline int __dp2a_hi(int a, int b, int c)
{
    return c + (int)(int16_t)a * (int)(int8_t)(b >> 16) + (int)(int16_t)(a >> 16) * (int)(int8_t)(b >> 24);
}
static inline unsigned __dp2a_lo(unsigned a, unsigned b, unsigned c)
{
    return c + (a & 0xffffu) * (b & 0xffu) + (a >> 16) * ((b >> 8) & 0xffu);
}
static inline unsigned __dp2a_hi(unsigned a, unsigned b, unsigned c)
{
    return c + (a & 0xffffu) * ((b >> 16) & 0xffu) + (a >> 16) * (b >> 24);
}

/* ---- CUDA's min / max overloads --------------------------------------------------------- */

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
static inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
static inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
static inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax(a, b); }
static inline double min(double a, float b) { return fmin(a, b); }
static inline double max(double a, float b) { return fmax(a, b); }
static inline int umin(unsigned a, unsigned b) { return (int)(a < b ? a : b); }
static inline int umax(unsigned a, unsigned b) { return (int)(a > b ? a : b); }
static inline long long llmin(long long a, long long b) { return a < b ? a : b; }
static inline long long llmax(long long a, long long b) { return a > b ? a : b; }

/* ---- cache-hinted loads and stores: plain memory accesses here ------------------------- */

template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
template <typename T> static inline T __ldca(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
template <typename T> static inline T __ldlu(const T *p) { return *p; }
template <typename T> static inline T __ldcv(const T *p) { return *p; }
template <typename T> static inline void __stcg(T *p, T v) { *p = v; }
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }
template <typename T> static inline void __stwb(T *p, T v) { *p = v; }
template <typename T> static inline void __stwt(T *p, T v) { *p = v; }

/* ---- clocks ----------------------------------------------------------------------------- */

/* Nanoseconds of a monotonic clock (a "cycle" counter that only ever grows). */
static inline long long clock64(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}
static inline unsigned long long __globaltimer(void) { return (unsigned long long)clock64(); }

#endif
