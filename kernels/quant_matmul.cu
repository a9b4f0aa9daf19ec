/* quant_matmul.cu — y = x W^T over GGUF-quantized weights. Contracts in
 * kernels/quant_matmul.h; block decoders in kernels/quant.cuh; CPU twins cpu_matmul /
 * cpu_matmul_ref (src/backend/cpu/quant.h).
 *
 * quantize_act: x F32 -> int8 codes per 32-element block, with d = amax / 127 and the code
 *   sum s (the CPU's Q8_0 rounding, so for the 32-element weight types both backends
 *   compute the same integer dot products). Eight lanes per block, one float4 each; the
 *   block's max and sum by three xor-shuffles within the eight.
 *
 * quant_gemv (num_tokens <= 8), memory-bound: every weight byte is read once, for all
 *   tokens (instances T = 1, 2, 4, 8 tokens; fewer are masked).
 *   - Work items: row groups of R rows (R = 1, 2, 2, 4 for T = 1, 2, 4, 8: one activation
 *     load feeds R rows, keeping the L1 activation traffic near the weight stream) x chunks
 *     of 32 * UPL units along K (a unit = 32 weights, quant.cuh; UPL = 1-4 units per lane,
 *     by type and R, so that a warp's chunk is ~2 KB: the bytes it keeps in flight).
 *   - Persistent grid: as many warps as fit on the GPU (occupancy x SMs), each streaming
 *     an equal share of whole row groups, chunk after chunk. Only when there are fewer
 *     row groups than a quarter of that (k/v projections) do a CTA's 4 warps split one
 *     group's chunks and add their sums in shared memory.
 *   - Per chunk a warp copies the R rows' bytes into its own shared buffer with aligned,
 *     coalesced 16-byte loads (quant.cuh qstage_load/store; __syncwarp only). The loads of
 *     the warp's next item — the next chunk, or the next group's first — are issued before
 *     the current one is decoded (register double buffering), so every warp always has
 *     weight bytes in flight and a CTA never waits at a row boundary.
 *   - Q4_K (direct = 1): its blocks keep 16-byte alignment, so each lane loads its unit's
 *     16 code bytes and its block's 16-byte header straight into registers instead
 *     (DIRECT instances), refilling a unit's registers with the next item's unit as soon
 *     as it is decoded; q4k_unit_dot decodes both ways, so the sums are the same bits.
 *   - Lane l decodes its unit of each of the R rows from shared memory into int8 codes
 *     (qdecode_dot), loads the matching activation codes once per token (16-byte loads,
 *     L1-resident: n_in bytes per token) and accumulates, per group of 4*NI codes,
 *       acc[r][t] += dx * (a * dp4a-sum + b * s)
 *     in F32 registers (R * T of them, indices compile-time).
 *   - End of a row group: one reduce-scatter over the warp's R*T partial sums (R*T - 1 +
 *     log2(32/(R*T)) shuffles, not R*T full reductions); leader lanes write y.
 *   Register budgets per instance (launch bounds) keep every one spill-free on sm_80/89/90.
 *
 * dequant_bf16 + cuBLAS (num_tokens > 8): one warp per (row, chunk) stages the chunk like
 *   the GEMV, decodes its unit to F32 exactly as the CPU (qdecode_f32), rounds to BF16 and
 *   writes 16-byte stores. cuda_quant_matmul dequantizes W in slices that fit L2 (the
 *   workspace decides the slice), converts x to BF16 once, and runs cublasGemmEx per slice
 *   (BF16 x BF16 -> F32 with F32 accumulation) writing y's columns [o0, o0 + rows).
 */
#include "kernels/common.cuh"
#include "kernels/quant.cuh"

#include "kernels/quant_matmul.h"

#include <cublas_v2.h>

#define QMM_WARPS 4
#define QMM_THREADS (32 * QMM_WARPS)
#define QACT_THREADS 256
/* Target bytes of one BF16 slice of W in the large-batch path: written by the dequant
 * kernel and read right after by the GEMM while it is still in L2 (50 MB on H100/H200). */
#define QMM_SLICE_BYTES (24u << 20)

