/* test_emu_barrier.cu — the emulator's block scheduler: barriers, fiber order, shared
 * memory, launch configuration. Each planted bug must be caught: a missing __syncthreads
 * (wrong result under some seed), barrier divergence (abort naming kernel and call sites),
 * a read of shared memory nobody wrote (the 0xFF poison).
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

#include <set>
#include <vector>

static const uint64_t SEEDS[] = { 1, 2, 3, 4, 5, 0x5eed0000 };
enum { NSEEDS = sizeof SEEDS / sizeof SEEDS[0] };

/* A device buffer. Not copyable: TS_LAUNCH's lambda captures whole objects named in its
 * arguments (buf.p would copy buf), so launches take the pointer from a local. */
template <typename T> struct dev_buf {
    T *p = nullptr;
    size_t n;
    explicit dev_buf(size_t count) : n(count) { cudaMalloc((void **)&p, n * sizeof(T)); }
    ~dev_buf() { cudaFree(p); }
    dev_buf(const dev_buf &) = delete;
    dev_buf &operator=(const dev_buf &) = delete;
    std::vector<T> get() const
    {
        std::vector<T> h(n);
        cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
        return h;
    }
    void put(const std::vector<T> &h) { cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
};

/* ---- a missing __syncthreads is caught by some seed --------------------------------------- */

/* Thread 0 publishes a value in shared memory; everyone reads it. */
__global__ void broadcast_good(const float *in, float *out)
{
    TS_SHARED(float, v, );
    if (threadIdx.x == 0) v = in[blockIdx.x];
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void broadcast_missing_barrier(const float *in, float *out)
{
    TS_SHARED(float, v, );
    if (threadIdx.x == 0) v = in[blockIdx.x];
    out[blockIdx.x * blockDim.x + threadIdx.x] = v; /* planted bug: no __syncthreads */
}

static int run_broadcast(void (*kernel)(const float *, float *), uint64_t seed)
{
    const int blocks = 4, threads = 64;
    dev_buf<float> in(blocks), out(blocks * threads);
    std::vector<float> h(blocks);
    for (int b = 0; b < blocks; b++) h[b] = 10.0f + b;
    in.put(h);
    emu_set_seed(seed);
    auto *in_p = in.p;
    auto *out_p = out.p;
    TS_LAUNCH(kernel, blocks, threads, 0, 0, in_p, out_p);
    int wrong = 0;
    std::vector<float> o = out.get();
    for (int i = 0; i < blocks * threads; i++) wrong += o[i] != h[i / threads];
    return wrong;
}

static void test_missing_barrier_caught_by_a_seed(void)
{
    int caught = 0;
    for (uint64_t s : SEEDS) {
        CHECK(run_broadcast(broadcast_good, s) == 0, "correct kernel wrong under seed %llu", (unsigned long long)s);
        caught += run_broadcast(broadcast_missing_barrier, s) > 0;
    }
    CHECK(caught > 0, "the missing __syncthreads was not caught under any of %d seeds", (int)NSEEDS);
    printf("     missing barrier caught under %d of %d seeds\n", caught, (int)NSEEDS);
}

/* ---- fiber order is a function of the seed ------------------------------------------------ */

/* Records the order in which the threads of each block first run. */
__global__ void order_kernel(int *order, int *tickets)
{
    int t = atomicAdd(&tickets[blockIdx.x], 1);
    order[blockIdx.x * blockDim.x + t] = (int)threadIdx.x;
    __syncthreads();
    t = atomicAdd(&tickets[blockIdx.x], 1) - (int)blockDim.x;
    order[(gridDim.x + blockIdx.x) * blockDim.x + t] = (int)threadIdx.x;
}

static std::vector<int> run_order(uint64_t seed)
{
    const int blocks = 8, threads = 96;
    dev_buf<int> order(2 * blocks * threads), tickets(blocks);
    cudaMemset(tickets.p, 0, blocks * sizeof(int));
    emu_set_seed(seed);
    auto *order_p = order.p;
    auto *tickets_p = tickets.p;
    TS_LAUNCH(order_kernel, blocks, threads, 0, 0, order_p, tickets_p);
    return order.get();
}

static void test_order_depends_on_seed_only(void)
{
    std::vector<int> a = run_order(7), b = run_order(7), c = run_order(8);
    CHECK(a == b, "same seed, different fiber order");
    CHECK(a != c, "different seeds, same fiber order");
    /* each block's order is a permutation, and differs between blocks and after the barrier */
    const int threads = 96;
    std::set<int> seen(a.begin(), a.begin() + threads);
    CHECK((int)seen.size() == threads, "block 0's first run order is not a permutation");
    CHECK(!std::equal(a.begin(), a.begin() + threads, a.begin() + threads), "blocks 0 and 1 ran in the same order");
    CHECK(!std::equal(a.begin(), a.begin() + threads, a.begin() + 8 * threads),
          "the order after the barrier equals the order at block start");
    bool ascending = true;
    for (int i = 0; i < threads; i++) ascending = ascending && a[i] == i;
    CHECK(!ascending, "fibers ran in thread order");
}

/* ---- barrier divergence aborts ------------------------------------------------------------ */

static const int EXIT_DIV_LINE = __LINE__ + 4;
__global__ void exit_divergence_kernel(float *out)
{
    if (threadIdx.x >= 16) return;
    __syncthreads(); /* planted bug: the other threads have exited */
    out[threadIdx.x] = 1.0f;
}

static const int SITE_DIV_LINE = __LINE__ + 4; /* and + 6 */
__global__ void site_divergence_kernel(float *out)
{
    if (threadIdx.x & 1) {
        __syncthreads(); /* planted bug: odd threads wait here ... */
    } else {
        __syncthreads(); /* ... even threads here */
    }
    out[threadIdx.x] = 1.0f;
}

static void test_divergence_exit_aborts(void)
{
    emu_child r = emu_run_child([] {
        dev_buf<float> out(64);
        auto *out_p = out.p;
        TS_LAUNCH(exit_divergence_kernel, 1, 64, 0, 0, out_p);
        cudaDeviceSynchronize();
    });
    CHECK(emu_died_by_abort(r), "child did not abort (signal %d, exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "barrier divergence"), "no divergence message");
    CHECK(emu_err_has(r, "exit_divergence_kernel"), "kernel name missing");
    char site[64];
    snprintf(site, sizeof site, "test_emu_barrier.cu:%d", EXIT_DIV_LINE);
    CHECK(emu_err_has(r, site), "barrier call site missing");
    CHECK(emu_err_has(r, "has exited"), "exited thread not reported");
    CHECK(emu_err_has(r, "TESSERA_EMU_SEED="), "seed missing");
}

static void test_divergence_sites_abort(void)
{
    emu_child r = emu_run_child([] {
        dev_buf<float> out(64);
        auto *out_p = out.p;
        TS_LAUNCH(site_divergence_kernel, 2, 64, 0, 0, out_p);
        cudaDeviceSynchronize();
    });
    CHECK(emu_died_by_abort(r), "child did not abort (signal %d, exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "wait at different barriers"), "no divergence message");
    CHECK(emu_err_has(r, "site_divergence_kernel"), "kernel name missing");
    char site[64];
    snprintf(site, sizeof site, "test_emu_barrier.cu:%d", SITE_DIV_LINE);
    CHECK(emu_err_has(r, site), "first call site missing");
    snprintf(site, sizeof site, "test_emu_barrier.cu:%d", SITE_DIV_LINE + 2);
    CHECK(emu_err_has(r, site), "second call site missing");
}

/* ---- shared memory ------------------------------------------------------------------------ */

/* Reads shared memory before anyone wrote it: the poison must come through. */
__global__ void uninit_shared_kernel(float *f, int *i, float *d)
{
    TS_SHARED(float, fs, [64]);
    TS_SHARED(int, is, [64]);
    TS_DYNAMIC_SHARED(float, ds);
    f[threadIdx.x] = fs[threadIdx.x]; /* planted bug: never written */
    i[threadIdx.x] = is[threadIdx.x];
    d[threadIdx.x] = ds[threadIdx.x];
    __syncthreads();
    fs[threadIdx.x] = 1.0f; /* written now: the next block must see the poison again */
    is[threadIdx.x] = 1;
    ds[threadIdx.x] = 1.0f;
}

static void test_uninitialised_shared_read_is_poison(void)
{
    dev_buf<float> f(64), d(64);
    dev_buf<int> i(64);
    for (int rep = 0; rep < 2; rep++) {
        auto *d_p = d.p;
        auto *f_p = f.p;
        auto *i_p = i.p;
        TS_LAUNCH(uninit_shared_kernel, 1, 64, 64 * sizeof(float), 0, f_p, i_p, d_p);
        std::vector<float> hf = f.get(), hd = d.get();
        std::vector<int> hi = i.get();
        for (int k = 0; k < 64; k++) {
            CHECK(isnan(hf[k]), "static float[%d] read %g, not the NaN poison (rep %d)", k, hf[k], rep);
            CHECK(isnan(hd[k]), "dynamic float[%d] read %g, not the NaN poison (rep %d)", k, hd[k], rep);
            CHECK(hi[k] == -1, "static int[%d] read %d, not -1 (rep %d)", k, hi[k], rep);
        }
    }
}

/* Static shared variables: one copy per block, every thread of the block the same address;
 * a 2-D tile with padding; the dynamic region 16-byte aligned. */
__global__ void shared_layout_kernel(int *out, unsigned long long *addrs)
{
    TS_SHARED(int, tile, [8][33]);
    TS_SHARED(double, dbl, );
    TS_DYNAMIC_SHARED(int, dyn);
    int t = (int)threadIdx.x, n = (int)blockDim.x;
    tile[t / 32][t % 32] = t + 1000 * (int)blockIdx.x;
    dyn[t] = -t;
    if (t == 0) dbl = 0.5;
    __syncthreads();
    out[blockIdx.x * n + t] = tile[(n - 1 - t) / 32][(n - 1 - t) % 32] + dyn[n - 1 - t] + (int)(dbl * 2);
    addrs[(blockIdx.x * n + t) * 3 + 0] = (unsigned long long)(uintptr_t)&tile[0][0];
    addrs[(blockIdx.x * n + t) * 3 + 1] = (unsigned long long)(uintptr_t)&dbl;
    addrs[(blockIdx.x * n + t) * 3 + 2] = (unsigned long long)(uintptr_t)dyn;
}

static void test_shared_layout(void)
{
    const int blocks = 3, n = 256;
    dev_buf<int> out(blocks * n);
    dev_buf<unsigned long long> addrs(blocks * n * 3);
    auto *addrs_p = addrs.p;
    auto *out_p = out.p;
    TS_LAUNCH(shared_layout_kernel, blocks, n, n * sizeof(int), 0, out_p, addrs_p);
    std::vector<int> o = out.get();
    std::vector<unsigned long long> a = addrs.get();
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++) {
            int want = (n - 1 - t) + 1000 * b - (n - 1 - t) + 1;
            CHECK(o[b * n + t] == want, "block %d thread %d: %d, want %d", b, t, o[b * n + t], want);
            for (int k = 0; k < 3; k++)
                CHECK(a[(b * n + t) * 3 + k] == a[(b * n) * 3 + k], "thread %d sees another address (%d)", t, k);
        }
    CHECK(a[1] % alignof(double) == 0, "double misaligned");
    CHECK(a[2] % 16 == 0, "dynamic shared memory not 16-byte aligned");
    /* the statics and the dynamic region do not overlap */
    CHECK(a[0] >= a[2] + n * sizeof(int) || a[0] + sizeof(int) * 8 * 33 <= a[2], "tile overlaps dynamic memory");
}

/* ---- indices, barrier variants, block_sum ------------------------------------------------- */

__global__ void index_kernel(int *out)
{
    unsigned bx = blockDim.x, by = blockDim.y, bz = blockDim.z;
    unsigned tid = threadIdx.x + threadIdx.y * bx + threadIdx.z * bx * by;
    unsigned bid = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
    out[bid * bx * by * bz + tid] = (int)(bid * 10000 + tid);
}

static void test_indices_3d(void)
{
    dim3 grid(3, 2, 2), block(4, 3, 2);
    int total = 12 * 24;
    dev_buf<int> out(total);
    auto *out_p = out.p;
    TS_LAUNCH(index_kernel, grid, block, 0, 0, out_p);
    std::vector<int> o = out.get();
    for (int i = 0; i < total; i++) CHECK(o[i] == (i / 24) * 10000 + i % 24, "out[%d] = %d", i, o[i]);
}

__global__ void barrier_variants_kernel(int *out)
{
    int t = (int)threadIdx.x;
    out[0 * blockDim.x + t] = __syncthreads_count(t % 3 == 0);
    out[1 * blockDim.x + t] = __syncthreads_and(t >= 0);
    out[2 * blockDim.x + t] = __syncthreads_and(t != 5);
    out[3 * blockDim.x + t] = __syncthreads_or(t == 77);
    out[4 * blockDim.x + t] = __syncthreads_or(0);
}

static void test_barrier_variants(void)
{
    const int n = 100;
    dev_buf<int> out(5 * n);
    auto *out_p = out.p;
    TS_LAUNCH(barrier_variants_kernel, 1, n, 0, 0, out_p);
    std::vector<int> o = out.get();
    for (int t = 0; t < n; t++) {
        CHECK(o[t] == 34, "count %d", o[t]);
        CHECK(o[n + t] == 1 && o[2 * n + t] == 0, "and %d %d", o[n + t], o[2 * n + t]);
        CHECK(o[3 * n + t] == 1 && o[4 * n + t] == 0, "or %d %d", o[3 * n + t], o[4 * n + t]);
    }
}

/* One block per row: block_sum from kernels/common.cuh (warp shuffles + two barriers). */
__global__ void row_sum_kernel(const float *x, float *sums, int n)
{
    TS_SHARED(float, scratch, [32]);
    float v = 0.0f;
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) v += x[(size_t)blockIdx.x * n + i];
    v = block_sum(v, scratch);
    if (threadIdx.x == 0) sums[blockIdx.x] = v;
}

static void test_block_sum_and_speed(void)
{
    const int rows = 2000, n = 256;
    std::vector<float> h((size_t)rows * n);
    for (size_t i = 0; i < h.size(); i++) h[i] = (float)((i * 7919) % 13) - 6.0f;
    dev_buf<float> x(h.size()), sums(rows);
    x.put(h);
    auto *sums_p = sums.p;
    auto *x_p = x.p;
    TS_LAUNCH(row_sum_kernel, rows, n, 0, 0, x_p, sums_p, n); /* warm-up: fibers, stacks */
    cudaDeviceSynchronize();
    double t0 = emu_now_us();
    TS_LAUNCH(row_sum_kernel, rows, n, 0, 0, x_p, sums_p, n);
    CHECK(cudaGetLastError() == cudaSuccess, "launch failed");
    cudaDeviceSynchronize();
    double us = emu_now_us() - t0;
    std::vector<float> s = sums.get();
    for (int r = 0; r < rows; r++) {
        double ref = 0;
        for (int i = 0; i < n; i++) ref += h[(size_t)r * n + i];
        CHECK(s[r] == (float)ref, "row %d: %g, want %g", r, s[r], ref);
    }
    printf("     block_sum: %d blocks x %d threads (10 shuffles, 2 barriers each) in %.1f ms, %.1f us/block\n", rows,
           n, us / 1000, us / rows);
}

/* ---- launch configuration ------------------------------------------------------------------ */

__global__ void noop_kernel(int *p)
{
    if (p && threadIdx.x == 0 && blockIdx.x == 0) *p = 1;
}

static void test_launch_config_errors(void)
{
    cudaGetLastError();
    TS_LAUNCH(noop_kernel, 1, 1025, 0, 0, nullptr);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads accepted");
    TS_LAUNCH(noop_kernel, 1, dim3(1, 1, 65), 0, 0, nullptr);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "blockDim.z 65 accepted");
    TS_LAUNCH(noop_kernel, dim3(1, 65536), 32, 0, 0, nullptr);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "gridDim.y 65536 accepted");
    TS_LAUNCH(noop_kernel, 0, 32, 0, 0, nullptr);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "empty grid accepted");
    TS_LAUNCH(noop_kernel, 1, 32, 48 * 1024 + 16, 0, nullptr);
    CHECK(cudaGetLastError() != cudaSuccess, "49 KiB dynamic shared memory accepted without opt-in");
    CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError does not reset");

    dev_buf<int> flag(1);
    CHECK(cudaFuncSetAttribute(noop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) == cudaSuccess,
          "opt-in refused");
    auto *flag_p = flag.p;
    TS_LAUNCH(noop_kernel, 1, 32, 100 * 1024, 0, flag_p);
    CHECK(cudaGetLastError() == cudaSuccess, "100 KiB after opt-in refused");
    CHECK(flag.get()[0] == 1, "kernel did not run");
    TS_LAUNCH(noop_kernel, 1, 32, 100 * 1024 + 1, 0, nullptr);
    CHECK(cudaGetLastError() != cudaSuccess, "over the opted-in limit accepted");
    CHECK(cudaFuncSetAttribute(noop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) != cudaSuccess,
          "over 227 KiB accepted");
    cudaGetLastError();

    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, noop_kernel, 256, 0) == cudaSuccess && blocks > 0 &&
              blocks <= 8,
          "occupancy %d", blocks);
}

