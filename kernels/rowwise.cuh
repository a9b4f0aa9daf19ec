/* rowwise.cuh — vector stores shared by the row-wise kernel families (norm.cu, rope.cu,
 * activation.cu; the dense GEMV's and skinny GEMM's SiLU epilogues). Private to kernels/: included after
 * common.cuh.
 *
 * The row-wise kernels compute in F32 four consecutive elements at a time (one float4
 * load) and write them in the output's element type with one vector store: 16 bytes for
 * F32, 8 for F16/BF16, 4 for FP8 e4m3 codes. The caller guarantees the alignment of that
 * store (element offset a multiple of 4, base pointer aligned to 4 elements).
 */
#ifndef TESSERA_KERNELS_ROWWISE_CUH
#define TESSERA_KERNELS_ROWWISE_CUH

#include "kernels/common.cuh"

#include "util/tensor.h"

/* Two 16-bit codes in one word, a in the low half (the lower address). */
__device__ __forceinline__ unsigned ts_pack16(unsigned short a, unsigned short b)
{
    return (unsigned)a | ((unsigned)b << 16);
}

__device__ __forceinline__ unsigned short ts_bits16(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned short ts_bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

/* p[0..3] = v, converted (round to nearest even) to T. */
__device__ __forceinline__ void ts_store4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }

template <typename T> __device__ __forceinline__ void ts_store4_16(T *p, float4 v)
{
    uint2 u;
    u.x = ts_pack16(ts_bits16(ts_from_float<T>(v.x)), ts_bits16(ts_from_float<T>(v.y)));
    u.y = ts_pack16(ts_bits16(ts_from_float<T>(v.z)), ts_bits16(ts_from_float<T>(v.w)));
    *reinterpret_cast<uint2 *>(p) = u;
}
__device__ __forceinline__ void ts_store4(__half *p, float4 v) { ts_store4_16(p, v); }
__device__ __forceinline__ void ts_store4(__nv_bfloat16 *p, float4 v) { ts_store4_16(p, v); }

/* FP8 e4m3 codes of v / scale: a division, not a multiply by 1/scale, so the codes are
 * exactly the ones util/fp8.h's writer (cpu_kv_write) stores. */
__device__ __forceinline__ void ts_store4_e4m3(uint8_t *p, float4 v, float scale)
{
    unsigned c = (unsigned)ts_float_to_e4m3(v.x / scale) | ((unsigned)ts_float_to_e4m3(v.y / scale) << 8) |
                 ((unsigned)ts_float_to_e4m3(v.z / scale) << 16) |
                 ((unsigned)ts_float_to_e4m3(v.w / scale) << 24);
    *reinterpret_cast<unsigned *>(p) = c;
}

/* SiLU·mul of one element, in F32: gate / (1 + exp(-gate)) * up. One definition for the
 * activation kernel and the GEMV that fuses it (dense_gemv.cu), so both round alike. */
__device__ __forceinline__ float ts_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* p[i] = v in dtype dt (DT_F32, DT_F16 or DT_BF16; round to nearest even): one output of
 * the GEMV kernels' fused SiLU epilogues. */
__device__ __forceinline__ void ts_store1(void *p, int dt, int64_t i, float v)
{
    if (dt == DT_F32) static_cast<float *>(p)[i] = v;
    else if (dt == DT_F16) static_cast<__half *>(p)[i] = ts_from_float<__half>(v);
    else static_cast<__nv_bfloat16 *>(p)[i] = ts_from_float<__nv_bfloat16>(v);
}

/* True when p is aligned to `bytes` (a power of two). */
static inline bool ts_aligned(const void *p, size_t bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }

#endif
