/* gemm_avx2.c — matmul on weights repacked at load time, AVX2 + FMA + F16C (x86-64-v3).
 *
 * The same contract and arithmetic shape as gemm_avx512.c, sized for 16 ymm registers:
 * y[t][r] = sum_i W[r][i] x[t][i] as register tiles (rows in lanes, tokens in registers),
 * so each weight vector loaded serves several tokens and no horizontal sums are needed.
 * One token (decode) runs each output's float chain unchanged, so a token's result does
 * not depend on the batch it is in.
 *
 * Quantized 32-element types (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1). Per block of 32:
 *   W[r][i] = dw_r * u_ri + mw_r - o dw_r,   x[t][i] ~ dx_t q_ti  (q int8, |q| <= 127)
 *   Q4_0: u = nibble, o = 8;  Q5_0: u = 5-bit code, o = 16;  Q4_1, Q5_1: u = code, o = 0,
 *   mw = m;  Q8_0: u = w (signed), o = 0, mw = 0.
 *   sum_i W x = dw dx (sum_i u q - o sum_i q) + mw (dx sum_i q)
 * The integer sum uses vpmaddubsw (unsigned byte x signed byte, adjacent pairs added into
 * int16) and vpmaddwd with ones (int16 pairs into int32). Exactness: 4-bit codes give
 * pairs <= 2*15*127 = 3810, so all 8 steps of a block add up in int16 (<= 30480) before
 * one vpmaddwd; 5-bit codes (<= 7874 a pair) add up two steps at a time. Q8_0 uses the
 * sign trick: |w| (<= 128) times sign(w) q, pairs <= 2*128*127 = 32512, one vpmaddwd a
 * step. The constant -o * sum(q) is packed with the activations and added as an int32.
 * Per (row, token) the float chain runs over the blocks in order:
 *   acc = fma((float)isum_b, dw_b * dx_b, acc) [+ fma(mw_b, dx_b sum(q_b), acc)]
 * The integer sums are exact, so every path that keeps this chain gives equal bits.
 *
 * Packed quantized weights: strips of 8 rows (one ymm of int32/f32 lanes; the last strip
 * padded with zero rows), each strip its blocks in order, one sequential stream. A
 * strip-block is 8 GGUF blocks' bytes (same bytes per weight as the file):
 *   f16 dw[8] | Q?_1: f16 mw[8] | Q5_?: u32 hbits[8] | codes
 *   codes, Q8_0: s8 [8 steps][8 rows][4]   (step j = elements 4j..4j+3 of every row)
 *          4/5-bit: u8 [4][8 rows][4], low nibble step 2k, high nibble step 2k+1
 *   hbits[j] bit 4r+i: bit 4 of row r's code 4j+i (the byte order of step j's codes)
 * So one 32-byte load (plus a nibble split) gives one step's codes for 8 rows.
 *
 * Packed activations (this set's layout; sizes as gemm_act_bytes): a token tile of
 * GEMM_TILE tokens is GEMM_TILE / GQ_GROUP groups of GQ_GROUP tokens, group-major, each
 * group its blocks in order (a sequential stream for the micro-kernel), per block
 * 40 * GQ_GROUP bytes:
 *   int32 q4[8][GQ_GROUP] codes 4j..4j+3 of each token | f32 d[GQ_GROUP] |
 *   c[GQ_GROUP]: int32 -o * sum(q) (Q8_0, Q4_0, Q5_0) or f32 d * sum(q) (Q4_1, Q5_1).
 * A lone token is one group of width 1 (40 bytes a block). Codes and scales are bitwise
 * those of the per-token path (quantize_avx2), so the two differ only in float order.
 *
 * Float types (F32, F16, BF16): work units are strips of 16 rows, stored four to a panel
 * of 64 rows, [k][64] in the stored type (zero rows pad the last panel), so decode reads
 * one sequential stream with 8 independent chains; the batched micro-kernel is 16 rows x
 * 6 tokens (12 accumulators, 2 weight vectors, 1 broadcast).
 * K-quants (Q4_K, Q6_K) are not packed: the per-token kernels run them.
 *
 * The batched path walks each strip in chunks of K (stays in L1 while every token tile of
 * the unit range passes over it); chunks after the first reload the accumulators from y,
 * which continues the same float chain. Called from pool threads on disjoint unit ranges;
 * nothing is allocated.
 */
#include "backend/cpu/quant_kernels.h"

#ifdef GEMM_HAVE_AVX2

#include <immintrin.h>
#include <string.h>

#define GQ_STRIP 8       /* rows per quantized strip: one ymm of lanes */
#define GQ_GROUP 4       /* tokens per quantized micro-kernel */
#define GQ_KC_BLOCKS 32  /* blocks per chunk of a strip in the batched path */
#define GF_STRIP 16      /* rows per float strip (work unit): two ymm */
#define GF_PANEL 4       /* float strips stored interleaved: a panel of 64 rows */
#define GF_GROUP 6       /* tokens per float micro-kernel */
#define GF_KC 256        /* columns per float chunk: 16 x 256 f32 = 16 KB */

