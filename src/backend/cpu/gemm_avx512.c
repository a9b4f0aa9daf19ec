/* gemm_avx512.c — batched matmul (prefill: num_tokens >= 2) on AVX-512 F/BW/VL/VNNI.
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
 *
 * Float types (F32, F16, BF16): weights converted to f32 and repacked per strip of 32
 * rows and chunk of GF_KC columns as [k][32]; micro-kernel 32 rows x GEMM_TILE tokens =
 * 24 f32 accumulators, per k 2 weight loads and 24 FMAs with the token's x broadcast.
 *
 * Chunks after the first add to y, so K of any length works with fixed buffers. Each
 * output's arithmetic depends only on its row, token and K, never on the thread split.
 * The layout of the packed activations is in quant_kernels.h.
 */
#include "backend/cpu/quant_kernels.h"

#ifdef GEMM_HAVE_AVX512

#include "util/half.h"

#include <immintrin.h>
#include <string.h>

#define GQ_STRIP 16
#define GF_STRIP 32
#define GQ_KC_BLOCKS 32                 /* blocks per weight chunk: 1024 elements */
#define GQ_PACK_BLOCK 640               /* bytes of one packed block of a strip */
#define GF_KC 160                       /* columns per float chunk: 20 KB */
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
    const int fl = gemm_kind_of(wt) == GEMM_FLOAT;
    const size_t tile_bytes = fl ? (size_t)n * GEMM_TILE * sizeof(float) : (size_t)(n / 32) * GEMM_QACT_BLOCK;
    for (int t = t0; t < t1; t++) {
        uint8_t *tile = (uint8_t *)act + (size_t)(t / GEMM_TILE) * tile_bytes;
        const float *xt = x + (size_t)t * (size_t)n;
        if (fl) {
            float *xf = (float *)tile;
            for (int64_t k = 0; k < n; k++) xf[k * GEMM_TILE + t % GEMM_TILE] = xt[k];
        } else {
            pack_act_quant(wt, xt, n, tile, t % GEMM_TILE);
        }
    }
    if (t1 == num_tokens && num_tokens % GEMM_TILE) { /* zero tokens pad the last tile */
        uint8_t *tile = (uint8_t *)act + (size_t)(num_tokens / GEMM_TILE) * tile_bytes;
        for (int lane = num_tokens % GEMM_TILE; lane < GEMM_TILE; lane++) {
            if (fl) {
                float *xf = (float *)tile;
                for (int64_t k = 0; k < n; k++) xf[k * GEMM_TILE + lane] = 0.0f;
            } else {
                for (int64_t b = 0; b < n / 32; b++) {
                    uint8_t *blk = tile + (size_t)b * GEMM_QACT_BLOCK;
                    for (int j = 0; j < 10; j++) ((int32_t *)blk)[j * GEMM_TILE + lane] = 0;
                }
            }
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
    __m512 acc[GEMM_TILE];
    for (int t = 0; t < GEMM_TILE; t++)
        acc[t] = add && t < nt ? _mm512_maskz_loadu_ps(rmask, y + (size_t)t * (size_t)ys) : _mm512_setzero_ps();
    for (int b = 0; b < nbk; b++) {
        const uint8_t *wb = wp + (size_t)b * GQ_PACK_BLOCK, *xb = xa + (size_t)b * GEMM_QACT_BLOCK;
        const int32_t *q4 = (const int32_t *)xb;
        const float *xd = (const float *)(xb + 32 * GEMM_TILE);
        __m512i ai[GEMM_TILE];
        for (int t = 0; t < GEMM_TILE; t++)
            ai[t] = with_min ? _mm512_setzero_si512()
                             : _mm512_set1_epi32(((const int32_t *)(xb + 36 * GEMM_TILE))[t]);
        for (int j = 0; j < 8; j++) {
            __m512i wv = _mm512_load_si512((const void *)(wb + 64 * j));
            for (int t = 0; t < GEMM_TILE; t++)
                ai[t] = _mm512_dpbusd_epi32(ai[t], wv, _mm512_set1_epi32(q4[j * GEMM_TILE + t]));
        }
        const __m512 dw = _mm512_load_ps((const float *)(wb + 512));
        for (int t = 0; t < GEMM_TILE; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[t]), _mm512_mul_ps(dw, _mm512_set1_ps(xd[t])), acc[t]);
        if (with_min) {
            const __m512 mw = _mm512_load_ps((const float *)(wb + 576));
            const float *xs = (const float *)(xb + 36 * GEMM_TILE);
            for (int t = 0; t < GEMM_TILE; t++) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[t]), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ys, rmask, acc[t]);
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

/* ---- float weights ---- */

/* Packs rows [0, nv) of a 32-row strip, columns [k0, k0 + kc), as f32 out[k][32]. */
static void pack_strip_float(enum dtype wt, const uint8_t *w, size_t row_bytes, int nv, int64_t k0, int kc,
                             float *out)
{
    const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(GF_STRIP));
    for (int r = 0; r < GF_STRIP; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        int k = 0;
        for (; k + 16 <= kc; k += 16) {
            __m512 v;
            if (r >= nv) v = _mm512_setzero_ps();
            else if (wt == DT_F32) v = _mm512_loadu_ps((const float *)row + k0 + k);
            else if (wt == DT_F16) v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (k0 + k))));
            else v = _mm512_castsi512_ps(_mm512_slli_epi32(
                         _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * (k0 + k)))), 16));
            _mm512_i32scatter_ps(out + (size_t)k * GF_STRIP + r, vidx, v, 4);
        }
        for (; k < kc; k++) {
            float v = 0.0f;
            if (r < nv) {
                int64_t i = k0 + k;
                if (wt == DT_F32) memcpy(&v, row + 4 * i, 4);
                else {
                    uint16_t h;
                    memcpy(&h, row + 2 * i, 2);
                    v = wt == DT_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
                }
            }
            out[(size_t)k * GF_STRIP + r] = v;
        }
    }
}

