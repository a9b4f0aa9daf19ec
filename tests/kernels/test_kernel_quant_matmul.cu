/* test_kernel_quant_matmul.cu — kernels/quant_matmul.cu against its CPU twins.
 *
 * Weights: random blocks of each type (ktest_quant.h: random code bytes, finite fp16
 * scales), so every bit of every code and scale field is exercised. Inputs x: mode 0
 * random (per-token scale, ~1% outliers x20, one all-zero token when there are several),
 * mode 1 "exact": every value a multiple of 1/128 in [-127/128, 127/128] with +-127/128 in
 * every 32-element block, so int8 quantization per 32 (GPU) or per 256 (CPU Q8_K) is
 * lossless.
 *
 * Checks, per output y[t][o] (ref in double from the exactly dequantized row):
 *   bound   |y - ref| <= act + acc, both worst-case (they cannot fail for a right kernel):
 *           act = sum_i |w_i| h_i, h_i = 0.5001 * (amax of i's 32-block) / 127 — the
 *             GPU's activation rounding (0 in exact mode, so there only the tight acc term
 *             remains and a wrong nibble, bit or scale order shows at any row length);
 *           acc = (n_in + 16) 2^-24 sum_i |w_i| (|x_i| + h_i) — F32 rounding of the
 *             per-block scalings and of the sums in any order.
 *           BF16 path: act is replaced by the BF16 rounding of w and x (2^-8 |w_i x_i|
 *           covers both relative 2^-9 roundings and their product).
 *   twin    NMSE against the CPU twin: cpu_matmul (the CPU backend's own op) for the GEMV,
 *           bound per type in twin_tol; cpu_matmul_ref for the BF16 path, KTOL_BF16.
 * Guards around every buffer, inputs included; outputs poisoned before each call; y
 * columns past n_out (ldy > n_out) must keep their poison. QMM_STATS=1 prints each case's
 * NMSE and bound.
 */
#include "ktest.h"
#include "ktest_quant.h"

#include "kernels/quant_matmul.h"

#include <cublas_v2.h>

extern "C" {
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_kernels.h"
#include "util/threadpool.h"
}

static const enum dtype QTYPES[] = { DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q6_K };

static struct threadpool *g_tp;
static cublasHandle_t g_cublas;

/* ---- inputs ----------------------------------------------------------------------------- */

static std::vector<float> rand_x(int64_t n, int nt, int mode, ktest_rng &r)
{
    std::vector<float> x((size_t)n * nt);
    for (int t = 0; t < nt; t++) {
        float *xt = x.data() + (size_t)t * n;
        float scale = (float)(1 << r.below(8)) / 16.0f;
        for (int64_t i = 0; i < n; i++) {
            if (mode) {
                xt[i] = (float)(r.below(255) - 127) / 128.0f;
            } else {
                xt[i] = scale * r.uniform(-1.0f, 1.0f);
                if (r.below(97) == 0) xt[i] *= 20.0f;
                if (t == 1 && nt > 2) xt[i] = 0.0f;
            }
        }
        if (mode)
            for (int64_t b = 0; b < n; b += 32) xt[b + r.below(32)] = r.next() & 1 ? 127.0f / 128 : -127.0f / 128;
    }
    return x;
}

/* ---- references ------------------------------------------------------------------------- */

struct mm_ref {
    std::vector<double> ref, tol; /* [nt][n_out] */
    double twin_nmse;             /* NMSE bound against cpu_matmul (twin_tol) */
};

