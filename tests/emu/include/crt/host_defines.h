/* crt/host_defines.h — stand-in for the toolkit's internal header, emulator builds only.
 *
 * The PyPI wheel nvidia-cuda-runtime-cu12 (the headers the Makefile fetches on machines
 * without a CUDA toolkit) ships cuda_runtime_api.h, vector_types.h, ... but not crt/, which
 * they all include as "crt/host_defines.h". With a toolkit installed this file is never
 * read: a quoted include finds the toolkit's own crt/ next to the including header first.
 * It defines, for a plain host C++ compiler, the spellings those headers use (written for
 * the emulator, not copied); tests/emu/emu.h then redefines the kernel-facing ones
 * (__device__, __global__, __shared__, ...) for kernel code.
 */
#ifndef __HOST_DEFINES_H__
#define __HOST_DEFINES_H__

#define __no_return__ __attribute__((noreturn))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __inline_hint__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define __maxnreg__(a)
#define __local_maxnreg__(a)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a)
#define __location__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __specialization_static
#define __launch_bounds__(...)
#define __grid_constant__
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __nv_pure__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __cluster_dims__(...)
#define __block_size__(...)
#define __CUDA_ARCH_HAS_FEATURE__(_FEAT) __CUDA_ARCH_FEAT_##_FEAT
#define __CUDA_HAS_ARCH_FAMILY_SPECIFIC(N) 0
#define __CUDA_HAS_ARCH_SPECIFIC(N) 0

#endif
