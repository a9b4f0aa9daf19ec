/* test_ops.c — every CPU op in backend/cpu/ops.c against a naive double-precision
 * reference: rmsnorm, softmax, silu·mul, SIMD dot/axpy, RoPE (both layouts and the
 * Q/K row permutation that makes them equivalent), llama3/linear frequency scaling,
 * KV writes, paged attention vs dense attention over random block tables, the blocked
 * attention vs the previous per-row kernel (attention_ref.h), and its batch invariance:
 * a row's output bitwise the same alone, whole, chunked and next to other sequences. */
#include "test.h"

#include "attention_ref.h"

#include "backend/cpu/ops.h"
#include "util/fp8.h"
#include "util/half.h"
#include "util/threadpool.h"

#include <stdint.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1 << 23))) - 1.0f;
}
static int irand(int n) { return (int)((frand() + 1.0f) * 0.5f * n) % n; }
static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static void test_rmsnorm(void)
{
    int rows = 3, n = 37;
    float x[3 * 37], w[37], out[3 * 37];
    fill(x, sizeof x / 4, 2.0f);
    fill(w, n, 1.0f);
    cpu_rmsnorm(out, x, w, rows, n, 1e-5f);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        double inv = 1.0 / sqrt(ss / n + 1e-5);
        for (int i = 0; i < n; i++) CHECK_CLOSE(out[r * n + i], x[r * n + i] * inv * w[i], 1e-6, 1e-5);
    }
    cpu_rmsnorm(x, x, w, rows, n, 1e-5f); /* in place */
    for (int i = 0; i < rows * n; i++) CHECK(x[i] == out[i], "in-place differs at %d", i);
}

static void test_add(void)
{
    float y[53], x[53], want[53];
    fill(y, 53, 3.0f);
    fill(x, 53, 1.0f);
    for (int i = 0; i < 53; i++) want[i] = y[i] + x[i];
    cpu_add(y, x, 53); /* 3 vectors and a tail of 5 */
    for (int i = 0; i < 53; i++) CHECK(y[i] == want[i], "add differs at %d", i);
}

static void test_softmax(void)
{
    for (int n = 1; n <= 33; n += 8) {
        float x[40];
        double ref[40], mx = -1e30, sum = 0;
        fill(x, n, 30.0f);
        x[0] = 80.0f; /* exp(80) overflows f32 without max subtraction */
        for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int i = 0; i < n; i++) sum += (ref[i] = exp(x[i] - mx));
        cpu_softmax(x, n);
        for (int i = 0; i < n; i++) CHECK_CLOSE(x[i], ref[i] / sum, 1e-7, 1e-5);
    }
}

static void test_silu_mul(void)
{
    float g[29], u[29], o[29];
    fill(g, 29, 8.0f);
    fill(u, 29, 2.0f);
    cpu_silu_mul(o, g, u, 29);
    for (int i = 0; i < 29; i++) CHECK_CLOSE(o[i], g[i] / (1.0 + exp(-(double)g[i])) * u[i], 1e-6, 1e-5);
    /* the ends of the range (exp over- and underflow), and each element alone gives the
     * bits it gave inside the run (no tail path of its own) */
    const float big[] = { -200.0f, -88.0f, -30.0f, -1e-8f, 0.0f, 1e-8f, 30.0f, 88.0f, 200.0f };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) g[i] = big[i];
    cpu_silu_mul(o, g, u, 29);
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        CHECK_CLOSE(o[i], g[i] / (1.0 + exp(-(double)g[i])) * u[i], 1e-6, 1e-5);
    for (int i = 0; i < 29; i++) {
        float one;
        cpu_silu_mul(&one, &g[i], &u[i], 1);
        CHECK(memcmp(&one, &o[i], sizeof one) == 0, "element %d alone: %g vs %g", i, one, o[i]);
    }
}

static void test_dot_axpy(void)
{
    for (int n = 1; n <= 70; n += 3) {
        float a[70], b[70], y[70], y2[70];
        uint16_t h[70];
        fill(a, n, 1.0f);
        fill(b, n, 1.0f);
        fill(y, n, 1.0f);
        memcpy(y2, y, sizeof y);
        double ref = 0, refh = 0;
        for (int i = 0; i < n; i++) {
            h[i] = fp32_to_fp16(b[i]);
            ref += (double)a[i] * b[i];
            refh += (double)a[i] * fp16_to_fp32(h[i]);
        }
        CHECK_CLOSE(cpu_dot_f32(a, b, n), ref, 1e-5, 1e-5);
        CHECK_CLOSE(cpu_dot_f16(a, h, n), refh, 1e-5, 1e-5);
        cpu_axpy_f32(y, 0.5f, b, n);
        cpu_axpy_f16(y2, 0.5f, h, n);
        for (int i = 0; i < n; i++) {
            CHECK_CLOSE(y[i], y2[i] - 0.5 * fp16_to_fp32(h[i]) + 0.5 * b[i], 1e-6, 1e-5);
        }
    }
}

/* ---- RoPE ----------------------------------------------------------------------------- */

