/* emu_atomics.h — CUDA atomics as real host atomics (included by emu.h).
 *
 * Blocks of a grid run in parallel on several OS threads, so every atomic is a real
 * read-modify-write (GCC __atomic builtins; floating-point and 16-bit types through a
 * compare-and-swap loop). Like CUDA's, they are relaxed: ordering against other memory
 * accesses needs __threadfence(), which is a sequentially consistent fence here.
 * The _block and _system scoped variants are the same operations.
 */
#ifndef TESSERA_EMU_ATOMICS_H
#define TESSERA_EMU_ATOMICS_H

#define EMU_RELAXED_ __ATOMIC_RELAXED

/* CAS loop applying f to the value at p viewed as T, through an integer of the same size. */
template <typename T, typename U, typename F> static inline T emu_atomic_update_(T *p, F f)
{
    static_assert(sizeof(T) == sizeof(U), "emu_atomic_update_: size mismatch");
    U *q = reinterpret_cast<U *>(p);
    U old_bits = __atomic_load_n(q, EMU_RELAXED_), new_bits;
    T old_v, new_v;
    do {
        memcpy((void *)&old_v, &old_bits, sizeof(T));
        new_v = f(old_v);
        memcpy(&new_bits, (const void *)&new_v, sizeof(T));
    } while (!__atomic_compare_exchange_n(q, &old_bits, new_bits, true, EMU_RELAXED_, EMU_RELAXED_));
    return old_v;
}

static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, EMU_RELAXED_); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, EMU_RELAXED_); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_add(p, v, EMU_RELAXED_);
}
static inline float atomicAdd(float *p, float v)
{
    return emu_atomic_update_<float, uint32_t>(p, [v](float o) { return o + v; });
}
static inline double atomicAdd(double *p, double v)
{
    return emu_atomic_update_<double, uint64_t>(p, [v](double o) { return o + v; });
}
static inline __half atomicAdd(__half *p, __half v)
{
    return emu_atomic_update_<__half, uint16_t>(p, [v](__half o) { return __float2half_rn(__half2float(o) + __half2float(v)); });
}
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v)
{
    return emu_atomic_update_<__nv_bfloat16, uint16_t>(
        p, [v](__nv_bfloat16 o) { return __float2bfloat16_rn(__bfloat162float(o) + __bfloat162float(v)); });
}
static inline __half2 atomicAdd(__half2 *p, __half2 v)
{
    return emu_atomic_update_<__half2, uint32_t>(p, [v](__half2 o) {
        return __floats2half2_rn(__low2float(o) + __low2float(v), __high2float(o) + __high2float(v));
    });
}
static inline __nv_bfloat162 atomicAdd(__nv_bfloat162 *p, __nv_bfloat162 v)
{
    return emu_atomic_update_<__nv_bfloat162, uint32_t>(p, [v](__nv_bfloat162 o) {
        return __floats2bfloat162_rn(__low2float(o) + __low2float(v), __high2float(o) + __high2float(v));
    });
}

static inline int atomicSub(int *p, int v) { return __atomic_fetch_sub(p, v, EMU_RELAXED_); }
static inline unsigned atomicSub(unsigned *p, unsigned v) { return __atomic_fetch_sub(p, v, EMU_RELAXED_); }

static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, EMU_RELAXED_); }
static inline unsigned atomicExch(unsigned *p, unsigned v) { return __atomic_exchange_n(p, v, EMU_RELAXED_); }
static inline unsigned long long atomicExch(unsigned long long *p, unsigned long long v)
{
    return __atomic_exchange_n(p, v, EMU_RELAXED_);
}
static inline float atomicExch(float *p, float v)
{
    return emu_atomic_update_<float, uint32_t>(p, [v](float) { return v; });
}

