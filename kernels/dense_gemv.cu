/* dense_gemv.cu — y = x W^T for F16/BF16 weights and 1..8 activation rows. Contract in
 * kernels/dense_gemv.h; CPU twin cpu_matmul_ref (src/backend/cpu/quant.h).
 *
 * Math: each output is an F32 sum of the products of the widened 16-bit weight and
 * activation elements (F16 and BF16 widen exactly), as cuBLAS computes it with
 * CUBLAS_COMPUTE_32F; only the order of the sum differs.
 *
 * Parallelisation: memory-bound (every weight byte is read once per step and used for
 * num_tokens products). One CTA of 256 threads per GEMV_ROWS (4) output rows, the rows'
 * 16-byte chunks (8 elements) split over all its threads: thread i takes chunk columns
 * i + 256 j, so each row is read in coalesced 4 KiB passes, and a row of 3584 elements
 * (448 chunks) or of 18944 (2368) spreads over the whole CTA instead of one warp: every
 * shape gives thousands of CTAs with the same short work (a warp per row left long rows
 * to a few warps per SM, latency-bound: 57% of the copy bandwidth on an H200 for
 * 18944 x 3584, where cuBLAS reaches 81%). GEMV_UNROLL (2) columns of all four rows, 8
 * chunks per thread (32 KiB per CTA), are loaded before any is used; the column index is
 * guarded, so a row's last, partial pass keeps its loads in flight too. The activations
 * (a few rows of at most a few tens of KiB) stay in L1/L2, read with ordinary loads (not the
 * read-only path, which assumes data no one writes while the kernel runs: with pdl the
 * previous kernel writes x while this one has started);
 * each chunk of them is widened once and serves the four rows, so at 8 tokens their L1
 * traffic is twice the weights' DRAM stream rather than eight times. The partial sums
 * (rows x tokens per thread) are reduced by butterfly shuffles within each warp, then
 * warp 0 adds the 8 warps' results from shared memory in a fixed order (deterministic) and
 * lane r * NT + t stores row r, token t.
 */
#include "kernels/common.cuh"
#include "kernels/quant.cuh"
#include "kernels/rowwise.cuh"

#include "kernels/dense_gemv.h"

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_ROWS 4   /* output rows per CTA: each activation chunk read serves all four */
#define GEMV_UNROLL 2 /* chunk columns whose GEMV_ROWS weight chunks are loaded before use */

/* element e (0..7) of a 16-byte chunk of 16-bit values, widened */
template <int DT> __device__ __forceinline__ float gemv_elem(const uint4 &c, int e)
{
    const uint32_t w = e < 2 ? c.x : e < 4 ? c.y : e < 6 ? c.z : c.w;
    const uint32_t h = (w >> (16 * (e & 1))) & 0xffffu;
    if constexpr (DT == DT_BF16) return __uint_as_float(h << 16);
    return qs_f16(h);
}

/* The GEMV_ROWS rows' chunks of the GEMV_UNROLL columns c0, c0 + GEMV_THREADS, ...; zero
 * past the matrix (rows past nr, columns past nc). */
__device__ __forceinline__ void gemv_load(uint4 (&wv)[GEMV_UNROLL][GEMV_ROWS], const uint4 *__restrict__ w,
                                          int64_t row0, int nr, int64_t nc, int64_t c0)
{
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int64_t c = c0 + GEMV_THREADS * u;
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) wv[u][r] = c < nc && r < nr ? __ldg(w + (row0 + r) * nc + c) : zero;
    }
}

