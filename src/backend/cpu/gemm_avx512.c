/* gemm_avx512.c — matmul on weights repacked at load time, AVX-512 F/BW/VL/VBMI/VNNI.
 *
 * y[t][r] = sum_i W[r][i] x[t][i], computed as register tiles of 16 output rows (one zmm,
 * lane = row) x GEMM_TILE tokens, so every weight vector loaded is used GEMM_TILE times
 * and no horizontal sums are needed. One token (decode) runs the same arithmetic with one
 * token column, so a token's result does not depend on the batch it is in.
 *
 * Quantized 32-element types. Every format is brought to one form per block of 32:
 *   W[r][i] = dw_r * u_ri + mw_r       (u unsigned byte code)
 *     Q8_0: u = w + 128, Q4_0: u = nibble (w + 8), Q5_0: u = 5-bit code (w + 16), all
 *           with mw = 0 and the offset folded into the integer sum below;
 *     Q4_1, Q5_1: u = code, mw = m.
 * Activations are Q8_0-style: x[t][i] ~ dx_t q_ti. Then per block
 *   sum_i W x = dw dx (sum_i u q - o sum_i q) + mw (dx sum_i q)
 * The integer part runs on vpdpbusd (unsigned weight bytes x signed activation bytes, 4
 * products per int32 lane); the int32 accumulators start at -o * sum(q) (packed with the
 * activations), so one convert, one multiply (dw * dx) and one FMA per block and token
 * finish it, plus one FMA with mw for Q?_1. Per (row, token) the float chain runs over
 * the blocks in order: acc = fma((float)isum_b, dw_b * dx_b, acc) [+ fma(mw_b, s_b, acc)].
 *
 * Packed weights (gemm_pack_weight, once per model): strips of 16 rows (the last padded
 * with zero rows), each strip its blocks in order, so a strip is one sequential stream.
 * A strip-block is 16 times the GGUF block (same bytes per weight as the file):
 *   f16 dw[16] | Q?_1: f16 mw[16] | Q5_?: u64 hbits[8] | codes
 *   codes, Q8_0: u8 [8 steps][16 rows][4]   (step j = elements 4j..4j+3 of every row)
 *          4/5-bit: u8 [4][16 rows][4], low nibble step 2k, high nibble step 2k+1
 *   hbits[j] bit 4r+i: bit 4 of row r's code 4j+i (Q5_0, Q5_1)
 * So one 64-byte load (plus a nibble split) gives one step's codes for 16 rows, the
 * operand of one vpdpbusd per token.
 *
 * K-quants: one strip-block per 256-element super-block (layouts at Q4K_* / Q6K_*),
 * activations scaled per 256 as Q8_K (the per-token path's codes, bitwise).
 *   Q4_K: per 32-element sub-block j the Q4_1 chain above with dw = d * sc_j and
 *         mw = -(dmin * m_j), formed per sub-block from the fp16 d, dmin and the 6-bit
 *         sc, m; both products are exact in f32 (11-bit x 6-bit significands).
 *   Q6_K: u = q + 32 (6 bits), per 16-element group g the integer sum
 *         i_g = sum u q - 32 sum q (accumulator started at -32 sum q, packed with the
 *         activations per 16), scaled by the int8 sc_g in int32 (vpmulld) and summed
 *         over the super-block, I = sum_g sc_g i_g (|I| < 2^29, exact), then one float
 *         step per super-block: acc = fma((float)I, d * dx, acc). Against a float step
 *         per group (fma((float)i_g, (d * sc_g) * dx, acc)) it measured 5-15% faster
 *         batched and ~8% with one token; decoding each chunk once into an L1 buffer
 *         for all token tiles measured no faster than unpacking per tile.
 *
 * Float types (F32, F16, BF16): strips of 32 rows, [k][32] in the stored type; see
 * "float weights" below (BF16 in GEMM_BF16_DOT builds: k-pairs for vdpbf16ps).
 *
 * The batched path walks each strip in chunks of GQ_KC_BLOCKS blocks (10-17 KB, stays in
 * L1/L2 while every token tile passes over it); chunks after the first add to y, which
 * continues the same float chain. Each output's arithmetic depends only on its row, token
 * and K, never on the thread split or the batch. The packed activations' layout is in
 * quant_kernels.h.
 */
#include "backend/cpu/quant_kernels.h"

#ifdef GEMM_HAVE_AVX512

#include "util/half.h"

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#define GQ_STRIP 16
#define GQ_KC_BLOCKS 32 /* blocks per chunk of a strip in the batched path */

/* ---- activations ---- */

/* Codes of one 32-element block, q = round-to-nearest-even(x * id) clamped to +-127, as
 * int32 in *q0 (elements 0-15) and *q1 (16-31), and as int8 in the block's q4 words of
 * lane `lane` (blk: the block's packed bytes in a tile tw tokens wide). */
static inline __attribute__((always_inline)) void quant_block32(const float *x, __m512 vid, uint8_t *blk, int lane,
                                                                int tw, __m512i *q0, __m512i *q1)
{
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    v0 = _mm512_roundscale_ps(_mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v1 = _mm512_roundscale_ps(_mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    *q0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v0, lo), hi));
    *q1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v1, lo), hi));
    int32_t w[8];
    _mm_storeu_si128((__m128i *)w, _mm512_cvtepi32_epi8(*q0));
    _mm_storeu_si128((__m128i *)(w + 4), _mm512_cvtepi32_epi8(*q1));
    int32_t *q4 = (int32_t *)blk;
    for (int j = 0; j < 8; j++) q4[j * tw + lane] = w[j];
}

/* Horizontal max (or int32 sum, when add) of 16 vectors at once: lane b of the result is
 * the reduction of v[b]'s 16 lanes (v is clobbered). A tree of 128-bit and in-lane shuffles,
 * 46 operations for all 16 instead of a dependent chain of 8 per vector; max and integer
 * addition are exact in any order, so each lane equals _mm512_reduce_max_ps /
 * _mm512_reduce_add_epi32 of its vector. */
static inline __attribute__((always_inline)) __m512 reduce16(__m512 *v, int add)
{
#define R16_OP(a, b) (add ? _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b))) \
                          : _mm512_max_ps(a, b))
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) /* 128-bit lanes [a0|a2, a1|a3, b0|b2, b1|b3] */
        v[i] = R16_OP(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) /* 128-bit lane k: vector 4i + k's four partials */
        v[i] = R16_OP(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
    const __m512 y01 = R16_OP(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
    const __m512 y23 = R16_OP(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
    const __m512 r = R16_OP(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(y01), _mm512_castps_pd(y23))),
                            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(y01), _mm512_castps_pd(y23))));
#undef R16_OP
    /* lane 4k + i of r is vector 4i + k */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, r);
}

/* The 32-element types (a scale per block), up to 16 blocks at a time: the maxima, the
 * scales and the code sums of 16 blocks come out of one reduce16 / one vector division
 * each, instead of a dependent horizontal chain and two scalar divisions per block. */
