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
 *
 * cuda_dense_gemv_silu runs the same kernel (SILU = true) over the fused gate | up matrix
 * with each CTA's four rows taken as two gate rows and their two up rows (rows j and
 * ffn + j are one weight row apart in memory as any two rows are: each is its own 4 KiB
 * passes), so lane p * NT + t holds gate p and lane (p + 2) * NT + t its up row; one
 * shuffle brings them together and lanes p * NT + t write silu(gate) * up.
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
 * past the matrix (rows past nr, columns past nc). Row r is row0 + r; with SILU, rows 2
 * and 3 are hi0 and hi0 + 1 (the up rows) and nr counts the pairs. */
template <bool SILU>
__device__ __forceinline__ void gemv_load(uint4 (&wv)[GEMV_UNROLL][GEMV_ROWS], const uint4 *__restrict__ w,
                                          int64_t row0, int64_t hi0, int nr, int64_t nc, int64_t c0)
{
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int64_t c = c0 + GEMV_THREADS * u;
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            const int64_t row = SILU && r >= 2 ? hi0 + (r - 2) : row0 + r;
            wv[u][r] = c < nc && (SILU ? (r & 1) : r) < nr ? __ldg(w + row * nc + c) : zero;
        }
    }
}

/* SILU = false: y[t][row0 + r] for the CTA's GEMV_ROWS consecutive rows, row0 = 4 blockIdx.x.
 * SILU = true (cuda_dense_gemv_silu): w is a fused gate | up matrix of 2 n_out rows; the CTA
 * takes gate rows g0, g0 + 1 and their up rows n_out + g0, n_out + g0 + 1 (g0 = 2
 * blockIdx.x), sums each row exactly as the plain kernel does, and writes
 * act[t][g0 + p] = silu(gate) * up in act_dtype (nothing to y). */
template <int DT, int NT, bool SILU>
__global__ void __launch_bounds__(GEMV_THREADS)
dense_gemv_kernel(const uint4 *__restrict__ w, // [n_out (SILU: 2 n_out)][nc] chunks of 8 elements
                  const uint4 *x,              // [NT][nc]: written by the previous kernel (pdl)
                  int64_t nc, int64_t n_out,
                  float *__restrict__ y, int64_t ldy, // !SILU: [NT][ldy] F32
                  void *__restrict__ act, int act_dtype) // SILU: [NT][n_out] of act_dtype
{
    TS_SHARED(float, part, [GEMV_WARPS][GEMV_ROWS * NT]);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int OUT_ROWS = SILU ? GEMV_ROWS / 2 : GEMV_ROWS; /* output columns per CTA */
    const int64_t row0 = (int64_t)blockIdx.x * OUT_ROWS, hi0 = n_out + row0;
    const int nr = n_out - row0 < OUT_ROWS ? (int)(n_out - row0) : OUT_ROWS;
    float acc[GEMV_ROWS][NT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    /* The first columns' weights are loaded before waiting for the previous kernel (a pdl
     * launch: the weights are no kernel's output), the rest at the end of each pass. */
    uint4 wv[GEMV_UNROLL][GEMV_ROWS];
    gemv_load<SILU>(wv, w, row0, hi0, nr, nc, tid);
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
        gemv_load<SILU>(wv, w, row0, hi0, nr, nc, c0 + GEMV_THREADS * GEMV_UNROLL);
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
    if (warp != 0) return;
    const int r = lane / NT, t = lane - r * NT; /* lane r * NT + t: row r, token t */
    float v = 0.0f;
    if (lane < GEMV_ROWS * NT)
#pragma unroll
        for (int i = 0; i < GEMV_WARPS; i++) v += part[i][lane];
    if constexpr (SILU) {
        /* gate row p (lane p * NT + t) meets its up row p + 2 (lane (p + 2) * NT + t) */
        const float up = __shfl_down_sync(0xffffffffu, v, 2 * NT);
        if (lane < 2 * NT && r < nr) ts_store1(act, act_dtype, t * n_out + row0 + r, ts_silu_mul(v, up));
    } else {
        if (lane < GEMV_ROWS * NT && r < nr) y[t * ldy + row0 + r] = v;
    }
}

/* One launch of dense_gemv_kernel<DT, NT, SILU>: n_out / GEMV_ROWS CTAs (SILU: n_out / 2). */
template <int DT, int NT, bool SILU>
static int launch_gemv(const void *w, int64_t n_in, int64_t n_out, const void *x, float *y, int64_t ldy, void *act,
                       int act_dtype, int pdl, cudaStream_t stream)
{
    auto k = dense_gemv_kernel<DT, NT, SILU>;
    TS_LAUNCH_PDL(k, ts_div_up((size_t)n_out, SILU ? GEMV_ROWS / 2 : GEMV_ROWS), GEMV_THREADS, 0, stream, pdl,
                  static_cast<const uint4 *>(w), static_cast<const uint4 *>(x), n_in / 8, n_out, y, ldy, act,
                  act_dtype);
    return TS_LAUNCH_RESULT();
}

template <int DT, bool SILU>
static int dispatch_tokens(const void *w, int64_t n_in, int64_t n_out, const void *x, float *y, int64_t ldy,
                           void *act, int act_dtype, int T, int pdl, cudaStream_t stream)
{
    switch (T) {
    case 1: return launch_gemv<DT, 1, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    case 2: return launch_gemv<DT, 2, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    case 3: return launch_gemv<DT, 3, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    case 4: return launch_gemv<DT, 4, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    case 5: return launch_gemv<DT, 5, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    case 6: return launch_gemv<DT, 6, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    case 7: return launch_gemv<DT, 7, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    default: return launch_gemv<DT, 8, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, pdl, stream);
    }
}

template <bool SILU>
static int dispatch_type(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x, float *y,
                         int64_t ldy, void *act, int act_dtype, int T, int pdl, cudaStream_t stream)
{
    if (type == DT_BF16) return dispatch_tokens<DT_BF16, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, T, pdl, stream);
    return dispatch_tokens<DT_F16, SILU>(w, n_in, n_out, x, y, ldy, act, act_dtype, T, pdl, stream);
}

extern "C" int cuda_dense_gemv(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x, float *y,
                               int64_t ldy, int num_tokens, int pdl, cudaStream_t stream)
{
    if (!dense_linear_args_ok(type, w, n_in, n_out, x, y, ldy, num_tokens, DENSE_GEMV_MAX_TOKENS))
        return (int)cudaErrorInvalidValue;
    if (n_out == 0) return 0;
    return dispatch_type<false>(type, w, n_in, n_out, x, y, ldy, NULL, DT_F32, num_tokens, pdl, stream);
}

extern "C" int cuda_dense_gemv_silu(enum dtype type, const void *w, int64_t n_in, int64_t ffn, const void *x,
                                    void *act, enum dtype act_dtype, int num_tokens, int pdl, cudaStream_t stream)
{
    if (!dense_silu_args_ok(type, w, n_in, ffn, x, act, act_dtype, num_tokens, DENSE_GEMV_MAX_TOKENS))
        return (int)cudaErrorInvalidValue;
    if (ffn == 0) return 0;
    return dispatch_type<true>(type, w, n_in, ffn, x, NULL, 0, act, (int)act_dtype, num_tokens, pdl, stream);
}
