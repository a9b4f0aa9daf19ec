/* attention_decode.cu — paged attention for decode steps (one query row per sequence).
 *
 * Math (cpu_paged_attention with query_start = {0, 1, ..., num_seqs}): for sequence s with
 * ctx = seq_lens[s] context positions and query head h of kv head g = h / G
 * (G = n_heads / n_kv_heads):
 *   S[h][t] = q[s][h] . K[g][t] * scale,   out[s][h] = sum_t softmax_t(S[h][:]) V[g][t]
 * softmax in F32. K/V rows come from the paged pool
 * [num_blocks][2 (k, v)][n_kv_heads][block_size][head_dim], position t in block
 * block_tables[s][t / block_size] at offset t % block_size.
 *
 * Parallelisation. One thread block (4 warps) per (sequence, kv head, partition): the
 * block computes all G query heads of that kv head at once (up to ROWS = 8 or 16, chosen
 * by the launcher: 8 for groups of up to 8; larger groups take several blocks), so each
 * K/V byte of the partition is read from memory exactly once.
 * The partition's positions are streamed in tiles of TILE positions (64; 128 when
 * head_dim <= 64):
 *   - loads: every thread issues TILE * head_dim * elem / 16 / 128 coalesced 16-byte loads
 *     per tile (the [block_size][head_dim] chunk of one (block, kv head) is contiguous),
 *     into registers ahead of use (the V tile while Q.K^T runs, the next K tile while P.V
 *     runs; FP8, whose tiles are half the bytes, keeps two tiles in flight), then stores
 *     them to shared memory — converting FP8 e4m3 codes to F16 on the way
 *     (ts_e4m3x16_to_f16: sm_89+'s cvt.rn.f16x2.e4m3x2, one instruction per two codes;
 *     exact, every e4m3 value is an f16 value; k_scale / v_scale are folded into the
 *     scores and the output); positions past the context are zero-filled and never read
 *     from the pool.
 *   - S = Q K^T on tensor cores (ldmatrix + mma.sync m16n8k16, F32 accumulate; ad_mma,
 *     ad_geom). ROWS = 16: the G query rows (zero-padded to 16) as M times the tile's
 *     16-position subtiles, one subtile per warp. ROWS = 8: S^T = K Q^T, 32 positions
 *     (two M halves) times the heads (padded to 8) as N, so a group of 7
 *     fills 7/8 of every MMA instead of 7/16; the tile's two 32-position fragments take
 *     two warps each, each warp half of head_dim, their partial S added by the softmax.
 *     Q is split into two 16-bit terms (hi + lo, the cache's 16-bit type: BF16 for BF16
 *     caches, F16 for F16 and FP8), both multiplied, so scores keep ~16 (BF16) or ~22 (F16)
 *     significant bits — close to the CPU's F32 dot products, not a 16-bit rounding of q.
 *   - online softmax in F32 (base 2, log2(e) folded into the score scale), one warp per
 *     query row: each row keeps a reference maximum m and a sum l; a tile whose maximum
 *     exceeds m by more than 8 (a factor 2^8) raises m and rescales the row's l and O (O in
 *     registers: the accumulator layout says each element's row); otherwise
 *     p = 2^(s - m) <= 256 is used as is, so rescaling is rare.
 *   - O += P V on tensor cores (V through ldmatrix .trans; ROWS = 8: O^T = V^T P^T, 32
 *     head_dim columns per accumulator),
 *     P split into hi + lo like Q; each warp owns a slice of head_dim columns of O (its
 *     accumulator fragments); where there are fewer slices than warps (ROWS = 8 at
 *     head_dim 64), two warps share one, each over half the tile's positions, and the
 *     epilogue adds their partial O in a fixed order.
 * Split-K (flash-decoding): with few (sequence, kv head) pairs the context is cut into
 * partitions, one thread block each; each writes its unnormalised O, m and l to the
 * workspace and attention_decode_reduce_kernel (one thread block per (sequence, query
 * head), its warps taking every fourth partition) combines them:
 *   out = sum_p 2^(m_p - M) O_p / sum_p 2^(m_p - M) l_p,  M = max_p m_p.
 * Each sequence is split on its own (ad_split_of): into the partitions of partition_size
 * positions its context needs, at most max_partitions of them (the grid's x dimension;
 * past the cap the partitions grow), all of one size. The automatic cap fills one wave of
 * resident blocks (cuda_attention_decode_max_partitions):
 * a decode step's few sequences otherwise leave most multiprocessors idle while a handful
 * of blocks walk their contexts tile after tile, each tile a memory round trip. A sequence
 * whose context fits one partition is written directly by its block and skipped by the
 * reduce.
 *
 * CPU twin: cpu_paged_attention (src/backend/cpu/ops.c) over the same pool bytes.
 */
#include "common.cuh"
#include "quant.cuh"

#include "attention_decode.h"

