/* test_emu_nccl.cu — the emulator's NCCL subset (tests/emu/nccl.cc) on 4 emulated devices:
 * all-reduce (every op; f32, f16, bf16, int32, int64; in place and out of place; 2 and 4
 * ranks) bit-exact against rank-ordered host loops, driven by one host thread per rank and
 * by one thread with ncclGroupStart/End; broadcast; stream order against kernels; graph
 * replays meeting again each time; the errors returned at the call; count 0; destroy and
 * abort; and the aborts for ranks that disagree or never arrive.
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

#include <nccl.h>

#include <atomic>
#include <thread>
#include <vector>

#define NCCL_OK(call)                                                                         \
    do {                                                                                      \
        ncclResult_t r_ = (call);                                                             \
        CHECK(r_ == ncclSuccess, "%s: %s", #call, ncclGetErrorString(r_));                    \
    } while (0)

/* ---- helpers ---------------------------------------------------------------------------- */

/* A deterministic float in +-[2^-8, 2^8) with a full mantissa: sums of these depend on
 * the order of the additions, so a wrong order shows up in a bit-exact comparison. */
static float test_value(uint32_t seed)
{
    uint32_t h = seed * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float m = (float)(h & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
    return ldexpf(m, (int)((h >> 24) % 17) - 8);
}

static size_t esize(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

template <typename T> static std::vector<char> to_bytes(const std::vector<T> &v)
{
    std::vector<char> b(v.size() * sizeof(T));
    memcpy(b.data(), v.data(), b.size());
    return b;
}

template <typename T> static T elem(const std::vector<char> &b, size_t i)
{
    T v;
    memcpy(&v, b.data() + i * sizeof(T), sizeof v);
    return v;
}

struct group_case {
    int n;
    const int *devlist; /* null: devices 0..n-1 */
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root; /* -1: all-reduce, else broadcast from this rank */
    bool in_place;
};

/* Runs one collective on every rank from this host thread, inside a group; in[r] holds rank
 * r's input bytes. Returns each rank's recvbuff. */
static std::vector<std::vector<char>> run_group(const group_case &g, const std::vector<std::vector<char>> &in)
{
    const size_t bytes = g.count * esize(g.dtype);
    ncclComm_t comms[4];
    cudaStream_t s[4];
    void *send[4], *recv[4];
    std::vector<std::vector<char>> out((size_t)g.n, std::vector<char>(bytes));
    NCCL_OK(ncclCommInitAll(comms, g.n, g.devlist));
    for (int r = 0; r < g.n; r++) {
        EMU_CHECK_CUDA(cudaSetDevice(g.devlist ? g.devlist[r] : r));
        EMU_CHECK_CUDA(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking));
        EMU_CHECK_CUDA(cudaMalloc(&send[r], bytes));
        recv[r] = send[r];
        if (!g.in_place) EMU_CHECK_CUDA(cudaMalloc(&recv[r], bytes));
        EMU_CHECK_CUDA(cudaMemcpyAsync(send[r], in[(size_t)r].data(), bytes, cudaMemcpyHostToDevice, s[r]));
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < g.n; r++) {
        if (g.root < 0) NCCL_OK(ncclAllReduce(send[r], recv[r], g.count, g.dtype, g.op, comms[r], s[r]));
        else NCCL_OK(ncclBroadcast(send[r], recv[r], g.count, g.dtype, g.root, comms[r], s[r]));
    }
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < g.n; r++) {
        EMU_CHECK_CUDA(cudaMemcpyAsync(out[(size_t)r].data(), recv[r], bytes, cudaMemcpyDeviceToHost, s[r]));
        EMU_CHECK_CUDA(cudaStreamSynchronize(s[r]));
    }
    for (int r = 0; r < g.n; r++) {
        cudaFree(send[r]);
        if (!g.in_place) cudaFree(recv[r]);
        cudaStreamDestroy(s[r]);
        NCCL_OK(ncclCommDestroy(comms[r]));
    }
    cudaSetDevice(0);
    return out;
}

/* in[r][i] = test_value(...) for n ranks. */
static std::vector<std::vector<float>> float_inputs(int n, size_t count, uint32_t salt)
{
    std::vector<std::vector<float>> x((size_t)n, std::vector<float>(count));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++) x[(size_t)r][i] = test_value(salt * 7919u + (uint32_t)r * 100003u + (uint32_t)i);
    return x;
}

/* The reference: rank 0, then += rank 1, ... in float. */
static float ref_sum(const std::vector<std::vector<float>> &x, size_t i)
{
    float acc = x[0][i];
    for (size_t r = 1; r < x.size(); r++) acc += x[r][i];
    return acc;
}