static void test_rope_neox_formula(void)
{
    enum { T = 3, H = 2, D = 10 };
    float x[T * H * D], x0[T * H * D], inv[D / 2];
    int32_t pos[T] = { 0, 7, 1000 };
    struct rope_params rp = { .theta = 10000.0 };
    rope_inv_freq(inv, D, &rp, NULL);
    for (int i = 0; i < D / 2; i++) CHECK_CLOSE(inv[i], pow(10000.0, -2.0 * i / D), 0, 1e-6);
    fill(x, T * H * D, 1.0f);
    memcpy(x0, x, sizeof x);
    cpu_rope(x, pos, T, H, D, inv, ROPE_NEOX);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                const float *v = x0 + (t * H + h) * D;
                double a = pos[t] * (double)inv[i], c = cos(a), s = sin(a);
                CHECK_CLOSE(x[(t * H + h) * D + i], v[i] * c - v[i + D / 2] * s, 1e-5, 1e-5);
                CHECK_CLOSE(x[(t * H + h) * D + i + D / 2], v[i] * s + v[i + D / 2] * c, 1e-5, 1e-5);
            }
    /* the normal layout rotates adjacent pairs */
    memcpy(x, x0, sizeof x);
    cpu_rope(x, pos, T, H, D, inv, ROPE_NORMAL);
    for (int i = 0; i < D / 2; i++) {
        double a = pos[1] * (double)inv[i], c = cos(a), s = sin(a);
        const float *v = x0 + (1 * H + 1) * D;
        CHECK_CLOSE(x[(1 * H + 1) * D + 2 * i], v[2 * i] * c - v[2 * i + 1] * s, 1e-5, 1e-5);
        CHECK_CLOSE(x[(1 * H + 1) * D + 2 * i + 1], v[2 * i] * s + v[2 * i + 1] * c, 1e-5, 1e-5);
    }
}

/* The GGUF converter's permutation of Q/K rows within each head:
 * new row 2j + h  <-  old row h * (D/2) + j   (h in {0, 1}). */
static void permute_rows(float *dst, const float *src, int n_heads, int D, int n_in)
{
    for (int hd = 0; hd < n_heads; hd++)
        for (int j = 0; j < D / 2; j++)
            for (int h = 0; h < 2; h++)
                memcpy(dst + ((size_t)hd * D + 2 * j + h) * n_in, src + ((size_t)hd * D + h * D / 2 + j) * n_in,
                       sizeof(float) * n_in);
}

static void matvec(float *y, const float *W, const float *x, int n_out, int n_in)
{
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++) s += (double)W[(size_t)o * n_in + i] * x[i];
        y[o] = (float)s;
    }
}

static void test_rope_permutation_equivalence(void)
{
    enum { H = 3, D = 16, N = 24 };
    static float wq[H * D * N], wk[H * D * N], wqp[H * D * N], wkp[H * D * N];
    float x1[N], x2[N], q[H * D], k[H * D], qp[H * D], kp[H * D], inv[D / 2];
    fill(wq, sizeof wq / 4, 0.5f);
    fill(wk, sizeof wk / 4, 0.5f);
    fill(x1, N, 1.0f);
    fill(x2, N, 1.0f);
    permute_rows(wqp, wq, H, D, N);
    permute_rows(wkp, wk, H, D, N);
    struct rope_params rp = { .theta = 500000.0 };
    rope_inv_freq(inv, D, &rp, NULL);
    int32_t pq = 37, pk = 5;
    matvec(q, wq, x1, H * D, N);
    matvec(k, wk, x2, H * D, N);
    matvec(qp, wqp, x1, H * D, N);
    matvec(kp, wkp, x2, H * D, N);
    cpu_rope(q, &pq, 1, H, D, inv, ROPE_NEOX);
    cpu_rope(k, &pk, 1, H, D, inv, ROPE_NEOX);
    cpu_rope(qp, &pq, 1, H, D, inv, ROPE_NORMAL);
    cpu_rope(kp, &pk, 1, H, D, inv, ROPE_NORMAL);
    for (int h = 0; h < H; h++) {
        double a = 0, b = 0;
        for (int i = 0; i < D; i++) {
            a += (double)q[h * D + i] * k[h * D + i];
            b += (double)qp[h * D + i] * kp[h * D + i];
        }
        CHECK_CLOSE(b, a, 1e-6, 1e-6);
        /* and element-wise: the rotated permuted vector is the permuted rotated vector */
        for (int j = 0; j < D / 2; j++) {
            CHECK(qp[h * D + 2 * j] == q[h * D + j], "head %d pair %d", h, j);
            CHECK(qp[h * D + 2 * j + 1] == q[h * D + j + D / 2], "head %d pair %d", h, j);
        }
    }
}

static void test_rope_llama3_scaling(void)
{
    enum { D = 128 };
    float inv[D / 2];
    struct rope_params rp = { .theta = 500000.0, .scaling = ROPE_SCALING_LLAMA3, .factor = 8.0,
                              .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                              .original_max_position_embeddings = 8192 };
    rope_inv_freq(inv, D, &rp, NULL);
    int n_low = 0, n_mid = 0, n_high = 0;
    for (int i = 0; i < D / 2; i++) {
        /* transformers' _compute_llama3_parameters, written out directly */
        double f = 1.0 / pow(500000.0, (2.0 * i) / D), wl = 6.283185307179586 / f;
        double low_wl = 8192 / 1.0, high_wl = 8192 / 4.0, ref;
        if (wl < high_wl) ref = f, n_high++;
        else if (wl > low_wl) ref = f / 8.0, n_low++;
        else {
            double sm = (8192 / wl - 1.0) / (4.0 - 1.0);
            ref = (1 - sm) * f / 8.0 + sm * f;
            n_mid++;
        }
        CHECK_CLOSE(inv[i], ref, 0, 1e-6);
    }
    CHECK(n_low > 0 && n_mid > 0 && n_high > 0, "bands %d %d %d", n_low, n_mid, n_high);
    /* linear scaling and GGUF freq factors divide */
    float lin[D / 2], ff[D / 2], fac[D / 2];
    struct rope_params rl = { .theta = 500000.0, .scaling = ROPE_SCALING_LINEAR, .factor = 4.0 };
    struct rope_params rn = { .theta = 500000.0 };
    rope_inv_freq(lin, D, &rl, NULL);
    for (int i = 0; i < D / 2; i++) fac[i] = 1.0f + (float)i;
    rope_inv_freq(ff, D, &rn, fac);
    for (int i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(500000.0, (2.0 * i) / D);
        CHECK_CLOSE(lin[i], f / 4.0, 0, 1e-6);
        CHECK_CLOSE(ff[i], f / (1.0 + i), 0, 1e-6);
    }
}