static void pack_act_quant32(enum dtype wt, const float *x, int64_t n, uint8_t *tile, int lane, int tw)
{
    const int o = gemm_code_offset(wt), with_min = gemm_kind_of(wt) == GEMM_MIN;
    const size_t bstride = (size_t)gemm_qact_token_bytes(gemm_kind_of(wt)) * (size_t)tw;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b0 = 0; b0 < n / 32; b0 += 16) {
        const int nbk = n / 32 - b0 < 16 ? (int)(n / 32 - b0) : 16;
        const float *xb = x + 32 * b0;
        __m512 v[16];
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
            v[i] = i < nbk ? _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + 32 * i), absmask),
                                           _mm512_and_ps(_mm512_loadu_ps(xb + 32 * i + 16), absmask))
                           : _mm512_setzero_ps();
        /* d = amax / 127, id = d != 0 ? 1 / d : 0 (unordered: a NaN d gives a NaN id, as in C) */
        const __m512 d = _mm512_div_ps(reduce16(v, 0), _mm512_set1_ps(127.0f));
        const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ),
                                              _mm512_set1_ps(1.0f), d);
        float dv[16], idv[16];
        _mm512_storeu_ps(dv, d);
        _mm512_storeu_ps(idv, id);
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
            v[i] = _mm512_setzero_ps();
            if (i >= nbk) continue;
            uint8_t *blk = tile + (size_t)(b0 + i) * bstride;
            __m512i q0, q1;
            quant_block32(xb + 32 * i, _mm512_set1_ps(idv[i]), blk, lane, tw, &q0, &q1);
            v[i] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
            ((float *)(blk + 32 * tw))[lane] = dv[i];
        }
        int32_t sum[16];
        _mm512_storeu_si512((void *)sum, _mm512_castps_si512(reduce16(v, 1)));
        for (int i = 0; i < nbk; i++) {
            uint8_t *blk = tile + (size_t)(b0 + i) * bstride;
            if (with_min) ((float *)(blk + 36 * tw))[lane] = dv[i] * (float)sum[i];
            else ((int32_t *)(blk + 36 * tw))[lane] = -o * sum[i];
        }
    }
}

/* The K-quants: one scale per 256 elements, as Q8_K. */
static void pack_act_quant_k(enum dtype wt, const float *x, int64_t n, uint8_t *tile, int lane, int tw)
{
    const enum gemm_kind kind = gemm_kind_of(wt);
    const size_t bstride = (size_t)gemm_qact_token_bytes(kind) * (size_t)tw;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t g = 0; g < n; g += 256) {
        __m512 mx = _mm512_setzero_ps();
        for (int64_t i = g; i < g + 256; i += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_loadu_ps(x + i), absmask));
        const float amax = _mm512_reduce_max_ps(mx);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t b = g / 32; b < (g + 256) / 32; b++) {
            uint8_t *blk = tile + (size_t)b * bstride;
            __m512i q0, q1;
            quant_block32(x + 32 * b, _mm512_set1_ps(id), blk, lane, tw, &q0, &q1);
            const int s0 = kind == GEMM_K16 ? _mm512_reduce_add_epi32(q0) : 0;
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)), s1 = sum - s0;
            ((float *)(blk + 32 * tw))[lane] = d;
            if (kind == GEMM_K16) {
                ((int32_t *)(blk + 36 * tw))[lane] = -32 * s0;
                ((int32_t *)(blk + 40 * tw))[lane] = -32 * s1;
            } else { /* GEMM_KMIN */
                ((float *)(blk + 36 * tw))[lane] = d * (float)sum;
            }
        }
    }
}

/* Quantizes one token row into lane `lane` of a tile tw tokens wide (GEMM_TILE, or 1 for a
 * lone token: then a block is 40 or 44 contiguous bytes); rounding as quantize_avx2 /
 * quantize_scalar (d = amax / 127 over the scale group: 32 elements, or 256 for the
 * K-quants as Q8_K; q = round-to-nearest-even(x / d) clamped to +-127). */
static void pack_act_quant(enum dtype wt, const float *x, int64_t n, uint8_t *tile, int lane, int tw)
{
    const enum gemm_kind kind = gemm_kind_of(wt);
    if (kind == GEMM_KMIN || kind == GEMM_K16) pack_act_quant_k(wt, x, n, tile, lane, tw);
    else pack_act_quant32(wt, x, n, tile, lane, tw);
}

static void pack_act_float(enum dtype wt, const float *x, int64_t n, int num_tokens, int t0, int t1, void *act);

static void gemm_pack_act(enum dtype wt, const float *x, int64_t n, int num_tokens, int t0, int t1,
                          void *act)
{
    if (num_tokens == 1) { /* one token: a tile of width 1 (the decode kernels' layout) */
        if (t0 >= t1) return; /* another thread's share has the token */
        if (gemm_kind_of(wt) == GEMM_FLOAT) pack_act_float(wt, x, n, 1, 0, 1, act);
        else pack_act_quant(wt, x, n, act, 0, 1);
        return;
    }
    if (gemm_kind_of(wt) == GEMM_FLOAT) {
        pack_act_float(wt, x, n, num_tokens, t0, t1, act);
        return;
    }
    const int words = gemm_qact_token_bytes(gemm_kind_of(wt)) / 4; /* per token per block */
    const size_t block = (size_t)words * 4 * GEMM_TILE, tile_bytes = (size_t)(n / 32) * block;
    for (int t = t0; t < t1; t++)
        pack_act_quant(wt, x + (size_t)t * (size_t)n, n, (uint8_t *)act + (size_t)(t / GEMM_TILE) * tile_bytes,
                       t % GEMM_TILE, GEMM_TILE);
    if (t1 == num_tokens && num_tokens % GEMM_TILE) { /* zero tokens pad the last tile */
        uint8_t *tile = (uint8_t *)act + (size_t)(num_tokens / GEMM_TILE) * tile_bytes;
        for (int lane = num_tokens % GEMM_TILE; lane < GEMM_TILE; lane++)
            for (int64_t b = 0; b < n / 32; b++) {
                int32_t *blk = (int32_t *)(tile + (size_t)b * block);
                for (int j = 0; j < words; j++) blk[j * GEMM_TILE + lane] = 0; /* q4[8], d, c (Q6_K: c[2]) */
            }
    }
}

/* ---- quantized weights: packed layout ---- */

/* K-quant strip-blocks (one 256-element super-block of 16 rows; offsets in bytes):
 *   Q4_K: f16 d[16] | f16 dmin[16] | u8 sc[8][16] | u8 m[8][16] | codes [8 sub-blocks][256]
 *   Q6_K: f16 d[16] | i8 sc[16][16] | per 32-block [8][384]: u8 nibbles [4][16 rows][4] |
 *         u8 high [2][16 rows][4]
 * A sub-block's codes are the 4-bit step layout of the 32-element types. Q6_K's high byte
 * h (h = 0, 1) holds bits 4-5 of the codes of steps 4h..4h+3, step 4h+s at bits 2s..2s+1. */
