/* attention_prefill.cu — causal varlen paged attention for prefill and chunked prefill,
 * flash-attention style on the tensor cores (ldmatrix + mma.sync m16n8k16, F32 accumulate).
 *
 * Math (cpu_paged_attention's contract, kernels/attention_prefill.h): for query row t of
 * sequence s and query head h, with kv head g = h / group (group = n_heads / n_kv_heads)
 * and ctx = seq_lens[s] - (query_start[s+1] - t) + 1,
 *   out[t][h] = sum_{p < ctx} softmax_p(scale * q[t][h] . k[p][g]) v[p][g].
 *
 * Parallelisation. One CTA (4 warps, 128 threads) owns a tile of BM = 64 query rows of one
 * sequence and one kv head: the rows of the whole query group are flattened as
 * rf = (t - query_start[s]) * group + (h - g * group), so every K/V tile read from the
 * cache serves all `group` query heads (GQA reuse), and a tile may span several tokens.
 * Grid: x = query tiles of all sequences, y = kv head. Tile -> (sequence, tile) needs no
 * workspace: sequence s owns the block indices [tile_start(s), tile_start(s+1)) with
 *   tile_start(s) = floor((query_start[s] - query_start[0]) * group / BM) + s,
 * which leaves room for its ceil(q_len * group / BM) tiles (at most one index per
 * sequence is left over and exits at once); each CTA finds its s by a binary search of
 * query_start. Block indices run backwards, so within a sequence the tiles that see the
 * most context (its last rows) start first and the light ones fill the tail.
 *
 * Per CTA: the Q tile is converted once to the 16-bit compute type T (F16 for F16 and FP8
 * caches, BF16 for BF16 caches) into shared memory, and each warp loads its 16 rows into
 * A registers for the whole kernel. The kernel then walks the context in tiles of BN = 64
 * keys up to the causal limit of its last row (causal tile skipping: no work past it; the
 * partial last tile is masked per row). Each K/V tile is gathered from the paged pool
 * with 16-byte loads (16 threads per 256-byte cache row: coalesced; the block-table lookup
 * is a shift and a mask, block_size being a power of two), keys past the limit read as
 * zero (never from beyond the sequence's blocks), FP8 codes are widened to F16 on the way
 * into shared memory (exact; the scales are applied in F32). Tile j+1 is loaded into
 * registers while tile j is computed (K during S = Q·K^T, V during the softmax and P·V)
 * and stored after the barrier that ends the reads of tile j: one K and one V buffer, two
 * barriers per tile, one tile of registers in flight.
 *
 * Warp w owns query rows [16w, 16w+16) and keeps everything of them in registers, as
 * FlashAttention-2 does (ap_warp): S = Q·K^T in m16n8 accumulators; the online softmax on
 * them (a lane holds 2 rows x 16 of the tile's keys, the row max takes two shuffles within
 * the 4 lanes of a row, exp2 with the scale folded); P rounded to T straight into the A
 * registers of O += P·V (the accumulator layout of S is the A layout of P); O in
 * accumulators for the whole loop, each register's row known (ts_mma_d_at). So S, P and O
 * never touch shared memory; its only traffic is staging K/V tiles and ldmatrix reads.
 * O is rescaled in registers only when a row's maximum grew by more than AP_TAU (log2
 * units, a factor 256) since the reference max was last set (lazy rescaling, as
 * FlashAttention-4 does): P is then bounded by 2^AP_TAU, harmless in F16/BF16 and F32. The
 * row sum adds the rounded P, so the weights that multiply V are exactly normalised. The
 * epilogue scales by v_scale / sum and writes the activation dtype (F32/F16/BF16) from
 * the registers: a row's 4 lanes write 8 adjacent columns (32 bytes in F32).
 *
 * Shared memory (head_dim 128): Q 17 KB + K 17 KB + V 17 KB = 51 KB per CTA; registers
 * (~250 at head_dim 128) allow two CTAs per SM. No T x T score matrix exists anywhere.
 */