namespace {

constexpr int AD_THREADS = 128;
constexpr int AD_WARPS = AD_THREADS / 32;
constexpr int AD_BLOCKS_PER_SM = 4;     /* resident blocks per SM: __launch_bounds__ caps registers at 128 */
constexpr int AD_MIN_PART = 64;         /* smallest automatic partition: one tile at head_dim 128 */
constexpr float AD_RESCALE_LOG2 = 8.0f; /* raise a row's reference max only past 2^8 */
constexpr float AD_LOG2E = 1.4426950408889634f;

/* The FP8 cache's element tag (its 16-bit compute type is F16). */
struct kv_fp8 {};

template <typename KV> struct kv_traits;
template <> struct kv_traits<__half> {
    typedef __half compute_t;
    static constexpr int esize = 2;
};
template <> struct kv_traits<__nv_bfloat16> {
    typedef __nv_bfloat16 compute_t;
    static constexpr int esize = 2;
};
template <> struct kv_traits<kv_fp8> {
    typedef __half compute_t;
    static constexpr int esize = 1;
};

/* How a thread block of ROWS query heads (8 or 16) feeds the tensor cores, with ldmatrix
 * and mma.sync m16n8k16 (ts_ldmatrix_x4(_trans), ts_mma_16816: common.cuh, whose register
 * layouts are documented; nvcc lowers BF16 wmma loads to generic 32-bit loads). A warp's
 * accumulator `acc_t` is two m16n8 tiles, float[2][4]; the fragments are cut so that the
 * heads fill a whole side:
 *   ROWS = 16: S = Q K^T and O = P V, the heads as M (16) times 16 positions / head_dim
 *              columns (two N = 8 halves);
 *   ROWS = 8:  S^T = K Q^T and O^T = V^T P^T, 32 positions / head_dim columns (two M = 16
 *              halves) times the heads as N (8). A group of 8 or fewer heads (Qwen2.5's 7,
 *              Llama 3's 4) then wastes no half of every MMA on zero rows: half the MMAs
 *              and ~40% fewer shared-memory fragment bytes per tile than at ROWS = 16.
 * Either way acc element (h, j) belongs to one (head, column) (at()), which the S and O
 * stores and the row rescaling use; g = lane / 4, t = lane % 4. Q and P come as hi and lo
 * 16-bit terms ([2][ROWS][pitch]), K and V as [position][column] rows (pitch kp). */
template <typename T, int ROWS> struct ad_mma;
template <typename T> struct ad_mma<T, 16> {
    typedef float acc_t[2][4];
    /* acc[h][j]: tile h's D(row, col) is head row, column 8 h + col */
    static __device__ __forceinline__ void at(int lane, int h, int j, int &head, int &col)
    {
        ts_mma_d_at(lane, j, head, col);
        col += 8 * h;
    }
    /* acc += Q[:, k0..k0+16) K[p0..p0+16, k0..k0+16)^T; q = &Q hi[0][k0], kv = &K[p0][k0] */
    static __device__ __forceinline__ void qk(acc_t &acc, const T *q, int q_lo, int qp, const T *kv, int kp,
                                              int lane)
    {
        uint32_t ah[4], al[4], b[4];
        const T *qr = q + (lane & 15) * qp + 8 * (lane >> 4);
        ts_ldmatrix_x4(ah, qr);
        ts_ldmatrix_x4(al, qr + q_lo);
        ts_ldmatrix_x4(b, kv + ((lane & 7) + 8 * (lane >> 4)) * kp + 8 * ((lane >> 3) & 1));
        ts_mma_16816<T>(acc[0], ah, b[0], b[1]);
        ts_mma_16816<T>(acc[0], al, b[0], b[1]);
        ts_mma_16816<T>(acc[1], ah, b[2], b[3]);
        ts_mma_16816<T>(acc[1], al, b[2], b[3]);
    }
    /* P's hi and lo A registers for positions k0..k0+16 (p = &P hi[0][k0]) */
    typedef uint32_t p_t[2][4];
    static __device__ __forceinline__ void load_p(p_t &pr, const T *p, int p_lo, int pp, int lane)
    {
        const T *r = p + (lane & 15) * pp + 8 * (lane >> 4);
        ts_ldmatrix_x4(pr[0], r);
        ts_ldmatrix_x4(pr[1], r + p_lo);
    }
    /* acc += P V[k0..k0+16, c0..c0+16); v = &V[k0][c0] */
    static __device__ __forceinline__ void pv(acc_t &acc, const p_t &pr, const T *v, int kp, int lane)
    {
        uint32_t b[4];
        ts_ldmatrix_x4_trans(b, v + (lane & 15) * kp + 8 * (lane >> 4));
        ts_mma_16816<T>(acc[0], pr[0], b[0], b[1]);
        ts_mma_16816<T>(acc[0], pr[1], b[0], b[1]);
        ts_mma_16816<T>(acc[1], pr[0], b[2], b[3]);
        ts_mma_16816<T>(acc[1], pr[1], b[2], b[3]);
    }
};
template <typename T> struct ad_mma<T, 8> {
    typedef float acc_t[2][4];
    /* acc[h][j]: tile h's D(row, col) is column 16 h + row, head col (transposed) */
    static __device__ __forceinline__ void at(int lane, int h, int j, int &head, int &col)
    {
        ts_mma_d_at(lane, j, col, head);
        col += 16 * h;
    }
    /* B registers of Q^T or P^T (8 heads of [head][k] rows, k0..k0+16): [0..1] hi, [2..3] lo */
    static __device__ __forceinline__ void load_b(uint32_t (&b)[4], const T *x, int x_lo, int xp, int lane)
    {
        ts_ldmatrix_x4(b, x + (lane >> 4) * x_lo + (lane & 7) * xp + 8 * ((lane >> 3) & 1));
    }
    /* acc += K[p0..p0+32, k0..k0+16) Q[:, k0..k0+16)^T */
    static __device__ __forceinline__ void qk(acc_t &acc, const T *q, int q_lo, int qp, const T *kv, int kp,
                                              int lane)
    {
        uint32_t b[4], a[4];
        load_b(b, q, q_lo, qp, lane);
#pragma unroll
        for (int m = 0; m < 2; m++) {
            ts_ldmatrix_x4(a, kv + (16 * m + (lane & 15)) * kp + 8 * (lane >> 4));
            ts_mma_16816<T>(acc[m], a, b[0], b[1]);
            ts_mma_16816<T>(acc[m], a, b[2], b[3]);
        }
    }
    typedef uint32_t p_t[4];
    static __device__ __forceinline__ void load_p(p_t &pr, const T *p, int p_lo, int pp, int lane)
    {
        load_b(pr, p, p_lo, pp, lane);
    }
    /* acc += V[k0..k0+16, c0..c0+32)^T P[:, k0..k0+16)^T; v = &V[k0][c0] */
    static __device__ __forceinline__ void pv(acc_t &acc, const p_t &pr, const T *v, int kp, int lane)
    {
        uint32_t a[4];
#pragma unroll
        for (int m = 0; m < 2; m++) {
            ts_ldmatrix_x4_trans(a, v + ((lane & 7) + 8 * (lane >> 4)) * kp + 16 * m + 8 * ((lane >> 3) & 1));
            ts_mma_16816<T>(acc[m], a, pr[0], pr[1]);
            ts_mma_16816<T>(acc[m], a, pr[2], pr[3]);
        }
    }
};

/* base[head][col] (pitch floats per head row) = scale * acc, through at() */
template <typename MMA>
__device__ __forceinline__ void ad_store_acc(float *base, int pitch, const typename MMA::acc_t &acc, float scale,
                                             int lane)
{
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int head, col;
            MMA::at(lane, h, j, head, col);
            base[head * pitch + col] = scale * acc[h][j];
        }
}

