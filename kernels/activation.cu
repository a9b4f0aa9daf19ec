/* activation.cu — SiLU·mul, the MLP's gate activation. Contract in kernels/activation.h;
 * CPU twin cpu_silu_mul_rows (src/backend/cpu/ops_fused.c).
 *
 * Math: out[t][i] = gate[t][i] / (1 + exp(-gate[t][i])) * up[t][i], in F32, rounded once to
 * the activation dtype (F32 / F16 / BF16).
 *
 * Parallelisation: purely elementwise and memory-bound (8 bytes read, 2-4 written per
 * element). Grid (num_tokens, chunks of the row); a CTA of 256 threads covers 2048
 * elements of one row, each thread two float4 of gate and two of up, all four 16-byte
 * loads issued before any use, then one 16-byte (F32) or 8-byte (F16/BF16) store per
 * float4. The token index comes from blockIdx.x, so no thread divides by the row length.
 * Rows that break the fast path's alignment (ffn or in_stride not a multiple of 4) run
 * the same grid with scalar accesses.
 * With qact (F32 out, ffn % 32 == 0, the fast path) each CTA also quantizes its outputs for
 * the quantized GEMV of the down projection, as cuda_quantize_act would from out
 * (qact_block, quant.cuh): the 8 lanes holding a block of 32 elements reduce it together.
 */
#include "kernels/common.cuh"
#include "kernels/quant.cuh"
#include "kernels/rowwise.cuh"

#include "kernels/activation.h"
#include "kernels/quant_matmul.h"

#define SILU_THREADS 256
#define SILU_VPT 2 /* float4 of gate (and of up) per thread */
#define SILU_CHUNK (SILU_THREADS * SILU_VPT * 4) /* elements of a row per CTA */

template <typename OutT>
__global__ void __launch_bounds__(SILU_THREADS)
silu_mul_rows_kernel(OutT *__restrict__ out,        // [num_tokens][ffn]
                     const float *__restrict__ gate, // [num_tokens][in_stride]
                     const float *__restrict__ up,   // [num_tokens][in_stride]
                     int64_t in_stride, int ffn,
                     int8_t *__restrict__ qq,        // qact's codes [num_tokens][ffn], or NULL
                     float2 *__restrict__ qds)       // qact's [num_tokens][ffn / 32] (d, code sum)
{
    ts_pdl_begin();
    const int64_t t = blockIdx.x;
    const int nvec = ffn >> 2;
    const float4 *g4 = reinterpret_cast<const float4 *>(gate + t * in_stride);
    const float4 *u4 = reinterpret_cast<const float4 *>(up + t * in_stride);
    const int i0 = blockIdx.y * (SILU_THREADS * SILU_VPT) + threadIdx.x;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 g[SILU_VPT], u[SILU_VPT];
#pragma unroll
    for (int j = 0; j < SILU_VPT; j++) {
        int i = i0 + j * SILU_THREADS;
        g[j] = i < nvec ? g4[i] : zero;
        u[j] = i < nvec ? u4[i] : zero;
    }
#pragma unroll
    for (int j = 0; j < SILU_VPT; j++) {
        int i = i0 + j * SILU_THREADS;
        /* every thread computes o (zeros past the row): the quantization below is warp-wide */
        const float4 o = make_float4(ts_silu_mul(g[j].x, u[j].x), ts_silu_mul(g[j].y, u[j].y),
                                     ts_silu_mul(g[j].z, u[j].z), ts_silu_mul(g[j].w, u[j].w));
        if (i < nvec) ts_store4(out + t * ffn + 4 * (int64_t)i, o);
        /* ffn % 32 == 0: a block's 8 lanes are all in the row or all past it */
        if (qq) qact_store4(o, i, i < nvec, qq + t * ffn, qds + t * (ffn >> 5));
    }
}

/* Scalar path, same grid: element i0 + 256 j of the CTA's chunk, j < 8. */
template <typename OutT>
__global__ void __launch_bounds__(SILU_THREADS)
silu_mul_rows_generic_kernel(OutT *__restrict__ out,        // [num_tokens][ffn]
                             const float *__restrict__ gate, // [num_tokens][in_stride]
                             const float *__restrict__ up,   // [num_tokens][in_stride]
                             int64_t in_stride, int ffn)
{
    ts_pdl_begin();
    const int64_t t = blockIdx.x;
    const int i0 = blockIdx.y * SILU_CHUNK + threadIdx.x;
#pragma unroll
    for (int j = 0; j < SILU_CHUNK / SILU_THREADS; j++) {
        int i = i0 + j * SILU_THREADS;
        if (i < ffn) out[t * ffn + i] = ts_from_float<OutT>(ts_silu_mul(gate[t * in_stride + i], up[t * in_stride + i]));
    }
}

/* The fast path's conditions (16-byte loads of gate and up, 4-element stores of out). */
static bool silu_fast(const void *out, size_t out_size, const float *gate, const float *up, int64_t in_stride, int ffn)
{
    return ffn % 4 == 0 && in_stride % 4 == 0 && ts_aligned(gate, 16) && ts_aligned(up, 16) &&
           ts_aligned(out, 4 * out_size);
}

template <typename OutT>
static int launch_silu_mul_rows(OutT *out, const float *gate, const float *up, int64_t in_stride, int num_tokens,
                                int ffn, int8_t *qq, float2 *qds, int pdl, cudaStream_t stream)
{
    const dim3 grid(num_tokens, ts_div_up(ffn, SILU_CHUNK));
    if (silu_fast(out, sizeof(OutT), gate, up, in_stride, ffn)) {
        auto k = silu_mul_rows_kernel<OutT>;
        TS_LAUNCH_PDL(k, grid, SILU_THREADS, 0, stream, pdl, out, gate, up, in_stride, ffn, qq, qds);
    } else { /* never with qact (the launcher checks) */
        auto k = silu_mul_rows_generic_kernel<OutT>;
        TS_LAUNCH_PDL(k, grid, SILU_THREADS, 0, stream, pdl, out, gate, up, in_stride, ffn);
    }
    return TS_LAUNCH_RESULT();
}

extern "C" int cuda_silu_mul_rows(void *out, enum dtype out_dtype, const float *gate, const float *up,
                                  int64_t in_stride, int num_tokens, int ffn, void *qact, int pdl,
                                  cudaStream_t stream)
{
    if (!out || !gate || !up || num_tokens < 0 || ffn < 0 || in_stride < ffn ||
        (qact && (out_dtype != DT_F32 || ffn % 32 != 0 || !ts_aligned(qact, 16) ||
                  !silu_fast(out, sizeof(float), gate, up, in_stride, ffn))))
        return (int)cudaErrorInvalidValue;
    if (num_tokens == 0 || ffn == 0) return 0;
    int8_t *qq = static_cast<int8_t *>(qact);
    float2 *qds = qact ? qact_ds(qact, ffn, num_tokens) : nullptr;
    switch (out_dtype) {
    case DT_F32: return launch_silu_mul_rows((float *)out, gate, up, in_stride, num_tokens, ffn, qq, qds, pdl, stream);
    case DT_F16:
        return launch_silu_mul_rows((__half *)out, gate, up, in_stride, num_tokens, ffn, nullptr, nullptr, pdl, stream);
    case DT_BF16:
        return launch_silu_mul_rows((__nv_bfloat16 *)out, gate, up, in_stride, num_tokens, ffn, nullptr, nullptr, pdl,
                                    stream);
    default: return (int)cudaErrorInvalidValue;
    }
}