#define Q4K_DMIN 32
#define Q4K_SC 64
#define Q4K_M 192
#define Q4K_CODES 320
#define Q4K_BYTES 2368 /* 16 x 148: the file's 144 + 4 bytes of unpacked scales */
#define Q6K_SC 32
#define Q6K_CODES 288
#define Q6K_BLOCK 384 /* codes of one 32-element block */
#define Q6K_BYTES 3360 /* 16 x 210, as the file */

/* Bytes of one packed block of a 16-row strip, and the offsets inside it. A constant for
 * each type (GGUF's block bytes x 16), so the per-type kernels fold it: no call per block. */
static inline int sb_bytes(enum dtype wt)
{
    switch (wt) {
    case DT_Q8_0: return GQ_STRIP * 34;
    case DT_Q4_0: return GQ_STRIP * 18;
    case DT_Q4_1: return GQ_STRIP * 20;
    case DT_Q5_0: return GQ_STRIP * 22;
    case DT_Q5_1: return GQ_STRIP * 24;
    case DT_Q4_K: return Q4K_BYTES;
    case DT_Q6_K: return Q6K_BYTES;
    default: return 0; /* not a packed quantized type */
    }
}
/* Elements per strip-block (the GGUF block size: 32, or 256 for the K-quants). */
static inline int sb_elems(enum dtype wt) { return wt == DT_Q4_K || wt == DT_Q6_K ? 256 : 32; }
/* Packed activation bytes of one 32-element block of a tile (GEMM_TILE tokens). */
static inline int act_block(enum dtype wt) { return gemm_qact_token_bytes(gemm_kind_of(wt)) * GEMM_TILE; }
static inline int sb_has_min(enum dtype wt) { return wt == DT_Q4_1 || wt == DT_Q5_1; }
static inline int sb_hbits(enum dtype wt) { return wt == DT_Q5_0 ? 32 : wt == DT_Q5_1 ? 64 : -1; }
static inline int sb_codes(enum dtype wt)
{
    switch (wt) {
    case DT_Q4_1: return 64;
    case DT_Q5_0: return 96;
    case DT_Q5_1: return 128;
    default: return 32; /* Q8_0, Q4_0 */
    }
}

/* Row r's 4-bit codes u[0..31] of one 32-element block in the step layout at c: byte
 * [k][r][i] = u[8k + i] | u[8k + 4 + i] << 4 (steps 2k and 2k+1). */
static void put_nibble_steps(const uint8_t *u, int r, uint8_t *c)
{
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++) c[64 * k + 4 * r + i] = (uint8_t)((u[8 * k + i] & 0x0F) | (u[8 * k + 4 + i] & 0x0F) << 4);
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
        pb[Q4K_SC + 16 * j + r] = sc[j];
        pb[Q4K_M + 16 * j + r] = m[j];
    }
    quant_q4k_codes(blk, u);
    for (int j = 0; j < 8; j++) put_nibble_steps(u + 32 * j, r, pb + Q4K_CODES + 256 * j);
}

/* Row r of a Q6_K strip-block pb (zeroed beforehand) from one GGUF super-block at blk:
 * unsigned codes u = q + 32 (6 bits) as quant_dequant.c's dq_q6_k reads them. */
static void pack_row_q6k(const uint8_t *blk, int r, uint8_t *pb)
{
    uint8_t u[256];
    memcpy(pb + 2 * r, blk + 208, 2);
    for (int g = 0; g < 16; g++) pb[Q6K_SC + 16 * g + r] = blk[192 + g];
    quant_q6k_codes(blk, u);
    for (int b = 0; b < 8; b++) {
        uint8_t *c = pb + Q6K_CODES + Q6K_BLOCK * b;
        put_nibble_steps(u + 32 * b, r, c);
        for (int j = 0; j < 8; j++) /* step j: high byte j / 4, bits 2 (j % 4) */
            for (int i = 0; i < 4; i++)
                c[256 + 64 * (j / 4) + 4 * r + i] |= (uint8_t)((u[32 * b + 4 * j + i] >> 4) << (2 * (j % 4)));
    }
}

/* Row r of a strip-block pb (zeroed beforehand) from one GGUF block at blk. Unsigned
 * codes u[e] (e = element): Q8_0 w + 128; 4-bit types q[e] & 15 for e < 16, q[e - 16] >> 4
 * above (q: the block's 16 nibble bytes); Q5_? add bit e of qh as 0x10. Step j of the
 * packed codes holds u[4j..4j+3]; 4-bit steps 2k (low nibble) and 2k+1 (high) share a
 * byte, so for k < 2 the byte takes two low nibbles of q and for k >= 2 two high ones. */
static void pack_row_block(enum dtype wt, const uint8_t *blk, int r, uint8_t *pb)
{
    memcpy(pb + 2 * r, blk, 2); /* dw (f16) */
    if (sb_has_min(wt)) memcpy(pb + 32 + 2 * r, blk + 2, 2);
    if (wt == DT_Q8_0) {
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) pb[32 + 64 * j + 4 * r + i] = (uint8_t)(blk[2 + 4 * j + i] ^ 0x80);
        return;
    }
    const int oq = wt == DT_Q4_0 ? 2 : wt == DT_Q4_1 ? 4 : wt == DT_Q5_0 ? 6 : 8;
    const uint8_t *q = blk + oq;
    uint8_t *c = pb + sb_codes(wt) + 4 * r;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            const uint8_t lo = q[8 * k + i], hi = q[8 * k + 4 + i];
            c[64 * k + i] = (uint8_t)((lo & 0x0F) | (hi << 4));
            c[64 * (k + 2) + i] = (uint8_t)((lo >> 4) | (hi & 0xF0));
        }
    if (sb_hbits(wt) >= 0) { /* hbits[j] bits 4r..4r+3 = qh bits 4j..4j+3 */
        uint32_t qh;
        memcpy(&qh, q - 4, 4);
        for (int j = 0; j < 8; j++) pb[sb_hbits(wt) + 8 * j + r / 2] |= (uint8_t)(((qh >> (4 * j)) & 0x0F) << (4 * (r & 1)));
    }
}

