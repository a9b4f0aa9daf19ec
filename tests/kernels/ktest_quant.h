/* ktest_quant.h — random GGUF weight blocks for the quantized-kernel tests
 * (test_kernel_quant_matmul.cu, test_kernel_embedding.cu), on top of ktest.h.
 *
 * ktest_rand_weights(type, n_in, n_out, rng): n_out rows of n_in elements in `type`'s
 * stored layout. Quantized types get random code bytes (every bit of every code, scale
 * and min field exercised) with finite fp16 scales of either sign in +-[0.25, 1.25)/64
 * (the d / m / dmin fields; Q6_K's int8 sub-scales stay random); F32/F16/BF16 get uniform
 * values in [-1, 1).
 */
#ifndef TESSERA_KTEST_QUANT_H
#define TESSERA_KTEST_QUANT_H

#include "ktest.h"

extern "C" {
#include "util/tensor.h"
}

static inline void ktest_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline uint16_t ktest_rand_scale(ktest_rng &r)
{
    float f = (0.75f + 0.5f * r.uniform(-1.0f, 1.0f)) / 64.0f;
    return fp32_to_fp16(r.next() & 1 ? -f : f);
}

static inline std::vector<uint8_t> ktest_rand_weights(enum dtype t, int64_t n_in, int64_t n_out, ktest_rng &r)
{
    size_t rb = dtype_row_bytes(t, n_in), nbytes = rb * (size_t)n_out;
    std::vector<uint8_t> w(nbytes);
    for (auto &b : w) b = (uint8_t)r.next();
    int be = dtype_block_elems(t), bb = dtype_block_bytes(t);
    for (int64_t i = 0; i < n_in * n_out / be; i++) {
        uint8_t *b = w.data() + i * bb;
        switch (t) {
        case DT_F32: {
            float f = r.uniform(-1.0f, 1.0f);
            memcpy(b, &f, 4);
            break;
        }
        case DT_F16: ktest_put16(b, fp32_to_fp16(r.uniform(-1.0f, 1.0f))); break;
        case DT_BF16: ktest_put16(b, fp32_to_bf16(r.uniform(-1.0f, 1.0f))); break;
        case DT_Q8_0: case DT_Q4_0: case DT_Q5_0: ktest_put16(b, ktest_rand_scale(r)); break;
        case DT_Q4_1: case DT_Q5_1: case DT_Q4_K:
            ktest_put16(b, ktest_rand_scale(r));
            ktest_put16(b + 2, ktest_rand_scale(r));
            break;
        case DT_Q6_K: ktest_put16(b + 208, ktest_rand_scale(r)); break;
        default: break;
        }
    }
    return w;
}

#endif