/* ref and per-output bound (see the header). bf16: the BF16 tensor-core path's bound. */
static mm_ref reference(enum dtype type, const std::vector<uint8_t> &w, int64_t n_in, int64_t n_out,
                        const std::vector<float> &x, int nt, int mode, bool bf16)
{
    mm_ref m;
    m.ref.assign((size_t)nt * n_out, 0.0);
    m.tol.assign((size_t)nt * n_out, 0.0);
    size_t rb = dtype_row_bytes(type, n_in);
    /* half quantization steps: h of the GPU's 32-element blocks, hc of the CPU's blocks
     * (256 for Q8_K, else 32) */
    std::vector<float> row(n_in), h((size_t)nt * n_in), hc((size_t)nt * n_in);
    const int cb = quant_act_block(quant_act_type(type));
    for (int pass = 0; pass < 2; pass++) {
        const int bs = pass ? cb : 32;
        std::vector<float> &hh = pass ? hc : h;
        for (int t = 0; t < nt; t++)
            for (int64_t b = 0; b < n_in; b += bs) {
                float amax = 0.0f;
                for (int j = 0; j < bs; j++) amax = fmaxf(amax, fabsf(x[(size_t)t * n_in + b + j]));
                for (int j = 0; j < bs; j++) hh[(size_t)t * n_in + b + j] = mode || bf16 ? 0.0f : 0.5001f * (amax / 127.0f);
            }
    }
    double se = 0.0, sr = 0.0;
    for (int64_t o = 0; o < n_out; o++) {
        quant_dequant_row(type, w.data() + (size_t)o * rb, row.data(), n_in);
        for (int t = 0; t < nt; t++) {
            const float *xt = x.data() + (size_t)t * n_in, *ht = h.data() + (size_t)t * n_in;
            const float *hct = hc.data() + (size_t)t * n_in;
            double s = 0, act = 0, var = 0, mag = 0;
            for (int64_t i = 0; i < n_in; i++) {
                double aw = fabs((double)row[i]);
                s += (double)row[i] * xt[i];
                act += aw * ht[i];
                var += aw * aw * ((double)ht[i] * ht[i] + (double)hct[i] * hct[i]) / 3.0;
                mag += aw * (fabs((double)xt[i]) + ht[i]);
            }
            size_t k = (size_t)t * n_out + o;
            m.ref[k] = s;
            m.tol[k] = act + (double)(n_in + 16) * 0x1p-24 * mag + (bf16 ? 0x1p-8 * mag : 0.0) + 1e-30;
            se += var;
            sr += s * s;
        }
    }
    m.twin_nmse = 10.0 * (sr > 0 ? se / sr : se);
    return m;
}

/* Number of outputs outside their bound; prints the first few. */
static int check_bound(const char *what, enum dtype type, int64_t n_in, int64_t n_out, int nt, int mode,
                       const std::vector<float> &y, const mm_ref &m)
{
    int bad = 0;
    for (size_t k = 0; k < y.size(); k++) {
        double e = fabs((double)y[k] - m.ref[k]);
        if (!(e <= m.tol[k])) {
            if (bad < 3)
                fprintf(stderr, "    %s %s n_in=%lld n_out=%lld nt=%d mode=%d: y[%zu][%zu]=%.9g ref=%.9g |d|=%.3g tol=%.3g\n",
                        what, dtype_name(type), (long long)n_in, (long long)n_out, nt, mode, k / n_out, k % n_out,
                        (double)y[k], m.ref[k], e, m.tol[k]);
            bad++;
        }
    }
    return bad;
}

/* NMSE bound against cpu_matmul. The 32-element types: both backends quantize x with the
 * same rule per 32 elements (bitwise, test_quantize_act), so their integer dot products
 * are equal and only F32 scaling and summation order differ: the F32 bound. Q4_K / Q6_K:
 * the CPU quantizes x per 256 elements (Q8_K), the GPU per 32, so y differs by
 * sum_i w_i (e_cpu,i - e_gpu,i), each rounding error independent and uniform on +-h (h
 * the block's half step): expected squared difference sum_i w_i^2 (h_gpu^2 + h_cpu^2) / 3.
 * The bound is 10x that expectation summed over the outputs, over sum ref^2 (a single
 * output exceeds 10x its expectation with probability ~0.2%, a sum of several far less;
 * the measured ratio is 0.5-1.5x). In exact mode both quantizations are lossless: the
 * F32 bound. Max error: the per-output bound (check_bound) covers it. */
static ktol twin_tol(enum dtype type, int mode, const mm_ref &m)
{
    bool k = type == DT_Q4_K || type == DT_Q6_K;
    return ktol{ k && !mode ? m.twin_nmse : KTOL_F32.nmse, 1e30 };
}

/* ---- one case --------------------------------------------------------------------------- */

/* Runs cuda_quant_matmul for one shape on both input modes and checks it. ws_rows > 0
 * shrinks the workspace of the BF16 path to that many rows of W per slice. */