_Static_assert(GEMM_TILE % GQ_GROUP == 0 && GEMM_TILE % GF_GROUP == 0, "token tile splits into groups");
_Static_assert(GEMM_QACT_BLOCK == 40 * GEMM_TILE, "activation block is 40 bytes a token");

/* Code offset o folded into the packed activations (Q8_0 is signed here: 0). */
static inline int act_offset(enum dtype wt) { return wt == DT_Q4_0 ? 8 : wt == DT_Q5_0 ? 16 : 0; }
static inline int has_min(enum dtype wt) { return wt == DT_Q4_1 || wt == DT_Q5_1; }

/* Lane mask of the first nv (0..8) of 8 int32/f32 lanes. */
static inline __m256i lane_mask(int nv)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---- activations ---- */

/* Quantizes one token row into lane `lane` of a group gw tokens wide whose blocks are
 * 40 * gw bytes apart; rounding exactly as quantize_avx2 (d = amax / 127, q = round to
 * nearest even of x * (1/d), clamped to +-127). */
static void pack_act_quant(enum dtype wt, const float *x, int64_t n, uint8_t *grp, int lane, int gw)
{
    const int o = act_offset(wt), with_min = has_min(wt);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_and_ps(absmask, v[k]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i qi[4];
        for (int k = 0; k < 4; k++) {
            __m256 f = _mm256_round_ps(_mm256_mul_ps(v[k], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            qi[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
        }
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        const int sum = _mm_cvtsi128_si32(s4);
        /* int32 -> int8 in element order: packs interleave the 128-bit lanes, the permute
         * puts the dwords back in order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        int32_t w[8];
        _mm256_storeu_si256((__m256i *)w, p);
        uint8_t *blk = grp + (size_t)b * 40 * (size_t)gw;
        int32_t *q4 = (int32_t *)blk;
        for (int j = 0; j < 8; j++) q4[j * gw + lane] = w[j];
        ((float *)(blk + 32 * gw))[lane] = d;
        if (with_min)
            ((float *)(blk + 36 * gw))[lane] = d * (float)sum;
        else
            ((int32_t *)(blk + 36 * gw))[lane] = -o * sum;
    }
}

static void gemm_pack_act(enum dtype wt, const float *x, int64_t n, int num_tokens, int t0, int t1, void *act)
{
    if (num_tokens == 1) { /* one token: a group of width 1 (the decode kernels' layout) */
        if (t0 >= t1) return; /* another thread's share has the token */
        if (gemm_kind_of(wt) == GEMM_FLOAT) memcpy(act, x, sizeof(float) * (size_t)n);
        else pack_act_quant(wt, x, n, act, 0, 1);
        return;
    }
    if (gemm_kind_of(wt) == GEMM_FLOAT) { /* per tile, per group of GF_GROUP: x[n][GF_GROUP] */
        const size_t tile_floats = (size_t)n * GEMM_TILE, grp_floats = (size_t)n * GF_GROUP;
        for (int t = t0; t < t1; t++) {
            const int l = t % GEMM_TILE;
            float *xf = (float *)act + (size_t)(t / GEMM_TILE) * tile_floats + (size_t)(l / GF_GROUP) * grp_floats +
                        l % GF_GROUP;
            for (int64_t k = 0; k < n; k++) xf[k * GF_GROUP] = x[(size_t)t * (size_t)n + (size_t)k];
        }
        if (t1 == num_tokens && num_tokens % GEMM_TILE) { /* zero tokens pad the last tile */
            float *tile = (float *)act + (size_t)(num_tokens / GEMM_TILE) * tile_floats;
            for (int l = num_tokens % GEMM_TILE; l < GEMM_TILE; l++) {
                float *xf = tile + (size_t)(l / GF_GROUP) * grp_floats + l % GF_GROUP;
                for (int64_t k = 0; k < n; k++) xf[k * GF_GROUP] = 0.0f;
            }
        }
        return;
    }
    const size_t grp_bytes = (size_t)(n / 32) * 40 * GQ_GROUP, tile_bytes = (size_t)(n / 32) * GEMM_QACT_BLOCK;
    for (int t = t0; t < t1; t++) {
        const int l = t % GEMM_TILE;
        uint8_t *grp = (uint8_t *)act + (size_t)(t / GEMM_TILE) * tile_bytes + (size_t)(l / GQ_GROUP) * grp_bytes;
        pack_act_quant(wt, x + (size_t)t * (size_t)n, n, grp, l % GQ_GROUP, GQ_GROUP);
    }
    if (t1 == num_tokens && num_tokens % GEMM_TILE) { /* zero tokens pad the last tile */
        uint8_t *tile = (uint8_t *)act + (size_t)(num_tokens / GEMM_TILE) * tile_bytes;
        for (int l = num_tokens % GEMM_TILE; l < GEMM_TILE; l++) {
            uint8_t *grp = tile + (size_t)(l / GQ_GROUP) * grp_bytes;
            for (int64_t b = 0; b < n / 32; b++) {
                int32_t *blk = (int32_t *)(grp + (size_t)b * 40 * GQ_GROUP);
                for (int j = 0; j < 10; j++) blk[j * GQ_GROUP + l % GQ_GROUP] = 0; /* q4[8], d, c */
            }
        }
    }
}

/* ---- quantized weights: packed layout ---- */

/* Bytes of one packed block of an 8-row strip, and the offsets inside it. */
static inline int sb_bytes(enum dtype wt) { return GQ_STRIP * dtype_block_bytes(wt); }
static inline int sb_hbits(enum dtype wt) { return wt == DT_Q5_0 ? 16 : wt == DT_Q5_1 ? 32 : -1; }
static inline int sb_codes(enum dtype wt)
{
    switch (wt) {
    case DT_Q4_1: return 32;
    case DT_Q5_0: return 48;
    case DT_Q5_1: return 64;
    default: return 16; /* Q8_0, Q4_0 */
    }
}

/* Row r of a strip-block pb (zeroed beforehand) from one GGUF block at blk. Codes by
 * element e: Q8_0 the signed byte; 4-bit types q[e] & 15 for e < 16, q[e - 16] >> 4 above
 * (q: the block's 16 nibble bytes); Q5_? add bit e of qh as 0x10 (kept apart in hbits).
 * Step j holds elements 4j..4j+3; 4-bit steps 2k (low nibble) and 2k+1 (high) share a
 * byte, so for k < 2 a byte takes two low nibbles of q and for k >= 2 two high ones. */
static void pack_row_block(enum dtype wt, const uint8_t *blk, int r, uint8_t *pb)
{
    memcpy(pb + 2 * r, blk, 2); /* dw (f16) */
    if (has_min(wt)) memcpy(pb + 16 + 2 * r, blk + 2, 2);
    if (wt == DT_Q8_0) {
        for (int j = 0; j < 8; j++) memcpy(pb + 16 + 32 * j + 4 * r, blk + 2 + 4 * j, 4);
        return;
    }
    const int oq = wt == DT_Q4_0 ? 2 : wt == DT_Q4_1 ? 4 : wt == DT_Q5_0 ? 6 : 8;
    const uint8_t *q = blk + oq;
    uint8_t *c = pb + sb_codes(wt) + 4 * r;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            const uint8_t lo = q[8 * k + i], hi = q[8 * k + 4 + i];
            c[32 * k + i] = (uint8_t)((lo & 0x0F) | (hi << 4));
            c[32 * (k + 2) + i] = (uint8_t)((lo >> 4) | (hi & 0xF0));
        }
    if (sb_hbits(wt) >= 0) { /* hbits[j] bits 4r..4r+3 = qh bits 4j..4j+3 */
        uint32_t qh;
        memcpy(&qh, q - 4, 4);
        for (int j = 0; j < 8; j++) {
            uint32_t h;
            memcpy(&h, pb + sb_hbits(wt) + 4 * j, 4);
            h |= ((qh >> (4 * j)) & 0x0Fu) << (4 * r);
            memcpy(pb + sb_hbits(wt) + 4 * j, &h, 4);
        }
    }
}

/* Packs strips [s0, s1) of a quantized matrix (rows of nb blocks at w + r * row_bytes). */
static void pack_quant(enum dtype wt, int64_t nb, const uint8_t *w, size_t row_bytes, int64_t nrows, int64_t s0,
                       int64_t s1, uint8_t *dst)
{
    const int bb = dtype_block_bytes(wt), sbb = sb_bytes(wt);
    for (int64_t s = s0; s < s1; s++) {
        uint8_t *ps = dst + (size_t)s * (size_t)nb * (size_t)sbb;
        memset(ps, 0, (size_t)nb * (size_t)sbb); /* padding rows: zero codes and scales */
        for (int r = 0; r < GQ_STRIP && s * GQ_STRIP + r < nrows; r++) {
            const uint8_t *row = w + (size_t)(s * GQ_STRIP + r) * row_bytes;
            for (int64_t b = 0; b < nb; b++)
                pack_row_block(wt, row + (size_t)b * (size_t)bb, r, ps + (size_t)b * (size_t)sbb);
        }
    }
}

/* 0x10 in each byte whose bit is set in h (byte i <- bit i): the fifth bit of 32 codes. */
static inline __m256i hbits_to_0x10(uint32_t h)
{
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i sel = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf); /* byte i <- byte i/8 of h */
    v = _mm256_cmpeq_epi8(_mm256_or_si256(v, sel), _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Unsigned codes of steps 2k and 2k+1 of a 4/5-bit strip-block (8 rows x 4 bytes each). */
static inline __attribute__((always_inline)) void step_codes(enum dtype wt, const uint8_t *pb, int k, __m256i *a,
                                                             __m256i *b)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(pb + sb_codes(wt) + 32 * k));
    *a = _mm256_and_si256(v, m4);
    *b = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (sb_hbits(wt) >= 0) {
        uint32_t ha, hb;
        memcpy(&ha, pb + sb_hbits(wt) + 8 * k, 4);
        memcpy(&hb, pb + sb_hbits(wt) + 8 * k + 4, 4);
        *a = _mm256_or_si256(*a, hbits_to_0x10(ha));
        *b = _mm256_or_si256(*b, hbits_to_0x10(hb));
    }
}

static inline __m256 sb_dw(const uint8_t *pb) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb)); }
static inline __m256 sb_mw(const uint8_t *pb) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + 16))); }