/* ---- KV write + paged attention ------------------------------------------------------- */

/* Dense causal attention for one sequence from f32 K/V [ctx][n_kv][D] (double). */
static void dense_attention(float *out, const float *q, const float *K, const float *V, int n_new,
                            int ctx, int H, int HKV, int D, float scale)
{
    double *s = malloc(sizeof(double) * ctx);
    for (int i = 0; i < n_new; i++) {
        int vis = ctx - n_new + i + 1;
        for (int h = 0; h < H; h++) {
            int kh = h / (H / HKV);
            const float *qv = q + ((size_t)i * H + h) * D;
            double mx = -1e300, sum = 0;
            for (int p = 0; p < vis; p++) {
                double d = 0;
                for (int e = 0; e < D; e++) d += (double)qv[e] * K[((size_t)p * HKV + kh) * D + e];
                s[p] = d * scale;
                mx = s[p] > mx ? s[p] : mx;
            }
            for (int p = 0; p < vis; p++) sum += (s[p] = exp(s[p] - mx));
            for (int e = 0; e < D; e++) {
                double o = 0;
                for (int p = 0; p < vis; p++) o += s[p] * V[((size_t)p * HKV + kh) * D + e];
                out[((size_t)i * H + h) * D + e] = (float)(o / sum);
            }
        }
    }
    free(s);
}

/* Several sequences with odd lengths, random non-contiguous block tables, some decoding
 * one token and some prefilling a chunk on top of earlier context; the K/V of earlier
 * context are written in a previous "step", the new ones in this step. */
static void run_paged_case(enum kv_dtype dt, int H, int HKV, int D, int BS, struct threadpool *tp)
{
    enum { S = 4 };
    int ctx[S] = { 1, 37, 16, 53 }, n_new[S] = { 1, 1, 16, 20 };
    int max_blocks = (64 + BS - 1) / BS, num_blocks = S * max_blocks + 3;
    int total_new = 0;
    for (int s = 0; s < S; s++) total_new += n_new[s];
    size_t pool_elems = (size_t)num_blocks * 2 * HKV * BS * D;
    void *pool = calloc(pool_elems, kv_dtype_size(dt));
    struct kv_layer kv = { .data = pool, .dtype = dt, .num_blocks = num_blocks, .block_size = BS,
                           .n_kv_heads = HKV, .head_dim = D, .k_scale = 1, .v_scale = 1 };
    /* a random permutation of blocks shared out among sequences */
    int32_t *perm = malloc(sizeof(int32_t) * num_blocks), *bt = malloc(sizeof(int32_t) * S * max_blocks);
    for (int i = 0; i < num_blocks; i++) perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < S * max_blocks; i++) bt[i] = perm[i];

    float *q = malloc(sizeof(float) * total_new * H * D), *out = malloc(sizeof(float) * total_new * H * D);
    float *ref = malloc(sizeof(float) * total_new * H * D);
    int32_t qs[S + 1], lens[S];
    int row = 0;
    fill(q, (size_t)total_new * H * D, 1.0f);
    for (int s = 0; s < S; s++) {
        qs[s] = row;
        lens[s] = ctx[s];
        float *K = malloc(sizeof(float) * ctx[s] * HKV * D), *V = malloc(sizeof(float) * ctx[s] * HKV * D);
        fill(K, (size_t)ctx[s] * HKV * D, 2.0f);
        fill(V, (size_t)ctx[s] * HKV * D, 1.0f);
        if (dt == KV_F16) /* the reference sees what the pool stores */
            for (size_t i = 0; i < (size_t)ctx[s] * HKV * D; i++) {
                K[i] = fp16_to_fp32(fp32_to_fp16(K[i]));
                V[i] = fp16_to_fp32(fp32_to_fp16(V[i]));
            }
        if (dt == KV_BF16)
            for (size_t i = 0; i < (size_t)ctx[s] * HKV * D; i++) {
                K[i] = bf16_to_fp32(fp32_to_bf16(K[i]));
                V[i] = bf16_to_fp32(fp32_to_bf16(V[i]));
            }
        int64_t *slots = malloc(sizeof(int64_t) * ctx[s]);
        for (int p = 0; p < ctx[s]; p++) slots[p] = (int64_t)bt[s * max_blocks + p / BS] * BS + p % BS;
        /* earlier context in one call, this step's tokens (plus a padding row) in another */
        int old = ctx[s] - n_new[s];
        cpu_kv_write(&kv, K, V, slots, old);
        float junk[2 * 64 * 4];
        fill(junk, sizeof junk / 4, 9.0f);
        int64_t pad = -1;
        cpu_kv_write(&kv, junk, junk, &pad, 1);
        cpu_kv_write(&kv, K + (size_t)old * HKV * D, V + (size_t)old * HKV * D, slots + old, n_new[s]);
        dense_attention(ref + (size_t)row * H * D, q + (size_t)row * H * D, K, V, n_new[s], ctx[s], H, HKV,
                        D, 1.0f / sqrtf((float)D));
        row += n_new[s];
        free(K);
        free(V);
        free(slots);
    }
    qs[S] = row;
    int nth = tp ? tp_size(tp) : 1;
    float *scratch = malloc(sizeof(float) * cpu_paged_attention_scratch_floats(nth, 64));
    struct paged_attention_args a = { .out = out, .q = q, .kv = &kv, .query_start = qs, .seq_lens = lens,
                                      .block_tables = bt, .max_blocks_per_seq = max_blocks, .num_seqs = S,
                                      .num_tokens = row, .n_heads = H, .scale = 1.0f / sqrtf((float)D),
                                      .scratch = scratch, .max_ctx = 64 };
    cpu_paged_attention(tp, &a);
    for (size_t i = 0; i < (size_t)row * H * D; i++)
        CHECK_CLOSE(out[i], ref[i], 2e-5, 2e-4);
    free(scratch);
    free(q);
    free(out);
    free(ref);
    free(perm);
    free(bt);
    free(pool);
}