/* Packs strips [s0, s1) of a quantized matrix (rows of nb GGUF blocks at w + r * row_bytes). */
static void pack_quant(enum dtype wt, int64_t nb, const uint8_t *w, size_t row_bytes, int64_t nrows, int64_t s0,
                       int64_t s1, uint8_t *dst)
{
    const int bb = dtype_block_bytes(wt), sbb = sb_bytes(wt);
    assert(wt == DT_Q4_K || wt == DT_Q6_K || sbb == GQ_STRIP * bb);
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

/* Bits 4-5 of the Q6_K codes of step 4h + s from high byte vector v (see the layout). */
static inline __attribute__((always_inline)) __m512i q6k_high(__m512i v, int s)
{
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i t = s == 0 ? _mm512_slli_epi16(v, 4) : s == 1 ? _mm512_slli_epi16(v, 2)
                    : s == 2 ? v : _mm512_srli_epi16(v, 2);
    return _mm512_and_si512(t, m30);
}

/* Codes of steps 2k and 2k+1 (16 rows x 4 bytes each) of a packed strip-block pb, or for
 * the K-quants of the 32-element block whose codes start at pb. */
static inline __attribute__((always_inline)) void step_codes(enum dtype wt, const uint8_t *pb, int k, __m512i *a,
                                                             __m512i *b)
{
    if (wt == DT_Q4_K || wt == DT_Q6_K) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i v = _mm512_loadu_si512((const void *)(pb + 64 * k));
        *a = _mm512_and_si512(v, m4);
        *b = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (wt == DT_Q6_K) {
            const __m512i h = _mm512_loadu_si512((const void *)(pb + 256 + 64 * (k / 2)));
            *a = _mm512_or_si512(*a, q6k_high(h, 2 * (k % 2)));
            *b = _mm512_or_si512(*b, q6k_high(h, 2 * (k % 2) + 1));
        }
        return;
    }
    if (wt == DT_Q8_0) {
        *a = _mm512_loadu_si512((const void *)(pb + 32 + 128 * k));
        *b = _mm512_loadu_si512((const void *)(pb + 32 + 128 * k + 64));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i v = _mm512_loadu_si512((const void *)(pb + sb_codes(wt) + 64 * k));
    *a = _mm512_and_si512(v, m4);
    *b = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (sb_hbits(wt) >= 0) {
        uint64_t ha, hb;
        memcpy(&ha, pb + sb_hbits(wt) + 16 * k, 8);
        memcpy(&hb, pb + sb_hbits(wt) + 16 * k + 8, 8);
        const __m512i v16 = _mm512_set1_epi8(0x10);
        *a = _mm512_mask_blend_epi8((__mmask64)ha, *a, _mm512_or_si512(*a, v16));
        *b = _mm512_mask_blend_epi8((__mmask64)hb, *b, _mm512_or_si512(*b, v16));
    }
}

static inline __m512 sb_dw(const uint8_t *pb) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb)); }
static inline __m512 sb_mw(const uint8_t *pb) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pb + 32))); }

/* ---- quantized weights: micro-kernel, 16 rows x GEMM_TILE tokens ---- */

/* ai[t] += the integer dots of steps 2k, 2k+1 for k in [k0, k1) of one 32-element block
 * (codes at pb as step_codes reads them) with token t's codes q4[8][GEMM_TILE]. */
static inline __attribute__((always_inline)) void tile_isum(enum dtype wt, const uint8_t *pb, const int32_t *q4,
                                                            int k0, int k1, __m512i *ai)
{
    _Pragma("GCC unroll 4") for (int k = k0; k < k1; k++) {
        __m512i wa, wb2;
        step_codes(wt, pb, k, &wa, &wb2);
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
            ai[t] = _mm512_dpbusd_epi32(ai[t], wa, _mm512_set1_epi32(q4[2 * k * GEMM_TILE + t]));
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
            ai[t] = _mm512_dpbusd_epi32(ai[t], wb2, _mm512_set1_epi32(q4[(2 * k + 1) * GEMM_TILE + t]));
    }
}

/* 16 f32 from 16 bytes at p (unsigned, or signed when sgn). */
static inline __m512 u8x16_ps(const uint8_t *p, int sgn)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    return _mm512_cvtepi32_ps(sgn ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
}

/* The tile's accumulators: from y (chunks after the first continue the chain) or 0; and back. */
static inline __attribute__((always_inline)) void tile_acc_load(__m512 *acc, const float *y, int64_t ys, int nt,
                                                                __mmask16 rmask, int add)
{
    _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
        acc[t] = add && t < nt ? _mm512_maskz_loadu_ps(rmask, y + (size_t)t * (size_t)ys) : _mm512_setzero_ps();
}

static inline __attribute__((always_inline)) void tile_acc_store(const __m512 *acc, float *y, int64_t ys, int nt,
                                                                 __mmask16 rmask)
{
    _Pragma("GCC unroll 16") for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ys, rmask, acc[t]);
}

/* acc[t] = fma((float)isum[t], dw * dx[t], acc[t]): a block's (or super-block's) scaled sum. */
static inline __attribute__((always_inline)) void tile_scaled_fma(__m512 *acc, const __m512i *isum, __m512 dw,
                                                                  const float *dx)
{
    _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])), acc[t]);
}

static inline __attribute__((always_inline)) void micro_quant(enum dtype wt, const uint8_t *wp, const uint8_t *xa,
                                                              int nbk, float *y, int64_t ys, int nt,
                                                              __mmask16 rmask, int add)
{
    const int with_min = sb_has_min(wt), sbb = sb_bytes(wt);
    /* every loop over tokens is unrolled so acc[] and ai[] live in registers */
    __m512 acc[GEMM_TILE];
    tile_acc_load(acc, y, ys, nt, rmask, add);
    for (int b = 0; b < nbk; b++) {
        const uint8_t *wb = wp + (size_t)b * (size_t)sbb, *xb = xa + (size_t)b * GEMM_QACT_BLOCK;
        const float *xd = (const float *)(xb + 32 * GEMM_TILE);
        __m512i ai[GEMM_TILE];
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
            ai[t] = with_min ? _mm512_setzero_si512()
                             : _mm512_set1_epi32(((const int32_t *)(xb + 36 * GEMM_TILE))[t]);
        tile_isum(wt, wb, (const int32_t *)xb, 0, 4, ai);
        tile_scaled_fma(acc, ai, sb_dw(wb), xd);
        if (with_min) {
            const __m512 mw = sb_mw(wb);
            const float *xs = (const float *)(xb + 36 * GEMM_TILE);
            _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[t]), acc[t]);
        }
    }
    tile_acc_store(acc, y, ys, nt, rmask);
}

/* Q4_K over nsb super-blocks: per 32-element sub-block j the Q4_1 chain with
 * dw = d * sc_j and mw = -(dmin * m_j), both exact in f32 (11-bit x 6-bit significands):
 *   acc = fma((float)isum, dw * dx, acc); acc = fnmadd(dmin * m_j, s, acc) */
static inline __attribute__((always_inline)) void micro_q4k(const uint8_t *wp, const uint8_t *xa, int nsb, float *y,
                                                            int64_t ys, int nt, __mmask16 rmask, int add)
{
    __m512 acc[GEMM_TILE];
    tile_acc_load(acc, y, ys, nt, rmask, add);
    for (int s = 0; s < nsb; s++) {
        const uint8_t *pb = wp + (size_t)s * Q4K_BYTES;
        const __m512 d = sb_dw(pb), dmin = sb_mw(pb);
        for (int j = 0; j < 8; j++) {
            const uint8_t *xb = xa + (size_t)(8 * s + j) * GEMM_QACT_BLOCK;
            const float *xd = (const float *)(xb + 32 * GEMM_TILE), *xs = (const float *)(xb + 36 * GEMM_TILE);
            __m512i ai[GEMM_TILE];
            _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) ai[t] = _mm512_setzero_si512();
            tile_isum(DT_Q4_K, pb + Q4K_CODES + 256 * j, (const int32_t *)xb, 0, 4, ai);
            const __m512 dw = _mm512_mul_ps(d, u8x16_ps(pb + Q4K_SC + 16 * j, 0));
            const __m512 mw = _mm512_mul_ps(dmin, u8x16_ps(pb + Q4K_M + 16 * j, 0));
            tile_scaled_fma(acc, ai, dw, xd);
            _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
                acc[t] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(xs[t]), acc[t]);
        }
    }
    tile_acc_store(acc, y, ys, nt, rmask);
}

