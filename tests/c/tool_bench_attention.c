/* tool_bench_attention.c — prefill attention: the blocked kernel (cpu_paged_attention)
 * against the previous per-row kernel (tests/c/attention_ref.h), side by side in one run.
 *
 *   tool_bench_attention [--ctx 128,512,2048] [--threads 1,2] [--kv f16] [--reps 5]
 *                        [--heads 9,3] [--head-dim 64]
 *
 * One sequence prefills ctx tokens from an empty context (the causal triangle) over a
 * shuffled block table, block_size 16; the default shape is SmolLM2-135M's attention (9
 * query heads, 3 KV heads, head_dim 64) with an f16 cache, as `tessera bench` runs it. For
 * each (ctx, threads) the two kernels alternate for --reps rounds; the table shows the
 * median time of each per layer call, the speedup (median of per-round ratios), and the
 * blocked kernel's GFLOP/s counting 4 * head_dim flops per (query row, head, visible key);
 * then the same for one decode token at position ctx (the medians of 20 calls per round).
 * It also checks that both agree within the test tolerance and prints the worst error.
 */
#define _POSIX_C_SOURCE 200809L
#include "attention_ref.h"

#include "backend/cpu/ops.h"
#include "util/kv_dtype.h"
#include "util/threadpool.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIST 16
#define MAX_REPS 101

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