static void test_paged_attention_f32(void)
{
    struct threadpool *tp = tp_create(3);
    run_paged_case(KV_F32, 4, 4, 8, 16, NULL);  /* MHA */
    run_paged_case(KV_F32, 6, 2, 20, 16, tp);   /* GQA, odd head_dim */
    run_paged_case(KV_F32, 9, 3, 64, 7, tp);    /* SmolLM2 shape, odd block size */
    run_paged_case(KV_F32, 8, 1, 128, 32, tp);  /* MQA */
    tp_free(tp);
}

static void test_paged_attention_f16(void)
{
    struct threadpool *tp = tp_create(2);
    run_paged_case(KV_F16, 6, 2, 20, 16, tp);
    run_paged_case(KV_F16, 9, 3, 64, 5, NULL);
    tp_free(tp);
}

static void test_paged_attention_bf16(void)
{
    struct threadpool *tp = tp_create(2);
    run_paged_case(KV_BF16, 6, 2, 20, 16, tp);
    run_paged_case(KV_BF16, 28, 4, 128, 32, NULL); /* Qwen2.5-7B head shape, GQA 7 */
    tp_free(tp);
}

/* BF16 pool: each stored element is exactly the round-to-nearest-even bf16 of its input */
static void test_kv_write_bf16(void)
{
    enum { NB = 2, BS = 4, HKV = 2, D = 8 };
    uint16_t pool[NB * 2 * HKV * BS * D] = { 0 };
    float k[HKV * D], v[HKV * D];
    fill(k, HKV * D, 3.0f);
    fill(v, HKV * D, 3.0f);
    struct kv_layer kv = { .data = pool, .dtype = KV_BF16, .num_blocks = NB, .block_size = BS,
                           .n_kv_heads = HKV, .head_dim = D, .k_scale = 1, .v_scale = 1 };
    int64_t slot = 1 * BS + 2;
    cpu_kv_write(&kv, k, v, &slot, 1);
    for (int h = 0; h < HKV; h++)
        for (int e = 0; e < D; e++) {
            size_t ko = ((((size_t)1 * 2 + 0) * HKV + h) * BS + 2) * D + e;
            size_t vo = ((((size_t)1 * 2 + 1) * HKV + h) * BS + 2) * D + e;
            CHECK(pool[ko] == fp32_to_bf16(k[h * D + e]), "k h%d e%d", h, e);
            CHECK(pool[vo] == fp32_to_bf16(v[h * D + e]), "v h%d e%d", h, e);
        }
    enum kv_dtype t;
    CHECK(kv_dtype_parse("bf16", &t) == 0 && t == KV_BF16, "parse bf16");
    CHECK(kv_dtype_size(KV_BF16) == 2 && !strcmp(kv_dtype_name(KV_BF16), "bf16"), "bf16 traits");
    float a[37], b[37];
    uint16_t hb[37];
    fill(a, 37, 1.0f);
    fill(b, 37, 1.0f);
    double dot = 0;
    for (int i = 0; i < 37; i++) {
        hb[i] = fp32_to_bf16(b[i]);
        dot += (double)a[i] * bf16_to_fp32(hb[i]);
    }
    CHECK_CLOSE(cpu_dot_bf16(a, hb, 37), dot, 1e-5, 1e-5);
    float y[37] = { 0 };
    cpu_axpy_bf16(y, 0.5f, hb, 37);
    for (int i = 0; i < 37; i++) CHECK(y[i] == 0.5f * bf16_to_fp32(hb[i]), "axpy %d", i);
}

static void test_kv_write_layout(void)
{
    /* slot 2*4+3 = block 2 offset 3: check the documented layout offsets directly */
    enum { NB = 3, BS = 4, HKV = 2, D = 3 };
    float pool[NB * 2 * HKV * BS * D] = { 0 };
    float k[HKV * D] = { 1, 2, 3, 4, 5, 6 }, v[HKV * D] = { -1, -2, -3, -4, -5, -6 };
    struct kv_layer kv = { .data = pool, .dtype = KV_F32, .num_blocks = NB, .block_size = BS,
                           .n_kv_heads = HKV, .head_dim = D, .k_scale = 1, .v_scale = 1 };
    int64_t slot = 2 * BS + 3;
    cpu_kv_write(&kv, k, v, &slot, 1);
    for (int h = 0; h < HKV; h++)
        for (int e = 0; e < D; e++) {
            size_t ko = ((((size_t)2 * 2 + 0) * HKV + h) * BS + 3) * D + e;
            size_t vo = ((((size_t)2 * 2 + 1) * HKV + h) * BS + 3) * D + e;
            CHECK(pool[ko] == k[h * D + e], "k h%d e%d", h, e);
            CHECK(pool[vo] == v[h * D + e], "v h%d e%d", h, e);
        }
    int nz = 0;
    for (size_t i = 0; i < sizeof pool / 4; i++) nz += pool[i] != 0;
    CHECK(nz == 2 * HKV * D, "wrote %d elements", nz);
    enum kv_dtype t;
    CHECK(kv_dtype_parse("f16", &t) == 0 && t == KV_F16, "parse f16");
    CHECK(kv_dtype_parse("bf8", &t) != 0, "parse bf8 must fail");
}

