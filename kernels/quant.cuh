/* quant.cuh — device-side decoders of GGUF's quantized block formats, shared by the
 * quantized matmul (quant_matmul.cu) and the embedding gather (embedding.cu). Private to
 * kernels/: included after common.cuh.
 *
 * Weights stay in device memory exactly as stored in the file (util/tensor.h: rows of
 * n_in elements, row r at w + r * row_bytes, blocks back to back). The layouts, and the
 * CPU reference for each, are in src/backend/cpu/quant_dequant.c:
 *   Q8_0 (32 el, 34 B): d | qs[32]               Q4_0 (32, 18): d | qs[16]
 *   Q4_1 (32, 20): d, m | qs[16]                 Q5_0 (32, 22): d | qh[4] | qs[16]
 *   Q5_1 (32, 24): d, m | qh[4] | qs[16]
 *   Q4_K (256, 144): d, dmin | scales[12] | qs[128]
 *   Q6_K (256, 210): ql[128] | qh[64] | scales[16] (int8) | d
 * Only Q4_K's blocks keep 16-byte alignment; the others sit at 2-byte boundaries. So the
 * kernels never read weights from global memory at their natural alignment: a warp copies
 * a contiguous byte range of a row ("chunk") into shared memory with aligned 16-byte
 * loads (qstage_load / qstage_store below), and the decoders read the chunk from shared
 * memory at any even offset (qs_ld: two aligned 32-bit reads + one byte permute per word).
 *
 * Units. Every decoder works on a "unit" of 32 weights of one row: one block for the
 * 32-element types, one eighth of a block for Q4_K / Q6_K. A chunk is 32 consecutive
 * units of a row (one per lane). A unit's 32 weights are NG groups of 4*NI consecutive
 * elements (NG * NI = 8 words of four 8-bit codes):
 *   32-element types: 1 group of 32         (the block)
 *   Q4_K unit p of block kb (k = p/2, h = p%2): 2 groups of 16, at 256kb + 64k + 16h
 *        (low nibbles, sub-block 2k) and +32 (high nibbles, sub-block 2k + 1)
 *   Q6_K unit p of block kb (h = p/4, q = p%4): 4 groups of 8, at 256kb + 128h + 8q + 32g
 * Each group lies inside one 32-element activation block, which is what the dot product
 * needs: activations are quantized per 32 elements (int8 codes, scale dx, code sum sx).
 *
 * Two decodings of a unit:
 *   qdecode_dot  int8-range codes v[8] (packed 4 per word, for __dp4a against the
 *                activation codes) and per group g a scale a[g] and an offset coefficient
 *                b[g] such that   sum over the group of w_i * x_i
 *                               ~ dx * (a[g] * sum_i v_i * xq_i + b[g] * sx)
 *                (b absorbs zero points and mins: Q4_0 -8d, Q5_0 -16d, Q4_1/Q5_1 m,
 *                Q4_K -dmin*m on the unit holding the sub-block's first half, else 0).
 *   qdecode_f32  the 32 weights as floats, with the CPU's expression order and no fused
 *                multiply-add (__fmul_rn / __fadd_rn), so they are bitwise what
 *                quant_dequant_row gives.
 */
#ifndef TESSERA_KERNELS_QUANT_CUH
#define TESSERA_KERNELS_QUANT_CUH

#include "kernels/common.cuh"
#include "kernels/quant_matmul.h"

extern "C" {
#include "util/tensor.h"
}

/* True when p is 16-byte aligned (launchers check their pointers with it). */
static inline bool q_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---- traits ------------------------------------------------------------------------------ */

template <int QT> struct qtraits;

