/* test_ops_fused.c — the fused CPU twins in backend/cpu/ops_fused.c (the references of the
 * row-wise CUDA kernels) against the ops they compose (bit for bit) and against naive
 * double-precision references: RMSNorm + residual in F32/F16/BF16, per-head RMSNorm on a
 * strided QKV buffer, RoPE + KV write (both layouts, bias, mscale, padding slots, F32 and
 * FP8 pools), strided SiLU·mul; invalid arguments. */
#include "test.h"

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_fused.h"
#include "util/err.h"
#include "util/fp8.h"
#include "util/half.h"

#include <stdint.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1 << 23))) - 1.0f;
}
static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static void test_rmsnorm_residual(void)
{
    enum { R = 3, N = 37 };
    const float eps = 1e-5f;
    float x[R * N], d[R * N], w[N], res[R * N], out[R * N], ref[R * N], sum[R * N];
    uint16_t o16[R * N];
    fill(x, R * N, 2.0f);
    fill(d, R * N, 1.0f);
    fill(w, N, 1.5f);
    for (int i = 0; i < R * N; i++) sum[i] = x[i] + d[i];
    cpu_rmsnorm(ref, sum, w, R, N, eps);

    /* F32 with delta: residual updated exactly, out is cpu_rmsnorm's bit for bit, and close
     * to a double-precision reference */
    memcpy(res, x, sizeof res);
    CHECK(cpu_rmsnorm_residual(out, DT_F32, res, d, w, R, N, eps) == 0, "f32");
    CHECK(!memcmp(res, sum, sizeof res), "residual is not x + delta");
    CHECK(!memcmp(out, ref, sizeof out), "out differs from cpu_rmsnorm");
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < N; i++) ss += (double)sum[r * N + i] * sum[r * N + i];
        double inv = 1.0 / sqrt(ss / N + eps);
        for (int i = 0; i < N; i++) CHECK_CLOSE(out[r * N + i], sum[r * N + i] * inv * w[i], 1e-6, 1e-5);
    }
    /* F16 / BF16: the F32 result rounded once */
    memcpy(res, x, sizeof res);
    CHECK(cpu_rmsnorm_residual(o16, DT_F16, res, d, w, R, N, eps) == 0, "f16");
    for (int i = 0; i < R * N; i++) CHECK(o16[i] == fp32_to_fp16(ref[i]), "f16 out[%d]", i);
    memcpy(res, x, sizeof res);
    CHECK(cpu_rmsnorm_residual(o16, DT_BF16, res, d, w, R, N, eps) == 0, "bf16");
    for (int i = 0; i < R * N; i++) CHECK(o16[i] == fp32_to_bf16(ref[i]), "bf16 out[%d]", i);
    /* no delta: the plain RMSNorm, residual untouched */
    memcpy(res, x, sizeof res);
    cpu_rmsnorm(ref, x, w, R, N, eps);
    CHECK(cpu_rmsnorm_residual(out, DT_F32, res, NULL, w, R, N, eps) == 0, "no delta");
    CHECK(!memcmp(res, x, sizeof res), "residual changed without delta");
    CHECK(!memcmp(out, ref, sizeof out), "plain out differs from cpu_rmsnorm");
    CHECK(cpu_rmsnorm_residual(out, DT_Q8_0, res, d, w, R, N, eps) == ERR_INVALID, "Q8_0 accepted");
}

static void test_head_rmsnorm(void)
{
    enum { T = 2, NH = 3, NKV = 1, HD = 8, STRIDE = (NH + 2 * NKV) * HD + 2 };
    const float eps = 1e-6f;
    float x[T * STRIDE], orig[T * STRIDE], qn[HD], kn[HD];
    fill(x, T * STRIDE, 3.0f);
    fill(qn, HD, 1.0f);
    fill(kn, HD, 1.0f);
    memcpy(orig, x, sizeof x);
    CHECK(cpu_head_rmsnorm(x, STRIDE, qn, kn, T, NH, NKV, HD, eps) == 0, "head_rmsnorm");
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < NH + NKV; h++) {
            const float *o = orig + t * STRIDE + h * HD, *w = h < NH ? qn : kn;
            double ss = 0;
            for (int i = 0; i < HD; i++) ss += (double)o[i] * o[i];
            double inv = 1.0 / sqrt(ss / HD + eps);
            for (int i = 0; i < HD; i++) CHECK_CLOSE(x[t * STRIDE + h * HD + i], o[i] * inv * w[i], 1e-6, 1e-5);
        }
        for (int c = (NH + NKV) * HD; c < STRIDE; c++)
            CHECK(x[t * STRIDE + c] == orig[t * STRIDE + c], "v / padding changed at t=%d c=%d", t, c);
    }
}

