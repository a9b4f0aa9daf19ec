/* test_emu_warp.cu — the emulator's warp primitives against CUDA's documented results:
 * shuffles (all four, every width, every value type), votes, reductions, match, syncwarp,
 * inside `if (threadIdx.x < 32)` and in partial last warps; a wrong mask, a lane that
 * exits while named, and mixed ops at one meeting abort.
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

#include <vector>

/* Host model of one shuffle: the source lane CUDA documents, or -1 for "own value". */
static int ref_src(int mode, int lane, int arg, int width)
{
    int seg = lane & ~(width - 1), in = lane & (width - 1);
    switch (mode) {
    case 0: return seg + (arg & (width - 1));
    case 1: return in >= arg ? lane - arg : lane;
    case 2: return in + arg < width ? lane + arg : lane;
    default: {
        int s = lane ^ arg;
        return s > (seg | (width - 1)) ? lane : s;
    }
    }
}

/* Every thread of a 64-thread block shuffles its id with each mode, argument and width. */
__global__ void shfl_grid_kernel(int *out)
{
    int lane = (int)threadIdx.x & 31, k = 0;
    int v = (int)threadIdx.x * 10;
    for (int width = 1; width <= 32; width *= 2)
        for (int arg = 0; arg < 33; arg += 3) {
            out[(k++) * 64 + threadIdx.x] = __shfl_sync(TS_FULL_MASK, v, arg, width);
            out[(k++) * 64 + threadIdx.x] = __shfl_up_sync(TS_FULL_MASK, v, (unsigned)arg, width);
            out[(k++) * 64 + threadIdx.x] = __shfl_down_sync(TS_FULL_MASK, v, (unsigned)arg, width);
            out[(k++) * 64 + threadIdx.x] = __shfl_xor_sync(TS_FULL_MASK, v, arg & 31, width);
        }
    (void)lane;
}

