/* gemm_avx512.c — batched matmul (prefill: num_tokens >= 2) on AVX-512 F/BW/VL/VBMI/VNNI.
 *
 * y[t][r] = sum_i W[r][i] x[t][i], computed as register tiles of 16 output rows (one zmm,
 * lane = row) x GEMM_TILE tokens, so every weight vector loaded is used GEMM_TILE times
 * and no horizontal sums are needed.
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
 * finish it, plus one FMA with mw for Q?_1.
 *   Weights are repacked per strip of 16 rows and chunk of GQ_KC_BLOCKS blocks into a
 * stack buffer (20 KB, stays in L1/L2 while all token tiles pass over it):
 *   per block: u8 codes [8][16 rows][4] (512 B), f32 dw[16], f32 mw[16] (128 B).
 * The micro-kernel per block: 8 steps of (1 weight load, GEMM_TILE vpdpbusd with the
 * token's 4 codes broadcast from memory) into 12 int32 accumulators, then the scale
 * step into 12 f32 accumulators. 8 vpdpbusd per 3-4 other vector ops.
 *   One token (decode) does not repack: see dot_seq below, which keeps the arithmetic
 * of the batched kernels so results do not depend on the batch.
 *
 * Float types (F32, F16, BF16): see "float weights" below. K-quants (Q4_K, Q6_K) stay
 * on the per-token kernels.
 *
 * Chunks after the first add to y, so K of any length works with fixed buffers. Each
 * output's arithmetic depends only on its row, token and K, never on the thread split.
 * The layout of the packed activations is in quant_kernels.h.
 */
#include "backend/cpu/quant_kernels.h"

#ifdef GEMM_HAVE_AVX512

#include "backend/cpu/avx512_bytes.h"
#include "util/half.h"

#include <immintrin.h>
#include <string.h>

#define GQ_STRIP 16
#define GQ_KC_BLOCKS 32                 /* blocks per weight chunk: 1024 elements */
#define GQ_PACK_BLOCK 640               /* bytes of one packed block of a strip */
#define PACK_BYTES (GQ_KC_BLOCKS * GQ_PACK_BLOCK)

/* ---- activations ---- */

/* Quantizes one token row into its tile lane; rounding as quantize_avx2/quantize_scalar
 * (d = amax / 127, q = round-to-nearest-even(x / d) clamped to +-127). */
static void pack_act_quant(enum dtype wt, const float *x, int64_t n, uint8_t *tile, int lane)
{
    const int o = gemm_code_offset(wt), with_min = gemm_kind_of(wt) == GEMM_MIN;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t b = 0; b < n / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        v0 = _mm512_roundscale_ps(_mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v1 = _mm512_roundscale_ps(_mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v0, lo), hi));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v1, lo), hi));
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        int32_t w[8];
        _mm_storeu_si128((__m128i *)w, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(w + 4), _mm512_cvtepi32_epi8(q1));
        uint8_t *blk = tile + (size_t)b * GEMM_QACT_BLOCK;
        int32_t *q4 = (int32_t *)blk;
        for (int j = 0; j < 8; j++) q4[j * GEMM_TILE + lane] = w[j];
        ((float *)(blk + 32 * GEMM_TILE))[lane] = d;
        if (with_min)
            ((float *)(blk + 36 * GEMM_TILE))[lane] = d * (float)sum;
        else
            ((int32_t *)(blk + 36 * GEMM_TILE))[lane] = -o * sum;
    }
}

static void gemm_pack_act(enum dtype wt, const float *x, int64_t n, int num_tokens, int t0, int t1,
                          void *act)
{
    if (gemm_kind_of(wt) == GEMM_FLOAT) { /* x[n][GEMM_TILE] per tile */
        const size_t tile_floats = (size_t)n * GEMM_TILE;
        for (int t = t0; t < t1; t++) {
            float *xf = (float *)act + (size_t)(t / GEMM_TILE) * tile_floats + t % GEMM_TILE;
            for (int64_t k = 0; k < n; k++) xf[k * GEMM_TILE] = x[(size_t)t * (size_t)n + (size_t)k];
        }
        if (t1 == num_tokens && num_tokens % GEMM_TILE) {
            float *xf = (float *)act + (size_t)(num_tokens / GEMM_TILE) * tile_floats;
            for (int64_t k = 0; k < n; k++)
                for (int lane = num_tokens % GEMM_TILE; lane < GEMM_TILE; lane++) xf[k * GEMM_TILE + lane] = 0.0f;
        }
        return;
    }
    const size_t tile_bytes = (size_t)(n / 32) * GEMM_QACT_BLOCK;
    for (int t = t0; t < t1; t++)
        pack_act_quant(wt, x + (size_t)t * (size_t)n, n, (uint8_t *)act + (size_t)(t / GEMM_TILE) * tile_bytes,
                       t % GEMM_TILE);
    if (t1 == num_tokens && num_tokens % GEMM_TILE) { /* zero tokens pad the last tile */
        uint8_t *tile = (uint8_t *)act + (size_t)(num_tokens / GEMM_TILE) * tile_bytes;
        for (int lane = num_tokens % GEMM_TILE; lane < GEMM_TILE; lane++)
            for (int64_t b = 0; b < n / 32; b++) {
                int32_t *blk = (int32_t *)(tile + (size_t)b * GEMM_QACT_BLOCK);
                for (int j = 0; j < 10; j++) blk[j * GEMM_TILE + lane] = 0; /* q4[8], d, c */
            }
    }
}