static inline __m256i bcast32(const int32_t *p) { return _mm256_set1_epi32(*p); }

/* ---- quantized weights: the block's integer sums for NT tokens ----
 * is[t] = sum_i u_ri q_ti (+ c_t for offset types) for the 8 rows of strip-block pb and
 * the tokens of a group gw wide at activation block xb (NT <= gw). Exact integers. */
static inline __attribute__((always_inline)) void block_isums(enum dtype wt, const uint8_t *pb, const uint8_t *xb,
                                                              int gw, int nt_reg, __m256i *is)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int32_t *q4 = (const int32_t *)xb, *c = (const int32_t *)(xb + 36 * gw);
    if (wt == DT_Q8_0) {
        _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) is[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * j));
            const __m256i aw = _mm256_abs_epi8(w);
            _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) {
                const __m256i sq = _mm256_sign_epi8(bcast32(q4 + j * gw + t), w);
                is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sq), ones));
                __asm__("" : "+x"(is[t])); /* a chain, as below */
            }
        }
        return;
    }
    if (wt == DT_Q4_0 || wt == DT_Q4_1) { /* 8 steps in int16 (<= 30480), one vpmaddwd */
        __m256i s16[GQ_GROUP];
        _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) s16[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m256i a, b;
            step_codes(wt, pb, k, &a, &b);
            _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) {
                const __m256i pa = _mm256_maddubs_epi16(a, bcast32(q4 + 2 * k * gw + t));
                const __m256i pbb = _mm256_maddubs_epi16(b, bcast32(q4 + (2 * k + 1) * gw + t));
                s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(pa, pbb));
                /* keep the sum a chain: GCC otherwise re-balances it across the steps,
                 * holds every product live and spills (measured 1.5x slower) */
                __asm__("" : "+x"(s16[t]));
            }
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) {
            is[t] = _mm256_madd_epi16(s16[t], ones);
            if (!has_min(wt)) is[t] = _mm256_add_epi32(is[t], bcast32(c + t));
        }
        return;
    }
    /* 5-bit: two steps in int16 (<= 15748), one vpmaddwd per step pair */
    _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++)
        is[t] = has_min(wt) ? _mm256_setzero_si256() : bcast32(c + t);
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        __m256i a, b;
        step_codes(wt, pb, k, &a, &b);
        _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) {
            const __m256i pa = _mm256_maddubs_epi16(a, bcast32(q4 + 2 * k * gw + t));
            const __m256i pbb = _mm256_maddubs_epi16(b, bcast32(q4 + (2 * k + 1) * gw + t));
            is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(_mm256_add_epi16(pa, pbb), ones));
            __asm__("" : "+x"(is[t])); /* a chain, as above */
        }
    }
}