/* The f16 and bf16 KV stores (vectorized) write exactly util/half.h's conversions: round to
 * nearest even at ties, subnormals, overflow to inf, signed zeros, infinities, and NaNs
 * (payloads dropped to the canonical quiet NaN). head_dim 21: vector body and scalar tail. */
static void test_kv_write_16bit_bitwise(void)
{
    enum { NB = 2, BS = 4, HKV = 2, D = 21, N = 2 * BS };
    const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
        0x7fbfffffu, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0xc77ff000u, 0x38800000u, 0x387fffffu,
        0x33800000u, 0x33000000u, 0x33000001u, 0x00000001u, 0x3f801000u, 0x3f803000u, 0x3f800800u,
        0x3f818000u, 0x3f808000u, 0x3f828000u, 0x7f7fffffu, 0xff7fffffu, 0x3c000000u,
    };
    const size_t n_special = sizeof special / sizeof special[0];
    float k[N * HKV * D], v[N * HKV * D];
    uint64_t st = 0x1234567u;
    for (int i = 0; i < N * HKV * D; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(st >> 32);
        if (i % 3 == 0) bits = special[(size_t)(i / 3) % n_special] ^ (i % 2 ? 0x80000000u : 0);
        else if (i % 3 == 1) bits = (bits & 0x807fffffu) | ((uint32_t)(100 + (st >> 20) % 56) << 23); /* near f16 range */
        memcpy(&k[i], &bits, 4);
        bits ^= 0x00012345u;
        memcpy(&v[i], &bits, 4);
    }
    int64_t slots[N];
    for (int t = 0; t < N; t++) slots[t] = (t * 5) % N; /* a permutation of both blocks */
    const enum kv_dtype dts[] = { KV_F16, KV_BF16 };
    for (int d = 0; d < 2; d++) {
        uint16_t pool[NB * 2 * HKV * BS * D];
        memset(pool, 0xAB, sizeof pool);
        struct kv_layer kv = { .data = pool, .dtype = dts[d], .num_blocks = NB, .block_size = BS,
                               .n_kv_heads = HKV, .head_dim = D, .k_scale = 1, .v_scale = 1 };
        cpu_kv_write(&kv, k, v, slots, N);
        int bad = 0;
        for (int t = 0; t < N; t++)
            for (int h = 0; h < HKV; h++)
                for (int e = 0; e < D; e++) {
                    int64_t b = slots[t] / BS, off = slots[t] % BS;
                    size_t ko = (size_t)((((b * 2 + 0) * HKV + h) * BS + off) * D + e);
                    size_t vo = (size_t)((((b * 2 + 1) * HKV + h) * BS + off) * D + e);
                    float kx = k[(t * HKV + h) * D + e], vx = v[(t * HKV + h) * D + e];
                    uint16_t kw = dts[d] == KV_F16 ? fp32_to_fp16(kx) : fp32_to_bf16(kx);
                    uint16_t vw = dts[d] == KV_F16 ? fp32_to_fp16(vx) : fp32_to_bf16(vx);
                    if (pool[ko] != kw || pool[vo] != vw) {
                        if (bad++ < 5)
                            printf("  %s t%d h%d e%d: k %04x want %04x, v %04x want %04x\n", kv_dtype_name(dts[d]), t,
                                   h, e, pool[ko], kw, pool[vo], vw);
                    }
                }
        CHECK(bad == 0, "%s: %d stored elements differ from util/half.h", kv_dtype_name(dts[d]), bad);
    }
}

/* ---- FP8 KV cache ------------------------------------------------------------------------ */

/* FP8 pool vs dense attention over the values the pool holds: K and V are first
 * quantized and dequantized (x -> e4m3(x / scale) * scale), which cpu_kv_write must
 * reproduce code for code; attention then differs from the f32 reference only by
 * summation order. Scales != 1 and a few saturating elements exercise the scale path. */