/* ---- quantized weights: packing ---- */

static inline float ld_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 packed bytes -> 32 nibbles in element order (low nibbles, then high nibbles) */
static inline __m256i unpack_nibbles(const uint8_t *p)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* bit j of the u32 at p -> 0x10 in byte j */
static inline __m256i bits_to_0x10(const uint8_t *p)
{
    uint32_t qh;
    memcpy(&qh, p, 4);
    return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10));
}

/* Codes (unsigned, element order), dw and mw of one block. */
static inline __m256i block_codes(enum dtype wt, const uint8_t *b, float *dw, float *mw)
{
    *dw = ld_f16(b);
    *mw = 0.0f;
    switch (wt) {
    case DT_Q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
    case DT_Q4_0:
        return unpack_nibbles(b + 2);
    case DT_Q5_0:
        return _mm256_or_si256(unpack_nibbles(b + 6), bits_to_0x10(b + 2));
    case DT_Q4_1:
        *mw = ld_f16(b + 2);
        return unpack_nibbles(b + 4);
    default: /* DT_Q5_1 */
        *mw = ld_f16(b + 2);
        return _mm256_or_si256(unpack_nibbles(b + 8), bits_to_0x10(b + 4));
    }
}

/* Packs rows [0, nv) of a strip (row r at w + r * row_bytes), blocks [kb, kb + nbk),
 * into out; rows nv..15 are zero. */
static void pack_strip_quant(enum dtype wt, const uint8_t *w, size_t row_bytes, int nv, int64_t kb, int nbk,
                             uint8_t *out)
{
    const int bb = dtype_block_bytes(wt);
    const __m256i vidx = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
    for (int r = 0; r < GQ_STRIP; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes + (size_t)kb * (size_t)bb;
        for (int b = 0; b < nbk; b++) {
            uint8_t *pb = out + (size_t)b * GQ_PACK_BLOCK;
            float dw = 0.0f, mw = 0.0f;
            __m256i codes = r < nv ? block_codes(wt, row + (size_t)b * bb, &dw, &mw) : _mm256_setzero_si256();
            _mm256_i32scatter_epi32(pb + 4 * r, vidx, codes, 1);
            ((float *)(pb + 512))[r] = dw;
            ((float *)(pb + 576))[r] = mw;
        }
    }
}

/* ---- quantized weights: micro-kernel, 16 rows x GEMM_TILE tokens ---- */

static inline __attribute__((always_inline)) void micro_quant(const uint8_t *wp, const uint8_t *xa, int nbk,
                                                              const int with_min, float *y, int64_t ys, int nt,
                                                              __mmask16 rmask, int add)
{
    /* every loop over tokens is unrolled so acc[] and ai[] live in registers */
    __m512 acc[GEMM_TILE];
    _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
        acc[t] = add && t < nt ? _mm512_maskz_loadu_ps(rmask, y + (size_t)t * (size_t)ys) : _mm512_setzero_ps();
    for (int b = 0; b < nbk; b++) {
        const uint8_t *wb = wp + (size_t)b * GQ_PACK_BLOCK, *xb = xa + (size_t)b * GEMM_QACT_BLOCK;
        const int32_t *q4 = (const int32_t *)xb;
        const float *xd = (const float *)(xb + 32 * GEMM_TILE);
        __m512i ai[GEMM_TILE];
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
            ai[t] = with_min ? _mm512_setzero_si512()
                             : _mm512_set1_epi32(((const int32_t *)(xb + 36 * GEMM_TILE))[t]);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            __m512i wv = _mm512_load_si512((const void *)(wb + 64 * j));
            _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
                ai[t] = _mm512_dpbusd_epi32(ai[t], wv, _mm512_set1_epi32(q4[j * GEMM_TILE + t]));
        }
        const __m512 dw = _mm512_load_ps((const float *)(wb + 512));
        _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[t]), _mm512_mul_ps(dw, _mm512_set1_ps(xd[t])), acc[t]);
        if (with_min) {
            const __m512 mw = _mm512_load_ps((const float *)(wb + 576));
            const float *xs = (const float *)(xb + 36 * GEMM_TILE);
            _Pragma("GCC unroll 16") for (int t = 0; t < GEMM_TILE; t++) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[t]), acc[t]);
        }
    }
    _Pragma("GCC unroll 16") for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ys, rmask, acc[t]);
}

