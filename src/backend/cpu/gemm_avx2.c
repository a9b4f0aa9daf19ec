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
 * group its 32-element blocks in order (a sequential stream for the micro-kernel), per
 * block tb * GQ_GROUP bytes, tb = gemm_qact_token_bytes (40; Q6_K 44):
 *   int32 q4[8][GQ_GROUP] codes 4j..4j+3 of each token | f32 d[GQ_GROUP] |
 *   c[GQ_GROUP]: int32 -o * sum(q) (Q8_0, Q4_0, Q5_0) or f32 d * sum(q) (Q4_1, Q5_1,
 *   Q4_K); Q6_K instead int32 c[2][GQ_GROUP]: -32 * sum(q) of elements 0-15 / 16-31.
 * A tile is then (n / 32) * tb * GEMM_TILE bytes, GEMM_QACT_BLOCK (GEMM_QACT16_BLOCK)
 * per block as gemm_act_bytes counts. A lone token is one group of width 1 (tb bytes a
 * block). Codes and scales are bitwise those of the per-token path (quantize_avx2), so
 * the two differ only in float order.
 *
 * K-quants (Q4_K, Q6_K): one strip-block per 256-element super-block of 8 rows (layouts
 * at Q4K_* / Q6K_*), activations scaled per 256 as Q8_K (the per-token path's codes,
 * bitwise): the d field of each of the super-block's 8 activation blocks holds the
 * super-block's scale. The arithmetic is gemm_avx512.c's:
 *   Q4_K: per 32-element sub-block j the Q4_1 chain above with dw = d * sc_j and
 *         mw = -(dmin * m_j), formed per sub-block from the fp16 d, dmin and the 6-bit
 *         sc, m (both products exact in f32: 11-bit x 6-bit significands). The codes are
 *         4-bit, so the 8 steps add up in int16 as for Q4_1 (<= 30480).
 *   Q6_K: u = q + 32 (6 bits, 0..63); |q_act| <= 127 (the packer clamps to +-127, never
 *         -128), so a vpmaddubsw pair is <= 2*63*127 = 16002 and two steps (one step
 *         pair) add up in int16 to <= 32004 < 32767; a third would not fit (48006), so one
 *         vpmaddwd per step pair, two per 16-element group g. The group's int32 sum
 *         starts at -32 sum q (packed with the activations per 16), so it is
 *         i_g = sum (u - 32) q, |i_g| <= 16*32*127 = 65024; scaled by the int8 sc_g in
 *         int32 (vpmulld) and summed over the super-block, |I| <= 16*128*65024 < 2^27,
 *         exact; then one float step per super-block: acc = fma((float)I, d * dx, acc).
 *
 * Float types (F32, F16, BF16): work units are strips of 16 rows, stored four to a panel
 * of 64 rows, [k][64] in the stored type (zero rows pad the last panel), so decode reads
 * one sequential stream with 8 independent chains; the batched micro-kernel is 16 rows x
 * 6 tokens (12 accumulators, 2 weight vectors, 1 broadcast).
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
#define GQ_KC_BLOCKS 32  /* 32-element blocks per chunk of a strip in the batched path */
#define GF_STRIP 16      /* rows per float strip (work unit): two ymm */
#define GF_PANEL 4       /* float strips stored interleaved: a panel of 64 rows */
#define GF_GROUP 6       /* tokens per float micro-kernel */
#define GF_KC 256        /* columns per float chunk: 16 x 256 f32 = 16 KB */

_Static_assert(GEMM_TILE % GQ_GROUP == 0 && GEMM_TILE % GF_GROUP == 0, "token tile splits into groups");
_Static_assert(GEMM_QACT_BLOCK == 40 * GEMM_TILE && GEMM_QACT16_BLOCK == 44 * GEMM_TILE,
               "activation block is 40 (Q6_K: 44) bytes a token");