/* Naive rope of one head (double angle), with bias and mscale. */
static void ref_rope_head(double *out, const float *x, const float *bias, int hd, int pos, const float *inv,
                          enum rope_layout layout, float mscale)
{
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        int ia = layout == ROPE_NEOX ? i : 2 * i, ib = layout == ROPE_NEOX ? i + half : 2 * i + 1;
        double a = (double)x[ia] + (bias ? bias[ia] : 0.0), b = (double)x[ib] + (bias ? bias[ib] : 0.0);
        double ang = (double)pos * inv[i], c = cos(ang) * mscale, s = sin(ang) * mscale;
        out[ia] = a * c - b * s;
        out[ib] = a * s + b * c;
    }
}

static void rope_case(enum rope_layout layout, enum kv_dtype kvt, int use_bias, float mscale)
{
    enum { T = 4, NH = 4, NKV = 2, HD = 16, BS = 4, NB = 3, W = (NH + 2 * NKV) * HD, STRIDE = W + 4 };
    float qkv[T * STRIDE], bias[W], inv[HD / 2], q[T * NH * HD];
    float pool32[NB * 2 * NKV * BS * HD];
    uint8_t pool8[NB * 2 * NKV * BS * HD];
    const int32_t pos[T] = { 0, 7, 131071, 4000 };
    const int64_t slots[T] = { 5, -1, 11, 0 }; /* token 1 is padding */
    struct rope_params p = { .theta = 10000.0, .scaling = ROPE_SCALING_NONE, .factor = 1.0 };
    rope_inv_freq(inv, HD, &p, NULL);
    fill(qkv, T * STRIDE, 1.0f);
    fill(bias, W, 0.5f);
    memset(pool32, 0xff, sizeof pool32);
    memset(pool8, 0xff, sizeof pool8);
    struct kv_layer kv = { .data = kvt == KV_F32 ? (void *)pool32 : (void *)pool8, .dtype = kvt, .num_blocks = NB,
                           .block_size = BS, .n_kv_heads = NKV, .head_dim = HD,
                           .k_scale = kvt == KV_FP8_E4M3 ? 0.01f : 1.0f, .v_scale = kvt == KV_FP8_E4M3 ? 0.005f : 1.0f };
    CHECK(cpu_rope_kv_write(q, &kv, qkv, STRIDE, use_bias ? bias : NULL, pos, slots, inv, mscale, layout, T, NH) == 0,
          "rope_kv_write");
    int written[NB * BS];
    memset(written, 0, sizeof written);
    for (int t = 0; t < T; t++) {
        const float *row = qkv + t * STRIDE;
        double r[HD];
        for (int h = 0; h < NH; h++) { /* q: every token, padding too */
            ref_rope_head(r, row + h * HD, use_bias ? bias + h * HD : NULL, HD, pos[t], inv, layout, mscale);
            for (int i = 0; i < HD; i++) CHECK_CLOSE(q[(t * NH + h) * HD + i], r[i], 2e-6, 1e-5);
        }
        if (slots[t] < 0) continue;
        int64_t blk = slots[t] / BS, off = slots[t] % BS;
        written[slots[t]] = 1;
        for (int h = 0; h < NKV; h++) {
            int64_t ko = (((blk * 2 + 0) * NKV + h) * BS + off) * HD, vo = (((blk * 2 + 1) * NKV + h) * BS + off) * HD;
            const float *kb = use_bias ? bias + (NH + h) * HD : NULL, *vb = use_bias ? bias + (NH + NKV + h) * HD : NULL;
            ref_rope_head(r, row + (NH + h) * HD, kb, HD, pos[t], inv, layout, mscale);
            for (int i = 0; i < HD; i++) {
                float v = row[(NH + NKV + h) * HD + i] + (vb ? vb[i] : 0.0f);
                if (kvt == KV_F32) {
                    CHECK_CLOSE(pool32[ko + i], r[i], 2e-6, 1e-5);
                    CHECK(pool32[vo + i] == v, "v[%d] not stored as is", i);
                } else { /* e4m3: 3 mantissa bits, so within one step = 1/8 relative (+ a subnormal step) */
                    CHECK_CLOSE(fp8_e4m3_to_fp32(pool8[ko + i]) * kv.k_scale, r[i], 2.0 / 512 * kv.k_scale, 0.125);
                    CHECK(pool8[vo + i] == fp32_to_fp8_e4m3(v / kv.v_scale), "v[%d] code", i);
                }
            }
        }
    }
    /* slots nobody wrote keep their bytes */
    for (int s = 0; s < NB * BS; s++) {
        if (written[s]) continue;
        int64_t blk = s / BS, off = s % BS;
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < NKV; h++) {
                int64_t o = (((blk * 2 + which) * NKV + h) * BS + off) * HD;
                for (int i = 0; i < HD; i++) {
                    uint32_t bits;
                    memcpy(&bits, &pool32[o + i], 4);
                    CHECK(kvt == KV_F32 ? bits == 0xffffffffu : pool8[o + i] == 0xff, "slot %d written", s);
                }
            }
    }
}

