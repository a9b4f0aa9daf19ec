/* test_emu_runtime.cu — the emulator's runtime: atomics across blocks running in parallel,
 * allocations (poison, accounting, bounds-checked copies), streams and events (order,
 * real asynchrony, the legacy stream's implicit synchronisation), graphs (capture records,
 * replays read current contents, a sync during capture invalidates it), device identity,
 * programmatic dependent launches (the wait every thread of a pdl grid must reach).
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

#include <atomic>
#include <thread>
#include <vector>

/* ---- atomics ---------------------------------------------------------------------------- */

struct atomic_out {
    int isum;
    unsigned usum;
    unsigned long long ullsum;
    float fsum;
    double dsum;
    int imax, imin;
    unsigned umax;
    long long llmin;
    unsigned inc, dec;
    unsigned andv, orv, xorv;
    int cas_count;
    int lock;
    int locked_sum;
    __half hsum;
};

__global__ void atomics_kernel(atomic_out *o)
{
    int g = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    atomicAdd(&o->isum, 1);
    atomicSub(&o->usum, 1u);
    atomicAdd(&o->ullsum, 1ull << 33);
    atomicAdd(&o->fsum, 1.0f);
    atomicAdd(&o->dsum, 0.5);
    atomicMax(&o->imax, g);
    atomicMin(&o->imin, -g);
    atomicMax(&o->umax, (unsigned)g * 3u);
    atomicMin(&o->llmin, -(long long)g * 10000000000ll);
    atomicInc(&o->inc, 999u); /* wraps to 0 after 999 */
    atomicDec(&o->dec, 1000000u);
    atomicAnd(&o->andv, ~(1u << (g & 31)) | 0x1u);
    atomicOr(&o->orv, 1u << (g & 31));
    atomicXor(&o->xorv, (unsigned)g);
    atomicAdd(&o->hsum, __float2half(1.0f));
    /* a CAS counter and a CAS spin lock around a plain read-modify-write */
    int old = o->cas_count, assumed;
    do {
        assumed = old;
        old = atomicCAS(&o->cas_count, assumed, assumed + 1);
    } while (old != assumed);
    if (threadIdx.x == 0) {
        while (atomicCAS(&o->lock, 0, 1) != 0) {
        }
        __threadfence();
        int v = *(volatile int *)&o->locked_sum;
        *(volatile int *)&o->locked_sum = v + (int)blockIdx.x;
        __threadfence();
        atomicExch(&o->lock, 0);
    }
}

static void test_atomics_across_blocks(void)
{
    const int blocks = 512, threads = 128, n = blocks * threads;
    atomic_out init;
    memset(&init, 0, sizeof init);
    init.usum = (unsigned)n;
    init.imax = -1;
    init.imin = 1;
    init.llmin = 0;
    init.dec = 1000000u;
    init.andv = ~0u;
    init.hsum = __float2half(0.0f);
    atomic_out *d;
    cudaMalloc((void **)&d, sizeof *d);
    cudaMemcpy(d, &init, sizeof init, cudaMemcpyHostToDevice);
    TS_LAUNCH(atomics_kernel, blocks, threads, 0, 0, d);
    atomic_out o;
    cudaMemcpy(&o, d, sizeof o, cudaMemcpyDeviceToHost);
    cudaFree(d);
    unsigned x = 0;
    for (int g = 0; g < n; g++) x ^= (unsigned)g;
    CHECK(o.isum == n && o.usum == 0 && o.ullsum == (unsigned long long)n << 33, "sums %d %u %llu", o.isum, o.usum,
          o.ullsum);
    CHECK(o.fsum == (float)n && o.dsum == n * 0.5, "float sums %g %g", o.fsum, o.dsum);
    CHECK(o.imax == n - 1 && o.imin == -(n - 1) && o.umax == (unsigned)(n - 1) * 3u, "max/min %d %d %u", o.imax,
          o.imin, o.umax);
    CHECK(o.llmin == -(long long)(n - 1) * 10000000000ll, "llmin %lld", o.llmin);
    CHECK(o.inc == (unsigned)(n % 1000), "atomicInc %u, want %d", o.inc, n % 1000);
    CHECK(o.dec == 1000000u - n, "atomicDec %u", o.dec);
    CHECK(o.andv == 0x1u && o.orv == ~0u && o.xorv == x, "bit ops %x %x %x", o.andv, o.orv, o.xorv);
    CHECK(o.cas_count == n, "CAS counter %d", o.cas_count);
    CHECK(o.locked_sum == blocks * (blocks - 1) / 2 && o.lock == 0, "locked sum %d", o.locked_sum);
    CHECK(__half2float(o.hsum) == 2048.0f, "half sum %g (fp16 stops counting at 2048)", __half2float(o.hsum));
}

