/* avx512_bytes.h — byte-level AVX-512 helpers shared by the per-token quantized dots
 * (quant_dot_x86.c) and the batched kernels (gemm_avx512.c). Include only inside a
 * region compiled with AVX-512 F/BW/VL/VBMI (both files test the feature macros first).
 */
#ifndef TESSERA_BACKEND_CPU_AVX512_BYTES_H
#define TESSERA_BACKEND_CPU_AVX512_BYTES_H

#include <immintrin.h>
#include <stdint.h>

/* The mask of the first k bytes of 64 (k <= 0: none; k >= 64: all). */
static inline __mmask64 bytes_mask(int64_t k)
{
    return k <= 0 ? 0 : k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << k) - 1);
}

/* vpermt2b byte indices gathering 16 bytes at each of o0..o3 (+64 selects the second
 * source). */
static inline __m512i quad_index(int o0, int o1, int o2, int o3)
{
    uint8_t idx[64];
    for (int j = 0; j < 16; j++) {
        idx[j] = (uint8_t)(o0 + j);
        idx[16 + j] = (uint8_t)(o1 + j);
        idx[32 + j] = (uint8_t)(o2 + j);
        idx[48 + j] = (uint8_t)(o3 + j);
    }
    return _mm512_loadu_si512(idx);
}

#endif