#include "common.cuh"

#include "attention_prefill.h"

#include <limits.h>

/* 4 warps (64 query rows) per CTA; -DAP_WARPS=8 builds the 128-row variant to compare on
 * a GPU (every size below follows from it). */
#ifndef AP_WARPS
#define AP_WARPS 4
#endif
#define AP_THREADS (32 * AP_WARPS)
#define AP_MIN_BLOCKS (AP_WARPS >= 8 ? 1 : 2) /* CTAs per SM: ~250 registers per thread */
#define AP_BM (16 * AP_WARPS) /* query rows (token, head-in-group) per CTA */
#define AP_TAU 8.0f           /* lazy-rescale threshold, log2 units */

/* Tile geometry for one head_dim (smem rows padded by 16 bytes: the 8 rows of every
 * ldmatrix matrix fall in distinct banks, and every row stays 16-byte aligned). */
template <int HD> struct ap_shape {
    static constexpr int BN = 64;      /* keys per K/V tile */
    static constexpr int LDQ = HD + 8; /* 16-bit elements per Q/K/V smem row */
    static_assert(HD % 16 == 0, "head_dim in whole 16-column k steps");
};

/* The cache's storage and the tensor-core compute type it maps to. */
template <enum kv_dtype KVD> struct ap_kv;
template <> struct ap_kv<KV_F16> {
    typedef __half T;
    static constexpr int ESIZE = 2;
};
template <> struct ap_kv<KV_BF16> {
    typedef __nv_bfloat16 T;
    static constexpr int ESIZE = 2;
};
template <> struct ap_kv<KV_FP8_E4M3> {
    typedef __half T; /* every e4m3 value is exact in F16 */
    static constexpr int ESIZE = 1;
};

template <int HD, enum kv_dtype KVD> struct ap_tile {
    static constexpr int BN = ap_shape<HD>::BN;
    static constexpr int LDQ = ap_shape<HD>::LDQ;
    static constexpr int ESIZE = ap_kv<KVD>::ESIZE;
    static constexpr int CPR = HD * ESIZE / 16;         /* 16-byte chunks per cache row */
    static constexpr int CHUNKS = BN * CPR;             /* 16-byte chunks per tile */
    static constexpr int NCH = (CHUNKS + AP_THREADS - 1) / AP_THREADS; /* per thread */
};

template <int HD> static constexpr size_t ap_smem_bytes(int esize_t)
{
    return (size_t)(AP_BM + 2 * ap_shape<HD>::BN) * ap_shape<HD>::LDQ * esize_t;
}

/* ---- element packing -------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t ap_bits(__half x)
{
    __half_raw r = x;
    return r.x;
}
__device__ __forceinline__ uint32_t ap_bits(__nv_bfloat16 x)
{
    __nv_bfloat16_raw r = x;
    return r.x;
}

/* Two floats rounded to T, packed low-first; *sum += their rounded values. */
template <typename T> __device__ __forceinline__ uint32_t ap_pack2(float a, float b, float *sum)
{
    T ta = ts_from_float<T>(a), tb = ts_from_float<T>(b);
    *sum += ts_to_float<T>(ta) + ts_to_float<T>(tb);
    return ap_bits(ta) | (ap_bits(tb) << 16);
}

/* ---- K/V tile staging ------------------------------------------------------------------- */

/* Issues this thread's 16-byte loads of one K or V tile: keys [n0, n0 + BN) of the
 * sequence (block table bt), kv head at byte offset head_off inside each pool block.
 * Keys at or past kv_lim read as zero (their blocks may not exist). */