static void run_case(enum dtype type, int64_t n_in, int64_t n_out, int nt, uint64_t seed, int64_t ws_rows = 0,
                     int64_t pad = 0)
{
    const int64_t ldy = n_out + pad; /* pad > 0: y is a column slice of wider rows */
    ktest_rng r(seed);
    std::vector<uint8_t> wh = ktest_rand_weights(type, n_in, n_out, r);
    struct tensor wt = ktest_matrix(type, n_in, n_out, wh.data(), wh.size());
    bool bf16 = nt > QMM_GEMV_MAX_TOKENS;

    size_t ws_bytes = cuda_quant_matmul_workspace_size(type, n_in, n_out, nt);
    CHECK(ws_bytes > 0, "workspace size 0 for %s n_in=%lld", dtype_name(type), (long long)n_in);
    if (ws_rows > 0) ws_bytes = (((size_t)nt * n_in * 2 + 255) / 256 * 256) + (size_t)ws_rows * n_in * 2;

    kbuf<uint8_t> w(wh.size());
    kbuf<float> x((size_t)nt * n_in), y((size_t)nt * ldy);
    kbuf<uint8_t> ws(ws_bytes);
    w.upload(wh);

    std::vector<uint8_t> scratch(cpu_matmul_scratch_size(type, n_in, nt) + 64);
    std::vector<float> ycpu((size_t)nt * n_out);
    const char *stats = getenv("QMM_STATS");
    for (int mode = 0; mode < 2; mode++) {
        std::vector<float> xh = rand_x(n_in, nt, mode, r);
        x.upload(xh);
        mm_ref m = reference(type, wh, n_in, n_out, xh, nt, mode, bf16);
        /* the GEMV's twin is cpu_matmul (activations quantized the CPU's way); the BF16
         * path's is cpu_matmul_ref (exact weights, F32 x) */
        if (bf16) cpu_matmul_ref(&wt, xh.data(), ycpu.data(), nt);
        else cpu_matmul(g_tp, &wt, xh.data(), ycpu.data(), nt, scratch.data());
        KTEST_SEEDS(s) {
            y.poison();
            /* every other run a pdl launch (the emulator checks that every thread waits) */
            int e = cuda_quant_matmul(type, w.ptr, n_in, n_out, x.ptr, y.ptr, ldy, nt, ws.ptr, ws_bytes, g_cublas, 1,
                                      (s + nt) & 1, 0);
            CHECK(e == 0, "cuda_quant_matmul %s n_in=%lld n_out=%lld nt=%d: error %d", dtype_name(type),
                  (long long)n_in, (long long)n_out, nt, e);
            std::vector<float> yp = y.download(), yg((size_t)nt * n_out);
            int touched = 0;
            for (int t = 0; t < nt; t++) {
                memcpy(&yg[(size_t)t * n_out], &yp[(size_t)t * ldy], n_out * sizeof(float));
                for (int64_t o = n_out; o < ldy; o++) touched += !isnan(yp[(size_t)t * ldy + o]);
            }
            CHECK(touched == 0, "%d values written past n_out in rows of ldy=%lld", touched, (long long)ldy);
            char what[96];
            snprintf(what, sizeof what, "%s %s n_in=%lld n_out=%lld nt=%d mode=%d", bf16 ? "bf16" : "gemv",
                     dtype_name(type), (long long)n_in, (long long)n_out, nt, mode);
            int bad = check_bound(what, type, n_in, n_out, nt, mode, yg, m);
            CHECK(bad == 0, "%s: %d outputs outside the worst-case bound", what, bad);
            /* BF16 path vs cpu_matmul_ref: w and x each rounded to BF16 (relative error
             * uniform within 2^-9), expected NMSE ~ 2 (2^-9)^2 / 3 ~ 2.5e-6 (measured <= 8e-6):
             * KTOL_BF16's 1e-4. Max error: the per-output bound covers it. */
            ktol tol = bf16 ? ktol{ KTOL_BF16.nmse, 1e30 } : twin_tol(type, mode, m);
            if (stats && s == 0) {
                double se = 0, sr = 0;
                for (size_t i = 0; i < yg.size(); i++) {
                    se += ((double)yg[i] - ycpu[i]) * ((double)yg[i] - ycpu[i]);
                    sr += (double)ycpu[i] * ycpu[i];
                }
                printf("STAT %s nmse %.3g bound %.3g ratio %.3g\n", what, sr > 0 ? se / sr : se, tol.nmse, (sr > 0 ? se / sr : se) / tol.nmse);
            }
            CHECK_CLOSE_ARRAYS(what, yg.data(), ycpu.data(), yg.size(), tol);
            /* Q4_K's GEMV loads its weights straight into registers; through shared memory
             * (direct = 0, TESSERA_CUDA_QUANT_LOADS=staged) it must give the same bits */
            if (!bf16 && type == DT_Q4_K) {
                y.poison();
                e = cuda_quant_matmul(type, w.ptr, n_in, n_out, x.ptr, y.ptr, ldy, nt, ws.ptr, ws_bytes, g_cublas, 0,
                                      (s + nt + 1) & 1, 0);
                CHECK(e == 0, "%s staged: error %d", what, e);
                std::vector<float> ys = y.download();
                int diff = 0;
                for (int t = 0; t < nt; t++)
                    diff += memcmp(&ys[(size_t)t * ldy], &yg[(size_t)t * n_out], n_out * sizeof(float)) != 0;
                CHECK(diff == 0, "%s: %d token rows of the staged loads differ from the direct ones", what, diff);
            }
            CHECK_GUARD(w);
            CHECK_GUARD(x);
            CHECK_GUARD(y);
            CHECK_GUARD(ws);
        }
    }
}

