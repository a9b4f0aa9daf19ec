/* step.cu — the CUDA backend's glue around the forward pass. Contract in kernels/step.h;
 * CPU twins in tests/kernels/test_kernel_step.cu.
 *
 * step_unpack: one launch per step, before the forward (or its CUDA graph). Grid: the
 * first ts_div_up(max(pad_tokens, pad_logits), 256) CTAs handle one token row and one
 * logits row per thread (the one-step-lag tokens are read here, on the device, from the
 * previous step's sampling output, so the host never waits for them); then one CTA per
 * (padded) sequence writes its seq_len and query_start and copies its block-table row
 * from the packed CSR form into the fixed [pad_seqs][max_blocks_per_seq] table, 256
 * entries per pass. A few microseconds of work; it exists so that one H2D copy of a
 * compact buffer feeds fixed buffers whose addresses a CUDA graph has baked in.
 *
 * gather_rows / convert_f32: memory-bound elementwise copies, one thread per float4 (a
 * scalar path for odd sizes or unaligned pointers).
 */
#include "kernels/common.cuh"
#include "kernels/rowwise.cuh"

#include "kernels/step.h"

#define STEP_THREADS 256

__global__ void __launch_bounds__(STEP_THREADS) step_unpack_kernel(const struct step_unpack_args a, int row_ctas)
{
    if ((int)blockIdx.x < row_ctas) {
        const int i = blockIdx.x * STEP_THREADS + threadIdx.x;
        if (i < a.pad_tokens) {
            int32_t tok = 0, pos = 0;
            int64_t slot = -1;
            if (i < a.num_tokens) {
                tok = a.token_ids[i];
                if (tok < 0) {
                    int k = -1 - tok;
                    tok = k < a.prev_count ? a.prev_tokens[(int64_t)k * a.prev_stride] : -1;
                }
                pos = a.positions[i];
                slot = a.slot_mapping[i];
            }
            a.out_token_ids[i] = tok;
            a.out_positions[i] = pos;
            a.out_slot_mapping[i] = slot;
        }
        if (i < a.pad_logits) a.out_logits_indices[i] = i < a.num_logits ? a.logits_indices[i] : i;
        return;
    }
    /* one CTA per padded sequence */
    const int s = blockIdx.x - row_ctas;
    if (s == 0 && threadIdx.x == 0) a.out_query_start[0] = a.num_seqs ? a.query_start[0] : 0;
    if (s >= a.num_seqs) {
        if (threadIdx.x == 0) {
            a.out_seq_lens[s] = 0;
            int q = a.num_tokens + (s + 1 - a.num_seqs);
            a.out_query_start[s + 1] = q < a.pad_tokens ? q : a.pad_tokens;
        }
        return;
    }
    if (threadIdx.x == 0) {
        a.out_seq_lens[s] = a.seq_lens[s];
        a.out_query_start[s + 1] = a.query_start[s + 1];
    }
    const int b0 = a.bt_start[s];
    int n = a.bt_start[s + 1] - b0;
    if (n > a.max_blocks_per_seq) n = a.max_blocks_per_seq;
    int32_t *row = a.out_block_tables + (int64_t)s * a.max_blocks_per_seq;
    for (int j = threadIdx.x; j < n; j += STEP_THREADS) row[j] = a.bt_ids[b0 + j];
}

extern "C" int cuda_step_unpack(const struct step_unpack_args *a, cudaStream_t stream)
{
    if (!a || a->num_tokens < 0 || a->num_seqs < 0 || a->num_logits < 0 || a->pad_tokens < a->num_tokens ||
        a->pad_seqs < a->num_seqs || a->pad_logits < a->num_logits || a->pad_logits > a->pad_tokens ||
        a->max_blocks_per_seq < 0 || a->prev_count < 0 || (a->prev_count > 0 && !a->prev_tokens))
        return (int)cudaErrorInvalidValue;
    if ((a->num_tokens && (!a->token_ids || !a->positions || !a->slot_mapping)) ||
        (a->num_seqs && (!a->query_start || !a->seq_lens || !a->bt_start || !a->bt_ids)) ||
        (a->num_logits && !a->logits_indices) ||
        (a->pad_tokens && (!a->out_token_ids || !a->out_positions || !a->out_slot_mapping)) ||
        (a->pad_seqs && (!a->out_query_start || !a->out_seq_lens || !a->out_block_tables)) ||
        (a->pad_logits && !a->out_logits_indices))
        return (int)cudaErrorInvalidValue;
    const int rows = a->pad_tokens > a->pad_logits ? a->pad_tokens : a->pad_logits;
    const int row_ctas = (int)ts_div_up((size_t)rows, STEP_THREADS);
    const int grid = row_ctas + a->pad_seqs;
    if (grid == 0) return 0;
    TS_LAUNCH(step_unpack_kernel, grid, STEP_THREADS, 0, stream, *a, row_ctas);
    return TS_LAUNCH_RESULT();
}