__global__ void fill_rank_kernel(float *x, int rank, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] = (float)((rank + 1) * 1000 + i);
}

/* Two ranks on devices 0 and 1: their communicators, a non-blocking stream each and x[r]
 * of count floats (filled with fill_rank_kernel when `fill`; y[r] too when y is given). */
static void two_ranks(ncclComm_t comms[2], cudaStream_t s[2], float *x[2], float **y, size_t count, bool fill)
{
    NCCL_OK(ncclCommInitAll(comms, 2, nullptr));
    for (int r = 0; r < 2; r++) {
        cudaSetDevice(r);
        cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking);
        cudaMalloc((void **)&x[r], count * sizeof(float));
        if (y) cudaMalloc((void **)&y[r], count * sizeof(float));
        if (fill) TS_LAUNCH(fill_rank_kernel, 1, 256, 0, s[r], x[r], r, (int)count);
    }
}

__global__ void scale_kernel(const float *in, float *x, float s, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] = in[i] * s;
}

__global__ void twice_plus_one_kernel(const float *x, float *y, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}

/* ---- communicators ---------------------------------------------------------------------- */

static void test_init_queries_and_errors(void)
{
    int v = 0;
    NCCL_OK(ncclGetVersion(&v));
    CHECK(v == NCCL_VERSION_CODE && v >= 20000, "version %d", v);
    ncclComm_t comms[4];
    NCCL_OK(ncclCommInitAll(comms, 4, nullptr));
    for (int r = 0; r < 4; r++) {
        int count = -1, dev = -1, rank = -1;
        NCCL_OK(ncclCommCount(comms[r], &count));
        NCCL_OK(ncclCommCuDevice(comms[r], &dev));
        NCCL_OK(ncclCommUserRank(comms[r], &rank));
        CHECK(count == 4 && dev == r && rank == r, "rank %d: count %d device %d rank %d", r, count, dev, rank);
        ncclResult_t async = ncclInternalError;
        NCCL_OK(ncclCommGetAsyncError(comms[r], &async));
        CHECK(async == ncclSuccess, "async error %d", (int)async);
    }
    for (int r = 0; r < 4; r++) NCCL_OK(ncclCommDestroy(comms[r]));
    int count = 0;
    CHECK(ncclCommCount(comms[0], &count) == ncclInvalidArgument, "a destroyed comm accepted");

    const int devlist[2] = { 3, 1 };
    NCCL_OK(ncclCommInitAll(comms, 2, devlist));
    int dev = -1;
    ncclCommCuDevice(comms[0], &dev);
    CHECK(dev == 3, "rank 0 on device %d, want 3", dev);
    ncclCommCuDevice(comms[1], &dev);
    CHECK(dev == 1, "rank 1 on device %d, want 1", dev);
    ncclCommDestroy(comms[0]);
    ncclCommDestroy(comms[1]);

    ncclComm_t untouched[2] = { nullptr, nullptr };
    const int absent[2] = { 0, 4 }, negative[2] = { -1, 0 }, dup[3] = { 0, 2, 2 };
    CHECK(ncclCommInitAll(untouched, 2, absent) == ncclInvalidArgument, "device 4 of 4 accepted");
    CHECK(strstr(ncclGetLastError(nullptr), "device 4"), "last error \"%s\"", ncclGetLastError(nullptr));
    CHECK(ncclCommInitAll(untouched, 2, negative) == ncclInvalidArgument, "device -1 accepted");
    CHECK(ncclCommInitAll(untouched, 3, dup) == ncclInvalidUsage, "a duplicate device accepted");
    CHECK(ncclCommInitAll(untouched, 5, nullptr) == ncclInvalidArgument, "5 ranks on 4 devices accepted");
    CHECK(ncclCommInitAll(untouched, 0, nullptr) == ncclInvalidArgument, "0 ranks accepted");
    CHECK(ncclCommInitAll(nullptr, 2, nullptr) == ncclInvalidArgument, "null comm array accepted");
    CHECK(!untouched[0] && !untouched[1], "a failed init wrote a comm");
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart accepted");
    for (int e = 0; e <= (int)ncclInProgress; e++) {
        const char *s = ncclGetErrorString((ncclResult_t)e);
        CHECK(s && *s, "no string for %d", e);
    }
    CHECK(strcmp(ncclGetErrorString(ncclSuccess), ncclGetErrorString(ncclInvalidArgument)) != 0, "same strings");
    CHECK(ncclGetErrorString((ncclResult_t)99) != nullptr, "unknown code");
}

/* ---- all-reduce ------------------------------------------------------------------------- */

