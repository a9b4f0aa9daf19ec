/* test_kernel_rope.cu — kernels/rope.cu (RoPE fused with the paged KV-cache write)
 * against its CPU twin cpu_rope_kv_write (cpu_rope + cpu_kv_write) on fresh random inputs:
 * head dims 64 / 96 / 128 / 256, GQA 1 / 3 / 7 / 8, NORMAL and NEOX, plain and llama3
 * inverse frequencies, positions up to 131071, QKV bias on and off, padding slots (-1),
 * KV F32 / F16 / BF16 / FP8 e4m3 with non-1 scales (one saturating), block sizes 16 and 32,
 * padded row strides, YaRN mscale, one token to 300 tokens (with and without the head
 * split over blockIdx.y). q_out is compared by value; the whole KV pool byte by byte:
 * slots nobody wrote keep their poison bit for bit, V matches the twin's bytes exactly (the
 * conversion's inputs are identical), K within one code (the rotated F32 value may differ
 * by an ulp, which can move the final rounding by one step). Every case runs with and
 * without an L2 prefetch hint (ktest_l2: the same checks, exactly the hinted bytes issued).
 * Invalid arguments fail.
 */
#include "ktest_rowwise.h"

extern "C" {
#include "backend/cpu/ops_fused.h"
#include "util/err.h"
#include "util/kv_dtype.h"
#include "util/rope.h"
}
#include "kernels/rope.h"

#include <algorithm>

struct rope_case {
    int T, nh, nkv, hd;
    enum rope_layout layout;
    bool llama3;         /* llama3-scaled inverse frequencies (else plain theta) */
    int pos_lo, pos_hi;  /* positions drawn from [pos_lo, pos_hi] */
    bool bias;
    enum kv_dtype kvt;
    int block_size;
    int pad_every;       /* every pad_every-th token is padding (slot -1); 0: none */
    int stride_pad;      /* extra floats per QKV row (a multiple of 4) */
    float mscale;
    float k_scale, v_scale; /* FP8 only */
};

/* q_out bound. cos/sin agree with the twin's double-precision ones to ~1 ulp (angle reduced
 * in double, a |r| <= pi/4 polynomial), the rotation is two products and a sum of values
 * |a|, |b| <= 1.5 (times mscale <= 1.2), |result| < 2.6: a few F32 ulps (2.4e-7 each).
 * Measured under the emulator: max 2.4e-7, nmse < 5e-15 at every position range. An f32
 * angle (pos * inv_freq in float) misses by ~4e-3 at position 131071: the large-position
 * cases check that such an error would fail this bound. */
static const ktol TOL_Q = { 1e-13, 1e-6 };

static void make_inv_freq(float *inv, int hd, bool llama3)
{
    struct rope_params p;
    memset(&p, 0, sizeof p);
    if (llama3) {
        p.theta = 500000.0;
        p.scaling = ROPE_SCALING_LLAMA3;
        p.factor = 8.0;
        p.low_freq_factor = 1.0;
        p.high_freq_factor = 4.0;
        p.original_max_position_embeddings = 8192;
    } else {
        p.theta = 1000000.0;
        p.scaling = ROPE_SCALING_NONE;
        p.factor = 1.0;
    }
    rope_inv_freq(inv, hd, &p, NULL);
}

/* Max |error| of q rotated with an f32 angle (a deliberately naive kernel) against ref. */
static double naive_f32_q_error(const rope_case &c, const std::vector<float> &qkv, const std::vector<float> &bias,
                                int64_t stride, const std::vector<int32_t> &pos, const std::vector<float> &inv,
                                const std::vector<float> &q_ref)
{
    double worst = 0.0;
    const int half = c.hd / 2;
    for (int t = 0; t < c.T; t++)
        for (int h = 0; h < c.nh; h++)
            for (int i = 0; i < half; i++) {
                int ia = c.layout == ROPE_NEOX ? i : 2 * i, ib = c.layout == ROPE_NEOX ? i + half : 2 * i + 1;
                int64_t col = (int64_t)h * c.hd;
                float a = qkv[t * stride + col + ia] + (c.bias ? bias[col + ia] : 0.0f);
                float b = qkv[t * stride + col + ib] + (c.bias ? bias[col + ib] : 0.0f);
                float ang = (float)pos[t] * inv[i];
                float cs = cosf(ang) * c.mscale, sn = sinf(ang) * c.mscale;
                size_t o = ((size_t)t * c.nh + h) * c.hd;
                worst = std::max(worst, (double)fabsf(a * cs - b * sn - q_ref[o + ia]));
                worst = std::max(worst, (double)fabsf(a * sn + b * cs - q_ref[o + ib]));
            }
    return worst;
}

