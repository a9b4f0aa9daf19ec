/* skinny_gemm.cu — y = x W^T for F16/BF16 weights and 1..16 activation rows, on the tensor
 * cores. Contract in kernels/skinny_gemm.h; CPU twin cpu_matmul_ref (src/backend/cpu/quant.h).
 *
 * Math: per 16 columns, two mma.sync m16n8k16 products (ts_mma_16816, common.cuh): A = 16
 * rows of W (row-major), B = x^T for tokens 0..7 and 8..15 (the rows past num_tokens
 * zero), F32 accumulators; every product of two 16-bit values is exact in F32, so only the
 * order of the F32 sum differs from the twin's. Not wmma: nvcc lowers BF16 wmma loads to
 * generic 32-bit loads, where ldmatrix serves both types (docs/kernels.md).
 *
 * Parallelisation: memory-bound like the GEMV (the weights are read once; the tensor cores
 * are nearly idle). One CTA of 8 warps per 16 output rows (n_out / 16 CTAs: 224 for a
 * 3584-row matrix, several per SM); the row length is split over the warps in chunks of 64
 * columns, warp w taking chunks w, w + 8, w + 16, ..., so the CTA reads each row in
 * contiguous 1 KiB runs. Per chunk a warp loads 16 rows x 64 columns of W (2 KiB: 8 lanes
 * per 128-byte row segment, 4 16-byte loads per lane) and the chunk's num_tokens x 64
 * activations (read through the read-only path: they stay in L1/L2), two chunks before
 * either is used (SK_UNROLL) so 16 loads per lane are in flight, and stages them in its
 * own shared-memory tiles; the tensor cores then take them with ldmatrix (pitch 72
 * elements = 144 bytes, so the 8 rows of each 8x8 matrix fall in distinct banks). Warps
 * never wait for each other in the loop (__syncwarp only). At the end each warp stores its
 * 16 x 16 accumulator into its W tile, and after one __syncthreads thread (r, t) adds the
 * 8 warps' values in a fixed order (deterministic) and stores row r, token t.
 */
#include "kernels/common.cuh"
#include "kernels/rowwise.cuh"

#include "kernels/dense_gemv.h"
#include "kernels/skinny_gemm.h"

#define SK_THREADS 256
#define SK_WARPS (SK_THREADS / 32)
#define SK_ROWS 16               /* output rows per CTA: the MMA M */
#define SK_TOKENS 16             /* token rows of B: two MMAs of N = 8 (num_tokens <= 16, the rest zero) */
#define SK_K 64                  /* columns per warp chunk: 4 MMA K steps, 8 chunks of 16 bytes */
#define SK_PITCH (SK_K + 8)      /* 16-bit elements per staged row: 144 bytes */
#define SK_UNROLL 2              /* chunks loaded before either is used */
#define SK_LOADS (SK_ROWS * SK_K / 8 / 32) /* 16-byte W loads per lane per chunk (4) */

/* One warp's staging tiles: W rows and activation rows of the current chunk, as 16-byte
 * chunks of 16-bit elements (read as T by the fragment loads). */
struct alignas(32) sk_tiles {
    alignas(32) uint4 w[SK_ROWS][SK_PITCH / 8];
    alignas(32) uint4 x[SK_TOKENS][SK_PITCH / 8];
};
struct alignas(128) sk_smem {
    sk_tiles warp[SK_WARPS];
};
static_assert(sizeof(float) * SK_ROWS * SK_TOKENS <= sizeof(sk_tiles::w), "the epilogue reuses w");

/* A lane's 16-byte chunks of the SK_UNROLL chunks j0, j0 + SK_WARPS, ... of rows 0..nrows-1
 * of m ([rows][nc] chunks); zero past them. RO: through the read-only path (weights only:
 * with pdl the previous kernel writes x while this one has started). SILU (weights of the
 * fused SiLU kernel): rows 8..15 are rows 0..7 of hi, the up rows, and nrows counts the
 * row pairs. */
template <bool RO, bool SILU = false>
__device__ __forceinline__ void sk_load(uint4 (&v)[SK_UNROLL][SK_LOADS], const uint4 *m, int nrows, int64_t nc,
                                        int64_t j0, int cl, int lane, const uint4 *hi = nullptr)
{
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < SK_UNROLL; u++) {
        const int64_t c = (j0 + SK_WARPS * u) * (SK_K / 8) + cl;
#pragma unroll
        for (int i = 0; i < SK_LOADS; i++) {
            const int r = (lane >> 3) + 4 * i;
            const uint4 *p = SILU && r >= SK_ROWS / 2 ? hi + (r - SK_ROWS / 2) * nc : m + r * nc;
            v[u][i] = c < nc && (SILU ? r % (SK_ROWS / 2) : r) < nrows ? (RO ? __ldg(p + c) : p[c]) : zero;
        }
    }
}