#define QTRAITS(QT, ELEMS, BYTES, UNITS_, NG_, HAS_B_)                                           \
    template <> struct qtraits<QT> {                                                             \
        static constexpr int BLOCK_ELEMS = ELEMS;  /* elements per block */                      \
        static constexpr int BLOCK_BYTES = BYTES;  /* bytes per block */                         \
        static constexpr int UNITS = UNITS_;       /* units of 32 weights per block */           \
        static constexpr int NG = NG_;             /* groups per unit */                         \
        static constexpr int NI = 8 / NG_;         /* code words per group */                    \
        static constexpr bool HAS_B = HAS_B_;      /* the dot needs the activation code sum */   \
        static constexpr int CHUNK_BLOCKS = 32 / UNITS_;                                         \
        static constexpr int CHUNK_BYTES = CHUNK_BLOCKS * BYTES;                                 \
        /* 16-byte windows covering a chunk that starts at any even offset in its window */     \
        static constexpr int CHUNK_WINDOWS = (CHUNK_BYTES + 14 + 15) / 16;                       \
        /* shared bytes per staged row: the windows plus one spare (qs_ld reads one word past) */ \
        static constexpr int STAGE_ROW_BYTES = 16 * (CHUNK_WINDOWS + 1);                         \
    }

QTRAITS(DT_Q8_0, 32, 34, 1, 1, false);
QTRAITS(DT_Q4_0, 32, 18, 1, 1, true);
QTRAITS(DT_Q4_1, 32, 20, 1, 1, true);
QTRAITS(DT_Q5_0, 32, 22, 1, 1, true);
QTRAITS(DT_Q5_1, 32, 24, 1, 1, true);
QTRAITS(DT_Q4_K, 256, 144, 8, 2, true);
QTRAITS(DT_Q6_K, 256, 210, 8, 4, false);
#undef QTRAITS

/* Element offset, inside the row, of group g of unit u (u counts units from the row start). */
template <int QT> __device__ __forceinline__ int qunit_elem(int u, int g)
{
    using Q = qtraits<QT>;
    if (Q::UNITS == 1) return 32 * u;
    const int kb = u >> 3, p = u & 7;
    if (QT == DT_Q4_K) return 256 * kb + 64 * (p >> 1) + 16 * (p & 1) + 32 * g;
    return 256 * kb + 128 * (p >> 2) + 8 * (p & 3) + 32 * g; /* Q6_K */
}

/* ---- reading a staged chunk -------------------------------------------------------------- */

/* N little-endian 32-bit words starting at byte offset off (even) of s (16-byte aligned
 * shared memory): aligned words, realigned with a byte permute. Reads the word after the
 * last one too (hence STAGE_ROW_BYTES' spare window). */
template <int N> __device__ __forceinline__ void qs_ld(const uint8_t *s, int off, uint32_t (&v)[N])
{
    const uint32_t *p = reinterpret_cast<const uint32_t *>(s + (off & ~3));
    const unsigned sel = 0x3210u + (unsigned)(off & 2) * 0x1111u; /* 0x3210 or 0x5432 */
    uint32_t lo = p[0];
#pragma unroll
    for (int i = 0; i < N; i++) {
        uint32_t hi = p[i + 1];
        v[i] = __byte_perm(lo, hi, sel);
        lo = hi;
    }
}

__device__ __forceinline__ uint32_t qs_ld1(const uint8_t *s, int off)
{
    uint32_t v[1];
    qs_ld<1>(s, off, v);
    return v[0];
}

__device__ __forceinline__ float qs_f16(uint32_t bits16)
{
    __half_raw r;
    r.x = (unsigned short)(bits16 & 0xffffu);
    return __half2float(__half(r));
}

/* Bit j (j < 4) of h into bit 4 of byte j (the fifth bit of Q5 codes). */
__device__ __forceinline__ uint32_t q5_high_bits(uint32_t h)
{
    return ((h & 0xfu) * 0x00204081u & 0x01010101u) << 4;
}

