/* embedding.cu — the embedding gather: out[t][:] = F32 row token_ids[t] of the table (zeros
 * for an id outside [0, vocab)). Contract in kernels/embedding.h; CPU twin cpu_embedding
 * (src/backend/cpu/embedding.c, one quant_dequant_row per token).
 *
 * Memory-bound and small (num_tokens rows of dim elements), so the aim is only full-width
 * accesses and enough threads:
 *   F32 / F16 / BF16 tables: one thread per VEC elements of one output row (VEC = 4 F32 or
 *     8 16-bit elements: one 16-byte load, one or two 16-byte stores); a scalar variant
 *     when dim or the pointers do not allow the vectors.
 *   quantized tables: one warp per (token, chunk of 32 units): the chunk is staged into
 *     shared memory with aligned 16-byte loads and each lane decodes its unit of 32
 *     weights (quant.cuh, bitwise the CPU's dequantization), written as 16-byte stores.
 * The id is read once per thread (a broadcast within the warp) and checked before any
 * table address is formed.
 */
#include "kernels/common.cuh"
#include "kernels/quant.cuh"

#include "kernels/embedding.h"

#define EMB_THREADS 256
#define EMB_WARPS 4

/* ---- float tables ------------------------------------------------------------------------ */

template <int DT> __device__ __forceinline__ float emb_elem(const void *table, int64_t i)
{
    if constexpr (DT == DT_F32) return static_cast<const float *>(table)[i];
    const unsigned short h = static_cast<const unsigned short *>(table)[i];
    if constexpr (DT == DT_BF16) return __uint_as_float((unsigned)h << 16);
    return qs_f16(h);
}

/* Eight 16-bit elements (one 16-byte load) as floats. */
template <int DT> __device__ __forceinline__ void emb_elem8(const void *p, float (&v)[8])
{
    const uint4 raw = __ldg(static_cast<const uint4 *>(p));
    const uint32_t w[4] = { raw.x, raw.y, raw.z, raw.w };
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t h = (w[i >> 1] >> (16 * (i & 1))) & 0xffffu;
        v[i] = DT == DT_BF16 ? __uint_as_float(h << 16) : qs_f16(h);
    }
}