/* ---- allocations ------------------------------------------------------------------------ */

static void test_malloc_poison_and_accounting(void)
{
    size_t free0, total;
    EMU_CHECK_CUDA(cudaMemGetInfo(&free0, &total));
    CHECK(total == (size_t)16384 << 20 || getenv("TESSERA_EMU_MEM_MB"), "total %zu", total);
    float *d;
    EMU_CHECK_CUDA(cudaMalloc((void **)&d, 1 << 20));
    size_t free1;
    cudaMemGetInfo(&free1, &total);
    CHECK(free0 - free1 == 1 << 20, "free went from %zu to %zu", free0, free1);
    std::vector<float> h(1 << 18);
    cudaMemcpy(h.data(), d, 1 << 20, cudaMemcpyDeviceToHost);
    bool all_nan = true;
    for (float v : h) all_nan = all_nan && isnan(v);
    CHECK(all_nan, "fresh device memory is not the 0xFF poison");
    CHECK((uintptr_t)d % 256 == 0, "allocation not 256-byte aligned");
    EMU_CHECK_CUDA(cudaFree(d));
    cudaMemGetInfo(&free1, &total);
    CHECK(free1 == free0, "free memory not restored");
    void *big = nullptr;
    CHECK(cudaMalloc(&big, total + 1) == cudaErrorMemoryAllocation && big == nullptr, "over-allocation accepted");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error not set");
    CHECK(cudaFree(d) == cudaErrorInvalidValue, "double free accepted");
    cudaGetLastError();
}