/* One host thread per rank, no groups (the backend's way), blocking streams, three
 * all-reduces in a row with fresh inputs. */
static void allreduce_f32_threads(int n, bool in_place)
{
    const size_t count = 1001;
    const int reps = 3;
    ncclComm_t comms[4];
    NCCL_OK(ncclCommInitAll(comms, n, nullptr));
    std::vector<std::vector<std::vector<float>>> in, out((size_t)reps);
    for (int k = 0; k < reps; k++) {
        in.push_back(float_inputs(n, count, (uint32_t)(k * 10 + n + in_place)));
        out[(size_t)k].assign((size_t)n, std::vector<float>(count));
    }
    std::vector<int> results((size_t)n * reps, -1);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; r++)
        ts.emplace_back([&, r] {
            cudaSetDevice(r);
            cudaStream_t s;
            float *send, *recv;
            cudaStreamCreate(&s);
            cudaMalloc((void **)&send, count * sizeof(float));
            recv = send;
            if (!in_place) cudaMalloc((void **)&recv, count * sizeof(float));
            for (int k = 0; k < reps; k++) {
                cudaMemcpyAsync(send, in[(size_t)k][(size_t)r].data(), count * sizeof(float), cudaMemcpyHostToDevice, s);
                results[(size_t)(r * reps + k)] = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comms[r], s);
                cudaMemcpyAsync(out[(size_t)k][(size_t)r].data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost, s);
            }
            cudaStreamSynchronize(s);
            cudaFree(send);
            if (!in_place) cudaFree(recv);
            cudaStreamDestroy(s);
        });
    for (auto &t : ts) t.join();
    for (int r = 0; r < n * reps; r++) CHECK(results[(size_t)r] == ncclSuccess, "call %d returned %d", r, results[(size_t)r]);
    int bad = 0;
    for (int k = 0; k < reps; k++)
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++) {
                float want = ref_sum(in[(size_t)k], i), got = out[(size_t)k][(size_t)r][i];
                if (memcmp(&want, &got, 4) != 0 && bad++ < 3)
                    CHECK(false, "n %d %s, all-reduce %d, rank %d, [%zu] = %.9g, want %.9g", n,
                          in_place ? "in place" : "out of place", k, r, i, got, want);
            }
    CHECK(bad == 0, "%d wrong elements", bad);
    for (int r = 0; r < n; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

static void test_allreduce_sum_f32_thread_per_rank(void)
{
    for (int n : { 2, 4 })
        for (bool in_place : { false, true }) allreduce_f32_threads(n, in_place);
}

static void test_allreduce_sum_f32_one_thread_group(void)
{
    const size_t count = 777;
    for (int n : { 2, 4 })
        for (bool in_place : { false, true }) {
            auto x = float_inputs(n, count, (uint32_t)(50 + n + in_place));
            std::vector<std::vector<char>> in;
            for (auto &v : x) in.push_back(to_bytes(v));
            auto out = run_group(group_case{ n, nullptr, count, ncclFloat32, ncclSum, -1, in_place }, in);
            int bad = 0;
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++) {
                    float want = ref_sum(x, i), got = elem<float>(out[(size_t)r], i);
                    if (memcmp(&want, &got, 4) != 0 && bad++ < 3)
                        CHECK(false, "n %d, rank %d, [%zu] = %.9g, want %.9g", n, r, i, got, want);
                }
            CHECK(bad == 0, "n %d %s: %d wrong elements", n, in_place ? "in place" : "out of place", bad);
        }
}

/* Inside a group nothing is enqueued until the outermost ncclGroupEnd: a lone rank's
 * all-reduce in its queue would wait for its peer and keep the stream busy. */
static void test_group_defers_until_outermost_end(void)
{
    const size_t count = 64;
    ncclComm_t comms[2];
    cudaStream_t s[2];
    float *x[2];
    two_ranks(comms, s, x, nullptr, count, true);
    for (int r = 0; r < 2; r++) cudaStreamSynchronize(s[r]);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(x[0], x[0], count, ncclFloat32, ncclSum, comms[0], s[0]));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(cudaStreamQuery(s[0]) == cudaSuccess, "rank 0's all-reduce was enqueued inside the group");
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclGroupEnd());
    CHECK(cudaStreamQuery(s[0]) == cudaSuccess, "an inner ncclGroupEnd enqueued the group");
    NCCL_OK(ncclAllReduce(x[1], x[1], count, ncclFloat32, ncclSum, comms[1], s[1]));
    NCCL_OK(ncclGroupEnd());
    std::vector<float> h(count);
    for (int r = 0; r < 2; r++) {
        cudaMemcpyAsync(h.data(), x[r], count * sizeof(float), cudaMemcpyDeviceToHost, s[r]);
        cudaStreamSynchronize(s[r]);
        CHECK(h[5] == 3010.0f, "rank %d: [5] = %g, want 3010", r, h[5]);
    }
    for (int r = 0; r < 2; r++) {
        cudaFree(x[r]);
        cudaStreamDestroy(s[r]);
        ncclCommDestroy(comms[r]);
    }
    cudaSetDevice(0);
}

