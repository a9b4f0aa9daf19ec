/* test_emu_wmma.cu — nvcuda::wmma under the emulator: a tiled GEMM for every shape, input
 * type, operand layout, accumulator type and store layout against a plain-loop reference
 * that accumulates in the same order; element-wise work on fragments; CUDA's element
 * counts per lane, and a fragment's bits read as another type's failing; CUDA's argument
 * rules (alignment, ldm, a full warp) abort when broken.
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

#include <vector>

using namespace nvcuda;

template <typename T> static float to_f(T v);
template <> float to_f<__half>(__half v) { return __half2float(v); }
template <> float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> static T from_f(float v);
template <> __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> float from_f<float>(float v) { return v; }

static float to_f_acc(float v) { return v; }
static float to_f_acc(__half v) { return __half2float(v); }

template <typename T> static void fill_inputs(std::vector<T> &v)
{
    uint64_t s = 0x1234567ull + v.size();
    for (auto &x : v) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = from_f<T>((float)((int)(s >> 40) % 17 - 8) / 8.0f);
    }
}

/* One warp per M x N output tile: C = 2 * A (m x k) * B (k x n), stored row- or column-major.
 * A is row-major (lda) when LA is row_major, column-major otherwise; likewise B. */
template <int M, int N, int K, typename T, typename LA, typename LB, typename TC>
__global__ void wmma_gemm_kernel(const T *A, const T *B, TC *C, int k, int lda, int ldb, int ldc, int store_col)
{
    int tm = (int)blockIdx.y * M, tn = (int)blockIdx.x * N;
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    wmma::fragment<wmma::matrix_a, M, N, K, T, LA> a;
    wmma::fragment<wmma::matrix_b, M, N, K, T, LB> b;
    wmma::fragment<wmma::accumulator, M, N, K, TC> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int p = 0; p < k; p += K) {
        wmma::load_matrix_sync(a, a_row ? A + (size_t)tm * lda + p : A + (size_t)p * lda + tm, lda);
        wmma::load_matrix_sync(b, b_row ? B + (size_t)p * ldb + tn : B + (size_t)tn * ldb + p, ldb);
        wmma::mma_sync(acc, a, b, acc);
    }
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] = from_f<TC>(2.0f * (float)acc.x[i]);
    if (store_col) wmma::store_matrix_sync(C + (size_t)tn * ldc + tm, acc, ldc, wmma::mem_col_major);
    else wmma::store_matrix_sync(C + (size_t)tm * ldc + tn, acc, ldc, wmma::mem_row_major);
}

template <int M, int N, int K, typename T, typename LA, typename LB, typename TC> static int check_case(int store_col)
{
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    /* several tiles per dimension, except along an 8-wide one: a second 8-element tile of
     * 16-bit data would start 16 bytes off the 32-byte alignment wmma requires */
    const int m = (M == 8 ? 1 : 2) * M, n = (N == 8 ? 1 : 3) * N, k = 3 * K;
    const int lda = (a_row ? k : m) + 16, ldb = (b_row ? n : k) + 16, ldc = (store_col ? m : n) + 8;
    std::vector<T> ha((size_t)lda * (a_row ? m : k)), hb((size_t)ldb * (b_row ? k : n));
    fill_inputs(ha);
    fill_inputs(hb);
    auto A = [&](int i, int p) { return to_f(a_row ? ha[(size_t)i * lda + p] : ha[(size_t)p * lda + i]); };
    auto B = [&](int p, int j) { return to_f(b_row ? hb[(size_t)p * ldb + j] : hb[(size_t)j * ldb + p]); };
    T *da, *db;
    TC *dc;
    size_t c_elems = (size_t)ldc * (store_col ? n : m);
    cudaMalloc((void **)&da, ha.size() * sizeof(T));
    cudaMalloc((void **)&db, hb.size() * sizeof(T));
    cudaMalloc((void **)&dc, c_elems * sizeof(TC));
    cudaMemcpy(da, ha.data(), ha.size() * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), hb.size() * sizeof(T), cudaMemcpyHostToDevice);
    auto *kern = wmma_gemm_kernel<M, N, K, T, LA, LB, TC>;
    TS_LAUNCH(kern, dim3(n / N, m / M), 32, 0, 0, (const T *)da, (const T *)db, dc, k, lda, ldb, ldc, store_col);
    std::vector<TC> hc(c_elems);
    cudaMemcpy(hc.data(), dc, c_elems * sizeof(TC), cudaMemcpyDeviceToHost);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    int bad = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            /* the emulator's order: per K tile, acc = C; acc += a * b for k ascending; round to TC */
            float acc = 0.0f;
            for (int p0 = 0; p0 < k; p0 += K) {
                float t = acc;
                for (int p = p0; p < p0 + K; p++) t += A(i, p) * B(p, j);
                acc = (float)to_f_acc(from_f<TC>(t));
            }
            float want = (float)to_f_acc(from_f<TC>(2.0f * acc));
            float got = (float)to_f_acc(hc[store_col ? (size_t)j * ldc + i : (size_t)i * ldc + j]);
            if (fabsf(got - want) > 1e-5f * (1.0f + fabsf(want)) && bad++ < 3)
                fprintf(stderr, "    %dx%dx%d a_%s b_%s store_%s: C[%d][%d] = %g, want %g\n", M, N, K,
                        a_row ? "row" : "col", b_row ? "row" : "col", store_col ? "col" : "row", i, j, got, want);
        }
    return bad;
}