static void micro_quant_offset(const uint8_t *wp, const uint8_t *xa, int nbk, float *y, int64_t ys, int nt,
                               __mmask16 rmask, int add)
{
    micro_quant(wp, xa, nbk, 0, y, ys, nt, rmask, add);
}

static void micro_quant_min(const uint8_t *wp, const uint8_t *xa, int nbk, float *y, int64_t ys, int nt,
                            __mmask16 rmask, int add)
{
    micro_quant(wp, xa, nbk, 1, y, ys, nt, rmask, add);
}

/* ---- one token (decode): the batched kernels' arithmetic, without repacking ----
 *
 * For one token the batched path would repack every weight for a single use, so decode
 * keeps reading the GGUF blocks in place. To give bitwise the same logits whether a
 * token is computed alone or in a batch (a request's output must not depend on what it
 * is batched with, or on recompute after preemption), these kernels do the batched
 * kernels' float arithmetic in the same order: per output, over blocks in order,
 *   acc = fma((float)isum_b, dw_b * dx_b, acc)   [then acc = fma(mw_b, s_b, acc)]
 * where isum_b is the exact integer block sum (any integer method gives the same value).
 * Per row, four blocks per step: Q8_0 and Q4_1 gather their codes with byte permutes
 * into the regrouped Q8_1 order and take two 512-bit vpdpbusd (block k's sum spread over
 * lanes 4k..4k+3); the other types use one 256-bit dot per block (signed weights via
 * |w| * sign(x, w), exact: |w| <= 128). The partial sums of 16 rows are then reduced
 * and transposed together (lane = row) and the float chain runs in one zmm, as in the
 * batched kernels. This transposition is what makes these kernels slower than the
 * per-token dots (docs/cpu-kernels.md).
 */

static inline __m256i dot_us8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

static inline __m256i dot_ss8(__m256i a, __m256i b)
{
    return dot_us8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* Exact products of block i of a row (at b) with the token, as 8 int32 partial sums. */
static inline __m256i block_lanes(enum dtype wt, const uint8_t *b, const struct qact *xq, int64_t i)
{
    const __m256i xq0 = _mm256_loadu_si256((const __m256i *)(xq->q + i * 32));
    switch (wt) {
    case DT_Q8_0:
        return dot_ss8(_mm256_loadu_si256((const __m256i *)(b + 2)), xq0);
    case DT_Q4_0:
        return dot_ss8(_mm256_sub_epi8(unpack_nibbles(b + 2), _mm256_set1_epi8(8)), xq0);
    case DT_Q5_0:
        return dot_ss8(_mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(b + 6), bits_to_0x10(b + 2)),
                                       _mm256_set1_epi8(16)), xq0);
    default: { /* Q4_1, Q5_1: Q8_1 codes, regrouped (quant_kernels.h) */
        const __m256i x1 = _mm256_loadu2_m128i((const __m128i *)(xq->q + q81_hi(i)),
                                               (const __m128i *)(xq->q + q81_lo(i)));
        if (wt == DT_Q4_1) return dot_us8(unpack_nibbles(b + 4), x1);
        return dot_us8(_mm256_or_si256(unpack_nibbles(b + 8), bits_to_0x10(b + 4)), x1);
    }
    }
}

/* [sum(v0) sum(v1) sum(v2) sum(v3)] */
static inline __m128i hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

#define SEQ_ROWS 16
#define SEQ_KC 32 /* blocks per pass: 16 rows' partial sums (8 KB) + scales stay in L1 */

/* Groups of 4 blocks (A B C D) of one row, kb (1..4) of them present (masked loads read
 * nothing past them; missing blocks give zero codes). The codes are gathered with byte
 * permutes as [A0-15 B0-15 C0-15 D0-15] and [A16-31 .. D16-31], the order of the
 * regrouped activation codes xg (quant_kernels.h), so two vpdpbusd leave block k's sum
 * in lanes 4k..4k+3. dm4: each block's first 4 bytes (d, and m for Q4_1). */