/* Compares the whole pool with the twin's (both started as 0xFF poison). */
static void check_pool(const char *what, const rope_case &c, const struct kv_layer &kv,
                       const std::vector<unsigned char> &got, const std::vector<unsigned char> &ref,
                       const std::vector<int> &slot_token)
{
    const size_t es = kv_dtype_size(c.kvt);
    size_t poison_bad = 0, v_bad = 0, k_far = 0, k_diff = 0;
    for (int64_t blk = 0; blk < kv.num_blocks; blk++)
        for (int which = 0; which < 2; which++)
            for (int kh = 0; kh < c.nkv; kh++)
                for (int off = 0; off < c.block_size; off++) {
                    int64_t slot = blk * c.block_size + off;
                    size_t e = ((((size_t)blk * 2 + which) * c.nkv + kh) * c.block_size + off) * c.hd;
                    const unsigned char *g = got.data() + e * es, *r = ref.data() + e * es;
                    if (slot_token[slot] < 0) {
                        for (size_t i = 0; i < c.hd * es; i++) poison_bad += g[i] != 0xff;
                        continue;
                    }
                    if (which == 1) {
                        v_bad += memcmp(g, r, c.hd * es) != 0;
                        continue;
                    }
                    if (c.kvt == KV_F32) {
                        for (int i = 0; i < c.hd; i++) {
                            float a, b;
                            memcpy(&a, g + 4 * i, 4);
                            memcpy(&b, r + 4 * i, 4);
                            k_diff += a != b;
                            k_far += !(fabsf(a - b) <= TOL_Q.max_abs);
                        }
                    } else {
                        size_t d = 0;
                        k_far += codes_far(what, g, r, c.hd, (int)es * 8, 1, &d);
                        k_diff += d;
                    }
                }
    CHECK(poison_bad == 0, "%s: %zu pool bytes of unwritten slots lost their poison", what, poison_bad);
    CHECK(v_bad == 0, "%s: %zu V rows differ from the twin's bytes", what, v_bad);
    CHECK(k_far == 0, "%s: %zu K elements more than one code from the twin (%zu differ)", what, k_far, k_diff);
}