template <int DT, int VEC>
__global__ void __launch_bounds__(EMB_THREADS)
embedding_float_kernel(const void *__restrict__ table,     // [vocab][dim] of DT
                       int64_t vocab, int64_t dim,
                       const int32_t *__restrict__ ids,     // [num_tokens]
                       int num_tokens,
                       float *__restrict__ out)             // [num_tokens][dim]
{
    const int64_t per_row = dim / VEC;
    const int64_t i = (int64_t)blockIdx.x * EMB_THREADS + threadIdx.x;
    if (i >= per_row * num_tokens) return;
    const int64_t t = i / per_row, j = (i - t * per_row) * VEC;
    const int64_t id = ids[t];
    const bool ok = id >= 0 && id < vocab;
    float *o = out + t * dim + j;
    if constexpr (VEC == 1) {
        *o = ok ? emb_elem<DT>(table, id * dim + j) : 0.0f;
    } else if constexpr (DT == DT_F32) {
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *reinterpret_cast<float4 *>(o) = ok ? __ldg(reinterpret_cast<const float4 *>(static_cast<const float *>(table) + id * dim + j)) : z;
    } else {
        float v[8] = { 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f };
        if (ok) emb_elem8<DT>(static_cast<const unsigned short *>(table) + id * dim + j, v);
        reinterpret_cast<float4 *>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4 *>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

template <int DT, int VEC>
static int emb_float_launch(const void *table, int64_t vocab, int64_t dim, const int32_t *ids, int num_tokens,
                            float *out, cudaStream_t stream)
{
    auto *k = embedding_float_kernel<DT, VEC>;
    TS_LAUNCH(k, ts_div_up((size_t)(dim / VEC) * (size_t)num_tokens, EMB_THREADS), EMB_THREADS, 0, stream, table,
              vocab, dim, ids, num_tokens, out);
    return TS_LAUNCH_RESULT();
}

/* ---- quantized tables -------------------------------------------------------------------- */

template <int QT>
__global__ void __launch_bounds__(32 * EMB_WARPS)
embedding_quant_kernel(const uint8_t *__restrict__ table, // [vocab][row_bytes]
                       int64_t row_bytes, int64_t vocab, int dim,
                       const int32_t *__restrict__ ids,    // [num_tokens]
                       int num_tokens,
                       float *__restrict__ out)            // [num_tokens][dim]
{
    using Q = qtraits<QT>;
    constexpr int NWIN = Q::CHUNK_WINDOWS, KW = (NWIN + 31) / 32, GE = 4 * Q::NI;
    TS_SHARED(uint4, stage, [EMB_WARPS * Q::STAGE_ROW_BYTES / 16]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int units = dim / Q::BLOCK_ELEMS * Q::UNITS;
    const int nchunks = (units + 31) >> 5;
    const int64_t gw = (int64_t)blockIdx.x * EMB_WARPS + warp;
    if (gw >= (int64_t)num_tokens * nchunks) return; /* whole warps: no block barrier below */
    const int64_t t = gw / nchunks;
    const int c = (int)(gw - t * nchunks);
    const int u = c * 32 + lane;
    const int64_t id = ids[t];
    float f[32];
    if (id >= 0 && id < vocab) { /* warp-uniform */
        const int64_t cs = (int64_t)c * Q::CHUNK_BYTES;
        const uint8_t *p = table + id * row_bytes + cs;
        uint8_t *buf = reinterpret_cast<uint8_t *>(stage) + warp * Q::STAGE_ROW_BYTES;
        uint4 pre[KW];
        const unsigned valid = qstage_load<1, NWIN, KW>(
            pre, p, 0, 1, (int)(row_bytes - cs < Q::CHUNK_BYTES ? row_bytes - cs : Q::CHUNK_BYTES),
            table + vocab * row_bytes, lane);
        qstage_store<1, NWIN, KW>(pre, valid, buf, lane);
        __syncwarp();
        if (u >= units) return;
        qdecode_f32<QT>(buf, (int)((uintptr_t)p & 15) + (lane / Q::UNITS) * Q::BLOCK_BYTES, lane % Q::UNITS, f);
    } else {
        if (u >= units) return;
#pragma unroll
        for (int j = 0; j < 32; j++) f[j] = 0.0f;
    }
    float *o = out + t * dim;
#pragma unroll
    for (int g = 0; g < Q::NG; g++) {
        float4 *dst = reinterpret_cast<float4 *>(o + qunit_elem<QT>(u, g));
#pragma unroll
        for (int i = 0; i < GE / 4; i++)
            dst[i] = make_float4(f[g * GE + 4 * i], f[g * GE + 4 * i + 1], f[g * GE + 4 * i + 2], f[g * GE + 4 * i + 3]);
    }
}

template <int QT>
static int emb_quant_launch(const void *table, int64_t vocab, int64_t dim, const int32_t *ids, int num_tokens,
                            float *out, cudaStream_t stream)
{
    using Q = qtraits<QT>;
    if (dim % Q::BLOCK_ELEMS || dim > INT32_MAX / 2 || !q_aligned16(table) || !q_aligned16(out))
        return (int)cudaErrorInvalidValue;
    auto *k = embedding_quant_kernel<QT>;
    const int64_t nchunks = (dim / Q::BLOCK_ELEMS * Q::UNITS + 31) / 32;
    TS_LAUNCH(k, ts_div_up((size_t)nchunks * (size_t)num_tokens, EMB_WARPS), 32 * EMB_WARPS, 0, stream,
              static_cast<const uint8_t *>(table), dim / Q::BLOCK_ELEMS * Q::BLOCK_BYTES, vocab, (int)dim, ids,
              num_tokens, out);
    return TS_LAUNCH_RESULT();
}

int cuda_embedding(enum dtype type, const void *table, int64_t vocab, int64_t dim, const int32_t *token_ids,
                   int num_tokens, float *out, cudaStream_t stream)
{
    if (dim <= 0 || vocab < 0 || num_tokens < 0) return (int)cudaErrorInvalidValue;
    if (num_tokens == 0) return 0;
    /* vector paths: whole 16-byte pieces of every row, 16-byte aligned pointers */
    const bool v16 = q_aligned16(table) && q_aligned16(out);
    switch (type) {
    case DT_F32:
        if (v16 && dim % 4 == 0) return emb_float_launch<DT_F32, 4>(table, vocab, dim, token_ids, num_tokens, out, stream);
        return emb_float_launch<DT_F32, 1>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_F16:
        if (v16 && dim % 8 == 0) return emb_float_launch<DT_F16, 8>(table, vocab, dim, token_ids, num_tokens, out, stream);
        return emb_float_launch<DT_F16, 1>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_BF16:
        if (v16 && dim % 8 == 0) return emb_float_launch<DT_BF16, 8>(table, vocab, dim, token_ids, num_tokens, out, stream);
        return emb_float_launch<DT_BF16, 1>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_Q8_0: return emb_quant_launch<DT_Q8_0>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_Q4_0: return emb_quant_launch<DT_Q4_0>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_Q4_1: return emb_quant_launch<DT_Q4_1>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_Q5_0: return emb_quant_launch<DT_Q5_0>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_Q5_1: return emb_quant_launch<DT_Q5_1>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_Q4_K: return emb_quant_launch<DT_Q4_K>(table, vocab, dim, token_ids, num_tokens, out, stream);
    case DT_Q6_K: return emb_quant_launch<DT_Q6_K>(table, vocab, dim, token_ids, num_tokens, out, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}
