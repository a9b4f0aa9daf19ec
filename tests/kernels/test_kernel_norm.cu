/* test_kernel_norm.cu — kernels/norm.cu against its CPU twins (cpu_rmsnorm_residual,
 * cpu_head_rmsnorm; src/backend/cpu/ops_fused.c) on fresh random inputs: RMSNorm + residual
 * over rows 1 / 3 / 64 / 257, dims 64, 896, 1000 (a multiple of 8 whose last CTA pass is
 * partial), 3584, 5120, 8192, F32 / F16 / BF16 outputs, with and without delta, plus the
 * generic path (odd dims, unaligned pointers, dim > 8192), each with and without an L2
 * prefetch hint (ktest_l2: the same bits, exactly the hinted bytes issued) and, for F32 rows
 * of whole 32-blocks, with and without the quantized output (bytewise cuda_quantize_act's
 * of out); per-head RMSNorm over head dims
 * 64 / 128 / 256, GQA 1 / 3 / 7 / 8 and padded row strides; invalid arguments. Every case
 * runs under several emulator fiber orders (the block reduction has barriers), outputs
 * poisoned before the call, guards checked on every buffer after it.
 */
#include "ktest_rowwise.h"

extern "C" {
#include "backend/cpu/ops_fused.h"
#include "util/err.h"
}
#include "kernels/norm.h"
#include "kernels/quant_matmul.h"

static const enum dtype ACT_TYPES[3] = { DT_F32, DT_F16, DT_BF16 };
static const float EPS = 1e-6f;

/* F32 bound: the kernel sums the squares in another order (per-thread float4 partials, a
 * warp tree, a block tree) than cpu_dot_f32 (8 AVX2 lanes), so the row scale differs by an
 * ulp or two; with |out| < ~16 (residual ~N(0, 2^2) + N(0, 1), normalised, |w| < 2) that is
 * a few ulps of 9.5e-7 at worst (measured under the emulator: max 9.5e-7, nmse < 1e-14).
 * F16/BF16: the ktest.h defaults plus act_compare's one-code bound. */
static const ktol TOL_F32_NORM = { 1e-13, 4e-6 };

static ktol tol_for(enum dtype dt)
{
    static const ktol f32 = TOL_F32_NORM;
    return dt == DT_F32 ? f32 : dt == DT_F16 ? KTOL_F16 : KTOL_BF16;
}

/* One rmsnorm_residual case. `shift` elements of offset inside the device buffers make
 * every pointer unaligned when odd (the generic path); the shifted-over prefix must keep
 * its poison. */
static void rms_case(int rows, int dim, enum dtype dt, bool with_delta, int shift, uint64_t seed)
{
    const size_t n = (size_t)rows * dim, es = act_size(dt);
    ktest_rng rng(seed);
    std::vector<float> res(n), del(n), w(dim);
    rng.fill_normal(res.data(), n, 2.0f);
    rng.fill_normal(del.data(), n, 1.0f);
    rng.fill_uniform(w.data(), dim, -2.0f, 2.0f);

    std::vector<float> res_ref = res;
    std::vector<unsigned char> out_ref(n * es);
    int rc = cpu_rmsnorm_residual(out_ref.data(), dt, res_ref.data(), with_delta ? del.data() : NULL, w.data(),
                                  rows, dim, EPS);
    CHECK(rc == 0, "cpu_rmsnorm_residual returned %d", rc);

    kbuf<float> d_res(n + shift), d_del(n + shift), d_w(dim);
    kbuf<unsigned char> d_out((n + shift) * es);
    d_w.upload(w);
    ktest_l2 l2;
    /* F32 rows of whole 32-blocks also come out quantized (qact) on runs 0, 2, ...: the bytes
     * cuda_quantize_act makes from out */
    const bool quant = dt == DT_F32 && dim % 32 == 0;
    const size_t qbytes = cuda_quant_act_size(dim, rows);
    kbuf<uint8_t> d_qa(quant ? qbytes : 1), d_qref(quant ? qbytes : 1);
    KTEST_SEEDS(s) {
        const bool q = quant && s != 1;
        d_qa.poison();
        d_qref.poison();
        d_res.poison();
        d_del.poison();
        d_out.poison();
        KCHECK_CUDA(cudaMemcpy(d_res.ptr + shift, res.data(), n * 4, cudaMemcpyHostToDevice));
        KCHECK_CUDA(cudaMemcpy(d_del.ptr + shift, del.data(), n * 4, cudaMemcpyHostToDevice));
        rc = cuda_rmsnorm_residual(d_out.ptr + shift * es, dt, d_res.ptr + shift,
                                   with_delta ? d_del.ptr + shift : NULL, d_w.ptr, rows, dim, EPS, l2.arm(s, seed),
                                   q ? d_qa.ptr : NULL, (s + rows) & 1, 0);
        CHECK(rc == 0, "cuda_rmsnorm_residual returned %d", rc);
        if (q) { /* the reference quantizes an aligned copy of out (shifted outs are not) */
            kbuf<float> d_oc(n);
            KCHECK_CUDA(cudaMemcpy(d_oc.ptr, d_out.ptr + shift * es, n * 4, cudaMemcpyDeviceToDevice));
            CHECK(cuda_quantize_act(d_oc.ptr, dim, rows, d_qref.ptr, 0, 0) == 0, "cuda_quantize_act failed");
            CHECK(d_qa.download() == d_qref.download(), "rmsnorm rows=%d dim=%d shift=%d: the quantized output "
                  "differs from cuda_quantize_act's", rows, dim, shift);
            CHECK_GUARD(d_qa);
        }
        std::vector<float> got_res = d_res.download();
        std::vector<unsigned char> got_out = d_out.download();
        char what[96];
        snprintf(what, sizeof what, "rmsnorm rows=%d dim=%d %s delta=%d shift=%d", rows, dim, act_name(dt),
                 (int)with_delta, shift);
        /* the residual update is one F32 add per element on both sides: bit-exact */
        CHECK(!memcmp(got_res.data() + shift, res_ref.data(), n * 4), "%s: residual differs from the twin", what);
        std::vector<unsigned char> got_body(got_out.begin() + shift * es, got_out.end());
        CHECK(act_compare(what, got_body, out_ref, dt, n, tol_for(dt)), "%s: out differs from the twin", what);
        for (int i = 0; i < shift; i++) {
            uint32_t r;
            memcpy(&r, &got_res[i], 4);
            CHECK(r == 0xffffffffu, "%s: residual written before the row", what);
        }
        for (size_t i = 0; i < shift * es; i++) CHECK(got_out[i] == 0xff, "%s: out written before the row", what);
        l2.check(what);
        CHECK_GUARD(d_res);
        CHECK_GUARD(d_del);
        CHECK_GUARD(d_w);
        CHECK_GUARD(d_out);
    }
}