static void test_bounds_checked_copies(void)
{
    char *d, *pinned;
    std::vector<char> host(4096, 1);
    cudaMalloc((void **)&d, 1000);
    cudaMallocHost((void **)&pinned, 1000);
    CHECK(cudaMemcpy(d, host.data(), 1000, cudaMemcpyHostToDevice) == cudaSuccess, "valid copy refused");
    CHECK(cudaMemcpy(d + 1, host.data(), 1000, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "copy one byte past the allocation accepted");
    CHECK(cudaMemcpy(host.data(), d, 1001, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue, "read past end accepted");
    CHECK(cudaMemcpy(d, d + 500, 100, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "device source with a host-to-device kind accepted");
    CHECK(cudaMemcpy(host.data(), host.data() + 8, 8, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "host source with a device-to-host kind accepted");
    CHECK(cudaMemcpy(pinned, d, 1000, cudaMemcpyDefault) == cudaSuccess, "default kind, pinned <- device refused");
    CHECK(cudaMemcpy(pinned + 1, d, 1000, cudaMemcpyDefault) == cudaErrorInvalidValue,
          "default kind past the pinned buffer accepted");
    CHECK(cudaMemset(host.data(), 0, 16) == cudaErrorInvalidValue, "memset of pageable memory accepted");
    CHECK(cudaMemset(d + 990, 0, 11) == cudaErrorInvalidValue, "memset past the end accepted");
    CHECK(cudaMemset2D(d, 100, 7, 50, 10) == cudaSuccess, "2D memset refused");
    CHECK(cudaMemset2D(d, 100, 7, 50, 11) == cudaErrorInvalidValue, "2D memset past the end accepted");
    CHECK(cudaMemcpy2D(host.data(), 10, d, 100, 10, 10, cudaMemcpyDeviceToHost) == cudaSuccess, "2D copy refused");
    CHECK(host[0] == 7 && host[9] == 7 && host[99] == 7, "2D copy content %d %d %d", host[0], host[9], host[99]);
    CHECK(cudaMemcpy2D(host.data(), 10, d, 100, 101, 2, cudaMemcpyDeviceToHost) == cudaErrorInvalidPitchValue,
          "width over pitch accepted");
    cudaFree(d);
    CHECK(cudaMemcpy(host.data(), d, 10, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "copy from freed memory accepted");
    cudaFreeHost(pinned);
    cudaGetLastError();
}

/* ---- streams and events ----------------------------------------------------------------- */

__global__ void fill_kernel(float *p, float v, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) p[i] = v;
}

__global__ void add_kernel(const float *a, float *b, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) b[i] += a[i];
}

/* ---- programmatic dependent launch ------------------------------------------------------ */

/* b[i] = a[i] + 1, waiting for the previous grid first (what TS_LAUNCH_PDL requires). */
__global__ void pdl_add_kernel(const float *a, float *b, int n)
{
    ts_pdl_launch_dependents();
    ts_pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] = a[i] + 1.0f;
}

/* The same, but thread 5 of each block returns before waiting. */
__global__ void pdl_early_exit_kernel(const float *a, float *b, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x == 5) return;
    ts_pdl_wait();
    if (i < n) b[i] = a[i] + 1.0f;
}

/* A chain of pdl launches, eager and captured, computes what plain launches do; a wait in a
 * grid launched without pdl is allowed (it returns at once on a GPU too); a pdl grid with a
 * thread that exits without waiting aborts, naming the kernel, eager or replayed. */
static void test_pdl_launches(void)
{
    const int n = 1000;
    float *a, *b;
    cudaMalloc((void **)&a, n * sizeof(float));
    cudaMalloc((void **)&b, n * sizeof(float));
    cudaStream_t s;
    EMU_CHECK_CUDA(cudaStreamCreate(&s));
    for (int graph = 0; graph < 2; graph++) {
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        TS_LAUNCH(fill_kernel, 4, 256, 0, s, a, 0.0f, n);
        if (graph) EMU_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        TS_LAUNCH_PDL(pdl_add_kernel, 4, 256, 0, s, 1, a, b, n);
        TS_LAUNCH_PDL(pdl_add_kernel, 4, 256, 0, s, 1, b, a, n);
        TS_LAUNCH_PDL(pdl_add_kernel, 4, 256, 0, s, 0, a, b, n);
        EMU_CHECK_CUDA(cudaGetLastError());
        if (graph) {
            EMU_CHECK_CUDA(cudaStreamEndCapture(s, &g));
            EMU_CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
            EMU_CHECK_CUDA(cudaGraphLaunch(ge, s));
        }
        EMU_CHECK_CUDA(cudaStreamSynchronize(s));
        std::vector<float> h(n);
        cudaMemcpy(h.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
        bool ok = true;
        for (float v : h) ok = ok && v == 3.0f;
        CHECK(ok, "%s pdl chain: b[0] = %g, want 3", graph ? "captured" : "eager", h[0]);
        if (graph) {
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
    }
    cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);

    for (int graph = 0; graph < 2; graph++) {
        emu_child r = emu_run_child([graph] {
            float *a, *b;
            cudaMalloc((void **)&a, 64 * sizeof(float));
            cudaMalloc((void **)&b, 64 * sizeof(float));
            cudaStream_t s;
            cudaStreamCreate(&s);
            cudaGraph_t g;
            cudaGraphExec_t ge;
            if (graph) cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
            TS_LAUNCH_PDL(pdl_early_exit_kernel, 2, 32, 0, s, 1, a, b, 64);
            if (graph) {
                cudaStreamEndCapture(s, &g);
                cudaGraphInstantiate(&ge, g, 0);
                cudaGraphLaunch(ge, s);
            }
            cudaStreamSynchronize(s);
        });
        CHECK(emu_died_by_abort(r), "%s: child did not abort (signal %d, exit %d)", graph ? "graph" : "eager", r.sig,
              r.exit_code);
        CHECK(emu_err_has(r, "exited without calling cudaGridDependencySynchronize()"), "no pdl message");
        CHECK(emu_err_has(r, "pdl_early_exit_kernel"), "kernel name missing");
        CHECK(emu_err_has(r, "thread (5,0,0)"), "thread missing");
    }
    /* the same kernel launched without pdl may skip the wait */
    emu_child r = emu_run_child([] {
        float *a, *b;
        cudaMalloc((void **)&a, 64 * sizeof(float));
        cudaMalloc((void **)&b, 64 * sizeof(float));
        TS_LAUNCH(pdl_early_exit_kernel, 2, 32, 0, 0, a, b, 64);
        cudaDeviceSynchronize();
    });
    CHECK(!r.signaled && r.exit_code == 0, "a plain launch without the wait failed: %s", r.err.c_str());
}

static void test_async_copy_reads_pinned_when_it_runs(void)
{
    const int n = 1024;
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *pinned, *d;
    std::vector<float> pageable(n, 1.0f), out(n);
    cudaMallocHost((void **)&pinned, n * sizeof(float));
    cudaMalloc((void **)&d, 2 * n * sizeof(float));
    for (int i = 0; i < n; i++) pinned[i] = 1.0f;
    gate g;
    cudaLaunchHostFunc(s, wait_gate, &g);
    cudaMemcpyAsync(d, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(d + n, pageable.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "stream idle while its host function blocks");
    for (int i = 0; i < n; i++) pinned[i] = pageable[i] = 2.0f; /* the host races its own copies */
    g.open = 1;
    cudaStreamSynchronize(s);
    CHECK(cudaStreamQuery(s) == cudaSuccess, "stream not idle after synchronize");
    cudaMemcpy(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(out[0] == 2.0f && out[n - 1] == 2.0f, "pinned copy ran before the host wrote: %g", out[0]);
    cudaMemcpy(out.data(), d + n, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(out[0] == 1.0f && out[n - 1] == 1.0f, "pageable copy was not staged at the call: %g", out[0]);
    CHECK(!g.timed_out, "gate timed out");
    cudaFree(d);
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
}

static void test_stream_order_and_events(void)
{
    const int n = 4096;
    cudaStream_t a, b;
    cudaStreamCreate(&a);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    float *x, *y;
    cudaMalloc((void **)&x, n * sizeof(float));
    cudaMalloc((void **)&y, n * sizeof(float));
    cudaEvent_t written, t0, t1;
    cudaEventCreate(&written);
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    gate g;
    /* a: [gate] fill x = 3 [record written]; b waits for written, then y = 1 and y += x */
    cudaEventRecord(t0, a);
    cudaLaunchHostFunc(a, wait_gate, &g);
    TS_LAUNCH(fill_kernel, n / 256, 256, 0, a, x, 3.0f, n);
    cudaEventRecord(written, a);
    cudaEventRecord(t1, a);
    cudaStreamWaitEvent(b, written, 0);
    TS_LAUNCH(fill_kernel, n / 256, 256, 0, b, y, 1.0f, n);
    TS_LAUNCH(add_kernel, n / 256, 256, 0, b, x, y, n);
    CHECK(cudaEventQuery(written) == cudaErrorNotReady, "event complete while its stream is blocked");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    g.open = 1;
    cudaStreamSynchronize(b);
    CHECK(cudaEventQuery(written) == cudaSuccess, "event not complete after the waiting stream finished");
    std::vector<float> h(n);
    cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(h[0] == 4.0f && h[n - 1] == 4.0f, "y = %g, want 4 (b did not wait for a's event)", h[0]);
    float ms = -1;
    cudaEventSynchronize(t1);
    CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms >= 15.0f && ms < 5000.0f, "elapsed %g ms", ms);
    cudaEvent_t untimed;
    cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming);
    cudaEventRecord(untimed, a);
    cudaEventSynchronize(untimed);
    CHECK(cudaEventElapsedTime(&ms, t0, untimed) == cudaErrorInvalidResourceHandle, "timing a DisableTiming event");
    cudaGetLastError();
    cudaEventDestroy(untimed);
    cudaEventDestroy(written);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    CHECK(!g.timed_out, "gate timed out");
}

/* The legacy stream waits for blocking streams (and they for it); non-blocking ones are exempt. */
static void test_legacy_stream_synchronisation(void)
{
    const int n = 256;
    cudaStream_t blocking, nonblocking;
    cudaStreamCreate(&blocking);
    cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking);
    float *x;
    cudaMalloc((void **)&x, n * sizeof(float));
    gate g1, g2;
    /* blocking stream: [gate] x = 5; then the legacy stream's x += x must see x = 5 */
    cudaLaunchHostFunc(blocking, wait_gate, &g1);
    TS_LAUNCH(fill_kernel, 1, n, 0, blocking, x, 5.0f, n);
    TS_LAUNCH(add_kernel, 1, n, 0, 0, x, x, n);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    g1.open = 1;
    std::vector<float> h(n);
    cudaMemcpy(h.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(h[0] == 10.0f, "legacy stream ran before the blocking stream's work: %g", h[0]);
    /* a blocked non-blocking stream does not hold up the legacy stream */
    cudaLaunchHostFunc(nonblocking, wait_gate, &g2);
    double t0 = emu_now_us();
    TS_LAUNCH(fill_kernel, 1, n, 0, 0, x, 1.0f, n);
    cudaStreamSynchronize(0);
    double waited = emu_now_us() - t0;
    g2.open = 1;
    cudaStreamSynchronize(nonblocking);
    CHECK(waited < 1.5e6 && !g2.timed_out, "the legacy stream waited %.0f us for a non-blocking stream", waited);
    cudaFree(x);
    cudaStreamDestroy(blocking);
    cudaStreamDestroy(nonblocking);
}

/* Several host threads, each with its own stream, launching at once. */
static void test_concurrent_host_threads(void)
{
    static const int nthreads = 4, n = 1 << 14, reps = 20;
    std::vector<int> ok(nthreads, 0);
    std::vector<std::thread> ts;
    for (int t = 0; t < nthreads; t++)
        ts.emplace_back([t, &ok] {
            cudaStream_t s;
            cudaStreamCreate(&s);
            float *a, *b;
            cudaMalloc((void **)&a, n * sizeof(float));
            cudaMalloc((void **)&b, n * sizeof(float));
            TS_LAUNCH(fill_kernel, n / 128, 128, 0, s, a, (float)t, n);
            TS_LAUNCH(fill_kernel, n / 128, 128, 0, s, b, 0.0f, n);
            for (int r = 0; r < reps; r++) TS_LAUNCH(add_kernel, n / 128, 128, 0, s, a, b, n);
            std::vector<float> h(n);
            cudaMemcpyAsync(h.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost, s);
            cudaStreamSynchronize(s);
            ok[t] = h[0] == (float)(t * reps) && h[n - 1] == (float)(t * reps);
            cudaFree(a);
            cudaFree(b);
            cudaStreamDestroy(s);
        });
    for (auto &th : ts) th.join();
    for (int t = 0; t < nthreads; t++) CHECK(ok[t], "host thread %d got a wrong result", t);
}

/* ---- graphs ------------------------------------------------------------------------------ */

static void CUDART_CB count_run(void *p) { ((std::atomic<int> *)p)->fetch_add(1); }

static void test_graph_capture_and_replay(void)
{
    const int n = 1024;
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *x, *y, *pinned;
    cudaMalloc((void **)&x, n * sizeof(float));
    cudaMalloc((void **)&y, n * sizeof(float));
    cudaMallocHost((void **)&pinned, n * sizeof(float));
    for (int i = 0; i < n; i++) pinned[i] = 1.0f;
    std::atomic<int> host_runs{ 0 };

    /* a synchronising call during capture errors and invalidates the capture */
    EMU_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TS_LAUNCH(fill_kernel, n / 256, 256, 0, s, y, 0.0f, n);
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported, "sync during capture allowed");
    cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(s, &st);
    CHECK(st == cudaStreamCaptureStatusInvalidated, "capture status %d after a sync", (int)st);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated && !graph, "invalid capture ended ok");
    /* so does cudaMalloc in global capture mode */
    EMU_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void *tmp = nullptr;
    CHECK(cudaMalloc(&tmp, 16) == cudaErrorStreamCaptureUnsupported, "cudaMalloc during a global capture allowed");
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated, "capture survived cudaMalloc");
    cudaGetLastError();

    /* capture: x <- pinned; y = 0; y += x; y += x; count a host function */
    EMU_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamIsCapturing(s, &st);
    CHECK(st == cudaStreamCaptureStatusActive, "not capturing");
    cudaMemcpyAsync(x, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s);
    cudaMemsetAsync(y, 0, n * sizeof(float), s);
    TS_LAUNCH(add_kernel, n / 256, 256, 0, s, x, y, n);
    TS_LAUNCH(add_kernel, n / 256, 256, 0, s, x, y, n);
    cudaLaunchHostFunc(s, count_run, &host_runs);
    EMU_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    cudaGetLastError();
    size_t nodes = 0;
    cudaGraphGetNodes(graph, nullptr, &nodes);
    CHECK(nodes == 5, "%zu ops recorded, want 5", nodes);
    cudaDeviceSynchronize();
    CHECK(host_runs == 0, "captured work ran during capture");
    std::vector<float> h(n);
    cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(isnan(h[0]), "y was written during capture: %g", h[0]);

    cudaGraphExec_t exec;
    EMU_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    EMU_CHECK_CUDA(cudaGraphLaunch(exec, s));
    cudaStreamSynchronize(s);
    cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(h[0] == 2.0f && h[n - 1] == 2.0f, "first replay y = %g, want 2", h[0]);
    for (int i = 0; i < n; i++) pinned[i] = 5.0f; /* a replay reads the buffers' current contents */
    EMU_CHECK_CUDA(cudaGraphLaunch(exec, s));
    cudaStreamSynchronize(s);
    cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(h[0] == 10.0f && h[n - 1] == 10.0f, "second replay y = %g, want 10", h[0]);
    CHECK(host_runs == 2, "host function ran %d times", host_runs.load());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(s);
}

