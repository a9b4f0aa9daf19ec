/* emu.h — the CUDA-on-CPU emulator, kernel side. Test infrastructure: never in the product.
 *
 * Force-included first (g++ -include tests/emu/emu.h) into every kernel source and kernel
 * test built for the emulator, so the very same .cu file compiles as plain C++17 and runs
 * on the CPU. It
 *   - includes the toolkit's own headers for declarations and host conversions
 *     (cuda_runtime_api.h, vector_types.h, cuda_fp16.h, cuda_bf16.h, cuda_fp8.h): the
 *     runtime subset they declare is implemented with C linkage in build/emu/libemu.a;
 *   - redefines the CUDA keywords for a host compiler (__device__, __global__, ... become
 *     nothing; a bare __shared__ is a compile error: use TS_SHARED / TS_DYNAMIC_SHARED);
 *   - declares threadIdx, blockIdx, blockDim, gridDim (per-OS-thread variables the block
 *     scheduler rewrites at every fiber switch; fibers never migrate between OS threads)
 *     and warpSize;
 *   - declares the launch and shared-memory entry points kernels/common.cuh expands to;
 *   - pulls in the device intrinsics (emu_intrinsics.h), atomics (emu_atomics.h), block and
 *     warp synchronisation (emu_warp.h), fp16/bf16 gaps (emu_half.h) and the tensor-core
 *     instructions ldmatrix / mma.sync (mma_sync.h).
 * How it works and what it proves: docs/kernels.md, "The CUDA-on-CPU emulator".
 */
#ifndef TESSERA_EMU_H
#define TESSERA_EMU_H

#define TESSERA_EMU 1

/* Standard headers first, before any keyword macro below exists (libstdc++ spells
 * __attribute__((__noinline__)), which a CUDA-style __noinline__ macro would break). */
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>

/* The toolkit's declarations (CUDA 12.x or 13.x; tests/emu/include/crt/host_defines.h
 * stands in for crt/ where the headers come from the runtime wheel). */
#include <cuda_runtime_api.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

/* ---- CUDA keywords for a host compiler -------------------------------------------------- */

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __restrict__
#undef __align__
#undef __constant__
#undef __managed__
#undef __grid_constant__
#undef __shared__

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* Only usable as __attribute__((__noinline__)) (the spelling libstdc++ uses too). */
#define __noinline__ noinline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
#define __managed__
#define __grid_constant__
/* A bare __shared__ would be one variable per OS thread, silently wrong: refuse it. */
#define __shared__                                                                          \
    _Pragma("GCC error \"bare __shared__ is not supported under the CUDA emulator: use "    \
            "TS_SHARED(type, name, dims) or TS_DYNAMIC_SHARED(type, name) from kernels/common.cuh\"")

/* ---- built-in variables ----------------------------------------------------------------- */

/* The running thread's coordinates. Plain per-OS-thread variables: the block scheduler
 * writes threadIdx at every fiber switch and the others once per block. Outside a kernel
 * they read as zeros / ones.
 * EMU_TLS_HOT: initial-exec, one %fs-relative load even in the dlopen()ed emulated backend
 * (the default model there calls __tls_get_addr on every read). The library's whole TLS
 * block then lives in the static TLS that glibc keeps for dlopen()ed libraries, so it must
 * stay small (a few hundred bytes). */
#define EMU_TLS_HOT __attribute__((tls_model("initial-exec")))
extern __thread uint3 threadIdx EMU_TLS_HOT;
extern __thread uint3 blockIdx EMU_TLS_HOT;
extern __thread dim3 blockDim EMU_TLS_HOT;
extern __thread dim3 gridDim EMU_TLS_HOT;
static constexpr int warpSize = 32;

/* ---- launch and shared memory (what kernels/common.cuh expands to) ---------------------- */

/* Runs body (one call = one CUDA thread) for every thread of every block of the grid: on
 * `stream`'s worker in stream order, or records it when the stream is capturing. An invalid
 * launch configuration (block over 1024 threads or its dimension limits, grid over its
 * limits, dynamic shared memory over the kernel's limit: 48 KiB unless raised with
 * cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, n), at most
 * 227 KiB) runs nothing and sets the error cudaGetLastError() returns. Any host thread. */
void emu_launch(const void *func, const char *name, const char *file, int line, dim3 grid, dim3 block,
                size_t smem, cudaStream_t stream, bool pdl, std::function<void()> body);

/* Programmatic dependent launch (sm_90). Grids run one after another here, so the
 * dependency is always resolved: cudaGridDependencySynchronize() only records that the
 * calling thread got there, and every thread of a grid launched with pdl (TS_LAUNCH_PDL)
 * must, before it exits: a thread that does not could, on a GPU, read its predecessor's
 * output before that grid has finished, so the emulator aborts naming the kernel.
 * cudaTriggerProgrammaticLaunchCompletion() does nothing. Kernel code only. */
void cudaGridDependencySynchronize(void);
static inline void cudaTriggerProgrammaticLaunchCompletion(void) {}

/* cp.async.bulk.prefetch.L2 (kernels/common.cuh, ts_l2_prefetch): a prefetch changes no
 * memory, so the emulator only checks it (p 16-byte aligned, n a multiple of 16, [p, p + n)
 * inside one live device allocation; else it aborts naming the kernel: on a GPU such a
 * prefetch is a bug that goes unseen) and counts n. Kernel code only. */
void emu_l2_prefetch(const void *p, size_t n);
/* Bytes emu_l2_prefetch has counted since the process started (tests read it before and
 * after a launch). Any thread. */
uint64_t emu_l2_prefetched_bytes(void);

/* The current block's copy of the static __shared__ variable identified by `site`: the
 * first thread of the block to get here allocates it (aligned, filled with 0xFF bytes);
 * later threads get the same address. A different size for the same site aborts. */
void *emu_shared_static(const void *site, size_t size, size_t align, const char *name);

/* The current block's dynamic shared memory (the launch's smem bytes, 16-byte aligned,
 * filled with 0xFF bytes at block start). */
void *emu_shared_dynamic(void);

/* Sets the fiber-order seed for launches made from now on (any thread). TESSERA_EMU_SEED
 * sets it at start-up; every emulator abort prints the seed in effect. */
void emu_set_seed(uint64_t seed);
uint64_t emu_get_seed(void);

/* cuda_runtime.h's C++ overloads taking the kernel itself rather than a void pointer. */
template <typename T> static inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute((const void *)entry, attr, value);
}
template <typename T> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, T *entry)
{
    return ::cudaFuncGetAttributes(attr, (const void *)entry);
}
template <typename T>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *num_blocks, T func, int block_size,
                                                                        size_t dynamic_smem)
{
    return ::cudaOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks, (const void *)func, block_size, dynamic_smem);
}

/* Where a synchronising intrinsic was called (the intrinsic macros pass __FILE__/__LINE__
 * so that divergence and mask errors can name call sites). */
struct emu_site {
    const char *file;
    int line;
};

#include "emu_intrinsics.h"
#include "emu_atomics.h"
#include "emu_half.h"
#include "emu_warp.h"
#include "mma_sync.h"

#endif
