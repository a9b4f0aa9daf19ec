/* test_quant.c — backend/cpu quant kernels: dequantization layouts, activation
 * quantization, and cpu_matmul (SIMD and scalar kernel sets) against cpu_matmul_ref over
 * a grid of types and shapes.
 *
 * Tolerance (per output y[t][o], ref computed in double from the exactly dequantized row):
 *   act:  quantized weights see x through Q8 activations, |x_i - dx_b q_i| <= dx_b/2 (times
 *         1.0001 for the f32 rounding of x * (1/dx)), so |err| <= sum_i |w_i| * h_i with
 *         h_i = 0.5001 * dx of i's activation block. Zero for float weights.
 *   acc:  f32 accumulation in any order: <= (n_in + 16) * 2^-24 * sum_i |w_i| (|x_i| + h_i).
 *   |y - ref| <= act + acc. Both are worst-case bounds, so a failure is a real defect.
 * Each case runs twice: with random x (the bound's act term is live) and with "exact" x
 * whose every value is an integer multiple of 2^-7 and whose every activation block
 * holds +-127/128, so Q8 quantization is lossless and only the tight acc term remains —
 * that run catches a wrong nibble/bit order that the looser bound could hide in long rows.
 * Every kernel set of the build (scalar, AVX2, AVX-512) is checked against ref and
 * against the set cpu_matmul uses (identical activation bytes, so within acc only); the
 * latter runs on 1, 2 and 3 threads, which must agree bitwise (each output is one kernel
 * call whatever the split).
 */
#include "test.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_kernels.h"
#include "util/half.h"
#include "util/tensor.h"
#include "util/threadpool.h"

#include <stdint.h>

struct rng { uint64_t s; };

static uint64_t rng_next(struct rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}

/* uniform in [-1, 1) */
static float rng_f(struct rng *r) { return (float)((double)(rng_next(r) >> 11) * 0x1p-52 - 1.0); }

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

/* A random scale: +-[0.25, 1.25) / 64 in fp16. */
static uint16_t rand_scale(struct rng *r)
{
    float f = (0.75f + 0.5f * rng_f(r)) / 64.0f;
    return fp32_to_fp16(rng_next(r) & 1 ? -f : f);
}

/* Random weights [n_out][n_in] of type t: random bytes with finite scale fields. */
static uint8_t *rand_weights(enum dtype t, int64_t n_in, int64_t n_out, struct rng *r)
{
    size_t rb = dtype_row_bytes(t, n_in), nbytes = rb * (size_t)n_out;
    uint8_t *w = malloc(nbytes ? nbytes : 1);
    for (size_t i = 0; i < nbytes; i++) w[i] = (uint8_t)rng_next(r);
    int64_t n = n_in * n_out;
    int be = dtype_block_elems(t), bb = dtype_block_bytes(t);
    for (int64_t i = 0; i < n / be; i++) {
        uint8_t *b = w + i * bb;
        switch (t) {
        case DT_F32: { float f = rng_f(r); memcpy(b, &f, 4); break; }
        case DT_F16: put16(b, fp32_to_fp16(rng_f(r))); break;
        case DT_BF16: put16(b, fp32_to_bf16(rng_f(r))); break;
        case DT_Q8_0: case DT_Q4_0: case DT_Q5_0: put16(b, rand_scale(r)); break;
        case DT_Q4_1: case DT_Q5_1: case DT_Q4_K:
            put16(b, rand_scale(r));
            put16(b + 2, rand_scale(r));
            break;
        case DT_Q6_K: put16(b + 208, rand_scale(r)); break;
        default: break;
        }
    }
    return w;
}

/* x [nt][n]: random (mode 0: uniform, per-row scale, some outliers, one all-zero row) or
 * exactly representable in Q8 (mode 1). */
static float *rand_x(int64_t n, int nt, int mode, struct rng *r)
{
    float *x = malloc((size_t)n * (size_t)nt * sizeof *x);
    for (int t = 0; t < nt; t++) {
        float *xt = x + (size_t)t * (size_t)n;
        float scale = mode ? 1.0f : (float)(1 << (rng_next(r) % 8)) / 16.0f;
        for (int64_t i = 0; i < n; i++) {
            if (mode) {
                xt[i] = (float)((int)(rng_next(r) % 255) - 127) / 128.0f;
            } else {
                xt[i] = scale * rng_f(r);
                if (rng_next(r) % 97 == 0) xt[i] *= 20.0f;
                if (t == 1) xt[i] = 0.0f;
            }
        }
        if (mode)
            for (int64_t b = 0; b < n; b += 32) xt[b + (int64_t)(rng_next(r) % (uint64_t)(n - b < 32 ? n - b : 32))] = rng_next(r) & 1 ? 127.0f / 128 : -127.0f / 128;
    }
    return x;
}

/* Per-output bound (see the header). h: half quantization step of each x element. */
static void half_steps(enum dtype wt, const float *x, int64_t n, float *h)
{
    enum dtype act = quant_act_type(wt);
    if (act == DT_F32) { for (int64_t i = 0; i < n; i++) h[i] = 0.0f; return; }
    int qa = quant_act_block(act);
    for (int64_t b = 0; b < n; b += qa) {
        float amax = 0.0f;
        for (int j = 0; j < qa; j++) amax = fmaxf(amax, fabsf(x[b + j]));
        for (int j = 0; j < qa; j++) h[b + j] = 0.5001f * (amax / 127.0f);
    }
}

struct bound { double act, acc; };

static struct bound out_bound(const float *wrow, const float *x, const float *h, int64_t n)
{
    double a = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        a += fabs((double)wrow[i]) * h[i];
        s += fabs((double)wrow[i]) * (fabs((double)x[i]) + h[i]);
    }
    struct bound b = { a, (double)(n + 16) * 0x1p-24 * s };
    return b;
}