static void run_paged_fp8_case(int H, int HKV, int D, int BS, float ks, float vs, struct threadpool *tp)
{
    enum { S = 3, MAXC = 48 };
    int ctx[S] = { 1, 29, 48 }, n_new[S] = { 1, 1, 13 };
    int max_blocks = (MAXC + BS - 1) / BS, num_blocks = S * max_blocks + 1, total_new = 15;
    size_t pool_elems = (size_t)num_blocks * 2 * HKV * BS * D;
    uint8_t *pool = calloc(pool_elems, 1);
    struct kv_layer kv = { .data = pool, .dtype = KV_FP8_E4M3, .num_blocks = num_blocks, .block_size = BS,
                           .n_kv_heads = HKV, .head_dim = D, .k_scale = ks, .v_scale = vs };
    int32_t *bt = malloc(sizeof(int32_t) * S * max_blocks);
    for (int i = 0; i < S * max_blocks; i++) bt[i] = (i * 7 + 1) % num_blocks; /* scattered, distinct */
    float *q = malloc(sizeof(float) * total_new * H * D), *out = malloc(sizeof(float) * total_new * H * D);
    float *ref = malloc(sizeof(float) * total_new * H * D);
    int32_t qs[S + 1], lens[S];
    int row = 0, bad_codes = 0;
    fill(q, (size_t)total_new * H * D, 1.0f);
    for (int s = 0; s < S; s++) {
        qs[s] = row;
        lens[s] = ctx[s];
        size_t n = (size_t)ctx[s] * HKV * D;
        float *K = malloc(sizeof(float) * n), *V = malloc(sizeof(float) * n);
        uint8_t *kc = malloc(n), *vc = malloc(n);
        fill(K, n, 300.0f * ks);
        fill(V, n, 200.0f * vs);
        K[0] = 1000.0f * ks; /* saturates to 448 * ks */
        V[n - 1] = -900.0f * vs;
        for (size_t i = 0; i < n; i++) { /* the reference sees what the pool stores */
            kc[i] = fp32_to_fp8_e4m3(K[i] / ks);
            vc[i] = fp32_to_fp8_e4m3(V[i] / vs);
            K[i] = fp8_e4m3_to_fp32(kc[i]) * ks;
            V[i] = fp8_e4m3_to_fp32(vc[i]) * vs;
        }
        int64_t *slots = malloc(sizeof(int64_t) * ctx[s]);
        for (int p = 0; p < ctx[s]; p++) slots[p] = (int64_t)bt[s * max_blocks + p / BS] * BS + p % BS;
        cpu_kv_write(&kv, K, V, slots, ctx[s]); /* writes the dequantized values: must requantize exactly */
        for (int p = 0; p < ctx[s]; p++)
            for (int h = 0; h < HKV; h++) {
                int64_t blk = slots[p] / BS, off = slots[p] % BS;
                const uint8_t *kp = pool + (((blk * 2 + 0) * HKV + h) * BS + off) * D;
                const uint8_t *vp = pool + (((blk * 2 + 1) * HKV + h) * BS + off) * D;
                for (int e = 0; e < D; e++) {
                    size_t i = ((size_t)p * HKV + h) * D + e;
                    bad_codes += kp[e] != kc[i] || vp[e] != vc[i];
                }
            }
        dense_attention(ref + (size_t)row * H * D, q + (size_t)row * H * D, K, V, n_new[s], ctx[s], H, HKV, D,
                        1.0f / sqrtf((float)D));
        row += n_new[s];
        free(K), free(V), free(kc), free(vc), free(slots);
    }
    CHECK(bad_codes == 0, "%d stored codes differ from e4m3(x / scale)", bad_codes);
    qs[S] = row;
    int nth = tp ? tp_size(tp) : 1;
    float *scratch = malloc(sizeof(float) * cpu_paged_attention_scratch_floats(nth, MAXC));
    struct paged_attention_args a = { .out = out, .q = q, .kv = &kv, .query_start = qs, .seq_lens = lens,
                                      .block_tables = bt, .max_blocks_per_seq = max_blocks, .num_seqs = S,
                                      .num_tokens = row, .n_heads = H, .scale = 1.0f / sqrtf((float)D),
                                      .scratch = scratch, .max_ctx = MAXC };
    cpu_paged_attention(tp, &a);
    float vmax = 448.0f * vs;
    for (size_t i = 0; i < (size_t)row * H * D; i++) CHECK_CLOSE(out[i], ref[i], 2e-5 * vmax, 2e-4);
    free(scratch), free(q), free(out), free(ref), free(bt), free(pool);
}

static void test_paged_attention_fp8(void)
{
    struct threadpool *tp = tp_create(2);
    run_paged_fp8_case(4, 4, 8, 16, 1.0f, 1.0f, NULL);       /* MHA, scale 1 (the default) */
    run_paged_fp8_case(9, 3, 64, 5, 0.05f, 0.01f, tp);       /* SmolLM2 shape, odd block size */
    run_paged_fp8_case(6, 2, 20, 16, 3.0f, 0.125f, tp);      /* odd head_dim: SIMD + scalar tail */
    tp_free(tp);
    /* the vector kernels against the table, every code, lengths that hit every tail */
    uint8_t codes[256 + 23];
    float a[256 + 23], y[256 + 23], yr[256 + 23];
    for (int i = 0; i < 256 + 23; i++) {
        codes[i] = (uint8_t)((i * 37) & 0xff);
        if ((codes[i] & 0x7f) == 0x7f) codes[i] = 0x11; /* NaN is never stored */
        a[i] = frand();
    }
    for (int n = 1; n <= 256 + 23; n += 13) {
        double d = 0;
        for (int i = 0; i < n; i++) d += (double)a[i] * fp8_e4m3_to_fp32(codes[i]), yr[i] = y[i] = a[i];
        CHECK_CLOSE(cpu_dot_fp8(a, codes, n), d, 1e-3, 1e-5);
        cpu_axpy_fp8(y, 0.37f, codes, n);
        for (int i = 0; i < n; i++) CHECK_CLOSE(y[i], yr[i] + 0.37f * fp8_e4m3_to_fp32(codes[i]), 1e-4, 1e-6);
    }
    enum kv_dtype t;
    CHECK(kv_dtype_parse("fp8", &t) == 0 && t == KV_FP8_E4M3, "parse fp8");
    CHECK(kv_dtype_parse("fp8_e4m3", &t) == 0 && t == KV_FP8_E4M3, "parse fp8_e4m3");
    CHECK(kv_dtype_size(KV_FP8_E4M3) == 1, "1 byte");
}

/* ---- batch invariance of paged attention ------------------------------------------------ */

