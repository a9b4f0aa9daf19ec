/* tool_bench_matmul.c — cpu_matmul throughput against the machine's memory-read
 * bandwidth, measured side by side in one process.
 *
 *   tool_bench_matmul [--quick] [--prefill [--type Q4_K]] [--peak] [--threads 1,2] [--mb 256] [--scalar]
 *
 * For each case (type, n_in x n_out) and thread count it alternates rounds of (a) a plain
 * AVX2 read (sum) over a --mb MB buffer split across the same pool — the roofline, since
 * decode must read every weight byte once per token — and (b) cpu_matmul with
 * num_tokens = 1 over as many copies of the weight matrix as fill --mb MB, laid out one
 * after another (so the weights come from DRAM, not the 32 MB L3), in adjacent pairs of
 * ~24 MB each; the medians over the pairs are printed (ratio = median of per-pair
 * ratios). Then num_tokens = 64 (prefill), best of several calls.
 * Columns: weight GB/s of the matmul, memory-read GB/s, their ratio (decode target
 * >= 0.8), prefill GFLOP/s (2 * n_in * n_out * 64 per call) and its weight GB/s.
 * --scalar uses the portable kernel set instead of the SIMD one. Default run < 30 s.
 * --prefill instead times the model's shapes at 512 tokens: the batched kernels against
 * the per-token path (in an x86-64-v3 build the AVX2 set's own dots on the unpacked
 * matrix) and a register-only peak of the same instruction (run_prefill); the
 * K-quants (n_in a multiple of 256) on ffn down and on a 2048-wide layer's shapes;
 * --type (a name as printed, e.g. Q6_K) times that weight type only.
 * --peak prints the register-only peak of every instruction this CPU has (peak.h) per
 * thread count, and which one each kernel set uses for Q4_1, Q8_0, Q4_K and F16.
 */
#define _POSIX_C_SOURCE 200809L
#include "backend/cpu/peak.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_kernels.h"
#include "util/half.h"
#include "util/threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define MAX_THREADS 64
#define PREFILL_TOKENS 64
#define CHUNK (24u << 20) /* bytes per half of a measurement pair */
#define MAX_PAIRS 200

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- memory-read roofline ---- */

struct readjob {
    const uint8_t *buf;
    size_t bytes;
    uint64_t sums[MAX_THREADS * 8]; /* one cache line per thread */
};

static void read_task(void *arg, int ith, int nth)
{
    struct readjob *j = arg;
    long b, e;
    tp_split((long)(j->bytes / 128), ith, nth, &b, &e);
    const uint8_t *p = j->buf + (size_t)b * 128, *end = j->buf + (size_t)e * 128;
#if defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; p < end; p += 128) {
        a0 = _mm256_add_epi32(a0, _mm256_load_si256((const __m256i *)p));
        a1 = _mm256_add_epi32(a1, _mm256_load_si256((const __m256i *)(p + 32)));
        a2 = _mm256_add_epi32(a2, _mm256_load_si256((const __m256i *)(p + 64)));
        a3 = _mm256_add_epi32(a3, _mm256_load_si256((const __m256i *)(p + 96)));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
    j->sums[ith * 8] = (uint64_t)_mm256_extract_epi64(s, 0) + (uint64_t)_mm256_extract_epi64(s, 3);
#else
    uint64_t s = 0;
    for (; p < end; p += 8) { uint64_t v; memcpy(&v, p, 8); s += v; }
    j->sums[ith * 8] = s;
#endif
}