/* CUDA's capture modes across threads: a ThreadLocal capture is broken only by its own
 * thread's synchronising calls (another thread — a tensor-parallel rank's worker — may
 * cudaMalloc meanwhile), a Global one by any thread's. */
static void test_capture_modes_across_threads(void)
{
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *y;
    cudaMalloc((void **)&y, 256 * sizeof(float));
    const cudaStreamCaptureMode modes[2] = { cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal };
    for (int i = 0; i < 2; i++) {
        EMU_CHECK_CUDA(cudaStreamBeginCapture(s, modes[i]));
        TS_LAUNCH(fill_kernel, 1, 256, 0, s, y, 1.0f, 256);
        cudaError_t other = cudaSuccess;
        std::thread t([&] {
            void *p = nullptr;
            other = cudaMalloc(&p, 64);
            if (other == cudaSuccess) cudaFree(p);
        });
        t.join();
        cudaStreamCaptureStatus st;
        cudaStreamIsCapturing(s, &st);
        cudaGraph_t graph = nullptr;
        const cudaError_t end = cudaStreamEndCapture(s, &graph);
        if (i == 0)
            CHECK(other == cudaSuccess && st == cudaStreamCaptureStatusActive && end == cudaSuccess && graph,
                  "thread-local capture: another thread's cudaMalloc gave %d and left the capture %d (end %d)",
                  (int)other, (int)st, (int)end);
        else
            CHECK(other == cudaErrorStreamCaptureUnsupported && end == cudaErrorStreamCaptureInvalidated && !graph,
                  "global capture: another thread's cudaMalloc gave %d, end %d", (int)other, (int)end);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
    }
    /* its own thread's cudaMalloc still breaks a thread-local capture */
    EMU_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    void *p = nullptr;
    CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported, "own cudaMalloc during a thread-local capture");
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated, "capture survived its own cudaMalloc");
    cudaGetLastError();
    cudaFree(y);
    cudaStreamDestroy(s);
}