/* A sequence of the invariance test: len tokens, q [len][H][D], its block table. */
struct inv_seq {
    int len;
    const float *q;
    const int32_t *bt;
};

/* One cpu_paged_attention call over rows [from[i], to[i]) of each sequence i (so sequence i
 * holds to[i] tokens after the step). out: [sum of rows][H][D]. */
static void inv_attend(struct threadpool *tp, const struct kv_layer *kv, int H, int max_blocks, int nseq,
                       const struct inv_seq *seqs, const int *from, const int *to, float *out,
                       float *qbuf, int32_t *btbuf, float *scratch, int max_ctx)
{
    int D = kv->head_dim, rows = 0;
    int32_t qs[8], lens[8];
    for (int i = 0; i < nseq; i++) {
        qs[i] = rows;
        lens[i] = to[i];
        memcpy(qbuf + (size_t)rows * H * D, seqs[i].q + (size_t)from[i] * H * D,
               sizeof(float) * (size_t)(to[i] - from[i]) * H * D);
        memcpy(btbuf + (size_t)i * max_blocks, seqs[i].bt, sizeof(int32_t) * max_blocks);
        rows += to[i] - from[i];
    }
    qs[nseq] = rows;
    struct paged_attention_args a = { .out = out, .q = qbuf, .kv = kv, .query_start = qs, .seq_lens = lens,
                                      .block_tables = btbuf, .max_blocks_per_seq = max_blocks,
                                      .num_seqs = nseq, .num_tokens = rows, .n_heads = H,
                                      .scale = 1.0f / sqrtf((float)D), .scratch = scratch, .max_ctx = max_ctx };
    cpu_paged_attention(tp, &a);
}

/* A target sequence of L tokens and two neighbours in one pool whose unused slots hold NaN
 * bit patterns; the data come from seed, so they do not depend on BS. The target's rows
 * computed as one prefill are the baseline (copied to whole_out, [L][H][D]); each other
 * way of batching them must reproduce them bit for bit. Returns the mismatching calls. */
static int run_invariance_case(enum kv_dtype dt, int H, int HKV, int D, int BS, int L, struct threadpool *tp,
                               uint64_t seed, float *whole_out, double *max_ref_err)
{
    rng_state = seed;
    enum { NB1 = 23, NB2 = 40 };
    int lens[3] = { NB1, L, NB2 }, maxlen = L > NB2 ? L : NB2;
    int max_blocks = (maxlen + BS - 1) / BS, num_blocks = 3 * max_blocks + 2;
    size_t esz = kv_dtype_size(dt), pool_elems = (size_t)num_blocks * 2 * HKV * BS * D;
    void *pool = malloc(pool_elems * esz);
    memset(pool, 0xff, pool_elems * esz); /* NaN in every dtype: stale slots must never be read */
    struct kv_layer kv = { .data = pool, .dtype = dt, .num_blocks = num_blocks, .block_size = BS,
                           .n_kv_heads = HKV, .head_dim = D, .k_scale = dt == KV_FP8_E4M3 ? 0.02f : 1.0f,
                           .v_scale = dt == KV_FP8_E4M3 ? 0.01f : 1.0f };
    int32_t *perm = malloc(sizeof(int32_t) * num_blocks), *bt = malloc(sizeof(int32_t) * 3 * max_blocks);
    for (int i = 0; i < num_blocks; i++) perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < 3 * max_blocks; i++) bt[i] = perm[i];
    rng_state = seed ^ 0x5bd1e995u; /* the values: the same for every block size */

    struct inv_seq seqs[3];
    float *qs[3];
    for (int s = 0; s < 3; s++) {
        size_t n = (size_t)lens[s] * HKV * D;
        float *K = malloc(sizeof(float) * n), *V = malloc(sizeof(float) * n);
        fill(K, n, 2.0f);
        fill(V, n, 1.0f);
        int64_t *slots = malloc(sizeof(int64_t) * lens[s]);
        for (int p = 0; p < lens[s]; p++)
            slots[p] = (int64_t)bt[s * max_blocks + p / BS] * BS + p % BS;
        cpu_kv_write(&kv, K, V, slots, lens[s]);
        free(K), free(V), free(slots);
        qs[s] = malloc(sizeof(float) * (size_t)lens[s] * H * D);
        fill(qs[s], (size_t)lens[s] * H * D, 1.5f);
        seqs[s] = (struct inv_seq){ .len = lens[s], .q = qs[s], .bt = bt + s * max_blocks };
    }

    size_t row_floats = (size_t)H * D, all_rows = (size_t)NB1 + L + NB2;
    float *whole = malloc(sizeof(float) * L * row_floats), *ref = malloc(sizeof(float) * L * row_floats);
    float *out = malloc(sizeof(float) * all_rows * row_floats), *qbuf = malloc(sizeof(float) * all_rows * row_floats);
    int32_t *btbuf = malloc(sizeof(int32_t) * 3 * max_blocks);
    int nth = tp ? tp_size(tp) : 1;
    size_t sf = cpu_paged_attention_scratch_floats(nth, maxlen), rf = ref_paged_attention_scratch_floats(nth, maxlen);
    float *scratch = malloc(sizeof(float) * (sf > rf ? sf : rf));
    int bad = 0;

    /* baseline: the whole prompt in one prefill; and the previous kernel within tolerance */
    int f0 = 0;
    inv_attend(tp, &kv, H, max_blocks, 1, &seqs[1], &f0, &L, whole, qbuf, btbuf, scratch, maxlen);
    {
        int32_t q2[2] = { 0, L }, l1[1] = { L };
        struct paged_attention_args a = { .out = ref, .q = qs[1], .kv = &kv, .query_start = q2, .seq_lens = l1,
                                          .block_tables = seqs[1].bt, .max_blocks_per_seq = max_blocks,
                                          .num_seqs = 1, .num_tokens = L, .n_heads = H,
                                          .scale = 1.0f / sqrtf((float)D), .scratch = scratch, .max_ctx = maxlen };
        ref_paged_attention(tp, &a);
        /* error in units of the tolerance the dense-reference tests use (|V| < 1) */
        for (size_t i = 0; i < (size_t)L * row_floats; i++) {
            double e = fabs((double)whole[i] - ref[i]) / (2e-5 + 2e-4 * fabs((double)ref[i]));
            if (!(e <= *max_ref_err)) *max_ref_err = isnan(e) ? INFINITY : e;
        }
    }

    /* one token at a time (decode), on the calling thread only */
    for (int t = 0; t < L; t++) {
        int f = t, e = t + 1;
        inv_attend(NULL, &kv, H, max_blocks, 1, &seqs[1], &f, &e, out, qbuf, btbuf, scratch, maxlen);
        bad += memcmp(out, whole + (size_t)t * row_floats, sizeof(float) * row_floats) != 0;
    }
    /* chunked prefill, several chunk sizes; the target between two other sequences (one
     * prefilling its last 7 tokens, one decoding) */
    const int chunks[] = { 1, 3, 16, 29 };
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++)
        for (int t = 0; t < L; t += chunks[c]) {
            int e = t + chunks[c] < L ? t + chunks[c] : L;
            inv_attend(tp, &kv, H, max_blocks, 1, &seqs[1], &t, &e, out, qbuf, btbuf, scratch, maxlen);
            bad += memcmp(out, whole + (size_t)t * row_floats, sizeof(float) * (e - t) * row_floats) != 0;
            int from[3] = { NB1 - 7, t, NB2 - 1 }, to[3] = { NB1, e, NB2 };
            inv_attend(tp, &kv, H, max_blocks, 3, seqs, from, to, out, qbuf, btbuf, scratch, maxlen);
            bad += memcmp(out + 7 * row_floats, whole + (size_t)t * row_floats,
                          sizeof(float) * (e - t) * row_floats) != 0;
        }

    memcpy(whole_out, whole, sizeof(float) * L * row_floats);
    free(scratch), free(btbuf), free(qbuf), free(out), free(ref), free(whole);
    for (int s = 0; s < 3; s++) free(qs[s]);
    free(bt), free(perm), free(pool);
    return bad;
}