/* Code offset o folded into the packed activations (Q8_0 is signed here: 0). */
static inline int act_offset(enum dtype wt) { return wt == DT_Q4_0 ? 8 : wt == DT_Q5_0 ? 16 : 0; }
/* Types whose activations carry f32 d * sum(q) for a min term (Q4_K: -dmin * m). */
static inline int has_min(enum dtype wt) { return wt == DT_Q4_1 || wt == DT_Q5_1 || wt == DT_Q4_K; }
/* Elements per strip-block (the GGUF block size: 32, or 256 for the K-quants). */
static inline int sb_elems(enum dtype wt) { return wt == DT_Q4_K || wt == DT_Q6_K ? 256 : 32; }
/* Packed activation bytes per token of one 32-element block (40; Q6_K 44). */
static inline int act_tb(enum dtype wt) { return gemm_qact_token_bytes(gemm_kind_of(wt)); }

/* Lane mask of the first nv (0..8) of 8 int32/f32 lanes. */
static inline __m256i lane_mask(int nv)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---- activations ---- */

/* Sum of the 8 int32 lanes of s. */
static inline int hsum_epi32(__m256i s)
{
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    return _mm_cvtsi128_si32(s4);
}

/* Quantizes one token row into lane `lane` of a group gw tokens wide whose 32-element
 * blocks are act_tb(wt) * gw bytes apart; rounding exactly as quantize_avx2 (d = amax /
 * 127 over the scale group: the block, or its 256-element super-block for the K-quants
 * as Q8_K; q = round to nearest even of x * (1/d), clamped to +-127). */
static void pack_act_quant(enum dtype wt, const float *x, int64_t n, uint8_t *grp, int lane, int gw)
{
    const int o = act_offset(wt), with_min = has_min(wt), k16 = wt == DT_Q6_K;
    const int64_t sg = sb_elems(wt); /* elements per activation scale */
    const size_t bstride = (size_t)act_tb(wt) * (size_t)gw;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int64_t g = 0; g < n; g += sg) {
        __m256 mx = _mm256_setzero_ps();
        for (int64_t i = g; i < g + sg; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(absmask, _mm256_loadu_ps(x + i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        for (int64_t b = g / 32; b < (g + sg) / 32; b++) {
            __m256i qi[4];
            for (int k = 0; k < 4; k++) {
                __m256 f = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * b + 8 * k), vid),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                qi[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
            }
            const int s0 = hsum_epi32(_mm256_add_epi32(qi[0], qi[1])); /* elements 0-15 */
            const int s1 = hsum_epi32(_mm256_add_epi32(qi[2], qi[3])); /* elements 16-31 */
            /* int32 -> int8 in element order: packs interleave the 128-bit lanes, the
             * permute puts the dwords back in order */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            int32_t w[8];
            _mm256_storeu_si256((__m256i *)w, p);
            uint8_t *blk = grp + (size_t)b * bstride;
            int32_t *q4 = (int32_t *)blk;
            for (int j = 0; j < 8; j++) q4[j * gw + lane] = w[j];
            ((float *)(blk + 32 * gw))[lane] = d;
            if (k16) {
                ((int32_t *)(blk + 36 * gw))[lane] = -32 * s0;
                ((int32_t *)(blk + 40 * gw))[lane] = -32 * s1;
            } else if (with_min) {
                ((float *)(blk + 36 * gw))[lane] = d * (float)(s0 + s1);
            } else {
                ((int32_t *)(blk + 36 * gw))[lane] = -o * (s0 + s1);
            }
        }
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
    const int tb = act_tb(wt);
    const size_t grp_bytes = (size_t)(n / 32) * (size_t)tb * GQ_GROUP, tile_bytes = grp_bytes * (GEMM_TILE / GQ_GROUP);
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
                int32_t *blk = (int32_t *)(grp + (size_t)b * (size_t)tb * GQ_GROUP);
                for (int j = 0; j < tb / 4; j++) blk[j * GQ_GROUP + l % GQ_GROUP] = 0; /* q4[8], d, c (Q6_K: c[2]) */
            }
        }
    }
}

/* ---- quantized weights: packed layout ---- */