/* ---- tests ------------------------------------------------------------------------------ */

/* The activation quantizer against the CPU's Q8_0 quantizer: codes and scales bitwise, sums
 * exact. */
static void test_quantize_act(void)
{
    const int64_t n_ins[] = { 32, 224, 4608 };
    const int nts[] = { 1, 3, 8 };
    for (int a = 0; a < 3; a++) {
        int64_t n_in = n_ins[a];
        int nt = nts[a];
        ktest_rng r(0x9a0000 + a);
        std::vector<float> xh = rand_x(n_in, nt, 0, r);
        xh[0] = 0.0f; /* plus one all-zero block */
        for (int j = 0; j < 32; j++) xh[(size_t)(nt - 1) * n_in + j] = 0.0f;
        kbuf<float> x(xh.size());
        kbuf<uint8_t> act(cuda_quant_act_size(n_in, nt));
        x.upload(xh);
        std::vector<uint8_t> scratch(cpu_matmul_scratch_size(DT_Q8_0, n_in, nt) + 64);
        for (int t = 0; t < nt; t++) {
            struct qact qa = quant_act_row(scratch.data(), DT_Q8_0, n_in, t);
            quant_impl_scalar()->quantize(DT_Q8_0, xh.data() + (size_t)t * n_in, 0, n_in / 32, &qa);
        }
        KTEST_SEEDS(s) {
            act.poison();
            CHECK(cuda_quantize_act(x.ptr, n_in, nt, act.ptr, s & 1, 0) == 0, "cuda_quantize_act failed");
            std::vector<uint8_t> g = act.download();
            size_t ds_off = cuda_quant_act_ds_offset(n_in, nt);
            int bad = 0;
            for (int t = 0; t < nt; t++) {
                struct qact qa = quant_act_row(scratch.data(), DT_Q8_0, n_in, t);
                for (int64_t i = 0; i < n_in; i++)
                    bad += (int8_t)g[(size_t)t * n_in + i] != qa.q[i];
                for (int64_t b = 0; b < n_in / 32; b++) {
                    float ds[2];
                    memcpy(ds, g.data() + ds_off + ((size_t)t * (n_in / 32) + b) * 8, 8);
                    int sum = 0;
                    for (int j = 0; j < 32; j++) sum += qa.q[b * 32 + j];
                    bad += memcmp(&ds[0], &qa.d[b], 4) != 0 || ds[1] != (float)sum;
                }
            }
            CHECK(bad == 0, "n_in=%lld nt=%d: %d codes/scales differ from the CPU's Q8_0", (long long)n_in, nt, bad);
            CHECK_GUARD(x);
            CHECK_GUARD(act);
        }
    }
}

/* The GEMV path over the grid: every type; n_in = 256, 512, 3584 and 4608 (more chunks
 * than warps, so the double-buffered loop runs), the 32-element types also at 32 * 1, 3,
 * 7 and 25 (rows not 16-byte aligned; the tensor's last window partial); n_out 1, 7, 33,
 * 257 (a partial last group of R rows; few rows: the CTA's warps split K; many: each warp
 * streams several row groups, since the emulator's grid is capped at 16 warps); num_tokens
 * 1..8 (instances T = 1, 2, 4, 8, masked); y rows wider than n_out (ldy). */