/* The two bound terms for every output y[t][o], t < nt: act[t * n_out + o], acc[...]. */
static void out_bounds(const struct tensor *w, const float *x, int nt, double *act, double *acc)
{
    int64_t n_in = w->ne[0], n_out = w->ne[1];
    size_t rb = dtype_row_bytes(w->type, n_in);
    float *row = malloc((size_t)n_in * sizeof *row), *h = malloc((size_t)n_in * sizeof *h);
    for (int t = 0; t < nt; t++) {
        const float *xt = x + (size_t)t * (size_t)n_in;
        half_steps(w->type, xt, n_in, h);
        for (int64_t o = 0; o < n_out; o++) {
            quant_dequant_row(w->type, (const uint8_t *)w->data + (size_t)o * rb, row, n_in);
            struct bound b = out_bound(row, xt, h, n_in);
            act[t * n_out + o] = b.act;
            acc[t * n_out + o] = b.acc;
        }
    }
    free(row);
    free(h);
}

/* Compares y against ref over nt tokens with tolerance (act if with_act) + acc_mult * acc;
 * returns the number of mismatches and prints the first few (unless quiet). */
static int compare(const char *what, const struct tensor *w, const float *y, const float *ref,
                   int nt, const double *act, const double *acc, double acc_mult, int with_act,
                   int quiet)
{
    int64_t n_in = w->ne[0], n_out = w->ne[1];
    int bad = 0;
    for (int t = 0; t < nt; t++)
        for (int64_t o = 0; o < n_out; o++) {
            size_t k = (size_t)t * (size_t)n_out + (size_t)o;
            double tol = (with_act ? act[k] : 0.0) + acc_mult * acc[k] + 1e-30;
            double got = y[k], want = ref[k];
            if (!(fabs(got - want) <= tol)) {
                if (bad < 3 && !quiet)
                    fprintf(stderr, "  %s %s n_in=%lld n_out=%lld nt=%d: y[%d][%lld]=%.9g ref=%.9g |d|=%.3g tol=%.3g\n",
                            what, dtype_name(w->type), (long long)n_in, (long long)n_out, nt, t,
                            (long long)o, got, want, fabs(got - want), tol);
                bad++;
            }
        }
    return bad;
}

/* ---- dequantization: hand-built blocks with known values ---- */

static void test_dequant_known(void)
{
    uint8_t b[256];
    float y[256];
    /* Q4_0: d = 1, qs[j] = j | (15 - j) << 4 -> y[j] = j - 8, y[j+16] = 7 - j */
    put16(b, 0x3C00);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    quant_dequant_row(DT_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (float)(j - 8), "q4_0 y[%d]=%g", j, y[j]);
        CHECK(y[j + 16] == (float)(7 - j), "q4_0 y[%d]=%g", j + 16, y[j + 16]);
    }
    /* Q4_1: d = 2, m = -1 */
    put16(b, 0x4000);
    put16(b + 2, 0xBC00);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    quant_dequant_row(DT_Q4_1, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == 2.0f * j - 1, "q4_1 y[%d]=%g", j, y[j]);
        CHECK(y[j + 16] == 2.0f * (15 - j) - 1, "q4_1 y[%d]=%g", j + 16, y[j + 16]);
    }
    /* Q5_0: d = 1, nibbles 0, qh bit j set for odd j -> y[j] = (odd ? 16 : 0) - 16 */
    put16(b, 0x3C00);
    b[2] = b[3] = b[4] = b[5] = 0xAA;
    memset(b + 6, 0, 16);
    quant_dequant_row(DT_Q5_0, b, y, 32);
    for (int j = 0; j < 32; j++) CHECK(y[j] == (j & 1 ? 0.0f : -16.0f), "q5_0 y[%d]=%g", j, y[j]);
    /* Q5_1: d = 1, m = 0.5, qh only bit 31 -> y[31] = 15 + 16 + 0.5 */
    put16(b, 0x3C00);
    put16(b + 2, 0x3800);
    b[4] = b[5] = b[6] = 0;
    b[7] = 0x80;
    memset(b + 8, 0xFF, 16);
    quant_dequant_row(DT_Q5_1, b, y, 32);
    for (int j = 0; j < 32; j++) CHECK(y[j] == (j == 31 ? 31.5f : 15.5f), "q5_1 y[%d]=%g", j, y[j]);
    /* Q8_0: d = 0.5 */
    put16(b, 0x3800);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    quant_dequant_row(DT_Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++) CHECK(y[j] == 0.5f * (j - 16), "q8_0 y[%d]=%g", j, y[j]);
    /* Q4_K: d = 1, dmin = 1; sub-block k has scale k+1 (k<4: low 6 bits; k>=4 split) and
     * min 2k; all nibbles 1 (low) / 2 (high). */
    memset(b, 0, 144);
    put16(b, 0x3C00);
    put16(b + 2, 0x3C00);
    for (int k = 0; k < 4; k++) {
        b[4 + k] = (uint8_t)(k + 1);            /* sc[k] */
        b[8 + k] = (uint8_t)(2 * k);            /* m[k] */
        int s2 = k + 5, m2 = 2 * (k + 4);       /* sc[k+4], m[k+4]: low 4 bits + high 2 bits */
        b[12 + k] = (uint8_t)((s2 & 0xF) | (m2 & 0xF) << 4);
        b[4 + k] |= (uint8_t)((s2 >> 4) << 6);
        b[8 + k] |= (uint8_t)((m2 >> 4) << 6);
    }
    memset(b + 16, 0x21, 128);
    quant_dequant_row(DT_Q4_K, b, y, 256);
    for (int k = 0; k < 8; k++) {
        float want = (float)(k + 1) * (float)(k & 1 ? 2 : 1) - (float)(2 * k);
        CHECK(y[32 * k] == want && y[32 * k + 31] == want, "q4_k sub-block %d: %g want %g", k, y[32 * k], want);
    }
    /* Q6_K: d = 1, scale g = g - 8, ql low nibble 1 / high 2, qh = 0b11100100 -> per
     * 32-quarter q = (1|0<<4), (1|1<<4), (2|2<<4), (2|3<<4) */
    memset(b, 0, 210);
    memset(b, 0x21, 128);
    memset(b + 128, 0xE4, 64);
    for (int g = 0; g < 16; g++) b[192 + g] = (uint8_t)(int8_t)(g - 8);
    put16(b + 208, 0x3C00);
    quant_dequant_row(DT_Q6_K, b, y, 256);
    const int qv[4] = { 1, 17, 34, 50 };
    for (int i = 0; i < 256; i++) {
        int g = i / 16, quarter = (i % 128) / 32;
        float want = (float)(g - 8) * (float)(qv[quarter] - 32);
        CHECK(y[i] == want, "q6_k y[%d]=%g want %g", i, y[i], want);
    }
    /* F16, BF16 */
    put16(b, 0x3C00);
    put16(b + 2, 0xC000);
    quant_dequant_row(DT_F16, b, y, 2);
    CHECK(y[0] == 1.0f && y[1] == -2.0f, "f16 %g %g", y[0], y[1]);
    put16(b, 0x3F80);
    put16(b + 2, 0xC040);
    quant_dequant_row(DT_BF16, b, y, 2);
    CHECK(y[0] == 1.0f && y[1] == -3.0f, "bf16 %g %g", y[0], y[1]);
}