/* K-quant strip-blocks (one 256-element super-block of 8 rows; offsets in bytes):
 *   Q4_K: f16 d[8] | f16 dmin[8] | u8 sc[8][8] | u8 m[8][8] | codes [8 sub-blocks][128]
 *   Q6_K: f16 d[8] | i8 sc[16][8] | per 32-element block [8][192]: u8 nibbles [4][8 rows][4] |
 *         u8 high [2][8 rows][4]
 * (sc[j][r]: sub-block or group j of row r, so one 8-byte load gives a scale for 8 rows.)
 * A sub-block's codes are the 4-bit step layout of the 32-element types. Q6_K's high byte
 * h (h = 0, 1) holds bits 4-5 of the codes of steps 4h..4h+3, step 4h+s at bits 2s..2s+1. */
#define Q4K_DMIN 16
#define Q4K_SC 32
#define Q4K_M 96
#define Q4K_CODES 160
#define Q4K_BYTES 1184 /* 8 x 148: the file's 144 + 4 bytes of unpacked scales */
#define Q6K_SC 16
#define Q6K_CODES 144
#define Q6K_BLOCK 192 /* codes of one 32-element block */
#define Q6K_BYTES 1680 /* 8 x 210, as the file */

/* Bytes of one packed block of an 8-row strip, and the offsets inside it. */
static inline int sb_bytes(enum dtype wt)
{
    return wt == DT_Q4_K ? Q4K_BYTES : wt == DT_Q6_K ? Q6K_BYTES : GQ_STRIP * dtype_block_bytes(wt);
}
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

/* Row r's 4-bit codes u[0..31] of one 32-element block in the step layout at c: byte
 * [k][r][i] = u[8k + i] | u[8k + 4 + i] << 4 (steps 2k and 2k+1). */
static void put_nibble_steps(const uint8_t *u, int r, uint8_t *c)
{
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++)
            c[32 * k + 4 * r + i] = (uint8_t)((u[8 * k + i] & 0x0F) | (u[8 * k + 4 + i] & 0x0F) << 4);
}

/* Row r of a Q4_K strip-block pb (zeroed beforehand) from one GGUF super-block at blk:
 * element 64k + l (l < 32) is the low nibble of qs[32k + l], 64k + 32 + l its high one. */
static void pack_row_q4k(const uint8_t *blk, int r, uint8_t *pb)
{
    uint8_t sc[8], m[8], u[256];
    memcpy(pb + 2 * r, blk, 2);
    memcpy(pb + Q4K_DMIN + 2 * r, blk + 2, 2);
    quant_q4k_scales(blk + 4, sc, m);
    for (int j = 0; j < 8; j++) {
        pb[Q4K_SC + GQ_STRIP * j + r] = sc[j];
        pb[Q4K_M + GQ_STRIP * j + r] = m[j];
    }
    quant_q4k_codes(blk, u);
    for (int j = 0; j < 8; j++) put_nibble_steps(u + 32 * j, r, pb + Q4K_CODES + 128 * j);
}

/* Row r of a Q6_K strip-block pb (zeroed beforehand) from one GGUF super-block at blk:
 * unsigned codes u = q + 32 (6 bits) as quant_dequant.c's dq_q6_k reads them. */
