/* norm.cu — RMSNorm fused with the residual add, and per-head RMSNorm (Qwen3 q/k norm).
 * Contracts in kernels/norm.h; CPU twins cpu_rmsnorm_residual / cpu_head_rmsnorm
 * (src/backend/cpu/ops_fused.c).
 *
 * rmsnorm_residual, per row r:
 *     x = residual[r] (+ delta[r], written back to residual[r])
 *     out[r] = x * (1 / sqrt(sum(x^2) / dim + eps)) * w        (F32 math, out rounded once)
 *   One CTA per row; the row lives in registers (VPT float4 per thread, VPT in {1, 2, 4}
 *   picked so the CTA has at most 512 threads: dim <= 8192), so residual and delta are read
 *   once and residual written once, all with coalesced 16-byte accesses; one block
 *   reduction (warp shuffles, then 32 floats of shared memory). Decode (1-8 rows) gets one
 *   wide CTA per row; prefill (thousands of rows) fills every SM with many CTAs. Shapes
 *   off the fast path (dim % 4 != 0, dim > 8192, unaligned pointers) run a generic kernel
 *   with scalar accesses that reads the row twice.
 *   With qact (F32 out, dim % 32 == 0) each CTA also quantizes its output row for the
 *   quantized GEMV, as cuda_quantize_act would from out (qact_block, quant.cuh: the same
 *   function): blocks of 32 over 8 lanes of 4 values (fast path) or a warp of 1 (generic).
 *
 * head_rmsnorm, per token t and head h (q heads with q_norm, then k heads with k_norm):
 *     x = qkv[t][h*head_dim ..]; x = x / sqrt(sum(x^2) / head_dim + eps) * w   (in place)
 *   One warp per (token, head), 4 per CTA; each lane holds head_dim/32 elements in
 *   registers (float2 or float4 loads), one warp-shuffle reduction, no shared memory.
 */
#include "kernels/common.cuh"
#include "kernels/quant.cuh"
#include "kernels/rowwise.cuh"

#include "kernels/norm.h"
#include "kernels/quant_matmul.h"

/* ---- RMSNorm + residual ------------------------------------------------------------------ */

#define RMS_MAX_THREADS 512
#define RMS_MAX_VPT 4
#define RMS_MAX_DIM (RMS_MAX_THREADS * RMS_MAX_VPT * 4)
#define RMS_GENERIC_THREADS 256

__device__ __forceinline__ float4 f4_add(float4 a, float4 b)
{
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* Fast path: VPT float4 of the row per thread, thread i holding float4 i + j * blockDim.x. */
template <typename OutT, int VPT>
__global__ void __launch_bounds__(RMS_MAX_THREADS)
rmsnorm_residual_kernel(OutT *__restrict__ out,             // [num_rows][dim]
                        float *__restrict__ residual,        // [num_rows][dim]
                        const float *__restrict__ delta,     // [num_rows][dim] or NULL
                        const float *__restrict__ w,         // [dim]
                        int dim, float eps,
                        const void *l2_p, uint64_t l2_bytes,  // l2_hint.h: issued once the inputs are ready
                        int8_t *__restrict__ qq,             // qact's codes [num_rows][dim], or NULL
                        float2 *__restrict__ qds)            // qact's [num_rows][dim / 32] (d, code sum)
{
    ts_pdl_begin();
    ts_l2_prefetch(l2_p, l2_bytes);
    TS_SHARED(float, red, [32]);
    const int64_t base = (int64_t)blockIdx.x * dim;
    const int nvec = dim >> 2;
    float4 *res = reinterpret_cast<float4 *>(residual + base);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    float4 x[VPT];
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = threadIdx.x + j * blockDim.x;
        x[j] = i < nvec ? res[i] : zero;
    }
    if (delta) {
        const float4 *del = reinterpret_cast<const float4 *>(delta + base);
        float4 d[VPT];
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = threadIdx.x + j * blockDim.x;
            d[j] = i < nvec ? del[i] : zero;
        }
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = threadIdx.x + j * blockDim.x;
            x[j] = f4_add(x[j], d[j]);
            if (i < nvec) res[i] = x[j];
        }
    }
    /* the weights do not depend on the sum: load them before the reduction's barriers */
    float4 wv[VPT];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < nvec ? w4[i] : zero;
        ss += x[j].x * x[j].x + x[j].y * x[j].y + x[j].z * x[j].z + x[j].w * x[j].w;
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = threadIdx.x + j * blockDim.x;
        /* every thread computes o (zeros past the row): the quantization below is warp-wide */
        const float4 o = make_float4(x[j].x * inv * wv[j].x, x[j].y * inv * wv[j].y, x[j].z * inv * wv[j].z,
                                     x[j].w * inv * wv[j].w);
        if (i < nvec) ts_store4(out + base + 4 * (int64_t)i, o);
        /* dim % 32 == 0: a block's 8 lanes are all in the row or all past it */
        if (qq) qact_store4(o, i, i < nvec, qq + base, qds + (base >> 5));
    }
}

