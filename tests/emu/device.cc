/* device.cc — configuration, errors, the seed, aborts, and the emulated device's identity.
 *
 * Per-process state owned here: the configuration read once from the environment
 * (TESSERA_EMU_THREADS, _STACK_KB, _MEM_MB, _DEVICES, _WATCHDOG_S, _SEED), the fiber-order seed (an
 * atomic), and per host thread the last error and the current device (thread-local, as in
 * CUDA). The device looks like an H200 (compute capability 9.0, 132 SMs, 227 KiB opt-in
 * shared memory per block) with the emulated memory size, and its name says "emulated".
 */
#include "internal.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

namespace emu {

static size_t env_size(const char *name, size_t def, size_t lo, size_t hi)
{
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "tessera-emu: %s=%s is not a number in [%zu, %zu]; using %zu\n", name, s, lo, hi, def);
        return def;
    }
    return (size_t)v;
}

const config &cfg()
{
    static const config c = [] {
        config k;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        k.threads = (int)env_size("TESSERA_EMU_THREADS", ncpu < 1 ? 1 : ncpu > 4 ? 4 : (size_t)ncpu, 1, 256);
        k.stack_bytes = env_size("TESSERA_EMU_STACK_KB", 256, 64, 1 << 20) * 1024;
        k.mem_bytes = env_size("TESSERA_EMU_MEM_MB", 16384, 1, 1 << 24) << 20;
        k.devices = (int)env_size("TESSERA_EMU_DEVICES", 1, 1, 64);
        k.watchdog_s = (int)env_size("TESSERA_EMU_WATCHDOG_S", 120, 0, 1 << 20);
        return k;
    }();
    return c;
}

static std::atomic<uint64_t> g_seed{ [] {
    const char *s = getenv("TESSERA_EMU_SEED");
    return s && *s ? (uint64_t)strtoull(s, nullptr, 0) : (uint64_t)0x5eed;
}() };

static thread_local cudaError_t tl_last_error = cudaSuccess;
static thread_local int tl_device = 0;

cudaError_t set_error(cudaError_t e)
{
    if (e != cudaSuccess) tl_last_error = e;
    return e;
}

int current_device() { return tl_device; }

static std::atomic<int> g_sticky{ cudaSuccess };

cudaError_t sticky_error() { return (cudaError_t)g_sticky.load(); }

void set_sticky_error(cudaError_t e) { g_sticky.store(e); }

bool fault_requested(const char *kernel_name)
{
    static std::mutex mu;
    static std::string last, match;
    static long countdown = 0; /* matching launches left before the one that faults */
    static bool fired = true;
    const char *v = getenv("TESSERA_EMU_FAULT");
    std::lock_guard<std::mutex> lk(mu);
    if (!v || !*v) {
        last.clear();
        return false;
    }
    if (last != v) { /* a new value: "NAME" (the first matching launch) or "NAME@N" (the N-th) */
        last = v;
        fired = false;
        const char *at = strrchr(v, '@');
        match = at ? std::string(v, (size_t)(at - v)) : std::string(v);
        countdown = at ? strtol(at + 1, nullptr, 10) - 1 : 0;
        if (countdown < 0) countdown = 0;
    }
    if (fired || !strstr(kernel_name, match.c_str())) return false;
    if (countdown > 0) {
        countdown--;
        return false;
    }
    fired = true;
    return true;
}

void warn(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tessera-emu: %s\n", buf);
}

void fail(const char *fmt, ...)
{
    char buf[12288];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    kernel_context kc;
    uint64_t seed = g_seed.load();
    fprintf(stderr, "tessera-emu: %s\n", buf);
    if (current_kernel(&kc)) {
        seed = kc.L->seed;
        fprintf(stderr, "tessera-emu:   in kernel %s launched at %s:%d, grid (%u,%u,%u) block (%u,%u,%u); "
                        "running block (%u,%u,%u)", kc.L->name, kc.L->file, kc.L->line, kc.L->grid.x, kc.L->grid.y,
                kc.L->grid.z, kc.L->block.x, kc.L->block.y, kc.L->block.z, kc.block.x, kc.block.y, kc.block.z);
        if (kc.thread.x != ~0u) fprintf(stderr, ", thread (%u,%u,%u)", kc.thread.x, kc.thread.y, kc.thread.z);
        fputc('\n', stderr);
    }
    fprintf(stderr, "tessera-emu:   fiber-order seed 0x%llx (replay with TESSERA_EMU_SEED=0x%llx)\n",
            (unsigned long long)seed, (unsigned long long)seed);
    fflush(stderr);
    abort();
}

} // namespace emu