template <int M, int N, int K, typename T> static int all_layouts()
{
    int bad = 0;
    for (int sc = 0; sc < 2; sc++) {
        bad += check_case<M, N, K, T, wmma::row_major, wmma::row_major, float>(sc);
        bad += check_case<M, N, K, T, wmma::row_major, wmma::col_major, float>(sc);
        bad += check_case<M, N, K, T, wmma::col_major, wmma::row_major, float>(sc);
        bad += check_case<M, N, K, T, wmma::col_major, wmma::col_major, float>(sc);
    }
    return bad;
}

static void test_wmma_16x16x16(void)
{
    {
        int bad = all_layouts<16, 16, 16, __half>();
        CHECK(bad == 0, "half: %d wrong elements", bad);
    }
    {
        int bad = all_layouts<16, 16, 16, __nv_bfloat16>();
        CHECK(bad == 0, "bf16: %d wrong elements", bad);
    }
    int bad = check_case<16, 16, 16, __half, wmma::row_major, wmma::col_major, __half>(0) +
              check_case<16, 16, 16, __half, wmma::col_major, wmma::row_major, __half>(1);
    CHECK(bad == 0, "half accumulator");
}

static void test_wmma_32x8x16(void)
{
    {
        int bad = all_layouts<32, 8, 16, __half>();
        CHECK(bad == 0, "half: %d wrong elements", bad);
    }
    {
        int bad = all_layouts<32, 8, 16, __nv_bfloat16>();
        CHECK(bad == 0, "bf16: %d wrong elements", bad);
    }
}

static void test_wmma_8x32x16(void)
{
    {
        int bad = all_layouts<8, 32, 16, __half>();
        CHECK(bad == 0, "half: %d wrong elements", bad);
    }
    {
        int bad = all_layouts<8, 32, 16, __nv_bfloat16>();
        CHECK(bad == 0, "bf16: %d wrong elements", bad);
    }
}

/* ---- CUDA's element counts, and one type's fragment read as another's ---------------------- */

/* mma.h's counts: __half inputs hold 16 elements per lane at every shape (copies where the
 * matrix has fewer per lane), __nv_bfloat16 inputs and accumulators the matrix once. */
template <typename Use, int M, int N, int K, typename T> static constexpr int elems()
{
    return wmma::fragment<Use, M, N, K, T, typename std::conditional<std::is_same<Use, wmma::accumulator>::value, void,
                                                                      wmma::row_major>::type>::num_elements;
}
static_assert(elems<wmma::matrix_a, 16, 16, 16, __half>() == 16 && elems<wmma::matrix_b, 16, 16, 16, __half>() == 16,
              "16x16x16 half");
static_assert(elems<wmma::matrix_a, 16, 16, 16, __nv_bfloat16>() == 8 &&
                  elems<wmma::matrix_b, 16, 16, 16, __nv_bfloat16>() == 8,
              "16x16x16 bf16");
static_assert(elems<wmma::matrix_a, 32, 8, 16, __half>() == 16 && elems<wmma::matrix_b, 32, 8, 16, __half>() == 16 &&
                  elems<wmma::matrix_a, 32, 8, 16, __nv_bfloat16>() == 16 &&
                  elems<wmma::matrix_b, 32, 8, 16, __nv_bfloat16>() == 4,
              "32x8x16");
static_assert(elems<wmma::matrix_a, 8, 32, 16, __half>() == 16 && elems<wmma::matrix_b, 8, 32, 16, __half>() == 16 &&
                  elems<wmma::matrix_a, 8, 32, 16, __nv_bfloat16>() == 4 &&
                  elems<wmma::matrix_b, 8, 32, 16, __nv_bfloat16>() == 16,
              "8x32x16");
static_assert(elems<wmma::accumulator, 16, 16, 16, float>() == 8 && elems<wmma::accumulator, 16, 16, 16, __half>() == 8 &&
                  elems<wmma::accumulator, 32, 8, 16, float>() == 8 && elems<wmma::accumulator, 8, 32, 16, float>() == 8,
              "accumulators");

/* C = A B for a 16x16 BF16 A and the identity B; PUN: A's fragment loaded as __half and
 * its first num_elements bits copied into the BF16 fragment (layout-dependent, wrong). */
template <bool PUN> __global__ void wmma_pun_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *eye, float *c)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (PUN) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> h;
        wmma::load_matrix_sync(h, reinterpret_cast<const __half *>(a), 16);
        for (int i = 0; i < fa.num_elements; i++) fa.x[i] = __ushort_as_bfloat16(__half_as_ushort(h.x[i]));
    } else {
        wmma::load_matrix_sync(fa, a, 16);
    }
    wmma::load_matrix_sync(fb, eye, 16);
    wmma::fill_fragment(acc, 0.0f);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

