/* bench_quant.cu — benchmarks of the quantized matmul (kernels/quant_matmul.cu) and the
 * embedding gather (kernels/embedding.cu) at Qwen2.5-7B shapes: n_in x n_out = 3584 x 18944
 * (gate/up) and 18944 x 3584 (down), vocabulary 152064.
 *
 *   qmm_gemv*     cuda_quant_matmul at 1 and 8 tokens (activation quantization + GEMV, what
 *                 the backend calls), memory-bound: bytes = weights + x + y, against the
 *                 copy bandwidth. Target (issue 8): >= 75% for Q8_0 and Q4_K at 3584 x 18944.
 *                 qmm_gemv_staged*: Q4_K with its weights staged through shared memory
 *                 (direct = 0), then a line of the direct/staged time ratios.
 *                 The weights rotate through enough copies to exceed the L2 (50 MB), so
 *                 every call streams them from HBM.
 *   qmm_bf16      cuda_quant_matmul at 512 tokens (dequantize to BF16 in L2-sized slices +
 *                 cuBLAS), in TFLOP/s against the cuBLAS BF16 ceiling, beside
 *   cublas_bf16   cuBLAS alone on BF16 weights of the same shape (the path's upper bound).
 *   qmm_dequant   cuda_dequant_bf16 of a whole matrix (bytes = quantized in + BF16 out).
 *   embedding     cuda_embedding of 512 tokens (bytes = rows read + F32 written).
 * b->tiny (emulator): small shapes, one pass, to prove the bench runs.
 */
#include "kbench.h"

#include "kernels/embedding.h"
#include "kernels/quant_matmul.h"

#include <cublas_v2.h>

extern "C" {
#include "util/tensor.h"
}

#include <stdlib.h>
#include <string.h>

#include <vector>

static bool qwants(const struct kbench *b, const char *row) { return !b->filter || strstr(row, b->filter); }

/* Enough copies of a weight of `bytes` that cycling through them exceeds the L2. */
static int qcopies(const struct kbench *b, size_t bytes)
{
    if (b->tiny) return 1;
    size_t c = ((size_t)256 << 20) / bytes + 1;
    return c > 8 ? 8 : (int)c;
}

/* One qmm_gemv row; the seconds per call (0 when filtered out). direct = 0: the row
 * qmm_gemv_staged (Q4_K's weights through shared memory, as before its direct loads). */
static double bench_gemv(struct kbench *b, enum dtype type, int64_t n_in, int64_t n_out, int nt, int direct = 1)
{
    const char *row = direct ? (nt == 1 ? "qmm_gemv" : "qmm_gemv_t8") : (nt == 1 ? "qmm_gemv_staged" : "qmm_gemv_staged_t8");
    if (!qwants(b, row)) return 0.0;
    size_t wbytes = dtype_row_bytes(type, n_in) * (size_t)n_out;
    int nc = qcopies(b, wbytes);
    std::vector<void *> w(nc);
    for (int i = 0; i < nc; i++) w[i] = kbench_alloc_filled(wbytes, 0x11);
    float *x = (float *)kbench_alloc_filled((size_t)nt * n_in * 4, 0x11), *y = (float *)kbench_alloc_filled((size_t)nt * n_out * 4, 0x11);
    size_t wsz = cuda_quant_matmul_workspace_size(type, n_in, n_out, nt);
    void *ws = kbench_alloc_filled(wsz, 0x11);
    int it = 0;
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_quant_matmul(type, w[it++ % nc], n_in, n_out, x, y, n_out, nt, ws, wsz, nullptr, direct, 0,
                                   b->stream));
    });
    char shape[64];
    snprintf(shape, sizeof shape, "%s T=%d %lldx%lld", dtype_name(type), nt, (long long)n_in, (long long)n_out);
    kbench_row(b, row, shape, s, (double)wbytes + 4.0 * nt * (n_in + n_out), 2.0 * nt * n_in * n_out, KB_MEMORY);
    for (void *p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(y);
    cudaFree(ws);
    return s;
}