static inline __m512i q4_1_group(const uint8_t *p, const int8_t *xg, int kb, __m128i *dm4)
{
    const __m512i idx = quad_index(4, 24, 44, 64 + 48);
    const __m512i i_dm = _mm512_setr_epi32(0, 5, 10, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i z0 = _mm512_maskz_loadu_epi8(bytes_mask(20 * kb), p);
    __m512i z1 = _mm512_maskz_loadu_epi8(bytes_mask(20 * kb - 16), p + 16);
    __m512i codes = _mm512_permutex2var_epi8(z0, idx, z1);
    __m512i lo = _mm512_and_si512(codes, m4), hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
    *dm4 = _mm512_castsi512_si128(_mm512_permutexvar_epi32(i_dm, z0));
    return _mm512_add_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xg)),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512(xg + 64)));
}

/* Q8_0: codes + 128 (unsigned for vpdpbusd); the 128 * sum(x) that adds is taken off
 * per block after the sums are reduced. The group is 136 bytes (z0, z1, z2). */
static inline __m512i q8_0_group(const uint8_t *p, const int8_t *xg, int kb, __m128i *dm4)
{
    const __m512i i_lo = quad_index(2, 36, 64 + 6, 64 + 40), i_hi = quad_index(18, 52, 64 + 22, 64 + 56);
    /* words 0, 17, 34 (z1 word 2), 51 (z1 word 19): the blocks' d, one per dword */
    const __m512i i_d = _mm512_setr_epi32(0, 17, 32 + 2, 32 + 19, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int nbytes = 34 * kb;
    __m512i z0 = _mm512_maskz_loadu_epi8(bytes_mask(nbytes), p);
    __m512i z1 = _mm512_maskz_loadu_epi8(bytes_mask(nbytes - 64), p + 64);
    __m512i z2 = _mm512_maskz_loadu_epi8(bytes_mask(nbytes - 128), p + 128);
    /* block C/D bytes live in z1 and z2: permute (z0, z1) for A, B and (z1, z2) for C, D */
    __m512i lo_ab = _mm512_permutex2var_epi8(z0, i_lo, z1), hi_ab = _mm512_permutex2var_epi8(z0, i_hi, z1);
    __m512i lo_cd = _mm512_permutex2var_epi8(z1, _mm512_sub_epi8(i_lo, _mm512_set1_epi8(64)), z2);
    __m512i hi_cd = _mm512_permutex2var_epi8(z1, _mm512_sub_epi8(i_hi, _mm512_set1_epi8(64)), z2);
    const __mmask64 cd = 0xFFFFFFFF00000000ULL; /* bytes 32..63: blocks C, D */
    __m512i lo = _mm512_xor_si512(_mm512_mask_mov_epi8(lo_ab, cd, lo_cd), flip);
    __m512i hi = _mm512_xor_si512(_mm512_mask_mov_epi8(hi_ab, cd, hi_cd), flip);
    *dm4 = _mm512_castsi512_si128(_mm512_permutex2var_epi16(z0, i_d, z1));
    return _mm512_add_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xg)),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512(xg + 64)));
}

/* One group of kb (1..4) blocks at p, blocks b..b+kb-1 of the row (see row_partials):
 * partial sums into part (a zmm), first 4 bytes of each block into dm (an xmm). */
static inline __attribute__((always_inline)) void group_partials(enum dtype wt, int bb, const uint8_t *p, int64_t b,
                                                                 int kb, const struct qact *xq, const int8_t *xg,
                                                                 int32_t *part, int32_t *dm)
{
    __m512i v;
    __m128i d4;
    _mm_prefetch((const char *)p + 384, _MM_HINT_T0);
    _mm_prefetch((const char *)p + 448, _MM_HINT_T0);
    if (bb > 32) _mm_prefetch((const char *)p + 512, _MM_HINT_T0);
    if (wt == DT_Q8_0) {
        v = q8_0_group(p, xg, kb, &d4);
    } else if (wt == DT_Q4_1) {
        v = q4_1_group(p, xg, kb, &d4);
    } else {
        __m256i l[4];
        int32_t d[4];
        for (int j = 0; j < 4; j++) {
            l[j] = j < kb ? block_lanes(wt, p + j * bb, xq, b + j) : _mm256_setzero_si256();
            d[j] = 0;
            if (j < kb) memcpy(&d[j], p + j * bb, 4);
        }
        /* block sums in lanes 0, 4, 8, 12 */
        v = _mm512_maskz_permutexvar_epi32(0x1111, _mm512_setr_epi32(0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0),
                                           _mm512_castsi128_si512(hsum4(l[0], l[1], l[2], l[3])));
        d4 = _mm_loadu_si128((const __m128i *)d);
    }
    _mm512_store_si512(part, v);
    _mm_store_si128((__m128i *)dm, d4);
}

