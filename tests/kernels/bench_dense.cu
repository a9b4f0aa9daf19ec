/* bench_dense.cu — the decode steps' linears on BF16 weights at Qwen2.5-7B shapes, our GEMV
 * (kernels/dense_gemv.cu, up to 8 tokens) and skinny tensor-core GEMM
 * (kernels/skinny_gemm.cu), each also launched with pdl (programmatic dependent launch:
 * rows *_pdl), beside cuBLAS's GEMM on the same buffers, at 1, 2, 4, 8 and 16 tokens:
 * n_in x n_out = 3584 x 37888 (fused gate/up), 18944 x 3584 (down), 3584 x 4608 (fused
 * QKV) and 3584 x 152064 (the LM head). Memory-bound: bytes = weights + x + y, against the
 * copy bandwidth; the weights rotate through enough copies to exceed the L2, so every call
 * streams them from HBM. b->tiny (emulator): small shapes, one pass, to prove it runs.
 * Rows dense_gemv_silu / dense_gemv+silu_mul and skinny_gemm_silu / skinny_gemm+silu_mul:
 * the gate/up GEMV or skinny GEMM fused with its SiLU·mul (what the backend runs where one
 * of them computes gate/up) against the two kernels it replaces, all as pdl launches, at
 * 1-16 tokens; bytes = weights + x + the BF16 output.
 */
#include "kbench.h"

#include "kernels/activation.h"
#include "kernels/dense_gemv.h"
#include "kernels/skinny_gemm.h"

#include <cublas_v2.h>

#include <string.h>

#include <vector>

