/* test_kernel_dense_gemv.cu — the two dense linear kernels, kernels/dense_gemv.cu (CUDA-core
 * GEMV, 1..8 tokens) and kernels/skinny_gemm.cu (tensor cores, 1..16 tokens), against
 * their CPU twin cpu_matmul_ref on fresh random weights and activations: BF16 and F16,
 * every token count each takes, rows of 8
 * elements (one chunk), 1000 (a partial last pass), 3584 and 18944 (Qwen2.5-7B's hidden and
 * MLP widths: two and ten passes of 8 chunks per lane), n_out from 1 to 4608 (a partial
 * last CTA), y a column slice of wider rows (ldy > n_out: the columns beside it must stay
 * untouched); the invalid arguments. Output poisoned before each call, guards checked on
 * every buffer after it. Every other case is a programmatic dependent launch (pdl = 1)
 * right after the kernel that writes its x (cuda_convert_f32 from F32, x poisoned before):
 * under the emulator every thread must wait for the previous grid (it checks that); on a
 * GPU a kernel that read x before waiting would read the poison.
 * cuda_dense_gemv_silu and cuda_skinny_gemm_silu (gate/up and SiLU·mul in one kernel): bit
 * for bit the two-kernel path each replaces (its plain kernel into a [T][2 ffn] buffer,
 * then cuda_silu_mul_rows),
 * every output dtype, odd ffn (the last CTA with one pair), and within the output dtype's
 * rounding of the CPU twins (cpu_matmul_ref, cpu_silu_mul_rows).
 */
#include "ktest.h"

extern "C" {
#include "backend/cpu/ops_fused.h"
#include "backend/cpu/quant.h"
}
#include "kernels/activation.h"
#include "kernels/dense_gemv.h"
#include "kernels/skinny_gemm.h"
#include "kernels/step.h"

/* The kernels share one signature and contract; each is tested up to its token limit. */
typedef int (*dense_fn)(enum dtype, const void *, int64_t, int64_t, const void *, float *, int64_t, int, int,
                        cudaStream_t);
struct dense_kernel {
    const char *name;
    dense_fn fn;
    int max_tokens;
};
static const struct dense_kernel kernels[] = { { "dense_gemv", cuda_dense_gemv, DENSE_GEMV_MAX_TOKENS },
                                               { "skinny_gemm", cuda_skinny_gemm, SKINNY_GEMM_MAX_TOKENS } };

/* Before a pdl launch: x poisoned, then written again from its F32 copy by the kernel the
 * launch follows (cuda_convert_f32), so a kernel that read x before waiting reads NaN. */
static void rewrite_x(kbuf<uint16_t> &d_x, const kbuf<float> &d_xf, enum dtype type, const char *what)
{
    d_x.poison();
    int rc = cuda_convert_f32(d_x.ptr, type, d_xf.ptr, (int64_t)d_xf.n, 0);
    CHECK(rc == 0, "%s: converting x returned %d", what, rc);
}

/* Inputs are 16-bit values widened exactly, so the GPU and the twin add the same F32
 * products in another order: |error| <= n_in * 2^-24 * sum |w x| (~1e-5 here: y ~ N(0, 1)),
 * so KTOL_F32's 1e-4. */