static inline size_t qmm_align(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Block size of a supported weight type (traits from quant.cuh: the kernel library calls
 * nothing of libtessera) and whether n_in is a whole number of its blocks. */
static bool qmm_block_shape(enum dtype type, int64_t n_in)
{
    int be;
    switch (type) {
    case DT_Q8_0: case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: be = 32; break;
    case DT_Q4_K: case DT_Q6_K: be = 256; break;
    default: return false;
    }
    return n_in > 0 && n_in % be == 0 && n_in <= INT32_MAX / 2;
}

/* ---- activation quantization ------------------------------------------------------------- */

__global__ void __launch_bounds__(QACT_THREADS)
quantize_act_kernel(const float *x,              // [n_blocks][32] (= [num_tokens][n_in]): the previous kernel's output
                    int64_t n_blocks,
                    int8_t *__restrict__ q,      // [n_blocks][32]
                    float2 *__restrict__ ds)     // [n_blocks]: (d, sum of codes)
{
    ts_pdl_begin();
    const int64_t tid = (int64_t)blockIdx.x * QACT_THREADS + threadIdx.x;
    const int64_t b = tid >> 3;
    const bool ok = b < n_blocks;
    const float4 x4 = ok ? reinterpret_cast<const float4 *>(x)[tid] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    qact_store4(x4, tid, ok, q, ds); /* the whole [n_blocks][32] as one row */
}

size_t cuda_quant_act_ds_offset(int64_t n_in, int num_tokens)
{
    return qmm_align((size_t)n_in * (size_t)(num_tokens > 0 ? num_tokens : 0), 256);
}

size_t cuda_quant_act_size(int64_t n_in, int num_tokens)
{
    return cuda_quant_act_ds_offset(n_in, num_tokens) +
           (size_t)(n_in / 32) * (size_t)(num_tokens > 0 ? num_tokens : 0) * sizeof(float2);
}

int cuda_quantize_act(const float *x, int64_t n_in, int num_tokens, void *act, int pdl, cudaStream_t stream)
{
    if (n_in <= 0 || n_in % 32 || num_tokens < 0 || !q_aligned16(x) || !q_aligned16(act))
        return (int)cudaErrorInvalidValue;
    if (num_tokens == 0) return 0;
    const int64_t n_blocks = n_in / 32 * num_tokens;
    int8_t *q = static_cast<int8_t *>(act);
    float2 *ds = qact_ds(act, n_in, num_tokens);
    TS_LAUNCH_PDL(quantize_act_kernel, ts_div_up((size_t)n_blocks * 8, QACT_THREADS), QACT_THREADS, 0, stream, pdl,
                  x, n_blocks, q, ds);
    return TS_LAUNCH_RESULT();
}

/* ---- GEMV -------------------------------------------------------------------------------- */

/* One butterfly step of qmm_reduce_scatter: the M values still live halve, lanes with bit
 * O = 16 M / N set keeping the upper half (recursion, so every index is a constant). */
template <int N, int M> __device__ __forceinline__ void qmm_rs_step(float (&v)[N], int lane)
{
    if constexpr (M > 1) {
        constexpr int H = M / 2, O = 16 * M / N;
        const bool up = (lane & O) != 0;
#pragma unroll
        for (int i = 0; i < H; i++) {
            const float send = up ? v[i] : v[i + H];
            const float keep = up ? v[i + H] : v[i];
            v[i] = keep + __shfl_xor_sync(TS_FULL_MASK, send, O);
        }
        qmm_rs_step<N, H>(v, lane);
    }
}

/* After the call lane l holds the warp-wide sum of v[l / (32 / N)] (N a power of two <= 32):
 * log2(N) butterfly steps (N - 1 shuffles), then a plain xor reduction over the rest. */
template <int N> __device__ __forceinline__ float qmm_reduce_scatter(float (&v)[N], int lane)
{
    qmm_rs_step<N, N>(v, lane);
    float s = v[0];
#pragma unroll
    for (int o = 16 / N; o > 0; o >>= 1) s += __shfl_xor_sync(TS_FULL_MASK, s, o);
    return s;
}

/* NI activation code words (4 codes each) at p: 16-byte loads (NI = 8, 4) or one 8-byte load.
 * Not the read-only path (__ldg), which assumes data no one writes while the kernel runs: in
 * a pdl launch the kernel before this one writes them while this one has started
 * (common.cuh, ts_pdl_wait). __ldca (ld.global.ca, cached in L1 as __ldg is) rather than a
 * plain dereference: naming the global space lets nvcc schedule them past the warp's stores
 * to its shared staging buffer (plain loads cost the Q6_K kernel ~15 % more instructions). */
template <int NI> __device__ __forceinline__ void qmm_load_act(const int8_t *p, int (&a)[NI])
{
    if constexpr (NI == 2) {
        const int2 v = __ldca(reinterpret_cast<const int2 *>(p));
        a[0] = v.x;
        a[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < NI / 4; i++) {
            const int4 v = __ldca(reinterpret_cast<const int4 *>(p) + i);
            a[4 * i + 0] = v.x;
            a[4 * i + 1] = v.y;
            a[4 * i + 2] = v.z;
            a[4 * i + 3] = v.w;
        }
    }
}

/* Warps of GEMV instance `kernel` that fit on the device at once (occupancy x SMs), looked
 * up once per instance and device-independent afterwards (all GPUs of a process are
 * assumed alike). Under the emulator a small fixed number, so that the tests run the loops
 * over several row groups per warp. */
static int qmm_resident_warps(const void *kernel)
{
#ifdef TESSERA_EMU
    (void)kernel;
    return 16;
#else
    int dev = 0, sms = 0, ctas = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, QMM_THREADS, 0) != cudaSuccess || sms <= 0 ||
        ctas <= 0) {
        (void)cudaGetLastError(); /* a failed query must not look like a failed launch */
        return 4096;
    }
    return sms * ctas * QMM_WARPS;