/* Generic path: any dim, any alignment; scalar accesses, the row read twice (each thread
 * re-reads only the residual elements it wrote itself). */
template <typename OutT>
__global__ void __launch_bounds__(RMS_GENERIC_THREADS)
rmsnorm_residual_generic_kernel(OutT *__restrict__ out,         // [num_rows][dim]
                                float *__restrict__ residual,    // [num_rows][dim]
                                const float *__restrict__ delta, // [num_rows][dim] or NULL
                                const float *__restrict__ w,     // [dim]
                                int dim, float eps,
                                const void *l2_p, uint64_t l2_bytes,
                                int8_t *__restrict__ qq, float2 *__restrict__ qds) // as above
{
    ts_pdl_begin();
    ts_l2_prefetch(l2_p, l2_bytes);
    TS_SHARED(float, red, [32]);
    const int64_t base = (int64_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float x = residual[base + i];
        if (delta) {
            x += delta[base + i];
            residual[base + i] = x;
        }
        ss += x * x;
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    /* with qq, dim % 32 == 0 and blockDim.x % 32 == 0: a warp's 32 elements are one block */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float o = residual[base + i] * inv * w[i];
        out[base + i] = ts_from_float<OutT>(o);
        if (qq) {
            const float v[1] = { o };
            int c[1], sum;
            float d;
            qact_block<32>(v, c, d, sum);
            qq[base + i] = (int8_t)c[0];
            if ((i & 31) == 0) qds[(base + i) >> 5] = make_float2(d, (float)sum);
        }
    }
}

template <typename OutT>
static int launch_rmsnorm_residual(OutT *out, float *residual, const float *delta, const float *w,
                                   int num_rows, int dim, float eps, const void *l2_p, uint64_t l2_bytes,
                                   int8_t *qq, float2 *qds, int pdl, cudaStream_t stream)
{
    bool fast = dim % 4 == 0 && dim <= RMS_MAX_DIM && ts_aligned(residual, 16) &&
                (!delta || ts_aligned(delta, 16)) && ts_aligned(w, 16) && ts_aligned(out, 4 * sizeof(OutT));
    if (!fast) {
        auto k = rmsnorm_residual_generic_kernel<OutT>;
        TS_LAUNCH_PDL(k, num_rows, RMS_GENERIC_THREADS, 0, stream, pdl, out, residual, delta, w, dim, eps, l2_p,
                      l2_bytes, qq, qds);
        return TS_LAUNCH_RESULT();
    }
    int nvec = dim / 4;
    int vpt = nvec <= RMS_MAX_THREADS ? 1 : nvec <= 2 * RMS_MAX_THREADS ? 2 : 4;
    unsigned threads = ts_div_up(ts_div_up(nvec, vpt), 32) * 32;
    switch (vpt) {
    case 1: {
        auto k = rmsnorm_residual_kernel<OutT, 1>;
        TS_LAUNCH_PDL(k, num_rows, threads, 0, stream, pdl, out, residual, delta, w, dim, eps, l2_p,
                      l2_bytes, qq, qds);
        break;
    }
    case 2: {
        auto k = rmsnorm_residual_kernel<OutT, 2>;
        TS_LAUNCH_PDL(k, num_rows, threads, 0, stream, pdl, out, residual, delta, w, dim, eps, l2_p,
                      l2_bytes, qq, qds);
        break;
    }
    default: {
        auto k = rmsnorm_residual_kernel<OutT, RMS_MAX_VPT>;
        TS_LAUNCH_PDL(k, num_rows, threads, 0, stream, pdl, out, residual, delta, w, dim, eps, l2_p,
                      l2_bytes, qq, qds);
        break;
    }
    }
    return TS_LAUNCH_RESULT();
}

