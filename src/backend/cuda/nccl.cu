/* nccl.cu — NCCL's entry points for tensor parallelism, found at run time.
 *
 * Only a group of more than one GPU opens NCCL, so a single-GPU deployment and the build
 * need no NCCL at all: libnccl.so.2 (NVIDIA's CUDA images and the nvidia-nccl wheels ship
 * it) is dlopen'ed when `--tensor-parallel-size` > 1. The handful of types used are NCCL's
 * stable C ABI (cuda_backend.h: struct cu_nccl). Built against the CUDA-on-CPU emulator,
 * the emulator's NCCL (tests/emu/nccl.cc, declared in tests/emu/include/nccl.h) is used
 * instead, so the same code runs in `make test`.
 */
#include "backend/cuda/cuda_backend.h"

extern "C" {
#include "util/err.h"
#include "util/log.h"
}

#include <dlfcn.h>
#include <string.h>

#ifdef TESSERA_EMU_BUILD
#include <nccl.h>

int cu_nccl_open(struct cu_nccl *n, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    memset(n, 0, sizeof *n);
    /* the same C ABI: enums passed as int */
    n->comm_init_all = reinterpret_cast<int (*)(cu_nccl_comm *, int, const int *)>(&ncclCommInitAll);
    n->comm_destroy = reinterpret_cast<int (*)(cu_nccl_comm)>(&ncclCommDestroy);
    n->comm_abort = reinterpret_cast<int (*)(cu_nccl_comm)>(&ncclCommAbort);
    n->all_reduce = reinterpret_cast<int (*)(const void *, void *, size_t, int, int, cu_nccl_comm, cudaStream_t)>(
        &ncclAllReduce);
    n->broadcast = reinterpret_cast<int (*)(const void *, void *, size_t, int, int, cu_nccl_comm, cudaStream_t)>(
        &ncclBroadcast);
    n->error_string = reinterpret_cast<const char *(*)(int)>(&ncclGetErrorString);
    n->get_version = reinterpret_cast<int (*)(int *)>(&ncclGetVersion);
    return 0;
}

void cu_nccl_close(struct cu_nccl *n) { memset(n, 0, sizeof *n); }

#else

int cu_nccl_open(struct cu_nccl *n, char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    const char *names[] = { "libnccl.so.2", "libnccl.so" };
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !n->lib; i++) n->lib = dlopen(names[i], RTLD_NOW);
    if (!n->lib)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "cuda: tensor parallelism needs NCCL and libnccl.so.2 was not found (%s); install NCCL "
                       "(Debian/Ubuntu: libnccl2) or add its directory to LD_LIBRARY_PATH",
                       dlerror());
    struct {
        void **slot;
        const char *sym;
    } syms[] = {
        { (void **)&n->comm_init_all, "ncclCommInitAll" }, { (void **)&n->comm_destroy, "ncclCommDestroy" },
        { (void **)&n->comm_abort, "ncclCommAbort" },       { (void **)&n->all_reduce, "ncclAllReduce" },
        { (void **)&n->broadcast, "ncclBroadcast" },        { (void **)&n->error_string, "ncclGetErrorString" },
        { (void **)&n->get_version, "ncclGetVersion" },
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(n->lib, syms[i].sym);
        if (!*syms[i].slot) {
            int rc = err_set(err, errlen, ERR_UNSUPPORTED, "cuda: libnccl.so.2 lacks %s (NCCL too old?)", syms[i].sym);
            cu_nccl_close(n);
            return rc;
        }
    }
    return 0;
}

void cu_nccl_close(struct cu_nccl *n)
{
    if (n->lib) dlclose(n->lib);
    memset(n, 0, sizeof *n);
}

#endif
