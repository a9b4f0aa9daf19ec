/* kbench.h — the kernel benchmark harness (build/tessera-kernel-bench on a GPU,
 * build/tests/tool_kernel_bench_emu under the emulator).
 *
 * Each kernel family registers one function in tests/kernels/bench_<family>.cu:
 *
 *   static void bench_norm(struct kbench *b)
 *   {
 *       ... allocate at Qwen2.5-7B shapes (b->tiny: a few rows only) ...
 *       double s = kbench_time(b, [&] { cuda_rmsnorm(..., b->stream); });
 *       kbench_row(b, "rmsnorm+residual", "T=64 d=3584", s, bytes_moved, 0.0, KB_MEMORY);
 *   }
 *   KBENCH_REGISTER(bench_norm);
 *
 * bench_main.cu measures the ceilings first, in the same run (device-to-device copy
 * bandwidth; cuBLAS BF16 GEMM rate), then runs every registered function and prints one
 * table row per measurement: achieved GB/s or TFLOP/s and its ratio to the ceiling. Under
 * the emulator every number is meaningless (it says so); the run only proves the bench
 * works.
 */
#ifndef TESSERA_KBENCH_H
#define TESSERA_KBENCH_H

#ifndef TESSERA_EMU
#include <cuda_runtime.h>
#endif

#include <functional>
#include <stdio.h>
#include <stdlib.h>

enum kbench_bound { KB_MEMORY, KB_COMPUTE };

struct kbench {
    cudaStream_t stream;
    bool tiny;            /* emulator or --tiny: smallest shapes, one timed iteration */
    bool once;            /* --once: one launch per row, no warm-up (for a profiler, whose
                             launch counts then map to rows); the times are one cold call */
    const char *filter;   /* only functions/rows whose name contains this (NULL: all) */
    double copy_gbs;      /* measured device-to-device copy bandwidth, GB/s (read + write) */
    double gemm_tflops;   /* measured cuBLAS BF16 GEMM rate, TFLOP/s */
    int rows;             /* rows printed so far */
};

/* Mean seconds per call of launch() over a timed loop (after warm-up), by CUDA events on
 * b->stream; b->once: exactly one call. */
double kbench_time(struct kbench *b, const std::function<void()> &launch);

/* Prints one row: bytes moved and flops done by one call. The ratio column is against
 * copy_gbs (KB_MEMORY) or gemm_tflops (KB_COMPUTE). */
void kbench_row(struct kbench *b, const char *kernel, const char *shape, double seconds,
                double bytes, double flops, enum kbench_bound bound);

/* Exits with the call site when a CUDA runtime / cuBLAS / launcher call fails: a bench
 * that cannot run its kernel has nothing to report. */
#define KB_CHECK(call)                                                                        \
    do {                                                                                      \
        int e_ = (int)(call);                                                                 \
        if (e_ != 0) {                                                                        \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #call, e_);       \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

/* n bytes of device memory (at least 16), every byte `byte` — chosen by the caller so
 * that every element type it reads is finite (0 everywhere; 0x3c: F32/BF16 ~0.0115,
 * e4m3 1.5; 0x11: fp16 scales ~6e-4). Exits on failure; the caller cudaFree()s it. */
void *kbench_alloc_filled(size_t n, int byte);

typedef void (*kbench_fn)(struct kbench *b);
int kbench_register(const char *name, kbench_fn fn);
#define KBENCH_REGISTER(fn) static const int kbench_reg_##fn = kbench_register(#fn, fn)

#endif