/* ---- ASan: an out-of-bounds shared-memory access is a report (ASan builds only) ---------- */

#if defined(__SANITIZE_ADDRESS__)
#define EMU_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_TEST_ASAN 1
#endif
#endif

#ifdef EMU_TEST_ASAN
__global__ void shared_oob_kernel(float *out, int dynamic)
{
    TS_SHARED(float, buf, [64]);
    TS_SHARED(float, next, [64]);
    TS_DYNAMIC_SHARED(float, dyn);
    buf[threadIdx.x] = 1.0f;
    next[threadIdx.x] = 1.0f;
    dyn[threadIdx.x] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        float *p = dynamic ? dyn : &buf[0]; /* through a pointer: UBSan cannot see the bound */
        p[64] = 2.0f; /* planted bug: one past the dynamic region or buf (next is 32+ bytes on) */
    }
    out[threadIdx.x] = buf[threadIdx.x] + next[threadIdx.x] + dyn[threadIdx.x];
}

static void test_shared_out_of_bounds_is_asan_report(void)
{
    for (int dynamic = 0; dynamic < 2; dynamic++) {
        emu_child r = emu_run_child([dynamic] {
            dev_buf<float> out(64);
            auto *out_p = out.p;
            TS_LAUNCH(shared_oob_kernel, 1, 64, 64 * sizeof(float), 0, out_p, dynamic);
            cudaDeviceSynchronize();
        });
        CHECK(!r.signaled || r.sig != SIGABRT || r.err.find("AddressSanitizer") != std::string::npos,
              "child aborted without an ASan report");
        CHECK(emu_err_has(r, "AddressSanitizer"), "no ASan report (%s)", dynamic ? "dynamic" : "static");
        CHECK(emu_err_has(r, "shared_oob_kernel"), "report does not name the kernel");
    }
}
#endif