static void test_rmsnorm_residual(void)
{
    static const int shapes[][2] = {
        { 1, 64 }, { 3, 64 }, { 64, 64 }, { 257, 64 }, { 1, 896 }, { 3, 896 }, { 257, 896 }, { 1, 1000 },
        { 64, 1000 }, { 1, 3584 }, { 3, 3584 }, { 64, 3584 }, { 1, 5120 }, { 3, 5120 }, { 1, 8192 },
    };
    uint64_t seed = 100;
    for (const auto &sh : shapes)
        for (enum dtype dt : ACT_TYPES)
            for (int delta = 0; delta < 2; delta++) rms_case(sh[0], sh[1], dt, delta, 0, seed++);
}

/* Off the fast path: odd dims, a dim that is a multiple of 4 with unaligned pointers, and
 * a dim above 8192. */
static void test_rmsnorm_residual_generic(void)
{
    uint64_t seed = 200;
    for (enum dtype dt : ACT_TYPES) {
        rms_case(3, 37, dt, true, 0, seed++);
        rms_case(5, 1001, dt, dt != DT_F16, 0, seed++);
        rms_case(4, 1000, dt, true, 1, seed++);
        rms_case(2, 8200, dt, true, 0, seed++);
        rms_case(3, 96, dt, true, 1, seed++);   /* whole 32-blocks, unaligned (F32: quantized too) */
        rms_case(2, 8224, dt, false, 0, seed++); /* the same above 8192 */
    }
}

static void test_rmsnorm_residual_invalid(void)
{
    kbuf<float> d_res(64), d_w(64), d_out(64);
    int rc = cuda_rmsnorm_residual(d_out.ptr, DT_Q8_0, d_res.ptr, NULL, d_w.ptr, 1, 64, EPS, NULL, NULL, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "Q8_0 output: %d", rc);
    rc = cuda_rmsnorm_residual(d_out.ptr, DT_F32, d_res.ptr, NULL, d_w.ptr, 1, 0, EPS, NULL, NULL, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "dim 0: %d", rc);
    /* a quantized output needs F32 out, whole 32-blocks and a 16-byte aligned buffer */
    kbuf<uint8_t> d_qa(cuda_quant_act_size(64, 1) + 16);
    rc = cuda_rmsnorm_residual(d_out.ptr, DT_BF16, d_res.ptr, NULL, d_w.ptr, 1, 64, EPS, NULL, d_qa.ptr, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "quantized BF16 out: %d", rc);
    rc = cuda_rmsnorm_residual(d_out.ptr, DT_F32, d_res.ptr, NULL, d_w.ptr, 1, 48, EPS, NULL, d_qa.ptr, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "quantized dim 48: %d", rc);
    rc = cuda_rmsnorm_residual(d_out.ptr, DT_F32, d_res.ptr, NULL, d_w.ptr, 1, 64, EPS, NULL, d_qa.ptr + 4, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "unaligned quantized output: %d", rc);
    /* hints breaking l2_hint.h's rules: an unaligned address, a size not a multiple of 16,
     * bytes without an address */
    const cuda_l2_hint bad[] = { { d_w.ptr + 1, 64 }, { d_w.ptr, 40 }, { NULL, 16 } };
    for (const cuda_l2_hint &h : bad) {
        rc = cuda_rmsnorm_residual(d_out.ptr, DT_F32, d_res.ptr, NULL, d_w.ptr, 1, 64, EPS, &h, NULL, 0, 0);
        CHECK(rc == (int)cudaErrorInvalidValue, "hint (%p, %llu): %d", h.p, (unsigned long long)h.bytes, rc);
    }
    rc = cuda_rmsnorm_residual(d_out.ptr, DT_F32, d_res.ptr, NULL, d_w.ptr, 0, 64, EPS, NULL, d_qa.ptr, 1, 0);
    CHECK(rc == 0, "zero rows: %d", rc);
    std::vector<float> o = d_out.download();
    for (float v : o) CHECK(isnan(v), "a rejected or empty call wrote the output");
    CHECK(cpu_rmsnorm_residual(NULL, DT_Q8_0, NULL, NULL, NULL, 1, 64, EPS) == ERR_INVALID, "twin took Q8_0");
}