template <int HD, enum kv_dtype KVD>
__device__ __forceinline__ void ap_load_tile(uint4 (&r)[ap_tile<HD, KVD>::NCH],
                                             const unsigned char *__restrict__ pool,
                                             int64_t blk_bytes, int64_t head_off,
                                             const int32_t *__restrict__ bt, int bs_shift, int n0,
                                             int kv_lim)
{
    typedef ap_tile<HD, KVD> G;
#pragma unroll
    for (int i = 0; i < G::NCH; i++) {
        int c = (int)threadIdx.x + i * AP_THREADS, row = c / G::CPR, col = c % G::CPR;
        int pos = n0 + row;
        if (G::CHUNKS % AP_THREADS != 0 && c >= G::CHUNKS) break;
        if (pos < kv_lim) {
            int64_t blk = bt[pos >> bs_shift];
            int off = pos & ((1 << bs_shift) - 1);
            r[i] = *((const uint4 *)(pool + blk * blk_bytes + head_off + (int64_t)off * HD * G::ESIZE) + col);
        } else {
            r[i] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* Stores the registers of ap_load_tile into a [BN][LDQ] tile of T (FP8: widened to F16). */
template <int HD, enum kv_dtype KVD>
__device__ __forceinline__ void ap_store_tile(typename ap_kv<KVD>::T *dst,
                                              const uint4 (&r)[ap_tile<HD, KVD>::NCH])
{
    typedef ap_tile<HD, KVD> G;
#pragma unroll
    for (int i = 0; i < G::NCH; i++) {
        int c = (int)threadIdx.x + i * AP_THREADS, row = c / G::CPR, col = c % G::CPR;
        if (G::CHUNKS % AP_THREADS != 0 && c >= G::CHUNKS) break;
        if (G::ESIZE == 2) {
            *(uint4 *)(dst + row * G::LDQ + col * 8) = r[i];
        } else {
            uint4 a, b;
            ts_e4m3x16_to_f16(r[i], a, b);
            uint4 *d = (uint4 *)(dst + row * G::LDQ + col * 16);
            d[0] = a;
            d[1] = b;
        }
    }
}

/* ---- one warp's tensor-core steps (16 query rows; ldmatrix + mma.sync m16n8k16) --------
 * Lane l = 4 g + t holds, of every m16n8 accumulator, rows g (elements 0, 1) and g + 8
 * (elements 2, 3) at columns 2t, 2t + 1 (ts_mma_d_at). The accumulators of S for keys
 * [16 k, 16 k + 16) hold exactly the elements of P's A registers for that k step (rows g,
 * g + 8; columns 2t, 2t + 1, then 8 more), so P is rounded and packed in registers and
 * never touches shared memory; each lane's softmax rows are g and g + 8. */
template <int HD, typename T> struct ap_warp {
    static constexpr int BN = ap_shape<HD>::BN, LDQ = ap_shape<HD>::LDQ;
    typedef uint32_t q_t[HD / 16][4]; /* Q's A registers, one per 16 head_dim columns */
    typedef float s_t[BN / 8][4];     /* S of one key tile, 8 keys per accumulator */
    typedef uint32_t p_t[BN / 16][4]; /* P's A registers, one per 16 keys */
    typedef float o_t[HD / 8][4];     /* O, 8 head_dim columns per accumulator */

    /* qf = the warp's 16 rows of Q (qw = &Qs[16 warp][0]) */
    static __device__ __forceinline__ void load_q(q_t &qf, const T *qw, int lane)
    {
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) ts_ldmatrix_x4(qf[kk], qw + (lane & 15) * LDQ + kk * 16 + 8 * (lane >> 4));
    }

    /* acc[2n], acc[2n + 1] += a[kk] B(kk, n) for every 16-deep step kk of a and 16-wide
     * column step n of acc: this lane's ldmatrix row of the 16 x 16 tile B(kk, n) is at
     * b + kk * kstride + n * nstride (TRANS: B row-major, read by ldmatrix.trans; else B's
     * columns are the rows, plain ldmatrix). */
    template <bool TRANS, int KS, int N8>
    static __device__ __forceinline__ void mma_steps(float (&acc)[N8][4], const uint32_t (&a)[KS][4], const T *b,
                                                     int kstride, int nstride)
    {
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int n = 0; n < N8 / 2; n++) {
                uint32_t r[4];
                if (TRANS) ts_ldmatrix_x4_trans(r, b + kk * kstride + n * nstride);
                else ts_ldmatrix_x4(r, b + kk * kstride + n * nstride);
                ts_mma_16816<T>(acc[2 * n], a[kk], r[0], r[1]);
                ts_mma_16816<T>(acc[2 * n + 1], a[kk], r[2], r[3]);
            }
    }

    /* s = Q K^T for the tile in ks ([BN][LDQ], keys as rows: B column-major) */
    static __device__ __forceinline__ void scores(s_t &s, const q_t &qf, const T *ks, int lane)
    {
#pragma unroll
        for (int n = 0; n < BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        mma_steps<false>(s, qf, ks + ((lane & 7) + 8 * (lane >> 4)) * LDQ + 8 * ((lane >> 3) & 1), 16, 16 * LDQ);
    }

    /* o += P V for the tile in vs ([BN][LDQ], keys as rows: B row-major) */
    static __device__ __forceinline__ void pv(o_t &o, const p_t &p, const T *vs, int lane)
    {
        mma_steps<true>(o, p, vs + (lane & 15) * LDQ + 8 * (lane >> 4), 16 * LDQ, 16);
    }
};

/* The online softmax of one lane's two rows (r = 0: row g, 1: row g + 8) over one key
 * tile starting at key n0: masks keys at or past lim[r], moves the reference max m_ref[r]
 * when the tile's max exceeds it by more than AP_TAU (lazy rescaling: alpha[r] is then the
 * factor for O and the row sum, else 1), rounds P = exp2(score - m_ref) to T into its A
 * registers and adds the rounded values to l[r]. The 4 lanes of a row (t = 0..3) agree on
 * its max through two shuffles, so they make the same choices. */
template <int HD, typename T>
__device__ __forceinline__ void ap_softmax(typename ap_warp<HD, T>::p_t &p, typename ap_warp<HD, T>::s_t &s,
                                           float (&m_ref)[2], float (&l)[2], float (&alpha)[2], int n0,
                                           const int (&lim)[2], float qk_scale_log2, int lane)
{
    constexpr int BN = ap_warp<HD, T>::BN;
    float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int row, col;
            ts_mma_d_at(lane, j, row, col);
            const int r = row >> 3;
            s[n][j] = n0 + 8 * n + col < lim[r] ? s[n][j] * qk_scale_log2 : -INFINITY;
            mx[r] = fmaxf(mx[r], s[n][j]);
        }
    float mbase[2], psum[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(TS_FULL_MASK, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(TS_FULL_MASK, mx[r], 2));
        alpha[r] = 1.0f;
        if (mx[r] > m_ref[r] + AP_TAU) { /* also the first visible keys (m_ref = -inf: O is 0) */
            if (m_ref[r] != -INFINITY) alpha[r] = exp2f(m_ref[r] - mx[r]);
            m_ref[r] = mx[r];
        }
        mbase[r] = m_ref[r] == -INFINITY ? 0.0f : m_ref[r]; /* nothing visible yet: P = 0 */
    }
    /* A registers of k step kk: {row g, keys 2t..}, {row g + 8, 2t..}, then both at 8 + 2t */
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float *e = &s[2 * kk + h][2 * r];
                p[kk][2 * h + r] = ap_pack2<T>(exp2f(e[0] - mbase[r]), exp2f(e[1] - mbase[r]), &psum[r]);
            }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + psum[r];
}