/* A matrix packed for every kernel set of this build that has a packed layout for its
 * type (each set its own layout), so each set's packed kernels are tested, not only the
 * best set's. packs_make leaves w->cpu_packed at the best set's copy, as the model loader
 * does; packs_use points it at impl's copy (NULL: impl runs the per-token dots). */
struct packs {
    const struct quant_gemm *gemm[8];
    void *buf[8];
    int n;
};

static void packs_use(const struct packs *pk, struct tensor *w, const struct quant_impl *impl)
{
    w->cpu_packed = NULL;
    for (int i = 0; i < pk->n; i++)
        if (impl->gemm == pk->gemm[i]) w->cpu_packed = pk->buf[i];
}

static void packs_make(struct packs *pk, struct tensor *w)
{
    const struct quant_impl *sets[8];
    int n = quant_impl_simd_list(sets, 8);
    pk->n = 0;
    for (int i = 0; i < n; i++) {
        size_t b = cpu_weight_pack_bytes_impl(sets[i], w);
        if (!b) continue;
        struct threadpool *tp = tp_create(2);
        void *p = aligned_alloc(64, (b + 63) & ~(size_t)63);
        if (!tp || !p) abort();
        cpu_weight_pack_impl(tp, sets[i], w, p);
        tp_free(tp);
        pk->gemm[pk->n] = sets[i]->gemm;
        pk->buf[pk->n++] = p;
    }
    packs_use(pk, w, quant_impl_best());
}

static void packs_free(struct packs *pk)
{
    for (int i = 0; i < pk->n; i++) free(pk->buf[i]);
    pk->n = 0;
}

/* ---- activation quantization: scalar and SIMD write identical bytes ---- */

static void test_quantize_agree(void)
{
    const struct quant_impl *sc = quant_impl_scalar(), *si = quant_impl_simd();
    if (!si) { printf("  (no SIMD kernel set in this build)\n"); return; }
    /* all SIMD sets share one quantizer (checked here) */
    const struct quant_impl *all[6];
    int n_all = quant_impl_simd_list(all, 6);
    for (int k = 0; k < n_all; k++) CHECK(all[k]->quantize == si->quantize, "set %s", all[k]->name);
    struct rng r = { 0x1234567 };
    const int64_t n = 1024;
    const enum dtype acts[] = { DT_Q8_0, DT_Q8_1, DT_Q8_K };
    size_t sz = cpu_matmul_scratch_size(DT_Q4_K, n, 1) + cpu_matmul_scratch_size(DT_Q4_1, n, 1);
    uint8_t *s1 = calloc(1, sz), *s2 = calloc(1, sz);
    for (int a = 0; a < 3; a++) {
        float *x = rand_x(n, 2, 0, &r);
        int qa = quant_act_block(acts[a]);
        struct qact q1 = quant_act_row(s1, acts[a], n, 0), q2 = quant_act_row(s2, acts[a], n, 0);
        sc->quantize(acts[a], x, 0, n / qa, &q1);
        si->quantize(acts[a], x, 0, n / qa, &q2);
        CHECK(memcmp(q1.q, q2.q, (size_t)n) == 0, "act %d q bytes differ", a);
        if (q1.d) CHECK(memcmp(q1.d, q2.d, (size_t)(n / qa) * sizeof(float)) == 0, "act %d d differ", a);
        if (q1.ds) CHECK(memcmp(q1.ds, q2.ds, (size_t)(n / 32) * 2 * sizeof(float)) == 0, "ds differ");
        if (q1.bsums) CHECK(memcmp(q1.bsums, q2.bsums, (size_t)(n / 16) * 2) == 0, "bsums differ");
        /* the quantization error bound used by the matmul tolerance holds */
        for (int64_t i = 0; i < n; i++) {
            float d = q1.ds ? q1.ds[2 * (i / qa)] : q1.d[i / qa];
            /* Q8_1 codes are regrouped per 4 blocks (quant_kernels.h) */
            int64_t at = acts[a] == DT_Q8_1 ? (i % 32 < 16 ? q81_lo(i / 32) : q81_hi(i / 32) - 16) + i % 32 : i;
            CHECK(fabsf(x[i] - d * q1.q[at]) <= 0.5001f * d, "x[%lld]=%g q=%d d=%g", (long long)i, x[i], q1.q[at], d);
        }
        free(x);
    }
    free(s1);
    free(s2);
}