/* ---- row gather ------------------------------------------------------------------------ */

__global__ void __launch_bounds__(STEP_THREADS)
gather_rows_kernel(float4 *__restrict__ out, const float4 *__restrict__ in, int64_t dim4, const int32_t *rows)
{
    const int64_t i = (int64_t)blockIdx.y * STEP_THREADS * 4 + threadIdx.x;
    const int64_t r = rows[blockIdx.x];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int64_t c = i + j * STEP_THREADS;
        if (c < dim4) out[(int64_t)blockIdx.x * dim4 + c] = in[r * dim4 + c];
    }
}

__global__ void __launch_bounds__(STEP_THREADS)
gather_rows_generic_kernel(float *__restrict__ out, const float *__restrict__ in, int64_t dim, const int32_t *rows)
{
    const int64_t i = (int64_t)blockIdx.y * STEP_THREADS * 4 + threadIdx.x;
    const int64_t r = rows[blockIdx.x];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int64_t c = i + j * STEP_THREADS;
        if (c < dim) out[(int64_t)blockIdx.x * dim + c] = in[r * dim + c];
    }
}

extern "C" int cuda_gather_rows(float *out, const float *in, int64_t dim, const int32_t *rows, int num_rows,
                                cudaStream_t stream)
{
    if (!out || !in || !rows || dim < 0 || num_rows < 0) return (int)cudaErrorInvalidValue;
    if (!num_rows || !dim) return 0;
    if (dim % 4 == 0 && ts_aligned(out, 16) && ts_aligned(in, 16)) {
        const dim3 grid(num_rows, ts_div_up((size_t)(dim / 4), STEP_THREADS * 4));
        TS_LAUNCH(gather_rows_kernel, grid, STEP_THREADS, 0, stream, (float4 *)out, (const float4 *)in, dim / 4,
                  rows);
    } else {
        const dim3 grid(num_rows, ts_div_up((size_t)dim, STEP_THREADS * 4));
        TS_LAUNCH(gather_rows_generic_kernel, grid, STEP_THREADS, 0, stream, out, in, dim, rows);
    }
    return TS_LAUNCH_RESULT();
}

/* ---- F32 -> F16 / BF16 ------------------------------------------------------------------ */

template <typename OutT>
__global__ void __launch_bounds__(STEP_THREADS) convert_f32_kernel(OutT *__restrict__ out, const float *__restrict__ in,
                                                                   int64_t n)
{
    ts_pdl_launch_dependents(); /* a pdl launch after this one may be scheduled now */
    const int64_t v = (int64_t)blockIdx.x * STEP_THREADS + threadIdx.x;
    if (4 * v + 3 < n) {
        float4 x = reinterpret_cast<const float4 *>(in)[v];
        out[4 * v] = ts_from_float<OutT>(x.x);
        out[4 * v + 1] = ts_from_float<OutT>(x.y);
        out[4 * v + 2] = ts_from_float<OutT>(x.z);
        out[4 * v + 3] = ts_from_float<OutT>(x.w);
    } else {
        for (int64_t i = 4 * v; i < n; i++) out[i] = ts_from_float<OutT>(in[i]);
    }
}

template <typename OutT> static int convert_launch(OutT *out, const float *in, int64_t n, cudaStream_t stream)
{
    auto k = convert_f32_kernel<OutT>;
    TS_LAUNCH(k, ts_div_up((size_t)((n + 3) / 4), STEP_THREADS), STEP_THREADS, 0, stream, out, in, n);
    return TS_LAUNCH_RESULT();
}

extern "C" int cuda_convert_f32(void *out, enum dtype out_dtype, const float *in, int64_t n, cudaStream_t stream)
{
    if (!out || !in || n < 0 || !ts_aligned(in, 16)) return (int)cudaErrorInvalidValue;
    if (!n) return 0;
    if ((n + 3) / 4 > (int64_t)INT32_MAX * STEP_THREADS) return (int)cudaErrorInvalidValue;
    switch (out_dtype) {
    case DT_F16: return convert_launch((__half *)out, in, n, stream);
    case DT_BF16: return convert_launch((__nv_bfloat16 *)out, in, n, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}
