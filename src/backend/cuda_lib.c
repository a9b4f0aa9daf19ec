/* cuda_lib.c — dlopen() of libtessera-cuda.so (contract in cuda_lib.h). */
#define _GNU_SOURCE
#include "backend/cuda_lib.h"

#include "util/err.h"
#include "util/log.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_LIB_NAME "libtessera-cuda.so"

/* dirname of /proc/self/exe + "/" + name, or "" when the executable cannot be found */
static void beside_exe(char *out, size_t n, const char *name)
{
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    out[0] = 0;
    if (len <= 0) return;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    size_t dir = (size_t)(slash - exe) + 1, nl = strlen(name);
    if (dir + nl + 1 > n) return;
    memcpy(out, exe, dir);
    memcpy(out + dir, name, nl + 1);
}

static int try_open(struct cuda_lib *lib, const char *path, char *why, size_t whylen)
{
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, whylen, "%s", e ? e : "dlopen failed");
        return -1;
    }
    lib->handle = h;
    snprintf(lib->path, sizeof lib->path, "%s", path);
    return 0;
}

int cuda_lib_open(struct cuda_lib *lib, char *err, size_t errlen)
{
    memset(lib, 0, sizeof *lib);
    char why[1024] = "", path[4096];
    const char *env = getenv("TESSERA_CUDA_LIB");
    if (env && !strcmp(env, "none"))
        return err_set(err, errlen, ERR_NOT_FOUND, "CUDA backend disabled (TESSERA_CUDA_LIB=none)");
    if (env && *env) {
        if (try_open(lib, env, why, sizeof why))
            return err_set(err, errlen, access(env, F_OK) ? ERR_NOT_FOUND : ERR_UNSUPPORTED,
                           "CUDA backend %s: %s", env, why);
    } else {
        beside_exe(path, sizeof path, CUDA_LIB_NAME);
        if (!path[0] || access(path, F_OK) || try_open(lib, path, why, sizeof why)) {
            /* a library that exists but does not load (no libcudart, no driver) is worth
             * reporting; a missing one is the normal CPU-only case */
            int exists = path[0] && !access(path, F_OK);
            if (exists || try_open(lib, CUDA_LIB_NAME, why, sizeof why))
                return err_set(err, errlen, exists ? ERR_UNSUPPORTED : ERR_NOT_FOUND, "CUDA backend %s: %s",
                               exists ? path : CUDA_LIB_NAME, why);
        }
    }
    /* dlsym returns void *; converting it to a function pointer is what POSIX requires
     * to work (the memcpy keeps -Wpedantic quiet). */
#define SYM(field, name)                                                                   \
    do {                                                                                   \
        void *p_ = dlsym(lib->handle, name);                                               \
        if (!p_) {                                                                         \
            snprintf(why, sizeof why, "missing symbol %s", name);                          \
            goto fail;                                                                     \
        }                                                                                  \
        memcpy(&lib->field, &p_, sizeof p_);                                               \
    } while (0)
    SYM(abi_version, "tessera_cuda_abi_version");
    SYM(device_count, "tessera_cuda_device_count");
    SYM(device_info, "tessera_cuda_device_info");
    SYM(versions, "tessera_cuda_versions");
    SYM(set_log_level, "tessera_cuda_set_log_level");
    SYM(nccl_version, "tessera_cuda_nccl_version");
    SYM(create, "tessera_cuda_backend_create");
#undef SYM
    if (lib->abi_version() != TESSERA_CUDA_ABI) {
        snprintf(why, sizeof why, "ABI %d, this binary needs %d (rebuild both)", lib->abi_version(),
                 TESSERA_CUDA_ABI);
        goto fail;
    }
    lib->set_log_level((int)log_get_level());
    return 0;
fail:
    err_set(err, errlen, ERR_UNSUPPORTED, "CUDA backend %s: %s", lib->path, why);
    cuda_lib_close(lib);
    return ERR_UNSUPPORTED;
}

void cuda_lib_close(struct cuda_lib *lib)
{
    if (lib->handle) dlclose(lib->handle);
    memset(lib, 0, sizeof *lib);
}