/* How many of A I's 256 elements come back as A's. */
template <bool PUN> static int pun_matches(void)
{
    std::vector<__nv_bfloat16> ha(256), he(256);
    for (int i = 0; i < 256; i++) {
        ha[i] = from_f<__nv_bfloat16>((float)(i % 61 - 30));
        he[i] = from_f<__nv_bfloat16>(i / 16 == i % 16 ? 1.0f : 0.0f);
    }
    __nv_bfloat16 *da, *de;
    float *dc;
    cudaMalloc((void **)&da, 256 * sizeof(__nv_bfloat16));
    cudaMalloc((void **)&de, 256 * sizeof(__nv_bfloat16));
    cudaMalloc((void **)&dc, 256 * sizeof(float));
    cudaMemcpy(da, ha.data(), 256 * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
    cudaMemcpy(de, he.data(), 256 * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
    TS_LAUNCH(wmma_pun_kernel<PUN>, 1, 32, 0, 0, (const __nv_bfloat16 *)da, (const __nv_bfloat16 *)de, dc);
    std::vector<float> hc(256);
    cudaMemcpy(hc.data(), dc, 256 * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(da);
    cudaFree(de);
    cudaFree(dc);
    int same = 0;
    for (int i = 0; i < 256; i++) same += hc[i] == to_f(ha[i]);
    return same;
}

/* A BF16 fragment filled from an F16 fragment's bits is not the BF16 load (on a GPU the
 * correspondence is unspecified; here the counts differ, 16 vs 8 per lane), so a kernel
 * relying on it fails its tests under the emulator instead of only on a GPU. */
static void test_wmma_types_do_not_pun(void)
{
    CHECK(pun_matches<false>() == 256, "the BF16 load itself");
    int same = pun_matches<true>();
    CHECK(same < 256, "an F16 load's bits read as a BF16 fragment gave A exactly");
}

/* ---- what must abort ------------------------------------------------------------------------ */

__global__ void wmma_misaligned_kernel(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> f;
    wmma::load_matrix_sync(f, a + 8, 32); /* planted bug: 16 bytes off a 32-byte boundary */
}

__global__ void wmma_bad_ldm_kernel(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> f;
    wmma::load_matrix_sync(f, a, 20); /* planted bug: ldm not a multiple of 8 halves */
}

__global__ void wmma_partial_warp_kernel(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> f;
    wmma::load_matrix_sync(f, a, 16); /* planted bug: launched with 16 threads */
}

__global__ void wmma_divergent_kernel(const __half *a, float *c)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, a, 16);
    if (threadIdx.x != 7) wmma::mma_sync(acc, fa, fb, acc); /* planted bug: lane 7 skips it */
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

static emu_child run_wmma_bad(void (*kernel)(const __half *), int threads)
{
    return emu_run_child([kernel, threads] {
        __half *a;
        cudaMalloc((void **)&a, 4096 * sizeof(__half));
        TS_LAUNCH(kernel, 1, threads, 0, 0, (const __half *)a);
        cudaDeviceSynchronize();
    });
}

static void test_wmma_rules_abort(void)
{
    emu_child r = run_wmma_bad(wmma_misaligned_kernel, 32);
    CHECK(emu_died_by_abort(r) && emu_err_has(r, "not 256-bit (32-byte) aligned"), "misaligned pointer");
    CHECK(emu_err_has(r, "wmma::load_matrix_sync at") && emu_err_has(r, "test_emu_wmma.cu"), "call site");
    r = run_wmma_bad(wmma_bad_ldm_kernel, 32);
    CHECK(emu_died_by_abort(r) && emu_err_has(r, "ldm 20 is not a multiple of 16 bytes"), "bad ldm");
    r = run_wmma_bad(wmma_partial_warp_kernel, 16);
    CHECK(emu_died_by_abort(r) && emu_err_has(r, "names lanes that do not exist"), "partial warp");
    r = emu_run_child([] {
        __half *a;
        float *c;
        cudaMalloc((void **)&a, 4096 * sizeof(__half));
        cudaMalloc((void **)&c, 4096 * sizeof(float));
        TS_LAUNCH(wmma_divergent_kernel, 1, 32, 0, 0, (const __half *)a, c);
        cudaDeviceSynchronize();
    });
    CHECK(emu_died_by_abort(r), "divergent mma did not abort (signal %d, exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "wmma::mma_sync"), "op name");
    CHECK(emu_err_has(r, "lane 7"), "the missing lane");
}

int main(void)
{
    RUN(test_wmma_16x16x16);
    RUN(test_wmma_32x8x16);
    RUN(test_wmma_8x32x16);
    RUN(test_wmma_types_do_not_pun);
    RUN(test_wmma_rules_abort);
    return test_summary();
}