/* Q4_K: scale and min of sub-blocks 2k and 2k+1 from the 12 packed bytes s[3]
 * (quant_q4k_scales' unpacking, for a run-time k without indexing a local array). Both
 * values of a kind are unpacked side by side, one per byte of 16 bits: sub-blocks 0-3
 * keep 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 take 4 bits of bytes 8-11 and
 * the top 2 bits of bytes 0-3 / 4-7. No branch: lanes of one block differ in k. */
__device__ __forceinline__ void q4k_scale_pair(const uint32_t (&s)[3], int k, uint32_t &sc0, uint32_t &sc1,
                                               uint32_t &m0, uint32_t &m1)
{
    const int sh = 16 * (k & 1);
    const uint32_t x0 = s[0] >> sh, x1 = s[1] >> sh, x2 = s[2] >> sh;
    const uint32_t sc = k < 2 ? x0 & 0x3f3fu : (x2 & 0x0f0fu) | ((x0 >> 2) & 0x3030u);
    const uint32_t m = k < 2 ? x1 & 0x3f3fu : ((x2 >> 4) & 0x0f0fu) | ((x1 >> 2) & 0x3030u);
    sc0 = sc & 0xffu;
    sc1 = (sc >> 8) & 0xffu;
    m0 = m & 0xffu;
    m1 = (m >> 8) & 0xffu;
}

/* Q6_K codes 0..63 (one per byte) to code - 32 as int8: flip bit 5, then copy the new bit 5
 * (the sign of a 6-bit two's complement number) into bits 6 and 7. */
__device__ __forceinline__ uint32_t q6_signed(uint32_t v)
{
    const uint32_t x = v ^ 0x20202020u;
    return x | ((x & 0x20202020u) * 6u);
}

/* ---- decoders ----------------------------------------------------------------------------- */

/* One unit of one row for the dot product. s: the staged chunk (16-byte aligned shared
 * memory); off: byte offset of the unit's block in s; part: the unit within its block. */
template <int QT> struct qunit {
    uint32_t v[8];             /* codes, 4 per word: group g is v[g * NI .. g * NI + NI) */
    float a[qtraits<QT>::NG];  /* per group: weight scale */
    float b[qtraits<QT>::NG];  /* per group: coefficient of the activation code sum */
};

template <int QT> __device__ __forceinline__ void qdecode_dot(const uint8_t *s, int off, int part, qunit<QT> &u);

template <> __device__ __forceinline__ void qdecode_dot<DT_Q8_0>(const uint8_t *s, int off, int, qunit<DT_Q8_0> &u)
{
    u.a[0] = qs_f16(qs_ld1(s, off));
    u.b[0] = 0.0f;
    qs_ld<8>(s, off + 2, u.v);
}

template <> __device__ __forceinline__ void qdecode_dot<DT_Q4_0>(const uint8_t *s, int off, int, qunit<DT_Q4_0> &u)
{
    const float d = qs_f16(qs_ld1(s, off));
    uint32_t q[4];
    qs_ld<4>(s, off + 2, q);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u.v[i] = q[i] & 0x0f0f0f0fu;
        u.v[4 + i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
    u.a[0] = d;
    u.b[0] = -8.0f * d;
}

template <> __device__ __forceinline__ void qdecode_dot<DT_Q4_1>(const uint8_t *s, int off, int, qunit<DT_Q4_1> &u)
{
    const uint32_t dm = qs_ld1(s, off);
    uint32_t q[4];
    qs_ld<4>(s, off + 4, q);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u.v[i] = q[i] & 0x0f0f0f0fu;
        u.v[4 + i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
    u.a[0] = qs_f16(dm);
    u.b[0] = qs_f16(dm >> 16);
}

template <> __device__ __forceinline__ void qdecode_dot<DT_Q5_0>(const uint8_t *s, int off, int, qunit<DT_Q5_0> &u)
{
    const float d = qs_f16(qs_ld1(s, off));
    const uint32_t qh = qs_ld1(s, off + 2);
    uint32_t q[4];
    qs_ld<4>(s, off + 6, q);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u.v[i] = (q[i] & 0x0f0f0f0fu) | q5_high_bits(qh >> (4 * i));
        u.v[4 + i] = ((q[i] >> 4) & 0x0f0f0f0fu) | q5_high_bits(qh >> (16 + 4 * i));
    }
    u.a[0] = d;
    u.b[0] = -16.0f * d;
}

template <> __device__ __forceinline__ void qdecode_dot<DT_Q5_1>(const uint8_t *s, int off, int, qunit<DT_Q5_1> &u)
{
    const uint32_t dm = qs_ld1(s, off);
    const uint32_t qh = qs_ld1(s, off + 4);
    uint32_t q[4];
    qs_ld<4>(s, off + 8, q);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u.v[i] = (q[i] & 0x0f0f0f0fu) | q5_high_bits(qh >> (4 * i));
        u.v[4 + i] = ((q[i] >> 4) & 0x0f0f0f0fu) | q5_high_bits(qh >> (16 + 4 * i));
    }
    u.a[0] = qs_f16(dm);
    u.b[0] = qs_f16(dm >> 16);
}