static void test_gemv_grid(void)
{
    struct shape { int64_t n_in, n_out; int nt; bool k_ok; };
    const shape shapes[] = {
        { 256, 1, 1, true },    { 256, 257, 2, true },  { 256, 33, 8, true },   { 256, 7, 4, true },
        { 512, 7, 5, true },    { 512, 33, 3, true },   { 512, 257, 1, true },  { 512, 1, 6, true },
        { 3584, 257, 1, true }, { 3584, 33, 8, true },  { 3584, 7, 2, true },   { 4608, 7, 8, true },
        { 4608, 33, 1, true },  { 4608, 1, 7, true },   { 224, 33, 4, false },  { 224, 257, 7, false },
        { 800, 7, 6, false },   { 800, 1, 8, false },   { 32, 257, 1, false },  { 96, 33, 5, false },
    };
    for (enum dtype type : QTYPES) {
        bool k = dtype_block_elems(type) == 256;
        int n = 0;
        for (const shape &sh : shapes)
            if (sh.k_ok || !k) run_case(type, sh.n_in, sh.n_out, sh.nt, 0x51000 + 97 * (uint64_t)type + n++);
        /* y as a column slice of wider rows (q, k, v into the fused QKV buffer) */
        run_case(type, 256, 9, 3, 0x52000 + (uint64_t)type, 0, 5);
        run_case(type, 256, 33, 1, 0x53000 + (uint64_t)type, 0, 3);
    }
}

/* The BF16 tensor-core path (num_tokens > 8): every type at 40 tokens; slices forced
 * smaller than n_out (16 rows, 1 row) so the slice loop and its partial last slice run. */
static void test_large_batch(void)
{
    int n = 0;
    for (enum dtype type : QTYPES) {
        int64_t n_in = dtype_block_elems(type) == 256 ? 512 : 224;
        run_case(type, n_in, 33, 40, 0x8b000 + n++);
    }
    run_case(DT_Q4_K, 256, 37, 9, 0x8b100, 16);
    run_case(DT_Q8_0, 96, 5, 17, 0x8b101, 1);
    run_case(DT_Q6_K, 256, 20, 12, 0x8b102, 0, 7); /* y rows wider than n_out */
}

/* cuda_dequant_bf16 against the CPU's dequantization rounded to BF16: bitwise, on a row
 * range that starts past row 0 (rows not 16-byte aligned for most types). */
static void test_dequant_bf16(void)
{
    int n = 0;
    for (enum dtype type : QTYPES) {
        ktest_rng r(0xdb0000 + n++);
        int64_t n_in = dtype_block_elems(type) == 256 ? 768 : 1056, n_out = 9, row0 = 3, rows = 5;
        std::vector<uint8_t> wh = ktest_rand_weights(type, n_in, n_out, r);
        size_t rb = dtype_row_bytes(type, n_in);
        std::vector<uint16_t> ref((size_t)rows * n_in);
        std::vector<float> row(n_in);
        for (int64_t o = 0; o < rows; o++) {
            quant_dequant_row(type, wh.data() + (size_t)(row0 + o) * rb, row.data(), n_in);
            for (int64_t i = 0; i < n_in; i++) ref[(size_t)o * n_in + i] = fp32_to_bf16(row[i]);
        }
        kbuf<uint8_t> w(wh.size());
        kbuf<uint16_t> out((size_t)rows * n_in);
        w.upload(wh);
        KTEST_SEEDS(s) {
            out.poison();
            CHECK(cuda_dequant_bf16(type, w.ptr, n_in, row0, rows, out.ptr, 0) == 0, "%s: launch failed", dtype_name(type));
            std::vector<uint16_t> g = out.download();
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < g.size(); i++)
                if (g[i] != ref[i] && bad++ == 0) first = i;
            CHECK(bad == 0, "%s: %zu of %zu BF16 values differ, first [%zu][%zu] got 0x%04x want 0x%04x",
                  dtype_name(type), bad, g.size(), first / n_in, first % n_in, g[first], ref[first]);
            CHECK_GUARD(w);
            CHECK_GUARD(out);
        }
    }
}