/* One output element pair (columns col, col + 1 of flattened row rf) scaled and stored. */
__device__ __forceinline__ void ap_store2(void *out, int out_dtype, int64_t o, float a, float b)
{
    float unused = 0.0f;
    if (out_dtype == DT_F32)
        *(float2 *)((float *)out + o) = make_float2(a, b);
    else if (out_dtype == DT_F16)
        *(uint32_t *)((__half *)out + o) = ap_pack2<__half>(a, b, &unused);
    else
        *(uint32_t *)((__nv_bfloat16 *)out + o) = ap_pack2<__nv_bfloat16>(a, b, &unused);
}

/* ---- the kernel ------------------------------------------------------------------------- */

/* out_dtype: DT_F32/DT_F16/DT_BF16 (checked by the launcher). qk_scale_log2 = scale *
 * log2(e) (* k_scale for FP8); out_scale = 1 (v_scale for FP8). */
template <int HD, enum kv_dtype KVD>
__global__ void __launch_bounds__(AP_THREADS, AP_MIN_BLOCKS)
attention_prefill_kernel(void *__restrict__ out,                 // [num_tokens][n_heads][HD]
                         int out_dtype,
                         const float *__restrict__ q,            // [num_tokens][q_stride]
                         int64_t q_stride,
                         const unsigned char *__restrict__ pool, // [num_blocks][2][n_kv_heads][bs][HD]
                         int n_kv_heads, int bs_shift, float qk_scale_log2, float out_scale,
                         const int32_t *__restrict__ query_start,  // [num_seqs + 1]
                         const int32_t *__restrict__ seq_lens,     // [num_seqs]
                         const int32_t *__restrict__ block_tables, // [num_seqs][max_blocks_per_seq]
                         int max_blocks_per_seq, int num_seqs, int n_heads, int group)
{
    typedef typename ap_kv<KVD>::T T;
    typedef ap_tile<HD, KVD> G;
    typedef ap_warp<HD, T> W;
    constexpr int BN = W::BN, LDQ = W::LDQ;

    TS_DYNAMIC_SHARED(unsigned char, smem);
    T *Qs = (T *)smem;        /* [BM][LDQ] */
    T *Ks = Qs + AP_BM * LDQ; /* [BN][LDQ] */
    T *Vs = Ks + BN * LDQ;    /* [BN][LDQ] */

    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int kvh = (int)blockIdx.y;

    /* which sequence and tile (file comment): the last s with tile_start(s) <= b, rows
     * counted from the call's first row qbase (0 unless a decode kernel took the rows
     * before it: kernels/attention_prefill.h) */
    const int b = (int)(gridDim.x - 1 - blockIdx.x);
    const int qbase = query_start[0];
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if ((int)((int64_t)(query_start[mid] - qbase) * group / AP_BM) + mid <= b) lo = mid;
        else hi = mid - 1;
    }
    const int s = lo;
    const int q0 = query_start[s], q_len = query_start[s + 1] - q0;
    const int rows = q_len * group;
    const int r0 = (b - ((int)((int64_t)(q0 - qbase) * group / AP_BM) + s)) * AP_BM;
    if (r0 >= rows) return; /* the spare index of this sequence (uniform: before any barrier) */

    const int ctx0 = seq_lens[s] - q_len + 1;           /* context of the first query row */
    const int r_last = min(r0 + AP_BM, rows) - 1;
    const int kv_lim = ctx0 + r_last / group;           /* causal limit of the tile's last row */
    const int ntiles = (kv_lim + BN - 1) / BN;
    const int32_t *bt = block_tables + (int64_t)s * max_blocks_per_seq;
    const int64_t head_bytes = ((int64_t)HD * G::ESIZE) << bs_shift; /* one (block, k|v, head) */
    const int64_t blk_bytes = 2 * n_kv_heads * head_bytes;
    const int64_t k_off = kvh * head_bytes, v_off = (n_kv_heads + kvh) * head_bytes;

    uint4 rkv[G::NCH]; /* the next K (then V) tile in flight */
    ap_load_tile<HD, KVD>(rkv, pool, blk_bytes, k_off, bt, bs_shift, 0, kv_lim);

    /* Q tile -> T: CTA row r is flattened row r0 + r (zero past the sequence's rows) */