/* A second stream joins the capture through an event (fork / join). */
static void test_graph_capture_fork_join(void)
{
    const int n = 256;
    cudaStream_t s, s2;
    cudaStreamCreate(&s);
    cudaStreamCreate(&s2);
    float *x, *y;
    cudaMalloc((void **)&x, n * sizeof(float));
    cudaMalloc((void **)&y, n * sizeof(float));
    cudaEvent_t fork, join;
    cudaEventCreate(&fork);
    cudaEventCreate(&join);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    TS_LAUNCH(fill_kernel, 1, n, 0, s, x, 2.0f, n);
    cudaEventRecord(fork, s);
    cudaStreamWaitEvent(s2, fork, 0);
    cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(s2, &st);
    CHECK(st == cudaStreamCaptureStatusActive, "s2 did not join the capture");
    TS_LAUNCH(fill_kernel, 1, n, 0, s2, y, 1.0f, n);
    TS_LAUNCH(add_kernel, 1, n, 0, s2, x, y, n);
    cudaEventRecord(join, s2);
    cudaStreamWaitEvent(s, join, 0);
    cudaGraph_t graph;
    EMU_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    cudaStreamIsCapturing(s2, &st);
    CHECK(st == cudaStreamCaptureStatusNone, "s2 still capturing after the end");
    cudaGraphExec_t exec;
    cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphLaunch(exec, s);
    std::vector<float> h(n);
    cudaStreamSynchronize(s);
    cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(h[0] == 3.0f, "y = %g, want 3", h[0]);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
}