/* One row's blocks [b0, b0 + nbk) (row points at the row's first block), per group of 4
 * blocks: the partial sums (lanes 4k..4k+3 add up to block k's exact sum) into part[g]
 * (a zmm per row and group; SEQ_ROWS apart) and the blocks' first 4 bytes into dm[g]
 * (an xmm per row and group). xg: the token's codes of this pass, regrouped. The row is
 * read in order, one stream, with the decode kernels' prefetch distance. */
static inline __attribute__((always_inline)) void row_partials(enum dtype wt, int bb, const uint8_t *row,
                                                               int64_t b0, int nbk, const struct qact *xq,
                                                               const int8_t *xg, int32_t *part, int32_t *dm)
{
    for (int k = 0; k < nbk; k += 4) {
        const uint8_t *p = row + (size_t)(b0 + k) * bb;
        const int kb = nbk - k < 4 ? nbk - k : 4;
        if (kb == 4) { /* full groups: the masks fold to constants */
            group_partials(wt, bb, p, b0 + k, 4, xq, xg + 32 * k, part + (size_t)(k / 4) * SEQ_ROWS * 16,
                           dm + (size_t)(k / 4) * SEQ_ROWS * 4);
        } else {
            group_partials(wt, bb, p, b0 + k, kb, xq, xg + 32 * k, part + (size_t)(k / 4) * SEQ_ROWS * 16,
                           dm + (size_t)(k / 4) * SEQ_ROWS * 4);
        }
    }
}

/* 16 rows' partial-sum vectors (p[r * 16 + 4k + j]) -> t[k]: block k's sums, lane = row */
static inline __attribute__((always_inline)) void reduce16(const int32_t *p, __m512i t[4])
{
    __m512i q[4];
    _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) {
        __m512i pm[2];
        _Pragma("GCC unroll 2") for (int m = 0; m < 2; m++) {
            const int r = 4 * h + 2 * m;
            __m512i a = _mm512_load_si512(p + r * 16), b = _mm512_load_si512(p + (r + 1) * 16);
            /* per block: [a02 b02 a13 b13] */
            pm[m] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        }
        /* per block: rows 4h .. 4h+3 */
        q[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(pm[0], pm[1]), _mm512_unpackhi_epi64(pm[0], pm[1]));
    }
    /* 128-bit lane k of q[h] -> lane h of t[k] */
    __m512i u0 = _mm512_shuffle_i32x4(q[0], q[1], 0x44), u1 = _mm512_shuffle_i32x4(q[0], q[1], 0xEE);
    __m512i u2 = _mm512_shuffle_i32x4(q[2], q[3], 0x44), u3 = _mm512_shuffle_i32x4(q[2], q[3], 0xEE);
    t[0] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    t[1] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
    t[2] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    t[3] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
}

/* 16 rows' [A B C D] (xmm per row, rows consecutive) -> t[k]: block k, lane = row */
static inline __attribute__((always_inline)) void transpose16x4(const int32_t *src, __m512i t[4])
{
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i z0 = _mm512_load_si512(src), z1 = _mm512_load_si512(src + 16);
    __m512i z2 = _mm512_load_si512(src + 32), z3 = _mm512_load_si512(src + 48);
    __m512i u0 = _mm512_unpacklo_epi32(z0, z1), u1 = _mm512_unpackhi_epi32(z0, z1);
    __m512i u2 = _mm512_unpacklo_epi32(z2, z3), u3 = _mm512_unpackhi_epi32(z2, z3);
    /* lane 4i + j holds row 4j + i; put rows in order */
    t[0] = _mm512_permutexvar_epi32(perm, _mm512_unpacklo_epi64(u0, u2));
    t[1] = _mm512_permutexvar_epi32(perm, _mm512_unpackhi_epi64(u0, u2));
    t[2] = _mm512_permutexvar_epi32(perm, _mm512_unpacklo_epi64(u1, u3));
    t[3] = _mm512_permutexvar_epi32(perm, _mm512_unpackhi_epi64(u1, u3));
}

