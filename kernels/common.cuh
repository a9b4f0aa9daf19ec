/* common.cuh — included first by every kernel source (kernels/<family>.cu).
 *
 * One source, two compilers. nvcc builds the kernels for the GPU (sm_80, sm_89, sm_90a,
 * compute_90 PTX). The CUDA-on-CPU emulator (tests/emu/, test infrastructure, never in the
 * product) builds the very same file with g++ as C++17 after force-including
 * tests/emu/emu.h, which defines TESSERA_EMU and implements __syncthreads, the warp
 * primitives, shared memory, ldmatrix / mma.sync and the runtime on the CPU. The few spellings that must
 * differ between the two live here and nowhere else:
 *
 *   TS_LAUNCH(kernel, grid, block, smem, stream, args...)
 *       nvcc: kernel<<<grid, block, smem, stream>>>(args...)
 *       emu : one call that runs (or enqueues, on stream) the grid on the CPU, with the
 *             kernel's name and call site kept for diagnostics. The arguments are
 *             evaluated and copied at the launch, as CUDA does (a tuple, not a lambda
 *             capturing whole objects named in the argument expressions).
 *       `kernel` is a plain name or a function-pointer variable; a template instance
 *       goes through a local variable (auto *k = my_kernel<float, 4>; TS_LAUNCH(k, ...)),
 *       because the preprocessor would split its template arguments.
 *   TS_LAUNCH_PDL(kernel, grid, block, smem, stream, pdl, args...)
 *       the same, launched with programmatic stream serialization when pdl != 0
 *       (cudaLaunchKernelEx; see ts_pdl_wait below).
 *   TS_SHARED(type, name, dims)        a static __shared__ variable:
 *       TS_SHARED(float, red, [32]);   TS_SHARED(float, tile, [64][65]);   TS_SHARED(int, n, );
 *   TS_DYNAMIC_SHARED(type, name)      the launch's dynamic shared memory as `type *name`
 *                                      (16-byte aligned).
 * Under the emulator a bare `__shared__` is a compile error (it would silently become a
 * per-OS-thread variable): every shared variable goes through these two macros, and comes
 * from a per-block arena that is poisoned (0xFF bytes: NaN for floating types, -1 for
 * integers) at every block start.
 *
 * Tensor cores are used through ts_ldmatrix_x4(_trans) / ts_mma_16816 below (the emulator
 * implements both, with PTX's documented register layouts) or cuBLAS. The only other inline
 * PTX is ts_l2_prefetch's cp.async.bulk.prefetch.L2 (a hint; the emulator checks its range).
 * Not nvcuda::wmma: its fragment layouts are unspecified (a kernel cannot know which row a
 * register holds, so rescaling rows or reusing an accumulator as an operand means a trip
 * through shared memory) and nvcc lowers its BF16 loads to generic 32-bit loads; every
 * kernel moved off it, and the emulator no longer implements it (docs/kernels.md,
 * "Fragment loads: ldmatrix, not wmma").
 */
#ifndef TESSERA_KERNELS_COMMON_CUH
#define TESSERA_KERNELS_COMMON_CUH

#ifndef TESSERA_EMU
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/l2_hint.h"

/* ---- launch and shared memory ----------------------------------------------------------- */

#ifdef TESSERA_EMU
#define TS_LAUNCH_PDL(kernel, grid, block, smem, stream, pdl, ...)                               \
    emu_launch((const void *)(kernel), #kernel, __FILE__, __LINE__, dim3(grid), dim3(block),      \
               (size_t)(smem), (stream), (pdl) != 0,                                             \
               [=, ts_args_ = std::make_tuple(__VA_ARGS__)]() { std::apply(kernel, ts_args_); })
#define TS_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    TS_LAUNCH_PDL(kernel, grid, block, smem, stream, 0, __VA_ARGS__)
#define TS_SHARED(type, name, dims)                                                              \
    typedef type ts_shared_t_##name dims;                                                        \
    static const char ts_shared_site_##name = 0;                                                 \
    ts_shared_t_##name &name = *static_cast<ts_shared_t_##name *>(emu_shared_static(             \
        &ts_shared_site_##name, sizeof(ts_shared_t_##name), alignof(ts_shared_t_##name), #name))
#define TS_DYNAMIC_SHARED(type, name) type *name = static_cast<type *>(emu_shared_dynamic())
#else
#define TS_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define TS_LAUNCH_PDL(kernel, grid, block, smem, stream, pdl, ...)                               \
    ts_launch_pdl((kernel), dim3(grid), dim3(block), (size_t)(smem), (stream), (pdl) != 0, __VA_ARGS__)
/* cudaLaunchKernelEx with programmatic stream serialization when pdl (its error, as any
 * launch's, is left for cudaGetLastError()). */
