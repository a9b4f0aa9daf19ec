/* l2_hint.h — an L2 prefetch a kernel issues on behalf of the kernels after it.
 *
 * At small batch a decode step alternates kernels that stream weights from memory (the
 * GEMVs) with small ones (RMSNorm, RoPE + KV write, attention) during which memory sits
 * nearly idle. A kernel given a hint asks the L2 to fetch [p, p + bytes), the next
 * linear's weights, as soon as its own inputs are ready (after ts_pdl_wait), so those
 * bytes arrive during the idle window and the GEMV after it finds them in the L2 instead
 * of memory. A hint changes no result: the kernel's outputs are the same bits with or
 * without one.
 *
 * The kernel side is ts_l2_prefetch (common.cuh): cp.async.bulk.prefetch.L2 on sm_90+,
 * nothing below. The backend's use (which weights, how many bytes, which steps):
 * src/backend/cuda/forward.cu and docs/cuda-backend.md, "L2 prefetch".
 *
 * Launchers that take one accept NULL or bytes == 0 (no prefetch); otherwise p must be
 * 16-byte aligned, bytes a multiple of 16, and [p, p + bytes) inside one device
 * allocation (cudaErrorInvalidValue for the first two; the emulator aborts on the third).
 */
#ifndef TESSERA_KERNELS_L2_HINT_H
#define TESSERA_KERNELS_L2_HINT_H

#include <stdint.h>

struct cuda_l2_hint {
    const void *p;  /* device address, 16-byte aligned */
    uint64_t bytes; /* a multiple of 16; 0 = none */
};

#endif