/* The work split of one tile over the 4 warps, for head_dim HD and ROWS heads.
 *   S: NSUB fragments of SUB_POS positions; with fewer fragments than warps, QSPLIT warps
 *      share one, each summing every QSPLIT-th 16-column step of head_dim into its own
 *      partial S (the softmax adds the partials in a fixed order).
 *   O: OFR fragments of O_HD head_dim columns; with fewer than warps, PSPLIT warps share
 *      one, each summing every PSPLIT-th 16-position step into its own partial O (added in
 *      the epilogue). Warps past the last fragment sit the P.V out. */
template <int HD, int ROWS> struct ad_geom {
    static constexpr int TILE = HD <= 64 ? 128 : 64; /* positions per tile */
    /* context positions per S fragment, head_dim columns per O fragment (ad_mma) */
    static constexpr int SUB_POS = ROWS == 16 ? 16 : 32, O_HD = ROWS == 16 ? 16 : 32;
    static constexpr int KSTEPS = HD / 16, PSTEPS = TILE / 16;
    static constexpr int NSUB = TILE / SUB_POS;
    static constexpr int QSPLIT = NSUB >= AD_WARPS ? 1 : AD_WARPS / NSUB;
    static constexpr int WPS = AD_WARPS / QSPLIT;        /* warps per partial S */
    static constexpr int SUBT = (NSUB + WPS - 1) / WPS;  /* S fragments per warp */
    static constexpr int OFR = HD / O_HD;
    static constexpr int PSPLIT = OFR >= AD_WARPS ? 1 : AD_WARPS / OFR;
    static constexpr int WPF = AD_WARPS / PSPLIT;        /* warps per partial O */
    static constexpr int NF = (OFR + WPF - 1) / WPF;     /* O fragments per warp */
    static_assert(ROWS == 8 || ROWS == 16, "8 or 16 heads per block");
    static_assert(HD % 32 == 0 && TILE % 32 == 0, "head_dim and tile in whole fragments");
    static_assert(AD_WARPS % QSPLIT == 0 && AD_WARPS % PSPLIT == 0, "warps split evenly");
};

/* Shared memory of one thread block (static, < 48 KiB for every instance; every ldmatrix
 * row 16-byte aligned; 16-bit row pitches of 16 (mod 128) bytes, so the 8 rows of an
 * ldmatrix matrix fall in distinct banks). T: the 16-bit compute type. */
template <typename T, int HD, int ROWS> struct alignas(128) ad_smem {
    typedef ad_geom<HD, ROWS> G;
    static constexpr int KP = HD + 8;     /* 16-bit elements per staged K/V row and Q row */
    static constexpr int PP = G::TILE + 8; /* 16-bit elements per P row */
    static constexpr int SP = G::TILE + 4; /* floats per S row */
    static constexpr int OP = HD + 4;     /* floats per O row */
    alignas(32) uint4 kv[G::TILE][KP / 8];      /* the current K or V tile (16-byte chunks of T) */
    alignas(32) T q[2][ROWS][KP];               /* Q hi, Q lo */
    alignas(32) T p[2][ROWS][PP];               /* P hi, P lo of the tile */
    alignas(32) float s[G::QSPLIT][ROWS][SP];   /* partial S of the tile (log2 units) */
    alignas(32) float o[G::PSPLIT][ROWS][OP];   /* partial O for rescaling and the epilogue */
    float m[ROWS], l[ROWS], alpha[ROWS];
    int flag[AD_WARPS];
};

__host__ __device__ __forceinline__ int ad_imin(int a, int b) { return a < b ? a : b; }

/* How one sequence of ctx positions is split: n partitions of size positions each (the
 * last one shorter), n = min(ceil(ctx / part), nparts), the sizes equal and rounded up to
 * 64 positions (16 when part is not a multiple of 64), n recounted after the rounding.
 * The attention kernel and the reduce agree through this one function. */
struct ad_split {
    int n, size;
};
__host__ __device__ __forceinline__ ad_split ad_split_of(int ctx, int part, int nparts)
{
    if (ctx <= 0) return ad_split{ 0, part };
    int n = ad_imin((ctx + part - 1) / part, nparts);
    const int gran = part % 64 == 0 ? 64 : 16;
    int size = (ctx + n - 1) / n;
    size = (size + gran - 1) / gran * gran;
    return ad_split{ (ctx + size - 1) / size, size };
}

template <typename O> __device__ __forceinline__ uint32_t ad_pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t ad_pack2<__half>(float a, float b)
{
    return (uint32_t)__half_as_ushort(__float2half_rn(a)) | ((uint32_t)__half_as_ushort(__float2half_rn(b)) << 16);
}
template <> __device__ __forceinline__ uint32_t ad_pack2<__nv_bfloat16>(float a, float b)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}

