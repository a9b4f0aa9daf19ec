/* memory.cc — device and pinned allocations, bounds-checked copies and memsets.
 *
 * "Device" memory is host memory from posix_memalign (256-byte aligned, exact size, so
 * ASan sees a kernel's out-of-bounds access to it), filled with 0xFF bytes on allocation
 * (NaN / -1: a kernel that reads what nobody wrote shows up). Pinned host memory
 * (cudaMallocHost, cudaHostAlloc, cudaHostRegister) is registered too. The registry of live
 * allocations (a map from start address, under a mutex) lets every copy and memset check
 * its ranges: a device or pinned range must lie inside one live allocation and match the
 * copy kind (cudaMemcpyDefault infers it); a violation returns cudaErrorInvalidValue and
 * prints why. Device memory is accounted against the emulated total (TESSERA_EMU_MEM_MB)
 * per device.
 *
 * Copies and memsets run in stream order (stream.cc). As in CUDA: cudaMemcpy/cudaMemset
 * are synchronous; cudaMemcpyAsync from pageable memory to the device copies the source
 * at the call (the host may reuse it at once), to pageable memory it waits for the copy;
 * with pinned memory both sides are read when the copy runs. cudaFree and cudaFreeHost
 * wait for the device first.
 */
#include "internal.h"

#include <map>