static void pack_row_q6k(const uint8_t *blk, int r, uint8_t *pb)
{
    uint8_t u[256];
    memcpy(pb + 2 * r, blk + 208, 2);
    for (int g = 0; g < 16; g++) pb[Q6K_SC + GQ_STRIP * g + r] = blk[192 + g];
    quant_q6k_codes(blk, u);
    for (int b = 0; b < 8; b++) {
        uint8_t *c = pb + Q6K_CODES + Q6K_BLOCK * b;
        put_nibble_steps(u + 32 * b, r, c);
        for (int j = 0; j < 8; j++) /* step j: high byte j / 4, bits 2 (j % 4) */
            for (int i = 0; i < 4; i++)
                c[128 + 32 * (j / 4) + 4 * r + i] |= (uint8_t)((u[32 * b + 4 * j + i] >> 4) << (2 * (j % 4)));
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

/* Packs strips [s0, s1) of a quantized matrix (rows of nb GGUF blocks at w + r * row_bytes). */
static void pack_quant(enum dtype wt, int64_t nb, const uint8_t *w, size_t row_bytes, int64_t nrows, int64_t s0,
                       int64_t s1, uint8_t *dst)
{
    const int bb = dtype_block_bytes(wt), sbb = sb_bytes(wt);
    for (int64_t s = s0; s < s1; s++) {
        uint8_t *ps = dst + (size_t)s * (size_t)nb * (size_t)sbb;
        memset(ps, 0, (size_t)nb * (size_t)sbb); /* padding rows: zero codes and scales */
        for (int r = 0; r < GQ_STRIP && s * GQ_STRIP + r < nrows; r++) {
            const uint8_t *row = w + (size_t)(s * GQ_STRIP + r) * row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * (size_t)bb;
                uint8_t *pb = ps + (size_t)b * (size_t)sbb;
                if (wt == DT_Q4_K) pack_row_q4k(blk, r, pb);
                else if (wt == DT_Q6_K) pack_row_q6k(blk, r, pb);
                else pack_row_block(wt, blk, r, pb);
            }
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

/* Bits 4-5 of the Q6_K codes of step 4h + s from high byte vector v (see the layout).
 * The 16-bit shifts move bits across bytes only into bits the mask clears. */
static inline __attribute__((always_inline)) __m256i q6k_high(__m256i v, int s)
{
    const __m256i t = s == 0 ? _mm256_slli_epi16(v, 4) : s == 1 ? _mm256_slli_epi16(v, 2)
                    : s == 2 ? v : _mm256_srli_epi16(v, 2);
    return _mm256_and_si256(t, _mm256_set1_epi8(0x30));
}

/* Unsigned codes of steps 2k and 2k+1 of a 4/5-bit strip-block (8 rows x 4 bytes each),
 * or for the K-quants of the 32-element block whose codes start at pb. */
static inline __attribute__((always_inline)) void step_codes(enum dtype wt, const uint8_t *pb, int k, __m256i *a,
                                                             __m256i *b)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (wt == DT_Q4_K || wt == DT_Q6_K) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(pb + 32 * k));
        *a = _mm256_and_si256(v, m4);
        *b = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (wt == DT_Q6_K) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(pb + 128 + 32 * (k / 2)));
            *a = _mm256_or_si256(*a, q6k_high(h, 2 * (k % 2)));
            *b = _mm256_or_si256(*b, q6k_high(h, 2 * (k % 2) + 1));
        }
        return;
    }
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
 * is[t] = sum_i u_ri q_ti (+ c_t for offset types) for the 8 rows of strip-block pb (Q4_K:
 * of the sub-block whose codes start at pb) and the tokens of a group gw wide at
 * activation block xb (NT <= gw). Exact integers. */
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
    if (wt == DT_Q4_0 || wt == DT_Q4_1 || wt == DT_Q4_K) { /* 8 steps in int16 (<= 30480), one vpmaddwd */
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

/* 8 f32 lanes from the 8 bytes at p: one unsigned 6-bit Q4_K scale or min per row. */
static inline __m256 u8x8_ps(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Q4_K, one super-block (strip-block pb; its 8 activation blocks from xb, 40 * gw bytes
 * apart): per sub-block j the Q4_1 chain with dw = d * sc_j, mw = dmin * m_j (exact):
 *   acc = fma((float)isum, dw * dx, acc); acc = fnmadd(mw, dx * sum(q), acc) */
static inline __attribute__((always_inline)) void q4k_step(const uint8_t *pb, const uint8_t *xb, int gw, int nt_reg,
                                                           __m256 *acc)
{
    const __m256 d = sb_dw(pb), dmin = sb_mw(pb); /* sb_mw reads offset 16 = Q4K_DMIN */
    for (int j = 0; j < 8; j++) {
        const uint8_t *x = xb + (size_t)j * 40 * (size_t)gw;
        __m256i is[GQ_GROUP];
        block_isums(DT_Q4_K, pb + Q4K_CODES + 128 * j, x, gw, nt_reg, is);
        const __m256 dw = _mm256_mul_ps(d, u8x8_ps(pb + Q4K_SC + GQ_STRIP * j));
        const __m256 mw = _mm256_mul_ps(dmin, u8x8_ps(pb + Q4K_M + GQ_STRIP * j));
        const float *xd = (const float *)(x + 32 * gw), *xs = (const float *)(x + 36 * gw);
        _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + t)), acc[t]);
        _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++)
            acc[t] = _mm256_fnmadd_ps(mw, _mm256_broadcast_ss(xs + t), acc[t]);
    }
}