/* out[idx .. idx + 4) = v in the output dtype (idx a multiple of 4). */
__device__ __forceinline__ void ad_store4(void *out, int out_dtype, int64_t idx, float4 v)
{
    switch (out_dtype) {
    case DT_F32:
        *(float4 *)((float *)out + idx) = v;
        break;
    case DT_F16:
        *(uint2 *)((__half *)out + idx) = make_uint2(ad_pack2<__half>(v.x, v.y), ad_pack2<__half>(v.z, v.w));
        break;
    default: /* DT_BF16: the launcher admits nothing else */
        *(uint2 *)((__nv_bfloat16 *)out + idx) =
            make_uint2(ad_pack2<__nv_bfloat16>(v.x, v.y), ad_pack2<__nv_bfloat16>(v.z, v.w));
        break;
    }
}

/* Values 4i..4i+3 of the output (flat float4 index i over [num_seqs][n_heads][HD]; rows of
 * n_heads * HD elements) stored in out_dtype, and with qq (F32 out) quantized as
 * cuda_quantize_act would (qact_store4: warp-collective over 8 lanes of consecutive i,
 * all valid or none; a row's 32-element blocks never straddle heads, HD % 32 == 0). */
__device__ __forceinline__ void ad_out4(void *out, int out_dtype, int64_t i, float4 v, bool valid, int8_t *qq,
                                        float2 *qds)
{
    if (qq) qact_store4(v, i, valid, qq, qds);
    if (valid) ad_store4(out, out_dtype, 4 * i, v);
}

} /* namespace */

/* One thread block per (partition, kv head x head group, sequence); see the file comment.
 * qk_scale = scale * log2(e) (* k_scale for FP8); v_fac = 1 (v_scale for FP8).
 * qq / qds: NULL, or the quantized copy of out (cuda_attention_decode's qact). */