#pragma unroll 4
    for (int i = 0; i < AP_BM * HD / 4 / AP_THREADS; i++) {
        int c = tid + i * AP_THREADS, row = c / (HD / 4), col = c % (HD / 4);
        int rf = r0 + row;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (rf < rows) {
            int tok = q0 + rf / group, h = kvh * group + rf % group;
            v = *(const float4 *)(q + (int64_t)tok * q_stride + (int64_t)h * HD + col * 4);
        }
        float unused = 0.0f;
        uint2 p;
        p.x = ap_pack2<T>(v.x, v.y, &unused);
        p.y = ap_pack2<T>(v.z, v.w, &unused);
        *(uint2 *)(Qs + row * LDQ + col * 4) = p;
    }
    ap_store_tile<HD, KVD>(Ks, rkv);
    ap_load_tile<HD, KVD>(rkv, pool, blk_bytes, v_off, bt, bs_shift, 0, kv_lim);
    ap_store_tile<HD, KVD>(Vs, rkv);

    /* this lane's two softmax rows (accumulator elements 0-1 and 2-3) and its first column */
    int rf_mine[2], lim[2], my_col; /* lim: keys [0, lim) visible */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        ts_mma_d_at(lane, 2 * r, rf_mine[r], my_col);
        rf_mine[r] += r0 + warp * 16;
        lim[r] = rf_mine[r] < rows ? ctx0 + rf_mine[r] / group : 0;
    }
    float m_ref[2] = { -INFINITY, -INFINITY }; /* reference max (log2 units) that P is relative to */
    float l[2] = { 0.0f, 0.0f };                /* this lane's part of the row sums of rounded P */

    typename W::o_t o = {};
    typename W::q_t qf;
    __syncthreads();
    W::load_q(qf, Qs + warp * 16 * LDQ, lane);

    for (int j = 0; j < ntiles; j++) {
        const int n0 = j * BN;
        const bool more = j + 1 < ntiles;
        if (more) ap_load_tile<HD, KVD>(rkv, pool, blk_bytes, k_off, bt, bs_shift, n0 + BN, kv_lim);

        typename W::s_t sc;
        W::scores(sc, qf, Ks, lane);
        __syncthreads(); /* every warp is done with Ks */
        if (more) {
            ap_store_tile<HD, KVD>(Ks, rkv);
            ap_load_tile<HD, KVD>(rkv, pool, blk_bytes, v_off, bt, bs_shift, n0 + BN, kv_lim);
        }

        typename W::p_t p;
        float alpha[2];
        ap_softmax<HD, T>(p, sc, m_ref, l, alpha, n0, lim, qk_scale_log2, lane);
        if (alpha[0] != 1.0f || alpha[1] != 1.0f) { /* rare: a row's reference max moved */
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) o[n][j] *= alpha[j >> 1];
        }
        W::pv(o, p, Vs, lane);
        __syncthreads(); /* every warp is done with Vs; Ks holds tile j+1 */
        if (more) ap_store_tile<HD, KVD>(Vs, rkv);
    }

    /* epilogue: out = O * out_scale / sum; a row's 4 lanes hold a quarter of its sum each */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(TS_FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(TS_FULL_MASK, l[r], 2);
        if (rf_mine[r] >= rows) continue;
        const float inv = out_scale / l[r];
        const int64_t obase =
            ((int64_t)(q0 + rf_mine[r] / group) * n_heads + kvh * group + rf_mine[r] % group) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            ap_store2(out, out_dtype, obase + 8 * n + my_col, o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
}

/* ---- launcher --------------------------------------------------------------------------- */

struct ap_args {
    void *out;
    int out_dtype;
    const float *q;
    int64_t q_stride;
    const struct kv_layer *kv;
    const int32_t *query_start, *seq_lens, *block_tables;
    int max_blocks_per_seq, num_seqs, num_tokens, n_heads, group, bs_shift;
    float scale;
    cudaStream_t stream;
};

template <int HD, enum kv_dtype KVD> static int ap_launch(const ap_args &a)
{
    const size_t smem = ap_smem_bytes<HD>(sizeof(typename ap_kv<KVD>::T));
    auto *prefill_kernel = attention_prefill_kernel<HD, KVD>;
    /* per call, not cached: the attribute is per device, and one process drives several */
    cudaError_t e = cudaFuncSetAttribute((const void *)prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return (int)e;
    const int fp8 = KVD == KV_FP8_E4M3;
    const float qk_scale_log2 = a.scale * (fp8 ? a.kv->k_scale : 1.0f) * 1.4426950408889634f;
    const float out_scale = fp8 ? a.kv->v_scale : 1.0f;
    dim3 grid((unsigned)((int64_t)a.num_tokens * a.group / AP_BM + a.num_seqs), (unsigned)a.kv->n_kv_heads);
    TS_LAUNCH(prefill_kernel, grid, AP_THREADS, smem, a.stream, a.out, a.out_dtype, a.q, a.q_stride,
              (const unsigned char *)a.kv->data, a.kv->n_kv_heads, a.bs_shift, qk_scale_log2, out_scale,
              a.query_start, a.seq_lens, a.block_tables, a.max_blocks_per_seq, a.num_seqs, a.n_heads,
              a.group);
    return TS_LAUNCH_RESULT();
}

template <int HD> static int ap_dispatch_kv(const ap_args &a)
{
    switch (a.kv->dtype) {
    case KV_F16: return ap_launch<HD, KV_F16>(a);
    case KV_BF16: return ap_launch<HD, KV_BF16>(a);
    case KV_FP8_E4M3: return ap_launch<HD, KV_FP8_E4M3>(a);
    default: return (int)cudaErrorInvalidValue; /* KV_F32: no tensor-core path */
    }
}

extern "C" int cuda_attention_prefill(void *out, enum dtype out_dtype, const float *q, int64_t q_stride,
                                      const struct kv_layer *kv, const int32_t *query_start,
                                      const int32_t *seq_lens, const int32_t *block_tables,
                                      int max_blocks_per_seq, int num_seqs, int num_tokens, int n_heads,
                                      float scale, cudaStream_t stream)
{
    if (!kv || num_tokens < 0) return (int)cudaErrorInvalidValue;
    if (num_tokens == 0) return 0;
    switch (out_dtype) {
    case DT_F32:
    case DT_F16:
    case DT_BF16: break;
    default: return (int)cudaErrorInvalidValue;
    }
    int bs_shift = 0;
    while (bs_shift < 30 && (1 << bs_shift) < kv->block_size) bs_shift++;
    if (kv->block_size <= 0 || (1 << bs_shift) != kv->block_size) return (int)cudaErrorInvalidValue;
    if (num_seqs <= 0 || kv->n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv->n_kv_heads != 0 ||
        max_blocks_per_seq <= 0)
        return (int)cudaErrorInvalidValue;
    const int group = n_heads / kv->n_kv_heads;
    /* flattened (token, head-in-group) rows and the grid stay in int range */
    if ((int64_t)num_tokens * group + (int64_t)num_seqs * AP_BM >= INT_MAX || kv->n_kv_heads > 65535)
        return (int)cudaErrorInvalidValue;
    if (q_stride < (int64_t)n_heads * kv->head_dim || q_stride % 4 != 0 || ((uintptr_t)q & 15) ||
        ((uintptr_t)out & 15) || ((uintptr_t)kv->data & 15))
        return (int)cudaErrorInvalidValue;
    ap_args a = { out, (int)out_dtype, q, q_stride, kv, query_start, seq_lens, block_tables,
                  max_blocks_per_seq, num_seqs, num_tokens, n_heads, group, bs_shift, scale, stream };
    switch (kv->head_dim) {
    case 64: return ap_dispatch_kv<64>(a);
    case 96: return ap_dispatch_kv<96>(a);
    case 128: return ap_dispatch_kv<128>(a);
    default: return (int)cudaErrorInvalidValue;
    }
}