/* 32 rows x GEMM_TILE tokens over kc columns of a packed chunk and its activations. */
static void micro_float(const float *wp, const float *xt, int kc, float *y, int64_t ys, int nt, __mmask16 m0,
                        __mmask16 m1, int add)
{
    __m512 a0[GEMM_TILE], a1[GEMM_TILE];
    for (int t = 0; t < GEMM_TILE; t++) {
        float *yt = y + (size_t)t * (size_t)ys;
        a0[t] = add && t < nt ? _mm512_maskz_loadu_ps(m0, yt) : _mm512_setzero_ps();
        a1[t] = add && t < nt ? _mm512_maskz_loadu_ps(m1, yt + 16) : _mm512_setzero_ps();
    }
    for (int k = 0; k < kc; k++) {
        const __m512 w0 = _mm512_load_ps(wp + (size_t)k * GF_STRIP), w1 = _mm512_load_ps(wp + (size_t)k * GF_STRIP + 16);
        const float *xk = xt + (size_t)k * GEMM_TILE;
        for (int t = 0; t < GEMM_TILE; t++) {
            const __m512 xb = _mm512_set1_ps(xk[t]);
            a0[t] = _mm512_fmadd_ps(w0, xb, a0[t]);
            a1[t] = _mm512_fmadd_ps(w1, xb, a1[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        float *yt = y + (size_t)t * (size_t)ys;
        _mm512_mask_storeu_ps(yt, m0, a0[t]);
        _mm512_mask_storeu_ps(yt + 16, m1, a1[t]);
    }
}

/* ---- driver: units (strip, token tile), strip-major ---- */

static __mmask16 rows_mask(int nv) { return nv >= 16 ? (__mmask16)0xFFFF : nv <= 0 ? 0 : (__mmask16)((1u << nv) - 1); }

static void gemm_run(enum dtype wt, int64_t n, const void *w, size_t row_bytes, int64_t nrows, const void *act,
                     int num_tokens, float *y, int64_t y_stride, long u0, long u1)
{
    _Alignas(64) uint8_t pack[PACK_BYTES];
    const enum gemm_kind kind = gemm_kind_of(wt);
    const int strip = kind == GEMM_FLOAT ? GF_STRIP : GQ_STRIP;
    const long ntiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    const size_t tile_bytes = kind == GEMM_FLOAT ? (size_t)n * GEMM_TILE * sizeof(float)
                                                 : (size_t)(n / 32) * GEMM_QACT_BLOCK;
    for (long u = u0; u < u1;) {
        const long s = u / ntiles, tb = u % ntiles;
        const long te = tb + (u1 - u) < ntiles ? tb + (u1 - u) : ntiles;
        u += te - tb;
        const int64_t r0 = (int64_t)s * strip;
        const int nv = nrows - r0 < strip ? (int)(nrows - r0) : strip;
        const uint8_t *ws = (const uint8_t *)w + (size_t)r0 * row_bytes;
        if (kind == GEMM_FLOAT) {
            for (int64_t k0 = 0; k0 < n; k0 += GF_KC) {
                const int kc = n - k0 < GF_KC ? (int)(n - k0) : GF_KC;
                pack_strip_float(wt, ws, row_bytes, nv, k0, kc, (float *)pack);
                for (long tl = tb; tl < te; tl++) {
                    const int t0 = (int)tl * GEMM_TILE;
                    const int nt = num_tokens - t0 < GEMM_TILE ? num_tokens - t0 : GEMM_TILE;
                    const float *xt = (const float *)((const uint8_t *)act + (size_t)tl * tile_bytes) + k0 * GEMM_TILE;
                    micro_float((const float *)pack, xt, kc, y + (size_t)t0 * (size_t)y_stride + r0, y_stride, nt,
                                rows_mask(nv), rows_mask(nv - 16), k0 > 0);
                }
            }
        } else {
            const int64_t nb = n / 32;
            for (int64_t kb = 0; kb < nb; kb += GQ_KC_BLOCKS) {
                const int nbk = nb - kb < GQ_KC_BLOCKS ? (int)(nb - kb) : GQ_KC_BLOCKS;
                pack_strip_quant(wt, ws, row_bytes, nv, kb, nbk, pack);
                for (long tl = tb; tl < te; tl++) {
                    const int t0 = (int)tl * GEMM_TILE;
                    const int nt = num_tokens - t0 < GEMM_TILE ? num_tokens - t0 : GEMM_TILE;
                    const uint8_t *xa = (const uint8_t *)act + (size_t)tl * tile_bytes + (size_t)kb * GEMM_QACT_BLOCK;
                    float *yt = y + (size_t)t0 * (size_t)y_stride + r0;
                    if (kind == GEMM_MIN)
                        micro_quant_min(pack, xa, nbk, yt, y_stride, nt, rows_mask(nv), kb > 0);
                    else
                        micro_quant_offset(pack, xa, nbk, yt, y_stride, nt, rows_mask(nv), kb > 0);
                }
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
    .pack_act = gemm_pack_act,
    .run = gemm_run,
};

#endif