/* ---- device identity --------------------------------------------------------------------- */

static void test_device_properties(void)
{
    int count = 0, dev = -1, v = 0;
    cudaGetDeviceCount(&count);
    CHECK(count >= 1, "device count %d", count);
    cudaGetDevice(&dev);
    CHECK(dev == 0, "device %d", dev);
    CHECK(cudaSetDevice(count) == cudaErrorInvalidDevice, "set an absent device");
    cudaGetLastError();
    cudaDeviceProp p;
    EMU_CHECK_CUDA(cudaGetDeviceProperties(&p, 0));
    CHECK(strstr(p.name, "H200") && strstr(p.name, "emulated"), "name %s", p.name);
    CHECK(p.major == 9 && p.minor == 0 && p.multiProcessorCount == 132 && p.warpSize == 32, "cc %d.%d, %d SMs",
          p.major, p.minor, p.multiProcessorCount);
    CHECK(p.sharedMemPerBlock == 49152 && p.sharedMemPerBlockOptin == 232448 && p.sharedMemPerMultiprocessor == 233472,
          "shared memory %zu %zu %zu", p.sharedMemPerBlock, p.sharedMemPerBlockOptin, p.sharedMemPerMultiprocessor);
    CHECK(p.maxThreadsPerBlock == 1024 && p.maxThreadsPerMultiProcessor == 2048 && p.regsPerBlock == 65536,
          "thread limits");
    CHECK(p.l2CacheSize == 50 << 20 && p.memoryBusWidth == 6144, "l2 %d bus %d", p.l2CacheSize, p.memoryBusWidth);
    size_t fr, total;
    cudaMemGetInfo(&fr, &total);
    CHECK(p.totalGlobalMem == total, "totalGlobalMem %zu vs %zu", p.totalGlobalMem, total);
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    CHECK(v == 232448, "optin attribute %d", v);
    cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, 0);
    CHECK(v > 1900000 && v < 2000000, "clock %d kHz", v);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0);
    CHECK(v == 132, "SMs %d", v);
    CHECK(strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0, "error name");
    CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0, "error string");
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    CHECK(rt == CUDART_VERSION, "runtime version %d", rt);
}