static void bench_pair(struct kbench *b, cublasHandle_t h, int64_t n_in, int64_t n_out, int nt)
{
    const bool gemv = nt <= DENSE_GEMV_MAX_TOKENS && (!b->filter || strstr("dense_gemv_pdl", b->filter)),
               skinny = !b->filter || strstr("skinny_gemm_pdl", b->filter),
               theirs = !b->filter || strstr("cublas_gemv", b->filter);
    if (!gemv && !skinny && !theirs) return;
    const size_t wbytes = (size_t)n_in * n_out * 2;
    const int nc = b->tiny ? 1 : (int)(((size_t)256 << 20) / wbytes + 1);
    std::vector<void *> w(nc > 8 ? 8 : nc);
    for (void *&p : w) p = kbench_alloc_filled(wbytes, 0x11);
    void *x = kbench_alloc_filled((size_t)nt * n_in * 2, 0x11);
    float *y = (float *)kbench_alloc_filled((size_t)nt * n_out * 4, 0x11);
    const double bytes = (double)wbytes + 2.0 * nt * n_in + 4.0 * nt * n_out, flops = 2.0 * nt * n_in * n_out;
    char shape[64];
    snprintf(shape, sizeof shape, "BF16 T=%d %lldx%lld", nt, (long long)n_in, (long long)n_out);
    int it = 0;
    /* each of ours twice: launched plainly, then with pdl (back to back, each call's first
     * weight loads overlap the previous call's end) */
    for (int pdl = 0; pdl < 2 && gemv; pdl++) {
        double s = kbench_time(b, [&] {
            KB_CHECK(cuda_dense_gemv(DT_BF16, w[it++ % w.size()], n_in, n_out, x, y, n_out, nt, pdl, b->stream));
        });
        kbench_row(b, pdl ? "dense_gemv_pdl" : "dense_gemv", shape, s, bytes, flops, KB_MEMORY);
    }
    for (int pdl = 0; pdl < 2 && skinny; pdl++) {
        double s = kbench_time(b, [&] {
            KB_CHECK(cuda_skinny_gemm(DT_BF16, w[it++ % w.size()], n_in, n_out, x, y, n_out, nt, pdl, b->stream));
        });
        kbench_row(b, pdl ? "skinny_gemm_pdl" : "skinny_gemm", shape, s, bytes, flops, KB_MEMORY);
    }
    if (theirs) {
        const float one = 1.0f, zero = 0.0f;
        KB_CHECK(cublasSetStream(h, b->stream));
        double s = kbench_time(b, [&] {
            KB_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, nt, (int)n_in, &one, w[it++ % w.size()],
                                  CUDA_R_16BF, (int)n_in, x, CUDA_R_16BF, (int)n_in, &zero, y, CUDA_R_32F, (int)n_out,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        kbench_row(b, "cublas_gemv", shape, s, bytes, flops, KB_MEMORY);
    }
    for (void *p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(y);
}

/* The fused gate/up GEMV + SiLU·mul and the two-kernel path, nt tokens of a dim x 2 ffn
 * gate | up matrix. */
static void bench_gate_up_silu(struct kbench *b, int64_t dim, int64_t ffn, int nt)
{
    if (b->filter && !strstr("dense_gemv_silu dense_gemv+silu_mul skinny_gemm_silu skinny_gemm+silu_mul", b->filter))
        return;
    const size_t wbytes = (size_t)dim * 2 * ffn * 2;
    const int nc = b->tiny ? 1 : (int)(((size_t)256 << 20) / wbytes + 1);
    std::vector<void *> w(nc > 8 ? 8 : nc);
    for (void *&p : w) p = kbench_alloc_filled(wbytes, 0x11);
    void *x = kbench_alloc_filled((size_t)nt * dim * 2, 0x11), *act = kbench_alloc_filled((size_t)nt * ffn * 2, 0);
    float *gu = (float *)kbench_alloc_filled((size_t)nt * 2 * ffn * 4, 0x11);
    const double bytes = (double)wbytes + 2.0 * nt * dim + 2.0 * nt * ffn, flops = 2.0 * nt * dim * 2 * ffn;
    char shape[64];
    snprintf(shape, sizeof shape, "BF16 T=%d %lldx2x%lld pdl", nt, (long long)dim, (long long)ffn);
    int it = 0;
    typedef int (*silu_fn)(enum dtype, const void *, int64_t, int64_t, const void *, void *, enum dtype, int, int,
                           cudaStream_t);
    typedef int (*plain_fn)(enum dtype, const void *, int64_t, int64_t, const void *, float *, int64_t, int, int,
                            cudaStream_t);
    const struct { const char *fused, *two; silu_fn f; plain_fn p; bool ok; } kinds[] = {
        { "dense_gemv_silu", "dense_gemv+silu_mul", cuda_dense_gemv_silu, cuda_dense_gemv,
          nt <= DENSE_GEMV_MAX_TOKENS },
        { "skinny_gemm_silu", "skinny_gemm+silu_mul", cuda_skinny_gemm_silu, cuda_skinny_gemm, true },
    };
    for (const auto &k : kinds) {
        if (!k.ok) continue;
        double s = kbench_time(b, [&] {
            KB_CHECK(k.f(DT_BF16, w[it++ % w.size()], dim, ffn, x, act, DT_BF16, nt, 1, b->stream));
        });
        kbench_row(b, k.fused, shape, s, bytes, flops, KB_MEMORY);
        s = kbench_time(b, [&] {
            KB_CHECK(k.p(DT_BF16, w[it++ % w.size()], dim, 2 * ffn, x, gu, 2 * ffn, nt, 1, b->stream));
            KB_CHECK(cuda_silu_mul_rows(act, DT_BF16, gu, gu + ffn, 2 * ffn, nt, (int)ffn, NULL, 1, b->stream));
        });
        kbench_row(b, k.two, shape, s, bytes, flops, KB_MEMORY);
    }
    for (void *p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(act);
    cudaFree(gu);
}

static void bench_dense(struct kbench *b)
{
    const int64_t dim = b->tiny ? 256 : 3584, ffn = b->tiny ? 512 : 18944, vocab = b->tiny ? 64 : 152064,
                  qkv = b->tiny ? 384 : 4608;
    cublasHandle_t h;
    KB_CHECK(cublasCreate(&h));
    for (int nt : { 1, 2, 4, 8, 16 }) {
        bench_pair(b, h, dim, 2 * ffn, nt);
        bench_pair(b, h, ffn, dim, nt);
        bench_pair(b, h, dim, qkv, nt);
        bench_pair(b, h, dim, vocab, nt);
    }
    for (int nt : { 1, 2, 4, 8, 16 }) bench_gate_up_silu(b, dim, ffn, nt);
    cublasDestroy(h);
}
KBENCH_REGISTER(bench_dense);