#ifdef GEMM_BF16_DOT
/* x[i] = the bf16 nearest x[i] (ties to even), in place. */
static void round_to_bf16(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

/* BF16 weights on vdpbf16ps (activations rounded to bf16, the pair layout): over odd and
 * even n_in (the padded last pair), partial strips and tiles, on 1 and 2 threads,
 *   |y - ref(bf16(x))| <= acc                  the kernel is exact up to f32 accumulation
 *                                              given x rounded to nearest even (n_in = 1, 2
 *                                              would show truncation: 2^-8 |x| >> acc)
 *   |y - ref(x)| <= sum |w_i| 2^-8 |x_i| + acc  the rounding of x, |x - bf16(x)| <= 2^-8 |x|
 * and prints the largest |y - ref(x)| relative to sum |w_i x_i| next to the f32 kernels'
 * tolerance (n_in + 16) 2^-24. */
static void test_bf16_dot(void)
{
    struct threadpool *pools[2] = { tp_create(1), tp_create(2) };
    struct rng r = { 0xBF16BF16ULL };
    const int64_t n_ins[] = { 1, 2, 17, 33, 320, 577, 1056, 2048 };
    const int n_outs[] = { 1, 17, 64, 130 }, tokens[] = { 1, 2, 13, 33 }, max_nt = 33;
    for (size_t a = 0; a < sizeof n_ins / sizeof n_ins[0]; a++) {
        const int64_t n_in = n_ins[a];
        double worst = 0.0; /* max |y - ref(x)| / sum |w x| over this n_in */
        for (size_t b = 0; b < sizeof n_outs / sizeof n_outs[0]; b++) {
            const int64_t n_out = n_outs[b];
            uint8_t *wd = rand_weights(DT_BF16, n_in, n_out, &r);
            struct tensor w = { .name = "w", .type = DT_BF16, .n_dims = 2, .ne = { n_in, n_out, 1, 1 },
                                .data = wd, .nbytes = dtype_row_bytes(DT_BF16, n_in) * (size_t)n_out };
            struct packs pk;
            packs_make(&pk, &w); /* w runs the best set's packed copy: the vdpbf16ps kernels */
            const size_t ny = (size_t)(n_out * max_nt);
            float *x = rand_x(n_in, max_nt, 0, &r), *xb = malloc(sizeof(float) * (size_t)n_in * max_nt);
            float *ref = malloc(sizeof(float) * ny), *refb = malloc(sizeof(float) * ny), *y = malloc(sizeof(float) * ny);
            float *row = malloc(sizeof(float) * (size_t)n_in);
            double *act = malloc(sizeof(double) * ny), *acc = malloc(sizeof(double) * ny), *sw = malloc(sizeof(double) * ny);
            void *scratch = malloc(cpu_matmul_scratch_size(DT_BF16, n_in, max_nt));
            memcpy(xb, x, sizeof(float) * (size_t)n_in * max_nt);
            round_to_bf16(xb, n_in * max_nt);
            cpu_matmul_ref(&w, x, ref, max_nt);
            cpu_matmul_ref(&w, xb, refb, max_nt);
            out_bounds(&w, xb, max_nt, act, acc); /* acc of the bf16 x; act is 0 (float weights) */
            for (int t = 0; t < max_nt; t++)
                for (int64_t o = 0; o < n_out; o++) {
                    quant_dequant_row(DT_BF16, wd + (size_t)o * dtype_row_bytes(DT_BF16, n_in), row, n_in);
                    double s = 0.0;
                    for (int64_t i = 0; i < n_in; i++) s += fabs((double)row[i] * x[(size_t)t * (size_t)n_in + (size_t)i]);
                    sw[t * n_out + o] = s;
                    act[t * n_out + o] = 0x1p-8 * s;
                }
            for (int k = 0; k < 4; k++)
                for (int p = 0; p < 2; p++) {
                    const int nt = tokens[k];
                    for (size_t i = 0; i < ny; i++) y[i] = NAN;
                    cpu_matmul(pools[p], &w, x, y, nt, scratch);
                    char what[64];
                    snprintf(what, sizeof what, "bf16-dot threads=%d vs ref(bf16 x)", p + 1);
                    CHECK(compare(what, &w, y, refb, nt, act, acc, 1.0, 0, 0) == 0, "%s n_in=%lld", what,
                          (long long)n_in);
                    snprintf(what, sizeof what, "bf16-dot threads=%d vs ref(x)", p + 1);
                    CHECK(compare(what, &w, y, ref, nt, act, acc, 1.0, 1, 0) == 0, "%s n_in=%lld", what,
                          (long long)n_in);
                    for (int64_t i = 0; i < n_out * nt; i++)
                        if (sw[i] > 0.0 && fabs((double)y[i] - ref[i]) / sw[i] > worst)
                            worst = fabs((double)y[i] - ref[i]) / sw[i];
                }
            packs_free(&pk);
            free(wd); free(x); free(xb); free(ref); free(refb); free(y); free(row);
            free(act); free(acc); free(sw); free(scratch);
        }
        printf("  n_in=%-5lld max |y - ref(x)| / sum|w x| = %.3g (f32 kernels' tolerance %.3g)\n", (long long)n_in,
               worst, (double)(n_in + 16) * 0x1p-24);
    }
    for (int p = 0; p < 2; p++) tp_free(pools[p]);
}
#endif

/* ---- cpu_matmul vs cpu_matmul_ref over the grid ---- */

static void grid_type(enum dtype t, struct threadpool **pools, struct rng *r)
{
    const int n_outs[] = { 1, 3, 17, 64, 130 };
    /* 1: decode (per-token dots); 2..: batched kernels where the set has them — a
     * partial token tile, one full tile + 1, several tiles + a partial one */
    const int tokens[] = { 1, 2, 7, GEMM_TILE + 1, 33 };
    int64_t n_ins[6];
    int nn = 0, be = dtype_block_elems(t);
    if (be == 1) {
        n_ins[nn++] = 1; n_ins[nn++] = 2; n_ins[nn++] = 17; n_ins[nn++] = 576;
    } else if (be == 32) {
        /* 1, 2, 7 (a 3-block tail group), 18 and 48 blocks */
        n_ins[nn++] = 32; n_ins[nn++] = 64; n_ins[nn++] = 224; n_ins[nn++] = 576; n_ins[nn++] = 1536;
    } else {
        n_ins[nn++] = 256; n_ins[nn++] = 512; n_ins[nn++] = 4096;
    }
    const int max_nt = 33;
    /* impls[0] is what cpu_matmul runs; then every other kernel set of this build (the
     * portable scalar one, and the AVX2 one where AVX-512 kernels are best) */
    const struct quant_impl *impls[8] = { quant_impl_best() }, *simd[6];
    int n_impls = 1, n_simd = quant_impl_simd_list(simd, 6);
    if (impls[0] != quant_impl_scalar()) impls[n_impls++] = quant_impl_scalar();
    for (int k = 0; k < n_simd; k++)
        if (simd[k] != impls[0]) impls[n_impls++] = simd[k];
    int cases = 0, failed = 0;
    for (int a = 0; a < nn; a++)
        for (int b = 0; b < 5; b++) {
            int64_t n_in = n_ins[a], n_out = n_outs[b];
            uint8_t *wd = rand_weights(t, n_in, n_out, r);
            struct tensor w = { .name = "w", .type = t, .n_dims = 2, .ne = { n_in, n_out, 1, 1 },
                                .data = wd, .nbytes = dtype_row_bytes(t, n_in) * (size_t)n_out };
            struct packs pk;
            packs_make(&pk, &w);
            size_t ssz = cpu_matmul_scratch_size(t, n_in, max_nt);
            uint8_t *scratch = malloc(ssz + 1);
            float *ref = malloc(sizeof(float) * (size_t)(n_out * max_nt));
            float *y = malloc(sizeof(float) * (size_t)(n_out * max_nt));
            float *y2 = malloc(sizeof(float) * (size_t)(n_out * max_nt));
            double *act = malloc(sizeof(double) * (size_t)(n_out * max_nt));
            double *acc = malloc(sizeof(double) * (size_t)(n_out * max_nt));
            for (int mode = 0; mode < 2; mode++) {
                float *x = rand_x(n_in, max_nt, mode, r);
#ifdef GEMM_BF16_DOT
                /* BF16 weights on vdpbf16ps round x to bf16 (test_bf16_dot checks that
                 * rounding and measures its error); here x is in bf16 already, so every
                 * set sees the same x and only the acc term remains */
                if (t == DT_BF16) round_to_bf16(x, n_in * max_nt);
#endif
                cpu_matmul_ref(&w, x, ref, max_nt);
                out_bounds(&w, x, max_nt, act, acc);
                for (int k = 0; k < 5; k++) {
                    int nt = tokens[k];
                    /* SIMD set on 1, 2, 3 threads: each output is one dot call whatever
                     * the split, so the thread counts must agree bitwise. Scalar set on
                     * 1 thread. */
                    for (int p = 0; p < 3; p++) {
                        float *out = p ? y2 : y;
                        for (int64_t i = 0; i < n_out * nt; i++) out[i] = NAN;
                        /* misaligned scratch of exactly the stated size + 1 */
                        packs_use(&pk, &w, impls[0]);
                        cpu_matmul_impl(pools[p], impls[0], &w, x, out, nt, scratch + 1);
                        char what[64];
                        snprintf(what, sizeof what, "%s x%s threads=%d", impls[0]->name,
                                 mode ? "exact" : "random", p + 1);
                        int bad = p ? compare(what, &w, y2, y, nt, act, acc, 0.0, 0, failed > 0)
                                    : compare(what, &w, y, ref, nt, act, acc, 1.0, mode == 0, failed > 0);
                        cases++;
                        if (bad) failed++;
                    }
                    /* the other sets on one thread: against ref, and against the set
                     * cpu_matmul uses (same activation bytes, so only the accumulation
                     * order differs) */
                    for (int m = 1; m < n_impls; m++) {
                        for (int64_t i = 0; i < n_out * nt; i++) y2[i] = NAN;
                        packs_use(&pk, &w, impls[m]);
                        cpu_matmul_impl(pools[0], impls[m], &w, x, y2, nt, scratch + 1);
                        char what[64];
                        snprintf(what, sizeof what, "%s x%s", impls[m]->name, mode ? "exact" : "random");
                        int bad = compare(what, &w, y2, ref, nt, act, acc, 1.0, mode == 0, failed > 0);
                        snprintf(what, sizeof what, "%s-vs-%s", impls[m]->name, impls[0]->name);
                        bad += compare(what, &w, y, y2, nt, act, acc, 2.0, 0, failed > 0);
                        cases++;
                        if (bad) failed++;
                    }
                }
                free(x);
            }
            free(wd);
            packs_free(&pk);
            free(scratch);
            free(ref);
            free(y);
            free(y2);
            free(act);
            free(acc);
        }
    CHECK(failed == 0, "%s: %d of %d comparisons failed", dtype_name(t), failed, cases);
}

#define GRID_TEST(T)                                                               \
    static void test_matmul_##T(void)                                              \
    {                                                                              \
        struct threadpool *pools[3] = { tp_create(1), tp_create(2), tp_create(3) }; \
        struct rng r = { 0x9E3779B97F4A7C15ULL ^ (uint64_t)DT_##T };               \
        grid_type(DT_##T, pools, &r);                                              \
        for (int i = 0; i < 3; i++) tp_free(pools[i]);                              \
    }

GRID_TEST(F32)
GRID_TEST(F16)
GRID_TEST(BF16)
GRID_TEST(Q8_0)
GRID_TEST(Q4_0)
GRID_TEST(Q4_1)
GRID_TEST(Q5_0)
GRID_TEST(Q5_1)
GRID_TEST(Q4_K)
GRID_TEST(Q6_K)

/* cpu_matmul_multi (Q, K, V / gate, up sharing one input) gives bitwise what one
 * cpu_matmul per weight gives, for every kernel set and thread count, and matches ref
 * within the grid tolerance. Includes a mixed-format set (Q4_1 + Q8_0: separate calls). */
static void test_matmul_multi(void)
{
    struct threadpool *pools[3] = { tp_create(1), tp_create(2), tp_create(3) };
    struct rng r = { 0xC0FFEE };
    const struct quant_impl *impls[8] = { quant_impl_best(), quant_impl_scalar() }, *simd[6];
    int n_impls = impls[0] != impls[1] ? 2 : 1, n_simd = quant_impl_simd_list(simd, 6);
    for (int k = 0; k < n_simd; k++)
        if (simd[k] != impls[0]) impls[n_impls++] = simd[k];
    const struct { enum dtype t[3]; int nw; int64_t n_in; int n_out[3]; } cases[] = {
        { { DT_Q4_1, DT_Q4_1, DT_Q4_1 }, 3, 576, { 64, 17, 17 } },
        { { DT_Q4_1, DT_Q4_1 }, 2, 224, { 130, 3 } },
        { { DT_Q4_1, DT_Q5_1, DT_Q4_1 }, 3, 64, { 1, 3, 64 } },
        { { DT_Q8_0, DT_Q4_1 }, 2, 576, { 17, 3 } },
        { { DT_F16, DT_F16, DT_F16 }, 3, 576, { 3, 64, 1 } },
        { { DT_Q4_K, DT_Q6_K }, 2, 512, { 17, 17 } },
    };
    const int tokens[] = { 1, 2, 33 }, max_nt = 33;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int nw = cases[c].nw;
        int64_t n_in = cases[c].n_in;
        struct tensor w[3];
        uint8_t *wd[3];
        struct packs pk[3];
        float *ref[3], *y1[3], *y2[3];
        double *act[3], *acc[3];
        size_t ssz = 64;
        float *x = rand_x(n_in, max_nt, 0, &r);
        for (int k = 0; k < nw; k++) {
            enum dtype t = cases[c].t[k];
            int64_t n_out = cases[c].n_out[k];
            wd[k] = rand_weights(t, n_in, n_out, &r);
            w[k] = (struct tensor){ .name = "w", .type = t, .n_dims = 2, .ne = { n_in, n_out, 1, 1 },
                                    .data = wd[k], .nbytes = dtype_row_bytes(t, n_in) * (size_t)n_out };
            packs_make(&pk[k], &w[k]);
            size_t s = cpu_matmul_scratch_size(t, n_in, max_nt);
            if (s > ssz) ssz = s;
            ref[k] = malloc(sizeof(float) * (size_t)(n_out * max_nt));
            y1[k] = malloc(sizeof(float) * (size_t)(n_out * max_nt));
            y2[k] = malloc(sizeof(float) * (size_t)(n_out * max_nt));
            act[k] = malloc(sizeof(double) * (size_t)(n_out * max_nt));
            acc[k] = malloc(sizeof(double) * (size_t)(n_out * max_nt));
            cpu_matmul_ref(&w[k], x, ref[k], max_nt);
            out_bounds(&w[k], x, max_nt, act[k], acc[k]);
        }
        uint8_t *scratch = malloc(ssz + 1);
        const struct tensor *wp[3] = { &w[0], &w[1], &w[2] };
        for (int m = 0; m < n_impls; m++) {
            for (int k = 0; k < nw; k++) packs_use(&pk[k], &w[k], impls[m]);
            for (int ti = 0; ti < 3; ti++)
                for (int p = 0; p < 3; p++) {
                    int nt = tokens[ti];
                    for (int k = 0; k < nw; k++) {
                        for (int64_t i = 0; i < w[k].ne[1] * nt; i++) y2[k][i] = NAN;
                        cpu_matmul_impl(pools[0], impls[m], &w[k], x, y1[k], nt, scratch + 1);
                    }
                    cpu_matmul_multi_impl(pools[p], impls[m], wp, nw, x, y2, nt, scratch + 1);
                    for (int k = 0; k < nw; k++) {
                        char what[96];
                        snprintf(what, sizeof what, "multi case %zu w%d %s threads=%d nt=%d", c, k,
                                 impls[m]->name, p + 1, nt);
                        CHECK(memcmp(y1[k], y2[k], sizeof(float) * (size_t)(w[k].ne[1] * nt)) == 0,
                              "%s: differs from cpu_matmul", what);
                        CHECK(compare(what, &w[k], y2[k], ref[k], nt, act[k], acc[k], 1.0, 1, 0) == 0,
                              "%s: vs ref", what);
                    }
                }
        }
        if (impls[0] == quant_impl_best()) { /* the public entry point */
            for (int k = 0; k < nw; k++) packs_use(&pk[k], &w[k], impls[0]);
            cpu_matmul_multi(pools[1], wp, nw, x, y2, 1, scratch + 1);
            for (int k = 0; k < nw; k++) {
                cpu_matmul(pools[0], &w[k], x, y1[k], 1, scratch + 1);
                CHECK(memcmp(y1[k], y2[k], sizeof(float) * (size_t)w[k].ne[1]) == 0, "cpu_matmul_multi w%d", k);
            }
        }
        for (int k = 0; k < nw; k++) {
            free(wd[k]); packs_free(&pk[k]); free(ref[k]); free(y1[k]); free(y2[k]); free(act[k]); free(acc[k]);
        }
        free(scratch);
        free(x);
    }
    for (int i = 0; i < 3; i++) tp_free(pools[i]);
}

/* The comparison can fail: swapping the nibble halves of one weight block after computing
 * y must be detected for every quantized 4/5-bit type and for a flipped Q8_0 code. */
/* A token's outputs do not depend on the batch it is computed in: a matmul over a batch
 * (batched kernels where the set has them) gives bitwise what one call per token gives
 * (the one-token kernels), for every kernel set and weight type, on 1 and 2 threads. */
static void test_batch_invariant(void)
{
    const struct quant_impl *impls[8] = { quant_impl_scalar() };
    int n_impls = 1 + quant_impl_simd_list(impls + 1, 7);
    const enum dtype types[] = { DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1,
                                 DT_Q4_K, DT_Q6_K };
    const int nt = 2 * GEMM_TILE + 5;
    struct threadpool *pools[2] = { tp_create(1), tp_create(2) };
    struct rng r = { 0xB47C4ULL };
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        enum dtype t = types[k];
        int64_t n_in = dtype_block_elems(t) == 256 ? 1536 : 1056, n_out = 37; /* 33 blocks: a chunk + 1 */
        uint8_t *wd = rand_weights(t, n_in, n_out, &r);
        struct tensor w = { .name = "w", .type = t, .n_dims = 2, .ne = { n_in, n_out, 1, 1 },
                            .data = wd, .nbytes = dtype_row_bytes(t, n_in) * (size_t)n_out };
        struct packs pk;
        packs_make(&pk, &w);
        float *x = rand_x(n_in, nt, 0, &r);
        float *yb = malloc(sizeof(float) * (size_t)(n_out * nt)), *y1 = malloc(sizeof(float) * (size_t)(n_out * nt));
        float *y2 = malloc(sizeof(float) * (size_t)(n_out * nt));
        void *scratch = malloc(cpu_matmul_scratch_size(t, n_in, nt));
        for (int m = 0; m < n_impls; m++)
            for (int p = 0; p < 2; p++) {
                packs_use(&pk, &w, impls[m]);
                cpu_matmul_impl(pools[p], impls[m], &w, x, yb, nt, scratch);
                if (p == 0) memcpy(y2, yb, sizeof(float) * (size_t)(n_out * nt));
                else CHECK(memcmp(yb, y2, sizeof(float) * (size_t)(n_out * nt)) == 0,
                           "%s %s: 2 threads differ from 1", impls[m]->name, dtype_name(t));
                for (int i = 0; i < nt; i++)
                    cpu_matmul_impl(pools[p], impls[m], &w, x + (size_t)i * (size_t)n_in,
                                    y1 + (size_t)i * (size_t)n_out, 1, scratch);
                int same = memcmp(yb, y1, sizeof(float) * (size_t)(n_out * nt)) == 0;
                CHECK(same, "%s %s threads=%d: batch of %d differs from one token at a time", impls[m]->name,
                      dtype_name(t), p + 1, nt);
            }
        free(wd);
        packs_free(&pk);
        free(x);
        free(yb);
        free(y1);
        free(y2);
        free(scratch);
    }
    for (int p = 0; p < 2; p++) tp_free(pools[p]);
}

/* Every SIMD set that has packed kernels runs them, for one token and for a batch: with
 * its packed copy zeroed (the GGUF bytes untouched) its outputs are all zero, so the
 * packed path, not the per-token dots, produced the results the grid checks. The AVX2
 * set has a layout for every float, 32-block and K-quant type. */
static void test_packed_path_used(void)
{
    const struct quant_impl *sets[8];
    int n = quant_impl_simd_list(sets, 8), with_gemm = 0;
    const enum dtype types[] = { DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1,
                                 DT_Q4_K, DT_Q6_K };
    const int tokens[] = { 1, GEMM_TILE + 1 };
    struct threadpool *tp = tp_create(2);
    struct rng r = { 0x5EED };
    for (int i = 0; i < n; i++) {
        if (!strncmp(sets[i]->name, "avx2", 4))
            for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
                CHECK(sets[i]->gemm && sets[i]->gemm->strip_rows[types[k]], "%s has no packed %s", sets[i]->name,
                      dtype_name(types[k]));
        if (!sets[i]->gemm) continue;
        with_gemm++;
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
            enum dtype t = types[k];
            int64_t n_in = dtype_block_elems(t) == 256 ? 512 : 96, n_out = 21;
            uint8_t *wd = rand_weights(t, n_in, n_out, &r);
            struct tensor w = { .name = "w", .type = t, .n_dims = 2, .ne = { n_in, n_out, 1, 1 },
                                .data = wd, .nbytes = dtype_row_bytes(t, n_in) * (size_t)n_out };
            size_t b = cpu_weight_pack_bytes_impl(sets[i], &w);
            if (!b) { free(wd); continue; }
            uint8_t *p = aligned_alloc(64, (b + 63) & ~(size_t)63);
            cpu_weight_pack_impl(tp, sets[i], &w, p);
            w.cpu_packed = p;
            float *x = rand_x(n_in, GEMM_TILE + 1, 0, &r);
            float *y = malloc(sizeof(float) * (size_t)(n_out * (GEMM_TILE + 1)));
            void *scratch = malloc(cpu_matmul_scratch_size(t, n_in, GEMM_TILE + 1));
            size_t pb = sets[i]->gemm->packed_bytes(t, n_in, n_out);
            for (int z = 0; z < 2; z++) {
                if (z) memset(p + (b - pb), 0, pb); /* the packed copy only, past its header */
                for (int ti = 0; ti < 2; ti++) {
                    cpu_matmul_impl(tp, sets[i], &w, x, y, tokens[ti], scratch);
                    int nonzero = 0;
                    for (int64_t e = 0; e < n_out * tokens[ti]; e++) nonzero += y[e] != 0.0f;
                    CHECK(z ? nonzero == 0 : nonzero > 0, "%s %s nt=%d: %d nonzero outputs with the packed copy %s",
                          sets[i]->name, dtype_name(t), tokens[ti], nonzero, z ? "zeroed" : "intact");
                }
            }
            free(scratch);
            free(y);
            free(x);
            free(p);
            free(wd);
        }
    }
    if (n) CHECK(with_gemm > 0, "no SIMD set has packed kernels");
    tp_free(tp);
}

