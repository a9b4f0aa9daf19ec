/* test_kernel_activation.cu — kernels/activation.cu (SiLU·mul) against its CPU twin
 * cpu_silu_mul_rows (cpu_silu_mul per row) on fresh random inputs: tokens 1 / 3 / 64 / 257,
 * ffn 64, 896, 1000 (the last CTA chunk partial), 3584, 5120, F32 / F16 / BF16 outputs, the
 * fused gate|up buffer and separate padded buffers, gates large enough that exp(-g)
 * overflows, and the scalar path (odd ffn, unaligned pointers); invalid arguments. Output
 * poisoned before the call, guards checked on every buffer after it.
 */
#include "ktest_rowwise.h"

extern "C" {
#include "backend/cpu/ops_fused.h"
#include "util/err.h"
}
#include "kernels/activation.h"
#include "kernels/quant_matmul.h"

static const enum dtype ACT_TYPES[3] = { DT_F32, DT_F16, DT_BF16 };

/* F32 bound: the device expf is within 2 ulps (glibc's within 1; under the emulator both
 * are glibc's and the results are bit-identical), then one division and one product: a few
 * ulps of |out| <= |g| |u| (gates N(0, 4^2), up N(0, 1): |out| < ~80, ulp 7.6e-6), so
 * < 5e-5 absolute. F16/BF16: the ktest.h defaults plus act_compare's one-code bound. */
static ktol tol_for(enum dtype dt)
{
    static const ktol f32 = { 1e-13, 5e-5 };
    return dt == DT_F32 ? f32 : dt == DT_F16 ? KTOL_F16 : KTOL_BF16;
}

/* fused: one [T][2 ffn] buffer (gate first); else separate gate and up rows of ffn + pad.
 * shift: elements of offset inside every device buffer (odd: unaligned, the scalar path). */
static void silu_case(int T, int ffn, enum dtype dt, bool fused, int pad, int shift, uint64_t seed)
{
    const int64_t stride = fused ? 2 * (int64_t)ffn : ffn + pad;
    const size_t n_in = (size_t)T * stride, n_out = (size_t)T * ffn, es = act_size(dt);
    ktest_rng rng(seed);
    std::vector<float> a(n_in), b(fused ? 0 : n_in);
    rng.fill_normal(a.data(), n_in, 4.0f);
    if (!fused) rng.fill_normal(b.data(), n_in, 1.0f);
    /* a few gates where exp(-g) overflows / underflows F32 */
    if (n_in > 8) {
        a[1] = -100.0f;
        a[3] = 95.0f;
        a[5] = -88.5f;
    }
    const float *gate = a.data(), *up = fused ? a.data() + ffn : b.data();
    std::vector<unsigned char> ref(n_out * es);
    int rc = cpu_silu_mul_rows(ref.data(), dt, gate, up, stride, T, ffn);
    CHECK(rc == 0, "cpu_silu_mul_rows returned %d", rc);

    kbuf<float> d_a(n_in + shift), d_b(fused ? 1 : n_in + shift);
    kbuf<unsigned char> d_out((n_out + shift) * es);
    KCHECK_CUDA(cudaMemcpy(d_a.ptr + shift, a.data(), n_in * 4, cudaMemcpyHostToDevice));
    if (!fused) KCHECK_CUDA(cudaMemcpy(d_b.ptr + shift, b.data(), n_in * 4, cudaMemcpyHostToDevice));
    const float *d_gate = d_a.ptr + shift, *d_up = fused ? d_a.ptr + shift + ffn : d_b.ptr + shift;
    char what[96];
    snprintf(what, sizeof what, "silu_mul T=%d ffn=%d %s %s pad=%d shift=%d", T, ffn, act_name(dt),
             fused ? "fused" : "separate", pad, shift);
    /* F32 rows of whole 32-blocks on the fast path also come out quantized (qact) on runs 0,
     * 2, ...: the bytes cuda_quantize_act makes from out */
    const bool quant = dt == DT_F32 && ffn % 32 == 0 && stride % 4 == 0 && shift == 0;
    const size_t qbytes = cuda_quant_act_size(ffn, T);
    kbuf<uint8_t> d_qa(quant ? qbytes : 1), d_qref(quant ? qbytes : 1);
    KTEST_SEEDS(s) {
        const bool q = quant && s != 1;
        d_out.poison();
        d_qa.poison();
        d_qref.poison();
        rc = cuda_silu_mul_rows(d_out.ptr + shift * es, dt, d_gate, d_up, stride, T, ffn, q ? d_qa.ptr : NULL,
                                (s + T) & 1, 0);
        CHECK(rc == 0, "%s: cuda_silu_mul_rows returned %d", what, rc);
        if (q) {
            CHECK(cuda_quantize_act(reinterpret_cast<const float *>(d_out.ptr), ffn, T, d_qref.ptr, 0, 0) == 0,
                  "cuda_quantize_act failed");
            CHECK(d_qa.download() == d_qref.download(), "%s: the quantized output differs from cuda_quantize_act's",
                  what);
            CHECK_GUARD(d_qa);
        }
        std::vector<unsigned char> got = d_out.download();
        std::vector<unsigned char> body(got.begin() + shift * es, got.end());
        CHECK(act_compare(what, body, ref, dt, n_out, tol_for(dt)), "%s: out differs from the twin", what);
        for (size_t i = 0; i < shift * es; i++) CHECK(got[i] == 0xff, "%s: out written before the rows", what);
        CHECK_GUARD(d_a);
        CHECK_GUARD(d_b);
        CHECK_GUARD(d_out);
    }
}