/* Q6_K over nsb super-blocks: per 16-element group g the integer sum
 * i_g = sum u q - 32 sum q (the accumulator starts at the packed -32 sum q), scaled in
 * int32 and summed over the super-block, I = sum_g sc_g i_g (|I| < 2^29), then one float
 * step per super-block: acc = fma((float)I, d * dx, acc). */
static inline __attribute__((always_inline)) void micro_q6k(const uint8_t *wp, const uint8_t *xa, int nsb, float *y,
                                                            int64_t ys, int nt, __mmask16 rmask, int add)
{
    __m512 acc[GEMM_TILE];
    tile_acc_load(acc, y, ys, nt, rmask, add);
    for (int s = 0; s < nsb; s++) {
        const uint8_t *pb = wp + (size_t)s * Q6K_BYTES;
        __m512i isb[GEMM_TILE];
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) isb[t] = _mm512_setzero_si512();
        for (int b = 0; b < 8; b++) {
            const uint8_t *xb = xa + (size_t)(8 * s + b) * GEMM_QACT16_BLOCK;
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const int32_t *c = (const int32_t *)(xb + (36 + 4 * h) * GEMM_TILE);
                __m512i ai[GEMM_TILE];
                _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) ai[t] = _mm512_set1_epi32(c[t]);
                tile_isum(DT_Q6_K, pb + Q6K_CODES + Q6K_BLOCK * b, (const int32_t *)xb, 2 * h, 2 * h + 2, ai);
                const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(pb + Q6K_SC + 16 * (2 * b + h))));
                _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
                    isb[t] = _mm512_add_epi32(isb[t], _mm512_mullo_epi32(ai[t], sc));
            }
        }
        tile_scaled_fma(acc, isb, sb_dw(pb), (const float *)(xa + (size_t)(8 * s) * GEMM_QACT16_BLOCK + 32 * GEMM_TILE));
    }
    tile_acc_store(acc, y, ys, nt, rmask);
}

/* ---- quantized weights: one token (decode) ----
 * Per strip the tile kernel's arithmetic with one token: the block's integer sum (two
 * vpdpbusd chains added; integer, so the split does not change it), then the same float
 * chain. The token's activations are a tile of width 1 (40 or 44 contiguous bytes a
 * block). */

/* c + the integer dots of steps 2k, 2k+1 for k in [k0, k1) of one 32-element block. */
static inline __attribute__((always_inline)) __m512i block_isum(enum dtype wt, const uint8_t *pb, const int32_t *q4,
                                                                __m512i c, int k0, int k1)
{
    __m512i a0 = c, a1 = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int k = k0; k < k1; k++) {
        __m512i wa, wb;
        step_codes(wt, pb, k, &wa, &wb);
        a0 = _mm512_dpbusd_epi32(a0, wa, _mm512_set1_epi32(q4[2 * k]));
        a1 = _mm512_dpbusd_epi32(a1, wb, _mm512_set1_epi32(q4[2 * k + 1]));
    }
    return _mm512_add_epi32(a0, a1);
}

static inline float ld_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

static inline int32_t ld_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One strip-block (one GGUF block of 16 rows) of the chain of one token, activations xb. */
static inline __attribute__((always_inline)) __m512 block_step(enum dtype wt, const uint8_t *pb, const uint8_t *xb,
                                                               __m512 acc)
{
    if (wt == DT_Q4_K) { /* micro_q4k's chain */
        const __m512 d = sb_dw(pb), dmin = sb_mw(pb);
        for (int j = 0; j < 8; j++) {
            const uint8_t *x = xb + 40 * j;
            const __m512i is = block_isum(wt, pb + Q4K_CODES + 256 * j, (const int32_t *)x, _mm512_setzero_si512(), 0, 4);
            const __m512 dw = _mm512_mul_ps(d, u8x16_ps(pb + Q4K_SC + 16 * j, 0));
            const __m512 mw = _mm512_mul_ps(dmin, u8x16_ps(pb + Q4K_M + 16 * j, 0));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(ld_f32(x + 32))), acc);
            acc = _mm512_fnmadd_ps(mw, _mm512_set1_ps(ld_f32(x + 36)), acc);
        }
        return acc;
    }
    if (wt == DT_Q6_K) { /* micro_q6k's chain */
        __m512i isb = _mm512_setzero_si512();
        for (int b = 0; b < 8; b++) {
            const uint8_t *x = xb + 44 * b;
            for (int h = 0; h < 2; h++) {
                const __m512i is = block_isum(wt, pb + Q6K_CODES + Q6K_BLOCK * b, (const int32_t *)x,
                                              _mm512_set1_epi32(ld_i32(x + 36 + 4 * h)), 2 * h, 2 * h + 2);
                const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(pb + Q6K_SC + 16 * (2 * b + h))));
                isb = _mm512_add_epi32(isb, _mm512_mullo_epi32(is, sc));
            }
        }
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb), _mm512_mul_ps(sb_dw(pb), _mm512_set1_ps(ld_f32(xb + 32))), acc);
    }
    const int32_t c = ld_i32(xb + 36);
    const __m512i is = block_isum(wt, pb, (const int32_t *)xb,
                                  sb_has_min(wt) ? _mm512_setzero_si512() : _mm512_set1_epi32(c), 0, 4);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(sb_dw(pb), _mm512_set1_ps(ld_f32(xb + 32))), acc);
    if (sb_has_min(wt)) acc = _mm512_fmadd_ps(sb_mw(pb), _mm512_set1_ps(ld_f32(xb + 36)), acc);
    return acc;
}

/* Strips [s0, s1), one after another: each is one sequential stream, and consecutive
 * strips' chains are independent, so the core overlaps them on its own. nb: strip-blocks
 * per row. */
static inline __attribute__((always_inline)) void gemv_quant(enum dtype wt, int64_t nb, const uint8_t *w,
                                                             int64_t nrows, const uint8_t *xa, float *y, int64_t s0,
                                                             int64_t s1)
{
    const size_t stride = (size_t)nb * (size_t)sb_bytes(wt);
    const size_t xstep = (size_t)(sb_elems(wt) / 32) * (size_t)gemm_qact_token_bytes(gemm_kind_of(wt));
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *p0 = w + (size_t)s * stride;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++)
            acc = block_step(wt, p0 + (size_t)b * (size_t)sb_bytes(wt), xa + (size_t)b * xstep, acc);
        const int64_t r0 = s * GQ_STRIP, nv = nrows - r0;
        _mm512_mask_storeu_ps(y + r0, nv >= GQ_STRIP ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1), acc);
    }
}