static void test_rope_kv_write(void)
{
    rope_case(ROPE_NEOX, KV_F32, 1, 1.0f);
    rope_case(ROPE_NORMAL, KV_F32, 0, 1.0f);
    rope_case(ROPE_NEOX, KV_F32, 0, 1.25f);
    rope_case(ROPE_NORMAL, KV_FP8_E4M3, 1, 1.0f);
    struct kv_layer kv = { .dtype = KV_F16, .num_blocks = 1, .block_size = 16, .n_kv_heads = 1, .head_dim = 7 };
    CHECK(cpu_rope_kv_write(NULL, &kv, NULL, 0, NULL, NULL, NULL, NULL, 1.0f, ROPE_NEOX, 1, 1) == ERR_INVALID,
          "odd head_dim accepted");
    kv.head_dim = 128;
    kv.n_kv_heads = 65;
    CHECK(cpu_rope_kv_write(NULL, &kv, NULL, 0, NULL, NULL, NULL, NULL, 1.0f, ROPE_NEOX, 1, 1) == ERR_INVALID,
          "K/V row over ROPE_KV_ROW_MAX accepted");
}

static void test_silu_mul_rows(void)
{
    enum { T = 3, F = 21, STRIDE = 2 * F };
    float gu[T * STRIDE], out[T * F], ref[T * F];
    uint16_t o16[T * F];
    fill(gu, T * STRIDE, 6.0f);
    for (int t = 0; t < T; t++) cpu_silu_mul(ref + t * F, gu + t * STRIDE, gu + t * STRIDE + F, F);
    CHECK(cpu_silu_mul_rows(out, DT_F32, gu, gu + F, STRIDE, T, F) == 0, "f32");
    CHECK(!memcmp(out, ref, sizeof out), "f32 differs from cpu_silu_mul");
    for (int t = 0; t < T; t++)
        for (int i = 0; i < F; i++) {
            double g = gu[t * STRIDE + i], u = gu[t * STRIDE + F + i];
            CHECK_CLOSE(out[t * F + i], g / (1.0 + exp(-g)) * u, 1e-6, 1e-5);
        }
    CHECK(cpu_silu_mul_rows(o16, DT_F16, gu, gu + F, STRIDE, T, F) == 0, "f16");
    for (int i = 0; i < T * F; i++) CHECK(o16[i] == fp32_to_fp16(ref[i]), "f16 out[%d]", i);
    CHECK(cpu_silu_mul_rows(o16, DT_BF16, gu, gu + F, STRIDE, T, F) == 0, "bf16");
    for (int i = 0; i < T * F; i++) CHECK(o16[i] == fp32_to_bf16(ref[i]), "bf16 out[%d]", i);
    CHECK(cpu_silu_mul_rows(out, DT_Q8_0, gu, gu + F, STRIDE, T, F) == ERR_INVALID, "Q8_0 accepted");
}

int main(void)
{
    RUN(test_rmsnorm_residual);
    RUN(test_head_rmsnorm);
    RUN(test_rope_kv_write);
    RUN(test_silu_mul_rows);
    return test_summary();
}
