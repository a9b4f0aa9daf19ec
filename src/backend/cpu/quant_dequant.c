/* quant_dequant.c — block formats and quant_dequant_row (GGUF/ggml layouts, bit-exact).
 *
 * Per block (b = block, little-endian, fp16 scales):
 *   Q8_0 (32, 34 B):  d | qs[32] int8                      x[j] = d * qs[j]
 *   Q4_0 (32, 18 B):  d | qs[16]                            x[j] = d * (nib[j] - 8)
 *   Q4_1 (32, 20 B):  d, m | qs[16]                         x[j] = d * nib[j] + m
 *   Q5_0 (32, 22 B):  d | qh[4] | qs[16]                    x[j] = d * ((nib[j] | h[j] << 4) - 16)
 *   Q5_1 (32, 24 B):  d, m | qh[4] | qs[16]                 x[j] = d * (nib[j] | h[j] << 4) + m
 *       nib[j] = qs[j] & 15 and nib[j + 16] = qs[j] >> 4 (j < 16); h[j] = bit j of qh (u32 LE)
 *   Q4_K (256, 144 B): d, dmin | scales[12] | qs[128]: 8 sub-blocks of 32 with 6-bit scale
 *       sc and min m; x = (d*sc) * q - (dmin*m); 64 elements per 32 qs bytes: low nibbles
 *       are sub-block 2k, high nibbles sub-block 2k+1.
 *   Q6_K (256, 210 B): ql[128] | qh[64] | scales[16] int8 | d: per 128-element half,
 *       q = (4 low bits from ql) | (2 bits from qh) << 4, x = (d*scale[16 elems]) * (q - 32)
 * The expression order (d*sc first, then *q, separate multiply and add — no FMA; the
 * build is ISO C so GCC does not contract) matches ggml's dequantize_row_* and
 * gguf-py's numpy code, so outputs are bitwise identical to both.
 *
 * Scalar only: this serves embedding lookups (one row per token), not the hot loop.
 */
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_kernels.h"
#include "util/half.h"

#include <assert.h>
#include <string.h>

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void quant_q4k_scales(const uint8_t *q, uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0xF) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

void quant_q4k_codes(const uint8_t *blk, uint8_t u[256])
{
    const uint8_t *qs = blk + 16;
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 32; l++) {
            u[64 * k + l] = qs[32 * k + l] & 0x0F;
            u[64 * k + 32 + l] = qs[32 * k + l] >> 4;
        }
}

void quant_q6k_codes(const uint8_t *blk, uint8_t u[256])
{
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            u[128 * h + l] = (uint8_t)((ql[l] & 0x0F) | (qh[l] & 3) << 4);
            u[128 * h + l + 32] = (uint8_t)((ql[l + 32] & 0x0F) | (qh[l] >> 2 & 3) << 4);
            u[128 * h + l + 64] = (uint8_t)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4);
            u[128 * h + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4);
        }
    }
}

static void dq_q8_0(const uint8_t *b, float *y)
{
    float d = fp16_to_fp32(rd16(b));
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
}

static void dq_q4_0(const uint8_t *b, float *y)
{
    float d = fp16_to_fp32(rd16(b));
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((b[2 + j] & 0xF) - 8);
        y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

static void dq_q4_1(const uint8_t *b, float *y)
{
    float d = fp16_to_fp32(rd16(b)), m = fp16_to_fp32(rd16(b + 2));
    for (int j = 0; j < 16; j++) {
        float v0 = d * (float)(b[4 + j] & 0xF);
        float v1 = d * (float)(b[4 + j] >> 4);
        y[j] = v0 + m;
        y[j + 16] = v1 + m;
    }
}

static void dq_q5_0(const uint8_t *b, float *y)
{
    float d = fp16_to_fp32(rd16(b));
    uint32_t qh = rd32(b + 2);
    for (int j = 0; j < 16; j++) {
        int x0 = (int)((b[6 + j] & 0xF) | (((qh >> j) & 1u) << 4)) - 16;
        int x1 = (int)((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
        y[j] = d * (float)x0;
        y[j + 16] = d * (float)x1;
    }
}

static void dq_q5_1(const uint8_t *b, float *y)
{
    float d = fp16_to_fp32(rd16(b)), m = fp16_to_fp32(rd16(b + 2));
    uint32_t qh = rd32(b + 4);
    for (int j = 0; j < 16; j++) {
        unsigned x0 = (b[8 + j] & 0xFu) | (((qh >> j) & 1u) << 4);
        unsigned x1 = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
        float v0 = d * (float)x0;
        float v1 = d * (float)x1;
        y[j] = v0 + m;
        y[j + 16] = v1 + m;
    }
}

static void dq_q4_k(const uint8_t *b, float *y)
{
    float d = fp16_to_fp32(rd16(b)), dmin = fp16_to_fp32(rd16(b + 2));
    uint8_t sc[8], m[8];
    quant_q4k_scales(b + 4, sc, m);
    const uint8_t *qs = b + 16;
    for (int k = 0; k < 4; k++) {
        float d1 = d * (float)sc[2 * k], m1 = dmin * (float)m[2 * k];
        float d2 = d * (float)sc[2 * k + 1], m2 = dmin * (float)m[2 * k + 1];
        for (int l = 0; l < 32; l++) {
            float v = d1 * (float)(qs[l] & 0xF);
            y[l] = v - m1;
        }
        for (int l = 0; l < 32; l++) {
            float v = d2 * (float)(qs[l] >> 4);
            y[32 + l] = v - m2;
        }
        qs += 32;
        y += 64;
    }
}

static void dq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = fp16_to_fp32(rd16(b + 208));
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
            y[l] = (d * (float)sc[is]) * (float)q1;
            y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
            y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
            y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
        }
        ql += 64;
        qh += 32;
        sc += 8;
        y += 128;
    }
}

void quant_dequant_row(enum dtype type, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    int be = dtype_block_elems(type), bb = dtype_block_bytes(type);
    assert(dtype_is_supported((int)type) && "loaders validate weight types");
    assert(be > 0 && n % be == 0);
    void (*blk)(const uint8_t *, float *) = NULL;
    switch (type) {
    case DT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(rd16(p + 2 * i));
        return;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(rd16(p + 2 * i));
        return;
    case DT_Q8_0: blk = dq_q8_0; break;
    case DT_Q4_0: blk = dq_q4_0; break;
    case DT_Q4_1: blk = dq_q4_1; break;
    case DT_Q5_0: blk = dq_q5_0; break;
    case DT_Q5_1: blk = dq_q5_1; break;
    case DT_Q4_K: blk = dq_q4_k; break;
    case DT_Q6_K: blk = dq_q6_k; break;
    default: assert(!"unsupported weight type"); return;
    }
    for (int64_t i = 0; i < n / be; i++) blk(p + i * bb, dst + i * be);
}
