/* cuda_lib.h — finding and loading the CUDA backend library at run time.
 *
 * build/tessera never links CUDA: everything that does (the kernels, cuBLAS, the CUDA
 * runtime) lives in libtessera-cuda.so, which this module dlopen()s on demand — the way
 * llama.cpp and Ollama load their GPU backends — so the same binary starts and serves on
 * the CPU on a machine with no NVIDIA driver and no CUDA libraries.
 *
 * The library is looked up in this order: $TESSERA_CUDA_LIB (a path; "none" disables
 * the GPU), then libtessera-cuda.so beside the executable, then the dynamic loader's
 * search path. Its entry points are C functions with a version check
 * (tessera_cuda_abi_version() must equal TESSERA_CUDA_ABI).
 *
 * ABI 2 adds tessera_cuda_backend_create (a backend_create_fn, backend_impl.h): the CUDA
 * implementation of backend.h, which backend.c enters for --device cuda / auto. The
 * structs it receives (struct model, struct backend_config, struct batch, struct sampler)
 * cross the boundary by pointer, so the library must be built from the same sources as
 * the binary — which the ABI number guards.
 *
 * ABI 3: struct backend_config gains tensor_parallel_size; tessera_cuda_nccl_version
 * reports the NCCL that tensor parallelism would load.
 */
#ifndef TESSERA_BACKEND_CUDA_LIB_H
#define TESSERA_BACKEND_CUDA_LIB_H

#include "backend/backend_impl.h"

#include <stddef.h>

#define TESSERA_CUDA_ABI 3

/* One GPU as the library reports it. */
struct cuda_device_info {
    char name[256];
    int major, minor;         /* compute capability */
    int sm_count;
    size_t total_mem, free_mem;
};

/* The library's entry points (see src/backend/cuda/lib.cu). */
struct cuda_lib {
    void *handle;
    char path[4096];
    int (*abi_version)(void);
    /* number of usable devices (>= 0), or a negative error with detail in err */
    int (*device_count)(char *err, size_t errlen);
    /* 0 or a negative error with detail in err */
    int (*device_info)(int device, struct cuda_device_info *out, char *err, size_t errlen);
    /* runtime and driver versions as 1000*major + 10*minor; 0 when unknown */
    void (*versions)(int *runtime, int *driver);
    /* the library keeps its own copy of util/log.c (RTLD_LOCAL): cuda_lib_open passes the
     * process's level (enum log_level) on after loading it */
    void (*set_log_level)(int level);
    /* the NCCL version tensor parallelism would use (10000*major + 100*minor + patch), or
     * a negative error with why it cannot be loaded in err */
    int (*nccl_version)(char *err, size_t errlen);
    /* the CUDA backend (backend_impl.h contract) */
    backend_create_fn create;
};

/* Loads the library into *lib. Returns 0, or ERR_NOT_FOUND (no library: the normal case
 * on a CPU-only machine) / ERR_UNSUPPORTED (found but unusable: missing CUDA runtime,
 * wrong ABI) with the reason in err. Any thread; the caller owns *lib (cuda_lib_close). */
int cuda_lib_open(struct cuda_lib *lib, char *err, size_t errlen);
void cuda_lib_close(struct cuda_lib *lib);

#endif