/* fp16 and bf16 accumulate in float in rank order and round once. */
static void test_allreduce_half_and_bf16(void)
{
    const int n = 4;
    const size_t count = 1500;
    auto x = float_inputs(n, count, 77);
    for (ncclDataType_t t : { ncclFloat16, ncclBfloat16 }) {
        const bool half = t == ncclFloat16;
        auto rounded = [&](float v) {
            return half ? __half2float(__float2half_rn(v)) : __bfloat162float(__float2bfloat16_rn(v));
        };
        std::vector<std::vector<char>> in;
        std::vector<std::vector<float>> xr((size_t)n, std::vector<float>(count)); /* the inputs as the type holds them */
        for (int r = 0; r < n; r++) {
            std::vector<char> b(count * 2);
            for (size_t i = 0; i < count; i++) {
                xr[(size_t)r][i] = rounded(x[(size_t)r][i]);
                if (half) {
                    __half h = __float2half_rn(x[(size_t)r][i]);
                    memcpy(&b[i * 2], &h, 2);
                } else {
                    __nv_bfloat16 h = __float2bfloat16_rn(x[(size_t)r][i]);
                    memcpy(&b[i * 2], &h, 2);
                }
            }
            in.push_back(b);
        }
        auto out = run_group(group_case{ n, nullptr, count, t, ncclSum, -1, true }, in);
        int bad = 0, stepwise_differs = 0;
        for (size_t i = 0; i < count; i++) {
            float want = rounded(ref_sum(xr, i));
            float step = xr[0][i]; /* what rounding after every addition would give */
            for (int r = 1; r < n; r++) step = rounded(step + xr[(size_t)r][i]);
            stepwise_differs += step != want;
            for (int r = 0; r < n; r++) {
                float got = half ? __half2float(elem<__half>(out[(size_t)r], i))
                                 : __bfloat162float(elem<__nv_bfloat16>(out[(size_t)r], i));
                if (got != want && bad++ < 3)
                    CHECK(false, "%s rank %d [%zu] = %.9g, want %.9g", half ? "f16" : "bf16", r, i, got, want);
            }
        }
        CHECK(bad == 0, "%s: %d wrong elements", half ? "f16" : "bf16", bad);
        CHECK(stepwise_differs > 0, "%s: the inputs cannot tell one rounding from rounding per step", half ? "f16" : "bf16");
    }
}

static void test_allreduce_max_min_avg_prod_f32(void)
{
    const int n = 4;
    const size_t count = 513;
    auto x = float_inputs(n, count, 91);
    std::vector<std::vector<char>> in;
    for (auto &v : x) in.push_back(to_bytes(v));
    for (ncclRedOp_t op : { ncclMax, ncclMin, ncclAvg, ncclProd }) {
        auto out = run_group(group_case{ n, nullptr, count, ncclFloat32, op, -1, false }, in);
        int bad = 0;
        for (size_t i = 0; i < count; i++) {
            float want = x[0][i];
            for (int r = 1; r < n; r++) {
                float v = x[(size_t)r][i];
                if (op == ncclMax) want = std::max(want, v);
                else if (op == ncclMin) want = std::min(want, v);
                else if (op == ncclProd) want *= v;
                else want += v;
            }
            if (op == ncclAvg) want /= (float)n;
            for (int r = 0; r < n; r++) {
                float got = elem<float>(out[(size_t)r], i);
                if (memcmp(&got, &want, 4) != 0 && bad++ < 3)
                    CHECK(false, "op %d rank %d [%zu] = %.9g, want %.9g", (int)op, r, i, got, want);
            }
        }
        CHECK(bad == 0, "op %d: %d wrong elements", (int)op, bad);
    }
}