template <typename KV, int HD, int ROWS>
__global__ void __launch_bounds__(AD_THREADS, AD_BLOCKS_PER_SM)
attention_decode_kernel(void *__restrict__ out,             /* [num_seqs][n_heads][HD] of out_dtype */
                        int out_dtype,
                        float *__restrict__ ws_o,           /* [num_seqs][n_heads][nparts][HD] */
                        float2 *__restrict__ ws_ml,         /* [num_seqs][n_heads][nparts] (m, l) */
                        const float *__restrict__ q,        /* [num_seqs][q_stride], heads at h * HD */
                        int64_t q_stride,
                        const uint8_t *__restrict__ pool,   /* [num_blocks][2][n_kv_heads][block_size][HD] of KV */
                        int n_kv_heads, int bs_log2,
                        const int32_t *__restrict__ seq_lens,     /* [num_seqs] */
                        const int32_t *__restrict__ block_tables, /* [num_seqs][max_blocks_per_seq] */
                        int max_blocks_per_seq, int n_heads, int group, int hgroups, int max_ctx,
                        int part, int nparts, float qk_scale, float v_fac,
                        int8_t *__restrict__ qq,                  /* qact's codes [num_seqs][n_heads * HD] */
                        float2 *__restrict__ qds)                 /* its [num_seqs][n_heads * HD / 32] (d, sum) */
{
    ts_pdl_begin();
    typedef typename kv_traits<KV>::compute_t T;
    typedef ad_geom<HD, ROWS> G;
    typedef ad_mma<T, ROWS> MMA;
    constexpr int TILE = G::TILE;
    constexpr int ESZ = kv_traits<KV>::esize;
    constexpr int EPC = 16 / ESZ;                     /* elements per 16-byte chunk */
    constexpr int CPR = HD / EPC;                     /* chunks per K/V row */
    constexpr int LPT = TILE * CPR / AD_THREADS;      /* chunks per thread per tile */
    constexpr int CPL = TILE / 32;                    /* softmax columns per lane */
    constexpr int RPW = ROWS / AD_WARPS;              /* softmax rows per warp */
    static_assert((TILE * CPR) % AD_THREADS == 0, "tile shape");
    typedef ad_smem<T, HD, ROWS> smem_t;
    constexpr int KP = smem_t::KP, PP = smem_t::PP, SP = smem_t::SP, OP = smem_t::OP;
    constexpr int Q_LO = ROWS * KP, P_LO = ROWS * PP; /* elements from the hi term to the lo term */
    TS_SHARED(smem_t, sm, );

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int pidx = blockIdx.x;
    const int kvh = blockIdx.y / hgroups, hg = blockIdx.y % hgroups;
    const int s = blockIdx.z;
    const int h0 = kvh * group + hg * ROWS;
    const int nrows = ad_imin(ROWS, group - hg * ROWS);
    /* this warp's share of the tile's MMAs (ad_geom): S fragments warp % WPS (+ WPS ...)
     * summed over head_dim steps kq, kq + QSPLIT, ...; O fragments warp % WPF (+ WPF ...)
     * summed over position steps kp, kp + PSPLIT, ... */
    const int kq = warp / G::WPS, kp = warp / G::WPF;

    const int ctx = ad_imin(seq_lens[s], max_ctx);
    const ad_split split = ad_split_of(ctx, part, nparts);
    if (pidx >= (split.n > 0 ? split.n : 1)) return; /* an empty partition: nothing to do */
    const bool direct = split.n <= 1;                 /* this block writes out itself */

    /* this block's output rows (its heads of sequence s) are float4s [o4, o4 + nout4) of out:
       whole 8-float4 blocks, stepped through by whole warps (ad_out4 is warp-collective) */
    const int nout4 = nrows * (HD / 4);
    const int64_t o4 = ((int64_t)s * n_heads + h0) * (HD / 4);
    if (ctx <= 0) { /* batch padding: all-zero output */
        for (int i0 = 0; i0 < nout4; i0 += AD_THREADS)
            ad_out4(out, out_dtype, o4 + i0 + tid, make_float4(0.f, 0.f, 0.f, 0.f), i0 + tid < nout4, qq, qds);
        return;
    }
    const int p_start = pidx * split.size;
    const int p_end = ad_imin(p_start + split.size, ctx);
    const int ntiles = (p_end - p_start + TILE - 1) / TILE;
    /* ---- pool addressing: chunk j of this thread is row (tid + j * 128) / CPR of a tile ---- */
    const int32_t *bt = block_tables + (int64_t)s * max_blocks_per_seq;
    const int bs_mask = (1 << bs_log2) - 1;
    constexpr int row_bytes = HD * ESZ;
    /* bytes from K to V of one block (< 2^31: the launcher checks the block's size) */
    const int which_bytes = (n_kv_heads << bs_log2) * row_bytes;
    const int64_t block_bytes = 2 * (int64_t)which_bytes;
    const uint8_t *head_base = pool + ((int64_t)kvh << bs_log2) * row_bytes;

    /* Tiles in flight. K(i) and V(i) alternate; with one buffer (16-bit caches: LPT = 6-8
     * 16-byte loads per thread already) the next one is loaded when the current one is
     * stored, so one tile is in flight; FP8 tiles are half the bytes, so they get a buffer
     * each for K and V (same registers) and two tiles in flight: K(i+1) is issued when K(i)
     * is stored, V(i+1) when V(i) is. */
    constexpr bool DEEP = LPT <= 4;
    uint4 buf[DEEP ? 2 : 1][LPT];
    uint4(&rk)[LPT] = buf[0];
    uint4(&rv)[LPT] = buf[DEEP ? 1 : 0];

    /* Block-table entries are read right before the data (L1 hits after the first tile of a
     * block): keeping them a tile ahead in registers cost ~40 registers per thread. */
    auto load_tile = [&](int tile, int which, uint4(&reg)[LPT]) {
#pragma unroll
        for (int j = 0; j < LPT; j++) {
            int c = tid + j * AD_THREADS;
            int t = p_start + tile * TILE + c / CPR;
            reg[j] = make_uint4(0u, 0u, 0u, 0u);
            if (t < p_end)
                reg[j] = *(const uint4 *)(head_base + (int64_t)bt[t >> bs_log2] * block_bytes +
                                          (which * which_bytes + (t & bs_mask) * row_bytes + (c % CPR) * 16));
        }
    };
    auto store_tile = [&](const uint4(&reg)[LPT]) {
#pragma unroll
        for (int j = 0; j < LPT; j++) {
            int c = tid + j * AD_THREADS;
            int row = c / CPR, col = c % CPR;
            if constexpr (ESZ == 2) {
                sm.kv[row][col] = reg[j];
            } else {
                ts_e4m3x16_to_f16(reg[j], sm.kv[row][2 * col], sm.kv[row][2 * col + 1]);
            }
        }
    };

    typename MMA::acc_t oacc[G::NF] = {};
    float m_ref[RPW], l_part[RPW];
#pragma unroll
    for (int k = 0; k < RPW; k++) {
        m_ref[k] = -INFINITY;
        l_part[k] = 0.0f;
    }

    /* the first tile's loads go out before Q is read, so their latencies overlap */
    load_tile(0, 0, rk);
    if (DEEP) load_tile(0, 1, rv);

    /* ---- Q: rows h0 .. h0 + nrows, split into hi + lo 16-bit terms, zero rows after (the
     * first barrier of the tile loop publishes them) ---- */
    for (int i = tid; i < ROWS * (HD / 4); i += AD_THREADS) {
        int r = i / (HD / 4), c = 4 * (i % (HD / 4));
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nrows) x = *(const float4 *)(q + s * q_stride + (int64_t)(h0 + r) * HD + c);
        T *hi = &sm.q[0][r][c], *lo = &sm.q[1][r][c];
        const float xs[4] = { x.x, x.y, x.z, x.w };
#pragma unroll
        for (int e = 0; e < 4; e++) {
            T h = ts_from_float<T>(xs[e]);
            hi[e] = h;
            lo[e] = ts_from_float<T>(xs[e] - ts_to_float<T>(h));
        }
    }

    for (int it = 0; it < ntiles; it++) {
        const int t0 = p_start + it * TILE;
        store_tile(rk); /* K(it) */
        if (!DEEP) load_tile(it, 1, rv);                     /* V(it) in flight during Q.K^T and the softmax */
        else if (it + 1 < ntiles) load_tile(it + 1, 0, rk); /* K(it + 1), with V(it) still in flight */
        __syncthreads();

        /* ---- S = Q K^T (this warp's fragments and head_dim steps), in log2 units ---- */
#pragma unroll
        for (int u = 0; u < G::SUBT; u++) {
            const int sub = warp % G::WPS + u * G::WPS;
            if (sub >= G::NSUB || t0 + G::SUB_POS * sub >= p_end) continue; /* past the context: never read */
            typename MMA::acc_t sacc = {};
            /* Q's registers come from shared memory each time: held they cost up to 64
             * registers per thread at head_dim 128 */
            const T *kv_sub = reinterpret_cast<const T *>(&sm.kv[G::SUB_POS * sub][0]);
#pragma unroll
            for (int k = kq; k < G::KSTEPS; k += G::QSPLIT)
                MMA::qk(sacc, &sm.q[0][0][16 * k], Q_LO, KP, kv_sub + 16 * k, KP, lane);
            ad_store_acc<MMA>(&sm.s[kq][0][G::SUB_POS * sub], SP, sacc, qk_scale, lane);
        }
        __syncthreads();

        /* ---- online softmax, one warp per row: S -> P (hi, lo) ---- */
        int rescale = 0;
#pragma unroll
        for (int k = 0; k < RPW; k++) {
            const int r = warp + k * AD_WARPS;
            T *phi = &sm.p[0][r][0], *plo = &sm.p[1][r][0];
            const bool live = r < nrows; /* rows past the group: P = 0 */
            float sv[CPL], tmax = -INFINITY;
#pragma unroll
            for (int c = 0; c < CPL; c++) {
                int col = lane + 32 * c;
                float x = -INFINITY;
                if (live && t0 + col < p_end) {
                    x = sm.s[0][r][col];
#pragma unroll
                    for (int j = 1; j < G::QSPLIT; j++) x += sm.s[j][r][col]; /* partial S, in order */
                }
                sv[c] = x;
                tmax = fmaxf(tmax, sv[c]);
            }
            tmax = warp_max(tmax); /* outside any branch: the shuffles stay convergent */
            float mr = m_ref[k], alpha = 1.0f;
            if (tmax > mr + AD_RESCALE_LOG2) { /* also a live row's first tile (mr = -inf) */
                alpha = exp2f(mr - tmax);      /* 0 on the first tile, where l and O are 0 */
                if (mr != -INFINITY) rescale = 1;
                l_part[k] *= alpha;
                m_ref[k] = mr = tmax;
            }
            if (lane == 0) sm.alpha[r] = alpha;
#pragma unroll
            for (int c = 0; c < CPL; c++) {
                int col = lane + 32 * c;
                float p = live ? exp2f(sv[c] - mr) : 0.0f;
                l_part[k] += p;
                T h = ts_from_float<T>(p);
                phi[col] = h;
                plo[col] = ts_from_float<T>(p - ts_to_float<T>(h));
            }
        }
        if (lane == 0) sm.flag[warp] = rescale;
        store_tile(rv); /* V(it): K(it) was consumed before the last barrier */
        if (it + 1 < ntiles) {
            if (!DEEP) load_tile(it + 1, 0, rk); /* K(it + 1) in flight during P.V */
            else load_tile(it + 1, 1, rv);       /* V(it + 1), with K(it + 1) still in flight */
        }
        __syncthreads();

        /* ---- rare: a row's reference max rose; rescale this warp's O fragments ---- */
        int any = 0;
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) any |= sm.flag[w];
        if (any) { /* each accumulator element is one (head, column): scale it by its row's factor */
#pragma unroll
            for (int f = 0; f < G::NF; f++)
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    int head, col;
                    MMA::at(lane, e / 4, e % 4, head, col);
                    oacc[f][e / 4][e % 4] *= sm.alpha[head];
                }
        }

        /* ---- O += P V (this warp's fragments and position steps) ---- */
        if (warp % G::WPF < G::OFR) {
#pragma unroll
            for (int k = kp; k < G::PSTEPS; k += G::PSPLIT) {
                if (t0 + 16 * k >= p_end) break; /* P and V are zero there */
                typename MMA::p_t pr;
                MMA::load_p(pr, &sm.p[0][0][16 * k], P_LO, PP, lane);
#pragma unroll
                for (int f = 0; f < G::NF; f++) {
                    const int fi = warp % G::WPF + f * G::WPF;
                    if (fi >= G::OFR) continue;
                    MMA::pv(oacc[f], pr, reinterpret_cast<const T *>(&sm.kv[16 * k][0]) + G::O_HD * fi, KP, lane);
                }
            }
        }
        __syncthreads(); /* P and the V tile are consumed before the next tile overwrites them */
    }

    /* ---- epilogue: O, m, l to shared memory, then out (direct) or the workspace ---- */
