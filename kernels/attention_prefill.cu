/* attention_prefill.cu — causal varlen paged attention for prefill and chunked prefill,
 * flash-attention style on the tensor cores (nvcuda::wmma 16x16x16, F32 accumulate).
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
 *   tile_start(s) = floor(query_start[s] * group / BM) + s,
 * which leaves room for its ceil(q_len * group / BM) tiles (at most one index per
 * sequence is left over and exits at once); each CTA finds its s by a binary search of
 * query_start. Block indices run backwards, so within a sequence the tiles that see the
 * most context (its last rows) start first and the light ones fill the tail.
 *
 * Per CTA: the Q tile is converted once to the 16-bit compute type T (F16 for F16 and FP8
 * caches, BF16 for BF16 caches) into shared memory. The kernel then walks the context in
 * tiles of BN = 64 keys up to the causal limit of its last row
 * (causal tile skipping: no work past it; the partial last tile is masked per row).
 * Each K/V tile is gathered from the paged pool with 16-byte loads (16 threads per 256-byte
 * cache row: coalesced; the block-table lookup is a shift and a mask, block_size being a
 * power of two), keys past the limit read as zero (never from beyond the sequence's
 * blocks), FP8 codes are widened to F16 on the way into shared memory (exact; the scales
 * are applied in F32). Tile j+1 is loaded into registers while tile j is computed (K
 * during S = Q·K^T, V during the softmax and P·V) and stored after the barrier that ends
 * the reads of tile j: one K and one V buffer, two barriers per tile.
 * Warp w owns query rows [16w, 16w+16): S = Q·K^T by wmma into a per-warp F32 strip of
 * shared memory; the online softmax runs on that strip (lane = (row, half of the keys),
 * exp2 with the scale folded, shuffle max over the two halves); P is rounded to T into
 * shared memory and O += P·V by wmma, O held in accumulator fragments all along.
 * Rescaling O needs its rows, which a wmma fragment does not expose, so it goes through
 * the F32 strip — and only when some row's maximum grew by more than AP_TAU (log2 units,
 * a factor 256) since the reference max was last set (lazy rescaling, as FlashAttention-4
 * does): P is then bounded by 2^AP_TAU, harmless in F16/BF16 and F32, and the rescale
 * round trip is rare in practice. The row sum adds the rounded P, so the weights that
 * multiply V are exactly normalised. The epilogue scales by v_scale / sum and writes the
 * activation dtype (F32/F16/BF16) with 16-byte stores.
 *
 * Shared memory (head_dim 128): Q 17 KB + K 17 KB + V 17 KB + S 17 KB + P 9 KB = 77 KB
 * per CTA, two CTAs per SM. No T x T score matrix exists anywhere.
 */
#include "common.cuh"

#include "attention_prefill.h"

#include <limits.h>

using namespace nvcuda;

/* 4 warps (64 query rows) per CTA; -DAP_WARPS=8 builds the 128-row variant to compare on
 * a GPU (every size below follows from it). */
#ifndef AP_WARPS
#define AP_WARPS 4
#endif
#define AP_THREADS (32 * AP_WARPS)
#define AP_MIN_BLOCKS (AP_WARPS >= 8 ? 1 : 2) /* CTAs per SM: ~250 registers per thread */
#define AP_BM (16 * AP_WARPS) /* query rows (token, head-in-group) per CTA */
#define AP_TAU 8.0f           /* lazy-rescale threshold, log2 units */

/* Tile geometry for one head_dim (all smem strides padded by 16 bytes: conflict-free
 * 16-byte row accesses, and every wmma tile origin stays 32-byte aligned). */