/* ---- float weights (F32, F16, BF16) ----
 *
 * Per (row, token) one f32 FMA chain over k in order: acc = fma(w_k, x_k, acc) from 0.
 * Packed: strips of 32 rows as [k][32] in the stored type (zero rows past the end).
 * Batched: per chunk of GF_KC columns the strip is converted to f32 on the stack (20 KB)
 * once and every token tile passes over it; micro-kernel 32 rows x GEMM_TILE tokens = 24
 * accumulators, per k 2 weight loads and 24 FMAs with the token's x broadcast. One token:
 * the same chain per strip, straight from the packed strip.
 */

#define GF_STRIP 32
#define GF_KC 160 /* columns per chunk: 32 x 160 f32 = 20 KB */

static inline int float_bytes(enum dtype wt) { return wt == DT_F32 ? 4 : 2; }

/* 16 f32 from 16 packed values at p */
static inline __m512 ld16_packed(enum dtype wt, const uint8_t *p)
{
    if (wt == DT_F32) return _mm512_loadu_ps((const float *)p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (wt == DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void pack_float(enum dtype wt, int64_t n, const uint8_t *w, size_t row_bytes, int64_t nrows, int64_t s0,
                       int64_t s1, uint8_t *dst)
{
    const int es = float_bytes(wt);
    for (int64_t s = s0; s < s1; s++) {
        uint8_t *ps = dst + (size_t)s * (size_t)n * GF_STRIP * (size_t)es;
        memset(ps, 0, (size_t)n * GF_STRIP * (size_t)es);
        for (int r = 0; r < GF_STRIP && s * GF_STRIP + r < nrows; r++) {
            const uint8_t *row = w + (size_t)(s * GF_STRIP + r) * row_bytes;
            if (es == 2) {
                uint16_t *o = (uint16_t *)ps + r;
                for (int64_t k = 0; k < n; k++) memcpy(o + (size_t)k * GF_STRIP, row + 2 * (size_t)k, 2);
            } else {
                float *o = (float *)ps + r;
                for (int64_t k = 0; k < n; k++) memcpy(o + (size_t)k * GF_STRIP, row + 4 * (size_t)k, 4);
            }
        }
    }
}

/* 32 rows x GEMM_TILE tokens over kc columns of a chunk (f32 [k][32]) and its activations. */
static void micro_float(const float *wp, const float *xt, int kc, float *y, int64_t ys, int nt, __mmask16 m0,
                        __mmask16 m1, int add)
{
    __m512 a0[GEMM_TILE], a1[GEMM_TILE];
    _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) {
        float *yt = y + (size_t)t * (size_t)ys;
        a0[t] = add && t < nt ? _mm512_maskz_loadu_ps(m0, yt) : _mm512_setzero_ps();
        a1[t] = add && t < nt ? _mm512_maskz_loadu_ps(m1, yt + 16) : _mm512_setzero_ps();
    }
    for (int k = 0; k < kc; k++) {
        const __m512 w0 = _mm512_load_ps(wp + (size_t)k * GF_STRIP), w1 = _mm512_load_ps(wp + (size_t)k * GF_STRIP + 16);
        const float *xk = xt + (size_t)k * GEMM_TILE;
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) {
            const __m512 xb = _mm512_set1_ps(xk[t]);
            a0[t] = _mm512_fmadd_ps(w0, xb, a0[t]);
            a1[t] = _mm512_fmadd_ps(w1, xb, a1[t]);
        }
    }
    _Pragma("GCC unroll 16") for (int t = 0; t < nt; t++) {
        float *yt = y + (size_t)t * (size_t)ys;
        _mm512_mask_storeu_ps(yt, m0, a0[t]);
        _mm512_mask_storeu_ps(yt + 16, m1, a1[t]);
    }
}

/* One token over strips [s0, s1): x[n] as packed for one token (a plain copy). */
static inline __attribute__((always_inline)) void gemv_float(enum dtype wt, int64_t n, const uint8_t *w,
                                                             int64_t nrows, const float *xt, float *y, int64_t s0,
                                                             int64_t s1)
{
    const size_t es = (size_t)float_bytes(wt), stride = (size_t)n * GF_STRIP * es;
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *p = w + (size_t)s * stride;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t k = 0; k < n; k++) {
            const __m512 xb = _mm512_set1_ps(xt[k]);
            a0 = _mm512_fmadd_ps(ld16_packed(wt, p + (size_t)k * GF_STRIP * es), xb, a0);
            a1 = _mm512_fmadd_ps(ld16_packed(wt, p + ((size_t)k * GF_STRIP + 16) * es), xb, a1);
        }
        const int64_t r0 = s * GF_STRIP, nv = nrows - r0;
        _mm512_mask_storeu_ps(y + r0, nv >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1), a0);
        if (nv > 16)
            _mm512_mask_storeu_ps(y + r0 + 16, nv >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nv - 16)) - 1), a1);
    }
}

#ifdef GEMM_BF16_DOT
/* ---- BF16 weights on vdpbf16ps ----
 *
 * vdpbf16ps adds, per f32 lane, the two products of a bf16 pair: acc += a0 b0 + a1 b1
 * (each product exact in f32, each of the two additions rounded). So a pair of columns
 * (2j, 2j+1) of 16 rows is one zmm of weights, and the activations are rounded to bf16
 * (round to nearest even) and taken in the same pairs.
 *   weights: strips of 32 rows as [n2][32 rows][2] bf16, n2 = ceil(n / 2), the pair of an
 *            odd n's last column padded with 0 (zero rows past the end);
 *   activations: per tile u32 [n2][GEMM_TILE], each the bf16 pair (x[2j], x[2j+1]) of a
 *            token (x[2j] in the low half); a lone token: u32 [n2].
 * Per (row, token) one chain over the pairs in order: acc = dpbf16(acc, w_j, x_j) from 0,
 * in the batched micro-kernel (32 rows x GEMM_TILE tokens, 24 accumulators, per pair 2
 * weight loads and 24 vdpbf16ps with the token's pair broadcast) and in the one-token
 * kernel alike. The strip is read straight from the packed copy in chunks of GB_KC pairs
 * (20 KB) while every token tile passes over the chunk. */

#define GB_KC 160 /* pairs per chunk: 32 rows x 160 pairs x 4 bytes = 20 KB */

static inline int64_t bf16_pairs(int64_t n) { return (n + 1) / 2; }

