/* peak.h — this CPU's compute peak for the instructions the matmul kernels are built on,
 * measured on a thread pool: a register-only loop (no loads or stores in the loop, more
 * independent accumulators than latency x throughput needs) of one instruction on every
 * pool thread. A matmul kernel cannot beat it; kernel rate / peak is its figure of merit
 * (what `tessera bench` and tests/c/tool_bench_matmul report for prefill).
 *
 * Ops are counted as a matmul counts FLOPs: 2 per multiply-add (an int8 product summed
 * into an accumulator counts 2, like an f32 FMA lane).
 */
#ifndef TESSERA_BACKEND_CPU_PEAK_H
#define TESSERA_BACKEND_CPU_PEAK_H

#include "backend/cpu/quant.h"

#include <stdbool.h>
#include <stddef.h>

struct threadpool;
struct quant_impl;

enum cpu_peak_kind {
    CPU_PEAK_I8_DPBUSD_ZMM = 0, /* vpdpbusd zmm (AVX512-VNNI): 64 u8 x s8 products */
    CPU_PEAK_I8_DPBUSD_YMM,     /* vpdpbusd ymm (AVX512-VNNI/VL or AVX-VNNI): 32 products */
    CPU_PEAK_I8_MADDUBS_YMM,    /* vpmaddubsw + vpmaddwd ymm (AVX2): 32 products per pair */
    CPU_PEAK_F32_FMA_ZMM,       /* vfmadd231ps zmm (AVX-512F): 16 FMAs */
    CPU_PEAK_F32_FMA_YMM,       /* vfmadd231ps ymm (AVX2 + FMA): 8 FMAs */
    CPU_PEAK_F32_SCALAR,        /* scalar f32 multiply + add (portable kernels, float weights) */
    CPU_PEAK_I32_SCALAR,        /* scalar int32 multiply + add (portable kernels, quantized) */
    CPU_PEAK_BF16_DPBF16_ZMM,   /* vdpbf16ps zmm (AVX512_BF16): 32 bf16 products */
    CPU_PEAK_KIND_COUNT_
};

/* Short name of the instruction and its operand type, e.g. "vpdpbusd zmm (int8)".
 * Static string; any thread. */
const char *cpu_peak_kind_name(enum cpu_peak_kind k);

/* Whether this build has the loop of k and this CPU runs its instructions (checked at run
 * time with the CPU's feature flags). The scalar kinds are always available. Any thread. */
bool cpu_peak_kind_available(enum cpu_peak_kind k);

/* The instruction the matmul kernels of impl (a kernel set from quant_kernels.h; NULL:
 * quant_impl_best(), what cpu_matmul uses) run for prefill (num_tokens >= 2) on weights
 * of type wtype: the batched AVX-512 kernels where impl has them for wtype, else the
 * per-token dot of that type. Any thread. */
enum cpu_peak_kind cpu_peak_kind_for(const struct quant_impl *impl, enum dtype wtype);

/* Measures the peak of k on every thread of tp at once: each thread runs the loop for
 * about `seconds` (0 picks 0.05 s), best of `reps` (0 picks 3) runs, since other processes
 * sharing the cores only lower it. Writes G(FL)OP/s of the whole pool to *gops.
 * ERR_UNSUPPORTED when k is not available (cpu_peak_kind_available). Call from the pool's
 * owner thread (tp_run); takes about reps x seconds. */
int cpu_peak_measure(struct threadpool *tp, enum cpu_peak_kind k, double seconds, int reps, double *gops,
                     char *err, size_t errlen);

#endif