#endif
}

/* One pass over W for T tokens (instances T = 1, 2, 4, 8; num_tokens <= T masked).
 * Work: row groups of R rows x chunks of 32 * UPL units (each lane UPL units per row).
 * ks = 1: each warp streams whole row groups g = warp id, + total warps, ...;
 * ks = QMM_WARPS: the CTA's warps split each group's chunks (c = warp, + ks, ...) and add
 * their sums in shared memory (small matrices: more warps than row groups).
 * The loads of a warp's next item (next chunk, or the next group's first) are in flight
 * while it decodes the current one.
 * Compiled for 8 CTAs per SM at one token (<= 64 registers: 32 warps keep weight loads in
 * flight; 6 and <= 80 with direct loads, whose prefetch registers hold the whole chunk:
 * 24 warps, still ~55 KB in flight per SM), 4 at 2-4 tokens (<= 128) and 3 at 8 tokens
 * (<= 168: R = 4 rows x 8 tokens of accumulators plus four rows of decoded codes); no
 * spill on sm_80/89/90. */
template <int QT, int T, int R, int UPL, bool DIRECT>
__global__ void __launch_bounds__(QMM_THREADS, T == 1 ? (DIRECT ? 6 : 8) : T == 8 ? 3 : 4)
quant_gemv_kernel(const uint8_t *__restrict__ w,  // [n_out][row_bytes]
                  int64_t row_bytes, int n_in, int64_t n_out,
                  const int8_t *xq,                // [num_tokens][n_in]: the previous kernel's output (pdl)
                  const float2 *xds,               // [num_tokens][n_in / 32]: the same
                  int num_tokens,
                  float *__restrict__ y,           // [num_tokens][ldy], columns [0, n_out)
                  int64_t ldy, int ks)
{
    using Q = qtraits<QT>;
    constexpr int CU = 32 * UPL;                               /* units per chunk */
    constexpr int CB = CU / Q::UNITS * Q::BLOCK_BYTES;         /* bytes per chunk */
    constexpr int NWIN = (CB + 14 + 15) / 16, ROWB = 16 * (NWIN + 1);
    constexpr int KW = (R * NWIN + 31) / 32, N = R * T;
    static_assert(!DIRECT || QT == DT_Q4_K, "only Q4_K blocks keep the 16-byte alignment direct loads need");
    TS_SHARED(uint4, stage, [DIRECT ? 1 : QMM_WARPS * R * ROWB / 16]);
    TS_SHARED(float, red, [QMM_WARPS * N]);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_groups = (n_out + R - 1) / R;
    const uint8_t *end = w + n_out * row_bytes;
    const int units = n_in / Q::BLOCK_ELEMS * Q::UNITS;
    const int nchunks = (units + CU - 1) / CU;
    const int nb32 = n_in >> 5;
    const int kslice = ks == 1 ? 0 : warp;
    const int64_t gstride = ks == 1 ? (int64_t)gridDim.x * QMM_WARPS : (int64_t)gridDim.x;
    int64_t g = ks == 1 ? (int64_t)blockIdx.x * QMM_WARPS + warp : (int64_t)blockIdx.x;
    uint8_t *buf = reinterpret_cast<uint8_t *>(stage) + warp * R * ROWB;

    /* rows of group gg that exist (0 past the last group), and its first row (the tensor's
     * first past the last group: no pointer is formed past the weights) */
    auto group_rows = [&](int64_t gg) -> int {
        return gg >= n_groups ? 0 : (int)(n_out - gg * R < R ? n_out - gg * R : R);
    };
    auto group_row0 = [&](int64_t gg) { return w + (gg < n_groups ? gg : 0) * R * row_bytes; };

    /* warp-cooperative load of chunk c of row group gg into pre[] */
    auto load = [&](uint4 (&pre)[KW], int64_t gg, int c) -> unsigned {
        const int64_t cs = (int64_t)c * CB;
        return qstage_load<R, NWIN, KW>(pre, group_row0(gg) + cs, row_bytes, group_rows(gg),
                                        (int)(row_bytes - cs < CB ? row_bytes - cs : CB), end, lane);
    };

    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;

    /* the dot of one decoded unit u (R rows) with every token's activation codes */
    auto dot = [&](const qunit<QT> (&wu)[R], int u) {
#pragma unroll
        for (int t = 0; t < T; t++) {
            if (t >= num_tokens) break;
#pragma unroll
            for (int gi = 0; gi < Q::NG; gi++) {
                const int e = qunit_elem<QT>(u, gi);
                int a[Q::NI];
                qmm_load_act<Q::NI>(xq + (int64_t)t * n_in + e, a);
                /* (d, s), or only d where the weight type needs no code sum */
                float2 ds;
                if constexpr (Q::HAS_B) ds = __ldca(xds + (int64_t)t * nb32 + (e >> 5));
                else ds.x = __ldca(reinterpret_cast<const float *>(xds + (int64_t)t * nb32 + (e >> 5)));
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int isum = 0;
#pragma unroll
                    for (int i = 0; i < Q::NI; i++) isum = __dp4a((int)wu[r].v[gi * Q::NI + i], a[i], isum);
                    float sc = wu[r].a[gi] * (float)isum;
                    if constexpr (Q::HAS_B) sc = fmaf(wu[r].b[gi], ds.y, sc);
                    acc[r][t] = fmaf(ds.x, sc, acc[r][t]);
                }
            }
        }
    };

    /* Staged source (every type): chunk registers -> the warp's shared buffer -> decoders.
     * Direct source (Q4_K): each lane's units straight into registers, per unit its block's
     * 16-byte header (d, dmin, scales; the block's 8 lanes read the same one) and its 16 code
     * bytes; a unit's registers are refilled with the next item's unit as soon as decoded,
     * so the next item streams in while this one's dot products run. */
    uint4 pre[DIRECT ? 1 : KW];
    uint4 dhdr[R][UPL], dq[R][UPL];
    /* unit j of chunk cc of the nr (<= R) rows from row0p on (row0p: row group gg's first
     * row, computed once per chunk); units are unsigned so / and % are shifts */
    auto load_direct = [&](const uint8_t *row0p, int nr, int cc, int j) {
        const unsigned u = (unsigned)(cc * CU + 32 * j + lane);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr && u < (unsigned)units) {
                const uint8_t *b = row0p + r * row_bytes + (u / Q::UNITS) * Q::BLOCK_BYTES;
                dhdr[r][j] = __ldcs(reinterpret_cast<const uint4 *>(b));
                dq[r][j] = __ldcs(reinterpret_cast<const uint4 *>(b + 16 + 16 * (u % Q::UNITS)));
            }
    };
    unsigned valid = 0;
    int c = kslice;
    if constexpr (DIRECT) {
#pragma unroll
        for (int j = 0; j < UPL; j++)
#pragma unroll
            for (int r = 0; r < R; r++) dhdr[r][j] = dq[r][j] = make_uint4(0u, 0u, 0u, 0u);
        if (c < nchunks)
#pragma unroll
            for (int j = 0; j < UPL; j++) load_direct(group_row0(g), group_rows(g), c, j);
    } else if (g < n_groups && c < nchunks) {
        valid = load(pre, g, c);
    }
    /* A pdl launch: the first chunk's weights (no kernel's output) are in flight before the
     * wait for the previous kernel, which writes the activations. */
    ts_pdl_launch_dependents();
    ts_pdl_wait();
    for (; g < n_groups; g += gstride) {
        const int64_t row0 = g * R;
        const int nrows = group_rows(g);
        for (; c < nchunks; c += ks) {
            int64_t ng = g;
            int nc = c + ks;
            if (nc >= nchunks) {
                nc = kslice;
                ng = g + gstride;
            }
            /* rows past n_out decode whatever the registers or buffer hold; their sums are
             * never written */
            if constexpr (DIRECT) {
                const uint8_t *nrow0p = group_row0(ng);
                const int nnr = group_rows(ng); /* nc < nchunks here: kslice <= c */
#pragma unroll
                for (int j = 0; j < UPL; j++) {
                    const int u = c * CU + 32 * j + lane;
                    qunit<QT> wu[R];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const uint32_t sc[3] = { dhdr[r][j].y, dhdr[r][j].z, dhdr[r][j].w };
                        const uint32_t q[4] = { dq[r][j].x, dq[r][j].y, dq[r][j].z, dq[r][j].w };
                        q4k_unit_dot(dhdr[r][j].x, sc, q, (int)((unsigned)u % Q::UNITS), wu[r]);
                    }
                    load_direct(nrow0p, nnr, nc, j);
                    if (u < units) dot(wu, u);
                }
            } else {
                __syncwarp(); /* every lane is done reading the previous chunk */
                qstage_store<R, NWIN, KW>(pre, valid, buf, lane);
                __syncwarp();
                if (ng < n_groups && nc < nchunks) valid = load(pre, ng, nc);
#pragma unroll
                for (int j = 0; j < UPL; j++) {
                    const int uc = 32 * j + lane, u = c * CU + uc;
                    if (u >= units) break;
                    qunit<QT> wu[R];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const int head = (int)((uintptr_t)(w + (row0 + r) * row_bytes + (int64_t)c * CB) & 15);
                        qdecode_dot<QT>(buf + r * ROWB, head + (uc / Q::UNITS) * Q::BLOCK_BYTES, uc % Q::UNITS,
                                        wu[r]);
                    }
                    dot(wu, u);
                }
            }
        }
        c = kslice;

        /* the group's R x T sums: reduce-scatter over the warp, then across the CTA's warps
         * when they split the chunks */
        float v[N];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < T; t++) {
                v[r * T + t] = acc[r][t];
                acc[r][t] = 0.0f;
            }
        const float sum = qmm_reduce_scatter<N>(v, lane);
        const int idx = lane / (32 / N);
        const bool leader = (lane & (32 / N - 1)) == 0;
        if (ks == 1) {
            const int r = idx / T, t = idx % T;
            if (leader && r < nrows && t < num_tokens) y[(int64_t)t * ldy + row0 + r] = sum;
        } else {
            if (leader) red[warp * N + idx] = sum;
            __syncthreads();
            if (threadIdx.x < N) {
                float tot = 0.0f;
#pragma unroll
                for (int k = 0; k < QMM_WARPS; k++) tot += red[k * N + threadIdx.x];
                const int r = threadIdx.x / T, t = threadIdx.x % T;
                if (r < nrows && t < num_tokens) y[(int64_t)t * ldy + row0 + r] = tot;
            }
            __syncthreads(); /* red is reused by the next group */
        }
    }
}