template <int HD> struct ap_shape {
    static constexpr int BN = 64;                  /* keys per K/V tile */
    static constexpr int LDQ = HD + 8;             /* 16-bit elements per Q/K/V smem row */
    static constexpr int LDS = BN + 4;             /* floats per S / O-staging smem row */
    static constexpr int LDP = BN + 8;             /* 16-bit elements per P smem row */
    static constexpr int OC = HD % BN == 0 ? BN : 32; /* O columns staged at a time (<= BN) */
    static_assert(HD % 32 == 0 && HD % OC == 0 && OC <= BN, "head_dim layout");
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
    return (size_t)(AP_BM + 2 * ap_shape<HD>::BN) * ap_shape<HD>::LDQ * esize_t +
           (size_t)AP_BM * ap_shape<HD>::LDS * sizeof(float) +
           (size_t)AP_BM * ap_shape<HD>::LDP * esize_t;
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

/* Two e4m3 codes (low byte first) -> two F16 values, packed low-first. */
__device__ __forceinline__ uint32_t ap_e4m3x2(uint32_t two)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
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
            a.x = ap_e4m3x2(r[i].x);
            a.y = ap_e4m3x2(r[i].x >> 16);
            a.z = ap_e4m3x2(r[i].y);
            a.w = ap_e4m3x2(r[i].y >> 16);
            b.x = ap_e4m3x2(r[i].z);
            b.y = ap_e4m3x2(r[i].z >> 16);
            b.z = ap_e4m3x2(r[i].w);
            b.w = ap_e4m3x2(r[i].w >> 16);
            uint4 *d = (uint4 *)(dst + row * G::LDQ + col * 16);
            d[0] = a;
            d[1] = b;
        }
    }
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
    typedef ap_shape<HD> S;
    typedef ap_tile<HD, KVD> G;
    constexpr int BN = S::BN, LDQ = S::LDQ, LDS = S::LDS, LDP = S::LDP, OC = S::OC;

    TS_DYNAMIC_SHARED(unsigned char, smem);
    T *Qs = (T *)smem;                   /* [BM][LDQ] */
    T *Ks = Qs + AP_BM * LDQ;            /* [BN][LDQ] */
    T *Vs = Ks + BN * LDQ;               /* [BN][LDQ] */
    float *Ss = (float *)(Vs + BN * LDQ); /* [BM][LDS]: S, then O staging, per warp strip */
    T *Ps = (T *)(Ss + AP_BM * LDS);     /* [BM][LDP] */

    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int kvh = (int)blockIdx.y;

    /* which sequence and tile (file comment): the last s with tile_start(s) <= b */
    const int b = (int)(gridDim.x - 1 - blockIdx.x);
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if ((int)((int64_t)query_start[mid] * group / AP_BM) + mid <= b) lo = mid;
        else hi = mid - 1;
    }
    const int s = lo;
    const int q0 = query_start[s], q_len = query_start[s + 1] - q0;
    const int rows = q_len * group;
    const int r0 = (b - ((int)((int64_t)q0 * group / AP_BM) + s)) * AP_BM;
    if (r0 >= rows) return; /* the spare index of this sequence (uniform: before any barrier) */

    const int ctx0 = seq_lens[s] - q_len + 1;           /* context of the first query row */
    const int r_last = min(r0 + AP_BM, rows) - 1;
    const int kv_lim = ctx0 + r_last / group;           /* causal limit of the tile's last row */
    const int ntiles = (kv_lim + BN - 1) / BN;
    const int32_t *bt = block_tables + (int64_t)s * max_blocks_per_seq;
    const int64_t head_bytes = ((int64_t)HD * G::ESIZE) << bs_shift; /* one (block, k|v, head) */
    const int64_t blk_bytes = 2 * n_kv_heads * head_bytes;
    const int64_t k_off = kvh * head_bytes, v_off = (n_kv_heads + kvh) * head_bytes;

    uint4 rk[G::NCH], rv[G::NCH];
    ap_load_tile<HD, KVD>(rk, pool, blk_bytes, k_off, bt, bs_shift, 0, kv_lim);
    ap_load_tile<HD, KVD>(rv, pool, blk_bytes, v_off, bt, bs_shift, 0, kv_lim);

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
    ap_store_tile<HD, KVD>(Ks, rk);
    ap_store_tile<HD, KVD>(Vs, rv);

    /* this lane's softmax row (of the warp's 16) and half of the keys */
    const int my_row = lane & 15, half = lane >> 4;
    const int rf_mine = r0 + warp * 16 + my_row;
    const int lim = rf_mine < rows ? ctx0 + rf_mine / group : 0; /* keys [0, lim) visible */
    float m_ref = -INFINITY; /* reference max (log2 units) that P is relative to */
    float l = 0.0f;          /* this half-row's sum of rounded P */

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(oacc[n], 0.0f);

    float *Sw = Ss + warp * 16 * LDS;      /* this warp's F32 strip [16][LDS] */
    T *Pw = Ps + warp * 16 * LDP;          /* this warp's P strip [16][LDP] */
    const T *Qw = Qs + warp * 16 * LDQ;
    __syncthreads();

    for (int j = 0; j < ntiles; j++) {
        const int n0 = j * BN;
        const bool more = j + 1 < ntiles;
        if (more) ap_load_tile<HD, KVD>(rk, pool, blk_bytes, k_off, bt, bs_shift, n0 + BN, kv_lim);

        /* S = Q K^T for this warp's 16 rows */
        {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc[BN / 16];
#pragma unroll
            for (int n = 0; n < BN / 16; n++) wmma::fill_fragment(sacc[n], 0.0f);
            /* the k loops of both products are unrolled only partly (2 here, 1 for P·V):
             * that keeps the fragment loads the compiler hoists within 255 registers
             * (-Xptxas -v: full unrolling spills at head_dim 128 BF16); each step still
             * has BN/16 or HD/16 independent MMAs */
#pragma unroll 2
            for (int kk = 0; kk < HD / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qa;
                wmma::load_matrix_sync(qa, Qw + kk * 16, LDQ);
#pragma unroll
                for (int n = 0; n < BN / 16; n++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kb;
                    wmma::load_matrix_sync(kb, Ks + n * 16 * LDQ + kk * 16, LDQ);
                    wmma::mma_sync(sacc[n], qa, kb, sacc[n]);
                }
            }
#pragma unroll
            for (int n = 0; n < BN / 16; n++)
                wmma::store_matrix_sync(Sw + n * 16, sacc[n], LDS, wmma::mem_row_major);
        }
        __syncthreads(); /* every warp is done with Ks (and its S strip is written) */
        if (more) {
            ap_store_tile<HD, KVD>(Ks, rk);
            ap_load_tile<HD, KVD>(rv, pool, blk_bytes, v_off, bt, bs_shift, n0 + BN, kv_lim);
        }

        /* online softmax over this lane's BN/2 keys of its row */
        float x[BN / 2];
        {
            const float *srow = Sw + my_row * LDS + half * (BN / 2);
#pragma unroll
            for (int i = 0; i < BN / 8; i++) {
                float4 v = *(const float4 *)(srow + 4 * i);
                x[4 * i] = v.x;
                x[4 * i + 1] = v.y;
                x[4 * i + 2] = v.z;
                x[4 * i + 3] = v.w;
            }
        }
        float mx = -INFINITY;
        const int key0 = n0 + half * (BN / 2);
#pragma unroll
        for (int c = 0; c < BN / 2; c++) {
            x[c] = key0 + c < lim ? x[c] * qk_scale_log2 : -INFINITY;
            mx = fmaxf(mx, x[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(TS_FULL_MASK, mx, 16));
        float alpha = 1.0f;
        if (mx > m_ref + AP_TAU) { /* also the first visible keys (m_ref = -inf: O is 0) */
            if (m_ref != -INFINITY) alpha = exp2f(m_ref - mx);
            m_ref = mx;
        }
        const float mbase = m_ref == -INFINITY ? 0.0f : m_ref; /* nothing visible yet: P = 0 */
        float psum = 0.0f;
        T *prow = Pw + my_row * LDP + half * (BN / 2);
#pragma unroll
        for (int c = 0; c < BN / 2; c += 8) {
            uint4 p;
            p.x = ap_pack2<T>(exp2f(x[c] - mbase), exp2f(x[c + 1] - mbase), &psum);
            p.y = ap_pack2<T>(exp2f(x[c + 2] - mbase), exp2f(x[c + 3] - mbase), &psum);
            p.z = ap_pack2<T>(exp2f(x[c + 4] - mbase), exp2f(x[c + 5] - mbase), &psum);
            p.w = ap_pack2<T>(exp2f(x[c + 6] - mbase), exp2f(x[c + 7] - mbase), &psum);
            *(uint4 *)(prow + c) = p;
        }
        l = l * alpha + psum;

        /* rare: some row's reference max moved; rescale O rows through the F32 strip */
        if (__any_sync(TS_FULL_MASK, alpha != 1.0f)) {
#pragma unroll
            for (int c = 0; c < HD / OC; c++) {
                __syncwarp(); /* the strip's previous contents are read */
#pragma unroll
                for (int f = 0; f < OC / 16; f++)
                    wmma::store_matrix_sync(Sw + f * 16, oacc[c * (OC / 16) + f], LDS, wmma::mem_row_major);
                __syncwarp();
                float *orow = Sw + my_row * LDS + half * (OC / 2);
#pragma unroll
                for (int i = 0; i < OC / 8; i++) {
                    float4 v = *(float4 *)(orow + 4 * i);
                    v.x *= alpha;
                    v.y *= alpha;
                    v.z *= alpha;
                    v.w *= alpha;
                    *(float4 *)(orow + 4 * i) = v;
                }
                __syncwarp();
#pragma unroll
                for (int f = 0; f < OC / 16; f++)
                    wmma::load_matrix_sync(oacc[c * (OC / 16) + f], Sw + f * 16, LDS, wmma::mem_row_major);
            }
        }
        __syncwarp(); /* P strip written by all lanes */

        /* O += P V */
#pragma unroll 1
        for (int kk = 0; kk < BN / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa;
            wmma::load_matrix_sync(pa, Pw + kk * 16, LDP);
#pragma unroll
            for (int n = 0; n < HD / 16; n++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vb;
                wmma::load_matrix_sync(vb, Vs + kk * 16 * LDQ + n * 16, LDQ);
                wmma::mma_sync(oacc[n], pa, vb, oacc[n]);
            }
        }
        __syncthreads(); /* every warp is done with Vs; Ks holds tile j+1 */
        if (more) ap_store_tile<HD, KVD>(Vs, rv);
    }

    /* epilogue: out = O * out_scale / sum, through the F32 strip, OC columns at a time */
    l += __shfl_xor_sync(TS_FULL_MASK, l, 16);
    const float inv = out_scale / l;
    int64_t obase = 0;
    if (rf_mine < rows)
        obase = ((int64_t)(q0 + rf_mine / group) * n_heads + kvh * group + rf_mine % group) * HD;
#pragma unroll
    for (int c = 0; c < HD / OC; c++) {
        __syncwarp();
#pragma unroll
        for (int f = 0; f < OC / 16; f++)
            wmma::store_matrix_sync(Sw + f * 16, oacc[c * (OC / 16) + f], LDS, wmma::mem_row_major);
        __syncwarp();
        if (rf_mine < rows) {
            const float *orow = Sw + my_row * LDS + half * (OC / 2);
            const int64_t o = obase + c * OC + half * (OC / 2);
            if (out_dtype == DT_F32) {
                float4 *dst = (float4 *)((float *)out + o);
#pragma unroll
                for (int i = 0; i < OC / 8; i++) {
                    float4 v = *(const float4 *)(orow + 4 * i);
                    v.x *= inv;
                    v.y *= inv;
                    v.z *= inv;
                    v.w *= inv;
                    dst[i] = v;
                }
            } else {
                float unused = 0.0f;
                uint4 *dst = out_dtype == DT_F16 ? (uint4 *)((__half *)out + o)
                                                 : (uint4 *)((__nv_bfloat16 *)out + o);
#pragma unroll
                for (int i = 0; i < OC / 16; i++) {
                    const float *v = orow + 8 * i;
                    uint4 p;
                    if (out_dtype == DT_F16) {
                        p.x = ap_pack2<__half>(v[0] * inv, v[1] * inv, &unused);
                        p.y = ap_pack2<__half>(v[2] * inv, v[3] * inv, &unused);
                        p.z = ap_pack2<__half>(v[4] * inv, v[5] * inv, &unused);
                        p.w = ap_pack2<__half>(v[6] * inv, v[7] * inv, &unused);
                    } else {
                        p.x = ap_pack2<__nv_bfloat16>(v[0] * inv, v[1] * inv, &unused);
                        p.y = ap_pack2<__nv_bfloat16>(v[2] * inv, v[3] * inv, &unused);
                        p.z = ap_pack2<__nv_bfloat16>(v[4] * inv, v[5] * inv, &unused);
                        p.w = ap_pack2<__nv_bfloat16>(v[6] * inv, v[7] * inv, &unused);
                    }
                    dst[i] = p;
                }
            }
        }
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
    auto *kernel = attention_prefill_kernel<HD, KVD>;
    /* per call, not cached: the attribute is per device, and one process drives several */
    cudaError_t e = cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return (int)e;
    const int fp8 = KVD == KV_FP8_E4M3;
    const float qk_scale_log2 = a.scale * (fp8 ? a.kv->k_scale : 1.0f) * 1.4426950408889634f;
    const float out_scale = fp8 ? a.kv->v_scale : 1.0f;
    dim3 grid((unsigned)((int64_t)a.num_tokens * a.group / AP_BM + a.num_seqs), (unsigned)a.kv->n_kv_heads);
    TS_LAUNCH(kernel, grid, AP_THREADS, smem, a.stream, a.out, a.out_dtype, a.q, a.q_stride,
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