/* SILU = false: y[t][row0 + r] for the CTA's SK_ROWS consecutive rows. SILU = true
 * (cuda_skinny_gemm_silu): w is a fused gate | up matrix of 2 n_out rows; the CTA's 16
 * rows are gate rows g0..g0+7 and their up rows n_out + g0.., each summed exactly as the
 * plain kernel sums it, and thread (r, t) of the first half writes
 * act[t][g0 + r] = silu(gate) * up in act_dtype (nothing to y). */
template <typename T, bool SILU>
__global__ void __launch_bounds__(SK_THREADS)
skinny_gemm_kernel(const uint4 *__restrict__ w, // [n_out (SILU: 2 n_out)][nc] chunks of 8 elements
                   const uint4 *x,              // [nt][nc]: written by the previous kernel (pdl)
                   int64_t nc, int64_t n_out, int nt,
                   float *__restrict__ y, int64_t ldy,    // !SILU: [nt][ldy] F32
                   void *__restrict__ act, int act_dtype) // SILU: [nt][n_out] of act_dtype
{
    TS_SHARED(sk_smem, sm, );
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int OUT_ROWS = SILU ? SK_ROWS / 2 : SK_ROWS; /* output columns per CTA */
    const int64_t row0 = (int64_t)blockIdx.x * OUT_ROWS;
    const int nr = n_out - row0 < OUT_ROWS ? (int)(n_out - row0) : OUT_ROWS;
    const int64_t nchunks = (nc + SK_K / 8 - 1) / (SK_K / 8);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const uint4 *wlo = w + row0 * nc, *whi = SILU ? w + (n_out + row0) * nc : nullptr;
    sk_tiles &tl = sm.warp[warp];
    const T *tw = reinterpret_cast<const T *>(&tl.w[0][0]), *tx = reinterpret_cast<const T *>(&tl.x[0][0]);

    /* the token rows past nt stay zero: B's padding */
    for (int i = lane; i < SK_TOKENS * SK_PITCH / 8; i += 32) (&tl.x[0][0])[i] = zero;
    __syncwarp();

    /* D = W x^T for tokens 0..7 (acc[0]) and 8..15 (acc[1]): two m16n8k16 products per 16
     * columns, in the layouts of common.cuh; each lane's ldmatrix rows: A (W) row la_r,
     * column la_c, B (x, its rows the tokens) row lb_r, column lb_c */
    float acc[2][4] = { { 0.0f, 0.0f, 0.0f, 0.0f }, { 0.0f, 0.0f, 0.0f, 0.0f } };
    const int la_r = lane & 15, la_c = 8 * (lane >> 4);
    const int lb_r = (lane & 7) + 8 * (lane >> 4), lb_c = 8 * ((lane >> 3) & 1);
    /* lane's i-th load of a chunk: row (lane + 32 i) / 8, 16-byte column (lane % 8). The
     * first chunks' weights are loaded before waiting for the previous kernel (a pdl launch:
     * the weights are no kernel's output), the activations after; the next chunks' both at
     * the end of each pass. */
    const int cl = lane & 7;
    uint4 wv[SK_UNROLL][SK_LOADS], xv[SK_UNROLL][SK_LOADS];
    sk_load<true, SILU>(wv, wlo, nr, nc, warp, cl, lane, whi);
    ts_pdl_launch_dependents();
    ts_pdl_wait();
    sk_load<false>(xv, x, nt, nc, warp, cl, lane);
    for (int64_t j0 = warp; j0 < nchunks; j0 += SK_WARPS * SK_UNROLL) {
#pragma unroll
        for (int u = 0; u < SK_UNROLL; u++) {
            if (j0 + SK_WARPS * u >= nchunks) break; /* warp-uniform */
#pragma unroll
            for (int i = 0; i < SK_LOADS; i++) {
                const int r = (lane >> 3) + 4 * i;
                tl.w[r][cl] = wv[u][i];
                if (r < nt) tl.x[r][cl] = xv[u][i];
            }
            __syncwarp();
#pragma unroll
            for (int k = 0; k < SK_K / 16; k++) {
                uint32_t a[4], b[4];
                ts_ldmatrix_x4(a, tw + la_r * SK_PITCH + 16 * k + la_c);
                ts_ldmatrix_x4(b, tx + lb_r * SK_PITCH + 16 * k + lb_c);
                ts_mma_16816<T>(acc[0], a, b[0], b[1]);
                ts_mma_16816<T>(acc[1], a, b[2], b[3]);
            }
            __syncwarp(); /* the tiles are rewritten by the next chunk */
        }
        sk_load<true, SILU>(wv, wlo, nr, nc, j0 + SK_WARPS * SK_UNROLL, cl, lane, whi);
        sk_load<false>(xv, x, nt, nc, j0 + SK_WARPS * SK_UNROLL, cl, lane);
    }
    /* each warp's 16 x 16 sums (row-major: row r, token t), then the 8 warps' in order */
    float *part = reinterpret_cast<float *>(&tl.w[0][0]);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r, c;
            ts_mma_d_at(lane, j, r, c);
            part[r * SK_TOKENS + 8 * h + c] = acc[h][j];
        }
    __syncthreads();
    const int r = tid / SK_TOKENS, t = tid % SK_TOKENS;
    /* the sum of output (row q, token t) of the 8 warps, in a fixed order */
    auto sum = [&](int q) {
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < SK_WARPS; i++) v += reinterpret_cast<const float *>(&sm.warp[i].w[0][0])[q * SK_TOKENS + t];
        return v;
    };
    if (r < nr && t < nt) {
        if constexpr (SILU) /* r < nr <= 8: gate row r; its up row is r + 8 */
            ts_store1(act, act_dtype, t * n_out + row0 + r, ts_silu_mul(sum(r), sum(r + SK_ROWS / 2)));
        else
            y[t * ldy + row0 + r] = sum(r);
    }
}