/* Integers reduce in their own type; a sum past INT32_MAX wraps as on a GPU. */
static void test_allreduce_int32_and_int64(void)
{
    const int n = 3;
    const size_t count = 100;
    std::vector<std::vector<int32_t>> x((size_t)n, std::vector<int32_t>(count));
    std::vector<std::vector<char>> in;
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++) x[(size_t)r][i] = (int32_t)((i * 37 + (size_t)r * 1013) % 2001) - 1000;
        x[(size_t)r][0] = INT32_MAX - 5 + r; /* the sum wraps */
        in.push_back(to_bytes(x[(size_t)r]));
    }
    for (ncclRedOp_t op : { ncclSum, ncclMax, ncclMin }) {
        auto out = run_group(group_case{ n, nullptr, count, ncclInt32, op, -1, op == ncclMax }, in);
        int bad = 0;
        for (size_t i = 0; i < count; i++) {
            uint32_t sum = 0;
            int32_t mx = INT32_MIN, mn = INT32_MAX;
            for (int r = 0; r < n; r++) {
                sum += (uint32_t)x[(size_t)r][i];
                mx = std::max(mx, x[(size_t)r][i]);
                mn = std::min(mn, x[(size_t)r][i]);
            }
            int32_t want = op == ncclSum ? (int32_t)sum : op == ncclMax ? mx : mn;
            for (int r = 0; r < n; r++) {
                int32_t got = elem<int32_t>(out[(size_t)r], i);
                if (got != want && bad++ < 3) CHECK(false, "op %d rank %d [%zu] = %d, want %d", (int)op, r, i, got, want);
            }
        }
        CHECK(bad == 0, "int32 op %d: %d wrong elements", (int)op, bad);
    }
    std::vector<std::vector<char>> in64;
    for (int r = 0; r < n; r++) in64.push_back(to_bytes(std::vector<int64_t>{ (int64_t)1 << 40, -(int64_t)r * 3000000000ll }));
    auto out = run_group(group_case{ n, nullptr, 2, ncclInt64, ncclSum, -1, false }, in64);
    for (int r = 0; r < n; r++)
        CHECK(elem<int64_t>(out[(size_t)r], 0) == (int64_t)3 << 40 && elem<int64_t>(out[(size_t)r], 1) == -9000000000ll,
              "int64 rank %d: %lld %lld", r, (long long)elem<int64_t>(out[(size_t)r], 0),
              (long long)elem<int64_t>(out[(size_t)r], 1));
}

/* ---- broadcast -------------------------------------------------------------------------- */

static void test_broadcast_from_root_1(void)
{
    const int n = 4;
    const size_t count = 300;
    const int devlist[4] = { 3, 1, 0, 2 }; /* rank 1 is on device 1; ranks are not devices */
    auto x = float_inputs(n, count, 123);
    std::vector<std::vector<char>> in;
    for (auto &v : x) in.push_back(to_bytes(v));
    for (bool in_place : { false, true }) {
        auto out = run_group(group_case{ n, devlist, count, ncclFloat32, ncclSum, 1, in_place }, in);
        for (int r = 0; r < n; r++)
            CHECK(out[(size_t)r] == in[1], "%s: rank %d did not get root 1's buffer ([0] = %g, want %g)",
                  in_place ? "in place" : "out of place", r, elem<float>(out[(size_t)r], 0), x[1][0]);
    }
}

/* ---- stream order and graphs ------------------------------------------------------------ */

/* kernel (writes the input) -> all-reduce -> kernel (reads the result), rank 0's stream
 * held behind a gate until all of it is enqueued. */
static void test_stream_order_with_kernels(void)
{
    const int count = 200;
    ncclComm_t comms[2];
    cudaStream_t s[2];
    float *x[2], *y[2];
    gate g;
    two_ranks(comms, s, x, y, count, false);
    cudaLaunchHostFunc(s[0], wait_gate, &g);
    for (int r = 0; r < 2; r++) TS_LAUNCH(fill_rank_kernel, 1, 256, 0, s[r], x[r], r, count);
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; r++) NCCL_OK(ncclAllReduce(x[r], x[r], count, ncclFloat32, ncclSum, comms[r], s[r]));
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < 2; r++) TS_LAUNCH(twice_plus_one_kernel, 1, 256, 0, s[r], x[r], y[r], count);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(cudaStreamQuery(s[1]) == cudaErrorNotReady, "rank 1 finished while rank 0 had not arrived");
    g.open = 1;
    std::vector<float> h(count);
    for (int r = 0; r < 2; r++) {
        cudaMemcpyAsync(h.data(), y[r], count * sizeof(float), cudaMemcpyDeviceToHost, s[r]);
        cudaStreamSynchronize(s[r]);
        int bad = 0;
        for (int i = 0; i < count; i++) bad += h[(size_t)i] != 2.0f * (float)(3000 + 2 * i) + 1.0f;
        CHECK(bad == 0, "rank %d: %d wrong, y[7] = %g, want %g", r, bad, h[7], 2.0f * 3014.0f + 1.0f);
    }
    CHECK(!g.timed_out, "gate timed out");
    for (int r = 0; r < 2; r++) {
        cudaFree(x[r]);
        cudaFree(y[r]);
        cudaStreamDestroy(s[r]);
        ncclCommDestroy(comms[r]);
    }
    cudaSetDevice(0);
}