static void test_shuffle_modes_and_widths(void)
{
    const int n = 6 * 11 * 4;
    int *d;
    cudaMalloc((void **)&d, n * 64 * sizeof(int));
    TS_LAUNCH(shfl_grid_kernel, 1, 64, 0, 0, d);
    std::vector<int> o(n * 64);
    cudaMemcpy(o.data(), d, o.size() * sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    int k = 0, bad = 0;
    for (int width = 1; width <= 32; width *= 2)
        for (int arg = 0; arg < 33; arg += 3)
            for (int mode = 0; mode < 4; mode++, k++)
                for (int t = 0; t < 64; t++) {
                    int lane = t & 31, a = mode == 3 ? arg & 31 : arg;
                    int want = ((t & ~31) + ref_src(mode, lane, a, width)) * 10;
                    if (o[k * 64 + t] != want && bad++ < 5)
                        CHECK(false, "mode %d width %d arg %d thread %d: got %d want %d", mode, width, arg, t,
                              o[k * 64 + t], want);
                }
    CHECK(bad == 0, "%d wrong shuffle results", bad);
}

/* Every value type moves intact through a shuffle. */
__global__ void shfl_types_kernel(double *out)
{
    int l = (int)threadIdx.x;
    int src = (l + 5) & 31;
    out[0 * 32 + l] = (double)__shfl_sync(TS_FULL_MASK, (int)(-l * 1000), src);
    out[1 * 32 + l] = (double)__shfl_sync(TS_FULL_MASK, (unsigned)(l + 4000000000u), src);
    out[2 * 32 + l] = (double)__shfl_sync(TS_FULL_MASK, (long long)l * 10000000000ll, src);
    out[3 * 32 + l] = (double)__shfl_sync(TS_FULL_MASK, (unsigned long long)l << 40, src);
    out[4 * 32 + l] = (double)__shfl_sync(TS_FULL_MASK, 0.25f * l, src);
    out[5 * 32 + l] = __shfl_sync(TS_FULL_MASK, 1e-300 * l, src);
    out[6 * 32 + l] = __half2float(__shfl_sync(TS_FULL_MASK, __float2half(0.5f * l), src));
    __half2 h2 = __shfl_sync(TS_FULL_MASK, __floats2half2_rn(l, -l), src);
    out[7 * 32 + l] = __low2float(h2) - 100 * __high2float(h2);
    out[8 * 32 + l] = __bfloat162float(__shfl_sync(TS_FULL_MASK, __float2bfloat16(2.0f * l), src));
    __nv_bfloat162 b2 = __shfl_sync(TS_FULL_MASK, __floats2bfloat162_rn(l, 3 * l), src);
    out[9 * 32 + l] = __low2float(b2) + 100 * __high2float(b2);
}

static void test_shuffle_types(void)
{
    double *d;
    cudaMalloc((void **)&d, 10 * 32 * sizeof(double));
    TS_LAUNCH(shfl_types_kernel, 1, 32, 0, 0, d);
    std::vector<double> o(10 * 32);
    cudaMemcpy(o.data(), d, o.size() * sizeof(double), cudaMemcpyDeviceToHost);
    cudaFree(d);
    for (int l = 0; l < 32; l++) {
        int s = (l + 5) & 31;
        CHECK(o[l] == -s * 1000, "int %g", o[l]);
        CHECK(o[32 + l] == (double)(unsigned)(s + 4000000000u), "unsigned %g", o[32 + l]);
        CHECK(o[64 + l] == (double)(s * 10000000000ll), "long long %g", o[64 + l]);
        CHECK(o[96 + l] == (double)((unsigned long long)s << 40), "unsigned long long %g", o[96 + l]);
        CHECK(o[128 + l] == 0.25 * s, "float %g", o[128 + l]);
        CHECK(o[160 + l] == 1e-300 * s, "double %g", o[160 + l]);
        CHECK(o[192 + l] == 0.5 * s, "half %g", o[192 + l]);
        CHECK(o[224 + l] == s + 100.0 * s, "half2 %g", o[224 + l]);
        CHECK(o[256 + l] == 2.0 * s, "bf16 %g", o[256 + l]);
        CHECK(o[288 + l] == s + 300.0 * s, "bf162 %g", o[288 + l]);
    }
}

/* Warp ops inside `if (threadIdx.x < 32)` of a 256-thread block, and in a partial last
 * warp (block of 48: warp 1 has 16 lanes) with the mask of the lanes that exist. */
__global__ void partial_kernel(float *out, unsigned *votes)
{
    int t = (int)threadIdx.x;
    float v = (float)t;
    if (t < 32) {
        out[t] = warp_sum(v); /* only warp 0 */
    }
    unsigned mask = __ballot_sync(t < 32 ? TS_FULL_MASK : 0xffffu, 1);
    float s = v;
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(mask, s, o, 16);
    if (t >= 32) out[t] = s;
    if ((t & 31) == 0) votes[t / 32] = mask;
}

static void test_partial_warps(void)
{
    float *d;
    unsigned *v;
    cudaMalloc((void **)&d, 48 * sizeof(float));
    cudaMalloc((void **)&v, 2 * sizeof(unsigned));
    TS_LAUNCH(partial_kernel, 1, 48, 0, 0, d, v);
    std::vector<float> o(48);
    unsigned hv[2];
    cudaMemcpy(o.data(), d, sizeof(float) * 48, cudaMemcpyDeviceToHost);
    cudaMemcpy(hv, v, sizeof hv, cudaMemcpyDeviceToHost);
    cudaFree(d);
    cudaFree(v);
    for (int t = 0; t < 32; t++) CHECK(o[t] == 496.0f, "warp 0 sum at %d: %g", t, o[t]);
    for (int t = 32; t < 48; t++) CHECK(o[t] == 32 * 16 + 120, "partial warp sum at %d: %g", t, o[t]);
    CHECK(hv[0] == TS_FULL_MASK && hv[1] == 0xffffu, "ballots %08x %08x", hv[0], hv[1]);
}

/* Votes, reductions, match, activemask, syncwarp with a sub-mask. */
__global__ void vote_kernel(unsigned *out)
{
    int l = (int)threadIdx.x;
    unsigned *o = out + l * 16;
    o[15] = __activemask(); /* no lane of the warp has exited yet */
    o[0] = __ballot_sync(TS_FULL_MASK, l % 3 == 0);
    o[1] = __any_sync(TS_FULL_MASK, l == 31);
    o[2] = __any_sync(TS_FULL_MASK, 0);
    o[3] = __all_sync(TS_FULL_MASK, l < 32);
    o[4] = __all_sync(TS_FULL_MASK, l != 7);
    o[5] = __reduce_add_sync(TS_FULL_MASK, (unsigned)l);
    o[6] = (unsigned)__reduce_min_sync(TS_FULL_MASK, 10 - l);
    o[7] = (unsigned)__reduce_max_sync(TS_FULL_MASK, l - 40);
    o[8] = __reduce_and_sync(TS_FULL_MASK, 0xf0u | (unsigned)l);
    o[9] = __reduce_or_sync(TS_FULL_MASK, 1u << l);
    o[10] = __reduce_xor_sync(TS_FULL_MASK, (unsigned)l);
    o[11] = __match_any_sync(TS_FULL_MASK, l / 8);
    int pred;
    o[12] = __match_all_sync(TS_FULL_MASK, 42, &pred);
    o[13] = (unsigned)pred;
    if (l < 16) {
        __syncwarp(0xffffu);
        o[14] = __ballot_sync(0xffffu, l & 1);
    } else {
        o[14] = __ballot_sync(0xffff0000u, l & 1); /* a separate meeting of the other half */
    }
}

static void test_votes_reductions_match(void)
{
    unsigned *d;
    cudaMalloc((void **)&d, 32 * 16 * sizeof(unsigned));
    TS_LAUNCH(vote_kernel, 1, 32, 0, 0, d);
    std::vector<unsigned> o(32 * 16);
    cudaMemcpy(o.data(), d, o.size() * sizeof(unsigned), cudaMemcpyDeviceToHost);
    cudaFree(d);
    unsigned b3 = 0;
    for (int l = 0; l < 32; l += 3) b3 |= 1u << l;
    for (int l = 0; l < 32; l++) {
        const unsigned *r = &o[l * 16];
        CHECK(r[0] == b3, "ballot %08x", r[0]);
        CHECK(r[1] == 1 && r[2] == 0 && r[3] == 1 && r[4] == 0, "any/all %u %u %u %u", r[1], r[2], r[3], r[4]);
        CHECK(r[5] == 496, "reduce_add %u", r[5]);
        CHECK((int)r[6] == -21 && (int)r[7] == -9, "reduce min/max %d %d", (int)r[6], (int)r[7]);
        CHECK(r[8] == 0xf0u && r[9] == TS_FULL_MASK && r[10] == 0, "and/or/xor %x %x %x", r[8], r[9], r[10]);
        CHECK(r[11] == 0xffu << (8 * (l / 8)), "match_any %08x", r[11]);
        CHECK(r[12] == TS_FULL_MASK && r[13] == 1, "match_all %08x %u", r[12], r[13]);
        CHECK(r[14] == (l < 16 ? 0xaaaau : 0xaaaa0000u), "half-warp ballot %08x", r[14]);
        CHECK(r[15] == TS_FULL_MASK, "activemask %08x", r[15]);
    }
}

/* A shuffle reading a lane outside its mask gets the 0xFF poison (CUDA: undefined). */
__global__ void outside_mask_kernel(int *out)
{
    int l = (int)threadIdx.x;
    if (l < 16) out[l] = __shfl_down_sync(0xffffu, l, 8);
}

static void test_read_outside_mask_is_poison(void)
{
    int *d;
    cudaMalloc((void **)&d, 16 * sizeof(int));
    TS_LAUNCH(outside_mask_kernel, 1, 32, 0, 0, d);
    int o[16];
    cudaMemcpy(o, d, sizeof o, cudaMemcpyDeviceToHost);
    cudaFree(d);
    /* lanes 8..15 read lanes 16..23: inside the 32-wide segment but outside the mask */
    for (int l = 0; l < 16; l++) CHECK(o[l] == (l < 8 ? l + 8 : -1), "lane %d got %d", l, o[l]);
}

/* ---- what must abort ------------------------------------------------------------------------ */

static const int WRONG_MASK_LINE = __LINE__ + 4;
__global__ void wrong_mask_kernel(float *out)
{
    float v = (float)threadIdx.x;
    v += __shfl_xor_sync(0x0000ffffu, v, 1); /* planted bug: lanes 16..31 are not in the mask */
    out[threadIdx.x] = v;
}

static const int EXITED_LANE_LINE = __LINE__ + 5;
__global__ void exited_lane_kernel(float *out)
{
    if (threadIdx.x == 3) return;                  /* planted bug: lane 3 is gone ... */
    float v = (float)threadIdx.x;
    v += __shfl_xor_sync(TS_FULL_MASK, v, 16);     /* ... but named in the full mask */
    out[threadIdx.x] = v;
}

__global__ void shfl_vs_barrier_kernel(float *out)
{
    float v = (float)threadIdx.x;
    if (threadIdx.x == 5) {
        __syncthreads(); /* planted bug: lane 5 waits at a block barrier */
    } else {
        v += __shfl_xor_sync(TS_FULL_MASK, v, 1);
        __syncthreads();
    }
    out[threadIdx.x] = v;
}

__global__ void mixed_ops_kernel(unsigned *out)
{
    if (threadIdx.x < 16) out[threadIdx.x] = __ballot_sync(TS_FULL_MASK, 1); /* planted bug: */
    else out[threadIdx.x] = (unsigned)__any_sync(TS_FULL_MASK, 1);           /* two different ops */
}

static void test_wrong_mask_aborts(void)
{
    emu_child r = emu_run_child([] {
        float *d;
        cudaMalloc((void **)&d, 4096);
        TS_LAUNCH(wrong_mask_kernel, 1, 32, 0, 0, d);
        cudaDeviceSynchronize();
    });
    char site[64];
    snprintf(site, sizeof site, "test_emu_warp.cu:%d", WRONG_MASK_LINE);
    CHECK(emu_died_by_abort(r), "did not abort (signal %d exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "does not include the lane"), "message");
    CHECK(emu_err_has(r, "__shfl_xor_sync"), "op name");
    CHECK(emu_err_has(r, site), "call site");
    CHECK(emu_err_has(r, "wrong_mask_kernel"), "kernel name");
    CHECK(emu_err_has(r, "TESSERA_EMU_SEED="), "seed");
}

static void test_exited_lane_aborts(void)
{
    emu_child r = emu_run_child([] {
        float *d;
        cudaMalloc((void **)&d, 4096);
        TS_LAUNCH(exited_lane_kernel, 1, 32, 0, 0, d);
        cudaDeviceSynchronize();
    });
    char site[64];
    snprintf(site, sizeof site, "test_emu_warp.cu:%d", EXITED_LANE_LINE);
    CHECK(emu_died_by_abort(r), "did not abort (signal %d exit %d)", r.sig, r.exit_code);
    CHECK(r.err.find("exited") != std::string::npos, "no exit message:\n%s", r.err.c_str());
    CHECK(emu_err_has(r, site), "call site");
}

static void test_lane_at_barrier_is_deadlock(void)
{
    emu_child r = emu_run_child([] {
        float *d;
        cudaMalloc((void **)&d, 4096);
        TS_LAUNCH(shfl_vs_barrier_kernel, 1, 64, 0, 0, d);
        cudaDeviceSynchronize();
    });
    CHECK(emu_died_by_abort(r), "did not abort (signal %d exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "deadlock"), "message");
    CHECK(emu_err_has(r, "lane 5) waits at __syncthreads()"), "where lane 5 waits");
}

static void test_mixed_ops_abort(void)
{
    emu_child r = emu_run_child([] {
        unsigned *d;
        cudaMalloc((void **)&d, 4096);
        TS_LAUNCH(mixed_ops_kernel, 1, 32, 0, 0, d);
        cudaDeviceSynchronize();
    });
    CHECK(emu_died_by_abort(r), "did not abort (signal %d exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "mixed warp operations"), "message");
    CHECK(emu_err_has(r, "__ballot_sync") && emu_err_has(r, "__any_sync"), "op names");
}

__global__ void overlapping_masks_kernel(float *out)
{
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v += __shfl_xor_sync(0x0001ffffu, v, 1); /* planted bug: lane 16 is named here */
    else v += __shfl_xor_sync(TS_FULL_MASK, v, 1);                  /* but calls with another mask */
    out[threadIdx.x] = v;
}

__global__ void bad_width_kernel(float *out)
{
    float v = (float)threadIdx.x;
    v += __shfl_xor_sync(TS_FULL_MASK, v, 1, 3); /* planted bug: width 3 */
    out[threadIdx.x] = v;
}

/* Lanes 0..8 each open a meeting with a partner (lane + 16) that never arrives: nine pending
 * operations in one warp (the partners spin, yielding, so the block never stalls). */
__global__ void many_pending_kernel(const volatile int *never, float *out)
{
    const unsigned l = threadIdx.x;
    float v = (float)l;
    if (l < 9) v += __shfl_sync((1u << l) | (1u << (l + 16)), v, (int)l + 16);
    else if (l >= 16 && l < 25)
        while (!*never) __nanosleep(100);
    out[l] = v;
}

static void test_warp_op_misuse_aborts(void)
{
    struct {
        const char *what;
        std::function<void(float *)> launch;
    } cases[] = {
        { "masks overlap but differ",
          [](float *d) { TS_LAUNCH(overlapping_masks_kernel, 1, 32, 0, 0, d); } },
        { "width 3 is not a power of two", [](float *d) { TS_LAUNCH(bad_width_kernel, 1, 32, 0, 0, d); } },
        { "more than 8 warp operations pending",
          [](float *d) { TS_LAUNCH(many_pending_kernel, 1, 32, 0, 0, (const volatile int *)(d + 32), d); } },
    };
    for (auto &c : cases) {
        emu_child r = emu_run_child([&c] {
            float *d;
            cudaMalloc((void **)&d, 4096);
            cudaMemset(d, 0, 4096);
            c.launch(d);
            cudaDeviceSynchronize();
        });
        CHECK(emu_died_by_abort(r), "%s: did not abort (signal %d exit %d)", c.what, r.sig, r.exit_code);
        CHECK(emu_err_has(r, c.what), "%s: message:\n%s", c.what, r.err.c_str());
    }
}

/* ---- speed ------------------------------------------------------------------------------------ */

__global__ void yield_kernel(int iters)
{
    for (int i = 0; i < iters; i++) __nanosleep(0);
}

__global__ void shfl_loop_kernel(int iters, float *out)
{
    float v = (float)threadIdx.x;
    for (int i = 0; i < iters; i++) v += __shfl_xor_sync(TS_FULL_MASK, v, 1);
    out[threadIdx.x] = v;
}

__global__ void barrier_loop_kernel(int iters)
{
    for (int i = 0; i < iters; i++) __syncthreads();
}

static void test_speed_report(void)
{
    float *d;
    cudaMalloc((void **)&d, 256 * sizeof(float));
    const int yields = 200000, ops = 2000;
    TS_LAUNCH(yield_kernel, 1, 2, 0, 0, 100);
    cudaDeviceSynchronize();
    double t0 = emu_now_us();
    TS_LAUNCH(yield_kernel, 1, 2, 0, 0, yields);
    cudaDeviceSynchronize();
    double sw = (emu_now_us() - t0) * 1000 / (2.0 * yields);
    t0 = emu_now_us();
    TS_LAUNCH(shfl_loop_kernel, 1, 256, 0, 0, ops, d);
    cudaDeviceSynchronize();
    double sh = (emu_now_us() - t0) * 1000 / (256.0 * ops);
    t0 = emu_now_us();
    TS_LAUNCH(barrier_loop_kernel, 1, 256, 0, 0, ops);
    cudaDeviceSynchronize();
    double ba = (emu_now_us() - t0) * 1000 / (256.0 * ops);
    cudaFree(d);
    printf("     fiber switch %.1f ns; per thread: shuffle %.1f ns, __syncthreads %.1f ns (256-thread block)\n", sw,
           sh, ba);
    CHECK(sw < 1000, "a fiber switch takes %.0f ns", sw);
}

int main(void)
{
    RUN(test_shuffle_modes_and_widths);
    RUN(test_shuffle_types);
    RUN(test_partial_warps);
    RUN(test_votes_reductions_match);
    RUN(test_read_outside_mask_is_poison);
    RUN(test_wrong_mask_aborts);
    RUN(test_exited_lane_aborts);
    RUN(test_lane_at_barrier_is_deadlock);
    RUN(test_mixed_ops_abort);
    RUN(test_warp_op_misuse_aborts);
    RUN(test_speed_report);
    return test_summary();
}
