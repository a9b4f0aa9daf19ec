/* philox.h — Philox4x32-10, the counter-based random number generator of Salmon, Moraes,
 * Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC'11).
 *
 * A keyed bijection of a 128-bit counter: out = philox4x32_10(counter, key). There is no
 * state to carry from draw to draw, so any thread of any backend gets the numbers for
 * (key, counter) directly — the property the samplers need to agree on a token regardless
 * of batch composition, thread count or device (docs/sampling.md).
 *
 * Header-only, `static inline`; compiles as C11, as C++17 (the CUDA-on-CPU emulator) and
 * as CUDA (PHILOX_FN adds __host__ __device__). Integer arithmetic only: the same bits on
 * every platform. Checked against the published known-answer vectors (Random123's
 * kat_vectors) and against cuRAND's curand_Philox4x32_10 in tests/c/test_philox.c.
 *
 * One round, with the multipliers M0 = 0xD2511F53, M1 = 0xCD9E8D57:
 *     (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2            (32 x 32 -> 64-bit products)
 *     c' = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
 * and between rounds the key is bumped by the Weyl constants (0x9E3779B9, 0xBB67AE85).
 */
#ifndef TESSERA_SAMPLER_PHILOX_H
#define TESSERA_SAMPLER_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define PHILOX_FN static inline __host__ __device__
#else
#define PHILOX_FN static inline
#endif
#if defined(__CUDA_ARCH__) /* nvcc's device pass; the host compiler would warn */
#define PHILOX_UNROLL _Pragma("unroll")
#else
#define PHILOX_UNROLL
#endif

#define PHILOX4X32_MUL0 0xD2511F53u
#define PHILOX4X32_MUL1 0xCD9E8D57u
#define PHILOX4X32_WEYL0 0x9E3779B9u
#define PHILOX4X32_WEYL1 0xBB67AE85u

/* One Philox4x32 round on c[4] with key k[2], in place. */
PHILOX_FN void philox4x32_round(uint32_t c[4], const uint32_t k[2])
{
    uint64_t p0 = (uint64_t)PHILOX4X32_MUL0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX4X32_MUL1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

/* out[4] = Philox4x32-10(ctr[4], key[2]): ten rounds, the key bumped between them. */
PHILOX_FN void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c[4] = { ctr[0], ctr[1], ctr[2], ctr[3] };
    uint32_t k[2] = { key[0], key[1] };
    PHILOX_UNROLL
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k[0] += PHILOX4X32_WEYL0;
            k[1] += PHILOX4X32_WEYL1;
        }
        philox4x32_round(c, k);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

#endif