/* Each rank's thread captures scale -> all-reduce -> 2x+1 into a graph and replays it three
 * times with new inputs: every replay meets the other ranks again. */
static void test_graph_replays_per_rank(void)
{
    const int n = 4, count = 300, reps = 3;
    ncclComm_t comms[4];
    NCCL_OK(ncclCommInitAll(comms, n, nullptr));
    /* exact in float (so no rounding or fused multiply-add can differ): only replays are tested here */
    auto input = [](int k, int r, int i) { return (float)(k * 10) + (float)i * 0.25f + (float)r * 1.5f; };
    std::vector<std::vector<std::vector<float>>> got((size_t)reps, std::vector<std::vector<float>>((size_t)n));
    std::vector<int> ok((size_t)n, 0);
    std::vector<size_t> nodes((size_t)n, 0);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; r++)
        ts.emplace_back([&, r] {
            cudaSetDevice(r);
            cudaStream_t s;
            float *in, *x, *y;
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
            cudaMalloc((void **)&in, count * sizeof(float));
            cudaMalloc((void **)&x, count * sizeof(float));
            cudaMalloc((void **)&y, count * sizeof(float));
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            int fine = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess;
            TS_LAUNCH(scale_kernel, 2, 256, 0, s, in, x, (float)(r + 1), count);
            fine &= ncclAllReduce(x, x, count, ncclFloat32, ncclSum, comms[r], s) == ncclSuccess;
            TS_LAUNCH(twice_plus_one_kernel, 2, 256, 0, s, x, y, count);
            fine &= cudaStreamEndCapture(s, &graph) == cudaSuccess;
            fine &= cudaGraphGetNodes(graph, nullptr, &nodes[(size_t)r]) == cudaSuccess;
            fine &= cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
            std::vector<float> h(count);
            for (int k = 0; k < reps && fine; k++) {
                for (int i = 0; i < count; i++) h[(size_t)i] = input(k, r, i);
                cudaMemcpyAsync(in, h.data(), count * sizeof(float), cudaMemcpyHostToDevice, s);
                fine &= cudaGraphLaunch(exec, s) == cudaSuccess;
                got[(size_t)k][(size_t)r].resize(count);
                cudaMemcpyAsync(got[(size_t)k][(size_t)r].data(), y, count * sizeof(float), cudaMemcpyDeviceToHost, s);
                fine &= cudaStreamSynchronize(s) == cudaSuccess;
            }
            ok[(size_t)r] = fine;
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            cudaFree(in);
            cudaFree(x);
            cudaFree(y);
            cudaStreamDestroy(s);
        });
    for (auto &t : ts) t.join();
    for (int r = 0; r < n; r++) {
        CHECK(ok[(size_t)r], "rank %d: a capture, launch or sync call failed", r);
        CHECK(nodes[(size_t)r] == 3, "rank %d: %zu ops captured, want 3", r, nodes[(size_t)r]);
    }
    int bad = 0;
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < count; i++) {
            float acc = input(k, 0, i);
            for (int r = 1; r < n; r++) acc += input(k, r, i) * (float)(r + 1);
            float want = 2.0f * acc + 1.0f;
            for (int r = 0; r < n; r++) {
                const std::vector<float> &v = got[(size_t)k][(size_t)r];
                float g = v.empty() ? NAN : v[(size_t)i];
                if (g != want && bad++ < 3) CHECK(false, "replay %d rank %d [%d] = %.9g, want %.9g", k, r, i, g, want);
            }
        }
    CHECK(bad == 0, "%d wrong elements", bad);
    for (int r = 0; r < n; r++) NCCL_OK(ncclCommDestroy(comms[r]));
}

/* ---- errors at the call, count 0 -------------------------------------------------------- */