/* Q4_K unit `part` from its block's words: dm (d, dmin), sc (the 12 scale bytes) and q (the
 * unit's 16 code bytes, at byte 16 + 16 * part of the block). Shared by the staged decoder
 * below and the quantized GEMV's direct path, which loads these words straight from global
 * memory (Q4_K blocks keep 16-byte alignment). */
__device__ __forceinline__ void q4k_unit_dot(uint32_t dm, const uint32_t (&sc)[3], const uint32_t (&q)[4], int part,
                                             qunit<DT_Q4_K> &u)
{
    const int k = part >> 1, h = part & 1;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u.v[i] = q[i] & 0x0f0f0f0fu;
        u.v[4 + i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
    uint32_t sc0, sc1, m0, m1;
    q4k_scale_pair(sc, k, sc0, sc1, m0, m1);
    const float d = qs_f16(dm), dmin = qs_f16(dm >> 16);
    u.a[0] = d * (float)sc0;
    u.a[1] = d * (float)sc1;
    /* the min term covers the whole 32-element sub-block: counted once, by its first half */
    u.b[0] = h ? 0.0f : -(dmin * (float)m0);
    u.b[1] = h ? 0.0f : -(dmin * (float)m1);
}

template <> __device__ __forceinline__ void qdecode_dot<DT_Q4_K>(const uint8_t *s, int off, int part, qunit<DT_Q4_K> &u)
{
    uint32_t sc[3], q[4];
    qs_ld<3>(s, off + 4, sc);
    qs_ld<4>(s, off + 16 + 16 * part, q);
    q4k_unit_dot(qs_ld1(s, off), sc, q, part, u);
}

template <> __device__ __forceinline__ void qdecode_dot<DT_Q6_K>(const uint8_t *s, int off, int part, qunit<DT_Q6_K> &u)
{
    const int h = part >> 2, q = part & 3;
    uint32_t la[2], lb[2], qh[2], sc[2];
    qs_ld<2>(s, off + 64 * h + 8 * q, la);
    qs_ld<2>(s, off + 64 * h + 32 + 8 * q, lb);
    qs_ld<2>(s, off + 128 + 32 * h + 8 * q, qh);
    qs_ld<2>(s, off + 192 + 8 * h, sc);
    const float d = qs_f16(qs_ld1(s, off + 208));
#pragma unroll
    for (int i = 0; i < 2; i++) {
        u.v[0 + i] = q6_signed((la[i] & 0x0f0f0f0fu) | ((qh[i] << 4) & 0x30303030u));
        u.v[2 + i] = q6_signed((lb[i] & 0x0f0f0f0fu) | ((qh[i] << 2) & 0x30303030u));
        u.v[4 + i] = q6_signed(((la[i] >> 4) & 0x0f0f0f0fu) | (qh[i] & 0x30303030u));
        u.v[6 + i] = q6_signed(((lb[i] >> 4) & 0x0f0f0f0fu) | ((qh[i] >> 2) & 0x30303030u));
    }
    /* scales of the four groups: bytes is, is+2, is+4, is+6 of the half's 8 (is = q / 2) */
    const uint32_t s4 = __byte_perm(sc[0], sc[1], 0x6420u + (unsigned)(q >> 1) * 0x1111u);
#pragma unroll
    for (int g = 0; g < 4; g++) {
        u.a[g] = d * (float)(int)(int8_t)(uint8_t)(s4 >> (8 * g));
        u.b[g] = 0.0f;
    }
}

/* One unit of one row as 32 floats, y[g * 4 * NI + j] = weight at qunit_elem(u, g) + j,
 * bitwise equal to quant_dequant_row (same operations, same order, no contraction). */
template <int QT> __device__ __forceinline__ void qdecode_f32(const uint8_t *s, int off, int part, float (&y)[32]);

template <> __device__ __forceinline__ void qdecode_f32<DT_Q8_0>(const uint8_t *s, int off, int, float (&y)[32])
{
    const float d = qs_f16(qs_ld1(s, off));
    uint32_t q[8];
    qs_ld<8>(s, off + 2, q);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = __fmul_rn(d, (float)(int8_t)(uint8_t)(q[j >> 2] >> (8 * (j & 3))));
}

/* Shared by the 4- and 5-bit 32-element types: code j of the block (0..31). */
__device__ __forceinline__ uint32_t q45_code(const uint32_t (&q)[4], uint32_t qh, int j, bool five)
{
    const uint32_t byte = (q[(j & 15) >> 2] >> (8 * (j & 3))) & 0xffu;
    uint32_t c = j < 16 ? (byte & 0xfu) : (byte >> 4);
    if (five) c |= ((qh >> j) & 1u) << 4;
    return c;
}

template <> __device__ __forceinline__ void qdecode_f32<DT_Q4_0>(const uint8_t *s, int off, int, float (&y)[32])
{
    const float d = qs_f16(qs_ld1(s, off));
    uint32_t q[4];
    qs_ld<4>(s, off + 2, q);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = __fmul_rn(d, (float)((int)q45_code(q, 0, j, false) - 8));
}

template <> __device__ __forceinline__ void qdecode_f32<DT_Q4_1>(const uint8_t *s, int off, int, float (&y)[32])
{
    const uint32_t dm = qs_ld1(s, off);
    const float d = qs_f16(dm), m = qs_f16(dm >> 16);
    uint32_t q[4];
    qs_ld<4>(s, off + 4, q);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = __fadd_rn(__fmul_rn(d, (float)q45_code(q, 0, j, false)), m);
}

template <> __device__ __forceinline__ void qdecode_f32<DT_Q5_0>(const uint8_t *s, int off, int, float (&y)[32])
{
    const float d = qs_f16(qs_ld1(s, off));
    const uint32_t qh = qs_ld1(s, off + 2);
    uint32_t q[4];
    qs_ld<4>(s, off + 6, q);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = __fmul_rn(d, (float)((int)q45_code(q, qh, j, true) - 16));
}

template <> __device__ __forceinline__ void qdecode_f32<DT_Q5_1>(const uint8_t *s, int off, int, float (&y)[32])
{
    const uint32_t dm = qs_ld1(s, off);
    const float d = qs_f16(dm), m = qs_f16(dm >> 16);
    const uint32_t qh = qs_ld1(s, off + 4);
    uint32_t q[4];
    qs_ld<4>(s, off + 8, q);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = __fadd_rn(__fmul_rn(d, (float)q45_code(q, qh, j, true)), m);
}

template <> __device__ __forceinline__ void qdecode_f32<DT_Q4_K>(const uint8_t *s, int off, int part, float (&y)[32])
{
    const int k = part >> 1, h = part & 1;
    const uint32_t dm = qs_ld1(s, off);
    uint32_t sc[3], q[4];
    qs_ld<3>(s, off + 4, sc);
    qs_ld<4>(s, off + 16 + 32 * k + 16 * h, q);
    uint32_t sc0, sc1, m0, m1;
    q4k_scale_pair(sc, k, sc0, sc1, m0, m1);
    const float d = qs_f16(dm), dmin = qs_f16(dm >> 16);
    const float d0 = __fmul_rn(d, (float)sc0), mm0 = __fmul_rn(dmin, (float)m0);
    const float d1 = __fmul_rn(d, (float)sc1), mm1 = __fmul_rn(dmin, (float)m1);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const uint32_t byte = (q[j >> 2] >> (8 * (j & 3))) & 0xffu;
        y[j] = __fsub_rn(__fmul_rn(d0, (float)(byte & 0xfu)), mm0);
        y[16 + j] = __fsub_rn(__fmul_rn(d1, (float)(byte >> 4)), mm1);
    }
}

