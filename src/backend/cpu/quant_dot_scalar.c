/* quant_dot_scalar.c — the portable kernel set: activation quantization and one dot
 * product per weight type, plain C. Always compiled and tested; the SIMD set
 * (quant_dot_avx2.c) must agree with it.
 *
 * Math (per weight block b, activation block with scale dx_b, see quant_kernels.h):
 *   Q8_0/Q4_0/Q5_0 x Q8_0:  dot += (dw_b * dx_b) * sum_j qw_j * qx_j        (qw signed)
 *   Q4_1/Q5_1 x Q8_1:       dot += (dw_b * dx_b) * sum_j qw_j * qx_j + m_b * s_b
 *                           (s_b = dx_b * sum_j qx_j, so m_b * s_b = sum_j m_b * x_j)
 *   Q4_K x Q8_K (per 256):  dot += (d * dx) * sum_k sc_k * sum_{j in k} q_j qx_j
 *                                 - (dmin * dx) * sum_k m_k * sum_{j in k} qx_j
 *   Q6_K x Q8_K (per 256):  dot += (d * dx) * sum_g sc_g * (sum_{j in g} q_j qx_j
 *                                                          - 32 * sum_{j in g} qx_j)
 * Integer sums are exact; only the per-block f32 scaling and the accumulation round.
 * Float weights: plain f32 sum of w_i * x_i.
 */
#include "backend/cpu/quant_kernels.h"
#include "util/half.h"

#include <assert.h>
#include <math.h>

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

enum dtype quant_act_type(enum dtype w)
{
    switch (w) {
    case DT_F32: case DT_F16: case DT_BF16: return DT_F32;
    case DT_Q8_0: case DT_Q4_0: case DT_Q5_0: return DT_Q8_0;
    case DT_Q4_1: case DT_Q5_1: return DT_Q8_1;
    case DT_Q4_K: case DT_Q6_K: return DT_Q8_K;
    default: assert(!"unsupported weight type"); return DT_F32;
    }
}

int quant_act_block(enum dtype act) { return act == DT_Q8_K ? 256 : act == DT_F32 ? 1 : 32; }

/* Quantizes activation blocks [b0, b1). The scale is amax/127 and q = nearest-even
 * (x * (1/d)); the SIMD version computes the same products in the same order, so both
 * sets produce identical bytes. */
static void quantize_scalar(enum dtype act, const float *x, int64_t b0, int64_t b1,
                            const struct qact *out)
{
    int qa = quant_act_block(act);
    for (int64_t b = b0; b < b1; b++) {
        const float *xb = x + b * qa;
        int8_t *q = out->q + b * qa; /* Q8_0 / Q8_K */
        float amax = 0.0f;
        for (int j = 0; j < qa; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < qa; j++) {
            float v = nearbyintf(xb[j] * id);
            v = fminf(fmaxf(v, -127.0f), 127.0f);
            if (act == DT_Q8_1) out->q[j < 16 ? q81_lo(b) + j : q81_hi(b) + j - 16] = (int8_t)v;
            else q[j] = (int8_t)v;
            sum += (int)v;
        }
        if (act == DT_Q8_1) {
            out->ds[2 * b] = d;
            out->ds[2 * b + 1] = d * (float)sum;
        } else {
            out->d[b] = d;
        }
        if (act == DT_Q8_K)
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += q[16 * g + j];
                out->bsums[b * 16 + g] = (int16_t)s;
            }
    }
}

static float dot1_f32(int64_t n, const void *w, const struct qact *xq, const float *x)
{
    (void)xq;
    const float *wf = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += wf[i] * x[i];
    return s;
}

static float dot1_f16(int64_t n, const void *w, const struct qact *xq, const float *x)
{
    (void)xq;
    const uint8_t *p = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += fp16_to_fp32(rd16(p + 2 * i)) * x[i];
    return s;
}

static float dot1_bf16(int64_t n, const void *w, const struct qact *xq, const float *x)
{
    (void)xq;
    const uint8_t *p = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += bf16_to_fp32(rd16(p + 2 * i)) * x[i];
    return s;
}

static float dot1_q8_0(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, b += 34) {
        const int8_t *qx = xq->q + i * 32;
        int sum = 0;
        /* The int16 product is deliberate: GCC 12.2 at -O2 -march=native (AVX512-VNNI)
         * vectorizes `sum += (int8_t)a * (int8_t)b` into vpdpbusd, which treats one
         * operand as unsigned — wrong results (tests/c/test_quant.c caught it). */
        for (int j = 0; j < 32; j++) {
            int16_t p = (int16_t)((int8_t)b[2 + j] * qx[j]);
            sum += p;
        }
        s += fp16_to_fp32(rd16(b)) * xq->d[i] * (float)sum;
    }
    return s;
}

