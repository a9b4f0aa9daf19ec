/* ktest.h — the harness every kernel comparison test uses (tests/kernels/test_kernel_*.cu).
 *
 * A kernel test is one .cu file compiled two ways: by g++ against the CUDA-on-CPU emulator
 * (build/tests/test_kernel_<family>, part of `make test`), and by nvcc for a real GPU
 * (build/cuda/tests/test_kernel_<family>, run by scripts/gpu-check.sh). It calls the
 * family's launcher (cuda_<op>) on device buffers and its CPU twin (cpu_<op>) on host
 * copies of the same inputs, then compares.
 *
 *   struct kbuf<T>        a device buffer with guard sentinels before and after the data:
 *                         kbuf_guard_ok() after the call checks them bit for bit.
 *                         kbuf_poison() fills the data with 0xFF bytes (NaN / -1) so an
 *                         output element the kernel forgot to write cannot pass.
 *   ktest_compare()       normalised MSE (sum (got-ref)^2 / sum ref^2, the way llama.cpp's
 *                         test-backend-ops compares a backend with the CPU) and max |error|
 *                         against per-dtype bounds; prints the first mismatches.
 *   KTEST_SEEDS(s)        loops a test body over several emulator fiber-order seeds (the
 *                         emulator randomises the order in which a block's threads run at
 *                         every barrier); on a GPU the body runs once.
 *   ktest_rng             a deterministic input generator (splitmix64), seeded per case.
 *
 * CHECK / RUN / test_summary come from tests/c/test.h: output ends "N passed, N failed".
 */
#ifndef TESSERA_KTEST_H
#define TESSERA_KTEST_H

#include "../c/test.h"

#ifndef TESSERA_EMU
#include <cuda_runtime.h>
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "util/half.h"
#include "util/tensor.h"
}

/* A host view of an n_out x n_in weight matrix (rows of n_in elements of type), for the
 * CPU twins that take a struct tensor. */
static inline struct tensor ktest_matrix(enum dtype type, int64_t n_in, int64_t n_out, const void *data, size_t nbytes)
{
    struct tensor t = {};
    t.name = "w";
    t.type = type;
    t.n_dims = 2;
    t.ne[0] = n_in;
    t.ne[1] = n_out;
    t.ne[2] = t.ne[3] = 1;
    t.data = data;
    t.nbytes = nbytes;
    return t;
}

/* ---- CUDA error checks ------------------------------------------------------------------ */

#define KCHECK_CUDA(call)                                                                     \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

/* ---- emulator seeds --------------------------------------------------------------------- */

/* Number of fiber-order seeds each test body runs under (emulator only; 1 on a GPU).
 * TESSERA_EMU_SEED=<n> pins one seed (to replay a failure the emulator reported). */
#ifndef KTEST_NSEEDS
#define KTEST_NSEEDS 3
#endif

static inline int ktest_nseeds(void)
{
#ifdef TESSERA_EMU
    return getenv("TESSERA_EMU_SEED") ? 1 : KTEST_NSEEDS;
#else
    return 1;
#endif
}

/* Selects fiber-order seed number s (the emulator prints the seed when a check fails). */
static inline int ktest_apply_seed(int s)
{
#ifdef TESSERA_EMU
    const char *env = getenv("TESSERA_EMU_SEED");
    emu_set_seed(env ? strtoull(env, NULL, 0) : 0x5eed0000ull + (uint64_t)s);
#else
    (void)s;
#endif
    return 1;
}

#define KTEST_SEEDS(s) for (int s = 0, ktest_n_ = ktest_nseeds(); s < ktest_n_ && ktest_apply_seed(s); s++)

/* ---- inputs ----------------------------------------------------------------------------- */