/* Strips [s0, s1) of a BF16 matrix into the pair layout. */
static void pack_bf16_pairs(int64_t n, const uint8_t *w, size_t row_bytes, int64_t nrows, int64_t s0, int64_t s1,
                            uint8_t *dst)
{
    const int64_t n2 = bf16_pairs(n);
    for (int64_t s = s0; s < s1; s++) {
        uint16_t *ps = (uint16_t *)(dst + (size_t)s * (size_t)n2 * GF_STRIP * 4);
        memset(ps, 0, (size_t)n2 * GF_STRIP * 4);
        for (int r = 0; r < GF_STRIP && s * GF_STRIP + r < nrows; r++) {
            const uint8_t *row = w + (size_t)(s * GF_STRIP + r) * row_bytes;
            for (int64_t k = 0; k < n; k++) memcpy(ps + ((size_t)(k / 2) * GF_STRIP + (size_t)r) * 2 + k % 2, row + 2 * k, 2);
        }
    }
}

/* Rounds x[n] to bf16 pairs, pair j stored at out[j * stride]. */
static void pack_act_bf16(const float *x, int64_t n, uint32_t *out, int stride)
{
    for (int64_t i = 0; i < n; i += 32) {
        const int64_t m = n - i < 32 ? n - i : 32;
        const __mmask16 k0 = m >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1);
        const __mmask16 k1 = m <= 16 ? 0 : m >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - 16)) - 1);
        const __m512 v0 = _mm512_maskz_loadu_ps(k0, x + i), v1 = _mm512_maskz_loadu_ps(k1, x + i + 16);
        /* low 16 bf16 from v0: x[i + 2p] is the low half of pair p */
        const __m512i p = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
        uint32_t *o = out + (size_t)(i / 2) * (size_t)stride;
        if (stride == 1) {
            _mm512_mask_storeu_epi32(o, (__mmask16)((1u << ((m + 1) / 2)) - 1), p);
        } else {
            uint32_t v[16];
            _mm512_storeu_si512((void *)v, p);
            for (int j = 0; j < (m + 1) / 2; j++) o[(size_t)j * (size_t)stride] = v[j];
        }
    }
}

/* 32 rows x GEMM_TILE tokens over kc pairs of a strip (wp: [kc][32][2] bf16) and a tile's
 * pairs (xt: [kc][GEMM_TILE]). */
static void micro_bf16(const uint32_t *wp, const uint32_t *xt, int kc, float *y, int64_t ys, int nt, __mmask16 m0,
                       __mmask16 m1, int add)
{
    __m512 a0[GEMM_TILE], a1[GEMM_TILE];
    _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) {
        float *yt = y + (size_t)t * (size_t)ys;
        a0[t] = add && t < nt ? _mm512_maskz_loadu_ps(m0, yt) : _mm512_setzero_ps();
        a1[t] = add && t < nt ? _mm512_maskz_loadu_ps(m1, yt + 16) : _mm512_setzero_ps();
    }
    for (int k = 0; k < kc; k++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512((const void *)(wp + (size_t)k * GF_STRIP));
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512((const void *)(wp + (size_t)k * GF_STRIP + 16));
        const uint32_t *xk = xt + (size_t)k * GEMM_TILE;
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xk[t]);
            a0[t] = _mm512_dpbf16_ps(a0[t], w0, xb);
            a1[t] = _mm512_dpbf16_ps(a1[t], w1, xb);
        }
    }
    _Pragma("GCC unroll 16") for (int t = 0; t < nt; t++) {
        float *yt = y + (size_t)t * (size_t)ys;
        _mm512_mask_storeu_ps(yt, m0, a0[t]);
        _mm512_mask_storeu_ps(yt + 16, m1, a1[t]);
    }
}

/* Batched units [u0, u1) of a BF16 matrix in the pair layout (see gemm_run). */
static void run_bf16(int64_t n, const uint8_t *w, int64_t nrows, const void *act, int num_tokens, float *y,
                     int64_t y_stride, long u0, long u1)
{
    const int64_t n2 = bf16_pairs(n);
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * GF_STRIP;
        const int nv = nrows - r0 < GF_STRIP ? (int)(nrows - r0) : GF_STRIP;
        const __mmask16 m0 = nv >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1);
        const __mmask16 m1 = nv <= 16 ? 0 : nv >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nv - 16)) - 1);
        const uint32_t *ws = (const uint32_t *)w + (size_t)s * (size_t)n2 * GF_STRIP;
        for (int64_t k0 = 0; k0 < n2; k0 += GB_KC) {
            const int kc = n2 - k0 < GB_KC ? (int)(n2 - k0) : GB_KC;
            for (long tl = tb; tl < te; tl++) {
                const int t0 = (int)tl * GEMM_TILE;
                const int nt = num_tokens - t0 < GEMM_TILE ? num_tokens - t0 : GEMM_TILE;
                const uint32_t *xt = (const uint32_t *)act + ((size_t)tl * (size_t)n2 + (size_t)k0) * GEMM_TILE;
                micro_bf16(ws + (size_t)k0 * GF_STRIP, xt, kc, y + (size_t)t0 * (size_t)y_stride + r0, y_stride, nt,
                           m0, m1, k0 > 0);
            }
        }
    }
}

/* One token over strips [s0, s1): the micro-kernel's chain with one token. */
static void gemv_bf16(int64_t n, const uint8_t *w, int64_t nrows, const uint32_t *xp, float *y, int64_t s0,
                      int64_t s1)
{
    const int64_t n2 = bf16_pairs(n);
    for (int64_t s = s0; s < s1; s++) {
        const uint32_t *p = (const uint32_t *)w + (size_t)s * (size_t)n2 * GF_STRIP;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t k = 0; k < n2; k++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[k]);
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512((const void *)(p + (size_t)k * GF_STRIP)), xb);
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512((const void *)(p + (size_t)k * GF_STRIP + 16)), xb);
        }
        const int64_t r0 = s * GF_STRIP, nv = nrows - r0;
        _mm512_mask_storeu_ps(y + r0, nv >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1), a0);
        if (nv > 16)
            _mm512_mask_storeu_ps(y + r0 + 16, nv >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nv - 16)) - 1), a1);
    }
}
#endif

/* Tokens [t0, t1) of x[num_tokens][n] for a float weight type (layout in quant_kernels.h);
 * the call with t1 == num_tokens zeroes the last tile's padding tokens. */