namespace emu {

namespace {

struct alloc {
    size_t size;
    mem_kind kind;
    int device;
    bool owned; /* false: cudaHostRegister'ed user memory */
};

struct mem_state {
    std::mutex mu;
    std::map<uintptr_t, alloc> live;
    std::vector<size_t> used; /* device bytes per device */
};

mem_state &M()
{
    static mem_state *m = [] {
        mem_state *s = new mem_state();
        s->used.assign((size_t)cfg().devices, 0);
        return s;
    }();
    return *m;
}

const char *kind_name(mem_kind k)
{
    return k == MEM_DEVICE ? "device" : k == MEM_PINNED ? "pinned host" : "pageable host";
}

/* The live allocation containing p, or null. Lock held. */
const std::pair<const uintptr_t, alloc> *find_locked(const void *p)
{
    mem_state &m = M();
    auto it = m.live.upper_bound((uintptr_t)p);
    if (it == m.live.begin()) return nullptr;
    --it;
    uintptr_t a = (uintptr_t)p;
    if (a >= it->first && a < it->first + (it->second.size ? it->second.size : 1)) return &*it;
    return nullptr;
}

/* What [p, p+n) is: the kind of the allocation holding p (pageable when none). Sets *ok
 * false and writes why into why when the range leaves its allocation or, for pageable
 * memory, overlaps a registered one. */
mem_kind classify(const void *p, size_t n, bool *ok, char *why, size_t cap)
{
    std::lock_guard<std::mutex> lk(M().mu);
    *ok = true;
    const auto *a = find_locked(p);
    if (a) {
        uintptr_t end = a->first + a->second.size;
        if ((uintptr_t)p + n > end) {
            *ok = false;
            snprintf(why, cap, "[%p, +%zu) runs %zu bytes past the end of its %s allocation [%p, +%zu)", p, n,
                     (size_t)((uintptr_t)p + n - end), kind_name(a->second.kind), (void *)a->first,
                     a->second.size);
        }
        return a->second.kind;
    }
    auto it = M().live.upper_bound((uintptr_t)p);
    if (n && it != M().live.end() && it->first < (uintptr_t)p + n) {
        *ok = false;
        snprintf(why, cap, "[%p, +%zu) starts outside any allocation and runs into the %s allocation [%p, +%zu)", p,
                 n, kind_name(it->second.kind), (void *)it->first, it->second.size);
    }
    return MEM_PAGEABLE;
}

/* Checks one side of a copy: its range and that its kind is what `want` says (host:
 * pageable or pinned; device: device). */
bool check_side(const char *api, const char *side, const void *p, size_t n, bool want_device, mem_kind *kind)
{
    char why[512];
    bool ok;
    *kind = classify(p, n, &ok, why, sizeof why);
    if (!ok) {
        warn("%s: %s %s", api, side, why);
        return false;
    }
    bool is_device = *kind == MEM_DEVICE;
    if (is_device != want_device) {
        if (want_device)
            warn("%s: %s %p is %s memory, not inside a live device allocation (freed, never allocated, or the "
                 "wrong copy kind)", api, side, p, kind_name(*kind));
        else
            warn("%s: %s %p is device memory but the copy kind says host", api, side, p);
        return false;
    }
    return true;
}

/* Validates a copy of n bytes (rows x width with pitches for 2D) and resolves its kind. */
bool check_copy(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                size_t height, cudaMemcpyKind kind, mem_kind *dk, mem_kind *sk)
{
    if (height == 0 || width == 0) {
        *dk = *sk = MEM_PAGEABLE;
        return true;
    }
    if (!dst || !src) {
        warn("%s: null pointer", api);
        return false;
    }
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    bool dd, sd;
    switch (kind) {
    case cudaMemcpyHostToHost: dd = false, sd = false; break;
    case cudaMemcpyHostToDevice: dd = true, sd = false; break;
    case cudaMemcpyDeviceToHost: dd = false, sd = true; break;
    case cudaMemcpyDeviceToDevice: dd = true, sd = true; break;
    case cudaMemcpyDefault: {
        char why[512];
        bool ok1, ok2;
        *dk = classify(dst, dspan, &ok1, why, sizeof why);
        if (!ok1) {
            warn("%s: dst %s", api, why);
            return false;
        }
        *sk = classify(src, sspan, &ok2, why, sizeof why);
        if (!ok2) {
            warn("%s: src %s", api, why);
            return false;
        }
        return true;
    }
    default: warn("%s: invalid copy kind %d", api, (int)kind); return false;
    }
    return check_side(api, "dst", dst, dspan, dd, dk) && check_side(api, "src", src, sspan, sd, sk);
}

void copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height)
{
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

/* Enqueues a copy on s (sync: and waits for it). */
cudaError_t do_copy(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height, cudaMemcpyKind kind, cudaStream_t s, bool sync)
{
    if (width > dpitch || width > spitch) {
        if (height > 1) return set_error(cudaErrorInvalidPitchValue);
        dpitch = spitch = width;
    }
    mem_kind dk, sk;
    if (!check_copy(api, dst, dpitch, src, spitch, width, height, kind, &dk, &sk)) return set_error(cudaErrorInvalidValue);
    if (width == 0 || height == 0) return cudaSuccess;
    if (sync) {
        cudaError_t e = check_sync_allowed(api);
        if (e != cudaSuccess) return set_error(e);
    }
    bool capturing = stream_capturing(s);
    op o;
    o.what = api;
    if (!sync && !capturing && sk == MEM_PAGEABLE && dk != MEM_PAGEABLE) {
        /* Pageable source: staged at the call, the host may reuse it at once. */
        auto staged = std::make_shared<std::vector<char>>(dpitch * (height - 1) + width);
        copy_2d(staged->data(), dpitch, src, spitch, width, height);
        o.run = [dst, staged] { memcpy(dst, staged->data(), staged->size()); };
    } else {
        o.run = [=] { copy_2d(dst, dpitch, src, spitch, width, height); };
    }
    uint64_t seq;
    cudaError_t e = enqueue(s, std::move(o), &seq);
    if (e != cudaSuccess) return set_error(e);
    if (sync || (!capturing && dk == MEM_PAGEABLE && sk != MEM_PAGEABLE)) wait_op(s, seq);
    return cudaSuccess;
}

cudaError_t do_memset(const char *api, void *p, size_t pitch, int value, size_t width, size_t height,
                      cudaStream_t s, bool sync)
{
    if (width == 0 || height == 0) return cudaSuccess;
    if (width > pitch) {
        if (height > 1) return set_error(cudaErrorInvalidPitchValue);
        pitch = width;
    }
    if (!check_device_span(p, pitch * (height - 1) + width, true, api)) return set_error(cudaErrorInvalidValue);
    if (sync) {
        cudaError_t e = check_sync_allowed(api);
        if (e != cudaSuccess) return set_error(e);
    }
    uint64_t seq;
    cudaError_t e = enqueue(s, op{ [=] {
                                      for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, value, width);
                                  },
                                   api },
                            &seq);
    if (e != cudaSuccess) return set_error(e);
    if (sync) wait_op(s, seq);
    return cudaSuccess;
}

void register_alloc(void *p, size_t size, mem_kind kind, bool owned)
{
    std::lock_guard<std::mutex> lk(M().mu);
    M().live[(uintptr_t)p] = alloc{ size, kind, current_device(), owned };
}

} // namespace