template <> __device__ __forceinline__ void qdecode_f32<DT_Q6_K>(const uint8_t *s, int off, int part, float (&y)[32])
{
    qunit<DT_Q6_K> u;
    qdecode_dot<DT_Q6_K>(s, off, part, u); /* signed codes; a[g] = d * scale_g, as the CPU's (d * sc) */
#pragma unroll
    for (int j = 0; j < 32; j++)
        y[j] = __fmul_rn(u.a[j >> 3], (float)(int8_t)(uint8_t)(u.v[j >> 2] >> (8 * (j & 3))));
}

/* ---- activation quantization ------------------------------------------------------------ */

/* One block of 32 F32 activations quantized by the CPU's Q8_0 rule (quant_dot_scalar.c,
 * quantize_scalar: d = max |x| / 127 by IEEE division, codes rint(x * (1 / d)) clamped to
 * +-127, round half to even), its values spread over G consecutive lanes, N = 32 / G each
 * (G = 8: four consecutive values per lane; G = 32: one), the group's first lane a multiple
 * of G. Gives each lane its codes, and every lane of the group the block's d and the sum of
 * its 32 codes (exact). Warp-collective: all 32 lanes call it. cuda_quantize_act and the
 * RMSNorm's quantized output (cuda_rmsnorm_residual, qact) share it, so both give the bits
 * cpu_matmul's quantizer gives. */