static void run_case(const rope_case &c, uint64_t seed)
{
    ktest_rng rng(seed);
    const int64_t stride = (int64_t)(c.nh + 2 * c.nkv) * c.hd + c.stride_pad;
    const size_t nq = (size_t)c.T * c.nh * c.hd;
    std::vector<float> qkv((size_t)c.T * stride), bias((size_t)(c.nh + 2 * c.nkv) * c.hd), inv(c.hd / 2);
    rng.fill_uniform(qkv.data(), qkv.size(), -1.0f, 1.0f);
    rng.fill_uniform(bias.data(), bias.size(), -0.5f, 0.5f);
    make_inv_freq(inv.data(), c.hd, c.llama3);
    std::vector<int32_t> pos(c.T);
    for (int t = 0; t < c.T; t++) pos[t] = c.pos_lo + rng.below(c.pos_hi - c.pos_lo + 1);

    /* distinct random slots over a pool with a few blocks more than needed */
    struct kv_layer kv;
    memset(&kv, 0, sizeof kv);
    kv.dtype = c.kvt;
    kv.block_size = c.block_size;
    kv.num_blocks = c.T / c.block_size + 3;
    kv.n_kv_heads = c.nkv;
    kv.head_dim = c.hd;
    kv.k_scale = c.kvt == KV_FP8_E4M3 ? c.k_scale : 1.0f;
    kv.v_scale = c.kvt == KV_FP8_E4M3 ? c.v_scale : 1.0f;
    const int nslots = kv.num_blocks * c.block_size;
    std::vector<int> perm(nslots), slot_token(nslots, -1);
    for (int i = 0; i < nslots; i++) perm[i] = i;
    for (int i = nslots - 1; i > 0; i--) std::swap(perm[i], perm[rng.below(i + 1)]);
    std::vector<int64_t> slots(c.T);
    for (int t = 0; t < c.T; t++) {
        bool padding = c.pad_every && t % c.pad_every == c.pad_every - 1;
        slots[t] = padding ? -1 : perm[t];
        if (!padding) slot_token[perm[t]] = t;
    }
    const size_t pool_bytes = (size_t)nslots * 2 * c.nkv * c.hd * kv_dtype_size(c.kvt);

    std::vector<float> q_ref(nq);
    std::vector<unsigned char> pool_ref(pool_bytes, 0xff);
    struct kv_layer kv_host = kv;
    kv_host.data = pool_ref.data();
    int rc = cpu_rope_kv_write(q_ref.data(), &kv_host, qkv.data(), stride, c.bias ? bias.data() : NULL, pos.data(),
                               slots.data(), inv.data(), c.mscale, c.layout, c.T, c.nh);
    CHECK(rc == 0, "cpu_rope_kv_write returned %d", rc);

    char what[160];
    snprintf(what, sizeof what, "rope T=%d nh=%d nkv=%d hd=%d %s%s pos<=%d bias=%d kv=%s bs=%d pad=%d mscale=%g", c.T,
             c.nh, c.nkv, c.hd, c.layout == ROPE_NEOX ? "neox" : "normal", c.llama3 ? " llama3" : "", c.pos_hi,
             (int)c.bias, kv_dtype_name(c.kvt), c.block_size, c.pad_every, (double)c.mscale);
    if (c.pos_hi >= 100000) {
        double naive = naive_f32_q_error(c, qkv, bias, stride, pos, inv, q_ref);
        CHECK(naive > 100.0 * TOL_Q.max_abs, "%s: an f32 angle would pass too (max error %g)", what, naive);
    }

    kbuf<float> d_q(nq), d_qkv(qkv.size()), d_bias(bias.size()), d_inv(inv.size());
    kbuf<int32_t> d_pos(c.T);
    kbuf<int64_t> d_slots(c.T);
    kbuf<unsigned char> d_pool(pool_bytes);
    d_qkv.upload(qkv);
    d_bias.upload(bias);
    d_inv.upload(inv);
    d_pos.upload(pos);
    d_slots.upload(slots);
    struct kv_layer kv_dev = kv;
    kv_dev.data = d_pool.ptr;
    ktest_l2 l2;
    KTEST_SEEDS(s) {
        d_q.poison();
        d_pool.poison();
        rc = cuda_rope_kv_write(d_q.ptr, &kv_dev, d_qkv.ptr, stride, c.bias ? d_bias.ptr : NULL, d_pos.ptr,
                                d_slots.ptr, d_inv.ptr, c.mscale, c.layout, c.T, c.nh, l2.arm(s, seed), (s + c.T) & 1,
                                0);
        CHECK(rc == 0, "%s: cuda_rope_kv_write returned %d", what, rc);
        std::vector<float> q = d_q.download();
        std::vector<unsigned char> pool = d_pool.download();
        CHECK_CLOSE_ARRAYS(what, q.data(), q_ref.data(), nq, TOL_Q);
        check_pool(what, c, kv, pool, pool_ref, slot_token);
        CHECK(d_qkv.download() == qkv, "%s: the QKV input changed", what);
        l2.check(what);
        CHECK_GUARD(d_q);
        CHECK_GUARD(d_qkv);
        CHECK_GUARD(d_bias);
        CHECK_GUARD(d_inv);
        CHECK_GUARD(d_pos);
        CHECK_GUARD(d_slots);
        CHECK_GUARD(d_pool);
    }
}

static const int MAXPOS = 131071;

static void test_rope_kv_write(void)
{
    static const rope_case cases[] = {
        /* T   nh  nkv hd   layout       llama3 pos          bias   kv           bs  pad str mscale  ks     vs */
        { 1, 28, 4, 128, ROPE_NEOX, false, 0, 4096, true, KV_BF16, 16, 0, 0, 1.0f, 1, 1 }, /* Qwen2.5-7B decode */
        { 7, 4, 4, 64, ROPE_NORMAL, true, 0, MAXPOS, false, KV_F16, 32, 3, 4, 1.0f, 1, 1 },   /* GQA 1 */
        { 13, 6, 2, 128, ROPE_NEOX, true, 100000, MAXPOS, true, KV_FP8_E4M3, 16, 4, 0, 1.0f, 0.02f, 0.01f }, /* GQA 3 */
        { 9, 7, 1, 64, ROPE_NEOX, false, 0, MAXPOS, false, KV_FP8_E4M3, 32, 0, 8, 1.0f, 0.002f, 0.5f }, /* GQA 7, K saturates */
        { 5, 16, 2, 128, ROPE_NORMAL, false, 120000, MAXPOS, true, KV_BF16, 32, 2, 0, 1.2f, 1, 1 }, /* GQA 8, YaRN mscale */
        { 300, 2, 1, 64, ROPE_NEOX, false, 0, 2000, false, KV_F16, 16, 7, 0, 1.0f, 1, 1 }, /* no head split */
        { 100, 28, 4, 128, ROPE_NEOX, false, 0, MAXPOS, true, KV_BF16, 16, 5, 0, 1.0f, 1, 1 }, /* partial split */
        { 3, 8, 2, 256, ROPE_NEOX, true, 0, MAXPOS, true, KV_F32, 16, 0, 0, 1.0f, 1, 1 },     /* head_dim 256 */
        { 4, 3, 1, 96, ROPE_NORMAL, false, 0, MAXPOS, true, KV_F16, 16, 2, 4, 1.0f, 1, 1 },   /* head_dim 96 */
        { 64, 16, 2, 64, ROPE_NEOX, true, 110000, MAXPOS, false, KV_FP8_E4M3, 16, 9, 0, 1.0f, 0.05f, 0.03f },
        { 3, 8, 8, 128, ROPE_NORMAL, true, 0, MAXPOS, true, KV_FP8_E4M3, 32, 1, 0, 1.0f, 0.1f, 0.1f }, /* all padding */
    };
    uint64_t seed = 1000;
    for (const rope_case &c : cases) run_case(c, seed++);
}