template <typename... P, typename... A>
static inline void ts_launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                 bool pdl, A &&...args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}
#define TS_SHARED(type, name, dims) __shared__ type name dims
#define TS_DYNAMIC_SHARED(type, name)                                                            \
    extern __shared__ __align__(16) unsigned char ts_dynamic_smem_[];                            \
    type *name = reinterpret_cast<type *>(ts_dynamic_smem_)
#endif

/* Launchers return the launch's error as an int (cudaSuccess == 0), so C callers need no
 * CUDA types beyond cudaStream_t. */
#define TS_LAUNCH_RESULT() ((int)cudaGetLastError())

#define TS_FULL_MASK 0xffffffffu

/* ---- programmatic dependent launch (sm_90+) --------------------------------------------- */

/* A kernel launched with TS_LAUNCH_PDL(..., pdl = 1, ...) may start while the previous
 * kernel on its stream still runs (once every block of that kernel has started or called
 * ts_pdl_launch_dependents()). Before it reads anything an earlier kernel writes, or writes
 * anything an earlier kernel reads, every thread calls ts_pdl_wait(), which returns when
 * the previous grid has finished and its writes are visible. What it does before that is
 * limited to data no kernel of the step writes (weights). Both are no-ops on a grid
 * launched without pdl and below sm_90; the emulator checks that every thread of a pdl
 * launch waited. */
__device__ __forceinline__ void ts_pdl_wait()
{
#if defined(TESSERA_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    cudaGridDependencySynchronize();
#endif
}

/* Lets the next kernel on the stream, if launched with pdl, be scheduled now (it still
 * waits in ts_pdl_wait for this grid to finish). */
__device__ __forceinline__ void ts_pdl_launch_dependents()
{
#if defined(TESSERA_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

/* The first statement of a kernel whose every input may come from the kernel before it:
 * lets a pdl launch after it be scheduled, then waits for the one before it. */
__device__ __forceinline__ void ts_pdl_begin()
{
    ts_pdl_launch_dependents();
    ts_pdl_wait();
}

/* ---- L2 prefetch (kernels/l2_hint.h) ------------------------------------------------------ */

constexpr uint32_t TS_L2_PIECE = 64 * 1024; /* bytes per prefetch instruction */

/* Asks the L2 to fetch [p, p + bytes) (p 16-byte aligned, bytes a multiple of 16; none when
 * bytes == 0): the grid's threads issue one cp.async.bulk.prefetch.L2 per 64 KiB piece,
 * thread i (counted over the whole grid) pieces i, i + threads, ... A prefetch has no
 * result and nothing waits for it; a kernel calls this after ts_pdl_wait, so the bytes
 * stream in while it and the kernels after it run, not while the kernel before it still
 * streams its own. sm_90+; nothing below. The emulator checks the range (one live device
 * allocation, alignment) and counts the bytes (emu_l2_prefetched_bytes). */
__device__ __forceinline__ void ts_l2_prefetch(const void *p, uint64_t bytes)
{
#if defined(TESSERA_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    if (bytes == 0) return;
    const uint64_t pieces = (bytes + TS_L2_PIECE - 1) / TS_L2_PIECE;
    const uint64_t block = blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
    const uint64_t nthreads = (uint64_t)blockDim.x * blockDim.y * blockDim.z;
    const uint64_t stride = nthreads * gridDim.x * gridDim.y * gridDim.z;
    for (uint64_t i = block * nthreads + threadIdx.x + blockDim.x * (threadIdx.y + (uint64_t)blockDim.y * threadIdx.z);
         i < pieces; i += stride) {
        const char *q = static_cast<const char *>(p) + i * TS_L2_PIECE;
        const uint32_t n = (uint32_t)(bytes - i * TS_L2_PIECE < TS_L2_PIECE ? bytes - i * TS_L2_PIECE : TS_L2_PIECE);
#if defined(TESSERA_EMU)
        emu_l2_prefetch(q, n);
#else
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(q), "r"(n) : "memory");
#endif
    }
#else
    (void)p; /* no bulk prefetch before sm_90 (and nothing to do in nvcc's host pass) */
    (void)bytes;
#endif
}

/* A launcher's hint as kernel arguments: false (cudaErrorInvalidValue) when it breaks
 * l2_hint.h's rules; NULL or no bytes give (NULL, 0). */
static inline bool ts_l2_hint_args(const struct cuda_l2_hint *h, const void **p, uint64_t *bytes)
{
    *p = nullptr;
    *bytes = 0;
    if (!h || h->bytes == 0) return true;
    if (!h->p || ((uintptr_t)h->p & 15) != 0 || (h->bytes & 15) != 0) return false;
    *p = h->p;
    *bytes = h->bytes;
    return true;
}