/* One head_rmsnorm case over [T][row_stride], row_stride = (nh + 2 nkv) hd + pad. */
static void head_case(int T, int nh, int nkv, int hd, int pad, uint64_t seed)
{
    const int64_t stride = (int64_t)(nh + 2 * nkv) * hd + pad;
    const size_t n = (size_t)T * stride;
    ktest_rng rng(seed);
    std::vector<float> x(n), qn(hd), kn(hd);
    rng.fill_normal(x.data(), n, 3.0f);
    rng.fill_uniform(qn.data(), hd, 0.5f, 1.5f);
    rng.fill_uniform(kn.data(), hd, -1.5f, 1.5f);
    std::vector<float> ref = x;
    int rc = cpu_head_rmsnorm(ref.data(), stride, qn.data(), kn.data(), T, nh, nkv, hd, EPS);
    CHECK(rc == 0, "cpu_head_rmsnorm returned %d", rc);

    kbuf<float> d_x(n), d_qn(hd), d_kn(hd);
    d_qn.upload(qn);
    d_kn.upload(kn);
    KTEST_SEEDS(s) {
        d_x.upload(x);
        rc = cuda_head_rmsnorm(d_x.ptr, stride, d_qn.ptr, d_kn.ptr, T, nh, nkv, hd, EPS, (s + T) & 1, 0);
        CHECK(rc == 0, "cuda_head_rmsnorm returned %d", rc);
        std::vector<float> got = d_x.download();
        char what[96];
        snprintf(what, sizeof what, "head_rmsnorm T=%d nh=%d nkv=%d hd=%d pad=%d", T, nh, nkv, hd, pad);
        /* a 32-lane shuffle tree against cpu_dot_f32's order, |x| < ~8 after the norm: a
         * few ulps, as for rmsnorm (measured: max 9.5e-7) */
        CHECK_CLOSE_ARRAYS(what, got.data(), ref.data(), n, TOL_F32_NORM);
        /* v heads and the stride's padding are not touched */
        size_t untouched_bad = 0;
        for (int t = 0; t < T; t++)
            for (int64_t c = (int64_t)(nh + nkv) * hd; c < stride; c++) {
                size_t i = (size_t)t * stride + c;
                untouched_bad += memcmp(&got[i], &x[i], 4) != 0;
            }
        CHECK(untouched_bad == 0, "%s: %zu v / padding elements changed", what, untouched_bad);
        CHECK_GUARD(d_x);
        CHECK_GUARD(d_qn);
        CHECK_GUARD(d_kn);
    }
}

static void test_head_rmsnorm(void)
{
    head_case(1, 4, 4, 128, 0, 300);   /* GQA 1 */
    head_case(5, 6, 2, 64, 12, 301);   /* GQA 3, padded stride */
    head_case(3, 7, 1, 128, 4, 302);   /* GQA 7 */
    head_case(64, 16, 2, 128, 0, 303); /* GQA 8, Qwen3-like */
    head_case(2, 8, 1, 256, 0, 304);   /* head_dim 256 */
    head_case(33, 3, 1, 64, 0, 305);   /* task count not a multiple of the CTA's 4 warps */
}

static void test_head_rmsnorm_invalid(void)
{
    kbuf<float> d_x(4 * 80 * 3), d_n(80);
    int rc = cuda_head_rmsnorm(d_x.ptr, 4 * 80, d_n.ptr, d_n.ptr, 3, 2, 1, 80, EPS, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "head_dim 80: %d", rc);
    rc = cuda_head_rmsnorm(d_x.ptr, 4 * 64 + 2, d_n.ptr, d_n.ptr, 3, 2, 1, 64, EPS, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "row_stride %% 4 != 0: %d", rc);
    std::vector<float> o = d_x.download();
    for (float v : o) CHECK(isnan(v), "a rejected call wrote the buffer");
    CHECK_GUARD(d_x);
}

int main(void)
{
    RUN(test_rmsnorm_residual);
    RUN(test_rmsnorm_residual_generic);
    RUN(test_rmsnorm_residual_invalid);
    RUN(test_head_rmsnorm);
    RUN(test_head_rmsnorm_invalid);
    return test_summary();
}