extern "C" int cuda_rmsnorm_residual(void *out, enum dtype out_dtype, float *residual, const float *delta,
                                     const float *w, int num_rows, int dim, float eps, const struct cuda_l2_hint *l2,
                                     void *qact, int pdl, cudaStream_t stream)
{
    const void *l2_p;
    uint64_t l2_n;
    if (num_rows < 0 || dim < 1 || !out || !residual || !w || !ts_l2_hint_args(l2, &l2_p, &l2_n) ||
        (qact && (out_dtype != DT_F32 || dim % 32 != 0 || !ts_aligned(qact, 16))))
        return (int)cudaErrorInvalidValue;
    if (num_rows == 0) return 0;
    int8_t *qq = static_cast<int8_t *>(qact);
    float2 *qds = qact ? qact_ds(qact, dim, num_rows) : nullptr;
    switch (out_dtype) {
    case DT_F32:
        return launch_rmsnorm_residual((float *)out, residual, delta, w, num_rows, dim, eps, l2_p, l2_n, qq, qds, pdl,
                                       stream);
    case DT_F16:
        return launch_rmsnorm_residual((__half *)out, residual, delta, w, num_rows, dim, eps, l2_p, l2_n, nullptr,
                                       nullptr, pdl, stream);
    case DT_BF16:
        return launch_rmsnorm_residual((__nv_bfloat16 *)out, residual, delta, w, num_rows, dim, eps, l2_p, l2_n,
                                       nullptr, nullptr, pdl, stream);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

/* ---- per-head RMSNorm -------------------------------------------------------------------- */

#define HEAD_NORM_WARPS 4

/* EPL = head_dim / 32 elements per lane: float2 at 2*lane (EPL 2), or EPL/4 float4 at
 * c*128 + 4*lane (each chunk of 128 elements one coalesced 512-byte warp access). */
template <int EPL> __device__ __forceinline__ void head_load(const float *p, int lane, float (&v)[EPL])
{
    if constexpr (EPL == 2) {
        float2 a = reinterpret_cast<const float2 *>(p)[lane];
        v[0] = a.x;
        v[1] = a.y;
    } else {
#pragma unroll
        for (int c = 0; c < EPL / 4; c++) {
            float4 a = reinterpret_cast<const float4 *>(p + c * 128)[lane];
            v[4 * c] = a.x;
            v[4 * c + 1] = a.y;
            v[4 * c + 2] = a.z;
            v[4 * c + 3] = a.w;
        }
    }
}

template <int EPL> __device__ __forceinline__ void head_store(float *p, int lane, const float (&v)[EPL])
{
    if constexpr (EPL == 2) {
        reinterpret_cast<float2 *>(p)[lane] = make_float2(v[0], v[1]);
    } else {
#pragma unroll
        for (int c = 0; c < EPL / 4; c++)
            reinterpret_cast<float4 *>(p + c * 128)[lane] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
    }
}

template <int EPL>
__global__ void __launch_bounds__(HEAD_NORM_WARPS * 32)
head_rmsnorm_kernel(float *__restrict__ qkv,          // [num_tokens][row_stride]
                    int64_t row_stride,
                    const float *__restrict__ q_norm, // [head_dim]
                    const float *__restrict__ k_norm, // [head_dim]
                    int num_tokens, int n_heads, int n_kv_heads, float eps)
{
    ts_pdl_begin();
    constexpr int HD = EPL * 32;
    const int lane = threadIdx.x & 31;
    const int heads = n_heads + n_kv_heads;
    const int64_t task = (int64_t)blockIdx.x * HEAD_NORM_WARPS + (threadIdx.x >> 5);
    if (task >= (int64_t)num_tokens * heads) return; /* whole warps leave together */
    const int64_t t = task / heads;
    const int h = (int)(task - t * heads);
    float *x = qkv + t * row_stride + (int64_t)h * HD;
    const float *w = h < n_heads ? q_norm : k_norm;

    float v[EPL], wv[EPL];
    head_load<EPL>(x, lane, v);
    head_load<EPL>(w, lane, wv);
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL; j++) ss += v[j] * v[j];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)HD + eps);
#pragma unroll
    for (int j = 0; j < EPL; j++) v[j] = v[j] * inv * wv[j];
    head_store<EPL>(x, lane, v);
}

extern "C" int cuda_head_rmsnorm(float *qkv, int64_t row_stride, const float *q_norm, const float *k_norm,
                                 int num_tokens, int n_heads, int n_kv_heads, int head_dim, float eps, int pdl,
                                 cudaStream_t stream)
{
    if (num_tokens < 0 || n_heads < 0 || n_kv_heads < 0 || !qkv || !q_norm || !k_norm)
        return (int)cudaErrorInvalidValue;
    if (row_stride % 4 != 0 || row_stride < (int64_t)(n_heads + n_kv_heads) * head_dim ||
        !ts_aligned(qkv, 16) || !ts_aligned(q_norm, 16) || !ts_aligned(k_norm, 16))
        return (int)cudaErrorInvalidValue;
    int64_t tasks = (int64_t)num_tokens * (n_heads + n_kv_heads);
    if (tasks == 0) return 0;
    unsigned grid = ts_div_up((size_t)tasks, HEAD_NORM_WARPS);
    switch (head_dim) {
    case 64: {
        auto k = head_rmsnorm_kernel<2>;
        TS_LAUNCH_PDL(k, grid, HEAD_NORM_WARPS * 32, 0, stream, pdl, qkv, row_stride, q_norm, k_norm, num_tokens,
                      n_heads, n_kv_heads, eps);
        break;
    }
    case 128: {
        auto k = head_rmsnorm_kernel<4>;
        TS_LAUNCH_PDL(k, grid, HEAD_NORM_WARPS * 32, 0, stream, pdl, qkv, row_stride, q_norm, k_norm, num_tokens,
                      n_heads, n_kv_heads, eps);
        break;
    }
    case 256: {
        auto k = head_rmsnorm_kernel<8>;
        TS_LAUNCH_PDL(k, grid, HEAD_NORM_WARPS * 32, 0, stream, pdl, qkv, row_stride, q_norm, k_norm, num_tokens,
                      n_heads, n_kv_heads, eps);
        break;
    }
    default:
        return (int)cudaErrorInvalidValue;
    }
    return TS_LAUNCH_RESULT();
}