static float dot1_q4_0(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, b += 18) {
        const int8_t *qx = xq->q + i * 32;
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((b[2 + j] & 0xF) - 8) * qx[j] + ((b[2 + j] >> 4) - 8) * qx[j + 16];
        s += fp16_to_fp32(rd16(b)) * xq->d[i] * (float)sum;
    }
    return s;
}

static float dot1_q4_1(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, b += 20) {
        const int8_t *lo = xq->q + q81_lo(i), *hi = xq->q + q81_hi(i);
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += (b[4 + j] & 0xF) * lo[j] + (b[4 + j] >> 4) * hi[j];
        s += fp16_to_fp32(rd16(b)) * xq->ds[2 * i] * (float)sum + fp16_to_fp32(rd16(b + 2)) * xq->ds[2 * i + 1];
    }
    return s;
}

static float dot1_q5_0(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, b += 22) {
        const int8_t *qx = xq->q + i * 32;
        uint32_t qh = rd32(b + 2);
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            int x0 = (int)((b[6 + j] & 0xF) | ((qh >> j & 1u) << 4)) - 16;
            int x1 = (int)((b[6 + j] >> 4) | ((qh >> (j + 16) & 1u) << 4)) - 16;
            sum += x0 * qx[j] + x1 * qx[j + 16];
        }
        s += fp16_to_fp32(rd16(b)) * xq->d[i] * (float)sum;
    }
    return s;
}

static float dot1_q5_1(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, b += 24) {
        const int8_t *lo = xq->q + q81_lo(i), *hi = xq->q + q81_hi(i);
        uint32_t qh = rd32(b + 4);
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            int x0 = (int)((b[8 + j] & 0xF) | ((qh >> j & 1u) << 4));
            int x1 = (int)((b[8 + j] >> 4) | ((qh >> (j + 16) & 1u) << 4));
            sum += x0 * lo[j] + x1 * hi[j];
        }
        s += fp16_to_fp32(rd16(b)) * xq->ds[2 * i] * (float)sum + fp16_to_fp32(rd16(b + 2)) * xq->ds[2 * i + 1];
    }
    return s;
}

static float dot1_q4_k(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; i++, b += 144) {
        const int8_t *qx = xq->q + i * 256;
        const int16_t *bs = xq->bsums + i * 16;
        uint8_t sc[8], m[8];
        quant_q4k_scales(b + 4, sc, m);
        const uint8_t *qs = b + 16;
        int sumq = 0, summ = 0;
        for (int k = 0; k < 4; k++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (qs[32 * k + l] & 0xF) * qx[64 * k + l];
                s1 += (qs[32 * k + l] >> 4) * qx[64 * k + 32 + l];
            }
            sumq += sc[2 * k] * s0 + sc[2 * k + 1] * s1;
        }
        for (int k = 0; k < 8; k++) summ += m[k] * (bs[2 * k] + bs[2 * k + 1]);
        float dx = xq->d[i];
        s += fp16_to_fp32(rd16(b)) * dx * (float)sumq - fp16_to_fp32(rd16(b + 2)) * dx * (float)summ;
    }
    return s;
}

static float dot1_q6_k(int64_t n, const void *w, const struct qact *xq, const float *xf)
{
    (void)xf;
    const uint8_t *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; i++, b += 210) {
        const int8_t *qx = xq->q + i * 256;
        const int16_t *bs = xq->bsums + i * 16;
        const int8_t *sc = (const int8_t *)(b + 192);
        int sum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const int8_t *y = qx + 128 * h;
            int g[8] = { 0 };
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                g[is + 0] += ((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) * y[l];
                g[is + 2] += ((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) * y[l + 32];
                g[is + 4] += ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) * y[l + 64];
                g[is + 6] += ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) * y[l + 96];
            }
            for (int k = 0; k < 8; k++) sum += sc[8 * h + k] * (g[k] - 32 * bs[8 * h + k]);
        }
        s += fp16_to_fp32(rd16(b + 208)) * xq->d[i] * (float)sum;
    }
    return s;
}

/* Row-run wrappers (QK_ROWS in quant_kernels.h) for the one-row kernels above. */
QK_ROWS_ALL()

static const struct quant_impl impl_scalar = {
    .name = "scalar",
    .dot = {
        [DT_F32] = dot_f32, [DT_F16] = dot_f16, [DT_BF16] = dot_bf16,
        [DT_Q8_0] = dot_q8_0, [DT_Q4_0] = dot_q4_0, [DT_Q4_1] = dot_q4_1,
        [DT_Q5_0] = dot_q5_0, [DT_Q5_1] = dot_q5_1, [DT_Q4_K] = dot_q4_k,
        [DT_Q6_K] = dot_q6_k,
    },
    .quantize = quantize_scalar,
};

const struct quant_impl *quant_impl_scalar(void) { return &impl_scalar; }

const struct quant_impl *quant_impl_best(void)
{
    const struct quant_impl *s = quant_impl_simd();
    return s ? s : &impl_scalar;
}