/* ---- tensor cores: ldmatrix and mma.sync ---------------------------------------------------
 * These two PTX instructions have documented layouts (PTX ISA:
 * "ldmatrix", "Matrix Fragments for mma.m16n8k16"), the same for F16 and BF16; with
 * g = lane / 4 and t = lane % 4, the lower index of each pair in a register's low half:
 *   ts_ldmatrix_x4(r, row): each lane passes one 16-byte row in shared memory (16-byte
 *     aligned), lanes 8i..8i+7 rows 0..7 of 8x8 matrix i; r[i] = (row g, columns 2t, 2t+1)
 *     of matrix i. ts_ldmatrix_x4_trans: the same rows, r[i] = (rows 2t, 2t+1, column g)
 *     of matrix i (the matrix transposed).
 *   ts_mma_16816<T>(d, a, b0, b1): d (16 x 8, F32) += A (16 x 16) B (16 x 8), T = __half or
 *     __nv_bfloat16; a[0] = A(g, 2t..), a[1] = A(g+8, 2t..), a[2] = A(g, 2t+8..),
 *     a[3] = A(g+8, 2t+8..); b0 = B(2t.., g), b1 = B(2t+8.., g); d[j] = D(g + 8 (j / 2), 2t + j % 2).
 * So ldmatrix_x4 with lane l at row (l % 16), column 8 (l / 16) of a row-major 16 x 16 tile
 * gives A's four registers; with lane l at row (l % 8) + 8 (l / 16), column 8 ((l / 8) % 2)
 * of a tile holding B's 16 columns as rows (B column-major), b0, b1 of columns 0..7 and
 * b0, b1 of columns 8..15; ts_ldmatrix_x4_trans with lane l at row (l % 16), column
 * 8 (l / 16) of a row-major B (16 x 16: k rows of n) gives the same four. Warp-collective
 * (all 32 lanes); sm_80+. The emulator's versions: tests/emu/mma_sync.h. */
/* The row and column of d[j] of ts_mma_16816 for this lane: (g + 8 (j / 2), 2t + j % 2). */
__device__ __forceinline__ void ts_mma_d_at(int lane, int j, int &row, int &col)
{
    row = (lane >> 2) + 8 * (j >> 1);
    col = 2 * (lane & 3) + (j & 1);
}
#ifndef TESSERA_EMU
__device__ __forceinline__ void ts_ldmatrix_x4(uint32_t (&r)[4], const void *row)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ts_ldmatrix_x4_trans(uint32_t (&r)[4], const void *row)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
template <typename T>
__device__ __forceinline__ void ts_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void ts_mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void ts_mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                            uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

static inline unsigned ts_div_up(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* ---- warp and block reductions ---------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TS_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(TS_FULL_MASK, v, o));
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
 * the result. scratch: 32 floats of shared memory, reusable after the call returns. */
__device__ __forceinline__ float block_sum(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

/* ---- element types ---------------------------------------------------------------------- */

/* Activation and KV element types as kernels see them. F32/F16/BF16 activations are
 * chosen at run time by an enum dtype (util/tensor.h) argument and dispatched to a
 * template instance; these convert one element. */
template <typename T> __device__ __forceinline__ float ts_to_float(T x);
template <> __device__ __forceinline__ float ts_to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float ts_to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float ts_to_float<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T ts_from_float(float x);
template <> __device__ __forceinline__ float ts_from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half ts_from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 ts_from_float<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* OCP e4m3fn, round to nearest even, saturating at +-448 (util/fp8.h's rule). */
__device__ __forceinline__ uint8_t ts_float_to_e4m3(float x)
{
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float ts_e4m3_to_float(uint8_t c)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    return __half2float(__half(h));
}

/* Two e4m3 codes (bits 0-15 of two, low byte first) -> two F16 of the same values (exact:
 * every e4m3 value is an F16 value), packed low first. sm_89+: one cvt.rn.f16x2.e4m3x2
 * (cuda_fp8.h); below, and under the emulator, the header's exact software conversion.
 * The FP8 KV cache's attention kernels widen their K/V tiles with it. */
__device__ __forceinline__ uint32_t ts_e4m3x2_to_f16x2(uint32_t two)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* 16 e4m3 codes (a 16-byte load) -> 16 F16, in order: the first 8 in a, the rest in b. */
__device__ __forceinline__ void ts_e4m3x16_to_f16(uint4 c, uint4 &a, uint4 &b)
{
    a = make_uint4(ts_e4m3x2_to_f16x2(c.x), ts_e4m3x2_to_f16x2(c.x >> 16), ts_e4m3x2_to_f16x2(c.y),
                   ts_e4m3x2_to_f16x2(c.y >> 16));
    b = make_uint4(ts_e4m3x2_to_f16x2(c.z), ts_e4m3x2_to_f16x2(c.z >> 16), ts_e4m3x2_to_f16x2(c.w),
                   ts_e4m3x2_to_f16x2(c.w >> 16));
}

#endif