struct ktest_rng {
    uint64_t s;
    explicit ktest_rng(uint64_t seed) : s(seed) {}
    uint64_t next()
    {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform() { return (float)(next() >> 40) * (1.0f / 16777216.0f); } /* [0, 1) */
    float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
    float normal()
    {
        float u1 = uniform() + 1e-7f, u2 = uniform();
        return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    }
    int below(int n) { return (int)(next() % (uint64_t)n); }
    void fill_uniform(float *x, size_t n, float lo = -1.0f, float hi = 1.0f)
    {
        for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
    }
    void fill_normal(float *x, size_t n, float scale = 1.0f)
    {
        for (size_t i = 0; i < n; i++) x[i] = scale * normal();
    }
};

/* ---- guarded device buffers ------------------------------------------------------------- */

#define KBUF_GUARD_BYTES 256
#define KBUF_GUARD_BYTE 0xa5

/* n elements of T on the device between two guard zones of KBUF_GUARD_BYTES. */
template <typename T> struct kbuf {
    unsigned char *base = nullptr; /* device: guard | data | guard */
    T *ptr = nullptr;              /* device data */
    size_t n = 0;

    explicit kbuf(size_t count) : n(count)
    {
        size_t total = 2 * KBUF_GUARD_BYTES + bytes();
        KCHECK_CUDA(cudaMalloc((void **)&base, total));
        ptr = (T *)(base + KBUF_GUARD_BYTES);
        std::vector<unsigned char> g(KBUF_GUARD_BYTES, KBUF_GUARD_BYTE);
        KCHECK_CUDA(cudaMemcpy(base, g.data(), KBUF_GUARD_BYTES, cudaMemcpyHostToDevice));
        KCHECK_CUDA(cudaMemcpy(base + KBUF_GUARD_BYTES + bytes(), g.data(), KBUF_GUARD_BYTES,
                               cudaMemcpyHostToDevice));
        poison();
    }
    ~kbuf() { cudaFree(base); }
    kbuf(const kbuf &) = delete;
    kbuf &operator=(const kbuf &) = delete;

    size_t bytes() const { return n * sizeof(T); }
    void poison() { KCHECK_CUDA(cudaMemset(ptr, 0xff, bytes())); }
    void upload(const T *host) { KCHECK_CUDA(cudaMemcpy(ptr, host, bytes(), cudaMemcpyHostToDevice)); }
    void upload(const std::vector<T> &host) { upload(host.data()); }
    void download(T *host) const
    {
        KCHECK_CUDA(cudaDeviceSynchronize());
        KCHECK_CUDA(cudaMemcpy(host, ptr, bytes(), cudaMemcpyDeviceToHost));
    }
    std::vector<T> download() const
    {
        std::vector<T> h(n);
        download(h.data());
        return h;
    }
    /* true when both guard zones still hold the sentinel byte */
    bool guard_ok() const
    {
        std::vector<unsigned char> g(KBUF_GUARD_BYTES);
        bool ok = true;
        KCHECK_CUDA(cudaDeviceSynchronize());
        KCHECK_CUDA(cudaMemcpy(g.data(), base, KBUF_GUARD_BYTES, cudaMemcpyDeviceToHost));
        for (unsigned char c : g) ok = ok && c == KBUF_GUARD_BYTE;
        KCHECK_CUDA(cudaMemcpy(g.data(), base + KBUF_GUARD_BYTES + bytes(), KBUF_GUARD_BYTES,
                               cudaMemcpyDeviceToHost));
        for (unsigned char c : g) ok = ok && c == KBUF_GUARD_BYTE;
        return ok;
    }
};

#define CHECK_GUARD(buf) CHECK((buf).guard_ok(), "guard bytes around %s overwritten", #buf)

/* ---- host conversions ------------------------------------------------------------------- */

static inline std::vector<uint16_t> ktest_to_f16(const float *x, size_t n)
{
    std::vector<uint16_t> o(n);
    for (size_t i = 0; i < n; i++) o[i] = fp32_to_fp16(x[i]);
    return o;
}

static inline std::vector<uint16_t> ktest_to_bf16(const float *x, size_t n)
{
    std::vector<uint16_t> o(n);
    for (size_t i = 0; i < n; i++) o[i] = fp32_to_bf16(x[i]);
    return o;
}

static inline std::vector<float> ktest_from_f16(const uint16_t *x, size_t n)
{
    std::vector<float> o(n);
    for (size_t i = 0; i < n; i++) o[i] = fp16_to_fp32(x[i]);
    return o;
}

static inline std::vector<float> ktest_from_bf16(const uint16_t *x, size_t n)
{
    std::vector<float> o(n);
    for (size_t i = 0; i < n; i++) o[i] = bf16_to_fp32(x[i]);
    return o;
}

/* ---- comparison ------------------------------------------------------------------------- */

/* Per-dtype bounds on normalised MSE and max |got - ref|. Callers pick the row that
 * matches the least precise type in the computation and may tighten or loosen with a
 * reason in a comment. */
struct ktol {
    double nmse;
    double max_abs;
};
static const ktol KTOL_F32 = { 1e-10, 1e-4 };
static const ktol KTOL_F16 = { 1e-6, 1e-2 };
static const ktol KTOL_BF16 = { 1e-4, 5e-2 };
static const ktol KTOL_FP8 = { 2e-3, 2e-1 };

/* Compares got[n] with ref[n]. Any NaN/inf in got where ref is finite fails (a poisoned
 * element left unwritten shows up as NaN). Prints the first mismatches with what and
 * returns true when both bounds hold. */
static inline bool ktest_compare(const char *what, const float *got, const float *ref, size_t n,
                                 ktol tol)
{
    double se = 0.0, sr = 0.0, max_err = 0.0;
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!isfinite(g) && isfinite(r)) {
            if (bad++ < 5) fprintf(stderr, "    %s[%zu]: got %g, ref %g (not finite)\n", what, i, g, r);
            continue;
        }
        if (!isfinite(r)) continue;
        double e = fabs(g - r);
        se += e * e;
        sr += r * r;
        if (e > max_err) {
            max_err = e;
            worst = i;
        }
    }
    double nmse = sr > 0.0 ? se / sr : se;
    bool ok = bad == 0 && nmse <= tol.nmse && max_err <= tol.max_abs;
    if (!ok) {
        fprintf(stderr, "    %s: n=%zu nmse=%.3g (max %.3g) max_abs=%.3g at [%zu] got %.9g ref %.9g (max %.3g), "
                "%zu not finite\n", what, n, nmse, tol.nmse, max_err, worst, (double)got[worst],
                (double)ref[worst], tol.max_abs, bad);
        int shown = 0;
        for (size_t i = 0; i < n && shown < 5; i++) {
            double e = fabs((double)got[i] - (double)ref[i]);
            if (e > tol.max_abs) {
                fprintf(stderr, "    %s[%zu]: got %.9g ref %.9g\n", what, i, (double)got[i], (double)ref[i]);
                shown++;
            }
        }
    }
    return ok;
}

#define CHECK_CLOSE_ARRAYS(what, got, ref, n, tol) \
    CHECK(ktest_compare((what), (got), (ref), (n), (tol)), "%s differs from its CPU twin", (what))

#endif