/* Rows come 16 at a time; in the last set, rows past the end repeat the last row (read,
 * computed, not stored). Per pass of up to SEQ_KC blocks: the rows' partial sums one row
 * after another (sequential reads), then per group of 4 blocks the 16 rows' sums and
 * scales are transposed (lane = row) and the float chain runs over the blocks. */
static inline __attribute__((always_inline)) void dot_seq(enum dtype wt, int bb, int64_t n, const void *w,
                                                          size_t row_bytes, int64_t nrows, const struct qact *xq,
                                                          float *out)
{
    const int with_min = gemm_kind_of(wt) == GEMM_MIN;
    const int64_t nb = n / 32;
    _Alignas(64) int32_t part[SEQ_KC / 4 * SEQ_ROWS * 16], dm[SEQ_KC / 4 * SEQ_ROWS * 4], xsum[SEQ_KC];
    _Alignas(64) int8_t xg[SEQ_KC * 32];
    for (int64_t r0 = 0; r0 < nrows; r0 += SEQ_ROWS) {
        const int nv = nrows - r0 < SEQ_ROWS ? (int)(nrows - r0) : SEQ_ROWS;
        const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * row_bytes;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += SEQ_KC) {
            const int nbk = nb - b0 < SEQ_KC ? (int)(nb - b0) : SEQ_KC;
            if (wt == DT_Q8_0) { /* regroup the token's codes as Q8_1's; code sums for the offset */
                memset(xg, 0, sizeof xg);
                for (int k = 0; k < nbk; k++) {
                    const int8_t *q = xq->q + 32 * (b0 + k);
                    memcpy(xg + q81_lo(k), q, 16);
                    memcpy(xg + q81_hi(k), q + 16, 16);
                    const __m256i v = _mm256_loadu_si256((const __m256i *)q);
                    xsum[k] = _mm512_reduce_add_epi32(_mm512_madd_epi16(_mm512_cvtepi8_epi16(v), _mm512_set1_epi16(1)));
                }
            }
            /* Q8_1 codes (Q4_1) are regrouped already: b0 is a multiple of 4 blocks */
            const int8_t *xp = wt == DT_Q4_1 ? xq->q + 32 * b0 : xg;
            for (int r = 0; r < SEQ_ROWS; r++)
                row_partials(wt, bb, wr + (size_t)(r < nv ? r : nv - 1) * row_bytes, b0, nbk, xq, xp,
                             part + 16 * r, dm + 4 * r);
            for (int k = 0; k < nbk; k += 4) {
                __m512i ti[4], td[4];
                reduce16(part + (size_t)(k / 4) * SEQ_ROWS * 16, ti);
                transpose16x4(dm + (size_t)(k / 4) * SEQ_ROWS * 4, td);
                const int kb = nbk - k < 4 ? nbk - k : 4;
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                    if (j >= kb) break;
                    const int64_t i = b0 + k + j;
                    __m512i is = ti[j];
                    if (wt == DT_Q8_0) is = _mm512_sub_epi32(is, _mm512_set1_epi32(128 * xsum[k + j]));
                    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(td[j]));
                    const float dx = with_min ? xq->ds[2 * i] : xq->d[i];
                    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
                    if (with_min) {
                        const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(td[j], 16)));
                        acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(xq->ds[2 * i + 1]), acc);
                    }
                }
            }
        }
        _mm512_mask_storeu_ps(out + r0, (__mmask16)((1u << nv) - 1), acc);
    }
}

#define DOT_SEQ(NAME, T, BB)                                                                    \
    static void NAME(int64_t n, const void *w, size_t row_bytes, int64_t nrows, const struct qact *xq, \
                     const float *xf, float *out)                                               \
    {                                                                                           \
        (void)xf;                                                                               \
        dot_seq(T, BB, n, w, row_bytes, nrows, xq, out);                                        \
    }
DOT_SEQ(dot_seq_q8_0, DT_Q8_0, 34)
DOT_SEQ(dot_seq_q4_0, DT_Q4_0, 18)
DOT_SEQ(dot_seq_q5_0, DT_Q5_0, 22)
DOT_SEQ(dot_seq_q4_1, DT_Q4_1, 20)
DOT_SEQ(dot_seq_q5_1, DT_Q5_1, 24)

