/* lib.cu — the C entry points of libtessera-cuda.so that build/tessera resolves with
 * dlsym (src/backend/cuda_lib.h): ABI version, devices, versions, the log level; the
 * backend itself is tessera_cuda_backend_create (create.cu). Compiled by nvcc for the
 * GPU, and by g++ against the CUDA-on-CPU emulator into libtessera-cuda-emu.so (tests);
 * never linked into build/tessera. */
#include "backend/cuda_lib.h"
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

extern "C" {
#include "util/err.h"
#include "util/log.h"
}

#include <stdio.h>
#include <string.h>

extern "C" {

int tessera_cuda_abi_version(void) { return TESSERA_CUDA_ABI; }

int tessera_cuda_device_count(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (err && errlen) snprintf(err, errlen, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return -1;
    }
    return n;
}

int tessera_cuda_device_info(int device, struct cuda_device_info *out, char *err, size_t errlen)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e == cudaSuccess) e = cudaSetDevice(device);
    size_t free_b = 0, total_b = 0;
    if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        if (err && errlen) snprintf(err, errlen, "device %d: %s", device, cudaGetErrorString(e));
        return -1;
    }
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->total_mem = total_b;
    out->free_mem = free_b;
    return 0;
}

void tessera_cuda_versions(int *runtime, int *driver)
{
    *runtime = 0;
    *driver = 0;
    cudaRuntimeGetVersion(runtime);
    cudaDriverGetVersion(driver);
}

int tessera_cuda_nccl_version(char *err, size_t errlen)
{
    struct cu_nccl n;
    char why[ERR_BUF];
    int v = 0;
    if (cu_nccl_open(&n, why, sizeof why)) {
        if (err && errlen) snprintf(err, errlen, "%s", why);
        return -1;
    }
    n.get_version(&v);
    cu_nccl_close(&n);
    return v;
}

/* The library has its own copy of util/log.c (it is loaded with RTLD_LOCAL): the binary
 * passes its level on after loading it, so the backend logs at the process's level. */
void tessera_cuda_set_log_level(int level)
{
    if (level >= LOG_LEVEL_ERR && level <= LOG_LEVEL_DEBUG) log_set_level((enum log_level)level);
}

} /* extern "C" */