static void gemv_case(const struct dense_kernel &k, enum dtype type, int nt, int64_t n_in, int64_t n_out, int64_t pad,
                      int pdl, uint64_t seed)
{
    const int64_t ldy = n_out + pad;
    ktest_rng r(seed);
    std::vector<float> wf((size_t)(n_in * n_out)), xf((size_t)(nt * n_in));
    r.fill_normal(wf.data(), wf.size(), 1.0f / sqrtf((float)n_in));
    r.fill_normal(xf.data(), xf.size(), 1.0f);
    const bool bf = type == DT_BF16;
    std::vector<uint16_t> wh = bf ? ktest_to_bf16(wf.data(), wf.size()) : ktest_to_f16(wf.data(), wf.size());
    std::vector<uint16_t> xh = bf ? ktest_to_bf16(xf.data(), xf.size()) : ktest_to_f16(xf.data(), xf.size());
    std::vector<float> xw = bf ? ktest_from_bf16(xh.data(), xh.size()) : ktest_from_f16(xh.data(), xh.size());

    struct tensor wt = ktest_matrix(type, n_in, n_out, wh.data(), wh.size() * 2);
    std::vector<float> ref((size_t)(nt * n_out));
    cpu_matmul_ref(&wt, xw.data(), ref.data(), nt);

    kbuf<uint16_t> d_w(wh.size()), d_x(xh.size());
    kbuf<float> d_y((size_t)(nt * ldy)), d_xf(xf.size());
    d_w.upload(wh);
    d_x.upload(xh);
    d_xf.upload(xf);
    char what[112];
    snprintf(what, sizeof what, "%s %s T=%d %lldx%lld ldy=%lld%s", k.name, bf ? "bf16" : "f16", nt, (long long)n_in,
             (long long)n_out, (long long)ldy, pdl ? " pdl" : "");
    KTEST_SEEDS(s) {
        d_y.poison();
        if (pdl) rewrite_x(d_x, d_xf, type, what);
        int rc = k.fn(type, d_w.ptr, n_in, n_out, d_x.ptr, d_y.ptr, ldy, nt, pdl, 0);
        CHECK(rc == 0, "%s: returned %d", what, rc);
        std::vector<float> got = d_y.download(), body((size_t)(nt * n_out));
        bool beside_ok = true;
        for (int t = 0; t < nt; t++) {
            memcpy(body.data() + t * n_out, got.data() + t * ldy, sizeof(float) * (size_t)n_out);
            for (int64_t j = n_out; j < ldy; j++) beside_ok = beside_ok && isnan(got[(size_t)(t * ldy + j)]);
        }
        CHECK_CLOSE_ARRAYS(what, body.data(), ref.data(), body.size(), KTOL_F32);
        CHECK(beside_ok, "%s: wrote the columns beside y", what);
        CHECK_GUARD(d_w);
        CHECK_GUARD(d_x);
        CHECK_GUARD(d_y);
    }
}

/* Shapes above this many weights run at a few token counts only (emulator time; under
 * ASan the emulator is ~6x slower, and the threshold drops so that make asan fits CI). */
#if defined(__SANITIZE_ADDRESS__)
#define FEW_TOKENS_ABOVE (1 << 16)
#else
#define FEW_TOKENS_ABOVE (1 << 20)
#endif

static void test_dense_gemv(void)
{
    static const int64_t shapes[][2] = { { 8, 1 }, { 64, 37 }, { 1000, 9 }, { 3584, 64 }, { 256, 4608 }, { 18944, 24 } };
    uint64_t seed = 700;
    for (const auto &k : kernels)
        for (enum dtype type : { DT_BF16, DT_F16 })
            for (const auto &sh : shapes)
                for (int nt = 1; nt <= k.max_tokens; nt++) {
                    if (sh[0] * sh[1] > FEW_TOKENS_ABOVE && nt != 1 && nt != 3 && nt != 8 && nt != 16) continue;
                    gemv_case(k, type, nt, sh[0], sh[1], nt % 2 ? 0 : 5, (int)((seed >> 1) & 1), seed);
                    seed++;
                }
}

static size_t act_size(enum dtype t) { return t == DT_F32 ? 4 : 2; }

static std::vector<float> act_to_f32(const std::vector<uint8_t> &b, enum dtype t, size_t n)
{
    std::vector<float> out(n);
    if (t == DT_F32) memcpy(out.data(), b.data(), 4 * n);
    else {
        std::vector<uint16_t> h(n);
        memcpy(h.data(), b.data(), 2 * n);
        out = t == DT_F16 ? ktest_from_f16(h.data(), n) : ktest_from_bf16(h.data(), n);
    }
    return out;
}

/* The fused gate/up + SiLU·mul kernels and the plain kernel each replaces. */
typedef int (*silu_fn)(enum dtype, const void *, int64_t, int64_t, const void *, void *, enum dtype, int, int,
                       cudaStream_t);
struct silu_kernel {
    const char *name;
    silu_fn fn;
    dense_fn plain;
    int max_tokens;
};
static const struct silu_kernel silu_kernels[] = {
    { "dense_gemv_silu", cuda_dense_gemv_silu, cuda_dense_gemv, DENSE_GEMV_MAX_TOKENS },
    { "skinny_gemm_silu", cuda_skinny_gemm_silu, cuda_skinny_gemm, SKINNY_GEMM_MAX_TOKENS }
};