/* ---- float weights (F32, F16, BF16) ----
 *
 * Per (row, token) one f32 FMA chain over k in order: acc = fma(w_k, x_k, acc) from 0.
 * Batched: weights converted to f32 and repacked per strip of 32 rows and chunk of GF_KC
 * columns as [k][32]; micro-kernel 32 rows x GEMM_TILE tokens = 24 accumulators, per k
 * 2 weight loads and 24 FMAs with the token's x broadcast. One token: 16 rows' 16-column
 * blocks are converted and transposed in registers (lane = row) and the same chain runs,
 * so a token's result does not depend on its batch. Reading 16 rows at once is slow from
 * DRAM (~0.3x the per-token kernels); streaming each row into an L1 buffer first, as the
 * quantized twins do, is the next step.
 */

#define GF_STRIP 32
#define GF_KC 160 /* columns per chunk: 32 x 160 f32 = 20 KB */

/* 16 f32 of a float row starting at column k */
static inline __m512 ld16_float(enum dtype wt, const uint8_t *row, int64_t k, __mmask16 m)
{
    if (wt == DT_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * k);
    if (wt == DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Packs rows [0, nv) of a 32-row strip, columns [k0, k0 + kc), as f32 out[k][32]; rows
 * nv..31 are zero. */
static void pack_strip_float(enum dtype wt, const uint8_t *w, size_t row_bytes, int nv, int64_t k0, int kc,
                             float *out)
{
    const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(GF_STRIP));
    for (int r = 0; r < GF_STRIP; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int k = 0; k < kc; k += 16) {
            const __mmask16 m = kc - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (kc - k)) - 1);
            __m512 v = r < nv ? ld16_float(wt, row, k0 + k, m) : _mm512_setzero_ps();
            _mm512_mask_i32scatter_ps(out + (size_t)k * GF_STRIP + r, m, vidx, v, 4);
        }
    }
}

/* 32 rows x GEMM_TILE tokens over kc columns of a packed chunk and its activations. */
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