template <int G> __device__ __forceinline__ void qact_block(const float (&v)[32 / G], int (&q)[32 / G], float &d,
                                                            int &sum)
{
    constexpr int N = 32 / G;
    static_assert(N == 4 || N == 1, "4 values per lane (8 lanes) or 1 (32 lanes)");
    float amax;
    if constexpr (N == 4) amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    else amax = fabsf(v[0]);
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(TS_FULL_MASK, amax, o));
    d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    sum = 0;
#pragma unroll
    for (int i = 0; i < N; i++) {
        q[i] = (int)fminf(fmaxf(rintf(v[i] * id), -127.0f), 127.0f);
        sum += q[i];
    }
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(TS_FULL_MASK, sum, o);
}

/* The (d, code sum) array of a quantized activation buffer for num_tokens rows of n_in
 * (kernels/quant_matmul.h, cuda_quant_act_size's layout: codes first, then this array). */
static inline float2 *qact_ds(void *act, int64_t n_in, int num_tokens)
{
    return reinterpret_cast<float2 *>(static_cast<uint8_t *>(act) + cuda_quant_act_ds_offset(n_in, num_tokens));
}
static inline const float2 *qact_ds(const void *act, int64_t n_in, int num_tokens)
{
    return qact_ds(const_cast<void *>(act), n_in, num_tokens);
}