static void test_call_errors_and_count_zero(void)
{
    const size_t count = 16;
    ncclComm_t comms[2];
    cudaStream_t s[2];
    float *x[2];
    two_ranks(comms, s, x, nullptr, count, true);
    cudaSetDevice(0);
    std::vector<float> host(count);
    CHECK(ncclAllReduce(x[1], x[1], count, ncclFloat32, ncclSum, comms[1], s[0]) == ncclInvalidArgument,
          "rank 1 (device 1) accepted a stream of device 0");
    CHECK(strstr(ncclGetLastError(comms[1]), "device"), "last error \"%s\"", ncclGetLastError(comms[1]));
    CHECK(ncclAllReduce(x[0], x[0], count, ncclFloat32, ncclSum, comms[0], 0) == ncclInvalidArgument,
          "the legacy stream accepted");
    CHECK(ncclAllReduce(host.data(), x[0], count, ncclFloat32, ncclSum, comms[0], s[0]) == ncclInvalidArgument,
          "a host sendbuff accepted");
    CHECK(ncclAllReduce(x[0], x[0], count + 1, ncclFloat32, ncclSum, comms[0], s[0]) == ncclInvalidArgument,
          "a buffer one element short accepted");
    /* 12 is NCCL's ncclNumTypes (and inside the enum's range, which UBSan checks) */
    CHECK(ncclAllReduce(x[0], x[0], count, (ncclDataType_t)12, ncclSum, comms[0], s[0]) == ncclInvalidArgument,
          "data type 12 accepted");
    CHECK(ncclAllReduce(x[0], x[0], count, ncclFloat32, (ncclRedOp_t)9, comms[0], s[0]) == ncclInvalidArgument,
          "op 9 accepted");
    CHECK(ncclAllReduce(x[0], x[0], count, ncclFloat32, ncclSum, nullptr, s[0]) == ncclInvalidArgument,
          "a null comm accepted");
    CHECK(ncclBroadcast(x[0], x[0], count, ncclFloat32, 2, comms[0], s[0]) == ncclInvalidArgument,
          "root 2 of 2 ranks accepted");
    /* a non-root's sendbuff is not read, so it is not checked (as in NCCL) */
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclBroadcast(x[0], x[0], count, ncclFloat32, 0, comms[0], s[0]));
    NCCL_OK(ncclBroadcast(host.data(), x[1], count, ncclFloat32, 0, comms[1], s[1]));
    NCCL_OK(ncclGroupEnd());
    /* count 0: nothing is enqueued, so rank 0's next all-reduce still pairs with rank 1's */
    NCCL_OK(ncclAllReduce(x[0], x[0], 0, ncclFloat32, ncclSum, comms[0], s[0]));
    NCCL_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comms[0], s[0]));
    cudaStreamSynchronize(s[0]);
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; r++) NCCL_OK(ncclAllReduce(x[r], x[r], count, ncclFloat32, ncclSum, comms[r], s[r]));
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < 2; r++) {
        cudaMemcpyAsync(host.data(), x[r], count * sizeof(float), cudaMemcpyDeviceToHost, s[r]);
        cudaStreamSynchronize(s[r]);
        CHECK(host[3] == 2.0f * 1003.0f, "rank %d: [3] = %g, want 2006 (broadcast of rank 0, then the sum)", r,
              host[3]);
    }
    for (int r = 0; r < 2; r++) {
        cudaFree(x[r]);
        cudaStreamDestroy(s[r]);
        NCCL_OK(ncclCommDestroy(comms[r]));
    }
}

/* ---- destroy and abort ------------------------------------------------------------------ */

/* ncclCommDestroy returns only once the comm's queued collectives have run. */
static void test_destroy_waits_for_queued_collectives(void)
{
    const size_t count = 32;
    ncclComm_t comms[2];
    cudaStream_t s[2];
    float *x[2];
    gate g;
    two_ranks(comms, s, x, nullptr, count, true);
    cudaLaunchHostFunc(s[0], wait_gate, &g);
    for (int r = 0; r < 2; r++) NCCL_OK(ncclAllReduce(x[r], x[r], count, ncclFloat32, ncclSum, comms[r], s[r]));
    std::atomic<int> destroyed{ 0 };
    std::thread t([&] {
        ncclCommDestroy(comms[0]);
        destroyed = 1;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK(destroyed == 0, "ncclCommDestroy returned while its all-reduce was still queued");
    g.open = 1;
    t.join();
    NCCL_OK(ncclCommDestroy(comms[1]));
    std::vector<float> h(count);
    cudaMemcpyAsync(h.data(), x[0], count * sizeof(float), cudaMemcpyDeviceToHost, s[0]);
    cudaStreamSynchronize(s[0]);
    CHECK(h[1] == 3002.0f, "[1] = %g, want 3002", h[1]);
    CHECK(!g.timed_out, "gate timed out");
    for (int r = 0; r < 2; r++) {
        cudaFree(x[r]);
        cudaStreamDestroy(s[r]);
    }
    cudaSetDevice(0);
}

/* ncclCommAbort releases a peer that waits for a rank that will never come. */
static void test_abort_releases_waiting_peers(void)
{
    const size_t count = 32;
    ncclComm_t comms[2];
    float *x, *y;
    cudaStream_t s;
    NCCL_OK(ncclCommInitAll(comms, 2, nullptr));
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void **)&x, count * sizeof(float));
    cudaMalloc((void **)&y, count * sizeof(float));
    cudaMemsetAsync(x, 0, count * sizeof(float), s);
    cudaMemsetAsync(y, 0x7f, count * sizeof(float), s);
    NCCL_OK(ncclAllReduce(x, y, count, ncclFloat32, ncclSum, comms[0], s));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "rank 0 finished alone");
    NCCL_OK(ncclCommAbort(comms[1]));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "stream sync after the abort");
    ncclResult_t async = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(comms[0], &async));
    CHECK(async == ncclRemoteError, "rank 0's async error %d, want ncclRemoteError", (int)async);
    unsigned char b[4] = { 0, 0, 0, 0 };
    cudaMemcpy(b, y, 4, cudaMemcpyDeviceToHost);
    CHECK(b[0] == 0x7f && b[3] == 0x7f, "the aborted all-reduce wrote its recvbuff (%02x)", b[0]);
    NCCL_OK(ncclCommDestroy(comms[0]));
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(s);
}