#pragma unroll
    for (int f = 0; f < G::NF; f++) {
        const int fi = warp % G::WPF + f * G::WPF;
        if (fi < G::OFR) ad_store_acc<MMA>(&sm.o[kp][0][G::O_HD * fi], OP, oacc[f], 1.0f, lane);
    }
#pragma unroll
    for (int k = 0; k < RPW; k++) {
        float l = warp_sum(l_part[k]);
        if (lane == 0) {
            sm.l[warp + k * AD_WARPS] = l;
            sm.m[warp + k * AD_WARPS] = m_ref[k];
        }
    }
    __syncthreads();
    for (int i0 = 0; i0 < nout4; i0 += AD_THREADS) { /* whole warps (ad_out4) */
        const int i = i0 + tid;
        const bool valid = i < nout4;
        const int r = valid ? i / (HD / 4) : 0, c = 4 * (i % (HD / 4));
        const int64_t sh = (int64_t)s * n_heads + h0 + r; /* (sequence, query head) */
        const float f = direct ? v_fac / sm.l[r] : v_fac;
        float4 o = *(const float4 *)&sm.o[0][r][c];
#pragma unroll
        for (int j = 1; j < G::PSPLIT; j++) { /* partial O, in order */
            const float4 x = *(const float4 *)&sm.o[j][r][c];
            o.x += x.x;
            o.y += x.y;
            o.z += x.z;
            o.w += x.w;
        }
        const float4 v = make_float4(o.x * f, o.y * f, o.z * f, o.w * f);
        if (direct) {
            ad_out4(out, out_dtype, o4 + i, v, valid, qq, qds);
        } else if (valid) {
            *(float4 *)(ws_o + (sh * nparts + pidx) * HD + c) = v;
            if (c == 0) ws_ml[sh * nparts + pidx] = make_float2(sm.m[r], sm.l[r]);
        }
    }
}

/* Combines the partitions of every (sequence, query head) whose context spans more than
 * one: one thread block each. Every warp finds M and sum_p 2^(m_p - M) l_p over all the
 * partitions (the same values in each warp), then sums 2^(m_p - M) O_p over every fourth
 * partition, 4 head_dim columns per lane; the four warps' sums are added in shared memory
 * in a fixed order. */
