/* lib.cu — the C entry points of libtessera-cuda.so that build/tessera resolves with
 * dlsym (src/backend/cuda_lib.h): ABI version, devices, versions, and a weak placeholder
 * of the backend entry point that the CUDA backend's own definition (src/backend/cuda/)
 * replaces at link time. Compiled by nvcc only; never linked into build/tessera. */
#include "backend/cuda_lib.h"
#include "util/err.h"

#include <cuda_runtime.h>

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

/* Weak: a library built without the CUDA backend's sources says so instead of failing to
 * load (`tessera devices` still lists the GPUs; --device auto falls back to the CPU). */
__attribute__((weak)) int tessera_cuda_backend_create(const struct model *m, const struct backend_config *cfg,
                                                      const struct backend_ops **ops, void **impl,
                                                      struct backend_info *info, char *err, size_t errlen)
{
    (void)m, (void)cfg, (void)ops, (void)impl, (void)info;
    return err_set(err, errlen, ERR_UNSUPPORTED, "this libtessera-cuda.so was built without the CUDA backend");
}

} /* extern "C" */