static void test_compare_detects_errors(void)
{
    struct threadpool *tp = tp_create(1);
    struct rng r = { 77 };
    const enum dtype ts[] = { DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q6_K, DT_F16 };
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        enum dtype t = ts[k];
        int64_t n_in = dtype_block_elems(t) == 256 ? 512 : 64, n_out = 4;
        uint8_t *wd = rand_weights(t, n_in, n_out, &r);
        struct tensor w = { .name = "w", .type = t, .n_dims = 2, .ne = { n_in, n_out, 1, 1 },
                            .data = wd, .nbytes = dtype_row_bytes(t, n_in) * (size_t)n_out };
        float *x = rand_x(n_in, 1, 1, &r);
        float y[4], ref[4];
        double act[4], acc[4];
        void *scratch = malloc(cpu_matmul_scratch_size(t, n_in, 1));
        cpu_matmul(tp, &w, x, y, 1, scratch);
        /* corrupt the middle of row 2: rotate its bytes by 4 bits (a nibble-order bug) */
        size_t rb = dtype_row_bytes(t, n_in), off = 2 * rb + rb / 2;
        for (int i = 0; i < 8; i++) wd[off + i] = (uint8_t)(wd[off + i] << 4 | wd[off + i] >> 4) ^ 0x11;
        cpu_matmul_ref(&w, x, ref, 1);
        out_bounds(&w, x, 1, act, acc);
        CHECK(compare("negative", &w, y, ref, 1, act, acc, 1.0, 0, 1) > 0, "%s: corruption not detected", dtype_name(t));
        free(scratch);
        free(x);
        free(wd);
    }
    tp_free(tp);
}