template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_THREADS)
dense_gemv_kernel(const uint4 *__restrict__ w, // [n_out][nc] chunks of 8 elements
                  const uint4 *x,              // [NT][nc]: written by the previous kernel (pdl)
                  int64_t nc, int64_t n_out,
                  float *__restrict__ y, int64_t ldy)
{
    TS_SHARED(float, part, [GEMV_WARPS][GEMV_ROWS * NT]);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * GEMV_ROWS;
    const int nr = n_out - row0 < GEMV_ROWS ? (int)(n_out - row0) : GEMV_ROWS;
    float acc[GEMV_ROWS][NT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    /* The first columns' weights are loaded before waiting for the previous kernel (a pdl
     * launch: the weights are no kernel's output), the rest at the end of each pass. */
    uint4 wv[GEMV_UNROLL][GEMV_ROWS];
    gemv_load(wv, w, row0, nr, nc, tid);
    ts_pdl_launch_dependents();
    ts_pdl_wait();
    for (int64_t c0 = tid; c0 < nc; c0 += GEMV_THREADS * GEMV_UNROLL) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t c = c0 + GEMV_THREADS * u;
            if (c >= nc) continue;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const uint4 xc = x[t * nc + c];
                float xv[8];
#pragma unroll
                for (int e = 0; e < 8; e++) xv[e] = gemv_elem<DT>(xc, e);
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][t] = fmaf(gemv_elem<DT>(wv[u][r], e), xv[e], acc[r][t]);
            }
        }
        gemv_load(wv, w, row0, nr, nc, c0 + GEMV_THREADS * GEMV_UNROLL);
    }
    /* each warp's partial sums, then warp 0 adds the 8 warps' in a fixed order */
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r * NT + t] = v;
        }
    __syncthreads();
    if (warp == 0 && lane < GEMV_ROWS * NT) {
        const int r = lane / NT, t = lane - r * NT;
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < GEMV_WARPS; i++) v += part[i][lane];
        if (r < nr) y[t * ldy + row0 + r] = v;
    }
}

template <int DT, int NT>
static int launch_gemv(const void *w, int64_t n_in, int64_t n_out, const void *x, float *y, int64_t ldy,
                       int pdl, cudaStream_t stream)
{
    auto k = dense_gemv_kernel<DT, NT>;
    TS_LAUNCH_PDL(k, ts_div_up((size_t)n_out, GEMV_ROWS), GEMV_THREADS, 0, stream, pdl, static_cast<const uint4 *>(w),
              static_cast<const uint4 *>(x), n_in / 8, n_out, y, ldy);
    return TS_LAUNCH_RESULT();
}

template <int DT>
static int dispatch_tokens(const void *w, int64_t n_in, int64_t n_out, const void *x, float *y, int64_t ldy, int T,
                           int pdl, cudaStream_t stream)
{
    switch (T) {
    case 1: return launch_gemv<DT, 1>(w, n_in, n_out, x, y, ldy, pdl, stream);
    case 2: return launch_gemv<DT, 2>(w, n_in, n_out, x, y, ldy, pdl, stream);
    case 3: return launch_gemv<DT, 3>(w, n_in, n_out, x, y, ldy, pdl, stream);
    case 4: return launch_gemv<DT, 4>(w, n_in, n_out, x, y, ldy, pdl, stream);
    case 5: return launch_gemv<DT, 5>(w, n_in, n_out, x, y, ldy, pdl, stream);
    case 6: return launch_gemv<DT, 6>(w, n_in, n_out, x, y, ldy, pdl, stream);
    case 7: return launch_gemv<DT, 7>(w, n_in, n_out, x, y, ldy, pdl, stream);
    default: return launch_gemv<DT, 8>(w, n_in, n_out, x, y, ldy, pdl, stream);
    }
}

extern "C" int cuda_dense_gemv(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x, float *y,
                               int64_t ldy, int num_tokens, int pdl, cudaStream_t stream)
{
    if (!dense_linear_args_ok(type, w, n_in, n_out, x, y, ldy, num_tokens, DENSE_GEMV_MAX_TOKENS))
        return (int)cudaErrorInvalidValue;
    if (n_out == 0) return 0;
    if (type == DT_BF16) return dispatch_tokens<DT_BF16>(w, n_in, n_out, x, y, ldy, num_tokens, pdl, stream);
    return dispatch_tokens<DT_F16>(w, n_in, n_out, x, y, ldy, num_tokens, pdl, stream);
}