/* Q6_K, one super-block (strip-block pb; its 8 activation blocks from xb, 44 * gw bytes
 * apart): per 16-element group g = 2b + h (steps 4h..4h+3 of block b) the exact
 *   i_g = -32 sum q + sum u q   (two step pairs, each one vpmaddwd: <= 32004 in int16)
 * scaled by sc_g in int32 and summed, I = sum_g sc_g i_g; then one float step
 *   acc = fma((float)I, d * dx, acc). */
static inline __attribute__((always_inline)) void q6k_step(const uint8_t *pb, const uint8_t *xb, int gw, int nt_reg,
                                                           __m256 *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i isb[GQ_GROUP];
    _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) isb[t] = _mm256_setzero_si256();
    for (int b = 0; b < 8; b++) {
        const uint8_t *x = xb + (size_t)b * 44 * (size_t)gw, *cb = pb + Q6K_CODES + Q6K_BLOCK * b;
        const int32_t *q4 = (const int32_t *)x;
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const int32_t *c = (const int32_t *)(x + (36 + 4 * h) * gw);
            const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(pb + Q6K_SC + GQ_STRIP * (2 * b + h))));
            __m256i a0, b0, a1, b1;
            step_codes(DT_Q6_K, cb, 2 * h, &a0, &b0);     /* steps 4h, 4h+1 */
            step_codes(DT_Q6_K, cb, 2 * h + 1, &a1, &b1); /* steps 4h+2, 4h+3 */
            _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++) {
                const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(a0, bcast32(q4 + 4 * h * gw + t)),
                                                    _mm256_maddubs_epi16(b0, bcast32(q4 + (4 * h + 1) * gw + t)));
                const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(a1, bcast32(q4 + (4 * h + 2) * gw + t)),
                                                    _mm256_maddubs_epi16(b1, bcast32(q4 + (4 * h + 3) * gw + t)));
                const __m256i ig = _mm256_add_epi32(_mm256_add_epi32(bcast32(c + t), _mm256_madd_epi16(p0, ones)),
                                                    _mm256_madd_epi16(p1, ones));
                isb[t] = _mm256_add_epi32(isb[t], _mm256_mullo_epi32(ig, sc));
            }
        }
    }
    const __m256 d = sb_dw(pb);
    const float *xd = (const float *)(xb + 32 * gw); /* the super-block's scale, in each block */
    _Pragma("GCC unroll 4") for (int t = 0; t < nt_reg; t++)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isb[t]), _mm256_mul_ps(d, _mm256_broadcast_ss(xd + t)), acc[t]);
}

/* One strip-block's step of the chain: a 32-element block, or a K-quant super-block. */
static inline __attribute__((always_inline)) void sblock_step(enum dtype wt, const uint8_t *pb, const uint8_t *xb,
                                                              int gw, int nt_reg, __m256 *acc)
{
    if (wt == DT_Q4_K) q4k_step(pb, xb, gw, nt_reg, acc);
    else if (wt == DT_Q6_K) q6k_step(pb, xb, gw, nt_reg, acc);
    else block_step(wt, pb, xb, gw, nt_reg, acc);
}

/* Packed activation bytes of one strip-block's elements for a group gw tokens wide. */
static inline size_t act_sb_bytes(enum dtype wt, int gw)
{
    return (size_t)(sb_elems(wt) / 32) * (size_t)act_tb(wt) * (size_t)gw;
}