static void test_silu_mul(void)
{
    static const int shapes[][2] = {
        { 1, 64 }, { 3, 64 }, { 257, 64 }, { 1, 896 }, { 64, 896 }, { 3, 1000 }, { 257, 1000 },
        { 1, 3584 }, { 64, 3584 }, { 1, 5120 }, { 3, 5120 },
    };
    uint64_t seed = 500;
    int i = 0;
    for (const auto &sh : shapes)
        for (enum dtype dt : ACT_TYPES) {
            /* alternate the input layout so both meet every shape over the dtypes */
            bool fused = (i++ % 2) == 0;
            silu_case(sh[0], sh[1], dt, fused, fused ? 0 : 12, 0, seed++);
        }
}

static void test_silu_mul_generic(void)
{
    uint64_t seed = 600;
    for (enum dtype dt : ACT_TYPES) {
        silu_case(3, 37, dt, true, 0, 0, seed++);    /* odd ffn: unaligned up half */
        silu_case(2, 1000, dt, false, 4, 1, seed++); /* every pointer unaligned */
        silu_case(5, 2049, dt, false, 3, 0, seed++); /* odd, two CTAs per row */
    }
}

static void test_silu_mul_invalid(void)
{
    kbuf<float> d_in(128), d_out(64);
    int rc = cuda_silu_mul_rows(d_out.ptr, DT_Q4_K, d_in.ptr, d_in.ptr + 64, 128, 1, 64, NULL, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "Q4_K output: %d", rc);
    rc = cuda_silu_mul_rows(d_out.ptr, DT_F32, d_in.ptr, d_in.ptr + 64, 32, 1, 64, NULL, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "in_stride < ffn: %d", rc);
    /* a quantized output needs F32 out, whole 32-blocks, the fast path and an aligned buffer */
    kbuf<uint8_t> d_qa(cuda_quant_act_size(64, 1) + 16);
    rc = cuda_silu_mul_rows(d_out.ptr, DT_BF16, d_in.ptr, d_in.ptr + 64, 128, 1, 64, d_qa.ptr, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "quantized BF16 out: %d", rc);
    rc = cuda_silu_mul_rows(d_out.ptr, DT_F32, d_in.ptr, d_in.ptr + 48, 96, 1, 48, d_qa.ptr, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "quantized ffn 48: %d", rc);
    rc = cuda_silu_mul_rows(d_out.ptr, DT_F32, d_in.ptr + 1, d_in.ptr + 65, 128, 1, 64, d_qa.ptr, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "quantized off the fast path: %d", rc);
    rc = cuda_silu_mul_rows(d_out.ptr, DT_F32, d_in.ptr, d_in.ptr + 64, 128, 1, 64, d_qa.ptr + 8, 0, 0);
    CHECK(rc == (int)cudaErrorInvalidValue, "unaligned quantized output: %d", rc);
    rc = cuda_silu_mul_rows(d_out.ptr, DT_F32, d_in.ptr, d_in.ptr + 64, 128, 0, 64, d_qa.ptr, 1, 0);
    CHECK(rc == 0, "zero tokens: %d", rc);
    std::vector<float> o = d_out.download();
    for (float v : o) CHECK(isnan(v), "a rejected or empty call wrote the output");
    CHECK_GUARD(d_out);
    CHECK(cpu_silu_mul_rows(NULL, DT_Q4_K, NULL, NULL, 0, 1, 64) == ERR_INVALID, "twin took Q4_K");
}

int main(void)
{
    RUN(test_silu_mul);
    RUN(test_silu_mul_generic);
    RUN(test_silu_mul_invalid);
    return test_summary();
}