bool check_device_span(const void *p, size_t n, bool allow_pinned, const char *what)
{
    char why[512];
    bool ok;
    if (!p) {
        warn("%s: null pointer", what);
        return false;
    }
    mem_kind k = classify(p, n, &ok, why, sizeof why);
    if (!ok) {
        warn("%s: %s", what, why);
        return false;
    }
    if (k == MEM_DEVICE || (allow_pinned && k == MEM_PINNED)) return true;
    warn("%s: %p is not inside a live device allocation (freed, never allocated, or host memory)", what, p);
    return false;
}

} // namespace emu

using namespace emu;

/* ---- L2 prefetch (emu.h) ------------------------------------------------------------------ */

static std::atomic<uint64_t> l2_prefetched{ 0 };

void emu_l2_prefetch(const void *p, size_t n)
{
    if (((uintptr_t)p & 15) != 0 || (n & 15) != 0 || n == 0)
        fail("cp.async.bulk.prefetch.L2 of [%p, +%zu): the address must be 16-byte aligned and the size a "
             "non-zero multiple of 16", p, n);
    if (!check_device_span(p, n, false, "cp.async.bulk.prefetch.L2"))
        fail("cp.async.bulk.prefetch.L2 of [%p, +%zu) is not inside one live device allocation", p, n);
    l2_prefetched.fetch_add(n, std::memory_order_relaxed);
}

uint64_t emu_l2_prefetched_bytes(void) { return l2_prefetched.load(std::memory_order_relaxed); }

/* The same count under a name the emulated backend library exports (exports.map:
 * tessera_cuda_*), for tests that reach the library through dlopen: test_cuda_backend's
 * L2 prefetch test. Only the emulator defines it; the real library has no such symbol. */
extern "C" uint64_t tessera_cuda_emu_l2_prefetched_bytes(void) { return emu_l2_prefetched_bytes(); }

/* ---- allocation ------------------------------------------------------------------------- */

extern "C" cudaError_t cudaMalloc(void **p, size_t size)
{
    if (!p) return set_error(cudaErrorInvalidValue);
    *p = nullptr;
    cudaError_t e = check_sync_allowed("cudaMalloc");
    if (e != cudaSuccess) return set_error(e);
    if (size == 0) return cudaSuccess;
    int dev = current_device();
    {
        std::lock_guard<std::mutex> lk(M().mu);
        if (size > cfg().mem_bytes - M().used[dev]) return set_error(cudaErrorMemoryAllocation);
        M().used[dev] += size;
    }
    void *q = nullptr;
    if (posix_memalign(&q, 256, size) != 0) {
        std::lock_guard<std::mutex> lk(M().mu);
        M().used[dev] -= size;
        return set_error(cudaErrorMemoryAllocation);
    }
    memset(q, 0xff, size);
    register_alloc(q, size, MEM_DEVICE, true);
    *p = q;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
    (void)s;
    return cudaMalloc(p, size);
}

static cudaError_t free_kind(void *p, mem_kind kind, const char *api)
{
    if (!p) return cudaSuccess;
    cudaError_t e = check_sync_allowed(api);
    if (e != cudaSuccess) return set_error(e);
    sync_all_streams(); /* like CUDA: freeing waits for the device */
    alloc a;
    {
        std::lock_guard<std::mutex> lk(M().mu);
        auto it = M().live.find((uintptr_t)p);
        if (it == M().live.end() || it->second.kind != kind || !it->second.owned) {
            warn("%s(%p): not the start of a live %s allocation (double free, or the wrong free)", api, p,
                 kind_name(kind));
            return set_error(cudaErrorInvalidValue);
        }
        a = it->second;
        M().live.erase(it);
        if (kind == MEM_DEVICE) M().used[a.device] -= a.size;
    }
    free(p);
    return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p) { return free_kind(p, MEM_DEVICE, "cudaFree"); }

extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    (void)s;
    return cudaFree(p);
}

extern "C" cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    (void)flags;
    if (!p) return set_error(cudaErrorInvalidValue);
    *p = nullptr;
    if (size == 0) return cudaSuccess;
    void *q = nullptr;
    if (posix_memalign(&q, 256, size) != 0) return set_error(cudaErrorMemoryAllocation);
    memset(q, 0xff, size);
    register_alloc(q, size, MEM_PINNED, true);
    *p = q;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }

extern "C" cudaError_t cudaFreeHost(void *p) { return free_kind(p, MEM_PINNED, "cudaFreeHost"); }

extern "C" cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    (void)flags;
    if (!p || !size) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(M().mu);
    if (find_locked(p)) return set_error(cudaErrorHostMemoryAlreadyRegistered);
    M().live[(uintptr_t)p] = alloc{ size, MEM_PINNED, current_device(), false };
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostUnregister(void *p)
{
    std::lock_guard<std::mutex> lk(M().mu);
    auto it = M().live.find((uintptr_t)p);
    if (it == M().live.end() || it->second.owned) return set_error(cudaErrorHostMemoryNotRegistered);
    M().live.erase(it);
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
    if (!dev || flags) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(M().mu);
    const auto *a = find_locked(host);
    if (!a || a->second.kind != MEM_PINNED) return set_error(cudaErrorInvalidValue);
    *dev = host;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    std::lock_guard<std::mutex> lk(M().mu);
    size_t used = M().used[current_device()];
    if (free_bytes) *free_bytes = cfg().mem_bytes - used;
    if (total) *total = cfg().mem_bytes;
    return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *p)
{
    if (!attr) return set_error(cudaErrorInvalidValue);
    memset(attr, 0, sizeof *attr);
    std::lock_guard<std::mutex> lk(M().mu);
    const auto *a = find_locked(p);
    if (!a) {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2;
        return cudaSuccess;
    }
    attr->type = a->second.kind == MEM_DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attr->device = a->second.device;
    attr->devicePointer = (void *)p;
    attr->hostPointer = a->second.kind == MEM_DEVICE ? nullptr : (void *)p;
    return cudaSuccess;
}

/* ---- copies and memsets ----------------------------------------------------------------- */

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaError_t e = do_copy("cudaMemcpy", dst, n, src, n, n, 1, kind, nullptr, true);
    return e != cudaSuccess ? e : set_error(sticky_error());
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s)
{
    return do_copy("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, s, false);
}

extern "C" cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                    size_t height, cudaMemcpyKind kind)
{
    return do_copy("cudaMemcpy2D", dst, dpitch, src, spitch, width, height, kind, nullptr, true);
}

extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                         size_t height, cudaMemcpyKind kind, cudaStream_t s)
{
    return do_copy("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, s, false);
}

extern "C" cudaError_t cudaMemcpyPeer(void *dst, int dst_dev, const void *src, int src_dev, size_t n)
{
    (void)dst_dev;
    (void)src_dev;
    return do_copy("cudaMemcpyPeer", dst, n, src, n, n, 1, cudaMemcpyDeviceToDevice, nullptr, true);
}

extern "C" cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
                                           cudaStream_t s)
{
    (void)dst_dev;
    (void)src_dev;
    return do_copy("cudaMemcpyPeerAsync", dst, n, src, n, n, 1, cudaMemcpyDeviceToDevice, s, false);
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t n)
{
    return do_memset("cudaMemset", p, n, value, n, 1, nullptr, true);
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
    return do_memset("cudaMemsetAsync", p, n, value, n, 1, s, false);
}

extern "C" cudaError_t cudaMemset2D(void *p, size_t pitch, int value, size_t width, size_t height)
{
    return do_memset("cudaMemset2D", p, pitch, value, width, height, nullptr, true);
}

extern "C" cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height,
                                         cudaStream_t s)
{
    return do_memset("cudaMemset2DAsync", p, pitch, value, width, height, s, false);
}

/* Waits for the device, then frees every device and pinned allocation and clears the last
 * error. Unlike CUDA, streams, events and graphs the application created stay valid. */
extern "C" cudaError_t cudaDeviceReset(void)
{
    sync_all_streams();
    std::lock_guard<std::mutex> lk(M().mu);
    for (auto it = M().live.begin(); it != M().live.end();) {
        if (it->second.owned) {
            free((void *)it->first);
            it = M().live.erase(it);
        } else {
            ++it;
        }
    }
    for (size_t &u : M().used) u = 0;
    cudaGetLastError();
    return cudaSuccess;
}