template <int QT, int T, int R, int UPL, bool DIRECT>
static int qmm_gemv_launch(const uint8_t *w, int64_t n_in, int64_t n_out, const int8_t *xq, const float2 *xds,
                           int num_tokens, float *y, int64_t ldy, int pdl, cudaStream_t stream)
{
    auto *gemv_kernel = quant_gemv_kernel<QT, T, R, UPL, DIRECT>;
    static const int resident = qmm_resident_warps(reinterpret_cast<const void *>(gemv_kernel));
    const int64_t row_bytes = n_in / qtraits<QT>::BLOCK_ELEMS * qtraits<QT>::BLOCK_BYTES;
    const int64_t n_groups = (n_out + R - 1) / R;
    int ks;
    int64_t ctas;
    if (n_groups * QMM_WARPS <= resident) { /* few rows: the CTA's warps split K */
        ks = QMM_WARPS;
        ctas = n_groups;
    } else { /* a persistent grid: each warp streams an equal share of the row groups */
        const int64_t per_warp = (n_groups + resident - 1) / resident;
        const int64_t warps = (n_groups + per_warp - 1) / per_warp;
        ks = 1;
        ctas = (warps + QMM_WARPS - 1) / QMM_WARPS;
    }
    TS_LAUNCH_PDL(gemv_kernel, (unsigned)ctas, QMM_THREADS, 0, stream, pdl, w, row_bytes, (int)n_in, n_out, xq, xds,
                  num_tokens, y, ldy, ks);
    return TS_LAUNCH_RESULT();
}