/* In-register transpose of 16 x 16 f32 (v[r] lane k -> v[k] lane r). */
static inline __attribute__((always_inline)) void transpose16x16(__m512 v[16])
{
    __m512 t[16];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        v[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i]), _mm512_castps_pd(t[4 * i + 2])));
        v[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i]), _mm512_castps_pd(t[4 * i + 2])));
        v[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
        v[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
    }
    /* v[4i + j] lane (4 * lane128 + j') holds rows 4i..4i+3 of columns (4 * lane128 + j) */
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_f32x4(v[j], v[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_f32x4(v[j], v[4 + j], 0xDD);
        t[8 + j] = _mm512_shuffle_f32x4(v[8 + j], v[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(v[8 + j], v[12 + j], 0xDD);
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        v[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        v[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
        v[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
        v[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
    }
}

/* One token: rows 16 at a time (past the end: the last row again, not stored). */
static inline __attribute__((always_inline)) void dot_seq_float(enum dtype wt, int64_t n, const void *w,
                                                                size_t row_bytes, int64_t nrows, const float *x,
                                                                float *out)
{
    for (int64_t r0 = 0; r0 < nrows; r0 += 16) {
        const int nv = nrows - r0 < 16 ? (int)(nrows - r0) : 16;
        const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * row_bytes;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t k0 = 0; k0 < n; k0 += 16) {
            const int kc = n - k0 < 16 ? (int)(n - k0) : 16;
            const __mmask16 m = kc == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << kc) - 1);
            __m512 v[16];
            _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++)
                v[r] = ld16_float(wt, wr + (size_t)(r < nv ? r : nv - 1) * row_bytes, k0, m);
            _mm_prefetch((const char *)(wr + (size_t)(nv - 1) * row_bytes) + 4 * k0 + 512, _MM_HINT_T0);
            transpose16x16(v);
            if (kc == 16) {
                _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++)
                    acc = _mm512_fmadd_ps(v[k], _mm512_set1_ps(x[k0 + k]), acc);
            } else {
                _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++)
                    if (k < kc) acc = _mm512_fmadd_ps(v[k], _mm512_set1_ps(x[k0 + k]), acc);
            }
        }
        _mm512_mask_storeu_ps(out + r0, (__mmask16)((1u << nv) - 1), acc);
    }
}

#define DOT_SEQ_FLOAT(NAME, T)                                                                  \
    static void NAME(int64_t n, const void *w, size_t row_bytes, int64_t nrows, const struct qact *xq, \
                     const float *xf, float *out)                                               \
    {                                                                                           \
        (void)xq;                                                                               \
        dot_seq_float(T, n, w, row_bytes, nrows, xf, out);                                      \
    }
DOT_SEQ_FLOAT(dot_seq_f32, DT_F32)
DOT_SEQ_FLOAT(dot_seq_f16, DT_F16)
DOT_SEQ_FLOAT(dot_seq_bf16, DT_BF16)

/* ---- driver: units (strip, token tile), strip-major ---- */

static void gemm_run(enum dtype wt, int64_t n, const void *w, size_t row_bytes, int64_t nrows, const void *act,
                     int num_tokens, float *y, int64_t y_stride, long u0, long u1)
{
    _Alignas(64) uint8_t pack[PACK_BYTES];
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    if (gemm_kind_of(wt) == GEMM_FLOAT) {
        const size_t tile_floats = (size_t)n * GEMM_TILE;
        for (long u = u0; u < u1;) {
            const long s = u / ntiles, tb = u % ntiles;
            const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
            u += te - tb;
            const int64_t r0 = (int64_t)s * GF_STRIP;
            const int nv = nrows - r0 < GF_STRIP ? (int)(nrows - r0) : GF_STRIP;
            const __mmask16 m0 = nv >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1);
            const __mmask16 m1 = nv <= 16 ? 0 : (__mmask16)((1u << (nv - 16)) - 1);
            const uint8_t *ws = (const uint8_t *)w + (size_t)r0 * row_bytes;
            for (int64_t k0 = 0; k0 < n; k0 += GF_KC) {
                const int kc = n - k0 < GF_KC ? (int)(n - k0) : GF_KC;
                pack_strip_float(wt, ws, row_bytes, nv, k0, kc, (float *)pack);
                for (long tl = tb; tl < te; tl++) {
                    const int t0 = (int)tl * GEMM_TILE;
                    const int nt = num_tokens - t0 < GEMM_TILE ? num_tokens - t0 : GEMM_TILE;
                    const float *xt = (const float *)act + (size_t)tl * tile_floats + (size_t)k0 * GEMM_TILE;
                    micro_float((const float *)pack, xt, kc, y + (size_t)t0 * (size_t)y_stride + r0, y_stride, nt,
                                m0, m1, k0 > 0);
                }
            }
        }
        return;
    }
    const int with_min = gemm_kind_of(wt) == GEMM_MIN;
    const int64_t nb = n / 32;
    const size_t tile_bytes = (size_t)nb * GEMM_QACT_BLOCK;
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * GQ_STRIP;
        const int nv = nrows - r0 < GQ_STRIP ? (int)(nrows - r0) : GQ_STRIP;
        const __mmask16 rmask = (__mmask16)((1u << nv) - 1);
        const uint8_t *ws = (const uint8_t *)w + (size_t)r0 * row_bytes;
        for (int64_t kb = 0; kb < nb; kb += GQ_KC_BLOCKS) {
            const int nbk = nb - kb < GQ_KC_BLOCKS ? (int)(nb - kb) : GQ_KC_BLOCKS;
            pack_strip_quant(wt, ws, row_bytes, nv, kb, nbk, pack);
            for (long tl = tb; tl < te; tl++) {
                const int t0 = (int)tl * GEMM_TILE;
                const int nt = num_tokens - t0 < GEMM_TILE ? num_tokens - t0 : GEMM_TILE;
                const uint8_t *xa = (const uint8_t *)act + (size_t)tl * tile_bytes + (size_t)kb * GEMM_QACT_BLOCK;
                float *yt = y + (size_t)t0 * (size_t)y_stride + r0;
                if (with_min)
                    micro_quant_min(pack, xa, nbk, yt, y_stride, nt, rmask, kb > 0);
                else
                    micro_quant_offset(pack, xa, nbk, yt, y_stride, nt, rmask, kb > 0);
            }
        }
    }
}

const struct quant_gemm quant_gemm_avx512 = {
    .strip_rows = {
        [DT_F32] = GF_STRIP, [DT_F16] = GF_STRIP, [DT_BF16] = GF_STRIP,
        [DT_Q8_0] = GQ_STRIP, [DT_Q4_0] = GQ_STRIP, [DT_Q4_1] = GQ_STRIP,
        [DT_Q5_0] = GQ_STRIP, [DT_Q5_1] = GQ_STRIP,
    },
    .dot = {
        [DT_F32] = dot_seq_f32, [DT_F16] = dot_seq_f16, [DT_BF16] = dot_seq_bf16,
        [DT_Q8_0] = dot_seq_q8_0, [DT_Q4_0] = dot_seq_q4_0, [DT_Q4_1] = dot_seq_q4_1,
        [DT_Q5_0] = dot_seq_q5_0, [DT_Q5_1] = dot_seq_q5_1,
    },
    .pack_act = gemm_pack_act,
    .run = gemm_run,
};

#endif