template <int HD>
__global__ void __launch_bounds__(AD_THREADS)
attention_decode_reduce_kernel(void *__restrict__ out,            /* [num_seqs][n_heads][HD] of out_dtype */
                               int out_dtype,
                               const float *__restrict__ ws_o,    /* [num_seqs][n_heads][nparts][HD] */
                               const float2 *__restrict__ ws_ml,  /* [num_seqs][n_heads][nparts] */
                               const int32_t *__restrict__ seq_lens, /* [num_seqs] */
                               int n_heads, int max_ctx, int part, int nparts,
                               int8_t *__restrict__ qq, float2 *__restrict__ qds) /* as the attention kernel's */
{
    ts_pdl_begin();
    TS_SHARED(float4, acc_sm, [AD_WARPS][HD / 4]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t sh = blockIdx.x; /* (sequence, query head) */
    const int ctx = ad_imin(seq_lens[sh / n_heads], max_ctx);
    const int np_s = ad_split_of(ctx, part, nparts).n;
    if (np_s <= 1) return; /* written by the attention kernel */
    const float2 *ml = ws_ml + sh * nparts;
    float mx = -INFINITY;
    for (int p = lane; p < np_s; p += 32) mx = fmaxf(mx, ml[p].x);
    mx = warp_max(mx);
    float l = 0.0f;
    for (int p = lane; p < np_s; p += 32) l += exp2f(ml[p].x - mx) * ml[p].y;
    const float inv = 1.0f / warp_sum(l);
    const float4 *o = (const float4 *)(ws_o + sh * nparts * HD);
    for (int c4 = lane; c4 < HD / 4; c4 += 32) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int p = warp; p < np_s; p += AD_WARPS) {
            const float w = exp2f(ml[p].x - mx);
            const float4 v = o[(int64_t)p * (HD / 4) + c4];
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        acc_sm[warp][c4] = acc;
    }
    __syncthreads();
    static_assert(HD / 4 <= 32, "one warp writes the row");
    if (warp == 0) { /* the whole warp: ad_out4 is warp-collective */
        const bool valid = lane < HD / 4;
        const int c4 = valid ? lane : 0;
        float4 acc = acc_sm[0][c4];
#pragma unroll
        for (int w = 1; w < AD_WARPS; w++) {
            const float4 v = acc_sm[w][c4];
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        ad_out4(out, out_dtype, sh * (HD / 4) + lane, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv),
                valid, qq, qds);
    }
}

/* ---- launcher ----------------------------------------------------------------------------- */

namespace {

typedef void (*ad_kernel_fn)(void *, int, float *, float2 *, const float *, int64_t, const uint8_t *, int, int,
                             const int32_t *, const int32_t *, int, int, int, int, int, int, int, float, float,
                             int8_t *, float2 *);
typedef void (*ad_reduce_fn)(void *, int, const float *, const float2 *, const int32_t *, int, int, int, int, int8_t *,
                             float2 *);

template <typename KV, int ROWS> ad_kernel_fn ad_pick_hd(int head_dim)
{
    switch (head_dim) {
    case 64: return attention_decode_kernel<KV, 64, ROWS>;
    case 96: return attention_decode_kernel<KV, 96, ROWS>;
    case 128: return attention_decode_kernel<KV, 128, ROWS>;
    default: return nullptr;
    }
}

template <typename KV> ad_kernel_fn ad_pick(int head_dim, int rows)
{
    return rows == 8 ? ad_pick_hd<KV, 8>(head_dim) : ad_pick_hd<KV, 16>(head_dim);
}

ad_reduce_fn ad_pick_reduce(int head_dim)
{
    switch (head_dim) {
    case 64: return attention_decode_reduce_kernel<64>;
    case 96: return attention_decode_reduce_kernel<96>;
    case 128: return attention_decode_reduce_kernel<128>;
    default: return nullptr;
    }
}

/* The grid's partitions per sequence: enough for the longest context, at most the cap. */
int ad_partitions(int max_seq_len, int part, int max_partitions)
{
    const int n = max_seq_len <= 0 ? 1 : (max_seq_len + part - 1) / part;
    return max_partitions > 0 && max_partitions < n ? max_partitions : n;
}

/* Query heads per thread block: 8 (the 32x8x16 fragments) for groups of up to 8 heads,
 * else 16; head_rows 8 or 16 forces one. 0 for anything else. */
int ad_rows(int head_rows, int group)
{
    if (head_rows == 0) return group <= 8 ? 8 : 16;
    return head_rows == 8 || head_rows == 16 ? head_rows : 0;
}

int ad_hgroups(int group, int rows) { return (group + rows - 1) / rows; }

} /* namespace */

extern "C" size_t cuda_attention_decode_workspace_size(int num_seqs, int n_heads, int head_dim, int max_seq_len,
                                                       int partition_size, int max_partitions)
{
    if (num_seqs <= 0 || n_heads <= 0 || head_dim <= 0 || max_seq_len <= 0 || partition_size < 0 ||
        max_partitions < 0)
        return 0;
    const int np = ad_partitions(max_seq_len, partition_size > 0 ? partition_size : AD_MIN_PART, max_partitions);
    if (np <= 1) return 0;
    return (size_t)num_seqs * (size_t)n_heads * (size_t)np * (size_t)(head_dim + 2) * sizeof(float);
}

/* Blocks that all fit progress at the same rate whatever multiprocessor they landed on, so
 * the partitions that help are those that still fit one wave of resident blocks
 * (AD_BLOCKS_PER_SM per multiprocessor, from the register cap); a grid that fills the GPU
 * unsplit stays unsplit. */
extern "C" int cuda_attention_decode_max_partitions(int num_seqs, int n_heads, int n_kv_heads, int head_rows,
                                                    int num_sms)
{
    if (num_seqs <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || num_sms <= 0) return 1;
    const int group = n_heads / n_kv_heads, rows = ad_rows(head_rows, group);
    if (rows == 0) return 1;
    const int64_t base = (int64_t)num_seqs * n_kv_heads * ad_hgroups(group, rows);
    const int64_t n = (int64_t)AD_BLOCKS_PER_SM * num_sms / base;
    return n < 1 ? 1 : n > 65535 ? 65535 : (int)n;
}