/* ---- a spin-wait on another thread of the block: the watchdog reports it ------------------- */

/* Both threads announce themselves, then wait until both have: fine on a GPU, which
 * interleaves them; here the first fiber spins forever unless the loop yields. */
__global__ void rendezvous_kernel(int *out, int yield)
{
    TS_SHARED(int, arrived, );
    if (threadIdx.x == 0) arrived = 0;
    __syncthreads();
    atomicAdd(&arrived, 1);
    while (*(volatile int *)&arrived < (int)blockDim.x)
        if (yield) __nanosleep(100);
    out[threadIdx.x] = 1;
}

static void run_rendezvous(int yield)
{
    dev_buf<int> out(2);
    auto *out_p = out.p;
    TS_LAUNCH(rendezvous_kernel, 1, 2, 0, 0, out_p, yield);
    cudaDeviceSynchronize();
}

static void test_spin_wait_watchdog(void)
{
    run_rendezvous(1); /* with __nanosleep in the loop the block completes */
    emu_child r = emu_run_self("--spin-without-yield", "TESSERA_EMU_WATCHDOG_S=1");
    CHECK(emu_died_by_abort(r), "the spinning child did not abort (signal %d, exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "without reaching a barrier"), "message");
    CHECK(emu_err_has(r, "__nanosleep()"), "advice");
    CHECK(emu_err_has(r, "rendezvous_kernel"), "kernel name");
}

/* A stack overflow hits the guard page: a crash, not silent corruption. */
static int deep(volatile char *p, int n)
{
    volatile char buf[1024];
    buf[0] = (char)n;
    return n ? deep(buf, n - 1) + buf[0] + p[0] : 0;
}

__global__ void overflow_kernel(int *out) { *out = deep((volatile char *)out, 1 << 20); }

static void test_stack_overflow_crashes(void)
{
    emu_child r = emu_run_child([] {
        dev_buf<int> out(1);
        auto *out_p = out.p;
        TS_LAUNCH(overflow_kernel, 1, 1, 0, 0, out_p);
        cudaDeviceSynchronize();
    });
    bool crashed = (r.signaled && r.sig == SIGSEGV) || r.err.find("stack-overflow") != std::string::npos ||
                   r.err.find("SEGV") != std::string::npos;
    CHECK(crashed, "child survived a 1 GiB recursion (signal %d, exit %d)", r.sig, r.exit_code);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--spin-without-yield") == 0) {
        run_rendezvous(0); /* the watchdog aborts this */
        return 0;
    }
    RUN(test_missing_barrier_caught_by_a_seed);
    RUN(test_order_depends_on_seed_only);
    RUN(test_divergence_exit_aborts);
    RUN(test_divergence_sites_abort);
    RUN(test_uninitialised_shared_read_is_poison);
    RUN(test_shared_layout);
    RUN(test_indices_3d);
    RUN(test_barrier_variants);
    RUN(test_block_sum_and_speed);
    RUN(test_launch_config_errors);
#ifdef EMU_TEST_ASAN
    RUN(test_shared_out_of_bounds_is_asan_report);
#endif
    RUN(test_spin_wait_watchdog);
    RUN(test_stack_overflow_crashes);
    return test_summary();
}