static_assert(SK_THREADS == SK_ROWS * SK_TOKENS, "one thread per output of the epilogue");

/* One launch of skinny_gemm_kernel<T, SILU>: n_out / 16 CTAs (SILU: n_out / 8). */
template <typename T, bool SILU>
static int launch_skinny(const void *w, int64_t n_in, int64_t n_out, const void *x, float *y, int64_t ldy, void *act,
                         int act_dtype, int nt, int pdl, cudaStream_t stream)
{
    auto k = skinny_gemm_kernel<T, SILU>;
    TS_LAUNCH_PDL(k, ts_div_up((size_t)n_out, SILU ? SK_ROWS / 2 : SK_ROWS), SK_THREADS, 0, stream, pdl,
                  static_cast<const uint4 *>(w), static_cast<const uint4 *>(x), n_in / 8, n_out, nt, y, ldy, act,
                  act_dtype);
    return TS_LAUNCH_RESULT();
}

extern "C" int cuda_skinny_gemm(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *x, float *y,
                                int64_t ldy, int num_tokens, int pdl, cudaStream_t stream)
{
    if (!dense_linear_args_ok(type, w, n_in, n_out, x, y, ldy, num_tokens, SKINNY_GEMM_MAX_TOKENS))
        return (int)cudaErrorInvalidValue;
    if (n_out == 0) return 0;
    if (type == DT_BF16)
        return launch_skinny<__nv_bfloat16, false>(w, n_in, n_out, x, y, ldy, NULL, DT_F32, num_tokens, pdl, stream);
    return launch_skinny<__half, false>(w, n_in, n_out, x, y, ldy, NULL, DT_F32, num_tokens, pdl, stream);
}

extern "C" int cuda_skinny_gemm_silu(enum dtype type, const void *w, int64_t n_in, int64_t ffn, const void *x,
                                     void *act, enum dtype act_dtype, int num_tokens, int pdl, cudaStream_t stream)
{
    if (!dense_silu_args_ok(type, w, n_in, ffn, x, act, act_dtype, num_tokens, SKINNY_GEMM_MAX_TOKENS))
        return (int)cudaErrorInvalidValue;
    if (ffn == 0) return 0;
    if (type == DT_BF16)
        return launch_skinny<__nv_bfloat16, true>(w, n_in, ffn, x, NULL, 0, act, act_dtype, num_tokens, pdl, stream);
    return launch_skinny<__half, true>(w, n_in, ffn, x, NULL, 0, act, act_dtype, num_tokens, pdl, stream);
}