extern "C" int cuda_attention_decode(void *out, enum dtype out_dtype, const float *q, int64_t q_stride,
                                     const struct kv_layer *kv,
                                     const int32_t *seq_lens, const int32_t *block_tables, int max_blocks_per_seq,
                                     int num_seqs, int n_heads, float scale, int max_seq_len, int partition_size,
                                     int max_partitions, int head_rows, void *workspace, size_t workspace_bytes,
                                     void *qact, int pdl, cudaStream_t stream)
{
    if (num_seqs == 0) return cudaSuccess;
    if (!out || !q || !kv || !kv->data || !seq_lens || !block_tables || num_seqs < 0 || num_seqs > 65535 ||
        n_heads <= 0 || kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads != 0 || max_seq_len < 0 ||
        partition_size < 0 || partition_size % 16 != 0 || max_partitions < 0 || max_blocks_per_seq <= 0 ||
        q_stride < (int64_t)n_heads * kv->head_dim || q_stride % 4 != 0 || ((uintptr_t)q & 15) != 0 ||
        ((uintptr_t)out & 15) != 0 || ((uintptr_t)kv->data & 15) != 0)
        return cudaErrorInvalidValue;
    const int bs = kv->block_size;
    if (bs < 16 || (bs & (bs - 1)) != 0 || (int64_t)max_seq_len > (int64_t)max_blocks_per_seq * bs)
        return cudaErrorInvalidValue;
    int bs_log2 = 0;
    while ((1 << bs_log2) < bs) bs_log2++;
    switch (out_dtype) {
    case DT_F32:
    case DT_F16:
    case DT_BF16: break;
    default: return cudaErrorInvalidValue;
    }
    if (qact && (out_dtype != DT_F32 || ((uintptr_t)qact & 15) != 0)) return cudaErrorInvalidValue;
    const int group = n_heads / kv->n_kv_heads, rows = ad_rows(head_rows, group);
    if (rows == 0) return cudaErrorInvalidValue;
    float qk_scale = scale * AD_LOG2E, v_fac = 1.0f;
    ad_kernel_fn decode_kernel = nullptr;
    switch (kv->dtype) {
    case KV_F16: decode_kernel = ad_pick<__half>(kv->head_dim, rows); break;
    case KV_BF16: decode_kernel = ad_pick<__nv_bfloat16>(kv->head_dim, rows); break;
    case KV_FP8_E4M3:
        if (!(kv->k_scale > 0.0f) || !(kv->v_scale > 0.0f) || !isfinite(kv->k_scale) || !isfinite(kv->v_scale))
            return cudaErrorInvalidValue;
        decode_kernel = ad_pick<kv_fp8>(kv->head_dim, rows);
        qk_scale *= kv->k_scale;
        v_fac = kv->v_scale;
        break;
    default: return cudaErrorInvalidValue; /* KV_F32: not supported on the GPU */
    }
    ad_reduce_fn reduce_kernel = ad_pick_reduce(kv->head_dim);
    if (!decode_kernel || !reduce_kernel) return cudaErrorInvalidValue;

    const int64_t esize = kv->dtype == KV_FP8_E4M3 ? 1 : 2;
    if ((int64_t)kv->n_kv_heads * bs * kv->head_dim * esize > INT32_MAX / 2)
        return cudaErrorInvalidValue; /* the kernel addresses within a block in 32 bits */
    const int hgroups = ad_hgroups(group, rows);
    if ((int64_t)kv->n_kv_heads * hgroups > 65535) return cudaErrorInvalidValue;
    const int part = partition_size > 0 ? partition_size : AD_MIN_PART;
    int cap = max_partitions;
    if (cap == 0) {
        int dev = 0, sms = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return (int)e;
        cap = cuda_attention_decode_max_partitions(num_seqs, n_heads, kv->n_kv_heads, rows, sms);
    }
    const int nparts = ad_partitions(max_seq_len, part, cap);
    float *ws_o = nullptr;
    float2 *ws_ml = nullptr;
    if (nparts > 1) {
        const size_t n = (size_t)num_seqs * n_heads * nparts;
        if (!workspace || ((uintptr_t)workspace & 15) != 0 ||
            workspace_bytes < n * (size_t)(kv->head_dim + 2) * sizeof(float))
            return cudaErrorInvalidValue;
        ws_o = (float *)workspace;
        ws_ml = (float2 *)(ws_o + n * kv->head_dim);
    }
    const int max_ctx = max_seq_len;
    int8_t *qq = static_cast<int8_t *>(qact);
    float2 *qds = qact ? qact_ds(qact, (int64_t)n_heads * kv->head_dim, num_seqs) : nullptr;
    dim3 grid((unsigned)nparts, (unsigned)(kv->n_kv_heads * hgroups), (unsigned)num_seqs);
    TS_LAUNCH_PDL(decode_kernel, grid, AD_THREADS, 0, stream, pdl, out, (int)out_dtype, ws_o, ws_ml, q, q_stride,
                  (const uint8_t *)kv->data, kv->n_kv_heads, bs_log2, seq_lens, block_tables, max_blocks_per_seq,
                  n_heads, group, hgroups, max_ctx, part, nparts, qk_scale, v_fac, qq, qds);
    if (nparts > 1) {
        int e = TS_LAUNCH_RESULT();
        if (e != 0) return e;
        TS_LAUNCH_PDL(reduce_kernel, (unsigned)(num_seqs * n_heads), AD_THREADS, 0, stream, pdl, out,
                      (int)out_dtype, ws_o, ws_ml, seq_lens, n_heads, max_ctx, part, nparts, qq, qds);
    }
    return TS_LAUNCH_RESULT();
}