/* Bad arguments fail loudly with cudaErrorInvalidValue and leave y untouched. */
static void test_invalid(void)
{
    const int64_t n_in = 256, n_out = 4;
    kbuf<uint8_t> w(dtype_row_bytes(DT_Q4_K, n_in) * n_out + 16);
    kbuf<float> x(2 * n_in + 4), y(2 * n_out);
    size_t wsz = cuda_quant_matmul_workspace_size(DT_Q4_K, n_in, n_out, 40);
    kbuf<uint8_t> ws(wsz + 16);
    std::vector<uint8_t> zeros(w.n, 0);
    w.upload(zeros);
    y.poison();
    const int inval = (int)cudaErrorInvalidValue;
    CHECK(cuda_quant_matmul(DT_F16, w.ptr, n_in, n_out, x.ptr, y.ptr, n_out, 1, ws.ptr, wsz, nullptr, 1, 0, 0) == inval, "F16 weights");
    CHECK(cuda_quant_matmul(DT_Q8_K, w.ptr, n_in, n_out, x.ptr, y.ptr, n_out, 1, ws.ptr, wsz, nullptr, 1, 0, 0) == inval, "Q8_K weights");
    CHECK(cuda_quant_matmul(DT_Q4_K, w.ptr, 128, n_out, x.ptr, y.ptr, n_out, 1, ws.ptr, wsz, nullptr, 1, 0, 0) == inval, "n_in 128 for Q4_K");
    CHECK(cuda_quant_matmul(DT_Q4_0, w.ptr, 48, n_out, x.ptr, y.ptr, n_out, 1, ws.ptr, wsz, nullptr, 1, 0, 0) == inval, "n_in 48");
    CHECK(cuda_quant_matmul(DT_Q4_K, w.ptr + 2, n_in, n_out, x.ptr, y.ptr, n_out, 1, ws.ptr, wsz, nullptr, 1, 0, 0) == inval, "misaligned w");
    CHECK(cuda_quant_matmul(DT_Q4_K, w.ptr, n_in, n_out, x.ptr + 1, y.ptr, n_out, 1, ws.ptr, wsz, nullptr, 1, 0, 0) == inval, "misaligned x");
    CHECK(cuda_quant_matmul(DT_Q4_K, w.ptr, n_in, n_out, x.ptr, y.ptr, n_out, 1, ws.ptr, 16, nullptr, 1, 0, 0) == inval, "small workspace");
    CHECK(cuda_quant_matmul(DT_Q4_K, w.ptr, n_in, n_out, x.ptr, y.ptr, n_out, 40, ws.ptr, wsz, nullptr, 1, 0, 0) == inval, "no cuBLAS handle");
    CHECK(cuda_quant_gemv(DT_Q4_K, w.ptr, n_in, n_out, ws.ptr, 9, y.ptr, n_out, 1, 0, 0) == inval, "gemv with 9 tokens");
    CHECK(cuda_quant_matmul(DT_Q4_K, w.ptr, n_in, n_out, x.ptr, y.ptr, n_out - 1, 1, ws.ptr, wsz, nullptr, 1, 0, 0) == inval,
          "ldy < n_out");
    CHECK(cuda_dequant_bf16(DT_BF16, w.ptr, n_in, 0, 1, ws.ptr, 0) == inval, "dequant of BF16");
    CHECK(cuda_quant_matmul_workspace_size(DT_F32, n_in, n_out, 1) == 0, "workspace size of F32");
    CHECK(cuda_quant_matmul(DT_Q4_K, w.ptr, n_in, n_out, x.ptr, y.ptr, n_out, 0, ws.ptr, wsz, nullptr, 1, 0, 0) == 0, "0 tokens");
    std::vector<float> yg = y.download();
    bool untouched = true;
    for (float v : yg) untouched = untouched && isnan(v);
    CHECK(untouched, "a rejected call wrote y");
    CHECK_GUARD(w);
    CHECK_GUARD(x);
    CHECK_GUARD(y);
    CHECK_GUARD(ws);
}

int main(void)
{
    g_tp = tp_create(1);
    if (cublasCreate(&g_cublas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 2;
    }
    RUN(test_quantize_act);
    RUN(test_dequant_bf16);
    RUN(test_gemv_grid);
    RUN(test_large_batch);
    RUN(test_invalid);
    cublasDestroy(g_cublas);
    tp_free(g_tp);
    return test_summary();
}