static void test_rope_kv_write_invalid(void)
{
    const int T = 2, nh = 2, nkv = 1;
    kbuf<float> d_q(T * nh * 64), d_qkv(T * 4 * 64), d_inv(32);
    kbuf<int32_t> d_pos(T);
    kbuf<int64_t> d_slots(T);
    kbuf<unsigned char> d_pool(2 * 2 * 16 * 64 * 2);
    struct kv_layer kv;
    memset(&kv, 0, sizeof kv);
    kv.data = d_pool.ptr;
    kv.dtype = KV_F16;
    kv.num_blocks = 2;
    kv.block_size = 16;
    kv.n_kv_heads = nkv;
    kv.head_dim = 64;
    kv.k_scale = kv.v_scale = 1.0f;
    struct kv_layer bad = kv;
    bad.head_dim = 36; /* not a multiple of 8 */
    int rc = cuda_rope_kv_write(d_q.ptr, &bad, d_qkv.ptr, 4 * 36, NULL, d_pos.ptr, d_slots.ptr, d_inv.ptr, 1.0f,
                                ROPE_NEOX, T, nh, NULL, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "head_dim 36: %d", rc);
    rc = cuda_rope_kv_write(d_q.ptr, &kv, d_qkv.ptr, 4 * 64 - 2, NULL, d_pos.ptr, d_slots.ptr, d_inv.ptr, 1.0f,
                            ROPE_NEOX, T, nh, NULL, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "short row_stride: %d", rc);
    /* (an out-of-range kv dtype or layout also fails in the launcher's switch default, but
     * forming one is undefined behaviour in C++, which UBSan rejects in `make asan`) */
    rc = cuda_rope_kv_write(d_q.ptr, &kv, d_qkv.ptr, 4 * 64, NULL, d_pos.ptr, d_slots.ptr, d_inv.ptr + 1, 1.0f,
                            ROPE_NEOX, T, nh, NULL, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "unaligned inv_freq: %d", rc);
    const cuda_l2_hint bad_hint = { d_inv.ptr + 4, 24 }; /* aligned, but not a multiple of 16 bytes */
    rc = cuda_rope_kv_write(d_q.ptr, &kv, d_qkv.ptr, 4 * 64, NULL, d_pos.ptr, d_slots.ptr, d_inv.ptr, 1.0f,
                            ROPE_NEOX, T, nh, &bad_hint, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "hint of 24 bytes: %d", rc);
    rc = cuda_rope_kv_write(d_q.ptr, &kv, d_qkv.ptr, 4 * 64, NULL, d_pos.ptr, d_slots.ptr, d_inv.ptr, 1.0f,
                            ROPE_NEOX, 0, nh, NULL, 1, 0);
    CHECK(rc == 0, "zero tokens: %d", rc);
    std::vector<float> q = d_q.download();
    for (float v : q) CHECK(isnan(v), "a rejected or empty call wrote q_out");
    std::vector<unsigned char> pool = d_pool.download();
    for (unsigned char b : pool) CHECK(b == 0xff, "a rejected or empty call wrote the pool");
    CHECK_GUARD(d_q);
    CHECK_GUARD(d_pool);
    std::vector<float> q_h(T * nh * 64);
    kv.data = NULL;
    bad = kv;
    bad.head_dim = 2048;
    CHECK(cpu_rope_kv_write(q_h.data(), &bad, NULL, 0, NULL, NULL, NULL, NULL, 1.0f, ROPE_NEOX, T, nh) == ERR_INVALID,
          "twin took head_dim 2048");
}

int main(void)
{
    RUN(test_rope_kv_write);
    RUN(test_rope_kv_write_invalid);
    return test_summary();
}