/* Units per lane per chunk for R rows: enough that a warp's chunk (R rows x 32 * UPL units)
 * is ~2 KB, the bytes each warp keeps in flight (at 16-32 warps per SM, ~36 KB per SM
 * covers HBM latency on an H200 by Little's law); at most 4. */
template <int QT> static constexpr int qmm_upl(int R)
{
    return (2048 * qtraits<QT>::UNITS + 32 * R * qtraits<QT>::BLOCK_BYTES - 1) / (32 * R * qtraits<QT>::BLOCK_BYTES) > 4
               ? 4
               : (2048 * qtraits<QT>::UNITS + 32 * R * qtraits<QT>::BLOCK_BYTES - 1) / (32 * R * qtraits<QT>::BLOCK_BYTES);
}

template <int QT, bool DIRECT>
static int qmm_gemv_type(const uint8_t *w, int64_t n_in, int64_t n_out, const int8_t *xq, const float2 *xds,
                         int num_tokens, float *y, int64_t ldy, int pdl, cudaStream_t stream)
{
    /* every instance's arguments after its template ones */
#define QMM_GEMV_ARGS w, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream
    switch (num_tokens) {
    case 1: return qmm_gemv_launch<QT, 1, 1, qmm_upl<QT>(1), DIRECT>(QMM_GEMV_ARGS);
    case 2: return qmm_gemv_launch<QT, 2, 2, qmm_upl<QT>(2), DIRECT>(QMM_GEMV_ARGS);
    case 3: case 4: return qmm_gemv_launch<QT, 4, 2, qmm_upl<QT>(2), DIRECT>(QMM_GEMV_ARGS);
    case 5: case 6: case 7: case 8: return qmm_gemv_launch<QT, 8, 4, qmm_upl<QT>(4), DIRECT>(QMM_GEMV_ARGS);
    default: return (int)cudaErrorInvalidValue;
    }
#undef QMM_GEMV_ARGS
}