__global__ void fault_fill_kernel(int *out, int v)
{
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

/* TESSERA_EMU_FAULT: the named kernel faults when it runs (the launch itself succeeds, as
 * on a GPU); the wait reports cudaErrorIllegalAddress, and so does everything afterwards —
 * the context is lost. Runs last: the sticky error stays for the life of the process. */
static void test_injected_fault_is_sticky(void)
{
    int *d = NULL;
    cudaStream_t s;
    EMU_CHECK_CUDA(cudaMalloc((void **)&d, 64 * sizeof(int)));
    EMU_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    setenv("TESSERA_EMU_FAULT", "no_such_kernel", 1);
    TS_LAUNCH(fault_fill_kernel, 1, 64, 0, s, d, 1);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "a kernel not named must run");
    setenv("TESSERA_EMU_FAULT", "fault_fill_kernel", 1);
    TS_LAUNCH(fault_fill_kernel, 1, 64, 0, s, d, 2);
    CHECK(cudaGetLastError() == cudaSuccess, "the faulting launch itself succeeds");
    cudaEvent_t ev;
    EMU_CHECK_CUDA(cudaEventCreate(&ev));
    cudaEventRecord(ev, s);
    CHECK(cudaEventSynchronize(ev) == cudaErrorIllegalAddress, "the wait reports the fault");
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress, "sticky: stream synchronize");
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress, "sticky: device synchronize");
    int h[64];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaErrorIllegalAddress, "sticky: cudaMemcpy");
    (void)cudaGetLastError();
    TS_LAUNCH(fault_fill_kernel, 1, 64, 0, s, d, 3);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "sticky: later launches fail");
    unsetenv("TESSERA_EMU_FAULT");
}

int main(void)
{
    RUN(test_atomics_across_blocks);
    RUN(test_malloc_poison_and_accounting);
    RUN(test_bounds_checked_copies);
    RUN(test_async_copy_reads_pinned_when_it_runs);
    RUN(test_stream_order_and_events);
    RUN(test_legacy_stream_synchronisation);
    RUN(test_concurrent_host_threads);
    RUN(test_graph_capture_and_replay);
    RUN(test_graph_capture_fork_join);
    RUN(test_capture_modes_across_threads);
    RUN(test_device_properties);
    RUN(test_pdl_launches);
    RUN(test_injected_fault_is_sticky); /* last: the fault is sticky */
    return test_summary();
}
