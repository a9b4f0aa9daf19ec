/* launch.cc — emu_launch, per-kernel attributes, occupancy.
 *
 * emu_launch checks the launch configuration against the H200's limits synchronously (so
 * the launcher's cudaGetLastError() sees the error, as after kernel<<<>>>), then hands the
 * grid to the stream as one op (stream.cc), which runs it with run_grid (block.cc) or
 * records it when the stream is capturing. The kernel's arguments were captured by value
 * in `body` at the launch, as CUDA copies them.
 *
 * State: the per-kernel attributes set with cudaFuncSetAttribute (a map keyed by the
 * kernel's address, under a mutex), for the life of the process.
 */
#include "internal.h"

#include <unordered_map>

namespace emu {

namespace {

struct func_attrs {
    int max_dynamic_smem = 48 * 1024;
    bool opted_in = false;
    int carveout = -1;
};

std::mutex &attrs_mutex()
{
    static std::mutex *m = new std::mutex();
    return *m;
}

std::unordered_map<const void *, func_attrs> &attrs_map()
{
    static auto *m = new std::unordered_map<const void *, func_attrs>();
    return *m;
}

func_attrs get_attrs(const void *func)
{
    std::lock_guard<std::mutex> lk(attrs_mutex());
    auto it = attrs_map().find(func);
    return it == attrs_map().end() ? func_attrs() : it->second;
}

enum { SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 232448 };

} // namespace

} // namespace emu

using namespace emu;

void emu_launch(const void *func, const char *name, const char *file, int line, dim3 grid, dim3 block,
                size_t smem, cudaStream_t stream, bool pdl, std::function<void()> body)
{
    if (cudaError_t sticky = sticky_error()) {
        set_error(sticky);
        return;
    }
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        threads > 1024) {
        warn("launch of %s at %s:%d: block (%u,%u,%u) is not a valid block (at most 1024 threads, "
             "1024 x 1024 x 64)", name, file, line, block.x, block.y, block.z);
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > (unsigned)INT_MAX || grid.y > 65535 ||
        grid.z > 65535) {
        warn("launch of %s at %s:%d: grid (%u,%u,%u) is not a valid grid (at most 2^31-1 x 65535 x 65535, none 0)",
             name, file, line, grid.x, grid.y, grid.z);
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    func_attrs fa = get_attrs(func);
    if (smem > (size_t)fa.max_dynamic_smem) {
        warn("launch of %s at %s:%d: %zu bytes of dynamic shared memory exceed the kernel's limit of %d%s", name,
             file, line, smem, fa.max_dynamic_smem,
             fa.opted_in ? "" : " (raise it with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))");
        set_error(cudaErrorInvalidValue);
        return;
    }
    auto L = std::make_shared<launch>();
    L->body = std::move(body);
    L->func = func;
    L->name = name;
    L->file = file;
    L->line = line;
    L->grid = grid;
    L->block = block;
    L->smem = smem;
    L->smem_limit = fa.opted_in ? SMEM_OPTIN : SMEM_DEFAULT;
    L->seed = emu_get_seed();
    L->fault = fault_requested(name);
    L->pdl = pdl;
    if (L->fault) warn("launch of %s at %s:%d: TESSERA_EMU_FAULT: it will fault when it runs", name, file, line);
    cudaError_t e = enqueue(stream, op{ [L] {
                                           if (L->fault) set_sticky_error(cudaErrorIllegalAddress);
                                           else run_grid(*L);
                                       },
                                        name });
    if (e != cudaSuccess) {
        warn("launch of %s at %s:%d: %s", name, file, line, cudaGetErrorString(e));
        set_error(e);
    }
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    std::lock_guard<std::mutex> lk(attrs_mutex());
    func_attrs &fa = attrs_map()[func];
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || value > SMEM_OPTIN) return set_error(cudaErrorInvalidValue);
        fa.max_dynamic_smem = value;
        fa.opted_in = true;
        return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        if (value < -1 || value > 100) return set_error(cudaErrorInvalidValue);
        fa.carveout = value;
        return cudaSuccess;
    default: return cudaSuccess;
    }
}

extern "C" cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, const void *func)
{
    if (!attr || !func) return set_error(cudaErrorInvalidValue);
    func_attrs fa = get_attrs(func);
    memset(attr, 0, sizeof *attr);
    attr->sharedSizeBytes = 0; /* static shared memory is only known while the kernel runs */
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = fa.max_dynamic_smem;
    attr->preferredShmemCarveout = fa.carveout;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFuncSetCacheConfig(const void *func, cudaFuncCache config)
{
    (void)func;
    (void)config;
    return cudaSuccess;
}

/* Plausible H200 residency assuming 32 registers per thread and no static shared memory. */
extern "C" cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *num_blocks, const void *func,
                                                                     int block_size, size_t dynamic_smem)
{
    if (!num_blocks || !func || block_size <= 0 || block_size > 1024) return set_error(cudaErrorInvalidValue);
    int warps = (block_size + 31) / 32;
    int by_threads = 64 / warps;
    int by_regs = 65536 / (32 * 32 * warps);
    int by_smem = (int)(233472 / (dynamic_smem + 1024));
    int n = by_threads < by_regs ? by_threads : by_regs;
    n = n < by_smem ? n : by_smem;
    *num_blocks = n < 32 ? n : 32;
    return cudaSuccess;
}

extern "C" cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *num_blocks, const void *func,
                                                                              int block_size, size_t dynamic_smem,
                                                                              unsigned int flags)
{
    (void)flags;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks, func, block_size, dynamic_smem);
}