/* ---- programming errors abort ----------------------------------------------------------- */

/* Child cases (run through emu_run_self). */
static void child_mismatch(void)
{
    ncclComm_t comms[2];
    cudaStream_t s[2];
    float *x[2];
    two_ranks(comms, s, x, nullptr, 8, false);
    ncclGroupStart();
    ncclAllReduce(x[0], x[0], 8, ncclFloat32, ncclSum, comms[0], s[0]);
    ncclAllReduce(x[1], x[1], 4, ncclFloat32, ncclSum, comms[1], s[1]);
    ncclGroupEnd();
    cudaStreamSynchronize(s[0]);
    cudaStreamSynchronize(s[1]);
}

static void child_missing_rank(void)
{
    ncclComm_t comms[2];
    cudaStream_t s;
    float *x;
    ncclCommInitAll(comms, 2, nullptr);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void **)&x, 8 * sizeof(float));
    ncclAllReduce(x, x, 8, ncclFloat32, ncclSum, comms[0], s); /* rank 1 never calls */
    cudaStreamSynchronize(s);
}

static void test_mismatch_and_missing_rank_abort(void)
{
    emu_child r = emu_run_self("--mismatch", "TESSERA_EMU_WATCHDOG_S=5");
    CHECK(emu_died_by_abort(r), "mismatched ranks: no abort (signal %d, exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "ncclAllReduce(count 8, ncclFloat32, ncclSum)"), "names rank 0's call");
    CHECK(emu_err_has(r, "ncclAllReduce(count 4, ncclFloat32, ncclSum)"), "names rank 1's call");
    CHECK(emu_err_has(r, "same collective calls"), "says what is wrong");
    double t0 = emu_now_us();
    r = emu_run_self("--missing-rank", "TESSERA_EMU_WATCHDOG_S=1");
    double waited = emu_now_us() - t0;
    CHECK(emu_died_by_abort(r), "missing rank: no abort (signal %d, exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "rank 1 never arrived"), "names the missing rank");
    CHECK(emu_err_has(r, "collective #0"), "names the collective");
    CHECK(waited >= 0.9e6 && waited < 30e6, "aborted after %.0f us, want about 1 s", waited);
}

int main(int argc, char **argv)
{
    setenv("TESSERA_EMU_DEVICES", "4", 1); /* read once, at the first CUDA call */
    if (argc == 2 && strcmp(argv[1], "--mismatch") == 0) {
        child_mismatch();
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--missing-rank") == 0) {
        child_missing_rank();
        return 0;
    }
    int devices = 0;
    cudaGetDeviceCount(&devices);
    if (devices != 4) {
        printf("the emulator has %d devices, want 4\n0 passed, 1 failed\n", devices);
        return 1;
    }
    RUN(test_init_queries_and_errors);
    RUN(test_allreduce_sum_f32_thread_per_rank);
    RUN(test_allreduce_sum_f32_one_thread_group);
    RUN(test_group_defers_until_outermost_end);
    RUN(test_allreduce_half_and_bf16);
    RUN(test_allreduce_max_min_avg_prod_f32);
    RUN(test_allreduce_int32_and_int64);
    RUN(test_broadcast_from_root_1);
    RUN(test_stream_order_with_kernels);
    RUN(test_graph_replays_per_rank);
    RUN(test_call_errors_and_count_zero);
    RUN(test_destroy_waits_for_queued_collectives);
    RUN(test_abort_releases_waiting_peers);
    RUN(test_mismatch_and_missing_rank_abort);
    return test_summary();
}