/* The float chain's step for one block: acc[t] = fma(isum, dw dx_t, acc[t]) [+ mw s_t]. */
static inline __attribute__((always_inline)) void block_step(enum dtype wt, const uint8_t *pb, const uint8_t *xb,
                                                             int gw, int nt_reg, __m256 *acc)
{
    __m256i is[GQ_GROUP];
    block_isums(wt, pb, xb, gw, nt_reg, is);
    const __m256 dw = sb_dw(pb);
    const float *xd = (const float *)(xb + 32 * gw), *xs = (const float *)(xb + 36 * gw);
    _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + t)), acc[t]);
    if (has_min(wt)) {
        const __m256 mw = sb_mw(pb);
        _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++)
            acc[t] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(xs + t), acc[t]);
    }
}

/* 8 rows x GQ_GROUP tokens over nbk blocks of a strip chunk wp and a group's activations
 * xa; tokens >= nt are padding (computed, not stored). add: continue the chains in y. */
static inline __attribute__((always_inline)) void micro_quant(enum dtype wt, const uint8_t *wp, const uint8_t *xa,
                                                              int nbk, float *y, int64_t ys, int nt, __m256i rmask,
                                                              int full_rows, int add)
{
    const int sbb = sb_bytes(wt);
    __m256 acc[GQ_GROUP];
    _Pragma("GCC unroll 4") for (int t = 0; t < GQ_GROUP; t++) {
        const float *yt = y + (size_t)t * (size_t)ys;
        acc[t] = !add || t >= nt ? _mm256_setzero_ps() : full_rows ? _mm256_loadu_ps(yt) : _mm256_maskload_ps(yt, rmask);
    }
    for (int b = 0; b < nbk; b++)
        block_step(wt, wp + (size_t)b * (size_t)sbb, xa + (size_t)b * 40 * GQ_GROUP, GQ_GROUP, GQ_GROUP, acc);
    _Pragma("GCC unroll 4") for (int t = 0; t < GQ_GROUP; t++) {
        if (t >= nt) break;
        float *yt = y + (size_t)t * (size_t)ys;
        if (full_rows) _mm256_storeu_ps(yt, acc[t]);
        else _mm256_maskstore_ps(yt, rmask, acc[t]);
    }
}