int cuda_quant_gemv(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const void *act, int num_tokens,
                    float *y, int64_t ldy, int direct, int pdl, cudaStream_t stream)
{
    if (!qmm_block_shape(type, n_in) || n_out < 0 || num_tokens < 1 ||
        num_tokens > QMM_GEMV_MAX_TOKENS || ldy < n_out || !q_aligned16(w) || !q_aligned16(act))
        return (int)cudaErrorInvalidValue;
    if (n_out == 0) return 0;
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    const int8_t *xq = static_cast<const int8_t *>(act);
    const float2 *xds = qact_ds(act, n_in, num_tokens);
    switch (type) {
    case DT_Q8_0: return qmm_gemv_type<DT_Q8_0, false>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream);
    case DT_Q4_0: return qmm_gemv_type<DT_Q4_0, false>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream);
    case DT_Q4_1: return qmm_gemv_type<DT_Q4_1, false>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream);
    case DT_Q5_0: return qmm_gemv_type<DT_Q5_0, false>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream);
    case DT_Q5_1: return qmm_gemv_type<DT_Q5_1, false>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream);
    case DT_Q4_K:
        return direct ? qmm_gemv_type<DT_Q4_K, true>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream)
                      : qmm_gemv_type<DT_Q4_K, false>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream);
    case DT_Q6_K: return qmm_gemv_type<DT_Q6_K, false>(wb, n_in, n_out, xq, xds, num_tokens, y, ldy, pdl, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* ---- dequantization to BF16 -------------------------------------------------------------- */

__device__ __forceinline__ uint32_t qmm_pack_bf16(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

template <int QT>
__global__ void __launch_bounds__(QMM_THREADS)
dequant_bf16_kernel(const uint8_t *__restrict__ w, // rows [0, rows) of the range: [rows][row_bytes]
                    int64_t row_bytes, int n_in, int64_t rows,
                    __nv_bfloat16 *__restrict__ out) // [rows][n_in]
{
    using Q = qtraits<QT>;
    constexpr int NWIN = Q::CHUNK_WINDOWS, KW = (NWIN + 31) / 32, GE = 4 * Q::NI;
    TS_SHARED(uint4, stage, [QMM_WARPS * Q::STAGE_ROW_BYTES / 16]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int units = n_in / Q::BLOCK_ELEMS * Q::UNITS;
    const int nchunks = (units + 31) >> 5;
    const int64_t gw = (int64_t)blockIdx.x * QMM_WARPS + warp;
    if (gw >= rows * nchunks) return; /* whole warps only: no block barrier below */
    const int64_t r = gw / nchunks;
    const int c = (int)(gw - r * nchunks);
    const int64_t cs = (int64_t)c * Q::CHUNK_BYTES;
    const uint8_t *p = w + r * row_bytes + cs;
    uint8_t *buf = reinterpret_cast<uint8_t *>(stage) + warp * Q::STAGE_ROW_BYTES;

    uint4 pre[KW];
    const unsigned valid = qstage_load<1, NWIN, KW>(
        pre, p, 0, 1, (int)(row_bytes - cs < Q::CHUNK_BYTES ? row_bytes - cs : Q::CHUNK_BYTES), w + rows * row_bytes, lane);
    qstage_store<1, NWIN, KW>(pre, valid, buf, lane);
    __syncwarp();
    const int u = c * 32 + lane;
    if (u >= units) return;
    float f[32];
    qdecode_f32<QT>(buf, (int)((uintptr_t)p & 15) + (lane / Q::UNITS) * Q::BLOCK_BYTES, lane % Q::UNITS, f);
    __nv_bfloat16 *o = out + r * n_in;
#pragma unroll
    for (int g = 0; g < Q::NG; g++) {
        uint4 *dst = reinterpret_cast<uint4 *>(o + qunit_elem<QT>(u, g));
#pragma unroll
        for (int i = 0; i < GE / 8; i++)
            dst[i] = make_uint4(qmm_pack_bf16(f[g * GE + 8 * i + 0], f[g * GE + 8 * i + 1]),
                                qmm_pack_bf16(f[g * GE + 8 * i + 2], f[g * GE + 8 * i + 3]),
                                qmm_pack_bf16(f[g * GE + 8 * i + 4], f[g * GE + 8 * i + 5]),
                                qmm_pack_bf16(f[g * GE + 8 * i + 6], f[g * GE + 8 * i + 7]));
    }
}

template <int QT>
static int qmm_dequant_launch(const uint8_t *w, int64_t n_in, int64_t row0, int64_t rows, __nv_bfloat16 *out,
                              cudaStream_t stream)
{
    using Q = qtraits<QT>;
    auto *k = dequant_bf16_kernel<QT>;
    const int64_t row_bytes = n_in / Q::BLOCK_ELEMS * Q::BLOCK_BYTES;
    const int64_t nchunks = (n_in / Q::BLOCK_ELEMS * Q::UNITS + 31) / 32;
    TS_LAUNCH(k, ts_div_up((size_t)(rows * nchunks), QMM_WARPS), QMM_THREADS, 0, stream, w + row0 * row_bytes,
              row_bytes, (int)n_in, rows, out);
    return TS_LAUNCH_RESULT();
}

int cuda_dequant_bf16(enum dtype type, const void *w, int64_t n_in, int64_t row0, int64_t rows, void *out,
                      cudaStream_t stream)
{
    if (!qmm_block_shape(type, n_in) || row0 < 0 || rows < 0 || !q_aligned16(w) || !q_aligned16(out))
        return (int)cudaErrorInvalidValue;
    if (rows == 0) return 0;
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    __nv_bfloat16 *o = static_cast<__nv_bfloat16 *>(out);
    switch (type) {
    case DT_Q8_0: return qmm_dequant_launch<DT_Q8_0>(wb, n_in, row0, rows, o, stream);
    case DT_Q4_0: return qmm_dequant_launch<DT_Q4_0>(wb, n_in, row0, rows, o, stream);
    case DT_Q4_1: return qmm_dequant_launch<DT_Q4_1>(wb, n_in, row0, rows, o, stream);
    case DT_Q5_0: return qmm_dequant_launch<DT_Q5_0>(wb, n_in, row0, rows, o, stream);
    case DT_Q5_1: return qmm_dequant_launch<DT_Q5_1>(wb, n_in, row0, rows, o, stream);
    case DT_Q4_K: return qmm_dequant_launch<DT_Q4_K>(wb, n_in, row0, rows, o, stream);
    case DT_Q6_K: return qmm_dequant_launch<DT_Q6_K>(wb, n_in, row0, rows, o, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* ---- the large-batch path ----------------------------------------------------------------- */

__global__ void __launch_bounds__(256)
f32_to_bf16_kernel(const float4 *__restrict__ x, // [n4]
                   int64_t n4,
                   uint2 *__restrict__ out)       // [n4] (4 BF16 each)
{
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n4) return;
    const float4 v = x[i];
    out[i] = make_uint2(qmm_pack_bf16(v.x, v.y), qmm_pack_bf16(v.z, v.w));
}

/* Rows of W per BF16 slice: QMM_SLICE_BYTES worth, a multiple of 64, at least 64. */
static int64_t qmm_slice_rows(int64_t n_in, int64_t n_out)
{
    int64_t r = (int64_t)QMM_SLICE_BYTES / (n_in * 2) / 64 * 64;
    if (r < 64) r = 64;
    return r < n_out ? r : n_out;
}

size_t cuda_quant_matmul_workspace_size(enum dtype type, int64_t n_in, int64_t n_out, int max_tokens)
{
    if (!qmm_block_shape(type, n_in) || n_out < 0 || max_tokens < 0) return 0;
    const int tg = max_tokens < QMM_GEMV_MAX_TOKENS ? max_tokens : QMM_GEMV_MAX_TOKENS;
    size_t need = cuda_quant_act_size(n_in, tg);
    if (max_tokens > QMM_GEMV_MAX_TOKENS) {
        const size_t big = qmm_align((size_t)max_tokens * (size_t)n_in * 2, 256) +
                           (size_t)qmm_slice_rows(n_in, n_out) * (size_t)n_in * 2;
        if (big > need) need = big;
    }
    return need;
}

int cuda_quant_matmul(enum dtype type, const void *w, int64_t n_in, int64_t n_out, const float *x, float *y,
                      int64_t ldy, int num_tokens, void *workspace, size_t workspace_bytes,
                      struct cublasContext *cublas, int direct, int pdl, cudaStream_t stream)
{
    if (!qmm_block_shape(type, n_in) || n_out < 0 || ldy < n_out || num_tokens < 0 || !q_aligned16(w) ||
        !q_aligned16(x) || !q_aligned16(workspace))
        return (int)cudaErrorInvalidValue;
    if (num_tokens == 0 || n_out == 0) return 0;

    if (num_tokens <= QMM_GEMV_MAX_TOKENS) {
        if (workspace_bytes < cuda_quant_act_size(n_in, num_tokens)) return (int)cudaErrorInvalidValue;
        int e = cuda_quantize_act(x, n_in, num_tokens, workspace, pdl, stream);
        if (e) return e;
        return cuda_quant_gemv(type, w, n_in, n_out, workspace, num_tokens, y, ldy, direct, pdl, stream);
    }

    /* BF16 copy of x, then as many rows of W per slice as the rest of the workspace holds */
    const size_t xb_bytes = qmm_align((size_t)num_tokens * (size_t)n_in * 2, 256);
    if (!cublas || workspace_bytes < xb_bytes + (size_t)n_in * 2) return (int)cudaErrorInvalidValue;
    int64_t slice = (int64_t)((workspace_bytes - xb_bytes) / ((size_t)n_in * 2));
    if (slice >= 16) slice = slice / 16 * 16; /* keeps every slice's y columns 64-byte aligned */
    if (slice > n_out) slice = n_out;
    uint8_t *ws = static_cast<uint8_t *>(workspace);
    void *xb = ws, *wb = ws + xb_bytes;

    const int64_t n4 = (int64_t)num_tokens * n_in / 4;
    TS_LAUNCH(f32_to_bf16_kernel, ts_div_up((size_t)n4, 256), 256, 0, stream, reinterpret_cast<const float4 *>(x),
              n4, static_cast<uint2 *>(xb));
    int e = TS_LAUNCH_RESULT();
    if (e) return e;

    cublasHandle_t h = cublas;
    if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS) return (int)cudaErrorUnknown;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t o0 = 0; o0 < n_out; o0 += slice) {
        const int64_t rows = n_out - o0 < slice ? n_out - o0 : slice;
        e = cuda_dequant_bf16(type, w, n_in, o0, rows, wb, stream);
        if (e) return e;
        /* column-major view: C[rows x T] (ld ldy) = A^T (A = slice, n_in x rows, ld n_in)
         *                                             * B (x, n_in x T, ld n_in) */
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, num_tokens, (int)n_in, &one, wb,
                                         CUDA_R_16BF, (int)n_in, xb, CUDA_R_16BF, (int)n_in, &zero, y + o0,
                                         CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) return (int)cudaErrorUnknown;
    }
    return 0;
}