static int parse_list(const char *s, int *out)
{
    int n = 0;
    while (*s && n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

struct bench_case {
    int ctx, H, HKV, D, BS;
    enum kv_dtype dt;
};

/* Times one (ctx, threads) case; prints one table row. Returns 0, or -1 when out of memory. */
static int run_case(const struct bench_case *c, struct threadpool *tp, int reps)
{
    int T = c->ctx, H = c->H, HKV = c->HKV, D = c->D, BS = c->BS;
    int max_blocks = (T + BS - 1) / BS, num_blocks = max_blocks + 1;
    size_t pool_elems = (size_t)num_blocks * 2 * HKV * BS * D;
    int nth = tp ? tp_size(tp) : 1;
    size_t sf = cpu_paged_attention_scratch_floats(nth, T), rf = ref_paged_attention_scratch_floats(nth, T);
    void *pool = calloc(pool_elems, kv_dtype_size(c->dt));
    float *q = malloc(sizeof(float) * (size_t)T * H * D), *k = malloc(sizeof(float) * (size_t)T * HKV * D);
    float *v = malloc(sizeof(float) * (size_t)T * HKV * D), *out_new = malloc(sizeof(float) * (size_t)T * H * D);
    float *out_old = malloc(sizeof(float) * (size_t)T * H * D), *scratch = malloc(sizeof(float) * (sf > rf ? sf : rf));
    int32_t *bt = malloc(sizeof(int32_t) * max_blocks);
    int64_t *slots = malloc(sizeof(int64_t) * T);
    int rc = -1;
    if (!pool || !q || !k || !v || !out_new || !out_old || !scratch || !bt || !slots) goto fail;

    for (size_t i = 0; i < (size_t)T * H * D; i++) q[i] = frand();
    for (size_t i = 0; i < (size_t)T * HKV * D; i++) k[i] = 2.0f * frand(), v[i] = frand();
    for (int i = 0; i < max_blocks; i++) bt[i] = i;
    for (int i = max_blocks - 1; i > 0; i--) { /* shuffled, as a long-running pool is */
        int j = (int)((frand() + 1.0f) * 0.5f * (i + 1)) % (i + 1), t = bt[i];
        bt[i] = bt[j];
        bt[j] = t;
    }
    for (int p = 0; p < T; p++) slots[p] = (int64_t)bt[p / BS] * BS + p % BS;
    struct kv_layer kv = { .data = pool, .dtype = c->dt, .num_blocks = num_blocks, .block_size = BS,
                           .n_kv_heads = HKV, .head_dim = D, .k_scale = c->dt == KV_FP8_E4M3 ? 0.02f : 1.0f,
                           .v_scale = c->dt == KV_FP8_E4M3 ? 0.01f : 1.0f };
    cpu_kv_write(&kv, k, v, slots, T);

    int32_t qs[2] = { 0, T }, lens[1] = { T };
    struct paged_attention_args a = { .q = q, .kv = &kv, .query_start = qs, .seq_lens = lens, .block_tables = bt,
                                      .max_blocks_per_seq = max_blocks, .num_seqs = 1, .num_tokens = T,
                                      .n_heads = H, .scale = 1.0f / sqrtf((float)D), .scratch = scratch,
                                      .max_ctx = T };
    struct paged_attention_args an = a, ao = a;
    an.out = out_new;
    ao.out = out_old;
    cpu_paged_attention(tp, &an); /* warm-up, and the agreement check */
    ref_paged_attention(tp, &ao);
    double worst = 0;
    for (size_t i = 0; i < (size_t)T * H * D; i++) {
        double e = fabs((double)out_new[i] - out_old[i]) / (2e-5 + 2e-4 * fabs((double)out_old[i]));
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }

    double t_new[MAX_REPS], t_old[MAX_REPS], ratio[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        ref_paged_attention(tp, &ao);
        double t1 = now_s();
        cpu_paged_attention(tp, &an);
        double t2 = now_s();
        t_old[r] = t1 - t0;
        t_new[r] = t2 - t1;
        ratio[r] = t_old[r] / t_new[r];
    }
    double flops = 4.0 * D * H * (double)T * (T + 1) / 2.0;
    double mn = median(t_new, reps), mo = median(t_old, reps), rp = median(ratio, reps);

    /* decode: the last token alone */
    int32_t dqs[2] = { 0, 1 };
    an.query_start = ao.query_start = dqs;
    an.num_tokens = ao.num_tokens = 1;
    an.q = ao.q = q + (size_t)(T - 1) * H * D;
    for (int r = 0; r < reps; r++) {
        enum { CALLS = 20 };
        double d_old[CALLS], d_new[CALLS];
        for (int i = 0; i < CALLS; i++) {
            double t0 = now_s();
            ref_paged_attention(tp, &ao);
            double t1 = now_s();
            cpu_paged_attention(tp, &an);
            double t2 = now_s();
            d_old[i] = t1 - t0;
            d_new[i] = t2 - t1;
        }
        t_old[r] = median(d_old, CALLS);
        t_new[r] = median(d_new, CALLS);
    }
    printf("| %d | %d | %s | %.3f | %.3f | %.2fx | %.1f | %.1f | %.1f | %.3f |\n", T, nth, kv_dtype_name(c->dt),
           mo * 1e3, mn * 1e3, rp, flops / mn * 1e-9, median(t_old, reps) * 1e6, median(t_new, reps) * 1e6, worst);
    rc = 0;
fail:
    free(pool), free(q), free(k), free(v), free(out_new), free(out_old), free(scratch), free(bt), free(slots);
    return rc;
}

int main(int argc, char **argv)
{
    int ctxs[MAX_LIST] = { 128, 512, 2048 }, n_ctx = 3, threads[MAX_LIST] = { 1, 2 }, n_thr = 2, reps = 5;
    int heads[MAX_LIST] = { 9, 3 }, n_heads = 2, head_dim = 64;
    enum kv_dtype dt = KV_F16;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (!strcmp(argv[i], "--ctx") && v) ok = (n_ctx = parse_list(v, ctxs)) > 0;
        else if (!strcmp(argv[i], "--threads") && v) ok = (n_thr = parse_list(v, threads)) > 0;
        else if (!strcmp(argv[i], "--heads") && v) ok = (n_heads = parse_list(v, heads)) == 2;
        else if (!strcmp(argv[i], "--head-dim") && v) ok = (head_dim = atoi(v)) > 0 && head_dim <= 1024;
        else if (!strcmp(argv[i], "--reps") && v) ok = (reps = atoi(v)) > 0 && reps <= MAX_REPS;
        else if (!strcmp(argv[i], "--kv") && v) ok = kv_dtype_parse(v, &dt) == 0;
        else ok = 0;
        if (!ok) {
            fprintf(stderr, "usage: %s [--ctx 128,512,2048] [--threads 1,2] [--kv f32|f16|bf16|fp8] "
                            "[--reps 5 (<= %d)] [--heads H,HKV] [--head-dim 64]\n", argv[0], MAX_REPS);
            return 2;
        }
        i++;
    }
    if (heads[0] % heads[1]) {
        fprintf(stderr, "--heads: n_heads %d is not a multiple of n_kv_heads %d\n", heads[0], heads[1]);
        return 2;
    }
    printf("prefill attention, one sequence from an empty context: %d heads, %d kv heads, head_dim %d, "
           "block_size 16; median of %d alternating rounds\n", heads[0], heads[1], head_dim, reps);
    printf("| ctx | threads | kv | prefill per-row ms | blocked ms | speedup | blocked GFLOP/s "
           "| decode per-row us | blocked us | max err / tol |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int t = 0; t < n_thr; t++) {
        struct threadpool *tp = threads[t] > 1 ? tp_create(threads[t]) : NULL;
        if (threads[t] > 1 && !tp) {
            fprintf(stderr, "cannot create %d threads\n", threads[t]);
            return 1;
        }
        for (int i = 0; i < n_ctx; i++) {
            struct bench_case c = { .ctx = ctxs[i], .H = heads[0], .HKV = heads[1], .D = head_dim, .BS = 16, .dt = dt };
            if (run_case(&c, tp, reps)) {
                fprintf(stderr, "out of memory at ctx %d\n", ctxs[i]);
                if (tp) tp_free(tp);
                return 1;
            }
        }
        if (tp) tp_free(tp);
    }
    return 0;
}