/* Reads bytes (a multiple of 128) from buf with the pool; returns a checksum. */
static uint64_t mem_read_sum(struct threadpool *tp, const uint8_t *buf, size_t bytes)
{
    struct readjob j = { .buf = buf, .bytes = bytes };
    tp_run(tp, read_task, &j);
    uint64_t s = 0;
    for (int i = 0; i < tp_size(tp); i++) s += j.sums[i * 8];
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- synthetic weights ---- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

/* Random blocks with finite scales (like tests/c/test_quant.c). */
static void fill_weights(enum dtype t, uint8_t *w, int64_t n, uint64_t *rng)
{
    size_t nbytes = dtype_row_bytes(t, n);
    for (size_t i = 0; i < nbytes; i++) w[i] = (uint8_t)rng_next(rng);
    int be = dtype_block_elems(t), bb = dtype_block_bytes(t);
    uint16_t sc = fp32_to_fp16(0.01f);
    for (int64_t i = 0; i < n / be; i++) {
        uint8_t *b = w + i * bb;
        float f = (float)((int)(rng_next(rng) % 2001) - 1000) / 1000.0f;
        switch (t) {
        case DT_F32: memcpy(b, &f, 4); break;
        case DT_F16: put16(b, fp32_to_fp16(f)); break;
        case DT_BF16: put16(b, fp32_to_bf16(f)); break;
        case DT_Q4_1: case DT_Q5_1: case DT_Q4_K: put16(b, sc); put16(b + 2, sc); break;
        case DT_Q6_K: put16(b + 208, sc); break;
        default: put16(b, sc); break;
        }
    }
}

struct bcase {
    enum dtype type;
    int64_t n_in, n_out;
    const char *what;
};

/* ---- prefill mode: batched kernels against the per-token path and the peak ---- */

#define PF_TOKENS 512
#define PF_REPEATS 7

/* Peak G(FL)OP/s of the pool for the instruction impl's kernels use on type t (peak.h):
 * one short run (the caller takes the best over its repeats); 0 where this CPU lacks it. */
static double peak_gops(struct threadpool *tp, const struct quant_impl *impl, enum dtype t)
{
    char err[256];
    double g = 0;
    if (cpu_peak_measure(tp, cpu_peak_kind_for(impl, t), 0.01, 1, &g, err, sizeof err)) fprintf(stderr, "%s\n", err);
    return g;
}

/* Seconds per call of cpu_matmul_impl at nt tokens (best of the calls in ~40 ms). */
static double time_prefill(struct threadpool *tp, const struct quant_impl *impl, const struct tensor *w,
                           const float *x, float *y, void *scratch, int nt)
{
    double best = 1e30, t0 = now_s();
    int calls = 0;
    do {
        double t1 = now_s();
        cpu_matmul_impl(tp, impl, w, x, y, nt, scratch);
        double e = now_s() - t1;
        if (e < best) best = e;
        calls++;
    } while (calls < 2 || now_s() - t0 < 0.04);
    return best;
}

/* For each weight type of interest and each of the model's shapes: GFLOP/s of the
 * per-token path (old) and the packed-weight kernels (new) at PF_TOKENS tokens, and the
 * register-only peak of the instruction the batched kernels use, per thread count.
 * Repeats alternate old / new / peak (other processes share the cores) and the medians
 * are printed. */
static int run_prefill(const int *threads, int n_threads, const char *only)
{
    const struct quant_impl *sets[8], *gemm = NULL, *old = NULL;
    int ns = quant_impl_simd_list(sets, 8);
    for (int i = 0; i < ns; i++) {
        if (sets[i]->gemm) gemm = sets[i];
        else old = sets[i]; /* the last per-token set: the best one before batching */
    }
    /* an x86-64-v3 build has one SIMD set, the AVX2 one with packed kernels: its
     * per-token dots (run on the unpacked matrix) are the old path */
    if (!old) old = gemm;
    if (!gemm || !old) {
        fprintf(stderr, "this build has no batched kernel set\n");
        return 1;
    }
    const enum dtype types[] = { DT_Q4_1, DT_Q8_0, DT_Q4_K, DT_Q6_K, DT_F16, DT_BF16 };
    /* SmolLM2-135M's shapes; K-quants need n_in % 256 == 0, so of those only ffn down
     * (a Q4_K_M file stores the others as other types), plus a 2048-wide layer's shapes
     * for them */
    const struct { int64_t n_in, n_out; const char *what; } shapes[] = {
        { 576, 576, "attn q/o" }, { 576, 192, "attn k/v" }, { 576, 1536, "ffn gate/up" }, { 1536, 576, "ffn down" },
        { 2048, 2048, "2k attn q/o" }, { 2048, 5632, "2k ffn up" }, { 5632, 2048, "2k ffn down" },
    };
    const int n_shapes = 7;
    /* per layer: q+o, k+v, gate+up, down (the 2048-wide shapes are not in the layer sum) */
    const int weight_of_shape[] = { 2, 2, 2, 1, 0, 0, 0 };
    float *x = malloc(sizeof(float) * 5632 * PF_TOKENS), *y = malloc(sizeof(float) * 5632 * PF_TOKENS);
    uint8_t *wbuf = malloc((size_t)5632 * 2048 * 4);
    uint64_t rng = 7;
    for (int64_t i = 0; i < 5632 * PF_TOKENS; i++) x[i] = (float)((int)(rng_next(&rng) % 2001) - 1000) / 1000.0f;
    printf("prefill: %d tokens; old = %s (per-token dots), new = %s; peak = register-only loop of the\n"
           "new kernels' instruction on the same threads (%s for q4_1/q8_0, %s for f16, %s for bf16),\n"
           "best repeat; kernels: medians of %d alternating repeats\n", PF_TOKENS, old->name, gemm->name,
           cpu_peak_kind_name(cpu_peak_kind_for(gemm, DT_Q4_1)), cpu_peak_kind_name(cpu_peak_kind_for(gemm, DT_F16)),
           cpu_peak_kind_name(cpu_peak_kind_for(gemm, DT_BF16)), PF_REPEATS);
    printf("1-token columns: weight GB/s of one token (old dots / the packed kernels with one token), weights\n"
           "in cache (one matrix, called repeatedly): the kernels' compute rate, not DRAM\n");
    printf("%-5s %-10s %-12s %3s | %9s %9s %9s | %6s %6s | %7s %7s\n", "type", "n_in x out", "", "thr", "old GF/s",
           "new GF/s", "peak", "new/pk", "speedup", "1t old", "1t new");
    for (int ti = 0; ti < n_threads; ti++) {
        struct threadpool *tp = tp_create(threads[ti]);
        for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
            enum dtype t = types[c];
            if (only && strcmp(only, dtype_name(t))) continue;
            double layer_old = 0, layer_new = 0, layer_flops = 0, layer_peak = 0;
            for (int sh = 0; sh < n_shapes; sh++) {
                int64_t n_in = shapes[sh].n_in, n_out = shapes[sh].n_out;
                if (n_in % dtype_block_elems(t)) continue;
                if (dtype_block_elems(t) < 256 && !weight_of_shape[sh]) continue; /* 2048-wide: K-quants only */
                fill_weights(t, wbuf, n_in * n_out, &rng);
                struct tensor w = { .name = "w", .type = t, .n_dims = 2, .ne = { n_in, n_out, 1, 1 },
                                    .data = wbuf, .nbytes = dtype_row_bytes(t, n_in) * (size_t)n_out };
                /* the new set reads the matrix packed, as the model loader leaves it */
                size_t pb = cpu_weight_pack_bytes_impl(gemm, &w);
                void *packed = aligned_alloc(64, (pb + 63) & ~(size_t)63);
                cpu_weight_pack_impl(tp, gemm, &w, packed);
                w.cpu_packed = packed;
                struct tensor w_old = w; /* the old path never reads a packed copy */
                w_old.cpu_packed = NULL;
                void *scratch = malloc(cpu_matmul_scratch_size(t, n_in, PF_TOKENS));
                double r_old[PF_REPEATS], r_new[PF_REPEATS], r_pk[PF_REPEATS], d_old[PF_REPEATS], d_new[PF_REPEATS];
                for (int r = 0; r < PF_REPEATS; r++) {
                    r_old[r] = time_prefill(tp, old, &w_old, x, y, scratch, PF_TOKENS);
                    r_new[r] = time_prefill(tp, gemm, &w, x, y, scratch, PF_TOKENS);
                    r_pk[r] = peak_gops(tp, gemm, t);
                    d_old[r] = time_prefill(tp, old, &w_old, x, y, scratch, 1);
                    d_new[r] = time_prefill(tp, gemm, &w, x, y, scratch, 1);
                }
                double flops = 2.0 * (double)n_in * (double)n_out * PF_TOKENS;
                /* the peak is the best repeat (a rate no kernel can beat; other processes
                 * only lower it), the kernels the median repeat */
                double to = median(r_old, PF_REPEATS), tn = median(r_new, PF_REPEATS), pk = 0;
                for (int r = 0; r < PF_REPEATS; r++) pk = r_pk[r] > pk ? r_pk[r] : pk;
                char shape[32];
                snprintf(shape, sizeof shape, "%lldx%lld", (long long)n_in, (long long)n_out);
                double wb = (double)w.nbytes;
                printf("%-5s %-10s %-12s %3d | %9.1f %9.1f %9.1f | %6.2f %6.2fx | %7.1f %7.1f\n", dtype_name(t), shape,
                       shapes[sh].what, threads[ti], flops / to / 1e9, flops / tn / 1e9, pk, flops / tn / 1e9 / pk,
                       to / tn, wb / median(d_old, PF_REPEATS) / 1e9, wb / median(d_new, PF_REPEATS) / 1e9);
                fflush(stdout);
                layer_old += weight_of_shape[sh] * to;
                layer_new += weight_of_shape[sh] * tn;
                layer_flops += weight_of_shape[sh] * flops;
                layer_peak = pk > layer_peak ? pk : layer_peak;
                free(scratch);
                free(packed);
            }
            if (dtype_block_elems(t) < 256) /* the K-quants ran only some of the layer's shapes */
                printf("%-5s %-10s %-12s %3d | %9.1f %9.1f %9.1f | %6.2f %6.2fx\n", dtype_name(t), "layer", "(7 matmuls)",
                       threads[ti], layer_flops / layer_old / 1e9, layer_flops / layer_new / 1e9, layer_peak,
                       layer_flops / layer_new / 1e9 / layer_peak, layer_old / layer_new);
        }
        tp_free(tp);
    }
    free(x);
    free(y);
    free(wbuf);
    return 0;
}