void emu_set_seed(uint64_t seed) { emu::g_seed.store(seed); }
uint64_t emu_get_seed(void) { return emu::g_seed.load(); }

using namespace emu;

/* ---- errors ----------------------------------------------------------------------------- */

#define EMU_ERRORS(X)                                                                          \
    X(cudaSuccess, "no error")                                                                 \
    X(cudaErrorInvalidValue, "invalid argument")                                               \
    X(cudaErrorMemoryAllocation, "out of memory")                                              \
    X(cudaErrorInitializationError, "initialization error")                                    \
    X(cudaErrorCudartUnloading, "driver shutting down")                                        \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")                         \
    X(cudaErrorInvalidPitchValue, "invalid pitch argument")                                    \
    X(cudaErrorInvalidSymbol, "invalid device symbol")                                         \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                 \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                    \
    X(cudaErrorMissingConfiguration, "__global__ function call is not configured")             \
    X(cudaErrorInvalidDeviceFunction, "invalid device function")                               \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                 \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                        \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                    \
    X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")                \
    X(cudaErrorLaunchTimeout, "the launch timed out and was terminated")                       \
    X(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled")                     \
    X(cudaErrorPeerAccessNotEnabled, "peer access has not been enabled")                       \
    X(cudaErrorSetOnActiveProcess, "cannot set while device is active in this process")        \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                     \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                               \
    X(cudaErrorNotReady, "device not ready")                                                   \
    X(cudaErrorNotSupported, "operation not supported")                                        \
    X(cudaErrorNotPermitted, "operation not permitted")                                        \
    X(cudaErrorIllegalState, "the operation cannot be performed in the present state")         \
    X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")   \
    X(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture") \
    X(cudaErrorStreamCaptureMerge, "operation would result in a merge of separate capture sequences") \
    X(cudaErrorStreamCaptureUnmatched, "capture was not ended in the same stream as it began") \
    X(cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work")                    \
    X(cudaErrorStreamCaptureIsolation, "dependency created on uncaptured work in another stream") \
    X(cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream") \
    X(cudaErrorCapturedEvent, "operation not permitted on an event last recorded in a capturing stream") \
    X(cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence from another thread") \
    X(cudaErrorGraphExecUpdateFailure, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update") \
    X(cudaErrorUnknown, "unknown error")

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
#define X(code, text)                                                                          \
    if (e == code) return text;
    EMU_ERRORS(X)
#undef X
    return "unrecognized error code";
}

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
#define X(code, text)                                                                          \
    if (e == code) return #code;
    EMU_ERRORS(X)
#undef X
    return "cudaErrorUnknown";
}

extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tl_last_error;
    tl_last_error = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) { return tl_last_error; }

/* ---- devices ---------------------------------------------------------------------------- */

extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return set_error(cudaErrorInvalidValue);
    *count = cfg().devices;
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= cfg().devices) return set_error(cudaErrorInvalidDevice);
    tl_device = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device)
{
    if (!device) return set_error(cudaErrorInvalidValue);
    *device = tl_device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* The H200's numbers (SXM, 141 GB part; memory size = the emulated size). */
enum {
    H200_SMS = 132,
    H200_SMEM_BLOCK = 49152,
    H200_SMEM_OPTIN = 232448,
    H200_SMEM_SM = 233472,
    H200_REGS = 65536,
    H200_CLOCK_KHZ = 1980000,
    H200_MEM_CLOCK_KHZ = 3201000,
    H200_BUS_BITS = 6144,
    H200_L2 = 50 * 1024 * 1024,
};

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (!p) return set_error(cudaErrorInvalidValue);
    if (device < 0 || device >= cfg().devices) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H200 (emulated on the CPU by tessera)");
    p->uuid.bytes[0] = (char)device;
    p->totalGlobalMem = cfg().mem_bytes;
    p->sharedMemPerBlock = H200_SMEM_BLOCK;
    p->regsPerBlock = H200_REGS;
    p->warpSize = 32;
    p->memPitch = (size_t)INT_MAX;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = INT_MAX;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 512;
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = H200_SMS;
    p->canMapHostMemory = 1;
    p->surfaceAlignment = 512;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = 0x18 + device;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = H200_BUS_BITS;
    p->l2CacheSize = H200_L2;
    p->persistingL2CacheMaxSize = H200_L2 * 3 / 4;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor = H200_SMEM_SM;
    p->regsPerMultiprocessor = H200_REGS;
    p->managedMemory = 1;
    p->hostNativeAtomicSupported = 0;
    p->concurrentManagedAccess = 1;
    p->computePreemptionSupported = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin = H200_SMEM_OPTIN;
    p->maxBlocksPerMultiProcessor = 32;
    p->accessPolicyMaxWindowSize = 134213632;
    p->reservedSharedMemPerBlock = 1024;
    p->hostRegisterSupported = 1;
    p->memoryPoolsSupported = 1;
    p->clusterLaunch = 1;
#if CUDART_VERSION < 13000
    p->clockRate = H200_CLOCK_KHZ;
    p->memoryClockRate = H200_MEM_CLOCK_KHZ;
    p->deviceOverlap = 1;
#endif
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (!value) return set_error(cudaErrorInvalidValue);
    if (device < 0 || device >= cfg().devices) return set_error(cudaErrorInvalidDevice);
    int v;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: v = 1024; break;
    case cudaDevAttrMaxBlockDimX: v = 1024; break;
    case cudaDevAttrMaxBlockDimY: v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: v = 64; break;
    case cudaDevAttrMaxGridDimX: v = INT_MAX; break;
    case cudaDevAttrMaxGridDimY: v = 65535; break;
    case cudaDevAttrMaxGridDimZ: v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: v = H200_SMEM_BLOCK; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = H200_SMEM_OPTIN; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = H200_SMEM_SM; break;
    case cudaDevAttrTotalConstantMemory: v = 65536; break;
    case cudaDevAttrWarpSize: v = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: v = H200_REGS; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: v = H200_REGS; break;
    case cudaDevAttrClockRate: v = H200_CLOCK_KHZ; break;
    case cudaDevAttrMemoryClockRate: v = H200_MEM_CLOCK_KHZ; break;
    case cudaDevAttrGlobalMemoryBusWidth: v = H200_BUS_BITS; break;
    case cudaDevAttrL2CacheSize: v = H200_L2; break;
    case cudaDevAttrMultiProcessorCount: v = H200_SMS; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: v = 2048; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: v = 32; break;
    case cudaDevAttrComputeCapabilityMajor: v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: v = 0; break;
    case cudaDevAttrConcurrentKernels: v = 1; break;
    case cudaDevAttrUnifiedAddressing: v = 1; break;
    case cudaDevAttrAsyncEngineCount: v = 2; break;
    case cudaDevAttrCanMapHostMemory: v = 1; break;
    case cudaDevAttrEccEnabled: v = 1; break;
    case cudaDevAttrPciBusId: v = 0x18 + device; break;
    case cudaDevAttrPciDeviceId: v = 0; break;
    case cudaDevAttrPciDomainId: v = 0; break;
    case cudaDevAttrStreamPrioritiesSupported: v = 1; break;
    case cudaDevAttrGlobalL1CacheSupported: v = 1; break;
    case cudaDevAttrLocalL1CacheSupported: v = 1; break;
    case cudaDevAttrManagedMemory: v = 1; break;
    case cudaDevAttrCooperativeLaunch: v = 1; break;
    case cudaDevAttrMemoryPoolsSupported: v = 1; break;
    case cudaDevAttrHostRegisterSupported: v = 1; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: v = 1024; break;
    case cudaDevAttrIntegrated: v = 0; break;
    default: v = 0; break;
    }
    *value = v;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    if (!can) return set_error(cudaErrorInvalidValue);
    if (device < 0 || device >= cfg().devices || peer < 0 || peer >= cfg().devices)
        return set_error(cudaErrorInvalidDevice);
    *can = device != peer;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    if (peer < 0 || peer >= cfg().devices || peer == tl_device || flags) return set_error(cudaErrorInvalidDevice);
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceDisablePeerAccess(int peer)
{
    if (peer < 0 || peer >= cfg().devices || peer == tl_device) return set_error(cudaErrorInvalidDevice);
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    (void)flags;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value)
{
    (void)limit;
    (void)value;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetLimit(size_t *value, cudaLimit limit)
{
    if (!value) return set_error(cudaErrorInvalidValue);
    switch (limit) {
    case cudaLimitStackSize: *value = cfg().stack_bytes; break;
    case cudaLimitPrintfFifoSize: *value = 1 << 20; break;
    case cudaLimitMallocHeapSize: *value = 8 << 20; break;
    default: *value = 0; break;
    }
    return cudaSuccess;
}