static void test_paged_attention_batch_invariance(void)
{
    struct threadpool *tp = tp_create(2);
    const enum kv_dtype dts[] = { KV_F32, KV_F16, KV_BF16, KV_FP8_E4M3 };
    const int groups[][2] = { { 2, 2 }, { 9, 3 }, { 8, 2 } }; /* (n_heads, n_kv_heads): GQA 1, 3, 4 */
    const int dims[] = { 64, 128 }, lens[] = { 1, 16, 37, 100 }, block_sizes[] = { 16, 5, 32 };
    float *base = malloc(sizeof(float) * 100 * 9 * 128), *other = malloc(sizeof(float) * 100 * 9 * 128);
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        double max_ref_err = 0;
        for (size_t g = 0; g < 3; g++)
            for (size_t h = 0; h < 2; h++)
                for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
                    /* and the pool's block size must not matter either (the model tests compare
                     * prefills over different block sizes) */
                    for (size_t b = 0; b < sizeof block_sizes / sizeof block_sizes[0]; b++) {
                        int H = groups[g][0], HKV = groups[g][1], D = dims[h], L = lens[l], bs = block_sizes[b];
                        uint64_t seed = 0x9e3779b97f4a7c15ull + 977 * (d * 100 + g * 10 + h) + l;
                        int bad = run_invariance_case(dts[d], H, HKV, D, bs, L, tp, seed, b ? other : base,
                                                      &max_ref_err);
                        CHECK(bad == 0, "dtype %s H %d HKV %d D %d BS %d L %d: %d batchings differ from the whole prefill",
                              kv_dtype_name(dts[d]), H, HKV, D, bs, L, bad);
                        CHECK(!b || !memcmp(base, other, sizeof(float) * L * H * D),
                              "dtype %s H %d HKV %d D %d L %d: block size %d differs from block size 16",
                              kv_dtype_name(dts[d]), H, HKV, D, L, bs);
                    }
        /* both f32 with different summation orders and exp: |new - previous| within
         * 2e-5 + 2e-4 |previous| */
        CHECK(max_ref_err <= 1.0, "dtype %s: difference to the per-row kernel %.3g x tolerance",
              kv_dtype_name(dts[d]), max_ref_err);
        printf("     %s: largest difference to the per-row kernel %.3f x tolerance\n", kv_dtype_name(dts[d]),
               max_ref_err);
    }
    free(base), free(other);
    tp_free(tp);
}

int main(void)
{
    RUN(test_rmsnorm);
    RUN(test_add);
    RUN(test_softmax);
    RUN(test_silu_mul);
    RUN(test_dot_axpy);
    RUN(test_rope_neox_formula);
    RUN(test_rope_permutation_equivalence);
    RUN(test_rope_llama3_scaling);
    RUN(test_kv_write_layout);
    RUN(test_kv_write_16bit_bitwise);
    RUN(test_paged_attention_f32);
    RUN(test_paged_attention_f16);
    RUN(test_paged_attention_bf16);
    RUN(test_kv_write_bf16);
    RUN(test_paged_attention_fp8);
    RUN(test_paged_attention_batch_invariance);
    return test_summary();
}