static void pack_act_float(enum dtype wt, const float *x, int64_t n, int num_tokens, int t0, int t1, void *act)
{
#ifdef GEMM_BF16_DOT
    if (wt == DT_BF16) { /* u32 [n2][GEMM_TILE] per tile of bf16 pairs; one token: [n2] */
        const size_t n2 = (size_t)bf16_pairs(n), tile = n2 * GEMM_TILE;
        if (num_tokens == 1) {
            pack_act_bf16(x, n, act, 1);
            return;
        }
        for (int t = t0; t < t1; t++)
            pack_act_bf16(x + (size_t)t * (size_t)n, n, (uint32_t *)act + (size_t)(t / GEMM_TILE) * tile + t % GEMM_TILE,
                          GEMM_TILE);
        if (t1 == num_tokens && num_tokens % GEMM_TILE) {
            uint32_t *xt = (uint32_t *)act + (size_t)(num_tokens / GEMM_TILE) * tile;
            for (size_t k = 0; k < n2; k++)
                for (int lane = num_tokens % GEMM_TILE; lane < GEMM_TILE; lane++) xt[k * GEMM_TILE + lane] = 0;
        }
        return;
    }
#else
    (void)wt;
#endif
    if (num_tokens == 1) { /* one token: a plain copy */
        memcpy(act, x, sizeof(float) * (size_t)n);
        return;
    }
    const size_t tile_floats = (size_t)n * GEMM_TILE; /* x[n][GEMM_TILE] per tile */
    for (int t = t0; t < t1; t++) {
        float *xf = (float *)act + (size_t)(t / GEMM_TILE) * tile_floats + t % GEMM_TILE;
        for (int64_t k = 0; k < n; k++) xf[k * GEMM_TILE] = x[(size_t)t * (size_t)n + (size_t)k];
    }
    if (t1 == num_tokens && num_tokens % GEMM_TILE) {
        float *xf = (float *)act + (size_t)(num_tokens / GEMM_TILE) * tile_floats;
        for (int64_t k = 0; k < n; k++)
            for (int lane = num_tokens % GEMM_TILE; lane < GEMM_TILE; lane++) xf[k * GEMM_TILE + lane] = 0.0f;
    }
}

/* ---- the set's entries ---- */

static size_t gemm_packed_bytes(enum dtype wt, int64_t n, int64_t nrows)
{
    switch (gemm_kind_of(wt)) {
    case GEMM_FLOAT:
#ifdef GEMM_BF16_DOT
        if (wt == DT_BF16) return (size_t)((nrows + GF_STRIP - 1) / GF_STRIP) * (size_t)bf16_pairs(n) * GF_STRIP * 4;
#endif
        return (size_t)((nrows + GF_STRIP - 1) / GF_STRIP) * (size_t)n * GF_STRIP * (size_t)float_bytes(wt);
    case GEMM_OFFSET: case GEMM_MIN: case GEMM_KMIN: case GEMM_K16:
        return (size_t)((nrows + GQ_STRIP - 1) / GQ_STRIP) * (size_t)(n / sb_elems(wt)) * (size_t)sb_bytes(wt);
    default: return 0;
    }
}

static void gemm_pack_weight(enum dtype wt, int64_t n, const void *w, size_t row_bytes, int64_t nrows, int64_t s0,
                             int64_t s1, void *dst)
{
#ifdef GEMM_BF16_DOT
    if (wt == DT_BF16) {
        pack_bf16_pairs(n, w, row_bytes, nrows, s0, s1, dst);
        return;
    }
#endif
    if (gemm_kind_of(wt) == GEMM_FLOAT) pack_float(wt, n, w, row_bytes, nrows, s0, s1, dst);
    else pack_quant(wt, n / sb_elems(wt), w, row_bytes, nrows, s0, s1, dst);
}

/* Batched units [u0, u1) of a float matrix (see gemm_run). */
static void run_float(enum dtype wt, int64_t n, const uint8_t *w, int64_t nrows, const void *act, int num_tokens,
                      float *y, int64_t y_stride, long u0, long u1)
{
    _Alignas(64) float chunk[GF_KC * GF_STRIP];
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    const size_t tile_floats = (size_t)n * GEMM_TILE, es = (size_t)float_bytes(wt);
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * GF_STRIP;
        const int nv = nrows - r0 < GF_STRIP ? (int)(nrows - r0) : GF_STRIP;
        const __mmask16 m0 = nv >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1);
        const __mmask16 m1 = nv <= 16 ? 0 : nv >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nv - 16)) - 1);
        const uint8_t *ws = w + (size_t)s * (size_t)n * GF_STRIP * es;
        for (int64_t k0 = 0; k0 < n; k0 += GF_KC) {
            const int kc = n - k0 < GF_KC ? (int)(n - k0) : GF_KC;
            const uint8_t *src = ws + (size_t)k0 * GF_STRIP * es;
            for (int i = 0; i < kc * GF_STRIP; i += 16) _mm512_store_ps(chunk + i, ld16_packed(wt, src + (size_t)i * es));
            for (long tl = tb; tl < te; tl++) {
                const int t0 = (int)tl * GEMM_TILE;
                const int nt = num_tokens - t0 < GEMM_TILE ? num_tokens - t0 : GEMM_TILE;
                const float *xt = (const float *)act + (size_t)tl * tile_floats + (size_t)k0 * GEMM_TILE;
                micro_float(chunk, xt, kc, y + (size_t)t0 * (size_t)y_stride + r0, y_stride, nt, m0, m1, k0 > 0);
            }
        }
    }
}

/* Batched units [u0, u1) of a quantized matrix of type WT (see gemm_run). */
static inline __attribute__((always_inline)) void run_quant(enum dtype wt, int64_t n, const uint8_t *w,
                                                            int64_t nrows, const void *act, int num_tokens, float *y,
                                                            int64_t y_stride, long u0, long u1)
{
    const int per = sb_elems(wt) / 32; /* 32-element activation blocks per strip-block */
    const int64_t nb = n / sb_elems(wt), kc = GQ_KC_BLOCKS / per;
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    const size_t tile_bytes = (size_t)(n / 32) * (size_t)act_block(wt), stride = (size_t)nb * (size_t)sb_bytes(wt);
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * GQ_STRIP;
        const int nv = nrows - r0 < GQ_STRIP ? (int)(nrows - r0) : GQ_STRIP;
        const __mmask16 rmask = nv >= GQ_STRIP ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1);
        const uint8_t *ws = w + (size_t)s * stride;
        for (int64_t kb = 0; kb < nb; kb += kc) {
            const int nbk = nb - kb < kc ? (int)(nb - kb) : (int)kc;
            for (long tl = tb; tl < te; tl++) {
                const int t0 = (int)tl * GEMM_TILE;
                const int nt = num_tokens - t0 < GEMM_TILE ? num_tokens - t0 : GEMM_TILE;
                const uint8_t *xa = (const uint8_t *)act + (size_t)tl * tile_bytes + (size_t)(kb * per) * (size_t)act_block(wt);
                const uint8_t *wk = ws + (size_t)kb * (size_t)sb_bytes(wt);
                float *yt = y + (size_t)t0 * (size_t)y_stride + r0;
                if (wt == DT_Q4_K) micro_q4k(wk, xa, nbk, yt, y_stride, nt, rmask, kb > 0);
                else if (wt == DT_Q6_K) micro_q6k(wk, xa, nbk, yt, y_stride, nt, rmask, kb > 0);
                else micro_quant(wt, wk, xa, nbk, yt, y_stride, nt, rmask, kb > 0);
            }
        }
    }
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
#ifdef GEMM_BF16_DOT
        if (wt == DT_BF16) {
            if (num_tokens == 1) gemv_bf16(n, w, nrows, act, y, u0, u1);
            else run_bf16(n, w, nrows, act, num_tokens, y, y_stride, u0, u1);
            return;
        }
#endif
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

const struct quant_gemm quant_gemm_avx512 = {
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