static void silu_case(const struct silu_kernel &k, enum dtype type, enum dtype adt, int nt, int64_t n_in, int64_t ffn,
                      int pdl, uint64_t seed)
{
    ktest_rng r(seed);
    std::vector<float> wf((size_t)(n_in * 2 * ffn)), xf((size_t)(nt * n_in));
    r.fill_normal(wf.data(), wf.size(), 2.0f / sqrtf((float)n_in)); /* gate ~ N(0, 4): SiLU's both sides */
    r.fill_normal(xf.data(), xf.size(), 1.0f);
    const bool bf = type == DT_BF16;
    std::vector<uint16_t> wh = bf ? ktest_to_bf16(wf.data(), wf.size()) : ktest_to_f16(wf.data(), wf.size());
    std::vector<uint16_t> xh = bf ? ktest_to_bf16(xf.data(), xf.size()) : ktest_to_f16(xf.data(), xf.size());
    std::vector<float> xw = bf ? ktest_from_bf16(xh.data(), xh.size()) : ktest_from_f16(xh.data(), xh.size());

    /* the CPU twins: the matmul, then SiLU·mul into adt, widened back for the comparison */
    struct tensor wt = ktest_matrix(type, n_in, 2 * ffn, wh.data(), wh.size() * 2);
    std::vector<float> gu((size_t)(nt * 2 * ffn));
    cpu_matmul_ref(&wt, xw.data(), gu.data(), nt);
    const size_t n = (size_t)(nt * ffn);
    std::vector<uint8_t> refb(n * act_size(adt));
    cpu_silu_mul_rows(refb.data(), adt, gu.data(), gu.data() + ffn, 2 * ffn, nt, (int)ffn);
    const std::vector<float> ref = act_to_f32(refb, adt, n);

    kbuf<uint16_t> d_w(wh.size()), d_x(xh.size());
    kbuf<float> d_xf(xf.size()), d_gu((size_t)(nt * 2 * ffn));
    kbuf<uint8_t> d_act(n * act_size(adt)), d_two(n * act_size(adt));
    d_w.upload(wh);
    d_x.upload(xh);
    d_xf.upload(xf);
    char what[112];
    snprintf(what, sizeof what, "%s %s->%s T=%d %lldx2x%lld%s", k.name, bf ? "bf16" : "f16", dtype_name(adt), nt,
             (long long)n_in, (long long)ffn, pdl ? " pdl" : "");
    KTEST_SEEDS(s) {
        d_act.poison();
        d_two.poison();
        if (pdl) rewrite_x(d_x, d_xf, type, what);
        int rc = k.fn(type, d_w.ptr, n_in, ffn, d_x.ptr, d_act.ptr, adt, nt, pdl, 0);
        CHECK(rc == 0, "%s: returned %d", what, rc);
        /* the two kernels it replaces */
        rc = k.plain(type, d_w.ptr, n_in, 2 * ffn, d_x.ptr, d_gu.ptr, 2 * ffn, nt, 0, 0);
        rc = rc ? rc : cuda_silu_mul_rows(d_two.ptr, adt, d_gu.ptr, d_gu.ptr + ffn, 2 * ffn, nt, (int)ffn, NULL, 0, 0);
        CHECK(rc == 0, "%s: the two-kernel path returned %d", what, rc);
        const std::vector<uint8_t> got = d_act.download(), two = d_two.download();
        CHECK(got == two, "%s: differs from the plain kernel + silu_mul", what);
        const std::vector<float> gotf = act_to_f32(got, adt, n);
        CHECK_CLOSE_ARRAYS(what, gotf.data(), ref.data(), n,
                           adt == DT_F32 ? KTOL_F32 : adt == DT_F16 ? KTOL_F16 : KTOL_BF16);
        CHECK_GUARD(d_w);
        CHECK_GUARD(d_x);
        CHECK_GUARD(d_act);
    }
}