/* Batched units [u0, u1) of a quantized matrix of type wt (see gemm_run). */
static inline __attribute__((always_inline)) void run_quant(enum dtype wt, int64_t n, const uint8_t *w,
                                                            int64_t nrows, const void *act, int num_tokens, float *y,
                                                            int64_t y_stride, long u0, long u1)
{
    const int64_t nb = n / 32;
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    const size_t tile_bytes = (size_t)nb * GEMM_QACT_BLOCK, grp_bytes = (size_t)nb * 40 * GQ_GROUP;
    const size_t stride = (size_t)nb * (size_t)sb_bytes(wt);
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * GQ_STRIP;
        const int nv = nrows - r0 < GQ_STRIP ? (int)(nrows - r0) : GQ_STRIP;
        const __m256i rmask = lane_mask(nv);
        const uint8_t *ws = w + (size_t)s * stride;
        for (int64_t kb = 0; kb < nb; kb += GQ_KC_BLOCKS) {
            const int nbk = nb - kb < GQ_KC_BLOCKS ? (int)(nb - kb) : GQ_KC_BLOCKS;
            for (long tl = tb; tl < te; tl++)
                for (int g = 0; g < GEMM_TILE / GQ_GROUP; g++) {
                    const int t0 = (int)tl * GEMM_TILE + g * GQ_GROUP;
                    if (t0 >= num_tokens) break;
                    const int nt = num_tokens - t0 < GQ_GROUP ? num_tokens - t0 : GQ_GROUP;
                    const uint8_t *xa = (const uint8_t *)act + (size_t)tl * tile_bytes + (size_t)g * grp_bytes +
                                        (size_t)kb * 40 * GQ_GROUP;
                    micro_quant(wt, ws + (size_t)kb * (size_t)sb_bytes(wt), xa, nbk,
                                y + (size_t)t0 * (size_t)y_stride + r0, y_stride, nt, rmask, nv == GQ_STRIP, kb > 0);
                }
        }
    }
}

/* Software prefetch GV_PF bytes ahead in each strip stream of the one-token kernels: with
 * the integer work this short, the out-of-order window alone keeps too few lines in
 * flight to cover DRAM latency (as for the per-token dots, quant_dot_x86.c). */
#ifndef GV_PF
#define GV_PF 384
#endif

static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *p, int bytes)
{
    for (int off = 0; off < bytes; off += 64) _mm_prefetch((const char *)p + GV_PF + off, _MM_HINT_T0);
}

/* One token over strips [s0, s1): per strip the tile kernel's chain with one token column
 * (activations: a group of width 1), strips one after another — one sequential stream,
 * which from DRAM measured faster than two strips side by side. */
static inline __attribute__((always_inline)) void gemv_quant(enum dtype wt, int64_t nb, const uint8_t *w,
                                                             int64_t nrows, const uint8_t *xa, float *y, int64_t s0,
                                                             int64_t s1)
{
    const size_t sbb = (size_t)sb_bytes(wt), stride = (size_t)nb * sbb;
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *p0 = w + (size_t)s * stride;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            prefetch_block(p0 + (size_t)b * sbb, (int)sbb);
            block_step(wt, p0 + (size_t)b * sbb, xa + (size_t)b * 40, 1, 1, &acc);
        }
        const int64_t r0 = s * GQ_STRIP, nv = nrows - r0;
        if (nv >= GQ_STRIP) _mm256_storeu_ps(y + r0, acc);
        else _mm256_maskstore_ps(y + r0, lane_mask((int)nv), acc);
    }
}

