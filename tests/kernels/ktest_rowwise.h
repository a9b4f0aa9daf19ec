/* ktest_rowwise.h — helpers shared by the row-wise kernel tests (test_kernel_norm.cu,
 * test_kernel_rope.cu, test_kernel_activation.cu), on top of ktest.h.
 *
 * Activations (kernel outputs in DT_F32 / DT_F16 / DT_BF16) are handled as raw bytes: the
 * device buffer is a kbuf<unsigned char>, the CPU twin writes a host byte vector of the
 * same size, and act_compare() decodes both to float for ktest_compare and, for 16-bit
 * types, also bounds the distance in codes (units in the last place).
 */
#ifndef TESSERA_KTEST_ROWWISE_H
#define TESSERA_KTEST_ROWWISE_H

#include "ktest.h"

extern "C" {
#include "util/tensor.h"
}
#include "kernels/l2_hint.h"

/* ---- L2 prefetch hints (kernels/l2_hint.h) -------------------------------------------------
 * The kernels that take a hint must give the same bits with it, and issue exactly its bytes.
 * A case calls arm() before each launch: runs 0, 2, ... of KTEST_SEEDS pass a hint over a
 * prefix of buf (sizes from 16 bytes to all of it, varying with the run and the case: one
 * 64 KiB piece, several, more pieces than the grid has threads), odd runs pass none; the
 * outputs are checked against the twin either way, and check() compares the emulator's
 * count of prefetched bytes with the hint's (on a GPU only the launch and the outputs
 * are checked: one run, with a hint). */
struct ktest_l2 {
    static constexpr size_t BUF_BYTES = (8u << 20) + 4096;
    kbuf<unsigned char> buf{ BUF_BYTES };
    cuda_l2_hint h = { nullptr, 0 };
    uint64_t before = 0;
    const cuda_l2_hint *arm(int run, uint64_t salt)
    {
        static const uint64_t sizes[] = { 16, 4096 + 16, (64u << 10) * 3 + 48, BUF_BYTES };
        h.p = buf.ptr;
        h.bytes = run % 2 == 0 ? sizes[(run / 2 + salt) % 4] : 0;
#ifdef TESSERA_EMU
        before = emu_l2_prefetched_bytes();
#endif
        return h.bytes ? &h : nullptr;
    }
    void check(const char *what)
    {
#ifdef TESSERA_EMU
        const uint64_t got = emu_l2_prefetched_bytes() - before;
        CHECK(got == h.bytes, "%s: %llu bytes prefetched for a hint of %llu", what, (unsigned long long)got,
              (unsigned long long)h.bytes);
#else
        (void)what;
#endif
        CHECK_GUARD(buf);
    }
};

static inline size_t act_size(enum dtype dt) { return dt == DT_F32 ? 4 : 2; }

static inline const char *act_name(enum dtype dt)
{
    return dt == DT_F32 ? "f32" : dt == DT_F16 ? "f16" : "bf16";
}

/* element i of an activation byte array, as float */
static inline float act_get(const unsigned char *p, enum dtype dt, size_t i)
{
    if (dt == DT_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return dt == DT_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

static inline std::vector<float> act_decode(const std::vector<unsigned char> &b, enum dtype dt, size_t n)
{
    std::vector<float> o(n);
    for (size_t i = 0; i < n; i++) o[i] = act_get(b.data(), dt, i);
    return o;
}

/* Sign-magnitude code -> an integer that is monotonic in the value (so |a - b| counts
 * representable steps; +0 and -0 are one apart, which the bounds tolerate). */
static inline int64_t code_key(uint32_t c, int bits)
{
    uint32_t sign = 1u << (bits - 1), mag = c & (sign - 1);
    return (c & sign) ? -(int64_t)mag - 1 : (int64_t)mag;
}

/* Number of elements whose codes (16 or 8 bits) differ by more than max_steps, printing
 * the first few; *n_diff (if not NULL) gets the number that differ at all. */
static inline size_t codes_far(const char *what, const void *got, const void *ref, size_t n, int bits,
                               int max_steps, size_t *n_diff)
{
    size_t far = 0, diff = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        if (bits == 16) {
            a = ((const uint16_t *)got)[i];
            b = ((const uint16_t *)ref)[i];
        } else {
            a = ((const uint8_t *)got)[i];
            b = ((const uint8_t *)ref)[i];
        }
        if (a == b) continue;
        diff++;
        int64_t d = code_key(a, bits) - code_key(b, bits);
        if (d < -max_steps || d > max_steps) {
            if (far++ < 5) fprintf(stderr, "    %s[%zu]: code 0x%x, twin 0x%x\n", what, i, a, b);
        }
    }
    if (n_diff) *n_diff = diff;
    return far;
}

/* Compares an activation output with the twin's: ktest_compare on the decoded values with
 * tol (pick it for the dtype), and for F16/BF16 every element within one code of the
 * twin's (the kernel's F32 value may differ from the twin's by an F32 ulp, which can move
 * the final rounding by one step, never more). */
static inline bool act_compare(const char *what, const std::vector<unsigned char> &got,
                               const std::vector<unsigned char> &ref, enum dtype dt, size_t n, ktol tol)
{
    std::vector<float> g = act_decode(got, dt, n), r = act_decode(ref, dt, n);
    bool ok = ktest_compare(what, g.data(), r.data(), n, tol);
    if (dt != DT_F32) ok = codes_far(what, got.data(), ref.data(), n, 16, 1, NULL) == 0 && ok;
    return ok;
}

#endif