/* Four codes (int8 range) packed little-endian into one word. */
__device__ __forceinline__ uint32_t qact_pack4(const int (&q)[4])
{
    return (uint32_t)(q[0] & 0xff) | (uint32_t)(q[1] & 0xff) << 8 | (uint32_t)(q[2] & 0xff) << 16 |
           (uint32_t)(q[3] & 0xff) << 24;
}

/* Values 4i..4i+3 of a row (o) quantized into the row's codes q (int8 [n]) and, from the
 * block's first lane (i % 8 == 0), its (d, code sum) at ds[i / 8]; nothing stored unless
 * valid (the lane's values lie in the row). Warp-collective as qact_block: every lane calls
 * it, the 8 lanes of a block with consecutive i, all valid or none. */
__device__ __forceinline__ void qact_store4(float4 o, int64_t i, bool valid, int8_t *q, float2 *ds)
{
    const float v[4] = { o.x, o.y, o.z, o.w };
    int c[4], sum;
    float d;
    qact_block<8>(v, c, d, sum);
    if (valid) {
        reinterpret_cast<uint32_t *>(q)[i] = qact_pack4(c);
        if ((i & 7) == 0) ds[i >> 3] = make_float2(d, (float)sum);
    }
}

/* ---- staging a chunk of R rows into shared memory ---------------------------------------- */

/* The 16 bytes at p (16-byte aligned) that lie below end (even), zeros above: the tail
 * of the tensor, read with 2-byte loads so nothing past its last byte is touched. */
__device__ __forceinline__ uint4 qstage_tail(const uint8_t *p, const uint8_t *end)
{
    uint32_t v[4] = { 0u, 0u, 0u, 0u };
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (p + 2 * i + 2 <= end)
            v[i >> 1] |= (uint32_t)*reinterpret_cast<const uint16_t *>(p + 2 * i) << (16 * (i & 1));
    return make_uint4(v[0], v[1], v[2], v[3]);
}

/* Warp-cooperative load of one chunk of nrows (<= R) rows into registers: row r's bytes
 * are [p0 + r * stride, + cbytes) (even start), read as the aligned 16-byte windows that
 * cover them; window j of the R * NWIN is held by lane j % 32 in pre[j / 32]. Nothing at or
 * past `end` is read. Loads are evict-first (__ldcs): a weight is read once per call and
 * must not push the activations out of L1/L2. Returns the mask of pre[] entries loaded. */
template <int R, int NWIN, int KW>
__device__ __forceinline__ unsigned qstage_load(uint4 (&pre)[KW], const uint8_t *p0, int64_t stride, int nrows,
                                                int cbytes, const uint8_t *end, int lane)
{
    unsigned valid = 0;
#pragma unroll
    for (int k = 0; k < KW; k++) {
        const int j = lane + 32 * k;
        const int r = j / NWIN, jw = j - r * NWIN;
        if (r < nrows) {
            const uint8_t *a = p0 + r * stride;
            const int head = (int)((uintptr_t)a & 15);
            if (jw < ((head + cbytes + 15) >> 4)) {
                const uint8_t *p = a - head + 16 * jw;
                pre[k] = p + 16 <= end ? __ldcs(reinterpret_cast<const uint4 *>(p)) : qstage_tail(p, end);
                valid |= 1u << k;
            }
        }
    }
    return valid;
}

/* Stores what qstage_load loaded: window jw of row r at buf + r * 16 * (NWIN + 1) + 16 * jw,
 * so row r's chunk starts at byte r * STAGE_ROW_BYTES + (its start address & 15). */
template <int R, int NWIN, int KW>
__device__ __forceinline__ void qstage_store(const uint4 (&pre)[KW], unsigned valid, uint8_t *buf, int lane)
{
    uint4 *b = reinterpret_cast<uint4 *>(buf);
#pragma unroll
    for (int k = 0; k < KW; k++) {
        const int j = lane + 32 * k;
        if (valid & (1u << k)) b[j + j / NWIN] = pre[k];
    }
}

#endif