/* 8 rows x GQ_GROUP tokens over nbk strip-blocks of a strip chunk wp and a group's
 * activations xa; tokens >= nt are padding (computed, not stored). add: continue the
 * chains in y. */
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
        sblock_step(wt, wp + (size_t)b * (size_t)sbb, xa + (size_t)b * act_sb_bytes(wt, GQ_GROUP), GQ_GROUP, GQ_GROUP,
                    acc);
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
    const int per = sb_elems(wt) / 32; /* 32-element activation blocks per strip-block */
    const int64_t nb = n / sb_elems(wt), kc = GQ_KC_BLOCKS / per;
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    const size_t grp_bytes = (size_t)nb * act_sb_bytes(wt, GQ_GROUP), tile_bytes = grp_bytes * (GEMM_TILE / GQ_GROUP);
    const size_t stride = (size_t)nb * (size_t)sb_bytes(wt);
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * GQ_STRIP;
        const int nv = nrows - r0 < GQ_STRIP ? (int)(nrows - r0) : GQ_STRIP;
        const __m256i rmask = lane_mask(nv);
        const uint8_t *ws = w + (size_t)s * stride;
        for (int64_t kb = 0; kb < nb; kb += kc) {
            const int nbk = nb - kb < kc ? (int)(nb - kb) : (int)kc;
            for (long tl = tb; tl < te; tl++)
                for (int g = 0; g < GEMM_TILE / GQ_GROUP; g++) {
                    const int t0 = (int)tl * GEMM_TILE + g * GQ_GROUP;
                    if (t0 >= num_tokens) break;
                    const int nt = num_tokens - t0 < GQ_GROUP ? num_tokens - t0 : GQ_GROUP;
                    const uint8_t *xa = (const uint8_t *)act + (size_t)tl * tile_bytes + (size_t)g * grp_bytes +
                                        (size_t)kb * act_sb_bytes(wt, GQ_GROUP);
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
    const size_t sbb = (size_t)sb_bytes(wt), stride = (size_t)nb * sbb, xstep = act_sb_bytes(wt, 1);
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *p0 = w + (size_t)s * stride;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            prefetch_block(p0 + (size_t)b * sbb, (int)sbb);
            sblock_step(wt, p0 + (size_t)b * sbb, xa + (size_t)b * xstep, 1, 1, &acc);
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
    case GEMM_OFFSET: case GEMM_MIN: case GEMM_KMIN: case GEMM_K16:
        return (size_t)((nrows + GQ_STRIP - 1) / GQ_STRIP) * (size_t)(n / sb_elems(wt)) * (size_t)sb_bytes(wt);
    default: return 0;
    }
}

static void gemm_pack_weight(enum dtype wt, int64_t n, const void *w, size_t row_bytes, int64_t nrows, int64_t s0,
                             int64_t s1, void *dst)
{
    if (gemm_kind_of(wt) == GEMM_FLOAT) pack_float(wt, n, w, row_bytes, nrows, s0, s1, dst);
    else pack_quant(wt, n / sb_elems(wt), w, row_bytes, nrows, s0, s1, dst);
}

/* One instance per quantized type, so the type's branches fold away. */
#define QUANT_TYPE_FNS(NAME, T)                                                                          \
    static void run_##NAME(int64_t n, const uint8_t *w, int64_t nrows, const void *act, int num_tokens,  \
                           float *y, int64_t y_stride, long u0, long u1)                                 \
    {                                                                                                    \
        if (num_tokens == 1) gemv_quant(T, n / sb_elems(T), w, nrows, act, y, u0, u1);                   \
        else run_quant(T, n, w, nrows, act, num_tokens, y, y_stride, u0, u1);                            \
    }
QUANT_TYPE_FNS(q8_0, DT_Q8_0)
QUANT_TYPE_FNS(q4_0, DT_Q4_0)
QUANT_TYPE_FNS(q4_1, DT_Q4_1)
QUANT_TYPE_FNS(q5_0, DT_Q5_0)
QUANT_TYPE_FNS(q5_1, DT_Q5_1)
QUANT_TYPE_FNS(q4_k, DT_Q4_K)
QUANT_TYPE_FNS(q6_k, DT_Q6_K)

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
    case DT_Q4_K: run_q4_k(n, w, nrows, act, num_tokens, y, y_stride, u0, u1); return;
    case DT_Q6_K: run_q6_k(n, w, nrows, act, num_tokens, y, y_stride, u0, u1); return;
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
        [DT_Q5_0] = GQ_STRIP, [DT_Q5_1] = GQ_STRIP, [DT_Q4_K] = GQ_STRIP, [DT_Q6_K] = GQ_STRIP,
    },
    .packed_bytes = gemm_packed_bytes,
    .pack_weight = gemm_pack_weight,
    .pack_act = gemm_pack_act,
    .run = gemm_run,
};

#endif