template <typename T> static inline T emu_atomic_min_(T *p, T v)
{
    T old = __atomic_load_n(p, EMU_RELAXED_);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, true, EMU_RELAXED_, EMU_RELAXED_)) {
    }
    return old;
}
template <typename T> static inline T emu_atomic_max_(T *p, T v)
{
    T old = __atomic_load_n(p, EMU_RELAXED_);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, true, EMU_RELAXED_, EMU_RELAXED_)) {
    }
    return old;
}
static inline int atomicMin(int *p, int v) { return emu_atomic_min_(p, v); }
static inline unsigned atomicMin(unsigned *p, unsigned v) { return emu_atomic_min_(p, v); }
static inline long long atomicMin(long long *p, long long v) { return emu_atomic_min_(p, v); }
static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v) { return emu_atomic_min_(p, v); }
static inline int atomicMax(int *p, int v) { return emu_atomic_max_(p, v); }
static inline unsigned atomicMax(unsigned *p, unsigned v) { return emu_atomic_max_(p, v); }
static inline long long atomicMax(long long *p, long long v) { return emu_atomic_max_(p, v); }
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) { return emu_atomic_max_(p, v); }

/* ((old >= v) ? 0 : old + 1) and (((old == 0) || (old > v)) ? v : old - 1), atomically. */
static inline unsigned atomicInc(unsigned *p, unsigned v)
{
    return emu_atomic_update_<unsigned, uint32_t>(p, [v](unsigned o) { return o >= v ? 0u : o + 1; });
}
static inline unsigned atomicDec(unsigned *p, unsigned v)
{
    return emu_atomic_update_<unsigned, uint32_t>(p, [v](unsigned o) { return (o == 0 || o > v) ? v : o - 1; });
}

template <typename T> static inline T emu_atomic_cas_(T *p, T cmp, T v)
{
    __atomic_compare_exchange_n(p, &cmp, v, false, EMU_RELAXED_, EMU_RELAXED_);
    return cmp; /* the old value either way */
}
static inline int atomicCAS(int *p, int cmp, int v) { return emu_atomic_cas_(p, cmp, v); }
static inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v) { return emu_atomic_cas_(p, cmp, v); }
static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long v)
{
    return emu_atomic_cas_(p, cmp, v);
}
static inline unsigned short atomicCAS(unsigned short *p, unsigned short cmp, unsigned short v)
{
    return emu_atomic_cas_(p, cmp, v);
}

static inline int atomicAnd(int *p, int v) { return __atomic_fetch_and(p, v, EMU_RELAXED_); }
static inline unsigned atomicAnd(unsigned *p, unsigned v) { return __atomic_fetch_and(p, v, EMU_RELAXED_); }
static inline unsigned long long atomicAnd(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_and(p, v, EMU_RELAXED_);
}
static inline int atomicOr(int *p, int v) { return __atomic_fetch_or(p, v, EMU_RELAXED_); }
static inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, EMU_RELAXED_); }
static inline unsigned long long atomicOr(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_or(p, v, EMU_RELAXED_);
}
static inline int atomicXor(int *p, int v) { return __atomic_fetch_xor(p, v, EMU_RELAXED_); }
static inline unsigned atomicXor(unsigned *p, unsigned v) { return __atomic_fetch_xor(p, v, EMU_RELAXED_); }
static inline unsigned long long atomicXor(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_xor(p, v, EMU_RELAXED_);
}

/* Scoped variants: one scope on the CPU. */
#define EMU_SCOPED_ATOMIC_(op)                                                                  \
    template <typename P, typename... A> static inline auto op##_block(P p, A... a)->decltype(op(p, a...)) \
    {                                                                                          \
        return op(p, a...);                                                                    \
    }                                                                                          \
    template <typename P, typename... A> static inline auto op##_system(P p, A... a)->decltype(op(p, a...)) \
    {                                                                                          \
        return op(p, a...);                                                                    \
    }
EMU_SCOPED_ATOMIC_(atomicAdd)
EMU_SCOPED_ATOMIC_(atomicSub)
EMU_SCOPED_ATOMIC_(atomicExch)
EMU_SCOPED_ATOMIC_(atomicMin)
EMU_SCOPED_ATOMIC_(atomicMax)
EMU_SCOPED_ATOMIC_(atomicInc)
EMU_SCOPED_ATOMIC_(atomicDec)
EMU_SCOPED_ATOMIC_(atomicCAS)
EMU_SCOPED_ATOMIC_(atomicAnd)
EMU_SCOPED_ATOMIC_(atomicOr)
EMU_SCOPED_ATOMIC_(atomicXor)
#undef EMU_SCOPED_ATOMIC_

static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#endif