/* --peak: every available peak loop at each thread count, then the kernel sets' choices. */
static int run_peak(const int *threads, int n_threads)
{
    printf("%-32s %3s | %9s\n", "instruction", "thr", "G(FL)OP/s");
    for (int ti = 0; ti < n_threads; ti++) {
        struct threadpool *tp = tp_create(threads[ti]);
        for (int k = 0; k < CPU_PEAK_KIND_COUNT_; k++) {
            if (!cpu_peak_kind_available((enum cpu_peak_kind)k)) continue;
            char err[256];
            double g = 0;
            if (cpu_peak_measure(tp, (enum cpu_peak_kind)k, 0.05, 5, &g, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                tp_free(tp);
                return 1;
            }
            printf("%-32s %3d | %9.1f\n", cpu_peak_kind_name((enum cpu_peak_kind)k), threads[ti], g);
            fflush(stdout);
        }
        tp_free(tp);
    }
    const struct quant_impl *sets[8];
    int ns = quant_impl_simd_list(sets, 8);
    sets[ns++] = quant_impl_scalar();
    const enum dtype types[] = { DT_Q4_1, DT_Q8_0, DT_Q4_K, DT_F16, DT_BF16 };
    for (int i = 0; i < ns; i++) {
        printf("%s%s:", sets[i]->name, sets[i] == quant_impl_best() ? " (default)" : "");
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
            printf(" %s %s;", dtype_name(types[t]), cpu_peak_kind_name(cpu_peak_kind_for(sets[i], types[t])));
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    int quick = 0, use_scalar = 0, prefill = 0, peak = 0, threads[8] = { 1, 2 }, n_threads = 2;
    const char *only = NULL;
    size_t mb = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--prefill")) prefill = 1;
        else if (!strcmp(argv[i], "--peak")) peak = 1;
        else if (!strcmp(argv[i], "--scalar")) use_scalar = 1;
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = 0;
            for (char *s = strtok(argv[++i], ","); s && n_threads < 8; s = strtok(NULL, ","))
                threads[n_threads++] = atoi(s);
        } else {
            fprintf(stderr, "usage: %s [--quick] [--prefill [--type Q4_K]] [--peak] [--threads 1,2] [--mb 256] [--scalar]\n",
                    argv[0]);
            return 2;
        }
    }
    if (prefill) return run_prefill(threads, n_threads, only);
    if (peak) return run_peak(threads, n_threads);
    const struct bcase all[] = {
        { DT_Q8_0, 576, 49152, "output head" },
        { DT_Q4_1, 576, 1536, "ffn gate/up" },
        { DT_Q4_1, 1536, 576, "ffn down" },
        { DT_Q4_1, 576, 576, "attn q/o" },
        { DT_Q4_0, 576, 1536, "" },
        { DT_Q5_0, 576, 1536, "" },
        { DT_Q5_1, 576, 1536, "" },
        { DT_Q8_0, 576, 1536, "" },
        { DT_Q4_K, 1536, 576, "" },
        { DT_Q6_K, 1536, 576, "" },
        { DT_F16, 576, 1536, "" },
        { DT_BF16, 576, 1536, "" },
        { DT_F32, 576, 1536, "" },
    };
    int n_cases = quick ? 3 : (int)(sizeof all / sizeof all[0]);
    double min_time = quick ? 0.3 : 0.5;
    const struct quant_impl *impl = use_scalar ? quant_impl_scalar() : quant_impl_best();

    size_t buf_bytes = mb << 20;
    uint8_t *rbuf = aligned_alloc(64, buf_bytes), *wbuf = aligned_alloc(64, buf_bytes + (64u << 20));
    if (!rbuf || !wbuf) { fprintf(stderr, "out of memory\n"); return 1; }
    memset(rbuf, 1, buf_bytes);
    int64_t max_in = 1536;
    float *x = malloc(sizeof(float) * (size_t)(max_in * PREFILL_TOKENS));
    float *y = malloc(sizeof(float) * (size_t)(49152 * PREFILL_TOKENS));
    uint64_t rng = 42;
    for (int64_t i = 0; i < max_in * PREFILL_TOKENS; i++) x[i] = (float)((int)(rng_next(&rng) % 2001) - 1000) / 1000.0f;

    printf("kernels: %s; weights cycle through >= %zu MB of copies; L3 is 32 MB here\n", impl->name, mb);
    printf("%-5s %-12s %-12s %3s | %9s %9s %6s | %9s %9s\n", "type", "n_in x n_out", "", "thr",
           "mm GB/s", "mem GB/s", "ratio", "pf GFLOP/s", "pf GB/s");
    for (int c = 0; c < n_cases; c++) {
        const struct bcase *bc = &all[c];
        size_t mat = dtype_row_bytes(bc->type, bc->n_in) * (size_t)bc->n_out;
        int copies = (int)((buf_bytes + mat - 1) / mat);
        if (copies < 2) copies = 2;
        fill_weights(bc->type, wbuf, bc->n_in * bc->n_out, &rng);
        for (int k = 1; k < copies; k++) memcpy(wbuf + (size_t)k * mat, wbuf, mat);
        size_t ssz = cpu_matmul_scratch_size(bc->type, bc->n_in, PREFILL_TOKENS);
        void *scratch = malloc(ssz);
        for (int ti = 0; ti < n_threads; ti++) {
            struct threadpool *tp = tp_create(threads[ti]);
            struct tensor w = { .name = "w", .type = bc->type, .n_dims = 2, .ne = { bc->n_in, bc->n_out, 1, 1 },
                                .data = wbuf, .nbytes = mat };
            /* every copy packed too, as the model loader leaves matrices (when the kernel
             * set has a packed layout for the type): the kernels read only the packed copy */
            size_t pm = (cpu_weight_pack_bytes_impl(impl, &w) + 63) & ~(size_t)63;
            uint8_t *pbuf = pm ? aligned_alloc(64, pm * (size_t)copies) : NULL;
            if (pbuf) {
                cpu_weight_pack_impl(tp, impl, &w, pbuf);
                for (int k = 1; k < copies; k++) memcpy(pbuf + (size_t)k * pm, pbuf, pm);
            }
#define USE_COPY(k) (w.data = wbuf + (size_t)(k) * mat, w.cpu_packed = pbuf ? pbuf + (size_t)(k) * pm : NULL)
            for (int k = 0; k < copies; k++) { /* warm-up pass (page faults, pool spin-up) */
                USE_COPY(k);
                cpu_matmul_impl(tp, impl, &w, x, y, 1, scratch);
            }
            /* Pairs: read CHUNK bytes of the roofline buffer, then run decode matmuls over
             * the next copies until as many weight bytes were read (or the reverse order
             * on odd pairs). Both halves of a pair see the same load from other
             * processes on this shared machine, so the ratio is taken per pair and the
             * medians are reported. Each half reads memory no earlier half left in L3. */
            int per = (int)((CHUNK + mat - 1) / mat); /* matmuls per pair */
            size_t chunk = (size_t)per * mat;
            size_t roff = 0;
            int kcopy = 0, np = 0;
            double r_mem[MAX_PAIRS], r_mm[MAX_PAIRS], r_ratio[MAX_PAIRS], t0 = now_s();
            do {
                double tm = 0, tw = 0;
                for (int half = 0; half < 2; half++) {
                    if ((half == 0) == (np % 2 == 0)) {
                        if (roff + chunk > buf_bytes) roff = 0;
                        double t1 = now_s();
                        mem_read_sum(tp, rbuf + roff, chunk & ~(size_t)127);
                        tm = now_s() - t1;
                        roff += chunk;
                    } else {
                        double t1 = now_s();
                        for (int k = 0; k < per; k++, kcopy = (kcopy + 1) % copies) {
                            USE_COPY(kcopy);
                            cpu_matmul_impl(tp, impl, &w, x, y, 1, scratch);
                        }
                        tw = now_s() - t1;
                    }
                }
                r_mem[np] = (double)chunk / tm / 1e9;
                r_mm[np] = (double)chunk / tw / 1e9;
                r_ratio[np] = tm / tw;
                np++;
            } while (np < MAX_PAIRS && (np < 3 || now_s() - t0 < min_time) && now_s() - t0 < 3 * min_time);
            double mem = median(r_mem, np), gbs = median(r_mm, np), ratio = median(r_ratio, np);
            /* prefill: 64 tokens per call, best of several short timings */
            double el = 1e30;
            long pcalls = 0;
            t0 = now_s();
            do {
                double t1 = now_s();
                USE_COPY(pcalls % copies);
                cpu_matmul_impl(tp, impl, &w, x, y, PREFILL_TOKENS, scratch);
                double e = now_s() - t1;
                if (e < el) el = e;
                pcalls++;
            } while (now_s() - t0 < min_time / 2 || pcalls < 3);
            double flops = 2.0 * (double)bc->n_in * (double)bc->n_out * PREFILL_TOKENS;
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)bc->n_in, (long long)bc->n_out);
            printf("%-5s %-12s %-12s %3d | %9.2f %9.2f %6.2f | %9.1f %9.2f\n", dtype_name(bc->type), shape,
                   bc->what, threads[ti], gbs, mem, ratio, flops / el / 1e9,
                   (double)mat / el / 1e9);
            fflush(stdout);
            free(pbuf);
#undef USE_COPY
            tp_free(tp);
        }
        free(scratch);
    }
    free(rbuf);
    free(wbuf);
    free(x);
    free(y);
    return 0;
}