static void test_dense_gemv_silu(void)
{
    static const int64_t shapes[][2] = { { 8, 1 }, { 64, 37 }, { 1000, 9 }, { 3584, 24 }, { 256, 1001 } };
    uint64_t seed = 900;
    for (const auto &k : silu_kernels)
        for (enum dtype type : { DT_BF16, DT_F16 })
            for (const auto &sh : shapes)
                for (int nt = 1; nt <= k.max_tokens; nt++) {
                    if ((sh[0] * sh[1] > 1 << 16 || nt > 8) && nt != 1 && nt != 2 && nt != 8 && nt != 16)
                        continue; /* emulator time */
                    const enum dtype adt = seed % 3 == 0 ? DT_F32 : seed % 3 == 1 ? DT_F16 : DT_BF16;
                    silu_case(k, type, adt, nt, sh[0], sh[1], (int)((seed >> 1) & 1), seed);
                    seed++;
                }
    /* invalid: an activation dtype it cannot write, no output, a misaligned x, F32 weights,
     * too many tokens */
    kbuf<uint16_t> d_w(2 * 4 * 64 + 8), d_x(SKINNY_GEMM_MAX_TOKENS * 64 + 8);
    kbuf<float> d_act(SKINNY_GEMM_MAX_TOKENS * 4);
    const int inval = (int)cudaErrorInvalidValue;
    for (const auto &k : silu_kernels) {
        CHECK(k.fn(DT_BF16, d_w.ptr, 64, 4, d_x.ptr, d_act.ptr, DT_Q8_0, 1, 0, 0) == inval, "%s: Q8_0 output", k.name);
        CHECK(k.fn(DT_BF16, d_w.ptr, 64, 4, d_x.ptr, NULL, DT_F32, 1, 0, 0) == inval, "%s: no output", k.name);
        CHECK(k.fn(DT_BF16, d_w.ptr, 64, 4, d_x.ptr + 1, d_act.ptr, DT_F32, 1, 0, 0) == inval, "%s: misaligned x",
              k.name);
        CHECK(k.fn(DT_F32, d_w.ptr, 64, 4, d_x.ptr, d_act.ptr, DT_F32, 1, 0, 0) == inval, "%s: F32 weights", k.name);
        CHECK(k.fn(DT_BF16, d_w.ptr, 64, 4, d_x.ptr, d_act.ptr, DT_F32, k.max_tokens + 1, 0, 0) == inval,
              "%s: too many tokens", k.name);
        CHECK(k.fn(DT_BF16, d_w.ptr, 64, 0, d_x.ptr, d_act.ptr, DT_F32, 1, 0, 0) == 0, "%s: no columns", k.name);
    }
    for (float v : d_act.download()) CHECK(isnan(v), "a rejected or empty call wrote the output");
    CHECK_GUARD(d_act);
}

static void test_dense_gemv_invalid(void)
{
    kbuf<uint16_t> d_w(64 * 4 + 8), d_x(SKINNY_GEMM_MAX_TOKENS * 64 + 8);
    kbuf<float> d_y(SKINNY_GEMM_MAX_TOKENS * 4);
    for (const auto &k : kernels) {
        struct { enum dtype type; int64_t n_in, ldy; int nt; int shift; const char *what; } bad[] = {
            { DT_F32, 64, 4, 1, 0, "F32 weights" },     { DT_Q8_0, 64, 4, 1, 0, "Q8_0 weights" },
            { DT_BF16, 60, 4, 1, 0, "n_in % 8" },        { DT_BF16, 64, 3, 1, 0, "ldy < n_out" },
            { DT_BF16, 64, 4, 0, 0, "no tokens" },       { DT_BF16, 64, 4, k.max_tokens + 1, 0, "too many tokens" },
            { DT_F16, 64, 4, 1, 1, "misaligned w, x" },
        };
        for (const auto &b : bad) {
            int rc = k.fn(b.type, d_w.ptr + b.shift, b.n_in, 4, d_x.ptr + b.shift, d_y.ptr, b.ldy, b.nt, 0, 0);
            CHECK(rc == (int)cudaErrorInvalidValue, "%s: %s: %d", k.name, b.what, rc);
        }
        CHECK(k.fn(DT_BF16, d_w.ptr, 64, 0, d_x.ptr, d_y.ptr, 0, 1, 1, 0) == 0, "%s: no rows", k.name);
    }
    for (float v : d_y.download()) CHECK(isnan(v), "a rejected or empty call wrote the output");
    CHECK_GUARD(d_y);
}

int main(void)
{
    RUN(test_dense_gemv);
    RUN(test_dense_gemv_invalid);
    RUN(test_dense_gemv_silu);
    return test_summary();
}
