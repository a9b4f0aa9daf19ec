/* bench_main.cu — main() of the kernel benchmark: ceilings first, then every registered
 * family (tests/kernels/bench_<family>.cu), one table.
 *
 *   build/tessera-kernel-bench [--tiny] [--once] [--filter NAME]
 *
 * --once launches each measured call exactly once (no warm-up, no loop), so a profiler
 * run (scripts/gpu-check.sh's ncu stage) sees one launch per row, in the table's order.
 *
 * Ceilings measured in the same run: device-to-device copy bandwidth (cudaMemcpyAsync of
 * 1 GiB, counting bytes read + written) and cuBLAS BF16 GEMM (8192^3, fp32 accumulate).
 * Memory-bound kernels are reported against the first, GEMM-like ones against the second.
 */
#include "kbench.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

struct kbench_entry {
    const char *name;
    kbench_fn fn;
};

static std::vector<kbench_entry> &registry()
{
    static std::vector<kbench_entry> r;
    return r;
}

int kbench_register(const char *name, kbench_fn fn)
{
    registry().push_back({ name, fn });
    return 0;
}

void *kbench_alloc_filled(size_t n, int byte)
{
    void *p;
    if (n < 16) n = 16;
    KB_CHECK(cudaMalloc(&p, n));
    KB_CHECK(cudaMemset(p, byte, n));
    return p;
}

double kbench_time(struct kbench *b, const std::function<void()> &launch)
{
    int warm = b->once ? 0 : b->tiny ? 1 : 3, iters = b->once || b->tiny ? 1 : 20;
    for (int i = 0; i < warm; i++) launch();
    cudaEvent_t e0, e1;
    KB_CHECK(cudaEventCreate(&e0));
    KB_CHECK(cudaEventCreate(&e1));
    KB_CHECK(cudaEventRecord(e0, b->stream));
    for (int i = 0; i < iters; i++) launch();
    KB_CHECK(cudaEventRecord(e1, b->stream));
    KB_CHECK(cudaEventSynchronize(e1));
    KB_CHECK(cudaGetLastError());
    float ms = 0.0f;
    KB_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return (double)ms / 1e3 / iters;
}

void kbench_row(struct kbench *b, const char *kernel, const char *shape, double seconds,
                double bytes, double flops, enum kbench_bound bound)
{
    if (b->filter && !strstr(kernel, b->filter)) return;
    if (b->rows++ == 0)
        printf("%-34s %-34s %10s %10s %10s %7s\n", "kernel", "shape", "us", "GB/s", "TFLOP/s", "ratio");
    double gbs = bytes / seconds / 1e9, tfs = flops / seconds / 1e12;
    double ratio = bound == KB_MEMORY ? gbs / b->copy_gbs : tfs / b->gemm_tflops;
    printf("%-34s %-34s %10.2f %10.1f %10.2f %6.0f%%  (of %s)\n", kernel, shape, seconds * 1e6, gbs,
           tfs, 100.0 * ratio, bound == KB_MEMORY ? "copy bw" : "cuBLAS bf16");
    fflush(stdout);
}

static void measure_copy(struct kbench *b)
{
    size_t n = b->tiny ? (1u << 20) : (1ull << 30);
    void *src, *dst;
    KB_CHECK(cudaMalloc(&src, n));
    KB_CHECK(cudaMalloc(&dst, n));
    KB_CHECK(cudaMemset(src, 1, n));
    double s = kbench_time(b, [&] { KB_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, b->stream)); });
    b->copy_gbs = 2.0 * (double)n / s / 1e9;
    cudaFree(src);
    cudaFree(dst);
}

static void measure_gemm(struct kbench *b)
{
    int n = b->tiny ? 64 : 8192;
    size_t bytes = (size_t)n * n * sizeof(__nv_bfloat16);
    void *a, *bb, *c;
    KB_CHECK(cudaMalloc(&a, bytes));
    KB_CHECK(cudaMalloc(&bb, bytes));
    KB_CHECK(cudaMalloc(&c, bytes));
    KB_CHECK(cudaMemset(a, 0x3c, bytes)); /* bf16 0x3c3c ~ 0.0115: finite, nonzero */
    KB_CHECK(cudaMemset(bb, 0x3c, bytes));
    cublasHandle_t h;
    KB_CHECK(cublasCreate(&h));
    KB_CHECK(cublasSetStream(h, b->stream));
    float one = 1.0f, zero = 0.0f;
    double s = kbench_time(b, [&] {
        KB_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, bb,
                            CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    });
    b->gemm_tflops = 2.0 * n * (double)n * n / s / 1e12;
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(bb);
    cudaFree(c);
}

int main(int argc, char **argv)
{
    struct kbench b = {};
#ifdef TESSERA_EMU
    b.tiny = true;
#endif
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tiny")) b.tiny = true;
        else if (!strcmp(argv[i], "--once")) b.once = true;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) b.filter = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--tiny] [--once] [--filter NAME]\n", argv[0]);
            return 2;
        }
    }
    cudaDeviceProp p;
    KB_CHECK(cudaGetDeviceProperties(&p, 0));
    KB_CHECK(cudaStreamCreate(&b.stream));
    measure_copy(&b);
    measure_gemm(&b);
    printf("device: %s (%d SMs)%s\n", p.name, p.multiProcessorCount,
#ifdef TESSERA_EMU
           " -- CUDA-on-CPU EMULATOR: these numbers mean nothing; this run only proves the bench works"
#else
           ""
#endif
    );
    printf("ceilings: device-to-device copy %.1f GB/s (read + write), cuBLAS BF16 GEMM %.1f TFLOP/s\n",
           b.copy_gbs, b.gemm_tflops);
    if (b.once) printf("--once: one cold launch per row (for a profiler); the times and ratios are not benchmarks\n");
    std::vector<kbench_entry> all = registry();
    std::sort(all.begin(), all.end(), [](const kbench_entry &x, const kbench_entry &y) {
        return strcmp(x.name, y.name) < 0;
    });
    for (const kbench_entry &e : all) e.fn(&b);
    KB_CHECK(cudaStreamDestroy(b.stream));
    printf("%d rows\n", b.rows);
    return 0;
}