static void test_scratch_size(void)
{
    /* the packed kernels' activation tiles (one token: one tile), or for types without a
     * packed layout the per-token rows; quantized ones hold the larger of the per-token
     * rows and the tiles (two tiles for 13 tokens) */
    CHECK(cpu_matmul_scratch_size(DT_F16, 576, 1) >= gemm_act_bytes(DT_F16, 576, 1), "f16 decode");
    CHECK(cpu_matmul_scratch_size(DT_F16, 576, 64) >= gemm_act_bytes(DT_F16, 576, 64), "f16 batch");
    CHECK(gemm_act_bytes(DT_BF16, 576, 13) == 2 * (size_t)576 * GEMM_TILE * sizeof(float), "bf16 tiles");
    CHECK(gemm_act_bytes(DT_Q4_1, 576, 13) == 2 * (size_t)18 * GEMM_QACT_BLOCK, "q4_1 tiles");
    CHECK(cpu_matmul_scratch_size(DT_Q4_1, 576, 13) >= gemm_act_bytes(DT_Q4_1, 576, 13), "q4_1 batch");
    CHECK(cpu_matmul_scratch_size(DT_Q8_0, 1536, 512) >= gemm_act_bytes(DT_Q8_0, 1536, 512), "q8_0 batch");
    /* K-quants: 32-element blocks with the super-block's scale; Q6_K with two offset sums */
    CHECK(gemm_act_bytes(DT_Q4_K, 512, 13) == 2 * (size_t)16 * GEMM_QACT_BLOCK, "q4_k tiles");
    CHECK(gemm_act_bytes(DT_Q6_K, 512, 13) == 2 * (size_t)16 * GEMM_QACT16_BLOCK, "q6_k tiles");
    CHECK(cpu_matmul_scratch_size(DT_Q6_K, 1536, 512) >= gemm_act_bytes(DT_Q6_K, 1536, 512), "q6_k batch");
    size_t a = cpu_matmul_scratch_size(DT_Q4_1, 576, 1), b = cpu_matmul_scratch_size(DT_Q4_1, 576, 2);
    CHECK(a >= gemm_act_bytes(DT_Q4_1, 576, 1) && b >= a && b >= 2 * (576 + 18 * 8), "q4_1 %zu %zu", a, b);
    CHECK(cpu_matmul_scratch_size(DT_Q6_K, 4096, 1) >= 4096 + 16 * 4 + 256 * 2, "q6_k");
}

int main(void)
{
    const struct quant_impl *sets[6];
    int n = quant_impl_simd_list(sets, 6);
    printf("kernel sets: scalar");
    for (int i = 0; i < n; i++) printf(", %s", sets[i]->name);
    printf("; cpu_matmul uses %s\n", quant_impl_best()->name);
    RUN(test_dequant_known);
    RUN(test_quantize_agree);
    RUN(test_matmul_multi);
    RUN(test_scratch_size);
    RUN(test_batch_invariant);
    RUN(test_packed_path_used);
    RUN(test_compare_detects_errors);
    RUN(test_matmul_F32);
    RUN(test_matmul_F16);
    RUN(test_matmul_BF16);
#ifdef GEMM_BF16_DOT
    RUN(test_bf16_dot);
#endif
    RUN(test_matmul_Q8_0);
    RUN(test_matmul_Q4_0);
    RUN(test_matmul_Q4_1);
    RUN(test_matmul_Q5_0);
    RUN(test_matmul_Q5_1);
    RUN(test_matmul_Q4_K);
    RUN(test_matmul_Q6_K);
    return test_summary();
}