static void bench_large(struct kbench *b, cublasHandle_t h, enum dtype type, int64_t n_in, int64_t n_out, int nt)
{
    if (!qwants(b, "qmm_bf16") && !qwants(b, "qmm_dequant")) return;
    size_t wbytes = dtype_row_bytes(type, n_in) * (size_t)n_out;
    void *w = kbench_alloc_filled(wbytes, 0x11);
    float *x = (float *)kbench_alloc_filled((size_t)nt * n_in * 4, 0x11), *y = (float *)kbench_alloc_filled((size_t)nt * n_out * 4, 0x11);
    size_t wsz = cuda_quant_matmul_workspace_size(type, n_in, n_out, nt);
    void *ws = kbench_alloc_filled(wsz, 0x11);
    char shape[64];
    snprintf(shape, sizeof shape, "%s T=%d %lldx%lld", dtype_name(type), nt, (long long)n_in, (long long)n_out);
    const double flops = 2.0 * nt * n_in * n_out;
    if (qwants(b, "qmm_bf16")) {
        double s = kbench_time(b, [&] {
            KB_CHECK(cuda_quant_matmul(type, w, n_in, n_out, x, y, n_out, nt, ws, wsz, h, 1, 0, b->stream));
        });
        kbench_row(b, "qmm_bf16", shape, s, (double)wbytes + 4.0 * nt * (n_in + n_out), flops, KB_COMPUTE);
    }
    if (qwants(b, "qmm_dequant")) {
        void *out = kbench_alloc_filled((size_t)n_in * n_out * 2, 0x11);
        double s = kbench_time(b, [&] { KB_CHECK(cuda_dequant_bf16(type, w, n_in, 0, n_out, out, b->stream)); });
        snprintf(shape, sizeof shape, "%s %lldx%lld", dtype_name(type), (long long)n_in, (long long)n_out);
        kbench_row(b, "qmm_dequant_bf16", shape, s, (double)wbytes + 2.0 * n_in * n_out, 0.0, KB_MEMORY);
        cudaFree(out);
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    cudaFree(ws);
}

/* cuBLAS alone, BF16 weights and activations -> F32, the shape of bench_large. */
static void bench_cublas(struct kbench *b, cublasHandle_t h, int64_t n_in, int64_t n_out, int nt)
{
    if (!qwants(b, "cublas_bf16")) return;
    void *w = kbench_alloc_filled((size_t)n_in * n_out * 2, 0x11), *x = kbench_alloc_filled((size_t)nt * n_in * 2, 0x11);
    float *y = (float *)kbench_alloc_filled((size_t)nt * n_out * 4, 0x11);
    const float one = 1.0f, zero = 0.0f;
    KB_CHECK(cublasSetStream(h, b->stream));
    double s = kbench_time(b, [&] {
        KB_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, nt, (int)n_in, &one, w, CUDA_R_16BF, (int)n_in, x,
                            CUDA_R_16BF, (int)n_in, &zero, y, CUDA_R_32F, (int)n_out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    });
    char shape[64];
    snprintf(shape, sizeof shape, "BF16 T=%d %lldx%lld", nt, (long long)n_in, (long long)n_out);
    kbench_row(b, "cublas_bf16", shape, s, 2.0 * n_in * n_out + 2.0 * nt * n_in + 4.0 * nt * n_out,
               2.0 * nt * n_in * n_out, KB_COMPUTE);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
}

static void bench_embedding(struct kbench *b, enum dtype type, int64_t vocab, int64_t dim, int nt)
{
    if (!qwants(b, "embedding")) return;
    size_t rb = dtype_row_bytes(type, dim);
    void *table = kbench_alloc_filled(rb * (size_t)vocab, 0x11);
    std::vector<int32_t> ids(nt);
    for (int t = 0; t < nt; t++) ids[t] = (int32_t)(((uint64_t)t * 2654435761u) % (uint64_t)vocab);
    int32_t *d_ids;
    KB_CHECK(cudaMalloc((void **)&d_ids, nt * sizeof(int32_t)));
    KB_CHECK(cudaMemcpy(d_ids, ids.data(), nt * sizeof(int32_t), cudaMemcpyHostToDevice));
    float *out = (float *)kbench_alloc_filled((size_t)nt * dim * 4, 0x11);
    double s = kbench_time(b, [&] { KB_CHECK(cuda_embedding(type, table, vocab, dim, d_ids, nt, out, b->stream)); });
    char shape[64];
    snprintf(shape, sizeof shape, "%s T=%d d=%lld", dtype_name(type), nt, (long long)dim);
    kbench_row(b, "embedding", shape, s, (double)nt * (rb + 4.0 * dim + 4.0), 0.0, KB_MEMORY);
    cudaFree(table);
    cudaFree(d_ids);
    cudaFree(out);
}

static void bench_quant(struct kbench *b)
{
    const int64_t dim = b->tiny ? 256 : 3584, ffn = b->tiny ? 512 : 18944, vocab = b->tiny ? 64 : 152064;
    /* Q4_K's direct weight loads against the staged ones, side by side in this run (their
     * time ratios printed after the rows). The one-token rows of Q8_0 and Q4_K come first:
     * gpu-check profiles the first six quant_gemv launches. */
    auto q4k_ratio = [&](int64_t ni, int64_t no, int nt) {
        const double d = bench_gemv(b, DT_Q4_K, ni, no, nt), st = bench_gemv(b, DT_Q4_K, ni, no, nt, 0);
        return d > 0.0 && st > 0.0 ? d / st : 0.0;
    };
    double ratio[4];
    bench_gemv(b, DT_Q8_0, dim, ffn, 1);
    bench_gemv(b, DT_Q8_0, ffn, dim, 1);
    ratio[0] = q4k_ratio(dim, ffn, 1);
    ratio[1] = q4k_ratio(ffn, dim, 1);
    for (enum dtype t : { DT_Q6_K, DT_Q4_0 }) {
        bench_gemv(b, t, dim, ffn, 1);
        bench_gemv(b, t, ffn, dim, 1);
    }
    bench_gemv(b, DT_Q8_0, dim, ffn, 8);
    bench_gemv(b, DT_Q8_0, ffn, dim, 8);
    ratio[2] = q4k_ratio(dim, ffn, 8);
    ratio[3] = q4k_ratio(ffn, dim, 8);
    if (ratio[0] > 0.0)
        printf("qmm_gemv Q4_K direct/staged time: T=1 %lldx%lld %.2f, %lldx%lld %.2f; T=8 %.2f, %.2f%s\n",
               (long long)dim, (long long)ffn, ratio[0], (long long)ffn, (long long)dim, ratio[1], ratio[2], ratio[3],
               b->tiny ? " (emulator: meaningless)" : "");
    cublasHandle_t h;
    KB_CHECK(cublasCreate(&h));
    const int big = b->tiny ? 16 : 512;
    for (enum dtype t : { DT_Q8_0, DT_Q4_K }) bench_large(b, h, t, dim, ffn, big);
    bench_cublas(b, h, dim, ffn, big);
    cublasDestroy(h);
    for (enum dtype t : { DT_Q4_K, DT_Q6_K, DT_F16 }) bench_embedding(b, t, vocab, dim, b->tiny ? 8 : 512);
}
KBENCH_REGISTER(bench_quant);