/* ---- float weights (F32, F16, BF16) ----
 *
 * Per (row, token) one f32 FMA chain over k in order: acc = fma(w_k, x_k, acc) from 0.
 * Batched: per chunk of GF_KC columns the strip is converted to f32 on the stack (16 KB)
 * once and every token group passes over it: 16 rows x 6 tokens = 12 accumulators, per k
 * 2 weight loads, 6 broadcasts and 12 FMAs. One token: the same chain per strip, four
 * strips side by side (eight independent chains) straight from the packed strips.
 */

static inline int float_bytes(enum dtype wt) { return wt == DT_F32 ? 4 : 2; }

/* 8 f32 from 8 packed values at p */
static inline __m256 ld8_packed(enum dtype wt, const uint8_t *p)
{
    if (wt == DT_F32) return _mm256_loadu_ps((const float *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (wt == DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Bytes of one float panel (GF_PANEL strips, [n][GF_PANEL * GF_STRIP] in the stored type)
 * and the address of strip s's 16 values of column k. */
static inline size_t panel_bytes(enum dtype wt, int64_t n)
{
    return (size_t)n * GF_PANEL * GF_STRIP * (size_t)float_bytes(wt);
}

static inline const uint8_t *strip_col(enum dtype wt, const uint8_t *w, int64_t n, int64_t s, int64_t k)
{
    return w + (size_t)(s / GF_PANEL) * panel_bytes(wt, n) +
           ((size_t)k * GF_PANEL * GF_STRIP + (size_t)(s % GF_PANEL) * GF_STRIP) * (size_t)float_bytes(wt);
}

/* Packs strips [s0, s1) of a float matrix; rows past nrows (to the panel's end) are zero. */
static void pack_float(enum dtype wt, int64_t n, const uint8_t *w, size_t row_bytes, int64_t nrows, int64_t s0,
                       int64_t s1, uint8_t *dst)
{
    const size_t es = (size_t)float_bytes(wt);
    for (int64_t s = s0; s < s1; s++) {
        for (int64_t k = 0; k < n; k++) memset((uint8_t *)strip_col(wt, dst, n, s, k), 0, GF_STRIP * es);
        for (int r = 0; r < GF_STRIP && s * GF_STRIP + r < nrows; r++) {
            const uint8_t *row = w + (size_t)(s * GF_STRIP + r) * row_bytes;
            for (int64_t k = 0; k < n; k++)
                memcpy((uint8_t *)strip_col(wt, dst, n, s, k) + (size_t)r * es, row + (size_t)k * es, es);
        }
    }
    /* strips past the matrix's last one, in its panel: zeroed so the copy holds no
     * uninitialised bytes (no kernel reads them) */
    const int64_t ns = (nrows + GF_STRIP - 1) / GF_STRIP;
    if (s1 == ns)
        for (int64_t s = ns; s % GF_PANEL; s++)
            for (int64_t k = 0; k < n; k++) memset((uint8_t *)strip_col(wt, dst, n, s, k), 0, GF_STRIP * es);
}

/* 16 rows x GF_GROUP tokens over kc columns of a chunk (f32 [k][16]) and a group's
 * activations xg (f32 [k][GF_GROUP]). m0, m1: lane masks of rows 0-7, 8-15. */
static void micro_float(const float *wp, const float *xg, int kc, float *y, int64_t ys, int nt, int nv, __m256i m0,
                        __m256i m1, int add)
{
    __m256 a0[GF_GROUP], a1[GF_GROUP];
    _Pragma("GCC unroll 8") for (int t = 0; t < GF_GROUP; t++) {
        const float *yt = y + (size_t)t * (size_t)ys;
        const int ld = add && t < nt;
        a0[t] = !ld ? _mm256_setzero_ps() : nv >= GF_STRIP ? _mm256_loadu_ps(yt) : _mm256_maskload_ps(yt, m0);
        a1[t] = !ld ? _mm256_setzero_ps() : nv >= GF_STRIP ? _mm256_loadu_ps(yt + 8) : _mm256_maskload_ps(yt + 8, m1);
    }
    for (int k = 0; k < kc; k++) {
        const __m256 w0 = _mm256_load_ps(wp + (size_t)k * GF_STRIP), w1 = _mm256_load_ps(wp + (size_t)k * GF_STRIP + 8);
        const float *xk = xg + (size_t)k * GF_GROUP;
        _Pragma("GCC unroll 8") for (int t = 0; t < GF_GROUP; t++) {
            const __m256 xb = _mm256_broadcast_ss(xk + t);
            a0[t] = _mm256_fmadd_ps(w0, xb, a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, xb, a1[t]);
        }
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < GF_GROUP; t++) {
        if (t >= nt) break;
        float *yt = y + (size_t)t * (size_t)ys;
        if (nv >= GF_STRIP) {
            _mm256_storeu_ps(yt, a0[t]);
            _mm256_storeu_ps(yt + 8, a1[t]);
        } else {
            _mm256_maskstore_ps(yt, m0, a0[t]);
            _mm256_maskstore_ps(yt + 8, m1, a1[t]);
        }
    }
}

/* Batched units [u0, u1) of a float matrix (see gemm_run). */
static void run_float(enum dtype wt, int64_t n, const uint8_t *w, int64_t nrows, const void *act, int num_tokens,
                      float *y, int64_t y_stride, long u0, long u1)
{
    _Alignas(32) float chunk[GF_KC * GF_STRIP];
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    const size_t tile_floats = (size_t)n * GEMM_TILE, grp_floats = (size_t)n * GF_GROUP;
    const size_t es = (size_t)float_bytes(wt);
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * GF_STRIP;
        const int nv = nrows - r0 < GF_STRIP ? (int)(nrows - r0) : GF_STRIP;
        const __m256i m0 = lane_mask(nv < 8 ? nv : 8), m1 = lane_mask(nv > 8 ? nv - 8 : 0);
        for (int64_t k0 = 0; k0 < n; k0 += GF_KC) {
            const int kc = n - k0 < GF_KC ? (int)(n - k0) : GF_KC;
            const uint8_t *src = strip_col(wt, w, n, s, k0);
            for (int k = 0; k < kc; k++) { /* the strip's 16 values of a column, a panel row apart */
                const uint8_t *c = src + (size_t)k * GF_PANEL * GF_STRIP * es;
                _mm256_store_ps(chunk + k * GF_STRIP, ld8_packed(wt, c));
                _mm256_store_ps(chunk + k * GF_STRIP + 8, ld8_packed(wt, c + 8 * es));
            }
            for (long tl = tb; tl < te; tl++)
                for (int g = 0; g < GEMM_TILE / GF_GROUP; g++) {
                    const int t0 = (int)tl * GEMM_TILE + g * GF_GROUP;
                    if (t0 >= num_tokens) break;
                    const int nt = num_tokens - t0 < GF_GROUP ? num_tokens - t0 : GF_GROUP;
                    const float *xg = (const float *)act + (size_t)tl * tile_floats + (size_t)g * grp_floats +
                                      (size_t)k0 * GF_GROUP;
                    micro_float(chunk, xg, kc, y + (size_t)t0 * (size_t)y_stride + r0, y_stride, nt, nv, m0, m1,
                                k0 > 0);
                }
        }
    }
}

/* Stores a float strip's two accumulators (rows r0..r0+15, nv of them valid). */
static inline void store_strip(float *y, int64_t nv, __m256 a0, __m256 a1)
{
    if (nv >= GF_STRIP) {
        _mm256_storeu_ps(y, a0);
        _mm256_storeu_ps(y + 8, a1);
        return;
    }
    _mm256_maskstore_ps(y, lane_mask(nv < 8 ? (int)nv : 8), a0);
    if (nv > 8) _mm256_maskstore_ps(y + 8, lane_mask((int)nv - 8), a1);
}

/* One token over strips [s0, s1): x[n] as packed for one token (a plain copy). A whole
 * panel in range runs its 4 strips side by side — 8 independent chains, as the FMA
 * latency needs, over one sequential stream; strips of a panel cut by the range run
 * alone. Each row's chain is the batched kernel's. No software prefetch: the hardware
 * prefetcher follows the one stream, and prefetching 384-4096 bytes ahead measured 10-20%
 * slower from DRAM (F16 1536x576, one thread); quantized strips, with ~5x more
 * instructions per byte, do gain from it. */
static inline __attribute__((always_inline)) void gemv_float(enum dtype wt, int64_t n, const uint8_t *w,
                                                             int64_t nrows, const float *xt, float *y, int64_t s0,
                                                             int64_t s1)
{
    const size_t es = (size_t)float_bytes(wt), row = GF_PANEL * GF_STRIP * es;
    for (int64_t s = s0; s < s1;) {
        if (s % GF_PANEL == 0 && s + GF_PANEL <= s1) {
            const uint8_t *p = strip_col(wt, w, n, s, 0);
            __m256 a[2 * GF_PANEL];
            _Pragma("GCC unroll 8") for (int i = 0; i < 2 * GF_PANEL; i++) a[i] = _mm256_setzero_ps();
            for (int64_t k = 0; k < n; k++) {
                const __m256 xb = _mm256_broadcast_ss(xt + k);
                const uint8_t *pk = p + (size_t)k * row;
                _Pragma("GCC unroll 8") for (int i = 0; i < 2 * GF_PANEL; i++)
                    a[i] = _mm256_fmadd_ps(ld8_packed(wt, pk + (size_t)i * 8 * es), xb, a[i]);
            }
            _Pragma("GCC unroll 4") for (int i = 0; i < GF_PANEL; i++) /* unrolled: a[] stays in registers */
                store_strip(y + (s + i) * GF_STRIP, nrows - (s + i) * GF_STRIP, a[2 * i], a[2 * i + 1]);
            s += GF_PANEL;
            continue;
        }
        const uint8_t *p = strip_col(wt, w, n, s, 0);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int64_t k = 0; k < n; k++) {
            const __m256 xb = _mm256_broadcast_ss(xt + k);
            const uint8_t *pk = p + (size_t)k * row;
            a0 = _mm256_fmadd_ps(ld8_packed(wt, pk), xb, a0);
            a1 = _mm256_fmadd_ps(ld8_packed(wt, pk + 8 * es), xb, a1);
        }
        store_strip(y + s * GF_STRIP, nrows - s * GF_STRIP, a0, a1);
        s++;
    }
}

/* ---- the set's entries ---- */

static size_t gemm_packed_bytes(enum dtype wt, int64_t n, int64_t nrows)
{
    switch (gemm_kind_of(wt)) {
    case GEMM_FLOAT:
        return (size_t)((nrows + GF_PANEL * GF_STRIP - 1) / (GF_PANEL * GF_STRIP)) * panel_bytes(wt, n);
    case GEMM_OFFSET: case GEMM_MIN:
        return (size_t)((nrows + GQ_STRIP - 1) / GQ_STRIP) * (size_t)(n / 32) * (size_t)sb_bytes(wt);
    default: return 0;
    }
}

static void gemm_pack_weight(enum dtype wt, int64_t n, const void *w, size_t row_bytes, int64_t nrows, int64_t s0,
                             int64_t s1, void *dst)
{
    if (gemm_kind_of(wt) == GEMM_FLOAT) pack_float(wt, n, w, row_bytes, nrows, s0, s1, dst);
    else pack_quant(wt, n / 32, w, row_bytes, nrows, s0, s1, dst);
}

/* One instance per quantized type, so the type's branches fold away. */
#define QUANT_TYPE_FNS(NAME, T)                                                                          \
    static void run_##NAME(int64_t n, const uint8_t *w, int64_t nrows, const void *act, int num_tokens,  \
                           float *y, int64_t y_stride, long u0, long u1)                                 \
    {                                                                                                    \
        if (num_tokens == 1) gemv_quant(T, n / 32, w, nrows, act, y, u0, u1);                            \
        else run_quant(T, n, w, nrows, act, num_tokens, y, y_stride, u0, u1);                            \
    }
QUANT_TYPE_FNS(q8_0, DT_Q8_0)
QUANT_TYPE_FNS(q4_0, DT_Q4_0)
QUANT_TYPE_FNS(q4_1, DT_Q4_1)
QUANT_TYPE_FNS(q5_0, DT_Q5_0)
QUANT_TYPE_FNS(q5_1, DT_Q5_1)

/* Work units are (strip, token tile), strip-major; one token: units are strips. */
static void gemm_run(enum dtype wt, int64_t n, const void *packed, int64_t nrows, const void *act, int num_tokens,
                     float *y, int64_t y_stride, long u0, long u1)
{
    const uint8_t *w = packed;
    switch (wt) {
    case DT_Q8_0: run_q8_0(n, w, nrows, act, num_tokens, y, y_stride, u0, u1); return;
    case DT_Q4_0: run_q4_0(n, w, nrows, act, num_tokens, y, y_stride, u0, u1); return;
    case DT_Q4_1: run_q4_1(n, w, nrows, act, num_tokens, y, y_stride, u0, u1); return;
    case DT_Q5_0: run_q5_0(n, w, nrows, act, num_tokens, y, y_stride, u0, u1); return;
    case DT_Q5_1: run_q5_1(n, w, nrows, act, num_tokens, y, y_stride, u0, u1); return;
    default:
        if (num_tokens == 1) {
            switch (wt) { /* one instance per type */
            case DT_F32: gemv_float(DT_F32, n, w, nrows, act, y, u0, u1); return;
            case DT_F16: gemv_float(DT_F16, n, w, nrows, act, y, u0, u1); return;
            default: gemv_float(DT_BF16, n, w, nrows, act, y, u0, u1); return;
            }
        }
        run_float(wt, n, w, nrows, act, num_tokens, y, y_stride, u0, u1);
    }
}

const struct quant_gemm quant_gemm_avx2 = {
    .strip_rows = {
        [DT_F32] = GF_STRIP, [DT_F16] = GF_STRIP, [DT_BF16] = GF_STRIP,
        [DT_Q8_0] = GQ_STRIP, [DT_Q4_0] = GQ_STRIP, [DT_Q4_1] = GQ_STRIP,
        [DT_Q5_0] = GQ_STRIP, [DT_Q5_1] = GQ_STRIP,
    },
    .packed_bytes = gemm_packed_bytes,
    .pack_weight = gemm_pack_weight,
    .pack_act = gemm_pack_act,
    .run = gemm_run,
};

#endif
